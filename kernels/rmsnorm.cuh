/*
 * rmsnorm.cuh — RMSNorm fused with the residual add, one block per row:
 *     s = bf16(x + residual)      (residual <- s; skipped when x is absent)
 *     out = bf16(w * bf16(s * rsqrt(mean(s^2) + RMS_EPS)))
 * The two roundings follow HuggingFace's LlamaRMSNorm in bf16 (the sum is
 * a bf16 tensor; the normalised value is cast back to bf16 before the
 * weight multiplies it), so kiln and HF see the same residual stream. With
 * KILN_F32 (common.cuh) every value is fp32 and the roundings vanish.
 *
 * Constants: HIDDEN (row length), RMS_EPS (float, e.g. 1e-5f),
 * NORM_THREADS (block size, multiple of 32; default 256).
 * Launch: grid (M), block NORM_THREADS, no dynamic shared memory.
 * When HIDDEN % KILN_VEC == 0 rows move in 16-byte chunks kept in registers
 * between the two passes; otherwise a scalar path re-reads the row.
 * With p.perm (+out_perm) out's element j is the normalised element perm[j]:
 * the row goes through HIDDEN elements of dynamic shared memory (the launch's).
 */
#include "common.cuh"

#ifndef HIDDEN
#error "rmsnorm.cuh needs HIDDEN"
#endif
#ifndef RMS_EPS
#define RMS_EPS 1e-5f
#endif
#ifndef NORM_THREADS
#define NORM_THREADS 256
#endif

#if HIDDEN % KILN_VEC == 0
constexpr int NORM_NCH = HIDDEN / KILN_VEC;                             /* chunks per row */
constexpr int NORM_PER = (NORM_NCH + NORM_THREADS - 1) / NORM_THREADS; /* chunks per thread */

/* Row `row` (< p.M) summed with x where there is one (the residual updated), normalised and weighted: this
 * thread's chunks threadIdx.x + i * NORM_THREADS of the output in o, before the output's rounding. */
KILN_DEV void kiln_norm_row(const kiln_rmsnorm_params &p, size_t row, float (&o)[NORM_PER][KILN_VEC],
                            float *scratch) {
    kiln_elem *res = (kiln_elem *)p.residual + row * HIDDEN;
    const kiln_elem *x = p.x ? (const kiln_elem *)p.x + row * HIDDEN : 0;
    const kiln_elem *w = (const kiln_elem *)p.w;
    float ss = 0.0f;
    float s[NORM_PER][KILN_VEC];
#pragma unroll
    for (int i = 0; i < NORM_PER; i++) {
        int c = threadIdx.x + i * NORM_THREADS;
        if (c < NORM_NCH) {
            uint4 rv = *(const uint4 *)(res + c * KILN_VEC);
            float a[KILN_VEC];
            kiln_unpackv(rv, a);
            if (x) {
                float b[KILN_VEC];
                kiln_unpackv(*(const uint4 *)(x + c * KILN_VEC), b);
#pragma unroll
                for (int e = 0; e < KILN_VEC; e++) a[e] = kiln_round(a[e] + b[e]);
                *(uint4 *)(res + c * KILN_VEC) = kiln_packv(a);
            }
#pragma unroll
            for (int e = 0; e < KILN_VEC; e++) {
                s[i][e] = a[e];
                ss = fmaf(a[e], a[e], ss);
            }
        }
    }
    const float inv = rsqrtf(kiln_block_sum(ss, scratch) / (float)HIDDEN + RMS_EPS);
#pragma unroll
    for (int i = 0; i < NORM_PER; i++) {
        int c = threadIdx.x + i * NORM_THREADS;
        if (c < NORM_NCH) {
            float wv[KILN_VEC];
            kiln_unpackv(*(const uint4 *)(w + c * KILN_VEC), wv);
#pragma unroll
            for (int e = 0; e < KILN_VEC; e++) o[i][e] = wv[e] * kiln_round(s[i][e] * inv);
        }
    }
}
#endif

#if HIDDEN % KILN_VEC == 0
constexpr int NORM_PQ = (HIDDEN / 4 + NORM_THREADS - 1) / NORM_THREADS; /* +out_perm: int4s of the order a thread */
#endif

extern "C" __global__ void __launch_bounds__(NORM_THREADS) kiln_rmsnorm(const kiln_rmsnorm_params p) {
    __shared__ float scratch[32];
#if HIDDEN % KILN_VEC == 0
    /* +out_perm: this thread's indices, 4 at a time, loaded before the wait (a weight: no earlier kernel
     * writes it), so their latency hides under the previous kernel's tail */
    int4 ix[NORM_PQ];
    if (p.perm) {
#pragma unroll
        for (int i = 0; i < NORM_PQ; i++) {
            const int q = threadIdx.x + i * NORM_THREADS;
            ix[i] = q < HIDDEN / 4 ? ((const int4 *)p.perm)[q] : make_int4(0, 0, 0, 0);
        }
    }
#endif
    kiln_pdl_wait();
    const size_t row = blockIdx.x;
    if ((int)row >= p.M) return;
#if HIDDEN % KILN_VEC == 0
    float o[NORM_PER][KILN_VEC];
    kiln_norm_row(p, row, o, scratch);
    kiln_elem *out = (kiln_elem *)p.out + row * HIDDEN;
    extern __shared__ __align__(16) unsigned char kiln_norm_row_s[];
    kiln_elem *dst = p.perm ? (kiln_elem *)kiln_norm_row_s : out;
#pragma unroll
    for (int i = 0; i < NORM_PER; i++) {
        int c = threadIdx.x + i * NORM_THREADS;
        if (c < NORM_NCH) *(uint4 *)(dst + c * KILN_VEC) = kiln_packv(o[i]);
    }
    if (p.perm) {
        __syncthreads();
#pragma unroll
        for (int i = 0; i < NORM_PQ; i++) {
            const int q = threadIdx.x + i * NORM_THREADS;
            if (q >= HIDDEN / 4) continue;
            const kiln_elem a = dst[ix[i].x], b = dst[ix[i].y], c = dst[ix[i].z], d = dst[ix[i].w];
            out[4 * q] = a, out[4 * q + 1] = b, out[4 * q + 2] = c, out[4 * q + 3] = d;
        }
    }
#else
    kiln_elem *res = (kiln_elem *)p.residual + row * HIDDEN;
    const kiln_elem *x = p.x ? (const kiln_elem *)p.x + row * HIDDEN : 0;
    const kiln_elem *w = (const kiln_elem *)p.w;
    kiln_elem *out = (kiln_elem *)p.out + row * HIDDEN;
    float ss = 0.0f;
    for (int i = threadIdx.x; i < HIDDEN; i += NORM_THREADS) {
        float a = kiln_e2f(res[i]);
        if (x) {
            a = kiln_round(a + kiln_e2f(x[i]));
            res[i] = kiln_f2e(a);
        }
        ss = fmaf(a, a, ss);
    }
    const float inv = rsqrtf(kiln_block_sum(ss, scratch) / (float)HIDDEN + RMS_EPS);
    const int *pm = (const int *)p.perm; /* +out_perm: the sums every thread wrote are visible after the block sum */
    for (int i = threadIdx.x; i < HIDDEN; i += NORM_THREADS) { /* without it each thread re-reads what it wrote */
        const int j = pm ? pm[i] : i;
        out[i] = kiln_f2e(kiln_e2f(w[j]) * kiln_round(kiln_e2f(res[j]) * inv));
    }
#endif
}

#if !KILN_F32 && HIDDEN % KILN_VEC == 0
/* kiln_rmsnorm_fp8 (+out_fp8, pass norm-out-fp8): the same RMSNorm, its output handed to the W8A8 GEMM after
 * it as that GEMM's input quantization (kiln_act_fp8, dequant.cuh) would make it of the bf16 output: E4M3
 * codes [M, HIDDEN] into p.codes and a scale a row, amax / 448, into p.scales, bit for bit (the bf16 output
 * is not written). */
extern "C" __global__ void __launch_bounds__(NORM_THREADS) kiln_rmsnorm_fp8(const kiln_rmsnorm_params p) {
    __shared__ float scratch[32];
    kiln_pdl_wait();
    const size_t row = blockIdx.x;
    if ((int)row >= p.M) return;
    float o[NORM_PER][KILN_VEC], amax = 0.0f;
    kiln_norm_row(p, row, o, scratch);
#pragma unroll
    for (int i = 0; i < NORM_PER; i++)
#pragma unroll
        for (int e = 0; e < KILN_VEC; e++) {
            o[i][e] = kiln_round(o[i][e]); /* the bf16 value kiln_act_fp8 would read */
            if (threadIdx.x + i * NORM_THREADS < NORM_NCH) amax = fmaxf(amax, fabsf(o[i][e]));
        }
    amax = kiln_block_max(amax, scratch);
    kiln_pdl_launch();
    const float inv = amax > 0.0f ? 448.0f / amax : 0.0f;
    if (threadIdx.x == 0) ((float *)p.scales)[row] = amax / 448.0f;
    uint2 *codes = (uint2 *)((unsigned char *)p.codes + row * HIDDEN);
#pragma unroll
    for (int i = 0; i < NORM_PER; i++) {
        int c = threadIdx.x + i * NORM_THREADS;
        if (c < NORM_NCH) codes[c] = kiln_e4m3_pack8(o[i], inv);
    }
}
#endif
