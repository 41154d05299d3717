/*
 * dequant.cuh — a quantized weight (common/quant.c's layout) dequantized to
 * the element type, for steps with more rows than the quantized GEMV takes:
 * cuBLASLt then multiplies the dense copy (prefill, large decode batches).
 * The values are common/quant.c's, computed the same way in fp32
 * (q8: code * scale; fp8: the E4M3 code's value * scale, the scale the
 * row's or, fp8g128, the row's 128 columns'; q4: code * scale + min, one fma)
 * and rounded once.
 * Kernel: kiln_dequant (kiln_dequant_params, params.cuh); one thread per 8
 * columns, a 1-D grid of ceil(N * K / 8 / DEQUANT_THREADS) blocks of
 * DEQUANT_THREADS. Needs K % 8 == 0 (the runtime checks).
 */
#include "common.cuh"

#ifndef DEQUANT_THREADS
#define DEQUANT_THREADS 256
#endif

extern "C" __global__ void __launch_bounds__(DEQUANT_THREADS) kiln_dequant(const kiln_dequant_params p) {
    kiln_pdl_wait();
    const size_t i = (size_t)blockIdx.x * DEQUANT_THREADS + threadIdx.x; /* which 8 columns */
    const size_t per_row = (size_t)p.K / 8;
    if (i >= (size_t)p.N * per_row) return;
    const size_t n = i / per_row, k = (i % per_row) * 8;
    float f[8];
    if (p.bits == 8) {
        const uint2 w = *(const uint2 *)((const unsigned char *)p.w + n * p.K + k);
        /* one scale a row, or (fp8g128, group 128) a row's 128 columns: 8 | 128, so all 8 share it */
        const float s = ((const float *)p.wscale)[p.group ? n * (size_t)((p.K + p.group - 1) / p.group) + k / p.group : n];
#pragma unroll
        for (int e = 0; e < 8; e++) {
            const unsigned word = e < 4 ? w.x : w.y;
            if (p.fp8) {
                /* E4M3: normal (8 + m) 2^(ex - 10) built as an fp32 with exponent ex + 120; subnormal
                 * m 2^-9 (exact either way; NaN codes are never written) */
                const unsigned c = (word >> (8 * (e & 3))) & 0xFFu, ex = (c >> 3) & 15u, m = c & 7u;
                const float v = ex ? __uint_as_float((ex + 120u) << 23 | m << 20) : (float)m * 0.001953125f;
                f[e] = (c & 0x80u ? -v : v) * s;
            } else {
                f[e] = (float)(signed char)(word >> (8 * (e & 3))) * s;
            }
        }
    } else {
        const unsigned w = *(const unsigned *)((const unsigned char *)p.w + (n * p.K + k) / 2);
        const size_t gi = n * (size_t)(p.K / p.group) + k / p.group;
        const float s = ((const float *)p.wscale)[gi], lo = ((const float *)p.wmin)[gi];
#pragma unroll
        for (int e = 0; e < 8; e++) f[e] = fmaf((float)((w >> (4 * e)) & 15u), s, lo);
    }
    kiln_pdl_launch();
    kiln_elem *out = (kiln_elem *)p.out + n * p.K + k;
#if KILN_F32
    ((uint4 *)out)[0] = make_uint4(__float_as_uint(f[0]), __float_as_uint(f[1]), __float_as_uint(f[2]), __float_as_uint(f[3]));
    ((uint4 *)out)[1] = make_uint4(__float_as_uint(f[4]), __float_as_uint(f[5]), __float_as_uint(f[6]), __float_as_uint(f[7]));
#else
    *(uint4 *)out = kiln_pack8(f);
#endif
}

/* ---- per-token FP8 activations for W8A8 (kiln_act_fp8_params, params.cuh) ---- */
#ifndef ACTQ_THREADS
#define ACTQ_THREADS 256
#endif

/* kiln_e4m3_rn, kiln_e4m3_pack8: common.cuh */

#if !KILN_F32
extern "C" __global__ void __launch_bounds__(ACTQ_THREADS) kiln_act_fp8(const kiln_act_fp8_params p) {
    __shared__ float scratch[32];
    kiln_pdl_wait();
    const int row = blockIdx.x;
    if (row >= p.M) return;
    const uint4 *x = (const uint4 *)((const kiln_elem *)p.x + (size_t)row * p.K);
    const int nch = p.K / 8;
    float amax = 0.0f;
    for (int c = threadIdx.x; c < nch; c += ACTQ_THREADS) {
        float f[8];
        kiln_unpack8(x[c], f);
#pragma unroll
        for (int e = 0; e < 8; e++) amax = fmaxf(amax, fabsf(f[e]));
    }
    amax = kiln_block_max(amax, scratch);
    kiln_pdl_launch();
    const float inv = amax > 0.0f ? 448.0f / amax : 0.0f;
    if (threadIdx.x == 0) ((float *)p.scales)[row] = amax / 448.0f;
    uint2 *out = (uint2 *)((unsigned char *)p.codes + (size_t)row * p.K);
    for (int c = threadIdx.x; c < nch; c += ACTQ_THREADS) {
        float f[8];
        kiln_unpack8(x[c], f);
        out[c] = kiln_e4m3_pack8(f, inv);
    }
}

/* The same with a scale per token and 128 columns (fp8g128's W8A8; the last group the rest of the row),
 * written group-major: scales[g * M + row], as cuBLASLt's VEC128_32F reads them. A group is 16
 * chunks of 8, so the 16 lanes of a half-warp own one and reduce its amax by shuffles; ACTQ_THREADS
 * (a multiple of 32) chunks a pass keep groups within a pass. */
extern "C" __global__ void __launch_bounds__(ACTQ_THREADS) kiln_act_fp8g(const kiln_act_fp8_params p) {
    kiln_pdl_wait();
    const int row = blockIdx.x;
    if (row >= p.M) return;
    const uint4 *x = (const uint4 *)((const kiln_elem *)p.x + (size_t)row * p.K);
    uint2 *out = (uint2 *)((unsigned char *)p.codes + (size_t)row * p.K);
    const int nch = p.K / 8;
    const bool pad = row >= p.rows; /* a row past x's, for M's multiple of 4: zeros */
    kiln_pdl_launch();
    for (int c0 = 0; c0 < nch; c0 += ACTQ_THREADS) { /* every thread each pass: the shuffles need all */
        const int c = c0 + threadIdx.x;
        float f[8] = {0, 0, 0, 0, 0, 0, 0, 0}, amax = 0.0f;
        if (c < nch && !pad) kiln_unpack8(x[c], f);
#pragma unroll
        for (int e = 0; e < 8; e++) amax = fmaxf(amax, fabsf(f[e]));
#pragma unroll
        for (int o = 8; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(KILN_FULL_MASK, amax, o));
        if (c >= nch) continue;
        const float inv = amax > 0.0f ? 448.0f / amax : 0.0f;
        if ((c & 15) == 0) ((float *)p.scales)[(size_t)(c >> 4) * p.M + row] = amax / 448.0f;
        out[c] = kiln_e4m3_pack8(f, inv);
    }
}
#endif

/* out[c * rows + r] = in[r * cols + c] (fp32): fp8g128's scales [N][groups] group-major for cuBLASLt's
 * VEC128_32F, once per matrix at load. One thread an element. */
extern "C" __global__ void __launch_bounds__(256) kiln_transpose_f32(const kiln_transpose_params p) {
    kiln_pdl_wait();
    const size_t i = (size_t)blockIdx.x * 256 + threadIdx.x;
    if (i >= (size_t)p.rows * p.cols) return;
    const size_t r = i / p.cols, c = i % p.cols;
    ((float *)p.out)[c * p.rows + r] = ((const float *)p.in)[i];
}
