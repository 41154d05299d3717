/*
 * upload.c — weights host → device through pinned buffers, in parallel.
 * Contracts in kiln_cuda_upload.h.
 *
 * Why threads: a 14.5 GB model read from the page cache is bound by host
 * memory copies (page cache → pinned buffer) and page faults on the mapping,
 * each about 5-10 GB/s per core, while PCIe moves 25-50 GB/s; a handful of
 * lanes, each with its own stream and two pinned buffers, keeps the link
 * busy. The lanes are tasks on the process-wide thread pool
 * (common/kiln_pool.h), as many as `threads` and the pool's ways allow; each
 * pulls pieces from a shared counter, sets the context current for itself
 * and leaves no context current on the pool's thread when it is done.
 */
#include "kiln_cuda_upload.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "../../common/kiln_ops.h"
#include "../../common/kiln_pool.h"

typedef struct up_pool {
    kiln_cuda *cu;
    const kiln_upload_piece *pieces;
    int n, next, n_threads;
    int64_t max_cols; /* of the pieces dequantized on the way */
    bool dst_f32;
    size_t buf_bytes;
    uint8_t *arena;     /* pinned: 2 buffers of buf_bytes per lane, one allocation */
    pthread_mutex_t lock;
    /* the first failure, by piece index */
    int bad;
    kiln_status st;
    kiln_error err;
    int64_t bytes;
} up_pool;

static void fail(up_pool *pl, int piece, kiln_status st, const kiln_error *e) {
    pthread_mutex_lock(&pl->lock);
    if (pl->st == KILN_OK || piece < pl->bad) {
        pl->st = st;
        pl->bad = piece;
        pl->err = *e;
    }
    pl->next = pl->n; /* stop handing out work */
    pthread_mutex_unlock(&pl->lock);
}

/* One row of `cols` source elements into the device type. */
static void convert_row(uint8_t *dst, const uint8_t *src, int64_t cols, uint32_t sdt, bool dst_f32) {
    if (dst_f32) {
        if (sdt == KILN_DTYPE_F32) {
            memcpy(dst, src, (size_t)cols * 4);
            return;
        }
        float *d = (float *)(void *)dst;
        for (int64_t i = 0; i < cols; i++) {
            uint16_t h = (uint16_t)(src[2 * i] | src[2 * i + 1] << 8);
            d[i] = sdt == KILN_DTYPE_BF16 ? kiln_bf16_to_f32(h) : kiln_f16_to_f32(h);
        }
        return;
    }
    if (sdt == KILN_DTYPE_BF16) {
        memcpy(dst, src, (size_t)cols * 2);
        return;
    }
    uint16_t *d = (uint16_t *)(void *)dst;
    for (int64_t i = 0; i < cols; i++) {
        float f;
        if (sdt == KILN_DTYPE_F32) {
            memcpy(&f, src + 4 * i, 4);
        } else {
            f = kiln_f16_to_f32((uint16_t)(src[2 * i] | src[2 * i + 1] << 8));
        }
        d[i] = kiln_f32_to_bf16(f);
    }
}

/* Pool task `me`: one lane, with its own stream and buffers. */
static void up_run(void *arg, int me) {
    up_pool *pl = arg;
    kiln_cuda *cu = pl->cu;
    kiln_error e = {0};
    CUstream stream = NULL;
    CUevent ev[2] = {NULL, NULL};
    void *buf[2] = {NULL, NULL};
    bool used[2] = {false, false};
    float *row = NULL; /* a dequantized row (quantized sources) */
    buf[0] = pl->arena + (size_t)me * 2 * pl->buf_bytes;
    buf[1] = (uint8_t *)buf[0] + pl->buf_bytes;
    kiln_status st = KILN_CU_CALL(cu, &e, cu->api.cuCtxSetCurrent(cu->ctx));
    if (!st) st = KILN_CU_CALL(cu, &e, cu->api.cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
    for (int i = 0; i < 2 && !st; i++) st = KILN_CU_CALL(cu, &e, cu->api.cuEventCreate(&ev[i], CU_EVENT_DISABLE_TIMING));
    if (st) {
        fail(pl, -1, st, &e);
        goto out;
    }
    for (int k = 0;; k++) {
        pthread_mutex_lock(&pl->lock);
        int i = pl->next < pl->n ? pl->next++ : -1;
        pthread_mutex_unlock(&pl->lock);
        if (i < 0) break;
        const kiln_upload_piece *pc = &pl->pieces[i];
        int slot = k & 1;
        if (used[slot] && (st = KILN_CU_CALL(cu, &e, cu->api.cuEventSynchronize(ev[slot])))) {
            fail(pl, i, st, &e);
            break;
        }
        const int es = pl->dst_f32 ? 4 : 2;
        const int64_t sbytes = pc->cols * kiln_dtype_size((kiln_dtype)pc->src_dtype), dbytes = pc->cols * es;
        uint8_t *d = buf[slot];
        if (pc->raw) {
            memcpy(d, pc->a, (size_t)(pc->rows * pc->cols));
        } else if (kiln_dtype_is_quant((int)pc->src_dtype)) {
            if (!(row = row ? row : malloc((size_t)pl->max_cols * sizeof *row))) {
                kiln_error ne = {0};
                fail(pl, i, kiln_err(&ne, KILN_ERR_NOMEM, "weight upload: out of memory"), &ne);
                break;
            }
            for (int64_t r = 0; r < pc->rows; r++) {
                kiln_dequant_rows((int)pc->src_dtype, pc->a, pc->q_rows, pc->cols, pc->r0 + r, 1, row);
                convert_row(d + r * dbytes, (const uint8_t *)row, pc->cols, KILN_DTYPE_F32, pl->dst_f32);
            }
        } else {
            for (int64_t r = 0; r < pc->rows; r++) {
                if (pc->b) {
                    convert_row(d + (2 * r) * dbytes, pc->a + r * sbytes, pc->cols, pc->src_dtype, pl->dst_f32);
                    convert_row(d + (2 * r + 1) * dbytes, pc->b + r * sbytes, pc->cols, pc->src_dtype, pl->dst_f32);
                } else {
                    convert_row(d + r * dbytes, pc->a + r * sbytes, pc->cols, pc->src_dtype, pl->dst_f32);
                }
            }
        }
        size_t n = (size_t)kiln_upload_piece_bytes(pc, es);
        if ((st = KILN_CU_CALL(cu, &e, cu->api.cuMemcpyHtoDAsync(pc->dst, d, n, stream))) ||
            (st = KILN_CU_CALL(cu, &e, cu->api.cuEventRecord(ev[slot], stream)))) {
            fail(pl, i, st, &e);
            break;
        }
        used[slot] = true;
        pthread_mutex_lock(&pl->lock);
        pl->bytes += (int64_t)n;
        pthread_mutex_unlock(&pl->lock);
    }
    if (stream && (st = KILN_CU_CALL(cu, &e, cu->api.cuStreamSynchronize(stream)))) fail(pl, pl->n, st, &e);
out:
    free(row);
    for (int i = 0; i < 2; i++)
        if (ev[i]) cu->api.cuEventDestroy(ev[i]);
    if (stream) cu->api.cuStreamDestroy(stream);
    cu->api.cuCtxSetCurrent(NULL); /* the pool's thread outlives this upload and maybe the context */
}

kiln_status kiln_upload_pieces(kiln_cuda *cu, const kiln_upload_piece *pieces, int n, bool dst_f32, int threads,
                               size_t buf_bytes, int64_t *bytes, kiln_error *err) {
    *bytes = 0;
    if (n <= 0) return KILN_OK;
    up_pool pl = {.cu = cu, .pieces = pieces, .n = n, .dst_f32 = dst_f32, .buf_bytes = buf_bytes, .bad = n};
    for (int i = 0; i < n; i++)
        if (!pieces[i].raw && kiln_dtype_is_quant((int)pieces[i].src_dtype) && pieces[i].cols > pl.max_cols)
            pl.max_cols = pieces[i].cols;
    kiln_pool *pool = kiln_pool_shared();
    if (threads < 1) threads = 1;
    if (threads > 32) threads = 32;
    if (threads > n) threads = n;
    if (threads > kiln_pool_ways(pool)) threads = kiln_pool_ways(pool); /* lanes beyond it would only wait */
    /* one pinned allocation for every lane's two buffers: pinning is paid once */
    kiln_status st = KILN_CU_CALL(cu, err, cu->api.cuMemAllocHost((void **)&pl.arena, (size_t)threads * 2 * buf_bytes));
    if (st) return kiln_err_prefix(err, "weight upload: %d pinned staging buffers of %zu bytes: ", 2 * threads, buf_bytes);
    if (pthread_mutex_init(&pl.lock, NULL)) {
        cu->api.cuMemFreeHost(pl.arena);
        return kiln_err(err, KILN_ERR_NOMEM, "weight upload: cannot create a mutex");
    }
    kiln_pool_for(pool, threads, threads, up_run, &pl);
    pthread_mutex_destroy(&pl.lock);
    cu->api.cuMemFreeHost(pl.arena);
    /* the caller's thread: the context must stay current there */
    kiln_cuda_make_current(cu, err);
    *bytes = pl.bytes;
    if (pl.st != KILN_OK) {
        *err = pl.err;
        return kiln_err_prefix(err, "weight upload: ");
    }
    return KILN_OK;
}
