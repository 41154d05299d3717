/*
 * exec.c — the CUDA executor: a kiln_executor that runs an engine's plan
 * on one GPU. Contracts in kiln_cuda_exec.h; kernels in kernels/NAME.cuh
 * (launch geometry in their header comments).
 *
 * Creation: parse the kernels section and load every module (the cubin for
 * this GPU, else PTX through the driver's JIT), translate the plan into a
 * program of device instructions (below), lay the weights out on the device
 * and upload them, allocate activations, scratch and the KV pool.
 *
 * The program. Each plan op maps to one instruction over device buffers;
 * every fusion across ops was decided by a pass (passes/, shown by
 * `kiln compile --dump-ir`) and is read from the plan, never inferred here:
 *   embedding            EMBED   gather rows of the table
 *   rmsnorm              NORM    rmsnorm kernel, x = 0; with +fold_into_gemv
 *                                (pass fold-norm-into-gemv) done at decode by
 *                                the next GEMV's prologue instead; with
 *                                +one_token (fold-norm-into-ck-gemv) only at
 *                                steps of one token
 *   add_rmsnorm(a, b)    NORM    rmsnorm kernel adding x into the residual
 *                                in place (the sum in the slot of the addend
 *                                plan memory gave it; else a copy first)
 *   linear_add(h, W, r)  GEMM    with the residual as the output: y = r + hW^T
 *                                in r's buffer when plan memory gave y r's
 *                                slot (pass fuse-linear-residual: o_proj,
 *                                down_proj)
 *   qkv_rope + attention QKV     one GEMM over [Wq; Wk; Wv], then rope_kv
 *                                (rotated q out, k and v into the KV cache)
 *                                except at decode with +decode_rope (pass
 *                                decode-attention-rope), where
 *                        ATTN    the decode kernel rotates q and the new k
 *                                itself and stores k, v (+ combine kernel;
 *                                with +merge_splits the last split block
 *                                merges instead) when every sequence adds one
 *                                token, else the prefill kernel
 *   gate_up_swiglu       GEMM    over the interleaved [gate; up] rows: the
 *                                GEMV's fused epilogue, or cuBLASLt + swiglu
 *   linear               GEMM
 *   lm_head              LMHEAD  on each sequence's last token only
 * and then SAMPLE. Each activation lives in its plan slot's buffer (memory
 * planning chose the slots and which outputs overwrite an input in place;
 * the plan reader checked their lifetimes): one device buffer per slot that
 * an instruction uses, of the slot's width in the engine's element type. Ops with no GPU kernel (the
 * unfused rope/add/mul/silu of `--passes none`) are refused by name.
 *
 * A step: host-side checks and KV blocks (kiln_kvpool.h), the step's
 * inputs written into one pinned staging area and copied to a fixed device
 * area in one transfer, the program, the sampled ids copied back. Decode
 * steps run as CUDA graphs captured once per batch bucket (1, 2, 4, 8, 16,
 * ... up to max_seqs), the batch padded with idle rows (KV slot -1, length
 * 0, greedy) — everything that varies is read from device memory, so one
 * graph serves every step of its bucket. Before a bucket's graph is
 * captured, the cuBLASLt algorithms of its GEMMs (buckets above the GEMV's
 * 8 rows) are chosen by timing (tune_decode; KILN_LT_TUNE=0 keeps the
 * heuristic's first answer, 2 reports: kiln_cuda_exec_opts.lt_tune, `kiln
 * bench --measure lt_tune=N`). Decode attention splits each sequence so that
 * the grid fills about two waves of the GPU (attn_waves, for measuring).
 * An engine's tuning record for this GPU (`kiln tune`; tuning_apply) gives
 * the cuBLASLt algorithms of the shapes it measured (then not timed again)
 * and the thresholds (GEMV token limits, RoPE split limit, attention waves)
 * in place of the built-in defaults.
 */
#include "kiln_cuda_exec.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../../kernels/params.cuh"
#include "../kiln_cuda.h"
#include "kiln_cuda_upload.h"
#include "../../format/kiln_ksec_read.h"
#include "kiln_kvpool.h"
#include "kiln_cuda_rank.h"

#define CX_MAX_ATTN 8
_Static_assert(KILN_TP_LOCAL_RANKS == KILN_TP_LOCAL_MAX, "kiln_cuda_rank.h and kernels/params.cuh agree");
#define CX_MAX_GRAPHS 24
#define CX_UPLOAD_PIECE (8u << 20)
#define CX_ROPE_SPLIT_MAX_T 64 /* steps of at most this many tokens spread rope_kv over the heads (default: an engine's
                                  tuning record may give another, tuning_apply) */
/* The quantized GEMV takes steps of up to this many rows (x tiles of 8, the weights re-read from L2),
 * dequantize + cuBLASLt above: on the H200, Mistral-7B int4 decode at batch 16 / 32 / 64 ran 3,156 /
 * 3,616 / 3,965 tok/s through the GEMV and 1,377 / 2,690 / 5,303 through cuBLASLt */
#define CX_QGEMV_MAX_M KILN_QGEMV_MAX_ROWS
/* Steps of more than this many rows, up to KILN_QGEMM_TM_MAX (64), take the quantized GEMM (qgemm.cuh)
 * where the engine has it (not over +act_fp8 matrices, whose steps past 32 rows are W8A8): on the
 * H200, `kiln_gpu_bench --qgemm` over Mistral-7B's q4g128 matrices, a layer's four GEMMs at 16 / 32 /
 * 64 rows took 133 / 239 / 340 us through the GEMV (dequantize at 64), 144 / 159 / 233 through it; at 128
 * rows dequantizing won, 353 against 381 */
#define CX_QGEMM_MIN_M 16
#define CX_ACTQ_THREADS 256 /* kiln_act_fp8's block (dequant.cuh's ACTQ_THREADS default) */
/* Rows of the buffers a step's GEMMs write (activations, QKV and gate/up scratch, logits): fp8g128's W8A8
 * runs a multiple of 4 (run_gemm_fp8). */
static size_t rows4(size_t r) { return (r + 3) & ~(size_t)3; }
#define CX_LT_WORKSPACE (32u << 20)
#define CX_DEFAULT_SEQS 8
/* The default step budget (new tokens per step, all sequences together), as vLLM's
 * max_num_batched_tokens: prefill GEMMs of 8,192 rows run at the GPU's peak, so chunking a long
 * prompt (or a large batch of prompts) into steps of 8,192 costs little, while the activations and
 * scratch, sized for one step, stay about 1.1 GB for Llama-3.1-8B shapes whatever the batch or
 * prompt length. Halved (not below max_seqs) while its scratch would take more than a quarter of
 * the memory left after the weights and an explicit KV pool (choose_step). */
#define CX_DEFAULT_STEP 8192

/* A weight tensor on the device: one plan weight, in the layout the compiler gave it (pack-weights
 * packed QKV and gate/up), converted to the device's element type on the way up. */
typedef struct cx_dw {
    int src;             /* plan weight index */
    int64_t rows, cols;  /* device shape (a vector is one row) */
    int qt;              /* quantized (q8, q4g*) and uploaded as stored, for the GEMV; 0 = dense */
    bool idx;            /* i32 indices (a permute op's), uploaded as stored */
    uint64_t offset;     /* in the device weights buffer, 256-aligned */
    bool gscales;        /* fp8g128 for W8A8: its scales also group-major ([groups][rows], cuBLASLt's VEC128_32F) */
    uint64_t gs_offset;  /* ... at this offset of the weights buffer, filled at load (kiln_transpose_f32) */
} cx_dw;

typedef enum { EPI_PLAIN = 0, EPI_SWIGLU = 1, EPI_F32OUT = 2 } cx_epi;

typedef struct cx_gemm {
    int dw;
    int n, k;            /* W is n x k; the output has n (plain, f32out) or n/2 (swiglu) columns */
    cx_epi epi;
    CUfunction m1, mma;  /* GEMV modules (mma = 0 on the f32 path); a quantized W: both its GEMV */
    kiln_gemv_cfg c1, cmma;
    int qt;              /* W's quantized dtype (q8, q4g*), or 0 */
    bool act8;           /* +act_fp8 (pass w8a8): steps past the quantized GEMV run W8A8 */
    bool fast8;          /* +fast_accum (pass w8a8-fast-accum): those GEMMs with FP8 fast accumulation */
    CUfunction swiglu;   /* prefill swiglu kernel (EPI_SWIGLU) */
    int swiglu_threads;
    bool out8;           /* +out_fp8 (pass swiglu-out-fp8) and the next instruction is the W8A8 GEMM reading
                            the product: at its W8A8 steps the SwiGLU writes its codes (writes_codes) */
    CUfunction swiglu8;  /* kiln_swiglu_fp8, with out8 */
    CUfunction qg[2];    /* the quantized GEMM, 32 ([0], module "<dtype>.mx32") and 64 ([1], ".mx") rows of x a
                            block, where the engine has them (NULL: not) */
    kiln_qgemm_cfg cqg[2];
} cx_gemm;

typedef struct cx_attn {
    int window;
    CUfunction decode, combine, prefill;
    CUfunction decode_tc;                  /* the tensor-core decode kernel (NULL: none, or measure knob decode_tc=0) */
    CUfunction prefill_mma, prefill_mma16; /* tensor cores, 32 and 16 query rows per warp (NULL: none) */
    CUfunction prefill_wg;                 /* wgmma (sm_90a cubins of a bf16 cache; NULL: none) */
    int partition, warps;
    unsigned smem_decode, smem_decode_tc, smem_prefill, smem_prefill_mma, smem_prefill_mma16, smem_prefill_wg;
} cx_attn;

/* A moe op (Mixtral's experts): its weights, constants and kernels. run_moe says which path a step takes. */
typedef struct cx_moe {
    int dw_router, dw_gu, dw_down; /* [E, H], [E, 2F, H] (F gate rows, then F up rows per expert), [E, H, F] */
    int E, k, f;
    CUfunction route, group, gather, combine; /* moe.cuh */
    CUfunction swiglu;                        /* the halves-layout SwiGLU after a cuBLASLt gate/up GEMM */
    int swiglu_threads;
    CUfunction gv_gu, gv_down;                /* expert GEMVs over (token, expert) pairs (gemv.cuh, GEMV_MOE 1) */
    kiln_gemv_cfg c_gu, c_down;
    CUfunction gg_gu, gg_down;                /* grouped expert GEMVs (GEMV_MOE 2; bf16 engines only, else 0) */
    kiln_gemv_cfg cg_gu, cg_down;
} cx_moe;

typedef enum { I_EMBED, I_NORM, I_COPY, I_QKV, I_ATTN, I_GEMM, I_LMHEAD, I_MOE, I_COLL, I_PERM } cx_ikind;

typedef struct cx_inst {
    cx_ikind kind;
    int op;         /* plan op, for messages */
    int x, y, res;  /* buffer ids (-1 = none) */
    int dw;         /* EMBED table, NORM weight, PERM indices */
    int dw_perm;    /* NORM with +out_perm: the order its output is written in (-1 = none) */
    int dw_bias, dw_qn, dw_kn; /* QKV: its packed bias and q/k norm weights (+qkv_bias, +qk_norm), -1 = none */
    int dw_kvs;                /* QKV, ATTN: the layer's kv_scale (an 8-bit KV cache), -1 = none */
    int layer;      /* QKV, ATTN */
    int attn;       /* ATTN: index into attn[] */
    CUfunction fn;  /* NORM: the rmsnorm kernel */
    CUfunction fn8; /* NORM, with out8: kiln_rmsnorm_fp8 */
    int threads;    /* NORM block size */
    bool fold;      /* NORM: +fold_into_gemv, and the next GEMM/QKV/LMHEAD reads its output as its input */
    bool fold1;     /* NORM: +one_token, so the fold applies only to steps of one token */
    bool out8;      /* NORM: +out_fp8 (pass norm-out-fp8), a plain RMSNorm (no add), and the next instruction a
                       W8A8 GEMM over fp8 rows reading its output: at its W8A8 steps the norm writes its codes */
    bool rope_in_attn; /* QKV and ATTN: +decode_rope on the attention: at decode it rotates and stores */
    bool merge;     /* ATTN: +merge_splits */
    float eps;      /* NORM */
    kiln_op_attrs rope; /* ATTN: its qkv_rope op's attributes (the rope constants, for the fused path) */
    int width;      /* COPY, COLL, PERM: elements per row */
    int base;       /* EMBED: the first id of this rank's rows of the table (vocabulary-parallel) */
    bool gather;    /* COLL: all_gather of the logits (else all_reduce of x into y) */
    bool part;      /* LMHEAD: this rank's slice of the vocabulary, into logits_part (an all_gather follows) */
    cx_gemm g;      /* GEMM, QKV, LMHEAD */
    cx_moe moe;     /* MOE */
} cx_inst;

/* Whether instruction `in` multiplies by a matrix (its g): QKV, GEMM and LMHEAD. */
static bool has_gemm(const cx_inst *in) { return in->kind == I_QKV || in->kind == I_GEMM || in->kind == I_LMHEAD; }

typedef struct cx_buf { /* one plan slot that some instruction reads or writes */
    size_t bytes;   /* per token row: the buffer holds max_rows rows */
    CUdeviceptr p;
} cx_buf;

typedef struct cx_graph {
    int B;
    CUgraphExec exec;
} cx_graph;

/* Offsets of the step inputs in the staging area (bytes). */
typedef struct cx_inputs {
    size_t tokens, pos, kvslot, last, lens, qstart, temp, topk, topp, seeds, ctr, bt, bytes;
} cx_inputs;

typedef struct cx {
    kiln_executor base; /* first member */
    const kiln_model *m;
    const kiln_plan *p;
    /* tensor parallelism (kiln_cuda_rank.h): this executor is rank `rank` of the plan's n_ranks */
    int rank, n_ranks;
    const kiln_plan_weight *pw; /* this rank's weight table */
    kiln_cuda cu;
    bool cu_ok;
    CUstream stream;
    bool shared_stream; /* the stream is rank 0's (ranks on one device): not destroyed here */
    CUevent done;       /* recorded after a step's work (kiln_cx_step_end) */
    kiln_cublaslt *lt;
    kiln_ksec ks;
    CUmodule *mods; /* [ks.n_modules]: a module sharing another's source has its owner's CUmodule */
    int n_mods;     /* entries of mods set; those with ks.modules[i].owner == i are loaded and unloaded */
    bool f32;
    int es; /* device element size */
    int kv8, kv_es; /* the KV cache: 1 FP8 E4M3 codes, 2 int8 codes (+kv_fp8, +kv_int8), 0 elements; bytes an element */
    int hidden, n_heads, n_kv, head_dim, vocab, n_layers, block_size, ffn_max;
    int max_rows; /* token rows of every activation buffer: the step budget */
    int free_window; /* window that lets KV blocks go (0 = keep all) */
    CUfunction f_gather, f_gather_cols, f_sample, f_rope, f_dequant;
    CUfunction f_act8;  /* kiln_act_fp8 (W8A8's per-token activations), when w8a8 */
    CUfunction f_act8g; /* kiln_act_fp8g and kiln_transpose_f32 (fp8g128's W8A8: scales per 128 columns), */
    CUfunction f_gt;    /* when the engine has them */
    bool w8a8_g128;     /* fp8g128 runs W8A8 too (unless measure knob w8a8=1; the engine's kernels, cuBLASLt's algorithms) */
    bool w8a8_fast;     /* +fast_accum is followed (unless measure knob w8a8_fast=0) */
    int dequant_threads;
    int rope_threads;
    cx_attn attn[CX_MAX_ATTN];
    int n_attn;
    /* weights */
    cx_dw *dw;
    int n_dw, cap_dw;
    CUdeviceptr dweights;
    size_t dweights_bytes;
    /* program */
    cx_inst *prog;
    int n_prog, cap_prog;
    cx_buf *bufs;
    int n_bufs, cap_bufs;
    int *slot_bufs;  /* plan slot -> its cx_buf (-1: no instruction uses the slot) */
    bool has_lm_head;
    /* scratch */
    CUdeviceptr qkv_tmp, q_tmp, gu_tmp, lm_x, logits, part_o, part_ml, ids, in_dev, kcache, vcache;
    CUdeviceptr deq_tmp; /* a quantized W dequantized, for steps past the quantized GEMV (max n x k elements) */
    CUdeviceptr qg_ws, qg_cnt; /* the quantized GEMM's split-K partials and tile counters (any qg module) */
    /* W8A8 (fp8 weights past the quantized GEMV on sm_89+, unless measure knob w8a8=0): a GEMM's input
     * quantized per token, E4M3 [rows, k] and the tokens' f32 scales */
    bool w8a8;
    CUdeviceptr act8, act8_scale;
    int vocab_part;          /* tp: the LM head's rows on this rank (its slice of the vocabulary) */
    CUdeviceptr logits_part; /* tp: fp32 [max_seqs, vocab_part], the LM head's output before the gather */
    CUdeviceptr rows_x, rows_logits; /* every row's logits (logits_rows): [rows_n, hidden], fp32 [rows_n, vocab] */
    int rows_n;                      /* their rows: 0 = not allocated yet, -1 = no room (the step's buffers) */
    CUdeviceptr gather_tmp;  /* tp: fp32 [n_ranks, max_seqs, vocab_part], what an NCCL all-gather writes */
    CUfunction f_tp_sum;     /* the all-reduce of ranks on one device */
    CUfunction f_tp_oneshot; /* the one-shot collectives of ranks that address each other's memory */
    /* the experts' scratch (moe_bytes()): routing, grouping, the grouped rows, their SwiGLU and outputs */
    int moe_e, moe_k, moe_f; /* the largest over the moe ops (0: none) */
    CUdeviceptr moe_scr, moe_sel, moe_wsel, moe_pos, moe_tok, moe_cnt, moe_xs, moe_act, moe_o;
    int32_t *moe_cnt_host; /* pinned [2 (E + 1)]: counts and offsets, read back for grouped steps */
    size_t kv_layer_bytes;
    int zmax;
    /* KV */
    kiln_kvpool kv;
    /* staging */
    cx_inputs in;
    uint8_t *in_host;   /* pinned */
    int32_t *ids_host;  /* pinned */
    cx_graph graphs[CX_MAX_GRAPHS];
    int n_graphs;
    bool no_graphs;
    bool pdl;
    CUdeviceptr attn_cnt; /* int32 [max_seqs, n_kv]: decode attention's split counters, zero between launches */
    int gemv_max_m; /* most tokens per step the tensor-core GEMV takes (else cuBLASLt) */
    bool gemv_fixed, qgemv_fixed; /* gemv_max_m / qgemv_max_m given by the caller: kiln tune keeps, not measures, them */
    bool qgemv_cc;    /* one-token steps over quantized weights on the CUDA-core GEMV (measure knob qgemv_cc=0: not) */
    bool qgemm;       /* steps of 17 to 64 rows over quantized weights on the quantized GEMM (measure knob qgemm=0: not) */
    bool prefill_wg;  /* prefill attention on the wgmma kernel where the engine has it (measure knob prefill_wg=0: not) */
    bool decode_tc;   /* decode attention on the tensor-core kernel where the engine has it (decode_tc=0: not) */
    bool decode_tc_all; /* ... at every decode step, not from decode_tc_min sequences (decode_tc=2) */
    int decode_tc_min;  /* ... from this many sequences a step: the option's, the record's or CX_DECODE_TC_MIN */
    bool moe_grouped; /* measure knob moe_grouped=1: decode batches past the experts' pair GEMVs run the
                         grouped tensor-core GEMVs instead of every expert through cuBLASLt */
    int qgemv_max_m; /* ... the quantized GEMV takes (else dequantize + cuBLASLt) */
    double attn_waves; /* KILN_ATTN_WAVES: decode attention splits aim for this many waves of the GPU (2) */
    int rope_split_max_t; /* steps of at most this many tokens spread rope_kv over the heads (CX_ROPE_SPLIT_MAX_T) */
    char tuning[96];   /* what the engine's tuning record gave this GPU, for kiln bench (tuning_apply) */
    int tuning_shapes; /* GEMM entries of the record in use (0: none) */
    int lt_tune;    /* KILN_LT_TUNE: cuBLASLt algorithms at decode: 0 heuristic's, 1 timed (default), 2 timed + reported */
    /* profiling (opts.profile): events around each instruction and the sampler, sums per kind of step */
    bool profile;
    CUevent *pev;          /* [2 × (n_prog + 1)]: before and after each instruction (and the sampler) */
    CUevent *pev_mid;      /* [n_prog]: QKV: between its GEMM and its rope_kv kernel */
    kiln_profile_row *prof; /* [2 × (2 n_prog + 1)]: prefill steps, then decode steps; each: the
                              instructions, the sampler, then the instructions' second parts (rope_kv) */
    int64_t prof_steps[2];
    int64_t bytes_now, bytes_peak;
    int64_t scratch_bytes; /* what the step budget costs: everything but weights and the KV pool (scratch_bytes()) */
    kiln_cuda_exec_stats stats;
} cx;

/* ---- device memory with accounting and clear out-of-memory messages ---- */

static kiln_status cx_alloc(cx *x, size_t bytes, const char *what, CUdeviceptr *out, kiln_error *err) {
    *out = 0;
    if (bytes == 0) bytes = 256;
    CUresult r = x->cu.api.cuMemAlloc(out, bytes);
    if (r != CUDA_SUCCESS) {
        *out = 0;
        size_t fr = 0, tot = 0;
        x->cu.api.cuMemGetInfo(&fr, &tot);
        if (r == CUDA_ERROR_OUT_OF_MEMORY) {
            kiln_err(err, KILN_ERR_NOMEM, "cuda executor: %s (%.1f MiB) does not fit on %s: %.1f MiB free of %.1f MiB",
                     what, (double)bytes / 1048576.0, x->cu.name, (double)fr / 1048576.0, (double)tot / 1048576.0);
            return kiln_err_hint(err, "give a smaller KV memory, max_seqs, max_context or max_step_tokens");
        }
        KILN_CU_CALL(&x->cu, err, r);
        return kiln_err_prefix(err, "cuda executor: allocating %s (%zu bytes): ", what, bytes);
    }
    x->bytes_now += (int64_t)bytes;
    if (x->bytes_now > x->bytes_peak) x->bytes_peak = x->bytes_now;
    return KILN_OK;
}

static void cx_release(cx *x, CUdeviceptr *p) {
    if (*p) x->cu.api.cuMemFree(*p);
    *p = 0;
}

/* ---- kernels ---- */

static kiln_status fn_get(cx *x, const char *module, const char *entry, CUfunction *out, const kiln_ksec_module **mod,
                          kiln_error *err) {
    *out = NULL;
    const kiln_ksec_module *km = kiln_ksec_find(&x->ks, module);
    if (!km) {
        kiln_err(err, KILN_ERR_FORMAT, "cuda executor: the engine's kernels section has no module '%s'", module);
        return kiln_err_hint(err, "the engine was built by another kiln; recompile it with this one");
    }
    if (mod) *mod = km;
    return kiln_cuda_module_function(&x->cu, x->mods[km - x->ks.modules], entry, out, err);
}

/* An entry the module may lack (engines from an older kiln, kernels built only for some targets): whether
 * it has it; *out NULL when not. */
static bool fn_has(cx *x, const char *module, const char *entry, CUfunction *out) {
    const kiln_ksec_module *km = kiln_ksec_find(&x->ks, module);
    *out = NULL;
    return km && kiln_cuda_module_has(&x->cu, x->mods[km - x->ks.modules], entry, out);
}

/* One cuModuleLoadData per distinct source (per owning module); a sharing
 * module resolves to its owner's CUmodule. */
static kiln_status load_modules(cx *x, kiln_error *err) {
    x->mods = calloc((size_t)x->ks.n_modules, sizeof *x->mods);
    kiln_cuda_image *ims = calloc((size_t)(x->ks.n_images ? x->ks.n_images : 1), sizeof *ims);
    if (!x->mods || !ims) {
        free(ims);
        return kiln_err(err, KILN_ERR_NOMEM, "cuda executor: out of memory");
    }
    kiln_status st = KILN_OK;
    double t0 = kiln_now();
    for (int mi = 0; mi < x->ks.n_modules && st == KILN_OK; mi++) {
        int owner = x->ks.modules[mi].owner; /* earlier than mi, or mi itself (ksec.c checked) */
        if (owner != mi) {
            x->mods[mi] = x->mods[owner];
            x->n_mods = mi + 1;
            continue;
        }
        int n = 0;
        for (int i = 0; i < x->ks.n_images; i++)
            if (x->ks.images[i].module == mi)
                ims[n++] = (kiln_cuda_image){x->ks.images[i].sm, x->ks.images[i].is_ptx, x->ks.images[i].data,
                                             x->ks.images[i].len};
        char what[96];
        snprintf(what, sizeof what, "engine kernel module '%s'", x->ks.modules[mi].name);
        bool jit = false;
        st = kiln_cuda_module_load(&x->cu, ims, n, what, &x->mods[mi], &jit, err);
        x->n_mods = mi + 1;
        x->stats.jitted |= jit;
    }
    x->stats.modules_seconds = kiln_now() - t0;
    free(ims);
    return st;
}

static kiln_status launch(cx *x, CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned smem,
                          void *params, const char *what, kiln_error *err) {
    kiln_cuda_dims d = {{gx, gy, gz}, {bx, 1, 1}, smem};
    void *args[] = {params};
    return kiln_cuda_launch_ex(&x->cu, f, &d, x->stream, args, x->pdl, what, err);
}

/* ---- the device weight layout ---- */

/* Device weight for plan weight src: a quantized one as stored (the GEMV reads it) unless `dense`
 * (the embedding gather), then dequantized to the device type on the way up; each form once. */
static int dw_add(cx *x, int src, bool dense, kiln_error *err) {
    const kiln_plan_weight *w = &x->pw[src];
    const int qt = kiln_dtype_is_quant((int)w->dtype) && !dense ? (int)w->dtype : 0;
    for (int i = 0; i < x->n_dw; i++)
        if (x->dw[i].src == src && x->dw[i].qt == qt) return i;
    if (x->n_dw == x->cap_dw) {
        int cap = x->cap_dw ? 2 * x->cap_dw : 64;
        cx_dw *n = realloc(x->dw, (size_t)cap * sizeof *n);
        if (!n) {
            kiln_err(err, KILN_ERR_NOMEM, "cuda executor: out of memory");
            return -1;
        }
        x->dw = n;
        x->cap_dw = cap;
    }
    int64_t rows = 1; /* a stack of matrices (the experts' [E, N, K]) is E x N rows */
    for (uint32_t d = 0; d + 1 < w->ndim; d++) rows *= w->shape[d];
    x->dw[x->n_dw] = (cx_dw){.src = src, .rows = rows, .cols = w->shape[w->ndim - 1], .qt = qt,
                             .idx = w->dtype == KILN_DTYPE_I32};
    return x->n_dw++;
}

static int64_t dw_bytes(const cx *x, const cx_dw *d) {
    if (d->qt) return (int64_t)kiln_weight_nbytes(d->qt, 2, (const int64_t[]){d->rows, d->cols});
    return d->rows * d->cols * (d->idx ? 4 : x->es);
}

/* Room for one more upload piece in *pc (n used of *cap), or NULL when memory ran out. */
static kiln_upload_piece *piece_new(kiln_upload_piece **pc, int *n, int *cap) {
    if (*n == *cap) {
        int c = *cap ? 2 * *cap : 1024;
        kiln_upload_piece *np = realloc(*pc, (size_t)c * sizeof *np);
        if (!np) return NULL;
        *pc = np;
        *cap = c;
    }
    kiln_upload_piece *p = &(*pc)[(*n)++];
    memset(p, 0, sizeof *p);
    return p;
}

/* The upload pieces of every device weight, rows chunked to CX_UPLOAD_PIECE: a copy, with the
 * element type converted where the engine's is not the device's (a quantized table the gather reads
 * is dequantized); a quantized matrix for the GEMV goes up as stored, in pieces of bytes. */
static kiln_status upload_weights(cx *x, int threads, kiln_error *err) {
    kiln_upload_piece *pc = NULL, *q;
    int n = 0, cap = 0;
    size_t buf = CX_UPLOAD_PIECE;
    kiln_status st = KILN_OK;
    for (int i = 0; i < x->n_dw; i++) {
        const cx_dw *d = &x->dw[i];
        const kiln_plan_weight *w = &x->pw[d->src];
        if (d->qt || d->idx) { /* the codes, then the scales (and minimums); or indices */
            const int64_t total = dw_bytes(x, d);
            for (int64_t b0 = 0; b0 < total; b0 += CX_UPLOAD_PIECE) {
                if (!(q = piece_new(&pc, &n, &cap))) goto nomem;
                *q = (kiln_upload_piece){.dst = x->dweights + d->offset + (uint64_t)b0,
                                         .a = x->m->weights + w->offset + b0,
                                         .rows = 1,
                                         .cols = total - b0 < CX_UPLOAD_PIECE ? total - b0 : CX_UPLOAD_PIECE,
                                         .src_dtype = w->dtype,
                                         .raw = true};
            }
            continue;
        }
        const bool deq = kiln_dtype_is_quant((int)w->dtype);
        int64_t row_dst = d->cols * x->es, row_src = deq ? 0 : d->cols * kiln_dtype_size((kiln_dtype)w->dtype);
        if ((size_t)row_dst > buf) buf = (size_t)row_dst;
        int64_t per = (int64_t)CX_UPLOAD_PIECE / row_dst;
        if (per < 1) per = 1;
        for (int64_t r0 = 0; r0 < d->rows; r0 += per) {
            if (!(q = piece_new(&pc, &n, &cap))) goto nomem;
            *q = (kiln_upload_piece){.dst = x->dweights + d->offset + (uint64_t)(r0 * row_dst),
                                     .a = x->m->weights + w->offset + r0 * row_src, /* deq: the whole weight */
                                     .rows = d->rows - r0 < per ? d->rows - r0 : per,
                                     .cols = d->cols,
                                     .src_dtype = w->dtype,
                                     .q_rows = deq ? d->rows : 0,
                                     .r0 = r0};
        }
    }
    double t0 = kiln_now();
    int64_t bytes = 0;
    st = kiln_upload_pieces(&x->cu, pc, n, x->f32, threads, buf, &bytes, err);
    x->stats.upload_seconds = kiln_now() - t0;
    x->stats.upload_gbps = x->stats.upload_seconds > 0 ? (double)bytes / x->stats.upload_seconds / 1e9 : 0;
    free(pc);
    return st;
nomem:
    free(pc);
    return kiln_err(err, KILN_ERR_NOMEM, "cuda executor: out of memory");
}

/* ---- the program ---- */

/* The buffer of plan slot `slot` (a cx_buf index), made at its first use: memory planning
 * (passes/plan_memory.c) chose which values share it, and the plan reader checked their lifetimes. */
static int slot_buf(cx *x, int32_t slot, kiln_error *err) {
    if (x->slot_bufs[slot] >= 0) return x->slot_bufs[slot];
    if (x->n_bufs == x->cap_bufs) {
        int cap = x->cap_bufs ? 2 * x->cap_bufs : 16;
        cx_buf *n = realloc(x->bufs, (size_t)cap * sizeof *n);
        if (!n) {
            kiln_err(err, KILN_ERR_NOMEM, "cuda executor: out of memory");
            return -1;
        }
        x->bufs = n;
        x->cap_bufs = cap;
    }
    x->bufs[x->n_bufs] = (cx_buf){(size_t)x->p->slots[slot].width * (size_t)x->es, 0};
    return x->slot_bufs[slot] = x->n_bufs++;
}

static cx_inst *emit(cx *x, cx_ikind kind, int op, kiln_error *err) {
    if (x->n_prog == x->cap_prog) {
        int cap = x->cap_prog ? 2 * x->cap_prog : 64;
        cx_inst *n = realloc(x->prog, (size_t)cap * sizeof *n);
        if (!n) {
            kiln_err(err, KILN_ERR_NOMEM, "cuda executor: out of memory");
            return NULL;
        }
        x->prog = n;
        x->cap_prog = cap;
    }
    cx_inst *in = &x->prog[x->n_prog++];
    memset(in, 0, sizeof *in);
    in->kind = kind;
    in->op = op;
    in->x = in->y = in->res = in->dw = in->dw_perm = -1;
    return in;
}

/* After the upload: fp8g128 weights that W8A8 reads get their scales group-major too. */
static kiln_status gscales_fill(cx *x, kiln_error *err) {
    for (int i = 0; i < x->n_dw; i++) {
        const cx_dw *d = &x->dw[i];
        if (!d->gscales) continue;
        const int groups = (int)kiln_quant_groups(d->qt, d->cols);
        kiln_transpose_params tp = {x->dweights + d->offset + kiln_quant_scales_offset(d->qt, d->rows, d->cols),
                                    x->dweights + d->gs_offset, (int)d->rows, groups};
        const size_t n = (size_t)d->rows * (size_t)groups;
        kiln_status st = launch(x, x->f_gt, (unsigned)((n + 255) / 256), 1, 1, 256, 0, &tp, "kiln_transpose_f32", err);
        if (st) return st;
    }
    return KILN_CU_CALL(&x->cu, err, x->cu.api.cuStreamSynchronize(x->stream));
}

/* The GEMV module of an n x k weight with epilogue epi and variant ("m1", "mma", or a quantized
 * dtype's name): its kernel and launch shape. */
static kiln_status gemv_fn(cx *x, const char *epi, int n, int k, const char *variant, CUfunction *fn,
                           kiln_gemv_cfg *cfg, kiln_error *err) {
    char name[KILN_KSEC_NAME_MAX];
    const kiln_ksec_module *km = NULL;
    kiln_ksec_gemv_name(name, sizeof name, epi, n, k, variant);
    kiln_status st = fn_get(x, name, "kiln_gemv", fn, &km, err);
    if (st) return st;
    /* the launch kinds this runtime knows (kiln_gemv_dims): another would get a wrong grid, silently */
    if (km->cfg[0] < 1 || km->cfg[1] < 0 || km->cfg[4] < 0 || km->cfg[4] > 2 || (km->cfg[4] == 2 && km->cfg[1] < 1)) {
        kiln_err(err, KILN_ERR_FORMAT, "cuda executor: GEMV module '%s' has a launch this runtime does not know "
                 "(warps %d, rows %d, kind %d)", name, km->cfg[0], km->cfg[1], km->cfg[4]);
        return kiln_err_hint(err, "the engine was built by another kiln; recompile it with this one");
    }
    *cfg = (kiln_gemv_cfg){km->cfg[0], km->cfg[1], km->cfg[2], km->cfg[3], km->cfg[4]};
    return KILN_OK;
}

static kiln_status gemm_setup(cx *x, cx_gemm *g, int dw, cx_epi epi, const kiln_op_attrs *a, kiln_error *err) {
    const cx_dw *d = &x->dw[dw];
    g->dw = dw;
    g->n = (int)d->rows;
    g->k = (int)d->cols;
    g->epi = epi;
    g->qt = d->qt;
    g->act8 = (a->flags & KILN_FLAG_ACT_FP8) != 0; /* fp8 / fp8g128: checked with the plan (kiln_op_infer) */
    g->fast8 = (a->flags & KILN_FLAG_FP8_FAST) && x->w8a8_fast; /* fp8 (a scale a row) only: kiln_op_infer */
    static const char *epis[] = {"plain", "swiglu", "f32out"};
    char name[KILN_KSEC_NAME_MAX];
    const kiln_ksec_module *km = NULL;
    kiln_status st;
    if (g->qt) { /* one GEMV for every M it takes; past that, dequantize for cuBLASLt */
        if (g->k % 16 || (int64_t)g->n * g->k > ((int64_t)1 << 31))
            return kiln_err(err, KILN_ERR_UNSUPPORTED, "cuda executor: quantized weight '%s' [%d, %d]: the GPU reads "
                            "quantized matrices with columns a multiple of 16 and fewer than 2^31 elements",
                            x->pw[d->src].name, g->n, g->k);
        if ((st = gemv_fn(x, epis[epi], g->n, g->k, kiln_dtype_name((kiln_dtype)g->qt), &g->mma, &g->cmma, err)))
            return st;
        g->m1 = g->mma;
        g->c1 = g->cmma;
        /* one-token steps on the CUDA-core GEMV where the engine has it (q8/fp8 engines before
         * kiln 0.5 do not; measure knob qgemv_cc=0 keeps the tensor cores) */
        char cc[24];
        for (int ck = 1; ck >= 0 && x->qgemv_cc; ck--) { /* the K-splitting one (".ck") where the engine has it */
            kiln_ksec_gemv_cc_variant(cc, sizeof cc, kiln_dtype_name((kiln_dtype)g->qt), ck);
            kiln_ksec_gemv_name(name, sizeof name, epis[epi], g->n, g->k, cc);
            if (!kiln_ksec_find(&x->ks, name)) continue;
            if ((st = gemv_fn(x, epis[epi], g->n, g->k, cc, &g->m1, &g->c1, err))) return st;
            break;
        }
        /* steps of 17 to 64 rows on the quantized GEMM where the engine has it (from 2026-12-04) */
        for (int v = 0; v < 2 && x->qgemm && !g->act8; v++) {
            kiln_ksec_gemv_qg_variant(cc, sizeof cc, kiln_dtype_name((kiln_dtype)g->qt), v ? 64 : 32);
            kiln_ksec_gemv_name(name, sizeof name, epis[epi], g->n, g->k, cc);
            if (!kiln_ksec_find(&x->ks, name)) continue;
            if ((st = fn_get(x, name, "kiln_qgemm", &g->qg[v], &km, err))) return st;
            g->cqg[v] = (kiln_qgemm_cfg){km->cfg[0], km->cfg[1], km->cfg[2], kiln_quant_bits(g->qt),
                                         kiln_quant_group(g->qt)};
            if (g->cqg[v].warps < 1 || (g->cqg[v].tm != 32 && g->cqg[v].tm != 64) || g->cqg[v].tm != (v ? 64 : 32) ||
                g->cqg[v].stages < 2) {
                kiln_err(err, KILN_ERR_FORMAT, "cuda executor: quantized GEMM module '%s' has a launch this runtime "
                         "does not know (warps %d, rows %d, stages %d)", name, km->cfg[0], km->cfg[1], km->cfg[2]);
                return kiln_err_hint(err, "the engine was built by another kiln; recompile it with this one");
            }
        }
        if (!x->f_dequant) {
            if ((st = fn_get(x, "dequant", "kiln_dequant", &x->f_dequant, &km, err))) return st;
            x->dequant_threads = km->cfg[0] > 0 ? km->cfg[0] : 256;
        }
        /* W8A8 where the engine's dequant module has the activations' kernels (kiln 0.5 on) */
        if (g->qt == KILN_DTYPE_FP8 && g->act8 && x->w8a8 && !x->f_act8 &&
            !fn_has(x, "dequant", "kiln_act_fp8", &x->f_act8))
            x->w8a8 = false;
        if (g->qt == KILN_DTYPE_FP8G128 && g->act8 && x->w8a8 && x->w8a8_g128 && !x->f_act8g &&
            !(fn_has(x, "dequant", "kiln_act_fp8g", &x->f_act8g) &&
              fn_has(x, "dequant", "kiln_transpose_f32", &x->f_gt)))
            x->w8a8_g128 = false;
        if (g->qt == KILN_DTYPE_FP8G128 && g->act8 && x->w8a8 && x->w8a8_g128) x->dw[dw].gscales = true;
    } else {
        if ((st = gemv_fn(x, epis[epi], g->n, g->k, "m1", &g->m1, &g->c1, err))) return st;
        if (!x->f32 && (st = gemv_fn(x, epis[epi], g->n, g->k, "mma", &g->mma, &g->cmma, err))) return st;
    }
    if (epi == EPI_SWIGLU) {
        snprintf(name, sizeof name, "swiglu.f%d", g->n / 2);
        if ((st = fn_get(x, name, "kiln_swiglu", &g->swiglu, &km, err))) return st;
        g->swiglu_threads = km->cfg[0];
        /* an engine whose module lacks the kernel writes bf16 */
        g->out8 = (a->flags & KILN_FLAG_OUT_FP8) && fn_has(x, name, "kiln_swiglu_fp8", &g->swiglu8);
        if (g->n / 2 > x->ffn_max) x->ffn_max = g->n / 2;
    }
    return KILN_OK;
}

/* Module km was built for the KV cache the plan has (cfg[at] = KILN_KV8): an engine whose kernels
 * would read the cache as another type is refused, not run. */
static const char *kv8_name(int kv8) { return kv8 == 1 ? "FP8 codes" : kv8 == 2 ? "int8 codes" : "elements"; }
static kiln_status kv8_check(cx *x, const kiln_ksec_module *km, int at, kiln_error *err) {
    if (km->cfg[at] == x->kv8) return KILN_OK;
    return kiln_err(err, KILN_ERR_FORMAT, "cuda executor: kernel module %s is built for a KV cache of %s, the plan's "
                    "attention keeps %s", km->name, kv8_name(km->cfg[at]), kv8_name(x->kv8));
}

static int attn_get(cx *x, int window, kiln_error *err) {
    for (int i = 0; i < x->n_attn; i++)
        if (x->attn[i].window == window) return i;
    if (x->n_attn == CX_MAX_ATTN) {
        kiln_err(err, KILN_ERR_UNSUPPORTED, "cuda executor: more than %d different attention windows", CX_MAX_ATTN);
        return -1;
    }
    cx_attn *a = &x->attn[x->n_attn];
    memset(a, 0, sizeof *a);
    a->window = window;
    char name[KILN_KSEC_NAME_MAX];
    const kiln_ksec_module *km = NULL;
    snprintf(name, sizeof name, "attn_decode.w%d", window);
    if (fn_get(x, name, "kiln_attn_decode", &a->decode, &km, err) ||
        fn_get(x, name, "kiln_attn_decode_combine", &a->combine, NULL, err))
        return -1;
    a->partition = km->cfg[0];
    a->warps = km->cfg[1];
    if (kv8_check(x, km, 2, err)) return -1;
    a->smem_decode =
        kiln_attn_decode_smem(x->n_heads, x->n_kv, x->head_dim, x->block_size, a->partition, a->warps);
    /* the tensor-core decode kernel where codegen compiled it (engines from 2026-12-03 with an FP8 cache, 4 to 8
     * query heads a kv head at head_dim 128) */
    a->smem_decode_tc = kiln_attn_decode_tc_smem(x->head_dim, x->block_size, a->partition, a->warps, x->kv_es);
    if (x->decode_tc && a->smem_decode_tc <= (unsigned)x->cu.smem_optin)
        fn_has(x, name, "kiln_attn_decode_tc", &a->decode_tc);
    snprintf(name, sizeof name, "attn_prefill.w%d", window);
    if (fn_get(x, name, "kiln_attn_prefill", &a->prefill, &km, err) || kv8_check(x, km, 1, err)) return -1;
    /* The tensor-core kernels: _mma16 always (so an engine from before it existed, whose _mma had
     * 16 rows per warp, fails here instead of running wrong), _mma (32 rows per warp) where the
     * kernel has it (head_dim <= 128: above, O alone would take 256 registers a thread) and its
     * shared memory fits (not on sm_86/89 at head_dim 128). */
    a->smem_prefill = kiln_attn_prefill_smem(x->head_dim);
    a->smem_prefill_mma = kiln_attn_prefill_mma_smem(x->head_dim, KILN_PF_MMA_WARPS, 2, x->kv8 != 0);
    a->smem_prefill_mma16 = kiln_attn_prefill_mma_smem(x->head_dim, KILN_PF_MMA_WARPS, 1, x->kv8 != 0);
    if (km->cfg[0] && fn_get(x, name, "kiln_attn_prefill_mma16", &a->prefill_mma16, NULL, err)) return -1;
    if (km->cfg[0] && x->head_dim <= 128 && a->smem_prefill_mma <= (unsigned)x->cu.smem_optin &&
        fn_get(x, name, "kiln_attn_prefill_mma", &a->prefill_mma, NULL, err))
        return -1;
    /* the wgmma kernel where the module has it (sm_90a cubins built since 2026-12-02, a bf16 cache) and
     * its shared memory fits; measure knob prefill_wg=0 keeps mma.sync */
    a->smem_prefill_wg = kiln_attn_prefill_wg_smem(x->head_dim, KILN_PF_WG_GROUPS);
    if (km->cfg[0] && x->prefill_wg && !x->kv8 && a->smem_prefill_wg <= (unsigned)x->cu.smem_optin)
        fn_has(x, name, "kiln_attn_prefill_wg", &a->prefill_wg);
    /* raise the shared-memory limits once, outside any graph capture */
    const unsigned need[] = {a->smem_decode, a->smem_decode_tc, a->smem_prefill, a->smem_prefill_mma,
                             a->smem_prefill_mma16, a->smem_prefill_wg};
    const CUfunction fs[] = {a->decode, a->decode_tc, a->prefill, a->prefill_mma, a->prefill_mma16, a->prefill_wg};
    for (size_t i = 0; i < sizeof fs / sizeof fs[0]; i++)
        if (fs[i] && kiln_cuda_func_smem(&x->cu, fs[i], need[i], "attention", err)) {
            if (err->code == KILN_ERR_DEVICE) err->code = KILN_ERR_UNSUPPORTED;
            kiln_err_prefix(err, "cuda executor: ");
            return -1;
        }
    return x->n_attn++;
}

static int64_t vwidth(const kiln_plan *p, int32_t v) { return p->values[v].shape[2]; }

static kiln_status unsupported_op(const cx *x, uint32_t i, const char *why, kiln_error *err) {
    kiln_err(err, KILN_ERR_UNSUPPORTED, "cuda executor: plan op %u (%s): %s", i,
             kiln_op_name((kiln_op_kind)x->p->ops[i].kind), why);
    return kiln_err_hint(err, "compile the engine with the default passes (the GPU runs the fused ops)");
}

/* The device weight of plan value v into *dw: read dense (tables, norms, biases), or as a GEMV's
 * matrix (quantized ones as stored). */
static kiln_status value_weight(cx *x, int32_t v, bool dense, int *dw, kiln_error *err) {
    *dw = dw_add(x, x->p->values[v].weight, dense, err);
    return *dw < 0 ? err->code : KILN_OK;
}

/* The buffer of activation value v's plan slot, into vb[v]. */
static kiln_status value_buf(cx *x, int32_t *vb, int32_t v, kiln_error *err) {
    vb[v] = slot_buf(x, x->p->values[v].slot, err);
    return vb[v] < 0 ? KILN_ERR_NOMEM : KILN_OK;
}
/* Whether plan memory put activation values a and b in one slot (an op's output over an input it
 * overwrites in place). */
static bool same_slot(const cx *x, int32_t a, int32_t b) {
    return x->p->values[a].kind == KILN_PV_ACT && x->p->values[b].kind == KILN_PV_ACT &&
           x->p->values[a].slot == x->p->values[b].slot;
}

/* A moe op's weights and kernels (modules named as codegen/kernels_section.c's add_moe names them). */
static kiln_status moe_setup(cx *x, const kiln_plan_op *op, cx_moe *mo, kiln_error *err) {
    const kiln_op_attrs *a = &op->attrs;
    const int h = x->hidden, f = (int)x->p->values[op->in[3]].shape[2];
    mo->E = a->n_experts;
    mo->k = a->top_k;
    mo->f = f;
    kiln_status st;
    if ((st = value_weight(x, op->in[1], true, &mo->dw_router, err)) ||
        (st = value_weight(x, op->in[2], true, &mo->dw_gu, err)) ||
        (st = value_weight(x, op->in[3], true, &mo->dw_down, err)))
        return st;
    char name[KILN_KSEC_NAME_MAX];
    const kiln_ksec_module *km = NULL;
    snprintf(name, sizeof name, "moe.e%d.k%d.h%d%s", mo->E, mo->k, h, (a->flags & KILN_FLAG_MOE_NO_RENORM) ? ".nr" : "");
    if ((st = fn_get(x, name, "kiln_moe_route", &mo->route, &km, err)) ||
        (st = fn_get(x, name, "kiln_moe_group", &mo->group, NULL, err)) ||
        (st = fn_get(x, name, "kiln_moe_gather", &mo->gather, NULL, err)) ||
        (st = fn_get(x, name, "kiln_moe_combine", &mo->combine, NULL, err)) ||
        (st = gemv_fn(x, "swiglu", 2 * f, h, "moe", &mo->gv_gu, &mo->c_gu, err)) ||
        (st = gemv_fn(x, "f32out", h, f, "moe", &mo->gv_down, &mo->c_down, err)) ||
        (!x->f32 && ((st = gemv_fn(x, "swiglu", 2 * f, h, "moeg", &mo->gg_gu, &mo->cg_gu, err)) ||
                     (st = gemv_fn(x, "f32out", h, f, "moeg", &mo->gg_down, &mo->cg_down, err)))))
        return st;
    snprintf(name, sizeof name, "swiglu.f%d.halves", f);
    if ((st = fn_get(x, name, "kiln_swiglu", &mo->swiglu, &km, err))) return st;
    mo->swiglu_threads = km->cfg[0];
    if (f > x->ffn_max) x->ffn_max = f; /* the gate/up scratch holds a step's [T, 2F] */
    if (mo->E > x->moe_e) x->moe_e = mo->E;
    if (mo->k > x->moe_k) x->moe_k = mo->k;
    if (f > x->moe_f) x->moe_f = f;
    return KILN_OK;
}

static kiln_status build_program(cx *x, kiln_error *err) {
    const kiln_plan *p = x->p;
    const uint32_t nv = p->n_values;
    kiln_status st = KILN_OK;
    int32_t *uses = calloc(nv, sizeof *uses), *vb = malloc(nv * sizeof *vb);
    uint8_t *virt = calloc(nv, 1);
    x->slot_bufs = malloc((p->n_slots ? p->n_slots : 1) * sizeof *x->slot_bufs);
    if (!uses || !vb || !virt || !x->slot_bufs) {
        st = kiln_err(err, KILN_ERR_NOMEM, "cuda executor: out of memory");
        goto out;
    }
    for (uint32_t v = 0; v < nv; v++) vb[v] = -1;
    for (uint32_t s = 0; s < p->n_slots; s++) x->slot_bufs[s] = -1;
    for (uint32_t i = 0; i < p->n_ops; i++)
        for (uint32_t j = 0; j < p->ops[i].n_in; j++) uses[p->ops[i].in[j]]++;
    int qkv_op = -1, qkv_inst = -1; /* the qkv_rope op (and its instruction) whose q, k, v await their attention */
    int32_t lm_part = -1;           /* tp: the LM head's slice of the logits, which the all_gather reads */
    bool gathered = false;
    for (uint32_t i = 0; i < p->n_ops; i++) {
        const kiln_plan_op *op = &p->ops[i];
        const kiln_op_attrs *a = &op->attrs;
        const int32_t *in = op->in, *o = op->out;
        cx_inst *ins = NULL;
        switch ((kiln_op_kind)op->kind) {
        case KILN_OP_EMBEDDING:
            if (in[0] != p->tokens) {
                st = unsupported_op(x, i, "embeds a value other than the token ids", err);
                goto out;
            }
            if (!(ins = emit(x, I_EMBED, (int)i, err))) goto nomem;
            if ((st = value_weight(x, in[1], true, &ins->dw, err))) goto out;
            /* vocabulary-parallel: rank r's table holds ids r x rows ..; the all_reduce after it adds the ranks' */
            ins->base = a->ranks ? x->rank * (int)x->dw[ins->dw].rows : 0;
            if ((st = value_buf(x, vb, o[0], err))) goto out;
            ins->y = vb[o[0]];
            break;
        case KILN_OP_RMSNORM:
        case KILN_OP_ADD_RMSNORM: {
            bool add = op->kind == KILN_OP_ADD_RMSNORM;
            int32_t wv = in[add ? 2 : 1], yv = o[add ? 1 : 0];
            if (!(ins = emit(x, I_NORM, (int)i, err))) goto nomem;
            uint32_t bits;
            memcpy(&bits, &a->eps, 4);
            char name[KILN_KSEC_NAME_MAX];
            snprintf(name, sizeof name, "rmsnorm.e%08x", bits);
            const kiln_ksec_module *km = NULL;
            if ((st = fn_get(x, name, "kiln_rmsnorm", &ins->fn, &km, err))) goto out;
            ins->threads = km->cfg[0];
            ins->eps = a->eps;
            ins->fold = (a->flags & KILN_FLAG_FOLD_INTO_GEMV) && uses[yv] == 1; /* checked against the next
                                                                                   instruction below */
            ins->fold1 = (a->flags & KILN_FLAG_FOLD_ONE_TOKEN) != 0;
            ins->out8 = !add && (a->flags & KILN_FLAG_OUT_FP8) && fn_has(x, name, "kiln_rmsnorm_fp8", &ins->fn8);
            if ((st = value_weight(x, wv, true, &ins->dw, err))) goto out;
            if ((a->flags & KILN_FLAG_OUT_PERM) &&
                ((st = value_weight(x, in[add ? 3 : 2], true, &ins->dw_perm, err)) ||
                 (st = kiln_cuda_func_smem(&x->cu, ins->fn, (unsigned)(x->hidden * x->es), "kiln_rmsnorm (+out_perm)",
                                           err))))
                goto out;
            if (!add) {
                ins->res = vb[in[0]];
            } else if (same_slot(x, o[0], in[0]) || same_slot(x, o[0], in[1])) {
                /* the sum in place over the addend whose slot plan memory gave it */
                const int k = same_slot(x, o[0], in[0]) ? 0 : 1;
                ins->res = vb[in[k]];
                ins->x = vb[in[1 - k]];
                vb[o[0]] = vb[in[k]];
            } else {
                /* both inputs live on: the sum needs its own buffer (copy a, add b) */
                if ((st = value_buf(x, vb, o[0], err))) goto out;
                cx_inst *cp = ins; /* reuse this slot for the copy, then a new NORM */
                cp->kind = I_COPY;
                cp->x = vb[in[0]];
                cp->y = vb[o[0]];
                cp->width = (int)vwidth(p, o[0]);
                CUfunction f = cp->fn;
                int th = cp->threads, d = cp->dw, dp = cp->dw_perm;
                if (!(ins = emit(x, I_NORM, (int)i, err))) goto nomem;
                ins->fn = f;
                ins->threads = th;
                ins->dw = d;
                ins->dw_perm = dp;
                ins->res = vb[o[0]];
                ins->x = vb[in[1]];
            }
            if ((st = value_buf(x, vb, yv, err))) goto out;
            ins->y = vb[yv];
            break;
        }
        case KILN_OP_LINEAR: {
            int dw;
            if ((st = value_weight(x, in[1], false, &dw, err))) goto out;
            if (!(ins = emit(x, I_GEMM, (int)i, err))) goto nomem;
            ins->x = vb[in[0]];
            if ((st = gemm_setup(x, &ins->g, dw, EPI_PLAIN, a, err))) goto out;
            if ((st = value_buf(x, vb, o[0], err))) goto out;
            ins->y = vb[o[0]];
            break;
        }
        case KILN_OP_LINEAR_ADD: {
            /* y = r + hW^T: the GEMM accumulates into r's buffer when plan memory gave y r's slot (r dies
             * here); else r is copied into y's own buffer first */
            int dw;
            if ((st = value_weight(x, in[1], false, &dw, err))) goto out;
            const int32_t r = in[2];
            if (vb[r] < 0) {
                st = unsupported_op(x, i, "its residual is not an activation this executor holds", err);
                goto out;
            }
            if (!same_slot(x, o[0], r)) {
                if ((st = value_buf(x, vb, o[0], err))) goto out;
                if (!(ins = emit(x, I_COPY, (int)i, err))) goto nomem;
                ins->x = vb[r];
                ins->y = vb[o[0]];
                ins->width = (int)vwidth(p, o[0]);
            } else {
                vb[o[0]] = vb[r];
            }
            if (!(ins = emit(x, I_GEMM, (int)i, err))) goto nomem;
            ins->x = vb[in[0]];
            ins->y = ins->res = vb[o[0]];
            if ((st = gemm_setup(x, &ins->g, dw, EPI_PLAIN, a, err))) goto out;
            break;
        }
        case KILN_OP_QKV_ROPE:
        case KILN_OP_GATE_UP_SWIGLU:
            st = unsupported_op(x, i, "its weights are not packed into the GPU's layout", err);
            kiln_err_hint(err, "compile the engine with the default passes (pass pack-weights packs them)");
            goto out;
        case KILN_OP_QKV_ROPE_PACKED: {
            for (int j = 0; j < 3; j++)
                if (uses[o[j]] != 1) {
                    st = unsupported_op(x, i, "its q, k and v must feed exactly one attention op", err);
                    goto out;
                }
            int dw;
            /* [Wq; Wk; Wv], packed by the compiler */
            if ((st = value_weight(x, in[1], false, &dw, err))) goto out;
            if (!x->f_rope) {
                const kiln_ksec_module *km = NULL;
                if ((st = fn_get(x, "rope_kv", "kiln_rope_kv", &x->f_rope, &km, err))) goto out;
                x->rope_threads = km->cfg[0];
                if ((st = kv8_check(x, km, 1, err))) goto out;
            }
            if (!(ins = emit(x, I_QKV, (int)i, err))) goto nomem;
            ins->x = vb[in[0]];
            ins->layer = a->layer;
            ins->dw_bias = ins->dw_qn = ins->dw_kn = ins->dw_kvs = -1; /* the optional inputs after positions */
            uint32_t extra = 3;
            if ((a->flags & KILN_FLAG_QKV_BIAS) && (st = value_weight(x, in[extra++], true, &ins->dw_bias, err)))
                goto out;
            if (a->flags & KILN_FLAG_QK_NORM) {
                if ((st = value_weight(x, in[extra++], true, &ins->dw_qn, err))) goto out;
                if ((st = value_weight(x, in[extra++], true, &ins->dw_kn, err))) goto out;
            }
            if ((st = gemm_setup(x, &ins->g, dw, EPI_PLAIN, a, err))) goto out;
            for (int j = 0; j < 3; j++) virt[o[j]] = 1;
            qkv_op = (int)i;
            qkv_inst = x->n_prog - 1;
            break;
        }
        case KILN_OP_ATTENTION: {
            if (qkv_op < 0 || !virt[in[0]] || !virt[in[1]] || !virt[in[2]] || p->ops[qkv_op].out[0] != in[0] ||
                p->ops[qkv_op].out[1] != in[1] || p->ops[qkv_op].out[2] != in[2]) {
                st = unsupported_op(x, i, "attention over q, k, v that do not come from the qkv_rope op before it", err);
                goto out;
            }
            if (p->ops[qkv_op].attrs.layer != a->layer) {
                st = unsupported_op(x, i, "attention reads another layer's KV cache than its qkv_rope wrote", err);
                goto out;
            }
            if (a->layer < 0 || a->layer >= x->n_layers) {
                st = unsupported_op(x, i, "layer index outside the model's layers", err);
                goto out;
            }
            if ((a->flags & KILN_FLAG_DECODE_ROPE) &&
                (p->ops[qkv_op].attrs.flags & (KILN_FLAG_QKV_BIAS | KILN_FLAG_QK_NORM))) {
                st = unsupported_op(x, i, "+decode_rope over a qkv_rope with biases or q/k norms (the attention "
                                          "kernel's rotation has neither)", err);
                goto out;
            }
            if (!(ins = emit(x, I_ATTN, (int)i, err))) goto nomem;
            ins->layer = a->layer;
            ins->dw_kvs = -1;
            if (x->kv8) { /* the scales the layer's codes are written (rope) and read (attention) with */
                if ((st = value_weight(x, in[4], true, &ins->dw_kvs, err))) goto out;
                x->prog[qkv_inst].dw_kvs = ins->dw_kvs;
            }
            ins->rope = p->ops[qkv_op].attrs;
            ins->rope_in_attn = x->prog[qkv_inst].rope_in_attn = (a->flags & KILN_FLAG_DECODE_ROPE) != 0;
            ins->merge = (a->flags & KILN_FLAG_MERGE_SPLITS) != 0;
            if ((ins->attn = attn_get(x, a->window, err)) < 0) {
                st = err->code;
                goto out;
            }
            if (a->window == 0) x->free_window = -1; /* a full-attention layer keeps every block */
            else if (x->free_window >= 0 && a->window > x->free_window) x->free_window = a->window;
            if ((st = value_buf(x, vb, o[0], err))) goto out;
            ins->y = vb[o[0]];
            qkv_op = qkv_inst = -1;
            break;
        }
        case KILN_OP_GATE_UP_SWIGLU_PACKED: {
            int dw;
            /* gate/up rows interleaved by the compiler */
            if ((st = value_weight(x, in[1], false, &dw, err))) goto out;
            if (!(ins = emit(x, I_GEMM, (int)i, err))) goto nomem;
            ins->x = vb[in[0]];
            if ((st = gemm_setup(x, &ins->g, dw, EPI_SWIGLU, a, err))) goto out;
            ins->g.out8 = ins->g.out8 && uses[o[0]] == 1; /* and the reader is the next instruction: below */
            if ((st = value_buf(x, vb, o[0], err))) goto out;
            ins->y = vb[o[0]];
            break;
        }
        case KILN_OP_LM_HEAD: {
            if (o[0] != p->logits && (x->n_ranks < 2 || lm_part >= 0)) {
                st = unsupported_op(x, i, "the LM head does not produce the plan's logits", err);
                goto out;
            }
            int dw;
            if ((st = value_weight(x, in[1], false, &dw, err))) goto out;
            if (!(ins = emit(x, I_LMHEAD, (int)i, err))) goto nomem;
            ins->x = vb[in[0]];
            if ((st = gemm_setup(x, &ins->g, dw, EPI_F32OUT, a, err))) goto out;
            x->has_lm_head = true;
            if (o[0] != p->logits) { /* tp: this rank's slice of the vocabulary, gathered next */
                ins->part = true;
                lm_part = o[0];
                x->vocab_part = ins->g.n;
            }
            break;
        }
        case KILN_OP_ALL_REDUCE: /* NCCL's, or kiln_tp_sum for ranks on one device: the TP driver runs it */
            if (x->n_ranks < 2 || vb[in[0]] < 0) {
                st = unsupported_op(x, i, x->n_ranks < 2 ? "a collective in a plan of one rank"
                                                         : "its input is not an activation this executor holds", err);
                goto out;
            }
            if (!(ins = emit(x, I_COLL, (int)i, err))) goto nomem;
            ins->x = vb[in[0]];
            ins->width = (int)vwidth(p, o[0]);
            if (same_slot(x, o[0], in[0])) { /* in place: plan memory gave the sum the part's slot */
                vb[o[0]] = vb[in[0]];
            } else if ((st = value_buf(x, vb, o[0], err))) {
                goto out;
            }
            ins->y = vb[o[0]];
            break;
        case KILN_OP_ALL_GATHER:
            if (lm_part < 0 || in[0] != lm_part || o[0] != p->logits || gathered) {
                st = unsupported_op(x, i, "the GPU gathers only the LM head's slices into the plan's logits", err);
                goto out;
            }
            if (!(ins = emit(x, I_COLL, (int)i, err))) goto nomem;
            ins->gather = true;
            gathered = true;
            break;
        case KILN_OP_HEAD_RMSNORM: /* Qwen's q/k norms and biases run inside qkv_rope (pass fuse-qkv-rope) */
        case KILN_OP_BIAS_ADD:
            st = unsupported_op(x, i, "Qwen's q/k norms and q/k/v biases run on the GPU only fused into qkv_rope", err);
            kiln_err_hint(err, "compile the engine with the default passes (fuse-qkv-rope), or run it on the CPU "
                               "(--device cpu)");
            goto out;
        case KILN_OP_PERMUTE: /* act-order GPTQ: the projection after it reads its input in this order */
            if (vb[in[0]] < 0) {
                st = unsupported_op(x, i, "its input is not an activation this executor holds", err);
                goto out;
            }
            if (!(ins = emit(x, I_PERM, (int)i, err))) goto nomem;
            if ((st = value_weight(x, in[1], true, &ins->dw, err))) goto out;
            ins->x = vb[in[0]];
            ins->width = (int)vwidth(p, o[0]);
            if ((st = value_buf(x, vb, o[0], err))) goto out;
            ins->y = vb[o[0]];
            break;
        case KILN_OP_MOE: /* the experts of Mixtral and Qwen3-MoE: y = sum of the chosen experts' SwiGLU MLPs */
            if (!(ins = emit(x, I_MOE, (int)i, err))) goto nomem;
            if ((st = moe_setup(x, op, &ins->moe, err))) goto out;
            ins->x = vb[in[0]];
            if ((st = value_buf(x, vb, o[0], err))) goto out;
            ins->y = vb[o[0]];
            break;
        default:
            st = unsupported_op(x, i, "no GPU kernel for this op", err);
            goto out;
        }
        if (ins && ((ins->kind == I_NORM && (ins->res < 0 || (op->kind == KILN_OP_ADD_RMSNORM && ins->x < 0))) ||
                    ((has_gemm(ins) || ins->kind == I_MOE) && ins->x < 0))) {
            st = unsupported_op(x, i, "its input is not an activation this executor holds", err);
            goto out;
        }
    }
    if (!x->has_lm_head) st = kiln_err(err, KILN_ERR_UNSUPPORTED, "cuda executor: the plan has no lm_head op");
    else if (lm_part >= 0 && !gathered)
        st = kiln_err(err, KILN_ERR_UNSUPPORTED, "cuda executor: the LM head's slices of the vocabulary are never "
                      "gathered into the plan's logits");
    /* a norm folds into the GEMV after it when that GEMV reads its output over the whole hidden width and
     * does not write over the norm's input (which plan memory keeps alive for +fold_into_gemv since plan
     * version 4) */
    for (int i = 0; i < x->n_prog; i++) {
        cx_inst *n = &x->prog[i];
        if (n->kind != I_NORM) continue;
        const cx_inst *g = i + 1 < x->n_prog ? &x->prog[i + 1] : NULL;
        n->fold = n->fold && n->x < 0 && g && has_gemm(g) &&
                  g->x == n->y && g->g.k == x->hidden && (g->y < 0 || g->y != n->res);
    }
    /* a SwiGLU writes codes only for the next instruction, a W8A8 GEMM over fp8 rows reading its product */
    for (int i = 0; i < x->n_prog; i++) {
        cx_inst *s = &x->prog[i];
        if (s->kind != I_GEMM || !s->g.out8) continue;
        const cx_inst *g = i + 1 < x->n_prog ? &x->prog[i + 1] : NULL;
        s->g.out8 = g && g->kind == I_GEMM && g->x == s->y && g->g.act8 && g->g.qt == KILN_DTYPE_FP8 &&
                    g->g.k == s->g.n / 2;
    }
    /* and a norm for the next instruction, a W8A8 GEMM or QKV over fp8 rows reading its output */
    for (int i = 0; i < x->n_prog; i++) {
        cx_inst *n = &x->prog[i];
        if (n->kind != I_NORM || !n->out8) continue;
        const cx_inst *g = i + 1 < x->n_prog ? &x->prog[i + 1] : NULL;
        n->out8 = n->x < 0 && g && (g->kind == I_GEMM || g->kind == I_QKV) && g->x == n->y && g->g.act8 &&
                  g->g.qt == KILN_DTYPE_FP8 && g->g.k == x->hidden;
    }
    if (x->free_window < 0) x->free_window = 0;
    goto out;
nomem:
    st = KILN_ERR_NOMEM;
out:
    free(uses);
    free(vb);
    free(virt);
    return st;
}

/* ---- running the program ---- */

static CUdeviceptr bufp(const cx *x, int b) { return b >= 0 ? x->bufs[b].p : 0; }
static CUdeviceptr dwp(const cx *x, int d) { return x->dweights + x->dw[d].offset; }
static CUdeviceptr inp(const cx *x, size_t off) { return x->in_dev + off; }

typedef kiln_cx_shape cx_shape;

static bool w8a8_runs(const cx *x, const cx_gemm *g);
static size_t act8_cols(const cx *x, size_t *scales);
/* The most rows a step multiplies by quantized matrix g through the quantized GEMV: qgemv_max_m
 * (CX_QGEMV_MAX_M, the tuning record's or the knob's), but for a W8A8 one (+act_fp8) never more than
 * KILN_QGEMV_MAX_ROWS, the steps past which the plan's flag says are W8A8, on the CPU executor as here. */
static int qgemv_rows(const cx *x, const cx_gemm *g) {
    return x->qgemv_max_m > KILN_QGEMV_MAX_ROWS && w8a8_runs(x, g) ? KILN_QGEMV_MAX_ROWS : x->qgemv_max_m;
}
/* The fewest rows past which some step dequantizes or quantizes activations (their scratch is needed) */
static int qgemv_rows_min(const cx *x) {
    return x->qgemv_max_m > KILN_QGEMV_MAX_ROWS && act8_cols(x, NULL) > 0 ? KILN_QGEMV_MAX_ROWS : x->qgemv_max_m;
}

/* Whether a step of M rows runs quantized GEMM g on the quantized GEMM (qgemm.cuh): from
 * CX_QGEMM_MIN_M + 1 to 64 rows where the engine has the module, unless the measurement knob
 * gemv_max_m keeps the GEMV up to its rows. */
static bool qgemm_path(const cx *x, const cx_gemm *g, int M) {
    if (!g->qt || M <= CX_QGEMM_MIN_M || M > KILN_QGEMM_TM_MAX || !g->qg[M > 32]) return false;
    return !(x->qgemv_fixed && M <= x->qgemv_max_m);
}

/* Whether a step of M rows runs GEMM g as a GEMV: the CUDA-core GEMV up to KILN_GEMV_MAX_M rows, the
 * tensor-core one up to gemv_max_m (KILN_GEMV_MAX_M unless the measurement knob says otherwise),
 * the quantized one up to qgemv_rows but where the quantized GEMM takes the step; cuBLASLt above. */
static bool gemv_path(const cx *x, const cx_gemm *g, int M) {
    if (g->qt) return M <= qgemv_rows(x, g) && !qgemm_path(x, g, M);
    return M <= (g->mma ? x->gemv_max_m : KILN_GEMV_MAX_M);
}

/* Whether NORM instruction i is folded into the GEMV after it in a step of this shape. */
static bool norm_folds(const cx *x, int i, const cx_shape *sh) {
    const cx_inst *n = &x->prog[i];
    if (n->kind != I_NORM || !n->fold) return false;
    const cx_inst *g = &x->prog[i + 1]; /* exists: fold was set only then */
    const int rows = g->kind == I_LMHEAD ? sh->B : sh->T;
    if (n->fold1 && rows != 1) return false; /* +one_token: longer steps run the norm kernel */
    if (g->kind == I_LMHEAD) return sh->decode && gemv_path(x, &g->g, sh->B); /* prefill gathers the normed rows */
    return gemv_path(x, &g->g, sh->T);
}

/* Whether cuBLASLt writes GEMM g's output in fp32 (f32 engines, the logits). */
static bool lt_out_f32(const cx *x, const cx_gemm *g) { return x->f32 || g->epi == EPI_F32OUT; }

/* The widest k of a W8A8 GEMM (its quantized activations are rows x that bytes; 0 without one), and the
 * most scales a row of them has (1, or fp8g128's groups). */
static size_t act8_cols(const cx *x, size_t *scales) {
    size_t k = 0, sc = 1;
    for (int i = 0; i < x->n_prog; i++) {
        const cx_inst *in = &x->prog[i];
        if (!has_gemm(in) || !w8a8_runs(x, &in->g)) continue;
        if ((size_t)in->g.k > k) k = (size_t)in->g.k;
        const size_t g = (size_t)kiln_quant_groups(in->g.qt, in->g.k);
        if (g > sc) sc = g;
    }
    if (scales) *scales = sc;
    return k;
}

/* Whether GEMM g, past the quantized GEMV, runs W8A8 (else its weight is dequantized for a bf16 GEMM). */
static bool w8a8_runs(const cx *x, const cx_gemm *g) {
    return g->act8 && x->w8a8 && (g->qt == KILN_DTYPE_FP8 || (g->qt == KILN_DTYPE_FP8G128 && x->w8a8_g128));
}
/* W8A8 with scales per 128 columns (fp8g128) rather than per row */
static bool w8a8_g(const cx_gemm *g) { return g->qt == KILN_DTYPE_FP8G128; }
/* Its scales and accumulation, as cuBLASLt is asked for them */
static kiln_lt_fp8 w8a8_mode(const cx_gemm *g) {
    return w8a8_g(g) ? KILN_LT_FP8_BLOCK128 : g->fast8 ? KILN_LT_FP8_ROWS_FAST : KILN_LT_FP8_ROWS;
}
/* The weight scales W8A8's GEMM reads: per row after the codes, or fp8g128's group-major copy. */
static CUdeviceptr w8a8_wscale(const cx *x, const cx_gemm *g) {
    const cx_dw *d = &x->dw[g->dw];
    return x->dweights + (w8a8_g(g) ? d->gs_offset : d->offset + kiln_quant_scales_offset(g->qt, g->n, g->k));
}

/* What a GEMM of a step hands on in E4M3 (+out_fp8): codes_out, a SwiGLU GEMM writes the next GEMM's codes
 * instead of its bf16 product; codes_in (the SwiGLU GEMM or the RMSNorm before, or NULL), this W8A8 GEMM
 * reads them. */
typedef struct cx_gemm_io {
    bool codes_out;
    const cx_inst *codes_in;
} cx_gemm_io;

/* Whether instruction i (a SwiGLU GEMM or an RMSNorm, +out_fp8) writes the next GEMM's codes in a step of T
 * rows: that GEMM runs W8A8 at T rows. */
static bool writes_codes(const cx *x, int i, int T) {
    if (i < 0 || i + 1 >= x->n_prog) return false;
    const cx_inst *in = &x->prog[i];
    if (!(in->kind == I_GEMM ? in->g.out8 : in->kind == I_NORM && in->out8)) return false;
    const cx_gemm *nx = &x->prog[i + 1].g;
    return w8a8_runs(x, nx) && !gemv_path(x, nx, T);
}

/* The SwiGLU of gate/up GEMM g's product (x->gu_tmp) over M rows: bf16 into out, or with codes (+out_fp8)
 * the E4M3 codes and per-token scales of the W8A8 GEMM after it into x->act8 and x->act8_scale. */
static kiln_status run_swiglu(cx *x, const cx_gemm *g, int M, CUdeviceptr out, bool codes, kiln_error *err) {
    kiln_swiglu_params sp = {x->gu_tmp, codes ? x->act8 : out, M, 0, codes ? x->act8_scale : 0};
    if (codes)
        return launch(x, g->swiglu8, (unsigned)M < KILN_CUDA_GRID_YZ_MAX ? (unsigned)M : KILN_CUDA_GRID_YZ_MAX, 1, 1,
                      KILN_SWIGLU_FP8_THREADS, 0, &sp, "kiln_swiglu_fp8", err);
    kiln_cuda_dims d = kiln_swiglu_dims(g->n / 2, M, g->swiglu_threads, x->f32 ? 4 : 8);
    return launch(x, g->swiglu, d.grid[0], d.grid[1], 1, d.block[0], 0, &sp, "kiln_swiglu", err);
}

/* NORM instruction n over a step's T rows: its bf16 output, or (codes, +out_fp8) the E4M3 codes and per-token
 * scales of the W8A8 GEMM after it into x->act8 and x->act8_scale. */
static kiln_status run_norm(cx *x, const cx_inst *n, int T, bool codes, kiln_error *err) {
    kiln_rmsnorm_params np = {bufp(x, n->x), bufp(x, n->res), dwp(x, n->dw), bufp(x, n->y), T, 0,
                              codes ? x->act8 : 0, codes ? x->act8_scale : 0, n->dw_perm >= 0 ? dwp(x, n->dw_perm) : 0};
    /* +out_perm: the normalised row goes through shared memory (kiln_rmsnorm) */
    const unsigned smem = n->dw_perm >= 0 ? (unsigned)(x->hidden * x->es) : 0u;
    return launch(x, codes ? n->fn8 : n->fn, (unsigned)T, 1, 1, (unsigned)n->threads, smem, &np,
                  codes ? "kiln_rmsnorm_fp8" : "kiln_rmsnorm", err);
}

/* run_gemm's W8A8 route for an fp8 or fp8g128 W (codes w): the M rows of x quantized per token
 * (kiln_act_fp8) or per token and 128 columns (kiln_act_fp8g), then cuBLASLt's FP8 GEMM with both
 * operands' scales (w8a8_wscale); a SwiGLU GEMM through the gate/up scratch. KILN_ERR_UNSUPPORTED
 * (nothing written but the scratch) when cuBLASLt has no FP8 algorithm for the shape. */
static kiln_status run_gemm_fp8(cx *x, const cx_gemm *g, int M, CUdeviceptr in, CUdeviceptr w, CUdeviceptr out,
                                bool res, const cx_gemm_io *io, kiln_error *err) {
    const bool grp = w8a8_g(g);
    /* 128-column scales: M padded to a multiple of 4 (cuBLASLt reads each group's token scales 16-byte
     * aligned); the pad rows' codes are zeros, their outputs land in rows the buffers have (rows4) and
     * no later instruction reads */
    const int Mp = grp ? (int)rows4((size_t)M) : M;
    kiln_act_fp8_params ap = {in, x->act8, x->act8_scale, Mp, g->k, M, 0};
    kiln_status st = KILN_OK;
    if (!io->codes_in && (st = launch(x, grp ? x->f_act8g : x->f_act8, (unsigned)Mp, 1, 1, CX_ACTQ_THREADS, 0, &ap,
                                      grp ? "kiln_act_fp8g" : "kiln_act_fp8", err)))
        return st;
    const bool swiglu = g->epi == EPI_SWIGLU;
    st = kiln_cublaslt_gemm_fp8(x->lt, lt_out_f32(x, g), w8a8_mode(g), Mp, g->n, g->k, x->act8, x->act8_scale, w,
                                w8a8_wscale(x, g), swiglu ? x->gu_tmp : out, swiglu ? false : res, x->stream, err);
    if (st == KILN_ERR_UNSUPPORTED && io->codes_in) {
        /* the dequantized route reads the bf16 input, which the instruction before wrote as codes: once more,
         * the SwiGLU from its gate/up product (still in gu_tmp), the RMSNorm (no add) from its input, both into
         * this GEMM's input `in` (the norm's output buffer) */
        kiln_error e2 = {0};
        const cx_inst *c = io->codes_in;
        if (c->kind == I_GEMM ? run_swiglu(x, &c->g, M, in, false, &e2) : run_norm(x, c, M, false, &e2)) {
            *err = e2;
            return e2.code;
        }
    }
    if (st || !swiglu) return st;
    return run_swiglu(x, g, M, out, io->codes_out, err);
}

/* y = x·W^T (+ y when res) for M rows; with norm (a folded NORM instruction),
 * x is its residual input and the GEMV normalises it on the way in; io (NULL: neither) says whether a
 * SwiGLU GEMM writes the next W8A8 GEMM's codes, and whether this one reads codes a SwiGLU wrote. */
static kiln_status run_gemm(cx *x, const cx_gemm *g, int M, CUdeviceptr in, CUdeviceptr out, bool res,
                            const cx_inst *norm, const cx_gemm_io *io, kiln_error *err) {
    static const cx_gemm_io plain = {false, NULL};
    if (!io) io = &plain;
    CUdeviceptr w = dwp(x, g->dw);
    const int ldy = g->epi == EPI_SWIGLU ? g->n / 2 : g->n;
    /* a quantized W: its scales (and q4's minimums) after the codes (common/quant.c) */
    const CUdeviceptr wscale = g->qt ? w + kiln_quant_scales_offset(g->qt, g->n, g->k) : 0;
    const int group = kiln_quant_group(g->qt);
    const CUdeviceptr wmin = kiln_quant_bits(g->qt) == 4 ? w + kiln_quant_mins_offset(g->qt, g->n, g->k) : 0;
    if (gemv_path(x, g, M)) {
        bool m1 = M == 1 || !g->mma;
        const kiln_gemv_cfg *c = m1 ? &g->c1 : &g->cmma;
        kiln_gemv_params prm = {in, w, out, res ? out : 0, M, g->n, g->k, g->k, ldy, 0, 0, 0.0f, 0, wscale, wmin, 0, 0, 0, 0};
        if (norm) {
            prm.x = bufp(x, norm->res);
            prm.norm_w = dwp(x, norm->dw);
            prm.norm_eps = norm->eps;
        }
        kiln_cuda_dims d = kiln_gemv_dims(c, M, g->n);
        return launch(x, m1 ? g->m1 : g->mma, d.grid[0], d.grid[1], 1, d.block[0], 0, &prm, "kiln_gemv", err);
    }
    if (qgemm_path(x, g, M)) { /* the codes read once per block of rows, no dense copy */
        const kiln_qgemm_cfg *c = &g->cqg[M > 32];
        int chunks, splits = kiln_qgemm_splits(c, M, g->n, g->k, x->cu.n_sm, &chunks);
        kiln_qgemm_params q = {{in, w, out, res ? out : 0, M, g->n, g->k, g->k, ldy, 0, 0, 0.0f, 0, wscale, wmin, 0, 0, 0, 0},
                               splits > 1 ? x->qg_ws : 0, splits > 1 ? x->qg_cnt : 0, splits, chunks};
        kiln_cuda_dims d = kiln_qgemm_dims(c, M, g->n, splits);
        return launch(x, g->qg[M > 32], d.grid[0], d.grid[1], d.grid[2], d.block[0], d.smem, &q, "kiln_qgemm", err);
    }
    if (w8a8_runs(x, g)) { /* W8A8: x quantized per token, cuBLASLt's FP8 GEMM */
        kiln_status st = run_gemm_fp8(x, g, M, in, w, out, res, io, err);
        if (st != KILN_ERR_UNSUPPORTED) return st;
        /* this cuBLASLt has no FP8 algorithm for the shape: the dequantized route from now on */
        if (w8a8_g(g)) x->w8a8_g128 = false;
        else x->w8a8 = false;
        kiln_err_clear(err);
    }
    if (g->qt) { /* more rows than the quantized GEMV takes: a dense copy for cuBLASLt */
        kiln_dequant_params dp = {w,    wscale, wmin, x->deq_tmp, g->n, g->k, kiln_quant_bits(g->qt), group,
                                  kiln_quant_is_fp8(g->qt), 0};
        const size_t th = (size_t)x->dequant_threads, blocks = ((size_t)g->n * (size_t)g->k / 8 + th - 1) / th;
        kiln_status st = launch(x, x->f_dequant, (unsigned)blocks, 1, 1, (unsigned)th, 0, &dp, "kiln_dequant", err);
        if (st) return st;
        w = x->deq_tmp;
    }
    if (g->epi == EPI_SWIGLU) {
        kiln_status st = kiln_cublaslt_gemm_ex(x->lt, x->f32, lt_out_f32(x, g), M, g->n, g->k, in, w, x->gu_tmp,
                                               false, x->stream, err);
        if (st) return st;
        /* codes only while the next GEMM still runs W8A8: a fallback of this one above (cuBLASLt without an FP8
         * algorithm) turned W8A8 off for the fp8 matrices after it too */
        return run_swiglu(x, g, M, out, io->codes_out && x->w8a8, err);
    }
    return kiln_cublaslt_gemm_ex(x->lt, x->f32, lt_out_f32(x, g), M, g->n, g->k, in, w, out, res, x->stream, err);
}

/* Whether a step of T tokens runs moe instruction mo's experts as GEMVs over the (token, expert) pairs:
 * each pair reads its expert's weights, so past E pairs the step would read more than every expert once
 * (on the H200 a pair's expert took 0.09 ms, every expert over a batch through cuBLASLt 0.85 ms a layer
 * of Mixtral; 8 tokens as 16 pairs ran at 776 tok/s on 8 layers, 16 tokens through cuBLASLt at 2,389). */
static bool moe_pairs(const cx *x, const cx_moe *mo, int T) {
    return T <= x->gemv_max_m && (int64_t)T * mo->k <= (mo->E > mo->k ? mo->E : mo->k);
}

/* The experts of one moe instruction over a step's T rows. Routing (kiln_moe_route) leaves each token's
 * experts and weights on the device; one of three paths computes the experts' outputs o, and
 * kiln_moe_combine sums each token's in expert order:
 *  - at most gemv_max_m tokens making at most E pairs (moe_pairs; decode at small batches): expert
 *    GEMVs over the (token, expert) pairs, the expert ids read on the device: only the chosen experts'
 *    weights are read, once per pair (so past E pairs this would read more than every expert once);
 *  - other decode steps: every expert over the whole batch through cuBLASLt, the combine taking the
 *    chosen ones. At these batches every expert is read anyway and the extra products hide behind
 *    the reads: on the H200 at batch 64 this read Mixtral's experts at 3.2 TB/s, where the grouped
 *    tensor-core GEMVs (the pairs grouped by expert on the device, each expert's weights read once
 *    for all of its rows; measure knob moe_grouped=1) reached 2.5 (docs/benchmarks.md);
 *  - prefill and mixed steps: the pairs grouped by expert on the device (kiln_moe_group: counts, prefix
 *    sums, a scatter; kiln_moe_gather), the counts read back (a host sync per layer), then per expert
 *    with tokens one cuBLASLt GEMM pair over its rows.
 * Decode steps never sync with the host: they are replayed as CUDA graphs. */
static kiln_status run_moe(cx *x, const cx_inst *in, const cx_shape *sh, kiln_error *err) {
    const cx_moe *mo = &in->moe;
    const int T = sh->T, H = x->hidden, F = mo->f, E = mo->E, K = mo->k;
    const size_t es = (size_t)x->es;
    const CUdeviceptr X = bufp(x, in->x), wgu = dwp(x, mo->dw_gu), wdn = dwp(x, mo->dw_down);
    const CUdeviceptr offsets = x->moe_cnt + (size_t)(E + 1) * 4;
    kiln_moe_params mp = {.x = X, .router = dwp(x, mo->dw_router), .sel = x->moe_sel, .wsel = x->moe_wsel,
                          .counts = x->moe_cnt, .offsets = offsets, .pos = x->moe_pos, .tok = x->moe_tok,
                          .xs = x->moe_xs, .o = x->moe_o, .y = bufp(x, in->y), .M = T, .mode = 2, .o_f32 = 1};
    kiln_status st = launch(x, mo->route, (unsigned)T, 1, 1, 256, 0, &mp, "kiln_moe_route", err);
    if (st) return st;
    if (moe_pairs(x, mo, T)) {
        kiln_gemv_params g = {.x = X, .w = wgu, .y = x->moe_act, .M = 1, .N = 2 * F, .K = H, .ldx = H, .ldy = F,
                              .moe_sel = x->moe_sel, .moe_wstride = 2LL * F * H, .moe_xdiv = K};
        kiln_cuda_dims d = kiln_gemv_dims(&mo->c_gu, 1, 2 * F);
        if ((st = launch(x, mo->gv_gu, d.grid[0], d.grid[1], (unsigned)(T * K), d.block[0], 0, &g,
                         "kiln_gemv (experts' gate/up)", err)))
            return st;
        g = (kiln_gemv_params){.x = x->moe_act, .w = wdn, .y = x->moe_o, .M = 1, .N = H, .K = F, .ldx = F, .ldy = H,
                               .moe_sel = x->moe_sel, .moe_wstride = (long long)H * F, .moe_xdiv = 1};
        d = kiln_gemv_dims(&mo->c_down, 1, H);
        if ((st = launch(x, mo->gv_down, d.grid[0], d.grid[1], (unsigned)(T * K), d.block[0], 0, &g,
                         "kiln_gemv (experts' down)", err)))
            return st;
        mp.mode = 0;
        return launch(x, mo->combine, (unsigned)T, 1, 1, 256, 0, &mp, "kiln_moe_combine", err);
    }
    if (sh->decode && !(x->moe_grouped && mo->gg_gu)) { /* every expert over every token; o is [E, T, H] */
        for (int e = 0; e < E && !st; e++) {
            kiln_swiglu_params sp = {x->gu_tmp, x->moe_act, T, 0, 0};
            kiln_cuda_dims d = kiln_swiglu_dims(F, T, mo->swiglu_threads, x->f32 ? 4 : 8);
            if ((st = kiln_cublaslt_gemm_ex(x->lt, x->f32, x->f32, T, 2 * F, H, X,
                                            wgu + (size_t)e * 2 * (size_t)F * (size_t)H * es, x->gu_tmp, false,
                                            x->stream, err)) ||
                (st = launch(x, mo->swiglu, d.grid[0], d.grid[1], 1, d.block[0], 0, &sp, "kiln_swiglu", err)))
                break;
            st = kiln_cublaslt_gemm_ex(x->lt, x->f32, true, T, H, F, x->moe_act,
                                       wdn + (size_t)e * (size_t)H * (size_t)F * es,
                                       x->moe_o + (size_t)e * (size_t)T * (size_t)H * 4, false, x->stream, err);
        }
        if (st) return st;
        mp.mode = 1;
        mp.ldo = T;
        return launch(x, mo->combine, (unsigned)T, 1, 1, 256, 0, &mp, "kiln_moe_combine", err);
    }
    if ((st = launch(x, mo->group, 1, 1, 1, 1024, 0, &mp, "kiln_moe_group", err)) ||
        (st = launch(x, mo->gather, (unsigned)(T * K), 1, 1, 128, 0, &mp, "kiln_moe_gather", err)))
        return st;
    if (sh->decode) {
        kiln_gemv_params g = {.x = x->moe_xs, .w = wgu, .y = x->moe_act, .M = T * K, .N = 2 * F, .K = H, .ldx = H,
                              .ldy = F, .moe_sel = offsets, .moe_wstride = 2LL * F * H};
        if ((st = launch(x, mo->gg_gu, (unsigned)((2 * F + 15) / 16), (unsigned)E, 1,
                         (unsigned)(mo->cg_gu.warps * 32), 0, &g, "kiln_gemv (grouped experts' gate/up)", err)))
            return st;
        g = (kiln_gemv_params){.x = x->moe_act, .w = wdn, .y = x->moe_o, .M = T * K, .N = H, .K = F, .ldx = F,
                               .ldy = H, .moe_sel = offsets, .moe_wstride = (long long)H * F};
        if ((st = launch(x, mo->gg_down, (unsigned)((H + 15) / 16), (unsigned)E, 1, (unsigned)(mo->cg_down.warps * 32),
                         0, &g, "kiln_gemv (grouped experts' down)", err)))
            return st;
        return launch(x, mo->combine, (unsigned)T, 1, 1, 256, 0, &mp, "kiln_moe_combine", err);
    }
    if ((st = KILN_CU_CALL(&x->cu, err, x->cu.api.cuMemcpyDtoHAsync(x->moe_cnt_host, x->moe_cnt,
                                                                    (size_t)(E + 1) * 2 * 4, x->stream))) ||
        (st = KILN_CU_CALL(&x->cu, err, x->cu.api.cuStreamSynchronize(x->stream))))
        return st;
    const int32_t *cnt = x->moe_cnt_host, *off = x->moe_cnt_host + E + 1;
    for (int e = 0; e < E && !st; e++) {
        const int n = cnt[e];
        if (n == 0) continue;
        if (n > T || off[e] + n > T * K)
            return kiln_err(err, KILN_ERR_INTERNAL, "cuda executor: expert %d of layer %d has %d of %d rows at %d", e,
                            x->p->ops[in->op].attrs.layer, n, T * K, off[e]);
        const CUdeviceptr act = x->moe_act + (size_t)off[e] * (size_t)F * es;
        kiln_swiglu_params sp = {x->gu_tmp, act, n, 0, 0};
        kiln_cuda_dims d = kiln_swiglu_dims(F, n, mo->swiglu_threads, x->f32 ? 4 : 8);
        if ((st = kiln_cublaslt_gemm_ex(x->lt, x->f32, x->f32, n, 2 * F, H, x->moe_xs + (size_t)off[e] * H * es,
                                        wgu + (size_t)e * 2 * (size_t)F * (size_t)H * es, x->gu_tmp, false, x->stream,
                                        err)) ||
            (st = launch(x, mo->swiglu, d.grid[0], d.grid[1], 1, d.block[0], 0, &sp, "kiln_swiglu", err)))
            break;
        st = kiln_cublaslt_gemm_ex(x->lt, x->f32, true, n, H, F, act, wdn + (size_t)e * (size_t)H * (size_t)F * es,
                                   x->moe_o + (size_t)off[e] * (size_t)H * 4, false, x->stream, err);
    }
    if (st) return st;
    return launch(x, mo->combine, (unsigned)T, 1, 1, 256, 0, &mp, "kiln_moe_combine", err);
}

/* Splits a decode batch of B aims for (about two waves of the GPU), and the grid's split count. */
static int splits_want(const cx *x, int B) {
    int units = B * x->n_kv;
    int s = (int)ceil(x->attn_waves * x->cu.n_sm / units);
    return s < 1 ? 1 : s;
}
static int splits_grid(const cx *x, const cx_attn *a, int B) {
    int len = x->base.max_context;
    if (a->window > 0 && a->window < len) len = a->window;
    int z = (len + a->partition - 1) / a->partition, want = splits_want(x, B);
    return z > want ? z : want;
}

/* The fewest one-token sequences leading a mixed step (prompt chunks after them) that run the decode
 * attention kernel rather than the prefill one: fewer ride along in the prefill kernel, where each of their
 * q heads reads its context by itself, and save the second launch. */
#define CX_MIXED_DECODE_MIN 16

/* The fewest one-token sequences whose decode attention runs the tensor-core kernel where the engine
 * has it (FP8 caches). On the H200 (docs/benchmarks.md), Mistral-7B FP8 with an FP8 cache, 128 in / 128
 * out, decode against the CUDA-core kernel: -6 % at batches 1 and 8, -0.8 % at 64, +4.2 % at 128, +8 %
 * at 256, +11.5 % at 512 (and Llama-3.1-8B's step at 1024 24.0 -> 21.3 ms); 80 is the crossover
 * between 64 and 128, interpolated. (Over a bf16 cache it was slower at every batch measured, so
 * codegen does not build it there.) */
#define CX_DECODE_TC_MIN 80

/* Attention instruction in may run the tensor-core decode kernel where the engine has it: not with
 * +merge_splits (it has no merging block); run_attn_decode takes it at steps of decode_tc_min or more
 * sequences (CX_DECODE_TC_MIN unless the engine's tuning record for this SM or the measure knob
 * decode_tc_min says otherwise; every step with measure knob decode_tc=2). */
static bool a_tc(const cx *x, const cx_inst *in) { return x->attn[in->attn].decode_tc && !in->merge; }

/* Decode attention of the step's first B sequences, one new token each (rows 0..B-1): the split kernel,
 * and the combine kernel when it splits without merging; with rope, it rotates q and the new k from the
 * QKV output and writes the KV cache itself (+decode_rope at a decode step). */
static kiln_status run_attn_decode(cx *x, const cx_inst *in, const cx_attn *a, int B, bool rope, kiln_error *err) {
    const CUdeviceptr kc = x->kcache + (size_t)in->layer * x->kv_layer_bytes;
    const CUdeviceptr vc = x->vcache + (size_t)in->layer * x->kv_layer_bytes;
    const int z = splits_grid(x, a, B);
    kiln_attn_decode_params dp = {.q = x->q_tmp, .k_cache = kc, .v_cache = vc,
                                  .block_tables = inp(x, x->in.bt), .seq_lens = inp(x, x->in.lens),
                                  .out = bufp(x, in->y), .part_o = x->part_o, .part_ml = x->part_ml,
                                  .scale = 1.0f / sqrtf((float)x->head_dim), .B = B, .max_blocks = x->kv.max_blocks,
                                  .max_splits = z, .partition = 0, .splits_want = splits_want(x, B),
                                  .counters = in->merge ? x->attn_cnt : 0,
                                  .kv_scale = in->dw_kvs >= 0 ? dwp(x, in->dw_kvs) : 0};
    if (rope) {
        const kiln_op_attrs *r = &in->rope;
        dp.qkv = x->qkv_tmp;
        dp.positions = inp(x, x->in.pos);
        dp.slots = inp(x, x->in.kvslot);
        dp.rope_theta = r->rope_theta;
        dp.rope_llama3 = r->rope_scaling == KILN_ROPE_SCALING_LLAMA3;
        dp.rope_factor = dp.rope_llama3 ? r->rope_factor : 1.0f;
        dp.rope_low_freq_factor = dp.rope_llama3 ? r->rope_low_freq_factor : 1.0f;
        dp.rope_high_freq_factor = dp.rope_llama3 ? r->rope_high_freq_factor : 4.0f;
        dp.rope_orig_max_pos = dp.rope_llama3 ? r->rope_original_max_pos : 8192.0f;
    }
    const bool tc = a_tc(x, in) && (B >= x->decode_tc_min || x->decode_tc_all); /* a warp a kv head */
    kiln_status st = tc ? launch(x, a->decode_tc, (unsigned)((x->n_kv + a->warps - 1) / a->warps), (unsigned)B,
                                 (unsigned)z, (unsigned)(a->warps * 32), a->smem_decode_tc, &dp, "kiln_attn_decode_tc", err)
                        : launch(x, a->decode, (unsigned)x->n_kv, (unsigned)B, (unsigned)z, (unsigned)(a->warps * 32),
                                 a->smem_decode, &dp, "kiln_attn_decode", err);
    if (!st && z > 1 && !dp.counters)
        st = launch(x, a->combine, (unsigned)x->n_heads, (unsigned)B, 1, (unsigned)((x->head_dim + 31) / 32 * 32), 0,
                    &dp, "kiln_attn_decode_combine", err);
    return st;
}

/* Prefill attention of the step's B sequences from sequence `first` on (their per-sequence inputs from
 * there; q_starts hold absolute rows), max_q the most new tokens of one of them. */
static kiln_status run_attn_prefill(cx *x, const cx_inst *in, const cx_attn *a, int first, int B, int max_q,
                                    kiln_error *err) {
    const CUdeviceptr kc = x->kcache + (size_t)in->layer * x->kv_layer_bytes;
    const CUdeviceptr vc = x->vcache + (size_t)in->layer * x->kv_layer_bytes;
    const size_t f = (size_t)first;
    kiln_attn_prefill_params pp = {x->q_tmp, kc, vc, inp(x, x->in.bt + f * (size_t)x->kv.max_blocks * 4),
                                   inp(x, x->in.lens + f * 4), inp(x, x->in.qstart + f * 4), bufp(x, in->y),
                                   1.0f / sqrtf((float)x->head_dim), B, x->kv.max_blocks, 0,
                                   in->dw_kvs >= 0 ? dwp(x, in->dw_kvs) : 0};
    if (a->prefill_wg) {
        kiln_cuda_dims d = kiln_attn_prefill_wg_dims(KILN_PF_WG_GROUPS, x->n_heads, B, max_q, x->head_dim);
        return launch(x, a->prefill_wg, d.grid[0], d.grid[1], d.grid[2], d.block[0], d.smem, &pp,
                      "kiln_attn_prefill_wg", err);
    }
    if (a->prefill_mma16) {
        /* 32 query rows per warp, unless that grid would not give every SM a block (short prompts): the
         * 16-row kernel has twice the blocks */
        kiln_cuda_dims d = kiln_attn_prefill_mma_dims(KILN_PF_MMA_WARPS, 2, x->n_heads, B, max_q, x->head_dim,
                                                      x->kv8 != 0);
        bool r32 = a->prefill_mma && (int64_t)d.grid[0] * d.grid[1] * d.grid[2] >= x->cu.n_sm;
        if (!r32) d = kiln_attn_prefill_mma_dims(KILN_PF_MMA_WARPS, 1, x->n_heads, B, max_q, x->head_dim, x->kv8 != 0);
        return launch(x, r32 ? a->prefill_mma : a->prefill_mma16, d.grid[0], d.grid[1], d.grid[2], d.block[0], d.smem,
                      &pp, r32 ? "kiln_attn_prefill_mma" : "kiln_attn_prefill_mma16", err);
    }
    return launch(x, a->prefill, (unsigned)((max_q + 63) / 64), (unsigned)x->n_heads, (unsigned)B, 128,
                  a->smem_prefill, &pp, "kiln_attn_prefill", err);
}

/* The program's instructions from `from` on, up to the next collective (its index into *stop, which
 * the TP driver runs across the ranks) or the end (*stop = n_prog). */
static kiln_status run_range(cx *x, const cx_shape *sh, int from, int *stop, kiln_error *err) {
    kiln_status st = KILN_OK;
    const int T = sh->T, B = sh->B;
    *stop = x->n_prog;
    for (int i = from; i < x->n_prog && st == KILN_OK; i++) {
        const cx_inst *in = &x->prog[i];
        if (in->kind == I_COLL) {
            *stop = i;
            break;
        }
        const cx_inst *norm = i > 0 && norm_folds(x, i - 1, sh) ? &x->prog[i - 1] : NULL;
        if (x->profile) x->cu.api.cuEventRecord(x->pev[2 * i], x->stream);
        switch (in->kind) {
        case I_EMBED: {
            kiln_gather_params gp = {dwp(x, in->dw), inp(x, x->in.tokens), bufp(x, in->y), T,
                                     x->hidden * x->es, (int)x->dw[in->dw].rows, in->base};
            st = launch(x, x->f_gather, (unsigned)T, 1, 1, 128, 0, &gp, "kiln_gather_rows (embedding)", err);
            break;
        }
        case I_NORM: {
            if (norm_folds(x, i, sh)) break; /* the next GEMV normalises its input itself */
            st = run_norm(x, in, T, writes_codes(x, i, T), err); /* +out_fp8: the next GEMM's E4M3 input */
            break;
        }
        case I_COPY:
            st = KILN_CU_CALL(&x->cu, err,
                              x->cu.api.cuMemcpyDtoDAsync(bufp(x, in->y), bufp(x, in->x),
                                                          (size_t)T * (size_t)in->width * (size_t)x->es, x->stream));
            break;
        case I_QKV: {
            const cx_gemm_io io = {false, writes_codes(x, i - 1, T) ? &x->prog[i - 1] : NULL};
            if ((st = run_gemm(x, &in->g, T, bufp(x, in->x), x->qkv_tmp, false, norm, &io, err))) break;
            if (x->profile) x->cu.api.cuEventRecord(x->pev_mid[i], x->stream);
            if (sh->decode && in->rope_in_attn) break; /* decode attention rotates and stores */
            kiln_rope_kv_params rp = {x->qkv_tmp,
                                      x->q_tmp,
                                      x->kcache + (size_t)in->layer * x->kv_layer_bytes,
                                      x->vcache + (size_t)in->layer * x->kv_layer_bytes,
                                      inp(x, x->in.pos),
                                      inp(x, x->in.kvslot),
                                      in->dw_bias >= 0 ? dwp(x, in->dw_bias) : 0,
                                      in->dw_qn >= 0 ? dwp(x, in->dw_qn) : 0,
                                      in->dw_kn >= 0 ? dwp(x, in->dw_kn) : 0,
                                      T,
                                      0,
                                      in->dw_kvs >= 0 ? dwp(x, in->dw_kvs) : 0};
            /* a few tokens: a block per head (and one for v), else a block per token (rope_kv.cuh) */
            const unsigned slices = T <= x->rope_split_max_t ? (unsigned)(x->n_heads + x->n_kv + 1) : 1u;
            st = launch(x, x->f_rope, (unsigned)T, slices, 1, (unsigned)x->rope_threads, 0, &rp, "kiln_rope_kv", err);
            break;
        }
        case I_ATTN: {
            const cx_attn *a = &x->attn[in->attn];
            if (sh->decode) {
                st = run_attn_decode(x, in, a, B, in->rope_in_attn, err);
                break;
            }
            /* a mixed step: its leading one-token sequences (the decode part, KV already written by rope_kv)
             * through the decode kernel, which reads each kv head's cache once for its q heads, and the
             * prompt chunks after them through the prefill kernel */
            const int D = sh->n_dec >= CX_MIXED_DECODE_MIN && sh->n_dec < B ? sh->n_dec : 0;
            if (D) st = run_attn_decode(x, in, a, D, false, err);
            if (!st) st = run_attn_prefill(x, in, a, D, B - D, sh->max_q, err);
            break;
        }
        case I_GEMM: {
            const cx_gemm_io io = {writes_codes(x, i, T), writes_codes(x, i - 1, T) ? &x->prog[i - 1] : NULL};
            st = run_gemm(x, &in->g, T, bufp(x, in->x), bufp(x, in->y), in->res >= 0, norm, &io, err);
            break;
        }
        case I_MOE: st = run_moe(x, in, sh, err); break;
        case I_PERM: {
            kiln_gather_cols_params gp = {bufp(x, in->x), dwp(x, in->dw), bufp(x, in->y), T, in->width, x->es};
            st = launch(x, x->f_gather_cols, (unsigned)((in->width + 255) / 256), (unsigned)(T < 65535 ? T : 65535), 1,
                        256, 0, &gp, "kiln_gather_cols (permute)", err);
            break;
        }
        case I_LMHEAD: {
            CUdeviceptr src = bufp(x, in->x);
            if (!sh->decode) {
                kiln_gather_params gp = {src, inp(x, x->in.last), x->lm_x, B, x->hidden * x->es, T, 0};
                if ((st = launch(x, x->f_gather, (unsigned)B, 1, 1, 128, 0, &gp, "kiln_gather_rows (last tokens)",
                                 err)))
                    break;
                src = x->lm_x;
            }
            st = run_gemm(x, &in->g, B, src, in->part ? x->logits_part : x->logits, false, norm, NULL, err);
            break;
        }
        case I_COLL: break; /* not reached: the loop stops before it */
        }
        if (x->profile) x->cu.api.cuEventRecord(x->pev[2 * i + 1], x->stream);
    }
    return st ? kiln_err_prefix(err, "cuda executor: ") : KILN_OK;
}

/* Sample each sequence's next token from the logits (the last instruction of a step). */
static kiln_status run_sample(cx *x, const cx_shape *sh, kiln_error *err) {
    const int B = sh->B;
    kiln_status st;
    if (x->profile) x->cu.api.cuEventRecord(x->pev[2 * x->n_prog], x->stream);
    kiln_sample_params sp = {x->logits,         inp(x, x->in.temp),  inp(x, x->in.topk), inp(x, x->in.topp),
                             inp(x, x->in.seeds), inp(x, x->in.ctr), x->ids,             B,
                             x->vocab};
    st = launch(x, x->f_sample, (unsigned)B, 1, 1, 1024, 0, &sp, "kiln_sample", err);
    if (x->profile) x->cu.api.cuEventRecord(x->pev[2 * x->n_prog + 1], x->stream);
    return st ? kiln_err_prefix(err, "cuda executor: ") : KILN_OK;
}

/* The whole program of a one-rank plan and the sampler. */
static kiln_status run_program(cx *x, const cx_shape *sh, kiln_error *err) {
    int stop = 0;
    kiln_status st = run_range(x, sh, 0, &stop, err);
    if (st) return st;
    if (stop != x->n_prog)
        return kiln_err(err, KILN_ERR_INTERNAL, "cuda executor: plan op %d is a collective, and this executor has "
                        "one rank", x->prog[stop].op);
    return run_sample(x, sh, err);
}

/* ---- profiling ---- */

/* The traffic and work of instruction i in a step of this shape (estimates: every operand read and
 * written once; `ctx` is the sum over sequences of the KV tokens attention reads, `qctx` the sum over
 * new tokens of the tokens each attends to). */
static void prof_cost(const cx *x, int i, const cx_shape *sh, double ctx, double qctx, double *bytes, double *flops) {
    const double es = x->es, T = sh->T, B = sh->B, H = x->hidden;
    *bytes = *flops = 0;
    if (i == x->n_prog) { /* the sampler */
        *bytes = B * x->vocab * 4.0;
        return;
    }
    const cx_inst *in = &x->prog[i];
    switch (in->kind) {
    case I_EMBED: *bytes = 2 * T * H * es; break;
    case I_NORM: *bytes = (in->x >= 0 ? 3 : 2) * T * H * es + H * es; *flops = 4 * T * H; break;
    case I_COPY: *bytes = 2 * T * in->width * es; break;
    case I_PERM: *bytes = 2 * T * in->width * es + in->width * 4.0; break;
    case I_QKV: /* the GEMM; the rope_kv part is counted in prof_add */
    case I_GEMM:
    case I_LMHEAD: {
        const double M = in->kind == I_LMHEAD ? B : T, N = in->g.n, K = in->g.k;
        const double out_es = in->g.epi == EPI_F32OUT ? 4 : es;
        const double wbytes = (double)dw_bytes(x, &x->dw[in->g.dw]);
        const bool gemm = in->g.qt && !gemv_path(x, &in->g, (int)M) && !qgemm_path(x, &in->g, (int)M),
                   w8a8 = gemm && w8a8_runs(x, &in->g);
        const bool deq = gemm && !w8a8; /* written dense, read by cuBLASLt */
        /* W8A8: x read and written as E4M3 codes, read again by the GEMM */
        *bytes = wbytes + (deq ? 2 * N * K * es : 0) + M * K * es + (w8a8 ? 2 * M * K : 0) +
                 M * (in->g.epi == EPI_SWIGLU ? N / 2 : N) * out_es;
        if (in->res >= 0) *bytes += M * N * es;
        *flops = 2 * M * N * K;
        break;
    }
    case I_MOE: { /* the chosen experts' weights (at most all of them), x, y */
        const cx_moe *mo = &in->moe;
        const double pairs = (sh->decode && !x->moe_grouped && !moe_pairs(x, mo, (int)T)) ? T * mo->E : T * mo->k;
        const double ex = pairs < mo->E ? pairs : mo->E, per = 3.0 * mo->f * H;
        *bytes = ex * per * es + 2 * T * H * es + (double)mo->E * H * es;
        *flops = 2 * pairs * per + 2 * T * mo->E * H;
        break;
    }
    case I_ATTN: { /* the cache's bytes: codes of one byte with an 8-bit cache */
        const double kv_row = (double)x->n_kv * x->head_dim * x->kv_es;
        *bytes = ctx * 2 * kv_row + 2 * T * x->n_heads * x->head_dim * es;
        *flops = 4.0 * qctx * x->n_heads * x->head_dim;
        break;
    }
    case I_COLL: /* what this rank sends and receives, once each */
        *bytes = in->gather ? 2.0 * B * x->vocab * 4 : 2 * T * in->width * es;
        break;
    }
}

/* After a profiled step has finished: add each instruction's time and cost to its row. */
static void prof_add(cx *x, const kiln_step *s, const cx_shape *sh) {
    const int d = sh->decode ? 1 : 0;
    double ctx = 0, qctx = 0;
    for (int i = 0; i < s->n_seqs; i++) {
        const double len = s->start[i] + s->n_new[i], q = s->n_new[i];
        ctx += len;
        qctx += q * (len - (q - 1) / 2.0); /* token j of q attends to start + j + 1 keys */
    }
    x->prof_steps[d]++;
    const int per = 2 * x->n_prog + 1;
    for (int i = 0; i <= x->n_prog; i++) {
        float ms = 0;
        kiln_profile_row *r = &x->prof[d * per + i];
        const bool qkv = i < x->n_prog && x->prog[i].kind == I_QKV;
        CUevent end = qkv ? x->pev_mid[i] : x->pev[2 * i + 1];
        if (x->cu.api.cuEventElapsedTime(&ms, x->pev[2 * i], end) == CUDA_SUCCESS) r->ms += ms;
        double b, f;
        prof_cost(x, i, sh, ctx, qctx, &b, &f);
        r->bytes += b;
        r->flops += f;
        r->steps = x->prof_steps[d];
        if (i < x->n_prog && has_gemm(&x->prog[i])) {
            const cx_gemm *g = &x->prog[i].g;
            const int M = x->prog[i].kind == I_LMHEAD ? sh->B : sh->T;
            r->fp8 = g->qt && !gemv_path(x, g, M) && !qgemm_path(x, g, M) && w8a8_runs(x, g);
        }
        if (!qkv) continue;
        /* rope_kv: rotate q and k, write k and v into the KV cache (skipped at decode with +decode_rope) */
        kiln_profile_row *rr = &x->prof[d * per + x->n_prog + 1 + i];
        ms = 0;
        if (x->cu.api.cuEventElapsedTime(&ms, x->pev_mid[i], x->pev[2 * i + 1]) == CUDA_SUCCESS) rr->ms += ms;
        if (!(sh->decode && x->prog[i].rope_in_attn))
            rr->bytes += (double)sh->T * (x->n_heads + 2 * x->n_kv) * x->head_dim * x->es * 2;
        rr->steps = x->prof_steps[d];
    }
}

static const char *const ikind_names[] = {"embed", "norm", "copy", "qkv", "attn", "gemm", "lm_head", "moe", "coll", "permute"};

/* Name the rows once the program exists. */
static void prof_name(cx *x) {
    const int per = 2 * x->n_prog + 1;
    for (int d = 0; d < 2; d++) {
        for (int i = 0; i < x->n_prog; i++) {
            kiln_profile_row *r = &x->prof[d * per + x->n_prog + 1 + i];
            r->decode = d;
            r->op = x->prog[i].op;
            snprintf(r->what, sizeof r->what, "rope_kv (%s)", kiln_op_name((kiln_op_kind)x->p->ops[x->prog[i].op].kind));
        }
        for (int i = 0; i <= x->n_prog; i++) {
            kiln_profile_row *r = &x->prof[d * per + i];
            r->decode = d;
            if (i == x->n_prog) {
                r->op = -1;
                snprintf(r->what, sizeof r->what, "sample");
                continue;
            }
            const cx_inst *in = &x->prog[i];
            r->op = in->op;
            const char *opn = kiln_op_name((kiln_op_kind)x->p->ops[in->op].kind);
            if (has_gemm(in))
                snprintf(r->what, sizeof r->what, "%s %dx%d", opn, in->g.n, in->g.k);
            else if (in->kind == I_COPY)
                snprintf(r->what, sizeof r->what, "%s (copy)", opn);
            else if (in->kind == I_ATTN && d && a_tc(x, in)) /* which kernel, for an A/B of it */
                snprintf(r->what, sizeof r->what, "%s (tensor cores from %d sequences)", opn,
                         x->decode_tc_all ? 1 : x->decode_tc_min);
            else if (in->kind == I_ATTN) {
                const cx_attn *a = &x->attn[in->attn];
                snprintf(r->what, sizeof r->what, "%s (%s)", opn,
                         d ? "CUDA cores" : a->prefill_wg ? "wgmma" : a->prefill_mma16 ? "mma.sync" : "fp32 fma");
            } else
                snprintf(r->what, sizeof r->what, "%s",
                         in->kind == I_EMBED || in->kind == I_ATTN || in->kind == I_NORM || in->kind == I_COLL
                             ? opn
                             : ikind_names[in->kind]);
        }
    }
}

static int cx_profile(kiln_executor *e, kiln_profile_row *rows, int cap) {
    cx *x = (cx *)e;
    if (!x->profile) return 0;
    const int per = 2 * x->n_prog + 1;
    if (cap < 0) {
        for (int i = 0; i < 2 * per; i++) x->prof[i].steps = 0, x->prof[i].ms = x->prof[i].bytes = x->prof[i].flops = 0;
        x->prof_steps[0] = x->prof_steps[1] = 0;
        return 0;
    }
    int n = 0;
    for (int d = 0; d < 2; d++)
        for (int i = 0; i < per; i++) {
            const kiln_profile_row *r = &x->prof[d * per + i];
            if (r->steps == 0) continue;
            if (n < cap) rows[n] = *r;
            n++;
        }
    return n;
}

/* ---- graphs ---- */

static int bucket(const cx *x, int n) {
    int b = 1;
    while (b < n) b *= 2;
    return b < x->base.max_seqs ? b : x->base.max_seqs;
}

#define CX_TUNE_SHAPES 16  /* distinct cuBLASLt shapes of one decode step tuned (Mistral has 5) */
#define CX_TUNE_WEIGHTS 6  /* layers' weights a shape is timed over (6 x 33.5 MB = 4x the H200's 50 MB L2) */

/*
 * Time cuBLASLt's candidate algorithms for every GEMM shape a step of M rows
 * runs through cuBLASLt (kiln_cublaslt_tune): a decode step of batch M
 * (decode: the LM head too, which has M rows then), or a prefill step of M
 * tokens (the LM head has one row per sequence there, not M), so the graph
 * captures the fastest rather than the heuristic's first. The decode graph
 * of a batch runs it before its capture (timing cannot happen inside a
 * capture); `kiln tune` for every batch and prefill size it is given (kiln_cuda_exec_tune).
 * Each shape is timed once; a shape the engine's tuning record has keeps
 * the recorded algorithm, untimed. Scratch x and y come from a
 * temporary allocation of B x (largest K) and B x (largest N) elements:
 * the executor's own buffers hold nothing live between steps, but one of
 * their own keeps that an invariant nobody has to remember. Every failure
 * leaves the heuristic's choice; with KILN_LT_TUNE=2 it is reported on
 * stderr, with each shape's candidates and times.
 */
/* One cuBLASLt shape of a step to time (tune_rows), with up to CX_TUNE_WEIGHTS of the weights it reads. */
typedef struct tune_shape {
    int n, k;
    bool acc, out_f32;
    int fp8; /* W8A8: a kiln_lt_fp8 (scales per row or per 128 columns, fast accumulation), else 0; the weights' codes, ws the first one's scales */
    CUdeviceptr w[CX_TUNE_WEIGHTS], ws;
    int n_w;
} tune_shape;

/* Add weight w of shape (n, k, acc, out_f32, fp8 with scales ws) to the shapes of a step of B rows,
 * growing the scratch sizes xb (B x K inputs) and yb (B x N outputs). */
static void tune_add(const cx *x, tune_shape *sh, int *n_sh, int B, int n, int k, bool acc, bool of, int fp8,
                     CUdeviceptr w, CUdeviceptr ws, size_t *xb, size_t *yb) {
    int j = 0;
    while (j < *n_sh &&
           !(sh[j].n == n && sh[j].k == k && sh[j].acc == acc && sh[j].out_f32 == of && sh[j].fp8 == fp8))
        j++;
    if (j == *n_sh) {
        if (*n_sh == CX_TUNE_SHAPES) return;
        sh[j] = (tune_shape){.n = n, .k = k, .acc = acc, .out_f32 = of, .fp8 = fp8, .ws = ws};
        (*n_sh)++;
        const size_t Bp = fp8 == KILN_LT_FP8_BLOCK128 ? rows4((size_t)B) : (size_t)B; /* run_gemm_fp8's padded M */
        size_t bx = Bp * (size_t)k * (size_t)x->es, by = Bp * (size_t)n * (of ? 4u : (size_t)x->es);
        if (bx > *xb) *xb = bx;
        if (by > *yb) *yb = by;
    }
    bool have = false;
    for (int i = 0; i < sh[j].n_w; i++) have |= sh[j].w[i] == w;
    if (!have && sh[j].n_w < CX_TUNE_WEIGHTS) sh[j].w[sh[j].n_w++] = w;
}

static void tune_rows(cx *x, int B, bool decode, FILE *log) {
    tune_shape sh[CX_TUNE_SHAPES];
    int n_sh = 0;
    size_t xb = 0, yb = 0;
    for (int i = 0; i < x->n_prog; i++) {
        const cx_inst *in = &x->prog[i];
        if (in->kind == I_MOE) { /* decode past the pair GEMVs: every expert over the batch (run_moe) */
            const cx_moe *mo = &in->moe;
            if (!decode || moe_pairs(x, mo, B) || (x->moe_grouped && mo->gg_gu)) continue;
            const size_t es = (size_t)x->es, H = (size_t)x->hidden, F = (size_t)mo->f;
            for (int e = 0; e < mo->E && e < CX_TUNE_WEIGHTS; e++) {
                tune_add(x, sh, &n_sh, B, (int)(2 * F), (int)H, false, x->f32, 0,
                         dwp(x, mo->dw_gu) + (size_t)e * 2 * F * H * es, 0, &xb, &yb);
                tune_add(x, sh, &n_sh, B, (int)H, (int)F, false, true, 0,
                         dwp(x, mo->dw_down) + (size_t)e * H * F * es, 0, &xb, &yb);
            }
            continue;
        }
        if (!has_gemm(in)) continue;
        if (in->kind == I_LMHEAD && !decode) continue; /* prefill: one row per sequence, not B */
        const cx_gemm *g = &in->g;
        if (gemv_path(x, g, B) || qgemm_path(x, g, B)) continue; /* at decode every GEMM has B rows, the LM head's too */
        /* the arguments run_gemm gives kiln_cublaslt_gemm_ex (cuBLASLt reads a quantized weight's dense
         * copy) or, W8A8, kiln_cublaslt_gemm_fp8 (the codes as stored) */
        const bool acc = in->kind == I_GEMM && in->res >= 0 && g->epi != EPI_SWIGLU, fp8 = w8a8_runs(x, g);
        tune_add(x, sh, &n_sh, B, g->n, g->k, acc, lt_out_f32(x, g), fp8 ? (int)w8a8_mode(g) : 0,
                 g->qt && !fp8 ? x->deq_tmp : dwp(x, g->dw), fp8 ? w8a8_wscale(x, g) : 0, &xb, &yb);
    }
    if (n_sh == 0) return;
    const double t0 = kiln_now();
    const size_t yoff = (xb + 255) / 256 * 256, soff = yoff + (yb + 255) / 256 * 256; /* W8A8's x scales last */
    size_t a8s = 1; /* W8A8's x scales a row */
    act8_cols(x, &a8s);
    const size_t bytes = soff + rows4((size_t)B) * 4 * a8s;
    CUdeviceptr scratch = 0;
    kiln_error e = {0};
    if (cx_alloc(x, bytes, "the cuBLASLt tuning scratch", &scratch, &e) ||
        KILN_CU_CALL(&x->cu, &e, x->cu.api.cuMemsetD8Async(scratch, 0x3c, bytes, x->stream))) { /* bf16/f32 ~0.0115 */
        if (log) fprintf(log, "kiln lt-tune: %s %d not tuned: %s\n", decode ? "decode batch" : "prefill rows", B, e.msg);
    } else {
        for (int j = 0; j < n_sh; j++) {
            kiln_error te = {0};
            const kiln_status ts =
                sh[j].fp8 ? kiln_cublaslt_tune_fp8(x->lt, sh[j].out_f32, (kiln_lt_fp8)sh[j].fp8,
                                                   sh[j].fp8 == KILN_LT_FP8_BLOCK128 ? (int)rows4((size_t)B) : B, sh[j].n, sh[j].k, sh[j].acc, sh[j].w,
                                                   sh[j].n_w, scratch, scratch + soff, sh[j].ws, scratch + yoff,
                                                   x->stream, log, &te)
                          : kiln_cublaslt_tune(x->lt, x->f32, sh[j].out_f32, B, sh[j].n, sh[j].k, sh[j].acc, sh[j].w,
                                               sh[j].n_w, scratch, scratch + yoff, x->stream, log, &te);
            if (ts && log)
                fprintf(log, "kiln lt-tune: %s %d, N=%d K=%d not tuned: %s\n", decode ? "decode batch" : "prefill rows",
                        B, sh[j].n, sh[j].k, te.msg);
        }
        if (log)
            fprintf(log, "kiln lt-tune: %s %d: %d shapes in %.1f ms\n", decode ? "decode batch" : "prefill rows", B, n_sh,
                    (kiln_now() - t0) * 1e3);
    }
    if (scratch) {
        x->cu.api.cuStreamSynchronize(x->stream); /* nothing of tuning may still read or write it */
        cx_release(x, &scratch);
        x->bytes_now -= (int64_t)bytes;
    }
}

/* ---- measured thresholds (kiln tune) ---- */

/* Whether instruction `in` multiplies by a matrix whose GEMV limit measure_limit sets: a dense bf16/f16
 * matrix's tensor-core GEMV (gemv_max_m; f32 engines' CUDA-core GEMV keeps KILN_GEMV_MAX_M) or a
 * weight-only quantized one's (qgemv_max_m; a +act_fp8 matrix's limit is KILN_QGEMV_MAX_ROWS, where the
 * CPU's numerics switch too). */
static bool limit_covers(const cx_inst *in, bool quant) {
    return has_gemm(in) && (quant ? in->g.qt && !in->g.act8 : !in->g.qt && in->g.mma);
}

/* GPU time (ms, the least of 5 rounds after 2 warm-up rounds) of one decode step's GEMMs of B rows over
 * the matrices limit_covers takes (the LM head's included), through the route the limits in effect give
 * them; x and y at xin, yout. Negative on failure. */
static double time_gemms(cx *x, bool quant, int B, CUdeviceptr xin, CUdeviceptr yout, CUevent ev[2]) {
    double best = -1;
    kiln_error e = {0};
    for (int round = 0; round < 7; round++) {
        if (round >= 2 && KILN_CU_CALL(&x->cu, &e, x->cu.api.cuEventRecord(ev[0], x->stream))) break;
        for (int i = 0; i < x->n_prog; i++) {
            const cx_inst *in = &x->prog[i];
            if (!limit_covers(in, quant)) continue;
            const bool acc = in->kind == I_GEMM && in->res >= 0 && in->g.epi != EPI_SWIGLU;
            if (run_gemm(x, &in->g, B, xin, yout, acc, NULL, NULL, &e)) goto out;
        }
        float ms = 0;
        if (round >= 2 && (KILN_CU_CALL(&x->cu, &e, x->cu.api.cuEventRecord(ev[1], x->stream)) ||
                           KILN_CU_CALL(&x->cu, &e, x->cu.api.cuEventSynchronize(ev[1])) ||
                           KILN_CU_CALL(&x->cu, &e, x->cu.api.cuEventElapsedTime(&ms, ev[0], ev[1]))))
            goto out;
        if (round >= 2 && (best < 0 || ms < best)) best = ms;
    }
out:
    x->cu.api.cuStreamSynchronize(x->stream);
    return e.code ? -1 : best;
}

/* kiln tune: the most rows a step runs through the GEMV (quant: the quantized one) before cuBLASLt is
 * faster on this GPU, from the decode buckets 2, 4, ... up to max_seqs (at most 64, the GEMV's tile
 * limit): the largest bucket up to which every bucket's GEMMs (the engine's, of B rows) took no longer
 * through the GEMV than through cuBLASLt with its tuned algorithms. `fallback` when nothing could be
 * measured (no matrix of the kind, or a failure: then logged). */
static int measure_limit(cx *x, bool quant, int fallback, FILE *log) {
    bool any = false;
    size_t kmax = 0, nmax = 0;
    for (int i = 0; i < x->n_prog; i++) {
        const cx_inst *in = &x->prog[i];
        if (!limit_covers(in, quant)) continue;
        any = true;
        if ((size_t)in->g.k > kmax) kmax = (size_t)in->g.k;
        if ((size_t)in->g.n > nmax) nmax = (size_t)in->g.n;
    }
    int top = x->base.max_seqs < 64 ? x->base.max_seqs : 64;
    if (top > x->max_rows) top = x->max_rows;
    /* cuBLASLt's side needs the gate/up product's scratch (dense) or the dequantized copy's (quantized),
     * which exist when the executor's steps may take more rows than the GEMV limit it was made with */
    if (!any || top < 2 || (quant ? !x->deq_tmp : x->ffn_max > 0 && !x->gu_tmp)) {
        if (any && top >= 2 && log)
            fprintf(log, "kiln tune: %s GEMV limit not measured: steps of %d rows take no cuBLASLt route here\n",
                    quant ? "quantized" : "bf16", x->max_rows);
        return fallback;
    }
    const size_t xb = ((size_t)top * kmax * (size_t)x->es + 255) / 256 * 256, bytes = xb + (size_t)top * nmax * 4;
    CUdeviceptr scratch = 0;
    CUevent ev[2] = {0, 0};
    kiln_error e = {0};
    int limit = 1, *lim = quant ? &x->qgemv_max_m : &x->gemv_max_m;
    const int keep = *lim;
    if (cx_alloc(x, bytes, "the GEMV limit's scratch", &scratch, &e) ||
        KILN_CU_CALL(&x->cu, &e, x->cu.api.cuMemsetD8Async(scratch, 0x3c, bytes, x->stream)) ||
        KILN_CU_CALL(&x->cu, &e, x->cu.api.cuEventCreate(&ev[0], CU_EVENT_DEFAULT)) ||
        KILN_CU_CALL(&x->cu, &e, x->cu.api.cuEventCreate(&ev[1], CU_EVENT_DEFAULT))) {
        if (log) fprintf(log, "kiln tune: %s GEMV limit not measured: %s\n", quant ? "quantized" : "bf16", e.msg);
        limit = fallback;
        goto out;
    }
    for (int B = 2; B <= top; B *= 2) {
        *lim = B - 1; /* cuBLASLt, with its algorithms for these B-row shapes timed as for the decode graphs */
        tune_rows(x, B, true, log);
        const double l = time_gemms(x, quant, B, scratch, scratch + xb, ev);
        *lim = B; /* the GEMV */
        const double g = time_gemms(x, quant, B, scratch, scratch + xb, ev);
        if (log)
            fprintf(log, "kiln tune: %s GEMMs of %d rows: GEMV %.3f ms, cuBLASLt %.3f ms a step\n",
                    quant ? "quantized" : "bf16", B, g, l);
        if (g < 0 || l < 0) {
            if (limit == 1) limit = fallback;
            break;
        }
        if (g > l) break;
        limit = B;
    }
out:
    *lim = keep;
    for (int i = 0; i < 2; i++)
        if (ev[i]) x->cu.api.cuEventDestroy(ev[i]);
    if (scratch) {
        cx_release(x, &scratch);
        x->bytes_now -= (int64_t)bytes;
    }
    return limit;
}

/* Before batch B's decode graph is captured (lt_tune 0: the heuristic's, 2: reported on stderr). */
static void tune_decode(cx *x, int B) {
    if (x->lt_tune) tune_rows(x, B, true, x->lt_tune >= 2 ? stderr : NULL);
}

static kiln_status graph_for(cx *x, int B, CUgraphExec *out, kiln_error *err) {
    for (int i = 0; i < x->n_graphs; i++)
        if (x->graphs[i].B == B) {
            *out = x->graphs[i].exec;
            return KILN_OK;
        }
    *out = NULL;
    if (x->n_graphs == CX_MAX_GRAPHS) return KILN_OK; /* run without */
    tune_decode(x, B);
    cx_shape sh = {B, B, true, 1, true, B};
    kiln_status st = KILN_CU_CALL(&x->cu, err, x->cu.api.cuStreamBeginCapture(x->stream, CU_STREAM_CAPTURE_MODE_RELAXED));
    if (st) return kiln_err_prefix(err, "cuda executor: capturing a decode graph: ");
    kiln_error run_err = {0};
    kiln_status rst = run_program(x, &sh, &run_err);
    CUgraph g = NULL;
    st = KILN_CU_CALL(&x->cu, err, x->cu.api.cuStreamEndCapture(x->stream, &g));
    if (rst) {
        if (g) x->cu.api.cuGraphDestroy(g);
        *err = run_err;
        return kiln_err_prefix(err, "capturing the decode graph of batch %d: ", B);
    }
    if (st) return kiln_err_prefix(err, "cuda executor: capturing a decode graph: ");
    CUgraphExec ex = NULL;
    st = KILN_CU_CALL(&x->cu, err, x->cu.api.cuGraphInstantiate(&ex, g, 0));
    x->cu.api.cuGraphDestroy(g);
    if (st) return kiln_err_prefix(err, "cuda executor: instantiating the decode graph of batch %d: ", B);
    x->graphs[x->n_graphs++] = (cx_graph){B, ex};
    x->stats.graphs = x->n_graphs;
    *out = ex;
    return KILN_OK;
}

/* ---- the kiln_executor ops ---- */

static kiln_status cx_reserve(kiln_executor *e, int slot, int tokens, bool *fits, kiln_error *err) {
    cx *x = (cx *)e;
    return kiln_kvpool_reserve(&x->kv, slot, tokens, fits, err);
}

static void cx_release_slot(kiln_executor *e, int slot) {
    cx *x = (cx *)e;
    kiln_kvpool_release(&x->kv, slot);
}

/* Whether step s returns every new token's logits for its sequence i (kiln_step.all_logits) and has
 * more than one of them. */
static bool all_rows(const kiln_step *s, int i) {
    return s->logits && (!s->want_logits || s->want_logits[i]) && s->all_logits && s->all_logits[i] &&
           s->n_new[i] > 1;
}

static kiln_status check_step(cx *x, const kiln_step *s, int *T_out, int *max_q, bool *decode, kiln_error *err) {
    const kiln_executor *e = &x->base;
    if (s->n_seqs < 1 || s->n_seqs > e->max_seqs)
        return kiln_err(err, KILN_ERR_INVALID_ARG, "cuda executor: a step of %d sequences (1..%d)", s->n_seqs,
                        e->max_seqs);
    int64_t T = 0;
    *max_q = 0;
    *decode = true;
    for (int i = 0; i < s->n_seqs; i++) {
        int slot = s->slot[i];
        if (slot < 0 || slot >= e->max_seqs)
            return kiln_err(err, KILN_ERR_INVALID_ARG, "cuda executor: step sequence %d: slot %d is outside 0..%d", i,
                            slot, e->max_seqs - 1);
        for (int j = 0; j < i; j++)
            if (s->slot[j] == slot)
                return kiln_err(err, KILN_ERR_INVALID_ARG, "cuda executor: slot %d appears twice in one step", slot);
        if (s->n_new[i] < 1)
            return kiln_err(err, KILN_ERR_INVALID_ARG, "cuda executor: slot %d: %d new tokens (at least 1)", slot,
                            s->n_new[i]);
        const kiln_kvslot *ks = &x->kv.slots[slot];
        if (s->start[i] != ks->len)
            return kiln_err(err, KILN_ERR_INTERNAL,
                            "cuda executor: slot %d: step starts at position %d but %d tokens are cached", slot,
                            s->start[i], ks->len);
        if ((int64_t)s->start[i] + s->n_new[i] > ks->reserved)
            return kiln_err(err, KILN_ERR_INTERNAL, "cuda executor: slot %d grows to %lld tokens past its reserve of %d",
                            slot, (long long)s->start[i] + s->n_new[i], ks->reserved);
        T += s->n_new[i];
        if (s->n_new[i] > *max_q) *max_q = s->n_new[i];
        if (s->n_new[i] != 1) *decode = false;
    }
    if (T > e->max_step_tokens)
        return kiln_err(err, KILN_ERR_INVALID_ARG, "cuda executor: %lld new tokens in one step (at most %d)",
                        (long long)T, e->max_step_tokens);
    for (int i = 0; i < s->n_seqs && !e->all_logits; i++)
        if (all_rows(s, i))
            return kiln_err(err, KILN_ERR_UNSUPPORTED, "cuda executor: every new token's logits (prompt logprobs, "
                                                       "scoring) are not built for tensor-parallel engines");
    for (int64_t t = 0; t < T; t++)
        if (s->tokens[t] < 0 || s->tokens[t] >= x->vocab)
            return kiln_err(err, KILN_ERR_INVALID_ARG, "cuda executor: token id %d at index %lld is outside the vocabulary (0..%d)",
                            s->tokens[t], (long long)t, x->vocab - 1);
    *T_out = (int)T;
    return KILN_OK;
}

/* Device memory for every row's logits (logits_rows), allocated at first use: about this much. */
#define CX_ROWS_BYTES ((size_t)64 << 20)

/* The rows logits_rows runs at a time: its own buffers of up to 128 rows (CX_ROWS_BYTES), allocated at
 * first use (x->rows_x, x->rows_logits), or else the LM head's input and the logits buffers of the
 * step (max_seqs rows). */
static int rows_chunk(cx *x, CUdeviceptr *in, CUdeviceptr *out) {
    const size_t per = (size_t)x->vocab * 4 + (size_t)x->hidden * (size_t)x->es;
    int want = (int)(CX_ROWS_BYTES / per);
    if (want > 128) want = 128;
    if (want > x->base.max_step_tokens) want = x->base.max_step_tokens; /* the indices go where the tokens do */
    if (want > x->base.max_seqs && !x->rows_n) {
        kiln_error ig = {0};
        if (cx_alloc(x, (size_t)want * (size_t)x->hidden * (size_t)x->es, "every row's LM head input", &x->rows_x,
                     &ig) == KILN_OK &&
            cx_alloc(x, (size_t)want * (size_t)x->vocab * 4, "every row's logits", &x->rows_logits, &ig) == KILN_OK)
            x->rows_n = want;
        else /* no room: the step's buffers, max_seqs rows at a time */
            x->rows_n = -1;
    }
    if (x->rows_n > 0) {
        *in = x->rows_x, *out = x->rows_logits;
        return x->rows_n;
    }
    *in = x->lm_x, *out = x->logits;
    return x->base.max_seqs;
}

/* The logits of n consecutive rows of the step, from row `first` on, into out ([n, vocab] on the host):
 * the LM head run again over the final norm's output, rows_chunk() rows at a time. A step with a
 * prompt chunk leaves that norm's output of every row in the LM head's input slot (prefill gathers
 * the normed rows; no norm folds into the LM head). */
static kiln_status logits_rows(cx *x, int first, int n, float *out, int n_src, kiln_error *err) {
    const cx_inst *lm = NULL;
    for (int i = 0; i < x->n_prog && !lm; i++)
        if (x->prog[i].kind == I_LMHEAD) lm = &x->prog[i];
    if (!lm) return kiln_err(err, KILN_ERR_INTERNAL, "no LM head");
    CUdeviceptr in = 0, logits = 0;
    const int C = rows_chunk(x, &in, &logits);
    int32_t *idx = (int32_t *)(void *)(x->in_host + x->in.tokens); /* the step's tokens are no longer needed */
    const size_t row = (size_t)x->vocab * sizeof(float);
    kiln_status st = KILN_OK;
    for (int r0 = 0; r0 < n && !st; r0 += C) {
        const int c = n - r0 < C ? n - r0 : C;
        for (int j = 0; j < c; j++) idx[j] = first + r0 + j;
        kiln_gather_params gp = {bufp(x, lm->x), inp(x, x->in.tokens), in, c, x->hidden * x->es, n_src, 0};
        if ((st = KILN_CU_CALL(&x->cu, err, x->cu.api.cuMemcpyHtoDAsync(inp(x, x->in.tokens), idx, (size_t)c * 4,
                                                                         x->stream))) ||
            (st = launch(x, x->f_gather, (unsigned)c, 1, 1, 128, 0, &gp, "kiln_gather_rows (every row)", err)) ||
            (st = run_gemm(x, &lm->g, c, in, logits, false, NULL, NULL, err)) ||
            (st = KILN_CU_CALL(&x->cu, err, x->cu.api.cuStreamSynchronize(x->stream))))
            break;
        st = kiln_cuda_download(&x->cu, (char *)out + (size_t)r0 * row, logits, (size_t)c * row, err);
    }
    return st ? kiln_err_prefix(err, "every row's logits: ") : KILN_OK;
}

/* The rows of logits the step asked for (kiln_exec.h): each returned sequence's last row from the
 * step's logits (runs of consecutive ones in one copy), then every row of those all_rows() names
 * (logits_rows, which reuses the logits buffer: so after the others). */
static kiln_status download_logits(cx *x, const kiln_step *s, kiln_error *err) {
    const size_t row = (size_t)x->vocab * sizeof(float);
    kiln_status st = KILN_OK;
    size_t out = 0;
    for (int i = 0; i < s->n_seqs && !st;) {
        if (s->want_logits && !s->want_logits[i]) {
            i++;
            continue;
        }
        if (all_rows(s, i)) {
            out += (size_t)s->n_new[i];
            i++;
            continue;
        }
        int j = i;
        while (j < s->n_seqs && (!s->want_logits || s->want_logits[j]) && !all_rows(s, j)) j++;
        st = kiln_cuda_download(&x->cu, (char *)s->logits + out * row, x->logits + (size_t)i * row,
                                (size_t)(j - i) * row, err);
        out += (size_t)(j - i);
        i = j;
    }
    int first = 0, T = 0;
    for (int i = 0; i < s->n_seqs; i++) T += s->n_new[i];
    out = 0;
    for (int i = 0; i < s->n_seqs && !st; first += s->n_new[i], i++) {
        if (s->want_logits && !s->want_logits[i]) continue;
        if (all_rows(s, i))
            st = logits_rows(x, first, s->n_new[i], (float *)(void *)((char *)s->logits + out * row), T, err);
        out += all_rows(s, i) ? (size_t)s->n_new[i] : 1;
    }
    return st;
}

/* A step's first part: checks, KV blocks, the inputs staged and copied up (on the stream); *sh the
 * step's shape, padded to its graph's bucket when sh->graph. */
static kiln_status step_begin(cx *x, const kiln_step *s, cx_shape *sh, kiln_error *err) {
    int T = 0, max_q = 0, n_dec = 0;
    bool decode = false;
    kiln_status st = check_step(x, s, &T, &max_q, &decode, err);
    if (st) return st;
    while (n_dec < s->n_seqs && s->n_new[n_dec] == 1) n_dec++; /* the scheduler lays decode tokens out first */
    if ((st = kiln_cuda_make_current(&x->cu, err))) return st;
    const int n = s->n_seqs;
    for (int i = 0; i < n; i++)
        if ((st = kiln_kvpool_append(&x->kv, s->slot[i], s->n_new[i], err))) return st;
    const bool graph = decode && !x->no_graphs && !x->profile; /* profiling times each kernel: no graphs */
    const int B = graph ? bucket(x, n) : n, rows = decode ? B : T;
    *sh = (cx_shape){rows, B, decode, max_q, graph, n_dec};

    /* the step's inputs, staged */
    uint8_t *h = x->in_host;
    int32_t *tok = (int32_t *)(void *)(h + x->in.tokens), *pos = (int32_t *)(void *)(h + x->in.pos);
    int32_t *kvs = (int32_t *)(void *)(h + x->in.kvslot), *lastr = (int32_t *)(void *)(h + x->in.last);
    int32_t *lens = (int32_t *)(void *)(h + x->in.lens), *qs = (int32_t *)(void *)(h + x->in.qstart);
    float *temp = (float *)(void *)(h + x->in.temp), *topp = (float *)(void *)(h + x->in.topp);
    int32_t *topk = (int32_t *)(void *)(h + x->in.topk), *bt = (int32_t *)(void *)(h + x->in.bt);
    uint64_t *seeds = (uint64_t *)(void *)(h + x->in.seeds), *ctr = (uint64_t *)(void *)(h + x->in.ctr);
    const int mb = x->kv.max_blocks;
    int t = 0;
    for (int i = 0; i < n; i++) {
        const int slot = s->slot[i], start = s->start[i];
        qs[i] = t;
        for (int j = 0; j < s->n_new[i]; j++, t++) {
            tok[t] = s->tokens[t];
            pos[t] = start + j;
            kvs[t] = kiln_kvpool_cache_slot(&x->kv, slot, start + j);
        }
        lastr[i] = t - 1;
        lens[i] = start + s->n_new[i];
        const kiln_sampling *sa = &s->samp[i];
        temp[i] = sa->temperature;
        topk[i] = sa->top_k;
        topp[i] = sa->top_p;
        seeds[i] = sa->seed;
        ctr[i] = (uint64_t)(start + s->n_new[i]); /* the position of the token being produced */
        const kiln_kvslot *ks = &x->kv.slots[slot];
        int nb = (lens[i] + x->block_size - 1) / x->block_size;
        for (int b = 0; b < nb; b++) bt[(size_t)i * mb + b] = b >= ks->first ? ks->table[b] : 0;
    }
    qs[n] = t;
    for (int i = n; i < B; i++) { /* idle rows of a graph's bucket */
        tok[i] = 0;
        pos[i] = 0;
        kvs[i] = -1;
        lastr[i] = i;
        lens[i] = 0;
        qs[i + 1] = t;
        temp[i] = 0.0f;
        topk[i] = 0;
        topp[i] = 1.0f;
        seeds[i] = 0;
        ctr[i] = 0;
    }
    size_t up = x->in.bt + (size_t)B * (size_t)mb * sizeof(int32_t);
    if ((st = KILN_CU_CALL(&x->cu, err, x->cu.api.cuMemcpyHtoDAsync(x->in_dev, h, up, x->stream))))
        return kiln_err_prefix(err, "cuda executor: staging the step: ");
    return KILN_OK;
}

/* After the step's program: the sampled ids of its n sequences copied back (sampled: rank 0 of a
 * tensor-parallel engine), then the `done` event; both on the stream. */
static kiln_status step_end(cx *x, int n, bool sampled, kiln_error *err) {
    kiln_status st = KILN_OK;
    if (sampled)
        st = KILN_CU_CALL(&x->cu, err, x->cu.api.cuMemcpyDtoHAsync(x->ids_host, x->ids, (size_t)n * 4, x->stream));
    if (!st) st = KILN_CU_CALL(&x->cu, err, x->cu.api.cuEventRecord(x->done, x->stream));
    return st ? kiln_err_prefix(err, "cuda executor: ") : KILN_OK;
}

/* Once the step's work has finished: the profile, the logits asked for and the sampled ids (when
 * `sampled`), the KV lengths advanced. */
static kiln_status step_finish(cx *x, const kiln_step *s, const cx_shape *sh, bool sampled, kiln_error *err) {
    kiln_status st;
    if (x->profile) prof_add(x, s, sh);
    if (sampled && s->logits && (st = download_logits(x, s, err)))
        return kiln_err_prefix(err, "cuda executor: logits: ");
    for (int i = 0; i < s->n_seqs; i++) {
        kiln_kvpool_advance(&x->kv, s->slot[i], s->n_new[i]);
        if (sampled) s->next[i] = s->want_token[i] ? x->ids_host[i] : -1;
    }
    x->stats.steps++;
    return KILN_OK;
}

static kiln_status cx_step(kiln_executor *e, const kiln_step *s, kiln_error *err) {
    cx *x = (cx *)e;
    cx_shape sh;
    kiln_status st = step_begin(x, s, &sh, err);
    if (st) return st;
    CUgraphExec ge = NULL;
    if (sh.graph && (st = graph_for(x, sh.B, &ge, err))) return st;
    if (ge) {
        if ((st = KILN_CU_CALL(&x->cu, err, x->cu.api.cuGraphLaunch(ge, x->stream))))
            return kiln_err_prefix(err, "cuda executor: decode graph of batch %d: ", sh.B);
        x->stats.graph_launches++;
    }
    if (!ge && (st = run_program(x, &sh, err))) return st;
    if ((st = step_end(x, s->n_seqs, true, err)) ||
        (st = KILN_CU_CALL(&x->cu, err, x->cu.api.cuStreamSynchronize(x->stream))))
        return kiln_err_prefix(err, "cuda executor: step of %d sequences, %d tokens: ", s->n_seqs, sh.T);
    return step_finish(x, s, &sh, true, err);
}

/* Matrices whose GEMM steps run W8A8 now (for kiln_ctx_info.gemm_fp8). */
static int w8a8_count(const cx *x) {
    int n = 0;
    for (int i = 0; i < x->n_prog; i++) {
        const cx_inst *in = &x->prog[i];
        n += has_gemm(in) && w8a8_runs(x, &in->g);
    }
    return n;
}

/* Matrices whose steps of 17 to 64 rows take the quantized GEMM (kiln_ctx_info.gemm_q). */
static int qgemm_count(const cx *x) {
    int n = 0;
    for (int i = 0; i < x->n_prog; i++) n += has_gemm(&x->prog[i]) && qgemm_path(x, &x->prog[i].g, 64);
    return n;
}

static void cx_info(kiln_executor *e, kiln_executor_info *info) {
    cx *x = (cx *)e;
    snprintf(info->device_name, sizeof info->device_name, "%.127s", x->cu.name);
    info->kv_capacity_tokens = (int64_t)x->kv.n_blocks * x->kv.block_size;
    info->kv_used_tokens = (int64_t)x->kv.committed * x->kv.block_size;
    info->device_bytes = x->bytes_now;
    info->device_peak_bytes = x->bytes_peak;
    info->weight_bytes = (int64_t)x->dweights_bytes;
    info->kv_bytes = x->stats.kv_pool_bytes;
    info->scratch_bytes = x->scratch_bytes;
    info->kernels_load_seconds = x->stats.modules_seconds;
    info->kernels_jitted = x->stats.jitted;
    info->gemm_fp8 = w8a8_count(x);
    info->gemm_q = qgemm_count(x);
    int used = 0, refused = 0;
    kiln_cublaslt_recorded_counts(x->lt, &used, &refused);
    if (refused)
        snprintf(info->tuning, sizeof info->tuning, "%.60s, %d refused by cuBLASLt", x->tuning, refused);
    else
        snprintf(info->tuning, sizeof info->tuning, "%s", x->tuning);
}

static void cx_destroy(kiln_executor *e) {
    cx *x = (cx *)e;
    if (!x) return;
    if (x->cu_ok) {
        kiln_error ig = {0};
        kiln_cuda_make_current(&x->cu, &ig);
        if (x->stream) x->cu.api.cuStreamSynchronize(x->stream);
        for (int i = 0; i < x->n_graphs; i++) x->cu.api.cuGraphExecDestroy(x->graphs[i].exec);
        kiln_cublaslt_destroy(x->lt);
        for (int i = 0; i < x->n_bufs; i++) cx_release(x, &x->bufs[i].p);
        CUdeviceptr *ps[] = {&x->dweights, &x->deq_tmp,     &x->qkv_tmp,   &x->q_tmp,    &x->gu_tmp,
                             &x->lm_x,     &x->logits,      &x->part_o,    &x->part_ml,  &x->attn_cnt,
                             &x->ids,      &x->in_dev,      &x->kcache,    &x->vcache,   &x->moe_scr,
                             &x->logits_part, &x->gather_tmp, &x->act8, &x->act8_scale, &x->rows_x,
                             &x->rows_logits, &x->qg_ws, &x->qg_cnt};
        for (size_t i = 0; i < sizeof ps / sizeof ps[0]; i++) cx_release(x, ps[i]);
        if (x->in_host) x->cu.api.cuMemFreeHost(x->in_host);
        if (x->ids_host) x->cu.api.cuMemFreeHost(x->ids_host);
        if (x->moe_cnt_host) x->cu.api.cuMemFreeHost(x->moe_cnt_host);
        if (x->stream && !x->shared_stream) x->cu.api.cuStreamDestroy(x->stream);
        if (x->done) x->cu.api.cuEventDestroy(x->done);
        for (int i = 0; x->pev && i < 2 * (x->n_prog + 1); i++)
            if (x->pev[i]) x->cu.api.cuEventDestroy(x->pev[i]);
        for (int i = 0; x->pev_mid && i < x->n_prog; i++)
            if (x->pev_mid[i]) x->cu.api.cuEventDestroy(x->pev_mid[i]);
        for (int i = 0; i < x->n_mods; i++)
            if (x->ks.modules[i].owner == i) kiln_cuda_module_unload(&x->cu, x->mods[i]);
        kiln_cuda_free(&x->cu);
    }
    free(x->mods);
    kiln_ksec_free(&x->ks);
    kiln_kvpool_free(&x->kv);
    free(x->dw);
    free(x->prog);
    free(x->bufs);
    free(x->slot_bufs);
    free(x->pev);
    free(x->pev_mid);
    free(x->prof);
    free(x);
}

static const kiln_executor_ops cx_ops = {
    .name = "cuda",
    .step = cx_step,
    .reserve = cx_reserve,
    .release = cx_release_slot,
    .destroy = cx_destroy,
    .info = cx_info,
    .profile = cx_profile,
};

/* The CUDA executor e is, or rank 0's of a tensor-parallel one (NULL: another kind). */
static cx *cx_of(kiln_executor *e) {
    if (e && e->ops == &cx_ops) return (cx *)e;
    return (cx *)kiln_cuda_tp_rank(e, 0);
}

bool kiln_cuda_exec_get_stats(kiln_executor *e, kiln_cuda_exec_stats *st) {
    cx *x = cx_of(e);
    if (!x) return false;
    *st = x->stats;
    snprintf(st->tuning, sizeof st->tuning, "%s", x->tuning);
    st->tuning_shapes = x->tuning_shapes;
    kiln_cublaslt_recorded_counts(x->lt, &st->tuning_used, &st->tuning_refused);
    st->gemv_max_m = x->gemv_max_m;
    st->qgemv_max_m = x->qgemv_max_m;
    st->rope_split_max_t = x->rope_split_max_t;
    st->attn_waves = x->attn_waves;
    st->decode_tc_min = x->decode_tc_min;
    return true;
}

kiln_status kiln_cuda_exec_tune(kiln_executor *e, const int *batches, int n_batches, const int *rows, int n_rows,
                                FILE *log, kiln_tuning_record *out, kiln_error *err) {
    memset(out, 0, sizeof *out);
    cx *x = cx_of(e); /* a tensor-parallel engine: rank 0's shapes, which every rank runs */
    if (!x) return kiln_err(err, KILN_ERR_INVALID_ARG, "tune: not a CUDA executor");
    for (int i = 0; i < n_batches; i++)
        if (batches[i] < 1 || batches[i] > e->max_seqs)
            return kiln_err(err, KILN_ERR_INVALID_ARG, "tune: decode batch %d is outside 1..%d (max_seqs)", batches[i],
                            e->max_seqs);
    for (int i = 0; i < n_rows; i++)
        if (rows[i] < 1 || rows[i] > x->max_rows)
            return kiln_err(err, KILN_ERR_INVALID_ARG, "tune: prefill step of %d tokens is outside 1..%d (the step "
                            "budget)", rows[i], x->max_rows);
    kiln_status st = kiln_cuda_make_current(&x->cu, err);
    if (st) return st;
    const double t0 = kiln_now();
    /* the GEMV limits first (unless given): the shapes each side of them then run are what is tuned */
    if (!x->gemv_fixed && !x->f32) x->gemv_max_m = measure_limit(x, false, x->gemv_max_m, log);
    if (!x->qgemv_fixed) x->qgemv_max_m = measure_limit(x, true, x->qgemv_max_m, log);
    for (int i = 0; i < n_batches; i++) tune_rows(x, batches[i], true, log);
    for (int i = 0; i < n_rows; i++) tune_rows(x, rows[i], false, log);
    const int n = kiln_cublaslt_export(x->lt, NULL, 0);
    if (n > KILN_TUNING_MAX_GEMMS)
        return kiln_err(err, KILN_ERR_INVALID_ARG, "tune: %d shapes measured, a record holds at most %d", n,
                        KILN_TUNING_MAX_GEMMS);
    out->gemms = n ? calloc((size_t)n, sizeof *out->gemms) : NULL;
    if (n && !out->gemms) return kiln_err(err, KILN_ERR_NOMEM, "tune: out of memory");
    out->n_gemms = (uint32_t)kiln_cublaslt_export(x->lt, out->gemms, n);
    int drv = 0;
    x->cu.api.cuDriverGetVersion(&drv);
    out->sm = (uint32_t)x->cu.sm;
    out->driver_version = drv;
    out->lt_version = kiln_cublaslt_version(x->lt);
    snprintf(out->device, sizeof out->device, "%.127s", x->cu.name);
    out->gemv_max_m = (uint32_t)x->gemv_max_m;
    out->qgemv_max_m = (uint32_t)x->qgemv_max_m;
    out->rope_split_max_t = (uint32_t)x->rope_split_max_t;
    out->attn_waves = (float)x->attn_waves;
    out->decode_tc_min = (uint32_t)x->decode_tc_min;
    out->seconds = (float)(kiln_now() - t0);
    return KILN_OK;
}

void kiln_cuda_exec_algo_str(kiln_executor *e, const uint8_t algo[KILN_TUNING_ALGO_SIZE], char *buf, size_t n) {
    cx *x = cx_of(e);
    if (!x) {
        snprintf(buf, n, "?");
        return;
    }
    kiln_cublaslt_algo_str(x->lt, algo, buf, n);
}

bool kiln_cuda_exec_set_graphs(kiln_executor *e, bool on) {
    if (!e || e->ops != &cx_ops) return false;
    ((cx *)e)->no_graphs = !on;
    return true;
}

bool kiln_cuda_exec_set_pdl(kiln_executor *e, bool on) {
    if (!e || e->ops != &cx_ops) return false;
    cx *x = (cx *)e;
    if (on && x->cu.sm < 90) return false;
    kiln_error ig = {0};
    kiln_cuda_make_current(&x->cu, &ig);
    x->cu.api.cuStreamSynchronize(x->stream);
    for (int i = 0; i < x->n_graphs; i++) x->cu.api.cuGraphExecDestroy(x->graphs[i].exec);
    x->n_graphs = 0;
    x->pdl = x->stats.pdl = on;
    return true;
}

/* ---- creation ---- */

static size_t align256(size_t v) { return (v + 255) / 256 * 256; }

/* The staging area's layout for `rows` token rows and `seqs` sequences. */
static void layout_inputs(cx_inputs *in, int rows, int seqs, int max_blocks) {
    size_t o = 0;
#define PUT(f, n, sz)            \
    in->f = o;                   \
    o = align256(o + (size_t)(n) * (sz));
    PUT(tokens, rows, 4);
    PUT(pos, rows, 4);
    PUT(kvslot, rows, 4);
    PUT(last, seqs, 4);
    PUT(lens, seqs, 4);
    PUT(qstart, seqs + 1, 4);
    PUT(temp, seqs, 4);
    PUT(topk, seqs, 4);
    PUT(topp, seqs, 4);
    PUT(seeds, seqs, 8);
    PUT(ctr, seqs, 8);
    PUT(bt, (size_t)seqs * (size_t)max_blocks, 4);
#undef PUT
    in->bytes = o;
}

/* ---- the step budget and what it costs ---- */

/* Decode attention's most splits (the partials' size), at batch 1, the widest grid. */
static int zmax_of(const cx *x) {
    int zmax = 1;
    for (int i = 0; i < x->n_attn; i++) {
        int z = splits_grid(x, &x->attn[i], 1);
        if (z > zmax) zmax = z;
    }
    return zmax;
}

/* The dense copy of the largest quantized GEMV weight (0: none), for steps past the quantized GEMV. */
static size_t deq_bytes(const cx *x) {
    size_t b = 0;
    for (int i = 0; i < x->n_prog; i++) {
        const cx_inst *in = &x->prog[i];
        if (has_gemm(in) && in->g.qt &&
            (size_t)in->g.n * (size_t)in->g.k * (size_t)x->es > b)
            b = (size_t)in->g.n * (size_t)in->g.k * (size_t)x->es;
    }
    return b;
}

/* The quantized GEMM's split-K workspace (f32 floats) any of the program's modules needs: 0 without one. */
static size_t qgemm_ws_floats(const cx *x) {
    size_t f = 0;
    for (int i = 0; i < x->n_prog; i++) {
        const cx_inst *in = &x->prog[i];
        for (int v = 0; v < 2 && has_gemm(in); v++) {
            const size_t n = in->g.qg[v] ? kiln_qgemm_ws_floats(&in->g.cqg[v], x->cu.n_sm) : 0;
            if (n > f) f = n;
        }
    }
    return f;
}

/* Steps of more rows than this run a gate/up GEMM through cuBLASLt (the gate/up scratch then). */
static int gu_rows(const cx *x) { return x->gemv_max_m < KILN_GEMV_MAX_M ? x->gemv_max_m : KILN_GEMV_MAX_M; }

/* An upper bound of tune_decode's temporary x and y for batches up to max_seqs. */
static size_t tune_bytes(const cx *x) {
    size_t k = 0, n = 0;
    for (int i = 0; i < x->n_prog; i++) {
        const cx_inst *in = &x->prog[i];
        if (in->kind == I_MOE) { /* the experts' gate/up [2F, H] and down [H, F] (tune_rows) */
            const size_t f = (size_t)in->moe.f, h = (size_t)x->hidden;
            k = f > k ? f : h > k ? h : k;
            n = 2 * f > n ? 2 * f : n;
            continue;
        }
        if (!has_gemm(in)) continue;
        if (gemv_path(x, &in->g, x->base.max_seqs)) continue;
        if ((size_t)in->g.k > k) k = (size_t)in->g.k;
        if ((size_t)in->g.n > n) n = (size_t)in->g.n;
    }
    const size_t S = rows4((size_t)x->base.max_seqs);
    size_t a8s = 1;
    act8_cols(x, &a8s);
    return k ? align256(S * k * (size_t)x->es) + align256(S * n * 4) + S * 4 * a8s : 0; /* x, y, W8A8's x scales */
}

/* The experts' scratch for steps of `rows` tokens, and its parts' offsets (into off[8], when given):
 * sel, wsel, pos, tok [rows * k]; counts and offsets [2 (E + 1)]; the grouped rows xs [rows * k, H]
 * and their SwiGLU act [rows * k, F] (elements); the outputs o, fp32, [max(rows * k, E * max_seqs), H]. */
static size_t moe_bytes(const cx *x, int rows, size_t off[8]) {
    if (!x->moe_e) return 0;
    const size_t P = (size_t)rows * (size_t)x->moe_k, H = (size_t)x->hidden, es = (size_t)x->es;
    size_t orows = P; /* or [E, max_seqs] rows: every expert over a decode batch */
    if (orows < (size_t)x->moe_e * (size_t)x->base.max_seqs) orows = (size_t)x->moe_e * (size_t)x->base.max_seqs;
    const size_t sz[8] = {P * 4, P * 4, P * 4, P * 4, 2 * ((size_t)x->moe_e + 1) * 4, P * H * es,
                          P * (size_t)x->moe_f * es, orows * H * 4};
    size_t b = 0;
    for (int i = 0; i < 8; i++) {
        if (off) off[i] = b;
        b += align256(sz[i]);
    }
    return b;
}

/* Device bytes of everything but the weights, the KV pool and the cuBLASLt workspace for steps of
 * `rows` tokens: the activation buffers, QKV, q and gate/up scratch (rows x width), the LM head's
 * input, logits, attention partials and sampled ids (max_seqs x width), the step inputs, and the
 * decode GEMM tuning's temporary buffers. The same sizes the creation allocates. */
static size_t scratch_bytes(const cx *x, int rows, int max_blocks) {
    const size_t R = rows4((size_t)rows), es = (size_t)x->es, S = rows4((size_t)x->base.max_seqs), z = (size_t)x->zmax;
    const size_t nh = (size_t)x->n_heads, hd = (size_t)x->head_dim;
    size_t b = 0;
    for (int i = 0; i < x->n_bufs; i++) b += R * x->bufs[i].bytes;
    b += R * (nh + 2 * (size_t)x->n_kv) * hd * es + R * nh * hd * es;
    if ((R > (size_t)gu_rows(x) || x->moe_e) && x->ffn_max > 0) b += R * 2 * (size_t)x->ffn_max * es;
    size_t a8s = 1;
    if (R > (size_t)qgemv_rows_min(x)) b += deq_bytes(x) + R * act8_cols(x, &a8s) + R * a8s * 4;
    if (R > CX_QGEMM_MIN_M) b += qgemm_ws_floats(x) * 4 + kiln_qgemm_cnt(x->cu.n_sm) * 4;
    b += moe_bytes(x, rows, NULL);
    b += S * (size_t)x->hidden * es + S * (size_t)x->vocab * 4 + S * nh * z * hd * 4 + S * nh * z * 2 * 4 +
         S * (size_t)x->n_kv * 4 + S * 4;
    if (x->vocab_part) b += S * (size_t)x->vocab_part * 4 + S * (size_t)x->vocab * 4; /* tp: the slice, the gather */
    cx_inputs in;
    layout_inputs(&in, rows, x->base.max_seqs, max_blocks);
    return b + in.bytes + tune_bytes(x);
}

static double gib(size_t b) { return (double)b / (1024.0 * 1024.0 * 1024.0); }

/*
 * The step budget: `asked` tokens (0 = CX_DEFAULT_STEP, halved while its scratch would take more
 * than a quarter of what the weights and an explicit KV pool leave of `free_b`), at least
 * max_seqs, at most max_seqs x max_context. Then the whole: weights + KV (explicit only; a
 * fraction takes what is left) + scratch must fit `free_b`, else the refusal names each part,
 * before anything large is allocated.
 */
static kiln_status choose_step(cx *x, int64_t asked, int64_t kv_bytes, size_t weights, size_t free_b,
                               int max_blocks, kiln_error *err) {
    const int64_t lo = x->base.max_seqs, hi = (int64_t)x->base.max_seqs * x->base.max_context;
    int64_t step = asked ? asked : CX_DEFAULT_STEP;
    if (step < lo) step = lo;
    if (step > hi) step = hi;
    if (step > (1 << 20)) step = 1 << 20;
    const size_t kv = (size_t)kv_bytes, fixed = weights + kv;
    if (!asked && fixed < free_b)
        while (step > lo && scratch_bytes(x, (int)step, max_blocks) > (free_b - fixed) / 4)
            step = step / 2 > lo ? step / 2 : lo;
    const size_t sc = scratch_bytes(x, (int)step, max_blocks);
    if (fixed + sc > free_b || (kv_bytes == 0 && fixed + sc >= free_b)) {
        kiln_err(err, KILN_ERR_NOMEM,
                 "cuda executor: weights %.2f GiB + KV pool %s%.2f GiB + step scratch %.2f GiB (%lld tokens a step, "
                 "%d sequences) = %.2f GiB do not fit the %.2f GiB free on %s",
                 gib(weights), kv_bytes ? "" : "(a fraction of what is left) ", gib(kv), gib(sc), (long long)step,
                 x->base.max_seqs, gib(fixed + sc), gib(free_b), x->cu.name);
        return kiln_err_hint(err, "give less KV memory (--kv-memory), fewer tokens a step (--max-step-tokens) or "
                                  "a smaller batch, or a GPU with more memory");
    }
    x->base.max_step_tokens = (int)step;
    x->max_rows = (int)step;
    x->scratch_bytes = (int64_t)(sc + CX_LT_WORKSPACE);
    return KILN_OK;
}

/*
 * The engine's tuning record for this GPU (format/kiln_tuning.h): the one
 * for its SM and name (else its SM). Its thresholds replace the built-in
 * defaults (a measurement knob replaces both); its cuBLASLt algorithms are
 * used when the library's version is the one they were measured with, each
 * checked by cublasLtMatmulAlgoCheck when its plan is made. x->tuning says
 * which case holds ("recorded sm_90 (12 shapes)", "stale (cuBLASLt 130000
 * vs 130100)", "none (heuristic)"). A tuning section the reader refuses
 * refuses the engine (KILN_ERR_FORMAT naming the record), as any corrupt
 * section does.
 */
static kiln_status tuning_apply(cx *x, const kiln_cuda_exec_opts *o, kiln_error *err) {
    kiln_tuning t;
    bool present = false;
    kiln_status st = kiln_tuning_load(&x->m->engine, &t, &present, err);
    if (st) return st;
    const kiln_tuning_record *r = present && !o->no_recorded ? kiln_tuning_pick(&t, x->cu.sm, x->cu.name) : NULL;
    x->gemv_max_m = o->gemv_max_m > 0 ? o->gemv_max_m : r && r->gemv_max_m ? (int)r->gemv_max_m : KILN_GEMV_MAX_M;
    x->gemv_fixed = o->gemv_max_m > 0;
    x->qgemv_fixed = o->qgemv_max_m > 0 || o->gemv_max_m > 0;
    x->qgemv_max_m = o->qgemv_max_m > 0  ? o->qgemv_max_m
                     : o->gemv_max_m > 0 ? o->gemv_max_m
                     : r && r->qgemv_max_m ? (int)r->qgemv_max_m
                                           : CX_QGEMV_MAX_M;
    x->rope_split_max_t = o->rope_split_max_t > 0 ? o->rope_split_max_t
                          : r && r->rope_split_max_t ? (int)r->rope_split_max_t
                                                     : CX_ROPE_SPLIT_MAX_T;
    x->attn_waves = o->attn_waves > 0 ? o->attn_waves : r && r->attn_waves > 0 ? (double)r->attn_waves : 2.0;
    x->decode_tc_min = o->decode_tc_min > 0 ? o->decode_tc_min : r && r->decode_tc_min ? (int)r->decode_tc_min
                                                                                         : CX_DECODE_TC_MIN;
    const size_t v = kiln_cublaslt_version(x->lt);
    if (o->no_recorded)
        snprintf(x->tuning, sizeof x->tuning, "off (heuristic%s)", present ? "; the engine's record is not used" : "");
    else if (!r)
        snprintf(x->tuning, sizeof x->tuning, "none (heuristic)%s", present ? ": no record for this GPU's SM" : "");
    else if (r->lt_version != (uint64_t)v)
        snprintf(x->tuning, sizeof x->tuning, "stale (cuBLASLt %llu vs %zu)", (unsigned long long)r->lt_version, v);
    else if ((st = kiln_cublaslt_use_recorded(x->lt, r, err)) == KILN_OK) {
        snprintf(x->tuning, sizeof x->tuning, "recorded sm_%u (%u shapes)", r->sm, r->n_gemms);
        x->tuning_shapes = (int)r->n_gemms;
    }
    kiln_tuning_free(&t);
    return st;
}

/* Rank `rank` of the plan's ranks on CUDA device `device` (stream: rank 0's on the same device, or
 * 0 for its own): everything but the KV pool (kv_fit, kv_alloc). */
static kiln_status cx_new(const kiln_model *m, const kiln_cuda_exec_opts *o, int rank, int device, CUstream stream,
                          cx **out, kiln_error *err) {
    *out = NULL;
    const kiln_plan *p = m->plan;
    double t0 = kiln_now();
    kiln_status st = KILN_OK;
    const kiln_engine_section *ksec = kiln_engine_find(&m->engine, KILN_SECTION_KERNELS);
    const char *path = m->engine.map.path ? m->engine.map.path : "engine";
    int max_seqs = o->max_seqs ? o->max_seqs : CX_DEFAULT_SEQS;
    int max_ctx = o->max_context ? o->max_context : p->max_context;
    if (max_seqs < 1 || max_seqs > 4096)
        return kiln_err(err, KILN_ERR_INVALID_ARG, "cuda executor: max sequences %d must be in 1..4096", max_seqs);
    if (max_ctx < 1 || max_ctx > p->max_context) {
        kiln_err(err, KILN_ERR_INVALID_ARG, "cuda executor: max context %d is outside 1..%d (the model's)", max_ctx,
                 p->max_context);
        return kiln_err_hint(err, "use 0 for the model's context of %d tokens", p->max_context);
    }
    if (o->kv_bytes < 0 || o->kv_fraction < 0 || o->kv_fraction > 1)
        return kiln_err(err, KILN_ERR_INVALID_ARG, "cuda executor: KV memory %lld bytes / fraction %g is not valid",
                        (long long)o->kv_bytes, o->kv_fraction);
    if (o->max_step_tokens < 0)
        return kiln_err(err, KILN_ERR_INVALID_ARG, "cuda executor: max step tokens %d is negative (0 = %d)",
                        o->max_step_tokens, CX_DEFAULT_STEP);

    cx *x = calloc(1, sizeof *x);
    if (!x) return kiln_err(err, KILN_ERR_NOMEM, "cuda executor: out of memory");
    x->base = (kiln_executor){.ops = &cx_ops,
                              .max_seqs = max_seqs,
                              .max_context = max_ctx,
                              .max_step_tokens = 0, /* choose_step, once the weights' size is known */
                              .vocab = p->vocab_size,
                              /* every row's logits: the LM head again over the final norm's rows (one
                                 rank's; a tensor-parallel engine's LM head is split over the ranks) */
                              .all_logits = p->n_ranks < 2};
    x->m = m;
    x->p = p;
    x->rank = rank;
    x->n_ranks = (int)p->n_ranks;
    x->pw = kiln_plan_rank_weights(p, (uint32_t)rank);
    x->no_graphs = o->no_graphs;
    x->moe_grouped = o->moe_grouped;
    x->qgemv_cc = !o->no_qgemv_cc;
    x->qgemm = !o->no_qgemm;
    x->prefill_wg = !o->no_prefill_wg;
    x->decode_tc = !o->no_decode_tc;
    x->decode_tc_all = o->decode_tc_all;
    x->w8a8 = !o->no_w8a8; /* and sm_89+, bf16, once the device is known (below) */
    x->w8a8_g128 = !o->no_w8a8_g128; /* not with measure knob w8a8=1; and the engine's kernels for it (gemm_setup) */
    x->w8a8_fast = !o->no_w8a8_fast_accum;
    x->hidden = p->hidden_size;
    x->n_kv = p->n_kv_heads;
    x->head_dim = p->head_dim;
    x->vocab = p->vocab_size;
    x->n_layers = p->n_layers;
    /* the query heads every attention op has (its kernels and scratch are built for one count: a plan
     * whose layers differ is refused, not run with the last layer's) */
    for (uint32_t i = 0; i < p->n_ops; i++) {
        const kiln_plan_op *op = &p->ops[i];
        if (op->kind != KILN_OP_ATTENTION) continue;
        if (x->n_heads && op->attrs.n_heads != x->n_heads) {
            st = kiln_err(err, KILN_ERR_UNSUPPORTED, "cuda executor: plan op %u (attention) has %d query heads, an "
                          "earlier layer %d: layers with different head counts are not supported on the GPU",
                          i, op->attrs.n_heads, x->n_heads);
            kiln_err_hint(err, "run this engine on the CPU");
            goto fail;
        }
        const int k8 = kiln_kv8_of(op->attrs.flags);
        if (x->n_heads && k8 != x->kv8) {
            st = kiln_err(err, KILN_ERR_UNSUPPORTED, "cuda executor: plan op %u (attention) keeps its KV cache in "
                          "another element type than the layers before it", i);
            goto fail;
        }
        x->n_heads = op->attrs.n_heads;
        x->kv8 = k8;
    }

    /* the device first: without one, that is the answer (KILN_ERR_DEVICE) whatever the engine holds */
    if ((st = kiln_cuda_init(&x->cu, device, err))) {
        if (x->n_ranks > 1) kiln_err_prefix(err, "tensor-parallel rank %d: ", rank);
        kiln_err_prefix(err, "gpu device %d: ", device);
        goto fail;
    }
    x->cu_ok = true;
    x->stats.sm = x->cu.sm;
    x->pdl = x->stats.pdl = x->cu.sm >= 90 && !o->no_pdl;
    x->lt_tune = o->lt_tune > 0 ? o->lt_tune - 1 : 1;

    /* the kernels section */
    if (!ksec) {
        /* why, as the compiler recorded it: --target none, no NVRTC, or a plan the GPU cannot run */
        const char *why = m->no_gpu_kernels[0] ? m->no_gpu_kernels : "it was compiled with --target none";
        st = kiln_err(err, KILN_ERR_UNSUPPORTED, "%s: the engine has no GPU kernels: %s", path, why);
        if (strstr(why, "--target none") || strstr(why, "NVRTC"))
            kiln_err_hint(err, "recompile it with `kiln compile --target default` (or sm_%d for this GPU) with a kiln "
                               "that has NVRTC, or run it on the CPU (--device cpu)", x->cu.sm);
        else
            kiln_err_hint(err, "run it on the CPU (--device cpu): the GPU kernels do not take this model yet");
        goto fail;
    }
    const uint8_t *kd;
    size_t kn;
    bool owned;
    if ((st = kiln_engine_section_bytes(&m->engine, ksec, 1, &kd, &kn, &owned, err))) goto fail;
    if (owned) { /* the format stores kernels uncompressed; a decoded copy would need an owner */
        free((void *)kd);
        st = kiln_err(err, KILN_ERR_FORMAT, "%s: the kernels section is compressed (this runtime reads it stored)", path);
        goto fail;
    }
    if ((st = kiln_ksec_parse(kd, kn, &x->ks, err))) {
        kiln_err_prefix(err, "%s: ", path);
        goto fail;
    }
    x->f32 = x->ks.elem == KILN_KSEC_ELEM_F32;
    x->w8a8 = x->w8a8 && !x->f32 && x->cu.sm >= 89; /* FP8 tensor cores: Ada and Hopper on */
    x->es = x->f32 ? 4 : 2;
    x->kv_es = x->kv8 ? 1 : x->es;
    x->stats.f32 = x->f32;
    x->block_size = x->ks.block_size;
    if (o->block_size && o->block_size != x->block_size) {
        st = kiln_err(err, KILN_ERR_UNSUPPORTED, "cuda executor: KV block size %d asked for; %s's kernels are built for %d",
                      o->block_size, path, x->block_size);
        kiln_err_hint(err, "recompile with `kiln compile --kv-block-size %d`, or ask for 0 (the engine's)", o->block_size);
        goto fail;
    }

    /* modules, stream, cuBLASLt */
    if ((st = load_modules(x, err))) goto fail;
    if ((st = fn_get(x, "util", "kiln_gather_rows", &x->f_gather, NULL, err)) ||
        (st = fn_get(x, "util", "kiln_gather_cols", &x->f_gather_cols, NULL, err)) ||
        (st = fn_get(x, "sample", "kiln_sample", &x->f_sample, NULL, err)) ||
        (x->n_ranks > 1 && ((st = fn_get(x, "util", "kiln_tp_sum", &x->f_tp_sum, NULL, err)) ||
                            (st = fn_get(x, "util", "kiln_tp_oneshot", &x->f_tp_oneshot, NULL, err)))))
        goto fail;
    x->stream = stream;
    x->shared_stream = stream != NULL;
    if ((!stream && (st = KILN_CU_CALL(&x->cu, err, x->cu.api.cuStreamCreate(&x->stream, CU_STREAM_NON_BLOCKING)))) ||
        (st = KILN_CU_CALL(&x->cu, err, x->cu.api.cuEventCreate(&x->done, CU_EVENT_DISABLE_TIMING))))
        goto fail;
    if ((st = kiln_cublaslt_create(&x->cu, CX_LT_WORKSPACE, &x->lt, err))) goto fail;
    x->bytes_now += CX_LT_WORKSPACE;
    kiln_cublaslt_set_search(x->lt, o->lt_search);
    if ((st = tuning_apply(x, o, err))) goto fail; /* thresholds and recorded algorithms, before the program */

    /* the program (host side) */
    if ((st = build_program(x, err))) goto fail;
    if (o->profile) {
        const int ne = 2 * (x->n_prog + 1);
        x->pev = calloc((size_t)ne, sizeof *x->pev);
        x->pev_mid = calloc((size_t)x->n_prog + 1, sizeof *x->pev_mid);
        x->prof = calloc(2 * (2 * (size_t)x->n_prog + 1), sizeof *x->prof);
        if (!x->pev || !x->pev_mid || !x->prof) {
            st = kiln_err(err, KILN_ERR_NOMEM, "cuda executor: out of memory for the profile");
            goto fail;
        }
        for (int i = 0; i < ne; i++)
            if ((st = KILN_CU_CALL(&x->cu, err, x->cu.api.cuEventCreate(&x->pev[i], CU_EVENT_DEFAULT)))) goto fail;
        for (int i = 0; i < x->n_prog; i++)
            if (x->prog[i].kind == I_QKV &&
                (st = KILN_CU_CALL(&x->cu, err, x->cu.api.cuEventCreate(&x->pev_mid[i], CU_EVENT_DEFAULT))))
                goto fail;
        x->profile = true;
        prof_name(x);
    }
    x->stats.init_seconds = kiln_now() - t0;

    /* weights: lay out; the step budget against the free memory; allocate, upload */
    {
        size_t off = 0;
        for (int i = 0; i < x->n_dw; i++) {
            x->dw[i].offset = off;
            off = align256(off + (size_t)dw_bytes(x, &x->dw[i]));
        }
        for (int i = 0; i < x->n_dw; i++) /* fp8g128's group-major scales for W8A8, after every weight */
            if (x->dw[i].gscales) {
                x->dw[i].gs_offset = off;
                off = align256(off + (size_t)x->dw[i].rows * (size_t)kiln_quant_groups(x->dw[i].qt, x->dw[i].cols) * 4);
            }
        x->dweights_bytes = off;
        x->zmax = zmax_of(x);
        size_t fr = 0, tot = 0;
        if ((st = KILN_CU_CALL(&x->cu, err, x->cu.api.cuMemGetInfo(&fr, &tot)))) goto fail;
        if ((st = choose_step(x, o->max_step_tokens, o->kv_bytes, off, fr, (max_ctx + x->block_size - 1) / x->block_size,
                              err)))
            goto fail;
        if ((st = cx_alloc(x, off, "the weights", &x->dweights, err))) goto fail;
        long cores = sysconf(_SC_NPROCESSORS_ONLN);
        int threads = o->threads > 0 ? o->threads : cores > 16 ? 16 : cores > 0 ? (int)cores : 1;
        if ((st = upload_weights(x, threads, err)) || (st = gscales_fill(x, err))) goto fail;
        x->stats.weight_bytes = (int64_t)off;
    }

    /* activations and scratch */
    {
        const size_t R = rows4((size_t)x->max_rows), es = (size_t)x->es;
        size_t a8s = 1; /* W8A8's quantized activations: k8 columns and a8s scales a row */
        const size_t k8 = act8_cols(x, &a8s);
        for (int i = 0; i < x->n_bufs; i++) {
            char what[64];
            snprintf(what, sizeof what, "activation buffer %d", i);
            if ((st = cx_alloc(x, R * x->bufs[i].bytes, what, &x->bufs[i].p, err))) goto fail;
        }
        const size_t zmax = (size_t)x->zmax;
        const size_t qkvw = (size_t)(x->n_heads + 2 * x->n_kv) * (size_t)x->head_dim;
        if ((st = cx_alloc(x, R * qkvw * es, "the QKV scratch", &x->qkv_tmp, err)) ||
            (st = cx_alloc(x, R * (size_t)x->n_heads * (size_t)x->head_dim * es, "the q scratch", &x->q_tmp, err)) ||
            ((R > (size_t)gu_rows(x) || x->moe_e) && x->ffn_max > 0 &&
             (st = cx_alloc(x, R * 2 * (size_t)x->ffn_max * es, "the gate/up scratch", &x->gu_tmp, err))) ||
            (R > (size_t)qgemv_rows_min(x) && deq_bytes(x) > 0 &&
             (st = cx_alloc(x, deq_bytes(x), "the dequantized weight scratch", &x->deq_tmp, err))) ||
            (R > CX_QGEMM_MIN_M && qgemm_ws_floats(x) > 0 &&
             ((st = cx_alloc(x, qgemm_ws_floats(x) * 4, "the quantized GEMM's partial sums", &x->qg_ws, err)) ||
              (st = cx_alloc(x, kiln_qgemm_cnt(x->cu.n_sm) * 4, "the quantized GEMM's tile counters", &x->qg_cnt, err)) ||
              (st = KILN_CU_CALL(&x->cu, err, x->cu.api.cuMemsetD32(x->qg_cnt, 0, kiln_qgemm_cnt(x->cu.n_sm)))))) ||
            (R > (size_t)qgemv_rows_min(x) && k8 > 0 &&
             ((st = cx_alloc(x, R * k8, "the FP8 activations", &x->act8, err)) ||
              (st = cx_alloc(x, R * a8s * 4, "the FP8 activations' scales", &x->act8_scale, err)))) ||
            (st = cx_alloc(x, (size_t)max_seqs * (size_t)x->hidden * es, "the LM head input", &x->lm_x, err)) ||
            (st = cx_alloc(x, rows4((size_t)max_seqs) * (size_t)x->vocab * 4, "the logits", &x->logits, err)) ||
            (st = cx_alloc(x, (size_t)max_seqs * (size_t)x->n_heads * (size_t)zmax * (size_t)x->head_dim * 4,
                           "the attention split partials", &x->part_o, err)) ||
            (st = cx_alloc(x, (size_t)max_seqs * (size_t)x->n_heads * (size_t)zmax * 2 * 4,
                           "the attention split statistics", &x->part_ml, err)) ||
            (st = cx_alloc(x, (size_t)max_seqs * (size_t)x->n_kv * 4, "the attention split counters", &x->attn_cnt,
                           err)) ||
            (st = cx_alloc(x, (size_t)max_seqs * 4, "the sampled ids", &x->ids, err)) ||
            (x->vocab_part &&
             ((st = cx_alloc(x, (size_t)max_seqs * (size_t)x->vocab_part * 4, "this rank's logits", &x->logits_part,
                             err)) ||
              (st = cx_alloc(x, (size_t)max_seqs * (size_t)x->vocab * 4, "the gathered logits", &x->gather_tmp, err)))))
            goto fail;
        if (x->moe_e) {
            size_t mo[8];
            if ((st = cx_alloc(x, moe_bytes(x, x->max_rows, mo), "the experts' scratch", &x->moe_scr, err)) ||
                (st = KILN_CU_CALL(&x->cu, err, x->cu.api.cuMemAllocHost((void **)&x->moe_cnt_host,
                                                                         2 * ((size_t)x->moe_e + 1) * 4))))
                goto fail;
            CUdeviceptr *parts[8] = {&x->moe_sel, &x->moe_wsel, &x->moe_pos, &x->moe_tok,
                                     &x->moe_cnt, &x->moe_xs,   &x->moe_act, &x->moe_o};
            for (int i = 0; i < 8; i++) *parts[i] = x->moe_scr + mo[i];
        }
        if ((st = KILN_CU_CALL(&x->cu, err, x->cu.api.cuMemsetD32(x->attn_cnt, 0, (size_t)max_seqs * (size_t)x->n_kv)))) {
            kiln_err_prefix(err, "cuda executor: clearing the attention split counters: ");
            goto fail;
        }
        x->stats.buffer_bytes = x->bytes_now - (int64_t)x->dweights_bytes;
    }

    /* the step inputs */
    layout_inputs(&x->in, x->max_rows, max_seqs, (max_ctx + x->block_size - 1) / x->block_size);
    if ((st = cx_alloc(x, x->in.bytes, "the step inputs", &x->in_dev, err))) goto fail;
    if ((st = KILN_CU_CALL(&x->cu, err, x->cu.api.cuMemAllocHost((void **)&x->in_host, x->in.bytes))) ||
        (st = KILN_CU_CALL(&x->cu, err, x->cu.api.cuMemAllocHost((void **)&x->ids_host, (size_t)max_seqs * 4)))) {
        kiln_err_prefix(err, "cuda executor: pinned host memory for the step inputs: ");
        goto fail;
    }
    memset(x->in_host, 0, x->in.bytes);
    *out = x;
    return KILN_OK;
fail:
    cx_destroy(&x->base);
    return st;
}

/* KV bytes of one block: every layer's K and V of this rank's KV heads. */
static size_t kv_block_bytes(const cx *x) {
    return (size_t)x->n_layers * (size_t)x->n_kv * (size_t)x->block_size * (size_t)x->head_dim * 2 * (size_t)x->kv_es;
}

/* The KV blocks this executor's device can give it now: o->kv_bytes, else kv_fraction (0.9) of the
 * free memory, divided among the `share` ranks on the device; at most what max_seqs full contexts
 * need. Fewer than one block is KILN_ERR_NOMEM. */
static kiln_status kv_fit(cx *x, const kiln_cuda_exec_opts *o, int share, int64_t *nb_out, kiln_error *err) {
    const size_t block_bytes = kv_block_bytes(x);
    size_t want;
    if (o->kv_bytes > 0) {
        want = (size_t)o->kv_bytes / (size_t)share;
    } else {
        size_t fr = 0, tot = 0;
        kiln_status st = KILN_CU_CALL(&x->cu, err, x->cu.api.cuMemGetInfo(&fr, &tot));
        if (st) return st;
        double frac = o->kv_fraction > 0 ? o->kv_fraction : 0.9;
        want = (size_t)((double)fr * frac) / (size_t)share;
    }
    const int bs = x->block_size;
    kiln_kvpool probe = {.block_size = bs, .window = x->free_window, .max_step = x->max_rows};
    int64_t most = (int64_t)x->base.max_seqs * kiln_kvpool_blocks_for(&probe, x->base.max_context);
    int64_t nb = (int64_t)(want / block_bytes);
    if (nb > most) nb = most;
    if (nb > (1LL << 30) / bs) nb = (1LL << 30) / bs;
    if (nb < 1) {
        kiln_err(err, KILN_ERR_NOMEM, "cuda executor: KV memory of %zu bytes holds no block of %d tokens (%zu bytes over "
                 "%d layers)", want, bs, block_bytes, x->n_layers);
        return kiln_err_hint(err, "give more KV memory (kv_bytes, or a larger fraction of the free memory)");
    }
    *nb_out = nb;
    return KILN_OK;
}

/* The KV pool of nb blocks (the same count on every rank of a tensor-parallel engine). */
static kiln_status kv_alloc(cx *x, int64_t nb, kiln_error *err) {
    const int bs = x->block_size;
    x->kv_layer_bytes = (size_t)nb * (size_t)x->n_kv * (size_t)bs * (size_t)x->head_dim * (size_t)x->kv_es;
    char what[96];
    kiln_status st;
    snprintf(what, sizeof what, "the KV cache's K (%lld blocks of %d tokens)", (long long)nb, bs);
    if ((st = cx_alloc(x, x->kv_layer_bytes * (size_t)x->n_layers, what, &x->kcache, err))) return st;
    snprintf(what, sizeof what, "the KV cache's V (%lld blocks of %d tokens)", (long long)nb, bs);
    if ((st = cx_alloc(x, x->kv_layer_bytes * (size_t)x->n_layers, what, &x->vcache, err))) return st;
    if ((st = kiln_kvpool_init(&x->kv, x->base.max_seqs, x->base.max_context, bs, (int)nb, x->free_window, x->max_rows,
                               err)))
        return st;
    x->stats.kv_pool_bytes = (int64_t)(2 * x->kv_layer_bytes * (size_t)x->n_layers);
    x->stats.kv_blocks = nb;
    x->stats.block_size = bs;
    return kiln_cuda_sync(&x->cu, err);
}

kiln_status kiln_cuda_executor_new(const kiln_model *m, const kiln_cuda_exec_opts *o, kiln_executor **out,
                                   kiln_error *err) {
    *out = NULL;
    kiln_cuda_exec_opts def = {0};
    if (!o) o = &def;
    if (!m || !m->plan) return kiln_err(err, KILN_ERR_INVALID_ARG, "cuda executor: no model");
    if (m->plan->n_ranks > 1) return kiln_cuda_tp_new(m, o, out, err);
    if (o->n_devices > 1)
        return kiln_err(err, KILN_ERR_INVALID_ARG, "cuda executor: %d devices given for an engine of one rank",
                        o->n_devices);
    cx *x = NULL;
    int64_t nb = 0;
    kiln_status st = cx_new(m, o, 0, o->n_devices ? o->devices[0] : o->device, NULL, &x, err);
    if (!st) st = kv_fit(x, o, 1, &nb, err);
    if (!st) st = kv_alloc(x, nb, err);
    if (st) {
        if (x) cx_destroy(&x->base);
        return st;
    }
    *out = &x->base;
    return KILN_OK;
}


/* ---- one rank of a tensor-parallel engine, for the TP driver (kiln_cuda_rank.h) ---- */

kiln_status kiln_cx_new(const kiln_model *m, const kiln_cuda_exec_opts *o, int rank, int device, CUstream stream,
                        kiln_cx **out, kiln_error *err) {
    return cx_new(m, o, rank, device, stream, out, err);
}
kiln_status kiln_cx_kv_fit(kiln_cx *x, const kiln_cuda_exec_opts *o, int share, int64_t *blocks, kiln_error *err) {
    return kv_fit(x, o, share, blocks, err);
}
kiln_status kiln_cx_kv_alloc(kiln_cx *x, int64_t blocks, kiln_error *err) { return kv_alloc(x, blocks, err); }
kiln_executor *kiln_cx_executor(kiln_cx *x) { return &x->base; }
kiln_cuda *kiln_cx_cuda(kiln_cx *x) { return &x->cu; }
CUstream kiln_cx_stream(const kiln_cx *x) { return x->stream; }
CUevent kiln_cx_done(const kiln_cx *x) { return x->done; }
int kiln_cx_program_size(const kiln_cx *x) { return x->n_prog; }
bool kiln_cx_uses_graphs(const kiln_cx *x) { return !x->no_graphs && !x->profile; }
int kiln_cx_bucket(const kiln_cx *x, int n) { return bucket(x, n); }
void kiln_cx_tune_decode(kiln_cx *x, int B) { tune_decode(x, B); }

kiln_status kiln_cx_step_begin(kiln_cx *x, const kiln_step *s, kiln_cx_shape *sh, kiln_error *err) {
    return step_begin(x, s, sh, err);
}
kiln_status kiln_cx_run(kiln_cx *x, const kiln_cx_shape *sh, int from, int *stop, kiln_error *err) {
    return run_range(x, sh, from, stop, err);
}
kiln_status kiln_cx_sample(kiln_cx *x, const kiln_cx_shape *sh, kiln_error *err) { return run_sample(x, sh, err); }
kiln_status kiln_cx_step_end(kiln_cx *x, int n, bool sampled, kiln_error *err) { return step_end(x, n, sampled, err); }
kiln_status kiln_cx_step_finish(kiln_cx *x, const kiln_step *s, const kiln_cx_shape *sh, bool sampled,
                                kiln_error *err) {
    return step_finish(x, s, sh, sampled, err);
}

void kiln_cx_coll(const kiln_cx *x, int i, const kiln_cx_shape *sh, kiln_cx_coll_desc *d) {
    const cx_inst *in = &x->prog[i];
    memset(d, 0, sizeof *d);
    d->op = in->op;
    d->gather = in->gather;
    if (in->gather) {
        d->in = x->logits_part;
        d->out = x->logits;
        d->tmp = x->gather_tmp;
        d->rows = sh->B;
        d->width = x->vocab_part;
        d->out_width = x->vocab;
        d->f32 = true;
    } else {
        d->in = bufp(x, in->x);
        d->out = bufp(x, in->y);
        d->rows = sh->T;
        d->width = d->out_width = in->width;
        d->f32 = x->f32;
    }
}

void kiln_cx_mark(kiln_cx *x, int i, bool after) {
    if (x->profile) x->cu.api.cuEventRecord(x->pev[2 * i + (after ? 1 : 0)], x->stream);
}

kiln_status kiln_cx_tp_sum(kiln_cx *x, const CUdeviceptr *in, const CUdeviceptr *out, int n_ranks, size_t n,
                           bool f32, kiln_error *err) {
    if (n_ranks > KILN_TP_LOCAL_MAX)
        return kiln_err(err, KILN_ERR_UNSUPPORTED, "cuda executor: %d ranks on one device (at most %d)", n_ranks,
                        KILN_TP_LOCAL_MAX);
    kiln_tp_sum_params sp = {.n = (long long)n, .n_ranks = n_ranks, .f32 = f32};
    for (int r = 0; r < n_ranks; r++) {
        sp.in[r] = in[r];
        sp.out[r] = out[r];
    }
    size_t blocks = (n + 255) / 256;
    if (blocks > (size_t)x->cu.n_sm * 8) blocks = (size_t)x->cu.n_sm * 8;
    if (blocks < 1) blocks = 1;
    return launch(x, x->f_tp_sum, (unsigned)blocks, 1, 1, 256, 0, &sp, "kiln_tp_sum", err);
}

size_t kiln_cx_widest_collective(const kiln_cx *x) {
    size_t w = 0;
    for (int i = 0; i < x->n_prog; i++)
        if (x->prog[i].kind == I_COLL && !x->prog[i].gather && (size_t)x->prog[i].width * (size_t)x->es > w)
            w = (size_t)x->prog[i].width * (size_t)x->es;
    return w;
}

kiln_status kiln_cx_tp_oneshot(kiln_cx *x, const kiln_tp_oneshot_params *prm, kiln_error *err) {
    return launch(x, x->f_tp_oneshot, KILN_TP_ONESHOT_BLOCKS, 1, 1, 256, 0, (void *)prm, "kiln_tp_oneshot", err);
}

void kiln_cx_destroy(kiln_cx *x) {
    if (x) cx_destroy(&x->base);
}
