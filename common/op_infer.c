/*
 * op_infer.c — the signature of every op: which inputs it takes, what shapes
 * and dtypes they must have, and what it produces. The IR builder, the IR
 * verifier and the runtime's plan loader all call kiln_op_infer, so an op's
 * rules are written once.
 */
#include "kiln_ops.h"
#include "kiln_util.h"

#include <stdbool.h>
#include <string.h>

int kiln_op_n_in_with(kiln_op_kind k, const kiln_op_attrs *a) {
    int n = kiln_op_n_in(k);
    if (n >= 0 && a && k == KILN_OP_ATTENTION && (a->flags & (KILN_FLAG_KV_FP8 | KILN_FLAG_KV_INT8))) return n + 1;
    if (n >= 0 && a && (k == KILN_OP_RMSNORM || k == KILN_OP_ADD_RMSNORM) && (a->flags & KILN_FLAG_OUT_PERM)) return n + 1;
    if (n < 0 || !a || (k != KILN_OP_QKV_ROPE && k != KILN_OP_QKV_ROPE_PACKED)) return n;
    if (a->flags & KILN_FLAG_QKV_BIAS) n += k == KILN_OP_QKV_ROPE ? 3 : 1;
    if (a->flags & KILN_FLAG_QK_NORM) n += 2;
    return n;
}

#define BAD(...) kiln_err(err, KILN_ERR_VERIFY, __VA_ARGS__)

static const char *nm(const kiln_tensor_desc *d) { return d->name ? d->name : "?"; }

static int is_tokens(const kiln_tensor_desc *d) {
    return !d->is_weight && d->ndim == 2 && d->shape[0] == KILN_DIM_BATCH && d->shape[1] == KILN_DIM_SEQ &&
           d->dtype == KILN_DTYPE_I32;
}

/* An activation [B,S,W]: returns W, or -1. */
static int64_t act_width(const kiln_tensor_desc *d) {
    if (d->is_weight || d->ndim != 3 || d->shape[0] != KILN_DIM_BATCH || d->shape[1] != KILN_DIM_SEQ ||
        d->shape[2] <= 0 || d->dtype != KILN_DTYPE_F32)
        return -1;
    return d->shape[2];
}

static int is_matrix_weight(const kiln_tensor_desc *d) {
    return d->is_weight && d->ndim == 2 && d->shape[0] > 0 && d->shape[1] > 0 &&
           (d->dtype == KILN_DTYPE_F32 || d->dtype == KILN_DTYPE_F16 || d->dtype == KILN_DTYPE_BF16 ||
            (kiln_dtype_is_quant(d->dtype) && kiln_weight_nbytes(d->dtype, 2, d->shape) > 0));
}

/* A 3-D float weight (a stack of per-expert matrices [E, rows, cols]). */
static int is_stack_weight(const kiln_tensor_desc *d) {
    return d->is_weight && d->ndim == 3 && d->shape[0] > 0 && d->shape[1] > 0 && d->shape[2] > 0 &&
           (d->dtype == KILN_DTYPE_F32 || d->dtype == KILN_DTYPE_F16 || d->dtype == KILN_DTYPE_BF16);
}

static void make_act(kiln_tensor_desc *o, int64_t width) {
    memset(o, 0, sizeof *o);
    o->id = -1;
    o->dtype = KILN_DTYPE_F32;
    o->ndim = 3;
    o->shape[0] = KILN_DIM_BATCH;
    o->shape[1] = KILN_DIM_SEQ;
    o->shape[2] = width;
}

/* x [B,S,K] times weight w [N,K]: returns N, or -1 with err set. */
static int64_t check_matmul(const char *opn, const kiln_tensor_desc *x, const kiln_tensor_desc *w, kiln_error *err) {
    int64_t k = act_width(x);
    if (k < 0) {
        BAD("%s: input %%%d is not a [B,S,W] f32 activation", opn, x->id);
        return -1;
    }
    if (!is_matrix_weight(w)) {
        BAD("%s: %%%d (%s) is not a 2-D float weight", opn, w->id, nm(w));
        return -1;
    }
    if (w->shape[1] != k) {
        BAD("%s: weight %s is [%lld,%lld] but the input width is %lld", opn, nm(w), (long long)w->shape[0],
            (long long)w->shape[1], (long long)k);
        return -1;
    }
    return w->shape[0];
}

static int check_norm_weight(const char *opn, const kiln_tensor_desc *w, int64_t width, float eps,
                             kiln_error *err) {
    if (!w->is_weight || w->ndim != 1 || w->shape[0] != width || w->dtype == KILN_DTYPE_I32) {
        BAD("%s: weight %s must be a float vector of %lld", opn, nm(w), (long long)width);
        return 0;
    }
    if (!(eps > 0)) {
        BAD("%s: eps must be > 0 (got %g)", opn, eps);
        return 0;
    }
    return 1;
}

static int check_heads(const char *opn, const kiln_op_attrs *a, kiln_error *err) {
    if (a->n_heads <= 0 || a->n_kv_heads <= 0 || a->n_heads % a->n_kv_heads || a->head_dim <= 0 ||
        a->head_dim % 2) {
        BAD("%s: bad heads %d / kv heads %d / head_dim %d", opn, a->n_heads, a->n_kv_heads, a->head_dim);
        return 0;
    }
    if (a->rope_scaling != KILN_ROPE_SCALING_NONE && a->rope_scaling != KILN_ROPE_SCALING_LLAMA3) {
        BAD("%s: unknown rope scaling %d", opn, a->rope_scaling);
        return 0;
    }
    return 1;
}

static int is_vector_weight(const kiln_tensor_desc *d, int64_t n) {
    return d->is_weight && d->ndim == 1 && d->shape[0] == n &&
           (d->dtype == KILN_DTYPE_F32 || d->dtype == KILN_DTYPE_F16 || d->dtype == KILN_DTYPE_BF16);
}

/* A norm's +out_perm order (its last input, `d`, present when the flag is): an i32 vector of the width h, and
 * the output then written by the norm itself (not folded into a GEMV, not as E4M3 codes). */
static bool check_out_perm(const char *opn, const kiln_op_attrs *a, const kiln_tensor_desc *d, int64_t h,
                           kiln_error *err) {
    if (!(a->flags & KILN_FLAG_OUT_PERM)) return true;
    if (a->flags & (KILN_FLAG_FOLD_INTO_GEMV | KILN_FLAG_OUT_FP8)) {
        BAD("%s: +out_perm writes its output itself: it does not go with +fold_into_gemv or +out_fp8", opn);
        return false;
    }
    if (d->is_weight && d->ndim == 1 && d->shape[0] == h && d->dtype == KILN_DTYPE_I32) return true;
    BAD("%s: +out_perm's order %s must be an i32 vector of %lld indices", opn, nm(d), (long long)h);
    return false;
}

/* The optional inputs of qkv_rope (from `ex`: bq, bk, bv or the packed bqkv, then q_norm, k_norm), as
 * the op's flags say it carries them. */
static int check_qkv_extras(const char *opn, const kiln_tensor_desc *ex, const kiln_op_attrs *a, int64_t nq,
                            int64_t nk, kiln_error *err) {
    if (a->flags & KILN_FLAG_QKV_BIAS) {
        const bool packed = strcmp(opn, "qkv_rope_packed") == 0;
        const int64_t want[3] = {packed ? nq + 2 * nk : nq, nk, nk};
        for (int j = 0; j < (packed ? 1 : 3); j++, ex++)
            if (!is_vector_weight(ex, want[j])) {
                BAD("%s: bias %s must be a float vector of %lld", opn, nm(ex), (long long)want[j]);
                return 0;
            }
    }
    if (a->flags & KILN_FLAG_QK_NORM)
        for (int j = 0; j < 2; j++)
            if (!check_norm_weight(opn, &ex[j], a->head_dim, a->eps, err)) return 0;
    return 1;
}

int kiln_op_infer(kiln_op_kind kind, const kiln_tensor_desc *in, int n_in, const kiln_op_attrs *a,
                  kiln_tensor_desc *out, kiln_error *err) {
    if ((unsigned)kind >= KILN_OP_COUNT_ || kiln_op_n_in(kind) < 0) return BAD("unknown op kind %d", (int)kind);
    const char *opn = kiln_op_name(kind);
    const uint32_t allowed = kiln_op_flags_allowed(kind);
    if (a && (a->flags & ~(uint32_t)KILN_FLAG_ALL_))
        return BAD("%s: unknown lowering flags 0x%x", opn, a->flags & ~(uint32_t)KILN_FLAG_ALL_);
    if (a && (a->flags & ~allowed)) return BAD("%s: lowering flags 0x%x do not apply to it", opn, a->flags);
    if (a && (a->flags & KILN_FLAG_FOLD_ONE_TOKEN) && !(a->flags & KILN_FLAG_FOLD_INTO_GEMV))
        return BAD("%s: +one_token without +fold_into_gemv", opn);
    if (a && (a->flags & KILN_FLAG_ACT_FP8)) /* W8A8 multiplies E4M3 codes by E4M3 codes */
        for (int j = 1; j <= kiln_op_matrices(kind) && j < n_in; j++)
            if (!in[j].is_weight || !kiln_quant_is_fp8(in[j].dtype))
                return BAD("%s: +act_fp8 over %s, which is not fp8 or fp8g128", opn, nm(&in[j]));
    if (a && (a->flags & KILN_FLAG_FP8_FAST)) { /* fast accumulation: the per-row W8A8 GEMMs only */
        if (!(a->flags & KILN_FLAG_ACT_FP8)) return BAD("%s: +fast_accum without +act_fp8", opn);
        for (int j = 1; j <= kiln_op_matrices(kind) && j < n_in; j++)
            if (in[j].dtype != KILN_DTYPE_FP8)
                return BAD("%s: +fast_accum over %s, which is not fp8 with a scale a row", opn, nm(&in[j]));
    }
    /* ranks: required by the collectives, optional on embedding (vocab-parallel), refused elsewhere */
    const bool collective = kind == KILN_OP_ALL_REDUCE || kind == KILN_OP_ALL_GATHER;
    const int32_t ranks = a ? a->ranks : 0;
    if ((ranks || collective) && (ranks < 2 || ranks > KILN_MAX_RANKS))
        return BAD("%s: ranks %d (tensor parallelism takes 2..%d ranks)", opn, ranks, KILN_MAX_RANKS);
    if (ranks && !collective && kind != KILN_OP_EMBEDDING) return BAD("%s: ranks do not apply to it", opn);
    if (n_in != kiln_op_n_in_with(kind, a))
        return BAD("%s: takes %d inputs, got %d", opn, kiln_op_n_in_with(kind, a), n_in);
    int64_t w0 = act_width(&in[0]);
    switch (kind) {
    case KILN_OP_EMBEDDING:
        if (!is_tokens(&in[0])) return BAD("embedding: ids %%%d must be [B,S] i32", in[0].id);
        if (!is_matrix_weight(&in[1])) return BAD("embedding: table %s must be a 2-D float weight", nm(&in[1]));
        make_act(&out[0], in[1].shape[1]);
        return KILN_OK;
    case KILN_OP_ALL_REDUCE:
    case KILN_OP_ALL_GATHER:
        if (w0 < 0) return BAD("%s: input %%%d is not an activation", opn, in[0].id);
        if (kind == KILN_OP_ALL_GATHER && w0 * ranks > (1 << 30))
            return BAD("all_gather: width %lld x %d ranks is too wide", (long long)w0, ranks);
        make_act(&out[0], kind == KILN_OP_ALL_GATHER ? w0 * ranks : w0);
        return KILN_OK;
    case KILN_OP_RMSNORM:
        if (w0 < 0) return BAD("rmsnorm: input %%%d is not an activation", in[0].id);
        if (!check_norm_weight(opn, &in[1], w0, a->eps, err)) return KILN_ERR_VERIFY;
        if (!check_out_perm(opn, a, &in[2], w0, err)) return KILN_ERR_VERIFY;
        make_act(&out[0], w0);
        return KILN_OK;
    case KILN_OP_HEAD_RMSNORM:
        if (a->n_heads <= 0 || a->head_dim <= 0 || w0 != (int64_t)a->n_heads * a->head_dim)
            return BAD("head_rmsnorm: width %lld is not n_heads %d x head_dim %d", (long long)w0, a->n_heads,
                       a->head_dim);
        if (!check_norm_weight(opn, &in[1], a->head_dim, a->eps, err)) return KILN_ERR_VERIFY;
        make_act(&out[0], w0);
        return KILN_OK;
    case KILN_OP_BIAS_ADD:
        if (w0 < 0) return BAD("bias_add: input %%%d is not an activation", in[0].id);
        if (!is_vector_weight(&in[1], w0)) return BAD("bias_add: bias %s must be a float vector of %lld", nm(&in[1]),
                                                      (long long)w0);
        make_act(&out[0], w0);
        return KILN_OK;
    case KILN_OP_PERMUTE: /* the values are checked where they are made (import) and read (runtime/model.c) */
        if (w0 < 0) return BAD("permute: input %%%d is not an activation", in[0].id);
        if (!(in[1].is_weight && in[1].ndim == 1 && in[1].shape[0] == w0 && in[1].dtype == KILN_DTYPE_I32))
            return BAD("permute: %s must be an i32 vector of %lld indices", nm(&in[1]), (long long)w0);
        make_act(&out[0], w0);
        return KILN_OK;
    case KILN_OP_ADD:
    case KILN_OP_MUL:
        if (w0 < 0 || w0 != act_width(&in[1]))
            return BAD("%s: inputs %%%d and %%%d must be activations of one width", opn, in[0].id, in[1].id);
        make_act(&out[0], w0);
        return KILN_OK;
    case KILN_OP_SILU:
        if (w0 < 0) return BAD("silu: input %%%d is not an activation", in[0].id);
        make_act(&out[0], w0);
        return KILN_OK;
    case KILN_OP_LINEAR:
    case KILN_OP_LM_HEAD: {
        int64_t n = check_matmul(opn, &in[0], &in[1], err);
        if (n < 0) return KILN_ERR_VERIFY;
        make_act(&out[0], n);
        return KILN_OK;
    }
    case KILN_OP_LINEAR_ADD: {
        int64_t n = check_matmul(opn, &in[0], &in[1], err);
        if (n < 0) return KILN_ERR_VERIFY;
        if (act_width(&in[2]) != n)
            return BAD("linear_add: residual %%%d is not an activation of the projection's width %lld", in[2].id,
                       (long long)n);
        make_act(&out[0], n);
        return KILN_OK;
    }
    case KILN_OP_ROPE:
        if (!is_tokens(&in[1])) return BAD("rope: positions %%%d must be [B,S] i32", in[1].id);
        if (a->head_dim <= 0 || a->head_dim % 2 || a->n_heads <= 0 || w0 != (int64_t)a->n_heads * a->head_dim)
            return BAD("rope: width %lld is not n_heads %d x head_dim %d (even)", (long long)w0, a->n_heads,
                       a->head_dim);
        if (!(a->rope_theta > 0)) return BAD("rope: theta must be > 0");
        make_act(&out[0], w0);
        return KILN_OK;
    case KILN_OP_ATTENTION: {
        int64_t wk = act_width(&in[1]), wv = act_width(&in[2]);
        if (!is_tokens(&in[3])) return BAD("attention: positions %%%d must be [B,S] i32", in[3].id);
        if (!check_heads(opn, a, err)) return KILN_ERR_VERIFY;
        if (w0 != (int64_t)a->n_heads * a->head_dim || wk != (int64_t)a->n_kv_heads * a->head_dim || wv != wk)
            return BAD("attention: q/k/v widths %lld/%lld/%lld do not match heads %d/%d x %d", (long long)w0,
                       (long long)wk, (long long)wv, a->n_heads, a->n_kv_heads, a->head_dim);
        if (a->layer < 0 || a->window < 0) return BAD("attention: bad layer %d or window %d", a->layer, a->window);
        if ((a->flags & KILN_FLAG_KV_FP8) && (a->flags & KILN_FLAG_KV_INT8))
            return BAD("attention: +kv_fp8 and +kv_int8 together");
        if ((a->flags & (KILN_FLAG_KV_FP8 | KILN_FLAG_KV_INT8)) &&
            (!in[4].is_weight || in[4].ndim != 1 || in[4].shape[0] != 2 * (int64_t)a->n_kv_heads ||
             in[4].dtype != KILN_DTYPE_F32))
            return BAD("attention: kv_scale %s must be an f32 vector of 2 x %d kv heads", nm(&in[4]), a->n_kv_heads);
        make_act(&out[0], w0);
        return KILN_OK;
    }
    case KILN_OP_ADD_RMSNORM:
        if (w0 < 0 || w0 != act_width(&in[1])) return BAD("add_rmsnorm: inputs must be activations of one width");
        if (!check_norm_weight(opn, &in[2], w0, a->eps, err)) return KILN_ERR_VERIFY;
        if (!check_out_perm(opn, a, &in[3], w0, err)) return KILN_ERR_VERIFY;
        make_act(&out[0], w0);
        make_act(&out[1], w0);
        return KILN_OK;
    case KILN_OP_QKV_ROPE: {
        int64_t nq = check_matmul(opn, &in[0], &in[1], err);
        int64_t nk = nq < 0 ? -1 : check_matmul(opn, &in[0], &in[2], err);
        int64_t nv = nk < 0 ? -1 : check_matmul(opn, &in[0], &in[3], err);
        if (nv < 0) return KILN_ERR_VERIFY;
        if (!is_tokens(&in[4])) return BAD("qkv_rope: positions %%%d must be [B,S] i32", in[4].id);
        if (!check_heads(opn, a, err)) return KILN_ERR_VERIFY;
        if (!(a->rope_theta > 0)) return BAD("qkv_rope: theta must be > 0");
        if (nq != (int64_t)a->n_heads * a->head_dim || nk != (int64_t)a->n_kv_heads * a->head_dim || nv != nk)
            return BAD("qkv_rope: projection widths %lld/%lld/%lld do not match heads %d/%d x %d", (long long)nq,
                       (long long)nk, (long long)nv, a->n_heads, a->n_kv_heads, a->head_dim);
        if (!check_qkv_extras(opn, in + 5, a, nq, nk, err)) return KILN_ERR_VERIFY;
        make_act(&out[0], nq);
        make_act(&out[1], nk);
        make_act(&out[2], nv);
        return KILN_OK;
    }
    case KILN_OP_QKV_ROPE_PACKED: {
        int64_t n = check_matmul(opn, &in[0], &in[1], err);
        if (n < 0) return KILN_ERR_VERIFY;
        if (!is_tokens(&in[2])) return BAD("qkv_rope_packed: positions %%%d must be [B,S] i32", in[2].id);
        if (!check_heads(opn, a, err)) return KILN_ERR_VERIFY;
        if (!(a->rope_theta > 0)) return BAD("qkv_rope_packed: theta must be > 0");
        int64_t nq = (int64_t)a->n_heads * a->head_dim, nk = (int64_t)a->n_kv_heads * a->head_dim;
        if (n != nq + 2 * nk)
            return BAD("qkv_rope_packed: weight %s has %lld rows, heads %d + 2 x %d of %d need %lld", nm(&in[1]),
                       (long long)n, a->n_heads, a->n_kv_heads, a->head_dim, (long long)(nq + 2 * nk));
        if (!check_qkv_extras(opn, in + 3, a, nq, nk, err)) return KILN_ERR_VERIFY;
        make_act(&out[0], nq);
        make_act(&out[1], nk);
        make_act(&out[2], nk);
        return KILN_OK;
    }
    case KILN_OP_GATE_UP_SWIGLU_PACKED: {
        int64_t n = check_matmul(opn, &in[0], &in[1], err);
        if (n < 0) return KILN_ERR_VERIFY;
        if (n % 2) return BAD("gate_up_swiglu_packed: weight %s has an odd row count %lld", nm(&in[1]), (long long)n);
        make_act(&out[0], n / 2);
        return KILN_OK;
    }
    case KILN_OP_GATE_UP_SWIGLU: {
        int64_t ng = check_matmul(opn, &in[0], &in[1], err);
        int64_t nu = ng < 0 ? -1 : check_matmul(opn, &in[0], &in[2], err);
        if (nu < 0) return KILN_ERR_VERIFY;
        if (ng != nu) return BAD("gate_up_swiglu: gate width %lld != up width %lld", (long long)ng, (long long)nu);
        make_act(&out[0], ng);
        return KILN_OK;
    }
    case KILN_OP_MOE: {
        /* x [B,S,H], router [E,H], Wgu [E,2F,H], Wdown [E,H,F] */
        const kiln_tensor_desc *r = &in[1], *gu = &in[2], *dn = &in[3];
        const int64_t e = a->n_experts;
        if (w0 < 0) return BAD("moe: input %%%d is not a [B,S,W] f32 activation", in[0].id);
        if (e <= 0 || a->top_k <= 0 || a->top_k > e)
            return BAD("moe: top_k %d of %d experts (needs 1 <= top_k <= n_experts)", a->top_k, a->n_experts);
        if (!is_matrix_weight(r) || r->shape[0] != e || r->shape[1] != w0)
            return BAD("moe: router %s must be a [%lld,%lld] float weight", nm(r), (long long)e, (long long)w0);
        if (!is_stack_weight(gu) || gu->shape[0] != e || gu->shape[1] % 2 || gu->shape[2] != w0)
            return BAD("moe: gate/up weight %s must be a [%lld,2F,%lld] float weight", nm(gu), (long long)e,
                       (long long)w0);
        if (!is_stack_weight(dn) || dn->shape[0] != e || dn->shape[1] != w0 || dn->shape[2] != gu->shape[1] / 2)
            return BAD("moe: down weight %s must be a [%lld,%lld,%lld] float weight", nm(dn), (long long)e,
                       (long long)w0, (long long)(gu->shape[1] / 2));
        make_act(&out[0], w0);
        return KILN_OK;
    }
    default: return BAD("unknown op kind %d", (int)kind);
    }
}
