/*
 * plan_writer.c — writes the plan section and the weights section from a
 * graph (formats in format/kiln_plan.h and docs/engine-format.md), checking
 * every weight value on the way (see "weight values" below).
 */
#include "kiln_codegen.h"

#include "../common/kiln_pool.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../format/kiln_plan.h"

/* Dense numbering of live values (id order) and of live weights. */
typedef struct numbering {
    int *value;  /* graph value id → plan value index, -1 when dead */
    int *weight; /* graph value id → plan weight index, -1 when not a live weight */
    int n_values, n_weights;
} numbering;

static kiln_status number(const kiln_graph *g, numbering *n, kiln_error *err) {
    n->value = malloc((size_t)g->n_values * sizeof *n->value);
    n->weight = malloc((size_t)g->n_values * sizeof *n->weight);
    if (!n->value || !n->weight) {
        free(n->value);
        free(n->weight);
        return kiln_err(err, KILN_ERR_NOMEM, "out of memory numbering the plan");
    }
    n->n_values = n->n_weights = 0;
    for (int v = 0; v < g->n_values; v++) {
        const kiln_value *val = &g->values[v];
        n->value[v] = val->dead ? -1 : n->n_values++;
        n->weight[v] = (!val->dead && val->kind == KILN_VALUE_WEIGHT) ? n->n_weights++ : -1;
    }
    return KILN_OK;
}

static uint64_t weight_bytes(const kiln_value *v) { return kiln_weight_nbytes(v->dtype, v->ndim, v->shape); }

/* Ranks the weights are written for (1 unless the graph was split by pass tensor-parallel). */
static int ranks_of(const kiln_graph *g) { return g->n_ranks > 1 ? g->n_ranks : 1; }

/* Where rank r's weights start, given where the previous rank's end: a tensor-parallel engine
 * puts each rank's weights in their own KILN_PLAN_RANK_ALIGN-aligned range. */
static uint64_t rank_start(const kiln_graph *g, int r, uint64_t end) {
    return r == 0 ? 0 : kiln_align_up(end, KILN_PLAN_RANK_ALIGN);
}

static int slot_count(const kiln_graph *g) {
    int n = 0;
    for (int v = 0; v < g->n_values; v++)
        if (!g->values[v].dead && g->values[v].kind == KILN_VALUE_ACT && g->values[v].slot >= n)
            n = g->values[v].slot + 1;
    return n;
}

kiln_status kiln_plan_serialize(const kiln_graph *g, kiln_buf *b, kiln_error *err) {
    numbering n = {0};
    kiln_status st = number(g, &n, err);
    if (st != KILN_OK) return st;
    int n_slots = slot_count(g);
    uint32_t *slot_width = calloc((size_t)n_slots + 1, sizeof *slot_width);
    if (!slot_width) {
        st = kiln_err(err, KILN_ERR_NOMEM, "out of memory writing the plan");
        goto out;
    }
    for (int v = 0; v < g->n_values; v++) {
        const kiln_value *val = &g->values[v];
        if (val->dead || val->kind != KILN_VALUE_ACT) continue;
        if (val->slot < 0) {
            st = kiln_err(err, KILN_ERR_INTERNAL, "plan: activation %%%d has no buffer slot (memory planning did not run)", v);
            goto out;
        }
        slot_width[val->slot] = (uint32_t)val->shape[2];
    }
    const int ranks = ranks_of(g);
    kiln_buf_append(b, KILN_PLAN_MAGIC, 4);
    kiln_buf_u32(b, KILN_PLAN_VERSION);
    kiln_buf_u32(b, (uint32_t)n.n_values);
    kiln_buf_u32(b, (uint32_t)g->n_ops);
    kiln_buf_u32(b, (uint32_t)n.n_weights);
    kiln_buf_u32(b, (uint32_t)n_slots);
    kiln_buf_u32(b, (uint32_t)n.value[g->tokens]);
    kiln_buf_u32(b, (uint32_t)n.value[g->positions]);
    kiln_buf_u32(b, (uint32_t)n.value[g->logits]);
    const kiln_graph_info *info = &g->info;
    const int32_t hdr[6] = {info->n_layers, info->n_kv_heads, info->head_dim,
                            info->hidden_size, info->vocab_size, info->max_context};
    for (int i = 0; i < 6; i++) kiln_buf_u32(b, (uint32_t)hdr[i]);
    kiln_buf_u32(b, (uint32_t)ranks);
    for (int s = 0; s < n_slots; s++) {
        kiln_buf_u32(b, slot_width[s]);
        kiln_buf_u32(b, KILN_DTYPE_F32);
    }
    for (int v = 0; v < g->n_values; v++) {
        const kiln_value *val = &g->values[v];
        if (val->dead) continue;
        kiln_buf_u32(b, (uint32_t)val->kind);
        kiln_buf_u32(b, (uint32_t)val->dtype);
        kiln_buf_u32(b, (uint32_t)val->ndim);
        kiln_buf_u32(b, (uint32_t)(val->kind == KILN_VALUE_ACT ? val->slot : -1));
        kiln_buf_u32(b, (uint32_t)n.weight[v]);
        kiln_buf_u32(b, 0);
        for (int d = 0; d < KILN_MAX_DIMS; d++) kiln_buf_u64(b, (uint64_t)(d < val->ndim ? val->shape[d] : 0));
    }
    uint64_t offset = 0;
    for (int r = 0; r < ranks; r++) {
        offset = rank_start(g, r, offset);
        for (int v = 0; v < g->n_values; v++) {
            const kiln_value *val = &g->values[v];
            if (n.weight[v] < 0) continue;
            char name[KILN_PLAN_NAME_MAX] = {0};
            snprintf(name, sizeof name, "%s", val->name);
            kiln_buf_append(b, name, sizeof name);
            kiln_buf_u32(b, (uint32_t)val->dtype);
            kiln_buf_u32(b, (uint32_t)val->ndim);
            for (int d = 0; d < KILN_MAX_DIMS; d++) kiln_buf_u64(b, (uint64_t)(d < val->ndim ? val->shape[d] : 0));
            offset = kiln_align_up(offset, KILN_PLAN_WEIGHT_ALIGN);
            kiln_buf_u64(b, offset);
            kiln_buf_u64(b, weight_bytes(val));
            offset += weight_bytes(val);
        }
    }
    for (int i = 0; i < g->n_ops; i++) {
        const kiln_op *op = &g->ops[i];
        uint32_t keys[KILN_ATTR_COUNT_], vals[KILN_ATTR_COUNT_];
        int n_attrs = kiln_op_attrs_encode(&op->attrs, keys, vals);
        kiln_buf_u32(b, (uint32_t)op->kind);
        kiln_buf_u32(b, (uint32_t)op->n_in);
        kiln_buf_u32(b, (uint32_t)op->n_out);
        kiln_buf_u32(b, (uint32_t)n_attrs);
        for (int k = 0; k < op->n_in; k++) kiln_buf_u32(b, (uint32_t)n.value[op->in[k]]);
        for (int k = 0; k < op->n_out; k++) kiln_buf_u32(b, (uint32_t)n.value[op->out[k]]);
        for (int k = 0; k < n_attrs; k++) {
            kiln_buf_u32(b, keys[k]);
            kiln_buf_u32(b, vals[k]);
        }
    }
    if (b->failed) st = kiln_err(err, KILN_ERR_NOMEM, "out of memory writing the plan");
out:
    free(slot_width);
    free(n.value);
    free(n.weight);
    return st;
}

/* ---- weight values: checked as they are converted ----
 *
 * Every element of every weight passes through convert() on its way into the
 * engine, so this is where values are checked, at no extra pass over 14 GB:
 * NaN or ±Inf at any dtype (also when the bytes are copied unchanged) and a
 * narrowing conversion that overflows (f32/bf16 → f16 beyond ±65504, f32 →
 * bf16 beyond ±3.39e38) are refused, naming the tensor, the element (flat
 * and per dimension) and the value. The checks look at exponent bits only:
 * all ones = Inf or NaN in every IEEE format here. */

/* Where a chunk of elements comes from, for messages. */
typedef struct weight_chunk {
    const kiln_value *val;
    uint64_t first; /* flat index of the chunk's first element in the tensor */
} weight_chunk;

static bool f16_nonfinite(uint16_t h) { return (h & 0x7c00u) == 0x7c00u; }
static bool bf16_nonfinite(uint16_t h) { return (h & 0x7f80u) == 0x7f80u; }

static float load_f32(const uint8_t *src, kiln_dtype sd, size_t i) {
    float f;
    if (sd == KILN_DTYPE_F32) {
        uint32_t u = kiln_rd_u32(src + 4 * i);
        memcpy(&f, &u, 4);
        return f;
    }
    uint16_t h = (uint16_t)(src[2 * i] | src[2 * i + 1] << 8);
    return sd == KILN_DTYPE_BF16 ? kiln_bf16_to_f32(h) : kiln_f16_to_f32(h);
}

/* "[3,17]" for flat element `flat` of the value's shape. */
static void multi_index(const kiln_value *v, uint64_t flat, char *buf, size_t n) {
    uint64_t idx[KILN_MAX_DIMS] = {0};
    for (int d = v->ndim - 1; d >= 0; d--) {
        uint64_t dim = v->shape[d] > 0 ? (uint64_t)v->shape[d] : 1;
        idx[d] = flat % dim;
        flat /= dim;
    }
    size_t k = (size_t)snprintf(buf, n, "[");
    for (int d = 0; d < v->ndim && k < n; d++)
        k += (size_t)snprintf(buf + k, n - k, "%s%llu", d ? "," : "", (unsigned long long)idx[d]);
    if (k < n) snprintf(buf + k, n - k, "]");
}

/* Element i of the chunk is NaN/Inf (value f, read from the source dtype). */
static kiln_status bad_value(const weight_chunk *c, size_t i, float f, kiln_error *err) {
    char at[96];
    uint64_t flat = c->first + i;
    multi_index(c->val, flat, at, sizeof at);
    const char *what = f != f ? "NaN" : f > 0 ? "+Inf" : "-Inf";
    kiln_err(err, KILN_ERR_PARSE, "weight '%s' (%s): element %llu %s is %s", c->val->name,
             kiln_dtype_name(c->val->src_dtype), (unsigned long long)flat, at, what);
    return kiln_err_hint(err, "a NaN or infinite weight makes the model's outputs NaN; the checkpoint is damaged "
                              "(re-download or re-export it)");
}

/* Element i (finite value f) overflows the engine dtype. */
static kiln_status overflow(const weight_chunk *c, size_t i, float f, kiln_error *err) {
    char at[96];
    uint64_t flat = c->first + i;
    multi_index(c->val, flat, at, sizeof at);
    const char *dd = kiln_dtype_name(c->val->dtype);
    kiln_err(err, KILN_ERR_UNSUPPORTED,
             "weight '%s': element %llu %s is %.9g, beyond the range of %s (max %s): converting it would make it %s",
             c->val->name, (unsigned long long)flat, at, (double)f, dd,
             c->val->dtype == KILN_DTYPE_F16 ? "65504" : "3.39e38", f > 0 ? "+Inf" : "-Inf");
    return kiln_err_hint(err, "compile with a wider --dtype (bf16 or f32 for f16; f32 for bf16), or --dtype "
                              "checkpoint to keep the checkpoint's own");
}

/* Does this block of `nbytes` unchanged bytes possibly hold a NaN/Inf? Eight
 * bytes at a time: each lane (2 or 4 bytes, little-endian) becomes zero
 * exactly when its exponent bits are all ones, and a zero lane sets its high
 * bit in (x - ones) & ~x (x's high bits are clear, so no lane borrows
 * unless a lower one was zero). A tail shorter than 8 bytes says "maybe". */
static bool block_maybe_nonfinite(const uint8_t *p, size_t nbytes, kiln_dtype dt) {
    const uint64_t mask = dt == KILN_DTYPE_F32 ? 0x7f8000007f800000ull
                          : dt == KILN_DTYPE_BF16 ? 0x7f807f807f807f80ull : 0x7c007c007c007c00ull;
    const uint64_t ones = dt == KILN_DTYPE_F32 ? 0x0000000100000001ull : 0x0001000100010001ull;
    const uint64_t highs = dt == KILN_DTYPE_F32 ? 0x8000000080000000ull : 0x8000800080008000ull;
    uint64_t any = 0;
    size_t j = 0;
    for (; j + 8 <= nbytes; j += 8) {
        uint64_t x = (kiln_rd_u64(p + j) & mask) ^ mask;
        any |= (x - ones) & ~x & highs;
    }
    return any != 0 || j < nbytes;
}

/* Copy `count` unchanged elements of dtype sd; the index of the first
 * NaN/Inf among them, or count. Blocks small enough for L1 are scanned and
 * then copied, so the source is read from memory once; only a block that
 * may hold one is searched element by element. */
static size_t copy_checked(const uint8_t *src, kiln_dtype sd, uint8_t *dst, size_t count) {
    enum { BLOCK = 4096 };
    size_t es = (size_t)kiln_dtype_size(sd);
    for (size_t b = 0; b < count; b += BLOCK) {
        size_t n = count - b < BLOCK ? count - b : BLOCK;
        if (block_maybe_nonfinite(src + b * es, n * es, sd))
            for (size_t i = b; i < b + n; i++)
                if (!isfinite(load_f32(src, sd, i))) return i;
        memcpy(dst + b * es, src + b * es, n * es);
    }
    return count;
}

/* The factor kiln_value.row_mul / col_mul give source element `flat` of v (1 without either). */
static float mul_of(const kiln_value *v, uint64_t flat) {
    const uint64_t cols = v->mul_cols > 0 ? (uint64_t)v->mul_cols : 1;
    float f = 1.0f;
    if (v->col_mul) f *= v->col_mul[flat % cols];
    if (v->row_mul) f *= v->row_mul[flat / cols];
    return f;
}

kiln_status kiln_weight_convert(const kiln_value *v, uint64_t first, const uint8_t *src, uint8_t *dst, size_t count,
                                kiln_error *err) {
    const weight_chunk c = {v, first};
    kiln_dtype sd = v->src_dtype, dd = v->dtype;
    const bool scaled = v->row_mul || v->col_mul;
    if (sd == KILN_DTYPE_I32 || dd == KILN_DTYPE_I32) { /* indices (a permute op's): no floats to check */
        if (sd != dd || scaled) return kiln_err(err, KILN_ERR_INTERNAL, "weight '%s': i32 indices converted to %s", v->name,
                                                kiln_dtype_name(dd));
        memcpy(dst, src, count * 4);
        return KILN_OK;
    }
    if (sd == dd && !scaled) {
        size_t i = copy_checked(src, sd, dst, count);
        return i < count ? bad_value(&c, i, load_f32(src, sd, i), err) : KILN_OK;
    }
    for (size_t i = 0; i < count; i++) {
        float f = load_f32(src, sd, i);
        if (!isfinite(f)) return bad_value(&c, i, f, err);
        if (scaled && !isfinite(f *= mul_of(v, first + i))) return overflow(&c, i, f, err);
        if (dd == KILN_DTYPE_F32) {
            uint32_t u;
            memcpy(&u, &f, 4);
            kiln_wr_u32(dst + 4 * i, u);
            continue;
        }
        uint16_t h = dd == KILN_DTYPE_BF16 ? kiln_f32_to_bf16(f) : kiln_f32_to_f16(f);
        if (dd == KILN_DTYPE_BF16 ? bf16_nonfinite(h) : f16_nonfinite(h)) return overflow(&c, i, f, err);
        dst[2 * i] = (uint8_t)h;
        dst[2 * i + 1] = (uint8_t)(h >> 8);
    }
    return KILN_OK;
}

uint64_t kiln_weights_size(const kiln_graph *g) {
    uint64_t offset = 0;
    for (int r = 0; r < ranks_of(g); r++) {
        offset = rank_start(g, r, offset);
        for (int v = 0; v < g->n_values; v++) {
            const kiln_value *val = &g->values[v];
            if (!val->dead && val->kind == KILN_VALUE_WEIGHT)
                offset = kiln_align_up(offset, KILN_PLAN_WEIGHT_ALIGN) + weight_bytes(val);
        }
    }
    return offset;
}

void kiln_weights_rank_range(const kiln_graph *g, int rank, uint64_t *begin, uint64_t *end) {
    uint64_t offset = 0;
    for (int r = 0; r <= rank && r < ranks_of(g); r++) {
        offset = rank_start(g, r, offset);
        *begin = offset;
        for (int v = 0; v < g->n_values; v++) {
            const kiln_value *val = &g->values[v];
            if (!val->dead && val->kind == KILN_VALUE_WEIGHT)
                offset = kiln_align_up(offset, KILN_PLAN_WEIGHT_ALIGN) + weight_bytes(val);
        }
    }
    *end = offset;
}

/* Convert and write `count` elements of weight `val` from element `first` on, CHUNK at a time. */
static kiln_status write_elements(const kiln_value *val, uint64_t first, uint64_t count, uint8_t *buf, size_t chunk,
                                  kiln_engine_writer *w, kiln_error *err) {
    const uint8_t *src = val->src;
    size_t ss = (size_t)kiln_dtype_size(val->src_dtype), ds = (size_t)kiln_dtype_size(val->dtype);
    kiln_status st = KILN_OK;
    for (uint64_t i = 0; i < count && st == KILN_OK; i += chunk) {
        size_t m = (size_t)(count - i < chunk ? count - i : chunk);
        st = kiln_weight_convert(val, first + i, src + (first + i) * ss, buf, m, err);
        if (st == KILN_OK) st = kiln_engine_writer_write(w, buf, m * ds, err);
    }
    return st;
}

/* Columns of a plain weight: a 1-D weight (a norm, a bias) is one column of shape[0] rows. */
static uint64_t cols_of(const kiln_value *val) { return val->ndim == 2 ? (uint64_t)val->shape[1] : 1; }

/* The flat source index of row `row` of rank `rank`'s shard of the plain weight `val` (of
 * n_ranks); each shard row is cols_of(val) contiguous source elements. */
static uint64_t shard_row_start(const kiln_value *val, int rank, int n_ranks, uint64_t row) {
    const uint64_t rows = (uint64_t)val->shape[0], cols = cols_of(val);
    switch (val->shard) {
    case KILN_SHARD_ROWS: return ((uint64_t)rank * rows + row) * cols;
    case KILN_SHARD_COLS: return row * cols * (uint64_t)n_ranks + (uint64_t)rank * cols;
    default: return row * cols;
    }
}

/* The source row of row r of weight v: its row_perm's (pass fold-permute-into-rows), else r. */
static int64_t src_row(const kiln_value *v, int64_t r) { return v->row_perm ? v->row_perm[r] : r; }

/* Rank `rank`'s shard of a plain (unpacked) weight: the whole weight when it is not sharded, else
 * its rows (one contiguous run) or the columns of each row; a weight whose rows are permuted (never
 * sharded: the pass runs on one rank's graph of a quantized checkpoint, which --tp refuses) row by row. */
static kiln_status write_shard(const kiln_value *val, int rank, int n_ranks, uint8_t *buf, size_t chunk,
                               kiln_engine_writer *w, kiln_error *err) {
    if (val->row_perm) {
        if (val->shard != KILN_SHARD_NONE)
            return kiln_err(err, KILN_ERR_INTERNAL, "weight '%s': permuted rows of a sharded weight", val->name);
        kiln_status st = KILN_OK;
        for (int64_t r = 0; r < val->shape[0] && st == KILN_OK; r++)
            st = write_elements(val, (uint64_t)src_row(val, r) * cols_of(val), cols_of(val), buf, chunk, w, err);
        return st;
    }
    if (val->shard == KILN_SHARD_NONE)
        return write_elements(val, 0, weight_bytes(val) / (uint64_t)kiln_dtype_size(val->dtype), buf, chunk, w, err);
    const uint64_t rows = (uint64_t)val->shape[0], cols = cols_of(val);
    if (val->shard == KILN_SHARD_ROWS)
        return write_elements(val, shard_row_start(val, rank, n_ranks, 0), rows * cols, buf, chunk, w, err);
    kiln_status st = KILN_OK;
    for (uint64_t r = 0; r < rows && st == KILN_OK; r++)
        st = write_elements(val, shard_row_start(val, rank, n_ranks, r), cols, buf, chunk, w, err);
    return st;
}

/* A packed weight (pack-weights): its parts' rows, concatenated or interleaved; each element is
 * checked and converted as its part's (messages name the part). With tensor parallelism, the rows of
 * each part's shard for `rank`: packing one rank's shards is that rank's packed weight. */
static kiln_status write_packed(const kiln_graph *g, const kiln_value *val, int rank, uint8_t *buf, size_t chunk,
                                kiln_engine_writer *w, kiln_error *err) {
    const int n_ranks = ranks_of(g);
    kiln_status st = KILN_OK;
    if (val->pack == KILN_PACK_CONCAT_ROWS) {
        for (int p = 0; p < val->n_parts && st == KILN_OK; p++) /* 2-D parts, or 1-D ones (biases) */
            st = write_shard(&g->values[val->parts[p]], rank, n_ranks, buf, chunk, w, err);
        return st;
    }
    const uint64_t cols = (uint64_t)val->shape[1], rows = (uint64_t)g->values[val->parts[0]].shape[0];
    for (uint64_t r = 0; r < rows && st == KILN_OK; r++)
        for (int p = 0; p < val->n_parts && st == KILN_OK; p++) {
            const kiln_value *part = &g->values[val->parts[p]];
            st = write_elements(part, shard_row_start(part, rank, n_ranks, (uint64_t)src_row(part, (int64_t)r)), cols,
                                buf, chunk, w, err);
        }
    return st;
}

/* The part of the (possibly packed) matrix `val` that holds its row r, and that row's index in it. */
static const kiln_value *row_part(const kiln_graph *g, const kiln_value *val, int64_t r, int64_t *pr) {
    const kiln_value *part = val;
    *pr = r;
    if (val->pack == KILN_PACK_INTERLEAVE_ROWS) {
        part = &g->values[val->parts[r % 2]];
        *pr = r / 2;
    } else if (val->pack == KILN_PACK_CONCAT_ROWS) {
        for (int p = 0; p < val->n_parts; p++) {
            part = &g->values[val->parts[p]];
            if (*pr < part->shape[0]) break;
            *pr -= part->shape[0];
        }
    }
    return part;
}

/* Row pr of rank `rank`'s shard (of n_ranks; the whole matrix when it is not sharded) of the plain matrix
 * `part` as checked floats: its source elements through kiln_weight_convert to f32, so a NaN or Inf is
 * refused naming the part and the element. */
static kiln_status read_row(const kiln_value *part, int rank, int n_ranks, int64_t pr, float *row, kiln_error *err) {
    const int64_t k = part->shape[1];
    kiln_value as_f32 = *part;
    as_f32.dtype = KILN_DTYPE_F32;
    const size_t ss = (size_t)kiln_dtype_size(part->src_dtype);
    const uint64_t first = shard_row_start(part, rank, n_ranks, (uint64_t)pr);
    return kiln_weight_convert(&as_f32, first, part->src + first * ss, (uint8_t *)row, (size_t)k, err);
}

/* A NaN or infinite scale (flat index `at` into its scales: kiln_qsrc_scale_index) of the
 * checkpoint-quantized matrix `part`, whose value is named after its qweight (weight_packed) tensor:
 * the message names the scales (weight_scale) tensor and the element's place in it. */
static kiln_status bad_scale(const kiln_value *part, int64_t at, kiln_error *err) {
    const bool ct = part->qsrc.format == KILN_QSRC_CT; /* [N, K/G], else [K/G, N] */
    const int64_t cols = ct ? part->shape[1] / kiln_quant_group(part->dtype) : part->shape[0];
    const char *dot = strrchr(part->name, '.');
    const int base = dot ? (int)(dot - part->name) : (int)strlen(part->name);
    const float f = kiln_qsrc_scale_f32(part->qsrc.scales, part->qsrc.scales_dtype, at);
    kiln_err(err, KILN_ERR_PARSE, "weight '%.*s.%s' (%s): element %lld [%lld,%lld] is %s", base, part->name,
             ct ? "weight_scale" : "scales", kiln_dtype_name(part->qsrc.scales_dtype), (long long)at,
             (long long)(at / cols), (long long)(at % cols), f != f ? "NaN" : f > 0 ? "+Inf" : "-Inf");
    return kiln_err_hint(err, "a NaN or infinite scale makes the model's outputs NaN; the checkpoint is damaged "
                              "(re-download or re-export it)");
}

/* A NaN code (0x7F or 0xFF) at row pr, column c of the FP8 checkpoint matrix `part` (named after its
 * codes tensor, <proj>.weight): the message names the tensor and the element. */
static kiln_status bad_code(const kiln_value *part, int64_t pr, int64_t c, kiln_error *err) {
    const int64_t k = part->shape[1];
    kiln_err(err, KILN_ERR_PARSE, "weight '%s' (f8e4m3): element %lld [%lld,%lld] is NaN (code 0x%02X)", part->name,
             (long long)(pr * k + c), (long long)pr, (long long)c, part->qsrc.qweight[pr * k + c]);
    return kiln_err_hint(err, "E4M3 has no infinities and its NaN codes are never a weight; the checkpoint is "
                              "damaged (re-download or re-export it)");
}

/* Rows [n * part / parts, n * (part + 1) / parts) of a weight being quantized: one pool task. */
typedef struct quant_job {
    const kiln_graph *g;
    const kiln_value *val;
    uint8_t *out;
    int rank, n_ranks; /* whose shard (tensor parallelism; 0 of 1 otherwise) */
    int parts;
    kiln_status st[64];
    kiln_error err[64];
} quant_job;

static void quant_rows(void *arg, int part) {
    quant_job *j = arg;
    const int64_t n = j->val->shape[0], k = j->val->shape[1];
    float *row = malloc((size_t)k * sizeof *row);
    kiln_status st = row ? KILN_OK : kiln_err(&j->err[part], KILN_ERR_NOMEM, "out of memory quantizing %s", j->val->name);
    for (int64_t r = n * part / j->parts; r < n * (part + 1) / j->parts && st == KILN_OK; r++) {
        int64_t pr;
        const kiln_value *src = row_part(j->g, j->val, r, &pr);
        pr = src_row(src, pr);
        if (kiln_qsrc_is_fp8(&src->qsrc)) { /* codes copied */
            const int64_t c = kiln_quant_repack_fp8_row(&src->qsrc, k, pr, n, r, j->out);
            if (c >= 0) st = bad_code(src, pr, c, &j->err[part]);
        } else if (src->qsrc.format != KILN_QSRC_NONE) { /* quantized in the checkpoint: repacked, not rounded again */
            const int64_t bad = kiln_quant_repack_row(&src->qsrc, j->val->dtype, src->shape[0], k, pr, n, r, j->out);
            if (bad >= 0) st = bad_scale(src, bad, &j->err[part]);
        } else if ((st = read_row(src, j->rank, j->n_ranks, pr, row, &j->err[part])) == KILN_OK) {
            kiln_quant_row_ex(j->val->dtype, n, k, r, row, j->out, j->g->quant_method);
        }
    }
    j->st[part] = st;
    free(row);
}

/* A weight of a quantized dtype: each row read as floats and quantized (kiln_quant_row_ex with the
 * graph's method, common/quant.c; the pass quantize gave it the dtype), or, for a matrix that came
 * quantized from the checkpoint, repacked (kiln_quant_repack_row, _fp8_row), into the weight's bytes, rows split
 * over the process-wide pool, which are then written in one piece. The first failing part's error
 * (in row order) is the one reported. With tensor parallelism, rank `rank`'s shard: the rows of its
 * shard of each part (their columns for a row-parallel matrix), quantized as that rank's [n, k] matrix
 * (compile.c refuses checkpoint-quantized matrices there). */
static kiln_status write_quantized(const kiln_graph *g, const kiln_value *val, int rank, kiln_engine_writer *w,
                                   kiln_error *err) {
    const uint64_t nbytes = weight_bytes(val);
    uint8_t *out = calloc(nbytes ? nbytes : 1, 1);
    quant_job *j = calloc(1, sizeof *j);
    if (!out || !j) {
        free(out), free(j);
        return kiln_err(err, KILN_ERR_NOMEM, "out of memory quantizing %s", val->name);
    }
    const int ways = kiln_pool_ways(kiln_pool_shared());
    *j = (quant_job){.g = g, .val = val, .out = out, .rank = rank, .n_ranks = ranks_of(g),
                     .parts = ways < 1 ? 1 : ways > 64 ? 64 : ways};
    if (j->parts > val->shape[0]) j->parts = (int)val->shape[0];
    kiln_pool_for(kiln_pool_shared(), j->parts, j->parts, quant_rows, j);
    kiln_status st = KILN_OK;
    for (int p = 0; p < j->parts && st == KILN_OK; p++)
        if ((st = j->st[p]) != KILN_OK && err) *err = j->err[p];
    if (st == KILN_OK) st = kiln_engine_writer_write(w, out, nbytes, err);
    free(out);
    free(j);
    return st;
}

kiln_status kiln_weights_write(const kiln_graph *g, kiln_engine_writer *w, uint64_t *size, kiln_error *err) {
    enum { CHUNK = 1 << 20 }; /* elements converted per write */
    uint8_t *buf = malloc((size_t)CHUNK * 4);
    static const uint8_t zeros[KILN_PLAN_WEIGHT_ALIGN];
    if (!buf) return kiln_err(err, KILN_ERR_NOMEM, "out of memory writing weights");
    kiln_status st = KILN_OK;
    uint64_t offset = 0;
    for (int r = 0; r < ranks_of(g) && st == KILN_OK; r++) {
        for (uint64_t to = rank_start(g, r, offset); offset < to && st == KILN_OK;) { /* the rank's alignment */
            uint64_t pad = to - offset < sizeof zeros ? to - offset : sizeof zeros;
            st = kiln_engine_writer_write(w, zeros, pad, err);
            offset += pad;
        }
        for (int v = 0; v < g->n_values && st == KILN_OK; v++) {
            const kiln_value *val = &g->values[v];
            if (val->dead || val->kind != KILN_VALUE_WEIGHT) continue;
            uint64_t pad = kiln_align_up(offset, KILN_PLAN_WEIGHT_ALIGN) - offset;
            if (pad && (st = kiln_engine_writer_write(w, zeros, pad, err)) != KILN_OK) break;
            offset += pad;
            st = kiln_dtype_is_quant(val->dtype) ? write_quantized(g, val, r, w, err)
                 : val->pack != KILN_PACK_NONE   ? write_packed(g, val, r, buf, CHUNK, w, err)
                                                 : write_shard(val, r, ranks_of(g), buf, CHUNK, w, err);
            offset += weight_bytes(val);
        }
    }
    free(buf);
    if (size) *size = offset;
    return st;
}
