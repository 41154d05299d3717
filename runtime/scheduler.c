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
 * Per request: toks holds its prompt then the tokens generated so far,
 * n_known = n_prompt + n_gen of them. While running, n_cached of them are in
 * its KV cache: it prefills while n_known − n_cached > 1 (its prompt, or
 * prompt + tokens so far when resumed after a preemption) and decodes when
 * n_known − n_cached == 1 (the last sampled token is fed in the next step).
 * `promised` is the KV room reserve() granted its slot; before a step it
 * covers n_known.
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

#include "kiln.h"
#include "kiln_sched.h"

typedef enum req_state { REQ_QUEUED, REQ_RUNNING, REQ_DONE } req_state;

typedef struct sched_req {
    int64_t id;
    req_state state;
    int32_t *toks;         /* [cap_toks]: the prompt, then the generated tokens; owned */
    int cap_toks;
    int n_prompt;
    kiln_sampling samp;
    kiln_penalties pen;
    int logprobs;          /* -1 = none */
    int prompt_lp;         /* prompt logprobs' alternatives, -1 = none */
    int lp_next;           /* the next prompt position whose log-probability is due (1.. n_prompt − 1) */
    bool host;             /* sampled on the host: penalties, min-p or logprobs */
    int max_tokens;
    bool ignore_eos;
    kiln_token_callback cb;
    kiln_token_info_callback cb_info;
    void *user;
    int need;              /* the most KV tokens it can use: prompt + max_tokens − 1, capped at the context */
    int promised;          /* KV tokens its slot was granted (while running) */
    int slot;              /* while running */
    int64_t admitted;      /* first admission's order (kept when resumed): prefill priority, preemption order */
    bool was_admitted;
    double t_submit, queue_s; /* submission time (kiln_now), wait before the first admission */
    int n_cached, n_gen;
    bool cancel;           /* cancel requested, not yet finished */
    kiln_stop_reason stop; /* when done */
    int n_read;            /* poll mode: generated tokens taken */
    struct sched_req *next; /* queue or done list */
} sched_req;

static int n_known(const sched_req *r) { return r->n_prompt + r->n_gen; }
/* Whether some of r's prompt log-probabilities are still to be delivered. */
static bool lp_due(const sched_req *r) { return r->prompt_lp >= 0 && r->lp_next < r->n_prompt; }

/* The most logits rows a step returns for prompt log-probabilities (bounds the host's buffer). */
#define SCHED_PROMPT_LP_ROWS 512

struct kiln_sched {
    pthread_mutex_t lock; /* recursive: callbacks run with it held and may call back in */
    kiln_executor *x;
    int max_seqs, max_context, max_step, lookahead;
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
    bool *st_want, *st_host, *st_all; /* st_all: every row's logits (prompt logprobs due in the chunk) */
    bool *st_rows;                    /* logits rows returned: st_host or st_all */
    kiln_sampling *st_samp;
    sched_req **st_req;
    sched_req **order; /* [max_seqs] scratch: running requests in admission order */
    /* host sampling, allocated at first use: logits rows [cap_rows × vocab], a working row
     * [vocab], the sampler's scratch [2 × vocab], token counts [vocab] (kept zero) */
    float *h_rows, *h_work, *h_scratch;
    int32_t *h_counts;
    int h_cap_rows;
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
    if (o->kv_lookahead < 0)
        return kiln_err(err, KILN_ERR_INVALID_ARG, "scheduler: KV lookahead %d must be >= 0", o->kv_lookahead);
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
    s->lookahead = o->kv_lookahead ? o->kv_lookahead : 16;
    s->next_id = 1;
    size_t ns = (size_t)max_seqs;
    s->eos = malloc((size_t)(o->n_eos ? o->n_eos : 1) * sizeof *s->eos);
    s->running = calloc(ns, sizeof *s->running);
    s->st_slot = malloc(ns * sizeof *s->st_slot);
    s->st_n_new = malloc(ns * sizeof *s->st_n_new);
    s->st_start = malloc(ns * sizeof *s->st_start);
    s->st_next = malloc(ns * sizeof *s->st_next);
    s->st_want = malloc(ns * sizeof *s->st_want);
    s->st_host = malloc(ns * sizeof *s->st_host);
    s->st_all = malloc(ns * sizeof *s->st_all);
    s->st_rows = malloc(ns * sizeof *s->st_rows);
    s->st_samp = malloc(ns * sizeof *s->st_samp);
    s->st_req = malloc(ns * sizeof *s->st_req);
    s->order = malloc(ns * sizeof *s->order);
    s->st_tokens = malloc((size_t)max_step * sizeof *s->st_tokens);
    if (!s->eos || !s->running || !s->st_slot || !s->st_n_new || !s->st_start || !s->st_next || !s->st_want ||
        !s->st_host || !s->st_all || !s->st_rows || !s->st_samp || !s->st_req || !s->order || !s->st_tokens) {
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
    free(r->toks);
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
    free(s->st_host);
    free(s->st_all);
    free(s->st_rows);
    free(s->st_samp);
    free(s->st_req);
    free(s->order);
    free(s->st_tokens);
    free(s->h_rows);
    free(s->h_work);
    free(s->h_scratch);
    free(s->h_counts);
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
    if (r->cb || r->cb_info) {
        if (!final_sent) {
            if (r->cb_info)
                r->cb_info(r->user, r->id, NULL, 1, (int32_t)why);
            else
                r->cb(r->user, r->id, -1, 1, (int32_t)why);
        }
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
    if (!(sm->min_p >= 0 && sm->min_p <= 1))
        return kiln_err(err, KILN_ERR_INVALID_ARG, "submit: min-p %g must be in [0, 1] (0 = off)", (double)sm->min_p);
    kiln_penalties pen_v = q->pen;
    if (pen_v.repetition == 0) pen_v.repetition = 1;
    const kiln_penalties *pen = &pen_v;
    if (!(pen->presence >= -2 && pen->presence <= 2))
        return kiln_err(err, KILN_ERR_INVALID_ARG, "submit: presence penalty %g must be in [-2, 2] (0 = off)",
                        (double)pen->presence);
    if (!(pen->frequency >= -2 && pen->frequency <= 2))
        return kiln_err(err, KILN_ERR_INVALID_ARG, "submit: frequency penalty %g must be in [-2, 2] (0 = off)",
                        (double)pen->frequency);
    if (!(pen->repetition > 0 && pen->repetition <= 10))
        return kiln_err(err, KILN_ERR_INVALID_ARG, "submit: repetition penalty %g must be in (0, 10] (1 = off)",
                        (double)pen->repetition);
    if (q->logprobs && (q->top_logprobs < 0 || q->top_logprobs > KILN_MAX_LOGPROBS))
        return kiln_err(err, KILN_ERR_INVALID_ARG, "submit: logprobs %d must be -1 (off) or 0..%d", q->top_logprobs,
                        KILN_MAX_LOGPROBS);
    if (q->cb && q->cb_info)
        return kiln_err(err, KILN_ERR_INVALID_ARG, "submit: give on_token or on_token_info, not both");
    if (q->logprobs && !q->cb_info) {
        kiln_err(err, KILN_ERR_INVALID_ARG, "submit: logprobs %d need on_token_info to deliver them",
                 q->top_logprobs);
        return kiln_err_hint(err, "set the request's on_token_info callback, or logprobs -1");
    }
    if (q->prompt_logprobs && (q->prompt_top_logprobs < 0 || q->prompt_top_logprobs > KILN_MAX_LOGPROBS))
        return kiln_err(err, KILN_ERR_INVALID_ARG, "submit: prompt logprobs %d must be -1 (off) or 0..%d",
                        q->prompt_top_logprobs, KILN_MAX_LOGPROBS);
    if (q->prompt_logprobs && !q->cb_info) {
        kiln_err(err, KILN_ERR_INVALID_ARG, "submit: prompt logprobs %d need on_token_info to deliver them",
                 q->prompt_top_logprobs);
        return kiln_err_hint(err, "set the request's on_token_info callback, or prompt_logprobs -1");
    }

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
    /* room for the prompt and the first tokens; grows as it generates */
    int64_t cap = (int64_t)q->n_prompt + (q->max_tokens < 64 ? q->max_tokens : 64) + 1;
    r->toks = malloc((size_t)cap * sizeof *r->toks);
    if (!r->toks) {
        free(r);
        return kiln_err(err, KILN_ERR_NOMEM, "submit: out of memory for a %d-token prompt", q->n_prompt);
    }
    memcpy(r->toks, q->prompt, (size_t)q->n_prompt * sizeof *r->toks);
    r->cap_toks = (int)cap;
    r->n_prompt = q->n_prompt;
    r->samp = q->samp;
    r->pen = *pen;
    r->logprobs = q->logprobs ? q->top_logprobs : -1;
    r->prompt_lp = q->prompt_logprobs ? q->prompt_top_logprobs : -1;
    r->lp_next = 1;
    r->host = sm->min_p > 0 || pen->presence != 0 || pen->frequency != 0 || pen->repetition != 1 || q->logprobs;
    r->max_tokens = q->max_tokens;
    r->ignore_eos = q->ignore_eos;
    r->cb = q->cb;
    r->cb_info = q->cb_info;
    r->user = q->user;
    r->need = (int)need;
    r->slot = -1;
    r->state = REQ_QUEUED;
    r->t_submit = kiln_now();

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

/* Make r's slot hold `tokens` KV tokens: promised in runs of the lookahead
 * (capped at what r can ever use), else exactly. *fits = false when the KV
 * memory cannot give even that now. */
static kiln_status promise(kiln_sched *s, sched_req *r, int slot, int tokens, bool *fits, kiln_error *err) {
    *fits = true;
    if (r->promised >= tokens) return KILN_OK;
    int ahead = tokens + s->lookahead < r->need ? tokens + s->lookahead : r->need;
    if (ahead < tokens) ahead = tokens;
    kiln_status st = s->x->ops->reserve(s->x, slot, ahead, fits, err);
    if (st == KILN_OK && !*fits && ahead > tokens) {
        ahead = tokens;
        st = s->x->ops->reserve(s->x, slot, ahead, fits, err);
    }
    if (st == KILN_OK && *fits) r->promised = ahead;
    return st;
}

/* Running requests, oldest admission first, into s->order; returns their count. */
static int running_in_order(kiln_sched *s) {
    int n = 0;
    for (int slot = 0; slot < s->max_seqs; slot++) {
        sched_req *r = s->running[slot];
        if (!r) continue;
        int k = n++;
        while (k > 0 && s->order[k - 1]->admitted > r->admitted) {
            s->order[k] = s->order[k - 1];
            k--;
        }
        s->order[k] = r;
    }
    return n;
}

/* Take r out of its slot, free its KV memory and put it at the front of the
 * queue; it keeps its tokens and resumes by recomputing them. */
static void preempt(kiln_sched *s, sched_req *r) {
    s->x->ops->release(s->x, r->slot);
    s->running[r->slot] = NULL;
    s->n_running--;
    s->stats.preemptions++;
    s->stats.tokens_recomputed += r->n_cached;
    r->state = REQ_QUEUED;
    r->slot = -1;
    r->n_cached = 0;
    r->promised = 0;
    r->next = s->queue_head;
    s->queue_head = r;
    if (!s->queue_tail) s->queue_tail = r;
}

/* Give every running request the KV room for the tokens it will have read
 * after this step (n_known: its one decode token, or the rest of what it
 * prefills, which admission promised already), oldest first; preempt the
 * newest while one cannot grow. A request the executor refuses outright
 * finishes with an error (the first such status is returned). */
static kiln_status grow(kiln_sched *s, kiln_error *err) {
    kiln_status first = KILN_OK;
    for (;;) {
        int n = running_in_order(s);
        sched_req *short_of = NULL, *failed = NULL;
        kiln_error e = {0};
        kiln_status st = KILN_OK;
        for (int i = 0; i < n && !short_of && !failed; i++) {
            sched_req *r = s->order[i];
            if (r->cancel) continue;
            bool fits = true;
            st = promise(s, r, r->slot, n_known(r), &fits, &e);
            if (st != KILN_OK)
                failed = r;
            else if (!fits)
                short_of = r;
        }
        if (failed) {
            kiln_err_prefix(&e, "request %lld: ", (long long)failed->id);
            if (first == KILN_OK) {
                first = st;
                if (err) *err = e;
            }
            finish(s, failed, KILN_STOP_ERROR, false);
            continue;
        }
        if (!short_of) return first;
        preempt(s, s->order[n - 1]); /* the newest; the oldest can always grow (submit's check) */
    }
}

/* Admit queued requests in order while a slot is free and the KV room for
 * what they must read fits. Returns the first failure (the failing request
 * finishes with an error). */
static kiln_status admit(kiln_sched *s, kiln_error *err) {
    kiln_status first = KILN_OK;
    while (s->queue_head && s->n_running < s->max_seqs) {
        sched_req *r = s->queue_head;
        if (r->max_tokens == 0 && !lp_due(r)) { /* else it reads its prompt for the log-probabilities */
            finish(s, r, KILN_STOP_MAX_TOKENS, false);
            continue;
        }
        int slot = 0;
        while (s->running[slot]) slot++;
        bool fits = false;
        kiln_error e = {0};
        kiln_status st = promise(s, r, slot, n_known(r), &fits, &e);
        if (st == KILN_OK && !fits && s->n_running == 0) {
            /* nothing runs, so nothing will free memory: it never fits */
            st = kiln_err(&e, KILN_ERR_CONTEXT, "request %lld needs %d KV tokens, more than the %s executor's KV "
                                                "memory can hold",
                          (long long)r->id, n_known(r), s->x->ops->name);
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
        if (!r->was_admitted) {
            r->admitted = s->next_admit++;
            r->was_admitted = true;
            r->queue_s = kiln_now() - r->t_submit;
        }
        s->running[slot] = r;
        s->n_running++;
    }
    if (s->n_running > s->stats.max_running) s->stats.max_running = s->n_running;
    return first;
}

/* Add sequence n of the step: `chunk` tokens of r from n_cached on. Its rows predict positions
 * n_cached + 1 .. n_cached + chunk: every row's logits come back where prompt log-probabilities
 * are due among those. */
static void step_add(kiln_sched *s, int n, sched_req *r, int chunk, int used) {
    s->st_req[n] = r;
    s->st_slot[n] = r->slot;
    s->st_n_new[n] = chunk;
    s->st_start[n] = r->n_cached;
    s->st_want[n] = r->n_cached + chunk == n_known(r);
    s->st_host[n] = s->st_want[n] && r->host;
    const int lo = r->n_cached + 1 > r->lp_next ? r->n_cached + 1 : r->lp_next;
    const int hi = r->n_cached + chunk < r->n_prompt - 1 ? r->n_cached + chunk : r->n_prompt - 1;
    s->st_all[n] = lp_due(r) && lo <= hi;
    s->st_rows[n] = s->st_host[n] || s->st_all[n];
    s->st_samp[n] = r->samp;
    memcpy(s->st_tokens + used, r->toks + r->n_cached, (size_t)chunk * sizeof *s->st_tokens);
}

/* Lay out the step: decode tokens first, then prefill chunks in admission
 * order within the token budget. Returns the number of sequences. */
static int build_step(kiln_sched *s) {
    int n = 0, used = 0;
    for (int slot = 0; slot < s->max_seqs; slot++) {
        sched_req *r = s->running[slot];
        if (!r || r->cancel || n_known(r) - r->n_cached != 1) continue;
        step_add(s, n++, r, 1, used++);
    }
    int np = running_in_order(s), lp_rows = SCHED_PROMPT_LP_ROWS;
    for (int i = 0; i < np && used < s->max_step; i++) {
        sched_req *r = s->order[i];
        if (r->cancel || n_known(r) - r->n_cached <= 1) continue;
        int chunk = n_known(r) - r->n_cached;
        if (chunk > s->max_step - used) chunk = s->max_step - used;
        if (lp_due(r)) { /* every row comes back: within the rows left, or one token a step on an executor
                            that returns only the last row */
            const int cap = s->x->all_logits ? lp_rows : 1;
            if (cap < 1) continue;
            if (chunk > cap) chunk = cap;
            lp_rows -= chunk;
        }
        step_add(s, n++, r, chunk, used);
        used += chunk;
    }
    if (used > s->stats.max_step_tokens_used) s->stats.max_step_tokens_used = used;
    s->stats.tokens_in += used;
    return n;
}

/* Room for the host path's buffers: `rows` logits rows and the working
 * arrays. */
static kiln_status host_buffers(kiln_sched *s, int rows, kiln_error *err) {
    const size_t V = (size_t)s->x->vocab;
    if (!s->h_work) {
        s->h_work = malloc(V * sizeof *s->h_work);
        s->h_scratch = malloc(2 * V * sizeof *s->h_scratch);
        s->h_counts = calloc(V, sizeof *s->h_counts);
        if (!s->h_work || !s->h_scratch || !s->h_counts) {
            free(s->h_work);
            free(s->h_scratch);
            free(s->h_counts);
            s->h_work = s->h_scratch = NULL;
            s->h_counts = NULL;
            return kiln_err(err, KILN_ERR_NOMEM, "step: out of memory for host sampling over %zu tokens", V);
        }
    }
    if (rows > s->h_cap_rows) {
        float *p = realloc(s->h_rows, (size_t)rows * V * sizeof *p);
        if (!p) return kiln_err(err, KILN_ERR_NOMEM, "step: out of memory for %d rows of logits", rows);
        s->h_rows = p;
        s->h_cap_rows = rows;
    }
    return KILN_OK;
}

/* Sample r's next token (at `position`) from its row of logits on the host:
 * penalties on a copy, the sampler, log-probabilities from the raw row. */
static int32_t host_sample(kiln_sched *s, sched_req *r, const float *row, int64_t position, kiln_token_info *ti) {
    const int V = s->x->vocab;
    memcpy(s->h_work, row, (size_t)V * sizeof *s->h_work);
    if (r->pen.presence != 0 || r->pen.frequency != 0 || r->pen.repetition != 1)
        kiln_apply_penalties(s->h_work, V, r->toks, r->n_prompt, n_known(r), &r->pen, s->h_counts);
    int32_t tok = kiln_sample_logits(s->h_work, V, &r->samp, kiln_sample_uniform(r->samp.seed, position),
                                     s->h_scratch);
    if (r->logprobs >= 0) {
        kiln_logprobs(row, V, tok, r->logprobs, &ti->logprob, ti->top_token, ti->top_logprob);
        ti->n_top = r->logprobs;
    }
    s->stats.host_sampled++;
    return tok;
}

/* Logits rows step s returns for its first n sequences: 1 each where st_rows, n_new where st_all. */
static int step_rows(const kiln_sched *s, int n) {
    int rows = 0;
    for (int i = 0; i < n; i++) rows += s->st_rows[i] ? (s->st_all[i] ? s->st_n_new[i] : 1) : 0;
    return rows;
}

/* The step's status for request r whose logits predicting `position` are not finite (sampler rule 0),
 * unless the step already failed: KILN_ERR_NUMERIC naming both. */
static kiln_status nonfinite(const kiln_sched *s, const sched_req *r, int64_t position, kiln_status status,
                             kiln_error *err) {
    if (status != KILN_OK) return status;
    kiln_err(err, KILN_ERR_NUMERIC, "request %lld: the logits for position %lld are not finite (a NaN or +inf, or no "
             "logit above -inf): the %s executor's arithmetic failed, so no token was sampled", (long long)r->id,
             (long long)position, s->x->ops->name);
    return kiln_err_hint(err, "the model's activations overflowed: with a quantized engine, compile the layers at "
                              "fault wider (bf16); else the checkpoint's weights are out of range for this prompt");
}

/* Hand over the prompt log-probabilities due among the rows ([n_new, vocab]) of r's chunk from
 * position `start`: row j predicts the token at start + j + 1. Returns 0, 1 when the callback asked
 * to cancel, or 2 (*bad: the position) at a row the sampler could not trust, whose log-probabilities
 * would be -inf for no reason of the text's. */
static int deliver_prompt(kiln_sched *s, sched_req *r, const float *rows, int start, int n_new, int64_t *bad) {
    const int V = s->x->vocab;
    for (int j = 0; j < n_new; j++) {
        const int p = start + j + 1;
        if (p < r->lp_next || p >= r->n_prompt) continue;
        const float *row = rows + (size_t)j * (size_t)V;
        if (kiln_logits_untrusted(row, V)) {
            *bad = p;
            return 2;
        }
        kiln_token_info ti = {.token = r->toks[p], .n_top = r->prompt_lp, .queue_seconds = r->queue_s,
                              .prompt = 1, .position = p};
        kiln_logprobs(row, V, ti.token, r->prompt_lp, &ti.logprob, ti.top_token, ti.top_logprob);
        r->lp_next = p + 1;
        if (r->cb_info(r->user, r->id, &ti, 0, -1) != 0) return 1;
    }
    return 0;
}

/* Record tok as r's next token and hand it over; returns false when the
 * callback asked to cancel (or, with *st set, when memory ran out). */
static bool deliver(kiln_sched *s, sched_req *r, kiln_token_info *ti, bool finished, kiln_stop_reason why,
                    kiln_status *st, kiln_error *err) {
    if (n_known(r) == r->cap_toks) {
        int64_t cap = 2 * (int64_t)r->cap_toks;
        if (cap > (int64_t)r->n_prompt + r->max_tokens) cap = (int64_t)r->n_prompt + r->max_tokens;
        int32_t *t = cap > r->cap_toks ? realloc(r->toks, (size_t)cap * sizeof *t) : NULL;
        if (!t) {
            if (*st == KILN_OK) *st = kiln_err(err, KILN_ERR_NOMEM, "request %lld: out of memory for its tokens",
                                               (long long)r->id);
            return false;
        }
        r->toks = t;
        r->cap_toks = (int)cap;
    }
    r->toks[n_known(r)] = ti->token;
    ti->queue_seconds = r->queue_s;
    ti->position = n_known(r);
    r->n_gen++;
    s->stats.tokens_out++;
    int32_t fin = finished ? 1 : 0, reason = finished ? (int32_t)why : -1;
    if (r->cb_info) return r->cb_info(r->user, r->id, ti, fin, reason) == 0;
    if (r->cb) return r->cb(r->user, r->id, ti->token, fin, reason) == 0;
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
    kiln_status status = grow(s, err);
    kiln_error ae = {0};
    kiln_status ast = admit(s, &ae);
    if (status == KILN_OK && ast != KILN_OK) {
        status = ast;
        if (err) *err = ae;
    }
    int n = build_step(s);
    int n_rows = step_rows(s, n);
    if (n_rows > 0) {
        kiln_error he = {0};
        kiln_status hst = host_buffers(s, n_rows, &he);
        if (hst != KILN_OK) {
            for (int i = 0; i < n; i++)
                if (s->st_rows[i]) finish(s, s->st_req[i], KILN_STOP_ERROR, false);
            if (status == KILN_OK) {
                status = hst;
                if (err) *err = he;
            }
            n = build_step(s);
            n_rows = step_rows(s, n);
        }
    }
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
                      .logits = n_rows ? s->h_rows : NULL,
                      .want_logits = n_rows ? s->st_rows : NULL,
                      .all_logits = n_rows ? s->st_all : NULL};
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
        int row = 0;
        for (int i = 0; i < n; i++) {
            sched_req *r = s->st_req[i];
            const size_t V = (size_t)s->x->vocab;
            const float *rows = s->st_rows[i] ? s->h_rows + (size_t)row * V : NULL; /* this sequence's rows */
            row += s->st_rows[i] ? (s->st_all[i] ? s->st_n_new[i] : 1) : 0;
            const float *logits = s->st_host[i] ? s->h_rows + (size_t)(row - 1) * V : NULL; /* its last row */
            r->n_cached += s->st_n_new[i];
            if (r->cancel) continue; /* cancelled meanwhile */
            int64_t bad = 0;
            const int dp = s->st_all[i] ? deliver_prompt(s, r, rows, s->st_start[i], s->st_n_new[i], &bad) : 0;
            if (dp) {
                if (dp == 2) status = nonfinite(s, r, bad, status, err);
                finish(s, r, dp == 2 ? KILN_STOP_ERROR : KILN_STOP_CANCELLED, false);
                continue;
            }
            if (!s->st_want[i]) continue; /* prefill chunk */
            if (r->max_tokens == 0) { /* it read its prompt for the log-probabilities only */
                finish(s, r, KILN_STOP_MAX_TOKENS, false);
                continue;
            }
            kiln_token_info ti = {.token = s->st_next[i]};
            if (logits) ti.token = host_sample(s, r, logits, (int64_t)s->st_start[i] + s->st_n_new[i], &ti);
            int32_t tok = ti.token;
            if (tok == KILN_TOKEN_NONFINITE) { /* sampler rule 0: fail this request, not the others */
                status = nonfinite(s, r, (int64_t)s->st_start[i] + s->st_n_new[i], status, err);
                finish(s, r, KILN_STOP_ERROR, false);
                continue;
            }
            if (tok < 0 || tok >= s->x->vocab) {
                if (status == KILN_OK)
                    status = kiln_err(err, KILN_ERR_INTERNAL, "step: the %s executor returned token %d for slot %d "
                                                              "(vocabulary 0..%d)",
                                      s->x->ops->name, tok, r->slot, s->x->vocab - 1);
                finish(s, r, KILN_STOP_ERROR, false);
                continue;
            }
            int why = -1;
            if (!r->ignore_eos && is_eos(s, tok))
                why = KILN_STOP_EOS;
            else if (r->n_gen + 1 >= r->max_tokens)
                why = KILN_STOP_MAX_TOKENS;
            else if (r->n_cached >= s->max_context)
                why = KILN_STOP_CONTEXT;
            kiln_status dst = KILN_OK;
            bool go_on = deliver(s, r, &ti, why >= 0, why >= 0 ? (kiln_stop_reason)why : KILN_STOP_EOS, &dst, err);
            if (dst != KILN_OK) {
                if (status == KILN_OK) status = dst;
                finish(s, r, KILN_STOP_ERROR, false);
            } else if (why >= 0) {
                finish(s, r, (kiln_stop_reason)why, r->cb != NULL || r->cb_info != NULL);
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

kiln_status kiln_sched_exclusive_begin(kiln_sched *s, kiln_error *err) {
    pthread_mutex_lock(&s->lock);
    kiln_status st = KILN_OK;
    if (s->busy) {
        st = kiln_err(err, KILN_ERR_INVALID_ARG, "this context is stepping (another thread, or a callback)");
    } else {
        reap(s);
        int n = s->n_running;
        for (sched_req *r = s->queue_head; r; r = r->next) n++;
        if (n > 0)
            st = kiln_err(err, KILN_ERR_INVALID_ARG, "this context has %d request%s in flight", n, n == 1 ? "" : "s");
        else
            s->busy = true;
    }
    pthread_mutex_unlock(&s->lock);
    return st;
}

void kiln_sched_exclusive_end(kiln_sched *s) {
    pthread_mutex_lock(&s->lock);
    s->busy = false;
    pthread_mutex_unlock(&s->lock);
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
    } else if (r->cb || r->cb_info) {
        st = kiln_err(err, KILN_ERR_INVALID_ARG, "poll: request %lld delivers its tokens to its callback",
                      (long long)id);
    } else {
        int k = r->n_gen - r->n_read;
        if (k > cap) k = cap;
        if (k > 0) memcpy(buf, r->toks + r->n_prompt + r->n_read, (size_t)k * sizeof *buf);
        r->n_read += k;
        *n = k;
        if (r->state == REQ_DONE && r->n_read == r->n_gen) {
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
