/*
 * swiglu.cuh — out[m, f] = silu(gate) * up for the output of a fused
 * gate/up GEMM, as cuBLASLt writes it in prefill. Decode does this inside
 * the GEMV instead (gemv.cuh, GEMV_SWIGLU), so the [M, 2*FFN] intermediate
 * never exists there. silu and the product run in fp32 and round once.
 *
 * Two layouts of the [M, 2*FFN] input row:
 *   halves       (default)                gate_f at f, up_f at FFN + f
 *   interleaved  (SWIGLU_INTERLEAVED=1)   gate_f at 2f, up_f at 2f + 1 — the
 *                product of x with the interleaved gate/up weight the runtime
 *                keeps for the GEMV's fused epilogue
 * Elements are kiln_elem (bf16, or fp32 with KILN_F32; common.cuh).
 *
 * Constants: FFN; SWIGLU_INTERLEAVED (0); SWIGLU_THREADS (default 256).
 * Launch (kiln_swiglu_dims): grid (ceil(FFN / (KILN_VEC*SWIGLU_THREADS)),
 * min(M, 65535)) when FFN % KILN_VEC == 0 (16-byte path), else
 * (ceil(FFN / SWIGLU_THREADS), min(M, 65535)); block SWIGLU_THREADS. Rows
 * are grid-strided along y (row blockIdx.y, then + gridDim.y...), so any M
 * runs within CUDA's 65,535 limit on grid y (a 100,000-token prefill step).
 */
#include "common.cuh"

#ifndef FFN
#error "swiglu.cuh needs FFN"
#endif
#ifndef SWIGLU_THREADS
#define SWIGLU_THREADS 256
#endif
#ifndef SWIGLU_INTERLEAVED
#define SWIGLU_INTERLEAVED 0
#endif

KILN_DEV float kiln_silu_f(float g) { return g / (1.0f + expf(-g)); }

#if FFN % KILN_VEC == 0
/* The KILN_VEC products of a row's 16-byte output chunk c, in fp32. */
KILN_DEV void kiln_swiglu_vec(const kiln_elem *row, int c, float (&o)[KILN_VEC]) {
    float g[KILN_VEC], u[KILN_VEC];
#if SWIGLU_INTERLEAVED
    /* 2*KILN_VEC inputs: pairs (gate, up) for KILN_VEC outputs */
    float a[KILN_VEC], b[KILN_VEC];
    kiln_unpackv(kiln_ld16(row + (size_t)c * 2 * KILN_VEC), a);
    kiln_unpackv(kiln_ld16(row + (size_t)c * 2 * KILN_VEC + KILN_VEC), b);
#pragma unroll
    for (int e = 0; e < KILN_VEC / 2; e++) {
        g[e] = a[2 * e];
        u[e] = a[2 * e + 1];
        g[KILN_VEC / 2 + e] = b[2 * e];
        u[KILN_VEC / 2 + e] = b[2 * e + 1];
    }
#else
    kiln_unpackv(kiln_ld16(row + (size_t)c * KILN_VEC), g);
    kiln_unpackv(kiln_ld16(row + FFN + (size_t)c * KILN_VEC), u);
#endif
#pragma unroll
    for (int e = 0; e < KILN_VEC; e++) o[e] = kiln_silu_f(g[e]) * u[e];
}
#endif

/* One row m: the 16-byte path's chunk c, or the scalar path's element c. */
KILN_DEV void kiln_swiglu_row(const kiln_swiglu_params &p, size_t m, int c) {
    const kiln_elem *row = (const kiln_elem *)p.gu + m * 2 * FFN;
    kiln_elem *out = (kiln_elem *)p.out + m * FFN;
#if FFN % KILN_VEC == 0
    float o[KILN_VEC];
    kiln_swiglu_vec(row, c, o);
    *(uint4 *)(out + (size_t)c * KILN_VEC) = kiln_packv(o);
#else
#if SWIGLU_INTERLEAVED
    out[c] = kiln_f2e(kiln_silu_f(kiln_e2f(row[2 * c])) * kiln_e2f(row[2 * c + 1]));
#else
    out[c] = kiln_f2e(kiln_silu_f(kiln_e2f(row[c])) * kiln_e2f(row[FFN + c]));
#endif
#endif
}

extern "C" __global__ void __launch_bounds__(SWIGLU_THREADS) kiln_swiglu(const kiln_swiglu_params p) {
    kiln_pdl_wait();
#if FFN % KILN_VEC == 0
    const int n = FFN / KILN_VEC; /* 16-byte chunks of an output row */
#else
    const int n = FFN;
#endif
    const int c = blockIdx.x * SWIGLU_THREADS + threadIdx.x;
    if (c >= n) return;
    for (size_t m = blockIdx.y; m < (size_t)p.M; m += gridDim.y) kiln_swiglu_row(p, m, c);
}

/* kiln_swiglu_fp8 — the same products quantized for the W8A8 GEMM that reads them (+out_fp8, pass
 * swiglu-out-fp8): row m's E4M3 codes into p.out (bytes, [M, FFN]) and its scale amax / 448 into
 * p.scales[m], as kiln_act_fp8 would make them from the bf16 row but from the fp32 products (no bf16
 * rounding in between, as the CPU executor's kiln_act_fp8_row of its f32 row). The bf16 row is never
 * written: the [M, FFN] bf16 write and its read back by kiln_act_fp8 go away. One block a row
 * (grid-strided over rows), the row's products in registers between the block's amax and the codes;
 * SWIGLU_FP8_THREADS (1024) threads a block, so that a step of few rows (64) still spreads each row's
 * FFN products over many threads. Needs FFN % 8 == 0 and bf16. Launch: grid min(M, 65535), block
 * SWIGLU_FP8_THREADS (KILN_SWIGLU_FP8_THREADS). */
#if !KILN_F32 && FFN % KILN_VEC == 0
#ifndef SWIGLU_FP8_THREADS
#define SWIGLU_FP8_THREADS 1024
#endif
#define SWIGLU_FP8_CH ((FFN / KILN_VEC + SWIGLU_FP8_THREADS - 1) / SWIGLU_FP8_THREADS) /* chunks a thread */
extern "C" __global__ void __launch_bounds__(SWIGLU_FP8_THREADS) kiln_swiglu_fp8(const kiln_swiglu_params p) {
    __shared__ float scratch[32];
    kiln_pdl_wait();
    constexpr int n = FFN / KILN_VEC;
    for (size_t m = blockIdx.x; m < (size_t)p.M; m += gridDim.x) {
        const kiln_elem *row = (const kiln_elem *)p.gu + m * 2 * FFN;
        float o[SWIGLU_FP8_CH][KILN_VEC], amax = 0.0f;
#pragma unroll
        for (int j = 0; j < SWIGLU_FP8_CH; j++) {
            const int c = threadIdx.x + j * SWIGLU_FP8_THREADS;
            if (c < n) {
                kiln_swiglu_vec(row, c, o[j]);
#pragma unroll
                for (int e = 0; e < KILN_VEC; e++) amax = fmaxf(amax, fabsf(o[j][e]));
            }
        }
        amax = kiln_block_max(amax, scratch);
        const float inv = amax > 0.0f ? 448.0f / amax : 0.0f;
        if (threadIdx.x == 0) ((float *)p.scales)[m] = amax / 448.0f;
        uint2 *out = (uint2 *)((unsigned char *)p.out + m * FFN);
#pragma unroll
        for (int j = 0; j < SWIGLU_FP8_CH; j++) {
            const int c = threadIdx.x + j * SWIGLU_FP8_THREADS;
            if (c >= n) continue;
            out[c] = kiln_e4m3_pack8(o[j], inv);
        }
    }
}
#endif
