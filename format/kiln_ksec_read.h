/*
 * kiln_ksec_read.h — the parsed kernels section (format in kiln_ksec.h).
 * Plain C; pointers point into the section's bytes, which must outlive it.
 */
#ifndef KILN_KSEC_READ_H
#define KILN_KSEC_READ_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../common/kiln_util.h"
#include "kiln_ksec.h"

typedef struct kiln_ksec_module {
    char name[KILN_KSEC_NAME_MAX];
    int32_t cfg[KILN_KSEC_CFG_N];
    const char *source; /* the generated CUDA C (not NUL-terminated); a sharing module's is its owner's */
    size_t source_len;
    int owner;    /* index of the module whose source and images this one uses: itself, or the one it shares */
    int n_images; /* its owner's images */
} kiln_ksec_module;

typedef struct kiln_ksec_image {
    int module, sm; /* module: an owner (modules[module].owner == module) */
    bool is_ptx;
    const void *data;
    size_t len;
} kiln_ksec_image;

typedef struct kiln_ksec {
    int elem;       /* KILN_KSEC_ELEM_* */
    int block_size; /* KV block size the kernels were built for */
    int n_modules, n_images;
    int n_sources;  /* distinct sources: the modules that own theirs */
    kiln_ksec_module *modules;
    kiln_ksec_image *images;
} kiln_ksec;

kiln_status kiln_ksec_parse(const uint8_t *data, size_t size, kiln_ksec *out, kiln_error *err);
void kiln_ksec_free(kiln_ksec *k);
const kiln_ksec_module *kiln_ksec_find(const kiln_ksec *k, const char *name);

#endif /* KILN_KSEC_READ_H */
