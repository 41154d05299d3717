/*
 * cuda.c — device init, module loading, launches and memory through the CUDA
 * driver API, loaded with dlopen. Contracts in runtime/kiln_cuda.h.
 */
#include "runtime/kiln_cuda.h"

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define KILN_STR_(x) #x
#define KILN_XSTR_(x) KILN_STR_(x)

kiln_status kiln_cu_check_(const kiln_cuda *cu, int result, const char *call, const char *file, int line,
                           kiln_error *err) {
    if (result == CUDA_SUCCESS) return KILN_OK;
    const char *name = NULL, *text = NULL;
    if (cu && cu->api.cuGetErrorName) cu->api.cuGetErrorName((CUresult)result, &name);
    if (cu && cu->api.cuGetErrorString) cu->api.cuGetErrorString((CUresult)result, &text);
    return kiln_err(err, KILN_ERR_DEVICE, "%s:%d: %s failed: %s (%s, CUresult %d)", file, line, call,
                    name ? name : "?", text ? text : "no description", result);
}

/* dlopen the driver and resolve every entry point kiln uses. */
static kiln_status load_driver(kiln_cu_api *api, kiln_error *err) {
    api->lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!api->lib) {
        const char *why = dlerror();
        kiln_err(err, KILN_ERR_DEVICE, "no CUDA driver: dlopen(\"libcuda.so.1\") failed: %s", why ? why : "?");
        return kiln_err_hint(err, "install the NVIDIA driver; kiln needs the driver only, not the CUDA toolkit");
    }
#define KILN_CU_LOAD_(fn)                                                                                    \
    *(void **)&api->fn = dlsym(api->lib, KILN_XSTR_(fn));                                                    \
    if (!api->fn) {                                                                                          \
        kiln_err(err, KILN_ERR_DEVICE, "CUDA driver too old: libcuda.so.1 lacks %s", KILN_XSTR_(fn));      \
        return kiln_err_hint(err, "update the NVIDIA driver to one for CUDA %d.%d or newer", CUDA_VERSION / 1000, \
                             CUDA_VERSION % 1000 / 10);                                                       \
    }
    KILN_CU_FUNCS(KILN_CU_LOAD_)
#undef KILN_CU_LOAD_
    return KILN_OK;
}

kiln_status kiln_cuda_init(kiln_cuda *cu, int ordinal, kiln_error *err) {
    memset(cu, 0, sizeof *cu);
    kiln_status st = load_driver(&cu->api, err);
    if (st) goto fail;
    if ((st = KILN_CU_CALL(cu, err, cu->api.cuInit(0)))) {
        kiln_err_prefix(err, "no CUDA device: ");
        goto fail;
    }
    int count = 0;
    if ((st = KILN_CU_CALL(cu, err, cu->api.cuDeviceGetCount(&count)))) goto fail;
    if (ordinal < 0 || ordinal >= count) {
        st = kiln_err(err, KILN_ERR_DEVICE, "no CUDA device: device %d asked for, the driver sees %d", ordinal, count);
        goto fail;
    }
    cu->ordinal = ordinal;
    if ((st = KILN_CU_CALL(cu, err, cu->api.cuDeviceGet(&cu->dev, ordinal)))) goto fail;
    if ((st = KILN_CU_CALL(cu, err, cu->api.cuDriverGetVersion(&cu->driver_version)))) goto fail;
    if ((st = KILN_CU_CALL(cu, err, cu->api.cuDeviceGetName(cu->name, (int)sizeof cu->name - 1, cu->dev)))) goto fail;
    int major = 0, minor = 0;
    if ((st = KILN_CU_CALL(cu, err, cu->api.cuDeviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, cu->dev))) ||
        (st = KILN_CU_CALL(cu, err, cu->api.cuDeviceGetAttribute(&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, cu->dev))) ||
        (st = KILN_CU_CALL(cu, err, cu->api.cuDeviceGetAttribute(&cu->n_sm, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, cu->dev))) ||
        (st = KILN_CU_CALL(cu, err, cu->api.cuDeviceGetAttribute(&cu->l2_bytes, CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE, cu->dev))) ||
        (st = KILN_CU_CALL(cu, err, cu->api.cuDeviceGetAttribute(&cu->smem_optin, CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN, cu->dev))) ||
        (st = KILN_CU_CALL(cu, err, cu->api.cuDeviceTotalMem(&cu->total_mem, cu->dev))))
        goto fail;
    cu->sm = major * 10 + minor;
    if ((st = KILN_CU_CALL(cu, err, cu->api.cuDevicePrimaryCtxRetain(&cu->ctx, cu->dev)))) goto fail;
    if ((st = KILN_CU_CALL(cu, err, cu->api.cuCtxSetCurrent(cu->ctx)))) {
        cu->api.cuDevicePrimaryCtxRelease(cu->dev);
        goto fail;
    }
    return KILN_OK;
fail:
    if (cu->api.lib) dlclose(cu->api.lib);
    memset(cu, 0, sizeof *cu);
    return st;
}

void kiln_cuda_free(kiln_cuda *cu) {
    if (!cu || !cu->api.lib) return;
    if (cu->ctx) cu->api.cuDevicePrimaryCtxRelease(cu->dev);
    dlclose(cu->api.lib);
    memset(cu, 0, sizeof *cu);
}

kiln_status kiln_cuda_make_current(kiln_cuda *cu, kiln_error *err) {
    return KILN_CU_CALL(cu, err, cu->api.cuCtxSetCurrent(cu->ctx));
}

kiln_status kiln_cuda_sync(kiln_cuda *cu, kiln_error *err) {
    return KILN_CU_CALL(cu, err, cu->api.cuCtxSynchronize());
}

/* ---- modules ---- */

kiln_status kiln_cuda_module_load(kiln_cuda *cu, const kiln_cuda_image *images, int n_images, const char *what,
                                  CUmodule *out, bool *jitted, kiln_error *err) {
    if (!what) what = "module";
    *out = NULL;
    if (jitted) *jitted = false;
    int at = kiln_cuda_pick_image(images, n_images, cu->sm);
    const kiln_cuda_image *pick = at >= 0 ? &images[at] : NULL;
    if (!pick) {
        char offered[512] = "";
        size_t n = 0;
        for (int i = 0; i < n_images && n < sizeof offered - 32; i++)
            n += (size_t)snprintf(offered + n, sizeof offered - n, "%s%s_%d", n ? ", " : "",
                                  images[i].is_ptx ? "compute" : "sm", images[i].sm);
        kiln_err(err, KILN_ERR_UNSUPPORTED, "%s: built for %s; this GPU (%s) is sm_%d and none of those runs on it",
                 what, n ? offered : "no target", cu->name, cu->sm);
        return kiln_err_hint(err, "recompile with --target sm_%d (or with PTX for an older SM)", cu->sm);
    }
    /* The JIT's error log explains a PTX that does not assemble. */
    char jit_log[2048] = "";
    CUjit_option o[3] = {CU_JIT_ERROR_LOG_BUFFER, CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES, CU_JIT_LOG_VERBOSE};
    void *ov[3] = {jit_log, (void *)(uintptr_t)sizeof jit_log, (void *)(uintptr_t)0};
    kiln_status st = KILN_CU_CALL(cu, err, cu->api.cuModuleLoadDataEx(out, pick->data, 3, o, ov));
    if (st) {
        *out = NULL;
        kiln_err_prefix(err, "%s (%s_%d on %s): ", what, pick->is_ptx ? "compute" : "sm", pick->sm, cu->name);
        if (jit_log[0]) kiln_err_hint(err, "JIT log: %.600s", jit_log);
        return st;
    }
    if (jitted) *jitted = pick->is_ptx;
    return KILN_OK;
}

kiln_status kiln_cuda_module_function(kiln_cuda *cu, CUmodule mod, const char *name, CUfunction *out,
                                      kiln_error *err) {
    kiln_status st = KILN_CU_CALL(cu, err, cu->api.cuModuleGetFunction(out, mod, name));
    if (st) kiln_err_prefix(err, "kernel '%s': ", name);
    return st;
}

bool kiln_cuda_module_has(kiln_cuda *cu, CUmodule mod, const char *name, CUfunction *out) {
    *out = NULL;
    unsigned n = 0;
    if (cu->api.cuModuleGetFunctionCount(&n, mod) != CUDA_SUCCESS || n == 0) return false;
    CUfunction *fs = malloc((size_t)n * sizeof *fs);
    if (!fs) return false;
    if (cu->api.cuModuleEnumerateFunctions(fs, n, mod) == CUDA_SUCCESS)
        for (unsigned i = 0; i < n && !*out; i++) {
            const char *fname = NULL;
            if (cu->api.cuFuncGetName(&fname, fs[i]) == CUDA_SUCCESS && fname && strcmp(fname, name) == 0)
                *out = fs[i];
        }
    free(fs);
    return *out != NULL;
}

void kiln_cuda_module_unload(kiln_cuda *cu, CUmodule mod) {
    if (mod) cu->api.cuModuleUnload(mod);
}

kiln_status kiln_cuda_launch(kiln_cuda *cu, CUfunction f, const kiln_cuda_dims *d, CUstream stream, void **args,
                             const char *what, kiln_error *err) {
    return kiln_cuda_launch_ex(cu, f, d, stream, args, false, what, err);
}

kiln_status kiln_cuda_func_smem(kiln_cuda *cu, CUfunction f, unsigned dynamic, const char *what, kiln_error *err) {
    int fixed = 0; /* the kernel's static shared memory: with the dynamic part, past 48 KB needs the opt-in */
    kiln_status st = KILN_CU_CALL(cu, err, cu->api.cuFuncGetAttribute(&fixed, CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES, f));
    if (st) return kiln_err_prefix(err, "kernel '%s': ", what);
    if ((size_t)dynamic + (size_t)fixed <= 48 * 1024) return KILN_OK;
    if ((size_t)dynamic + (size_t)fixed > (size_t)cu->smem_optin)
        return kiln_err(err, KILN_ERR_DEVICE, "kernel '%s': needs %u + %d bytes of shared memory, %s allows %d", what,
                        dynamic, fixed, cu->name, cu->smem_optin);
    st = KILN_CU_CALL(cu, err, cu->api.cuFuncSetAttribute(f, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, (int)dynamic));
    return st ? kiln_err_prefix(err, "kernel '%s': ", what) : KILN_OK;
}

kiln_status kiln_cuda_launch_ex(kiln_cuda *cu, CUfunction f, const kiln_cuda_dims *d, CUstream stream, void **args,
                                bool pdl, const char *what, kiln_error *err) {
    kiln_status st;
    if (!what) what = "kernel";
    if ((st = kiln_cuda_dims_check(d, what, err))) return st;
    if (d->smem > 0 && (st = kiln_cuda_func_smem(cu, f, d->smem, what, err))) return st;
    if (pdl) {
        CUlaunchAttribute at[1];
        memset(at, 0, sizeof at);
        at[0].id = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
        at[0].value.programmaticStreamSerializationAllowed = 1;
        CUlaunchConfig lc = {d->grid[0], d->grid[1], d->grid[2], d->block[0], d->block[1], d->block[2],
                             d->smem, stream, at, 1};
        st = KILN_CU_CALL(cu, err, cu->api.cuLaunchKernelEx(&lc, f, args, NULL));
    } else {
        st = KILN_CU_CALL(cu, err, cu->api.cuLaunchKernel(f, d->grid[0], d->grid[1], d->grid[2], d->block[0],
                                                           d->block[1], d->block[2], d->smem, stream, args, NULL));
    }
    if (st)
        kiln_err_prefix(err, "kernel '%s' (grid %ux%ux%u, block %ux%ux%u, smem %u): ", what, d->grid[0], d->grid[1],
                        d->grid[2], d->block[0], d->block[1], d->block[2], d->smem);
    return st;
}

/* ---- memory ---- */

kiln_status kiln_cuda_alloc(kiln_cuda *cu, size_t bytes, CUdeviceptr *out, kiln_error *err) {
    *out = 0;
    kiln_status st = KILN_CU_CALL(cu, err, cu->api.cuMemAlloc(out, bytes ? bytes : 1));
    if (st) {
        *out = 0;
        size_t free_b = 0, total_b = 0;
        cu->api.cuMemGetInfo(&free_b, &total_b);
        kiln_err_prefix(err, "allocating %zu bytes on %s (%zu of %zu free): ", bytes, cu->name, free_b, total_b);
    }
    return st;
}

void kiln_cuda_release(kiln_cuda *cu, CUdeviceptr p) {
    if (p) cu->api.cuMemFree(p);
}

kiln_status kiln_cuda_upload(kiln_cuda *cu, CUdeviceptr dst, const void *src, size_t bytes, kiln_error *err) {
    if (!bytes) return KILN_OK;
    return KILN_CU_CALL(cu, err, cu->api.cuMemcpyHtoD(dst, src, bytes));
}

kiln_status kiln_cuda_download(kiln_cuda *cu, void *dst, CUdeviceptr src, size_t bytes, kiln_error *err) {
    if (!bytes) return KILN_OK;
    return KILN_CU_CALL(cu, err, cu->api.cuMemcpyDtoH(dst, src, bytes));
}

kiln_status kiln_cuda_fill16(kiln_cuda *cu, CUdeviceptr dst, uint16_t pattern, size_t bytes, kiln_error *err) {
    if (bytes % 2) return kiln_err(err, KILN_ERR_INVALID_ARG, "kiln_cuda_fill16: %zu bytes is odd", bytes);
    if (!bytes) return KILN_OK;
    return KILN_CU_CALL(cu, err, cu->api.cuMemsetD16(dst, pattern, bytes / 2));
}

kiln_status kiln_cuda_fill32(kiln_cuda *cu, CUdeviceptr dst, uint32_t pattern, size_t bytes, kiln_error *err) {
    if (bytes % 4) return kiln_err(err, KILN_ERR_INVALID_ARG, "kiln_cuda_fill32: %zu bytes is not a multiple of 4", bytes);
    if (!bytes) return KILN_OK;
    return KILN_CU_CALL(cu, err, cu->api.cuMemsetD32(dst, pattern, bytes / 4));
}
