/*
 * cublaslt.c — dense bf16 GEMMs through cuBLASLt (prefill projections,
 * decode steps above the GEMV's token limit, and the baseline the decode
 * GEMV is measured against). Contracts in runtime/kiln_cuda.h.
 *
 * Layout: kiln keeps HuggingFace's row-major weight [N=out, K=in] and
 * activations [M, K]. cuBLASLt is column-major, so y[M,N] = x·W^T is asked
 * for as the column-major product C[N,M] = A^T · B with A = W seen as K×N
 * (lda = K), B = x seen as K×M (ldb = K), C = y seen as N×M (ldc = N).
 *
 * Algorithm choice: by default the heuristic's first answer. For the few
 * shapes a decode graph replays thousands of times, kiln_cublaslt_tune()
 * times the heuristic's first KILN_LT_CANDIDATES answers and keeps the
 * fastest. The heuristic ranks by a model, not a measurement, and at
 * decode's small, memory-bound M its first answer left the GEMMs of a
 * Mistral-7B step at batch 64 at ~70% of the weight-read floor on an H200
 * (4.9 ms against 3.45). Timing: each candidate runs once outside capture
 * (loads its kernel; a failure skips it), then KILN_LT_TUNE_RUNS runs over
 * the caller's weights in turn (one copy per layer, so the runs read HBM as
 * a decode step does rather than a weight left in L2) are captured into a
 * CUDA graph, launched once to warm up and once between two events. The
 * graph keeps host launch cost out of the number, as in the decode graph.
 *
 * Beyond the heuristic (off unless kiln_cublaslt_set_search turns it on):
 * where the fastest answer's tiles fill less than a wave of the GPU (decode
 * batches, a short prefill: M = 128 by N = 4096 is 32 to 64 tiles for 132
 * SMs), tuning also times that answer with each other tile its algorithm
 * offers (up to KILN_LT_TILE_MAX), then split-K variants of the fastest
 * KILN_LT_SPLIT_BASES candidates so far (cublasLtMatmulAlgoConfigSetAttribute:
 * 2 to 16 splits, up to KILN_LT_SPLIT_WAVES waves, partial sums reduced in
 * fp32 in the workspace — CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE, never the
 * bf16 output type). Every variant is accepted by cublasLtMatmulAlgoCheck
 * before it is timed. (The heuristic's own answers may split K already: it
 * chose 23 to 25 splits for M = 16, N = 256, K = 32768, where 16 measured
 * 13 % faster on the H200.) Measured on the H200 with cuBLASLt 130100 for
 * Mistral-7B's shapes (docs/benchmarks.md), the variants won by 0–4 % at
 * 2 to 64 rows and never at 128 or 2048, and a 128-token prefill or decode
 * at batch 8 and 64 did not move beyond run-to-run noise, while tuning a
 * shape took 3 to 10 times longer: so it stays off by default, for `kiln
 * tune --search` to try on other GPUs and shapes.
 *
 * Recorded algorithms: an engine's tuning record (format/kiln_tuning.h,
 * written by `kiln tune` from kiln_cublaslt_export's measurements) gives
 * the algorithm of each shape it has; plan_get takes it instead of the
 * heuristic's answer once cublasLtMatmulAlgoCheck accepts it for the plan's
 * descriptors and workspace (kiln_cublaslt_use_recorded), and tuning keeps
 * it untimed. The record is used only with the cuBLASLt version it was
 * measured with (the executor checks that).
 */
#include "runtime/kiln_cuda.h"

#include <cublasLt.h>
#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>

#ifndef KILN_CUBLASLT_SONAME
#define KILN_CUBLASLT_SONAME "libcublasLt.so"
#endif

/* The cuBLASLt entry points kiln uses, resolved with dlsym when a handle is
 * made (kiln_cublaslt_create): nothing links libcublasLt, so a binary starts
 * without it and CPU runs and --version never map its few hundred MB; only a
 * GPU context loads it. Search: the library path and the RUNPATH of the
 * caller (kiln-run and libkiln.so carry $ORIGIN, so a copy beside them is
 * found), then the build's toolkit folder. */
#define KILN_LT_FUNCS(X)                                                                                           \
    X(cublasLtCreate) X(cublasLtDestroy) X(cublasLtMatmulDescCreate) X(cublasLtMatmulDescDestroy)                  \
    X(cublasLtMatmulDescSetAttribute) X(cublasLtMatrixLayoutCreate) X(cublasLtMatrixLayoutDestroy)                 \
    X(cublasLtMatmulPreferenceCreate) X(cublasLtMatmulPreferenceDestroy) X(cublasLtMatmulPreferenceSetAttribute)   \
    X(cublasLtMatmulAlgoGetHeuristic) X(cublasLtMatmul) X(cublasLtMatmulAlgoConfigGetAttribute)                   \
    X(cublasLtMatmulAlgoCheck) X(cublasLtGetVersion) X(cublasLtMatmulAlgoCapGetAttribute)                          \
    X(cublasLtMatmulAlgoConfigSetAttribute)
#define KILN_LT_MEMBER_(fn) __typeof__(fn) *fn;
typedef struct kiln_lt_api {
    void *lib; /* dlopen handle of libcublasLt */
    KILN_LT_FUNCS(KILN_LT_MEMBER_)
} kiln_lt_api;

/* Plans (descriptors + the chosen algorithm) of recent shapes are kept, so
 * a repeated GEMM (every layer of a model has the same few shapes) skips
 * descriptor setup and the heuristic query. Replaced round-robin when full,
 * except tuned plans, which stay (prefill's varying M would otherwise evict
 * them); at most KILN_LT_PINNED_MAX of them, so room always remains. */
#define KILN_LT_PLANS 128
#define KILN_LT_PINNED_MAX 96
#ifndef KILN_LT_CANDIDATES
#define KILN_LT_CANDIDATES 12 /* heuristic answers timed per tuned shape */
#endif
#define KILN_LT_SPLIT_BASES 2 /* the fastest candidates that split-K variants are made of */
#define KILN_LT_TILE_MAX 24   /* other tiles of the fastest heuristic answer timed, at most */
#define KILN_LT_SPLIT_WAVES 2.0f /* variants up to this many waves of the GPU's SMs */
#define KILN_LT_TUNE_RUNS 6   /* GEMMs per timed graph launch (estimate: ~60 ms per decode batch of Mistral-7B) */

typedef struct kiln_lt_plan {
    int M, N, K, accumulate, valid, in_f32, out_f32;
    int fp8; /* W8A8 (kiln_cublaslt_gemm_fp8): E4M3 x and W, a kiln_lt_fp8 (scales, accumulation), or 0 */
    int tuned; /* kiln_cublaslt_tune ran on it (whatever it found): never evicted, never tuned again */
    int recorded; /* its algorithm came from the engine's tuning record (kiln_cublaslt_use_recorded) */
    float us, heur_us; /* tuning's measurement: the chosen algorithm's time (0: not measured), the heuristic's first's (-1: did not run) */
    int n_cand, pick;  /* candidates timed, the chosen one's rank */
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t la, lb, lc;
    cublasLtMatmulAlgo_t algo;
} kiln_lt_plan;

struct kiln_cublaslt {
    kiln_lt_api api;
    kiln_cuda *cu;
    cublasLtHandle_t handle;
    CUdeviceptr workspace;
    size_t workspace_bytes;
    kiln_lt_plan plans[KILN_LT_PLANS];
    int next_victim;
    int n_pinned;     /* plans with tuned set */
    CUevent ev[2];    /* tuning's timing events, made on first use */
    bool search;      /* tuning times variants of the heuristic's answers too (kiln_cublaslt_set_search) */
    /* the engine's record for this GPU (kiln_cublaslt_use_recorded): its GEMM entries and, per entry,
     * 1 = used by some plan, 2 = refused by cublasLtMatmulAlgoCheck */
    kiln_tuning_record rec;
    uint8_t *rec_state;
};

static void plan_free(const kiln_cublaslt *lt, kiln_lt_plan *p) {
    if (p->lc) lt->api.cublasLtMatrixLayoutDestroy(p->lc);
    if (p->lb) lt->api.cublasLtMatrixLayoutDestroy(p->lb);
    if (p->la) lt->api.cublasLtMatrixLayoutDestroy(p->la);
    if (p->op) lt->api.cublasLtMatmulDescDestroy(p->op);
    memset(p, 0, sizeof *p);
}

/* cublasStatus_t's names (cublasLtGetStatusName needs the library loaded). */
static const char *lt_status_name(int s) {
    switch (s) {
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_MAPPING_ERROR: return "CUBLAS_STATUS_MAPPING_ERROR";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "CUBLAS_STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
    case CUBLAS_STATUS_LICENSE_ERROR: return "CUBLAS_STATUS_LICENSE_ERROR";
    default: return "unknown cublasStatus_t";
    }
}

kiln_status kiln_cublaslt_check_(int result, const char *call, const char *file, int line, kiln_error *err) {
    if (result == CUBLAS_STATUS_SUCCESS) return KILN_OK;
    return kiln_err(err, KILN_ERR_DEVICE, "%s:%d: %s failed: %s (cublasStatus_t %d)", file, line, call,
                    lt_status_name(result), result);
}

/* dlopen cuBLASLt and resolve KILN_LT_FUNCS into *api. */
static kiln_status lt_load(kiln_lt_api *api, kiln_error *err) {
    memset(api, 0, sizeof *api);
    api->lib = dlopen(KILN_CUBLASLT_SONAME, RTLD_NOW | RTLD_LOCAL);
    if (!api->lib) {
        char why[512];
        const char *e = dlerror();
        snprintf(why, sizeof why, "%s", e ? e : "?");
#ifdef KILN_CUBLASLT_BUILD_DIR
        api->lib = dlopen(KILN_CUBLASLT_BUILD_DIR "/" KILN_CUBLASLT_SONAME, RTLD_NOW | RTLD_LOCAL);
#endif
        if (!api->lib) {
            /* KILN_ERR_MISSING, not _DEVICE: device "auto" must not hide a missing library behind the CPU */
            kiln_err(err, KILN_ERR_MISSING, "cuBLASLt: cannot load %s, which the GPU executor needs: %s",
                     KILN_CUBLASLT_SONAME, why);
            return kiln_err_hint(err, "copy %s (redistributable, from the CUDA toolkit) beside the program or "
                                      "libkiln.so, or put its folder on LD_LIBRARY_PATH; --device cpu needs none",
                                 KILN_CUBLASLT_SONAME);
        }
    }
#define KILN_LT_LOAD_(fn)                                                                                         \
    if (!(*(void **)&api->fn = dlsym(api->lib, #fn))) {                                                          \
        dlclose(api->lib);                                                                                       \
        api->lib = NULL;                                                                                         \
        return kiln_err(err, KILN_ERR_MISSING, "cuBLASLt: %s has no symbol %s", KILN_CUBLASLT_SONAME, #fn);      \
    }
    KILN_LT_FUNCS(KILN_LT_LOAD_)
#undef KILN_LT_LOAD_
    return KILN_OK;
}

kiln_status kiln_cublaslt_create(kiln_cuda *cu, size_t workspace_bytes, kiln_cublaslt **out, kiln_error *err) {
    kiln_status st;
    *out = NULL;
    kiln_cublaslt *lt = calloc(1, sizeof *lt);
    if (!lt) return kiln_err(err, KILN_ERR_NOMEM, "cuBLASLt: out of host memory");
    lt->cu = cu;
    if ((st = lt_load(&lt->api, err))) goto fail;
    if ((st = KILN_CUBLASLT_CALL(err, lt->api.cublasLtCreate(&lt->handle)))) goto fail;
    if (workspace_bytes && (st = kiln_cuda_alloc(cu, workspace_bytes, &lt->workspace, err))) goto fail;
    lt->workspace_bytes = workspace_bytes;
    *out = lt;
    return KILN_OK;
fail:
    kiln_cublaslt_destroy(lt);
    return st;
}

void kiln_cublaslt_destroy(kiln_cublaslt *lt) {
    if (!lt) return;
    for (int i = 0; i < KILN_LT_PLANS; i++) plan_free(lt, &lt->plans[i]);
    for (int i = 0; i < 2; i++)
        if (lt->ev[i]) lt->cu->api.cuEventDestroy(lt->ev[i]);
    if (lt->workspace) kiln_cuda_release(lt->cu, lt->workspace);
    if (lt->handle) lt->api.cublasLtDestroy(lt->handle);
    if (lt->api.lib) dlclose(lt->api.lib);
    free(lt->rec.gemms);
    free(lt->rec_state);
    free(lt);
}

/* A preference that caps the workspace at ours; the caller destroys it. */
static kiln_status pref_make(const kiln_cublaslt *lt, cublasLtMatmulPreference_t *pref, kiln_error *err) {
    kiln_status st;
    *pref = NULL;
    if ((st = KILN_CUBLASLT_CALL(err, lt->api.cublasLtMatmulPreferenceCreate(pref)))) return st;
    return KILN_CUBLASLT_CALL(err, lt->api.cublasLtMatmulPreferenceSetAttribute(*pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                                        &lt->workspace_bytes,
                                                                        sizeof lt->workspace_bytes));
}

/* A GEMM's flags as the tuning section writes them (format/kiln_tuning.h). */
static uint32_t lt_flags(bool in_f32, bool out_f32, int fp8, bool accumulate) {
    return (in_f32 ? KILN_TUNING_IN_F32 : 0u) | (out_f32 ? KILN_TUNING_OUT_F32 : 0u) |
           (accumulate ? KILN_TUNING_ACCUMULATE : 0u) | (fp8 ? KILN_TUNING_FP8 : 0u) |
           (fp8 == KILN_LT_FP8_BLOCK128 ? KILN_TUNING_FP8_B128 : 0u) |
           (fp8 == KILN_LT_FP8_ROWS_FAST ? KILN_TUNING_FP8_FAST : 0u);
}

/* The plan of this shape: the cached one, or a new one (descriptors and the
 * heuristic's first algorithm) in a free or evictable slot. */
/* The scales of an FP8 plan's next runs: descriptor attributes, read when a GEMM is queued (or captured),
 * and needed (non-null) by the heuristic too. */
static kiln_status plan_scales(kiln_cublaslt *lt, const kiln_lt_plan *pl, CUdeviceptr x_scale, CUdeviceptr w_scale,
                               kiln_error *err) {
    const void *a = (const void *)(uintptr_t)w_scale, *b = (const void *)(uintptr_t)x_scale;
    kiln_status st;
    if ((st = KILN_CUBLASLT_CALL(err, lt->api.cublasLtMatmulDescSetAttribute(pl->op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER,
                                                                             &a, sizeof a))))
        return st;
    return KILN_CUBLASLT_CALL(err, lt->api.cublasLtMatmulDescSetAttribute(pl->op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER,
                                                                          &b, sizeof b));
}

/* fp8 (a kiln_lt_fp8, or 0): the plan of kiln_cublaslt_gemm_fp8, its scale pointers
 * x_scale and w_scale (0 otherwise). */
static kiln_status plan_get(kiln_cublaslt *lt, bool in_f32, bool out_f32, int fp8, int M, int N, int K,
                            bool accumulate, CUdeviceptr x_scale, CUdeviceptr w_scale, kiln_lt_plan **out,
                            kiln_error *err) {
    *out = NULL;
    if (M <= 0 || N <= 0 || K <= 0)
        return kiln_err(err, KILN_ERR_INVALID_ARG, "cuBLASLt GEMM: bad shape M=%d N=%d K=%d", M, N, K);
    for (int i = 0; i < KILN_LT_PLANS; i++) {
        kiln_lt_plan *c = &lt->plans[i];
        if (c->valid && c->M == M && c->N == N && c->K == K && c->accumulate == (int)accumulate &&
            c->in_f32 == (int)in_f32 && c->out_f32 == (int)out_f32 && c->fp8 == (int)fp8) {
            *out = c;
            return KILN_OK;
        }
    }
    kiln_lt_plan *pl = NULL;
    for (int i = 0; i < KILN_LT_PLANS && !pl; i++)
        if (!lt->plans[i].valid) pl = &lt->plans[i];
    while (!pl) { /* ends: at most KILN_LT_PINNED_MAX < KILN_LT_PLANS plans are tuned */
        kiln_lt_plan *c = &lt->plans[lt->next_victim];
        lt->next_victim = (lt->next_victim + 1) % KILN_LT_PLANS;
        if (!c->tuned) pl = c;
    }
    plan_free(lt, pl);
    kiln_status st;
    cublasLtMatmulPreference_t pref = NULL;
    cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    /* fp32 compute: strict fp32 for f32 data (no TF32), fp32 accumulation for bf16 */
    cudaDataType_t tin = fp8 ? CUDA_R_8F_E4M3 : in_f32 ? CUDA_R_32F : CUDA_R_16BF, tout = out_f32 ? CUDA_R_32F : CUDA_R_16BF;
    /* W8A8: cuBLASLt's FP8 GEMM ("TN", as every GEMM here) with an outer-vector scale each: W's per output
     * channel (op(A)'s N rows), x's per token (op(B)'s M columns); or (fp8g128) a scale per 128 of K for
     * each row of both, group-major ([K/128][N] and [K/128][M]: measured on the H200, cuBLASLt 130100);
     * the products are accumulated in fp32 */
    const int8_t fast = 1; /* FP8 fast accumulation: the tensor cores' partial sums never promoted to fp32 */
    const cublasLtMatmulMatrixScale_t vec =
        fp8 == KILN_LT_FP8_BLOCK128 ? CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F : CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F;
    if ((st = KILN_CUBLASLT_CALL(err, lt->api.cublasLtMatmulDescCreate(&pl->op, CUBLAS_COMPUTE_32F, CUDA_R_32F))) ||
        (fp8 && (st = KILN_CUBLASLT_CALL(err, lt->api.cublasLtMatmulDescSetAttribute(pl->op, CUBLASLT_MATMUL_DESC_A_SCALE_MODE,
                                                                                     &vec, sizeof vec)))) ||
        (fp8 && (st = KILN_CUBLASLT_CALL(err, lt->api.cublasLtMatmulDescSetAttribute(pl->op, CUBLASLT_MATMUL_DESC_B_SCALE_MODE,
                                                                                     &vec, sizeof vec)))) ||
        (fp8 == KILN_LT_FP8_ROWS_FAST &&
         (st = KILN_CUBLASLT_CALL(err, lt->api.cublasLtMatmulDescSetAttribute(pl->op, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fast,
                                                                              sizeof fast)))) ||
        (st = KILN_CUBLASLT_CALL(err, lt->api.cublasLtMatmulDescSetAttribute(pl->op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta))) ||
        (st = KILN_CUBLASLT_CALL(err, lt->api.cublasLtMatmulDescSetAttribute(pl->op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb))) ||
        (st = KILN_CUBLASLT_CALL(err, lt->api.cublasLtMatrixLayoutCreate(&pl->la, tin, (uint64_t)K, (uint64_t)N, K))) ||
        (st = KILN_CUBLASLT_CALL(err, lt->api.cublasLtMatrixLayoutCreate(&pl->lb, tin, (uint64_t)K, (uint64_t)M, K))) ||
        (st = KILN_CUBLASLT_CALL(err, lt->api.cublasLtMatrixLayoutCreate(&pl->lc, tout, (uint64_t)N, (uint64_t)M, N))) ||
        (st = pref_make(lt, &pref, err)) || (fp8 && (st = plan_scales(lt, pl, x_scale, w_scale, err))))
        goto out;
    /* the engine's recorded algorithm for this shape, if the library accepts it for these descriptors */
    const kiln_tuning_gemm *rg = lt->rec.n_gemms ? kiln_tuning_find(&lt->rec, M, N, K, lt_flags(in_f32, out_f32, fp8, accumulate)) : NULL;
    if (rg) {
        cublasLtMatmulAlgo_t a;
        cublasLtMatmulHeuristicResult_t chk;
        memcpy(&a, rg->algo, sizeof a);
        memset(&chk, 0, sizeof chk);
        kiln_error ig = {0};
        const size_t ri = (size_t)(rg - lt->rec.gemms);
        if (!KILN_CUBLASLT_CALL(&ig, lt->api.cublasLtMatmulAlgoCheck(lt->handle, pl->op, pl->la, pl->lb, pl->lc, pl->lc,
                                                                     &a, &chk)) &&
            chk.workspaceSize <= lt->workspace_bytes) {
            lt->rec_state[ri] |= 1;
            pl->algo = a;
            pl->recorded = 1;
            goto made;
        }
        lt->rec_state[ri] |= 2; /* stale for this library or shape: the heuristic's answer instead */
    }
    cublasLtMatmulHeuristicResult_t heur;
    int found = 0;
    if ((st = KILN_CUBLASLT_CALL(err, lt->api.cublasLtMatmulAlgoGetHeuristic(lt->handle, pl->op, pl->la, pl->lb, pl->lc, pl->lc,
                                                                     pref, 1, &heur, &found)))) {
        if (fp8) st = err->code = KILN_ERR_UNSUPPORTED; /* this library or GPU has no W8A8 for the shape */
        goto out;
    }
    if (found < 1) {
        st = kiln_err(err, KILN_ERR_UNSUPPORTED, "cuBLASLt: no algorithm for %s GEMM M=%d N=%d K=%d",
                      fp8 == KILN_LT_FP8_BLOCK128 ? "FP8 (W8A8, 128-column scales)" : fp8 == KILN_LT_FP8_ROWS_FAST ? "FP8 (W8A8, fast accumulation)" : fp8 ? "FP8 (W8A8)" : in_f32 ? "f32" : "bf16", M, N,
                      K);
        goto out;
    }
    pl->algo = heur.algo;
made:
    pl->M = M, pl->N = N, pl->K = K, pl->accumulate = accumulate, pl->in_f32 = in_f32, pl->out_f32 = out_f32;
    pl->fp8 = fp8;
    pl->valid = 1;
    *out = pl;
out:
    if (pref) lt->api.cublasLtMatmulPreferenceDestroy(pref);
    if (st) plan_free(lt, pl);
    return st;
}

/* One GEMM of plan `pl` with algorithm `algo`, queued on `stream`. */
static kiln_status plan_run(kiln_cublaslt *lt, const kiln_lt_plan *pl, const cublasLtMatmulAlgo_t *algo, CUdeviceptr x,
                            CUdeviceptr w, CUdeviceptr y, CUstream stream, kiln_error *err) {
    float alpha = 1.0f, beta = pl->accumulate ? 1.0f : 0.0f;
    return KILN_CUBLASLT_CALL(err, lt->api.cublasLtMatmul(lt->handle, pl->op, &alpha, (const void *)(uintptr_t)w, pl->la,
                                                  (const void *)(uintptr_t)x, pl->lb, &beta,
                                                  (const void *)(uintptr_t)y, pl->lc, (void *)(uintptr_t)y, pl->lc,
                                                  algo, (void *)(uintptr_t)lt->workspace, lt->workspace_bytes,
                                                  (cudaStream_t)stream));
}

kiln_status kiln_cublaslt_gemm_ex(kiln_cublaslt *lt, bool in_f32, bool out_f32, int M, int N, int K, CUdeviceptr x,
                                  CUdeviceptr w, CUdeviceptr y, bool accumulate, CUstream stream, kiln_error *err) {
    kiln_lt_plan *pl = NULL;
    kiln_status st = plan_get(lt, in_f32, out_f32, 0, M, N, K, accumulate, 0, 0, &pl, err);
    if (st) return st;
    if ((st = plan_run(lt, pl, &pl->algo, x, w, y, stream, err))) kiln_err_prefix(err, "GEMM M=%d N=%d K=%d: ", M, N, K);
    return st;
}

kiln_status kiln_cublaslt_gemm_fp8(kiln_cublaslt *lt, bool out_f32, kiln_lt_fp8 mode, int M, int N, int K, CUdeviceptr x,
                                   CUdeviceptr x_scale, CUdeviceptr w, CUdeviceptr w_scale, CUdeviceptr y,
                                   bool accumulate, CUstream stream, kiln_error *err) {
    kiln_lt_plan *pl = NULL;
    kiln_status st = plan_get(lt, false, out_f32, (int)mode, M, N, K, accumulate, x_scale, w_scale, &pl, err);
    if (st) return st;
    if ((st = plan_scales(lt, pl, x_scale, w_scale, err)) || (st = plan_run(lt, pl, &pl->algo, x, w, y, stream, err)))
        kiln_err_prefix(err, "FP8 GEMM M=%d N=%d K=%d: ", M, N, K);
    return st;
}

kiln_status kiln_cublaslt_gemm_bf16(kiln_cublaslt *lt, int M, int N, int K, CUdeviceptr x, CUdeviceptr w,
                                    CUdeviceptr y, bool accumulate, CUstream stream, kiln_error *err) {
    return kiln_cublaslt_gemm_ex(lt, false, false, M, N, K, x, w, y, accumulate, stream, err);
}

/* ---- tuning ---- */

/* One algorithm configuration attribute (4 or 2 bytes wide), -1 when unreadable. */
static long algo_cfg(const kiln_cublaslt *lt, const cublasLtMatmulAlgo_t *a, cublasLtMatmulAlgoConfigAttributes_t at,
                     size_t size) {
    kiln_error ig = {0};
    size_t got = 0;
    if (size == 2) {
        uint16_t v = 0;
        return KILN_CUBLASLT_CALL(&ig, lt->api.cublasLtMatmulAlgoConfigGetAttribute(a, at, &v, sizeof v, &got)) ? -1 : (long)v;
    }
    int32_t v = 0;
    return KILN_CUBLASLT_CALL(&ig, lt->api.cublasLtMatmulAlgoConfigGetAttribute(a, at, &v, sizeof v, &got)) ? -1 : (long)v;
}

/* "algo 66 tile 20 stages 31 splitK 1 ...": the numbers are cublasLt.h's enums
 * (cublasLtMatmulTile_t, cublasLtMatmulStages_t, cublasLtReductionScheme_t, cublasLtClusterShape_t). */
static void algo_str(const kiln_cublaslt *lt, const cublasLtMatmulAlgo_t *a, char *buf, size_t n) {
    snprintf(buf, n, "algo %ld tile %ld stages %ld splitK %ld reduction %ld swizzle %ld custom %ld inner %ld cluster %ld",
             algo_cfg(lt, a, CUBLASLT_ALGO_CONFIG_ID, 4), algo_cfg(lt, a, CUBLASLT_ALGO_CONFIG_TILE_ID, 4),
             algo_cfg(lt, a, CUBLASLT_ALGO_CONFIG_STAGES_ID, 4), algo_cfg(lt, a, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, 4),
             algo_cfg(lt, a, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, 4),
             algo_cfg(lt, a, CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING, 4), algo_cfg(lt, a, CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION, 4),
             algo_cfg(lt, a, CUBLASLT_ALGO_CONFIG_INNER_SHAPE_ID, 2),
             algo_cfg(lt, a, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID, 2));
}

/* Microseconds per GEMM of `algo` on plan `pl` (protocol at the top of the file). */
static kiln_status time_algo(kiln_cublaslt *lt, const kiln_lt_plan *pl, const cublasLtMatmulAlgo_t *algo,
                             const CUdeviceptr *w, int n_w, CUdeviceptr x, CUdeviceptr y, CUstream stream, float *us,
                             kiln_error *err) {
    kiln_cuda *cu = lt->cu;
    CUgraph g = NULL;
    CUgraphExec ge = NULL;
    float ms = 0;
    kiln_status st;
    if ((st = plan_run(lt, pl, algo, x, w[0], y, stream, err))) return st;
    if ((st = KILN_CU_CALL(cu, err, cu->api.cuStreamBeginCapture(stream, CU_STREAM_CAPTURE_MODE_RELAXED)))) return st;
    for (int r = 0; r < KILN_LT_TUNE_RUNS && !st; r++) st = plan_run(lt, pl, algo, x, w[r % n_w], y, stream, err);
    kiln_error end_err = {0}; /* the capture must end whatever happened in it; the first error is the one kept */
    kiln_status est = KILN_CU_CALL(cu, &end_err, cu->api.cuStreamEndCapture(stream, &g));
    if (!st && est) {
        *err = end_err;
        st = est;
    }
    if (st) goto out;
    if ((st = KILN_CU_CALL(cu, err, cu->api.cuGraphInstantiate(&ge, g, 0))) ||
        (st = KILN_CU_CALL(cu, err, cu->api.cuGraphLaunch(ge, stream))) ||
        (st = KILN_CU_CALL(cu, err, cu->api.cuEventRecord(lt->ev[0], stream))) ||
        (st = KILN_CU_CALL(cu, err, cu->api.cuGraphLaunch(ge, stream))) ||
        (st = KILN_CU_CALL(cu, err, cu->api.cuEventRecord(lt->ev[1], stream))) ||
        (st = KILN_CU_CALL(cu, err, cu->api.cuEventSynchronize(lt->ev[1]))) ||
        (st = KILN_CU_CALL(cu, err, cu->api.cuEventElapsedTime(&ms, lt->ev[0], lt->ev[1]))))
        goto out;
    *us = ms * 1000.0f / KILN_LT_TUNE_RUNS;
out:
    if (ge) cu->api.cuGraphExecDestroy(ge);
    if (g) cu->api.cuGraphDestroy(g);
    return st;
}

/* Append variant `a` of plan `pl`'s algorithm at out[*n] (the caller keeps *n < cap) when
 * cublasLtMatmulAlgoCheck accepts it within the workspace; whether it did. */
static bool variant_add(kiln_cublaslt *lt, const kiln_lt_plan *pl, const cublasLtMatmulAlgo_t *a,
                        cublasLtMatmulHeuristicResult_t *out, int *n) {
    cublasLtMatmulHeuristicResult_t r;
    memset(&r, 0, sizeof r);
    kiln_error ig = {0};
    if (KILN_CUBLASLT_CALL(&ig, lt->api.cublasLtMatmulAlgoCheck(lt->handle, pl->op, pl->la, pl->lb, pl->lc, pl->lc, a, &r)) ||
        r.state != CUBLAS_STATUS_SUCCESS || r.workspaceSize > lt->workspace_bytes)
        return false;
    r.algo = *a;
    out[(*n)++] = r;
    return true;
}

static const int lt_splits[] = {2, 3, 4, 5, 6, 8, 12, 16}; /* split-K counts a variant may take */
#define KILN_LT_SPLITS ((int)(sizeof lt_splits / sizeof lt_splits[0]))

/* Up to KILN_LT_SPLITS split-K variants of `base` (whose tiles make `waves` waves of the GPU) on plan
 * `pl`, appended at out[*n..cap): those with at most KILN_LT_SPLIT_WAVES waves and 64 columns of K a
 * split, whose partial sums the library reduces in fp32 (see the top of the file), and that
 * cublasLtMatmulAlgoCheck accepts within the workspace. */
static void split_variants(kiln_cublaslt *lt, const kiln_lt_plan *pl, const cublasLtMatmulAlgo_t *base, float waves,
                           cublasLtMatmulHeuristicResult_t *out, int *n, int cap) {
    int32_t can = 0;
    uint32_t mask = 0;
    size_t got = 0;
    kiln_error ig = {0};
    if (KILN_CUBLASLT_CALL(&ig, lt->api.cublasLtMatmulAlgoCapGetAttribute(base, CUBLASLT_ALGO_CAP_SPLITK_SUPPORT, &can,
                                                                          sizeof can, &got)) ||
        !can ||
        KILN_CUBLASLT_CALL(&ig, lt->api.cublasLtMatmulAlgoCapGetAttribute(base, CUBLASLT_ALGO_CAP_REDUCTION_SCHEME_MASK,
                                                                          &mask, sizeof mask, &got)) ||
        !(mask & CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE) || !(waves > 0))
        return;
    const uint32_t red = CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;
    for (int i = 0; i < KILN_LT_SPLITS && *n < cap; i++) {
        const int32_t sk = lt_splits[i];
        if (waves * (float)sk > KILN_LT_SPLIT_WAVES || pl->K / sk < 64) break;
        cublasLtMatmulAlgo_t a = *base;
        if (!KILN_CUBLASLT_CALL(&ig, lt->api.cublasLtMatmulAlgoConfigSetAttribute(&a, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &sk,
                                                                                  sizeof sk)) &&
            !KILN_CUBLASLT_CALL(&ig, lt->api.cublasLtMatmulAlgoConfigSetAttribute(&a, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME,
                                                                                  &red, sizeof red)))
            variant_add(lt, pl, &a, out, n);
    }
}

/* Up to KILN_LT_TILE_MAX variants of `base` (whose tiles make `waves` waves of the GPU: only under one)
 * with another of the tiles its algorithm offers (CUBLASLT_ALGO_CAP_TILE_IDS), the rest of its
 * configuration kept, that cublasLtMatmulAlgoCheck accepts for plan `pl` within the workspace; appended
 * at out[*n..cap). */
static void tile_variants(kiln_cublaslt *lt, const kiln_lt_plan *pl, const cublasLtMatmulAlgo_t *base, float waves,
                          cublasLtMatmulHeuristicResult_t *out, int *n, int cap) {
    size_t need = 0, got = 0;
    kiln_error ig = {0};
    if (!(waves > 0) || waves > 1.0f ||
        KILN_CUBLASLT_CALL(&ig, lt->api.cublasLtMatmulAlgoCapGetAttribute(base, CUBLASLT_ALGO_CAP_TILE_IDS, NULL, 0, &need)) ||
        need < sizeof(uint32_t))
        return;
    uint32_t *tiles = malloc(need);
    if (!tiles) return;
    const long own = algo_cfg(lt, base, CUBLASLT_ALGO_CONFIG_TILE_ID, 4);
    if (!KILN_CUBLASLT_CALL(&ig, lt->api.cublasLtMatmulAlgoCapGetAttribute(base, CUBLASLT_ALGO_CAP_TILE_IDS, tiles, need,
                                                                           &got)))
        for (size_t i = 0, added = 0; i < got / sizeof *tiles && added < KILN_LT_TILE_MAX && *n < cap; i++) {
            if (tiles[i] == CUBLASLT_MATMUL_TILE_UNDEFINED || (long)tiles[i] == own) continue;
            cublasLtMatmulAlgo_t a = *base;
            if (!KILN_CUBLASLT_CALL(&ig, lt->api.cublasLtMatmulAlgoConfigSetAttribute(&a, CUBLASLT_ALGO_CONFIG_TILE_ID,
                                                                                      &tiles[i], sizeof tiles[i])) &&
                variant_add(lt, pl, &a, out, n))
                added++;
        }
    free(tiles);
}

/* The indices of the k fastest of candidates 0..n-1 that ran (us > 0), fastest first, into order;
 * returns how many there are (at most k). */
static int fastest_timed(const float *us, int n, int k, int *order) {
    int m = 0;
    while (m < k) {
        int f = -1;
        for (int j = 0; j < n; j++) {
            bool taken = false;
            for (int q = 0; q < m; q++) taken |= order[q] == j;
            if (!taken && us[j] > 0 && (f < 0 || us[j] < us[f])) f = j;
        }
        if (f < 0) break;
        order[m++] = f;
    }
    return m;
}

/* kiln_cublaslt_tune and _tune_fp8: fp8 with the scale pointers its runs are timed with. */
static kiln_status tune_shape(kiln_cublaslt *lt, bool in_f32, bool out_f32, int fp8, int M, int N, int K,
                              bool accumulate, const CUdeviceptr *w, int n_w, CUdeviceptr x, CUdeviceptr x_scale,
                              CUdeviceptr w_scale, CUdeviceptr y, CUstream stream, FILE *log, kiln_error *err) {
    if (n_w < 1 || !w)
        return kiln_err(err, KILN_ERR_INVALID_ARG, "cuBLASLt tuning: no weight to time M=%d N=%d K=%d on", M, N, K);
    kiln_lt_plan *pl = NULL;
    kiln_status st = plan_get(lt, in_f32, out_f32, fp8, M, N, K, accumulate, x_scale, w_scale, &pl, err);
    if (!st && fp8) st = plan_scales(lt, pl, x_scale, w_scale, err); /* a plan made before has others */
    if (st) return kiln_err_prefix(err, "cuBLASLt tuning M=%d N=%d K=%d: ", M, N, K);
    if (pl->tuned) return KILN_OK;
    char shape[96];
    snprintf(shape, sizeof shape, "%s M=%d N=%d K=%d %s-out%s", fp8 == KILN_LT_FP8_BLOCK128 ? "fp8g128" : fp8 == KILN_LT_FP8_ROWS_FAST ? "fp8-fast" : fp8 ? "fp8" : in_f32 ? "f32" : "bf16", M, N, K,
             out_f32 ? "f32" : "bf16", accumulate ? " accumulate" : "");
    if (pl->recorded && lt->n_pinned < KILN_LT_PINNED_MAX) { /* the engine's record decides: no timing */
        pl->tuned = 1;
        lt->n_pinned++;
        if (log) fprintf(log, "kiln lt-tune: %s: the engine's recorded algorithm\n", shape);
        return KILN_OK;
    }
    if (lt->n_pinned >= KILN_LT_PINNED_MAX) {
        if (log) fprintf(log, "kiln lt-tune: %s: not tuned, %d shapes are already\n", shape, lt->n_pinned);
        return KILN_OK;
    }
    pl->tuned = 1; /* from here on the plan stays, tuned or with the heuristic's first answer */
    lt->n_pinned++;

    cublasLtMatmulPreference_t pref = NULL;
    enum { CAP = KILN_LT_CANDIDATES + KILN_LT_TILE_MAX + KILN_LT_SPLIT_BASES * KILN_LT_SPLITS };
    cublasLtMatmulHeuristicResult_t cand[CAP];
    float us[CAP];
    int found = 0, best = -1;
    kiln_error why = {0}; /* a failure here is not the caller's: the heuristic's first answer stays */
    if (pref_make(lt, &pref, &why) ||
        KILN_CUBLASLT_CALL(&why, lt->api.cublasLtMatmulAlgoGetHeuristic(lt->handle, pl->op, pl->la, pl->lb, pl->lc, pl->lc, pref,
                                                                KILN_LT_CANDIDATES, cand, &found)))
        found = 0;
    else if (found == 0)
        kiln_err(&why, KILN_ERR_UNSUPPORTED, "the heuristic gave no algorithm");
    if (pref) lt->api.cublasLtMatmulPreferenceDestroy(pref);
    for (int i = 0; i < 2 && found > 0; i++)
        if (!lt->ev[i] && KILN_CU_CALL(lt->cu, &why, lt->cu->api.cuEventCreate(&lt->ev[i], CU_EVENT_DEFAULT))) found = 0;
    if (found == 0) {
        if (log) fprintf(log, "kiln lt-tune: %s: not tuned, the heuristic's first answer stays: %s\n", shape, why.msg);
        return KILN_OK;
    }
    double t0 = kiln_now();
    if (log) fprintf(log, "kiln lt-tune: %s: timing %d candidates over %d weights\n", shape, found, n_w);
    /* phase 0: the heuristic's answers; 1: other tiles of the fastest of them; 2: split-K variants of
     * the two fastest so far. A phase's candidates are made once the ones before it are timed. */
    int phase = 0;
    for (int i = 0;; i++) {
        while (i == found && phase < 2 && lt->search) {
            const int before = found;
            phase++;
            int order[KILN_LT_SPLIT_BASES];
            const int n_order = fastest_timed(us, before, phase == 1 ? 1 : KILN_LT_SPLIT_BASES, order);
            for (int b = 0; b < n_order; b++) {
                const cublasLtMatmulHeuristicResult_t base = cand[order[b]];
                if (phase == 1) tile_variants(lt, pl, &base.algo, base.wavesCount, cand, &found, CAP);
                else split_variants(lt, pl, &base.algo, base.wavesCount, cand, &found, CAP);
            }
            if (log && found > before)
                fprintf(log, "kiln lt-tune: %s: timing %d %s variants\n", shape, found - before,
                        phase == 1 ? "tile" : "split-K");
        }
        if (i >= found) break;
        us[i] = -1;
        char desc[192] = "";
        if (log) algo_str(lt, &cand[i].algo, desc, sizeof desc);
        if (cand[i].state != CUBLAS_STATUS_SUCCESS || cand[i].workspaceSize > lt->workspace_bytes) {
            if (log) fprintf(log, "  #%-2d %s: skipped (state %d, workspace %zu bytes)\n", i, desc, (int)cand[i].state,
                             cand[i].workspaceSize);
            continue;
        }
        kiln_error e = {0};
        if (time_algo(lt, pl, &cand[i].algo, w, n_w, x, y, stream, &us[i], &e)) {
            us[i] = -1;
            if (log) fprintf(log, "  #%-2d %s: failed: %s\n", i, desc, e.msg);
            continue;
        }
        if (log) fprintf(log, "  #%-2d %s, workspace %zu KiB, waves %.2f: %.2f us\n", i, desc,
                         cand[i].workspaceSize >> 10, (double)cand[i].wavesCount, (double)us[i]);
        if (best < 0 || us[i] < us[best]) best = i;
    }
    if (best >= 0) {
        pl->algo = cand[best].algo;
        pl->us = us[best];
        pl->heur_us = us[0] > 0 ? us[0] : -1.0f;
        pl->n_cand = found;
        pl->pick = best;
    }
    if (log) {
        if (best < 0)
            fprintf(log, "kiln lt-tune: %s: no candidate of %d ran, the heuristic's first answer stays\n", shape, found);
        else if (us[0] > 0)
            fprintf(log, "kiln lt-tune: %s: picked #%d of %d, %.2f us (heuristic's first %.2f us, %+.1f%%), in %.1f ms\n",
                    shape, best, found, (double)us[best], (double)us[0], 100.0 * (us[best] - us[0]) / us[0],
                    (kiln_now() - t0) * 1e3);
        else
            fprintf(log, "kiln lt-tune: %s: picked #%d of %d, %.2f us (the heuristic's first did not run), in %.1f ms\n",
                    shape, best, found, (double)us[best], (kiln_now() - t0) * 1e3);
    }
    return KILN_OK;
}

void kiln_cublaslt_set_search(kiln_cublaslt *lt, bool on) { lt->search = on; }

kiln_status kiln_cublaslt_tune(kiln_cublaslt *lt, bool in_f32, bool out_f32, int M, int N, int K, bool accumulate,
                               const CUdeviceptr *w, int n_w, CUdeviceptr x, CUdeviceptr y, CUstream stream, FILE *log,
                               kiln_error *err) {
    return tune_shape(lt, in_f32, out_f32, 0, M, N, K, accumulate, w, n_w, x, 0, 0, y, stream, log, err);
}

kiln_status kiln_cublaslt_tune_fp8(kiln_cublaslt *lt, bool out_f32, kiln_lt_fp8 mode, int M, int N, int K, bool accumulate,
                                   const CUdeviceptr *w, int n_w, CUdeviceptr x, CUdeviceptr x_scale,
                                   CUdeviceptr w_scale, CUdeviceptr y, CUstream stream, FILE *log, kiln_error *err) {
    return tune_shape(lt, false, out_f32, (int)mode, M, N, K, accumulate, w, n_w, x, x_scale, w_scale, y, stream,
                      log, err);
}

/* ---- the engine's tuning record ---- */

size_t kiln_cublaslt_version(const kiln_cublaslt *lt) { return lt->api.cublasLtGetVersion(); }

kiln_status kiln_cublaslt_use_recorded(kiln_cublaslt *lt, const kiln_tuning_record *r, kiln_error *err) {
    free(lt->rec.gemms);
    free(lt->rec_state);
    memset(&lt->rec, 0, sizeof lt->rec);
    lt->rec_state = NULL;
    if (!r || !r->n_gemms) return KILN_OK;
    lt->rec = *r;
    lt->rec.gemms = malloc((size_t)r->n_gemms * sizeof *r->gemms);
    lt->rec_state = calloc(r->n_gemms, 1);
    if (!lt->rec.gemms || !lt->rec_state) {
        free(lt->rec.gemms);
        free(lt->rec_state);
        memset(&lt->rec, 0, sizeof lt->rec);
        lt->rec_state = NULL;
        return kiln_err(err, KILN_ERR_NOMEM, "cuBLASLt: out of memory for %u recorded algorithms", r->n_gemms);
    }
    memcpy(lt->rec.gemms, r->gemms, (size_t)r->n_gemms * sizeof *r->gemms);
    return KILN_OK;
}

void kiln_cublaslt_recorded_counts(const kiln_cublaslt *lt, int *used, int *refused) {
    *used = *refused = 0;
    for (uint32_t i = 0; i < lt->rec.n_gemms; i++) {
        if (lt->rec_state[i] & 1) (*used)++;
        if (lt->rec_state[i] & 2) (*refused)++;
    }
}

int kiln_cublaslt_export(const kiln_cublaslt *lt, kiln_tuning_gemm *out, int cap) {
    int n = 0;
    for (int i = 0; i < KILN_LT_PLANS; i++) {
        const kiln_lt_plan *p = &lt->plans[i];
        if (!p->valid || !p->tuned || !(p->us > 0)) continue;
        if (n < cap) {
            kiln_tuning_gemm *g = &out[n];
            memset(g, 0, sizeof *g);
            g->m = (uint32_t)p->M, g->n = (uint32_t)p->N, g->k = (uint32_t)p->K;
            g->flags = lt_flags(p->in_f32, p->out_f32, p->fp8, p->accumulate);
            g->us = p->us, g->heuristic_us = p->heur_us;
            g->candidates = (uint32_t)p->n_cand, g->pick = (uint32_t)p->pick;
            _Static_assert(sizeof p->algo == KILN_TUNING_ALGO_SIZE, "cublasLtMatmulAlgo_t is 64 bytes");
            memcpy(g->algo, &p->algo, KILN_TUNING_ALGO_SIZE);
        }
        n++;
    }
    return n;
}

void kiln_cublaslt_algo_str(const kiln_cublaslt *lt, const uint8_t algo[KILN_TUNING_ALGO_SIZE], char *buf, size_t n) {
    cublasLtMatmulAlgo_t a;
    memcpy(&a, algo, sizeof a);
    algo_str(lt, &a, buf, n);
}
