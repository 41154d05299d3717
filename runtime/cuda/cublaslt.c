/*
 * cublaslt.c — dense bf16 GEMMs through cuBLASLt (prefill projections, and
 * the baseline the decode GEMV is measured against). Contracts in
 * runtime/kiln_cuda.h.
 *
 * Layout: kiln keeps HuggingFace's row-major weight [N=out, K=in] and
 * activations [M, K]. cuBLASLt is column-major, so y[M,N] = x·W^T is asked
 * for as the column-major product C[N,M] = A^T · B with A = W seen as K×N
 * (lda = K), B = x seen as K×M (ldb = K), C = y seen as N×M (ldc = N).
 */
#include "runtime/kiln_cuda.h"

#include <cublasLt.h>
#include <stdlib.h>
#include <string.h>

/* Plans (descriptors + the heuristic's algorithm) of recent shapes are
 * kept, so a repeated GEMM (every layer of a model has the same few shapes)
 * skips descriptor setup and the heuristic query. A small table, replaced
 * round-robin when full. */
#define KILN_LT_PLANS 48

typedef struct kiln_lt_plan {
    int M, N, K, accumulate, valid, in_f32, out_f32;
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t la, lb, lc;
    cublasLtMatmulAlgo_t algo;
} kiln_lt_plan;

struct kiln_cublaslt {
    kiln_cuda *cu;
    cublasLtHandle_t handle;
    CUdeviceptr workspace;
    size_t workspace_bytes;
    kiln_lt_plan plans[KILN_LT_PLANS];
    int next_victim;
};

static void plan_free(kiln_lt_plan *p) {
    if (p->lc) cublasLtMatrixLayoutDestroy(p->lc);
    if (p->lb) cublasLtMatrixLayoutDestroy(p->lb);
    if (p->la) cublasLtMatrixLayoutDestroy(p->la);
    if (p->op) cublasLtMatmulDescDestroy(p->op);
    memset(p, 0, sizeof *p);
}

kiln_status kiln_cublaslt_check_(int result, const char *call, const char *file, int line, kiln_error *err) {
    if (result == CUBLAS_STATUS_SUCCESS) return KILN_OK;
    return kiln_err(err, KILN_ERR_DEVICE, "%s:%d: %s failed: %s (cublasStatus_t %d)", file, line, call,
                    cublasLtGetStatusName((cublasStatus_t)result), result);
}

kiln_status kiln_cublaslt_create(kiln_cuda *cu, size_t workspace_bytes, kiln_cublaslt **out, kiln_error *err) {
    kiln_status st;
    *out = NULL;
    kiln_cublaslt *lt = calloc(1, sizeof *lt);
    if (!lt) return kiln_err(err, KILN_ERR_NOMEM, "cuBLASLt: out of host memory");
    lt->cu = cu;
    if ((st = KILN_CUBLASLT_CALL(err, cublasLtCreate(&lt->handle)))) goto fail;
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
    for (int i = 0; i < KILN_LT_PLANS; i++) plan_free(&lt->plans[i]);
    if (lt->workspace) kiln_cuda_release(lt->cu, lt->workspace);
    if (lt->handle) cublasLtDestroy(lt->handle);
    free(lt);
}

kiln_status kiln_cublaslt_gemm_ex(kiln_cublaslt *lt, bool in_f32, bool out_f32, int M, int N, int K, CUdeviceptr x,
                                  CUdeviceptr w, CUdeviceptr y, bool accumulate, CUstream stream, kiln_error *err) {
    kiln_status st = KILN_OK;
    cublasLtMatmulPreference_t pref = NULL;
    if (M <= 0 || N <= 0 || K <= 0)
        return kiln_err(err, KILN_ERR_INVALID_ARG, "cuBLASLt GEMM: bad shape M=%d N=%d K=%d", M, N, K);
    kiln_lt_plan *pl = NULL;
    for (int i = 0; i < KILN_LT_PLANS && !pl; i++) {
        kiln_lt_plan *c = &lt->plans[i];
        if (c->valid && c->M == M && c->N == N && c->K == K && c->accumulate == (int)accumulate &&
            c->in_f32 == (int)in_f32 && c->out_f32 == (int)out_f32)
            pl = c;
    }
    if (!pl) {
        for (int i = 0; i < KILN_LT_PLANS && !pl; i++)
            if (!lt->plans[i].valid) pl = &lt->plans[i];
        if (!pl) {
            pl = &lt->plans[lt->next_victim];
            lt->next_victim = (lt->next_victim + 1) % KILN_LT_PLANS;
        }
        plan_free(pl);
        cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
        /* fp32 compute: strict fp32 for f32 data (no TF32), fp32 accumulation for bf16 */
        cudaDataType_t tin = in_f32 ? CUDA_R_32F : CUDA_R_16BF, tout = out_f32 ? CUDA_R_32F : CUDA_R_16BF;
        if ((st = KILN_CUBLASLT_CALL(err, cublasLtMatmulDescCreate(&pl->op, CUBLAS_COMPUTE_32F, CUDA_R_32F))) ||
            (st = KILN_CUBLASLT_CALL(err, cublasLtMatmulDescSetAttribute(pl->op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta))) ||
            (st = KILN_CUBLASLT_CALL(err, cublasLtMatmulDescSetAttribute(pl->op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb))) ||
            (st = KILN_CUBLASLT_CALL(err, cublasLtMatrixLayoutCreate(&pl->la, tin, (uint64_t)K, (uint64_t)N, K))) ||
            (st = KILN_CUBLASLT_CALL(err, cublasLtMatrixLayoutCreate(&pl->lb, tin, (uint64_t)K, (uint64_t)M, K))) ||
            (st = KILN_CUBLASLT_CALL(err, cublasLtMatrixLayoutCreate(&pl->lc, tout, (uint64_t)N, (uint64_t)M, N))) ||
            (st = KILN_CUBLASLT_CALL(err, cublasLtMatmulPreferenceCreate(&pref))) ||
            (st = KILN_CUBLASLT_CALL(err, cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                                              &lt->workspace_bytes, sizeof lt->workspace_bytes))))
            goto out;
        cublasLtMatmulHeuristicResult_t heur;
        int found = 0;
        if ((st = KILN_CUBLASLT_CALL(err, cublasLtMatmulAlgoGetHeuristic(lt->handle, pl->op, pl->la, pl->lb, pl->lc, pl->lc,
                                                                         pref, 1, &heur, &found))))
            goto out;
        if (found < 1) {
            st = kiln_err(err, KILN_ERR_UNSUPPORTED, "cuBLASLt: no algorithm for %s GEMM M=%d N=%d K=%d",
                          in_f32 ? "f32" : "bf16", M, N, K);
            goto out;
        }
        pl->algo = heur.algo;
        pl->M = M, pl->N = N, pl->K = K, pl->accumulate = accumulate, pl->in_f32 = in_f32, pl->out_f32 = out_f32;
        pl->valid = 1;
    }
    float alpha = 1.0f, beta = accumulate ? 1.0f : 0.0f;
    st = KILN_CUBLASLT_CALL(err, cublasLtMatmul(lt->handle, pl->op, &alpha, (const void *)(uintptr_t)w, pl->la,
                                                (const void *)(uintptr_t)x, pl->lb, &beta, (const void *)(uintptr_t)y, pl->lc,
                                                (void *)(uintptr_t)y, pl->lc, &pl->algo,
                                                (void *)(uintptr_t)lt->workspace, lt->workspace_bytes,
                                                (cudaStream_t)stream));
    if (st) kiln_err_prefix(err, "GEMM M=%d N=%d K=%d: ", M, N, K);
out:
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    if (st && pl && !pl->valid) plan_free(pl);
    return st;
}

kiln_status kiln_cublaslt_gemm_bf16(kiln_cublaslt *lt, int M, int N, int K, CUdeviceptr x, CUdeviceptr w,
                                    CUdeviceptr y, bool accumulate, CUstream stream, kiln_error *err) {
    return kiln_cublaslt_gemm_ex(lt, false, false, M, N, K, x, w, y, accumulate, stream, err);
}
