/*
 * test_quant_awq.c — `kiln compile --awq` (compiler/quant_awq.c): activation-aware scales folded
 * into the weights before rounding.
 *
 * 1. The folding is exact: with the scales applied but the matrices left dense (awq_dense), an f32
 *    engine computes what the unscaled f32 engine does, to f32 rounding, on kjv-tiny (a trained
 *    Llama: every fold kind, RMSNorm, up before down and v before o, gets scaled there, which the
 *    report is checked for), tiny-mistral (GQA 4/2: o's scales shared by the query heads of a KV
 *    head) and tiny-qwen2 (v's bias divided with its rows).
 * 2. The scales change the quantized engine (the report names the scaled groups, and its logits
 *    differ from the unscaled int4 engine's), and the search's own error on its calibration rows is
 *    never above plain rounding's, group by group.
 */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "compiler/kiln_compiler.h"
#include "kt.h"
#include "kt_fixture.h"
#include "runtime/kiln_rt.h"

static char tmpdir[256];
static char ids_path[512];

static char *path_in(const char *dir, const char *name) {
    static char buf[4][1024];
    static int k;
    char *b = buf[k++ % 4];
    snprintf(b, sizeof buf[0], "%s/%s", dir, name);
    return b;
}

/* Forward `n` tokens through the engine on the CPU; all logits (malloc'd), their count in *count. */
static float *logits_of(const char *engine, const int32_t *toks, int n, size_t *count) {
    kiln_model *m = NULL;
    kiln_cpu_ctx *c = NULL;
    kiln_error err = {0};
    float *out = NULL;
    if (kiln_model_open(engine, 2, &m, &err) != KILN_OK || kiln_cpu_ctx_new(m, 0, n, 2, &c, &err) != KILN_OK) {
        fprintf(stderr, "  %s: %s\n", engine, err.msg);
    } else {
        *count = (size_t)n * m->plan->vocab_size;
        out = malloc(*count * sizeof *out);
        if (kiln_cpu_forward(c, toks, n, true, out, &err) != KILN_OK) {
            fprintf(stderr, "  %s: %s\n", engine, err.msg);
            free(out), out = NULL;
        }
    }
    kiln_cpu_ctx_free(c);
    kiln_model_close(m);
    return out;
}

/* Max |a - b| and the range of a. */
static double max_diff(const float *a, const float *b, size_t n, double *range) {
    double e = 0, lo = INFINITY, hi = -INFINITY;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - (double)b[i]);
        if (!(d <= e)) e = d;
        lo = a[i] < lo ? a[i] : lo, hi = a[i] > hi ? a[i] : hi;
    }
    *range = hi - lo;
    return e;
}

/* Compile `ckpt` into `out`; with awq, the report (meta build.quant.awq) parsed into *awq. */
static int compile(const char *ckpt, const char *out, kiln_dtype dt, int quant, bool awq, bool dense,
                   json_t **report) {
    char *q = NULL;
    kiln_compile_options o = {.output_path = out, .weight_dtype = dt, .quant = quant, .awq = awq,
                              .awq_dense = dense, .quant_method = KILN_QUANT_RTN, .calib_tokens = 256,
                              .calib_ids_path = ids_path, .quant_report = report ? &q : NULL, .force = true};
    kiln_status st = kt_compile(ckpt, &o);
    if (report) {
        json_t *all = q ? json_loads(q, 0, NULL) : NULL;
        *report = all ? json_incref(json_object_get(all, "awq")) : NULL;
        json_decref(all);
    }
    free(q);
    return st;
}

/* Which fold kinds the report scaled: bit 0 a norm, 1 an up projection, 2 a v projection. */
static int folds_scaled(const json_t *awq) {
    int kinds = 0;
    size_t i;
    json_t *g;
    json_array_foreach(json_object_get(awq, "groups"), i, g) {
        const char *fold = json_string_value(json_object_get(g, "fold"));
        if (!fold || json_real_value(json_object_get(g, "alpha")) <= 0) continue;
        kinds |= strstr(fold, "layernorm") ? 1 : strstr(fold, "up_proj") ? 2 : strstr(fold, "v_proj") ? 4 : 0;
    }
    return kinds;
}

static void test_folding_exact(const char *rel, int want_kinds) {
    char ckpt[1024];
    snprintf(ckpt, sizeof ckpt, "%s/%s", KILN_SOURCE_DIR, rel);
    const char *plain = path_in(tmpdir, "plain.kiln"), *scaled = path_in(tmpdir, "scaled.kiln");
    json_t *awq = NULL;
    KT_REQUIRE(compile(ckpt, plain, KILN_DTYPE_F32, 0, false, false, NULL) == KILN_OK);
    KT_REQUIRE(compile(ckpt, scaled, KILN_DTYPE_F32, KILN_DTYPE_Q4G32, true, true, &awq) == KILN_OK);
    KT_REQUIRE(awq != NULL);
    const int scaled_groups = (int)json_integer_value(json_object_get(awq, "groups_scaled"));
    KT_CHECKF(scaled_groups > 0, "%s: no group scaled", rel);
    KT_CHECKF((folds_scaled(awq) & want_kinds) == want_kinds, "%s: folds scaled %d, want %d", rel, folds_scaled(awq),
              want_kinds);
    int32_t toks[48];
    for (int i = 0; i < 48; i++) toks[i] = (int32_t)((i * 37 + 5) % 200);
    size_t na = 0, nb = 0;
    float *a = logits_of(plain, toks, 48, &na), *b = logits_of(scaled, toks, 48, &nb);
    KT_REQUIRE(a && b && na == nb);
    double range, e = max_diff(a, b, na, &range);
    fprintf(stderr, "  %s: %d groups scaled; dense scaled vs unscaled: max |logit diff| %.3g (%.2g of range)\n", rel,
            scaled_groups, e, e / range);
    KT_CHECKF(e <= 1e-5 * range, "%s: scaling changed the logits by %.3g (range %.3g)", rel, e, range);
    free(a), free(b);
    json_decref(awq);
}

static void test_folding_kjv(void) { test_folding_exact("models/kjv-tiny", 1 | 2 | 4); }
static void test_folding_mistral(void) { test_folding_exact("tests/data/tiny-mistral", 1); }
static void test_folding_qwen2(void) { test_folding_exact("tests/data/tiny-qwen2", 1); }

static void test_scaled_int4(void) {
    char ckpt[1024];
    snprintf(ckpt, sizeof ckpt, "%s/models/kjv-tiny", KILN_SOURCE_DIR);
    const char *rtn = path_in(tmpdir, "rtn.kiln"), *awqe = path_in(tmpdir, "awq.kiln");
    json_t *awq = NULL;
    KT_REQUIRE(compile(ckpt, rtn, KILN_DTYPE_F32, KILN_DTYPE_Q4G32, false, false, NULL) == KILN_OK);
    KT_REQUIRE(compile(ckpt, awqe, KILN_DTYPE_F32, KILN_DTYPE_Q4G32, true, false, &awq) == KILN_OK);
    KT_REQUIRE(awq != NULL);
    size_t i;
    json_t *g;
    int searched = 0;
    json_array_foreach(json_object_get(awq, "groups"), i, g) {
        if (json_object_get(g, "skipped")) continue;
        searched++;
        const double e = json_real_value(json_object_get(g, "error")), e0 = json_real_value(json_object_get(g, "error_unscaled"));
        KT_CHECKF(e <= e0, "group %zu: error %.6g above unscaled %.6g", i, e, e0);
        KT_CHECK(e > 0); /* int4 rounding always costs something */
    }
    KT_EQ_INT(searched, (int)json_integer_value(json_object_get(awq, "groups_searched")));
    KT_CHECK(searched == 5 * 4); /* kjv-tiny: 5 layers of q/k/v, o, gate/up, down */
    int32_t toks[40];
    for (int k = 0; k < 40; k++) toks[k] = (int32_t)((k * 53 + 11) % 300);
    size_t na = 0, nb = 0;
    float *a = logits_of(rtn, toks, 40, &na), *b = logits_of(awqe, toks, 40, &nb);
    KT_REQUIRE(a && b && na == nb);
    double range, e = max_diff(a, b, na, &range);
    KT_CHECKF(e > 1e-3 * range, "the scales did not change the int4 engine (max diff %.3g)", e);
    free(a), free(b);
    json_decref(awq);
}

int main(void) {
    FILE *f = NULL;
    if (kt_tmpdir(tmpdir, sizeof tmpdir, "awq")) {
        snprintf(ids_path, sizeof ids_path, "%s/calib.ids", tmpdir);
        f = fopen(ids_path, "w");
    }
    if (!f) {
        fprintf(stderr, "cannot write the calibration ids in a temporary folder\n");
        return 1;
    }
    for (int i = 0; i < 256; i++) fprintf(f, "%d ", (i * 7919 + 13) % 250); /* every model's vocab is >= 256 */
    fclose(f);
    KT_RUN(test_folding_kjv);
    KT_RUN(test_folding_mistral);
    KT_RUN(test_folding_qwen2);
    KT_RUN(test_scaled_int4);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    if (system(cmd) != 0) fprintf(stderr, "  could not remove %s\n", tmpdir);
    return KT_END();
}
