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
 * Launch: grid (ceil(FFN / (KILN_VEC*SWIGLU_THREADS)), M) when FFN %
 * KILN_VEC == 0 (16-byte path), else (ceil(FFN / SWIGLU_THREADS), M); block
 * SWIGLU_THREADS.
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

extern "C" __global__ void __launch_bounds__(SWIGLU_THREADS) kiln_swiglu(const kiln_swiglu_params p) {
    kiln_pdl_wait();
    const size_t m = blockIdx.y;
    if ((int)m >= p.M) return;
    const kiln_elem *row = (const kiln_elem *)p.gu + m * 2 * FFN;
    kiln_elem *out = (kiln_elem *)p.out + m * FFN;
#if FFN % KILN_VEC == 0
    const int c = blockIdx.x * SWIGLU_THREADS + threadIdx.x; /* 16-byte chunk of the output */
    if (c >= FFN / KILN_VEC) return;
    float g[KILN_VEC], u[KILN_VEC], o[KILN_VEC];
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
    *(uint4 *)(out + (size_t)c * KILN_VEC) = kiln_packv(o);
#else
    const int f = blockIdx.x * SWIGLU_THREADS + threadIdx.x;
    if (f >= FFN) return;
#if SWIGLU_INTERLEAVED
    out[f] = kiln_f2e(kiln_silu_f(kiln_e2f(row[2 * f])) * kiln_e2f(row[2 * f + 1]));
#else
    out[f] = kiln_f2e(kiln_silu_f(kiln_e2f(row[f])) * kiln_e2f(row[FFN + f]));
#endif
#endif
}
