/*
 * test_quant.c — kiln's quantized weight formats (common/quant.c): their
 * sizes, and quantize → dequantize within half a step of each value, exact
 * on the values the formats hold exactly; a plan whose quantized weight has
 * the wrong size or shape is refused. (That whole engines quantized this way
 * match HF run on the same rounded weights is test_golden's
 * test_tiny_mistral_int8 / _int4; the rounding there is written again in numpy.)
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/kiln_ops.h"
#include "common/kiln_util.h"
#include "kt.h"
#include "passes/kiln_passes.h"

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static double unit(void) {
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (double)(rng >> 11) / 9007199254740992.0;
}
static float normal(void) {
    double u = unit(), v = unit();
    return (float)(sqrt(-2.0 * log(u > 1e-300 ? u : 1e-300)) * cos(6.283185307179586 * v));
}

/* An [n, k] matrix w quantized to dtype t row by row (kiln_quant_row_ex with `method`) into a new
 * buffer of its bytes, and dequantized back into `back` (n x k floats). */
static uint8_t *quant_all(int t, int64_t n, int64_t k, const float *w, int method, float *back) {
    uint8_t *q = calloc(kiln_weight_nbytes(t, 2, (int64_t[]){n, k}), 1);
    for (int64_t r = 0; r < n; r++) kiln_quant_row_ex(t, n, k, r, w + r * k, q, method);
    kiln_dequant_rows(t, q, n, k, 0, n, back);
    return q;
}

static void test_sizes(void) {
    KT_EQ_INT((int)kiln_weight_nbytes(KILN_DTYPE_Q8, 2, (int64_t[]){3, 5}), 16 + 12);   /* codes to 16, 3 scales */
    KT_EQ_INT((int)kiln_weight_nbytes(KILN_DTYPE_Q4G32, 2, (int64_t[]){2, 64}), 64 + 32); /* 2x2 scales and mins */
    KT_EQ_INT((int)kiln_weight_nbytes(KILN_DTYPE_Q4G128, 2, (int64_t[]){4, 256}), 512 + 64);
    KT_EQ_INT((int)kiln_weight_nbytes(KILN_DTYPE_Q4G128, 2, (int64_t[]){2, 64}), 0); /* 128 does not divide 64 */
    KT_EQ_INT((int)kiln_weight_nbytes(KILN_DTYPE_Q8, 1, (int64_t[]){64}), 0);        /* matrices only */
    KT_EQ_INT((int)kiln_weight_nbytes(KILN_DTYPE_Q8, 3, (int64_t[]){2, 2, 2}), 0);
    KT_EQ_INT((int)kiln_weight_nbytes(KILN_DTYPE_BF16, 2, (int64_t[]){3, 5}), 30);
    KT_EQ_INT((int)kiln_weight_nbytes(KILN_DTYPE_F32, 1, (int64_t[]){0}), 0);
    KT_CHECK(kiln_weight_nbytes(KILN_DTYPE_F32, 4, (int64_t[]){1 << 30, 1 << 30, 1 << 30, 1 << 30}) == 0); /* overflow */
    KT_EQ_INT(kiln_dtype_size(KILN_DTYPE_Q8), 0);
    KT_CHECK(strcmp(kiln_dtype_name(KILN_DTYPE_Q4G64), "q4g64") == 0);
    KT_EQ_INT(kiln_dtype_from_name("q4g128"), KILN_DTYPE_Q4G128);
}

/* Round trip of a random [n, k] matrix with some special rows: each value within half a step of its
 * row's (group's) scale, the extremes and special rows exact. */
static void round_trip(int t) {
    const int64_t n = 9, k = 256;
    const int g = kiln_quant_group(t) ? kiln_quant_group(t) : (int)k;
    float *w = malloc(sizeof(float) * n * k), *back = malloc(sizeof(float) * n * k), *part = malloc(sizeof(float) * 2 * k);
    for (int64_t i = 0; i < n * k; i++) w[i] = normal() * (float)(1 + (i / k) % 3);
    for (int64_t j = 0; j < k; j++) w[6 * k + j] = 0.0f;  /* all zeros */
    for (int64_t j = 0; j < k; j++) w[7 * k + j] = -0.75f; /* constant */
    w[8 * k + 3] = 1e4f;                                     /* an outlier */
    uint8_t *q = quant_all(t, n, k, w, KILN_QUANT_RTN, back);
    int bad = 0;
    for (int64_t r = 0; r < n; r++)
        for (int64_t c0 = 0; c0 < k; c0 += g) {
            float lo = w[r * k + c0], hi = lo, amax = 0;
            for (int j = 0; j < g; j++) {
                float x = w[r * k + c0 + j];
                lo = x < lo ? x : lo, hi = x > hi ? x : hi, amax = fabsf(x) > amax ? fabsf(x) : amax;
            }
            const float step = t == KILN_DTYPE_Q8 ? amax / 127 : (hi - lo) / 15;
            for (int j = 0; j < g; j++) {
                const float x = w[r * k + c0 + j], y = back[r * k + c0 + j];
                if (!(fabsf(x - y) <= 0.5f * step * (1 + 1e-5f) + 1e-6f * fabsf(x))) bad++;
            }
        }
    KT_CHECKF(bad == 0, "%s: %d values further than half a step from where they were", kiln_dtype_name(t), bad);
    for (int64_t j = 0; j < k; j++) {
        KT_CHECK(back[6 * k + j] == 0.0f);
        KT_CHECK(back[7 * k + j] == -0.75f);
    }
    KT_CHECK(fabsf(back[8 * k + 3] - 1e4f) <= 1e4f * 1e-6f); /* the extreme is a code's end point */
    /* rows read alone are the rows read together */
    kiln_dequant_rows(t, q, n, k, 4, 2, part);
    KT_CHECK(memcmp(part, back + 4 * k, sizeof(float) * 2 * k) == 0);
    free(w), free(back), free(part), free(q);
}

/* FP8 E4M3 codes (kiln_e4m3_to_f32 / kiln_f32_to_e4m3), against the format written out here: every
 * code's value from its fields, every finite value encoding to its own code, ties between neighbours
 * to the even code, values past 448 saturating, NaN codes 0x7F and 0xFF. */
static void test_e4m3_codes(void) {
    int finite = 0;
    for (int c = 0; c < 256; c++) {
        const int e = (c >> 3) & 15, m = c & 7;
        const float v = kiln_e4m3_to_f32((uint8_t)c);
        if ((c & 0x7F) == 0x7F) {
            KT_CHECKF(isnan(v), "code 0x%02x is NaN", c);
            continue;
        }
        finite++;
        double want = e ? (1.0 + m / 8.0) * pow(2.0, e - 7) : m / 8.0 * pow(2.0, -6);
        if (c & 0x80) want = -want;
        KT_CHECKF((double)v == want && (signbit(v) != 0) == ((c & 0x80) != 0), "code 0x%02x is %g, want %g", c,
                  (double)v, want);
        KT_CHECKF(kiln_f32_to_e4m3(v) == c, "%g encodes to 0x%02x, want 0x%02x", (double)v, kiln_f32_to_e4m3(v), c);
    }
    KT_EQ_INT(finite, 254);
    KT_CHECK(kiln_e4m3_to_f32(0x7E) == 448.0f && kiln_e4m3_to_f32(0x01) == 0x1p-9f && kiln_e4m3_to_f32(0x08) == 0x1p-6f);
    /* between each pair of neighbouring positive values: below the midpoint the lower, above it the upper,
     * on it the even code (the one whose mantissa's last bit is 0) */
    for (int c = 0; c < 0x7E; c++) {
        const float lo = kiln_e4m3_to_f32((uint8_t)c), hi = kiln_e4m3_to_f32((uint8_t)(c + 1));
        const float mid = (lo + hi) / 2; /* exact: both have at most 4 significant bits */
        KT_EQ_INT(kiln_f32_to_e4m3(nextafterf(mid, 0)), c);
        KT_EQ_INT(kiln_f32_to_e4m3(nextafterf(mid, 1000)), c + 1);
        KT_CHECKF(kiln_f32_to_e4m3(mid) == (c % 2 ? c + 1 : c), "tie %g between 0x%02x and 0x%02x gave 0x%02x",
                  (double)mid, c, c + 1, kiln_f32_to_e4m3(mid));
        KT_CHECKF(kiln_f32_to_e4m3(-mid) == (0x80 | (c % 2 ? c + 1 : c)), "tie %g", (double)-mid);
    }
    /* saturation: finite values past 448 (a code 480 would be the next) */
    const float big[] = {448.0f, 448.5f, 463.9f, 464.0f, 500.0f, 1e30f, 3.4e38f};
    for (size_t i = 0; i < sizeof big / sizeof big[0]; i++) {
        KT_EQ_INT(kiln_f32_to_e4m3(big[i]), 0x7E);
        KT_EQ_INT(kiln_f32_to_e4m3(-big[i]), 0xFE);
    }
    /* below half the smallest subnormal: zero of the value's sign; at half of it: the tie goes to 0 */
    KT_EQ_INT(kiln_f32_to_e4m3(0x1p-11f), 0x00);
    KT_EQ_INT(kiln_f32_to_e4m3(0x1p-10f), 0x00);
    KT_EQ_INT(kiln_f32_to_e4m3(nextafterf(0x1p-10f, 1)), 0x01);
    KT_EQ_INT(kiln_f32_to_e4m3(-0x1p-11f), 0x80);
    KT_EQ_INT(kiln_f32_to_e4m3(NAN), 0x7F);
    KT_EQ_INT((int)kiln_weight_nbytes(KILN_DTYPE_FP8, 2, (int64_t[]){3, 5}), 16 + 12); /* q8's layout */
    KT_EQ_INT((int)kiln_weight_nbytes(KILN_DTYPE_FP8, 1, (int64_t[]){64}), 0);
    KT_EQ_INT(kiln_dtype_from_name("fp8"), KILN_DTYPE_FP8);
    KT_CHECK(kiln_dtype_is_quant(KILN_DTYPE_FP8) && !kiln_dtype_is_quant(KILN_DTYPE_I64));
    KT_EQ_INT(kiln_dtype_size(KILN_DTYPE_FP8), 0); /* quantized: kiln_weight_nbytes */
}

/* --quant fp8's rows: scale max|w| / 448, each value the nearest E4M3 code times it (within half a
 * code step: 2^-4 of the value for normals, 2^-10 scale for subnormals), the largest exact, zero rows
 * zero, and the codes what kiln_f32_to_e4m3 gives for w / scale. */
static void test_fp8_rows(void) {
    const int64_t n = 6, k = 512;
    float *w = malloc(sizeof(float) * n * k), *back = malloc(sizeof(float) * n * k);
    for (int64_t i = 0; i < n * k; i++) w[i] = normal() * (float)(1 + (i / k)) * 0.01f;
    for (int64_t j = 0; j < k; j++) w[4 * k + j] = 0.0f;
    w[5 * k + 7] = 300.0f; /* an outlier: most of the row goes subnormal or zero */
    uint8_t *q = quant_all(KILN_DTYPE_FP8, n, k, w, KILN_QUANT_MSE, back);
    int bad = 0, sub = 0;
    for (int64_t r = 0; r < n; r++) {
        float mx = 0, s;
        for (int64_t j = 0; j < k; j++) mx = fabsf(w[r * k + j]) > mx ? fabsf(w[r * k + j]) : mx;
        memcpy(&s, q + kiln_quant_scales_offset(KILN_DTYPE_FP8, n, k) + 4 * r, 4);
        KT_CHECK(s == mx / 448.0f);
        for (int64_t j = 0; j < k; j++) {
            const float x = w[r * k + j], y = back[r * k + j];
            const uint8_t c = q[r * k + j];
            if (c != (s > 0 ? kiln_f32_to_e4m3(x / s) : 0)) bad++;
            sub += (c & 0x78) == 0 && (c & 7);
            if (!(fabsf(x - y) <= fabsf(x) / 16 * (1 + 1e-5f) + s * 0x1p-10f)) bad++;
            if (fabsf(x) == mx && !(fabsf(x - y) <= mx * 1e-6f)) bad++;
        }
    }
    KT_CHECKF(bad == 0, "fp8: %d values off", bad);
    KT_CHECK(sub > 0); /* the outlier row exercised the subnormal codes */
    for (int64_t j = 0; j < k; j++) KT_CHECK(back[4 * k + j] == 0.0f);
    free(w), free(back), free(q);
}

/* W8A8's per-token activations (kiln_act_fp8_row, which the GPU's kiln_act_fp8 matches bit for bit):
 * scale amax / 448; the largest |x| becomes +-448 exactly; every value comes back within half an E4M3
 * step (2^-4 relative for normals, 2^-10 of the scale for subnormals) with its sign; a row of zeros
 * gets scale 0 and zero codes; a row whose values are all tiny scales up (no flush to zero). */
static void test_act_fp8_rows(void) {
    const int64_t k = 4096;
    float *x = malloc(sizeof(float) * k);
    uint8_t *c = malloc(k);
    for (int rep = 0; rep < 4; rep++) {
        const float mag = rep == 0 ? 1.0f : rep == 1 ? 1e-6f : rep == 2 ? 3e4f : 1.0f;
        for (int64_t j = 0; j < k; j++) x[j] = normal() * mag;
        if (rep == 3) x[11] = 500.0f; /* an outlier: much of the row subnormal */
        float s = -1, amax = 0;
        for (int64_t j = 0; j < k; j++) amax = fmaxf(amax, fabsf(x[j]));
        kiln_act_fp8_row(x, k, 0, c, &s);
        KT_CHECK(s == amax / 448.0f);
        int bad = 0, top = 0;
        for (int64_t j = 0; j < k; j++) {
            const float y = kiln_e4m3_to_f32(c[j]) * s;
            if (!(fabsf(x[j] - y) <= fabsf(x[j]) / 16 * (1 + 1e-5f) + s * 0x1p-10f)) bad++;
            if (x[j] != 0 && y != 0 && (x[j] < 0) != (y < 0)) bad++;
            if (fabsf(x[j]) == amax) top += (c[j] & 0x7F) == 0x7E;
        }
        KT_CHECKF(bad == 0 && top >= 1, "row %d (scale %g): %d values off, %d at 448", rep, (double)s, bad, top);
    }
    /* groups of 128 over 320 columns (the last 64): each group's own scale, its largest at 448 */
    for (int64_t j = 0; j < 320; j++) x[j] = normal() * (j < 128 ? 1.0f : j < 256 ? 1e-3f : 50.0f);
    float gs[3] = {-1, -1, -1};
    kiln_act_fp8_row(x, 320, 128, c, gs);
    for (int g = 0; g < 3; g++) {
        float amax = 0;
        int top = 0, bad = 0;
        for (int64_t j = g * 128; j < 320 && j < (g + 1) * 128; j++) amax = fmaxf(amax, fabsf(x[j]));
        for (int64_t j = g * 128; j < 320 && j < (g + 1) * 128; j++) {
            top += fabsf(x[j]) == amax && (c[j] & 0x7F) == 0x7E;
            bad += !(fabsf(x[j] - kiln_e4m3_to_f32(c[j]) * gs[g]) <= fabsf(x[j]) / 16 * (1 + 1e-5f) + gs[g] * 0x1p-10f);
        }
        KT_CHECKF(gs[g] == amax / 448.0f && top >= 1 && bad == 0, "group %d: scale %g (amax %g), %d off", g,
                  (double)gs[g], (double)amax, bad);
    }
    for (int64_t j = 0; j < k; j++) x[j] = 0.0f;
    float s = -1;
    kiln_act_fp8_row(x, k, 0, c, &s);
    KT_CHECK(s == 0.0f);
    int nz = 0;
    for (int64_t j = 0; j < k; j++) nz += c[j] != 0;
    KT_EQ_INT(nz, 0);
    free(x), free(c);
}

/* fp8g128: fp8's codes with a scale per row and 128 columns (the last group the rest of the row): the
 * size, each group's scale max|w| / 448 over its columns, the codes kiln_f32_to_e4m3(w / scale), and the
 * values back exactly e4m3(code) * scale. K = 320: two full groups and one of 64. */
static void test_fp8g128_rows(void) {
    const int64_t n = 5, k = 320, ng = 3;
    KT_EQ_INT((int)kiln_quant_groups(KILN_DTYPE_FP8G128, k), 3);
    KT_EQ_INT((int)kiln_quant_groups(KILN_DTYPE_FP8G128, 256), 2);
    KT_EQ_INT((int)kiln_quant_groups(KILN_DTYPE_Q4G128, 256), 2);
    KT_EQ_INT((int)kiln_quant_groups(KILN_DTYPE_FP8, k), 1);
    KT_EQ_INT(kiln_quant_bits(KILN_DTYPE_FP8G128), 8);
    KT_EQ_INT(kiln_quant_bits(KILN_DTYPE_Q4G32), 4);
    KT_EQ_INT(kiln_quant_bits(KILN_DTYPE_BF16), 0);
    KT_CHECK(kiln_quant_is_fp8(KILN_DTYPE_FP8G128) && kiln_quant_is_fp8(KILN_DTYPE_FP8) && !kiln_quant_is_fp8(KILN_DTYPE_Q8));
    KT_EQ_INT(kiln_dtype_from_name("fp8g128"), KILN_DTYPE_FP8G128);
    KT_CHECK(kiln_dtype_is_quant(KILN_DTYPE_FP8G128));
    /* codes, then at 16 bytes the [n, ceil(k / 128)] scales; no minimums */
    KT_EQ_INT((int)kiln_weight_nbytes(KILN_DTYPE_FP8G128, 2, (int64_t[]){n, k}), 1600 + 5 * 3 * 4);
    KT_EQ_INT((int)kiln_weight_nbytes(KILN_DTYPE_FP8G128, 2, (int64_t[]){3, 64}), 192 + 3 * 4);
    KT_EQ_INT((int)kiln_quant_scales_offset(KILN_DTYPE_FP8G128, 3, 5), 16);
    KT_EQ_INT((int)kiln_quant_mins_offset(KILN_DTYPE_FP8G128, n, k), 0);
    float *w = malloc(sizeof(float) * n * k), *back = malloc(sizeof(float) * n * k);
    for (int64_t i = 0; i < n * k; i++) w[i] = normal() * (float)(1 + (i % k) / 128) * 0.01f; /* groups differ */
    uint8_t *q = quant_all(KILN_DTYPE_FP8G128, n, k, w, KILN_QUANT_RTN, back);
    int bad = 0;
    for (int64_t r = 0; r < n; r++)
        for (int64_t gi = 0; gi < ng; gi++) {
            float mx = 0, sc;
            for (int64_t j = gi * 128; j < (gi + 1) * 128 && j < k; j++) mx = fmaxf(mx, fabsf(w[r * k + j]));
            memcpy(&sc, q + kiln_quant_scales_offset(KILN_DTYPE_FP8G128, n, k) + 4 * (r * ng + gi), 4);
            bad += sc != mx / 448.0f;
            for (int64_t j = gi * 128; j < (gi + 1) * 128 && j < k; j++) {
                const uint8_t c = q[r * k + j];
                bad += c != kiln_f32_to_e4m3(w[r * k + j] / sc);
                bad += back[r * k + j] != kiln_e4m3_to_f32(c) * sc;
            }
        }
    KT_CHECKF(bad == 0, "fp8g128: %d scales, codes or values off", bad);
    free(w), free(back), free(q);
}

static void test_round_trip(void) {
    round_trip(KILN_DTYPE_Q8);
    round_trip(KILN_DTYPE_Q4G32);
    round_trip(KILN_DTYPE_Q4G64);
    round_trip(KILN_DTYPE_Q4G128);
}

/* --quant-method mse: every group's squared error at most RTN's (RTN's range is among its candidates),
 * and less over a matrix of normal values, whose extremes are worth clipping; q8 is the same either way. */
static void test_mse_method(void) {
    const int64_t n = 16, k = 256;
    float *w = malloc(sizeof(float) * n * k), *a = malloc(sizeof(float) * n * k), *b = malloc(sizeof(float) * n * k);
    for (int64_t i = 0; i < n * k; i++) w[i] = normal();
    const int types[2] = {KILN_DTYPE_Q4G128, KILN_DTYPE_Q4G32};
    for (int ti = 0; ti < 2; ti++) {
        const int t = types[ti], g = kiln_quant_group(t);
        const uint64_t nb = kiln_weight_nbytes(t, 2, (int64_t[]){n, k});
        uint8_t *qa = calloc(nb, 1), *qb = calloc(nb, 1);
        for (int64_t r = 0; r < n; r++) {
            kiln_quant_row_ex(t, n, k, r, w + r * k, qa, KILN_QUANT_RTN);
            kiln_quant_row_ex(t, n, k, r, w + r * k, qb, KILN_QUANT_MSE);
        }
        kiln_dequant_rows(t, qa, n, k, 0, n, a);
        kiln_dequant_rows(t, qb, n, k, 0, n, b);
        double ea = 0, eb = 0;
        int worse = 0;
        for (int64_t c = 0; c < n * k; c += g) {
            double ga = 0, gb = 0;
            for (int j = 0; j < g; j++) {
                ga += (double)(a[c + j] - w[c + j]) * (a[c + j] - w[c + j]);
                gb += (double)(b[c + j] - w[c + j]) * (b[c + j] - w[c + j]);
            }
            worse += gb > ga * (1 + 1e-9);
            ea += ga, eb += gb;
        }
        KT_CHECKF(worse == 0, "%s: %d groups with a larger error than RTN's", kiln_dtype_name(t), worse);
        KT_CHECKF(eb < 0.95 * ea, "%s: squared error %g, RTN's %g", kiln_dtype_name(t), eb, ea);
        fprintf(stderr, "  %s: squared error %.4g (RTN %.4g)\n", kiln_dtype_name(t), eb, ea);
        free(qa), free(qb);
    }
    const uint64_t nb = kiln_weight_nbytes(KILN_DTYPE_Q8, 2, (int64_t[]){n, k});
    uint8_t *qa = calloc(nb, 1), *qb = calloc(nb, 1);
    for (int64_t r = 0; r < n; r++) {
        kiln_quant_row_ex(KILN_DTYPE_Q8, n, k, r, w + r * k, qa, KILN_QUANT_RTN);
        kiln_quant_row_ex(KILN_DTYPE_Q8, n, k, r, w + r * k, qb, KILN_QUANT_MSE);
    }
    KT_CHECK(memcmp(qa, qb, nb) == 0);
    free(qa), free(qb), free(w), free(a), free(b);
}

/* A published checkpoint's 4-bit matrix (AWQ, GPTQ or compressed-tensors, packed here from the
 * formats' documentation: kiln_ops.h's kiln_qsrc) repacked into q4gG rows of a larger weight (as
 * pack-weights places them) dequantizes to exactly (q - z) * s, every zero 0..16 (GPTQ v1's stored
 * 15 + 1) and fp16 and bf16 scales included, and a symmetric compressed-tensors matrix (no zeros:
 * `sym`) to (q - 8) * s; a NaN scale is reported at its index. */
static void check_repack(kiln_qsrc_format fmt, int zero_offset, bool sym, kiln_dtype sdt, int t) {
    enum { N = 16, K = 256, OFF = 5, ROWS = N + 8 }; /* the matrix's rows land at OFF..OFF+N-1 of ROWS */
    const int g = kiln_quant_group(t), groups = K / g;
    static int q[N][K], z[N][K / 32];
    static uint16_t s[K / 32][N]; /* [groups, N] */
    static uint32_t qweight[K * N / 8], qzeros[K / 32 * N / 8];
    memset(qweight, 0, sizeof qweight), memset(qzeros, 0, sizeof qzeros);
    static const int awq_order[8] = {0, 2, 4, 6, 1, 3, 5, 7};
    for (int n = 0; n < N; n++) {
        for (int k = 0; k < K; k++) q[n][k] = (int)(unit() * 16) & 15;
        for (int gi = 0; gi < groups; gi++) {
            z[n][gi] = sym ? 8 : (n * 7 + gi) % 16; /* every stored value */
            const float sc = (float)(normal() * 0.01);
            s[gi][n] = sdt == KILN_DTYPE_BF16 ? kiln_f32_to_bf16(sc) : kiln_f32_to_f16(sc);
        }
    }
    for (int n = 0; n < N; n++)
        for (int k = 0; k < K; k++) {
            if (fmt == KILN_QSRC_AWQ) { /* [K, N/8], nibble i = column 8j + awq_order[i] */
                int i = 0;
                while (awq_order[i] != n % 8) i++;
                qweight[k * (N / 8) + n / 8] |= (uint32_t)q[n][k] << (4 * i);
                if (k % g == 0) qzeros[(k / g) * (N / 8) + n / 8] |= (uint32_t)z[n][k / g] << (4 * i);
            } else if (fmt == KILN_QSRC_CT) { /* [N, K/8] along K; zeros [N/8, K/G] along N */
                qweight[n * (K / 8) + k / 8] |= (uint32_t)q[n][k] << (4 * (k % 8));
                if (k % g == 0) qzeros[(n / 8) * groups + k / g] |= (uint32_t)z[n][k / g] << (4 * (n % 8));
            } else { /* [K/8, N], nibble i = row 8r + i; zeros [K/G, N/8] along N */
                qweight[(k / 8) * N + n] |= (uint32_t)q[n][k] << (4 * (k % 8));
                if (k % g == 0) qzeros[(k / g) * (N / 8) + n / 8] |= (uint32_t)z[n][k / g] << (4 * (n % 8));
            }
        }
    /* the little-endian bytes the checkpoint holds */
    static uint8_t qwb[sizeof qweight], qzb[sizeof qzeros], sb[sizeof s];
    for (size_t i = 0; i < sizeof qweight / 4; i++) kiln_wr_u32(qwb + 4 * i, qweight[i]);
    for (size_t i = 0; i < sizeof qzeros / 4; i++) kiln_wr_u32(qzb + 4 * i, qzeros[i]);
    for (int gi = 0; gi < groups; gi++)
        for (int n = 0; n < N; n++) {
            const int at = fmt == KILN_QSRC_CT ? n * groups + gi : gi * N + n; /* [N, K/G] or [K/G, N] */
            sb[2 * at] = (uint8_t)s[gi][n], sb[2 * at + 1] = (uint8_t)(s[gi][n] >> 8);
        }
    const kiln_qsrc src = {.format = fmt, .zero_offset = zero_offset, .qweight = qwb, .qzeros = sym ? NULL : qzb,
                           .scales = sb, .scales_dtype = sdt};
    uint8_t *out = calloc(kiln_weight_nbytes(t, 2, (int64_t[]){ROWS, K}), 1);
    float *row = malloc(K * sizeof *row);
    int exact = 1;
    for (int n = 0; n < N; n++) KT_EQ_INT((int)kiln_quant_repack_row(&src, t, N, K, n, ROWS, OFF + n, out), -1);
    for (int n = 0; n < N; n++) {
        kiln_dequant_rows(t, out, ROWS, K, OFF + n, 1, row);
        for (int k = 0; k < K; k++) {
            const float sc = sdt == KILN_DTYPE_BF16 ? kiln_bf16_to_f32(s[k / g][n]) : kiln_f16_to_f32(s[k / g][n]);
            const float want = (float)(q[n][k] - (z[n][k / g] + zero_offset)) * sc;
            exact &= row[k] == want;
        }
    }
    KT_CHECKF(exact, "format %d, zero offset %d%s, %s scales, %s: repacked values differ from (q - z) * s", (int)fmt,
              zero_offset, sym ? ", symmetric" : "", kiln_dtype_name(sdt), kiln_dtype_name((kiln_dtype)t));
    /* a NaN scale at row 3, group 1: flat index N + 3 of [groups, N] scales, groups + 1 of [N, groups] */
    const int bad = fmt == KILN_QSRC_CT ? 3 * groups + 1 : N + 3;
    KT_EQ_INT((int)kiln_qsrc_scale_index(&src, N, K, g, 3, 1), bad);
    sb[2 * bad] = 0x00, sb[2 * bad + 1] = sdt == KILN_DTYPE_BF16 ? 0x7f : 0x7e;
    if (sdt == KILN_DTYPE_BF16) sb[2 * bad] = 0xc0;
    KT_EQ_INT((int)kiln_quant_repack_row(&src, t, N, K, 3, ROWS, OFF + 3, out), bad);
    free(out);
    free(row);
}

/* n random E4M3 codes, every finite one possible (the two NaN codes moved one down). */
static void random_finite_e4m3(uint8_t *codes, int n) {
    for (int i = 0; i < n; i++) {
        uint8_t c = (uint8_t)(unit() * 256);
        codes[i] = (c & 0x7F) == 0x7F ? (uint8_t)(c - 1) : c;
    }
}

/* Scale i of a checkpoint's scales of dtype sdt (F32, F16 or BF16, little-endian) set to f as that dtype
 * rounds it; returns the stored value (exact in f32). */
static float put_scale(uint8_t *sb, int i, kiln_dtype sdt, float f) {
    if (sdt == KILN_DTYPE_F32) {
        uint32_t u;
        memcpy(&u, &f, 4);
        kiln_wr_u32(sb + 4 * i, u);
        return f;
    }
    const uint16_t h = sdt == KILN_DTYPE_BF16 ? kiln_f32_to_bf16(f) : kiln_f32_to_f16(f);
    sb[2 * i] = (uint8_t)h, sb[2 * i + 1] = (uint8_t)(h >> 8);
    return sdt == KILN_DTYPE_BF16 ? kiln_bf16_to_f32(h) : kiln_f16_to_f32(h);
}

/* An FP8 checkpoint's [N, K] E4M3 matrix (every finite code, in random order) with one scale per tensor
 * or per row, of dtype sdt, repacked into rows OFF.. of an fp8 weight: the codes as they are, each value
 * e4m3(code) * scale exactly (the scale converted to f32 exactly); a NaN code (0x7F, 0xFF) returns its column. */
static void check_repack_fp8(kiln_qsrc_format fmt, bool per_row, kiln_dtype sdt) {
    enum { N = 12, K = 96, OFF = 3, ROWS = N + 5 };
    static uint8_t codes[N * K], sb[N * 4];
    float sc[N];
    random_finite_e4m3(codes, N * K);
    for (int r = 0; r < (per_row ? N : 1); r++) sc[r] = put_scale(sb, r, sdt, (float)(0.001 + unit() * 0.01));
    const kiln_qsrc src = {.format = fmt, .qweight = codes, .scales = sb, .scales_dtype = sdt, .fp8_row_scales = per_row};
    uint8_t *out = calloc(kiln_weight_nbytes(KILN_DTYPE_FP8, 2, (int64_t[]){ROWS, K}), 1);
    float row[K];
    int exact = 1;
    for (int n = 0; n < N; n++) KT_EQ_INT((int)kiln_quant_repack_fp8_row(&src, K, n, ROWS, OFF + n, out), -1);
    for (int n = 0; n < N; n++) {
        exact &= memcmp(out + (size_t)(OFF + n) * K, codes + (size_t)n * K, K) == 0;
        KT_EQ_INT((int)kiln_qsrc_scale_index(&src, N, K, 0, n, 0), per_row ? n : 0);
        kiln_dequant_rows(KILN_DTYPE_FP8, out, ROWS, K, OFF + n, 1, row);
        for (int k = 0; k < K; k++) exact &= row[k] == kiln_e4m3_to_f32(codes[n * K + k]) * sc[per_row ? n : 0];
    }
    KT_CHECKF(exact, "format %d, %s scales per %s: repacked codes or values differ", (int)fmt, kiln_dtype_name(sdt),
              per_row ? "row" : "tensor");
    codes[5 * K + 17] = 0xFF, codes[5 * K + 40] = 0x7F; /* the first NaN of row 5 is reported */
    KT_EQ_INT((int)kiln_quant_repack_fp8_row(&src, K, 5, ROWS, OFF + 5, out), 17);
    codes[5 * K + 17] = 0x7E; /* 448 */
    KT_EQ_INT((int)kiln_quant_repack_fp8_row(&src, K, 5, ROWS, OFF + 5, out), 40);
    codes[5 * K + 40] = 0x00;
    KT_EQ_INT((int)kiln_quant_repack_fp8_row(&src, K, 5, ROWS, OFF + 5, out), -1);
    free(out);
}

/* A block-FP8 checkpoint's [N, K] matrix with scales per block of BN rows and 128 columns, [ceil(N / BN),
 * ceil(K / 128)] of dtype sdt, repacked into rows OFF.. of an fp8g128 weight: the codes as they are, each
 * row's group g the scale of block (row / BN, g), every value e4m3(code) * scale exactly. K = 320: the
 * last block 64 columns wide; N = 10 with BN = 4: the last block 2 rows high. */
static void check_repack_fp8_block(int bn, kiln_dtype sdt) {
    enum { N = 10, K = 320, OFF = 2, ROWS = N + 3, KB = 3 };
    static uint8_t codes[N * K], sb[N * KB * 4];
    float sc[N * KB];
    random_finite_e4m3(codes, N * K);
    const int nbr = (N + bn - 1) / bn;
    for (int i = 0; i < nbr * KB; i++) sc[i] = put_scale(sb, i, sdt, (float)(0.001 + unit() * 0.01));
    const kiln_qsrc src = {.format = KILN_QSRC_FP8_BLOCK, .qweight = codes, .scales = sb, .scales_dtype = sdt,
                           .block_n = bn, .block_k = 128};
    uint8_t *out = calloc(kiln_weight_nbytes(KILN_DTYPE_FP8G128, 2, (int64_t[]){ROWS, K}), 1);
    float row[K];
    int exact = 1;
    for (int n = 0; n < N; n++) KT_EQ_INT((int)kiln_quant_repack_fp8_row(&src, K, n, ROWS, OFF + n, out), -1);
    for (int n = 0; n < N; n++) {
        exact &= memcmp(out + (size_t)(OFF + n) * K, codes + (size_t)n * K, K) == 0;
        KT_EQ_INT((int)kiln_qsrc_scale_index(&src, N, K, 128, n, 2), n / bn * KB + 2);
        kiln_dequant_rows(KILN_DTYPE_FP8G128, out, ROWS, K, OFF + n, 1, row);
        for (int k = 0; k < K; k++)
            exact &= row[k] == kiln_e4m3_to_f32(codes[n * K + k]) * sc[n / bn * KB + k / 128];
    }
    KT_CHECKF(exact, "block FP8 %dx128, %s scales: repacked codes or values differ", bn, kiln_dtype_name(sdt));
    codes[7 * K + 300] = 0xFF; /* a NaN code in the short last block is reported */
    KT_EQ_INT((int)kiln_quant_repack_fp8_row(&src, K, 7, ROWS, OFF + 7, out), 300);
    codes[7 * K + 300] = 0;
    free(out);
}

static void test_repack_fp8_block_checkpoint(void) {
    check_repack_fp8_block(128, KILN_DTYPE_F32);
    check_repack_fp8_block(4, KILN_DTYPE_F32);
    check_repack_fp8_block(1, KILN_DTYPE_BF16);
}

static void test_repack_fp8_checkpoint(void) {
    check_repack_fp8(KILN_QSRC_FP8, false, KILN_DTYPE_F32);
    check_repack_fp8(KILN_QSRC_FP8, false, KILN_DTYPE_BF16);
    check_repack_fp8(KILN_QSRC_CT_FP8, false, KILN_DTYPE_F16);
    check_repack_fp8(KILN_QSRC_CT_FP8, true, KILN_DTYPE_BF16);
    check_repack_fp8(KILN_QSRC_CT_FP8, true, KILN_DTYPE_F32);
}

static void test_repack_checkpoint(void) {
    check_repack(KILN_QSRC_AWQ, 0, false, KILN_DTYPE_F16, KILN_DTYPE_Q4G32);
    check_repack(KILN_QSRC_AWQ, 0, false, KILN_DTYPE_BF16, KILN_DTYPE_Q4G128);
    check_repack(KILN_QSRC_GPTQ, 1, false, KILN_DTYPE_F16, KILN_DTYPE_Q4G64);
    check_repack(KILN_QSRC_GPTQ, 0, false, KILN_DTYPE_F16, KILN_DTYPE_Q4G128);
    check_repack(KILN_QSRC_GPTQ, 1, false, KILN_DTYPE_BF16, KILN_DTYPE_Q4G32);
    check_repack(KILN_QSRC_CT, 0, false, KILN_DTYPE_F16, KILN_DTYPE_Q4G32);
    check_repack(KILN_QSRC_CT, 0, false, KILN_DTYPE_BF16, KILN_DTYPE_Q4G64);
    check_repack(KILN_QSRC_CT, 0, true, KILN_DTYPE_BF16, KILN_DTYPE_Q4G128);
    check_repack(KILN_QSRC_CT, 0, true, KILN_DTYPE_F16, KILN_DTYPE_Q4G32);
}

/* --quant auto's solver (passes/quant_choose.c) against brute force: random instances of 1..7 items
 * with 1..5 options, budgets from below the smallest mix to above the largest. With unit 1 the
 * choice must be optimal (its damage equal to the best of every combination that fits) and fit. */
static void test_choose_brute_force(void) {
    int checked = 0, refused = 0;
    for (int trial = 0; trial < 400; trial++) {
        kiln_quant_item it[7];
        const int n = 1 + (int)(unit() * 7);
        uint64_t lo = 0, hi = 0;
        for (int i = 0; i < n; i++) {
            it[i].n = 1 + (int)(unit() * 5);
            uint64_t mn = UINT64_MAX, mx = 0;
            for (int j = 0; j < it[i].n; j++) {
                it[i].bytes[j] = 1 + (uint64_t)(unit() * 40);
                it[i].damage[j] = j == 0 ? 0 : unit() * unit(); /* keep: no damage */
                mn = it[i].bytes[j] < mn ? it[i].bytes[j] : mn;
                mx = it[i].bytes[j] > mx ? it[i].bytes[j] : mx;
            }
            lo += mn, hi += mx;
        }
        const uint64_t budget = lo > 3 ? lo - 3 + (uint64_t)(unit() * (double)(hi - lo + 10)) : (uint64_t)(unit() * 60);
        /* brute force over every combination */
        double best = INFINITY;
        int idx[7] = {0};
        for (;;) {
            uint64_t b = 0;
            double d = 0;
            for (int i = 0; i < n; i++) b += it[i].bytes[idx[i]], d += it[i].damage[idx[i]];
            if (b <= budget && d < best) best = d;
            int i = 0;
            while (i < n && ++idx[i] == it[i].n) idx[i++] = 0;
            if (i == n) break;
        }
        int pick[7];
        uint64_t min_bytes = 0;
        kiln_error err = {0};
        kiln_status st = kiln_quant_choose(it, n, budget, 1, pick, &min_bytes, &err);
        KT_EQ_INT((int)min_bytes, (int)lo);
        if (best == INFINITY) { /* nothing fits: refused, naming the smallest mix */
            KT_EQ_INT(st, KILN_ERR_INVALID_ARG);
            KT_CONTAINS(err.msg, "smallest formats take");
            refused++;
            continue;
        }
        KT_REQUIRE(st == KILN_OK);
        uint64_t b = 0;
        double d = 0;
        for (int i = 0; i < n; i++) {
            KT_REQUIRE(pick[i] >= 0 && pick[i] < it[i].n);
            b += it[i].bytes[pick[i]], d += it[i].damage[pick[i]];
        }
        KT_CHECKF(b <= budget, "trial %d: %llu bytes over the budget %llu", trial, (unsigned long long)b,
                  (unsigned long long)budget);
        KT_CHECKF(fabs(d - best) <= 1e-12, "trial %d: damage %.17g, brute force %.17g", trial, d, best);
        checked++;
    }
    KT_CHECK(checked > 200 && refused > 10); /* both sides of the boundary were exercised */
}

/* Units larger than a byte: the budget still holds in bytes (costs round up), a budget the smallest
 * options fit but the rounding does not gets the smallest options, everything fits at the top, and
 * the damage falls as the budget grows. */
static void test_choose_units(void) {
    kiln_quant_item it[3] = {
        {3, {1000, 500, 260}, {0, 0.01, 0.2}},
        {3, {4000, 2100, 1100}, {0, 0.05, 0.9}},
        {2, {9000, 4600}, {0, 0.3}},
    };
    int pick[3];
    uint64_t min_bytes;
    kiln_error err = {0};
    KT_REQUIRE(kiln_quant_choose(it, 3, 28672, 4096, pick, &min_bytes, &err) == KILN_OK);
    KT_EQ_INT((int)min_bytes, 260 + 1100 + 4600);
    KT_CHECK(pick[0] == 0 && pick[1] == 0 && pick[2] == 0); /* 7 units of 4096: 1 + 1 + 3 fit */
    KT_REQUIRE(kiln_quant_choose(it, 3, 20000, 4096, pick, &min_bytes, &err) == KILN_OK);
    KT_CHECK(pick[0] == 0 && pick[1] == 0 && pick[2] == 1); /* 4 units: the third matrix gives way */
    KT_REQUIRE(kiln_quant_choose(it, 3, 14000, 4096, pick, &min_bytes, &err) == KILN_OK);
    KT_CHECK(pick[0] == 2 && pick[1] == 2 && pick[2] == 1); /* 3 units < 1 + 1 + 2: the smallest, which fit */
    KT_EQ_INT(kiln_quant_choose(it, 3, 5959, 4096, pick, &min_bytes, &err), KILN_ERR_INVALID_ARG);
    double last = INFINITY;
    for (uint64_t budget = 5960; budget <= 15000; budget += 250) {
        KT_REQUIRE(kiln_quant_choose(it, 3, budget, 1, pick, &min_bytes, &err) == KILN_OK);
        uint64_t b = 0;
        double d = 0;
        for (int i = 0; i < 3; i++) b += it[i].bytes[pick[i]], d += it[i].damage[pick[i]];
        KT_CHECK(b <= budget);
        KT_CHECKF(d <= last, "budget %llu: damage %g after %g", (unsigned long long)budget, d, last);
        last = d;
    }
    KT_CHECK(last == 0);
}

int main(void) {
    KT_RUN(test_choose_brute_force);
    KT_RUN(test_choose_units);
    KT_RUN(test_sizes);
    KT_RUN(test_e4m3_codes);
    KT_RUN(test_fp8_rows);
    KT_RUN(test_round_trip);
    KT_RUN(test_mse_method);
    KT_RUN(test_repack_checkpoint);
    KT_RUN(test_repack_fp8_checkpoint);
    KT_RUN(test_repack_fp8_block_checkpoint);
    KT_RUN(test_fp8g128_rows);
    KT_RUN(test_act_fp8_rows);
    return KT_END();
}
