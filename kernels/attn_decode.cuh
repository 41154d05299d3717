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
 *
 * Constants: N_HEADS, N_KV_HEADS, HEAD_DIM (8..256 a power of two; 4..128
 * with KILN_F32),
 * BLOCK_SIZE, WINDOW (0 = full attention), PARTITION (the largest split the
 * shared memory is sized for, default 512), ATTN_WARPS (default 4),
 * ATTN_UNROLL (tokens whose K or V loads a lane group issues together,
 * default 4: one at a time kept too few bytes in flight to go past ~65% of
 * bandwidth at batch 64). The
 * split size itself is a run-time parameter (p.partition <= PARTITION): small
 * batches take short splits so that the grid fills the GPU
 * (kiln_attn_decode_partition in runtime/cuda/kernels.c). With p.partition
 * = 0 each sequence picks its own split size from its length n (the tokens
 * it attends to): the smallest multiple of 32 >= ceil(n / p.splits_want),
 * at least ceil(n / max_splits), clamped to [32, PARTITION]; so a launch
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
    int part = max((n + want - 1) / want, (n + most - 1) / most);
    part = (part + 31) / 32 * 32;
    return min(max(part, 32), PARTITION);
}

extern "C" __global__ void __launch_bounds__(ATTN_WARPS * 32) kiln_attn_decode(const kiln_attn_decode_params p) {
    constexpr int G = N_HEADS / N_KV_HEADS;
    constexpr int LPT = HEAD_DIM / KILN_VEC; /* lanes per token */
    constexpr int TPW = 32 / LPT;       /* tokens per warp step */
    constexpr int NG = ATTN_WARPS * TPW; /* token groups in the block */
    extern __shared__ float smem[];
    float *sc = smem;                            /* [G][PARTITION] scores, then probabilities */
    float *red = sc + G * PARTITION;             /* [ATTN_WARPS][G][HEAD_DIM] partial o */
    float *ml = red + ATTN_WARPS * G * HEAD_DIM; /* [G][2] max, sum */
    int *blocks = (int *)(ml + 2 * G);           /* [PARTITION/BLOCK_SIZE + 2] block ids of this split */
    kiln_pdl_wait();

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
        for (int i = threadIdx.x; i < nb; i += ATTN_WARPS * 32) blocks[i] = bt[fb + i];
    }
    const kiln_elem *kc = (const kiln_elem *)p.k_cache, *vc = (const kiln_elem *)p.v_cache;

    /* Fused RoPE (p.qkv): the block holding the last token rotates that token's k and keeps k, v in
     * shared memory (read from there below, not from the cache), storing both into the cache. */
    constexpr int QKVW = (N_HEADS + 2 * N_KV_HEADS) * HEAD_DIM, HALF = HEAD_DIM / 2;
    __shared__ __align__(16) kiln_elem knew[HEAD_DIM], vnew[HEAD_DIM];
    const bool rope = p.qkv != 0;
    const kiln_elem *qrow = rope ? (const kiln_elem *)p.qkv + (size_t)b * QKVW : (const kiln_elem *)0;
    const int pos = rope ? ((const int *)p.positions)[b] : 0;
    if (rope && split == nsplit - 1) {
        const int slot = ((const int *)p.slots)[b];
        const kiln_elem *kx = qrow + (N_HEADS + h) * HEAD_DIM, *vx = qrow + (N_HEADS + N_KV_HEADS + h) * HEAD_DIM;
        for (int d = threadIdx.x; d < HEAD_DIM; d += ATTN_WARPS * 32) {
            float sn, cs;
            sincosf((float)pos * kiln_rope_freq(d % HALF, HEAD_DIM, p.rope_theta, p.rope_llama3, p.rope_factor,
                                                p.rope_low_freq_factor, p.rope_high_freq_factor, p.rope_orig_max_pos),
                    &sn, &cs);
            const kiln_elem kv = kiln_f2e(
                kiln_rope_rot(kiln_e2f(kx[d]), kiln_e2f(kx[d < HALF ? d + HALF : d - HALF]), cs, sn, d < HALF));
            knew[d] = kv;
            vnew[d] = vx[d];
            if (slot >= 0) {
                const size_t at = (((size_t)(slot / BLOCK_SIZE) * N_KV_HEADS + h) * BLOCK_SIZE + slot % BLOCK_SIZE) * HEAD_DIM + d;
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
            float cs[KILN_VEC], sn[KILN_VEC];
#pragma unroll
            for (int e = 0; e < KILN_VEC; e++)
                sincosf((float)pos * kiln_rope_freq((j * KILN_VEC + e) % HALF, HEAD_DIM, p.rope_theta, p.rope_llama3,
                                                    p.rope_factor, p.rope_low_freq_factor, p.rope_high_freq_factor,
                                                    p.rope_orig_max_pos),
                        &sn[e], &cs[e]);
#pragma unroll
            for (int g = 0; g < G; g++) {
                const kiln_elem *x = qrow + (h * G + g) * HEAD_DIM;
#pragma unroll
                for (int e = 0; e < KILN_VEC; e++) {
                    const int d = j * KILN_VEC + e;
                    const float r = kiln_rope_rot(kiln_e2f(x[d]), kiln_e2f(x[d < HALF ? d + HALF : d - HALF]), cs[e], sn[e], d < HALF);
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

    __syncthreads(); /* blocks[] ready */

    /* 1. scores, ATTN_UNROLL tokens per lane group per step (their K loads in flight together).
     * The loop bound is warp-uniform so every shuffle has all lanes. */
    for (int tb = t0 + warp * TPW; tb < t1; tb += NG * ATTN_UNROLL) {
        uint4 kr[ATTN_UNROLL];
#pragma unroll
        for (int u = 0; u < ATTN_UNROLL; u++) {
            const int t = tb + u * NG + lane / LPT;
            if (rope && t == L - 1) {
                kr[u] = *(const uint4 *)(knew + j * KILN_VEC);
            } else if (t < t1) {
                const int blk = blocks[t / BLOCK_SIZE - fb];
                kr[u] = kiln_ld16(kc + (((size_t)blk * N_KV_HEADS + h) * BLOCK_SIZE + t % BLOCK_SIZE) * HEAD_DIM + j * KILN_VEC);
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
                const int blk = blocks[t / BLOCK_SIZE - fb];
                vr[u] = kiln_ld16(vc + (((size_t)blk * N_KV_HEADS + h) * BLOCK_SIZE + t % BLOCK_SIZE) * HEAD_DIM + j * KILN_VEC);
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
    /* per head: the max over splits and the weights 2^(m_s - M) (in sc, free now), then the denominator */
    const bool staged = nsplit <= PARTITION;
    for (int g = warp; g < G; g += ATTN_WARPS) {
        const size_t base = ((size_t)b * N_HEADS + h * G + g) * p.max_splits;
        const float *pml = (const float *)p.part_ml + base * 2;
        float M = KILN_NEG_INF;
        for (int s = lane; s < nsplit; s += 32) M = fmaxf(M, __ldcg(pml + 2 * s));
        M = kiln_warp_max(M);
        if (staged)
            for (int s = lane; s < nsplit; s += 32) sc[g * PARTITION + s] = exp2f(__ldcg(pml + 2 * s) - M);
        __syncwarp();
        if (lane == 0) {
            float den = 0.0f;
            for (int s = 0; s < nsplit; s++)
                den += (staged ? sc[g * PARTITION + s] : exp2f(__ldcg(pml + 2 * s) - M)) * __ldcg(pml + 2 * s + 1);
            ml[2 * g] = M;
            ml[2 * g + 1] = den;
        }
    }
    __syncthreads();
    /* each thread owns OPT outputs and walks the splits once for all of them (independent loads in flight) */
    constexpr int NT = ATTN_WARPS * 32, OPT = (G * HEAD_DIM + NT - 1) / NT;
    float num[OPT];
#pragma unroll
    for (int k = 0; k < OPT; k++) num[k] = 0.0f;
#pragma unroll 2
    for (int s = 0; s < nsplit; s++) {
#pragma unroll
        for (int k = 0; k < OPT; k++) {
            const int i = threadIdx.x + k * NT;
            if (i < G * HEAD_DIM) {
                const int g = i / HEAD_DIM, d = i % HEAD_DIM;
                const size_t base = ((size_t)b * N_HEADS + h * G + g) * p.max_splits;
                const float f = staged ? sc[g * PARTITION + s] : exp2f(__ldcg((const float *)p.part_ml + (base + s) * 2) - ml[2 * g]);
                num[k] += f * __ldcg((const float *)p.part_o + (base + s) * HEAD_DIM + d);
            }
        }
    }
#pragma unroll
    for (int k = 0; k < OPT; k++) {
        const int i = threadIdx.x + k * NT;
        if (i < G * HEAD_DIM) {
            const int g = i / HEAD_DIM, d = i % HEAD_DIM;
            const float den = ml[2 * g + 1];
            ((kiln_elem *)p.out)[((size_t)b * N_HEADS + h * G + g) * HEAD_DIM + d] = kiln_f2e(den > 0.0f ? num[k] / den : 0.0f);
        }
    }
}

extern "C" __global__ void kiln_attn_decode_combine(const kiln_attn_decode_params p) {
    kiln_pdl_wait();
    const int hq = blockIdx.x, b = blockIdx.y;
    const int L = ((const int *)p.seq_lens)[b];
    const int nsplit = kiln_attn_nsplits(L, kiln_attn_part(p, L));
    if (nsplit <= 1) return; /* the split kernel wrote the output itself */
    const size_t base = ((size_t)b * N_HEADS + hq) * p.max_splits;
    const float *pml = (const float *)p.part_ml + base * 2;
    float M = KILN_NEG_INF;
    for (int s = 0; s < nsplit; s++) M = fmaxf(M, pml[2 * s]);
    float den = 0.0f;
    for (int s = 0; s < nsplit; s++) den += exp2f(pml[2 * s] - M) * pml[2 * s + 1];
    for (int d = threadIdx.x; d < HEAD_DIM; d += blockDim.x) {
        float num = 0.0f;
        for (int s = 0; s < nsplit; s++)
            num += exp2f(pml[2 * s] - M) * ((const float *)p.part_o)[(base + s) * HEAD_DIM + d];
        ((kiln_elem *)p.out)[((size_t)b * N_HEADS + hq) * HEAD_DIM + d] = kiln_f2e(den > 0.0f ? num / den : 0.0f);
    }
}
