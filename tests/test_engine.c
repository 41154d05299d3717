/*
 * test_engine.c — the engine container: writer → reader round trips,
 * determinism, and refusal of truncated, corrupted, foreign, newer and
 * hand-crafted malformed files with the right status and message; the
 * writer's no-partial-file guarantee; parallel zstd decoding.
 *
 * Corruption tests work on an exactly-sized malloc'd copy of a file, so an
 * out-of-bounds read by the reader is caught by ASan in the CI build.
 */
#include "../format/kiln_engine.h"

#include <dirent.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <xxhash.h>
#include <zstd.h>

#include "kt.h"

/* ---- helpers ---- */

/* Deterministic bytes from a 16-symbol alphabet: compressible, not trivially. */
static void fill_pattern(uint8_t *p, size_t n, uint32_t seed) {
    uint32_t x = seed * 2654435761u + 1;
    for (size_t i = 0; i < n; i++) {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        p[i] = (uint8_t)(0x40 | (x >> 28));
    }
}

static char *make_tmpdir(void) {
    char tmpl[] = KILN_BINARY_DIR "/test_engine.XXXXXX";
    char *d = mkdtemp(tmpl);
    return d ? strdup(d) : NULL;
}

/* Entries in a directory, not counting . and .. (-1 if it cannot be read). */
static int dir_count(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return -1;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) n++;
    closedir(d);
    return n;
}

static void rm_tree(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        char *p = kiln_path_join(dir, e->d_name);
        if (p) {
            if (kiln_path_is_dir(p)) rm_tree(p);
            else unlink(p);
            free(p);
        }
    }
    closedir(d);
    rmdir(dir);
}

static uint8_t *slurp(const char *path, size_t *size) {
    char *data = NULL;
    if (kiln_file_read(path, (size_t)1 << 30, &data, size, NULL) != KILN_OK) return NULL;
    return (uint8_t *)data;
}

static uint8_t *dup_bytes(const uint8_t *p, size_t n) {
    uint8_t *q = malloc(n ? n : 1);
    if (q && n) memcpy(q, p, n);
    return q;
}

static void reseal_header(uint8_t *f) { kiln_wr_u64(f + 56, XXH64(f, 56, 0)); }

/* Recompute every checksum that can be computed (sections in bounds, table
 * in bounds, header), so a test reaches the checks after the checksums. */
static void reseal(uint8_t *f, size_t size) {
    uint32_t count = kiln_rd_u32(f + 12);
    uint64_t toff = kiln_rd_u64(f + 16);
    if (count <= KILN_ENGINE_MAX_SECTIONS && toff >= 64 && toff <= size && (size - toff) / 64 >= count) {
        for (uint32_t i = 0; i < count; i++) {
            uint8_t *t = f + toff + 64 * i;
            uint64_t off = kiln_rd_u64(t + 8), n = kiln_rd_u64(t + 16);
            uint16_t major = (uint16_t)(f[8] | f[9] << 8);
            if (off <= size && n <= size - off) kiln_wr_u64(t + 32, kiln_engine_checksum(major, f + off, n, 1));
        }
        kiln_wr_u64(f + 32, XXH64(f + toff, 64 * (size_t)count, 0));
    }
    reseal_header(f);
}

static kiln_status open_copy(const uint8_t *f, size_t n, kiln_error *err) {
    uint8_t *c = dup_bytes(f, n);
    kiln_engine e;
    kiln_status st = kiln_engine_open_mem(c, n, "x.kiln", &e, err);
    kiln_engine_close(&e);
    free(c);
    return st;
}

/* ---- the sample engine: every codec, empty sections, an unknown kind ---- */

#define BIG_SIZE (2 * KILN_ENGINE_ZSTD_CHUNK + 123457) /* three chunks, the last partial */
static const char sample_meta[] = "{\"model\":\"test\",\"layers\":5}";

typedef struct sample {
    uint8_t *big;      /* BIG_SIZE bytes: the weights section */
    uint8_t small[1000];
    uint8_t odd[10];
} sample;

static void sample_init(sample *s) {
    s->big = malloc(BIG_SIZE);
    if (s->big) fill_pattern(s->big, BIG_SIZE, 1);
    fill_pattern(s->small, sizeof s->small, 2);
    fill_pattern(s->odd, sizeof s->odd, 3);
}

/* Sections in order: meta(none), weights(zstd, streamed in odd pieces),
 * plan(zstd, empty), tokenizer(none, empty), kernels(zstd, small), kind 77(none). */
enum { N_SAMPLE_SECTIONS = 6 };

static kiln_status write_sample(const sample *s, const char *path, kiln_error *err) {
    kiln_engine_writer *w;
    kiln_status st = kiln_engine_writer_open(path, &w, err);
    if (st) return st;
    st = kiln_engine_writer_section(w, KILN_SECTION_META, KILN_CODEC_NONE, sample_meta, strlen(sample_meta), err);
    if (!st) st = kiln_engine_writer_begin(w, KILN_SECTION_WEIGHTS, KILN_CODEC_ZSTD_CHUNKED, err);
    for (size_t off = 0; !st && off < BIG_SIZE; off += 1000003) {
        size_t n = BIG_SIZE - off < 1000003 ? BIG_SIZE - off : 1000003;
        st = kiln_engine_writer_write(w, s->big + off, n, err);
    }
    if (!st) st = kiln_engine_writer_end(w, err);
    if (!st) st = kiln_engine_writer_section(w, KILN_SECTION_PLAN, KILN_CODEC_ZSTD_CHUNKED, NULL, 0, err);
    if (!st) st = kiln_engine_writer_section(w, KILN_SECTION_TOKENIZER, KILN_CODEC_NONE, NULL, 0, err);
    if (!st) st = kiln_engine_writer_section(w, KILN_SECTION_KERNELS, KILN_CODEC_ZSTD_CHUNKED, s->small,
                                             sizeof s->small, err);
    if (!st) st = kiln_engine_writer_section(w, 77, KILN_CODEC_NONE, s->odd, sizeof s->odd, err);
    if (st) {
        kiln_engine_writer_abort(w);
        return st;
    }
    return kiln_engine_writer_finish(w, err);
}

/* Shared by the tests: the sample, written once, and its bytes. */
static sample g_sample;
static char *g_dir;
static char *g_path;
static uint8_t *g_file;
static size_t g_size;

/* ---- tests ---- */

static void test_roundtrip(void) {
    KT_REQUIRE(g_file);
    kiln_error err = {0};
    kiln_engine e;
    kiln_status st = kiln_engine_open(g_path, &e, &err);
    KT_REQUIRE(st == KILN_OK);
    KT_EQ_INT(e.major, KILN_ENGINE_MAJOR);
    KT_EQ_INT(e.minor, KILN_ENGINE_MINOR);
    KT_EQ_INT(e.n_sections, N_SAMPLE_SECTIONS);
    KT_EQ_INT(e.size, g_size);
    KT_EQ_INT(kiln_rd_u64(g_file + 24), g_size);

    const struct {
        uint32_t kind, codec;
        const void *data;
        size_t size;
    } want[N_SAMPLE_SECTIONS] = {
        {KILN_SECTION_META, KILN_CODEC_NONE, sample_meta, strlen(sample_meta)},
        {KILN_SECTION_WEIGHTS, KILN_CODEC_ZSTD_CHUNKED, g_sample.big, BIG_SIZE},
        {KILN_SECTION_PLAN, KILN_CODEC_ZSTD_CHUNKED, NULL, 0},
        {KILN_SECTION_TOKENIZER, KILN_CODEC_NONE, NULL, 0},
        {KILN_SECTION_KERNELS, KILN_CODEC_ZSTD_CHUNKED, g_sample.small, sizeof g_sample.small},
        {77, KILN_CODEC_NONE, g_sample.odd, sizeof g_sample.odd},
    };
    for (int i = 0; i < N_SAMPLE_SECTIONS; i++) {
        const kiln_engine_section *s = &e.sections[i];
        KT_EQ_INT(s->kind, want[i].kind);
        KT_EQ_INT(s->codec, want[i].codec);
        KT_EQ_INT(s->raw_size, want[i].size);
        KT_EQ_INT(s->offset % KILN_ENGINE_ALIGN, 0);
        KT_CHECK(s->offset >= KILN_ENGINE_ALIGN);
        const uint8_t *d;
        size_t n;
        bool owned;
        st = kiln_engine_section_bytes(&e, s, 2, &d, &n, &owned, &err);
        KT_CHECKF(st == KILN_OK, "section %d: %s", i, err.msg);
        if (st) continue;
        KT_EQ_INT(n, want[i].size);
        KT_CHECK(d != NULL);
        KT_CHECK(n == 0 || memcmp(d, want[i].data, n) == 0);
        KT_EQ_INT(owned, want[i].codec == KILN_CODEC_ZSTD_CHUNKED && want[i].size > 0);
        if (owned) {
            KT_EQ_INT((uintptr_t)d % KILN_ENGINE_ALIGN, 0);
            free((void *)d);
        } else if (want[i].size) {
            KT_CHECK(d == e.data + s->offset); /* uncompressed: straight from the mapping */
        }
    }
    /* the weights compressed, into 3 chunks: footer says so */
    const kiln_engine_section *w = kiln_engine_find(&e, KILN_SECTION_WEIGHTS);
    KT_REQUIRE(w == &e.sections[1]);
    KT_CHECK(w->stored_size < w->raw_size);
    const uint8_t *foot = e.data + w->offset + w->stored_size - 16;
    KT_EQ_INT(kiln_rd_u64(foot), BIG_SIZE);
    KT_EQ_INT(kiln_rd_u32(foot + 8), KILN_ENGINE_ZSTD_CHUNK);
    KT_EQ_INT(kiln_rd_u32(foot + 12), 3);
    /* an empty zstd section is just its footer */
    KT_EQ_INT(e.sections[2].stored_size, 16);
    KT_CHECK(kiln_engine_find(&e, 99) == NULL);
    KT_CHECK(kiln_engine_find(&e, 77) == &e.sections[5]);
    KT_EQ_STR(kiln_section_kind_name(77), "unknown");
    KT_EQ_STR(kiln_section_kind_name(KILN_SECTION_TOKENIZER), "tokenizer");
    KT_EQ_STR(kiln_codec_name(KILN_CODEC_ZSTD_CHUNKED), "zstd-chunked");
    KT_EQ_STR(kiln_codec_name(5), "unknown");
    kiln_engine_close(&e);

    struct stat sb;
    KT_CHECK(stat(g_path, &sb) == 0 && (sb.st_mode & 0777) == 0644);
    KT_EQ_INT(dir_count(g_dir), 1); /* no temporary file left beside it */
}

static void test_deterministic(void) {
    KT_REQUIRE(g_file);
    char *p2 = kiln_path_join(g_dir, "again.kiln");
    kiln_error err = {0};
    KT_REQUIRE(write_sample(&g_sample, p2, &err) == KILN_OK);
    size_t n2 = 0;
    uint8_t *f2 = slurp(p2, &n2);
    KT_REQUIRE(f2);
    KT_EQ_INT(n2, g_size);
    KT_CHECK(n2 == g_size && memcmp(f2, g_file, n2) == 0);
    free(f2);
    unlink(p2);
    free(p2);
}

static void test_truncation(void) {
    KT_REQUIRE(g_file);
    uint64_t toff = kiln_rd_u64(g_file + 16);
    size_t cuts[256];
    int n = 0;
    for (int k = 0; k < 64; k++) cuts[n++] = g_size * (size_t)k / 64;
    for (size_t c = 1; c <= 72; c += 3) cuts[n++] = c; /* around the header */
    cuts[n++] = 63;
    cuts[n++] = 65;
    cuts[n++] = KILN_ENGINE_ALIGN;
    for (int d = -3; d <= 3; d++) cuts[n++] = (size_t)((int64_t)toff + d); /* around the table */
    cuts[n++] = toff + 64;
    cuts[n++] = g_size - 64;
    cuts[n++] = g_size - 1;
    for (int i = 0; i < n; i++) {
        kiln_error err = {0};
        kiln_status st = open_copy(g_file, cuts[i], &err);
        KT_CHECKF(st == KILN_ERR_FORMAT || st == KILN_ERR_CHECKSUM, "cut at %zu: status %d", cuts[i], st);
        KT_CONTAINS(err.msg, "truncated");
    }
    /* the message through a real file */
    char *p = kiln_path_join(g_dir, "cut.kiln");
    FILE *f = fopen(p, "wb");
    KT_REQUIRE(f);
    fwrite(g_file, 1, g_size / 2, f);
    fclose(f);
    kiln_error err = {0};
    kiln_engine e;
    KT_EQ_INT(kiln_engine_open(p, &e, &err), KILN_ERR_FORMAT);
    char want[128];
    snprintf(want, sizeof want, "truncated: header says %zu bytes, file has %zu", g_size, g_size / 2);
    KT_CONTAINS(err.msg, want);
    KT_CONTAINS(err.msg, "cut.kiln");
    /* bytes appended are refused too */
    uint8_t *longer = calloc(1, g_size + 100);
    KT_REQUIRE(longer);
    memcpy(longer, g_file, g_size);
    KT_EQ_INT(open_copy(longer, g_size + 100, &err), KILN_ERR_FORMAT);
    KT_CONTAINS(err.msg, "header says");
    free(longer);
    unlink(p);
    free(p);
}

static void test_flip_header(void) {
    KT_REQUIRE(g_file);
    uint8_t *c = dup_bytes(g_file, g_size);
    KT_REQUIRE(c);
    for (int i = 0; i < KILN_ENGINE_HEADER_SIZE; i++) {
        c[i] ^= 0xff;
        kiln_error err = {0};
        kiln_engine e;
        kiln_status st = kiln_engine_open_mem(c, g_size, "x.kiln", &e, &err);
        kiln_status want = i < 8 ? KILN_ERR_FORMAT : i < 10 ? KILN_ERR_VERSION : KILN_ERR_CHECKSUM;
        KT_CHECKF(st == want, "byte %d: status %d, want %d (%s)", i, st, want, err.msg);
        if (want == KILN_ERR_CHECKSUM) KT_CONTAINS(err.msg, "header checksum mismatch");
        c[i] ^= 0xff;
    }
    free(c);
}

static void test_flip_table(void) {
    KT_REQUIRE(g_file);
    uint8_t *c = dup_bytes(g_file, g_size);
    KT_REQUIRE(c);
    uint64_t toff = kiln_rd_u64(g_file + 16);
    KT_EQ_INT(toff + 64 * N_SAMPLE_SECTIONS, g_size); /* the table ends the file */
    for (size_t i = toff; i < g_size; i++) {
        c[i] ^= 0x01;
        kiln_error err = {0};
        kiln_engine e;
        kiln_status st = kiln_engine_open_mem(c, g_size, "x.kiln", &e, &err);
        KT_CHECKF(st == KILN_ERR_CHECKSUM, "table byte %zu: status %d (%s)", i - toff, st, err.msg);
        KT_CONTAINS(err.msg, "section table checksum mismatch");
        c[i] ^= 0x01;
    }
    free(c);
}

static void test_flip_sections(void) {
    KT_REQUIRE(g_file);
    kiln_engine e;
    kiln_error err = {0};
    KT_REQUIRE(kiln_engine_open_mem(g_file, g_size, "x.kiln", &e, &err) == KILN_OK);
    uint8_t *c = dup_bytes(g_file, g_size);
    KT_REQUIRE(c);
    int tried = 0;
    for (uint32_t i = 0; i < e.n_sections; i++) {
        const kiln_engine_section *s = &e.sections[i];
        if (s->stored_size == 0) continue;
        uint64_t at[3] = {s->offset, s->offset + s->stored_size / 2, s->offset + s->stored_size - 1};
        for (int k = 0; k < 3; k++) {
            c[at[k]] ^= 0x80;
            kiln_engine e2;
            kiln_status st = kiln_engine_open_mem(c, g_size, "x.kiln", &e2, &err);
            KT_CHECKF(st == KILN_ERR_CHECKSUM, "section %u byte %llu: status %d", i,
                      (unsigned long long)(at[k] - s->offset), st);
            char want[96];
            if (s->kind == 77)
                snprintf(want, sizeof want, "section #%u (unknown kind 77) checksum mismatch", i);
            else
                snprintf(want, sizeof want, "section '%s' checksum mismatch: the file is corrupted",
                         kiln_section_kind_name(s->kind));
            KT_CONTAINS(err.msg, want);
            KT_CONTAINS(err.msg, "x.kiln: ");
            c[at[k]] ^= 0x80;
            tried++;
        }
    }
    KT_EQ_INT(tried, 3 * 5); /* all but the empty tokenizer (an empty zstd section still has its footer) */
    kiln_engine_close(&e);
    free(c);
}

static void test_wrong_magic(void) {
    /* a safetensors file: u64 header length, JSON */
    uint8_t st_file[200] = {0};
    const char *js = "{\"model.embed_tokens.weight\":{\"dtype\":\"BF16\",\"shape\":[2,2],\"data_offsets\":[0,8]}}";
    kiln_wr_u64(st_file, strlen(js));
    memcpy(st_file + 8, js, strlen(js));
    kiln_error err = {0};
    KT_EQ_INT(open_copy(st_file, 8 + strlen(js) + 8, &err), KILN_ERR_FORMAT);
    KT_CONTAINS(err.msg, "x.kiln: not a kiln engine file");
    KT_CONTAINS(err.msg, "did you pass the checkpoint instead of the engine?");
    /* config.json */
    const char *cfg = "{\n  \"architectures\": [\"LlamaForCausalLM\"],\n  \"hidden_size\": 64,\n  \"vocab_size\": 512\n}\n";
    KT_EQ_INT(open_copy((const uint8_t *)cfg, strlen(cfg), &err), KILN_ERR_FORMAT);
    KT_CONTAINS(err.msg, "not a kiln engine file");
    KT_CONTAINS(err.msg, "checkpoint");
    /* a small JSON is truncated, with the same hint */
    KT_EQ_INT(open_copy((const uint8_t *)"{}", 2, &err), KILN_ERR_FORMAT);
    KT_CONTAINS(err.msg, "truncated");
    KT_CONTAINS(err.msg, "checkpoint");
    /* something else: no checkpoint hint */
    uint8_t junk[4096];
    fill_pattern(junk, sizeof junk, 9);
    KT_EQ_INT(open_copy(junk, sizeof junk, &err), KILN_ERR_FORMAT);
    KT_CONTAINS(err.msg, "not a kiln engine file");
    KT_CHECK(strstr(err.msg, "checkpoint") == NULL);
    /* an empty file */
    KT_EQ_INT(open_copy(junk, 0, &err), KILN_ERR_FORMAT);
    KT_CONTAINS(err.msg, "truncated");
    /* a directory, missing file */
    kiln_engine e;
    KT_EQ_INT(kiln_engine_open(KILN_SOURCE_DIR, &e, &err), KILN_ERR_IO);
    KT_CONTAINS(err.msg, "checkpoint directory");
    KT_EQ_INT(kiln_engine_open(KILN_BINARY_DIR "/no/such.kiln", &e, &err), KILN_ERR_IO);
    KT_CONTAINS(err.msg, "no/such.kiln");
}

static void test_versions(void) {
    KT_REQUIRE(g_file);
    uint8_t *c = dup_bytes(g_file, g_size);
    KT_REQUIRE(c);
    kiln_error err = {0};
    kiln_engine e;
    /* major 3: refused before the header checksum is even looked at */
    c[8] = KILN_ENGINE_MAJOR + 1;
    KT_EQ_INT(kiln_engine_open_mem(c, g_size, "new.kiln", &e, &err), KILN_ERR_VERSION);
    KT_CONTAINS(err.msg, "new.kiln: engine format 3.x is newer than this runtime (reads 2.x)");
    KT_CONTAINS(err.msg, "\nhint: rebuild the engine with this kiln or upgrade the runtime");
    reseal_header(c); /* still refused with a valid checksum */
    KT_EQ_INT(kiln_engine_open_mem(c, g_size, "new.kiln", &e, &err), KILN_ERR_VERSION);
    c[8] = 0;
    c[10] = 0; /* minor 0 whatever KILN_ENGINE_MINOR is */
    reseal_header(c);
    KT_EQ_INT(kiln_engine_open_mem(c, g_size, "zero.kiln", &e, &err), KILN_ERR_VERSION);
    KT_CONTAINS(err.msg, "0.0 is not a valid version");
    /* a newer minor is read */
    c[8] = KILN_ENGINE_MAJOR;
    c[10] = 7;
    KT_EQ_INT(kiln_engine_open_mem(c, g_size, "minor.kiln", &e, &err), KILN_ERR_CHECKSUM); /* not resealed */
    reseal_header(c);
    kiln_status st = kiln_engine_open_mem(c, g_size, "minor.kiln", &e, &err);
    KT_CHECKF(st == KILN_OK, "%s", err.msg);
    KT_EQ_INT(e.minor, 7);
    KT_EQ_INT(e.n_sections, N_SAMPLE_SECTIONS);
    kiln_engine_close(&e);
    /* reserved header bytes set by a newer minor are ignored */
    c[45] = 0x5a;
    reseal_header(c);
    KT_EQ_INT(kiln_engine_open_mem(c, g_size, "minor.kiln", &e, &err), KILN_OK);
    kiln_engine_close(&e);
    /* format 1 (one XXH64 per section) is still read, and its checksums are checked as such */
    c[8] = 1;
    c[10] = 0;
    reseal_header(c);
    KT_EQ_INT(kiln_engine_open_mem(c, g_size, "v1.kiln", &e, &err), KILN_ERR_CHECKSUM); /* format 2 sums */
    reseal(c, g_size);
    st = kiln_engine_open_mem(c, g_size, "v1.kiln", &e, &err);
    KT_CHECKF(st == KILN_OK, "%s", err.msg);
    KT_EQ_INT(e.major, 1);
    kiln_engine_close(&e);
    free(c);
}

/* A section of several checksum pieces: verified piece by piece (in
 * parallel), and a flipped byte in any piece, the last included, is caught. */
static void test_piecewise_checksum(void) {
    const size_t n = 2 * (size_t)KILN_ENGINE_HASH_PIECE + 12345;
    uint8_t *big = malloc(n);
    KT_REQUIRE(big);
    fill_pattern(big, n, 7);
    char path[300];
    snprintf(path, sizeof path, "%s/big.kiln", g_dir);
    kiln_engine_writer *w = NULL;
    kiln_error err = {0};
    KT_REQUIRE(kiln_engine_writer_open(path, &w, &err) == KILN_OK);
    /* in uneven writes, so pieces straddle the calls */
    KT_CHECK(kiln_engine_writer_begin(w, KILN_SECTION_WEIGHTS, KILN_CODEC_NONE, &err) == KILN_OK);
    for (size_t off = 0; off < n;) {
        size_t take = n - off < 7777777 ? n - off : 7777777;
        KT_CHECK(kiln_engine_writer_write(w, big + off, take, &err) == KILN_OK);
        off += take;
    }
    KT_CHECK(kiln_engine_writer_end(w, &err) == KILN_OK);
    KT_CHECK(kiln_engine_writer_section(w, KILN_SECTION_META, KILN_CODEC_NONE, "{}", 2, &err) == KILN_OK);
    KT_REQUIRE(kiln_engine_writer_finish(w, &err) == KILN_OK);
    kiln_engine e;
    KT_REQUIRE(kiln_engine_open(path, &e, &err) == KILN_OK);
    const kiln_engine_section *s = kiln_engine_find(&e, KILN_SECTION_WEIGHTS);
    KT_REQUIRE(s && s->stored_size == n);
    /* the same digest one-threaded, many-threaded, and from the definition */
    uint64_t one = kiln_engine_checksum(2, big, n, 1), many = kiln_engine_checksum(2, big, n, 8);
    uint8_t list[24];
    for (int i = 0; i < 3; i++) {
        size_t off = (size_t)i * KILN_ENGINE_HASH_PIECE, len = i < 2 ? KILN_ENGINE_HASH_PIECE : 12345;
        kiln_wr_u64(list + 8 * i, XXH3_64bits(big + off, len));
    }
    KT_CHECK(one == s->checksum && many == s->checksum && XXH3_64bits(list, sizeof list) == s->checksum);
    size_t size = e.size;
    uint8_t *c = dup_bytes(e.data, size);
    uint64_t at = s->offset;
    kiln_engine_close(&e);
    KT_REQUIRE(c);
    for (int i = 0; i < 3; i++) {
        size_t flip = (size_t)at + (size_t)i * KILN_ENGINE_HASH_PIECE + (i < 2 ? 999 : 12344);
        c[flip] ^= 1;
        KT_EQ_INT(kiln_engine_open_mem(c, size, "big.kiln", &e, &err), KILN_ERR_CHECKSUM);
        KT_CONTAINS(err.msg, "section 'weights' checksum mismatch");
        c[flip] ^= 1;
    }
    KT_EQ_INT(kiln_engine_open_mem(c, size, "big.kiln", &e, &err), KILN_OK);
    kiln_engine_close(&e);
    free(c);
    free(big);
    unlink(path);
}

/* ---- hand-crafted containers ---- */

typedef struct craft_entry {
    uint32_t kind, codec;
    uint64_t offset, stored, raw;
    const uint8_t *payload; /* stored bytes to place at offset (NULL: a pattern) */
} craft_entry;

/* Build a file of `size` bytes with `n` entries whose table is at `toff`;
 * payloads are placed where they fit, checksums computed where possible. */
static uint8_t *craft(size_t size, uint64_t toff, uint32_t n, const craft_entry *ents) {
    uint8_t *f = calloc(1, size);
    if (!f) return NULL;
    memcpy(f, KILN_ENGINE_MAGIC, 8);
    f[8] = KILN_ENGINE_MAJOR;
    kiln_wr_u32(f + 12, n);
    kiln_wr_u64(f + 16, toff);
    kiln_wr_u64(f + 24, size);
    for (uint32_t i = 0; i < n; i++) {
        const craft_entry *c = &ents[i];
        if (c->offset >= 64 && c->offset <= size && c->stored <= size - c->offset) {
            if (c->payload)
                memcpy(f + c->offset, c->payload, c->stored);
            else
                fill_pattern(f + c->offset, c->stored, 100 + i);
        }
        if (toff >= 64 && toff <= size && (size - toff) / 64 > i) {
            uint8_t *t = f + toff + 64 * i;
            kiln_wr_u32(t, c->kind);
            kiln_wr_u32(t + 4, c->codec);
            kiln_wr_u64(t + 8, c->offset);
            kiln_wr_u64(t + 16, c->stored);
            kiln_wr_u64(t + 24, c->raw);
        }
    }
    reseal(f, size);
    return f;
}

static kiln_status open_crafted(size_t size, uint64_t toff, uint32_t n, const craft_entry *ents, kiln_error *err) {
    uint8_t *f = craft(size, toff, n, ents);
    if (!f) return KILN_ERR_NOMEM;
    kiln_engine e;
    kiln_status st = kiln_engine_open_mem(f, size, "c.kiln", &e, err);
    kiln_engine_close(&e);
    free(f);
    return st;
}

static void test_crafted(void) {
    const uint64_t A = KILN_ENGINE_ALIGN;
    kiln_error err = {0};
    /* the crafting is right: a valid two-section file opens */
    craft_entry ok[2] = {{KILN_SECTION_META, 0, A, 100, 100, NULL}, {KILN_SECTION_WEIGHTS, 0, 2 * A, 3000, 3000, NULL}};
    size_t size = 4 * A;
    kiln_status st = open_crafted(size, 3 * A, 2, ok, &err);
    KT_CHECKF(st == KILN_OK, "%s", err.msg);

    struct {
        const char *name;
        uint32_t n;
        uint64_t toff;
        craft_entry e[2];
        const char *msg;
    } bad[] = {
        {"same offset", 2, 3 * A, {{1, 0, A, 5000, 5000, NULL}, {3, 0, A, 100, 100, NULL}}, "overlaps section 'meta'"},
        {"partial overlap", 2, 3 * A, {{1, 0, A, 5000, 5000, NULL}, {3, 0, 2 * A, 100, 100, NULL}},
         "section 'weights' (bytes 8192..8292) overlaps section 'meta' (bytes 4096..9096)"},
        {"overlaps table", 1, 3 * A, {{3, 0, 2 * A, A + 1, A + 1, NULL}}, "overlaps the section table"},
        {"overlaps header", 1, 3 * A, {{3, 0, 0, 100, 100, NULL}}, "overlaps the header"},
        {"unaligned", 1, 3 * A, {{3, 0, A + 4, 100, 100, NULL}}, "offset 4100 is not a multiple of 4096"},
        {"past end", 1, 3 * A, {{3, 0, 3 * A, A + 1, A + 1, NULL}}, "runs past the end of the file"},
        {"offset overflow", 1, 3 * A, {{3, 0, UINT64_MAX - A + 1, 2 * A, 2 * A, NULL}}, "runs past the end"},
        {"size overflow", 1, 3 * A, {{3, 0, A, UINT64_MAX, UINT64_MAX, NULL}}, "runs past the end"},
        {"unknown codec", 1, 3 * A, {{3, 9, A, 100, 100, NULL}}, "section 'weights' uses unknown codec 9"},
        {"raw != stored", 1, 3 * A, {{3, 0, A, 100, 101, NULL}}, "raw size 101 differs from its stored size 100"},
        {"count 0", 0, 3 * A, {{0}}, "section count 0 is outside 1..64"},
        {"table past end", 2, 4 * A - 64, {{1, 0, A, 1, 1, NULL}, {3, 0, 2 * A, 1, 1, NULL}}, "section table"},
        {"table on header", 1, 0, {{3, 0, A, 1, 1, NULL}}, "section table (offset 0"},
        {"table overflow", 1, UINT64_MAX - 10, {{3, 0, A, 1, 1, NULL}}, "is not inside the file"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        kiln_error e2 = {0};
        st = open_crafted(size, bad[i].toff, bad[i].n, bad[i].e, &e2);
        KT_CHECKF(st == KILN_ERR_FORMAT, "%s: status %d (%s)", bad[i].name, st, e2.msg);
        KT_CHECKF(strstr(e2.msg, bad[i].msg) != NULL, "%s: \"%s\" lacks \"%s\"", bad[i].name, e2.msg, bad[i].msg);
        KT_CHECKF(strstr(e2.msg, "c.kiln: ") == e2.msg, "%s: message does not start with the file", bad[i].name);
    }
    /* count 65, written by hand (the table is only checked after the count) */
    uint8_t *f = craft(size, 3 * A, 1, ok);
    KT_REQUIRE(f);
    kiln_wr_u32(f + 12, KILN_ENGINE_MAX_SECTIONS + 1);
    reseal_header(f);
    kiln_engine e;
    KT_EQ_INT(kiln_engine_open_mem(f, size, "c.kiln", &e, &err), KILN_ERR_FORMAT);
    KT_CONTAINS(err.msg, "section count 65 is outside 1..64");
    free(f);

    /* allowed: an unknown kind; an empty section at the same offset as another */
    craft_entry fine[2] = {{200, 0, A, 10, 10, NULL}, {KILN_SECTION_PLAN, 0, A, 0, 0, NULL}};
    f = craft(size, 3 * A, 2, fine);
    KT_REQUIRE(f);
    st = kiln_engine_open_mem(f, size, "c.kiln", &e, &err);
    KT_CHECKF(st == KILN_OK, "%s", err.msg);
    if (st == KILN_OK) {
        KT_EQ_INT(e.sections[0].kind, 200);
        KT_CHECK(kiln_engine_find(&e, KILN_SECTION_PLAN) == &e.sections[1]);
        kiln_engine_close(&e);
    }
    free(f);
    craft_entry empties[2] = {{1, 0, 3 * A, 0, 0, NULL}, {2, 1, 3 * A, 0, 0, NULL}};
    /* a zstd section of 0 stored bytes has no footer: refused; codec none is fine */
    st = open_crafted(size, 3 * A, 1, empties, &err);
    KT_CHECKF(st == KILN_OK, "%s", err.msg);
    st = open_crafted(size, 3 * A, 2, empties, &err);
    KT_EQ_INT(st, KILN_ERR_FORMAT);
    KT_CONTAINS(err.msg, "cannot hold the 16-byte zstd chunk footer");
}

/* A zstd section crafted from explicit frames: raw_size, chunk_size and the frames. */
static kiln_status open_zstd_crafted(uint64_t raw, uint32_t chunk, uint32_t count, const uint64_t *sizes,
                                     const uint8_t *frames, size_t frames_len, uint64_t table_raw, bool decode,
                                     kiln_error *err) {
    uint8_t *payload = malloc(frames_len + 8 * (size_t)count + 16);
    if (!payload) return KILN_ERR_NOMEM;
    size_t n = 0;
    memcpy(payload, frames, frames_len);
    n += frames_len;
    for (uint32_t i = 0; i < count; i++, n += 8) kiln_wr_u64(payload + n, sizes[i]);
    kiln_wr_u64(payload + n, raw);
    kiln_wr_u32(payload + n + 8, chunk);
    kiln_wr_u32(payload + n + 12, count);
    n += 16;
    const uint64_t A = KILN_ENGINE_ALIGN, toff = A + kiln_align_up(n, A), size = toff + A;
    craft_entry ce = {KILN_SECTION_WEIGHTS, KILN_CODEC_ZSTD_CHUNKED, A, n, table_raw, payload};
    uint8_t *f = craft(size, toff, 1, &ce);
    free(payload);
    if (!f) return KILN_ERR_NOMEM;
    kiln_engine e;
    kiln_status st = kiln_engine_open_mem(f, size, "z.kiln", &e, err);
    if (st == KILN_OK && decode) {
        const uint8_t *d;
        size_t dn;
        bool owned;
        st = kiln_engine_section_bytes(&e, &e.sections[0], 1, &d, &dn, &owned, err);
        if (st == KILN_OK && owned) free((void *)d);
    }
    kiln_engine_close(&e);
    free(f);
    return st;
}

static void test_zstd_index(void) {
    uint8_t raw[300];
    fill_pattern(raw, sizeof raw, 5);
    uint8_t fr[2][600];
    size_t f0 = ZSTD_compress(fr[0], sizeof fr[0], raw, 200, 3);
    size_t f1 = ZSTD_compress(fr[1], sizeof fr[1], raw + 200, 100, 3);
    KT_REQUIRE(!ZSTD_isError(f0) && !ZSTD_isError(f1));
    uint8_t frames[1200];
    memcpy(frames, fr[0], f0);
    memcpy(frames + f0, fr[1], f1);
    uint64_t sizes[2] = {f0, f1};
    kiln_error err = {0};
    /* valid: 300 bytes in chunks of 200 */
    kiln_status st = open_zstd_crafted(300, 200, 2, sizes, frames, f0 + f1, 300, true, &err);
    KT_CHECKF(st == KILN_OK, "%s", err.msg);
    /* index inconsistencies, found at open */
    KT_EQ_INT(open_zstd_crafted(300, 200, 2, sizes, frames, f0 + f1, 301, false, &err), KILN_ERR_FORMAT);
    KT_CONTAINS(err.msg, "zstd footer says 300 raw bytes, the section table says 301");
    KT_EQ_INT(open_zstd_crafted(300, 200, 3, (uint64_t[]){f0, f1, 0}, frames, f0 + f1, 300, false, &err),
              KILN_ERR_FORMAT);
    KT_CONTAINS(err.msg, "zstd chunk count is 3, but 300 raw bytes in chunks of 200 make 2");
    KT_EQ_INT(open_zstd_crafted(300, 0, 2, sizes, frames, f0 + f1, 300, false, &err), KILN_ERR_FORMAT);
    KT_CONTAINS(err.msg, "chunk size is 0");
    KT_EQ_INT(open_zstd_crafted(300, 200, 2, (uint64_t[]){f0 + 1, f1}, frames, f0 + f1, 300, false, &err),
              KILN_ERR_FORMAT);
    KT_CONTAINS(err.msg, "add up to more than");
    KT_EQ_INT(open_zstd_crafted(300, 200, 2, (uint64_t[]){f0 - 1, f1}, frames, f0 + f1, 300, false, &err),
              KILN_ERR_FORMAT);
    KT_CONTAINS(err.msg, "zstd chunk sizes add up to");
    KT_EQ_INT(open_zstd_crafted(300, 200, 1000, (uint64_t[1000]){0}, frames, 0, 300, false, &err), KILN_ERR_FORMAT);
    KT_CONTAINS(err.msg, "zstd chunk count is 1000");
    /* more raw bytes than zstd can encode in the stored bytes: refused before any allocation */
    uint64_t huge = (uint64_t)1 << 40;
    KT_EQ_INT(open_zstd_crafted(huge, 1u << 31, 512, (uint64_t[512]){[0] = f0}, frames, f0, huge, false, &err),
              KILN_ERR_FORMAT);
    KT_CONTAINS(err.msg, "zstd chunk 0 of 512");
    KT_CONTAINS(err.msg, "cannot hold 2147483648 raw bytes");
    KT_EQ_INT(open_zstd_crafted(300, 300, 1, (uint64_t[]){1}, frames, 1, 300, false, &err), KILN_ERR_FORMAT);
    KT_CONTAINS(err.msg, "zstd chunk 0 of 1: 1 stored bytes cannot hold 300 raw bytes");
    /* frames that decode to the wrong size: found at decode, naming the chunk */
    st = open_zstd_crafted(400, 200, 2, sizes, frames, f0 + f1, 400, true, &err);
    KT_EQ_INT(st, KILN_ERR_CODEC);
    KT_CONTAINS(err.msg, "z.kiln: section 'weights', zstd chunk 1 of 2: decoded to 100 bytes, expected 200");
    st = open_zstd_crafted(200, 100, 2, sizes, frames, f0 + f1, 200, true, &err);
    KT_EQ_INT(st, KILN_ERR_CODEC);
    KT_CONTAINS(err.msg, "section 'weights', zstd chunk 0 of 2: zstd:");
    /* not zstd at all */
    uint8_t junk[64];
    fill_pattern(junk, sizeof junk, 7);
    st = open_zstd_crafted(100, 100, 1, (uint64_t[]){64}, junk, 64, 100, true, &err);
    KT_EQ_INT(st, KILN_ERR_CODEC);
    KT_CONTAINS(err.msg, "zstd chunk 0 of 1");
}

static void test_bad_frame_in_written_file(void) {
    KT_REQUIRE(g_file);
    kiln_engine e;
    kiln_error err = {0};
    KT_REQUIRE(kiln_engine_open_mem(g_file, g_size, "x.kiln", &e, &err) == KILN_OK);
    const kiln_engine_section *w = &e.sections[1];
    const uint8_t *sz = e.data + w->offset + w->stored_size - 16 - 3 * 8;
    uint64_t chunk1 = w->offset + kiln_rd_u64(sz);
    uint8_t *c = dup_bytes(g_file, g_size);
    KT_REQUIRE(c);
    kiln_engine_close(&e);
    c[chunk1] ^= 0xff; /* chunk 1's frame magic */
    reseal(c, g_size);
    KT_REQUIRE(kiln_engine_open_mem(c, g_size, "x.kiln", &e, &err) == KILN_OK); /* checksums were redone */
    for (int threads = 1; threads <= 4; threads += 3) {
        const uint8_t *d = (const uint8_t *)"x";
        size_t n = 7;
        bool owned = true;
        kiln_status st = kiln_engine_section_bytes(&e, &e.sections[1], threads, &d, &n, &owned, &err);
        KT_EQ_INT(st, KILN_ERR_CODEC);
        KT_CONTAINS(err.msg, "x.kiln: section 'weights', zstd chunk 1 of 3: zstd:");
        KT_CHECK(d == NULL && n == 0 && !owned);
    }
    kiln_engine_close(&e);
    free(c);
}

static void test_parallel_decode(void) {
    KT_REQUIRE(g_file);
    kiln_engine e;
    kiln_error err = {0};
    KT_REQUIRE(kiln_engine_open(g_path, &e, &err) == KILN_OK);
    const kiln_engine_section *w = kiln_engine_find(&e, KILN_SECTION_WEIGHTS);
    KT_REQUIRE(w);
    const int threads[] = {1, 2, 3, 8, 0, -1};
    for (size_t i = 0; i < sizeof threads / sizeof threads[0]; i++) {
        const uint8_t *d;
        size_t n;
        bool owned;
        kiln_status st = kiln_engine_section_bytes(&e, w, threads[i], &d, &n, &owned, &err);
        KT_CHECKF(st == KILN_OK, "threads %d: %s", threads[i], err.msg);
        if (st) continue;
        KT_CHECK(owned);
        KT_EQ_INT(n, BIG_SIZE);
        KT_CHECKF(memcmp(d, g_sample.big, BIG_SIZE) == 0, "threads %d: bytes differ", threads[i]);
        free((void *)d);
    }
    kiln_engine_close(&e);
}

/* ---- the writer leaves no partial file ---- */

static void test_writer_abort(void) {
    char *dir = make_tmpdir();
    KT_REQUIRE(dir);
    char *p = kiln_path_join(dir, "m.kiln");
    kiln_engine_writer *w;
    kiln_error err = {0};
    KT_REQUIRE(kiln_engine_writer_open(p, &w, &err) == KILN_OK);
    KT_EQ_INT(kiln_engine_writer_section(w, KILN_SECTION_META, 0, "{}", 2, &err), KILN_OK);
    KT_EQ_INT(kiln_engine_writer_begin(w, KILN_SECTION_WEIGHTS, KILN_CODEC_ZSTD_CHUNKED, &err), KILN_OK);
    KT_EQ_INT(kiln_engine_writer_write(w, g_sample.small, sizeof g_sample.small, &err), KILN_OK);
    KT_EQ_INT(dir_count(dir), 1); /* the temporary file */
    kiln_engine_writer_abort(w);
    KT_EQ_INT(dir_count(dir), 0);
    kiln_engine_writer_abort(NULL);

    /* an existing engine survives an aborted rewrite, and a finished one replaces it */
    FILE *f = fopen(p, "wb");
    KT_REQUIRE(f);
    fputs("old", f);
    fclose(f);
    KT_REQUIRE(kiln_engine_writer_open(p, &w, &err) == KILN_OK);
    KT_EQ_INT(kiln_engine_writer_section(w, KILN_SECTION_META, 0, "{}", 2, &err), KILN_OK);
    kiln_engine_writer_abort(w);
    KT_EQ_INT(dir_count(dir), 1);
    size_t n = 0;
    uint8_t *old = slurp(p, &n);
    KT_CHECK(old && n == 3 && memcmp(old, "old", 3) == 0);
    free(old);
    KT_REQUIRE(kiln_engine_writer_open(p, &w, &err) == KILN_OK);
    KT_EQ_INT(kiln_engine_writer_section(w, KILN_SECTION_META, 0, "{}", 2, &err), KILN_OK);
    KT_EQ_INT(kiln_engine_writer_finish(w, &err), KILN_OK);
    KT_EQ_INT(dir_count(dir), 1);
    kiln_engine e;
    KT_EQ_INT(kiln_engine_open(p, &e, &err), KILN_OK);
    kiln_engine_close(&e);
    free(p);
    rm_tree(dir);
    free(dir);
}

static void test_writer_failures(void) {
    char *dir = make_tmpdir();
    KT_REQUIRE(dir);
    kiln_engine_writer *w;
    kiln_error err = {0};

    /* target in a missing directory */
    char *p = kiln_path_join(dir, "missing/m.kiln");
    KT_EQ_INT(kiln_engine_writer_open(p, &w, &err), KILN_ERR_IO);
    KT_CHECK(w == NULL);
    KT_CONTAINS(err.msg, "missing/m.kiln: cannot create the output file");
    KT_CONTAINS(err.msg, "hint: does the output directory exist?");
    KT_EQ_INT(dir_count(dir), 0);
    free(p);

    /* misuse: no sections, bad codec, bytes outside a section → error, no file */
    p = kiln_path_join(dir, "m.kiln");
    KT_REQUIRE(kiln_engine_writer_open(p, &w, &err) == KILN_OK);
    KT_EQ_INT(kiln_engine_writer_finish(w, &err), KILN_ERR_INVALID_ARG);
    KT_CONTAINS(err.msg, "at least one section");
    KT_EQ_INT(dir_count(dir), 0);
    KT_REQUIRE(kiln_engine_writer_open(p, &w, &err) == KILN_OK);
    KT_EQ_INT(kiln_engine_writer_begin(w, KILN_SECTION_META, 42, &err), KILN_ERR_INVALID_ARG);
    KT_CONTAINS(err.msg, "unknown codec 42");
    KT_EQ_INT(dir_count(dir), 0); /* removed at the failure, before finish */
    KT_EQ_INT(kiln_engine_writer_section(w, KILN_SECTION_META, 0, "{}", 2, &err), KILN_ERR_INVALID_ARG);
    KT_EQ_INT(kiln_engine_writer_finish(w, &err), KILN_ERR_INVALID_ARG); /* the first error, again */
    KT_CONTAINS(err.msg, "unknown codec 42");
    KT_EQ_INT(dir_count(dir), 0);
    KT_REQUIRE(kiln_engine_writer_open(p, &w, &err) == KILN_OK);
    KT_EQ_INT(kiln_engine_writer_write(w, "x", 1, &err), KILN_ERR_INTERNAL);
    kiln_engine_writer_abort(w);
    KT_REQUIRE(kiln_engine_writer_open(p, &w, &err) == KILN_OK);
    for (int i = 0; i < KILN_ENGINE_MAX_SECTIONS; i++)
        KT_REQUIRE(kiln_engine_writer_section(w, 100 + (uint32_t)i, 0, NULL, 0, &err) == KILN_OK);
    KT_EQ_INT(kiln_engine_writer_section(w, 1, 0, NULL, 0, &err), KILN_ERR_INVALID_ARG);
    KT_CONTAINS(err.msg, "more than 64 sections");
    kiln_engine_writer_abort(w);
    KT_EQ_INT(dir_count(dir), 0);

    /* a write that fails half way (file size limit → EFBIG) */
    struct rlimit old;
    if (getrlimit(RLIMIT_FSIZE, &old) == 0) {
        struct rlimit lim = old;
        lim.rlim_cur = 3u << 20;
        void (*prev)(int) = signal(SIGXFSZ, SIG_IGN);
        if (setrlimit(RLIMIT_FSIZE, &lim) == 0) {
            KT_REQUIRE(kiln_engine_writer_open(p, &w, &err) == KILN_OK);
            kiln_status st = kiln_engine_writer_section(w, KILN_SECTION_WEIGHTS, 0, g_sample.big, BIG_SIZE, &err);
            setrlimit(RLIMIT_FSIZE, &old);
            KT_EQ_INT(st, KILN_ERR_IO);
            KT_CONTAINS(err.msg, "m.kiln: cannot write");
            KT_EQ_INT(dir_count(dir), 0);
            KT_EQ_INT(kiln_engine_writer_finish(w, &err), KILN_ERR_IO);
            KT_EQ_INT(dir_count(dir), 0);
        } else {
            fprintf(stderr, "  note: cannot lower RLIMIT_FSIZE; mid-write failure not tested\n");
        }
        signal(SIGXFSZ, prev);
    }
    free(p);
    rm_tree(dir);
    free(dir);
}

/* ---- the fuzz seeds: small valid engines ---- */

/* not *.kiln: .gitignore ignores those */
static const char *const seed_names[] = {"small.seed", "chunks.seed"};

static kiln_status write_seed(int which, const char *path, kiln_error *err) {
    kiln_engine_writer *w;
    kiln_status st = kiln_engine_writer_open(path, &w, err);
    if (st) return st;
    if (which == 0) {
        uint8_t plan[16];
        fill_pattern(plan, sizeof plan, 11);
        st = kiln_engine_writer_section(w, KILN_SECTION_META, KILN_CODEC_NONE, sample_meta, strlen(sample_meta), err);
        if (!st) st = kiln_engine_writer_section(w, KILN_SECTION_WEIGHTS, KILN_CODEC_ZSTD_CHUNKED, g_sample.small,
                                                 sizeof g_sample.small, err);
        if (!st) st = kiln_engine_writer_section(w, KILN_SECTION_PLAN, KILN_CODEC_NONE, plan, sizeof plan, err);
        if (!st) st = kiln_engine_writer_section(w, KILN_SECTION_TOKENIZER, KILN_CODEC_ZSTD_CHUNKED, NULL, 0, err);
    } else {
        /* two chunks of zeros: a few hundred stored bytes, 4 MiB + 1000 decoded */
        uint8_t *zeros = calloc(1, KILN_ENGINE_ZSTD_CHUNK + 1000);
        if (!zeros) {
            kiln_engine_writer_abort(w);
            return KILN_ERR_NOMEM;
        }
        st = kiln_engine_writer_section(w, KILN_SECTION_WEIGHTS, KILN_CODEC_ZSTD_CHUNKED, zeros,
                                        KILN_ENGINE_ZSTD_CHUNK + 1000, err);
        if (!st) st = kiln_engine_writer_section(w, 77, KILN_CODEC_NONE, g_sample.odd, sizeof g_sample.odd, err);
        free(zeros);
    }
    if (st) {
        kiln_engine_writer_abort(w);
        return st;
    }
    return kiln_engine_writer_finish(w, err);
}

/* The committed seeds open and decode. KILN_WRITE_FUZZ_CORPUS=DIR rewrites them first. */
static void test_fuzz_corpus(void) {
    const char *out = getenv("KILN_WRITE_FUZZ_CORPUS");
    const char *dir = out ? out : KILN_SOURCE_DIR "/fuzz/corpus/engine";
    for (int i = 0; i < 2; i++) {
        char *p = kiln_path_join(dir, seed_names[i]);
        KT_REQUIRE(p);
        kiln_error err = {0};
        if (out) KT_CHECKF(write_seed(i, p, &err) == KILN_OK, "%s", err.msg);
        kiln_engine e;
        kiln_status st = kiln_engine_open(p, &e, &err);
        KT_CHECKF(st == KILN_OK, "%s", err.msg);
        for (uint32_t k = 0; st == KILN_OK && k < e.n_sections; k++) {
            const uint8_t *d;
            size_t n;
            bool owned;
            KT_CHECKF(kiln_engine_section_bytes(&e, &e.sections[k], 2, &d, &n, &owned, &err) == KILN_OK, "%s",
                      err.msg);
            if (owned) free((void *)d);
        }
        if (st == KILN_OK) {
            KT_EQ_INT(e.n_sections, i == 0 ? 4 : 2);
            KT_CHECK(e.size <= 32768); /* small enough for a seed */
        }
        kiln_engine_close(&e);
        free(p);
    }
}

int main(void) {
    sample_init(&g_sample);
    g_dir = make_tmpdir();
    if (g_sample.big && g_dir) {
        g_path = kiln_path_join(g_dir, "sample.kiln");
        kiln_error err = {0};
        if (write_sample(&g_sample, g_path, &err) == KILN_OK)
            g_file = slurp(g_path, &g_size);
        else
            fprintf(stderr, "writing the sample engine failed: %s\n", err.msg);
    }
    KT_RUN(test_roundtrip);
    KT_RUN(test_deterministic);
    KT_RUN(test_truncation);
    KT_RUN(test_flip_header);
    KT_RUN(test_flip_table);
    KT_RUN(test_flip_sections);
    KT_RUN(test_wrong_magic);
    KT_RUN(test_versions);
    KT_RUN(test_piecewise_checksum);
    KT_RUN(test_crafted);
    KT_RUN(test_zstd_index);
    KT_RUN(test_bad_frame_in_written_file);
    KT_RUN(test_parallel_decode);
    KT_RUN(test_writer_abort);
    KT_RUN(test_writer_failures);
    KT_RUN(test_fuzz_corpus);
    free(g_file);
    free(g_path);
    if (g_dir) rm_tree(g_dir);
    free(g_dir);
    free(g_sample.big);
    return KT_END();
}
