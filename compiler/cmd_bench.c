/*
 * cmd_bench.c — `kiln bench ENGINE [--batch B] [--requests R] [--input-len I] [--output-len O] ...`
 *
 * Measures an engine through the public C API (runtime/kiln.h), the way an
 * embedding program would use it: a context of B slots (max_batch), R
 * requests (default B) of I random prompt ids (fixed seed, so every run
 * feeds the same ids), O new tokens each with ignore_eos, all submitted at
 * once and stepped to the end. With R > B, or a KV pool too small for all of
 * them, requests queue: the scheduler admits each when a slot and its KV
 * memory are free. Per run, from the token callbacks' clock readings
 * (submit = the moment kiln_submit returned for that request):
 *
 *   e2e_s                    first submit → last token of all requests
 *   e2e_output_tokens_per_s  R × O / e2e_s
 *   e2e_total_tokens_per_s   R × (I + O) / e2e_s
 *   ttft_ms, ttft_p50/p90/p99_ms   submit → first token; mean and percentiles
 *   tpot_p50/p90/p99_ms      (last − first token) / (O − 1) per request (O > 1)
 *
 * and, only when the run had no queueing (R = B and every request had its
 * first token before any request finished, so all B ran together):
 *
 *   prefill_ms               first submit → the last request's first token:
 *                            every prompt read (chunked prefill may take
 *                            several steps of the step budget)
 *   decode_ms_per_token      (last token − last first token) / (O − 1): the
 *                            time of one decode step of the batch, taken
 *                            over the last-admitted request's decode span
 *   decode_tokens_per_s      B × (O − 1) over that span (exact when every
 *                            prompt is read in one step; when chunked
 *                            prefill staggers the batch, early requests
 *                            finish inside the span and this is an upper
 *                            bound: use e2e_output_tokens_per_s)
 *
 * Percentiles are nearest-rank over the requests of a run (p50 ≤ p90 ≤
 * p99). Every metric is the median over --reps runs after --warmup
 * unmeasured ones, at batch 1 (prefill and ttft, when B > 1) and at batch B.
 * Once per invocation: load_ms (kiln_open + kiln_ctx_new: open to ready),
 * max_step_tokens and kv_capacity_tokens of the context, max_running (most
 * requests that ran in one step), peak host memory, and on a GPU the peak
 * device memory with its parts (weights, KV pool, step scratch: peak ≤ their
 * sum, docs/benchmarks.md).
 *
 * Output: a table, or with --json one JSON object per line per measurement:
 *   {"model", "dtype", "batch", "requests", "input_len", "output_len",
 *    "metric", "value", "unit", "device", "gpu", "gpus", "commit"}
 * commit comes from the KILN_COMMIT environment variable, else the commit
 * the build was made from (kiln_build_commit); gpu is "none" on the CPU;
 * gpus is each tensor-parallel rank's CUDA device as --gpus gave them, or
 * the default (rank r on device r: "0" for a plain engine), "none" on the
 * CPU.
 */
#include <getopt.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../runtime/kiln.h"
#include "../runtime/kiln_exec.h"
#include "../runtime/kiln_rt.h"
#include "cli.h"

#define BENCH_SEED 0x6b696c6eull /* "kiln" */
#define MAX_REQUESTS 1000000

/* The command's entry point (main.c dispatches to it; cli.h should declare it). */

static void help(FILE *f) {
    fprintf(f, "usage: %s ", kiln_cli_prog);
    fprintf(f,
            "bench ENGINE.kiln [options]\n\n"
            "Measure end-to-end throughput, time to first token (TTFT) and time per output token\n"
            "(TPOT) percentiles, prefill and decode speed, load time and peak memory through the\n"
            "C API: REQUESTS requests of INPUT_LEN random prompt ids (fixed seed), OUTPUT_LEN new\n"
            "tokens each (end-of-sequence ignored), submitted at once to a context of BATCH slots;\n"
            "requests that do not fit (slots or KV memory) wait. Medians over --reps runs.\n\n"
            "  --batch B            sequences that run together: the context's slots (default 1)\n"
            "  --requests R         requests per run (default B; more than B queue)\n"
            "  --input-len I        prompt tokens per request (default 128)\n"
            "  --output-len O       new tokens per request (default 128)\n"
            "  --device DEV         cpu, gpu or auto (default auto)\n"
            "  --warmup N           unmeasured runs first (default 1)\n"
            "  --reps N             measured runs; medians are reported (default 3)\n"
            "  --threads N          CPU threads (default: one per core)\n"
            "  --max-context N      context to allocate (default: input + output, at most the model's)\n"
            "  --max-step-tokens N  new tokens per scheduler step, all sequences together (default\n"
            "                       8192, fewer on a GPU short of memory; at least B): the chunked-\n"
            "                       prefill budget, which sizes the GPU's activations and scratch\n"
            "  --kv-memory X        KV memory: bytes (suffix K, M, G) or a fraction of free GPU\n"
            "                       memory in (0, 1] (default: the context's default)\n");
    kiln_cli_gpus_help(f, 23);
    fprintf(f,
            "  --measure KNOBS      measurement knobs for the GPU, e.g. 'lt_tune=0,attn_waves=3':\n"
            "                       gemv_max_m=1..64, attn_waves=(0,64], lt_tune=0|1|2, pdl=0|1,\n"
            "                       graphs=0|1, moe_grouped=0|1, qgemv_cc=0|1, w8a8=0|1|2, tp_oneshot=0|1|2,\n"
            "                       prefill_wg=0|1, decode_tc=0|1|2, decode_tc_min=1..65536,\n"
            "                       lt_search=0|1, w8a8_fast=0|1\n"
            "                       (docs/c-api.md: kiln_ctx_options.measure);\n"
            "                       for A/B\n"
            "                       comparisons of how one plan runs; fusions are compile options\n"
            "                       (kiln compile --passes)\n"
            "  --profile            time every kernel of the GPU program (no CUDA graphs, so steps run\n"
            "                       slower than without it) and print, per step kind (decode, prefill),\n"
            "                       one row per plan op kind and shape: time per step, share, bytes and\n"
            "                       FLOPs, and achieved bandwidth or TFLOP/s as a fraction of the GPU's\n"
            "                       ceiling (the H200's measured ones; --ceilings for another GPU)\n"
            "  --ceilings BW,TF     the ceilings --profile compares with: read bandwidth in TB/s and\n"
            "                       dense bf16 TFLOP/s (default on an H200: 4.2,785)\n"
            "  --json               one JSON object per line per measurement: model, dtype, batch,\n"
            "                       requests, input_len, output_len, metric, value, unit, device,\n"
            "                       gpu, gpus (each rank's CUDA device, \"none\" on the CPU), commit\n"
            "  -h, --help           this help\n\n"
            "Exit codes: 0 success, 1 failure, 2 usage error.\n");
}

/* ---- one run ---- */

typedef struct req_clock {
    double submit, first, last; /* kiln_now() at submit, at the first and at the last token */
    int n;
    int32_t finished, reason;
} req_clock;

static int32_t on_token(void *user, int64_t id, int32_t token, int32_t finished, int32_t reason) {
    (void)id;
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

/* The measurements of one run; NAN = not measured (not emitted). */
enum {
    RM_E2E_S, RM_OUT_TPS, RM_TOTAL_TPS, RM_TTFT, RM_TTFT_P50, RM_TTFT_P90, RM_TTFT_P99,
    RM_TPOT_P50, RM_TPOT_P90, RM_TPOT_P99, RM_PREFILL, RM_DECODE_MS, RM_DECODE_TPS, RM_COUNT
};
typedef struct run_result {
    double v[RM_COUNT];
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

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Nearest-rank percentile p (0 < p <= 100) of v[n], sorted in place; NAN when n is 0. */
static double percentile(double *v, int n, double p) {
    if (n <= 0) return NAN;
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    int k = (int)ceil(p / 100.0 * n);
    return v[k < 1 ? 0 : k > n ? n - 1 : k - 1];
}

/* The run's metrics from its clocks (every request finished with out_len tokens). */
static void summarize(const req_clock *clk, int n_req, int batch, int in_len, int out_len, double *tmp,
                      run_result *res) {
    double t0 = clk[0].submit, all_first = 0, end = 0, first_end = INFINITY, ttft = 0;
    for (int r = 0; r < n_req; r++) {
        ttft += clk[r].first - clk[r].submit;
        if (clk[r].first > all_first) all_first = clk[r].first;
        if (clk[r].last > end) end = clk[r].last;
        if (clk[r].last < first_end) first_end = clk[r].last;
    }
    double *v = res->v, wall = end - t0;
    v[RM_E2E_S] = wall;
    v[RM_OUT_TPS] = wall > 0 ? (double)n_req * out_len / wall : NAN;
    v[RM_TOTAL_TPS] = wall > 0 ? (double)n_req * (in_len + out_len) / wall : NAN;
    v[RM_TTFT] = ttft / n_req * 1e3;
    for (int r = 0; r < n_req; r++) tmp[r] = (clk[r].first - clk[r].submit) * 1e3;
    v[RM_TTFT_P50] = percentile(tmp, n_req, 50);
    v[RM_TTFT_P90] = percentile(tmp, n_req, 90);
    v[RM_TTFT_P99] = percentile(tmp, n_req, 99);
    int nt = 0;
    for (int r = 0; r < n_req && out_len > 1; r++) tmp[nt++] = (clk[r].last - clk[r].first) / (out_len - 1) * 1e3;
    v[RM_TPOT_P50] = percentile(tmp, nt, 50);
    v[RM_TPOT_P90] = percentile(tmp, nt, 90);
    v[RM_TPOT_P99] = percentile(tmp, nt, 99);
    /* all B together: every first token before any request finished (with O = 1 a request finishes
     * at its first token, so only the single-request case counts) */
    bool together = n_req == batch && (out_len > 1 ? all_first < first_end : n_req == 1);
    v[RM_PREFILL] = together ? (all_first - t0) * 1e3 : NAN;
    v[RM_DECODE_MS] = together && out_len > 1 ? (end - all_first) / (out_len - 1) * 1e3 : NAN;
    v[RM_DECODE_TPS] = together && out_len > 1 && end > all_first ? batch * (out_len - 1) / (end - all_first) : NAN;
}

static kiln_status run_once(kiln_ctx_t *ctx, const int32_t *prompts, int n_req, int batch, int in_len, int out_len,
                            run_result *res, kiln_error *err) {
    req_clock *clk = calloc((size_t)n_req, sizeof *clk);
    double *tmp = malloc((size_t)n_req * sizeof *tmp);
    kiln_status st = KILN_OK;
    if (!clk || !tmp) {
        st = kiln_err(err, KILN_ERR_NOMEM, "out of memory for %d requests", n_req);
        goto out;
    }
    kiln_request_options ro;
    kiln_request_options_init(&ro);
    ro.max_tokens = out_len;
    ro.ignore_eos = 1;
    ro.on_token = on_token;
    for (int r = 0; r < n_req && st == KILN_OK; r++) {
        int64_t id;
        ro.user = &clk[r];
        clk[r].submit = kiln_now();
        st = kiln_submit(ctx, prompts + (size_t)r * (size_t)in_len, in_len, &ro, &id);
    }
    if (st == KILN_OK) st = kiln_run(ctx);
    if (st != KILN_OK) {
        kiln_err(err, st, "%s", kiln_last_error(ctx));
        goto out;
    }
    for (int r = 0; r < n_req; r++)
        if (!clk[r].finished || clk[r].n != out_len) {
            st = kiln_err(err, KILN_ERR_INTERNAL, "request %d produced %d of %d tokens (stop: %s)", r, clk[r].n,
                          out_len, kiln_stop_reason_str((kiln_stop_reason)clk[r].reason));
            goto out;
        }
    summarize(clk, n_req, batch, in_len, out_len, tmp, res);
out:
    free(clk);
    free(tmp);
    return st;
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/* The shape of one measurement. */
typedef struct bench_shape {
    int batch, requests, in_len, out_len, warmup, reps;
} bench_shape;

/* Medians over reps runs of one shape (NAN where any run did not measure it). */
static kiln_status measure(kiln_ctx_t *ctx, int32_t vocab, int32_t bos, const bench_shape *sh, run_result *med,
                           kiln_error *err) {
    const int R = sh->requests, reps = sh->reps;
    int32_t *prompts = malloc((size_t)R * (size_t)sh->in_len * sizeof *prompts);
    double *v = malloc((size_t)reps * RM_COUNT * sizeof *v);
    kiln_status st = KILN_OK;
    if (!prompts || !v) {
        st = kiln_err(err, KILN_ERR_NOMEM, "out of memory for %d prompts of %d tokens", R, sh->in_len);
        goto out;
    }
    for (int r = 0; r < R; r++)
        for (int t = 0; t < sh->in_len; t++)
            prompts[(size_t)r * (size_t)sh->in_len + (size_t)t] = prompt_id(r, t, vocab, bos);
    bool tty = isatty(2);
    for (int i = 0; i < sh->warmup + reps; i++) {
        bool warm = i < sh->warmup;
        if (tty)
            fprintf(stderr, "\rkiln bench: batch %d, %d requests, %s %d/%d ", sh->batch, R, warm ? "warmup" : "run",
                    warm ? i + 1 : i - sh->warmup + 1, warm ? sh->warmup : reps);
        run_result r = {{0}};
        if (i == sh->warmup) kiln_ctx_profile_rows(ctx, NULL, -1); /* a profile counts the measured runs only */
        if ((st = run_once(ctx, prompts, R, sh->batch, sh->in_len, sh->out_len, &r, err)) != KILN_OK) goto out;
        if (!warm)
            for (int m = 0; m < RM_COUNT; m++) v[(size_t)m * reps + (size_t)(i - sh->warmup)] = r.v[m];
    }
    if (tty) fprintf(stderr, "\r%70s\r", "");
    for (int m = 0; m < RM_COUNT; m++) {
        double *col = v + (size_t)m * reps;
        bool all = true;
        for (int i = 0; i < reps; i++) all &= !isnan(col[i]);
        med->v[m] = all ? median(col, reps) : NAN;
    }
out:
    free(prompts);
    free(v);
    return st;
}

/* ---- output ---- */

typedef struct report {
    bool json;
    const char *model, *dtype, *device, *gpu, *commit;
    const char *gpus; /* each rank's CUDA device ("0,1"), "none" on the CPU */
    int input_len, output_len;
} report;

static void emit(const report *rp, int batch, int requests, const char *metric, double value, const char *unit) {
    if (isnan(value)) return;
    if (rp->json) {
        json_t *j = json_pack("{s:s, s:s, s:i, s:i, s:i, s:i, s:s, s:f, s:s, s:s, s:s, s:s, s:s}", "model",
                              rp->model, "dtype", rp->dtype, "batch", batch, "requests", requests, "input_len",
                              rp->input_len, "output_len", rp->output_len, "metric", metric, "value", value, "unit",
                              unit, "device", rp->device, "gpu", rp->gpu, "gpus", rp->gpus, "commit", rp->commit);
        char *s = j ? json_dumps(j, JSON_COMPACT | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(6)) : NULL;
        if (s) printf("%s\n", s);
        free(s);
        json_decref(j);
    } else {
        printf("  %-24s batch %-4d requests %-6d %12.3f %s\n", metric, batch, requests, value, unit);
    }
}

/* Every measurement of one shape, in a fixed order. */
static void emit_run(const report *rp, const bench_shape *sh, const run_result *r) {
    static const struct {
        int m;
        const char *name, *unit;
    } rows[] = {
        {RM_PREFILL, "prefill_ms", "ms"},
        {RM_TTFT, "ttft_ms", "ms"},
        {RM_DECODE_MS, "decode_ms_per_token", "ms"},
        {RM_DECODE_TPS, "decode_tokens_per_s", "tokens/s"},
        {RM_E2E_S, "e2e_s", "s"},
        {RM_OUT_TPS, "e2e_output_tokens_per_s", "tokens/s"},
        {RM_TOTAL_TPS, "e2e_total_tokens_per_s", "tokens/s"},
        {RM_TTFT_P50, "ttft_p50_ms", "ms"},
        {RM_TTFT_P90, "ttft_p90_ms", "ms"},
        {RM_TTFT_P99, "ttft_p99_ms", "ms"},
        {RM_TPOT_P50, "tpot_p50_ms", "ms"},
        {RM_TPOT_P90, "tpot_p90_ms", "ms"},
        {RM_TPOT_P99, "tpot_p99_ms", "ms"},
    };
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++)
        emit(rp, sh->batch, sh->requests, rows[i].name, r->v[rows[i].m], rows[i].unit);
}

/* What the context holds once every run is done: limits, peak memory and its parts. */
/* The engine's tuning record for this GPU (`kiln tune`) as the executor found it: a line
 * "tuning: recorded sm_90 (12 shapes)" / "stale (cuBLASLt 130000 vs 130100)" / "none (heuristic)",
 * or with --json a measurement "tuning" whose value is the recorded shapes in use (0 without) and
 * whose "tuning" key holds the words. */
static void emit_tuning(const report *rp, const bench_shape *sh, const char *tuning) {
    if (!tuning[0]) return;
    unsigned sm = 0, shapes = 0;
    if (sscanf(tuning, "recorded sm_%u (%u shapes", &sm, &shapes) != 2) shapes = 0;
    if (!rp->json) {
        printf("  tuning: %s\n", tuning);
        return;
    }
    json_t *j = json_pack("{s:s, s:s, s:i, s:i, s:i, s:i, s:s, s:i, s:s, s:s, s:s, s:s, s:s, s:s}", "model",
                          rp->model, "dtype", rp->dtype, "batch", sh->batch, "requests", sh->requests, "input_len",
                          rp->input_len, "output_len", rp->output_len, "metric", "tuning", "value", (int)shapes,
                          "unit", "shapes", "tuning", tuning, "device", rp->device, "gpu", rp->gpu, "gpus", rp->gpus,
                          "commit", rp->commit);
    char *s = j ? json_dumps(j, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
    if (s) printf("%s\n", s);
    free(s);
    json_decref(j);
}

static void emit_context(const report *rp, const bench_shape *sh, const kiln_ctx_info *in, bool on_gpu) {
    const double mib = 1024.0 * 1024.0;
    emit(rp, sh->batch, sh->requests, "max_step_tokens", in->max_step_tokens, "tokens");
    if (in->kv_capacity_tokens > 0)
        emit(rp, sh->batch, sh->requests, "kv_capacity_tokens", (double)in->kv_capacity_tokens, "tokens");
    emit(rp, sh->batch, sh->requests, "max_running", in->max_running, "requests");
    emit(rp, sh->batch, sh->requests, "peak_host_memory", (double)in->host_peak_bytes / mib, "MiB");
    if (!on_gpu && in->device_peak_bytes <= 0) return;
    emit(rp, sh->batch, sh->requests, "peak_device_memory", (double)in->device_peak_bytes / mib, "MiB");
    emit(rp, sh->batch, sh->requests, "weights_memory", (double)in->weight_bytes / mib, "MiB");
    emit(rp, sh->batch, sh->requests, "kv_memory", (double)in->kv_bytes / mib, "MiB");
    emit(rp, sh->batch, sh->requests, "scratch_memory", (double)in->scratch_bytes / mib, "MiB");
    emit(rp, sh->batch, sh->requests, "kernels_load_ms", in->kernels_load_seconds * 1e3, "ms");
    emit(rp, sh->batch, sh->requests, "ptx_jit", in->kernels_jitted, "bool");
    emit(rp, sh->batch, sh->requests, "gemm_fp8_matrices", in->gemm_fp8, "matrices"); /* W8A8 (after the run) */
    emit(rp, sh->batch, sh->requests, "gemm_q_matrices", in->gemm_q, "matrices");     /* the quantized GEMM */
    emit_tuning(rp, sh, in->tuning);
}

static const char *commit_id(void) {
    const char *e = getenv("KILN_COMMIT");
    if (e && *e) return e;
    return kiln_build_commit();
}

/* The engine file's name without folders and ".kiln". */
static char *model_name(const char *path) {
    const char *b = strrchr(path, '/');
    b = b ? b + 1 : path;
    size_t n = strlen(b);
    if (n > 5 && strcmp(b + n - 5, ".kiln") == 0) n -= 5;
    return strndup(b, n);
}

/* The weights' dtype from the meta section: weights.dtype, or the checkpoint's when the engine
 * kept it, then "+" and the projections' quantized format when it has one ("bf16+q4g128"). */
static char *weights_dtype(const char *meta) {
    json_error_t je;
    json_t *root = meta ? json_loads(meta, 0, &je) : NULL;
    const char *d = json_string_value(json_object_get(json_object_get(root, "weights"), "dtype"));
    if (d && strcmp(d, "checkpoint") == 0)
        d = json_string_value(json_object_get(json_object_get(root, "model"), "checkpoint_dtype"));
    const char *q = json_string_value(json_object_get(json_object_get(json_object_get(root, "build"), "quant"),
                                                      "weights"));
    char buf[96];
    snprintf(buf, sizeof buf, "%s%s%s", d ? d : "unknown", q && strcmp(q, "none") ? "+" : "",
             q && strcmp(q, "none") ? q : "");
    char *out = strdup(buf);
    json_decref(root);
    return out;
}

/* The command line. */
typedef struct bench_args {
    long long batch, requests, in_len, out_len, warmup, reps, threads, max_ctx, max_step;
    const char *device, *path, *measure;
    const char *gpus;  /* --gpus, checked (kiln_cli_gpus_arg); NULL = the default */
    double tp_timeout; /* --tp-timeout, seconds; 0 = the runtime's */
    bool profile;
    double ceil_tbps, ceil_tflops; /* --ceilings; 0 = the device's known ones */
    const kiln_engine_src *builtin; /* the engine of a packaged executable, else NULL */
    int64_t kv_bytes;
    double kv_fraction;
    bool json;
} bench_args;

/* Parse argv into *a; KILN_EXIT_OK to go on, else the exit code (help printed, or a usage error). */
static int parse_args(int argc, char **argv, const kiln_engine_src *builtin, bench_args *a, bool *done) {
    enum { O_BATCH = 256, O_REQ, O_IN, O_OUT, O_DEV, O_WARM, O_REPS, O_THR, O_CTX, O_STEP, O_KV, O_JSON, O_MEASURE, O_PROFILE, O_CEIL,
           O_GPUS, O_TPTIME };
    static const struct option longopts[] = {
        {"batch", required_argument, 0, O_BATCH},   {"requests", required_argument, 0, O_REQ},
        {"input-len", required_argument, 0, O_IN},  {"output-len", required_argument, 0, O_OUT},
        {"device", required_argument, 0, O_DEV},    {"warmup", required_argument, 0, O_WARM},
        {"reps", required_argument, 0, O_REPS},     {"threads", required_argument, 0, O_THR},
        {"max-context", required_argument, 0, O_CTX}, {"max-step-tokens", required_argument, 0, O_STEP},
        {"kv-memory", required_argument, 0, O_KV},  {"json", no_argument, 0, O_JSON},
        {"measure", required_argument, 0, O_MEASURE}, {"profile", no_argument, 0, O_PROFILE},
        {"ceilings", required_argument, 0, O_CEIL},   {"help", no_argument, 0, 'h'},
        {"gpus", required_argument, 0, O_GPUS},       {"tp-timeout", required_argument, 0, O_TPTIME},
        {0, 0, 0, 0}};
    *a = (bench_args){.batch = 1, .in_len = 128, .out_len = 128, .warmup = 1, .reps = 3, .device = "auto",
                     .builtin = builtin};
    *done = false;
    int c, rc;
    optind = 1;
    opterr = 0;
    while ((c = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
        switch (c) {
        case O_BATCH:
            if (!kiln_cli_parse_int(optarg, 1, 1024, &a->batch))
                return kiln_cli_usage_error("bench", "--batch '%s' is not a number in 1..1024", optarg);
            break;
        case O_REQ:
            if (!kiln_cli_parse_int(optarg, 1, MAX_REQUESTS, &a->requests))
                return kiln_cli_usage_error("bench", "--requests '%s' is not a number in 1..%d", optarg, MAX_REQUESTS);
            break;
        case O_IN:
            if (!kiln_cli_parse_int(optarg, 1, 1 << 24, &a->in_len))
                return kiln_cli_usage_error("bench", "--input-len '%s' is not a positive number", optarg);
            break;
        case O_OUT:
            if (!kiln_cli_parse_int(optarg, 1, 1 << 24, &a->out_len))
                return kiln_cli_usage_error("bench", "--output-len '%s' is not a positive number", optarg);
            break;
        case O_DEV:
            if (strcmp(optarg, "cpu") != 0 && strcmp(optarg, "gpu") != 0 && strcmp(optarg, "auto") != 0)
                return kiln_cli_usage_error("bench", "unknown device '%s' (cpu, gpu, auto)", optarg);
            a->device = optarg;
            break;
        case O_WARM:
            if (!kiln_cli_parse_int(optarg, 0, 1000, &a->warmup))
                return kiln_cli_usage_error("bench", "--warmup '%s' is not a number in 0..1000", optarg);
            break;
        case O_REPS:
            if (!kiln_cli_parse_int(optarg, 1, 1000, &a->reps))
                return kiln_cli_usage_error("bench", "--reps '%s' is not a number in 1..1000", optarg);
            break;
        case O_THR:
            if (!kiln_cli_parse_int(optarg, 1, 1024, &a->threads))
                return kiln_cli_usage_error("bench", "--threads '%s' is not a number in 1..1024", optarg);
            break;
        case O_CTX:
            if (!kiln_cli_parse_int(optarg, 1, 1 << 24, &a->max_ctx))
                return kiln_cli_usage_error("bench", "--max-context '%s' is not a positive number", optarg);
            break;
        case O_STEP:
            if (!kiln_cli_parse_int(optarg, 1, 1 << 24, &a->max_step))
                return kiln_cli_usage_error("bench", "--max-step-tokens '%s' is not a positive number", optarg);
            break;
        case O_KV:
            if (!kiln_cli_parse_memory(optarg, &a->kv_bytes, &a->kv_fraction))
                return kiln_cli_usage_error("bench", "--kv-memory '%s' is neither bytes (e.g. 4G) nor a fraction in "
                                                     "(0, 1]",
                                            optarg);
            break;
        case O_JSON: a->json = true; break;
        case O_MEASURE: a->measure = optarg; break;
        case O_GPUS:
            if ((rc = kiln_cli_gpus_arg("bench", optarg)) != KILN_EXIT_OK) return rc;
            a->gpus = optarg;
            break;
        case O_TPTIME:
            if ((rc = kiln_cli_tp_timeout_arg("bench", optarg, &a->tp_timeout)) != KILN_EXIT_OK) return rc;
            break;
        case O_PROFILE: a->profile = true; break;
        case O_CEIL: {
            char *end = NULL;
            a->ceil_tbps = strtod(optarg, &end);
            if (end && *end == ',') a->ceil_tflops = strtod(end + 1, &end);
            if (!end || *end || !(a->ceil_tbps > 0 && a->ceil_tbps < 1000) || !(a->ceil_tflops > 0 && a->ceil_tflops < 1e5))
                return kiln_cli_usage_error("bench", "--ceilings '%s' is not BW,TF (TB/s and TFLOP/s, e.g. 4.2,785)",
                                            optarg);
            break;
        }
        case 'h':
            help(stdout);
            *done = true;
            return KILN_EXIT_OK;
        default: return kiln_cli_usage_error("bench", "unknown or incomplete option '%s'", argv[optind - 1]);
        }
    }
    if (optind != argc - !builtin)
        return kiln_cli_usage_error("bench", builtin ? "takes no engine file: the engine is built in"
                                                     : "expected one engine file");
    if (a->max_step && a->max_step < a->batch)
        return kiln_cli_usage_error("bench", "--max-step-tokens %lld is below --batch %lld (each running sequence "
                                             "decodes one token a step)",
                                    a->max_step, a->batch);
    if (a->kv_fraction > 0 && strcmp(a->device, "cpu") == 0)
        return kiln_cli_usage_error("bench", "--kv-memory %g is a fraction of GPU memory, which does not apply to "
                                             "--device cpu; give bytes (e.g. 512M)", a->kv_fraction);
    if ((a->profile || a->ceil_tbps > 0) && strcmp(a->device, "cpu") == 0)
        return kiln_cli_usage_error("bench", "--profile and --ceilings time the GPU program; they do not apply to "
                                             "--device cpu");
    if (a->ceil_tbps > 0 && !a->profile) return kiln_cli_usage_error("bench", "--ceilings goes with --profile");
    if (!a->requests) a->requests = a->batch;
    a->path = builtin ? kiln_engine_src_label(builtin) : argv[optind];
    return KILN_EXIT_OK;
}

/* ---- --profile ---- */

#define PROFILE_ROWS 4096

typedef struct prof_group {
    char what[96];
    int decode, count, fp8; /* fp8: some row ran W8A8 (kiln_profile_row.fp8) */
    int64_t steps;
    double ms, bytes, flops;
} prof_group;

/* The executor's rows grouped by (step kind, what) — a model's 32 layers make one row per op kind and
 * shape — and printed or emitted: per step, share of the GPU time of that step kind, traffic and work,
 * achieved rates and the fraction of the ceiling the op's arithmetic intensity makes it bound by. */
static void emit_profile(kiln_ctx_t *ctx, const report *rp, const bench_args *a, const char *gpu) {
    kiln_profile_row *rows = calloc(PROFILE_ROWS, sizeof *rows);
    prof_group *g = calloc(PROFILE_ROWS, sizeof *g);
    if (!rows || !g) {
        free(rows);
        free(g);
        return;
    }
    int n = kiln_ctx_profile_rows(ctx, rows, PROFILE_ROWS), ng = 0;
    if (n > PROFILE_ROWS) n = PROFILE_ROWS;
    for (int i = 0; i < n; i++) {
        int j = 0;
        while (j < ng && !(g[j].decode == rows[i].decode && strcmp(g[j].what, rows[i].what) == 0)) j++;
        if (j == ng) {
            snprintf(g[ng].what, sizeof g[ng].what, "%s", rows[i].what);
            g[ng].decode = rows[i].decode;
            g[ng].steps = rows[i].steps;
            ng++;
        }
        g[j].count++;
        g[j].ms += rows[i].ms;
        g[j].bytes += rows[i].bytes;
        g[j].flops += rows[i].flops;
        g[j].fp8 |= rows[i].fp8;
    }
    double tbps = a->ceil_tbps, tflops = a->ceil_tflops;
    if (!(tbps > 0) && strstr(gpu, "H200")) tbps = 4.2, tflops = 785; /* ../shared/BENCHMARKS.md's ceilings */
    for (int d = 1; d >= 0; d--) {
        double total = 0;
        int64_t steps = 0;
        for (int j = 0; j < ng; j++)
            if (g[j].decode == d) total += g[j].ms, steps = g[j].steps;
        if (steps == 0 || !(total > 0)) continue;
        if (!rp->json)
            printf("\nprofile, %s steps (%lld profiled, warm-up excluded; GPU time %.3f ms a step%s):\n"
                   "  %-34s %5s %10s %6s %10s %10s %9s %9s %s\n",
                   d ? "decode" : "prefill", (long long)steps, total / (double)steps,
                   tbps > 0 ? "" : "; no ceilings known for this GPU: --ceilings", "op", "count", "ms/step", "share",
                   "MB/step", "GFLOP/step", "GB/s", "TFLOP/s", tbps > 0 ? "of ceiling" : "");
        for (int j = 0; j < ng; j++) {
            if (g[j].decode != d) continue;
            const double ms = g[j].ms / (double)steps, sec = g[j].ms / 1e3;
            const double gbps = sec > 0 ? g[j].bytes / sec / 1e9 : 0, tf = sec > 0 ? g[j].flops / sec / 1e12 : 0;
            const double peak = g[j].fp8 ? 2 * tflops : tflops; /* FP8 tensor cores: twice bf16's rate */
            const bool compute = tbps > 0 && g[j].bytes > 0 && g[j].flops / g[j].bytes > peak / tbps;
            const double frac = !(tbps > 0) ? NAN : compute ? tf / peak : gbps / (tbps * 1e3);
            if (rp->json) {
                json_t *o = json_pack("{s:s, s:s, s:s, s:i, s:f, s:f, s:f, s:f, s:f, s:f, s:s, s:o, s:s, s:s}", "metric",
                                      "profile", "step", d ? "decode" : "prefill", "op", g[j].what, "count", g[j].count,
                                      "ms_per_step", ms, "share", g[j].ms / total, "bytes_per_step",
                                      g[j].bytes / (double)steps, "flops_per_step", g[j].flops / (double)steps, "gbps",
                                      gbps, "tflops", tf, "bound", compute ? "compute" : "memory",
                                      "fraction_of_ceiling", isnan(frac) ? json_null() : json_real(frac), "gpu", gpu,
                                      "commit", rp->commit);
                char *txt = o ? json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(6)) : NULL;
                if (txt) printf("%s\n", txt);
                free(txt);
                json_decref(o);
            } else {
                char fr[32] = "";
                if (!isnan(frac)) snprintf(fr, sizeof fr, "%5.1f%% %s", 100 * frac, compute ? "compute" : "memory");
                printf("  %-34.34s %5d %10.4f %5.1f%% %10.2f %10.2f %9.0f %9.1f %s\n", g[j].what, g[j].count, ms,
                       100 * g[j].ms / total, g[j].bytes / (double)steps / 1e6, g[j].flops / (double)steps / 1e9,
                       gbps, tf, fr);
            }
        }
    }
    free(rows);
    free(g);
}

/* The "gpus" of --json: each rank's CUDA device, as --gpus gave them (kiln_ctx_new checked the list
 * against the engine's ranks) or rank r on device r; "none" on the CPU. */
static void rank_devices(const bench_args *a, const kiln_t *k, bool on_gpu, char *buf, size_t cap) {
    if (!on_gpu) {
        snprintf(buf, cap, "none");
        return;
    }
    if (a->gpus && *a->gpus) {
        snprintf(buf, cap, "%s", a->gpus);
        return;
    }
    const kiln_model *m = kiln_api_model(k);
    size_t used = 0;
    buf[0] = 0;
    for (uint32_t r = 0; m && r < m->plan->n_ranks && used < cap; r++)
        used += (size_t)snprintf(buf + used, cap - used, r ? ",%u" : "%u", r);
}

/* Open the engine and a context for the arguments. */
static kiln_status open_ctx(const bench_args *a, kiln_t **k, kiln_ctx_t **ctx, kiln_error *err) {
    kiln_engine_src src = a->builtin ? *a->builtin : (kiln_engine_src){.path = a->path};
    kiln_status st = kiln_open_src(&src, (int32_t)a->threads, k);
    if (st != KILN_OK) return kiln_err(err, st, "%s", kiln_error_message(*k));
    long long model_ctx = kiln_max_context(*k), ctx_len = a->max_ctx ? a->max_ctx : model_ctx;
    if (a->in_len + a->out_len - 1 > ctx_len) {
        kiln_err(err, KILN_ERR_CONTEXT, "input %lld + output %lld tokens do not fit the %lld-token context", a->in_len,
                 a->out_len, ctx_len);
        return kiln_err_hint(err, "lower --input-len or --output-len%s", a->max_ctx ? ", or raise --max-context" : "");
    }
    kiln_ctx_options o;
    kiln_ctx_options_init(&o);
    o.device = a->device;
    o.max_batch = (int32_t)a->batch;
    o.max_context = (int32_t)(a->max_ctx ? a->max_ctx : (a->in_len + a->out_len < model_ctx ? a->in_len + a->out_len
                                                                                            : model_ctx));
    o.max_step_tokens = (int32_t)a->max_step; /* 0: the context's default budget */
    o.threads = (int32_t)a->threads;
    o.kv_bytes = a->kv_bytes;
    if (a->kv_fraction > 0) o.kv_fraction = a->kv_fraction;
    /* --profile adds the profile knob to the others */
    char knobs[300];
    snprintf(knobs, sizeof knobs, "%s%s%s", a->measure ? a->measure : "", a->measure && *a->measure && a->profile ? "," : "",
             a->profile ? "profile=1" : "");
    o.measure = knobs[0] ? knobs : NULL;
    o.gpus = a->gpus;
    o.tp_timeout_s = a->tp_timeout;
    if ((st = kiln_ctx_new(*k, &o, ctx)) != KILN_OK) return kiln_err(err, st, "%s", kiln_last_error(*ctx));
    return KILN_OK;
}

int kiln_cmd_bench(int argc, char **argv) { return kiln_cmd_bench_builtin(argc, argv, NULL); }

int kiln_cmd_bench_builtin(int argc, char **argv, const kiln_engine_src *builtin) {
    bench_args a;
    bool done;
    int rc = parse_args(argc, argv, builtin, &a, &done);
    if (rc != KILN_EXIT_OK || done) return rc;
    kiln_error err = {0};
    rc = KILN_EXIT_FAIL;
    kiln_t *k = NULL;
    kiln_ctx_t *ctx = NULL;
    char *name = model_name(a.path), *dtype = NULL;
    double t0 = kiln_now();
    kiln_status st = open_ctx(&a, &k, &ctx, &err);
    if (st != KILN_OK) goto fail;
    double load_ms = (kiln_now() - t0) * 1e3;
    kiln_ctx_info info = {.struct_size = sizeof info};
    if ((st = kiln_ctx_info_get(ctx, &info)) != KILN_OK) {
        kiln_err(&err, st, "%s", kiln_last_error(ctx));
        goto fail;
    }
    dtype = weights_dtype(kiln_meta_json(k));
    bool on_gpu = strcmp(info.device, "gpu") == 0;
    char gpus[KILN_MAX_RANKS * 5 + 1]; /* up to 64 ordinals of 0..1023 and their commas */
    rank_devices(&a, k, on_gpu, gpus, sizeof gpus);
    report rp = {.json = a.json, .model = name, .dtype = dtype, .device = info.device,
                 .gpu = on_gpu ? info.device_name : "none", .gpus = gpus, .commit = commit_id(),
                 .input_len = (int)a.in_len, .output_len = (int)a.out_len};
    if (!a.json)
        printf("kiln bench %s: %s weights on %s (%s), batch %lld, %lld requests, input %lld, output %lld, "
               "%d tokens a step, median of %lld\n",
               name, dtype, info.device, rp.gpu, a.batch, a.requests, a.in_len, a.out_len, info.max_step_tokens,
               a.reps);

    int32_t vocab = kiln_vocab_size(k), bos = kiln_bos_id(k);
    bench_shape one = {1, 1, (int)a.in_len, (int)a.out_len, (int)a.warmup, (int)a.reps};
    bench_shape many = {(int)a.batch, (int)a.requests, (int)a.in_len, (int)a.out_len, (int)a.warmup, (int)a.reps};
    run_result r1 = {{0}}, rb = {{0}};
    emit(&rp, many.batch, many.requests, "load_ms", load_ms, "ms");
    if ((a.batch > 1 || a.requests > 1) && !a.profile) { /* a profile covers one shape */
        if ((st = measure(ctx, vocab, bos, &one, &r1, &err)) != KILN_OK) goto fail;
        emit(&rp, 1, 1, "prefill_ms", r1.v[RM_PREFILL], "ms");
        emit(&rp, 1, 1, "ttft_ms", r1.v[RM_TTFT], "ms");
    }
    if ((st = measure(ctx, vocab, bos, &many, &rb, &err)) != KILN_OK) goto fail;
    emit_run(&rp, &many, &rb);
    if ((st = kiln_ctx_info_get(ctx, &info)) != KILN_OK) {
        kiln_err(&err, st, "%s", kiln_last_error(ctx));
        goto fail;
    }
    emit_context(&rp, &many, &info, on_gpu);
    if (a.profile) emit_profile(ctx, &rp, &a, rp.gpu);
    rc = KILN_EXIT_OK;
    goto out;
fail:
    rc = kiln_cli_fail("bench", &err, a.json);
out:
    kiln_ctx_free(ctx);
    kiln_close(k);
    free(name);
    free(dtype);
    return rc;
}
