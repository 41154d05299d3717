/*
 * rope_kv.cuh — rotary position embedding on q and k straight out of the
 * fused QKV projection, fused with the store of k and v into the paged KV
 * cache. One block per token and slice of heads: grid.y cuts the token's
 * N_HEADS + N_KV_HEADS rotated heads and its v (one more unit) into
 * gridDim.y slices, so a decode step of a few tokens spreads over as many
 * blocks as heads (one block doing a token's 40 heads in turn took 11 us a
 * launch on the H200, Qwen3-8B) and a prefill step keeps one block a token.
 *
 * Pairing is HuggingFace's rotate_half: element i pairs with i + HEAD_DIM/2
 *     out[i]        = x[i] cos(a_i) - x[i+h] sin(a_i)
 *     out[i + h]    = x[i+h] cos(a_i) + x[i] sin(a_i),  h = HEAD_DIM/2
 * with a_i = pos * inv_freq[i], inv_freq[i] = 1 / ROPE_THETA^(2i/HEAD_DIM)
 * in fp32 as HF computes it, optionally rescaled the llama3 way. The
 * rotation itself is done in fp32 and rounded once (HF rounds cos/sin and
 * each product to bf16; fp32 is closer to the fp32 reference). Elements are
 * kiln_elem (bf16, or fp32 with KILN_F32; common.cuh), the cache's too.
 *
 * Qwen's extras (the qkv_rope op's +qkv_bias and +qk_norm), in HF's order:
 *   QKV_BIAS 1: p.bias [(N_HEADS + 2*N_KV_HEADS) * HEAD_DIM] is added to q, k
 *     and v first (rounded to the element type, as HF's biased projection
 *     output is; the GEMM's output was rounded once already);
 *   QK_NORM 1: then each head of q and k is RMS-normalised over HEAD_DIM in
 *     fp32 (eps QK_NORM_EPS), rounded, and scaled by p.q_norm / p.k_norm
 *     [HEAD_DIM], rounded again (Qwen3RMSNorm), before the rotation.
 *
 * With KILN_KV8 (an 8-bit cache) k and v go into the cache as codes of their
 * rounded values, kiln_kv_code8 with p.kv_scale's scale of their kv head.
 *
 * Constants: N_HEADS, N_KV_HEADS, HEAD_DIM (even), BLOCK_SIZE, ROPE_THETA
 * (float), ROPE_LLAMA3 (0/1) with ROPE_FACTOR, ROPE_LOW_FREQ_FACTOR,
 * ROPE_HIGH_FREQ_FACTOR, ROPE_ORIG_MAX_POS; ROPE_THREADS (default 128);
 * QKV_BIAS, QK_NORM (0/1, default 0), QK_NORM_EPS.
 * Launch: grid (T, S) with S in 1..N_HEADS + N_KV_HEADS + 1, block ROPE_THREADS.
 */
#include "common.cuh"

#if !defined(N_HEADS) || !defined(N_KV_HEADS) || !defined(HEAD_DIM) || !defined(BLOCK_SIZE)
#error "rope_kv.cuh needs N_HEADS, N_KV_HEADS, HEAD_DIM, BLOCK_SIZE"
#endif
#ifndef ROPE_THETA
#define ROPE_THETA 10000.0f
#endif
#ifndef ROPE_LLAMA3
#define ROPE_LLAMA3 0
#endif
#ifndef ROPE_THREADS
#define ROPE_THREADS 128
#endif
#if HEAD_DIM % 2
#error "HEAD_DIM must be even"
#endif

#ifndef QKV_BIAS
#define QKV_BIAS 0
#endif
#ifndef QK_NORM
#define QK_NORM 0
#endif
#ifndef QK_NORM_EPS
#define QK_NORM_EPS 1e-6f
#endif

#ifndef ROPE_FACTOR
#define ROPE_FACTOR 1.0f
#endif
#ifndef ROPE_LOW_FREQ_FACTOR
#define ROPE_LOW_FREQ_FACTOR 1.0f
#endif
#ifndef ROPE_HIGH_FREQ_FACTOR
#define ROPE_HIGH_FREQ_FACTOR 4.0f
#endif
#ifndef ROPE_ORIG_MAX_POS
#define ROPE_ORIG_MAX_POS 8192.0f
#endif

/* inv_freq[i], i < HEAD_DIM/2 (common.cuh: the same function decode attention's fused path uses). */
KILN_DEV float kiln_rope_inv_freq(int i) {
    return kiln_rope_freq(i, HEAD_DIM, ROPE_THETA, ROPE_LLAMA3, ROPE_FACTOR, ROPE_LOW_FREQ_FACTOR, ROPE_HIGH_FREQ_FACTOR,
                          (float)ROPE_ORIG_MAX_POS);
}

/* Element i of the token's projection row with its bias (QKV_BIAS), as HF's biased projection gives it. */
KILN_DEV float kiln_qkv_at(const kiln_elem *row, const kiln_elem *bias, int i) {
#if QKV_BIAS
    return kiln_round(kiln_e2f(row[i]) + kiln_e2f(bias[i]));
#else
    (void)bias;
    return kiln_e2f(row[i]);
#endif
}

extern "C" __global__ void __launch_bounds__(ROPE_THREADS) kiln_rope_kv(const kiln_rope_kv_params p) {
    constexpr int HALF = HEAD_DIM / 2;
    constexpr int QKV = (N_HEADS + 2 * N_KV_HEADS) * HEAD_DIM;
    __shared__ float cs_s[HALF], sn_s[HALF]; /* the token's rotation, one angle per pair index */
    const int t = blockIdx.x;
    if (t >= p.T) return;
    /* this block's units: rotated heads [h0, min(h1, NH)), and v when h1 > NH */
    constexpr int NH = N_HEADS + N_KV_HEADS;
    const int h0 = (int)(blockIdx.y * (NH + 1) / gridDim.y), h1 = (int)((blockIdx.y + 1) * (NH + 1) / gridDim.y);
    const int hr = min(h1, NH);
    /* the angles need only the position, a step input: computed before the wait */
    const int pos = ((const int *)p.positions)[t];
    for (int i = threadIdx.x; i < HALF; i += ROPE_THREADS) sincosf((float)pos * kiln_rope_inv_freq(i), &sn_s[i], &cs_s[i]);
    const int slot = ((const int *)p.slots)[t];
    kiln_pdl_wait();
    const kiln_elem *row = (const kiln_elem *)p.qkv + (size_t)t * QKV;
    const kiln_elem *bias = (const kiln_elem *)p.bias;
#if QK_NORM
    /* each q and k head's 1 / rms, one warp per head at a time */
    __shared__ float inv_s[NH];
    for (int head = h0 + (int)threadIdx.x / 32; head < hr; head += ROPE_THREADS / 32) {
        float ss = 0.0f;
        for (int d = threadIdx.x % 32; d < HEAD_DIM; d += 32) {
            const float x = kiln_qkv_at(row, bias, head * HEAD_DIM + d);
            ss = fmaf(x, x, ss);
        }
        ss = kiln_warp_sum(ss);
        if (threadIdx.x % 32 == 0) inv_s[head] = rsqrtf(ss / (float)HEAD_DIM + QK_NORM_EPS);
    }
#endif
    __syncthreads();
    const int blk = slot / BLOCK_SIZE, off = slot % BLOCK_SIZE;
    kiln_elem *q_out = (kiln_elem *)p.q_out + (size_t)t * N_HEADS * HEAD_DIM;
    kiln_elem *kc = (kiln_elem *)p.k_cache;

    /* Rotated pairs (head, i), (head, i + HALF) over the q heads then the k heads; KILN_VEC pairs
     * per step in 16-byte chunks when HALF allows, else one at a time. */
    constexpr int VEC = HALF % KILN_VEC == 0 ? KILN_VEC : 1;
    constexpr int CH = HALF / VEC; /* chunks per half head */
    for (int j = threadIdx.x; j < (hr - h0) * CH; j += ROPE_THREADS) {
        const int head = h0 + j / CH, i0 = (j % CH) * VEC;
        const kiln_elem *src = row + head * HEAD_DIM;
        kiln_elem *dst = head < N_HEADS ? q_out + head * HEAD_DIM
                                        : kc + kiln_kv_at(blk, head - N_HEADS, off, 0);
        if (head >= N_HEADS && slot < 0) continue;
        /* an 8-bit cache (KILN_KV8): a k head's codes and its scale */
        const bool k8 = KILN_KV8 && head >= N_HEADS;
        unsigned char *k8p = (unsigned char *)p.k_cache + (k8 ? kiln_kv_at(blk, head - N_HEADS, off, 0) : 0);
        const float ks = k8 ? kiln_kv_scale(p.kv_scale, head - N_HEADS) : 1.0f;
        float a[KILN_VEC], b[KILN_VEC];
        if (VEC == KILN_VEC) {
            kiln_unpackv(*(const uint4 *)(src + i0), a);
            kiln_unpackv(*(const uint4 *)(src + i0 + HALF), b);
#if QKV_BIAS
            float ba[KILN_VEC], bb[KILN_VEC];
            kiln_unpackv(*(const uint4 *)(bias + head * HEAD_DIM + i0), ba);
            kiln_unpackv(*(const uint4 *)(bias + head * HEAD_DIM + i0 + HALF), bb);
#pragma unroll
            for (int e = 0; e < VEC; e++) {
                a[e] = kiln_round(a[e] + ba[e]);
                b[e] = kiln_round(b[e] + bb[e]);
            }
#endif
        } else {
            a[0] = kiln_qkv_at(row, bias, head * HEAD_DIM + i0);
            b[0] = kiln_qkv_at(row, bias, head * HEAD_DIM + i0 + HALF);
        }
#if QK_NORM
        {
            const kiln_elem *w = (const kiln_elem *)(head < N_HEADS ? p.q_norm : p.k_norm);
            const float inv = inv_s[head];
#pragma unroll
            for (int e = 0; e < VEC; e++) {
                a[e] = kiln_round(kiln_e2f(w[i0 + e]) * kiln_round(a[e] * inv));
                b[e] = kiln_round(kiln_e2f(w[i0 + e + HALF]) * kiln_round(b[e] * inv));
            }
        }
#endif
        if (VEC == KILN_VEC) {
            float ra[KILN_VEC], rb[KILN_VEC];
#pragma unroll
            for (int e = 0; e < KILN_VEC; e++) {
                const float c = cs_s[i0 + e], sn = sn_s[i0 + e];
                ra[e] = kiln_round(kiln_rope_rot(a[e], b[e], c, sn, true));
                rb[e] = kiln_round(kiln_rope_rot(b[e], a[e], c, sn, false));
            }
            if (k8) { /* codes of the rounded values (decode attention's too) */
                kiln_kv_store8(k8p + i0, ra, ks);
                kiln_kv_store8(k8p + i0 + HALF, rb, ks);
            } else {
                *(uint4 *)(dst + i0) = kiln_packv(ra);
                *(uint4 *)(dst + i0 + HALF) = kiln_packv(rb);
            }
        } else {
            const float c = cs_s[i0], sn = sn_s[i0];
            const float ra = kiln_round(kiln_rope_rot(a[0], b[0], c, sn, true));
            const float rb = kiln_round(kiln_rope_rot(b[0], a[0], c, sn, false));
            if (k8) {
                k8p[i0] = (unsigned char)kiln_kv_code8(ra, ks);
                k8p[i0 + HALF] = (unsigned char)kiln_kv_code8(rb, ks);
            } else {
                dst[i0] = kiln_f2e(ra);
                dst[i0 + HALF] = kiln_f2e(rb);
            }
        }
    }
    /* v: copied into the cache (with its bias), by the block with the last unit */
    if (slot >= 0 && h1 > NH) {
        constexpr int V0 = (N_HEADS + N_KV_HEADS) * HEAD_DIM;
        const kiln_elem *v = row + V0;
        for (int j = threadIdx.x; j < N_KV_HEADS * HEAD_DIM; j += ROPE_THREADS) {
            const int kh = j / HEAD_DIM, d = j % HEAD_DIM;
#if QKV_BIAS
            (void)v;
            const kiln_elem x = kiln_f2e(kiln_qkv_at(row, bias, V0 + j));
#else
            const kiln_elem x = v[j];
#endif
#if KILN_KV8
            ((unsigned char *)p.v_cache)[kiln_kv_at(blk, kh, off, d)] =
                (unsigned char)kiln_kv_code8(kiln_e2f(x), kiln_kv_scale(p.kv_scale, N_KV_HEADS + kh));
#else
            ((kiln_elem *)p.v_cache)[kiln_kv_at(blk, kh, off, d)] = x;
#endif
        }
    }
}
