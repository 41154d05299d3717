/*
 * rope_kv.cuh — rotary position embedding on q and k straight out of the
 * fused QKV projection, fused with the store of k and v into the paged KV
 * cache. One block per token.
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
 * Constants: N_HEADS, N_KV_HEADS, HEAD_DIM (even), BLOCK_SIZE, ROPE_THETA
 * (float), ROPE_LLAMA3 (0/1) with ROPE_FACTOR, ROPE_LOW_FREQ_FACTOR,
 * ROPE_HIGH_FREQ_FACTOR, ROPE_ORIG_MAX_POS; ROPE_THREADS (default 128).
 * Launch: grid (T), block ROPE_THREADS.
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

extern "C" __global__ void __launch_bounds__(ROPE_THREADS) kiln_rope_kv(const kiln_rope_kv_params p) {
    constexpr int HALF = HEAD_DIM / 2;
    constexpr int QKV = (N_HEADS + 2 * N_KV_HEADS) * HEAD_DIM;
    __shared__ float cs_s[HALF], sn_s[HALF]; /* the token's rotation, one angle per pair index */
    const int t = blockIdx.x;
    if (t >= p.T) return;
    /* the angles need only the position, a step input: computed before the wait */
    const int pos = ((const int *)p.positions)[t];
    for (int i = threadIdx.x; i < HALF; i += ROPE_THREADS) sincosf((float)pos * kiln_rope_inv_freq(i), &sn_s[i], &cs_s[i]);
    const int slot = ((const int *)p.slots)[t];
    __syncthreads();
    kiln_pdl_wait();
    const kiln_elem *row = (const kiln_elem *)p.qkv + (size_t)t * QKV;
    const int blk = slot / BLOCK_SIZE, off = slot % BLOCK_SIZE;
    kiln_elem *q_out = (kiln_elem *)p.q_out + (size_t)t * N_HEADS * HEAD_DIM;
    kiln_elem *kc = (kiln_elem *)p.k_cache, *vc = (kiln_elem *)p.v_cache;

    /* Rotated pairs (head, i), (head, i + HALF) over the q heads then the k heads; KILN_VEC pairs
     * per step in 16-byte chunks when HALF allows, else one at a time. */
    constexpr int VEC = HALF % KILN_VEC == 0 ? KILN_VEC : 1;
    constexpr int CH = HALF / VEC; /* chunks per half head */
    for (int j = threadIdx.x; j < (N_HEADS + N_KV_HEADS) * CH; j += ROPE_THREADS) {
        const int head = j / CH, i0 = (j % CH) * VEC;
        const kiln_elem *src = row + head * HEAD_DIM;
        kiln_elem *dst = head < N_HEADS ? q_out + head * HEAD_DIM
                                        : kc + kiln_kv_at(blk, head - N_HEADS, off, 0);
        if (head >= N_HEADS && slot < 0) continue;
        if (VEC == KILN_VEC) {
            float a[KILN_VEC], b[KILN_VEC], ra[KILN_VEC], rb[KILN_VEC];
            kiln_unpackv(*(const uint4 *)(src + i0), a);
            kiln_unpackv(*(const uint4 *)(src + i0 + HALF), b);
#pragma unroll
            for (int e = 0; e < KILN_VEC; e++) {
                const float c = cs_s[i0 + e], sn = sn_s[i0 + e];
                ra[e] = kiln_round(kiln_rope_rot(a[e], b[e], c, sn, true));
                rb[e] = kiln_round(kiln_rope_rot(b[e], a[e], c, sn, false));
            }
            *(uint4 *)(dst + i0) = kiln_packv(ra);
            *(uint4 *)(dst + i0 + HALF) = kiln_packv(rb);
        } else {
            const float a = kiln_e2f(src[i0]), b = kiln_e2f(src[i0 + HALF]), c = cs_s[i0], sn = sn_s[i0];
            dst[i0] = kiln_f2e(kiln_rope_rot(a, b, c, sn, true));
            dst[i0 + HALF] = kiln_f2e(kiln_rope_rot(b, a, c, sn, false));
        }
    }
    /* v: a plain copy into the cache. */
    if (slot >= 0) {
        const kiln_elem *v = row + (N_HEADS + N_KV_HEADS) * HEAD_DIM;
        for (int j = threadIdx.x; j < N_KV_HEADS * HEAD_DIM; j += ROPE_THREADS) {
            const int kh = j / HEAD_DIM, d = j % HEAD_DIM;
            vc[kiln_kv_at(blk, kh, off, d)] = v[j];
        }
    }
}
