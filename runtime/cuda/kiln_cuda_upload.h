/*
 * kiln_cuda_upload.h — stream weights from host memory (the mapped or
 * decoded weights section) to the device through pinned buffers, with
 * several threads, converting each element to the device's type on the way.
 *
 * A piece is a run of rows of one source weight (or of two, interleaved:
 * row r of a to device row 2r, row r of b to 2r+1 — the gate/up layout the
 * GEMV's SwiGLU epilogue reads), or a run of bytes copied as they are (a
 * quantized weight, which the GEMV reads in its stored layout). A quantized
 * source with raw unset is dequantized (common/quant.c) to the device type:
 * an embedding table the gather kernel reads dense. Each thread has its own stream and two
 * pinned buffers: it fills one while the other's copy runs.
 */
#ifndef KILN_CUDA_UPLOAD_H
#define KILN_CUDA_UPLOAD_H

#include <stdbool.h>
#include <stdint.h>

#include "../kiln_cuda.h"

typedef struct kiln_upload_piece {
    CUdeviceptr dst;    /* first device byte */
    const uint8_t *a;   /* first source row; for a quantized source, the whole weight's bytes */
    const uint8_t *b;   /* interleaved with a's rows, or NULL */
    int64_t rows, cols; /* rows of a (and of b) in this piece, elements per row (raw: bytes) */
    uint32_t src_dtype; /* kiln_dtype of the source: f32, f16, bf16, or quantized (q8, q4g*) */
    bool raw;           /* copy cols bytes as they are (a quantized weight the kernels read as stored) */
    int64_t q_rows, r0; /* a quantized source dequantized on the way: its rows, and this piece's first */
} kiln_upload_piece;

/* Bytes of staging a piece of `rows` rows takes on the device side. */
static inline int64_t kiln_upload_piece_bytes(const kiln_upload_piece *p, int dst_es) {
    if (p->raw) return p->rows * p->cols;
    return p->rows * p->cols * dst_es * (p->b ? 2 : 1);
}

/* Upload every piece; `dst_f32` picks the device element type (f32, else
 * bf16). `buf_bytes` is the staging size per buffer (at least the largest
 * piece). Returns the bytes written through *bytes. */
kiln_status kiln_upload_pieces(kiln_cuda *cu, const kiln_upload_piece *pieces, int n, bool dst_f32, int threads,
                               size_t buf_bytes, int64_t *bytes, kiln_error *err);

#endif /* KILN_CUDA_UPLOAD_H */
