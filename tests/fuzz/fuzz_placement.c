/* fuzz_placement.c - expert placements (runtime/engine/ep_place.c): the
 * first two bytes choose the ranks (2..9) and experts per layer (1..64)
 * of a 4-layer model whose layer 0 is dense; the rest is the placement's
 * JSON.  A placement that is accepted must give every expert of every MoE
 * layer a slot, every rank at least one, and a valid slot to every pair;
 * the bytes also serve as per-expert loads for writing a placement, which
 * must read back. */
#include <math.h>
#include "runtime/engine/ep.h"
#include "tests/fuzz/fuzz_util.h"

static const bool MOE[4] = {false, true, true, true};

static void check_placed(const struct moe_ep *ep, int E)
{
    for (int l = 1; l < 4; l++) {
        const struct moe_ep_layer *pl = &ep->layers[l];
        for (int e = 0; e < E; e++) FUZZ_CHECK(pl->n_rep[e] >= 1, "layer %d expert %d has no slot", l, e);
        for (int r = 0; r < ep->size; r++)
            FUZZ_CHECK(pl->bounds[r + 1] > pl->bounds[r], "layer %d rank %d holds nothing", l, r);
        int32_t ids[8 * 2], pos[8], slots[8 * 2];
        for (int i = 0; i < 16; i++) ids[i] = (i * 7 + l) % E;
        for (int t = 0; t < 8; t++) pos[t] = t * 3 + l;
        moe_ep_slot_ids(ep, l, ids, 8, 2, pos, slots);
        for (int i = 0; i < 16; i++)
            FUZZ_CHECK(slots[i] >= 0 && slots[i] < pl->n_slots && pl->expert[slots[i]] == ids[i],
                       "layer %d pair %d: slot %d", l, i, slots[i]);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 2) return 0;
    const int ranks = 2 + data[0] % 8, E = 1 + data[1] % 64;
    char *text = fuzz_strndup(data + 2, size - 2);
    struct moe_ep ep;
    moe_ep_init(&ep, NULL);
    ep.size = ranks;
    ep.rank = data[0] / 8 % ranks;
    if (moe_ep_place(&ep, 4, MOE, E, text) == MOE_OK) {
        check_placed(&ep, E);
        uint8_t *held;
        if (moe_ep_held(&ep, &held) == MOE_OK) free(held);
    }
    moe_ep_free(&ep);
    free(text);
    /* the bytes as loads (any doubles, NaN and infinities included) */
    double load[3 * 64];
    const size_t n = (size - 2) / sizeof(double) < 3 * (size_t)E ? (size - 2) / sizeof(double) : 3 * (size_t)E;
    for (size_t i = 0; i < 3 * (size_t)E; i++) load[i] = 1.0;
    if (n) memcpy(load, data + 2, n * sizeof(double));
    const int32_t layer[3] = {1, 2, 3};
    char *out;
    double ratio;
    if (E >= ranks && moe_ep_placement_write(ranks, 3, layer, E, load, data[1] / 64 * ranks, "fuzz", &out, &ratio) ==
                          MOE_OK) {
        moe_ep_init(&ep, NULL);
        ep.size = ranks;
        FUZZ_CHECK(moe_ep_place(&ep, 4, MOE, E, out) == MOE_OK, "a written placement does not read back: %s",
                   moe_last_error());
        check_placed(&ep, E);
        moe_ep_free(&ep);
        free(out);
    }
    return 0;
}
