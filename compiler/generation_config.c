/*
 * generation_config.c — HuggingFace generation_config.json → the bos/eos/pad
 * ids and sampling defaults an engine carries (kiln_compiler.h).
 *
 * Read as transformers 5's generate() reads it (generation/utils.py,
 * generation/configuration_utils.py):
 *   - the file, when present, replaces what config.json says about
 *     generation: bos_token_id, eos_token_id (an int or a list) and
 *     pad_token_id come from it alone;
 *   - do_sample false (the default) means greedy decoding whatever
 *     temperature, top_k and top_p say; do_sample true uses them, with
 *     transformers' defaults temperature 1.0, top_k 50, top_p 1.0 for the
 *     ones not given; top_k 0 is "off".
 * The file is hostile input: each field is checked for its JSON type and
 * range and ids for the vocabulary; a value generate() itself would refuse
 * (do_sample with temperature 0, a negative top_k) is refused here, naming
 * the file, field and value. Keys kiln does not apply (repetition_penalty,
 * max_new_tokens...) are listed, not silently dropped: the engine's meta
 * section records them as `generation.not_applied`.
 */
#include "kiln_compiler.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define GC_MAX_FILE (1u << 20) /* generation_config.json files are a few hundred bytes */

/* transformers' GenerationConfig defaults when do_sample is true (_get_default_generation_params) */
#define GC_HF_TEMPERATURE 1.0
#define GC_HF_TOP_K 50
#define GC_HF_TOP_P 1.0

typedef struct gc_ctx {
    const char *path;
    int64_t vocab;
    kiln_error *err;
} gc_ctx;

/* Absent or null: not given (transformers treats both as unset). */
static json_t *gc_get(json_t *root, const char *key) {
    json_t *v = json_object_get(root, key);
    return json_is_null(v) ? NULL : v;
}

static kiln_status gc_type(gc_ctx *c, const char *field, const json_t *v, const char *want) {
    char shown[64];
    char *s = json_dumps(v, JSON_ENCODE_ANY | JSON_COMPACT);
    snprintf(shown, sizeof shown, "%s", s ? s : "?");
    free(s);
    return kiln_err(c->err, KILN_ERR_PARSE, "%s: field \"%s\" is %s; it must be %s", c->path, field, shown, want);
}

/* A token id inside the model's vocabulary. */
static kiln_status gc_id(gc_ctx *c, const json_t *v, const char *field, int64_t *out) {
    if (!json_is_integer(v)) return gc_type(c, field, v, "an integer token id");
    json_int_t id = json_integer_value(v);
    if (id < 0 || id >= c->vocab) {
        kiln_err(c->err, KILN_ERR_PARSE, "%s: field \"%s\" is %lld, outside the model's vocabulary [0, %lld)",
                 c->path, field, (long long)id, (long long)c->vocab);
        return kiln_err_hint(c->err, "config.json's vocab_size is %lld; is this generation_config.json of this model?",
                             (long long)c->vocab);
    }
    *out = (int64_t)id;
    return KILN_OK;
}

static kiln_status gc_eos_id(void *ctx, const json_t *v, const char *field, int64_t *out) {
    return gc_id(ctx, v, field, out);
}

/* bos_token_id, eos_token_id (int or list), pad_token_id. */
static kiln_status gc_ids(gc_ctx *c, json_t *root, kiln_generation_config *g) {
    kiln_status st;
    json_t *v;
    if ((v = gc_get(root, "bos_token_id"))) {
        if ((st = gc_id(c, v, "bos_token_id", &g->bos_token_id))) return st;
        g->has_bos = true;
    }
    if ((v = gc_get(root, "pad_token_id"))) {
        if ((st = gc_id(c, v, "pad_token_id", &g->pad_token_id))) return st;
        g->has_pad = true;
    }
    if (!(v = gc_get(root, "eos_token_id"))) return KILN_OK;
    g->has_eos = true;
    return kiln_json_id_list(v, c->path, "eos_token_id", gc_eos_id, c, g->eos_token_ids, &g->n_eos, c->err);
}

/* A number field in [lo, hi]; *has set when given. */
static kiln_status gc_num(gc_ctx *c, json_t *root, const char *key, double lo, double hi, bool *has, double *out) {
    json_t *v = gc_get(root, key);
    if (!v) return KILN_OK;
    if (!json_is_number(v)) return gc_type(c, key, v, "a number");
    double x = json_number_value(v);
    if (!isfinite(x) || x < lo || x > hi)
        return kiln_err(c->err, KILN_ERR_PARSE, "%s: field \"%s\" is %g; it must be in [%g, %g]", c->path, key, x,
                        lo, hi);
    *has = true;
    *out = x;
    return KILN_OK;
}

/* do_sample, temperature, top_k, top_p. */
static kiln_status gc_sampling(gc_ctx *c, json_t *root, kiln_generation_config *g) {
    kiln_status st;
    json_t *v;
    if ((v = gc_get(root, "do_sample"))) {
        if (!json_is_boolean(v)) return gc_type(c, "do_sample", v, "true or false");
        g->has_do_sample = true;
        g->do_sample = json_is_true(v);
    }
    if ((st = gc_num(c, root, "temperature", 0, 1e6, &g->has_temperature, &g->temperature)) ||
        (st = gc_num(c, root, "top_p", 0, 1, &g->has_top_p, &g->top_p)))
        return st;
    if ((v = gc_get(root, "top_k"))) {
        if (!json_is_integer(v)) return gc_type(c, "top_k", v, "an integer");
        if (json_integer_value(v) < 0)
            return kiln_err(c->err, KILN_ERR_PARSE, "%s: field \"top_k\" is %lld; it must be >= 0 (0 = off)", c->path,
                            (long long)json_integer_value(v));
        g->has_top_k = true;
        g->top_k = json_integer_value(v) > c->vocab ? c->vocab : (int64_t)json_integer_value(v);
    }
    if (!g->do_sample) return KILN_OK;
    /* with do_sample, generate() refuses a temperature of 0; kiln has no top_p 0 */
    if (g->has_temperature && g->temperature == 0) {
        kiln_err(c->err, KILN_ERR_PARSE, "%s: field \"temperature\" is 0 with \"do_sample\": true", c->path);
        return kiln_err_hint(c->err, "transformers' generate() refuses this too; set \"do_sample\": false for greedy "
                                     "decoding, or a temperature > 0");
    }
    if (g->has_top_p && g->top_p == 0)
        return kiln_err(c->err, KILN_ERR_UNSUPPORTED,
                        "%s: field \"top_p\" is 0 with \"do_sample\": true; kiln samples with top_p in (0, 1]",
                        c->path);
    return KILN_OK;
}

/* Keys read above, and keys that do not change the generated tokens. */
static bool gc_known(const char *k) {
    static const char *const known[] = {"bos_token_id", "eos_token_id", "pad_token_id", "do_sample", "temperature",
                                        "top_k", "top_p", "transformers_version", "_from_model_config",
                                        /* what generate() returns besides the tokens; the tokens are the same */
                                        "use_cache", "output_attentions", "output_hidden_states", "output_scores",
                                        "output_logits", "return_dict_in_generate"};
    for (size_t i = 0; i < sizeof known / sizeof *known; i++)
        if (strcmp(k, known[i]) == 0) return true;
    return false;
}

static int gc_cmp_str(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* The keys kiln does not apply, sorted, as a comma list (truncated with "..."). */
static void gc_not_applied(json_t *root, kiln_generation_config *g) {
    size_t n = json_object_size(root), k = 0, len = 0;
    const char **keys = malloc((n ? n : 1) * sizeof *keys);
    if (!keys) return; /* the list is informative only */
    const char *key;
    json_t *v;
    json_object_foreach(root, key, v) {
        if (!gc_known(key)) keys[k++] = key;
    }
    qsort(keys, k, sizeof *keys, gc_cmp_str);
    for (size_t i = 0; i < k; i++) {
        int w = snprintf(g->not_applied + len, sizeof g->not_applied - len, "%s%s", i ? "," : "", keys[i]);
        if (w < 0 || (size_t)w >= sizeof g->not_applied - len) {
            memcpy(g->not_applied + sizeof g->not_applied - 4, "...", 4);
            break;
        }
        len += (size_t)w;
    }
    free(keys);
}

kiln_status kiln_generation_config_parse(const char *json, size_t len, const char *path, int64_t vocab_size,
                                         kiln_generation_config *out, kiln_error *err) {
    memset(out, 0, sizeof *out);
    gc_ctx c = {path ? path : "generation_config.json", vocab_size, err};
    json_error_t je;
    json_t *root = json_loadb(json, len, JSON_REJECT_DUPLICATES, &je);
    if (!root)
        return kiln_err(err, KILN_ERR_PARSE, "%s: not valid JSON: %s (line %d, column %d)", c.path, je.text, je.line,
                        je.column);
    kiln_status st;
    kiln_generation_config g = {.bos_token_id = -1, .pad_token_id = -1};
    if (!json_is_object(root)) {
        st = kiln_err(err, KILN_ERR_PARSE, "%s: the top level is not a JSON object", c.path);
        goto out;
    }
    if ((st = gc_ids(&c, root, &g)) || (st = gc_sampling(&c, root, &g))) goto out;
    gc_not_applied(root, &g);
    *out = g;
out:
    json_decref(root);
    return st;
}

kiln_status kiln_generation_config_load(const char *path, int64_t vocab_size, kiln_generation_config *out,
                                        kiln_error *err) {
    memset(out, 0, sizeof *out);
    char *text = NULL; /* kiln_file_read refuses a FIFO, device or directory by type, never blocking */
    size_t len = 0;
    kiln_status st = kiln_file_read(path, GC_MAX_FILE, &text, &len, err);
    if (st) return st;
    st = kiln_generation_config_parse(text, len, path, vocab_size, out, err);
    free(text);
    return st;
}

/* bos/eos/pad: from generation_config.json when there is one, else config.json. */
static void resolve_ids(const kiln_model_config *c, const kiln_generation_config *gc, kiln_generation *o) {
    if (!gc) {
        o->ids_src = "config.json";
        o->bos_token_id = c->bos_token_id;
        o->n_eos = c->n_eos;
        memcpy(o->eos_token_ids, c->eos_token_ids, sizeof o->eos_token_ids);
        return;
    }
    o->ids_src = "generation_config.json";
    o->bos_token_id = gc->has_bos ? gc->bos_token_id : -1;
    o->pad_token_id = gc->has_pad ? gc->pad_token_id : -1;
    o->n_eos = gc->n_eos;
    memcpy(o->eos_token_ids, gc->eos_token_ids, sizeof o->eos_token_ids);
}

void kiln_generation_resolve(const kiln_model_config *c, const kiln_generation_config *gc, kiln_generation *out) {
    kiln_generation o = {.pad_token_id = -1, .not_applied = gc ? gc->not_applied : ""};
    resolve_ids(c, gc, &o);
    const char *file = "generation_config.json";
    o.do_sample = gc && gc->has_do_sample && gc->do_sample;
    o.do_sample_src = gc && gc->has_do_sample ? file : "default";
    if (!o.do_sample) { /* greedy: kiln's temperature 0, no top-k, no top-p */
        o.temperature = 0, o.top_k = 0, o.top_p = 1;
        o.temperature_src = o.top_k_src = o.top_p_src = "greedy";
        *out = o;
        return;
    }
    o.temperature = gc->has_temperature ? gc->temperature : GC_HF_TEMPERATURE;
    o.temperature_src = gc->has_temperature ? file : "default";
    o.top_k = gc->has_top_k ? gc->top_k : (GC_HF_TOP_K < c->vocab_size ? GC_HF_TOP_K : c->vocab_size);
    o.top_k_src = gc->has_top_k ? file : "default";
    o.top_p = gc->has_top_p ? gc->top_p : GC_HF_TOP_P;
    o.top_p_src = gc->has_top_p ? file : "default";
    *out = o;
}
