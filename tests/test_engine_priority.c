/* test_engine_priority.c - the engine admits waiting requests by priority
 * (lower first), ties by arrival, and ages a waiting request by one level
 * per priority_aging seconds, so a low-priority request waits for a stream
 * of better ones only for a bounded time (engine.h, moe_request_params).
 * The engine's clock is the test's: it moves one second a step. */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/engine/engine.h"
#include "tests/testutil.h"

static struct moe_model model;
static struct moe_backend be;
static double now;

static double test_clock(void) { return now; }

static void setup(void)
{
    tu_tiny_qwen3_moe(&model, 2, 97, 11);
    cr_assert_eq(moe_backend_cpu_init(&be, 1), MOE_OK);
    now = 0;
}

static void teardown(void)
{
    moe_backend_free(&be);
    moe_model_free(&model);
}

TestSuite(engine_priority, .init = setup, .fini = teardown);

/* One sequence a step, so requests run one after another. */
static void open_serial(struct moe_engine *e, double aging)
{
    struct moe_engine_opts o = {.max_batch_tokens = 64, .max_seqs = 1, .block_size = 4, .n_blocks = 64,
                                .kv_dtype = MOE_DTYPE_F32, .priority_aging = aging};
    cr_assert_eq(moe_engine_init(e, &model, &be, &o), MOE_OK, "%s", moe_last_error());
    e->clock = test_clock;
}

static struct moe_request_params params(int max_tokens, int priority)
{
    struct moe_request_params p = {.max_tokens = max_tokens, .priority = priority};
    moe_sampling_defaults(&p.sampling);
    p.sampling.temperature = 0;
    return p;
}

static struct moe_request *submit(struct moe_engine *e, int max_tokens, int priority)
{
    const int32_t prompt[5] = {3, 1, 4, 1, 5};
    const struct moe_request_params p = params(max_tokens, priority);
    struct moe_request *r;
    cr_assert_eq(moe_engine_submit(e, prompt, 5, &p, NULL, &r), MOE_OK, "%s", moe_last_error());
    return r;
}

static void step(struct moe_engine *e)
{
    int n;
    cr_assert_eq(moe_engine_step(e, &n), MOE_OK, "%s", moe_last_error());
    now += 1;
}

/* Priorities 0, 5, -3, 0 waiting together run as -3, 0 (the earlier), 0, 5. */
Test(engine_priority, lower_first_then_arrival)
{
    struct moe_engine e;
    open_serial(&e, 1e9);
    const int prio[4] = {0, 5, -3, 0}, want[4] = {2, 0, 3, 1};
    struct moe_request *r[4];
    for (int i = 0; i < 4; i++) r[i] = submit(&e, 3, prio[i]);
    for (int k = 0; !moe_engine_idle(&e); k++) step(&e);
    for (int i = 0; i + 1 < 4; i++)
        cr_expect(r[want[i]]->t_first < r[want[i + 1]]->t_first,
                  "request %d (priority %d) began at %g, after request %d (priority %d) at %g", want[i],
                  prio[want[i]], r[want[i]]->t_first, want[i + 1], prio[want[i + 1]], r[want[i + 1]]->t_first);
    for (int i = 0; i < 4; i++) moe_engine_release(&e, r[i]);
    moe_engine_free(&e);
}

/* A request of priority 5 among a new priority-0 request every step (each
 * done in one step): with no aging it never runs; aged one level a second
 * it runs once it has waited 5 seconds (plus the step it loses the tie). */
static int steps_until_low_runs(double aging, int max_steps)
{
    struct moe_engine e;
    open_serial(&e, aging);
    struct moe_request *low = submit(&e, 1, 5), *high[64];
    int n_high = 0, ran = -1;
    for (int k = 0; k < max_steps && ran < 0; k++) {
        high[n_high++] = submit(&e, 1, 0);
        step(&e);
        if (low->state != MOE_REQ_WAITING) ran = k;
    }
    moe_engine_release(&e, low);
    for (int i = 0; i < n_high; i++) moe_engine_release(&e, high[i]);
    moe_engine_free(&e);
    return ran;
}

Test(engine_priority, aging_bounds_the_wait)
{
    cr_expect_eq(steps_until_low_runs(1e9, 40), -1, "without aging the priority-5 request never runs");
    const int k = steps_until_low_runs(1.0, 40);
    cr_expect(k >= 5 && k <= 6, "aged one level a second, the priority-5 request ran at step %d", k);
}

Test(engine_priority, out_of_range_refused)
{
    struct moe_engine e;
    open_serial(&e, 0);
    const int32_t prompt[2] = {1, 2};
    struct moe_request_params p = params(2, MOE_PRIORITY_MAX + 1);
    struct moe_request *r;
    cr_expect_eq(moe_engine_submit(&e, prompt, 2, &p, NULL, &r), MOE_ERR_INVALID_ARG);
    cr_expect(strstr(moe_last_error(), "priority") != NULL, "%s", moe_last_error());
    moe_engine_free(&e);
}
