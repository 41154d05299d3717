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
                const size_t at = (((size_t)bt[t / BLOCK_SIZE] * N_KV_HEADS + h) * BLOCK_SIZE + t % BLOCK_SIZE) * HEAD_DIM + d;
                kv = kiln_e2f(kc[at]);
                vv = kiln_e2f(vc[at]);
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
 * kiln_attn_prefill_mma — the same contract on tensor cores (mma.sync
 * m16n8k16, bf16 in, fp32 accumulate), FlashAttention-2 style: a block of 4
 * warps takes 64 queries of one head, each warp 16 of them; q stays in
 * registers as A fragments, S = q k^T for a tile of 64 keys is 8 n-tiles of
 * C fragments, the online softmax runs on those registers (a row lives in
 * the 4 lanes of one quad), and P is re-packed in registers as the A operand
 * of O += P v. K is staged in shared memory as [key][d] and V transposed as
 * [d][key], rows padded by 8 bf16 so the quads' 32-bit fragment loads hit
 * 32 different banks. Needs HEAD_DIM % 16 == 0 and bf16 (not KILN_F32).
 * Launch: grid (ceil(max_q_len/64), N_HEADS, B), block 128, dynamic shared
 * memory kiln_attn_prefill_mma_smem = 2 * (64*(HEAD_DIM+8) + HEAD_DIM*72).
 * ---------------------------------------------------------------------- */
#if HEAD_DIM % 16 == 0 && !KILN_F32

KILN_DEV void kiln_pf_mma(float (&d)[4], unsigned a0, unsigned a1, unsigned a2, unsigned a3, unsigned b0,
                          unsigned b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
                 "{%8, %9}, {%0, %1, %2, %3};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

extern "C" __global__ void __launch_bounds__(128) kiln_attn_prefill_mma(const kiln_attn_prefill_params p) {
    constexpr int G = N_HEADS / N_KV_HEADS;
    constexpr int BK = 64;              /* keys per tile */
    constexpr int KS = HEAD_DIM + 8;    /* k_s row stride (bf16) */
    constexpr int VS = BK + 8;          /* vt_s row stride (bf16) */
    constexpr int DK = HEAD_DIM / 16;   /* mma k-steps over the head dim */
    constexpr int NT = BK / 8;          /* key n-tiles */
    constexpr int DT = HEAD_DIM / 8;    /* output n-tiles */
    extern __shared__ float smem_f[];
    kiln_bf16 *k_s = (kiln_bf16 *)smem_f;   /* [BK][KS] */
    kiln_bf16 *vt_s = k_s + BK * KS;        /* [HEAD_DIM][VS] */
    kiln_pdl_wait();

    const int hq = blockIdx.y, b = blockIdx.z, h = hq / G;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
    const int qs0 = ((const int *)p.q_starts)[b];
    const int q_len = ((const int *)p.q_starts)[b + 1] - qs0;
    const int qi0 = (gridDim.x - 1 - blockIdx.x) * 64; /* the longest (latest) tiles start first */
    if (qi0 >= q_len) return;
    const int L = ((const int *)p.seq_lens)[b];
    const int ctx0 = L - q_len;
    const int nq = min(64, q_len - qi0);
    const int p_first = ctx0 + qi0, p_last = ctx0 + qi0 + nq - 1;
    const int k_lo = WINDOW > 0 ? max(0, p_first - WINDOW + 1) : 0;
    const int *bt = (const int *)p.block_tables + (size_t)b * p.max_blocks;
    const kiln_bf16 *kc = (const kiln_bf16 *)p.k_cache, *vc = (const kiln_bf16 *)p.v_cache;

    /* This warp's rows: r0 = g, r1 = g + 8 of its 16; q positions for the masks. */
    const int row0 = warp * 16 + g, row1 = row0 + 8;
    const int qpos0 = ctx0 + qi0 + row0, qpos1 = ctx0 + qi0 + row1;
    const bool ok0 = row0 < nq, ok1 = row1 < nq;

    /* q as A fragments, pre-scaled by scale*log2(e) (rounded to bf16 once). */
    unsigned qa[DK][4];
    {
        const float qs = p.scale * PF_LOG2E;
        const kiln_bf16 *q = (const kiln_bf16 *)p.q;
        const kiln_bf16 *q0 = q + ((size_t)(qs0 + qi0 + min(row0, nq - 1)) * N_HEADS + hq) * HEAD_DIM;
        const kiln_bf16 *q1 = q + ((size_t)(qs0 + qi0 + min(row1, nq - 1)) * N_HEADS + hq) * HEAD_DIM;
#pragma unroll
        for (int kk = 0; kk < DK; kk++) {
            const int d = kk * 16 + 2 * t;
            qa[kk][0] = kiln_f2bf2(kiln_bf2f(q0[d]) * qs, kiln_bf2f(q0[d + 1]) * qs);
            qa[kk][1] = kiln_f2bf2(kiln_bf2f(q1[d]) * qs, kiln_bf2f(q1[d + 1]) * qs);
            qa[kk][2] = kiln_f2bf2(kiln_bf2f(q0[d + 8]) * qs, kiln_bf2f(q0[d + 9]) * qs);
            qa[kk][3] = kiln_f2bf2(kiln_bf2f(q1[d + 8]) * qs, kiln_bf2f(q1[d + 9]) * qs);
        }
    }
    float o[DT][4];
#pragma unroll
    for (int i = 0; i < DT; i++) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.0f;
    float m0 = KILN_NEG_INF, m1 = KILN_NEG_INF, l0 = 0.0f, l1 = 0.0f;

    for (int kt = k_lo; kt <= p_last; kt += BK) {
        __syncthreads(); /* previous tile fully read */
        /* stage K [key][d] and V^T [d][key]; 16-byte global loads */
        for (int i = tid; i < BK * (HEAD_DIM / 8); i += 128) {
            const int c = i / (HEAD_DIM / 8), d8 = (i % (HEAD_DIM / 8)) * 8, key = kt + c;
            uint4 kv = make_uint4(0, 0, 0, 0), vv = make_uint4(0, 0, 0, 0);
            if (key <= p_last) {
                const size_t at = (((size_t)bt[key / BLOCK_SIZE] * N_KV_HEADS + h) * BLOCK_SIZE + key % BLOCK_SIZE) * HEAD_DIM + d8;
                kv = kiln_ld16(kc + at);
                vv = kiln_ld16(vc + at);
            }
            *(uint4 *)(k_s + c * KS + d8) = kv;
            const unsigned vw[4] = {vv.x, vv.y, vv.z, vv.w};
#pragma unroll
            for (int e = 0; e < 4; e++) {
                vt_s[(d8 + 2 * e) * VS + c] = (kiln_bf16)(vw[e] & 0xffffu);
                vt_s[(d8 + 2 * e + 1) * VS + c] = (kiln_bf16)(vw[e] >> 16);
            }
        }
        __syncthreads();

        /* S = q k^T: NT n-tiles of 8 keys */
        float s[NT][4];
#pragma unroll
        for (int n = 0; n < NT; n++) {
            s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
            const kiln_bf16 *kr = k_s + (n * 8 + g) * KS + 2 * t;
#pragma unroll
            for (int kk = 0; kk < DK; kk++) {
                const unsigned b0 = *(const unsigned *)(kr + kk * 16), b1 = *(const unsigned *)(kr + kk * 16 + 8);
                kiln_pf_mma(s[n], qa[kk][0], qa[kk][1], qa[kk][2], qa[kk][3], b0, b1);
            }
        }
        /* masks and the tile's row maxima (a row is spread over the quad's 4 lanes) */
        float tm0 = KILN_NEG_INF, tm1 = KILN_NEG_INF;
#pragma unroll
        for (int n = 0; n < NT; n++)
#pragma unroll
            for (int e = 0; e < 2; e++) {
                const int key = kt + n * 8 + 2 * t + e;
                if (!(ok0 && key <= qpos0 && (WINDOW == 0 || qpos0 - key < WINDOW))) s[n][e] = KILN_NEG_INF;
                if (!(ok1 && key <= qpos1 && (WINDOW == 0 || qpos1 - key < WINDOW))) s[n][2 + e] = KILN_NEG_INF;
                tm0 = fmaxf(tm0, s[n][e]);
                tm1 = fmaxf(tm1, s[n][2 + e]);
            }
        tm0 = fmaxf(tm0, __shfl_xor_sync(KILN_FULL_MASK, tm0, 1));
        tm0 = fmaxf(tm0, __shfl_xor_sync(KILN_FULL_MASK, tm0, 2));
        tm1 = fmaxf(tm1, __shfl_xor_sync(KILN_FULL_MASK, tm1, 1));
        tm1 = fmaxf(tm1, __shfl_xor_sync(KILN_FULL_MASK, tm1, 2));
        const float mn0 = fmaxf(m0, tm0), mn1 = fmaxf(m1, tm1);
        const float al0 = mn0 == KILN_NEG_INF ? 1.0f : exp2f(m0 - mn0);
        const float al1 = mn1 == KILN_NEG_INF ? 1.0f : exp2f(m1 - mn1);
        float rs0 = 0.0f, rs1 = 0.0f;
#pragma unroll
        for (int n = 0; n < NT; n++)
#pragma unroll
            for (int e = 0; e < 2; e++) {
                s[n][e] = s[n][e] == KILN_NEG_INF ? 0.0f : exp2f(s[n][e] - mn0);
                s[n][2 + e] = s[n][2 + e] == KILN_NEG_INF ? 0.0f : exp2f(s[n][2 + e] - mn1);
                rs0 += s[n][e];
                rs1 += s[n][2 + e];
            }
        rs0 += __shfl_xor_sync(KILN_FULL_MASK, rs0, 1);
        rs0 += __shfl_xor_sync(KILN_FULL_MASK, rs0, 2);
        rs1 += __shfl_xor_sync(KILN_FULL_MASK, rs1, 1);
        rs1 += __shfl_xor_sync(KILN_FULL_MASK, rs1, 2);
        l0 = l0 * al0 + rs0;
        l1 = l1 * al1 + rs1;
        m0 = mn0;
        m1 = mn1;
#pragma unroll
        for (int i = 0; i < DT; i++) {
            o[i][0] *= al0; o[i][1] *= al0;
            o[i][2] *= al1; o[i][3] *= al1;
        }
        /* O += P v: P re-packed as A fragments, 16 keys per k-step */
#pragma unroll
        for (int kk = 0; kk < BK / 16; kk++) {
            const unsigned a0 = kiln_f2bf2(s[2 * kk][0], s[2 * kk][1]);
            const unsigned a1 = kiln_f2bf2(s[2 * kk][2], s[2 * kk][3]);
            const unsigned a2 = kiln_f2bf2(s[2 * kk + 1][0], s[2 * kk + 1][1]);
            const unsigned a3 = kiln_f2bf2(s[2 * kk + 1][2], s[2 * kk + 1][3]);
#pragma unroll
            for (int i = 0; i < DT; i++) {
                const kiln_bf16 *vr = vt_s + (i * 8 + g) * VS + kk * 16 + 2 * t;
                kiln_pf_mma(o[i], a0, a1, a2, a3, *(const unsigned *)vr, *(const unsigned *)(vr + 8));
            }
        }
    }
    const float inv0 = l0 > 0.0f ? 1.0f / l0 : 0.0f, inv1 = l1 > 0.0f ? 1.0f / l1 : 0.0f;
    kiln_bf16 *out = (kiln_bf16 *)p.out;
#pragma unroll
    for (int i = 0; i < DT; i++) {
        const int d = i * 8 + 2 * t;
        if (ok0)
            *(unsigned *)(out + ((size_t)(qs0 + qi0 + row0) * N_HEADS + hq) * HEAD_DIM + d) =
                kiln_f2bf2(o[i][0] * inv0, o[i][1] * inv0);
        if (ok1)
            *(unsigned *)(out + ((size_t)(qs0 + qi0 + row1) * N_HEADS + hq) * HEAD_DIM + d) =
                kiln_f2bf2(o[i][2] * inv1, o[i][3] * inv1);
    }
}
#endif /* HEAD_DIM % 16 == 0 && !KILN_F32 */
