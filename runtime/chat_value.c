/*
 * chat_value.c — values of the chat-template interpreter and its builtins,
 * each with the semantics of Python / Jinja as transformers runs them:
 * str() and repr() as Python prints them (floats shortest round-trip:
 * 0.30000000000000004, 1e+16), == across int/float/bool, tojson as
 * json.dumps(ensure_ascii=False) (transformers replaces Jinja's own tojson),
 * string methods on code points with Python's whitespace set.
 *
 * Case mapping (upper, lower, capitalize) is ASCII only: other letters are
 * left as they are, where Python would map them (docs/chat.md).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chat_internal.h"

size_t ct_space_len(const char *s, size_t n);

/* ---- small helpers ---- */

/* Append to a scratch buffer, refusing to grow past the render's memory cap. */
static bool sb_add(ct_render *r, int line, kiln_buf *b, const void *p, size_t n) {
    if (n > r->lim.max_memory || b->len > r->lim.max_memory - n)
        return ct_fail(r, line, KILN_ERR_INVALID_ARG, "a string grows past the %zu-byte cap", r->lim.max_memory);
    if (n && !kiln_buf_append(b, p, n)) return ct_oom(r, line);
    return true;
}

/* The scratch buffer as a string value (copied into the arena); frees b. */
static bool sb_done(ct_render *r, int line, kiln_buf *b, jv *out) {
    bool ok = ct_str_new(r, line, b->data ? (const char *)b->data : "", b->len, out);
    kiln_buf_free(b);
    return ok;
}

bool ct_str_new(ct_render *r, int line, const char *p, size_t n, jv *out) {
    char *s = ct_strdup(&r->arena, p, n);
    if (!s) return ct_fail(r, line, KILN_ERR_INVALID_ARG, "the template needs more than the %zu-byte memory cap", r->lim.max_memory);
    *out = jv_str(s, n);
    return true;
}

static size_t u8len(unsigned char c) { return c < 0x80 ? 1 : (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : 4; }

size_t ct_utf8_len(const char *s, size_t n) {
    size_t k = 0;
    for (size_t i = 0; i < n; i += u8len((unsigned char)s[i])) k++;
    return k;
}

static uint32_t decode_at(const char *s, size_t n, size_t i, size_t *len) {
    const unsigned char *u = (const unsigned char *)s + i;
    size_t k = u8len(u[0]);
    if (i + k > n) k = n - i;
    *len = k;
    if (k == 1) return u[0];
    if (k == 2) return (uint32_t)(u[0] & 0x1F) << 6 | (u[1] & 0x3F);
    if (k == 3) return (uint32_t)(u[0] & 0x0F) << 12 | (uint32_t)(u[1] & 0x3F) << 6 | (u[2] & 0x3F);
    return (uint32_t)(u[0] & 0x07) << 18 | (uint32_t)(u[1] & 0x3F) << 12 | (uint32_t)(u[2] & 0x3F) << 6 | (u[3] & 0x3F);
}

/* Start of the character that ends at `end`. */
static size_t prev_char(const char *s, size_t end) {
    size_t i = end - 1;
    while (i > 0 && ((unsigned char)s[i] & 0xC0) == 0x80) i--;
    return i;
}

static jv *arg_at(jv *args, const char **kw, int n, int pos, const char *name) {
    for (int i = 0; i < n; i++)
        if (kw[i] && !strcmp(kw[i], name)) return &args[i];
    int p = 0;
    for (int i = 0; i < n; i++) {
        if (kw[i]) continue;
        if (p++ == pos) return &args[i];
    }
    return NULL;
}

/* ---- lists and dicts ---- */

static int vdepth(jv v) { return v.k == V_LIST ? v.l->depth : v.k == V_DICT || v.k == V_NS ? v.d->depth : 0; }

/* A container that gets `v` must stay within CT_MAX_VALUE_DEPTH. */
static bool nest(ct_render *r, int line, int *depth, jv v) {
    int d = vdepth(v) + 1;
    if (d > CT_MAX_VALUE_DEPTH) return ct_fail(r, line, KILN_ERR_INVALID_ARG, "values nested deeper than %d", CT_MAX_VALUE_DEPTH);
    if (d > *depth) *depth = d;
    return true;
}

jv ct_new_list(ct_render *r, size_t cap) {
    ct_list *l = ct_alloc(&r->arena, sizeof *l);
    if (l) l->depth = 1;
    if (l && cap) {
        l->v = ct_alloc(&r->arena, sizeof *l->v * cap);
        l->cap = l->v ? cap : 0;
    }
    return l ? (jv){.k = V_LIST, .l = l} : jv_none();
}

jv ct_new_dict(ct_render *r, ct_kind k) {
    ct_dict *d = ct_alloc(&r->arena, sizeof *d);
    if (d) d->depth = 1;
    return d ? (jv){.k = k, .d = d} : jv_none();
}

bool ct_list_push(ct_render *r, int line, ct_list *l, jv v) {
    if (!nest(r, line, &l->depth, v)) return false;
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 8;
        if (cap > r->lim.max_memory / sizeof(jv)) return ct_fail(r, line, KILN_ERR_INVALID_ARG, "a list grows past the memory cap");
        jv *nv = ct_alloc(&r->arena, sizeof *nv * cap);
        if (!nv) return ct_fail(r, line, KILN_ERR_INVALID_ARG, "the template needs more than the %zu-byte memory cap", r->lim.max_memory);
        if (l->n) memcpy(nv, l->v, sizeof *nv * l->n);
        l->v = nv;
        l->cap = cap;
    }
    l->v[l->n++] = v;
    return true;
}

jv *ct_dict_get(const ct_dict *d, jv key) {
    for (size_t i = 0; i < d->n; i++)
        if (ct_equal(d->key[i], key)) return &d->val[i];
    return NULL;
}

bool ct_dict_set(ct_render *r, int line, ct_dict *d, jv key, jv val) {
    if (!nest(r, line, &d->depth, key) || !nest(r, line, &d->depth, val) || !ct_charge(r, line, d->n)) return false;
    jv *v = ct_dict_get(d, key);
    if (v) {
        *v = val;
        return true;
    }
    if (d->n == d->cap) {
        size_t cap = d->cap ? d->cap * 2 : 8;
        jv *nk = ct_alloc(&r->arena, sizeof *nk * cap), *nv = ct_alloc(&r->arena, sizeof *nv * cap);
        if (!nk || !nv) return ct_fail(r, line, KILN_ERR_INVALID_ARG, "the template needs more than the %zu-byte memory cap", r->lim.max_memory);
        if (d->n) memcpy(nk, d->key, sizeof *nk * d->n), memcpy(nv, d->val, sizeof *nv * d->n);
        d->key = nk;
        d->val = nv;
        d->cap = cap;
    }
    d->key[d->n] = key;
    d->val[d->n++] = val;
    return true;
}

/* ---- truth, types, equality ---- */

bool ct_truthy(jv v) {
    switch (v.k) {
    case V_UNDEF: case V_NONE: return false;
    case V_BOOL: return v.b;
    case V_INT: return v.i != 0;
    case V_FLOAT: return v.f != 0;
    case V_STR: return v.n > 0;
    case V_LIST: return v.l->n > 0;
    case V_DICT: return v.d->n > 0;
    default: return true;
    }
}

const char *ct_type_name(jv v) {
    static const char *const names[] = {"undefined", "NoneType", "bool", "int", "float", "str", "list", "dict",
                                        "Namespace", "LoopContext"};
    return names[v.k];
}

static bool is_num(jv v) { return v.k == V_BOOL || v.k == V_INT || v.k == V_FLOAT; }
static double num(jv v) { return v.k == V_FLOAT ? v.f : v.k == V_INT ? (double)v.i : (double)v.b; }
static int64_t inum(jv v) { return v.k == V_INT ? v.i : (int64_t)v.b; }

bool ct_equal(jv a, jv b) {
    if (is_num(a) && is_num(b)) {
        if (a.k != V_FLOAT && b.k != V_FLOAT) return inum(a) == inum(b);
        return num(a) == num(b);
    }
    if (a.k != b.k) return false;
    switch (a.k) {
    case V_UNDEF: case V_NONE: return true;
    case V_STR: return a.n == b.n && (a.n == 0 || memcmp(a.s, b.s, a.n) == 0);
    case V_LIST:
        if (a.l->n != b.l->n) return false;
        for (size_t i = 0; i < a.l->n; i++)
            if (!ct_equal(a.l->v[i], b.l->v[i])) return false;
        return true;
    case V_DICT:
        if (a.d->n != b.d->n) return false;
        for (size_t i = 0; i < a.d->n; i++) {
            jv *o = ct_dict_get(b.d, a.d->key[i]);
            if (!o || !ct_equal(a.d->val[i], *o)) return false;
        }
        return true;
    case V_NS: return a.d == b.d;
    case V_LOOP: return a.lp == b.lp;
    default: return false;
    }
}

/* <0, 0, >0 for numbers, strings (code point order = UTF-8 byte order) and lists. */
bool ct_compare(ct_render *r, int line, jv a, jv b, const char *op, int *out);
bool ct_compare(ct_render *r, int line, jv a, jv b, const char *op, int *out) {
    if (is_num(a) && is_num(b)) {
        if (a.k != V_FLOAT && b.k != V_FLOAT) *out = (inum(a) > inum(b)) - (inum(a) < inum(b));
        else *out = (num(a) > num(b)) - (num(a) < num(b));
        return true;
    }
    if (a.k == V_STR && b.k == V_STR) {
        int c = memcmp(a.s, b.s, a.n < b.n ? a.n : b.n);
        *out = c ? c : (a.n > b.n) - (a.n < b.n);
        return true;
    }
    if (a.k == V_LIST && b.k == V_LIST) {
        for (size_t i = 0; i < a.l->n && i < b.l->n; i++) {
            if (ct_equal(a.l->v[i], b.l->v[i])) continue;
            return ct_compare(r, line, a.l->v[i], b.l->v[i], op, out);
        }
        *out = (a.l->n > b.l->n) - (a.l->n < b.l->n);
        return true;
    }
    if (a.k == V_UNDEF || b.k == V_UNDEF) {
        jv u = a.k == V_UNDEF ? a : b;
        return ct_fail(r, line, KILN_ERR_PARSE, "'%.*s' is undefined", (int)u.n, u.s);
    }
    return ct_fail(r, line, KILN_ERR_PARSE, "'%s' not supported between instances of '%s' and '%s'", op,
                   ct_type_name(a), ct_type_name(b));
}

/* ---- str(), repr() ---- */

/* Python's repr(float): the shortest digits that read back to the same double. */
static void float_repr(double f, char *out, size_t cap) {
    if (isnan(f)) { snprintf(out, cap, "nan"); return; }
    if (isinf(f)) { snprintf(out, cap, f < 0 ? "-inf" : "inf"); return; }
    char buf[40];
    int prec;
    for (prec = 1; prec <= 17; prec++) {
        snprintf(buf, sizeof buf, "%.*e", prec - 1, f);
        if (strtod(buf, NULL) == f) break;
    }
    /* buf = [-]d.ddde[+-]XX: split into sign, digits, exponent */
    const char *p = buf;
    bool neg = *p == '-';
    if (neg) p++;
    char digits[24];
    int nd = 0;
    for (; *p && *p != 'e'; p++)
        if (*p != '.') digits[nd++] = *p;
    while (nd > 1 && digits[nd - 1] == '0') nd--;
    digits[nd] = 0;
    int exp = atoi(p + 1);
    size_t o = 0;
    if (neg) out[o++] = '-';
    if (exp >= 16 || exp < -4) {
        out[o++] = digits[0];
        if (nd > 1) {
            out[o++] = '.';
            for (int i = 1; i < nd; i++) out[o++] = digits[i];
        }
        snprintf(out + o, cap - o, "e%c%02d", exp < 0 ? '-' : '+', exp < 0 ? -exp : exp);
        return;
    }
    if (exp < 0) {
        out[o++] = '0';
        out[o++] = '.';
        for (int i = -1; i > exp; i--) out[o++] = '0';
        for (int i = 0; i < nd; i++) out[o++] = digits[i];
    } else {
        for (int i = 0; i <= exp; i++) out[o++] = i < nd ? digits[i] : '0';
        out[o++] = '.';
        if (nd > exp + 1)
            for (int i = exp + 1; i < nd; i++) out[o++] = digits[i];
        else
            out[o++] = '0';
    }
    out[o] = 0;
}

static bool repr_buf(jv v, kiln_buf *b);

static bool str_repr(const char *s, size_t n, kiln_buf *b) {
    bool sq = memchr(s, '\'', n) != NULL, dq = memchr(s, '"', n) != NULL;
    char q = sq && !dq ? '"' : '\'';
    bool ok = kiln_buf_append(b, &q, 1);
    for (size_t i = 0; i < n && ok;) {
        size_t k;
        uint32_t c = decode_at(s, n, i, &k);
        char esc[16];
        if (c == (uint32_t)q || c == '\\') snprintf(esc, sizeof esc, "\\%c", (char)c);
        else if (c == '\n') snprintf(esc, sizeof esc, "\\n");
        else if (c == '\r') snprintf(esc, sizeof esc, "\\r");
        else if (c == '\t') snprintf(esc, sizeof esc, "\\t");
        else if (c < 0x20 || (c >= 0x7f && c <= 0xa0) || c == 0xad) snprintf(esc, sizeof esc, "\\x%02x", c);
        else if ((c >= 0x200b && c <= 0x200f) || c == 0x2028 || c == 0x2029 || c == 0xfeff) snprintf(esc, sizeof esc, "\\u%04x", c);
        else esc[0] = 0;
        ok = esc[0] ? kiln_buf_append(b, esc, strlen(esc)) : kiln_buf_append(b, s + i, k);
        i += k;
    }
    return ok && kiln_buf_append(b, &q, 1);
}

static bool dict_repr(const ct_dict *d, kiln_buf *b) {
    bool ok = kiln_buf_append(b, "{", 1);
    for (size_t i = 0; i < d->n && ok; i++) {
        if (i) ok = kiln_buf_append(b, ", ", 2);
        ok = ok && repr_buf(d->key[i], b) && kiln_buf_append(b, ": ", 2) && repr_buf(d->val[i], b);
    }
    return ok && kiln_buf_append(b, "}", 1);
}

static bool repr_buf(jv v, kiln_buf *b) {
    if (v.k == V_STR) return str_repr(v.s, v.n, b);
    if (v.k == V_UNDEF) return kiln_buf_append(b, "Undefined", 9);
    return ct_to_str_buf(v, b);
}

bool ct_to_str_buf(jv v, kiln_buf *b) {
    char num_buf[48];
    switch (v.k) {
    case V_UNDEF: return true;
    case V_NONE: return kiln_buf_append(b, "None", 4);
    case V_BOOL: return v.b ? kiln_buf_append(b, "True", 4) : kiln_buf_append(b, "False", 5);
    case V_INT: return kiln_buf_printf(b, "%lld", (long long)v.i);
    case V_FLOAT: float_repr(v.f, num_buf, sizeof num_buf); return kiln_buf_append(b, num_buf, strlen(num_buf));
    case V_STR: return v.n == 0 || kiln_buf_append(b, v.s, v.n);
    case V_LIST: {
        bool ok = kiln_buf_append(b, "[", 1);
        for (size_t i = 0; i < v.l->n && ok; i++) ok = (!i || kiln_buf_append(b, ", ", 2)) && repr_buf(v.l->v[i], b);
        return ok && kiln_buf_append(b, "]", 1);
    }
    case V_DICT: return dict_repr(v.d, b);
    case V_NS: return kiln_buf_append(b, "<Namespace ", 11) && dict_repr(v.d, b) && kiln_buf_append(b, ">", 1);
    case V_LOOP: return kiln_buf_printf(b, "<LoopContext %lld/%zu>", (long long)v.lp->index0 + 1, v.lp->items->n);
    }
    return false;
}

bool ct_to_str(ct_render *r, int line, jv v, jv *out) {
    if (v.k == V_STR) {
        *out = v;
        return true;
    }
    kiln_buf b = {0};
    if (!ct_to_str_buf(v, &b)) {
        kiln_buf_free(&b);
        return ct_oom(r, line);
    }
    if (b.len > r->lim.max_memory) {
        kiln_buf_free(&b);
        return ct_fail(r, line, KILN_ERR_INVALID_ARG, "a string grows past the memory cap");
    }
    return sb_done(r, line, &b, out);
}

/* ---- tojson: json.dumps(x, ensure_ascii=False, indent=None|n, sort_keys) ---- */

typedef struct jctx {
    ct_render *r;
    int line, indent, depth;
    bool sort;
    kiln_buf b;
} jctx;

static bool json_value(jctx *j, jv v);

static bool json_string(jctx *j, const char *s, size_t n) {
    if (!sb_add(j->r, j->line, &j->b, "\"", 1)) return false;
    size_t run = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        const char *e = c == '"' ? "\\\"" : c == '\\' ? "\\\\" : c == '\n' ? "\\n" : c == '\r' ? "\\r" : c == '\t' ? "\\t"
                      : c == '\b' ? "\\b" : c == '\f' ? "\\f" : NULL;
        char u[8];
        if (!e && c < 0x20) snprintf(u, sizeof u, "\\u%04x", c), e = u;
        if (!e) continue;
        if (!sb_add(j->r, j->line, &j->b, s + run, i - run) || !sb_add(j->r, j->line, &j->b, e, strlen(e))) return false;
        run = i + 1;
    }
    return sb_add(j->r, j->line, &j->b, s + run, n - run) && sb_add(j->r, j->line, &j->b, "\"", 1);
}

static bool json_newline(jctx *j) {
    if (j->indent < 0) return true;
    if (!sb_add(j->r, j->line, &j->b, "\n", 1)) return false;
    for (int i = 0; i < j->indent * j->depth; i++)
        if (!sb_add(j->r, j->line, &j->b, " ", 1)) return false;
    return true;
}

static int cmp_keys(const void *x, const void *y) {
    const jv *a = *(const jv *const *)x, *b = *(const jv *const *)y;
    if (a->k != V_STR || b->k != V_STR) return 0;
    int c = memcmp(a->s, b->s, a->n < b->n ? a->n : b->n);
    return c ? c : (a->n > b->n) - (a->n < b->n);
}

static bool json_dict(jctx *j, const ct_dict *d) {
    if (d->n == 0) return sb_add(j->r, j->line, &j->b, "{}", 2);
    jv **keys = ct_alloc(&j->r->arena, sizeof *keys * d->n);
    if (!keys) return ct_oom(j->r, j->line);
    for (size_t i = 0; i < d->n; i++) keys[i] = &d->key[i];
    if (j->sort) qsort(keys, d->n, sizeof *keys, cmp_keys);
    if (!sb_add(j->r, j->line, &j->b, "{", 1)) return false;
    j->depth++;
    for (size_t i = 0; i < d->n; i++) {
        jv k = *keys[i], v = d->val[keys[i] - d->key];
        if (i && !sb_add(j->r, j->line, &j->b, j->indent < 0 ? ", " : ",", j->indent < 0 ? 2 : 1)) return false;
        if (!json_newline(j)) return false;
        bool ok;
        if (k.k == V_STR) ok = json_string(j, k.s, k.n);
        else if (k.k == V_NONE) ok = sb_add(j->r, j->line, &j->b, "\"null\"", 6);
        else if (k.k == V_BOOL) ok = sb_add(j->r, j->line, &j->b, k.b ? "\"true\"" : "\"false\"", k.b ? 6 : 7);
        else if (k.k == V_INT || k.k == V_FLOAT) {
            jv s;
            ok = ct_to_str(j->r, j->line, k, &s) && json_string(j, s.s, s.n);
        } else return ct_fail(j->r, j->line, KILN_ERR_PARSE, "tojson: keys must be str, int, float, bool or None, not %s", ct_type_name(k));
        if (!ok || !sb_add(j->r, j->line, &j->b, ": ", 2) || !json_value(j, v)) return false;
    }
    j->depth--;
    return json_newline(j) && sb_add(j->r, j->line, &j->b, "}", 1);
}

static bool json_value(jctx *j, jv v) {
    if (j->depth >= KILN_CHAT_MAX_DEPTH) return ct_fail(j->r, j->line, KILN_ERR_INVALID_ARG, "tojson: nested deeper than %d", KILN_CHAT_MAX_DEPTH);
    char nb[48];
    switch (v.k) {
    case V_NONE: return sb_add(j->r, j->line, &j->b, "null", 4);
    case V_BOOL: return sb_add(j->r, j->line, &j->b, v.b ? "true" : "false", v.b ? 4 : 5);
    case V_INT: snprintf(nb, sizeof nb, "%lld", (long long)v.i); return sb_add(j->r, j->line, &j->b, nb, strlen(nb));
    case V_FLOAT:
        if (isnan(v.f)) snprintf(nb, sizeof nb, "NaN");
        else if (isinf(v.f)) snprintf(nb, sizeof nb, v.f < 0 ? "-Infinity" : "Infinity");
        else float_repr(v.f, nb, sizeof nb);
        return sb_add(j->r, j->line, &j->b, nb, strlen(nb));
    case V_STR: return json_string(j, v.s, v.n);
    case V_LIST:
        if (v.l->n == 0) return sb_add(j->r, j->line, &j->b, "[]", 2);
        if (!sb_add(j->r, j->line, &j->b, "[", 1)) return false;
        j->depth++;
        for (size_t i = 0; i < v.l->n; i++) {
            if (i && !sb_add(j->r, j->line, &j->b, j->indent < 0 ? ", " : ",", j->indent < 0 ? 2 : 1)) return false;
            if (!json_newline(j) || !json_value(j, v.l->v[i])) return false;
        }
        j->depth--;
        return json_newline(j) && sb_add(j->r, j->line, &j->b, "]", 1);
    case V_DICT: return json_dict(j, v.d);
    default:
        return ct_fail(j->r, j->line, KILN_ERR_PARSE, "tojson: object of type %s is not JSON serializable", ct_type_name(v));
    }
}

bool ct_tojson(ct_render *r, int line, jv v, int indent, bool sort_keys, jv *out) {
    jctx j = {.r = r, .line = line, .indent = indent, .sort = sort_keys};
    if (!json_value(&j, v)) {
        kiln_buf_free(&j.b);
        return false;
    }
    return sb_done(r, line, &j.b, out);
}

/* ---- string operations ---- */

static bool in_chars(uint32_t c, const char *chars, size_t n) {
    for (size_t i = 0; i < n;) {
        size_t k;
        if (decode_at(chars, n, i, &k) == c) return true;
        i += k;
    }
    return false;
}

/* strip with chars (NULL = Python whitespace); which: 1 left, 2 right, 3 both. */
static jv strip(jv s, const char *chars, size_t nc, int which) {
    size_t a = 0, b = s.n, k;
    while ((which & 1) && a < b) {
        if (chars) {
            uint32_t c = decode_at(s.s, b, a, &k);
            if (!in_chars(c, chars, nc)) break;
        } else if (!(k = ct_space_len(s.s + a, b - a))) break;
        a += k;
    }
    while ((which & 2) && b > a) {
        size_t p = prev_char(s.s, b);
        if (p < a) break;
        if (chars) {
            uint32_t c = decode_at(s.s, b, p, &k);
            if (!in_chars(c, chars, nc)) break;
        } else if (ct_space_len(s.s + p, b - p) != b - p) break;
        b = p;
    }
    return jv_str(s.s + a, b - a);
}

static const char *find_bytes(const char *h, size_t hn, const char *n, size_t nn) {
    if (nn == 0) return h;
    for (size_t i = 0; i + nn <= hn; i++)
        if (h[i] == n[0] && memcmp(h + i, n, nn) == 0) return h + i;
    return NULL;
}

static bool str_replace(ct_render *r, int line, jv s, jv old, jv rep, int64_t count, jv *out) {
    kiln_buf b = {0};
    size_t i = 0;
    int64_t done = 0;
    bool ok = true;
    if (old.n == 0) { /* Python inserts `rep` before each character and at the end */
        for (; ok && (count < 0 || done < count); done++) {
            ok = sb_add(r, line, &b, rep.s, rep.n);
            if (i >= s.n) { i = s.n + 1; break; }
            size_t k = u8len((unsigned char)s.s[i]);
            ok = ok && sb_add(r, line, &b, s.s + i, k);
            i += k;
        }
        if (ok && i <= s.n) ok = sb_add(r, line, &b, s.s + i, s.n - i);
    } else {
        const char *p;
        while (ok && (count < 0 || done < count) && (p = find_bytes(s.s + i, s.n - i, old.s, old.n))) {
            size_t at = (size_t)(p - s.s);
            ok = sb_add(r, line, &b, s.s + i, at - i) && sb_add(r, line, &b, rep.s, rep.n);
            i = at + old.n;
            done++;
        }
        ok = ok && sb_add(r, line, &b, s.s + i, s.n - i);
    }
    if (!ok) {
        kiln_buf_free(&b);
        return false;
    }
    return sb_done(r, line, &b, out);
}

static bool str_split(ct_render *r, int line, jv s, const jv *sep, int64_t maxsplit, jv *out) {
    *out = ct_new_list(r, 0);
    if (out->k != V_LIST) return ct_oom(r, line);
    size_t i = 0;
    if (!sep || sep->k == V_NONE) { /* runs of whitespace; no empty strings */
        int64_t done = 0;
        for (;;) {
            size_t k;
            while (i < s.n && (k = ct_space_len(s.s + i, s.n - i))) i += k;
            if (i >= s.n) return true;
            size_t a = i;
            if (maxsplit >= 0 && done >= maxsplit) {
                jv rest = strip(jv_str(s.s + a, s.n - a), NULL, 0, 2);
                return ct_list_push(r, line, out->l, rest);
            }
            while (i < s.n && !ct_space_len(s.s + i, s.n - i)) i += u8len((unsigned char)s.s[i]);
            if (!ct_list_push(r, line, out->l, jv_str(s.s + a, i - a))) return false;
            done++;
        }
    }
    if (sep->k != V_STR) return ct_fail(r, line, KILN_ERR_PARSE, "split: the separator must be a string, not %s", ct_type_name(*sep));
    if (sep->n == 0) return ct_fail(r, line, KILN_ERR_PARSE, "split: empty separator");
    const char *p;
    int64_t done = 0;
    while ((maxsplit < 0 || done < maxsplit) && (p = find_bytes(s.s + i, s.n - i, sep->s, sep->n))) {
        if (!ct_list_push(r, line, out->l, jv_str(s.s + i, (size_t)(p - s.s) - i))) return false;
        i = (size_t)(p - s.s) + sep->n;
        done++;
    }
    return ct_list_push(r, line, out->l, jv_str(s.s + i, s.n - i));
}

/* Python's simple case mapping for ASCII, Latin-1, Latin Extended-A, Greek
 * and Cyrillic (the letters of European languages); other code points are
 * left as they are. */
static uint32_t to_upper(uint32_t c) {
    if ((c >= 'a' && c <= 'z') || (c >= 0xE0 && c <= 0xFE && c != 0xF7)) return c - 32;
    if (c == 0xFF) return 0x178;
    if (c == 0xB5) return 0x39C;
    if ((c >= 0x100 && c <= 0x137) || (c >= 0x14A && c <= 0x177)) return c & ~1u;
    if ((c >= 0x139 && c <= 0x148) || (c >= 0x179 && c <= 0x17E)) return c % 2 ? c : c - 1;
    if (c == 0x17F) return 'S';
    if (c >= 0x3B1 && c <= 0x3C9 && c != 0x3C2) return c - 32;
    if (c == 0x3C2) return 0x3A3;
    if (c == 0x3AC) return 0x386;
    if (c >= 0x3AD && c <= 0x3AF) return c - 37;
    if (c == 0x3CC) return 0x38C;
    if (c == 0x3CD || c == 0x3CE) return c - 63;
    if (c >= 0x430 && c <= 0x44F) return c - 32;
    if (c >= 0x450 && c <= 0x45F) return c - 80;
    return c;
}

static uint32_t to_lower(uint32_t c) {
    if ((c >= 'A' && c <= 'Z') || (c >= 0xC0 && c <= 0xDE && c != 0xD7)) return c + 32;
    if (c == 0x178) return 0xFF;
    if ((c >= 0x100 && c <= 0x137) || (c >= 0x14A && c <= 0x177)) return c | 1u;
    if ((c >= 0x139 && c <= 0x148) || (c >= 0x179 && c <= 0x17E)) return c % 2 ? c + 1 : c;
    if (c >= 0x391 && c <= 0x3A9 && c != 0x3A2) return c + 32; /* Σ → σ: no final-sigma rule */
    if (c == 0x386) return 0x3AC;
    if (c >= 0x388 && c <= 0x38A) return c + 37;
    if (c == 0x38C) return 0x3CC;
    if (c == 0x38E || c == 0x38F) return c + 63;
    if (c >= 0x410 && c <= 0x42F) return c + 32;
    if (c >= 0x400 && c <= 0x40F) return c + 80;
    return c;
}

static size_t utf8_put(uint32_t c, char *o) {
    if (c < 0x80) return o[0] = (char)c, 1;
    if (c < 0x800) return o[0] = (char)(0xC0 | c >> 6), o[1] = (char)(0x80 | (c & 0x3F)), 2;
    if (c < 0x10000)
        return o[0] = (char)(0xE0 | c >> 12), o[1] = (char)(0x80 | ((c >> 6) & 0x3F)), o[2] = (char)(0x80 | (c & 0x3F)), 3;
    o[0] = (char)(0xF0 | c >> 18), o[1] = (char)(0x80 | ((c >> 12) & 0x3F));
    o[2] = (char)(0x80 | ((c >> 6) & 0x3F)), o[3] = (char)(0x80 | (c & 0x3F));
    return 4;
}

/* Case mapping: 1 upper, 2 lower, 3 capitalize (first upper, rest lower). */
static bool str_case(ct_render *r, int line, jv s, int how, jv *out) {
    kiln_buf b = {0};
    for (size_t i = 0; i < s.n;) {
        size_t k;
        uint32_t c = decode_at(s.s, s.n, i, &k);
        bool up = how == 1 || (how == 3 && i == 0);
        char enc[8];
        size_t m;
        if (c == 0xDF && up) m = how == 1 ? (memcpy(enc, "SS", 2), 2) : (memcpy(enc, "Ss", 2), 2); /* ß */
        else m = utf8_put(up ? to_upper(c) : to_lower(c), enc);
        if (!sb_add(r, line, &b, enc, m)) {
            kiln_buf_free(&b);
            return false;
        }
        i += k;
    }
    return sb_done(r, line, &b, out);
}

static bool affix(ct_render *r, int line, jv s, jv x, bool end, bool *out) {
    if (x.k == V_LIST) {
        *out = false;
        for (size_t i = 0; i < x.l->n && !*out; i++)
            if (!affix(r, line, s, x.l->v[i], end, out)) return false;
        return true;
    }
    if (x.k != V_STR)
        return ct_fail(r, line, KILN_ERR_PARSE, "%s: the argument must be a string, not %s", end ? "endswith" : "startswith", ct_type_name(x));
    *out = x.n <= s.n && memcmp(end ? s.s + s.n - x.n : s.s, x.s, x.n) == 0;
    return true;
}

static bool want_str(ct_render *r, const ct_expr *e, jv *a, const char *what) {
    if (a && a->k == V_STR) return true;
    return ct_fail(r, e->line, KILN_ERR_PARSE, "%s: %s must be a string, not %s", e->name, what, a ? ct_type_name(*a) : "missing");
}

static bool str_method(ct_render *r, const ct_expr *e, jv s, jv *args, const char **kw, int n, jv *out) {
    const char *m = e->name;
    int line = e->line;
    if (!ct_charge(r, line, s.n / 64)) return false;
    jv *a0 = arg_at(args, kw, n, 0, "__0"), *a1 = arg_at(args, kw, n, 1, "__1");
    if (!strcmp(m, "startswith") || !strcmp(m, "endswith")) {
        bool b;
        if (!a0) return ct_fail(r, line, KILN_ERR_PARSE, "%s needs an argument", m);
        if (!affix(r, line, s, *a0, m[0] == 'e', &b)) return false;
        *out = jv_bool(b);
        return true;
    }
    if (!strcmp(m, "strip") || !strcmp(m, "lstrip") || !strcmp(m, "rstrip")) {
        int which = m[0] == 'l' ? 1 : m[0] == 'r' ? 2 : 3;
        if (a0 && a0->k != V_NONE && !want_str(r, e, a0, "chars")) return false;
        bool chars = a0 && a0->k == V_STR;
        *out = strip(s, chars ? a0->s : NULL, chars ? a0->n : 0, which);
        return true;
    }
    if (!strcmp(m, "split")) {
        jv *sep = arg_at(args, kw, n, 0, "sep"), *ms = arg_at(args, kw, n, 1, "maxsplit");
        if (ms && ms->k != V_INT) return ct_fail(r, line, KILN_ERR_PARSE, "split: maxsplit must be an integer");
        return str_split(r, line, s, sep, ms ? ms->i : -1, out);
    }
    if (!strcmp(m, "replace")) {
        jv *c = arg_at(args, kw, n, 2, "count");
        if (!want_str(r, e, a0, "old") || !want_str(r, e, a1, "new")) return false;
        if (c && c->k != V_INT) return ct_fail(r, line, KILN_ERR_PARSE, "replace: count must be an integer");
        return str_replace(r, line, s, *a0, *a1, c ? c->i : -1, out);
    }
    if (!strcmp(m, "upper") || !strcmp(m, "lower") || !strcmp(m, "capitalize"))
        return str_case(r, line, s, m[0] == 'u' ? 1 : m[0] == 'l' ? 2 : 3, out);
    if (!strcmp(m, "find") || !strcmp(m, "count")) {
        if (!want_str(r, e, a0, "sub")) return false;
        const char *p = find_bytes(s.s, s.n, a0->s, a0->n);
        if (m[0] == 'f') {
            *out = jv_int(p ? (int64_t)ct_utf8_len(s.s, (size_t)(p - s.s)) : -1);
            return true;
        }
        int64_t cnt = 0;
        if (a0->n == 0) cnt = (int64_t)ct_utf8_len(s.s, s.n) + 1;
        else
            for (size_t i = 0; (p = find_bytes(s.s + i, s.n - i, a0->s, a0->n)); cnt++) i = (size_t)(p - s.s) + a0->n;
        *out = jv_int(cnt);
        return true;
    }
    return ct_fail(r, line, KILN_ERR_PARSE, "'str' object has no attribute '%s'", m);
}

static bool dict_method(ct_render *r, const ct_expr *e, jv d, jv *args, const char **kw, int n, jv *out) {
    const char *m = e->name;
    if (!strcmp(m, "get")) {
        jv *k = arg_at(args, kw, n, 0, "key"), *dflt = arg_at(args, kw, n, 1, "default");
        if (!k) return ct_fail(r, e->line, KILN_ERR_PARSE, "get needs a key");
        jv *v = ct_dict_get(d.d, *k);
        *out = v ? *v : dflt ? *dflt : jv_none();
        return true;
    }
    bool items = !strcmp(m, "items"), keys = !strcmp(m, "keys"), vals = !strcmp(m, "values");
    if (!items && !keys && !vals) return ct_fail(r, e->line, KILN_ERR_PARSE, "'dict' object has no attribute '%s'", m);
    *out = ct_new_list(r, d.d->n);
    if (out->k != V_LIST) return ct_oom(r, e->line);
    for (size_t i = 0; i < d.d->n; i++) {
        jv v = keys ? d.d->key[i] : d.d->val[i];
        if (items) {
            v = ct_new_list(r, 2);
            if (v.k != V_LIST) return ct_oom(r, e->line);
            if (!ct_list_push(r, e->line, v.l, d.d->key[i]) || !ct_list_push(r, e->line, v.l, d.d->val[i])) return false;
        }
        if (!ct_list_push(r, e->line, out->l, v)) return false;
    }
    return true;
}

bool ct_call_method(ct_render *r, const ct_expr *e, jv self, jv *args, const char **kw, int n, jv *out) {
    if (self.k == V_STR) return str_method(r, e, self, args, kw, n, out);
    if (self.k == V_DICT) return dict_method(r, e, self, args, kw, n, out);
    if (self.k == V_UNDEF)
        return ct_fail(r, e->line, KILN_ERR_PARSE, "'%.*s' is undefined (calling .%s())", (int)self.n, self.s, e->name);
    return ct_fail(r, e->line, KILN_ERR_PARSE, "'%s' object has no method '%s'", ct_type_name(self), e->name);
}

/* ---- filters ---- */

static bool filter_length(ct_render *r, const ct_expr *e, jv v, jv *out) {
    if (v.k == V_STR && !ct_charge(r, e->line, v.n / 64)) return false;
    switch (v.k) {
    case V_UNDEF: *out = jv_int(0); return true;
    case V_STR: *out = jv_int((int64_t)ct_utf8_len(v.s, v.n)); return true;
    case V_LIST: *out = jv_int((int64_t)v.l->n); return true;
    case V_DICT: *out = jv_int((int64_t)v.d->n); return true;
    default: return ct_fail(r, e->line, KILN_ERR_PARSE, "object of type '%s' has no len()", ct_type_name(v));
    }
}

static bool to_list(ct_render *r, int line, jv v, jv *out) {
    if (v.k == V_LIST || v.k == V_UNDEF) {
        *out = ct_new_list(r, v.k == V_LIST ? v.l->n : 0);
        if (out->k != V_LIST) return ct_oom(r, line);
        if (v.k == V_LIST && v.l->n) memcpy(out->l->v, v.l->v, sizeof *v.l->v * v.l->n), out->l->n = v.l->n;
        if (v.k == V_LIST) out->l->depth = v.l->depth;
        return true;
    }
    if (v.k == V_DICT) {
        *out = ct_new_list(r, v.d->n);
        if (out->k != V_LIST) return ct_oom(r, line);
        for (size_t i = 0; i < v.d->n; i++)
            if (!ct_list_push(r, line, out->l, v.d->key[i])) return false;
        return true;
    }
    if (v.k == V_STR) {
        *out = ct_new_list(r, 0);
        if (out->k != V_LIST) return ct_oom(r, line);
        for (size_t i = 0; i < v.n; i += u8len((unsigned char)v.s[i]))
            if (!ct_list_push(r, line, out->l, jv_str(v.s + i, u8len((unsigned char)v.s[i])))) return false;
        return true;
    }
    return ct_fail(r, line, KILN_ERR_PARSE, "'%s' object is not iterable", ct_type_name(v));
}
bool ct_to_list(ct_render *r, int line, jv v, jv *out);
bool ct_to_list(ct_render *r, int line, jv v, jv *out) { return to_list(r, line, v, out); }

static bool filter_join(ct_render *r, const ct_expr *e, jv v, jv *sep, jv *out) {
    jv l;
    if (!to_list(r, e->line, v, &l)) return false;
    kiln_buf b = {0};
    for (size_t i = 0; i < l.l->n; i++) {
        jv s;
        if ((i && sep && !ct_to_str(r, e->line, *sep, &s)) || (i && sep && !sb_add(r, e->line, &b, s.s, s.n)) ||
            !ct_to_str(r, e->line, l.l->v[i], &s) || !sb_add(r, e->line, &b, s.s, s.n)) {
            kiln_buf_free(&b);
            return false;
        }
    }
    return sb_done(r, e->line, &b, out);
}

static bool filter_escape(ct_render *r, const ct_expr *e, jv s, jv *out) {
    kiln_buf b = {0};
    for (size_t i = 0; i < s.n; i++) {
        char c = s.s[i];
        const char *x = c == '&' ? "&amp;" : c == '<' ? "&lt;" : c == '>' ? "&gt;" : c == '"' ? "&#34;" : c == '\'' ? "&#39;" : NULL;
        if (!(x ? sb_add(r, e->line, &b, x, strlen(x)) : sb_add(r, e->line, &b, &c, 1))) {
            kiln_buf_free(&b);
            return false;
        }
    }
    return sb_done(r, e->line, &b, out);
}

static bool filter_number(ct_render *r, const ct_expr *e, jv v, jv *dflt, bool want_int, jv *out) {
    double f = 0;
    bool ok = true;
    if (v.k == V_UNDEF) return ct_fail(r, e->line, KILN_ERR_PARSE, "'%.*s' is undefined (filter '%s')", (int)v.n, v.s, e->name);
    if (v.k == V_INT || v.k == V_BOOL || v.k == V_FLOAT) f = num(v);
    else if (v.k == V_STR) {
        char buf[64];
        size_t n = v.n < sizeof buf - 1 ? v.n : sizeof buf - 1;
        memcpy(buf, v.s, n);
        buf[n] = 0;
        char *end;
        f = strtod(buf, &end);
        ok = end != buf && *end == 0 && v.n < sizeof buf;
    } else ok = false;
    if (!ok) {
        *out = dflt ? *dflt : want_int ? jv_int(0) : jv_float(0);
        return true;
    }
    if (!want_int) *out = jv_float(f);
    else if (v.k == V_INT) *out = v;
    else if (!(f > -9.2e18 && f < 9.2e18)) return ct_fail(r, e->line, KILN_ERR_PARSE, "int: value out of range");
    else *out = jv_int((int64_t)f);
    return true;
}

/* select / reject / selectattr / rejectattr: keep the items whose test (by
 * name, truthiness when none is given) passes (select) or fails (reject). */
static bool filter_select(ct_render *r, const ct_expr *e, jv v, jv *args, const char **kw, int n, jv *out) {
    bool attr = strstr(e->name, "attr") != NULL, keep_if = e->name[0] == 's';
    int first = attr ? 1 : 0;
    jv l;
    if (!ct_truthy(v)) v = jv_undef("", 0); /* Jinja: `if value: for item in value` */
    if (!to_list(r, e->line, v, &l)) return false;
    if (attr && (n < 1 || args[0].k != V_STR)) return ct_fail(r, e->line, KILN_ERR_PARSE, "%s: the attribute must be a string", e->name);
    for (int i = 0; i < n; i++)
        if (kw[i]) return ct_fail(r, e->line, KILN_ERR_UNSUPPORTED, "%s: keyword arguments are not supported", e->name);
    ct_expr test = *e;
    char name[32] = "";
    if (n > first) {
        if (args[first].k != V_STR || args[first].n >= sizeof name)
            return ct_fail(r, e->line, KILN_ERR_PARSE, "%s: the test must be named by a string", e->name);
        memcpy(name, args[first].s, args[first].n);
        name[args[first].n] = 0;
        if (!ct_known_test(name)) return ct_fail(r, e->line, KILN_ERR_UNSUPPORTED, "test '%s' is not supported", name);
        test.name = name;
    }
    *out = ct_new_list(r, 0);
    if (out->k != V_LIST) return ct_oom(r, e->line);
    for (size_t i = 0; i < l.l->n; i++) {
        jv item = l.l->v[i], x = item;
        if (attr) {
            jv *f = item.k == V_DICT || item.k == V_NS ? ct_dict_get(item.d, args[0]) : NULL;
            x = f ? *f : jv_undef(args[0].s, args[0].n);
        }
        bool pass;
        if (!name[0]) pass = ct_truthy(x);
        else if (!ct_call_test(r, &test, x, args + first + 1, n - first - 1, &pass)) return false;
        if (pass == keep_if && !ct_list_push(r, e->line, out->l, item)) return false;
    }
    return true;
}

/* map(attribute='x', default=d) or map('filter', args...) over the items. */
static bool filter_map(ct_render *r, const ct_expr *e, jv v, jv *args, const char **kw, int n, jv *out) {
    jv l;
    if (!ct_truthy(v)) v = jv_undef("", 0); /* Jinja: `if value: for item in value` */
    if (!to_list(r, e->line, v, &l)) return false;
    jv *attr = arg_at(args, kw, n, 99, "attribute"), *dflt = arg_at(args, kw, n, 99, "default");
    ct_expr f = *e;
    char name[32];
    if (!attr) {
        if (n < 1 || kw[0] || args[0].k != V_STR || args[0].n >= sizeof name)
            return ct_fail(r, e->line, KILN_ERR_PARSE, "map: give attribute='name' or a filter name");
        memcpy(name, args[0].s, args[0].n);
        name[args[0].n] = 0;
        if (!ct_known_filter(name) || !strcmp(name, "map"))
            return ct_fail(r, e->line, KILN_ERR_UNSUPPORTED, "filter '%s' is not supported", name);
        f.name = name;
    } else if (attr->k != V_STR) {
        return ct_fail(r, e->line, KILN_ERR_PARSE, "map: attribute must be a string");
    }
    *out = ct_new_list(r, l.l->n);
    if (out->k != V_LIST) return ct_oom(r, e->line);
    for (size_t i = 0; i < l.l->n; i++) {
        jv item = l.l->v[i], x;
        if (attr) {
            jv *got = item.k == V_DICT || item.k == V_NS ? ct_dict_get(item.d, *attr) : NULL;
            x = got ? *got : dflt ? *dflt : jv_undef(attr->s, attr->n);
        } else if (!ct_call_filter(r, &f, item, args + 1, kw + 1, n - 1, &x)) {
            return false;
        }
        if (!ct_list_push(r, e->line, out->l, x)) return false;
    }
    return true;
}

bool ct_call_filter(ct_render *r, const ct_expr *e, jv v, jv *args, const char **kw, int n, jv *out) {
    const char *f = e->name;
    int line = e->line;
    jv *a0 = n ? arg_at(args, kw, n, 0, "__0") : NULL;
    jv s;
    if (!strcmp(f, "length") || !strcmp(f, "count")) return filter_length(r, e, v, out);
    if (!strcmp(f, "string")) return ct_to_str(r, line, v, out);
    if (!strcmp(f, "safe")) return *out = v, true;
    if (!strcmp(f, "select") || !strcmp(f, "reject") || !strcmp(f, "selectattr") || !strcmp(f, "rejectattr"))
        return filter_select(r, e, v, args, kw, n, out);
    if (!strcmp(f, "map")) return filter_map(r, e, v, args, kw, n, out);
    if (!strcmp(f, "tojson")) {
        jv *ind = arg_at(args, kw, n, 1, "indent"), *sk = arg_at(args, kw, n, 4, "sort_keys");
        if (arg_at(args, kw, n, 3, "separators") || (arg_at(args, kw, n, 0, "ensure_ascii") && ct_truthy(*arg_at(args, kw, n, 0, "ensure_ascii"))))
            return ct_fail(r, line, KILN_ERR_UNSUPPORTED, "tojson: only the indent and sort_keys options are supported");
        if (ind && ind->k != V_NONE && ind->k != V_INT) return ct_fail(r, line, KILN_ERR_UNSUPPORTED, "tojson: indent must be an integer");
        int indent = ind && ind->k == V_INT ? (int)(ind->i < 0 ? 0 : ind->i > 64 ? 64 : ind->i) : -1;
        return ct_tojson(r, line, v, indent, sk && ct_truthy(*sk), out);
    }
    if (!strcmp(f, "default") || !strcmp(f, "d")) {
        jv *b = arg_at(args, kw, n, 1, "boolean");
        bool use = v.k == V_UNDEF || (b && ct_truthy(*b) && !ct_truthy(v));
        jv *dv = arg_at(args, kw, n, 0, "default_value");
        *out = use ? (dv ? *dv : jv_str("", 0)) : v;
        return true;
    }
    if (!strcmp(f, "first") || !strcmp(f, "last")) {
        jv l;
        if (!to_list(r, line, v, &l)) return false;
        *out = l.l->n ? l.l->v[f[0] == 'f' ? 0 : l.l->n - 1] : jv_undef("first", 5);
        return true;
    }
    if (!strcmp(f, "list")) return to_list(r, line, v, out);
    if (!strcmp(f, "reverse")) {
        jv l;
        if (!to_list(r, line, v, &l)) return false;
        for (size_t i = 0; i < l.l->n / 2; i++) {
            jv t = l.l->v[i];
            l.l->v[i] = l.l->v[l.l->n - 1 - i];
            l.l->v[l.l->n - 1 - i] = t;
        }
        if (v.k != V_STR) return *out = l, true;
        return filter_join(r, e, l, NULL, out);
    }
    if (!strcmp(f, "join")) return filter_join(r, e, v, arg_at(args, kw, n, 0, "d"), out);
    if (!strcmp(f, "items")) {
        if (v.k == V_UNDEF) return *out = ct_new_list(r, 0), out->k == V_LIST || ct_oom(r, line);
        if (v.k != V_DICT) return ct_fail(r, line, KILN_ERR_PARSE, "items: expected a mapping, not %s", ct_type_name(v));
        ct_expr m = *e;
        m.name = "items";
        return dict_method(r, &m, v, NULL, NULL, 0, out);
    }
    if (!strcmp(f, "int") || !strcmp(f, "float")) return filter_number(r, e, v, a0, f[0] == 'i', out);
    if (!strcmp(f, "abs")) {
        if (v.k == V_FLOAT) return *out = jv_float(fabs(v.f)), true;
        if (v.k == V_INT || v.k == V_BOOL) {
            int64_t i = inum(v);
            if (i == INT64_MIN) return ct_fail(r, line, KILN_ERR_INVALID_ARG, "integer overflow");
            return *out = jv_int(i < 0 ? -i : i), true;
        }
        return ct_fail(r, line, KILN_ERR_PARSE, "bad operand type for abs(): '%s'", ct_type_name(v));
    }
    /* the rest work on str(value) */
    if (!ct_to_str(r, line, v, &s)) return false;
    if (!strcmp(f, "trim")) {
        jv *chars = arg_at(args, kw, n, 0, "chars");
        if (chars && chars->k != V_NONE && !want_str(r, e, chars, "chars")) return false;
        bool c = chars && chars->k == V_STR;
        *out = strip(s, c ? chars->s : NULL, c ? chars->n : 0, 3);
        return true;
    }
    if (!strcmp(f, "upper") || !strcmp(f, "lower") || !strcmp(f, "capitalize"))
        return str_case(r, line, s, f[0] == 'u' ? 1 : f[0] == 'l' ? 2 : 3, out);
    if (!strcmp(f, "escape") || !strcmp(f, "e")) return filter_escape(r, e, s, out);
    if (!strcmp(f, "replace")) {
        jv *o = arg_at(args, kw, n, 0, "old"), *nw = arg_at(args, kw, n, 1, "new"), *c = arg_at(args, kw, n, 2, "count");
        if (!want_str(r, e, o, "old") || !want_str(r, e, nw, "new")) return false;
        return str_replace(r, line, s, *o, *nw, c && c->k == V_INT ? c->i : -1, out);
    }
    return ct_fail(r, line, KILN_ERR_UNSUPPORTED, "filter '%s' is not supported", f);
}

/* ---- tests ---- */

bool ct_call_test(ct_render *r, const ct_expr *e, jv v, jv *args, int n, bool *out) {
    const char *t = e->name;
    int line = e->line, c;
    jv *a = n ? &args[0] : NULL;
    if (!strcmp(t, "defined")) *out = v.k != V_UNDEF;
    else if (!strcmp(t, "undefined")) *out = v.k == V_UNDEF;
    else if (!strcmp(t, "none")) *out = v.k == V_NONE;
    else if (!strcmp(t, "string")) *out = v.k == V_STR;
    else if (!strcmp(t, "number")) *out = is_num(v);
    else if (!strcmp(t, "integer")) *out = v.k == V_INT;
    else if (!strcmp(t, "float")) *out = v.k == V_FLOAT;
    else if (!strcmp(t, "boolean")) *out = v.k == V_BOOL;
    else if (!strcmp(t, "true")) *out = v.k == V_BOOL && v.b;
    else if (!strcmp(t, "false")) *out = v.k == V_BOOL && !v.b;
    else if (!strcmp(t, "mapping")) *out = v.k == V_DICT;
    else if (!strcmp(t, "iterable")) *out = v.k == V_STR || v.k == V_LIST || v.k == V_DICT || v.k == V_UNDEF;
    else if (!strcmp(t, "sequence")) *out = v.k == V_STR || v.k == V_LIST || v.k == V_DICT || v.k == V_UNDEF;
    else if (!strcmp(t, "lower") || !strcmp(t, "upper")) {
        jv s, m;
        if (!ct_to_str(r, line, v, &s) || !str_case(r, line, s, t[0] == 'u' ? 1 : 2, &m)) return false;
        bool cased = false;
        for (size_t i = 0; i < s.n; i++) cased |= (s.s[i] >= 'a' && s.s[i] <= 'z') || (s.s[i] >= 'A' && s.s[i] <= 'Z');
        *out = cased && ct_equal(s, m);
    } else if (!strcmp(t, "odd") || !strcmp(t, "even") || !strcmp(t, "divisibleby")) {
        int64_t d = t[0] == 'd' ? (a && (a->k == V_INT || a->k == V_BOOL) ? inum(*a) : 0) : 2;
        if (!(v.k == V_INT || v.k == V_BOOL) || d == 0)
            return ct_fail(r, line, KILN_ERR_PARSE, "test '%s' needs integers", t);
        int64_t m = d == -1 ? 0 : inum(v) % d;
        *out = t[0] == 'o' ? m != 0 : m == 0;
    } else {
        if (!a) return ct_fail(r, line, KILN_ERR_PARSE, "test '%s' needs an argument", t);
        if (!strcmp(t, "eq") || !strcmp(t, "equalto")) *out = ct_equal(v, *a);
        else if (!strcmp(t, "ne")) *out = !ct_equal(v, *a);
        else if (!strcmp(t, "sameas")) *out = v.k == a->k && (v.k == V_NONE || v.k == V_UNDEF || ct_equal(v, *a));
        else if (!strcmp(t, "in")) {
            extern bool ct_contains(ct_render *r, int line, jv needle, jv hay, bool *out);
            return ct_contains(r, line, v, *a, out);
        } else {
            if (!ct_compare(r, line, v, *a, t, &c)) return false;
            if (!strcmp(t, "lt") || !strcmp(t, "lessthan")) *out = c < 0;
            else if (!strcmp(t, "gt") || !strcmp(t, "greaterthan")) *out = c > 0;
            else if (!strcmp(t, "le")) *out = c <= 0;
            else if (!strcmp(t, "ge")) *out = c >= 0;
            else return ct_fail(r, line, KILN_ERR_UNSUPPORTED, "test '%s' is not supported", t);
        }
    }
    return true;
}
