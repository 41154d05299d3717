/*
 * plan_memory.c — memory planning: give every live activation a buffer slot
 * so that values whose lifetimes do not overlap share memory.
 *
 * A slot holds one activation of a fixed width (elements per token); the
 * runtime sizes it as width × max tokens per step (the CPU in f32, the GPU
 * in the engine's element type). Walking the ops in order, each output takes
 * a free slot of its width (or a new one), and an input's slot is freed after
 * its last reader. Outputs are placed before inputs are freed, so an op never
 * writes a buffer it reads, with one exception: an output that may overwrite
 * an input in place (kiln_op_inplace: add_rmsnorm's sum, linear_add's y,
 * all_reduce's sum) takes the slot of such an input of its width that no
 * later op reads and that the op reads at no other position. Both executors
 * then run that op in place: the GPU's GEMM accumulates into the residual,
 * its RMSNorm kernel adds into it. An RMSNorm flagged +fold_into_gemv keeps
 * its input alive until its output's last reader, the projection whose GEMV
 * then reads that input instead. The graph output (logits) keeps its slot
 * to the end.
 */
#include "kiln_passes.h"

#include <stdlib.h>

/* Input index of op i that output j may overwrite in place (-1: none): the first input that
 * kiln_op_inplace_over allows, an activation of the output's width whose last reader is op i. */
static int inplace_input(const kiln_graph *g, int i, int j, const int *last_use) {
    const kiln_op *op = &g->ops[i];
    const kiln_value *o = &g->values[op->out[j]];
    for (int b = 0; b < op->n_in; b++) {
        const int v = op->in[b];
        const kiln_value *x = &g->values[v];
        if (x->kind == KILN_VALUE_ACT && last_use[v] == i && x->slot >= 0 &&
            x->shape[x->ndim - 1] == o->shape[o->ndim - 1] &&
            kiln_op_inplace_over(op->kind, j, op->in, op->n_in, v))
            return b;
    }
    return -1;
}

int kiln_pass_plan_memory(kiln_graph *g, kiln_error *err) {
    int *last_use = malloc((size_t)g->n_values * sizeof *last_use);
    int64_t *slot_width = malloc((size_t)(g->n_values + 1) * sizeof *slot_width);
    char *slot_busy = calloc((size_t)g->n_values + 1, 1);
    int n_slots = 0;
    if (!last_use || !slot_width || !slot_busy) {
        free(last_use);
        free(slot_width);
        free(slot_busy);
        kiln_err(err, KILN_ERR_NOMEM, "out of memory planning buffers");
        return -1;
    }
    for (int v = 0; v < g->n_values; v++) {
        last_use[v] = -1;
        g->values[v].slot = -1;
    }
    for (int i = 0; i < g->n_ops; i++)
        for (int j = 0; j < g->ops[i].n_in; j++) last_use[g->ops[i].in[j]] = i;
    if (g->logits >= 0) last_use[g->logits] = g->n_ops; /* lives past the end */
    for (int i = 0; i < g->n_ops; i++) { /* a folded norm's input is read by its output's reader */
        const kiln_op *op = &g->ops[i];
        if (op->kind == KILN_OP_RMSNORM && (op->attrs.flags & KILN_FLAG_FOLD_INTO_GEMV) &&
            last_use[op->out[0]] > last_use[op->in[0]])
            last_use[op->in[0]] = last_use[op->out[0]];
    }

    for (int i = 0; i < g->n_ops; i++) {
        const kiln_op *op = &g->ops[i];
        for (int j = 0; j < op->n_out; j++) {
            kiln_value *o = &g->values[op->out[j]];
            const int b = inplace_input(g, i, j, last_use);
            if (b >= 0) { /* the input's slot passes to the output (not freed below: the output owns it) */
                o->slot = g->values[op->in[b]].slot;
                last_use[op->in[b]] = -2;
                continue;
            }
            int64_t w = o->shape[o->ndim - 1];
            int s = -1;
            for (int k = 0; k < n_slots && s < 0; k++)
                if (!slot_busy[k] && slot_width[k] == w) s = k;
            if (s < 0) {
                s = n_slots++;
                slot_width[s] = w;
            }
            slot_busy[s] = 1;
            o->slot = s;
        }
        /* an output nobody reads is freed once all outputs are placed (its op still writes it) */
        for (int j = 0; j < op->n_out; j++)
            if (last_use[op->out[j]] < 0) slot_busy[g->values[op->out[j]].slot] = 0;
        for (int j = 0; j < op->n_in; j++) {
            const kiln_value *v = &g->values[op->in[j]];
            if (v->kind == KILN_VALUE_ACT && last_use[op->in[j]] == i) slot_busy[v->slot] = 0;
        }
    }
    free(last_use);
    free(slot_width);
    free(slot_busy);
    return n_slots;
}
