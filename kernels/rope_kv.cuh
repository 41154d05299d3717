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
    kiln_pdl_wait();
    constexpr int HALF = HEAD_DIM / 2;
    constexpr int QKV = (N_HEADS + 2 * N_KV_HEADS) * HEAD_DIM;
    const int t = blockIdx.x;
    if (t >= p.T) return;
    const kiln_elem *row = (const kiln_elem *)p.qkv + (size_t)t * QKV;
    const int pos = ((const int *)p.positions)[t];
    const int slot = ((const int *)p.slots)[t];
    const int blk = slot / BLOCK_SIZE, off = slot % BLOCK_SIZE;
    kiln_elem *q_out = (kiln_elem *)p.q_out + (size_t)t * N_HEADS * HEAD_DIM;
    kiln_elem *kc = (kiln_elem *)p.k_cache, *vc = (kiln_elem *)p.v_cache;

    /* Rotated pairs: (head, i) over the q heads then the k heads. */
    for (int j = threadIdx.x; j < (N_HEADS + N_KV_HEADS) * HALF; j += ROPE_THREADS) {
        const int head = j / HALF, i = j % HALF;
        float s, c;
        sincosf((float)pos * kiln_rope_inv_freq(i), &s, &c);
        const kiln_elem *src = row + head * HEAD_DIM;
        const float a = kiln_e2f(src[i]), b = kiln_e2f(src[i + HALF]);
        const kiln_elem ra = kiln_f2e(kiln_rope_rot(a, b, c, s, true)), rb = kiln_f2e(kiln_rope_rot(b, a, c, s, false));
        if (head < N_HEADS) {
            q_out[head * HEAD_DIM + i] = ra;
            q_out[head * HEAD_DIM + i + HALF] = rb;
        } else if (slot >= 0) {
            const int kh = head - N_HEADS;
            kiln_elem *dst = kc + (((size_t)blk * N_KV_HEADS + kh) * BLOCK_SIZE + off) * HEAD_DIM;
            dst[i] = ra;
            dst[i + HALF] = rb;
        }
    }
    /* v: a plain copy into the cache. */
    if (slot >= 0) {
        const kiln_elem *v = row + (N_HEADS + N_KV_HEADS) * HEAD_DIM;
        for (int j = threadIdx.x; j < N_KV_HEADS * HEAD_DIM; j += ROPE_THREADS) {
            const int kh = j / HEAD_DIM, d = j % HEAD_DIM;
            vc[(((size_t)blk * N_KV_HEADS + kh) * BLOCK_SIZE + off) * HEAD_DIM + d] = v[j];
        }
    }
}
