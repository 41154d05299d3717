/*
 * kiln_cuda_exec.h — the CUDA executor: a kiln_executor (kiln_exec.h, ops
 * "cuda") that runs an engine's plan on one GPU with the kernels of the
 * engine's kernels section.
 *
 *   weights     uploaded once at creation, streamed from the weights section
 *               through pinned buffers by several threads; bf16 on the
 *               device (f16 and f32 weights converted) unless every weight
 *               is f32, which runs an fp32 path (the f32 kernels and
 *               cuBLASLt in strict fp32, no TF32). Wq/Wk/Wv are stored as
 *               one matrix per layer, Wgate/Wup as one with their rows
 *               interleaved (the GEMV's fused SwiGLU epilogue reads pairs).
 *   KV cache    paged (kiln_kvpool.h): a pool of blocks sized by kv_bytes
 *               or kv_fraction of the free device memory; `reserve` answers
 *               from it; a sliding-window model returns blocks that fell
 *               out of the window.
 *   step        embeddings, per layer RMSNorm (+ residual), QKV projection,
 *               RoPE + KV write, attention (decode kernel when every
 *               sequence adds one token, prefill kernel otherwise),
 *               o_proj + residual, gate/up + SwiGLU, down + residual; final
 *               norm, LM head on each sequence's last token only, sampling
 *               on the GPU (runtime/sampler.c's rule). GEMV kernels up to 8
 *               tokens per step, cuBLASLt above.
 *   graphs      decode steps are captured once per batch-size bucket (1, 2,
 *               4, 8, 16, ...) as CUDA graphs and replayed; inputs are
 *               staged into fixed device buffers first.
 *
 * Memory: peak device memory = weights + KV pool + step scratch (activations
 * and scratch for max_step_tokens token rows, per-sequence buffers for
 * max_seqs, the cuBLASLt workspace); kiln_executor_info reports each part.
 *
 * Failures never abort: a device allocation that does not fit gives
 * KILN_ERR_NOMEM (or KILN_ERR_DEVICE) naming what did not fit and the free
 * memory; a plan op with no GPU kernel gives KILN_ERR_UNSUPPORTED naming it;
 * an engine without kernels for this GPU says which targets it has.
 */
#ifndef KILN_CUDA_EXEC_H
#define KILN_CUDA_EXEC_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "../kiln_exec.h"
#include "../kiln_rt.h"
#include "../../format/kiln_tuning.h"

typedef struct kiln_cuda_exec_opts {
    int max_seqs;        /* sequences at once (slots); 0 = 8 */
    int max_context;     /* tokens per sequence; 0 = the model's context */
    int max_step_tokens; /* new tokens per step, all sequences together (the activations and scratch are
                            sized for it); 0 = 8192, halved while its scratch would take more than a
                            quarter of the memory the weights and an explicit KV pool leave; at least
                            max_seqs. Weights + kv_bytes + scratch larger than the free memory is
                            refused (KILN_ERR_NOMEM naming each part) before any large allocation */
    int64_t kv_bytes;    /* KV pool in bytes; 0 = kv_fraction of the free device memory */
    double kv_fraction;  /* of the free device memory after weights and buffers; 0 = 0.9 */
    int block_size;      /* tokens per KV block; 0 = the engine's (its kernels are built for one size) */
    int device;          /* CUDA device ordinal (a plain engine; a tensor-parallel one: see devices) */
    /* Tensor-parallel engines (kiln compile --tp N): rank r runs on CUDA device devices[r]; n_devices is
     * 0 (ranks on devices device, device + 1, ...) or N. Every rank on a distinct device: NCCL joins them
     * (libnccl.so.2 loaded with dlopen); every rank on one device (for testing a tp engine on one GPU): an
     * in-process sum on that device. A plain engine takes a list of one (its GPU). */
    const int *devices;
    int n_devices;
    double tp_timeout_s; /* a tensor-parallel step not finished on every rank by then aborts every rank's
                            collectives and fails naming the rank (0 = 60 s) */
    int tp_oneshot;      /* measurement knob tp_oneshot: the one-shot collective kernel (kiln_tp_oneshot) between
                            ranks that can address each other's memory: 0 = auto (GPUs with peer access: all-reduces
                            up to 1 MiB and the logits' gather; NCCL above; ranks on one device: kiln_tp_sum on one
                            stream), 1 = never, 2 = every collective (ranks on one device get a stream each). The
                            C API's GPU kind passes 1 unless the knob asks (runtime/cuda/kind.c) */
    bool no_graphs;      /* run decode steps without CUDA graphs (for measuring their gain) */
    bool no_pdl;         /* launch kernels the ordinary way instead of with programmatic dependent
                            launch (which is used on sm_90+ unless this is set) */
    int threads;         /* host threads for the weight upload; 0 = one per core (at most 16) */
    /* Measurement knobs (`kiln bench --measure`, kiln_ctx_options.measure); 0 = the default */
    int gemv_max_m;      /* most tokens per step the tensor-core GEMV (KILN_GEMV_MAX_M) and the quantized one
                            (CX_QGEMV_MAX_M, exec.c) take before cuBLASLt; 0 = the engine's tuning record's
                            values, else those defaults */
    double attn_waves;   /* decode attention's splits aim for this many waves of the GPU (2) */
    int lt_tune;         /* cuBLASLt algorithms at decode: 1 = the heuristic's, 2 = timed (default), 3 = timed
                            and reported on stderr */
    bool profile;        /* time every instruction with CUDA events (no graphs): ops->profile reports */
    /* The engine's tuning record (format/kiln_tuning.h) gives the thresholds and cuBLASLt algorithms
     * for this GPU where it has one; these replace it (`kiln tune` sets them; knob recorded=0) */
    bool no_recorded;     /* use neither the record's algorithms nor its thresholds */
    int qgemv_max_m;      /* most tokens per step the quantized GEMV takes; 0 = gemv_max_m if set, else the record's
                             or CX_QGEMV_MAX_M */
    int rope_split_max_t; /* steps of at most this many tokens spread rope_kv over heads; 0 = the record's or 64 */
    bool no_qgemv_cc;    /* one-token steps over quantized weights keep the tensor-core GEMV (measure knob qgemv_cc=0) */
    bool no_qgemm;       /* steps of 17 to 64 rows over quantized weights keep the GEMV or dequantize (measure knob qgemm=0) */
    bool no_w8a8;        /* fp8 weights past the quantized GEMV: dequantize for a bf16 GEMM instead of quantizing the
                            activations per token for cuBLASLt's FP8 GEMM (measure knob w8a8=0) */
    bool no_w8a8_g128;   /* fp8g128 weights dequantize for a bf16 GEMM where fp8 ones run W8A8 (measure knob w8a8=1) */
    bool no_prefill_wg;  /* prefill attention keeps mma.sync where the engine has the wgmma kernel (measure knob
                            prefill_wg=0) */
    bool no_decode_tc;   /* decode attention keeps the CUDA-core kernel where the engine has the tensor-core one
                            (measure knob decode_tc=0) */
    bool decode_tc_all;  /* ... and takes the tensor-core one at every decode step, not from 80 sequences
                            (decode_tc=2) */
    int decode_tc_min;   /* ... from this many sequences a step (measure knob decode_tc_min, kiln tune
                            --decode-tc-min); 0 = the record's or CX_DECODE_TC_MIN (80) */
    bool no_w8a8_fast_accum; /* W8A8 GEMMs the plan marks +fast_accum promote their partial sums to fp32 all
                                the same (measure knob w8a8_fast=0, for A/B on one engine; docs/quantization.md) */
    bool lt_search;      /* cuBLASLt tuning also times variants of the heuristic's answers (other tiles, split-K;
                            measure knob lt_search=1; kiln tune --search) */
    bool moe_grouped;    /* decode batches past the experts' pair GEMVs run the grouped tensor-core GEMVs (bf16
                            engines) instead of every expert over the batch through cuBLASLt (measured slower) */
} kiln_cuda_exec_opts;

/* Create the executor for `m` (the model must outlive it). `m` may have been
 * opened with KILN_MODEL_NO_F32: the executor reads the weights section. */
kiln_status kiln_cuda_executor_new(const kiln_model *m, const kiln_cuda_exec_opts *o, kiln_executor **out,
                                   kiln_error *err);

/* Where time and memory went, for `kiln bench` and the tests. */
typedef struct kiln_cuda_exec_stats {
    double init_seconds;      /* driver, context, modules (incl. any PTX JIT), cuBLASLt */
    double upload_seconds;    /* weights host → device */
    double upload_gbps;       /* weight bytes on the device / upload_seconds, GB/s */
    int64_t weight_bytes;     /* on the device */
    int64_t kv_pool_bytes;
    int64_t kv_blocks, block_size;
    int64_t buffer_bytes;     /* activations, scratch, workspace */
    int graphs;               /* CUDA graphs captured so far */
    int64_t graph_launches;   /* decode steps replayed from a graph */
    int64_t steps;            /* steps run */
    bool jitted;              /* some module was JIT-compiled from PTX */
    double modules_seconds;   /* loading the kernel modules, the JIT included */
    bool f32;                 /* the fp32 path */
    bool pdl;                 /* kernels launched with programmatic dependent launch */
    int sm;                   /* the device's compute capability, e.g. 90 */
    /* the engine's tuning record (kiln_tuning.h) and the thresholds in effect */
    char tuning[96];          /* "recorded sm_90 (12 shapes)", "stale (cuBLASLt 130000 vs 130100)", "none (heuristic)" */
    int tuning_shapes;        /* GEMM entries of the record in use (0: none) */
    int tuning_used;          /* of them, entries some cuBLASLt plan took so far */
    int tuning_refused;       /* entries cublasLtMatmulAlgoCheck refused (the heuristic's answer ran instead) */
    int gemv_max_m, qgemv_max_m, rope_split_max_t, decode_tc_min;
    double attn_waves;
} kiln_cuda_exec_stats;

/* Fill *st for an executor made by kiln_cuda_executor_new (false for another kind). */
bool kiln_cuda_exec_get_stats(kiln_executor *x, kiln_cuda_exec_stats *st);
/* Measure the cuBLASLt algorithm of every GEMM shape that decode steps of
 * the given batches and prefill steps of the given token counts run
 * (kiln_cublaslt_tune; shapes the GEMV takes are skipped), and describe
 * the result as a tuning record for this GPU (out->gemms malloc'd): the
 * measured shapes, this GPU's SM, name, driver and cuBLASLt versions, and
 * the thresholds in effect. `kiln tune` writes it into the engine. Create
 * the executor with no_recorded so that every shape is measured; `log`
 * (NULL = silent) gets each candidate's time. */
kiln_status kiln_cuda_exec_tune(kiln_executor *x, const int *batches, int n_batches, const int *rows, int n_rows,
                                FILE *log, kiln_tuning_record *out, kiln_error *err);
/* A recorded algorithm's configuration ("algo 66 tile 20 stages 31 ..."), for reports. */
void kiln_cuda_exec_algo_str(kiln_executor *x, const uint8_t algo[64], char *buf, size_t n);
/* Turn decode CUDA graphs on or off from the next step (graphs already
 * captured are kept); false for another kind of executor. For measuring. */
bool kiln_cuda_exec_set_graphs(kiln_executor *x, bool on);
/* Turn programmatic dependent launch on or off (captured graphs are dropped
 * and recaptured); false for another executor or a GPU before sm_90. */
bool kiln_cuda_exec_set_pdl(kiln_executor *x, bool on);
/* The decode fusions are the plan's (passes decode-attention-rope, decode-attention-merge,
 * fold-norm-into-gemv): compare them with engines compiled with different --passes. */

#endif /* KILN_CUDA_EXEC_H */
