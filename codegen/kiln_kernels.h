/*
 * kiln_kernels.h — the kernels section of an engine: which GPU modules a
 * plan needs, their CUDA C (kernels/ templates specialised by #defines of
 * the model's constants), compiled by NVRTC for each target, packed in the
 * layout of format/kiln_ksec.h.
 *
 * Targets: a cubin per listed SM (sm_80 ...) and PTX per listed compute
 * capability (compute_90 ...), which the driver JIT-compiles on newer GPUs.
 * "default" = sm_80,sm_86,sm_89,sm_90,compute_90; "none" = no kernels (the
 * engine still runs on the CPU executor).
 *
 * Modules whose source text is identical (a model's GEMVs often differ
 * only in name) share one stored source and one set of images, so
 * compilation runs one NVRTC job per (distinct source x target SM), as
 * tasks on the process-wide thread pool (common/kiln_pool.h), at most
 * `threads` at once; the NVRTC cache (codegen/kiln_nvrtc.h) makes a second
 * compile of the same model nearly free. The result is deterministic: the
 * same plan and targets give the same bytes.
 */
#ifndef KILN_KERNELS_H
#define KILN_KERNELS_H

#include <stdbool.h>

#include "../common/kiln_util.h"
#include "../format/kiln_plan.h"
#include "../format/kiln_ksec.h"

#define KILN_MAX_TARGETS 16
#define KILN_KERNELS_MIN_SM 80    /* cp.async, ldmatrix and bf16 mma.sync (kernels/) */
#define KILN_KERNELS_MAX_BLOCK 256 /* the largest KV block size; format/ksec.c refuses more */

typedef struct kiln_kernel_targets {
    int n_cubin, n_ptx;
    int cubin_sm[KILN_MAX_TARGETS]; /* ascending, no duplicates */
    int ptx_sm[KILN_MAX_TARGETS];
} kiln_kernel_targets;

/* Parse a target list: "default", "none", or comma-separated sm_NN /
 * compute_NN (NN from KILN_KERNELS_MIN_SM to 999). Errors name the item at
 * fault. */
kiln_status kiln_kernel_targets_parse(const char *spec, kiln_kernel_targets *t, kiln_error *err);
/* Every target is one this kiln's NVRTC compiles for (KILN_ERR_UNSUPPORTED
 * naming it, and listing those it can, when not; also when there is no NVRTC
 * and t is not empty). */
kiln_status kiln_kernel_targets_check(const kiln_kernel_targets *t, kiln_error *err);
/* The KV block sizes the kernels take: powers of two from 1 to KILN_KERNELS_MAX_BLOCK. */
kiln_status kiln_kernels_check_block_size(int block_size, kiln_error *err);
/* The i-th target's name ("sm_90", "compute_90"), cubins first; i < n_cubin + n_ptx. */
void kiln_kernel_target_name(const kiln_kernel_targets *t, int i, char *buf, size_t cap);

/* One GPU module a plan needs, as codegen writes it for NVRTC. */
typedef struct kiln_kernel_module {
    char name[KILN_KSEC_NAME_MAX]; /* what the runtime finds it by */
    int32_t cfg[KILN_KSEC_CFG_N];  /* its launch parameters (kiln_ksec.h) */
    kiln_buf src;                  /* its CUDA C: #defines, then the template's #include */
    int owner; /* the first module with byte-identical src (whose source and images it shares); its own index if none */
} kiln_kernel_module;

typedef struct kiln_kernel_modules {
    kiln_kernel_module *mods; /* in the section's order */
    int n;
    int n_sources; /* modules that own their source: what NVRTC compiles, per target SM */
    bool f32;      /* built for f32 (every weight is f32), else bf16 */
    int kv8;       /* the KV cache in 8 bits: 1 FP8 E4M3, 2 int8 (attention +kv_fp8 / +kv_int8: KILN_KV8), 0 = elements */
} kiln_kernel_modules;

/* The modules a checked plan needs with a KV block size (0 = 16), their
 * sources and who shares whose. Needs no NVRTC. Errors as kiln_kernels_build's
 * for the plan's constants. Free with kiln_kernel_modules_free. */
kiln_status kiln_kernels_modules(const kiln_plan *p, int kv_block_size, kiln_kernel_modules *out, kiln_error *err);
void kiln_kernel_modules_free(kiln_kernel_modules *m);

typedef struct kiln_kernels_opts {
    int threads;        /* NVRTC jobs at once (0 = one per core) */
    int kv_block_size;  /* tokens per KV block (0 = 16) */
    bool no_cache;      /* bypass the NVRTC cache */
    struct kiln_progress *progress; /* NVRTC builds done / to do (common/kiln_progress.h); NULL = none */
} kiln_kernels_opts;

/* Build the kernels section for a checked plan. Needs NVRTC
 * (KILN_ERR_UNSUPPORTED in builds without CUDA); a plan whose constants the
 * kernels cannot take (e.g. a head_dim they do not support) gives
 * KILN_ERR_UNSUPPORTED naming the constant. NVRTC errors carry the module
 * name (the first of those sharing the source), the target and NVRTC's log. */
kiln_status kiln_kernels_build(const kiln_plan *p, const kiln_kernel_targets *t, const kiln_kernels_opts *o,
                               kiln_buf *out, kiln_error *err);

/* The first op of `p` the CUDA executor cannot run (no GPU kernel or lowering yet: unfused ops,
 * unpacked projections, head_rmsnorm), or -1 when it runs all of them. */
int kiln_kernels_unsupported_op(const kiln_plan *p);
/* The first weight of `p` stored in a format the GPU kernels do not read, or -1; *why (when not
 * NULL) then says what they lack in a phrase ("...: the GPU kernels read quantized weights only in
 * bf16/f16 engines"). The kernels read q8 and q4g* matrices of GEMV ops (linear, the packed q/k/v
 * and gate/up, the LM head) in bf16 and f16 engines, and as the embedding table (which the runtime
 * dequantizes at load); not beside f32 matrices (an f32 engine: its kernels compute in f32) and not
 * q8 with a column count their 16-byte loads do not divide. */
int kiln_kernels_unsupported_weight(const kiln_plan *p, const char **why);

#endif /* KILN_KERNELS_H */
