/*
 * chat_eval.c — render a parsed chat template (chat_template.c) against a
 * conversation, with Jinja's semantics as transformers runs it:
 *
 *   - scopes: the template's top level is one scope; each iteration of a
 *     for loop gets a fresh scope over the enclosing ones, so `set` inside a
 *     loop is gone after the iteration (hence namespace()); `if` adds none;
 *   - undefined values (a missing variable, key or index) print as "", are
 *     false, have length 0 and iterate as empty, but reading an attribute
 *     of one, doing arithmetic with one or calling it is an error, as with
 *     Jinja's default Undefined;
 *   - the variables: messages (a list of {"role", "content"} dicts),
 *     add_generation_prompt, tools and documents (none), and the special
 *     tokens (bos_token...) of tokenizer_config.json.
 *
 * Caps (kiln_chat_limits) bound the output, the memory of values, loop
 * iterations and evaluation steps; range() is capped at 100,000 items as in
 * Jinja's sandbox.
 */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "chat_internal.h"

bool ct_compare(ct_render *r, int line, jv a, jv b, const char *op, int *out);
bool ct_to_list(ct_render *r, int line, jv v, jv *out);
bool ct_valid_utf8(const char *s, size_t n, size_t *bad);
bool ct_contains(ct_render *r, int line, jv needle, jv hay, bool *out);

#define MAX_RANGE 100000

struct ct_scope {
    ct_scope *up;
    ct_dict vars;
};

void kiln_chat_limits_default(kiln_chat_limits *l) {
    l->max_output = 64u << 20;
    l->max_memory = 256u << 20;
    l->max_iters = 1000000;
    l->max_steps = 50000000;
}

bool ct_fail(ct_render *r, int line, kiln_status code, const char *fmt, ...) {
    if (r->err->code != KILN_OK) return false; /* the first error stands */
    char msg[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    kiln_err(r->err, code, "chat template: line %d: %s", line, msg);
    return false;
}

bool ct_oom(ct_render *r, int line) {
    return ct_fail(r, line, KILN_ERR_INVALID_ARG, "the template needs more than the %zu-byte memory cap", r->lim.max_memory);
}

static bool undefined_err(ct_render *r, int line, jv u) {
    return ct_fail(r, line, KILN_ERR_PARSE, "'%.*s' is undefined", (int)u.n, u.s);
}

/* ---- variables ---- */

static jv lookup(ct_render *r, const char *name) {
    jv key = jv_str(name, strlen(name));
    for (ct_scope *s = r->scope; s; s = s->up) {
        jv *v = ct_dict_get(&s->vars, key);
        if (v) return *v;
    }
    /* the globals (raise_exception, strftime_now...) are defined and true, as
     * `{% if strftime_now is defined %}` in Llama 3.x templates expects */
    if (ct_known_function(name)) return jv_bool(true);
    return jv_undef(name, strlen(name));
}

static bool assign(ct_render *r, int line, const char *name, jv v) {
    return ct_dict_set(r, line, &r->scope->vars, jv_str(name, strlen(name)), v);
}

static bool push_scope(ct_render *r, int line) {
    ct_scope *s = ct_alloc(&r->arena, sizeof *s);
    if (!s) return ct_oom(r, line);
    s->up = r->scope;
    r->scope = s;
    return true;
}

bool ct_charge(ct_render *r, int line, uint64_t units) {
    r->steps += units;
    if (r->steps > r->lim.max_steps)
        return ct_fail(r, line, KILN_ERR_INVALID_ARG, "rendering takes more than %llu steps", (unsigned long long)r->lim.max_steps);
    return true;
}

static uint64_t size_of(jv v) {
    return v.k == V_LIST ? v.l->n : v.k == V_DICT || v.k == V_NS ? v.d->n : v.k == V_STR ? v.n / 64 : 0;
}

static bool step(ct_render *r, int line) {
    if (++r->steps > r->lim.max_steps)
        return ct_fail(r, line, KILN_ERR_INVALID_ARG, "rendering takes more than %llu steps", (unsigned long long)r->lim.max_steps);
    return true;
}

/* ---- attribute, item, slice ---- */

static jv loop_attr(const ct_loop *lp, const char *name) {
    int64_t n = (int64_t)lp->items->n, i = lp->index0;
    if (!strcmp(name, "index0")) return jv_int(i);
    if (!strcmp(name, "index")) return jv_int(i + 1);
    if (!strcmp(name, "revindex0")) return jv_int(n - i - 1);
    if (!strcmp(name, "revindex")) return jv_int(n - i);
    if (!strcmp(name, "first")) return jv_bool(i == 0);
    if (!strcmp(name, "last")) return jv_bool(i == n - 1);
    if (!strcmp(name, "length")) return jv_int(n);
    if (!strcmp(name, "depth")) return jv_int(1);
    if (!strcmp(name, "depth0")) return jv_int(0);
    if (!strcmp(name, "previtem")) return i > 0 ? lp->items->v[i - 1] : jv_undef("previtem", 8);
    if (!strcmp(name, "nextitem")) return i + 1 < n ? lp->items->v[i + 1] : jv_undef("nextitem", 8);
    return jv_undef(name, strlen(name));
}

static bool get_attr(ct_render *r, int line, jv obj, const char *name, jv *out) {
    if (obj.k == V_UNDEF)
        return ct_fail(r, line, KILN_ERR_PARSE, "'%.*s' is undefined (reading .%s)", (int)obj.n, obj.s, name);
    *out = jv_undef(name, strlen(name));
    if (obj.k == V_DICT || obj.k == V_NS) {
        if (!ct_charge(r, line, obj.d->n)) return false;
        jv *v = ct_dict_get(obj.d, jv_str(name, strlen(name)));
        if (v) *out = *v;
    } else if (obj.k == V_LOOP) {
        *out = loop_attr(obj.lp, name);
    }
    return true;
}

static size_t char_len(unsigned char c) { return c < 0x80 ? 1 : (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : 4; }

static bool get_item(ct_render *r, int line, jv obj, jv key, jv *out) {
    if (obj.k == V_UNDEF) return undefined_err(r, line, obj);
    *out = jv_undef("item", 4);
    if ((obj.k == V_LIST || obj.k == V_STR) && (key.k == V_INT || key.k == V_BOOL)) {
        int64_t i = key.k == V_INT ? key.i : key.b;
        if (obj.k == V_STR && !ct_charge(r, line, obj.n / 64)) return false;
        int64_t n = obj.k == V_LIST ? (int64_t)obj.l->n : (int64_t)ct_utf8_len(obj.s, obj.n);
        if (i < 0) i += n;
        if (i < 0 || i >= n) return true;
        if (obj.k == V_LIST) {
            *out = obj.l->v[i];
            return true;
        }
        size_t at = 0;
        for (int64_t k = 0; k < i; k++) at += char_len((unsigned char)obj.s[at]);
        size_t len = char_len((unsigned char)obj.s[at]);
        *out = jv_str(obj.s + at, len);
        return true;
    }
    if (obj.k == V_DICT || obj.k == V_NS) {
        if (!ct_charge(r, line, obj.d->n)) return false;
        jv *v = ct_dict_get(obj.d, key);
        if (v) *out = *v;
        return true;
    }
    if (key.k == V_STR && obj.k == V_LOOP) {
        char name[32];
        if (key.n < sizeof name) {
            memcpy(name, key.s, key.n);
            name[key.n] = 0;
            *out = loop_attr(obj.lp, name);
        }
    }
    return true;
}

/* Python's slice.indices(len): start, stop for a step. */
static void slice_bounds(int64_t n, const jv *a, const jv *b, int64_t st, int64_t *start, int64_t *stop) {
    int64_t lo = st < 0 ? -1 : 0, hi = st < 0 ? n - 1 : n;
    int64_t s = st < 0 ? hi : lo, e = st < 0 ? lo : hi;
    if (a && a->k == V_INT) {
        s = a->i < 0 ? a->i + n : a->i;
        if (s < lo) s = lo;
        if (s > hi) s = hi;
    }
    if (b && b->k == V_INT) {
        e = b->i < 0 ? b->i + n : b->i;
        if (e < lo) e = lo;
        if (e > hi) e = hi;
    }
    *start = s;
    *stop = e;
}

static bool get_slice(ct_render *r, const ct_expr *e, jv obj, jv *a, jv *b, jv *c, jv *out) {
    if (obj.k == V_UNDEF) return undefined_err(r, e->line, obj);
    for (jv *x = a; x; x = x == a ? b : x == b ? c : NULL)
        if (x->k != V_INT && x->k != V_NONE) return ct_fail(r, e->line, KILN_ERR_PARSE, "slice indices must be integers or none");
    int64_t st = c && c->k == V_INT ? c->i : 1;
    if (st == 0) return ct_fail(r, e->line, KILN_ERR_PARSE, "slice step cannot be zero");
    if (st == INT64_MIN) st = -INT64_MAX;
    if (obj.k != V_LIST && obj.k != V_STR) /* Jinja slices with Python's [], not its forgiving getitem */
        return ct_fail(r, e->line, KILN_ERR_PARSE, "'%s' object is not subscriptable", ct_type_name(obj));
    jv items;
    if (obj.k == V_LIST) items = obj;
    else if (!ct_to_list(r, e->line, obj, &items)) return false;
    int64_t n = (int64_t)items.l->n, s, t;
    slice_bounds(n, a, b, st, &s, &t);
    jv res = ct_new_list(r, 0);
    if (res.k != V_LIST) return ct_oom(r, e->line);
    for (int64_t i = s; st > 0 ? i < t : i > t; i += st) {
        if (!ct_list_push(r, e->line, res.l, items.l->v[i])) return false;
        if ((st > 0 && i > INT64_MAX - st) || (st < 0 && i < INT64_MIN - st)) break;
    }
    if (obj.k == V_LIST) {
        *out = res;
        return true;
    }
    kiln_buf buf = {0};
    for (size_t i = 0; i < res.l->n; i++)
        if (!kiln_buf_append(&buf, res.l->v[i].s, res.l->v[i].n)) {
            kiln_buf_free(&buf);
            return ct_oom(r, e->line);
        }
    bool ok = ct_str_new(r, e->line, buf.data ? (const char *)buf.data : "", buf.len, out);
    kiln_buf_free(&buf);
    return ok;
}

/* ---- operators ---- */

bool ct_contains(ct_render *r, int line, jv needle, jv hay, bool *out) {
    *out = false;
    if (!ct_charge(r, line, size_of(hay))) return false;
    switch (hay.k) {
    case V_UNDEF: return true;
    case V_STR:
        if (needle.k != V_STR)
            return ct_fail(r, line, KILN_ERR_PARSE, "'in <string>' requires a string as left operand, not %s", ct_type_name(needle));
        if (needle.n == 0) *out = true;
        for (size_t i = 0; !*out && i + needle.n <= hay.n; i++) *out = memcmp(hay.s + i, needle.s, needle.n) == 0;
        return true;
    case V_LIST:
        for (size_t i = 0; i < hay.l->n && !*out; i++) *out = ct_equal(needle, hay.l->v[i]);
        return true;
    case V_DICT:
    case V_NS:
        if (needle.k == V_LIST || needle.k == V_DICT || needle.k == V_NS)
            return ct_fail(r, line, KILN_ERR_PARSE, "unhashable type: '%s'", ct_type_name(needle));
        *out = ct_dict_get(hay.d, needle) != NULL;
        return true;
    default: return ct_fail(r, line, KILN_ERR_PARSE, "argument of type '%s' is not iterable", ct_type_name(hay));
    }
}

static const char *op_text(int op) {
    static const char *const t[] = {"+", "-", "*", "/", "//", "%", "**", "~", "==", "!=", "<", "<=", ">", ">=", "in", "not in"};
    return t[op];
}

static bool is_int(jv v) { return v.k == V_INT || v.k == V_BOOL; }
static int64_t ival(jv v) { return v.k == V_INT ? v.i : v.b; }
static double fval(jv v) { return v.k == V_FLOAT ? v.f : (double)ival(v); }

static bool repeat(ct_render *r, int line, jv seq, int64_t times, jv *out) {
    if (times < 0) times = 0;
    size_t unit = seq.k == V_STR ? seq.n : seq.l->n * sizeof(jv);
    if (unit == 0) times = 0; /* '' * 10**18 is '' at once */
    if (unit && (uint64_t)times > r->lim.max_memory / unit)
        return ct_fail(r, line, KILN_ERR_INVALID_ARG, "a repetition grows past the %zu-byte memory cap", r->lim.max_memory);
    if (seq.k == V_STR) {
        char *p = ct_alloc(&r->arena, seq.n * (size_t)times + 1);
        if (!p) return ct_oom(r, line);
        for (int64_t i = 0; i < times; i++) memcpy(p + (size_t)i * seq.n, seq.s, seq.n);
        *out = jv_str(p, seq.n * (size_t)times);
        return true;
    }
    *out = ct_new_list(r, 0);
    if (out->k != V_LIST) return ct_oom(r, line);
    for (int64_t i = 0; i < times; i++)
        for (size_t k = 0; k < seq.l->n; k++)
            if (!ct_list_push(r, line, out->l, seq.l->v[k])) return false;
    return true;
}

static bool concat(ct_render *r, int line, jv a, jv b, jv *out) {
    if (a.n > r->lim.max_memory || b.n > r->lim.max_memory - a.n) return ct_oom(r, line);
    char *p = ct_alloc(&r->arena, a.n + b.n + 1);
    if (!p) return ct_oom(r, line);
    if (a.n) memcpy(p, a.s, a.n);
    if (b.n) memcpy(p + a.n, b.s, b.n);
    *out = jv_str(p, a.n + b.n);
    return true;
}

static bool int_arith(ct_render *r, int line, int op, int64_t x, int64_t y, jv *out) {
    int64_t z = 0;
    bool ovf = false;
    switch (op) {
    case OP_ADD: ovf = __builtin_add_overflow(x, y, &z); break;
    case OP_SUB: ovf = __builtin_sub_overflow(x, y, &z); break;
    case OP_MUL: ovf = __builtin_mul_overflow(x, y, &z); break;
    case OP_FLOORDIV:
    case OP_MOD:
        if (y == 0) return ct_fail(r, line, KILN_ERR_PARSE, "integer division or modulo by zero");
        if (x == INT64_MIN && y == -1) { ovf = op == OP_FLOORDIV; z = 0; break; }
        z = op == OP_FLOORDIV ? x / y : x % y;
        if (op == OP_FLOORDIV && (x % y != 0) && ((x < 0) != (y < 0))) z--;
        if (op == OP_MOD && z != 0 && ((z < 0) != (y < 0))) z += y;
        break;
    case OP_POW:
        if (y < 0) {
            *out = jv_float(pow((double)x, (double)y));
            return true;
        }
        z = 1;
        for (int64_t i = 0; i < y && !ovf; i++) {
            ovf = __builtin_mul_overflow(z, x, &z);
            if (z == 0 || z == 1) break;
            if (z == -1) { z = (y - i - 1) % 2 ? -z : z; break; }
        }
        break;
    default: return false;
    }
    if (ovf) return ct_fail(r, line, KILN_ERR_INVALID_ARG, "integer overflow in '%s'", op_text(op));
    *out = jv_int(z);
    return true;
}

static bool arith(ct_render *r, const ct_expr *e, jv a, jv b, jv *out) {
    int op = e->op, line = e->line;
    if (op == OP_CONCAT) {
        jv sa, sb;
        return ct_to_str(r, line, a, &sa) && ct_to_str(r, line, b, &sb) && concat(r, line, sa, sb, out);
    }
    if (a.k == V_UNDEF) return undefined_err(r, line, a);
    if (b.k == V_UNDEF) return undefined_err(r, line, b);
    if (is_int(a) && is_int(b) && op != OP_DIV) return int_arith(r, line, op, ival(a), ival(b), out);
    bool na = is_int(a) || a.k == V_FLOAT, nb = is_int(b) || b.k == V_FLOAT;
    if (na && nb) {
        double x = fval(a), y = fval(b), z;
        if ((op == OP_DIV || op == OP_FLOORDIV || op == OP_MOD) && y == 0)
            return ct_fail(r, line, KILN_ERR_PARSE, "division by zero");
        switch (op) {
        case OP_ADD: z = x + y; break;
        case OP_SUB: z = x - y; break;
        case OP_MUL: z = x * y; break;
        case OP_DIV: z = x / y; break;
        case OP_FLOORDIV: z = floor(x / y); break;
        case OP_MOD: z = fmod(x, y); if (z != 0 && ((z < 0) != (y < 0))) z += y; break;
        default: z = pow(x, y); break;
        }
        *out = jv_float(z);
        return true;
    }
    if (op == OP_ADD && a.k == V_STR && b.k == V_STR) return concat(r, line, a, b, out);
    if (op == OP_ADD && a.k == V_LIST && b.k == V_LIST) {
        *out = ct_new_list(r, 0);
        if (out->k != V_LIST) return ct_oom(r, line);
        for (size_t i = 0; i < a.l->n + b.l->n; i++)
            if (!ct_list_push(r, line, out->l, i < a.l->n ? a.l->v[i] : b.l->v[i - a.l->n])) return false;
        return true;
    }
    if (op == OP_MUL && (a.k == V_STR || a.k == V_LIST) && is_int(b)) return repeat(r, line, a, ival(b), out);
    if (op == OP_MUL && (b.k == V_STR || b.k == V_LIST) && is_int(a)) return repeat(r, line, b, ival(a), out);
    if (op == OP_MOD && a.k == V_STR) return ct_fail(r, line, KILN_ERR_UNSUPPORTED, "string formatting with '%%' is not supported");
    return ct_fail(r, line, KILN_ERR_PARSE, "unsupported operand types for %s: '%s' and '%s'", op_text(op),
                   ct_type_name(a), ct_type_name(b));
}

/* ---- expressions ---- */

static bool eval(ct_render *r, const ct_expr *e, jv *out);

static bool eval_args(ct_render *r, const ct_expr *e, jv *vals) {
    for (int i = 0; i < e->n_args; i++)
        if (!eval(r, e->args[i], &vals[i])) return false;
    return true;
}

static bool call_namespace(ct_render *r, const ct_expr *e, jv *v, jv *out) {
    *out = ct_new_dict(r, !strcmp(e->name, "dict") ? V_DICT : V_NS);
    if (out->k == V_NONE) return ct_oom(r, e->line);
    for (int i = 0; i < e->n_args; i++) {
        if (!e->kw[i]) {
            if (v[i].k != V_DICT && v[i].k != V_NS)
                return ct_fail(r, e->line, KILN_ERR_PARSE, "%s(): positional arguments must be mappings", e->name);
            for (size_t k = 0; k < v[i].d->n; k++)
                if (!ct_dict_set(r, e->line, out->d, v[i].d->key[k], v[i].d->val[k])) return false;
            continue;
        }
        if (out->k == V_NS && e->kw[i][0] == '_')
            return ct_fail(r, e->line, KILN_ERR_PARSE, "namespace attributes cannot start with '_' ('%s')", e->kw[i]);
        if (!ct_dict_set(r, e->line, out->d, jv_str(e->kw[i], strlen(e->kw[i])), v[i])) return false;
    }
    return true;
}

static bool call_range(ct_render *r, const ct_expr *e, jv *v, jv *out) {
    int64_t a = 0, b, s = 1;
    int n = e->n_args;
    for (int i = 0; i < n; i++)
        if (!is_int(v[i]) || e->kw[i]) return ct_fail(r, e->line, KILN_ERR_PARSE, "range() takes integer arguments");
    if (n < 1 || n > 3) return ct_fail(r, e->line, KILN_ERR_PARSE, "range() takes 1 to 3 arguments");
    if (n == 1) b = ival(v[0]);
    else a = ival(v[0]), b = ival(v[1]);
    if (n == 3) s = ival(v[2]);
    if (s == 0) return ct_fail(r, e->line, KILN_ERR_PARSE, "range() step must not be zero");
    /* exact count in unsigned arithmetic (b - a may not fit int64) */
    uint64_t span = s > 0 ? (b > a ? (uint64_t)b - (uint64_t)a : 0) : (a > b ? (uint64_t)a - (uint64_t)b : 0);
    uint64_t step_u = s > 0 ? (uint64_t)s : -(uint64_t)s;
    uint64_t count = span / step_u + (span % step_u != 0);
    if (count > MAX_RANGE)
        return ct_fail(r, e->line, KILN_ERR_INVALID_ARG, "range() of more than %d items", MAX_RANGE);
    size_t n_items = (size_t)count;
    *out = ct_new_list(r, n_items);
    if (out->k != V_LIST) return ct_oom(r, e->line);
    /* by count: a + k*s stays between a and b, so nothing overflows */
    for (size_t k = 0; k < n_items; k++) out->l->v[out->l->n++] = jv_int((int64_t)((uint64_t)a + (uint64_t)k * (uint64_t)s));
    return true;
}

static bool eval_call(ct_render *r, const ct_expr *e, jv *out) {
    jv v[32];
    if (!eval_args(r, e, v)) return false;
    if (!strcmp(e->name, "raise_exception")) {
        jv msg = jv_str("", 0);
        if (e->n_args && !ct_to_str(r, e->line, v[0], &msg)) return false;
        ct_fail(r, e->line, KILN_ERR_INVALID_ARG, "raise_exception: %.*s", (int)(msg.n > 600 ? 600 : msg.n), msg.s);
        kiln_err_hint(r->err, "the template refuses this conversation; change the messages");
        return false;
    }
    if (!strcmp(e->name, "namespace") || !strcmp(e->name, "dict")) return call_namespace(r, e, v, out);
    if (!strcmp(e->name, "range")) return call_range(r, e, v, out);
    if (!strcmp(e->name, "strftime_now")) { /* transformers: datetime.now().strftime(format), local time */
        char fmt[128], buf[256];
        if (e->n_args != 1 || v[0].k != V_STR || v[0].n >= sizeof fmt)
            return ct_fail(r, e->line, KILN_ERR_PARSE, "strftime_now() takes one format string (under 128 bytes)");
        memcpy(fmt, v[0].s, v[0].n);
        fmt[v[0].n] = 0;
        time_t now = time(NULL);
        struct tm tm;
        size_t k = localtime_r(&now, &tm) ? strftime(buf, sizeof buf, fmt, &tm) : 0;
        return ct_str_new(r, e->line, buf, k, out);
    }
    return ct_fail(r, e->line, KILN_ERR_UNSUPPORTED, "function '%s' is not supported", e->name);
}

static bool eval_seq(ct_render *r, const ct_expr *e, jv *out) {
    if (e->k == E_LIST) {
        *out = ct_new_list(r, (size_t)e->n_args);
        if (out->k != V_LIST) return ct_oom(r, e->line);
        for (int i = 0; i < e->n_args; i++) {
            jv v;
            if (!eval(r, e->args[i], &v) || !ct_list_push(r, e->line, out->l, v)) return false;
        }
        return true;
    }
    *out = ct_new_dict(r, V_DICT);
    if (out->k != V_DICT) return ct_oom(r, e->line);
    for (int i = 0; i + 1 < e->n_args; i += 2) {
        jv k, v;
        if (!eval(r, e->args[i], &k) || !eval(r, e->args[i + 1], &v) || !ct_dict_set(r, e->line, out->d, k, v)) return false;
    }
    return true;
}

static bool eval_cmp(ct_render *r, const ct_expr *e, jv a, jv b, jv *out) {
    bool res;
    int c;
    if (!ct_charge(r, e->line, size_of(a) + size_of(b))) return false;
    switch (e->op) {
    case OP_EQ: res = ct_equal(a, b); break;
    case OP_NE: res = !ct_equal(a, b); break;
    case OP_IN:
    case OP_NOTIN:
        if (!ct_contains(r, e->line, a, b, &res)) return false;
        if (e->op == OP_NOTIN) res = !res;
        break;
    default:
        if (!ct_compare(r, e->line, a, b, op_text(e->op), &c)) return false;
        res = e->op == OP_LT ? c < 0 : e->op == OP_LE ? c <= 0 : e->op == OP_GT ? c > 0 : c >= 0;
    }
    *out = jv_bool(res);
    return true;
}

static bool eval(ct_render *r, const ct_expr *e, jv *out) {
    if (!step(r, e->line)) return false;
    jv a, b, c, args[32];
    switch (e->k) {
    case E_LIT: *out = e->lit; return true;
    case E_NAME: *out = lookup(r, e->name); return true;
    case E_LIST: case E_DICT: return eval_seq(r, e, out);
    case E_ATTR: return eval(r, e->a, &a) && get_attr(r, e->line, a, e->name, out);
    case E_ITEM: return eval(r, e->a, &a) && eval(r, e->b, &b) && get_item(r, e->line, a, b, out);
    case E_SLICE: {
        jv none = jv_none();
        a = b = c = none;
        jv obj;
        if (!eval(r, e->a, &obj) || (e->b && !eval(r, e->b, &a)) || (e->c && !eval(r, e->c, &b)) ||
            (e->args[0] && !eval(r, e->args[0], &c)))
            return false;
        return get_slice(r, e, obj, &a, &b, &c, out);
    }
    case E_CALL: return eval_call(r, e, out);
    case E_METHOD:
        return eval(r, e->a, &a) && eval_args(r, e, args) && ct_call_method(r, e, a, args, e->kw, e->n_args, out);
    case E_FILTER:
        return eval(r, e->a, &a) && eval_args(r, e, args) && ct_call_filter(r, e, a, args, e->kw, e->n_args, out);
    case E_TEST: {
        bool t;
        if (!eval(r, e->a, &a) || !eval_args(r, e, args) || !ct_call_test(r, e, a, args, e->n_args, &t)) return false;
        *out = jv_bool(e->op ? !t : t);
        return true;
    }
    case E_NEG:
    case E_POS:
        if (!eval(r, e->a, &a)) return false;
        if (a.k == V_FLOAT) return *out = jv_float(e->k == E_NEG ? -a.f : a.f), true;
        if (!is_int(a)) return ct_fail(r, e->line, KILN_ERR_PARSE, "bad operand type for unary %c: '%s'", e->k == E_NEG ? '-' : '+', ct_type_name(a));
        if (e->k == E_NEG && ival(a) == INT64_MIN) return ct_fail(r, e->line, KILN_ERR_INVALID_ARG, "integer overflow");
        *out = jv_int(e->k == E_NEG ? -ival(a) : ival(a));
        return true;
    case E_NOT: return eval(r, e->a, &a) && (*out = jv_bool(!ct_truthy(a)), true);
    case E_AND:
    case E_OR:
        if (!eval(r, e->a, &a)) return false;
        if (ct_truthy(a) == (e->k == E_OR)) return *out = a, true;
        return eval(r, e->b, out);
    case E_BIN: return eval(r, e->a, &a) && eval(r, e->b, &b) && arith(r, e, a, b, out);
    case E_CMP: return eval(r, e->a, &a) && eval(r, e->b, &b) && eval_cmp(r, e, a, b, out);
    case E_COND:
        if (!eval(r, e->b, &c)) return false;
        if (ct_truthy(c)) return eval(r, e->a, out);
        if (e->c) return eval(r, e->c, out);
        *out = jv_undef("else", 4);
        return true;
    }
    return ct_fail(r, e->line, KILN_ERR_INTERNAL, "unknown expression kind %d", (int)e->k);
}

/* ---- statements ---- */

static bool emit(ct_render *r, int line, const char *p, size_t n) {
    size_t have = r->out->len - r->out_start;
    if (n > r->lim.max_output || have > r->lim.max_output - n)
        return ct_fail(r, line, KILN_ERR_INVALID_ARG, "the rendered text exceeds %zu bytes", r->lim.max_output);
    if (n && !kiln_buf_append(r->out, p, n)) return ct_oom(r, line);
    return true;
}

static bool exec_body(ct_render *r, const ct_node *n);

static bool bind_targets(ct_render *r, const ct_node *n, jv item) {
    if (n->n_target == 1) return assign(r, n->line, n->target[0], item);
    if (item.k != V_LIST || item.l->n != (size_t)n->n_target)
        return ct_fail(r, n->line, KILN_ERR_PARSE, "cannot unpack %s into %d loop variables", ct_type_name(item), n->n_target);
    for (int i = 0; i < n->n_target; i++)
        if (!assign(r, n->line, n->target[i], item.l->v[i])) return false;
    return true;
}

/* The items a for loop visits: the iterable as a list, filtered by its `if`. */
static bool loop_items(ct_render *r, const ct_node *n, jv *items) {
    jv it;
    if (!eval(r, n->e, &it)) return false;
    if (it.k != V_LIST && it.k != V_DICT && it.k != V_STR && it.k != V_UNDEF)
        return ct_fail(r, n->line, KILN_ERR_PARSE, "'%s' object is not iterable", ct_type_name(it));
    if (!ct_to_list(r, n->line, it, items)) return false;
    if (!n->filter) return true;
    jv kept = ct_new_list(r, 0);
    if (kept.k != V_LIST) return ct_oom(r, n->line);
    ct_scope *saved = r->scope;
    for (size_t i = 0; i < items->l->n; i++) {
        jv keep;
        if (!push_scope(r, n->line) || !bind_targets(r, n, items->l->v[i]) || !eval(r, n->filter, &keep)) return false;
        r->scope = saved;
        if (ct_truthy(keep) && !ct_list_push(r, n->line, kept.l, items->l->v[i])) return false;
    }
    *items = kept;
    return true;
}

static bool exec_for(ct_render *r, const ct_node *n) {
    jv items;
    if (!loop_items(r, n, &items)) return false;
    ct_loop *lp = ct_alloc(&r->arena, sizeof *lp);
    if (!lp) return ct_oom(r, n->line);
    lp->items = items.l;
    ct_scope *saved = r->scope;
    bool iterated = false; /* as Jinja: set when a body ends normally, so a body cut by break or
                              continue every time leaves the loop's else to run */
    r->in_loop++;
    for (size_t i = 0; i < items.l->n; i++) {
        if (++r->iters > r->lim.max_iters)
            return ct_fail(r, n->line, KILN_ERR_INVALID_ARG, "loops run more than %llu times", (unsigned long long)r->lim.max_iters);
        lp->index0 = (int64_t)i;
        if (!push_scope(r, n->line) || !bind_targets(r, n, items.l->v[i]) ||
            !assign(r, n->line, "loop", (jv){.k = V_LOOP, .lp = lp}) || !exec_body(r, n->body))
            return false;
        r->scope = saved;
        int ctl = r->loop_ctl;
        r->loop_ctl = 0;
        iterated |= ctl == 0;
        if (ctl == 1) break;
    }
    r->in_loop--;
    if (iterated || !n->orelse) return true;
    if (!push_scope(r, n->line)) return false; /* the else block's `set`s stay in it, as in Jinja */
    bool ok = exec_body(r, n->orelse);
    r->scope = saved;
    return ok;
}

static bool exec_set(ct_render *r, const ct_node *n) {
    jv v;
    if (n->k == S_SETBLOCK) {
        kiln_buf cap = {0}, *saved = r->out;
        size_t saved_start = r->out_start;
        r->out = &cap;
        r->out_start = 0;
        bool ok = exec_body(r, n->body);
        r->out = saved;
        r->out_start = saved_start;
        ok = ok && ct_str_new(r, n->line, cap.data ? (const char *)cap.data : "", cap.len, &v);
        kiln_buf_free(&cap);
        return ok && assign(r, n->line, n->target[0], v);
    }
    if (!eval(r, n->e, &v)) return false;
    if (n->k == S_SET) return assign(r, n->line, n->target[0], v);
    jv ns = lookup(r, n->target[0]);
    if (ns.k != V_NS)
        return ct_fail(r, n->line, KILN_ERR_PARSE, "cannot set '%s.%s': '%s' is not a namespace", n->target[0], n->target[1], n->target[0]);
    if (n->target[1][0] == '_')
        return ct_fail(r, n->line, KILN_ERR_PARSE, "namespace attributes cannot start with '_' ('%s')", n->target[1]);
    return ct_dict_set(r, n->line, ns.d, jv_str(n->target[1], strlen(n->target[1])), v);
}

static bool exec_node(ct_render *r, const ct_node *n) {
    jv v;
    switch (n->k) {
    case S_TEXT: return emit(r, n->line, n->text, n->len);
    case S_OUT: return eval(r, n->e, &v) && ct_to_str(r, n->line, v, &v) && emit(r, n->line, v.s, v.n);
    case S_IF:
        if (!eval(r, n->e, &v)) return false;
        return exec_body(r, ct_truthy(v) ? n->body : n->orelse);
    case S_FOR: return exec_for(r, n);
    case S_SET: case S_SETATTR: case S_SETBLOCK: return exec_set(r, n);
    case S_BREAK:
    case S_CONTINUE:
        if (!r->in_loop) return ct_fail(r, n->line, KILN_ERR_PARSE, "'%s' outside a loop", n->k == S_BREAK ? "break" : "continue");
        r->loop_ctl = n->k == S_BREAK ? 1 : 2;
        return true;
    case S_BLOCK: return exec_body(r, n->body);
    }
    return ct_fail(r, n->line, KILN_ERR_INTERNAL, "unknown statement kind %d", (int)n->k);
}

static bool exec_body(ct_render *r, const ct_node *n) {
    for (; n && !r->loop_ctl; n = n->next)
        if (!step(r, n->line) || !exec_node(r, n)) return false;
    return true;
}

/* ---- entry points ---- */

static bool add_messages(ct_render *r, const kiln_chat_message *msgs, size_t n) {
    jv list = ct_new_list(r, n);
    if (list.k != V_LIST) return ct_oom(r, 0);
    for (size_t i = 0; i < n; i++) {
        jv d = ct_new_dict(r, V_DICT);
        if (d.k != V_DICT || !ct_dict_set(r, 0, d.d, jv_str("role", 4), jv_str(msgs[i].role, strlen(msgs[i].role))) ||
            !ct_dict_set(r, 0, d.d, jv_str("content", 7), jv_str(msgs[i].content, strlen(msgs[i].content))))
            return ct_oom(r, 0);
        if (!ct_list_push(r, 0, list.l, d)) return false;
    }
    return assign(r, 0, "messages", list);
}

static kiln_status check_messages(const kiln_chat_message *msgs, size_t n, kiln_error *err) {
    if (n && !msgs) return kiln_err(err, KILN_ERR_INVALID_ARG, "chat: messages is NULL");
    for (size_t i = 0; i < n; i++) {
        const char *f[2] = {msgs[i].role, msgs[i].content};
        for (int k = 0; k < 2; k++) {
            size_t bad;
            if (!f[k]) return kiln_err(err, KILN_ERR_INVALID_ARG, "chat: message %zu has no %s", i, k ? "content" : "role");
            if (!ct_valid_utf8(f[k], strlen(f[k]), &bad))
                return kiln_err(err, KILN_ERR_INVALID_ARG, "chat: message %zu: %s is not valid UTF-8 (byte %zu)", i,
                                k ? "content" : "role", bad);
        }
    }
    return KILN_OK;
}

kiln_status kiln_chat_template_render(const kiln_chat_template *t, const kiln_chat_message *msgs, size_t n_msgs,
                                      const kiln_chat_var *vars, size_t n_vars, bool add_generation_prompt,
                                      const kiln_chat_limits *limits, kiln_buf *out, kiln_error *err) {
    kiln_err_clear(err);
    if (!t || !out) return kiln_err(err, KILN_ERR_INVALID_ARG, "chat: template or output is NULL");
    kiln_status st = check_messages(msgs, n_msgs, err);
    if (st != KILN_OK) return st;
    ct_render r = {.out = out, .out_start = out->len, .err = err};
    if (limits) r.lim = *limits;
    else kiln_chat_limits_default(&r.lim);
    r.arena.limit = r.lim.max_memory;
    bool ok = push_scope(&r, 0) && add_messages(&r, msgs, n_msgs) &&
              assign(&r, 0, "add_generation_prompt", jv_bool(add_generation_prompt)) &&
              assign(&r, 0, "tools", jv_none()) && assign(&r, 0, "documents", jv_none());
    for (size_t i = 0; ok && i < n_vars; i++)
        if (vars[i].name && vars[i].value)
            ok = assign(&r, 0, vars[i].name, jv_str(vars[i].value, strlen(vars[i].value)));
    ok = ok && exec_body(&r, t->body);
    ct_arena_free(&r.arena);
    if (ok) return KILN_OK;
    out->len = r.out_start;
    return err->code != KILN_OK ? err->code : kiln_err(err, KILN_ERR_INTERNAL, "chat template: render failed");
}

/* ---- the engine's chat section ---- */

static kiln_status section_strings(kiln_chat_section *c, json_t *root, kiln_error *err) {
    json_t *sp = json_object_get(root, "special_tokens");
    if (sp && !json_is_object(sp)) return kiln_err(err, KILN_ERR_FORMAT, "chat section: special_tokens is not an object");
    size_t total = 0;
    const char *k;
    json_t *v;
    json_object_foreach(sp, k, v) {
        if (!json_is_string(v) || json_string_length(v) > 4096 || strlen(k) > 64 || strlen(k) == 0)
            return kiln_err(err, KILN_ERR_FORMAT, "chat section: special token '%.64s' is not a string of at most 4096 bytes", k);
        if (c->n_vars == KILN_CHAT_MAX_SPECIAL)
            return kiln_err(err, KILN_ERR_FORMAT, "chat section: more than %d special tokens", KILN_CHAT_MAX_SPECIAL);
        total += strlen(k) + json_string_length(v) + 2;
        c->n_vars++;
    }
    c->strings = malloc(total ? total : 1);
    if (!c->strings) return kiln_err(err, KILN_ERR_NOMEM, "chat section: out of memory");
    char *p = c->strings;
    size_t i = 0;
    json_object_foreach(sp, k, v) {
        size_t kl = strlen(k), vl = json_string_length(v), bad;
        if (memchr(json_string_value(v), 0, vl) || !ct_valid_utf8(json_string_value(v), vl, &bad))
            return kiln_err(err, KILN_ERR_FORMAT, "chat section: special token '%s' holds a NUL byte", k);
        memcpy(p, k, kl + 1);
        c->vars[i].name = p;
        p += kl + 1;
        memcpy(p, json_string_value(v), vl + 1);
        c->vars[i++].value = p;
        p += vl + 1;
    }
    return KILN_OK;
}

kiln_status kiln_chat_section_load(const uint8_t *data, size_t len, kiln_chat_section **out, kiln_error *err) {
    *out = NULL;
    if (len > 4 * (size_t)KILN_CHAT_MAX_TEMPLATE)
        return kiln_err(err, KILN_ERR_FORMAT, "chat section: %zu bytes, more than %u", len, 4 * KILN_CHAT_MAX_TEMPLATE);
    json_error_t je;
    json_t *root = json_loadb((const char *)data, len, JSON_REJECT_DUPLICATES, &je);
    if (!root || !json_is_object(root)) {
        json_decref(root);
        return kiln_err(err, KILN_ERR_FORMAT, "chat section: not a JSON object (%s)", je.text);
    }
    kiln_chat_section *c = calloc(1, sizeof *c);
    kiln_status st;
    json_t *t = json_object_get(root, "template");
    if (!c) st = kiln_err(err, KILN_ERR_NOMEM, "chat section: out of memory");
    else if (!json_is_string(t)) st = kiln_err(err, KILN_ERR_FORMAT, "chat section: \"template\" is not a string");
    else if ((st = section_strings(c, root, err)) == KILN_OK)
        st = kiln_chat_template_parse(json_string_value(t), json_string_length(t), &c->tmpl, err);
    json_decref(root);
    if (st != KILN_OK) {
        kiln_chat_section_free(c);
        return st;
    }
    *out = c;
    return KILN_OK;
}

void kiln_chat_section_free(kiln_chat_section *c) {
    if (!c) return;
    kiln_chat_template_free(c->tmpl);
    free(c->strings);
    free(c->error);
    free(c);
}

kiln_status kiln_chat_section_render(const kiln_chat_section *c, const kiln_chat_message *msgs, size_t n,
                                     bool add_generation_prompt, kiln_buf *out, kiln_error *err) {
    if (!c->tmpl) {
        kiln_err(err, KILN_ERR_UNSUPPORTED, "this runtime cannot render the engine's chat template: %s",
                 c->error ? c->error : "no template");
        return kiln_err_hint(err, "upgrade the runtime, or recompile the engine with this kiln");
    }
    return kiln_chat_template_render(c->tmpl, msgs, n, c->vars, c->n_vars, add_generation_prompt, NULL, out, err);
}
