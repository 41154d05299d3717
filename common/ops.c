/*
 * ops.c — names and sizes for the shared vocabulary of kiln_ops.h.
 */
#include "kiln_ops.h"

#include <string.h>

static const char *const dtype_names[KILN_DTYPE_COUNT_] = {"f32", "f16",   "bf16",  "i32",
                                                          "q8",  "q4g32", "q4g64", "q4g128", "i64",
                                                          "fp8", "f8e4m3", "fp8g128"};
static const int dtype_sizes[KILN_DTYPE_COUNT_] = {4, 2, 2, 4, 0, 0, 0, 0, 8, 0, 1, 0};

const char *kiln_dtype_name(kiln_dtype t) {
    return (unsigned)t < KILN_DTYPE_COUNT_ ? dtype_names[t] : "?";
}

int kiln_dtype_size(kiln_dtype t) { return (unsigned)t < KILN_DTYPE_COUNT_ ? dtype_sizes[t] : 0; }

int kiln_dtype_from_name(const char *name) {
    for (int i = 0; i < KILN_DTYPE_COUNT_; i++)
        if (strcmp(name, dtype_names[i]) == 0) return i;
    return -1;
}

/* Every op kind's fixed facts, one row each; adding an op starts here (docs/architecture.md, *Adding an
 * op*), and its shape rules go in op_infer.c. n_in: the inputs without the optional ones its flags
 * bring (kiln_op_n_in_with); matrices: how many weights a projection multiplies its input by (its
 * inputs 1..matrices); flags: the lowering flags that apply to it (KILN_FLAG_ACT_FP8 and KILN_FLAG_FP8_FAST apply
 * to every projection besides); inplace: the inputs its first output may overwrite in place (kiln_op_inplace).
 * A kind with no row (a gap another branch numbers) is unknown. */
typedef struct op_info {
    const char *name;
    int8_t n_in, n_out, matrices;
    uint32_t flags, inplace;
} op_info;

static const op_info op_table[KILN_OP_COUNT_] = {
    [KILN_OP_EMBEDDING] = {"embedding", 2, 1, 0, 0, 0},
    [KILN_OP_RMSNORM] = {"rmsnorm", 2, 1, 0,
                         KILN_FLAG_FOLD_INTO_GEMV | KILN_FLAG_FOLD_ONE_TOKEN | KILN_FLAG_OUT_FP8 | KILN_FLAG_OUT_PERM, 0},
    [KILN_OP_ADD] = {"add", 2, 1, 0, 0, 0},
    [KILN_OP_LINEAR] = {"linear", 2, 1, 1, 0, 0},
    [KILN_OP_ROPE] = {"rope", 2, 1, 0, 0, 0},
    [KILN_OP_ATTENTION] = {"attention", 4, 1, 0,
                           KILN_FLAG_DECODE_ROPE | KILN_FLAG_MERGE_SPLITS | KILN_FLAG_KV_FP8 | KILN_FLAG_KV_INT8, 0},
    [KILN_OP_SILU] = {"silu", 1, 1, 0, 0, 0},
    [KILN_OP_MUL] = {"mul", 2, 1, 0, 0, 0},
    [KILN_OP_LM_HEAD] = {"lm_head", 2, 1, 1, 0, 0},
    [KILN_OP_ADD_RMSNORM] = {"add_rmsnorm", 3, 2, 0, KILN_FLAG_OUT_PERM, 1u << 0 | 1u << 1}, /* the sum over either addend */
    [KILN_OP_QKV_ROPE] = {"qkv_rope", 5, 3, 3, KILN_FLAG_QKV_BIAS | KILN_FLAG_QK_NORM, 0},
    [KILN_OP_GATE_UP_SWIGLU] = {"gate_up_swiglu", 3, 1, 2, KILN_FLAG_OUT_FP8, 0},
    [KILN_OP_LINEAR_ADD] = {"linear_add", 3, 1, 1, 0, 1u << 2}, /* y over its residual r */
    [KILN_OP_QKV_ROPE_PACKED] = {"qkv_rope_packed", 3, 3, 1, KILN_FLAG_QKV_BIAS | KILN_FLAG_QK_NORM, 0},
    [KILN_OP_GATE_UP_SWIGLU_PACKED] = {"gate_up_swiglu_packed", 2, 1, 1, KILN_FLAG_OUT_FP8, 0},
    [KILN_OP_HEAD_RMSNORM] = {"head_rmsnorm", 2, 1, 0, 0, 0},
    [KILN_OP_BIAS_ADD] = {"bias_add", 2, 1, 0, 0, 0},
    [KILN_OP_MOE] = {"moe", 4, 1, 0, KILN_FLAG_MOE_NO_RENORM, 0},
    [KILN_OP_ALL_REDUCE] = {"all_reduce", 1, 1, 0, 0, 1u << 0}, /* the sum over this rank's part */
    [KILN_OP_ALL_GATHER] = {"all_gather", 1, 1, 0, 0, 0},
    [KILN_OP_PERMUTE] = {"permute", 2, 1, 0, 0, 0}, /* a gather: never in place */
};

static const op_info *op_row(kiln_op_kind k) {
    return (unsigned)k < KILN_OP_COUNT_ && op_table[k].name ? &op_table[k] : NULL;
}

int kiln_op_n_in(kiln_op_kind k) { return op_row(k) ? op_row(k)->n_in : -1; }
int kiln_op_order_input(kiln_op_kind k, uint32_t flags) {
    if (k == KILN_OP_PERMUTE) return 1;
    if ((k == KILN_OP_RMSNORM || k == KILN_OP_ADD_RMSNORM) && (flags & KILN_FLAG_OUT_PERM))
        return k == KILN_OP_RMSNORM ? 2 : 3;
    return -1;
}
int kiln_op_n_out(kiln_op_kind k) { return op_row(k) ? op_row(k)->n_out : 1; }
int kiln_op_matrices(kiln_op_kind k) { return op_row(k) ? op_row(k)->matrices : 0; }
uint32_t kiln_op_flags_allowed(kiln_op_kind k) {
    const op_info *r = op_row(k);
    return r ? r->flags | (r->matrices ? (uint32_t)(KILN_FLAG_ACT_FP8 | KILN_FLAG_FP8_FAST) : 0u) : 0u;
}
uint32_t kiln_op_inplace(kiln_op_kind k, int out) { return out == 0 && op_row(k) ? op_row(k)->inplace : 0; }

bool kiln_op_inplace_over(kiln_op_kind k, int out, const int32_t *in, int n_in, int32_t v) {
    const uint32_t can = kiln_op_inplace(k, out);
    bool at = false;
    for (int i = 0; i < n_in; i++)
        if (in[i] == v) {
            if (i >= 32 || !(can >> i & 1)) return false;
            at = true;
        }
    return at;
}

const char *kiln_flag_name(uint32_t bit) {
    switch (bit) {
    case KILN_FLAG_DECODE_ROPE: return "decode_rope";
    case KILN_FLAG_MERGE_SPLITS: return "merge_splits";
    case KILN_FLAG_FOLD_INTO_GEMV: return "fold_into_gemv";
    case KILN_FLAG_QKV_BIAS: return "qkv_bias";
    case KILN_FLAG_QK_NORM: return "qk_norm";
    case KILN_FLAG_MOE_NO_RENORM: return "no_renorm";
    case KILN_FLAG_KV_FP8: return "kv_fp8";
    case KILN_FLAG_KV_INT8: return "kv_int8";
    case KILN_FLAG_FOLD_ONE_TOKEN: return "one_token";
    case KILN_FLAG_ACT_FP8: return "act_fp8";
    case KILN_FLAG_OUT_FP8: return "out_fp8";
    case KILN_FLAG_FP8_FAST: return "fast_accum";
    case KILN_FLAG_OUT_PERM: return "out_perm";
    default: return NULL;
    }
}

const char *kiln_op_name(kiln_op_kind k) { return op_row(k) ? op_row(k)->name : "?"; }

int kiln_op_from_name(const char *name) {
    for (int i = 0; i < KILN_OP_COUNT_; i++)
        if (op_table[i].name && strcmp(name, op_table[i].name) == 0) return i;
    return -1;
}

/* ---- attributes as stored in a plan ---- */

static uint32_t fbits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static float bitsf(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

int kiln_op_attrs_encode(const kiln_op_attrs *a, uint32_t keys[KILN_ATTR_COUNT_], uint32_t vals[KILN_ATTR_COUNT_]) {
    const uint32_t all[KILN_ATTR_COUNT_] = {
        [KILN_ATTR_LAYER] = (uint32_t)a->layer,
        [KILN_ATTR_N_HEADS] = (uint32_t)a->n_heads,
        [KILN_ATTR_N_KV_HEADS] = (uint32_t)a->n_kv_heads,
        [KILN_ATTR_HEAD_DIM] = (uint32_t)a->head_dim,
        [KILN_ATTR_WINDOW] = (uint32_t)a->window,
        [KILN_ATTR_ROPE_SCALING] = (uint32_t)a->rope_scaling,
        [KILN_ATTR_EPS] = fbits(a->eps),
        [KILN_ATTR_ROPE_THETA] = fbits(a->rope_theta),
        [KILN_ATTR_ROPE_FACTOR] = fbits(a->rope_factor),
        [KILN_ATTR_ROPE_LOW_FREQ] = fbits(a->rope_low_freq_factor),
        [KILN_ATTR_ROPE_HIGH_FREQ] = fbits(a->rope_high_freq_factor),
        [KILN_ATTR_ROPE_ORIG_MAX_POS] = fbits(a->rope_original_max_pos),
        [KILN_ATTR_FLAGS] = a->flags,
        [KILN_ATTR_N_EXPERTS] = (uint32_t)a->n_experts,
        [KILN_ATTR_TOP_K] = (uint32_t)a->top_k,
        [KILN_ATTR_RANKS] = (uint32_t)a->ranks,
    };
    int n = 0;
    for (uint32_t k = 1; k < KILN_ATTR_COUNT_; k++)
        if (all[k]) {
            keys[n] = k;
            vals[n++] = all[k];
        }
    return n;
}

int kiln_op_attr_set(kiln_op_attrs *a, uint32_t key, uint32_t val) {
    switch (key) {
    case KILN_ATTR_LAYER: a->layer = (int32_t)val; return 1;
    case KILN_ATTR_N_HEADS: a->n_heads = (int32_t)val; return 1;
    case KILN_ATTR_N_KV_HEADS: a->n_kv_heads = (int32_t)val; return 1;
    case KILN_ATTR_HEAD_DIM: a->head_dim = (int32_t)val; return 1;
    case KILN_ATTR_WINDOW: a->window = (int32_t)val; return 1;
    case KILN_ATTR_ROPE_SCALING: a->rope_scaling = (int32_t)val; return 1;
    case KILN_ATTR_EPS: a->eps = bitsf(val); return 1;
    case KILN_ATTR_ROPE_THETA: a->rope_theta = bitsf(val); return 1;
    case KILN_ATTR_ROPE_FACTOR: a->rope_factor = bitsf(val); return 1;
    case KILN_ATTR_ROPE_LOW_FREQ: a->rope_low_freq_factor = bitsf(val); return 1;
    case KILN_ATTR_ROPE_HIGH_FREQ: a->rope_high_freq_factor = bitsf(val); return 1;
    case KILN_ATTR_ROPE_ORIG_MAX_POS: a->rope_original_max_pos = bitsf(val); return 1;
    case KILN_ATTR_FLAGS: a->flags = val; return 1;
    case KILN_ATTR_N_EXPERTS: a->n_experts = (int32_t)val; return 1;
    case KILN_ATTR_TOP_K: a->top_k = (int32_t)val; return 1;
    case KILN_ATTR_RANKS: a->ranks = (int32_t)val; return 1;
    default: return 0;
    }
}
