/*
 * cmd_inspect.c — `kiln inspect model.kiln [--json]`: what an engine holds.
 *
 * Nothing is shown before the whole engine is verified: the loader checks
 * the file (checksums, section table), the plan against the weights section
 * and the tokenizer blob; kiln_inspect_verify then cross-checks what the
 * loader does not: the kernels section (parsed by format/ksec.c, which
 * builds without CUDA), the meta JSON against the plan (vocab, layers,
 * hidden, heads, head_dim, max context), against the weights section (bytes,
 * count, codec), against the kernels section (targets, KV block size) and
 * against the tokenizer (ids inside the model's vocabulary, bos). Every
 * mismatch is an error naming both values. The fuzz target
 * fuzz/fuzz_engine_load.c runs the same checks on every engine that loads.
 */
#include <getopt.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../format/kiln_ksec_read.h"
#include "../format/kiln_plan.h"
#include "../format/kiln_tuning.h"
#include "../runtime/kiln_rt.h"
#include "../runtime/kiln_tokenizer.h"
#include "cli.h"

#define REBUILD_HINT "the engine's sections disagree: it is corrupted or was edited; rebuild it with `kiln compile`"

static void help(FILE *f) {
    fprintf(f, "usage: %s ", kiln_cli_prog);
    fprintf(f, "inspect ENGINE.kiln [--json]\n\n"
               "Verify an engine file (every section, and that they agree with each other) and show its\n"
               "format version, model, weights (dtypes), plan, GPU targets and kernels, generation\n"
               "settings (bos, eos...), tokenizer, tuning records (`kiln tune`) and sections; for a tensor-parallel engine (compile\n"
               "--tp N) its ranks and each rank's range of the weights. A file that fails a check is an\n"
               "error (exit 1) naming the values that disagree. --json prints one JSON object: the meta\n"
               "section plus 'sections', 'plan', 'kernels', 'tuning' and 'weights_dtype'.\n");
}

/* ---- cross-checks ---- */

/* meta.OBJ.KEY as an integer: *v, or an error naming the key. */
static kiln_status meta_int(const json_t *obj, const char *objname, const char *key, long long *v, kiln_error *err) {
    json_t *x = json_object_get(obj, key);
    if (!json_is_integer(x)) {
        kiln_err(err, KILN_ERR_FORMAT, "meta %s.%s is %s, not an integer", objname, key, x ? "of another type" : "missing");
        return kiln_err_hint(err, REBUILD_HINT);
    }
    *v = (long long)json_integer_value(x);
    return KILN_OK;
}

/* meta.OBJ.KEY must equal `want`, the value the section `what` holds. */
static kiln_status meta_expect(const json_t *obj, const char *objname, const char *key, long long want,
                               const char *what, kiln_error *err) {
    long long v = 0;
    kiln_status st = meta_int(obj, objname, key, &v, err);
    if (st != KILN_OK) return st;
    if (v != want) {
        kiln_err(err, KILN_ERR_FORMAT, "meta %s.%s is %lld but %s is %lld", objname, key, v, what, want);
        return kiln_err_hint(err, REBUILD_HINT);
    }
    return KILN_OK;
}

/* The model object against the plan: shapes, and every attention op's heads. */
static kiln_status check_model(const json_t *model, const kiln_plan *p, kiln_error *err) {
    kiln_status st;
    if (!json_is_object(model)) {
        kiln_err(err, KILN_ERR_FORMAT, "meta has no 'model' object");
        return kiln_err_hint(err, REBUILD_HINT);
    }
    if ((st = meta_expect(model, "model", "vocab_size", p->vocab_size, "the plan's vocabulary", err)) ||
        (st = meta_expect(model, "model", "num_hidden_layers", p->n_layers, "the plan's layer count", err)) ||
        (st = meta_expect(model, "model", "hidden_size", p->hidden_size, "the plan's hidden size", err)) ||
        (st = meta_expect(model, "model", "num_key_value_heads", (long long)p->n_kv_heads * p->n_ranks,
                          "the plan's KV head count (over all ranks)", err)) ||
        (st = meta_expect(model, "model", "head_dim", p->head_dim, "the plan's head_dim", err)))
        return st;
    long long heads = 0, max_pos = 0;
    if ((st = meta_int(model, "model", "num_attention_heads", &heads, err)) ||
        (st = meta_int(model, "model", "max_position_embeddings", &max_pos, err)))
        return st;
    if (max_pos < p->max_context) {
        kiln_err(err, KILN_ERR_FORMAT, "meta model.max_position_embeddings is %lld but the plan's context is %d",
                 max_pos, p->max_context);
        return kiln_err_hint(err, REBUILD_HINT);
    }
    for (uint32_t i = 0; i < p->n_ops; i++) {
        const kiln_plan_op *op = &p->ops[i];
        if (op->kind != KILN_OP_ATTENTION && op->kind != KILN_OP_QKV_ROPE && op->kind != KILN_OP_QKV_ROPE_PACKED)
            continue;
        /* a tensor-parallel plan's ops have one rank's heads */
        if ((long long)op->attrs.n_heads * p->n_ranks != heads || op->attrs.n_kv_heads != p->n_kv_heads ||
            op->attrs.head_dim != p->head_dim) {
            kiln_err(err, KILN_ERR_FORMAT, "plan op %u (%s) has %d heads, %d KV heads, head_dim %d but meta model says "
                     "%lld, %d, %d (over %u ranks)", i, kiln_op_name((kiln_op_kind)op->kind), op->attrs.n_heads,
                     op->attrs.n_kv_heads, op->attrs.head_dim, heads, p->n_kv_heads * (int)p->n_ranks, p->head_dim,
                     p->n_ranks);
            return kiln_err_hint(err, REBUILD_HINT);
        }
    }
    return KILN_OK;
}

/* meta.tensor_parallel: present exactly when the plan has several ranks, with its rank count and
 * each rank's byte range of the weights section as the plan's weight table gives them. */
static kiln_status check_tensor_parallel(const json_t *tp, const kiln_plan *p, kiln_error *err) {
    if (!tp) {
        if (p->n_ranks == 1) return KILN_OK;
        kiln_err(err, KILN_ERR_FORMAT, "the plan has %u tensor-parallel ranks but meta has no tensor_parallel",
                 p->n_ranks);
        return kiln_err_hint(err, REBUILD_HINT);
    }
    kiln_status st = meta_expect(tp, "tensor_parallel", "ranks", p->n_ranks, "the plan's rank count", err);
    if (st != KILN_OK) return st;
    const json_t *rw = json_object_get(tp, "rank_weights");
    if (json_array_size(rw) != p->n_ranks) {
        kiln_err(err, KILN_ERR_FORMAT, "meta tensor_parallel.rank_weights has %zu entries for %u ranks",
                 json_array_size(rw), p->n_ranks);
        return kiln_err_hint(err, REBUILD_HINT);
    }
    for (uint32_t r = 0; r < p->n_ranks; r++) {
        uint64_t b, e;
        kiln_plan_rank_range(p, r, &b, &e);
        const json_t *x = json_array_get(rw, r);
        if ((st = meta_expect(x, "tensor_parallel.rank_weights[]", "offset", (long long)b,
                              "where the plan puts that rank's first weight", err)) ||
            (st = meta_expect(x, "tensor_parallel.rank_weights[]", "bytes", (long long)(e - b),
                              "the span of that rank's weights in the plan", err)))
            return st;
    }
    return KILN_OK;
}

/* generation: max_context equals the plan's. */
static kiln_status check_generation(const json_t *gen, const kiln_plan *p, kiln_error *err) {
    if (!gen || json_is_null(gen)) return KILN_OK;
    if (!json_is_object(gen)) {
        kiln_err(err, KILN_ERR_FORMAT, "meta generation is not an object");
        return kiln_err_hint(err, REBUILD_HINT);
    }
    kiln_status st;
    if (json_object_get(gen, "max_context") &&
        (st = meta_expect(gen, "generation", "max_context", p->max_context, "the plan's context", err)) != KILN_OK)
        return st;
    /* bos and eos ids were checked by the loader (runtime/model.c read_ids) */
    return KILN_OK;
}

/* weights: bytes, count and codec as the weights section and plan hold them. */
static kiln_status check_weights(const json_t *w, const kiln_model *m, kiln_error *err) {
    if (!json_is_object(w)) {
        kiln_err(err, KILN_ERR_FORMAT, "meta has no 'weights' object");
        return kiln_err_hint(err, REBUILD_HINT);
    }
    kiln_status st;
    if ((st = meta_expect(w, "weights", "bytes", (long long)m->weights_size, "the weights section's size", err)) ||
        (st = meta_expect(w, "weights", "count", m->plan->n_weights, "the plan's weight count", err)))
        return st;
    const kiln_engine_section *s = kiln_engine_find(&m->engine, KILN_SECTION_WEIGHTS);
    const char *codec = json_string_value(json_object_get(w, "codec"));
    if (s && codec && strcmp(codec, kiln_codec_name(s->codec)) != 0) {
        kiln_err(err, KILN_ERR_FORMAT, "meta weights.codec is '%.40s' but the weights section is stored '%s'", codec,
                 kiln_codec_name(s->codec));
        return kiln_err_hint(err, REBUILD_HINT);
    }
    /* a dtype other than "checkpoint" is the matrices' dtype */
    const char *dt = json_string_value(json_object_get(w, "dtype"));
    for (uint32_t i = 0; dt && strcmp(dt, "checkpoint") != 0 && i < m->plan->n_weights; i++) {
        const kiln_plan_weight *pw = &m->plan->weights[i];
        if (pw->ndim >= 2 && strcmp(kiln_dtype_name((kiln_dtype)pw->dtype), dt) != 0) {
            kiln_err(err, KILN_ERR_FORMAT, "meta weights.dtype is '%.40s' but weight '%s' is %s", dt, pw->name,
                     kiln_dtype_name((kiln_dtype)pw->dtype));
            return kiln_err_hint(err, REBUILD_HINT);
        }
    }
    return KILN_OK;
}

/* The tokenizer: there iff meta says so, its blob size, its ids inside the model's vocabulary. */
static kiln_status check_tokenizer(const json_t *meta, const kiln_model *m, kiln_error *err) {
    const json_t *t = json_object_get(meta, "tokenizer");
    const kiln_engine_section *s = kiln_engine_find(&m->engine, KILN_SECTION_TOKENIZER);
    bool said = t && !json_is_null(t);
    if (said != (s != NULL)) {
        kiln_err(err, KILN_ERR_FORMAT, "meta tokenizer is %s but the engine has %s tokenizer section",
                 said ? "set" : "null", s ? "a" : "no");
        return kiln_err_hint(err, REBUILD_HINT);
    }
    if (!s) return KILN_OK;
    kiln_status st = meta_expect(t, "tokenizer", "bytes", (long long)s->raw_size, "the tokenizer section's size", err);
    if (st != KILN_OK) return st;
    uint32_t tv = kiln_tokenizer_vocab_size(m->tokenizer);
    if (tv > (uint32_t)m->plan->vocab_size) {
        kiln_err(err, KILN_ERR_FORMAT, "the tokenizer's ids go up to %u but the model's vocabulary is %d", tv - 1,
                 m->plan->vocab_size);
        return kiln_err_hint(err, "compile with the tokenizer that belongs to this checkpoint");
    }
    long long b = -1;
    json_t *gb = json_object_get(json_object_get(meta, "generation"), "bos_token_id");
    if (json_is_integer(gb)) b = (long long)json_integer_value(gb);
    int32_t tb = kiln_tokenizer_bos(m->tokenizer);
    if (b >= 0 && tb >= 0 && b != tb) {
        kiln_err(err, KILN_ERR_FORMAT, "meta generation.bos_token_id is %lld but the tokenizer's bos is %d", b, tb);
        return kiln_err_hint(err, REBUILD_HINT);
    }
    return KILN_OK;
}

/* Is target "sm_NN" / "compute_NN" in the kernels section? */
static bool ksec_has_target(const kiln_ksec *k, const char *target) {
    int sm;
    bool ptx = strncmp(target, "compute_", 8) == 0;
    if (sscanf(target + (ptx ? 8 : 3), "%d", &sm) != 1 || (!ptx && strncmp(target, "sm_", 3) != 0)) return false;
    for (int i = 0; i < k->n_images; i++)
        if (k->images[i].sm == sm && k->images[i].is_ptx == ptx) return true;
    return false;
}

/* meta.targets, meta.build.kv_block_size against the parsed kernels section. */
static kiln_status check_targets(const json_t *meta, const kiln_ksec *k, kiln_error *err) {
    const json_t *tg = json_object_get(meta, "targets"), *t;
    size_t i;
    if (tg && !json_is_array(tg)) {
        kiln_err(err, KILN_ERR_FORMAT, "meta targets is not an array");
        return kiln_err_hint(err, REBUILD_HINT);
    }
    json_array_foreach(tg, i, t) {
        const char *name = json_string_value(t);
        if (!name || !ksec_has_target(k, name)) {
            kiln_err(err, KILN_ERR_FORMAT, "meta targets[%zu] '%.40s' has no image in the kernels section (%d images)",
                     i, name ? name : "(not a string)", k->n_images);
            return kiln_err_hint(err, REBUILD_HINT);
        }
    }
    for (int j = 0; j < k->n_images; j++) {
        char name[32];
        snprintf(name, sizeof name, "%s_%d", k->images[j].is_ptx ? "compute" : "sm", k->images[j].sm);
        bool listed = false;
        json_array_foreach(tg, i, t) listed |= json_is_string(t) && strcmp(json_string_value(t), name) == 0;
        if (!listed) {
            kiln_err(err, KILN_ERR_FORMAT, "the kernels section has an image for %s (module '%s') that meta targets "
                     "does not list", name, k->modules[k->images[j].module].name);
            return kiln_err_hint(err, REBUILD_HINT);
        }
    }
    json_t *bs = json_object_get(json_object_get(meta, "build"), "kv_block_size");
    if (bs && (!json_is_integer(bs) || json_integer_value(bs) != k->block_size)) {
        kiln_err(err, KILN_ERR_FORMAT, "meta build.kv_block_size is %lld but the kernels section is built for %d",
                 json_is_integer(bs) ? (long long)json_integer_value(bs) : -1LL, k->block_size);
        return kiln_err_hint(err, REBUILD_HINT);
    }
    return KILN_OK;
}

/* The kernels section: parsed, and as meta describes it. No section = no targets. */
static kiln_status check_kernels(const json_t *meta, const kiln_model *m, kiln_inspect_kernels *out, kiln_error *err) {
    const kiln_engine_section *s = kiln_engine_find(&m->engine, KILN_SECTION_KERNELS);
    memset(out, 0, sizeof *out);
    if (!s) {
        size_t n = json_array_size(json_object_get(meta, "targets"));
        if (n == 0) return KILN_OK;
        kiln_err(err, KILN_ERR_FORMAT, "meta lists %zu GPU targets but the engine has no kernels section", n);
        return kiln_err_hint(err, REBUILD_HINT);
    }
    const uint8_t *d;
    size_t size;
    bool owned;
    kiln_status st = kiln_engine_section_bytes(&m->engine, s, 1, &d, &size, &owned, err);
    if (st != KILN_OK) return st;
    kiln_ksec k;
    if ((st = kiln_ksec_parse(d, size, &k, err)) == KILN_OK) {
        st = check_targets(meta, &k, err);
        *out = (kiln_inspect_kernels){.present = true, .n_modules = k.n_modules, .n_sources = k.n_sources,
                                      .n_images = k.n_images,
                                      .block_size = k.block_size, .elem = k.elem};
        kiln_ksec_free(&k);
    }
    if (owned) free((void *)d);
    return st;
}

/* The tuning section (`kiln tune`), when there is one, parses (runtime/tuning.c's checks). */
static kiln_status check_tuning(const kiln_model *m, kiln_error *err) {
    kiln_tuning t;
    bool present;
    kiln_status st = kiln_tuning_load(&m->engine, &t, &present, err);
    kiln_tuning_free(&t);
    return st;
}

/* The tuning records as JSON: [{sm, device, cublaslt_version, driver_version, thresholds, seconds,
 * shapes: [{m, n, k, in, out, accumulate, us, heuristic_us, candidates, pick}]}] ([] without a
 * section). Verified already by check_tuning. */
static json_t *tuning_json(const kiln_model *m) {
    kiln_tuning t;
    bool present;
    kiln_error ig = {0};
    json_t *a = json_array();
    if (kiln_tuning_load(&m->engine, &t, &present, &ig) != KILN_OK) return a;
    for (uint32_t i = 0; i < t.n_records; i++) {
        const kiln_tuning_record *r = &t.records[i];
        json_t *shapes = json_array();
        for (uint32_t j = 0; j < r->n_gemms; j++) {
            const kiln_tuning_gemm *g = &r->gemms[j];
            json_array_append_new(
                shapes, json_pack("{s:i, s:i, s:i, s:s, s:s, s:b, s:b, s:f, s:o, s:i, s:i}", "m", (int)g->m, "n",
                                  (int)g->n, "k", (int)g->k, "in", kiln_tuning_in_type(g->flags), "out",
                                  kiln_tuning_out_type(g->flags), "accumulate",
                                  (g->flags & KILN_TUNING_ACCUMULATE) != 0, "fast_accum",
                                  (g->flags & KILN_TUNING_FP8_FAST) != 0, "us", (double)g->us, "heuristic_us",
                                  g->heuristic_us > 0 ? json_real(g->heuristic_us) : json_null(), "candidates",
                                  (int)g->candidates, "pick", (int)g->pick));
        }
        char sm[16];
        snprintf(sm, sizeof sm, "sm_%u", r->sm);
        json_array_append_new(a, json_pack("{s:s, s:s, s:I, s:i, s:{s:i, s:i, s:i, s:f, s:i}, s:f, s:o}", "sm", sm,
                                           "device", r->device, "cublaslt_version", (json_int_t)r->lt_version,
                                           "driver_version", r->driver_version, "thresholds", "gemv_max_m",
                                           (int)r->gemv_max_m, "qgemv_max_m", (int)r->qgemv_max_m, "rope_split_max_t",
                                           (int)r->rope_split_max_t, "attn_waves", (double)r->attn_waves,
                                           "decode_tc_min", (int)r->decode_tc_min, "seconds",
                                           (double)r->seconds, "shapes", shapes));
    }
    kiln_tuning_free(&t);
    return a;
}

/* "tuning: none" or a line per record. */
static void print_tuning(const json_t *recs) {
    if (json_array_size(recs) == 0) {
        printf("tuning: none (cuBLASLt's heuristic at load; `kiln tune` records this GPU's choices)\n");
        return;
    }
    size_t i;
    const json_t *r;
    json_array_foreach(recs, i, r) {
        const json_t *th = json_object_get(r, "thresholds"), *sh = json_object_get(r, "shapes");
        printf("tuning: %s \"%s\", cuBLASLt %lld, driver %lld: %zu GEMM shapes; gemv_max_m %lld, qgemv_max_m %lld, "
               "rope_split_max_t %lld, attn_waves %g, decode_tc_min %lld (measured in %.1f s)\n",
               json_string_value(json_object_get(r, "sm")), json_string_value(json_object_get(r, "device")),
               (long long)json_integer_value(json_object_get(r, "cublaslt_version")),
               (long long)json_integer_value(json_object_get(r, "driver_version")), json_array_size(sh),
               (long long)json_integer_value(json_object_get(th, "gemv_max_m")),
               (long long)json_integer_value(json_object_get(th, "qgemv_max_m")),
               (long long)json_integer_value(json_object_get(th, "rope_split_max_t")),
               json_real_value(json_object_get(th, "attn_waves")),
               (long long)json_integer_value(json_object_get(th, "decode_tc_min")),
               json_real_value(json_object_get(r, "seconds")));
    }
}

kiln_status kiln_inspect_verify(const kiln_model *m, kiln_inspect_kernels *kernels, kiln_error *err) {
    json_error_t je;
    json_t *meta = json_loads(m->meta_json, 0, &je);
    kiln_status st = KILN_OK;
    if (!json_is_object(meta)) {
        kiln_err(err, KILN_ERR_FORMAT, "meta section is not a JSON object (%s)", je.text);
        st = kiln_err_hint(err, REBUILD_HINT);
        goto out_free_meta;
    }
    json_t *fv = json_object_get(meta, "format_version");
    if ((st = meta_expect(fv, "format_version", "major", m->engine.major, "the file header's", err)) ||
        (st = meta_expect(fv, "format_version", "minor", m->engine.minor, "the file header's", err)) ||
        (st = check_model(json_object_get(meta, "model"), m->plan, err)) ||
        (st = check_generation(json_object_get(meta, "generation"), m->plan, err)) ||
        (st = check_weights(json_object_get(meta, "weights"), m, err)) ||
        (st = check_tensor_parallel(json_object_get(meta, "tensor_parallel"), m->plan, err)) ||
        (st = check_tokenizer(meta, m, err)) || (st = check_tuning(m, err)))
        goto out_free_meta;
    st = check_kernels(meta, m, kernels, err);
out_free_meta:
    json_decref(meta);
    return st;
}

/* ---- output ---- */

static json_t *sections_json(const kiln_engine *e) {
    json_t *a = json_array();
    for (uint32_t i = 0; i < e->n_sections; i++) {
        const kiln_engine_section *s = &e->sections[i];
        json_array_append_new(a, json_pack("{s:s, s:s, s:I, s:I, s:I}", "kind", kiln_section_kind_name(s->kind),
                                           "codec", kiln_codec_name(s->codec), "offset", (json_int_t)s->offset,
                                           "stored_bytes", (json_int_t)s->stored_size, "raw_bytes",
                                           (json_int_t)s->raw_size));
    }
    return a;
}

/* Bits per weight element over the plan's weights (one rank's): stored bytes x 8 / elements. */
static double bits_per_weight(const kiln_plan *p) {
    double bytes = 0, elems = 0;
    for (uint32_t i = 0; i < p->n_weights; i++) {
        double e = 1;
        for (uint32_t d = 0; d < p->weights[i].ndim; d++) e *= (double)p->weights[i].shape[d];
        elems += e;
        bytes += (double)p->weights[i].nbytes;
    }
    return elems > 0 ? bytes * 8 / elems : 0;
}

static json_t *plan_json(const kiln_plan *p) {
    json_t *ops = json_object();
    for (uint32_t i = 0; i < p->n_ops; i++) {
        const char *name = kiln_op_name((kiln_op_kind)p->ops[i].kind);
        json_t *n = json_object_get(ops, name);
        json_object_set_new(ops, name, json_integer(n ? json_integer_value(n) + 1 : 1));
    }
    json_t *flags = json_object(); /* ops carrying each lowering flag (the passes' decisions, --dump-ir's +names) */
    for (uint32_t bit = 1; bit & KILN_FLAG_ALL_; bit <<= 1) {
        int n = 0;
        for (uint32_t i = 0; i < p->n_ops; i++) n += (p->ops[i].attrs.flags & bit) != 0;
        if (n) json_object_set_new(flags, kiln_flag_name(bit), json_integer(n));
    }
    json_t *mats = json_array(); /* every matrix's format: {name, dtype} in the plan's order */
    for (uint32_t i = 0; i < p->n_weights; i++)
        if (p->weights[i].ndim >= 2)
            json_array_append_new(mats, json_pack("{s:s, s:s}", "name", p->weights[i].name, "dtype",
                                                  kiln_dtype_name((kiln_dtype)p->weights[i].dtype)));
    return json_pack("{s:i, s:i, s:i, s:i, s:o, s:o, s:i, s:f, s:o}", "values", (int)p->n_values, "ops_total",
                     (int)p->n_ops, "weights", (int)p->n_weights, "buffer_slots", (int)p->n_slots, "ops", ops, "flags",
                     flags, "ranks", (int)p->n_ranks, "bits_per_weight", bits_per_weight(p), "matrices", mats);
}

/* The dtype names in a bit set ("bf16", "f16+bf16"), appended to out. */
static void dtype_names(unsigned set, char *out, size_t cap) {
    bool first = true;
    for (int d = 0; d < KILN_DTYPE_COUNT_; d++) {
        if (!(set >> d & 1)) continue;
        size_t n = strlen(out);
        snprintf(out + n, cap - n, "%s%s", first ? "" : "+", kiln_dtype_name((kiln_dtype)d));
        first = false;
    }
}

/* The weights' real dtypes from the plan: "bf16 (matrices), f32 (norms)" (and "i32 (input orders)": act-order
 * permutations), or one name when all agree. */
static void weights_dtype(const kiln_plan *p, char *out, size_t cap) {
    unsigned mat = 0, vec = 0; /* a bit per dtype */
    for (uint32_t i = 0; i < p->n_weights; i++) {
        unsigned bit = p->weights[i].dtype < 32 ? 1u << p->weights[i].dtype : 0;
        if (p->weights[i].ndim >= 2) mat |= bit;
        else vec |= bit;
    }
    out[0] = 0;
    if (!mat || !vec || mat == vec) {
        dtype_names(mat | vec, out, cap);
        if (!out[0]) snprintf(out, cap, "none");
        return;
    }
    dtype_names(mat, out, cap);
    snprintf(out + strlen(out), cap - strlen(out), " (matrices), ");
    const unsigned idx = vec & 1u << KILN_DTYPE_I32; /* a permute op's indices (act-order GPTQ) */
    dtype_names(vec & ~idx, out, cap);
    snprintf(out + strlen(out), cap - strlen(out), " (norms)%s", idx ? ", i32 (input orders)" : "");
}

/* "1 (<s>)" for an id, with its token when there is a tokenizer. */
static void print_id(const kiln_model *m, long long id) {
    size_t len = 0;
    const char *t = m->tokenizer && id >= 0 && id <= INT32_MAX ? kiln_tokenizer_token(m->tokenizer, (int32_t)id, &len) : NULL;
    if (t && len < 64) printf("%lld (%.*s)", id, (int)len, t);
    else printf("%lld", id);
}

/* The meta's generation object in a fixed order: "generation: bos 1 (<s>);
 * eos 2 (</s>); max_context 256; sampling greedy" (sampling from
 * generation_config.json: "greedy" or "temperature T, top_k K, top_p P"),
 * then the pad id and the file's keys kiln does not apply, when there are any. */
static void print_generation(const kiln_model *m, const json_t *gen) {
    printf("generation:");
    if (!json_is_object(gen) || json_object_size(gen) == 0) {
        printf(" none\n");
        return;
    }
    json_t *bos = json_object_get(gen, "bos_token_id"), *eos = json_object_get(gen, "eos_token_ids"), *e;
    printf(" bos ");
    if (json_is_integer(bos) && json_integer_value(bos) >= 0) print_id(m, (long long)json_integer_value(bos));
    else printf("none");
    printf("; eos");
    size_t i;
    json_array_foreach(eos, i, e) {
        printf(i ? ", " : " ");
        if (json_is_integer(e)) print_id(m, (long long)json_integer_value(e));
    }
    if (json_array_size(eos) == 0) printf(" none");
    printf("; max_context %lld", (long long)json_integer_value(json_object_get(gen, "max_context")));
    if (json_is_true(json_object_get(gen, "do_sample")))
        printf("; sampling temperature %g, top_k %lld, top_p %g",
               json_real_value(json_object_get(gen, "temperature")),
               (long long)json_integer_value(json_object_get(gen, "top_k")),
               json_real_value(json_object_get(gen, "top_p")));
    else if (json_object_get(gen, "do_sample"))
        printf("; sampling greedy");
    json_t *pad = json_object_get(gen, "pad_token_id");
    if (json_is_integer(pad) && json_integer_value(pad) >= 0) {
        printf("; pad ");
        print_id(m, (long long)json_integer_value(pad));
    }
    json_t *na = json_object_get(gen, "not_applied");
    json_array_foreach(na, i, e) printf(i ? ", %s" : "; not applied from generation_config.json: %s",
                                        json_is_string(e) ? json_string_value(e) : "?");
    printf("\n");
}

static void print_targets(const json_t *meta, const kiln_inspect_kernels *k) {
    const json_t *tg = json_object_get(meta, "targets"), *t;
    size_t i;
    printf("targets:");
    json_array_foreach(tg, i, t) printf("%s%s", i ? ", " : " ", json_string_value(t));
    const char *why = json_string_value(json_object_get(json_object_get(meta, "build"), "no_gpu_kernels"));
    if (json_array_size(tg) == 0) printf(" none (CPU only%s%s)", why ? ": " : "", why ? why : "");
    if (k->present)
        printf("\nkernels: %d modules (%d distinct source%s), %d images, element %s, KV block size %d tokens\n",
               k->n_modules, k->n_sources, k->n_sources == 1 ? "" : "s", k->n_images,
               k->elem == KILN_KSEC_ELEM_F32 ? "f32" : "bf16", k->block_size);
    else
        printf("\nkernels: none (so no GPU KV block size)\n");
}

/* Formats layer by layer, as the plan stores them: ["layer 0: qkv_proj q8, o_proj q4g64, ...", ...], one
 * string per layer for the weights named by names[0..n) in that order (names outside model.layers.N. get
 * a line of their own). */
static json_t *layer_lines(const kiln_model *m, const char *const *names, size_t n_names) {
    json_t *lines = json_array();
    char line[1024] = "";
    int layer = -1;
    for (size_t i = 0; i < n_names; i++) {
        const char *name = names[i];
        if (!name) continue;
        const char *dtype = "missing"; /* the plan's word, not the meta's */
        for (uint32_t w = 0; w < m->plan->n_weights; w++)
            if (strcmp(m->plan->weights[w].name, name) == 0) dtype = kiln_dtype_name((kiln_dtype)m->plan->weights[w].dtype);
        int l = -1, off = 0;
        if (sscanf(name, "model.layers.%d.%n", &l, &off) != 1 || off == 0) l = -2 - (int)i;
        char shortname[128];
        snprintf(shortname, sizeof shortname, "%s", l >= 0 ? name + off : name);
        const char *cut[] = {"self_attn.", "mlp.", "block_sparse_moe."};
        for (size_t c = 0; c < sizeof cut / sizeof *cut; c++)
            if (strncmp(shortname, cut[c], strlen(cut[c])) == 0) memmove(shortname, shortname + strlen(cut[c]),
                                                                         strlen(shortname + strlen(cut[c])) + 1);
        size_t n = strlen(shortname);
        const char *suffix[] = {".weight", ".qweight", ".weight_packed"}; /* a read checkpoint's tensor names */
        for (size_t c = 0; c < sizeof suffix / sizeof *suffix; c++) {
            const size_t k = strlen(suffix[c]);
            if (n > k && strcmp(shortname + n - k, suffix[c]) == 0) shortname[n -= k] = 0;
        }
        if (l != layer && *line) json_array_append_new(lines, json_string(line)), *line = 0;
        n = strlen(line);
        if (!*line && l >= 0) snprintf(line, sizeof line, "layer %d: %s %s", l, shortname, dtype);
        else snprintf(line + n, sizeof line - n, "%s%s %s", *line ? ", " : "", shortname, dtype);
        layer = l;
    }
    if (*line) json_array_append_new(lines, json_string(line));
    return lines;
}

/* --quant auto's matrices, in the order of meta build.quant.auto.matrices, a line a layer; NULL when the
 * engine was not compiled with auto. */
static json_t *auto_layers(const kiln_model *m, const json_t *meta) {
    const json_t *mats = json_object_get(json_object_get(json_object_get(json_object_get(meta, "build"), "quant"),
                                                         "auto"), "matrices");
    if (!json_is_array(mats)) return NULL;
    const size_t n = json_array_size(mats);
    const char **names = calloc(n ? n : 1, sizeof *names);
    if (!names) return NULL;
    for (size_t i = 0; i < n; i++) names[i] = json_string_value(json_object_get(json_array_get(mats, i), "name"));
    json_t *lines = layer_lines(m, names, n);
    free(names);
    return lines;
}

/* The plan's matrices (weights of two or more dimensions), a line a layer, when they are not all of one
 * dtype (a read checkpoint's mix: a GPTQ dynamic map, projections left unquantized); NULL otherwise. */
static json_t *mixed_layers(const kiln_model *m) {
    const kiln_plan *p = m->plan;
    const char **names = calloc(p->n_weights ? p->n_weights : 1, sizeof *names);
    if (!names) return NULL;
    size_t n = 0;
    unsigned quant = 0, seen = 0;
    for (uint32_t i = 0; i < p->n_weights; i++) {
        const kiln_plan_weight *w = &p->weights[i];
        if (w->ndim < 2 || strstr(w->name, "embed_tokens") || strstr(w->name, "lm_head")) continue;
        /* in layer order (the plan lists packed matrices after the others), stable */
        int l = -1, l2;
        sscanf(w->name, "model.layers.%d.", &l);
        size_t at = n++;
        while (at > 0 && sscanf(names[at - 1], "model.layers.%d.", &l2) == 1 && l2 > l) {
            names[at] = names[at - 1];
            at--;
        }
        names[at] = w->name;
        seen |= 1u << (w->dtype % 32);
        quant |= kiln_dtype_is_quant((int)w->dtype);
    }
    json_t *lines = quant && (seen & (seen - 1)) ? layer_lines(m, names, n) : NULL;
    free(names);
    return lines;
}

static void print_text(const char *path, const kiln_model *m, json_t *meta, const kiln_inspect_kernels *k,
                       const char *wdtype) {
    json_t *model = json_object_get(meta, "model"), *w = json_object_get(meta, "weights");
    const kiln_plan *p = m->plan;
    printf("%s: kiln engine, format %u.%u, %zu bytes, built by kiln %s\n", path, m->engine.major, m->engine.minor,
           m->engine.size, json_string_value(json_object_get(meta, "kiln_version")));
    printf("model: %s, %d layers, hidden %d, heads %lld/%d (head_dim %d), ffn %lld, vocab %d, context %d",
           json_string_value(json_object_get(model, "architecture")), p->n_layers, p->hidden_size,
           (long long)json_integer_value(json_object_get(model, "num_attention_heads")),
           p->n_kv_heads * (int)p->n_ranks, p->head_dim,
           (long long)json_integer_value(json_object_get(model, "intermediate_size")), p->vocab_size, p->max_context);
    long long win = (long long)json_integer_value(json_object_get(model, "sliding_window"));
    json_t *wl = json_object_get(model, "sliding_window_layers");
    if (win && json_is_array(wl))
        printf(", sliding window %lld on %zu of %d layers", win, json_array_size(wl), p->n_layers);
    else if (win)
        printf(", sliding window %lld", win);
    json_t *ne = json_object_get(model, "num_local_experts");
    if (ne) {
        json_t *mi = json_object_get(model, "moe_intermediate_size"), *dl = json_object_get(model, "dense_mlp_layers");
        printf(", %lld experts (top %lld%s", (long long)json_integer_value(ne),
               (long long)json_integer_value(json_object_get(model, "num_experts_per_tok")),
               json_is_false(json_object_get(model, "norm_topk_prob")) ? ", weights not renormalised" : "");
        if (mi) printf(", ffn %lld each", (long long)json_integer_value(mi));
        if (json_is_array(dl)) printf(", dense MLP on %zu of %d layers", json_array_size(dl), p->n_layers);
        printf(")");
    }
    printf("\nweights: %u tensors%s, %.2f MB (%.2f bits per weight), dtype %s, codec %s\n", p->n_weights,
           p->n_ranks > 1 ? " per rank" : "", (double)m->weights_size / 1e6, bits_per_weight(p), wdtype,
           json_string_value(json_object_get(w, "codec")));
    json_t *q = json_object_get(json_object_get(meta, "build"), "quant");
    if (q)
        printf("quantization: %s (projections), %s (LM head), %s (embedding), %lld matrices, %s\n",
               json_string_value(json_object_get(q, "weights")), json_string_value(json_object_get(q, "lm_head")),
               json_object_get(q, "embedding") ? json_string_value(json_object_get(q, "embedding")) : "keep",
               (long long)json_integer_value(json_object_get(q, "matrices")),
               json_string_value(json_object_get(q, "method")));
    json_t *kv = json_object_get(json_object_get(meta, "build"), "kv_cache");
    if (kv) { /* --kv-dtype: the cache's codes and where their scales came from */
        json_t *cal = json_object_get(kv, "calibration");
        printf("kv cache: %s codes, scales %s", json_string_value(json_object_get(kv, "dtype")),
               json_string_value(json_object_get(kv, "scales")));
        if (cal)
            printf(" (%s, %lld tokens; largest |k| %.4g, |v| %.4g)",
                   json_string_value(json_object_get(json_object_get(cal, "source"), "source")),
                   (long long)json_integer_value(json_object_get(cal, "tokens")),
                   json_real_value(json_object_get(cal, "k_max")), json_real_value(json_object_get(cal, "v_max")));
        printf("\n");
    }
    json_t *qa = json_object_get(q, "auto"), *lines = auto_layers(m, meta);
    if (qa && lines) { /* --quant auto: the budget, the measured damage and each layer's formats */
        json_t *b = json_object_get(qa, "budget"), *tb = json_object_get(b, "target_bits");
        char budget[64];
        json_t *pi = json_object_get(b, "max_ppl_increase");
        if (tb) snprintf(budget, sizeof budget, "%g bits per weight", json_real_value(tb));
        else if (pi) snprintf(budget, sizeof budget, "perplexity +%g%% (bisected: %.3f MB)", json_real_value(pi),
                              (double)json_integer_value(json_object_get(b, "max_weight_bytes")) / 1e6);
        else snprintf(budget, sizeof budget, "%.3f MB", (double)json_integer_value(json_object_get(b, "max_weight_bytes")) / 1e6);
        printf("quant auto: budget %s; calibration (%s, %lld tokens) KL %.6f predicted, %.6f measured, NLL %+.6f "
               "nats per token\n", budget,
               json_string_value(json_object_get(json_object_get(qa, "calibration"), "source")),
               (long long)json_integer_value(json_object_get(json_object_get(qa, "calibration"), "tokens")),
               json_real_value(json_object_get(qa, "predicted_kl")), json_real_value(json_object_get(qa, "measured_kl")),
               json_real_value(json_object_get(qa, "measured_nll_change")));
        for (size_t i = 0; i < json_array_size(lines); i++) printf("  %s\n", json_string_value(json_array_get(lines, i)));
    }
    json_decref(lines);
    if (!qa && (lines = mixed_layers(m))) { /* a read checkpoint's mix of formats, each layer's */
        printf("formats by layer:\n");
        for (size_t i = 0; i < json_array_size(lines); i++) printf("  %s\n", json_string_value(json_array_get(lines, i)));
        json_decref(lines);
    }
    if (p->n_ranks > 1) { /* tensor parallelism: what each rank maps and runs */
        printf("tensor parallel: %u ranks, each with %d heads / %d KV heads; weights per rank (%u tensors each):",
               p->n_ranks, (int)(json_integer_value(json_object_get(model, "num_attention_heads")) / p->n_ranks),
               p->n_kv_heads, p->n_weights);
        for (uint32_t r = 0; r < p->n_ranks; r++) {
            uint64_t b, e;
            kiln_plan_rank_range(p, r, &b, &e);
            printf("%s rank %u [%llu, %llu) %.2f MB", r ? ";" : "", r, (unsigned long long)b, (unsigned long long)e,
                   (double)(e - b) / 1e6);
        }
        printf("\n");
    }
    print_targets(meta, k);
    print_tuning(json_object_get(meta, "tuning"));
    print_generation(m, json_object_get(meta, "generation"));
    printf("plan: %u ops, %u values, %u buffer slots:", p->n_ops, p->n_values, p->n_slots);
    const char *key;
    json_t *v;
    json_object_foreach(json_object_get(json_object_get(meta, "plan"), "ops"), key, v) {
        printf(" %s×%lld", key, (long long)json_integer_value(v));
    }
    json_t *flags = json_object_get(json_object_get(meta, "plan"), "flags");
    if (json_object_size(flags)) {
        printf("\nlowering:");
        json_object_foreach(flags, key, v) printf(" +%s×%lld", key, (long long)json_integer_value(v));
    }
    if (m->tokenizer)
        printf("\ntokenizer: %u ids\nsections:\n", kiln_tokenizer_vocab_size(m->tokenizer));
    else
        printf("\ntokenizer: none\nsections:\n");
    for (uint32_t i = 0; i < m->engine.n_sections; i++) {
        const kiln_engine_section *s = &m->engine.sections[i];
        printf("  %-10s offset %-10llu %12llu bytes stored, %12llu raw, %s\n", kiln_section_kind_name(s->kind),
               (unsigned long long)s->offset, (unsigned long long)s->stored_size, (unsigned long long)s->raw_size,
               kiln_codec_name(s->codec));
    }
}

static void add_json_extras(json_t *meta, const char *path, const kiln_model *m, const kiln_inspect_kernels *k,
                            const char *wdtype) {
    json_object_set_new(meta, "sections", sections_json(&m->engine));
    json_object_set_new(meta, "plan", plan_json(m->plan));
    json_object_set_new(meta, "file", json_string(path));
    json_object_set_new(meta, "file_bytes", json_integer((json_int_t)m->engine.size));
    json_object_set_new(meta, "weights_dtype", json_string(wdtype));
    json_object_set_new(meta, "tuning", tuning_json(m));
    json_t *lines = auto_layers(m, meta);
    if (lines) json_object_set_new(meta, "quant_layers", lines); /* --quant auto: each layer's formats */
    json_object_set_new(meta, "kernels", k->present ? json_pack("{s:i, s:i, s:i, s:s, s:i}", "modules", k->n_modules,
                                                                "sources", k->n_sources, "images", k->n_images, "element",
                                                                k->elem == KILN_KSEC_ELEM_F32 ? "f32" : "bf16",
                                                                "kv_block_size", k->block_size)
                                                    : json_null());
}

int kiln_cmd_inspect(int argc, char **argv) { return kiln_cmd_inspect_builtin(argc, argv, NULL); }

int kiln_cmd_inspect_builtin(int argc, char **argv, const kiln_engine_src *builtin) {
    static const struct option longopts[] = {
        {"json", no_argument, 0, 'j'}, {"help", no_argument, 0, 'h'}, {0, 0, 0, 0}};
    bool json = false;
    int c;
    optind = 1;
    opterr = 0;
    while ((c = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
        if (c == 'j')
            json = true;
        else if (c == 'h') {
            help(stdout);
            return KILN_EXIT_OK;
        } else
            return kiln_cli_usage_error("inspect", "unknown option '%s'", argv[optind - 1]);
    }
    if (optind != argc - !builtin)
        return kiln_cli_usage_error("inspect", builtin ? "takes no engine file: the engine is built in"
                                                       : "expected one engine file");
    const char *path = builtin ? kiln_engine_src_label(builtin) : argv[optind];
    kiln_engine_src src = builtin ? *builtin : (kiln_engine_src){.path = path};
    kiln_error err = {0};
    kiln_model *m;
    if (kiln_model_open_src(&src, 1, KILN_MODEL_NO_F32, &m, &err) != KILN_OK) return kiln_cli_fail("inspect", &err, json);
    kiln_inspect_kernels k;
    if (kiln_inspect_verify(m, &k, &err) != KILN_OK) {
        kiln_err_prefix(&err, "%s: ", path);
        kiln_model_close(m);
        return kiln_cli_fail("inspect", &err, json);
    }
    char wdtype[96];
    weights_dtype(m->plan, wdtype, sizeof wdtype);
    json_t *meta = json_loads(m->meta_json, 0, NULL); /* verified: an object */
    add_json_extras(meta, path, m, &k, wdtype);
    if (json) {
        char *s = json_dumps(meta, JSON_SORT_KEYS | JSON_INDENT(2));
        printf("%s\n", s);
        free(s);
    } else {
        print_text(path, m, meta, &k, wdtype);
    }
    json_decref(meta);
    kiln_model_close(m);
    return KILN_EXIT_OK;
}
