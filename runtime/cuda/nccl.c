/*
 * nccl.c — NCCL through dlopen (kiln_nccl.h).
 */
#include "kiln_nccl.h"

#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

kiln_status kiln_nccl_load(kiln_nccl *n, int n_ranks, kiln_error *err) {
    memset(n, 0, sizeof *n);
    n->lib = dlopen(KILN_NCCL_SONAME, RTLD_NOW | RTLD_LOCAL);
    if (!n->lib) {
        const char *why = dlerror();
        kiln_err(err, KILN_ERR_MISSING, "NCCL: cannot load %s, which an engine of %d tensor-parallel ranks on "
                 "%d GPUs needs: %s", KILN_NCCL_SONAME, n_ranks, n_ranks, why ? why : "?");
        return kiln_err_hint(err, "install NCCL 2.13 or newer (Debian/Ubuntu: libnccl2) or put the folder of %s "
                                  "on LD_LIBRARY_PATH; or compile the engine with --tp 1", KILN_NCCL_SONAME);
    }
    struct {
        const char *name;
        void **fn;
    } syms[] = {
        {"ncclGetVersion", (void **)&n->GetVersion},       {"ncclCommInitAll", (void **)&n->CommInitAll},
        {"ncclAllReduce", (void **)&n->AllReduce},         {"ncclAllGather", (void **)&n->AllGather},
        {"ncclGroupStart", (void **)&n->GroupStart},       {"ncclGroupEnd", (void **)&n->GroupEnd},
        {"ncclCommGetAsyncError", (void **)&n->CommGetAsyncError},
        {"ncclCommAbort", (void **)&n->CommAbort},         {"ncclCommDestroy", (void **)&n->CommDestroy},
        {"ncclGetErrorString", (void **)&n->GetErrorString}, {"ncclGetLastError", (void **)&n->GetLastError},
    };
    for (size_t i = 0; i < sizeof syms / sizeof syms[0]; i++)
        if (!(*syms[i].fn = dlsym(n->lib, syms[i].name))) {
            kiln_err(err, KILN_ERR_MISSING, "NCCL: %s has no symbol %s", KILN_NCCL_SONAME, syms[i].name);
            kiln_nccl_unload(n);
            return kiln_err_hint(err, "install NCCL 2.13 or newer");
        }
    if (n->GetVersion(&n->version) != KILN_NCCL_SUCCESS || n->version < KILN_NCCL_MIN_VERSION) {
        int v = n->version;
        kiln_err(err, KILN_ERR_MISSING, "NCCL: %s is version %d.%d.%d; kiln needs %d.%d or newer", KILN_NCCL_SONAME,
                 v / 10000, v / 100 % 100, v % 100, KILN_NCCL_MIN_VERSION / 10000, KILN_NCCL_MIN_VERSION / 100 % 100);
        kiln_nccl_unload(n);
        return kiln_err_hint(err, "install a newer NCCL (libnccl2)");
    }
    return KILN_OK;
}

void kiln_nccl_unload(kiln_nccl *n) {
    if (n->lib) dlclose(n->lib);
    memset(n, 0, sizeof *n);
}

void kiln_nccl_version_str(const kiln_nccl *n, char *buf, size_t cap) {
    snprintf(buf, cap, "%d.%d.%d", n->version / 10000, n->version / 100 % 100, n->version % 100);
}

kiln_status kiln_nccl_check_(const kiln_nccl *n, int result, kiln_nccl_comm comm, const char *call, const char *file,
                             int line, kiln_error *err) {
    if (result == KILN_NCCL_SUCCESS) return KILN_OK;
    const char *text = n->GetErrorString ? n->GetErrorString(result) : NULL;
    const char *last = n->GetLastError ? n->GetLastError(comm) : NULL;
    return kiln_err(err, KILN_ERR_DEVICE, "%s:%d: %s failed: %s (ncclResult_t %d)%s%s", file, line, call,
                    text ? text : "?", result, last && *last ? ": " : "", last && *last ? last : "");
}
