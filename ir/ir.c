/*
 * ir.c — graph storage, builder with shape inference, and the rewrite
 * helpers passes use (use counts, replace uses, dead-code removal).
 *
 * Shape inference lives in one place (kiln_ir_infer); the builder calls it
 * to make output values and the verifier calls it again to check every op.
 */
#include "kiln_ir.h"

#include <stdlib.h>
#include <string.h>

kiln_graph *kiln_graph_new(void) {
    kiln_graph *g = calloc(1, sizeof *g);
    if (!g) return NULL;
    g->tokens = g->positions = g->logits = -1;
    return g;
}

void kiln_graph_free(kiln_graph *g) {
    if (!g) return;
    for (int v = 0; v < g->n_values; v++) {
        free(g->values[v].parts);
        free(g->values[v].row_mul);
        free(g->values[v].col_mul);
        free(g->values[v].owned);
    }
    free(g->values);
    free(g->ops);
    free(g->kv_ckpt_scales);
    free(g);
}

static int add_value(kiln_graph *g, const kiln_value *v, kiln_error *err) {
    if (g->n_values == g->cap_values) {
        int cap = g->cap_values ? g->cap_values * 2 : 64;
        kiln_value *nv = realloc(g->values, (size_t)cap * sizeof *nv);
        if (!nv) {
            kiln_err(err, KILN_ERR_NOMEM, "IR: out of memory adding value '%s'", v->name);
            return -1;
        }
        g->values = nv;
        g->cap_values = cap;
    }
    g->values[g->n_values] = *v;
    return g->n_values++;
}

static void set_name(kiln_value *v, const char *name) {
    snprintf(v->name, sizeof v->name, "%s", name ? name : "");
}

int kiln_ir_input(kiln_graph *g, const char *name, kiln_dtype dt, int ndim, const int64_t *shape, kiln_error *err) {
    kiln_value v = {.kind = KILN_VALUE_INPUT, .dtype = dt, .ndim = ndim, .producer = -1, .slot = -1};
    memcpy(v.shape, shape, (size_t)ndim * sizeof *shape);
    set_name(&v, name);
    return add_value(g, &v, err);
}

int kiln_ir_weight(kiln_graph *g, const char *name, kiln_dtype dt, int ndim, const int64_t *shape,
                   const void *src, kiln_dtype src_dt, kiln_error *err) {
    kiln_value v = {.kind = KILN_VALUE_WEIGHT, .dtype = dt, .ndim = ndim, .producer = -1, .slot = -1,
                    .src = src, .src_dtype = src_dt};
    memcpy(v.shape, shape, (size_t)ndim * sizeof *shape);
    set_name(&v, name);
    return add_value(g, &v, err);
}

int kiln_ir_weight_owned(kiln_graph *g, const char *name, kiln_dtype dt, int ndim, const int64_t *shape, void *data,
                         kiln_error *err) {
    const int id = kiln_ir_weight(g, name, dt, ndim, shape, data, dt, err);
    if (id < 0) free(data);
    else g->values[id].owned = data;
    return id;
}

int kiln_ir_weight_prequantized(kiln_graph *g, const char *name, kiln_dtype dt, const int64_t shape[2],
                                const kiln_qsrc *q, kiln_error *err) {
    const bool fp8 = kiln_qsrc_is_fp8(q); /* else 4-bit groups */
    const bool dt_ok = q->format == KILN_QSRC_FP8_BLOCK ? dt == KILN_DTYPE_FP8G128 && q->block_n > 0 && q->block_k == 128
                       : fp8                            ? dt == KILN_DTYPE_FP8
                                                        : kiln_quant_bits(dt) == 4;
    if (!dt_ok || !kiln_weight_nbytes(dt, 2, shape) ||
        q->format == KILN_QSRC_NONE) {
        kiln_err(err, KILN_ERR_VERIFY, "pre-quantized weight %s: dtype %s, shape [%lld,%lld]", name,
                 kiln_dtype_name(dt), (long long)shape[0], (long long)shape[1]);
        return -1;
    }
    kiln_value v = {.kind = KILN_VALUE_WEIGHT, .dtype = dt, .ndim = 2, .producer = -1, .slot = -1,
                    .src = q->qweight, .src_dtype = fp8 ? KILN_DTYPE_F8E4M3 : KILN_DTYPE_I32, .qsrc = *q, .shape = {shape[0], shape[1]}};
    set_name(&v, name);
    return add_value(g, &v, err);
}

/* Copy `parts` into a new value's own array (the value owns it once added). */
static int *copy_parts(const int *parts, int n_parts, const char *name, kiln_error *err) {
    int *p = malloc((size_t)n_parts * sizeof *p);
    if (!p) kiln_err(err, KILN_ERR_NOMEM, "IR: out of memory adding packed weight '%s'", name);
    else memcpy(p, parts, (size_t)n_parts * sizeof *p);
    return p;
}

/* Add packed value `v` with its parts array; the array is freed when adding fails. */
static int add_packed(kiln_graph *g, kiln_value *v, const int *parts, const char *name, kiln_error *err) {
    set_name(v, name);
    if (!(v->parts = copy_parts(parts, v->n_parts, name, err))) return -1;
    int id = add_value(g, v, err);
    if (id < 0) free(v->parts);
    return id;
}

/* Is value `part` a plain 2-D weight like `p0` (columns and dtype)? */
static bool part_ok(const kiln_graph *g, int part, const kiln_value *p0) {
    if (part < 0 || part >= g->n_values) return false;
    const kiln_value *p = &g->values[part];
    return p->kind == KILN_VALUE_WEIGHT && p->ndim == 2 && p->shape[1] == p0->shape[1] && p->dtype == p0->dtype &&
           p->pack == KILN_PACK_NONE;
}

int kiln_ir_weight_packed(kiln_graph *g, const char *name, kiln_pack pack, const int *parts, int n_parts,
                          kiln_error *err) {
    if (n_parts < 2 || n_parts > KILN_MAX_PACK || (pack != KILN_PACK_CONCAT_ROWS && pack != KILN_PACK_INTERLEAVE_ROWS) ||
        (pack == KILN_PACK_INTERLEAVE_ROWS && n_parts != 2)) {
        kiln_err(err, KILN_ERR_VERIFY, "packed weight %s: %d parts, pack %d", name, n_parts, (int)pack);
        return -1;
    }
    const kiln_value *p0 = &g->values[parts[0]];
    /* 2-D parts (matrices: rows packed), or 1-D parts concatenated (their biases) */
    const int nd = p0->ndim;
    kiln_value v = {.kind = KILN_VALUE_WEIGHT, .dtype = p0->dtype, .ndim = nd, .producer = -1, .slot = -1,
                    .pack = pack, .n_parts = n_parts};
    v.shape[1] = nd == 2 ? p0->shape[1] : 0;
    for (int i = 0; i < n_parts; i++) {
        const kiln_value *p = &g->values[parts[i]];
        if (p->kind != KILN_VALUE_WEIGHT || (nd != 2 && !(nd == 1 && pack == KILN_PACK_CONCAT_ROWS)) ||
            p->ndim != nd || (nd == 2 && p->shape[1] != p0->shape[1]) || p->dtype != p0->dtype ||
            p->pack != KILN_PACK_NONE || (pack == KILN_PACK_INTERLEAVE_ROWS && p->shape[0] != p0->shape[0])) {
            kiln_err(err, KILN_ERR_VERIFY, "packed weight %s: part %s does not match %s", name, p->name, p0->name);
            return -1;
        }
        v.shape[0] += p->shape[0];
    }
    return add_packed(g, &v, parts, name, err);
}

int kiln_ir_weight_stacked(kiln_graph *g, const char *name, const int *parts, int n_parts, const int64_t shape[3],
                           kiln_error *err) {
    if (n_parts < 1 || n_parts > KILN_MAX_PACK || shape[0] <= 0 || shape[1] <= 0 || shape[2] <= 0 ||
        parts[0] < 0 || parts[0] >= g->n_values) {
        kiln_err(err, KILN_ERR_VERIFY, "stacked weight %s: %d parts", name, n_parts);
        return -1;
    }
    const kiln_value *p0 = &g->values[parts[0]];
    kiln_value v = {.kind = KILN_VALUE_WEIGHT, .dtype = p0->dtype, .ndim = 3, .producer = -1, .slot = -1,
                    .pack = KILN_PACK_CONCAT_ROWS, .n_parts = n_parts, .shape = {shape[0], shape[1], shape[2]}};
    int64_t rows = 0;
    for (int i = 0; i < n_parts; i++) {
        if (!part_ok(g, parts[i], p0) || p0->shape[1] != shape[2]) {
            kiln_err(err, KILN_ERR_VERIFY, "stacked weight %s: part %%%d does not match %s", name, parts[i], p0->name);
            return -1;
        }
        rows += g->values[parts[i]].shape[0];
    }
    if (rows != shape[0] * shape[1]) {
        kiln_err(err, KILN_ERR_VERIFY, "stacked weight %s: %lld rows of parts for [%lld,%lld,%lld]", name,
                 (long long)rows, (long long)shape[0], (long long)shape[1], (long long)shape[2]);
        return -1;
    }
    int id = add_packed(g, &v, parts, name, err);
    if (id >= 0)
        for (int i = 0; i < n_parts; i++) g->values[parts[i]].dead = true;
    return id;
}

kiln_status kiln_ir_weight_scale(kiln_graph *g, int v, float *row_mul, float *col_mul, kiln_error *err) {
    kiln_value *val = v >= 0 && v < g->n_values ? &g->values[v] : NULL;
    const char *why = !val                                      ? "is not a value"
                      : val->kind != KILN_VALUE_WEIGHT          ? "is not a weight"
                      : !val->src || val->pack != KILN_PACK_NONE ? "is packed from others"
                      : val->qsrc.format != KILN_QSRC_NONE      ? "came quantized from the checkpoint"
                      : val->ndim != 1 && val->ndim != 2        ? "is not a vector or a matrix"
                      : row_mul && val->ndim != 2               ? "has no rows to scale"
                      : (row_mul && val->row_mul) || (col_mul && val->col_mul) ? "is scaled already"
                                                                                : NULL;
    if (why) {
        free(row_mul), free(col_mul);
        return kiln_err(err, KILN_ERR_INVALID_ARG, "scaling weight %s: it %s", val ? val->name : "?", why);
    }
    if (row_mul) val->row_mul = row_mul;
    if (col_mul) val->col_mul = col_mul;
    val->mul_cols = val->ndim == 2 ? val->shape[1] : val->shape[0];
    return KILN_OK;
}

/* ---- shape inference: see common/op_infer.c ---- */

kiln_status kiln_ir_infer(const kiln_graph *g, kiln_op_kind kind, const int *in, int n_in,
                          const kiln_op_attrs *a, kiln_value *outs, kiln_error *err) {
    kiln_tensor_desc d[KILN_MAX_OP_IN], o[KILN_MAX_OP_OUT];
    if (n_in < 0 || n_in > KILN_MAX_OP_IN)
        return kiln_err(err, KILN_ERR_VERIFY, "%s: %d inputs", kiln_op_name(kind), n_in);
    for (int i = 0; i < n_in; i++) {
        if (in[i] < 0 || in[i] >= g->n_values)
            return kiln_err(err, KILN_ERR_VERIFY, "%s: input %d is not a value (%d)", kiln_op_name(kind), i, in[i]);
        const kiln_value *v = &g->values[in[i]];
        if (v->dead) return kiln_err(err, KILN_ERR_VERIFY, "%s: input %%%d is dead", kiln_op_name(kind), in[i]);
        d[i] = (kiln_tensor_desc){.id = in[i], .is_weight = v->kind == KILN_VALUE_WEIGHT, .dtype = v->dtype,
                                  .ndim = v->ndim, .name = v->name};
        memcpy(d[i].shape, v->shape, sizeof v->shape);
    }
    kiln_status st = kiln_op_infer(kind, d, n_in, a, o, err);
    if (st != KILN_OK) return st;
    for (int i = 0; i < kiln_op_n_out(kind); i++) {
        memset(&outs[i], 0, sizeof outs[i]);
        outs[i].kind = KILN_VALUE_ACT;
        outs[i].dtype = o[i].dtype;
        outs[i].ndim = o[i].ndim;
        memcpy(outs[i].shape, o[i].shape, sizeof outs[i].shape);
        outs[i].producer = -1;
        outs[i].slot = -1;
    }
    return KILN_OK;
}

int kiln_ir_op_at(kiln_graph *g, int at, kiln_op_kind kind, const int *in, int n_in, const kiln_op_attrs *attrs,
                  const char *label, int *out_ids, kiln_error *err) {
    kiln_op_attrs none = {0};
    if (!attrs) attrs = &none;
    /* the label may point into g->values (a pass naming the fused op after a
     * value), which add_value can move: copy it first */
    char label_copy[KILN_NAME_MAX];
    if (label) {
        snprintf(label_copy, sizeof label_copy, "%s", label);
        label = label_copy;
    }
    kiln_value outs[KILN_MAX_OP_OUT];
    if (n_in > KILN_MAX_OP_IN || kiln_ir_infer(g, kind, in, n_in, attrs, outs, err) != KILN_OK) {
        if (n_in > KILN_MAX_OP_IN) kiln_err(err, KILN_ERR_VERIFY, "%s: too many inputs", kiln_op_name(kind));
        return -1;
    }
    if (g->n_ops == g->cap_ops) {
        int cap = g->cap_ops ? g->cap_ops * 2 : 64;
        kiln_op *no = realloc(g->ops, (size_t)cap * sizeof *no);
        if (!no) {
            kiln_err(err, KILN_ERR_NOMEM, "IR: out of memory adding op %s", kiln_op_name(kind));
            return -1;
        }
        g->ops = no;
        g->cap_ops = cap;
    }
    if (at < 0 || at > g->n_ops) at = g->n_ops;
    kiln_op op = {.kind = kind, .n_in = n_in, .n_out = kiln_op_n_out(kind), .attrs = *attrs};
    memcpy(op.in, in, (size_t)n_in * sizeof *in);
    for (int i = 0; i < op.n_out; i++) {
        if (label) {
            if (op.n_out == 1)
                set_name(&outs[i], label);
            else
                snprintf(outs[i].name, sizeof outs[i].name, "%.*s.%d", KILN_NAME_MAX - 16, label, i);
        }
        int id = add_value(g, &outs[i], err);
        if (id < 0) return -1;
        op.out[i] = id;
        if (out_ids) out_ids[i] = id;
    }
    memmove(&g->ops[at + 1], &g->ops[at], (size_t)(g->n_ops - at) * sizeof *g->ops);
    g->ops[at] = op;
    g->n_ops++;
    kiln_ir_reindex(g);
    return at;
}

int kiln_ir_op(kiln_graph *g, kiln_op_kind kind, const int *in, int n_in, const kiln_op_attrs *attrs,
               const char *label, int *out_ids, kiln_error *err) {
    return kiln_ir_op_at(g, -1, kind, in, n_in, attrs, label, out_ids, err);
}

int kiln_ir_op1(kiln_graph *g, kiln_op_kind kind, const int *in, int n_in, const kiln_op_attrs *attrs,
                const char *label, kiln_error *err) {
    int outs[KILN_MAX_OP_OUT];
    if (kiln_ir_op(g, kind, in, n_in, attrs, label, outs, err) < 0) return -1;
    return outs[0];
}

/* ---- queries and rewrites ---- */

int kiln_ir_use_count(const kiln_graph *g, int v) {
    int n = g->logits == v;
    for (int i = 0; i < g->n_ops; i++) {
        const kiln_op *op = &g->ops[i];
        if (op->dead) continue;
        for (int j = 0; j < op->n_in; j++) n += op->in[j] == v;
    }
    return n;
}

void kiln_ir_replace_uses(kiln_graph *g, int from, int to) {
    if (g->logits == from) g->logits = to;
    for (int i = 0; i < g->n_ops; i++) {
        kiln_op *op = &g->ops[i];
        if (op->dead) continue;
        for (int j = 0; j < op->n_in; j++)
            if (op->in[j] == from) op->in[j] = to;
    }
}

void kiln_ir_reindex(kiln_graph *g) {
    for (int v = 0; v < g->n_values; v++)
        if (g->values[v].kind == KILN_VALUE_ACT) g->values[v].producer = -1;
    for (int i = 0; i < g->n_ops; i++)
        for (int j = 0; j < g->ops[i].n_out; j++) g->values[g->ops[i].out[j]].producer = i;
}

int kiln_ir_dce(kiln_graph *g) {
    /* Walk backwards: an op is live when any output is used by a live op or is the graph output. */
    int *uses = calloc((size_t)g->n_values, sizeof *uses);
    if (!uses) return 0; /* nothing removed is still a valid graph */
    if (g->logits >= 0) uses[g->logits]++;
    int removed = 0;
    for (int i = g->n_ops - 1; i >= 0; i--) {
        kiln_op *op = &g->ops[i];
        bool live = false;
        for (int j = 0; j < op->n_out && !op->dead; j++) live |= uses[op->out[j]] > 0;
        if (!live) {
            op->dead = true;
            continue;
        }
        for (int j = 0; j < op->n_in; j++) uses[op->in[j]]++;
    }
    /* Compact the op list and mark unreferenced values dead. */
    int k = 0;
    for (int i = 0; i < g->n_ops; i++) {
        if (g->ops[i].dead) {
            for (int j = 0; j < g->ops[i].n_out; j++) g->values[g->ops[i].out[j]].dead = true;
            removed++;
            continue;
        }
        g->ops[k++] = g->ops[i];
    }
    g->n_ops = k;
    for (int v = 0; v < g->n_values; v++)
        if (g->values[v].kind == KILN_VALUE_WEIGHT && uses[v] == 0) g->values[v].dead = true;
    free(uses);
    kiln_ir_reindex(g);
    return removed;
}

int kiln_ir_count_ops(const kiln_graph *g, kiln_op_kind kind) {
    int n = 0;
    for (int i = 0; i < g->n_ops; i++) n += !g->ops[i].dead && g->ops[i].kind == kind;
    return n;
}
