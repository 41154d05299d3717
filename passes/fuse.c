/*
 * fuse.c — the fusion passes. Each one finds its pattern, inserts the fused
 * op where the pattern's first op stood (so its inputs are already defined),
 * redirects the uses of the pattern's results to the fused op's outputs and
 * leaves the old ops for dce to drop. A pattern whose intermediate results
 * have other uses is left alone.
 */
#include "kiln_passes.h"

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

/* fuse-qkv-rope: attention(rope(linear(h,Wq)), rope(linear(h,Wk)), linear(h,Wv), pos)
 * → attention(qkv_rope(h, Wq, Wk, Wv, pos)...). */
int kiln_pass_fuse_qkv_rope(kiln_graph *g, kiln_error *err) {
    int n = 0;
    for (int i = 0; i < g->n_ops; i++) {
        if (g->ops[i].dead || g->ops[i].kind != KILN_OP_ATTENTION) continue;
        int qi = g->ops[i].in[0], ki = g->ops[i].in[1], vi = g->ops[i].in[2];
        const kiln_op *rq = producer(g, qi, KILN_OP_ROPE), *rk = producer(g, ki, KILN_OP_ROPE);
        const kiln_op *lv = producer(g, vi, KILN_OP_LINEAR);
        if (!rq || !rk || !lv) continue;
        const kiln_op *lq = producer(g, rq->in[0], KILN_OP_LINEAR), *lk = producer(g, rk->in[0], KILN_OP_LINEAR);
        if (!lq || !lk) continue;
        int h = lq->in[0];
        if (lk->in[0] != h || lv->in[0] != h || rq->in[1] != rk->in[1]) continue;
        if (kiln_ir_use_count(g, lq->out[0]) != 1 || kiln_ir_use_count(g, lk->out[0]) != 1 ||
            kiln_ir_use_count(g, qi) != 1 || kiln_ir_use_count(g, ki) != 1 || kiln_ir_use_count(g, vi) != 1)
            continue;
        kiln_op_attrs a = rq->attrs;
        a.n_kv_heads = rk->attrs.n_heads;
        a.layer = g->ops[i].attrs.layer;
        kiln_op_attrs ak = rk->attrs;
        ak.n_heads = a.n_heads; /* compare everything but the head count */
        ak.n_kv_heads = a.n_kv_heads;
        ak.layer = a.layer;
        if (memcmp(&a, &ak, sizeof a) != 0) continue; /* q and k rotated differently: leave them */
        int at = min3(op_index(g, lq), op_index(g, lk), op_index(g, lv));
        int in[5] = {h, lq->in[1], lk->in[1], lv->in[1], rq->in[1]};
        int outs[3];
        char label[KILN_NAME_MAX];
        snprintf(label, sizeof label, "l%d.qkv", a.layer);
        if (kiln_ir_op_at(g, at, KILN_OP_QKV_ROPE, in, 5, &a, label, outs, err) < 0) return -1;
        kiln_ir_replace_uses(g, qi, outs[0]);
        kiln_ir_replace_uses(g, ki, outs[1]);
        kiln_ir_replace_uses(g, vi, outs[2]);
        i++; /* the attention op moved down by one */
        n++;
    }
    return n;
}

/* fuse-gate-up-swiglu: mul(silu(linear(h,Wg)), linear(h,Wu)) → gate_up_swiglu(h, Wg, Wu). */
int kiln_pass_fuse_gate_up_swiglu(kiln_graph *g, kiln_error *err) {
    int n = 0;
    for (int i = 0; i < g->n_ops; i++) {
        if (g->ops[i].dead || g->ops[i].kind != KILN_OP_MUL) continue;
        int m = g->ops[i].out[0];
        for (int side = 0; side < 2; side++) {
            int a = g->ops[i].in[side], b = g->ops[i].in[1 - side];
            const kiln_op *silu = producer(g, a, KILN_OP_SILU);
            const kiln_op *up = producer(g, b, KILN_OP_LINEAR);
            if (!silu || !up) continue;
            const kiln_op *gate = producer(g, silu->in[0], KILN_OP_LINEAR);
            if (!gate || gate->in[0] != up->in[0]) continue;
            if (kiln_ir_use_count(g, a) != 1 || kiln_ir_use_count(g, b) != 1 ||
                kiln_ir_use_count(g, gate->out[0]) != 1)
                continue;
            int at = min3(op_index(g, gate), op_index(g, up), op_index(g, silu));
            int in[3] = {gate->in[0], gate->in[1], up->in[1]};
            int out = -1;
            if (kiln_ir_op_at(g, at, KILN_OP_GATE_UP_SWIGLU, in, 3, NULL, g->values[m].name, &out, err) < 0)
                return -1;
            kiln_ir_replace_uses(g, m, out);
            i++;
            n++;
            break;
        }
    }
    return n;
}

int kiln_pass_dce(kiln_graph *g, kiln_error *err) {
    (void)err;
    return kiln_ir_dce(g);
}
