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
 * writes unnormalised o with its (max, sum) and kiln_attn_decode_combine
 * merges the splits: o = sum_s 2^(m_s - M) o_s / sum_s 2^(m_s - M) l_s.
 *
 * Constants: N_HEADS, N_KV_HEADS, HEAD_DIM (8..256 a power of two; 4..128
 * with KILN_F32),
 * BLOCK_SIZE, WINDOW (0 = full attention), PARTITION (the largest split the
 * shared memory is sized for, default 512), ATTN_WARPS (default 4). The
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

    /* q for the G heads, KILN_VEC dims per lane, pre-scaled for exp2. */
    float q[G][KILN_VEC];
    {
        const float qs = p.scale * KILN_LOG2E;
        const kiln_elem *qp = (const kiln_elem *)p.q + ((size_t)b * N_HEADS + h * G) * HEAD_DIM + j * KILN_VEC;
#pragma unroll
        for (int g = 0; g < G; g++) {
            kiln_unpackv(kiln_ld16(qp + g * HEAD_DIM), q[g]);
#pragma unroll
            for (int e = 0; e < KILN_VEC; e++) q[g][e] *= qs;
        }
    }

    __syncthreads(); /* blocks[] ready */

    /* 1. scores. The loop bound is warp-uniform so every shuffle has all lanes. */
    for (int tb = t0 + warp * TPW; tb < t1; tb += NG) {
        const int t = tb + lane / LPT;
        const bool ok = t < t1;
        float k[KILN_VEC];
        if (ok) {
            const int blk = blocks[t / BLOCK_SIZE - fb];
            const size_t at = (((size_t)blk * N_KV_HEADS + h) * BLOCK_SIZE + t % BLOCK_SIZE) * HEAD_DIM + j * KILN_VEC;
            kiln_unpackv(kiln_ld16(kc + at), k);
        } else {
#pragma unroll
            for (int e = 0; e < KILN_VEC; e++) k[e] = 0.0f;
        }
#pragma unroll
        for (int g = 0; g < G; g++) {
            float s = 0.0f;
#pragma unroll
            for (int e = 0; e < KILN_VEC; e++) s = fmaf(q[g][e], k[e], s);
#pragma unroll
            for (int o = LPT / 2; o > 0; o >>= 1) s += __shfl_xor_sync(KILN_FULL_MASK, s, o);
            if (ok && j == 0) sc[g * PARTITION + (t - t0)] = s;
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
    for (int t = t0 + grp; t < t1; t += NG) {
        const int blk = blocks[t / BLOCK_SIZE - fb];
        const size_t at = (((size_t)blk * N_KV_HEADS + h) * BLOCK_SIZE + t % BLOCK_SIZE) * HEAD_DIM + j * KILN_VEC;
        float v[KILN_VEC];
        kiln_unpackv(kiln_ld16(vc + at), v);
#pragma unroll
        for (int g = 0; g < G; g++) {
            const float pr = sc[g * PARTITION + (t - t0)];
#pragma unroll
            for (int e = 0; e < KILN_VEC; e++) o[g][e] = fmaf(pr, v[e], o[g][e]);
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
