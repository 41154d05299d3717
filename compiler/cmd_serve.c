/*
 * cmd_serve.c — `kiln serve ENGINE.kiln`: an OpenAI-compatible HTTP server
 * (docs/serving.md) on libmicrohttpd, one thread per connection.
 *
 * Threads and who owns what:
 *   - the scheduler thread (sched_main) is the only one that steps the
 *     context (kiln_run_step); token callbacks run there, decode the text
 *     (kiln_tok_stream), cut it at stop strings and wake the job's waiter;
 *   - connection threads parse, tokenize and kiln_submit (thread-safe per
 *     runtime/kiln.h), then wait on their job's condition variable (a plain
 *     response) or feed an SSE stream from it (a streamed one); a client
 *     that goes away is noticed on its socket and its request cancelled
 *     (kiln_cancel frees its slot and KV blocks);
 *   - the main thread loads the engine, then waits for SIGTERM/SIGINT in
 *     sigwait (the signals are blocked in every thread, so no handler and
 *     no global state), drains and exits 0.
 * One mutex (server.mu) guards all server and job state; no kiln_* call is
 * made while holding it (a callback inside kiln_cancel takes it).
 *
 * Queue: requests submitted and not finished are `active`; those beyond
 * --max-batch are counted as waiting, and a request that would make more
 * than --max-queue wait is refused with 429 and Retry-After.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <getopt.h>
#include <jansson.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#include "../runtime/kiln.h"
#include "../runtime/kiln_rt.h"
#include "../runtime/kiln_tokenizer.h"
#include "cli.h"
#include "serve.h"

#define SERVE_MAX_BODY (16u << 20) /* request bodies larger than this get 413 */
#define SERVE_WAIT_MS 100          /* how often a waiting connection checks its socket */

static void help(FILE *f) {
    fprintf(f, "usage: %s ", kiln_cli_prog);
    fprintf(f,
            "serve ENGINE.kiln [options]\n\n"
            "Serve the engine over HTTP with OpenAI's API (docs/serving.md): /v1/completions,\n"
            "/v1/chat/completions, /v1/models, /health, /metrics, /tokenize, /detokenize.\n"
            "SIGTERM or SIGINT drains: new requests get 503, running ones finish, then exit 0.\n\n"
            "  --host H             address to listen on (default 127.0.0.1)\n"
            "  --port P             TCP port (default 8000; 0 = any free port, printed)\n"
            "  --device DEV         gpu, cpu or auto (default auto)\n"
            "  --max-batch N        requests that run together (default 8)\n"
            "  --max-queue N        requests that may wait beyond those; more get 429 (default 64)\n"
            "  --max-context N      tokens per request, prompt + output (default: the model's)\n"
            "  --kv-memory X        KV-cache memory: bytes (suffix K, M, G) or, on a GPU, a fraction of\n"
            "                       the free memory after the weights (default 0.9; CPU: max-batch full contexts)\n"
            "  --threads N          CPU threads (default: one per core)\n");
    kiln_cli_gpus_help(f, 23);
    fprintf(f,
            "  --api-key KEY        require 'Authorization: Bearer KEY' on /v1/*, /tokenize, /detokenize\n"
            "  --model-name NAME    the model's name in requests (default: the engine file's base name)\n"
            "  --drain-seconds S    on SIGTERM, how long running requests may take to finish (default 30)\n"
            "  -h, --help           this help\n");
}

typedef struct serve_opts {
    const char *engine, *host, *device, *api_key, *model_name;
    const char *gpus;  /* --gpus, checked (kiln_cli_gpus_arg); NULL = the default */
    double tp_timeout; /* --tp-timeout, seconds; 0 = the runtime's */
    long long port, max_batch, max_queue, max_ctx, threads, drain_s;
    int64_t kv_bytes;
    double kv_fraction;
} serve_opts;

/* ---- metrics (Prometheus text; guarded by server.mu) ---- */
#define N_BUCKETS 16
static const double hist_le[N_BUCKETS] = {0.001, 0.0025, 0.005, 0.0075, 0.01, 0.025, 0.05, 0.1,
                                          0.25,  0.5,    1,     2.5,    5,    10,    30,   60};
typedef struct serve_hist {
    uint64_t counts[N_BUCKETS]; /* observations <= hist_le[i] (not cumulative) */
    uint64_t n;
    double sum;
} serve_hist;

enum { FIN_STOP, FIN_LENGTH, FIN_CANCELLED, FIN_ERROR, FIN_COUNT };
static const char *const fin_names[FIN_COUNT] = {"stop", "length", "cancelled", "error"};

typedef struct serve_metrics {
    uint64_t finished[FIN_COUNT];
    uint64_t prompt_tokens, generation_tokens, rejected_queue_full;
    serve_hist ttft, tpot, e2e, queue;
} serve_metrics;

static void hist_add(serve_hist *h, double v) {
    for (int i = 0; i < N_BUCKETS; i++)
        if (v <= hist_le[i]) {
            h->counts[i]++;
            break;
        }
    h->n++;
    h->sum += v;
}

struct job;
typedef struct server {
    pthread_mutex_t mu;
    pthread_cond_t sched_cv; /* wakes the scheduler when work arrives or it must stop */
    serve_opts o;
    char model[256];
    kiln_t *k;               /* set before ready */
    kiln_ctx_t *ctx;
    const kiln_tokenizer *tok; /* NULL when the engine has none */
    int32_t max_context, vocab;
    bool ready, draining, stop_sched;
    int active;              /* requests (choices) submitted and not finished */
    struct job *jobs;        /* those requests (for the drain) */
    uint64_t serial;         /* for response ids and default seeds */
    serve_metrics met;
} server;

/* One HTTP request's shared part: its parsed body and the condition its
 * waiter sleeps on, shared by its choices (jobs); freed with the last job. */
typedef struct group {
    serve_request req;
    char *echo;        /* echo: the prompt's text (malloc'd), before each choice's */
    size_t echo_len;
    pthread_cond_t cv; /* signalled when any choice has text or finishes */
    int refs;          /* jobs alive (mu held) */
    char rid[40];
    long long created;
} group;

/* One choice of a request (a kiln request), shared by its connection and the token callback (refs). */
typedef struct job {
    server *s;
    group *g;
    struct job *next, *prev;
    int refs;
    int32_t index;      /* the choice's index */
    int64_t id;         /* kiln request id (0 until submitted) */
    kiln_tok_stream ts;
    bool has_ts;
    kiln_buf text;      /* decoded text so far, cut at a stop string */
    size_t visible;     /* bytes of text no stop string can still take back */
    size_t sent;        /* bytes streamed so far */
    int32_t n_prompt, n_gen;
    int32_t reason;     /* kiln_stop_reason once done */
    bool done, stop_hit, client_gone, role_sent, fin_sent, free_group;
    bool echo_sent;     /* stream with echo: the prompt's text went out (in the choice's first chunk) */
    double t0, t_last;
    kiln_token_info *lps; /* with logprobs: each generated token's */
    int32_t n_lps, cap_lps, lps_sent;
    size_t lp_text_off; /* completions: text_offset of the next token */
} job;

/* Per connection: the body being received, and the jobs and SSE buffer of a generation. */
typedef struct conn {
    server *s;
    kiln_buf body;
    bool too_large;
    job *jobs[SERVE_MAX_N];
    int n_jobs;
    bool answered;
    int fd;
    kiln_buf out; /* SSE bytes not yet handed to MHD */
    size_t out_off;
    bool chat, stream_done;
} conn;

/* Release one reference (mu held); returns the job when it must now be freed. */
static job *job_unref(job *j) {
    if (--j->refs > 0) return NULL;
    j->free_group = --j->g->refs == 0;
    return j;
}

static void job_free(job *j) {
    if (!j) return;
    if (j->free_group) {
        serve_request_free(&j->g->req);
        free(j->g->echo);
        pthread_cond_destroy(&j->g->cv);
        free(j->g);
    }
    if (j->has_ts) kiln_tok_stream_free(&j->ts);
    kiln_buf_free(&j->text);
    free(j->lps);
    free(j);
}

/* Link (mu held) or unlink the job in the server's active list. */
static void job_link(server *s, job *j) {
    s->active++;
    j->next = s->jobs;
    if (s->jobs) s->jobs->prev = j;
    s->jobs = j;
}

static void job_unlink(server *s, job *j) {
    s->active--;
    if (j->prev) j->prev->next = j->next;
    else s->jobs = j->next;
    if (j->next) j->next->prev = j->prev;
}

/* ---- the token callback (scheduler thread) ---- */

/* Longest suffix of text[0..len) that is a proper prefix of a stop string: held back from streaming. */
static size_t stop_prefix_held(const job *j) {
    size_t held = 0;
    const serve_request *r = &j->g->req;
    for (int i = 0; i < r->n_stops; i++) {
        size_t sl = strlen(r->stops[i]);
        for (size_t k = sl - 1; k > held; k--)
            if (k <= j->text.len && memcmp(j->text.data + j->text.len - k, r->stops[i], k) == 0) {
                held = k;
                break;
            }
    }
    return held;
}

/* Append decoded text; cut it at the first stop string (matched across token boundaries). */
static void job_append(job *j, const char *t, size_t n) {
    const serve_request *r = &j->g->req;
    size_t old = j->text.len;
    if (!kiln_buf_append(&j->text, t, n)) return;
    size_t cut = SIZE_MAX;
    for (int i = 0; i < r->n_stops; i++) {
        size_t sl = strlen(r->stops[i]);
        size_t from = old > sl ? old - sl + 1 : 0;
        for (size_t p = from; p + sl <= j->text.len && p < cut; p++)
            if (memcmp(j->text.data + p, r->stops[i], sl) == 0) {
                cut = p;
                break;
            }
    }
    if (cut != SIZE_MAX) {
        j->text.len = cut;
        j->stop_hit = true;
    }
    j->visible = j->stop_hit ? j->text.len : j->text.len - stop_prefix_held(j);
}

static int fin_index(const job *j) {
    if (j->stop_hit || j->reason == KILN_STOP_EOS) return FIN_STOP;
    if (j->reason == KILN_STOP_MAX_TOKENS || j->reason == KILN_STOP_CONTEXT) return FIN_LENGTH;
    return j->reason == KILN_STOP_CANCELLED ? FIN_CANCELLED : FIN_ERROR;
}

/* The request finished (mu held): metrics, unlink, wake the waiter. Returns the job to free, if any. */
static job *job_finish(job *j, int32_t reason) {
    server *s = j->s;
    if (!j->stop_hit && j->has_ts) {
        const char *t;
        size_t n;
        kiln_error e;
        if (kiln_tok_stream_finish(&j->ts, &t, &n, &e) == KILN_OK && n) job_append(j, t, n);
    }
    j->reason = reason;
    j->done = true;
    j->visible = j->text.len;
    s->met.finished[fin_index(j)]++;
    s->met.prompt_tokens += (uint64_t)j->n_prompt;
    s->met.generation_tokens += (uint64_t)j->n_gen;
    hist_add(&s->met.e2e, kiln_now() - j->t0);
    job_unlink(s, j);
    pthread_cond_broadcast(&j->g->cv);
    return job_unref(j);
}

/* Keep a token's log-probabilities (mu held); dropped when memory runs out (the response then says so). */
static void lp_push(job *j, const kiln_token_info *t) {
    if (j->n_lps == j->cap_lps) {
        int32_t cap = j->cap_lps ? 2 * j->cap_lps : 16;
        kiln_token_info *p = realloc(j->lps, (size_t)cap * sizeof *p);
        if (!p) return;
        j->lps = p;
        j->cap_lps = cap;
    }
    j->lps[j->n_lps++] = *t;
}

static int32_t on_token(void *user, int64_t request, const kiln_token_info *t, int32_t finished,
                        int32_t stop_reason) {
    job *j = user;
    (void)request;
    int32_t ret = 0;
    job *dead = NULL;
    server *s = j->s;
    pthread_mutex_lock(&s->mu);
    if (t && t->prompt) { /* echo with logprobs: a prompt token's entry, before the generated ones */
        lp_push(j, t);
    } else if (t && !j->stop_hit) {
        double now = kiln_now();
        if (j->n_gen++ == 0) {
            hist_add(&s->met.ttft, now - j->t0);
            hist_add(&s->met.queue, t->queue_seconds);
        } else {
            hist_add(&s->met.tpot, now - j->t_last);
        }
        j->t_last = now;
        if (j->g->req.logprobs >= 0) lp_push(j, t);
        const char *txt;
        size_t n;
        kiln_error e;
        if (j->has_ts && kiln_tok_stream_push(&j->ts, t->token, &txt, &n, &e) == KILN_OK && n) job_append(j, txt, n);
        ret = j->stop_hit; /* a stop string: cancel the rest */
        pthread_cond_broadcast(&j->g->cv);
    }
    if (finished) dead = job_finish(j, stop_reason);
    pthread_mutex_unlock(&s->mu);
    job_free(dead);
    return ret;
}

/* ---- the scheduler thread ---- */

static void *sched_main(void *arg) {
    server *s = arg;
    pthread_mutex_lock(&s->mu);
    while (!s->stop_sched) {
        if (s->active == 0) {
            pthread_cond_wait(&s->sched_cv, &s->mu);
            continue;
        }
        pthread_mutex_unlock(&s->mu);
        kiln_status st = kiln_run_step(s->ctx);
        if (st != KILN_OK) fprintf(stderr, "kiln serve: error: a step failed: %s\n", kiln_last_error(s->ctx));
        pthread_mutex_lock(&s->mu);
    }
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

/* ---- responses ---- */

static enum MHD_Result send_text(struct MHD_Connection *mc, unsigned code, char *body, const char *type,
                                 const char *retry_after) {
    struct MHD_Response *r =
        MHD_create_response_from_buffer(body ? strlen(body) : 0, body ? body : (char *)"", body ? MHD_RESPMEM_MUST_FREE
                                                                                              : MHD_RESPMEM_PERSISTENT);
    if (!r) {
        free(body);
        return MHD_NO;
    }
    MHD_add_response_header(r, "Content-Type", type);
    if (retry_after) MHD_add_response_header(r, "Retry-After", retry_after);
    enum MHD_Result ret = MHD_queue_response(mc, code, r);
    MHD_destroy_response(r);
    return ret;
}

/* Send a JSON value (its reference is taken). */
static enum MHD_Result send_json(struct MHD_Connection *mc, unsigned code, json_t *j, const char *retry_after) {
    char *s = j ? json_dumps(j, JSON_COMPACT) : NULL;
    json_decref(j);
    return s ? send_text(mc, code, s, "application/json", retry_after) : MHD_NO;
}

static json_t *error_json(const serve_error *e) {
    return json_pack("{s:{s:s, s:s, s:o, s:o}}", "error", "message", e->message, "type", e->type ? e->type : "error",
                     "param", e->param[0] ? json_string(e->param) : json_null(), "code",
                     e->code ? json_string(e->code) : json_null());
}

static enum MHD_Result send_error(struct MHD_Connection *mc, const serve_error *e) {
    return send_json(mc, (unsigned)e->http, error_json(e), e->http == 429 ? "1" : NULL);
}

static enum MHD_Result fail(struct MHD_Connection *mc, int http, const char *type, const char *code, const char *param,
                            const char *msg) {
    serve_error e;
    serve_error_set(&e, http, type, code, param, "%s", msg);
    return send_error(mc, &e);
}

/* ---- prompts ---- */

/* The request's prompt as ids (malloc'd *ids, *n): text through the tokenizer, chat through the template. */
static kiln_status prompt_ids(server *s, const serve_request *r, int32_t **ids, int32_t *n, serve_error *e) {
    const char *param = r->messages ? "messages" : "prompt";
    if (r->prompt_ids) {
        for (int32_t i = 0; i < r->n_prompt_ids; i++)
            if (r->prompt_ids[i] >= s->vocab)
                return serve_error_set(e, 400, "invalid_request_error", NULL, param,
                                       "token id %d is outside the vocabulary (0..%d)", r->prompt_ids[i], s->vocab - 1);
        if (!(*ids = malloc((size_t)r->n_prompt_ids * sizeof **ids)))
            return serve_error_set(e, 500, "server_error", NULL, NULL, "out of memory");
        memcpy(*ids, r->prompt_ids, (size_t)r->n_prompt_ids * sizeof **ids);
        *n = r->n_prompt_ids;
        return KILN_OK;
    }
    if (!s->tok)
        return serve_error_set(e, 400, "invalid_request_error", NULL, param,
                               "the engine has no tokenizer, so it cannot take text; hint: send token ids");
    char *text = r->prompt, *rendered = NULL;
    size_t len = r->prompt_len;
    unsigned flags = r->kind == SERVE_KIND_TOKENIZE && !r->add_special ? 0 : KILN_TOK_ADD_SPECIAL;
    if (r->messages) {
        char msg[400];
        if (!kiln_has_chat_template(s->k))
            return serve_error_set(e, 400, "invalid_request_error", NULL, "messages",
                                   "the engine has no chat template; hint: compile it from a checkpoint with "
                                   "chat_template.jinja, or use /v1/completions");
        if (kiln_chat_render(s->k, r->messages, r->n_messages, r->kind != SERVE_KIND_TOKENIZE ? r->add_special : 1,
                             &rendered, &len, msg, sizeof msg) != KILN_OK)
            return serve_error_set(e, 400, "invalid_request_error", NULL, "messages", "%s", msg);
        text = rendered;
        flags = 0; /* the template writes the special tokens */
    }
    size_t got = 0;
    kiln_error ke = {0};
    kiln_status st = kiln_tokenizer_encode(s->tok, text, len, flags, ids, &got, &ke);
    kiln_chat_text_free(rendered);
    if (st != KILN_OK) return serve_error_set(e, 400, "invalid_request_error", NULL, param, "%s", ke.msg);
    if (got == 0 || got > INT32_MAX) {
        free(*ids);
        *ids = NULL;
        return serve_error_set(e, 400, "invalid_request_error", NULL, param, "the prompt encodes to no token");
    }
    *n = (int32_t)got;
    return KILN_OK;
}

/* ---- generation ---- */

static bool client_gone(int fd) {
    if (fd < 0) return false;
    struct pollfd p = {.fd = fd, .events = POLLRDHUP};
    return poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR));
}

/* Cancel the connection's jobs that are not done (its client went away or the drain ran out); mu not held. */
static void conn_cancel(server *s, conn *c) {
    int64_t ids[SERVE_MAX_N];
    pthread_mutex_lock(&s->mu);
    for (int i = 0; i < c->n_jobs; i++) {
        ids[i] = c->jobs[i]->done ? 0 : c->jobs[i]->id;
        c->jobs[i]->client_gone = true;
    }
    pthread_mutex_unlock(&s->mu);
    for (int i = 0; i < c->n_jobs; i++)
        if (ids[i] > 0) kiln_cancel(s->ctx, ids[i]);
}

/* Something to send (mu held): new text, or a finish not yet sent (`whole`: only when all are done). */
static bool conn_ready(const conn *c, bool whole) {
    bool all_done = true;
    for (int i = 0; i < c->n_jobs; i++) {
        const job *j = c->jobs[i];
        all_done &= j->done;
        if (!whole && (j->visible > j->sent || (j->done && !j->fin_sent))) return true;
    }
    return all_done;
}

/* Wait (mu held) until conn_ready, checking the client's socket. */
static void conn_wait(server *s, conn *c, bool whole) {
    while (!conn_ready(c, whole)) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += SERVE_WAIT_MS * 1000000L;
        if (ts.tv_nsec >= 1000000000L) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000L;
        }
        pthread_cond_timedwait(&c->jobs[0]->g->cv, &s->mu, &ts);
        if (!c->jobs[0]->client_gone && client_gone(c->fd)) {
            pthread_mutex_unlock(&s->mu);
            conn_cancel(s, c);
            pthread_mutex_lock(&s->mu);
        }
    }
}

/* The request's sampling: the engine's defaults, each replaced by the field when given. */
static void request_options(server *s, job *j, kiln_request_options *ro) {
    const serve_request *r = &j->g->req;
    kiln_request_options_init_from_engine(s->k, ro);
    if (r->temperature >= 0) ro->temperature = (float)r->temperature;
    if (r->top_p >= 0) ro->top_p = (float)r->top_p;
    if (r->top_k_set) ro->top_k = r->top_k;
    /* choice i draws with seed + i, so the choices differ when sampling */
    ro->seed = (r->seed_set ? r->seed : (uint64_t)time(NULL) * 1000003u + s->serial) + (uint64_t)j->index;
    ro->ignore_eos = r->ignore_eos;
    ro->min_p = (float)r->min_p;
    ro->presence_penalty = (float)r->presence_penalty;
    ro->frequency_penalty = (float)r->frequency_penalty;
    ro->repetition_penalty = (float)r->repetition_penalty;
    ro->logprobs = r->logprobs;
    if (r->echo && r->logprobs >= 0) ro->prompt_logprobs = r->logprobs; /* the prompt's entries too */
    int32_t room = s->max_context - j->n_prompt;
    ro->max_tokens = r->max_tokens >= 0 ? r->max_tokens : r->kind == SERVE_KIND_COMPLETION ? 16 : room;
    ro->on_token_info = on_token;
    ro->user = j;
}

/* A new job: choice `index` of group g, with n prompt tokens; NULL when out of memory. */
static job *job_new(server *s, group *g, int32_t index, int32_t n) {
    job *j = calloc(1, sizeof *j);
    if (!j) return NULL;
    j->s = s;
    j->g = g;
    j->index = index;
    j->n_prompt = n;
    j->refs = 2; /* the connection and the token callback */
    j->t0 = kiln_now();
    if (s->tok) {
        kiln_tok_stream_init(&j->ts, s->tok, true);
        j->has_ts = true;
    }
    return j;
}

/* Take places for the n choices: 503 while draining, 429 when --max-queue requests already wait. */
static kiln_status conn_admit(server *s, conn *c, serve_error *e) {
    pthread_mutex_lock(&s->mu);
    group *g = c->jobs[0]->g;
    bool draining = s->draining, full = s->active + c->n_jobs > s->o.max_batch + s->o.max_queue;
    if (!draining && !full) {
        for (int i = 0; i < c->n_jobs; i++) job_link(s, c->jobs[i]);
        snprintf(g->rid, sizeof g->rid, "%s-%llu", g->req.kind == SERVE_KIND_CHAT ? "chatcmpl" : "cmpl",
                 (unsigned long long)++s->serial);
    } else if (full) {
        s->met.rejected_queue_full++;
    }
    pthread_mutex_unlock(&s->mu);
    if (draining)
        return serve_error_set(e, 503, "server_error", NULL, NULL,
                               "the server is shutting down; hint: retry on another instance");
    if (full)
        return serve_error_set(e, 429, "rate_limit_error", NULL, NULL,
                               "too many requests are waiting (--max-queue); hint: retry after a second");
    return KILN_OK;
}

/* Drop the connection's jobs that were never submitted (mu not held). */
static void conn_drop_unsubmitted(server *s, conn *c, bool linked) {
    pthread_mutex_lock(&s->mu);
    job *dead[SERVE_MAX_N];
    int nd = 0;
    for (int i = 0; i < c->n_jobs; i++) {
        job *j = c->jobs[i];
        if (j->id > 0) continue;
        if (linked) job_unlink(s, j);
        j->refs = 1; /* no callback will come */
        dead[nd++] = job_unref(j);
        c->jobs[i] = NULL;
    }
    int k = 0; /* keep the submitted ones */
    for (int i = 0; i < c->n_jobs; i++)
        if (c->jobs[i]) c->jobs[k++] = c->jobs[i];
    c->n_jobs = k;
    pthread_mutex_unlock(&s->mu);
    for (int i = 0; i < nd; i++) job_free(dead[i]);
}

/* echo: the prompt's text into g->echo, as given, or the ids decoded. */
static kiln_status echo_text(server *s, group *g, const int32_t *ids, int32_t n, serve_error *e) {
    if (g->req.prompt) {
        g->echo = malloc(g->req.prompt_len + 1);
        if (!g->echo) return serve_error_set(e, 500, "server_error", NULL, NULL, "out of memory");
        memcpy(g->echo, g->req.prompt, g->req.prompt_len);
        g->echo_len = g->req.prompt_len;
        return KILN_OK;
    }
    kiln_error ke = {0};
    if (!s->tok)
        return serve_error_set(e, 400, "invalid_request_error", NULL, "echo",
                               "the engine has no tokenizer to write the prompt's text; hint: leave echo out");
    if (kiln_tokenizer_decode(s->tok, ids, (size_t)n, false, &g->echo, &g->echo_len, &ke) != KILN_OK)
        return serve_error_set(e, 500, "server_error", NULL, NULL, "echo: %s", ke.msg);
    return KILN_OK;
}

/* Make the request's n choices, admit and submit them (*r and ids are taken over). On failure *e is
 * set, nothing is left running and false is returned. */
static bool conn_start(server *s, conn *c, serve_request *r, int32_t *ids, int32_t n, serve_error *e) {
    group *g = calloc(1, sizeof *g);
    int32_t want = r->n;
    if (g) {
        g->req = *r;
        memset(r, 0, sizeof *r);
        g->created = (long long)time(NULL);
        pthread_cond_init(&g->cv, NULL);
        for (int32_t i = 0; i < want; i++) {
            job *j = job_new(s, g, i, n);
            if (!j) break;
            c->jobs[c->n_jobs++] = j;
            g->refs++;
        }
    }
    if (!g || c->n_jobs < want) {
        if (!g) serve_request_free(r);
        else if (c->n_jobs == 0) {
            serve_request_free(&g->req);
            pthread_cond_destroy(&g->cv);
            free(g);
        }
        conn_drop_unsubmitted(s, c, false);
        free(ids);
        serve_error_set(e, 500, "server_error", NULL, NULL, "out of memory");
        return false;
    }
    if (conn_admit(s, c, e) != KILN_OK) {
        conn_drop_unsubmitted(s, c, false);
        free(ids);
        return false;
    }
    kiln_status st = KILN_OK;
    if (g->req.echo && (st = echo_text(s, g, ids, n, e)) != KILN_OK) {
        conn_drop_unsubmitted(s, c, true);
        free(ids);
        return false;
    }
    for (int i = 0; i < c->n_jobs && st == KILN_OK; i++) {
        job *j = c->jobs[i];
        if (g->req.echo && g->req.logprobs >= 0) { /* the first prompt token's entry: no context, no number */
            kiln_token_info first = {.token = ids[0], .n_top = -1, .prompt = 1};
            lp_push(j, &first);
        }
        kiln_request_options ro;
        request_options(s, j, &ro);
        int64_t id = 0;
        st = kiln_submit(s->ctx, ids, n, &ro, &id);
        if (st != KILN_OK) {
            serve_error_set(e, 400, "invalid_request_error", st == KILN_ERR_CONTEXT ? "context_length_exceeded" : NULL,
                            g->req.messages ? "messages" : "prompt", "%s", kiln_last_error(s->ctx));
            break;
        }
        pthread_mutex_lock(&s->mu);
        j->id = id;
        pthread_cond_signal(&s->sched_cv);
        pthread_mutex_unlock(&s->mu);
    }
    free(ids);
    if (st != KILN_OK) {
        conn_drop_unsubmitted(s, c, true);
        conn_cancel(s, c); /* choices already submitted */
        return false;
    }
    return true;
}

/* ---- response bodies ---- */

static json_t *usage_json(const conn *c) {
    int gen = 0;
    for (int i = 0; i < c->n_jobs; i++) gen += c->jobs[i]->n_gen;
    int prompt = c->n_jobs ? c->jobs[0]->n_prompt : 0;
    return json_pack("{s:i, s:i, s:i}", "prompt_tokens", prompt, "completion_tokens", gen, "total_tokens",
                     prompt + gen);
}

static const char *finish_reason(const job *j) { return fin_names[fin_index(j)]; }

/* The text of one token (as it decodes alone); "token_id:N" without a tokenizer. */
static json_t *token_text(const server *s, int32_t id) {
    char *t = NULL;
    size_t n = 0;
    kiln_error e;
    if (s->tok && kiln_tokenizer_decode(s->tok, &id, 1, false, &t, &n, &e) == KILN_OK) {
        json_t *v = json_stringn(t, n);
        if (!v) { /* not UTF-8 alone (a byte of a character): "bytes:\\xNN..." as OpenAI writes it */
            kiln_buf b = {0};
            kiln_buf_printf(&b, "bytes:");
            for (size_t i = 0; i < n; i++) kiln_buf_printf(&b, "\\x%02x", (unsigned char)t[i]);
            v = b.failed ? NULL : json_stringn((const char *)b.data, b.len);
            kiln_buf_free(&b);
        }
        free(t);
        return v;
    }
    char buf[32];
    snprintf(buf, sizeof buf, "token_id:%d", id);
    return json_string(buf);
}

static json_t *token_bytes(const server *s, int32_t id) {
    json_t *a = json_array();
    char *t = NULL;
    size_t n = 0;
    kiln_error e;
    if (s->tok && kiln_tokenizer_decode(s->tok, &id, 1, false, &t, &n, &e) == KILN_OK)
        for (size_t i = 0; i < n; i++) json_array_append_new(a, json_integer((unsigned char)t[i]));
    free(t);
    return a;
}

/* The log-probabilities of tokens [from, to) of job j in OpenAI's form: chat's {"content": [...]} or
 * completions' {tokens, token_logprobs, top_logprobs, text_offset}. json null when not asked for. */
static json_t *logprobs_json(const server *s, bool want, bool chat, const kiln_token_info *lps, int32_t n,
                             size_t *text_off) {
    if (!want) return json_null();
    if (chat) {
        json_t *content = json_array();
        for (int32_t i = 0; i < n; i++) {
            const kiln_token_info *t = &lps[i];
            json_t *top = json_array();
            for (int32_t k = 0; k < t->n_top; k++)
                json_array_append_new(top, json_pack("{s:o, s:f, s:o}", "token", token_text(s, t->top_token[k]),
                                                     "logprob", (double)t->top_logprob[k], "bytes",
                                                     token_bytes(s, t->top_token[k])));
            json_array_append_new(content, json_pack("{s:o, s:f, s:o, s:o}", "token", token_text(s, t->token),
                                                     "logprob", (double)t->logprob, "bytes", token_bytes(s, t->token),
                                                     "top_logprobs", top));
        }
        return json_pack("{s:o}", "content", content);
    }
    json_t *toks = json_array(), *lpv = json_array(), *tops = json_array(), *offs = json_array();
    for (int32_t i = 0; i < n; i++) {
        const kiln_token_info *t = &lps[i];
        json_t *text = token_text(s, t->token);
        json_array_append(toks, text);
        if (t->n_top < 0) { /* echo: the prompt's first token has no context, so no numbers (null, as OpenAI) */
            json_array_append_new(lpv, json_null());
            json_array_append_new(tops, json_null());
            json_array_append_new(offs, json_integer((json_int_t)*text_off));
            *text_off += text ? json_string_length(text) : 0;
            json_decref(text);
            continue;
        }
        json_array_append_new(lpv, json_real((double)t->logprob));
        json_t *top = json_object();
        for (int32_t k = 0; k < t->n_top; k++) {
            json_t *kt = token_text(s, t->top_token[k]);
            if (kt && !json_object_get(top, json_string_value(kt)))
                json_object_set_new(top, json_string_value(kt), json_real((double)t->top_logprob[k]));
            json_decref(kt);
        }
        json_array_append_new(tops, top);
        json_array_append_new(offs, json_integer((json_int_t)*text_off));
        *text_off += text ? json_string_length(text) : 0;
        json_decref(text);
    }
    return json_pack("{s:o, s:o, s:o, s:o}", "tokens", toks, "token_logprobs", lpv, "top_logprobs", tops,
                     "text_offset", offs);
}

/* A whole (non-streamed) response (mu held, every job done). */
static json_t *final_json(const server *s, conn *c) {
    const group *g = c->jobs[0]->g;
    bool chat = g->req.kind == SERVE_KIND_CHAT;
    json_t *choices = json_array();
    for (int i = 0; i < c->n_jobs; i++) {
        job *j = c->jobs[i];
        json_t *text = json_stringn((const char *)j->text.data, j->text.len);
        if (g->echo) { /* the prompt's text first */
            kiln_buf b = {0};
            kiln_buf_append(&b, g->echo, g->echo_len);
            kiln_buf_append(&b, j->text.data, j->text.len);
            json_decref(text);
            text = b.failed ? NULL : json_stringn((const char *)b.data, b.len);
            kiln_buf_free(&b);
        }
        json_t *lp = logprobs_json(s, g->req.logprobs >= 0, chat, j->lps, j->n_lps, &j->lp_text_off);
        json_array_append_new(choices, chat ? json_pack("{s:i, s:{s:s, s:o}, s:o, s:s}", "index", j->index,
                                                        "message", "role", "assistant", "content", text, "logprobs",
                                                        lp, "finish_reason", finish_reason(j))
                                            : json_pack("{s:i, s:o, s:o, s:s}", "index", j->index, "text", text,
                                                        "logprobs", lp, "finish_reason", finish_reason(j)));
    }
    return json_pack("{s:s, s:s, s:I, s:s, s:o, s:o}", "id", g->rid, "object",
                     chat ? "chat.completion" : "text_completion", "created", (json_int_t)g->created, "model",
                     s->model, "choices", choices, "usage", usage_json(c));
}

/* The worst outcome among the choices: FIN_ERROR, else FIN_CANCELLED, else fine (mu held). */
static int conn_failure(const conn *c) {
    int worst = FIN_STOP;
    for (int i = 0; i < c->n_jobs; i++) {
        int f = fin_index(c->jobs[i]);
        if (f == FIN_ERROR) return FIN_ERROR;
        if (f == FIN_CANCELLED) worst = FIN_CANCELLED;
    }
    return worst;
}

static enum MHD_Result reply_whole(struct MHD_Connection *mc, conn *c) {
    server *s = c->s;
    pthread_mutex_lock(&s->mu);
    conn_wait(s, c, true);
    int fin = conn_failure(c);
    pthread_mutex_unlock(&s->mu);
    /* every choice is done: nothing else writes their text or log-probabilities any more */
    json_t *out = fin == FIN_STOP ? final_json(s, c) : NULL;
    if (fin == FIN_CANCELLED)
        return fail(mc, 503, "server_error", NULL, NULL, "the request was cancelled (the server is shutting down)");
    if (!out) return fail(mc, 500, "server_error", NULL, NULL, "generation failed: see the server's log");
    return send_json(mc, 200, out, NULL);
}

/* ---- streaming (Server-Sent Events) ---- */

/* What one choice has to send, copied under the server's lock so that the JSON is built without it
 * (the scheduler thread's token callbacks take that lock: they must not wait for JSON encoding). */
typedef struct sse_part {
    job *j;                /* for its index and lp_text_off (this connection's own) */
    char *delta;           /* malloc'd copy of the new visible text; NULL when none */
    size_t n;
    kiln_token_info *lps;  /* malloc'd copy of the new tokens' log-probabilities */
    int32_t n_lps;
    bool role;             /* chat: the first chunk, which names the role */
    const char *finish;    /* finish reason, or NULL */
} sse_part;

/* One SSE chunk of a choice (p), or, with p NULL, the usage chunk with these totals. */
static void sse_chunk(conn *c, const sse_part *p, int prompt_tokens, int gen_tokens) {
    const group *g = c->jobs[0]->g;
    json_t *choices = json_array();
    if (p) {
        json_t *lp = logprobs_json(c->s, g->req.logprobs >= 0, c->chat, p->lps, p->n_lps, &p->j->lp_text_off);
        json_t *choice;
        if (c->chat) {
            json_t *d = json_object();
            if (p->role) json_object_set_new(d, "role", json_string("assistant"));
            if (p->delta) json_object_set_new(d, "content", json_stringn(p->delta, p->n));
            choice = json_pack("{s:i, s:o, s:o, s:o}", "index", p->j->index, "delta", d, "logprobs", lp,
                               "finish_reason", p->finish ? json_string(p->finish) : json_null());
        } else {
            choice = json_pack("{s:i, s:s%, s:o, s:o}", "index", p->j->index, "text", p->delta ? p->delta : "",
                               p->delta ? p->n : 0, "logprobs", lp, "finish_reason",
                               p->finish ? json_string(p->finish) : json_null());
        }
        json_array_append_new(choices, choice);
    }
    json_t *o = json_pack("{s:s, s:s, s:I, s:s, s:o}", "id", g->rid, "object",
                          c->chat ? "chat.completion.chunk" : "text_completion", "created", (json_int_t)g->created,
                          "model", c->s->model, "choices", choices);
    if (o && g->req.include_usage)
        json_object_set_new(o, "usage", p ? json_null()
                                          : json_pack("{s:i, s:i, s:i}", "prompt_tokens", prompt_tokens,
                                                      "completion_tokens", gen_tokens, "total_tokens",
                                                      prompt_tokens + gen_tokens));
    char *s = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    if (s) kiln_buf_printf(&c->out, "data: %s\n\n", s);
    free(s);
}

/* p->delta = the choice's unsent visible text (j->sent up to `upto`), after the prompt's text when the
 * request echoes it and that has not gone out yet (mu held). False when out of memory. */
static bool sse_delta(job *j, size_t upto, sse_part *p) {
    const group *g = j->g;
    const size_t pre = g->echo && !j->echo_sent ? g->echo_len : 0, n = pre + (upto - j->sent);
    if (n == 0) return true;
    if (!(p->delta = malloc(n))) return false;
    if (pre) memcpy(p->delta, g->echo, pre);
    if (upto > j->sent) memcpy(p->delta + pre, j->text.data + j->sent, upto - j->sent); /* text.data NULL when none */
    p->n = n;
    j->echo_sent = true;
    j->sent = upto;
    return true;
}

/* Copy what job j has to send into *p (mu held) and mark it sent; false when nothing. With echo the
 * prompt's text goes with the choice's first text (or its finish), so that the prompt tokens'
 * log-probabilities, which arrive with the prefill, are in the same chunk. */
static bool sse_take(conn *c, job *j, sse_part *p) {
    memset(p, 0, sizeof *p);
    p->j = j;
    if (j->visible > j->sent || (c->chat && !j->role_sent)) {
        p->role = c->chat && !j->role_sent;
        j->role_sent = true;
        if (j->visible > j->sent && !sse_delta(j, j->visible, p) && !p->role)
            return false; /* out of memory: try again next time */
        if (j->n_lps > j->lps_sent && (p->lps = malloc((size_t)(j->n_lps - j->lps_sent) * sizeof *p->lps))) {
            memcpy(p->lps, j->lps + j->lps_sent, (size_t)(j->n_lps - j->lps_sent) * sizeof *p->lps);
            p->n_lps = j->n_lps - j->lps_sent;
            j->lps_sent = j->n_lps;
        }
        return true;
    }
    return false;
}

/* Fill c->out with the next SSE events, waiting for text (mu not held). */
static void sse_fill(conn *c) {
    server *s = c->s;
    sse_part parts[2 * SERVE_MAX_N];
    int np = 0, fin = FIN_STOP, prompt_tokens = 0, gen_tokens = 0;
    bool all_done = true;
    pthread_mutex_lock(&s->mu);
    conn_wait(s, c, false);
    for (int i = 0; i < c->n_jobs; i++) {
        job *j = c->jobs[i];
        if (sse_take(c, j, &parts[np])) np++;
        if (j->done && !j->fin_sent && (fin_index(j) == FIN_STOP || fin_index(j) == FIN_LENGTH)) {
            sse_part *p = &parts[np++];
            memset(p, 0, sizeof *p);
            p->j = j;
            sse_delta(j, j->sent, p); /* echo with no text generated (max_tokens 0, or all of it a stop string) */
            if (j->n_lps > j->lps_sent && (p->lps = malloc((size_t)(j->n_lps - j->lps_sent) * sizeof *p->lps))) {
                memcpy(p->lps, j->lps + j->lps_sent, (size_t)(j->n_lps - j->lps_sent) * sizeof *p->lps);
                p->n_lps = j->n_lps - j->lps_sent;
                j->lps_sent = j->n_lps;
            }
            p->finish = finish_reason(j);
            j->fin_sent = true;
        }
        all_done &= j->done;
        gen_tokens += j->n_gen;
    }
    if (all_done) {
        fin = conn_failure(c);
        prompt_tokens = c->n_jobs ? c->jobs[0]->n_prompt : 0;
    }
    pthread_mutex_unlock(&s->mu);
    for (int i = 0; i < np; i++) {
        sse_chunk(c, &parts[i], 0, 0);
        free(parts[i].delta);
        free(parts[i].lps);
    }
    if (all_done) {
        if (fin == FIN_STOP) {
            if (c->jobs[0]->g->req.include_usage) sse_chunk(c, NULL, prompt_tokens, gen_tokens);
        } else {
            serve_error e;
            serve_error_set(&e, fin == FIN_CANCELLED ? 503 : 500, "server_error", NULL, NULL, "%s",
                            fin == FIN_CANCELLED ? "the request was cancelled" : "generation failed");
            json_t *ej = error_json(&e);
            char *es = ej ? json_dumps(ej, JSON_COMPACT) : NULL;
            json_decref(ej);
            if (es) kiln_buf_printf(&c->out, "data: %s\n\n", es);
            free(es);
        }
        kiln_buf_printf(&c->out, "data: [DONE]\n\n");
        c->stream_done = true;
    }
}

static ssize_t sse_read(void *cls, uint64_t pos, char *buf, size_t max) {
    conn *c = cls;
    (void)pos;
    while (c->out_off >= c->out.len) {
        c->out.len = c->out_off = 0;
        if (c->stream_done) return MHD_CONTENT_READER_END_OF_STREAM;
        sse_fill(c);
        if (c->out.len == 0 && c->jobs[0]->client_gone) return MHD_CONTENT_READER_END_WITH_ERROR;
    }
    size_t n = c->out.len - c->out_off < max ? c->out.len - c->out_off : max;
    memcpy(buf, c->out.data + c->out_off, n);
    c->out_off += n;
    return (ssize_t)n;
}

static enum MHD_Result reply_stream(struct MHD_Connection *mc, conn *c) {
    struct MHD_Response *r = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16384, sse_read, c, NULL);
    if (!r) return MHD_NO;
    MHD_add_response_header(r, "Content-Type", "text/event-stream");
    MHD_add_response_header(r, "Cache-Control", "no-cache");
    enum MHD_Result ret = MHD_queue_response(mc, 200, r);
    MHD_destroy_response(r);
    return ret;
}

/* ---- endpoints ---- */

/* POST /v1/completions and /v1/chat/completions. */
static enum MHD_Result handle_generate(struct MHD_Connection *mc, conn *c, serve_kind kind) {
    server *s = c->s;
    serve_request r;
    serve_error e;
    if (serve_request_parse((const char *)c->body.data, c->body.len, kind, &r, &e) != KILN_OK)
        return send_error(mc, &e);
    if (r.model && strcmp(r.model, s->model) != 0) {
        serve_error_set(&e, 404, "invalid_request_error", "model_not_found", "model",
                        "the model '%.100s' does not exist here; hint: this server serves '%.100s' (GET /v1/models)",
                        r.model, s->model);
        serve_request_free(&r);
        return send_error(mc, &e);
    }
    int32_t *ids = NULL, n = 0;
    if (prompt_ids(s, &r, &ids, &n, &e) != KILN_OK) {
        serve_request_free(&r);
        return send_error(mc, &e);
    }
    if (n > s->max_context) {
        serve_error_set(&e, 400, "invalid_request_error", "context_length_exceeded", r.messages ? "messages" : "prompt",
                        "the prompt is %d tokens, more than the context of %d; hint: shorten it", n, s->max_context);
        free(ids);
        serve_request_free(&r);
        return send_error(mc, &e);
    }
    bool stream = r.stream;
    c->chat = kind == SERVE_KIND_CHAT;
    if (!conn_start(s, c, &r, ids, n, &e)) return send_error(mc, &e);
    return stream ? reply_stream(mc, c) : reply_whole(mc, c);
}

/* POST /tokenize {"prompt": TEXT | "messages": [...], "add_special_tokens": bool}. */
static enum MHD_Result handle_tokenize(struct MHD_Connection *mc, conn *c) {
    serve_request r;
    serve_error e;
    if (serve_request_parse((const char *)c->body.data, c->body.len, SERVE_KIND_TOKENIZE, &r, &e) != KILN_OK)
        return send_error(mc, &e);
    int32_t *ids = NULL, n = 0;
    kiln_status st = prompt_ids(c->s, &r, &ids, &n, &e);
    serve_request_free(&r);
    if (st != KILN_OK) return send_error(mc, &e);
    json_t *a = json_array();
    for (int32_t i = 0; i < n; i++) json_array_append_new(a, json_integer(ids[i]));
    free(ids);
    return send_json(mc, 200, json_pack("{s:o, s:i, s:i}", "tokens", a, "count", (int)n, "max_model_len",
                                        (int)c->s->max_context), NULL);
}

/* POST /detokenize {"tokens": [ids]} → {"prompt": TEXT}. */
static enum MHD_Result handle_detokenize(struct MHD_Connection *mc, conn *c) {
    server *s = c->s;
    serve_request r;
    serve_error e;
    if (serve_request_parse((const char *)c->body.data, c->body.len, SERVE_KIND_DETOKENIZE, &r, &e) != KILN_OK)
        return send_error(mc, &e);
    char *text = NULL;
    size_t len = 0;
    kiln_error ke = {0};
    kiln_status st = s->tok ? kiln_tokenizer_decode(s->tok, r.prompt_ids, (size_t)r.n_prompt_ids, false, &text, &len,
                                                    &ke)
                            : kiln_err(&ke, KILN_ERR_MISSING, "the engine has no tokenizer");
    serve_request_free(&r);
    if (st != KILN_OK) return fail(mc, 400, "invalid_request_error", NULL, "tokens", ke.msg);
    json_t *o = json_pack("{s:s%}", "prompt", text, len);
    free(text);
    return send_json(mc, 200, o, NULL);
}

static enum MHD_Result handle_models(struct MHD_Connection *mc, server *s) {
    return send_json(mc, 200, json_pack("{s:s, s:[{s:s, s:s, s:I, s:s, s:i}]}", "object", "list", "data", "id",
                                        s->model, "object", "model", "created", (json_int_t)time(NULL), "owned_by",
                                        "kiln", "max_model_len", (int)s->max_context), NULL);
}

static void hist_print(kiln_buf *b, const char *name, const char *help, const serve_hist *h) {
    kiln_buf_printf(b, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name);
    uint64_t cum = 0;
    for (int i = 0; i < N_BUCKETS; i++) {
        cum += h->counts[i];
        kiln_buf_printf(b, "%s_bucket{le=\"%g\"} %llu\n", name, hist_le[i], (unsigned long long)cum);
    }
    kiln_buf_printf(b, "%s_bucket{le=\"+Inf\"} %llu\n%s_sum %.6f\n%s_count %llu\n", name, (unsigned long long)h->n,
                    name, h->sum, name, (unsigned long long)h->n);
}

/* GET /metrics: Prometheus text format. */
static enum MHD_Result handle_metrics(struct MHD_Connection *mc, server *s) {
    kiln_buf b = {0};
    kiln_ctx_info ci = {.struct_size = sizeof ci};
    pthread_mutex_lock(&s->mu);
    bool ready = s->ready;
    pthread_mutex_unlock(&s->mu);
    if (ready) kiln_ctx_info_get(s->ctx, &ci); /* the scheduler's own counts, taken outside mu */
    double kv_ratio = ci.kv_capacity_tokens > 0 ? (double)ci.kv_used_tokens / (double)ci.kv_capacity_tokens : 0;
    pthread_mutex_lock(&s->mu);
    kiln_buf_printf(&b, "# HELP kiln_requests_running Requests in the batch (admitted to a slot).\n"
                        "# TYPE kiln_requests_running gauge\nkiln_requests_running %d\n", (int)ci.requests_running);
    kiln_buf_printf(&b, "# HELP kiln_requests_waiting Requests queued for a slot or KV memory (preempted ones "
                        "included).\n# TYPE kiln_requests_waiting gauge\nkiln_requests_waiting %d\n",
                    (int)ci.requests_waiting);
    kiln_buf_printf(&b, "# HELP kiln_kv_cache_usage_ratio KV memory promised to running requests, as a fraction.\n"
                        "# TYPE kiln_kv_cache_usage_ratio gauge\nkiln_kv_cache_usage_ratio %.6f\n", kv_ratio);
    kiln_buf_printf(&b, "# HELP kiln_kv_cache_capacity_tokens KV tokens the KV memory holds, all requests together.\n"
                        "# TYPE kiln_kv_cache_capacity_tokens gauge\nkiln_kv_cache_capacity_tokens %lld\n",
                    (long long)ci.kv_capacity_tokens);
    kiln_buf_printf(&b, "# HELP kiln_preemptions_total Running requests preempted because KV memory ran out.\n"
                        "# TYPE kiln_preemptions_total counter\nkiln_preemptions_total %lld\n",
                    (long long)ci.preemptions);
    kiln_buf_printf(&b, "# HELP kiln_recomputed_tokens_total Tokens computed again to resume preempted requests.\n"
                        "# TYPE kiln_recomputed_tokens_total counter\nkiln_recomputed_tokens_total %lld\n",
                    (long long)ci.tokens_recomputed);
    kiln_buf_printf(&b, "# HELP kiln_prompt_tokens_total Prompt tokens of finished requests.\n"
                        "# TYPE kiln_prompt_tokens_total counter\nkiln_prompt_tokens_total %llu\n",
                    (unsigned long long)s->met.prompt_tokens);
    kiln_buf_printf(&b, "# HELP kiln_generation_tokens_total Tokens generated by finished requests.\n"
                        "# TYPE kiln_generation_tokens_total counter\nkiln_generation_tokens_total %llu\n",
                    (unsigned long long)s->met.generation_tokens);
    kiln_buf_printf(&b, "# HELP kiln_requests_rejected_total Requests refused with 429 (queue full).\n"
                        "# TYPE kiln_requests_rejected_total counter\nkiln_requests_rejected_total %llu\n",
                    (unsigned long long)s->met.rejected_queue_full);
    kiln_buf_printf(&b, "# HELP kiln_requests_finished_total Finished requests by finish reason.\n"
                        "# TYPE kiln_requests_finished_total counter\n");
    for (int i = 0; i < FIN_COUNT; i++)
        kiln_buf_printf(&b, "kiln_requests_finished_total{finish_reason=\"%s\"} %llu\n", fin_names[i],
                        (unsigned long long)s->met.finished[i]);
    hist_print(&b, "kiln_time_to_first_token_seconds", "Time from submission to the first token.", &s->met.ttft);
    hist_print(&b, "kiln_time_per_output_token_seconds", "Time between consecutive tokens of a request.",
               &s->met.tpot);
    hist_print(&b, "kiln_e2e_request_latency_seconds", "Time from submission to the end of a request.", &s->met.e2e);
    hist_print(&b, "kiln_request_queue_time_seconds", "Time from submission to the first slot.", &s->met.queue);
    pthread_mutex_unlock(&s->mu);
    if (b.failed || !kiln_buf_append(&b, "", 1)) {
        kiln_buf_free(&b);
        return MHD_NO;
    }
    return send_text(mc, 200, (char *)b.data, "text/plain; version=0.0.4", NULL);
}

/* ---- routing ---- */

typedef struct route {
    const char *path, *method;
    bool needs_key, needs_ready;
} route;

static const route routes[] = {
    {"/health", "GET", false, false},          {"/metrics", "GET", false, false},
    {"/v1/models", "GET", true, false},        {"/v1/completions", "POST", true, true},
    {"/v1/chat/completions", "POST", true, true}, {"/tokenize", "POST", true, true},
    {"/detokenize", "POST", true, true},
};

static bool key_ok(struct MHD_Connection *mc, const char *key) {
    const char *h = MHD_lookup_connection_value(mc, MHD_HEADER_KIND, "Authorization");
    if (!h || strncmp(h, "Bearer ", 7) != 0) return false;
    h += 7;
    size_t n = strlen(h), m = strlen(key);
    unsigned diff = n != m;
    for (size_t i = 0; i < n && i < m; i++) diff |= (unsigned char)(h[i] ^ key[i]);
    return diff == 0;
}

static enum MHD_Result dispatch(struct MHD_Connection *mc, conn *c, const char *url, const char *method) {
    server *s = c->s;
    c->answered = true;
    const route *rt = NULL;
    for (size_t i = 0; i < sizeof routes / sizeof routes[0]; i++)
        if (strcmp(url, routes[i].path) == 0) rt = &routes[i];
    if (!rt) return fail(mc, 404, "invalid_request_error", "not_found", NULL, "no such endpoint; hint: see docs/serving.md");
    if (strcmp(method, rt->method) != 0)
        return fail(mc, 405, "invalid_request_error", "method_not_allowed", NULL,
                    strcmp(rt->method, "GET") == 0 ? "this endpoint takes GET" : "this endpoint takes POST");
    if (rt->needs_key && s->o.api_key && !key_ok(mc, s->o.api_key))
        return fail(mc, 401, "invalid_request_error", "invalid_api_key", NULL,
                    "missing or wrong API key; hint: send 'Authorization: Bearer KEY' with the server's --api-key");
    if (c->too_large)
        return fail(mc, 413, "invalid_request_error", "request_too_large", NULL, "the body is larger than 16 MiB");
    pthread_mutex_lock(&s->mu);
    bool ready = s->ready, draining = s->draining;
    pthread_mutex_unlock(&s->mu);
    if (strcmp(url, "/health") == 0)
        return ready && !draining ? send_text(mc, 200, strdup("{\"status\":\"ok\"}"), "application/json", NULL)
                                  : fail(mc, 503, "server_error", NULL, NULL, ready ? "draining" : "loading");
    if (strcmp(url, "/metrics") == 0) return handle_metrics(mc, s);
    if (!ready) return fail(mc, 503, "server_error", NULL, NULL, "the engine is still loading; hint: poll /health");
    if (draining && rt->needs_ready)
        return fail(mc, 503, "server_error", NULL, NULL, "the server is shutting down; hint: retry on another instance");
    if (strcmp(url, "/v1/models") == 0) return handle_models(mc, s);
    if (strcmp(url, "/v1/completions") == 0) return handle_generate(mc, c, SERVE_KIND_COMPLETION);
    if (strcmp(url, "/v1/chat/completions") == 0) return handle_generate(mc, c, SERVE_KIND_CHAT);
    if (strcmp(url, "/tokenize") == 0) return handle_tokenize(mc, c);
    return handle_detokenize(mc, c);
}

/* MHD's access handler: the first call makes the conn, the next ones collect the body, the last dispatches. */
static enum MHD_Result on_request(void *cls, struct MHD_Connection *mc, const char *url, const char *method,
                                  const char *version, const char *upload, size_t *upload_size, void **con_cls) {
    (void)version;
    conn *c = *con_cls;
    if (!c) {
        if (!(c = calloc(1, sizeof *c))) return MHD_NO;
        c->s = cls;
        const union MHD_ConnectionInfo *ci = MHD_get_connection_info(mc, MHD_CONNECTION_INFO_CONNECTION_FD);
        c->fd = ci ? ci->connect_fd : -1;
        *con_cls = c;
        return MHD_YES;
    }
    if (*upload_size) {
        if (c->body.len + *upload_size > SERVE_MAX_BODY) c->too_large = true;
        else if (!c->too_large && !kiln_buf_append(&c->body, upload, *upload_size)) return MHD_NO;
        *upload_size = 0;
        return MHD_YES;
    }
    if (c->answered) return MHD_YES;
    return dispatch(mc, c, url, method);
}

/* The request is over (answered, or the client went away): cancel its job if still running, free. */
static void on_completed(void *cls, struct MHD_Connection *mc, void **con_cls, enum MHD_RequestTerminationCode toe) {
    (void)mc;
    (void)toe;
    server *s = cls;
    conn *c = *con_cls;
    if (!c) return;
    *con_cls = NULL;
    if (c->n_jobs) {
        conn_cancel(s, c);
        job *dead[SERVE_MAX_N];
        pthread_mutex_lock(&s->mu);
        for (int i = 0; i < c->n_jobs; i++) dead[i] = job_unref(c->jobs[i]);
        pthread_mutex_unlock(&s->mu);
        for (int i = 0; i < c->n_jobs; i++) job_free(dead[i]);
    }
    kiln_buf_free(&c->body);
    kiln_buf_free(&c->out);
    free(c);
}

/* ---- the command ---- */

/* Returns -1 to go on, else the exit code. */
static int serve_parse(int argc, char **argv, serve_opts *o) {
    enum { O_HOST = 256, O_PORT, O_DEV, O_BATCH, O_QUEUE, O_KEY, O_NAME, O_DRAIN, O_CTX, O_THR, O_KVMEM, O_GPUS,
           O_TPTIME };
    static const struct option longopts[] = {
        {"host", required_argument, 0, O_HOST},       {"port", required_argument, 0, O_PORT},
        {"device", required_argument, 0, O_DEV},      {"max-batch", required_argument, 0, O_BATCH},
        {"max-queue", required_argument, 0, O_QUEUE}, {"api-key", required_argument, 0, O_KEY},
        {"model-name", required_argument, 0, O_NAME}, {"drain-seconds", required_argument, 0, O_DRAIN},
        {"max-context", required_argument, 0, O_CTX}, {"threads", required_argument, 0, O_THR},
        {"kv-memory", required_argument, 0, O_KVMEM}, {"help", no_argument, 0, 'h'},
        {"gpus", required_argument, 0, O_GPUS},       {"tp-timeout", required_argument, 0, O_TPTIME},
        {0, 0, 0, 0}};
    *o = (serve_opts){.host = "127.0.0.1", .device = "auto", .port = 8000, .max_batch = 8, .max_queue = 64,
                      .drain_s = 30};
    int c, rc;
    optind = 1;
    opterr = 0;
    while ((c = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
        const char *bad = NULL;
        switch (c) {
        case O_HOST: o->host = optarg; break;
        case O_DEV: o->device = optarg; break;
        case O_KEY: o->api_key = optarg; break;
        case O_NAME: o->model_name = optarg; break;
        case O_PORT: bad = kiln_cli_parse_int(optarg, 0, 65535, &o->port) ? NULL : "--port is a number in 0..65535"; break;
        case O_BATCH: bad = kiln_cli_parse_int(optarg, 1, 1024, &o->max_batch) ? NULL : "--max-batch is in 1..1024"; break;
        case O_QUEUE: bad = kiln_cli_parse_int(optarg, 0, 1 << 20, &o->max_queue) ? NULL : "--max-queue is >= 0"; break;
        case O_DRAIN: bad = kiln_cli_parse_int(optarg, 0, 86400, &o->drain_s) ? NULL : "--drain-seconds is in 0..86400"; break;
        case O_CTX: bad = kiln_cli_parse_int(optarg, 1, 1 << 24, &o->max_ctx) ? NULL : "--max-context is > 0"; break;
        case O_THR: bad = kiln_cli_parse_int(optarg, 1, 256, &o->threads) ? NULL : "--threads is in 1..256"; break;
        case O_KVMEM:
            bad = kiln_cli_parse_memory(optarg, &o->kv_bytes, &o->kv_fraction)
                      ? NULL
                      : "--kv-memory is bytes (e.g. 4G) or a fraction in (0, 1]";
            break;
        case O_GPUS:
            if ((rc = kiln_cli_gpus_arg("serve", optarg)) != KILN_EXIT_OK) return rc;
            o->gpus = optarg;
            break;
        case O_TPTIME:
            if ((rc = kiln_cli_tp_timeout_arg("serve", optarg, &o->tp_timeout)) != KILN_EXIT_OK) return rc;
            break;
        case 'h': help(stdout); return KILN_EXIT_OK;
        default: return kiln_cli_usage_error("serve", "unknown or incomplete option '%s'", argv[optind - 1]);
        }
        if (bad) return kiln_cli_usage_error("serve", "'%s': %s", optarg, bad);
    }
    if (optind != argc - 1) return kiln_cli_usage_error("serve", "expected one engine file");
    o->engine = argv[optind];
    if (strcmp(o->device, "cpu") != 0 && strcmp(o->device, "auto") != 0 && strcmp(o->device, "gpu") != 0)
        return kiln_cli_usage_error("serve", "unknown device '%s' (gpu, cpu, auto)", o->device);
    if (o->kv_fraction > 0 && strcmp(o->device, "cpu") == 0)
        return kiln_cli_usage_error("serve", "--kv-memory %g is a fraction of GPU memory, which does not apply to "
                                             "--device cpu; give bytes (e.g. 512M)", o->kv_fraction);
    if (o->model_name && (!*o->model_name || strlen(o->model_name) >= 256))
        return kiln_cli_usage_error("serve", "--model-name must be 1..255 bytes");
    return -1;
}

/* The model's name: --model-name, else the engine file's base name without ".kiln". */
static void model_name(const serve_opts *o, char out[256]) {
    if (o->model_name) {
        snprintf(out, 256, "%s", o->model_name);
        return;
    }
    const char *b = strrchr(o->engine, '/');
    snprintf(out, 256, "%s", b ? b + 1 : o->engine);
    size_t n = strlen(out);
    if (n > 5 && strcmp(out + n - 5, ".kiln") == 0) out[n - 5] = 0;
}

/* libmicrohttpd's own messages, prefixed; a client that goes away mid-stream is expected (its
 * request is cancelled and counted in kiln_requests_finished_total{finish_reason="cancelled"}), so
 * those are not logged. */
static void mhd_log(void *cls, const char *fmt, va_list ap) {
    (void)cls;
    char msg[512];
    vsnprintf(msg, sizeof msg, fmt, ap);
    if (strstr(msg, "forcibly closed by remote peer") || strstr(msg, "Connection reset by peer") ||
        strstr(msg, "Broken pipe"))
        return;
    size_t n = strlen(msg);
    while (n && (msg[n - 1] == '\n' || msg[n - 1] == '\r')) msg[--n] = 0;
    fprintf(stderr, "kiln serve: libmicrohttpd: %s\n", msg);
}

static struct MHD_Daemon *start_http(server *s, kiln_error *err) {
    struct sockaddr_storage ss = {0};
    unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_THREAD_PER_CONNECTION | MHD_USE_ERROR_LOG;
    if (strchr(s->o.host, ':')) {
        struct sockaddr_in6 *a = (struct sockaddr_in6 *)&ss;
        a->sin6_family = AF_INET6;
        a->sin6_port = htons((uint16_t)s->o.port);
        if (inet_pton(AF_INET6, s->o.host, &a->sin6_addr) != 1) goto bad_host;
        flags |= MHD_USE_IPv6;
    } else {
        struct sockaddr_in *a = (struct sockaddr_in *)&ss;
        a->sin_family = AF_INET;
        a->sin_port = htons((uint16_t)s->o.port);
        if (inet_pton(AF_INET, s->o.host, &a->sin_addr) != 1) goto bad_host;
    }
    struct MHD_Daemon *d = MHD_start_daemon(flags, (uint16_t)s->o.port, NULL, NULL, on_request, s,
                                            MHD_OPTION_EXTERNAL_LOGGER, mhd_log, NULL, /* first, as MHD wants */
                                            MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&ss,
                                            MHD_OPTION_NOTIFY_COMPLETED, on_completed, s,
                                            MHD_OPTION_CONNECTION_LIMIT, 1024u,
                                            MHD_OPTION_CONNECTION_TIMEOUT, 600u, MHD_OPTION_END);
    if (!d) {
        kiln_err(err, KILN_ERR_IO, "cannot listen on %s port %lld", s->o.host, s->o.port);
        kiln_err_hint(err, "is the port in use? choose another with --port");
    }
    return d;
bad_host:
    kiln_err(err, KILN_ERR_INVALID_ARG, "--host '%s' is not an IP address", s->o.host);
    kiln_err_hint(err, "give an address such as 127.0.0.1, 0.0.0.0 or ::1");
    return NULL;
}

/* Open the engine and its context; then the server is ready. */
static kiln_status load(server *s, kiln_error *err) {
    kiln_status st = kiln_open(s->o.engine, (int32_t)s->o.threads, &s->k);
    if (st != KILN_OK) return kiln_err(err, st, "%s", kiln_error_message(s->k));
    kiln_ctx_options co;
    kiln_ctx_options_init(&co);
    co.device = s->o.device;
    co.max_batch = (int32_t)s->o.max_batch;
    co.max_context = (int32_t)s->o.max_ctx;
    co.threads = (int32_t)s->o.threads;
    co.kv_bytes = s->o.kv_bytes;
    if (s->o.kv_fraction > 0) co.kv_fraction = s->o.kv_fraction;
    co.gpus = s->o.gpus;
    co.tp_timeout_s = s->o.tp_timeout;
    if ((st = kiln_ctx_new(s->k, &co, &s->ctx)) != KILN_OK) return kiln_err(err, st, "%s", kiln_last_error(s->ctx));
    kiln_ctx_info info = {.struct_size = sizeof info};
    if ((st = kiln_ctx_info_get(s->ctx, &info)) != KILN_OK) return kiln_err(err, st, "%s", kiln_last_error(s->ctx));
    pthread_mutex_lock(&s->mu);
    s->tok = kiln_api_model(s->k)->tokenizer;
    s->max_context = info.max_context;
    s->vocab = kiln_vocab_size(s->k);
    s->ready = true;
    pthread_mutex_unlock(&s->mu);
    fprintf(stderr, "kiln serve: %s ready on %s (max batch %d, context %d)\n", s->model, info.device_name,
            info.max_batch, info.max_context);
    return KILN_OK;
}

/* SIGTERM/SIGINT came: refuse new work, give running requests drain_s seconds, cancel the rest. */
static void drain(server *s) {
    pthread_mutex_lock(&s->mu);
    s->draining = true;
    int active = s->active;
    pthread_mutex_unlock(&s->mu);
    fprintf(stderr, "kiln serve: draining %d request(s) (at most %lld s)\n", active, s->o.drain_s);
    double until = kiln_now() + (double)s->o.drain_s;
    while (active > 0) {
        if (kiln_now() >= until) {
            int64_t ids[64];
            int n = 0;
            pthread_mutex_lock(&s->mu);
            for (job *j = s->jobs; j && n < 64; j = j->next)
                if (j->id > 0) ids[n++] = j->id;
            pthread_mutex_unlock(&s->mu);
            for (int i = 0; i < n; i++) kiln_cancel(s->ctx, ids[i]);
        }
        struct timespec ts = {0, 20 * 1000000L};
        nanosleep(&ts, NULL);
        pthread_mutex_lock(&s->mu);
        active = s->active;
        pthread_mutex_unlock(&s->mu);
    }
}

int kiln_cmd_serve(int argc, char **argv) {
    server s = {0};
    int rc = serve_parse(argc, argv, &s.o);
    if (rc >= 0) return rc;
    model_name(&s.o, s.model);
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGTERM);
    sigaddset(&sigs, SIGINT);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL); /* every thread started from here inherits the mask */
    signal(SIGPIPE, SIG_IGN);
    pthread_mutex_init(&s.mu, NULL);
    pthread_cond_init(&s.sched_cv, NULL);
    kiln_error err = {0};
    pthread_t sched;
    bool sched_started = false;
    struct MHD_Daemon *d = start_http(&s, &err);
    if (!d) goto out_fail;
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(d, MHD_DAEMON_INFO_BIND_PORT);
    fprintf(stderr, "kiln serve: listening on http://%s:%u\n", s.o.host, di ? di->port : (unsigned)s.o.port);
    if (load(&s, &err) != KILN_OK) goto out_fail;
    if (pthread_create(&sched, NULL, sched_main, &s) != 0) {
        kiln_err(&err, KILN_ERR_INTERNAL, "cannot start the scheduler thread");
        goto out_fail;
    }
    sched_started = true;
    int sig = 0;
    sigwait(&sigs, &sig);
    drain(&s);
    rc = KILN_EXIT_OK;
    goto out_free;
out_fail:
    rc = kiln_cli_fail("serve", &err, false);
out_free:
    if (d) MHD_stop_daemon(d);
    if (sched_started) {
        pthread_mutex_lock(&s.mu);
        s.stop_sched = true;
        pthread_cond_signal(&s.sched_cv);
        pthread_mutex_unlock(&s.mu);
        pthread_join(sched, NULL);
    }
    kiln_ctx_free(s.ctx);
    kiln_close(s.k);
    if (rc == KILN_EXIT_OK) fprintf(stderr, "kiln serve: stopped\n");
    struct timespec now = {0, 0}; /* a second SIGTERM during the drain is taken here, not by the default action */
    while (sigtimedwait(&sigs, NULL, &now) > 0) {}
    pthread_sigmask(SIG_UNBLOCK, &sigs, NULL);
    return rc;
}
