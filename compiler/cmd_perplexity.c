/*
 * cmd_perplexity.c — `kiln perplexity ENGINE (--text-file F | --ids-file F)`:
 * how well an engine predicts a text, the measure quantized engines are
 * judged by (docs/cli.md).
 *
 * The text is tokenized with the engine's tokenizer (no special tokens
 * added), or ids are read as given, then cut into windows of N tokens
 * starting every S tokens (S = N by default: non-overlapping). Each window
 * is read from its first token (with --bos, from BOS, so its first token is
 * scored too); a token is scored in the first window that has it at a
 * position other than the first, given everything before it in that
 * window. With S = N that is every token after the first of each window;
 * with S < N later windows give their tokens up to N - S tokens of context
 * more. Scoring is kiln_score (teacher forcing, the model's log-softmax):
 * perplexity = exp(mean negative log-likelihood over the scored tokens),
 * bits per token = that mean / ln 2.
 */
#include <ctype.h>
#include <getopt.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../runtime/kiln.h"
#include "cli.h"
#include "kiln_tokjson.h"

#define PPL_MAX_INPUT (1u << 30) /* 1 GiB of text or ids */

static void help(FILE *f) {
    fprintf(f, "usage: %s ", kiln_cli_prog);
    fprintf(f,
            "perplexity ENGINE.kiln (--text-file FILE | --ids-file FILE) [options]\n\n"
            "How well the engine predicts a text: perplexity, tokens scored and bits per token.\n"
            "The text is tokenized with the engine's tokenizer (no special tokens added) and cut\n"
            "into windows of --window tokens every --stride tokens; each window is read from its\n"
            "first token, and every token is scored once, in the first window where it has\n"
            "context (with the default stride: every token after the first of each window).\n\n"
            "  --text-file FILE   UTF-8 text ('-' = stdin)\n"
            "  --ids-file FILE    token ids instead: a JSON array, or ids separated by whitespace\n"
            "                     or commas ('-' = stdin)\n"
            "  --window N         tokens per window (default 512, at most the model's context)\n"
            "  --stride S         tokens from one window's start to the next, 1..N (default N)\n"
            "  --bos              read each window after the engine's BOS token, so its first\n"
            "                     token is scored too (the window then takes N + 1 positions)\n"
            "  --batch B          windows read side by side (default 8)\n"
            "  --device DEV       cpu, gpu or auto (default auto)\n"
            "  --threads N        CPU threads (default: one per core)\n"
            "  --measure KNOBS    the GPU's measurement knobs, as kiln bench takes them (e.g.\n"
            "                     'w8a8=0': the quality of another kernel route on the same engine)\n");
    kiln_cli_gpus_help(f, 21);
    fprintf(f,
            "  --json             one JSON object: perplexity, nll_mean, bits_per_token, tokens,\n"
            "                     scored, windows, window, stride, bos, device, seconds\n"
            "  -h, --help         this help\n\n"
            "Exit codes: 0 success, 1 failure, 2 usage error.\n");
}

typedef struct ppl_args {
    const char *path, *text_file, *ids_file, *device, *measure;
    const char *gpus;  /* --gpus, checked (kiln_cli_gpus_arg); NULL = the default */
    double tp_timeout; /* --tp-timeout, seconds; 0 = the runtime's */
    long long window, stride, batch, threads;
    bool bos, json;
} ppl_args;

static int parse_args(int argc, char **argv, ppl_args *a, bool *done) {
    enum { O_TEXT = 256, O_IDS, O_WIN, O_STRIDE, O_BOS, O_BATCH, O_DEV, O_THR, O_JSON, O_GPUS, O_TPTIME, O_MEASURE };
    static const struct option longopts[] = {
        {"text-file", required_argument, 0, O_TEXT}, {"ids-file", required_argument, 0, O_IDS},
        {"window", required_argument, 0, O_WIN},     {"stride", required_argument, 0, O_STRIDE},
        {"bos", no_argument, 0, O_BOS},              {"batch", required_argument, 0, O_BATCH},
        {"device", required_argument, 0, O_DEV},     {"threads", required_argument, 0, O_THR},
        {"json", no_argument, 0, O_JSON},            {"help", no_argument, 0, 'h'},
        {"gpus", required_argument, 0, O_GPUS},      {"tp-timeout", required_argument, 0, O_TPTIME},
        {"measure", required_argument, 0, O_MEASURE},
        {0, 0, 0, 0}};
    *a = (ppl_args){.device = "auto", .batch = 8};
    *done = false;
    int c, rc;
    optind = 1;
    opterr = 0;
    while ((c = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
        switch (c) {
        case O_TEXT: a->text_file = optarg; break;
        case O_IDS: a->ids_file = optarg; break;
        case O_WIN:
            if (!kiln_cli_parse_int(optarg, 2, 1 << 24, &a->window))
                return kiln_cli_usage_error("perplexity", "--window '%s' is not a number of at least 2", optarg);
            break;
        case O_STRIDE:
            if (!kiln_cli_parse_int(optarg, 1, 1 << 24, &a->stride))
                return kiln_cli_usage_error("perplexity", "--stride '%s' is not a positive number", optarg);
            break;
        case O_BOS: a->bos = true; break;
        case O_BATCH:
            if (!kiln_cli_parse_int(optarg, 1, 1024, &a->batch))
                return kiln_cli_usage_error("perplexity", "--batch '%s' is not a number in 1..1024", optarg);
            break;
        case O_DEV:
            if (strcmp(optarg, "cpu") != 0 && strcmp(optarg, "gpu") != 0 && strcmp(optarg, "auto") != 0)
                return kiln_cli_usage_error("perplexity", "unknown device '%s' (cpu, gpu, auto)", optarg);
            a->device = optarg;
            break;
        case O_THR:
            if (!kiln_cli_parse_int(optarg, 1, 1024, &a->threads))
                return kiln_cli_usage_error("perplexity", "--threads '%s' is not a number in 1..1024", optarg);
            break;
        case O_JSON: a->json = true; break;
        case O_MEASURE: a->measure = optarg; break;
        case O_GPUS:
            if ((rc = kiln_cli_gpus_arg("perplexity", optarg)) != KILN_EXIT_OK) return rc;
            a->gpus = optarg;
            break;
        case O_TPTIME:
            if ((rc = kiln_cli_tp_timeout_arg("perplexity", optarg, &a->tp_timeout)) != KILN_EXIT_OK) return rc;
            break;
        case 'h':
            help(stdout);
            *done = true;
            return KILN_EXIT_OK;
        default: return kiln_cli_usage_error("perplexity", "unknown or incomplete option '%s'", argv[optind - 1]);
        }
    }
    if (optind != argc - 1) return kiln_cli_usage_error("perplexity", "expected one engine file");
    a->path = argv[optind];
    if (!a->text_file == !a->ids_file)
        return kiln_cli_usage_error("perplexity", "give one of --text-file and --ids-file");
    if (a->stride && a->window && a->stride > a->window)
        return kiln_cli_usage_error("perplexity", "--stride %lld is longer than --window %lld (tokens between "
                                                  "windows would never be scored)", a->stride, a->window);
    return KILN_EXIT_OK;
}

/* All of FILE ('-' = stdin) as a NUL-terminated malloc'd buffer. */
static kiln_status read_input(const char *path, char **out, size_t *len, kiln_error *err) {
    if (strcmp(path, "-") != 0) return kiln_file_read(path, PPL_MAX_INPUT, out, len, err);
    kiln_buf b = {0};
    char chunk[65536];
    size_t n;
    while ((n = fread(chunk, 1, sizeof chunk, stdin)) > 0) {
        if (b.len + n > PPL_MAX_INPUT) {
            kiln_buf_free(&b);
            return kiln_err(err, KILN_ERR_INVALID_ARG, "stdin: more than %u bytes", PPL_MAX_INPUT);
        }
        kiln_buf_append(&b, chunk, n);
    }
    kiln_buf_append(&b, "", 1);
    if (b.failed || ferror(stdin)) {
        kiln_buf_free(&b);
        return kiln_err(err, KILN_ERR_IO, "stdin: cannot read");
    }
    *out = (char *)b.data;
    *len = b.len - 1;
    return KILN_OK;
}

/* The ids to score: the file's ids, or its text tokenized with the engine's tokenizer (no specials). */
static kiln_status load_ids(const ppl_args *a, kiln_ctx_t *ctx, int32_t **ids, size_t *n, kiln_error *err) {
    const char *file = a->text_file ? a->text_file : a->ids_file;
    const char *label = strcmp(file, "-") == 0 ? "stdin" : file;
    char *data = NULL;
    size_t len = 0;
    kiln_status st = read_input(file, &data, &len, err);
    if (st != KILN_OK) return kiln_err_prefix(err, "%s: ", a->text_file ? "--text-file" : "--ids-file");
    if (a->ids_file) {
        size_t i = 0;
        while (i < len && isspace((unsigned char)data[i])) i++;
        st = i < len && data[i] == '[' ? kiln_tokenize_parse_ids(data, len, label, ids, n, err)
                                       : kiln_cli_parse_ids_text(data, len, label, ids, n, err);
    } else {
        int32_t need = 0;
        st = kiln_tokenize(ctx, data, len, 0, NULL, 0, &need);
        if (st == KILN_OK || st == KILN_ERR_INVALID_ARG) { /* INVALID_ARG: the count came back, the ids did not */
            *ids = malloc(((size_t)need + 1) * sizeof **ids);
            st = !*ids ? kiln_err(err, KILN_ERR_NOMEM, "%s: out of memory for %d ids", label, need)
                       : kiln_tokenize(ctx, data, len, 0, *ids, need, &need);
            *n = (size_t)need;
        }
        if (st != KILN_OK && st != KILN_ERR_NOMEM) kiln_err(err, st, "%s: %s", label, kiln_last_error(ctx));
    }
    free(data);
    return st;
}

/* One window: text[start, end) read after BOS or not; it scores text positions [first, end). */
typedef struct window {
    size_t start, end, first;
} window;

/* The windows over n text tokens (header comment); *nw of them, malloc'd. */
static window *make_windows(size_t n, size_t N, size_t S, bool bos, size_t *nw) {
    window *w = malloc((n / S + 2) * sizeof *w);
    *nw = 0;
    if (!w) return NULL;
    size_t scored_to = 0; /* text positions below this are scored */
    for (size_t start = 0; start < n; start += S) {
        size_t end = start + N < n ? start + N : n, first = start + (bos ? 0 : 1);
        if (first < scored_to) first = scored_to;
        if (first < end) w[(*nw)++] = (window){start, end, first};
        if (end > scored_to) scored_to = end;
        if (end == n) break;
    }
    return w;
}

int kiln_cmd_perplexity(int argc, char **argv) {
    ppl_args a;
    bool done;
    int rc = parse_args(argc, argv, &a, &done);
    if (rc != KILN_EXIT_OK || done) return rc;
    kiln_error err = {0};
    kiln_t *k = NULL;
    kiln_ctx_t *ctx = NULL;
    int32_t *ids = NULL, **seqs = NULL, *lens = NULL;
    float **lps = NULL;
    window *win = NULL;
    size_t n = 0, nw = 0;
    rc = KILN_EXIT_FAIL;
    double t0 = kiln_now();
    kiln_status st = kiln_open(a.path, (int32_t)a.threads, &k);
    if (st != KILN_OK) {
        kiln_err(&err, st, "%s", kiln_error_message(k));
        goto fail;
    }
    const long long model_ctx = kiln_max_context(k);
    const long long N = a.window ? a.window : (512 < model_ctx - a.bos ? 512 : model_ctx - a.bos);
    const long long S = a.stride ? a.stride : N;
    if (N + a.bos > model_ctx || N < 2) {
        kiln_err(&err, KILN_ERR_CONTEXT, "--window %lld%s needs %lld positions; %s holds %lld", N,
                 a.bos ? " after BOS" : "", N + a.bos, a.path, model_ctx);
        kiln_err_hint(&err, "give a --window of at most %lld", model_ctx - a.bos);
        goto fail;
    }
    if (S > N) {
        kiln_err(&err, KILN_ERR_INVALID_ARG, "--stride %lld is longer than the window, %lld", S, N);
        goto fail;
    }
    const int32_t bos = kiln_bos_id(k);
    if (a.bos && bos < 0) {
        kiln_err(&err, KILN_ERR_MISSING, "--bos: %s has no BOS token", a.path);
        goto fail;
    }
    kiln_ctx_options o;
    kiln_ctx_options_init(&o);
    o.device = a.device;
    o.max_batch = (int32_t)a.batch;
    o.max_context = (int32_t)(N + a.bos);
    o.threads = (int32_t)a.threads;
    o.gpus = a.gpus;
    o.tp_timeout_s = a.tp_timeout;
    o.measure = a.measure;
    if ((st = kiln_ctx_new(k, &o, &ctx)) != KILN_OK) {
        kiln_err(&err, st, "%s", kiln_last_error(ctx));
        goto fail;
    }
    if ((st = load_ids(&a, ctx, &ids, &n, &err)) != KILN_OK) goto fail;
    if (n < 2 - (size_t)a.bos) {
        kiln_err(&err, KILN_ERR_INVALID_ARG, "%s: %zu token%s: nothing to score", a.text_file ? a.text_file : a.ids_file,
                 n, n == 1 ? "" : "s");
        kiln_err_hint(&err, "give at least 2 tokens (1 with --bos)");
        goto fail;
    }
    if (!(win = make_windows(n, (size_t)N, (size_t)S, a.bos, &nw)) || !(seqs = calloc(nw, sizeof *seqs)) ||
        !(lens = calloc(nw, sizeof *lens)) || !(lps = calloc(nw, sizeof *lps))) {
        kiln_err(&err, KILN_ERR_NOMEM, "out of memory for %zu windows", nw);
        goto fail;
    }
    for (size_t w = 0; w < nw; w++) {
        const size_t len = win[w].end - win[w].start + a.bos;
        seqs[w] = malloc(len * sizeof **seqs);
        lps[w] = malloc(len * sizeof **lps);
        if (!seqs[w] || !lps[w]) {
            kiln_err(&err, KILN_ERR_NOMEM, "out of memory for window %zu", w);
            goto fail;
        }
        if (a.bos) seqs[w][0] = bos;
        memcpy(seqs[w] + a.bos, ids + win[w].start, (win[w].end - win[w].start) * sizeof *ids);
        lens[w] = (int32_t)len;
    }
    if ((st = kiln_score(ctx, (const int32_t *const *)seqs, lens, (int32_t)nw, lps)) != KILN_OK) {
        kiln_err(&err, st, "%s", kiln_last_error(ctx));
        goto fail;
    }
    double sum = 0;
    size_t scored = 0;
    for (size_t w = 0; w < nw; w++) /* text position p is sequence position p - start + bos, predicted at p - 1 */
        for (size_t p = win[w].first; p < win[w].end; p++, scored++) sum -= lps[w][p - win[w].start + a.bos - 1];
    const double secs = kiln_now() - t0, nll = sum / (double)scored, ppl = exp(nll), bits = nll / log(2.0);
    if (!isfinite(nll)) {
        kiln_err(&err, KILN_ERR_INTERNAL, "the mean negative log-likelihood is %g: the engine gave some scored token "
                                          "probability 0 or non-finite logits", nll);
        goto fail;
    }
    kiln_ctx_info info = {.struct_size = sizeof info};
    kiln_ctx_info_get(ctx, &info);
    if (a.json) {
        json_t *j = json_pack("{s:s, s:f, s:f, s:f, s:I, s:I, s:I, s:I, s:I, s:b, s:s, s:f}", "engine", a.path,
                              "perplexity", ppl, "nll_mean", nll, "bits_per_token", bits, "tokens", (json_int_t)n,
                              "scored", (json_int_t)scored, "windows", (json_int_t)nw, "window", (json_int_t)N,
                              "stride", (json_int_t)S, "bos", a.bos, "device", info.device, "seconds", secs);
        char *s = j ? json_dumps(j, JSON_COMPACT | JSON_REAL_PRECISION(10)) : NULL;
        if (s) puts(s);
        free(s);
        json_decref(j);
    } else {
        printf("perplexity %.4f over %zu of %zu tokens (%zu window%s of %lld every %lld%s; mean NLL %.6f, %.4f bits "
               "per token; %s, %.2f s)\n",
               ppl, scored, n, nw, nw == 1 ? "" : "s", N, S, a.bos ? ", after BOS" : "", nll, bits, info.device, secs);
    }
    rc = KILN_EXIT_OK;
    goto out;
fail:
    rc = kiln_cli_fail("perplexity", &err, a.json);
out:
    for (size_t w = 0; seqs && w < nw; w++) free(seqs[w]);
    for (size_t w = 0; lps && w < nw; w++) free(lps[w]);
    free(seqs), free(lps), free(lens), free(win), free(ids);
    kiln_ctx_free(ctx);
    kiln_close(k);
    return rc;
}
