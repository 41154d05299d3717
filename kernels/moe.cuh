/*
 * moe.cuh — Mixtral's (and Qwen3-MoE's) sparse experts around the expert
 * matrices: the router, the grouping of (token, expert) pairs by expert, and
 * the weighted sum of each token's experts. The expert matrices themselves
 * run as GEMVs over the chosen experts (gemv.cuh with GEMV_MOE: the expert id
 * is read on the device) or as cuBLASLt GEMMs (runtime/cuda/exec.c says which
 * when).
 *
 * kiln_moe_route (a block per token): logits[e] = x · router[e] in fp32 (one
 * warp per expert, the same lane order for every expert, so tied router rows
 * give equal logits), softmax in fp32 as torch (exp(l - max) times 1 / sum),
 * torch.topk's choice as PyTorch's CPU kernel makes it, ties included (the
 * C++ library's partial_sort / nth_element + sort, written out in
 * runtime/topk.c, whose steps the device functions below repeat one for one:
 * the two must move elements identically), the chosen probabilities divided
 * by their sum (in choice order; not with MOE_NO_RENORM). One thread of the
 * block does the softmax and the selection: E is 8 (Mixtral) to 128.
 * kiln_moe_group (one block): tokens per expert, their prefix sums, and each
 * pair's row when the pairs are grouped by expert (rows of one expert in no
 * particular order: every row of a GEMM is computed the same way wherever it
 * sits). kiln_moe_gather: the grouped copy of x. kiln_moe_combine (a block
 * per token): y = the sum of w_j * o_j over the token's experts in expert
 * index order, from 0, in fp32 (products rounded before the add, as the CPU
 * executor's loop), rounded once.
 * Constants: HIDDEN, MOE_E (experts), MOE_K (chosen per token, at most 17:
 * the sort of the first k-1 is then an insertion sort, as the library's is
 * below 17 elements), MOE_NO_RENORM (0), MOE_THREADS (256).
 * Elements are kiln_elem (bf16, or fp32 with KILN_F32; common.cuh).
 */
#include "common.cuh"

#ifndef HIDDEN
#error "moe.cuh needs HIDDEN"
#endif
#ifndef MOE_E
#error "moe.cuh needs MOE_E"
#endif
#ifndef MOE_K
#error "moe.cuh needs MOE_K"
#endif
#ifndef MOE_NO_RENORM
#define MOE_NO_RENORM 0
#endif
#ifndef MOE_THREADS
#define MOE_THREADS 256
#endif
#if MOE_K < 1 || MOE_K > MOE_E || MOE_K > 17 || MOE_E > 512
#error "moe.cuh: MOE_K must be 1..min(MOE_E, 17) and MOE_E at most 512"
#endif

/* ---- torch.topk's order on the CPU: the steps runtime/topk.c takes, from one header ---- */

#define KILN_TK_FN KILN_DEV
#include "topk_order.cuh"

/* The k largest of q[0..n) into q[0..k), in torch.topk's order. k - 1 <= 16: the library's sort of
 * the first k - 1 is its final insertion sort alone (introsort_loop does nothing below 17). */
KILN_DEV void kiln_tk_topk(kiln_tk *q, int n, int k) {
    if ((long)k * 64 <= n) {
        kiln_tk_heap_select(q, q + k, q + n);
        kiln_tk_sort_heap(q, q + k);
    } else {
        kiln_tk_nth_element(q, q + k - 1, q + n);
        kiln_tk_insertion_sort(q, q + k - 1);
    }
}

/* ---- the router ---- */

extern "C" __global__ void __launch_bounds__(MOE_THREADS) kiln_moe_route(const kiln_moe_params p) {
    __shared__ float logit[MOE_E];
    __shared__ kiln_tk q[MOE_E];
    const int m = blockIdx.x, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const kiln_elem *x = (const kiln_elem *)p.x + (size_t)m * HIDDEN;
    kiln_pdl_wait();
    for (int e = warp; e < MOE_E; e += MOE_THREADS / 32) {
        const kiln_elem *r = (const kiln_elem *)p.router + (size_t)e * HIDDEN;
        float acc = 0.0f;
#if HIDDEN % KILN_VEC == 0
        for (int c = lane; c < HIDDEN / KILN_VEC; c += 32)
            acc = kiln_dotv(kiln_ld16(r + (size_t)c * KILN_VEC), kiln_ld16(x + (size_t)c * KILN_VEC), acc);
#else
        for (int h = lane; h < HIDDEN; h += 32) acc = fmaf(kiln_e2f(r[h]), kiln_e2f(x[h]), acc);
#endif
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(KILN_FULL_MASK, acc, o);
        if (lane == 0) logit[e] = acc;
    }
    __syncthreads();
    kiln_pdl_launch();
    if (threadIdx.x != 0) return;
    float mx = logit[0];
    for (int e = 1; e < MOE_E; e++) mx = logit[e] > mx ? logit[e] : mx;
    float sum = 0.0f;
    for (int e = 0; e < MOE_E; e++) {
        logit[e] = expf(logit[e] - mx);
        sum += logit[e];
    }
    const float inv = 1.0f / sum;
    for (int e = 0; e < MOE_E; e++) q[e] = kiln_tk{logit[e] * inv, e};
    kiln_tk_topk(q, MOE_E, MOE_K);
    float top = 0.0f;
    for (int j = 0; j < MOE_K; j++) top += q[j].v;
#if MOE_NO_RENORM
    top = 1.0f;
#endif
    int *sel = (int *)p.sel + (size_t)m * MOE_K;
    float *w = (float *)p.wsel + (size_t)m * MOE_K;
    for (int j = 0; j < MOE_K; j++) {
        sel[j] = q[j].i;
        w[j] = q[j].v / top;
    }
}

/* ---- grouping pairs by expert ---- */

extern "C" __global__ void __launch_bounds__(1024) kiln_moe_group(const kiln_moe_params p) {
    __shared__ int cnt[MOE_E], cur[MOE_E], off[MOE_E + 1];
    const int n = p.M * MOE_K;
    const int *sel = (const int *)p.sel;
    kiln_pdl_wait();
    for (int e = threadIdx.x; e < MOE_E; e += blockDim.x) cnt[e] = cur[e] = 0;
    __syncthreads();
    for (int i = threadIdx.x; i < n; i += blockDim.x) atomicAdd(&cnt[sel[i]], 1);
    __syncthreads();
    if (threadIdx.x == 0) {
        int s = 0;
        for (int e = 0; e < MOE_E; e++) {
            off[e] = s;
            s += cnt[e];
        }
        off[MOE_E] = s;
    }
    __syncthreads();
    for (int e = threadIdx.x; e <= MOE_E; e += blockDim.x) {
        ((int *)p.offsets)[e] = off[e];
        ((int *)p.counts)[e] = e < MOE_E ? cnt[e] : n;
    }
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        const int e = sel[i], r = off[e] + atomicAdd(&cur[e], 1);
        ((int *)p.pos)[i] = r;
        ((int *)p.tok)[r] = i / MOE_K;
    }
}

/* xs[r] = x[tok[r]]: a block per grouped row. */
extern "C" __global__ void __launch_bounds__(128) kiln_moe_gather(const kiln_moe_params p) {
    const size_t r = blockIdx.x;
    kiln_pdl_wait();
    const int t = ((const int *)p.tok)[r];
    const kiln_elem *src = (const kiln_elem *)p.x + (size_t)t * HIDDEN;
    kiln_elem *dst = (kiln_elem *)p.xs + r * HIDDEN;
    for (int h = threadIdx.x; h < HIDDEN; h += blockDim.x) dst[h] = src[h];
}

/* ---- the weighted sum over a token's experts ---- */

extern "C" __global__ void __launch_bounds__(MOE_THREADS) kiln_moe_combine(const kiln_moe_params p) {
    const int m = blockIdx.x;
    kiln_pdl_wait();
    /* the token's choices in expert order */
    int e[MOE_K];
    size_t row[MOE_K];
    float w[MOE_K];
#pragma unroll
    for (int j = 0; j < MOE_K; j++) {
        const size_t pr = (size_t)m * MOE_K + j;
        e[j] = ((const int *)p.sel)[pr];
        w[j] = ((const float *)p.wsel)[pr];
        row[j] = p.mode == 0 ? pr : p.mode == 1 ? (size_t)e[j] * p.ldo + m : (size_t)((const int *)p.pos)[pr];
    }
    for (int a = 1; a < MOE_K; a++)
        for (int b = a; b > 0 && e[b - 1] > e[b]; b--) {
            int te = e[b];
            e[b] = e[b - 1], e[b - 1] = te;
            size_t tr = row[b];
            row[b] = row[b - 1], row[b - 1] = tr;
            float tw = w[b];
            w[b] = w[b - 1], w[b - 1] = tw;
        }
    kiln_elem *y = (kiln_elem *)p.y + (size_t)m * HIDDEN;
    for (int h = threadIdx.x; h < HIDDEN; h += blockDim.x) {
        float acc = 0.0f;
#pragma unroll
        for (int j = 0; j < MOE_K; j++) {
            const float o = p.o_f32 ? ((const float *)p.o)[row[j] * HIDDEN + h]
                                    : kiln_e2f(((const kiln_elem *)p.o)[row[j] * HIDDEN + h]);
            acc = __fadd_rn(acc, __fmul_rn(o, w[j]));
        }
        y[h] = kiln_f2e(acc);
    }
}
