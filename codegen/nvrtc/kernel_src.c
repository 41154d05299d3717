/*
 * kernel_src.c — lookups over the kernel templates embedded at build time.
 * The table itself is generated (codegen/nvrtc/embed_kernels.cmake) into the
 * build folder; this file is built in every configuration, with or without
 * CUDA, so the compiler can always print or hash its templates.
 */
#include "codegen/kiln_nvrtc.h"

#include <string.h>

/* Defined in the generated kiln_kernel_sources.c: sorted by name, {0} last. */
extern const kiln_kernel_src kiln_kernel_srcs_[];
extern const size_t kiln_kernel_srcs_count_;

size_t kiln_kernel_src_count(void) { return kiln_kernel_srcs_count_; }

const kiln_kernel_src *kiln_kernel_src_at(size_t i) {
    return i < kiln_kernel_srcs_count_ ? &kiln_kernel_srcs_[i] : NULL;
}

const kiln_kernel_src *kiln_kernel_src_find(const char *name) {
    if (!name) return NULL;
    for (size_t i = 0; i < kiln_kernel_srcs_count_; i++)
        if (strcmp(kiln_kernel_srcs_[i].name, name) == 0) return &kiln_kernel_srcs_[i];
    return NULL;
}
