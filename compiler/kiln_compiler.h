/*
 * kiln_compiler.h — the front end: HuggingFace checkpoint directory → model
 * config + weight references, and the compile driver that turns them into an
 * engine file.
 *
 * Parts:
 *   config.c       config.json → kiln_model_config (Llama, Mistral, Qwen3, Mixtral)
 *   generation_config.c  generation_config.json → bos/eos/pad ids and sampling defaults
 *   safetensors.c  one .safetensors file → table of tensors (mmapped, never copied)
 *   checkpoint.c   a checkpoint dir (single file or sharded with
 *                  model.safetensors.index.json) → name lookup over all shards
 *   import.c       config + checkpoint → IR graph (ir/kiln_ir.h)
 *   compile.c      import → passes → plan → engine file (codegen/)
 * Every reader treats its input as hostile: sizes are checked, offsets must
 * lie in the file, and each error names the file, tensor or field at fault.
 */
#ifndef KILN_COMPILER_H
#define KILN_COMPILER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../common/kiln_util.h"
#include "../ir/kiln_ir.h"

/* ---- config.json ---- */

typedef enum kiln_arch {
    KILN_ARCH_LLAMA = 0,   /* LlamaForCausalLM */
    KILN_ARCH_MISTRAL = 1, /* MistralForCausalLM */
    KILN_ARCH_QWEN3 = 2,   /* Qwen3ForCausalLM: per-head RMSNorm of q and k before RoPE */
    KILN_ARCH_QWEN2 = 3,   /* Qwen2ForCausalLM (Qwen2, Qwen2.5): biases on q, k and v */
    KILN_ARCH_MIXTRAL = 4, /* MixtralForCausalLM: Mistral attention, a sparse mixture of SwiGLU experts */
    KILN_ARCH_QWEN3_MOE = 5, /* Qwen3MoeForCausalLM: Qwen3 attention, many small experts (some layers dense) */
} kiln_arch;

/* "LlamaForCausalLM"... */
const char *kiln_arch_name(kiln_arch a);

typedef enum kiln_rope_type {
    KILN_ROPE_DEFAULT = 0,
    KILN_ROPE_LLAMA3 = 1, /* rope_scaling {rope_type: llama3, factor, low/high_freq_factor, original_max_position_embeddings} */
} kiln_rope_type;

#define KILN_MAX_EOS 8
#define KILN_MAX_LAYERS 1024 /* num_hidden_layers' cap */

/* A published quantized checkpoint (config.json "quantization_config"; docs/quantization.md): its
 * projections' matrices are stored 4-bit or FP8 E4M3, which the importer reads as they are (kiln_qsrc). */
typedef enum kiln_ckpt_quant_method {
    KILN_CKPT_QUANT_NONE = 0,
    KILN_CKPT_QUANT_AWQ = 1,  /* AutoAWQ, version "gemm", zero_point true */
    KILN_CKPT_QUANT_GPTQ = 2, /* GPTQ, checkpoint_format "gptq" (v1) or "gptq_v2" */
    KILN_CKPT_QUANT_CT = 3,   /* compressed-tensors: "pack-quantized" int4 groups (W4A16), or (fp8) "float-quantized"
                                 FP8 E4M3 with one scale per tensor or per channel */
    KILN_CKPT_QUANT_FP8 = 4,  /* quant_method "fp8" (AutoFP8, vLLM, transformers), one scale per tensor or, with
                                 weight_block_size, per block (DeepSeek-V3, Qwen3-FP8) */
} kiln_ckpt_quant_method;

/* GPTQ's `dynamic` map (GPTQModel): per-module overrides, in the map's order; the first rule whose
 * pattern matches a module's name ("model.layers.0.self_attn.q_proj") from its start (Python's
 * re.match, as vLLM and GPTQModel apply them) decides it. */
#define KILN_GPTQ_MAX_RULES 32
typedef struct kiln_gptq_rule {
    char key[160];    /* the rule as the map spells it ("-:...", "+:..." or the bare pattern) */
    int pattern_at;   /* where its regex starts in key (after "-:" or "+:") */
    bool skip;        /* "-:": matching modules are not quantized (they ship a dense .weight) */
    int bits;         /* the override's bits, 0 = the base's */
    int group_size;   /* the override's group_size, 0 = the base's */
} kiln_gptq_rule;

typedef struct kiln_ckpt_quant {
    kiln_ckpt_quant_method method;
    int bits;                 /* 4, or 8 for FP8 */
    int group_size;           /* 32, 64 or 128; 0 for FP8 */
    bool gptq_v2;             /* GPTQ: zeros stored as they are (v1 stores zero - 1) */
    bool sym, desc_act;       /* GPTQ: as declared (act-order g_idx orders are read either way);
                                 compressed-tensors: sym is weights.symmetric (no zero points), desc_act its
                                 actorder "group" (each projection's weight_g_idx read as GPTQ's g_idx) */
    bool fp8;                 /* FP8 E4M3 weights (method FP8, or CT float-quantized) */
    bool fp8_channel;         /* FP8: one scale per output row (CT strategy channel), else one per tensor */
    int fp8_block_n;          /* FP8 (method fp8): weight_block_size [fp8_block_n, 128], a scale per block of that
                                 many rows and 128 columns (weight_scale_inv); 0 = none */
    bool static_input;        /* FP8: static input activation scales (input_scale tensors, one per projection):
                                 read and checked, not applied (kiln's fp8 is weight-only: activations stay
                                 in the engine's dtype) */
    bool kv_fp8;              /* compressed-tensors kv_cache_scheme: an FP8 KV cache with a static scale per layer
                                 for K and for V (self_attn.k_scale, v_scale; compiler/import.c)... */
    bool kv_per_head;         /* ...or, strategy attn_head, one per kv head ([n_kv_heads, 1, 1]) */
    int n_rules;              /* GPTQ: its dynamic map's rules */
    kiln_gptq_rule rules[KILN_GPTQ_MAX_RULES];
} kiln_ckpt_quant;

/* How checkpoint q stores projection `module` ("model.layers.0.mlp.down_proj"): *group its group size
 * (the base's, or a GPTQ dynamic rule's), 0 when a "-:" rule leaves it unquantized; *rule the rule that
 * decided (NULL: none). Refuses by name a rule whose bits kiln does not read for a module it matches. */
kiln_status kiln_ckpt_quant_module(const kiln_ckpt_quant *q, const char *module, int *group,
                                   const kiln_gptq_rule **rule, kiln_error *err);

/* "awq", "gptq", "gptq_v2", "compressed-tensors" or "fp8" ("none" when not quantized): for messages and the
 * engine's meta. */
const char *kiln_ckpt_quant_name(const kiln_ckpt_quant *q);

typedef struct kiln_model_config {
    kiln_arch arch;
    int64_t hidden_size;          /* d_model */
    int64_t n_layers;             /* num_hidden_layers */
    int64_t n_heads;              /* num_attention_heads */
    int64_t n_kv_heads;           /* num_key_value_heads (GQA); = n_heads when absent */
    int64_t head_dim;             /* head_dim when given, else hidden_size / n_heads */
    int64_t intermediate_size;    /* FFN width (Mixtral: of each expert; Qwen3-MoE: of its dense layers) */
    int64_t n_experts;            /* num_local_experts / num_experts (Mixtral: 8, Qwen3-MoE: 128 when absent,
                                     as in HF); 0 = dense */
    int64_t n_experts_per_tok;    /* num_experts_per_tok (Mixtral 2, Qwen3-MoE 8 when absent), 1..n_experts */
    int64_t moe_intermediate_size;/* each expert's FFN width (Mixtral: intermediate_size) */
    bool norm_topk_prob;          /* the top-k router probabilities renormalised to sum 1 (Mixtral: always;
                                     Qwen3-MoE: norm_topk_prob, false when absent as in HF) */
    bool layer_sparse[KILN_MAX_LAYERS]; /* layer l's MLP is the experts (Mixtral: all layers; Qwen3-MoE: the
                                           layers decoder_sparse_step and mlp_only_layers leave sparse) */
    int64_t vocab_size;
    int64_t max_position_embeddings;
    double rms_norm_eps;
    double rope_theta;            /* rope_theta, or rope_parameters.rope_theta (transformers 5) */
    kiln_rope_type rope_type;
    double rope_factor;           /* llama3 only */
    double rope_low_freq_factor;  /* llama3 only */
    double rope_high_freq_factor; /* llama3 only */
    int64_t rope_original_max_pos;/* llama3 only */
    int64_t sliding_window;       /* 0 = none (null or absent, or Qwen's use_sliding_window false) */
    bool layer_windowed[KILN_MAX_LAYERS]; /* layer l attends over sliding_window tokens (all layers for
                                             Mistral; Qwen's layer_types / max_window_layers) */
    bool tie_word_embeddings;
    int64_t bos_token_id;         /* -1 when absent */
    int64_t eos_token_ids[KILN_MAX_EOS]; /* eos_token_id may be an int or a list */
    int n_eos;
    kiln_dtype torch_dtype;       /* torch_dtype or dtype; F32 when absent */
    kiln_ckpt_quant quant;        /* quantization_config; method NONE when absent or null */
} kiln_model_config;

/* Parse config.json text. `path` is used in messages only. Unknown
 * architectures, wrong types, missing required fields and unsupported values
 * (hidden_act other than silu, attention_bias true, unknown rope type...) are
 * refused by name. */
kiln_status kiln_config_parse(const char *json, size_t len, const char *path,
                              kiln_model_config *out, kiln_error *err);
kiln_status kiln_config_load(const char *path, kiln_model_config *out, kiln_error *err);
/* A token-id field that is one id or a list of at most KILN_MAX_EOS (eos_token_id in config.json
 * and generation_config.json): each element through `id` (type and range, its messages), named
 * "key" or "key[i]"; *n = how many. A longer list is KILN_ERR_UNSUPPORTED naming `path` and `key`. */
struct json_t;
kiln_status kiln_json_id_list(const struct json_t *v, const char *path, const char *key,
                              kiln_status (*id)(void *ctx, const struct json_t *v, const char *field, int64_t *out),
                              void *ctx, int64_t out[KILN_MAX_EOS], int *n, kiln_error *err);

/* ---- generation_config.json (compiler/generation_config.c) ---- */

/* What generation_config.json says, checked (types, ranges, ids inside the
 * vocabulary). has_* says whether the field was given (absent and null are
 * "not given", as in transformers). */
typedef struct kiln_generation_config {
    bool has_bos, has_eos, has_pad, has_do_sample, has_temperature, has_top_k, has_top_p;
    int64_t bos_token_id, pad_token_id;
    int64_t eos_token_ids[KILN_MAX_EOS]; /* eos_token_id: an int or a list */
    int n_eos;
    bool do_sample;
    double temperature; /* >= 0; > 0 when do_sample */
    int64_t top_k;      /* >= 0 (0 = off) */
    double top_p;       /* [0, 1]; > 0 when do_sample */
    char not_applied[512]; /* comma list of the other keys kiln does not apply ("" = none) */
} kiln_generation_config;

/* Parse generation_config.json text; ids are checked against `vocab_size`
 * (config.json's). `path` is used in messages only. */
kiln_status kiln_generation_config_parse(const char *json, size_t len, const char *path, int64_t vocab_size,
                                         kiln_generation_config *out, kiln_error *err);
/* Read and parse a file; a directory or other non-regular file is refused. */
kiln_status kiln_generation_config_load(const char *path, int64_t vocab_size, kiln_generation_config *out,
                                        kiln_error *err);

/* The generation settings an engine carries, resolved as transformers'
 * generate() resolves them: with a generation_config.json, bos/eos/pad come
 * from it alone (GenerationMixin loads that file instead of deriving a
 * config from config.json), else from config.json. Sampling: do_sample
 * false (the default) is greedy whatever temperature/top_k/top_p say
 * (kiln: temperature 0, top_k 0, top_p 1); do_sample true takes the given
 * values, else transformers' defaults temperature 1, top_k 50, top_p 1.
 * Each *_src names where the value came from ("config.json",
 * "generation_config.json", "default", "greedy"). */
typedef struct kiln_generation {
    int64_t bos_token_id, pad_token_id; /* -1 = none */
    int64_t eos_token_ids[KILN_MAX_EOS];
    int n_eos;
    bool do_sample;
    double temperature, top_p;
    int64_t top_k;
    const char *ids_src, *do_sample_src, *temperature_src, *top_k_src, *top_p_src;
    const char *not_applied; /* generation_config.json keys kiln does not apply; "" = none */
} kiln_generation;

/* `gc` NULL = no generation_config.json. The result points into `gc`. */
void kiln_generation_resolve(const kiln_model_config *c, const kiln_generation_config *gc, kiln_generation *out);

/* ---- safetensors ---- */

typedef struct kiln_st_tensor {
    char *name;
    kiln_dtype dtype;       /* F32, F16 or BF16 */
    int ndim;               /* 0..KILN_MAX_DIMS */
    int64_t shape[KILN_MAX_DIMS];
    const uint8_t *data;    /* points into the mapped file */
    uint64_t nbytes;
} kiln_st_tensor;

typedef struct kiln_st_file {
    kiln_mapped_file map;
    kiln_st_tensor *tensors; /* sorted by name */
    size_t n_tensors;
} kiln_st_file;

/* Parse an in-memory safetensors image (used by the fuzz target and by
 * kiln_st_open). The tensors point into `data`, which must outlive them. */
kiln_status kiln_st_parse(const uint8_t *data, size_t size, const char *path,
                          kiln_st_tensor **tensors, size_t *n_tensors, kiln_error *err);
kiln_status kiln_st_open(const char *path, kiln_st_file *out, kiln_error *err);
void kiln_st_close(kiln_st_file *f);
void kiln_st_tensors_free(kiln_st_tensor *t, size_t n);

/* ---- checkpoint directory ---- */

typedef struct kiln_checkpoint {
    char *dir;
    kiln_model_config config;
    kiln_st_file *shards;
    size_t n_shards;
    /* All tensors of all shards, sorted by name (pointers into shards). */
    const kiln_st_tensor **index;
    size_t n_index;
    char *tokenizer_json_path;        /* NULL when the dir has none */
    char *tokenizer_config_path;      /* NULL when the dir has none */
} kiln_checkpoint;

/* Open a checkpoint dir: config.json, then model.safetensors.index.json (every
 * shard it names must exist and every tensor must be in the shard it names)
 * or else model.safetensors (or the only *.safetensors file). Duplicate
 * tensor names across shards are refused. */
kiln_status kiln_checkpoint_open(const char *dir, kiln_checkpoint *out, kiln_error *err);
void kiln_checkpoint_close(kiln_checkpoint *ck);
/* NULL when absent. */
const kiln_st_tensor *kiln_checkpoint_find(const kiln_checkpoint *ck, const char *name);

/* ---- import and compile ---- */

/* Build the forward graph of the model (unfused, as the checkpoint describes
 * it). Checks that every weight the graph needs is in the checkpoint with the
 * expected shape and a supported dtype. */
kiln_status kiln_import(const kiln_checkpoint *ck, kiln_graph **out, kiln_error *err);
/* The same, converting matrix weights to `weight_dtype` (KILN_DTYPE_COUNT_ =
 * keep each tensor's own dtype). Norm weights stay f32. */
kiln_status kiln_import_dtype(const kiln_checkpoint *ck, kiln_dtype weight_dtype, kiln_graph **out, kiln_error *err);

/* Checkpoint tensors that may stay unused without being allowed by the
 * caller: HF's rotary_emb.inv_freq buffers (transformers skips them when
 * loading a Llama/Mistral and recomputes them from config.json). An fnmatch
 * pattern. */
#define KILN_IMPORT_DEFAULT_ALLOW "*rotary_emb.inv_freq"

typedef struct kiln_import_options {
    kiln_dtype weight_dtype;         /* KILN_DTYPE_COUNT_ = keep each tensor's dtype */
    const char *const *allow_unused; /* fnmatch patterns of tensors that may stay unused */
    int n_allow_unused;
} kiln_import_options;

/* The general form: every checkpoint tensor must be consumed by the graph or
 * match KILN_IMPORT_DEFAULT_ALLOW or one of o->allow_unused, else the first
 * is refused by name (KILN_ERR_UNSUPPORTED) with the count of the others.
 * With tie_word_embeddings, an lm_head.weight equal to the embedding is
 * consumed and a differing one refused. kiln_import and kiln_import_dtype
 * are this with no extra patterns. `o` may be NULL. */
kiln_status kiln_import_ex(const kiln_checkpoint *ck, const kiln_import_options *o, kiln_graph **out,
                           kiln_error *err);

typedef struct kiln_compile_options {
    const char *output_path;
    kiln_dtype weight_dtype;   /* KILN_DTYPE_COUNT_ = keep the checkpoint's dtype */
    const char *passes;        /* comma list of pass names; NULL = the default pipeline; "" = none */
    bool dump_ir;              /* print the graph after each pass to dump_stream */
    void *dump_stream;         /* FILE * */
    bool compress;             /* zstd the weights section */
    bool verbose;
    const char *targets;       /* GPU targets of the kernels section (codegen/kiln_kernels.h): "default",
                                  "sm_80,sm_90,compute_90"...; NULL or "none" = no kernels section */
    int kv_block_size;         /* tokens per KV-cache block the kernels are built for (0 = 16) */
    int threads;               /* threads for NVRTC (0 = one per core) */
    const char *const *allow_unused; /* fnmatch patterns of checkpoint tensors that may stay unused */
    int n_allow_unused;
    bool force;                /* allow an output inside the checkpoint directory (never over an input file) */
    struct kiln_progress *progress; /* phase and counts of long work (common/kiln_progress.h); NULL = none */
    bool no_chat_template;     /* leave the checkpoint's chat template out of the engine */
    int tp;                    /* tensor-parallel ranks (0 or 1 = none): pass tensor-parallel splits the model
                                  and the engine holds every rank's weight shards (docs/parallelism.md) */
    int quant;                 /* --quant: the projections' matrices quantized to this dtype (KILN_DTYPE_Q8,
                                  _Q4G32/64/128; 0 = none), by the pass quantize (docs/quantization.md) */
    int quant_head;            /* --quant-head: the LM head's (0 = as the other weights' dtype) */
    int quant_embedding;       /* --quant-embedding: the embedding table's (and a tied LM head's; 0 = keep) */
    int quant_method;          /* --quant-method: KILN_QUANT_RTN (0) or KILN_QUANT_MSE, for q4 ranges */
    /* --quant auto (quant = KILN_QUANT_AUTO; compiler/quant_auto.c): one budget, max_weight_bytes (the
     * weights section's bytes), target_bits (average bits per weight over all weights) or
     * max_ppl_increase (percent: the smallest mix whose measured calibration perplexity is at most that
     * much above the unquantized engine's); the
     * calibration: calib_path (UTF-8 text) or calib_ids_path (token ids), else the built-in text, cut
     * to calib_tokens */
    uint64_t max_weight_bytes;
    double target_bits;
    double max_ppl_increase;
    const char *calib_path, *calib_ids_path;
    int calib_tokens;
    bool awq;                  /* --awq: activation-aware scales searched on the calibration (compiler/quant_awq.c)
                                  and folded into the weights before --quant rounds them */
    bool awq_dense;            /* tests: apply --awq's scales but leave the matrices dense (the folding alone is
                                  exact: the engine computes what the unscaled one does) */
    const struct kiln_quant_awq *awq_scales; /* scales found already, applied at import (--awq with --quant
                                  auto: its calibration engine measures the scaled model) */
    uint32_t kv_dtype;         /* --kv-dtype: KILN_FLAG_KV_FP8 or KILN_FLAG_KV_INT8 (the KV cache in 8 bits, scales
                                  calibrated: compiler/kv_calib.c); 0 = the engine's element type */
    const float *kv_scales;    /* tests: the scales to use instead of calibrating, [n_layers][2 * n_kv_heads] */
    bool kv_bf16;              /* --kv-dtype bf16 given: also a kv_cache_scheme checkpoint's KV cache stays bf16 */
    char **quant_report;       /* optional out: meta build.quant as JSON text (malloc'd), for --json */
    bool gpu_if_possible;      /* the targets are a default, not asked for: a plan with an op the GPU cannot
                                  run yet gets no kernels section (a note on stderr names the op) instead of
                                  failing the compile */
} kiln_compile_options;

kiln_status kiln_compile(const char *ckpt_dir, const kiln_compile_options *opt, kiln_error *err);

/* --quant auto: kiln_compile_options.quant's value that asks for it */
#define KILN_QUANT_AUTO 0x100

/* compiler/quant_auto.c: the formats --quant auto chose (picks: each projection by name, for the pass
 * quantize) and the record of how (report: meta build.quant.auto). */
struct json_t;
typedef struct kiln_quant_auto {
    struct kiln_quant_pick *picks;
    int n_picks;
    struct json_t *report;
} kiln_quant_auto;

/* Build the calibration engine (this compile, projections dense) beside the output, measure each
 * projection in each format on the CPU executor, choose under the budget, measure the mix. */
kiln_status kiln_quant_auto_run(const char *ckpt_dir, const kiln_compile_options *opt, kiln_quant_auto *out,
                                kiln_error *err);
void kiln_quant_auto_free(kiln_quant_auto *qa);

/* The calibration --quant auto and --awq measure on (compiler/quant_auto.c). kiln_calib_model: this
 * compile with every weight dense and `passes` (NULL = the compile's), written beside the output,
 * opened for the CPU executor and unlinked. kiln_calib_tokens: the calibration's token ids (--calib,
 * --calib-ids or the built-in text, after BOS) and a record of their source. `what` starts messages. */
/* compiler/kv_calib.c (--kv-dtype fp8|int8): each layer's KV scales, [n_layers][2 * n_kv_heads] (K's
 * kv heads, then V's), from the calibration run on the CPU executor, and the record of how (meta
 * build.kv_cache's "calibration"). */
typedef struct kiln_kv_calib {
    float *scales;
    struct json_t *report;
} kiln_kv_calib;
kiln_status kiln_kv_calib_run(const char *ckpt_dir, const kiln_compile_options *opt, kiln_kv_calib *out,
                              kiln_error *err);
void kiln_kv_calib_free(kiln_kv_calib *k);

struct kiln_model;
kiln_status kiln_calib_model(const char *ckpt_dir, const kiln_compile_options *opt, const char *what,
                             const char *passes, struct kiln_model **out, kiln_error *err);
kiln_status kiln_calib_tokens(const kiln_compile_options *opt, const struct kiln_model *m, const char *what,
                              int32_t **ids, size_t *n, struct json_t **source, kiln_error *err);

/* compiler/quant_awq.c: --awq's scales, one entry per weight they multiply (by checkpoint name), and
 * the record of the search (report: meta build.quant.awq). */
typedef struct kiln_awq_scale {
    char *name;
    float *row_mul, *col_mul; /* kiln_value's (either may be NULL) */
} kiln_awq_scale;
typedef struct kiln_quant_awq {
    kiln_awq_scale *scales;
    int n_scales;
    struct json_t *report;
} kiln_quant_awq;
/* Run the calibration through the unfused plan on the CPU, and for each group of projections that
 * share an input whose scale can be folded into what makes that input (an RMSNorm's weight, the up
 * projection before down, the v projection before o), search the exponent that least changes the
 * group's outputs once quantized as opt->quant asks. */
kiln_status kiln_quant_awq_run(const char *ckpt_dir, const kiln_compile_options *opt, kiln_quant_awq *out,
                               kiln_error *err);
struct kiln_graph;
/* Give the imported graph's weights copies of their scales (by name). */
kiln_status kiln_quant_awq_apply(const kiln_quant_awq *qa, struct kiln_graph *g, kiln_error *err);
void kiln_quant_awq_free(kiln_quant_awq *qa);

/* compiler/output_check.c. The output path alone: refused when it is a
 * directory or another non-regular file, or its folder does not exist. */
kiln_status kiln_output_precheck(const char *out, kiln_error *err);
/* The output against the opened checkpoint: never one of its input files
 * (same device and inode, through any link); not inside its directory
 * unless `force`. Includes kiln_output_precheck. */
kiln_status kiln_output_check(const char *out, const kiln_checkpoint *ck, bool force, kiln_error *err);

#endif /* KILN_COMPILER_H */
