/*
 * gemv.cuh — decode GEMV / skinny GEMM: y[M,N] = x[M,K] · W[N,K]^T, bf16
 * storage (fp32 with KILN_F32, see common.cuh), fp32 accumulation, written
 * for memory bandwidth (the weight is read once; x and y are tiny).
 *
 * Work split: a block has GEMV_WARPS warps; each warp owns GEMV_ROWS
 * consecutive rows of W and GEMV_MT rows of x (grid.y walks x in tiles of
 * GEMV_MT, so any M works; M <= GEMV_MT reads W once). Each lane walks K in
 * 16-byte chunks (KILN_VEC elements: 8 bf16 or 4 fp32), lane-strided so a
 * warp reads 512 contiguous bytes of each row per step, with GEMV_UNROLL
 * steps x GEMV_ROWS rows of loads issued before the first use (that many
 * 16-byte loads in flight per lane).
 * The x chunk is loaded once per step and reused for all GEMV_ROWS rows.
 * Lanes then sum with warp shuffles and lane i writes output i.
 *
 * Rows past N are clamped to row N-1 for loading (always a valid address)
 * and not written, so no branch splits the warp in the main loop.
 * When K % KILN_VEC != 0 or an address is not 16-byte aligned a scalar path
 * runs instead (correct, slower; real models never take it).
 *
 * Tensor-core variant (GEMV_MMA=1, for M = 2..8 and beyond): a warp owns
 * 16 rows of W and 8 rows of x and issues mma.sync m16n8k16 (bf16 in, fp32
 * accumulate); the block's GEMV_WARPS warps split K between them and sum
 * through shared memory. K is permuted consistently for W and x so each lane
 * still does 16-byte loads: lane (g = lane/4, t = lane%4) loads W rows g and
 * g+8 and x row g at k0 + 8t .. k0 + 8t + 7, which feeds two mma steps over
 * 32 values of K. No shuffle reduction is needed: the C fragments are the
 * sums. Launch: grid (ceil(M/8), ceil(N/16)), block GEMV_WARPS*32 (x tiles
 * of one group of 16 rows are neighbouring blocks; even so, at M = 16..64
 * cuBLASLt is faster, so the runtime stops at M = 8).
 *
 * RMSNorm folded in (p.norm_w != 0, both variants; the executor's KILN_FUSE
 * bit 1 folds the layer's norms into the QKV, gate/up and LM-head GEMVs at
 * decode): x is the raw residual stream. Nothing is computed before the
 * weights stream: every x chunk a lane loads anyway is multiplied by the
 * norm weight (x * norm_w, fp32 on CUDA cores, rounded to bf16 once for the
 * tensor cores) and its squares are summed on the way; after the K loop the
 * sums of squares are reduced like the dot products (shuffles, and shared
 * memory across the tensor-core variant's K-split warps) and each output is
 * scaled by rsqrt(mean(x^2) + eps) before the epilogue (SwiGLU, residual).
 * The same value as kiln_rmsnorm then the plain GEMV up to the roundings HF
 * applies in between (bf16(norm_w * bf16(x * inv))), which this skips: one
 * kernel launch and its gap fewer per norm. (An earlier version computed
 * the scale in a prologue before the first weight load, paying an L2 round
 * trip per wave: 1.4% / 19% slower per 7B step at batch 1 / 8.)
 * Constants (codegen fills them in; defaults suit M = 1 on an H100/H200):
 *   GEMV_WARPS   warps per block                    (4)
 *   GEMV_ROWS    rows of W per warp                 (2; even with GEMV_SWIGLU)
 *   GEMV_UNROLL  16-byte steps in flight per row    (4)
 *   GEMV_MT      rows of x per block                (1; at most 8)
 *   GEMV_OUT_F32 write fp32 y (logits) instead of bf16   (0)
 *   GEMV_SWIGLU  epilogue silu(gate)*up over interleaved gate/up rows (0)
 *   GEMV_MMA     tensor-core variant (0); GEMV_ROWS, GEMV_MT then unused;
 *                bf16 only (not with KILN_F32)
 *   GEMV_MOE     expert GEMV (0). 1: CUDA-core variant, GEMV_MT 1: block z is
 *                a (token, expert) pair whose expert id the routing kernel left
 *                in device memory (p.moe_sel); W is that expert's matrix, x
 *                row z / p.moe_xdiv, y row z (params.cuh). Only the chosen
 *                experts' weights are read, and decode stays in a CUDA graph.
 *                2: grouped, tensor-core variant: x holds the (token, expert)
 *                pairs grouped by expert, p.moe_sel points at the groups'
 *                offsets (int32 [E + 1], moe.cuh's kiln_moe_group); block
 *                (n tile, e) multiplies expert e's 16 rows of W with all of
 *                its pairs' rows, GEMV_TILES x tiles of 8 rows per pass with
 *                the W fragments held in registers, so each expert's W is read
 *                once per step whatever its number of tokens (decode batches:
 *                every expert is read, only the routed products computed).
 *                Launch: grid (ceil(N / 16), E), block GEMV_WARPS*32.
 *   GEMV_QT      with GEMV_QUANT: 16-row tiles of W per warp (1..4), each step's x and (q4) its
 *                group sums of x shared by them; grid y is ceil(N / (16 GEMV_QT))
 *   GEMV_SPLIT   with GEMV_SWIGLU: W's rows are F gate rows, then F up rows
 *                (an expert's [2F, H] as checkpoints store it) instead of
 *                interleaved; logical row 2f reads gate row f, 2f+1 up row f
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
#ifndef GEMV_MMA
#define GEMV_MMA 0
#endif
#ifndef GEMV_QUANT
#define GEMV_QUANT 0
#endif
#ifndef GEMV_MOE
#define GEMV_MOE 0
#endif
#ifndef GEMV_SPLIT
#define GEMV_SPLIT 0
#endif
#ifndef GEMV_TILES
#define GEMV_TILES 4
#endif
#ifndef GEMV_QT
/* the quantized GEMV (GEMV_QUANT): tiles of 16 rows of W per warp, sharing each step's x loads and
 * (q4) the group sums of x; the grid's y walks N in GEMV_QT * 16 rows (kiln_gemv_dims: cfg rows) */
#define GEMV_QT 1
#endif
#if GEMV_QT < 1 || GEMV_QT > 4 || (GEMV_QT > 1 && !GEMV_QUANT)
#error "GEMV_QT: 1..4 tiles, and more than one only for the quantized GEMV"
#endif
#if GEMV_MOE == 1 && (GEMV_MMA || GEMV_MT != 1)
#error "GEMV_MOE 1: the CUDA-core variant with GEMV_MT 1"
#endif
#if GEMV_MOE == 2 && (!GEMV_MMA || GEMV_QUANT)
#error "GEMV_MOE 2: the bf16 tensor-core variant"
#endif
#if GEMV_SPLIT && !GEMV_MOE
#error "GEMV_SPLIT: expert GEMVs only (GEMV_MOE)"
#endif
#if GEMV_SPLIT && !GEMV_SWIGLU
#error "GEMV_SPLIT needs GEMV_SWIGLU"
#endif
#ifndef GEMV_GROUP
#define GEMV_GROUP 0
#endif
#ifndef GEMV_FP8
/* with GEMV_QUANT 8: the codes are FP8 E4M3 (kiln's fp8) rather than int8 (q8); the layout is the same */
#define GEMV_FP8 0
#endif
#if GEMV_FP8 && GEMV_QUANT != 8
#error "GEMV_FP8 needs GEMV_QUANT 8"
#endif
#ifndef GEMV_QDEQ
/* q4's arithmetic: 0 exact per group (groups of a multiple of 128 columns: the tensor cores sum
 * code x x per group, scaled in fp32 after); 1 each weight dequantized in fp32 and rounded to bf16
 * (any group); 2 none (kiln_gpu_bench only: the codes' bits go to the tensor cores as they are,
 * wrong results: the floor of the loads) */
#define GEMV_QDEQ (GEMV_GROUP % 128 == 0 ? 0 : 1)
#endif
#if GEMV_QUANT == 4 && GEMV_MMA && GEMV_QDEQ == 0 && GEMV_GROUP % 128
#error "GEMV_QDEQ 0 (exact per group) needs groups of a multiple of 128 columns (one warp step)"
#endif
#if GEMV_QUANT && !((GEMV_MMA && (GEMV_QUANT == 8 || (GEMV_QUANT == 4 && GEMV_GROUP >= 32 && GEMV_GROUP % 32 == 0))) || \
                    (!GEMV_MMA && (GEMV_QUANT == 8 || (GEMV_QUANT == 4 && GEMV_GROUP >= 32 && GEMV_GROUP % 32 == 0 && \
                                                       GEMV_MT == 1)) && !GEMV_MOE && !GEMV_SPLIT && !KILN_F32))
#error "GEMV_QUANT: 8, or 4 with GEMV_GROUP a multiple of 32 (on CUDA cores with GEMV_MT 1), bf16 only"
#endif
#if GEMV_QUANT == 8 && GEMV_GROUP && !(GEMV_GROUP == 128 && GEMV_FP8)
#error "GEMV_QUANT 8 with groups: fp8g128 (GEMV_FP8, GEMV_GROUP 128)"
#endif
/* The quantized GEMV on CUDA cores whose block's warps split K (kiln_gemv_ck, the runtime's GEMV_MMA 2
 * launch): always for q4, on request (GEMV_CK 1: codegen's choice for fp8) for q8 and fp8; else q8/fp8
 * take kiln_gemv_ccq, a warp's rows over all of K. */
#ifndef GEMV_CK
#define GEMV_CK (GEMV_QUANT == 4 && !GEMV_MMA)
#endif
#if GEMV_CK && (GEMV_MMA || !(GEMV_QUANT == 4 || (GEMV_QUANT == 8 && !GEMV_GROUP)))
#error "GEMV_CK: q4, q8 or fp8 (not fp8g128) on CUDA cores"
#endif

#if GEMV_SWIGLU && (GEMV_ROWS % 2)
#error "GEMV_SWIGLU needs an even GEMV_ROWS (gate and up rows pair up inside a warp)"
#endif
#if GEMV_MMA && KILN_F32
#error "GEMV_MMA (tensor cores) needs bf16 elements, not KILN_F32"
#endif
#if !GEMV_MMA && (GEMV_MT < 1 || GEMV_MT > 8 || GEMV_ROWS < 1)
#error "GEMV_MT must be 1..8 and GEMV_ROWS at least 1"
#endif

/* Dot of a 16-byte chunk of W with KILN_VEC fp32 values of x, accumulated into acc. */
KILN_DEV float kiln_dotvf(uint4 w, const float (&x)[KILN_VEC], float acc) {
    float f[KILN_VEC];
    kiln_unpackv(w, f);
#pragma unroll
    for (int e = 0; e < KILN_VEC; e++) acc = fmaf(f[e], x[e], acc);
    return acc;
}

/* x chunk times the norm weight chunk (in place, fp32), its squares added to ss. */
KILN_DEV void kiln_norm_scale(float (&x)[KILN_VEC], uint4 nwv, float &ss) {
    float g[KILN_VEC];
    kiln_unpackv(nwv, g);
#pragma unroll
    for (int e = 0; e < KILN_VEC; e++) {
        ss = fmaf(x[e], x[e], ss);
        x[e] *= g[e];
    }
}

/* y[o] = v (+ residual[o]) in y's type: fp32 with GEMV_OUT_F32, else the element type. */
KILN_DEV void kiln_gemv_put(const kiln_gemv_params &p, size_t o, float v) {
    if (p.residual) v += kiln_e2f(((const kiln_elem *)p.residual)[o]);
#if GEMV_OUT_F32
    ((float *)p.y)[o] = v;
#else
    ((kiln_elem *)p.y)[o] = kiln_f2e(v);
#endif
}

/* The row of W that logical row `row` (clamped to N-1) reads: itself, or with GEMV_SPLIT gate/up
 * halves, gate row row/2 for even rows and up row row/2 for odd ones. */
KILN_DEV int kiln_gemv_wrow(const kiln_gemv_params &p, int row) {
    row = min(row, p.N - 1);
#if GEMV_SPLIT
    return (row & 1) ? p.N / 2 + row / 2 : row / 2;
#else
    return row;
#endif
}

/* the codes' widening (kiln_q8_deq, kiln_fp8_deq, kiln_q8_f32, kiln_fp8_f32): common.cuh */

#if !GEMV_MMA

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
                kiln_gemv_put(p, (size_t)(m0 + m) * p.ldy + f, kiln_silu(acc[r][m]) * acc[r + 1][m]);
            }
        }
#else
#pragma unroll
    for (int r = 0; r < GEMV_ROWS; r++)
#pragma unroll
        for (int m = 0; m < GEMV_MT; m++) {
            int idx = r * GEMV_MT + m;
            if (lane == (idx & 31) && row0 + r < p.N && m0 + m < p.M) {
                kiln_gemv_put(p, (size_t)(m0 + m) * p.ldy + row0 + r, acc[r][m]);
            }
        }
#endif
}

/* The CUDA-core GEMVs' end: each lane's sums reduced over the warp and multiplied by the row's scale
 * sc[r] (the quantized GEMV's; 1 for bf16), with NORM by rsqrt(mean(x^2) + eps) from the lanes' sums of
 * squares ss, then written (kiln_gemv_store). */
template <bool NORM>
KILN_DEV void kiln_gemv_cc_finish(const kiln_gemv_params &p, float (&acc)[GEMV_ROWS][GEMV_MT], const float (&ss)[GEMV_MT],
                                  const float (&sc)[GEMV_ROWS], int row0, int m0, int lane) {
#pragma unroll
    for (int r = 0; r < GEMV_ROWS; r++)
#pragma unroll
        for (int m = 0; m < GEMV_MT; m++) acc[r][m] = kiln_warp_sum(acc[r][m]) * sc[r];
    if (NORM)
#pragma unroll
        for (int m = 0; m < GEMV_MT; m++) {
            const float inv = rsqrtf(kiln_warp_sum(ss[m]) / (float)p.K + p.norm_eps);
#pragma unroll
            for (int r = 0; r < GEMV_ROWS; r++) acc[r][m] *= inv;
        }
    kiln_gemv_store(p, acc, row0, m0, lane);
}

template <bool NORM> KILN_DEV void kiln_gemv_cc(const kiln_gemv_params &p) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int row0 = (blockIdx.x * GEMV_WARPS + warp) * GEMV_ROWS;
    const int m0 = blockIdx.y * GEMV_MT;
    if (row0 < p.N && p.K % KILN_VEC == 0 && p.w % 16 == 0) {
        /* the weights need no earlier kernel: start pulling them before waiting */
#pragma unroll
        for (int r = 0; r < GEMV_ROWS; r++)
#pragma unroll
            for (int u = 0; u < GEMV_UNROLL; u++) {
                const int c = lane + 32 * u;
                if (c < p.K / KILN_VEC)
                    kiln_prefetch_l2((const kiln_elem *)p.w + (size_t)kiln_gemv_wrow(p, row0 + r) * p.K +
                                     (size_t)c * KILN_VEC);
            }
    }
    kiln_pdl_wait();
    if (row0 >= p.N) return; /* whole warp leaves together */
    const kiln_elem *w = (const kiln_elem *)p.w;
    const kiln_elem *x = (const kiln_elem *)p.x;

    float acc[GEMV_ROWS][GEMV_MT];
#pragma unroll
    for (int r = 0; r < GEMV_ROWS; r++)
#pragma unroll
        for (int m = 0; m < GEMV_MT; m++) acc[r][m] = 0.0f;

    /* Row pointers, clamped to valid rows; x rows clamped likewise. */
    const kiln_elem *wr[GEMV_ROWS];
#pragma unroll
    for (int r = 0; r < GEMV_ROWS; r++) wr[r] = w + (size_t)kiln_gemv_wrow(p, row0 + r) * p.K;
    const kiln_elem *xr[GEMV_MT];
#pragma unroll
    for (int m = 0; m < GEMV_MT; m++) xr[m] = x + (size_t)min(m0 + m, p.M - 1) * p.ldx;
    const kiln_elem *nw = (const kiln_elem *)p.norm_w;
    float ss[GEMV_MT]; /* NORM: this lane's part of each x row's sum of squares */
#pragma unroll
    for (int m = 0; m < GEMV_MT; m++) ss[m] = 0.0f;

    const bool vec = (p.K % KILN_VEC == 0) && (p.ldx % KILN_VEC == 0) && ((p.w | p.x | p.norm_w) % 16 == 0);
    if (vec) {
        const int kv = p.K / KILN_VEC; /* 16-byte chunks per row */
        for (int c0 = lane; c0 < kv; c0 += 32 * GEMV_UNROLL) {
            uint4 wv[GEMV_UNROLL][GEMV_ROWS];
#pragma unroll
            for (int u = 0; u < GEMV_UNROLL; u++) {
                int c = c0 + 32 * u;
#pragma unroll
                for (int r = 0; r < GEMV_ROWS; r++)
                    wv[u][r] = c < kv ? kiln_ld_stream(wr[r] + (size_t)c * KILN_VEC) : make_uint4(0, 0, 0, 0);
            }
#pragma unroll
            for (int u = 0; u < GEMV_UNROLL; u++) {
                int c = c0 + 32 * u;
                if (c < kv) {
                    const uint4 nwv = NORM ? kiln_ld16(nw + (size_t)c * KILN_VEC) : make_uint4(0, 0, 0, 0);
#pragma unroll
                    for (int m = 0; m < GEMV_MT; m++) {
                        const uint4 xv = kiln_ld16(xr[m] + (size_t)c * KILN_VEC);
                        if (NORM) {
                            float xf[KILN_VEC];
                            kiln_unpackv(xv, xf);
                            kiln_norm_scale(xf, nwv, ss[m]);
#pragma unroll
                            for (int r = 0; r < GEMV_ROWS; r++) acc[r][m] = kiln_dotvf(wv[u][r], xf, acc[r][m]);
                        } else {
#pragma unroll
                            for (int r = 0; r < GEMV_ROWS; r++) acc[r][m] = kiln_dotv(wv[u][r], xv, acc[r][m]);
                        }
                    }
                }
            }
        }
    } else {
        for (int k = lane; k < p.K; k += 32) {
#pragma unroll
            for (int m = 0; m < GEMV_MT; m++) {
                float xv = kiln_e2f(xr[m][k]);
                if (NORM) {
                    ss[m] = fmaf(xv, xv, ss[m]);
                    xv *= kiln_e2f(nw[k]);
                }
#pragma unroll
                for (int r = 0; r < GEMV_ROWS; r++) acc[r][m] = fmaf(kiln_e2f(wr[r][k]), xv, acc[r][m]);
            }
        }
    }
    kiln_pdl_launch(); /* every load issued: let the next kernel launch */
    float one[GEMV_ROWS];
#pragma unroll
    for (int r = 0; r < GEMV_ROWS; r++) one[r] = 1.0f;
    kiln_gemv_cc_finish<NORM>(p, acc, ss, one, row0, m0, lane);
}

#if GEMV_QUANT
/* d + the dot of 16 8-bit codes (q8, or fp8 with GEMV_FP8: word q holds columns 4q..4q+3), each widened to
 * its exact fp32 value, with x[0..15]. */
KILN_DEV float kiln_q8_dot16(uint4 v, const float *x, float d) {
    const unsigned wd[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int q = 0; q < 4; q++) {
        float f[4];
#if GEMV_FP8
        kiln_fp8_f32(wd[q], f);
#else
        kiln_q8_f32(wd[q], f);
#endif
#pragma unroll
        for (int e = 0; e < 4; e++) d = fmaf(f[e], x[4 * q + e], d);
    }
    return d;
}
/* The quantized GEMV on CUDA cores (GEMV_QUANT 8: q8 or, with GEMV_FP8, fp8; common/quant.c's layout:
 * int8/E4M3 codes row-major, then one fp32 scale per row), for one-token steps. As kiln_gemv_cc: a
 * warp owns GEMV_ROWS rows and GEMV_MT x rows, lanes walk K in 16-byte chunks of codes (16 columns),
 * so a warp reads 512 contiguous bytes of each row per step, GEMV_UNROLL x GEMV_ROWS loads in flight
 * per lane; the 16 x values of a chunk (two 16-byte loads, L1 hits) are widened to fp32 once for
 * the rows. Each code becomes its exact fp32 value (q8: a byte permute into 2^23 + code + 128 and
 * one subtract; fp8: kiln_fp8_deq's exact bf16, widened) and one fma; the row's scale multiplies
 * the warp's sum. Where the tensor-core variant multiplies 16 rows by 8 x rows per instruction (7
 * of them idle at one token), this spends about 3 (q8) or 4 (fp8) instructions a weight, under the
 * issue rate at the bandwidth ceiling. Needs K % 16 == 0, ldx % 8 == 0 and 16-byte aligned codes, x
 * and norm_w (the runtime checks K; the others hold for every buffer it makes). */
template <bool NORM> KILN_DEV void kiln_gemv_ccq(const kiln_gemv_params &p) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int row0 = (blockIdx.x * GEMV_WARPS + warp) * GEMV_ROWS;
    const int m0 = blockIdx.y * GEMV_MT;
    const int kv = p.K / 16; /* 16-byte chunks of codes per row */
    const unsigned char *wr[GEMV_ROWS];
#pragma unroll
    for (int r = 0; r < GEMV_ROWS; r++) wr[r] = (const unsigned char *)p.w + (size_t)min(row0 + r, p.N - 1) * p.K;
    if (row0 < p.N) { /* the codes need no earlier kernel: start pulling them before waiting */
#pragma unroll
        for (int r = 0; r < GEMV_ROWS; r++)
#pragma unroll
            for (int u = 0; u < GEMV_UNROLL; u++)
                if (lane + 32 * u < kv) kiln_prefetch_l2(wr[r] + (size_t)(lane + 32 * u) * 16);
    }
    kiln_pdl_wait();
    if (row0 >= p.N) return; /* whole warp leaves together */
    const kiln_bf16 *xr[GEMV_MT];
#pragma unroll
    for (int m = 0; m < GEMV_MT; m++) xr[m] = (const kiln_bf16 *)p.x + (size_t)min(m0 + m, p.M - 1) * p.ldx;
    const kiln_bf16 *nw = (const kiln_bf16 *)p.norm_w;
    float acc[GEMV_ROWS][GEMV_MT], ss[GEMV_MT];
#pragma unroll
    for (int m = 0; m < GEMV_MT; m++) {
        ss[m] = 0.0f;
#pragma unroll
        for (int r = 0; r < GEMV_ROWS; r++) acc[r][m] = 0.0f;
    }
#if GEMV_GROUP
    const int ng = (p.K + GEMV_GROUP - 1) / GEMV_GROUP; /* fp8g128: scales a row */
#endif
    for (int c0 = lane; c0 < kv; c0 += 32 * GEMV_UNROLL) {
        uint4 wv[GEMV_UNROLL][GEMV_ROWS];
#if GEMV_GROUP
        float gsc[GEMV_UNROLL][GEMV_ROWS]; /* each chunk's group scale (16 | 128: a chunk is in one group) */
#endif
#pragma unroll
        for (int u = 0; u < GEMV_UNROLL; u++) {
            const int c = c0 + 32 * u;
#pragma unroll
            for (int r = 0; r < GEMV_ROWS; r++) {
                wv[u][r] = c < kv ? kiln_ld_stream(wr[r] + (size_t)c * 16) : make_uint4(0, 0, 0, 0);
#if GEMV_GROUP
                gsc[u][r] = c < kv ? __ldg((const float *)p.wscale + (size_t)min(row0 + r, p.N - 1) * ng +
                                           c * 16 / GEMV_GROUP)
                                   : 0.0f;
#endif
            }
        }
#pragma unroll
        for (int u = 0; u < GEMV_UNROLL; u++) {
            const int c = c0 + 32 * u;
            if (c >= kv) break; /* later u are past K too */
            float g[16];
            if (NORM) {
                kiln_unpack8(kiln_ld16(nw + (size_t)c * 16), g);
                kiln_unpack8(kiln_ld16(nw + (size_t)c * 16 + 8), g + 8);
            }
#pragma unroll
            for (int m = 0; m < GEMV_MT; m++) {
                float xf[16];
                kiln_unpack8(kiln_ld16(xr[m] + (size_t)c * 16), xf);
                kiln_unpack8(kiln_ld16(xr[m] + (size_t)c * 16 + 8), xf + 8);
                if (NORM)
#pragma unroll
                    for (int e = 0; e < 16; e++) {
                        ss[m] = fmaf(xf[e], xf[e], ss[m]);
                        xf[e] *= g[e];
                    }
#pragma unroll
                for (int r = 0; r < GEMV_ROWS; r++) {
                    /* the chunk's dot: with groups, scaled by its group's scale */
                    const float d = kiln_q8_dot16(wv[u][r], xf, 0.0f);
#if GEMV_GROUP
                    acc[r][m] = fmaf(gsc[u][r], d, acc[r][m]);
#else
                    acc[r][m] += d;
#endif
                }
            }
        }
    }
    kiln_pdl_launch(); /* every load issued: let the next kernel launch */
    float sc[GEMV_ROWS]; /* the row's scale; fp8g128's groups were scaled on the way */
#pragma unroll
    for (int r = 0; r < GEMV_ROWS; r++) sc[r] = GEMV_GROUP ? 1.0f : ((const float *)p.wscale)[min(row0 + r, p.N - 1)];
    kiln_gemv_cc_finish<NORM>(p, acc, ss, sc, row0, m0, lane);
}

#if GEMV_CK
/* q4 (and with GEMV_CK q8, fp8) on CUDA cores, for one-token steps (the runtime's GEMV_MMA 2 launch: grid (ceil(N / GEMV_ROWS),
 * M), block GEMV_WARPS * 32). Unlike the q8 kernel above, the block's threads split K and share its
 * GEMV_ROWS rows: thread t owns the 32-column chunks t, t + T, ... (T threads; 16 bytes of codes a
 * chunk, so a warp reads 512 contiguous bytes of a row), keeps their x in fp32 registers for all the
 * rows (up to GEMV_CPL chunks a pass; a longer K takes more passes), and loads GEMV_UNROLL rows'
 * codes, scales and minimums at once. x is widened once a block instead of once per row, which at
 * 4 bits a weight would cost as much as the codes. Each code becomes an fp32 value with an offset,
 * without a conversion instruction, and one fma:
 *   GEMV_Q4CVT 0: a byte permute or shift puts a code at bits 12..15 (odd columns) or 16..19 (even
 *     columns) of a word, and one lop3 ORs in the exponent of 2048 or 128, whose unit in the last
 *     place is then 1: the word is 2048 + c or 128 + c, exactly (11 integer instructions a word
 *     of 8 codes);
 *   GEMV_Q4CVT 1: one lop3 makes two f16 1024 + c (even columns) or 1024 + 16c (odd columns;
 *     their x is divided by 16, exactly), widened to fp32 by cvt (5 integer instructions and 8
 *     conversions a word).
 * The chunk's sum of (offset + c) x then loses its offsets' part, which is the same for every row
 * (bsum: computed with x), and the group's scale and minimum give s (sum - bsum) + lo sum(x): the
 * weights exactly c s + lo. (The offsets' part is at most 2048 times the sum's, so fp32 keeps about
 * 13 bits beyond it: far under the bf16 rounding of the output.) A chunk lies in one group (G >= 32).
 * The threads' sums meet by a reduce-scatter over each warp and shared memory across warps.
 * q8 and fp8 (GEMV_QUANT 8, GEMV_CK 1): the same, with 16-column chunks (16 bytes of codes) widened
 * as kiln_gemv_ccq does (kiln_q8_f32, kiln_fp8_f32: exact, no offset), and the row's scale on the sum.
 * Needs K % 32 == 0 (q8: % 16), G >= 32, 16-byte aligned codes, x and norm_w, ldx % 8 == 0, GEMV_UNROLL a
 * power of two from 2 to 32 and GEMV_ROWS a multiple of it; a grid that does not cover N rows and M
 * x rows traps (a launch shape from another kind of module would otherwise skip outputs silently). */
#ifndef GEMV_CPL
#define GEMV_CPL 1
#endif
#ifndef GEMV_Q4CVT
#define GEMV_Q4CVT 1 /* the faster of the two on the H200 (docs/quantization.md) */
#endif
#ifndef GEMV_Q4PF
#define GEMV_Q4PF GEMV_UNROLL /* rows whose first chunks go toward L2 before the wait (at most GEMV_ROWS) */
#endif
#if GEMV_UNROLL < 2 || GEMV_UNROLL > 32 || (GEMV_UNROLL & (GEMV_UNROLL - 1)) || GEMV_ROWS % GEMV_UNROLL || \
    (GEMV_QUANT == 4 && GEMV_GROUP < 32)
#error "the CUDA-core GEMV splitting K needs GEMV_UNROLL a power of two from 2 to 32, GEMV_ROWS a multiple of it, and (q4) GEMV_GROUP >= 32"
#endif
#define GEMV_CKC (GEMV_QUANT == 4 ? 32 : 16) /* columns a chunk (16 bytes of codes) */

#if GEMV_QUANT == 8
/* d + the dot of one chunk's 16 codes (q8 or fp8, exact values) with x[0..15]. */
KILN_DEV float kiln_ck_dot(uint4 v, const float (&x)[GEMV_CKC], float d) { return kiln_q8_dot16(v, x, d); }
#else
/* d + the dot of one chunk's 32 codes (as offset values, see above) with x[0..31] (x[odd] / 16 with
 * GEMV_Q4CVT 1). Word q holds columns 8q..8q+7, column 2b in the low nibble of byte b. */
KILN_DEV float kiln_ck_dot(uint4 v, const float (&x)[GEMV_CKC], float d) {
    const unsigned wd[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int q = 0; q < 4; q++) {
        const unsigned w = wd[q];
        const float *xq = x + 8 * q;
#if GEMV_Q4CVT == 0
        /* bytes 1 and 2 of: w (columns 3, 4), w << 8 (1, 2), w >> 8 (5, 6), bytes 3 and 0 of w (7, 0) */
        const unsigned s[4] = {__byte_perm(w, 0u, 0x0030), w << 8, w, w >> 8};
#pragma unroll
        for (int i = 0; i < 4; i++) {
            d = fmaf(__uint_as_float((s[i] & 0x000F0000u) | 0x43000000u), xq[2 * i], d);     /* 128 + c */
            d = fmaf(__uint_as_float((s[i] & 0x0000F000u) | 0x45000000u), xq[(2 * i + 7) & 7], d); /* 2048 + c */
        }
#else
        const unsigned t = w >> 8;
        const unsigned h[4] = {(w & 0x000F000Fu) | 0x64006400u, (w & 0x00F000F0u) | 0x64006400u,
                               (t & 0x000F000Fu) | 0x64006400u, (t & 0x00F000F0u) | 0x64006400u};
        /* h[0]: columns 0, 4; h[1]: 1, 5 (times 16); h[2]: 2, 6; h[3]: 3, 7 (times 16) */
#pragma unroll
        for (int i = 0; i < 4; i++) {
            float lo, hi;
            kiln_f16x2_f32(h[i], lo, hi);
            d = fmaf(lo, xq[i], d);
            d = fmaf(hi, xq[i + 4], d);
        }
#endif
    }
    return d;
}
#endif /* GEMV_QUANT */

/* Sums v[0..R-1] over the warp, row by row, leaving row *row's sum in the returned value: a
 * reduce-scatter (each shuffle level sends half the rows a lane still holds: R - 1 shuffles for
 * log2 R levels), then shuffles over the lanes that hold the same row. */
template <int R> KILN_DEV float kiln_warp_reduce_rows(float (&v)[R], int lane, int *row) {
    int r = 0;
#pragma unroll
    for (int half = R / 2, off = 16; half >= 1; half /= 2, off /= 2) {
        const bool up = (lane & off) != 0;
#pragma unroll
        for (int i = 0; i < half; i++) {
            const float send = up ? v[i] : v[i + half], keep = up ? v[i + half] : v[i];
            v[i] = keep + __shfl_xor_sync(0xffffffffu, send, off);
        }
        if (up) r += half;
    }
    float s = v[0];
#pragma unroll
    for (int off = 16 / R; off >= 1; off /= 2) s += __shfl_xor_sync(0xffffffffu, s, off);
    *row = r;
    return s;
}

/* One thread's x for its chunks c0 + j T (j < GEMV_CPL) of x row xr: fp32 in xf (q4: odd columns / 16
 * with GEMV_Q4CVT 1; times the norm weight with NORM, the squares added to *ss), and for q4 the
 * offsets' part of each chunk's sum (bsum) and its sum of x (xsum); chunks past nch are zero. */
template <bool NORM>
KILN_DEV void kiln_ck_loadx(const kiln_bf16 *xr, const kiln_bf16 *nw, int c0, int nch, float (&xf)[GEMV_CPL][GEMV_CKC],
                            float (&bsum)[GEMV_CPL], float (&xsum)[GEMV_CPL], float *ss) {
#pragma unroll
    for (int j = 0; j < GEMV_CPL; j++) {
        const int c = c0 + j * GEMV_WARPS * 32;
        float se = 0.0f, so = 0.0f; /* sums of x over the even and the odd columns */
#pragma unroll
        for (int e = 0; e < GEMV_CKC / 8; e++) {
            float f[8];
            kiln_unpack8(c < nch ? kiln_ld16(xr + (size_t)c * GEMV_CKC + 8 * e) : make_uint4(0, 0, 0, 0), f);
            if (NORM) {
                float g[8];
                kiln_unpack8(c < nch ? kiln_ld16(nw + (size_t)c * GEMV_CKC + 8 * e) : make_uint4(0, 0, 0, 0), g);
#pragma unroll
                for (int i = 0; i < 8; i++) {
                    *ss = fmaf(f[i], f[i], *ss);
                    f[i] *= g[i];
                }
            }
#pragma unroll
            for (int i = 0; i < 8; i += 2) {
                se += f[i];
                so += f[i + 1];
                xf[j][8 * e + i] = f[i];
                xf[j][8 * e + i + 1] = GEMV_QUANT == 4 && GEMV_Q4CVT ? f[i + 1] * 0.0625f : f[i + 1];
            }
        }
        bsum[j] = GEMV_Q4CVT ? fmaf(1024.0f, se, 64.0f * so) : fmaf(128.0f, se, 2048.0f * so);
        xsum[j] = se + so;
    }
}

/* The codes (q4: and the groups' scales and minimums) of GEMV_UNROLL rows from r0 (wr: the block's row
 * pointers) at one thread's chunks c0 + j T, issued together. */
struct kiln_ck_rows {
    uint4 w[GEMV_UNROLL][GEMV_CPL];
#if GEMV_QUANT == 4
    float s[GEMV_UNROLL][GEMV_CPL], lo[GEMV_UNROLL][GEMV_CPL];
#endif
};
KILN_DEV void kiln_ck_loadw(const kiln_gemv_params &p, const unsigned char *const (&wr)[GEMV_ROWS], int row0, int r0,
                            int c0, int nch, kiln_ck_rows &q) {
#if GEMV_QUANT == 4
    const int ng = p.K / GEMV_GROUP;
#endif
#pragma unroll
    for (int u = 0; u < GEMV_UNROLL; u++)
#pragma unroll
        for (int j = 0; j < GEMV_CPL; j++) {
            const int c = c0 + j * GEMV_WARPS * 32;
            q.w[u][j] = c < nch ? kiln_ld_stream(wr[r0 + u] + (size_t)c * 16) : make_uint4(0, 0, 0, 0);
#if GEMV_QUANT == 4
            const size_t gi = (size_t)min(row0 + r0 + u, p.N - 1) * ng + (size_t)(c * 32 / GEMV_GROUP);
            q.s[u][j] = c < nch ? __ldg((const float *)p.wscale + gi) : 0.0f;
            q.lo[u][j] = c < nch ? __ldg((const float *)p.wmin + gi) : 0.0f;
#endif
        }
}
/* acc[u] += row u's part over the thread's chunks: q4 s (sum - bsum) + lo sum(x); q8 the sum (the
 * row's scale comes after the reduction) */
KILN_DEV void kiln_ck_rows_dot(const kiln_ck_rows &q, const float (&xf)[GEMV_CPL][GEMV_CKC], const float (&bsum)[GEMV_CPL],
                               const float (&xsum)[GEMV_CPL], float (&acc)[GEMV_UNROLL]) {
#pragma unroll
    for (int u = 0; u < GEMV_UNROLL; u++)
#pragma unroll
        for (int j = 0; j < GEMV_CPL; j++) {
#if GEMV_QUANT == 4
            const float d = kiln_ck_dot(q.w[u][j], xf[j], 0.0f);
            acc[u] = fmaf(q.s[u][j], d - bsum[j], fmaf(q.lo[u][j], xsum[j], acc[u]));
#else
            acc[u] = kiln_ck_dot(q.w[u][j], xf[j], acc[u]);
            (void)bsum, (void)xsum;
#endif
        }
}

/* q8/fp8: row r's scale, for its reduced sum (q4's groups were scaled on the way: 1) */
KILN_DEV float kiln_ck_row_scale(const kiln_gemv_params &p, int r) {
    return GEMV_QUANT == 8 ? __ldg((const float *)p.wscale + min(r, p.N - 1)) : 1.0f;
}

template <bool NORM> KILN_DEV void kiln_gemv_ck(const kiln_gemv_params &p) {
    constexpr int T = GEMV_WARPS * 32, R = GEMV_ROWS, U = GEMV_UNROLL, CPL = GEMV_CPL;
    /* each warp's sums of a group of U rows (two groups' buffers: one barrier a group), and its sum of
     * squares */
    __shared__ float red[2][GEMV_WARPS][U];
    __shared__ float red_ss[GEMV_WARPS];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int row0 = blockIdx.x * R, m = blockIdx.y;
    if ((long long)gridDim.x * R < p.N || (int)gridDim.y < p.M) __trap(); /* see the header: never a silent gap */
    const int nch = p.K / GEMV_CKC;
    const size_t rb = (size_t)p.K * GEMV_QUANT / 8; /* bytes of codes a row */
    const unsigned char *wr[R];
#pragma unroll
    for (int r = 0; r < R; r++) wr[r] = (const unsigned char *)p.w + (size_t)min(row0 + r, p.N - 1) * rb;
    /* the codes need no earlier kernel: start pulling the first GEMV_Q4PF rows' before waiting */
#pragma unroll
    for (int r = 0; r < GEMV_Q4PF; r++)
#pragma unroll
        for (int j = 0; j < CPL; j++)
            if (tid + j * T < nch) kiln_prefetch_l2(wr[r] + (size_t)(tid + j * T) * 16);
    kiln_pdl_wait();
    const kiln_bf16 *xr = (const kiln_bf16 *)p.x + (size_t)m * p.ldx;
    const kiln_bf16 *nw = (const kiln_bf16 *)p.norm_w;
    const bool one = nch <= T * CPL; /* one pass: x stays in registers for all the rows */
    float xf[CPL][GEMV_CKC], bsum[CPL], xsum[CPL], ss = 0.0f, inv = 1.0f;
    kiln_ck_rows q[2];
    if (one) {
        kiln_ck_loadw(p, wr, row0, 0, tid, nch, q[0]); /* the first rows' codes in flight while x arrives */
        kiln_ck_loadx<NORM>(xr, nw, tid, nch, xf, bsum, xsum, &ss);
    }
#pragma unroll
    for (int g = 0; g < R / U; g++) {
        float acc[U];
#pragma unroll
        for (int u = 0; u < U; u++) acc[u] = 0.0f;
        if (one) {
            if (g + 1 < R / U) kiln_ck_loadw(p, wr, row0, (g + 1) * U, tid, nch, q[(g + 1) & 1]); /* the next group's */
            kiln_ck_rows_dot(q[g & 1], xf, bsum, xsum, acc);
        } else {
            for (int c0 = tid; c0 < nch; c0 += T * CPL) { /* a K past 32 T CPL columns: x again each pass */
                kiln_ck_loadw(p, wr, row0, g * U, c0, nch, q[0]);
                float s0 = 0.0f;
                kiln_ck_loadx<NORM>(xr, nw, c0, nch, xf, bsum, xsum, &s0);
                if (g == 0) ss += s0;
                kiln_ck_rows_dot(q[0], xf, bsum, xsum, acc);
            }
        }
        if (g == R / U - 1) kiln_pdl_launch(); /* every load issued: let the next kernel launch */
        int row;
        const float v = kiln_warp_reduce_rows<U>(acc, lane, &row);
        if ((lane & (32 / U - 1)) == 0) red[g & 1][warp][row] = v;
        if (NORM && g == 0) {
            const float w = kiln_warp_sum(ss);
            if (lane == 0) red_ss[warp] = w;
        }
        __syncthreads();
        if (NORM && g == 0) {
            float t = 0.0f;
            for (int i = 0; i < GEMV_WARPS; i++) t += red_ss[i];
            inv = rsqrtf(t / (float)p.K + p.norm_eps);
        }
        const int r0 = row0 + g * U;
#if GEMV_SWIGLU
        /* rows (2f, 2f+1) = (gate_f, up_f): one output per pair */
        if (tid < U / 2 && r0 + 2 * tid + 1 < p.N) {
            float a = 0.0f, b = 0.0f;
            for (int i = 0; i < GEMV_WARPS; i++) { /* in warp order: the same bits every run */
                a += red[g & 1][i][2 * tid];
                b += red[g & 1][i][2 * tid + 1];
            }
            kiln_gemv_put(p, (size_t)m * p.ldy + r0 / 2 + tid,
                          kiln_silu(a * inv * kiln_ck_row_scale(p, r0 + 2 * tid)) * (b * inv * kiln_ck_row_scale(p, r0 + 2 * tid + 1)));
        }
#else
        if (tid < U && r0 + tid < p.N) {
            float a = 0.0f;
            for (int i = 0; i < GEMV_WARPS; i++) a += red[g & 1][i][tid];
            kiln_gemv_put(p, (size_t)m * p.ldy + r0 + tid, a * inv * kiln_ck_row_scale(p, r0 + tid));
        }
#endif
    }
}
#endif /* GEMV_CK */
#endif /* GEMV_QUANT */

/* As many resident warps per SM as the plain kernel had before the norm
 * path's extra registers (48 with 8+ warps per block, else 32): one block
 * fewer per SM would add a wave (the QKV grid at one token is 5.8 blocks of
 * 8 warps per SM). */
#if defined(GEMV_MINB)
#define GEMV_MIN_BLOCKS GEMV_MINB /* codegen's or the bench's choice */
#elif GEMV_CK
/* q4 on CUDA cores: 16 warps an SM at least (x in registers, GEMV_UNROLL rows of codes in flight) */
#define GEMV_MIN_BLOCKS ((16 + GEMV_WARPS - 1) / GEMV_WARPS)
#elif GEMV_QUANT
/* the quantized one: at least 24 warps (up to 85 registers a thread: the codes in flight, 16 x values
 * and, with a folded norm, 16 of its weights) */
#define GEMV_MIN_BLOCKS ((24 + GEMV_WARPS - 1) / GEMV_WARPS)
#else
#define GEMV_MIN_BLOCKS (((GEMV_WARPS >= 8 ? 48 : 32) + GEMV_WARPS - 1) / GEMV_WARPS)
#endif
extern "C" __global__ void __launch_bounds__(GEMV_WARPS * 32, GEMV_MIN_BLOCKS)
    kiln_gemv(const kiln_gemv_params p) {
#if GEMV_MOE
    /* pair z: its expert's W, its x row, its y row (the expert id comes from the routing kernel) */
    kiln_pdl_wait();
    const int z = blockIdx.z, e = ((const int *)p.moe_sel)[z];
    kiln_gemv_params q = p;
    q.w += (kiln_dptr)e * (kiln_dptr)p.moe_wstride * sizeof(kiln_elem);
    q.x += (kiln_dptr)(z / p.moe_xdiv) * (kiln_dptr)p.ldx * sizeof(kiln_elem);
    q.y += (kiln_dptr)z * (kiln_dptr)p.ldy * (GEMV_OUT_F32 ? sizeof(float) : sizeof(kiln_elem));
    q.residual = 0;
    q.M = 1;
    kiln_gemv_cc<false>(q);
#elif GEMV_CK
    if (p.norm_w) kiln_gemv_ck<true>(p);
    else kiln_gemv_ck<false>(p);
#elif GEMV_QUANT
    if (p.norm_w) kiln_gemv_ccq<true>(p);
    else kiln_gemv_ccq<false>(p);
#else
    if (p.norm_w) kiln_gemv_cc<true>(p);
    else kiln_gemv_cc<false>(p);
#endif
}
#else /* GEMV_MMA */


/* 8 bf16 of one row at k .. k+7, zero past K: for shapes the vector path cannot take. */
KILN_DEV uint4 kiln_ld8_scalar(const kiln_bf16 *row, int k, int K) {
    unsigned short v[8];
#pragma unroll
    for (int e = 0; e < 8; e++) v[e] = k + e < K ? row[k + e] : (unsigned short)0;
    return make_uint4(v[0] | (unsigned)v[1] << 16, v[2] | (unsigned)v[3] << 16, v[4] | (unsigned)v[5] << 16,
                      v[6] | (unsigned)v[7] << 16);
}

/* rsqrt(mean(x^2) + eps) of x row m of the tile from the warps' sums of squares (in warp order). */
KILN_DEV float kiln_gemv_norm_inv(const kiln_gemv_params &p, const float (*ss_s)[8], int m) {
    float s = 0.0f;
#pragma unroll
    for (int wi = 0; wi < GEMV_WARPS; wi++) s += ss_s[wi][m];
    return rsqrtf(s / (float)p.K + p.norm_eps);
}

/* The block's outputs from each warp's C fragment (and, with NORM, each warp's part of the x rows'
 * sums of squares, already in ss_s): reduced over the warps through shared memory, normalised, the
 * epilogue applied (q8: each row's scale), written. */
template <bool NORM>
KILN_DEV void kiln_gemv_mma_out(const kiln_gemv_params &p, const float (&c)[4], float (*red)[16][8 + 1],
                                const float (*ss_s)[8], int n0, int m0) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, t = lane & 3;
    /* C fragment: c0, c1 = rows g, cols 2t, 2t+1; c2, c3 = row g + 8. */
    red[warp][g][2 * t] = c[0];
    red[warp][g][2 * t + 1] = c[1];
    red[warp][g + 8][2 * t] = c[2];
    red[warp][g + 8][2 * t + 1] = c[3];
    __syncthreads();
#if GEMV_SWIGLU
    /* rows (2f, 2f+1) = (gate_f, up_f): 8 pairs x 8 columns */
    for (int i = threadIdx.x; i < 64; i += GEMV_WARPS * 32) {
        const int pr = i / 8, m = i % 8, row = n0 + 2 * pr;
        if (row + 1 >= p.N || m0 + m >= p.M) continue;
        float gs = 0.0f, us = 0.0f;
#pragma unroll
        for (int wi = 0; wi < GEMV_WARPS; wi++) {
            gs += red[wi][2 * pr][m];
            us += red[wi][2 * pr + 1][m];
        }
        if (NORM) {
            const float inv = kiln_gemv_norm_inv(p, ss_s, m);
            gs *= inv;
            us *= inv;
        }
#if GEMV_QUANT == 8 && !GEMV_GROUP
        gs *= ((const float *)p.wscale)[row];
        us *= ((const float *)p.wscale)[row + 1];
#endif
        float v = kiln_silu(gs) * us;
        const size_t o = (size_t)(m0 + m) * p.ldy + row / 2;
#else
    for (int i = threadIdx.x; i < 128; i += GEMV_WARPS * 32) {
        const int r = i / 8, m = i % 8, row = n0 + r;
        if (row >= p.N || m0 + m >= p.M) continue;
        float v = 0.0f;
#pragma unroll
        for (int wi = 0; wi < GEMV_WARPS; wi++) v += red[wi][r][m];
        if (NORM) v *= kiln_gemv_norm_inv(p, ss_s, m);
#if GEMV_QUANT == 8 && !GEMV_GROUP
        v *= ((const float *)p.wscale)[row];
#endif
        const size_t o = (size_t)(m0 + m) * p.ldy + row;
#endif
        kiln_gemv_put(p, o, v);
    }
}


/* red: per-warp C tiles [warp][row][m]; ss_s: with NORM, each warp's part of the 8 x rows' sums of
 * squares (shared memory declared once in the kernel, not per instantiation). */
template <bool NORM>
KILN_DEV void kiln_gemv_mma(const kiln_gemv_params &p, float (*red)[16][8 + 1], float (*ss_s)[8]) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int n0 = blockIdx.y * 16, m0 = blockIdx.x * 8; /* x tiles of one row group side by side */
    kiln_pdl_wait();
    const kiln_bf16 *w = (const kiln_bf16 *)p.w;
    const kiln_bf16 *x = (const kiln_bf16 *)p.x;
    const kiln_bf16 *wa = w + (size_t)min(n0 + g, p.N - 1) * p.K;     /* row g */
    const kiln_bf16 *wb = w + (size_t)min(n0 + g + 8, p.N - 1) * p.K; /* row g + 8 */
    const kiln_bf16 *xr = x + (size_t)min(m0 + g, p.M - 1) * p.ldx;   /* x row g (the mma's column g) */
    const kiln_bf16 *nw = (const kiln_bf16 *)p.norm_w;
    float ss = 0.0f; /* NORM: this lane's part of x row g's sum of squares */
    float c[4] = {0.0f, 0.0f, 0.0f, 0.0f};

    /* K in steps of 32, dealt to the warps in contiguous ranges. */
    const int nsteps = (p.K + 31) / 32;
    const int per = (nsteps + GEMV_WARPS - 1) / GEMV_WARPS;
    const int s_lo = warp * per, s_hi = min(nsteps, s_lo + per);
    const bool vec = (p.K % 8 == 0) && (p.ldx % 8 == 0) && ((p.w | p.x | p.norm_w) % 16 == 0);
    if (vec) {
        for (int s0 = s_lo; s0 < s_hi; s0 += GEMV_UNROLL) {
            uint4 va[GEMV_UNROLL], vb[GEMV_UNROLL], vx[GEMV_UNROLL], vn[GEMV_UNROLL];
#pragma unroll
            for (int u = 0; u < GEMV_UNROLL; u++) {
                const int k = (s0 + u) * 32 + 8 * t;
                const bool ok = s0 + u < s_hi && k < p.K;
                va[u] = ok ? kiln_ld_stream(wa + k) : make_uint4(0, 0, 0, 0);
                vb[u] = ok ? kiln_ld_stream(wb + k) : make_uint4(0, 0, 0, 0);
                vx[u] = ok ? kiln_ld16(xr + k) : make_uint4(0, 0, 0, 0);
                vn[u] = NORM && ok ? kiln_ld16(nw + k) : make_uint4(0, 0, 0, 0); /* with x: no second round trip */
            }
            if (NORM) {
#pragma unroll
                for (int u = 0; u < GEMV_UNROLL; u++) {
                    float xf[8];
                    kiln_unpack8(vx[u], xf);
                    kiln_norm_scale(xf, vn[u], ss); /* zero past K stays zero */
                    vx[u] = kiln_pack8(xf);
                }
            }
#pragma unroll
            for (int u = 0; u < GEMV_UNROLL; u++) {
                kiln_mma_bf16(c, va[u].x, vb[u].x, va[u].y, vb[u].y, vx[u].x, vx[u].y);
                kiln_mma_bf16(c, va[u].z, vb[u].z, va[u].w, vb[u].w, vx[u].z, vx[u].w);
            }
        }
    } else {
        for (int s = s_lo; s < s_hi; s++) {
            const int k = s * 32 + 8 * t;
            uint4 a = kiln_ld8_scalar(wa, k, p.K), b = kiln_ld8_scalar(wb, k, p.K), v = kiln_ld8_scalar(xr, k, p.K);
            if (NORM) { /* zero past K stays zero */
                float xf[8];
                kiln_unpack8(v, xf);
                kiln_norm_scale(xf, kiln_ld8_scalar(nw, k, p.K), ss);
                v = kiln_pack8(xf);
            }
            kiln_mma_bf16(c, a.x, b.x, a.y, b.y, v.x, v.y);
            kiln_mma_bf16(c, a.z, b.z, a.w, b.w, v.z, v.w);
        }
    }
    kiln_pdl_launch(); /* every load issued: let the next kernel launch */
    if (NORM) {
        ss += __shfl_xor_sync(KILN_FULL_MASK, ss, 1);
        ss += __shfl_xor_sync(KILN_FULL_MASK, ss, 2);
        if (t == 0) ss_s[warp][g] = ss;
    }
    kiln_gemv_mma_out<NORM>(p, c, red, ss_s, n0, m0);
}

#if GEMV_MOE == 2
/* The grouped expert GEMV (GEMV_MOE 2, see the header): block (n tile, expert e). */
KILN_DEV void kiln_gemv_grouped(const kiln_gemv_params &p, float (*red)[16][8 + 1]) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int n0 = blockIdx.x * 16, e = blockIdx.y;
    const kiln_bf16 *w = (const kiln_bf16 *)p.w + (size_t)e * (size_t)p.moe_wstride;
    const kiln_bf16 *wa = w + (size_t)kiln_gemv_wrow(p, n0 + g) * p.K;     /* row g */
    const kiln_bf16 *wb = w + (size_t)kiln_gemv_wrow(p, n0 + g + 8) * p.K; /* row g + 8 */
    const int nsteps = (p.K + 31) / 32;
    const int per = (nsteps + GEMV_WARPS - 1) / GEMV_WARPS;
    const int s_lo = warp * per, s_hi = min(nsteps, s_lo + per);
    /* the weights need no earlier kernel: start pulling the first steps before waiting */
#pragma unroll
    for (int u = 0; u < GEMV_UNROLL; u++) {
        const int k = (s_lo + u) * 32 + 8 * t;
        if (s_lo + u < s_hi && k < p.K && n0 < p.N) {
            kiln_prefetch_l2(wa + k);
            kiln_prefetch_l2(wb + k);
        }
    }
    kiln_pdl_wait();
    const int *off = (const int *)p.moe_sel;
    const int r0 = off[e], cnt = off[e + 1] - r0;
    if (cnt <= 0 || n0 >= p.N) return; /* the whole block: an expert no token chose */
    /* this expert's rows of x and y */
    kiln_gemv_params q = p;
    q.x = p.x + (kiln_dptr)r0 * (kiln_dptr)p.ldx * sizeof(kiln_bf16);
    q.y = p.y + (kiln_dptr)r0 * (kiln_dptr)p.ldy * (GEMV_OUT_F32 ? sizeof(float) : sizeof(kiln_bf16));
    q.residual = 0;
    q.M = cnt;
    const kiln_bf16 *x = (const kiln_bf16 *)q.x;
    const bool vec = (p.K % 8 == 0) && (p.ldx % 8 == 0) && (p.moe_wstride % 8 == 0) && ((p.w | p.x) % 16 == 0);
    for (int m0 = 0; m0 < cnt; m0 += 8 * GEMV_TILES) {
        float c[GEMV_TILES][4];
        const kiln_bf16 *xr[GEMV_TILES]; /* x row g of each tile (the mma's column g), clamped */
#pragma unroll
        for (int j = 0; j < GEMV_TILES; j++) {
            c[j][0] = c[j][1] = c[j][2] = c[j][3] = 0.0f;
            xr[j] = x + (size_t)min(m0 + 8 * j + g, cnt - 1) * p.ldx;
        }
        if (vec) {
            for (int s0 = s_lo; s0 < s_hi; s0 += GEMV_UNROLL) {
                uint4 va[GEMV_UNROLL], vb[GEMV_UNROLL];
#pragma unroll
                for (int u = 0; u < GEMV_UNROLL; u++) {
                    const int k = (s0 + u) * 32 + 8 * t;
                    const bool ok = s0 + u < s_hi && k < p.K;
                    va[u] = ok ? kiln_ld_stream(wa + k) : make_uint4(0, 0, 0, 0);
                    vb[u] = ok ? kiln_ld_stream(wb + k) : make_uint4(0, 0, 0, 0);
                }
#pragma unroll
                for (int u = 0; u < GEMV_UNROLL; u++) {
                    const int k = (s0 + u) * 32 + 8 * t;
                    const bool ok = s0 + u < s_hi && k < p.K;
#pragma unroll
                    for (int j = 0; j < GEMV_TILES; j++) {
                        if (m0 + 8 * j >= cnt) break; /* tiles past the expert's rows (the whole block) */
                        const uint4 vx = ok ? kiln_ld16(xr[j] + k) : make_uint4(0, 0, 0, 0);
                        kiln_mma_bf16(c[j], va[u].x, vb[u].x, va[u].y, vb[u].y, vx.x, vx.y);
                        kiln_mma_bf16(c[j], va[u].z, vb[u].z, va[u].w, vb[u].w, vx.z, vx.w);
                    }
                }
            }
        } else {
            for (int s = s_lo; s < s_hi; s++) {
                const int k = s * 32 + 8 * t;
                const uint4 a = kiln_ld8_scalar(wa, k, p.K), b = kiln_ld8_scalar(wb, k, p.K);
#pragma unroll
                for (int j = 0; j < GEMV_TILES; j++) {
                    if (m0 + 8 * j >= cnt) break;
                    const uint4 v = kiln_ld8_scalar(xr[j], k, p.K);
                    kiln_mma_bf16(c[j], a.x, b.x, a.y, b.y, v.x, v.y);
                    kiln_mma_bf16(c[j], a.z, b.z, a.w, b.w, v.z, v.w);
                }
            }
        }
        kiln_pdl_launch(); /* every load of this pass issued */
#pragma unroll
        for (int j = 0; j < GEMV_TILES; j++) {
            if (m0 + 8 * j >= cnt) break; /* the same for the whole block */
            kiln_gemv_mma_out<false>(q, c[j], red, nullptr, n0, m0 + 8 * j);
            __syncthreads(); /* red is reused by the next tile */
        }
    }
}
#endif /* GEMV_MOE == 2 */

#if GEMV_QUANT
/* Columns of W in one lane's 16-byte load of codes, and the K one warp step covers (lanes t = 0..3
 * side by side, as in the bf16 variant). */
#define GEMV_QK (GEMV_QUANT == 4 ? 32 : 16)
#define GEMV_QSTEP (4 * GEMV_QK)
/* per-step sums scaled afterwards: q4's exact groups (with the group sums of x), fp8g128's groups */
#define GEMV_QSUMS ((GEMV_QUANT == 4 && GEMV_QDEQ == 0) || (GEMV_QUANT == 8 && GEMV_GROUP))

/* q4: the 8 codes of one word (nibble i = column i) as 4 bf16x2 words pairing columns (0,4), (1,5),
 * (2,6), (3,7). GEMV_QDEQ 0: 128 + c, exact in bf16 (0x4300 | c: one instruction per pair; the 128
 * and the group's scale and minimum are applied to the sums); 1: bf16(c * s + lo) computed in fp32
 * (0x4B00000c is 2^23 + c); 2: the bits as they are. */
KILN_DEV void kiln_q4_deq(unsigned w, float s, float lo, unsigned (&o)[4]) {
#pragma unroll
    for (int j = 0; j < 4; j++) {
#if GEMV_QDEQ == 0
        o[j] = ((w >> (4 * j)) & 0x000F000Fu) | 0x43004300u;
#elif GEMV_QDEQ == 1
        const float c0 = __uint_as_float(((w >> (4 * j)) & 15u) | 0x4B000000u) - 8388608.0f;
        const float c1 = __uint_as_float(((w >> (4 * j + 16)) & 15u) | 0x4B000000u) - 8388608.0f;
        o[j] = kiln_f2bf2(fmaf(c0, s, lo), fmaf(c1, s, lo));
#else
        o[j] = w >> (4 * j);
#endif
    }
}
/* The 8 bf16 of x in q4's pairs (0,4), (1,5), (2,6), (3,7). */
KILN_DEV void kiln_q4_pairs(uint4 v, unsigned (&o)[4]) {
    o[0] = __byte_perm(v.x, v.z, 0x5410);
    o[1] = __byte_perm(v.x, v.z, 0x7632);
    o[2] = __byte_perm(v.y, v.w, 0x5410);
    o[3] = __byte_perm(v.y, v.w, 0x7632);
}
/* The tensor-core GEMV over a quantized W (GEMV_QUANT 8 or 4; common/quant.c's layout). As the bf16
 * variant: a warp owns 16 rows of W and 8 rows of x, the block's warps split K, and each lane
 * (g, t) loads 16 bytes of codes of rows g and g + 8 (GEMV_QK columns) and the same columns of x
 * row g; a warp step covers GEMV_QSTEP columns. The codes become bf16 in registers and go to
 * mma.sync with x permuted to the same pairs:
 *   q8: the exact code; the row's fp32 scale multiplies the sum. fp8 (GEMV_FP8) likewise, the
 *     E4M3 code exact in bf16 (kiln_fp8_deq).
 *   q4 in groups of 128 (a warp step is one group): 128 + c, exact, one instruction per pair; the
 *     tensor cores sum (128 + c) x over the group, and with A all ones the group's sum of x, and
 *     the group's fp32 scale and minimum combine them: s sum((128 + c) x) + (lo - 128 s) sum(x).
 *     Exact weights, 2 instructions per 8 codes fewer than scaling each weight.
 *   q4 in smaller groups (4 lanes' columns span several): each weight bf16(c s + lo), in fp32.
 * With NORM, x is multiplied by the norm
 * weight in bf16x2 (one rounding, as the bf16 variant's x * norm_w) and the sums of squares come
 * from the tensor cores too: an mma of x's fragment with itself gives x·x^T, whose diagonal they
 * are, instead of 2 fp32 instructions per element on the CUDA cores. Needs K % GEMV_QK == 0, ldx
 * % 8 == 0 and 16-byte aligned x and norm_w (the runtime checks). */
template <bool NORM>
KILN_DEV void kiln_gemv_mmaq(const kiln_gemv_params &p, float (*red)[16][8 + 1], float (*ss_s)[8]) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int n0 = blockIdx.y * 16 * GEMV_QT, m0 = blockIdx.x * 8;
    const size_t row_bytes = (size_t)p.K * GEMV_QUANT / 8;
    /* tile i: rows n0 + 16 i + g (a) and + 8 (b), clamped */
    const unsigned char *wa[GEMV_QT], *wb[GEMV_QT];
#if GEMV_GROUP /* q4's groups; fp8g128's (the last group may be short) */
    const int ng = (p.K + GEMV_GROUP - 1) / GEMV_GROUP;
    const float *sa[GEMV_QT], *sb[GEMV_QT], *la[GEMV_QT], *lb[GEMV_QT];
#endif
#pragma unroll
    for (int i = 0; i < GEMV_QT; i++) {
        const int ra = min(n0 + 16 * i + g, p.N - 1), rb = min(n0 + 16 * i + g + 8, p.N - 1);
        wa[i] = (const unsigned char *)p.w + (size_t)ra * row_bytes;
        wb[i] = (const unsigned char *)p.w + (size_t)rb * row_bytes;
#if GEMV_GROUP
        sa[i] = (const float *)p.wscale + (size_t)ra * ng, sb[i] = (const float *)p.wscale + (size_t)rb * ng;
        la[i] = (const float *)p.wmin + (size_t)ra * ng, lb[i] = (const float *)p.wmin + (size_t)rb * ng; /* q4 */
#endif
    }
    const int nsteps = (p.K + GEMV_QSTEP - 1) / GEMV_QSTEP;
    const int per = (nsteps + GEMV_WARPS - 1) / GEMV_WARPS;
    const int s_lo = warp * per, s_hi = min(nsteps, s_lo + per);
    /* the codes need no earlier kernel: start pulling the first round before waiting */
    for (int s0 = s_lo; s0 < min(s_hi, s_lo + GEMV_UNROLL); s0++) {
        const int k = s0 * GEMV_QSTEP + GEMV_QK * t;
#pragma unroll
        for (int i = 0; i < GEMV_QT; i++) {
            kiln_prefetch_l2(wa[i] + (size_t)k * GEMV_QUANT / 8);
            kiln_prefetch_l2(wb[i] + (size_t)k * GEMV_QUANT / 8);
        }
    }
    kiln_pdl_wait();
    const kiln_bf16 *xr = (const kiln_bf16 *)p.x + (size_t)min(m0 + g, p.M - 1) * p.ldx;
    const kiln_bf16 *nw = (const kiln_bf16 *)p.norm_w;
    float c[GEMV_QT][4];
#pragma unroll
    for (int i = 0; i < GEMV_QT; i++) c[i][0] = c[i][1] = c[i][2] = c[i][3] = 0.0f;
    float sd[4] = {0.0f, 0.0f, 0.0f, 0.0f}; /* NORM: x·x^T */
    constexpr int QX = GEMV_QK / 8;         /* 16-byte loads of x per lane and step */
    /* a round: the codes (and q4's scales) of GEMV_UNROLL steps of every tile loaded first, all in
     * flight at once; then step by step x (an L1/L2 hit: every warp reads it), shared by the tiles,
     * and the arithmetic */
    for (int s0 = s_lo; s0 < s_hi; s0 += GEMV_UNROLL) {
        uint4 va[GEMV_UNROLL][GEMV_QT], vb[GEMV_UNROLL][GEMV_QT];
#if GEMV_GROUP
        float gs[GEMV_UNROLL][GEMV_QT][4]; /* scale a, min a, scale b, min b (fp8g128: no minimums) */
#endif
#pragma unroll
        for (int u = 0; u < GEMV_UNROLL; u++) {
            const int k = (s0 + u) * GEMV_QSTEP + GEMV_QK * t;
            const bool ok = s0 + u < s_hi && k < p.K;
#pragma unroll
            for (int i = 0; i < GEMV_QT; i++) {
                va[u][i] = ok ? kiln_ld_stream(wa[i] + (size_t)k * GEMV_QUANT / 8) : make_uint4(0, 0, 0, 0);
                vb[u][i] = ok ? kiln_ld_stream(wb[i] + (size_t)k * GEMV_QUANT / 8) : make_uint4(0, 0, 0, 0);
#if GEMV_GROUP
                const int gi = ok ? k / GEMV_GROUP : 0;
                gs[u][i][0] = ok ? __ldg(sa[i] + gi) : 0.0f;
                gs[u][i][1] = ok && GEMV_QUANT == 4 ? __ldg(la[i] + gi) : 0.0f;
                gs[u][i][2] = ok ? __ldg(sb[i] + gi) : 0.0f;
                gs[u][i][3] = ok && GEMV_QUANT == 4 ? __ldg(lb[i] + gi) : 0.0f;
#endif
            }
        }
#pragma unroll
        for (int u = 0; u < GEMV_UNROLL; u++) {
            const int k = (s0 + u) * GEMV_QSTEP + GEMV_QK * t;
            const bool ok = s0 + u < s_hi && k < p.K;
            uint4 vx[QX], vn[QX];
#pragma unroll
            for (int j = 0; j < QX; j++) {
                vx[j] = ok ? kiln_ld16(xr + k + 8 * j) : make_uint4(0, 0, 0, 0);
                vn[j] = NORM && ok ? kiln_ld16(nw + k + 8 * j) : make_uint4(0, 0, 0, 0);
            }
#if GEMV_QSUMS
            float dw[GEMV_QT][4]; /* this step's sums (part of one group) */
#pragma unroll
            for (int i = 0; i < GEMV_QT; i++) dw[i][0] = dw[i][1] = dw[i][2] = dw[i][3] = 0.0f;
#endif
#if GEMV_QUANT == 4 && GEMV_QDEQ == 0
            float dx[4] = {0.0f, 0.0f, 0.0f, 0.0f}; /* q4: the group's sums of x */
#endif
#pragma unroll
            for (int j = 0; j < QX; j++) {
                uint4 xv = vx[j];
                if (NORM) {
                    kiln_mma_bf16(sd, xv.x, 0u, xv.y, 0u, xv.x, xv.y); /* rows 8..15 of A are zero */
                    kiln_mma_bf16(sd, xv.z, 0u, xv.w, 0u, xv.z, xv.w);
                    const uint4 n = vn[j];
                    xv.x = kiln_bf2_fma(xv.x, n.x, 0x80008000u); /* x * norm_w + (-0): one rounding */
                    xv.y = kiln_bf2_fma(xv.y, n.y, 0x80008000u);
                    xv.z = kiln_bf2_fma(xv.z, n.z, 0x80008000u);
                    xv.w = kiln_bf2_fma(xv.w, n.w, 0x80008000u);
                }
#if GEMV_QUANT == 4
                unsigned X[4];
                kiln_q4_pairs(xv, X);
#if GEMV_QDEQ == 0
                /* with A all ones, the group's sum of x for every x row of the tile: once for the tiles */
                kiln_mma_bf16(dx, 0x3F803F80u, 0x3F803F80u, 0x3F803F80u, 0x3F803F80u, X[0], X[1]);
                kiln_mma_bf16(dx, 0x3F803F80u, 0x3F803F80u, 0x3F803F80u, 0x3F803F80u, X[2], X[3]);
#endif
#pragma unroll
                for (int i = 0; i < GEMV_QT; i++) {
                    /* word j of the codes holds the columns of x load j */
                    const uint4 a4 = va[u][i], b4 = vb[u][i];
                    const unsigned wja = j == 0 ? a4.x : j == 1 ? a4.y : j == 2 ? a4.z : a4.w;
                    const unsigned wjb = j == 0 ? b4.x : j == 1 ? b4.y : j == 2 ? b4.z : b4.w;
                    unsigned A[4], B[4];
                    kiln_q4_deq(wja, gs[u][i][0], gs[u][i][1], A);
                    kiln_q4_deq(wjb, gs[u][i][2], gs[u][i][3], B);
#if GEMV_QDEQ == 0
                    /* sum (128 + c) x for every x row of the tile */
                    kiln_mma_bf16(dw[i], A[0], B[0], A[1], B[1], X[0], X[1]);
                    kiln_mma_bf16(dw[i], A[2], B[2], A[3], B[3], X[2], X[3]);
#else
                    kiln_mma_bf16(c[i], A[0], B[0], A[1], B[1], X[0], X[1]);
                    kiln_mma_bf16(c[i], A[2], B[2], A[3], B[3], X[2], X[3]);
#endif
                }
#else
#pragma unroll
                for (int i = 0; i < GEMV_QT; i++) {
                    /* words 2j and 2j + 1 of the codes hold the 8 columns of x load j */
                    const uint4 a4 = va[u][i], b4 = vb[u][i];
                    unsigned A0[2], A1[2], B0[2], B1[2];
#if GEMV_FP8
                    kiln_fp8_deq(j == 0 ? a4.x : a4.z, A0);
                    kiln_fp8_deq(j == 0 ? a4.y : a4.w, A1);
                    kiln_fp8_deq(j == 0 ? b4.x : b4.z, B0);
                    kiln_fp8_deq(j == 0 ? b4.y : b4.w, B1);
#else
                    kiln_q8_deq(j == 0 ? a4.x : a4.z, A0);
                    kiln_q8_deq(j == 0 ? a4.y : a4.w, A1);
                    kiln_q8_deq(j == 0 ? b4.x : b4.z, B0);
                    kiln_q8_deq(j == 0 ? b4.y : b4.w, B1);
#endif
#if GEMV_GROUP /* fp8g128: the group's scale comes after the step */
                    kiln_mma_bf16(dw[i], A0[0], B0[0], A0[1], B0[1], xv.x, xv.y);
                    kiln_mma_bf16(dw[i], A1[0], B1[0], A1[1], B1[1], xv.z, xv.w);
#else
                    kiln_mma_bf16(c[i], A0[0], B0[0], A0[1], B0[1], xv.x, xv.y);
                    kiln_mma_bf16(c[i], A1[0], B1[0], A1[1], B1[1], xv.z, xv.w);
#endif
                }
#endif
            }
#if GEMV_QUANT == 4 && GEMV_QDEQ == 0
            /* w = c s + lo = (128 + c) s + (lo - 128 s): rows g (c0, c1) and g + 8 (c2, c3), in fp32 */
#pragma unroll
            for (int i = 0; i < GEMV_QT; i++) {
                const float *q = gs[u][i];
                const float oa = fmaf(-128.0f, q[0], q[1]), ob = fmaf(-128.0f, q[2], q[3]);
                c[i][0] = fmaf(q[0], dw[i][0], fmaf(oa, dx[0], c[i][0]));
                c[i][1] = fmaf(q[0], dw[i][1], fmaf(oa, dx[1], c[i][1]));
                c[i][2] = fmaf(q[2], dw[i][2], fmaf(ob, dx[2], c[i][2]));
                c[i][3] = fmaf(q[2], dw[i][3], fmaf(ob, dx[3], c[i][3]));
            }
#elif GEMV_QUANT == 8 && GEMV_GROUP
            /* fp8g128: the step lies in one group of 128 columns; rows g (c0, c1) and g + 8 (c2, c3) */
#pragma unroll
            for (int i = 0; i < GEMV_QT; i++) {
                c[i][0] = fmaf(gs[u][i][0], dw[i][0], c[i][0]);
                c[i][1] = fmaf(gs[u][i][0], dw[i][1], c[i][1]);
                c[i][2] = fmaf(gs[u][i][2], dw[i][2], c[i][2]);
                c[i][3] = fmaf(gs[u][i][2], dw[i][3], c[i][3]);
            }
#endif
        }
    }
    kiln_pdl_launch(); /* every load issued: let the next kernel launch */
    /* x·x^T's diagonal: lane (g, t) holds row g's columns 2t and 2t + 1 */
    if (NORM && t == (g >> 1)) ss_s[warp][g] = sd[g & 1];
#pragma unroll
    for (int i = 0; i < GEMV_QT; i++) {
        if (i) __syncthreads(); /* red is reused by the next tile */
        if (n0 + 16 * i < p.N) kiln_gemv_mma_out<NORM>(p, c[i], red, ss_s, n0 + 16 * i, m0); /* uniform */
    }
}
#endif /* GEMV_QUANT */

extern "C" __global__ void __launch_bounds__(GEMV_WARPS * 32) kiln_gemv(const kiln_gemv_params p) {
    __shared__ float red[GEMV_WARPS][16][8 + 1];
    __shared__ float ss_s[GEMV_WARPS][8];
#if GEMV_MOE == 2
    (void)ss_s;
    kiln_gemv_grouped(p, red);
#elif GEMV_QUANT
    if (p.norm_w) kiln_gemv_mmaq<true>(p, red, ss_s);
    else kiln_gemv_mmaq<false>(p, red, ss_s);
#else
    if (p.norm_w) kiln_gemv_mma<true>(p, red, ss_s);
    else kiln_gemv_mma<false>(p, red, ss_s);
#endif
}
#endif /* GEMV_MMA */
