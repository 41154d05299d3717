/*
 * test_golden.c — end to end against HuggingFace transformers: compile each
 * reference checkpoint, run the CPU executor, and compare with the goldens
 * tests/golden/make_goldens.py made (fp32, eager attention):
 *   - logits of one forward over prompt + continuation at every position:
 *     max |kiln − HF| ≤ 1e-4 × (logit range of that case);
 *   - greedy generation of all golden tokens, token by token through the KV
 *     cache: identical ids.
 * Each model is checked with the default pass pipeline, with no passes and
 * with every pass, so every fusion is shown to keep the numbers. Sharded and single-file
 * checkpoints of one model must give byte-identical engines.
 */
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "compiler/kiln_compiler.h"
#include "golden_io.h"
#include "kt.h"
#include "kt_fixture.h"
#include "runtime/kiln_rt.h"
#include "runtime/kiln_tokenizer.h"

static char tmpdir[256];

static char *src_path(const char *rel) {
    static char buf[4][1024];
    static int k;
    char *b = buf[k++ % 4];
    snprintf(b, sizeof buf[0], "%s/%s", KILN_SOURCE_DIR, rel);
    return b;
}

static int compile_to(const char *ckpt, const char *passes, const char *out, kiln_dtype dt) {
    kiln_compile_options opt = {.output_path = out, .weight_dtype = dt, .passes = passes};
    return kt_compile(ckpt, &opt);
}


/* Check one engine against one model's golden file. */
static void check_engine(const char *engine, const char *golden_dir) {
    char path[1024];
    snprintf(path, sizeof path, "%s/golden.json", golden_dir);
    json_error_t je;
    json_t *g = json_load_file(path, 0, &je);
    KT_REQUIRE(g != NULL);
    kiln_model *m = NULL;
    kiln_error err = {0};
    KT_REQUIRE(kiln_model_open(engine, 2, &m, &err) == KILN_OK);
    json_t *cases = json_object_get(g, "cases");
    size_t ci;
    json_t *c;
    json_array_foreach(cases, ci, c) {
        golden_case gc;
        golden_case_read(c, golden_dir, &gc);
        const int np = gc.np, ng = gc.ng, positions = gc.positions, vocab = gc.vocab;
        const int32_t *prompt = gc.prompt, *greedy = gc.greedy;
        const float *want = gc.logits;
        const double range = gc.range;
        KT_EQ_INT(positions, np + ng);
        KT_EQ_INT(vocab, m->plan->vocab_size);
        KT_CHECK(want != NULL);

        /* 1. one forward over the whole sequence, all logits */
        int32_t *seq = malloc((size_t)positions * sizeof *seq);
        memcpy(seq, prompt, (size_t)np * sizeof *seq);
        memcpy(seq + np, greedy, (size_t)ng * sizeof *seq);
        float *got = malloc((size_t)positions * (size_t)vocab * sizeof *got);
        kiln_cpu_ctx *ctx = NULL;
        KT_CHECK(kiln_cpu_ctx_new(m, 0, positions, 2, &ctx, &err) == KILN_OK);
        if (ctx && want) {
            KT_CHECK(kiln_cpu_forward(ctx, seq, positions, true, got, &err) == KILN_OK);
            double max_err = 0;
            for (size_t i = 0; i < (size_t)positions * (size_t)vocab; i++) {
                double e = fabs((double)got[i] - (double)want[i]);
                if (!(e <= max_err)) max_err = e; /* NaN propagates */
            }
            KT_CHECKF(max_err <= 1e-4 * range, "%s case %zu: max abs logit error %.3g > 1e-4 x range %.3g", engine,
                      ci, max_err, range);
            fprintf(stderr, "  %s case %zu: max abs logit error %.3g (%.2g of range)\n", golden_dir, ci, max_err,
                    max_err / range);
        }
        /* 2. greedy generation through the KV cache */
        if (ctx) {
            kiln_cpu_ctx_reset(ctx);
            kiln_generate_opts o = {.max_tokens = ng, .temperature = 0, .top_p = 1, .ignore_eos = true};
            kiln_generate_result r;
            KT_CHECK(kiln_generate(ctx, prompt, np, &o, &r, &err) == KILN_OK);
            KT_EQ_INT(r.n_ids, ng);
            int first_diff = -1;
            for (int i = 0; i < ng && i < r.n_ids; i++)
                if (r.ids[i] != greedy[i]) {
                    first_diff = i;
                    break;
                }
            KT_CHECKF(first_diff < 0, "%s case %zu: greedy ids differ from HF at step %d", engine, ci, first_diff);
            free(r.ids);
        }
        kiln_cpu_ctx_free(ctx);
        free(got);
        free(seq);
        golden_case_free(&gc);
    }
    kiln_model_close(m);
    json_decref(g);
}

static void check_model(const char *ckpt_rel, const char *golden_rel, kiln_dtype dt) {
    char out[512];
    /* the default pipeline, none, and every pass (the optional GPU ones only set flags the CPU ignores,
     * but they must keep a verified plan that loads) */
    const char *pass_sets[3] = {NULL, "none",
                                "fuse-add-rmsnorm,fuse-qkv-rope,fuse-gate-up-swiglu,fuse-linear-residual,"
                                "decode-attention-rope,decode-attention-merge,fold-norm-into-gemv,dce"};
    for (int k = 0; k < 3; k++) {
        snprintf(out, sizeof out, "%s/golden-%d.kiln", tmpdir, k);
        KT_REQUIRE(compile_to(src_path(ckpt_rel), pass_sets[k], out, dt) == KILN_OK);
        check_engine(out, src_path(golden_rel));
        unlink(out);
    }
}

static void test_stories260k(void) { check_model("models/stories260k", "tests/golden/stories260k", KILN_DTYPE_COUNT_); }
static void test_tiny_mistral_sliding_window(void) {
    check_model("tests/data/tiny-mistral", "tests/golden/tiny-mistral", KILN_DTYPE_COUNT_);
}
static void test_tiny_llama3_rope_scaling_tied(void) {
    check_model("tests/data/tiny-llama3", "tests/golden/tiny-llama3", KILN_DTYPE_COUNT_);
}
/* Qwen3: per-head q/k RMSNorm before RoPE, head_dim 24 while hidden / heads is 16 */
static void test_tiny_qwen3_qk_norm(void) {
    check_model("tests/data/tiny-qwen3", "tests/golden/tiny-qwen3", KILN_DTYPE_COUNT_);
}
/* Qwen2: q/k/v biases, a window on layer 1 only (max_window_layers, 4.x config), tied */
static void test_tiny_qwen2_bias_layer_window(void) {
    check_model("tests/data/tiny-qwen2", "tests/golden/tiny-qwen2", KILN_DTYPE_COUNT_);
}
/* bf16 → f32 conversion at compile time is exact, so the goldens still hold */
static void test_tiny_mistral_as_f32(void) {
    check_model("tests/data/tiny-mistral", "tests/golden/tiny-mistral", KILN_DTYPE_F32);
}

static void test_sharded_equals_single(void) {
    char a[512], b[512];
    snprintf(a, sizeof a, "%s/single.kiln", tmpdir);
    snprintf(b, sizeof b, "%s/sharded.kiln", tmpdir);
    KT_REQUIRE(compile_to(src_path("tests/data/tiny-mistral"), NULL, a, KILN_DTYPE_COUNT_) == KILN_OK);
    KT_REQUIRE(compile_to(src_path("tests/data/tiny-mistral-sharded"), NULL, b, KILN_DTYPE_COUNT_) == KILN_OK);
    kiln_mapped_file fa, fb;
    kiln_error err;
    KT_REQUIRE(kiln_file_map(a, &fa, &err) == KILN_OK);
    KT_REQUIRE(kiln_file_map(b, &fb, &err) == KILN_OK);
    KT_EQ_INT(fa.size, fb.size);
    KT_CHECK(fa.size == fb.size && memcmp(fa.data, fb.data, fa.size) == 0);
    kiln_file_unmap(&fa);
    kiln_file_unmap(&fb);
    unlink(a);
    unlink(b);
}

/* Text end to end on the real pycode-22m (bf16 weights, sliding window 256,
 * Llama-2 tokenizer): the prompt text encodes to HF's ids, greedy ids match
 * HF's float32 run, and the decoded text matches HF's. */
static void test_pycode_text(void) {
    char ckpt[1024], golden[1024], out[512];
    snprintf(ckpt, sizeof ckpt, "%s/models/pycode-22m", KILN_SHARED_DIR);
    if (!kiln_path_is_dir(ckpt)) KT_SKIP("%s not present (the shared test models)", ckpt);
    snprintf(golden, sizeof golden, "%s/tests/golden/pycode-22m/golden.json", KILN_SOURCE_DIR);
    snprintf(out, sizeof out, "%s/pycode.kiln", tmpdir);
    KT_REQUIRE(compile_to(ckpt, NULL, out, KILN_DTYPE_COUNT_) == KILN_OK);
    json_error_t je;
    json_t *g = json_load_file(golden, 0, &je);
    KT_REQUIRE(g != NULL);
    kiln_model *m = NULL;
    kiln_error err = {0};
    KT_REQUIRE(kiln_model_open(out, 2, &m, &err) == KILN_OK);
    KT_REQUIRE(m->tokenizer != NULL);
    size_t ci;
    json_t *c;
    json_array_foreach(json_object_get(g, "cases"), ci, c) {
        const char *text = json_string_value(json_object_get(c, "text"));
        int np, ng;
        int32_t *want_prompt = golden_json_ids(json_object_get(c, "prompt"), &np);
        json_t *f32 = json_object_get(c, "float32");
        int32_t *want = golden_json_ids(json_object_get(f32, "greedy"), &ng);
        int32_t *ids = NULL;
        size_t n = 0;
        KT_CHECK(kiln_tokenizer_encode(m->tokenizer, text, strlen(text), KILN_TOK_ADD_SPECIAL, &ids, &n, &err) ==
                 KILN_OK);
        KT_EQ_INT(n, np);
        KT_CHECK(ids && (int)n == np && memcmp(ids, want_prompt, n * sizeof *ids) == 0);
        kiln_cpu_ctx *ctx = NULL;
        KT_CHECK(kiln_cpu_ctx_new(m, 0, 512, 2, &ctx, &err) == KILN_OK);
        if (ctx && ids) {
            kiln_generate_opts o = {.max_tokens = ng, .temperature = 0, .top_p = 1, .ignore_eos = true};
            kiln_generate_result r;
            KT_CHECK(kiln_generate(ctx, ids, (int)n, &o, &r, &err) == KILN_OK);
            int diff = -1;
            for (int i = 0; i < ng && i < r.n_ids; i++)
                if (r.ids[i] != want[i]) {
                    diff = i;
                    break;
                }
            KT_CHECKF(diff < 0 && r.n_ids == ng, "case %zu (%s): greedy ids differ from HF at step %d", ci, text, diff);
            char *gen = NULL;
            size_t glen = 0;
            KT_CHECK(kiln_tokenizer_decode(m->tokenizer, r.ids, (size_t)r.n_ids, true, &gen, &glen, &err) == KILN_OK);
            const char *want_text = json_string_value(json_object_get(f32, "completion_text"));
            KT_CHECK(gen && want_text && glen == strlen(want_text) && memcmp(gen, want_text, glen) == 0);
            free(gen);
            free(r.ids);
        }
        kiln_cpu_ctx_free(ctx);
        free(ids);
        free(want);
        free(want_prompt);
    }
    kiln_model_close(m);
    json_decref(g);
    unlink(out);
}

int main(void) {
    if (!kt_tmpdir(tmpdir, sizeof tmpdir, "golden")) return 1;
    KT_RUN(test_stories260k);
    KT_RUN(test_tiny_mistral_sliding_window);
    KT_RUN(test_tiny_llama3_rope_scaling_tied);
    KT_RUN(test_tiny_qwen3_qk_norm);
    KT_RUN(test_tiny_qwen2_bias_layer_window);
    KT_RUN(test_tiny_mistral_as_f32);
    KT_RUN(test_sharded_equals_single);
    KT_RUN(test_pycode_text);
    rmdir(tmpdir);
    return KT_END();
}
