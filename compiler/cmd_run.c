/*
 * cmd_run.c — `kiln run model.kiln --prompt-ids 1,306,461 | --prompt TEXT ...`
 *
 * Loads the engine through the public API (runtime/kiln.h), encodes the
 * prompt (text needs the engine's tokenizer), generates on the chosen device
 * and prints the result: text (or ids) as it is produced, or with --json one
 * object with prompt_ids, ids, text, stop_reason and timings.
 */
#include <getopt.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "../runtime/kiln.h"
#include "../runtime/kiln_rt.h"
#include "../runtime/kiln_tokenizer.h"
#include "chat_cli.h"
#include "cli.h"

static void help(FILE *f) {
    fprintf(f,
            "usage: kiln run ENGINE.kiln (--prompt TEXT | --prompt-file FILE | --prompt-ids IDS) [options]\n\n"
            "Generate tokens. With no prompt option and text on stdin, the prompt is read from stdin.\n\n"
            "prompt:\n"
            "  --prompt TEXT         prompt text (needs an engine built with a tokenizer)\n"
            "  --prompt-file FILE    read the prompt text from FILE ('-' = stdin)\n"
            "  --prompt-ids IDS      token ids, e.g. 1,306,461 or [1, 306, 461]\n"
            "  --no-bos              do not add the beginning-of-sequence token to a text prompt\n"
            "  --no-special          treat special-token strings in the text as plain text\n"
            "  --chat                the prompt is a user message: render it with the engine's chat\n"
            "                        template (as HF apply_chat_template, add_generation_prompt=True)\n"
            "  --system TEXT         with --chat: a system message before it\n"
            "sampling:\n"
            "  --max-tokens N        tokens to generate at most (default 128)\n"
            "  --temperature T       0 = greedy (default 0)\n"
            "  --top-k K             sample from the K most likely tokens (0 = off, default)\n"
            "  --top-p P             nucleus sampling threshold in (0, 1] (default 1 = off)\n"
            "  --seed S              random seed (default: from the clock; printed with --json)\n"
            "  --ignore-eos          keep generating after an end-of-sequence token\n"
            "execution:\n"
            "  --device DEV          gpu, cpu (the fp32 reference executor) or auto = gpu when this\n"
            "                        build and host have one, else cpu (default: auto)\n"
            "  --threads N           CPU threads (default: one per core)\n"
            "  --max-context N       context length to allocate (default: the model's)\n"
            "  --gpu-memory X        KV-cache memory on the GPU: bytes (suffix K, M, G) or a fraction\n"
            "                        of the free memory after the weights (default 0.9)\n"
            "output:\n"
            "  --json                print one JSON object (prompt_ids, ids, text, stop_reason, timings)\n"
            "  -h, --help            this help\n");
}

typedef struct run_out {
    int32_t *ids; /* generated ids */
    int n_ids, cap;
    int32_t stop;  /* kiln_stop_reason of the finished call */
    double t_submit, t_first, t_last;
    kiln_tok_stream stream;  /* streaming text decoder (when has_stream) */
    bool has_stream;         /* else print ids */
    bool json;
    bool first;
} run_out;

static int32_t on_token(void *user, int64_t request, int32_t id, int32_t finished, int32_t stop_reason) {
    run_out *o = user;
    (void)request;
    if (finished) o->stop = stop_reason;
    if (id < 0) return 0;
    double now = kiln_now();
    if (o->n_ids == 0) o->t_first = now;
    o->t_last = now;
    if (o->n_ids == o->cap) {
        int cap = o->cap ? 2 * o->cap : 256;
        int32_t *v = realloc(o->ids, (size_t)cap * sizeof *v);
        if (!v) return 1; /* out of memory: stop the request */
        o->ids = v;
        o->cap = cap;
    }
    o->ids[o->n_ids++] = id;
    if (o->json) return 0;
    if (o->has_stream) {
        const char *text;
        size_t len;
        kiln_error err;
        if (kiln_tok_stream_push(&o->stream, id, &text, &len, &err) == KILN_OK && len) fwrite(text, 1, len, stdout);
    } else {
        printf(o->first ? "%d" : " %d", id);
    }
    o->first = false;
    fflush(stdout);
    return 0;
}

static char *read_all(FILE *f, size_t *len) {
    kiln_buf b = {0};
    char chunk[65536];
    size_t n;
    while ((n = fread(chunk, 1, sizeof chunk, f)) > 0) kiln_buf_append(&b, chunk, n);
    kiln_buf_append(&b, "", 1);
    if (b.failed) {
        kiln_buf_free(&b);
        return NULL;
    }
    *len = b.len - 1;
    return (char *)b.data;
}

int kiln_cmd_run(int argc, char **argv) {
    enum { O_PROMPT = 256, O_PFILE, O_IDS, O_MAX, O_TEMP, O_TOPK, O_TOPP, O_SEED, O_DEV, O_THR, O_JSON, O_CTX,
           O_NOBOS, O_NOSPECIAL, O_IGNEOS, O_GPUMEM, O_CHAT, O_SYSTEM };
    static const struct option longopts[] = {
        {"prompt", required_argument, 0, O_PROMPT},     {"prompt-file", required_argument, 0, O_PFILE},
        {"prompt-ids", required_argument, 0, O_IDS},    {"max-tokens", required_argument, 0, O_MAX},
        {"temperature", required_argument, 0, O_TEMP},  {"top-k", required_argument, 0, O_TOPK},
        {"top-p", required_argument, 0, O_TOPP},        {"seed", required_argument, 0, O_SEED},
        {"device", required_argument, 0, O_DEV},        {"threads", required_argument, 0, O_THR},
        {"max-context", required_argument, 0, O_CTX},   {"json", no_argument, 0, O_JSON},
        {"no-bos", no_argument, 0, O_NOBOS},            {"no-special", no_argument, 0, O_NOSPECIAL},
        {"ignore-eos", no_argument, 0, O_IGNEOS},       {"gpu-memory", required_argument, 0, O_GPUMEM},
        {"chat", no_argument, 0, O_CHAT},               {"system", required_argument, 0, O_SYSTEM},
        {"help", no_argument, 0, 'h'},
        {0, 0, 0, 0}};
    const char *prompt = NULL, *prompt_file = NULL, *ids_arg = NULL, *device = "auto", *system = NULL;
    long long max_tokens = 128, top_k = 0, threads = 0, max_ctx = 0, seed = -1;
    double temperature = 0, top_p = 1;
    bool json = false, no_bos = false, no_special = false, ignore_eos = false, chat = false;
    int64_t kv_bytes = 0;
    double kv_fraction = 0;
    int c;
    optind = 1;
    opterr = 0;
    while ((c = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
        switch (c) {
        case O_PROMPT: prompt = optarg; break;
        case O_PFILE: prompt_file = optarg; break;
        case O_IDS: ids_arg = optarg; break;
        case O_MAX:
            if (!kiln_cli_parse_int(optarg, 0, 1 << 24, &max_tokens))
                return kiln_cli_usage_error("run", "--max-tokens '%s' is not a whole number >= 0", optarg);
            break;
        case O_TEMP:
            if (!kiln_cli_parse_float(optarg, 0, 1e6, &temperature))
                return kiln_cli_usage_error("run", "--temperature '%s' is not a number >= 0", optarg);
            break;
        case O_TOPK:
            if (!kiln_cli_parse_int(optarg, 0, 1 << 24, &top_k))
                return kiln_cli_usage_error("run", "--top-k '%s' is not a whole number >= 0", optarg);
            break;
        case O_TOPP:
            if (!kiln_cli_parse_float(optarg, 1e-9, 1, &top_p))
                return kiln_cli_usage_error("run", "--top-p '%s' is not a number in (0, 1]", optarg);
            break;
        case O_SEED:
            if (!kiln_cli_parse_int(optarg, 0, INT64_MAX, &seed))
                return kiln_cli_usage_error("run", "--seed '%s' is not a whole number >= 0", optarg);
            break;
        case O_DEV: device = optarg; break;
        case O_THR:
            if (!kiln_cli_parse_int(optarg, 1, 256, &threads))
                return kiln_cli_usage_error("run", "--threads '%s' is not a number in 1..256", optarg);
            break;
        case O_CTX:
            if (!kiln_cli_parse_int(optarg, 1, 1 << 24, &max_ctx))
                return kiln_cli_usage_error("run", "--max-context '%s' is not a positive number", optarg);
            break;
        case O_GPUMEM:
            if (!kiln_cli_parse_memory(optarg, &kv_bytes, &kv_fraction))
                return kiln_cli_usage_error("run", "--gpu-memory '%s' is neither bytes (e.g. 4G) nor a fraction in "
                                                   "(0, 1]", optarg);
            break;
        case O_JSON: json = true; break;
        case O_NOBOS: no_bos = true; break;
        case O_NOSPECIAL: no_special = true; break;
        case O_IGNEOS: ignore_eos = true; break;
        case O_CHAT: chat = true; break;
        case O_SYSTEM: system = optarg; break;
        case 'h': help(stdout); return KILN_EXIT_OK;
        default: return kiln_cli_usage_error("run", "unknown or incomplete option '%s'", argv[optind - 1]);
        }
    }
    if (optind != argc - 1) return kiln_cli_usage_error("run", "expected one engine file");
    if (!!prompt + !!prompt_file + !!ids_arg > 1)
        return kiln_cli_usage_error("run", "give only one of --prompt, --prompt-file, --prompt-ids");
    if ((system && !chat) || (chat && (ids_arg || no_special)))
        return kiln_cli_usage_error("run", system && !chat ? "--system needs --chat"
                                           : ids_arg       ? "--chat takes a text prompt, not --prompt-ids"
                                                           : "--no-special cannot go with --chat: the template's "
                                                             "special tokens must stay special");
    if (strcmp(device, "cpu") != 0 && strcmp(device, "auto") != 0 && strcmp(device, "gpu") != 0)
        return kiln_cli_usage_error("run", "unknown device '%s' (gpu, cpu, auto)", device);
    int32_t *prompt_ids = NULL;
    int n_prompt = 0;
    if (ids_arg && !kiln_cli_parse_ids(ids_arg, &prompt_ids, &n_prompt))
        return kiln_cli_usage_error("run", "--prompt-ids '%s' is not a list of token ids like 1,306,461", ids_arg);
    if (seed < 0) seed = (long long)time(NULL);

    const char *path = argv[optind];
    kiln_error err = {0};
    int rc = KILN_EXIT_FAIL;
    kiln_t *k = NULL;
    kiln_ctx_t *ctx = NULL;
    const kiln_model *m = NULL;
    char *text = NULL;
    run_out out = {.json = json, .first = true, .stop = KILN_STOP_ERROR};
    kiln_status st = kiln_open(path, (int32_t)threads, &k);
    if (st != KILN_OK) {
        kiln_err(&err, st, "%s", kiln_error_message(k));
        goto fail;
    }
    m = kiln_api_model(k);

    if (!ids_arg) {
        size_t len = 0;
        if (prompt) {
            text = strdup(prompt);
            len = strlen(prompt);
        } else {
            FILE *f = stdin;
            if (prompt_file && strcmp(prompt_file, "-") != 0 && !(f = fopen(prompt_file, "rb"))) {
                kiln_err(&err, KILN_ERR_IO, "%s: cannot open the prompt file", prompt_file);
                goto fail;
            }
            if (!prompt_file && isatty(0)) {
                rc = kiln_cli_usage_error("run", "no prompt: give --prompt, --prompt-file or --prompt-ids");
                goto out;
            }
            text = read_all(f, &len);
            if (f != stdin) fclose(f);
        }
        if (!text) {
            kiln_err(&err, KILN_ERR_NOMEM, "out of memory reading the prompt");
            goto fail;
        }
        if (!m->tokenizer) {
            kiln_err(&err, KILN_ERR_MISSING, "%s: the engine has no tokenizer, so it cannot take a text prompt", path);
            kiln_err_hint(&err, "give --prompt-ids, or compile from a checkpoint directory that has tokenizer.json");
            goto fail;
        }
        /* --chat: HF apply_chat_template + encode(add_special_tokens=False) */
        if (chat && kiln_cli_chat_prompt(k, system, &text, &len, &err) != KILN_OK) goto fail;
        size_t n = 0;
        unsigned flags = (no_bos || chat ? 0 : KILN_TOK_ADD_SPECIAL) | (no_special ? KILN_TOK_NO_SPECIAL : 0);
        if (kiln_tokenizer_encode(m->tokenizer, text, len, flags, &prompt_ids, &n, &err) != KILN_OK) goto fail;
        n_prompt = (int)n;
        if (n_prompt == 0) {
            kiln_err(&err, KILN_ERR_INVALID_ARG, "the prompt encodes to no tokens");
            kiln_err_hint(&err, "give a non-empty prompt");
            goto fail;
        }
    }
    if (m->tokenizer && !json) {
        kiln_tok_stream_init(&out.stream, m->tokenizer, true);
        out.has_stream = true;
    }
    kiln_ctx_options co;
    kiln_ctx_options_init(&co);
    co.device = device;
    co.max_batch = 1;
    co.max_context = (int32_t)max_ctx;
    co.threads = (int32_t)threads;
    co.kv_bytes = kv_bytes;
    if (kv_fraction > 0) co.kv_fraction = kv_fraction;
    st = kiln_ctx_new(k, &co, &ctx);
    if (st != KILN_OK) {
        kiln_err(&err, st, "%s", kiln_last_error(ctx));
        goto fail;
    }
    kiln_ctx_info info = {.struct_size = sizeof info};
    const char *dev_used = kiln_ctx_info_get(ctx, &info) == KILN_OK ? info.device : device;
    kiln_request_options ro;
    kiln_request_options_init(&ro);
    ro.max_tokens = (int32_t)max_tokens;
    ro.temperature = (float)temperature;
    ro.top_k = (int32_t)top_k;
    ro.top_p = (float)top_p;
    ro.seed = (uint64_t)seed;
    ro.ignore_eos = ignore_eos;
    ro.on_token = on_token;
    ro.user = &out;
    int64_t id;
    out.t_submit = kiln_now();
    if ((st = kiln_submit(ctx, prompt_ids, n_prompt, &ro, &id)) != KILN_OK ||
        (st = kiln_run(ctx)) != KILN_OK) {
        kiln_err(&err, st, "%s", kiln_last_error(ctx));
        goto fail;
    }
    if (out.stop == KILN_STOP_ERROR) {
        kiln_err(&err, KILN_ERR_DEVICE, "%s", kiln_last_error(ctx));
        goto fail;
    }
    double prefill_s = out.n_ids ? out.t_first - out.t_submit : 0;
    double decode_s = out.n_ids > 1 ? out.t_last - out.t_first : 0;
    double decode_tps = decode_s > 0 ? (out.n_ids - 1) / decode_s : 0.0;

    if (json) {
        json_t *pid = json_array(), *gid = json_array();
        for (int i = 0; i < n_prompt; i++) json_array_append_new(pid, json_integer(prompt_ids[i]));
        for (int i = 0; i < out.n_ids; i++) json_array_append_new(gid, json_integer(out.ids[i]));
        json_t *j = json_pack("{s:o, s:o, s:s, s:s, s:I, s:{s:f, s:f, s:f, s:f, s:f}}", "prompt_ids", pid, "ids", gid,
                              "stop_reason", kiln_stop_reason_str((kiln_stop_reason)out.stop), "device", dev_used,
                              "seed", (json_int_t)seed, "timings", "load_s", kiln_open_seconds(k), "prefill_s",
                              prefill_s, "decode_s", decode_s, "prefill_tokens_per_s",
                              prefill_s > 0 ? n_prompt / prefill_s : 0.0, "decode_tokens_per_s", decode_tps);
        if (m->tokenizer) {
            char *gen = NULL;
            size_t glen = 0;
            if (kiln_tokenizer_decode(m->tokenizer, out.ids, (size_t)out.n_ids, true, &gen, &glen, &err) != KILN_OK) {
                json_decref(j);
                goto fail;
            }
            json_object_set_new(j, "text", json_stringn(gen, glen));
            free(gen);
        }
        char *s = json_dumps(j, JSON_COMPACT);
        printf("%s\n", s);
        free(s);
        json_decref(j);
    } else {
        if (out.has_stream) {
            const char *tail;
            size_t len;
            if (kiln_tok_stream_finish(&out.stream, &tail, &len, &err) == KILN_OK && len) fwrite(tail, 1, len, stdout);
        }
        printf("\n");
        fprintf(stderr, "kiln run: %d tokens on %s, stop: %s, first token after %.1f ms, decode %.1f tok/s\n",
                out.n_ids, dev_used, kiln_stop_reason_str((kiln_stop_reason)out.stop), prefill_s * 1e3, decode_tps);
    }
    rc = KILN_EXIT_OK;
    goto out;
fail:
    rc = kiln_cli_fail("run", &err, json);
out:
    free(out.ids);
    free(text);
    free(prompt_ids);
    if (out.has_stream) kiln_tok_stream_free(&out.stream);
    kiln_ctx_free(ctx);
    kiln_close(k);
    return rc;
}
