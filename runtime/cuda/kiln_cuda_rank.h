/*
 * kiln_cuda_rank.h — one rank of a tensor-parallel engine: the CUDA
 * executor (exec.c) in the pieces the TP driver (tp.c) runs together.
 *
 * A plan of N ranks (kiln compile --tp N) is SPMD: every rank runs the same
 * program on its own weight shards, its KV heads and its device, and the
 * collectives (all_reduce, all_gather) join the ranks. The driver makes one
 * executor per rank (kiln_cx_new: rank r's weights, kernels, scratch; the
 * KV pool after, so that every rank gets the same block count), and runs a
 * step as: kiln_cx_step_begin on every rank (checks, KV blocks, the inputs
 * copied up); then, segment by segment, kiln_cx_run on every rank up to the
 * next collective, which the driver runs across the ranks (NCCL, or
 * kiln_cx_tp_sum for ranks on one device) from kiln_cx_coll's description;
 * kiln_cx_sample on rank 0; kiln_cx_step_end on every rank (ids copied back
 * on rank 0, the `done` event), and, once every rank's event has completed,
 * kiln_cx_step_finish. Everything a rank enqueues goes to its stream
 * (ranks on one device share rank 0's), so the same sequence captured on
 * each stream is a CUDA graph per rank.
 *
 * Internal to the runtime's CUDA layer.
 */
#ifndef KILN_CUDA_RANK_H
#define KILN_CUDA_RANK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../../kernels/params.cuh"
#include "../kiln_cuda.h"
#include "kiln_cuda_exec.h"

typedef struct cx kiln_cx;

#define KILN_TP_LOCAL_RANKS 8 /* ranks on one device kiln_cx_tp_sum adds (KILN_TP_LOCAL_MAX, kernels/params.cuh) */

/* The shape of a step as the program runs it. */
typedef struct kiln_cx_shape {
    int T, B;    /* token rows, sequences (both padded in a graph) */
    bool decode; /* every sequence adds one token: T == B, row i is sequence i's token */
    int max_q;   /* most new tokens of one sequence */
    bool graph;  /* a decode step that runs as a CUDA graph (B is its bucket) */
    int n_dec;   /* the leading sequences that add one token each (rows 0..n_dec-1; all B at a decode step) */
} kiln_cx_shape;

/* A collective of the program, on one rank. */
typedef struct kiln_cx_coll_desc {
    int op;            /* plan op, for messages */
    bool gather;       /* all_gather of the logits: in [rows, width] f32 slices, out [rows, out_width] on rank 0,
                          tmp [n_ranks, rows, width] for NCCL's gather; else all_reduce (sum) of in into out
                          [rows, width] (the same buffer when in place) */
    CUdeviceptr in, out, tmp;
    int rows, width, out_width;
    bool f32;          /* elements are fp32 (else bf16) */
} kiln_cx_coll_desc;

/* The multi-rank executor (tp.c), which kiln_cuda_executor_new returns for a plan of several ranks. */
kiln_status kiln_cuda_tp_new(const kiln_model *m, const kiln_cuda_exec_opts *o, kiln_executor **out,
                             kiln_error *err);
/* Rank `rank`'s executor of a multi-rank executor (NULL for any other executor or rank). */
kiln_executor *kiln_cuda_tp_rank(kiln_executor *e, int rank);
/* The same rank as the pieces below take (NULL likewise). */
kiln_cx *kiln_cuda_tp_cx(kiln_executor *e, int rank);

kiln_status kiln_cx_new(const kiln_model *m, const kiln_cuda_exec_opts *o, int rank, int device, CUstream stream,
                        kiln_cx **out, kiln_error *err);
/* The KV blocks this rank's device can give it now, with `share` ranks on that device. */
kiln_status kiln_cx_kv_fit(kiln_cx *x, const kiln_cuda_exec_opts *o, int share, int64_t *blocks, kiln_error *err);
kiln_status kiln_cx_kv_alloc(kiln_cx *x, int64_t blocks, kiln_error *err);
void kiln_cx_destroy(kiln_cx *x);

kiln_executor *kiln_cx_executor(kiln_cx *x);
kiln_cuda *kiln_cx_cuda(kiln_cx *x);
CUstream kiln_cx_stream(const kiln_cx *x);
CUevent kiln_cx_done(const kiln_cx *x);
int kiln_cx_program_size(const kiln_cx *x);
bool kiln_cx_uses_graphs(const kiln_cx *x);
int kiln_cx_bucket(const kiln_cx *x, int n);
/* Time the cuBLASLt algorithms of batch B's decode GEMMs (before its graph is captured). */
void kiln_cx_tune_decode(kiln_cx *x, int B);

kiln_status kiln_cx_step_begin(kiln_cx *x, const kiln_step *s, kiln_cx_shape *sh, kiln_error *err);
/* The program from instruction `from` up to the next collective (*stop) or its end (*stop = program size). */
kiln_status kiln_cx_run(kiln_cx *x, const kiln_cx_shape *sh, int from, int *stop, kiln_error *err);
void kiln_cx_coll(const kiln_cx *x, int i, const kiln_cx_shape *sh, kiln_cx_coll_desc *d);
/* Profiling events around collective i (no-op unless profiling). */
void kiln_cx_mark(kiln_cx *x, int i, bool after);
/* out[r] = sum of in[0..n_ranks) (n elements each) for every r, on x's stream: ranks on one device. */
kiln_status kiln_cx_tp_sum(kiln_cx *x, const CUdeviceptr *in, const CUdeviceptr *out, int n_ranks, size_t n,
                           bool f32, kiln_error *err);
/* Bytes per token row of the widest all-reduce of the program. */
size_t kiln_cx_widest_collective(const kiln_cx *x);
/* kiln_tp_oneshot on x's stream (the caller fills every rank's pointers). */
kiln_status kiln_cx_tp_oneshot(kiln_cx *x, const kiln_tp_oneshot_params *prm, kiln_error *err);
kiln_status kiln_cx_sample(kiln_cx *x, const kiln_cx_shape *sh, kiln_error *err);
kiln_status kiln_cx_step_end(kiln_cx *x, int n, bool sampled, kiln_error *err);
kiln_status kiln_cx_step_finish(kiln_cx *x, const kiln_step *s, const kiln_cx_shape *sh, bool sampled,
                                kiln_error *err);

#endif /* KILN_CUDA_RANK_H */
