/*
 * scheduler.c — continuous batching with chunked prefill (kiln_sched.h has
 * the contract: admission, step layout, positions, context, threads).
 *
 * Data:
 *   queue     FIFO of waiting requests (singly linked, head/tail)
 *   running   [max_seqs] the request in each slot, NULL when free
 *   done      finished requests whose tokens wait for kiln_sched_poll
 *   st_*      the step being built: per sequence slot, n_new, start,
 *             want_token, sampling, request; tokens back to back
 * A request's record is freed when it is forgotten: right after its final
 * callback (callback mode) or by the poll that reports it finished.
 *
 * Per running request: n_cached tokens are in its KV cache; while
 * n_cached < n_prompt it is prefilling; afterwards it decodes, and always
 * n_cached == n_prompt + n_gen − 1 (the last sampled token, `last`, is fed
 * in the next step).
 *
 * Re-entrancy: `busy` is set while a step runs or while cancellations are
 * being finished. Calls made meanwhile (from callbacks on this thread, or
 * from other threads while the lock is dropped around the executor) only
 * queue a submit or flag a cancel; the busy code picks the flags up by
 * rescanning from the start, so nothing it iterates over can vanish.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "kiln_sched.h"

typedef enum req_state { REQ_QUEUED, REQ_RUNNING, REQ_DONE } req_state;

typedef struct sched_req {
    int64_t id;
    req_state state;
    int32_t *prompt;       /* [n_prompt], owned */
    int n_prompt;
    kiln_sampling samp;
    int max_tokens;
    bool ignore_eos;
    kiln_token_callback cb;
    void *user;
    int need;              /* KV tokens to reserve: prompt + max_tokens − 1, capped at the context */
    int slot;              /* while running */
    int64_t admitted;      /* admission order, for prefill priority */
    int n_cached, n_gen;
    int32_t last;          /* last sampled token */
    bool cancel;           /* cancel requested, not yet finished */
    kiln_stop_reason stop; /* when done */
    int32_t *out;          /* poll mode: tokens produced [n_out], n_read of them taken */
    int n_out, cap_out, n_read;
    struct sched_req *next; /* queue or done list */
} sched_req;

struct kiln_sched {
    pthread_mutex_t lock; /* recursive: callbacks run with it held and may call back in */
    kiln_executor *x;
    int max_seqs, max_context, max_step;
    int32_t *eos;
    int n_eos;
    int64_t next_id, next_admit;
    sched_req *queue_head, *queue_tail;
    sched_req **running; /* [max_seqs] */
    int n_running;
    sched_req *done;
    bool busy;
    /* the step under construction */
    int32_t *st_slot, *st_n_new, *st_start, *st_next, *st_tokens;
    bool *st_want;
    kiln_sampling *st_samp;
    sched_req **st_req;
    sched_req **prefill; /* [max_seqs] scratch: prefilling requests in admission order */
    kiln_sched_stats stats;
};

/* ---- creation ---- */

kiln_status kiln_sched_new(kiln_executor *x, const kiln_sched_opts *o, kiln_sched **out, kiln_error *err) {
    *out = NULL;
    if (!x || !x->ops) return kiln_err(err, KILN_ERR_INVALID_ARG, "scheduler: no executor");
    int max_seqs = o->max_seqs ? o->max_seqs : x->max_seqs;
    int max_context = o->max_context ? o->max_context : x->max_context;
    if (max_seqs < 1 || max_seqs > x->max_seqs)
        return kiln_err(err, KILN_ERR_INVALID_ARG, "scheduler: max batch %d is outside 1..%d (the %s executor's slots)",
                        max_seqs, x->max_seqs, x->ops->name);
    if (max_context < 1 || max_context > x->max_context)
        return kiln_err(err, KILN_ERR_INVALID_ARG, "scheduler: max context %d is outside 1..%d", max_context,
                        x->max_context);
    int max_step = o->max_step_tokens;
    if (max_step == 0) {
        max_step = 512 < max_seqs ? max_seqs : 512;
        if (max_step > x->max_step_tokens) max_step = x->max_step_tokens;
    }
    if (max_step < max_seqs || max_step > x->max_step_tokens) {
        kiln_err(err, KILN_ERR_INVALID_ARG, "scheduler: max step tokens %d is outside %d..%d", max_step, max_seqs,
                 x->max_step_tokens);
        return kiln_err_hint(err, "every running sequence decodes one token per step, so a step needs room for "
                                  "max batch (%d) tokens at least",
                             max_seqs);
    }
    if (o->n_eos < 0 || (o->n_eos > 0 && !o->eos_ids))
        return kiln_err(err, KILN_ERR_INVALID_ARG, "scheduler: bad eos list");
    kiln_sched *s = calloc(1, sizeof *s);
    if (!s) return kiln_err(err, KILN_ERR_NOMEM, "scheduler: out of memory");
    pthread_mutexattr_t attr;
    pthread_mutexattr_init(&attr);
    pthread_mutexattr_settype(&attr, PTHREAD_MUTEX_RECURSIVE);
    int lock_rc = pthread_mutex_init(&s->lock, &attr);
    pthread_mutexattr_destroy(&attr);
    if (lock_rc) {
        free(s);
        return kiln_err(err, KILN_ERR_INTERNAL, "scheduler: cannot create its lock (error %d)", lock_rc);
    }
    s->x = x;
    s->max_seqs = max_seqs;
    s->max_context = max_context;
    s->max_step = max_step;
    s->next_id = 1;
    size_t ns = (size_t)max_seqs;
    s->eos = malloc((size_t)(o->n_eos ? o->n_eos : 1) * sizeof *s->eos);
    s->running = calloc(ns, sizeof *s->running);
    s->st_slot = malloc(ns * sizeof *s->st_slot);
    s->st_n_new = malloc(ns * sizeof *s->st_n_new);
    s->st_start = malloc(ns * sizeof *s->st_start);
    s->st_next = malloc(ns * sizeof *s->st_next);
    s->st_want = malloc(ns * sizeof *s->st_want);
    s->st_samp = malloc(ns * sizeof *s->st_samp);
    s->st_req = malloc(ns * sizeof *s->st_req);
    s->prefill = malloc(ns * sizeof *s->prefill);
    s->st_tokens = malloc((size_t)max_step * sizeof *s->st_tokens);
    if (!s->eos || !s->running || !s->st_slot || !s->st_n_new || !s->st_start || !s->st_next || !s->st_want ||
        !s->st_samp || !s->st_req || !s->prefill || !s->st_tokens) {
        kiln_sched_free(s);
        return kiln_err(err, KILN_ERR_NOMEM, "scheduler: out of memory for %d slots", max_seqs);
    }
    if (o->n_eos) memcpy(s->eos, o->eos_ids, (size_t)o->n_eos * sizeof *s->eos);
    s->n_eos = o->n_eos;
    *out = s;
    return KILN_OK;
}

static void req_free(sched_req *r) {
    if (!r) return;
    free(r->prompt);
    free(r->out);
    free(r);
}

void kiln_sched_free(kiln_sched *s) {
    if (!s) return;
    for (sched_req *r = s->queue_head, *nx; r; r = nx) {
        nx = r->next;
        req_free(r);
    }
    for (sched_req *r = s->done, *nx; r; r = nx) {
        nx = r->next;
        req_free(r);
    }
    if (s->running)
        for (int i = 0; i < s->max_seqs; i++)
            if (s->running[i]) {
                s->x->ops->release(s->x, i);
                req_free(s->running[i]);
            }
    free(s->eos);
    free(s->running);
    free(s->st_slot);
    free(s->st_n_new);
    free(s->st_start);
    free(s->st_next);
    free(s->st_want);
    free(s->st_samp);
    free(s->st_req);
    free(s->prefill);
    free(s->st_tokens);
    pthread_mutex_destroy(&s->lock);
    free(s);
}

/* ---- lookup and finishing ---- */

static sched_req *find(kiln_sched *s, int64_t id) {
    for (sched_req *r = s->queue_head; r; r = r->next)
        if (r->id == id) return r;
    for (int i = 0; i < s->max_seqs; i++)
        if (s->running[i] && s->running[i]->id == id) return s->running[i];
    for (sched_req *r = s->done; r; r = r->next)
        if (r->id == id) return r;
    return NULL;
}

static void unlink_queued(kiln_sched *s, sched_req *r) {
    sched_req **pp = &s->queue_head, *prev = NULL;
    while (*pp && *pp != r) {
        prev = *pp;
        pp = &(*pp)->next;
    }
    if (!*pp) return;
    *pp = r->next;
    if (s->queue_tail == r) s->queue_tail = prev;
    r->next = NULL;
}

/* Finish r: take it out of the queue or its slot (releasing the slot's KV
 * memory), then either send the final callback (unless the last token was
 * already delivered with finished set: final_sent) and free it, or move it
 * to the done list for polling. */
static void finish(kiln_sched *s, sched_req *r, kiln_stop_reason why, bool final_sent) {
    if (r->state == REQ_QUEUED) {
        unlink_queued(s, r);
    } else if (r->state == REQ_RUNNING) {
        s->x->ops->release(s->x, r->slot);
        s->running[r->slot] = NULL;
        s->n_running--;
    } else {
        return; /* already done */
    }
    r->state = REQ_DONE;
    r->stop = why;
    r->cancel = false;
    if (r->cb) {
        if (!final_sent) r->cb(r->user, r->id, -1, 1, (int32_t)why);
        req_free(r);
        return;
    }
    r->next = s->done;
    s->done = r;
}

/* Finish every request whose cancel flag is set. Rescans after each finish:
 * callbacks may flag or submit more. */
static void reap(kiln_sched *s) {
    for (;;) {
        sched_req *hit = NULL;
        for (sched_req *r = s->queue_head; r && !hit; r = r->next)
            if (r->cancel) hit = r;
        for (int i = 0; i < s->max_seqs && !hit; i++)
            if (s->running[i] && s->running[i]->cancel) hit = s->running[i];
        if (!hit) return;
        finish(s, hit, KILN_STOP_CANCELLED, false);
    }
}

static bool is_eos(const kiln_sched *s, int32_t id) {
    for (int i = 0; i < s->n_eos; i++)
        if (s->eos[i] == id) return true;
    return false;
}

/* ---- submit ---- */

kiln_status kiln_sched_submit(kiln_sched *s, const kiln_sched_request *q, int64_t *id, kiln_error *err) {
    if (id) *id = 0;
    if (!q || !id) return kiln_err(err, KILN_ERR_INVALID_ARG, "submit: no request or no id pointer");
    const int vocab = s->x->vocab;
    if (q->n_prompt <= 0 || !q->prompt)
        return kiln_err(err, KILN_ERR_INVALID_ARG, "submit: the prompt is empty: give at least one token");
    if (q->n_prompt > s->max_context) {
        kiln_err(err, KILN_ERR_CONTEXT, "submit: the prompt has %d tokens but the context holds %d", q->n_prompt,
                 s->max_context);
        return kiln_err_hint(err, "shorten the prompt, or create the context with a larger max_context");
    }
    for (int i = 0; i < q->n_prompt; i++)
        if (q->prompt[i] < 0 || q->prompt[i] >= vocab)
            return kiln_err(err, KILN_ERR_INVALID_ARG, "submit: prompt token %d at index %d is outside the vocabulary "
                                                       "(0..%d)",
                            q->prompt[i], i, vocab - 1);
    if (q->max_tokens < 0)
        return kiln_err(err, KILN_ERR_INVALID_ARG, "submit: max tokens %d must be >= 0", q->max_tokens);
    const kiln_sampling *sm = &q->samp;
    if (!(sm->temperature >= 0) || sm->temperature > 1e6f)
        return kiln_err(err, KILN_ERR_INVALID_ARG, "submit: temperature %g must be a number >= 0 (0 = greedy)",
                        (double)sm->temperature);
    if (sm->top_k < 0) return kiln_err(err, KILN_ERR_INVALID_ARG, "submit: top-k %d must be >= 0 (0 = off)", sm->top_k);
    if (!(sm->top_p > 0 && sm->top_p <= 1))
        return kiln_err(err, KILN_ERR_INVALID_ARG, "submit: top-p %g must be in (0, 1] (1 = off)", (double)sm->top_p);

    int64_t need = (int64_t)q->n_prompt + (q->max_tokens > 0 ? q->max_tokens - 1 : 0);
    if (need > s->max_context) need = s->max_context;
    kiln_executor_info info = {0};
    if (s->x->ops->info) s->x->ops->info(s->x, &info);
    if (info.kv_capacity_tokens > 0 && need > info.kv_capacity_tokens) {
        kiln_err(err, KILN_ERR_CONTEXT, "submit: the request needs %lld KV tokens (prompt %d + max tokens %d) but the "
                                        "KV memory holds %lld",
                 (long long)need, q->n_prompt, q->max_tokens, (long long)info.kv_capacity_tokens);
        return kiln_err_hint(err, "lower max_tokens, or give the context more KV memory");
    }

    sched_req *r = calloc(1, sizeof *r);
    if (!r) return kiln_err(err, KILN_ERR_NOMEM, "submit: out of memory");
    r->prompt = malloc((size_t)q->n_prompt * sizeof *r->prompt);
    if (!r->prompt) {
        free(r);
        return kiln_err(err, KILN_ERR_NOMEM, "submit: out of memory for a %d-token prompt", q->n_prompt);
    }
    memcpy(r->prompt, q->prompt, (size_t)q->n_prompt * sizeof *r->prompt);
    r->n_prompt = q->n_prompt;
    r->samp = q->samp;
    r->max_tokens = q->max_tokens;
    r->ignore_eos = q->ignore_eos;
    r->cb = q->cb;
    r->user = q->user;
    r->need = (int)need;
    r->slot = -1;
    r->last = -1;
    r->state = REQ_QUEUED;

    pthread_mutex_lock(&s->lock);
    r->id = s->next_id++;
    if (s->queue_tail)
        s->queue_tail->next = r;
    else
        s->queue_head = r;
    s->queue_tail = r;
    *id = r->id;
    pthread_mutex_unlock(&s->lock);
    return KILN_OK;
}

/* ---- one step ---- */

/* Admit queued requests in order while a slot is free and their KV fits.
 * Returns the first failure (the failing request finishes with an error). */
static kiln_status admit(kiln_sched *s, kiln_error *err) {
    kiln_status first = KILN_OK;
    while (s->queue_head && s->n_running < s->max_seqs) {
        sched_req *r = s->queue_head;
        if (r->max_tokens == 0) {
            finish(s, r, KILN_STOP_MAX_TOKENS, false);
            continue;
        }
        int slot = 0;
        while (s->running[slot]) slot++;
        bool fits = false;
        kiln_error e = {0};
        kiln_status st = s->x->ops->reserve(s->x, slot, r->need, &fits, &e);
        if (st == KILN_OK && !fits && s->n_running == 0) {
            /* nothing runs, so nothing will free memory: it never fits */
            st = kiln_err(&e, KILN_ERR_CONTEXT, "request %lld needs %d KV tokens, more than the %s executor's KV "
                                                "memory can hold",
                          (long long)r->id, r->need, s->x->ops->name);
            kiln_err_hint(&e, "lower its max_tokens, or give the context more KV memory");
        }
        if (st != KILN_OK) {
            if (st != KILN_ERR_CONTEXT) kiln_err_prefix(&e, "request %lld: ", (long long)r->id);
            if (first == KILN_OK) {
                first = st;
                if (err) *err = e;
            }
            finish(s, r, KILN_STOP_ERROR, false);
            continue;
        }
        if (!fits) break; /* wait for running requests to free memory; no overtaking */
        unlink_queued(s, r);
        r->state = REQ_RUNNING;
        r->slot = slot;
        r->admitted = s->next_admit++;
        s->running[slot] = r;
        s->n_running++;
    }
    if (s->n_running > s->stats.max_running) s->stats.max_running = s->n_running;
    return first;
}

/* Lay out the step: decode tokens first, then prefill chunks in admission
 * order within the token budget. Returns the number of sequences. */
static int build_step(kiln_sched *s) {
    int n = 0, used = 0;
    for (int slot = 0; slot < s->max_seqs; slot++) {
        sched_req *r = s->running[slot];
        if (!r || r->cancel || r->n_cached < r->n_prompt) continue;
        s->st_req[n] = r;
        s->st_slot[n] = slot;
        s->st_n_new[n] = 1;
        s->st_start[n] = r->n_cached;
        s->st_want[n] = true;
        s->st_samp[n] = r->samp;
        s->st_tokens[used++] = r->last;
        n++;
    }
    int np = 0;
    for (int slot = 0; slot < s->max_seqs; slot++) {
        sched_req *r = s->running[slot];
        if (!r || r->cancel || r->n_cached >= r->n_prompt) continue;
        int k = np++;
        while (k > 0 && s->prefill[k - 1]->admitted > r->admitted) {
            s->prefill[k] = s->prefill[k - 1];
            k--;
        }
        s->prefill[k] = r;
    }
    for (int i = 0; i < np && used < s->max_step; i++) {
        sched_req *r = s->prefill[i];
        int chunk = r->n_prompt - r->n_cached;
        if (chunk > s->max_step - used) chunk = s->max_step - used;
        s->st_req[n] = r;
        s->st_slot[n] = r->slot;
        s->st_n_new[n] = chunk;
        s->st_start[n] = r->n_cached;
        s->st_want[n] = r->n_cached + chunk == r->n_prompt;
        s->st_samp[n] = r->samp;
        memcpy(s->st_tokens + used, r->prompt + r->n_cached, (size_t)chunk * sizeof *s->st_tokens);
        used += chunk;
        n++;
    }
    if (used > s->stats.max_step_tokens_used) s->stats.max_step_tokens_used = used;
    s->stats.tokens_in += used;
    return n;
}

/* Hand a token to its request; returns false when the callback asked to cancel. */
static bool deliver(kiln_sched *s, sched_req *r, int32_t tok, bool finished, kiln_stop_reason why, kiln_status *st,
                    kiln_error *err) {
    s->stats.tokens_out++;
    if (r->cb) return r->cb(r->user, r->id, tok, finished ? 1 : 0, finished ? (int32_t)why : -1) == 0;
    if (r->n_out == r->cap_out) {
        int cap = r->cap_out ? 2 * r->cap_out : 16;
        int32_t *o = realloc(r->out, (size_t)cap * sizeof *o);
        if (!o) {
            if (*st == KILN_OK) *st = kiln_err(err, KILN_ERR_NOMEM, "request %lld: out of memory for its tokens",
                                               (long long)r->id);
            return false;
        }
        r->out = o;
        r->cap_out = cap;
    }
    r->out[r->n_out++] = tok;
    return true;
}

kiln_status kiln_sched_step(kiln_sched *s, bool *ran, kiln_error *err) {
    if (ran) *ran = false;
    pthread_mutex_lock(&s->lock);
    if (s->busy) {
        pthread_mutex_unlock(&s->lock);
        return kiln_err(err, KILN_ERR_INVALID_ARG, "step: this context is already stepping (another thread, or a "
                                                   "callback called kiln_step)");
    }
    s->busy = true;
    reap(s);
    kiln_status status = admit(s, err);
    int n = build_step(s);
    if (n == 0) {
        s->busy = false;
        pthread_mutex_unlock(&s->lock);
        return status;
    }
    for (int i = 0; i < n; i++) s->st_next[i] = -1;
    kiln_step step = {.n_seqs = n,
                      .slot = s->st_slot,
                      .n_new = s->st_n_new,
                      .start = s->st_start,
                      .tokens = s->st_tokens,
                      .want_token = s->st_want,
                      .samp = s->st_samp,
                      .next = s->st_next,
                      .logits = NULL};
    /* The model runs without the lock: others may submit, flag cancels, poll. */
    pthread_mutex_unlock(&s->lock);
    kiln_error xe = {0};
    kiln_status xst = s->x->ops->step(s->x, &step, &xe);
    pthread_mutex_lock(&s->lock);
    s->stats.steps++;
    if (ran) *ran = true;

    if (xst != KILN_OK) {
        /* the executor's state for these sequences is unknown: end them */
        for (int i = 0; i < n; i++) finish(s, s->st_req[i], KILN_STOP_ERROR, false);
        if (status == KILN_OK) {
            status = xst;
            if (err) *err = xe;
        }
    } else {
        for (int i = 0; i < n; i++) {
            sched_req *r = s->st_req[i];
            r->n_cached += s->st_n_new[i];
            if (!s->st_want[i] || r->cancel) continue; /* prefill chunk, or cancelled meanwhile */
            int32_t tok = s->st_next[i];
            if (tok < 0 || tok >= s->x->vocab) {
                if (status == KILN_OK)
                    status = kiln_err(err, KILN_ERR_INTERNAL, "step: the %s executor returned token %d for slot %d "
                                                              "(vocabulary 0..%d)",
                                      s->x->ops->name, tok, r->slot, s->x->vocab - 1);
                finish(s, r, KILN_STOP_ERROR, false);
                continue;
            }
            r->n_gen++;
            r->last = tok;
            int why = -1;
            if (!r->ignore_eos && is_eos(s, tok))
                why = KILN_STOP_EOS;
            else if (r->n_gen >= r->max_tokens)
                why = KILN_STOP_MAX_TOKENS;
            else if (r->n_cached >= s->max_context)
                why = KILN_STOP_CONTEXT;
            kiln_status dst = KILN_OK;
            bool go_on = deliver(s, r, tok, why >= 0, why >= 0 ? (kiln_stop_reason)why : KILN_STOP_EOS, &dst, err);
            if (dst != KILN_OK) {
                if (status == KILN_OK) status = dst;
                finish(s, r, KILN_STOP_ERROR, false);
            } else if (why >= 0) {
                finish(s, r, (kiln_stop_reason)why, r->cb != NULL);
            } else if (!go_on) {
                finish(s, r, KILN_STOP_CANCELLED, false);
            }
        }
    }
    reap(s);
    s->busy = false;
    pthread_mutex_unlock(&s->lock);
    return status;
}

/* ---- queries ---- */

int kiln_sched_pending(kiln_sched *s) {
    pthread_mutex_lock(&s->lock);
    int n = s->n_running;
    for (sched_req *r = s->queue_head; r; r = r->next) n++;
    pthread_mutex_unlock(&s->lock);
    return n;
}

kiln_status kiln_sched_cancel(kiln_sched *s, int64_t id, kiln_error *err) {
    pthread_mutex_lock(&s->lock);
    kiln_status st = KILN_OK;
    sched_req *r = find(s, id);
    if (!r) {
        if (id <= 0 || id >= s->next_id)
            st = kiln_err(err, KILN_ERR_INVALID_ARG, "cancel: there is no request %lld", (long long)id);
        /* else: it finished and was forgotten: nothing to do */
    } else if (r->state != REQ_DONE) {
        r->cancel = true;
        if (!s->busy) {
            s->busy = true;
            reap(s);
            s->busy = false;
        }
    }
    pthread_mutex_unlock(&s->lock);
    return st;
}

kiln_status kiln_sched_poll(kiln_sched *s, int64_t id, int32_t *buf, int cap, int *n, bool *finished, int *reason,
                            kiln_error *err) {
    if (n) *n = 0;
    if (finished) *finished = false;
    if (reason) *reason = -1;
    if (!n || !finished) return kiln_err(err, KILN_ERR_INVALID_ARG, "poll: n and finished must not be NULL");
    if (cap < 0 || (cap > 0 && !buf))
        return kiln_err(err, KILN_ERR_INVALID_ARG, "poll: a buffer of %d ids at %p", cap, (void *)buf);
    pthread_mutex_lock(&s->lock);
    kiln_status st = KILN_OK;
    sched_req *r = find(s, id);
    if (!r) {
        st = kiln_err(err, KILN_ERR_INVALID_ARG, "poll: there is no request %lld%s", (long long)id,
                      id > 0 && id < s->next_id ? " (it finished and its end was already polled)" : "");
    } else if (r->cb) {
        st = kiln_err(err, KILN_ERR_INVALID_ARG, "poll: request %lld delivers its tokens to its callback",
                      (long long)id);
    } else {
        int k = r->n_out - r->n_read;
        if (k > cap) k = cap;
        if (k > 0) memcpy(buf, r->out + r->n_read, (size_t)k * sizeof *buf);
        r->n_read += k;
        *n = k;
        if (r->state == REQ_DONE && r->n_read == r->n_out) {
            *finished = true;
            if (reason) *reason = (int)r->stop;
            sched_req **pp = &s->done;
            while (*pp != r) pp = &(*pp)->next;
            *pp = r->next;
            req_free(r);
        }
    }
    pthread_mutex_unlock(&s->lock);
    return st;
}

void kiln_sched_get_stats(kiln_sched *s, kiln_sched_stats *st) {
    pthread_mutex_lock(&s->lock);
    *st = s->stats;
    st->running = s->n_running;
    st->queued = 0;
    for (sched_req *r = s->queue_head; r; r = r->next) st->queued++;
    pthread_mutex_unlock(&s->lock);
}

kiln_executor *kiln_sched_executor(kiln_sched *s) { return s->x; }
int kiln_sched_max_context(const kiln_sched *s) { return s->max_context; }
int kiln_sched_max_seqs(const kiln_sched *s) { return s->max_seqs; }
int kiln_sched_max_step_tokens(const kiln_sched *s) { return s->max_step; }
