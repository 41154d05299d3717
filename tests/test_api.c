/*
 * test_api.c — the public C API (runtime/kiln.h) end to end on an engine
 * compiled from models/stories260k: open, contexts, requests through
 * polling and callbacks, stepping, cancel, KV-memory queueing, the
 * tokenizer, threads, and bad arguments (each a status plus a message that
 * says what is wrong), the device list (gpus) against a plain and a tp=2
 * engine among them. Generated ids are compared with HF's greedy ids in
 * tests/golden/stories260k/golden.json.
 */
#include <jansson.h>
#include <math.h>
#include <pthread.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "compiler/kiln_compiler.h"
#include "kt.h"
#include "kt_fixture.h"
#include "runtime/kiln.h"

static char tmpdir[256], engine[512], tok_engine[512], tp_engine[512];

typedef struct golden_case {
    int32_t prompt[64];
    int n_prompt;
    int32_t greedy[128];
    int n_greedy;
} golden_case;
static golden_case gc[3];
static int n_gc;

static int load_golden(void) {
    char path[1024];
    snprintf(path, sizeof path, "%s/tests/golden/stories260k/golden.json", KILN_SOURCE_DIR);
    json_error_t je;
    json_t *g = json_load_file(path, 0, &je);
    if (!g) return 0;
    json_t *cs = json_object_get(g, "cases");
    int n = 0;
    for (size_t i = 0; i < json_array_size(cs) && n < 3; i++) {
        json_t *p = json_object_get(json_array_get(cs, i), "prompt"), *gr = json_object_get(json_array_get(cs, i), "greedy");
        gc[n].n_prompt = (int)json_array_size(p);
        gc[n].n_greedy = (int)json_array_size(gr);
        for (int k = 0; k < gc[n].n_prompt; k++) gc[n].prompt[k] = (int32_t)json_integer_value(json_array_get(p, (size_t)k));
        for (int k = 0; k < gc[n].n_greedy; k++) gc[n].greedy[k] = (int32_t)json_integer_value(json_array_get(gr, (size_t)k));
        n++;
    }
    json_decref(g);
    return n;
}

static kiln_ctx_t *cpu_ctx(kiln_t *k, int max_batch, int max_context, int64_t kv_bytes) {
    kiln_ctx_options o;
    kiln_ctx_options_init(&o);
    o.device = "cpu";
    o.max_batch = max_batch;
    o.max_context = max_context;
    o.kv_bytes = kv_bytes;
    o.threads = 2;
    kiln_ctx_t *c = NULL;
    kiln_status st = kiln_ctx_new(k, &o, &c);
    if (st != KILN_OK) {
        fprintf(stderr, "  kiln_ctx_new: %s\n", kiln_last_error(c));
        kiln_ctx_free(c);
        return NULL;
    }
    return c;
}

/* Poll a request to its end in small bites. */
static int poll_all(kiln_ctx_t *c, int64_t id, int32_t *out, int cap, int32_t *reason) {
    int total = 0;
    int32_t n, fin = 0;
    while (!fin) {
        int bite = cap - total < 5 ? cap - total : 5;
        if (kiln_poll(c, id, out + total, bite, &n, &fin, reason) != KILN_OK) return -1;
        total += n;
        if (!fin && n == 0 && kiln_pending(c) > 0 && kiln_run_step(c) != KILN_OK) return -1;
        if (!fin && n == 0 && kiln_pending(c) == 0 && total == cap) return -2;
    }
    return total;
}

/* ---- engines ---- */

static void test_open(void) {
    kiln_t *k = NULL;
    KT_REQUIRE(kiln_open(engine, 0, &k) == KILN_OK);
    KT_EQ_STR(kiln_error_message(k), "");
    KT_EQ_INT(kiln_vocab_size(k), 512);
    KT_EQ_INT(kiln_max_context(k), 512);
    KT_EQ_INT(kiln_bos_id(k), 1);
    int32_t eos[4] = {0};
    KT_EQ_INT(kiln_eos_ids(k, eos, 4), 1);
    KT_EQ_INT(eos[0], 2);
    KT_EQ_INT(kiln_eos_ids(k, NULL, 0), 1);
    KT_EQ_INT(kiln_has_tokenizer(k), 0);
    KT_CONTAINS(kiln_meta_json(k), "\"vocab_size\"");
    KT_CHECK(kiln_open_seconds(k) > 0);
    kiln_close(k);
}

static void test_open_errors(void) {
    kiln_t *k = NULL;
    KT_EQ_INT(kiln_open(NULL, 0, &k), KILN_ERR_INVALID_ARG);
    KT_REQUIRE(k != NULL);
    KT_CONTAINS(kiln_error_message(k), "path is NULL");
    kiln_close(k);

    char missing[600];
    snprintf(missing, sizeof missing, "%s/no-such.kiln", tmpdir);
    KT_EQ_INT(kiln_open(missing, 0, &k), KILN_ERR_IO);
    KT_CONTAINS(kiln_error_message(k), "no-such.kiln");
    /* a failed handle answers, but holds nothing */
    KT_EQ_INT(kiln_vocab_size(k), 0);
    KT_EQ_INT(kiln_bos_id(k), -1);
    KT_CHECK(kiln_meta_json(k) == NULL);
    kiln_ctx_t *c = NULL;
    KT_EQ_INT(kiln_ctx_new(k, NULL, &c), KILN_ERR_INVALID_ARG);
    KT_CONTAINS(kiln_last_error(c), "did not open");
    KT_CONTAINS(kiln_last_error(c), "no-such.kiln");
    kiln_ctx_free(c);
    kiln_close(k);

    char junk[600];
    snprintf(junk, sizeof junk, "%s/junk.kiln", tmpdir);
    FILE *f = fopen(junk, "wb");
    KT_REQUIRE(f);
    fputs("this is not an engine file, just some text long enough to have a header's worth of bytes in it", f);
    fclose(f);
    KT_EQ_INT(kiln_open(junk, 0, &k), KILN_ERR_FORMAT);
    KT_CONTAINS(kiln_error_message(k), "junk.kiln");
    kiln_close(k);
    unlink(junk);

    KT_EQ_INT(kiln_open(engine, -1, &k), KILN_ERR_INVALID_ARG);
    KT_CONTAINS(kiln_error_message(k), "threads -1");
    kiln_close(k);
    KT_EQ_INT(kiln_open(engine, 0, NULL), KILN_ERR_INVALID_ARG);
    kiln_close(NULL);
    KT_EQ_STR(kiln_error_message(NULL), "kiln_t is NULL");
    KT_EQ_INT(kiln_vocab_size(NULL), 0);
}

/* ---- contexts ---- */

static void expect_ctx_error(kiln_t *k, const kiln_ctx_options *o, kiln_status want, const char *msg) {
    kiln_ctx_t *c = NULL;
    KT_EQ_INT(kiln_ctx_new(k, o, &c), want);
    KT_REQUIRE(c != NULL);
    KT_CONTAINS(kiln_last_error(c), msg);
    /* every call on a failed context is refused with a message */
    int64_t id = 7;
    int32_t p[1] = {1};
    KT_EQ_INT(kiln_submit(c, p, 1, NULL, &id), KILN_ERR_INVALID_ARG);
    KT_EQ_INT(id, 0);
    KT_CONTAINS(kiln_last_error(c), "failed to be created");
    KT_EQ_INT(kiln_run_step(c), KILN_ERR_INVALID_ARG);
    KT_EQ_INT(kiln_pending(c), 0);
    /* repeated calls quote the original cause once: the message is stable,
     * bounded, and does not nest ("kiln_submit: ... (kiln_submit: ...") */
    char first[2048];
    KT_EQ_INT(kiln_submit(c, p, 1, NULL, &id), KILN_ERR_INVALID_ARG);
    snprintf(first, sizeof first, "%s", kiln_last_error(c));
    for (int i = 0; i < 50; i++) {
        KT_EQ_INT(kiln_run_step(c), KILN_ERR_INVALID_ARG);
        KT_EQ_INT(kiln_run(c), KILN_ERR_INVALID_ARG);
        KT_EQ_INT(kiln_submit(c, p, 1, NULL, &id), KILN_ERR_INVALID_ARG);
    }
    KT_EQ_STR(kiln_last_error(c), first);
    KT_CONTAINS(kiln_last_error(c), msg);
    const char *again = strstr(kiln_last_error(c), "failed to be created");
    KT_CHECK(again && !strstr(again + 1, "failed to be created"));
    KT_CHECK(strstr(kiln_last_error(c), "kiln_submit") == kiln_last_error(c) &&
             !strstr(kiln_last_error(c) + 1, "kiln_submit"));
    kiln_ctx_free(c);
}

static void test_ctx_options(void) {
    kiln_t *k = NULL;
    KT_REQUIRE(kiln_open(engine, 0, &k) == KILN_OK);
    kiln_ctx_options o;

    kiln_ctx_t *c = NULL;
    KT_EQ_INT(kiln_ctx_new(NULL, NULL, &c), KILN_ERR_INVALID_ARG);
    KT_CONTAINS(kiln_last_error(c), "engine handle is NULL");
    kiln_ctx_free(c);
    KT_EQ_INT(kiln_ctx_new(k, NULL, NULL), KILN_ERR_INVALID_ARG);

    kiln_ctx_options_init(&o);
    o.device = "tpu";
    expect_ctx_error(k, &o, KILN_ERR_INVALID_ARG, "unknown device \"tpu\"");
    kiln_ctx_options_init(&o);
    o.max_batch = 0;
    expect_ctx_error(k, &o, KILN_ERR_INVALID_ARG, "max_batch 0");
    kiln_ctx_options_init(&o);
    o.max_batch = 5000;
    expect_ctx_error(k, &o, KILN_ERR_INVALID_ARG, "max_batch 5000");
    kiln_ctx_options_init(&o);
    o.max_context = 513;
    expect_ctx_error(k, &o, KILN_ERR_INVALID_ARG, "max_context 513");
    kiln_ctx_options_init(&o);
    o.max_context = -1;
    expect_ctx_error(k, &o, KILN_ERR_INVALID_ARG, "max_context -1");
    kiln_ctx_options_init(&o);
    o.kv_fraction = 0;
    expect_ctx_error(k, &o, KILN_ERR_INVALID_ARG, "kv_fraction");
    kiln_ctx_options_init(&o);
    o.kv_bytes = -5;
    expect_ctx_error(k, &o, KILN_ERR_INVALID_ARG, "kv_bytes -5");
    kiln_ctx_options_init(&o);
    o.device = "cpu";
    o.kv_bytes = 10; /* one stories260k token of K and V is 5 × 4 × 8 × 2 × 4 = 1280 bytes */
    expect_ctx_error(k, &o, KILN_ERR_INVALID_ARG, "1280 bytes");
    kiln_ctx_options_init(&o);
    o.max_batch = 4;
    o.max_step_tokens = 3;
    expect_ctx_error(k, &o, KILN_ERR_INVALID_ARG, "max_step_tokens 3 is below max_batch 4");
    kiln_ctx_options_init(&o);
    o.threads = -2;
    expect_ctx_error(k, &o, KILN_ERR_INVALID_ARG, "threads -2");
    kiln_ctx_options_init(&o);
    o.struct_size = 0;
    expect_ctx_error(k, &o, KILN_ERR_INVALID_ARG, "kiln_ctx_options_init");

    /* gpu: either this build and host have one, or a clear device error */
    kiln_ctx_options_init(&o);
    o.device = "gpu";
    c = NULL;
    kiln_status st = kiln_ctx_new(k, &o, &c);
    if (st != KILN_OK) {
        KT_EQ_INT(st, KILN_ERR_DEVICE);
        KT_CONTAINS(kiln_last_error(c), "gpu");
    }
    kiln_ctx_free(c);

    /* auto: a working context on whatever there is */
    kiln_ctx_options_init(&o);
    c = NULL;
    KT_REQUIRE(kiln_ctx_new(k, &o, &c) == KILN_OK);
    kiln_ctx_info info = {.struct_size = sizeof info};
    KT_REQUIRE(kiln_ctx_info_get(c, &info) == KILN_OK);
    KT_CHECK(strcmp(info.device, "cpu") == 0 || strcmp(info.device, "gpu") == 0);
    KT_EQ_INT(info.max_batch, 8);
    KT_EQ_INT(info.max_context, 512);
    KT_EQ_STR(kiln_last_error(c), "");
    kiln_ctx_info small = {.struct_size = 4};
    KT_EQ_INT(kiln_ctx_info_get(c, &small), KILN_ERR_INVALID_ARG);
    KT_CONTAINS(kiln_last_error(c), "struct_size");
    KT_EQ_INT(kiln_ctx_info_get(c, NULL), KILN_ERR_INVALID_ARG);
    kiln_ctx_free(c);

    /* cpu with defaults */
    c = cpu_ctx(k, 3, 0, 0);
    KT_REQUIRE(c);
    KT_REQUIRE(kiln_ctx_info_get(c, &info) == KILN_OK);
    KT_EQ_STR(info.device, "cpu");
    KT_EQ_STR(info.device_name, "cpu");
    KT_EQ_INT(info.max_batch, 3);
    KT_EQ_INT(info.max_step_tokens, 3 * 512); /* the default 8192, capped at 3 full contexts */
    KT_EQ_INT(info.kv_capacity_tokens, 3 * 512);
    KT_EQ_INT(info.device_bytes, 0);
    KT_CHECK(info.host_peak_bytes > 0);
    kiln_ctx_free(c);

    /* NULL handles */
    KT_EQ_INT(kiln_run_step(NULL), KILN_ERR_INVALID_ARG);
    KT_EQ_INT(kiln_run(NULL), KILN_ERR_INVALID_ARG);
    KT_EQ_INT(kiln_cancel(NULL, 1), KILN_ERR_INVALID_ARG);
    KT_EQ_INT(kiln_pending(NULL), 0);
    KT_EQ_STR(kiln_last_error(NULL), "kiln_ctx_t is NULL");
    int64_t id;
    KT_EQ_INT(kiln_submit(NULL, gc[0].prompt, 1, NULL, &id), KILN_ERR_INVALID_ARG);
    kiln_ctx_free(NULL);
    kiln_close(k);
}

/* A context on `k` with device `dev`, gpus `gpus`: *st its status, the context's device ("" when it
 * failed) into `device`. */
static void try_gpus(kiln_t *k, const char *dev, const char *gpus, kiln_status *st, char device[16]) {
    kiln_ctx_options o;
    kiln_ctx_options_init(&o);
    o.device = dev;
    o.gpus = gpus;
    kiln_ctx_t *c = NULL;
    *st = kiln_ctx_new(k, &o, &c);
    kiln_ctx_info info = {.struct_size = sizeof info};
    snprintf(device, 16, "%s", *st == KILN_OK && kiln_ctx_info_get(c, &info) == KILN_OK ? info.device : "");
    kiln_ctx_free(c);
}

/* kiln_ctx_options.gpus and tp_timeout_s: every bad list refused before any executor is made (device
 * "gpu", which this host may lack, so a refusal that came from the executor would show as
 * KILN_ERR_DEVICE), naming the item or both counts; a list is never the CPU's. */
static void test_ctx_gpus(void) {
    kiln_t *k = NULL, *tp = NULL;
    KT_REQUIRE(kiln_open(engine, 0, &k) == KILN_OK);
    KT_REQUIRE(kiln_open(tp_engine, 0, &tp) == KILN_OK);
    kiln_ctx_options o;
    char many[200] = "0";
    for (int i = 1; i < 65; i++) strcat(many, ",0");
    static const struct {
        const char *gpus, *msg;
    } bad[] = {
        {"a", "gpus \"a\": item 1 \"a\" is not a CUDA device ordinal"},
        {"0,", "gpus \"0,\": item 2 is empty"},
        {",0", "gpus \",0\": item 1 is empty"},
        {"0,,1", "item 2 is empty"},
        {"-1", "item 1 \"-1\" is not a CUDA device ordinal (a whole number 0..1023)"},
        {"1024", "item 1 \"1024\" is not"},
        {"0,1x", "item 2 \"1x\" is not"},
        {"0, 1", "item 2 \" 1\" is not"},
        {"00000", "item 1 \"00000\" is not"},
        {NULL, "more than 64 devices"}, /* `many`: 65 items */
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        kiln_ctx_options_init(&o);
        o.device = "gpu";
        o.gpus = bad[i].gpus ? bad[i].gpus : many;
        expect_ctx_error(k, &o, KILN_ERR_INVALID_ARG, bad[i].msg);
    }
    /* counts against the engine's ranks */
    kiln_ctx_options_init(&o);
    o.device = "gpu";
    o.gpus = "0,1";
    expect_ctx_error(k, &o, KILN_ERR_INVALID_ARG, "gpus \"0,1\" lists 2 devices, but the engine has 1 rank");
    o.gpus = "0";
    expect_ctx_error(tp, &o, KILN_ERR_INVALID_ARG, "gpus \"0\" lists 1 device, but the engine has 2 tensor-parallel "
                                                   "ranks: give 2 devices");
    o.gpus = "0,1,2";
    expect_ctx_error(tp, &o, KILN_ERR_INVALID_ARG, "lists 3 devices, but the engine has 2 tensor-parallel ranks");
    o.device = "auto";
    expect_ctx_error(tp, &o, KILN_ERR_INVALID_ARG, "lists 3 devices, but the engine has 2 tensor-parallel ranks");
    /* a list is the GPU's: refused with device "cpu", even when its count fits */
    kiln_ctx_options_init(&o);
    o.device = "cpu";
    o.gpus = "0";
    expect_ctx_error(k, &o, KILN_ERR_INVALID_ARG, "gpus \"0\" lists GPUs, which do not apply to device \"cpu\"");
    o.gpus = "0,1";
    expect_ctx_error(tp, &o, KILN_ERR_INVALID_ARG, "do not apply to device \"cpu\"");
    /* tp_timeout_s: 0..86400 */
    const double bad_timeouts[] = {-1, 86401, NAN};
    for (int i = 0; i < 3; i++) {
        kiln_ctx_options_init(&o);
        o.device = "cpu";
        o.tp_timeout_s = bad_timeouts[i];
        expect_ctx_error(tp, &o, KILN_ERR_INVALID_ARG, "tp_timeout_s");
    }
    kiln_ctx_options_init(&o);
    o.device = "cpu";
    o.tp_timeout_s = -1;
    expect_ctx_error(tp, &o, KILN_ERR_INVALID_ARG, "tp_timeout_s -1 is outside 0..86400 seconds");

    /* what is accepted: "" and NULL are the default list, a timeout is ignored on the CPU */
    kiln_status st;
    char dev[16];
    try_gpus(k, "cpu", "", &st, dev);
    KT_EQ_INT(st, KILN_OK);
    KT_EQ_STR(dev, "cpu");
    try_gpus(tp, "cpu", NULL, &st, dev);
    KT_EQ_INT(st, KILN_OK);
    kiln_ctx_options_init(&o);
    o.device = "cpu";
    o.tp_timeout_s = 86400;
    kiln_ctx_t *c = NULL;
    KT_EQ_INT(kiln_ctx_new(tp, &o, &c), KILN_OK);
    kiln_ctx_free(c);
    /* a caller built against 0.3 passes a struct that ends at measure: gpus and tp_timeout_s beyond it
     * are not read (here they would be refused) */
    kiln_ctx_options_init(&o);
    o.device = "cpu";
    o.gpus = "not read";
    o.tp_timeout_s = -5;
    o.struct_size = (uint32_t)(offsetof(kiln_ctx_options, measure) + sizeof o.measure);
    c = NULL;
    KT_EQ_INT(kiln_ctx_new(k, &o, &c), KILN_OK);
    kiln_ctx_free(c);
    o.struct_size = sizeof o;
    expect_ctx_error(k, &o, KILN_ERR_INVALID_ARG, "tp_timeout_s -5");
    o.tp_timeout_s = 0;
    expect_ctx_error(k, &o, KILN_ERR_INVALID_ARG, "gpus \"not read\": item 1");

    /* "auto" with a valid list is the GPU or an error, never the CPU: on a host or build without a
     * GPU (device "gpu" says KILN_ERR_DEVICE), KILN_ERR_DEVICE saying why there is no fallback */
    try_gpus(k, "gpu", NULL, &st, dev);
    const bool no_gpu = st == KILN_ERR_DEVICE;
    const struct {
        kiln_t *k;
        const char *gpus;
    } valid[] = {{k, "0"}, {tp, "0,1"}, {tp, "0,0"}};
    for (int i = 0; i < 3; i++) {
        try_gpus(valid[i].k, "auto", valid[i].gpus, &st, dev);
        KT_CHECKF(st != KILN_OK || strcmp(dev, "gpu") == 0, "auto with gpus \"%s\" ran on %s", valid[i].gpus, dev);
        if (no_gpu) {
            KT_EQ_INT(st, KILN_ERR_DEVICE);
            kiln_ctx_options_init(&o);
            o.gpus = valid[i].gpus;
            expect_ctx_error(valid[i].k, &o, KILN_ERR_DEVICE, "does not fall back to the CPU");
        }
    }
    /* without a list, "auto" still takes the CPU where there is no GPU */
    try_gpus(tp, "auto", "", &st, dev);
    KT_EQ_INT(st, KILN_OK);
    if (no_gpu) KT_EQ_STR(dev, "cpu");
    kiln_close(tp);
    kiln_close(k);
}

/* ---- requests ---- */

typedef struct collected {
    int64_t id;
    int32_t tokens[600];
    int n;
    int32_t finished, reason;
    int calls_after_finish;
} collected;

static int32_t collect_cb(void *user, int64_t id, int32_t token, int32_t finished, int32_t reason) {
    collected *c = user;
    if (c->finished) c->calls_after_finish++;
    if (token >= 0 && c->n < 600) c->tokens[c->n++] = token;
    if (finished) {
        c->finished = 1;
        c->reason = reason;
    }
    return 0;
}

/* Three golden prompts at once, two polled and one through a callback:
 * each gets HF's greedy ids. */
static void test_generate_batched(void) {
    kiln_t *k = NULL;
    KT_REQUIRE(kiln_open(engine, 2, &k) == KILN_OK);
    kiln_ctx_t *c = cpu_ctx(k, 4, 0, 0);
    KT_REQUIRE(c);
    int64_t ids[3];
    collected cb = {0};
    for (int i = 0; i < n_gc; i++) {
        kiln_request_options ro;
        kiln_request_options_init(&ro);
        ro.max_tokens = gc[i].n_greedy;
        ro.ignore_eos = 1;
        if (i == 1) {
            ro.on_token = collect_cb;
            ro.user = &cb;
        }
        KT_REQUIRE(kiln_submit(c, gc[i].prompt, gc[i].n_prompt, &ro, &ids[i]) == KILN_OK);
        KT_CHECK(ids[i] > 0 && (i == 0 || ids[i] > ids[i - 1]));
    }
    cb.id = ids[1];
    KT_EQ_INT(kiln_pending(c), 3);
    KT_REQUIRE(kiln_run(c) == KILN_OK);
    KT_EQ_INT(kiln_pending(c), 0);
    for (int i = 0; i < n_gc; i++) {
        int32_t got[600], reason = -1;
        int n;
        if (i == 1) {
            KT_CHECK(cb.finished);
            KT_EQ_INT(cb.calls_after_finish, 0);
            memcpy(got, cb.tokens, sizeof cb.tokens);
            n = cb.n;
            reason = cb.reason;
            int32_t m, fin;
            KT_EQ_INT(kiln_poll(c, ids[1], got, 10, &m, &fin, NULL), KILN_ERR_INVALID_ARG);
        } else {
            n = poll_all(c, ids[i], got, 600, &reason);
        }
        KT_EQ_INT(n, gc[i].n_greedy);
        KT_EQ_INT(reason, KILN_STOP_MAX_TOKENS);
        KT_CHECKF(n == gc[i].n_greedy && memcmp(got, gc[i].greedy, (size_t)n * sizeof *got) == 0,
                  "case %d differs from HF greedy", i);
    }
    kiln_ctx_info info = {.struct_size = sizeof info};
    KT_REQUIRE(kiln_ctx_info_get(c, &info) == KILN_OK);
    KT_EQ_INT(info.max_running, 3);
    KT_CHECK(info.steps >= 72 && info.steps < 80);
    kiln_ctx_free(c);
    kiln_close(k);
}

/* Stepping by hand: tokens arrive one step at a time; sampling options and
 * the defaults of kiln_request_options. */
static void test_step_and_sample(void) {
    kiln_t *k = NULL;
    KT_REQUIRE(kiln_open(engine, 0, &k) == KILN_OK);
    kiln_ctx_t *c = cpu_ctx(k, 2, 0, 0);
    KT_REQUIRE(c);
    kiln_request_options ro;
    kiln_request_options_init(&ro);
    KT_EQ_INT(ro.max_tokens, 128);
    KT_CHECK(ro.temperature == 0 && ro.top_k == 0 && ro.top_p == 1 && ro.on_token == NULL);
    ro.max_tokens = 10;
    ro.ignore_eos = 1;
    int64_t a;
    KT_REQUIRE(kiln_submit(c, gc[2].prompt, gc[2].n_prompt, &ro, &a) == KILN_OK);
    int32_t buf[16], n, fin, why;
    KT_REQUIRE(kiln_poll(c, a, buf, 16, &n, &fin, &why) == KILN_OK);
    KT_EQ_INT(n, 0);
    KT_EQ_INT(fin, 0);
    KT_EQ_INT(why, -1);
    for (int s = 0; s < 10; s++) {
        KT_REQUIRE(kiln_run_step(c) == KILN_OK);
        KT_REQUIRE(kiln_poll(c, a, buf, 16, &n, &fin, &why) == KILN_OK);
        KT_EQ_INT(n, 1);
        KT_EQ_INT(buf[0], gc[2].greedy[s]);
        KT_EQ_INT(fin, s == 9);
    }
    KT_EQ_INT(why, KILN_STOP_MAX_TOKENS);
    KT_EQ_INT(kiln_run_step(c), KILN_OK); /* nothing to do */

    /* the same seed gives the same sample; another seed, another */
    kiln_request_options so;
    kiln_request_options_init(&so);
    so.max_tokens = 30;
    so.ignore_eos = 1;
    so.temperature = 0.8f;
    so.top_k = 40;
    so.top_p = 0.9f;
    so.seed = 77;
    int64_t s1, s2, s3;
    KT_REQUIRE(kiln_submit(c, gc[1].prompt, gc[1].n_prompt, &so, &s1) == KILN_OK);
    KT_REQUIRE(kiln_submit(c, gc[1].prompt, gc[1].n_prompt, &so, &s2) == KILN_OK);
    so.seed = 78;
    KT_REQUIRE(kiln_submit(c, gc[1].prompt, gc[1].n_prompt, &so, &s3) == KILN_OK);
    KT_REQUIRE(kiln_run(c) == KILN_OK);
    int32_t x1[40], x2[40], x3[40];
    KT_EQ_INT(poll_all(c, s1, x1, 40, &why), 30);
    KT_EQ_INT(poll_all(c, s2, x2, 40, &why), 30);
    KT_EQ_INT(poll_all(c, s3, x3, 40, &why), 30);
    KT_CHECK(memcmp(x1, x2, sizeof x1[0] * 30) == 0);
    KT_CHECK(memcmp(x1, x3, sizeof x1[0] * 30) != 0);
    kiln_ctx_free(c);
    kiln_close(k);
}

static void test_submit_errors(void) {
    kiln_t *k = NULL;
    KT_REQUIRE(kiln_open(engine, 0, &k) == KILN_OK);
    kiln_ctx_t *c = cpu_ctx(k, 2, 16, 0);
    KT_REQUIRE(c);
    int32_t p[20];
    for (int i = 0; i < 20; i++) p[i] = 10 + i;
    int64_t id = 5;
    KT_EQ_INT(kiln_submit(c, p, 17, NULL, &id), KILN_ERR_CONTEXT);
    KT_CONTAINS(kiln_last_error(c), "17 tokens");
    KT_CONTAINS(kiln_last_error(c), "context holds 16");
    KT_EQ_INT(id, 0);
    KT_EQ_INT(kiln_submit(c, p, 0, NULL, &id), KILN_ERR_INVALID_ARG);
    KT_CONTAINS(kiln_last_error(c), "empty");
    KT_EQ_INT(kiln_submit(c, NULL, 3, NULL, &id), KILN_ERR_INVALID_ARG);
    KT_CONTAINS(kiln_last_error(c), "prompt is NULL");
    KT_EQ_INT(kiln_submit(c, p, 3, NULL, NULL), KILN_ERR_INVALID_ARG);
    KT_CONTAINS(kiln_last_error(c), "id is NULL");
    p[2] = 600;
    KT_EQ_INT(kiln_submit(c, p, 3, NULL, &id), KILN_ERR_INVALID_ARG);
    KT_CONTAINS(kiln_last_error(c), "token 600 at index 2");
    p[2] = 12;
    kiln_request_options ro;
    kiln_request_options_init(&ro);
    ro.top_p = 1.5f;
    KT_EQ_INT(kiln_submit(c, p, 3, &ro, &id), KILN_ERR_INVALID_ARG);
    KT_CONTAINS(kiln_last_error(c), "top-p 1.5");
    kiln_request_options_init(&ro);
    ro.temperature = -1;
    KT_EQ_INT(kiln_submit(c, p, 3, &ro, &id), KILN_ERR_INVALID_ARG);
    KT_CONTAINS(kiln_last_error(c), "temperature");
    kiln_request_options_init(&ro);
    ro.max_tokens = -3;
    KT_EQ_INT(kiln_submit(c, p, 3, &ro, &id), KILN_ERR_INVALID_ARG);
    KT_CONTAINS(kiln_last_error(c), "max tokens -3");
    kiln_request_options_init(&ro);
    ro.struct_size = 2;
    KT_EQ_INT(kiln_submit(c, p, 3, &ro, &id), KILN_ERR_INVALID_ARG);
    KT_CONTAINS(kiln_last_error(c), "kiln_request_options_init");
    struct { const char *field, *says; } bad[] = {{"min_p", "min-p 2"}, {"presence", "presence penalty 3"},
                                                  {"frequency", "frequency penalty -2.5"}, {"repetition", "repetition penalty 0"},
                                                  {"logprobs", "logprobs 21"}, {"needs_cb", "on_token_info"}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        kiln_request_options_init(&ro);
        if (!strcmp(bad[i].field, "min_p")) ro.min_p = 2;
        if (!strcmp(bad[i].field, "presence")) ro.presence_penalty = 3;
        if (!strcmp(bad[i].field, "frequency")) ro.frequency_penalty = -2.5f;
        if (!strcmp(bad[i].field, "repetition")) ro.repetition_penalty = 0;
        if (!strcmp(bad[i].field, "logprobs")) ro.logprobs = 21;
        if (!strcmp(bad[i].field, "needs_cb")) ro.logprobs = 2;
        KT_EQ_INT(kiln_submit(c, p, 3, &ro, &id), KILN_ERR_INVALID_ARG);
        KT_CONTAINS(kiln_last_error(c), bad[i].says);
    }
    /* a caller built against 0.1 (options ending at `user`) gets the new fields' defaults */
    kiln_request_options_init(&ro);
    ro.repetition_penalty = 0; /* past the old struct: must not be read */
    ro.logprobs = 7;
    ro.struct_size = (uint32_t)(offsetof(kiln_request_options, user) + sizeof ro.user);
    KT_EQ_INT(kiln_submit(c, p, 3, &ro, &id), KILN_OK);
    KT_REQUIRE(kiln_run(c) == KILN_OK);
    int32_t why0, buf0[200];
    KT_CHECK(poll_all(c, id, buf0, 200, &why0) > 0);
    KT_EQ_INT(kiln_pending(c), 0);

    /* poll and cancel of ids that never were */
    int32_t buf[4], n, fin;
    KT_EQ_INT(kiln_poll(c, 42, buf, 4, &n, &fin, NULL), KILN_ERR_INVALID_ARG);
    KT_CONTAINS(kiln_last_error(c), "no request 42");
    KT_EQ_INT(kiln_cancel(c, 42), KILN_ERR_INVALID_ARG);
    KT_EQ_INT(kiln_cancel(c, -1), KILN_ERR_INVALID_ARG);

    /* a prompt that fills the context yields one token */
    kiln_request_options_init(&ro);
    ro.ignore_eos = 1;
    KT_REQUIRE(kiln_submit(c, p, 16, &ro, &id) == KILN_OK);
    KT_EQ_INT(kiln_poll(c, id, NULL, 4, &n, &fin, NULL), KILN_ERR_INVALID_ARG); /* NULL buf with cap 4 */
    KT_EQ_INT(kiln_poll(c, id, buf, 4, NULL, &fin, NULL), KILN_ERR_INVALID_ARG);
    KT_REQUIRE(kiln_run(c) == KILN_OK);
    int32_t why;
    KT_EQ_INT(poll_all(c, id, buf, 4, &why), 1);
    KT_EQ_INT(why, KILN_STOP_CONTEXT);
    kiln_ctx_free(c);
    kiln_close(k);
}

/* Cancel through the API, and KV memory in bytes making requests queue. */
static void test_cancel_and_kv_bytes(void) {
    kiln_t *k = NULL;
    KT_REQUIRE(kiln_open(engine, 0, &k) == KILN_OK);
    /* room for 100 tokens of K and V: 100 × 1280 bytes */
    kiln_ctx_t *c = cpu_ctx(k, 4, 0, 100 * 1280);
    KT_REQUIRE(c);
    kiln_ctx_info info = {.struct_size = sizeof info};
    KT_REQUIRE(kiln_ctx_info_get(c, &info) == KILN_OK);
    KT_EQ_INT(info.kv_capacity_tokens, 100);
    kiln_request_options ro;
    kiln_request_options_init(&ro);
    ro.max_tokens = 30; /* 20 + 29 = 49 tokens each: two at a time */
    ro.ignore_eos = 1;
    int64_t ids[4];
    for (int i = 0; i < 4; i++) KT_REQUIRE(kiln_submit(c, gc[2].prompt, gc[2].n_prompt, &ro, &ids[i]) == KILN_OK);
    for (int s = 0; s < 3; s++) KT_REQUIRE(kiln_run_step(c) == KILN_OK);
    KT_EQ_INT(kiln_pending(c), 4);
    KT_REQUIRE(kiln_cancel(c, ids[3]) == KILN_OK); /* queued */
    KT_REQUIRE(kiln_cancel(c, ids[0]) == KILN_OK); /* running, 3 tokens in */
    KT_EQ_INT(kiln_pending(c), 2);
    KT_REQUIRE(kiln_run(c) == KILN_OK);
    int32_t buf[64], why;
    KT_EQ_INT(poll_all(c, ids[0], buf, 64, &why), 3);
    KT_EQ_INT(why, KILN_STOP_CANCELLED);
    KT_EQ_INT(poll_all(c, ids[3], buf, 64, &why), 0);
    KT_EQ_INT(why, KILN_STOP_CANCELLED);
    for (int i = 1; i < 3; i++) {
        KT_EQ_INT(poll_all(c, ids[i], buf, 64, &why), 30);
        KT_EQ_INT(why, KILN_STOP_MAX_TOKENS);
        KT_CHECK(memcmp(buf, gc[2].greedy, 30 * sizeof *buf) == 0);
    }
    KT_REQUIRE(kiln_ctx_info_get(c, &info) == KILN_OK);
    KT_EQ_INT(info.max_running, 3); /* KV grows as they generate: a third starts beside the first two */
    KT_EQ_INT(info.requests_running, 0);
    KT_EQ_INT(info.requests_waiting, 0);
    KT_EQ_INT(info.kv_used_tokens, 0);
    /* a caller built against 0.1 passes its smaller struct: only those fields are written */
    kiln_ctx_info old;
    memset(&old, 0x5a, sizeof old);
    old.struct_size = (uint32_t)(offsetof(kiln_ctx_info, kernels_jitted) + sizeof old.kernels_jitted);
    KT_REQUIRE(kiln_ctx_info_get(c, &old) == KILN_OK);
    KT_EQ_INT(old.max_running, 3);
    KT_EQ_INT(old.preemptions, 0x5a5a5a5a5a5a5a5all);
    old.struct_size = 8;
    KT_EQ_INT(kiln_ctx_info_get(c, &old), KILN_ERR_INVALID_ARG);
    /* more than the whole KV memory: refused at submit */
    ro.max_tokens = 200;
    int64_t big;
    KT_EQ_INT(kiln_submit(c, gc[2].prompt, gc[2].n_prompt, &ro, &big), KILN_ERR_CONTEXT);
    KT_CONTAINS(kiln_last_error(c), "KV memory holds 100");
    KT_EQ_INT(kiln_cancel(c, ids[1]), KILN_OK); /* finished and forgotten: a no-op */
    kiln_ctx_free(c);
    kiln_close(k);
}


/* Log-probabilities through on_token_info; penalties change greedy text. */
typedef struct lp_run {
    int32_t tok[64];
    float lp[64], top0_lp[64];
    int32_t top0[64];
    int n, finished_calls, last_reason;
} lp_run;

static int32_t lp_cb(void *user, int64_t request, const kiln_token_info *t, int32_t finished, int32_t reason) {
    (void)request;
    lp_run *r = user;
    if (t && r->n < 64) {
        r->tok[r->n] = t->token;
        r->lp[r->n] = t->logprob;
        r->top0[r->n] = t->n_top > 0 ? t->top_token[0] : -1;
        r->top0_lp[r->n] = t->n_top > 0 ? t->top_logprob[0] : 0;
        r->n++;
    }
    if (finished) {
        r->finished_calls++;
        r->last_reason = reason;
    }
    return 0;
}

static void test_logprobs_and_penalties(void) {
    kiln_t *k = NULL;
    KT_REQUIRE(kiln_open(engine, 0, &k) == KILN_OK);
    kiln_ctx_t *c = cpu_ctx(k, 2, 0, 0);
    KT_REQUIRE(c);
    kiln_request_options ro;
    kiln_request_options_init(&ro);
    ro.max_tokens = 30;
    ro.ignore_eos = 1;
    ro.logprobs = 3;
    lp_run a = {0}, b = {0};
    ro.on_token_info = lp_cb;
    ro.user = &a;
    int64_t ia, ib;
    KT_REQUIRE(kiln_submit(c, gc[2].prompt, gc[2].n_prompt, &ro, &ia) == KILN_OK);
    ro.user = &b;
    ro.repetition_penalty = 1.5f;
    ro.frequency_penalty = 1.0f;
    KT_REQUIRE(kiln_submit(c, gc[2].prompt, gc[2].n_prompt, &ro, &ib) == KILN_OK);
    KT_REQUIRE(kiln_run(c) == KILN_OK);
    KT_EQ_INT(a.n, 30);
    KT_EQ_INT(a.finished_calls, 1);
    KT_EQ_INT(a.last_reason, KILN_STOP_MAX_TOKENS);
    KT_CHECK(memcmp(a.tok, gc[2].greedy, 30 * sizeof(int32_t)) == 0); /* HF's greedy ids */
    for (int i = 0; i < 30; i++) {
        KT_EQ_INT(a.top0[i], a.tok[i]); /* greedy: its own token is the most likely */
        KT_CHECK(a.lp[i] == a.top0_lp[i] && a.lp[i] <= 0 && isfinite(a.lp[i]));
    }
    KT_EQ_INT(b.n, 30);
    KT_CHECK(memcmp(b.tok, a.tok, 30 * sizeof(int32_t)) != 0);
    kiln_ctx_info info = {.struct_size = sizeof info};
    KT_REQUIRE(kiln_ctx_info_get(c, &info) == KILN_OK);
    KT_EQ_INT(info.preemptions, 0);
    kiln_ctx_free(c);
    kiln_close(k);
}

/* kiln_score gives the log-probabilities generation reported for the same tokens, and refuses bad
 * sequences and a busy context. */
static void test_score(void) {
    kiln_t *k = NULL;
    KT_REQUIRE(kiln_open(engine, 0, &k) == KILN_OK);
    kiln_ctx_t *c = cpu_ctx(k, 2, 0, 0);
    KT_REQUIRE(c);
    kiln_request_options ro;
    kiln_request_options_init(&ro);
    ro.max_tokens = 20;
    ro.ignore_eos = 1;
    ro.logprobs = 0;
    lp_run a = {0};
    ro.on_token_info = lp_cb;
    ro.user = &a;
    int64_t id;
    KT_REQUIRE(kiln_submit(c, gc[1].prompt, gc[1].n_prompt, &ro, &id) == KILN_OK);
    /* busy: a request in flight */
    int32_t two[2] = {1, 2}, n2 = 2;
    float lp2[2];
    const int32_t *s2[1] = {two};
    float *o2[1] = {lp2};
    KT_EQ_INT(kiln_score(c, s2, &n2, 1, o2), KILN_ERR_INVALID_ARG);
    KT_CONTAINS(kiln_last_error(c), "1 request in flight");
    KT_REQUIRE(kiln_run(c) == KILN_OK);
    KT_EQ_INT(a.n, 20);
    int32_t seq[128];
    const int np = gc[1].n_prompt, n = np + 20;
    memcpy(seq, gc[1].prompt, (size_t)np * sizeof *seq);
    memcpy(seq + np, a.tok, 20 * sizeof *seq);
    float lp[128];
    const int32_t *ss[1] = {seq};
    float *oo[1] = {lp};
    KT_EQ_INT(kiln_score(c, ss, &n, 1, oo), KILN_OK);
    double worst = 0;
    for (int i = 0; i < 20; i++) {
        double e = fabs((double)lp[np - 1 + i] - (double)a.lp[i]);
        if (e > worst) worst = e;
    }
    KT_CHECKF(worst <= 1e-5, "scored log-probabilities differ from generation's by %g", worst);
    /* refusals name what is wrong; the context stays usable */
    int32_t one = 1, bad[2] = {1, 1 << 20};
    const int32_t *sb[1] = {bad};
    KT_EQ_INT(kiln_score(c, s2, &one, 1, o2), KILN_ERR_INVALID_ARG);
    KT_CONTAINS(kiln_last_error(c), "sequence 0 has 1 ids");
    KT_EQ_INT(kiln_score(c, sb, &n2, 1, o2), KILN_ERR_INVALID_ARG);
    KT_CONTAINS(kiln_last_error(c), "position 1: id 1048576 is outside the vocabulary");
    KT_EQ_INT(kiln_score(c, s2, &n2, 0, o2), KILN_ERR_INVALID_ARG);
    KT_EQ_INT(kiln_score(c, NULL, &n2, 1, o2), KILN_ERR_INVALID_ARG);
    KT_EQ_INT(kiln_score(c, s2, &n2, 1, o2), KILN_OK);
    KT_CHECK(lp2[0] <= 0 && isfinite(lp2[0]));
    kiln_ctx_free(c);
    kiln_close(k);
}

/* Callbacks may submit, cancel and poll; stepping from one is refused. */
typedef struct reentry {
    kiln_ctx_t *c;
    int64_t self, victim, spawned;
    int calls;
    kiln_status step_from_cb, submit_from_cb, cancel_from_cb;
    collected child;
} reentry;

static int32_t reentry_cb(void *user, int64_t id, int32_t token, int32_t finished, int32_t reason) {
    reentry *r = user;
    r->calls++;
    if (r->calls == 1) {
        r->step_from_cb = kiln_run_step(r->c);
        kiln_request_options ro;
        kiln_request_options_init(&ro);
        ro.max_tokens = 5;
        ro.ignore_eos = 1;
        ro.on_token = collect_cb;
        ro.user = &r->child;
        r->submit_from_cb = kiln_submit(r->c, gc[0].prompt, gc[0].n_prompt, &ro, &r->spawned);
        r->child.id = r->spawned;
    }
    if (r->calls == 2) r->cancel_from_cb = kiln_cancel(r->c, r->victim);
    return 0;
}

static void test_callback_reentry(void) {
    kiln_t *k = NULL;
    KT_REQUIRE(kiln_open(engine, 0, &k) == KILN_OK);
    kiln_ctx_t *c = cpu_ctx(k, 4, 0, 0);
    KT_REQUIRE(c);
    reentry r = {.c = c, .step_from_cb = KILN_OK};
    kiln_request_options ro;
    kiln_request_options_init(&ro);
    ro.max_tokens = 8;
    ro.ignore_eos = 1;
    ro.on_token = reentry_cb;
    ro.user = &r;
    KT_REQUIRE(kiln_submit(c, gc[1].prompt, gc[1].n_prompt, &ro, &r.self) == KILN_OK);
    kiln_request_options vo;
    kiln_request_options_init(&vo);
    vo.max_tokens = 50;
    vo.ignore_eos = 1;
    KT_REQUIRE(kiln_submit(c, gc[2].prompt, gc[2].n_prompt, &vo, &r.victim) == KILN_OK);
    KT_REQUIRE(kiln_run(c) == KILN_OK);
    KT_EQ_INT(r.step_from_cb, KILN_ERR_INVALID_ARG);
    KT_EQ_INT(r.submit_from_cb, KILN_OK);
    KT_EQ_INT(r.cancel_from_cb, KILN_OK);
    KT_EQ_INT(r.calls, 8);
    KT_CHECK(r.child.finished);
    KT_EQ_INT(r.child.n, 5);
    KT_CHECK(memcmp(r.child.tokens, gc[0].greedy, 5 * sizeof(int32_t)) == 0);
    int32_t buf[64], why;
    KT_EQ_INT(poll_all(c, r.victim, buf, 64, &why), 1); /* its second token came after the cancel */
    KT_EQ_INT(why, KILN_STOP_CANCELLED);
    kiln_ctx_free(c);
    kiln_close(k);
}

/* One thread steps; another submits and polls. */
typedef struct feeder {
    kiln_ctx_t *c;
    int64_t ids[3];
    volatile int submitted;
    int32_t got[3][128];
    int n[3];
    int32_t why[3];
    int failures;
} feeder;

static void *feed(void *arg) {
    feeder *f = arg;
    kiln_request_options ro;
    kiln_request_options_init(&ro);
    ro.max_tokens = 40;
    ro.ignore_eos = 1;
    for (int i = 0; i < 3; i++) {
        if (kiln_submit(f->c, gc[i].prompt, gc[i].n_prompt, &ro, &f->ids[i]) != KILN_OK) f->failures++;
        __atomic_store_n(&f->submitted, i + 1, __ATOMIC_SEQ_CST);
        usleep(2000);
    }
    for (int i = 0; i < 3; i++) {
        int32_t fin = 0;
        while (!fin) {
            int32_t n;
            if (kiln_poll(f->c, f->ids[i], f->got[i] + f->n[i], 128 - f->n[i], &n, &fin, &f->why[i]) != KILN_OK) {
                f->failures++;
                break;
            }
            f->n[i] += n;
            if (!fin) usleep(200);
        }
    }
    return NULL;
}

static void test_threads(void) {
    kiln_t *k = NULL;
    KT_REQUIRE(kiln_open(engine, 0, &k) == KILN_OK);
    kiln_ctx_t *c = cpu_ctx(k, 3, 0, 0);
    KT_REQUIRE(c);
    feeder f = {.c = c};
    pthread_t t;
    KT_REQUIRE(pthread_create(&t, NULL, feed, &f) == 0);
    while (__atomic_load_n(&f.submitted, __ATOMIC_SEQ_CST) < 3 || kiln_pending(c) > 0) {
        if (kiln_run_step(c) != KILN_OK) break;
        if (kiln_pending(c) == 0) usleep(100);
    }
    pthread_join(t, NULL);
    KT_EQ_INT(f.failures, 0);
    for (int i = 0; i < 3; i++) {
        KT_EQ_INT(f.n[i], 40);
        KT_EQ_INT(f.why[i], KILN_STOP_MAX_TOKENS);
        KT_CHECKF(memcmp(f.got[i], gc[i].greedy, 40 * sizeof(int32_t)) == 0, "thread case %d", i);
    }
    kiln_ctx_free(c);
    kiln_close(k);
}

/* ---- tokenizer ---- */

static void test_tokenizer(void) {
    kiln_t *k = NULL;
    KT_REQUIRE(kiln_open(engine, 0, &k) == KILN_OK);
    kiln_ctx_t *c = cpu_ctx(k, 1, 0, 0);
    KT_REQUIRE(c);
    int32_t ids[16], n;
    KT_EQ_INT(kiln_tokenize(c, "hi", 2, 1, ids, 16, &n), KILN_ERR_MISSING);
    KT_CONTAINS(kiln_last_error(c), "no tokenizer");
    char text[16];
    size_t len;
    KT_EQ_INT(kiln_detokenize(c, ids, 0, 0, text, 16, &len), KILN_ERR_MISSING);
    kiln_ctx_free(c);
    kiln_close(k);

    if (!tok_engine[0]) KT_SKIP("no engine with a tokenizer (needs %s/tokenizers/llama2)", KILN_SHARED_DIR);
    KT_REQUIRE(kiln_open(tok_engine, 0, &k) == KILN_OK);
    KT_EQ_INT(kiln_has_tokenizer(k), 1);
    c = cpu_ctx(k, 1, 0, 0);
    KT_REQUIRE(c);
    const char *s = "Hello world";
    KT_REQUIRE(kiln_tokenize(c, s, strlen(s), 1, ids, 16, &n) == KILN_OK);
    /* HF tokenizers 0.23 on this tokenizer.json: [1, 22557, 1526] (<s> ▁Hello ▁world) */
    KT_EQ_INT(n, 3);
    KT_EQ_INT(ids[0], 1);
    KT_EQ_INT(ids[1], 22557);
    KT_EQ_INT(ids[2], 1526);
    int32_t few[2];
    KT_EQ_INT(kiln_tokenize(c, s, strlen(s), 1, few, 2, &n), KILN_ERR_INVALID_ARG);
    KT_EQ_INT(n, 3);
    KT_CONTAINS(kiln_last_error(c), "buffer holds 2");
    KT_REQUIRE(kiln_detokenize(c, ids, 3, 1, text, sizeof text, &len) == KILN_OK);
    KT_EQ_STR(text, "Hello world");
    KT_EQ_INT(len, 11);
    char tiny[4];
    KT_EQ_INT(kiln_detokenize(c, ids, 3, 1, tiny, sizeof tiny, &len), KILN_ERR_INVALID_ARG);
    KT_EQ_INT(len, 11);
    KT_EQ_STR(tiny, "");
    KT_EQ_INT(kiln_tokenize(c, "\xff", 1, 0, ids, 16, &n), KILN_ERR_TOKENIZER);
    KT_EQ_INT(kiln_tokenize(c, s, 5, 0, NULL, 16, &n), KILN_ERR_INVALID_ARG);
    /* the tokenizer's ids past the model's 512 are refused at submit */
    int64_t id;
    KT_EQ_INT(kiln_submit(c, ids, 3, NULL, &id), KILN_ERR_INVALID_ARG);
    KT_CONTAINS(kiln_last_error(c), "outside the vocabulary");
    kiln_ctx_free(c);
    kiln_close(k);
}

/* Engine fixtures: stories260k, and stories260k with the llama2 tokenizer
 * beside it (a checkpoint directory of links). */
static int make_engines(void) {
    char ckpt[1024];
    snprintf(ckpt, sizeof ckpt, "%s/models/stories260k", KILN_SOURCE_DIR);
    snprintf(engine, sizeof engine, "%s/stories.kiln", tmpdir);
    kiln_compile_options opt = {.output_path = engine, .weight_dtype = KILN_DTYPE_COUNT_};
    if (kt_compile(ckpt, &opt) != KILN_OK) return -1;
    snprintf(tp_engine, sizeof tp_engine, "%s/stories-tp2.kiln", tmpdir);
    kiln_compile_options tpo = {.output_path = tp_engine, .weight_dtype = KILN_DTYPE_COUNT_, .tp = 2};
    if (kt_compile(ckpt, &tpo) != KILN_OK) return -1;
    char tokjson[1024], dir[600], link[700], target[1100];
    snprintf(tokjson, sizeof tokjson, "%s/tokenizers/llama2/tokenizer.json", KILN_SHARED_DIR);
    if (access(tokjson, R_OK) != 0) return 0;
    snprintf(dir, sizeof dir, "%s/ckpt", tmpdir);
    if (mkdir(dir, 0700) != 0) return -1;
    const char *files[] = {"config.json", "generation_config.json", "model.safetensors"};
    for (int i = 0; i < 3; i++) {
        snprintf(target, sizeof target, "%s/%s", ckpt, files[i]);
        snprintf(link, sizeof link, "%s/%s", dir, files[i]);
        if (symlink(target, link) != 0) return -1;
    }
    snprintf(link, sizeof link, "%s/tokenizer.json", dir);
    if (symlink(tokjson, link) != 0) return -1;
    snprintf(tok_engine, sizeof tok_engine, "%s/stories-tok.kiln", tmpdir);
    opt.output_path = tok_engine;
    if (kt_compile(dir, &opt) != KILN_OK) tok_engine[0] = 0;
    return 0;
}

static void remove_fixtures(void) {
    char p[700];
    const char *files[] = {"config.json", "generation_config.json", "model.safetensors", "tokenizer.json"};
    for (int i = 0; i < 4; i++) {
        snprintf(p, sizeof p, "%s/ckpt/%s", tmpdir, files[i]);
        unlink(p);
    }
    snprintf(p, sizeof p, "%s/ckpt", tmpdir);
    rmdir(p);
    unlink(engine);
    if (tp_engine[0]) unlink(tp_engine);
    if (tok_engine[0]) unlink(tok_engine);
    rmdir(tmpdir);
}

int main(void) {
    if (!kt_tmpdir(tmpdir, sizeof tmpdir, "api")) return 1;
    n_gc = load_golden();
    if (n_gc != 3 || make_engines() != 0) {
        fprintf(stderr, "fixtures failed\n");
        remove_fixtures();
        return 1;
    }
    KT_RUN(test_open);
    KT_RUN(test_open_errors);
    KT_RUN(test_ctx_options);
    KT_RUN(test_ctx_gpus);
    KT_RUN(test_generate_batched);
    KT_RUN(test_step_and_sample);
    KT_RUN(test_submit_errors);
    KT_RUN(test_cancel_and_kv_bytes);
    KT_RUN(test_callback_reentry);
    KT_RUN(test_logprobs_and_penalties);
    KT_RUN(test_score);
    KT_RUN(test_threads);
    KT_RUN(test_tokenizer);
    remove_fixtures();
    return KT_END();
}
