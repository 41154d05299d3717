/*
 * cmd_inspect.c — `kiln inspect model.kiln [--json]`: what an engine holds.
 * The engine is fully verified (checksums included) before anything is shown.
 */
#include <getopt.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../runtime/kiln_plan.h"
#include "../runtime/kiln_rt.h"
#include "cli.h"

static void help(FILE *f) {
    fprintf(f, "usage: kiln inspect ENGINE.kiln [--json]\n\n"
               "Verify an engine file and show its format version, model, sections, weights, plan and\n"
               "tokenizer. --json prints one JSON object: the meta section plus 'sections' and 'plan'.\n");
}

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

static json_t *plan_json(const kiln_plan *p) {
    json_t *ops = json_object();
    for (uint32_t i = 0; i < p->n_ops; i++) {
        const char *name = kiln_op_name((kiln_op_kind)p->ops[i].kind);
        json_t *n = json_object_get(ops, name);
        json_object_set_new(ops, name, json_integer(n ? json_integer_value(n) + 1 : 1));
    }
    return json_pack("{s:i, s:i, s:i, s:i, s:o}", "values", (int)p->n_values, "ops_total", (int)p->n_ops, "weights",
                     (int)p->n_weights, "buffer_slots", (int)p->n_slots, "ops", ops);
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
    json_error_t je;
    json_t *meta = json_loads(m->meta_json, 0, &je);
    if (!meta) meta = json_object();
    json_object_set_new(meta, "sections", sections_json(&m->engine));
    json_object_set_new(meta, "plan", plan_json(m->plan));
    json_object_set_new(meta, "file", json_string(path));
    json_object_set_new(meta, "file_bytes", json_integer((json_int_t)m->engine.size));
    if (json) {
        char *s = json_dumps(meta, JSON_SORT_KEYS | JSON_INDENT(2));
        printf("%s\n", s);
        free(s);
    } else {
        json_t *model = json_object_get(meta, "model"), *w = json_object_get(meta, "weights");
        printf("%s: kiln engine, format %u.%u, %zu bytes, built by kiln %s\n", path, m->engine.major,
               m->engine.minor, m->engine.size, json_string_value(json_object_get(meta, "kiln_version")));
        printf("model: %s, %lld layers, hidden %lld, heads %lld/%lld (head_dim %lld), ffn %lld, vocab %lld, "
               "context %lld",
               json_string_value(json_object_get(model, "architecture")),
               (long long)json_integer_value(json_object_get(model, "num_hidden_layers")),
               (long long)json_integer_value(json_object_get(model, "hidden_size")),
               (long long)json_integer_value(json_object_get(model, "num_attention_heads")),
               (long long)json_integer_value(json_object_get(model, "num_key_value_heads")),
               (long long)json_integer_value(json_object_get(model, "head_dim")),
               (long long)json_integer_value(json_object_get(model, "intermediate_size")),
               (long long)json_integer_value(json_object_get(model, "vocab_size")),
               (long long)json_integer_value(json_object_get(model, "max_position_embeddings")));
        long long win = (long long)json_integer_value(json_object_get(model, "sliding_window"));
        if (win) printf(", sliding window %lld", win);
        printf("\nweights: %lld tensors, %.2f MB, dtype %s, codec %s\n",
               (long long)json_integer_value(json_object_get(w, "count")),
               (double)json_integer_value(json_object_get(w, "bytes")) / 1e6,
               json_string_value(json_object_get(w, "dtype")), json_string_value(json_object_get(w, "codec")));
        printf("plan: %u ops, %u values, %u buffer slots:", m->plan->n_ops, m->plan->n_values, m->plan->n_slots);
        const char *k;
        json_t *v;
        json_object_foreach(json_object_get(json_object_get(meta, "plan"), "ops"), k, v) {
            printf(" %s×%lld", k, (long long)json_integer_value(v));
        }
        printf("\ntokenizer: %s\nsections:\n", m->tokenizer ? "yes" : "none");
        for (uint32_t i = 0; i < m->engine.n_sections; i++) {
            const kiln_engine_section *s = &m->engine.sections[i];
            printf("  %-10s offset %-10llu %12llu bytes stored, %12llu raw, %s\n", kiln_section_kind_name(s->kind),
                   (unsigned long long)s->offset, (unsigned long long)s->stored_size,
                   (unsigned long long)s->raw_size, kiln_codec_name(s->codec));
        }
    }
    json_decref(meta);
    kiln_model_close(m);
    return KILN_EXIT_OK;
}
