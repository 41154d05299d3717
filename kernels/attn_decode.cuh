/*
 * attn_decode.cuh — decode attention: one query token per sequence against
 * its paged KV cache, GQA, optional sliding window, split along the
 * sequence (flash-decoding) with a combine step.
 *
 * Block (kv head h, sequence b, split s) handles the G = N_HEADS/N_KV_HEADS
 * query heads that share kv head h, so each K/V byte is read once, over the
 * tokens [start + s*P, start + (s+1)*P) (P = p.partition) of the attended
 * range [start, L): L = seq_lens[b], start = max(0, L - WINDOW) with a
 * window (HF Mistral's rule: key j is seen from query i iff i - j < WINDOW).
 *   1. scores: a group of HEAD_DIM/KILN_VEC lanes takes one token (16 bytes
 *      of K per lane: 8 bf16, or 4 fp32 with KILN_F32), dots it with the G
 *      queries held in registers (pre-scaled by scale*log2(e), so softmax
 *      uses exp2), reduces within the group;
 *      scores go to shared memory [G][PARTITION].
 *   2. per head: max and sum of exp2 over the split (one warp per head).
 *   3. o = P·V: the same lane groups stream V, each lane owning KILN_VEC dims
 *      of G accumulators; groups are summed through shuffles and shared memory.
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
 * rope angles and the first ATTN_UNROLL tokens' K (into registers; their V
 * toward L2) are fetched before kiln_pdl_wait, under the QKV projection's
 * tail; later score steps pull their tokens' V toward L2 as they load K, so
 * phase 3 reads V from L2. The merge (combine kernel or last block) stages
 * the split weights in shared memory and loads 8 splits ahead, summing in
 * split order, so both give the same bits (kiln_attn_merge). Measured on the
 * H200 (Mistral-7B, docs/kernels.md run 5): -3% per decode step at batch 1.
 *
 * Constants: N_HEADS, N_KV_HEADS, HEAD_DIM (8..256 a power of two; 4..128
 * with KILN_F32),
 * BLOCK_SIZE, WINDOW (0 = full attention), PARTITION (the largest split the
 * shared memory is sized for, default 512), ATTN_WARPS (default 4),
 * ATTN_UNROLL (tokens whose K or V loads a lane group issues together,
 * default 4; 1 had stopped at ~65% of bandwidth at batch 64. Alone, 8 was
 * 17-24% faster at batch 64 (kiln_gpu_bench --decode-attn: 64 x 1024 tokens
 * 147 -> 111 us), but in the 7B decode step, with the fused RoPE and the
 * early loads, 8 was 2.5% slower at batch 64 and 0.5% at batch 1 and 8:
 * docs/kernels.md run 5). The
 * split size itself is a run-time parameter (p.partition <= PARTITION): small
 * batches take short splits so that the grid fills the GPU
 * (kiln_attn_decode_partition in runtime/cuda/kernels.c). With p.partition
 * = 0 each sequence picks its own split size from its length n (the tokens
 * it attends to): the smallest multiple of 32 >= ceil(n / p.splits_want),
 * at least ceil(n / max_splits), clamped to [one step of the block's lane
 * groups (ATTN_WARPS * 32 / (HEAD_DIM / KILN_VEC) * ATTN_UNROLL tokens,
 * rounded up to 32), PARTITION]; so a launch
 * whose grid was fixed in advance (a CUDA graph) still splits short and
 * long contexts well. The block ids a
 * split needs are read into shared memory first, so the K/V loads do not
 * wait on a block-table load each.
 * Launch: kiln_attn_decode grid (N_KV_HEADS, B, max_splits), block
 * ATTN_WARPS*32, dynamic shared memory kiln_attn_decode_smem bytes:
 * 4*(G*PARTITION + ATTN_WARPS*G*HEAD_DIM + 2*G + PARTITION/BLOCK_SIZE + 2);
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
#define ATTN_UNROLL 4 /* K or V tokens loaded per lane group before their first use */
#endif
#if HEAD_DIM % KILN_VEC || HEAD_DIM / KILN_VEC > 32 || (32 % (HEAD_DIM / KILN_VEC)) != 0
#error "HEAD_DIM must be a power of two from 8 to 256 (bf16) or 4 to 128 (KILN_F32)"
#endif
#if N_HEADS % N_KV_HEADS
#error "N_HEADS must be a multiple of N_KV_HEADS"
#endif

#define KILN_LOG2E 1.4426950408889634f

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
    part = (part + 31) / 32 * 32;
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

extern "C" __global__ void __launch_bounds__(ATTN_WARPS * 32) kiln_attn_decode(const kiln_attn_decode_params p) {
    constexpr int G = N_HEADS / N_KV_HEADS;
    constexpr int LPT = HEAD_DIM / KILN_VEC; /* lanes per token */
    constexpr int TPW = 32 / LPT;       /* tokens per warp step */
    constexpr int NG = ATTN_WARPS * TPW; /* token groups in the block */
    constexpr int NT = ATTN_WARPS * 32;
    extern __shared__ float smem[];
    float *sc = smem;                            /* [G][PARTITION] scores, then probabilities */
    float *red = sc + G * PARTITION;             /* [ATTN_WARPS][G][HEAD_DIM] partial o */
    float *ml = red + ATTN_WARPS * G * HEAD_DIM; /* [G][2] max, sum */
    int *blocks = (int *)(ml + 2 * G);           /* [PARTITION/BLOCK_SIZE + 2] block ids of this split */

    /* With p.qkv (fused RoPE) nothing this kernel reads from the cache was written by the kernels before it
     * in the stream (the new token's k and v are written here), and seq_lens, block tables, positions and
     * slots are step inputs: the first chunk's K/V loads and the rope angles are issued before
     * kiln_pdl_wait, overlapping the QKV projection's tail. Only q and the new token's k, v (the QKV
     * output) are read after it. Without p.qkv the rope kernel has just written the cache: wait first. */
    const bool rope = p.qkv != 0;
    if (!rope) kiln_pdl_wait();

    const int h = blockIdx.x, b = blockIdx.y, split = blockIdx.z;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int j = lane % LPT;                 /* which KILN_VEC dims this lane owns */
    const int grp = warp * TPW + lane / LPT;  /* token group */
    const int L = ((const int *)p.seq_lens)[b];
    const int part = kiln_attn_part(p, L);
    const int nsplit = kiln_attn_nsplits(L, part);
    if (split >= nsplit && !(split == 0 && nsplit == 0)) return;
    const int t0 = kiln_attn_start(L) + split * part;
    const int t1 = min(L, t0 + part);
    const int n = max(0, t1 - t0);
    const int fb = t0 / BLOCK_SIZE; /* first KV block of the split */
    {
        const int *bt = (const int *)p.block_tables + (size_t)b * p.max_blocks;
        const int nb = n > 0 ? (t1 - 1) / BLOCK_SIZE - fb + 1 : 0;
        for (int i = threadIdx.x; i < nb; i += NT) blocks[i] = bt[fb + i];
    }
    const kiln_elem *kc = (const kiln_elem *)p.k_cache, *vc = (const kiln_elem *)p.v_cache;

    /* Fused RoPE (p.qkv): the rope angles need only the position (a step input), so they are computed
     * before the wait, one dim per thread, into shared memory (q and k of a token share them). */
    constexpr int QKVW = (N_HEADS + 2 * N_KV_HEADS) * HEAD_DIM, HALF = HEAD_DIM / 2;
    __shared__ __align__(16) kiln_elem knew[HEAD_DIM], vnew[HEAD_DIM];
    __shared__ float rcs[HEAD_DIM], rsn[HEAD_DIM];
    const int pos = rope ? ((const int *)p.positions)[b] : 0;
    const bool last_split = rope && split == nsplit - 1;
    if (rope)
        for (int d = threadIdx.x; d < HEAD_DIM; d += NT)
            sincosf((float)pos * kiln_rope_freq(d % HALF, HEAD_DIM, p.rope_theta, p.rope_llama3, p.rope_factor,
                                                p.rope_low_freq_factor, p.rope_high_freq_factor, p.rope_orig_max_pos),
                    &rsn[d], &rcs[d]);
    __syncthreads(); /* blocks[], rcs/rsn ready */

    /* K of the first ATTN_UNROLL tokens of each lane group (the first step of the score loop) in
     * registers, their V pulled toward L2; the new token's k (p.qkv) is taken from shared memory
     * after the wait. */
    uint4 k0[ATTN_UNROLL];
#pragma unroll
    for (int u = 0; u < ATTN_UNROLL; u++) {
        const int t = t0 + grp + u * NG;
        k0[u] = make_uint4(0, 0, 0, 0);
        if (t < t1 && !(rope && t == L - 1)) {
            const size_t at = kiln_kv_at(blocks[t / BLOCK_SIZE - fb], h, t % BLOCK_SIZE, j * KILN_VEC);
            k0[u] = kiln_ld16(kc + at);
            kiln_prefetch_l2(vc + at);
        }
    }
    if (rope) kiln_pdl_wait();

    const kiln_elem *qrow = rope ? (const kiln_elem *)p.qkv + (size_t)b * QKVW : (const kiln_elem *)0;
    if (last_split) {
        const int slot = ((const int *)p.slots)[b];
        const kiln_elem *kx = qrow + (N_HEADS + h) * HEAD_DIM, *vx = qrow + (N_HEADS + N_KV_HEADS + h) * HEAD_DIM;
        for (int d = threadIdx.x; d < HEAD_DIM; d += NT) {
            const kiln_elem kv = kiln_f2e(
                kiln_rope_rot(kiln_e2f(kx[d]), kiln_e2f(kx[d < HALF ? d + HALF : d - HALF]), rcs[d], rsn[d], d < HALF));
            knew[d] = kv;
            vnew[d] = vx[d];
            if (slot >= 0) {
                const size_t at = kiln_kv_at(slot / BLOCK_SIZE, h, slot % BLOCK_SIZE, d);
                ((kiln_elem *)p.k_cache)[at] = kv;
                ((kiln_elem *)p.v_cache)[at] = vx[d];
            }
        }
    }

    /* q for the G heads, KILN_VEC dims per lane, pre-scaled for exp2 (rotated here with p.qkv,
     * rounded to the element type as the rope kernel stores it). */
    float q[G][KILN_VEC];
    {
        const float qs = p.scale * KILN_LOG2E;
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

    if (rope) {
        __syncthreads(); /* knew, vnew ready */
#pragma unroll
        for (int u = 0; u < ATTN_UNROLL; u++)
            if (t0 + grp + u * NG == L - 1) k0[u] = *(const uint4 *)(knew + j * KILN_VEC);
    }

    /* 1. scores, ATTN_UNROLL tokens per lane group per step (their K loads in flight together; the
     * first step's are k0). Each step pulls its tokens' V toward L2 (the first step's were pulled
     * with k0), so V streams from HBM while the scores are computed and phase 3 reads it from L2.
     * The loop bound is warp-uniform so every shuffle has all lanes. */
    for (int tb = t0 + warp * TPW; tb < t1; tb += NG * ATTN_UNROLL) {
        const bool first = tb == t0 + warp * TPW;
        uint4 kr[ATTN_UNROLL];
#pragma unroll
        for (int u = 0; u < ATTN_UNROLL; u++) {
            const int t = tb + u * NG + lane / LPT;
            if (first) {
                kr[u] = k0[u];
            } else if (rope && t == L - 1) {
                kr[u] = *(const uint4 *)(knew + j * KILN_VEC);
            } else if (t < t1) {
                const size_t at = kiln_kv_at(blocks[t / BLOCK_SIZE - fb], h, t % BLOCK_SIZE, j * KILN_VEC);
                kr[u] = kiln_ld16(kc + at);
                kiln_prefetch_l2(vc + at);
            } else {
                kr[u] = make_uint4(0, 0, 0, 0);
            }
        }
#pragma unroll
        for (int u = 0; u < ATTN_UNROLL; u++) {
            const int t = tb + u * NG + lane / LPT;
            float k[KILN_VEC];
            kiln_unpackv(kr[u], k);
#pragma unroll
            for (int g = 0; g < G; g++) {
                float s = 0.0f;
#pragma unroll
                for (int e = 0; e < KILN_VEC; e++) s = fmaf(q[g][e], k[e], s);
#pragma unroll
                for (int o = LPT / 2; o > 0; o >>= 1) s += __shfl_xor_sync(KILN_FULL_MASK, s, o);
                if (t < t1 && j == 0) sc[g * PARTITION + (t - t0)] = s;
            }
        }
    }
    __syncthreads();

    /* 2. softmax statistics, one warp per head. */
    for (int g = warp; g < G; g += ATTN_WARPS) {
        float m = KILN_NEG_INF;
        for (int i = lane; i < n; i += 32) m = fmaxf(m, sc[g * PARTITION + i]);
        m = kiln_warp_max(m);
        float l = 0.0f;
        for (int i = lane; i < n; i += 32) {
            float e = exp2f(sc[g * PARTITION + i] - m);
            sc[g * PARTITION + i] = e;
            l += e;
        }
        l = kiln_warp_sum(l);
        if (lane == 0) {
            ml[2 * g] = m;
            ml[2 * g + 1] = l;
        }
    }
    __syncthreads();

    /* 3. o = P·V over this block's tokens. */
    float o[G][KILN_VEC];
#pragma unroll
    for (int g = 0; g < G; g++)
#pragma unroll
        for (int e = 0; e < KILN_VEC; e++) o[g][e] = 0.0f;
    for (int tb = t0 + grp; tb < t1; tb += NG * ATTN_UNROLL) {
        uint4 vr[ATTN_UNROLL];
#pragma unroll
        for (int u = 0; u < ATTN_UNROLL; u++) {
            const int t = tb + u * NG;
            if (rope && t == L - 1) {
                vr[u] = *(const uint4 *)(vnew + j * KILN_VEC);
            } else if (t < t1) {
                vr[u] = kiln_ld16(vc + kiln_kv_at(blocks[t / BLOCK_SIZE - fb], h, t % BLOCK_SIZE, j * KILN_VEC));
            }
        }
#pragma unroll
        for (int u = 0; u < ATTN_UNROLL; u++) { /* tokens in the same order as one at a time: same sums */
            const int t = tb + u * NG;
            if (t < t1) {
                float v[KILN_VEC];
                kiln_unpackv(vr[u], v);
#pragma unroll
                for (int g = 0; g < G; g++) {
                    const float pr = sc[g * PARTITION + (t - t0)];
#pragma unroll
                    for (int e = 0; e < KILN_VEC; e++) o[g][e] = fmaf(pr, v[e], o[g][e]);
                }
            }
        }
    }
    /* Sum the TPW groups of each warp (lanes with the same j), then the warps. */
#pragma unroll
    for (int g = 0; g < G; g++)
#pragma unroll
        for (int e = 0; e < KILN_VEC; e++)
#pragma unroll
            for (int off = LPT; off < 32; off <<= 1) o[g][e] += __shfl_xor_sync(KILN_FULL_MASK, o[g][e], off);
    if (lane < LPT)
#pragma unroll
        for (int g = 0; g < G; g++)
#pragma unroll
            for (int e = 0; e < KILN_VEC; e++) red[(warp * G + g) * HEAD_DIM + j * KILN_VEC + e] = o[g][e];
    __syncthreads();

    __shared__ int is_last;
    for (int i = threadIdx.x; i < G * HEAD_DIM; i += ATTN_WARPS * 32) {
        const int g = i / HEAD_DIM, d = i % HEAD_DIM;
        float acc = 0.0f;
#pragma unroll
        for (int w = 0; w < ATTN_WARPS; w++) acc += red[(w * G + g) * HEAD_DIM + d];
        const int hq = h * G + g;
        if (nsplit <= 1) {
            const float l = ml[2 * g + 1];
            ((kiln_elem *)p.out)[((size_t)b * N_HEADS + hq) * HEAD_DIM + d] = kiln_f2e(l > 0.0f ? acc / l : 0.0f);
        } else {
            const size_t ps = ((size_t)b * N_HEADS + hq) * p.max_splits + split;
            ((float *)p.part_o)[ps * HEAD_DIM + d] = acc;
            if (d == 0) {
                ((float *)p.part_ml)[ps * 2] = ml[2 * g];
                ((float *)p.part_ml)[ps * 2 + 1] = ml[2 * g + 1];
            }
        }
    }
    if (nsplit <= 1 || !p.counters) return;

    /* 4. the last split block of (b, h) to get here merges the G heads' splits */
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
    /* sc (scores) and red (partial o) are free now: they hold the splits' weights and sums */
    kiln_attn_merge<G, NT>(p, b, h * G, nsplit, sc, red, min(PARTITION, ATTN_WARPS * HEAD_DIM), ml);
}

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
