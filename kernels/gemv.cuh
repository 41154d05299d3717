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

#if GEMV_SWIGLU && (GEMV_ROWS % 2)
#error "GEMV_SWIGLU needs an even GEMV_ROWS (gate and up rows pair up inside a warp)"
#endif
#if GEMV_MMA && KILN_F32
#error "GEMV_MMA (tensor cores) needs bf16 elements, not KILN_F32"
#endif
#if !GEMV_MMA && (GEMV_MT < 1 || GEMV_MT > 8 || GEMV_ROWS < 1)
#error "GEMV_MT must be 1..8 and GEMV_ROWS at least 1"
#endif

KILN_DEV float kiln_silu(float g) { return g / (1.0f + __expf(-g)); }

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
                    kiln_prefetch_l2((const kiln_elem *)p.w + (size_t)min(row0 + r, p.N - 1) * p.K + (size_t)c * KILN_VEC);
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
    for (int r = 0; r < GEMV_ROWS; r++) wr[r] = w + (size_t)min(row0 + r, p.N - 1) * p.K;
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
#pragma unroll
    for (int r = 0; r < GEMV_ROWS; r++)
#pragma unroll
        for (int m = 0; m < GEMV_MT; m++) acc[r][m] = kiln_warp_sum(acc[r][m]);
    if (NORM)
#pragma unroll
        for (int m = 0; m < GEMV_MT; m++) {
            const float inv = rsqrtf(kiln_warp_sum(ss[m]) / (float)p.K + p.norm_eps);
#pragma unroll
            for (int r = 0; r < GEMV_ROWS; r++) acc[r][m] *= inv;
        }
    kiln_gemv_store(p, acc, row0, m0, lane);
}

/* As many resident warps per SM as the plain kernel had before the norm
 * path's extra registers (48 with 8+ warps per block, else 32): one block
 * fewer per SM would add a wave (the QKV grid at one token is 5.8 blocks of
 * 8 warps per SM). */
#define GEMV_MIN_BLOCKS (((GEMV_WARPS >= 8 ? 48 : 32) + GEMV_WARPS - 1) / GEMV_WARPS)
extern "C" __global__ void __launch_bounds__(GEMV_WARPS * 32, GEMV_MIN_BLOCKS)
    kiln_gemv(const kiln_gemv_params p) {
    if (p.norm_w) kiln_gemv_cc<true>(p);
    else kiln_gemv_cc<false>(p);
}
#else /* GEMV_MMA */

/* D = A(16x16 bf16, row) * B(16x8 bf16, col) + D, fp32. */
KILN_DEV void kiln_mma_bf16(float (&d)[4], unsigned a0, unsigned a1, unsigned a2, unsigned a3, unsigned b0,
                            unsigned b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
                 "{%8, %9}, {%0, %1, %2, %3};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

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
    /* C fragment: c0, c1 = rows g, cols 2t, 2t+1; c2, c3 = row g + 8. */
    red[warp][g][2 * t] = c[0];
    red[warp][g][2 * t + 1] = c[1];
    red[warp][g + 8][2 * t] = c[2];
    red[warp][g + 8][2 * t + 1] = c[3];
    if (NORM) {
        ss += __shfl_xor_sync(KILN_FULL_MASK, ss, 1);
        ss += __shfl_xor_sync(KILN_FULL_MASK, ss, 2);
        if (t == 0) ss_s[warp][g] = ss;
    }
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
        const size_t o = (size_t)(m0 + m) * p.ldy + row;
#endif
        kiln_gemv_put(p, o, v);
    }
}

extern "C" __global__ void __launch_bounds__(GEMV_WARPS * 32) kiln_gemv(const kiln_gemv_params p) {
    __shared__ float red[GEMV_WARPS][16][8 + 1];
    __shared__ float ss_s[GEMV_WARPS][8];
    if (p.norm_w) kiln_gemv_mma<true>(p, red, ss_s);
    else kiln_gemv_mma<false>(p, red, ss_s);
}
#endif /* GEMV_MMA */
