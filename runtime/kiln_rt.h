/*
 * kiln_rt.h — the runtime's internal API: a loaded model, the CPU reference
 * executor and the sampler. (The public, FFI-friendly API is kiln.h.)
 *
 *   kiln_model      an engine opened and checked: meta, plan, weights, tokenizer
 *   kiln_cpu_ctx    the CPU executor's state for one sequence: KV cache and
 *                   activation buffers; runs the plan in fp32
 *   kiln_cpu_executor_new   the CPU executor as a kiln_executor, for the scheduler
 *   kiln_generate   prompt ids → generated ids, stopping on eos or a limit
 */
#ifndef KILN_RT_H
#define KILN_RT_H

#include <stdbool.h>
#include <stdint.h>

#include "kiln.h"
#include "../format/kiln_engine.h"
#include "../format/kiln_plan.h"

struct kiln_tokenizer;

#define KILN_MAX_EOS_IDS 8

typedef struct kiln_model {
    kiln_engine engine;
    kiln_plan *plan;
    char *meta_json;               /* the meta section, NUL-terminated */
    const uint8_t *weights;        /* decoded weights section */
    size_t weights_size;
    bool weights_owned;            /* weights is a malloc'd buffer (decoded from zstd) */
    float **wf32;                  /* per plan weight record (every rank's: rank r's weight i at
                                      r × n_weights + i): its data as f32 (converted at load; NULL with
                                      KILN_MODEL_NO_F32) */
    int32_t bos_id;                /* -1 when none */
    int32_t eos_ids[KILN_MAX_EOS_IDS];
    int n_eos;
    /* sampling defaults from meta.generation (generation_config.json); greedy: 0, 0, 1 */
    float gen_temperature;
    int32_t gen_top_k;
    float gen_top_p;
    struct kiln_tokenizer *tokenizer; /* NULL when the engine has none */
    char no_gpu_kernels[256];      /* meta build.no_gpu_kernels: why the engine has no GPU kernels ("" = unknown) */
    double load_seconds;
} kiln_model;
/* True, with a message naming the engine file in `err`, when that file shrank while kiln read it
 * (common/guard.c: the bytes read past its new end were zeros). Loading checks it; so does whatever
 * reads the weights later (a GPU context's upload). */
bool kiln_model_shrank(const kiln_model *m, kiln_error *err);

/* Open an engine: verify the file, parse meta and plan, decode the weights
 * (at most `threads` ways of the process-wide pool when compressed) and
 * convert them to f32 for the CPU executor. */
kiln_status kiln_model_open(const char *path, int threads, kiln_model **out, kiln_error *err);
/* kiln_model_open with flags: KILN_MODEL_NO_F32 skips the f32 conversion
 * (m->wf32 stays NULL): for a GPU executor, which reads the weights section
 * itself. The CPU executor needs wf32: kiln_model_load_f32 makes it later. */
#define KILN_MODEL_NO_F32 1u
kiln_status kiln_model_open_ex(const char *path, int threads, unsigned flags, kiln_model **out, kiln_error *err);
/* kiln_model_open_ex over any engine source: a file, a range of a file (a
 * packaged executable's appended engine) or bytes in memory (kiln_engine.h). */
kiln_status kiln_model_open_src(const kiln_engine_src *src, int threads, unsigned flags, kiln_model **out,
                                kiln_error *err);
/* Every weight a permute op of plan p reads (on every rank; `weights` the decoded weights section) holds
 * a permutation of 0..K-1 with K at most 2^24, so both executors gather within the row (and the CPU's f32
 * copy of the indices is exact). Opening an engine checks this; KILN_ERR_FORMAT naming the weight and its
 * first index out of range or repeated otherwise (a damaged or hostile engine). */
kiln_status kiln_plan_check_permutations(const kiln_plan *p, const uint8_t *weights, const char *path,
                                         kiln_error *err);
/* Convert the weights to f32 now (a no-op when done already). */
kiln_status kiln_model_load_f32(kiln_model *m, kiln_error *err);
void kiln_model_close(kiln_model *m);

/* ---- CPU executor ---- */

typedef struct kiln_cpu_ctx kiln_cpu_ctx;

/* State for one sequence of up to `max_context` tokens (0 = the model's),
 * processing up to `max_step_tokens` tokens per forward call. Its matmuls
 * use at most `threads` ways of the process-wide pool (common/kiln_pool.h). */
kiln_status kiln_cpu_ctx_new(const kiln_model *m, int max_context, int max_step_tokens, int threads,
                             kiln_cpu_ctx **out, kiln_error *err);
void kiln_cpu_ctx_free(kiln_cpu_ctx *c);
/* Tokens already in the KV cache. */
int kiln_cpu_ctx_pos(const kiln_cpu_ctx *c);
int kiln_cpu_ctx_max_context(const kiln_cpu_ctx *c);
int kiln_cpu_ctx_max_step(const kiln_cpu_ctx *c);
const kiln_model *kiln_cpu_ctx_model(const kiln_cpu_ctx *c);
/* Forget the sequence (the KV cache is reused). */
void kiln_cpu_ctx_reset(kiln_cpu_ctx *c);

/* Run the plan over `n` new tokens at positions pos..pos+n-1 (appending
 * their K/V to the cache). Writes logits for every new token (n × vocab)
 * when all_logits, else for the last token only (vocab floats). */
kiln_status kiln_cpu_forward(kiln_cpu_ctx *c, const int32_t *tokens, int n, bool all_logits, float *logits,
                             kiln_error *err);

/* Routing trace (tests): called for every token at every moe op with the experts the router chose, in
 * torch.topk's order, and their renormalised weights. `pos` is the token's position in the sequence. */
typedef void (*kiln_cpu_moe_trace_fn)(void *user, int layer, int pos, int top_k, const int32_t *experts,
                                      const float *weights);
/* Set (or clear, fn NULL) the context's routing trace. */
void kiln_cpu_ctx_set_moe_trace(kiln_cpu_ctx *c, kiln_cpu_moe_trace_fn fn, void *user);

/* Activation trace (calibration: compiler/quant_awq.c): called before plan op `op` runs, when its first
 * input is an activation, with that input's rows for the step's `n` tokens ([n, width] f32, row t at
 * position pos0 + t), read-only. */
typedef void (*kiln_cpu_op_trace_fn)(void *user, uint32_t op, const float *x, int n, int64_t width, int pos0);
/* Set (or clear, fn NULL) the context's activation trace. */
void kiln_cpu_ctx_set_op_trace(kiln_cpu_ctx *c, kiln_cpu_op_trace_fn fn, void *user);
/* KV trace (calibration: compiler/kv_calib.c): called by every attention op with its rows' k (after RoPE)
 * and v, [n, kv_width] each, as they go into the layer's KV cache (before an 8-bit cache rounds them). */
typedef void (*kiln_cpu_kv_trace_fn)(void *user, int layer, const float *k, const float *v, int n, int64_t kv_width);
void kiln_cpu_ctx_set_kv_trace(kiln_cpu_ctx *c, kiln_cpu_kv_trace_fn fn, void *user);

/* The indices of the k largest of v[0..n), in the order torch.topk(v, k) gives them on the CPU, ties
 * included (runtime/topk.c says how). NaN counts as the largest, as there. */
kiln_status kiln_topk(const float *v, int n, int k, int32_t *idx, kiln_error *err);

/* ---- sampling (the rest is in kiln_exec.h: kiln_sample_logits, kiln_sample_uniform) ---- */

/* Index of the largest logit (lowest index on ties). */
int32_t kiln_argmax(const float *x, int n);

/* ---- the CPU executor behind the scheduler (runtime/cpu_backend.c) ---- */

struct kiln_executor;
/* A kiln_executor (kiln_exec.h, ops "cpu") with one kiln_cpu_ctx per slot,
 * created lazily, up to `max_seqs` slots of `max_context` tokens (0 = the
 * model's). `kv_tokens` models a KV pool shared by all slots, in tokens
 * (0 = max_seqs × max_context): reserve() refuses what would exceed it, so
 * queueing and refusal behave as on a GPU with a fixed pool. */
kiln_status kiln_cpu_executor_new(const kiln_model *m, int max_seqs, int max_context, int64_t kv_tokens, int threads,
                                  struct kiln_executor **out, kiln_error *err);

/* ---- the executors kiln_ctx_new chooses from (runtime/api.c) ---- */

/* kiln_ctx_options.measure parsed (kiln.h lists the knobs); 0 / -1 = the executor's default. */
typedef struct kiln_measure_knobs {
    int gemv_max_m;    /* 0 = default */
    double attn_waves; /* 0 = default */
    int lt_tune;       /* -1 = default, else 0..2 */
    int pdl, graphs;   /* -1 = default, else 0/1 */
    int moe_grouped;   /* -1 = default, else 0/1 */
    int qgemv_cc;      /* -1 = default, else 0/1 */
    int qgemm;         /* -1 = default, else 0/1: steps of 17 to 64 rows over quantized weights on the quantized GEMM */
    int w8a8;          /* -1 = default, else 0/1/2 */
    int tp_oneshot;    /* -1 = default, else 0 (never), 1 (auto), 2 (every collective): kiln_cuda_exec_opts.tp_oneshot */
    int prefill_wg;    /* -1 = default, else 0/1 */
    int decode_tc;     /* -1 = default, else 0 (never), 1 (from 80 sequences), 2 (every decode step): decode
                          attention on the tensor cores where the engine has it */
    int decode_tc_min; /* 0 = default (the tuning record's or 80), else 1..65536: ... from this many sequences */
    int w8a8_fast;     /* -1 = default, else 0/1: W8A8 GEMMs with FP8 fast accumulation */
    int lt_search;     /* -1 = default, else 0/1: cuBLASLt tuning beyond the heuristic's answers */
    bool profile;
    int recorded;      /* -1 = default (the engine's tuning record is used), 0 = not used */
    bool any;          /* at least one knob was given */
} kiln_measure_knobs;

/* kiln_ctx_options.gpus parsed: the CUDA device of each tensor-parallel rank, in rank order. n = 0
 * when none was given: rank r on device r (a plain engine, of one rank, on device 0). */
#define KILN_GPU_ORDINAL_MAX 1023
typedef struct kiln_gpu_list {
    int n;                       /* 0..KILN_MAX_RANKS */
    int ordinal[KILN_MAX_RANKS]; /* each 0..KILN_GPU_ORDINAL_MAX; a device may repeat ("0,0") */
} kiln_gpu_list;

/* Parse a device list ("0,1"; NULL or "" = none, n = 0) into *out (runtime/gpus.c): comma-separated
 * items of ASCII digits, each 0..KILN_GPU_ORDINAL_MAX, at most KILN_MAX_RANKS. Anything else is
 * KILN_ERR_INVALID_ARG (and *out empty) with a message that quotes the list and names the item at
 * fault, for the caller to prefix ("gpus ", "--gpus "). The count against the engine's ranks is the
 * caller's check. */
kiln_status kiln_gpus_parse(const char *spec, kiln_gpu_list *out, kiln_error *err);
/* The most kiln_ctx_options.tp_timeout_s may be, in seconds (a day: longer is surely a mistake). */
#define KILN_TP_TIMEOUT_MAX_S 86400

/* An executor, by the kiln_ctx_options.device that picks it. "auto" tries the kinds in
 * kiln_executor_kinds' order: one whose device is unavailable (KILN_ERR_DEVICE) passes to the
 * next; any other failure is the answer. */
typedef struct kiln_executor_kind {
    const char *device;  /* "gpu", "cpu" */
    bool needs_f32;      /* runs on the model's f32 weights (kiln_model_load_f32 first) */
    bool takes_knobs;    /* runs with measurement knobs (others refuse them, and "auto" with knobs skips it) */
    /* whether "auto" tries it for this engine (NULL: always); "gpu" asked by name still tries */
    bool (*auto_for)(const kiln_model *m);
    bool takes_gpus;     /* runs on the devices of kiln_ctx_options.gpus (others refuse a list, and "auto"
                            with one skips it) */
    /* `gpus`: o->gpus parsed and checked against the engine's ranks (n = 0: none given); valid
     * during the call only */
    kiln_status (*create)(const kiln_model *m, const kiln_ctx_options *o, const kiln_measure_knobs *k,
                          const kiln_gpu_list *gpus, struct kiln_executor **out, kiln_error *err);
} kiln_executor_kind;

/* The CPU executor's kind (runtime/cpu_backend.c). */
extern const kiln_executor_kind kiln_executor_cpu;
/* The GPU executor's kind: runtime/cuda/kind.c in a build with the CUDA toolkit, else
 * runtime/nogpu/gpu_absent.c, whose create says this build has none (KILN_ERR_DEVICE). */
extern const kiln_executor_kind kiln_executor_gpu;

/* ---- generation ---- */

/* kiln_stop_reason and kiln_stop_reason_str() are public: kiln.h. */

/* Called for each generated token; return false to stop early. */
typedef bool (*kiln_token_cb)(int32_t id, void *user);

typedef struct kiln_generate_opts {
    int max_tokens;
    float temperature;
    int top_k;
    float top_p;
    uint64_t seed;
    bool ignore_eos;
    kiln_token_cb on_token;
    void *user;
} kiln_generate_opts;

typedef struct kiln_generate_result {
    int32_t *ids; /* generated ids (malloc'd; the caller frees) */
    int n_ids;
    kiln_stop_reason stop;
    double prefill_seconds, decode_seconds;
} kiln_generate_result;

/* Prefill the prompt and decode. A prompt longer than the context is
 * KILN_ERR_CONTEXT, refused before any work. */
kiln_status kiln_generate(kiln_cpu_ctx *c, const int32_t *prompt, int n_prompt, const kiln_generate_opts *o,
                          kiln_generate_result *res, kiln_error *err);

/* The model behind a public handle (runtime/api.c), for the CLI's own use
 * (streaming text through the tokenizer). NULL for a failed handle. */
struct kiln_t;
const kiln_model *kiln_api_model(const struct kiln_t *k);
/* The executor's profile of a context made with the measure knob profile=1 (kiln bench --profile):
 * up to cap rows; returns how many there are (0: no profile). cap < 0 clears the sums instead. */
struct kiln_ctx_t;
struct kiln_profile_row;
int kiln_ctx_profile_rows(struct kiln_ctx_t *c, struct kiln_profile_row *rows, int cap);
/* kiln_open over any engine source (file, range of a file, memory), with
 * the source's label in messages; the public kiln_open_range and
 * kiln_open_memory are this. */
kiln_status kiln_open_src(const kiln_engine_src *src, int32_t threads, struct kiln_t **out);

#endif /* KILN_RT_H */
