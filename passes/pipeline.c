/*
 * pipeline.c — the pass pipeline: one flat list, run in order, verifier
 * after each pass.
 */
#include "kiln_passes.h"

#include <string.h>

/* Every pass, in the default pipeline's order; `--passes` runs the ones it names in the order given. */
static const kiln_pass pipeline[] = {
    {"fold-permute-into-rows", "permute(silu(gate(x)) * up(x)) → the same over gate's and up's rows in that order "
                               "(act-order GPTQ's down_proj input: no gather)",
     kiln_pass_fold_permute_into_rows, true, false},
    {"fuse-add-rmsnorm", "residual add followed by RMSNorm → add_rmsnorm (both results)", kiln_pass_fuse_add_rmsnorm,
     true, false},
    {"fuse-qkv-rope", "q/k/v projections of one input + RoPE on q and k → qkv_rope", kiln_pass_fuse_qkv_rope, true, false},
    {"fuse-gate-up-swiglu", "silu(gate(x)) * up(x) → gate_up_swiglu", kiln_pass_fuse_gate_up_swiglu, true, false},
    {"fuse-linear-residual", "add_rmsnorm(linear(h), r) → rmsnorm(linear_add(h, W, r)): the projection adds into "
                             "the residual stream",
     kiln_pass_fuse_linear_residual, true, false},
    {"fold-permute-into-norm", "permute(rmsnorm(x)) → the norm writes its output in that order itself (+out_perm: "
                               "act-order GPTQ's q/k/v and gate/up input, no gather)",
     kiln_pass_fold_permute_into_norm, true, false},
    {"pack-weights", "qkv_rope and gate_up_swiglu weights into the GPU's layout at compile time: [Wq; Wk; Wv] and "
                     "gate/up rows interleaved (the _packed ops)",
     kiln_pass_pack_weights, true, false},
    {"decode-attention-rope", "attention after qkv_rope rotates q, k and writes the KV cache itself at decode "
                              "(+decode_rope)",
     kiln_pass_decode_attention_rope, true, false},
    {"decode-attention-merge", "attention's last split block merges the splits at decode (+merge_splits; measured "
                               "slower on the H200)",
     kiln_pass_decode_attention_merge, false, false},
    {"fold-norm-into-gemv", "an RMSNorm read only by the next projection is done in its GEMV prologue at decode "
                            "(+fold_into_gemv; drops HF's bf16 rounding of the normed input)",
     kiln_pass_fold_norm_into_gemv, false, false},
    {"fold-norm-into-ck-gemv", "after quantize: an RMSNorm read only by the next projection, whose matrices are "
                               "q4 or fp8, is done in its one-token GEMV (warps splitting K) at one-token steps "
                               "(+fold_into_gemv +one_token)",
     kiln_pass_fold_norm_into_ck_gemv, true, true},
    {"w8a8", "after quantize: a projection whose matrices are fp8 / fp8g128 quantizes its input to E4M3 per "
             "token at steps past the quantized GEMV and multiplies the codes (+act_fp8)",
     kiln_pass_w8a8, true, true},
    {"w8a8-fast-accum", "after w8a8: a W8A8 projection over fp8 matrices (a scale a row) accumulates its GPU "
                        "GEMMs with FP8 fast accumulation, partial sums not promoted to fp32 (+fast_accum)",
     kiln_pass_w8a8_fast_accum, true, true},
    {"swiglu-out-fp8", "after w8a8: a SwiGLU read only by the next projection, a W8A8 one over fp8 matrices, "
                       "writes that projection's E4M3 codes and scales itself at its W8A8 steps (+out_fp8)",
     kiln_pass_swiglu_out_fp8, true, true},
    {"norm-out-fp8", "after w8a8: an RMSNorm read only by the next projection, a W8A8 one over fp8 matrices, "
                     "writes that projection's E4M3 codes and scales itself at its W8A8 steps (+out_fp8)",
     kiln_pass_norm_out_fp8, true, true},
    {"dce", "drop ops and weights nothing uses", kiln_pass_dce, true, false},
};

/* Run before the list when --tp N > 1: the fusions then work on one rank's graph. */
static const kiln_pass tp_pass = {"tensor-parallel", "split over --tp N ranks: q/k/v, gate/up by rows (heads, KV heads "
                                                     "among ranks), o_proj, down_proj by columns + all_reduce, "
                                                     "embedding and LM head by vocabulary + all_reduce / all_gather",
                                  kiln_pass_tensor_parallel, false, false};

const kiln_pass *kiln_pass_tensor_parallel_entry(void) { return &tp_pass; }

static const kiln_pass quant_pass = {"quantize", "the projections' matrices (and the LM head's) to the --quant "
                                                 "formats (q8, q4gG): round to nearest per row or group",
                                     kiln_pass_quantize, false, false};

static const kiln_pass kv_pass = {"quantize-kv", "the KV cache in 8 bits (--kv-dtype fp8|int8): attention gets "
                                                 "+kv_fp8 or +kv_int8 and its layer's calibrated scales per kv head",
                                  kiln_pass_quantize_kv, false, false};

static const kiln_pass memory_pass = {"plan-memory", "assign activation buffers by lifetime", kiln_pass_plan_memory,
                                      true, false};

const kiln_pass *kiln_passes_default(int *n) {
    *n = (int)(sizeof pipeline / sizeof pipeline[0]);
    return pipeline;
}

const kiln_pass *kiln_pass_find(const char *name) {
    for (size_t i = 0; i < sizeof pipeline / sizeof pipeline[0]; i++)
        if (strcmp(pipeline[i].name, name) == 0) return &pipeline[i];
    return NULL;
}

static kiln_status run_one(kiln_graph *g, const kiln_pass *p, FILE *dump, kiln_error *err) {
    int n = p->run(g, err);
    if (n < 0) return kiln_err_prefix(err, "pass %s: ", p->name);
    kiln_status st = kiln_ir_verify(g, err);
    if (st != KILN_OK) return kiln_err_prefix(err, "after pass %s: ", p->name);
    if (dump) {
        fprintf(dump, "\n;; after %s (%d rewrites)\n", p->name, n);
        kiln_ir_print(g, dump);
    }
    return KILN_OK;
}

#define PASS_LIST_MAX 512

/* "unknown pass" with the list of passes as the hint. */
static kiln_status unknown_pass(const char *name, size_t len, kiln_error *err) {
    kiln_err(err, KILN_ERR_INVALID_ARG, "--passes: unknown pass '%.*s'", (int)len, name);
    char names[512] = "";
    for (size_t i = 0; i < sizeof pipeline / sizeof pipeline[0]; i++) {
        strncat(names, i ? ", " : "", sizeof names - strlen(names) - 1);
        strncat(names, pipeline[i].name, sizeof names - strlen(names) - 1);
    }
    return kiln_err_hint(err, "passes are: %s (or 'none')", names);
}

kiln_status kiln_passes_check(const char *list, kiln_error *err) {
    if (!list || strcmp(list, "") == 0 || strcmp(list, "none") == 0) return KILN_OK;
    if (strlen(list) >= PASS_LIST_MAX)
        return kiln_err(err, KILN_ERR_INVALID_ARG, "--passes: the list is longer than %d characters", PASS_LIST_MAX - 1);
    for (const char *p = list; *p;) {
        size_t len = strcspn(p, ",");
        if (len == 0) {
            kiln_err(err, KILN_ERR_INVALID_ARG, "--passes '%s': an empty item", list);
            return kiln_err_hint(err, "give pass names separated by single commas, or 'none'");
        }
        char name[PASS_LIST_MAX];
        memcpy(name, p, len);
        name[len] = 0;
        if (!kiln_pass_find(name)) return unknown_pass(p, len, err);
        p += len;
        if (*p == ',' && !*++p) {
            kiln_err(err, KILN_ERR_INVALID_ARG, "--passes '%s': a trailing comma", list);
            return kiln_err_hint(err, "give pass names separated by single commas, or 'none'");
        }
    }
    return KILN_OK;
}

/* The passes of `list` (checked; NULL = the default pipeline) whose after_quantize is `late`, in order. */
static kiln_status run_list(kiln_graph *g, const char *list, bool late, FILE *dump, kiln_error *err) {
    kiln_status st = KILN_OK;
    if (!list) {
        for (size_t i = 0; i < sizeof pipeline / sizeof pipeline[0] && st == KILN_OK; i++)
            if (pipeline[i].in_default && pipeline[i].after_quantize == late) st = run_one(g, &pipeline[i], dump, err);
    } else if (strcmp(list, "") != 0 && strcmp(list, "none") != 0) {
        char buf[PASS_LIST_MAX];
        snprintf(buf, sizeof buf, "%s", list); /* fits: checked by kiln_passes_check */
        char *save = NULL;
        for (char *name = strtok_r(buf, ",", &save); name && st == KILN_OK; name = strtok_r(NULL, ",", &save)) {
            const kiln_pass *p = kiln_pass_find(name);
            if (p->after_quantize == late) st = run_one(g, p, dump, err);
        }
    }
    return st;
}

kiln_status kiln_passes_run(kiln_graph *g, const char *list, FILE *dump, kiln_error *err) {
    kiln_status st = kiln_passes_check(list, err);
    if (st != KILN_OK) return st;
    if ((st = kiln_ir_verify(g, err)) != KILN_OK) return kiln_err_prefix(err, "imported graph: ");
    if (dump) {
        fprintf(dump, ";; imported\n");
        kiln_ir_print(g, dump);
    }
    if (g->tp_request > 1 && (st = run_one(g, &tp_pass, dump, err)) != KILN_OK) return st;
    if ((st = run_list(g, list, false, dump, err)) != KILN_OK) return st;
    if ((g->quant_weights || g->quant_head || g->quant_embedding || g->n_quant_picks) && (st = run_one(g, &quant_pass, dump, err)) != KILN_OK)
        return st;
    if ((st = run_list(g, list, true, dump, err)) != KILN_OK) return st;
    if (g->kv_flag && (st = run_one(g, &kv_pass, dump, err)) != KILN_OK) return st;
    return run_one(g, &memory_pass, dump, err);
}
