/*
 * serve.h — `kiln serve`'s pieces that do not need a socket: the request
 * body parser (JSON → serve_request, fuzzed by fuzz/fuzz_serve_request.c)
 * and the OpenAI-style error it reports. compiler/cmd_serve.c is the HTTP
 * server (libmicrohttpd) and the scheduler thread around them.
 *
 * The parser only checks shape, types and ranges; what needs the engine
 * (the model name, the tokenizer, the context size, the vocabulary) is
 * checked by the server.
 */
#ifndef KILN_SERVE_H
#define KILN_SERVE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../runtime/kiln.h"

#define SERVE_MAX_STOPS 16         /* stop strings per request */
#define SERVE_MAX_STOP_BYTES 256   /* bytes per stop string */
#define SERVE_MAX_MESSAGES 4096    /* chat messages per request */
#define SERVE_MAX_PROMPT_IDS (1 << 22)
#define SERVE_MAX_N 16             /* choices per request (n) */

typedef enum serve_kind {
    SERVE_KIND_COMPLETION = 0, /* POST /v1/completions */
    SERVE_KIND_CHAT = 1,       /* POST /v1/chat/completions */
    SERVE_KIND_TOKENIZE = 2,   /* POST /tokenize */
    SERVE_KIND_DETOKENIZE = 3, /* POST /detokenize */
} serve_kind;

/* An error as OpenAI's API reports it: {"error": {message, type, param, code}}. */
typedef struct serve_error {
    int http;          /* HTTP status, 400... */
    const char *type;  /* "invalid_request_error"... (static) */
    const char *code;  /* NULL or "context_length_exceeded"... (static) */
    char param[64];    /* the field at fault, "" when none */
    char message[512];
} serve_error;

/* One parsed request body. Strings are malloc'd copies, freed by serve_request_free. */
typedef struct serve_request {
    serve_kind kind;
    char *model;                 /* NULL when absent */
    char *prompt;                /* text prompt (completion, tokenize), NUL-terminated; NULL when ids or messages */
    size_t prompt_len;
    int32_t *prompt_ids;         /* token ids (completion prompt, detokenize tokens) */
    int32_t n_prompt_ids;
    kiln_chat_message *messages; /* chat (and tokenize with messages); role/content malloc'd */
    int32_t n_messages;
    int32_t max_tokens;          /* -1 when absent */
    double temperature, top_p;   /* < 0 when absent */
    int32_t top_k;               /* -1 when absent (or given as -1: off) */
    bool top_k_set, seed_set;
    uint64_t seed;
    char *stops[SERVE_MAX_STOPS];
    int n_stops;
    bool stream, include_usage, ignore_eos;
    double min_p, presence_penalty, frequency_penalty, repetition_penalty; /* neutral when absent: 0, 0, 0, 1 */
    int32_t n;                   /* choices, 1..SERVE_MAX_N */
    int32_t logprobs;            /* -1 = none, else alternatives per token (completions: logprobs;
                                    chat: top_logprobs with logprobs true) */
    bool add_special;            /* tokenize: add_special_tokens (default true); chat: add_generation_prompt */
    bool echo;                   /* completions: the prompt's text before the completion's, and with
                                    logprobs its tokens' entries before the generated ones' */
} serve_request;

/* Parse `len` bytes of a request body of `kind` into *out. On failure
 * *out holds nothing to free, and *err the 400 error naming the field. */
kiln_status serve_request_parse(const char *body, size_t len, serve_kind kind, serve_request *out, serve_error *err);
void serve_request_free(serve_request *r);

/* Fill *err (returns KILN_ERR_INVALID_ARG). */
kiln_status serve_error_set(serve_error *err, int http, const char *type, const char *code, const char *param,
                            const char *fmt, ...) __attribute__((format(printf, 6, 7)));

#endif /* KILN_SERVE_H */
