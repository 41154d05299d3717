/*
 * verify.c — the IR verifier: SSA form, topological order, and every live
 * op's input kinds, shapes and dtypes (through kiln_ir_infer, the same
 * inference the builder used). Runs after every pass in debug and test
 * builds, and always before a plan is written.
 */
#include "kiln_ir.h"

#include <stdlib.h>
#include <string.h>

#define BAD(...) kiln_err(err, KILN_ERR_VERIFY, __VA_ARGS__)

static bool same_shape(const kiln_value *a, const kiln_value *b) {
    if (a->ndim != b->ndim || a->dtype != b->dtype) return false;
    for (int i = 0; i < a->ndim; i++)
        if (a->shape[i] != b->shape[i]) return false;
    return true;
}

kiln_status kiln_ir_verify(const kiln_graph *g, kiln_error *err) {
    if (g->tokens < 0 || g->tokens >= g->n_values || g->values[g->tokens].kind != KILN_VALUE_INPUT)
        return BAD("graph has no tokens input");
    if (g->positions < 0 || g->positions >= g->n_values || g->values[g->positions].kind != KILN_VALUE_INPUT)
        return BAD("graph has no positions input");
    if (g->logits < 0 || g->logits >= g->n_values || g->values[g->logits].dead)
        return BAD("graph output (logits) is not a live value");
    /* defined[v]: 1 once v is available to later ops */
    char *defined = calloc((size_t)g->n_values, 1);
    if (!defined) return kiln_err(err, KILN_ERR_NOMEM, "verifier: out of memory");
    kiln_status st = KILN_OK;
    for (int v = 0; v < g->n_values; v++) {
        const kiln_value *val = &g->values[v];
        if (val->dead) continue;
        if (val->kind != KILN_VALUE_ACT) defined[v] = 1;
        if (val->ndim < 0 || val->ndim > KILN_MAX_DIMS || (unsigned)val->dtype >= KILN_DTYPE_COUNT_) {
            st = BAD("value %%%d (%s) has a bad type", v, val->name);
            goto out;
        }
        if (val->kind == KILN_VALUE_WEIGHT)
            for (int d = 0; d < val->ndim; d++)
                if (val->shape[d] <= 0) {
                    st = BAD("weight %s has a non-constant dimension", val->name);
                    goto out;
                }
        if (val->kind == KILN_VALUE_WEIGHT && val->shard != KILN_SHARD_NONE && g->n_ranks < 2) {
            st = BAD("weight %s is one rank's shard, but the graph is not split over ranks", val->name);
            goto out;
        }
    }
    for (int i = 0; i < g->n_ops; i++) {
        const kiln_op *op = &g->ops[i];
        if (op->dead) continue;
        const char *opn = kiln_op_name(op->kind);
        if (op->n_out != kiln_op_n_out(op->kind)) {
            st = BAD("op %d (%s) has %d outputs, expected %d", i, opn, op->n_out, kiln_op_n_out(op->kind));
            goto out;
        }
        for (int j = 0; j < op->n_in; j++) {
            int v = op->in[j];
            if (v < 0 || v >= g->n_values || g->values[v].dead || !defined[v]) {
                st = BAD("op %d (%s) reads %%%d before it is defined (not in topological order or dead)", i, opn, v);
                goto out;
            }
        }
        /* tensor parallelism: every op that names ranks names the graph's */
        if (op->attrs.ranks && op->attrs.ranks != g->n_ranks) {
            st = BAD("op %d (%s) is for %d ranks, the graph is split over %d", i, opn, op->attrs.ranks, g->n_ranks);
            goto out;
        }
        kiln_value outs[KILN_MAX_OP_OUT];
        if ((st = kiln_ir_infer(g, op->kind, op->in, op->n_in, &op->attrs, outs, err)) != KILN_OK) {
            kiln_err_prefix(err, "op %d: ", i);
            goto out;
        }
        for (int j = 0; j < op->n_out; j++) {
            int v = op->out[j];
            if (v < 0 || v >= g->n_values || g->values[v].kind != KILN_VALUE_ACT) {
                st = BAD("op %d (%s) output %d is not an activation value", i, opn, j);
                goto out;
            }
            if (defined[v]) {
                st = BAD("value %%%d is defined twice (op %d, %s)", v, i, opn);
                goto out;
            }
            if (g->values[v].producer != i) {
                st = BAD("value %%%d records producer %d, but op %d makes it", v, g->values[v].producer, i);
                goto out;
            }
            if (!same_shape(&g->values[v], &outs[j])) {
                st = BAD("op %d (%s) output %%%d has the wrong shape or dtype", i, opn, v);
                goto out;
            }
            defined[v] = 1;
        }
    }
    if (!defined[g->logits]) {
        st = BAD("graph output %%%d is never computed", g->logits);
        goto out;
    }
out:
    free(defined);
    return st;
}
