/*
 * qgemm.cuh — y[M,N] = x[M,K] · W[N,K]^T over a quantized W (common/quant.c's layout: q8, fp8 a
 * scale a row, q4 in groups of 32, 64 or 128) for steps of tens to hundreds of rows: decode batches
 * past the GEMV's limit and short prompts. The codes are read once per 64 rows of x and widened in
 * registers; there is no dense copy of the matrix (the route it replaces, kiln_dequant then
 * cuBLASLt, writes and reads 2 bytes a weight each step).
 *
 * Work split: a block of QG_WARPS warps owns QG_BN = 16 QG_WARPS rows of W and QG_TM = 64 rows of x
 * (grid x over N, y over M). The warps split N: warp w owns W rows 16w .. 16w + 15 of the block and
 * issues mma.sync m16n8k16 (bf16 in, fp32 accumulate) with those rows as A and 8 tiles of 8 x rows
 * as B, so each widened code is used 64 times. K goes in chunks of 128 columns: the block stages
 * the chunk of x (64 rows x 256 bytes) in shared memory (two stages; the next chunk's x and codes
 * are loaded into registers while the current one is multiplied), and each lane (g = lane / 4,
 * t = lane % 4) reads the codes of rows g and g + 8 at columns 32t .. 32t + 31 of the chunk (16
 * bytes for q4, 32 for q8) straight from global memory. K is permuted consistently for W and x
 * inside each 8-column group, as the GEMV's tensor-core variant does (gemv.cuh), so no lane needs
 * another's codes.
 *   q4: the codes of a 32-bit word (nibble i = column i) pair up as (i, i + 4); x is stored in
 *     shared memory in the same pairs (4 byte permutes per 16 bytes, once per block and chunk).
 *     Each pair becomes bf16 128 + c (0x4300 | c, one lop3), then c exactly (an fma by 1 and
 *     -128), then c s + lo in one bf16x2 fma with s and lo the group's scale and minimum rounded to
 *     bf16: the weight rounded once to bf16, as kiln_dequant's (which rounds c s + lo from fp32
 *     s and lo: the two differ by at most a bf16 rounding of the weight).
 *   q8, fp8: the exact code (kiln_q8_deq, kiln_fp8_deq); the row's fp32 scale multiplies the sum.
 * Shared memory rows of x are 256 bytes, 16 units of 16 bytes; unit u of row r is stored at
 * u ^ (2 (u >> 3 & 1)) ^ (r & 1), so the 8 lanes of a quarter warp (rows 2p, 2p + 1; units 4t + j)
 * read 8 distinct bank groups.
 *
 * Split K (p.splits > 1, grid z): the step's tiles are too few to fill the GPU (N = 4096 at M = 64
 * is 32 tiles of 128), so each of a tile's p.splits blocks takes p.chunks chunks of K, writes its
 * fp32 partial tile to p.ws, and the last to finish (p.cnt[tile], an atomic count it resets to 0
 * for the next launch, so CUDA graphs replay it) sums them and writes y. With one split the block
 * writes y itself.
 * Epilogue: the row's scale (q8, fp8), SwiGLU over interleaved gate/up rows (QG_SWIGLU: output
 * row/2), the residual (p.g.residual, may equal y), bf16 or fp32 (QG_OUT_F32) out.
 * Needs K % 32 == 0 (q4) or K % 16 == 0 (q8, fp8), ldx % 8 == 0 and 16-byte aligned x, W and
 * rows of W (the runtime checks); rows of x past M and of W past N are read clamped, not written.
 * Constants: QG_BITS (4, 8), QG_GROUP (q4: 32, 64, 128), QG_FP8 (with 8: E4M3 codes), QG_SWIGLU,
 * QG_OUT_F32, QG_WARPS (8), QG_TM (64 or 32 rows of x a block), QG_STAGES (3: the ring),
 * QG_MINB (2: blocks an SM the registers must allow).
 * Launch: grid (ceil(N / QG_BN), ceil(M / QG_TM), splits), block QG_WARPS * 32, no dynamic shared
 * memory (kiln_qgemm_dims, runtime/kiln_cuda.h).
 */
#include "common.cuh"

#ifndef QG_BITS
#define QG_BITS 4
#endif
#ifndef QG_GROUP
#define QG_GROUP 128
#endif
#ifndef QG_FP8
#define QG_FP8 0
#endif
#ifndef QG_SWIGLU
#define QG_SWIGLU 0
#endif
#ifndef QG_OUT_F32
#define QG_OUT_F32 0
#endif
#ifndef QG_WARPS
#define QG_WARPS 8
#endif
#ifndef QG_MINB
#define QG_MINB 2 /* blocks an SM the registers must allow */
#endif
#if !(QG_BITS == 8 || (QG_BITS == 4 && (QG_GROUP == 32 || QG_GROUP == 64 || QG_GROUP == 128))) || \
    (QG_FP8 && QG_BITS != 8) || QG_WARPS < 1 || QG_WARPS > 16 || KILN_F32
#error "qgemm: q8, fp8 or q4 in groups of 32, 64 or 128, 1 to 16 warps, bf16 activations"
#endif
#ifndef QG_TM
#define QG_TM 64 /* rows of x a block: 32 or 64 */
#endif
#ifndef QG_PROBE
#define QG_PROBE 0 /* kiln_gpu_bench only, wrong results: 1 skips the codes' widening, 2 the mma */
#endif
#if (QG_TM != 32 && QG_TM != 64) || QG_TM > KILN_QGEMM_TM_MAX
#error "qgemm: QG_TM is 32 or 64"
#endif
#ifndef QG_STAGES
#define QG_STAGES 3 /* chunks in the shared-memory ring (QG_STAGES - 1 in flight while one is multiplied) */
#endif
#define QG_BN (16 * QG_WARPS)    /* rows of W a block */
#define QG_KC 128                /* columns a chunk */
#define QG_XT (QG_TM / 8)        /* 8-row tiles of x a warp multiplies */
#define QG_T (QG_WARPS * 32)     /* threads */
#define QG_WR (QG_KC * QG_BITS / 8) /* bytes of codes a row and chunk (q4 64, q8 128) */
#define QG_GPC (QG_BITS == 4 ? QG_KC / QG_GROUP : 0) /* q4: groups a chunk */
/* a stage: x [QG_TM][16 units] | codes [QG_BN][QG_WR] | q4: scales [QG_BN][QG_GPC], minimums the same */
#define QG_X_OFF 0
#define QG_W_OFF (QG_TM * QG_KC * 2)
#define QG_S_OFF (QG_W_OFF + QG_BN * QG_WR)
#define QG_L_OFF (QG_S_OFF + QG_BN * QG_GPC * 4)
#define QG_STAGE KILN_QGEMM_STAGE(QG_BITS, QG_BITS == 4 ? QG_GROUP : 128, QG_WARPS, QG_TM)
#define QG_TILE_LD (QG_BN + 4) /* the epilogue's fp32 tile [QG_TM][QG_TILE_LD], in the ring */
#if QG_TM * QG_TILE_LD * 4 > QG_STAGES * QG_STAGE || QG_STAGES < 2
#error "qgemm: the ring must hold the epilogue's tile, and two stages or more"
#endif

/* x unit u (8 columns) of row r is stored at unit kiln_qg_xunit(u, r): the 8 lanes of a quarter warp
 * (rows 2p, 2p + 1; units 4t + j) read 8 distinct bank groups. q8 rows of codes (8 units) swap unit
 * pairs on odd rows for the same reason; q4's (4 units) need nothing. */
KILN_DEV int kiln_qg_xunit(int u, int r) { return u ^ (((u >> 3) & 1) << 1) ^ (r & 1); }
KILN_DEV int kiln_qg_wunit(int u, int r) { return QG_BITS == 8 ? u ^ (r & 1) : u; }

/* Stage st <- chunk c (its columns k0 = 128 c ..): this thread's share of the cp.async copies of x,
 * the block's codes and (q4) their groups' scales and minimums; zeros past K. */
KILN_DEV void kiln_qg_issue(const kiln_gemv_params &p, unsigned char *ring, int st, int c, int m0, int n0) {
    const unsigned base = kiln_saddr(ring + (size_t)st * QG_STAGE);
    const int k0 = c * QG_KC;
    const kiln_bf16 *x = (const kiln_bf16 *)p.x;
    for (int id = threadIdx.x; id < QG_TM * (QG_KC / 8); id += QG_T) {
        const int r = id / (QG_KC / 8), u = id % (QG_KC / 8), k = k0 + 8 * u;
        const bool ok = k < p.K && m0 + r < p.M; /* rows past M: zeros, not every block reading row M - 1 */
        const kiln_bf16 *src = x + (ok ? (size_t)(m0 + r) * p.ldx + k : 0);
        kiln_cp16(base + QG_X_OFF + (unsigned)(r * (QG_KC / 8) + kiln_qg_xunit(u, r)) * 16, src, ok ? 16 : 0);
    }
    const size_t row_bytes = (size_t)p.K * QG_BITS / 8;
    for (int id = threadIdx.x; id < QG_BN * (QG_WR / 16); id += QG_T) {
        const int r = id / (QG_WR / 16), u = id % (QG_WR / 16), k = k0 + u * (128 / QG_BITS);
        const unsigned char *src =
            (const unsigned char *)p.w + (size_t)min(n0 + r, p.N - 1) * row_bytes + (k < p.K ? (size_t)k * QG_BITS / 8 : 0);
        kiln_cp16(base + QG_W_OFF + (unsigned)(r * QG_WR + kiln_qg_wunit(u, r) * 16), src, k < p.K ? 16 : 0);
    }
#if QG_BITS == 4
    const int ng = p.K / QG_GROUP;
    for (int id = threadIdx.x; id < QG_BN * QG_GPC; id += QG_T) {
        const int r = id / QG_GPC, gi = c * QG_GPC + id % QG_GPC, ok = gi < ng ? 4 : 0;
        const size_t at = (size_t)min(n0 + r, p.N - 1) * ng + (ok ? gi : 0);
        kiln_cp4(base + QG_S_OFF + (unsigned)id * 4, (const float *)p.wscale + at, ok);
        kiln_cp4(base + QG_L_OFF + (unsigned)id * 4, (const float *)p.wmin + at, ok);
    }
#endif
}

#if QG_BITS == 4
/* q4: the 8 codes of word w (nibble i = column i) as 4 bf16x2 words of the column pairs (0,1), (2,3),
 * (4,5), (6,7), each bf16(c s + lo) from the bf16 scale and minimum pairs s2, l2: byte i of w and of
 * w >> 4 permuted into the two halves and masked (128 + c as bf16, 0x4300 | c), 128 taken off exactly,
 * then one bf16x2 fma. */
KILN_DEV void kiln_qg_deq4(unsigned w, unsigned s2, unsigned l2, unsigned (&o)[4]) {
    const unsigned h = w >> 4;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const unsigned v = (__byte_perm(w, h, (unsigned)(i | (4 + i) << 8)) & 0x000F000Fu) | 0x43004300u;
#if QG_PROBE == 1
        o[i] = v;
#else
        o[i] = kiln_bf2_fma(kiln_bf2_fma(v, 0x3F803F80u, 0xC300C300u), s2, l2); /* (128 + c) - 128 exact */
#endif
    }
}
#endif

/* One chunk from stage `stage`: warp rows 16 warp + g (A) and + 8 (B), this lane's 32 columns 32t .. */
KILN_DEV void kiln_qg_chunk(const unsigned char *stage, int warp, int g, int t, float (&acc)[QG_XT][4]) {
    const int ra = 16 * warp + g, rb = ra + 8;
    const uint4 *xs = (const uint4 *)(stage + QG_X_OFF);
#if QG_BITS == 4
    const uint4 ca = *(const uint4 *)(stage + QG_W_OFF + ra * QG_WR + 16 * t);
    const uint4 cb = *(const uint4 *)(stage + QG_W_OFF + rb * QG_WR + 16 * t);
    const int gq = 32 * t / QG_GROUP; /* this lane's group in the chunk */
    const float *sc = (const float *)(stage + QG_S_OFF), *mn = (const float *)(stage + QG_L_OFF);
    const float s0 = sc[ra * QG_GPC + gq], l0 = mn[ra * QG_GPC + gq], s1 = sc[rb * QG_GPC + gq], l1 = mn[rb * QG_GPC + gq];
    const unsigned sa = kiln_f2bf2(s0, s0), la = kiln_f2bf2(l0, l0), sb = kiln_f2bf2(s1, s1), lb = kiln_f2bf2(l1, l1);
#else
    uint4 ca[2], cb[2];
#pragma unroll
    for (int i = 0; i < 2; i++) {
        ca[i] = *(const uint4 *)(stage + QG_W_OFF + ra * QG_WR + kiln_qg_wunit(2 * t + i, ra) * 16);
        cb[i] = *(const uint4 *)(stage + QG_W_OFF + rb * QG_WR + kiln_qg_wunit(2 * t + i, rb) * 16);
    }
#endif
#pragma unroll
    for (int j = 0; j < 4; j++) { /* columns 32t + 8j .. + 7, natural pairs */
        unsigned A[4], B[4];
#if QG_BITS == 4
        kiln_qg_deq4(j == 0 ? ca.x : j == 1 ? ca.y : j == 2 ? ca.z : ca.w, sa, la, A);
        kiln_qg_deq4(j == 0 ? cb.x : j == 1 ? cb.y : j == 2 ? cb.z : cb.w, sb, lb, B);
#else
        /* columns 8j .. 8j + 7 are words 2(j % 2), + 1 of load j / 2 */
        const uint4 a4 = ca[j >> 1], b4 = cb[j >> 1];
        unsigned t0[2], t1[2], t2[2], t3[2];
#if QG_FP8
        kiln_fp8_deq((j & 1) ? a4.z : a4.x, t0), kiln_fp8_deq((j & 1) ? a4.w : a4.y, t1);
        kiln_fp8_deq((j & 1) ? b4.z : b4.x, t2), kiln_fp8_deq((j & 1) ? b4.w : b4.y, t3);
#else
        kiln_q8_deq((j & 1) ? a4.z : a4.x, t0), kiln_q8_deq((j & 1) ? a4.w : a4.y, t1);
        kiln_q8_deq((j & 1) ? b4.z : b4.x, t2), kiln_q8_deq((j & 1) ? b4.w : b4.y, t3);
#endif
        A[0] = t0[0], A[1] = t0[1], A[2] = t1[0], A[3] = t1[1];
        B[0] = t2[0], B[1] = t2[1], B[2] = t3[0], B[3] = t3[1];
#endif
#pragma unroll
        for (int xt = 0; xt < QG_XT; xt++) {
            const int r = 8 * xt + g;
            const uint4 v = xs[r * (QG_KC / 8) + kiln_qg_xunit(4 * t + j, r)];
#if QG_PROBE == 2
            acc[xt][0] += __uint_as_float((A[0] ^ B[3] ^ v.x ^ v.w) & 0x3FFFFFFFu);
#else
            kiln_mma_bf16(acc[xt], A[0], B[0], A[1], B[1], v.x, v.y);
            kiln_mma_bf16(acc[xt], A[2], B[2], A[3], B[3], v.z, v.w);
#endif
        }
    }
}

/* Row n's scale (q8, fp8: the row's; q4's are in the weights) times the sum v. */
KILN_DEV float kiln_qg_scaled(const kiln_gemv_params &p, int n, float v) {
#if QG_BITS == 8
    v *= __ldg((const float *)p.wscale + n);
#else
    (void)p, (void)n;
#endif
    return v;
}

/* y[o] = v (+ residual[o]), bf16 or fp32 (QG_OUT_F32). */
KILN_DEV void kiln_qg_store(const kiln_gemv_params &p, size_t o, float v) {
    if (p.residual) v += kiln_e2f(((const kiln_elem *)p.residual)[o]);
#if QG_OUT_F32
    ((float *)p.y)[o] = v;
#else
    ((kiln_elem *)p.y)[o] = kiln_f2e(v);
#endif
}

/* The tile's outputs from `sum(m, r)` (row r of the tile, row m of x): coalesced along N. */
template <typename F> KILN_DEV void kiln_qg_epilogue(const kiln_gemv_params &p, int m0, int n0, F sum) {
#if QG_SWIGLU
    for (int e = threadIdx.x; e < QG_TM * QG_BN / 2; e += QG_T) {
        const int m = e / (QG_BN / 2), f = e % (QG_BN / 2), n = n0 + 2 * f;
        if (m0 + m >= p.M || n + 1 >= p.N) continue;
        const float gs = kiln_qg_scaled(p, n, sum(m, 2 * f)), us = kiln_qg_scaled(p, n + 1, sum(m, 2 * f + 1));
        kiln_qg_store(p, (size_t)(m0 + m) * p.ldy + n / 2, kiln_silu(gs) * us);
    }
#else
    for (int e = threadIdx.x; e < QG_TM * QG_BN; e += QG_T) {
        const int m = e / QG_BN, r = e % QG_BN;
        if (m0 + m < p.M && n0 + r < p.N)
            kiln_qg_store(p, (size_t)(m0 + m) * p.ldy + n0 + r, kiln_qg_scaled(p, n0 + r, sum(m, r)));
    }
#endif
}

extern "C" __global__ void __launch_bounds__(QG_T, QG_MINB) kiln_qgemm(const kiln_qgemm_params q) {
    extern __shared__ __align__(16) unsigned char ring[]; /* QG_STAGES * QG_STAGE bytes */
    __shared__ int last;
    const kiln_gemv_params &p = q.g;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    const int n0 = blockIdx.x * QG_BN, m0 = blockIdx.y * QG_TM, z = blockIdx.z;
    const int nc = (p.K + QG_KC - 1) / QG_KC;
    const int c_lo = z * q.chunks, c_hi = min(nc, c_lo + q.chunks);
    /* the first chunks' codes need no earlier kernel: toward L2 before waiting */
    {
        const size_t row_bytes = (size_t)p.K * QG_BITS / 8;
        for (int c = c_lo; c < min(c_hi, c_lo + QG_STAGES - 1); c++)
            for (int id = threadIdx.x; id < QG_BN * (QG_WR / 16); id += QG_T) {
                const int r = id / (QG_WR / 16), k = c * QG_KC + (id % (QG_WR / 16)) * (128 / QG_BITS);
                if (k < p.K)
                    kiln_prefetch_l2((const unsigned char *)p.w + (size_t)min(n0 + r, p.N - 1) * row_bytes +
                                     (size_t)k * QG_BITS / 8);
            }
    }
    kiln_pdl_wait();

    float acc[QG_XT][4];
#pragma unroll
    for (int i = 0; i < QG_XT; i++) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.0f;
    /* the ring: chunk c in stage (c - c_lo) % QG_STAGES; a group committed for every chunk slot, empty
     * past the split's end, so that waiting for all but QG_STAGES - 2 groups always means chunk c */
#pragma unroll
    for (int s = 0; s < QG_STAGES - 1; s++) {
        if (c_lo + s < c_hi) kiln_qg_issue(p, ring, s, c_lo + s, m0, n0);
        kiln_cp_commit();
    }
    for (int c = c_lo; c < c_hi; c++) {
        kiln_cp_wait<QG_STAGES - 2>();
        __syncthreads(); /* chunk c's stage is complete for every thread; chunk c - 1's is free */
        const int ahead = c + QG_STAGES - 1;
        if (ahead < c_hi) kiln_qg_issue(p, ring, (ahead - c_lo) % QG_STAGES, ahead, m0, n0);
        kiln_cp_commit();
        kiln_qg_chunk(ring + (size_t)((c - c_lo) % QG_STAGES) * QG_STAGE, warp, g, t, acc);
    }
    kiln_cp_wait<0>();
    kiln_pdl_launch(); /* every load done: let the next kernel launch */
    __syncthreads();   /* the ring is read: the tile reuses it */
    float *tile = (float *)ring; /* [QG_TM][QG_TILE_LD] */
    /* C fragment of x tile i: c0, c1 = W row g, x rows 8i + 2t, + 1; c2, c3 = W row g + 8 */
#pragma unroll
    for (int i = 0; i < QG_XT; i++) {
        const int r = 16 * warp + g, m = 8 * i + 2 * t;
        tile[m * QG_TILE_LD + r] = acc[i][0];
        tile[(m + 1) * QG_TILE_LD + r] = acc[i][1];
        tile[m * QG_TILE_LD + r + 8] = acc[i][2];
        tile[(m + 1) * QG_TILE_LD + r + 8] = acc[i][3];
    }
    __syncthreads();
    if (q.splits <= 1) {
        kiln_qg_epilogue(p, m0, n0, [&](int m, int r) { return tile[m * QG_TILE_LD + r]; });
        return;
    }
    /* split K: this block's partial tile to ws; the tile's last block sums them */
    const int tid = blockIdx.y * gridDim.x + blockIdx.x;
    float *ws = (float *)q.ws + (size_t)tid * q.splits * QG_TM * QG_BN;
    for (int e = threadIdx.x; e < QG_TM * QG_BN; e += QG_T)
        ws[(size_t)z * QG_TM * QG_BN + e] = tile[(e / QG_BN) * QG_TILE_LD + e % QG_BN];
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) {
        unsigned *cnt = (unsigned *)q.cnt + tid;
        last = atomicAdd(cnt, 1u) == (unsigned)q.splits - 1;
        if (last) *cnt = 0; /* for the next launch (kernels after this one wait for the grid) */
    }
    __syncthreads();
    if (!last) return;
    __threadfence();
    kiln_qg_epilogue(p, m0, n0, [&](int m, int r) {
        float s = 0.0f;
        for (int i = 0; i < q.splits; i++) s += __ldcg(ws + (size_t)i * QG_TM * QG_BN + m * QG_BN + r);
        return s;
    });
}
