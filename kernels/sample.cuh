/*
 * sample.cuh — one token per row of logits, on the GPU: greedy argmax, or
 * a draw from softmax(logits / temperature) restricted by top-k then top-p
 * (HF's warper order), with a counter-based generator so that the same
 * (logits, seed, counter) always gives the same token.
 *
 * Method (one block of SAMPLE_THREADS per row, deterministic: every sum is
 * taken in a fixed order):
 *   1. max and argmax (ties: the lowest index, as torch.argmax). Greedy
 *      (temperature <= 0) stops here.
 *   2. top-k: the k-th largest logit, found exactly by building its 32-bit
 *      order key bit by bit (32 counting passes over the row). Every logit
 *      >= it is kept, so ties at the boundary may keep a few more than k.
 *   3. top-p: likewise the largest threshold whose kept mass
 *      sum exp((x - max)/T) is >= top_p times the top-k set's mass: the
 *      smallest set of the most likely tokens reaching top_p.
 *   4. u = uniform [0,1) from (seed, counter); the token is the first, in
 *      index order, at which the running kept mass exceeds u * total.
 *      Thread t owns a contiguous slice of the row; slice sums are scanned
 *      in shared memory, then the owning thread walks its slice.
 * Cost: about 66 reads of the row (from L2) per sampled token; fine for
 * decode at vocabularies up to 128K, and the place to optimise if the
 * sampler ever shows in a timeline.
 *
 * Constants: SAMPLE_THREADS (default 1024, a power of two).
 * Launch: grid (B), block SAMPLE_THREADS, no dynamic shared memory.
 */
#include "common.cuh"

#ifndef SAMPLE_THREADS
#define SAMPLE_THREADS 1024
#endif

/* Monotone map of a float to uint32: a < b  <=>  key(a) < key(b). */
KILN_DEV unsigned kiln_fkey(float f) {
    unsigned u = __float_as_uint(f);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}
KILN_DEV float kiln_fkey_inv(unsigned k) {
    return __uint_as_float((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k);
}

/* splitmix64 finaliser; the same function is the test's reference. */
KILN_DEV unsigned long long kiln_mix64(unsigned long long z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
/* Uniform in [0, 1) with 24 random bits, from (seed, counter). */
KILN_DEV float kiln_uniform(unsigned long long seed, unsigned long long counter) {
    unsigned long long z = kiln_mix64(seed + 0x9e3779b97f4a7c15ull * (counter + 1));
    z = kiln_mix64(z ^ 0x2545f4914f6cdd1dull);
    return (float)(z >> 40) * (1.0f / 16777216.0f);
}

/* Deterministic block sums of a count or a mass. */
KILN_DEV float kiln_bsum(float v, float *scratch) { return kiln_block_sum(v, scratch); }

extern "C" __global__ void __launch_bounds__(SAMPLE_THREADS) kiln_sample(const kiln_sample_params p) {
    __shared__ float scratch[32];
    __shared__ float scan[SAMPLE_THREADS];
    __shared__ int s_idx[32];
    const int b = blockIdx.x, tid = threadIdx.x, V = p.V;
    if (b >= p.B) return;
    const float *x = (const float *)p.logits + (size_t)b * V;

    /* 1. max and the first index holding it. */
    float mx = KILN_NEG_INF;
    int mi = 0x7fffffff;
    for (int i = tid; i < V; i += SAMPLE_THREADS) {
        float v = x[i];
        if (v > mx) { mx = v; mi = i; } /* strided: the first hit per thread is its lowest index */
    }
    const float gmax = kiln_block_max(mx, scratch);
    int cand = mx == gmax ? mi : 0x7fffffff;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) cand = min(cand, __shfl_xor_sync(KILN_FULL_MASK, cand, o));
    if ((tid & 31) == 0) s_idx[tid >> 5] = cand;
    __syncthreads();
    if (tid < 32) {
        int c = tid < SAMPLE_THREADS / 32 ? s_idx[tid] : 0x7fffffff;
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) c = min(c, __shfl_xor_sync(KILN_FULL_MASK, c, o));
        if (tid == 0) s_idx[0] = c;
    }
    __syncthreads();
    const int argmax = s_idx[0];
    const float temp = ((const float *)p.temperature)[b];
    if (!(temp > 0.0f) || V == 1) {
        if (tid == 0) ((int *)p.out_ids)[b] = argmax < V ? argmax : 0;
        return;
    }
    const float invt = 1.0f / temp;
    const int top_k = ((const int *)p.top_k)[b];
    const float top_p = ((const float *)p.top_p)[b];

    /* 2. top-k threshold key: the largest key with count(key >= it) >= k. */
    unsigned thr = 0;
    if (top_k > 0 && top_k < V) {
        for (int bit = 31; bit >= 0; bit--) {
            const unsigned c = thr | (1u << bit);
            float cnt = 0.0f;
            for (int i = tid; i < V; i += SAMPLE_THREADS) cnt += kiln_fkey(x[i]) >= c ? 1.0f : 0.0f;
            if (kiln_bsum(cnt, scratch) >= (float)top_k) thr = c;
        }
    }
    /* 3. top-p threshold over the kept set's mass. */
    if (top_p < 1.0f) {
        float z = 0.0f;
        for (int i = tid; i < V; i += SAMPLE_THREADS)
            if (kiln_fkey(x[i]) >= thr) z += expf((x[i] - gmax) * invt);
        const float target = top_p * kiln_bsum(z, scratch);
        /* mass(c) counts keys >= max(c, thr): equal to the whole kept mass for
         * c <= thr, so the search from 0 ends at or above thr. */
        unsigned pthr = 0;
        for (int bit = 31; bit >= 0; bit--) {
            const unsigned c = pthr | (1u << bit);
            float mass = 0.0f;
            for (int i = tid; i < V; i += SAMPLE_THREADS) {
                const unsigned k = kiln_fkey(x[i]);
                if (k >= c && k >= thr) mass += expf((x[i] - gmax) * invt);
            }
            if (kiln_bsum(mass, scratch) >= target) pthr = c;
        }
        thr = pthr > thr ? pthr : thr;
    }
    /* 4. the draw: contiguous slices, scanned in a fixed order. */
    const int per = (V + SAMPLE_THREADS - 1) / SAMPLE_THREADS;
    const int lo = min(V, tid * per), hi = min(V, lo + per);
    float mine = 0.0f;
    for (int i = lo; i < hi; i++)
        if (kiln_fkey(x[i]) >= thr) mine += expf((x[i] - gmax) * invt);
    scan[tid] = mine;
    __syncthreads();
    for (int off = 1; off < SAMPLE_THREADS; off <<= 1) { /* inclusive Hillis-Steele scan */
        const float add = tid >= off ? scan[tid - off] : 0.0f;
        __syncthreads();
        scan[tid] += add;
        __syncthreads();
    }
    const float total = scan[SAMPLE_THREADS - 1];
    const float u = kiln_uniform(((const unsigned long long *)p.seeds)[b], ((const unsigned long long *)p.counters)[b]);
    const float target = u * total;
    const float before = tid ? scan[tid - 1] : 0.0f;
    if (tid == 0) s_idx[1] = -1;
    __syncthreads();
    if (target >= before && target < scan[tid] && hi > lo) {
        float run = before;
        int pick = -1, last = -1;
        for (int i = lo; i < hi; i++) {
            if (kiln_fkey(x[i]) < thr) continue;
            last = i;
            run += expf((x[i] - gmax) * invt);
            if (run > target) { pick = i; break; }
        }
        s_idx[1] = pick >= 0 ? pick : last; /* rounding: the slice's last kept token */
    }
    __syncthreads();
    if (tid == 0) ((int *)p.out_ids)[b] = s_idx[1] >= 0 ? s_idx[1] : argmax;
}
