/*
 * tensor_parallel.c — pass tensor-parallel: split the imported graph over
 * g->tp_request ranks (Megatron-style), so that one plan is what every rank
 * runs on its own shard of each weight.
 *
 * Contract: the coarse graph as imported → the graph of one rank: q/k/v and
 * gate/up column-parallel (weight rows split: whole heads, KV heads among
 * the ranks; their biases split alike), o_proj and down_proj row-parallel (weight columns split) and
 * each followed by an all_reduce, the embedding and LM head vocabulary-
 * parallel (table rows split; the embedding's partial rows all-reduced, the
 * logits all-gathered). Norms and the residual stream stay whole on every
 * rank.
 *
 * How: every activation is in one of three states, propagated op by op —
 * WHOLE (the same on every rank), SPLIT (each rank holds its columns:
 * its heads, its FFN slice) or PARTIAL (each rank holds a partial sum). A
 * linear over a WHOLE input becomes column-parallel (SPLIT out), a linear
 * over a SPLIT input row-parallel (PARTIAL out, then all_reduce → WHOLE).
 * Head counts in attributes become one rank's; each op's outputs are
 * re-inferred from its (now sharded) inputs. Weights are sharded in place:
 * the value's shape becomes one rank's and kiln_value.shard says how the
 * writer slices the source for each rank.
 *
 * It runs first, on coarse ops, so the fusions that follow see one rank's
 * graph: fuse-linear-residual finds no linear directly before its
 * add_rmsnorm (an all_reduce is in between) and leaves the residual add
 * after the reduction, where it must be added once, not once per rank.
 * kiln_passes_run runs it when tp_request > 1 (kiln compile --tp N).
 */
#include "kiln_passes.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { WHOLE = 0, SPLIT = 1, PARTIAL = 2 };

/* Shard weight v along `how` over n ranks (a weight already sharded the same way, e.g. an embedding
 * tied to the LM head, is left as it is). */
static int shard_weight(kiln_graph *g, int v, kiln_shard how, int n, const char *role, kiln_error *err) {
    kiln_value *w = &g->values[v];
    /* matrices by rows or columns; vectors (biases) by rows */
    if (w->kind != KILN_VALUE_WEIGHT || w->pack != KILN_PACK_NONE ||
        !(w->ndim == 2 || (w->ndim == 1 && how == KILN_SHARD_ROWS))) {
        kiln_err(err, KILN_ERR_VERIFY, "tensor-parallel: %s weight %s is not a plain weight of its kind", role,
                 w->name);
        return -1;
    }
    if (w->shard == how) return 0;
    if (w->shard != KILN_SHARD_NONE) {
        kiln_err(err, KILN_ERR_UNSUPPORTED, "tensor-parallel: weight %s is used split by rows and by columns",
                 w->name);
        return -1;
    }
    int d = how == KILN_SHARD_ROWS ? 0 : 1;
    if (w->shape[d] % n) {
        kiln_err(err, KILN_ERR_UNSUPPORTED, "--tp %d: %s weight %s has %lld %s, which do not divide among %d ranks",
                 n, role, w->name, (long long)w->shape[d], d ? "columns" : "rows", n);
        return -1;
    }
    w->shape[d] /= n;
    w->shard = how;
    return 0;
}

/* Re-infer op i's outputs from its inputs (whose shapes the pass changed). */
static int reinfer(kiln_graph *g, int i, kiln_error *err) {
    kiln_op *op = &g->ops[i];
    kiln_value outs[KILN_MAX_OP_OUT];
    if (kiln_ir_infer(g, op->kind, op->in, op->n_in, &op->attrs, outs, err) != KILN_OK) return -1;
    for (int k = 0; k < op->n_out; k++) {
        kiln_value *o = &g->values[op->out[k]];
        memcpy(o->shape, outs[k].shape, sizeof o->shape);
    }
    return 0;
}

/* Insert a collective of `kind` right after op i over its output 0, and make every later reader
 * (and the graph output) read the collective's result. Returns the new value, or -1. */
static int insert_collective(kiln_graph *g, int i, kiln_op_kind kind, int n, kiln_error *err) {
    int from = g->ops[i].out[0], to = -1;
    char label[KILN_NAME_MAX];
    snprintf(label, sizeof label, "%.100s.%s", g->values[from].name, kind == KILN_OP_ALL_REDUCE ? "sum" : "gather");
    kiln_op_attrs a = {.ranks = n};
    if (kiln_ir_op_at(g, i + 1, kind, &from, 1, &a, label, &to, err) < 0) return -1;
    kiln_ir_replace_uses(g, from, to);
    g->ops[i + 1].in[0] = from; /* replace_uses redirected the collective's own input too */
    return to;
}

static int bad_state(kiln_graph *g, int i, const char *why, kiln_error *err) {
    kiln_err(err, KILN_ERR_UNSUPPORTED, "tensor-parallel: op %d (%s) %s", i, kiln_op_name(g->ops[i].kind), why);
    kiln_err_hint(err, "the pass knows the Llama-family graph kiln imports; compile this model with --tp 1");
    return -1;
}

static int div_heads(kiln_graph *g, int i, int32_t *heads, int n, const char *what, kiln_error *err) {
    if (*heads % n) {
        kiln_err(err, KILN_ERR_UNSUPPORTED, "--tp %d: %d %s do not divide among %d ranks (op %d, %s)", n, *heads,
                 what, n, i, kiln_op_name(g->ops[i].kind));
        return -1;
    }
    *heads /= n;
    return 0;
}

int kiln_pass_tensor_parallel(kiln_graph *g, kiln_error *err) {
    const int n = g->tp_request;
    if (n <= 1) return 0;
    if (g->n_ranks == n) return 0; /* split already */
    if (g->n_ranks > 1) {
        kiln_err(err, KILN_ERR_VERIFY, "tensor-parallel: the graph is split over %d ranks already", g->n_ranks);
        return -1;
    }
    if (n > KILN_MAX_RANKS) {
        kiln_err(err, KILN_ERR_INVALID_ARG, "--tp %d: at most %d ranks", n, KILN_MAX_RANKS);
        return -1;
    }
    /* heads first, so that a KV-head count that does not divide is named as such (not by the k RoPE) */
    for (int i = 0; i < g->n_ops; i++) {
        kiln_op_attrs a = g->ops[i].attrs;
        if (!g->ops[i].dead && g->ops[i].kind == KILN_OP_ATTENTION &&
            (div_heads(g, i, &a.n_heads, n, "attention heads (num_attention_heads)", err) < 0 ||
             div_heads(g, i, &a.n_kv_heads, n, "KV heads (num_key_value_heads)", err) < 0))
            return -1;
    }
    char *state = calloc((size_t)g->n_values + (size_t)g->n_ops + 8, 1); /* room for the collectives' outputs */
    if (!state) {
        kiln_err(err, KILN_ERR_NOMEM, "tensor-parallel: out of memory");
        return -1;
    }
    int rewrites = 0, rc = -1;
    for (int i = 0; i < g->n_ops; i++) {
        kiln_op *op = &g->ops[i];
        if (op->dead) continue;
        int s0 = state[op->in[0]], s1 = op->n_in > 1 ? state[op->in[1]] : s0, out = WHOLE;
        kiln_op_kind collective = KILN_OP_COUNT_;
        switch (op->kind) {
        case KILN_OP_EMBEDDING: /* vocabulary-parallel: rank r looks up its rows, zeros elsewhere, then a sum */
            if (shard_weight(g, op->in[1], KILN_SHARD_ROWS, n, "embedding (vocab_size)", err) < 0) goto out;
            op->attrs.ranks = n;
            out = PARTIAL, collective = KILN_OP_ALL_REDUCE;
            break;
        case KILN_OP_RMSNORM:
        case KILN_OP_ADD:
            if (s0 != WHOLE || s1 != WHOLE) {
                bad_state(g, i, "reads a split or partial activation", err);
                goto out;
            }
            break;
        case KILN_OP_LINEAR:
            if (s0 == WHOLE) { /* column-parallel: this rank's output features */
                if (shard_weight(g, op->in[1], KILN_SHARD_ROWS, n, "column-parallel", err) < 0) goto out;
                out = SPLIT;
            } else if (s0 == SPLIT) { /* row-parallel: this rank's input features, a partial sum */
                if (shard_weight(g, op->in[1], KILN_SHARD_COLS, n, "row-parallel", err) < 0) goto out;
                out = PARTIAL, collective = KILN_OP_ALL_REDUCE;
            } else {
                bad_state(g, i, "reads a partial sum", err);
                goto out;
            }
            break;
        case KILN_OP_LM_HEAD: /* vocabulary-parallel: this rank's logits, then gathered */
            if (s0 != WHOLE) {
                bad_state(g, i, "reads a split or partial activation", err);
                goto out;
            }
            if (shard_weight(g, op->in[1], KILN_SHARD_ROWS, n, "LM head (vocab_size)", err) < 0) goto out;
            out = SPLIT, collective = KILN_OP_ALL_GATHER;
            break;
        case KILN_OP_ROPE:
        case KILN_OP_HEAD_RMSNORM:
            if (s0 != SPLIT) {
                bad_state(g, i, "reads heads that are not split among the ranks", err);
                goto out;
            }
            if (div_heads(g, i, &op->attrs.n_heads, n, "heads", err) < 0) goto out;
            out = SPLIT;
            break;
        case KILN_OP_ATTENTION:
            if (s0 != SPLIT || s1 != SPLIT || state[op->in[2]] != SPLIT) {
                bad_state(g, i, "reads q, k or v not split by heads", err);
                goto out;
            }
            if (div_heads(g, i, &op->attrs.n_heads, n, "attention heads (num_attention_heads)", err) < 0 ||
                div_heads(g, i, &op->attrs.n_kv_heads, n, "KV heads (num_key_value_heads)", err) < 0)
                goto out;
            out = SPLIT;
            break;
        case KILN_OP_BIAS_ADD: /* Qwen2's q/k/v biases: split like the rows of their projection */
            if (s0 == PARTIAL) {
                bad_state(g, i, "adds a bias to a partial sum", err);
                goto out;
            }
            if (s0 == SPLIT && shard_weight(g, op->in[1], KILN_SHARD_ROWS, n, "bias", err) < 0) goto out;
            out = s0;
            break;
        case KILN_OP_SILU:
        case KILN_OP_MUL:
            if (s0 != s1 || s0 == PARTIAL) {
                bad_state(g, i, "mixes split and whole activations", err);
                goto out;
            }
            out = s0;
            break;
        case KILN_OP_PERMUTE: /* act-order GPTQ's input order: every rank permutes the whole input alike */
            if (s0 != WHOLE) {
                kiln_err(err, KILN_ERR_UNSUPPORTED, "tensor-parallel: op %d (permute): an act-order GPTQ projection "
                         "split by its input columns (o_proj, down_proj) reads them in an order that crosses the "
                         "ranks' slices; that is not built yet", i);
                kiln_err_hint(err, "compile this checkpoint with --tp 1, or use one quantized without act-order "
                                   "(desc_act false)");
                goto out;
            }
            out = WHOLE;
            break;
        case KILN_OP_MOE:
            kiln_err(err, KILN_ERR_UNSUPPORTED, "tensor-parallel: op %d (moe, layer %d): splitting a mixture of "
                     "experts over ranks is not built yet", i, op->attrs.layer);
            kiln_err_hint(err, "compile this model with --tp 1 (docs/parallelism.md says how experts would be "
                               "split)");
            goto out;
        default:
            kiln_err(err, KILN_ERR_UNSUPPORTED, "tensor-parallel: op %d (%s) is not an imported op", i,
                     kiln_op_name(op->kind));
            kiln_err_hint(err, "the pass runs on the graph as imported, before any fusion");
            goto out;
        }
        if (reinfer(g, i, err) < 0) goto out;
        for (int k = 0; k < op->n_out; k++) state[op->out[k]] = (char)out;
        rewrites++;
        if (collective != KILN_OP_COUNT_) {
            int v = insert_collective(g, i, collective, n, err);
            if (v < 0) goto out;
            state[v] = WHOLE;
            i++; /* past the collective */
            rewrites++;
        }
    }
    if (state[g->logits] != WHOLE) {
        kiln_err(err, KILN_ERR_VERIFY, "tensor-parallel: the logits are not whole on every rank");
        goto out;
    }
    if (g->info.n_kv_heads % n) {
        kiln_err(err, KILN_ERR_UNSUPPORTED, "--tp %d: %d KV heads do not divide among %d ranks", n,
                 g->info.n_kv_heads, n);
        goto out;
    }
    g->info.n_kv_heads /= n;
    g->n_ranks = n;
    rc = rewrites;
out:
    free(state);
    return rc;
}
