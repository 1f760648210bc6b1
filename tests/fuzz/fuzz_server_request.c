/* fuzz_server_request.c - the body of POST /v1/completions or
 * /v1/chat/completions (first byte odd: chat) through srv_handle_completion,
 * the server's own parser and validator, with models/demo-moe's tokenizer and
 * chat template and no engine: the submission queue admits nobody
 * (max_queue 0), so every body that passes validation ends as 429 instead of
 * waiting for an engine thread.  That is the whole HTTP-side parsing path
 * (JSON, sampling fields, stop strings, prompt tokenization, the chat
 * template); only the engine's own acceptance is left out. */
#include "runtime/server/server.h"
#include "tests/fuzz/fuzz_util.h"

static struct srv s;

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    s.model_dir = fuzz_repo_path("MOE_FUZZ_MODEL_DIR", "models/demo-moe");
    s.model_name = strdup("demo-moe");
    if (moe_tokenizer_load(&s.tok, s.model_dir) != MOE_OK) {
        fprintf(stderr, "fuzz_server_request: %s\n", moe_last_error());
        abort();
    }
    s.have_tok = true;
    s.have_chat = moe_chat_template_load(&s.tmpl, s.model_dir, s.tok.chat_template) == MOE_OK;
    s.special = moe_chat_special_tokens(&s.tok);
    s.tmpl.max_output = 1 << 20;
    s.vocab = s.tok.n_vocab;
    s.max_pos = 2048;
    s.kv_blocks = 64;
    s.kv_block = 16;
    s.m.cfg.eos_id = -1;
    s.o.max_queue = 0;
    moe_sampling_defaults(&s.defaults); /* as cli_serve.c's load() sets them */
    s.defaults.temperature = 1.0f;
    pthread_mutex_init(&s.tok_mu, NULL);
    pthread_mutex_init(&s.q_mu, NULL);
    pthread_mutex_init(&s.stats_mu, NULL);
    pthread_mutex_init(&s.m_mu, NULL);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size == 0) return 0;
    bool chat = data[0] & 1;
    char *body = fuzz_strndup(data + 1, size - 1); /* the server NUL-terminates bodies */
    struct srv_job *job = NULL;
    char *err = NULL;
    int status = srv_handle_completion(&s, chat, body, size - 1, &job, &err);
    FUZZ_CHECK(!job && status != 200, "a job was accepted with no engine (status %d)", status);
    FUZZ_CHECK(err, "status %d without an error body", status);
    json_t *e = json_loads(err, 0, NULL);
    FUZZ_CHECK(json_is_object(json_object_get(e, "error")), "error body %s", err);
    json_decref(e);
    free(err);
    free(body);
    return 0;
}
