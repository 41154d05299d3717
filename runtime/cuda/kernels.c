/*
 * kernels.c — host-side facts about the kernels in kernels/: which compiled
 * image a device takes, and each family's launch geometry and shared memory
 * (the numbers each kernel's header comment gives, in one place).
 */
#include "runtime/kiln_cuda.h"

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

kiln_cuda_dims kiln_gemv_dims(const kiln_gemv_cfg *c, int M, int N) {
    kiln_cuda_dims d = {{1, 1, 1}, {1, 1, 1}, 0};
    int per_block = c->warps * c->rows;
    d.grid[0] = (unsigned)((N + per_block - 1) / per_block);
    d.grid[1] = (unsigned)((M + c->mt - 1) / c->mt);
    d.block[0] = (unsigned)(c->warps * 32);
    return d;
}

unsigned kiln_attn_decode_smem(int n_heads, int n_kv_heads, int head_dim, int partition, int warps) {
    int g = n_heads / n_kv_heads;
    return (unsigned)(4 * (g * partition + warps * g * head_dim + 2 * g));
}

unsigned kiln_attn_prefill_smem(int head_dim) {
    return (unsigned)(4 * (64 * (head_dim + 1) + 2 * 32 * (head_dim + 1) + 64 * 33));
}

int kiln_attn_decode_splits(int len, int window, int partition) {
    int n = (window > 0 && len > window) ? window : len;
    return n <= 0 ? 1 : (n + partition - 1) / partition;
}
