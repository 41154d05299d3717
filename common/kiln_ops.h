/*
 * kiln_ops.h — the vocabulary shared by the IR (ir/), the plan in the engine
 * file (codegen/ writes it, runtime/ reads it) and the executors: data types,
 * op kinds and op attributes.
 *
 * Both enums are append-only: their values are stored in engine files.
 */
#ifndef KILN_OPS_H
#define KILN_OPS_H

#include <stdint.h>

#define KILN_MAX_DIMS 4
#define KILN_MAX_OP_IN 6
#define KILN_MAX_OP_OUT 3

/* Symbolic dimensions (negative values in a shape). */
#define KILN_DIM_BATCH (-1)
#define KILN_DIM_SEQ (-2)

typedef enum kiln_dtype {
    KILN_DTYPE_F32 = 0,
    KILN_DTYPE_F16 = 1,
    KILN_DTYPE_BF16 = 2,
    KILN_DTYPE_I32 = 3,
    KILN_DTYPE_COUNT_
} kiln_dtype;

const char *kiln_dtype_name(kiln_dtype t);        /* "f32", "f16", "bf16", "i32" */
int kiln_dtype_size(kiln_dtype t);                /* bytes per element */
int kiln_dtype_from_name(const char *name);       /* -1 when unknown */

/*
 * Op kinds. Shapes use B = batch, S = seq (symbolic); weights are [out, in]
 * as in HuggingFace checkpoints. Activations are row-major [B, S, width].
 */
typedef enum kiln_op_kind {
    /* coarse ops, as imported */
    KILN_OP_EMBEDDING = 0,  /* in: tokens[B,S] i32, table[V,H]          out: x[B,S,H] */
    KILN_OP_RMSNORM = 1,    /* in: x[B,S,H], w[H]                        out: y  (attr eps) */
    KILN_OP_ADD = 2,        /* in: a, b (same shape)                      out: a+b */
    KILN_OP_LINEAR = 3,     /* in: x[B,S,K], W[N,K]                       out: y[B,S,N] = x W^T */
    KILN_OP_ROPE = 4,       /* in: x[B,S,heads*hd], positions[B,S] i32    out: rotated (rotate_half pairs i, i+hd/2) */
    KILN_OP_ATTENTION = 5,  /* in: q[B,S,Hq*hd], k[B,S,Hkv*hd], v[..], positions   out: o[B,S,Hq*hd]
                               causal over the layer's KV cache, GQA, optional sliding window */
    KILN_OP_SILU = 6,       /* in: x                                      out: x*sigmoid(x) */
    KILN_OP_MUL = 7,        /* in: a, b                                   out: a*b */
    KILN_OP_LM_HEAD = 8,    /* in: x[B,S,H], W[V,H]                       out: logits[B,S,V] f32 */
    /* fused ops, made by passes */
    KILN_OP_ADD_RMSNORM = 9,    /* in: x, residual, w[H]     out: s = x+residual, y = rmsnorm(s)*w */
    KILN_OP_QKV_ROPE = 10,      /* in: x, Wq, Wk, Wv, positions   out: rope(xWq^T), rope(xWk^T), xWv^T */
    KILN_OP_GATE_UP_SWIGLU = 11,/* in: x, Wgate, Wup          out: silu(x Wgate^T) * (x Wup^T) */
    KILN_OP_COUNT_
} kiln_op_kind;

const char *kiln_op_name(kiln_op_kind k);  /* "embedding", "rmsnorm"... */
int kiln_op_from_name(const char *name);   /* -1 when unknown */

typedef enum kiln_rope_scaling {
    KILN_ROPE_SCALING_NONE = 0,
    KILN_ROPE_SCALING_LLAMA3 = 1,
} kiln_rope_scaling;

/* Attributes of an op; each kind reads the fields its comment above names. */
typedef struct kiln_op_attrs {
    int32_t layer;          /* attention, qkv_rope: which layer's KV cache */
    int32_t n_heads;        /* rope (heads of x), attention, qkv_rope (query heads) */
    int32_t n_kv_heads;     /* attention, qkv_rope */
    int32_t head_dim;       /* rope, attention, qkv_rope */
    int32_t window;         /* attention: sliding window in tokens, 0 = none */
    int32_t rope_scaling;   /* kiln_rope_scaling */
    float eps;              /* rmsnorm, add_rmsnorm */
    float rope_theta;
    float rope_factor;          /* llama3 scaling */
    float rope_low_freq_factor;
    float rope_high_freq_factor;
    float rope_original_max_pos;
} kiln_op_attrs;

/* Number of outputs an op kind has, and the input count it takes (-1: unknown kind). */
int kiln_op_n_out(kiln_op_kind k);
int kiln_op_n_in(kiln_op_kind k);

/* What shape inference needs to know of a tensor: the IR's values and the
 * plan's values are both described this way. */
typedef struct kiln_tensor_desc {
    int id;          /* for messages: the value id */
    int is_weight;   /* a constant (weight) rather than an activation or input */
    int dtype;       /* kiln_dtype */
    int ndim;
    int64_t shape[KILN_MAX_DIMS];
    const char *name;/* for messages; may be NULL */
} kiln_tensor_desc;

struct kiln_error;
/* The one definition of every op's signature: check the inputs of an op of
 * `kind` with attributes `a` and compute its outputs' descriptors. Used by
 * the IR builder and verifier and by the runtime when it loads a plan.
 * Returns KILN_ERR_VERIFY (kiln_status) naming the op and value at fault. */
int kiln_op_infer(kiln_op_kind kind, const kiln_tensor_desc *in, int n_in, const kiln_op_attrs *a,
                  kiln_tensor_desc *out, struct kiln_error *err);

#endif /* KILN_OPS_H */
