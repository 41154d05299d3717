/*
 * kiln.h — the public C API of the kiln runtime.
 *
 * A program that embeds kiln includes this header (which includes kiln_status.h, installed beside
 * it) and links libkiln.
 * Everything here is plain C with opaque handles and sized integer types, so
 * it can be used through dlopen/FFI too.
 *
 * Status codes: every function returns a kiln_status (0 = ok). The enum is
 * append-only: values never change meaning, new ones go at the end. The
 * human-readable message for the last failure of a handle is available
 * through the handle's *_last_error() function, and a generic text for each
 * code through kiln_status_str().
 */
#ifndef KILN_H
#define KILN_H

#include <stddef.h>
#include <stdint.h>

#include "kiln_status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* kiln_status and kiln_status_str: kiln_status.h (installed beside this header). */

/* Why a request finished. Append-only, like kiln_status. */
typedef enum kiln_stop_reason {
    KILN_STOP_EOS = 0,        /* the model produced an end-of-sequence token (it is delivered) */
    KILN_STOP_MAX_TOKENS = 1, /* max_tokens tokens were generated */
    KILN_STOP_CONTEXT = 2,    /* the sequence filled the context window */
    KILN_STOP_CANCELLED = 3,  /* kiln_cancel(), or a callback returned non-zero */
    KILN_STOP_ERROR = 4,      /* the request could not run (see kiln_last_error) */
    KILN_STOP_COUNT_          /* keep last; not a reason */
} kiln_stop_reason;

/* "eos", "max_tokens", "context_full", "cancelled", "error" ("unknown" otherwise). */
const char *kiln_stop_reason_str(kiln_stop_reason r);

/* ==================================================================== *
 *  The embedding API                                                   *
 * ==================================================================== *
 *
 *   kiln_t       an engine file opened for execution: weights, plan,
 *                tokenizer. Read-only once open: any number of contexts,
 *                on any threads, may share one.
 *   kiln_ctx_t   a context: a device (CPU or GPU), its KV memory and a
 *                continuous-batching scheduler. Requests are submitted to a
 *                context, advanced by kiln_run_step()/kiln_run(), and their
 *                tokens come back through a callback or kiln_poll().
 *
 * Typical use (docs/c-api.md has the full example):
 *
 *   kiln_t *k;  kiln_open("model.kiln", 0, &k);
 *   kiln_ctx_t *ctx;  kiln_ctx_new(k, NULL, &ctx);
 *   kiln_request_options ro;  kiln_request_options_init(&ro);  ro.max_tokens = 64;
 *   int64_t id;  kiln_submit(ctx, prompt, n_prompt, &ro, &id);
 *   kiln_run(ctx);  kiln_poll(ctx, id, buf, cap, &n, &finished, &reason);
 *   kiln_ctx_free(ctx);  kiln_close(k);
 *
 * Errors: every function returning kiln_status leaves a message naming what
 * is wrong, with a hint, readable through kiln_error_message(k) for calls on
 * an engine handle and kiln_last_error(ctx) for calls on a context. The
 * constructors (kiln_open, kiln_ctx_new) hand back a handle even when they
 * fail (unless memory for the handle itself ran out, KILN_ERR_NOMEM with
 * *out = NULL): it holds only the message, every other call on it returns
 * KILN_ERR_INVALID_ARG, and it must still be closed/freed.
 *
 * Threads: a kiln_t is read-only after kiln_open and may be shared. A
 * kiln_ctx_t may be driven from several threads: kiln_submit, kiln_cancel,
 * kiln_poll and kiln_pending may run on any thread while one thread runs
 * kiln_run_step/kiln_run (they take the context's lock; they wait at most for
 * the bookkeeping part of a step, not for the model). Only one thread may
 * step a context at a time (a second gets KILN_ERR_INVALID_ARG), and
 * kiln_ctx_free must not race with any other call on the context.
 * kiln_last_error's text belongs to the context: with several threads, read
 * it on the thread that saw the failure before another call fails.
 *
 * Callbacks run on the thread that steps, inside kiln_run_step/kiln_run (and
 * inside kiln_cancel for a request that is cancelled outside a step). From a
 * callback you may call kiln_submit, kiln_cancel, kiln_poll and
 * kiln_pending on the same context; kiln_run_step, kiln_run and kiln_ctx_free
 * are refused or forbidden there.
 *
 * Ownership: the library copies everything it is given (paths, prompts,
 * options); strings it returns stay owned by the handle they came from.
 *
 * ABI: option structs start with struct_size; initialise them with their
 * *_init function, which sets it, so a newer library can tell an older
 * caller's struct from its own. Sizes and ids are fixed-width integers;
 * booleans are int32_t (0 = false).
 */

typedef struct kiln_t kiln_t;
typedef struct kiln_ctx_t kiln_ctx_t;

/* ---- engines ---- */

/* Open an engine file: verify it (format, checksums), read its plan, decode
 * its weights (with up to `threads` threads when compressed; 0 = one per core)
 * and load its tokenizer when it has one. See the error rules above. */
kiln_status kiln_open(const char *path, int32_t threads, kiln_t **out);
/* kiln_open for an engine stored as `size` bytes at byte `offset` of the
 * file `path` (for example appended to an executable; any offset, though a
 * multiple of 4096 keeps its sections page-aligned). The range is mmapped
 * like an engine file. A range that runs past the end of the file is
 * KILN_ERR_FORMAT. */
kiln_status kiln_open_range(const char *path, uint64_t offset, uint64_t size, int32_t threads, kiln_t **out);
/* kiln_open for an engine image of `size` bytes in memory (say, a section
 * of the program). The bytes are not copied: they must stay valid and
 * unchanged until kiln_close. Best 4096-aligned. `label` names the engine
 * in messages (NULL = "(memory)"). */
kiln_status kiln_open_memory(const void *data, uint64_t size, const char *label, int32_t threads, kiln_t **out);
/* Close an engine. Every context made from it must be freed first. NULL is a no-op. */
void kiln_close(kiln_t *k);
/* The message of the failure that made this handle (kiln_open) or "" when
 * it opened fine; "kiln_t is NULL" for NULL. Owned by the handle. */
const char *kiln_error_message(const kiln_t *k);

/* What the engine holds (0 or -1 for a NULL or failed handle). */
int32_t kiln_vocab_size(const kiln_t *k);  /* token ids are 0 .. vocab-1 */
int32_t kiln_max_context(const kiln_t *k); /* the model's context window, in tokens */
int32_t kiln_bos_id(const kiln_t *k);      /* beginning-of-sequence id, -1 when none */
/* Copy up to `cap` end-of-sequence ids into `ids`; returns how many there are. */
int32_t kiln_eos_ids(const kiln_t *k, int32_t *ids, int32_t cap);
/* 1 when the engine has a tokenizer (kiln_tokenize/kiln_detokenize work), else 0. */
int32_t kiln_has_tokenizer(const kiln_t *k);
/* The engine's meta section: a JSON object (model config, weights dtype,
 * build options...), NUL-terminated, owned by the handle. NULL when failed. */
const char *kiln_meta_json(const kiln_t *k);
/* Seconds kiln_open took. */
double kiln_open_seconds(const kiln_t *k);

/* ---- contexts ---- */

typedef struct kiln_ctx_options {
    uint32_t struct_size;    /* sizeof(kiln_ctx_options); set by kiln_ctx_options_init */
    const char *device;      /* "cpu", "gpu" or "auto" (= gpu when this build and host have one and the
                                engine has GPU kernels, else cpu); NULL = "auto" */
    int32_t max_batch;       /* sequences that run together (slots); default 8, 1..1024 */
    int32_t max_context;     /* tokens per sequence, prompt + output; 0 = the model's (default) */
    int64_t kv_bytes;        /* KV memory in bytes, all sequences together; 0 = use kv_fraction on a
                                GPU, enough for max_batch full contexts on the CPU (default 0) */
    double kv_fraction;      /* GPU only, when kv_bytes is 0: fraction of the free device memory
                                (after weights) for the KV pool, in (0, 1]; default 0.9 */
    int32_t max_step_tokens; /* new tokens per step, all sequences together (chunked prefill): the GPU's
                                activations and scratch are sized for it; 0 = 8192 (default; on a GPU
                                fewer when its scratch would take more than a quarter of the memory
                                left after the weights and KV); at least max_batch. A GPU context
                                whose weights + kv_bytes + scratch exceed the free memory is refused
                                (KILN_ERR_NOMEM naming each part) */
    int32_t threads;         /* most CPU threads at once (of a pool of one per core); 0 = one per core */
    /* Since 0.2. Measurement knobs, for benchmarking only (`kiln bench --measure`): comma-separated
     * key=value pairs that change how the GPU runs the same plan, never what it computes beyond
     * rounding: gemv_max_m=N (1..64: most tokens per step the tensor-core GEMV, and the quantized
     * one, take before cuBLASLt; a +act_fp8 matrix runs W8A8 past 32 tokens whatever N), attn_waves=W (decode attention's splits aim for W waves of the GPU, 0 < W <= 64;
     * default 2), lt_tune=0|1|2 (cuBLASLt algorithms at decode: the heuristic's, timed (default),
     * timed and reported on stderr), pdl=0|1, graphs=0|1, profile=0|1 (time every kernel, without
     * graphs: `kiln bench --profile`), recorded=0|1 (since 0.3; 0: leave the engine's tuning record
     * unused, its cuBLASLt algorithms and thresholds: the heuristic and the built-in defaults, for A/B
     * against `kiln tune`), tp_oneshot=0|1|2 (since 0.4; a tensor-parallel engine's collectives: NCCL
     * only (or, with every rank on one GPU, the sum on one stream; the default), the one-shot kernel
     * where ranks can address each other's memory for small all-reduces and the gather, or for every
     * collective), moe_grouped=0|1 (a mixture of experts' decode batches past
     * the pair GEMVs: every expert over the batch through cuBLASLt (default), or the grouped GEMVs),
     * qgemv_cc=0|1 (since 0.5; one-token steps over q8/fp8 weights, and q4 in engines from 2026-12-02:
     * the CUDA-core GEMV where the engine has it (1, the default) or the tensor-core one (0)), qgemm=0|1 (since 0.5;
     * steps of 17 to 64 rows over q8, fp8 (not +act_fp8) and q4 weights in engines from 2026-12-04: the
     * quantized GEMM reading the codes (1, the default) or, as before, the GEMV up to 32 rows and the weights
     * dequantized for cuBLASLt past them (0)), w8a8=0|1|2 (since 0.5; an fp8 engine's steps
     * past the quantized GEMV on sm_89+, over the matrices its plan marks +act_fp8: cuBLASLt's FP8 GEMM over the activations quantized per token
     * (2, the default: fp8g128 matrices as well, with scales per 128 columns; 1: fp8 matrices only, fp8g128
     * dequantized) or the weights dequantized to bf16 for a bf16 GEMM (0)), prefill_wg=0|1 (since 0.5; prefill
     * attention on sm_90 over a bf16 KV cache in engines from 2026-12-02: the wgmma kernel (1, the default) or
     * the mma.sync one (0)), decode_tc=0|1 (since 0.5; decode attention in engines from 2026-12-03 whose
     * FP8 cache has 4 to 8 query heads a kv head at head_dim 128: the tensor-core kernel at steps of 80 or
     * more sequences (1, the default; 80 unless the engine's tuning record for the GPU says otherwise), at every
     * step (2), or never (0)), decode_tc_min=1..65536 (since 0.5; with decode_tc 1, the tensor-core kernel from
     * this many sequences instead), lt_search=0|1 (since 0.5; cuBLASLt tuning at decode times the heuristic's answers
     * only (0, the default) or also variants of the fastest, other tiles and split-K, where their tiles fill
     * less than a wave (1)), w8a8_fast=0|1 (since 0.5; the W8A8 GEMMs that the plan marks +fast_accum
     * (pass w8a8-fast-accum: fp8 weights with a scale a row) use cuBLASLt's FP8 fast accumulation, the tensor
     * cores' partial sums not promoted to fp32 (1, the default), or promote them all the same (0); GEMMs
     * without the flag always promote).
     * NULL or "" = none. An unknown key or
     * a bad value is KILN_ERR_INVALID_ARG, and any knob with device "cpu" too. */
    const char *measure;
    /* Since 0.4 (a caller built against an older kiln.h passes a smaller struct_size and gets the defaults). */
    const char *gpus;        /* GPU only: comma-separated CUDA device ordinals, one per tensor-parallel rank in rank
                                order ("0,1": rank 0 on GPU 0, rank 1 on GPU 1); a plain engine takes one (the GPU
                                to run on). Items are digits only, each 0..1023; a device may repeat ("0,0": every
                                rank on one GPU). NULL or "" = device r for rank r (device 0 for a plain engine).
                                KILN_ERR_INVALID_ARG for a bad item (named), a count other than the engine's ranks
                                or any list with device "cpu"; with "auto" a list asks for the GPU (no CPU
                                fallback: KILN_ERR_DEVICE when there is none) */
    double tp_timeout_s;     /* a tensor-parallel step that has not finished on every rank after this many seconds
                                aborts every rank's collectives and fails, naming the rank; 0..86400, 0 = 60
                                (default). Applies to GPU contexts of tensor-parallel engines; accepted and
                                ignored otherwise */
} kiln_ctx_options;

/* Fill *o with the defaults above. */
void kiln_ctx_options_init(kiln_ctx_options *o);

/* Create a context on the engine `k` with options `o` (NULL = defaults).
 * Bad options give KILN_ERR_INVALID_ARG, an unavailable device
 * KILN_ERR_DEVICE; a GPU whose libcublasLt cannot be loaded gives
 * KILN_ERR_MISSING naming it (with "auto" too: no silent CPU fallback).
 * See the error rules above. */
kiln_status kiln_ctx_new(const kiln_t *k, const kiln_ctx_options *o, kiln_ctx_t **out);
/* Free a context: running and queued requests are dropped without further
 * callbacks. NULL is a no-op. Not from a callback. */
void kiln_ctx_free(kiln_ctx_t *ctx);
/* The message of the last failure on this context ("" if none; "kiln_ctx_t
 * is NULL" for NULL). Owned by the context, valid until the next failure. */
const char *kiln_last_error(const kiln_ctx_t *ctx);

typedef struct kiln_ctx_info {
    uint32_t struct_size;       /* sizeof(kiln_ctx_info); set it before calling kiln_ctx_info */
    char device[16];            /* "cpu" or "gpu" */
    char device_name[128];      /* "cpu", "NVIDIA H200"... */
    int32_t max_batch, max_context, max_step_tokens;
    int64_t kv_capacity_tokens; /* KV tokens all sequences together can hold */
    int64_t device_bytes;       /* device memory in use now (0 on the CPU) */
    int64_t device_peak_bytes;  /* the most device memory in use so far (0 on the CPU) */
    int64_t host_peak_bytes;    /* the process's peak resident memory (VmHWM) */
    int64_t steps;              /* scheduler steps that ran the model */
    int32_t max_running;        /* the most sequences that ran in one step so far */
    /* Device memory by part (0 on the CPU): peak device memory <= weight_bytes + kv_bytes +
     * scratch_bytes (scratch: activations and buffers for max_step_tokens rows and max_batch
     * sequences, the cuBLASLt workspace; CUDA graphs and the driver's context come on top) */
    int64_t weight_bytes, kv_bytes, scratch_bytes;
    double kernels_load_seconds; /* loading the engine's kernel modules, a PTX JIT included (0 on the CPU) */
    int32_t kernels_jitted;      /* 1 when the engine has no cubin for this GPU and its PTX was JIT-compiled
                                    (the driver caches the result, so the next load is fast) */
    /* Since 0.2 (a caller built against 0.1 passes a smaller struct_size and gets the fields it knows) */
    int32_t requests_running;    /* requests admitted now (in a slot) */
    int32_t requests_waiting;    /* requests queued now, preempted ones included */
    int64_t kv_used_tokens;      /* KV tokens promised to running requests now (<= kv_capacity_tokens) */
    int64_t preemptions;         /* times a running request was preempted so far */
    int64_t tokens_recomputed;   /* tokens fed again to resume preempted requests so far */
    /* Since 0.3 */
    char tuning[96];             /* the engine's tuning record (`kiln tune`) for this GPU: "recorded sm_90 (12
                                    shapes)" (its cuBLASLt algorithms and thresholds are used), "stale (cuBLASLt
                                    130000 vs 130100)" (measured with another cuBLASLt: the heuristic runs, the
                                    thresholds still apply), "none (heuristic)", "off (...)" (knob recorded=0);
                                    ", N refused by cuBLASLt" when cublasLtMatmulAlgoCheck refused recorded ones;
                                    empty on the CPU */
    /* Since 0.5 */
    int32_t gemm_fp8;            /* matrices whose GEMM steps (prefill, batches past the quantized GEMV) run
                                    W8A8 now: the activations quantized per token for FP8 tensor cores (an
                                    fp8 engine on sm_89+; 0 on the CPU, for other formats and with measure
                                    knob w8a8=0, or once cuBLASLt had no algorithm for a shape) */
    int32_t gemm_q;              /* (since 0.5, engines from 2026-12-04) quantized matrices whose steps of 17
                                    to 64 rows run the quantized GEMM (the codes read in place; without it
                                    they dequantize for cuBLASLt past 32 rows); 0 on the CPU and with
                                    measure knob qgemm=0 */
} kiln_ctx_info;

/* Describe the context. */
kiln_status kiln_ctx_info_get(kiln_ctx_t *ctx, kiln_ctx_info *info);

/* ---- requests ---- */

/* Receives the tokens of a request submitted with a callback. Called once
 * per generated token (token >= 0, finished = 0, stop_reason = -1), except
 * that the last token comes with finished = 1 and stop_reason set (a
 * kiln_stop_reason). A request that ends without a new token (cancelled,
 * max_tokens 0, an error) gets a last call with token = -1, finished = 1.
 * After the finished call the id is forgotten. Return 0 to go on, non-zero
 * to cancel the request: it then gets its finished call (token -1,
 * KILN_STOP_CANCELLED) at once. */
typedef int32_t (*kiln_token_callback)(void *user, int64_t request, int32_t token, int32_t finished,
                                       int32_t stop_reason);

/* The most alternatives a token can report (kiln_request_options.logprobs). */
#define KILN_MAX_LOGPROBS 20

/* One generated token (or, with prompt_logprobs, one prompt token) with its log-probabilities, for
 * kiln_token_info_callback. */
typedef struct kiln_token_info {
    int32_t token;   /* the token id */
    float logprob;   /* its log-probability under the model: the log-softmax of the logits, before
                        temperature, penalties and truncation (0 when the request's logprobs is -1) */
    int32_t n_top;   /* entries below: the request's logprobs (0 when -1) */
    int32_t top_token[KILN_MAX_LOGPROBS]; /* the most likely tokens, most likely first (ties: lower id) */
    float top_logprob[KILN_MAX_LOGPROBS]; /* their log-probabilities */
    double queue_seconds; /* how long the request waited from kiln_submit to its first slot (the same in
                             every call) */
    /* Since 0.5 */
    int32_t prompt;   /* 1: a token of the prompt (kiln_request_options.prompt_logprobs), not generated */
    int32_t position; /* the token's position in the sequence: 1 .. n_prompt − 1 for prompt tokens,
                         n_prompt, n_prompt + 1, ... for generated ones */
} kiln_token_info;

/* As kiln_token_callback, with the token's log-probabilities: `t` is the
 * token (NULL on a last call without a new token). */
typedef int32_t (*kiln_token_info_callback)(void *user, int64_t request, const kiln_token_info *t, int32_t finished,
                                            int32_t stop_reason);

typedef struct kiln_request_options {
    uint32_t struct_size;         /* sizeof(kiln_request_options); set by kiln_request_options_init */
    int32_t max_tokens;           /* tokens to generate at most (default 128; 0 = finish at once) */
    float temperature;            /* 0 = greedy (default) */
    int32_t top_k;                /* keep the k most likely tokens; 0 = off (default) */
    float top_p;                  /* keep the smallest set with this much probability; 1 = off (default) */
    uint64_t seed;                /* sampling seed: the same seed and prompt give the same tokens,
                                     alone or batched on the CPU; on a GPU, batched logits can differ
                                     in the last bits (docs/c-api.md) (default 0) */
    int32_t ignore_eos;           /* non-zero: do not stop at an end-of-sequence token */
    kiln_token_callback on_token; /* NULL: keep the tokens for kiln_poll (default) */
    void *user;                   /* passed to on_token (or on_token_info) */
    /* Since 0.2 (callers built against 0.1 pass a smaller struct_size and get the defaults). The
     * scheduler applies these on the host to the logits the device returns for such requests
     * (docs/c-api.md gives the cost), in vLLM's order: repetition, frequency and presence penalties,
     * then temperature, top-k, top-p, min-p. */
    float min_p;              /* keep tokens whose probability is at least min_p × the most likely one's,
                                 0..1; 0 = off (default) */
    float presence_penalty;   /* OpenAI's: subtracted from the logit of every token generated so far,
                                 -2..2; 0 = off (default) */
    float frequency_penalty;  /* OpenAI's: subtracted once per time a token was generated so far, -2..2;
                                 0 = off (default) */
    float repetition_penalty; /* HF's: the logit of a token in the prompt or generated so far is divided
                                 by it when positive, multiplied when negative; (0, 10]; 1 = off (default) */
    int32_t logprobs;         /* -1 = off (default); 0..KILN_MAX_LOGPROBS: report each token's
                                 log-probability and this many most likely alternatives, through
                                 on_token_info (required then) */
    kiln_token_info_callback on_token_info; /* instead of on_token: tokens with their log-probabilities
                                               (NULL = none, default; not both) */
    /* Since 0.5 */
    int32_t prompt_logprobs; /* -1 = off (default); 0..KILN_MAX_LOGPROBS: report the log-probability of
                                every prompt token but the first (which has no context) and this many
                                alternatives, through on_token_info (required then) with `prompt` set, in
                                position order before the first generated token; each once, preemption
                                or not. With max_tokens 0 the request reads its prompt for them, then
                                finishes (KILN_STOP_MAX_TOKENS) without generating. The prompt is read
                                as any prompt is (chunked prefill, the LM head run over every row) on
                                executors that return every row's logits, one token a step on the
                                others (a tensor-parallel GPU engine) */
} kiln_request_options;

/* Fill *o with the defaults above. */
void kiln_request_options_init(kiln_request_options *o);
/* Fill *o with the defaults above, then with the engine's own sampling
 * defaults: temperature, top_k and top_p as the checkpoint's
 * generation_config.json sets them (greedy when it has none or its
 * do_sample is false; the meta section's "generation" object says where each
 * came from). For programs that want the model's recommended sampling.
 * KILN_ERR_INVALID_ARG (and the plain defaults) for a NULL or failed engine. */
kiln_status kiln_request_options_init_from_engine(const kiln_t *k, kiln_request_options *o);

/* Queue a request: `n_prompt` token ids (copied), options `o` (NULL =
 * defaults). *id receives its id (> 0, unique in the context). Refused at
 * once: an empty prompt, an id outside the vocabulary or an option out of
 * its range (KILN_ERR_INVALID_ARG), a prompt longer than the context or a
 * request the KV memory can never hold, prompt + max_tokens capped at the
 * context (KILN_ERR_CONTEXT). Otherwise the request waits until a slot and
 * the KV memory for its prompt are free (requests are admitted in
 * submission order); its KV memory then grows as it generates. When the KV
 * memory runs out, the most recently admitted running requests are
 * preempted: their KV memory is freed and they go back to the front of the
 * queue, to be resumed by recomputing prompt + tokens so far. A preempted
 * request is never failed and its tokens are delivered once each; they are
 * the tokens it would have produced otherwise (bit for bit on the CPU; on a
 * GPU the recomputed logits can differ in the last bits). */
kiln_status kiln_submit(kiln_ctx_t *ctx, const int32_t *prompt, int32_t n_prompt, const kiln_request_options *o,
                        int64_t *id);

/* Run one scheduler step: admit waiting requests that fit, run one model
 * step over decode tokens of running requests and prefill chunks of new
 * ones, deliver the new tokens, finish requests and free their memory.
 * Returns KILN_OK when there was nothing to do. On a device failure the
 * requests in that step finish with KILN_STOP_ERROR and the status says why. */
kiln_status kiln_run_step(kiln_ctx_t *ctx);
/* Step until no request is queued or running. Stops at the first step that
 * fails, returning its status (the message in kiln_last_error); the
 * requests that step ended have finished with KILN_STOP_ERROR, the others
 * are still there: call again to go on. */
kiln_status kiln_run(kiln_ctx_t *ctx);
/* Requests queued or running (not counting finished ones waiting to be polled). */
int32_t kiln_pending(kiln_ctx_t *ctx);

/* Since 0.3. Score given token ids (teacher forcing; no sampling): for each of the n_seqs sequences s,
 * logprobs[s][i] = log p(seqs[s][i + 1] | seqs[s][0 .. i]) for i < lens[s] - 1, the model's
 * log-softmax (no temperature or penalties), as kiln_token_info.logprob. Each sequence has 2 ..
 * max_context ids of the vocabulary and is read from position 0 (its first id is context only, so a
 * caller that wants it scored puts BOS first). The sequences run max_batch at a time, read as
 * prompts are (chunked prefill, every position's logits; since 0.5), so the values are those
 * prompt_logprobs gives; on an executor that returns only last rows (a tensor-parallel GPU engine)
 * one token a step.
 * The context must be idle: no request queued or running and no thread stepping
 * (KILN_ERR_INVALID_ARG otherwise); requests submitted meanwhile wait. Other refusals:
 * KILN_ERR_INVALID_ARG for NULL pointers, n_seqs < 1, a length out of range or an id outside the
 * vocabulary (naming the sequence and position); a device failure returns its status. */
kiln_status kiln_score(kiln_ctx_t *ctx, const int32_t *const *seqs, const int32_t *lens, int32_t n_seqs,
                       float *const *logprobs);

/* Take the tokens a request (submitted without a callback) produced since
 * the last poll: up to `cap` ids into `buf`, their count in *n. *finished
 * becomes 1 when the request has finished and every token has been taken;
 * *stop_reason (may be NULL) then holds its kiln_stop_reason, else -1. After
 * the poll that reports finished, the id is forgotten (polling it again is
 * KILN_ERR_INVALID_ARG). buf may be NULL when cap is 0. */
kiln_status kiln_poll(kiln_ctx_t *ctx, int64_t id, int32_t *buf, int32_t cap, int32_t *n, int32_t *finished,
                      int32_t *stop_reason);

/* Cancel a queued or running request: it finishes with KILN_STOP_CANCELLED
 * and its slot and KV memory are freed (at once outside a step; at the end
 * of the current step from inside a callback). Tokens already produced stay
 * pollable. Cancelling a finished request is a no-op (KILN_OK); an unknown
 * id is KILN_ERR_INVALID_ARG. */
kiln_status kiln_cancel(kiln_ctx_t *ctx, int64_t id);

/* ---- tokenizer (engines that carry one) ---- */

/* Encode `len` bytes of UTF-8 `text` into at most `cap` ids; *n receives
 * the number of ids the text needs, also when that exceeds cap (then the
 * status is KILN_ERR_INVALID_ARG and nothing is written: call again with a
 * larger buffer). add_special: add bos/eos as the model's tokenizer does.
 * No tokenizer: KILN_ERR_MISSING. */
kiln_status kiln_tokenize(kiln_ctx_t *ctx, const char *text, size_t len, int32_t add_special, int32_t *ids,
                          int32_t cap, int32_t *n);
/* Decode ids into `text` (NUL-terminated, at most cap bytes with the NUL);
 * *len receives the text's length without the NUL, also when it does not
 * fit (then KILN_ERR_INVALID_ARG and text is ""). skip_special: leave out
 * special tokens (bos, eos...). */
kiln_status kiln_detokenize(kiln_ctx_t *ctx, const int32_t *ids, int32_t n, int32_t skip_special, char *text,
                            size_t cap, size_t *len);

/* ---- chat templates (engines compiled with one; docs/chat.md) ---- */

/* One message of a conversation: role ("system", "user", "assistant"...) and
 * content, NUL-terminated UTF-8. */
typedef struct kiln_chat_message {
    const char *role;
    const char *content;
} kiln_chat_message;

/* 1 when the engine carries a chat template (kiln compile stores the
 * checkpoint's), else 0. */
int32_t kiln_has_chat_template(const kiln_t *k);
/* Render `n` messages with the engine's chat template exactly as HF
 * transformers' apply_chat_template(messages, tokenize=False,
 * add_generation_prompt) does. On success *out is a malloc'd NUL-terminated
 * string of *len bytes (len may be NULL), freed with kiln_chat_text_free.
 * Encode it with kiln_tokenize(add_special = 0): the template writes the
 * special tokens it wants (bos...). On failure *out is NULL and `errbuf`
 * (may be NULL; at most errcap bytes with the NUL) receives the message: no
 * template (KILN_ERR_MISSING), a message the template refuses through
 * raise_exception, naming its text (KILN_ERR_INVALID_ARG), a bad argument
 * (KILN_ERR_INVALID_ARG). Thread-safe: the engine is only read. */
kiln_status kiln_chat_render(const kiln_t *k, const kiln_chat_message *msgs, int32_t n, int32_t add_generation_prompt,
                             char **out, size_t *len, char *errbuf, size_t errcap);
/* Free a string from kiln_chat_render. NULL is a no-op. */
void kiln_chat_text_free(char *text);

#ifdef __cplusplus
}
#endif

#endif /* KILN_H */
