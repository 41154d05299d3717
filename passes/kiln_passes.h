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
} kiln_pass;

int kiln_pass_fuse_add_rmsnorm(kiln_graph *g, kiln_error *err);
int kiln_pass_fuse_qkv_rope(kiln_graph *g, kiln_error *err);
int kiln_pass_fuse_gate_up_swiglu(kiln_graph *g, kiln_error *err);
int kiln_pass_fuse_linear_residual(kiln_graph *g, kiln_error *err);
int kiln_pass_pack_weights(kiln_graph *g, kiln_error *err);
int kiln_pass_decode_attention_rope(kiln_graph *g, kiln_error *err);
int kiln_pass_decode_attention_merge(kiln_graph *g, kiln_error *err);
int kiln_pass_fold_norm_into_gemv(kiln_graph *g, kiln_error *err);
int kiln_pass_dce(kiln_graph *g, kiln_error *err);
int kiln_pass_plan_memory(kiln_graph *g, kiln_error *err);
/* Split the graph over g->tp_request ranks (tensor_parallel.c); a no-op when it is 0 or 1. */
int kiln_pass_tensor_parallel(kiln_graph *g, kiln_error *err);
/* The tensor-parallel pass's entry (for --help): run first, before the list, when --tp N > 1. */
const kiln_pass *kiln_pass_tensor_parallel_entry(void);

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
