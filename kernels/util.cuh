/*
 * util.cuh — small data-movement kernels of the runtime, independent of the
 * element type.
 *
 * kiln_gather_rows: out[i, :] = src[idx[i] - base, :] for i < M, each row
 * row_bytes bytes. The embedding lookup (src = the table, idx = token ids)
 * and the gather of each sequence's last token before the LM head. An index
 * outside 0..n_src-1 (after base) writes a row of zeros: a vocabulary-
 * parallel rank's slice of the table gives zeros for the other ranks' ids
 * (and a bad index never reads outside the table).
 * 16-byte moves when row_bytes and both addresses allow, else 4-byte, else
 * bytes.
 * Launch: grid (M), block 128, no shared memory.
 */
#include "common.cuh"

extern "C" __global__ void __launch_bounds__(128) kiln_gather_rows(const kiln_gather_params p) {
    kiln_pdl_wait();
    const int i = blockIdx.x;
    if (i >= p.M) return;
    const int r = ((const int *)p.idx)[i] - p.base;
    const bool ok = r >= 0 && r < p.n_src;
    const char *src = (const char *)p.src + (size_t)(ok ? r : 0) * p.row_bytes;
    char *dst = (char *)p.out + (size_t)i * p.row_bytes;
    const int n = p.row_bytes;
    if (n % 16 == 0 && (p.src | p.out) % 16 == 0) {
        for (int c = threadIdx.x; c < n / 16; c += blockDim.x)
            ((uint4 *)dst)[c] = ok ? ((const uint4 *)src)[c] : make_uint4(0, 0, 0, 0);
    } else if (n % 4 == 0 && (p.src | p.out) % 4 == 0) {
        for (int c = threadIdx.x; c < n / 4; c += blockDim.x) ((unsigned *)dst)[c] = ok ? ((const unsigned *)src)[c] : 0u;
    } else {
        for (int c = threadIdx.x; c < n; c += blockDim.x) dst[c] = ok ? src[c] : (char)0;
    }
}

/*
 * kiln_tp_sum: the all-reduce of tensor-parallel ranks that share one
 * device (kiln_tp_sum_params): each element summed over the ranks in rank
 * order in fp32 and written to every rank's output.
 * Launch: grid (any; grid-stride), block 256, no shared memory.
 */
extern "C" __global__ void __launch_bounds__(256) kiln_tp_sum(const kiln_tp_sum_params p) {
    kiln_pdl_wait();
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < p.n; i += (long long)gridDim.x * blockDim.x) {
        float s = 0.0f;
        for (int r = 0; r < p.n_ranks; r++)
            s += p.f32 ? ((const float *)p.in[r])[i] : kiln_bf2f(((const kiln_bf16 *)p.in[r])[i]);
        const kiln_bf16 b = kiln_f2bf(s);
        for (int r = 0; r < p.n_ranks; r++) {
            if (p.f32) ((float *)p.out[r])[i] = s;
            else ((kiln_bf16 *)p.out[r])[i] = b;
        }
    }
}
