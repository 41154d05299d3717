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
    fprintf(f,
            "usage: kiln serve ENGINE.kiln [options]\n\n"
            "Serve the engine over HTTP with OpenAI's API (docs/serving.md): /v1/completions,\n"
            "/v1/chat/completions, /v1/models, /health, /metrics, /tokenize, /detokenize.\n"
            "SIGTERM or SIGINT drains: new requests get 503, running ones finish, then exit 0.\n\n"
            "  --host H             address to listen on (default 127.0.0.1)\n"
            "  --port P             TCP port (default 8000; 0 = any free port, printed)\n"
            "  --device DEV         gpu, cpu or auto (default auto)\n"
            "  --max-batch N        requests that run together (default 8)\n"
            "  --max-queue N        requests that may wait beyond those; more get 429 (default 64)\n"
            "  --max-context N      tokens per request, prompt + output (default: the model's)\n"
            "  --threads N          CPU threads (default: one per core)\n"
            "  --api-key KEY        require 'Authorization: Bearer KEY' on /v1/*, /tokenize, /detokenize\n"
            "  --model-name NAME    the model's name in requests (default: the engine file's base name)\n"
            "  --drain-seconds S    on SIGTERM, how long running requests may take to finish (default 30)\n"
            "  -h, --help           this help\n");
}

typedef struct serve_opts {
    const char *engine, *host, *device, *api_key, *model_name;
    long long port, max_batch, max_queue, max_ctx, threads, drain_s;
} serve_opts;

/* ---- metrics (Prometheus text; guarded by server.mu) ---- */
#define N_BUCKETS 13
static const double hist_le[N_BUCKETS] = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60};
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
    serve_hist ttft, e2e;
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
    int active;              /* requests submitted and not finished */
    struct job *jobs;        /* those requests (for the drain) */
    uint64_t serial;         /* for response ids and default seeds */
    serve_metrics met;
} server;

/* One generation request, shared by its connection and the token callback (refs). */
typedef struct job {
    server *s;
    struct job *next, *prev;
    pthread_cond_t cv;  /* signalled when text arrives or the request finishes */
    int refs;
    int64_t id;         /* kiln request id (0 until submitted) */
    serve_request req;  /* the parsed body (stops, stream...) */
    kiln_tok_stream ts;
    bool has_ts;
    kiln_buf text;      /* decoded text so far, cut at a stop string */
    size_t visible;     /* bytes of text no stop string can still take back */
    size_t sent;        /* bytes streamed so far */
    int32_t n_prompt, n_gen;
    int32_t reason;     /* kiln_stop_reason once done */
    bool done, stop_hit, client_gone;
    double t0;
    char rid[40];
    long long created;
} job;

/* Per connection: the body being received, and the job and SSE buffer of a stream. */
typedef struct conn {
    server *s;
    kiln_buf body;
    bool too_large;
    job *j;
    int fd;
    kiln_buf out; /* SSE bytes not yet handed to MHD */
    size_t out_off;
    bool chat, role_sent, stream_done;
} conn;

/* Release one reference (mu held); returns the job when it must now be freed. */
static job *job_unref(job *j) { return --j->refs == 0 ? j : NULL; }

static void job_free(job *j) {
    if (!j) return;
    serve_request_free(&j->req);
    if (j->has_ts) kiln_tok_stream_free(&j->ts);
    kiln_buf_free(&j->text);
    pthread_cond_destroy(&j->cv);
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
    for (int i = 0; i < j->req.n_stops; i++) {
        size_t sl = strlen(j->req.stops[i]);
        for (size_t k = sl - 1; k > held; k--)
            if (k <= j->text.len && memcmp(j->text.data + j->text.len - k, j->req.stops[i], k) == 0) {
                held = k;
                break;
            }
    }
    return held;
}

/* Append decoded text; cut it at the first stop string (matched across token boundaries). */
static void job_append(job *j, const char *t, size_t n) {
    size_t old = j->text.len;
    if (!kiln_buf_append(&j->text, t, n)) return;
    size_t cut = SIZE_MAX;
    for (int i = 0; i < j->req.n_stops; i++) {
        size_t sl = strlen(j->req.stops[i]);
        size_t from = old > sl ? old - sl + 1 : 0;
        for (size_t p = from; p + sl <= j->text.len && p < cut; p++)
            if (memcmp(j->text.data + p, j->req.stops[i], sl) == 0) {
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
    pthread_cond_broadcast(&j->cv);
    return job_unref(j);
}

static int32_t on_token(void *user, int64_t request, int32_t tok, int32_t finished, int32_t stop_reason) {
    job *j = user;
    (void)request;
    int32_t ret = 0;
    job *dead = NULL;
    pthread_mutex_lock(&j->s->mu);
    if (tok >= 0 && !j->stop_hit) {
        if (j->n_gen++ == 0) hist_add(&j->s->met.ttft, kiln_now() - j->t0);
        const char *t;
        size_t n;
        kiln_error e;
        if (j->has_ts && kiln_tok_stream_push(&j->ts, tok, &t, &n, &e) == KILN_OK && n) job_append(j, t, n);
        ret = j->stop_hit; /* a stop string: cancel the rest */
        pthread_cond_broadcast(&j->cv);
    }
    if (finished) dead = job_finish(j, stop_reason);
    pthread_mutex_unlock(&j->s->mu);
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

/* Cancel a job that is not done (its client went away or the drain ran out); mu not held. */
static void job_cancel(server *s, job *j) {
    pthread_mutex_lock(&s->mu);
    int64_t id = j->done ? 0 : j->id;
    j->client_gone = true;
    pthread_mutex_unlock(&s->mu);
    if (id > 0) kiln_cancel(s->ctx, id);
}

/* Wait (mu held) until the job has text beyond `seen` or is done, checking the client's socket. */
static void job_wait(server *s, job *j, size_t seen, int fd) {
    while (!j->done && j->visible <= seen) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += SERVE_WAIT_MS * 1000000L;
        if (ts.tv_nsec >= 1000000000L) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000L;
        }
        pthread_cond_timedwait(&j->cv, &s->mu, &ts);
        if (!j->done && !j->client_gone && client_gone(fd)) {
            pthread_mutex_unlock(&s->mu);
            job_cancel(s, j);
            pthread_mutex_lock(&s->mu);
        }
    }
}

/* The request's sampling: the engine's defaults, each replaced by the field when given. */
static void request_options(server *s, job *j, kiln_request_options *ro) {
    const serve_request *r = &j->req;
    kiln_request_options_init_from_engine(s->k, ro);
    if (r->temperature >= 0) ro->temperature = (float)r->temperature;
    if (r->top_p >= 0) ro->top_p = (float)r->top_p;
    if (r->top_k_set) ro->top_k = r->top_k;
    ro->seed = r->seed_set ? r->seed : (uint64_t)time(NULL) * 1000003u + s->serial;
    ro->ignore_eos = r->ignore_eos;
    int32_t room = s->max_context - j->n_prompt;
    ro->max_tokens = r->max_tokens >= 0 ? r->max_tokens : r->kind == SERVE_KIND_COMPLETION ? 16 : room;
    ro->on_token = on_token;
    ro->user = j;
}

/* A new job for the request *r (taken over) with n prompt tokens; NULL when out of memory. */
static job *job_new(server *s, serve_request *r, int32_t n) {
    job *j = calloc(1, sizeof *j);
    if (!j) return NULL;
    j->s = s;
    j->req = *r;
    memset(r, 0, sizeof *r);
    j->n_prompt = n;
    j->refs = 2; /* the connection and the token callback */
    j->t0 = kiln_now();
    j->created = (long long)time(NULL);
    pthread_cond_init(&j->cv, NULL);
    if (s->tok) {
        kiln_tok_stream_init(&j->ts, s->tok, true);
        j->has_ts = true;
    }
    return j;
}

/* Take a place for the job: 503 while draining, 429 when --max-queue requests already wait. */
static kiln_status job_admit(server *s, job *j, serve_error *e) {
    pthread_mutex_lock(&s->mu);
    bool draining = s->draining, full = s->active >= s->o.max_batch + s->o.max_queue;
    if (!draining && !full) {
        job_link(s, j);
        snprintf(j->rid, sizeof j->rid, "%s-%llu", j->req.kind == SERVE_KIND_CHAT ? "chatcmpl" : "cmpl",
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

/* Admit and submit a job (it takes over *r and ids). On failure *e is set and the job is gone. */
static job *job_start(server *s, serve_request *r, int32_t *ids, int32_t n, serve_error *e) {
    job *j = job_new(s, r, n);
    if (!j) {
        free(ids);
        serve_request_free(r);
        serve_error_set(e, 500, "server_error", NULL, NULL, "out of memory");
        return NULL;
    }
    if (job_admit(s, j, e) != KILN_OK) {
        free(ids);
        job_free(j);
        return NULL;
    }
    kiln_request_options ro;
    request_options(s, j, &ro);
    int64_t id = 0;
    kiln_status st = kiln_submit(s->ctx, ids, n, &ro, &id);
    if (st != KILN_OK) serve_error_set(e, 400, "invalid_request_error", st == KILN_ERR_CONTEXT ?
                                       "context_length_exceeded" : NULL, j->req.messages ? "messages" : "prompt",
                                       "%s", kiln_last_error(s->ctx));
    free(ids);
    pthread_mutex_lock(&s->mu);
    if (st == KILN_OK) {
        j->id = id;
        pthread_cond_signal(&s->sched_cv);
    } else {
        job_unlink(s, j); /* never submitted: no callback will come */
    }
    pthread_mutex_unlock(&s->mu);
    if (st != KILN_OK) {
        job_free(j);
        return NULL;
    }
    return j;
}

static json_t *usage_json(const job *j) {
    return json_pack("{s:i, s:i, s:i}", "prompt_tokens", (int)j->n_prompt, "completion_tokens", (int)j->n_gen,
                     "total_tokens", (int)(j->n_prompt + j->n_gen));
}

static const char *finish_reason(const job *j) { return fin_names[fin_index(j)]; }

/* A whole (non-streamed) response (mu held, job done). */
static json_t *final_json(const server *s, const job *j) {
    json_t *text = json_stringn((const char *)j->text.data, j->text.len);
    json_t *choice = j->req.kind == SERVE_KIND_CHAT
                         ? json_pack("{s:i, s:{s:s, s:o}, s:n, s:s}", "index", 0, "message", "role", "assistant",
                                     "content", text, "logprobs", "finish_reason", finish_reason(j))
                         : json_pack("{s:i, s:o, s:n, s:s}", "index", 0, "text", text, "logprobs", "finish_reason",
                                     finish_reason(j));
    return json_pack("{s:s, s:s, s:I, s:s, s:[o], s:o}", "id", j->rid, "object",
                     j->req.kind == SERVE_KIND_CHAT ? "chat.completion" : "text_completion", "created",
                     (json_int_t)j->created, "model", s->model, "choices", choice, "usage", usage_json(j));
}

static enum MHD_Result reply_whole(struct MHD_Connection *mc, conn *c, job *j) {
    server *s = c->s;
    pthread_mutex_lock(&s->mu);
    job_wait(s, j, SIZE_MAX, c->fd);
    int fin = fin_index(j);
    json_t *out = fin == FIN_STOP || fin == FIN_LENGTH ? final_json(s, j) : NULL;
    pthread_mutex_unlock(&s->mu);
    if (fin == FIN_CANCELLED)
        return fail(mc, 503, "server_error", NULL, NULL, "the request was cancelled (the server is shutting down)");
    if (!out) return fail(mc, 500, "server_error", NULL, NULL, "generation failed: see the server's log");
    return send_json(mc, 200, out, NULL);
}

/* ---- streaming (Server-Sent Events) ---- */

/* One SSE chunk of the stream: delta text (may be NULL), finish reason (NULL = none yet). */
static void sse_chunk(conn *c, const job *j, const char *delta, size_t n, const char *finish, bool usage_only) {
    json_t *choice;
    if (c->chat) {
        json_t *d = json_object();
        if (!c->role_sent) json_object_set_new(d, "role", json_string("assistant"));
        if (delta) json_object_set_new(d, "content", json_stringn(delta, n));
        choice = json_pack("{s:i, s:o, s:n, s:o}", "index", 0, "delta", d, "logprobs", "finish_reason",
                           finish ? json_string(finish) : json_null());
        c->role_sent = true;
    } else {
        choice = json_pack("{s:i, s:s%, s:n, s:o}", "index", 0, "text", delta ? delta : "", delta ? n : 0,
                           "logprobs", "finish_reason", finish ? json_string(finish) : json_null());
    }
    json_t *o = json_pack("{s:s, s:s, s:I, s:s, s:o}", "id", j->rid, "object",
                          c->chat ? "chat.completion.chunk" : "text_completion", "created", (json_int_t)j->created,
                          "model", c->s->model, "choices", usage_only ? (json_decref(choice), json_array())
                                                                         : json_pack("[o]", choice));
    if (o && j->req.include_usage) json_object_set_new(o, "usage", usage_only ? usage_json(j) : json_null());
    char *s = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    if (s) kiln_buf_printf(&c->out, "data: %s\n\n", s);
    free(s);
}

/* Fill c->out with the next SSE events, waiting for text (mu not held). */
static void sse_fill(conn *c) {
    server *s = c->s;
    job *j = c->j;
    pthread_mutex_lock(&s->mu);
    job_wait(s, j, j->sent, c->fd);
    if (j->visible > j->sent || (c->chat && !c->role_sent))
        sse_chunk(c, j, (const char *)j->text.data + j->sent, j->visible - j->sent, NULL, false);
    j->sent = j->visible;
    if (j->done) {
        int fin = fin_index(j);
        if (fin == FIN_STOP || fin == FIN_LENGTH) {
            sse_chunk(c, j, NULL, 0, finish_reason(j), false);
            if (j->req.include_usage) sse_chunk(c, j, NULL, 0, NULL, true);
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
    pthread_mutex_unlock(&s->mu);
}

static ssize_t sse_read(void *cls, uint64_t pos, char *buf, size_t max) {
    conn *c = cls;
    (void)pos;
    while (c->out_off >= c->out.len) {
        c->out.len = c->out_off = 0;
        if (c->stream_done) return MHD_CONTENT_READER_END_OF_STREAM;
        sse_fill(c);
        if (c->out.len == 0 && c->j->client_gone) return MHD_CONTENT_READER_END_WITH_ERROR;
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
    job *j = job_start(s, &r, ids, n, &e);
    if (!j) return send_error(mc, &e);
    c->j = j;
    c->chat = kind == SERVE_KIND_CHAT;
    return stream ? reply_stream(mc, c) : reply_whole(mc, c, j);
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
    pthread_mutex_lock(&s->mu);
    int running = s->active < s->o.max_batch ? s->active : (int)s->o.max_batch;
    kiln_buf_printf(&b, "# HELP kiln_requests_running Requests generating now.\n# TYPE kiln_requests_running gauge\n"
                        "kiln_requests_running %d\n", running);
    kiln_buf_printf(&b, "# HELP kiln_requests_waiting Requests queued for a slot.\n# TYPE kiln_requests_waiting gauge\n"
                        "kiln_requests_waiting %d\n", s->active - running);
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
    hist_print(&b, "kiln_e2e_request_latency_seconds", "Time from submission to the end of a request.", &s->met.e2e);
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
    if (c->j) return MHD_YES; /* already answered */
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
    if (c->j) {
        job_cancel(s, c->j);
        pthread_mutex_lock(&s->mu);
        job *dead = job_unref(c->j);
        pthread_mutex_unlock(&s->mu);
        job_free(dead);
    }
    kiln_buf_free(&c->body);
    kiln_buf_free(&c->out);
    free(c);
}

/* ---- the command ---- */

/* Returns -1 to go on, else the exit code. */
static int serve_parse(int argc, char **argv, serve_opts *o) {
    enum { O_HOST = 256, O_PORT, O_DEV, O_BATCH, O_QUEUE, O_KEY, O_NAME, O_DRAIN, O_CTX, O_THR };
    static const struct option longopts[] = {
        {"host", required_argument, 0, O_HOST},       {"port", required_argument, 0, O_PORT},
        {"device", required_argument, 0, O_DEV},      {"max-batch", required_argument, 0, O_BATCH},
        {"max-queue", required_argument, 0, O_QUEUE}, {"api-key", required_argument, 0, O_KEY},
        {"model-name", required_argument, 0, O_NAME}, {"drain-seconds", required_argument, 0, O_DRAIN},
        {"max-context", required_argument, 0, O_CTX}, {"threads", required_argument, 0, O_THR},
        {"help", no_argument, 0, 'h'},                {0, 0, 0, 0}};
    *o = (serve_opts){.host = "127.0.0.1", .device = "auto", .port = 8000, .max_batch = 8, .max_queue = 64,
                      .drain_s = 30};
    int c;
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
        case 'h': help(stdout); return KILN_EXIT_OK;
        default: return kiln_cli_usage_error("serve", "unknown or incomplete option '%s'", argv[optind - 1]);
        }
        if (bad) return kiln_cli_usage_error("serve", "'%s': %s", optarg, bad);
    }
    if (optind != argc - 1) return kiln_cli_usage_error("serve", "expected one engine file");
    o->engine = argv[optind];
    if (strcmp(o->device, "cpu") != 0 && strcmp(o->device, "auto") != 0 && strcmp(o->device, "gpu") != 0)
        return kiln_cli_usage_error("serve", "unknown device '%s' (gpu, cpu, auto)", o->device);
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
