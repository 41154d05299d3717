/*
 * kiln_ops.h — the vocabulary shared by the IR (ir/), the plan in the engine
 * file (codegen/ writes it, runtime/ reads it) and the executors: data types,
 * op kinds and op attributes.
 *
 * Both enums are append-only: their values are stored in engine files.
 */
#ifndef KILN_OPS_H
#define KILN_OPS_H

#include <stdbool.h>
#include <stdint.h>

#define KILN_MAX_DIMS 4
#define KILN_MAX_OP_IN 10
#define KILN_MAX_OP_OUT 3
#define KILN_MAX_RANKS 64 /* tensor-parallel ranks an engine may have */

/* Symbolic dimensions (negative values in a shape). */
#define KILN_DIM_BATCH (-1)
#define KILN_DIM_SEQ (-2)

typedef enum kiln_dtype {
    KILN_DTYPE_F32 = 0,
    KILN_DTYPE_F16 = 1,
    KILN_DTYPE_BF16 = 2,
    KILN_DTYPE_I32 = 3,
    /* Quantized matrices [N, K] (weights only; common/quant.c). Bytes: the data, row-major, then at
     * the next 16-byte boundary the f32 scales (and for q4, the f32 group minimums after them):
     *   q8       int8, symmetric, one scale per row:  w = q * scale[n]
     *   q4gG     4 bits (two per byte, the low nibble first), asymmetric in groups of G columns:
     *            w = q * scale[n][g] + min[n][g], q in 0..15
     *   fp8      (dtype 9) one OCP FP8 E4M3 ("e4m3fn") code per element, one scale per row:
     *            w = e4m3(q) * scale[n] (q8's layout with another code) */
    KILN_DTYPE_Q8 = 4,
    KILN_DTYPE_Q4G32 = 5,
    KILN_DTYPE_Q4G64 = 6,
    KILN_DTYPE_Q4G128 = 7,
    /* Read from checkpoints only (compressed-tensors' weight_shape), never in an engine. */
    KILN_DTYPE_I64 = 8,
    KILN_DTYPE_FP8 = 9,
    /* Read from checkpoints only (the E4M3 codes of an FP8 checkpoint's projections, one byte an
     * element: safetensors F8_E4M3), never in an engine: they become fp8 weights (kiln_qsrc). */
    KILN_DTYPE_F8E4M3 = 10,
    /* fp8g128 (dtype 11): FP8 E4M3 codes as fp8, with one f32 scale per row and group of 128 columns
     * (the last group the rest of the row when 128 does not divide K), [N, ceil(K/128)] after the codes
     * (q4g128's scales, no minimums): w = e4m3(q) * scale[n][k / 128]. What block-FP8 checkpoints
     * (weight_block_size [bn, 128]) are read into, exactly. */
    KILN_DTYPE_FP8G128 = 11,
    KILN_DTYPE_COUNT_
} kiln_dtype;

const char *kiln_dtype_name(kiln_dtype t);        /* "f32", "f16", "bf16", "i32", "q8", "q4g128"... */
int kiln_dtype_size(kiln_dtype t);                /* bytes per element (0 for quantized: kiln_weight_nbytes) */
int kiln_dtype_from_name(const char *name);       /* -1 when unknown */
/* Quantized formats (common/quant.c). */
int kiln_dtype_is_quant(int t);                   /* q8, q4g*, fp8, fp8g128 */
int kiln_quant_bits(int t);                       /* bits a code: 4 (q4g*) or 8 (q8, fp8, fp8g128); 0 if not quantized */
int kiln_quant_is_fp8(int t);                     /* fp8 or fp8g128: E4M3 codes */
/* Whether a matrix of dtype t takes its one-token GEMV on the CUDA-core kernel whose block's warps split
 * K and share x (kernels/gemv.cuh kiln_gemv_ck; module variant ".ck"): q4g* and fp8, the measured faster
 * there (docs/quantization.md; q8 and fp8g128 keep kiln_gemv_ccq, ".cc"). Codegen emits that kernel and
 * the pass fold-norm-into-ck-gemv folds norms into it, both by this. */
int kiln_quant_gemv_ck(int t);
/* FP8 E4M3 ("e4m3fn": 1 sign, 4 exponent bits with bias 7, 3 mantissa bits, no infinities, 0x7F and
 * 0xFF NaN, largest finite 448, subnormals down to 2^-9). kiln_e4m3_to_f32 is exact (NaN for the two
 * NaN codes); kiln_f32_to_e4m3 rounds to nearest even and saturates finite values past 448 to
 * +-448 (a NaN gives 0x7F; callers refuse NaN and infinities first). */
float kiln_e4m3_to_f32(uint8_t c);
uint8_t kiln_f32_to_e4m3(float x);
/* W8A8's per-token activations (the GPU's kiln_act_fp8 and kiln_act_fp8g, dequant.cuh, compute the
 * same): per group of `group` columns (0 = the whole row; the last group the rest), amax = max |x[j]|
 * over it, its scale amax / 448 and codes[j] = kiln_f32_to_e4m3(x[j] * (448 / amax)); a group of
 * zeros gets scale 0 and zero codes. scales gets one value a group, in order. */
void kiln_act_fp8_row(const float *x, int64_t k, int group, uint8_t *codes, float *scales);
/* The KV cache's 8-bit codes (attention +kv_fp8, +kv_int8): x / scale (one IEEE division) as E4M3
 * (kiln_f32_to_e4m3: nearest even, saturated at 448) or as int8 (nearest even, clamped to [-127, 127]);
 * and a code's value times its scale. The CPU executor stores k and v this way and the GPU kernels
 * compute the same codes (kernels/common.cuh, kiln_kv_code8). */
uint8_t kiln_kv_code(float x, float scale, bool int8);
float kiln_kv_value(uint8_t code, float scale, bool int8);
/* A KV head's scale from the largest |x| calibration saw there (amax > 0, finite): fp8 amax / 224, so
 * values up to twice what calibration saw keep E4M3's relative precision (it is a float format: the
 * headroom costs range at the bottom only, 2^-15 of amax and below); int8 amax / 127. Either way
 * rounded up to a bf16 value (kiln_kv_scale_bf16: the GPU holds the scales as bf16 vectors, so both
 * executors then use the same number). */
float kiln_kv_scale_for(float amax, bool int8);
float kiln_kv_scale_bf16(float s);
int kiln_quant_group(int t);                      /* columns per scale: 0 = the whole row (q8, fp8) */
/* Scales per row of a [n, k] weight of dtype t: k / G for q4gG, ceil(k / 128) for fp8g128 (its last
 * group holds the rest of the row), 1 for q8 and fp8. */
int64_t kiln_quant_groups(int t, int64_t k);
/* Where a quantized [n, k] weight's f32 scales start (bytes from its first), and where q4's f32
 * group minimums start, right after the scales (0 for q8, which has none). */
uint64_t kiln_quant_scales_offset(int t, int64_t n, int64_t k);
uint64_t kiln_quant_mins_offset(int t, int64_t n, int64_t k);
/* Bytes a weight of dtype t and this shape takes (the quantized layout above included); 0 when
 * the shape cannot have that dtype (a quantized weight is [N, K] with K a multiple of its group,
 * and even for q4). */
uint64_t kiln_weight_nbytes(int t, int ndim, const int64_t *shape);
/* Quantize row `row` of a [N, K] matrix (the K floats at `w`) into its place in `out`, the
 * weight's bytes (kiln_weight_nbytes), round to nearest: q8 scale = max|w| / 127, q4 per group
 * scale = (max - min) / 15 with min its minimum, fp8 scale = max|w| / 448 and code
 * kiln_f32_to_e4m3(w / scale). */
void kiln_quant_row(int t, int64_t n_rows, int64_t k, int64_t row, const float *w, uint8_t *out);
/* How a q4 group's range is chosen: its minimum and maximum (round to nearest, RTN), or the range,
 * among those with each end moved in by 0..20% in steps of 4%, whose codes have the least squared
 * error (MSE; q8 is RTN either way). */
enum { KILN_QUANT_RTN = 0, KILN_QUANT_MSE = 1 };
void kiln_quant_row_ex(int t, int64_t n_rows, int64_t k, int64_t row, const float *w, uint8_t *out, int method);
/* Rows [r0, r0 + count) of a quantized [N, K] weight (`data`: its bytes) as floats into out. */
void kiln_dequant_rows(int t, const uint8_t *data, int64_t n_rows, int64_t k, int64_t r0, int64_t count, float *out);

/* A matrix that comes quantized from a published checkpoint (AWQ, GPTQ or compressed-tensors 4-bit
 * groups; FP8 E4M3), as kiln_value.qsrc carries it from the importer to the writer, which repacks it
 * into q4gG (G = group) or fp8 without rounding anything again. The matrix kiln stores is [n, k] (n
 * output rows, k input columns). The 4-bit checkpoints' tensors are int32 words of 8 nibbles (bits
 * 4i..4i+3 = nibble i), little-endian:
 *   AWQ (AutoAWQ "gemm"): qweight [k, n/8], nibble i of word [c, j] = column c, row 8j + AWQ's
 *     order[i] (order = 0, 2, 4, 6, 1, 3, 5, 7); qzeros [k/G, n/8] packed the same way;
 *     scales [k/G, n];
 *   GPTQ: qweight [k/8, n], nibble i of word [j, r] = column 8j + i, row r; qzeros [k/G, n/8],
 *     nibble i of word [g, j] = row 8j + i (v1 checkpoints store each zero minus 1: zero_offset 1);
 *     scales [k/G, n];
 *   compressed-tensors ("pack-quantized", int4): weight_packed [n, k/8], nibble i of word [r, j] =
 *     row r, column 8j + i, stored as the signed code + 8; weight_zero_point (asymmetric) [n/8,
 *     k/G], nibble i of word [j, g] = row 8j + i, the signed zero + 8 (qzeros NULL: symmetric,
 *     zero 0, i.e. 8 in stored terms); weight_scale [n, k/G];
 *   all: scales f16 or bf16; the value is (q - z) * s with q and z the nibbles as defined above
 *   (compressed-tensors' +8 offsets cancel).
 * FP8 checkpoints (quant_method "fp8" per tensor; compressed-tensors "float-quantized", strategy
 * tensor or channel): qweight is the weight itself, [n, k] E4M3 codes (safetensors F8_E4M3), one
 * byte each, row-major; scales one f32, f16 or bf16 value for the tensor (fp8_row_scales false) or
 * one per row, [n, 1] (true); the value is e4m3(q) * s, exactly kiln's fp8 (one scale per row). The
 * importer has checked every scale (finite, > 0); the writer checks the codes (no NaN). */
typedef enum kiln_qsrc_format {
    KILN_QSRC_NONE = 0,
    KILN_QSRC_AWQ = 1,
    KILN_QSRC_GPTQ = 2,
    KILN_QSRC_CT = 3,     /* compressed-tensors pack-quantized */
    KILN_QSRC_FP8 = 4,    /* quant_method "fp8", one scale per tensor (AutoFP8, vLLM, transformers) */
    KILN_QSRC_CT_FP8 = 5, /* compressed-tensors float-quantized, one scale per tensor or per row */
    KILN_QSRC_FP8_BLOCK = 6, /* quant_method "fp8" with weight_block_size: one scale per block */
} kiln_qsrc_format;
typedef struct kiln_qsrc {
    kiln_qsrc_format format;
    int zero_offset;                        /* added to each stored zero: 1 for GPTQ v1, else 0 */
    const uint8_t *qweight, *qzeros, *scales; /* the checkpoint's bytes (owned by the front end) */
    kiln_dtype scales_dtype;                /* KILN_DTYPE_F16 or _BF16; FP8: also _F32 */
    int fp8_row_scales;                     /* FP8: 1 = one scale per row, 0 = one for the tensor */
    int block_n, block_k;                   /* FP8_BLOCK: rows and columns a scale covers (k: 128) */
    /* GPTQ act-order: column j of kiln's matrix is the checkpoint's column col_perm[j], the columns sorted
     * by their g_idx group (stably), each group exactly G of them, so group j / G is the checkpoint's
     * group j / G; NULL = the checkpoint's order. Owned by the graph (the permute op's weight). */
    const int32_t *col_perm;
} kiln_qsrc;
/* Whether `s` is an FP8 checkpoint's matrix (E4M3 codes, repacked by kiln_quant_repack_fp8_row), not a
 * 4-bit one (kiln_quant_repack_row) or none. */
int kiln_qsrc_is_fp8(const kiln_qsrc *s);
/* The flat index into the scales of `s` (layouts above) of row `row`, group `gi` of its [n, k]
 * matrix, grouped by G columns (FP8: 0, or the row with per-row scales; block FP8: the block's). */
int64_t kiln_qsrc_scale_index(const kiln_qsrc *s, int64_t n, int64_t k, int g, int64_t row, int64_t gi);
/* Row `row` of the [n, k] matrix `s` holds into row `dst_row` of a q4gG weight of dst_rows rows
 * at `out` (t = KILN_DTYPE_Q4G<G>, G the checkpoint's group): codes as they are, scale s, minimum
 * -z * s, so code * scale + minimum is (q - z) * s exactly in f32. Returns -1, or the flat index
 * into the scales (kiln_qsrc_scale_index) of the first NaN or infinite scale of the row (nothing
 * sensible is then written for that group). */
int64_t kiln_quant_repack_row(const kiln_qsrc *s, int t, int64_t n, int64_t k, int64_t row, int64_t dst_rows,
                              int64_t dst_row, uint8_t *out);
/* Row `row` of the FP8 checkpoint matrix `s` (KILN_QSRC_FP8 / _CT_FP8, [n, k]) into row `dst_row` of
 * an fp8 weight of dst_rows rows at `out`: the k codes copied, the row's scale (the tensor's or the
 * row's, converted to f32 exactly) as its f32 scale, so every value is the checkpoint's exactly.
 * A block-FP8 matrix (KILN_QSRC_FP8_BLOCK: scales [ceil(n / block_n), ceil(k / 128)], row-major) goes into
 * an fp8g128 weight instead: the codes copied, each group's scale that of its block.
 * Returns -1, or the column of the row's first NaN code (0x7F or 0xFF; the row is then not used). */
int64_t kiln_quant_repack_fp8_row(const kiln_qsrc *s, int64_t k, int64_t row, int64_t dst_rows, int64_t dst_row,
                                  uint8_t *out);
/* The f32 value of scale i (flat) of a checkpoint's scales of dtype dt (F32, F16 or BF16; exact). */
float kiln_qsrc_scale_f32(const uint8_t *scales, kiln_dtype dt, int64_t i);

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
    KILN_OP_QKV_ROPE = 10,      /* in: x, Wq, Wk, Wv, positions [, bq, bk, bv] [, q_norm, k_norm]
                                   out: rope(xWq^T), rope(xWk^T), xWv^T; with +qkv_bias each projection adds
                                   its bias, with +qk_norm each head of q and k is RMS-normalised (eps) and
                                   scaled by q_norm / k_norm [hd] before RoPE (Qwen2, Qwen3) */
    KILN_OP_GATE_UP_SWIGLU = 11,/* in: x, Wgate, Wup          out: silu(x Wgate^T) * (x Wup^T) */
    KILN_OP_LINEAR_ADD = 12,    /* in: x[B,S,K], W[N,K], r[B,S,N]   out: r + x W^T (the residual add folded
                                   into the projection: o_proj, down_proj) */
    /* ops over weights a pass packed into their final layout (pack-weights) */
    KILN_OP_QKV_ROPE_PACKED = 13,     /* in: x, Wqkv [(Hq+2Hkv)*hd, K] = [Wq; Wk; Wv], positions
                                         [, bqkv [(Hq+2Hkv)*hd] = [bq; bk; bv]] [, q_norm, k_norm]
                                         out: as qkv_rope */
    KILN_OP_GATE_UP_SWIGLU_PACKED = 14, /* in: x, Wgu [2F, K], row 2f = gate_f, row 2f+1 = up_f
                                           out: as gate_up_swiglu */
    KILN_OP_HEAD_RMSNORM = 15,  /* in: x[B,S,heads*hd], w[hd]   out: each head's hd values RMS-normalised and
                                   scaled by w (attrs n_heads, head_dim, eps): Qwen3's q_norm / k_norm */
    KILN_OP_BIAS_ADD = 16,      /* in: x[B,S,N], b[N]          out: x + b on every row (Qwen2's q/k/v biases) */
    KILN_OP_MOE = 17,           /* in: x[B,S,H], router[E,H], Wgu[E,2F,H] (expert e: F gate rows, then F up
                                   rows), Wdown[E,H,F]   out: y[B,S,H]; per token: p = softmax(x router^T) in
                                   f32, the top_k experts by p (ties in torch.topk's order), their p
                                   renormalised to sum 1 (unless flag MOE_NO_RENORM), y = sum over them
                                   (in expert order) of p_e * Wdown_e (silu(Wgate_e x) * (Wup_e x)) (attrs
                                   n_experts, top_k, layer, flags): Mixtral's and Qwen3-MoE's sparse MoE
                                   block */
    /* tensor parallelism (pass tensor-parallel, --tp N): one plan that every rank runs on its own shards */
    KILN_OP_ALL_REDUCE = 18,    /* in: x[B,S,W] (this rank's partial sum)   out: the sum of x over all `ranks` ranks,
                                   the same on every rank (after o_proj, down_proj and the vocab-parallel embedding) */
    KILN_OP_ALL_GATHER = 19,    /* in: x[B,S,W]   out: [B,S,W*ranks], rank r's x at columns r*W .. (r+1)*W-1, the
                                   same on every rank (the vocab-parallel LM head's logits) */
    /* act-order GPTQ (desc_act with a permuting g_idx): the importer sorts a projection's input columns by
     * group, so its matrix reads its input in that order */
    KILN_OP_PERMUTE = 20,       /* in: x[B,S,K], perm[K] i32 (a permutation of 0..K-1)   out: y[B,S,K],
                                   y[..., j] = x[..., perm[j]] */
    KILN_OP_COUNT_
} kiln_op_kind;

const char *kiln_op_name(kiln_op_kind k);  /* "embedding", "rmsnorm"... */
/* The inputs that output `out` of op kind k may overwrite in place, a bit per input index (0: none):
 * add_rmsnorm's sum over either addend, linear_add's y over its residual r, all_reduce's sum over this
 * rank's part. Memory planning (passes/plan_memory.c) gives such an output the slot of one of these
 * inputs when that input has no later reader, the plan reader allows an output to share a slot with
 * an input only so, and both executors compute these outputs element by element, each element after
 * reading the inputs' elements at its index. */
uint32_t kiln_op_inplace(kiln_op_kind k, int out);
/* Whether output `out` of an op of kind k over inputs in[0 .. n_in) may overwrite value v in place: v is
 * one of the inputs, and at no index kiln_op_inplace leaves out (the rule memory planning applies and the
 * plan reader checks; whether v has a later reader is theirs to know). */
bool kiln_op_inplace_over(kiln_op_kind k, int out, const int32_t *in, int n_in, int32_t v);
/* The name `--dump-ir` and `kiln inspect` give lowering flag `bit` (one KILN_FLAG_* bit): "decode_rope",
 * "act_fp8"...; NULL for a bit that is no flag. */
const char *kiln_flag_name(uint32_t bit);
/* How many matrices projection op kind k multiplies its input by (its inputs 1..n: 3 for qkv_rope, 2 for
 * gate_up_swiglu, 1 for linear, linear_add, lm_head and the packed ops); 0 for an op that is no
 * projection. */
int kiln_op_matrices(kiln_op_kind k);
/* The lowering flags (KILN_FLAG_*) an op of kind k may carry: the plan reader and the IR verifier
 * refuse any other. */
uint32_t kiln_op_flags_allowed(kiln_op_kind k);
int kiln_op_from_name(const char *name);   /* -1 when unknown */

typedef enum kiln_rope_scaling {
    KILN_ROPE_SCALING_NONE = 0,
    KILN_ROPE_SCALING_LLAMA3 = 1,
} kiln_rope_scaling;

/* Lowering decisions passes record on an op (kiln_op_attrs.flags); the
 * executor does what they say and decides nothing of the kind itself. */
enum {
    /* attention: when every sequence of a step adds one token, the attention
     * kernel rotates q and the new k itself and writes k, v into the KV cache
     * (its qkv_rope's rope kernel is skipped): pass decode-attention-rope */
    KILN_FLAG_DECODE_ROPE = 1u << 0,
    /* attention, at decode: the last split block of each head merges the
     * splits (no combine kernel): pass decode-attention-merge */
    KILN_FLAG_MERGE_SPLITS = 1u << 1,
    /* rmsnorm whose output only the next projection reads: at decode, that
     * projection's GEMV normalises its input itself: pass fold-norm-into-gemv */
    KILN_FLAG_FOLD_INTO_GEMV = 1u << 2,
    /* qkv_rope, qkv_rope_packed: which optional inputs the op carries (its structure, not a
     * lowering choice): the q/k/v biases, and the per-head q/k RMSNorm weights (eps in attrs.eps) */
    KILN_FLAG_QKV_BIAS = 1u << 3,
    KILN_FLAG_QK_NORM = 1u << 4,
    /* moe: the top_k probabilities weight the experts as they are, not renormalised to sum 1 (the op's
     * structure, from config.json: Qwen3-MoE's norm_topk_prob false) */
    KILN_FLAG_MOE_NO_RENORM = 1u << 5,
    /* attention: the layer's KV cache holds 8-bit codes, FP8 E4M3 or int8 (pass quantize-kv, --kv-dtype),
     * each K and V element code = round(x / scale[kv head]) (saturated: E4M3 at +-448, int8 at +-127),
     * read back as code * scale; the op then takes a fifth input, kv_scale [2 * n_kv_heads] f32: the K
     * scales of the kv heads, then the V scales (kiln_kv_code, kiln_kv_value in common/kiln_ops.h) */
    KILN_FLAG_KV_FP8 = 1u << 6,
    KILN_FLAG_KV_INT8 = 1u << 7,
    /* rmsnorm, with KILN_FLAG_FOLD_INTO_GEMV: the fold applies only to steps of one token (the next
     * projection's one-row GEMV; longer steps run the norm kernel): pass fold-norm-into-ck-gemv */
    KILN_FLAG_FOLD_ONE_TOKEN = 1u << 8,
    /* a projection (linear, linear_add, qkv_rope(_packed), gate_up_swiglu(_packed), lm_head) whose matrices
     * are all fp8 or fp8g128: steps of more than KILN_QGEMV_MAX_ROWS rows quantize its input to E4M3, a
     * scale per token (per 128 columns for fp8g128; kiln_act_fp8_row), and multiply the codes (W8A8);
     * shorter steps read the input as it is: pass w8a8. Both executors do so. */
    KILN_FLAG_ACT_FP8 = 1u << 9,
    /* gate_up_swiglu(_packed) or rmsnorm whose output is read only by the next op, a +act_fp8 projection
     * over fp8 (per-row) matrices: at the steps where that projection runs W8A8, the op writes the E4M3
     * codes and per-token scales the projection would make of its bf16 output instead of that output:
     * passes swiglu-out-fp8 and norm-out-fp8. The GPU executor does so; the CPU's f32 values quantize at
     * the projection, the same codes up to the values' rounding. */
    KILN_FLAG_OUT_FP8 = 1u << 10,
    /* a +act_fp8 projection over fp8 (per-row) matrices: its W8A8 GEMMs on the GPU use FP8 fast
     * accumulation (cuBLASLt's CUBLASLT_MATMUL_DESC_FAST_ACCUM: the tensor cores' partial sums are not
     * promoted to fp32 along K; faster, a little less exact: docs/quantization.md): pass
     * w8a8-fast-accum. Without it they promote. The CPU executor accumulates in f32 either way. */
    KILN_FLAG_FP8_FAST = 1u << 11,
    /* rmsnorm, add_rmsnorm: the normalised output y comes out in the order of a last input, perm [H] i32 (a
     * permutation of 0..H-1): y[..., j] = the norm's value at perm[j] (add_rmsnorm's sum keeps its order):
     * pass fold-permute-into-norm, from the permute an act-order GPTQ projection's input needs. Both
     * executors do so. */
    KILN_FLAG_OUT_PERM = 1u << 12,
    KILN_FLAG_ALL_ = (1u << 13) - 1
};

/* The most rows a step multiplies through the quantized GEMV by default (the GPU executor's qgemv_max_m,
 * which an engine's tuning record or a measurement knob can change); a longer step over a +act_fp8
 * projection runs W8A8, on both executors. */
#define KILN_QGEMV_MAX_ROWS 32

/* The KV cache an attention op's flags give it: 1 FP8 E4M3 codes (+kv_fp8), 2 int8 codes (+kv_int8), 0 the
 * element type; the kernels' KILN_KV8 and what their modules' cfg records (format/kiln_ksec.h). */
static inline int kiln_kv8_of(uint32_t flags) {
    return flags & KILN_FLAG_KV_FP8 ? 1 : flags & KILN_FLAG_KV_INT8 ? 2 : 0;
}

/* Attributes of an op; each kind reads the fields its comment above names. */
typedef struct kiln_op_attrs {
    int32_t layer;          /* attention, qkv_rope: which layer's KV cache; moe: its layer (for traces) */
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
    uint32_t flags;             /* KILN_FLAG_* lowering decisions (attention, rmsnorm), optional inputs
                                   (qkv_rope), routing (moe) */
    int32_t n_experts;          /* moe: experts of the layer (E) */
    int32_t top_k;              /* moe: experts each token is routed to */
    int32_t ranks;              /* tensor parallelism, 0 = none: all_reduce, all_gather (ranks taking part);
                                   embedding (vocab-parallel: the table holds rank r's vocab_size/ranks rows,
                                   ids r*rows .. (r+1)*rows-1; ids outside give zero rows) */
} kiln_op_attrs;

/* Attribute keys: how kiln_op_attrs are stored in a plan (append-only: stored in engine files). */
enum {
    KILN_ATTR_LAYER = 1,
    KILN_ATTR_N_HEADS = 2,
    KILN_ATTR_N_KV_HEADS = 3,
    KILN_ATTR_HEAD_DIM = 4,
    KILN_ATTR_WINDOW = 5,
    KILN_ATTR_ROPE_SCALING = 6,
    KILN_ATTR_EPS = 7,               /* f32 bits */
    KILN_ATTR_ROPE_THETA = 8,        /* f32 bits */
    KILN_ATTR_ROPE_FACTOR = 9,       /* f32 bits */
    KILN_ATTR_ROPE_LOW_FREQ = 10,    /* f32 bits */
    KILN_ATTR_ROPE_HIGH_FREQ = 11,   /* f32 bits */
    KILN_ATTR_ROPE_ORIG_MAX_POS = 12, /* f32 bits */
    KILN_ATTR_FLAGS = 13,            /* KILN_FLAG_* bits */
    KILN_ATTR_N_EXPERTS = 14,
    KILN_ATTR_TOP_K = 15,
    KILN_ATTR_RANKS = 16,            /* tensor-parallel ranks (all_reduce, all_gather, embedding) */
    KILN_ATTR_COUNT_
};

/* The attributes of `a` as (key, value bits) pairs, keys ascending, zero values left out: the one
 * encoding the plan writer and reader share. Returns the count (< KILN_ATTR_COUNT_). */
int kiln_op_attrs_encode(const kiln_op_attrs *a, uint32_t keys[KILN_ATTR_COUNT_], uint32_t vals[KILN_ATTR_COUNT_]);
/* Set attribute `key` of *a from its stored bits; 0 when the key is unknown, else 1. */
int kiln_op_attr_set(kiln_op_attrs *a, uint32_t key, uint32_t val);

/* Number of outputs an op kind has, and the input count it takes (-1: unknown kind); an op of
 * that kind with attributes `a` takes kiln_op_n_in_with (the optional inputs its flags name). These,
 * kiln_op_name, kiln_op_matrices, kiln_op_flags_allowed and kiln_op_inplace read one table, a row per
 * op kind (common/ops.c). */
int kiln_op_n_out(kiln_op_kind k);
int kiln_op_n_in(kiln_op_kind k);
/* The input of an op of kind k with these flags that is an i32 order of its row (a permutation the
 * engine's loader checks): permute's perm (1), an +out_perm rmsnorm's (2) or add_rmsnorm's (3); -1 for none. */
int kiln_op_order_input(kiln_op_kind k, uint32_t flags);
int kiln_op_n_in_with(kiln_op_kind k, const kiln_op_attrs *a);

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
