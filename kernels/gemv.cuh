/*
 * gemv.cuh — decode GEMV / skinny GEMM: y[M,N] = x[M,K] · W[N,K]^T, bf16
 * storage, fp32 accumulation, written for memory bandwidth (the weight is
 * read once; x and y are tiny).
 *
 * Work split: a block has GEMV_WARPS warps; each warp owns GEMV_ROWS
 * consecutive rows of W and GEMV_MT rows of x (grid.y walks x in tiles of
 * GEMV_MT, so any M works; M <= GEMV_MT reads W once). Each lane walks K in
 * 16-byte chunks (8 bf16), lane-strided so a warp reads 512 contiguous bytes
 * of each row per step, with GEMV_UNROLL steps x GEMV_ROWS rows of loads
 * issued before the first use (that many 16-byte loads in flight per lane).
 * The x chunk is loaded once per step and reused for all GEMV_ROWS rows.
 * Lanes then sum with warp shuffles and lane i writes output i.
 *
 * Rows past N are clamped to row N-1 for loading (always a valid address)
 * and not written, so no branch splits the warp in the main loop.
 * When K % 8 != 0 or an address is not 16-byte aligned a scalar path runs
 * instead (correct, slower; real models never take it).
 *
 * Constants (codegen fills them in; defaults suit M = 1 on an H100/H200):
 *   GEMV_WARPS   warps per block                    (4)
 *   GEMV_ROWS    rows of W per warp                 (2; even with GEMV_SWIGLU)
 *   GEMV_UNROLL  16-byte steps in flight per row    (4)
 *   GEMV_MT      rows of x per block                (1; at most 8)
 *   GEMV_OUT_F32 write fp32 y (logits) instead of bf16   (0)
 *   GEMV_SWIGLU  epilogue silu(gate)*up over interleaved gate/up rows (0)
 * Launch: grid (ceil(N / (GEMV_WARPS*GEMV_ROWS)), ceil(M / GEMV_MT)),
 * block GEMV_WARPS*32, no shared memory.
 */
#include "common.cuh"

#ifndef GEMV_WARPS
#define GEMV_WARPS 4
#endif
#ifndef GEMV_ROWS
#define GEMV_ROWS 2
#endif
#ifndef GEMV_UNROLL
#define GEMV_UNROLL 4
#endif
#ifndef GEMV_MT
#define GEMV_MT 1
#endif
#ifndef GEMV_OUT_F32
#define GEMV_OUT_F32 0
#endif
#ifndef GEMV_SWIGLU
#define GEMV_SWIGLU 0
#endif

#if GEMV_SWIGLU && (GEMV_ROWS % 2)
#error "GEMV_SWIGLU needs an even GEMV_ROWS (gate and up rows pair up inside a warp)"
#endif
#if GEMV_MT < 1 || GEMV_MT > 8
#error "GEMV_MT must be 1..8"
#endif

KILN_DEV float kiln_silu(float g) { return g / (1.0f + __expf(-g)); }

/* Write the R x MT sums held by every lane (after the warp reduction). */
KILN_DEV void kiln_gemv_store(const kiln_gemv_params &p, float (&acc)[GEMV_ROWS][GEMV_MT], int row0, int m0,
                              int lane) {
#if GEMV_SWIGLU
    /* rows (2f, 2f+1) = (gate_f, up_f): one output per pair */
#pragma unroll
    for (int r = 0; r < GEMV_ROWS; r += 2)
#pragma unroll
        for (int m = 0; m < GEMV_MT; m++) {
            int idx = (r / 2) * GEMV_MT + m, f = (row0 + r) / 2;
            if (lane == (idx & 31) && row0 + r + 1 < p.N && m0 + m < p.M) {
                float v = kiln_silu(acc[r][m]) * acc[r + 1][m];
                size_t o = (size_t)(m0 + m) * p.ldy + f;
                if (p.residual) v += kiln_bf2f(((const kiln_bf16 *)p.residual)[o]);
#if GEMV_OUT_F32
                ((float *)p.y)[o] = v;
#else
                ((kiln_bf16 *)p.y)[o] = kiln_f2bf(v);
#endif
            }
        }
#else
#pragma unroll
    for (int r = 0; r < GEMV_ROWS; r++)
#pragma unroll
        for (int m = 0; m < GEMV_MT; m++) {
            int idx = r * GEMV_MT + m;
            if (lane == (idx & 31) && row0 + r < p.N && m0 + m < p.M) {
                float v = acc[r][m];
                size_t o = (size_t)(m0 + m) * p.ldy + row0 + r;
                if (p.residual) v += kiln_bf2f(((const kiln_bf16 *)p.residual)[o]);
#if GEMV_OUT_F32
                ((float *)p.y)[o] = v;
#else
                ((kiln_bf16 *)p.y)[o] = kiln_f2bf(v);
#endif
            }
        }
#endif
}

extern "C" __global__ void __launch_bounds__(GEMV_WARPS * 32) kiln_gemv(const kiln_gemv_params p) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int row0 = (blockIdx.x * GEMV_WARPS + warp) * GEMV_ROWS;
    const int m0 = blockIdx.y * GEMV_MT;
    if (row0 >= p.N) return; /* whole warp leaves together */
    const kiln_bf16 *w = (const kiln_bf16 *)p.w;
    const kiln_bf16 *x = (const kiln_bf16 *)p.x;

    float acc[GEMV_ROWS][GEMV_MT];
#pragma unroll
    for (int r = 0; r < GEMV_ROWS; r++)
#pragma unroll
        for (int m = 0; m < GEMV_MT; m++) acc[r][m] = 0.0f;

    /* Row pointers, clamped to valid rows; x rows clamped likewise. */
    const kiln_bf16 *wr[GEMV_ROWS];
#pragma unroll
    for (int r = 0; r < GEMV_ROWS; r++) wr[r] = w + (size_t)min(row0 + r, p.N - 1) * p.K;
    const kiln_bf16 *xr[GEMV_MT];
#pragma unroll
    for (int m = 0; m < GEMV_MT; m++) xr[m] = x + (size_t)min(m0 + m, p.M - 1) * p.ldx;

    const bool vec = (p.K % 8 == 0) && (p.ldx % 8 == 0) && ((p.w | p.x) % 16 == 0);
    if (vec) {
        const int kv = p.K / 8; /* 16-byte chunks per row */
        for (int c0 = lane; c0 < kv; c0 += 32 * GEMV_UNROLL) {
            uint4 wv[GEMV_UNROLL][GEMV_ROWS];
#pragma unroll
            for (int u = 0; u < GEMV_UNROLL; u++) {
                int c = c0 + 32 * u;
#pragma unroll
                for (int r = 0; r < GEMV_ROWS; r++)
                    wv[u][r] = c < kv ? kiln_ld_stream(wr[r] + (size_t)c * 8) : make_uint4(0, 0, 0, 0);
            }
#pragma unroll
            for (int u = 0; u < GEMV_UNROLL; u++) {
                int c = c0 + 32 * u;
                if (c < kv) {
#pragma unroll
                    for (int m = 0; m < GEMV_MT; m++) {
                        uint4 xv = kiln_ld16(xr[m] + (size_t)c * 8);
#pragma unroll
                        for (int r = 0; r < GEMV_ROWS; r++) acc[r][m] = kiln_dot8(wv[u][r], xv, acc[r][m]);
                    }
                }
            }
        }
    } else {
        for (int k = lane; k < p.K; k += 32) {
#pragma unroll
            for (int m = 0; m < GEMV_MT; m++) {
                float xv = kiln_bf2f(xr[m][k]);
#pragma unroll
                for (int r = 0; r < GEMV_ROWS; r++) acc[r][m] = fmaf(kiln_bf2f(wr[r][k]), xv, acc[r][m]);
            }
        }
    }
#pragma unroll
    for (int r = 0; r < GEMV_ROWS; r++)
#pragma unroll
        for (int m = 0; m < GEMV_MT; m++) acc[r][m] = kiln_warp_sum(acc[r][m]);
    kiln_gemv_store(p, acc, row0, m0, lane);
}
