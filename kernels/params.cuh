/*
 * params.cuh — one plain parameter struct per kernel family, shared by the
 * device code (NVRTC) and the host (C17), so both agree on the layout.
 * Each kernel takes its struct by value as its only parameter.
 *
 * Rules that keep the layout identical in C and CUDA C: only 8-byte device
 * addresses (kiln_dptr), 4-byte int/float and unsigned, 8-byte members
 * first; no pointers (their type differs between host and device code) and
 * no bool. A device address of 0 means "absent" where a field says so.
 *
 * Shapes use the names of the kernels' #define constants: HIDDEN, N_HEADS
 * (query heads), N_KV_HEADS, HEAD_DIM, BLOCK_SIZE (tokens per KV block).
 * "bf16" below is the element type kiln_elem (common.cuh): fp32 in a module
 * compiled with KILN_F32=1 (f32 engines); logits and partial sums are fp32
 * either way.
 * Paged KV cache layout (both K and V): bf16 [num_blocks][N_KV_HEADS]
 * [BLOCK_SIZE][HEAD_DIM]: one block of one head is BLOCK_SIZE*HEAD_DIM
 * contiguous values, which is what decode attention streams.
 */
#ifndef KILN_KERNEL_PARAMS_CUH
#define KILN_KERNEL_PARAMS_CUH

typedef unsigned long long kiln_dptr; /* a device address (CUdeviceptr) */

/* y[M,N] = x[M,K] · W[N,K]^T (+ residual[M,N]); bf16 in, fp32 accumulate.
 * With GEMV_SWIGLU, W holds 2F interleaved rows (gate_f at 2f, up_f at
 * 2f+1), N = 2F, and y[M,F] = silu(gate) * up. Kernel: kiln_gemv. */
typedef struct kiln_gemv_params {
    kiln_dptr x;        /* bf16 [M, ldx]: the activations, first K used */
    kiln_dptr w;        /* bf16 [N, K]: a HuggingFace Linear weight [out, in] */
    kiln_dptr y;        /* bf16 (fp32 with GEMV_OUT_F32) [M, ldy] */
    kiln_dptr residual; /* bf16 [M, ldy] added to y, or 0; may equal y */
    int M, N, K;
    int ldx, ldy;       /* row strides in elements */
    int pad_;
    /* Optional RMSNorm prologue (norm_w != 0): x is then the raw residual
     * stream and the GEMV multiplies bf16(norm_w * bf16(x * rsqrt(mean(x^2)
     * + norm_eps))) instead of x (HF's roundings; each warp recomputes the
     * row's sum of squares). K is the norm's length (HIDDEN). */
    kiln_dptr norm_w;   /* bf16 [K], or 0 = no norm */
    float norm_eps;
    int pad2_;
    /* Quantized W (modules built with GEMV_QUANT; common/quant.c's layout): w points at the codes,
     * wscale at the f32 scales ([N] for q8, [N, K/GEMV_GROUP] for q4), wmin at q4's f32 group
     * minimums ([N, K/GEMV_GROUP]); both 0 for a bf16 W. */
    kiln_dptr wscale;
    kiln_dptr wmin;
    /* Expert GEMV (modules built with GEMV_MOE; moe.cuh's routing feeds it): block z is pair z, its
     * expert moe_sel[z] (int32, read on the device so decode stays in a CUDA graph); W is then
     * expert moe_sel[z]'s matrix (w + moe_sel[z] * moe_wstride elements), x row z / moe_xdiv, y row z.
     * M is 1 per pair. */
    kiln_dptr moe_sel;
    long long moe_wstride;
    int moe_xdiv;
    int pad3_;
} kiln_gemv_params;

/* The quantized GEMM (qgemm.cuh, kiln_qgemm): y = x · W^T over a quantized W for steps of many rows,
 * blocks of QG_TM rows of x and 16 * QG_WARPS rows of W. g's fields as for the GEMV (x, w, y,
 * residual, M, N, K, ldx, ldy, wscale, wmin; norm_w and the expert fields unused, 0). With splits > 1,
 * each of a tile's splits blocks (grid z) takes `chunks` chunks of 128 columns of K; ws holds their
 * fp32 partial tiles and cnt counts each tile's finished blocks (0 between launches). */
#define KILN_QGEMM_TM_MAX 64
/* one stage of its shared-memory ring: the chunk's x (tm rows of 128 bf16), codes (16 warps rows of 128
 * columns) and, q4, the rows' scales and minimums of the chunk's 128 / group groups */
#define KILN_QGEMM_STAGE(bits, group, warps, tm)                                                    \
    ((tm) * 256 + 16 * (warps) * 16 * (bits) + ((bits) == 4 ? 2 * 16 * (warps) * (128 / (group)) * 4 : 0))
typedef struct kiln_qgemm_params {
    kiln_gemv_params g;
    kiln_dptr ws;  /* f32 [tiles][splits][QG_TM][16 * QG_WARPS], or 0 with one split */
    kiln_dptr cnt; /* u32 [tiles], zero, or 0 with one split */
    int splits;    /* blocks a tile (grid z) */
    int chunks;    /* 128-column chunks of K a split */
} kiln_qgemm_params;

/* Mixtral's sparse experts (KILN_OP_MOE, kernels/moe.cuh), over M tokens with E = MOE_E experts of
 * which MOE_K are chosen per token. Routing: logits = x · router^T (fp32), softmax, torch.topk's
 * choice (runtime/topk.c's order, ties included), the chosen probabilities renormalised (not with
 * MOE_NO_RENORM). Pair m*K + j is token m's j-th choice. Kernels: kiln_moe_route (a block per
 * token), kiln_moe_group (one block: counts, offsets, each pair's row when grouped by expert),
 * kiln_moe_gather (a block per grouped row), kiln_moe_combine (a block per token). */
typedef struct kiln_moe_params {
    kiln_dptr x;       /* bf16 [M, HIDDEN]: the layer's input */
    kiln_dptr router;  /* bf16 [E, HIDDEN] */
    kiln_dptr sel;     /* int32 [M, K]: chosen experts, in torch.topk's order */
    kiln_dptr wsel;    /* f32 [M, K]: their weights */
    kiln_dptr counts;  /* int32 [E + 1]: tokens per expert, then the pairs (group) */
    kiln_dptr offsets; /* int32 [E + 1]: first grouped row of each expert (group), offsets[E] = M*K */
    kiln_dptr pos;     /* int32 [M, K]: pair's row in the grouped order (group) */
    kiln_dptr tok;     /* int32 [M * K]: grouped row's token (group) */
    kiln_dptr xs;      /* bf16 [M*K, HIDDEN]: grouped rows of x (gather) */
    kiln_dptr o;       /* expert outputs [rows, HIDDEN], fp32 when o_f32 else bf16 (combine) */
    kiln_dptr y;       /* bf16 [M, HIDDEN]: the sum over each token's experts (combine) */
    int M;
    int mode;          /* combine: row of pair (m, j) in o: 0 m*K + j (pairs), 1 sel*ldo + m (every expert
                          ran every token), 2 pos[m*K + j] (grouped) */
    int ldo;           /* combine mode 1: rows per expert in o */
    int o_f32;
} kiln_moe_params;

/* out[N, K] = the quantized W (codes at w, scales, q4's minimums) dequantized to bf16 (fp32 with
 * KILN_F32), exactly as common/quant.c does it in fp32 and then rounded once: the weight a
 * cuBLASLt GEMM reads when a step has more rows than the quantized GEMV takes. bits: 8 (q8) or 4
 * (q4 in groups of `group` columns). Kernel: kiln_dequant, one thread per 8 columns. */
typedef struct kiln_dequant_params {
    kiln_dptr w, wscale, wmin, out;
    int N, K, bits, group;
    int fp8, pad_; /* bits 8: the codes are FP8 E4M3 (fp8), not int8 (q8) */
} kiln_dequant_params;

/* Per-token FP8 quantization of a GEMM's input for W8A8 (fp8 weights through cuBLASLt's FP8
 * GEMM): for each row m of x, amax = max |x[m, k]|, scale[m] = amax / 448 and
 * codes[m, k] = E4M3(x[m, k] * (448 / amax)), rounded to nearest even and saturated at 448
 * (common/quant.c kiln_act_fp8_row does the same in C; a row of zeros gets scale 0 and codes 0).
 * Kernel: kiln_act_fp8, one block of ACTQ_THREADS per row; K % 8 == 0. kiln_act_fp8g (fp8g128):
 * the same per row and 128 columns (the last group the rest), scales [ceil(K / 128)][M], M a
 * multiple of 4 (cuBLASLt's 128-column scales): rows from `rows` to M get zero codes and scales. */
typedef struct kiln_act_fp8_params {
    kiln_dptr x;      /* bf16 [M, K] */
    kiln_dptr codes;  /* E4M3 [M, K] */
    kiln_dptr scales; /* f32 [M] */
    int M, K;
    int rows, pad_; /* kiln_act_fp8g: rows of x (<= M) */
} kiln_act_fp8_params;

/* out[c, r] = in[r, c]: an fp32 [rows, cols] matrix transposed. Kernel: kiln_transpose_f32, one thread an
 * element in blocks of 256. */
typedef struct kiln_transpose_params {
    kiln_dptr in, out;
    int rows, cols;
} kiln_transpose_params;

/* residual[m] = x[m] + residual[m] (rounded to bf16; skipped when x = 0);
 * out[m] = w * rmsnorm(residual[m]). One block per row. Kernel: kiln_rmsnorm. */
typedef struct kiln_rmsnorm_params {
    kiln_dptr x;        /* bf16 [M, HIDDEN], or 0 for a plain RMSNorm of residual */
    kiln_dptr residual; /* bf16 [M, HIDDEN], in/out */
    kiln_dptr w;        /* bf16 [HIDDEN] */
    kiln_dptr out;      /* bf16 [M, HIDDEN] */
    int M;
    int pad_;
    kiln_dptr codes;    /* kiln_rmsnorm_fp8: E4M3 [M, HIDDEN] instead of out, */
    kiln_dptr scales;   /* and f32 [M] (after the fields kiln_rmsnorm reads, which older engines' kernels take) */
    kiln_dptr perm;     /* +out_perm: int32 [HIDDEN], out[m, j] = the normalised element perm[j] (0 = in order;
                           kiln_rmsnorm then takes HIDDEN elements of dynamic shared memory) */
} kiln_rmsnorm_params;

/* RoPE on q and k of a fused QKV projection output, q written out, k and v
 * written into the paged KV cache. One block per token. Kernel: kiln_rope_kv. */
typedef struct kiln_rope_kv_params {
    kiln_dptr qkv;       /* bf16 [T, (N_HEADS + 2*N_KV_HEADS) * HEAD_DIM]: q heads, k heads, v heads */
    kiln_dptr q_out;     /* bf16 [T, N_HEADS, HEAD_DIM]: rotated q */
    kiln_dptr k_cache;   /* bf16 paged cache (layout above) */
    kiln_dptr v_cache;
    kiln_dptr positions; /* int32 [T]: each token's position in its sequence */
    kiln_dptr slots;     /* int32 [T]: block_id * BLOCK_SIZE + offset; -1 = do not store (padding) */
    kiln_dptr bias;      /* QKV_BIAS: bf16 [(N_HEADS + 2*N_KV_HEADS) * HEAD_DIM] = [bq; bk; bv], else 0 */
    kiln_dptr q_norm;    /* QK_NORM: bf16 [HEAD_DIM] each, else 0 */
    kiln_dptr k_norm;
    int T;
    int pad_;
    kiln_dptr kv_scale;  /* KILN_KV8 (an 8-bit cache): bf16 [2][N_KV_HEADS], K's scales then V's; else 0 */
} kiln_rope_kv_params;

/* Decode attention: one query token per sequence over its paged KV cache
 * (already holding that token's k and v), GQA, optional sliding window,
 * split along the sequence in chunks of `partition` tokens. Kernels:
 * kiln_attn_decode (grid N_KV_HEADS x B x max_splits) and, when max_splits
 * > 1, kiln_attn_decode_combine (grid N_HEADS x B). */
typedef struct kiln_attn_decode_params {
    kiln_dptr q;            /* bf16 [B, N_HEADS, HEAD_DIM], rotated */
    kiln_dptr k_cache;      /* bf16 paged cache */
    kiln_dptr v_cache;
    kiln_dptr block_tables; /* int32 [B, max_blocks]: the sequence's KV block ids in order */
    kiln_dptr seq_lens;     /* int32 [B]: tokens in the cache, the query's own included */
    kiln_dptr out;          /* bf16 [B, N_HEADS, HEAD_DIM] */
    kiln_dptr part_o;       /* fp32 [B, N_HEADS, max_splits, HEAD_DIM] (splits > 1 only) */
    kiln_dptr part_ml;      /* fp32 [B, N_HEADS, max_splits, 2]: running max (log2 units), sum */
    float scale;            /* softmax scale, usually 1/sqrt(HEAD_DIM) */
    int B, max_blocks, max_splits;
    int partition;          /* tokens per split, 1..PARTITION (kiln_attn_decode_partition picks it);
                               0 = per sequence, from its length and splits_want (attn_decode.cuh) */
    int splits_want;        /* with partition 0: the splits a sequence aims for (fills the GPU) */
    kiln_dptr counters;     /* int32 [B, N_KV_HEADS], zero between launches: with it, the last
                               split block of each (sequence, kv head) to finish merges the splits
                               itself (and sets its counter back to 0), so no combine kernel runs;
                               0 = the combine kernel does it */
    /* Fused RoPE + KV write (qkv != 0): q and the new token's k come unrotated
     * from the QKV projection's output; each block rotates its q heads, the
     * block holding a sequence's last token rotates that token's k, stores k
     * and v into the cache at slots[b] (-1 = not stored) and uses them from
     * shared memory, so no rope_kv kernel runs before. The rope constants are
     * the rope_kv module's (kiln_rope_freq in common.cuh). 0 = p.q holds the
     * rotated q and the cache already holds the token. */
    kiln_dptr qkv;          /* bf16 [B, (N_HEADS + 2*N_KV_HEADS) * HEAD_DIM] */
    kiln_dptr positions;    /* int32 [B]: the new token's position */
    kiln_dptr slots;        /* int32 [B]: its KV slot, block_id * BLOCK_SIZE + offset */
    float rope_theta, rope_factor, rope_low_freq_factor, rope_high_freq_factor, rope_orig_max_pos;
    int rope_llama3;
    kiln_dptr kv_scale;     /* KILN_KV8 (an 8-bit cache of codes): bf16 [2][N_KV_HEADS], K's scales then V's */
} kiln_attn_decode_params;

#if defined(__CUDACC__)
#define KILN_HOST_DEVICE static __host__ __device__ __forceinline__
#else
#define KILN_HOST_DEVICE static inline
#endif

/* Decode attention's split size for n attended tokens when `part` (a multiple of 32) is wanted but
 * splits may be at most `most` long: `part` itself, or else as many splits as `most` needs, of even
 * length (multiples of 32). The same rule for the host's fixed split (kiln_attn_decode_partition)
 * and the kernel's per-sequence one (kiln_attn_part). */
KILN_HOST_DEVICE int kiln_attn_even_split(int n, int part, int most) {
    if (part <= most) return part;
    const int k = (n + most - 1) / most;
    return ((n + k - 1) / k + 31) / 32 * 32;
}

/* kiln_attn_decode's dynamic shared memory, bytes, for G = N_HEADS / N_KV_HEADS query heads per kv
 * head: [warps][G][head_dim] partial o, [warps][G][2] and [G][2] max and sum, and the split's block
 * ids (partition_max / block_size + 2). One formula for the host (kiln_attn_decode_smem) and the
 * kernel (which sizes its cp.async ring so the block stays within 48 KB). */
#define KILN_ATTN_DECODE_SMEM(g, head_dim, block_size, partition_max, warps) \
    (4 * ((warps) * (g) * (head_dim) + 2 * (warps) * (g) + 2 * (g) + (partition_max) / (block_size) + 2))
/* kiln_attn_decode_tc's (attn_decode.cuh, ATTN_TC): the split's block ids rounded up to 16 bytes,
 * then each warp's cp.async ring of KILN_ATTN_TC_STAGES tiles, a thread's part of a tile (es: bytes
 * an element of the cache) being 2 * head_dim * es bytes of K and V of 16 tokens over 32 lanes. */
#define KILN_ATTN_TC_STAGES(es) ((es) == 1 ? 3 : 2)
#define KILN_ATTN_DECODE_TC_SMEM_S(head_dim, block_size, partition_max, warps, es, stages) \
    ((4 * ((partition_max) / (block_size) + 2) + 15) / 16 * 16 + (stages) * (head_dim) * (es) * (warps) * 32)
#define KILN_ATTN_DECODE_TC_SMEM(head_dim, block_size, partition_max, warps, es) \
    KILN_ATTN_DECODE_TC_SMEM_S(head_dim, block_size, partition_max, warps, es, KILN_ATTN_TC_STAGES(es))

/* Prefill attention (flash style, causal, GQA, sliding window) for a batch
 * of query chunks whose k and v are already in the paged cache. Query i of
 * sequence b sits at position seq_lens[b] - q_len(b) + i. Grid:
 * ceil(max_q_len / PF_BQ) x N_HEADS x B. Kernel: kiln_attn_prefill. */
typedef struct kiln_attn_prefill_params {
    kiln_dptr q;            /* bf16 [T, N_HEADS, HEAD_DIM], rotated; T = q_starts[B] */
    kiln_dptr k_cache;
    kiln_dptr v_cache;
    kiln_dptr block_tables; /* int32 [B, max_blocks] */
    kiln_dptr seq_lens;     /* int32 [B]: context length after this chunk */
    kiln_dptr q_starts;     /* int32 [B + 1]: sequence b's queries are rows q_starts[b] .. q_starts[b+1]-1 */
    kiln_dptr out;          /* bf16 [T, N_HEADS, HEAD_DIM] */
    float scale;
    int B, max_blocks;
    int pad_;
    kiln_dptr kv_scale;     /* KILN_KV8: bf16 [2][N_KV_HEADS], K's scales then V's */
} kiln_attn_prefill_params;

/* out[m, f] = silu(gu[m, f]) * gu[m, FFN + f] (gate half then up half), or with
 * SWIGLU_INTERLEAVED silu(gu[m, 2f]) * gu[m, 2f + 1]. Kernel: kiln_swiglu. */
typedef struct kiln_swiglu_params {
    kiln_dptr gu;     /* bf16 [M, 2*FFN] */
    kiln_dptr out;    /* bf16 [M, FFN]; kiln_swiglu_fp8: E4M3 codes [M, FFN] */
    int M;
    int pad_;
    kiln_dptr scales; /* kiln_swiglu_fp8: f32 [M], each row's scale */
} kiln_swiglu_params;

/* One token per row of logits: greedy (temperature <= 0), else softmax at
 * the temperature, top-k (0 = off), top-p (>= 1 = off), drawn with a
 * counter-based generator from (seed, counter): same inputs, same token.
 * One block per row. Kernel: kiln_sample. */
typedef struct kiln_sample_params {
    kiln_dptr logits;      /* fp32 [B, V] */
    kiln_dptr temperature; /* fp32 [B] */
    kiln_dptr top_k;       /* int32 [B] */
    kiln_dptr top_p;       /* fp32 [B] */
    kiln_dptr seeds;       /* uint64 [B] */
    kiln_dptr counters;    /* uint64 [B]: e.g. the step number; the caller advances it */
    kiln_dptr out_ids;     /* int32 [B] */
    int B, V;
} kiln_sample_params;

/* Row gather, any element type: out[i, :] = src[idx[i] - base, :] for i < M,
 * rows of row_bytes bytes (embedding lookup; the last token of each sequence
 * before the LM head). Rows outside 0..n_src-1 are written as zeros: a
 * tensor-parallel rank's slice of the embedding holds ids base .. base +
 * n_src - 1, and the all-reduce after it adds the ranks' rows. Kernel:
 * kiln_gather_rows (util.cuh). */
typedef struct kiln_gather_params {
    kiln_dptr src;      /* [n_src, row_bytes] */
    kiln_dptr idx;      /* int32 [M] */
    kiln_dptr out;      /* [M, row_bytes] */
    int M, row_bytes;
    int n_src;
    int base;           /* the id of src's first row (0 but on a vocabulary-parallel rank) */
} kiln_gather_params;

/* The permute op (act-order GPTQ's input order): out[m, j] = in[m, perm[j]] for m < M, j < K, elements of
 * es bytes (2 or 4); perm a permutation of 0..K-1 (checked when the engine is loaded). Kernel:
 * kiln_gather_cols (util.cuh). */
typedef struct kiln_gather_cols_params {
    kiln_dptr in, perm, out; /* [M, K], int32 [K], [M, K] */
    int M, K, es;
} kiln_gather_cols_params;

/* Tensor-parallel ranks on one device sum their partial vectors in place of
 * NCCL: out[r][i] = in[0][i] + in[1][i] + ... (rank order, fp32, rounded
 * once) for every rank r, so every rank holds the same bits. Kernel:
 * kiln_tp_sum (util.cuh). */
#define KILN_TP_LOCAL_MAX 8
typedef struct kiln_tp_sum_params {
    kiln_dptr in[KILN_TP_LOCAL_MAX];  /* each rank's partial, [n] elements */
    kiln_dptr out[KILN_TP_LOCAL_MAX]; /* each rank's sum, [n] (may be its in) */
    long long n;
    int n_ranks;
    int f32;                          /* elements are fp32 (else bf16) */
} kiln_tp_sum_params;

/* One-shot collectives between tensor-parallel ranks whose memory is mutually addressable (one device,
 * or GPUs with peer access), one kernel per rank on its own stream, each block meeting its peers at a
 * flag barrier in device memory (no host, so they replay in CUDA graphs). Kernel: kiln_tp_oneshot.
 *   mode 0, all-reduce: each rank copies its partial `in` into its staging half, the blocks meet, then
 *     every rank sums the ranks' staging copies in rank order (fp32, rounded once) into `out` (may be
 *     `in`). Two staging halves alternate by call, so a call never overwrites what a peer may still read.
 *   mode 1, gather: the blocks meet (every rank's slice in src[] is written), then rank 0 copies src[q]
 *     [rows, width] (f32) to out columns q x width .. of its [rows, out_width] rows; the other ranks only
 *     meet. The slices are not written again before the next step's collectives, which wait for rank 0.
 * The barrier: block b of rank r writes the call number into flags[t][b * n_ranks + r] of every rank t
 * and waits for its own flags[r][b * n_ranks + q] from every q; the call number is the block's counter
 * (this rank's memory) plus one, the same on every rank since they run the same calls.
 * A peer that does not arrive within timeout_ns (a GPU that stopped) does not hang the rank: the block
 * writes q + 1 into `fault` (host memory the runtime reads after the step) and sets the rank's poison
 * word, counter[KILN_TP_ONESHOT_BLOCKS], after which every call of this rank returns at once; the
 * results are then garbage and the runtime fails the step and every later one. */
#define KILN_TP_ONESHOT_BLOCKS 16
typedef struct kiln_tp_oneshot_params {
    kiln_dptr in, out;                     /* this rank's partial and sum (mode 0); rank 0's logits (mode 1) */
    kiln_dptr stage[KILN_TP_LOCAL_MAX];    /* mode 0: every rank's staging, 2 halves of `half` bytes each */
    kiln_dptr src[KILN_TP_LOCAL_MAX];      /* mode 1: every rank's slice */
    kiln_dptr flags[KILN_TP_LOCAL_MAX];    /* every rank's uint32 [KILN_TP_ONESHOT_BLOCKS, n_ranks] */
    kiln_dptr counter;                     /* this rank's uint32 [KILN_TP_ONESHOT_BLOCKS + 1]: calls, poison */
    kiln_dptr fault;                       /* this rank's uint32 in mapped host memory: missing rank + 1 */
    long long timeout_ns;                  /* how long a block waits for its peers */
    long long n;                           /* mode 0: elements */
    long long half;                        /* bytes of one staging half */
    int rows, width, out_width;            /* mode 1 */
    int rank, n_ranks, mode, f32;
    int pad_;
} kiln_tp_oneshot_params;

#endif /* KILN_KERNEL_PARAMS_CUH */
