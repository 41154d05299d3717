/*
 * test_kv8.c — an 8-bit KV cache (`kiln compile --kv-dtype fp8|int8`, compiler/kv_calib.c, pass
 * quantize-kv) on the CPU executor.
 *
 * 1. The codes (kiln_kv_code, kiln_kv_value): fp8 is E4M3 of x / scale (kiln_f32_to_e4m3, itself
 *    checked in test_quant), int8 rounds to nearest even and clamps to +-127; a value comes back
 *    within half a step (int8) or 2^-4 relative (E4M3 normals).
 * 2. The engine: every attention op carries +kv_fp8 / +kv_int8 and its layer's kv_scale weight
 *    (2 x kv heads, f32, positive); the scales put the calibration's largest |k| and |v| of each head
 *    at 224 (fp8) or 127 (int8), checked against the CPU's own trace of the bf16-KV engine on the same
 *    calibration ids; its logits over 150 tokens stay near the bf16-KV engine's but are not its own
 *    (the cache rounds); scales given by hand that clip everything move them far (the scales are used).
 * 3. Refusals: both flags, a kv_scale of the wrong shape (verifier), --tp with --kv-dtype.
 * 4. A compressed-tensors checkpoint's kv_cache_scheme (made here from tiny-mistral-fp8-ct-tensor with
 *    k_scale / v_scale tensors of our choosing, per tensor or per kv head): its scales become the plan's (bf16, rounded up), the
 *    engine computes what those scales given by hand compute, --kv-dtype bf16 leaves the cache bf16
 *    (the original checkpoint's logits), int8 is refused; schemes other than static FP8 per tensor, a
 *    missing scale and a negative one are refused naming the field or the tensor.
 */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compiler/kiln_compiler.h"
#include "kt.h"
#include "kt_fixture.h"
#include "runtime/kiln_rt.h"

static char tmpdir[256];
static char ids_path[512];
enum { N_CALIB = 256, N_TOK = 150 };

static char *tmp_path(const char *name) {
    static char buf[4][1024];
    static int k;
    char *b = buf[k++ % 4];
    snprintf(b, sizeof buf[0], "%s/%s", tmpdir, name);
    return b;
}

static const char *mistral(void) { return KILN_SOURCE_DIR "/tests/data/tiny-mistral"; }

static void test_codes(void) {
    const float s = 0.01f;
    for (int i = -3000; i <= 3000; i++) {
        const float x = (float)i * 0.0037f;
        KT_EQ_INT(kiln_kv_code(x, s, false), kiln_f32_to_e4m3(x / s));
        const float v8 = kiln_kv_value(kiln_kv_code(x, s, false), s, false);
        if (fabsf(x / s) >= 0.015625f && fabsf(x / s) <= 448.0f)
            KT_CHECKF(fabsf(v8 - x) <= fabsf(x) * 0.0625f, "fp8 %g -> %g", x, v8);
        const float vi = kiln_kv_value(kiln_kv_code(x, s, true), s, true);
        if (fabsf(x / s) <= 127.0f) KT_CHECKF(fabsf(vi - x) <= s * 0.5f + 1e-7f, "int8 %g -> %g", x, vi);
        else KT_CHECKF(fabsf(vi) == 127.0f * s, "int8 %g -> %g (not clamped)", x, vi);
    }
    KT_EQ_INT((int8_t)kiln_kv_code(2.5f, 1.0f, true), 2); /* nearest even */
    KT_EQ_INT((int8_t)kiln_kv_code(3.5f, 1.0f, true), 4);
    KT_EQ_INT((int8_t)kiln_kv_code(-1000.0f, 1.0f, true), -127);
    KT_EQ_INT(kiln_kv_code(NAN, 1.0f, true), 0);
    KT_EQ_INT(kiln_kv_code(1e9f, 1.0f, false), 0x7E); /* saturated, not NaN */
    KT_CHECK(kiln_kv_scale_for(448.0f, false) == 2.0f && kiln_kv_scale_for(127.0f, true) == 1.0f);
}

static kiln_status compile_kv(const char *out, uint32_t kv, const float *scales) {
    kiln_compile_options o = {.output_path = out, .weight_dtype = KILN_DTYPE_BF16, .kv_dtype = kv, .kv_scales = scales,
                              .calib_tokens = N_CALIB, .calib_ids_path = kv && !scales ? ids_path : NULL,
                              .force = true};
    return kt_compile(mistral(), &o);
}

static float *logits_of(const char *engine, const int32_t *toks, int n, int *vocab) {
    kiln_model *m = NULL;
    kiln_cpu_ctx *c = NULL;
    kiln_error err = {0};
    float *out = NULL;
    if (kiln_model_open(engine, 2, &m, &err) == KILN_OK && kiln_cpu_ctx_new(m, 0, n, 2, &c, &err) == KILN_OK) {
        *vocab = m->plan->vocab_size;
        out = malloc((size_t)n * (size_t)*vocab * sizeof *out);
        if (out && kiln_cpu_forward(c, toks, n, true, out, &err) != KILN_OK) free(out), out = NULL;
    }
    if (!out) fprintf(stderr, "  %s: %s\n", engine, err.msg);
    kiln_cpu_ctx_free(c);
    kiln_model_close(m);
    return out;
}


/* The largest |k| and |v| of each (layer, kv head) the CPU sees over the calibration ids. */
typedef struct amax_ctx {
    int nkv, hd, layers;
    double *m; /* [layers][2 * nkv] */
} amax_ctx;
static void amax_trace(void *user, int layer, const float *k, const float *v, int n, int64_t kvw) {
    amax_ctx *a = user;
    for (int t = 0; t < n; t++)
        for (int64_t i = 0; i < kvw; i++) {
            double *m = a->m + (size_t)layer * 2 * (size_t)a->nkv;
            const int h = (int)(i / a->hd);
            m[h] = fmax(m[h], fabs((double)k[t * kvw + i]));
            m[a->nkv + h] = fmax(m[a->nkv + h], fabs((double)v[t * kvw + i]));
        }
}

static void calib_amax(const char *engine, int *layers, int *nkv, double **out) {
    kiln_model *m = NULL;
    kiln_cpu_ctx *c = NULL;
    kiln_error err = {0};
    KT_REQUIRE(kiln_model_open(engine, 2, &m, &err) == KILN_OK);
    amax_ctx a = {m->plan->n_kv_heads, m->plan->head_dim, m->plan->n_layers, NULL};
    a.m = calloc((size_t)a.layers * 2 * (size_t)a.nkv, sizeof *a.m);
    int32_t ids[N_CALIB];
    for (int i = 0; i < N_CALIB; i++) ids[i] = (i * 7919 + 13) % 250;
    const int seq = N_CALIB < m->plan->max_context ? N_CALIB : m->plan->max_context;
    float *lg = malloc((size_t)m->plan->vocab_size * sizeof *lg);
    KT_REQUIRE(kiln_cpu_ctx_new(m, seq, seq, 2, &c, &err) == KILN_OK);
    kiln_cpu_ctx_set_kv_trace(c, amax_trace, &a);
    for (int s0 = 0; s0 < N_CALIB; s0 += seq) {
        kiln_cpu_ctx_reset(c);
        KT_REQUIRE(kiln_cpu_forward(c, ids + s0, N_CALIB - s0 < seq ? N_CALIB - s0 : seq, false, lg, &err) == KILN_OK);
    }
    *layers = a.layers, *nkv = a.nkv, *out = a.m;
    free(lg);
    kiln_cpu_ctx_free(c);
    kiln_model_close(m);
}

/* The attention ops of an engine: each with `flag` and a kv_scale input; the scales, [layers][2 nkv]. */
static void engine_scales(const char *engine, uint32_t flag, float **out) {
    kiln_model *m = NULL;
    kiln_error err = {0};
    KT_REQUIRE(kiln_model_open(engine, 2, &m, &err) == KILN_OK);
    KT_REQUIRE(kiln_model_load_f32(m, &err) == KILN_OK);
    const kiln_plan *p = m->plan;
    const int nkv = p->n_kv_heads;
    float *s = *out = calloc((size_t)p->n_layers * 2 * (size_t)nkv, sizeof *s);
    int n_attn = 0;
    for (uint32_t i = 0; i < p->n_ops; i++) {
        const kiln_plan_op *op = &p->ops[i];
        if (op->kind != KILN_OP_ATTENTION) continue;
        n_attn++;
        KT_CHECKF(op->attrs.flags & flag, "attention op %u lacks the KV flag", i);
        KT_REQUIRE(op->n_in == 5);
        const kiln_plan_value *v = &p->values[op->in[4]];
        KT_REQUIRE(v->kind == KILN_PV_WEIGHT && p->weights[v->weight].dtype == KILN_DTYPE_F32);
        char want[64];
        snprintf(want, sizeof want, "model.layers.%d.self_attn.kv_scale", op->attrs.layer);
        KT_CHECK(strcmp(p->weights[v->weight].name, want) == 0);
        memcpy(s + (size_t)op->attrs.layer * 2 * nkv, m->wf32[v->weight], sizeof(float) * 2 * (size_t)nkv);
    }
    KT_EQ_INT(n_attn, p->n_layers);
    kiln_model_close(m);
}

static void test_engine(void) {
    const char *e16 = tmp_path("kv16.kiln"), *e8 = tmp_path("kvfp8.kiln"), *ei = tmp_path("kvint8.kiln");
    KT_REQUIRE(compile_kv(e16, 0, NULL) == KILN_OK);
    KT_REQUIRE(compile_kv(e8, KILN_FLAG_KV_FP8, NULL) == KILN_OK);
    KT_REQUIRE(compile_kv(ei, KILN_FLAG_KV_INT8, NULL) == KILN_OK);
    int layers = 0, nkv = 0;
    double *amax = NULL;
    calib_amax(e16, &layers, &nkv, &amax);
    KT_REQUIRE(amax != NULL);
    const char *engs[2] = {e8, ei};
    const uint32_t flags[2] = {KILN_FLAG_KV_FP8, KILN_FLAG_KV_INT8};
    int32_t toks[N_TOK];
    for (int i = 0; i < N_TOK; i++) toks[i] = (i * 104729 + 7) % 250;
    int V = 0;
    float *ref = logits_of(e16, toks, N_TOK, &V);
    KT_REQUIRE(ref != NULL);
    for (int k = 0; k < 2; k++) {
        float *s = NULL;
        engine_scales(engs[k], flags[k], &s);
        KT_REQUIRE(s != NULL);
        const double top = k ? 127.0 : 224.0;
        for (int i = 0; i < layers * 2 * nkv; i++)
            KT_CHECKF(amax[i] > 0 && amax[i] / s[i] <= top * (1 + 1e-6) && amax[i] / s[i] >= top * (1 - 1.0 / 128),
                      "%s scale %d: %g for a largest |x| of %g", engs[k], i, s[i], amax[i]);
        free(s);
        int v2 = 0;
        float *lg = logits_of(engs[k], toks, N_TOK, &v2);
        KT_REQUIRE(lg != NULL && v2 == V);
        const double e = kt_rel_l2(lg, ref, (size_t)N_TOK * V);
        fprintf(stderr, "  %s: logits over %d tokens rel err %.3g from the bf16 KV cache's\n", k ? "int8" : "fp8",
                N_TOK, e);
        KT_CHECKF(e > 0 && e < 0.06, "%s: rel err %.3g", engs[k], e);
        free(lg);
    }
    /* scales that clip every element to the top code: far from the model */
    float *tiny = malloc(sizeof(float) * (size_t)layers * 2 * nkv);
    for (int i = 0; i < layers * 2 * nkv; i++) tiny[i] = 1e-5f;
    const char *ec = tmp_path("kvclip.kiln");
    KT_REQUIRE(compile_kv(ec, KILN_FLAG_KV_INT8, tiny) == KILN_OK);
    float *lc = logits_of(ec, toks, N_TOK, &V);
    KT_REQUIRE(lc != NULL);
    const double ecl = kt_rel_l2(lc, ref, (size_t)N_TOK * V);
    KT_CHECKF(ecl > 0.2, "clipping scales moved the logits by %.3g only", ecl);
    free(lc), free(tiny), free(ref), free(amax);
}

/* ---- a compressed-tensors checkpoint with kv_cache_scheme (static FP8 K and V scales per layer) ----
 * Made here from tests/data/tiny-mistral-fp8-ct-tensor: its config.json with the scheme `scheme` (JSON),
 * its tensors, and kv.safetensors holding each layer's self_attn.k_scale and v_scale (F32 [1]: ks[l],
 * vs[l]; with nh > 1, [nh, 1, 1] as compressed-tensors writes attn_head scales: ks[l * nh + h]; a NULL
 * vs leaves v_scale out), tied together by model.safetensors.index.json. */
static const char *ct_src(void) { return KILN_SOURCE_DIR "/tests/data/tiny-mistral-fp8-ct-tensor"; }

static bool copy_file(const char *from, const char *to) {
    char cmd[2200];
    snprintf(cmd, sizeof cmd, "cp '%s' '%s'", from, to);
    return system(cmd) == 0;
}

static bool make_ct_kv_n(const char *dir, const char *scheme, const float *ks, const float *vs, int layers, int nh) {
    char cmd[1200], p[1100];
    snprintf(cmd, sizeof cmd, "rm -rf '%s' && mkdir -p '%s'", dir, dir);
    if (system(cmd) != 0) return false;
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    if (!copy_file(KILN_SOURCE_DIR "/tests/data/tiny-mistral-fp8-ct-tensor/model.safetensors", p)) return false;
    json_t *cfg = json_load_file(KILN_SOURCE_DIR "/tests/data/tiny-mistral-fp8-ct-tensor/config.json", 0, NULL);
    json_t *sc = json_loads(scheme, 0, NULL);
    if (!cfg || !sc) return false;
    json_object_set_new(json_object_get(cfg, "quantization_config"), "kv_cache_scheme", sc);
    snprintf(p, sizeof p, "%s/config.json", dir);
    if (json_dump_file(cfg, p, JSON_INDENT(1)) != 0) return false;
    json_decref(cfg);
    /* the index: every tensor of model.safetensors, then the scales in kv.safetensors */
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    FILE *f = fopen(p, "rb");
    uint8_t len8[8];
    if (!f || fread(len8, 1, 8, f) != 8) return false;
    uint64_t hl = 0;
    for (int i = 7; i >= 0; i--) hl = hl << 8 | len8[i];
    char *hdr = calloc(1, (size_t)hl + 1);
    if (!hdr || fread(hdr, 1, (size_t)hl, f) != (size_t)hl) return false;
    fclose(f);
    json_t *h = json_loads(hdr, 0, NULL), *map = json_object();
    free(hdr);
    const char *name;
    json_t *v;
    json_object_foreach(h, name, v) if (strcmp(name, "__metadata__")) json_object_set_new(map, name, json_string("model.safetensors"));
    json_decref(h);
    json_t *kvh = json_object();
    float data[64];
    int n = 0;
    for (int l = 0; l < layers; l++)
        for (int kv = 0; kv < 2; kv++) {
            if (kv && !vs) continue;
            char t[96];
            snprintf(t, sizeof t, "model.layers.%d.self_attn.%s", l, kv ? "v_scale" : "k_scale");
            json_t *shape = nh > 1 ? json_pack("[i, i, i]", nh, 1, 1) : json_pack("[i]", 1);
            json_object_set_new(kvh, t, json_pack("{s:s, s:o, s:[i, i]}", "dtype", "F32", "shape", shape,
                                                  "data_offsets", 4 * n, 4 * (n + nh)));
            json_object_set_new(map, t, json_string("kv.safetensors"));
            for (int k = 0; k < nh; k++) data[n++] = kv ? vs[l * nh + k] : ks[l * nh + k];
        }
    char *kt = json_dumps(kvh, JSON_COMPACT);
    json_decref(kvh);
    size_t kl = strlen(kt), pad = (8 - kl % 8) % 8;
    snprintf(p, sizeof p, "%s/kv.safetensors", dir);
    f = fopen(p, "wb");
    if (!f) return false;
    const uint64_t L = kl + pad;
    for (int i = 0; i < 8; i++) fputc((int)(L >> (8 * i) & 0xFF), f);
    fwrite(kt, 1, kl, f);
    for (size_t i = 0; i < pad; i++) fputc(' ', f);
    fwrite(data, sizeof(float), (size_t)n, f); /* little-endian hosts only, as the tests run */
    fclose(f);
    free(kt);
    json_t *idx = json_pack("{s:{}, s:o}", "metadata", "weight_map", map);
    snprintf(p, sizeof p, "%s/model.safetensors.index.json", dir);
    const int rc = json_dump_file(idx, p, 0);
    json_decref(idx);
    return rc == 0;
}

static bool make_ct_kv(const char *dir, const char *scheme, const float *ks, const float *vs, int layers) {
    return make_ct_kv_n(dir, scheme, ks, vs, layers, 1);
}

static const char *const CT_SCHEME = "{\"num_bits\": 8, \"type\": \"float\", \"strategy\": \"tensor\", \"dynamic\": false, "
                                     "\"symmetric\": true, \"group_size\": null, \"observer\": \"minmax\"}";

static kiln_status compile_ct(const char *ckpt, const char *out, uint32_t kv, bool bf16, const float *scales) {
    kiln_compile_options o = {.output_path = out, .kv_dtype = kv, .kv_bf16 = bf16, .kv_scales = scales, .force = true};
    return kt_compile(ckpt, &o);
}

static void test_ct_kv_scheme(void) {
    const float ks[2] = {0.0371f, 0.0519f}, vs[2] = {0.00412f, 0.00633f};
    char ck[1024], e[1024], e2[1024], e3[1024], e4[1024]; /* tmp_path's buffers turn over */
    snprintf(ck, sizeof ck, "%s", tmp_path("ct-kv"));
    snprintf(e, sizeof e, "%s", tmp_path("ct-kv.kiln"));
    snprintf(e2, sizeof e2, "%s", tmp_path("ct-given.kiln"));
    snprintf(e3, sizeof e3, "%s", tmp_path("ct-bf16.kiln"));
    snprintf(e4, sizeof e4, "%s", tmp_path("ct-plain.kiln"));
    KT_REQUIRE(make_ct_kv(ck, CT_SCHEME, ks, vs, 2));
    /* read as they are: every attention op +kv_fp8 with the layer's scales (rounded up to bf16) on every head */
    KT_REQUIRE(compile_ct(ck, e, 0, false, NULL) == KILN_OK);
    float *s = NULL;
    engine_scales(e, KILN_FLAG_KV_FP8, &s);
    KT_REQUIRE(s != NULL);
    float given[2 * 2 * 2];
    for (int l = 0; l < 2; l++)
        for (int h = 0; h < 2; h++) {
            KT_CHECK(s[l * 4 + h] == kiln_kv_scale_bf16(ks[l]) && s[l * 4 + 2 + h] == kiln_kv_scale_bf16(vs[l]));
            KT_CHECK(s[l * 4 + h] >= ks[l] && s[l * 4 + h] < ks[l] * (1 + 1.0f / 128));
            given[l * 4 + h] = ks[l], given[l * 4 + 2 + h] = vs[l];
        }
    free(s);
    /* the same numbers as those scales given to the original checkpoint's compile: the same logits */
    KT_REQUIRE(compile_ct(ct_src(), e2, KILN_FLAG_KV_FP8, false, given) == KILN_OK);
    int32_t toks[N_TOK];
    for (int i = 0; i < N_TOK; i++) toks[i] = (i * 104729 + 7) % 250;
    int V = 0, V2 = 0;
    float *a = logits_of(e, toks, N_TOK, &V), *b = logits_of(e2, toks, N_TOK, &V2);
    KT_REQUIRE(a && b && V == V2);
    KT_CHECK(memcmp(a, b, sizeof(float) * (size_t)N_TOK * V) == 0);
    /* --kv-dtype bf16: the scales read and checked, the cache in bf16: the original checkpoint's logits */
    KT_REQUIRE(compile_ct(ck, e3, 0, true, NULL) == KILN_OK);
    KT_REQUIRE(compile_ct(ct_src(), e4, 0, false, NULL) == KILN_OK);
    float *c = logits_of(e3, toks, N_TOK, &V), *d = logits_of(e4, toks, N_TOK, &V2);
    KT_REQUIRE(c && d);
    KT_CHECK(memcmp(c, d, sizeof(float) * (size_t)N_TOK * V) == 0);
    KT_CHECK(memcmp(a, d, sizeof(float) * (size_t)N_TOK * V) != 0); /* the FP8 cache rounds */
    free(a), free(b), free(c), free(d);
    KT_EQ_INT(compile_ct(ck, tmp_path("x.kiln"), KILN_FLAG_KV_INT8, false, NULL), KILN_ERR_INVALID_ARG);
    /* schemes kiln does not read, a missing or bad scale: refused by name */
    static const struct {
        const char *scheme, *want;
    } bad[] = {{"{\"num_bits\": 4, \"type\": \"float\", \"strategy\": \"tensor\"}", "kv_cache_scheme.num_bits"},
               {"{\"num_bits\": 8, \"type\": \"int\", \"strategy\": \"tensor\"}", "kv_cache_scheme.type"},
               {"{\"num_bits\": 8, \"type\": \"float\", \"strategy\": \"head\"}", "kv_cache_scheme.strategy"},
               {"{\"num_bits\": 8, \"type\": \"float\", \"strategy\": \"tensor\", \"dynamic\": true}", "kv_cache_scheme.dynamic"},
               {"{\"num_bits\": 8, \"type\": \"float\", \"strategy\": \"tensor\", \"symmetric\": false}", "kv_cache_scheme.symmetric"}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        KT_REQUIRE(make_ct_kv(ck, bad[i].scheme, ks, vs, 2));
        kiln_compile_options o = {.output_path = tmp_path("x.kiln"), .force = true};
        kiln_error err = {0};
        KT_EQ_INT(kiln_compile(ck, &o, &err), KILN_ERR_UNSUPPORTED);
        KT_CHECKF(strstr(err.msg, bad[i].want) != NULL, "%s: %s", bad[i].want, err.msg);
    }
    KT_REQUIRE(make_ct_kv(ck, CT_SCHEME, ks, NULL, 2));
    kiln_compile_options o = {.output_path = tmp_path("x.kiln"), .force = true};
    kiln_error err = {0};
    KT_CHECK(kiln_compile(ck, &o, &err) != KILN_OK && strstr(err.msg, "model.layers.0.self_attn.v_scale") != NULL);
    const float neg[2] = {0.0371f, -1.0f};
    KT_REQUIRE(make_ct_kv(ck, CT_SCHEME, neg, vs, 2));
    KT_CHECK(kiln_compile(ck, &o, &err) != KILN_OK && strstr(err.msg, "model.layers.1.self_attn.k_scale") != NULL);
}

/* strategy attn_head: a scale per kv head ([n_kv, 1, 1]) becomes each head's, computing what the same
 * scales given by hand compute; a per-tensor [1] under attn_head, or a per-head one under tensor, is
 * refused naming the tensor; a head's bad scale names the tensor and the head. */
static void test_ct_kv_per_head(void) {
    const float ks[4] = {0.0371f, 0.0213f, 0.0519f, 0.0802f}, vs[4] = {0.00412f, 0.00977f, 0.00633f, 0.0021f};
    static const char *const HEAD = "{\"num_bits\": 8, \"type\": \"float\", \"strategy\": \"attn_head\", "
                                    "\"dynamic\": false, \"symmetric\": true}";
    char ck[1024], e[1024], e2[1024];
    snprintf(ck, sizeof ck, "%s", tmp_path("ct-head"));
    snprintf(e, sizeof e, "%s", tmp_path("ct-head.kiln"));
    snprintf(e2, sizeof e2, "%s", tmp_path("ct-head-given.kiln"));
    KT_REQUIRE(make_ct_kv_n(ck, HEAD, ks, vs, 2, 2));
    KT_REQUIRE(compile_ct(ck, e, 0, false, NULL) == KILN_OK);
    float *s = NULL;
    engine_scales(e, KILN_FLAG_KV_FP8, &s);
    KT_REQUIRE(s != NULL);
    float given[8];
    for (int l = 0; l < 2; l++)
        for (int h = 0; h < 2; h++) {
            KT_CHECKF(s[l * 4 + h] == kiln_kv_scale_bf16(ks[l * 2 + h]) &&
                          s[l * 4 + 2 + h] == kiln_kv_scale_bf16(vs[l * 2 + h]),
                      "layer %d head %d: %g %g against %g %g", l, h, (double)s[l * 4 + h], (double)s[l * 4 + 2 + h],
                      (double)ks[l * 2 + h], (double)vs[l * 2 + h]);
            given[l * 4 + h] = ks[l * 2 + h], given[l * 4 + 2 + h] = vs[l * 2 + h];
        }
    free(s);
    KT_REQUIRE(compile_ct(ct_src(), e2, KILN_FLAG_KV_FP8, false, given) == KILN_OK);
    int32_t toks[N_TOK];
    for (int i = 0; i < N_TOK; i++) toks[i] = (i * 7919 + 3) % 250;
    int V = 0, V2 = 0;
    float *a = logits_of(e, toks, N_TOK, &V), *b = logits_of(e2, toks, N_TOK, &V2);
    KT_REQUIRE(a && b && V == V2);
    KT_CHECK(memcmp(a, b, sizeof(float) * (size_t)N_TOK * V) == 0);
    free(a), free(b);
    kiln_compile_options o = {.output_path = tmp_path("x.kiln"), .force = true};
    kiln_error err = {0};
    KT_REQUIRE(make_ct_kv_n(ck, HEAD, ks, vs, 2, 1)); /* [1] where a scale per head is due */
    KT_CHECK(kiln_compile(ck, &o, &err) != KILN_OK && strstr(err.msg, "model.layers.0.self_attn.k_scale") != NULL);
    KT_REQUIRE(make_ct_kv_n(ck, CT_SCHEME, ks, vs, 2, 2)); /* [2, 1, 1] under strategy tensor */
    KT_CHECK(kiln_compile(ck, &o, &err) != KILN_OK && strstr(err.msg, "model.layers.0.self_attn.k_scale") != NULL);
    const float bad[4] = {0.0371f, 0.0213f, 0.0519f, NAN};
    KT_REQUIRE(make_ct_kv_n(ck, HEAD, ks, bad, 2, 2));
    KT_CHECK(kiln_compile(ck, &o, &err) != KILN_OK && strstr(err.msg, "model.layers.1.self_attn.v_scale") != NULL &&
             strstr(err.msg, "kv head 1") != NULL);
}

static void test_refusals(void) {
    kiln_compile_options o = {.output_path = tmp_path("tp.kiln"), .kv_dtype = KILN_FLAG_KV_FP8, .tp = 2,
                              .force = true};
    KT_EQ_INT(kt_compile(mistral(), &o), KILN_ERR_UNSUPPORTED);
    o.tp = 0;
    o.kv_dtype = 0x3;
    KT_EQ_INT(kt_compile(mistral(), &o), KILN_ERR_INVALID_ARG);
    /* contradictory options are refused, not one of them ignored */
    const float one[8] = {1, 1, 1, 1, 1, 1, 1, 1};
    kiln_compile_options c1 = {.output_path = tmp_path("c.kiln"), .kv_dtype = KILN_FLAG_KV_FP8, .kv_bf16 = true,
                               .force = true};
    KT_EQ_INT(kt_compile(mistral(), &c1), KILN_ERR_INVALID_ARG);
    kiln_compile_options c2 = {.output_path = tmp_path("c.kiln"), .kv_scales = one, .force = true};
    KT_EQ_INT(kt_compile(mistral(), &c2), KILN_ERR_INVALID_ARG);
    /* the verifier: an attention op with both flags, or a kv_scale of the wrong shape */
    kiln_op_attrs a = {.layer = 0, .n_heads = 4, .n_kv_heads = 2, .head_dim = 8, .flags = KILN_FLAG_KV_FP8};
    kiln_tensor_desc in[5] = {
        {.id = 0, .dtype = KILN_DTYPE_F32, .ndim = 3, .shape = {KILN_DIM_BATCH, KILN_DIM_SEQ, 32}},
        {.id = 1, .dtype = KILN_DTYPE_F32, .ndim = 3, .shape = {KILN_DIM_BATCH, KILN_DIM_SEQ, 16}},
        {.id = 2, .dtype = KILN_DTYPE_F32, .ndim = 3, .shape = {KILN_DIM_BATCH, KILN_DIM_SEQ, 16}},
        {.id = 3, .dtype = KILN_DTYPE_I32, .ndim = 2, .shape = {KILN_DIM_BATCH, KILN_DIM_SEQ}},
        {.id = 4, .is_weight = 1, .dtype = KILN_DTYPE_F32, .ndim = 1, .shape = {4}, .name = "kv_scale"}};
    kiln_tensor_desc out[1];
    kiln_error err = {0};
    KT_EQ_INT(kiln_op_infer(KILN_OP_ATTENTION, in, 5, &a, out, &err), KILN_OK);
    KT_CHECK(kiln_op_infer(KILN_OP_ATTENTION, in, 4, &a, out, &err) != KILN_OK); /* the scales missing */
    in[4].shape[0] = 2;
    KT_CHECK(kiln_op_infer(KILN_OP_ATTENTION, in, 5, &a, out, &err) != KILN_OK);
    KT_CHECK(strstr(err.msg, "kv_scale") != NULL);
    in[4].shape[0] = 4;
    a.flags |= KILN_FLAG_KV_INT8;
    KT_CHECK(kiln_op_infer(KILN_OP_ATTENTION, in, 5, &a, out, &err) != KILN_OK);
}

int main(void) {
    FILE *f = NULL;
    if (kt_tmpdir(tmpdir, sizeof tmpdir, "kv8")) {
        snprintf(ids_path, sizeof ids_path, "%s/calib.ids", tmpdir);
        f = fopen(ids_path, "w");
    }
    if (!f) {
        fprintf(stderr, "cannot write the calibration ids in a temporary folder\n");
        return 1;
    }
    for (int i = 0; i < N_CALIB; i++) fprintf(f, "%d ", (i * 7919 + 13) % 250);
    fclose(f);
    KT_RUN(test_codes);
    KT_RUN(test_engine);
    KT_RUN(test_refusals);
    KT_RUN(test_ct_kv_scheme);
    KT_RUN(test_ct_kv_per_head);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    if (system(cmd) != 0) fprintf(stderr, "  could not remove %s\n", tmpdir);
    return KT_END();
}
