/*
 * cmd_tune.c — `kiln tune ENGINE`: measure, on this GPU, the cuBLASLt
 * algorithm of every GEMM shape the engine's decode graphs (the batches of
 * --batch) and prefill steps (the sizes of --prefill) run, and record the
 * choices, the GEMV token limits it measures (measure_limit in
 * runtime/cuda/exec.c) and the executor's other thresholds in the engine's tuning section
 * (format/kiln_tuning.h), replacing the record of this GPU's SM and name if
 * there is one. Every later load on this GPU type then runs the same
 * algorithms (as long as the cuBLASLt version matches) instead of asking
 * the heuristic again, which may change its answer with a library update.
 *
 * The engine file is changed in place (kiln_engine_put_section): the new
 * section and table go after its end, then the header is rewritten; any
 * failure leaves it byte-identical. --dry-run measures and reports only.
 *
 * Exit codes as every command (cli.h); --json prints one object.
 */
#include "cli.h"

#include <getopt.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../format/kiln_tuning.h"
#include "../runtime/kiln_rt.h"
#ifdef KILN_HAVE_CUDA
#include "../runtime/cuda/kiln_cuda_exec.h"
#include "../runtime/kiln_cuda.h"
#endif

#define TUNE_MAX_LIST 32

static void help(FILE *f) {
    fprintf(f, "usage: %s ", kiln_cli_prog);
    fprintf(f,
            "tune ENGINE.kiln [options]\n\n"
            "Measure this GPU's fastest cuBLASLt algorithm for every GEMM shape the engine's decode\n"
            "and prefill steps run and the GEMV token limits (below which the GEMV beats cuBLASLt),\n"
            "and record them with the executor's other thresholds in the engine, for this GPU's SM:\n"
            "later loads on this GPU type run the same kernels every time.\n"
            "The engine file is changed in place; a failure leaves it unchanged.\n\n"
            "options:\n"
            "  --batch LIST           decode batch sizes to tune, e.g. 1,8,64 (default\n"
            "                         1,2,4,8,16,32,64: the decode graphs' buckets)\n"
            "  --prefill LIST         prefill step sizes in tokens (default 64,128,...,8192; steps of\n"
            "                         other sizes use the entry of the next power of two)\n"
            "  --device N             CUDA device ordinal (default 0)\n"
            "  --gemv-max-m N         record this bf16 GEMV token limit (1..64) instead of measuring\n"
            "                         it (default: measured: the largest decode bucket, up to 64 and to\n"
            "                         --batch's largest, to which the GEMV ran no slower than cuBLASLt)\n"
            "  --qgemv-max-m N        the same for the weight-only quantized GEMV (W8A8 matrices keep 32)\n"
            "  --rope-split-max-t N   record this RoPE split limit (1..65536; default 64)\n"
            "  --attn-waves W         record this decode-attention waves target ((0,64]; default 2)\n"
            "  --decode-tc-min N      record this many sequences as where decode attention takes the\n"
            "                         tensor-core kernel (engines with an FP8 KV cache; 1..65536;\n"
            "                         default 80, measured on the H200: not measured by kiln tune)\n"
            "  --search               time variants of cuBLASLt's fastest heuristic answers too\n"
            "                         (other tiles, split-K; where a GEMM's tiles fill less than a\n"
            "                         wave of the GPU): slower to tune, measured no faster on the H200\n"
            "  --log                  each candidate's time on stderr\n"
            "  --dry-run              measure and report; do not change the engine\n"
            "  --json                 one JSON object on stdout\n"
            "  -h, --help             this text\n\n"
            "Needs a GPU. `kiln inspect` lists the records; `kiln bench` says whether one was used\n"
            "(`--measure recorded=0` runs without it, for comparison).\n");
}

/* "1,8,64" → ascending unique values in lo..hi. */
static bool parse_list(const char *s, long long lo, long long hi, int *v, int *n) {
    *n = 0;
    char buf[512];
    if (strlen(s) >= sizeof buf) return false;
    snprintf(buf, sizeof buf, "%s", s);
    char *save = NULL;
    for (char *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        long long x;
        if (!kiln_cli_parse_int(t, lo, hi, &x) || *n == TUNE_MAX_LIST) return false;
        int i = *n;
        while (i > 0 && v[i - 1] > x) i--;
        if (i > 0 && v[i - 1] == x) continue;
        memmove(v + i + 1, v + i, (size_t)(*n - i) * sizeof *v);
        v[i] = (int)x;
        (*n)++;
    }
    return *n > 0;
}

typedef struct tune_args {
    const char *path;
    int batch[TUNE_MAX_LIST], n_batch, prefill[TUNE_MAX_LIST], n_prefill;
    long long device, gemv_max_m, qgemv_max_m, rope_split_max_t, decode_tc_min;
    double attn_waves;
    bool log, dry_run, json, search;
} tune_args;

/* No options: the decode graphs' buckets and the prefill sizes up to 8192, GPU 0, built-in thresholds. */
static void tune_defaults(tune_args *a) {
    memset(a, 0, sizeof *a);
    static const int def_batch[] = {1, 2, 4, 8, 16, 32, 64};
    for (int i = 0; i < 7; i++) a->batch[a->n_batch++] = def_batch[i];
    for (int r = 64; r <= 8192; r *= 2) a->prefill[a->n_prefill++] = r;
}

static int parse_args(int argc, char **argv, tune_args *a, bool *done) {
    enum { O_BATCH = 256, O_PREFILL, O_DEV, O_GEMV, O_QGEMV, O_ROPE, O_WAVES, O_LOG, O_DRY, O_JSON, O_SEARCH, O_TCMIN };
    static const struct option longopts[] = {
        {"batch", required_argument, 0, O_BATCH},         {"prefill", required_argument, 0, O_PREFILL},
        {"device", required_argument, 0, O_DEV},          {"gemv-max-m", required_argument, 0, O_GEMV},
        {"qgemv-max-m", required_argument, 0, O_QGEMV},   {"rope-split-max-t", required_argument, 0, O_ROPE},
        {"attn-waves", required_argument, 0, O_WAVES},    {"log", no_argument, 0, O_LOG},
        {"dry-run", no_argument, 0, O_DRY},               {"json", no_argument, 0, O_JSON},
        {"search", no_argument, 0, O_SEARCH},           {"help", no_argument, 0, 'h'},
        {"decode-tc-min", required_argument, 0, O_TCMIN},
        {0, 0, 0, 0}};
    tune_defaults(a);
    *done = false;
    optind = 1;
    opterr = 0;
    int c;
    while ((c = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
        switch (c) {
        case O_BATCH:
            if (!parse_list(optarg, 1, 1024, a->batch, &a->n_batch))
                return kiln_cli_usage_error("tune", "--batch '%s' is not a list of up to %d numbers in 1..1024", optarg,
                                            TUNE_MAX_LIST);
            break;
        case O_PREFILL:
            if (!parse_list(optarg, 1, 1 << 20, a->prefill, &a->n_prefill))
                return kiln_cli_usage_error("tune", "--prefill '%s' is not a list of up to %d numbers in 1..1048576",
                                            optarg, TUNE_MAX_LIST);
            break;
        case O_DEV:
            if (!kiln_cli_parse_int(optarg, 0, 1023, &a->device))
                return kiln_cli_usage_error("tune", "--device '%s' is not a number in 0..1023", optarg);
            break;
        case O_GEMV:
        case O_QGEMV:
            if (!kiln_cli_parse_int(optarg, 1, 64, c == O_GEMV ? &a->gemv_max_m : &a->qgemv_max_m))
                return kiln_cli_usage_error("tune", "%s '%s' is not a number in 1..64",
                                            c == O_GEMV ? "--gemv-max-m" : "--qgemv-max-m", optarg);
            break;
        case O_ROPE:
            if (!kiln_cli_parse_int(optarg, 1, 65536, &a->rope_split_max_t))
                return kiln_cli_usage_error("tune", "--rope-split-max-t '%s' is not a number in 1..65536", optarg);
            break;
        case O_WAVES:
            if (!kiln_cli_parse_float(optarg, 1e-3, 64, &a->attn_waves))
                return kiln_cli_usage_error("tune", "--attn-waves '%s' is not a number in (0, 64]", optarg);
            break;
        case O_TCMIN:
            if (!kiln_cli_parse_int(optarg, 1, 65536, &a->decode_tc_min))
                return kiln_cli_usage_error("tune", "--decode-tc-min '%s' is not a number in 1..65536", optarg);
            break;
        case O_LOG: a->log = true; break;
        case O_DRY: a->dry_run = true; break;
        case O_SEARCH: a->search = true; break;
        case O_JSON: a->json = true; break;
        case 'h':
            help(stdout);
            *done = true;
            return KILN_EXIT_OK;
        default: return kiln_cli_usage_error("tune", "unknown or incomplete option '%s'", argv[optind - 1]);
        }
    }
    if (optind != argc - 1) return kiln_cli_usage_error("tune", "expected one engine file");
    a->path = argv[optind];
    return KILN_EXIT_OK;
}

#ifdef KILN_HAVE_CUDA

/* The report as one JSON object. */
static json_t *report_json(const tune_args *a, kiln_executor *x, const kiln_tuning_record *r, uint64_t size0,
                           uint64_t size1) {
    json_t *shapes = json_array();
    for (uint32_t i = 0; i < r->n_gemms; i++) {
        const kiln_tuning_gemm *g = &r->gemms[i];
        char algo[256];
        kiln_cuda_exec_algo_str(x, g->algo, algo, sizeof algo);
        json_array_append_new(
            shapes, json_pack("{s:i, s:i, s:i, s:s, s:s, s:b, s:b, s:f, s:o, s:i, s:i, s:s}", "m", (int)g->m, "n",
                              (int)g->n, "k", (int)g->k, "in", kiln_tuning_in_type(g->flags), "out",
                              kiln_tuning_out_type(g->flags), "accumulate", (g->flags & KILN_TUNING_ACCUMULATE) != 0,
                              "fast_accum", (g->flags & KILN_TUNING_FP8_FAST) != 0,
                              "us", (double)g->us, "heuristic_us",
                              g->heuristic_us > 0 ? json_real(g->heuristic_us) : json_null(), "candidates",
                              (int)g->candidates, "pick", (int)g->pick, "algo", algo));
    }
    char sm[16];
    snprintf(sm, sizeof sm, "sm_%u", r->sm);
    json_t *o = json_pack("{s:s, s:s, s:s, s:I, s:i, s:o, s:{s:i, s:i, s:i, s:f, s:i}, s:f, s:b, s:I, s:I}", "engine",
                          a->path, "sm", sm, "device", r->device, "cublaslt_version", (json_int_t)r->lt_version,
                          "driver_version", r->driver_version, "shapes", shapes, "thresholds", "gemv_max_m",
                          (int)r->gemv_max_m, "qgemv_max_m", (int)r->qgemv_max_m, "rope_split_max_t",
                          (int)r->rope_split_max_t, "attn_waves", (double)r->attn_waves, "decode_tc_min",
                          (int)r->decode_tc_min, "seconds",
                          (double)r->seconds, "written", !a->dry_run, "bytes_before", (json_int_t)size0,
                          "bytes_after", (json_int_t)size1);
    return o;
}

/* The report: text, one JSON object on stdout (--json), or that object into *json_out (compile --tune). */
static void report(const tune_args *a, kiln_executor *x, const kiln_tuning_record *r, uint64_t size0, uint64_t size1,
                   json_t **json_out) {
    if (a->json || json_out) {
        json_t *o = report_json(a, x, r, size0, size1);
        if (json_out) {
            *json_out = o;
            return;
        }
        char *s = o ? json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(6)) : NULL;
        if (s) printf("%s\n", s);
        free(s);
        json_decref(o);
        return;
    }
    printf("kiln tune %s: %s (sm_%u), cuBLASLt %llu, driver %d: %u shapes in %.2f s\n", a->path, r->device, r->sm,
           (unsigned long long)r->lt_version, r->driver_version, r->n_gemms, (double)r->seconds);
    printf("  %6s %6s %6s %-22s %10s %10s %7s  %s\n", "M", "N", "K", "types", "us", "heur. us", "gain", "algorithm");
    for (uint32_t i = 0; i < r->n_gemms; i++) {
        const kiln_tuning_gemm *g = &r->gemms[i];
        char algo[256], types[32], gain[16] = "";
        kiln_cuda_exec_algo_str(x, g->algo, algo, sizeof algo);
        snprintf(types, sizeof types, "%s->%s%s%s", kiln_tuning_in_type(g->flags), kiln_tuning_out_type(g->flags),
                 g->flags & KILN_TUNING_ACCUMULATE ? " accumulate" : "",
                 g->flags & KILN_TUNING_FP8_FAST ? " fast" : "");
        if (g->heuristic_us > 0) snprintf(gain, sizeof gain, "%+.1f%%", 100.0 * (g->us - g->heuristic_us) / g->heuristic_us);
        printf("  %6u %6u %6u %-22s %10.2f %10.2f %7s  #%u of %u: %s\n", g->m, g->n, g->k, types, (double)g->us,
               (double)g->heuristic_us, gain, g->pick, g->candidates, algo);
    }
    printf("  thresholds: gemv_max_m %u, qgemv_max_m %u, rope_split_max_t %u, attn_waves %g, decode_tc_min %u\n",
           r->gemv_max_m, r->qgemv_max_m, r->rope_split_max_t, (double)r->attn_waves, r->decode_tc_min);
    if (a->dry_run)
        printf("  --dry-run: %s not changed\n", a->path);
    else
        printf("  recorded for sm_%u in %s (%llu -> %llu bytes)\n", r->sm, a->path, (unsigned long long)size0,
               (unsigned long long)size1);
}

/* Measure on the GPU: the record for this GPU, into *rec. */
static kiln_status measure(const tune_args *a, kiln_model *m, kiln_executor **xo, kiln_tuning_record *rec,
                           kiln_error *err) {
    int max_b = a->batch[a->n_batch - 1], max_rows = a->prefill[a->n_prefill - 1];
    if (max_rows < max_b) max_rows = max_b;
    kiln_cuda_exec_opts o = {.max_seqs = max_b,
                             .max_context = 0,
                             .max_step_tokens = max_rows,
                             .kv_bytes = 256ll << 20, /* tuning runs GEMMs only: a small KV pool */
                             .device = (int)a->device,
                             .no_recorded = true, /* measure every shape, whatever the engine has */
                             .gemv_max_m = (int)a->gemv_max_m,
                             .qgemv_max_m = (int)a->qgemv_max_m,
                             .rope_split_max_t = (int)a->rope_split_max_t,
                             .attn_waves = a->attn_waves,
                             .decode_tc_min = (int)a->decode_tc_min,
                             .lt_search = a->search};
    if (m->plan->max_context < 1) return kiln_err(err, KILN_ERR_FORMAT, "%s: the plan has no context", a->path);
    kiln_status st = kiln_cuda_executor_new(m, &o, xo, err);
    if (st) return st;
    return kiln_cuda_exec_tune(*xo, a->batch, a->n_batch, a->prefill, a->n_prefill, a->log ? stderr : NULL, rec, err);
}

/* Measure, record and report (report's json_out); on failure the error is in *err, the engine unchanged. */
static kiln_status tune_run(const tune_args *a, json_t **json_out, kiln_error *err) {
    kiln_model *m = NULL;
    kiln_executor *x = NULL;
    kiln_tuning t = {0}, check = {0};
    kiln_tuning_record rec = {0};
    kiln_buf bytes = {0};
    uint64_t size0 = 0, size1 = 0;
    bool present = false;
    kiln_status st = kiln_model_open_ex(a->path, 0, KILN_MODEL_NO_F32, &m, err);
    if (st) goto out;
    if ((st = kiln_tuning_load(&m->engine, &t, &present, err))) goto out; /* a corrupt one is not replaced silently */
    if ((st = measure(a, m, &x, &rec, err))) goto out;
    if (rec.n_gemms == 0) {
        kiln_err(err, KILN_ERR_UNSUPPORTED, "%s: no GEMM of these steps runs through cuBLASLt on this GPU (the GEMV "
                 "takes them all): nothing to record", a->path);
        kiln_err_hint(err, "give larger --batch or --prefill sizes");
        st = KILN_ERR_UNSUPPORTED;
        goto out;
    }
    size0 = size1 = m->engine.size;
    if (!a->dry_run) {
        /* the executor keeps the mapping: the append only adds bytes past the end and rewrites the
         * header, which nothing reads after the open */
        kiln_tuning_record copy = rec;
        copy.gemms = malloc((size_t)rec.n_gemms * sizeof *rec.gemms);
        if (!copy.gemms) {
            st = kiln_err(err, KILN_ERR_NOMEM, "tune: out of memory");
            goto out;
        }
        memcpy(copy.gemms, rec.gemms, (size_t)rec.n_gemms * sizeof *rec.gemms);
        if ((st = kiln_tuning_put(&t, &copy, err))) {
            free(copy.gemms);
            goto out;
        }
        if ((st = kiln_tuning_write(&t, &bytes, err))) goto out;
        if ((st = kiln_engine_put_section(a->path, KILN_SECTION_TUNING, bytes.data, bytes.len, &size0, &size1, err)))
            goto out;
        /* read back as a runtime will */
        kiln_engine e;
        if ((st = kiln_engine_open(a->path, &e, err))) goto out;
        st = kiln_tuning_load(&e, &check, &present, err);
        kiln_engine_close(&e);
        if (st) goto out;
    }
    report(a, x, &rec, size0, size1, json_out);
out: /* st: KILN_OK, or the error in *err */
    if (x) x->ops->destroy(x);
    kiln_model_close(m);
    kiln_tuning_free(&t);
    kiln_tuning_free(&check);
    free(rec.gemms);
    kiln_buf_free(&bytes);
    return st;
}

kiln_status kiln_cli_tune_probe(kiln_error *err) {
    kiln_cuda cu;
    kiln_status st = kiln_cuda_init(&cu, 0, err);
    if (st) return st;
    kiln_cuda_free(&cu);
    return KILN_OK;
}
#else
static kiln_status tune_run(const tune_args *a, struct json_t **json_out, kiln_error *err) {
    (void)a, (void)json_out;
    return kiln_cli_tune_probe(err);
}

kiln_status kiln_cli_tune_probe(kiln_error *err) {
    kiln_err(err, KILN_ERR_UNSUPPORTED, "this kiln was built without CUDA: tuning measures on a GPU");
    return kiln_err_hint(err, "build kiln with the CUDA toolkit and run `kiln tune` on the GPU host");
}
#endif

int kiln_cmd_tune(int argc, char **argv) {
    tune_args a;
    bool done;
    int rc = parse_args(argc, argv, &a, &done);
    if (rc != KILN_EXIT_OK || done) return rc;
    kiln_error err = {0};
    return tune_run(&a, NULL, &err) == KILN_OK ? KILN_EXIT_OK : kiln_cli_fail("tune", &err, a.json);
}

kiln_status kiln_cli_tune_engine(const char *path, struct json_t **json_out, kiln_error *err) {
    tune_args a;
    tune_defaults(&a);
    a.path = path;
    return tune_run(&a, json_out, err);
}
