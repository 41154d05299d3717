/*
 * test_gpu_nvrtc.c — the GPU toolchain parts that need no GPU: embedded
 * kernel templates, NVRTC compilation of every kernel family to a cubin
 * (and PTX), the compile cache, NVRTC errors carrying the log and kernel
 * name, the choice of image for a device SM, and a clear failure from
 * kiln_cuda_init where no driver or device exists.
 * Without the CUDA toolkit at build time everything here skips.
 */
#include "codegen/kiln_nvrtc.h"
#include "tests/kt.h"

#ifdef KILN_HAVE_CUDA
#include "runtime/kiln_cuda.h"

#include <stdint.h>
#include <sys/stat.h>
#include <unistd.h>

static char cache_dir[256];

/* A fresh cache folder under the build tree for this run. */
static void make_cache_dir(void) {
    snprintf(cache_dir, sizeof cache_dir, "%s/nvrtc-test-cache-%ld", KILN_BINARY_DIR, (long)getpid());
    mkdir(cache_dir, 0755);
}

static void remove_cache_dir(void) {
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", cache_dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", cache_dir);
}

static void test_templates_embedded(void) {
    KT_CHECK(kiln_kernel_src_count() >= 8);
    const char *names[] = {"common.cuh", "params.cuh", "gemv.cuh", "rmsnorm.cuh", "rope_kv.cuh",
                           "attn_decode.cuh", "attn_prefill.cuh", "swiglu.cuh", "sample.cuh"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        const kiln_kernel_src *k = kiln_kernel_src_find(names[i]);
        KT_CHECKF(k != NULL, "%s not embedded", names[i]);
        if (k) KT_EQ_INT(strlen(k->text), k->len);
    }
    const kiln_kernel_src *g = kiln_kernel_src_find("gemv.cuh");
    KT_REQUIRE(g);
    KT_CONTAINS(g->text, "kiln_gemv");
    KT_CHECK(kiln_kernel_src_find("nope.cuh") == NULL);
    KT_CHECK(kiln_kernel_src_at(kiln_kernel_src_count()) == NULL);
}

typedef struct family {
    const char *file, *entry;
    const char *defs[12];
    int n;
} family;

/* Every family with Mistral-7B's constants, plus an odd-shaped variant. */
static const family families[] = {
    {"gemv.cuh", "kiln_gemv", {"GEMV_WARPS=4", "GEMV_ROWS=2", "GEMV_UNROLL=4", "GEMV_MT=1"}, 4},
    {"gemv.cuh", "kiln_gemv", {"GEMV_ROWS=2", "GEMV_MT=8", "GEMV_SWIGLU=1", "GEMV_OUT_F32=1"}, 4},
    {"rmsnorm.cuh", "kiln_rmsnorm", {"HIDDEN=4096", "RMS_EPS=1e-5f"}, 2},
    {"rmsnorm.cuh", "kiln_rmsnorm", {"HIDDEN=4097"}, 1},
    {"rope_kv.cuh", "kiln_rope_kv", {"N_HEADS=32", "N_KV_HEADS=8", "HEAD_DIM=128", "BLOCK_SIZE=16", "ROPE_THETA=1000000.0f"}, 5},
    {"rope_kv.cuh", "kiln_rope_kv",
     {"N_HEADS=32", "N_KV_HEADS=8", "HEAD_DIM=128", "BLOCK_SIZE=16", "ROPE_THETA=500000.0f", "ROPE_LLAMA3=1",
      "ROPE_FACTOR=8.0f", "ROPE_LOW_FREQ_FACTOR=1.0f", "ROPE_HIGH_FREQ_FACTOR=4.0f", "ROPE_ORIG_MAX_POS=8192"}, 10},
    {"attn_decode.cuh", "kiln_attn_decode", {"N_HEADS=32", "N_KV_HEADS=8", "HEAD_DIM=128", "BLOCK_SIZE=16", "WINDOW=4096"}, 5},
    {"attn_prefill.cuh", "kiln_attn_prefill", {"N_HEADS=32", "N_KV_HEADS=8", "HEAD_DIM=128", "BLOCK_SIZE=16", "WINDOW=4096"}, 5},
    {"swiglu.cuh", "kiln_swiglu", {"FFN=14336"}, 1},
    {"sample.cuh", "kiln_sample", {"SAMPLE_THREADS=1024"}, 1},
};

static void test_compile_every_family(void) {
    for (size_t i = 0; i < sizeof families / sizeof families[0]; i++) {
        const family *f = &families[i];
        char src[128];
        snprintf(src, sizeof src, "#include \"%s\"\n", f->file);
        kiln_buf cubin = {0}, ptx = {0};
        kiln_error err = {0};
        kiln_nvrtc_opts o = {.cache_dir = cache_dir};
        bool want_ptx = i == 0; /* one PTX run is enough to prove the path */
        kiln_status st = kiln_nvrtc_compile_ex(src, f->entry, f->defs, f->n, 90, want_ptx, &cubin, &ptx, &o, &err);
        KT_CHECKF(st == KILN_OK, "%s: %s", f->file, err.msg);
        if (st == KILN_OK) {
            KT_CHECK(cubin.len > 64);
            KT_CHECK(memcmp(cubin.data, "\x7f" "ELF", 4) == 0); /* a cubin is an ELF file */
            if (want_ptx) {
                KT_CHECK(ptx.len > 0 && strlen((const char *)ptx.data) == ptx.len);
                KT_CONTAINS((const char *)ptx.data, ".entry kiln_gemv");
                KT_CONTAINS((const char *)ptx.data, ".target sm_90");
            }
        }
        kiln_buf_free(&cubin);
        kiln_buf_free(&ptx);
    }
}

static void test_cache_hit_and_damage(void) {
    const char *defs[] = {"FFN=77"};
    const char *src = "#include \"swiglu.cuh\"\n";
    kiln_buf a = {0}, b = {0};
    kiln_error err = {0};
    bool hit = true;
    kiln_nvrtc_opts o = {.cache_dir = cache_dir, .cache_hit = &hit};
    KT_REQUIRE(kiln_nvrtc_compile_ex(src, "swiglu", defs, 1, 90, false, &a, NULL, &o, &err) == KILN_OK);
    KT_CHECK(!hit);
    double t0 = kiln_now();
    KT_REQUIRE(kiln_nvrtc_compile_ex(src, "swiglu", defs, 1, 90, false, &b, NULL, &o, &err) == KILN_OK);
    double dt = kiln_now() - t0;
    KT_CHECK(hit);
    KT_CHECK(dt < 0.5);
    KT_CHECK(a.len == b.len && memcmp(a.data, b.data, a.len) == 0);
    /* Another SM is another key. */
    KT_REQUIRE(kiln_nvrtc_compile_ex(src, "swiglu", defs, 1, 80, false, &b, NULL, &o, &err) == KILN_OK);
    KT_CHECK(!hit);
    /* Damage every entry: the next compile must ignore them and still succeed. */
    char cmd[512];
    snprintf(cmd, sizeof cmd, "for f in '%s'/nvrtc-*.bin; do printf 'garbage' | dd of=\"$f\" bs=1 seek=40 conv=notrunc 2>/dev/null; done",
             cache_dir);
    KT_CHECK(system(cmd) == 0);
    KT_REQUIRE(kiln_nvrtc_compile_ex(src, "swiglu", defs, 1, 90, false, &b, NULL, &o, &err) == KILN_OK);
    KT_CHECK(!hit);
    KT_CHECK(a.len == b.len && memcmp(a.data, b.data, a.len) == 0);
    kiln_buf_free(&a);
    kiln_buf_free(&b);
}

static void test_errors_carry_log(void) {
    kiln_buf cubin = {0}, log = {0};
    kiln_error err = {0};
    kiln_nvrtc_opts o = {.no_cache = true, .log_out = &log};
    const char *bad = "extern \"C\" __global__ void k(int *p) { p[0] = undefined_thing; }\n";
    kiln_status st = kiln_nvrtc_compile_ex(bad, "my_broken_kernel", NULL, 0, 90, false, &cubin, NULL, &o, &err);
    KT_EQ_INT(st, KILN_ERR_DEVICE);
    KT_CONTAINS(err.msg, "my_broken_kernel");
    KT_CONTAINS(err.msg, "sm_90");
    KT_CONTAINS(err.msg, "undefined_thing");
    KT_CHECK(log.len > 0);
    /* A template that needs a constant says so through #error. */
    st = kiln_nvrtc_compile("#include \"rmsnorm.cuh\"\n", "rmsnorm", NULL, 0, 90, false, &cubin, NULL, &err);
    KT_EQ_INT(st, KILN_ERR_DEVICE);
    KT_CONTAINS(err.msg, "needs HIDDEN");
    /* Bad arguments. */
    const char *bad_def[] = {"HIDDEN=1\n#define X"};
    KT_EQ_INT(kiln_nvrtc_compile("", "x", bad_def, 1, 90, false, &cubin, NULL, &err), KILN_ERR_INVALID_ARG);
    KT_CONTAINS(err.msg, "define 0");
    const char *bad_name[] = {"1ABC=2"};
    KT_EQ_INT(kiln_nvrtc_compile("", "x", bad_name, 1, 90, false, &cubin, NULL, &err), KILN_ERR_INVALID_ARG);
    KT_EQ_INT(kiln_nvrtc_compile("", "x", NULL, 0, 7, false, &cubin, NULL, &err), KILN_ERR_INVALID_ARG);
    KT_CONTAINS(err.msg, "SM 7");
    KT_EQ_INT(kiln_nvrtc_compile(NULL, "x", NULL, 0, 90, false, &cubin, NULL, &err), KILN_ERR_INVALID_ARG);
    kiln_buf_free(&cubin);
    kiln_buf_free(&log);
}

static void test_include_dir_override(void) {
    const char *before = kiln_nvrtc_include_dir();
    KT_CHECK(before && *before);
    setenv("KILN_CUDA_INCLUDE", "/somewhere/include", 1);
    KT_EQ_STR(kiln_nvrtc_include_dir(), "/somewhere/include");
    unsetenv("KILN_CUDA_INCLUDE");
    int v = 0;
    kiln_error err = {0};
    KT_EQ_INT(kiln_nvrtc_version(&v, &err), KILN_OK);
    KT_CHECK(v >= 11000);
}

static void test_pick_image(void) {
    static const char blob[] = "x";
    kiln_cuda_image im[] = {
        {80, false, blob, 1}, {86, false, blob, 1}, {90, false, blob, 1}, {90, true, blob, 1}, {75, true, blob, 1},
    };
    KT_EQ_INT(kiln_cuda_pick_image(im, 5, 90), 2);  /* exact cubin */
    KT_EQ_INT(kiln_cuda_pick_image(im, 5, 89), 1);  /* sm_86 cubin runs on sm_89 */
    KT_EQ_INT(kiln_cuda_pick_image(im, 5, 80), 0);
    KT_EQ_INT(kiln_cuda_pick_image(im, 5, 120), 3); /* newer major: JIT the newest PTX */
    KT_EQ_INT(kiln_cuda_pick_image(im, 5, 75), 4);  /* no sm_7x cubin: PTX for 75 */
    KT_EQ_INT(kiln_cuda_pick_image(im, 3, 120), -1);
    KT_EQ_INT(kiln_cuda_pick_image(im, 5, 70), -1);
}

static void test_init_without_device_is_clear(void) {
    kiln_cuda cu;
    kiln_error err = {0};
    kiln_status st = kiln_cuda_init(&cu, 0, &err);
    if (st == KILN_OK) {
        fprintf(stderr, "  (a CUDA device is present: %s, sm_%d)\n", cu.name, cu.sm);
        kiln_cuda_free(&cu);
        kiln_error e2 = {0};
        KT_EQ_INT(kiln_cuda_init(&cu, 999, &e2), KILN_ERR_DEVICE);
        KT_CONTAINS(e2.msg, "device 999");
        return;
    }
    KT_EQ_INT(st, KILN_ERR_DEVICE);
    KT_CONTAINS(err.msg, "no CUDA");
    fprintf(stderr, "  (as expected here: %s)\n", err.msg);
}

int main(void) {
    make_cache_dir();
    KT_RUN(test_templates_embedded);
    KT_RUN(test_compile_every_family);
    KT_RUN(test_cache_hit_and_damage);
    KT_RUN(test_errors_carry_log);
    KT_RUN(test_include_dir_override);
    KT_RUN(test_pick_image);
    KT_RUN(test_init_without_device_is_clear);
    remove_cache_dir();
    return KT_END();
}

#else /* no CUDA toolkit at build time */

static void test_templates_embedded(void) {
    KT_CHECK(kiln_kernel_src_find("gemv.cuh") != NULL);
    kiln_buf out = {0};
    kiln_error err = {0};
    KT_EQ_INT(kiln_nvrtc_compile("", "x", NULL, 0, 90, false, &out, NULL, &err), KILN_ERR_UNSUPPORTED);
    KT_CONTAINS(err.msg, "without CUDA");
}
static void test_nvrtc(void) { KT_SKIP("no CUDA toolkit: kiln was built without the GPU parts"); }

int main(void) {
    KT_RUN(test_templates_embedded);
    KT_RUN(test_nvrtc);
    return KT_END();
}
#endif
