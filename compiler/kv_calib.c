/*
 * kv_calib.c — `kiln compile --kv-dtype fp8|int8`: the KV cache's scales.
 *
 * An 8-bit KV cache stores each K and V element as code = round(x / scale)
 * (E4M3 or int8: kiln_kv_code) with one scale per kv head of each layer for
 * K and one for V, fixed in the engine (pass quantize-kv gives each
 * attention op its layer's kv_scale weight). Fixed scales cost nothing in
 * the attention kernels (K's folds into q, V's into the output) and a token
 * takes exactly half the bytes of bf16.
 *
 * The scales come from the calibration (--calib, --calib-ids or the built-in
 * text, cut to --calib-tokens, default 512): the calibration engine (this
 * compile, weights dense, KV cache in the element type) runs on the CPU
 * executor, whose KV trace hands over each layer's k (after RoPE) and v rows
 * as they go into the cache; the largest |x| of each (layer, K or V, kv
 * head) gives the scale by kiln_kv_scale_for (fp8: amax / 224, room for
 * twice the calibration's largest value; int8: amax / 127, values past it
 * saturate). A head the calibration never saw off zero gets scale 1.
 */
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../common/kiln_pool.h"
#include "../common/kiln_progress.h"
#include "../runtime/kiln_rt.h"
#include "kiln_compiler.h"

typedef struct kv_ctx {
    int n_layers, n_kv, head_dim;
    double *amax; /* [n_layers][2 * n_kv]: K's kv heads, then V's (double: max is exact either way) */
} kv_ctx;

static void trace(void *user, int layer, const float *k, const float *v, int n, int64_t kvw) {
    kv_ctx *a = user;
    if (layer < 0 || layer >= a->n_layers || kvw != (int64_t)a->n_kv * a->head_dim) return;
    double *m = a->amax + (size_t)layer * 2 * (size_t)a->n_kv;
    for (int t = 0; t < n; t++)
        for (int64_t i = 0; i < kvw; i++) {
            const int h = (int)(i / a->head_dim);
            const double ak = fabs((double)k[t * kvw + i]), av = fabs((double)v[t * kvw + i]);
            if (ak > m[h] || ak != ak) m[h] = ak; /* a NaN sticks: refused below */
            if (av > m[a->n_kv + h] || av != av) m[a->n_kv + h] = av;
        }
}

static kiln_status run(const kiln_compile_options *opt, kiln_model *m, kiln_kv_calib *out, kiln_error *err) {
    const kiln_plan *p = m->plan;
    const bool int8 = opt->kv_dtype == KILN_FLAG_KV_INT8;
    kv_ctx a = {.n_layers = p->n_layers, .n_kv = p->n_kv_heads, .head_dim = p->head_dim};
    int32_t *ids = NULL;
    size_t n_ids = 0;
    json_t *calib = NULL;
    float *logits = NULL;
    kiln_cpu_ctx *c = NULL;
    const size_t n_sc = (size_t)a.n_layers * 2 * (size_t)a.n_kv;
    kiln_status st = kiln_calib_tokens(opt, m, "--kv-dtype", &ids, &n_ids, &calib, err);
    if (st != KILN_OK) goto out;
    const int n_toks = n_ids < (size_t)opt->calib_tokens ? (int)n_ids : opt->calib_tokens;
    if (n_toks < 32) {
        st = kiln_err(err, KILN_ERR_INVALID_ARG, "--kv-dtype: the calibration has %d tokens; at least 32 are needed",
                      n_toks);
        goto out;
    }
    const int seq = n_toks < (int)p->max_context ? n_toks : (int)p->max_context;
    a.amax = calloc(n_sc, sizeof *a.amax);
    out->scales = malloc(n_sc * sizeof *out->scales);
    logits = malloc((size_t)p->vocab_size * sizeof *logits);
    if (!a.amax || !out->scales || !logits) {
        st = kiln_err(err, KILN_ERR_NOMEM, "--kv-dtype: out of memory");
        goto out;
    }
    if ((st = kiln_model_load_f32(m, err)) != KILN_OK ||
        (st = kiln_cpu_ctx_new(m, seq, seq, kiln_pool_ways(kiln_pool_shared()), &c, err)) != KILN_OK) {
        kiln_err_prefix(err, "--kv-dtype: the CPU executor: ");
        goto out;
    }
    kiln_cpu_ctx_set_kv_trace(c, trace, &a);
    kiln_progress_phase(opt->progress, "kv cache: calibrate", 0, NULL, 0);
    for (int s0 = 0; s0 < n_toks && st == KILN_OK; s0 += seq) {
        kiln_cpu_ctx_reset(c);
        st = kiln_cpu_forward(c, ids + s0, n_toks - s0 < seq ? n_toks - s0 : seq, false, logits, err);
    }
    if (st != KILN_OK) goto out;
    double kmax = 0, vmax = 0;
    int unseen = 0;
    for (size_t i = 0; i < n_sc; i++) {
        const double x = a.amax[i];
        if (!isfinite(x) || x > 3e38) {
            st = kiln_err(err, KILN_ERR_FORMAT, "--kv-dtype: layer %zu's %c of kv head %zu reached %g on the "
                          "calibration tokens: not a value an 8-bit cache can hold", i / (2 * (size_t)a.n_kv),
                          i % (2 * (size_t)a.n_kv) < (size_t)a.n_kv ? 'k' : 'v', i % (size_t)a.n_kv, x);
            goto out;
        }
        unseen += x == 0;
        out->scales[i] = x > 0 ? kiln_kv_scale_for((float)x, int8) : 1.0f;
        if (i % (2 * (size_t)a.n_kv) < (size_t)a.n_kv) kmax = x > kmax ? x : kmax;
        else vmax = x > vmax ? x : vmax;
    }
    out->report = json_pack("{s:o, s:i, s:f, s:f, s:i}", "source", calib, "tokens", n_toks, "k_max", kmax, "v_max",
                            vmax, "heads_never_nonzero", unseen);
    calib = NULL;
out:
    kiln_cpu_ctx_free(c);
    free(a.amax), free(logits), free(ids);
    json_decref(calib);
    return st;
}

kiln_status kiln_kv_calib_run(const char *ckpt_dir, const kiln_compile_options *opt, kiln_kv_calib *out,
                              kiln_error *err) {
    memset(out, 0, sizeof *out);
    kiln_model *m = NULL;
    kiln_status st = kiln_calib_model(ckpt_dir, opt, "--kv-dtype", NULL, &m, err);
    if (st == KILN_OK) st = run(opt, m, out, err);
    kiln_model_close(m);
    if (st != KILN_OK) kiln_kv_calib_free(out);
    return st;
}

void kiln_kv_calib_free(kiln_kv_calib *k) {
    free(k->scales);
    json_decref(k->report);
    memset(k, 0, sizeof *k);
}
