/*
 * swiglu.cuh — out[m, f] = silu(gate) * up for the output of a fused
 * gate/up GEMM laid out [M, 2*FFN] (gate half, then up half), as cuBLASLt
 * writes it in prefill. Decode does this inside the GEMV instead
 * (gemv.cuh, GEMV_SWIGLU), so the [M, 2*FFN] intermediate never exists.
 * silu and the product run in fp32 and round once.
 *
 * Constants: FFN; SWIGLU_THREADS (default 256).
 * Launch: grid (ceil(FFN / (8*SWIGLU_THREADS)), M) when FFN % 8 == 0 (16-byte
 * path), else (ceil(FFN / SWIGLU_THREADS), M); block SWIGLU_THREADS.
 */
#include "common.cuh"

#ifndef FFN
#error "swiglu.cuh needs FFN"
#endif
#ifndef SWIGLU_THREADS
#define SWIGLU_THREADS 256
#endif

KILN_DEV float kiln_silu_f(float g) { return g / (1.0f + expf(-g)); }

extern "C" __global__ void __launch_bounds__(SWIGLU_THREADS) kiln_swiglu(const kiln_swiglu_params p) {
    const size_t m = blockIdx.y;
    if ((int)m >= p.M) return;
    const kiln_bf16 *gate = (const kiln_bf16 *)p.gu + m * 2 * FFN, *up = gate + FFN;
    kiln_bf16 *out = (kiln_bf16 *)p.out + m * FFN;
#if FFN % 8 == 0
    const int c = blockIdx.x * SWIGLU_THREADS + threadIdx.x; /* 16-byte chunk */
    if (c >= FFN / 8) return;
    float g[8], u[8], o[8];
    kiln_unpack8(kiln_ld16(gate + c * 8), g);
    kiln_unpack8(kiln_ld16(up + c * 8), u);
#pragma unroll
    for (int e = 0; e < 8; e++) o[e] = kiln_silu_f(g[e]) * u[e];
    *(uint4 *)(out + c * 8) = kiln_pack8(o);
#else
    const int f = blockIdx.x * SWIGLU_THREADS + threadIdx.x;
    if (f >= FFN) return;
    out[f] = kiln_f2bf(kiln_silu_f(kiln_bf2f(gate[f])) * kiln_bf2f(up[f]));
#endif
}
