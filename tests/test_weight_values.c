/*
 * test_weight_values.c — weight values are checked as they are converted
 * into the engine (codegen/plan_writer.c, kiln_weight_convert): NaN, +Inf
 * and -Inf at every source dtype, copied unchanged or converted to every
 * other dtype; f32/bf16 → f16 overflow beyond 65504 and f32 → bf16
 * overflow; the largest finite values that still fit pass; the message
 * names the tensor, the flat and per-dimension index and the value.
 */
#include <math.h>

#include "../codegen/kiln_codegen.h"
#include "kt.h"

#define N 300 /* elements in a chunk: [20,15] */

static const kiln_dtype dtypes[3] = {KILN_DTYPE_F32, KILN_DTYPE_F16, KILN_DTYPE_BF16};

/* Write float x as element i of a `dt` buffer (the test's own encoder). */
static void put(uint8_t *b, kiln_dtype dt, size_t i, float x) {
    if (dt == KILN_DTYPE_F32) {
        uint32_t u;
        memcpy(&u, &x, 4);
        kiln_wr_u32(b + 4 * i, u);
        return;
    }
    uint16_t h = dt == KILN_DTYPE_BF16 ? kiln_f32_to_bf16(x) : kiln_f32_to_f16(x);
    b[2 * i] = (uint8_t)h;
    b[2 * i + 1] = (uint8_t)(h >> 8);
}

/* A weight [20, 15] named "w.<src>" from src dtype to dst dtype. */
static kiln_value weight(kiln_dtype src, kiln_dtype dst) {
    kiln_value v = {.kind = KILN_VALUE_WEIGHT, .dtype = dst, .src_dtype = src, .ndim = 2, .shape = {20, 15}};
    snprintf(v.name, sizeof v.name, "w.%s", kiln_dtype_name(src));
    return v;
}

/* Convert N elements of small values with element `at` set to x; `first`
 * is the chunk's offset in the tensor. */
static kiln_status run(kiln_dtype src, kiln_dtype dst, size_t at, float x, uint64_t first, kiln_error *err) {
    static uint8_t in[4 * N], out[4 * N];
    for (size_t i = 0; i < N; i++) put(in, src, i, (float)((int)i % 7 - 3) * 0.25f);
    if (at < N) put(in, src, at, x);
    kiln_value v = weight(src, dst);
    return kiln_weight_convert(&v, first, in, out, N, err);
}

static void test_clean_values_pass(void) {
    for (int s = 0; s < 3; s++)
        for (int d = 0; d < 3; d++) {
            kiln_error err = {0};
            KT_EQ_INT(run(dtypes[s], dtypes[d], N, 0, 0, &err), KILN_OK);
        }
}

/* NaN, +Inf and -Inf: refused at every source dtype, whatever the target. */
static void test_nonfinite_refused(void) {
    const float bad[3] = {NAN, INFINITY, -INFINITY};
    const char *names[3] = {"is NaN", "is +Inf", "is -Inf"};
    for (int s = 0; s < 3; s++)
        for (int d = 0; d < 3; d++)
            for (int b = 0; b < 3; b++) {
                kiln_error err = {0};
                /* element 17 of the chunk, chunk at 30 → flat 47 = [3,2] of [20,15] */
                KT_EQ_INT(run(dtypes[s], dtypes[d], 17, bad[b], 30, &err), KILN_ERR_PARSE);
                char want[64];
                snprintf(want, sizeof want, "'w.%s'", kiln_dtype_name(dtypes[s]));
                KT_CONTAINS(err.msg, want);
                KT_CONTAINS(err.msg, "element 47 [3,2]");
                KT_CONTAINS(err.msg, names[b]);
                KT_CONTAINS(err.msg, "hint:");
            }
}

/* The first bad element is the one named, also at the end of a chunk. */
static void test_first_and_last(void) {
    kiln_error err = {0};
    KT_EQ_INT(run(KILN_DTYPE_BF16, KILN_DTYPE_BF16, N - 1, NAN, 0, &err), KILN_ERR_PARSE);
    KT_CONTAINS(err.msg, "element 299 [19,14]");
    KT_EQ_INT(run(KILN_DTYPE_F32, KILN_DTYPE_F32, 0, -INFINITY, 0, &err), KILN_ERR_PARSE);
    KT_CONTAINS(err.msg, "element 0 [0,0] is -Inf");
}

/* Unchanged copies are scanned in blocks: a bad value in a later block, or
 * at a block's edge, is still found and named exactly. */
static void test_blocks(void) {
    enum { M = 10000 };
    static uint8_t in[2 * M], out[2 * M];
    const size_t at[4] = {4095, 4096, 8192, M - 1};
    kiln_value v = {.kind = KILN_VALUE_WEIGHT, .dtype = KILN_DTYPE_F16, .src_dtype = KILN_DTYPE_F16, .ndim = 1,
                    .shape = {M}, .name = "big"};
    for (int k = 0; k < 4; k++) {
        memset(in, 0, sizeof in);
        put(in, KILN_DTYPE_F16, at[k], INFINITY);
        kiln_error err = {0};
        KT_EQ_INT(kiln_weight_convert(&v, 0, in, out, M, &err), KILN_ERR_PARSE);
        char want[64];
        snprintf(want, sizeof want, "element %zu [%zu] is +Inf", at[k], at[k]);
        KT_CONTAINS(err.msg, want);
    }
}

/* Narrowing to f16: beyond ±65504 (after rounding) is an error, from f32 and bf16. */
static void test_f16_overflow(void) {
    kiln_error err = {0};
    KT_EQ_INT(run(KILN_DTYPE_F32, KILN_DTYPE_F16, 5, 70000.0f, 0, &err), KILN_ERR_UNSUPPORTED);
    KT_CONTAINS(err.msg, "'w.f32'");
    KT_CONTAINS(err.msg, "element 5 [0,5] is 70000");
    KT_CONTAINS(err.msg, "f16 (max 65504)");
    KT_CONTAINS(err.msg, "+Inf");
    KT_CONTAINS(err.msg, "hint:");
    KT_EQ_INT(run(KILN_DTYPE_F32, KILN_DTYPE_F16, 5, -65520.0f, 0, &err), KILN_ERR_UNSUPPORTED);
    KT_CONTAINS(err.msg, "-Inf");
    KT_EQ_INT(run(KILN_DTYPE_BF16, KILN_DTYPE_F16, 9, 1e5f, 0, &err), KILN_ERR_UNSUPPORTED);
    KT_CONTAINS(err.msg, "'w.bf16'");
    /* the largest values that fit pass: 65504, and 65519 rounds down to it */
    KT_EQ_INT(run(KILN_DTYPE_F32, KILN_DTYPE_F16, 5, 65504.0f, 0, &err), KILN_OK);
    KT_EQ_INT(run(KILN_DTYPE_F32, KILN_DTYPE_F16, 5, -65519.0f, 0, &err), KILN_OK);
    /* widening never overflows */
    KT_EQ_INT(run(KILN_DTYPE_BF16, KILN_DTYPE_F32, 5, 1e38f, 0, &err), KILN_OK);
    KT_EQ_INT(run(KILN_DTYPE_F16, KILN_DTYPE_BF16, 5, 65504.0f, 0, &err), KILN_OK);
}

/* Narrowing f32 → bf16 near FLT_MAX: rounding to bf16 overflows. */
static void test_bf16_overflow(void) {
    kiln_error err = {0};
    KT_EQ_INT(run(KILN_DTYPE_F32, KILN_DTYPE_BF16, 2, 3.4e38f, 0, &err), KILN_ERR_UNSUPPORTED);
    KT_CONTAINS(err.msg, "bf16 (max 3.39e38)");
    KT_EQ_INT(run(KILN_DTYPE_F32, KILN_DTYPE_BF16, 2, -3.4e38f, 0, &err), KILN_ERR_UNSUPPORTED);
    KT_EQ_INT(run(KILN_DTYPE_F32, KILN_DTYPE_BF16, 2, 3.38e38f, 0, &err), KILN_OK);
}

/* The values themselves come through unchanged or correctly rounded. */
static void test_values_converted(void) {
    uint8_t in[8], out[8];
    put(in, KILN_DTYPE_F32, 0, 1.5f);
    put(in, KILN_DTYPE_F32, 1, -2.25f);
    kiln_value v = weight(KILN_DTYPE_F32, KILN_DTYPE_BF16);
    kiln_error err = {0};
    KT_EQ_INT(kiln_weight_convert(&v, 0, in, out, 2, &err), KILN_OK);
    KT_EQ_INT(out[0] | out[1] << 8, kiln_f32_to_bf16(1.5f));
    KT_EQ_INT(out[2] | out[3] << 8, kiln_f32_to_bf16(-2.25f));
}

/* --awq's factors (kiln_value.row_mul / col_mul): element [r, c] times row_mul[r] * col_mul[c], by the
 * source index (a chunk starting mid-tensor too), also when the dtypes are equal (no plain copy then);
 * a NaN is still refused by its place, and a product past the target's range is an overflow. */
static void test_multipliers(void) {
    enum { R = 3, C = 4 };
    float rm[R] = {1.0f, 2.0f, 0.5f}, cm[C] = {1.0f, 3.0f, 0.25f, -1.0f};
    uint8_t in[4 * R * C], out[4 * R * C];
    for (int i = 0; i < R * C; i++) put(in, KILN_DTYPE_F32, (size_t)i, (float)(i + 1));
    kiln_value v = {.kind = KILN_VALUE_WEIGHT, .dtype = KILN_DTYPE_F32, .src_dtype = KILN_DTYPE_F32, .ndim = 2,
                    .shape = {R, C}, .row_mul = rm, .col_mul = cm, .mul_cols = C};
    snprintf(v.name, sizeof v.name, "w.scaled");
    kiln_error err = {0};
    KT_EQ_INT(kiln_weight_convert(&v, 0, in, out, R * C, &err), KILN_OK);
    for (int i = 0; i < R * C; i++) {
        float got;
        uint32_t u = (uint32_t)out[4 * i] | (uint32_t)out[4 * i + 1] << 8 | (uint32_t)out[4 * i + 2] << 16 |
                     (uint32_t)out[4 * i + 3] << 24;
        memcpy(&got, &u, 4);
        KT_CHECKF(got == (float)(i + 1) * (rm[i / C] * cm[i % C]), "element %d: %g", i, (double)got);
    }
    /* a chunk from element 5 on: [1,1] is the first, times 2 * 3 */
    KT_EQ_INT(kiln_weight_convert(&v, 5, in + 4 * 5, out, 2, &err), KILN_OK);
    float f;
    uint32_t u = (uint32_t)out[0] | (uint32_t)out[1] << 8 | (uint32_t)out[2] << 16 | (uint32_t)out[3] << 24;
    memcpy(&f, &u, 4);
    KT_CHECK(f == 6.0f * 6.0f);
    /* a 1-D weight: its elements times col_mul */
    kiln_value b = v;
    b.ndim = 1, b.shape[0] = C, b.shape[1] = 0, b.row_mul = NULL;
    KT_EQ_INT(kiln_weight_convert(&b, 0, in, out, C, &err), KILN_OK);
    memcpy(&u, out + 4 * 3, 4);
    memcpy(&f, &u, 4);
    KT_CHECK(f == -4.0f);
    put(in, KILN_DTYPE_F32, 6, NAN);
    KT_EQ_INT(kiln_weight_convert(&v, 0, in, out, R * C, &err), KILN_ERR_PARSE);
    KT_CONTAINS(err.msg, "[1,2] is NaN");
    put(in, KILN_DTYPE_F32, 6, 7.0f);
    put(in, KILN_DTYPE_F32, 5, 3e38f); /* [1,1] times 2 x 3: past f32's range, even into an f32 engine */
    KT_EQ_INT(kiln_weight_convert(&v, 0, in, out, R * C, &err), KILN_ERR_UNSUPPORTED);
    KT_CONTAINS(err.msg, "[1,1]");
}

int main(void) {
    KT_RUN(test_clean_values_pass);
    KT_RUN(test_nonfinite_refused);
    KT_RUN(test_first_and_last);
    KT_RUN(test_blocks);
    KT_RUN(test_f16_overflow);
    KT_RUN(test_bf16_overflow);
    KT_RUN(test_values_converted);
    KT_RUN(test_multipliers);
    return KT_END();
}
