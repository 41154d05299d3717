/*
 * score.c — teacher-forced scoring: the log-probability a model gives each
 * next token of sequences it is handed (kiln_score in kiln.h, `kiln
 * perplexity`, bench/gpu_logits.c's ppl mode).
 *
 * Up to max_seqs sequences are read side by side in slots 0..max_seqs-1.
 * Where the executor returns every new token's logits (kiln_step.all_logits),
 * they are read as prompts are: each step takes the next chunk of every
 * sequence still unread, the chunks sharing the step's token budget (at most
 * `rows` logits rows a step, which bounds the host buffer), so on the GPU the
 * scores come from the prefill kernels (W8A8 GEMMs, prefill attention) that
 * read a prompt. Otherwise one token a step (the decode path). Row r of a
 * sequence's chunk starting at t predicts token t + r + 1; its log-softmax
 * is taken in double (kiln_logprobs), the rows of one step split over the
 * process-wide pool.
 */
#include "kiln_exec.h"

#include <stdlib.h>

#include "../common/kiln_pool.h"
#include "../common/kiln_util.h"

/* Host logits a step may return at most: about 256 MB, at least a row per slot, at most 2048 rows. */
#define SCORE_LOGIT_BYTES ((size_t)256 << 20)

/* The rows of one step, split over pool tasks. */
typedef struct score_job {
    const float *logits;          /* [k, V] */
    const int32_t *row_seq;       /* [k] sequence of each row */
    const int32_t *row_pos;       /* [k] the position whose next token the row predicts */
    const int32_t *const *seqs;
    float *const *out;
    int V, k, parts;
    int *bad; /* [parts]: the part's first row whose logits are not finite (kiln_logits_untrusted), or -1 */
} score_job;

static void score_rows(void *arg, int part) {
    const score_job *j = arg;
    j->bad[part] = -1;
    for (int r = j->k * part / j->parts; r < j->k * (part + 1) / j->parts; r++) {
        const int s = j->row_seq[r], t = j->row_pos[r];
        const float *row = j->logits + (size_t)r * (size_t)j->V;
        if (j->bad[part] < 0 && kiln_logits_untrusted(row, j->V)) j->bad[part] = r;
        kiln_logprobs(row, j->V, j->seqs[s][t + 1], 0, &j->out[s][t], NULL, NULL);
    }
}

int64_t kiln_step_logit_rows(const kiln_step *s) {
    int64_t rows = 0;
    for (int i = 0; i < s->n_seqs; i++)
        if (!s->want_logits || s->want_logits[i]) rows += s->all_logits && s->all_logits[i] ? s->n_new[i] : 1;
    return rows;
}

kiln_status kiln_score_seqs(kiln_executor *x, int max_seqs, int max_step, const int32_t *const *seqs,
                            const int32_t *lens, int n, float *const *out, kiln_error *err) {
    const int V = x->vocab;
    if (max_seqs < 1 || n < 0 || max_step < max_seqs)
        return kiln_err(err, KILN_ERR_INVALID_ARG, "score: %d sequences, %d slots, %d tokens a step", n, max_seqs,
                        max_step);
    /* logits rows a step returns */
    int rows = max_seqs;
    if (x->all_logits) {
        size_t fit = SCORE_LOGIT_BYTES / ((size_t)V * sizeof(float));
        rows = fit < (size_t)max_step ? (int)fit : max_step;
        if (rows > 2048) rows = 2048;
        if (rows < max_seqs) rows = max_seqs;
    }
    float *logits = malloc((size_t)rows * (size_t)V * sizeof *logits);
    int32_t *ibuf = malloc(((size_t)max_seqs * 5 + (size_t)rows * 3) * sizeof *ibuf);
    bool *flags = malloc((size_t)max_seqs * 2);
    int *done = calloc((size_t)max_seqs, sizeof *done);
    kiln_sampling *samp = calloc((size_t)max_seqs, sizeof *samp);
    kiln_status st = KILN_OK;
    if (!logits || !ibuf || !flags || !done || !samp) {
        st = kiln_err(err, KILN_ERR_NOMEM, "score: out of memory for %d rows of %d logits", rows, V);
        goto out;
    }
    int32_t *slot = ibuf, *n_new = ibuf + max_seqs, *start = ibuf + 2 * max_seqs, *next = ibuf + 3 * max_seqs,
            *seq_of = ibuf + 4 * max_seqs, *tok = ibuf + 5 * max_seqs, *row_seq = tok + rows, *row_pos = row_seq + rows;
    bool *want = flags, *all = flags + max_seqs;
    for (int i = 0; i < max_seqs; i++) samp[i] = (kiln_sampling){.temperature = 0.0f, .top_p = 1.0f, .seed = 1};
    for (int g0 = 0; g0 < n && st == KILN_OK; g0 += max_seqs) {
        const int G = n - g0 < max_seqs ? n - g0 : max_seqs;
        int reserved = 0;
        for (int i = 0; i < G && st == KILN_OK; i++, reserved++) {
            const int len = lens[g0 + i];
            bool fits = false;
            done[i] = 0;
            /* the last token is only a target: len - 1 tokens are read */
            if ((st = x->ops->reserve(x, i, len - 1, &fits, err)) == KILN_OK && !fits)
                st = kiln_err(err, KILN_ERR_NOMEM, "score: sequence %d (%d tokens) does not fit the KV memory beside "
                                                   "%d others", g0 + i, len, i);
        }
        while (st == KILN_OK) {
            /* every unread sequence gets a token; what is left of the rows goes to them in order */
            int k = 0, left = rows;
            for (int i = 0; i < G; i++) left -= done[i] < lens[g0 + i] - 1;
            if (left == rows) break; /* all read */
            int T = 0;
            for (int i = 0; i < G; i++) {
                const int unread = lens[g0 + i] - 1 - done[i];
                if (unread <= 0) continue;
                int c = 1;
                if (x->all_logits && unread > 1 && left > 0) {
                    c = unread - 1 < left ? unread : left + 1;
                    left -= c - 1;
                }
                slot[k] = i, n_new[k] = c, start[k] = done[i], want[k] = true, all[k] = true, seq_of[k] = g0 + i;
                for (int j = 0; j < c; j++, T++) {
                    tok[T] = seqs[g0 + i][done[i] + j];
                    row_seq[T] = g0 + i;
                    row_pos[T] = done[i] + j;
                }
                k++;
            }
            kiln_step s = {k, slot, n_new, start, tok, want, samp, next, logits, NULL, x->all_logits ? all : NULL};
            if ((st = x->ops->step(x, &s, err)) != KILN_OK) {
                kiln_err_prefix(err, "score: step over sequences %d..%d: ", g0, g0 + G - 1);
                break;
            }
            for (int i = 0; i < k; i++) done[seq_of[i] - g0] += n_new[i];
            int parts = T < 8 ? T : 8, bad[8];
            score_job j = {logits, row_seq, row_pos, seqs, out, V, T, parts, bad};
            kiln_pool_for(kiln_pool_shared(), parts, parts, score_rows, &j);
            for (int p = 0; p < parts && st == KILN_OK; p++)
                if (bad[p] >= 0)
                    st = kiln_err(err, KILN_ERR_NUMERIC,
                                  "score: the logits after token %d of sequence %d are not finite (a NaN or +inf, or "
                                  "no logit above -inf): the %s executor's arithmetic failed",
                                  row_pos[bad[p]], row_seq[bad[p]], x->ops->name);
        }
        for (int i = 0; i < reserved; i++) x->ops->release(x, i);
    }
out:
    free(logits);
    free(ibuf);
    free(flags);
    free(done);
    free(samp);
    return st;
}
