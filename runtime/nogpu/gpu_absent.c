/*
 * gpu_absent.c — the GPU executor's kind (kiln_rt.h) in a build without the
 * CUDA toolkit: device "gpu" is unavailable (KILN_ERR_DEVICE), so "auto"
 * takes the CPU (unless measurement knobs or a device list ask for the GPU:
 * then it is this error). CMakeLists.txt compiles this file or
 * runtime/cuda/kind.c.
 */
#include "../kiln_rt.h"

static kiln_status absent_create(const kiln_model *m, const kiln_ctx_options *o, const kiln_measure_knobs *k,
                                 const kiln_gpu_list *gpus, struct kiln_executor **x, kiln_error *err) {
    (void)m, (void)o, (void)k, (void)gpus;
    *x = NULL;
    kiln_err(err, KILN_ERR_DEVICE, "device \"gpu\": this build has no GPU executor");
    return kiln_err_hint(err, "use device \"cpu\", or \"auto\" to take the GPU where there is one");
}

/* "auto" tries it (auto_for NULL) and passes to the CPU, as on a host without a GPU */
const kiln_executor_kind kiln_executor_gpu = {
    .device = "gpu", .needs_f32 = false, .takes_knobs = true, .takes_gpus = true, .auto_for = NULL,
    .create = absent_create};
