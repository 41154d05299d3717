/*
 * attn_decode.cuh — decode attention: one query token per sequence against
 * its paged KV cache, GQA, optional sliding window, split along the
 * sequence (flash-decoding) with a combine step.
 *
 * Block (kv head h, sequence b, split s) handles the G = N_HEADS/N_KV_HEADS
 * query heads that share kv head h, so each K/V byte is read once, over the
 * tokens [start + s*P, start + (s+1)*P) (P = the split size) of the attended
 * range [start, L): L = seq_lens[b], start = max(0, L - WINDOW) with a
 * window (HF Mistral's rule: key j is seen from query i iff i - j < WINDOW).
 * One pass with an online softmax: a group of LPT = HEAD_DIM/KILN_VEC lanes
 * takes one token at a time (16 bytes of K and of V per lane: 8 bf16, or 4
 * fp32 with KILN_F32), ATTN_UNROLL tokens per step. Each thread streams its
 * own K and V chunks through a ring of ATTN_STAGES steps in shared memory
 * with cp.async (it reads back only what it copied, so no barrier is
 * needed), so the next ATTN_STAGES - 1 steps' loads are in flight while one
 * is computed without holding registers. Per step the group
 *   - dots each token's K with the G queries held in registers (pre-scaled
 *     by scale*log2(e), so the softmax uses exp2) and sums the U*G partial
 *     dots over its lanes by a reduce-scatter (each shuffle level sends half
 *     of the values a lane still holds; U*G - 1 shuffles in all when U*G is
 *     a multiple of LPT, against LPT's log2 per value) and a broadcast;
 *   - raises its running max m per head, rescales its sum l and its o (each
 *     lane owns KILN_VEC dims of the G heads' o) by 2^(m_old - m_new), and
 *     adds 2^(s - m) and 2^(s - m) * V.
 * No scores are stored, so a split has no length limit of its own and K and
 * V stream from HBM side by side. At the end the groups of a warp merge
 * through shuffles and the warps through shared memory, each part weighted
 * by 2^(its max - the larger max).
 * With one split the block writes the normalised output; otherwise it
 * writes unnormalised o with its (max, sum) and the splits are merged:
 * o = sum_s 2^(m_s - M) o_s / sum_s 2^(m_s - M) l_s. With p.counters the
 * last block of a (sequence, kv head) to finish does the merge (a counter
 * per pair, incremented after a fence; the last one resets it to 0), so no
 * second kernel runs; without, kiln_attn_decode_combine does it. Both use
 * the same arithmetic in the same order (the executor leaves it opt-in:
 * the serial merge in one block made the 7B step 11% slower at batch 1).
 * With p.qkv the kernel also does rope_kv's work for the new token (decode's
 * default in the executor, 6-7% faster per step): every block rotates its q
 * heads from the QKV output, the block holding the last token rotates that
 * token's k, stores k and v into the cache and reads them from shared
 * memory; the same roundings as rope_kv (kiln_rope_freq, kiln_rope_rot).
 * Latency (decode at small batch is a chain of dependent loads, not a
 * bandwidth problem): with p.qkv nothing the kernel reads from the cache was
 * written by the kernels before it in the stream, so the block ids, the
 * rope angles and the first ATTN_STAGES - 1 steps' K and V (into the ring)
 * are fetched before kiln_pdl_wait, under the QKV projection's tail. The merge (combine
 * kernel or last block) stages the split weights in shared memory and loads
 * 8 splits ahead, summing in split order, so both give the same bits
 * (kiln_attn_merge).
 *
 * With KILN_KV8 (1 FP8 E4M3, 2 int8: an 8-bit cache, attention +kv_fp8 /
 * +kv_int8) the cache holds one code per element in the same layout: a lane
 * streams 8 bytes of codes per token (cp.async.ca; kiln_kvc), widened
 * exactly (kiln_kv_dec8), p.kv_scale's K scale of the head folded into q and
 * its V scale into the output; the fused RoPE writes codes (kiln_kv_code8,
 * as rope_kv does) and keeps them in knew/vnew.
 * Constants: N_HEADS, N_KV_HEADS, HEAD_DIM (8..256 a power of two; 4..128
 * with KILN_F32), BLOCK_SIZE, WINDOW (0 = full attention), PARTITION (the
 * longest split; it sizes only the block-id list in shared memory; default
 * 512, the executor's engines use 1024), ATTN_WARPS (default 4),
 * ATTN_UNROLL (tokens per lane group and step, default 2), ATTN_STAGES
 * (steps in each thread's cp.async ring, default 4; fewer when the block's
 * shared memory would pass 48 KB: 32 KB of ring for Mistral's shapes),
 * ATTN_MINB (blocks per SM the register allocation must allow, default 0:
 * the compiler's choice). What sets the speed at batch 64 is blocks per SM
 * and the bytes each keeps in flight: at Mistral's shapes 128 registers, 4
 * blocks of 4 warps per SM (512 blocks in one wave), 3 steps of K and V in
 * flight per thread. (Before the ring, with loads into registers, depth 4
 * took 157 registers and 3 blocks per SM, and was 9% slower per 7B step than
 * the two-pass kernel before it.) docs/kernels.md run 6.
 * The split size itself is a run-time parameter (p.partition <= PARTITION): small
 * batches take short splits so that the grid fills the GPU
 * (kiln_attn_decode_partition in runtime/cuda/kernels.c). With p.partition
 * = 0 each sequence picks its own split size from its length n (the tokens
 * it attends to): the smallest multiple of 32 >= ceil(n / p.splits_want),
 * at least ceil(n / max_splits), no shorter than one step of the block's
 * lane groups (ATTN_WARPS * 32 / LPT * ATTN_UNROLL tokens, rounded up to
 * 32); one longer than PARTITION becomes ceil(n / PARTITION) splits of even
 * length (multiples of 32). So a launch whose grid was fixed in advance (a
 * CUDA graph) still splits short and long contexts well. The block ids a
 * split needs are read into shared memory first, so the K/V loads do not
 * wait on a block-table load each.
 * Launch: kiln_attn_decode grid (N_KV_HEADS, B, max_splits), block
 * ATTN_WARPS*32, dynamic shared memory kiln_attn_decode_smem bytes:
 * 4*(ATTN_WARPS*G*HEAD_DIM + 2*ATTN_WARPS*G + 2*G + PARTITION/BLOCK_SIZE + 2);
 * kiln_attn_decode_combine grid (N_HEADS, B), block HEAD_DIM rounded up to 32.
 * max_splits must be >= ceil(min(L, WINDOW or L) / partition) for every b
 * (with p.partition = 0: >= ceil(min(L, WINDOW or L) / PARTITION)).
 */
#include "common.cuh"

#if !defined(N_HEADS) || !defined(N_KV_HEADS) || !defined(HEAD_DIM) || !defined(BLOCK_SIZE)
#error "attn_decode.cuh needs N_HEADS, N_KV_HEADS, HEAD_DIM, BLOCK_SIZE"
#endif
#ifndef WINDOW
#define WINDOW 0
#endif
#ifndef PARTITION
#define PARTITION 512
#endif
#ifndef ATTN_WARPS
#define ATTN_WARPS 4
#endif
#ifndef ATTN_UNROLL
#define ATTN_UNROLL 2 /* tokens whose K and V a lane group loads together, per step */
#endif
#ifndef ATTN_STAGES
#define ATTN_STAGES 4 /* steps of K and V each thread keeps in its cp.async ring (KS - 1 in flight) */
#endif
#ifndef ATTN_MINB
#define ATTN_MINB 0 /* blocks per SM the register allocation must allow (0: the compiler's choice) */
#endif
#ifndef ATTN_TC
#define ATTN_TC 0 /* 1: kiln_attn_decode_tc as well (the tensor-core kernel below) */
#endif
#if HEAD_DIM % KILN_VEC || HEAD_DIM / KILN_VEC > 32 || (32 % (HEAD_DIM / KILN_VEC)) != 0
#error "HEAD_DIM must be a power of two from 8 to 256 (bf16) or 4 to 128 (KILN_F32)"
#endif
#if N_HEADS % N_KV_HEADS
#error "N_HEADS must be a multiple of N_KV_HEADS"
#endif

#define KILN_LOG2E 1.4426950408889634f

/* What a lane loads of one token's K or V: KILN_VEC elements, 16 bytes (8 bf16, or 4 fp32 with KILN_F32),
 * or 8 bytes of codes with an 8-bit cache (KILN_KV8); widened by kiln_kvc_unpack
 * (codes without their scale: K's is folded into q, V's into the output). */
#if KILN_KV8
typedef uint2 kiln_kvc;
KILN_DEV void kiln_kvc_unpack(uint2 v, float f[8]) { kiln_kv_dec8(v, f); }
KILN_DEV void kiln_kvc_cp(unsigned dst, const void *src) { kiln_cp8(dst, src, 8); }
KILN_DEV uint2 kiln_kvc_zero(void) { return make_uint2(0, 0); }
#define KILN_KV_ES 1
#else
typedef uint4 kiln_kvc;
KILN_DEV void kiln_kvc_unpack(uint4 v, float f[KILN_VEC]) { kiln_unpackv(v, f); }
KILN_DEV void kiln_kvc_cp(unsigned dst, const void *src) { kiln_cp16(dst, src, 16); }
KILN_DEV uint4 kiln_kvc_zero(void) { return make_uint4(0, 0, 0, 0); }
#define KILN_KV_ES ((int)sizeof(kiln_elem))
#endif

/* log2 of a power of two; how many times n halves evenly, at most `most` times */
static constexpr __host__ __device__ int kiln_log2i(int n) { return n > 1 ? 1 + kiln_log2i(n / 2) : 0; }
static constexpr __host__ __device__ int kiln_halvings(int n, int most) { return most > 0 && n % 2 == 0 ? 1 + kiln_halvings(n / 2, most - 1) : 0; }

/* What exp2 weights are taken against for a running max m: m itself, or 0 while nothing has been
 * seen (m = -inf), so that every weight 2^(-inf - base) is 0 rather than NaN. */
KILN_DEV float kiln_attn_base(float m) { return m == KILN_NEG_INF ? 0.0f : m; }

/* The attended range [start, L) of a sequence of L tokens, and its split count. */
KILN_DEV int kiln_attn_start(int L) { return (WINDOW > 0 && L > WINDOW) ? L - WINDOW : 0; }
KILN_DEV int kiln_attn_nsplits(int L, int part) {
    int n = L - kiln_attn_start(L);
    return n <= 0 ? 0 : (n + part - 1) / part;
}
/* The split size of a sequence of L tokens (see the header: p.partition, or automatic when 0). */
KILN_DEV int kiln_attn_part(const kiln_attn_decode_params &p, int L) {
    if (p.partition > 0) return min(p.partition, PARTITION);
    const int n = max(L - kiln_attn_start(L), 1);
    const int want = max(p.splits_want, 1), most = max(p.max_splits, 1);
    /* no shorter than what the block's lane groups load in one step (shorter leaves lanes idle) */
    constexpr int STEP = ((ATTN_WARPS * 32 / (HEAD_DIM / KILN_VEC)) * ATTN_UNROLL + 31) / 32 * 32;
    int part = max((n + want - 1) / want, (n + most - 1) / most);
    part = kiln_attn_even_split(n, (part + 31) / 32 * 32, PARTITION);
    return min(max(part, STEP), PARTITION);
}

/* Merges the splits of NH consecutive query heads hq0.. of sequence b (NTH threads, all of the block):
 * o = sum_s 2^(m_s - M) o_s / sum_s 2^(m_s - M) l_s, from part_o / part_ml. One warp per head finds M
 * and stages the weights f_s = 2^(m_s - M) and sums l_s in shared memory (fs, ls: [NH][cap], when
 * nsplit <= cap), then sums the denominator in split order; each thread then owns outputs and sums
 * the splits in order too, loading 8 splits ahead. The same function serves the combine kernel and
 * the in-kernel merge (p.counters), so both give the same bits. */
template <int NH, int NTH>
KILN_DEV void kiln_attn_merge(const kiln_attn_decode_params &p, int b, int hq0, int nsplit, float *fs, float *ls,
                              int cap, float *mlsh) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const bool staged = nsplit <= cap;
    const float *pml = (const float *)p.part_ml, *po = (const float *)p.part_o;
    for (int g = warp; g < NH; g += NTH / 32) {
        const float *m = pml + ((size_t)b * N_HEADS + hq0 + g) * p.max_splits * 2;
        float M = KILN_NEG_INF;
        for (int s = lane; s < nsplit; s += 32) M = fmaxf(M, __ldcg(m + 2 * s));
        M = kiln_warp_max(M);
        if (staged)
            for (int s = lane; s < nsplit; s += 32) {
                fs[g * cap + s] = exp2f(__ldcg(m + 2 * s) - M);
                ls[g * cap + s] = __ldcg(m + 2 * s + 1);
            }
        __syncwarp();
        if (lane == 0) {
            float den = 0.0f;
            for (int s = 0; s < nsplit; s++)
                den = staged ? fmaf(fs[g * cap + s], ls[g * cap + s], den)
                             : fmaf(exp2f(__ldcg(m + 2 * s) - M), __ldcg(m + 2 * s + 1), den);
            mlsh[2 * g] = M;
            mlsh[2 * g + 1] = den;
        }
    }
    __syncthreads();
    constexpr int OPT = (NH * HEAD_DIM + NTH - 1) / NTH, AHEAD = 8;
    float num[OPT];
#pragma unroll
    for (int k = 0; k < OPT; k++) num[k] = 0.0f;
    for (int s0 = 0; s0 < nsplit; s0 += AHEAD) {
        float ov[AHEAD][OPT];
#pragma unroll
        for (int u = 0; u < AHEAD; u++)
#pragma unroll
            for (int k = 0; k < OPT; k++) {
                const int i = threadIdx.x + k * NTH, g = i / HEAD_DIM;
                const size_t ps = ((size_t)b * N_HEADS + hq0 + g) * p.max_splits + s0 + u;
                ov[u][k] = (i < NH * HEAD_DIM && s0 + u < nsplit) ? __ldcg(po + ps * HEAD_DIM + i % HEAD_DIM) : 0.0f;
            }
#pragma unroll
        for (int u = 0; u < AHEAD; u++)
#pragma unroll
            for (int k = 0; k < OPT; k++) {
                const int i = threadIdx.x + k * NTH, g = i / HEAD_DIM, s = s0 + u;
                if (i < NH * HEAD_DIM && s < nsplit) {
                    const float f = staged ? fs[g * cap + s]
                                           : exp2f(__ldcg(pml + (((size_t)b * N_HEADS + hq0 + g) * p.max_splits + s) * 2) -
                                                   mlsh[2 * g]);
                    num[k] = fmaf(f, ov[u][k], num[k]);
                }
            }
    }
#pragma unroll
    for (int k = 0; k < OPT; k++) {
        const int i = threadIdx.x + k * NTH, g = i / HEAD_DIM;
        if (i < NH * HEAD_DIM) {
            const float den = mlsh[2 * g + 1];
            ((kiln_elem *)p.out)[((size_t)b * N_HEADS + hq0 + g) * HEAD_DIM + i % HEAD_DIM] =
                kiln_f2e(den > 0.0f ? num[k] / den : 0.0f);
        }
    }
}

/* Each thread streams its own K and V chunks (16 bytes each: the lane's KILN_VEC dims of a token)
 * through a ring of KS stages in shared memory with cp.async, so the loads of KS - 1 steps are in
 * flight while one is computed, without holding registers; a thread reads back only what it copied
 * itself, so no barrier is needed, only its own cp.async.wait_group. kvb: [KS][U][2 (K, V)][threads]. */
template <int KS, int U, int NT>
KILN_DEV void kiln_attn_issue(kiln_kvc (*kvb)[U][2][NT], int step, int tw, int t1, int tnew, const unsigned char *kc,
                              const unsigned char *vc, const int *blocks, int fb, int h, int j) {
    constexpr int NG = NT / (HEAD_DIM / KILN_VEC);
#pragma unroll
    for (int u = 0; u < U; u++) {
        const int t = tw + (step * U + u) * NG;
        if (t < t1 && t != tnew) { /* the rest is never read from the ring */
            const size_t at = kiln_kv_at(blocks[t / BLOCK_SIZE - fb], h, t % BLOCK_SIZE, j * KILN_VEC) * KILN_KV_ES;
            kiln_kvc_cp(kiln_saddr(&kvb[step % KS][u][0][threadIdx.x]), kc + at);
            kiln_kvc_cp(kiln_saddr(&kvb[step % KS][u][1][threadIdx.x]), vc + at);
        }
    }
    kiln_cp_commit(); /* one group per step, empty past the end, so the counting stays uniform */
}
/* K and V of the step's tokens for a thread: from its ring stage; zeros past t1 (their scores are
 * masked, and a zero V keeps 0 * V finite); the new token (t == tnew, fused RoPE) from knew/vnew. */
template <int KS, int U, int NT>
KILN_DEV void kiln_attn_take(const kiln_kvc (*kvb)[U][2][NT], int step, int tw, int t1, int tnew,
                             const unsigned char *knew, const unsigned char *vnew, int j, kiln_kvc (&kr)[U],
                             kiln_kvc (&vr)[U]) {
    constexpr int NG = NT / (HEAD_DIM / KILN_VEC);
#pragma unroll
    for (int u = 0; u < U; u++) {
        const int t = tw + (step * U + u) * NG;
        if (t == tnew) {
            kr[u] = *(const kiln_kvc *)(knew + j * KILN_VEC * KILN_KV_ES);
            vr[u] = *(const kiln_kvc *)(vnew + j * KILN_VEC * KILN_KV_ES);
        } else if (t < t1) {
            kr[u] = kvb[step % KS][u][0][threadIdx.x];
            vr[u] = kvb[step % KS][u][1][threadIdx.x];
        } else {
            kr[u] = vr[u] = kiln_kvc_zero();
        }
    }
}

/* The split's KV block ids, from block fb of sequence b's table, into blocks[] (shared memory). */
KILN_DEV void kiln_attn_blocks(const kiln_attn_decode_params &p, int b, int t0, int t1, int fb, int *blocks) {
    const int *bt = (const int *)p.block_tables + (size_t)b * p.max_blocks;
    const int nb = t1 > t0 ? (t1 - 1) / BLOCK_SIZE - fb + 1 : 0;
    for (int i = threadIdx.x; i < nb; i += ATTN_WARPS * 32) blocks[i] = bt[fb + i];
}
/* Fused RoPE: the angles of position pos, one dim per thread, into rcs/rsn (shared memory). */
KILN_DEV void kiln_attn_angles(const kiln_attn_decode_params &p, int pos, float *rcs, float *rsn) {
    constexpr int HALF = HEAD_DIM / 2;
    for (int d = threadIdx.x; d < HEAD_DIM; d += ATTN_WARPS * 32)
        sincosf((float)pos * kiln_rope_freq(d % HALF, HEAD_DIM, p.rope_theta, p.rope_llama3, p.rope_factor,
                                            p.rope_low_freq_factor, p.rope_high_freq_factor, p.rope_orig_max_pos),
                &rsn[d], &rcs[d]);
}
/* Fused RoPE, in the block of the sequence's last split: its new token's k rotated (from qrow, the
 * sequence's QKV output row) and v, stored into the cache at p.slots[b] (-1: not stored) and into
 * knew/vnew (shared memory) as the cache holds them (elements, or codes with KILN_KV8); threads tid,
 * tid + nthreads, ... take one dim each. */
KILN_DEV void kiln_attn_new_kv(const kiln_attn_decode_params &p, const kiln_elem *qrow, int b, int h, const float *rcs,
                               const float *rsn, unsigned char *knew, unsigned char *vnew, int tid, int nthreads) {
    constexpr int HALF = HEAD_DIM / 2;
    const int slot = ((const int *)p.slots)[b];
    const kiln_elem *kx = qrow + (N_HEADS + h) * HEAD_DIM, *vx = qrow + (N_HEADS + N_KV_HEADS + h) * HEAD_DIM;
    for (int d = tid; d < HEAD_DIM; d += nthreads) {
        const kiln_elem kv = kiln_f2e(
            kiln_rope_rot(kiln_e2f(kx[d]), kiln_e2f(kx[d < HALF ? d + HALF : d - HALF]), rcs[d], rsn[d], d < HALF));
        const size_t at = kiln_kv_at(slot / BLOCK_SIZE, h, slot % BLOCK_SIZE, d);
#if KILN_KV8 /* rope_kv's codes: of the rounded k, and v */
        const unsigned char kq = (unsigned char)kiln_kv_code8(kiln_e2f(kv), kiln_kv_scale(p.kv_scale, h));
        const unsigned char vq = (unsigned char)kiln_kv_code8(kiln_e2f(vx[d]), kiln_kv_scale(p.kv_scale, N_KV_HEADS + h));
        knew[d] = kq;
        vnew[d] = vq;
        if (slot >= 0) {
            ((unsigned char *)p.k_cache)[at] = kq;
            ((unsigned char *)p.v_cache)[at] = vq;
        }
#else
        ((kiln_elem *)knew)[d] = kv;
        ((kiln_elem *)vnew)[d] = vx[d];
        if (slot >= 0) {
            ((kiln_elem *)p.k_cache)[at] = kv;
            ((kiln_elem *)p.v_cache)[at] = vx[d];
        }
#endif
    }
}

/* The CUDA-core kernel's block end: each warp's o (red: [ATTN_WARPS][G][HEAD_DIM]) and its max and
 * sum (wml: [ATTN_WARPS][G][2]) are in shared memory (the block synced). The warps' parts merge, each
 * weighted by 2^(its max - the larger max); with one split the block writes the normalised output,
 * otherwise its split's unnormalised o with (max, sum), and with p.counters the last split block of
 * (b, h) to finish merges the splits. */
KILN_DEV void kiln_attn_finish(const kiln_attn_decode_params &p, int b, int h, int split, int nsplit, float *red,
                               const float *wml, float *ml) {
    constexpr int G = N_HEADS / N_KV_HEADS, NT = ATTN_WARPS * 32;
    __shared__ int is_last;
    /* an 8-bit cache's V scale: o = sum p (code * s) = s * sum p code */
    const float vsc = KILN_KV8 ? kiln_kv_scale(p.kv_scale, N_KV_HEADS + h) : 1.0f;
    for (int i = threadIdx.x; i < G * HEAD_DIM; i += NT) {
        const int g = i / HEAD_DIM, d = i % HEAD_DIM;
        float mx = KILN_NEG_INF;
#pragma unroll
        for (int w = 0; w < ATTN_WARPS; w++) mx = fmaxf(mx, wml[(w * G + g) * 2]);
        const float base = kiln_attn_base(mx);
        float acc = 0.0f, sum = 0.0f;
#pragma unroll
        for (int w = 0; w < ATTN_WARPS; w++) {
            const float f = exp2f(wml[(w * G + g) * 2] - base);
            acc = fmaf(f, red[(w * G + g) * HEAD_DIM + d], acc);
            sum = fmaf(f, wml[(w * G + g) * 2 + 1], sum);
        }
        if (KILN_KV8) acc *= vsc;
        const int hq = h * G + g;
        if (nsplit <= 1) {
            ((kiln_elem *)p.out)[((size_t)b * N_HEADS + hq) * HEAD_DIM + d] = kiln_f2e(sum > 0.0f ? acc / sum : 0.0f);
        } else {
            const size_t ps = ((size_t)b * N_HEADS + hq) * p.max_splits + split;
            ((float *)p.part_o)[ps * HEAD_DIM + d] = acc;
            if (d == 0) {
                ((float *)p.part_ml)[ps * 2] = mx;
                ((float *)p.part_ml)[ps * 2 + 1] = sum;
            }
        }
    }
    if (nsplit <= 1 || !p.counters) return;

    /* the last split block of (b, h) to get here merges the G heads' splits */
    __threadfence(); /* this block's partials are visible device-wide before it counts */
    __syncthreads();
    if (threadIdx.x == 0) {
        int *cnt = (int *)p.counters + (size_t)b * N_KV_HEADS + h;
        const int prev = atomicAdd(cnt, 1);
        is_last = prev == nsplit - 1;
        if (is_last) *cnt = 0; /* every split has counted: ready for the next launch */
    }
    __syncthreads();
    if (!is_last) return;
    __threadfence();
    /* red (the warps' o) is free now: it holds the splits' weights and sums */
    constexpr int CAP = ATTN_WARPS * HEAD_DIM / 2;
    kiln_attn_merge<G, NT>(p, b, h * G, nsplit, red, red + G * CAP, CAP, ml);
}

extern "C" __global__ void __launch_bounds__(ATTN_WARPS * 32, ATTN_MINB) kiln_attn_decode(const kiln_attn_decode_params p) {
    constexpr int G = N_HEADS / N_KV_HEADS;
    constexpr int LPT = HEAD_DIM / KILN_VEC; /* lanes per token */
    constexpr int TPW = 32 / LPT;            /* tokens per warp step */
    constexpr int NG = ATTN_WARPS * TPW;     /* token groups in the block */
    constexpr int NT = ATTN_WARPS * 32;
    constexpr int U = ATTN_UNROLL;
    constexpr int NV = U * G;                        /* scores per lane group and step */
    constexpr int LB = kiln_log2i(LPT);              /* shuffle levels of a group */
    constexpr int RS = kiln_halvings(NV, LB);        /* levels that halve the values each lane keeps */
    constexpr int CF = NV >> RS;                     /* values each lane ends with */
    /* ring stages: ATTN_STAGES, fewer when the block's shared memory would pass 48 KB (the dynamic
     * part as the host sizes it, knew/vnew and the rope angles, the ring) */
    constexpr int DYN = KILN_ATTN_DECODE_SMEM(G, HEAD_DIM, BLOCK_SIZE, PARTITION, ATTN_WARPS);
    constexpr int STAGE = U * 2 * NT * (int)sizeof(kiln_kvc), ROOM = 48 * 1024 - DYN - HEAD_DIM * (2 * (int)sizeof(kiln_elem) + 8) - 64;
    constexpr int KS = ROOM / STAGE >= ATTN_STAGES ? ATTN_STAGES : (ROOM / STAGE > 1 ? ROOM / STAGE : 1);
    extern __shared__ float smem[];
    float *red = smem;                             /* [ATTN_WARPS][G][HEAD_DIM] each warp's o */
    float *wml = red + ATTN_WARPS * G * HEAD_DIM;  /* [ATTN_WARPS][G][2] each warp's max, sum */
    float *ml = wml + ATTN_WARPS * G * 2;          /* [G][2] the block's max, sum */
    int *blocks = (int *)(ml + 2 * G);             /* [PARTITION/BLOCK_SIZE + 2] block ids of this split */

    /* With p.qkv (fused RoPE) nothing this kernel reads from the cache was written by the kernels before it
     * in the stream (the new token's k and v are written here), and seq_lens, block tables, positions and
     * slots are step inputs: the first KS - 1 steps' K/V copies and the rope angles are issued
     * before kiln_pdl_wait, overlapping the QKV projection's tail. Only q and the new token's k, v (the QKV
     * output) are read after it. Without p.qkv the rope kernel has just written the cache: wait first. */
    const bool rope = p.qkv != 0;
    if (!rope) kiln_pdl_wait();

    const int h = blockIdx.x, b = blockIdx.y, split = blockIdx.z;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int j = lane % LPT;                 /* which KILN_VEC dims this lane owns */
    const int L = ((const int *)p.seq_lens)[b];
    const int part = kiln_attn_part(p, L);
    const int nsplit = kiln_attn_nsplits(L, part);
    if (split >= nsplit && !(split == 0 && nsplit == 0)) return;
    const int t0 = kiln_attn_start(L) + split * part;
    const int t1 = min(L, t0 + part);
    const int fb = t0 / BLOCK_SIZE; /* first KV block of the split */
    kiln_attn_blocks(p, b, t0, t1, fb, blocks);
    const unsigned char *kc = (const unsigned char *)p.k_cache, *vc = (const unsigned char *)p.v_cache;

    /* Fused RoPE (p.qkv): the rope angles need only the position (a step input), so they are computed
     * before the wait, one dim per thread, into shared memory (q and k of a token share them). */
    constexpr int QKVW = (N_HEADS + 2 * N_KV_HEADS) * HEAD_DIM, HALF = HEAD_DIM / 2;
    /* the new token's k and v as the cache holds them (elements, or codes with KILN_KV8) */
    __shared__ __align__(16) unsigned char knew[HEAD_DIM * KILN_KV_ES], vnew[HEAD_DIM * KILN_KV_ES];
    __shared__ float rcs[HEAD_DIM], rsn[HEAD_DIM];
    const int pos = rope ? ((const int *)p.positions)[b] : 0;
    const int tnew = rope ? L - 1 : -1; /* the token whose k and v come from the QKV output */
    const bool last_split = rope && split == nsplit - 1;
    if (rope) kiln_attn_angles(p, pos, rcs, rsn);
    __syncthreads(); /* blocks[], rcs/rsn ready */

    /* Lane groups of LPT lanes take one token each, U tokens per step: group (warp, g) of the block
     * takes tokens tw + u*NG + (the steps before) * NG*U with tw = t0 + warp*TPW + g. The first KS - 1
     * steps' K and V are issued here, before the wait (the new token's come from knew/vnew). */
    const int tw = t0 + warp * TPW + lane / LPT;
    const int nsteps = t0 + warp * TPW < t1 ? (t1 - t0 - warp * TPW + NG * U - 1) / (NG * U) : 0; /* warp-uniform */
    __shared__ __align__(16) kiln_kvc kvb[KS][U][2][NT];
#pragma unroll
    for (int i = 0; i < KS - 1; i++) kiln_attn_issue<KS, U, NT>(kvb, i, tw, t1, tnew, kc, vc, blocks, fb, h, j);
    if (rope) kiln_pdl_wait();

    const kiln_elem *qrow = rope ? (const kiln_elem *)p.qkv + (size_t)b * QKVW : (const kiln_elem *)0;
    if (last_split) kiln_attn_new_kv(p, qrow, b, h, rcs, rsn, knew, vnew, threadIdx.x, NT);

    /* q for the G heads, KILN_VEC dims per lane, pre-scaled for exp2 (rotated here with p.qkv,
     * rounded to the element type as the rope kernel stores it). */
    float q[G][KILN_VEC];
    {
        /* an 8-bit cache's K scale is folded in here: q . (code * s) = (q * s) . code */
        const float qs = p.scale * KILN_LOG2E * (KILN_KV8 ? kiln_kv_scale(p.kv_scale, h) : 1.0f);
        if (rope) {
#pragma unroll
            for (int g = 0; g < G; g++) {
                const kiln_elem *x = qrow + (h * G + g) * HEAD_DIM;
#pragma unroll
                for (int e = 0; e < KILN_VEC; e++) {
                    const int d = j * KILN_VEC + e;
                    const float r = kiln_rope_rot(kiln_e2f(x[d]), kiln_e2f(x[d < HALF ? d + HALF : d - HALF]), rcs[d], rsn[d], d < HALF);
                    q[g][e] = kiln_round(r) * qs;
                }
            }
        } else {
            const kiln_elem *qp = (const kiln_elem *)p.q + ((size_t)b * N_HEADS + h * G) * HEAD_DIM + j * KILN_VEC;
#pragma unroll
            for (int g = 0; g < G; g++) {
                kiln_unpackv(kiln_ld16(qp + g * HEAD_DIM), q[g]);
#pragma unroll
                for (int e = 0; e < KILN_VEC; e++) q[g][e] *= qs;
            }
        }
    }
    if (rope) __syncthreads(); /* knew, vnew ready */

    /* One pass with an online softmax: each step issues the K and V copies of step i + KS - 1, takes
     * step i's U tokens from the ring, scores them, raises the group's running max m (rescaling its
     * sum l and o by 2^(m_old - m_new)) and adds 2^(s - m) * V. No scores are kept: the split has no
     * length limit of its own, and K and V stream from HBM once, side by side. The loop bound is
     * warp-uniform so every shuffle has all lanes. */
    float m[G], l[G], o[G][KILN_VEC];
#pragma unroll
    for (int g = 0; g < G; g++) {
        m[g] = KILN_NEG_INF;
        l[g] = 0.0f;
#pragma unroll
        for (int e = 0; e < KILN_VEC; e++) o[g][e] = 0.0f;
    }
    for (int i = 0; i < nsteps; i++) {
        const int t = tw + i * NG * U;
        kiln_attn_issue<KS, U, NT>(kvb, i + KS - 1, tw, t1, tnew, kc, vc, blocks, fb, h, j);
        kiln_cp_wait<KS - 1>(); /* step i has landed */
        kiln_kvc kr[U], vr[U];
        kiln_attn_take<KS, U, NT>(kvb, i, tw, t1, tnew, knew, vnew, j, kr, vr);
        /* scores x[u*G + g] = q_g . k_u, summed over the group's LPT lanes by a reduce-scatter (each
         * level sends half the values, keeps the other half: NV/2 + NV/4 + ... shuffles, not NV per
         * level), then broadcast to the whole group */
        float x[NV];
#pragma unroll
        for (int u = 0; u < U; u++) {
            float k[KILN_VEC];
            kiln_kvc_unpack(kr[u], k);
#pragma unroll
            for (int g = 0; g < G; g++) {
                float a = 0.0f;
#pragma unroll
                for (int e = 0; e < KILN_VEC; e++) a = fmaf(q[g][e], k[e], a);
                x[u * G + g] = a;
            }
        }
#pragma unroll
        for (int lv = 0; lv < LB; lv++) {
            const int off = LPT >> (lv + 1);
            if (lv < RS) {
                const int half = NV >> (lv + 1);
                const bool up = (lane & off) != 0; /* keeps the upper half */
#pragma unroll
                for (int i = 0; i < NV / 2; i++) /* a constant trip count, so it unrolls (i < half) */
                    if (i < half) {
                        const float send = up ? x[i] : x[i + half], keep = up ? x[i + half] : x[i];
                        x[i] = keep + __shfl_xor_sync(KILN_FULL_MASK, send, off);
                    }
            } else {
#pragma unroll
                for (int i = 0; i < CF; i++) x[i] += __shfl_xor_sync(KILN_FULL_MASK, x[i], off);
            }
        }
        /* x[i] (i < CF) is the full sum of index (j >> (LB - RS)) * CF + i */
        float s[U][G];
#pragma unroll
        for (int i = 0; i < NV; i++) {
            const float v = __shfl_sync(KILN_FULL_MASK, x[i % CF], (lane & ~(LPT - 1)) + ((i / CF) << (LB - RS)));
            s[i / G][i % G] = t + (i / G) * NG < t1 ? v : KILN_NEG_INF;
        }
#pragma unroll
        for (int g = 0; g < G; g++) {
            float mx = m[g];
#pragma unroll
            for (int u = 0; u < U; u++) mx = fmaxf(mx, s[u][g]);
            const float base = kiln_attn_base(mx);
            const float f = exp2f(m[g] - base);
            m[g] = mx;
            l[g] *= f;
#pragma unroll
            for (int e = 0; e < KILN_VEC; e++) o[g][e] *= f;
#pragma unroll
            for (int u = 0; u < U; u++) s[u][g] = exp2f(s[u][g] - base);
        }
#pragma unroll
        for (int u = 0; u < U; u++) { /* tokens in order within the group */
            float v[KILN_VEC];
            kiln_kvc_unpack(vr[u], v);
#pragma unroll
            for (int g = 0; g < G; g++) {
                l[g] += s[u][g];
#pragma unroll
                for (int e = 0; e < KILN_VEC; e++) o[g][e] = fmaf(s[u][g], v[e], o[g][e]);
            }
        }
    }

    /* Merge the TPW groups of each warp (lanes with the same j) through shuffles, then the warps
     * through shared memory, each part weighted by 2^(its max - the larger max). */
#pragma unroll
    for (int off = LPT; off < 32; off <<= 1)
#pragma unroll
        for (int g = 0; g < G; g++) {
            const float mo = __shfl_xor_sync(KILN_FULL_MASK, m[g], off);
            const float lo = __shfl_xor_sync(KILN_FULL_MASK, l[g], off);
            const float mx = fmaxf(m[g], mo), base = kiln_attn_base(mx);
            const float fa = exp2f(m[g] - base), fo = exp2f(mo - base);
            m[g] = mx;
            l[g] = l[g] * fa + lo * fo;
#pragma unroll
            for (int e = 0; e < KILN_VEC; e++) o[g][e] = o[g][e] * fa + __shfl_xor_sync(KILN_FULL_MASK, o[g][e], off) * fo;
        }
    if (lane < LPT)
#pragma unroll
        for (int g = 0; g < G; g++) {
#pragma unroll
            for (int e = 0; e < KILN_VEC; e++) red[(warp * G + g) * HEAD_DIM + j * KILN_VEC + e] = o[g][e];
            if (lane == 0) {
                wml[(warp * G + g) * 2] = m[g];
                wml[(warp * G + g) * 2 + 1] = l[g];
            }
        }
    __syncthreads();

    kiln_attn_finish(p, b, h, split, nsplit, red, wml, ml);
}

#if ATTN_TC
/* ---- kiln_attn_decode_tc: the same work on the tensor cores (ATTN_TC 1) ----
 * For GQA groups of 4 to 8 query heads a kv head, where the CUDA-core kernel above spends most of its
 * instructions on per-token softmax bookkeeping and score shuffles that every lane of a token's group
 * repeats (at batch 1024 over an FP8 cache it read at about 30 % of the ceiling; this kernel 43 %,
 * docs/kernels.md). The same split rule and fused RoPE; a warp takes one kv head (block (x, b, split):
 * kv heads ATTN_WARPS*x ..., so the block's warps share the sequence's block ids and rope angles) and
 * the whole split, in tiles of 16 tokens, and runs both products on mma.sync m16n8k16 with fp32
 * accumulation (a warp's stream of tiles is long enough to keep its ring full; the first version,
 * the block's warps splitting one kv head's tokens as the CUDA-core kernel does, measured slower than
 * that kernel at batch 1024: 3 tiles a warp, and the block end's merge). Operands: bf16 over a bf16
 * cache, f16 over FP8 codes (E4M3 widens to f16 exactly; q is rounded to f16 with its scales, P to
 * the operand type, as flash attention rounds P).
 *   S^T [16 tokens x 8 heads] = K [16 x HEAD_DIM] . q^T: A = K rows straight from the cache, B = q (heads
 *     past G are zero). A k-step's 16 columns are any 16 dims as long as A and B agree: lane (r = lane/4,
 *     c = lane%4) holds k-slots {2c, 2c+1, 2c+8, 2c+9}, mapped to dims D4*c + 4*ks + {0, 1, 2, 3}, so
 *     a lane reads D4 = HEAD_DIM/4 contiguous dims of its two token rows (r, r + 8).
 *   Online softmax on S^T's fragment: a lane holds tokens r, r + 8 of heads 2c, 2c + 1; a head's max
 *     and sum run over the 8 lanes sharing c (3 shuffle levels a tile, no broadcast).
 *   O^T [HEAD_DIM x 8 heads] += V^T [HEAD_DIM x 16 tokens] . P^T: B = P^T is S^T's fragment rounded and
 *     transposed in registers (movmatrix, two 8x8 halves); A = V^T, whose rows (dims) are again ours
 *     to place: lane r owns dims D8*r .. D8*r + D8 - 1 (D8 = HEAD_DIM/8) of tokens 2c, 2c+1, 2c+8, 2c+9,
 *     m-tile mt's rows r and r + 8 being dims D8*r + 2mt and + 1; a register pairs two tokens' codes
 *     of one dim (a byte permute).
 * Each thread streams its own 16-byte chunks of a tile (2 K rows, 4 V rows) through a cp.async ring
 * of KILN_ATTN_TC_STAGES tiles in dynamic shared memory after the split's block ids
 * (KILN_ATTN_DECODE_TC_SMEM), reading back only what it copied. Each warp writes its heads' output
 * (one split) or its split's unnormalised o and (max, sum) for the combine kernel; no merging block
 * (p.counters is not read: the executor keeps the CUDA-core kernel for +merge_splits).
 * Launch: grid (ceil(N_KV_HEADS / ATTN_WARPS), B, max_splits), block ATTN_WARPS * 32. */
#if KILN_F32 || KILN_KV8 == 2
#error "ATTN_TC: bf16 engines with a bf16 or FP8 cache"
#endif
static_assert(N_HEADS / N_KV_HEADS <= 8 && HEAD_DIM <= 128 && HEAD_DIM * KILN_KV_ES >= 128 && HEAD_DIM % 32 == 0,
              "ATTN_TC: at most 8 query heads a kv head, HEAD_DIM 64 or 128 (128 with an FP8 cache)");
#ifdef ATTN_TC_STAGES /* another ring depth, for kiln_gpu_bench (its host sizes the shared memory to match) */
#define KILN_TC_STAGES ATTN_TC_STAGES
#else
#define KILN_TC_STAGES KILN_ATTN_TC_STAGES(KILN_KV_ES)
#endif
#if KILN_KV8
#define KILN_TC_MMA "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32"
/* two floats as the operands' f16x2 (lo in the low half) */
KILN_DEV unsigned kiln_tc_pack(float lo, float hi) {
    unsigned r;
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}
/* The 4 E4M3 codes of w (byte i = element i) as two f16x2 (elements 0, 1 and 2, 3), exact: sm_89's
 * conversion, or elsewhere the fields moved into f16's (sign; exponent and mantissa shifted by 7),
 * which is the value times 2^-8 (KILN_TC_UNIT) for normals and subnormals alike (bias 7 against 15). */
#if __CUDA_ARCH__ >= 890
#define KILN_TC_UNIT 1.0f
KILN_DEV void kiln_tc_e4m3x4(unsigned w, unsigned &lo, unsigned &hi) { kiln_e4m3x4_f16x2(w, lo, hi); }
#else
#define KILN_TC_UNIT 256.0f
KILN_DEV unsigned kiln_tc_e4m3x2(unsigned x) { /* codes in bytes 0 and 2 */
    return ((x & 0x007F007Fu) << 7) | ((x & 0x00800080u) << 8);
}
KILN_DEV void kiln_tc_e4m3x4(unsigned w, unsigned &lo, unsigned &hi) {
    lo = kiln_tc_e4m3x2(__byte_perm(w, 0u, 0x4140));
    hi = kiln_tc_e4m3x2(__byte_perm(w, 0u, 0x4342));
}
#endif
#else
#define KILN_TC_MMA "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32"
#define KILN_TC_UNIT 1.0f
KILN_DEV unsigned kiln_tc_pack(float lo, float hi) { return kiln_f2bf2(lo, hi); }
#endif
KILN_DEV void kiln_tc_mma(float (&d)[4], unsigned a0, unsigned a1, unsigned a2, unsigned a3, unsigned b0, unsigned b1) {
    asm(KILN_TC_MMA " {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}
/* an 8x8 fragment of 16-bit values transposed across the warp */
KILN_DEV unsigned kiln_tc_trans(unsigned v) {
    unsigned r;
    asm("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;" : "=r"(r) : "r"(v));
    return r;
}

/* A tile's rows for lane (r, c): K rows r and r + 8 (KC chunks of 16 bytes each, dims D4*c on), V rows
 * 2c, 2c+1, 2c+8, 2c+9 (VC chunks each, dims D8*r on); chunk q of row i sits at ring[stage][q][lane]
 * of the warp's ring. */
constexpr int KILN_TC_D4 = HEAD_DIM / 4, KILN_TC_D8 = HEAD_DIM / 8;
constexpr int KILN_TC_KC = KILN_TC_D4 * KILN_KV_ES / 16, KILN_TC_VC = KILN_TC_D8 * KILN_KV_ES / 16;
constexpr int KILN_TC_CH = 2 * KILN_TC_KC + 4 * KILN_TC_VC;
KILN_DEV int kiln_tc_row_tok(int i, int r, int c) { return i < 2 ? r + 8 * i : 2 * c + (i - 2) % 2 + 8 * ((i - 2) / 2); }
KILN_DEV int kiln_tc_chunk0(int i) { return i < 2 ? i * KILN_TC_KC : 2 * KILN_TC_KC + (i - 2) * KILN_TC_VC; }

/* Issues step `step`'s copies (tile base token tb) into the warp's ring stage, one commit group. */
KILN_DEV void kiln_tc_issue(uint4 *ring, int step, int tb, int t1, int tnew, const unsigned char *kc,
                            const unsigned char *vc, const int *blocks, int fb, int h, int lane) {
    const int r = lane >> 2, c = lane & 3;
    uint4 *st = ring + (size_t)(step % KILN_TC_STAGES) * KILN_TC_CH * 32 + lane;
#pragma unroll
    for (int i = 0; i < 6; i++) {
        const int t = tb + kiln_tc_row_tok(i, r, c);
        const bool isk = i < 2;
        if (t < t1 && t != tnew) {
            const size_t at = kiln_kv_at(blocks[t / BLOCK_SIZE - fb], h, t % BLOCK_SIZE, isk ? KILN_TC_D4 * c : KILN_TC_D8 * r) * KILN_KV_ES;
            const unsigned char *src = (isk ? kc : vc) + at;
#pragma unroll
            for (int q = 0; q < (isk ? KILN_TC_KC : KILN_TC_VC); q++)
                kiln_cp16(kiln_saddr(st + (size_t)(kiln_tc_chunk0(i) + q) * 32), src + 16 * q, 16);
        }
    }
    kiln_cp_commit();
}
/* Chunk q of row i of the step's tile for this lane: its ring copy, the new token's from knew/vnew,
 * zeros past t1. */
KILN_DEV uint4 kiln_tc_take(const uint4 *ring, int step, int tb, int t1, int tnew, const unsigned char *knew,
                            const unsigned char *vnew, int lane, int i, int q) {
    const int r = lane >> 2, c = lane & 3;
    const int t = tb + kiln_tc_row_tok(i, r, c);
    const bool isk = i < 2;
    if (t == tnew)
        return *(const uint4 *)((isk ? knew : vnew) + (isk ? KILN_TC_D4 * c : KILN_TC_D8 * r) * KILN_KV_ES + 16 * q);
    if (t >= t1) return make_uint4(0u, 0u, 0u, 0u);
    return ring[((size_t)(step % KILN_TC_STAGES) * KILN_TC_CH + kiln_tc_chunk0(i) + q) * 32 + lane];
}
KILN_DEV unsigned kiln_tc_word(const uint4 *v, int w) {
    const uint4 u = v[w / 4];
    return (w & 3) == 0 ? u.x : (w & 3) == 1 ? u.y : (w & 3) == 2 ? u.z : u.w;
}

extern "C" __global__ void __launch_bounds__(ATTN_WARPS * 32) kiln_attn_decode_tc(const kiln_attn_decode_params p) {
    constexpr int G = N_HEADS / N_KV_HEADS, KT = HEAD_DIM / 16, NB = PARTITION / BLOCK_SIZE + 2;
    constexpr int QKVW = (N_HEADS + 2 * N_KV_HEADS) * HEAD_DIM, HALF = HEAD_DIM / 2;
    extern __shared__ int smem_tc[];
    int *blocks = smem_tc; /* [NB] block ids of this split */
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, r = lane >> 2, c = lane & 3;
    uint4 *ring = (uint4 *)((char *)smem_tc + (NB * 4 + 15) / 16 * 16) + (size_t)warp * KILN_TC_STAGES * KILN_TC_CH * 32;
    __shared__ __align__(16) unsigned char knew[ATTN_WARPS][HEAD_DIM * KILN_KV_ES], vnew[ATTN_WARPS][HEAD_DIM * KILN_KV_ES];
    __shared__ float rcs[HEAD_DIM], rsn[HEAD_DIM];

    const bool rope = p.qkv != 0;
    if (!rope) kiln_pdl_wait();
    const int h = blockIdx.x * ATTN_WARPS + warp, b = blockIdx.y, split = blockIdx.z;
    const bool live = h < N_KV_HEADS; /* the last block's warps past the kv heads only keep the barriers */
    const int L = ((const int *)p.seq_lens)[b];
    const int part = kiln_attn_part(p, L);
    const int nsplit = kiln_attn_nsplits(L, part);
    if (split >= nsplit && !(split == 0 && nsplit == 0)) return;
    const int t0 = kiln_attn_start(L) + split * part, t1 = min(L, t0 + part), fb = t0 / BLOCK_SIZE;
    kiln_attn_blocks(p, b, t0, t1, fb, blocks);
    const unsigned char *kc = (const unsigned char *)p.k_cache, *vc = (const unsigned char *)p.v_cache;
    const int pos = rope ? ((const int *)p.positions)[b] : 0;
    const int tnew = rope ? L - 1 : -1;
    if (rope) kiln_attn_angles(p, pos, rcs, rsn);
    __syncthreads(); /* blocks[], rcs/rsn ready */
    if (!live) return;

    const int nsteps = t1 > t0 ? (t1 - t0 + 15) / 16 : 0;
#pragma unroll
    for (int i = 0; i < KILN_TC_STAGES - 1; i++) kiln_tc_issue(ring, i, t0 + 16 * i, t1, tnew, kc, vc, blocks, fb, h, lane);
    if (rope) kiln_pdl_wait();

    const kiln_elem *qrow = rope ? (const kiln_elem *)p.qkv + (size_t)b * QKVW : (const kiln_elem *)0;
    if (rope && split == nsplit - 1) kiln_attn_new_kv(p, qrow, b, h, rcs, rsn, knew[warp], vnew[warp], lane, 32);

    /* q's B fragments: head r (zero past G), dims D4*c + 4*ks + {0, 1} and {2, 3}. scores = S * ss: an
     * FP8 cache's q carries the softmax scale, log2(e) and K's scale, a bf16 cache's q is exact and the
     * scale comes after the products. f16 (FP8) holds magnitudes below 65504: a warp whose q times
     * those scales reaches 2^14 takes it times the power of two that brings its largest under 2^14 (exact),
     * the scores the inverse, so no q becomes infinite (the CUDA-core kernel keeps q in fp32). */
    const float qs = p.scale * KILN_LOG2E * (KILN_KV8 ? kiln_kv_scale(p.kv_scale, h) : 1.0f);
    float ss = KILN_KV8 ? KILN_TC_UNIT : qs;
    unsigned qb[KT][2];
    {
        const kiln_elem *x = rope ? qrow + (h * G + r) * HEAD_DIM
                                  : (const kiln_elem *)p.q + ((size_t)b * N_HEADS + h * G + r) * HEAD_DIM;
        float v[KT][4], big = 0.0f;
#pragma unroll
        for (int ks = 0; ks < KT; ks++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int d = KILN_TC_D4 * c + 4 * ks + e;
                const float xd = r < G ? kiln_e2f(x[d]) : 0.0f;
                v[ks][e] = (rope && r < G ? kiln_round(kiln_rope_rot(xd, kiln_e2f(x[d < HALF ? d + HALF : d - HALF]), rcs[d],
                                                                     rsn[d], d < HALF))
                                          : xd) *
                           (KILN_KV8 ? qs : 1.0f);
                big = fmaxf(big, fabsf(v[ks][e]));
            }
        float down = 1.0f;
        if (KILN_KV8) {
            big = kiln_warp_max(big);
            if (big >= 16384.0f && big <= 3.0e38f) { /* (infinite or NaN q stays as it is) */
                const int e = ilogbf(big) - 13;     /* 2^(e + 13) <= big < 2^(e + 14) */
                down = ldexpf(1.0f, -e);
                ss = ldexpf(ss, e);
            }
        }
#pragma unroll
        for (int ks = 0; ks < KT; ks++) {
            qb[ks][0] = kiln_tc_pack(v[ks][0] * down, v[ks][1] * down);
            qb[ks][1] = kiln_tc_pack(v[ks][2] * down, v[ks][3] * down);
        }
    }
    __syncwarp(); /* knew, vnew ready */

    float m[2] = {KILN_NEG_INF, KILN_NEG_INF}, l[2] = {0.0f, 0.0f}, o[KT][4];
#pragma unroll
    for (int mt = 0; mt < KT; mt++) o[mt][0] = o[mt][1] = o[mt][2] = o[mt][3] = 0.0f;
    for (int i = 0; i < nsteps; i++) {
        const int tb = t0 + 16 * i;
        kiln_tc_issue(ring, i + KILN_TC_STAGES - 1, tb + 16 * (KILN_TC_STAGES - 1), t1, tnew, kc, vc, blocks, fb, h, lane);
        kiln_cp_wait<KILN_TC_STAGES - 1>();
        uint4 kr[2][KILN_TC_KC], vr[4][KILN_TC_VC];
#pragma unroll
        for (int q = 0; q < KILN_TC_KC; q++) {
            kr[0][q] = kiln_tc_take(ring, i, tb, t1, tnew, knew[warp], vnew[warp], lane, 0, q);
            kr[1][q] = kiln_tc_take(ring, i, tb, t1, tnew, knew[warp], vnew[warp], lane, 1, q);
        }
#pragma unroll
        for (int k = 0; k < 4; k++)
#pragma unroll
            for (int q = 0; q < KILN_TC_VC; q++)
                vr[k][q] = kiln_tc_take(ring, i, tb, t1, tnew, knew[warp], vnew[warp], lane, 2 + k, q);
        /* S^T: s[0], s[1] token r, heads 2c, 2c+1; s[2], s[3] token r + 8 */
        float s[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
        for (int ks = 0; ks < KT; ks++) {
            unsigned a0, a1, a2, a3;
#if KILN_KV8
            kiln_tc_e4m3x4(kiln_tc_word(kr[0], ks), a0, a2);
            kiln_tc_e4m3x4(kiln_tc_word(kr[1], ks), a1, a3);
#else
            a0 = kiln_tc_word(kr[0], 2 * ks), a2 = kiln_tc_word(kr[0], 2 * ks + 1);
            a1 = kiln_tc_word(kr[1], 2 * ks), a3 = kiln_tc_word(kr[1], 2 * ks + 1);
#endif
            kiln_tc_mma(s, a0, a1, a2, a3, qb[ks][0], qb[ks][1]);
        }
#pragma unroll
        for (int e = 0; e < 2; e++) {
            const float s0 = tb + r < t1 ? s[e] * ss : KILN_NEG_INF, s1 = tb + r + 8 < t1 ? s[2 + e] * ss : KILN_NEG_INF;
            float mx = fmaxf(s0, s1);
            mx = fmaxf(mx, __shfl_xor_sync(KILN_FULL_MASK, mx, 4));
            mx = fmaxf(mx, __shfl_xor_sync(KILN_FULL_MASK, mx, 8));
            mx = fmaxf(mx, __shfl_xor_sync(KILN_FULL_MASK, mx, 16));
            mx = fmaxf(mx, m[e]);
            const float base = kiln_attn_base(mx), f = exp2f(m[e] - base);
            m[e] = mx;
            s[e] = exp2f(s0 - base);
            s[2 + e] = exp2f(s1 - base);
            l[e] = l[e] * f + s[e] + s[2 + e];
#pragma unroll
            for (int mt = 0; mt < KT; mt++) o[mt][e] *= f, o[mt][2 + e] *= f;
        }
        const unsigned pb0 = kiln_tc_trans(kiln_tc_pack(s[0], s[1])), pb1 = kiln_tc_trans(kiln_tc_pack(s[2], s[3]));
        /* O^T += V^T . P^T: m-tile mt's rows r, r + 8 are dims D8*r + 2mt, + 1 of tokens 2c, 2c+1 (a0, a1)
         * and 2c+8, 2c+9 (a2, a3) */
#pragma unroll
        for (int mt = 0; mt < KT; mt++) {
            unsigned a[4];
#pragma unroll
            for (int k = 0; k < 2; k++) {
#if KILN_KV8
                const unsigned w0 = kiln_tc_word(vr[2 * k], mt / 2), w1 = kiln_tc_word(vr[2 * k + 1], mt / 2);
                kiln_tc_e4m3x4(__byte_perm(w0, w1, mt % 2 ? 0x7362 : 0x5140), a[2 * k], a[2 * k + 1]);
#else
                const unsigned w0 = kiln_tc_word(vr[2 * k], mt), w1 = kiln_tc_word(vr[2 * k + 1], mt);
                a[2 * k] = __byte_perm(w0, w1, 0x5410);
                a[2 * k + 1] = __byte_perm(w0, w1, 0x7632);
#endif
            }
            kiln_tc_mma(o[mt], a[0], a[1], a[2], a[3], pb0, pb1);
        }
    }
    /* heads 2c, 2c + 1 (those below G): the output with one split, else this split's unnormalised o
     * with (max, sum); o times an 8-bit cache's V scale (and KILN_TC_UNIT) either way */
    const float vsc = KILN_KV8 ? kiln_kv_scale(p.kv_scale, N_KV_HEADS + h) * KILN_TC_UNIT : 1.0f;
#pragma unroll
    for (int e = 0; e < 2; e++) {
        l[e] += __shfl_xor_sync(KILN_FULL_MASK, l[e], 4);
        l[e] += __shfl_xor_sync(KILN_FULL_MASK, l[e], 8);
        l[e] += __shfl_xor_sync(KILN_FULL_MASK, l[e], 16);
        const int g = 2 * c + e, hq = h * G + g;
        if (g >= G) continue;
        if (nsplit <= 1) {
            const float inv = l[e] > 0.0f ? vsc / l[e] : 0.0f;
            kiln_elem *out = (kiln_elem *)p.out + ((size_t)b * N_HEADS + hq) * HEAD_DIM + KILN_TC_D8 * r;
#pragma unroll
            for (int mt = 0; mt < KT; mt++) *(unsigned *)(out + 2 * mt) = kiln_f2bf2(o[mt][e] * inv, o[mt][2 + e] * inv);
        } else {
            const size_t ps = ((size_t)b * N_HEADS + hq) * p.max_splits + split;
            float *po = (float *)p.part_o + ps * HEAD_DIM + KILN_TC_D8 * r;
#pragma unroll
            for (int mt = 0; mt < KT; mt++) *(float2 *)(po + 2 * mt) = make_float2(o[mt][e] * vsc, o[mt][2 + e] * vsc);
            if (r == 0) {
                ((float *)p.part_ml)[ps * 2] = m[e];
                ((float *)p.part_ml)[ps * 2 + 1] = l[e];
            }
        }
    }
}
#endif /* ATTN_TC */

#define KILN_COMBINE_THREADS ((HEAD_DIM + 31) / 32 * 32)
#define KILN_COMBINE_STAGE 256 /* splits whose weights the combine kernel keeps in shared memory */
extern "C" __global__ void __launch_bounds__(KILN_COMBINE_THREADS) kiln_attn_decode_combine(const kiln_attn_decode_params p) {
    __shared__ float fs[KILN_COMBINE_STAGE], ls[KILN_COMBINE_STAGE], mlsh[2];
    kiln_pdl_wait();
    const int hq = blockIdx.x, b = blockIdx.y;
    const int L = ((const int *)p.seq_lens)[b];
    const int nsplit = kiln_attn_nsplits(L, kiln_attn_part(p, L));
    if (nsplit <= 1) return; /* the split kernel wrote the output itself */
    kiln_attn_merge<1, KILN_COMBINE_THREADS>(p, b, hq, nsplit, fs, ls, KILN_COMBINE_STAGE, mlsh);
}
