/*
 * chat_internal.h — private declarations of the chat-template interpreter,
 * shared by its three files:
 *
 *   chat_template.c  lexer and parser: template source → a tree of nodes
 *   chat_eval.c      the renderer: statements, expressions, scopes, caps
 *   chat_value.c     values and builtins: str(), tojson, filters, tests,
 *                    string methods with Python's semantics
 *
 * Every allocation of a parse or a render goes to one arena (ct_arena), which
 * counts its bytes against a cap and is freed at once at the end: values
 * never need freeing one by one, and a hostile template cannot take more
 * memory than the cap.
 */
#ifndef KILN_CHAT_INTERNAL_H
#define KILN_CHAT_INTERNAL_H

#include <stdarg.h>

#include "kiln_chat.h"

/* ---- arena ---- */
typedef struct ct_block ct_block;
typedef struct ct_arena {
    ct_block *head;
    size_t used;  /* bytes handed out, all blocks */
    size_t limit; /* cap on used */
} ct_arena;

void *ct_alloc(ct_arena *a, size_t n); /* zeroed; NULL past the cap or when out of memory */
char *ct_strdup(ct_arena *a, const char *p, size_t n); /* NUL-terminated copy */
void ct_arena_free(ct_arena *a);

/* ---- values ---- */
typedef enum ct_kind { V_UNDEF, V_NONE, V_BOOL, V_INT, V_FLOAT, V_STR, V_LIST, V_DICT, V_NS, V_LOOP } ct_kind;

typedef struct ct_list ct_list;
typedef struct ct_dict ct_dict;
typedef struct ct_loop ct_loop;

typedef struct jv {
    ct_kind k;
    size_t n; /* V_STR: bytes; V_UNDEF: length of the name */
    union {
        bool b;
        int64_t i;
        double f;
        const char *s; /* V_STR: UTF-8 bytes (not NUL-terminated); V_UNDEF: the name that was missing */
        ct_list *l;
        ct_dict *d;    /* V_DICT, V_NS (a namespace: a dict that `set ns.x = ...` may change) */
        ct_loop *lp;
    };
} jv;

/* Containers record how deeply they nest (1 = holds no container), capped at
 * CT_MAX_VALUE_DEPTH so that str(), ==, tojson... never recurse without bound
 * on a value a template built in a loop ({% set x = [x] %}). */
#define CT_MAX_VALUE_DEPTH 64
struct ct_list {
    size_t n, cap;
    jv *v;
    int depth;
};
struct ct_dict {
    size_t n, cap;
    jv *key, *val;
    int depth;
};
struct ct_loop {
    const ct_list *items;
    int64_t index0;
};

static inline jv jv_undef(const char *name, size_t n) { return (jv){.k = V_UNDEF, .n = n, .s = name}; }
static inline jv jv_none(void) { return (jv){.k = V_NONE}; }
static inline jv jv_bool(bool b) { return (jv){.k = V_BOOL, .b = b}; }
static inline jv jv_int(int64_t i) { return (jv){.k = V_INT, .i = i}; }
static inline jv jv_float(double f) { return (jv){.k = V_FLOAT, .f = f}; }
static inline jv jv_str(const char *s, size_t n) { return (jv){.k = V_STR, .n = n, .s = s}; }

/* ---- the tree ---- */
typedef enum ct_ekind {
    E_LIT, E_NAME, E_LIST, E_DICT, E_ATTR, E_ITEM, E_SLICE, E_CALL, E_METHOD, E_FILTER, E_TEST,
    E_NEG, E_POS, E_NOT, E_AND, E_OR, E_BIN, E_CMP, E_COND
} ct_ekind;

typedef enum ct_op {
    OP_ADD, OP_SUB, OP_MUL, OP_DIV, OP_FLOORDIV, OP_MOD, OP_POW, OP_CONCAT,
    OP_EQ, OP_NE, OP_LT, OP_LE, OP_GT, OP_GE, OP_IN, OP_NOTIN
} ct_op;

typedef struct ct_expr ct_expr;
struct ct_expr {
    ct_ekind k;
    int line;
    int op;           /* E_BIN/E_CMP: ct_op; E_TEST: 1 when negated (`is not`) */
    jv lit;           /* E_LIT */
    const char *name; /* E_NAME, E_ATTR, E_CALL, E_METHOD, E_FILTER, E_TEST (NUL-terminated) */
    ct_expr *a, *b, *c; /* operands; E_SLICE: a[b:c:args[0]] */
    ct_expr **args;   /* E_LIST items, E_DICT keys/values interleaved, call/filter/test arguments */
    const char **kw;  /* per argument: keyword name or NULL */
    int n_args;
    int depth;        /* levels of expressions below and with this one (capped: eval recurses that deep) */
};

#define CT_MAX_EXPR_DEPTH 256 /* a + b + c... and x|f|g... chains nest without parentheses */

typedef enum ct_skind { S_TEXT, S_OUT, S_IF, S_FOR, S_SET, S_SETATTR, S_SETBLOCK, S_BREAK, S_CONTINUE, S_BLOCK } ct_skind;

#define CT_MAX_TARGETS 4
typedef struct ct_node ct_node;
struct ct_node {
    ct_skind k;
    int line;
    const char *text; /* S_TEXT */
    size_t len;
    ct_expr *e;       /* S_OUT, S_IF condition, S_FOR iterable, S_SET/S_SETATTR value */
    ct_expr *filter;  /* S_FOR: the `if` clause */
    const char *target[CT_MAX_TARGETS]; /* S_FOR loop variables; S_SET*: [0] name, [1] attribute */
    int n_target;
    ct_node *body, *orelse; /* S_IF: then/else (an elif is an S_IF in orelse); S_FOR: body/else */
    ct_node *next;
};

struct kiln_chat_template {
    ct_arena arena;
    ct_node *body;
};

/* Parse (chat_template.c). */
kiln_status ct_parse(const char *src, size_t len, ct_arena *a, ct_node **out, kiln_error *err);
bool ct_known_filter(const char *name);
bool ct_known_test(const char *name);
bool ct_known_function(const char *name);
bool ct_known_method(const char *name);

/* ---- rendering state (chat_eval.c) ---- */
typedef struct ct_scope ct_scope;
typedef struct ct_render {
    ct_arena arena;
    kiln_buf *out;
    size_t out_start;
    kiln_error *err;
    kiln_chat_limits lim;
    uint64_t steps, iters;
    ct_scope *scope;
    int loop_ctl;       /* 1 = break, 2 = continue pending */
    int in_loop;
} ct_render;

/* Record an error ("chat template: line N: ...") and return false. */
bool ct_fail(ct_render *r, int line, kiln_status code, const char *fmt, ...) KILN_PRINTF(4, 5);
bool ct_oom(ct_render *r, int line);
/* Count `units` of work against max_steps: a builtin that scans a list, a
 * dict or a long string charges its size, so a loop over it cannot hang. */
bool ct_charge(ct_render *r, int line, uint64_t units);

/* ---- values and builtins (chat_value.c) ---- */
bool ct_truthy(jv v);
const char *ct_type_name(jv v);
bool ct_equal(jv a, jv b);
/* str(v) as Python prints it (undefined → ""), appended to b. */
bool ct_to_str_buf(jv v, kiln_buf *b);
bool ct_to_str(ct_render *r, int line, jv v, jv *out);
bool ct_tojson(ct_render *r, int line, jv v, int indent, bool sort_keys, jv *out);
jv *ct_dict_get(const ct_dict *d, jv key);
bool ct_dict_set(ct_render *r, int line, ct_dict *d, jv key, jv val);
bool ct_list_push(ct_render *r, int line, ct_list *l, jv v);
jv ct_new_list(ct_render *r, size_t cap);
jv ct_new_dict(ct_render *r, ct_kind k);
bool ct_str_new(ct_render *r, int line, const char *p, size_t n, jv *out);
/* Length in code points of valid UTF-8. */
size_t ct_utf8_len(const char *s, size_t n);
bool ct_call_filter(ct_render *r, const ct_expr *e, jv v, jv *args, const char **kw, int n, jv *out);
bool ct_call_test(ct_render *r, const ct_expr *e, jv v, jv *args, int n, bool *out);
bool ct_call_method(ct_render *r, const ct_expr *e, jv self, jv *args, const char **kw, int n, jv *out);

#endif /* KILN_CHAT_INTERNAL_H */
