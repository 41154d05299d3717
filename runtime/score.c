/*
 * score.c — teacher-forced scoring: the log-probability a model gives each
 * next token of sequences it is handed (kiln_score in kiln.h, `kiln
 * perplexity`, bench/gpu_logits.c's ppl mode).
 *
 * Each sequence is read one token per step (the decode path, CUDA graphs on
 * the GPU), up to max_seqs sequences side by side in slots 0..max_seqs-1:
 * step t feeds token t of every sequence still longer than t + 1 and takes
 * the log-softmax of the logits it returns at the next token (kiln_logprobs,
 * in double; the rows of one step are split over the process-wide pool).
 * One-token steps keep every position on the path that generation takes; a
 * prefill step would return only its last position's logits.
 */
#include "kiln_exec.h"

#include <stdlib.h>

#include "../common/kiln_pool.h"
#include "../common/kiln_util.h"

/* The rows of one step, split over pool tasks. */
typedef struct score_job {
    const float *logits;          /* [k, V] */
    const int32_t *row_seq;       /* [k] sequence of each row */
    const int32_t *const *seqs;
    float *const *out;
    int V, t, k, parts;
} score_job;

static void score_rows(void *arg, int part) {
    const score_job *j = arg;
    for (int r = j->k * part / j->parts; r < j->k * (part + 1) / j->parts; r++) {
        const int s = j->row_seq[r];
        kiln_logprobs(j->logits + (size_t)r * (size_t)j->V, j->V, j->seqs[s][j->t + 1], 0, &j->out[s][j->t], NULL,
                      NULL);
    }
}

kiln_status kiln_score_seqs(kiln_executor *x, int max_seqs, const int32_t *const *seqs, const int32_t *lens, int n,
                            float *const *out, kiln_error *err) {
    const int V = x->vocab;
    if (max_seqs < 1 || n < 0) return kiln_err(err, KILN_ERR_INVALID_ARG, "score: %d sequences, %d slots", n, max_seqs);
    float *logits = malloc((size_t)max_seqs * (size_t)V * sizeof *logits);
    int32_t *ibuf = malloc((size_t)max_seqs * 6 * sizeof *ibuf);
    bool *want = malloc((size_t)max_seqs);
    kiln_sampling *samp = calloc((size_t)max_seqs, sizeof *samp);
    kiln_status st = KILN_OK;
    if (!logits || !ibuf || !want || !samp) {
        st = kiln_err(err, KILN_ERR_NOMEM, "score: out of memory for %d rows of %d logits", max_seqs, V);
        goto out;
    }
    int32_t *slot = ibuf, *n_new = ibuf + max_seqs, *start = ibuf + 2 * max_seqs, *tok = ibuf + 3 * max_seqs,
            *next = ibuf + 4 * max_seqs, *row_seq = ibuf + 5 * max_seqs;
    for (int g0 = 0; g0 < n && st == KILN_OK; g0 += max_seqs) {
        const int G = n - g0 < max_seqs ? n - g0 : max_seqs;
        int longest = 0, reserved = 0;
        for (int i = 0; i < G && st == KILN_OK; i++, reserved++) {
            const int len = lens[g0 + i];
            bool fits = false;
            /* the last token is only a target: len - 1 tokens are read */
            if ((st = x->ops->reserve(x, i, len - 1, &fits, err)) == KILN_OK && !fits)
                st = kiln_err(err, KILN_ERR_NOMEM, "score: sequence %d (%d tokens) does not fit the KV memory beside "
                                                   "%d others", g0 + i, len, i);
            if (len - 1 > longest) longest = len - 1;
        }
        for (int t = 0; t < longest && st == KILN_OK; t++) {
            int k = 0;
            for (int i = 0; i < G; i++) {
                if (t >= lens[g0 + i] - 1) continue; /* this sequence's last target was scored */
                slot[k] = i, n_new[k] = 1, start[k] = t, tok[k] = seqs[g0 + i][t], want[k] = true;
                samp[k] = (kiln_sampling){.temperature = 0.0f, .top_k = 0, .top_p = 1.0f, .seed = 1};
                row_seq[k++] = g0 + i;
            }
            kiln_step s = {k, slot, n_new, start, tok, want, samp, next, logits, NULL};
            if ((st = x->ops->step(x, &s, err)) != KILN_OK) {
                kiln_err_prefix(err, "score: step at position %d of sequences %d..%d: ", t, g0, g0 + G - 1);
                break;
            }
            const int parts = k < 8 ? k : 8;
            score_job j = {logits, row_seq, seqs, out, V, t, k, parts};
            kiln_pool_for(kiln_pool_shared(), parts, parts, score_rows, &j);
        }
        for (int i = 0; i < reserved; i++) x->ops->release(x, i);
    }
out:
    free(logits);
    free(ibuf);
    free(want);
    free(samp);
    return st;
}
