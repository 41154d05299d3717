/*
 * test_package.c — the runtime side of packaged executables: an engine
 * opened from a range of a file (aligned or not, cut short, damaged), from
 * memory, through the public kiln_open_range / kiln_open_memory (the same
 * greedy ids as kiln_open on the file), the appended engine's trailer (every
 * rule), and kiln_standalone_engine (embedded, appended, another engine,
 * a template).
 * The LLVM side is tests/cli_package.sh.
 */
#include <stdint.h>
#include <unistd.h>

#include <xxhash.h>

#include "kt.h"
#include "kt_fixture.h"
#include "runtime/kiln.h"
#include "../format/kiln_engine.h"
#include "../format/kiln_standalone.h"

static char g_dir[512], g_engine[600];
static uint8_t *g_bytes; /* the engine file, 4096-aligned copy */
static size_t g_size;

static void write_file(const char *path, const void *p, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f) return;
    fwrite(p, 1, n, f);
    fclose(f);
}

/* path = `prefix` junk bytes, zeros up to `offset`, the engine, then the
 * trailer (when `trailer`); returns the file's size. */
static size_t write_packed(const char *path, size_t prefix, uint64_t offset, bool trailer) {
    size_t n = (size_t)offset + g_size + (trailer ? KILN_PAYLOAD_TRAILER_SIZE : 0);
    uint8_t *f = calloc(1, n);
    if (!f) return 0;
    memset(f, 0x7f, prefix);
    memcpy(f + offset, g_bytes, g_size);
    if (trailer) {
        kiln_payload_trailer t = {.offset = offset, .size = g_size, .engine_checksum = kiln_rd_u64(g_bytes + 56)};
        kiln_payload_trailer_write(f + offset + g_size, &t);
    }
    write_file(path, f, n);
    free(f);
    return n;
}

/* Greedy ids for prompt [1] from an opened handle (-1 entries on failure). */
static void greedy(kiln_t *k, int32_t *ids, int n) {
    for (int i = 0; i < n; i++) ids[i] = -1;
    kiln_ctx_options co;
    kiln_ctx_options_init(&co);
    co.device = "cpu";
    co.max_batch = 1;
    kiln_ctx_t *ctx = NULL;
    if (kiln_ctx_new(k, &co, &ctx) != KILN_OK) {
        fprintf(stderr, "  ctx: %s\n", kiln_last_error(ctx));
        kiln_ctx_free(ctx);
        return;
    }
    kiln_request_options ro;
    kiln_request_options_init(&ro);
    ro.max_tokens = n;
    int32_t prompt[1] = {1}, got = 0, fin = 0;
    int64_t id;
    if (kiln_submit(ctx, prompt, 1, &ro, &id) == KILN_OK && kiln_run(ctx) == KILN_OK)
        kiln_poll(ctx, id, ids, n, &got, &fin, NULL);
    kiln_ctx_free(ctx);
}

static void test_range(void) {
    KT_REQUIRE(g_bytes);
    char path[700];
    snprintf(path, sizeof path, "%s/packed", g_dir);
    kiln_error err = {0};
    kiln_engine e;
    /* page-aligned offset, and an offset in the middle of a page */
    uint64_t offsets[] = {8192, 1000};
    for (int i = 0; i < 2; i++) {
        write_packed(path, 100, offsets[i], false);
        kiln_status st = kiln_engine_open_range(path, offsets[i], g_size, "packed", &e, &err);
        KT_CHECKF(st == KILN_OK, "offset %llu: %s", (unsigned long long)offsets[i], err.msg);
        if (st != KILN_OK) continue;
        KT_EQ_INT(e.size, g_size);
        KT_CHECK(memcmp(e.data, g_bytes, g_size) == 0);
        KT_CHECK(kiln_engine_find(&e, KILN_SECTION_WEIGHTS) != NULL);
        KT_EQ_STR(e.map.path, "packed");
        kiln_engine_close(&e);
    }
    /* cut short: the range runs past the end of the file */
    write_packed(path, 0, 4096, false);
    KT_EQ_INT(kiln_engine_open_range(path, 4096, g_size + 1, "packed", &e, &err), KILN_ERR_FORMAT);
    KT_CHECKF(strstr(err.msg, "truncated") != NULL, "%s", err.msg);
    KT_EQ_INT(kiln_engine_open_range(path, UINT64_MAX - 10, 100, NULL, &e, &err), KILN_ERR_FORMAT);
    /* a range shorter than the engine: the engine's own size check */
    KT_EQ_INT(kiln_engine_open_range(path, 4096, g_size - 4096, NULL, &e, &err), KILN_ERR_FORMAT);
    KT_CHECKF(strstr(err.msg, "truncated") != NULL, "%s", err.msg);
    /* a flipped byte in the weights */
    uint8_t *copy = malloc(g_size + 4096);
    KT_REQUIRE(copy);
    memset(copy, 0, 4096);
    memcpy(copy + 4096, g_bytes, g_size);
    copy[4096 + g_size / 2] ^= 1;
    write_file(path, copy, g_size + 4096);
    free(copy);
    KT_EQ_INT(kiln_engine_open_range(path, 4096, g_size, "packed", &e, &err), KILN_ERR_CHECKSUM);
    KT_CHECKF(strstr(err.msg, "packed: section") != NULL, "%s", err.msg);
    KT_EQ_INT(kiln_engine_open_range("/does/not/exist", 0, 64, NULL, &e, &err), KILN_ERR_IO);
}

static void test_public_api(void) {
    KT_REQUIRE(g_bytes);
    int32_t want[10], got[10];
    kiln_t *k = NULL;
    KT_REQUIRE(kiln_open(g_engine, 1, &k) == KILN_OK);
    greedy(k, want, 10);
    kiln_close(k);
    KT_CHECK(want[0] >= 0);

    char path[700];
    snprintf(path, sizeof path, "%s/packed-api", g_dir);
    write_packed(path, 10, 12288, true);
    KT_CHECKF(kiln_open_range(path, 12288, g_size, 1, &k) == KILN_OK, "%s", kiln_error_message(k));
    greedy(k, got, 10);
    kiln_close(k);
    KT_CHECK(memcmp(want, got, sizeof want) == 0);
    KT_EQ_INT(kiln_open_range(path, 12288 + 4096, g_size, 1, &k), KILN_ERR_FORMAT);
    KT_CHECK(strstr(kiln_error_message(k), "truncated") != NULL);
    kiln_close(k);

    KT_CHECKF(kiln_open_memory(g_bytes, g_size, "image", 1, &k) == KILN_OK, "%s", kiln_error_message(k));
    greedy(k, got, 10);
    kiln_close(k);
    KT_CHECK(memcmp(want, got, sizeof want) == 0);
    uint8_t *bad = aligned_alloc(4096, kiln_align_up(g_size, 4096));
    KT_REQUIRE(bad);
    memcpy(bad, g_bytes, g_size);
    bad[g_size - 100] ^= 0x10; /* the section table */
    KT_EQ_INT(kiln_open_memory(bad, g_size, "image", 1, &k), KILN_ERR_CHECKSUM);
    KT_CHECKF(strstr(kiln_error_message(k), "image: ") == kiln_error_message(k), "%s", kiln_error_message(k));
    kiln_close(k);
    KT_EQ_INT(kiln_open_memory(bad, 10, NULL, 1, &k), KILN_ERR_FORMAT);
    KT_CHECK(strstr(kiln_error_message(k), "(memory)") != NULL);
    kiln_close(k);
    free(bad);
    KT_EQ_INT(kiln_open_memory(NULL, 10, NULL, 1, &k), KILN_ERR_INVALID_ARG);
    kiln_close(k);
}

/* rewrite the trailer's bytes [at, at + n) with `v` and reseal (or not) its checksum */
static void poke_trailer(const char *path, size_t size, size_t at, uint64_t v, int n, bool reseal) {
    FILE *f = fopen(path, "r+b");
    if (!f) return;
    uint8_t t[KILN_PAYLOAD_TRAILER_SIZE];
    fseek(f, (long)(size - sizeof t), SEEK_SET);
    if (fread(t, 1, sizeof t, f) != sizeof t) memset(t, 0, sizeof t);
    if (n == 8) kiln_wr_u64(t + at, v);
    else kiln_wr_u32(t + at, (uint32_t)v);
    if (reseal) kiln_wr_u64(t + 56, XXH64(t, 56, 0));
    fseek(f, (long)(size - sizeof t), SEEK_SET);
    fwrite(t, 1, sizeof t, f);
    fclose(f);
}

static void test_trailer(void) {
    KT_REQUIRE(g_bytes);
    char path[700];
    snprintf(path, sizeof path, "%s/trailer", g_dir);
    kiln_error err = {0};
    kiln_payload_trailer t;
    size_t size = write_packed(path, 4000, 4096, true);
    KT_CHECKF(kiln_payload_trailer_read(path, "exe", &t, &err) == KILN_OK, "%s", err.msg);
    KT_EQ_INT(t.offset, 4096);
    KT_EQ_INT(t.size, g_size);
    KT_EQ_INT(t.engine_checksum, kiln_rd_u64(g_bytes + 56));
    /* each rule */
    struct { size_t at; uint64_t v; int n; bool reseal; kiln_status want; const char *msg; } cases[] = {
        {0, 0x1234, 4, true, KILN_ERR_FORMAT, "trailer is missing"},    /* magic */
        {8, 2, 4, true, KILN_ERR_VERSION, "version 2"},
        {8, 0, 4, true, KILN_ERR_VERSION, "version 0"},
        {16, 4096, 8, false, KILN_OK, NULL},                           /* same value: still fine */
        {24, 1, 8, false, KILN_ERR_CHECKSUM, "trailer checksum"},
        {16, 4097, 8, true, KILN_ERR_FORMAT, "does not end where"},      /* misaligned */
        {16, 0, 8, true, KILN_ERR_FORMAT, "does not end where"},         /* a gap before the trailer */
        {24, UINT64_MAX, 8, true, KILN_ERR_FORMAT, "does not end where"}, /* overflow */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        size = write_packed(path, 4000, 4096, true);
        poke_trailer(path, size, cases[i].at, cases[i].v, cases[i].n, cases[i].reseal);
        kiln_status st = kiln_payload_trailer_read(path, "exe", &t, &err);
        KT_CHECKF(st == cases[i].want, "case %zu: status %d, %s", i, st, err.msg);
        if (cases[i].msg) KT_CHECKF(strstr(err.msg, cases[i].msg) != NULL, "case %zu: %s", i, err.msg);
    }
    /* no trailer: a short file, an engine without one */
    write_file(path, "tiny", 4);
    KT_EQ_INT(kiln_payload_trailer_read(path, "exe", &t, &err), KILN_ERR_FORMAT);
    KT_EQ_INT(kiln_payload_trailer_read(g_engine, NULL, &t, &err), KILN_ERR_FORMAT);
    KT_CHECK(strstr(err.msg, "truncated") != NULL);
    KT_EQ_INT(kiln_payload_trailer_read("/does/not/exist", NULL, &t, &err), KILN_ERR_IO);
}

static void test_standalone_engine(void) {
    KT_REQUIRE(g_bytes);
    kiln_error err = {0};
    kiln_engine_src src;
    kiln_standalone_desc d = {.struct_size = sizeof d, .payload = KILN_PAYLOAD_EMBEDDED, .kiln_version = "t",
                              .commit = "", .engine_size = g_size, .engine_checksum = kiln_rd_u64(g_bytes + 56),
                              .engine = g_bytes};
    KT_CHECKF(kiln_standalone_engine(&d, NULL, "exe", &src, &err) == KILN_OK, "%s", err.msg);
    KT_CHECK(src.data == g_bytes && src.size == g_size && !src.path);
    kiln_engine e;
    KT_CHECKF(kiln_engine_open_src(&src, &e, &err) == KILN_OK, "%s", err.msg);
    kiln_engine_close(&e);
    d.engine_checksum ^= 1; /* another engine */
    KT_EQ_INT(kiln_standalone_engine(&d, NULL, "exe", &src, &err), KILN_ERR_FORMAT);
    KT_CHECKF(strstr(err.msg, "not the one this executable was built with") != NULL, "%s", err.msg);
    d.engine_checksum ^= 1;
    d.struct_size = 12;
    KT_EQ_INT(kiln_standalone_engine(&d, NULL, "exe", &src, &err), KILN_ERR_INTERNAL);
    d.struct_size = sizeof d;

    char path[700];
    snprintf(path, sizeof path, "%s/appended", g_dir);
    write_packed(path, 5000, 8192, true);
    d.payload = KILN_PAYLOAD_APPENDED;
    d.engine = NULL;
    KT_CHECKF(kiln_standalone_engine(&d, path, "exe", &src, &err) == KILN_OK, "%s", err.msg);
    KT_CHECK(src.path && src.range && src.offset == 8192 && src.size == g_size);
    KT_CHECKF(kiln_engine_open_src(&src, &e, &err) == KILN_OK, "%s", err.msg);
    kiln_engine_close(&e);
    d.engine_size++;
    KT_EQ_INT(kiln_standalone_engine(&d, path, "exe", &src, &err), KILN_ERR_FORMAT);
    KT_CHECKF(strstr(err.msg, "appended engine") != NULL, "%s", err.msg);
    d.engine_size--;
    KT_EQ_INT(kiln_standalone_engine(&d, g_engine, "exe", &src, &err), KILN_ERR_FORMAT); /* no trailer */

    /* a template takes whichever engine its trailer names */
    d.engine_size = 0;
    d.engine_checksum = KILN_STANDALONE_TEMPLATE;
    KT_CHECKF(kiln_standalone_engine(&d, path, "exe", &src, &err) == KILN_OK, "%s", err.msg);
    KT_CHECK(src.range && src.offset == 8192 && src.size == g_size);
    KT_EQ_INT(kiln_standalone_engine(&d, g_engine, "exe", &src, &err), KILN_ERR_FORMAT);
    KT_CHECKF(strstr(err.msg, "this is a template") != NULL, "%s", err.msg);
    d.engine_checksum = 1; /* size 0 alone is not a template */
    KT_EQ_INT(kiln_standalone_engine(&d, path, "exe", &src, &err), KILN_ERR_FORMAT);
}

int main(void) {
    if (kt_tmpdir(g_dir, sizeof g_dir, "package")) {
        snprintf(g_engine, sizeof g_engine, "%s/st.kiln", g_dir);
        kiln_compile_options opt = {.output_path = g_engine, .weight_dtype = KILN_DTYPE_COUNT_, .targets = "none"};
        if (kt_compile(KILN_SOURCE_DIR "/models/stories260k", &opt) == KILN_OK) {
            FILE *f = fopen(g_engine, "rb");
            if (f) {
                fseek(f, 0, SEEK_END);
                g_size = (size_t)ftell(f);
                fseek(f, 0, SEEK_SET);
                g_bytes = aligned_alloc(4096, kiln_align_up(g_size, 4096));
                if (g_bytes && fread(g_bytes, 1, g_size, f) != g_size) g_bytes = NULL;
                fclose(f);
            }
        }
    }
    KT_RUN(test_range);
    KT_RUN(test_public_api);
    KT_RUN(test_trailer);
    KT_RUN(test_standalone_engine);
    free(g_bytes);
    char cmd[700];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", g_dir);
    return KT_END();
}
