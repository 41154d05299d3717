/*
 * kiln_exec.h — the executor interface: what the scheduler asks of a device.
 *
 * An executor runs the plan for a *step*: new tokens of several sequences at
 * once (continuous batching: some sequences prefill a chunk of their prompt,
 * others decode one token), keeps each sequence's KV cache between steps,
 * and returns the next token of every sequence that asked for one (sampled
 * on the device where it can) and, for tests, the logits.
 *
 * Sequences live in slots 0..max_seqs-1 chosen by the scheduler. KV memory
 * is the executor's: a slot grows as tokens are appended; `reserve` says in
 * advance whether a slot can grow to a length, so the scheduler can refuse
 * or queue work instead of running out of memory mid-step.
 *
 * Sampling is deterministic per (seed, position): the random number used for
 * the token at position p is a hash of (seed, p), so a request gives the
 * same tokens alone or batched, on any executor with the same logits.
 *
 * Implementations: runtime/cpu_backend.c (the fp32 reference, one KV cache
 * per slot) and runtime/cuda/ (paged KV cache, CUDA graphs).
 */
#ifndef KILN_EXEC_H
#define KILN_EXEC_H

#include <stdbool.h>
#include <stdint.h>

#include "../common/kiln_util.h"

typedef struct kiln_sampling {
    float temperature; /* 0 = greedy */
    int32_t top_k;     /* 0 = off */
    float top_p;       /* 1 = off */
    uint64_t seed;
    float min_p;       /* 0 = off; device samplers ignore it: the scheduler samples such rows on the host */
} kiln_sampling;

/* Penalties on tokens already seen (OpenAI's and HF's), applied to a row of
 * logits before sampling by the scheduler, on the host. */
typedef struct kiln_penalties {
    float presence;   /* subtracted once from the logit of every token generated so far (0 = off) */
    float frequency;  /* subtracted per occurrence among the tokens generated so far (0 = off) */
    float repetition; /* HF/CTRL: a positive logit of a token in the prompt or output is divided by
                         it, a negative one multiplied (1 = off) */
} kiln_penalties;

typedef struct kiln_step {
    int n_seqs;
    const int32_t *slot;       /* [n_seqs] sequence slot */
    const int32_t *n_new;      /* [n_seqs] new tokens this step (>= 1) */
    const int32_t *start;      /* [n_seqs] position of the first new token = tokens already cached */
    const int32_t *tokens;     /* [sum of n_new] the new tokens, sequence after sequence */
    const bool *want_token;    /* [n_seqs] sample a next token after this step (prompt fully read) */
    const kiln_sampling *samp; /* [n_seqs] */
    int32_t *next;             /* [n_seqs] out: sampled token where want_token (KILN_TOKEN_NONFINITE for logits
                                  the sampler cannot trust), else -1 */
    float *logits;             /* optional out: the logits of the last new token of sequences: with
                                  want_logits NULL, every sequence's, row i for sequence i; else only
                                  those flagged, packed in sequence order (row k for the k-th flagged) */
    const bool *want_logits;   /* optional [n_seqs] (with logits): which rows to return */
    const bool *all_logits;    /* optional [n_seqs] (with logits; only where the executor's all_logits is
                                  set): sequences that return the logits of every new token, n_new rows in
                                  position order, in place of the last one's row (prompt logprobs, scoring) */
} kiln_step;

typedef struct kiln_executor kiln_executor;

/* What an executor holds, for kiln_ctx_info() and `kiln bench`. */
typedef struct kiln_executor_info {
    char device_name[128];      /* "cpu", "NVIDIA H200" */
    int64_t kv_capacity_tokens; /* most KV tokens all slots together can hold (0 = unknown) */
    int64_t kv_used_tokens;     /* KV tokens promised to slots now (reserve()), in whole blocks */
    int64_t device_bytes;       /* device memory in use now (0 on the CPU) */
    int64_t device_peak_bytes;  /* the most device memory in use since creation (0 on the CPU) */
    /* Device memory by part (0 on the CPU): peak device memory <= weights + KV pool + scratch, where
     * scratch is what the step budget (max_step_tokens) and max_seqs cost, the cuBLASLt workspace
     * included (CUDA graphs and the driver's context are outside these counts). */
    int64_t weight_bytes, kv_bytes, scratch_bytes;
    double kernels_load_seconds; /* loading kernel modules, a PTX JIT included (0 on the CPU) */
    bool kernels_jitted;         /* some module was JIT-compiled from PTX */
    int gemm_fp8;                /* quantized matrices whose GEMM steps (past the quantized GEMV) run W8A8 now */
    int gemm_q;                  /* quantized matrices whose steps of 17 to 64 rows take the quantized GEMM */
    char tuning[96];             /* the engine's tuning record for this GPU: "recorded sm_90 (12 shapes)", "stale
                                    (cuBLASLt 130000 vs 130100)", "none (heuristic)"; empty on the CPU */
} kiln_executor_info;

/* One row of an executor's profile (kiln_executor_ops.profile): one instruction of the program
 * (a plan op's kernels) in one kind of step, summed over the steps profiled so far. */
typedef struct kiln_profile_row {
    char what[96];        /* "linear_add 4096x14336", "attention", "sample"... */
    int op;               /* plan op index, -1 for the sampler */
    int decode;           /* 1: decode steps (one new token per sequence), 0: steps with prefill */
    int64_t steps;        /* steps of that kind profiled */
    double ms;            /* GPU time, summed over those steps */
    double bytes, flops;  /* device memory traffic and floating-point work, summed (estimates: the
                             operands read and written once) */
    int fp8;              /* 1: its GEMM ran on FP8 tensor cores (W8A8), whose peak is twice bf16's */
} kiln_profile_row;

typedef struct kiln_executor_ops {
    const char *name; /* "cpu", "cuda" */
    kiln_status (*step)(kiln_executor *x, const kiln_step *s, kiln_error *err);
    /* Make sure `slot` can hold `tokens` tokens in all (KILN_ERR_CONTEXT when
     * longer than the context, KILN_ERR_NOMEM-free: returns false through
     * *fits when the KV pool cannot take it now). */
    kiln_status (*reserve)(kiln_executor *x, int slot, int tokens, bool *fits, kiln_error *err);
    /* Forget a slot's sequence and free its KV memory. */
    void (*release)(kiln_executor *x, int slot);
    void (*destroy)(kiln_executor *x);
    /* Optional (NULL = nothing to report): fill *info (zeroed by the caller). */
    void (*info)(kiln_executor *x, kiln_executor_info *info);
    /* Optional: the profile so far, when the executor was made to profile (GPU: measure knob
     * profile=1): up to `cap` rows into rows; returns how many there are (NULL = never profiles).
     * cap < 0: clear the sums (rows unused). */
    int (*profile)(kiln_executor *x, kiln_profile_row *rows, int cap);
} kiln_executor_ops;

struct kiln_executor {
    const kiln_executor_ops *ops;
    int max_seqs;        /* slots */
    int max_context;     /* tokens per sequence */
    int max_step_tokens; /* new tokens per step, all sequences together */
    int vocab;
    bool all_logits;     /* honours kiln_step.all_logits (else a step asking it is refused) */
};

/* Rows of logits step s returns: per returned sequence 1, or n_new where all_logits flags it. */
int64_t kiln_step_logit_rows(const kiln_step *s);

/* The random number in [0, 1) used to sample the token at `position`. */
double kiln_sample_uniform(uint64_t seed, int64_t position);
/* What a sampler (and an executor's kiln_step.next) gives for a row of logits that holds a NaN or
 * +inf, or no logit above -inf: no token (the scheduler fails the request with KILN_ERR_NUMERIC). */
#define KILN_TOKEN_NONFINITE (-2)
/* Whether a row of n logits holds a NaN or +inf, or no logit above -inf (sampler rule 0; kiln_score
 * refuses such rows too). */
bool kiln_logits_untrusted(const float *x, int n);
/* Sample from one row of logits with the request's settings and the uniform
 * number u (kiln_sample_uniform). `scratch` holds 2 × vocab floats. The
 * exact rule, which a device sampler must follow to give the same tokens,
 * opens runtime/sampler.c; a row it cannot trust gives KILN_TOKEN_NONFINITE. */
int32_t kiln_sample_logits(const float *logits, int vocab, const kiln_sampling *s, double u, float *scratch);
/* Apply penalties `p` in place to one row of logits, for the sequence
 * toks[0, n_total) whose first n_prompt tokens are its prompt: repetition
 * over all of them, then frequency and presence over the generated ones
 * (vLLM's order). `counts` is [vocab] zeros, left zeros. */
void kiln_apply_penalties(float *logits, int vocab, const int32_t *toks, int n_prompt, int n_total,
                          const kiln_penalties *p, int32_t *counts);
/* log-softmax of one row of logits (the model's distribution: no
 * temperature, no penalties): the log-probability of `token` into *lp and
 * the n_top (≤ vocab) most likely tokens in rank order (logit descending, id
 * ascending) into top_ids/top_lps. NaN logits count as probability 0
 * (log-probability -inf). */
void kiln_logprobs(const float *logits, int vocab, int32_t token, int n_top, float *lp, int32_t *top_ids,
                   float *top_lps);

/* Teacher-forced scoring (runtime/score.c): for each of the n sequences s (lens[s] >= 2 tokens, each
 * at most the executor's context), out[s][i] = log p(seqs[s][i + 1] | seqs[s][0..i]) for
 * i < lens[s] - 1, in slots 0..max_seqs-1 (which must be free; they are free again after). Read as
 * prompts are (chunks of up to max_step tokens a step, every position's logits returned) where the
 * executor's all_logits is set, else one token per step. */
kiln_status kiln_score_seqs(kiln_executor *x, int max_seqs, int max_step, const int32_t *const *seqs,
                            const int32_t *lens, int n, float *const *out, kiln_error *err);

#endif /* KILN_EXEC_H */
