/*
 * chat_template.c — the chat-template lexer and parser: Jinja source → a
 * tree of ct_node statements and ct_expr expressions (chat_internal.h).
 *
 * The lexer follows Jinja's as transformers configures it: trim_blocks and
 * lstrip_blocks on, keep_trailing_newline off (one trailing newline of the
 * source is dropped), "\r\n" and "\r" read as "\n". So:
 *   - `{%- ` / `{{- ` / `{#- ` strip all whitespace before the tag, ` -%}` /
 *     ` -}}` / ` -#}` all whitespace after it (Python's str.strip set);
 *   - trim_blocks: the first "\n" after `%}` or `#}` is dropped;
 *   - lstrip_blocks: spaces and tabs between the start of a line and `{%` or
 *     `{#` are dropped (`{%+` keeps them, `+%}` keeps the newline);
 *   - a tag ends at `}}` / `%}` only outside brackets, as in Jinja.
 * The parser is Jinja's recursive descent with the same precedence (from
 * loosest: `x if c else y`, or, and, not, comparisons and (not) in, + -, ~,
 * * / // %, **, unary - +, then postfix . [] () and filters | and tests is).
 * Names of filters, tests, functions and methods are checked here, so an
 * unsupported one is refused when the template is parsed (at compile time),
 * not at the first request.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chat_internal.h"

/* ---- arena ---- */

struct ct_block {
    ct_block *next;
    size_t used, cap;
    _Alignas(16) unsigned char data[];
};

#define CT_BLOCK_MIN (64u << 10)

void *ct_alloc(ct_arena *a, size_t n) {
    n = (n + 15) & ~(size_t)15;
    if (n == 0) n = 16;
    if (n > a->limit || a->used > a->limit - n) return NULL;
    ct_block *b = a->head;
    if (!b || b->cap - b->used < n) {
        size_t cap = n > CT_BLOCK_MIN ? n : CT_BLOCK_MIN;
        b = malloc(sizeof *b + cap);
        if (!b) return NULL;
        b->used = 0;
        b->cap = cap;
        b->next = a->head;
        a->head = b;
    }
    void *p = b->data + b->used;
    b->used += n;
    a->used += n;
    memset(p, 0, n);
    return p;
}

char *ct_strdup(ct_arena *a, const char *p, size_t n) {
    if (n == SIZE_MAX) return NULL;
    char *s = ct_alloc(a, n + 1);
    if (s && n) memcpy(s, p, n);
    return s;
}

void ct_arena_free(ct_arena *a) {
    for (ct_block *b = a->head, *nx; b; b = nx) {
        nx = b->next;
        free(b);
    }
    a->head = NULL;
    a->used = 0;
}

/* ---- names the interpreter knows (chat_value.c implements them) ---- */

static bool in_list(const char *name, const char *const *list) {
    for (; *list; list++)
        if (strcmp(name, *list) == 0) return true;
    return false;
}

bool ct_known_filter(const char *n) {
    static const char *const l[] = {"length", "count", "trim", "tojson", "string", "upper", "lower", "capitalize",
                                    "first", "last", "join", "default", "d", "list", "reverse", "int", "float",
                                    "abs", "items", "safe", "replace", "escape", "e", "select", "reject",
                                    "selectattr", "rejectattr", "map", NULL};
    return in_list(n, l);
}
bool ct_known_test(const char *n) {
    static const char *const l[] = {"defined", "undefined", "none", "string", "number", "integer", "float",
                                    "boolean", "true", "false", "mapping", "iterable", "sequence", "odd", "even",
                                    "divisibleby", "eq", "equalto", "ne", "lt", "lessthan", "gt", "greaterthan",
                                    "le", "ge", "in", "sameas", "lower", "upper", NULL};
    return in_list(n, l);
}
bool ct_known_function(const char *n) {
    static const char *const l[] = {"raise_exception", "namespace", "range", "dict", "strftime_now", NULL};
    return in_list(n, l);
}
bool ct_known_method(const char *n) {
    static const char *const l[] = {"startswith", "endswith", "split", "strip", "lstrip", "rstrip", "replace",
                                    "upper", "lower", "capitalize", "find", "count", "items", "keys", "values",
                                    "get", NULL};
    return in_list(n, l);
}

/* ---- lexer ---- */

typedef enum ttype { T_DATA, T_VAR_B, T_VAR_E, T_BLOCK_B, T_BLOCK_E, T_NAME, T_INT, T_FLOAT, T_STR, T_OP, T_EOF } ttype;

typedef struct tok {
    ttype t;
    int line;
    const char *p; /* T_DATA, T_NAME, T_STR: arena copy (NUL-terminated); T_OP: the operator's text */
    size_t n;
    int64_t i;
    double f;
} tok;

typedef struct lexer {
    const char *s; /* normalized source */
    size_t len, pos;
    int line;
    ct_arena *a;
    tok *toks;
    size_t n, cap;
    kiln_error *err;
} lexer;

static kiln_status lex_err(lexer *L, int line, kiln_status code, const char *fmt, ...) KILN_PRINTF(4, 5);
static kiln_status lex_err(lexer *L, int line, kiln_status code, const char *fmt, ...) {
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return kiln_err(L->err, code, "chat template: line %d: %s", line, msg);
}

static kiln_status push_tok(lexer *L, tok t) {
    if (L->n == L->cap) {
        size_t cap = L->cap ? L->cap * 2 : 256;
        tok *nt = realloc(L->toks, cap * sizeof *nt);
        if (!nt) return kiln_err(L->err, KILN_ERR_NOMEM, "chat template: out of memory");
        L->toks = nt;
        L->cap = cap;
    }
    L->toks[L->n++] = t;
    return KILN_OK;
}

/* Length of the Python whitespace character at s (0 if none): str.isspace(). */
size_t ct_space_len(const char *s, size_t n);
size_t ct_space_len(const char *s, size_t n) {
    const unsigned char *u = (const unsigned char *)s;
    if (n == 0) return 0;
    if (u[0] == ' ' || (u[0] >= 9 && u[0] <= 13) || (u[0] >= 0x1c && u[0] <= 0x1f)) return 1;
    if (u[0] < 0x80 || n < 2) return 0;
    if (u[0] == 0xC2 && (u[1] == 0x85 || u[1] == 0xA0)) return 2;
    if (n < 3) return 0;
    uint32_t c = ((u[0] & 0x0Fu) << 12) | ((u[1] & 0x3Fu) << 6) | (u[2] & 0x3Fu);
    if ((u[0] & 0xF0) != 0xE0) return 0;
    if (c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F ||
        c == 0x3000)
        return 3;
    return 0;
}

/* Length of the whitespace suffix of s[0..n) (Python's rstrip set). */
static size_t space_suffix(const char *s, size_t n) {
    size_t end = n;
    for (;;) {
        size_t k = 0;
        for (size_t w = 1; w <= 3 && w <= end && !k; w++)
            if (ct_space_len(s + end - w, w) == w) k = w;
        if (!k) break;
        end -= k;
    }
    return n - end;
}

static int count_lines(const char *s, size_t n) {
    int c = 0;
    for (size_t i = 0; i < n; i++) c += s[i] == '\n';
    return c;
}

/* The next `{{`, `{%` or `{#` at or after pos, or len. */
static size_t next_tag(const lexer *L, size_t pos) {
    for (size_t i = pos; i + 1 < L->len; i++)
        if (L->s[i] == '{' && (L->s[i + 1] == '{' || L->s[i + 1] == '%' || L->s[i + 1] == '#')) return i;
    return L->len;
}

static kiln_status emit_data(lexer *L, size_t a, size_t b, int line) {
    if (b <= a) return KILN_OK;
    char *p = ct_strdup(L->a, L->s + a, b - a);
    if (!p) return kiln_err(L->err, KILN_ERR_NOMEM, "chat template: out of memory");
    return push_tok(L, (tok){.t = T_DATA, .line = line, .p = p, .n = b - a});
}

static void put_utf8(kiln_buf *b, uint32_t cp) {
    unsigned char u[4];
    size_t k = cp < 0x80 ? 1 : cp < 0x800 ? 2 : cp < 0x10000 ? 3 : 4;
    if (k == 1) u[0] = (unsigned char)cp;
    else if (k == 2) u[0] = (unsigned char)(0xC0 | cp >> 6), u[1] = (unsigned char)(0x80 | (cp & 0x3F));
    else if (k == 3)
        u[0] = (unsigned char)(0xE0 | cp >> 12), u[1] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F)),
        u[2] = (unsigned char)(0x80 | (cp & 0x3F));
    else
        u[0] = (unsigned char)(0xF0 | cp >> 18), u[1] = (unsigned char)(0x80 | ((cp >> 12) & 0x3F)),
        u[2] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F)), u[3] = (unsigned char)(0x80 | (cp & 0x3F));
    kiln_buf_append(b, u, k);
}

/* \xNN, \uNNNN, \UNNNNNNNN after the backslash at *i (s[*i + 1] = e). */
static kiln_status lex_hex_escape(lexer *L, kiln_buf *b, size_t *i, char e, int line) {
    int digits = e == 'x' ? 2 : e == 'u' ? 4 : 8;
    uint32_t cp = 0;
    for (int d = 0; d < digits; d++) {
        size_t at = *i + 2 + (size_t)d;
        char h = at < L->len ? L->s[at] : 0;
        int v = h >= '0' && h <= '9' ? h - '0' : h >= 'a' && h <= 'f' ? h - 'a' + 10 : h >= 'A' && h <= 'F' ? h - 'A' + 10 : -1;
        if (v < 0) return lex_err(L, line, KILN_ERR_PARSE, "truncated \\%c escape in a string literal", e);
        cp = cp * 16 + (uint32_t)v;
    }
    if (cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
        return lex_err(L, line, KILN_ERR_UNSUPPORTED, "escape \\%c%0*X is not a Unicode scalar value", e, digits, cp);
    put_utf8(b, cp);
    *i += 1 + (size_t)digits;
    return KILN_OK;
}

/* One escape after the backslash at *i; *i ends on its last character. */
static kiln_status lex_escape(lexer *L, kiln_buf *b, size_t *i, int line) {
    char e = L->s[*i + 1];
    static const char from[] = "ntr\\'\"abfv0", to[] = "\n\t\r\\'\"\a\b\f\v";
    const char *k = strchr(from, e);
    if (e && k) {
        kiln_buf_append(b, e == '0' ? "" : &to[k - from], 1);
        *i += 1;
        return KILN_OK;
    }
    if (e == '\n') { /* a backslash-newline continues the line */
        L->line++;
        *i += 1;
        return KILN_OK;
    }
    if (e == 'x' || e == 'u' || e == 'U') return lex_hex_escape(L, b, i, e, line);
    kiln_buf_append(b, "\\", 1); /* an unknown escape keeps its backslash, as in Python */
    return KILN_OK;
}

/* Decode a string literal at L->pos (quote included) with Python's escapes. */
static kiln_status lex_string(lexer *L) {
    char q = L->s[L->pos];
    int line = L->line;
    size_t i = L->pos + 1;
    kiln_buf b = {0};
    kiln_status st = KILN_OK;
    for (; st == KILN_OK; i++) {
        if (i >= L->len) {
            st = lex_err(L, line, KILN_ERR_PARSE, "unterminated string literal");
            break;
        }
        char c = L->s[i];
        if (c == q) break;
        if (c == '\n') L->line++;
        if (c == '\\' && i + 1 < L->len) st = lex_escape(L, &b, &i, line);
        else kiln_buf_append(&b, &c, 1);
    }
    if (st == KILN_OK) {
        char *p = ct_strdup(L->a, b.data ? (const char *)b.data : "", b.len);
        if (!p) st = kiln_err(L->err, KILN_ERR_NOMEM, "chat template: out of memory");
        else st = push_tok(L, (tok){.t = T_STR, .line = line, .p = p, .n = b.len});
        L->pos = i + 1;
    }
    kiln_buf_free(&b);
    return st;
}

static bool is_digit(char c) { return c >= '0' && c <= '9'; }
static bool is_name0(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }

static kiln_status lex_number(lexer *L) {
    size_t i = L->pos;
    char buf[128];
    size_t n = 0;
    bool is_float = false;
    while (i < L->len && (is_digit(L->s[i]) || L->s[i] == '_')) {
        if (L->s[i] != '_' && n < sizeof buf - 8) buf[n++] = L->s[i];
        i++;
    }
    if (i + 1 < L->len && L->s[i] == '.' && is_digit(L->s[i + 1])) {
        is_float = true;
        buf[n++] = L->s[i++];
        while (i < L->len && (is_digit(L->s[i]) || L->s[i] == '_')) {
            if (L->s[i] != '_' && n < sizeof buf - 8) buf[n++] = L->s[i];
            i++;
        }
    }
    if (i < L->len && (L->s[i] == 'e' || L->s[i] == 'E')) {
        size_t j = i + 1;
        if (j < L->len && (L->s[j] == '+' || L->s[j] == '-')) j++;
        if (j < L->len && is_digit(L->s[j])) {
            is_float = true;
            for (size_t k = i; k < j && n < sizeof buf - 2; k++) buf[n++] = L->s[k];
            i = j;
            while (i < L->len && (is_digit(L->s[i]) || L->s[i] == '_')) {
                if (L->s[i] != '_' && n < sizeof buf - 2) buf[n++] = L->s[i];
                i++;
            }
        }
    }
    buf[n] = 0;
    tok t = {.t = is_float ? T_FLOAT : T_INT, .line = L->line, .p = L->s + L->pos, .n = i - L->pos};
    errno = 0;
    if (is_float) t.f = strtod(buf, NULL);
    else {
        long long v = strtoll(buf, NULL, 10);
        if (errno == ERANGE || n >= sizeof buf - 8)
            return lex_err(L, L->line, KILN_ERR_UNSUPPORTED, "integer literal '%.*s' does not fit 64 bits",
                           (int)(i - L->pos > 40 ? 40 : i - L->pos), L->s + L->pos);
        t.i = v;
    }
    L->pos = i;
    return push_tok(L, t);
}

static const char *const ops2[] = {"**", "//", "==", "!=", "<=", ">=", NULL};
static const char ops1[] = "+-*/%~<>()[]{},.:|=";

/* Tokens of one `{{ }}` / `{% %}` tag up to its end marker (outside brackets). */
static kiln_status lex_tag(lexer *L, bool block, bool *strip_after, bool *keep_nl, int open_line) {
    int depth = 0;
    for (;;) {
        while (L->pos < L->len && strchr(" \t\n\r\f\v", L->s[L->pos])) L->line += L->s[L->pos++] == '\n';
        if (L->pos >= L->len)
            return lex_err(L, open_line, KILN_ERR_PARSE, "'%s' is never closed", block ? "{%" : "{{");
        const char *p = L->s + L->pos;
        size_t left = L->len - L->pos;
        const char *end = block ? "%}" : "}}";
        if (depth == 0) {
            bool minus = left >= 3 && p[0] == '-' && memcmp(p + 1, end, 2) == 0;
            bool plus = block && left >= 3 && p[0] == '+' && memcmp(p + 1, end, 2) == 0;
            if (minus || plus || (left >= 2 && memcmp(p, end, 2) == 0)) {
                *strip_after = minus;
                *keep_nl = plus;
                L->pos += minus || plus ? 3 : 2;
                return push_tok(L, (tok){.t = block ? T_BLOCK_E : T_VAR_E, .line = L->line});
            }
        }
        kiln_status st;
        if (*p == '\'' || *p == '"') st = lex_string(L);
        else if (is_digit(*p)) st = lex_number(L);
        else if (is_name0(*p)) {
            size_t i = L->pos;
            while (i < L->len && (is_name0(L->s[i]) || is_digit(L->s[i]))) i++;
            char *name = ct_strdup(L->a, p, i - L->pos);
            if (!name) return kiln_err(L->err, KILN_ERR_NOMEM, "chat template: out of memory");
            st = push_tok(L, (tok){.t = T_NAME, .line = L->line, .p = name, .n = i - L->pos});
            L->pos = i;
        } else {
            size_t n = 0;
            for (int k = 0; ops2[k] && !n; k++)
                if (left >= 2 && memcmp(p, ops2[k], 2) == 0) n = 2;
            if (!n && strchr(ops1, *p) && *p) n = 1;
            if (!n) {
                unsigned char c = (unsigned char)*p;
                return lex_err(L, L->line, KILN_ERR_PARSE, c >= 0x20 && c < 0x7f ? "unexpected character '%c'" : "unexpected byte 0x%02X", c);
            }
            if (n == 1 && strchr("([{", *p)) depth++;
            if (n == 1 && strchr(")]}", *p)) {
                if (depth == 0) return lex_err(L, L->line, KILN_ERR_PARSE, "unbalanced '%c'", *p);
                depth--;
            }
            st = push_tok(L, (tok){.t = T_OP, .line = L->line, .p = p, .n = n});
            L->pos += n;
        }
        if (st != KILN_OK) return st;
    }
}

/* The data before a tag, with the whitespace rules applied. */
static kiln_status lex_data(lexer *L, size_t q, bool strip_before, bool trim_nl, bool lstrip_start) {
    size_t a = L->pos, b = q;
    int line = L->line;
    if (strip_before) {
        size_t k;
        while (a < b && (k = ct_space_len(L->s + a, b - a)) > 0) a += k;
    } else if (trim_nl && a < b && L->s[a] == '\n') {
        a++;
    }
    if (q < L->len) {
        char c2 = q + 2 < L->len ? L->s[q + 2] : 0;
        if (c2 == '-') {
            b -= space_suffix(L->s + a, b - a);
        } else if (c2 != '+' && L->s[q + 1] != '{' && lstrip_start) {
            size_t ls = b;
            while (ls > a && (L->s[ls - 1] == ' ' || L->s[ls - 1] == '\t')) ls--;
            bool at_line_start = ls > a ? L->s[ls - 1] == '\n' : (ls == 0 || L->s[ls - 1] == '\n');
            if (at_line_start) b = ls;
        }
    }
    L->line += count_lines(L->s + L->pos, q - L->pos);
    return emit_data(L, a, b, line + count_lines(L->s + L->pos, a - L->pos));
}

static kiln_status lex_all(lexer *L) {
    bool strip_next = false, trim_nl = false;
    while (L->pos < L->len) {
        size_t q = next_tag(L, L->pos);
        kiln_status st = lex_data(L, q, strip_next, trim_nl, true);
        if (st != KILN_OK) return st;
        strip_next = trim_nl = false;
        if (q >= L->len) break;
        char kind = L->s[q + 1];
        int open_line = L->line;
        size_t body = q + 2 + (q + 2 < L->len && (L->s[q + 2] == '-' || L->s[q + 2] == '+'));
        if (kind == '#') {
            const char *e = NULL;
            for (size_t i = body; i + 1 < L->len && !e; i++)
                if (L->s[i] == '#' && L->s[i + 1] == '}') e = L->s + i;
            if (!e) return lex_err(L, open_line, KILN_ERR_PARSE, "comment '{#' is never closed");
            size_t ei = (size_t)(e - L->s);
            strip_next = ei > body && L->s[ei - 1] == '-';
            trim_nl = !strip_next && !(ei > body && L->s[ei - 1] == '+');
            L->line += count_lines(L->s + q, ei + 2 - q);
            L->pos = ei + 2;
            continue;
        }
        bool block = kind == '%', keep_nl = false;
        if ((st = push_tok(L, (tok){.t = block ? T_BLOCK_B : T_VAR_B, .line = open_line})) != KILN_OK) return st;
        L->pos = body;
        if ((st = lex_tag(L, block, &strip_next, &keep_nl, open_line)) != KILN_OK) return st;
        trim_nl = block && !strip_next && !keep_nl;
    }
    return push_tok(L, (tok){.t = T_EOF, .line = L->line});
}

/* ---- parser ---- */

typedef struct parser {
    tok *t;
    size_t i, n;
    ct_arena *a;
    kiln_error *err;
    int depth;
} parser;

#define PERR(P, line, code, ...) (perr_((P), (line), (code), __VA_ARGS__), (void *)0)
static void perr_(parser *P, int line, kiln_status code, const char *fmt, ...) KILN_PRINTF(4, 5);
static void perr_(parser *P, int line, kiln_status code, const char *fmt, ...) {
    if (P->err->code != KILN_OK) return; /* keep the first error */
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    kiln_err(P->err, code, "chat template: line %d: %s", line, msg);
}

static tok *cur(parser *P) { return &P->t[P->i]; }
static bool is_op(const tok *t, const char *op) { return t->t == T_OP && t->n == strlen(op) && memcmp(t->p, op, t->n) == 0; }
static bool is_name(const tok *t, const char *name) { return t->t == T_NAME && strcmp(t->p, name) == 0; }
static bool accept_op(parser *P, const char *op) {
    if (!is_op(cur(P), op)) return false;
    P->i++;
    return true;
}
static bool accept_name(parser *P, const char *name) {
    if (!is_name(cur(P), name)) return false;
    P->i++;
    return true;
}
static const char *tok_text(const tok *t, char *buf, size_t cap) {
    switch (t->t) {
    case T_EOF: return "the end of the template";
    case T_VAR_E: return "'}}'";
    case T_BLOCK_E: return "'%}'";
    case T_DATA: return "text";
    default: snprintf(buf, cap, "'%.*s'", (int)(t->n > 40 ? 40 : t->n), t->p); return buf;
    }
}
static bool expect_op(parser *P, const char *op) {
    if (accept_op(P, op)) return true;
    char b[64];
    perr_(P, cur(P)->line, KILN_ERR_PARSE, "expected '%s', found %s", op, tok_text(cur(P), b, sizeof b));
    return false;
}

static int edepth(const ct_expr *e) { return e ? e->depth : 0; }

/* Set e->depth from its operands; refuse chains too deep to evaluate. */
static ct_expr *sized(parser *P, ct_expr *e) {
    if (!e) return NULL;
    int d = edepth(e->a);
    if (edepth(e->b) > d) d = edepth(e->b);
    if (edepth(e->c) > d) d = edepth(e->c);
    for (int i = 0; i < e->n_args; i++)
        if (edepth(e->args[i]) > d) d = edepth(e->args[i]);
    e->depth = d + 1;
    if (e->depth > CT_MAX_EXPR_DEPTH)
        return PERR(P, e->line, KILN_ERR_UNSUPPORTED, "expression nested deeper than %d", CT_MAX_EXPR_DEPTH);
    return e;
}

static ct_expr *new_expr(parser *P, ct_ekind k, int line) {
    ct_expr *e = ct_alloc(P->a, sizeof *e);
    if (!e) return PERR(P, line, KILN_ERR_NOMEM, "out of memory");
    e->k = k;
    e->line = line;
    return e;
}

static ct_expr *parse_expr(parser *P);
static ct_expr *parse_or(parser *P);
static ct_expr *parse_unary(parser *P, bool with_filter);
static ct_expr *parse_primary(parser *P);

/* Arguments of a call/filter/test after its '(' : positional and name=value. */
static bool parse_args(parser *P, ct_expr *e) {
    ct_expr *args[32];
    const char *kw[32];
    int n = 0;
    while (!accept_op(P, ")")) {
        if (n && !expect_op(P, ",")) return false;
        if (accept_op(P, ")")) break;
        if (n == 32) return perr_(P, cur(P)->line, KILN_ERR_UNSUPPORTED, "more than 32 arguments"), false;
        if (is_op(cur(P), "*") || is_op(cur(P), "**"))
            return perr_(P, cur(P)->line, KILN_ERR_UNSUPPORTED, "*args and **kwargs are not supported"), false;
        kw[n] = NULL;
        if (cur(P)->t == T_NAME && is_op(&P->t[P->i + 1], "=")) {
            kw[n] = cur(P)->p;
            P->i += 2;
        }
        if (!(args[n++] = parse_expr(P))) return false;
    }
    e->n_args = n;
    e->args = ct_alloc(P->a, sizeof *e->args * (size_t)(n ? n : 1));
    e->kw = ct_alloc(P->a, sizeof *e->kw * (size_t)(n ? n : 1));
    if (!e->args || !e->kw) return perr_(P, e->line, KILN_ERR_NOMEM, "out of memory"), false;
    memcpy(e->args, args, sizeof *args * (size_t)n);
    memcpy(e->kw, kw, sizeof *kw * (size_t)n);
    return true;
}

static ct_expr *parse_call(parser *P, ct_expr *callee) {
    int line = cur(P)->line;
    ct_expr *e;
    if (callee->k == E_NAME) {
        if (!ct_known_function(callee->name))
            return PERR(P, line, KILN_ERR_UNSUPPORTED, "function '%s' is not supported", callee->name);
        if (!(e = new_expr(P, E_CALL, line))) return NULL;
        e->name = callee->name;
    } else if (callee->k == E_ATTR) {
        if (!ct_known_method(callee->name))
            return PERR(P, line, KILN_ERR_UNSUPPORTED, "method '%s' is not supported", callee->name);
        if (!(e = new_expr(P, E_METHOD, line))) return NULL;
        e->name = callee->name;
        e->a = callee->a;
    } else {
        return PERR(P, line, KILN_ERR_UNSUPPORTED, "only named functions and methods can be called");
    }
    return parse_args(P, e) ? sized(P, e) : NULL;
}

/* [a], [a:b], [a:b:c], .name, .0 */
static ct_expr *parse_subscript(parser *P, ct_expr *obj) {
    int line = cur(P)->line;
    if (accept_op(P, ".")) {
        tok *t = cur(P);
        ct_expr *e;
        if (t->t == T_NAME) {
            if (!(e = new_expr(P, E_ATTR, line))) return NULL;
            e->name = t->p;
        } else if (t->t == T_INT) {
            if (!(e = new_expr(P, E_ITEM, line)) || !(e->b = new_expr(P, E_LIT, line))) return NULL;
            e->b->lit = jv_int(t->i);
        } else {
            char b[64];
            return PERR(P, line, KILN_ERR_PARSE, "expected a name after '.', found %s", tok_text(t, b, sizeof b));
        }
        P->i++;
        e->a = obj;
        return sized(P, e);
    }
    P->i++; /* '[' */
    ct_expr *parts[3] = {NULL, NULL, NULL};
    int k = 0;
    bool slice = false;
    for (;;) {
        if (!is_op(cur(P), ":") && !is_op(cur(P), "]") && !(parts[k] = parse_expr(P))) return NULL;
        if (accept_op(P, ":")) {
            slice = true;
            if (++k == 3) return PERR(P, line, KILN_ERR_PARSE, "a slice has at most three parts");
            continue;
        }
        if (is_op(cur(P), ",")) return PERR(P, line, KILN_ERR_UNSUPPORTED, "tuple subscripts are not supported");
        if (!expect_op(P, "]")) return NULL;
        break;
    }
    ct_expr *e = new_expr(P, slice ? E_SLICE : E_ITEM, line);
    if (!e) return NULL;
    e->a = obj;
    if (!slice) {
        if (!parts[0]) return PERR(P, line, KILN_ERR_PARSE, "empty subscript");
        e->b = parts[0];
        return sized(P, e);
    }
    e->b = parts[0];
    e->c = parts[1];
    e->n_args = 1;
    e->args = ct_alloc(P->a, sizeof *e->args);
    if (!e->args) return PERR(P, line, KILN_ERR_NOMEM, "out of memory");
    e->args[0] = parts[2];
    return sized(P, e);
}

static ct_expr *parse_postfix(parser *P, ct_expr *e) {
    while (e) {
        if (is_op(cur(P), ".") || is_op(cur(P), "[")) e = parse_subscript(P, e);
        else if (accept_op(P, "(")) e = parse_call(P, e);
        else break;
    }
    return e;
}

static ct_expr *parse_filter(parser *P, ct_expr *v) {
    int line = cur(P)->line;
    tok *t = cur(P);
    if (t->t != T_NAME) return PERR(P, line, KILN_ERR_PARSE, "expected a filter name after '|'");
    if (!ct_known_filter(t->p)) return PERR(P, line, KILN_ERR_UNSUPPORTED, "filter '%s' is not supported", t->p);
    P->i++;
    if (is_op(cur(P), ".")) return PERR(P, line, KILN_ERR_UNSUPPORTED, "dotted filter names are not supported");
    ct_expr *e = new_expr(P, E_FILTER, line);
    if (!e) return NULL;
    e->name = t->p;
    e->a = v;
    if (accept_op(P, "(") && !parse_args(P, e)) return NULL;
    /* select('test'), selectattr('x', 'test'), map('filter'): check a literal name now */
    bool sel = !strcmp(e->name, "select") || !strcmp(e->name, "reject");
    bool attr = !strcmp(e->name, "selectattr") || !strcmp(e->name, "rejectattr");
    int at = sel ? 0 : attr ? 1 : !strcmp(e->name, "map") ? 0 : -1;
    if (at >= 0 && at < e->n_args && !e->kw[at] && e->args[at]->k == E_LIT && e->args[at]->lit.k == V_STR) {
        const char *n = e->args[at]->lit.s;
        if (at == 0 && !sel ? !ct_known_filter(n) : !ct_known_test(n))
            return PERR(P, line, KILN_ERR_UNSUPPORTED, "%s '%s' is not supported", sel || attr ? "test" : "filter", n);
    }
    return sized(P, e);
}

static ct_expr *parse_test(parser *P, ct_expr *v) {
    int line = cur(P)->line;
    bool neg = accept_name(P, "not");
    tok *t = cur(P);
    if (t->t != T_NAME) return PERR(P, line, KILN_ERR_PARSE, "expected a test name after 'is'");
    if (!ct_known_test(t->p)) return PERR(P, line, KILN_ERR_UNSUPPORTED, "test '%s' is not supported", t->p);
    P->i++;
    ct_expr *e = new_expr(P, E_TEST, line);
    if (!e) return NULL;
    e->name = t->p;
    e->a = v;
    e->op = neg;
    tok *c = cur(P);
    if (accept_op(P, "(")) {
        if (!parse_args(P, e)) return NULL;
    } else if ((c->t == T_NAME || c->t == T_STR || c->t == T_INT || c->t == T_FLOAT || is_op(c, "(") ||
                is_op(c, "[") || is_op(c, "{")) &&
               !is_name(c, "else") && !is_name(c, "or") && !is_name(c, "and")) {
        if (is_name(c, "is")) return PERR(P, line, KILN_ERR_PARSE, "tests cannot be chained with 'is'");
        ct_expr *arg = parse_postfix(P, parse_primary(P));
        if (!arg) return NULL;
        e->args = ct_alloc(P->a, sizeof *e->args);
        e->kw = ct_alloc(P->a, sizeof *e->kw);
        if (!e->args || !e->kw) return PERR(P, line, KILN_ERR_NOMEM, "out of memory");
        e->args[0] = arg;
        e->n_args = 1;
    }
    return sized(P, e);
}

static ct_expr *parse_filter_expr(parser *P, ct_expr *e) {
    while (e) {
        if (accept_op(P, "|")) e = parse_filter(P, e);
        else if (accept_name(P, "is")) e = parse_test(P, e);
        else if (accept_op(P, "(")) e = parse_call(P, e);
        else break;
    }
    return e;
}

static ct_expr *parse_seq(parser *P, ct_ekind k, const char *close, int line) {
    ct_expr *e = new_expr(P, k, line);
    if (!e) return NULL;
    ct_expr **items = NULL;
    int n = 0, cap = 0;
    while (!accept_op(P, close)) {
        if (n && !expect_op(P, ",")) return NULL;
        if (accept_op(P, close)) break;
        if (n + 2 > cap) {
            int nc = cap ? cap * 2 : 8;
            ct_expr **ni = ct_alloc(P->a, sizeof *ni * (size_t)nc);
            if (!ni) return PERR(P, line, KILN_ERR_NOMEM, "out of memory");
            if (n) memcpy(ni, items, sizeof *ni * (size_t)n);
            items = ni;
            cap = nc;
        }
        if (!(items[n++] = parse_expr(P))) return NULL;
        if (k == E_DICT && (!expect_op(P, ":") || !(items[n++] = parse_expr(P)))) return NULL;
    }
    e->args = items;
    e->n_args = n;
    return sized(P, e);
}

static ct_expr *parse_primary(parser *P) {
    tok *t = cur(P);
    int line = t->line;
    ct_expr *e;
    if (t->t == T_NAME) {
        P->i++;
        const char *n = t->p;
        if (!(e = new_expr(P, E_LIT, line))) return NULL;
        if (!strcmp(n, "true") || !strcmp(n, "True")) e->lit = jv_bool(true);
        else if (!strcmp(n, "false") || !strcmp(n, "False")) e->lit = jv_bool(false);
        else if (!strcmp(n, "none") || !strcmp(n, "None")) e->lit = jv_none();
        else {
            e->k = E_NAME;
            e->name = n;
        }
        return e;
    }
    if (t->t == T_STR) {
        if (!(e = new_expr(P, E_LIT, line))) return NULL;
        e->lit = jv_str(t->p, t->n);
        P->i++;
        if (cur(P)->t == T_STR) { /* adjacent literals concatenate */
            kiln_buf b = {0};
            kiln_buf_append(&b, t->p, t->n);
            while (cur(P)->t == T_STR) kiln_buf_append(&b, cur(P)->p, cur(P)->n), P->i++;
            char *s = ct_strdup(P->a, b.data ? (const char *)b.data : "", b.len);
            e->lit = jv_str(s, b.len);
            kiln_buf_free(&b);
            if (!s) return PERR(P, line, KILN_ERR_NOMEM, "out of memory");
        }
        return e;
    }
    if (t->t == T_INT || t->t == T_FLOAT) {
        if (!(e = new_expr(P, E_LIT, line))) return NULL;
        e->lit = t->t == T_INT ? jv_int(t->i) : jv_float(t->f);
        P->i++;
        return e;
    }
    if (accept_op(P, "(")) {
        if (accept_op(P, ")")) return PERR(P, line, KILN_ERR_UNSUPPORTED, "empty tuples are not supported");
        size_t at = P->i;
        e = parse_expr(P);
        if (e && is_op(cur(P), ",")) { /* a tuple: kiln makes it a list (startswith(('a', 'b'))) */
            P->i = at;
            return parse_seq(P, E_LIST, ")", line);
        }
        return e && expect_op(P, ")") ? e : NULL;
    }
    if (accept_op(P, "[")) return parse_seq(P, E_LIST, "]", line);
    if (accept_op(P, "{")) return parse_seq(P, E_DICT, "}", line);
    char b[64];
    return PERR(P, line, KILN_ERR_PARSE, "unexpected %s in an expression", tok_text(t, b, sizeof b));
}

static ct_expr *parse_unary(parser *P, bool with_filter) {
    int line = cur(P)->line;
    ct_expr *e;
    if (++P->depth > KILN_CHAT_MAX_DEPTH)
        return PERR(P, line, KILN_ERR_UNSUPPORTED, "expression nested deeper than %d", KILN_CHAT_MAX_DEPTH);
    if (is_op(cur(P), "-") || is_op(cur(P), "+")) {
        bool neg = is_op(cur(P), "-");
        P->i++;
        if ((e = new_expr(P, neg ? E_NEG : E_POS, line)) && !(e->a = parse_unary(P, false))) e = NULL;
        e = sized(P, e);
    } else {
        e = parse_primary(P);
    }
    e = parse_postfix(P, e);
    if (with_filter) e = parse_filter_expr(P, e);
    P->depth--;
    return e;
}

static ct_expr *binary(parser *P, ct_ekind k, int op, ct_expr *a, ct_expr *b, int line) {
    if (!a || !b) return NULL;
    ct_expr *e = new_expr(P, k, line);
    if (!e) return NULL;
    e->op = op;
    e->a = a;
    e->b = b;
    return sized(P, e);
}

static ct_expr *parse_pow(parser *P) {
    ct_expr *e = parse_unary(P, true);
    while (e && is_op(cur(P), "**")) {
        int line = cur(P)->line;
        P->i++;
        e = binary(P, E_BIN, OP_POW, e, parse_unary(P, true), line);
    }
    return e;
}

static ct_expr *parse_math2(parser *P) {
    ct_expr *e = parse_pow(P);
    for (;;) {
        int op = is_op(cur(P), "*") ? OP_MUL : is_op(cur(P), "/") ? OP_DIV : is_op(cur(P), "//") ? OP_FLOORDIV
                 : is_op(cur(P), "%") ? OP_MOD : -1;
        if (!e || op < 0) return e;
        int line = cur(P)->line;
        P->i++;
        e = binary(P, E_BIN, op, e, parse_pow(P), line);
    }
}

static ct_expr *parse_concat(parser *P) {
    ct_expr *e = parse_math2(P);
    while (e && is_op(cur(P), "~")) {
        int line = cur(P)->line;
        P->i++;
        e = binary(P, E_BIN, OP_CONCAT, e, parse_math2(P), line);
    }
    return e;
}

static ct_expr *parse_math1(parser *P) {
    ct_expr *e = parse_concat(P);
    while (e && (is_op(cur(P), "+") || is_op(cur(P), "-"))) {
        int line = cur(P)->line, op = is_op(cur(P), "+") ? OP_ADD : OP_SUB;
        P->i++;
        e = binary(P, E_BIN, op, e, parse_concat(P), line);
    }
    return e;
}

static ct_expr *parse_compare(parser *P) {
    ct_expr *e = parse_math1(P);
    for (;;) {
        tok *t = cur(P);
        int line = t->line, op = -1;
        if (is_op(t, "==")) op = OP_EQ;
        else if (is_op(t, "!=")) op = OP_NE;
        else if (is_op(t, "<")) op = OP_LT;
        else if (is_op(t, "<=")) op = OP_LE;
        else if (is_op(t, ">")) op = OP_GT;
        else if (is_op(t, ">=")) op = OP_GE;
        else if (is_name(t, "in")) op = OP_IN;
        else if (is_name(t, "not") && is_name(&P->t[P->i + 1], "in")) {
            op = OP_NOTIN;
            P->i++;
        }
        if (!e || op < 0) return e;
        P->i++;
        /* a chain a < b < c is (a < b) and (b < c) in Jinja; kiln takes one comparison at a time */
        ct_expr *r = parse_math1(P);
        if (r && (is_op(cur(P), "==") || is_op(cur(P), "!=") || is_op(cur(P), "<") || is_op(cur(P), "<=") ||
                  is_op(cur(P), ">") || is_op(cur(P), ">=")))
            return PERR(P, line, KILN_ERR_UNSUPPORTED, "chained comparisons are not supported");
        e = binary(P, E_CMP, op, e, r, line);
    }
}

static ct_expr *parse_not(parser *P) {
    int line = cur(P)->line;
    if (accept_name(P, "not")) {
        if (++P->depth > KILN_CHAT_MAX_DEPTH)
            return PERR(P, line, KILN_ERR_UNSUPPORTED, "expression nested deeper than %d", KILN_CHAT_MAX_DEPTH);
        ct_expr *e = new_expr(P, E_NOT, line);
        if (e && !(e->a = parse_not(P))) e = NULL;
        e = sized(P, e);
        P->depth--;
        return e;
    }
    return parse_compare(P);
}

static ct_expr *parse_and(parser *P) {
    ct_expr *e = parse_not(P);
    while (e && is_name(cur(P), "and")) {
        int line = cur(P)->line;
        P->i++;
        e = binary(P, E_AND, 0, e, parse_not(P), line);
    }
    return e;
}

static ct_expr *parse_or(parser *P) {
    ct_expr *e = parse_and(P);
    while (e && is_name(cur(P), "or")) {
        int line = cur(P)->line;
        P->i++;
        e = binary(P, E_OR, 0, e, parse_and(P), line);
    }
    return e;
}

/* x if c else y (else optional: undefined) */
static ct_expr *parse_expr(parser *P) {
    int line = cur(P)->line;
    if (++P->depth > KILN_CHAT_MAX_DEPTH)
        return PERR(P, line, KILN_ERR_UNSUPPORTED, "expression nested deeper than %d", KILN_CHAT_MAX_DEPTH);
    ct_expr *e = parse_or(P);
    while (e && is_name(cur(P), "if")) {
        line = cur(P)->line;
        P->i++;
        ct_expr *c = new_expr(P, E_COND, line);
        if (!c || !(c->b = parse_or(P))) return NULL;
        c->a = e;
        if (accept_name(P, "else") && !(c->c = parse_expr(P))) return NULL;
        e = sized(P, c);
    }
    P->depth--;
    return e;
}

/* ---- statements ---- */

static ct_node *new_node(parser *P, ct_skind k, int line) {
    ct_node *n = ct_alloc(P->a, sizeof *n);
    if (!n) return PERR(P, line, KILN_ERR_NOMEM, "out of memory");
    n->k = k;
    n->line = line;
    return n;
}

static bool expect_block_end(parser *P, const char *tag) {
    if (cur(P)->t == T_BLOCK_E) {
        P->i++;
        return true;
    }
    char b[64];
    perr_(P, cur(P)->line, KILN_ERR_PARSE, "expected '%%}' to end '%s', found %s", tag, tok_text(cur(P), b, sizeof b));
    return false;
}

static bool parse_body(parser *P, const char *const *stops, ct_node **out, const char **stopped);

static const char *const unsupported_tags[] = {"macro", "call", "filter", "include", "import", "from", "extends",
                                               "block", "raw", "with", "autoescape", "do", "trans", NULL};

static ct_node *parse_if(parser *P, int line) {
    ct_node *n = new_node(P, S_IF, line);
    if (!n || !(n->e = parse_expr(P)) || !expect_block_end(P, "if")) return NULL;
    static const char *const stops[] = {"elif", "else", "endif", NULL};
    const char *stop;
    if (!parse_body(P, stops, &n->body, &stop)) return NULL;
    if (!strcmp(stop, "elif")) {
        if (!(n->orelse = parse_if(P, cur(P)->line))) return NULL;
        return n;
    }
    if (!strcmp(stop, "else")) {
        static const char *const end[] = {"endif", NULL};
        if (!expect_block_end(P, "else") || !parse_body(P, end, &n->orelse, &stop)) return NULL;
    }
    return expect_block_end(P, "endif") ? n : NULL;
}

static ct_node *parse_for(parser *P, int line) {
    ct_node *n = new_node(P, S_FOR, line);
    if (!n) return NULL;
    do {
        if (cur(P)->t != T_NAME) return PERR(P, line, KILN_ERR_PARSE, "expected a loop variable after 'for'");
        if (n->n_target == CT_MAX_TARGETS)
            return PERR(P, line, KILN_ERR_UNSUPPORTED, "more than %d loop variables", CT_MAX_TARGETS);
        n->target[n->n_target++] = cur(P)->p;
        P->i++;
    } while (accept_op(P, ","));
    if (!accept_name(P, "in")) return PERR(P, line, KILN_ERR_PARSE, "expected 'in' in a for loop");
    if (!(n->e = parse_or(P))) return NULL; /* parse_or: the `if` here filters the loop */
    if (accept_name(P, "if") && !(n->filter = parse_expr(P))) return NULL;
    if (is_name(cur(P), "recursive")) return PERR(P, line, KILN_ERR_UNSUPPORTED, "recursive loops are not supported");
    if (!expect_block_end(P, "for")) return NULL;
    static const char *const stops[] = {"else", "endfor", NULL};
    const char *stop;
    if (!parse_body(P, stops, &n->body, &stop)) return NULL;
    if (!strcmp(stop, "else")) {
        static const char *const end[] = {"endfor", NULL};
        if (!expect_block_end(P, "else") || !parse_body(P, end, &n->orelse, &stop)) return NULL;
    }
    return expect_block_end(P, "endfor") ? n : NULL;
}

static ct_node *parse_set(parser *P, int line) {
    ct_node *n = new_node(P, S_SET, line);
    if (!n) return NULL;
    if (cur(P)->t != T_NAME) return PERR(P, line, KILN_ERR_PARSE, "expected a variable name after 'set'");
    n->target[0] = cur(P)->p;
    n->n_target = 1;
    P->i++;
    if (accept_op(P, ".")) {
        if (cur(P)->t != T_NAME) return PERR(P, line, KILN_ERR_PARSE, "expected an attribute name after '.'");
        n->k = S_SETATTR;
        n->target[1] = cur(P)->p;
        n->n_target = 2;
        P->i++;
    }
    if (is_op(cur(P), ",")) return PERR(P, line, KILN_ERR_UNSUPPORTED, "set with several targets is not supported");
    if (accept_op(P, "=")) {
        if (!(n->e = parse_expr(P))) return NULL;
        if (is_op(cur(P), ",")) return PERR(P, line, KILN_ERR_UNSUPPORTED, "tuples are not supported");
        return expect_block_end(P, "set") ? n : NULL;
    }
    if (n->k == S_SETATTR) return PERR(P, line, KILN_ERR_PARSE, "expected '=' after 'set %s.%s'", n->target[0], n->target[1]);
    if (is_op(cur(P), "|")) return PERR(P, line, KILN_ERR_UNSUPPORTED, "filters on a block set are not supported");
    n->k = S_SETBLOCK;
    static const char *const end[] = {"endset", NULL};
    const char *stop;
    if (!expect_block_end(P, "set") || !parse_body(P, end, &n->body, &stop)) return NULL;
    return expect_block_end(P, "endset") ? n : NULL;
}

static ct_node *parse_statement(parser *P) {
    tok *t = cur(P);
    int line = t->line;
    if (t->t != T_NAME) return PERR(P, line, KILN_ERR_PARSE, "expected a tag name after '{%%'");
    P->i++;
    if (!strcmp(t->p, "if")) return parse_if(P, line);
    if (!strcmp(t->p, "for")) return parse_for(P, line);
    if (!strcmp(t->p, "set")) return parse_set(P, line);
    if (!strcmp(t->p, "break") || !strcmp(t->p, "continue")) {
        ct_node *n = new_node(P, t->p[0] == 'b' ? S_BREAK : S_CONTINUE, line);
        return n && expect_block_end(P, t->p) ? n : NULL;
    }
    if (!strcmp(t->p, "generation")) { /* transformers' assistant-mask marker: renders its body */
        ct_node *n = new_node(P, S_BLOCK, line);
        static const char *const end[] = {"endgeneration", NULL};
        const char *stop;
        if (!n || !expect_block_end(P, "generation") || !parse_body(P, end, &n->body, &stop)) return NULL;
        return expect_block_end(P, "endgeneration") ? n : NULL;
    }
    for (int i = 0; unsupported_tags[i]; i++)
        if (!strcmp(t->p, unsupported_tags[i])) return PERR(P, line, KILN_ERR_UNSUPPORTED, "tag '%s' is not supported", t->p);
    return PERR(P, line, KILN_ERR_PARSE, "unknown tag '%s'", t->p);
}

/* Nodes until EOF (stops NULL) or a `{% stop %}` tag (consumed up to its name). */
static bool parse_body(parser *P, const char *const *stops, ct_node **out, const char **stopped) {
    ct_node head = {0}, *tail = &head;
    int open_line = cur(P)->line;
    if (++P->depth > KILN_CHAT_MAX_DEPTH)
        return perr_(P, open_line, KILN_ERR_UNSUPPORTED, "blocks nested deeper than %d", KILN_CHAT_MAX_DEPTH), false;
    for (;;) {
        tok *t = cur(P);
        ct_node *n = NULL;
        if (t->t == T_EOF) {
            if (stops) {
                const char *last = stops[0];
                for (int k = 0; stops[k]; k++) last = stops[k];
                return perr_(P, t->line, KILN_ERR_PARSE, "missing '{%% %s %%}' (block opened on line %d)", last,
                             open_line), false;
            }
            break;
        }
        if (t->t == T_DATA) {
            if ((n = new_node(P, S_TEXT, t->line))) n->text = t->p, n->len = t->n;
            P->i++;
        } else if (t->t == T_VAR_B) {
            P->i++;
            if ((n = new_node(P, S_OUT, t->line)) && (n->e = parse_expr(P)) && cur(P)->t != T_VAR_E) {
                char b[64];
                return perr_(P, cur(P)->line, KILN_ERR_PARSE, "expected '}}', found %s", tok_text(cur(P), b, sizeof b)), false;
            }
            P->i++;
        } else if (t->t == T_BLOCK_B) {
            tok *name = &P->t[P->i + 1];
            if (stops && name->t == T_NAME && in_list(name->p, stops)) {
                *stopped = name->p;
                P->i += 2;
                break;
            }
            if (name->t == T_NAME && (!strcmp(name->p, "endif") || !strcmp(name->p, "endfor") ||
                                      !strcmp(name->p, "else") || !strcmp(name->p, "elif") || !strcmp(name->p, "endset")))
                return perr_(P, name->line, KILN_ERR_PARSE, "unexpected '{%% %s %%}'", name->p), false;
            P->i++;
            n = parse_statement(P);
        } else {
            char b[64];
            return perr_(P, t->line, KILN_ERR_PARSE, "unexpected %s", tok_text(t, b, sizeof b)), false;
        }
        if (!n || P->err->code != KILN_OK) return false;
        tail->next = n;
        tail = n;
    }
    P->depth--;
    *out = head.next;
    return true;
}

/* "\r\n" and "\r" → "\n"; one trailing "\n" dropped (Jinja's keep_trailing_newline=False). */
static char *normalize(ct_arena *a, const char *src, size_t len, size_t *out_len) {
    char *s = ct_alloc(a, len + 1);
    if (!s) return NULL;
    size_t n = 0;
    for (size_t i = 0; i < len; i++) {
        if (src[i] == '\r') {
            s[n++] = '\n';
            if (i + 1 < len && src[i + 1] == '\n') i++;
        } else {
            s[n++] = src[i];
        }
    }
    if (n && s[n - 1] == '\n') n--;
    s[n] = 0;
    *out_len = n;
    return s;
}

kiln_status ct_parse(const char *src, size_t len, ct_arena *a, ct_node **out, kiln_error *err) {
    kiln_err_clear(err);
    lexer L = {.line = 1, .a = a, .err = err};
    if (!(L.s = normalize(a, src, len, &L.len))) return kiln_err(err, KILN_ERR_NOMEM, "chat template: out of memory");
    kiln_status st = lex_all(&L);
    if (st == KILN_OK) {
        parser P = {.t = L.toks, .n = L.n, .a = a, .err = err};
        const char *stop = NULL;
        st = parse_body(&P, NULL, out, &stop) ? KILN_OK : err->code;
        if (st == KILN_OK && err->code != KILN_OK) st = err->code;
    }
    free(L.toks);
    return st;
}

static bool valid_utf8(const unsigned char *s, size_t n, size_t *bad) {
    for (size_t i = 0; i < n;) {
        unsigned c = s[i];
        size_t k = c < 0x80 ? 1 : (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : (c & 0xF8) == 0xF0 ? 4 : 0;
        if (!k || i + k > n || (k == 2 && c < 0xC2)) goto bad;
        for (size_t j = 1; j < k; j++)
            if ((s[i + j] & 0xC0) != 0x80) goto bad;
        if (k == 3 && ((c == 0xE0 && s[i + 1] < 0xA0) || (c == 0xED && s[i + 1] >= 0xA0))) goto bad;
        if (k == 4 && ((c == 0xF0 && s[i + 1] < 0x90) || c > 0xF4 || (c == 0xF4 && s[i + 1] >= 0x90))) goto bad;
        i += k;
        continue;
    bad:
        *bad = i;
        return false;
    }
    return true;
}

bool ct_valid_utf8(const char *s, size_t n, size_t *bad);
bool ct_valid_utf8(const char *s, size_t n, size_t *bad) { return valid_utf8((const unsigned char *)s, n, bad); }

kiln_status kiln_chat_template_parse(const char *src, size_t len, kiln_chat_template **out, kiln_error *err) {
    *out = NULL;
    if (!src) return kiln_err(err, KILN_ERR_INVALID_ARG, "chat template: source is NULL");
    if (len > KILN_CHAT_MAX_TEMPLATE)
        return kiln_err(err, KILN_ERR_UNSUPPORTED, "chat template: %zu bytes, more than the %u kiln takes", len,
                        KILN_CHAT_MAX_TEMPLATE);
    size_t bad;
    if (!valid_utf8((const unsigned char *)src, len, &bad))
        return kiln_err(err, KILN_ERR_PARSE, "chat template: invalid UTF-8 at byte %zu", bad);
    kiln_chat_template *t = calloc(1, sizeof *t);
    if (!t) return kiln_err(err, KILN_ERR_NOMEM, "chat template: out of memory");
    t->arena.limit = 64 * (size_t)KILN_CHAT_MAX_TEMPLATE; /* the tree of a 1 MiB template fits easily */
    kiln_status st = ct_parse(src, len, &t->arena, &t->body, err);
    if (st != KILN_OK) {
        kiln_chat_template_free(t);
        return st;
    }
    *out = t;
    return KILN_OK;
}

void kiln_chat_template_free(kiln_chat_template *t) {
    if (!t) return;
    ct_arena_free(&t->arena);
    free(t);
}
