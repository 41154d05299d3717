/*
 * kiln_ir.h — the graph IR: a small SSA graph of ops over typed tensors.
 *
 * A graph holds values (graph inputs, weights, activations) and ops in
 * topological order (an op's inputs are inputs, weights, or outputs of an
 * earlier op). Activation shapes carry the symbolic dims KILN_DIM_BATCH and
 * KILN_DIM_SEQ; weights have constant shapes. Every value has one producer
 * (none for inputs and weights).
 *
 * Passes rewrite a graph in place: they add ops, redirect uses and mark ops
 * dead; kiln_ir_dce() then drops what is no longer used. Value ids and op
 * indices are plain ints into the arrays; ids of values never change, op
 * indices change when ops are inserted or removed.
 *
 * The IR does no I/O and touches no device. A weight value keeps an opaque
 * pointer to its source bytes for the compiler's use.
 */
#ifndef KILN_IR_H
#define KILN_IR_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "../common/kiln_ops.h"
#include "../common/kiln_util.h"

typedef enum kiln_value_kind {
    KILN_VALUE_INPUT = 0,  /* graph input (tokens, positions) */
    KILN_VALUE_WEIGHT = 1, /* constant tensor from the checkpoint */
    KILN_VALUE_ACT = 2,    /* activation produced by an op */
} kiln_value_kind;

#define KILN_NAME_MAX 128

typedef enum kiln_pack {
    KILN_PACK_NONE = 0,
    KILN_PACK_CONCAT_ROWS = 1,     /* [part 0; part 1; ...] */
    KILN_PACK_INTERLEAVE_ROWS = 2, /* row r of every part in turn: 2 parts of R rows → row 2r, 2r + 1 */
} kiln_pack;
#define KILN_MAX_PACK 1024 /* parts of one packed weight: gate and up of each expert of a 512-expert layer */

/* How a weight of a tensor-parallel graph (kiln_graph.n_ranks > 1) is split
 * among the ranks (pass tensor-parallel). The value's shape is one rank's
 * shard; rank r's shard is the r-th of n_ranks equal slices of the source. */
typedef enum kiln_shard {
    KILN_SHARD_NONE = 0, /* every rank holds the whole weight (norms) */
    KILN_SHARD_ROWS = 1, /* rank r: source rows r*R .. (r+1)*R-1 (column-parallel projections, vocab shards) */
    KILN_SHARD_COLS = 2, /* rank r: source columns r*C .. (r+1)*C-1 of every row (row-parallel projections) */
} kiln_shard;

typedef struct kiln_value {
    kiln_value_kind kind;
    kiln_dtype dtype;
    int ndim;
    int64_t shape[KILN_MAX_DIMS]; /* negative = symbolic (KILN_DIM_BATCH, KILN_DIM_SEQ) */
    char name[KILN_NAME_MAX];     /* weights: checkpoint tensor name; others: readable label */
    int producer;                 /* index of the producing op, -1 for inputs/weights */
    bool dead;                    /* dropped by DCE; ignored everywhere */
    int slot;                     /* activations: buffer slot after memory planning, -1 before */
    /* weights only: where the bytes come from (owned by the front end) */
    const void *src;
    kiln_dtype src_dtype;
    /* weights packed from others (pass pack-weights; the import's expert stacks): rows of the parts,
     * concatenated or interleaved; src is NULL, the parts (live or not) keep theirs */
    kiln_pack pack;
    int n_parts;
    int *parts;                   /* n_parts value ids; owned by the graph */
    /* weights only: this value is one rank's slice of src (tensor parallelism; packed weights: of each part) */
    kiln_shard shard;
    /* weights only: a q4gG or fp8 matrix that came quantized from the checkpoint (AWQ, GPTQ,
     * compressed-tensors, FP8: kiln_ops.h); the writer repacks it (kiln_quant_repack_row,
     * kiln_quant_repack_fp8_row) instead of quantizing. src is then its qweight (I32) or its E4M3
     * codes (F8E4M3), and the value is named after it. format KILN_QSRC_NONE otherwise. */
    kiln_qsrc qsrc;
    /* weights only: factors the writer multiplies the source values by as it reads them (activation-aware
     * scales, --awq: compiler/quant_awq.c): element [r, c] times row_mul[r] and col_mul[c]; a 1-D weight's
     * element [c] times col_mul[c]. Indices are the source tensor's (mul_cols: its columns, shape[0] for
     * a 1-D weight); NULL = 1. Owned by the graph (kiln_ir_weight_scale). */
    float *row_mul, *col_mul;
    int64_t mul_cols;
    /* weights only: bytes the graph owns (a weight the front end computes, as the act-order permutation:
     * src points at them; kiln_ir_weight_owned); NULL otherwise */
    void *owned;
    /* weights only: row r of this weight is row row_perm[r] of its source (pass fold-permute-into-rows: a
     * permute after the projections folded into their rows); NULL = in order. Points into another value's
     * owned bytes (the permute's order). */
    const int32_t *row_perm;
} kiln_value;

typedef struct kiln_op {
    kiln_op_kind kind;
    int n_in, n_out;
    int in[KILN_MAX_OP_IN];
    int out[KILN_MAX_OP_OUT];
    kiln_op_attrs attrs;
    bool dead;
} kiln_op;

/* Model-level facts the runtime needs to size state (KV cache, vocab). */
typedef struct kiln_graph_info {
    int32_t n_layers, n_kv_heads, head_dim, hidden_size, vocab_size;
    int32_t max_context;
} kiln_graph_info;

typedef struct kiln_graph {
    kiln_value *values;
    int n_values, cap_values;
    kiln_op *ops;
    int n_ops, cap_ops;
    int tokens;    /* input value: [B,S] i32 token ids */
    int positions; /* input value: [B,S] i32 positions */
    int logits;    /* graph output: [B,S,V] f32 */
    kiln_graph_info info;
    /* tensor parallelism: tp_request is the ranks asked for (--tp N; 0 or 1 = none), which the pass
     * tensor-parallel reads; n_ranks the ranks the graph is split over (0 = not split), which it sets:
     * the graph is then what each rank runs on its shard of every weight (kiln_value.shard), and
     * info.n_kv_heads is one rank's. */
    int tp_request, n_ranks;
    /* quantization (--quant), read by the pass quantize: the dtype the projections' matrices get,
     * the LM head's and the embedding table's (KILN_DTYPE_Q8, _Q4G*; 0 = leave them as they are) */
    int quant_weights, quant_head, quant_embedding;
    int quant_method; /* KILN_QUANT_RTN or _MSE (common/kiln_ops.h): how q4 ranges are chosen */
    /* --quant auto: each projection's own format, by weight name (the chosen mix; compiler/quant_auto.c);
     * a projection not listed, or listed with dtype 0, keeps its dtype. Not owned by the graph. */
    const struct kiln_quant_pick *quant_picks;
    int n_quant_picks;
    /* --kv-dtype fp8|int8, read by the pass quantize-kv: KILN_FLAG_KV_FP8 or _KV_INT8 (0 = the KV cache
     * keeps the element type), and every layer's scales, [n_layers][2 * n_kv_heads] (K's kv heads, then
     * V's: compiler/kv_calib.c). Not owned by the graph. */
    uint32_t kv_flag;
    const float *kv_scales;
    /* a compressed-tensors checkpoint's kv_cache_scheme: its static k_scale / v_scale per layer, as kv_scales
     * lays them out (the import reads them; owned by the graph), or NULL */
    float *kv_ckpt_scales;
} kiln_graph;

/* One projection matrix's format under --quant auto: the weight's name as the graph (and the plan)
 * calls it and its dtype (KILN_DTYPE_Q8, _Q4G*; 0 = keep). */
typedef struct kiln_quant_pick {
    char name[KILN_NAME_MAX];
    int dtype;
} kiln_quant_pick;

kiln_graph *kiln_graph_new(void);
void kiln_graph_free(kiln_graph *g);

/* ---- builder: each returns the new value id, or -1 (with err set) on failure ---- */

int kiln_ir_input(kiln_graph *g, const char *name, kiln_dtype dt, int ndim, const int64_t *shape, kiln_error *err);
int kiln_ir_weight(kiln_graph *g, const char *name, kiln_dtype dt, int ndim, const int64_t *shape,
                   const void *src, kiln_dtype src_dt, kiln_error *err);
/* A weight whose bytes (`data`, malloc'd, in dtype dt) the front end computed: the graph takes them
 * (freed with it, or here when adding fails). */
int kiln_ir_weight_owned(kiln_graph *g, const char *name, kiln_dtype dt, int ndim, const int64_t *shape, void *data,
                         kiln_error *err);
/* A [N, K] matrix stored quantized in the checkpoint (`q`: its tensors), of dtype `dt` (q4gG, G the
 * checkpoint's group; fp8 for an FP8 source), named `name` (its qweight / codes tensor's name). */
int kiln_ir_weight_prequantized(kiln_graph *g, const char *name, kiln_dtype dt, const int64_t shape[2],
                                const kiln_qsrc *q, kiln_error *err);
/* A weight packed from the 2-D weights `parts` (same columns and dtype; the same rows to interleave),
 * or concatenated from 1-D ones (KILN_PACK_CONCAT_ROWS: biases), named `name`; returns its id or -1. */
int kiln_ir_weight_packed(kiln_graph *g, const char *name, kiln_pack pack, const int *parts, int n_parts,
                          kiln_error *err);
/* Multiply weight `v`'s values by `row_mul` (one per row of a 2-D weight) and/or `col_mul` (one per
 * column; a 1-D weight's elements) as the writer reads them; the graph takes ownership of both (freed
 * with it, also on failure). Refused (KILN_ERR_INVALID_ARG) when v is not a plain dense weight from the
 * checkpoint, or already has a factor on that side. */
kiln_status kiln_ir_weight_scale(kiln_graph *g, int v, float *row_mul, float *col_mul, kiln_error *err);

/* A 3-D weight of `shape` [E, R, C] whose bytes are the rows of the 2-D weights `parts` concatenated in
 * order (same columns C and dtype, E*R rows in all): a stack of per-expert matrices from one checkpoint
 * tensor (or two) per expert. The parts are marked dead: they are only the stack's source, and the
 * plan writer checks and converts their elements under their own names. */
int kiln_ir_weight_stacked(kiln_graph *g, const char *name, const int *parts, int n_parts, const int64_t shape[3],
                           kiln_error *err);
/* Append an op; output shapes and dtypes are inferred from the kind and the
 * inputs (kiln_ir_infer). `out_ids` receives the n_out new value ids.
 * Returns the op index, or -1. */
int kiln_ir_op(kiln_graph *g, kiln_op_kind kind, const int *in, int n_in, const kiln_op_attrs *attrs,
               const char *label, int *out_ids, kiln_error *err);
/* Same, but insert the op at index `at` (ops from `at` on move down one). */
int kiln_ir_op_at(kiln_graph *g, int at, kiln_op_kind kind, const int *in, int n_in,
                  const kiln_op_attrs *attrs, const char *label, int *out_ids, kiln_error *err);
/* Convenience for one-output ops: returns the output value id or -1. */
int kiln_ir_op1(kiln_graph *g, kiln_op_kind kind, const int *in, int n_in, const kiln_op_attrs *attrs,
                const char *label, kiln_error *err);

/* Compute output shapes/dtypes of an op from its inputs; checks the inputs. */
kiln_status kiln_ir_infer(const kiln_graph *g, kiln_op_kind kind, const int *in, int n_in,
                          const kiln_op_attrs *attrs, kiln_value *outs, kiln_error *err);

/* ---- queries and rewrites ---- */

/* Number of live ops that read value v (plus 1 when v is the graph output). */
int kiln_ir_use_count(const kiln_graph *g, int v);
/* Replace every use of value `from` by `to` in live ops and the graph output. */
void kiln_ir_replace_uses(kiln_graph *g, int from, int to);
/* Recompute value->producer from the op list. */
void kiln_ir_reindex(kiln_graph *g);
/* Drop dead ops and ops whose outputs are unused; mark unreferenced weights
 * and activations dead. Returns the number of ops removed. */
int kiln_ir_dce(kiln_graph *g);
/* Count of live ops of one kind (tests and dumps). */
int kiln_ir_count_ops(const kiln_graph *g, kiln_op_kind kind);

/* ---- verifier and printer ---- */

/* Check SSA form, topological order, input kinds, shapes and dtypes of every
 * live op. Returns KILN_ERR_VERIFY with the op and value at fault. */
kiln_status kiln_ir_verify(const kiln_graph *g, kiln_error *err);
/* Text dump, one line per live op: "%12 = rmsnorm(%10, w:model.norm.weight) eps=1e-05 : [B,S,64] f32". */
void kiln_ir_print(const kiln_graph *g, FILE *f);
/* "[B,S,64]" into buf. */
const char *kiln_ir_shape_str(const kiln_value *v, char *buf, size_t n);

#endif /* KILN_IR_H */
