/*
 * gpu_bench.c — the kernel lab's timings (built as kiln_gpu_bench when CUDA
 * is found). Measures, on the device it runs on:
 *   - the copy ceiling: device-to-device copy of 1 GiB (bytes read + written);
 *   - decode GEMV y[M,N] = x[M,K]·W[N,K]^T for Mistral-7B's shapes at M = 1
 *     and 8, every GEMV variant in the table below, and cuBLASLt on the same
 *     shapes: bytes = N*K*2 + M*K*2 + M*N*2, achieved GB/s, fraction of
 *     4.2 TB/s;
 *   - decode attention over a paged cache (Mistral heads) and prefill
 *     attention (512, 2048 and 4096 tokens; FLOP/s).
 * Protocol (BENCHMARKS.md / METHOD.md): random bf16 inputs (never zeros),
 * weights rotated among enough copies that together they are >= 8x the L2,
 * so each launch reads HBM; CUDA events around ITERS back-to-back launches,
 * after warm-up; the median of REPS such timings. One JSON line per
 * measurement on stdout; a table on stderr at the end.
 *   - with --quant, only the quantized GEMV (q8, q4g128) over the same shapes, in its variants;
 *   - with --qgemm, steps of 16 to 512 rows over quantized matrices: the GEMV, the quantized GEMM
 *     (qgemm.cuh) and dequantizing for cuBLASLt.
 * Usage: kiln_gpu_bench [--quick | --prefill | --decode-attn | --decode-attn-kv | --quant | --qgemm]   (--prefill:
 *        prefill attention only; --decode-attn: decode attention only; --decode-attn-kv: decode attention
 *        over FP8 and bf16 caches, the CUDA-core and the tensor-core kernels; --quant: the quantized GEMV only)
 */
#include "codegen/kiln_nvrtc.h"
#include "kernels/params.cuh"
#include "runtime/kiln_cuda.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CEIL_BPS 4.2e12
#define REPS 7

typedef struct bench {
    kiln_cuda cu;
    kiln_cublaslt *lt;
    CUevent e0, e1;
    const char *commit;
    int iters;
    char table[32768];
    size_t tlen;
} bench;

static void die(const char *what, const kiln_error *err) {
    fprintf(stderr, "kiln_gpu_bench: %s: %s\n", what, err->msg);
    exit(1);
}

static uint64_t g_rng = 88172645463325252ull;
static float rnd_normal(void) {
    double u[2];
    for (int i = 0; i < 2; i++) {
        g_rng ^= g_rng << 13; g_rng ^= g_rng >> 7; g_rng ^= g_rng << 17;
        u[i] = ((g_rng >> 11) + 1) * (1.0 / 9007199254740993.0);
    }
    return (float)(sqrt(-2.0 * log(u[0])) * cos(6.283185307179586 * u[1]));
}

/* A pool of random N(0,1) bf16 made once; device buffers are filled from it
 * (scaled when sigma != 1) so that big weights cost no host RNG time. */
#define POOL_N ((size_t)1 << 24)
static uint16_t *g_pool;

/* A device buffer of n random bf16 values of standard deviation sigma. */
static CUdeviceptr rand_dev(bench *b, size_t n, float sigma) {
    if (!g_pool) {
        g_pool = malloc(POOL_N * 2);
        for (size_t i = 0; i < POOL_N; i++) g_pool[i] = kiln_f32_to_bf16(rnd_normal());
    }
    size_t chunk = n < POOL_N ? n : POOL_N;
    uint16_t *h = malloc(chunk * 2);
    size_t start = (size_t)(g_rng % POOL_N);
    for (size_t i = 0; i < chunk; i++)
        h[i] = sigma == 1.0f ? g_pool[(start + i) % POOL_N]
                             : kiln_f32_to_bf16(kiln_bf16_to_f32(g_pool[(start + i) % POOL_N]) * sigma);
    g_rng ^= g_rng << 13; g_rng ^= g_rng >> 7; g_rng ^= g_rng << 17;
    CUdeviceptr d;
    kiln_error err = {0};
    if (kiln_cuda_alloc(&b->cu, n * 2, &d, &err)) die("alloc", &err);
    for (size_t off = 0; off < n; off += chunk) {
        size_t m = n - off < chunk ? n - off : chunk;
        if (kiln_cuda_upload(&b->cu, d + off * 2, h, m * 2, &err)) die("upload", &err);
    }
    free(h);
    return d;
}

static int cmp_f(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

/* One launch of "something" for iteration i (rotating inputs inside). */
typedef kiln_status (*launch_fn)(bench *b, void *ctx, int i, kiln_error *err);

/* Median seconds per launch. */
static double time_launches(bench *b, launch_fn fn, void *ctx, int iters) {
    kiln_error err = {0};
    for (int i = 0; i < 3; i++)
        if (fn(b, ctx, i, &err)) die("warm-up launch", &err);
    if (kiln_cuda_sync(&b->cu, &err)) die("warm-up", &err);
    float ms[REPS];
    for (int r = 0; r < REPS; r++) {
        if (KILN_CU_CALL(&b->cu, &err, b->cu.api.cuEventRecord(b->e0, NULL))) die("event", &err);
        for (int i = 0; i < iters; i++)
            if (fn(b, ctx, i, &err)) die("launch", &err);
        if (KILN_CU_CALL(&b->cu, &err, b->cu.api.cuEventRecord(b->e1, NULL)) ||
            KILN_CU_CALL(&b->cu, &err, b->cu.api.cuEventSynchronize(b->e1)) ||
            KILN_CU_CALL(&b->cu, &err, b->cu.api.cuEventElapsedTime(&ms[r], b->e0, b->e1)))
            die("timing", &err);
    }
    qsort(ms, REPS, sizeof ms[0], cmp_f);
    return ms[REPS / 2] * 1e-3 / iters;
}

static void report(bench *b, const char *kernel, const char *variant, int M, int N, int K, double sec, double bytes,
                   double flops) {
    double gbs = bytes / sec / 1e9;
    printf("{\"bench\":\"kernel\",\"kernel\":\"%s\",\"variant\":\"%s\",\"M\":%d,\"N\":%d,\"K\":%d,\"us\":%.2f,"
           "\"bytes\":%.0f,\"GBps\":%.1f,\"frac_4p2TBps\":%.3f,\"TFLOPs\":%.2f,\"gpu\":\"%s\",\"commit\":\"%s\"}\n",
           kernel, variant, M, N, K, sec * 1e6, bytes, gbs, bytes / sec / CEIL_BPS, flops / sec / 1e12, b->cu.name,
           b->commit);
    fflush(stdout);
    if (b->tlen < sizeof b->table - 200)
        b->tlen += (size_t)snprintf(b->table + b->tlen, sizeof b->table - b->tlen,
                                    "%-18s %-22s %5d %6d %6d %9.2f %8.0f %6.1f%%\n", kernel, variant, M, N, K, sec * 1e6,
                                    gbs, 100.0 * bytes / sec / CEIL_BPS);
}

/* ---- copy ceiling ---- */

typedef struct copy_ctx {
    CUdeviceptr a, b;
    size_t n;
} copy_ctx;
static kiln_status copy_launch(bench *b, void *vctx, int i, kiln_error *err) {
    copy_ctx *c = vctx;
    return KILN_CU_CALL(&b->cu, err, b->cu.api.cuMemcpyDtoDAsync(i % 2 ? c->a : c->b, i % 2 ? c->b : c->a, c->n, NULL));
}

/* ---- GEMV ---- */

typedef struct gemv_ctx {
    CUfunction fn;
    kiln_cuda_dims d;
    int M, N, K, ncopies, lt;
    CUdeviceptr w[64], x, y;
} gemv_ctx;

static kiln_status gemv_launch(bench *b, void *vctx, int i, kiln_error *err) {
    gemv_ctx *g = vctx;
    CUdeviceptr w = g->w[i % g->ncopies];
    if (g->lt) return kiln_cublaslt_gemm_bf16(b->lt, g->M, g->N, g->K, g->x, w, g->y, false, NULL, err);
    kiln_gemv_params p = {g->x, w, g->y, 0, g->M, g->N, g->K, g->K, g->N, 0, 0, 0.0f, 0, 0, 0, 0, 0, 0, 0};
    void *args[] = {&p};
    return kiln_cuda_launch(&b->cu, g->fn, &g->d, NULL, args, "kiln_gemv", err);
}

static CUfunction build(bench *b, const char *file, const char *entry, const char *const *defs, int n, CUmodule *mod) {
    char src[96];
    snprintf(src, sizeof src, "#include \"%s\"\n", file);
    kiln_buf cubin = {0};
    kiln_error err = {0};
    CUfunction f = NULL;
    if (kiln_nvrtc_compile(src, entry, defs, n, b->cu.sm, false, &cubin, NULL, &err)) die(file, &err);
    kiln_cuda_image im = {b->cu.sm, false, cubin.data, cubin.len};
    if (kiln_cuda_module_load(&b->cu, &im, 1, file, mod, NULL, &err) ||
        kiln_cuda_module_function(&b->cu, *mod, entry, &f, &err))
        die(file, &err);
    kiln_buf_free(&cubin);
    return f;
}

static void bench_gemv(bench *b, bool quick) {
    static const int shapes[][3] = {
        {1, 14336, 4096}, {1, 4096, 4096}, {1, 4096, 14336}, {1, 6144, 4096}, {1, 28672, 4096},
        {8, 14336, 4096}, {8, 4096, 4096}, {8, 4096, 14336},
    };
    /* warps, rows, unroll, mt */
    static const kiln_gemv_cfg v1[] = {{4, 2, 4, 1, 0}, {4, 4, 2, 1, 0}, {8, 1, 4, 1, 0}, {8, 4, 2, 1, 0},
                                       {8, 0, 2, 0, 1}, {8, 0, 1, 0, 1}, {16, 0, 1, 0, 1}};
    static const kiln_gemv_cfg v8[] = {{4, 4, 1, 8, 0}, {8, 0, 2, 0, 1}, {8, 0, 1, 0, 1}, {16, 0, 1, 0, 1},
                                       {16, 0, 2, 0, 1}, {4, 0, 1, 0, 1}, {12, 0, 1, 0, 1}};
    CUmodule mods[32] = {0};
    CUfunction fn1[16], fn8[16];
    int n1 = quick ? 2 : (int)(sizeof v1 / sizeof v1[0]), n8 = quick ? 2 : (int)(sizeof v8 / sizeof v8[0]);
    for (int set = 0; set < 2; set++) {
        const kiln_gemv_cfg *v = set ? v8 : v1;
        int n = set ? n8 : n1;
        for (int i = 0; i < n; i++) {
            char d[5][32];
            snprintf(d[0], 32, "GEMV_WARPS=%d", v[i].warps);
            snprintf(d[1], 32, "GEMV_ROWS=%d", v[i].rows);
            snprintf(d[2], 32, "GEMV_UNROLL=%d", v[i].unroll);
            snprintf(d[3], 32, "GEMV_MT=%d", v[i].mt);
            snprintf(d[4], 32, "GEMV_MMA=%d", v[i].mma);
            const char *defs[] = {d[0], d[1], d[2], d[3], d[4]};
            (set ? fn8 : fn1)[i] = build(b, "gemv.cuh", "kiln_gemv", defs, 5, &mods[set * 16 + i]);
        }
    }
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        gemv_ctx g = {0};
        g.M = shapes[s][0], g.N = shapes[s][1], g.K = shapes[s][2];
        size_t wbytes = (size_t)g.N * g.K * 2;
        g.ncopies = (int)((8.0 * b->cu.l2_bytes + wbytes - 1) / wbytes);
        if (g.ncopies < 2) g.ncopies = 2;
        if (g.ncopies > 64) g.ncopies = 64;
        for (int c = 0; c < g.ncopies; c++) g.w[c] = rand_dev(b, (size_t)g.N * g.K, 0.02f);
        g.x = rand_dev(b, (size_t)g.M * g.K, 1.0f);
        g.y = rand_dev(b, (size_t)g.M * g.N, 1.0f);
        double bytes = (double)wbytes + 2.0 * g.M * g.K + 2.0 * g.M * g.N, flops = 2.0 * g.M * g.N * g.K;
        const kiln_gemv_cfg *v = g.M == 1 ? v1 : v8;
        int n = g.M == 1 ? n1 : n8;
        double best = 1e9;
        char best_name[64] = "";
        for (int i = 0; i < n; i++) {
            g.fn = (g.M == 1 ? fn1 : fn8)[i];
            g.d = kiln_gemv_dims(&v[i], g.M, g.N);
            double sec = time_launches(b, gemv_launch, &g, b->iters);
            char name[64];
            if (v[i].mma) snprintf(name, sizeof name, "kiln mma w%d u%d", v[i].warps, v[i].unroll);
            else snprintf(name, sizeof name, "kiln w%d r%d u%d mt%d", v[i].warps, v[i].rows, v[i].unroll, v[i].mt);
            report(b, "gemv", name, g.M, g.N, g.K, sec, bytes, flops);
            if (sec < best) { best = sec; snprintf(best_name, sizeof best_name, "%s", name); }
        }
        g.lt = 1;
        double lt_sec = time_launches(b, gemv_launch, &g, b->iters);
        report(b, "gemv", "cublasLt", g.M, g.N, g.K, lt_sec, bytes, flops);
        fprintf(stderr, "gemv %dx%d @ %dx%d: best %s %.2f us (%.0f GB/s, %.1f%% of 4.2 TB/s); cuBLASLt %.2f us (%.0f GB/s): %.2fx\n",
                g.M, g.K, g.N, g.K, best_name, best * 1e6, bytes / best / 1e9, 100 * bytes / best / CEIL_BPS,
                lt_sec * 1e6, bytes / lt_sec / 1e9, lt_sec / best);
        for (int c = 0; c < g.ncopies; c++) kiln_cuda_release(&b->cu, g.w[c]);
        kiln_cuda_release(&b->cu, g.x);
        kiln_cuda_release(&b->cu, g.y);
    }
    for (int i = 0; i < 32; i++) kiln_cuda_module_unload(&b->cu, mods[i]);
}

/* ---- quantized GEMV (--quant) ---- */

/* The quantized GEMV (gemv.cuh, GEMV_QUANT) over Mistral-7B's decode shapes at M = 1 and 8, every
 * variant below: bytes = the quantized weight's (codes, scales, minimums) + x + y, achieved GB/s,
 * fraction of 4.2 TB/s. "none" (GEMV_QDEQ=2) skips the dequantization arithmetic (wrong results):
 * the gap to it is what the arithmetic costs. Codes are random bytes; scales small. */
static void bench_gemv_quant(bench *b) {
    static const int shapes[][3] = {{1, 6144, 4096}, {1, 4096, 4096}, {1, 28672, 4096}, {1, 4096, 14336},
                                    {1, 32000, 4096}, {8, 28672, 4096}, {8, 4096, 14336}};
    /* tensor cores (rows 0): warps (K split), steps in flight, q4's arithmetic, 16-row tiles a warp;
     * CUDA cores (q8/fp8, rows > 0): warps, steps in flight, rows a warp; fp8: 1 with the hardware's
     * E4M3 conversion, 2 through bf16 (GEMV_FP8_CVT 0); q4 on CUDA cores (rows > 0): warps splitting
     * K, rows loaded together, rows a block, 32-column chunks a thread (cpl), the codes' widening
     * (cvt: GEMV_Q4CVT) and blocks an SM the registers must allow (minb, 0: the kernel's default); q8
     * and fp8 with cpl > 0: the K-splitting kernel (GEMV_CK 1, codegen's fp8 one) */
    static const struct {
        int bits, group, warps, unroll, deq, tiles, rows, fp8, cpl, cvt, minb;
    } v[] = {{4, 128, 8, 2, 0, 1, 0, 0, 0, 0, 0},  {4, 128, 16, 1, 0, 1, 0, 0, 0, 0, 0}, {4, 128, 8, 2, 2, 1, 0, 0, 0, 0, 0},
             {4, 32, 8, 2, 1, 1, 0, 0, 0, 0, 0},   {8, 0, 8, 4, 0, 1, 0, 0, 0, 0, 0},    {8, 0, 16, 2, 0, 1, 0, 0, 0, 0, 0},
             {8, 0, 4, 2, 0, 1, 2, 0, 0, 0, 0},    {8, 0, 8, 2, 0, 1, 2, 0, 0, 0, 0},    {8, 0, 16, 2, 0, 1, 1, 0, 0, 0, 0},
             {8, 0, 8, 4, 0, 1, 0, 1, 0, 0, 0},    {8, 0, 4, 2, 0, 1, 2, 1, 0, 0, 0},    {8, 0, 8, 2, 0, 1, 2, 1, 0, 0, 0},
             {8, 0, 4, 2, 0, 1, 2, 2, 0, 0, 0},    {8, 0, 8, 2, 0, 1, 2, 2, 0, 0, 0},
             {4, 128, 4, 8, 0, 1, 8, 0, 1, 1, 0},  {4, 128, 4, 4, 0, 1, 16, 0, 1, 1, 0},
             {4, 128, 4, 4, 0, 1, 32, 0, 1, 1, 0}, {4, 128, 4, 8, 0, 1, 16, 0, 1, 1, 0},
             {4, 128, 4, 4, 0, 1, 16, 0, 1, 0, 0}, {4, 128, 4, 2, 0, 1, 16, 0, 1, 1, 0},
             {4, 128, 4, 4, 0, 1, 8, 0, 1, 1, 0},  {4, 128, 2, 4, 0, 1, 16, 0, 2, 1, 0},
             {4, 128, 14, 4, 0, 1, 16, 0, 1, 1, 1}, {4, 128, 16, 4, 0, 1, 16, 0, 1, 1, 1},
             {4, 128, 14, 8, 0, 1, 16, 0, 1, 1, 1}, {4, 128, 8, 4, 0, 1, 16, 0, 2, 1, 1},
             {4, 128, 7, 4, 0, 1, 16, 0, 2, 1, 1},
             {8, 0, 4, 4, 0, 1, 8, 0, 2, 0, 4},    {8, 0, 4, 4, 0, 1, 8, 0, 1, 0, 4},
             {8, 0, 4, 4, 0, 1, 8, 1, 2, 0, 4},    {8, 0, 4, 4, 0, 1, 8, 1, 1, 0, 4}};
    enum { NV = sizeof v / sizeof v[0] };
    CUmodule mods[NV] = {0};
    CUfunction fn[NV];
    for (int i = 0; i < NV; i++) {
        char d[14][32];
        snprintf(d[0], 32, "GEMV_WARPS=%d", v[i].warps);
        snprintf(d[1], 32, "GEMV_UNROLL=%d", v[i].unroll);
        snprintf(d[2], 32, "GEMV_MMA=%d", v[i].rows == 0);
        snprintf(d[3], 32, "GEMV_QUANT=%d", v[i].bits);
        snprintf(d[4], 32, "GEMV_GROUP=%d", v[i].group);
        snprintf(d[5], 32, "GEMV_QDEQ=%d", v[i].deq);
        snprintf(d[6], 32, "GEMV_QT=%d", v[i].tiles);
        snprintf(d[7], 32, "GEMV_ROWS=%d", v[i].rows ? v[i].rows : 2);
        snprintf(d[8], 32, v[i].fp8 ? "GEMV_FP8=1" : "GEMV_FP8=0");
        snprintf(d[9], 32, "GEMV_CPL=%d", v[i].cpl > 0 ? v[i].cpl : 1);
        snprintf(d[10], 32, "GEMV_Q4CVT=%d", v[i].cvt);
        int nd = 11; /* and, where the variant asks, the fp8 route and the blocks an SM */
        if (v[i].fp8 == 2) snprintf(d[nd++], 32, "GEMV_FP8_CVT=0");
        if (v[i].minb) snprintf(d[nd++], 32, "GEMV_MINB=%d", v[i].minb);
        if (v[i].bits == 8 && v[i].cpl > 0) snprintf(d[nd++], 32, "GEMV_CK=1");
        const char *defs[14];
        for (int j = 0; j < nd; j++) defs[j] = d[j];
        fn[i] = build(b, "gemv.cuh", "kiln_gemv", defs, nd, &mods[i]);
    }
    kiln_error err = {0};
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        const int M = shapes[si][0], N = shapes[si][1], K = shapes[si][2];
        static const int layouts[][2] = {{8, 0}, {4, 128}, {4, 32}};
        for (size_t li = 0; li < sizeof layouts / sizeof layouts[0]; li++) {
            const int bits = layouts[li][0], group = layouts[li][1];
            const size_t codes = (size_t)N * K * (size_t)bits / 8, codes16 = (codes + 15) / 16 * 16;
            const size_t nsc = group ? (size_t)N * (size_t)(K / group) : (size_t)N;
            const size_t wbytes = codes16 + nsc * 4 * (group ? 2 : 1);
            int ncopies = (int)((8.0 * b->cu.l2_bytes + (double)wbytes - 1) / (double)wbytes);
            if (ncopies < 2) ncopies = 2;
            if (ncopies > 64) ncopies = 64;
            CUdeviceptr w[64];
            for (int c = 0; c < ncopies; c++) {
                w[c] = rand_dev(b, (wbytes + 1) / 2, 1.0f); /* random bits for the codes */
                if (kiln_cuda_fill32(&b->cu, w[c] + codes16, 0x3a83126fu, nsc * 4 * (group ? 2 : 1), &err)) /* 0.001f */
                    die("fill", &err);
            }
            CUdeviceptr x = rand_dev(b, (size_t)M * K, 1.0f), y = rand_dev(b, (size_t)M * N, 1.0f);
            const double bytes = (double)wbytes + 2.0 * M * K + 2.0 * M * N, flops = 2.0 * M * N * K;
            for (int i = 0; i < NV; i++) {
                if (v[i].bits != bits || v[i].group != group) continue;
                const bool ck = v[i].rows && (bits == 4 || v[i].cpl > 0);
                const kiln_gemv_cfg cfg = v[i].rows ? (kiln_gemv_cfg){v[i].warps, v[i].rows, v[i].unroll, 1, ck ? 2 : 0}
                                                    : (kiln_gemv_cfg){v[i].warps, v[i].tiles, v[i].unroll, 8, 1};
                const kiln_cuda_dims d = kiln_gemv_dims(&cfg, M, N);
                float ms[REPS];
                for (int r = 0; r < REPS; r++) {
                    if (KILN_CU_CALL(&b->cu, &err, b->cu.api.cuEventRecord(b->e0, NULL))) die("event", &err);
                    for (int it = -3; it < b->iters; it++) {
                        if (it == 0 && KILN_CU_CALL(&b->cu, &err, b->cu.api.cuEventRecord(b->e0, NULL))) die("event", &err);
                        const CUdeviceptr wc = w[(it + 3) % ncopies];
                        kiln_gemv_params p = {x, wc, y, 0, M, N, K, K, N, 0, 0, 0.0f, 0, wc + codes16,
                                              group ? wc + codes16 + nsc * 4 : 0, 0, 0, 0, 0};
                        void *args[] = {&p};
                        if (kiln_cuda_launch(&b->cu, fn[i], &d, NULL, args, "kiln_gemv", &err)) die("launch", &err);
                    }
                    if (KILN_CU_CALL(&b->cu, &err, b->cu.api.cuEventRecord(b->e1, NULL)) ||
                        KILN_CU_CALL(&b->cu, &err, b->cu.api.cuEventSynchronize(b->e1)) ||
                        KILN_CU_CALL(&b->cu, &err, b->cu.api.cuEventElapsedTime(&ms[r], b->e0, b->e1)))
                        die("timing", &err);
                }
                qsort(ms, REPS, sizeof ms[0], cmp_f);
                char name[64];
                if (v[i].rows && bits == 4)
                    snprintf(name, sizeof name, "q4g%d cc w%d r%d u%d c%d cvt%d b%d", group, v[i].warps, v[i].rows,
                             v[i].unroll, v[i].cpl, v[i].cvt, v[i].minb);
                else if (v[i].rows)
                    snprintf(name, sizeof name, "%s %s w%d r%d u%d c%d", v[i].fp8 == 1 ? "fp8" : v[i].fp8 ? "fp8/bf16" : "q8",
                             ck ? "ck" : "cc", v[i].warps, v[i].rows, v[i].unroll, v[i].cpl);
                else if (v[i].fp8)
                    snprintf(name, sizeof name, "fp8 w%d u%d", v[i].warps, v[i].unroll);
                else
                    snprintf(name, sizeof name, "q%dg%d w%d u%d t%d %s", bits, group, v[i].warps, v[i].unroll,
                             v[i].tiles, bits == 8 ? "" : v[i].deq == 0 ? "exact" : v[i].deq == 1 ? "f32" : "none");
                report(b, "gemv_quant", name, M, N, K, ms[REPS / 2] * 1e-3 / b->iters, bytes, flops);
            }
            for (int c = 0; c < ncopies; c++) kiln_cuda_release(&b->cu, w[c]);
            kiln_cuda_release(&b->cu, x);
            kiln_cuda_release(&b->cu, y);
        }
    }
    for (int i = 0; i < NV; i++) kiln_cuda_module_unload(&b->cu, mods[i]);
}

/* ---- quantized GEMM (--qgemm) ---- */

/* Steps of 16 to 512 rows over Mistral-7B's quantized matrices (q4g128, q8), three ways: the quantized
 * GEMV (tensor cores, codegen's configuration; it reads the codes again for every 8 rows of x, mostly
 * from L2), the quantized GEMM (qgemm.cuh, 8 warps; 64 rows of x with a ring of 3 chunks, 32 with 4;
 * at 64 rows also its probes without the codes' widening or the mma) and the dequantized route
 * (kiln_dequant into a bf16 copy, then cuBLASLt). bytes = the quantized weight's; TFLOPs = 2MNK. */
typedef struct qg_ctx {
    int kind; /* 0 GEMV, 1 qgemm, 2 dequant + cuBLASLt */
    CUfunction fn, deq;
    kiln_cuda_dims d;
    int M, N, K, bits, group, splits, chunks, ncopies;
    size_t codes16, nsc;
    CUdeviceptr w[64], x, y, dense, ws, cnt;
} qg_ctx;

static kiln_status qg_launch(bench *b, void *vctx, int i, kiln_error *err) {
    qg_ctx *c = vctx;
    const CUdeviceptr w = c->w[i % c->ncopies], sc = w + c->codes16, mn = c->group ? sc + c->nsc * 4 : 0;
    kiln_gemv_params g = {c->x, w, c->y, 0, c->M, c->N, c->K, c->K, c->N, 0, 0, 0.0f, 0, sc, mn, 0, 0, 0, 0};
    if (c->kind == 0) {
        void *args[] = {&g};
        return kiln_cuda_launch(&b->cu, c->fn, &c->d, NULL, args, "kiln_gemv", err);
    }
    if (c->kind == 1) {
        kiln_qgemm_params q = {g, c->splits > 1 ? c->ws : 0, c->splits > 1 ? c->cnt : 0, c->splits, c->chunks};
        void *args[] = {&q};
        return kiln_cuda_launch(&b->cu, c->fn, &c->d, NULL, args, "kiln_qgemm", err);
    }
    kiln_dequant_params dp = {w, sc, mn, c->dense, c->N, c->K, c->bits, c->group, 0, 0};
    const kiln_cuda_dims dd = {{(unsigned)(((size_t)c->N * c->K / 8 + 255) / 256), 1, 1}, {256, 1, 1}, 0};
    void *args[] = {&dp};
    kiln_status st = kiln_cuda_launch(&b->cu, c->deq, &dd, NULL, args, "kiln_dequant", err);
    return st ? st : kiln_cublaslt_gemm_bf16(b->lt, c->M, c->N, c->K, c->x, c->dense, c->y, false, NULL, err);
}

static void bench_qgemm(bench *b) {
    static const int shapes[][2] = {{6144, 4096}, {4096, 4096}, {28672, 4096}, {4096, 14336}};
    static const int ms[] = {16, 32, 64, 128, 256, 512};
    static const int layouts[][2] = {{4, 128}, {8, 0}};
    kiln_error err = {0};
    CUmodule mdeq;
    const char *ddefs[] = {"DEQUANT_THREADS=256"};
    CUfunction deq = build(b, "dequant.cuh", "kiln_dequant", ddefs, 1, &mdeq);
    const kiln_qgemm_cfg big = {8, 64, 3, 4, 128};
    const size_t wsn = kiln_qgemm_ws_floats(&big, b->cu.n_sm), cn = kiln_qgemm_cnt(b->cu.n_sm);
    CUdeviceptr ws, cnt;
    if (kiln_cuda_alloc(&b->cu, wsn * 4, &ws, &err) || kiln_cuda_alloc(&b->cu, cn * 4, &cnt, &err) ||
        KILN_CU_CALL(&b->cu, &err, b->cu.api.cuMemsetD32(cnt, 0, cn)))
        die("qgemm workspace", &err);
    for (size_t li = 0; li < sizeof layouts / sizeof layouts[0]; li++) {
        const int bits = layouts[li][0], group = layouts[li][1];
        for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
            const int N = shapes[si][0], K = shapes[si][1];
            /* the GEMV as codegen configures it (codegen/kernels_section.c add_gemv_quant) */
            const int gw = bits == 4 ? (K >= 8192 ? 16 : 8) : (K >= 8192 || N <= 4096 ? 16 : 8);
            const int gt = bits == 4 && K >= 8192 ? 2 : 1;
            const int gu = bits == 4 ? (K >= 8192 ? 1 : 2) : (K >= 8192 || N <= 4096 ? 2 : 4);
            char d[10][32];
            snprintf(d[0], 32, "GEMV_WARPS=%d", gw);
            snprintf(d[1], 32, "GEMV_UNROLL=%d", gu);
            snprintf(d[2], 32, "GEMV_MMA=1");
            snprintf(d[3], 32, "GEMV_QUANT=%d", bits);
            snprintf(d[4], 32, "GEMV_GROUP=%d", group);
            snprintf(d[5], 32, "GEMV_QT=%d", gt);
            snprintf(d[6], 32, "GEMV_ROWS=2");
            snprintf(d[7], 32, "GEMV_MT=1");
            const char *gdefs[8] = {d[0], d[1], d[2], d[3], d[4], d[5], d[6], d[7]};
            /* 64 rows of x a block with 3 stages (codegen's), 32 with 4, and the probes of the first
             * (wrong results): no widening of the codes, no mma */
            static const int qv[][3] = {{64, 3, 0}, {32, 4, 0}, {64, 3, 1}, {64, 3, 2}};
            enum { NQ = sizeof qv / sizeof qv[0] };
            CUmodule mg, mq[NQ];
            qg_ctx c = {0};
            c.fn = build(b, "gemv.cuh", "kiln_gemv", gdefs, 8, &mg);
            CUfunction gemv = c.fn, qg[NQ];
            for (int v = 0; v < NQ; v++) {
                char q[6][32];
                snprintf(q[0], 32, "QG_BITS=%d", bits);
                snprintf(q[1], 32, "QG_GROUP=%d", group);
                snprintf(q[2], 32, "QG_WARPS=8");
                snprintf(q[3], 32, "QG_TM=%d", qv[v][0]);
                snprintf(q[4], 32, "QG_STAGES=%d", qv[v][1]);
                snprintf(q[5], 32, "QG_PROBE=%d", qv[v][2]);
                const char *qdefs[6] = {q[0], q[1], q[2], q[3], q[4], q[5]};
                qg[v] = build(b, "qgemm.cuh", "kiln_qgemm", qdefs, 6, &mq[v]);
            }
            c.M = 512, c.N = N, c.K = K, c.bits = bits, c.group = group, c.deq = deq, c.ws = ws, c.cnt = cnt;
            const size_t codes = (size_t)N * K * (size_t)bits / 8;
            c.codes16 = (codes + 15) / 16 * 16;
            c.nsc = group ? (size_t)N * (size_t)(K / group) : (size_t)N;
            const size_t wbytes = c.codes16 + c.nsc * 4 * (group ? 2 : 1);
            c.ncopies = (int)((8.0 * b->cu.l2_bytes + (double)wbytes - 1) / (double)wbytes);
            if (c.ncopies < 2) c.ncopies = 2;
            if (c.ncopies > 64) c.ncopies = 64;
            for (int i = 0; i < c.ncopies; i++) {
                c.w[i] = rand_dev(b, (wbytes + 1) / 2, 1.0f);
                if (kiln_cuda_fill32(&b->cu, c.w[i] + c.codes16, 0x3a83126fu, c.nsc * 4 * (group ? 2 : 1), &err))
                    die("fill", &err);
            }
            c.x = rand_dev(b, (size_t)512 * K, 1.0f);
            c.y = rand_dev(b, (size_t)512 * N, 1.0f);
            if (kiln_cuda_alloc(&b->cu, (size_t)N * K * 2, &c.dense, &err)) die("alloc", &err);
            for (size_t mi = 0; mi < sizeof ms / sizeof ms[0]; mi++) {
                c.M = ms[mi];
                const double flops = 2.0 * c.M * N * K;
                char name[48];
                for (int kind = 0; kind < NQ + 2; kind++) {
                    if (kind == 0 && c.M > 64) continue; /* the GEMV reads the codes again every 8 rows */
                    if (kind > 2 && kind <= NQ && c.M != 64) continue; /* the probes at 64 rows only */
                    c.kind = kind == 0 ? 0 : kind == NQ + 1 ? 2 : 1;
                    if (kind == 0) {
                        const kiln_gemv_cfg cfg = {gw, gt, gu, 8, 1};
                        c.fn = gemv, c.d = kiln_gemv_dims(&cfg, c.M, N);
                        snprintf(name, sizeof name, "q%d gemv w%d t%d", bits, gw, gt);
                    } else if (kind <= NQ) {
                        const int *v = qv[kind - 1];
                        const kiln_qgemm_cfg qc = {8, v[0], v[1], bits, group};
                        c.fn = qg[kind - 1];
                        c.splits = kiln_qgemm_splits(&qc, c.M, N, K, b->cu.n_sm, &c.chunks);
                        c.d = kiln_qgemm_dims(&qc, c.M, N, c.splits);
                        snprintf(name, sizeof name, "q%d qgemm m%d st%d s%d%s", bits, v[0], v[1], c.splits,
                                 v[2] == 1 ? " nodeq" : v[2] == 2 ? " nomma" : "");
                    } else {
                        snprintf(name, sizeof name, "q%d dequant+lt", bits);
                    }
                    report(b, "qgemm", name, c.M, N, K, time_launches(b, qg_launch, &c, b->iters), (double)wbytes, flops);
                }
            }
            for (int i = 0; i < c.ncopies; i++) kiln_cuda_release(&b->cu, c.w[i]);
            kiln_cuda_release(&b->cu, c.x); kiln_cuda_release(&b->cu, c.y); kiln_cuda_release(&b->cu, c.dense);
            kiln_cuda_module_unload(&b->cu, mg);
            for (int v = 0; v < NQ; v++) kiln_cuda_module_unload(&b->cu, mq[v]);
        }
    }
    kiln_cuda_release(&b->cu, ws);
    kiln_cuda_release(&b->cu, cnt);
    kiln_cuda_module_unload(&b->cu, mdeq);
}

/* ---- attention ---- */

typedef struct attn_ctx {
    CUfunction fn, comb;
    kiln_cuda_dims d, dc;
    void *params;
    int two;
} attn_ctx;

static kiln_status attn_launch(bench *b, void *vctx, int i, kiln_error *err) {
    attn_ctx *a = vctx;
    void *args[] = {a->params};
    kiln_status st = kiln_cuda_launch(&b->cu, a->fn, &a->d, NULL, args, "attn", err);
    if (!st && a->two) st = kiln_cuda_launch(&b->cu, a->comb, &a->dc, NULL, args, "attn_combine", err);
    return st;
}

/* The decode attention parameters over q, k, v, o (and kv_scale sc, 0 for a bf16 cache) for B sequences of
 * L tokens each, Mistral/Llama heads: scattered block tables, the lengths and the split partials on the
 * device, the split size the executor would pick; decode_inputs_free releases what it made. */
static kiln_attn_decode_params decode_inputs(bench *b, int B, int L, int NH, int NKV, int HD, int BS, int PART,
                                             CUdeviceptr q, CUdeviceptr k, CUdeviceptr v, CUdeviceptr o, CUdeviceptr sc) {
    const int nbpS = (L + BS - 1) / BS, nblocks = B * nbpS;
    int *bt = malloc(sizeof(int) * nblocks), *lens = malloc(sizeof(int) * B);
    for (int i = 0; i < nblocks; i++) bt[i] = (int)(((long long)i * 7919) % nblocks); /* scattered blocks */
    for (int i = 0; i < B; i++) lens[i] = L;
    const int part = kiln_attn_decode_partition(B, NKV, L, 0, b->cu.n_sm, PART);
    const int splits = kiln_attn_decode_splits(L, 0, part);
    CUdeviceptr dbt, dl, po, pml;
    kiln_error err = {0};
    if (kiln_cuda_alloc(&b->cu, sizeof(int) * nblocks, &dbt, &err) || kiln_cuda_upload(&b->cu, dbt, bt, sizeof(int) * nblocks, &err) ||
        kiln_cuda_alloc(&b->cu, sizeof(int) * B, &dl, &err) || kiln_cuda_upload(&b->cu, dl, lens, sizeof(int) * B, &err) ||
        kiln_cuda_alloc(&b->cu, (size_t)B * NH * splits * HD * 4, &po, &err) ||
        kiln_cuda_alloc(&b->cu, (size_t)B * NH * splits * 8, &pml, &err))
        die("attn alloc", &err);
    free(bt);
    free(lens);
    return (kiln_attn_decode_params){q, k, v, dbt, dl, o, po, pml, 0.0883883f, B, nbpS, splits, part, 0, 0, 0, 0, 0,
                                     0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0, sc};
}
static void decode_inputs_free(bench *b, const kiln_attn_decode_params *p) {
    const CUdeviceptr all[] = {p->q, p->k_cache, p->v_cache, p->out, p->kv_scale, p->block_tables, p->seq_lens,
                               p->part_o, p->part_ml};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        if (all[i]) kiln_cuda_release(&b->cu, all[i]);
}

/* Decode attention, Mistral heads (32/8, 128), block 16: batch B, context L, at the kernel's default
 * K/V load depth (ATTN_UNROLL 2) and at depth 4 with and without 4 blocks per SM forced (ATTN_MINB 4). */
static void bench_attn_decode(bench *b) {
    const int NH = 32, NKV = 8, HD = 128, BS = 16, PART = 512;
    const char *defs[] = {"N_HEADS=32", "N_KV_HEADS=8", "HEAD_DIM=128", "BLOCK_SIZE=16", "WINDOW=0", "PARTITION=512", NULL, NULL};
    static const char *const variants[][2] = {{"ATTN_UNROLL=2", "ATTN_MINB=0"}, {"ATTN_UNROLL=4", "ATTN_MINB=4"},
                                              {"ATTN_UNROLL=4", "ATTN_MINB=0"}};
    for (size_t ui = 0; ui < sizeof variants / sizeof variants[0]; ui++) {
    defs[6] = variants[ui][0];
    defs[7] = variants[ui][1];
    CUmodule md;
    CUfunction fd = build(b, "attn_decode.cuh", "kiln_attn_decode", defs, 8, &md), fc;
    kiln_error err = {0};
    if (kiln_cuda_module_function(&b->cu, md, "kiln_attn_decode_combine", &fc, &err)) die("combine", &err);
    static const int cases[][2] = {{1, 512}, {1, 4096}, {8, 520}, {8, 1024}, {8, 4096}, {64, 520}, {64, 576}, {64, 1024}, {64, 4096}};
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        int B = cases[ci][0], L = cases[ci][1], nblocks = B * ((L + BS - 1) / BS);
        CUdeviceptr k = rand_dev(b, (size_t)nblocks * NKV * BS * HD, 1.0f), v = rand_dev(b, (size_t)nblocks * NKV * BS * HD, 1.0f);
        CUdeviceptr q = rand_dev(b, (size_t)B * NH * HD, 1.0f), o = rand_dev(b, (size_t)B * NH * HD, 1.0f);
        kiln_attn_decode_params p = decode_inputs(b, B, L, NH, NKV, HD, BS, PART, q, k, v, o, 0);
        const int part = p.partition, splits = p.max_splits;
        attn_ctx a = {fd, fc, {{NKV, (unsigned)B, (unsigned)splits}, {128, 1, 1}, kiln_attn_decode_smem(NH, NKV, HD, BS, PART, 4)},
                      {{NH, (unsigned)B, 1}, {128, 1, 1}, 0}, &p, splits > 1};
        double sec = time_launches(b, attn_launch, &a, 20);
        double bytes = 2.0 * B * L * NKV * HD * 2;
        char vname[48];
        snprintf(vname, sizeof vname, "%s %s partition %d", variants[ui][0], variants[ui][1], part);
        report(b, "attn_decode", vname, B, L, splits, sec, bytes,
               4.0 * B * L * NH * HD);
        decode_inputs_free(b, &p);
    }
    kiln_cuda_module_unload(&b->cu, md);
    }
}

/* Decode attention over FP8 codes and bf16 elements at Llama-3.1-8B's heads (32/8, 128), block 16, the
 * CUDA-core kernel against the tensor-core one (ATTN_TC) at ring depths 2, 3 and 4, at what `kiln bench`
 * runs end to end (batch 1024, 192 tokens: 128 in + 64 of the 128 out) and at smaller batches and longer
 * contexts; bytes = K + V read at the cache's element size. */
static void bench_attn_decode_kv(bench *b) {
    const int NH = 32, NKV = 8, HD = 128, BS = 16, PART = 1024;
    static const struct { int kv8, tc, stages; } variants[] = {{1, 0, 0}, {1, 1, 2}, {1, 1, 3}, {1, 1, 4},
                                                                {0, 0, 0}, {0, 1, 2}, {0, 1, 3}};
    static const int cases[][2] = {{1024, 192}, {256, 192}, {64, 192}, {64, 1024}, {8, 1024}, {1, 512}, {1, 4096}};
    kiln_error err = {0};
    for (size_t vi = 0; vi < sizeof variants / sizeof variants[0]; vi++) {
        const int kv8 = variants[vi].kv8, tc = variants[vi].tc, es = kv8 ? 1 : 2;
        char d[4][40];
        const char *defs[10] = {"N_HEADS=32", "N_KV_HEADS=8", "HEAD_DIM=128", "BLOCK_SIZE=16", "WINDOW=0", "PARTITION=1024"};
        int nd = 6;
        if (kv8) defs[nd++] = "KILN_KV8=1";
        if (tc) {
            defs[nd++] = "ATTN_TC=1";
            snprintf(d[0], sizeof d[0], "ATTN_TC_STAGES=%d", variants[vi].stages);
            defs[nd++] = d[0];
        }
        CUmodule md;
        CUfunction fd = build(b, "attn_decode.cuh", tc ? "kiln_attn_decode_tc" : "kiln_attn_decode", defs, nd, &md), fc;
        if (kiln_cuda_module_function(&b->cu, md, "kiln_attn_decode_combine", &fc, &err)) die("combine", &err);
        const unsigned smem = tc ? (unsigned)KILN_ATTN_DECODE_TC_SMEM_S(HD, BS, PART, 4, es, variants[vi].stages)
                                 : kiln_attn_decode_smem(NH, NKV, HD, BS, PART, 4);
        if (smem > (unsigned)b->cu.smem_optin) continue;
        for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
            const int B = cases[ci][0], L = cases[ci][1], nblocks = B * ((L + BS - 1) / BS);
            const size_t n = (size_t)nblocks * NKV * BS * HD;
            CUdeviceptr k, v, sc;
            if (kv8) { /* codes 0x00..0x7E, both signs (no NaN) */
                uint8_t *h = malloc(n);
                for (size_t i = 0; i < n; i++) h[i] = (uint8_t)((i * 2654435761u >> 13) % 255), h[i] = h[i] == 0x7F ? 0x7E : h[i];
                if (kiln_cuda_alloc(&b->cu, n, &k, &err) || kiln_cuda_upload(&b->cu, k, h, n, &err) ||
                    kiln_cuda_alloc(&b->cu, n, &v, &err) || kiln_cuda_upload(&b->cu, v, h, n, &err))
                    die("kv8 alloc", &err);
                free(h);
                sc = rand_dev(b, 2 * NKV, 0.01f);
            } else {
                k = rand_dev(b, n, 1.0f), v = rand_dev(b, n, 1.0f), sc = 0;
            }
            CUdeviceptr q = rand_dev(b, (size_t)B * NH * HD, 1.0f), o = rand_dev(b, (size_t)B * NH * HD, 1.0f);
            kiln_attn_decode_params p = decode_inputs(b, B, L, NH, NKV, HD, BS, PART, q, k, v, o, sc);
            const int part = p.partition, splits = p.max_splits;
            attn_ctx a = {fd, fc, {{tc ? (NKV + 3) / 4 : NKV, (unsigned)B, (unsigned)splits}, {128, 1, 1}, smem},
                          {{NH, (unsigned)B, 1}, {128, 1, 1}, 0}, &p, splits > 1};
            const double sec = time_launches(b, attn_launch, &a, 20);
            char vname[48];
            snprintf(vname, sizeof vname, "%s %s%s partition %d", kv8 ? "fp8" : "bf16", tc ? "tc" : "cc",
                     tc ? (variants[vi].stages == 2 ? " s2" : variants[vi].stages == 3 ? " s3" : " s4") : "", part);
            report(b, "attn_decode_kv", vname, B, L, splits, sec, 2.0 * B * L * NKV * HD * es, 4.0 * B * L * NH * HD);
            decode_inputs_free(b, &p);
        }
        kiln_cuda_module_unload(&b->cu, md);
    }
}

/* Prefill attention, Mistral heads (32/8, 128), block 16: one sequence of T tokens, all in the
 * cache (a whole prompt), causal. FLOPs = 4 * 32 * 128 * T(T+1)/2 (QK^T and PV over the lower
 * triangle). The fp32 FMA kernel is timed up to 2048 tokens; then the tensor-core kernels,
 * named "mma.sync bf16 w<warps> r<query rows per warp> s<barriers per key tile>": as the
 * runtime compiles them (KILN_PF_MMA_WARPS, one barrier) kiln_attn_prefill_mma (r32) and
 * kiln_attn_prefill_mma16 (r16); both with the two-barrier pipeline (PF_MMA_SYNCS=2; r16 s2 is
 * the previous kernel); r32 with the other block size (4 or 8 warps). */
static void bench_attn_prefill(bench *b) {
    const int NH = 32, NKV = 8, HD = 128, BS = 16;
    const char *defs[] = {"N_HEADS=32", "N_KV_HEADS=8", "HEAD_DIM=128", "BLOCK_SIZE=16", "WINDOW=0", NULL};
    const int alt = KILN_PF_MMA_WARPS == 4 ? 8 : 4; /* the other block size, for comparison */
    char altdef[32];
    snprintf(altdef, sizeof altdef, "PF_MMA_WARPS=%d", alt);
    kiln_error err = {0};
    CUmodule mp, mp2, mp4;
    CUfunction fp = build(b, "attn_prefill.cuh", "kiln_attn_prefill", defs, 5, &mp), fpm, fpm16, fpm16s2;
    defs[5] = "PF_MMA_SYNCS=2";
    CUfunction fpms2 = build(b, "attn_prefill.cuh", "kiln_attn_prefill_mma", defs, 6, &mp2);
    defs[5] = altdef;
    CUfunction fpm4 = build(b, "attn_prefill.cuh", "kiln_attn_prefill_mma", defs, 6, &mp4);
    if (kiln_cuda_module_function(&b->cu, mp, "kiln_attn_prefill_mma", &fpm, &err) ||
        kiln_cuda_module_function(&b->cu, mp, "kiln_attn_prefill_mma16", &fpm16, &err) ||
        kiln_cuda_module_function(&b->cu, mp2, "kiln_attn_prefill_mma16", &fpm16s2, &err))
        die("prefill mma", &err);
    /* sm_90: the wgmma kernel as the runtime compiles it, and with one warpgroup a block */
    CUfunction fwg = NULL, fwg1 = NULL;
    CUmodule mw1 = NULL;
    if (b->cu.sm == 90) {
        if (kiln_cuda_module_function(&b->cu, mp, "kiln_attn_prefill_wg", &fwg, &err)) die("prefill wg", &err);
        defs[5] = "PF_WG_GROUPS=1";
        fwg1 = build(b, "attn_prefill.cuh", "kiln_attn_prefill_wg", defs, 6, &mw1);
    }
    const struct {
        CUfunction f;
        int warps, mt, syncs; /* mt 0: the fp32 kernel; 3: wgmma, warps = warpgroups */
    } vs[] = {{fp, 4, 0, 0},
              {fpm, KILN_PF_MMA_WARPS, 2, 1},
              {fpm16, KILN_PF_MMA_WARPS, 1, 1},
              {fpms2, KILN_PF_MMA_WARPS, 2, 2},
              {fpm16s2, KILN_PF_MMA_WARPS, 1, 2},
              {fpm4, alt, 2, 1},
              {fwg, KILN_PF_WG_GROUPS, 3, 1},
              {fwg1, 1, 3, 1}};
    static const int Ts[] = {512, 2048, 4096};
    for (size_t ti = 0; ti < sizeof Ts / sizeof Ts[0]; ti++) {
        int T = Ts[ti], nb = (T + BS - 1) / BS;
        CUdeviceptr k = rand_dev(b, (size_t)nb * NKV * BS * HD, 1.0f), v = rand_dev(b, (size_t)nb * NKV * BS * HD, 1.0f);
        CUdeviceptr q = rand_dev(b, (size_t)T * NH * HD, 1.0f), o = rand_dev(b, (size_t)T * NH * HD, 1.0f);
        int *bt = malloc(sizeof(int) * nb), starts[2] = {0, T};
        for (int i = 0; i < nb; i++) bt[i] = i;
        CUdeviceptr dbt, dl, ds;
        if (kiln_cuda_alloc(&b->cu, sizeof(int) * nb, &dbt, &err) || kiln_cuda_upload(&b->cu, dbt, bt, sizeof(int) * nb, &err) ||
            kiln_cuda_alloc(&b->cu, 4, &dl, &err) || kiln_cuda_upload(&b->cu, dl, &T, 4, &err) ||
            kiln_cuda_alloc(&b->cu, 8, &ds, &err) || kiln_cuda_upload(&b->cu, ds, starts, 8, &err))
            die("prefill alloc", &err);
        kiln_attn_prefill_params p = {q, k, v, dbt, dl, ds, o, 0.0883883f, 1, nb, 0, 0};
        double flops = 4.0 * NH * HD * ((double)T * (T + 1) / 2);
        uint16_t *o_ref = NULL; /* the default mma.sync kernel's output, for the wgmma ones */
        for (size_t vi = 0; vi < sizeof vs / sizeof vs[0]; vi++) {
            const int mt = vs[vi].mt;
            if (mt == 0 && T > 2048) continue; /* ~10 ms a launch: not worth the wait */
            if (!vs[vi].f) continue;
            kiln_cuda_dims dm = mt == 3 ? kiln_attn_prefill_wg_dims(vs[vi].warps, NH, 1, T, HD)
                                : mt ? kiln_attn_prefill_mma_dims(vs[vi].warps, mt, NH, 1, T, HD, false)
                                     : (kiln_cuda_dims){{(unsigned)((T + 63) / 64), NH, 1}, {128, 1, 1},
                                                        kiln_attn_prefill_smem(HD)};
            attn_ctx a = {vs[vi].f, NULL, dm, {{0}, {0}, 0}, &p, 0};
            double sec = time_launches(b, attn_launch, &a, mt ? 10 : 3);
            const size_t on = (size_t)T * NH * HD;
            uint16_t *oh = malloc(on * 2);
            if (!oh || kiln_cuda_download(&b->cu, oh, o, on * 2, &err)) die("prefill download", &err);
            if (vi == 1) o_ref = oh;
            else if (mt == 3 && o_ref) {
                double num = 0, den = 0;
                for (size_t i = 0; i < on; i++) {
                    const double x = kiln_bf16_to_f32(oh[i]), y = kiln_bf16_to_f32(o_ref[i]);
                    num += (x - y) * (x - y), den += y * y;
                }
                fprintf(stderr, "prefill attention wgmma (%d warpgroups) T=%d against mma.sync: rel diff %.3g\n",
                        vs[vi].warps, T, den > 0 ? sqrt(num / den) : sqrt(num));
            }
            if (vi != 1) free(oh);
            char vname[48];
            if (mt == 3)
                snprintf(vname, sizeof vname, "wgmma bf16 g%d k128", vs[vi].warps);
            else if (mt)
                snprintf(vname, sizeof vname, "mma.sync bf16 w%d r%d s%d", vs[vi].warps, 16 * mt, vs[vi].syncs);
            else
                snprintf(vname, sizeof vname, "fp32 fma");
            report(b, "attn_prefill", vname, 1, T, T, sec, 2.0 * T * (NH + 2 * NKV) * HD * 2, flops);
            fprintf(stderr, "prefill attention %s T=%d (one layer, 32 heads): %.1f us, %.1f TFLOP/s\n", vname, T,
                    sec * 1e6, flops / sec / 1e12);
        }
        kiln_cuda_release(&b->cu, k); kiln_cuda_release(&b->cu, v); kiln_cuda_release(&b->cu, q); kiln_cuda_release(&b->cu, o);
        kiln_cuda_release(&b->cu, dbt); kiln_cuda_release(&b->cu, dl); kiln_cuda_release(&b->cu, ds);
        free(bt);
        free(o_ref);
    }
    kiln_cuda_module_unload(&b->cu, mw1);
    kiln_cuda_module_unload(&b->cu, mp);
    kiln_cuda_module_unload(&b->cu, mp2);
    kiln_cuda_module_unload(&b->cu, mp4);
}

int main(int argc, char **argv) {
    bool quick = argc > 1 && strcmp(argv[1], "--quick") == 0;
    bool prefill_only = argc > 1 && strcmp(argv[1], "--prefill") == 0;
    bool decode_attn_only = argc > 1 && strcmp(argv[1], "--decode-attn") == 0;
    bool decode_kv_only = argc > 1 && strcmp(argv[1], "--decode-attn-kv") == 0;
    bool quant_only = argc > 1 && strcmp(argv[1], "--quant") == 0;
    bool qgemm_only = argc > 1 && strcmp(argv[1], "--qgemm") == 0;
    static bench b;
    kiln_error err = {0};
    b.commit = getenv("KILN_COMMIT") ? getenv("KILN_COMMIT") : "unknown";
    b.iters = quick ? 20 : 50;
    if (kiln_cuda_init(&b.cu, 0, &err)) die("init", &err);
    fprintf(stderr, "device: %s, sm_%d, %d SMs, L2 %d MiB, driver %d\n", b.cu.name, b.cu.sm, b.cu.n_sm,
            b.cu.l2_bytes >> 20, b.cu.driver_version);
    if (KILN_CU_CALL(&b.cu, &err, b.cu.api.cuEventCreate(&b.e0, CU_EVENT_DEFAULT)) ||
        KILN_CU_CALL(&b.cu, &err, b.cu.api.cuEventCreate(&b.e1, CU_EVENT_DEFAULT)))
        die("events", &err);
    if (kiln_cublaslt_create(&b.cu, 32u << 20, &b.lt, &err)) die("cuBLASLt", &err);

    if (qgemm_only) {
        bench_qgemm(&b);
    } else if (quant_only) {
        bench_gemv_quant(&b);
    } else if (decode_kv_only) {
        bench_attn_decode_kv(&b);
    } else if (decode_attn_only) {
        bench_attn_decode(&b);
    } else if (!prefill_only) {
        copy_ctx c = {0, 0, (size_t)1 << 30};
        if (kiln_cuda_alloc(&b.cu, c.n, &c.a, &err) || kiln_cuda_alloc(&b.cu, c.n, &c.b, &err)) die("copy alloc", &err);
        kiln_cuda_fill32(&b.cu, c.a, 0x3f803f80u, c.n, &err);
        double sec = time_launches(&b, copy_launch, &c, 10);
        report(&b, "copy_d2d", "cuMemcpyDtoD 1GiB", 1, 0, 0, sec, 2.0 * c.n, 0);
        fprintf(stderr, "copy ceiling: %.0f GB/s (read + write)\n", 2.0 * c.n / sec / 1e9);
        kiln_cuda_release(&b.cu, c.a);
        kiln_cuda_release(&b.cu, c.b);

        bench_gemv(&b, quick);
        bench_attn_decode(&b);
    }
    if (!decode_attn_only && !decode_kv_only && !quant_only && !qgemm_only) bench_attn_prefill(&b);

    fprintf(stderr, "\n%-18s %-22s %5s %6s %6s %9s %8s %7s\n%s", "kernel", "variant", "M", "N", "K", "us", "GB/s",
            "of4.2TB", b.table);
    kiln_cublaslt_destroy(b.lt);
    b.cu.api.cuEventDestroy(b.e0);
    b.cu.api.cuEventDestroy(b.e1);
    kiln_cuda_free(&b.cu);
    free(g_pool);
    return 0;
}
