/*
 * kiln_cuda_upload.h — stream weights from host memory (the mapped or
 * decoded weights section) to the device through pinned buffers, with
 * several threads, converting each element to the device's type on the way.
 *
 * A piece is a run of rows of one source weight (or of two, interleaved:
 * row r of a to device row 2r, row r of b to 2r+1 — the gate/up layout the
 * GEMV's SwiGLU epilogue reads). Each thread has its own stream and two
 * pinned buffers: it fills one while the other's copy runs.
 */
#ifndef KILN_CUDA_UPLOAD_H
#define KILN_CUDA_UPLOAD_H

#include <stdbool.h>
#include <stdint.h>

#include "../kiln_cuda.h"

typedef struct kiln_upload_piece {
    CUdeviceptr dst;    /* first device byte */
    const uint8_t *a;   /* first source row */
    const uint8_t *b;   /* interleaved with a's rows, or NULL */
    int64_t rows, cols; /* rows of a (and of b) in this piece, elements per row */
    uint32_t src_dtype; /* kiln_dtype of the source: f32, f16, bf16 */
} kiln_upload_piece;

/* Bytes of staging a piece of `rows` rows takes on the device side. */
static inline int64_t kiln_upload_piece_bytes(const kiln_upload_piece *p, int dst_es) {
    return p->rows * p->cols * dst_es * (p->b ? 2 : 1);
}

/* Upload every piece; `dst_f32` picks the device element type (f32, else
 * bf16). `buf_bytes` is the staging size per buffer (at least the largest
 * piece). Returns the bytes written through *bytes. */
kiln_status kiln_upload_pieces(kiln_cuda *cu, const kiln_upload_piece *pieces, int n, bool dst_f32, int threads,
                               size_t buf_bytes, int64_t *bytes, kiln_error *err);

#endif /* KILN_CUDA_UPLOAD_H */
