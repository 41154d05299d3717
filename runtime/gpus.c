/*
 * gpus.c — the CUDA devices a context's tensor-parallel ranks run on:
 * kiln_ctx_options.gpus and the command line's --gpus, "0,1" (kiln_rt.h:
 * kiln_gpus_parse). One parser for both, so kiln_ctx_new and the CLI refuse
 * the same strings with the same words.
 *
 * The grammar is strict on purpose: items of ASCII digits only (no sign, no
 * spaces, no empty item), each 0..KILN_GPU_ORDINAL_MAX, at most
 * KILN_MAX_RANKS of them. A lenient reading ("0, 1", "0,") would let a typo
 * put a rank on the wrong GPU of a shared host. Whether the count fits the
 * engine is the caller's question (kiln_ctx_new knows the ranks).
 */
#include <stddef.h>

#include "kiln_rt.h"

/* The text of item `i` (1-based) in messages: at most this many bytes of it. */
#define SHOWN_ITEM 16

kiln_status kiln_gpus_parse(const char *spec, kiln_gpu_list *out, kiln_error *err) {
    *out = (kiln_gpu_list){0}; /* and so it stays on failure: the list is written whole or not at all */
    if (!spec || !*spec) return KILN_OK;
    kiln_gpu_list g = {0};
    const char *p = spec;
    for (int item = 1;; item++) {
        const char *start = p;
        while (*p && *p != ',') p++;
        int len = (int)(p - start), value = 0, digits = 0;
        while (digits < len && start[digits] >= '0' && start[digits] <= '9' && value <= KILN_GPU_ORDINAL_MAX)
            value = value * 10 + (start[digits++] - '0');
        if (len == 0) {
            kiln_err(err, KILN_ERR_INVALID_ARG, "\"%.64s\": item %d is empty", spec, item);
            return kiln_err_hint(err, "give comma-separated CUDA device ordinals, one per tensor-parallel rank, "
                                      "e.g. \"0,1\"");
        }
        if (digits < len || len > 4 || value > KILN_GPU_ORDINAL_MAX) { /* 4 digits: "1023", "0001" */
            kiln_err(err, KILN_ERR_INVALID_ARG, "\"%.64s\": item %d \"%.*s\" is not a CUDA device ordinal (a whole "
                     "number 0..%d)", spec, item, len < SHOWN_ITEM ? len : SHOWN_ITEM, start, KILN_GPU_ORDINAL_MAX);
            return kiln_err_hint(err, "digits only, no spaces or signs: \"0,1\" runs rank 0 on GPU 0 and rank 1 on "
                                      "GPU 1 (nvidia-smi lists the ordinals)");
        }
        if (item > KILN_MAX_RANKS) {
            kiln_err(err, KILN_ERR_INVALID_ARG, "\"%.64s...\": more than %d devices", spec, KILN_MAX_RANKS);
            return kiln_err_hint(err, "an engine has at most %d tensor-parallel ranks, and takes one device per rank",
                                 KILN_MAX_RANKS);
        }
        g.ordinal[g.n++] = value;
        if (!*p) {
            *out = g;
            return KILN_OK;
        }
        p++; /* the comma */
    }
}
