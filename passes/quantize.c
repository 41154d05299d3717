/*
 * quantize.c — the pass quantize (--quant): each projection's weight matrix
 * gets the quantized dtype kiln_graph.quant_weights asks for, the LM head's
 * kiln_graph.quant_head; the writer quantizes them (codegen/plan_writer.c,
 * common/quant.c) and the plan records the format, so loading is a copy.
 *
 * Which matrices: the weights ops multiply by (linear, linear_add, the q/k/v
 * and gate/up matrices, packed or not, the LM head's), and the embedding
 * table only with kiln_graph.quant_embedding (--quant-embedding; a tied LM
 * head is that table, so it follows the embedding's policy, not the head's).
 * Not: norms and biases (vectors) and the experts' stacks (3-D). A matrix
 * whose columns the q4 group does not divide gets q8.
 * With kiln_graph.quant_picks (--quant auto) each projection gets the format
 * its pick names instead (none: it keeps its dtype); the head and the
 * embedding follow their policies as above.
 * The pass runs after the others (after pack-weights: a packed q/k/v matrix
 * is quantized as one, row by row).
 */
#include "kiln_passes.h"

#include <stdbool.h>
#include <stdio.h>
#include <string.h>

static bool used_by_embedding(const kiln_graph *g, int v) {
    for (int i = 0; i < g->n_ops; i++)
        if (!g->ops[i].dead && g->ops[i].kind == KILN_OP_EMBEDDING && g->ops[i].in[1] == v) return true;
    return false;
}

/* Give weight v the dtype t (or q8 when t's group does not divide its columns); 1 when it changed.
 * The embedding table (and an LM head tied to it) only by the embedding's own policy. */
static int quantize_one(kiln_graph *g, int v, int t, bool embedding) {
    kiln_value *val = &g->values[v];
    if (!t || val->kind != KILN_VALUE_WEIGHT || val->ndim != 2 || kiln_dtype_is_quant(val->dtype) ||
        (!embedding && used_by_embedding(g, v)))
        return 0;
    if (!kiln_weight_nbytes(t, 2, val->shape)) t = KILN_DTYPE_Q8;
    val->dtype = t;
    return 1;
}

/* The projection's format: --quant's, or under --quant auto the one picked for it by name. */
static int projection_dtype(const kiln_graph *g, int v) {
    if (!g->n_quant_picks) return g->quant_weights;
    for (int i = 0; i < g->n_quant_picks; i++)
        if (strcmp(g->quant_picks[i].name, g->values[v].name) == 0) return g->quant_picks[i].dtype;
    return 0;
}

int kiln_pass_quantize(kiln_graph *g, kiln_error *err) {
    (void)err;
    int n = 0;
    for (int i = 0; i < g->n_ops; i++) {
        const kiln_op *op = &g->ops[i];
        if (op->dead) continue;
        switch (op->kind) {
        case KILN_OP_LINEAR:
        case KILN_OP_LINEAR_ADD:
        case KILN_OP_QKV_ROPE_PACKED:
        case KILN_OP_GATE_UP_SWIGLU_PACKED: n += quantize_one(g, op->in[1], projection_dtype(g, op->in[1]), false); break;
        case KILN_OP_QKV_ROPE:
            for (int j = 1; j <= 3; j++) n += quantize_one(g, op->in[j], projection_dtype(g, op->in[j]), false);
            break;
        case KILN_OP_GATE_UP_SWIGLU:
            for (int j = 1; j <= 2; j++) n += quantize_one(g, op->in[j], projection_dtype(g, op->in[j]), false);
            break;
        case KILN_OP_LM_HEAD: n += quantize_one(g, op->in[1], g->quant_head, false); break;
        case KILN_OP_EMBEDDING: n += quantize_one(g, op->in[1], g->quant_embedding, true); break;
        default: break;
        }
    }
    return n;
}

/* w8a8 (after quantize): every projection whose matrices are all fp8 or fp8g128 gets +act_fp8, so that
 * its steps past the quantized GEMV quantize the input per token and multiply E4M3 by E4M3 (the FP8
 * tensor cores on the GPU, the same codes on the CPU). Without the pass those steps dequantize the
 * weights and multiply in the activations' dtype. */
int kiln_pass_w8a8(kiln_graph *g, kiln_error *err) {
    (void)err;
    int n = 0;
    for (int i = 0; i < g->n_ops; i++) {
        kiln_op *op = &g->ops[i];
        if (op->dead || (op->attrs.flags & KILN_FLAG_ACT_FP8) || !kiln_op_matrices(op->kind) ||
            !kiln_pass_matrices_are(g, op, kiln_quant_is_fp8))
            continue;
        op->attrs.flags |= KILN_FLAG_ACT_FP8;
        n++;
    }
    return n;
}

static int is_fp8_rows(int dtype) { return dtype == KILN_DTYPE_FP8; } /* fp8 with a scale a row */

/* w8a8-fast-accum (after w8a8): every +act_fp8 projection over fp8 (per-row) matrices gets +fast_accum,
 * so that its W8A8 GEMMs on the GPU do not promote the tensor cores' partial sums to fp32 along K: on the
 * H200 (cuBLASLt 130100) Mistral-7B's fp8 prefill of 2048 tokens in 27.5 ms against 30.5 promoted, the
 * GEMMs' error against a double reference 1.1e-3 to 2.3e-3 (docs/quantization.md). fp8g128 projections
 * (128-column scales) are left as they are: that cuBLASLt has no fast mode for them. */
int kiln_pass_w8a8_fast_accum(kiln_graph *g, kiln_error *err) {
    (void)err;
    int n = 0;
    for (int i = 0; i < g->n_ops; i++) {
        kiln_op *op = &g->ops[i];
        if (op->dead || !(op->attrs.flags & KILN_FLAG_ACT_FP8) || (op->attrs.flags & KILN_FLAG_FP8_FAST) ||
            !kiln_pass_matrices_are(g, op, is_fp8_rows))
            continue;
        op->attrs.flags |= KILN_FLAG_FP8_FAST;
        n++;
    }
    return n;
}

/* swiglu-out-fp8 (after w8a8): a gate_up_swiglu(_packed) whose product the next live op alone reads, as
 * the input of a +act_fp8 projection over fp8 (per-row) matrices, gets +out_fp8: at the steps where that
 * projection runs W8A8 the SwiGLU writes the codes and per-token scales itself, so the bf16 product is
 * neither written nor read back to be quantized (on the H200, Mistral-7B's [2048, 14336] product a layer:
 * about 117 MB a prefill step fewer). fp8g128 projections (scales per 128 columns) keep the bf16 product. */
int kiln_pass_swiglu_out_fp8(kiln_graph *g, kiln_error *err) {
    (void)err;
    int n = 0;
    for (int i = 0; i < g->n_ops; i++) {
        kiln_op *op = &g->ops[i];
        if (op->attrs.flags & KILN_FLAG_OUT_FP8 ||
            (op->kind != KILN_OP_GATE_UP_SWIGLU && op->kind != KILN_OP_GATE_UP_SWIGLU_PACKED))
            continue;
        const kiln_op *nx = kiln_pass_sole_projection(g, i);
        if (!nx || !(nx->attrs.flags & KILN_FLAG_ACT_FP8) || !kiln_pass_matrices_are(g, nx, is_fp8_rows)) continue;
        op->attrs.flags |= KILN_FLAG_OUT_FP8;
        n++;
    }
    return n;
}

/* norm-out-fp8 (after w8a8): an rmsnorm whose output the next live op alone reads, as the input of a
 * +act_fp8 projection over fp8 (per-row) matrices (each layer's q/k/v and gate/up), gets +out_fp8: at the
 * steps where that projection runs W8A8 the norm kernel writes the codes and per-token scales itself
 * (kiln_rmsnorm_fp8), so its bf16 output is neither written nor read back to be quantized (Mistral-7B's
 * [2048, 4096] rows twice a layer: about 2 x 16 MB and two launches a layer fewer a prefill step).
 * fp8g128 projections keep the bf16 output. */
int kiln_pass_norm_out_fp8(kiln_graph *g, kiln_error *err) {
    (void)err;
    int n = 0;
    for (int i = 0; i < g->n_ops; i++) {
        kiln_op *op = &g->ops[i];
        if (op->kind != KILN_OP_RMSNORM || (op->attrs.flags & (KILN_FLAG_OUT_FP8 | KILN_FLAG_OUT_PERM))) continue;
        const kiln_op *nx = kiln_pass_sole_projection(g, i);
        if (!nx || !(nx->attrs.flags & KILN_FLAG_ACT_FP8) || !kiln_pass_matrices_are(g, nx, is_fp8_rows)) continue;
        op->attrs.flags |= KILN_FLAG_OUT_FP8;
        n++;
    }
    return n;
}

/* Layer `layer`'s kv_scale weight: [K scales of the kv heads; V scales] (f32 from g->kv_scales). In a
 * tensor-parallel graph each rank holds its own kv heads' scales, so the weight is packed from a K part
 * and a V part, each sharded by rows: rank r's is [K of its heads; V of its heads], the layout its
 * attention op reads (one rank's n_kv_heads). */
static int kv_scale_weight(kiln_graph *g, int layer, int nkv, int ranks, kiln_error *err) {
    char name[KILN_NAME_MAX];
    snprintf(name, sizeof name, "model.layers.%d.self_attn.kv_scale", layer);
    const float *src = g->kv_scales + (size_t)layer * 2 * (size_t)nkv;
    if (ranks <= 1) {
        const int64_t shape[1] = {2 * (int64_t)nkv};
        return kiln_ir_weight(g, name, KILN_DTYPE_F32, 1, shape, src, KILN_DTYPE_F32, err);
    }
    int parts[2];
    for (int j = 0; j < 2; j++) {
        char pn[KILN_NAME_MAX + 4];
        snprintf(pn, sizeof pn, "%s.%c", name, j ? 'v' : 'k');
        const int64_t shape[1] = {nkv};
        if ((parts[j] = kiln_ir_weight(g, pn, KILN_DTYPE_F32, 1, shape, src + (size_t)j * nkv, KILN_DTYPE_F32, err)) < 0)
            return -1;
        g->values[parts[j]].shape[0] = nkv / ranks; /* one rank's heads */
        g->values[parts[j]].shard = KILN_SHARD_ROWS;
    }
    return kiln_ir_weight_packed(g, name, KILN_PACK_CONCAT_ROWS, parts, 2, err);
}

int kiln_pass_quantize_kv(kiln_graph *g, kiln_error *err) {
    if (!g->kv_flag) return 0;
    if (!g->kv_scales) {
        kiln_err(err, KILN_ERR_INTERNAL, "quantize-kv: no scales");
        return -1;
    }
    /* g->kv_scales holds the whole model's kv heads; a tensor-parallel graph's info and ops one rank's */
    const int ranks = g->n_ranks > 1 ? g->n_ranks : 1, nkv = g->info.n_kv_heads * ranks;
    int n = 0;
    for (int i = 0; i < g->n_ops; i++) {
        if (g->ops[i].dead || g->ops[i].kind != KILN_OP_ATTENTION) continue;
        const kiln_op_attrs *a = &g->ops[i].attrs;
        if (a->n_kv_heads != nkv / ranks || a->layer < 0 || a->layer >= g->info.n_layers ||
            (a->flags & (KILN_FLAG_KV_FP8 | KILN_FLAG_KV_INT8))) {
            kiln_err(err, KILN_ERR_VERIFY, "quantize-kv: attention op %d (layer %d, %d kv heads) is not one it takes",
                     i, a->layer, a->n_kv_heads);
            return -1;
        }
        const int v = kv_scale_weight(g, a->layer, nkv, ranks, err);
        if (v < 0) return -1;
        kiln_op *op = &g->ops[i];
        op->in[op->n_in++] = v;
        op->attrs.flags |= g->kv_flag;
        n++;
    }
    return n;
}
