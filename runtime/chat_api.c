/*
 * chat_api.c — the chat template behind the public API (kiln.h):
 * reading the engine's chat section at kiln_open, kiln_chat_render,
 * kiln_has_chat_template, kiln_chat_text_free.
 *
 * An engine without a chat section (format 2.0, or compiled with
 * --no-chat-template) opens as before; kiln_chat_render then says so with
 * KILN_ERR_MISSING. A runtime older than format 2.1 ignores the section; one
 * whose interpreter cannot parse the template (from a newer kiln) opens the
 * engine and refuses only kiln_chat_render, naming what it does not support.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kiln_chat.h"
#include "../format/kiln_engine.h"

kiln_status kiln_chat_from_engine(const kiln_engine *e, const char *path, kiln_chat_section **out, kiln_error *err) {
    *out = NULL;
    const kiln_engine_section *s = kiln_engine_find(e, KILN_SECTION_CHAT);
    if (!s) return KILN_OK;
    const uint8_t *data;
    size_t size;
    bool owned;
    kiln_status st = kiln_engine_section_bytes(e, s, 1, &data, &size, &owned, err);
    if (st != KILN_OK) return st;
    st = kiln_chat_section_load(data, size, out, err);
    if (owned) free((void *)data);
    if (st == KILN_ERR_PARSE || st == KILN_ERR_UNSUPPORTED) {
        /* a template outside this runtime's subset: open anyway, refuse at render */
        if (!(*out = calloc(1, sizeof **out)) || !((*out)->error = strdup(err->msg))) {
            free(*out);
            *out = NULL;
            return kiln_err(err, KILN_ERR_NOMEM, "%s: chat section: out of memory", path);
        }
        kiln_err_clear(err);
        return KILN_OK;
    }
    if (st != KILN_OK) return kiln_err_prefix(err, "%s: chat section: ", path);
    return KILN_OK;
}

int32_t kiln_has_chat_template(const kiln_t *k) {
    const kiln_chat_section *c = kiln_api_chat(k);
    return c && c->tmpl ? 1 : 0;
}

static kiln_status fail(char *errbuf, size_t errcap, const kiln_error *err) {
    if (errbuf && errcap) snprintf(errbuf, errcap, "%s", err->msg);
    return err->code;
}

kiln_status kiln_chat_render(const kiln_t *k, const kiln_chat_message *msgs, int32_t n, int32_t add_generation_prompt,
                             char **out, size_t *len, char *errbuf, size_t errcap) {
    kiln_error err = {0};
    if (errbuf && errcap) errbuf[0] = 0;
    if (!out) return fail(errbuf, errcap, &(kiln_error){KILN_ERR_INVALID_ARG, "kiln_chat_render: out is NULL"});
    *out = NULL;
    if (len) *len = 0;
    const kiln_chat_section *c = kiln_api_chat(k);
    if (!k || n < 0 || (n > 0 && !msgs)) {
        kiln_err(&err, KILN_ERR_INVALID_ARG, "kiln_chat_render: %s", !k ? "the engine is NULL" : n < 0 ? "n < 0" : "msgs is NULL");
        return fail(errbuf, errcap, &err);
    }
    if (!c) {
        kiln_err(&err, KILN_ERR_MISSING, "the engine has no chat template");
        kiln_err_hint(&err, "compile it with this kiln from a checkpoint whose tokenizer_config.json has a chat_template");
        return fail(errbuf, errcap, &err);
    }
    kiln_buf b = {0};
    kiln_status st = kiln_chat_section_render(c, msgs, (size_t)n, add_generation_prompt != 0, &b, &err);
    if (st == KILN_OK && !kiln_buf_append(&b, "", 1)) st = kiln_err(&err, KILN_ERR_NOMEM, "kiln_chat_render: out of memory");
    if (st != KILN_OK) {
        kiln_buf_free(&b);
        return fail(errbuf, errcap, &err);
    }
    *out = (char *)b.data;
    if (len) *len = b.len - 1;
    return KILN_OK;
}

void kiln_chat_text_free(char *text) { free(text); }
