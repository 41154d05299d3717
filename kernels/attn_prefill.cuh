/*
 * attn_prefill.cuh — prefill attention, flash-attention style (online
 * softmax over key tiles, nothing of size seq x seq in memory): causal, GQA,
 * sliding window, reading q from the rope kernel's output and k/v from the
 * paged cache (so a chunk of a long prompt also sees the earlier chunks).
 *
 * This is the correct-first version: fp32 FMAs from shared memory, no
 * tensor cores. It is also the f32 engines' kernel (elements kiln_elem,
 * common.cuh). A block takes PF_BQ = 64 queries of one head of one
 * sequence and walks key tiles of PF_BK = 32 between the first key the
 * window lets the first query see and the last query's own position.
 * 128 threads: thread (ty = tid/8, tx = tid%8) owns query rows 4ty..4ty+3;
 * for scores the keys tx + 8c, for the output the dims tx + 8d, so lanes
 * of a warp hit different banks (rows are padded by one float).
 *
 * Masks: key j is seen from the query at position i iff j <= i and, with a
 * window, i - j < WINDOW. Block x takes query tile gridDim.x - 1 - x: causal
 * tiles grow with their position, so the longest are scheduled first and
 * the short ones fill the tail. Rows past the chunk's end are computed on zeros
 * and not written.
 *
 * Constants: N_HEADS, N_KV_HEADS, HEAD_DIM (multiple of 8), BLOCK_SIZE,
 * WINDOW (0 = none). Launch: grid (ceil(max_q_len/64), N_HEADS, B), block
 * 128, dynamic shared memory kiln_attn_prefill_smem bytes:
 * 4 * (64*(HEAD_DIM+1) + 2*32*(HEAD_DIM+1) + 64*33).
 */
#include "common.cuh"

#if !defined(N_HEADS) || !defined(N_KV_HEADS) || !defined(HEAD_DIM) || !defined(BLOCK_SIZE)
#error "attn_prefill.cuh needs N_HEADS, N_KV_HEADS, HEAD_DIM, BLOCK_SIZE"
#endif
#ifndef WINDOW
#define WINDOW 0
#endif
#if HEAD_DIM % 8
#error "HEAD_DIM must be a multiple of 8"
#endif

#define PF_BQ 64
#define PF_BK 32
#define PF_LOG2E 1.4426950408889634f

extern "C" __global__ void __launch_bounds__(128) kiln_attn_prefill(const kiln_attn_prefill_params p) {
    constexpr int G = N_HEADS / N_KV_HEADS;
    constexpr int QS = HEAD_DIM + 1; /* padded row strides (floats) */
    constexpr int PS = PF_BK + 1;
    constexpr int DPT = HEAD_DIM / 8; /* output dims per thread */
    extern __shared__ float smem[];
    float *q_s = smem;                /* [PF_BQ][QS] q * scale * log2e */
    float *k_s = q_s + PF_BQ * QS;    /* [PF_BK][QS] */
    float *v_s = k_s + PF_BK * QS;    /* [PF_BK][QS] */
    float *p_s = v_s + PF_BK * QS;    /* [PF_BQ][PS] probabilities of this tile */
    kiln_pdl_wait();

    const int hq = blockIdx.y, b = blockIdx.z, h = hq / G;
    const int tid = threadIdx.x, ty = tid >> 3, tx = tid & 7;
    const int qs0 = ((const int *)p.q_starts)[b];
    const int q_len = ((const int *)p.q_starts)[b + 1] - qs0;
    const int qi0 = (gridDim.x - 1 - blockIdx.x) * PF_BQ; /* the longest (latest) tiles start first */
    if (qi0 >= q_len) return;
    const int L = ((const int *)p.seq_lens)[b];
    const int ctx0 = L - q_len; /* position of the chunk's first query */
    const int nq = min(PF_BQ, q_len - qi0);
    const int p_first = ctx0 + qi0, p_last = ctx0 + qi0 + nq - 1;
    const int k_lo = WINDOW > 0 ? max(0, p_first - WINDOW + 1) : 0;
    const int *bt = (const int *)p.block_tables + (size_t)b * p.max_blocks;
    const kiln_elem *kc = (const kiln_elem *)p.k_cache, *vc = (const kiln_elem *)p.v_cache;

    const float qscale = p.scale * PF_LOG2E;
    for (int i = tid; i < PF_BQ * HEAD_DIM; i += 128) {
        const int r = i / HEAD_DIM, d = i % HEAD_DIM;
        float v = 0.0f;
        if (r < nq) v = kiln_e2f(((const kiln_elem *)p.q)[((size_t)(qs0 + qi0 + r) * N_HEADS + hq) * HEAD_DIM + d]);
        q_s[r * QS + d] = v * qscale;
    }

    float m[4], l[4], acc[4][DPT];
#pragma unroll
    for (int r = 0; r < 4; r++) {
        m[r] = KILN_NEG_INF;
        l[r] = 0.0f;
#pragma unroll
        for (int d = 0; d < DPT; d++) acc[r][d] = 0.0f;
    }

    for (int kt = k_lo; kt <= p_last; kt += PF_BK) {
        __syncthreads(); /* the previous tile's k_s, v_s, p_s are no longer read */
        for (int i = tid; i < PF_BK * HEAD_DIM; i += 128) {
            const int c = i / HEAD_DIM, d = i % HEAD_DIM, t = kt + c;
            float kv = 0.0f, vv = 0.0f;
            if (t <= p_last) {
                const size_t at = kiln_kv_at(bt[t / BLOCK_SIZE], h, t % BLOCK_SIZE, d);
#if KILN_KV8
                (void)kc, (void)vc;
                kv = kiln_kv_get8((const void *)p.k_cache, at, kiln_kv_scale(p.kv_scale, h));
                vv = kiln_kv_get8((const void *)p.v_cache, at, kiln_kv_scale(p.kv_scale, N_KV_HEADS + h));
#else
                kv = kiln_e2f(kc[at]);
                vv = kiln_e2f(vc[at]);
#endif
            }
            k_s[c * QS + d] = kv;
            v_s[c * QS + d] = vv;
        }
        __syncthreads();

        float s[4][4];
#pragma unroll
        for (int r = 0; r < 4; r++)
#pragma unroll
            for (int c = 0; c < 4; c++) s[r][c] = 0.0f;
        for (int d = 0; d < HEAD_DIM; d++) {
            float qv[4], kv[4];
#pragma unroll
            for (int r = 0; r < 4; r++) qv[r] = q_s[(ty * 4 + r) * QS + d];
#pragma unroll
            for (int c = 0; c < 4; c++) kv[c] = k_s[(tx + 8 * c) * QS + d];
#pragma unroll
            for (int r = 0; r < 4; r++)
#pragma unroll
                for (int c = 0; c < 4; c++) s[r][c] = fmaf(qv[r], kv[c], s[r][c]);
        }
#pragma unroll
        for (int r = 0; r < 4; r++) {
            const int row = ty * 4 + r, qpos = ctx0 + qi0 + row;
            float tmax = KILN_NEG_INF;
#pragma unroll
            for (int c = 0; c < 4; c++) {
                const int key = kt + tx + 8 * c;
                const bool ok = row < nq && key <= qpos && (WINDOW == 0 || qpos - key < WINDOW);
                if (!ok) s[r][c] = KILN_NEG_INF;
                tmax = fmaxf(tmax, s[r][c]);
            }
            /* the 8 lanes sharing ty are consecutive */
            tmax = fmaxf(tmax, __shfl_xor_sync(KILN_FULL_MASK, tmax, 1));
            tmax = fmaxf(tmax, __shfl_xor_sync(KILN_FULL_MASK, tmax, 2));
            tmax = fmaxf(tmax, __shfl_xor_sync(KILN_FULL_MASK, tmax, 4));
            const float m_new = fmaxf(m[r], tmax);
            /* a row that has seen no key yet keeps m = -inf and p = 0 */
            const float alpha = m_new == KILN_NEG_INF ? 1.0f : exp2f(m[r] - m_new);
            float rs = 0.0f;
#pragma unroll
            for (int c = 0; c < 4; c++) {
                const float pr = s[r][c] == KILN_NEG_INF ? 0.0f : exp2f(s[r][c] - m_new);
                p_s[row * PS + tx + 8 * c] = pr;
                rs += pr;
            }
            rs += __shfl_xor_sync(KILN_FULL_MASK, rs, 1);
            rs += __shfl_xor_sync(KILN_FULL_MASK, rs, 2);
            rs += __shfl_xor_sync(KILN_FULL_MASK, rs, 4);
            l[r] = l[r] * alpha + rs;
            m[r] = m_new;
#pragma unroll
            for (int d = 0; d < DPT; d++) acc[r][d] *= alpha;
        }
        __syncthreads();
        for (int c = 0; c < PF_BK; c++) {
            float pr[4];
#pragma unroll
            for (int r = 0; r < 4; r++) pr[r] = p_s[(ty * 4 + r) * PS + c];
#pragma unroll
            for (int d = 0; d < DPT; d++) {
                const float vv = v_s[c * QS + tx + 8 * d];
#pragma unroll
                for (int r = 0; r < 4; r++) acc[r][d] = fmaf(pr[r], vv, acc[r][d]);
            }
        }
    }
#pragma unroll
    for (int r = 0; r < 4; r++) {
        const int row = ty * 4 + r;
        if (row >= nq) continue;
        kiln_elem *o = (kiln_elem *)p.out + ((size_t)(qs0 + qi0 + row) * N_HEADS + hq) * HEAD_DIM;
        const float inv = l[r] > 0.0f ? 1.0f / l[r] : 0.0f;
#pragma unroll
        for (int d = 0; d < DPT; d++) o[tx + 8 * d] = kiln_f2e(acc[r][d] * inv);
    }
}

/* ------------------------------------------------------------------------
 * kiln_attn_prefill_mma, kiln_attn_prefill_mma16 — the same contract on
 * tensor cores (mma.sync m16n8k16, bf16 in, fp32 accumulate),
 * FlashAttention-2 style; one body, kiln_pf_mma_body<MT>.
 *
 * A block of PF_MMA_WARPS warps takes 16 * MT * PF_MMA_WARPS queries of one
 * head (each warp 16 * MT of them: MT = 2 in _mma, 1 in _mma16) and walks
 * key tiles of PF_MMA_BK = 64. Per warp: q is pre-scaled by scale*log2(e)
 * and rounded to bf16 once; with MT 1 it stays in registers as A fragments,
 * with MT 2 (64 registers) the block stages it in shared memory and each
 * k-step reads the A fragments by ldmatrix.x4, so every K and V B fragment
 * feeds the mmas of both m-tiles (half the B loads per mma, and half the
 * staged K/V per query). S = q k^T for a tile is 8 n-tiles of C fragments
 * per m-tile; the online softmax runs on those registers (a row lives in the
 * 4 lanes of one quad); P is packed to bf16 A fragments of O += P v before
 * the barrier that waits for V (half of S's registers across it: MT 2
 * spilled without this).
 *
 * K and V tiles are staged in shared memory as [key][d] (the cache's own
 * layout: a KV block of one head is BLOCK_SIZE contiguous rows), by 16-byte
 * cp.async.cg, two stages: the next tile's K and V are issued right after
 * the one barrier per tile (which frees their buffer) and are in flight
 * while the current one is computed; the tile's own K and V, issued a whole
 * tile earlier, are waited for together before that barrier (PF_MMA_SYNCS 2:
 * K and V in separate groups, so S = q k^T starts before V has landed, and a
 * second barrier before O += P v). Keys past the last query are zero-filled (a masked
 * p of 0 times garbage could be NaN). Rows are padded by 8 bf16 (16 bytes),
 * so the 8 rows an ldmatrix phase reads start 4 banks apart: no conflicts
 * for any HEAD_DIM % 16 == 0. B fragments come from ldmatrix.x4 (K) and
 * ldmatrix.x4.trans (V: [key][d] read as [d][key]), two n-tiles per load.
 *
 * Masks: tiles are aligned to multiples of 64 keys; a warp evaluates the
 * causal/window mask only on a tile that crosses its rows' diagonal or
 * window edge, and skips a tile none of its rows sees (it still joins the
 * block's barriers). A row that has seen no key keeps m = -inf; the
 * exponentials then use 0 as the reference, which gives p = 0 and alpha = 0
 * without a test per element. Rows past the chunk's end repeat the last
 * query (so they never see nothing) and are not written.
 *
 * Block ids: lane l holds the block table entry of the l-th KV block the
 * tile touches, loaded one tile ahead; a chunk takes its row's by a shuffle
 * (BLOCK_SIZE 1 and 2, where a tile spans over 32 blocks, load per chunk).
 *
 * With KILN_KV8 (an 8-bit cache) each thread copies 16-code chunks of K and
 * V into raw buffers after q_s and, once its own copies have landed, widens
 * them into the bf16 tiles (exact), before the tile's barrier; K's scale is
 * folded into q and V's into the output (the f32-FMA kernel above multiplies
 * each element by its scale instead).
 * Needs HEAD_DIM % 16 == 0 and bf16 (not KILN_F32). Launch (kernels.c,
 * kiln_attn_prefill_mma_dims): grid (ceil(max_q_len / (16 * MT *
 * PF_MMA_WARPS)), N_HEADS, B), block 32 * PF_MMA_WARPS, dynamic shared
 * memory kiln_attn_prefill_mma_smem = 2 stages x (K + V) x 64 x
 * (HEAD_DIM + 8) x 2 bytes, plus with MT 2 the q rows, 32 * PF_MMA_WARPS x
 * (HEAD_DIM + 8) x 2 (69,632 and 104,448 for HEAD_DIM 128 and 4 warps: over
 * 48 KiB, so the launch opts in).
 * ---------------------------------------------------------------------- */
#if HEAD_DIM % 16 == 0 && !KILN_F32

#ifndef PF_MMA_WARPS
#define PF_MMA_WARPS 4 /* must match KILN_PF_MMA_WARPS in runtime/cuda/kernels.c */
#endif
#define PF_MMA_BK 64
/* Block barriers per key tile: 1 waits for the tile's K and V together at its start (they were
 * issued a whole tile earlier); 2, the previous scheme, lets S = q k^T start before V has landed
 * at the cost of a second barrier before O += P v. Kept selectable for the benchmark. */
#ifndef PF_MMA_SYNCS
#define PF_MMA_SYNCS 1
#endif
#if KILN_KV8 && PF_MMA_SYNCS != 1
#error "an 8-bit KV cache stages K and V together (PF_MMA_SYNCS 1)"
#endif

KILN_DEV void kiln_pf_mma(float (&d)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
                 "{%8, %9}, {%0, %1, %2, %3};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* 2^x by the MUFU unit directly; results below 2^-126 flush to 0 (exp2f adds a denormal fix-up,
 * three more instructions per element, for probabilities that small). */
KILN_DEV float kiln_pf_exp2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

KILN_DEV void kiln_pf_ldsm4(unsigned (&r)[4], unsigned addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}
KILN_DEV void kiln_pf_ldsm4t(unsigned (&r)[4], unsigned addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}

extern __shared__ uint4 smem_pf[];

/* The kernel body, for MT m16 tiles (16 * MT query rows) per warp; see the comment above. */
template <int MT> KILN_DEV void kiln_pf_mma_body(const kiln_attn_prefill_params &p) {
    constexpr int G = N_HEADS / N_KV_HEADS;
    constexpr int THREADS = 32 * PF_MMA_WARPS, WR = 16 * MT, BQ = WR * PF_MMA_WARPS, BK = PF_MMA_BK;
    constexpr bool QREG = MT == 1;           /* q A fragments in registers, else ldmatrix from q_s */
    constexpr int RS = HEAD_DIM + 8;         /* staged row stride (bf16): 16 bytes of padding */
    constexpr int CH = HEAD_DIM / 8;         /* 16-byte chunks per row */
    constexpr int TILE = BK * RS;            /* bf16 per staged tile */
    constexpr int LOADS = (BK * CH + THREADS - 1) / THREADS; /* chunks per thread per tile */
    constexpr int DK = HEAD_DIM / 16;        /* mma k-steps over the head dim */
    constexpr int NT = BK / 8;               /* key n-tiles of S */
    constexpr int DT = HEAD_DIM / 8;         /* output n-tiles (even: HEAD_DIM % 16 == 0) */
    kiln_bf16 *k_s = (kiln_bf16 *)smem_pf;  /* [2][BK][RS] */
    kiln_bf16 *v_s = k_s + 2 * TILE;         /* [2][BK][RS] */
    kiln_bf16 *q_s = v_s + 2 * TILE;         /* [BQ][RS] q * scale * log2(e), only when !QREG */
    /* KILN_KV8: the codes as they come, [2 (K, V)][2][BK][HEAD_DIM] bytes after q_s (its room is
     * counted either way), widened into k_s / v_s by the thread that copied them */
#if KILN_KV8
    unsigned char *raw = (unsigned char *)(q_s + BQ * RS);
#endif
    kiln_pdl_wait();

    const int hq = blockIdx.y, b = blockIdx.z, h = hq / G;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
    const int qs0 = ((const int *)p.q_starts)[b];
    const int q_len = ((const int *)p.q_starts)[b + 1] - qs0;
    const int qi0 = (gridDim.x - 1 - blockIdx.x) * BQ; /* the longest (latest) tiles start first */
    if (qi0 >= q_len) return;
    const int L = ((const int *)p.seq_lens)[b];
    const int nq = min(BQ, q_len - qi0);
    const int p_first = L - q_len + qi0, p_last = p_first + nq - 1; /* positions of the block's queries */
    const int k_lo = WINDOW > 0 ? max(0, p_first - WINDOW + 1) : 0;
    const int kt0 = k_lo / BK * BK, n_tiles = p_last / BK - k_lo / BK + 1;
    const int *bt = (const int *)p.block_tables + (size_t)b * p.max_blocks;
    const kiln_bf16 *kc = (const kiln_bf16 *)p.k_cache, *vc = (const kiln_bf16 *)p.v_cache;

    /* KV block ids: lane l holds the block table entry of the l-th block a tile touches (a tile
     * starting at kt touches at most NBT blocks, from kt / BLOCK_SIZE on), loaded a tile ahead
     * of its use; each chunk takes its row's id by a shuffle. */
    constexpr int NBT = (BK + BLOCK_SIZE - 1) / BLOCK_SIZE + 1; /* BLOCK_SIZE 1, 2: > 32, loaded per chunk */
    const int b_last = p_last / BLOCK_SIZE;
    auto block_ids = [&](int kt) {
        const int i = kt / BLOCK_SIZE + lane;
        return NBT <= 32 && lane < NBT && i <= b_last ? bt[i] : 0;
    };
    /* Stage the K and V tile starting at key kt (its block ids in `ids`) into buffer `st`, as one
     * cp.async group (PF_MMA_SYNCS 1) or two, K then V (2). Chunk i = tid + j * THREADS of a tile is row i / CH, 16 bytes at dim
     * 8 * (i % CH): the lanes of a warp read whole 256-byte rows. */
    const unsigned ks_addr = kiln_saddr(k_s), vs_addr = kiln_saddr(v_s);
    /* Chunk i of the tile starting at key kt (its block ids in `ids`), chunks of w elements (8: 16 bytes
     * of bf16; 16: 16 bytes of codes): its row r and column chunk c, and the element offset of its first
     * element from the head's base (0 past the last query: zero-filled); false past the last key or the
     * tile. Every lane runs the shuffle. */
    auto locate = [&](int kt, int ids, int i, int w, unsigned &r, unsigned &c, size_t &off) {
        const int nch = HEAD_DIM / w;
        r = (unsigned)i / nch, c = (unsigned)i % nch;
        const unsigned key = (unsigned)kt + r;
        const bool in = (BK * nch % THREADS == 0 || i < BK * nch) && (int)key <= p_last;
        int blk;
        if constexpr (NBT <= 32)
            blk = __shfl_sync(KILN_FULL_MASK, ids, (int)(key / BLOCK_SIZE - (unsigned)kt / BLOCK_SIZE));
        else
            blk = in ? bt[key / BLOCK_SIZE] : 0;
        off = (size_t)(unsigned)blk * (N_KV_HEADS * BLOCK_SIZE * HEAD_DIM) + (key % BLOCK_SIZE) * HEAD_DIM + c * w;
        if (!in) off = 0;
        return in;
    };
#if KILN_KV8
    /* 16 codes a chunk: row i / CH8, dims 16 * (i % CH8) */
    constexpr int CH8 = HEAD_DIM / 16, LOADS8 = (BK * CH8 + THREADS - 1) / THREADS;
    const unsigned char *kh8 = (const unsigned char *)p.k_cache + (size_t)h * BLOCK_SIZE * HEAD_DIM;
    const unsigned char *vh8 = (const unsigned char *)p.v_cache + (size_t)h * BLOCK_SIZE * HEAD_DIM;
    const unsigned raw_addr = kiln_saddr(raw);
    /* this thread's chunks of the tile in raw buffer st, widened into k_s / v_s[st] (exact in bf16) */
    auto widen8 = [&](int st) {
#pragma unroll
        for (int j = 0; j < LOADS8; j++) {
            const int i = tid + j * THREADS;
            if (BK * CH8 % THREADS != 0 && i >= BK * CH8) continue;
            const int r = i / CH8, c = i % CH8;
#pragma unroll
            for (int kv = 0; kv < 2; kv++) {
                const uint4 w = *(const uint4 *)(raw + ((kv * 2 + st) * BK + r) * HEAD_DIM + c * 16);
                const unsigned ws[4] = {w.x, w.y, w.z, w.w};
                float f[16];
#pragma unroll
                for (int q = 0; q < 4; q++) {
                    float g4[4];
                    kiln_kv_dec4(ws[q], g4);
#pragma unroll
                    for (int e = 0; e < 4; e++) f[4 * q + e] = g4[e];
                }
                kiln_bf16 *dst = (kv ? v_s : k_s) + st * TILE + r * RS + c * 16;
                *(uint4 *)dst = kiln_pack8(f);
                *(uint4 *)(dst + 8) = kiln_pack8(f + 8);
            }
        }
    };
#endif
    const kiln_bf16 *kh = kc + (size_t)h * BLOCK_SIZE * HEAD_DIM, *vh = vc + (size_t)h * BLOCK_SIZE * HEAD_DIM;
    auto stage = [&](int kt, int st, int ids) {
#if KILN_KV8
        /* the codes into raw buffer st, one cp.async group: widened after the wait (widen8) */
#pragma unroll
        for (int j = 0; j < LOADS8; j++) {
            size_t off;
            unsigned r, c;
            const bool in = locate(kt, ids, tid + j * THREADS, 16, r, c, off);
            if (BK * CH8 % THREADS == 0 || tid + j * THREADS < BK * CH8) {
                const unsigned d = (unsigned)((st * BK + r) * HEAD_DIM + c * 16);
                kiln_cp16(raw_addr + d, kh8 + off, in ? 16 : 0);
                kiln_cp16(raw_addr + (unsigned)(2 * BK * HEAD_DIM) + d, vh8 + off, in ? 16 : 0);
            }
        }
        kiln_cp_commit();
        return;
#endif
        /* chunk j of this thread: the global offset (0 past the last query: zero-filled) and the
         * byte offset in shared memory; false past the last key or the tile */
        auto chunk = [&](int j, size_t &off, unsigned &dst) {
            unsigned r, c;
            const bool in = locate(kt, ids, tid + j * THREADS, 8, r, c, off);
            dst = (unsigned)((st * TILE + r * RS + c * 8) * 2);
            return in;
        };
        if constexpr (PF_MMA_SYNCS == 1) {
            /* one group: K and V of a chunk from the same offsets, nothing held across */
#pragma unroll
            for (int j = 0; j < LOADS; j++) {
                size_t off;
                unsigned dst;
                const bool in = chunk(j, off, dst);
                if (BK * CH % THREADS == 0 || tid + j * THREADS < BK * CH) {
                    kiln_cp16(ks_addr + dst, kh + off, in ? 16 : 0);
                    kiln_cp16(vs_addr + dst, vh + off, in ? 16 : 0);
                }
            }
            kiln_cp_commit();
        } else {
            size_t off[LOADS];
            bool in[LOADS];
            unsigned dst[LOADS];
#pragma unroll
            for (int j = 0; j < LOADS; j++) in[j] = chunk(j, off[j], dst[j]);
#pragma unroll
            for (int j = 0; j < LOADS; j++)
                if (BK * CH % THREADS == 0 || tid + j * THREADS < BK * CH) kiln_cp16(ks_addr + dst[j], kh + off[j], in[j] ? 16 : 0);
            kiln_cp_commit();
#pragma unroll
            for (int j = 0; j < LOADS; j++)
                if (BK * CH % THREADS == 0 || tid + j * THREADS < BK * CH) kiln_cp16(vs_addr + dst[j], vh + off[j], in[j] ? 16 : 0);
            kiln_cp_commit();
        }
    };
    stage(kt0, 0, block_ids(kt0));
    int ids_next = n_tiles > 1 ? block_ids(kt0 + BK) : 0; /* for the tile staged in iteration 0 */

    /* This warp's rows: m-tile mt holds rows w0 + 16 mt + g and + 8 (clamped to the last query,
     * see above), at positions qpos[mt][0], qpos[mt][1]. */
    const int w0 = warp * WR;
    const bool live = w0 < nq;
    int qpos[MT][2];
#pragma unroll
    for (int mt = 0; mt < MT; mt++) {
        qpos[mt][0] = p_first + min(w0 + 16 * mt + g, nq - 1);
        qpos[mt][1] = p_first + min(w0 + 16 * mt + g + 8, nq - 1);
    }
    const int wq_first = p_first + min(w0, nq - 1), wq_last = p_first + min(w0 + WR - 1, nq - 1);

    /* q pre-scaled by scale*log2(e), rounded to bf16 once: as A fragments in registers (MT 1), or
     * staged in q_s (row r: query min(r, nq - 1)) and read by ldmatrix at each k-step (MT 2:
     * 32 rows x HEAD_DIM would take 64 registers). */
    /* an 8-bit cache's K scale folds into q, its V scale into the output (at the end) */
    const float qsc = p.scale * PF_LOG2E * (KILN_KV8 ? kiln_kv_scale(p.kv_scale, h) : 1.0f);
    const float vsc = KILN_KV8 ? kiln_kv_scale(p.kv_scale, N_KV_HEADS + h) : 1.0f;
    const kiln_bf16 *qg = (const kiln_bf16 *)p.q;
    unsigned qa[QREG ? DK : 1][4];
    if constexpr (QREG) {
        const kiln_bf16 *q0 = qg + ((size_t)(qs0 + qpos[0][0] - p_first + qi0) * N_HEADS + hq) * HEAD_DIM;
        const kiln_bf16 *q1 = qg + ((size_t)(qs0 + qpos[0][1] - p_first + qi0) * N_HEADS + hq) * HEAD_DIM;
#pragma unroll
        for (int kk = 0; kk < DK; kk++) {
            const int d = kk * 16 + 2 * t;
            const unsigned w00 = *(const unsigned *)(q0 + d), w10 = *(const unsigned *)(q1 + d);
            const unsigned w01 = *(const unsigned *)(q0 + d + 8), w11 = *(const unsigned *)(q1 + d + 8);
            qa[kk][0] = kiln_f2bf2(kiln_lo(w00) * qsc, kiln_hi(w00) * qsc);
            qa[kk][1] = kiln_f2bf2(kiln_lo(w10) * qsc, kiln_hi(w10) * qsc);
            qa[kk][2] = kiln_f2bf2(kiln_lo(w01) * qsc, kiln_hi(w01) * qsc);
            qa[kk][3] = kiln_f2bf2(kiln_lo(w11) * qsc, kiln_hi(w11) * qsc);
        }
    } else {
        /* visible to ldmatrix after the first iteration's barrier */
        for (int i = tid; i < BQ * CH; i += THREADS) {
            const int r = i / CH, c = i % CH;
            float f[8];
            kiln_unpack8(kiln_ld16(qg + ((size_t)(qs0 + qi0 + min(r, nq - 1)) * N_HEADS + hq) * HEAD_DIM + c * 8), f);
#pragma unroll
            for (int e = 0; e < 8; e++) f[e] *= qsc;
            *(uint4 *)(q_s + r * RS + c * 8) = kiln_pack8(f);
        }
    }
    float o[MT][DT][4], m[MT][2], l[MT][2];
#pragma unroll
    for (int mt = 0; mt < MT; mt++) {
#pragma unroll
        for (int i = 0; i < DT; i++) o[mt][i][0] = o[mt][i][1] = o[mt][i][2] = o[mt][i][3] = 0.0f;
        m[mt][0] = m[mt][1] = KILN_NEG_INF;
        l[mt][0] = l[mt][1] = 0.0f;
    }

    /* Per-lane byte offsets of the ldmatrix row addresses. Matrix j = lane / 8 of an x4:
     * K: n-tile +j/2, dims +8*(j%2) (b0, b1 of two n-tiles); V (.trans): keys +8*(j%2),
     * dims +8*(j/2) (b0, b1 of two output n-tiles); q: rows +8*(j%2), dims +8*(j/2) (a0..a3). */
    const unsigned k_lane = (unsigned)((((lane >> 4) * 8 + (lane & 7)) * RS + ((lane >> 3) & 1) * 8) * 2);
    const unsigned v_lane = (unsigned)(((((lane >> 3) & 1) * 8 + (lane & 7)) * RS + (lane >> 4) * 8) * 2);
    const unsigned qw_addr = kiln_saddr(q_s) + (unsigned)(w0 * RS * 2) + v_lane;

    for (int it = 0; it < n_tiles; it++) {
        const int kt = kt0 + it * BK, st = it & 1;
        /* this thread's K (and with one barrier V) chunks of tile `it` have landed; after the
         * barrier everyone's have, and tile it-1 is fully read, so its buffer is free */
        if constexpr (PF_MMA_SYNCS == 1)
            kiln_cp_wait<0>();
        else
            kiln_cp_wait<1>();
#if KILN_KV8
        widen8(st); /* k_s, v_s[st] were last read in iteration it - 2: the barrier of it - 1 is past */
#endif
        __syncthreads();
        if (it + 1 < n_tiles) {
            stage(kt + BK, st ^ 1, ids_next);
            if (it + 2 < n_tiles) ids_next = block_ids(kt + 2 * BK);
        } else {
            kiln_cp_commit(); /* empty groups keep the wait counts below the same */
            kiln_cp_commit();
        }
        /* warp-uniform: does any row of this warp see a key of the tile, and all of them? */
        const bool skip = !live || kt > wq_last || (WINDOW > 0 && kt + BK - 1 <= wq_first - WINDOW);
        const bool mask = kt + BK - 1 > wq_first || (WINDOW > 0 && kt <= wq_last - WINDOW);

        float s[MT][NT][4];
        unsigned pa[MT][BK / 16][4]; /* P as bf16 A fragments of O += P v, 16 keys per k-step */
        if (!skip) {
            /* S = q k^T: NT n-tiles of 8 keys per m-tile; one ldmatrix.x4 of K feeds two n-tiles
             * of every m-tile at one k-step */
#pragma unroll
            for (int mt = 0; mt < MT; mt++)
#pragma unroll
                for (int n = 0; n < NT; n++) s[mt][n][0] = s[mt][n][1] = s[mt][n][2] = s[mt][n][3] = 0.0f;
            const unsigned kb = ks_addr + (unsigned)(st * TILE * 2) + k_lane;
#pragma unroll
            for (int kk = 0; kk < DK; kk++) {
                unsigned a[MT][4];
#pragma unroll
                for (int mt = 0; mt < MT; mt++) {
                    if constexpr (QREG) {
#pragma unroll
                        for (int e = 0; e < 4; e++) a[mt][e] = qa[kk][e];
                    } else {
                        kiln_pf_ldsm4(a[mt], qw_addr + (unsigned)((mt * 16 * RS + kk * 16) * 2));
                    }
                }
#pragma unroll
                for (int n = 0; n < NT; n += 2) {
                    unsigned bf[4];
                    kiln_pf_ldsm4(bf, kb + (unsigned)((n * 8 * RS + kk * 16) * 2));
#pragma unroll
                    for (int mt = 0; mt < MT; mt++) {
                        kiln_pf_mma(s[mt][n], a[mt], bf[0], bf[1]);
                        kiln_pf_mma(s[mt][n + 1], a[mt], bf[2], bf[3]);
                    }
                }
            }
#pragma unroll
            for (int mt = 0; mt < MT; mt++) {
                if (mask) {
#pragma unroll
                    for (int n = 0; n < NT; n++)
#pragma unroll
                        for (int e = 0; e < 2; e++) {
                            const int key = kt + n * 8 + 2 * t + e;
                            const int q0 = qpos[mt][0], q1 = qpos[mt][1];
                            if (key > q0 || (WINDOW > 0 && q0 - key >= WINDOW)) s[mt][n][e] = KILN_NEG_INF;
                            if (key > q1 || (WINDOW > 0 && q1 - key >= WINDOW)) s[mt][n][2 + e] = KILN_NEG_INF;
                        }
                }
                /* online softmax; a row is spread over the 4 lanes of a quad */
                float tm0 = KILN_NEG_INF, tm1 = KILN_NEG_INF;
#pragma unroll
                for (int n = 0; n < NT; n++) {
                    tm0 = fmaxf(tm0, fmaxf(s[mt][n][0], s[mt][n][1]));
                    tm1 = fmaxf(tm1, fmaxf(s[mt][n][2], s[mt][n][3]));
                }
                tm0 = fmaxf(tm0, __shfl_xor_sync(KILN_FULL_MASK, tm0, 1));
                tm0 = fmaxf(tm0, __shfl_xor_sync(KILN_FULL_MASK, tm0, 2));
                tm1 = fmaxf(tm1, __shfl_xor_sync(KILN_FULL_MASK, tm1, 1));
                tm1 = fmaxf(tm1, __shfl_xor_sync(KILN_FULL_MASK, tm1, 2));
                const float mn0 = fmaxf(m[mt][0], tm0), mn1 = fmaxf(m[mt][1], tm1);
                /* reference point: the new max, or 0 for a row that has seen nothing (exp2(-inf) = 0) */
                const float r0 = mn0 == KILN_NEG_INF ? 0.0f : mn0, r1 = mn1 == KILN_NEG_INF ? 0.0f : mn1;
                const float al0 = kiln_pf_exp2(m[mt][0] - r0), al1 = kiln_pf_exp2(m[mt][1] - r1);
                float rs0 = 0.0f, rs1 = 0.0f;
#pragma unroll
                for (int n = 0; n < NT; n++) {
                    s[mt][n][0] = kiln_pf_exp2(s[mt][n][0] - r0);
                    s[mt][n][1] = kiln_pf_exp2(s[mt][n][1] - r0);
                    s[mt][n][2] = kiln_pf_exp2(s[mt][n][2] - r1);
                    s[mt][n][3] = kiln_pf_exp2(s[mt][n][3] - r1);
                    rs0 += s[mt][n][0] + s[mt][n][1];
                    rs1 += s[mt][n][2] + s[mt][n][3];
                }
                rs0 += __shfl_xor_sync(KILN_FULL_MASK, rs0, 1);
                rs0 += __shfl_xor_sync(KILN_FULL_MASK, rs0, 2);
                rs1 += __shfl_xor_sync(KILN_FULL_MASK, rs1, 1);
                rs1 += __shfl_xor_sync(KILN_FULL_MASK, rs1, 2);
                l[mt][0] = l[mt][0] * al0 + rs0;
                l[mt][1] = l[mt][1] * al1 + rs1;
                m[mt][0] = mn0;
                m[mt][1] = mn1;
#pragma unroll
                for (int i = 0; i < DT; i++) {
                    o[mt][i][0] *= al0;
                    o[mt][i][1] *= al0;
                    o[mt][i][2] *= al1;
                    o[mt][i][3] *= al1;
                }
                /* packed before the barrier: half the registers of s across it */
#pragma unroll
                for (int kk = 0; kk < BK / 16; kk++) {
                    pa[mt][kk][0] = kiln_f2bf2(s[mt][2 * kk][0], s[mt][2 * kk][1]);
                    pa[mt][kk][1] = kiln_f2bf2(s[mt][2 * kk][2], s[mt][2 * kk][3]);
                    pa[mt][kk][2] = kiln_f2bf2(s[mt][2 * kk + 1][0], s[mt][2 * kk + 1][1]);
                    pa[mt][kk][3] = kiln_f2bf2(s[mt][2 * kk + 1][2], s[mt][2 * kk + 1][3]);
                }
            }
        }
        if constexpr (PF_MMA_SYNCS == 2) {
            kiln_cp_wait<2>(); /* this thread's V chunks of tile `it` have landed (the next tile's may not) */
            __syncthreads();
        } else {
            __syncwarp(); /* keeps ptxas from hoisting V's ldmatrix into the softmax: 255 registers and spills without */
        }
        if (!skip) {
            /* O += P v, 16 keys per k-step; one ldmatrix.x4.trans feeds two output n-tiles of
             * every m-tile */
            const unsigned vb = vs_addr + (unsigned)(st * TILE * 2) + v_lane;
#pragma unroll
            for (int kk = 0; kk < BK / 16; kk++) {
#pragma unroll
                for (int i = 0; i < DT; i += 2) {
                    unsigned bf[4];
                    kiln_pf_ldsm4t(bf, vb + (unsigned)((kk * 16 * RS + i * 8) * 2));
#pragma unroll
                    for (int mt = 0; mt < MT; mt++) {
                        kiln_pf_mma(o[mt][i], pa[mt][kk], bf[0], bf[1]);
                        kiln_pf_mma(o[mt][i + 1], pa[mt][kk], bf[2], bf[3]);
                    }
                }
            }
        }
    }
    kiln_cp_wait<0>(); /* nothing may be in flight when the block exits */
    if (!live) return;
    kiln_bf16 *out = (kiln_bf16 *)p.out;
#pragma unroll
    for (int mt = 0; mt < MT; mt++) {
        const float inv0 = l[mt][0] > 0.0f ? vsc / l[mt][0] : 0.0f, inv1 = l[mt][1] > 0.0f ? vsc / l[mt][1] : 0.0f;
        const int r0 = w0 + 16 * mt + g, r1 = r0 + 8;
#pragma unroll
        for (int i = 0; i < DT; i++) {
            const int d = i * 8 + 2 * t;
            if (r0 < nq)
                *(unsigned *)(out + ((size_t)(qs0 + qi0 + r0) * N_HEADS + hq) * HEAD_DIM + d) =
                    kiln_f2bf2(o[mt][i][0] * inv0, o[mt][i][1] * inv0);
            if (r1 < nq)
                *(unsigned *)(out + ((size_t)(qs0 + qi0 + r1) * N_HEADS + hq) * HEAD_DIM + d) =
                    kiln_f2bf2(o[mt][i][2] * inv1, o[mt][i][3] * inv1);
        }
    }
}

/* 32 query rows per warp (the runtime's choice where it exists and its shared memory fits; not
 * above HEAD_DIM 128, where O alone would take 256 registers), and 16 (the previous kernel: q in
 * registers, no q_s). */
#if HEAD_DIM <= 128
extern "C" __global__ void __launch_bounds__(PF_MMA_WARPS * 32) kiln_attn_prefill_mma(const kiln_attn_prefill_params p) {
    kiln_pf_mma_body<2>(p);
}
#endif
extern "C" __global__ void __launch_bounds__(PF_MMA_WARPS * 32) kiln_attn_prefill_mma16(const kiln_attn_prefill_params p) {
    kiln_pf_mma_body<1>(p);
}

/* ------------------------------------------------------------------------
 * kiln_attn_prefill_wg — the same contract on Hopper's warpgroup MMA
 * (wgmma.mma_async, sm_90a; NVRTC compiles sm_90 cubins as sm_90a, and
 * the kernel exists only there): FlashAttention-2's loop with both products
 * on wgmma, S = q k^T from shared memory (q and K as descriptors) and
 * O += P v with P straight from S's registers.
 *
 * A block of PF_WG_GROUPS warpgroups (128 threads each) takes 64 *
 * PF_WG_GROUPS queries of one head; each warpgroup owns 64 of them and
 * walks key tiles of PF_WG_BK = 128. Per tile and warpgroup: S (64 x 128
 * fp32, 64 registers a thread) is HEAD_DIM / 16 wgmma m64n128k16 from q_s
 * and the tile's K; the online softmax runs on S's registers as in the
 * mma.sync kernel (wgmma's accumulator rows are mma.sync's: warp w of the
 * group holds rows 16w + g and 16w + g + 8, lane quad t columns 8n + 2t,
 * 8n + 2t + 1 of each n8 chunk); P is packed to bf16 A fragments in
 * registers, which is wgmma's A-from-registers layout; O (64 x HEAD_DIM)
 * += 8 wgmma m64n{HEAD_DIM}k16 reading V as a transposed (MN-major) B.
 * Pipelined within a group (FlashAttention-3's intra-warpgroup overlap):
 * at tile j, S of j and P v of j - 1 are issued together, the softmax of j
 * runs while P v of j - 1 does, and P v of the last tile comes after the
 * loop; O's rescale by the softmax of j - 1 comes just before P v of j - 1.
 * Each group waits for its own wgmmas before it touches their registers.
 *
 * Shared memory holds every tile in the 128-byte swizzle wgmma reads: a
 * tile of R rows is HEAD_DIM / 64 panels of [R][64] bf16 (128 bytes a
 * row), panels 1024-byte aligned, and the 16-byte chunk c of row r sits at
 * chunk c ^ (r & 7) of its row (kiln_wg_swz). K and V share the layout
 * ([key][d], the cache's own): K is S's B operand K-major (the dims
 * contiguous), V is O's B operand MN-major (d contiguous), so one copy
 * serves both. Descriptors: K-major (q, K) leading offset unused, stride
 * 1024 (8 rows of 128 bytes), a k16 step 32 bytes further in the panel and
 * past 64 dims the next panel; MN-major (V) leading offset one panel (R
 * rows x 128 bytes: the next 64 dims), stride 1024 (the next 8 keys), a
 * k16 step 16 rows (2048 bytes) further.
 *
 * Loads: q once (scaled by scale * log2(e), rounded to bf16, swizzled by
 * plain stores), K and V by 16-byte cp.async as the mma.sync kernel
 * stages them (block ids a tile ahead, zero fill past the last query) into
 * PF_WG_STAGES = 3 stages (tile j + 1 loading while j is multiplied and
 * j - 1's V is still read by P v), then fence.proxy.async so wgmma (the
 * async proxy) sees the generic proxy's writes, and one barrier per tile.
 * Masks as in the mma.sync kernel; every group walks every tile of its
 * block (one none of its rows sees is masked whole), so the groups meet
 * the same barriers. Not with an 8-bit cache (KILN_KV8) nor f32: those
 * keep kiln_attn_prefill_mma. Launch (kernels.c,
 * kiln_attn_prefill_wg_dims): grid (N_HEADS, ceil(max_q_len / (64 *
 * PF_WG_GROUPS)), B) — heads first, so that blocks start in the order of
 * their query tiles, the longest (causal) first over all heads, and the
 * short ones fill the tail —, block 128 * PF_WG_GROUPS, dynamic shared memory
 * kiln_attn_prefill_wg_smem = (64 * PF_WG_GROUPS + 3 stages x (K + V) x
 * PF_WG_BK) x HEAD_DIM x 2 + 1024 (the alignment): 230,400 bytes at
 * HEAD_DIM 128 (sm_90 opts in to 232,448).
 * ---------------------------------------------------------------------- */
#if defined(__CUDA_ARCH_FEAT_SM90_ALL) && (HEAD_DIM == 64 || HEAD_DIM == 128) && !KILN_F32 && !KILN_KV8
#define KILN_HAVE_PF_WG 1
#ifndef PF_WG_GROUPS
#define PF_WG_GROUPS 2 /* must match KILN_PF_WG_GROUPS in runtime/kiln_cuda.h */
#endif
#define PF_WG_BK 128
#define PF_WG_STAGES 3 /* K and V tiles in flight, in use and waiting for P v: KILN_PF_WG_STAGES */

/* byte offset of element (r, d) in a swizzled tile of `rows` rows (see above) */
KILN_DEV unsigned kiln_wg_swz(int r, int d, int rows) {
    return (unsigned)((d >> 6) * rows * 128 + r * 128 + ((((d >> 3) & 7) ^ (r & 7)) << 4) + (d & 7) * 2);
}
/* a shared-memory matrix descriptor, 128-byte swizzle */
KILN_DEV unsigned long long kiln_wg_desc(unsigned saddr, unsigned lbo, unsigned sbo) {
    return (unsigned long long)((saddr & 0x3FFFFu) >> 4) | (unsigned long long)(lbo >> 4) << 16 | (unsigned long long)(sbo >> 4) << 32 |
           (unsigned long long)1 << 62;
}
KILN_DEV void kiln_wg_fence(void) { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
KILN_DEV void kiln_wg_commit(void) { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
KILN_DEV void kiln_wg_wait0(void) { asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory"); }
KILN_DEV void kiln_wg_wait1(void) { asm volatile("wgmma.wait_group.sync.aligned 1;\n" ::: "memory"); }
KILN_DEV void kiln_fence_async_smem(void) { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }
/* keeps the compiler from moving reads or writes of wgmma's registers across the fences and waits */
template <int N> KILN_DEV void kiln_wg_regs(float (&d)[N]) {
#pragma unroll
    for (int i = 0; i < N; i++) asm volatile("" : "+f"(d[i])::"memory");
}
/* and P's registers stay P's until the wgmmas reading them are done */
template <int N> KILN_DEV void kiln_wg_pa(unsigned (&a)[N][4]) {
#pragma unroll
    for (int i = 0; i < N; i++)
#pragma unroll
        for (int e = 0; e < 4; e++) asm volatile("" : "+r"(a[i][e])::"memory");
}

/* The accumulator operands of an m64nNk16 wgmma with fp32 results: N / 2 registers a thread, d[0 ..] */
#define KILN_WG_D32                                                                    \
    "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "           \
    "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
#define KILN_WG_D64                                                                      \
    KILN_WG_D32 ", "                                                                     \
    "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "   \
    "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
#define KILN_WG_O32                                                                                           \
    "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),           \
    "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),     \
    "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),   \
    "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
#define KILN_WG_O64                                                                                           \
    KILN_WG_O32,                                                                                              \
    "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),   \
    "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),   \
    "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),   \
    "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])

/* S (+)= A · B^T, both from shared memory (K-major descriptors), m64n128k16; acc 0 overwrites S */
KILN_DEV void kiln_wg_ss_n128(float (&d)[64], unsigned long long da, unsigned long long db, int acc) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {" KILN_WG_D64 "}, %64, %65, p, 1, 1, 0, 0;\n}\n"
                 : KILN_WG_O64
                 : "l"(da), "l"(db), "r"(acc));
}

/* O += A · B, A from registers (a), B from shared memory MN-major (the transposed descriptor), m64n128k16
 * and m64n64k16 */
KILN_DEV void kiln_wg_rs(float (&d)[64], const unsigned (&a)[4], unsigned long long db) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {" KILN_WG_D64
                 "}, {%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"
                 : KILN_WG_O64
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db));
}
KILN_DEV void kiln_wg_rs(float (&d)[32], const unsigned (&a)[4], unsigned long long db) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {" KILN_WG_D32
                 "}, {%32, %33, %34, %35}, %36, p, 1, 1, 1;\n}\n"
                 : KILN_WG_O32
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db));
}

extern "C" __global__ void __launch_bounds__(128 * PF_WG_GROUPS, 1) kiln_attn_prefill_wg(const kiln_attn_prefill_params p) {
    constexpr int G = N_HEADS / N_KV_HEADS;
    constexpr int THREADS = 128 * PF_WG_GROUPS, BQ = 64 * PF_WG_GROUPS, BK = PF_WG_BK;
    constexpr int CH = HEAD_DIM / 8;                       /* 16-byte chunks per row */
    constexpr int TILEB = BK * HEAD_DIM * 2;               /* bytes of a staged K or V tile */
    constexpr int QB = 64 * HEAD_DIM * 2;                  /* bytes of one group's q rows */
    constexpr int LOADS = BK * CH / THREADS;               /* chunks per thread per tile */
    constexpr int NT = BK / 8, DT = HEAD_DIM / 8;          /* n8 chunks of S and of O */
    static_assert(BK * CH % THREADS == 0, "whole chunks per thread");
    kiln_pdl_wait();
    /* 1024-byte aligned: q_s [GROUPS][64 rows], then k_s [STAGES], v_s [STAGES] tiles */
    const unsigned base = (kiln_saddr(smem_pf) + 1023u) & ~1023u;
    const unsigned q_s = base, k_s = q_s + PF_WG_GROUPS * QB, v_s = k_s + PF_WG_STAGES * TILEB;
    unsigned char *gbase = (unsigned char *)smem_pf + (base - kiln_saddr(smem_pf)); /* q_s as a pointer */

    const int hq = blockIdx.x, b = blockIdx.z, h = hq / G;
    const int tid = threadIdx.x, lane = tid & 31, wg = tid >> 7, wq = (tid >> 5) & 3, g = lane >> 2, t = lane & 3;
    const int qs0 = ((const int *)p.q_starts)[b];
    const int q_len = ((const int *)p.q_starts)[b + 1] - qs0;
    const int qi0 = (gridDim.y - 1 - blockIdx.y) * BQ; /* every head's longest (latest) tiles start first */
    if (qi0 >= q_len) return;
    const int L = ((const int *)p.seq_lens)[b];
    const int nq = min(BQ, q_len - qi0);
    const int p_first = L - q_len + qi0, p_last = p_first + nq - 1;
    const int k_lo = WINDOW > 0 ? max(0, p_first - WINDOW + 1) : 0;
    const int kt0 = k_lo / BK * BK, n_tiles = p_last / BK - k_lo / BK + 1;
    const int *bt = (const int *)p.block_tables + (size_t)b * p.max_blocks;
    const kiln_bf16 *kh = (const kiln_bf16 *)p.k_cache + (size_t)h * BLOCK_SIZE * HEAD_DIM;
    const kiln_bf16 *vh = (const kiln_bf16 *)p.v_cache + (size_t)h * BLOCK_SIZE * HEAD_DIM;

    constexpr int NBT = (BK + BLOCK_SIZE - 1) / BLOCK_SIZE + 1; /* blocks a tile touches; > 32: per chunk */
    const int b_last = p_last / BLOCK_SIZE;
    auto block_ids = [&](int kt) {
        const int i = kt / BLOCK_SIZE + lane;
        return NBT <= 32 && lane < NBT && i <= b_last ? bt[i] : 0;
    };
    /* the K and V tile starting at key kt into stage st, one cp.async group */
    auto stage = [&](int kt, int st, int ids) {
#pragma unroll
        for (int j = 0; j < LOADS; j++) {
            const int i = tid + j * THREADS, r = i / CH, c = i % CH;
            const unsigned key = (unsigned)(kt + r);
            const bool in = (int)key <= p_last;
            int blk;
            if constexpr (NBT <= 32)
                blk = __shfl_sync(KILN_FULL_MASK, ids, (int)(key / BLOCK_SIZE - (unsigned)kt / BLOCK_SIZE));
            else
                blk = in ? bt[key / BLOCK_SIZE] : 0;
            const size_t off = in ? (size_t)(unsigned)blk * (N_KV_HEADS * BLOCK_SIZE * HEAD_DIM) +
                                        (key % BLOCK_SIZE) * HEAD_DIM + c * 8
                                  : 0;
            const unsigned dst = (unsigned)(st * TILEB) + kiln_wg_swz(r, c * 8, BK);
            kiln_cp16(k_s + dst, kh + off, in ? 16 : 0);
            kiln_cp16(v_s + dst, vh + off, in ? 16 : 0);
        }
        kiln_cp_commit();
    };
    stage(kt0, 0, block_ids(kt0));
    int ids_next = n_tiles > 1 ? block_ids(kt0 + BK) : 0;

    /* q * scale * log2(e) as bf16, row r of the block: query min(r, nq - 1) */
    const float qsc = p.scale * PF_LOG2E;
    const kiln_bf16 *qg = (const kiln_bf16 *)p.q;
    for (int i = tid; i < BQ * CH; i += THREADS) {
        const int r = i / CH, c = i % CH;
        float f[8];
        kiln_unpack8(kiln_ld16(qg + ((size_t)(qs0 + qi0 + min(r, nq - 1)) * N_HEADS + hq) * HEAD_DIM + c * 8), f);
#pragma unroll
        for (int e = 0; e < 8; e++) f[e] *= qsc;
        *(uint4 *)(gbase + (r >> 6) * QB + kiln_wg_swz(r & 63, c * 8, 64)) = kiln_pack8(f);
    }

    /* this thread's rows: 64 wg + 16 wq + g and + 8 of the block (clamped to the last query) */
    const int w0 = wg * 64;
    const bool live = w0 < nq;
    const int qpos0 = p_first + min(w0 + 16 * wq + g, nq - 1), qpos1 = p_first + min(w0 + 16 * wq + g + 8, nq - 1);
    const int wq_first = p_first + min(w0, nq - 1), wq_last = p_first + min(w0 + 63, nq - 1);
    const unsigned qw = q_s + (unsigned)(wg * QB);

    float o[DT * 4], m0 = KILN_NEG_INF, m1 = KILN_NEG_INF, l0 = 0.0f, l1 = 0.0f;
#pragma unroll
    for (int i = 0; i < DT * 4; i++) o[i] = 0.0f;
    unsigned pa[BK / 16][4]; /* P of the last softmax as bf16 A fragments, 16 keys a k-step */

    /* S = q k^T of the tile in stage st, issued (not waited for) */
    auto issue_s = [&](float (&s)[NT * 4], int st) {
        const unsigned kb = k_s + (unsigned)(st * TILEB);
#pragma unroll
        for (int i = 0; i < NT * 4; i++) s[i] = 0.0f; /* overwritten (scale-d 0 at the first k-step) */
        kiln_wg_fence();
#pragma unroll
        for (int kk = 0; kk < HEAD_DIM / 16; kk++) {
            const unsigned koff = (unsigned)((kk >> 2) * BK * 128 + (kk & 3) * 32);
            const unsigned qoff = (unsigned)((kk >> 2) * 64 * 128 + (kk & 3) * 32);
            kiln_wg_ss_n128(s, kiln_wg_desc(qw + qoff, 16, 1024), kiln_wg_desc(kb + koff, 16, 1024), kk);
        }
        kiln_wg_commit();
    };
    /* O *= alpha, then O += P v of the tile in stage st, issued */
    auto issue_pv = [&](float al0, float al1, int st) {
#pragma unroll
        for (int i = 0; i < DT; i++) {
            o[4 * i] *= al0;
            o[4 * i + 1] *= al0;
            o[4 * i + 2] *= al1;
            o[4 * i + 3] *= al1;
        }
        const unsigned vb = v_s + (unsigned)(st * TILEB);
        kiln_wg_regs(o);
        kiln_wg_fence();
#pragma unroll
        for (int kk = 0; kk < BK / 16; kk++)
            kiln_wg_rs(o, pa[kk], kiln_wg_desc(vb + (unsigned)(kk * 16 * 128), BK * 128, 1024)); /* n = HEAD_DIM */
        kiln_wg_commit();
    };
    /* the online softmax over S of the tile at key kt (in place: S becomes the unnormalised p); m, l
     * updated, the factor for O into al0, al1 */
    auto softmax = [&](float (&s)[NT * 4], int kt, float &al0, float &al1) {
        const bool mask = kt + BK - 1 > wq_first || (WINDOW > 0 && kt <= wq_last - WINDOW);
        if (mask) {
#pragma unroll
            for (int n = 0; n < NT; n++)
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    const int key = kt + n * 8 + 2 * t + e;
                    if (key > qpos0 || (WINDOW > 0 && qpos0 - key >= WINDOW)) s[4 * n + e] = KILN_NEG_INF;
                    if (key > qpos1 || (WINDOW > 0 && qpos1 - key >= WINDOW)) s[4 * n + 2 + e] = KILN_NEG_INF;
                }
        }
        float tm0 = KILN_NEG_INF, tm1 = KILN_NEG_INF;
#pragma unroll
        for (int n = 0; n < NT; n++) {
            tm0 = fmaxf(tm0, fmaxf(s[4 * n], s[4 * n + 1]));
            tm1 = fmaxf(tm1, fmaxf(s[4 * n + 2], s[4 * n + 3]));
        }
        tm0 = fmaxf(tm0, __shfl_xor_sync(KILN_FULL_MASK, tm0, 1));
        tm0 = fmaxf(tm0, __shfl_xor_sync(KILN_FULL_MASK, tm0, 2));
        tm1 = fmaxf(tm1, __shfl_xor_sync(KILN_FULL_MASK, tm1, 1));
        tm1 = fmaxf(tm1, __shfl_xor_sync(KILN_FULL_MASK, tm1, 2));
        const float mn0 = fmaxf(m0, tm0), mn1 = fmaxf(m1, tm1);
        /* reference point: the new max, or 0 for a row that has seen nothing (exp2(-inf) = 0) */
        const float r0 = mn0 == KILN_NEG_INF ? 0.0f : mn0, r1 = mn1 == KILN_NEG_INF ? 0.0f : mn1;
        al0 = kiln_pf_exp2(m0 - r0);
        al1 = kiln_pf_exp2(m1 - r1);
        float rs0 = 0.0f, rs1 = 0.0f;
#pragma unroll
        for (int n = 0; n < NT; n++) {
            s[4 * n] = kiln_pf_exp2(s[4 * n] - r0);
            s[4 * n + 1] = kiln_pf_exp2(s[4 * n + 1] - r0);
            s[4 * n + 2] = kiln_pf_exp2(s[4 * n + 2] - r1);
            s[4 * n + 3] = kiln_pf_exp2(s[4 * n + 3] - r1);
            rs0 += s[4 * n] + s[4 * n + 1];
            rs1 += s[4 * n + 2] + s[4 * n + 3];
        }
        rs0 += __shfl_xor_sync(KILN_FULL_MASK, rs0, 1);
        rs0 += __shfl_xor_sync(KILN_FULL_MASK, rs0, 2);
        rs1 += __shfl_xor_sync(KILN_FULL_MASK, rs1, 1);
        rs1 += __shfl_xor_sync(KILN_FULL_MASK, rs1, 2);
        l0 = l0 * al0 + rs0;
        l1 = l1 * al1 + rs1;
        m0 = mn0;
        m1 = mn1;
    };
    /* P (bf16 A fragments, 16 keys a k-step) from the p of softmax; wgmma's A-from-registers layout */
    auto pack_p = [&](const float (&s)[NT * 4]) {
#pragma unroll
        for (int n = 0; n < NT; n++) {
            pa[n >> 1][(n & 1) * 2] = kiln_f2bf2(s[4 * n], s[4 * n + 1]);
            pa[n >> 1][(n & 1) * 2 + 1] = kiln_f2bf2(s[4 * n + 2], s[4 * n + 3]);
        }
    };
    /* tile `it`'s K and V (and q) are everyone's and visible to wgmma once this returns; the loads of
     * tile it + 1 are issued into the stage that tile it - 2 left */
    auto landed = [&](int it) {
        kiln_cp_wait<0>();       /* this thread's chunks of tile `it` */
        kiln_fence_async_smem(); /* ... and, with q's stores, visible to wgmma (the async proxy) */
        __syncthreads();         /* everyone's; and every group is past tile it - 2's wgmmas */
        if (it + 1 < n_tiles) {
            stage(kt0 + (it + 1) * BK, (it + 1) % PF_WG_STAGES, ids_next);
            if (it + 2 < n_tiles) ids_next = block_ids(kt0 + (it + 2) * BK);
        }
    };

    /* Tile 0 alone; then at tile it: S of it and P v of it - 1 in flight together, the softmax of it
     * while P v runs; last, P v of the last tile. Every warpgroup walks every tile of the block (a
     * tile none of its rows sees is masked whole), so that the barriers stay matched. */
    float s[NT * 4], al0 = 1.0f, al1 = 1.0f;
    landed(0);
    issue_s(s, 0);
    kiln_wg_wait0();
    kiln_wg_regs(s);
    softmax(s, kt0, al0, al1);
    pack_p(s);
    for (int it = 1; it < n_tiles; it++) {
        landed(it);
        issue_s(s, it % PF_WG_STAGES);
        issue_pv(al0, al1, (it - 1) % PF_WG_STAGES);
        kiln_wg_wait1(); /* S of it (the older group) */
        kiln_wg_regs(s);
        softmax(s, kt0 + it * BK, al0, al1);
        kiln_wg_wait0(); /* P v of it - 1 */
        kiln_wg_regs(o);
        kiln_wg_pa(pa);
        pack_p(s);
    }
    issue_pv(al0, al1, (n_tiles - 1) % PF_WG_STAGES);
    kiln_wg_wait0();
    kiln_wg_regs(o);
    kiln_wg_pa(pa);
    kiln_cp_wait<0>(); /* nothing may be in flight when the block exits */
    if (!live) return;
    kiln_bf16 *out = (kiln_bf16 *)p.out;
    const float inv0 = l0 > 0.0f ? 1.0f / l0 : 0.0f, inv1 = l1 > 0.0f ? 1.0f / l1 : 0.0f;
    const int row0 = w0 + 16 * wq + g, row1 = row0 + 8;
#pragma unroll
    for (int i = 0; i < DT; i++) {
        const int d = i * 8 + 2 * t;
        if (row0 < nq)
            *(unsigned *)(out + ((size_t)(qs0 + qi0 + row0) * N_HEADS + hq) * HEAD_DIM + d) =
                kiln_f2bf2(o[4 * i] * inv0, o[4 * i + 1] * inv0);
        if (row1 < nq)
            *(unsigned *)(out + ((size_t)(qs0 + qi0 + row1) * N_HEADS + hq) * HEAD_DIM + d) =
                kiln_f2bf2(o[4 * i + 2] * inv1, o[4 * i + 3] * inv1);
    }
}
#endif /* sm_90a, HEAD_DIM 64 or 128, bf16 */

#endif /* HEAD_DIM % 16 == 0 && !KILN_F32 */
