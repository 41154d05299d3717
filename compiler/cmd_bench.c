/*
 * cmd_bench.c — `kiln bench ENGINE [--batch B] [--input-len I] [--output-len O] ...`
 *
 * Measures an engine through the public C API (runtime/kiln.h), the way an
 * embedding program would use it: B requests of I random prompt ids (fixed
 * seed, so every run feeds the same ids), O new tokens each with ignore_eos,
 * submitted together and stepped to the end. Per run it takes, from the
 * token callbacks' clock readings:
 *
 *   ttft_ms              submit → a request's first token, mean over requests
 *   prefill_ms           submit → the last request's first token: all B
 *                        prompts read (chunked prefill may take several steps)
 *   decode_ms_per_token  (last token − last first token) / (O − 1): one
 *                        decode step of the whole batch
 *   decode_tokens_per_s  B × (O − 1) over that same span
 *
 * and reports the median of --reps runs after --warmup unmeasured ones, at
 * batch 1 and at batch B (prefill and ttft at both, decode at B). Once per
 * invocation: load_ms (kiln_open + kiln_ctx_new: open to ready) and the peak
 * memory: host RSS, and device memory when the executor reports it.
 *
 * Output: a table, or with --json one JSON object per line per measurement:
 *   {"model", "dtype", "batch", "input_len", "output_len", "metric", "value",
 *    "unit", "device", "gpu", "commit"}
 * commit comes from the KILN_COMMIT environment variable, else the
 * KILN_COMMIT compile definition, else "unknown"; gpu is "none" on the CPU.
 */
#include <getopt.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../runtime/kiln.h"
#include "cli.h"

#define BENCH_SEED 0x6b696c6eull /* "kiln" */

/* The command's entry point (main.c dispatches to it; cli.h should declare it). */

static void help(FILE *f) {
    fprintf(f,
            "usage: kiln bench ENGINE.kiln [options]\n\n"
            "Measure prefill, time to first token, decode speed, load time and peak memory\n"
            "through the C API: BATCH requests of INPUT_LEN random prompt ids (fixed seed),\n"
            "OUTPUT_LEN new tokens each (end-of-sequence ignored), medians over --reps runs.\n\n"
            "  --batch B            requests run together (default 1)\n"
            "  --input-len I        prompt tokens per request (default 128)\n"
            "  --output-len O       new tokens per request (default 128)\n"
            "  --device DEV         cpu, gpu or auto (default auto)\n"
            "  --warmup N           unmeasured runs first (default 1)\n"
            "  --reps N             measured runs; medians are reported (default 3)\n"
            "  --threads N          CPU threads (default: one per core)\n"
            "  --max-context N      context to allocate (default: input + output, at most the model's)\n"
            "  --max-step-tokens N  new tokens per scheduler step (default: batch x input, so a\n"
            "                       prefill takes one step where the device allows it)\n"
            "  --kv-memory X        KV memory: bytes (suffix K, M, G) or a fraction of free GPU\n"
            "                       memory in (0, 1] (default: the context's default)\n"
            "  --json               one JSON object per line per measurement: model, dtype, batch,\n"
            "                       input_len, output_len, metric, value, unit, device, gpu, commit\n"
            "  -h, --help           this help\n\n"
            "Exit codes: 0 success, 1 failure, 2 usage error.\n");
}

/* ---- one run ---- */

typedef struct req_clock {
    double first, last; /* kiln_now() at the first and the last token */
    int n;
    int32_t finished, reason;
} req_clock;

static int32_t on_token(void *user, int64_t id, int32_t token, int32_t finished, int32_t reason) {
    req_clock *c = user;
    double now = kiln_now();
    if (token >= 0) {
        if (c->n == 0) c->first = now;
        c->last = now;
        c->n++;
    }
    if (finished) {
        c->finished = 1;
        c->reason = reason;
    }
    return 0;
}

typedef struct run_result {
    double ttft_ms, prefill_ms, decode_ms_per_token, decode_tokens_per_s;
} run_result;

/* Deterministic prompt ids: request r, position t. */
static int32_t prompt_id(int r, int t, int32_t vocab, int32_t bos) {
    if (t == 0 && bos >= 0) return bos;
    uint64_t z = BENCH_SEED + 0x9e3779b97f4a7c15ull * ((uint64_t)r * 1000003u + (uint64_t)t + 1);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    return (int32_t)(z % (uint64_t)vocab);
}

static kiln_status run_once(kiln_ctx_t *ctx, const int32_t *prompts, int batch, int in_len, int out_len,
                            run_result *res, kiln_error *err) {
    req_clock *clk = calloc((size_t)batch, sizeof *clk);
    if (!clk) return kiln_err(err, KILN_ERR_NOMEM, "out of memory");
    kiln_request_options ro;
    kiln_request_options_init(&ro);
    ro.max_tokens = out_len;
    ro.ignore_eos = 1;
    ro.on_token = on_token;
    kiln_status st = KILN_OK;
    double t0 = kiln_now();
    for (int r = 0; r < batch && st == KILN_OK; r++) {
        int64_t id;
        ro.user = &clk[r];
        st = kiln_submit(ctx, prompts + (size_t)r * (size_t)in_len, in_len, &ro, &id);
    }
    if (st == KILN_OK) st = kiln_run(ctx);
    if (st != KILN_OK) {
        kiln_err(err, st, "%s", kiln_last_error(ctx));
        free(clk);
        return st;
    }
    double ttft = 0, all_first = 0, end = 0;
    for (int r = 0; r < batch; r++) {
        if (!clk[r].finished || clk[r].n != out_len) {
            st = kiln_err(err, KILN_ERR_INTERNAL, "request %d produced %d of %d tokens (stop: %s)", r, clk[r].n,
                          out_len, kiln_stop_reason_str((kiln_stop_reason)clk[r].reason));
            free(clk);
            return st;
        }
        ttft += clk[r].first - t0;
        if (clk[r].first > all_first) all_first = clk[r].first;
        if (clk[r].last > end) end = clk[r].last;
    }
    res->ttft_ms = ttft / batch * 1e3;
    res->prefill_ms = (all_first - t0) * 1e3;
    res->decode_ms_per_token = out_len > 1 ? (end - all_first) / (out_len - 1) * 1e3 : NAN;
    res->decode_tokens_per_s = out_len > 1 && end > all_first ? batch * (out_len - 1) / (end - all_first) : NAN;
    free(clk);
    return KILN_OK;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/* Medians over reps runs at one batch size. */
static kiln_status measure(kiln_ctx_t *ctx, int32_t vocab, int32_t bos, int batch, int in_len, int out_len,
                           int warmup, int reps, run_result *med, kiln_error *err) {
    int32_t *prompts = malloc((size_t)batch * (size_t)in_len * sizeof *prompts);
    double *v[4];
    for (int i = 0; i < 4; i++) v[i] = malloc((size_t)reps * sizeof(double));
    kiln_status st = KILN_OK;
    if (!prompts || !v[0] || !v[1] || !v[2] || !v[3]) {
        st = kiln_err(err, KILN_ERR_NOMEM, "out of memory for %d prompts of %d tokens", batch, in_len);
        goto out;
    }
    for (int r = 0; r < batch; r++)
        for (int t = 0; t < in_len; t++) prompts[(size_t)r * (size_t)in_len + (size_t)t] = prompt_id(r, t, vocab, bos);
    bool tty = isatty(2);
    for (int i = 0; i < warmup + reps; i++) {
        if (tty) fprintf(stderr, "\rkiln bench: batch %d, %s %d/%d ", batch, i < warmup ? "warmup" : "run",
                         i < warmup ? i + 1 : i - warmup + 1, i < warmup ? warmup : reps);
        run_result r = {0};
        if ((st = run_once(ctx, prompts, batch, in_len, out_len, &r, err)) != KILN_OK) goto out;
        if (i < warmup) continue;
        v[0][i - warmup] = r.ttft_ms;
        v[1][i - warmup] = r.prefill_ms;
        v[2][i - warmup] = r.decode_ms_per_token;
        v[3][i - warmup] = r.decode_tokens_per_s;
    }
    if (tty) fprintf(stderr, "\r%60s\r", "");
    med->ttft_ms = median(v[0], reps);
    med->prefill_ms = median(v[1], reps);
    med->decode_ms_per_token = median(v[2], reps);
    med->decode_tokens_per_s = median(v[3], reps);
out:
    free(prompts);
    for (int i = 0; i < 4; i++) free(v[i]);
    return st;
}

/* ---- output ---- */

typedef struct report {
    bool json;
    const char *model, *dtype, *device, *gpu, *commit;
    int input_len, output_len;
} report;

static void emit(const report *rp, int batch, const char *metric, double value, const char *unit) {
    if (isnan(value)) return;
    if (rp->json) {
        json_t *j = json_pack("{s:s, s:s, s:i, s:i, s:i, s:s, s:f, s:s, s:s, s:s, s:s}", "model", rp->model, "dtype",
                              rp->dtype, "batch", batch, "input_len", rp->input_len, "output_len", rp->output_len,
                              "metric", metric, "value", value, "unit", unit, "device", rp->device, "gpu", rp->gpu,
                              "commit", rp->commit);
        char *s = j ? json_dumps(j, JSON_COMPACT | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(6)) : NULL;
        if (s) printf("%s\n", s);
        free(s);
        json_decref(j);
    } else {
        printf("  %-22s batch %-4d %12.3f %s\n", metric, batch, value, unit);
    }
}


static const char *commit_id(void) {
    const char *e = getenv("KILN_COMMIT");
    if (e && *e) return e;
#ifdef KILN_COMMIT
    return KILN_COMMIT;
#else
    return "unknown";
#endif
}

/* The engine file's name without folders and ".kiln". */
static char *model_name(const char *path) {
    const char *b = strrchr(path, '/');
    b = b ? b + 1 : path;
    size_t n = strlen(b);
    if (n > 5 && strcmp(b + n - 5, ".kiln") == 0) n -= 5;
    return strndup(b, n);
}

/* The weights' dtype from the meta section: weights.dtype, or the
 * checkpoint's when the engine kept it. */
static char *weights_dtype(const char *meta) {
    json_error_t je;
    json_t *root = meta ? json_loads(meta, 0, &je) : NULL;
    const char *d = json_string_value(json_object_get(json_object_get(root, "weights"), "dtype"));
    if (d && strcmp(d, "checkpoint") == 0)
        d = json_string_value(json_object_get(json_object_get(root, "model"), "checkpoint_dtype"));
    char *out = strdup(d ? d : "unknown");
    json_decref(root);
    return out;
}

int kiln_cmd_bench(int argc, char **argv) {
    enum { O_BATCH = 256, O_IN, O_OUT, O_DEV, O_WARM, O_REPS, O_THR, O_CTX, O_STEP, O_KV, O_JSON };
    static const struct option longopts[] = {
        {"batch", required_argument, 0, O_BATCH},   {"input-len", required_argument, 0, O_IN},
        {"output-len", required_argument, 0, O_OUT}, {"device", required_argument, 0, O_DEV},
        {"warmup", required_argument, 0, O_WARM},   {"reps", required_argument, 0, O_REPS},
        {"threads", required_argument, 0, O_THR},   {"max-context", required_argument, 0, O_CTX},
        {"max-step-tokens", required_argument, 0, O_STEP}, {"kv-memory", required_argument, 0, O_KV},
        {"json", no_argument, 0, O_JSON},            {"help", no_argument, 0, 'h'},
        {0, 0, 0, 0}};
    long long batch = 1, in_len = 128, out_len = 128, warmup = 1, reps = 3, threads = 0, max_ctx = 0, max_step = 0;
    const char *device = "auto";
    int64_t kv_bytes = 0;
    double kv_fraction = 0;
    bool json = false;
    int c;
    optind = 1;
    opterr = 0;
    while ((c = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
        switch (c) {
        case O_BATCH:
            if (!kiln_cli_parse_int(optarg, 1, 1024, &batch))
                return kiln_cli_usage_error("bench", "--batch '%s' is not a number in 1..1024", optarg);
            break;
        case O_IN:
            if (!kiln_cli_parse_int(optarg, 1, 1 << 24, &in_len))
                return kiln_cli_usage_error("bench", "--input-len '%s' is not a positive number", optarg);
            break;
        case O_OUT:
            if (!kiln_cli_parse_int(optarg, 1, 1 << 24, &out_len))
                return kiln_cli_usage_error("bench", "--output-len '%s' is not a positive number", optarg);
            break;
        case O_DEV:
            if (strcmp(optarg, "cpu") != 0 && strcmp(optarg, "gpu") != 0 && strcmp(optarg, "auto") != 0)
                return kiln_cli_usage_error("bench", "unknown device '%s' (cpu, gpu, auto)", optarg);
            device = optarg;
            break;
        case O_WARM:
            if (!kiln_cli_parse_int(optarg, 0, 1000, &warmup))
                return kiln_cli_usage_error("bench", "--warmup '%s' is not a number in 0..1000", optarg);
            break;
        case O_REPS:
            if (!kiln_cli_parse_int(optarg, 1, 1000, &reps))
                return kiln_cli_usage_error("bench", "--reps '%s' is not a number in 1..1000", optarg);
            break;
        case O_THR:
            if (!kiln_cli_parse_int(optarg, 1, 1024, &threads))
                return kiln_cli_usage_error("bench", "--threads '%s' is not a number in 1..1024", optarg);
            break;
        case O_CTX:
            if (!kiln_cli_parse_int(optarg, 1, 1 << 24, &max_ctx))
                return kiln_cli_usage_error("bench", "--max-context '%s' is not a positive number", optarg);
            break;
        case O_STEP:
            if (!kiln_cli_parse_int(optarg, 1, 1 << 24, &max_step))
                return kiln_cli_usage_error("bench", "--max-step-tokens '%s' is not a positive number", optarg);
            break;
        case O_KV:
            if (!kiln_cli_parse_memory(optarg, &kv_bytes, &kv_fraction))
                return kiln_cli_usage_error("bench", "--kv-memory '%s' is neither bytes (e.g. 4G) nor a fraction in "
                                                     "(0, 1]",
                                            optarg);
            break;
        case O_JSON: json = true; break;
        case 'h': help(stdout); return KILN_EXIT_OK;
        default: return kiln_cli_usage_error("bench", "unknown or incomplete option '%s'", argv[optind - 1]);
        }
    }
    if (optind != argc - 1) return kiln_cli_usage_error("bench", "expected one engine file");
    if (kv_fraction > 0 && strcmp(device, "cpu") == 0)
        return kiln_cli_usage_error("bench", "--kv-memory %g is a fraction of GPU memory, which does not apply to "
                                             "--device cpu; give bytes (e.g. 512M)", kv_fraction);
    const char *path = argv[optind];

    kiln_error err = {0};
    int rc = KILN_EXIT_FAIL;
    kiln_t *k = NULL;
    kiln_ctx_t *ctx = NULL;
    char *name = model_name(path), *dtype = NULL;
    double t0 = kiln_now();
    kiln_status st = kiln_open(path, (int32_t)threads, &k);
    if (st != KILN_OK) {
        kiln_err(&err, st, "%s", kiln_error_message(k));
        goto fail;
    }
    int32_t model_ctx = kiln_max_context(k);
    if (in_len + out_len - 1 > (max_ctx ? max_ctx : model_ctx)) {
        kiln_err(&err, KILN_ERR_CONTEXT, "input %lld + output %lld tokens do not fit the %lld-token context", in_len,
                 out_len, max_ctx ? max_ctx : (long long)model_ctx);
        kiln_err_hint(&err, "lower --input-len or --output-len%s", max_ctx ? ", or raise --max-context" : "");
        goto fail;
    }
    kiln_ctx_options o;
    kiln_ctx_options_init(&o);
    o.device = device;
    o.max_batch = (int32_t)batch;
    o.max_context = (int32_t)(max_ctx ? max_ctx : (in_len + out_len < model_ctx ? in_len + out_len : model_ctx));
    long long step = max_step ? max_step : batch * in_len;
    o.max_step_tokens = (int32_t)(step < batch ? batch : step > (1 << 24) ? (1 << 24) : step);
    o.threads = (int32_t)threads;
    o.kv_bytes = kv_bytes;
    if (kv_fraction > 0) o.kv_fraction = kv_fraction;
    if ((st = kiln_ctx_new(k, &o, &ctx)) != KILN_OK) {
        kiln_err(&err, st, "%s", kiln_last_error(ctx));
        goto fail;
    }
    double load_ms = (kiln_now() - t0) * 1e3;
    kiln_ctx_info info = {.struct_size = sizeof info};
    if ((st = kiln_ctx_info_get(ctx, &info)) != KILN_OK) {
        kiln_err(&err, st, "%s", kiln_last_error(ctx));
        goto fail;
    }
    dtype = weights_dtype(kiln_meta_json(k));
    bool on_gpu = strcmp(info.device, "gpu") == 0;
    report rp = {.json = json, .model = name, .dtype = dtype, .device = info.device,
                 .gpu = on_gpu ? info.device_name : "none", .commit = commit_id(),
                 .input_len = (int)in_len, .output_len = (int)out_len};
    if (!json)
        printf("kiln bench %s: %s weights on %s (%s), input %lld, output %lld, median of %lld\n", name, dtype,
               info.device, rp.gpu, in_len, out_len, reps);

    int32_t vocab = kiln_vocab_size(k), bos = kiln_bos_id(k);
    run_result one = {0}, many = {0};
    emit(&rp, (int)batch, "load_ms", load_ms, "ms");
    if (batch > 1) {
        if ((st = measure(ctx, vocab, bos, 1, (int)in_len, (int)out_len, (int)warmup, (int)reps, &one, &err)) !=
            KILN_OK)
            goto fail;
        emit(&rp, 1, "prefill_ms", one.prefill_ms, "ms");
        emit(&rp, 1, "ttft_ms", one.ttft_ms, "ms");
    }
    if ((st = measure(ctx, vocab, bos, (int)batch, (int)in_len, (int)out_len, (int)warmup, (int)reps, &many, &err)) !=
        KILN_OK)
        goto fail;
    emit(&rp, (int)batch, "prefill_ms", many.prefill_ms, "ms");
    emit(&rp, (int)batch, "ttft_ms", many.ttft_ms, "ms");
    emit(&rp, (int)batch, "decode_ms_per_token", many.decode_ms_per_token, "ms");
    emit(&rp, (int)batch, "decode_tokens_per_s", many.decode_tokens_per_s, "tokens/s");
    if ((st = kiln_ctx_info_get(ctx, &info)) != KILN_OK) {
        kiln_err(&err, st, "%s", kiln_last_error(ctx));
        goto fail;
    }
    emit(&rp, (int)batch, "peak_host_memory", (double)info.host_peak_bytes / (1024.0 * 1024.0), "MiB");
    if (on_gpu || info.device_peak_bytes > 0)
        emit(&rp, (int)batch, "peak_device_memory", (double)info.device_peak_bytes / (1024.0 * 1024.0), "MiB");
    rc = KILN_EXIT_OK;
    goto out;
fail:
    rc = kiln_cli_fail("bench", &err, json);
out:
    kiln_ctx_free(ctx);
    kiln_close(k);
    free(name);
    free(dtype);
    return rc;
}
