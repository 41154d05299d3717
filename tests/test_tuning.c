/*
 * test_tuning.c — the tuning section (format/kiln_tuning.h, runtime/tuning.c)
 * and the in-place section append (runtime/engine_append.c), without a GPU:
 * the records round-trip; every rule of the reader refuses a crafted
 * section with a message naming the record and entry; a tiny engine gets a
 * section appended, still verifies, loads and generates the same tokens,
 * and a reader that does not know the kind (kind 99 here) skips it; a
 * replaced record leaves one section; an append that fails half-way
 * (RLIMIT_FSIZE) leaves the file byte-identical. The GPU side (the executor
 * using a record) is in test_gpu_exec.c.
 */
#include <jansson.h>
#include <signal.h>
#include <sys/wait.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "format/kiln_tuning.h"
#include "runtime/kiln.h"
#include "runtime/kiln_rt.h"
#include "kt.h"
#include "kt_fixture.h"

static char tmpdir[512], engine[1024];

/* A record with n GEMM entries of distinct shapes and recognisable bytes. */
static void make_record(kiln_tuning_record *r, uint32_t sm, const char *device, uint32_t n) {
    memset(r, 0, sizeof *r);
    r->sm = sm;
    r->driver_version = 13000;
    r->lt_version = 130100;
    snprintf(r->device, sizeof r->device, "%s", device);
    r->gemv_max_m = 8, r->qgemv_max_m = 32, r->rope_split_max_t = 64, r->attn_waves = 2.0f, r->seconds = 1.5f;
    r->decode_tc_min = 96;
    r->n_gemms = n;
    r->gemms = calloc(n ? n : 1, sizeof *r->gemms);
    for (uint32_t i = 0; i < n; i++) {
        kiln_tuning_gemm *g = &r->gemms[i];
        g->m = 16u << (i % 4), g->n = 4096 + 64 * i, g->k = 4096, g->flags = i % 2 ? KILN_TUNING_ACCUMULATE : 0;
        g->us = 10.0f + (float)i, g->heuristic_us = i == 0 ? -1.0f : 12.0f + (float)i;
        g->candidates = 12, g->pick = i % 12;
        for (int b = 0; b < KILN_TUNING_ALGO_SIZE; b++) g->algo[b] = (uint8_t)(i * 7 + (uint32_t)b);
    }
}

static void test_roundtrip(void) {
    kiln_tuning t = {0};
    kiln_tuning_record a, b;
    kiln_error err = {0};
    make_record(&a, 90, "NVIDIA H200", 5);
    make_record(&b, 80, "NVIDIA A100-SXM4-80GB", 0);
    KT_REQUIRE(kiln_tuning_put(&t, &a, &err) == KILN_OK && kiln_tuning_put(&t, &b, &err) == KILN_OK);
    KT_CHECK(a.gemms == NULL); /* taken */
    free(b.gemms);
    kiln_buf buf;
    KT_REQUIRE(kiln_tuning_write(&t, &buf, &err) == KILN_OK);
    KT_EQ_INT(buf.len, KILN_TUNING_HEADER_SIZE + 2 * KILN_TUNING_RECORD_SIZE + 5 * KILN_TUNING_GEMM_SIZE);
    kiln_tuning u;
    KT_REQUIRE(kiln_tuning_parse(buf.data, buf.len, "rt", &u, &err) == KILN_OK);
    KT_EQ_INT(u.n_records, 2);
    const kiln_tuning_record *r = &u.records[0];
    KT_EQ_INT(r->sm, 90);
    KT_EQ_STR(r->device, "NVIDIA H200");
    KT_EQ_INT(r->lt_version, 130100);
    KT_EQ_INT(r->driver_version, 13000);
    KT_EQ_INT(r->n_gemms, 5);
    KT_EQ_INT(r->qgemv_max_m, 32);
    KT_CHECK(r->attn_waves == 2.0f && r->seconds == 1.5f);
    KT_EQ_INT(r->decode_tc_min, 96);
    KT_EQ_INT(kiln_rd_u32(buf.data + KILN_TUNING_HEADER_SIZE + 168), 96); /* at its documented offset */
    for (uint32_t i = 0; i < 5; i++) {
        const kiln_tuning_gemm *g = &r->gemms[i], *h = &t.records[0].gemms[i];
        KT_CHECK(g->m == h->m && g->n == h->n && g->k == h->k && g->flags == h->flags && g->us == h->us &&
                 g->heuristic_us == h->heuristic_us && g->pick == h->pick && !memcmp(g->algo, h->algo, 64));
    }
    /* pick: by sm and name, else the sm's first; find: exact M, else its power-of-two bucket */
    KT_CHECK(kiln_tuning_pick(&u, 90, "NVIDIA H100") == &u.records[0]);
    KT_CHECK(kiln_tuning_pick(&u, 80, "NVIDIA A100-SXM4-80GB") == &u.records[1]);
    KT_CHECK(kiln_tuning_pick(&u, 89, "NVIDIA L4") == NULL);
    const kiln_tuning_gemm *g0 = &r->gemms[0]; /* M 16, N 4096, K 4096, no flags */
    KT_CHECK(kiln_tuning_find(r, 16, 4096, 4096, 0) == g0);
    KT_CHECK(kiln_tuning_find(r, 9, 4096, 4096, 0) == g0);   /* 9 → bucket 16 */
    KT_CHECK(kiln_tuning_find(r, 17, 4096, 4096, 0) == NULL); /* 17 → 32: none */
    KT_CHECK(kiln_tuning_find(r, 16, 4096, 4096, KILN_TUNING_ACCUMULATE) == NULL);
    /* replacing a GPU's record keeps one per GPU */
    kiln_tuning_record c;
    make_record(&c, 90, "NVIDIA H200", 2);
    KT_REQUIRE(kiln_tuning_put(&u, &c, &err) == KILN_OK);
    KT_EQ_INT(u.n_records, 2);
    KT_EQ_INT(u.records[0].n_gemms, 2);
    kiln_tuning_free(&u);
    kiln_tuning_free(&t);
    kiln_buf_free(&buf);
}

/* Parse `d` (n bytes) expecting KILN_ERR_FORMAT (or `code`) and `want` in the message. */
static void refused(const uint8_t *d, size_t n, kiln_status code, const char *want) {
    kiln_tuning t;
    kiln_error err = {0};
    kiln_status st = kiln_tuning_parse(d, n, "bad", &t, &err);
    KT_CHECKF(st == code, "expected status %d, got %d (%s) for '%s'", code, st, err.msg, want);
    KT_CHECKF(strstr(err.msg, want) != NULL, "'%s' not in '%s'", want, err.msg);
    KT_EQ_INT(t.n_records, 0);
}

static void test_refusals(void) {
    kiln_tuning t = {0};
    kiln_tuning_record a;
    kiln_error err = {0};
    make_record(&a, 90, "NVIDIA H200", 3);
    KT_REQUIRE(kiln_tuning_put(&t, &a, &err) == KILN_OK);
    kiln_buf buf;
    KT_REQUIRE(kiln_tuning_write(&t, &buf, &err) == KILN_OK);
    const size_t n = buf.len, R = KILN_TUNING_HEADER_SIZE, G = R + KILN_TUNING_RECORD_SIZE;
    uint8_t *c = malloc(n + 8);
    KT_REQUIRE(c != NULL);
#define FRESH() memcpy(c, buf.data, n)
    FRESH();
    refused(c, 8, KILN_ERR_FORMAT, "shorter than its 16-byte header");
    FRESH(), c[0] = 'X';
    refused(c, n, KILN_ERR_FORMAT, "does not start with \"KTUN\"");
    FRESH(), kiln_wr_u32(c + 4, 2);
    refused(c, n, KILN_ERR_VERSION, "version 2");
    FRESH(), kiln_wr_u32(c + 8, KILN_TUNING_MAX_RECORDS + 1);
    refused(c, n, KILN_ERR_FORMAT, "33 tuning records");
    FRESH(), kiln_wr_u32(c + 8, 2);
    refused(c, n, KILN_ERR_FORMAT, "tuning record 1 at byte");
    FRESH();
    refused(c, n - 1, KILN_ERR_FORMAT, "3 GEMM entries");
    FRESH(), memset(c + n, 0, 8);
    refused(c, n + 8, KILN_ERR_FORMAT, "8 bytes after the last");
    FRESH(), kiln_wr_u32(c + R, 7);
    refused(c, n, KILN_ERR_FORMAT, "sm 7 is outside");
    FRESH(), memset(c + R + 16, 'A', KILN_TUNING_DEVICE_MAX);
    refused(c, n, KILN_ERR_FORMAT, "not NUL-terminated");
    FRESH(), memset(c + R + 16, 0, KILN_TUNING_DEVICE_MAX);
    refused(c, n, KILN_ERR_FORMAT, "device name is empty");
    FRESH(), kiln_wr_u32(c + R + 144, 0xFFFFFFFFu);
    refused(c, n, KILN_ERR_FORMAT, "4294967295 GEMM entries");
    FRESH(), kiln_wr_u32(c + R + 148, 65);
    refused(c, n, KILN_ERR_FORMAT, "gemv_max_m 65");
    FRESH(), kiln_wr_u32(c + R + 156, 70000);
    refused(c, n, KILN_ERR_FORMAT, "rope_split_max_t 70000");
    FRESH(), kiln_wr_u32(c + R + 160, 0x7FC00000u); /* NaN */
    refused(c, n, KILN_ERR_FORMAT, "attn_waves");
    FRESH(), kiln_wr_u32(c + R + 168, 65537);
    refused(c, n, KILN_ERR_FORMAT, "decode_tc_min 65537 outside 0..65536");
    FRESH(), kiln_wr_u32(c + G + KILN_TUNING_GEMM_SIZE + 4, 0);
    refused(c, n, KILN_ERR_FORMAT, "GEMM 1: shape M=32 N=0");
    FRESH(), kiln_wr_u32(c + G + 12, 64);
    refused(c, n, KILN_ERR_FORMAT, "GEMM 0: unknown flags 0x40");
    /* fast accumulation: only with W8A8 and a scale a row */
    FRESH(), kiln_wr_u32(c + G + 12, KILN_TUNING_FP8_FAST);
    refused(c, n, KILN_ERR_FORMAT, "GEMM 0: flags 0x20 do not go together");
    FRESH(), kiln_wr_u32(c + G + 12, KILN_TUNING_FP8 | KILN_TUNING_FP8_B128 | KILN_TUNING_FP8_FAST);
    refused(c, n, KILN_ERR_FORMAT, "GEMM 0: flags 0x38 do not go together");
    FRESH(), kiln_wr_u32(c + G + 12, KILN_TUNING_FP8 | KILN_TUNING_IN_F32);
    refused(c, n, KILN_ERR_FORMAT, "GEMM 0: flags 0x9 do not go together");
    FRESH(), kiln_wr_u32(c + G + 12, KILN_TUNING_FP8_B128);
    refused(c, n, KILN_ERR_FORMAT, "GEMM 0: flags 0x10 do not go together");
    /* W8A8 entries (what kiln tune records for an fp8 or fp8g128 engine's GEMMs past the GEMV) read back */
    static const uint32_t fp8_flags[] = {KILN_TUNING_FP8, KILN_TUNING_FP8 | KILN_TUNING_FP8_B128,
                                         KILN_TUNING_FP8 | KILN_TUNING_OUT_F32 | KILN_TUNING_ACCUMULATE};
    for (size_t i = 0; i < sizeof fp8_flags / sizeof fp8_flags[0]; i++) {
        kiln_tuning t8;
        FRESH(), kiln_wr_u32(c + G + 12, fp8_flags[i]);
        KT_EQ_INT(kiln_tuning_parse(c, n, "fp8", &t8, &err), KILN_OK);
        KT_EQ_INT((int)t8.records[0].gemms[0].flags, (int)fp8_flags[i]);
        kiln_tuning_free(&t8);
    }
    FRESH(), kiln_wr_u32(c + G + 16, 0);
    refused(c, n, KILN_ERR_FORMAT, "GEMM 0: times 0 us");
    FRESH(), kiln_wr_u32(c + G + 28, 12);
    refused(c, n, KILN_ERR_FORMAT, "pick 12 of 12");
    /* entry 2 made a copy of entry 0's shape */
    FRESH(), memcpy(c + G + 2 * KILN_TUNING_GEMM_SIZE, c + G, 16);
    refused(c, n, KILN_ERR_FORMAT, "GEMMs 0 and 2 are both M=16 N=4096 K=4096");
    /* two records for one GPU */
    uint8_t *two = malloc(2 * n);
    KT_REQUIRE(two != NULL);
    memcpy(two, buf.data, n);
    memcpy(two + n, buf.data + R, n - R);
    kiln_wr_u32(two + 8, 2);
    refused(two, 2 * n - R, KILN_ERR_FORMAT, "tuning records 0 and 1 are both for sm_90 \"NVIDIA H200\"");
    /* the writer refuses what the reader would */
    t.records[0].attn_waves = 100;
    kiln_buf bad;
    KT_EQ_INT(kiln_tuning_write(&t, &bad, &err), KILN_ERR_FORMAT);
    KT_CONTAINS(err.msg, "attn_waves 100");
#undef FRESH
    free(two);
    free(c);
    kiln_buf_free(&buf);
    kiln_tuning_free(&t);
}

static uint8_t *slurp(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long sz = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *d = malloc((size_t)sz + 1);
    if (d && fread(d, 1, (size_t)sz, f) != (size_t)sz) {
        free(d);
        d = NULL;
    }
    fclose(f);
    *n = (size_t)sz;
    return d;
}

static bool copy_file(const char *from, const char *to) {
    size_t n;
    uint8_t *d = slurp(from, &n);
    FILE *f = d ? fopen(to, "wb") : NULL;
    bool ok = f && fwrite(d, 1, n, f) == n;
    if (f) ok = fclose(f) == 0 && ok;
    free(d);
    return ok;
}

/* Greedy tokens of `path` on the CPU for a fixed prompt; n on success, -1 on failure. */
static int generate(const char *path, int32_t *out, int cap) {
    kiln_t *k = NULL;
    if (kiln_open(path, 0, &k) != KILN_OK) {
        fprintf(stderr, "  kiln_open %s: %s\n", path, kiln_error_message(k));
        kiln_close(k);
        return -1;
    }
    kiln_ctx_options o;
    kiln_ctx_options_init(&o);
    o.device = "cpu";
    o.max_batch = 1;
    o.threads = 2;
    kiln_ctx_t *c = NULL;
    int total = -1;
    if (kiln_ctx_new(k, &o, &c) == KILN_OK) {
        kiln_request_options ro;
        kiln_request_options_init(&ro);
        ro.max_tokens = cap;
        const int32_t prompt[] = {1, 17, 42, 99, 7};
        int64_t id;
        if (kiln_submit(c, prompt, 5, &ro, &id) == KILN_OK) {
            total = 0;
            int32_t n, fin = 0, reason;
            while (!fin && total >= 0) {
                if (kiln_poll(c, id, out + total, cap - total, &n, &fin, &reason) != KILN_OK) total = -1;
                else total += n;
                if (total >= 0 && !fin && n == 0 && kiln_run_step(c) != KILN_OK) total = -1;
            }
        }
    }
    kiln_ctx_free(c);
    kiln_close(k);
    return total;
}

static void test_append_in_place(void) {
    char path[1100], other[1100];
    snprintf(path, sizeof path, "%s/append.kiln", tmpdir);
    snprintf(other, sizeof other, "%s/unknown.kiln", tmpdir);
    KT_REQUIRE(copy_file(engine, path) && copy_file(engine, other));
    int32_t before[16], after[16];
    int nb = generate(path, before, 16);
    KT_REQUIRE(nb > 0);
    size_t n0;
    uint8_t *orig = slurp(path, &n0);
    KT_REQUIRE(orig != NULL);

    kiln_tuning t = {0};
    kiln_tuning_record a;
    kiln_error err = {0};
    make_record(&a, 90, "NVIDIA H200", 4);
    KT_REQUIRE(kiln_tuning_put(&t, &a, &err) == KILN_OK);
    kiln_buf sec;
    KT_REQUIRE(kiln_tuning_write(&t, &sec, &err) == KILN_OK);
    uint64_t s0 = 0, s1 = 0;
    KT_REQUIRE(kiln_engine_put_section(path, KILN_SECTION_TUNING, sec.data, sec.len, &s0, &s1, &err) == KILN_OK);
    KT_EQ_INT(s0, n0);
    KT_CHECK(s1 > s0);
    /* it verifies; the old bytes are unchanged but for the header; the section reads back */
    size_t n1;
    uint8_t *now = slurp(path, &n1);
    KT_REQUIRE(now != NULL);
    KT_EQ_INT(n1, s1);
    KT_CHECK(memcmp(now + KILN_ENGINE_HEADER_SIZE, orig + KILN_ENGINE_HEADER_SIZE, n0 - KILN_ENGINE_HEADER_SIZE) == 0);
    KT_CHECK(memcmp(now + 8, orig + 8, 4) == 0); /* major and minor kept */
    free(now);
    kiln_engine e;
    KT_REQUIRE(kiln_engine_open(path, &e, &err) == KILN_OK);
    const kiln_engine_section *ts = kiln_engine_find(&e, KILN_SECTION_TUNING);
    KT_REQUIRE(ts != NULL);
    KT_EQ_INT(ts->offset % KILN_ENGINE_ALIGN, 0);
    KT_CHECK(ts->offset >= n0);
    kiln_tuning u;
    bool present = false;
    KT_REQUIRE(kiln_tuning_load(&e, &u, &present, &err) == KILN_OK && present);
    KT_EQ_INT(u.records[0].n_gemms, 4);
    kiln_tuning_free(&u);
    const uint32_t n_sections = e.n_sections;
    kiln_engine_close(&e);
    /* it loads and generates the same tokens */
    nb = nb > 16 ? 16 : nb;
    int na = generate(path, after, 16);
    KT_EQ_INT(na, nb);
    KT_CHECK(na == nb && memcmp(before, after, (size_t)nb * sizeof *before) == 0);

    /* replacing it: still one tuning section, the new record */
    kiln_tuning_record b;
    make_record(&b, 90, "NVIDIA H200", 2);
    KT_REQUIRE(kiln_tuning_put(&t, &b, &err) == KILN_OK);
    kiln_buf sec2;
    KT_REQUIRE(kiln_tuning_write(&t, &sec2, &err) == KILN_OK);
    KT_REQUIRE(kiln_engine_put_section(path, KILN_SECTION_TUNING, sec2.data, sec2.len, NULL, NULL, &err) == KILN_OK);
    KT_REQUIRE(kiln_engine_open(path, &e, &err) == KILN_OK);
    KT_EQ_INT(e.n_sections, n_sections);
    KT_REQUIRE(kiln_tuning_load(&e, &u, &present, &err) == KILN_OK);
    KT_EQ_INT(u.n_records, 1);
    KT_EQ_INT(u.records[0].n_gemms, 2);
    kiln_tuning_free(&u);
    kiln_engine_close(&e);
    /* kiln inspect lists it (text and --json) */
    char cmd[3000], out[1200];
    snprintf(out, sizeof out, "%s/inspect.txt", tmpdir);
    snprintf(cmd, sizeof cmd, "'%s' inspect --json '%s' > '%s' 2>&1", KILN_EXE, path, out);
    KT_EQ_INT(system(cmd), 0);
    json_t *j = json_load_file(out, 0, NULL), *rec = json_array_get(json_object_get(j, "tuning"), 0);
    KT_EQ_STR(json_string_value(json_object_get(rec, "sm")), "sm_90");
    KT_EQ_STR(json_string_value(json_object_get(rec, "device")), "NVIDIA H200");
    KT_EQ_INT(json_integer_value(json_object_get(rec, "cublaslt_version")), 130100);
    KT_EQ_INT(json_array_size(json_object_get(rec, "shapes")), 2);
    KT_EQ_INT(json_integer_value(json_object_get(json_array_get(json_object_get(rec, "shapes"), 1), "m")), 32);
    json_decref(j);
    snprintf(cmd, sizeof cmd, "'%s' inspect '%s' > '%s' 2>&1", KILN_EXE, path, out);
    KT_EQ_INT(system(cmd), 0);
    size_t tn;
    char *txt = (char *)slurp(out, &tn);
    KT_REQUIRE(txt != NULL);
    txt[tn] = 0;
    KT_CONTAINS(txt, "tuning: sm_90 \"NVIDIA H200\", cuBLASLt 130100, driver 13000: 2 GEMM shapes; gemv_max_m 8");
    free(txt);

    /* a section of a kind this reader does not know (as kind 7 is to a reader before 2.4): skipped */
    KT_REQUIRE(kiln_engine_put_section(other, 99, sec.data, sec.len, NULL, NULL, &err) == KILN_OK);
    KT_REQUIRE(kiln_engine_open(other, &e, &err) == KILN_OK);
    KT_CHECK(kiln_engine_find(&e, 99) != NULL);
    kiln_engine_close(&e);
    na = generate(other, after, 16);
    KT_CHECK(na == nb && memcmp(before, after, (size_t)nb * sizeof *before) == 0);

    /* a corrupt tuning record (the checksum made to match) refuses the engine in inspect's check */
    sec.data[KILN_TUNING_HEADER_SIZE] = 7; /* sm 7 */
    KT_REQUIRE(kiln_engine_put_section(other, KILN_SECTION_TUNING, sec.data, sec.len, NULL, NULL, &err) == KILN_OK);
    KT_REQUIRE(kiln_engine_open(other, &e, &err) == KILN_OK);
    KT_EQ_INT(kiln_tuning_load(&e, &u, &present, &err), KILN_ERR_FORMAT);
    KT_CONTAINS(err.msg, "tuning record 0: sm 7 is outside 50..999");
    kiln_engine_close(&e);
    snprintf(cmd, sizeof cmd, "'%s' inspect '%s' > '%s' 2>&1", KILN_EXE, other, out);
    KT_EQ_INT(WEXITSTATUS(system(cmd)), 1);
    txt = (char *)slurp(out, &tn);
    KT_REQUIRE(txt != NULL);
    txt[tn] = 0;
    KT_CONTAINS(txt, "kiln inspect: error: ");
    KT_CONTAINS(txt, "sm 7 is outside 50..999");
    free(txt);

    kiln_buf_free(&sec);
    kiln_buf_free(&sec2);
    kiln_tuning_free(&t);
    free(orig);
}

/* Appends that fail leave the file byte-identical. */
static void test_append_failures(void) {
    char path[1100], notengine[1100];
    snprintf(path, sizeof path, "%s/fail.kiln", tmpdir);
    snprintf(notengine, sizeof notengine, "%s/not.kiln", tmpdir);
    KT_REQUIRE(copy_file(engine, path));
    size_t n0, n1;
    uint8_t *orig = slurp(path, &n0);
    KT_REQUIRE(orig != NULL);
    uint8_t sec[3000];
    memset(sec, 0x5a, sizeof sec);
    kiln_error err = {0};

    /* the file may grow by the section and a little: the table does not fit (EFBIG) */
    struct rlimit old, lim;
    KT_REQUIRE(getrlimit(RLIMIT_FSIZE, &old) == 0);
    void (*prev)(int) = signal(SIGXFSZ, SIG_IGN);
    lim = old;
    lim.rlim_cur = kiln_align_up(n0, KILN_ENGINE_ALIGN) + sizeof sec + 10;
    KT_REQUIRE(setrlimit(RLIMIT_FSIZE, &lim) == 0);
    kiln_status st = kiln_engine_put_section(path, KILN_SECTION_TUNING, sec, sizeof sec, NULL, NULL, &err);
    setrlimit(RLIMIT_FSIZE, &old);
    signal(SIGXFSZ, prev);
    KT_EQ_INT(st, KILN_ERR_IO);
    KT_CONTAINS(err.msg, "writing the section table failed");
    KT_CONTAINS(err.msg, "left as it was");
    uint8_t *now = slurp(path, &n1);
    KT_REQUIRE(now != NULL);
    KT_EQ_INT(n1, n0);
    KT_CHECK(memcmp(now, orig, n0) == 0);
    free(now);

    /* a file that is not an engine is not touched */
    FILE *f = fopen(notengine, "wb");
    KT_REQUIRE(f != NULL);
    fputs("{\"not\": \"an engine\"}", f);
    fclose(f);
    KT_EQ_INT(kiln_engine_put_section(notengine, KILN_SECTION_TUNING, sec, sizeof sec, NULL, NULL, &err),
              KILN_ERR_FORMAT);
    KT_CONTAINS(err.msg, "cannot add a section");
    struct stat sb;
    KT_CHECK(stat(notengine, &sb) == 0 && sb.st_size == 20);

    /* a damaged engine is refused before anything is written */
    orig[n0 / 2] ^= 1;
    f = fopen(path, "wb");
    KT_REQUIRE(f != NULL && fwrite(orig, 1, n0, f) == n0);
    fclose(f);
    st = kiln_engine_put_section(path, KILN_SECTION_TUNING, sec, sizeof sec, NULL, NULL, &err);
    KT_CHECK(st == KILN_ERR_CHECKSUM || st == KILN_ERR_FORMAT);
    now = slurp(path, &n1);
    KT_CHECK(now && n1 == n0 && memcmp(now, orig, n0) == 0);
    free(now);
    free(orig);
}

int main(void) {
    KT_RUN(test_roundtrip);
    KT_RUN(test_refusals);
    if (!kt_tmpdir(tmpdir, sizeof tmpdir, "tuning")) return 1;
    snprintf(engine, sizeof engine, "%s/tiny.kiln", tmpdir);
    char ckpt[1024];
    snprintf(ckpt, sizeof ckpt, "%s/tests/data/tiny-mistral", KILN_SOURCE_DIR);
    kiln_compile_options opt = {.output_path = engine, .weight_dtype = KILN_DTYPE_COUNT_};
    if (kt_compile(ckpt, &opt) != KILN_OK) return 1;
    KT_RUN(test_append_in_place);
    KT_RUN(test_append_failures);
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", tmpdir);
    return KT_END();
}
