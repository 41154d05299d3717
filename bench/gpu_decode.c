/*
 * gpu_decode.c — the CUDA executor measured directly (no scheduler, no
 * public API): load, prefill, time to first token and decode steps on one
 * engine. Built as kiln_gpu_decode where CUDA is.
 *
 *   kiln_gpu_decode ENGINE [--batches 1,8,64] [--prompt 512] [--steps 64]
 *                          [--prefill 2048] [--ttft 128] [--reps 5] [--no-graph-compare]
 *
 * Protocol (../shared/BENCHMARKS.md): random prompt ids from a fixed seed,
 * one warm-up, medians of --reps; every step is synchronous (the executor
 * returns after the sampled ids are on the host), so a wall clock around
 * steps is the device time plus the step's host work. Prints one JSON
 * line per measurement, then a summary table on stderr.
 *   load_open_ms      engine open: mmap, checksums, plan (no f32 copy)
 *   load_exec_ms      executor: driver, modules, weight upload, buffers, KV pool
 *   load_ms           the two: engine file to first-token-ready
 *   prefill_ms        one step of --prefill prompt tokens, batch 1
 *   ttft_ms           one step of --ttft prompt tokens, batch 1 (the first token)
 *   decode_ms_per_step, decode_tokens_per_s   at each batch after --prompt tokens each,
 *                     with CUDA graphs (and without, for batches <= 8)
 * Each line says "lt_tune": false when --lt-tune 1 kept cuBLASLt's
 * heuristic algorithms for the decode GEMMs of batches above 8 (the first
 * step of a batch, the graph capture, pays the tuning; medians skip it), and
 * "fused": whether the engine's plan has the decode RoPE fusion (compare
 * engines compiled with different --passes for the fusions' worth).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/cuda/kiln_cuda_exec.h"
#include "runtime/kiln_rt.h"

static uint64_t g_rng = 0x6b696c6e;
static int32_t rnd_tok(int v) {
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return (int32_t)(3 + g_rng % (uint64_t)(v - 3));
}

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}
static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_d);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static const char *g_model = "?", *g_gpu = "?", *g_commit = "unknown";
static bool g_pdl = true, g_fused = true;
static int g_lt_tune = 1; /* 0 = cuBLASLt's heuristic algorithm at decode (--lt-tune 1) */
static void emit(const char *metric, double value, const char *unit, int batch, int in_len, int out_len, bool graphs) {
    printf("{\"model\": \"%s\", \"dtype\": \"bf16\", \"batch\": %d, \"input_len\": %d, \"output_len\": %d, "
           "\"metric\": \"%s\", \"value\": %.4f, \"unit\": \"%s\", \"graphs\": %s, \"pdl\": %s, \"fused\": %s, "
           "\"lt_tune\": %s, \"device\": \"gpu\", \"gpu\": \"%s\", \"commit\": \"%s\", \"impl\": \"kiln-exec\"}\n",
           g_model, batch, in_len, out_len, metric, value, unit, graphs ? "true" : "false", g_pdl ? "true" : "false",
           g_fused ? "true" : "false", g_lt_tune ? "true" : "false", g_gpu, g_commit);
    fflush(stdout);
}

typedef struct seqs {
    int n;
    int32_t *slot, *n_new, *start, *next, *toks;
    bool *want;
    kiln_sampling *samp;
} seqs;

static kiln_status run_step(kiln_executor *x, seqs *s, kiln_error *err) {
    kiln_step st = {s->n, s->slot, s->n_new, s->start, s->toks, s->want, s->samp, s->next, NULL, NULL, NULL};
    return x->ops->step(x, &st, err);
}

/* Prefill `n` sequences of `len` tokens in steps of at most `step_tokens`. */
static kiln_status prefill(kiln_executor *x, int n, int len, int step_tokens, kiln_error *err) {
    seqs s = {0};
    s.slot = calloc((size_t)n, 4), s.n_new = calloc((size_t)n, 4), s.start = calloc((size_t)n, 4);
    s.next = calloc((size_t)n, 4), s.want = calloc((size_t)n, 1), s.samp = calloc((size_t)n, sizeof *s.samp);
    s.toks = malloc((size_t)step_tokens * 4);
    kiln_status st = KILN_OK;
    int pos[4096] = {0};
    for (int done = 0; done < n && st == KILN_OK;) {
        int k = 0, t = 0;
        for (int i = done; i < n && t < step_tokens; i++) {
            int take = len - pos[i] < step_tokens - t ? len - pos[i] : step_tokens - t;
            if (take <= 0) continue;
            s.slot[k] = i, s.start[k] = pos[i], s.n_new[k] = take, s.want[k] = pos[i] + take == len;
            for (int j = 0; j < take; j++) s.toks[t++] = rnd_tok(x->vocab);
            k++;
        }
        s.n = k;
        st = run_step(x, &s, err);
        for (int j = 0; j < k; j++) pos[s.slot[j]] += s.n_new[j];
        while (done < n && pos[done] == len) done++;
    }
    free(s.slot), free(s.n_new), free(s.start), free(s.next), free(s.want), free(s.samp), free(s.toks);
    return st;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s ENGINE [--batches 1,8,64] [--prompt 512] [--steps 64] [--prefill 2048] "
                        "[--ttft 128] [--reps 5] [--no-graph-compare] [--lt-tune 1|2|3] [--gemv-max-m N]\n", argv[0]);
        return 2;
    }
    const char *engine = argv[1];
    int batches[16] = {1, 8, 64}, nb = 3, prompt = 512, steps = 64, pf = 2048, ttft = 128, reps = 5;
    bool compare = true;
    int lt_tune = 0; /* kiln_cuda_exec_opts.lt_tune: 0 default, 1 heuristic, 2 timed, 3 timed + reported */
    int gemv_max_m = 0; /* kiln_cuda_exec_opts.gemv_max_m: 0 default */
    for (int i = 2; i < argc; i++) {
        if (!strcmp(argv[i], "--batches") && i + 1 < argc) {
            nb = 0;
            for (char *p = argv[++i]; *p && nb < 16;) {
                batches[nb++] = (int)strtol(p, &p, 10);
                if (*p == ',') p++;
            }
        } else if (!strcmp(argv[i], "--prompt") && i + 1 < argc) prompt = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--steps") && i + 1 < argc) steps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--prefill") && i + 1 < argc) pf = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--ttft") && i + 1 < argc) ttft = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc) reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--no-graph-compare")) compare = false;
        else if (!strcmp(argv[i], "--lt-tune") && i + 1 < argc) lt_tune = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--gemv-max-m") && i + 1 < argc) gemv_max_m = atoi(argv[++i]);
        else {
            fprintf(stderr, "unknown option %s\n", argv[i]);
            return 2;
        }
    }
    if (getenv("KILN_COMMIT")) g_commit = getenv("KILN_COMMIT");
    g_lt_tune = lt_tune != 1;
    g_model = engine;
    int max_b = 1;
    for (int i = 0; i < nb; i++) max_b = batches[i] > max_b ? batches[i] : max_b;
    kiln_error err = {0};
    double t0 = kiln_now();
    kiln_model *m = NULL;
    if (kiln_model_open_ex(engine, 16, KILN_MODEL_NO_F32, &m, &err)) {
        fprintf(stderr, "open: %s\n", err.msg);
        return 1;
    }
    double t1 = kiln_now();
    int ctx = prompt + steps + 8;
    if (pf + 8 > ctx) ctx = pf + 8;
    if (ttft + 8 > ctx) ctx = ttft + 8;
    if (ctx > m->plan->max_context) ctx = m->plan->max_context;
    int step_tokens = pf > 4096 ? pf : 4096;
    kiln_cuda_exec_opts o = {.max_seqs = max_b, .max_context = ctx, .max_step_tokens = step_tokens, .lt_tune = lt_tune,
                             .gemv_max_m = gemv_max_m};
    g_fused = false;
    for (uint32_t i = 0; i < m->plan->n_ops; i++) g_fused |= (m->plan->ops[i].attrs.flags & KILN_FLAG_DECODE_ROPE) != 0;
    kiln_executor *x = NULL;
    if (kiln_cuda_executor_new(m, &o, &x, &err)) {
        fprintf(stderr, "executor: %s\n", err.msg);
        return 1;
    }
    double t2 = kiln_now();
    kiln_cuda_exec_stats cs;
    kiln_cuda_exec_get_stats(x, &cs);
    kiln_executor_info info = {0};
    x->ops->info(x, &info);
    g_gpu = strdup(info.device_name);
    emit("load_open_ms", (t1 - t0) * 1e3, "ms", 1, 0, 0, true);
    emit("load_exec_ms", (t2 - t1) * 1e3, "ms", 1, 0, 0, true);
    emit("load_ms", (t2 - t0) * 1e3, "ms", 1, 0, 0, true);
    emit("load_upload_ms", cs.upload_seconds * 1e3, "ms", 1, 0, 0, true);
    emit("load_upload_gbps", cs.upload_gbps, "GB/s", 1, 0, 0, true);
    emit("load_init_ms", cs.init_seconds * 1e3, "ms", 1, 0, 0, true);
    fprintf(stderr, "load: open %.0f ms, executor %.0f ms (init+modules %.0f ms, upload %.0f ms at %.1f GB/s of %.2f GB), "
                    "KV %lld blocks of %lld, %s\n",
            (t1 - t0) * 1e3, (t2 - t1) * 1e3, cs.init_seconds * 1e3, cs.upload_seconds * 1e3, cs.upload_gbps,
            (double)cs.weight_bytes / 1e9, (long long)cs.kv_blocks, (long long)cs.block_size, info.device_name);

    double *v = malloc(sizeof(double) * (size_t)(reps + 1));
    bool fits;
    /* prefill and TTFT at batch 1 */
    for (int which = 0; which < 2; which++) {
        int len = which ? ttft : pf;
        if (len <= 0 || len >= ctx) continue;
        for (int r = 0; r <= reps; r++) {
            if (x->ops->reserve(x, 0, len + 1, &fits, &err) || !fits) {
                fprintf(stderr, "reserve: %s\n", fits ? err.msg : "no room");
                return 1;
            }
            double a = kiln_now();
            if (prefill(x, 1, len, step_tokens, &err)) {
                fprintf(stderr, "prefill %d: %s\n", len, err.msg);
                return 1;
            }
            double b = kiln_now();
            x->ops->release(x, 0);
            if (r) v[r - 1] = (b - a) * 1e3;
        }
        double med = median(v, reps);
        emit(which ? "ttft_ms" : "prefill_ms", med, "ms", 1, len, 1, false);
        fprintf(stderr, "%s %d tokens: %.2f ms\n", which ? "ttft" : "prefill", len, med);
    }
    /* decode at each batch, graphs on (and off for small batches) */
    for (int bi = 0; bi < nb; bi++) {
        int B = batches[bi];
        if (B < 1 || B > max_b) continue; /* --batches takes positive counts (and max_b is their largest) */
        /* modes: 0 graphs + PDL, 1 no graphs (PDL), 2 graphs without PDL (batches above 8: mode 0 only) */
        for (int g = 0; g < (compare && B <= 8 ? 3 : 1); g++) {
            kiln_executor *y = x;
            kiln_cuda_exec_set_graphs(x, g != 1);
            g_pdl = kiln_cuda_exec_set_pdl(x, g != 2) && g != 2;
            for (int i = 0; i < B; i++)
                if (y->ops->reserve(y, i, prompt + steps + 2, &fits, &err) || !fits) {
                    fprintf(stderr, "reserve batch %d: %s\n", B, fits ? err.msg : "no room");
                    return 1;
                }
            if (prefill(y, B, prompt, step_tokens, &err)) {
                fprintf(stderr, "prefill batch %d: %s\n", B, err.msg);
                return 1;
            }
            seqs s = {0};
            s.n = B;
            s.slot = calloc((size_t)B, 4), s.n_new = calloc((size_t)B, 4), s.start = calloc((size_t)B, 4);
            s.next = calloc((size_t)B, 4), s.want = calloc((size_t)B, 1), s.samp = calloc((size_t)B, sizeof *s.samp);
            s.toks = calloc((size_t)B, 4);
            for (int i = 0; i < B; i++) s.slot[i] = i, s.n_new[i] = 1, s.start[i] = prompt, s.want[i] = true, s.toks[i] = rnd_tok(y->vocab);
            double *dt = malloc(sizeof(double) * (size_t)steps);
            for (int k = 0; k < steps; k++) {
                double a = kiln_now();
                if (run_step(y, &s, &err)) {
                    fprintf(stderr, "decode batch %d: %s\n", B, err.msg);
                    return 1;
                }
                dt[k] = (kiln_now() - a) * 1e3;
                for (int i = 0; i < B; i++) s.start[i]++, s.toks[i] = s.next[i];
            }
            double med = median(dt + 2, steps - 2); /* the first steps capture the graph */
            emit("decode_ms_per_step", med, "ms", B, prompt, steps, g != 1);
            emit("decode_tokens_per_s", B * 1e3 / med, "tok/s", B, prompt, steps, g != 1);
            fprintf(stderr, "decode batch %d%s: %.3f ms/step, %.0f tok/s\n", B,
                    g == 1 ? " (no graphs)" : g == 2 ? " (graphs, no PDL)" : " (graphs + PDL)",
                    med, B * 1e3 / med);
            for (int i = 0; i < B; i++) y->ops->release(y, i);
            free(dt);
            free(s.slot), free(s.n_new), free(s.start), free(s.next), free(s.want), free(s.samp), free(s.toks);
        }
    }
    kiln_cuda_exec_set_graphs(x, true);
    g_pdl = kiln_cuda_exec_set_pdl(x, true);
    x->ops->info(x, &info);
    emit("peak_device_gb", (double)info.device_peak_bytes / 1e9, "GB", 1, 0, 0, true);
    x->ops->destroy(x);
    kiln_model_close(m);
    free(v);
    return 0;
}
