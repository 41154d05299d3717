/*
 * chat_cli.h — `kiln run --chat`: the prompt (and --system) as a
 * conversation rendered with the engine's chat template.
 */
#ifndef KILN_CHAT_CLI_H
#define KILN_CHAT_CLI_H

#include <stddef.h>

#include "../common/kiln_util.h"

struct kiln_t;

/* Replace *text (malloc'd, *len bytes: the user's message) by the
 * conversation [system (when not NULL), user] rendered with the engine's
 * template and add_generation_prompt, as HF apply_chat_template does. The
 * result is to be encoded without adding special tokens (the template writes
 * bos where the model wants it). */
kiln_status kiln_cli_chat_prompt(const struct kiln_t *k, const char *system, char **text, size_t *len, kiln_error *err);

#endif /* KILN_CHAT_CLI_H */
