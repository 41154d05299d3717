/*
 * import.c — checkpoint → IR: builds the forward graph of a Llama/Mistral/Qwen2/Qwen3/Mixtral/Qwen3-MoE
 * decoder exactly as the HuggingFace modeling code computes it, from coarse
 * ops (embedding, rmsnorm, linear, rope, attention, silu, mul, add,
 * lm_head; bias_add and head_rmsnorm for Qwen, moe for Mixtral and Qwen3-MoE). Fusion is left to passes/.
 *
 * Per layer l (x is the residual stream, [B,S,H]):
 *   h = rmsnorm(x, input_layernorm)
 *   q = rope(linear(h, q_proj)); k = rope(linear(h, k_proj)); v = linear(h, v_proj)
 *   (Qwen2: q = rope(bias_add(linear(h, q_proj), q_proj.bias)), k and v likewise with their biases)
 *   (Qwen3, Qwen3-MoE: q = rope(head_rmsnorm(linear(h, q_proj), q_norm)), k likewise with k_norm)
 *   x = x + linear(attention(q, k, v), o_proj)
 *   h = rmsnorm(x, post_attention_layernorm)
 *   x = x + linear(silu(linear(h, gate_proj)) * linear(h, up_proj), down_proj)
 *   (Mixtral, Qwen3-MoE's sparse layers: x = x + moe(h, router, experts), one op: see below)
 * then logits = lm_head(rmsnorm(x, model.norm), lm_head or embed_tokens if tied).
 *
 * Mixtral's experts come in two forms, both read: the published one (what
 * save_pretrained writes in transformers 4 and 5) has per layer
 * block_sparse_moe.gate.weight [E,H] and per expert e
 * block_sparse_moe.experts.e.{w1,w3,w2}.weight (gate [F,H], up [F,H], down
 * [H,F]); transformers 5's in-memory form has mlp.gate.weight [E,H],
 * mlp.experts.gate_up_proj [E,2F,H] (gate rows, then up rows) and
 * mlp.experts.down_proj [E,H,F]. Either becomes the moe op's weights in
 * their final layout, [E,2F,H] and [E,H,F]: the fused tensors as they are,
 * the per-expert ones as stacks (kiln_ir_weight_stacked) that the plan writer
 * concatenates while it converts them, so no copy is made here. A layer is
 * read in the published form when its block_sparse_moe.gate.weight exists;
 * tensors of the other form then stay unused and are refused by name.
 * Qwen3-MoE's are the same two forms under other names: published, per layer
 * mlp.gate.weight [E,H] and per expert mlp.experts.e.{gate_proj,up_proj,
 * down_proj}.weight (of width moe_intermediate_size); transformers 5's
 * in-memory form exactly Mixtral's (mlp.gate.weight, mlp.experts.gate_up_proj,
 * mlp.experts.down_proj). A layer is read in the fused form when its
 * mlp.experts.gate_up_proj exists. Its dense layers (mlp_only_layers,
 * decoder_sparse_step) have the usual mlp.{gate,up,down}_proj of width
 * intermediate_size.
 *
 * Every weight is checked here: present, of the shape config.json implies,
 * of a supported dtype. Messages name the tensor and both shapes.
 *
 * A published quantized checkpoint (config.json quantization_config: AWQ,
 * GPTQ or compressed-tensors, 4 bits) has each projection's matrix as
 * <proj>.qweight, .qzeros, .scales (GPTQ: and .g_idx; compressed-tensors:
 * <proj>.weight_packed, .weight_scale, .weight_zero_point when asymmetric,
 * .weight_shape) instead of <proj>.weight: it becomes a q4gG
 * weight whose source is those tensors, repacked by the writer without
 * rounding again (quantized_weight; common/quant.c). An FP8 checkpoint
 * (quant_method fp8, compressed-tensors float-quantized) has <proj>.weight
 * as E4M3 codes with <proj>.weight_scale (one per tensor or per row) and,
 * with static activation scales, <proj>.input_scale: an fp8 weight, its
 * codes copied by the writer (fp8_weight). The embedding, norms, biases and
 * LM head are read as in any checkpoint.
 *
 * Every tensor of the checkpoint is used or refused: a tensor the graph does
 * not consume (a bias, a q_norm of another architecture relabelled as Llama)
 * would otherwise be dropped silently and the engine would compute another
 * model than the checkpoint's. Names matching KILN_IMPORT_DEFAULT_ALLOW
 * (HF's rotary_emb.inv_freq buffers, which transformers itself skips when
 * loading and recomputes from config.json) or a caller's fnmatch pattern
 * (`kiln compile --allow-unused`) may stay unused.
 *
 * Tied embeddings with an lm_head.weight in the checkpoint: transformers 5
 * ties them only when both tensors are equal (PreTrainedModel.tie_weights)
 * and otherwise keeps lm_head.weight untied with a warning, while
 * transformers 4 always overwrote lm_head with the embedding. So an equal
 * copy is consumed (the engine is the same as without it) and a differing
 * one is refused: either choice would silently differ from one of them.
 * Allowing lm_head.weight to stay unused (--allow-unused) says "tie", as
 * transformers 4 did.
 */
#include "kiln_compiler.h"

#include <fnmatch.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct importer {
    const kiln_checkpoint *ck;
    kiln_graph *g;
    kiln_dtype weight_dtype; /* KILN_DTYPE_COUNT_ = keep each tensor's dtype */
    bool *used;              /* [ck->n_index]: consumed by the graph */
    const kiln_import_options *opt; /* may be NULL */
    kiln_error *err;
} importer;

static bool unused_allowed(const kiln_import_options *o, const char *name);

/* Index of tensor `name` in ck->index, or -1. */
static ptrdiff_t find_index(const kiln_checkpoint *ck, const char *name) {
    size_t lo = 0, hi = ck->n_index;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int c = strcmp(ck->index[mid]->name, name);
        if (c == 0) return (ptrdiff_t)mid;
        if (c < 0) lo = mid + 1;
        else hi = mid;
    }
    return -1;
}

/* Dtypes a tensor may have, as masks of 1 << kiln_dtype. */
#define DT_FLOAT (1u << KILN_DTYPE_F32 | 1u << KILN_DTYPE_F16 | 1u << KILN_DTYPE_BF16)
#define DT_HALF (1u << KILN_DTYPE_F16 | 1u << KILN_DTYPE_BF16)
#define DT_I32 (1u << KILN_DTYPE_I32)
#define DT_I64 (1u << KILN_DTYPE_I64)
#define DT_F8 (1u << KILN_DTYPE_F8E4M3)

/* Look up tensor `name`, check that it is present, of shape want[0..ndim) and of a dtype in `dts`
 * (`dts_name` says which, for the message), and mark it used. NULL (error set) otherwise. */
static const kiln_st_tensor *checked_tensor_dt(importer *im, const char *name, int ndim, const int64_t *want,
                                               unsigned dts, const char *dts_name) {
    ptrdiff_t at = find_index(im->ck, name);
    const kiln_st_tensor *t = at >= 0 ? im->ck->index[at] : NULL;
    if (!t) {
        kiln_err(im->err, KILN_ERR_MISSING, "%s: tensor '%s' is missing from the checkpoint", im->ck->dir, name);
        kiln_err_hint(im->err, "the checkpoint's config.json describes a model whose weights are not all here; "
                               "check that every shard was downloaded");
        return NULL;
    }
    bool ok = t->ndim == ndim;
    for (int i = 0; ok && i < ndim; i++) ok = t->shape[i] == want[i];
    if (!ok) {
        char got[96] = "", exp[96] = "";
        size_t k = 0;
        for (int i = 0; i < t->ndim; i++)
            k += (size_t)snprintf(got + k, sizeof got - k, "%s%lld", i ? "," : "", (long long)t->shape[i]);
        k = 0;
        for (int i = 0; i < ndim; i++)
            k += (size_t)snprintf(exp + k, sizeof exp - k, "%s%lld", i ? "," : "", (long long)want[i]);
        kiln_err(im->err, KILN_ERR_SHAPE, "%s: tensor '%s' has shape [%s], expected [%s] from config.json",
                 im->ck->dir, name, got, exp);
        return NULL;
    }
    if (!((unsigned)t->dtype < 32 && (dts >> t->dtype & 1u))) {
        kiln_err(im->err, KILN_ERR_UNSUPPORTED, "%s: tensor '%s' has dtype %s; kiln reads %s here", im->ck->dir, name,
                 kiln_dtype_name(t->dtype), dts_name);
        return NULL;
    }
    im->used[at] = true;
    return t;
}

/* checked_tensor_dt for a weight of the model: F32, F16 or BF16. */
static const kiln_st_tensor *checked_tensor_shape(importer *im, const char *name, int ndim, const int64_t *want) {
    return checked_tensor_dt(im, name, ndim, want, DT_FLOAT, "F32, F16 and BF16");
}

/* checked_tensor_shape for shape [d0] or [d0,d1]. */
static const kiln_st_tensor *checked_tensor(importer *im, const char *name, int ndim, int64_t d0, int64_t d1) {
    const int64_t want[2] = {d0, d1};
    return checked_tensor_shape(im, name, ndim, want);
}

/* Look up tensor `name` (checked_tensor_shape) and add it to the graph as a weight of engine dtype `dt`
 * (KILN_DTYPE_COUNT_: the import's choice, see weight()). Returns the value id or -1. */
static int weight_as(importer *im, const char *name, int ndim, const int64_t *want, kiln_dtype dt) {
    const kiln_st_tensor *t = checked_tensor_shape(im, name, ndim, want);
    if (!t) return -1;
    if (dt == KILN_DTYPE_COUNT_) dt = im->weight_dtype == KILN_DTYPE_COUNT_ ? t->dtype : im->weight_dtype;
    /* Norm weights are tiny and sensitive: keep them in f32 whatever the target. */
    if (ndim == 1) dt = KILN_DTYPE_F32;
    return kiln_ir_weight(im->g, name, dt, ndim, want, t->data, t->dtype, im->err);
}

static int weight(importer *im, const char *name, int ndim, int64_t d0, int64_t d1) {
    const int64_t want[2] = {d0, d1};
    return weight_as(im, name, ndim, want, KILN_DTYPE_COUNT_);
}

static int layer_weight(importer *im, int64_t l, const char *suffix, int ndim, int64_t d0, int64_t d1) {
    char name[KILN_NAME_MAX];
    snprintf(name, sizeof name, "model.layers.%lld.%s", (long long)l, suffix);
    return weight(im, name, ndim, d0, d1);
}

/* GPTQ's g_idx [k] (tensor `name`, groups of G) as kiln reads it, into *perm: NULL when it maps column i
 * to group i / G, the checkpoint's order; else, for act-order (desc_act) checkpoints, the columns sorted
 * stably by group into a new array (kiln's column j = the checkpoint's (*perm)[j]), which needs every
 * group to hold exactly G columns: anything else is refused naming the first column past it. */
static kiln_status gptq_order(importer *im, const kiln_st_tensor *gi, const char *name, int64_t k, int64_t G,
                              int32_t **perm) {
    const int64_t ng = k / G;
    *perm = NULL;
    int64_t *count = calloc((size_t)ng, sizeof *count);
    if (!count) return kiln_err(im->err, KILN_ERR_NOMEM, "out of memory reading '%s'", name);
    bool trivial = true;
    for (int64_t i = 0; i < k; i++) {
        const int64_t got = (int32_t)kiln_rd_u32((const uint8_t *)gi->data + 4 * i);
        trivial &= got == i / G;
        if (got >= 0 && got < ng && count[got] < G) {
            count[got]++;
            continue;
        }
        free(count);
        if (got < 0 || got >= ng)
            kiln_err(im->err, KILN_ERR_PARSE, "%s: tensor '%s' maps input column %lld to group %lld: there are groups "
                     "0 to %lld only", im->ck->dir, name, (long long)i, (long long)got, (long long)(ng - 1));
        else
            kiln_err(im->err, KILN_ERR_PARSE, "%s: tensor '%s' maps input column %lld to group %lld, which already has "
                     "its %lld columns", im->ck->dir, name, (long long)i, (long long)got, (long long)G);
        return kiln_err_hint(im->err, "a GPTQ g_idx puts exactly group_size (%lld) input columns in each group; the "
                                      "checkpoint is damaged, or config.json's group_size is not the one it was "
                                      "quantized with", (long long)G);
    }
    if (trivial) {
        free(count);
        return KILN_OK;
    }
    if (!(*perm = malloc((size_t)k * sizeof **perm))) {
        free(count);
        return kiln_err(im->err, KILN_ERR_NOMEM, "out of memory reading '%s'", name);
    }
    memset(count, 0, (size_t)ng * sizeof *count);
    for (int64_t i = 0; i < k; i++) { /* counting sort: group g's columns go to g * G.., in column order */
        const int64_t g = (int32_t)kiln_rd_u32((const uint8_t *)gi->data + 4 * i);
        (*perm)[g * G + count[g]++] = (int32_t)i;
    }
    free(count);
    return KILN_OK;
}

/* The [n, k] projection `base` of a quantized checkpoint (config.json quantization_config: AWQ or
 * GPTQ, 4 bits, groups of G) as a q4gG weight whose source is its tensors <base>.qweight, .qzeros,
 * .scales (and GPTQ's .g_idx), checked here for shapes and dtypes (layouts: kiln_ops.h, kiln_qsrc);
 * their values are repacked, and the scales checked, by the writer. G is the checkpoint's group size
 * or, for GPTQ, the one its dynamic map gives the projection. An act-order GPTQ projection (g_idx not
 * i / G: gptq_order) gets its columns sorted by group and *perm the id of a new i32 weight
 * "<base>.g_idx" holding that order, which its input must be permuted by (KILN_OP_PERMUTE); else
 * *perm = -1. */
static int quantized_weight(importer *im, const char *base, int64_t n, int64_t k, int64_t G, int *perm) {
    const kiln_ckpt_quant *cq = &im->ck->config.quant;
    const bool awq = cq->method == KILN_CKPT_QUANT_AWQ;
    const char *dir = im->ck->dir, *method = kiln_ckpt_quant_name(cq);
    *perm = -1;
    if (n % 8 || k % G) {
        kiln_err(im->err, KILN_ERR_UNSUPPORTED, "%s: projection '%s' is [%lld,%lld] (out, in): a %s checkpoint "
                 "packs 8 output rows per int32 and groups of %lld input columns, which do not divide it", dir, base,
                 (long long)n, (long long)k, method, (long long)G);
        return -1;
    }
    char name[KILN_NAME_MAX + 16];
    const int64_t qw[2] = {awq ? k : k / 8, awq ? n / 8 : n}, qz[2] = {k / G, n / 8}, sc[2] = {k / G, n};
    const kiln_st_tensor *tw, *tz, *ts;
    snprintf(name, sizeof name, "%s.qweight", base);
    if (!(tw = checked_tensor_dt(im, name, 2, qw, DT_I32, "I32"))) return -1;
    snprintf(name, sizeof name, "%s.qzeros", base);
    if (!(tz = checked_tensor_dt(im, name, 2, qz, DT_I32, "I32"))) return -1;
    snprintf(name, sizeof name, "%s.scales", base);
    if (!(ts = checked_tensor_dt(im, name, 2, sc, DT_HALF, "F16 and BF16"))) return -1;
    int32_t *order = NULL;
    if (!awq) { /* g_idx [k]: the group of each input column */
        snprintf(name, sizeof name, "%s.g_idx", base);
        const kiln_st_tensor *gi = checked_tensor_dt(im, name, 1, &k, DT_I32, "I32");
        if (!gi) return -1;
        if (gptq_order(im, gi, name, k, G, &order) != KILN_OK) return -1;
        if (order && (*perm = kiln_ir_weight_owned(im->g, name, KILN_DTYPE_I32, 1, &k, order, im->err)) < 0) return -1;
    }
    const kiln_qsrc q = {.format = awq ? KILN_QSRC_AWQ : KILN_QSRC_GPTQ,
                         .zero_offset = !awq && !cq->gptq_v2, /* GPTQ v1 stores each zero minus 1 */
                         .qweight = tw->data, .qzeros = tz->data, .scales = ts->data, .scales_dtype = ts->dtype,
                         .col_perm = order};
    const kiln_dtype dt = G == 32 ? KILN_DTYPE_Q4G32 : G == 64 ? KILN_DTYPE_Q4G64 : KILN_DTYPE_Q4G128;
    snprintf(name, sizeof name, "%s.qweight", base);
    return kiln_ir_weight_prequantized(im->g, name, dt, (const int64_t[2]){n, k}, &q, im->err);
}

/* The [n, k] projection `base` of a compressed-tensors checkpoint (format pack-quantized, int4 in
 * groups of G; config.c cfg_quant_ct) as a q4gG weight whose source is <base>.weight_packed I32
 * [n, k/8], .weight_scale F16/BF16 [n, k/G], and for asymmetric groups .weight_zero_point I32
 * [n/8, k/G] (packed along the rows; compressed-tensors 0.10 on: earlier releases stored the zeros
 * unpacked, which this refuses by their shape); .weight_shape I32/I64 [2] must say [n, k]. Layouts:
 * kiln_ops.h, kiln_qsrc. With actorder "group" (cq->desc_act) a .weight_g_idx I32 [k] gives each column's
 * group, read as GPTQ's g_idx is (gptq_order: *perm the id of the order's weight, or -1); otherwise one is
 * left unused, so refused by name. */
static int ct_weight(importer *im, const char *base, int64_t n, int64_t k, int *perm) {
    const kiln_ckpt_quant *cq = &im->ck->config.quant;
    const int64_t G = cq->group_size;
    const char *dir = im->ck->dir;
    if (k % G || (!cq->sym && n % 8)) {
        kiln_err(im->err, KILN_ERR_UNSUPPORTED, "%s: projection '%s' is [%lld,%lld] (out, in): a compressed-tensors "
                 "checkpoint has groups of %lld input columns%s, which do not divide it", dir, base, (long long)n,
                 (long long)k, (long long)G, cq->sym ? "" : " and packs the zero points of 8 output rows per int32");
        return -1;
    }
    char name[KILN_NAME_MAX + 24];
    const int64_t pw[2] = {n, k / 8}, sc[2] = {n, k / G}, zp[2] = {n / 8, k / G}, two = 2;
    const kiln_st_tensor *tw, *ts, *tz = NULL, *tsh;
    snprintf(name, sizeof name, "%s.weight_shape", base);
    if (!(tsh = checked_tensor_dt(im, name, 1, &two, DT_I32 | DT_I64, "I32 and I64"))) return -1;
    for (int i = 0; i < 2; i++) {
        const int64_t got = tsh->dtype == KILN_DTYPE_I64 ? (int64_t)kiln_rd_u64(tsh->data + 8 * i)
                                                         : (int32_t)kiln_rd_u32(tsh->data + 4 * i);
        if (got == (i ? k : n)) continue;
        kiln_err(im->err, KILN_ERR_SHAPE, "%s: tensor '%s' says the matrix is [%lld,...] in dimension %d, expected "
                 "[%lld,%lld] from config.json", dir, name, (long long)got, i, (long long)n, (long long)k);
        return -1;
    }
    snprintf(name, sizeof name, "%s.weight_packed", base);
    if (!(tw = checked_tensor_dt(im, name, 2, pw, DT_I32, "I32"))) return -1;
    snprintf(name, sizeof name, "%s.weight_scale", base);
    if (!(ts = checked_tensor_dt(im, name, 2, sc, DT_HALF, "F16 and BF16"))) return -1;
    if (!cq->sym) {
        snprintf(name, sizeof name, "%s.weight_zero_point", base);
        if (!(tz = checked_tensor_dt(im, name, 2, zp, DT_I32, "I32 (packed, 8 rows a word)"))) return -1;
    }
    int32_t *order = NULL;
    *perm = -1;
    if (cq->desc_act) { /* actorder "group": weight_g_idx [k], the group of each input column */
        snprintf(name, sizeof name, "%s.weight_g_idx", base);
        const kiln_st_tensor *gi = checked_tensor_dt(im, name, 1, &k, DT_I32, "I32");
        if (!gi || gptq_order(im, gi, name, k, G, &order) != KILN_OK) return -1;
        if (order && (*perm = kiln_ir_weight_owned(im->g, name, KILN_DTYPE_I32, 1, &k, order, im->err)) < 0) return -1;
    }
    const kiln_qsrc q = {.format = KILN_QSRC_CT, .qweight = tw->data, .qzeros = tz ? tz->data : NULL,
                         .scales = ts->data, .scales_dtype = ts->dtype, .col_perm = order};
    const kiln_dtype dt = G == 32 ? KILN_DTYPE_Q4G32 : G == 64 ? KILN_DTYPE_Q4G64 : KILN_DTYPE_Q4G128;
    snprintf(name, sizeof name, "%s.weight_packed", base);
    return kiln_ir_weight_prequantized(im->g, name, dt, (const int64_t[2]){n, k}, &q, im->err);
}

/* The scale tensor <base>.<suffix> of an FP8 projection: F32, F16 or BF16, of shape [] or [1] (one for
 * the tensor; rows 0) or [rows, cols] (one per output row: cols 1; one per block: the block grid), every
 * value finite and > 0 (checked here, so the writer copies them as they are). Marks it used; NULL (error
 * set) otherwise. */
static const kiln_st_tensor *fp8_scale(importer *im, const char *base, const char *suffix, int64_t rows,
                                       int64_t cols) {
    char name[KILN_NAME_MAX + 24];
    snprintf(name, sizeof name, "%s.%s", base, suffix);
    const ptrdiff_t at = find_index(im->ck, name);
    const int64_t one = 1, grid[2] = {rows, cols};
    /* a scalar [] (AutoFP8, transformers) or [1] (compressed-tensors, vLLM) for one per tensor */
    const kiln_st_tensor *t = rows ? checked_tensor_dt(im, name, 2, grid, DT_FLOAT, "F32, F16 and BF16")
                              : at >= 0 && im->ck->index[at]->ndim == 0
                                  ? checked_tensor_dt(im, name, 0, NULL, DT_FLOAT, "F32, F16 and BF16")
                                  : checked_tensor_dt(im, name, 1, &one, DT_FLOAT, "F32, F16 and BF16");
    if (!t) return NULL;
    for (int64_t i = 0; i < (rows ? rows * cols : 1); i++) {
        const float f = kiln_qsrc_scale_f32(t->data, t->dtype, i);
        if (isfinite(f) && f > 0) continue;
        char where[48] = "";
        if (rows) snprintf(where, sizeof where, " [%lld,%lld]", (long long)(i / cols), (long long)(i % cols));
        kiln_err(im->err, KILN_ERR_PARSE, "%s: tensor '%s' (%s): element %lld%s is %g: an FP8 scale must be finite "
                 "and positive", im->ck->dir, name, kiln_dtype_name(t->dtype), (long long)i, where, (double)f);
        kiln_err_hint(im->err, "the checkpoint is damaged (re-download or re-export it)");
        return NULL;
    }
    return t;
}

/* The [n, k] projection `base` of an FP8 checkpoint (config.c: quant_method fp8, one scale per tensor;
 * compressed-tensors float-quantized, one per tensor or per row) as an fp8 weight whose source is
 * <base>.weight, E4M3 codes [n, k] (F8_E4M3), and <base>.weight_scale (fp8_scale; transformers names a
 * per-tensor one weight_scale_inv, read when weight_scale is absent); with weight_block_size [bn, 128]
 * (DeepSeek-V3, Qwen3-FP8) an fp8g128 weight whose scales are <base>.weight_scale_inv, one per block,
 * [ceil(n / bn), ceil(k / 128)]. With static activation scales
 * <base>.input_scale (transformers: activation_scale) is read and checked the same way, and not used
 * further: kiln's fp8 is weight-only. The writer copies the codes, refusing NaN codes
 * (kiln_quant_repack_fp8_row); the value is code * scale exactly, as the checkpoint means it. */
static int fp8_weight(importer *im, const char *base, int64_t n, int64_t k) {
    const kiln_ckpt_quant *cq = &im->ck->config.quant;
    const bool ct = cq->method == KILN_CKPT_QUANT_CT;
    char name[KILN_NAME_MAX + 24], alt[KILN_NAME_MAX + 24];
    snprintf(name, sizeof name, "%s.weight", base);
    const ptrdiff_t at = find_index(im->ck, name);
    const kiln_dtype wdt = at >= 0 ? im->ck->index[at]->dtype : KILN_DTYPE_F8E4M3;
    if ((unsigned)wdt < 32 && (DT_FLOAT >> wdt & 1u)) { /* left unquantized: ignore / ignored_layers */
        kiln_err(im->err, KILN_ERR_UNSUPPORTED, "%s: projection '%s' is not quantized in this %s checkpoint (its "
                 "'%s' is %s, not FP8 E4M3): checkpoints that leave projections unquantized are not read yet",
                 im->ck->dir, base, kiln_ckpt_quant_name(cq), name, kiln_dtype_name(wdt));
        kiln_err_hint(im->err, "its quantization_config names it in \"ignore\" (compressed-tensors) or "
                               "\"ignored_layers\" / \"modules_to_not_convert\"; compile the model's unquantized "
                               "checkpoint with --quant fp8");
        return -1;
    }
    const int64_t want[2] = {n, k};
    const kiln_st_tensor *tw = checked_tensor_dt(im, name, 2, want, DT_F8, "F8_E4M3");
    if (!tw) return -1;
    const char *scale = "weight_scale", *input = "input_scale";
    snprintf(alt, sizeof alt, "%s.weight_scale", base);
    const int bn = cq->fp8_block_n; /* block FP8: weight_scale_inv [ceil(n / bn), ceil(k / 128)] */
    if (!ct && (bn || find_index(im->ck, alt) < 0)) scale = "weight_scale_inv"; /* transformers' name */
    snprintf(alt, sizeof alt, "%s.input_scale", base);
    if (!ct && find_index(im->ck, alt) < 0) input = "activation_scale";
    const kiln_st_tensor *ts = bn ? fp8_scale(im, base, scale, (n + bn - 1) / bn, (k + 127) / 128)
                                  : fp8_scale(im, base, scale, cq->fp8_channel ? n : 0, 1);
    if (!ts || (cq->static_input && !fp8_scale(im, base, input, 0, 1))) return -1;
    const kiln_qsrc q = {.format = bn ? KILN_QSRC_FP8_BLOCK : ct ? KILN_QSRC_CT_FP8 : KILN_QSRC_FP8,
                         .qweight = tw->data, .scales = ts->data, .scales_dtype = ts->dtype,
                         .fp8_row_scales = cq->fp8_channel, .block_n = bn, .block_k = bn ? 128 : 0};
    return kiln_ir_weight_prequantized(im->g, name, bn ? KILN_DTYPE_FP8G128 : KILN_DTYPE_FP8, want, &q, im->err);
}

/* Projection `what` of layer l ("self_attn.q_proj"...), [n, k]: its .weight, or in a quantized
 * checkpoint its quantized tensors (quantized_weight, ct_weight, fp8_weight). *perm: the id of the
 * i32 order its input must be permuted by (act-order GPTQ: quantized_weight), else -1. */
static int proj_weight(importer *im, int64_t l, const char *what, int64_t n, int64_t k, int *perm) {
    *perm = -1;
    char base[KILN_NAME_MAX];
    snprintf(base, sizeof base, "model.layers.%lld.%s", (long long)l, what);
    char name[KILN_NAME_MAX + 8];
    snprintf(name, sizeof name, "%s.weight", base);
    const kiln_ckpt_quant_method m = im->ck->config.quant.method;
    if (m == KILN_CKPT_QUANT_NONE) return weight(im, name, 2, n, k);
    if (im->ck->config.quant.fp8) return fp8_weight(im, base, n, k);
    int group = im->ck->config.quant.group_size;
    const kiln_gptq_rule *rule = NULL;
    if (m == KILN_CKPT_QUANT_GPTQ && kiln_ckpt_quant_module(&im->ck->config.quant, base, &group, &rule, im->err))
        return -1;
    if (!group) { /* a dynamic "-:" rule: shipped dense */
        if (find_index(im->ck, name) < 0) {
            kiln_err(im->err, KILN_ERR_MISSING, "%s: projection '%s' is left unquantized by quantization_config.dynamic "
                     "rule \"%s\", but the checkpoint has no '%s'", im->ck->dir, base, rule->key, name);
            kiln_err_hint(im->err, "the rule does not describe this checkpoint's tensors: is it the config.json it "
                                   "was saved with?");
            return -1;
        }
        return weight(im, name, 2, n, k);
    }
    if (find_index(im->ck, name) >= 0) { /* left unquantized: ignore / modules_to_not_convert */
        kiln_err(im->err, KILN_ERR_UNSUPPORTED, "%s: projection '%s' is not quantized in this %s checkpoint (it has "
                 "'%s', no '%s.%s'): checkpoints that leave projections unquantized are not read yet", im->ck->dir,
                 base, kiln_ckpt_quant_name(&im->ck->config.quant), name, base,
                 m == KILN_CKPT_QUANT_CT ? "weight_packed" : "qweight");
        kiln_err_hint(im->err, "its quantization_config names it in \"ignore\" (compressed-tensors) or "
                               "\"modules_to_not_convert\"; compile the model's unquantized checkpoint with --quant int4");
        return -1;
    }
    if (m == KILN_CKPT_QUANT_CT) return ct_weight(im, base, n, k, perm);
    const int w = quantized_weight(im, base, n, k, group, perm);
    if (w < 0 && rule) kiln_err_hint(im->err, "quantization_config.dynamic rule \"%s\" gives '%s' groups of %d", rule->key,
                                     base, group);
    return w;
}

/* Projections of layer l that read one input (q, k, v; gate, up) are packed into one matrix for the GPU,
 * so they must share a format: a GPTQ dynamic map (or a checkpoint's dtypes) that gives them different
 * ones is refused naming them, before pack-weights would. Returns 0, or -1 with the error set. */
static int same_format(importer *im, int64_t l, const char *const *what, const int *w, int n) {
    for (int i = 1; i < n; i++) {
        const kiln_dtype a = (kiln_dtype)im->g->values[w[0]].dtype, b = (kiln_dtype)im->g->values[w[i]].dtype;
        if (a == b) continue;
        kiln_err(im->err, KILN_ERR_UNSUPPORTED, "%s: 'model.layers.%lld.%s' is %s but 'model.layers.%lld.%s' is %s: "
                 "projections that read the same input share one format in kiln (their matrices are packed "
                 "together)", im->ck->dir, (long long)l, what[0], kiln_dtype_name(a), (long long)l, what[i],
                 kiln_dtype_name(b));
        if (im->ck->config.quant.n_rules)
            kiln_err_hint(im->err, "the checkpoint's quantization_config.dynamic treats them differently; "
                                   "re-quantize with one rule for all of them");
        else
            kiln_err_hint(im->err, "the checkpoint stores them in different dtypes: --dtype converts them all");
        return -1;
    }
    return 0;
}

static int layer_op(importer *im, int64_t l, const char *what, kiln_op_kind kind, const int *in, int n_in,
                    const kiln_op_attrs *attrs);

/* The input x of layer l's projections `what` [n] (their permutation weights perm[], -1 = none) in the
 * order their matrices read it: x itself when none is act-order, else one permute op (labelled
 * "l<l>.<label>") by their common order. Projections that read one input are packed into one matrix,
 * so they must read it in one order: a mix, or two different orders, is refused naming both. The
 * other projections' copies of the order are dropped and their matrices point at the one kept.
 * Returns the value id, or -1 with the error set. */
static int permuted_input(importer *im, int64_t l, int x, const char *const *what, const int *w, const int *perm,
                          int n, const char *label) {
    kiln_graph *g = im->g;
    for (int i = 1; i < n; i++) {
        const bool both = perm[0] >= 0 && perm[i] >= 0;
        if (both && memcmp(g->values[perm[0]].owned, g->values[perm[i]].owned,
                           (size_t)g->values[perm[0]].shape[0] * sizeof(int32_t)) == 0) {
            g->values[perm[i]].dead = true;
            g->values[w[i]].qsrc.col_perm = g->values[perm[0]].owned;
            continue;
        }
        if (!both && perm[0] < 0 && perm[i] < 0) continue;
        kiln_err(im->err, KILN_ERR_UNSUPPORTED, "%s: 'model.layers.%lld.%s' and 'model.layers.%lld.%s' read the same "
                 "input but their act-order g_idx order its columns %s: kiln packs them into one matrix, which reads "
                 "its input in one order", im->ck->dir, (long long)l, what[0], (long long)l, what[i],
                 both ? "differently" : "in different ways (one in groups as they come)");
        kiln_err_hint(im->err, "GPTQ gives projections of one input the same act-order when it quantizes them "
                               "from the same activations; re-quantize them together, or with desc_act false");
        return -1;
    }
    if (perm[0] < 0) return x;
    return layer_op(im, l, label, KILN_OP_PERMUTE, (int[]){x, perm[0]}, 2, NULL);
}

/* Append a one-output op of layer l, labelled "l<l>.<what>". Returns the value id or -1. */
static int layer_op(importer *im, int64_t l, const char *what, kiln_op_kind kind, const int *in, int n_in,
                    const kiln_op_attrs *attrs) {
    char label[64];
    snprintf(label, sizeof label, "l%lld.%s", (long long)l, what);
    return kiln_ir_op1(im->g, kind, in, n_in, attrs, label, im->err);
}

static kiln_op_attrs rope_attrs(const kiln_model_config *c, int32_t heads) {
    kiln_op_attrs a = {
        .n_heads = heads,
        .n_kv_heads = (int32_t)c->n_kv_heads,
        .head_dim = (int32_t)c->head_dim,
        .rope_theta = (float)c->rope_theta,
    };
    if (c->rope_type == KILN_ROPE_LLAMA3) {
        a.rope_scaling = KILN_ROPE_SCALING_LLAMA3;
        a.rope_factor = (float)c->rope_factor;
        a.rope_low_freq_factor = (float)c->rope_low_freq_factor;
        a.rope_high_freq_factor = (float)c->rope_high_freq_factor;
        a.rope_original_max_pos = (float)c->rope_original_max_pos;
    }
    return a;
}

/* Element i of a F32/F16/BF16 tensor's little-endian bytes, as a float (exact). */
static float elem_f32(const uint8_t *p, kiln_dtype dt, size_t i) {
    if (dt == KILN_DTYPE_F32) {
        uint32_t u = kiln_rd_u32(p + 4 * i);
        float f;
        memcpy(&f, &u, 4);
        return f;
    }
    uint16_t h = (uint16_t)(p[2 * i] | p[2 * i + 1] << 8);
    return dt == KILN_DTYPE_BF16 ? kiln_bf16_to_f32(h) : kiln_f16_to_f32(h);
}

/* tie_word_embeddings with an lm_head.weight shipped too (file comment):
 * consumed when equal to the embedding element for element, else refused. */
static kiln_status tied_head_check(importer *im) {
    const kiln_model_config *c = &im->ck->config;
    /* absent, or explicitly allowed to stay unused (--allow-unused lm_head.weight: tie as transformers 4) */
    if (find_index(im->ck, "lm_head.weight") < 0 || unused_allowed(im->opt, "lm_head.weight")) return KILN_OK;
    const kiln_st_tensor *head = checked_tensor(im, "lm_head.weight", 2, c->vocab_size, c->hidden_size);
    const kiln_st_tensor *emb = kiln_checkpoint_find(im->ck, "model.embed_tokens.weight");
    if (!head) return im->err ? im->err->code : KILN_ERR_INTERNAL;
    size_t n = (size_t)(c->vocab_size * c->hidden_size); /* both shapes were checked: [V,H] */
    for (size_t i = 0; i < n; i++) {
        float a = elem_f32(head->data, head->dtype, i), b = elem_f32(emb->data, emb->dtype, i);
        if (a == b) continue;
        kiln_err(im->err, KILN_ERR_UNSUPPORTED,
                 "%s: config.json says tie_word_embeddings: true, but the checkpoint's 'lm_head.weight' differs from "
                 "'model.embed_tokens.weight' (first at element %zu = [%zu,%zu]: %.9g vs %.9g)",
                 im->ck->dir, i, i / (size_t)c->hidden_size, i % (size_t)c->hidden_size, (double)a, (double)b);
        return kiln_err_hint(im->err, "transformers 5 would use lm_head.weight untied, transformers 4 would "
                                      "overwrite it with the embedding; say which model this is: set "
                                      "\"tie_word_embeddings\": false in config.json to use lm_head.weight, or "
                                      "compile with --allow-unused lm_head.weight to tie");
    }
    return KILN_OK;
}

/* Is `name` allowed to stay unused (the default list or a caller's pattern)? */
static bool unused_allowed(const kiln_import_options *o, const char *name) {
    if (fnmatch(KILN_IMPORT_DEFAULT_ALLOW, name, 0) == 0) return true;
    for (int i = 0; o && i < o->n_allow_unused; i++)
        if (o->allow_unused[i] && fnmatch(o->allow_unused[i], name, 0) == 0) return true;
    return false;
}

/* Refuse the first checkpoint tensor the graph did not consume (file comment). */
static kiln_status check_all_used(importer *im, const kiln_import_options *o) {
    const kiln_checkpoint *ck = im->ck;
    size_t first = ck->n_index, n = 0;
    for (size_t i = 0; i < ck->n_index; i++) {
        if (im->used[i] || unused_allowed(o, ck->index[i]->name)) continue;
        if (n++ == 0) first = i;
    }
    if (n == 0) return KILN_OK;
    const char *name = ck->index[first]->name;
    char more[64] = "";
    if (n > 1) snprintf(more, sizeof more, " (and %zu other unused tensor%s)", n - 1, n > 2 ? "s" : "");
    kiln_err(im->err, KILN_ERR_UNSUPPORTED,
             "%s: tensor '%s' is in the checkpoint but not used by the %s graph kiln builds from config.json%s",
             ck->dir, name, kiln_arch_name(ck->config.arch), more);
    return kiln_err_hint(im->err, "a tensor kiln would drop (a bias, a q_norm...) usually means the checkpoint is of "
                                  "another architecture than config.json says; if it is truly not part of the model, "
                                  "compile with --allow-unused '%s' (a glob pattern; repeatable)", name);
}

/* The experts of layer l as the moe op's three weights (router [E,H], gate/up [E,2F,H], down [E,H,F]),
 * from either form a checkpoint has them in (file comment). Returns 0, or -1 with the error set. */
static int expert_weights(importer *im, int64_t l, int w[3]) {
    const kiln_model_config *c = &im->ck->config;
    const int64_t E = c->n_experts, F = c->moe_intermediate_size, H = c->hidden_size;
    /* the published form's names: Mixtral's block_sparse_moe.experts.e.w1 (gate), w3 (up), w2 (down), or
     * Qwen3-MoE's mlp.experts.e.gate_proj, up_proj, down_proj */
    const bool qmoe = c->arch == KILN_ARCH_QWEN3_MOE;
    const char *block = qmoe ? "mlp" : "block_sparse_moe";
    static const char *const mixtral_proj[3] = {"w1", "w3", "w2"}, *const qwen_proj[3] = {"gate_proj", "up_proj",
                                                                                          "down_proj"};
    const char *const *proj = qmoe ? qwen_proj : mixtral_proj;
    char name[KILN_NAME_MAX], fused[KILN_NAME_MAX];
    snprintf(name, sizeof name, "model.layers.%lld.block_sparse_moe.gate.weight", (long long)l);
    snprintf(fused, sizeof fused, "model.layers.%lld.mlp.experts.gate_up_proj", (long long)l);
    if ((qmoe || find_index(im->ck, name) < 0) && find_index(im->ck, fused) >= 0) { /* transformers 5's form */
        const int64_t gu[3] = {E, 2 * F, H}, dn[3] = {E, H, F};
        if ((w[0] = layer_weight(im, l, "mlp.gate.weight", 2, E, H)) < 0 ||
            (w[1] = weight_as(im, fused, 3, gu, KILN_DTYPE_COUNT_)) < 0)
            return -1;
        snprintf(fused, sizeof fused, "model.layers.%lld.mlp.experts.down_proj", (long long)l);
        return (w[2] = weight_as(im, fused, 3, dn, KILN_DTYPE_COUNT_)) < 0 ? -1 : 0;
    }
    /* the published form: one tensor per expert and projection, stacked into the final layout. All
     * parts take the first one's engine dtype (a stack has one dtype). */
    char router[32];
    snprintf(router, sizeof router, "%s.gate.weight", block);
    if ((w[0] = layer_weight(im, l, router, 2, E, H)) < 0) return -1;
    int *gu = malloc((size_t)(3 * E) * sizeof *gu), *dn = gu + 2 * E;
    if (!gu) {
        kiln_err(im->err, KILN_ERR_NOMEM, "out of memory importing layer %lld's experts", (long long)l);
        return -1;
    }
    kiln_dtype dt = KILN_DTYPE_COUNT_;
    int rc = 0;
    for (int64_t e = 0; e < E && rc == 0; e++) {
        for (int k = 0; k < 3 && rc == 0; k++) { /* gate, up, down */
            const int64_t shape[2] = {k < 2 ? F : H, k < 2 ? H : F};
            snprintf(name, sizeof name, "model.layers.%lld.%s.experts.%lld.%s.weight", (long long)l, block,
                     (long long)e, proj[k]);
            int id = weight_as(im, name, 2, shape, dt);
            if (id < 0) rc = -1;
            else if (k < 2) gu[2 * e + k] = id;
            else dn[e] = id;
            if (id >= 0) dt = im->g->values[id].dtype;
        }
    }
    const int64_t gu_shape[3] = {E, 2 * F, H}, dn_shape[3] = {E, H, F};
    if (rc == 0) {
        snprintf(name, sizeof name, "model.layers.%lld.%s.experts.*.%s+%s.weight", (long long)l, block, proj[0],
                 proj[1]);
        w[1] = kiln_ir_weight_stacked(im->g, name, gu, (int)(2 * E), gu_shape, im->err);
        snprintf(name, sizeof name, "model.layers.%lld.%s.experts.*.%s.weight", (long long)l, block, proj[2]);
        w[2] = w[1] < 0 ? -1 : kiln_ir_weight_stacked(im->g, name, dn, (int)E, dn_shape, im->err);
        rc = w[2] < 0 ? -1 : 0;
    }
    free(gu);
    return rc;
}

#define TRY(x)                     \
    do {                           \
        if ((x) < 0) goto fail;    \
    } while (0)

/* A compressed-tensors kv_cache_scheme's static FP8 scales of layer l, self_attn.k_scale and v_scale (one
 * per tensor, [] or [1]: fp8_scale; strategy attn_head: one per kv head, [n_kv_heads, 1, 1] as
 * compressed-tensors makes them; finite and positive), into kiln_graph.kv_ckpt_scales ([n_layers][2 * kv
 * heads], K's then V's; a per-tensor value on every kv head), which compile.c applies (pass quantize-kv). */
static kiln_status kv_ckpt_scales(importer *im, int64_t l) {
    const int64_t nkv = im->ck->config.n_kv_heads;
    kiln_graph *g = im->g;
    if (!g->kv_ckpt_scales &&
        !(g->kv_ckpt_scales = calloc((size_t)(im->ck->config.n_layers * 2 * nkv), sizeof *g->kv_ckpt_scales)))
        return kiln_err(im->err, KILN_ERR_NOMEM, "out of memory");
    char base[64];
    snprintf(base, sizeof base, "model.layers.%lld.self_attn", (long long)l);
    const bool per_head = im->ck->config.quant.kv_per_head;
    for (int kv = 0; kv < 2; kv++) {
        const char *suffix = kv ? "v_scale" : "k_scale";
        const kiln_st_tensor *t = NULL;
        if (per_head) {
            char name[KILN_NAME_MAX + 24];
            snprintf(name, sizeof name, "%s.%s", base, suffix);
            const int64_t shape[3] = {nkv, 1, 1};
            if (!(t = checked_tensor_dt(im, name, 3, shape, DT_FLOAT, "F32, F16 and BF16"))) return im->err->code;
            for (int64_t h = 0; h < nkv; h++) {
                const float f = kiln_qsrc_scale_f32(t->data, t->dtype, h);
                if (isfinite(f) && f > 0) continue;
                kiln_err(im->err, KILN_ERR_PARSE, "%s: tensor '%s' (%s): kv head %lld's scale is %g: an FP8 scale must "
                         "be finite and positive", im->ck->dir, name, kiln_dtype_name(t->dtype), (long long)h, (double)f);
                return kiln_err_hint(im->err, "the checkpoint is damaged (re-download or re-export it)");
            }
        } else if (!(t = fp8_scale(im, base, suffix, 0, 1))) {
            return im->err->code;
        }
        for (int64_t h = 0; h < nkv; h++)
            g->kv_ckpt_scales[(l * 2 + kv) * nkv + h] = kiln_qsrc_scale_f32(t->data, t->dtype, per_head ? h : 0);
    }
    return KILN_OK;
}

static kiln_status import_with(importer *im, kiln_dtype weight_dtype) {
    const kiln_model_config *c = &im->ck->config;
    kiln_graph *g = im->g;
    kiln_error *err = im->err;
    im->weight_dtype = weight_dtype;
    const int64_t H = c->hidden_size, F = c->intermediate_size, V = c->vocab_size, hd = c->head_dim;
    const int64_t q_out = c->n_heads * hd, kv_out = c->n_kv_heads * hd;
    const int64_t bs[2] = {KILN_DIM_BATCH, KILN_DIM_SEQ};

    TRY(g->tokens = kiln_ir_input(g, "tokens", KILN_DTYPE_I32, 2, bs, err));
    TRY(g->positions = kiln_ir_input(g, "positions", KILN_DTYPE_I32, 2, bs, err));
    int emb_w, x, h, w1, w2, w3;
    TRY(emb_w = weight(im, "model.embed_tokens.weight", 2, V, H));
    TRY(x = kiln_ir_op1(g, KILN_OP_EMBEDDING, (int[]){g->tokens, emb_w}, 2, NULL, "embed", err));

    for (int64_t l = 0; l < c->n_layers; l++) {
        kiln_op_attrs norm = {.eps = (float)c->rms_norm_eps};
        kiln_op_attrs rq = rope_attrs(c, (int32_t)c->n_heads), rk = rope_attrs(c, (int32_t)c->n_kv_heads);
        kiln_op_attrs att = rope_attrs(c, (int32_t)c->n_heads);
        att.layer = (int32_t)l;
        att.window = c->layer_windowed[l] ? (int32_t)c->sliding_window : 0;

        TRY(w1 = layer_weight(im, l, "input_layernorm.weight", 1, H, 0));
        TRY(h = layer_op(im, l, "attn_norm", KILN_OP_RMSNORM, (int[]){x, w1}, 2, &norm));

        int q, k, v, a, o, pm[3];
        static const char *const qkv_names[3] = {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"};
        TRY(w1 = proj_weight(im, l, qkv_names[0], q_out, H, &pm[0]));
        TRY(w2 = proj_weight(im, l, qkv_names[1], kv_out, H, &pm[1]));
        TRY(w3 = proj_weight(im, l, qkv_names[2], kv_out, H, &pm[2]));
        TRY(same_format(im, l, qkv_names, (int[]){w1, w2, w3}, 3));
        TRY(h = permuted_input(im, l, h, qkv_names, (int[]){w1, w2, w3}, pm, 3, "qkv_perm"));
        TRY(q = layer_op(im, l, "q", KILN_OP_LINEAR, (int[]){h, w1}, 2, NULL));
        TRY(k = layer_op(im, l, "k", KILN_OP_LINEAR, (int[]){h, w2}, 2, NULL));
        TRY(v = layer_op(im, l, "v", KILN_OP_LINEAR, (int[]){h, w3}, 2, NULL));
        if (c->arch == KILN_ARCH_QWEN2) { /* Qwen2: q, k and v projections carry biases (o_proj does not) */
            TRY(w1 = layer_weight(im, l, "self_attn.q_proj.bias", 1, q_out, 0));
            TRY(w2 = layer_weight(im, l, "self_attn.k_proj.bias", 1, kv_out, 0));
            TRY(w3 = layer_weight(im, l, "self_attn.v_proj.bias", 1, kv_out, 0));
            TRY(q = layer_op(im, l, "q_bias", KILN_OP_BIAS_ADD, (int[]){q, w1}, 2, NULL));
            TRY(k = layer_op(im, l, "k_bias", KILN_OP_BIAS_ADD, (int[]){k, w2}, 2, NULL));
            TRY(v = layer_op(im, l, "v_bias", KILN_OP_BIAS_ADD, (int[]){v, w3}, 2, NULL));
        }
        if (c->arch == KILN_ARCH_QWEN3 || c->arch == KILN_ARCH_QWEN3_MOE) { /* each head of q, k RMS-normalised */
            kiln_op_attrs hq = {.n_heads = (int32_t)c->n_heads, .head_dim = (int32_t)hd, .eps = (float)c->rms_norm_eps};
            kiln_op_attrs hk = hq;
            hk.n_heads = (int32_t)c->n_kv_heads;
            TRY(w1 = layer_weight(im, l, "self_attn.q_norm.weight", 1, hd, 0));
            TRY(w2 = layer_weight(im, l, "self_attn.k_norm.weight", 1, hd, 0));
            TRY(q = layer_op(im, l, "q_norm", KILN_OP_HEAD_RMSNORM, (int[]){q, w1}, 2, &hq));
            TRY(k = layer_op(im, l, "k_norm", KILN_OP_HEAD_RMSNORM, (int[]){k, w2}, 2, &hk));
        }
        TRY(q = layer_op(im, l, "q_rope", KILN_OP_ROPE, (int[]){q, g->positions}, 2, &rq));
        TRY(k = layer_op(im, l, "k_rope", KILN_OP_ROPE, (int[]){k, g->positions}, 2, &rk));
        TRY(a = layer_op(im, l, "attn", KILN_OP_ATTENTION, (int[]){q, k, v, g->positions}, 4, &att));
        if (c->quant.kv_fp8 && kv_ckpt_scales(im, l) != KILN_OK) return err->code;
        TRY(w1 = proj_weight(im, l, "self_attn.o_proj", H, q_out, &pm[0]));
        if (pm[0] >= 0) TRY(a = layer_op(im, l, "o_perm", KILN_OP_PERMUTE, (int[]){a, pm[0]}, 2, NULL));
        TRY(o = layer_op(im, l, "attn_out", KILN_OP_LINEAR, (int[]){a, w1}, 2, NULL));
        TRY(x = layer_op(im, l, "resid1", KILN_OP_ADD, (int[]){x, o}, 2, NULL));

        TRY(w1 = layer_weight(im, l, "post_attention_layernorm.weight", 1, H, 0));
        TRY(h = layer_op(im, l, "mlp_norm", KILN_OP_RMSNORM, (int[]){x, w1}, 2, &norm));
        if (c->layer_sparse[l]) { /* a sparse mixture of SwiGLU experts instead of one MLP */
            int ew[3];
            kiln_op_attrs ma = {.layer = (int32_t)l, .n_experts = (int32_t)c->n_experts,
                                .top_k = (int32_t)c->n_experts_per_tok,
                                .flags = c->norm_topk_prob ? 0u : (uint32_t)KILN_FLAG_MOE_NO_RENORM};
            TRY(expert_weights(im, l, ew));
            TRY(o = layer_op(im, l, "moe", KILN_OP_MOE, (int[]){h, ew[0], ew[1], ew[2]}, 4, &ma));
            TRY(x = layer_op(im, l, "resid2", KILN_OP_ADD, (int[]){x, o}, 2, NULL));
            continue;
        }
        int gt, up, m;
        static const char *const gu_names[2] = {"mlp.gate_proj", "mlp.up_proj"};
        TRY(w1 = proj_weight(im, l, gu_names[0], F, H, &pm[0]));
        TRY(w2 = proj_weight(im, l, gu_names[1], F, H, &pm[1]));
        TRY(same_format(im, l, gu_names, (int[]){w1, w2}, 2));
        TRY(h = permuted_input(im, l, h, gu_names, (int[]){w1, w2}, pm, 2, "gate_up_perm"));
        TRY(w3 = proj_weight(im, l, "mlp.down_proj", H, F, &pm[2]));
        TRY(gt = layer_op(im, l, "gate", KILN_OP_LINEAR, (int[]){h, w1}, 2, NULL));
        TRY(up = layer_op(im, l, "up", KILN_OP_LINEAR, (int[]){h, w2}, 2, NULL));
        TRY(gt = layer_op(im, l, "silu", KILN_OP_SILU, (int[]){gt}, 1, NULL));
        TRY(m = layer_op(im, l, "swiglu", KILN_OP_MUL, (int[]){gt, up}, 2, NULL));
        if (pm[2] >= 0) TRY(m = layer_op(im, l, "down_perm", KILN_OP_PERMUTE, (int[]){m, pm[2]}, 2, NULL));
        TRY(o = layer_op(im, l, "mlp_out", KILN_OP_LINEAR, (int[]){m, w3}, 2, NULL));
        TRY(x = layer_op(im, l, "resid2", KILN_OP_ADD, (int[]){x, o}, 2, NULL));
    }
    kiln_op_attrs norm = {.eps = (float)c->rms_norm_eps};
    TRY(w1 = weight(im, "model.norm.weight", 1, H, 0));
    TRY(h = kiln_ir_op1(g, KILN_OP_RMSNORM, (int[]){x, w1}, 2, &norm, "final_norm", err));
    int head = emb_w;
    if (!c->tie_word_embeddings) TRY(head = weight(im, "lm_head.weight", 2, V, H));
    else if (tied_head_check(im) != KILN_OK) goto fail;
    TRY(g->logits = kiln_ir_op1(g, KILN_OP_LM_HEAD, (int[]){h, head}, 2, NULL, "logits", err));

    g->info = (kiln_graph_info){
        .n_layers = (int32_t)c->n_layers,
        .n_kv_heads = (int32_t)c->n_kv_heads,
        .head_dim = (int32_t)c->head_dim,
        .hidden_size = (int32_t)c->hidden_size,
        .vocab_size = (int32_t)c->vocab_size,
        .max_context = (int32_t)c->max_position_embeddings,
    };
    return kiln_ir_verify(g, err);
fail:
    return err ? err->code : KILN_ERR_INTERNAL;
}

kiln_status kiln_import_ex(const kiln_checkpoint *ck, const kiln_import_options *o, kiln_graph **out,
                           kiln_error *err) {
    *out = NULL;
    kiln_graph *g = kiln_graph_new();
    bool *used = calloc(ck->n_index ? ck->n_index : 1, sizeof *used);
    if (!g || !used) {
        kiln_graph_free(g);
        free(used);
        return kiln_err(err, KILN_ERR_NOMEM, "out of memory creating the graph");
    }
    importer im = {.ck = ck, .g = g, .used = used, .opt = o, .err = err};
    kiln_status st = import_with(&im, o ? o->weight_dtype : KILN_DTYPE_COUNT_);
    if (st == KILN_OK) st = check_all_used(&im, o);
    free(used);
    if (st != KILN_OK) {
        kiln_graph_free(g);
        return st;
    }
    *out = g;
    return KILN_OK;
}

kiln_status kiln_import_dtype(const kiln_checkpoint *ck, kiln_dtype weight_dtype, kiln_graph **out, kiln_error *err) {
    kiln_import_options o = {.weight_dtype = weight_dtype};
    return kiln_import_ex(ck, &o, out, err);
}

kiln_status kiln_import(const kiln_checkpoint *ck, kiln_graph **out, kiln_error *err) {
    return kiln_import_dtype(ck, KILN_DTYPE_COUNT_, out, err);
}
