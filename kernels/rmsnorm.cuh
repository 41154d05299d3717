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

extern "C" __global__ void __launch_bounds__(NORM_THREADS) kiln_rmsnorm(const kiln_rmsnorm_params p) {
    __shared__ float scratch[32];
    kiln_pdl_wait();
    const size_t row = blockIdx.x;
    if ((int)row >= p.M) return;
    kiln_elem *res = (kiln_elem *)p.residual + row * HIDDEN;
    const kiln_elem *x = p.x ? (const kiln_elem *)p.x + row * HIDDEN : 0;
    const kiln_elem *w = (const kiln_elem *)p.w;
    kiln_elem *out = (kiln_elem *)p.out + row * HIDDEN;
    float ss = 0.0f;
#if HIDDEN % KILN_VEC == 0
    constexpr int NCH = HIDDEN / KILN_VEC;                            /* chunks per row */
    constexpr int PER = (NCH + NORM_THREADS - 1) / NORM_THREADS;      /* chunks per thread */
    float s[PER][KILN_VEC];
#pragma unroll
    for (int i = 0; i < PER; i++) {
        int c = threadIdx.x + i * NORM_THREADS;
        if (c < NCH) {
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
    for (int i = 0; i < PER; i++) {
        int c = threadIdx.x + i * NORM_THREADS;
        if (c < NCH) {
            float wv[KILN_VEC], o[KILN_VEC];
            kiln_unpackv(*(const uint4 *)(w + c * KILN_VEC), wv);
#pragma unroll
            for (int e = 0; e < KILN_VEC; e++) o[e] = wv[e] * kiln_round(s[i][e] * inv);
            *(uint4 *)(out + c * KILN_VEC) = kiln_packv(o);
        }
    }
#else
    for (int i = threadIdx.x; i < HIDDEN; i += NORM_THREADS) {
        float a = kiln_e2f(res[i]);
        if (x) {
            a = kiln_round(a + kiln_e2f(x[i]));
            res[i] = kiln_f2e(a);
        }
        ss = fmaf(a, a, ss);
    }
    const float inv = rsqrtf(kiln_block_sum(ss, scratch) / (float)HIDDEN + RMS_EPS);
    for (int i = threadIdx.x; i < HIDDEN; i += NORM_THREADS) /* each thread re-reads what it wrote */
        out[i] = kiln_f2e(kiln_e2f(w[i]) * kiln_round(kiln_e2f(res[i]) * inv));
#endif
}
