/*
 * chat_cli.c — `kiln run --chat [--system TEXT]`: wrap the prompt in the
 * engine's chat template (kiln_chat_render), so cmd_run.c only calls this.
 */
#include "chat_cli.h"

#include <stdlib.h>
#include <string.h>

#include "../runtime/kiln.h"

kiln_status kiln_cli_chat_prompt(const struct kiln_t *k, const char *system, char **text, size_t *len, kiln_error *err) {
    if (memchr(*text, 0, *len))
        return kiln_err(err, KILN_ERR_INVALID_ARG, "the prompt holds a NUL byte, which a chat message cannot");
    kiln_chat_message msgs[2];
    int32_t n = 0;
    if (system) msgs[n++] = (kiln_chat_message){"system", system};
    msgs[n++] = (kiln_chat_message){"user", *text};
    char *out = NULL, msg[KILN_ERR_MSG_MAX];
    size_t out_len = 0;
    kiln_status st = kiln_chat_render(k, msgs, n, 1, &out, &out_len, msg, sizeof msg);
    if (st != KILN_OK) {
        kiln_err(err, st, "%s", msg);
        if (st == KILN_ERR_MISSING && !strstr(msg, "hint:")) kiln_err_hint(err, "run without --chat");
        return st;
    }
    free(*text);
    *text = out; /* kiln_chat_text_free is free() */
    *len = out_len;
    return KILN_OK;
}
