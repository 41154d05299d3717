/*
 * kiln_plan.h — the plan: the program an engine's runtime interprets.
 *
 * The plan is the IR after passes, flattened: a table of values (inputs,
 * weights, activations), the activation buffer slots memory planning chose,
 * the weight table (where each weight lies in the weights section) and the
 * ops in execution order. The compiler writes it (codegen/plan_writer.c);
 * runtime/plan.c reads it and checks every op with kiln_op_infer, so an
 * executor can trust shapes and indices once a plan has loaded.
 *
 * Binary layout, version 2, little-endian (docs/engine-format.md):
 *   header, 64 bytes:
 *      0 u8[4] "KPLN"   4 u32 version (2)
 *      8 u32 n_values  12 u32 n_ops  16 u32 n_weights  20 u32 n_slots
 *     24 i32 tokens value  28 i32 positions value  32 i32 logits value
 *     36 i32 n_layers  40 i32 n_kv_heads  44 i32 head_dim  48 i32 hidden_size
 *     52 i32 vocab_size  56 i32 max_context  60 u32 reserved (0)
 *   slots:   n_slots × 8:    u32 width (elements per token), u32 dtype
 *   values:  n_values × 56:  u32 kind, u32 dtype, u32 ndim, i32 slot (-1), i32 weight (-1), u32 reserved,
 *                            i64 shape[4] (negative = symbolic: -1 batch, -2 seq)
 *   weights: n_weights × 184: char name[128] (NUL-terminated), u32 dtype, u32 ndim, i64 shape[4],
 *                            u64 offset (in the decoded weights section, 256-aligned), u64 nbytes
 *   ops:     n_ops records of 16 + 4 × (n_in + n_out) + 8 × n_attrs bytes:
 *            u32 kind, u32 n_in, u32 n_out, u32 n_attrs, i32 in[n_in], i32 out[n_out],
 *            then n_attrs attributes of 8 bytes: u32 key (KILN_ATTR_*), u32 value (i32, or an
 *            f32's bits, or flag bits); keys ascending, each at most once, absent = 0. A key this
 *            reader does not know is refused (it would change what the op does).
 * The section's size must be exactly the sum of these parts.
 *
 * Version 2 (kiln 0.2): ops of any input count with keyed attributes, which
 * carry the lowering decisions passes make (KILN_FLAG_*); version 1's ops
 * were fixed 96-byte records. A version 1 plan is refused: recompile.
 *
 * Version 3 (tensor parallelism, kiln compile --tp N with N > 1; a plan of
 * one rank is still written as version 2, byte for byte): the same layout,
 * but header offset 60 holds u32 n_ranks (2..KILN_MAX_RANKS) and the weight
 * table holds n_ranks × n_weights records, rank after rank: record
 * r × n_weights + i is rank r's shard of weight i (same name, dtype and
 * shape on every rank: the shape is one rank's, the one the values give).
 * Every rank runs the same ops on its own shards; ops all_reduce and
 * all_gather (attribute ranks) join the ranks. Each rank's weights lie in
 * one range of the weights section, starting at a multiple of
 * KILN_PLAN_RANK_ALIGN, so a rank can map its own range only.
 *
 * Version 4 (engine format 2.7; every plan, one rank or several): version 3's layout with header offset 60 =
 * n_ranks (1..KILN_MAX_RANKS). Memory planning may give an output the slot of an input that the op
 * reads last and may overwrite in place (kiln_op_inplace: add_rmsnorm's sum, linear_add's y,
 * all_reduce's sum), and a +fold_into_gemv RMSNorm's input stays in its slot until its output's last
 * reader. The reader checks every slot's lifetimes: no op writes a slot whose value a later op reads,
 * nor one it reads itself but in place (runtime/plan.c). Versions 2 and 3 are still read (no output
 * shares an input's slot there); an older kiln refuses version 4 by its number.
 */
#ifndef KILN_PLAN_H
#define KILN_PLAN_H

#include <stddef.h>
#include <stdint.h>

#include "../common/kiln_ops.h"
#include "../common/kiln_util.h"

#define KILN_PLAN_MAGIC "KPLN"
#define KILN_PLAN_VERSION 4         /* what every plan is written as */
#define KILN_PLAN_VERSION_ONE 2     /* read: a plan of one rank, no output in an input's slot */
#define KILN_PLAN_VERSION_TP 3      /* read: a plan of several ranks (tensor parallelism), the same */
#define KILN_PLAN_VERSION_INPLACE 4 /* from this version outputs may take a dying input's slot */
#define KILN_PLAN_RANK_ALIGN 4096 /* each rank's weights start at a multiple of this in the weights section */
#define KILN_PLAN_HEADER_SIZE 64
#define KILN_PLAN_SLOT_SIZE 8
#define KILN_PLAN_VALUE_SIZE 56
#define KILN_PLAN_WEIGHT_SIZE 184
#define KILN_PLAN_OP_HEADER_SIZE 16
#define KILN_PLAN_ATTR_SIZE 8

/* Attribute keys: KILN_ATTR_* and kiln_op_attrs_encode in common/kiln_ops.h. */
#define KILN_PLAN_NAME_MAX 128
#define KILN_PLAN_WEIGHT_ALIGN 256
#define KILN_PLAN_MAX_ITEMS (1u << 20)

/* value kinds (same numbers as the IR's kiln_value_kind) */
enum { KILN_PV_INPUT = 0, KILN_PV_WEIGHT = 1, KILN_PV_ACT = 2 };

typedef struct kiln_plan_value {
    uint32_t kind, dtype, ndim;
    int32_t slot;   /* activations */
    int32_t weight; /* weights: index into the weight table */
    int64_t shape[KILN_MAX_DIMS];
} kiln_plan_value;

typedef struct kiln_plan_weight {
    char name[KILN_PLAN_NAME_MAX];
    uint32_t dtype, ndim;
    int64_t shape[KILN_MAX_DIMS];
    uint64_t offset, nbytes;
} kiln_plan_weight;

typedef struct kiln_plan_op {
    uint32_t kind, n_in, n_out;
    int32_t in[KILN_MAX_OP_IN], out[KILN_MAX_OP_OUT];
    kiln_op_attrs attrs;
} kiln_plan_op;

typedef struct kiln_plan_slot {
    uint32_t width, dtype;
} kiln_plan_slot;

typedef struct kiln_plan {
    uint32_t n_values, n_ops, n_weights, n_slots;
    int32_t tokens, positions, logits;
    int32_t n_layers, n_kv_heads, head_dim, hidden_size, vocab_size, max_context;
    uint32_t version;  /* 2, 3 or 4 (KILN_PLAN_VERSION*) */
    uint32_t n_ranks;  /* tensor-parallel ranks (1: a version 2 plan); n_kv_heads is one rank's */
    kiln_plan_slot *slots;
    kiln_plan_value *values;
    kiln_plan_weight *weights; /* n_ranks × n_weights: rank r's shard of weight i at r × n_weights + i */
    kiln_plan_op *ops;
} kiln_plan;

/* Parse and fully check a plan section. `weights_size` is the decoded size of
 * the weights section: every weight must lie inside it. */
kiln_status kiln_plan_parse(const uint8_t *data, size_t size, uint64_t weights_size, kiln_plan **out,
                            kiln_error *err);
void kiln_plan_free(kiln_plan *p);

/* Rank r's weight table (n_weights records): rank 0's is p->weights. */
static inline const kiln_plan_weight *kiln_plan_rank_weights(const kiln_plan *p, uint32_t rank) {
    return p->weights + (size_t)rank * p->n_weights;
}
/* The byte range of the weights section that rank r's weights lie in: [*begin, *end). */
void kiln_plan_rank_range(const kiln_plan *p, uint32_t rank, uint64_t *begin, uint64_t *end);

#endif /* KILN_PLAN_H */
