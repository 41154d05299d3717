/*
 * kiln_chat.h — chat templates: a Jinja-subset interpreter in C that renders
 * a conversation exactly as HuggingFace transformers' apply_chat_template
 * (tokenize=False) does, so the runtime (server, `kiln run --chat`) needs no
 * Python. docs/chat.md lists the subset.
 *
 *   kiln_chat_template   a parsed template (read-only once parsed: render it
 *                        from any number of threads at once)
 *   kiln_chat_section    a template plus the special-token strings it may
 *                        refer to (bos_token, eos_token...), as stored in the
 *                        engine's chat section (kind 6, KILN_SECTION_CHAT)
 *
 * The template is hostile input: parsing caps its size and nesting depth,
 * rendering caps the output, the memory it allocates, loop iterations and
 * evaluation steps (kiln_chat_limits), so no template can hang or exhaust
 * memory. Anything outside the subset is refused at parse time by name
 * ("chat template: line 12: filter 'groupby' is not supported").
 *
 * Status codes: a syntax error KILN_ERR_PARSE; an unsupported tag, filter,
 * test, function or method KILN_ERR_UNSUPPORTED; raise_exception() in the
 * template, or a conversation past a cap, KILN_ERR_INVALID_ARG (the template
 * refuses these messages); a type error while rendering ('a' + 1)
 * KILN_ERR_PARSE.
 */
#ifndef KILN_CHAT_H
#define KILN_CHAT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../common/kiln_util.h"
#include "kiln.h"

#define KILN_CHAT_MAX_TEMPLATE (1u << 20) /* template source bytes */
#define KILN_CHAT_MAX_DEPTH 64            /* nesting of expressions and of blocks */
#define KILN_CHAT_MAX_SPECIAL 8           /* special-token variables */

typedef struct kiln_chat_limits {
    size_t max_output;     /* bytes of rendered text (default 64 MiB) */
    size_t max_memory;     /* bytes the render may allocate for values (default 256 MiB) */
    uint64_t max_iters;    /* loop iterations, all loops together (default 1,000,000) */
    uint64_t max_steps;    /* expression evaluations and statements (default 50,000,000) */
} kiln_chat_limits;

void kiln_chat_limits_default(kiln_chat_limits *l);

typedef struct kiln_chat_template kiln_chat_template;

/* Parse `len` bytes of template source (UTF-8). */
kiln_status kiln_chat_template_parse(const char *src, size_t len, kiln_chat_template **out, kiln_error *err);
void kiln_chat_template_free(kiln_chat_template *t);

/* A variable the template sees besides messages and add_generation_prompt:
 * the special tokens (name "bos_token", value "<s>"). */
typedef struct kiln_chat_var {
    const char *name;
    const char *value;
} kiln_chat_var;

/* Render: messages (role/content pairs, kiln.h's kiln_chat_message), the
 * variables, add_generation_prompt; `tools` and `documents` are none, as
 * transformers passes them without tools. The text is appended to *out
 * (not NUL-terminated). limits NULL = defaults. */
kiln_status kiln_chat_template_render(const kiln_chat_template *t, const kiln_chat_message *msgs, size_t n_msgs,
                                      const kiln_chat_var *vars, size_t n_vars, bool add_generation_prompt,
                                      const kiln_chat_limits *limits, kiln_buf *out, kiln_error *err);

/* ---- the engine's chat section ----
 * Payload: UTF-8 JSON {"template": "...", "special_tokens": {"bos_token": "<s>", ...}}
 * (keys sorted). Readers ignore other keys. */
typedef struct kiln_chat_section {
    kiln_chat_template *tmpl;
    kiln_chat_var vars[KILN_CHAT_MAX_SPECIAL];
    size_t n_vars;
    char *strings; /* owns the vars' names and values */
    char *error;   /* kiln_chat_from_engine only: why this runtime cannot use the template (tmpl is NULL) */
} kiln_chat_section;

/* Parse a chat section's payload (hostile: sizes capped, UTF-8 checked, the
 * template parsed). */
kiln_status kiln_chat_section_load(const uint8_t *data, size_t len, kiln_chat_section **out, kiln_error *err);
void kiln_chat_section_free(kiln_chat_section *c);
/* Render with the section's template and special tokens. */
kiln_status kiln_chat_section_render(const kiln_chat_section *c, const kiln_chat_message *msgs, size_t n, bool add_generation_prompt,
                                  kiln_buf *out, kiln_error *err);

/* The engine's chat section (KILN_SECTION_CHAT), or *out = NULL when it has
 * none (an engine from before format 2.1, or compiled with --no-chat-template).
 * A template this runtime cannot parse (a newer kiln's, say) does not fail
 * the open: the section comes back with tmpl NULL and `error` saying why,
 * which kiln_chat_render reports. */
struct kiln_engine;
kiln_status kiln_chat_from_engine(const struct kiln_engine *e, const char *path, kiln_chat_section **out, kiln_error *err);
/* The chat section of an open engine handle (runtime/api.c), or NULL. */
const kiln_chat_section *kiln_api_chat(const kiln_t *k);

#endif /* KILN_CHAT_H */
