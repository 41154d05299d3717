/*
 * nvrtc_stub.c — the NVRTC entry points in a build without the CUDA toolkit.
 * Each says plainly that this kiln was built without CUDA, so the compiler
 * can still be built and run (everything but kernel compilation works).
 */
#include "codegen/kiln_nvrtc.h"

static kiln_status no_cuda(const char *name, kiln_error *err) {
    kiln_err(err, KILN_ERR_UNSUPPORTED, "nvrtc: cannot compile kernel '%s': this kiln was built without CUDA",
             name ? name : "(unnamed)");
    return kiln_err_hint(err, "install the CUDA toolkit and rebuild (cmake finds it through find_package(CUDAToolkit))");
}

kiln_status kiln_nvrtc_check_(int result, const char *call, const char *file, int line, kiln_error *err) {
    (void)file; (void)line;
    return result == 0 ? KILN_OK : no_cuda(call, err);
}

kiln_status kiln_nvrtc_compile_ex(const char *src, const char *name, const char *const *defines, int n_defines,
                                  int sm, bool want_ptx, kiln_buf *cubin_out, kiln_buf *ptx_out,
                                  const kiln_nvrtc_opts *opts, kiln_error *err) {
    (void)src; (void)defines; (void)n_defines; (void)sm; (void)want_ptx; (void)cubin_out; (void)ptx_out; (void)opts;
    return no_cuda(name, err);
}

kiln_status kiln_nvrtc_compile(const char *src, const char *name, const char *const *defines, int n_defines, int sm,
                               bool want_ptx, kiln_buf *cubin_out, kiln_buf *ptx_out, kiln_error *err) {
    return kiln_nvrtc_compile_ex(src, name, defines, n_defines, sm, want_ptx, cubin_out, ptx_out, NULL, err);
}

kiln_status kiln_nvrtc_version(int *out, kiln_error *err) {
    *out = 0;
    return no_cuda("(version)", err);
}

kiln_status kiln_nvrtc_archs(int *archs, int cap, int *n, kiln_error *err) {
    (void)archs, (void)cap;
    *n = 0;
    return no_cuda("(supported architectures)", err);
}

const char *kiln_nvrtc_include_dir(void) { return ""; }
