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

/* inv_freq[i], i < HEAD_DIM/2, as HF's default / llama3 rope init computes it in fp32. */
KILN_DEV float kiln_rope_inv_freq(int i) {
    float inv = 1.0f / powf(ROPE_THETA, (float)(2 * i) / (float)HEAD_DIM);
#if ROPE_LLAMA3
    const float lo_wavelen = (float)ROPE_ORIG_MAX_POS / ROPE_LOW_FREQ_FACTOR;
    const float hi_wavelen = (float)ROPE_ORIG_MAX_POS / ROPE_HIGH_FREQ_FACTOR;
    const float wavelen = 2.0f * 3.14159265358979323846f / inv;
    if (wavelen > lo_wavelen) {
        inv = inv / ROPE_FACTOR; /* low frequencies: fully scaled */
    } else if (!(wavelen < hi_wavelen)) {
        /* medium: smooth blend between scaled and unscaled */
        float smooth = ((float)ROPE_ORIG_MAX_POS / wavelen - ROPE_LOW_FREQ_FACTOR) /
                       (ROPE_HIGH_FREQ_FACTOR - ROPE_LOW_FREQ_FACTOR);
        inv = (1.0f - smooth) * inv / ROPE_FACTOR + smooth * inv;
    }
#endif
    return inv;
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
        const kiln_elem ra = kiln_f2e(a * c - b * s), rb = kiln_f2e(b * c + a * s);
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
