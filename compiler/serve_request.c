/*
 * serve_request.c — request bodies of `kiln serve` (JSON → serve_request).
 *
 * The body is hostile: sizes are capped (stop strings, messages, ids), every
 * field's type is checked, and a field is named in each error. OpenAI
 * fields that would change the result but kiln does not support yet are
 * refused by name (400) rather than silently ignored; unknown fields that
 * change nothing (user, metadata...) are ignored.
 */
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "serve.h"

kiln_status serve_error_set(serve_error *err, int http, const char *type, const char *code, const char *param,
                            const char *fmt, ...) {
    err->http = http;
    err->type = type;
    err->code = code;
    snprintf(err->param, sizeof err->param, "%s", param ? param : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->message, sizeof err->message, fmt, ap);
    va_end(ap);
    return KILN_ERR_INVALID_ARG;
}

static kiln_status bad(serve_error *err, const char *param, const char *what) {
    return serve_error_set(err, 400, "invalid_request_error", NULL, param, "'%s' %s", param, what);
}

static kiln_status unsupported(serve_error *err, const char *param, const char *why) {
    return serve_error_set(err, 400, "invalid_request_error", "unsupported_parameter", param,
                           "'%s' is not supported by kiln serve yet (%s); hint: leave it out", param, why);
}

/* Fields that would change the result but are not supported: absent, null or neutral, else refused.
 * `echo` is a completions field (parse_echo). */
static kiln_status refuse_unsupported(const json_t *o, serve_kind kind, serve_error *err) {
    static const char *const present[] = {"tools", "functions", "logit_bias", "suffix", "echo", "tool_choice",
                                          "function_call"};
    for (size_t i = 0; i < sizeof present / sizeof present[0]; i++) {
        if (kind == SERVE_KIND_COMPLETION && strcmp(present[i], "echo") == 0) continue;
        json_t *v = json_object_get(o, present[i]);
        if (!v || json_is_null(v) || json_is_false(v)) continue;
        if ((json_is_array(v) && json_array_size(v) == 0) || (json_is_object(v) && json_object_size(v) == 0)) continue;
        if (json_is_string(v) && strcmp(present[i], "tool_choice") == 0 && strcmp(json_string_value(v), "none") == 0)
            continue;
        return unsupported(err, present[i], "it has no effect here");
    }
    json_t *rf = json_object_get(o, "response_format");
    if (rf && !json_is_null(rf)) {
        json_t *t = json_is_object(rf) ? json_object_get(rf, "type") : NULL;
        if (!json_is_string(t) || strcmp(json_string_value(t), "text") != 0)
            return unsupported(err, "response_format", "only {\"type\": \"text\"} works");
    }
    return KILN_OK;
}

static char *dupn(const char *s, size_t n) {
    char *d = malloc(n + 1);
    if (d) {
        memcpy(d, s, n);
        d[n] = 0;
    }
    return d;
}

static kiln_status oom(serve_error *err) {
    return serve_error_set(err, 500, "server_error", NULL, NULL, "out of memory parsing the request");
}

/* An array of token ids (integers in 0..INT32_MAX), at least one. */
static kiln_status parse_ids(const json_t *a, const char *param, serve_request *r, serve_error *err) {
    size_t n = json_array_size(a);
    if (n == 0) return bad(err, param, "holds no token id: a prompt needs at least one");
    if (n > SERVE_MAX_PROMPT_IDS) return bad(err, param, "holds too many token ids");
    if (!(r->prompt_ids = malloc(n * sizeof *r->prompt_ids))) return oom(err);
    for (size_t i = 0; i < n; i++) {
        json_t *v = json_array_get(a, i);
        if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > INT32_MAX)
            return bad(err, param, "must hold token ids (integers >= 0)");
        r->prompt_ids[i] = (int32_t)json_integer_value(v);
    }
    r->n_prompt_ids = (int32_t)n;
    return KILN_OK;
}

/* "prompt": a string, a list of one string, token ids, or a list of one list of ids. */
static kiln_status parse_prompt(const json_t *p, serve_request *r, serve_error *err) {
    if (json_is_array(p) && json_array_size(p) >= 1 &&
        (json_is_string(json_array_get(p, 0)) || json_is_array(json_array_get(p, 0)))) {
        if (json_array_size(p) > 1)
            return serve_error_set(err, 400, "invalid_request_error", "unsupported_parameter", "prompt",
                                   "'prompt' holds %zu prompts; kiln serve takes one per request; hint: send one "
                                   "request per prompt", json_array_size(p));
        p = json_array_get(p, 0);
    }
    if (json_is_string(p)) {
        r->prompt_len = json_string_length(p);
        if (!(r->prompt = dupn(json_string_value(p), r->prompt_len))) return oom(err);
        return KILN_OK;
    }
    if (json_is_array(p)) return parse_ids(p, "prompt", r, err);
    return bad(err, "prompt", "must be a string, a list of one string, or token ids");
}

/* One message's content: a string, null, or a list of {"type": "text", "text": ...} parts. */
static kiln_status message_content(const json_t *c, char **out, serve_error *err) {
    if (!c || json_is_null(c)) return (*out = dupn("", 0)) ? KILN_OK : oom(err);
    if (json_is_string(c)) return (*out = dupn(json_string_value(c), json_string_length(c))) ? KILN_OK : oom(err);
    if (!json_is_array(c)) return bad(err, "messages", "content must be a string or a list of text parts");
    size_t total = 0, i;
    json_t *part;
    json_array_foreach(c, i, part) {
        json_t *t = json_object_get(part, "type"), *x = json_object_get(part, "text");
        if (!json_is_string(t) || strcmp(json_string_value(t), "text") != 0 || !json_is_string(x))
            return unsupported(err, "messages", "content parts other than {\"type\": \"text\"}");
        total += json_string_length(x);
    }
    if (!(*out = malloc(total + 1))) return oom(err);
    size_t at = 0;
    json_array_foreach(c, i, part) {
        json_t *x = json_object_get(part, "text");
        memcpy(*out + at, json_string_value(x), json_string_length(x));
        at += json_string_length(x);
    }
    (*out)[at] = 0;
    return KILN_OK;
}

static kiln_status parse_messages(const json_t *m, serve_request *r, serve_error *err) {
    if (!json_is_array(m) || json_array_size(m) == 0) return bad(err, "messages", "must be a non-empty list");
    size_t n = json_array_size(m);
    if (n > SERVE_MAX_MESSAGES) return bad(err, "messages", "holds too many messages");
    if (!(r->messages = calloc(n, sizeof *r->messages))) return oom(err);
    for (size_t i = 0; i < n; i++) {
        json_t *msg = json_array_get(m, i), *role = json_object_get(msg, "role");
        if (!json_is_object(msg) || !json_is_string(role))
            return bad(err, "messages", "must hold objects with a string 'role'");
        r->n_messages = (int32_t)(i + 1); /* what is allocated so far, for serve_request_free */
        if (!(r->messages[i].role = dupn(json_string_value(role), json_string_length(role)))) return oom(err);
        char *content = NULL;
        kiln_status st = message_content(json_object_get(msg, "content"), &content, err);
        r->messages[i].content = content;
        if (st != KILN_OK) return st;
    }
    return KILN_OK;
}

static kiln_status parse_stop(const json_t *s, serve_request *r, serve_error *err) {
    if (!s || json_is_null(s)) return KILN_OK;
    size_t n = json_is_string(s) ? 1 : json_array_size(s);
    if (!json_is_string(s) && !json_is_array(s)) return bad(err, "stop", "must be a string or a list of strings");
    if (n > SERVE_MAX_STOPS) return bad(err, "stop", "holds more than 16 strings");
    for (size_t i = 0; i < n; i++) {
        json_t *v = json_is_string(s) ? (json_t *)s : json_array_get(s, i);
        if (!json_is_string(v) || json_string_length(v) == 0 || json_string_length(v) > SERVE_MAX_STOP_BYTES ||
            strlen(json_string_value(v)) != json_string_length(v)) /* "\u0000" would make an empty stop */
            return bad(err, "stop", "must hold non-empty strings of at most 256 bytes, without NUL");
        if (!(r->stops[r->n_stops] = dupn(json_string_value(v), json_string_length(v)))) return oom(err);
        r->n_stops++;
    }
    return KILN_OK;
}

/* A number field in [lo, hi]; *out untouched when absent or null. */
static kiln_status get_num(const json_t *o, const char *name, double lo, double hi, double *out, serve_error *err) {
    json_t *v = json_object_get(o, name);
    if (!v || json_is_null(v)) return KILN_OK;
    double d = json_number_value(v);
    if (!json_is_number(v) || !isfinite(d) || d < lo || d > hi) {
        char what[96];
        snprintf(what, sizeof what, "must be a number in [%g, %g]", lo, hi);
        return bad(err, name, what);
    }
    *out = d;
    return KILN_OK;
}

static kiln_status get_bool(const json_t *o, const char *name, bool *out, serve_error *err) {
    json_t *v = json_object_get(o, name);
    if (!v || json_is_null(v)) return KILN_OK;
    if (!json_is_boolean(v)) return bad(err, name, "must be true or false");
    *out = json_is_true(v);
    return KILN_OK;
}

/* Sampling and output fields of completions and chat. */
static kiln_status parse_sampling(const json_t *o, serve_request *r, serve_error *err) {
    double mt = -1, tk = -2, seed = -1;
    kiln_status st;
    const char *mt_name = json_object_get(o, "max_completion_tokens") ? "max_completion_tokens" : "max_tokens";
    if ((st = get_num(o, mt_name, 0, 1 << 24, &mt, err)) || (st = get_num(o, "temperature", 0, 1e6, &r->temperature, err)) ||
        (st = get_num(o, "top_p", 1e-9, 1, &r->top_p, err)) || (st = get_num(o, "top_k", -1, 1 << 24, &tk, err)) ||
        (st = get_num(o, "seed", -9.2e18, 9.2e18, &seed, err)) || (st = get_bool(o, "stream", &r->stream, err)) ||
        (st = get_bool(o, "ignore_eos", &r->ignore_eos, err)) || (st = parse_stop(json_object_get(o, "stop"), r, err)))
        return st;
    if (mt >= 0 && mt != floor(mt)) return bad(err, mt_name, "must be a whole number");
    if (tk > -2 && tk != floor(tk)) return bad(err, "top_k", "must be a whole number");
    r->max_tokens = mt >= 0 ? (int32_t)mt : -1;
    r->top_k_set = tk > -2;
    r->top_k = tk > 0 ? (int32_t)tk : 0;
    json_t *sv = json_object_get(o, "seed");
    if (json_is_integer(sv)) {
        r->seed_set = true;
        r->seed = (uint64_t)json_integer_value(sv);
    } else if (sv && !json_is_null(sv)) {
        return bad(err, "seed", "must be an integer");
    }
    double n = 1, best_of = -1, lp = -1;
    if ((st = get_num(o, "min_p", 0, 1, &r->min_p, err)) ||
        (st = get_num(o, "presence_penalty", -2, 2, &r->presence_penalty, err)) ||
        (st = get_num(o, "frequency_penalty", -2, 2, &r->frequency_penalty, err)) ||
        (st = get_num(o, "repetition_penalty", 1e-6, 10, &r->repetition_penalty, err)) ||
        (st = get_num(o, "n", 1, SERVE_MAX_N, &n, err)) || (st = get_num(o, "best_of", 1, SERVE_MAX_N, &best_of, err)))
        return st;
    if (n != floor(n)) return bad(err, "n", "must be a whole number");
    r->n = (int32_t)n;
    if (best_of >= 0 && best_of != n)
        return unsupported(err, "best_of", "only best_of = n works: kiln does not rank choices");
    if (r->kind == SERVE_KIND_CHAT) {
        bool want = false;
        if ((st = get_bool(o, "logprobs", &want, err)) || (st = get_num(o, "top_logprobs", 0, KILN_MAX_LOGPROBS, &lp, err)))
            return st;
        if (lp >= 0 && !want) return bad(err, "top_logprobs", "needs 'logprobs': true");
        if (want) r->logprobs = lp >= 0 ? (int32_t)lp : 0;
        if (lp >= 0 && lp != floor(lp)) return bad(err, "top_logprobs", "must be a whole number");
    } else {
        json_t *v = json_object_get(o, "logprobs");
        if (json_is_boolean(v)) return bad(err, "logprobs", "must be a number of alternatives (0..20) here");
        if ((st = get_num(o, "logprobs", 0, KILN_MAX_LOGPROBS, &lp, err))) return st;
        if (lp >= 0 && lp != floor(lp)) return bad(err, "logprobs", "must be a whole number");
        if (lp >= 0) r->logprobs = (int32_t)lp;
        if (json_object_get(o, "top_logprobs") && !json_is_null(json_object_get(o, "top_logprobs")))
            return bad(err, "top_logprobs", "belongs to chat; completions take 'logprobs': N");
    }
    json_t *so = json_object_get(o, "stream_options");
    if (so && !json_is_null(so)) {
        if (!json_is_object(so)) return bad(err, "stream_options", "must be an object");
        if ((st = get_bool(so, "include_usage", &r->include_usage, err))) return st;
    }
    return KILN_OK;
}

static kiln_status parse_fields(const json_t *o, serve_kind kind, serve_request *r, serve_error *err) {
    json_t *model = json_object_get(o, "model");
    if (model && !json_is_null(model)) {
        if (!json_is_string(model)) return bad(err, "model", "must be a string");
        if (!(r->model = dupn(json_string_value(model), json_string_length(model)))) return oom(err);
    } else if (kind == SERVE_KIND_COMPLETION || kind == SERVE_KIND_CHAT) {
        return bad(err, "model", "is required");
    }
    json_t *prompt = json_object_get(o, "prompt"), *msgs = json_object_get(o, "messages");
    kiln_status st;
    switch (kind) {
    case SERVE_KIND_COMPLETION:
        if (!prompt) return bad(err, "prompt", "is required");
        if ((st = refuse_unsupported(o, kind, err)) || (st = parse_prompt(prompt, r, err)) ||
            (st = parse_sampling(o, r, err)) || (st = get_bool(o, "echo", &r->echo, err)))
            return st;
        return KILN_OK;
    case SERVE_KIND_CHAT:
        r->add_special = true; /* add_generation_prompt */
        if ((st = refuse_unsupported(o, kind, err)) || (st = parse_messages(msgs, r, err))) return st;
        if ((st = get_bool(o, "add_generation_prompt", &r->add_special, err))) return st;
        return parse_sampling(o, r, err);
    case SERVE_KIND_TOKENIZE:
        r->add_special = true;
        if ((st = get_bool(o, "add_special_tokens", &r->add_special, err))) return st;
        if (msgs) return parse_messages(msgs, r, err);
        if (!json_is_string(prompt)) return bad(err, "prompt", "must be a string (or give 'messages')");
        return parse_prompt(prompt, r, err);
    case SERVE_KIND_DETOKENIZE: {
        json_t *t = json_object_get(o, "tokens");
        if (!json_is_array(t)) return bad(err, "tokens", "must be a list of token ids");
        return parse_ids(t, "tokens", r, err);
    }
    }
    return bad(err, "kind", "is unknown");
}

kiln_status serve_request_parse(const char *body, size_t len, serve_kind kind, serve_request *out, serve_error *err) {
    memset(out, 0, sizeof *out);
    out->kind = kind;
    out->max_tokens = -1;
    out->temperature = -1;
    out->top_p = -1;
    out->top_k = -1;
    out->repetition_penalty = 1;
    out->n = 1;
    out->logprobs = -1;
    json_error_t je;
    json_t *o = json_loadb(body, len, JSON_REJECT_DUPLICATES, &je);
    if (!o)
        return serve_error_set(err, 400, "invalid_request_error", "invalid_json", NULL,
                               "the body is not valid JSON: %s (line %d, column %d); hint: send a JSON object",
                               je.text, je.line, je.column);
    kiln_status st = json_is_object(o) ? parse_fields(o, kind, out, err)
                                       : serve_error_set(err, 400, "invalid_request_error", "invalid_json", NULL,
                                                         "the body must be a JSON object");
    json_decref(o);
    if (st != KILN_OK) serve_request_free(out);
    return st;
}

void serve_request_free(serve_request *r) {
    free(r->model);
    free(r->prompt);
    free(r->prompt_ids);
    for (int32_t i = 0; i < r->n_messages; i++) {
        free((char *)r->messages[i].role);
        free((char *)r->messages[i].content);
    }
    free(r->messages);
    for (int i = 0; i < r->n_stops; i++) free(r->stops[i]);
    memset(r, 0, sizeof *r);
}
