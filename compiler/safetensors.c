/*
 * safetensors.c — one .safetensors file → table of tensors pointing into the
 * mapped file (the weights are never read into RAM here).
 *
 * The format (https://github.com/huggingface/safetensors):
 *
 *   offset 0        u64 little-endian N: byte length of the header
 *   offset 8        N bytes of UTF-8 JSON: an object
 *                     { "__metadata__": {"key": "string", ...},      (optional)
 *                       "<tensor name>": { "dtype": "BF16",
 *                                          "shape": [d0, d1, ...],
 *                                          "data_offsets": [begin, end] }, ... }
 *                   (writers may pad the header with trailing spaces)
 *   offset 8 + N    the data buffer; a tensor's bytes are
 *                   buffer[begin, end), row-major, little-endian.
 *
 * Rules enforced, one distinct message each, naming the file and the tensor:
 *   - the file holds at least the 8-byte length;
 *   - N is at most 100 MiB (the reference implementation's cap) and fits in
 *     the file;
 *   - the header is a JSON object starting with '{', with no duplicate keys;
 *   - "__metadata__", when present, is an object of strings (then ignored);
 *   - each tensor is an object with "dtype" (a string), "shape" (an array of
 *     at most KILN_MAX_DIMS non-negative integers) and "data_offsets"
 *     (two integers, begin <= end);
 *   - dtype is F32, F16, BF16, I32 (the packed codes, zeros and group
 *     indices of quantized checkpoints), I64 (compressed-tensors'
 *     weight_shape) or F8_E4M3 (the codes of FP8 checkpoints); the importer
 *     says where each is read; the format's other dtypes are UNSUPPORTED,
 *     anything else is PARSE;
 *   - product(shape) * dtype size (overflow-checked) == end - begin;
 *   - end lies inside the data buffer;
 *   - sorted by begin, the tensors tile the buffer exactly: the first starts
 *     at 0, each starts where the previous ended (no overlap, no gap) and the
 *     last ends at the end of the file.
 */
#include "kiln_compiler.h"

#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define ST_MAX_HEADER (100ull << 20)

/* The format's dtype names: what kiln reads, and what it knows but refuses. */
static const struct {
    const char *name;
    int kiln; /* kiln_dtype, or -1: a real safetensors dtype kiln does not read */
} st_dtypes[] = {
    {"F32", KILN_DTYPE_F32},  {"F16", KILN_DTYPE_F16},  {"BF16", KILN_DTYPE_BF16},
    {"F64", -1},     {"I64", KILN_DTYPE_I64},     {"U64", -1},     {"I32", KILN_DTYPE_I32}, {"U32", -1},
    {"I16", -1},     {"U16", -1},     {"I8", -1},      {"U8", -1},      {"BOOL", -1},
    {"F8_E4M3", KILN_DTYPE_F8E4M3}, {"F8_E5M2", -1}, {"F8_E8M0", -1}, {"F6_E2M3", -1}, {"F6_E3M2", -1},
    {"F4", -1},      {"C64", -1},
};

/* One tensor while parsing: its data range, for the tiling check. */
typedef struct st_range {
    uint64_t begin, end;
    size_t idx; /* into the tensor array */
} st_range;

static int st_cmp_range(const void *a, const void *b) {
    const st_range *x = a, *y = b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end) return x->end < y->end ? -1 : 1;
    return 0;
}

static int st_cmp_name(const void *a, const void *b) {
    return strcmp(((const kiln_st_tensor *)a)->name, ((const kiln_st_tensor *)b)->name);
}

void kiln_st_tensors_free(kiln_st_tensor *t, size_t n) {
    if (!t) return;
    for (size_t i = 0; i < n; i++) free(t[i].name);
    free(t);
}

/* Non-negative JSON integer → u64; false when not one. */
static bool st_uint(const json_t *v, uint64_t *out) {
    if (!json_is_integer(v) || json_integer_value(v) < 0) return false;
    *out = (uint64_t)json_integer_value(v);
    return true;
}

/* Check one tensor entry `v` named `name` and fill *t (all but data/name).
 * `buf_size` is the data buffer's size. */
static kiln_status st_entry(const char *path, const char *name, json_t *v, uint64_t buf_size, kiln_st_tensor *t,
                            st_range *r, kiln_error *err) {
    if (!json_is_object(v))
        return kiln_err(err, KILN_ERR_PARSE, "%s: tensor \"%s\": header entry is not an object", path, name);

    /* dtype */
    json_t *dt = json_object_get(v, "dtype");
    if (!dt) return kiln_err(err, KILN_ERR_PARSE, "%s: tensor \"%s\": no \"dtype\"", path, name);
    if (!json_is_string(dt))
        return kiln_err(err, KILN_ERR_PARSE, "%s: tensor \"%s\": \"dtype\" is not a string", path, name);
    const char *dts = json_string_value(dt);
    int kdt = -2;
    for (size_t i = 0; i < sizeof st_dtypes / sizeof st_dtypes[0]; i++)
        if (strcmp(dts, st_dtypes[i].name) == 0) kdt = st_dtypes[i].kiln;
    if (kdt == -2)
        return kiln_err(err, KILN_ERR_PARSE, "%s: tensor \"%s\": unknown dtype \"%.32s\"", path, name, dts);
    if (kdt == -1) {
        kiln_err(err, KILN_ERR_UNSUPPORTED, "%s: tensor \"%s\": dtype %s is not supported (kiln reads F32, F16, BF16, I32, I64, F8_E4M3)",
                 path, name, dts);
        return kiln_err_hint(err, "convert the checkpoint to bf16 or fp16 first");
    }
    t->dtype = (kiln_dtype)kdt;

    /* shape */
    json_t *shape = json_object_get(v, "shape");
    if (!shape) return kiln_err(err, KILN_ERR_PARSE, "%s: tensor \"%s\": no \"shape\"", path, name);
    if (!json_is_array(shape))
        return kiln_err(err, KILN_ERR_PARSE, "%s: tensor \"%s\": \"shape\" is not an array", path, name);
    size_t ndim = json_array_size(shape);
    if (ndim > KILN_MAX_DIMS)
        return kiln_err(err, KILN_ERR_UNSUPPORTED, "%s: tensor \"%s\": %zu dimensions; kiln supports at most %d", path,
                        name, ndim, KILN_MAX_DIMS);
    uint64_t nbytes = (uint64_t)kiln_dtype_size(t->dtype);
    bool overflow = false;
    for (size_t i = 0; i < ndim; i++) {
        uint64_t d;
        if (!st_uint(json_array_get(shape, i), &d))
            return kiln_err(err, KILN_ERR_PARSE, "%s: tensor \"%s\": shape[%zu] is not a non-negative integer", path,
                            name, i);
        t->shape[i] = (int64_t)d; /* d <= INT64_MAX: it came from a json_int_t */
        if (!kiln_mul_u64(nbytes, d, &nbytes)) overflow = true;
    }
    t->ndim = (int)ndim;

    /* data_offsets */
    json_t *off = json_object_get(v, "data_offsets");
    if (!off) return kiln_err(err, KILN_ERR_PARSE, "%s: tensor \"%s\": no \"data_offsets\"", path, name);
    if (!json_is_array(off) || json_array_size(off) != 2 || !st_uint(json_array_get(off, 0), &r->begin) ||
        !st_uint(json_array_get(off, 1), &r->end))
        return kiln_err(err, KILN_ERR_PARSE,
                        "%s: tensor \"%s\": \"data_offsets\" is not [begin, end] with non-negative integers", path,
                        name);
    if (r->begin > r->end)
        return kiln_err(err, KILN_ERR_PARSE, "%s: tensor \"%s\": data_offsets [%" PRIu64 ", %" PRIu64
                        "] end before they begin", path, name, r->begin, r->end);

    /* a zero in the shape makes the product 0 whatever overflowed before it */
    for (size_t i = 0; i < ndim; i++)
        if (t->shape[i] == 0) overflow = false, nbytes = 0;
    if (overflow || nbytes != r->end - r->begin) {
        char dims[128] = "";
        size_t k = 0;
        for (size_t i = 0; i < ndim && k < sizeof dims; i++)
            k += (size_t)snprintf(dims + k, sizeof dims - k, "%s%" PRId64, i ? ", " : "", t->shape[i]);
        if (overflow)
            return kiln_err(err, KILN_ERR_SHAPE, "%s: tensor \"%s\": shape [%s] of %s has more bytes than 2^64", path,
                            name, dims, dts);
        return kiln_err(err, KILN_ERR_SHAPE,
                        "%s: tensor \"%s\": shape [%s] of %s needs %" PRIu64 " bytes but data_offsets [%" PRIu64
                        ", %" PRIu64 "] hold %" PRIu64,
                        path, name, dims, dts, nbytes, r->begin, r->end, r->end - r->begin);
    }
    if (r->end > buf_size)
        return kiln_err(err, KILN_ERR_PARSE,
                        "%s: tensor \"%s\": data_offsets [%" PRIu64 ", %" PRIu64
                        "] run past the end of the %" PRIu64 "-byte data buffer (file truncated?)",
                        path, name, r->begin, r->end, buf_size);
    t->nbytes = nbytes;
    return KILN_OK;
}

/* "__metadata__": an object whose values are strings. */
static kiln_status st_metadata(const char *path, json_t *meta, kiln_error *err) {
    if (!json_is_object(meta))
        return kiln_err(err, KILN_ERR_PARSE, "%s: \"__metadata__\" is not an object", path);
    const char *k;
    json_t *v;
    json_object_foreach(meta, k, v) {
        if (!json_is_string(v))
            return kiln_err(err, KILN_ERR_PARSE, "%s: \"__metadata__\" entry \"%s\" is not a string", path, k);
    }
    return KILN_OK;
}

kiln_status kiln_st_parse(const uint8_t *data, size_t size, const char *path, kiln_st_tensor **tensors,
                          size_t *n_tensors, kiln_error *err) {
    *tensors = NULL;
    *n_tensors = 0;
    if (!path) path = "(safetensors)";
    if (size < 8)
        return kiln_err(err, KILN_ERR_PARSE, "%s: file is %zu bytes, too short for the 8-byte header length", path,
                        size);
    uint64_t hlen = kiln_rd_u64(data);
    if (hlen > ST_MAX_HEADER)
        return kiln_err(err, KILN_ERR_PARSE, "%s: header length %" PRIu64 " is over the %llu-byte limit", path, hlen,
                        ST_MAX_HEADER);
    if (hlen > size - 8)
        return kiln_err(err, KILN_ERR_PARSE,
                        "%s: header length %" PRIu64 " is more than the %zu bytes after it (file truncated?)", path, hlen,
                        size - 8);
    if (hlen == 0 || data[8] != '{')
        return kiln_err(err, KILN_ERR_PARSE, "%s: header does not start with '{'", path);
    const uint8_t *buf = data + 8 + hlen;
    uint64_t buf_size = size - 8 - hlen;

    json_error_t je;
    json_t *root = json_loadb((const char *)data + 8, hlen, JSON_REJECT_DUPLICATES, &je);
    if (!root)
        return kiln_err(err, KILN_ERR_PARSE, "%s: header is not valid JSON: %s (header byte %d)", path, je.text,
                        je.position);
    kiln_status st = KILN_OK;
    kiln_st_tensor *ts = NULL;
    st_range *rs = NULL;
    size_t n = 0;
    if (!json_is_object(root)) {
        st = kiln_err(err, KILN_ERR_PARSE, "%s: header is not a JSON object", path);
        goto out;
    }
    size_t cap = json_object_size(root);
    ts = calloc(cap ? cap : 1, sizeof *ts);
    rs = calloc(cap ? cap : 1, sizeof *rs);
    if (!ts || !rs) {
        st = kiln_err(err, KILN_ERR_NOMEM, "%s: out of memory for %zu tensors", path, cap);
        goto out;
    }
    const char *key;
    json_t *v;
    json_object_foreach(root, key, v) {
        if (strcmp(key, "__metadata__") == 0) {
            if ((st = st_metadata(path, v, err))) goto out;
            continue;
        }
        kiln_st_tensor *t = &ts[n];
        if ((st = st_entry(path, key, v, buf_size, t, &rs[n], err))) goto out;
        t->name = strdup(key);
        if (!t->name) {
            st = kiln_err(err, KILN_ERR_NOMEM, "%s: out of memory", path);
            goto out;
        }
        t->data = buf + rs[n].begin;
        rs[n].idx = n;
        n++;
    }

    /* tiling: sorted by begin, each tensor starts where the previous ended */
    qsort(rs, n, sizeof *rs, st_cmp_range);
    uint64_t at = 0;
    for (size_t i = 0; i < n; i++) {
        const char *name = ts[rs[i].idx].name;
        if (rs[i].begin < at) {
            st = kiln_err(err, KILN_ERR_PARSE,
                          "%s: tensor \"%s\" (bytes %" PRIu64 "..%" PRIu64 ") overlaps tensor \"%s\" (ends at %" PRIu64 ")",
                          path, name, rs[i].begin, rs[i].end, ts[rs[i - 1].idx].name, at);
            goto out;
        }
        if (rs[i].begin > at) {
            if (i == 0)
                st = kiln_err(err, KILN_ERR_PARSE,
                              "%s: tensor \"%s\" starts at byte %" PRIu64 " of the data buffer; the first tensor must start at 0",
                              path, name, rs[i].begin);
            else
                st = kiln_err(err, KILN_ERR_PARSE,
                              "%s: gap of %" PRIu64 " bytes between tensor \"%s\" (ends at %" PRIu64
                              ") and tensor \"%s\" (starts at %" PRIu64 ")",
                              path, rs[i].begin - at, ts[rs[i - 1].idx].name, at, name, rs[i].begin);
            goto out;
        }
        at = rs[i].end;
    }
    if (at != buf_size) {
        if (n)
            st = kiln_err(err, KILN_ERR_PARSE,
                          "%s: %" PRIu64 " bytes after the last tensor \"%s\" (ends at %" PRIu64
                          " of a %" PRIu64 "-byte data buffer)",
                          path, buf_size - at, ts[rs[n - 1].idx].name, at, buf_size);
        else
            st = kiln_err(err, KILN_ERR_PARSE, "%s: no tensors, but %" PRIu64 " bytes of data after the header", path,
                          buf_size);
        goto out;
    }

    qsort(ts, n, sizeof *ts, st_cmp_name);
    *tensors = ts;
    *n_tensors = n;
    ts = NULL;
out:
    kiln_st_tensors_free(ts, n);
    free(rs);
    json_decref(root);
    return st;
}

kiln_status kiln_st_open(const char *path, kiln_st_file *out, kiln_error *err) {
    memset(out, 0, sizeof *out);
    kiln_status st = kiln_file_map(path, &out->map, err);
    if (st) return st;
    st = kiln_st_parse(out->map.data, out->map.size, path, &out->tensors, &out->n_tensors, err);
    if (st) kiln_st_close(out);
    return st;
}

void kiln_st_close(kiln_st_file *f) {
    kiln_st_tensors_free(f->tensors, f->n_tensors);
    kiln_file_unmap(&f->map);
    memset(f, 0, sizeof *f);
}
