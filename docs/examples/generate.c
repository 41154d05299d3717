/*
 * generate.c — an example program embedding the kiln runtime through its
 * public C API (runtime/kiln.h) alone.
 *
 *   generate ENGINE.kiln [--device cpu|gpu|auto] [--max-tokens N]
 *            [--temperature T] [--seed S] PROMPT...
 *
 * Every PROMPT becomes one request and they all run together (continuous
 * batching). A prompt is token ids ("1,300,310") or, when the engine has a
 * tokenizer, text. The program steps the context itself and polls each
 * request for its new tokens; when a request finishes it prints
 *
 *   [1] 461 461 401 ...        (or its text, with a tokenizer)
 *
 * on stdout and a summary line on stderr. Build: see
 * docs/c-api.md (installed kiln: pkg-config or find_package), or the target
 * kiln_example_generate in CMakeLists.txt (linked with libkiln.so only).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <kiln.h> /* runtime/kiln.h; installed as include/kiln.h */

typedef struct request {
    int64_t id;
    int32_t *prompt;
    int32_t n_prompt;
    int32_t out[4096]; /* generated ids */
    int32_t n_out, finished, reason;
} request;

/* "1,300,310" → ids; returns 0 when s is not such a list. */
static int parse_ids(const char *s, int32_t **ids, int32_t *n) {
    int32_t cap = 16, k = 0;
    int32_t *v = malloc((size_t)cap * sizeof *v);
    if (!v) return 0;
    while (*s) {
        char *end;
        long x = strtol(s, &end, 10);
        if (end == s || x < 0 || x > INT32_MAX || (*end && *end != ',')) {
            free(v);
            return 0;
        }
        if (k == cap) {
            int32_t *nv = realloc(v, (size_t)(cap *= 2) * sizeof *v);
            if (!nv) {
                free(v);
                return 0;
            }
            v = nv;
        }
        v[k++] = (int32_t)x;
        s = *end ? end + 1 : end;
    }
    *ids = v;
    *n = k;
    return k > 0;
}

/* Text → ids with the engine's tokenizer (two calls: size, then fill). */
static int tokenize(kiln_ctx_t *ctx, const char *text, int32_t **ids, int32_t *n) {
    int32_t need = 0;
    kiln_status st = kiln_tokenize(ctx, text, strlen(text), 1, NULL, 0, &need);
    if (st != KILN_OK && need == 0) return 0;
    *ids = malloc((size_t)(need ? need : 1) * sizeof **ids);
    if (!*ids || kiln_tokenize(ctx, text, strlen(text), 1, *ids, need, n) != KILN_OK) return 0;
    return 1;
}

/* Print ids, or their text when the engine has a tokenizer. */
static void print_tokens(kiln_ctx_t *ctx, int has_tok, const int32_t *ids, int32_t n) {
    if (has_tok) {
        char text[4096];
        size_t len;
        if (kiln_detokenize(ctx, ids, n, 1, text, sizeof text, &len) == KILN_OK) {
            fputs(text, stdout);
            return;
        }
    }
    for (int32_t i = 0; i < n; i++) printf(" %d", ids[i]);
}

int main(int argc, char **argv) {
    const char *engine = NULL, *device = "auto";
    int32_t max_tokens = 32;
    float temperature = 0;
    uint64_t seed = 0;
    const char *prompts[64];
    int n_prompts = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--device") == 0 && i + 1 < argc) device = argv[++i];
        else if (strcmp(argv[i], "--max-tokens") == 0 && i + 1 < argc) max_tokens = atoi(argv[++i]);
        else if (strcmp(argv[i], "--temperature") == 0 && i + 1 < argc) temperature = (float)atof(argv[++i]);
        else if (strcmp(argv[i], "--seed") == 0 && i + 1 < argc) seed = strtoull(argv[++i], NULL, 10);
        else if (!engine) engine = argv[i];
        else if (n_prompts < 64) prompts[n_prompts++] = argv[i];
    }
    if (!engine || n_prompts == 0) {
        fprintf(stderr, "usage: %s ENGINE.kiln [--device cpu|gpu|auto] [--max-tokens N] [--temperature T] "
                        "[--seed S] PROMPT...\n",
                argv[0]);
        return 2;
    }

    /* 1. open the engine; a failed open still returns a handle with the message */
    kiln_t *k = NULL;
    if (kiln_open(engine, 0, &k) != KILN_OK) {
        fprintf(stderr, "error: %s\n", kiln_error_message(k));
        kiln_close(k);
        return 1;
    }

    /* 2. a context: device, batch size, memory */
    kiln_ctx_options co;
    kiln_ctx_options_init(&co);
    co.device = device;
    co.max_batch = n_prompts;
    kiln_ctx_t *ctx = NULL;
    if (kiln_ctx_new(k, &co, &ctx) != KILN_OK) {
        fprintf(stderr, "error: %s\n", kiln_last_error(ctx));
        kiln_ctx_free(ctx);
        kiln_close(k);
        return 1;
    }
    int has_tok = kiln_has_tokenizer(k);

    /* 3. one request per prompt */
    kiln_request_options ro;
    kiln_request_options_init(&ro);
    ro.max_tokens = max_tokens < 4096 ? max_tokens : 4096;
    ro.temperature = temperature;
    ro.seed = seed;
    static request req[64];
    int rc = 0;
    for (int i = 0; i < n_prompts; i++) {
        request *r = &req[i];
        if (!parse_ids(prompts[i], &r->prompt, &r->n_prompt) &&
            !(has_tok && tokenize(ctx, prompts[i], &r->prompt, &r->n_prompt))) {
            fprintf(stderr, "error: prompt %d: %s\n", i + 1,
                    has_tok ? kiln_last_error(ctx) : "not a list of ids, and the engine has no tokenizer");
            rc = 1;
            goto out;
        }
        if (kiln_submit(ctx, r->prompt, r->n_prompt, &ro, &r->id) != KILN_OK) {
            fprintf(stderr, "error: prompt %d: %s\n", i + 1, kiln_last_error(ctx));
            rc = 1;
            goto out;
        }
    }

    /* 4. step until every request has finished, collecting new tokens */
    int done = 0;
    while (done < n_prompts) {
        if (kiln_pending(ctx) > 0 && kiln_run_step(ctx) != KILN_OK) {
            fprintf(stderr, "error: %s\n", kiln_last_error(ctx));
            rc = 1;
            goto out;
        }
        for (int i = 0; i < n_prompts; i++) {
            request *r = &req[i];
            if (r->finished) continue;
            int32_t n, room = (int32_t)(sizeof r->out / sizeof r->out[0]) - r->n_out;
            if (kiln_poll(ctx, r->id, r->out + r->n_out, room, &n, &r->finished, &r->reason) != KILN_OK) {
                fprintf(stderr, "error: %s\n", kiln_last_error(ctx));
                rc = 1;
                goto out;
            }
            r->n_out += n;
            if (r->finished) {
                done++;
                printf("[%d]", i + 1);
                print_tokens(ctx, has_tok, r->out, r->n_out);
                printf("\n");
                fprintf(stderr, "request %d: %d prompt tokens, %d generated, stop: %s\n", i + 1, r->n_prompt,
                        r->n_out, kiln_stop_reason_str((kiln_stop_reason)r->reason));
            }
        }
    }

out:
    for (int i = 0; i < n_prompts; i++) free(req[i].prompt);
    kiln_ctx_free(ctx);
    kiln_close(k);
    return rc;
}
