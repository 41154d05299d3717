/*
 * kiln_passes.h — rewrites on the IR. Each pass takes a verified graph and
 * leaves a verified graph; the pipeline runs the verifier after every pass.
 *
 * The pipeline is one flat, named list (pipeline.c). `kiln compile --passes`
 * selects a subset by name, which is how tests check that each pass keeps
 * the numbers the CPU executor produces.
 */
#ifndef KILN_PASSES_H
#define KILN_PASSES_H

#include <stdbool.h>
#include <stdio.h>

#include "../ir/kiln_ir.h"

/* A pass returns the number of rewrites it made (>= 0), or -1 with err set. */
typedef int (*kiln_pass_fn)(kiln_graph *g, kiln_error *err);

typedef struct kiln_pass {
    const char *name;
    const char *contract; /* one line: what it does */
    kiln_pass_fn run;
    bool in_default;      /* part of the default pipeline (else only by name in --passes) */
    bool after_quantize;  /* runs after quantize (it reads the matrices' formats), wherever it is listed */
} kiln_pass;

/* Helpers the passes share (passes/fuse.c). The next live op after op i when it is a projection whose
 * input is op i's first output and nothing else reads that output (a fold or a handed-on format can go
 * from op i into it); NULL otherwise, or when op i is dead. */
const kiln_op *kiln_pass_sole_projection(const kiln_graph *g, int i);
/* Whether ok(dtype) holds for every matrix projection op multiplies by (kiln_op_matrices). */
bool kiln_pass_matrices_are(const kiln_graph *g, const kiln_op *op, int (*ok)(int dtype));

int kiln_pass_fuse_add_rmsnorm(kiln_graph *g, kiln_error *err);
int kiln_pass_fuse_qkv_rope(kiln_graph *g, kiln_error *err);
int kiln_pass_fuse_gate_up_swiglu(kiln_graph *g, kiln_error *err);
int kiln_pass_fold_permute_into_rows(kiln_graph *g, kiln_error *err);
int kiln_pass_fold_permute_into_norm(kiln_graph *g, kiln_error *err);
int kiln_pass_fuse_linear_residual(kiln_graph *g, kiln_error *err);
int kiln_pass_pack_weights(kiln_graph *g, kiln_error *err);
int kiln_pass_decode_attention_rope(kiln_graph *g, kiln_error *err);
int kiln_pass_decode_attention_merge(kiln_graph *g, kiln_error *err);
int kiln_pass_fold_norm_into_gemv(kiln_graph *g, kiln_error *err);
int kiln_pass_fold_norm_into_ck_gemv(kiln_graph *g, kiln_error *err);
int kiln_pass_dce(kiln_graph *g, kiln_error *err);
/* quantize: the matrices of the projections (and the LM head's) to kiln_graph.quant_weights
 * (.quant_head); runs after the list whenever either is set (passes/quantize.c) */
int kiln_pass_quantize(kiln_graph *g, kiln_error *err);
/* w8a8 (default, after quantize): +act_fp8 on every projection whose matrices are all fp8 / fp8g128 */
int kiln_pass_w8a8(kiln_graph *g, kiln_error *err);
int kiln_pass_w8a8_fast_accum(kiln_graph *g, kiln_error *err);
int kiln_pass_swiglu_out_fp8(kiln_graph *g, kiln_error *err);
int kiln_pass_norm_out_fp8(kiln_graph *g, kiln_error *err);
/* quantize-kv (--kv-dtype): every attention op gets kiln_graph.kv_flag and its layer's kv_scale weight
 * (from kiln_graph.kv_scales) as its fifth input. */
int kiln_pass_quantize_kv(kiln_graph *g, kiln_error *err);
int kiln_pass_plan_memory(kiln_graph *g, kiln_error *err);
/* Split the graph over g->tp_request ranks (tensor_parallel.c); a no-op when it is 0 or 1. */
int kiln_pass_tensor_parallel(kiln_graph *g, kiln_error *err);
/* The tensor-parallel pass's entry (for --help): run first, before the list, when --tp N > 1. */
const kiln_pass *kiln_pass_tensor_parallel_entry(void);

/* ---- --quant auto's choice (passes/quant_choose.c) ----
 * A multiple-choice knapsack: each item (a projection matrix) takes exactly one of its options (a
 * format: keep, q8, q4g32...), each with the bytes it would take and the damage it was measured to
 * do; the choice minimises the summed damage with the summed bytes at most the budget. Solved
 * exactly by dynamic programming over bytes counted in units (each option's bytes rounded up to
 * whole units, the budget down, so the budget always holds); the unit is at least `unit` and
 * grown so that the table stays under about 64 M entries. */
#define KILN_QUANT_OPTIONS 8
typedef struct kiln_quant_item {
    int n;                                /* options, 1..KILN_QUANT_OPTIONS */
    uint64_t bytes[KILN_QUANT_OPTIONS];   /* what each option takes in the weights section */
    double damage[KILN_QUANT_OPTIONS];    /* what it was measured to cost (>= 0; here mean KL, nats) */
} kiln_quant_item;

/* pick[i] = the option item i takes. KILN_ERR_INVALID_ARG when even the smallest options together
 * exceed `budget` (*min_bytes says how much they take, set in every case). A budget that the
 * smallest options fit but the unit's rounding does not gets the smallest options. */
kiln_status kiln_quant_choose(const kiln_quant_item *items, int n_items, uint64_t budget, uint64_t unit, int *pick,
                              uint64_t *min_bytes, kiln_error *err);

/* Every pass, in pipeline order (those with in_default make the default pipeline). */
const kiln_pass *kiln_passes_default(int *n);
/* Look a pass up by name; NULL when unknown. */
const kiln_pass *kiln_pass_find(const char *name);
/* Check a --passes list before any work: every name known, no empty item
 * ("a,,b", "a,"), not overlong. NULL, "" and "none" are fine. */
kiln_status kiln_passes_check(const char *list, kiln_error *err);

/* Run tensor-parallel first when g->tp_request > 1, then the passes named in
 * `list` (comma-separated; NULL = the default pipeline, "" or "none" = none)
 * and then memory planning, which every plan needs. The verifier runs after each pass. When `dump` is non-NULL the graph
 * is printed before the first pass and after each one. */
kiln_status kiln_passes_run(kiln_graph *g, const char *list, FILE *dump, kiln_error *err);

#endif /* KILN_PASSES_H */
