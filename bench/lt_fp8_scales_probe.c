/*
 * lt_fp8_scales_probe.c — which scale layout cuBLASLt's FP8 GEMM reads with VEC128_32F (a scale per 128
 * of K) on both operands, in kiln's "TN" form (A = W [N, K] seen as K x N with op T, B = x [M, K] seen
 * as K x M): runs one GEMM with random E4M3 codes and scales and compares it, in double, against the
 * four index orders ([n][g] or [g][n] for A, [m][g] or [g][m] for B). On the H200 with cuBLASLt
 * 130100 only [g][n] x [g][m] matched (relative error 2e-4; the others 0.5-0.7), for K = 256, 320 and
 * 4096 at M = 64: what runtime/cuda/cublaslt.c and kiln_act_fp8g assume. Rerun it after a cuBLASLt
 * update. Not part of the build (it links cuBLASLt and the CUDA runtime directly):
 *   gcc -O2 -o lt_fp8_scales_probe bench/lt_fp8_scales_probe.c -I/usr/local/cuda/include \
 *       -L/usr/local/cuda/lib64 -lcublasLt -lcudart -lm && ./lt_fp8_scales_probe
 */
#include <cublasLt.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
static float e4m3(uint8_t c) {
    int e = (c >> 3) & 15, m = c & 7;
    float v = e ? ldexpf(8 + m, e - 10) : ldexpf(m, -9);
    return c & 0x80 ? -v : v;
}
int main(void) {
    cublasLtHandle_t h;
    cublasLtCreate(&h);
    const int Ks[] = {256, 320, 4096};
    for (int ki = 0; ki < 3; ki++) {
        int M = 64, N = 256, K = Ks[ki], G = (K + 127) / 128;
        uint8_t *a = malloc((size_t)N * K), *b = malloc((size_t)M * K);
        float *sa = malloc(sizeof(float) * N * G), *sb = malloc(sizeof(float) * M * G);
        srand(1);
        for (int i = 0; i < N * K; i++) { uint8_t c = rand() & 0xFF; if ((c & 0x7F) == 0x7F) c = 0x38; a[i] = c; }
        for (int i = 0; i < M * K; i++) { uint8_t c = rand() & 0xFF; if ((c & 0x7F) == 0x7F) c = 0x38; b[i] = c; }
        for (int i = 0; i < N * G; i++) sa[i] = 0.5f + (rand() % 1000) / 500.0f;
        for (int i = 0; i < M * G; i++) sb[i] = 0.5f + (rand() % 1000) / 500.0f;
        void *da, *db, *dsa, *dsb, *dc, *ws;
        cudaMalloc(&da, N * K); cudaMalloc(&db, M * K); cudaMalloc(&dsa, 4 * N * G + 1024); cudaMalloc(&dsb, 4 * M * G + 1024);
        cudaMalloc(&dc, 4 * M * N); cudaMalloc(&ws, 32 << 20);
        cudaMemcpy(da, a, N * K, cudaMemcpyHostToDevice); cudaMemcpy(db, b, M * K, cudaMemcpyHostToDevice);
        cudaMemcpy(dsa, sa, 4 * N * G, cudaMemcpyHostToDevice); cudaMemcpy(dsb, sb, 4 * M * G, cudaMemcpyHostToDevice);
        cublasLtMatmulDesc_t op;
        cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F);
        cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
        cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta);
        cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb);
        int mode = CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
        cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &mode, sizeof mode);
        cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &mode, sizeof mode);
        cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &dsa, sizeof dsa);
        cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &dsb, sizeof dsb);
        cublasLtMatrixLayout_t la, lb, lc;
        cublasLtMatrixLayoutCreate(&la, CUDA_R_8F_E4M3, K, N, K);
        cublasLtMatrixLayoutCreate(&lb, CUDA_R_8F_E4M3, K, M, K);
        cublasLtMatrixLayoutCreate(&lc, CUDA_R_32F, N, M, N);
        cublasLtMatmulPreference_t pref;
        cublasLtMatmulPreferenceCreate(&pref);
        size_t wsb = 32 << 20;
        cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsb, sizeof wsb);
        cublasLtMatmulHeuristicResult_t hr[8];
        int found = 0;
        int hs = cublasLtMatmulAlgoGetHeuristic(h, op, la, lb, lc, lc, pref, 8, hr, &found);
        printf("K=%d: heuristic %d, %d algorithms\n", K, hs, found);
        if (hs || !found) continue;
        float one = 1, zero = 0;
        int rs = cublasLtMatmul(h, op, &one, da, la, db, lb, &zero, dc, lc, dc, lc, &hr[0].algo, ws, wsb, 0);
        cudaError_t ce = cudaDeviceSynchronize();
        float *c = malloc(4 * M * N);
        cudaMemcpy(c, dc, 4 * M * N, cudaMemcpyDeviceToHost);
        printf("  run %d sync %d\n", rs, (int)ce);
        /* candidate layouts: A scale index for (n, g): 0 = n*G+g, 1 = g*N+n; B for (m, g): 0 = m*G+g, 1 = g*M+m */
        for (int la_ = 0; la_ < 2; la_++)
            for (int lb_ = 0; lb_ < 2; lb_++) {
                double num = 0, den = 0;
                for (int m = 0; m < M; m++)
                    for (int n = 0; n < N; n++) {
                        double s = 0;
                        for (int g = 0; g < G; g++) {
                            double part = 0;
                            for (int k = g * 128; k < K && k < (g + 1) * 128; k++)
                                part += (double)e4m3(a[(size_t)n * K + k]) * e4m3(b[(size_t)m * K + k]);
                            s += part * (la_ ? sa[g * N + n] : sa[n * G + g]) * (lb_ ? sb[g * M + m] : sb[m * G + g]);
                        }
                        num += (c[m * N + n] - s) * (c[m * N + n] - s);
                        den += s * s;
                    }
                printf("  A layout %s, B layout %s: rel err %.3g\n", la_ ? "[g][n]" : "[n][g]", lb_ ? "[g][m]" : "[m][g]",
                       sqrt(num / den));
            }
    }
    return 0;
}
