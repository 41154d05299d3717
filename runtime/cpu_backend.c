/*
 * cpu_backend.c — the CPU reference executor behind the scheduler: a
 * kiln_executor (kiln_exec.h, ops "cpu") over kiln_cpu_ctx (cpu_exec.c).
 *
 * Slots: one kiln_cpu_ctx per slot, created at the slot's first reserve()
 * and kept (reset, not freed) when the slot is released, so a busy server
 * does not reallocate. Each context owns a full max_context KV cache; the
 * KV *budget* is modelled separately in tokens (kv_tokens): reserve() grants
 * a slot room for N tokens only while the sum over slots stays within it,
 * exactly as a fixed GPU pool would. That is what lets the scheduler's
 * queueing and refusal be tested without a GPU.
 *
 * Step: sequences run one after another; each forwards its new tokens in
 * chunks of at most FORWARD_CHUNK (the activation buffers of a context are
 * sized for one chunk), then samples with kiln_sample_logits and the uniform
 * number of (seed, position of the new token). The CPU forward of a token
 * does not depend on which other tokens share its chunk, so any chunking
 * and any batch give bit-identical logits.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kiln_exec.h"
#include "kiln_rt.h"

/* tokens per kiln_cpu_forward call (activation memory: chunk × slot widths) */
#define FORWARD_CHUNK 64

typedef struct cpu_exec {
    kiln_executor base;    /* first member: a cpu_exec * is a kiln_executor * */
    const kiln_model *m;
    int threads;
    int64_t kv_tokens;     /* the modelled pool, tokens over all slots */
    int64_t kv_used;       /* sum of reserved[] */
    kiln_cpu_ctx **ctx;    /* [max_seqs], NULL until first reserved */
    int32_t *reserved;     /* [max_seqs] KV tokens granted to the slot (0 = free) */
    float *logits;         /* [vocab] last token's logits */
    float *scratch;        /* [2 × vocab] for kiln_sample_logits */
} cpu_exec;

static kiln_status cpu_reserve(kiln_executor *x, int slot, int tokens, bool *fits, kiln_error *err) {
    cpu_exec *c = (cpu_exec *)x;
    *fits = false;
    if (slot < 0 || slot >= x->max_seqs)
        return kiln_err(err, KILN_ERR_INVALID_ARG, "cpu executor: slot %d is outside 0..%d", slot, x->max_seqs - 1);
    if (tokens < 0) return kiln_err(err, KILN_ERR_INVALID_ARG, "cpu executor: reserve of %d tokens", tokens);
    if (tokens > x->max_context)
        return kiln_err(err, KILN_ERR_CONTEXT, "cpu executor: %d tokens do not fit the %d-token context", tokens,
                        x->max_context);
    if (tokens <= c->reserved[slot]) {
        *fits = true;
        return KILN_OK;
    }
    int64_t more = tokens - c->reserved[slot];
    if (c->kv_used + more > c->kv_tokens) return KILN_OK; /* not now */
    if (!c->ctx[slot]) {
        int chunk = x->max_context < FORWARD_CHUNK ? x->max_context : FORWARD_CHUNK;
        kiln_status st = kiln_cpu_ctx_new(c->m, x->max_context, chunk, c->threads, &c->ctx[slot], err);
        if (st != KILN_OK) return kiln_err_prefix(err, "cpu executor: slot %d: ", slot);
    }
    c->reserved[slot] = tokens;
    c->kv_used += more;
    *fits = true;
    return KILN_OK;
}

static void cpu_release(kiln_executor *x, int slot) {
    cpu_exec *c = (cpu_exec *)x;
    if (slot < 0 || slot >= x->max_seqs) return;
    c->kv_used -= c->reserved[slot];
    c->reserved[slot] = 0;
    if (c->ctx[slot]) kiln_cpu_ctx_reset(c->ctx[slot]);
}

/* Check one sequence of a step before anything runs. */
static kiln_status check_seq(cpu_exec *c, const kiln_step *s, int i, const bool *seen, kiln_error *err) {
    const kiln_executor *x = &c->base;
    int slot = s->slot[i];
    if (slot < 0 || slot >= x->max_seqs)
        return kiln_err(err, KILN_ERR_INVALID_ARG, "cpu executor: step sequence %d: slot %d is outside 0..%d", i,
                        slot, x->max_seqs - 1);
    if (seen[slot])
        return kiln_err(err, KILN_ERR_INVALID_ARG, "cpu executor: slot %d appears twice in one step", slot);
    if (s->n_new[i] < 1)
        return kiln_err(err, KILN_ERR_INVALID_ARG, "cpu executor: slot %d: %d new tokens (at least 1)", slot,
                        s->n_new[i]);
    if (!c->ctx[slot] || c->reserved[slot] == 0)
        return kiln_err(err, KILN_ERR_INTERNAL, "cpu executor: slot %d runs without a reserve()", slot);
    if (s->start[i] != kiln_cpu_ctx_pos(c->ctx[slot]))
        return kiln_err(err, KILN_ERR_INTERNAL, "cpu executor: slot %d: step starts at position %d but %d tokens are cached",
                        slot, s->start[i], kiln_cpu_ctx_pos(c->ctx[slot]));
    if ((int64_t)s->start[i] + s->n_new[i] > c->reserved[slot])
        return kiln_err(err, KILN_ERR_INTERNAL, "cpu executor: slot %d grows to %lld tokens past its reserve of %d",
                        slot, (long long)s->start[i] + s->n_new[i], c->reserved[slot]);
    return KILN_OK;
}

static kiln_status cpu_step(kiln_executor *x, const kiln_step *s, kiln_error *err) {
    cpu_exec *c = (cpu_exec *)x;
    if (s->n_seqs < 0 || s->n_seqs > x->max_seqs)
        return kiln_err(err, KILN_ERR_INVALID_ARG, "cpu executor: a step of %d sequences (0..%d)", s->n_seqs,
                        x->max_seqs);
    bool *seen = calloc((size_t)x->max_seqs, sizeof *seen);
    if (!seen) return kiln_err(err, KILN_ERR_NOMEM, "cpu executor: out of memory");
    kiln_status st = KILN_OK;
    for (int i = 0; i < s->n_seqs && st == KILN_OK; i++) {
        st = check_seq(c, s, i, seen, err);
        seen[s->slot[i]] = true;
    }
    free(seen);
    if (st != KILN_OK) return st;

    const int vocab = x->vocab;
    const int32_t *tokens = s->tokens;
    int row = 0; /* next row of s->logits */
    for (int i = 0; i < s->n_seqs; i++) {
        kiln_cpu_ctx *ctx = c->ctx[s->slot[i]];
        int chunk = kiln_cpu_ctx_max_step(ctx);
        const bool out = s->logits && (!s->want_logits || s->want_logits[i]);
        const bool all = out && s->all_logits && s->all_logits[i]; /* every row, straight into s->logits */
        for (int done = 0; done < s->n_new[i];) {
            int n = s->n_new[i] - done < chunk ? s->n_new[i] - done : chunk;
            float *dst = all ? s->logits + (size_t)(row + done) * (size_t)vocab : c->logits;
            if ((st = kiln_cpu_forward(ctx, tokens + done, n, all, dst, err)) != KILN_OK)
                return kiln_err_prefix(err, "cpu executor: slot %d: ", s->slot[i]);
            done += n;
        }
        tokens += s->n_new[i];
        if (all) {
            row += s->n_new[i];
            memcpy(c->logits, s->logits + (size_t)(row - 1) * (size_t)vocab, (size_t)vocab * sizeof(float));
        } else if (out) {
            memcpy(s->logits + (size_t)row++ * (size_t)vocab, c->logits, (size_t)vocab * sizeof(float));
        }
        s->next[i] = -1;
        if (s->want_token[i]) {
            int64_t pos = (int64_t)s->start[i] + s->n_new[i]; /* position of the token being produced */
            double u = kiln_sample_uniform(s->samp[i].seed, pos);
            s->next[i] = kiln_sample_logits(c->logits, vocab, &s->samp[i], u, c->scratch);
        }
    }
    return KILN_OK;
}

static void cpu_info(kiln_executor *x, kiln_executor_info *info) {
    cpu_exec *c = (cpu_exec *)x;
    snprintf(info->device_name, sizeof info->device_name, "cpu");
    info->kv_capacity_tokens = c->kv_tokens;
    info->kv_used_tokens = c->kv_used;
}

static void cpu_destroy(kiln_executor *x) {
    cpu_exec *c = (cpu_exec *)x;
    if (!c) return;
    if (c->ctx)
        for (int i = 0; i < x->max_seqs; i++) kiln_cpu_ctx_free(c->ctx[i]);
    free(c->ctx);
    free(c->reserved);
    free(c->logits);
    free(c->scratch);
    free(c);
}

static const kiln_executor_ops cpu_ops = {
    .name = "cpu",
    .step = cpu_step,
    .reserve = cpu_reserve,
    .release = cpu_release,
    .destroy = cpu_destroy,
    .info = cpu_info,
};

kiln_status kiln_cpu_executor_new(const kiln_model *m, int max_seqs, int max_context, int64_t kv_tokens, int threads,
                                  kiln_executor **out, kiln_error *err) {
    *out = NULL;
    if (!m || !m->plan) return kiln_err(err, KILN_ERR_INVALID_ARG, "cpu executor: no model");
    const int model_ctx = m->plan->max_context;
    if (max_seqs < 1 || max_seqs > 4096)
        return kiln_err(err, KILN_ERR_INVALID_ARG, "cpu executor: max sequences %d must be in 1..4096", max_seqs);
    if (max_context < 0 || max_context > model_ctx) {
        kiln_err(err, KILN_ERR_INVALID_ARG, "cpu executor: max context %d is outside 1..%d (the model's)", max_context,
                 model_ctx);
        return kiln_err_hint(err, "use 0 for the model's context of %d tokens", model_ctx);
    }
    if (max_context == 0) max_context = model_ctx;
    int64_t full = (int64_t)max_seqs * max_context;
    if (kv_tokens < 0) return kiln_err(err, KILN_ERR_INVALID_ARG, "cpu executor: KV budget %lld tokens is negative", (long long)kv_tokens);
    if (kv_tokens == 0 || kv_tokens > full) kv_tokens = full;
    cpu_exec *c = calloc(1, sizeof *c);
    if (!c) return kiln_err(err, KILN_ERR_NOMEM, "cpu executor: out of memory");
    c->base = (kiln_executor){.ops = &cpu_ops,
                              .max_seqs = max_seqs,
                              .max_context = max_context,
                              .max_step_tokens = full < (1 << 30) ? (int)full : 1 << 30,
                              .vocab = m->plan->vocab_size,
                              .all_logits = true};
    c->m = m;
    c->threads = threads > 0 ? threads : 1;
    c->kv_tokens = kv_tokens;
    c->ctx = calloc((size_t)max_seqs, sizeof *c->ctx);
    c->reserved = calloc((size_t)max_seqs, sizeof *c->reserved);
    c->logits = malloc((size_t)c->base.vocab * sizeof *c->logits);
    c->scratch = malloc(2 * (size_t)c->base.vocab * sizeof *c->scratch);
    if (!c->ctx || !c->reserved || !c->logits || !c->scratch) {
        cpu_destroy(&c->base);
        return kiln_err(err, KILN_ERR_NOMEM, "cpu executor: out of memory for %d slots", max_seqs);
    }
    *out = &c->base;
    return KILN_OK;
}

/* ---- the CPU executor's kind (kiln_rt.h), for kiln_ctx_new ---- */

/* KV bytes one token takes on the CPU: f32 K and V of every layer's KV heads (every rank's
 * heads, which the CPU holds all of). */
static int64_t cpu_kv_bytes_per_token(const kiln_model *m) {
    const kiln_plan *p = m->plan;
    return (int64_t)p->n_layers * p->n_kv_heads * p->head_dim * 2 * (int64_t)sizeof(float) * p->n_ranks;
}

static kiln_status cpu_create(const kiln_model *m, const kiln_ctx_options *o, const kiln_measure_knobs *k,
                              const kiln_gpu_list *gpus, kiln_executor **x, kiln_error *err) {
    (void)k, (void)gpus; /* neither applies (kiln_ctx_new refuses knobs and a device list for "cpu") */
    int64_t kv_tokens = 0;
    if (o->kv_bytes > 0) {
        int64_t per = cpu_kv_bytes_per_token(m);
        kv_tokens = o->kv_bytes / per;
        if (kv_tokens == 0) {
            kiln_err(err, KILN_ERR_INVALID_ARG, "kv_bytes %lld holds no token: one token of K and V takes %lld bytes",
                     (long long)o->kv_bytes, (long long)per);
            return kiln_err_hint(err, "give kv_bytes 0 for room for max_batch full contexts");
        }
    }
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    int threads = o->threads ? o->threads : cores < 1 ? 1 : cores > 1024 ? 1024 : (int)cores;
    return kiln_cpu_executor_new(m, o->max_batch, o->max_context, kv_tokens, threads, x, err);
}

const kiln_executor_kind kiln_executor_cpu = {
    .device = "cpu", .needs_f32 = true, .takes_knobs = false, .takes_gpus = false, .auto_for = NULL,
    .create = cpu_create};
