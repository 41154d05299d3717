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
 * kiln_gather_cols: the permute op (kiln_gather_cols_params): each row's elements in perm's order.
 * Launch: grid (ceil(K / 256), min(M, 65535)), block 256 (rows past the grid's in steps of it).
 */
extern "C" __global__ void __launch_bounds__(256) kiln_gather_cols(const kiln_gather_cols_params p) {
    kiln_pdl_wait();
    const int j = blockIdx.x * 256 + threadIdx.x;
    if (j >= p.K) return;
    const int c = ((const int *)p.perm)[j];
    for (int m = blockIdx.y; m < p.M; m += gridDim.y) {
        const size_t r = (size_t)m * (size_t)p.K;
        if (p.es == 2) ((unsigned short *)p.out)[r + j] = ((const unsigned short *)p.in)[r + c];
        else ((unsigned *)p.out)[r + j] = ((const unsigned *)p.in)[r + c];
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

/*
 * kiln_tp_oneshot: the one-shot all-reduce and gather (kiln_tp_oneshot_params).
 * Launch: grid (KILN_TP_ONESHOT_BLOCKS), block 256, no shared memory; one launch per rank, each on its
 * rank's stream, all resident at once (every rank's blocks spin at the barrier until all arrive).
 */
KILN_DEV unsigned kiln_ld_acquire_sys(const unsigned *p) {
    unsigned v;
    asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}
KILN_DEV void kiln_st_release_sys(unsigned *p, unsigned v) {
    asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
KILN_DEV unsigned long long kiln_globaltimer(void) {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

extern "C" __global__ void __launch_bounds__(256) kiln_tp_oneshot(const kiln_tp_oneshot_params p) {
    kiln_pdl_wait();
    __shared__ unsigned call;
    const int b = blockIdx.x, nb = gridDim.x, R = p.n_ranks;
    if (threadIdx.x == 0) call = ((volatile unsigned *)p.counter)[b] + 1u;
    __syncthreads();
    const unsigned c = call;
    const long long half_off = (long long)(c & 1u) * p.half;
    /* in 16-byte vectors (the host sends only n a multiple of one vector): this block's [lo, hi) */
    const long long nv = p.mode == 0 ? p.n / (p.f32 ? 4 : 8) : 0;
    const long long per = (nv + nb - 1) / nb, lo = b * per, hi = lo + per < nv ? lo + per : nv;
    if (p.mode == 0) { /* my partial into my staging half */
        uint4 *mine = (uint4 *)((char *)p.stage[p.rank] + half_off);
        for (long long i = lo + threadIdx.x; i < hi; i += blockDim.x) mine[i] = ((const uint4 *)p.in)[i];
    }
    __syncthreads();
    if (threadIdx.x < (unsigned)R) { /* meet: tell every rank, then wait for every rank (or the timeout) */
        volatile unsigned *poison = (volatile unsigned *)p.counter + KILN_TP_ONESHOT_BLOCKS;
        __threadfence_system();
        kiln_st_release_sys((unsigned *)p.flags[threadIdx.x] + b * R + p.rank, c);
        const unsigned *f = (const unsigned *)p.flags[p.rank] + b * R + threadIdx.x;
        const unsigned long long t0 = kiln_globaltimer();
        for (unsigned spin = 1; kiln_ld_acquire_sys(f) != c && !*poison; spin++)
            if (!(spin & 255) && kiln_globaltimer() - t0 > (unsigned long long)p.timeout_ns) {
                *(volatile unsigned *)p.fault = threadIdx.x + 1u;
                *poison = 1u;
                __threadfence_system();
            }
    }
    __syncthreads();
    if (p.mode == 0) {
        for (long long i = lo + threadIdx.x; i < hi; i += blockDim.x) {
            float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
            for (int r = 0; r < R; r++) {
                const uint4 v = __ldcg((const uint4 *)((const char *)p.stage[r] + half_off) + i);
                if (p.f32) {
                    acc[0] += __uint_as_float(v.x), acc[1] += __uint_as_float(v.y);
                    acc[2] += __uint_as_float(v.z), acc[3] += __uint_as_float(v.w);
                } else {
                    float f[8];
                    kiln_unpack8(v, f);
                    for (int k = 0; k < 8; k++) acc[k] += f[k];
                }
            }
            ((uint4 *)p.out)[i] = p.f32 ? make_uint4(__float_as_uint(acc[0]), __float_as_uint(acc[1]),
                                                     __float_as_uint(acc[2]), __float_as_uint(acc[3]))
                                        : kiln_pack8(acc);
        }
    } else if (p.rank == 0) { /* rows x (R slices of width floats), in float4s (width % 4 == 0) */
        const int w4 = p.width / 4, o4 = p.out_width / 4;
        const long long total = (long long)p.rows * R * w4;
        for (long long i = (long long)b * blockDim.x + threadIdx.x; i < total; i += (long long)nb * blockDim.x) {
            const long long row = i / ((long long)R * w4);
            const int col = (int)(i % ((long long)R * w4)), q = col / w4, j = col % w4;
            ((uint4 *)p.out)[row * o4 + col] = __ldcg((const uint4 *)p.src[q] + row * w4 + j);
        }
    }
    if (threadIdx.x == 0) ((volatile unsigned *)p.counter)[b] = c;
}
