/*
 * model.c — open an engine file for execution: verify it, read the meta JSON
 * (generation settings), parse and check the plan, decode the weights and
 * load the tokenizer when the engine has one.
 *
 * The CPU executor works in f32, so every weight is converted once at load
 * (f32 weights whose bytes are 4-byte aligned are used in place), unless
 * the caller opens with KILN_MODEL_NO_F32 (a GPU executor reads the weights
 * section itself; a 7B model in f32 would take 28 GB of host memory); then
 * kiln_model_load_f32 converts later, if the CPU executor is wanted after all.
 */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "kiln_rt.h"
#include "kiln_tokenizer.h"

/* bos and eos ids from meta.generation: each inside the plan's vocabulary
 * (bos -1 or absent = none). The compiler writes no other; an engine that
 * holds one is damaged or forged, and running it would stop at the wrong
 * token or never, so it is refused rather than the id dropped. */
static kiln_status read_ids(kiln_model *m, const json_t *gen, const char *path, kiln_error *err) {
    const int32_t vocab = m->plan->vocab_size;
    json_t *bos = json_object_get(gen, "bos_token_id"), *eos = json_object_get(gen, "eos_token_ids"), *e;
    m->bos_id = -1;
    m->n_eos = 0;
    if (bos && !json_is_null(bos)) {
        json_int_t b = json_is_integer(bos) ? json_integer_value(bos) : -2;
        if (b < -1 || b >= vocab) {
            char *v = json_dumps(bos, JSON_ENCODE_ANY);
            kiln_err(err, KILN_ERR_FORMAT, "%s: meta generation.bos_token_id %.40s is outside the model's vocabulary "
                     "of %d (-1 = none)", path, v ? v : "?", vocab);
            free(v);
            return kiln_err_hint(err, "the engine is damaged or was not written by kiln; rebuild it with kiln compile");
        }
        m->bos_id = (int32_t)b;
    }
    if (eos && !json_is_array(eos)) {
        kiln_err(err, KILN_ERR_FORMAT, "%s: meta generation.eos_token_ids is not an array", path);
        return kiln_err_hint(err, "the engine is damaged or was not written by kiln; rebuild it with kiln compile");
    }
    if (json_array_size(eos) > KILN_MAX_EOS_IDS)
        return kiln_err(err, KILN_ERR_FORMAT, "%s: meta generation.eos_token_ids lists %zu ids; kiln reads at most %d",
                        path, json_array_size(eos), KILN_MAX_EOS_IDS);
    size_t i;
    json_array_foreach(eos, i, e) {
        if (!json_is_integer(e) || json_integer_value(e) < 0 || json_integer_value(e) >= vocab) {
            char *v = json_dumps(e, JSON_ENCODE_ANY);
            kiln_err(err, KILN_ERR_FORMAT, "%s: meta generation.eos_token_ids[%zu] = %.40s is not an id in the "
                     "model's vocabulary of %d", path, i, v ? v : "?", vocab);
            free(v);
            return kiln_err_hint(err, "the engine is damaged or was not written by kiln; rebuild it with kiln compile");
        }
        m->eos_ids[m->n_eos++] = (int32_t)json_integer_value(e);
    }
    return KILN_OK;
}

/* meta.generation's sampling defaults (engines before format 2.1 have none:
 * greedy). Present but out of range is a corrupted meta section. */
static kiln_status read_sampling(kiln_model *m, json_t *gen, const char *path, kiln_error *err) {
    m->gen_temperature = 0, m->gen_top_k = 0, m->gen_top_p = 1;
    json_t *t = json_object_get(gen, "temperature"), *k = json_object_get(gen, "top_k");
    json_t *p = json_object_get(gen, "top_p");
    if (t && (!json_is_number(t) || !(json_number_value(t) >= 0 && json_number_value(t) <= 1e6)))
        return kiln_err(err, KILN_ERR_FORMAT, "%s: meta generation.temperature is not a number in [0, 1e6]", path);
    if (k && (!json_is_integer(k) || json_integer_value(k) < 0 || json_integer_value(k) > m->plan->vocab_size))
        return kiln_err(err, KILN_ERR_FORMAT, "%s: meta generation.top_k is not an integer in [0, vocab_size]", path);
    if (p && (!json_is_number(p) || !(json_number_value(p) > 0 && json_number_value(p) <= 1)))
        return kiln_err(err, KILN_ERR_FORMAT, "%s: meta generation.top_p is not a number in (0, 1]", path);
    if (t) m->gen_temperature = (float)json_number_value(t);
    if (k) m->gen_top_k = (int32_t)json_integer_value(k);
    if (p) m->gen_top_p = (float)json_number_value(p);
    return KILN_OK;
}

static kiln_status read_meta(kiln_model *m, const char *path, kiln_error *err) {
    const kiln_engine_section *s = kiln_engine_find(&m->engine, KILN_SECTION_META);
    if (!s) return kiln_err(err, KILN_ERR_FORMAT, "%s: engine has no meta section", path);
    const uint8_t *data;
    size_t size;
    bool owned;
    kiln_status st = kiln_engine_section_bytes(&m->engine, s, 1, &data, &size, &owned, err);
    if (st != KILN_OK) return st;
    m->meta_json = malloc(size + 1);
    if (!m->meta_json) {
        if (owned) free((void *)data);
        return kiln_err(err, KILN_ERR_NOMEM, "%s: out of memory", path);
    }
    memcpy(m->meta_json, data, size);
    m->meta_json[size] = 0;
    if (owned) free((void *)data);

    json_error_t je;
    json_t *root = json_loads(m->meta_json, 0, &je);
    if (!root || !json_is_object(root)) {
        json_decref(root);
        return kiln_err(err, KILN_ERR_FORMAT, "%s: meta section is not a JSON object (%s)", path, je.text);
    }
    json_t *gen = json_object_get(root, "generation");
    const char *why = json_string_value(json_object_get(json_object_get(root, "build"), "no_gpu_kernels"));
    snprintf(m->no_gpu_kernels, sizeof m->no_gpu_kernels, "%s", why ? why : "");
    kiln_status st2 = read_ids(m, gen, path, err);
    if (st2 == KILN_OK) st2 = read_sampling(m, gen, path, err);
    json_decref(root);
    return st2;
}

static kiln_status convert_f32(kiln_model *m, const char *path, kiln_error *err);

kiln_status kiln_plan_check_permutations(const kiln_plan *p, const uint8_t *weights, const char *path,
                                         kiln_error *err) {
    for (uint32_t i = 0; i < p->n_ops; i++) {
        const int oi = kiln_op_order_input((kiln_op_kind)p->ops[i].kind, p->ops[i].attrs.flags);
        if (oi < 0) continue;
        const int32_t wi = p->values[p->ops[i].in[oi]].weight; /* the plan checked: an i32 vector weight */
        for (uint32_t r = 0; r < p->n_ranks; r++) {
            const kiln_plan_weight *w = &p->weights[r * p->n_weights + (uint32_t)wi];
            const int64_t k = w->shape[0];
            if (k > (1 << 24))
                return kiln_err(err, KILN_ERR_FORMAT, "%s: weight '%s' permutes %lld columns, more than 2^24", path,
                                w->name, (long long)k);
            uint8_t *seen = calloc((size_t)k, 1);
            if (!seen) return kiln_err(err, KILN_ERR_NOMEM, "%s: out of memory", path);
            for (int64_t j = 0; j < k; j++) {
                const int32_t v = (int32_t)kiln_rd_u32(weights + w->offset + 4 * (size_t)j);
                if (v >= 0 && v < k && !seen[v]++) continue;
                free(seen);
                kiln_err(err, KILN_ERR_FORMAT, "%s: weight '%s' (op %u, %s): element %lld is %d, %s", path, w->name, i,
                         kiln_op_name((kiln_op_kind)p->ops[i].kind), (long long)j, v,
                         v < 0 || v >= k ? "outside the row" : "a column already taken");
                return kiln_err_hint(err, "the engine is damaged: rebuild it with kiln compile");
            }
            free(seen);
        }
    }
    return KILN_OK;
}

static kiln_status load_weights(kiln_model *m, int threads, bool f32, const char *path, kiln_error *err) {
    const kiln_engine_section *s = kiln_engine_find(&m->engine, KILN_SECTION_WEIGHTS);
    if (!s) return kiln_err(err, KILN_ERR_FORMAT, "%s: engine has no weights section", path);
    kiln_status st = kiln_engine_section_bytes(&m->engine, s, threads, &m->weights, &m->weights_size,
                                               &m->weights_owned, err);
    if (st != KILN_OK) return st;
    const kiln_engine_section *ps = kiln_engine_find(&m->engine, KILN_SECTION_PLAN);
    if (!ps) return kiln_err(err, KILN_ERR_FORMAT, "%s: engine has no plan section", path);
    const uint8_t *pd;
    size_t psize;
    bool powned;
    if ((st = kiln_engine_section_bytes(&m->engine, ps, 1, &pd, &psize, &powned, err)) != KILN_OK) return st;
    st = kiln_plan_parse(pd, psize, m->weights_size, &m->plan, err);
    if (powned) free((void *)pd);
    if (st != KILN_OK) return kiln_err_prefix(err, "%s: ", path);
    if ((st = kiln_plan_check_permutations(m->plan, m->weights, path, err)) != KILN_OK) return st;
    return f32 ? convert_f32(m, path, err) : KILN_OK;
}

static kiln_status convert_f32(kiln_model *m, const char *path, kiln_error *err) {
    const kiln_plan *p = m->plan;
    const uint32_t n = p->n_ranks * p->n_weights; /* every rank's weights: the CPU runs all ranks */
    m->wf32 = calloc(n ? n : 1, sizeof *m->wf32);
    if (!m->wf32) return kiln_err(err, KILN_ERR_NOMEM, "%s: out of memory", path);
    for (uint32_t i = 0; i < n; i++) {
        const kiln_plan_weight *w = &p->weights[i];
        size_t count = 1;
        for (uint32_t d = 0; d < w->ndim; d++) count *= (size_t)w->shape[d]; /* the plan checked the sizes */
        const uint8_t *src = m->weights + w->offset;
        float *f = malloc(count * sizeof *f);
        if (!f) return kiln_err(err, KILN_ERR_NOMEM, "%s: out of memory converting weight '%s'", path, w->name);
        if (w->dtype == KILN_DTYPE_I32) { /* a permute op's indices, below 2^24 (check_permutations): exact */
            for (size_t k = 0; k < count; k++) f[k] = (float)(int32_t)kiln_rd_u32(src + 4 * k);
        } else if (kiln_dtype_is_quant((int)w->dtype)) { /* quantized: dequantized once, here */
            kiln_dequant_rows((int)w->dtype, src, w->shape[0], w->shape[1], 0, w->shape[0], f);
        } else if (w->dtype == KILN_DTYPE_F32) {
            memcpy(f, src, count * 4);
        } else {
            for (size_t k = 0; k < count; k++) {
                uint16_t h = (uint16_t)(src[2 * k] | src[2 * k + 1] << 8);
                f[k] = w->dtype == KILN_DTYPE_BF16 ? kiln_bf16_to_f32(h) : kiln_f16_to_f32(h);
            }
        }
        m->wf32[i] = f;
    }
    return KILN_OK;
}

static kiln_status load_tokenizer(kiln_model *m, const char *path, kiln_error *err) {
    const kiln_engine_section *s = kiln_engine_find(&m->engine, KILN_SECTION_TOKENIZER);
    if (!s) return KILN_OK;
    const uint8_t *data;
    size_t size;
    bool owned;
    kiln_status st = kiln_engine_section_bytes(&m->engine, s, 1, &data, &size, &owned, err);
    if (st != KILN_OK) return st;
    st = kiln_tokenizer_load(data, size, &m->tokenizer, err);
    if (owned) free((void *)data);
    if (st != KILN_OK) return kiln_err_prefix(err, "%s: tokenizer section: ", path);
    return KILN_OK;
}

kiln_status kiln_model_open(const char *path, int threads, kiln_model **out, kiln_error *err) {
    return kiln_model_open_ex(path, threads, 0, out, err);
}

bool kiln_model_shrank(const kiln_model *m, kiln_error *err) {
    return m->engine.map.data && m->engine.map.path && kiln_guard_fault_in(m->engine.map.path, err);
}

kiln_status kiln_model_load_f32(kiln_model *m, kiln_error *err) {
    if (m->wf32) return KILN_OK;
    const char *path = m->engine.map.path ? m->engine.map.path : "(engine)";
    kiln_status st = convert_f32(m, path, err);
    if (kiln_model_shrank(m, err)) st = err ? err->code : KILN_ERR_IO; /* what it read were zeros */
    if (st != KILN_OK && m->wf32) {
        for (uint32_t i = 0; i < m->plan->n_ranks * m->plan->n_weights; i++) free(m->wf32[i]);
        free(m->wf32);
        m->wf32 = NULL;
    }
    return st;
}

kiln_status kiln_model_open_ex(const char *path, int threads, unsigned flags, kiln_model **out, kiln_error *err) {
    kiln_engine_src src = {.path = path};
    return kiln_model_open_src(&src, threads, flags, out, err);
}

kiln_status kiln_model_open_src(const kiln_engine_src *src, int threads, unsigned flags, kiln_model **out,
                                kiln_error *err) {
    *out = NULL;
    double t0 = kiln_now();
    const char *path = kiln_engine_src_label(src);
    kiln_model *m = calloc(1, sizeof *m);
    if (!m) return kiln_err(err, KILN_ERR_NOMEM, "out of memory");
    kiln_status st = kiln_engine_open_src(src, &m->engine, err);
    if (st != KILN_OK) {
        free(m);
        return st;
    }
    if ((st = load_weights(m, threads, !(flags & KILN_MODEL_NO_F32), path, err)) != KILN_OK ||
        (st = read_meta(m, path, err)) != KILN_OK ||
        (st = load_tokenizer(m, path, err)) != KILN_OK ||
        kiln_model_shrank(m, err)) {
        /* the file shrank under the load: what was read past its end were zeros; say that, not what they broke */
        if (kiln_model_shrank(m, err)) st = err ? err->code : KILN_ERR_IO;
        kiln_model_close(m);
        return st;
    }
    m->load_seconds = kiln_now() - t0;
    *out = m;
    return KILN_OK;
}

void kiln_model_close(kiln_model *m) {
    if (!m) return;
    if (m->wf32 && m->plan)
        for (uint32_t i = 0; i < m->plan->n_ranks * m->plan->n_weights; i++) free(m->wf32[i]);
    free(m->wf32);
    if (m->weights_owned) free((void *)m->weights);
    kiln_plan_free(m->plan);
    free(m->meta_json);
    kiln_tokenizer_free(m->tokenizer);
    kiln_engine_close(&m->engine);
    free(m);
}
