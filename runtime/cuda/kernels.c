/*
 * kernels.c — host-side facts about the kernels in kernels/: which compiled
 * image a device takes, and each family's launch geometry and shared memory
 * (the numbers each kernel's header comment gives, in one place).
 */
#include "runtime/kiln_cuda.h"
#include "kernels/params.cuh"

int kiln_cuda_pick_image(const kiln_cuda_image *images, int n_images, int device_sm) {
    int cubin = -1, ptx = -1;
    for (int i = 0; i < n_images; i++) {
        const kiln_cuda_image *im = &images[i];
        if (!im->data || !im->len || im->sm > device_sm) continue;
        if (im->is_ptx) {
            if (ptx < 0 || im->sm > images[ptx].sm) ptx = i;
        } else if (im->sm / 10 == device_sm / 10 && (cubin < 0 || im->sm > images[cubin].sm)) {
            cubin = i; /* a cubin runs on later minors of its own major only */
        }
    }
    return cubin >= 0 ? cubin : ptx;
}

kiln_status kiln_cuda_dims_check(const kiln_cuda_dims *d, const char *what, kiln_error *err) {
    const unsigned *g = d->grid;
    if (g[0] >= 1 && g[1] >= 1 && g[2] >= 1 && g[0] <= KILN_CUDA_GRID_X_MAX && g[1] <= KILN_CUDA_GRID_YZ_MAX &&
        g[2] <= KILN_CUDA_GRID_YZ_MAX)
        return KILN_OK;
    kiln_err(err, KILN_ERR_INVALID_ARG,
             "kernel '%s': grid %ux%ux%u is outside CUDA's limits (x 1..%u, y and z 1..%u)", what ? what : "kernel",
             g[0], g[1], g[2], KILN_CUDA_GRID_X_MAX, KILN_CUDA_GRID_YZ_MAX);
    return kiln_err_hint(err, "a kiln bug: this kernel's launch must stride over its rows; as a workaround give "
                              "fewer tokens per step (max_step_tokens) or sequences (max_batch)");
}

kiln_cuda_dims kiln_swiglu_dims(int ffn, int M, int threads, int vec) {
    const int per = ffn % vec == 0 ? ffn / vec : ffn; /* 16-byte chunks, else elements, of one row */
    kiln_cuda_dims d = {{(unsigned)((per + threads - 1) / threads),
                         (unsigned)(M < (int)KILN_CUDA_GRID_YZ_MAX ? (M > 0 ? M : 1) : (int)KILN_CUDA_GRID_YZ_MAX), 1},
                        {(unsigned)threads, 1, 1},
                        0};
    return d;
}

kiln_cuda_dims kiln_gemv_dims(const kiln_gemv_cfg *c, int M, int N) {
    kiln_cuda_dims d = {{1, 1, 1}, {1, 1, 1}, 0};
    if (c->mma == 2) { /* the q4 CUDA-core GEMV: the block's warps split K over its `rows` rows */
        d.grid[0] = (unsigned)((N + c->rows - 1) / c->rows);
        d.grid[1] = (unsigned)M;
    } else if (c->mma) { /* x tiles first, so the blocks reading the same 16 rows of W run together */
        d.grid[0] = (unsigned)((M + 7) / 8);
        const int rows = 16 * (c->rows > 1 ? c->rows : 1); /* the quantized GEMV's GEMV_QT tiles */
        d.grid[1] = (unsigned)((N + rows - 1) / rows);
    } else {
        int per_block = c->warps * c->rows;
        d.grid[0] = (unsigned)((N + per_block - 1) / per_block);
        d.grid[1] = (unsigned)((M + c->mt - 1) / c->mt);
    }
    d.block[0] = (unsigned)(c->warps * 32);
    return d;
}

int kiln_qgemm_splits(const kiln_qgemm_cfg *c, int M, int N, int K, int sms, int *chunks) {
    const int bn = 16 * c->warps, nc = (K + 127) / 128;
    const long tiles = (long)((N + bn - 1) / bn) * ((M + c->tm - 1) / c->tm);
    int splits = tiles >= sms ? 1 : (int)(2L * sms / tiles);
    if (splits > nc) splits = nc;
    if (splits < 1) splits = 1;
    *chunks = (nc + splits - 1) / splits;
    return (nc + *chunks - 1) / *chunks; /* every split a chunk or more */
}

kiln_cuda_dims kiln_qgemm_dims(const kiln_qgemm_cfg *c, int M, int N, int splits) {
    kiln_cuda_dims d = {{1, 1, 1}, {1, 1, 1}, 0};
    d.grid[0] = (unsigned)((N + 16 * c->warps - 1) / (16 * c->warps));
    d.grid[1] = (unsigned)((M + c->tm - 1) / c->tm);
    d.grid[2] = (unsigned)(splits > 1 ? splits : 1);
    d.block[0] = (unsigned)(32 * c->warps);
    d.smem = (unsigned)(c->stages * KILN_QGEMM_STAGE(c->bits, c->bits == 4 ? c->group : 128, c->warps, c->tm));
    return d;
}

size_t kiln_qgemm_ws_floats(const kiln_qgemm_cfg *c, int sms) {
    return (size_t)2 * (size_t)sms * (size_t)c->tm * 16 * (size_t)c->warps;
}
size_t kiln_qgemm_cnt(int sms) { return (size_t)2 * (size_t)sms; }

unsigned kiln_attn_decode_smem(int n_heads, int n_kv_heads, int head_dim, int block_size, int partition_max,
                               int warps) {
    return (unsigned)KILN_ATTN_DECODE_SMEM(n_heads / n_kv_heads, head_dim, block_size, partition_max, warps);
}

unsigned kiln_attn_decode_tc_smem(int head_dim, int block_size, int partition_max, int warps, int kv_es) {
    return (unsigned)KILN_ATTN_DECODE_TC_SMEM(head_dim, block_size, partition_max, warps, kv_es);
}

unsigned kiln_attn_prefill_smem(int head_dim) {
    return (unsigned)(4 * (64 * (head_dim + 1) + 2 * 32 * (head_dim + 1) + 64 * 33));
}

unsigned kiln_attn_prefill_mma_smem(int head_dim, int warps, int mt, bool kv8) {
    /* 2 stages x (K, V) x 64 keys, plus (mt > 1, or kv8) the block's 16 * mt * warps q rows; padded rows,
     * bf16; with kv8 the codes' buffers after them, (K, V) x 2 stages x 64 keys x head_dim bytes */
    int rows = 2 * 2 * 64 + (mt > 1 || kv8 ? 16 * mt * warps : 0);
    return (unsigned)(rows * (head_dim + 8) * 2 + (kv8 ? 2 * 2 * 64 * head_dim : 0));
}

kiln_cuda_dims kiln_attn_prefill_mma_dims(int warps, int mt, int n_heads, int B, int max_q, int head_dim, bool kv8) {
    int rows = 16 * mt * warps;
    kiln_cuda_dims d = {{(unsigned)((max_q + rows - 1) / rows), (unsigned)n_heads, (unsigned)B},
                        {(unsigned)(32 * warps), 1, 1},
                        kiln_attn_prefill_mma_smem(head_dim, warps, mt, kv8)};
    return d;
}

unsigned kiln_attn_prefill_wg_smem(int head_dim, int groups) {
    /* the block's q rows and the stages' (K, V) x 128 keys, bf16, and 1024 bytes to align them */
    return (unsigned)((64 * groups + KILN_PF_WG_STAGES * 2 * 128) * head_dim * 2 + 1024);
}

kiln_cuda_dims kiln_attn_prefill_wg_dims(int groups, int n_heads, int B, int max_q, int head_dim) {
    const int rows = 64 * groups;
    kiln_cuda_dims d = {{(unsigned)n_heads, (unsigned)((max_q + rows - 1) / rows), (unsigned)B},
                        {(unsigned)(128 * groups), 1, 1},
                        kiln_attn_prefill_wg_smem(head_dim, groups)};
    return d;
}

int kiln_attn_decode_splits(int len, int window, int partition) {
    int n = (window > 0 && len > window) ? window : len;
    return n <= 0 ? 1 : (n + partition - 1) / partition;
}

int kiln_attn_decode_partition(int batch, int n_kv_heads, int max_len, int window, int n_sm, int partition_max) {
    int len = (window > 0 && max_len > window) ? window : max_len;
    int units = batch * n_kv_heads;
    if (units < 1) units = 1;
    int want_splits = (2 * n_sm + units - 1) / units; /* about two waves */
    if (want_splits < 1) want_splits = 1;
    int part = (len + want_splits - 1) / want_splits;
    part = (part + 31) / 32 * 32;
    if (part < 32) part = 32;
    return kiln_attn_even_split(len, part, partition_max);
}
