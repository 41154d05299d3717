/*
 * ops.c — names and sizes for the shared vocabulary of kiln_ops.h.
 */
#include "kiln_ops.h"

#include <string.h>

static const char *const dtype_names[KILN_DTYPE_COUNT_] = {"f32", "f16", "bf16", "i32"};
static const int dtype_sizes[KILN_DTYPE_COUNT_] = {4, 2, 2, 4};

const char *kiln_dtype_name(kiln_dtype t) {
    return (unsigned)t < KILN_DTYPE_COUNT_ ? dtype_names[t] : "?";
}

int kiln_dtype_size(kiln_dtype t) { return (unsigned)t < KILN_DTYPE_COUNT_ ? dtype_sizes[t] : 0; }

int kiln_dtype_from_name(const char *name) {
    for (int i = 0; i < KILN_DTYPE_COUNT_; i++)
        if (strcmp(name, dtype_names[i]) == 0) return i;
    return -1;
}

static const char *const op_names[KILN_OP_COUNT_] = {
    [KILN_OP_EMBEDDING] = "embedding",
    [KILN_OP_RMSNORM] = "rmsnorm",
    [KILN_OP_ADD] = "add",
    [KILN_OP_LINEAR] = "linear",
    [KILN_OP_ROPE] = "rope",
    [KILN_OP_ATTENTION] = "attention",
    [KILN_OP_SILU] = "silu",
    [KILN_OP_MUL] = "mul",
    [KILN_OP_LM_HEAD] = "lm_head",
    [KILN_OP_ADD_RMSNORM] = "add_rmsnorm",
    [KILN_OP_QKV_ROPE] = "qkv_rope",
    [KILN_OP_GATE_UP_SWIGLU] = "gate_up_swiglu",
};

const char *kiln_op_name(kiln_op_kind k) { return (unsigned)k < KILN_OP_COUNT_ ? op_names[k] : "?"; }

int kiln_op_from_name(const char *name) {
    for (int i = 0; i < KILN_OP_COUNT_; i++)
        if (strcmp(name, op_names[i]) == 0) return i;
    return -1;
}
