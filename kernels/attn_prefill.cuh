/*
 * attn_prefill.cuh — prefill attention, flash-attention style (online
 * softmax over key tiles, nothing of size seq x seq in memory): causal, GQA,
 * sliding window, reading q from the rope kernel's output and k/v from the
 * paged cache (so a chunk of a long prompt also sees the earlier chunks).
 *
 * This is the correct-first version: fp32 FMAs from shared memory, no
 * tensor cores. A block takes PF_BQ = 64 queries of one head of one
 * sequence and walks key tiles of PF_BK = 32 between the first key the
 * window lets the first query see and the last query's own position.
 * 128 threads: thread (ty = tid/8, tx = tid%8) owns query rows 4ty..4ty+3;
 * for scores the keys tx + 8c, for the output the dims tx + 8d, so lanes
 * of a warp hit different banks (rows are padded by one float).
 *
 * Masks: key j is seen from the query at position i iff j <= i and, with a
 * window, i - j < WINDOW. Rows past the chunk's end are computed on zeros
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

    const int hq = blockIdx.y, b = blockIdx.z, h = hq / G;
    const int tid = threadIdx.x, ty = tid >> 3, tx = tid & 7;
    const int qs0 = ((const int *)p.q_starts)[b];
    const int q_len = ((const int *)p.q_starts)[b + 1] - qs0;
    const int qi0 = blockIdx.x * PF_BQ;
    if (qi0 >= q_len) return;
    const int L = ((const int *)p.seq_lens)[b];
    const int ctx0 = L - q_len; /* position of the chunk's first query */
    const int nq = min(PF_BQ, q_len - qi0);
    const int p_first = ctx0 + qi0, p_last = ctx0 + qi0 + nq - 1;
    const int k_lo = WINDOW > 0 ? max(0, p_first - WINDOW + 1) : 0;
    const int *bt = (const int *)p.block_tables + (size_t)b * p.max_blocks;
    const kiln_bf16 *kc = (const kiln_bf16 *)p.k_cache, *vc = (const kiln_bf16 *)p.v_cache;

    const float qscale = p.scale * PF_LOG2E;
    for (int i = tid; i < PF_BQ * HEAD_DIM; i += 128) {
        const int r = i / HEAD_DIM, d = i % HEAD_DIM;
        float v = 0.0f;
        if (r < nq) v = kiln_bf2f(((const kiln_bf16 *)p.q)[((size_t)(qs0 + qi0 + r) * N_HEADS + hq) * HEAD_DIM + d]);
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
                const size_t at = (((size_t)bt[t / BLOCK_SIZE] * N_KV_HEADS + h) * BLOCK_SIZE + t % BLOCK_SIZE) * HEAD_DIM + d;
                kv = kiln_bf2f(kc[at]);
                vv = kiln_bf2f(vc[at]);
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
        kiln_bf16 *o = (kiln_bf16 *)p.out + ((size_t)(qs0 + qi0 + row) * N_HEADS + hq) * HEAD_DIM;
        const float inv = l[r] > 0.0f ? 1.0f / l[r] : 0.0f;
#pragma unroll
        for (int d = 0; d < DPT; d++) o[tx + 8 * d] = kiln_f2bf(acc[r][d] * inv);
    }
}
