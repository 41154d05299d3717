/*
 * chat_compile.c — find a checkpoint's chat template, validate it and build
 * the engine's chat section.
 *
 * Where the template comes from (transformers' order): chat_template.jinja
 * beside tokenizer_config.json; else tokenizer_config.json's "chat_template",
 * a string or HF's list of {"name", "template"} (the one named "default").
 * The special tokens a template may use (bos_token, eos_token, unk_token,
 * sep_token, pad_token, cls_token, mask_token) come from
 * tokenizer_config.json, as a string or an AddedToken object's "content".
 *
 * Validation happens here, at compile time, so an engine never carries a
 * template the runtime cannot render: the parser refuses unsupported tags,
 * filters, tests, functions and methods by name, then the template renders
 * sample conversations. A raise_exception() there is the template refusing
 * that conversation (Mistral refuses a system message) and is fine, as long
 * as one sample renders.
 */
#include "kiln_chat_compile.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "../runtime/kiln_chat.h"

static const char *const special_names[] = {"bos_token", "eos_token", "unk_token", "sep_token",
                                            "pad_token", "cls_token", "mask_token"};
#define N_SPECIAL (sizeof special_names / sizeof *special_names)

/* The config's chat_template as a string (borrowed from root), or NULL. */
static kiln_status config_template(json_t *root, const char *label, const char **out, size_t *len, kiln_error *err) {
    json_t *t = json_object_get(root, "chat_template");
    *out = NULL;
    if (!t || json_is_null(t)) return KILN_OK;
    if (json_is_array(t)) {
        size_t i;
        json_t *e;
        json_array_foreach(t, i, e) {
            json_t *name = json_object_get(e, "name"), *tt = json_object_get(e, "template");
            if (json_is_string(name) && !strcmp(json_string_value(name), "default")) {
                t = tt;
                break;
            }
        }
        if (json_is_array(t)) {
            kiln_err(err, KILN_ERR_MISSING, "%s: chat_template lists named templates but none is named \"default\"", label);
            return kiln_err_hint(err, "name one template \"default\", or compile with --no-chat-template");
        }
    }
    if (!json_is_string(t))
        return kiln_err(err, KILN_ERR_PARSE, "%s: chat_template must be a string or a list of {\"name\", \"template\"}", label);
    *out = json_string_value(t);
    *len = json_string_length(t);
    return KILN_OK;
}

static json_t *special_tokens(json_t *root) {
    json_t *sp = json_object();
    for (size_t i = 0; sp && i < N_SPECIAL; i++) {
        json_t *v = json_object_get(root, special_names[i]);
        if (json_is_object(v)) v = json_object_get(v, "content");
        if (json_is_string(v)) json_object_set_new(sp, special_names[i], json_stringn(json_string_value(v), json_string_length(v)));
    }
    return sp;
}

/* Render sample conversations: refuse what kiln cannot render. */
static kiln_status dry_run(const kiln_chat_section *c, const char *label, kiln_error *err) {
    static const kiln_chat_message samples[][3] = {
        {{"system", "You are a helpful assistant."}, {"user", "Hello!"}, {NULL, NULL}},
        {{"user", "Hello!"}, {"assistant", "Hi. How can I help?"}, {"user", "Tell me a story."}},
        {{"user", "Hello!"}, {NULL, NULL}, {NULL, NULL}},
    };
    static const size_t counts[] = {2, 3, 1};
    int rendered = 0;
    kiln_error last = {0};
    for (size_t s = 0; s < 3; s++)
        for (int gen = 0; gen < 2; gen++) {
            kiln_buf out = {0};
            kiln_status st = kiln_chat_section_render(c, samples[s], counts[s], gen, &out, &last);
            kiln_buf_free(&out);
            if (st == KILN_OK) rendered++;
            else if (st != KILN_ERR_INVALID_ARG || !strstr(last.msg, "raise_exception")) {
                *err = last;
                kiln_err_prefix(err, "%s: ", label);
                return kiln_err_hint(err, "kiln renders a subset of Jinja (docs/chat.md); compile with "
                                          "--no-chat-template to leave the template out");
            }
        }
    if (rendered) return KILN_OK;
    *err = last;
    kiln_err_prefix(err, "%s: the chat template refuses every sample conversation: ", label);
    return kiln_err_hint(err, "compile with --no-chat-template to leave the template out");
}

kiln_status kiln_chat_compile_mem(const char *config, size_t config_len, const char *jinja, size_t jinja_len,
                                  const char *label, kiln_buf *out, bool *found, kiln_error *err) {
    *found = false;
    json_error_t je;
    json_t *root = config ? json_loadb(config, config_len, JSON_DECODE_INT_AS_REAL, &je) : json_object();
    if (!root || !json_is_object(root)) {
        json_decref(root);
        return kiln_err(err, KILN_ERR_PARSE, "%s: not a JSON object (%s)", label, config ? je.text : "");
    }
    const char *tmpl = jinja;
    size_t len = jinja_len;
    kiln_status st = KILN_OK;
    kiln_chat_section *c = NULL;
    char *text = NULL;
    if (!tmpl && (st = config_template(root, label, &tmpl, &len, err)) != KILN_OK) goto out;
    if (!tmpl) goto out;
    json_t *payload = json_pack("{s:s%, s:o}", "template", tmpl, len, "special_tokens", special_tokens(root));
    text = payload ? json_dumps(payload, JSON_SORT_KEYS | JSON_COMPACT) : NULL;
    json_decref(payload);
    if (!text) {
        /* json_pack refuses invalid UTF-8 */
        st = kiln_err(err, KILN_ERR_PARSE, "%s: the chat template is not valid UTF-8 text", label);
        goto out;
    }
    if ((st = kiln_chat_section_load((const uint8_t *)text, strlen(text), &c, err)) != KILN_OK) {
        kiln_err_prefix(err, "%s: ", label);
        kiln_err_hint(err, "kiln renders a subset of Jinja (docs/chat.md); compile with --no-chat-template to leave "
                           "the template out");
        goto out;
    }
    if ((st = dry_run(c, label, err)) != KILN_OK) goto out;
    if (!kiln_buf_append(out, text, strlen(text))) {
        st = kiln_err(err, KILN_ERR_NOMEM, "out of memory");
        goto out;
    }
    *found = true;
out:
    kiln_chat_section_free(c);
    free(text);
    json_decref(root);
    return st;
}

kiln_status kiln_chat_compile(const char *dir, const char *config_path, kiln_buf *out, bool *found, kiln_error *err) {
    char *config = NULL, *jinja = NULL, *jpath = dir ? kiln_path_join(dir, "chat_template.jinja") : NULL;
    size_t config_len = 0, jinja_len = 0;
    kiln_status st = KILN_OK;
    *found = false;
    if (jpath && kiln_path_exists(jpath) &&
        (st = kiln_file_read(jpath, KILN_CHAT_MAX_TEMPLATE, &jinja, &jinja_len, err)) != KILN_OK)
        goto out;
    if (config_path && (st = kiln_file_read(config_path, 64u << 20, &config, &config_len, err)) != KILN_OK) goto out;
    if (!config && !jinja) goto out;
    st = kiln_chat_compile_mem(config, config_len, jinja, jinja_len, jinja ? jpath : config_path, out, found, err);
out:
    free(config);
    free(jinja);
    free(jpath);
    return st;
}
