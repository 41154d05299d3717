/*
 * kiln_sched.h — the continuous-batching scheduler (runtime/scheduler.c),
 * between the public API (kiln.h, runtime/api.c) and an executor
 * (kiln_exec.h).
 *
 * Requests wait in a FIFO queue. Each step:
 *   1. finish cancelled requests (freeing their slots and KV memory);
 *   2. grow: every running request that decodes this step needs KV room
 *      for one more token; it is promised in runs of kv_lookahead tokens
 *      (reserve()). When the KV memory cannot give it, the most recently
 *      admitted running request is preempted (its slot and KV memory freed,
 *      the request back at the front of the queue, keeping its tokens) until
 *      it can. The oldest running request can always grow: a request whose
 *      prompt + max_tokens − 1 (capped at the context) exceeds the whole KV
 *      memory is refused at submit;
 *   3. admit queued requests, in order, while a slot is free and the
 *      executor's reserve() gives the KV room for the tokens it must read
 *      (its prompt, or prompt + tokens so far when resumed) plus the
 *      lookahead; the first that does not fit waits, and so does everything
 *      behind it (no overtaking, so a large request is never starved);
 *   4. build one executor step: first one decode token for every running
 *      sequence whose prompt is read, then prefill chunks of the others in
 *      admission order, at most max_step_tokens new tokens in all (a long
 *      prompt is split across steps: chunked prefill; a resumed request
 *      prefills its prompt and the tokens it had generated);
 *   5. run it; rows of requests with penalties, min-p or logprobs come back
 *      as logits and are sampled here on the host (the device's token for
 *      them is dropped); then deliver each sampled token (callback or poll
 *      buffer) and finish requests on eos (unless ignore_eos), max_tokens, a
 *      full context, or cancellation, releasing their slots.
 *
 * Positions and sampling: the token produced after a sequence's KV cache
 * holds p tokens has position p and is drawn with kiln_sample_uniform(seed,
 * p), so a request's tokens do not depend on what else runs or on how its
 * prompt was chunked.
 *
 * Context: a sequence's KV cache holds at most max_context tokens; the token
 * sampled when it is full is still delivered (it never needs a KV entry) and
 * the request stops with KILN_STOP_CONTEXT. So a prompt of max_context
 * tokens is accepted and yields one token; a longer one is refused at
 * submit.
 *
 * Threads: every function takes the scheduler's (recursive) lock; a step
 * releases it while the executor runs, so submit/cancel/poll from other
 * threads wait only for bookkeeping. Callbacks run with the lock held, on
 * the stepping thread; from a callback, cancel only flags the request (it is
 * finished at the end of the step) and step is refused.
 */
#ifndef KILN_SCHED_H
#define KILN_SCHED_H

#include <stdbool.h>
#include <stdint.h>

#include "kiln.h"
#include "kiln_exec.h"

typedef struct kiln_sched kiln_sched;

/* Token delivery is kiln.h's kiln_token_callback: token >= 0 a new token;
 * finished = 1 on the last call (token -1 when the request ended without a
 * new one); return non-zero to cancel. */

typedef struct kiln_sched_opts {
    int max_seqs;          /* slots used (≤ the executor's; 0 = all of them) */
    int max_context;       /* KV tokens per sequence (≤ the executor's; 0 = the executor's) */
    int max_step_tokens;   /* new tokens per step, ≥ max_seqs, ≤ the executor's; 0 = 512 (or max_seqs if
                              larger), capped at the executor's */
    const int32_t *eos_ids; /* end-of-sequence ids (copied) */
    int n_eos;
    int kv_lookahead;      /* KV tokens promised ahead of need, per request; 0 = 16 */
} kiln_sched_opts;

typedef struct kiln_sched_request {
    const int32_t *prompt; /* copied */
    int n_prompt;
    kiln_sampling samp;
    kiln_penalties pen;      /* zeros = none (repetition 0 is taken as 1) */
    bool logprobs;           /* deliver log-probabilities (needs cb_info)... */
    int top_logprobs;        /* ...with this many alternatives, 0..KILN_MAX_LOGPROBS */
    bool prompt_logprobs;    /* deliver each prompt token's log-probability but the first's (cb_info, prompt =
                                1) before the first generated token; with max_tokens 0 the request reads its
                                prompt for them and then finishes... */
    int prompt_top_logprobs; /* ...with this many alternatives, 0..KILN_MAX_LOGPROBS */
    int max_tokens;
    bool ignore_eos;
    kiln_token_callback cb;  /* NULL (and no cb_info): tokens are kept for kiln_sched_poll */
    kiln_token_info_callback cb_info; /* tokens with log-probabilities (not with cb) */
    void *user;
} kiln_sched_request;

typedef struct kiln_sched_stats {
    int64_t steps;           /* executor steps run */
    int64_t tokens_in;       /* tokens fed to the executor (prefill + decode) */
    int64_t tokens_out;      /* tokens delivered */
    int max_running;         /* the most sequences in one step */
    int max_step_tokens_used; /* the most new tokens in one step */
    int queued, running;     /* now */
    int64_t preemptions;     /* running requests preempted */
    int64_t tokens_recomputed; /* tokens fed again to resume them */
    int64_t host_sampled;    /* tokens sampled on the host (penalties, min-p, logprobs) */
} kiln_sched_stats;

/* The scheduler drives `x` (borrowed: the caller destroys it after
 * kiln_sched_free). */
kiln_status kiln_sched_new(kiln_executor *x, const kiln_sched_opts *o, kiln_sched **out, kiln_error *err);
/* Drop every request (no callbacks), release their slots. */
void kiln_sched_free(kiln_sched *s);

/* Validate and queue a request; *id > 0. Refusals are listed in kiln.h (kiln_submit). */
kiln_status kiln_sched_submit(kiln_sched *s, const kiln_sched_request *r, int64_t *id, kiln_error *err);
/* One step (see above); *ran (may be NULL) = whether the executor ran. */
kiln_status kiln_sched_step(kiln_sched *s, bool *ran, kiln_error *err);
/* Queued + running requests. */
int kiln_sched_pending(kiln_sched *s);
/* Take the executor for the caller alone (kiln_score): only when no request is queued or running and
 * no thread steps (KILN_ERR_INVALID_ARG naming why otherwise); steps meanwhile are refused as
 * "already stepping", and requests submitted meanwhile wait for the next step after it. Give it
 * back with kiln_sched_exclusive_end. */
kiln_status kiln_sched_exclusive_begin(kiln_sched *s, kiln_error *err);
void kiln_sched_exclusive_end(kiln_sched *s);
kiln_status kiln_sched_cancel(kiln_sched *s, int64_t id, kiln_error *err);
/* As kiln_poll (kiln.h); *reason = -1 until finished. */
kiln_status kiln_sched_poll(kiln_sched *s, int64_t id, int32_t *buf, int cap, int *n, bool *finished, int *reason,
                            kiln_error *err);
void kiln_sched_get_stats(kiln_sched *s, kiln_sched_stats *st);
kiln_executor *kiln_sched_executor(kiln_sched *s);
/* The effective limits after defaults. */
int kiln_sched_max_context(const kiln_sched *s);
int kiln_sched_max_seqs(const kiln_sched *s);
int kiln_sched_max_step_tokens(const kiln_sched *s);

#endif /* KILN_SCHED_H */
