/*
 * sample.cuh — one token per row of fp32 logits, on the GPU, by exactly the
 * rule of the CPU sampler (runtime/sampler.c: kiln_sample_logits with the
 * uniform number of kiln_sample_uniform), so that both executors pick the
 * same token from the same logits:
 *   0. a row holding a NaN or +inf, or no logit above -inf, gives
 *      KILN_TOKEN_NONFINITE (-2, runtime/kiln_exec.h): no token;
 *   1. greedy when temperature <= 0 (or NaN), top_k == 1 or V == 1: the
 *      largest logit, the lowest index among equals;
 *   2. p_i = expf((l_i - max) / temperature) in fp32 (0 for -inf);
 *   3. rank order is (logit descending, index ascending), NaN ranking as
 *      -inf. Top-k (0 < k < V) keeps the first k; top-p (0 < p < 1) then
 *      keeps a candidate while the mass ranked before it is below
 *      p x (the candidates' mass), the first always (HF's order:
 *      temperature, top-k, top-p);
 *   4. u = uniform [0, 1) with 53 bits from (seed, position of the token
 *      being produced) — kiln_sample_uniform's hash; the token is the first
 *      kept index, in index order, at which the running sum of p (double)
 *      exceeds u x the kept mass; the last kept index with p > 0 if rounding
 *      leaves none.
 * Sums are in double in a fixed order, so a row always gives the same token;
 * against the CPU they differ only by summation order (about 1e-16
 * relative), which matters only for a draw within that distance of an edge.
 *
 * Method, one block of SAMPLE_THREADS per row:
 *   - argmax by a strided pass and two block reductions;
 *   - a rank threshold is a 32-bit order key of the logit plus an index
 *     cut among the logits equal to it: the key is found bit by bit (32
 *     counting or mass-summing passes over the row, each a block sum), the
 *     cut by one pass over contiguous per-thread slices and a block scan;
 *   - the draw: per-slice kept mass, an exclusive block scan, then every
 *     thread walks its own slice and the lowest crossing index wins.
 * Cost: greedy is one pass; top-k or top-p about 35 passes each (from L2):
 * tens of microseconds at V = 32000, fine for decode.
 *
 * Parameters: counters[b] is the position of the token being produced (the
 * `position` of kiln_sample_uniform). Constants: SAMPLE_THREADS (default
 * 1024, a multiple of 32). Launch: grid (B), block SAMPLE_THREADS, no
 * dynamic shared memory.
 */
#include "common.cuh"

#ifndef SAMPLE_THREADS
#define SAMPLE_THREADS 1024
#endif
#if SAMPLE_THREADS % 32 || SAMPLE_THREADS > 1024
#error "SAMPLE_THREADS must be a multiple of 32, at most 1024"
#endif
#define KILN_SW (SAMPLE_THREADS / 32) /* warps */

/* Monotone map of a float to uint32: a < b  <=>  key(a) < key(b). */
KILN_DEV unsigned kiln_fkey(float f) {
    unsigned u = __float_as_uint(f);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}
KILN_DEV float kiln_fkey_inv(unsigned k) { return __uint_as_float((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k); }
/* The rank key of a logit: NaN ranks as -inf. */
KILN_DEV unsigned kiln_rkey(float v) { return kiln_fkey(isnan(v) ? KILN_NEG_INF : v); }

/* splitmix64's finaliser, as runtime/sampler.c. */
KILN_DEV unsigned long long kiln_mix64(unsigned long long z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
/* kiln_sample_uniform(seed, position): 53 random bits in [0, 1). */
KILN_DEV double kiln_uniform53(unsigned long long seed, unsigned long long position) {
    unsigned long long h = kiln_mix64(kiln_mix64(seed + 0x9e3779b97f4a7c15ull) ^ (position * 0xd1b54a32d192ed03ull));
    return (double)(h >> 11) * (1.0 / 9007199254740992.0);
}

/* ---- deterministic block reductions and scans (fixed order) ---- */

typedef struct kiln_sample_smem {
    double d[KILN_SW];
    int i[KILN_SW];
    float f[KILN_SW];
} kiln_sample_smem;

KILN_DEV double kiln_bsum_d(double v, kiln_sample_smem *sm) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(KILN_FULL_MASK, v, o);
    __syncthreads(); /* scratch may still be read by a previous call */
    if (lane == 0) sm->d[warp] = v;
    __syncthreads();
    double t = 0.0;
    for (int w = 0; w < KILN_SW; w++) t += sm->d[w]; /* every thread, same order */
    return t;
}
KILN_DEV int kiln_bsum_i(int v, kiln_sample_smem *sm) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(KILN_FULL_MASK, v, o);
    __syncthreads();
    if (lane == 0) sm->i[warp] = v;
    __syncthreads();
    int t = 0;
    for (int w = 0; w < KILN_SW; w++) t += sm->i[w];
    return t;
}
KILN_DEV int kiln_bmin_i(int v, kiln_sample_smem *sm) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = min(v, __shfl_xor_sync(KILN_FULL_MASK, v, o));
    __syncthreads();
    if (lane == 0) sm->i[warp] = v;
    __syncthreads();
    int t = sm->i[0];
    for (int w = 1; w < KILN_SW; w++) t = min(t, sm->i[w]);
    return t;
}
KILN_DEV int kiln_bmax_i(int v, kiln_sample_smem *sm) { return -kiln_bmin_i(-v, sm); }
KILN_DEV float kiln_bmax_f(float v, kiln_sample_smem *sm) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(KILN_FULL_MASK, v, o));
    __syncthreads();
    if (lane == 0) sm->f[warp] = v;
    __syncthreads();
    float t = sm->f[0];
    for (int w = 1; w < KILN_SW; w++) t = fmaxf(t, sm->f[w]);
    return t;
}
/* Exclusive scan over the threads in index order; *total gets the sum. */
KILN_DEV int kiln_bscan_i(int v, kiln_sample_smem *sm, int *total) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int inc = v;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        int n = __shfl_up_sync(KILN_FULL_MASK, inc, o);
        if (lane >= o) inc += n;
    }
    __syncthreads();
    if (lane == 31) sm->i[warp] = inc;
    __syncthreads();
    int before = 0, t = 0;
    for (int w = 0; w < KILN_SW; w++) {
        if (w == warp) before = t;
        t += sm->i[w];
    }
    *total = t;
    return before + inc - v;
}
KILN_DEV double kiln_bscan_d(double v, kiln_sample_smem *sm, double *total) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    double inc = v;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        double n = __shfl_up_sync(KILN_FULL_MASK, inc, o);
        if (lane >= o) inc += n;
    }
    __syncthreads();
    if (lane == 31) sm->d[warp] = inc;
    __syncthreads();
    double before = 0.0, t = 0.0;
    for (int w = 0; w < KILN_SW; w++) {
        if (w == warp) before = t;
        t += sm->d[w];
    }
    *total = t;
    /* the exclusive prefix inside the warp, summed in lane order */
    double excl = __shfl_up_sync(KILN_FULL_MASK, inc, 1);
    return before + (lane ? excl : 0.0);
}

/* A rank threshold: kept iff key > k, or key == k and index <= cut. */
typedef struct kiln_cut {
    unsigned key;
    int cut;
} kiln_cut;
KILN_DEV bool kiln_in(kiln_cut c, unsigned key, int i) { return key > c.key || (key == c.key && i <= c.cut); }

/* The index of the n-th (1-based) element in index order with rank key `key`
 * that `pre` admits: one pass over contiguous slices and a block scan. */
KILN_DEV int kiln_nth_equal(const float *x, int V, unsigned key, kiln_cut pre, bool use_pre, int n,
                            kiln_sample_smem *sm) {
    const int per = (V + SAMPLE_THREADS - 1) / SAMPLE_THREADS;
    const int lo = min(V, (int)threadIdx.x * per), hi = min(V, lo + per);
    int mine = 0;
    for (int i = lo; i < hi; i++) {
        const unsigned k = kiln_rkey(x[i]);
        mine += k == key && (!use_pre || kiln_in(pre, k, i));
    }
    int total;
    const int before = kiln_bscan_i(mine, sm, &total);
    int found = 0x7fffffff;
    if (n > before && n <= before + mine) {
        int seen = before;
        for (int i = lo; i < hi; i++) {
            const unsigned k = kiln_rkey(x[i]);
            if (k == key && (!use_pre || kiln_in(pre, k, i)) && ++seen == n) {
                found = i;
                break;
            }
        }
    }
    found = kiln_bmin_i(found, sm);
    return found == 0x7fffffff ? V - 1 : found;
}

extern "C" __global__ void __launch_bounds__(SAMPLE_THREADS) kiln_sample(const kiln_sample_params p) {
    __shared__ kiln_sample_smem sm;
    kiln_pdl_wait();
    const int b = blockIdx.x, tid = threadIdx.x, V = p.V;
    if (b >= p.B) return;
    const float *x = (const float *)p.logits + (size_t)b * V;

    /* 1. the argmax: the lowest index of the largest non-NaN logit; and rule 0 on the way. */
    float mx = KILN_NEG_INF;
    int mi = -1, bad = 0;
    for (int i = tid; i < V; i += SAMPLE_THREADS) {
        const float v = x[i];
        bad |= isnan(v) || (isinf(v) && v > 0.0f);
        if (!isnan(v) && (mi < 0 || v > mx)) { mx = v; mi = i; } /* strided: first hit is the lowest index */
    }
    const float gmax = kiln_bmax_f(mi >= 0 ? mx : KILN_NEG_INF, &sm);
    if (__syncthreads_or(bad) || gmax == KILN_NEG_INF) { /* the same answer in every thread */
        if (tid == 0) ((int *)p.out_ids)[b] = -2; /* KILN_TOKEN_NONFINITE */
        return;
    }
    const int argmax = kiln_bmin_i(mi >= 0 && mx == gmax ? mi : 0x7fffffff, &sm); /* gmax is finite */
    const float temp = ((const float *)p.temperature)[b];
    const int top_k = ((const int *)p.top_k)[b];
    const float top_p = ((const float *)p.top_p)[b];
    const float lmax = x[argmax];
    if (V <= 1 || !(temp > 0.0f) || top_k == 1) {
        if (tid == 0) ((int *)p.out_ids)[b] = argmax;
        return;
    }
#define KILN_PROB(v) (isnan(v) ? 0.0f : expf(((v) - lmax) / temp))

    /* 2. top-k: the k-th best (key, index). */
    const bool use_k = top_k > 0 && top_k < V;
    kiln_cut ck = {0u, V - 1}; /* admits everything */
    if (use_k) {
        unsigned key = 0;
        for (int bit = 31; bit >= 0; bit--) {
            const unsigned c = key | (1u << bit);
            int cnt = 0;
            for (int i = tid; i < V; i += SAMPLE_THREADS) cnt += kiln_rkey(x[i]) >= c;
            if (kiln_bsum_i(cnt, &sm) >= top_k) key = c;
        }
        int gt = 0;
        for (int i = tid; i < V; i += SAMPLE_THREADS) gt += kiln_rkey(x[i]) > key;
        gt = kiln_bsum_i(gt, &sm);
        ck.key = key;
        ck.cut = kiln_nth_equal(x, V, key, ck, false, top_k - gt, &sm);
    }

    /* 3. top-p over the top-k candidates (or all). */
    kiln_cut cp = ck;
    if (top_p > 0.0f && top_p < 1.0f) {
        double z = 0.0;
        for (int i = tid; i < V; i += SAMPLE_THREADS) {
            const float v = x[i];
            if (kiln_in(ck, kiln_rkey(v), i)) z += (double)KILN_PROB(v);
        }
        const double want = (double)top_p * kiln_bsum_d(z, &sm);
        /* the largest key whose candidates at or above it hold >= want */
        unsigned key = 0;
        for (int bit = 31; bit >= 0; bit--) {
            const unsigned c = key | (1u << bit);
            double m = 0.0;
            for (int i = tid; i < V; i += SAMPLE_THREADS) {
                const float v = x[i];
                const unsigned k = kiln_rkey(v);
                if (k >= c && kiln_in(ck, k, i)) m += (double)KILN_PROB(v);
            }
            if (kiln_bsum_d(m, &sm) >= want) key = c;
        }
        /* candidates above the key are all kept; those equal to it, in index
         * order, while the mass ranked before them stays below want */
        double above = 0.0;
        int n_above = 0, n_eq = 0;
        for (int i = tid; i < V; i += SAMPLE_THREADS) {
            const float v = x[i];
            const unsigned k = kiln_rkey(v);
            if (!kiln_in(ck, k, i)) continue;
            if (k > key) { above += (double)KILN_PROB(v); n_above++; }
            else if (k == key) n_eq++;
        }
        above = kiln_bsum_d(above, &sm);
        n_above = kiln_bsum_i(n_above, &sm);
        n_eq = kiln_bsum_i(n_eq, &sm);
        /* every tie has the same logit, so the same probability (a NaN ranks
         * as -inf: probability 0 either way) */
        const double peq = (double)KILN_PROB(kiln_fkey_inv(key));
        int keep = 0;
        double before = above;
        for (int j = 0; j < n_eq; j++) {
            if (!(n_above == 0 && j == 0) && !(before < want)) break;
            keep++;
            before += peq;
        }
        if (keep < 1) keep = 1; /* cannot happen: the key was chosen with mass >= want */
        cp.key = key;
        cp.cut = kiln_nth_equal(x, V, key, ck, true, keep, &sm);
    }

    /* 4. the draw over the kept set, in index order. */
    const double u = kiln_uniform53(((const unsigned long long *)p.seeds)[b], ((const unsigned long long *)p.counters)[b]);
    const int per = (V + SAMPLE_THREADS - 1) / SAMPLE_THREADS;
    const int lo = min(V, tid * per), hi = min(V, lo + per);
    double mine = 0.0;
    for (int i = lo; i < hi; i++) {
        const float v = x[i];
        if (kiln_in(ck, kiln_rkey(v), i) && kiln_in(cp, kiln_rkey(v), i)) mine += (double)KILN_PROB(v);
    }
    double total;
    const double start = kiln_bscan_d(mine, &sm, &total);
    const double r = u * total;
    int pick = 0x7fffffff, last = -1;
    double run = start;
    for (int i = lo; i < hi; i++) {
        const float v = x[i];
        const unsigned k = kiln_rkey(v);
        if (!kiln_in(ck, k, i) || !kiln_in(cp, k, i)) continue;
        const float pr = KILN_PROB(v);
        if (pr == 0.0f) continue;
        last = i;
        run += (double)pr;
        if (r < run && pick == 0x7fffffff) pick = i;
    }
    pick = kiln_bmin_i(pick, &sm);
    last = kiln_bmax_i(last, &sm);
    if (tid == 0) ((int *)p.out_ids)[b] = pick != 0x7fffffff ? pick : last >= 0 ? last : argmax;
#undef KILN_PROB
}
