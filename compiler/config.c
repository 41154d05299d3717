/*
 * config.c — HuggingFace config.json → kiln_model_config (Llama, Mistral, Qwen2, Qwen3, Mixtral, Qwen3-MoE).
 *
 * The file is hostile input: every field is checked for its JSON type (an
 * integer field holding 4096.0 is refused, not rounded), for range (sizes are
 * positive and capped so later products cannot overflow), and for values kiln
 * cannot run (another activation, biases, rope types other than default and
 * llama3). Each message names the file, the field and the value at fault.
 *
 * Two spellings of the same facts exist in the wild and both are read:
 *   transformers 4.x: top-level "rope_theta", "rope_scaling": {...}, "torch_dtype"
 *   transformers 5.x: "rope_parameters": {"rope_type", "rope_theta", ...}, "dtype"
 * Precedence follows transformers 5 (modeling_rope_utils.convert_rope_params_to_dict):
 * a non-null "rope_scaling" wins over "rope_parameters"; the rope dict's own
 * "rope_theta" wins over the top-level one; with neither, theta is 10000 (the
 * transformers default). llama3's original_max_position_embeddings defaults
 * to max_position_embeddings, as there.
 *
 * Defaults the header documents (absent or null): num_key_value_heads = heads,
 * head_dim = hidden / heads, sliding_window = 0, bos = -1, no eos,
 * tie_word_embeddings = false, dtype = F32.
 * sliding_window is honoured for Mistral and Mixtral (every layer) and Qwen2/Qwen3 (the
 * layers layer_types names "sliding_attention", or without layer_types those
 * from max_window_layers on, and only with use_sliding_window: transformers
 * drops the window otherwise); transformers' Llama attention ignores it, so a
 * Llama config's value is checked and then dropped.
 *
 * Mixtral: num_local_experts (transformers 5 also reads the alias
 * "num_experts"; both given and different is refused) and
 * num_experts_per_tok, with HF's defaults 8 and 2; top-k above the expert
 * count is refused. router_jitter_noise (training only) and
 * output_router_logits (an extra output) change nothing at inference and are
 * type-checked only. Its default rope theta is 1e6 (MixtralConfig's
 * default_theta), not 10000.
 *
 * quantization_config (a published quantized checkpoint) is read for 4-bit
 * AWQ (version gemm, zero_point true), GPTQ (checkpoint_format or
 * GPTQModel's format gptq / gptq_v2, sym, desc_act) and compressed-tensors
 * (format pack-quantized, int weights, strategy group, symmetric or not,
 * no quantized activations; cfg_quant_ct) with groups of 32, 64 or 128
 * (cfg_quant; docs/quantization.md), and for FP8 E4M3 weights with one scale
 * per tensor or per block of [bn, 128] (quant_method fp8 without or with
 * weight_block_size, activation_scheme dynamic or static; cfg_quant_fp8) or per tensor or channel
 * (compressed-tensors float-quantized, symmetric, FP8 or no input
 * activations; cfg_quant_ct_fp8); any other method, version, format, bit
 * width, group or block, a quantized lm_head, GPTQ dynamic rules past
 * cfg_gptq_dynamic's (its per-module overrides are read), a KV
 * cache scheme, and quantized MoE checkpoints are refused naming the field.
 * Static FP8 input scales are read (and checked by the importer) but not
 * applied: kiln's fp8 is weight-only, activations stay in the engine's dtype.
 *
 * Qwen3-MoE reads the same two expert counts (4.x configs write
 * "num_experts", transformers 5 writes "num_local_experts": its
 * attribute_map makes them one setting), with Qwen3MoeConfig's defaults:
 * 128 experts, top 8, moe_intermediate_size 768 (each expert's width;
 * intermediate_size is the dense layers'), norm_topk_prob false (the
 * published models set it true), decoder_sparse_step 1, mlp_only_layers [].
 * Layer l is sparse unless it is in mlp_only_layers or (l + 1) is not a
 * multiple of decoder_sparse_step, as Qwen3MoeDecoderLayer decides; the
 * others keep a dense SwiGLU MLP. router_aux_loss_coef and
 * output_router_logits (training) are type-checked only. Its sliding window,
 * with use_sliding_window, covers every layer (transformers 5: one mask for
 * all layers); transformers 4's flash path windowed only the layers from
 * max_window_layers on while its eager mask windowed all, so a config that
 * turns the window on and names a max_window_layers other than 0 is refused
 * rather than guessed (published Qwen3-MoE configs have the window off), as is
 * a layer_types (which transformers does not read for it) that disagrees.
 */
#include "kiln_compiler.h"

#include <inttypes.h>
#include <jansson.h>
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

/* Caps on sizes: far above any real model, low enough that products of two
 * or three of them fit comfortably in 64 bits. */
#define CFG_MAX_HIDDEN 65536
#define CFG_MAX_LAYERS KILN_MAX_LAYERS
#define CFG_MAX_HEADS 1024
#define CFG_MAX_HEAD_DIM 1024
#define CFG_MAX_FFN (1 << 20)
#define CFG_MAX_VOCAB (1 << 24)
#define CFG_MAX_CONTEXT (1 << 24)
#define CFG_MAX_FILE (16u << 20) /* config.json files are a few KiB */
#define CFG_MAX_EXPERTS 512      /* KILN_MAX_PACK: two parts (gate, up) per expert */

#define CFG_DEFAULT_THETA 10000.0
#define CFG_DEFAULT_THETA_MIXTRAL 1000000.0

/* Parsing context: the file name for messages and where errors go. */
typedef struct cfg_ctx {
    const char *path;
    kiln_error *err;
} cfg_ctx;

/* "an integer", "a string"... for type errors. */
static const char *json_kind(const json_t *v) {
    switch (json_typeof(v)) {
    case JSON_OBJECT: return "an object";
    case JSON_ARRAY: return "an array";
    case JSON_STRING: return "a string";
    case JSON_INTEGER: return "an integer";
    case JSON_REAL: return "a real number";
    case JSON_TRUE:
    case JSON_FALSE: return "a boolean";
    case JSON_NULL: return "null";
    }
    return "?";
}

/* Compact JSON text of a value for messages, truncated to fit `buf`. */
static const char *json_show(const json_t *v, char *buf, size_t n) {
    char *s = json_dumps(v, JSON_ENCODE_ANY | JSON_COMPACT | JSON_REAL_PRECISION(10));
    if (!s) {
        snprintf(buf, n, "(%s)", json_kind(v));
        return buf;
    }
    if (strlen(s) < n) {
        memcpy(buf, s, strlen(s) + 1);
    } else {
        memcpy(buf, s, n - 4);
        memcpy(buf + n - 4, "...", 4);
    }
    free(s);
    return buf;
}

/* A field absent or null counts as "not given" everywhere in config.json. */
static json_t *cfg_get(json_t *obj, const char *key) {
    json_t *v = json_object_get(obj, key);
    return json_is_null(v) ? NULL : v;
}

static kiln_status cfg_type_err(cfg_ctx *c, const char *field, const json_t *v, const char *want) {
    char shown[96];
    return kiln_err(c->err, KILN_ERR_PARSE, "%s: field \"%s\" is %s (%s); it must be %s", c->path, field,
                    json_show(v, shown, sizeof shown), json_kind(v), want);
}

static kiln_status cfg_missing(cfg_ctx *c, const char *field) {
    kiln_err(c->err, KILN_ERR_MISSING, "%s: required field \"%s\" is missing", c->path, field);
    return kiln_err_hint(c->err, "a HuggingFace config.json for this architecture always carries \"%s\"; "
                                 "is this the right file?", field);
}

/* Integer field `key` of `obj` (`field` is its full name for messages).
 * Absent/null: MISSING when required, else *out = def. In range [lo, hi]:
 * below lo is malformed (PARSE), above hi is beyond kiln (UNSUPPORTED). */
static kiln_status cfg_int(cfg_ctx *c, json_t *obj, const char *key, const char *field, bool required,
                           int64_t def, int64_t lo, int64_t hi, int64_t *out) {
    json_t *v = cfg_get(obj, key);
    if (!v) {
        if (required) return cfg_missing(c, field);
        *out = def;
        return KILN_OK;
    }
    if (!json_is_integer(v)) return cfg_type_err(c, field, v, "an integer");
    json_int_t x = json_integer_value(v);
    if (x < lo)
        return kiln_err(c->err, KILN_ERR_PARSE, "%s: field \"%s\" is %lld; it must be at least %" PRId64, c->path,
                        field, (long long)x, lo);
    if (x > hi)
        return kiln_err(c->err, KILN_ERR_UNSUPPORTED, "%s: field \"%s\" is %lld, above kiln's limit of %" PRId64,
                        c->path, field, (long long)x, hi);
    *out = (int64_t)x;
    return KILN_OK;
}

/* Number field (integer or real in the JSON). Absent/null: MISSING when
 * required, else *out = def. Must be finite and > 0 (every float field of a
 * config — eps, theta, rope factors — is a positive quantity). */
static kiln_status cfg_pos_num(cfg_ctx *c, json_t *obj, const char *key, const char *field, bool required,
                               double def, double *out) {
    json_t *v = cfg_get(obj, key);
    if (!v) {
        if (required) return cfg_missing(c, field);
        *out = def;
        return KILN_OK;
    }
    if (!json_is_number(v)) return cfg_type_err(c, field, v, "a number");
    double x = json_number_value(v);
    if (!isfinite(x) || !(x > 0.0))
        return kiln_err(c->err, KILN_ERR_PARSE, "%s: field \"%s\" is %g; it must be a positive number", c->path,
                        field, x);
    *out = x;
    return KILN_OK;
}

/* Boolean field; absent/null → def. */
static kiln_status cfg_bool(cfg_ctx *c, json_t *obj, const char *key, bool def, bool *out) {
    json_t *v = cfg_get(obj, key);
    if (!v) {
        *out = def;
        return KILN_OK;
    }
    if (!json_is_boolean(v)) return cfg_type_err(c, key, v, "true or false");
    *out = json_is_true(v);
    return KILN_OK;
}

/* String field; absent/null → *out = NULL. */
static kiln_status cfg_str(cfg_ctx *c, json_t *obj, const char *key, const char *field, const char **out) {
    json_t *v = cfg_get(obj, key);
    *out = NULL;
    if (!v) return KILN_OK;
    if (!json_is_string(v)) return cfg_type_err(c, field, v, "a string");
    *out = json_string_value(v);
    return KILN_OK;
}

/* A token id (bos/eos): an integer inside the vocabulary. */
static kiln_status cfg_token_id(cfg_ctx *c, const json_t *v, const char *field, int64_t vocab, int64_t *out) {
    if (!json_is_integer(v)) return cfg_type_err(c, field, v, "an integer token id");
    json_int_t id = json_integer_value(v);
    if (id < 0 || id >= vocab)
        return kiln_err(c->err, KILN_ERR_PARSE, "%s: field \"%s\" is %lld, outside the vocabulary [0, %" PRId64 ")",
                        c->path, field, (long long)id, vocab);
    *out = (int64_t)id;
    return KILN_OK;
}

typedef struct eos_ctx {
    cfg_ctx *c;
    int64_t vocab;
} eos_ctx;

static kiln_status cfg_eos_id(void *ctx, const json_t *v, const char *field, int64_t *out) {
    eos_ctx *e = ctx;
    return cfg_token_id(e->c, v, field, e->vocab, out);
}

kiln_status kiln_json_id_list(const json_t *v, const char *path, const char *key,
                              kiln_status (*id)(void *ctx, const json_t *v, const char *field, int64_t *out),
                              void *ctx, int64_t out[KILN_MAX_EOS], int *n, kiln_error *err) {
    *n = 0;
    if (!json_is_array(v)) {
        kiln_status st = id(ctx, v, key, &out[0]);
        if (st == KILN_OK) *n = 1;
        return st;
    }
    if (json_array_size(v) > KILN_MAX_EOS)
        return kiln_err(err, KILN_ERR_UNSUPPORTED, "%s: field \"%s\" lists %zu ids; kiln keeps at most %d", path, key,
                        json_array_size(v), KILN_MAX_EOS);
    for (size_t i = 0; i < json_array_size(v); i++) {
        char field[64];
        snprintf(field, sizeof field, "%s[%zu]", key, i);
        kiln_status st = id(ctx, json_array_get(v, i), field, &out[*n]);
        if (st != KILN_OK) return st;
        (*n)++;
    }
    return KILN_OK;
}

/* ---- the parts of a config ---- */

static const char *const supported_archs =
    "LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM, MixtralForCausalLM, "
    "Qwen3MoeForCausalLM";

const char *kiln_arch_name(kiln_arch a) {
    switch (a) {
    case KILN_ARCH_MISTRAL: return "MistralForCausalLM";
    case KILN_ARCH_QWEN3: return "Qwen3ForCausalLM";
    case KILN_ARCH_QWEN2: return "Qwen2ForCausalLM";
    case KILN_ARCH_MIXTRAL: return "MixtralForCausalLM";
    case KILN_ARCH_QWEN3_MOE: return "Qwen3MoeForCausalLM";
    default: return "LlamaForCausalLM";
    }
}

static kiln_status cfg_arch(cfg_ctx *c, json_t *root, kiln_arch *out) {
    json_t *a = cfg_get(root, "architectures");
    if (!a) {
        /* Some hand-made configs carry only model_type. */
        const char *mt = NULL;
        kiln_status st = cfg_str(c, root, "model_type", "model_type", &mt);
        if (st) return st;
        if (mt && strcmp(mt, "llama") == 0) { *out = KILN_ARCH_LLAMA; return KILN_OK; }
        if (mt && strcmp(mt, "mistral") == 0) { *out = KILN_ARCH_MISTRAL; return KILN_OK; }
        if (mt && strcmp(mt, "qwen3") == 0) { *out = KILN_ARCH_QWEN3; return KILN_OK; }
        if (mt && strcmp(mt, "qwen2") == 0) { *out = KILN_ARCH_QWEN2; return KILN_OK; }
        if (mt && strcmp(mt, "mixtral") == 0) { *out = KILN_ARCH_MIXTRAL; return KILN_OK; }
        if (mt && strcmp(mt, "qwen3_moe") == 0) { *out = KILN_ARCH_QWEN3_MOE; return KILN_OK; }
        if (mt)
            return kiln_err(c->err, KILN_ERR_UNSUPPORTED,
                            "%s: no \"architectures\" and model_type \"%s\" is not supported (supported: %s)",
                            c->path, mt, supported_archs);
        kiln_err(c->err, KILN_ERR_MISSING, "%s: field \"architectures\" is missing", c->path);
        return kiln_err_hint(c->err, "add \"architectures\": [\"LlamaForCausalLM\"] (or MistralForCausalLM)");
    }
    if (!json_is_array(a) || json_array_size(a) == 0) return cfg_type_err(c, "architectures", a, "a non-empty array of strings");
    size_t i;
    json_t *e;
    json_array_foreach(a, i, e) {
        if (!json_is_string(e)) return cfg_type_err(c, "architectures", a, "a non-empty array of strings");
    }
    json_array_foreach(a, i, e) {
        const char *s = json_string_value(e);
        if (strcmp(s, "LlamaForCausalLM") == 0) { *out = KILN_ARCH_LLAMA; return KILN_OK; }
        if (strcmp(s, "MistralForCausalLM") == 0) { *out = KILN_ARCH_MISTRAL; return KILN_OK; }
        if (strcmp(s, "Qwen3ForCausalLM") == 0) { *out = KILN_ARCH_QWEN3; return KILN_OK; }
        if (strcmp(s, "Qwen2ForCausalLM") == 0) { *out = KILN_ARCH_QWEN2; return KILN_OK; }
        if (strcmp(s, "MixtralForCausalLM") == 0) { *out = KILN_ARCH_MIXTRAL; return KILN_OK; }
        if (strcmp(s, "Qwen3MoeForCausalLM") == 0) { *out = KILN_ARCH_QWEN3_MOE; return KILN_OK; }
    }
    char shown[128];
    return kiln_err(c->err, KILN_ERR_UNSUPPORTED, "%s: architecture %s is not supported (supported: %s)", c->path,
                    json_show(a, shown, sizeof shown), supported_archs);
}

/* hidden_act, attention_bias, mlp_bias: features kiln's kernels do not have. */
static kiln_status cfg_features(cfg_ctx *c, json_t *root) {
    const char *act = NULL;
    kiln_status st = cfg_str(c, root, "hidden_act", "hidden_act", &act);
    if (st) return st;
    if (act && strcmp(act, "silu") != 0)
        return kiln_err(c->err, KILN_ERR_UNSUPPORTED, "%s: field \"hidden_act\" is \"%s\"; kiln supports only \"silu\"",
                        c->path, act);
    static const char *const biases[] = {"attention_bias", "mlp_bias"};
    for (size_t i = 0; i < 2; i++) {
        bool b = false;
        if ((st = cfg_bool(c, root, biases[i], false, &b))) return st;
        if (b)
            return kiln_err(c->err, KILN_ERR_UNSUPPORTED,
                            "%s: field \"%s\" is true; kiln supports only bias-free linear layers", c->path, biases[i]);
    }
    return KILN_OK;
}

const char *kiln_ckpt_quant_name(const kiln_ckpt_quant *q) {
    switch (q->method) {
    case KILN_CKPT_QUANT_AWQ: return "awq";
    case KILN_CKPT_QUANT_GPTQ: return q->gptq_v2 ? "gptq_v2" : "gptq";
    case KILN_CKPT_QUANT_CT: return "compressed-tensors";
    case KILN_CKPT_QUANT_FP8: return "fp8";
    default: return "none";
    }
}

/* quantization_config.<key> is `shown`, which kiln does not read: UNSUPPORTED naming the field. */
static kiln_status cfg_quant_refuse(cfg_ctx *c, const char *key, const char *shown, const char *why) {
    kiln_err(c->err, KILN_ERR_UNSUPPORTED, "%s: field \"quantization_config.%s\" is %s: %s", c->path, key, shown, why);
    return kiln_err_hint(c->err, "kiln reads 4-bit AWQ (version gemm), GPTQ (gptq, gptq_v2) and compressed-tensors "
                                 "(pack-quantized) checkpoints with groups of 32, 64 or 128, and FP8 E4M3 checkpoints "
                                 "with one scale per tensor (quant_method \"fp8\") or per tensor or channel "
                                 "(compressed-tensors float-quantized) (docs/quantization.md); otherwise compile the "
                                 "model's unquantized checkpoint, with --quant int8, fp8 or int4 for kiln's own "
                                 "quantization");
}

/* A string field of quantization_config, `def` when absent. */
static kiln_status cfg_quant_str(cfg_ctx *c, json_t *qc, const char *key, const char *def, const char **out) {
    char field[64];
    snprintf(field, sizeof field, "quantization_config.%s", key);
    kiln_status st = cfg_str(c, qc, key, field, out);
    if (!st && !*out) *out = def;
    return st;
}

/* A boolean field of quantization_config, `def` when absent. */
static kiln_status cfg_quant_bool(cfg_ctx *c, json_t *qc, const char *key, bool def, bool *out) {
    char field[64];
    snprintf(field, sizeof field, "quantization_config.%s", key);
    json_t *v = cfg_get(qc, key);
    if (v && !json_is_boolean(v)) return cfg_type_err(c, field, v, "true or false");
    *out = v ? json_is_true(v) : def;
    return KILN_OK;
}

/* A compressed-tensors QuantizationArgs object `o` (field `at`): its num_bits (default 8), type and
 * strategy (NULL when absent), each checked for its JSON type with the field named. */
static kiln_status cfg_quant_args(cfg_ctx *c, json_t *o, const char *at, int64_t *bits, const char **type,
                                  const char **strategy) {
    char key[224]; /* `at` (< 160) and a field name */
    snprintf(key, sizeof key, "quantization_config.%s.num_bits", at);
    kiln_status st = cfg_int(c, o, "num_bits", key, false, 8, 1, 64, bits);
    snprintf(key, sizeof key, "quantization_config.%s.type", at);
    if (st || (st = cfg_str(c, o, "type", key, type))) return st;
    snprintf(key, sizeof key, "quantization_config.%s.strategy", at);
    return cfg_str(c, o, "strategy", key, strategy);
}

/* compressed-tensors: the settings a config group's "weights" must have for kiln to read them:
 * int, 4 bits, strategy group (32, 64 or 128), static, no block structure; actorder none, "weight" (alias
 * "static": groups in order) or "group" (alias "dynamic", or true: a weight_g_idx per projection, read as
 * GPTQ's act-order g_idx, q->desc_act).
 * `at` is the group's field name ("config_groups.group_0.weights"). */
static kiln_status cfg_quant_ct_weights(cfg_ctx *c, json_t *w, const char *at, kiln_ckpt_quant *q) {
    char key[224], shown[96]; /* `at` (< 160) and a field name */
    if (!json_is_object(w)) {
        snprintf(key, sizeof key, "quantization_config.%s", at);
        return w ? cfg_type_err(c, key, w, "an object")
                 : cfg_quant_refuse(c, at, "null", "a group that does not quantize its weights is not read");
    }
    int64_t bits, group;
    const char *type, *strategy;
    kiln_status st = cfg_quant_args(c, w, at, &bits, &type, &strategy);
    snprintf(key, sizeof key, "quantization_config.%s.group_size", at);
    if (st || (st = cfg_int(c, w, "group_size", key, false, 0, -1, 1 << 20, &group))) return st;
    snprintf(key, sizeof key, "quantization_config.%s.symmetric", at);
    json_t *sym = cfg_get(w, "symmetric");
    if (sym && !json_is_boolean(sym)) return cfg_type_err(c, key, sym, "true or false");
    q->sym = !sym || json_is_true(sym);
    if (type && strcmp(type, "int") != 0) {
        snprintf(key, sizeof key, "%s.type", at), snprintf(shown, sizeof shown, "\"%.64s\"", type);
        return cfg_quant_refuse(c, key, shown, "float weights (FP8, NVFP4, MXFP4) are not read");
    }
    if (bits != 4) {
        snprintf(key, sizeof key, "%s.num_bits", at), snprintf(shown, sizeof shown, "%lld", (long long)bits);
        return cfg_quant_refuse(c, key, shown, "kiln reads 4-bit checkpoints only");
    }
    /* no strategy with a group size is a group strategy (QuantizationArgs' validator) */
    if (!strategy) strategy = group > 0 ? "group" : "tensor";
    if (strcmp(strategy, "group") != 0) {
        snprintf(key, sizeof key, "%s.strategy", at), snprintf(shown, sizeof shown, "\"%.64s\"", strategy);
        return cfg_quant_refuse(c, key, shown, "only per-group scales (strategy \"group\") are read; per-channel, "
                                               "per-tensor and block scales are not read yet");
    }
    if (group != 32 && group != 64 && group != 128) {
        snprintf(key, sizeof key, "%s.group_size", at), snprintf(shown, sizeof shown, "%lld", (long long)group);
        return cfg_quant_refuse(c, key, shown, "kiln's int4 format has groups of 32, 64 or 128");
    }
    /* dynamic false; actorder none or "weight" (its alias "static"), which leaves the groups in order, or
     * "group" (alias "dynamic", or true), which stores a permuting weight_g_idx */
    static const char *const unread[][2] = {
        {"dynamic", "weights quantized on the fly are not read"},
        {"actorder", "kiln reads act-order \"weight\" (\"static\") and \"group\" (\"dynamic\")"},
        {"block_structure", "block scales are not read yet"},
    };
    q->desc_act = false;
    for (size_t i = 0; i < sizeof unread / sizeof unread[0]; i++) {
        json_t *v = cfg_get(w, unread[i][0]);
        if (!v || json_is_false(v)) continue;
        const char *sv = json_is_string(v) ? json_string_value(v) : "";
        if (i == 1 && (strcmp(sv, "weight") == 0 || strcmp(sv, "static") == 0)) continue;
        if (i == 1 && (json_is_true(v) || strcmp(sv, "group") == 0 || strcmp(sv, "dynamic") == 0)) {
            q->desc_act = true; /* each projection's weight_g_idx (compiler/import.c ct_weight) */
            continue;
        }
        snprintf(key, sizeof key, "%s.%s", at, unread[i][0]);
        return cfg_quant_refuse(c, key, json_show(v, shown, sizeof shown), unread[i][1]);
    }
    q->bits = 4;
    q->group_size = (int)group;
    return KILN_OK;
}

/* A block-FP8 block size `v`, [rows, columns] (quant_method fp8's weight_block_size, compressed-tensors'
 * block_structure; `key` the field under quantization_config): 128 columns (kiln's fp8g128) and 1 to 2^20
 * rows, into *rows; refused naming the field otherwise. */
static kiln_status cfg_fp8_block(cfg_ctx *c, json_t *v, const char *key, int *rows) {
    char full[256], shown[96];
    snprintf(full, sizeof full, "quantization_config.%s", key);
    json_t *bn = json_is_array(v) && json_array_size(v) == 2 ? json_array_get(v, 0) : NULL;
    json_t *bk = bn ? json_array_get(v, 1) : NULL;
    if (!bn || !json_is_integer(bn) || !json_is_integer(bk)) return cfg_type_err(c, full, v, "[rows, columns]");
    if (json_integer_value(bk) != 128 || json_integer_value(bn) < 1 || json_integer_value(bn) > (1 << 20))
        return cfg_quant_refuse(c, key, json_show(v, shown, sizeof shown),
                                "kiln reads block-wise FP8 with blocks of 128 columns (and 1 to 2^20 rows), as "
                                "DeepSeek-V3, Qwen3-FP8 and llm-compressor's FP8_BLOCK write [128, 128]");
    *rows = (int)json_integer_value(bn);
    return KILN_OK;
}

/* The refusal of a compressed-tensors block_structure under another strategy than "block", the field
 * being `key` with value `shown`. */
static kiln_status cfg_quant_refuse_block(cfg_ctx *c, const char *key, const char *shown) {
    return cfg_quant_refuse(c, key, shown, "block-wise FP8 scales are read with strategy \"block\" (block_structure "
                                           "[bn, 128]), not with a block_structure under another strategy");
}

/* compressed-tensors "float-quantized": the settings a group's "weights" must have: FP8 E4M3 (type
 * float, 8 bits), symmetric (no zero point), static, one scale per tensor or per output channel (no
 * group size, blocks or act-order). `at` is the group's weights field name. */
static kiln_status cfg_quant_ct_fp8_weights(cfg_ctx *c, json_t *w, const char *at, kiln_ckpt_quant *q) {
    char key[224], shown[96]; /* `at` (< 160) and a field name */
    if (!json_is_object(w)) {
        snprintf(key, sizeof key, "quantization_config.%s", at);
        return w ? cfg_type_err(c, key, w, "an object")
                 : cfg_quant_refuse(c, at, "null", "a group that does not quantize its weights is not read");
    }
    int64_t bits;
    const char *type, *strategy;
    kiln_status st = cfg_quant_args(c, w, at, &bits, &type, &strategy);
    if (st) return st;
    snprintf(key, sizeof key, "quantization_config.%s.symmetric", at);
    json_t *sym = cfg_get(w, "symmetric");
    if (sym && !json_is_boolean(sym)) return cfg_type_err(c, key, sym, "true or false");
    if (!type || strcmp(type, "float") != 0) { /* QuantizationArgs' default type is int */
        snprintf(key, sizeof key, "%s.type", at), snprintf(shown, sizeof shown, "\"%.64s\"", type ? type : "int");
        return cfg_quant_refuse(c, key, shown, "the \"float-quantized\" format kiln reads holds FP8 (type float) "
                                               "weights");
    }
    if (bits != 8) {
        snprintf(key, sizeof key, "%s.num_bits", at), snprintf(shown, sizeof shown, "%lld", (long long)bits);
        return cfg_quant_refuse(c, key, shown, "kiln reads 8-bit (E4M3) float weights only (NVFP4 and MXFP4 are "
                                               "not read)");
    }
    json_t *group = cfg_get(w, "group_size");
    if (!strategy) strategy = group ? "group" : "tensor"; /* as QuantizationArgs' validator infers it */
    snprintf(key, sizeof key, "%s.strategy", at), snprintf(shown, sizeof shown, "\"%.64s\"", strategy);
    const bool block = strcmp(strategy, "block") == 0; /* llm-compressor's FP8_BLOCK: block_structure [bn, 128] */
    if (!block && strcmp(strategy, "tensor") != 0 && strcmp(strategy, "channel") != 0)
        return cfg_quant_refuse(c, key, shown, "FP8 weights with one scale per tensor (strategy \"tensor\"), per "
                                               "output channel (\"channel\") or per block (\"block\") are read; "
                                               "per-group scales are not");
    if (block) {
        json_t *bs = cfg_get(w, "block_structure");
        snprintf(key, sizeof key, "%s.block_structure", at);
        if (!bs) {
            char full[256];
            snprintf(full, sizeof full, "quantization_config.%s", key);
            return cfg_missing(c, full);
        }
        if ((st = cfg_fp8_block(c, bs, key, &q->fp8_block_n))) return st;
    }
    if (sym && !json_is_true(sym)) {
        snprintf(key, sizeof key, "%s.symmetric", at);
        return cfg_quant_refuse(c, key, "false", "asymmetric FP8 weights (with a weight_zero_point) are not read");
    }
    static const char *const unread[][2] = {
        {"group_size", "per-group FP8 scales are not read"},
        {"dynamic", "weights quantized on the fly are not read"},
        {"actorder", "act-order (a weight_g_idx) is not read"},
        {"block_structure", NULL},
    };
    for (size_t i = 0; i < sizeof unread / sizeof unread[0]; i++) {
        json_t *v = cfg_get(w, unread[i][0]);
        if (!v || json_is_false(v) || (block && i == 3)) continue; /* a block's structure: read above */
        snprintf(key, sizeof key, "%s.%s", at, unread[i][0]);
        json_show(v, shown, sizeof shown);
        return unread[i][1] ? cfg_quant_refuse(c, key, shown, unread[i][1]) : cfg_quant_refuse_block(c, key, shown);
    }
    q->bits = 8;
    q->group_size = 0;
    q->sym = true;
    q->fp8 = true;
    q->fp8_channel = strcmp(strategy, "channel") == 0;
    return KILN_OK;
}

/* compressed-tensors "float-quantized": a group's input_activations (`v`, field `at`): none, or FP8
 * (type float, 8 bits, symmetric) quantized dynamically (per token or tensor: nothing stored) or
 * statically per tensor (an input_scale per projection, which the importer reads and checks). kiln's
 * fp8 is weight-only: activations are not quantized either way. */
static kiln_status cfg_quant_ct_fp8_inputs(cfg_ctx *c, json_t *v, const char *at, kiln_ckpt_quant *q) {
    char key[224], shown[96]; /* `at` (< 160) and a field name */
    if (!v) return KILN_OK;
    snprintf(key, sizeof key, "quantization_config.%s", at);
    if (!json_is_object(v)) return cfg_type_err(c, key, v, "an object or null");
    int64_t bits;
    const char *type, *strategy;
    kiln_status st = cfg_quant_args(c, v, at, &bits, &type, &strategy);
    if (st) return st;
    json_t *sym = cfg_get(v, "symmetric"), *dyn = cfg_get(v, "dynamic");
    if (!type || strcmp(type, "float") != 0 || bits != 8)
        return cfg_quant_refuse(c, at, json_show(v, shown, sizeof shown), "input activations other than FP8 (W8A8 "
                                                                          "int, W4A8) are not read");
    if (sym && !json_is_true(sym)) {
        snprintf(key, sizeof key, "%s.symmetric", at);
        return cfg_quant_refuse(c, key, json_show(sym, shown, sizeof shown), "asymmetric input activations (an "
                                                                             "input_zero_point) are not read");
    }
    if (dyn && !json_is_boolean(dyn)) {
        snprintf(key, sizeof key, "%s.dynamic", at);
        return cfg_quant_refuse(c, key, json_show(dyn, shown, sizeof shown), "input activations are read dynamic "
                                                                             "(true) or static (false) only");
    }
    const bool is_static = !dyn || json_is_false(dyn);
    if (is_static && strategy && strcmp(strategy, "tensor") != 0) {
        snprintf(key, sizeof key, "%s.strategy", at), snprintf(shown, sizeof shown, "\"%.64s\"", strategy);
        return cfg_quant_refuse(c, key, shown, "static input scales are read per tensor only");
    }
    q->static_input = is_static;
    return KILN_OK;
}

/* A compressed-tensors group target kiln reads: "Linear", or a projection's name, bare or as the
 * regex "re:.*<name>" (with or without a final "$"). */
static bool ct_target_ok(const char *t) {
    static const char *const proj[] = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};
    if (strcmp(t, "Linear") == 0) return true;
    const bool re = strncmp(t, "re:.*", 5) == 0;
    const char *p = re ? t + 5 : t;
    size_t len = strlen(p);
    if (re && len && p[len - 1] == '$') len--;
    for (size_t i = 0; i < sizeof proj / sizeof proj[0]; i++)
        if (strlen(proj[i]) == len && strncmp(p, proj[i], len) == 0) return true;
    return false;
}

/* kv_cache_scheme of a compressed-tensors checkpoint: FP8 (num_bits 8, type float) with static scales
 * (dynamic false, symmetric) per tensor (strategy tensor) or per kv head (attn_head), the ones vLLM reads:
 * each layer's self_attn.k_scale and v_scale (compiler/import.c), so the engine's KV cache holds E4M3
 * codes of k / k_scale and v / v_scale. Anything else is refused naming the field. */
static kiln_status cfg_quant_ct_kv(cfg_ctx *c, json_t *kv, kiln_ckpt_quant *q) {
    char shown[96];
    if (!json_is_object(kv)) return cfg_type_err(c, "quantization_config.kv_cache_scheme", kv, "an object (a scheme)");
    json_t *bits = cfg_get(kv, "num_bits");
    if (!json_is_integer(bits) || json_integer_value(bits) != 8)
        return cfg_quant_refuse(c, "kv_cache_scheme.num_bits", bits ? json_show(bits, shown, sizeof shown) : "absent",
                                "kiln reads an FP8 (8-bit float) KV cache scheme only");
    static const char *const want[][3] = {{"type", "float", "kiln reads an FP8 (type float) KV cache only"},
                                          {"strategy", "tensor",
                                           "kiln reads static KV scales per tensor or per head (attn_head) only"}};
    json_t *strategy = cfg_get(kv, "strategy");
    q->kv_per_head = json_is_string(strategy) && strcmp(json_string_value(strategy), "attn_head") == 0;
    for (size_t i = 0; i < 2; i++) {
        json_t *v = cfg_get(kv, want[i][0]);
        if (json_is_string(v) && strcmp(json_string_value(v), want[i][1]) == 0) continue;
        if (i == 1 && q->kv_per_head) continue;
        char key[64];
        snprintf(key, sizeof key, "kv_cache_scheme.%s", want[i][0]);
        return cfg_quant_refuse(c, key, v ? json_show(v, shown, sizeof shown) : "absent", want[i][2]);
    }
    static const struct {
        const char *key;
        bool want; /* absent or null is taken as it */
        const char *why;
    } flags[] = {{"dynamic", false, "kiln reads static KV scales (dynamic false) only"},
                 {"symmetric", true, "kiln reads symmetric KV scales only"}};
    for (size_t i = 0; i < 2; i++) {
        json_t *v = cfg_get(kv, flags[i].key);
        if (!v || json_is_null(v) || (json_is_boolean(v) && json_is_true(v) == flags[i].want)) continue;
        char key[64];
        snprintf(key, sizeof key, "kv_cache_scheme.%s", flags[i].key);
        return cfg_quant_refuse(c, key, json_show(v, shown, sizeof shown), flags[i].why);
    }
    q->kv_fp8 = true;
    return KILN_OK;
}

/* quantization_config of a compressed-tensors checkpoint (llm-compressor's W4A16): format
 * "pack-quantized" (top level or per group), config groups that all have the same settings
 * (cfg_quant_ct_weights), target Linear layers or projections and quantize no activations; no KV
 * cache scheme, sparsity or transform. "ignore" is what the checkpoint then holds: the importer
 * refuses a projection without its weight_packed, naming it. */
static kiln_status cfg_quant_ct(cfg_ctx *c, json_t *qc, kiln_ckpt_quant *q) {
    char key[160], shown[96];
    const char *top_fmt, *status;
    kiln_status st;
    if ((st = cfg_quant_str(c, qc, "format", NULL, &top_fmt)) ||
        (st = cfg_quant_str(c, qc, "quantization_status", "compressed", &status)))
        return st;
    if (strcmp(status, "compressed") != 0) {
        snprintf(shown, sizeof shown, "\"%.64s\"", status);
        return cfg_quant_refuse(c, "quantization_status", shown, "only compressed (packed) checkpoints are read");
    }
    json_t *kvs = cfg_get(qc, "kv_cache_scheme");
    if (kvs && !json_is_null(kvs) && (st = cfg_quant_ct_kv(c, kvs, q))) return st;
    static const char *const none[][2] = {
        {"sparsity_config", "sparse checkpoints are not read"},
        {"transform_config", "transformed (rotated) weights are not read"},
    };
    for (size_t i = 0; i < sizeof none / sizeof none[0]; i++) {
        json_t *v = cfg_get(qc, none[i][0]);
        if (v && !(json_is_object(v) && json_object_size(v) == 0))
            return cfg_quant_refuse(c, none[i][0], json_show(v, shown, sizeof shown), none[i][1]);
    }
    json_t *ign = cfg_get(qc, "ignore");
    if (ign && !json_is_array(ign)) return cfg_type_err(c, "quantization_config.ignore", ign, "a list of names");
    json_t *groups = cfg_get(qc, "config_groups");
    if (!groups) return cfg_missing(c, "quantization_config.config_groups");
    if (!json_is_object(groups) || json_object_size(groups) == 0)
        return cfg_type_err(c, "quantization_config.config_groups", groups, "an object of one or more groups");
    const char *name, *first_name = NULL;
    json_t *g, *first = NULL;
    json_object_foreach(groups, name, g) {
        snprintf(key, sizeof key, "quantization_config.config_groups.%.64s", name);
        if (!json_is_object(g)) return cfg_type_err(c, key, g, "an object (a scheme with targets and weights)");
        json_t *targets = cfg_get(g, "targets");
        snprintf(key, sizeof key, "quantization_config.config_groups.%.64s.targets", name);
        if (!targets) return cfg_missing(c, key);
        if (!json_is_array(targets) || json_array_size(targets) == 0)
            return cfg_type_err(c, key, targets, "a non-empty list of names");
        size_t i;
        json_t *t;
        json_array_foreach(targets, i, t) {
            if (json_is_string(t) && ct_target_ok(json_string_value(t))) continue;
            snprintf(key, sizeof key, "config_groups.%.64s.targets", name);
            return cfg_quant_refuse(c, key, json_show(t, shown, sizeof shown),
                                    "kiln reads groups that target \"Linear\" or the projections (q_proj ... down_proj)");
        }
        if (!first) {
            first = g, first_name = name;
            continue;
        }
        static const char *const same[] = {"weights", "input_activations", "output_activations", "format"};
        for (size_t k = 0; k < sizeof same / sizeof same[0]; k++) {
            json_t *a = cfg_get(first, same[k]), *b = cfg_get(g, same[k]);
            if ((!a && !b) || (a && b && json_equal(a, b))) continue;
            snprintf(key, sizeof key, "config_groups.%.64s.%s", name, same[k]);
            snprintf(shown, sizeof shown, "not group \"%.40s\"'s", first_name);
            return cfg_quant_refuse(c, key, shown, "groups with different settings (mixed precision) are not read");
        }
    }
    const char *fmt;
    snprintf(key, sizeof key, "config_groups.%.64s.format", first_name);
    if ((st = cfg_quant_str(c, first, "format", NULL, &fmt))) return st;
    const bool per_group = fmt != NULL;
    if (!fmt) fmt = top_fmt ? top_fmt : "(none)";
    const bool fp8 = strcmp(fmt, "float-quantized") == 0;
    if (!fp8 && strcmp(fmt, "pack-quantized") != 0) { /* the group's, or the top level's when the group has none */
        snprintf(shown, sizeof shown, "\"%.64s\"", fmt);
        return cfg_quant_refuse(c, per_group ? key : "format", shown,
                                "kiln reads the \"pack-quantized\" (int4 groups) and \"float-quantized\" (FP8) "
                                "formats only (int-quantized, naive-quantized, marlin-24, nvfp4-pack-quantized and the "
                                "sparse formats are not read)");
    }
    if (top_fmt && strcmp(top_fmt, fmt) != 0 && strcmp(top_fmt, "mixed-precision") != 0) {
        char why[160];
        snprintf(shown, sizeof shown, "\"%.64s\"", top_fmt);
        snprintf(why, sizeof why, "config group \"%.40s\" says \"%s\": one format for all groups, or "
                 "\"mixed-precision\", is read", first_name, fmt);
        return cfg_quant_refuse(c, "format", shown, why);
    }
    q->method = KILN_CKPT_QUANT_CT;
    snprintf(key, sizeof key, "config_groups.%.64s.output_activations", first_name);
    json_t *out = cfg_get(first, "output_activations");
    if (out) return cfg_quant_refuse(c, key, json_show(out, shown, sizeof shown), "quantized outputs are not read");
    snprintf(key, sizeof key, "config_groups.%.64s.input_activations", first_name);
    json_t *in = cfg_get(first, "input_activations");
    if (fp8) {
        if ((st = cfg_quant_ct_fp8_inputs(c, in, key, q))) return st;
        snprintf(key, sizeof key, "config_groups.%.64s.weights", first_name);
        return cfg_quant_ct_fp8_weights(c, cfg_get(first, "weights"), key, q);
    }
    if (in) return cfg_quant_refuse(c, key, json_show(in, shown, sizeof shown),
                                    "quantized activations (W4A8, W8A8) are not read; kiln reads W4A16");
    snprintf(key, sizeof key, "config_groups.%.64s.weights", first_name);
    return cfg_quant_ct_weights(c, cfg_get(first, "weights"), key, q);
}

/* quantization_config of an FP8 checkpoint with quant_method "fp8" (AutoFP8, vLLM, transformers'
 * FineGrainedFP8Config): E4M3 weights (fmt e4m3) with one scale per tensor (weight_block_size absent or
 * null) or per block of [bn, 128] (weight_block_size [bn, 128]: weight_scale_inv, read into fp8g128),
 * activation_scheme dynamic or static (static: an input scale per projection, which the importer
 * reads and checks; kiln's fp8 is weight-only). Blocks of other than 128 columns, another fmt, FP8
 * embeddings (transformers' modules_to_convert) and a KV cache scheme are refused naming the field. Projections left unquantized
 * (ignored_layers, modules_to_not_convert) are refused by the importer, naming them. */
static kiln_status cfg_quant_fp8(cfg_ctx *c, json_t *qc, kiln_ckpt_quant *q) {
    char shown[96];
    const char *scheme, *fmt;
    kiln_status st;
    if ((st = cfg_quant_str(c, qc, "activation_scheme", "dynamic", &scheme)) ||
        (st = cfg_quant_str(c, qc, "fmt", "e4m3", &fmt)))
        return st;
    snprintf(shown, sizeof shown, "\"%.64s\"", scheme);
    if (strcasecmp(scheme, "dynamic") != 0 && strcasecmp(scheme, "static") != 0) /* transformers lowercases it */
        return cfg_quant_refuse(c, "activation_scheme", shown, "kiln reads \"dynamic\" and \"static\" only");
    snprintf(shown, sizeof shown, "\"%.64s\"", fmt);
    if (strcmp(fmt, "e4m3") != 0)
        return cfg_quant_refuse(c, "fmt", shown, "kiln reads E4M3 FP8 weights only");
    json_t *v = cfg_get(qc, "weight_block_size");
    if (v && (st = cfg_fp8_block(c, v, "weight_block_size", &q->fp8_block_n))) return st; /* [rows, columns] */
    if ((v = cfg_get(qc, "kv_cache_scheme")))
        return cfg_quant_refuse(c, "kv_cache_scheme", json_show(v, shown, sizeof shown),
                                "its k_scale and v_scale are read from compressed-tensors checkpoints only");
    if ((v = cfg_get(qc, "modules_to_convert")) && !(json_is_array(v) && json_array_size(v) == 0))
        return cfg_quant_refuse(c, "modules_to_convert", json_show(v, shown, sizeof shown),
                                "FP8 modules other than the projections (embedding tables) are not read");
    static const char *const lists[] = {"ignored_layers", "modules_to_not_convert"};
    for (size_t i = 0; i < 2; i++) {
        char field[64];
        snprintf(field, sizeof field, "quantization_config.%s", lists[i]);
        if ((v = cfg_get(qc, lists[i])) && !json_is_array(v)) return cfg_type_err(c, field, v, "a list of names");
    }
    q->method = KILN_CKPT_QUANT_FP8;
    q->bits = 8;
    q->sym = true;
    q->fp8 = true;
    q->static_input = strcasecmp(scheme, "static") == 0;
    return KILN_OK;
}

/* The regex of GPTQ dynamic rule r, compiled (NULL with *code and *at set on a syntax error). PCRE2's
 * syntax is Python's for what these patterns use (classes, escapes, repeats, alternation). */
static pcre2_code *gptq_rule_re(const kiln_gptq_rule *r, int *code, PCRE2_SIZE *at) {
    return pcre2_compile((PCRE2_SPTR)(r->key + r->pattern_at), PCRE2_ZERO_TERMINATED, 0, code, at, NULL);
}

/* GPTQ's dynamic map (GPTQModel; transformers and vLLM read it): {"-:<regex>": {}} leaves matching
 * modules unquantized, {"+:<regex>": {...}} or {"<regex>": {...}} overrides the base's settings for
 * them. Read: the overrides bits (checked against each module it decides: kiln_ckpt_quant_module),
 * group_size (32, 64, 128), sym and desc_act (the stored zeros and g_idx say what they mean), and the
 * quantizer's own settings that leave the stored format as it is; anything else is refused by name,
 * as is a pattern PCRE2 cannot compile. */
static kiln_status cfg_gptq_dynamic(cfg_ctx *c, json_t *dyn, kiln_ckpt_quant *q) {
    static const char *const neutral[] = {"damp_percent", "damp_auto_increment", "static_groups", "true_sequential",
                                          "mse", "v2", "v2_alpha", "act_group_aware", "sym", "desc_act"};
    char field[224], shown[96];
    q->n_rules = 0;
    if (!dyn) return KILN_OK;
    if (!json_is_object(dyn)) return cfg_type_err(c, "quantization_config.dynamic", dyn, "an object or null");
    const char *key;
    json_t *ov;
    json_object_foreach(dyn, key, ov) { /* in the map's order (jansson keeps it) */
        if (q->n_rules == KILN_GPTQ_MAX_RULES)
            return kiln_err(c->err, KILN_ERR_UNSUPPORTED, "%s: field \"quantization_config.dynamic\" has more than "
                            "%d rules, kiln's limit", c->path, KILN_GPTQ_MAX_RULES);
        kiln_gptq_rule *r = &q->rules[q->n_rules];
        *r = (kiln_gptq_rule){0};
        if (strlen(key) >= sizeof r->key)
            return kiln_err(c->err, KILN_ERR_UNSUPPORTED, "%s: a rule of \"quantization_config.dynamic\" is %zu "
                            "characters long, above kiln's limit of %zu: \"%.48s...\"", c->path, strlen(key),
                            sizeof r->key - 1, key);
        snprintf(r->key, sizeof r->key, "%s", key);
        r->skip = strncmp(key, "-:", 2) == 0;
        r->pattern_at = r->skip || strncmp(key, "+:", 2) == 0 ? 2 : 0;
        snprintf(field, sizeof field, "quantization_config.dynamic.%.150s", key);
        int code;
        PCRE2_SIZE at;
        pcre2_code *re = gptq_rule_re(r, &code, &at);
        if (!re) {
            PCRE2_UCHAR msg[120];
            pcre2_get_error_message(code, msg, sizeof msg);
            return kiln_err(c->err, KILN_ERR_PARSE, "%s: the pattern of rule \"%s\" of \"quantization_config.dynamic\" "
                            "does not compile at offset %zu: %s", c->path, key, (size_t)at, (const char *)msg);
        }
        pcre2_code_free(re);
        if (!json_is_object(ov)) return cfg_type_err(c, field, ov, "an object of overrides");
        const char *ok;
        json_t *v;
        json_object_foreach(ov, ok, v) {
            char sub[240];
            snprintf(sub, sizeof sub, "%s.%s", field, ok);
            if (!strcmp(ok, "bits") || !strcmp(ok, "group_size")) {
                int64_t x;
                kiln_status st = cfg_int(c, ov, ok, sub, true, 0, 1, 1 << 20, &x);
                if (st) return st;
                if (!strcmp(ok, "bits")) {
                    r->bits = (int)x;
                } else if (x != 32 && x != 64 && x != 128) {
                    snprintf(shown, sizeof shown, "%lld", (long long)x);
                    return cfg_quant_refuse(c, sub + strlen("quantization_config."), shown,
                                            "kiln's int4 format has groups of 32, 64 or 128");
                } else {
                    r->group_size = (int)x;
                }
                continue;
            }
            size_t i = 0;
            while (i < sizeof neutral / sizeof neutral[0] && strcmp(ok, neutral[i])) i++;
            if (i == sizeof neutral / sizeof neutral[0])
                return cfg_quant_refuse(c, sub + strlen("quantization_config."), json_show(v, shown, sizeof shown),
                                        "kiln reads the overrides bits, group_size, sym and desc_act, and the "
                                        "quantizer's settings that leave the stored format as it is");
        }
        if (r->skip && json_object_size(ov) > 0)
            return cfg_quant_refuse(c, field + strlen("quantization_config."), json_show(ov, shown, sizeof shown),
                                    "a \"-:\" rule leaves its modules unquantized: it takes no overrides");
        q->n_rules++;
    }
    return KILN_OK;
}

kiln_status kiln_ckpt_quant_module(const kiln_ckpt_quant *q, const char *module, int *group,
                                   const kiln_gptq_rule **rule, kiln_error *err) {
    *group = q->group_size;
    *rule = NULL;
    for (int i = 0; i < q->n_rules; i++) {
        const kiln_gptq_rule *r = &q->rules[i];
        int code;
        PCRE2_SIZE at;
        pcre2_code *re = gptq_rule_re(r, &code, &at);
        if (!re) return kiln_err(err, KILN_ERR_INTERNAL, "dynamic rule \"%s\" no longer compiles", r->key);
        /* a hostile pattern ("(.*)*x") could backtrack for ages over a module name: bounded */
        pcre2_match_data *md = pcre2_match_data_create_from_pattern(re, NULL);
        pcre2_match_context *mc = pcre2_match_context_create(NULL);
        if (mc) pcre2_set_match_limit(mc, 1000000);
        const int rc = md && mc ? pcre2_match(re, (PCRE2_SPTR)module, PCRE2_ZERO_TERMINATED, 0, PCRE2_ANCHORED, md, mc)
                                : PCRE2_ERROR_NOMEMORY;
        pcre2_match_context_free(mc);
        pcre2_match_data_free(md);
        pcre2_code_free(re);
        if (rc == PCRE2_ERROR_NOMATCH) continue;
        if (rc < 0) {
            PCRE2_UCHAR msg[120];
            pcre2_get_error_message(rc, msg, sizeof msg);
            return kiln_err(err, rc == PCRE2_ERROR_NOMEMORY ? KILN_ERR_NOMEM : KILN_ERR_UNSUPPORTED,
                            "matching quantization_config.dynamic rule \"%s\" against '%s': %s", r->key, module,
                            (const char *)msg);
        }
        *rule = r;
        if (r->skip) {
            *group = 0;
        } else {
            if (r->bits && r->bits != 4) {
                kiln_err(err, KILN_ERR_UNSUPPORTED, "quantization_config.dynamic rule \"%s\" gives module '%s' %d "
                         "bits: kiln reads 4-bit GPTQ only", r->key, module, r->bits);
                return kiln_err_hint(err, "compile the model's unquantized checkpoint, with --quant for kiln's own "
                                          "quantization (--quant auto mixes formats per matrix)");
            }
            if (r->group_size) *group = r->group_size;
        }
        return KILN_OK;
    }
    return KILN_OK;
}

/* quantization_config: a published AWQ, GPTQ, compressed-tensors or FP8 checkpoint, read as it is (docs/quantization.md);
 * every other method, version or setting is refused naming the field. */
static kiln_status cfg_quant(cfg_ctx *c, json_t *root, kiln_model_config *m) {
    kiln_ckpt_quant *q = &m->quant;
    *q = (kiln_ckpt_quant){0};
    json_t *qc = cfg_get(root, "quantization_config");
    if (!qc) return KILN_OK;
    if (!json_is_object(qc)) return cfg_type_err(c, "quantization_config", qc, "an object or null");
    const char *method = NULL;
    kiln_status st = cfg_quant_str(c, qc, "quant_method", NULL, &method);
    if (st) return st;
    if (!method) return cfg_missing(c, "quantization_config.quant_method");
    char shown[96];
    snprintf(shown, sizeof shown, "\"%.64s\"", method);
    if (strcmp(method, "awq") == 0) q->method = KILN_CKPT_QUANT_AWQ;
    else if (strcmp(method, "gptq") == 0) q->method = KILN_CKPT_QUANT_GPTQ;
    else if (strcmp(method, "compressed-tensors") == 0) q->method = KILN_CKPT_QUANT_CT;
    else if (strcmp(method, "fp8") == 0) q->method = KILN_CKPT_QUANT_FP8;
    else return cfg_quant_refuse(c, "quant_method", shown, "kiln reads only \"awq\", \"gptq\", "
                                                           "\"compressed-tensors\" and \"fp8\" checkpoints");
    if (m->n_experts)
        return kiln_err(c->err, KILN_ERR_UNSUPPORTED, "%s: a quantized (%s) %s checkpoint: reading experts' "
                        "quantized matrices is not built yet", c->path, method, kiln_arch_name(m->arch));
    if (q->method == KILN_CKPT_QUANT_CT) return cfg_quant_ct(c, qc, q);
    if (q->method == KILN_CKPT_QUANT_FP8) return cfg_quant_fp8(c, qc, q);
    int64_t bits, group;
    if ((st = cfg_int(c, qc, "bits", "quantization_config.bits", true, 0, 1, 64, &bits)) ||
        (st = cfg_int(c, qc, "group_size", "quantization_config.group_size", true, 0, -1, 1 << 20, &group)))
        return st;
    if (bits != 4) {
        snprintf(shown, sizeof shown, "%lld", (long long)bits);
        return cfg_quant_refuse(c, "bits", shown, "kiln reads 4-bit checkpoints only");
    }
    if (group != 32 && group != 64 && group != 128) {
        snprintf(shown, sizeof shown, "%lld", (long long)group);
        return cfg_quant_refuse(c, "group_size", shown,
                                group == -1 ? "per-channel scales (one group per row) are not read yet"
                                            : "kiln's int4 format has groups of 32, 64 or 128");
    }
    q->bits = 4;
    q->group_size = (int)group;
    if (q->method == KILN_CKPT_QUANT_AWQ) {
        const char *version;
        bool zero_point = true;
        if ((st = cfg_quant_str(c, qc, "version", "gemm", &version)) ||
            (st = cfg_quant_bool(c, qc, "zero_point", true, &zero_point)))
            return st;
        snprintf(shown, sizeof shown, "\"%.64s\"", version);
        if (strcmp(version, "gemm") != 0 && strcmp(version, "GEMM") != 0)
            return cfg_quant_refuse(c, "version", shown, "kiln reads AWQ's \"gemm\" packing only");
        if (!zero_point) return cfg_quant_refuse(c, "zero_point", "false", "kiln reads AWQ with zero points only");
        return KILN_OK;
    }
    /* GPTQ: checkpoint_format (transformers' name) or format (GPTQModel's), "gptq" when neither */
    const char *fmt, *fmt2;
    bool lm_head = false;
    if ((st = cfg_quant_str(c, qc, "checkpoint_format", NULL, &fmt)) ||
        (st = cfg_quant_str(c, qc, "format", NULL, &fmt2)) ||
        (st = cfg_quant_bool(c, qc, "sym", true, &q->sym)) ||
        (st = cfg_quant_bool(c, qc, "desc_act", false, &q->desc_act)) ||
        (st = cfg_quant_bool(c, qc, "lm_head", false, &lm_head)))
        return st;
    if (fmt && fmt2 && strcmp(fmt, fmt2) != 0)
        return kiln_err(c->err, KILN_ERR_PARSE, "%s: fields \"quantization_config.checkpoint_format\" (\"%.64s\") "
                        "and \"quantization_config.format\" (\"%.64s\") disagree", c->path, fmt, fmt2);
    if (!fmt) fmt = fmt2 ? fmt2 : "gptq";
    snprintf(shown, sizeof shown, "\"%.64s\"", fmt);
    if (strcmp(fmt, "gptq") != 0 && strcmp(fmt, "gptq_v2") != 0)
        return cfg_quant_refuse(c, fmt2 && fmt == fmt2 ? "format" : "checkpoint_format", shown,
                                "kiln reads GPTQ's \"gptq\" (v1) and \"gptq_v2\" layouts only");
    q->gptq_v2 = strcmp(fmt, "gptq_v2") == 0;
    if (lm_head) return cfg_quant_refuse(c, "lm_head", "true", "a quantized LM head is not read yet");
    return cfg_gptq_dynamic(c, cfg_get(qc, "dynamic"), q);
}

/* Sizes and their relations. */
static kiln_status cfg_sizes(cfg_ctx *c, json_t *root, kiln_model_config *m) {
    kiln_status st;
    if ((st = cfg_int(c, root, "hidden_size", "hidden_size", true, 0, 1, CFG_MAX_HIDDEN, &m->hidden_size)) ||
        (st = cfg_int(c, root, "num_hidden_layers", "num_hidden_layers", true, 0, 1, CFG_MAX_LAYERS, &m->n_layers)) ||
        (st = cfg_int(c, root, "num_attention_heads", "num_attention_heads", true, 0, 1, CFG_MAX_HEADS, &m->n_heads)) ||
        (st = cfg_int(c, root, "num_key_value_heads", "num_key_value_heads", false, m->n_heads, 1, CFG_MAX_HEADS,
                      &m->n_kv_heads)) ||
        (st = cfg_int(c, root, "intermediate_size", "intermediate_size", true, 0, 1, CFG_MAX_FFN,
                      &m->intermediate_size)) ||
        (st = cfg_int(c, root, "vocab_size", "vocab_size", true, 0, 1, CFG_MAX_VOCAB, &m->vocab_size)) ||
        (st = cfg_int(c, root, "max_position_embeddings", "max_position_embeddings", true, 0, 1, CFG_MAX_CONTEXT,
                      &m->max_position_embeddings)))
        return st;

    if (m->n_heads % m->n_kv_heads != 0)
        return kiln_err(c->err, KILN_ERR_PARSE,
                        "%s: field \"num_key_value_heads\" is %" PRId64 ", which does not divide num_attention_heads %" PRId64,
                        c->path, m->n_kv_heads, m->n_heads);

    if (cfg_get(root, "head_dim")) {
        if ((st = cfg_int(c, root, "head_dim", "head_dim", true, 0, 1, CFG_MAX_HEAD_DIM, &m->head_dim))) return st;
    } else {
        if (m->hidden_size % m->n_heads != 0) {
            kiln_err(c->err, KILN_ERR_PARSE,
                     "%s: field \"hidden_size\" is %" PRId64 ", which num_attention_heads %" PRId64
                     " does not divide, and there is no \"head_dim\"",
                     c->path, m->hidden_size, m->n_heads);
            return kiln_err_hint(c->err, "give \"head_dim\" explicitly");
        }
        m->head_dim = m->hidden_size / m->n_heads;
        if (m->head_dim > CFG_MAX_HEAD_DIM)
            return kiln_err(c->err, KILN_ERR_UNSUPPORTED,
                            "%s: head_dim (hidden_size / num_attention_heads) is %" PRId64 ", above kiln's limit of %d",
                            c->path, m->head_dim, CFG_MAX_HEAD_DIM);
    }
    if (m->head_dim % 2 != 0)
        return kiln_err(c->err, KILN_ERR_PARSE,
                        "%s: field \"head_dim\" is %" PRId64 "; rotary embeddings need an even head_dim", c->path,
                        m->head_dim);
    return KILN_OK;
}

/* Rope: theta and scaling, from either spelling (see the file comment). */
static kiln_status cfg_rope(cfg_ctx *c, json_t *root, kiln_model_config *m) {
    const char *dict_name = "rope_scaling";
    json_t *d = cfg_get(root, "rope_scaling");
    if (d && !json_is_object(d)) return cfg_type_err(c, "rope_scaling", d, "an object or null");
    json_t *rp = cfg_get(root, "rope_parameters");
    if (rp && !json_is_object(rp)) return cfg_type_err(c, "rope_parameters", rp, "an object or null");
    if (!d) {
        d = rp;
        dict_name = "rope_parameters";
    }
    char field[64];
    kiln_status st;

    /* theta: the dict's own, else top level, else the transformers default */
    double top_theta;
    const double def_theta = m->arch == KILN_ARCH_MIXTRAL ? CFG_DEFAULT_THETA_MIXTRAL : CFG_DEFAULT_THETA;
    if ((st = cfg_pos_num(c, root, "rope_theta", "rope_theta", false, def_theta, &top_theta))) return st;
    m->rope_theta = top_theta;
    m->rope_type = KILN_ROPE_DEFAULT;
    if (!d) return KILN_OK;
    snprintf(field, sizeof field, "%s.rope_theta", dict_name);
    if ((st = cfg_pos_num(c, d, "rope_theta", field, false, top_theta, &m->rope_theta))) return st;

    /* type: "rope_type", or the older key "type"; "default" when absent */
    const char *type = NULL;
    snprintf(field, sizeof field, "%s.rope_type", dict_name);
    if ((st = cfg_str(c, d, "rope_type", field, &type))) return st;
    if (!type) {
        snprintf(field, sizeof field, "%s.type", dict_name);
        if ((st = cfg_str(c, d, "type", field, &type))) return st;
    }
    if (!type || strcmp(type, "default") == 0) return KILN_OK;
    if (strcmp(type, "llama3") != 0)
        return kiln_err(c->err, KILN_ERR_UNSUPPORTED,
                        "%s: rope type \"%s\" (field \"%s\") is not supported; kiln supports \"default\" and \"llama3\"",
                        c->path, type, field);

    m->rope_type = KILN_ROPE_LLAMA3;
    snprintf(field, sizeof field, "%s.factor", dict_name);
    if ((st = cfg_pos_num(c, d, "factor", field, true, 0, &m->rope_factor))) return st;
    if (m->rope_factor < 1.0)
        return kiln_err(c->err, KILN_ERR_PARSE, "%s: field \"%s\" is %g; llama3 rope needs a factor >= 1", c->path,
                        field, m->rope_factor);
    snprintf(field, sizeof field, "%s.low_freq_factor", dict_name);
    if ((st = cfg_pos_num(c, d, "low_freq_factor", field, true, 0, &m->rope_low_freq_factor))) return st;
    snprintf(field, sizeof field, "%s.high_freq_factor", dict_name);
    if ((st = cfg_pos_num(c, d, "high_freq_factor", field, true, 0, &m->rope_high_freq_factor))) return st;
    if (!(m->rope_high_freq_factor > m->rope_low_freq_factor))
        return kiln_err(c->err, KILN_ERR_PARSE,
                        "%s: field \"%s\" is %g, which is not greater than low_freq_factor %g", c->path, field,
                        m->rope_high_freq_factor, m->rope_low_freq_factor);
    snprintf(field, sizeof field, "%s.original_max_position_embeddings", dict_name);
    return cfg_int(c, d, "original_max_position_embeddings", field, false, m->max_position_embeddings, 1,
                   CFG_MAX_CONTEXT, &m->rope_original_max_pos);
}

/* Which layers of a Qwen3-MoE are sparse (file comment): decoder_sparse_step and mlp_only_layers. */
static kiln_status cfg_sparse_layers(cfg_ctx *c, json_t *root, kiln_model_config *m) {
    kiln_status st;
    int64_t step;
    if ((st = cfg_int(c, root, "decoder_sparse_step", "decoder_sparse_step", false, 1, 1, CFG_MAX_LAYERS, &step)))
        return st;
    for (int64_t l = 0; l < m->n_layers; l++) m->layer_sparse[l] = (l + 1) % step == 0;
    json_t *only = cfg_get(root, "mlp_only_layers");
    if (!only) return KILN_OK;
    if (!json_is_array(only)) return cfg_type_err(c, "mlp_only_layers", only, "a list of layer indices");
    size_t i;
    json_t *e;
    json_array_foreach(only, i, e) {
        if (!json_is_integer(e)) return cfg_type_err(c, "mlp_only_layers", only, "a list of layer indices");
        json_int_t l = json_integer_value(e);
        if (l < 0 || l >= m->n_layers)
            return kiln_err(c->err, KILN_ERR_PARSE,
                            "%s: field \"mlp_only_layers\"[%zu] is %lld, not a layer index in [0, %" PRId64 ")",
                            c->path, i, (long long)l, m->n_layers);
        m->layer_sparse[l] = false;
    }
    return KILN_OK;
}

/* The experts of Mixtral and Qwen3-MoE (file comment); nothing for the dense architectures. */
static kiln_status cfg_experts(cfg_ctx *c, json_t *root, kiln_model_config *m) {
    m->n_experts = m->n_experts_per_tok = m->moe_intermediate_size = 0;
    m->norm_topk_prob = false;
    memset(m->layer_sparse, 0, sizeof m->layer_sparse);
    const bool qmoe = m->arch == KILN_ARCH_QWEN3_MOE;
    if (m->arch != KILN_ARCH_MIXTRAL && !qmoe) return KILN_OK;
    kiln_status st;
    int64_t alias = 0;
    if ((st = cfg_int(c, root, "num_local_experts", "num_local_experts", false, 0, 1, CFG_MAX_EXPERTS,
                      &m->n_experts)) ||
        (st = cfg_int(c, root, "num_experts", "num_experts", false, 0, 1, CFG_MAX_EXPERTS, &alias)))
        return st;
    if (m->n_experts && alias && alias != m->n_experts)
        return kiln_err(c->err, KILN_ERR_PARSE,
                        "%s: field \"num_experts\" is %" PRId64 " but \"num_local_experts\" is %" PRId64
                        "; transformers reads them as one setting",
                        c->path, alias, m->n_experts);
    if (!m->n_experts) m->n_experts = alias ? alias : qmoe ? 128 : 8;
    if ((st = cfg_int(c, root, "num_experts_per_tok", "num_experts_per_tok", false, qmoe ? 8 : 2, 1,
                      CFG_MAX_EXPERTS, &m->n_experts_per_tok)))
        return st;
    if (m->n_experts_per_tok > m->n_experts)
        return kiln_err(c->err, KILN_ERR_PARSE,
                        "%s: field \"num_experts_per_tok\" is %" PRId64 ", more than the %" PRId64
                        " experts (num_local_experts)",
                        c->path, m->n_experts_per_tok, m->n_experts);
    bool ignored;
    if ((st = cfg_bool(c, root, "output_router_logits", false, &ignored))) return st;
    json_t *v = cfg_get(root, "router_aux_loss_coef");
    if (v && (!json_is_number(v) || !(json_number_value(v) >= 0)))
        return cfg_type_err(c, "router_aux_loss_coef", v, "a number >= 0");
    if (!qmoe) { /* Mixtral: every layer sparse, experts as wide as intermediate_size, always renormalised */
        m->moe_intermediate_size = m->intermediate_size;
        m->norm_topk_prob = true;
        for (int64_t l = 0; l < m->n_layers; l++) m->layer_sparse[l] = true;
        v = cfg_get(root, "router_jitter_noise");
        if (v && (!json_is_number(v) || !(json_number_value(v) >= 0)))
            return cfg_type_err(c, "router_jitter_noise", v, "a number >= 0");
        return KILN_OK;
    }
    if ((st = cfg_int(c, root, "moe_intermediate_size", "moe_intermediate_size", false, 768, 1, CFG_MAX_FFN,
                      &m->moe_intermediate_size)) ||
        (st = cfg_bool(c, root, "norm_topk_prob", false, &m->norm_topk_prob)))
        return st;
    return cfg_sparse_layers(c, root, m);
}

/* Which layers attend over a sliding window of `window` tokens (0: none), as transformers decides
 * (file comment): every layer for Mistral and Mixtral; for Qwen2/Qwen3 only with use_sliding_window, then the
 * layers layer_types names "sliding_attention" (transformers 5 writes it), else layers from
 * max_window_layers on (transformers 4's rule, and 5's default); for Qwen3-MoE every layer with
 * use_sliding_window (transformers 5), refused where transformers 4 would have decided otherwise. */
static kiln_status cfg_layer_windows(cfg_ctx *c, json_t *root, kiln_model_config *m, int64_t window) {
    memset(m->layer_windowed, 0, sizeof m->layer_windowed);
    m->sliding_window = 0;
    if (m->arch == KILN_ARCH_LLAMA) return KILN_OK; /* checked, then ignored (file comment) */
    kiln_status st;
    const bool qmoe = m->arch == KILN_ARCH_QWEN3_MOE;
    bool qwen = m->arch == KILN_ARCH_QWEN2 || m->arch == KILN_ARCH_QWEN3, use = !qwen && !qmoe;
    if ((qwen || qmoe) && (st = cfg_bool(c, root, "use_sliding_window", false, &use))) return st;
    int64_t from = 0;
    if ((qwen || qmoe) && (st = cfg_int(c, root, "max_window_layers", "max_window_layers", false, qwen ? 28 : 0, 0,
                                        CFG_MAX_LAYERS, &from)))
        return st;
    if (qmoe && use && window > 0 && from != 0) {
        kiln_err(c->err, KILN_ERR_UNSUPPORTED,
                 "%s: use_sliding_window is true with sliding_window %lld and max_window_layers %lld: transformers 5 "
                 "windows every layer of a Qwen3MoeForCausalLM, transformers 4 only layers from max_window_layers "
                 "on (flash attention) or every layer (eager), so kiln cannot tell which model this is",
                 c->path, (long long)window, (long long)from);
        return kiln_err_hint(c->err, "set \"max_window_layers\": 0 (every layer windowed, as transformers 5) or "
                                     "\"use_sliding_window\": false");
    }
    json_t *lt = qwen || qmoe ? cfg_get(root, "layer_types") : NULL;
    if (lt && (!json_is_array(lt) || json_array_size(lt) != (size_t)m->n_layers))
        return kiln_err(c->err, KILN_ERR_PARSE, "%s: field \"layer_types\" must be a list of %lld strings, one per "
                                                "layer", c->path, (long long)m->n_layers);
    for (int64_t l = 0; l < m->n_layers; l++) {
        bool windowed = l >= from;
        if (lt) {
            json_t *e = json_array_get(lt, (size_t)l);
            const char *s = json_is_string(e) ? json_string_value(e) : "";
            if (strcmp(s, "sliding_attention") != 0 && strcmp(s, "full_attention") != 0)
                return kiln_err(c->err, KILN_ERR_UNSUPPORTED, "%s: field \"layer_types\"[%lld] is not "
                                                              "\"full_attention\" or \"sliding_attention\"",
                                c->path, (long long)l);
            bool named = strcmp(s, "sliding_attention") == 0;
            if (qmoe && named != (use && window > 0)) /* transformers 5 does not read it for Qwen3-MoE */
                return kiln_err(c->err, KILN_ERR_UNSUPPORTED,
                                "%s: field \"layer_types\"[%lld] is \"%s\", but transformers' Qwen3MoeForCausalLM "
                                "does not read layer_types: every layer is %s (use_sliding_window, sliding_window)",
                                c->path, (long long)l, s, use && window > 0 ? "windowed" : "unwindowed");
            windowed = qmoe ? windowed : named;
        }
        m->layer_windowed[l] = use && window > 0 && windowed;
        if (m->layer_windowed[l]) m->sliding_window = window;
    }
    return KILN_OK;
}

/* sliding_window, tie_word_embeddings, token ids, dtype. */
static kiln_status cfg_rest(cfg_ctx *c, json_t *root, kiln_model_config *m) {
    kiln_status st;
    if ((st = cfg_pos_num(c, root, "rms_norm_eps", "rms_norm_eps", true, 0, &m->rms_norm_eps))) return st;

    int64_t window;
    if ((st = cfg_int(c, root, "sliding_window", "sliding_window", false, 0, 1, CFG_MAX_CONTEXT, &window))) return st;
    if ((st = cfg_layer_windows(c, root, m, window))) return st;

    if ((st = cfg_bool(c, root, "tie_word_embeddings", false, &m->tie_word_embeddings))) return st;

    json_t *bos = cfg_get(root, "bos_token_id");
    if (bos && (st = cfg_token_id(c, bos, "bos_token_id", m->vocab_size, &m->bos_token_id))) return st;

    /* eos_token_id: one id or a list of them */
    m->n_eos = 0;
    json_t *eos = cfg_get(root, "eos_token_id");
    if (eos && (st = kiln_json_id_list(eos, c->path, "eos_token_id", cfg_eos_id, &(eos_ctx){c, m->vocab_size},
                                       m->eos_token_ids, &m->n_eos, c->err)))
        return st;

    /* dtype (transformers 5) wins over torch_dtype (4.x) */
    const char *dt = NULL, *dt_field = "dtype";
    if ((st = cfg_str(c, root, "dtype", "dtype", &dt))) return st;
    if (!dt) {
        dt_field = "torch_dtype";
        if ((st = cfg_str(c, root, "torch_dtype", "torch_dtype", &dt))) return st;
    }
    if (!dt || strcmp(dt, "float32") == 0) m->torch_dtype = KILN_DTYPE_F32;
    else if (strcmp(dt, "float16") == 0) m->torch_dtype = KILN_DTYPE_F16;
    else if (strcmp(dt, "bfloat16") == 0) m->torch_dtype = KILN_DTYPE_BF16;
    else
        return kiln_err(c->err, KILN_ERR_UNSUPPORTED,
                        "%s: field \"%s\" is \"%s\"; kiln supports float32, float16 and bfloat16", c->path, dt_field, dt);
    return KILN_OK;
}

kiln_status kiln_config_parse(const char *json, size_t len, const char *path, kiln_model_config *out,
                              kiln_error *err) {
    memset(out, 0, sizeof *out);
    out->bos_token_id = -1;
    cfg_ctx c = {path ? path : "config.json", err};
    json_error_t je;
    json_t *root = json_loadb(json, len, JSON_REJECT_DUPLICATES, &je);
    if (!root)
        return kiln_err(err, KILN_ERR_PARSE, "%s: not valid JSON: %s (line %d, column %d)", c.path, je.text, je.line,
                        je.column);
    kiln_status st;
    if (!json_is_object(root)) {
        st = kiln_err(err, KILN_ERR_PARSE, "%s: the top level is %s; a config.json must be a JSON object", c.path,
                      json_kind(root));
        goto out;
    }
    kiln_model_config m = {0};
    m.bos_token_id = -1;
    if ((st = cfg_arch(&c, root, &m.arch)) || (st = cfg_features(&c, root)) || (st = cfg_sizes(&c, root, &m)) ||
        (st = cfg_rope(&c, root, &m)) || (st = cfg_experts(&c, root, &m)) || (st = cfg_quant(&c, root, &m)) ||
        (st = cfg_rest(&c, root, &m)))
        goto out;
    *out = m;
out:
    json_decref(root);
    return st;
}

kiln_status kiln_config_load(const char *path, kiln_model_config *out, kiln_error *err) {
    memset(out, 0, sizeof *out);
    out->bos_token_id = -1;
    char *text = NULL;
    size_t len = 0;
    kiln_status st = kiln_file_read(path, CFG_MAX_FILE, &text, &len, err);
    if (st) return st;
    st = kiln_config_parse(text, len, path, out, err);
    free(text);
    return st;
}
