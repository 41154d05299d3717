/*
 * kiln_chat_compile.h — the compile-time half of chat templates: find the
 * checkpoint's template, check that kiln's interpreter takes it, and build
 * the engine's chat section (runtime/kiln_chat.h describes its payload).
 */
#ifndef KILN_CHAT_COMPILE_H
#define KILN_CHAT_COMPILE_H

#include <stdbool.h>

#include "../common/kiln_util.h"

/* From tokenizer_config.json text (config may be NULL) and the text of a
 * chat_template.jinja (NULL when there is none; it wins over the config's
 * chat_template, as in transformers): the section payload in *out, or
 * *found = false when there is no template. The template is parsed and
 * rendered with sample conversations: a template kiln cannot render is
 * refused, naming the line and the feature (KILN_ERR_UNSUPPORTED /
 * KILN_ERR_PARSE), with a hint about --no-chat-template. `label` names the
 * source in messages. */
kiln_status kiln_chat_compile_mem(const char *config, size_t config_len, const char *jinja, size_t jinja_len,
                                  const char *label, kiln_buf *out, bool *found, kiln_error *err);

/* The same from a checkpoint directory: dir/chat_template.jinja, else
 * config_path's chat_template (config_path may be NULL). */
kiln_status kiln_chat_compile(const char *dir, const char *config_path, kiln_buf *out, bool *found, kiln_error *err);

#endif /* KILN_CHAT_COMPILE_H */
