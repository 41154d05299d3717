/*
 * plan_writer.c — writes the plan section and the weights section from a
 * graph (formats in runtime/kiln_plan.h and docs/engine-format.md).
 */
#include "kiln_codegen.h"

#include <stdlib.h>
#include <string.h>

#include "../runtime/kiln_plan.h"

/* Dense numbering of live values (id order) and of live weights. */
typedef struct numbering {
    int *value;  /* graph value id → plan value index, -1 when dead */
    int *weight; /* graph value id → plan weight index, -1 when not a live weight */
    int n_values, n_weights;
} numbering;

static kiln_status number(const kiln_graph *g, numbering *n, kiln_error *err) {
    n->value = malloc((size_t)g->n_values * sizeof *n->value);
    n->weight = malloc((size_t)g->n_values * sizeof *n->weight);
    if (!n->value || !n->weight) {
        free(n->value);
        free(n->weight);
        return kiln_err(err, KILN_ERR_NOMEM, "out of memory numbering the plan");
    }
    n->n_values = n->n_weights = 0;
    for (int v = 0; v < g->n_values; v++) {
        const kiln_value *val = &g->values[v];
        n->value[v] = val->dead ? -1 : n->n_values++;
        n->weight[v] = (!val->dead && val->kind == KILN_VALUE_WEIGHT) ? n->n_weights++ : -1;
    }
    return KILN_OK;
}

static uint64_t weight_bytes(const kiln_value *v) {
    uint64_t n = (uint64_t)kiln_dtype_size(v->dtype);
    for (int d = 0; d < v->ndim; d++) n *= (uint64_t)v->shape[d];
    return n;
}

static int slot_count(const kiln_graph *g) {
    int n = 0;
    for (int v = 0; v < g->n_values; v++)
        if (!g->values[v].dead && g->values[v].kind == KILN_VALUE_ACT && g->values[v].slot >= n)
            n = g->values[v].slot + 1;
    return n;
}

kiln_status kiln_plan_serialize(const kiln_graph *g, kiln_buf *b, kiln_error *err) {
    numbering n = {0};
    kiln_status st = number(g, &n, err);
    if (st != KILN_OK) return st;
    int n_slots = slot_count(g);
    uint32_t *slot_width = calloc((size_t)n_slots + 1, sizeof *slot_width);
    if (!slot_width) {
        st = kiln_err(err, KILN_ERR_NOMEM, "out of memory writing the plan");
        goto out;
    }
    for (int v = 0; v < g->n_values; v++) {
        const kiln_value *val = &g->values[v];
        if (val->dead || val->kind != KILN_VALUE_ACT) continue;
        if (val->slot < 0) {
            st = kiln_err(err, KILN_ERR_INTERNAL, "plan: activation %%%d has no buffer slot (memory planning did not run)", v);
            goto out;
        }
        slot_width[val->slot] = (uint32_t)val->shape[2];
    }
    kiln_buf_append(b, KILN_PLAN_MAGIC, 4);
    kiln_buf_u32(b, KILN_PLAN_VERSION);
    kiln_buf_u32(b, (uint32_t)n.n_values);
    kiln_buf_u32(b, (uint32_t)g->n_ops);
    kiln_buf_u32(b, (uint32_t)n.n_weights);
    kiln_buf_u32(b, (uint32_t)n_slots);
    kiln_buf_u32(b, (uint32_t)n.value[g->tokens]);
    kiln_buf_u32(b, (uint32_t)n.value[g->positions]);
    kiln_buf_u32(b, (uint32_t)n.value[g->logits]);
    const kiln_graph_info *info = &g->info;
    const int32_t hdr[6] = {info->n_layers, info->n_kv_heads, info->head_dim,
                            info->hidden_size, info->vocab_size, info->max_context};
    for (int i = 0; i < 6; i++) kiln_buf_u32(b, (uint32_t)hdr[i]);
    kiln_buf_u32(b, 0);
    for (int s = 0; s < n_slots; s++) {
        kiln_buf_u32(b, slot_width[s]);
        kiln_buf_u32(b, KILN_DTYPE_F32);
    }
    for (int v = 0; v < g->n_values; v++) {
        const kiln_value *val = &g->values[v];
        if (val->dead) continue;
        kiln_buf_u32(b, (uint32_t)val->kind);
        kiln_buf_u32(b, (uint32_t)val->dtype);
        kiln_buf_u32(b, (uint32_t)val->ndim);
        kiln_buf_u32(b, (uint32_t)(val->kind == KILN_VALUE_ACT ? val->slot : -1));
        kiln_buf_u32(b, (uint32_t)n.weight[v]);
        kiln_buf_u32(b, 0);
        for (int d = 0; d < KILN_MAX_DIMS; d++) kiln_buf_u64(b, (uint64_t)(d < val->ndim ? val->shape[d] : 0));
    }
    uint64_t offset = 0;
    for (int v = 0; v < g->n_values; v++) {
        const kiln_value *val = &g->values[v];
        if (n.weight[v] < 0) continue;
        char name[KILN_PLAN_NAME_MAX] = {0};
        snprintf(name, sizeof name, "%s", val->name);
        kiln_buf_append(b, name, sizeof name);
        kiln_buf_u32(b, (uint32_t)val->dtype);
        kiln_buf_u32(b, (uint32_t)val->ndim);
        for (int d = 0; d < KILN_MAX_DIMS; d++) kiln_buf_u64(b, (uint64_t)(d < val->ndim ? val->shape[d] : 0));
        offset = kiln_align_up(offset, KILN_PLAN_WEIGHT_ALIGN);
        kiln_buf_u64(b, offset);
        kiln_buf_u64(b, weight_bytes(val));
        offset += weight_bytes(val);
    }
    for (int i = 0; i < g->n_ops; i++) {
        const kiln_op *op = &g->ops[i];
        kiln_buf_u32(b, (uint32_t)op->kind);
        kiln_buf_u32(b, (uint32_t)op->n_in);
        kiln_buf_u32(b, (uint32_t)op->n_out);
        for (int k = 0; k < KILN_MAX_OP_IN; k++) kiln_buf_u32(b, (uint32_t)(k < op->n_in ? n.value[op->in[k]] : -1));
        for (int k = 0; k < KILN_MAX_OP_OUT; k++)
            kiln_buf_u32(b, (uint32_t)(k < op->n_out ? n.value[op->out[k]] : -1));
        const kiln_op_attrs *a = &op->attrs;
        const int32_t ia[6] = {a->layer, a->n_heads, a->n_kv_heads, a->head_dim, a->window, a->rope_scaling};
        for (int k = 0; k < 6; k++) kiln_buf_u32(b, (uint32_t)ia[k]);
        const float fa[6] = {a->eps, a->rope_theta, a->rope_factor, a->rope_low_freq_factor,
                             a->rope_high_freq_factor, a->rope_original_max_pos};
        for (int k = 0; k < 6; k++) kiln_buf_f32(b, fa[k]);
    }
    if (b->failed) st = kiln_err(err, KILN_ERR_NOMEM, "out of memory writing the plan");
out:
    free(slot_width);
    free(n.value);
    free(n.weight);
    return st;
}

/* Convert `count` elements from src (dtype sd, possibly unaligned) to dtype dd. */
static void convert(const uint8_t *src, kiln_dtype sd, uint8_t *dst, kiln_dtype dd, size_t count) {
    if (sd == dd) {
        memcpy(dst, src, count * (size_t)kiln_dtype_size(sd));
        return;
    }
    for (size_t i = 0; i < count; i++) {
        float f;
        if (sd == KILN_DTYPE_F32) {
            uint32_t u = kiln_rd_u32(src + 4 * i);
            memcpy(&f, &u, 4);
        } else {
            uint16_t h = (uint16_t)(src[2 * i] | src[2 * i + 1] << 8);
            f = sd == KILN_DTYPE_BF16 ? kiln_bf16_to_f32(h) : kiln_f16_to_f32(h);
        }
        if (dd == KILN_DTYPE_F32) {
            uint32_t u;
            memcpy(&u, &f, 4);
            kiln_wr_u32(dst + 4 * i, u);
        } else {
            uint16_t h = dd == KILN_DTYPE_BF16 ? kiln_f32_to_bf16(f) : kiln_f32_to_f16(f);
            dst[2 * i] = (uint8_t)h;
            dst[2 * i + 1] = (uint8_t)(h >> 8);
        }
    }
}

uint64_t kiln_weights_size(const kiln_graph *g) {
    uint64_t offset = 0;
    for (int v = 0; v < g->n_values; v++) {
        const kiln_value *val = &g->values[v];
        if (!val->dead && val->kind == KILN_VALUE_WEIGHT)
            offset = kiln_align_up(offset, KILN_PLAN_WEIGHT_ALIGN) + weight_bytes(val);
    }
    return offset;
}

kiln_status kiln_weights_write(const kiln_graph *g, kiln_engine_writer *w, uint64_t *size, kiln_error *err) {
    enum { CHUNK = 1 << 20 }; /* elements converted per write */
    uint8_t *buf = malloc((size_t)CHUNK * 4);
    static const uint8_t zeros[KILN_PLAN_WEIGHT_ALIGN];
    if (!buf) return kiln_err(err, KILN_ERR_NOMEM, "out of memory writing weights");
    kiln_status st = KILN_OK;
    uint64_t offset = 0;
    for (int v = 0; v < g->n_values && st == KILN_OK; v++) {
        const kiln_value *val = &g->values[v];
        if (val->dead || val->kind != KILN_VALUE_WEIGHT) continue;
        uint64_t pad = kiln_align_up(offset, KILN_PLAN_WEIGHT_ALIGN) - offset;
        if (pad && (st = kiln_engine_writer_write(w, zeros, pad, err)) != KILN_OK) break;
        offset += pad;
        uint64_t count = weight_bytes(val) / (uint64_t)kiln_dtype_size(val->dtype);
        const uint8_t *src = val->src;
        size_t ss = (size_t)kiln_dtype_size(val->src_dtype), ds = (size_t)kiln_dtype_size(val->dtype);
        for (uint64_t i = 0; i < count && st == KILN_OK; i += CHUNK) {
            size_t m = (size_t)(count - i < CHUNK ? count - i : CHUNK);
            convert(src + i * ss, val->src_dtype, buf, val->dtype, m);
            st = kiln_engine_writer_write(w, buf, m * ds, err);
        }
        offset += count * ds;
    }
    free(buf);
    if (size) *size = offset;
    return st;
}
