/*
 * plan.c — reads and checks the plan section (layout in kiln_plan.h).
 *
 * The plan is hostile input like any file: counts are capped, the section
 * size must match them exactly, every index is range-checked, every weight
 * must lie inside the weights section with a byte count that matches its
 * shape, and every op is re-checked with kiln_op_infer against the value
 * table, in order, so executors can index buffers without further checks.
 */
#include "../format/kiln_plan.h"

#include <stdlib.h>
#include <string.h>

#define BAD(...) kiln_err(err, KILN_ERR_FORMAT, "plan: " __VA_ARGS__)

static int32_t rd_i32(const uint8_t *p) { return (int32_t)kiln_rd_u32(p); }

void kiln_plan_free(kiln_plan *p) {
    if (!p) return;
    free(p->slots);
    free(p->values);
    free(p->weights);
    free(p->ops);
    free(p);
}

static kiln_status check_value(const kiln_plan *p, uint32_t i, kiln_error *err) {
    const kiln_plan_value *v = &p->values[i];
    if (v->kind > KILN_PV_ACT) return BAD("value %u has unknown kind %u", i, v->kind);
    if (v->dtype >= KILN_DTYPE_COUNT_ || v->dtype == KILN_DTYPE_I64 || v->dtype == KILN_DTYPE_F8E4M3) /* checkpoints only */
        return BAD("value %u has unknown dtype %u", i, v->dtype);
    if (v->ndim < 1 || v->ndim > KILN_MAX_DIMS) return BAD("value %u has %u dimensions", i, v->ndim);
    for (uint32_t d = 0; d < v->ndim; d++) {
        int64_t s = v->shape[d];
        if (s == 0 || s < KILN_DIM_SEQ || s > (1 << 30)) return BAD("value %u has bad dimension %lld", i, (long long)s);
    }
    if (v->kind == KILN_PV_WEIGHT) {
        if (v->weight < 0 || (uint32_t)v->weight >= p->n_weights) return BAD("value %u names weight %d", i, v->weight);
        const kiln_plan_weight *w = &p->weights[v->weight];
        if (w->dtype != v->dtype || w->ndim != v->ndim || memcmp(w->shape, v->shape, sizeof w->shape) != 0)
            return BAD("value %u does not match weight '%s'", i, w->name);
    } else if (v->weight != -1) {
        return BAD("value %u is not a weight but names weight %d", i, v->weight);
    }
    if (v->kind == KILN_PV_ACT) {
        if (v->slot < 0 || (uint32_t)v->slot >= p->n_slots) return BAD("activation %u has slot %d", i, v->slot);
        const kiln_plan_slot *s = &p->slots[v->slot];
        if (v->ndim != 3 || (int64_t)s->width != v->shape[2] || s->dtype != v->dtype)
            return BAD("activation %u does not fit slot %d", i, v->slot);
    } else if (v->slot != -1) {
        return BAD("value %u is not an activation but has slot %d", i, v->slot);
    }
    return KILN_OK;
}

static kiln_status check_weight(const kiln_plan_weight *w, uint32_t i, uint64_t weights_size, kiln_error *err) {
    if (memchr(w->name, 0, sizeof w->name) == NULL) return BAD("weight %u name is not terminated", i);
    if (w->dtype >= KILN_DTYPE_COUNT_ || w->dtype == KILN_DTYPE_I64 || w->dtype == KILN_DTYPE_F8E4M3 ||
        (w->dtype == KILN_DTYPE_I32 && w->ndim != 1)) /* i32: a permute op's indices */
        return BAD("weight '%s' has unsupported dtype %u", w->name, w->dtype);
    /* vectors, matrices, and stacks of per-expert matrices [E, rows, cols] */
    if (w->ndim < 1 || w->ndim > 3) return BAD("weight '%s' has %u dimensions", w->name, w->ndim);
    for (uint32_t d = 0; d < w->ndim; d++)
        if (w->shape[d] <= 0 || w->shape[d] > (1 << 30))
            return BAD("weight '%s' has bad dimension %lld", w->name, (long long)w->shape[d]);
    for (uint32_t d = w->ndim; d < KILN_MAX_DIMS; d++)
        if (w->shape[d] != 0) return BAD("weight '%s' has data past its dimensions", w->name);
    /* quantized: a matrix whose columns its groups divide (common/quant.c) */
    const uint64_t n = kiln_weight_nbytes((int)w->dtype, (int)w->ndim, w->shape);
    if (n == 0)
        return BAD("weight '%s' cannot be %s with shape [%lld, %lld%s]", w->name, kiln_dtype_name((kiln_dtype)w->dtype),
                   (long long)w->shape[0], (long long)(w->ndim > 1 ? w->shape[1] : 0), w->ndim > 2 ? ", ..." : "");
    if (n != w->nbytes) return BAD("weight '%s' has %llu bytes, its shape needs %llu", w->name,
                                   (unsigned long long)w->nbytes, (unsigned long long)n);
    uint64_t end;
    if (w->offset % KILN_PLAN_WEIGHT_ALIGN || !kiln_add_u64(w->offset, w->nbytes, &end) || end > weights_size)
        return BAD("weight '%s' at offset %llu (+%llu) lies outside the %llu-byte weights section", w->name,
                   (unsigned long long)w->offset, (unsigned long long)w->nbytes, (unsigned long long)weights_size);
    return KILN_OK;
}

/* Whether output j of op (the i-th) may take slot-owner u's slot in place: u is an input of the op at
 * an index kiln_op_inplace allows and at no other, and op i is its last reader (version 4 plans). */
static bool inplace_ok(const kiln_plan *p, const kiln_plan_op *op, uint32_t j, int32_t u, const int64_t *last,
                       uint32_t i) {
    return p->version >= KILN_PLAN_VERSION_INPLACE && last[u] == (int64_t)i &&
           kiln_op_inplace_over((kiln_op_kind)op->kind, (int)j, op->in, (int)op->n_in, u);
}

static kiln_status check_ops(const kiln_plan *p, kiln_error *err) {
    char *defined = calloc(p->n_values ? p->n_values : 1, 1);
    int64_t *last = malloc((p->n_values ? p->n_values : 1) * sizeof *last);
    int32_t *owner = malloc((p->n_slots ? p->n_slots : 1) * sizeof *owner);
    if (!defined || !last || !owner) {
        free(defined);
        free(last);
        free(owner);
        return kiln_err(err, KILN_ERR_NOMEM, "plan: out of memory");
    }
    kiln_status st = KILN_OK;
    /* each value's last reader (the logits: past the end; version 4: a folded norm's input lives as long
     * as its output, whose reader's GEMV reads that input) and the value each slot holds */
    for (uint32_t v = 0; v < p->n_values; v++) last[v] = -1;
    for (uint32_t s = 0; s < p->n_slots; s++) owner[s] = -1;
    for (uint32_t i = 0; i < p->n_ops; i++)
        for (uint32_t j = 0; j < p->ops[i].n_in; j++)
            if (p->ops[i].in[j] >= 0 && (uint32_t)p->ops[i].in[j] < p->n_values) last[p->ops[i].in[j]] = i;
    last[p->logits] = p->n_ops;
    if (p->version >= KILN_PLAN_VERSION_INPLACE)
        for (uint32_t i = 0; i < p->n_ops; i++) {
            const kiln_plan_op *op = &p->ops[i];
            if (op->kind == KILN_OP_RMSNORM && (op->attrs.flags & KILN_FLAG_FOLD_INTO_GEMV) && op->n_in >= 1 &&
                op->n_out >= 1 && op->in[0] >= 0 && (uint32_t)op->in[0] < p->n_values && op->out[0] >= 0 &&
                (uint32_t)op->out[0] < p->n_values && last[op->out[0]] > last[op->in[0]])
                last[op->in[0]] = last[op->out[0]];
        }
    for (uint32_t v = 0; v < p->n_values; v++) defined[v] = p->values[v].kind != KILN_PV_ACT;
    for (uint32_t i = 0; i < p->n_ops && st == KILN_OK; i++) {
        const kiln_plan_op *op = &p->ops[i];
        if (op->kind >= KILN_OP_COUNT_ || kiln_op_n_in(op->kind) < 0) {
            st = BAD("op %u has unknown kind %u", i, op->kind);
            break;
        }
        if ((int)op->n_in != kiln_op_n_in_with(op->kind, &op->attrs) || (int)op->n_out != kiln_op_n_out(op->kind)) {
            st = BAD("op %u (%s) has %u inputs and %u outputs", i, kiln_op_name(op->kind), op->n_in, op->n_out);
            break;
        }
        kiln_tensor_desc in[KILN_MAX_OP_IN], out[KILN_MAX_OP_OUT];
        for (uint32_t j = 0; j < op->n_in && st == KILN_OK; j++) {
            int32_t v = op->in[j];
            if (v < 0 || (uint32_t)v >= p->n_values || !defined[v]) {
                st = BAD("op %u (%s) reads value %d before it is defined", i, kiln_op_name(op->kind), v);
                break;
            }
            const kiln_plan_value *pv = &p->values[v];
            in[j] = (kiln_tensor_desc){.id = v, .is_weight = pv->kind == KILN_PV_WEIGHT, .dtype = (int)pv->dtype,
                                       .ndim = (int)pv->ndim,
                                       .name = pv->kind == KILN_PV_WEIGHT ? p->weights[pv->weight].name : NULL};
            memcpy(in[j].shape, pv->shape, sizeof pv->shape);
        }
        if (st != KILN_OK) break;
        if (kiln_op_infer(op->kind, in, (int)op->n_in, &op->attrs, out, err) != KILN_OK) {
            st = kiln_err_prefix(err, "plan: op %u: ", i);
            err->code = st = KILN_ERR_FORMAT;
            break;
        }
        if (op->attrs.ranks && (uint32_t)op->attrs.ranks != p->n_ranks) {
            st = BAD("op %u (%s) is for %d ranks, the plan has %u", i, kiln_op_name(op->kind), op->attrs.ranks,
                     p->n_ranks);
            break;
        }
        if ((op->kind == KILN_OP_ATTENTION || op->kind == KILN_OP_QKV_ROPE || op->kind == KILN_OP_QKV_ROPE_PACKED) &&
            (op->attrs.n_kv_heads != p->n_kv_heads || op->attrs.head_dim != p->head_dim ||
             (op->kind == KILN_OP_ATTENTION && op->attrs.layer >= p->n_layers))) {
            st = BAD("op %u (%s) does not match the model's KV cache (layer %d, kv heads %d, head_dim %d)", i,
                     kiln_op_name(op->kind), op->attrs.layer, op->attrs.n_kv_heads, op->attrs.head_dim);
            break;
        }
        for (uint32_t j = 0; j < op->n_out; j++) {
            int32_t v = op->out[j];
            if (v < 0 || (uint32_t)v >= p->n_values || defined[v] || p->values[v].kind != KILN_PV_ACT) {
                st = BAD("op %u (%s) output %u (value %d) is not a fresh activation", i, kiln_op_name(op->kind), j, v);
                break;
            }
            const kiln_plan_value *pv = &p->values[v];
            if (pv->dtype != (uint32_t)out[j].dtype || pv->ndim != (uint32_t)out[j].ndim ||
                memcmp(pv->shape, out[j].shape, sizeof pv->shape) != 0) {
                st = BAD("op %u (%s) output value %d has the wrong shape", i, kiln_op_name(op->kind), v);
                break;
            }
            defined[v] = 1;
        }
        /* an output's slot must hold no value that is still to be read, but for an input this op may
         * overwrite in place (kiln_op_inplace, version 4) whose last reader it is */
        for (uint32_t j = 0; j < op->n_out && st == KILN_OK; j++) {
            const int32_t s = p->values[op->out[j]].slot, u = owner[s];
            if (u >= 0 && last[u] >= (int64_t)i && !inplace_ok(p, op, j, u, last, i)) {
                st = last[u] == (int64_t)i
                         ? BAD("op %u (%s) writes slot %d that it reads", i, kiln_op_name(op->kind), s)
                         : BAD("op %u (%s) writes slot %d over value %d, which op %lld still reads", i,
                               kiln_op_name(op->kind), s, u, (long long)last[u]);
                break;
            }
        }
        for (uint32_t j = 0; j < op->n_out && st == KILN_OK; j++) owner[p->values[op->out[j]].slot] = op->out[j];
        for (uint32_t j = 0; j < op->n_out && st == KILN_OK; j++)
            for (uint32_t k = j + 1; k < op->n_out; k++)
                if (p->values[op->out[j]].slot == p->values[op->out[k]].slot) {
                    st = BAD("op %u (%s) writes two outputs to one slot", i, kiln_op_name(op->kind));
                    break;
                }
    }
    if (st == KILN_OK && !defined[p->logits]) st = BAD("the logits value %d is never computed", p->logits);
    free(defined);
    free(last);
    free(owner);
    return st;
}

void kiln_plan_rank_range(const kiln_plan *p, uint32_t rank, uint64_t *begin, uint64_t *end) {
    const kiln_plan_weight *w = kiln_plan_rank_weights(p, rank);
    uint64_t b = UINT64_MAX, e = 0;
    for (uint32_t i = 0; i < p->n_weights; i++) {
        if (w[i].offset < b) b = w[i].offset;
        if (w[i].offset + w[i].nbytes > e) e = w[i].offset + w[i].nbytes; /* checked at parse: no overflow */
    }
    *begin = p->n_weights ? b : 0;
    *end = e;
}

kiln_status kiln_plan_parse(const uint8_t *d, size_t size, uint64_t weights_size, kiln_plan **out, kiln_error *err) {
    *out = NULL;
    if (size < KILN_PLAN_HEADER_SIZE) return BAD("section is %zu bytes, shorter than its header", size);
    if (memcmp(d, KILN_PLAN_MAGIC, 4) != 0) return BAD("bad magic");
    uint32_t version = kiln_rd_u32(d + 4);
    if (version != KILN_PLAN_VERSION_ONE && version != KILN_PLAN_VERSION_TP && version != KILN_PLAN_VERSION) {
        kiln_err(err, KILN_ERR_VERSION, "plan: version %u, this runtime reads versions %d to %d", version,
                 KILN_PLAN_VERSION_ONE, KILN_PLAN_VERSION);
        return kiln_err_hint(err, version > KILN_PLAN_VERSION
                                      ? "the engine was compiled by a newer kiln: run it with that kiln, or recompile it with this one"
                                      : "recompile the engine from its checkpoint with this kiln (kiln compile)");
    }
    kiln_plan *p = calloc(1, sizeof *p);
    if (!p) return kiln_err(err, KILN_ERR_NOMEM, "plan: out of memory");
    kiln_status st = KILN_OK;
    p->n_values = kiln_rd_u32(d + 8);
    p->n_ops = kiln_rd_u32(d + 12);
    p->n_weights = kiln_rd_u32(d + 16);
    p->n_slots = kiln_rd_u32(d + 20);
    p->tokens = rd_i32(d + 24);
    p->positions = rd_i32(d + 28);
    p->logits = rd_i32(d + 32);
    p->n_layers = rd_i32(d + 36);
    p->n_kv_heads = rd_i32(d + 40);
    p->head_dim = rd_i32(d + 44);
    p->hidden_size = rd_i32(d + 48);
    p->vocab_size = rd_i32(d + 52);
    p->max_context = rd_i32(d + 56);
    p->version = version;
    p->n_ranks = version == KILN_PLAN_VERSION_ONE ? 1 : kiln_rd_u32(d + 60); /* version 2: reserved */
    if (p->n_ranks < (version == KILN_PLAN_VERSION_TP ? 2u : 1u) || p->n_ranks > KILN_MAX_RANKS) {
        st = BAD("version %u plan for %u tensor-parallel ranks (%u..%d)", version, p->n_ranks,
                 version == KILN_PLAN_VERSION_TP ? 2u : 1u, KILN_MAX_RANKS);
        goto fail;
    }
    if (p->n_values > KILN_PLAN_MAX_ITEMS || p->n_ops > KILN_PLAN_MAX_ITEMS || p->n_weights > KILN_PLAN_MAX_ITEMS ||
        p->n_slots > KILN_PLAN_MAX_ITEMS || p->n_values == 0 || p->n_ops == 0) {
        st = BAD("bad counts (%u values, %u ops, %u weights, %u slots)", p->n_values, p->n_ops, p->n_weights,
                 p->n_slots);
        goto fail;
    }
    /* the fixed-size tables; the ops (variable records) must fill the rest exactly */
    uint64_t fixed = KILN_PLAN_HEADER_SIZE + (uint64_t)p->n_slots * KILN_PLAN_SLOT_SIZE +
                     (uint64_t)p->n_values * KILN_PLAN_VALUE_SIZE +
                     (uint64_t)p->n_ranks * p->n_weights * KILN_PLAN_WEIGHT_SIZE;
    if (fixed + (uint64_t)p->n_ops * KILN_PLAN_OP_HEADER_SIZE > size) {
        st = BAD("section is %zu bytes, too short for its counts", size);
        goto fail;
    }
    if (p->n_layers <= 0 || p->n_layers > 4096 || p->n_kv_heads <= 0 || p->n_kv_heads > 4096 || p->head_dim <= 0 ||
        p->head_dim > 4096 || p->hidden_size <= 0 || p->vocab_size <= 0 || p->vocab_size > (1 << 24) ||
        p->max_context <= 0 || p->max_context > (1 << 24)) {
        st = BAD("bad model sizes in the header");
        goto fail;
    }
    p->slots = calloc(p->n_slots ? p->n_slots : 1, sizeof *p->slots);
    p->values = calloc(p->n_values, sizeof *p->values);
    const uint64_t n_records = (uint64_t)p->n_ranks * p->n_weights; /* weight records, every rank's */
    p->weights = calloc(n_records ? (size_t)n_records : 1, sizeof *p->weights);
    p->ops = calloc(p->n_ops, sizeof *p->ops);
    if (!p->slots || !p->values || !p->weights || !p->ops) {
        st = kiln_err(err, KILN_ERR_NOMEM, "plan: out of memory");
        goto fail;
    }
    const uint8_t *c = d + KILN_PLAN_HEADER_SIZE;
    for (uint32_t i = 0; i < p->n_slots; i++, c += KILN_PLAN_SLOT_SIZE) {
        p->slots[i].width = kiln_rd_u32(c);
        p->slots[i].dtype = kiln_rd_u32(c + 4);
        if (p->slots[i].width == 0 || p->slots[i].width > (1u << 30) || p->slots[i].dtype != KILN_DTYPE_F32) {
            st = BAD("slot %u has width %u dtype %u", i, p->slots[i].width, p->slots[i].dtype);
            goto fail;
        }
    }
    for (uint32_t i = 0; i < p->n_values; i++, c += KILN_PLAN_VALUE_SIZE) {
        kiln_plan_value *v = &p->values[i];
        v->kind = kiln_rd_u32(c);
        v->dtype = kiln_rd_u32(c + 4);
        v->ndim = kiln_rd_u32(c + 8);
        v->slot = rd_i32(c + 12);
        v->weight = rd_i32(c + 16);
        for (int k = 0; k < KILN_MAX_DIMS; k++) v->shape[k] = (int64_t)kiln_rd_u64(c + 24 + 8 * k);
    }
    for (uint32_t i = 0; i < n_records; i++, c += KILN_PLAN_WEIGHT_SIZE) {
        kiln_plan_weight *w = &p->weights[i];
        memcpy(w->name, c, KILN_PLAN_NAME_MAX);
        w->dtype = kiln_rd_u32(c + 128);
        w->ndim = kiln_rd_u32(c + 132);
        for (int k = 0; k < KILN_MAX_DIMS; k++) w->shape[k] = (int64_t)kiln_rd_u64(c + 136 + 8 * k);
        w->offset = kiln_rd_u64(c + 168);
        w->nbytes = kiln_rd_u64(c + 176);
        if ((st = check_weight(w, i, weights_size, err)) != KILN_OK) goto fail;
        /* every rank's shard of a weight: the same name, dtype and (one rank's) shape */
        const kiln_plan_weight *w0 = &p->weights[i % p->n_weights];
        if (i >= p->n_weights && (strcmp(w->name, w0->name) != 0 || w->dtype != w0->dtype || w->ndim != w0->ndim ||
                                  memcmp(w->shape, w0->shape, sizeof w->shape) != 0)) {
            st = BAD("rank %u's weight %u ('%s') does not match rank 0's ('%s')", i / p->n_weights, i % p->n_weights,
                     w->name, w0->name);
            goto fail;
        }
    }
    const uint8_t *end = d + size;
    for (uint32_t i = 0; i < p->n_ops; i++) {
        kiln_plan_op *op = &p->ops[i];
        if ((size_t)(end - c) < KILN_PLAN_OP_HEADER_SIZE) {
            st = BAD("op %u lies past the end of the section", i);
            goto fail;
        }
        op->kind = kiln_rd_u32(c);
        op->n_in = kiln_rd_u32(c + 4);
        op->n_out = kiln_rd_u32(c + 8);
        uint32_t n_attrs = kiln_rd_u32(c + 12);
        if (op->n_in > KILN_MAX_OP_IN || op->n_out > KILN_MAX_OP_OUT || n_attrs >= KILN_ATTR_COUNT_ + 64u) {
            st = BAD("op %u has %u inputs / %u outputs / %u attributes", i, op->n_in, op->n_out, n_attrs);
            goto fail;
        }
        uint64_t rec = KILN_PLAN_OP_HEADER_SIZE + 4ull * (op->n_in + op->n_out) + (uint64_t)KILN_PLAN_ATTR_SIZE * n_attrs;
        if (rec > (uint64_t)(end - c)) {
            st = BAD("op %u (%u inputs, %u outputs, %u attributes) lies past the end of the section", i, op->n_in,
                     op->n_out, n_attrs);
            goto fail;
        }
        const uint8_t *q = c + KILN_PLAN_OP_HEADER_SIZE;
        for (uint32_t k = 0; k < KILN_MAX_OP_IN; k++) op->in[k] = k < op->n_in ? rd_i32(q + 4 * k) : -1;
        q += 4 * op->n_in;
        for (uint32_t k = 0; k < KILN_MAX_OP_OUT; k++) op->out[k] = k < op->n_out ? rd_i32(q + 4 * k) : -1;
        q += 4 * op->n_out;
        uint32_t prev = 0;
        for (uint32_t k = 0; k < n_attrs; k++, q += KILN_PLAN_ATTR_SIZE) {
            uint32_t key = kiln_rd_u32(q), val = kiln_rd_u32(q + 4);
            if (key <= prev) {
                st = BAD("op %u: attribute keys out of order or repeated (%u after %u)", i, key, prev);
                goto fail;
            }
            if (!kiln_op_attr_set(&op->attrs, key, val)) {
                kiln_err(err, KILN_ERR_FORMAT, "plan: op %u (%s) has attribute key %u, unknown to this runtime", i,
                         kiln_op_name((kiln_op_kind)op->kind), key);
                st = kiln_err_hint(err, "the engine was made by a newer kiln; recompile it with this one");
                goto fail;
            }
            prev = key;
        }
        c += rec;
    }
    if (c != end) {
        st = BAD("section is %zu bytes, its contents end at %zu", size, (size_t)(c - d));
        goto fail;
    }
    for (uint32_t i = 0; i < p->n_values; i++)
        if ((st = check_value(p, i, err)) != KILN_OK) goto fail;
    const int32_t io[3] = {p->tokens, p->positions, p->logits};
    for (int k = 0; k < 3; k++)
        if (io[k] < 0 || (uint32_t)io[k] >= p->n_values) {
            st = BAD("graph input/output index %d out of range", io[k]);
            goto fail;
        }
    if (p->values[p->tokens].kind != KILN_PV_INPUT || p->values[p->positions].kind != KILN_PV_INPUT ||
        p->values[p->logits].kind != KILN_PV_ACT || p->values[p->logits].shape[2] != p->vocab_size) {
        st = BAD("graph inputs/outputs have the wrong kinds or shapes");
        goto fail;
    }
    if ((st = check_ops(p, err)) != KILN_OK) goto fail;
    *out = p;
    return KILN_OK;
fail:
    kiln_plan_free(p);
    return st;
}
