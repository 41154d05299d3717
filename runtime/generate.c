/*
 * generate.c — the generation loop over the CPU executor: prefill the prompt
 * (in steps of the context's max step size), then decode one token at a
 * time until an end-of-sequence id, max_tokens, or a full context.
 */
#include <stdlib.h>

#include "kiln_rt.h"

const char *kiln_stop_reason_str(kiln_stop_reason r) {
    switch (r) {
    case KILN_STOP_EOS: return "eos";
    case KILN_STOP_MAX_TOKENS: return "max_tokens";
    case KILN_STOP_CONTEXT: return "context_full";
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
    int vocab = m->plan->vocab_size;
    kiln_sampler s;
    kiln_status st = kiln_sampler_init(&s, vocab, o->temperature, o->top_k, o->top_p, o->seed, err);
    if (st != KILN_OK) return st;
    float *logits = malloc((size_t)vocab * sizeof *logits);
    res->ids = malloc(((size_t)o->max_tokens + 1) * sizeof *res->ids);
    if (!logits || !res->ids) {
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
        int32_t id = kiln_sampler_sample(&s, logits);
        res->ids[res->n_ids++] = id;
        bool go_on = o->on_token ? o->on_token(id, o->user) : true;
        if (!o->ignore_eos && is_eos(m, id)) {
            res->stop = KILN_STOP_EOS;
            break;
        }
        if (!go_on || res->n_ids == o->max_tokens) break;
        if (kiln_cpu_ctx_pos(c) >= max_context) {
            res->stop = KILN_STOP_CONTEXT;
            break;
        }
        if ((st = kiln_cpu_forward(c, &id, 1, false, logits, err)) != KILN_OK) goto out;
    }
    res->decode_seconds = kiln_now() - t1;
out:
    free(logits);
    kiln_sampler_free(&s);
    if (st != KILN_OK) {
        free(res->ids);
        res->ids = NULL;
        res->n_ids = 0;
    }
    return st;
}
