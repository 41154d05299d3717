/*
 * print.c — the textual dump of a graph, used by `kiln compile --dump-ir`
 * and in test failure messages. One line per live op:
 *   %12 = rmsnorm(%10, @model.norm.weight) eps=1e-05 : [B,S,64] f32
 * Weights print as @name, graph inputs as %id(name); a matrix that came
 * quantized from the checkpoint as @name{q4g128 from awq}.
 */
#include "kiln_ir.h"

#include <string.h>

const char *kiln_ir_shape_str(const kiln_value *v, char *buf, size_t n) {
    size_t k = 0;
    k += (size_t)snprintf(buf + k, n - k, "[");
    for (int i = 0; i < v->ndim && k < n; i++) {
        int64_t d = v->shape[i];
        const char *sep = i ? "," : "";
        if (d == KILN_DIM_BATCH)
            k += (size_t)snprintf(buf + k, n - k, "%sB", sep);
        else if (d == KILN_DIM_SEQ)
            k += (size_t)snprintf(buf + k, n - k, "%sS", sep);
        else
            k += (size_t)snprintf(buf + k, n - k, "%s%lld", sep, (long long)d);
    }
    if (k < n) snprintf(buf + k, n - k, "]");
    return buf;
}

static void print_ref(const kiln_graph *g, int v, FILE *f) {
    const kiln_value *val = &g->values[v];
    /* a matrix quantized in the checkpoint (or packed from such): its format and where it came from */
    const kiln_qsrc *q = val->kind == KILN_VALUE_WEIGHT && val->n_parts ? &g->values[val->parts[0]].qsrc : &val->qsrc;
    if (val->kind == KILN_VALUE_WEIGHT)
        fprintf(f, "@%s%s", val->name, val->shard == KILN_SHARD_ROWS ? "{rows/rank}"
                                       : val->shard == KILN_SHARD_COLS ? "{cols/rank}" : "");
    /* rows in another order (fold-permute-into-rows; packed: its parts') */
    const bool rp = val->kind == KILN_VALUE_WEIGHT && (val->row_perm || (val->n_parts && g->values[val->parts[0]].row_perm));
    if (rp) fprintf(f, "{rows permuted}");
    if (val->kind == KILN_VALUE_WEIGHT && q->format != KILN_QSRC_NONE)
        fprintf(f, "{%s from %s}", kiln_dtype_name(val->dtype), q->format == KILN_QSRC_AWQ    ? "awq"
                                                                 : q->format == KILN_QSRC_GPTQ ? "gptq"
                                                                 : q->format == KILN_QSRC_FP8 ||
                                                                           q->format == KILN_QSRC_FP8_BLOCK
                                                                     ? "fp8"
                                                                     : "compressed-tensors");
    else if (val->kind == KILN_VALUE_INPUT)
        fprintf(f, "%%%d(%s)", v, val->name);
    else
        fprintf(f, "%%%d", v);
}

static void print_attrs(const kiln_op *op, FILE *f) {
    const kiln_op_attrs *a = &op->attrs;
    switch (op->kind) {
    case KILN_OP_RMSNORM:
    case KILN_OP_ADD_RMSNORM: fprintf(f, " eps=%g", a->eps); break;
    case KILN_OP_HEAD_RMSNORM: fprintf(f, " heads=%d head_dim=%d eps=%g", a->n_heads, a->head_dim, a->eps); break;
    case KILN_OP_ROPE:
    case KILN_OP_QKV_ROPE:
    case KILN_OP_QKV_ROPE_PACKED:
        if (op->kind != KILN_OP_ROPE) fprintf(f, " kv_heads=%d", a->n_kv_heads);
        fprintf(f, " heads=%d head_dim=%d theta=%g", a->n_heads, a->head_dim, a->rope_theta);
        if (a->rope_scaling == KILN_ROPE_SCALING_LLAMA3)
            fprintf(f, " llama3(factor=%g,low=%g,high=%g,orig=%g)", a->rope_factor, a->rope_low_freq_factor,
                    a->rope_high_freq_factor, a->rope_original_max_pos);
        break;
    case KILN_OP_MOE: fprintf(f, " layer=%d experts=%d top_k=%d", a->layer, a->n_experts, a->top_k); break;
    case KILN_OP_ATTENTION:
        fprintf(f, " layer=%d heads=%d kv_heads=%d head_dim=%d", a->layer, a->n_heads, a->n_kv_heads, a->head_dim);
        if (a->window) fprintf(f, " window=%d", a->window);
        break;
    default: break;
    }
    if (a->ranks) fprintf(f, " ranks=%d", a->ranks);
    /* the lowering decisions passes recorded (what the GPU fuses at run time) and the optional inputs an op
     * carries, in bit order; qk_norm with its eps */
    for (uint32_t bit = 1; bit & KILN_FLAG_ALL_; bit <<= 1)
        if (a->flags & bit) {
            if (bit == KILN_FLAG_QK_NORM) fprintf(f, " +qk_norm(eps=%g)", a->eps);
            else fprintf(f, " +%s", kiln_flag_name(bit));
        }
}

void kiln_ir_print(const kiln_graph *g, FILE *f) {
    char sb[64];
    int n_w = 0;
    for (int v = 0; v < g->n_values; v++) n_w += !g->values[v].dead && g->values[v].kind == KILN_VALUE_WEIGHT;
    fprintf(f, "graph: %d ops, %d weights, inputs %%%d(tokens) %%%d(positions), output %%%d\n", g->n_ops, n_w,
            g->tokens, g->positions, g->logits);
    if (g->n_ranks > 1) fprintf(f, "tensor parallel: %d ranks; shapes are one rank's\n", g->n_ranks);
    for (int i = 0; i < g->n_ops; i++) {
        const kiln_op *op = &g->ops[i];
        if (op->dead) continue;
        fputs("  ", f);
        for (int j = 0; j < op->n_out; j++) fprintf(f, "%s%%%d", j ? ", " : "", op->out[j]);
        fprintf(f, " = %s(", kiln_op_name(op->kind));
        for (int j = 0; j < op->n_in; j++) {
            if (j) fputs(", ", f);
            print_ref(g, op->in[j], f);
        }
        fputc(')', f);
        print_attrs(op, f);
        const kiln_value *o = &g->values[op->out[0]];
        fprintf(f, " : %s %s", kiln_ir_shape_str(o, sb, sizeof sb), kiln_dtype_name(o->dtype));
        if (o->slot >= 0) {
            fputs(" slot", f);
            for (int j = 0; j < op->n_out; j++) fprintf(f, "%s%d", j ? "," : "=", g->values[op->out[j]].slot);
        }
        fputc('\n', f);
    }
}
