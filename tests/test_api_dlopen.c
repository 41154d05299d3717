/*
 * test_api_dlopen.c — the public API as an FFI caller sees it: load
 * libkiln.so with dlopen, look every entry point up by name with dlsym,
 * and generate HF's greedy ids for a stories260k prompt through the
 * function pointers alone (no kiln symbol is called directly). Checks also
 * that a failed open reports its message through the loaded library.
 */
#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "compiler/kiln_compiler.h"
#include "kt.h"
#include "kt_fixture.h"
#include "runtime/kiln.h"

static char tmpdir[256], engine[512];

typedef struct api {
    void *lib;
    kiln_status (*open)(const char *, int32_t, kiln_t **);
    void (*close)(kiln_t *);
    const char *(*error_message)(const kiln_t *);
    void (*ctx_options_init)(kiln_ctx_options *);
    kiln_status (*ctx_new)(const kiln_t *, const kiln_ctx_options *, kiln_ctx_t **);
    void (*ctx_free)(kiln_ctx_t *);
    const char *(*last_error)(const kiln_ctx_t *);
    void (*request_options_init)(kiln_request_options *);
    kiln_status (*submit)(kiln_ctx_t *, const int32_t *, int32_t, const kiln_request_options *, int64_t *);
    kiln_status (*run)(kiln_ctx_t *);
    kiln_status (*poll)(kiln_ctx_t *, int64_t, int32_t *, int32_t, int32_t *, int32_t *, int32_t *);
    const char *(*stop_reason_str)(kiln_stop_reason);
} api;

static bool load(api *a) {
    char path[1024];
    snprintf(path, sizeof path, "%s/libkiln.so", KILN_BINARY_DIR);
    a->lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!a->lib) {
        fprintf(stderr, "  dlopen %s: %s\n", path, dlerror());
        return false;
    }
#define SYM(field, name)                                                      \
    do {                                                                      \
        *(void **)&a->field = dlsym(a->lib, name);                            \
        if (!a->field) {                                                      \
            fprintf(stderr, "  dlsym %s: not found\n", name);                 \
            return false;                                                     \
        }                                                                     \
    } while (0)
    SYM(open, "kiln_open");
    SYM(close, "kiln_close");
    SYM(error_message, "kiln_error_message");
    SYM(ctx_options_init, "kiln_ctx_options_init");
    SYM(ctx_new, "kiln_ctx_new");
    SYM(ctx_free, "kiln_ctx_free");
    SYM(last_error, "kiln_last_error");
    SYM(request_options_init, "kiln_request_options_init");
    SYM(submit, "kiln_submit");
    SYM(run, "kiln_run");
    SYM(poll, "kiln_poll");
    SYM(stop_reason_str, "kiln_stop_reason_str");
#undef SYM
    return true;
}

static void test_generate_through_dlopen(void) {
    api a = {0};
    KT_REQUIRE(load(&a));
    kiln_t *k = NULL;
    KT_REQUIRE(a.open(engine, 1, &k) == KILN_OK);
    kiln_ctx_options co;
    a.ctx_options_init(&co);
    KT_EQ_INT(co.struct_size, sizeof co);
    co.device = "cpu";
    co.max_batch = 2;
    kiln_ctx_t *ctx = NULL;
    KT_REQUIRE(a.ctx_new(k, &co, &ctx) == KILN_OK);
    kiln_request_options ro;
    a.request_options_init(&ro);
    ro.max_tokens = 10;
    ro.ignore_eos = 1;
    /* tests/golden/stories260k/golden.json, case 1 */
    const int32_t prompt[8] = {1, 300, 310, 320, 330, 340, 350, 360};
    const int32_t want[10] = {304, 422, 422, 457, 473, 304, 451, 303, 284, 284};
    int64_t id;
    KT_REQUIRE(a.submit(ctx, prompt, 8, &ro, &id) == KILN_OK);
    KT_REQUIRE(a.run(ctx) == KILN_OK);
    int32_t got[16], n, fin, why;
    KT_REQUIRE(a.poll(ctx, id, got, 16, &n, &fin, &why) == KILN_OK);
    KT_EQ_INT(n, 10);
    KT_EQ_INT(fin, 1);
    KT_EQ_STR(a.stop_reason_str((kiln_stop_reason)why), "max_tokens");
    KT_CHECK(memcmp(got, want, sizeof want) == 0);
    /* errors travel through the library too */
    KT_EQ_INT(a.submit(ctx, prompt, 0, &ro, &id), KILN_ERR_INVALID_ARG);
    KT_CONTAINS(a.last_error(ctx), "empty");
    a.ctx_free(ctx);
    a.close(k);

    KT_EQ_INT(a.open("/nonexistent/x.kiln", 0, &k), KILN_ERR_IO);
    KT_CONTAINS(a.error_message(k), "x.kiln");
    a.close(k);
    dlclose(a.lib);
}

int main(void) {
    if (!kt_tmpdir(tmpdir, sizeof tmpdir, "dl")) return 1;
    snprintf(engine, sizeof engine, "%s/stories.kiln", tmpdir);
    char ckpt[1024];
    snprintf(ckpt, sizeof ckpt, "%s/models/stories260k", KILN_SOURCE_DIR);
    kiln_compile_options opt = {.output_path = engine, .weight_dtype = KILN_DTYPE_COUNT_};
    if (kt_compile(ckpt, &opt) != KILN_OK) return 1;
    KT_RUN(test_generate_through_dlopen);
    unlink(engine);
    rmdir(tmpdir);
    return KT_END();
}
