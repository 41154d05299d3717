/*
 * kind.c — the GPU executor's kind (kiln_rt.h: kiln_executor_kind), which
 * kiln_ctx_new (runtime/api.c) picks by device "gpu" or "auto": the public
 * options and the measurement knobs mapped onto kiln_cuda_exec_opts.
 */
#include "kiln_cuda_exec.h"

#include "../kiln_rt.h"

/* "auto" tries the GPU for an engine with a kernels section; without one (compiled for the CPU, or
 * for a model the GPU kernels do not take yet) it is the CPU's, unless knobs ask for the GPU. */
static bool gpu_auto_for(const kiln_model *m) { return kiln_engine_find(&m->engine, KILN_SECTION_KERNELS) != NULL; }

static kiln_status gpu_create(const kiln_model *m, const kiln_ctx_options *o, const kiln_measure_knobs *k,
                              kiln_executor **x, kiln_error *err) {
    kiln_cuda_exec_opts co = {.max_seqs = o->max_batch,
                              .max_context = o->max_context,
                              .max_step_tokens = o->max_step_tokens, /* 0: the executor sizes it from free memory */
                              .kv_bytes = o->kv_bytes,
                              .kv_fraction = o->kv_fraction,
                              .threads = o->threads,
                              .gemv_max_m = k->gemv_max_m,
                              .attn_waves = k->attn_waves,
                              .lt_tune = k->lt_tune < 0 ? 0 : k->lt_tune + 1,
                              .no_pdl = k->pdl == 0,
                              .no_graphs = k->graphs == 0,
                              .profile = k->profile,
                              .no_recorded = k->recorded == 0,
                              .moe_grouped = k->moe_grouped == 1};
    return kiln_cuda_executor_new(m, &co, x, err);
}

const kiln_executor_kind kiln_executor_gpu = {
    .device = "gpu", .needs_f32 = false, .takes_knobs = true, .auto_for = gpu_auto_for, .create = gpu_create};
