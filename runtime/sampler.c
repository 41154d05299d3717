/*
 * sampler.c — choose the next token from one row of logits.
 *
 *   greedy      temperature 0 (or top-k 1): the largest logit, lowest id on ties
 *   sampling    softmax(logits / temperature), then HuggingFace's warpers in
 *               their order: keep the top-k tokens, renormalise, keep the
 *               smallest prefix (by probability, descending) whose mass
 *               reaches top-p; draw with one uniform number u in [0, 1)
 *
 * The uniform number is not a stream: it is a hash of (seed, position of the
 * token being produced), so a request gives the same tokens alone or in a
 * batch, in any step layout, on any executor with the same logits
 * (kiln_exec.h).
 *
 * Cost: ranking uses a binary heap over the vocabulary (built in O(V)) and
 * pops only the tokens that survive top-k / top-p, O(V + kept · log V): with
 * top-k 40 over a 128k vocabulary that is one linear pass plus ~40 pops, not
 * a full sort per token. Order is (logit descending, id ascending), so ties
 * are broken by the lowest id everywhere. NaN logits rank below everything
 * and get probability 0.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kiln_exec.h"
#include "kiln_rt.h"

int32_t kiln_argmax(const float *x, int n) {
    int32_t best = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[best] || (isnan(x[best]) && !isnan(x[i]))) best = i;
    return best;
}

/* splitmix64's finalizer: a bijective 64-bit mix with full avalanche. */
static uint64_t mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

double kiln_sample_uniform(uint64_t seed, int64_t position) {
    uint64_t h = mix64(mix64(seed + 0x9e3779b97f4a7c15ull) ^ ((uint64_t)position * 0xd1b54a32d192ed03ull));
    return (double)(h >> 11) * 0x1.0p-53; /* 53 random bits: exactly representable, < 1 */
}

/* ---- ranking heap: ids ordered by (logit desc, id asc) ---- */

static float rank_key(const float *logits, int32_t id) {
    float v = logits[id];
    return isnan(v) ? -INFINITY : v;
}

/* true when id a ranks before id b */
static bool ranks_before(const float *logits, int32_t a, int32_t b) {
    float la = rank_key(logits, a), lb = rank_key(logits, b);
    return la > lb || (la == lb && a < b);
}

static void sift_down(const float *logits, int32_t *heap, int n, int i) {
    for (;;) {
        int best = i, l = 2 * i + 1, r = l + 1;
        if (l < n && ranks_before(logits, heap[l], heap[best])) best = l;
        if (r < n && ranks_before(logits, heap[r], heap[best])) best = r;
        if (best == i) return;
        int32_t t = heap[i];
        heap[i] = heap[best];
        heap[best] = t;
        i = best;
    }
}

static int32_t heap_pop(const float *logits, int32_t *heap, int *n) {
    int32_t top = heap[0];
    heap[0] = heap[--*n];
    sift_down(logits, heap, *n, 0);
    return top;
}

int32_t kiln_sample_logits(const float *logits, int vocab, const kiln_sampling *s, double u, float *scratch) {
    if (vocab <= 1 || !(s->temperature > 0) || s->top_k == 1) return kiln_argmax(logits, vocab);
    /* scratch: [0, vocab) probabilities indexed by id, [vocab, 2·vocab) the heap
     * of ids and then, from its front, the kept ids in rank order (the kept
     * prefix grows as the heap shrinks, so they never overlap). The memory is
     * the caller's malloc'd block; the second half is only ever accessed as
     * int32_t, which is its effective type in C's aliasing rules. */
    float *prob = scratch;
    int32_t *heap = (int32_t *)(void *)(scratch + vocab);
    float mx = rank_key(logits, kiln_argmax(logits, vocab));
    if (!isfinite(mx)) return kiln_argmax(logits, vocab);
    double total = 0;
    for (int i = 0; i < vocab; i++) {
        float v = logits[i];
        prob[i] = isnan(v) ? 0.0f : expf((v - mx) / s->temperature);
        total += prob[i];
        heap[i] = i;
    }
    int n = vocab;
    for (int i = n / 2 - 1; i >= 0; i--) sift_down(logits, heap, n, i);

    /* Pop ids in rank order. Each pop frees the last heap entry, where the
     * popped id is stored: the kept ids lie at heap[vocab-1], heap[vocab-2],
     * ... best first, never overlapping the shrinking heap. */
    int k = s->top_k > 0 && s->top_k < vocab ? s->top_k : vocab;
    bool nucleus = s->top_p > 0 && s->top_p < 1;
    int n_kept = 0;
    double mass = 0;
    if (k < vocab) {
        /* top-k first; top-p then applies to the renormalised top-k mass */
        for (; n_kept < k; n_kept++) {
            int32_t id = heap_pop(logits, heap, &n);
            heap[vocab - 1 - n_kept] = id;
            mass += prob[id];
        }
        if (nucleus) {
            double cum = 0, want = (double)s->top_p * mass;
            for (int i = 0; i < n_kept; i++) {
                if (i > 0 && cum >= want) {
                    n_kept = i;
                    break;
                }
                cum += prob[heap[vocab - 1 - i]];
            }
        }
    } else {
        /* no top-k: pop until the kept mass reaches top-p (or all is kept) */
        double want = nucleus ? (double)s->top_p * total : INFINITY;
        while (n > 0 && (n_kept == 0 || mass < want)) {
            int32_t id = heap_pop(logits, heap, &n);
            heap[vocab - 1 - n_kept++] = id;
            mass += prob[id];
        }
    }
    /* a token is kept iff the mass ranked before it is below top-p: HF's rule */
    double kept_mass = 0;
    for (int i = 0; i < n_kept; i++) kept_mass += prob[heap[vocab - 1 - i]];
    double r = u * kept_mass, cum = 0;
    for (int i = 0; i < n_kept; i++) {
        int32_t id = heap[vocab - 1 - i];
        cum += prob[id];
        if (r < cum) return id;
    }
    return heap[vocab - n_kept]; /* rounding at the top end: the last kept token */
}
