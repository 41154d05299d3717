/*
 * fuse.c — the fusion passes. Each one finds its pattern, inserts the fused
 * op where the pattern's first op stood (so its inputs are already defined),
 * redirects the uses of the pattern's results to the fused op's outputs and
 * leaves the old ops for dce to drop. A pattern whose intermediate results
 * have other uses is left alone.
 */
#include "kiln_passes.h"

#include <stdbool.h>
#include <stdio.h>
#include <string.h>

static const kiln_op *producer(const kiln_graph *g, int v, kiln_op_kind kind) {
    if (v < 0 || g->values[v].kind != KILN_VALUE_ACT) return NULL;
    int p = g->values[v].producer;
    if (p < 0 || g->ops[p].dead || g->ops[p].kind != kind) return NULL;
    return &g->ops[p];
}

static int op_index(const kiln_graph *g, const kiln_op *op) { return (int)(op - g->ops); }

static int min3(int a, int b, int c) { return a < b ? (a < c ? a : c) : (b < c ? b : c); }

/* fuse-add-rmsnorm: s = add(x, r); y = rmsnorm(s, w) → (s', y') = add_rmsnorm(x, r, w). */
int kiln_pass_fuse_add_rmsnorm(kiln_graph *g, kiln_error *err) {
    int n = 0;
    for (int i = 0; i < g->n_ops; i++) {
        kiln_op norm = g->ops[i];
        if (norm.dead || norm.kind != KILN_OP_RMSNORM) continue;
        const kiln_op *add = producer(g, norm.in[0], KILN_OP_ADD);
        if (!add) continue;
        int at = op_index(g, add), sum = add->out[0], normed = norm.out[0];
        int in[3] = {add->in[0], add->in[1], norm.in[1]};
        int outs[2];
        if (kiln_ir_op_at(g, at, KILN_OP_ADD_RMSNORM, in, 3, &norm.attrs, g->values[sum].name, outs, err) < 0)
            return -1;
        kiln_ir_replace_uses(g, sum, outs[0]);
        kiln_ir_replace_uses(g, normed, outs[1]);
        /* the rmsnorm now reads nothing live; mark it so it is not matched again */
        g->ops[i + 1].dead = true;
        i++;
        n++;
    }
    return n;
}

/* One of attention's inputs traced back to its projection: [rope(] [head_rmsnorm(] [bias_add(] linear(h, W)
 * [, b)] [, norm)] [, pos)], each intermediate read once. 0 when the value is not of that form. */
typedef struct qkv_branch {
    const kiln_op *rope, *norm, *lin;
    int bias; /* the bias weight, or -1 */
} qkv_branch;

static int trace_qkv(const kiln_graph *g, int v, bool rotated, qkv_branch *b) {
    *b = (qkv_branch){.bias = -1};
    if (kiln_ir_use_count(g, v) != 1) return 0;
    if (rotated) {
        if (!(b->rope = producer(g, v, KILN_OP_ROPE))) return 0;
        v = b->rope->in[0];
        if ((b->norm = producer(g, v, KILN_OP_HEAD_RMSNORM))) {
            if (kiln_ir_use_count(g, v) != 1) return 0;
            v = b->norm->in[0];
        }
    }
    const kiln_op *ba = producer(g, v, KILN_OP_BIAS_ADD);
    if (ba) {
        if (kiln_ir_use_count(g, v) != 1) return 0;
        b->bias = ba->in[1];
        v = ba->in[0];
    }
    if (!(b->lin = producer(g, v, KILN_OP_LINEAR)) || kiln_ir_use_count(g, v) != 1) return 0;
    return 1;
}

static int first_op(const kiln_graph *g, const qkv_branch *b, int n) {
    int at = g->n_ops;
    for (int i = 0; i < n; i++) {
        int j = op_index(g, b[i].lin);
        if (j < at) at = j;
    }
    return at;
}

/* fuse-qkv-rope: attention(rope(linear(h,Wq)), rope(linear(h,Wk)), linear(h,Wv), pos)
 * → attention(qkv_rope(h, Wq, Wk, Wv, pos)...). Qwen's forms fuse too: biases after the three
 * projections (bias_add: +qkv_bias, inputs bq, bk, bv) and a per-head RMSNorm of q and k before RoPE
 * (head_rmsnorm: +qk_norm, inputs q_norm, k_norm, its eps in the op's attrs). */
int kiln_pass_fuse_qkv_rope(kiln_graph *g, kiln_error *err) {
    int n = 0;
    for (int i = 0; i < g->n_ops; i++) {
        if (g->ops[i].dead || g->ops[i].kind != KILN_OP_ATTENTION) continue;
        int qi = g->ops[i].in[0], ki = g->ops[i].in[1], vi = g->ops[i].in[2];
        qkv_branch b[3];
        if (!trace_qkv(g, qi, true, &b[0]) || !trace_qkv(g, ki, true, &b[1]) || !trace_qkv(g, vi, false, &b[2]))
            continue;
        const kiln_op *rq = b[0].rope, *rk = b[1].rope;
        int h = b[0].lin->in[0];
        if (b[1].lin->in[0] != h || b[2].lin->in[0] != h || rq->in[1] != rk->in[1]) continue;
        const bool bias = b[0].bias >= 0, norm = b[0].norm != NULL;
        if ((b[1].bias >= 0) != bias || (b[2].bias >= 0) != bias || (b[1].norm != NULL) != norm) continue;
        if (norm && (b[0].norm->attrs.eps != b[1].norm->attrs.eps || b[0].norm->attrs.head_dim != rq->attrs.head_dim ||
                     b[1].norm->attrs.head_dim != rk->attrs.head_dim))
            continue;
        kiln_op_attrs a = rq->attrs;
        a.n_kv_heads = rk->attrs.n_heads;
        a.layer = g->ops[i].attrs.layer;
        kiln_op_attrs ak = rk->attrs;
        ak.n_heads = a.n_heads; /* compare everything but the head count */
        ak.n_kv_heads = a.n_kv_heads;
        ak.layer = a.layer;
        if (memcmp(&a, &ak, sizeof a) != 0) continue; /* q and k rotated differently: leave them */
        int in[10] = {h, b[0].lin->in[1], b[1].lin->in[1], b[2].lin->in[1], rq->in[1]}, n_in = 5;
        if (bias) {
            a.flags |= KILN_FLAG_QKV_BIAS;
            for (int j = 0; j < 3; j++) in[n_in++] = b[j].bias;
        }
        if (norm) {
            a.flags |= KILN_FLAG_QK_NORM;
            a.eps = b[0].norm->attrs.eps;
            in[n_in++] = b[0].norm->in[1];
            in[n_in++] = b[1].norm->in[1];
        }
        int outs[3];
        char label[KILN_NAME_MAX];
        snprintf(label, sizeof label, "l%d.qkv", a.layer);
        if (kiln_ir_op_at(g, first_op(g, b, 3), KILN_OP_QKV_ROPE, in, n_in, &a, label, outs, err) < 0) return -1;
        kiln_ir_replace_uses(g, qi, outs[0]);
        kiln_ir_replace_uses(g, ki, outs[1]);
        kiln_ir_replace_uses(g, vi, outs[2]);
        i++; /* the attention op moved down by one */
        n++;
    }
    return n;
}

/* fuse-gate-up-swiglu: mul(silu(linear(h,Wg)), linear(h,Wu)) → gate_up_swiglu(h, Wg, Wu). */
/* Whether mul op `mul` is silu(linear(h, Wg)) * linear(h, Wu) (in either order), the silu, both products
 * and the gate's output read only there: its gate and up projections and the silu then in *gate, *up, *silu. */
static bool swiglu_of(const kiln_graph *g, const kiln_op *mul, const kiln_op **gate, const kiln_op **up,
                      const kiln_op **silu) {
    for (int side = 0; side < 2; side++) {
        const int a = mul->in[side], b = mul->in[1 - side];
        *silu = producer(g, a, KILN_OP_SILU);
        *up = producer(g, b, KILN_OP_LINEAR);
        *gate = *silu ? producer(g, (*silu)->in[0], KILN_OP_LINEAR) : NULL;
        if (*gate && *up && (*gate)->in[0] == (*up)->in[0] && kiln_ir_use_count(g, a) == 1 &&
            kiln_ir_use_count(g, b) == 1 && kiln_ir_use_count(g, (*gate)->out[0]) == 1)
            return true;
    }
    return false;
}

int kiln_pass_fuse_gate_up_swiglu(kiln_graph *g, kiln_error *err) {
    int n = 0;
    for (int i = 0; i < g->n_ops; i++) {
        if (g->ops[i].dead || g->ops[i].kind != KILN_OP_MUL) continue;
        int m = g->ops[i].out[0];
        const kiln_op *gate, *up, *silu;
        if (swiglu_of(g, &g->ops[i], &gate, &up, &silu)) {
            int at = min3(op_index(g, gate), op_index(g, up), op_index(g, silu));
            int in[3] = {gate->in[0], gate->in[1], up->in[1]};
            int out = -1;
            if (kiln_ir_op_at(g, at, KILN_OP_GATE_UP_SWIGLU, in, 3, NULL, g->values[m].name, &out, err) < 0)
                return -1;
            kiln_ir_replace_uses(g, m, out);
            i++;
            n++;
        }
    }
    return n;
}

/* fold-permute-into-rows: permute(silu(linear(h, Wg)) * linear(h, Wu), perm) → the same SwiGLU over Wg and
 * Wu with their rows in perm's order (row r of each = its row perm[r]): the product is elementwise, so its
 * elements come out in that order with no gather (act-order GPTQ's down_proj input). Each of m, the silu,
 * both projections and both weights must have that one reader, and the weights no order yet. */
int kiln_pass_fold_permute_into_rows(kiln_graph *g, kiln_error *err) {
    (void)err;
    int n = 0;
    for (int i = 0; i < g->n_ops; i++) {
        const kiln_op *pm = &g->ops[i];
        if (pm->dead || pm->kind != KILN_OP_PERMUTE) continue;
        const kiln_value *order = &g->values[pm->in[1]];
        const kiln_op *mul = producer(g, pm->in[0], KILN_OP_MUL), *gate, *up, *silu;
        if (!mul || !order->src || order->dtype != KILN_DTYPE_I32 || kiln_ir_use_count(g, pm->in[0]) != 1 ||
            !swiglu_of(g, mul, &gate, &up, &silu))
            continue;
        kiln_value *wg = &g->values[gate->in[1]], *wu = &g->values[up->in[1]];
        if (kiln_ir_use_count(g, gate->in[1]) != 1 || kiln_ir_use_count(g, up->in[1]) != 1 || wg == wu ||
            wg->row_perm || wu->row_perm || wg->n_parts || wu->n_parts)
            continue;
        wg->row_perm = wu->row_perm = (const int32_t *)order->src;
        kiln_ir_replace_uses(g, pm->out[0], pm->in[0]);
        g->ops[i].dead = true;
        n++;
    }
    return n;
}

/* fold-permute-into-norm: permute(y, perm) where y is an rmsnorm's or add_rmsnorm's normalised output read by
 * nothing else → the norm with +out_perm and perm as its last input: it writes y in that order itself (act-order
 * GPTQ's q/k/v and gate/up input; no gather kernel). The norm then no longer folds into the GEMV after it
 * (fold-norm-into-ck-gemv, norm-out-fp8 leave +out_perm norms alone). */
int kiln_pass_fold_permute_into_norm(kiln_graph *g, kiln_error *err) {
    (void)err;
    int n = 0;
    for (int i = 0; i < g->n_ops; i++) {
        const kiln_op *pm = &g->ops[i];
        if (pm->dead || pm->kind != KILN_OP_PERMUTE) continue;
        const int y = pm->in[0], p = y >= 0 ? g->values[y].producer : -1;
        if (p < 0 || kiln_ir_use_count(g, y) != 1) continue;
        kiln_op *nm = &g->ops[p];
        const bool plain = nm->kind == KILN_OP_RMSNORM, add = nm->kind == KILN_OP_ADD_RMSNORM;
        if (nm->dead || !(plain || (add && nm->out[1] == y)) || nm->n_in >= KILN_MAX_OP_IN ||
            (nm->attrs.flags & (KILN_FLAG_OUT_PERM | KILN_FLAG_FOLD_INTO_GEMV | KILN_FLAG_OUT_FP8)))
            continue;
        nm->in[nm->n_in++] = pm->in[1];
        nm->attrs.flags |= KILN_FLAG_OUT_PERM;
        kiln_ir_replace_uses(g, pm->out[0], y);
        g->ops[i].dead = true;
        n++;
    }
    return n;
}

/* fuse-linear-residual: (s, y) = add_rmsnorm(linear(h, W), r, w) → s = linear_add(h, W, r); y = rmsnorm(s, w).
 * The projection adds its product into the residual stream itself (o_proj and down_proj), so the norm
 * after it has nothing to add. Runs dce first, so that ops earlier fusions replaced do not count as readers. */
int kiln_pass_fuse_linear_residual(kiln_graph *g, kiln_error *err) {
    kiln_ir_dce(g); /* fuse-add-rmsnorm leaves its old add reading the projection until dce */
    int n = 0;
    for (int i = 0; i < g->n_ops; i++) {
        kiln_op an = g->ops[i];
        if (an.dead || an.kind != KILN_OP_ADD_RMSNORM) continue;
        for (int side = 0; side < 2; side++) {
            const kiln_op *lin = producer(g, an.in[side], KILN_OP_LINEAR);
            int r = an.in[1 - side];
            if (!lin || kiln_ir_use_count(g, an.in[side]) != 1 || g->values[r].kind != KILN_VALUE_ACT) continue;
            int la_in[3] = {lin->in[0], lin->in[1], r};
            int sum = an.out[0], normed = an.out[1];
            char label[KILN_NAME_MAX];
            snprintf(label, sizeof label, "%s", g->values[sum].name);
            int s_new = -1, y_new = -1;
            if (kiln_ir_op_at(g, i, KILN_OP_LINEAR_ADD, la_in, 3, NULL, label, &s_new, err) < 0) return -1;
            int rn_in[2] = {s_new, an.in[2]};
            kiln_op_attrs na = {.eps = an.attrs.eps};
            if (kiln_ir_op_at(g, i + 1, KILN_OP_RMSNORM, rn_in, 2, &na, g->values[normed].name, &y_new, err) < 0)
                return -1;
            kiln_ir_replace_uses(g, sum, s_new);
            kiln_ir_replace_uses(g, normed, y_new);
            g->ops[i + 2].dead = true; /* the add_rmsnorm; the linear has no reader left: dce drops it */
            i += 2;
            n++;
            break;
        }
    }
    return n;
}

/* The packed weight's name: `from` with `part` (e.g. "q_proj") replaced by `with` ("qkv_proj"), else
 * `from` + "+packed". */
static void packed_name(char out[KILN_NAME_MAX], const char *from, const char *part, const char *with) {
    const char *at = strstr(from, part);
    if (at && strlen(from) - strlen(part) + strlen(with) < KILN_NAME_MAX)
        snprintf(out, KILN_NAME_MAX, "%.*s%s%s", (int)(at - from), from, with, at + strlen(part));
    else
        snprintf(out, KILN_NAME_MAX, "%.*s+packed", KILN_NAME_MAX - 8, from);
}

/* pack-weights: the weights of qkv_rope and gate_up_swiglu into the layout their GPU kernels read,
 * once, at compile time: [Wq; Wk; Wv] rows (qkv_rope_packed) and gate/up rows interleaved
 * (gate_up_swiglu_packed), so that loading weights is a copy. */
int kiln_pass_pack_weights(kiln_graph *g, kiln_error *err) {
    int n = 0;
    for (int i = 0; i < g->n_ops; i++) {
        kiln_op op = g->ops[i];
        if (op.dead || (op.kind != KILN_OP_QKV_ROPE && op.kind != KILN_OP_GATE_UP_SWIGLU)) continue;
        const bool qkv = op.kind == KILN_OP_QKV_ROPE;
        char name[KILN_NAME_MAX];
        packed_name(name, g->values[op.in[1]].name, qkv ? "q_proj" : "gate_proj", qkv ? "qkv_proj" : "gate_up_proj");
        int w = kiln_ir_weight_packed(g, name, qkv ? KILN_PACK_CONCAT_ROWS : KILN_PACK_INTERLEAVE_ROWS, op.in + 1,
                                      qkv ? 3 : 2, err);
        if (w < 0) return -1;
        int in[KILN_MAX_OP_IN] = {op.in[0], w, qkv ? op.in[4] : -1}, n_in = qkv ? 3 : 2;
        const int *rest = op.in + 5; /* qkv_rope's optional inputs */
        if (qkv && (op.attrs.flags & KILN_FLAG_QKV_BIAS)) { /* [bq; bk; bv] */
            packed_name(name, g->values[rest[0]].name, "q_proj", "qkv_proj");
            if ((in[n_in++] = kiln_ir_weight_packed(g, name, KILN_PACK_CONCAT_ROWS, rest, 3, err)) < 0) return -1;
            rest += 3;
        }
        if (qkv && (op.attrs.flags & KILN_FLAG_QK_NORM)) {
            in[n_in++] = rest[0];
            in[n_in++] = rest[1];
        }
        int outs[3];
        if (kiln_ir_op_at(g, i, qkv ? KILN_OP_QKV_ROPE_PACKED : KILN_OP_GATE_UP_SWIGLU_PACKED, in, n_in, &op.attrs,
                          g->values[op.out[0]].name, outs, err) < 0)
            return -1;
        for (int k = 0; k < op.n_out; k++) kiln_ir_replace_uses(g, op.out[k], outs[k]);
        g->ops[i + 1].dead = true;
        i++;
        n++;
    }
    return n;
}

/* decode-attention-rope: attention over a qkv_rope's q, k, v rotates them and writes the KV cache
 * itself when a step decodes (KILN_FLAG_DECODE_ROPE). */
int kiln_pass_decode_attention_rope(kiln_graph *g, kiln_error *err) {
    (void)err;
    int n = 0;
    for (int i = 0; i < g->n_ops; i++) {
        kiln_op *at = &g->ops[i];
        if (at->dead || at->kind != KILN_OP_ATTENTION || (at->attrs.flags & KILN_FLAG_DECODE_ROPE)) continue;
        const kiln_op *q = producer(g, at->in[0], KILN_OP_QKV_ROPE);
        if (!q) q = producer(g, at->in[0], KILN_OP_QKV_ROPE_PACKED);
        if (!q || q->out[0] != at->in[0] || q->out[1] != at->in[1] || q->out[2] != at->in[2]) continue;
        /* the attention kernel's own rotation knows no biases or q/k norms: rope_kv does those */
        if (q->attrs.flags & (KILN_FLAG_QKV_BIAS | KILN_FLAG_QK_NORM)) continue;
        at->attrs.flags |= KILN_FLAG_DECODE_ROPE;
        n++;
    }
    return n;
}

/* decode-attention-merge: at decode the last split block of each head merges the splits
 * (KILN_FLAG_MERGE_SPLITS; measured slower on the H200, so not in the default pipeline). */
int kiln_pass_decode_attention_merge(kiln_graph *g, kiln_error *err) {
    (void)err;
    int n = 0;
    for (int i = 0; i < g->n_ops; i++)
        if (!g->ops[i].dead && g->ops[i].kind == KILN_OP_ATTENTION && !(g->ops[i].attrs.flags & KILN_FLAG_MERGE_SPLITS)) {
            g->ops[i].attrs.flags |= KILN_FLAG_MERGE_SPLITS;
            n++;
        }
    return n;
}

const kiln_op *kiln_pass_sole_projection(const kiln_graph *g, int i) {
    const kiln_op *op = &g->ops[i];
    int j = i + 1;
    while (j < g->n_ops && g->ops[j].dead) j++;
    if (op->dead || j == g->n_ops) return NULL;
    const kiln_op *nx = &g->ops[j];
    if (!kiln_op_matrices(nx->kind) || nx->in[0] != op->out[0] || kiln_ir_use_count(g, op->out[0]) != 1)
        return NULL;
    return nx;
}

bool kiln_pass_matrices_are(const kiln_graph *g, const kiln_op *op, int (*ok)(int dtype)) {
    for (int j = 1; j <= kiln_op_matrices(op->kind); j++)
        if (!ok(g->values[op->in[j]].dtype)) return false;
    return true;
}

/* The projection that an rmsnorm (op i) can fold into (kiln_pass_sole_projection); NULL otherwise. */
static const kiln_op *fold_target(const kiln_graph *g, int i) {
    const kiln_op *rn = &g->ops[i];
    if (rn->kind != KILN_OP_RMSNORM || (rn->attrs.flags & (KILN_FLAG_FOLD_INTO_GEMV | KILN_FLAG_OUT_PERM))) return NULL;
    return kiln_pass_sole_projection(g, i);
}

/* fold-norm-into-gemv: an rmsnorm whose one reader is the next op, a projection reading it as its
 * input, is folded into that projection's GEMV prologue at decode (KILN_FLAG_FOLD_INTO_GEMV;
 * not in the default pipeline: it drops HF's bf16 rounding of the normalised input). */
int kiln_pass_fold_norm_into_gemv(kiln_graph *g, kiln_error *err) {
    (void)err;
    int n = 0;
    for (int i = 0; i + 1 < g->n_ops; i++)
        if (fold_target(g, i)) {
            g->ops[i].attrs.flags |= KILN_FLAG_FOLD_INTO_GEMV;
            n++;
        }
    return n;
}

/* fold-norm-into-ck-gemv (after quantize): as fold-norm-into-gemv, for the norms whose projection's
 * matrices take the one-token GEMV whose block's warps split K (gemv.cuh kiln_gemv_ck: q4 and fp8),
 * and at steps of one token only (+fold_into_gemv +one_token). That kernel's block holds the whole x
 * row anyway, so the sum of squares is one block reduction; measured 8 % faster per int4 7B step and
 * 4 % per fp8 one on the H200, and slower at 8 tokens (the tensor-core GEMV) and for q8 and bf16 at
 * any step (docs/quantization.md). */
int kiln_pass_fold_norm_into_ck_gemv(kiln_graph *g, kiln_error *err) {
    (void)err;
    int n = 0;
    for (int i = 0; i + 1 < g->n_ops; i++) {
        const kiln_op *nx = fold_target(g, i);
        /* every matrix takes the one-token GEMV whose warps split K (q4 in groups of any size, fp8) */
        if (!nx || !kiln_pass_matrices_are(g, nx, kiln_quant_gemv_ck)) continue;
        g->ops[i].attrs.flags |= KILN_FLAG_FOLD_INTO_GEMV | KILN_FLAG_FOLD_ONE_TOKEN;
        n++;
    }
    return n;
}

int kiln_pass_dce(kiln_graph *g, kiln_error *err) {
    (void)err;
    return kiln_ir_dce(g);
}
