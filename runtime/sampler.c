/*
 * sampler.c — choose the next token from logits: greedy (temperature 0),
 * or softmax(logits / temperature) restricted to the top-k tokens and then
 * to the smallest set whose probability reaches top-p, drawn with a seeded
 * xorshift64* generator so a seed reproduces a run.
 */
#include <math.h>
#include <stdlib.h>

#include "kiln_rt.h"

int32_t kiln_argmax(const float *x, int n) {
    int32_t best = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    return best;
}

static uint64_t splitmix64(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* uniform in [0, 1) */
static double next_uniform(kiln_sampler *s) {
    s->state ^= s->state >> 12;
    s->state ^= s->state << 25;
    s->state ^= s->state >> 27;
    return (double)((s->state * 0x2545f4914f6cdd1dull) >> 11) * 0x1.0p-53;
}

kiln_status kiln_sampler_init(kiln_sampler *s, int vocab, float temperature, int top_k, float top_p, uint64_t seed,
                              kiln_error *err) {
    *s = (kiln_sampler){.temperature = temperature, .top_k = top_k, .top_p = top_p, .vocab = vocab};
    if (!(temperature >= 0) || !isfinite(temperature))
        return kiln_err(err, KILN_ERR_INVALID_ARG, "temperature %g must be >= 0", temperature);
    if (top_k < 0) return kiln_err(err, KILN_ERR_INVALID_ARG, "top-k %d must be >= 0 (0 = off)", top_k);
    if (!(top_p > 0 && top_p <= 1)) return kiln_err(err, KILN_ERR_INVALID_ARG, "top-p %g must be in (0, 1]", top_p);
    uint64_t st = seed;
    s->state = splitmix64(&st);
    if (!s->state) s->state = 1;
    s->probs = malloc((size_t)vocab * sizeof *s->probs);
    s->idx = malloc((size_t)vocab * sizeof *s->idx);
    if (!s->probs || !s->idx) {
        kiln_sampler_free(s);
        return kiln_err(err, KILN_ERR_NOMEM, "out of memory for the sampler");
    }
    return KILN_OK;
}

void kiln_sampler_free(kiln_sampler *s) {
    free(s->probs);
    free(s->idx);
    s->probs = NULL;
    s->idx = NULL;
}

/* qsort_r comparator: indices by descending probability, then ascending index. */
static int by_prob_desc(const void *a, const void *b, void *ctx) {
    const float *probs = ctx;
    float pa = probs[*(const int32_t *)a], pb = probs[*(const int32_t *)b];
    if (pa != pb) return pa < pb ? 1 : -1;
    return *(const int32_t *)a - *(const int32_t *)b;
}

int32_t kiln_sampler_sample(kiln_sampler *s, const float *logits) {
    int n = s->vocab;
    if (s->temperature == 0 || s->top_k == 1) return kiln_argmax(logits, n);
    float mx = logits[kiln_argmax(logits, n)];
    double sum = 0;
    for (int i = 0; i < n; i++) {
        s->probs[i] = expf((logits[i] - mx) / s->temperature);
        sum += s->probs[i];
        s->idx[i] = i;
    }
    for (int i = 0; i < n; i++) s->probs[i] = (float)(s->probs[i] / sum);
    int keep = n;
    if (s->top_k > 0 || s->top_p < 1) {
        qsort_r(s->idx, (size_t)n, sizeof *s->idx, by_prob_desc, s->probs);
        if (s->top_k > 0 && s->top_k < keep) keep = s->top_k;
        if (s->top_p < 1) {
            double cum = 0;
            for (int i = 0; i < keep; i++) {
                cum += s->probs[s->idx[i]];
                if (cum >= s->top_p) {
                    keep = i + 1;
                    break;
                }
            }
        }
    }
    double total = 0;
    for (int i = 0; i < keep; i++) total += s->probs[s->idx[i]];
    double r = next_uniform(s) * total, cum = 0;
    for (int i = 0; i < keep; i++) {
        cum += s->probs[s->idx[i]];
        if (r < cum) return s->idx[i];
    }
    return s->idx[keep - 1];
}
