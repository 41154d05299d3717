/*
 * compile.c — the compile driver: checkpoint dir → engine file.
 *
 *   open checkpoint (config.json + safetensors, generation_config.json) → import (IR) → passes
 *   → meta JSON + plan + weights (+ tokenizer) → engine writer
 *
 * The engine is written to a temporary file and renamed into place at the
 * end, so a failed compile leaves nothing behind. Output is deterministic:
 * the same checkpoint (single-file or sharded) and options give the same
 * bytes — no paths, times or host names go into the file.
 */
#include "kiln_compiler.h"

#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../codegen/kiln_codegen.h"
#include "../codegen/kiln_kernels.h"
#include "../common/kiln_progress.h"
#include "../passes/kiln_passes.h"
#include "kiln_chat_compile.h"
#include "kiln_tokjson.h"

static const char *arch_name(kiln_arch a) { return kiln_arch_name(a); }

/* meta.generation: bos/eos/pad ids and sampling defaults, each with its
 * source (kiln_generation_resolve; docs/engine-format.md). `gc` NULL = the
 * checkpoint has no generation_config.json. */
static json_t *make_generation(const kiln_model_config *c, const kiln_generation_config *gc) {
    kiln_generation r;
    kiln_generation_resolve(c, gc, &r);
    json_t *eos = json_array();
    for (int i = 0; i < r.n_eos; i++) json_array_append_new(eos, json_integer(r.eos_token_ids[i]));
    const char *pad_src = r.pad_token_id >= 0 ? r.ids_src : "none";
    json_t *sources = json_pack("{s:s, s:s, s:s, s:s, s:s, s:s, s:s}", "bos_token_id", r.ids_src, "eos_token_ids",
                                r.ids_src, "pad_token_id", pad_src, "do_sample", r.do_sample_src, "temperature",
                                r.temperature_src, "top_k", r.top_k_src, "top_p", r.top_p_src);
    json_t *not_applied = json_array();
    for (const char *p = r.not_applied; p && *p;) {
        size_t n = strcspn(p, ",");
        json_array_append_new(not_applied, json_stringn(p, n));
        p += n + (p[n] == ',');
    }
    return json_pack("{s:I, s:o, s:I, s:I, s:b, s:f, s:I, s:f, s:o, s:o}", "bos_token_id",
                     (json_int_t)r.bos_token_id, "eos_token_ids", eos, "pad_token_id", (json_int_t)r.pad_token_id,
                     "max_context", (json_int_t)c->max_position_embeddings, "do_sample", r.do_sample, "temperature",
                     r.temperature, "top_k", (json_int_t)r.top_k, "top_p", r.top_p, "sources", sources,
                     "not_applied", not_applied);
}

/* meta.tensor_parallel: the ranks and the byte range of the weights section each rank's shards
 * lie in (docs/parallelism.md). */
static json_t *make_tensor_parallel(const kiln_graph *g) {
    json_t *ranges = json_array();
    for (int r = 0; r < g->n_ranks; r++) {
        uint64_t b, e;
        kiln_weights_rank_range(g, r, &b, &e);
        json_array_append_new(ranges, json_pack("{s:I, s:I}", "offset", (json_int_t)b, "bytes", (json_int_t)(e - b)));
    }
    return json_pack("{s:i, s:o, s:s}", "ranks", g->n_ranks, "rank_weights", ranges, "split",
                     "megatron: q/k/v, gate/up by rows; o_proj, down_proj by columns + all_reduce; embedding, "
                     "lm_head by vocabulary");
}

/* Refuse --tp N by name when the model's sizes do not divide among N ranks. */
static kiln_status check_tp(const kiln_checkpoint *ck, int n, kiln_error *err) {
    if (n <= 1) return KILN_OK;
    const kiln_model_config *c = &ck->config;
    const struct { const char *name; int64_t v; } need[] = {
        {"num_attention_heads", c->n_heads}, {"num_key_value_heads", c->n_kv_heads},
        {"intermediate_size", c->intermediate_size}, {"vocab_size", c->vocab_size}};
    if (n > KILN_MAX_RANKS) return kiln_err(err, KILN_ERR_INVALID_ARG, "--tp %d: at most %d ranks", n, KILN_MAX_RANKS);
    if (c->n_experts > 0) {
        kiln_err(err, KILN_ERR_UNSUPPORTED, "--tp %d: %s is a mixture of experts (num_local_experts = %lld), and "
                 "splitting experts over ranks is not built yet", n, ck->dir, (long long)c->n_experts);
        return kiln_err_hint(err, "compile it with --tp 1 (docs/parallelism.md says how experts would be split)");
    }
    for (size_t i = 0; i < sizeof need / sizeof need[0]; i++)
        if (need[i].v % n) {
            kiln_err(err, KILN_ERR_UNSUPPORTED, "--tp %d: %s/config.json %s = %lld does not divide among %d ranks",
                     n, ck->dir, need[i].name, (long long)need[i].v, n);
            return kiln_err_hint(err, "each rank takes an equal share of the heads, KV heads, FFN width and "
                                      "vocabulary; pick a --tp that divides all four (1 always does)");
        }
    return KILN_OK;
}

/* meta build.quant.checkpoint of an FP8 checkpoint: what its quantization_config declared, and that its
 * activations stay unquantized (static input scales are read and checked, not applied). */
static json_t *fp8_checkpoint_json(const kiln_ckpt_quant *cq) {
    const char *scales = cq->fp8_block_n ? "block" : cq->fp8_channel ? "channel" : "tensor";
    const char *inputs = cq->static_input ? "static (input scales read and checked, not applied)" : "dynamic or none";
    json_t *j = cq->method == KILN_CKPT_QUANT_FP8
                    ? json_pack("{s:s, s:s, s:s}", "quant_method", "fp8", "fmt", "e4m3", "activation_scheme",
                                cq->static_input ? "static" : "dynamic")
                    : json_pack("{s:s, s:s, s:s, s:i, s:s, s:b}", "quant_method", "compressed-tensors", "format",
                                "float-quantized", "type", "float", "num_bits", 8, "strategy", scales, "symmetric", 1);
    if (j) {
        json_object_set_new(j, "weight_scales", json_string(scales));
        if (cq->fp8_block_n) json_object_set_new(j, "weight_block_size", json_pack("[i, i]", cq->fp8_block_n, 128));
        json_object_set_new(j, "input_activations", json_string(inputs));
        /* what kiln does with them (docs/quantization.md, "On the GPU"): its own dynamic scales, not the
         * checkpoint's static ones */
        json_object_set_new(j, "activations_in_engine",
                            json_string(cq->fp8_block_n ? "unquantized (fp8g128 is weight-only)"
                                                        : "E4M3 with a scale per token (dynamic) in GPU steps past "
                                                          "the quantized GEMV on sm_89+ (W8A8); unquantized elsewhere"));
    }
    return j;
}

/* The meta section: what the engine holds, for `kiln inspect` and the runtime. */
static json_t *make_meta(const kiln_checkpoint *ck, const kiln_graph *g, const kiln_compile_options *opt,
                         const kiln_generation_config *gen_cfg, uint64_t weights_bytes, const kiln_buf *tok_blob,
                         const kiln_kernel_targets *targets, const char *no_gpu, json_t *quant_auto,
                         json_t *quant_awq) {
    const kiln_model_config *c = &ck->config;
    json_t *model = json_pack(
        "{s:s, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:f, s:f, s:I, s:b, s:s}", "architecture", arch_name(c->arch),
        "hidden_size", (json_int_t)c->hidden_size, "num_hidden_layers", (json_int_t)c->n_layers,
        "num_attention_heads", (json_int_t)c->n_heads, "num_key_value_heads", (json_int_t)c->n_kv_heads, "head_dim",
        (json_int_t)c->head_dim, "intermediate_size", (json_int_t)c->intermediate_size, "vocab_size",
        (json_int_t)c->vocab_size, "max_position_embeddings", (json_int_t)c->max_position_embeddings, "rms_norm_eps",
        c->rms_norm_eps, "rope_theta", c->rope_theta, "sliding_window", (json_int_t)c->sliding_window,
        "tie_word_embeddings", c->tie_word_embeddings, "checkpoint_dtype", kiln_dtype_name(c->torch_dtype));
    if (c->sliding_window > 0) { /* which layers attend over the window (Qwen: not all of them) */
        json_t *wl = json_array();
        for (int64_t l = 0; l < c->n_layers; l++)
            if (c->layer_windowed[l]) json_array_append_new(wl, json_integer((json_int_t)l));
        if (json_array_size(wl) < (size_t)c->n_layers) json_object_set_new(model, "sliding_window_layers", wl);
        else json_decref(wl);
    }
    if (c->n_experts) {
        json_object_set_new(model, "num_local_experts", json_integer(c->n_experts));
        json_object_set_new(model, "num_experts_per_tok", json_integer(c->n_experts_per_tok));
        json_object_set_new(model, "moe_intermediate_size", json_integer(c->moe_intermediate_size));
        json_object_set_new(model, "norm_topk_prob", json_boolean(c->norm_topk_prob));
        json_t *dense = json_array(); /* layers that keep a dense MLP (Qwen3-MoE's mlp_only_layers...) */
        for (int64_t l = 0; l < c->n_layers; l++)
            if (!c->layer_sparse[l]) json_array_append_new(dense, json_integer((json_int_t)l));
        if (json_array_size(dense)) json_object_set_new(model, "dense_mlp_layers", dense);
        else json_decref(dense);
    }
    if (c->rope_type == KILN_ROPE_LLAMA3)
        json_object_set_new(model, "rope_scaling",
                            json_pack("{s:s, s:f, s:f, s:f, s:I}", "rope_type", "llama3", "factor", c->rope_factor,
                                      "low_freq_factor", c->rope_low_freq_factor, "high_freq_factor",
                                      c->rope_high_freq_factor, "original_max_position_embeddings",
                                      (json_int_t)c->rope_original_max_pos));
    json_t *gen = make_generation(c, gen_cfg);
    int n_weights = 0;
    for (int v = 0; v < g->n_values; v++) n_weights += !g->values[v].dead && g->values[v].kind == KILN_VALUE_WEIGHT;
    const char *wdt = opt->weight_dtype == KILN_DTYPE_COUNT_ ? "checkpoint" : kiln_dtype_name(opt->weight_dtype);
    json_t *weights = json_pack("{s:s, s:i, s:I, s:s}", "dtype", wdt, "count", n_weights, "bytes",
                                (json_int_t)weights_bytes, "codec", opt->compress ? "zstd-chunked" : "none");
    json_t *ops = json_object();
    for (int k = 0; k < KILN_OP_COUNT_; k++) {
        int n = kiln_ir_count_ops(g, (kiln_op_kind)k);
        if (n) json_object_set_new(ops, kiln_op_name((kiln_op_kind)k), json_integer(n));
    }
    json_t *build = json_pack("{s:s, s:o}", "passes", opt->passes ? opt->passes : "default", "ops", ops);
    const kiln_ckpt_quant *cq = &c->quant;
    if (opt->quant || opt->quant_head || opt->quant_embedding || cq->method) { /* the formats and what got one */
        int nq = 0;
        for (int v = 0; v < g->n_values; v++)
            nq += !g->values[v].dead && g->values[v].kind == KILN_VALUE_WEIGHT && kiln_dtype_is_quant(g->values[v].dtype);
        /* a quantized checkpoint's projections: fp8, or the format its groups give, repacked as they came */
        const kiln_dtype ckq = cq->fp8_block_n         ? KILN_DTYPE_FP8G128
                               : cq->fp8                ? KILN_DTYPE_FP8
                               : cq->group_size == 32   ? KILN_DTYPE_Q4G32
                               : cq->group_size == 64   ? KILN_DTYPE_Q4G64
                                                        : KILN_DTYPE_Q4G128;
        /* --quant-method chooses int4 groups' ranges only: int8 and fp8 always round to nearest */
        const bool q4 = opt->quant == KILN_QUANT_AUTO || kiln_quant_bits(opt->quant) == 4 ||
                        kiln_quant_bits(opt->quant_head) == 4 || kiln_quant_bits(opt->quant_embedding) == 4;
        char method[96];
        snprintf(method, sizeof method, "%s%s",
                 q4 && opt->quant_method == KILN_QUANT_MSE ? "least squared error range (q4)" : "round to nearest",
                 quant_awq ? ", after activation-aware scales (--awq)" : "");
        if (cq->method) snprintf(method, sizeof method, "read from the checkpoint (%s), repacked without rounding",
                                 kiln_ckpt_quant_name(cq));
        if (cq->fp8) snprintf(method, sizeof method, "read from the checkpoint (%s), codes copied without rounding",
                              cq->method == KILN_CKPT_QUANT_FP8 ? "fp8" : "compressed-tensors float-quantized");
        char declared_fmt[48]; /* a GPTQ dynamic map makes the base format one of several */
        snprintf(declared_fmt, sizeof declared_fmt, "%s%s", kiln_dtype_name(ckq), cq->n_rules ? " and its dynamic map's" : "");
        json_t *q = json_pack("{s:s, s:s, s:s, s:i, s:s}", "weights",
                              cq->method                       ? declared_fmt
                              : opt->quant == KILN_QUANT_AUTO ? "auto"
                              : opt->quant                    ? kiln_dtype_name((kiln_dtype)opt->quant)
                                                              : "none",
                              "lm_head", opt->quant_head ? kiln_dtype_name((kiln_dtype)opt->quant_head) : "keep",
                              "embedding",
                              opt->quant_embedding ? kiln_dtype_name((kiln_dtype)opt->quant_embedding) : "keep",
                              "matrices", nq, "method", method);
        if (q && cq->fp8) /* what the checkpoint declared; static input scales are checked, not applied */
            json_object_set_new(q, "checkpoint", fp8_checkpoint_json(cq));
        else if (q && cq->method) /* what the checkpoint declared (config.json quantization_config) */
            json_object_set_new(q, "checkpoint",
                                cq->method == KILN_CKPT_QUANT_AWQ
                                    ? json_pack("{s:s, s:i, s:i, s:s}", "quant_method", "awq", "bits", cq->bits,
                                                "group_size", cq->group_size, "version", "gemm")
                                : cq->method == KILN_CKPT_QUANT_GPTQ
                                    ? json_pack("{s:s, s:i, s:i, s:s, s:b, s:b}", "quant_method", "gptq", "bits",
                                                cq->bits, "group_size", cq->group_size, "checkpoint_format",
                                                kiln_ckpt_quant_name(cq), "sym", cq->sym, "desc_act", cq->desc_act)
                                    : json_pack("{s:s, s:s, s:s, s:i, s:s, s:i, s:b}", "quant_method",
                                                "compressed-tensors", "format", "pack-quantized", "type", "int",
                                                "num_bits", cq->bits, "strategy", "group", "group_size",
                                                cq->group_size, "symmetric", cq->sym));
        json_t *declared = q ? json_object_get(q, "checkpoint") : NULL;
        if (declared && cq->n_rules) { /* GPTQ's dynamic map, as read: each rule's effect */
            json_t *dyn = json_object();
            for (int i = 0; i < cq->n_rules; i++) {
                const kiln_gptq_rule *r = &cq->rules[i];
                json_object_set_new(dyn, r->key, r->skip ? json_string("not quantized")
                                                         : json_pack("{s:i}", "group_size", r->group_size
                                                                                                ? r->group_size
                                                                                                : cq->group_size));
            }
            json_object_set_new(declared, "dynamic", dyn);
        }
        if (q && quant_auto) json_object_set(q, "auto", quant_auto); /* the choice and its measurements */
        if (q && quant_awq) json_object_set(q, "awq", quant_awq);    /* the scales' search */
        json_object_set_new(build, "quant", q);
    }
    json_t *tok = json_null();
    if (tok_blob) tok = json_pack("{s:I}", "bytes", (json_int_t)tok_blob->len);
    /* GPU targets the kernels section holds ([] = none: CPU only) */
    json_t *tg = json_array();
    for (int i = 0; i < targets->n_cubin + targets->n_ptx; i++) {
        char name[32];
        kiln_kernel_target_name(targets, i, name, sizeof name);
        json_array_append_new(tg, json_string(name));
    }
    if (targets->n_cubin + targets->n_ptx)
        json_object_set_new(build, "kv_block_size", json_integer(opt->kv_block_size ? opt->kv_block_size : 16));
    else /* why the engine runs on the CPU only: the GPU executor says it when asked to run it */
        json_object_set_new(build, "no_gpu_kernels", json_string(no_gpu));
    json_t *meta = json_pack("{s:s, s:s, s:{s:i, s:i}, s:o, s:o, s:o, s:o, s:o, s:o}", "format", "kiln-engine",
                             "kiln_version", KILN_VERSION, "format_version", "major", KILN_ENGINE_MAJOR, "minor",
                             KILN_ENGINE_MINOR, "model", model, "generation", gen, "weights", weights, "build",
                             build, "targets", tg, "tokenizer", tok);
    if (meta && g->n_ranks > 1) /* only then: a tp=1 engine's meta stays byte for byte what it was */
        json_object_set_new(meta, "tensor_parallel", make_tensor_parallel(g));
    return meta;
}

/* CKPT_DIR/generation_config.json when there is something by that name. */
static kiln_status load_generation_config(const kiln_checkpoint *ck, kiln_generation_config *gen, bool *have,
                                          kiln_error *err) {
    *have = false;
    char *path = kiln_path_join(ck->dir, "generation_config.json");
    if (!path) return kiln_err(err, KILN_ERR_NOMEM, "%s: out of memory", ck->dir);
    kiln_status st = KILN_OK;
    if (kiln_path_exists(path)) {
        st = kiln_generation_config_load(path, ck->config.vocab_size, gen, err);
        *have = st == KILN_OK;
    }
    free(path);
    return st;
}

/* The bos/eos/pad ids the engine will carry must be tokens of its tokenizer
 * (when it has one): an id inside a padded model vocabulary but outside the
 * tokenizer would stop generation on a token nothing can decode. */
static kiln_status check_gen_ids_in_tokenizer(const kiln_checkpoint *ck, const kiln_generation_config *gc,
                                              const kiln_buf *blob, kiln_error *err) {
    kiln_generation r;
    kiln_generation_resolve(&ck->config, gc, &r);
    kiln_tokenizer *tok = NULL;
    kiln_status st = kiln_tokenizer_load(blob->data, blob->len, &tok, err);
    if (st != KILN_OK) return st;
    int64_t ids[KILN_MAX_EOS + 2] = {r.bos_token_id, r.pad_token_id};
    const char *names[KILN_MAX_EOS + 2] = {"bos_token_id", "pad_token_id"};
    for (int i = 0; i < r.n_eos; i++) ids[2 + i] = r.eos_token_ids[i], names[2 + i] = "eos_token_id";
    for (int i = 0; i < 2 + r.n_eos && st == KILN_OK; i++) {
        if (ids[i] < 0 || kiln_tokenizer_token(tok, (int32_t)ids[i], NULL)) continue;
        st = kiln_err(err, KILN_ERR_PARSE, "%s/%s: %s %lld is not a token of %s (its ids: 0..%u)", ck->dir,
                      r.ids_src, names[i], (long long)ids[i], ck->tokenizer_json_path,
                      kiln_tokenizer_vocab_size(tok) - 1);
        kiln_err_hint(err, "the model would stop on, or start from, a token its tokenizer cannot decode; "
                           "is this the model's tokenizer.json?");
    }
    kiln_tokenizer_free(tok);
    return st;
}

kiln_status kiln_compile(const char *ckpt_dir, const kiln_compile_options *opt, kiln_error *err) {
    kiln_checkpoint ck;
    kiln_graph *g = NULL;
    kiln_buf plan = {0}, tok = {0}, kernels = {0}, chat = {0};
    kiln_engine_writer *w = NULL;
    kiln_plan *parsed = NULL;
    char *meta_text = NULL;
    bool have_tok = false, have_gen = false, have_chat = false;
    kiln_quant_auto qa = {0};
    kiln_quant_awq aw = {0};
    kiln_kv_calib kvc = {0};
    kiln_generation_config gen;
    kiln_kernel_targets targets;
    kiln_status st = kiln_kernel_targets_parse(opt->targets ? opt->targets : "none", &targets, err);
    if (st != KILN_OK) return st;
    /* why the engine would get no GPU kernels (meta build.no_gpu_kernels) */
    char no_gpu[KILN_ERR_MSG_MAX];
    snprintf(no_gpu, sizeof no_gpu, "%s", opt->gpu_if_possible ? "the kiln that compiled it had no NVRTC"
                                                               : "it was compiled with --target none");
    if ((st = kiln_output_precheck(opt->output_path, err)) != KILN_OK) return st;
    kiln_progress_phase(opt->progress, "import", 0, NULL, 0);
    if ((st = kiln_checkpoint_open(ckpt_dir, &ck, err)) != KILN_OK) return st;
    if ((st = kiln_output_check(opt->output_path, &ck, opt->force, err)) != KILN_OK) goto out;
    if ((st = load_generation_config(&ck, &gen, &have_gen, err)) != KILN_OK) goto out;
    kiln_import_options io = {.weight_dtype = opt->weight_dtype, .allow_unused = opt->allow_unused,
                              .n_allow_unused = opt->n_allow_unused};
    if ((st = check_tp(&ck, opt->tp, err)) != KILN_OK) goto out;
    if ((opt->quant && opt->quant != KILN_QUANT_AUTO && !kiln_dtype_is_quant(opt->quant)) ||
        (opt->quant_head && !kiln_dtype_is_quant(opt->quant_head)) ||
        (opt->quant_embedding && !kiln_dtype_is_quant(opt->quant_embedding))) {
        st = kiln_err(err, KILN_ERR_INVALID_ARG, "quant %d / quant_head %d / quant_embedding %d: not quantized formats",
                      opt->quant, opt->quant_head, opt->quant_embedding);
        goto out;
    }
    if (ck.config.quant.method && opt->quant) {
        char how[48] = "FP8 E4M3";
        if (!ck.config.quant.fp8) snprintf(how, sizeof how, "4 bits, groups of %d", ck.config.quant.group_size);
        st = kiln_err(err, KILN_ERR_INVALID_ARG, "%s: --quant with a checkpoint that is already quantized "
                      "(quantization_config: %s, %s)", ckpt_dir, kiln_ckpt_quant_name(&ck.config.quant), how);
        kiln_err_hint(err, "compile it without --quant: its projections are read as they are");
        goto out;
    }
    /* --quant with --tp: each rank's shard of a matrix is quantized as that rank's matrix (its rows, or for a
     * row-parallel one its columns of each row). Not yet: matrices that come quantized (they would be
     * repacked shard by shard), --quant auto (its measurements are of the whole model) and --awq. */
    if ((ck.config.quant.method || opt->quant == KILN_QUANT_AUTO || opt->awq) && opt->tp > 1) {
        st = kiln_err(err, KILN_ERR_UNSUPPORTED, "%s with --tp %d: not supported yet",
                      ck.config.quant.method ? "a quantized checkpoint" : opt->awq ? "--awq" : "--quant auto", opt->tp);
        kiln_err_hint(err, ck.config.quant.method ? "compile it without --tp, or from its unquantized checkpoint with "
                                                    "--quant and --tp"
                                                  : "give one format (--quant int8|fp8|int4) with --tp");
        goto out;
    }
    if (opt->kv_dtype && opt->kv_dtype != KILN_FLAG_KV_FP8 && opt->kv_dtype != KILN_FLAG_KV_INT8) {
        st = kiln_err(err, KILN_ERR_INVALID_ARG, "kv_dtype 0x%x: not KILN_FLAG_KV_FP8 or KILN_FLAG_KV_INT8", opt->kv_dtype);
        goto out;
    }
    if ((opt->kv_bf16 && opt->kv_dtype) || (opt->kv_scales && !opt->kv_dtype)) { /* neither silently ignored */
        st = kiln_err(err, KILN_ERR_INVALID_ARG, "%s", opt->kv_bf16 ? "kv_bf16 with kv_dtype: give one KV cache type"
                                                                    : "kv_scales without kv_dtype (fp8 or int8)");
        goto out;
    }
    if (opt->awq && !opt->quant) {
        st = kiln_err(err, KILN_ERR_INVALID_ARG, "--awq needs --quant (the format its scales are searched for)");
        goto out;
    }
    /* --awq first: with --quant auto, the formats are measured on the scaled model */
    if (opt->awq && (st = kiln_quant_awq_run(ckpt_dir, opt, &aw, err)) != KILN_OK) goto out;
    if (opt->quant == KILN_QUANT_AUTO) {
        kiln_compile_options o = *opt;
        if (opt->awq) o.awq_scales = &aw;
        if ((st = kiln_quant_auto_run(ckpt_dir, &o, &qa, err)) != KILN_OK) goto out;
    }
    /* the KV cache: --kv-dtype's codes; a compressed-tensors kv_cache_scheme's FP8 ones with its own scales
     * unless --kv-dtype bf16 (its k_scale / v_scale are then read and checked, not applied) */
    const bool kv_ckpt = ck.config.quant.kv_fp8 && !opt->kv_bf16 && !opt->kv_scales;
    if (ck.config.quant.kv_fp8 && opt->kv_dtype == KILN_FLAG_KV_INT8) {
        st = kiln_err(err, KILN_ERR_INVALID_ARG, "%s: --kv-dtype int8, but the checkpoint's kv_cache_scheme gives FP8 "
                      "KV scales", ckpt_dir);
        kiln_err_hint(err, "compile it without --kv-dtype (or --kv-dtype fp8) to use them, or with --kv-dtype bf16");
        goto out;
    }
    const uint32_t kv_flag = kv_ckpt ? KILN_FLAG_KV_FP8 : opt->kv_bf16 ? 0 : opt->kv_dtype;
    if (kv_flag && !kv_ckpt && !opt->kv_scales && (st = kiln_kv_calib_run(ckpt_dir, opt, &kvc, err)) != KILN_OK)
        goto out;
    if ((st = kiln_import_ex(&ck, &io, &g, err)) != KILN_OK) goto out;
    const kiln_quant_awq *scales = opt->awq ? &aw : opt->awq_scales;
    if (scales && (st = kiln_quant_awq_apply(scales, g, err)) != KILN_OK) goto out;
    g->tp_request = opt->tp;
    g->quant_weights = opt->quant == KILN_QUANT_AUTO || opt->awq_dense ? 0 : opt->quant;
    g->quant_picks = qa.picks;
    g->n_quant_picks = qa.n_picks;
    g->quant_head = opt->quant_head;
    g->quant_embedding = opt->quant_embedding;
    g->quant_method = opt->quant_method;
    g->kv_flag = kv_flag;
    const float *kv_given = opt->kv_scales ? opt->kv_scales : kv_ckpt ? g->kv_ckpt_scales : NULL;
    if (kv_given && kv_flag) { /* given, or the checkpoint's: as bf16 values too (kiln_kv_scale_for) */
        const size_t n = (size_t)ck.config.n_layers * 2 * (size_t)ck.config.n_kv_heads;
        if (!(kvc.scales = malloc(n * sizeof *kvc.scales))) {
            st = kiln_err(err, KILN_ERR_NOMEM, "out of memory");
            goto out;
        }
        for (size_t i = 0; i < n; i++) {
            kvc.scales[i] = kiln_kv_scale_bf16(kv_given[i]);
            if (!(kvc.scales[i] > 0) || !isfinite(kvc.scales[i])) {
                st = kiln_err(err, KILN_ERR_INVALID_ARG, "kv_scales[%zu] = %g: scales must be positive and finite", i,
                              kv_given[i]);
                goto out;
            }
        }
    }
    g->kv_scales = kvc.scales;
    if ((st = kiln_passes_run(g, opt->passes, opt->dump_ir ? (FILE *)opt->dump_stream : NULL, err)) != KILN_OK)
        goto out;
    if ((st = kiln_plan_serialize(g, &plan, err)) != KILN_OK) goto out;
    if (ck.tokenizer_json_path) {
        if ((st = kiln_tokjson_compile_for_vocab(ck.tokenizer_json_path, ck.tokenizer_config_path,
                                                 ck.config.vocab_size, &tok, err)) != KILN_OK ||
            (st = check_gen_ids_in_tokenizer(&ck, have_gen ? &gen : NULL, &tok, err)) != KILN_OK)
            goto out;
        have_tok = true;
    }
    /* the chat template, checked now so the runtime never meets one it cannot render */
    if (!opt->no_chat_template && ck.tokenizer_json_path &&
        (st = kiln_chat_compile(ckpt_dir, ck.tokenizer_config_path, &chat, &have_chat, err)) != KILN_OK)
        goto out;
    if ((st = kiln_engine_writer_open(opt->output_path, &w, err)) != KILN_OK) goto out;
    /* weights first: their size goes into the meta section */
    uint32_t codec = opt->compress ? KILN_CODEC_ZSTD_CHUNKED : KILN_CODEC_NONE;
    uint64_t wbytes = 0;
    if ((st = kiln_engine_writer_begin(w, KILN_SECTION_WEIGHTS, codec, err)) != KILN_OK) goto out;
    kiln_progress_phase(opt->progress, "weights", kiln_weights_size(g), "MB", 1e-6);
    kiln_engine_writer_set_progress(w, opt->progress);
    if ((st = kiln_weights_write(g, w, &wbytes, err)) != KILN_OK) goto out;
    kiln_engine_writer_set_progress(w, NULL);
    if ((st = kiln_engine_writer_end(w, err)) != KILN_OK) goto out;
    if ((st = kiln_engine_writer_section(w, KILN_SECTION_PLAN, KILN_CODEC_NONE, plan.data, plan.len, err)) != KILN_OK)
        goto out;
    if (targets.n_cubin + targets.n_ptx > 0) {
        /* the kernels are built from the plan exactly as the runtime will read it */
        if ((st = kiln_plan_parse(plan.data, plan.len, wbytes, &parsed, err)) != KILN_OK) goto out;
        const char *wwhy = NULL;
        int bad = kiln_kernels_unsupported_op(parsed), badw = kiln_kernels_unsupported_weight(parsed, &wwhy);
        if (bad < 0 && badw >= 0) { /* quantized weights in a form the GPU kernels do not read */
            const kiln_plan_weight *qw = &parsed->weights[badw];
            if (!opt->gpu_if_possible) {
                kiln_err(err, KILN_ERR_UNSUPPORTED, "weight '%s' is quantized (%s): %s, so --target %s cannot make a "
                         "kernels section for this engine", qw->name, kiln_dtype_name((kiln_dtype)qw->dtype), wwhy,
                         opt->targets);
                st = kiln_err_hint(err, "compile with --target none: the engine runs on the CPU executor");
                goto out;
            }
            snprintf(no_gpu, sizeof no_gpu, "weight '%s' is quantized (%s): %s", qw->name,
                     kiln_dtype_name((kiln_dtype)qw->dtype), wwhy);
            fprintf(stderr, "kiln compile: note: %s; the engine gets no GPU kernels and runs on the CPU only\n",
                    no_gpu);
            targets.n_cubin = targets.n_ptx = 0;
        } else if (bad >= 0) {
            const char *opn = kiln_op_name((kiln_op_kind)parsed->ops[bad].kind);
            if (!opt->gpu_if_possible) {
                kiln_err(err, KILN_ERR_UNSUPPORTED, "plan op %d (%s) has no GPU kernel yet, so --target %s cannot "
                         "make a kernels section for this model", bad, opn, opt->targets);
                st = kiln_err_hint(err, "compile with --target none: the engine runs on the CPU executor%s",
                                   opt->passes ? " (or with the default --passes, which fuse what the GPU runs)" : "");
                goto out;
            }
            snprintf(no_gpu, sizeof no_gpu, "plan op %d (%s) has no GPU kernel yet", bad, opn);
            fprintf(stderr, "kiln compile: note: %s; the engine gets no GPU kernels and runs on the CPU only\n",
                    no_gpu);
            targets.n_cubin = targets.n_ptx = 0;
        } else if (opt->gpu_if_possible) {
            /* the default targets: a model whose constants the kernels do not take (a head_dim...) gets a
             * CPU-only engine too, with the reason; asked-for targets give the error below */
            kiln_kernel_modules mods;
            kiln_error why = {0};
            if (kiln_kernels_modules(parsed, opt->kv_block_size, &mods, &why) == KILN_ERR_UNSUPPORTED) {
                snprintf(no_gpu, sizeof no_gpu, "%s", why.msg);
                fprintf(stderr, "kiln compile: note: %s; the engine gets no GPU kernels and runs on the CPU only\n",
                        no_gpu);
                targets.n_cubin = targets.n_ptx = 0;
            }
            kiln_kernel_modules_free(&mods);
        }
    }
    if (targets.n_cubin + targets.n_ptx > 0) {
        kiln_kernels_opts ko = {.threads = opt->threads, .kv_block_size = opt->kv_block_size,
                                .progress = opt->progress};
        if ((st = kiln_kernels_build(parsed, &targets, &ko, &kernels, err)) != KILN_OK ||
            (st = kiln_engine_writer_section(w, KILN_SECTION_KERNELS, KILN_CODEC_NONE, kernels.data, kernels.len,
                                             err)) != KILN_OK)
            goto out;
    }
    kiln_progress_phase(opt->progress, "write", 0, NULL, 0);
    if (have_tok &&
        (st = kiln_engine_writer_section(w, KILN_SECTION_TOKENIZER, KILN_CODEC_NONE, tok.data, tok.len, err)) !=
            KILN_OK)
        goto out;
    if (have_chat &&
        (st = kiln_engine_writer_section(w, KILN_SECTION_CHAT, KILN_CODEC_NONE, chat.data, chat.len, err)) != KILN_OK)
        goto out;
    json_t *meta = make_meta(&ck, g, opt, have_gen ? &gen : NULL, wbytes, have_tok ? &tok : NULL, &targets, no_gpu,
                             qa.report, aw.report);
    if (meta && kv_flag) /* the KV cache's codes and where their scales came from */
        json_object_set_new(
            json_object_get(meta, "build"), "kv_cache",
            json_pack("{s:s, s:s, s:O*}", "dtype", kv_flag == KILN_FLAG_KV_INT8 ? "int8" : "fp8", "scales",
                      opt->kv_scales ? "given (kiln_compile_options.kv_scales)"
                      : kv_ckpt && ck.config.quant.kv_per_head
                          ? "the checkpoint's (compressed-tensors kv_cache_scheme attn_head: k_scale and v_scale per kv "
                            "head of each layer), as bf16 values rounded up"
                      : kv_ckpt ? "the checkpoint's (compressed-tensors kv_cache_scheme: k_scale and v_scale per layer), "
                                  "as bf16 values rounded up"
                      : kv_flag == KILN_FLAG_KV_INT8
                          ? "per kv head of each layer, K and V: the calibration's largest |x| / 127"
                          : "per kv head of each layer, K and V: the calibration's largest |x| / 224",
                      "calibration", kvc.report));
    if (meta && qa.report) {
        /* the choice counted each matrix padded to its alignment: exact, or over when a projection is the
         * last weight; more would break the budget, a bug never shipped */
        const uint64_t counted = (uint64_t)json_integer_value(json_object_get(qa.report, "weight_bytes"));
        if (wbytes > counted) {
            st = kiln_err(err, KILN_ERR_INTERNAL, "--quant auto: the weights take %llu bytes, the choice counted "
                          "%llu", (unsigned long long)wbytes, (unsigned long long)counted);
            json_decref(meta);
            goto out;
        }
        const double bpw = json_real_value(json_object_get(qa.report, "bits_per_weight"));
        json_object_set_new(qa.report, "weight_bytes", json_integer((json_int_t)wbytes));
        json_object_set_new(qa.report, "bits_per_weight", json_real(bpw * (double)wbytes / (double)counted));
    }
    if (meta && opt->quant_report) {
        json_t *q = json_object_get(json_object_get(meta, "build"), "quant");
        *opt->quant_report = q ? json_dumps(q, JSON_SORT_KEYS | JSON_COMPACT) : NULL;
    }
    meta_text = meta ? json_dumps(meta, JSON_SORT_KEYS | JSON_INDENT(1)) : NULL;
    json_decref(meta);
    if (!meta_text) {
        st = kiln_err(err, KILN_ERR_NOMEM, "out of memory writing the meta section");
        goto out;
    }
    if ((st = kiln_engine_writer_section(w, KILN_SECTION_META, KILN_CODEC_NONE, meta_text, strlen(meta_text),
                                         err)) != KILN_OK)
        goto out;
    st = kiln_engine_writer_finish(w, err);
    w = NULL;
out:
    kiln_engine_writer_abort(w);
    free(meta_text);
    kiln_buf_free(&plan);
    kiln_buf_free(&tok);
    kiln_buf_free(&chat);
    kiln_buf_free(&kernels);
    kiln_plan_free(parsed);
    kiln_graph_free(g);
    kiln_quant_auto_free(&qa);
    kiln_quant_awq_free(&aw);
    kiln_kv_calib_free(&kvc);
    kiln_checkpoint_close(&ck);
    return st;
}
