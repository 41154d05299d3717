/*
 * sampler.c — choose the next token from one row of logits.
 *
 * The rule (a device sampler must follow it exactly to give the same tokens):
 *   0. a row that holds a NaN or +inf, or no logit above -inf, gives no
 *      token: KILN_TOKEN_NONFINITE (the model's arithmetic failed, and any
 *      token drawn from it would be silently wrong; -inf alone is a masked
 *      id, not a failure);
 *   1. greedy when temperature is 0 or top-k is 1: the largest logit, the
 *      lowest id among equals;
 *   2. else p_i = expf((l_i − max l) / temperature) in f32 (0 for -inf);
 *   3. candidates, in rank order (logit descending, then id ascending):
 *      top-k keeps the first k; top-p then keeps a candidate while the mass
 *      of the candidates ranked before it is below top_p × the mass of all
 *      candidates (HF's warper order: temperature, top-k, top-p; at least
 *      one is kept); min-p then drops candidates whose p is below min_p
 *      (p of the best is 1, so this is HF's min_p × the top probability);
 *   4. draw: walk the kept ids in ascending id order, summing p in double,
 *      and return the first whose running sum exceeds u × the kept mass (the
 *      last kept id with p > 0 if rounding leaves none).
 * Sums are in double: the top-k mass in rank order, the mass of the whole
 * vocabulary and the kept mass in id order.
 * With neither top-k nor top-p, step 3 keeps everything and the draw is one
 * pass over the vocabulary, with no ranking at all.
 *
 * The uniform number u is not a stream: it is a hash of (seed, position of
 * the token being produced), so a request gives the same tokens alone or in
 * a batch, in any step layout, on any executor with the same logits
 * (kiln_exec.h).
 *
 * Cost: no full sort. Top-k ranks the k best in one pass with a k-entry
 * heap (~V comparisons + k log k) and computes only their exp(); top-p
 * alone finds the nucleus by quickselect on rank with running mass, expected
 * O(V) whatever its size. The draw is one pass over the ids. Top-k 40 /
 * top-p 0.9 over a 128k vocabulary costs a few linear scans.
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

/* ---- ranking: ids ordered by (logit desc, id asc) ---- */

static float rank_key(const float *logits, int32_t id) {
    float v = logits[id];
    return isnan(v) ? -INFINITY : v;
}

/* true when id a ranks before id b */
static bool ranks_before(const float *logits, int32_t a, int32_t b) {
    float la = rank_key(logits, a), lb = rank_key(logits, b);
    return la > lb || (la == lb && a < b);
}

/* Min-heap on rank: the root is the worst-ranked id of the heap. */
static void sift_down_worst(const float *logits, int32_t *h, int n, int i) {
    for (;;) {
        int w = i, l = 2 * i + 1, r = l + 1;
        if (l < n && ranks_before(logits, h[w], h[l])) w = l;
        if (r < n && ranks_before(logits, h[w], h[r])) w = r;
        if (w == i) return;
        int32_t t = h[i];
        h[i] = h[w];
        h[w] = t;
        i = w;
    }
}

/* The k best-ranked ids into out[0..k), best first: one pass keeping a
 * k-entry heap of the best so far (an id enters only when it beats the
 * heap's worst, so a pass costs ~V comparisons plus O(k log k)), then a
 * heap sort. */
static void select_top(const float *logits, int vocab, int k, int32_t *out) {
    for (int i = 0; i < k; i++) out[i] = i;
    for (int i = k / 2 - 1; i >= 0; i--) sift_down_worst(logits, out, k, i);
    for (int i = k; i < vocab; i++)
        if (ranks_before(logits, i, out[0])) {
            out[0] = i;
            sift_down_worst(logits, out, k, 0);
        }
    for (int n = k - 1; n > 0; n--) { /* move the worst to the end, repeatedly */
        int32_t t = out[0];
        out[0] = out[n];
        out[n] = t;
        sift_down_worst(logits, out, n, 0);
    }
}

/* Top-p alone: the number m of best-ranked ids whose mass first reaches
 * `want` (the nucleus), found quickselect-style in expected O(V): the
 * segment cand[lo, hi) holds the ranks lo..hi-1 in some order, with
 * `before` the mass ranked ahead of it; the mass of the top lo ids is below
 * want, that of the top hi reaches it (or hi = V). Each round partitions the
 * segment around a pivot. On return cand[m-1] is the m-th best id. */
static int nucleus_size(const float *logits, const float *prob, int32_t *cand, int vocab, double want) {
    int lo = 0, hi = vocab;
    double before = 0;
    while (lo < hi) {
        /* pivot: median of three by rank, moved to the segment's end */
        int a = lo, b = lo + (hi - lo) / 2, c = hi - 1;
        if (ranks_before(logits, cand[b], cand[a])) { int32_t t = cand[a]; cand[a] = cand[b]; cand[b] = t; }
        if (ranks_before(logits, cand[c], cand[b])) { int32_t t = cand[b]; cand[b] = cand[c]; cand[c] = t; }
        if (ranks_before(logits, cand[b], cand[a])) { int32_t t = cand[a]; cand[a] = cand[b]; cand[b] = t; }
        int32_t pivot = cand[b];
        cand[b] = cand[c];
        cand[c] = pivot;
        /* ids ranked before the pivot to the front */
        int nl = lo;
        double left = 0;
        for (int i = lo; i < c; i++)
            if (ranks_before(logits, cand[i], pivot)) {
                int32_t t = cand[i];
                cand[i] = cand[nl];
                cand[nl++] = t;
                left += prob[t];
            }
        cand[c] = cand[nl];
        cand[nl] = pivot; /* the pivot now sits at its rank */
        if (nl > lo && before + left >= want) {
            hi = nl; /* the nucleus ends among the ids ranked before the pivot */
        } else if (before + left + prob[pivot] >= want) {
            return nl + 1; /* it ends at the pivot */
        } else {
            before += left + prob[pivot];
            lo = nl + 1;
        }
    }
    return vocab; /* rounding: the whole vocabulary never reached want */
}

bool kiln_logits_untrusted(const float *x, int n) {
    bool bad = false, any = false;
    for (int i = 0; i < n; i++) {
        bad |= isnan(x[i]) || x[i] == INFINITY;
        any |= x[i] > -INFINITY;
    }
    return bad || !any;
}

int32_t kiln_sample_logits(const float *logits, int vocab, const kiln_sampling *s, double u, float *scratch) {
    if (kiln_logits_untrusted(logits, vocab)) return KILN_TOKEN_NONFINITE;
    if (vocab <= 1 || !(s->temperature > 0) || s->top_k == 1) return kiln_argmax(logits, vocab);
    /* scratch: [0, vocab) probabilities indexed by id (only those of
     * candidates are read), [vocab, 2·vocab) candidate ids. The memory is the
     * caller's malloc'd block; the second half is only ever accessed as
     * int32_t, which is its effective type in C's aliasing rules. */
    float *prob = scratch;
    int32_t *cand = (int32_t *)(void *)(scratch + vocab);
    const float t = s->temperature;
    const bool nucleus = s->top_p > 0 && s->top_p < 1;
    const int32_t best = kiln_argmax(logits, vocab);
    const float mx = logits[best]; /* finite: rule 0 */
    int n_kept;
    if (s->top_k > 0 && s->top_k < vocab) {
        /* top-k: only the k best get a probability; top-p then cuts their
         * renormalised mass */
        int k = s->top_k;
        select_top(logits, vocab, k, cand);
        double mass = 0;
        for (int i = 0; i < k; i++) {
            float v = logits[cand[i]];
            prob[cand[i]] = isnan(v) ? 0.0f : expf((v - mx) / t);
            mass += prob[cand[i]];
        }
        n_kept = k;
        if (nucleus) {
            double before = 0, want = (double)s->top_p * mass;
            for (int i = 0; i < k; i++) {
                if (i > 0 && before >= want) {
                    n_kept = i;
                    break;
                }
                before += prob[cand[i]];
            }
        }
        if (s->min_p > 0)
            while (n_kept > 1 && !(prob[cand[n_kept - 1]] >= s->min_p)) n_kept--;
    } else {
        double total = 0;
        for (int i = 0; i < vocab; i++) {
            float v = logits[i];
            prob[i] = isnan(v) ? 0.0f : expf((v - mx) / t);
            total += prob[i];
        }
        if (!nucleus) {
            /* plain temperature sampling (min-p: only ids at or above it) */
            if (s->min_p > 0) {
                total = 0;
                for (int i = 0; i < vocab; i++) {
                    if (!(prob[i] >= s->min_p)) prob[i] = 0;
                    total += prob[i];
                }
            }
            double r = u * total, cum = 0;
            int32_t last = best;
            for (int i = 0; i < vocab; i++) {
                if (prob[i] == 0) continue;
                last = i;
                cum += prob[i];
                if (r < cum) return i;
            }
            return last; /* rounding at the top end */
        }
        for (int i = 0; i < vocab; i++) cand[i] = i;
        n_kept = nucleus_size(logits, prob, cand, vocab, (double)s->top_p * total);
    }
    /* draw: walk the ids in ascending order; kept = ranked no worse than
     * the last kept candidate (and, after top-p alone, at or above min-p:
     * both keep a prefix of the ranking, so kept is the shorter) */
    const int32_t worst = cand[n_kept - 1];
    const float floor_p = s->min_p > 0 ? s->min_p : 0.0f;
    double kept_mass = 0;
    for (int32_t i = 0; i < vocab; i++)
        if ((i == worst || ranks_before(logits, i, worst)) && prob[i] >= floor_p) kept_mass += prob[i];
    double r = u * kept_mass, cum = 0;
    int32_t last = best;
    for (int32_t i = 0; i < vocab; i++) {
        if (i != worst && !ranks_before(logits, i, worst)) continue;
        if (prob[i] == 0 || prob[i] < floor_p) continue;
        last = i;
        cum += prob[i];
        if (r < cum) return i;
    }
    return last; /* rounding at the top end */
}

/* ---- penalties and log-probabilities (the scheduler's host path) ---- */

#define SEEN_BIT (1 << 30) /* counts[t]: this bit = t occurs at all; below it, occurrences among outputs */

void kiln_apply_penalties(float *logits, int vocab, const int32_t *toks, int n_prompt, int n_total,
                          const kiln_penalties *p, int32_t *counts) {
    (void)vocab;
    for (int i = 0; i < n_total; i++) {
        int32_t t = toks[i];
        if (i >= n_prompt) counts[t]++;
        counts[t] |= SEEN_BIT;
    }
    const bool rep = p->repetition != 1.0f;
    for (int i = 0; i < n_total; i++) {
        int32_t t = toks[i], c = counts[t];
        if (c == 0) continue; /* already done */
        counts[t] = 0;
        float v = logits[t];
        if (rep) v = v > 0 ? v / p->repetition : v * p->repetition;
        int32_t out = c & (SEEN_BIT - 1);
        if (out > 0) v -= p->frequency * (float)out + p->presence;
        logits[t] = v;
    }
}

void kiln_logprobs(const float *logits, int vocab, int32_t token, int n_top, float *lp, int32_t *top_ids,
                   float *top_lps) {
    const int32_t best = kiln_argmax(logits, vocab);
    const float mx = rank_key(logits, best);
    double sum = 0;
    if (isfinite(mx))
        for (int i = 0; i < vocab; i++) {
            float v = logits[i];
            if (!isnan(v)) sum += exp((double)v - (double)mx);
        }
    /* log-sum-exp; with no finite maximum every token gets -inf or NaN's -inf */
    const double lse = isfinite(mx) ? (double)mx + log(sum) : INFINITY;
#define LOGPROB(id) (isnan(logits[id]) || !isfinite(lse) ? -INFINITY : (float)((double)logits[id] - lse))
    *lp = LOGPROB(token);
    if (n_top > vocab) n_top = vocab;
    if (n_top > 0) {
        select_top(logits, vocab, n_top, top_ids);
        for (int i = 0; i < n_top; i++) top_lps[i] = LOGPROB(top_ids[i]);
    }
#undef LOGPROB
}
