/*
 * quant.c — kiln's quantized weight formats (kiln_ops.h: q8, q4gG): their
 * sizes, and the reference quantize and dequantize every other part (the
 * compiler's writer, the CPU executor's load, tests) goes through.
 *
 * Layout of a [N, K] weight: the data row-major (q8: one int8 per element;
 * q4: two 4-bit codes per byte, column 2j in the low nibble), then at the
 * next 16-byte boundary the scales as f32, [N] for q8 and [N, K/G] for q4,
 * then for q4 the group minimums, [N, K/G] f32. fp8 is q8's layout with an
 * FP8 E4M3 code per element (OCP "e4m3fn") instead of an int8, the scale
 * max|w| / 448. Scales lead to one rounding per element, as round-to-nearest
 * quantization (RTN) does.
 *
 * kiln_quant_repack_row reads a published checkpoint's AWQ, GPTQ or
 * compressed-tensors matrix (kiln_ops.h: kiln_qsrc) into the same layout:
 * its codes are copied and its zero z and fp16 scale s become the group's
 * minimum -z * s, exact in f32 (z has 5 bits, s 11), so code * s + min is
 * (q - z) * s exactly: no value changes. compressed-tensors stores signed
 * codes and zeros plus 8; the nibbles are taken as they are (the offsets
 * cancel in q - z) and a symmetric matrix, which has no zeros, gets z = 8.
 * kiln_quant_repack_fp8_row reads an FP8 checkpoint's matrix (E4M3 codes
 * with one scale per tensor or per row) into fp8: the codes are copied and
 * the row's scale becomes its f32 scale, so nothing is rounded; a block-FP8
 * one (a scale per block of 128 x 128) into fp8g128, which has a scale per
 * row and group of 128 columns: each group gets its block's.
 */
#include "kiln_ops.h"
#include "kiln_util.h"

#include <math.h>
#include <stdbool.h>
#include <string.h>

int kiln_dtype_is_quant(int t) {
    return (t >= KILN_DTYPE_Q8 && t <= KILN_DTYPE_Q4G128) || t == KILN_DTYPE_FP8 || t == KILN_DTYPE_FP8G128;
}

int kiln_quant_bits(int t) { return !kiln_dtype_is_quant(t) ? 0 : t >= KILN_DTYPE_Q4G32 && t <= KILN_DTYPE_Q4G128 ? 4 : 8; }

int kiln_quant_is_fp8(int t) { return t == KILN_DTYPE_FP8 || t == KILN_DTYPE_FP8G128; }

int kiln_quant_gemv_ck(int t) {
    return t == KILN_DTYPE_Q4G32 || t == KILN_DTYPE_Q4G64 || t == KILN_DTYPE_Q4G128 || t == KILN_DTYPE_FP8;
}

float kiln_e4m3_to_f32(uint8_t c) {
    const int e = (c >> 3) & 15, m = c & 7;
    if (e == 15 && m == 7) return NAN;
    /* subnormal: m * 2^-9; normal: (8 + m) * 2^(e - 10) */
    const float v = e ? ldexpf((float)(8 + m), e - 10) : ldexpf((float)m, -9);
    return c & 0x80 ? -v : v;
}

uint8_t kiln_f32_to_e4m3(float x) {
    if (isnan(x)) return 0x7F;
    const uint8_t sign = signbit(x) ? 0x80 : 0;
    const float a = fabsf(x);
    uint8_t code;
    if (a >= 448.0f) {
        code = 0x7E; /* saturate (also what the rounding below would give up to 464) */
    } else if (a < 0x1p-6f) {
        /* subnormals m * 2^-9 (m = 8 rounds up to the smallest normal, code 0x08): scaling by 2^9 is
         * exact and rintf rounds to nearest even */
        code = (uint8_t)rintf(a * 512.0f);
    } else {
        int ex;
        const float f = frexpf(a, &ex); /* a = f * 2^ex, f in [0.5, 1): the exponent is ex - 1 */
        const int m = (int)rintf((f * 2.0f - 1.0f) * 8.0f); /* exact before rintf; 8 carries into the exponent */
        const int c = ((ex - 1 + 7) << 3) + m;
        code = (uint8_t)(c > 0x7E ? 0x7E : c);
    }
    return sign | code;
}

uint8_t kiln_kv_code(float x, float scale, bool int8) {
    const float y = x / scale;
    if (!int8) return kiln_f32_to_e4m3(y);
    if (isnan(y)) return 0;
    const float r = rintf(fminf(fmaxf(y, -127.0f), 127.0f));
    return (uint8_t)(int8_t)r;
}

float kiln_kv_value(uint8_t code, float scale, bool int8) {
    return (int8 ? (float)(int8_t)code : kiln_e4m3_to_f32(code)) * scale;
}

float kiln_kv_scale_bf16(float s) {
    uint32_t u;
    memcpy(&u, &s, sizeof u);
    if ((u & 0xFFFFu) && isfinite(s)) u = (u & 0xFFFF0000u) + 0x10000u; /* up, in magnitude */
    memcpy(&s, &u, sizeof s);
    return s;
}

float kiln_kv_scale_for(float amax, bool int8) { return kiln_kv_scale_bf16(int8 ? amax / 127.0f : amax / 224.0f); }

void kiln_act_fp8_row(const float *x, int64_t k, int group, uint8_t *codes, float *scales) {
    const int64_t g = group > 0 ? group : k;
    for (int64_t j0 = 0, gi = 0; j0 < k; j0 += g, gi++) {
        const int64_t j1 = j0 + g < k ? j0 + g : k;
        float amax = 0.0f;
        for (int64_t j = j0; j < j1; j++) amax = fmaxf(amax, fabsf(x[j]));
        const float inv = amax > 0.0f ? 448.0f / amax : 0.0f;
        scales[gi] = amax / 448.0f;
        for (int64_t j = j0; j < j1; j++) codes[j] = kiln_f32_to_e4m3(x[j] * inv);
    }
}

int kiln_quant_group(int t) {
    switch (t) {
    case KILN_DTYPE_Q4G32: return 32;
    case KILN_DTYPE_Q4G64: return 64;
    case KILN_DTYPE_Q4G128: return 128;
    case KILN_DTYPE_FP8G128: return 128;
    default: return 0;
    }
}

static uint64_t align16(uint64_t n) { return (n + 15) & ~(uint64_t)15; }

int64_t kiln_quant_groups(int t, int64_t k) {
    const int g = kiln_quant_group(t);
    return !g ? 1 : t == KILN_DTYPE_FP8G128 ? (k + g - 1) / g : k / g;
}

/* Bytes of the codes of a [n, k] weight of quantized dtype t. */
static uint64_t code_bytes(int t, uint64_t n, uint64_t k) { return kiln_quant_bits(t) == 4 ? n * k / 2 : n * k; }

uint64_t kiln_weight_nbytes(int t, int ndim, const int64_t *shape) {
    if (t < 0 || t >= KILN_DTYPE_COUNT_ || ndim < 1 || ndim > KILN_MAX_DIMS) return 0;
    for (int d = 0; d < ndim; d++)
        if (shape[d] <= 0 || shape[d] > (1 << 30)) return 0;
    if (!kiln_dtype_is_quant(t)) {
        uint64_t n = (uint64_t)kiln_dtype_size((kiln_dtype)t);
        for (int d = 0; d < ndim; d++)
            if (!kiln_mul_u64(n, (uint64_t)shape[d], &n)) return 0;
        return n;
    }
    if (ndim != 2) return 0;
    const uint64_t n = (uint64_t)shape[0], k = (uint64_t)shape[1];
    const int g = kiln_quant_group(t);
    if (kiln_quant_bits(t) == 4 && (k % (uint64_t)g || k % 2)) return 0;
    const uint64_t groups = (uint64_t)kiln_quant_groups(t, (int64_t)k);
    return align16(code_bytes(t, n, k)) + n * groups * 4 * (kiln_quant_bits(t) == 4 ? 2 : 1); /* q4: minimums */
}

uint64_t kiln_quant_scales_offset(int t, int64_t n, int64_t k) {
    return align16(code_bytes(t, (uint64_t)n, (uint64_t)k));
}

uint64_t kiln_quant_mins_offset(int t, int64_t n, int64_t k) {
    return kiln_quant_bits(t) == 4 ? kiln_quant_scales_offset(t, n, k) + (uint64_t)n * (uint64_t)kiln_quant_groups(t, k) * 4
                                   : 0;
}

/* The 4-bit code of x in the range starting at lo with step s (round to nearest, clamped). */
static uint8_t code4(float x, float lo, float s) {
    const float v = s > 0 ? rintf((x - lo) / s) : 0.0f;
    return (uint8_t)(v > 15 ? 15 : v < 0 ? 0 : v);
}

/* Squared error of a group quantized with lo and step s (in double). */
static double group_error(const float *x, int g, float lo, float s) {
    double e = 0;
    for (int j = 0; j < g; j++) {
        const double d = (double)((float)code4(x[j], lo, s) * s + lo) - (double)x[j];
        e += d * d;
    }
    return e;
}

/* KILN_QUANT_MSE's grid: each end of a group's range moved in by 0, 4, ..., 20% of it. */
#define MSE_STEPS 6
#define MSE_SHRINK 0.04f

void kiln_quant_row(int t, int64_t n_rows, int64_t k, int64_t row, const float *w, uint8_t *out) {
    kiln_quant_row_ex(t, n_rows, k, row, w, out, KILN_QUANT_RTN);
}

void kiln_quant_row_ex(int t, int64_t n_rows, int64_t k, int64_t row, const float *w, uint8_t *out, int method) {
    const int g = kiln_quant_group(t);
    const int64_t groups = kiln_quant_groups(t, k);
    uint8_t *scales = out + align16(code_bytes(t, (uint64_t)n_rows, (uint64_t)k)); /* f32s, by memcpy */
    if (t == KILN_DTYPE_Q8) {
        float mx = 0;
        for (int64_t j = 0; j < k; j++) mx = fabsf(w[j]) > mx ? fabsf(w[j]) : mx;
        const float s = mx / 127.0f;
        int8_t *q = (int8_t *)(out + (size_t)row * (size_t)k);
        for (int64_t j = 0; j < k; j++) {
            float v = s > 0 ? rintf(w[j] / s) : 0.0f;
            q[j] = (int8_t)(v > 127 ? 127 : v < -127 ? -127 : v);
        }
        memcpy(scales + (size_t)row * 4, &s, sizeof s);
        return;
    }
    if (kiln_quant_is_fp8(t)) { /* scale max|w| / 448 per row (fp8) or per group (fp8g128) */
        const int64_t gk = g ? g : k;
        for (int64_t gi = 0; gi < groups; gi++) {
            const float *x = w + gi * gk;
            const int64_t len = k - gi * gk < gk ? k - gi * gk : gk; /* fp8g128's last group: the rest */
            float mx = 0;
            for (int64_t j = 0; j < len; j++) mx = fabsf(x[j]) > mx ? fabsf(x[j]) : mx;
            const float s = mx / 448.0f;
            uint8_t *q = out + (size_t)row * (size_t)k + (size_t)(gi * gk);
            for (int64_t j = 0; j < len; j++) q[j] = s > 0 ? kiln_f32_to_e4m3(x[j] / s) : 0;
            memcpy(scales + ((size_t)row * (size_t)groups + (size_t)gi) * 4, &s, sizeof s);
        }
        return;
    }
    uint8_t *mins = out + kiln_quant_mins_offset(t, n_rows, k);
    uint8_t *q = out + (size_t)row * (size_t)k / 2;
    for (int64_t gi = 0; gi < groups; gi++) {
        const float *x = w + gi * g;
        float lo = x[0], hi = x[0];
        for (int j = 1; j < g; j++) {
            lo = x[j] < lo ? x[j] : lo;
            hi = x[j] > hi ? x[j] : hi;
        }
        float s = (hi - lo) / 15.0f;
        if (method == KILN_QUANT_MSE && hi > lo) { /* the clipped range with the least squared error */
            const float range = hi - lo, lo0 = lo, hi0 = hi;
            double best = group_error(x, g, lo, s);
            for (int a = 0; a < MSE_STEPS; a++)
                for (int b = 0; b < MSE_STEPS; b++) {
                    if (!a && !b) continue;
                    const float l = lo0 + (float)a * MSE_SHRINK * range, h = hi0 - (float)b * MSE_SHRINK * range;
                    const double e = group_error(x, g, l, (h - l) / 15.0f);
                    if (e < best) best = e, lo = l, s = (h - l) / 15.0f;
                }
        }
        for (int j = 0; j < g; j += 2)
            q[(gi * g + j) / 2] = (uint8_t)(code4(x[j], lo, s) | code4(x[j + 1], lo, s) << 4);
        const size_t at = (size_t)row * (size_t)groups + (size_t)gi;
        memcpy(scales + at * 4, &s, sizeof s);
        memcpy(mins + at * 4, &lo, sizeof lo);
    }
}

void kiln_dequant_rows(int t, const uint8_t *data, int64_t n_rows, int64_t k, int64_t r0, int64_t count, float *out) {
    const int g = kiln_quant_group(t);
    const int64_t groups = kiln_quant_groups(t, k);
    const uint8_t *sb = data + align16(code_bytes(t, (uint64_t)n_rows, (uint64_t)k));
    const uint8_t *mb = data + kiln_quant_mins_offset(t, n_rows, k); /* q4 */
    for (int64_t r = r0; r < r0 + count; r++) {
        float *o = out + (size_t)(r - r0) * (size_t)k;
        if (t == KILN_DTYPE_Q8) {
            float s;
            memcpy(&s, sb + (size_t)r * 4, 4);
            const int8_t *q = (const int8_t *)(data + (size_t)r * (size_t)k);
            for (int64_t j = 0; j < k; j++) o[j] = (float)q[j] * s;
            continue;
        }
        if (kiln_quant_is_fp8(t)) {
            const int64_t gk = g ? g : k;
            const uint8_t *q = data + (size_t)r * (size_t)k;
            for (int64_t gi = 0; gi < groups; gi++) {
                float s;
                memcpy(&s, sb + ((size_t)r * (size_t)groups + (size_t)gi) * 4, 4);
                for (int64_t j = gi * gk; j < (gi + 1) * gk && j < k; j++) o[j] = kiln_e4m3_to_f32(q[j]) * s;
            }
            continue;
        }
        const uint8_t *q = data + (size_t)r * (size_t)k / 2;
        for (int64_t gi = 0; gi < groups; gi++) {
            float s, lo;
            const size_t at = (size_t)r * (size_t)groups + (size_t)gi;
            memcpy(&s, sb + at * 4, 4);
            memcpy(&lo, mb + at * 4, 4);
            for (int j = 0; j < g; j++) {
                const int64_t c = gi * g + j;
                const int code = (q[c / 2] >> (4 * (c & 1))) & 15;
                o[c] = (float)code * s + lo;
            }
        }
    }
}

/* Element i of a little-endian int32 tensor, as unsigned. */
static uint32_t word_at(const uint8_t *p, uint64_t i) { return kiln_rd_u32(p + 4 * i); }

/* Where AutoAWQ puts column j of 8 (its pack order 0, 2, 4, 6, 1, 3, 5, 7 inverted): the nibble. */
static const int awq_nibble[8] = {0, 4, 1, 5, 2, 6, 3, 7};

int kiln_qsrc_is_fp8(const kiln_qsrc *s) {
    return s->format == KILN_QSRC_FP8 || s->format == KILN_QSRC_CT_FP8 || s->format == KILN_QSRC_FP8_BLOCK;
}

int64_t kiln_qsrc_scale_index(const kiln_qsrc *s, int64_t n, int64_t k, int g, int64_t row, int64_t gi) {
    if (s->format == KILN_QSRC_FP8 || s->format == KILN_QSRC_CT_FP8) return s->fp8_row_scales ? row : 0;
    if (s->format == KILN_QSRC_FP8_BLOCK) /* [ceil(n / block_n), ceil(k / block_k)], row-major */
        return row / s->block_n * ((k + s->block_k - 1) / s->block_k) + gi;
    return s->format == KILN_QSRC_CT ? row * (k / g) + gi /* [n, k/G] */
                                     : gi * n + row;      /* [k/G, n] */
}

/* The stored 4-bit code of element [row, col] of the [n, k] matrix `s` (kiln_ops.h: kiln_qsrc). */
static int qsrc_code(const kiln_qsrc *s, int64_t n, int64_t k, int64_t row, int64_t col) {
    switch (s->format) {
    case KILN_QSRC_AWQ: /* [k, n/8], along the rows in AWQ's order */
        return (int)(word_at(s->qweight, (uint64_t)col * (uint64_t)(n / 8) + (uint64_t)(row / 8)) >>
                     (4 * awq_nibble[row % 8])) & 15;
    case KILN_QSRC_GPTQ: /* [k/8, n], along the columns */
        return (int)(word_at(s->qweight, (uint64_t)(col / 8) * (uint64_t)n + (uint64_t)row) >> (4 * (col % 8))) & 15;
    default: /* compressed-tensors: [n, k/8], along the columns */
        return (int)(word_at(s->qweight, (uint64_t)row * (uint64_t)(k / 8) + (uint64_t)(col / 8)) >> (4 * (col % 8))) &
               15;
    }
}

/* The zero of row `row`, group `gi` (stored offset included) of the [n, k] matrix `s`, groups of g. */
static int qsrc_zero(const kiln_qsrc *s, int64_t n, int64_t k, int g, int64_t row, int64_t gi) {
    uint32_t w;
    switch (s->format) {
    case KILN_QSRC_AWQ: /* [k/G, n/8] along the rows, AWQ's order */
        w = word_at(s->qzeros, (uint64_t)gi * (uint64_t)(n / 8) + (uint64_t)(row / 8));
        return (int)((w >> (4 * awq_nibble[row % 8])) & 15u) + s->zero_offset;
    case KILN_QSRC_GPTQ: /* [k/G, n/8] along the rows */
        w = word_at(s->qzeros, (uint64_t)gi * (uint64_t)(n / 8) + (uint64_t)(row / 8));
        return (int)((w >> (4 * (row % 8))) & 15u) + s->zero_offset;
    default: /* compressed-tensors: [n/8, k/G] along the rows; symmetric: none, signed zero 0 = nibble 8 */
        if (!s->qzeros) return 8;
        w = word_at(s->qzeros, (uint64_t)(row / 8) * (uint64_t)(k / g) + (uint64_t)gi);
        return (int)((w >> (4 * (row % 8))) & 15u);
    }
}

float kiln_qsrc_scale_f32(const uint8_t *scales, kiln_dtype dt, int64_t i) {
    if (dt == KILN_DTYPE_F32) {
        const uint32_t u = kiln_rd_u32(scales + 4 * (size_t)i);
        float f;
        memcpy(&f, &u, sizeof f);
        return f;
    }
    const uint16_t h = (uint16_t)(scales[2 * i] | scales[2 * i + 1] << 8);
    return dt == KILN_DTYPE_BF16 ? kiln_bf16_to_f32(h) : kiln_f16_to_f32(h);
}

int64_t kiln_quant_repack_fp8_row(const kiln_qsrc *s, int64_t k, int64_t row, int64_t dst_rows, int64_t dst_row,
                                  uint8_t *out) {
    const uint8_t *src = s->qweight + (size_t)row * (size_t)k;
    for (int64_t c = 0; c < k; c++)
        if ((src[c] & 0x7F) == 0x7F) return c; /* E4M3's two NaN codes */
    memcpy(out + (size_t)dst_row * (size_t)k, src, (size_t)k);
    const bool block = s->format == KILN_QSRC_FP8_BLOCK; /* into fp8g128: a scale per group of 128 */
    const int t = block ? KILN_DTYPE_FP8G128 : KILN_DTYPE_FP8;
    const int64_t groups = kiln_quant_groups(t, k);
    for (int64_t gi = 0; gi < groups; gi++) {
        const float sc = kiln_qsrc_scale_f32(s->scales, s->scales_dtype, kiln_qsrc_scale_index(s, 0, k, 128, row, gi));
        memcpy(out + kiln_quant_scales_offset(t, dst_rows, k) + ((size_t)dst_row * (size_t)groups + (size_t)gi) * 4,
               &sc, sizeof sc);
    }
    return -1;
}

int64_t kiln_quant_repack_row(const kiln_qsrc *s, int t, int64_t n, int64_t k, int64_t row, int64_t dst_rows,
                              int64_t dst_row, uint8_t *out) {
    const int g = kiln_quant_group(t);
    const int64_t groups = k / g;
    uint8_t *scales = out + kiln_quant_scales_offset(t, dst_rows, k);
    uint8_t *mins = out + kiln_quant_mins_offset(t, dst_rows, k);
    uint8_t *q = out + (size_t)dst_row * (size_t)k / 2;
    int64_t bad = -1;
    for (int64_t gi = 0; gi < groups; gi++) {
        const uint64_t at = (uint64_t)kiln_qsrc_scale_index(s, n, k, g, row, gi);
        const float sc = kiln_qsrc_scale_f32(s->scales, s->scales_dtype, (int64_t)at);
        if (!isfinite(sc) && bad < 0) bad = (int64_t)at;
        const float z = (float)qsrc_zero(s, n, k, g, row, gi);
        const float lo = -(z * sc); /* exact: z * sc has at most 5 + 11 significant bits */
        const size_t o = ((size_t)dst_row * (size_t)groups + (size_t)gi) * 4;
        memcpy(scales + o, &sc, sizeof sc);
        memcpy(mins + o, &lo, sizeof lo);
    }
    const int32_t *pm = s->col_perm; /* act-order: kiln's column c is the checkpoint's pm[c] */
    for (int64_t c = 0; c < k; c += 2)
        q[c / 2] = (uint8_t)(qsrc_code(s, n, k, row, pm ? pm[c] : c) | qsrc_code(s, n, k, row, pm ? pm[c + 1] : c + 1) << 4);
    return bad;
}
