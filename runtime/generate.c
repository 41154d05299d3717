/*
 * generate.c — the one-sequence generation loop over a kiln_cpu_ctx:
 * prefill the prompt (in chunks of the context's max step), then decode one
 * token at a time until an end-of-sequence id, max_tokens, a full context
 * or the callback says stop.
 *
 * It samples exactly as the scheduler does (kiln_sample_logits with the
 * uniform number of (seed, position of the new token)), so kiln_generate
 * and a request through the scheduler give the same tokens; test_sched
 * checks that. Context rule, as in kiln_sched.h: the KV cache holds at most
 * max_context tokens; the token sampled when it is full is still returned.
 */
#include <math.h>
#include <stdlib.h>

#include "kiln_exec.h"
#include "kiln_rt.h"

const char *kiln_stop_reason_str(kiln_stop_reason r) {
    switch (r) {
    case KILN_STOP_EOS: return "eos";
    case KILN_STOP_MAX_TOKENS: return "max_tokens";
    case KILN_STOP_CONTEXT: return "context_full";
    case KILN_STOP_CANCELLED: return "cancelled";
    case KILN_STOP_ERROR: return "error";
    case KILN_STOP_COUNT_: break;
    }
    return "unknown";
}

static bool is_eos(const kiln_model *m, int32_t id) {
    for (int i = 0; i < m->n_eos; i++)
        if (m->eos_ids[i] == id) return true;
    return false;
}

kiln_status kiln_generate(kiln_cpu_ctx *c, const int32_t *prompt, int n_prompt, const kiln_generate_opts *o,
                          kiln_generate_result *res, kiln_error *err) {
    *res = (kiln_generate_result){0};
    const kiln_model *m = kiln_cpu_ctx_model(c);
    int max_context = kiln_cpu_ctx_max_context(c), max_step = kiln_cpu_ctx_max_step(c);
    if (n_prompt <= 0) return kiln_err(err, KILN_ERR_INVALID_ARG, "the prompt is empty: give at least one token");
    if (o->max_tokens < 0) return kiln_err(err, KILN_ERR_INVALID_ARG, "max tokens %d must be >= 0", o->max_tokens);
    if (kiln_cpu_ctx_pos(c) + n_prompt > max_context) {
        kiln_err(err, KILN_ERR_CONTEXT, "the prompt has %d tokens but the context holds %d", n_prompt, max_context);
        return kiln_err_hint(err, "shorten the prompt (the model was trained with a %d-token context)", max_context);
    }
    if (!(o->temperature >= 0) || !isfinite(o->temperature))
        return kiln_err(err, KILN_ERR_INVALID_ARG, "temperature %g must be >= 0", (double)o->temperature);
    if (o->top_k < 0) return kiln_err(err, KILN_ERR_INVALID_ARG, "top-k %d must be >= 0 (0 = off)", o->top_k);
    if (!(o->top_p > 0 && o->top_p <= 1))
        return kiln_err(err, KILN_ERR_INVALID_ARG, "top-p %g must be in (0, 1]", (double)o->top_p);
    const kiln_sampling samp = {.temperature = o->temperature, .top_k = o->top_k, .top_p = o->top_p, .seed = o->seed};
    int vocab = m->plan->vocab_size;
    kiln_status st = KILN_OK;
    float *logits = malloc((size_t)vocab * sizeof *logits);
    float *scratch = malloc(2 * (size_t)vocab * sizeof *scratch);
    res->ids = malloc(((size_t)o->max_tokens + 1) * sizeof *res->ids);
    if (!logits || !scratch || !res->ids) {
        st = kiln_err(err, KILN_ERR_NOMEM, "out of memory");
        goto out;
    }
    double t0 = kiln_now();
    for (int done = 0; done < n_prompt;) {
        int step = n_prompt - done < max_step ? n_prompt - done : max_step;
        if ((st = kiln_cpu_forward(c, prompt + done, step, false, logits, err)) != KILN_OK) goto out;
        done += step;
    }
    double t1 = kiln_now();
    res->prefill_seconds = t1 - t0;
    res->stop = KILN_STOP_MAX_TOKENS;
    while (res->n_ids < o->max_tokens) {
        int pos = kiln_cpu_ctx_pos(c); /* the new token's position */
        int32_t id = kiln_sample_logits(logits, vocab, &samp, kiln_sample_uniform(o->seed, pos), scratch);
        if (id == KILN_TOKEN_NONFINITE) {
            st = kiln_err(err, KILN_ERR_NUMERIC,
                          "the logits for position %d are not finite (a NaN or +inf, or no logit above -inf): "
                          "the engine's arithmetic failed, so no token was sampled", pos);
            goto out;
        }
        res->ids[res->n_ids++] = id;
        bool go_on = o->on_token ? o->on_token(id, o->user) : true;
        if (!o->ignore_eos && is_eos(m, id)) {
            res->stop = KILN_STOP_EOS;
            break;
        }
        if (res->n_ids == o->max_tokens) break;
        if (pos >= max_context) {
            res->stop = KILN_STOP_CONTEXT;
            break;
        }
        if (!go_on) {
            res->stop = KILN_STOP_CANCELLED;
            break;
        }
        if ((st = kiln_cpu_forward(c, &id, 1, false, logits, err)) != KILN_OK) goto out;
    }
    res->decode_seconds = kiln_now() - t1;
out:
    free(logits);
    free(scratch);
    if (st != KILN_OK) {
        free(res->ids);
        res->ids = NULL;
        res->n_ids = 0;
    }
    return st;
}
