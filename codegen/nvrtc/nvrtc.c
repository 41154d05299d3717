/*
 * nvrtc.c — CUDA C → cubin/PTX through NVRTC, with an on-disk cache.
 * Contracts in codegen/kiln_nvrtc.h.
 *
 * Decisions:
 * - Every embedded kernel template is handed to NVRTC as a named header, so a
 *   generated source can `#include "gemv.cuh"` without any file on disk.
 * - A cubin and PTX need two NVRTC runs (sm_XX gives the cubin, compute_XX
 *   the portable PTX); both are cached together under one key.
 * - Cache entries are whole files written to a temporary name and renamed,
 *   so a concurrent reader sees either nothing or a complete entry; each
 *   entry carries its own length and checksum, and a bad one is a miss.
 * - NVRTC is loaded with dlopen on first use (nvrtc_load), not linked: kiln
 *   starts, runs and inspects engines on hosts without the toolkit, and only
 *   compiling a kernel needs libnvrtc. Its entry points live in one table
 *   filled once (pthread_once) and read-only afterwards: the library is
 *   loaded once per process, like the driver's own state, so this is the one
 *   piece of process-wide state here. The soname comes from the toolkit kiln
 *   was built with (libnvrtc.so.13); the build's toolkit folder is tried
 *   after the library path, so a build tree works without ldconfig.
 */
#include "codegen/kiln_nvrtc.h"

#include <dlfcn.h>
#include <errno.h>
#include <nvrtc.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#ifndef KILN_CUDA_INCLUDE_DEFAULT
#define KILN_CUDA_INCLUDE_DEFAULT "/usr/local/cuda/include"
#endif

/* Room for NVRTC's log inside a kiln_error message (the rest is context). */
#define KILN_NVRTC_LOG_IN_MSG 700
#define KILN_NVRTC_MAX_DEFINES 256
#define KILN_NVRTC_CACHE_MAGIC 0x434e4c4bu /* "KLNC" little-endian */
#define KILN_NVRTC_CACHE_VERSION 1u
#define KILN_NVRTC_CACHE_HDR 36 /* magic u32, version u32, cubin len u64, ptx len u64, xxh64 u64, pad u32 */

#ifndef KILN_NVRTC_SONAME
#define KILN_NVRTC_SONAME "libnvrtc.so"
#endif

/* ---- NVRTC, loaded on first use ---- */

#define KILN_NVRTC_FUNCS(X)                                                                                     \
    X(nvrtcGetErrorString) X(nvrtcVersion) X(nvrtcCreateProgram) X(nvrtcCompileProgram) X(nvrtcDestroyProgram) \
    X(nvrtcGetProgramLogSize) X(nvrtcGetProgramLog) X(nvrtcGetCUBINSize) X(nvrtcGetCUBIN) X(nvrtcGetPTXSize)    \
    X(nvrtcGetPTX) X(nvrtcGetNumSupportedArchs) X(nvrtcGetSupportedArchs)
#define KILN_NVRTC_MEMBER_(fn) __typeof__(fn) *fn;

typedef struct kiln_nvrtc_api {
    void *lib;        /* dlopen handle; NULL when loading failed */
    char why[600];    /* dlerror of the failed load, "" after success */
    KILN_NVRTC_FUNCS(KILN_NVRTC_MEMBER_)
} kiln_nvrtc_api;

static kiln_nvrtc_api g_nvrtc; /* filled once by nvrtc_load_once, then read-only */
static pthread_once_t g_nvrtc_once = PTHREAD_ONCE_INIT;

static void nvrtc_load_once(void) {
    kiln_nvrtc_api *a = &g_nvrtc;
    a->lib = dlopen(KILN_NVRTC_SONAME, RTLD_NOW | RTLD_LOCAL);
    if (!a->lib) {
        const char *e = dlerror();
        snprintf(a->why, sizeof a->why, "%s", e ? e : "?");
#ifdef KILN_NVRTC_BUILD_DIR
        a->lib = dlopen(KILN_NVRTC_BUILD_DIR "/" KILN_NVRTC_SONAME, RTLD_NOW | RTLD_LOCAL);
#endif
        if (!a->lib) return;
    }
#define KILN_NVRTC_LOAD_(fn)                                                            \
    if (!(*(void **)&a->fn = dlsym(a->lib, #fn))) {                                     \
        snprintf(a->why, sizeof a->why, "%s has no symbol %s", KILN_NVRTC_SONAME, #fn); \
        dlclose(a->lib);                                                                \
        a->lib = NULL;                                                                  \
        return;                                                                         \
    }
    KILN_NVRTC_FUNCS(KILN_NVRTC_LOAD_)
#undef KILN_NVRTC_LOAD_
    a->why[0] = 0;
}

/* The NVRTC table, loading the library on the first call; NULL (and
 * KILN_ERR_MISSING naming the library, with a hint) when it cannot be loaded. */
static const kiln_nvrtc_api *nvrtc_api(kiln_error *err) {
    pthread_once(&g_nvrtc_once, nvrtc_load_once);
    if (g_nvrtc.lib) return &g_nvrtc;
    kiln_err(err, KILN_ERR_MISSING, "nvrtc: cannot load %s, which compiling kernels needs: %s", KILN_NVRTC_SONAME,
             g_nvrtc.why);
    kiln_err_hint(err, "install the CUDA toolkit's NVRTC (%s) or put its folder on LD_LIBRARY_PATH, or compile "
                       "with --target none for an engine without GPU kernels; running an engine (kiln run, "
                       "kiln-run) does not need NVRTC", KILN_NVRTC_SONAME);
    return NULL;
}

kiln_status kiln_nvrtc_check_(int result, const char *call, const char *file, int line, kiln_error *err) {
    if (result == NVRTC_SUCCESS) return KILN_OK;
    const char *what = g_nvrtc.lib ? g_nvrtc.nvrtcGetErrorString((nvrtcResult)result) : "?";
    return kiln_err(err, KILN_ERR_DEVICE, "%s:%d: %s failed: %s (nvrtcResult %d)", file, line, call, what, result);
}

const char *kiln_nvrtc_include_dir(void) {
    const char *env = getenv("KILN_CUDA_INCLUDE");
    return (env && *env) ? env : KILN_CUDA_INCLUDE_DEFAULT;
}

kiln_status kiln_nvrtc_version(int *out, kiln_error *err) {
    int major = 0, minor = 0;
    const kiln_nvrtc_api *nv = nvrtc_api(err);
    if (!nv) return KILN_ERR_MISSING;
    kiln_status st = KILN_NVRTC_CALL(err, nv->nvrtcVersion(&major, &minor));
    if (st) return st;
    *out = major * 1000 + minor * 10;
    return KILN_OK;
}

kiln_status kiln_nvrtc_archs(int *archs, int cap, int *n, kiln_error *err) {
    *n = 0;
    int count = 0;
    const kiln_nvrtc_api *nv = nvrtc_api(err);
    if (!nv) return KILN_ERR_MISSING;
    kiln_status st = KILN_NVRTC_CALL(err, nv->nvrtcGetNumSupportedArchs(&count));
    if (st) return st;
    int *all = calloc(count > 0 ? (size_t)count : 1, sizeof *all);
    if (!all) return kiln_err(err, KILN_ERR_NOMEM, "nvrtc: out of memory");
    if ((st = KILN_NVRTC_CALL(err, nv->nvrtcGetSupportedArchs(all))) == KILN_OK)
        for (int i = 0; i < count && *n < cap; i++) archs[(*n)++] = all[i];
    free(all);
    return st;
}

/* A define is NAME or NAME=VALUE, NAME a C identifier, VALUE on one line. */
static bool define_ok(const char *d) {
    if (!d || !(*d == '_' || (*d >= 'A' && *d <= 'Z') || (*d >= 'a' && *d <= 'z'))) return false;
    const char *p = d;
    while (*p && *p != '=') {
        char c = *p++;
        if (!(c == '_' || (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9')))
            return false;
    }
    for (; *p; p++)
        if (*p == '\n' || *p == '\r') return false;
    return strlen(d) < 4096;
}

/* ---- cache ---- */

static char *cache_dir_path(const kiln_nvrtc_opts *opts) {
    if (opts && opts->cache_dir) return strdup(opts->cache_dir);
    const char *xdg = getenv("XDG_CACHE_HOME");
    if (xdg && *xdg) return kiln_path_join(xdg, "kiln");
    const char *home = getenv("HOME");
    if (!home || !*home) return NULL;
    return kiln_path_join(home, ".cache/kiln");
}

/* mkdir -p; true when the folder exists afterwards. */
static bool make_dirs(const char *path) {
    char *p = strdup(path);
    if (!p) return false;
    for (char *s = p + 1; *s; s++) {
        if (*s != '/') continue;
        *s = 0;
        if (mkdir(p, 0755) != 0 && errno != EEXIST) { free(p); return false; }
        *s = '/';
    }
    bool ok = mkdir(p, 0755) == 0 || errno == EEXIST;
    free(p);
    return ok && kiln_path_is_dir(path);
}

static void hash_str(XXH3_state_t *h, const char *s) {
    uint64_t n = s ? strlen(s) : 0;
    XXH3_128bits_update(h, &n, sizeof n); /* length prefix: no ambiguity between fields */
    if (n) XXH3_128bits_update(h, s, n);
}

/* The cache key as 32 hex digits. */
static void cache_key(const char *src, const char *const *defines, int n_defines, int sm, bool want_ptx,
                      int nvrtc_ver, bool line_info, char out[33]) {
    XXH3_state_t *h = XXH3_createState();
    if (!h) { out[0] = 0; return; }
    XXH3_128bits_reset(h);
    hash_str(h, "kiln-nvrtc-cache-v1");
    hash_str(h, src);
    for (size_t i = 0; i < kiln_kernel_src_count(); i++) {
        hash_str(h, kiln_kernel_src_at(i)->name);
        hash_str(h, kiln_kernel_src_at(i)->text);
    }
    for (int i = 0; i < n_defines; i++) hash_str(h, defines[i]);
    int32_t nums[4] = {sm, want_ptx, nvrtc_ver, line_info};
    XXH3_128bits_update(h, nums, sizeof nums);
    hash_str(h, kiln_nvrtc_include_dir());
    XXH128_hash_t d = XXH3_128bits_digest(h);
    XXH3_freeState(h);
    snprintf(out, 33, "%016llx%016llx", (unsigned long long)d.high64, (unsigned long long)d.low64);
}

/* Read a cache entry; false (and outputs untouched) on a miss or a damaged entry. */
static bool cache_read(const char *path, bool want_ptx, kiln_buf *cubin, kiln_buf *ptx) {
    kiln_mapped_file f = {0};
    kiln_error e = {0};
    if (!kiln_path_exists(path) || kiln_file_map(path, &f, &e) != KILN_OK) return false;
    bool ok = false;
    if (f.size < KILN_NVRTC_CACHE_HDR) goto out;
    const uint8_t *p = f.data;
    uint64_t nc = kiln_rd_u64(p + 8), np = kiln_rd_u64(p + 16), sum = kiln_rd_u64(p + 24), total;
    if (kiln_rd_u32(p) != KILN_NVRTC_CACHE_MAGIC || kiln_rd_u32(p + 4) != KILN_NVRTC_CACHE_VERSION) goto out;
    if (!kiln_add_u64(nc, np, &total) || !kiln_add_u64(total, KILN_NVRTC_CACHE_HDR, &total) || total != f.size)
        goto out;
    if (XXH64(p + KILN_NVRTC_CACHE_HDR, nc + np, 0) != sum) goto out;
    if (nc == 0 || (want_ptx && np == 0)) goto out;
    if (cubin) {
        cubin->len = 0;
        if (!kiln_buf_append(cubin, p + KILN_NVRTC_CACHE_HDR, nc)) goto out;
    }
    if (ptx && want_ptx) {
        ptx->len = 0;
        if (!kiln_buf_append(ptx, p + KILN_NVRTC_CACHE_HDR + nc, np) || !kiln_buf_append(ptx, "", 1)) goto out;
        ptx->len--; /* keep the NUL but not in len */
    }
    ok = true;
out:
    kiln_file_unmap(&f);
    return ok;
}

/* Best effort: a cache that cannot be written only costs time later. */
static void cache_write(const char *dir, const char *path, const kiln_buf *cubin, const kiln_buf *ptx) {
    if (!make_dirs(dir)) return;
    kiln_buf b = {0};
    uint64_t np = ptx ? ptx->len : 0;
    uint8_t hdr[KILN_NVRTC_CACHE_HDR] = {0};
    kiln_wr_u32(hdr, KILN_NVRTC_CACHE_MAGIC);
    kiln_wr_u32(hdr + 4, KILN_NVRTC_CACHE_VERSION);
    kiln_wr_u64(hdr + 8, cubin->len);
    kiln_wr_u64(hdr + 16, np);
    kiln_buf_append(&b, hdr, sizeof hdr);
    kiln_buf_append(&b, cubin->data, cubin->len);
    if (np) kiln_buf_append(&b, ptx->data, np);
    if (b.failed) goto out;
    kiln_wr_u64(b.data + 24, XXH64(b.data + KILN_NVRTC_CACHE_HDR, b.len - KILN_NVRTC_CACHE_HDR, 0));
    size_t tl = strlen(path) + 32;
    char *tmp = malloc(tl);
    if (!tmp) goto out;
    snprintf(tmp, tl, "%s.tmp.%ld", path, (long)getpid());
    int slot = kiln_guard_temp_add(tmp); /* a signal mid-write unlinks it (common/guard.c) */
    FILE *fp = fopen(tmp, "wb");
    if (fp) {
        bool wrote = fwrite(b.data, 1, b.len, fp) == b.len;
        if (fclose(fp) == 0 && wrote && rename(tmp, path) == 0) {
            kiln_guard_temp_remove(slot);
            free(tmp);
            goto out;
        }
    }
    unlink(tmp);
    kiln_guard_temp_remove(slot);
    free(tmp);
out:
    kiln_buf_free(&b);
}

/* ---- compile ---- */

/* One NVRTC run for `arch` ("sm_90" or "compute_90"); fills `code` with a cubin or PTX. */
static kiln_status compile_once(const char *src, const char *name, const char *const *defines, int n_defines,
                                const char *arch, bool cubin, bool line_info, kiln_buf *code, kiln_buf *log_out,
                                kiln_error *err) {
    kiln_status st = KILN_OK;
    const kiln_nvrtc_api *nv = nvrtc_api(err);
    if (!nv) return KILN_ERR_MISSING;
    nvrtcProgram prog = NULL;
    size_t nh = kiln_kernel_src_count();
    const char **htext = calloc(nh ? nh : 1, sizeof *htext);
    const char **hname = calloc(nh ? nh : 1, sizeof *hname);
    const char **opts = calloc((size_t)n_defines + 8, sizeof *opts);
    char **owned = calloc((size_t)n_defines + 8, sizeof *owned);
    int n_opts = 0, n_owned = 0;
    char *log = NULL;
    if (!htext || !hname || !opts || !owned) {
        st = kiln_err(err, KILN_ERR_NOMEM, "nvrtc: out of memory compiling kernel '%s'", name);
        goto out;
    }
    for (size_t i = 0; i < nh; i++) {
        htext[i] = kiln_kernel_src_at(i)->text;
        hname[i] = kiln_kernel_src_at(i)->name;
    }
    /* Options; each owned string is freed at the end. */
    char tmp[4200];
    /* an sm_90 cubin is built as sm_90a: it runs only on sm_90 either way, and the 'a' features
     * (wgmma: kiln_attn_prefill_wg) exist only there */
    snprintf(tmp, sizeof tmp, "--gpu-architecture=%s%s", arch, cubin && !strcmp(arch, "sm_90") ? "a" : "");
    owned[n_owned] = strdup(tmp);
    opts[n_opts++] = owned[n_owned++];
    snprintf(tmp, sizeof tmp, "-I%s", kiln_nvrtc_include_dir());
    owned[n_owned] = strdup(tmp);
    opts[n_opts++] = owned[n_owned++];
    opts[n_opts++] = "-std=c++17";
    opts[n_opts++] = "-DKILN_NVRTC=1";
    if (line_info) opts[n_opts++] = "-lineinfo";
    for (int i = 0; i < n_defines; i++) {
        snprintf(tmp, sizeof tmp, "-D%s", defines[i]);
        owned[n_owned] = strdup(tmp);
        opts[n_opts++] = owned[n_owned++];
    }
    for (int i = 0; i < n_owned; i++)
        if (!owned[i]) {
            st = kiln_err(err, KILN_ERR_NOMEM, "nvrtc: out of memory compiling kernel '%s'", name);
            goto out;
        }

    if ((st = KILN_NVRTC_CALL(err, nv->nvrtcCreateProgram(&prog, src, name, (int)nh, htext, hname))) != KILN_OK) {
        prog = NULL;
        kiln_err_prefix(err, "kernel '%s': ", name);
        goto out;
    }
    nvrtcResult cr = nv->nvrtcCompileProgram(prog, n_opts, opts);
    size_t log_size = 0;
    if (nv->nvrtcGetProgramLogSize(prog, &log_size) == NVRTC_SUCCESS && log_size > 1) {
        log = malloc(log_size);
        if (log && nv->nvrtcGetProgramLog(prog, log) != NVRTC_SUCCESS) log[0] = 0;
    }
    if (log_out && log) kiln_buf_append(log_out, log, strlen(log));
    if (cr != NVRTC_SUCCESS) {
        /* Keep the log's start: the first error is the one that explains the rest. */
        st = kiln_err(err, KILN_ERR_DEVICE, "nvrtc: compiling kernel '%s' for %s failed: %s\n%.*s", name, arch,
                      nv->nvrtcGetErrorString(cr), KILN_NVRTC_LOG_IN_MSG, log ? log : "(no log)");
        goto out;
    }
    size_t n = 0;
    if (cubin) {
        if ((st = KILN_NVRTC_CALL(err, nv->nvrtcGetCUBINSize(prog, &n))) != KILN_OK) goto out;
    } else {
        if ((st = KILN_NVRTC_CALL(err, nv->nvrtcGetPTXSize(prog, &n))) != KILN_OK) goto out;
    }
    code->len = 0;
    if (!kiln_buf_reserve(code, n + 1)) {
        st = kiln_err(err, KILN_ERR_NOMEM, "nvrtc: out of memory for the code of kernel '%s'", name);
        goto out;
    }
    if (cubin) {
        if ((st = KILN_NVRTC_CALL(err, nv->nvrtcGetCUBIN(prog, (char *)code->data))) != KILN_OK) goto out;
        code->len = n;
    } else {
        if ((st = KILN_NVRTC_CALL(err, nv->nvrtcGetPTX(prog, (char *)code->data))) != KILN_OK) goto out;
        code->data[n] = 0;
        code->len = strlen((char *)code->data); /* n counts the NUL */
    }
out:
    if (prog) nv->nvrtcDestroyProgram(&prog);
    for (int i = 0; i < n_owned; i++) free(owned[i]);
    free(owned);
    free(opts);
    free(htext);
    free(hname);
    free(log);
    return st;
}

kiln_status kiln_nvrtc_compile_ex(const char *src, const char *name, const char *const *defines, int n_defines,
                                  int sm, bool want_ptx, kiln_buf *cubin_out, kiln_buf *ptx_out,
                                  const kiln_nvrtc_opts *opts, kiln_error *err) {
    kiln_status st = KILN_OK;
    char *dir = NULL, *path = NULL;
    kiln_buf cubin = {0}, ptx = {0};
    if (!name || !*name) name = "(unnamed)";
    if (!src) return kiln_err(err, KILN_ERR_INVALID_ARG, "nvrtc: kernel '%s': no source", name);
    if (sm < 50 || sm > 999)
        return kiln_err(err, KILN_ERR_INVALID_ARG, "nvrtc: kernel '%s': target SM %d is not valid (want e.g. 80, 90)",
                        name, sm);
    if (n_defines < 0 || n_defines > KILN_NVRTC_MAX_DEFINES || (n_defines > 0 && !defines))
        return kiln_err(err, KILN_ERR_INVALID_ARG, "nvrtc: kernel '%s': %d defines (at most %d)", name, n_defines,
                        KILN_NVRTC_MAX_DEFINES);
    for (int i = 0; i < n_defines; i++)
        if (!define_ok(defines[i]))
            return kiln_err(err, KILN_ERR_INVALID_ARG,
                            "nvrtc: kernel '%s': define %d (\"%s\") is not NAME or NAME=VALUE on one line", name, i,
                            defines[i] ? defines[i] : "(null)");
    if (opts && opts->cache_hit) *opts->cache_hit = false;
    int ver = 0;
    if ((st = kiln_nvrtc_version(&ver, err)) != KILN_OK) return st;

    bool use_cache = !(opts && opts->no_cache);
    const char *env = getenv("KILN_NVRTC_CACHE");
    if (env && strcmp(env, "0") == 0) use_cache = false;
    bool line_info = opts && opts->line_info;
    if (use_cache && (dir = cache_dir_path(opts)) != NULL) {
        char key[33], fname[64];
        cache_key(src, defines, n_defines, sm, want_ptx, ver, line_info, key);
        snprintf(fname, sizeof fname, "nvrtc-%s.bin", key);
        if (key[0]) path = kiln_path_join(dir, fname);
        if (path && cache_read(path, want_ptx, &cubin, &ptx)) {
            if (opts && opts->cache_hit) *opts->cache_hit = true;
            goto done;
        }
    }

    char arch[32];
    snprintf(arch, sizeof arch, "sm_%d", sm);
    kiln_buf *log_out = opts ? opts->log_out : NULL;
    if ((st = compile_once(src, name, defines, n_defines, arch, true, line_info, &cubin, log_out, err)) != KILN_OK)
        goto out;
    if (want_ptx) {
        snprintf(arch, sizeof arch, "compute_%d", sm);
        if ((st = compile_once(src, name, defines, n_defines, arch, false, line_info, &ptx, NULL, err)) != KILN_OK)
            goto out;
    }
    if (path) cache_write(dir, path, &cubin, want_ptx ? &ptx : NULL);
done:
    if (cubin_out) {
        kiln_buf_free(cubin_out);
        *cubin_out = cubin;
        cubin = (kiln_buf){0};
    }
    if (ptx_out && want_ptx) {
        kiln_buf_free(ptx_out);
        *ptx_out = ptx;
        ptx = (kiln_buf){0};
    }
out:
    kiln_buf_free(&cubin);
    kiln_buf_free(&ptx);
    free(dir);
    free(path);
    return st;
}

kiln_status kiln_nvrtc_compile(const char *src, const char *name, const char *const *defines, int n_defines, int sm,
                               bool want_ptx, kiln_buf *cubin_out, kiln_buf *ptx_out, kiln_error *err) {
    return kiln_nvrtc_compile_ex(src, name, defines, n_defines, sm, want_ptx, cubin_out, ptx_out, NULL, err);
}
