/*
 * kind.c — the GPU executor's kind (kiln_rt.h: kiln_executor_kind), which
 * kiln_ctx_new (runtime/api.c) picks by device "gpu" or "auto": the public
 * options, the measurement knobs and the device list (kiln_ctx_options.gpus,
 * parsed and checked against the engine's ranks by kiln_ctx_new) mapped onto
 * kiln_cuda_exec_opts.
 *
 * Devices: no list runs rank r on device r (device 0, n_devices 0); a list
 * gives every rank's device (devices, n_devices = the engine's ranks, 1 for a
 * plain engine) and device is its first, so an executor that reads only
 * `device` runs a plain engine on the GPU asked for. `devices` points into
 * kiln_ctx_new's kiln_gpu_list: valid during kiln_cuda_executor_new only.
 */
#include "kiln_cuda_exec.h"

#include "../kiln_rt.h"

/* "auto" tries the GPU for an engine with a kernels section; without one (compiled for the CPU, or
 * for a model the GPU kernels do not take yet) it is the CPU's, unless knobs or a device list ask for the GPU. */
static bool gpu_auto_for(const kiln_model *m) { return kiln_engine_find(&m->engine, KILN_SECTION_KERNELS) != NULL; }

static kiln_status gpu_create(const kiln_model *m, const kiln_ctx_options *o, const kiln_measure_knobs *k,
                              const kiln_gpu_list *gpus, kiln_executor **x, kiln_error *err) {
    kiln_cuda_exec_opts co = {.max_seqs = o->max_batch,
                              .max_context = o->max_context,
                              .max_step_tokens = o->max_step_tokens, /* 0: the executor sizes it from free memory */
                              .kv_bytes = o->kv_bytes,
                              .kv_fraction = o->kv_fraction,
                              .threads = o->threads,
                              .device = gpus->n ? gpus->ordinal[0] : 0,
                              .devices = gpus->n ? gpus->ordinal : NULL,
                              .n_devices = gpus->n,
                              .tp_timeout_s = o->tp_timeout_s, /* 0: the executor's 60 s */
                              .gemv_max_m = k->gemv_max_m,
                              .attn_waves = k->attn_waves,
                              .lt_tune = k->lt_tune < 0 ? 0 : k->lt_tune + 1,
                              .no_pdl = k->pdl == 0,
                              .no_graphs = k->graphs == 0,
                              .profile = k->profile,
                              .no_recorded = k->recorded == 0,
                              .moe_grouped = k->moe_grouped == 1,
                              .no_qgemv_cc = k->qgemv_cc == 0,
                              .no_qgemm = k->qgemm == 0,
                              .no_w8a8 = k->w8a8 == 0,
                              .no_w8a8_g128 = k->w8a8 == 1,
                              .no_prefill_wg = k->prefill_wg == 0,
                              .no_decode_tc = k->decode_tc == 0,
                              .decode_tc_all = k->decode_tc == 2,
                              .decode_tc_min = k->decode_tc_min,
                              .lt_search = k->lt_search == 1,
                              .no_w8a8_fast_accum = k->w8a8_fast == 0,
                              /* knob 0 (default) never, 1 auto, 2 always; the executor's 1 never, 0 auto,
                               * 2 always. Off by default until it measures faster than NCCL between GPUs */
                              .tp_oneshot = k->tp_oneshot == 1 ? 0 : k->tp_oneshot == 2 ? 2 : 1};
    return kiln_cuda_executor_new(m, &co, x, err);
}

const kiln_executor_kind kiln_executor_gpu = {
    .device = "gpu", .needs_f32 = false, .takes_knobs = true, .takes_gpus = true, .auto_for = gpu_auto_for,
    .create = gpu_create};
