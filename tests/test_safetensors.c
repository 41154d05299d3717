/*
 * test_safetensors.c — the safetensors reader: one test per rule of the
 * format (each asserts the status and that the message names the tensor or
 * field at fault), plus the real stories260k file.
 *
 * Images are built in memory: u64 header length, the header text given as a
 * string, then `data_len` bytes of a known pattern.
 */
#include "../compiler/kiln_compiler.h"
#include "kt.h"

#include <stdint.h>

typedef struct img {
    uint8_t *p;
    size_t n;
} img;

/* Header length field = `hlen` (normally strlen(header)). */
static img make_raw(uint64_t hlen, const char *header, size_t data_len) {
    size_t h = strlen(header);
    img m = {malloc(8 + h + data_len + 1), 8 + h + data_len};
    kiln_wr_u64(m.p, hlen);
    memcpy(m.p + 8, header, h);
    for (size_t i = 0; i < data_len; i++) m.p[8 + h + i] = (uint8_t)(i * 7 + 1);
    return m;
}

static img make(const char *header, size_t data_len) { return make_raw(strlen(header), header, data_len); }

/* Parse `m`, expect `code`, and that the message contains `needle` (and the file name). */
static void expect_fail(img m, kiln_status code, const char *needle) {
    kiln_st_tensor *t = (kiln_st_tensor *)1;
    size_t n = 99;
    kiln_error e = {0};
    kiln_status st = kiln_st_parse(m.p, m.n, "w.safetensors", &t, &n, &e);
    KT_EQ_INT(st, code);
    KT_EQ_INT(e.code, code);
    KT_CONTAINS(e.msg, "w.safetensors");
    KT_CONTAINS(e.msg, needle);
    KT_CHECK(t == NULL);
    KT_EQ_INT(n, 0);
    free(m.p);
}

/* ---- valid files ---- */

static void test_valid_two_tensors(void) {
    /* "b" is first in the buffer, "a" second: the result is sorted by name */
    const char *h = "{\"__metadata__\":{\"format\":\"pt\"},"
                    "\"b\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,24]},"
                    "\"a\":{\"dtype\":\"BF16\",\"shape\":[4],\"data_offsets\":[24,32]}}";
    img m = make(h, 32);
    kiln_st_tensor *t = NULL;
    size_t n = 0;
    kiln_error e = {0};
    KT_EQ_INT(kiln_st_parse(m.p, m.n, "x", &t, &n, &e), KILN_OK);
    KT_REQUIRE(n == 2);
    const uint8_t *buf = m.p + 8 + strlen(h);
    KT_EQ_STR(t[0].name, "a");
    KT_EQ_INT(t[0].dtype, KILN_DTYPE_BF16);
    KT_EQ_INT(t[0].ndim, 1);
    KT_EQ_INT(t[0].shape[0], 4);
    KT_EQ_INT(t[0].nbytes, 8);
    KT_CHECK(t[0].data == buf + 24);
    KT_EQ_STR(t[1].name, "b");
    KT_EQ_INT(t[1].dtype, KILN_DTYPE_F32);
    KT_EQ_INT(t[1].ndim, 2);
    KT_EQ_INT(t[1].shape[0], 2);
    KT_EQ_INT(t[1].shape[1], 3);
    KT_EQ_INT(t[1].nbytes, 24);
    KT_CHECK(t[1].data == buf);
    KT_EQ_INT(t[1].data[0], 1); /* the pattern's first byte */
    kiln_st_tensors_free(t, n);
    free(m.p);
}

static void test_valid_empty_and_padded(void) {
    kiln_st_tensor *t = NULL;
    size_t n = 7;
    kiln_error e = {0};
    img m = make("{}", 0);
    KT_EQ_INT(kiln_st_parse(m.p, m.n, "x", &t, &n, &e), KILN_OK);
    KT_EQ_INT(n, 0);
    kiln_st_tensors_free(t, n);
    free(m.p);
    /* writers pad the header with spaces to align the data */
    m = make("{\"w\":{\"dtype\":\"F16\",\"shape\":[3],\"data_offsets\":[0,6]}}       ", 6);
    KT_EQ_INT(kiln_st_parse(m.p, m.n, "x", &t, &n, &e), KILN_OK);
    KT_EQ_INT(n, 1);
    KT_EQ_INT(t[0].dtype, KILN_DTYPE_F16);
    kiln_st_tensors_free(t, n);
    free(m.p);
}

static void test_valid_scalar_and_zero_size(void) {
    /* a 0-d tensor holds one element; a tensor with a 0 dimension holds none */
    img m = make("{\"s\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[0,4]},"
                 "\"z\":{\"dtype\":\"BF16\",\"shape\":[0,5],\"data_offsets\":[4,4]}}",
                 4);
    kiln_st_tensor *t = NULL;
    size_t n = 0;
    kiln_error e = {0};
    KT_EQ_INT(kiln_st_parse(m.p, m.n, "x", &t, &n, &e), KILN_OK);
    KT_REQUIRE(n == 2);
    KT_EQ_INT(t[0].ndim, 0);
    KT_EQ_INT(t[0].nbytes, 4);
    KT_EQ_INT(t[1].ndim, 2);
    KT_EQ_INT(t[1].nbytes, 0);
    kiln_st_tensors_free(t, n);
    free(m.p);
}

/* ---- the length prefix ---- */

static void test_too_short(void) {
    img m = {calloc(1, 5), 5};
    expect_fail(m, KILN_ERR_PARSE, "too short");
}

static void test_header_over_cap(void) {
    expect_fail(make_raw((100ull << 20) + 1, "{}", 0), KILN_ERR_PARSE, "limit");
}

static void test_header_past_file(void) {
    expect_fail(make_raw(1000, "{}", 10), KILN_ERR_PARSE, "truncated");
}

/* ---- the header text ---- */

static void test_header_not_brace(void) {
    expect_fail(make("[1,2]", 0), KILN_ERR_PARSE, "'{'");
    expect_fail(make_raw(0, "", 0), KILN_ERR_PARSE, "'{'");
}

static void test_header_not_json(void) {
    expect_fail(make("{\"a\":", 0), KILN_ERR_PARSE, "not valid JSON");
}

static void test_duplicate_names(void) {
    expect_fail(make("{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
                     "\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
                     8),
                KILN_ERR_PARSE, "duplicate object key near '\"w\"'");
}

static void test_metadata_not_object(void) {
    expect_fail(make("{\"__metadata__\":[1]}", 0), KILN_ERR_PARSE, "\"__metadata__\" is not an object");
}

static void test_metadata_not_strings(void) {
    expect_fail(make("{\"__metadata__\":{\"format\":\"pt\",\"step\":5}}", 0), KILN_ERR_PARSE, "\"step\"");
}

/* ---- tensor entries ---- */

static void test_entry_not_object(void) {
    expect_fail(make("{\"w\":[0,4]}", 4), KILN_ERR_PARSE, "tensor \"w\": header entry is not an object");
}

static void test_dtype_missing(void) {
    expect_fail(make("{\"w\":{\"shape\":[1],\"data_offsets\":[0,4]}}", 4), KILN_ERR_PARSE, "tensor \"w\": no \"dtype\"");
}

static void test_dtype_not_string(void) {
    expect_fail(make("{\"w\":{\"dtype\":4,\"shape\":[1],\"data_offsets\":[0,4]}}", 4), KILN_ERR_PARSE,
                "tensor \"w\": \"dtype\" is not a string");
}

static void test_dtype_unknown(void) {
    expect_fail(make("{\"w\":{\"dtype\":\"Q4_K\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4), KILN_ERR_PARSE,
                "tensor \"w\": unknown dtype \"Q4_K\"");
}

/* I32: the packed codes, zeros and group indices of AWQ/GPTQ checkpoints (the importer decides where) */
static void test_dtype_i32(void) {
    img m = make("{\"m.qweight\":{\"dtype\":\"I32\",\"shape\":[2,3],\"data_offsets\":[0,24]}}", 24);
    kiln_st_tensor *t = NULL;
    size_t n = 0;
    kiln_error e = {0};
    KT_EQ_INT(kiln_st_parse(m.p, m.n, "x", &t, &n, &e), KILN_OK);
    KT_REQUIRE(n == 1);
    KT_EQ_INT(t[0].dtype, KILN_DTYPE_I32);
    kiln_st_tensors_free(t, n);
    free(m.p);
    expect_fail(make("{\"g\":{\"dtype\":\"I32\",\"shape\":[3],\"data_offsets\":[0,8]}}", 8), KILN_ERR_SHAPE,
                "shape [3] of I32 needs 12 bytes");
}

/* I64: compressed-tensors' weight_shape (8 bytes an element) */
static void test_dtype_i64(void) {
    img m = make("{\"m.weight_shape\":{\"dtype\":\"I64\",\"shape\":[2],\"data_offsets\":[0,16]}}", 16);
    kiln_st_tensor *t = NULL;
    size_t n = 0;
    kiln_error e = {0};
    KT_EQ_INT(kiln_st_parse(m.p, m.n, "x", &t, &n, &e), KILN_OK);
    KT_REQUIRE(n == 1);
    KT_EQ_INT(t[0].dtype, KILN_DTYPE_I64);
    KT_EQ_INT((int)t[0].nbytes, 16);
    kiln_st_tensors_free(t, n);
    free(m.p);
    expect_fail(make("{\"g\":{\"dtype\":\"I64\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8), KILN_ERR_SHAPE,
                "shape [2] of I64 needs 16 bytes");
}

/* F8_E4M3 (FP8 checkpoints' codes) is read, one byte an element; the importer decides where it may be. */
static void test_dtype_f8e4m3(void) {
    img m = make("{\"w\":{\"dtype\":\"F8_E4M3\",\"shape\":[2,3],\"data_offsets\":[0,6]}}", 6);
    kiln_st_tensor *t = NULL;
    size_t n = 0;
    kiln_error e = {0};
    KT_EQ_INT(kiln_st_parse(m.p, m.n, "x", &t, &n, &e), KILN_OK);
    KT_REQUIRE(n == 1);
    KT_EQ_INT(t[0].dtype, KILN_DTYPE_F8E4M3);
    KT_EQ_INT((int)t[0].nbytes, 6);
    KT_EQ_STR(kiln_dtype_name(t[0].dtype), "f8e4m3");
    kiln_st_tensors_free(t, n);
    free(m.p);
    expect_fail(make("{\"w\":{\"dtype\":\"F8_E4M3\",\"shape\":[2,3],\"data_offsets\":[0,5]}}", 5), KILN_ERR_SHAPE,
                "shape [2, 3] of F8_E4M3 needs 6 bytes");
}

static void test_dtype_unsupported(void) {
    static const char *const names[] = {"F64", "U64", "U32", "I16", "I8", "U8", "BOOL", "F8_E5M2", "F8_E8M0"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        char h[160], want[64];
        snprintf(h, sizeof h, "{\"pos_ids\":{\"dtype\":\"%s\",\"shape\":[1],\"data_offsets\":[0,1]}}", names[i]);
        snprintf(want, sizeof want, "dtype %s is not supported", names[i]);
        expect_fail(make(h, 1), KILN_ERR_UNSUPPORTED, want);
        expect_fail(make(h, 1), KILN_ERR_UNSUPPORTED, "tensor \"pos_ids\"");
    }
}

static void test_shape_missing(void) {
    expect_fail(make("{\"w\":{\"dtype\":\"F32\",\"data_offsets\":[0,4]}}", 4), KILN_ERR_PARSE, "tensor \"w\": no \"shape\"");
}

static void test_shape_not_array(void) {
    expect_fail(make("{\"w\":{\"dtype\":\"F32\",\"shape\":4,\"data_offsets\":[0,4]}}", 4), KILN_ERR_PARSE,
                "tensor \"w\": \"shape\" is not an array");
}

static void test_shape_bad_dim(void) {
    expect_fail(make("{\"w\":{\"dtype\":\"F32\",\"shape\":[1,-2],\"data_offsets\":[0,4]}}", 4), KILN_ERR_PARSE,
                "tensor \"w\": shape[1] is not a non-negative integer");
    expect_fail(make("{\"w\":{\"dtype\":\"F32\",\"shape\":[1.0],\"data_offsets\":[0,4]}}", 4), KILN_ERR_PARSE,
                "tensor \"w\": shape[0]");
    expect_fail(make("{\"w\":{\"dtype\":\"F32\",\"shape\":[\"1\"],\"data_offsets\":[0,4]}}", 4), KILN_ERR_PARSE,
                "tensor \"w\": shape[0]");
}

static void test_shape_too_many_dims(void) {
    expect_fail(make("{\"w\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1],\"data_offsets\":[0,4]}}", 4),
                KILN_ERR_UNSUPPORTED, "tensor \"w\": 5 dimensions");
}

static void test_offsets_missing(void) {
    expect_fail(make("{\"w\":{\"dtype\":\"F32\",\"shape\":[1]}}", 4), KILN_ERR_PARSE, "tensor \"w\": no \"data_offsets\"");
}

static void test_offsets_malformed(void) {
    expect_fail(make("{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0]}}", 4), KILN_ERR_PARSE,
                "tensor \"w\": \"data_offsets\" is not [begin, end]");
    expect_fail(make("{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4,8]}}", 4), KILN_ERR_PARSE,
                "tensor \"w\": \"data_offsets\"");
    expect_fail(make("{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[-4,0]}}", 4), KILN_ERR_PARSE,
                "tensor \"w\": \"data_offsets\"");
    expect_fail(make("{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":{\"a\":1}}}", 4), KILN_ERR_PARSE,
                "tensor \"w\": \"data_offsets\"");
}

static void test_offsets_reversed(void) {
    expect_fail(make("{\"w\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[4,0]}}", 4), KILN_ERR_PARSE,
                "tensor \"w\": data_offsets [4, 0] end before they begin");
}

static void test_size_mismatch(void) {
    expect_fail(make("{\"w\":{\"dtype\":\"BF16\",\"shape\":[2,3],\"data_offsets\":[0,24]}}", 24), KILN_ERR_SHAPE,
                "tensor \"w\": shape [2, 3] of BF16 needs 12 bytes but data_offsets [0, 24] hold 24");
}

static void test_size_overflow(void) {
    /* 2^32 * 2^32 * 4 bytes wraps a u64 to 0, matching data_offsets [0,0] if unchecked */
    expect_fail(make("{\"w\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296],\"data_offsets\":[0,0]}}", 0),
                KILN_ERR_SHAPE, "tensor \"w\": shape [4294967296, 4294967296] of F32 has more bytes than 2^64");
}

static void test_offsets_past_buffer(void) {
    expect_fail(make("{\"w\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}", 8), KILN_ERR_PARSE,
                "tensor \"w\": data_offsets [0, 16] run past the end of the 8-byte data buffer");
}

/* ---- tiling of the data buffer ---- */

static void test_overlap(void) {
    expect_fail(make("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                     "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}",
                     12),
                KILN_ERR_PARSE, "tensor \"b\" (bytes 4..12) overlaps tensor \"a\"");
}

static void test_gap(void) {
    expect_fail(make("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
                     "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,12]}}",
                     12),
                KILN_ERR_PARSE, "gap of 4 bytes between tensor \"a\" (ends at 4) and tensor \"b\"");
}

static void test_first_not_at_zero(void) {
    expect_fail(make("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 8), KILN_ERR_PARSE,
                "tensor \"a\" starts at byte 4");
}

static void test_trailing_bytes(void) {
    expect_fail(make("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 6), KILN_ERR_PARSE,
                "2 bytes after the last tensor \"a\"");
    expect_fail(make("{\"__metadata__\":{}}", 3), KILN_ERR_PARSE, "no tensors, but 3 bytes");
}

/* ---- files ---- */

static void test_open_stories(void) {
    kiln_st_file f;
    kiln_error e = {0};
    kiln_status st = kiln_st_open(KILN_SOURCE_DIR "/models/stories260k/model.safetensors", &f, &e);
    KT_CHECKF(st == KILN_OK, "%s", e.msg);
    if (st) return;
    KT_EQ_INT(f.n_tensors, 47);
    for (size_t i = 1; i < f.n_tensors; i++) KT_CHECK(strcmp(f.tensors[i - 1].name, f.tensors[i].name) < 0);
    KT_EQ_STR(f.tensors[0].name, "model.embed_tokens.weight");
    KT_EQ_INT(f.tensors[0].dtype, KILN_DTYPE_F32);
    KT_EQ_INT(f.tensors[0].ndim, 2);
    KT_EQ_INT(f.tensors[0].shape[0], 512);
    KT_EQ_INT(f.tensors[0].shape[1], 64);
    KT_EQ_INT(f.tensors[0].nbytes, 512 * 64 * 4);
    /* the weights are not copied: tensors point into the mapping */
    KT_CHECK(f.tensors[0].data >= f.map.data && f.tensors[0].data + f.tensors[0].nbytes <= f.map.data + f.map.size);
    /* value from the reference reader:
     *   python3 -c "from safetensors.numpy import load_file as l;
     *     print([float(x).hex() for x in l('models/stories260k/model.safetensors')['model.norm.weight'][:2]])" */
    const kiln_st_tensor *norm = NULL;
    for (size_t i = 0; i < f.n_tensors; i++)
        if (strcmp(f.tensors[i].name, "model.norm.weight") == 0) norm = &f.tensors[i];
    KT_REQUIRE(norm != NULL);
    float v[2];
    memcpy(v, norm->data, sizeof v);
    KT_CHECKF(v[0] == 0x1.3aa9dep+1f && v[1] == 0x1.5e08dcp+0f, "%.9g %.9g", v[0], v[1]); /* 2.45830894, 1.36732268 */
    kiln_st_close(&f);
}

static void test_open_missing_file(void) {
    kiln_st_file f;
    kiln_error e = {0};
    KT_EQ_INT(kiln_st_open("/nonexistent/kiln/x.safetensors", &f, &e), KILN_ERR_IO);
    KT_CONTAINS(e.msg, "/nonexistent/kiln/x.safetensors");
    KT_CHECK(f.tensors == NULL && f.map.data == NULL);
}

int main(void) {
    KT_RUN(test_valid_two_tensors);
    KT_RUN(test_valid_empty_and_padded);
    KT_RUN(test_valid_scalar_and_zero_size);
    KT_RUN(test_too_short);
    KT_RUN(test_header_over_cap);
    KT_RUN(test_header_past_file);
    KT_RUN(test_header_not_brace);
    KT_RUN(test_header_not_json);
    KT_RUN(test_duplicate_names);
    KT_RUN(test_metadata_not_object);
    KT_RUN(test_metadata_not_strings);
    KT_RUN(test_entry_not_object);
    KT_RUN(test_dtype_missing);
    KT_RUN(test_dtype_not_string);
    KT_RUN(test_dtype_unknown);
    KT_RUN(test_dtype_i32);
    KT_RUN(test_dtype_i64);
    KT_RUN(test_dtype_f8e4m3);
    KT_RUN(test_dtype_unsupported);
    KT_RUN(test_shape_missing);
    KT_RUN(test_shape_not_array);
    KT_RUN(test_shape_bad_dim);
    KT_RUN(test_shape_too_many_dims);
    KT_RUN(test_offsets_missing);
    KT_RUN(test_offsets_malformed);
    KT_RUN(test_offsets_reversed);
    KT_RUN(test_size_mismatch);
    KT_RUN(test_size_overflow);
    KT_RUN(test_offsets_past_buffer);
    KT_RUN(test_overlap);
    KT_RUN(test_gap);
    KT_RUN(test_first_not_at_zero);
    KT_RUN(test_trailing_bytes);
    KT_RUN(test_open_stories);
    KT_RUN(test_open_missing_file);
    return KT_END();
}
