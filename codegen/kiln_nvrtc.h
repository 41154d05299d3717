/*
 * kiln_nvrtc.h — kernel templates embedded in the compiler, and CUDA C →
 * cubin/PTX compilation through NVRTC with an on-disk cache.
 *
 * Kernel templates: every kernels/NAME.cuh file is embedded at build time (a
 * CMake step writes its bytes into a generated .c file), so the compiler
 * binary carries its templates and needs no source tree at run time. The
 * lookup functions below are plain C and exist in every build; the NVRTC
 * functions exist only when kiln was built with CUDA (KILN_HAVE_CUDA).
 *
 * A kernel source is one template file plus #define constants (HIDDEN,
 * HEAD_DIM, ...) that specialise it; every embedded template is visible to
 * it as an include ("#include \"common.cuh\""). NVRTC searches no include
 * path by itself: the toolkit's include folder found at build time is passed
 * explicitly, overridable with the environment variable KILN_CUDA_INCLUDE.
 *
 * Cache: a compiled result is stored under $XDG_CACHE_HOME/kiln (else
 * ~/.cache/kiln), keyed by a hash of (source, every embedded header,
 * defines, target SM, PTX wanted, NVRTC version, options). A damaged cache
 * entry (bad magic, size or checksum) is ignored and rewritten. Set
 * KILN_NVRTC_CACHE=0 to turn the cache off.
 */
#ifndef KILN_NVRTC_H
#define KILN_NVRTC_H

#include <stdbool.h>
#include <stddef.h>

#include "../common/kiln_util.h"

/* ---- embedded kernel templates (always available) ---- */

typedef struct kiln_kernel_src {
    const char *name; /* file name in kernels/, e.g. "gemv.cuh" */
    const char *text; /* NUL-terminated file contents */
    size_t len;       /* strlen(text) */
} kiln_kernel_src;

/* Number of embedded templates and the i-th one (NULL when out of range). */
size_t kiln_kernel_src_count(void);
const kiln_kernel_src *kiln_kernel_src_at(size_t i);
/* The template named `name` ("gemv.cuh"), or NULL. */
const kiln_kernel_src *kiln_kernel_src_find(const char *name);

/* ---- NVRTC (only in builds with CUDA) ---- */

/* Options beyond the plain call; zero-initialise and set what you need. */
typedef struct kiln_nvrtc_opts {
    const char *cache_dir; /* NULL: $XDG_CACHE_HOME/kiln or ~/.cache/kiln */
    bool no_cache;         /* neither read nor write the cache */
    bool line_info;        /* -lineinfo (for profilers and compute-sanitizer) */
    kiln_buf *log_out;     /* if set, receives NVRTC's full log (may be empty) */
    bool *cache_hit;       /* if set, true when the result came from the cache */
} kiln_nvrtc_opts;

/*
 * Compile CUDA C `src` (kernel name `name`, used in messages and the NVRTC
 * program name) with `defines` ("HIDDEN=4096", "WINDOW=4096"...) for the SM
 * `sm` (80, 86, 89, 90...). On success `cubin_out` holds a cubin for sm_<sm>
 * and, when want_ptx, `ptx_out` holds PTX for compute_<sm> (NUL-terminated,
 * len excludes the NUL) so newer GPUs can JIT it. Either out buffer may be
 * NULL when not wanted. Errors carry the kernel name, the SM and NVRTC's log.
 * Returns KILN_ERR_UNSUPPORTED in builds without CUDA.
 */
kiln_status kiln_nvrtc_compile(const char *src, const char *name, const char *const *defines,
                               int n_defines, int sm, bool want_ptx, kiln_buf *cubin_out,
                               kiln_buf *ptx_out, kiln_error *err);
kiln_status kiln_nvrtc_compile_ex(const char *src, const char *name, const char *const *defines,
                                  int n_defines, int sm, bool want_ptx, kiln_buf *cubin_out,
                                  kiln_buf *ptx_out, const kiln_nvrtc_opts *opts, kiln_error *err);

/* NVRTC's version as major*1000 + minor*10 (e.g. 13000), or a status. */
kiln_status kiln_nvrtc_version(int *out, kiln_error *err);

/* The SMs this NVRTC can compile for (e.g. 75, 80, ... 120), at most `cap`. */
kiln_status kiln_nvrtc_archs(int *archs, int cap, int *n, kiln_error *err);

/* The include directory handed to NVRTC (env KILN_CUDA_INCLUDE, else the build's toolkit). */
const char *kiln_nvrtc_include_dir(void);

/*
 * The checking macro for NVRTC calls: evaluates `call` (an nvrtcResult
 * expression), and on failure records the call text, file, line and
 * nvrtcGetErrorString in `err`. Yields a kiln_status (KILN_OK on success):
 *     if ((st = KILN_NVRTC_CALL(err, nvrtcCreateProgram(...))) != KILN_OK) goto out;
 * Declared here; the helper it calls lives in codegen/nvrtc/nvrtc.c.
 */
#define KILN_NVRTC_CALL(err, call) kiln_nvrtc_check_((int)(call), #call, __FILE__, __LINE__, (err))
kiln_status kiln_nvrtc_check_(int result, const char *call, const char *file, int line, kiln_error *err);

#endif /* KILN_NVRTC_H */
