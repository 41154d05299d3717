/*
 * kernels_section.c — the plan → the GPU modules it needs → CUDA C → NVRTC
 * per target → the kernels section (format/kiln_ksec.h).
 * Contracts in codegen/kiln_kernels.h.
 *
 * Decisions:
 * - A module is one kernels/ template with #defines of the model's
 *   constants written into its source text (so the stored source says
 *   exactly what was compiled, and the NVRTC cache key covers it). The
 *   runtime finds modules by name and launches them with the cfg numbers
 *   stored beside them; it never recomputes codegen's choices.
 * - The source does not name its module, so modules whose #defines agree
 *   have byte-identical text (a model's GEMVs: the defines are the launch
 *   shape, not N and K; pycode-22m has 17 modules and 10 sources). The first
 *   such module owns the source and its images; the later ones share it
 *   (kiln_ksec.h). NVRTC compiles each distinct source once per SM.
 * - GEMV variants per weight shape follow docs/kernels.md's H200
 *   measurements: one token: tensor cores for 4096x4096-sized matrices,
 *   CUDA cores with 8 warps x 1 row x 4 in flight up to 8192 rows and
 *   K < 8192 (QKV), else 4 warps x 4 rows x 2 in flight (gate/up, down,
 *   LM head); 2..8 tokens: tensor cores, 16 warps,
 *   2 steps in flight for K >= 8192. f32 engines use the CUDA-core kernel
 *   (the tensor-core one is bf16 only).
 * - Jobs (distinct source x target SM) are tasks on the process-wide thread
 *   pool (common/kiln_pool.h), at most `threads` at once; results land in
 *   fixed slots, so the section's bytes do not depend on timing.
 */
#include "kiln_kernels.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "../format/kiln_ksec.h"
#include "../common/kiln_pool.h"
#include "../common/kiln_progress.h"
#include "kiln_nvrtc.h"

/* ---- targets ---- */

static bool pow2(int v) { return v > 0 && (v & (v - 1)) == 0; }

static void sort_unique(int *v, int *n) {
    for (int i = 1; i < *n; i++)
        for (int j = i; j > 0 && v[j - 1] > v[j]; j--) {
            int t = v[j];
            v[j] = v[j - 1];
            v[j - 1] = t;
        }
    int m = 0;
    for (int i = 0; i < *n; i++)
        if (m == 0 || v[m - 1] != v[i]) v[m++] = v[i];
    *n = m;
}

kiln_status kiln_kernel_targets_parse(const char *spec, kiln_kernel_targets *t, kiln_error *err) {
    memset(t, 0, sizeof *t);
    if (!spec || !*spec) spec = "default";
    if (strcmp(spec, "none") == 0) return KILN_OK;
    if (strcmp(spec, "default") == 0) spec = "sm_80,sm_86,sm_89,sm_90,compute_90";
    const char *p = spec;
    while (*p) {
        const char *e = strchr(p, ',');
        size_t len = e ? (size_t)(e - p) : strlen(p);
        char item[32];
        if (len == 0 || len >= sizeof item) {
            kiln_err(err, KILN_ERR_INVALID_ARG, "--target: empty or overlong item in '%s'", spec);
            return kiln_err_hint(err, "give a list like sm_80,sm_90,compute_90, or 'default' or 'none'");
        }
        memcpy(item, p, len);
        item[len] = 0;
        bool ptx = strncmp(item, "compute_", 8) == 0;
        const char *num = ptx ? item + 8 : strncmp(item, "sm_", 3) == 0 ? item + 3 : NULL;
        char *end = NULL;
        long sm = num && *num ? strtol(num, &end, 10) : -1;
        if (!num || !end || *end || sm < 1 || sm > 999) {
            kiln_err(err, KILN_ERR_INVALID_ARG, "--target: '%s' is not sm_NN or compute_NN", item);
            return kiln_err_hint(err, "e.g. --target sm_80,sm_86,sm_89,sm_90,compute_90 (the default), or 'none'");
        }
        if (sm < KILN_KERNELS_MIN_SM) {
            kiln_err(err, KILN_ERR_UNSUPPORTED, "--target: '%s': kiln's kernels need sm_%d or newer (cp.async, bf16 "
                     "tensor cores)", item, KILN_KERNELS_MIN_SM);
            return kiln_err_hint(err, "older GPUs can run the engine on the CPU only: --target none");
        }
        int *n = ptx ? &t->n_ptx : &t->n_cubin;
        int *v = ptx ? t->ptx_sm : t->cubin_sm;
        if (*n >= KILN_MAX_TARGETS)
            return kiln_err(err, KILN_ERR_INVALID_ARG, "--target: more than %d %s targets", KILN_MAX_TARGETS,
                            ptx ? "compute_NN" : "sm_NN");
        v[(*n)++] = (int)sm;
        p += len;
        if (*p == ',') p++;
    }
    sort_unique(t->cubin_sm, &t->n_cubin);
    sort_unique(t->ptx_sm, &t->n_ptx);
    return KILN_OK;
}

kiln_status kiln_kernel_targets_check(const kiln_kernel_targets *t, kiln_error *err) {
    if (t->n_cubin + t->n_ptx == 0) return KILN_OK;
    int archs[128], n = 0;
    kiln_error e = {0};
    if (kiln_nvrtc_archs(archs, 128, &n, &e) != KILN_OK) {
        kiln_err(err, KILN_ERR_UNSUPPORTED, "--target: this kiln cannot build GPU kernels: %s", e.msg);
        return kiln_err_hint(err, "use --target none (a CPU-only engine), or a kiln built with the CUDA toolkit");
    }
    for (int i = 0; i < t->n_cubin + t->n_ptx; i++) {
        int sm = i < t->n_cubin ? t->cubin_sm[i] : t->ptx_sm[i - t->n_cubin];
        bool ok = false;
        for (int k = 0; k < n; k++) ok |= archs[k] == sm;
        if (ok) continue;
        char name[32], list[512] = "";
        kiln_kernel_target_name(t, i, name, sizeof name);
        for (int k = 0; k < n; k++)
            if (archs[k] >= KILN_KERNELS_MIN_SM)
                snprintf(list + strlen(list), sizeof list - strlen(list), "%ssm_%d", list[0] ? ", " : "", archs[k]);
        kiln_err(err, KILN_ERR_UNSUPPORTED, "--target: %s: this NVRTC cannot compile for SM %d", name, sm);
        return kiln_err_hint(err, "it can for: %s", list);
    }
    return KILN_OK;
}

kiln_status kiln_kernels_check_block_size(int block_size, kiln_error *err) {
    if (pow2(block_size) && block_size <= KILN_KERNELS_MAX_BLOCK) return KILN_OK;
    kiln_err(err, KILN_ERR_INVALID_ARG, "--kv-block-size %d: the kernels take a power of two from 1 to %d",
             block_size, KILN_KERNELS_MAX_BLOCK);
    return kiln_err_hint(err, "e.g. --kv-block-size 16 (the default)");
}

void kiln_kernel_target_name(const kiln_kernel_targets *t, int i, char *buf, size_t cap) {
    if (i < t->n_cubin)
        snprintf(buf, cap, "sm_%d", t->cubin_sm[i]);
    else
        snprintf(buf, cap, "compute_%d", t->ptx_sm[i - t->n_cubin]);
}

/* ---- the modules a plan needs ---- */

#define MAX_MODULES 256

typedef kiln_kernel_module kmod;
typedef kiln_kernel_modules kset; /* mods: room for MAX_MODULES */

static kmod *find_mod(kset *s, const char *name) {
    for (int i = 0; i < s->n; i++)
        if (strcmp(s->mods[i].name, name) == 0) return &s->mods[i];
    return NULL;
}

/* A new module with the common prologue, or NULL when it exists already. */
static kmod *new_mod(kset *s, const char *name, kiln_error *err, kiln_status *st) {
    *st = KILN_OK;
    if (find_mod(s, name)) return NULL;
    if (s->n >= MAX_MODULES) {
        *st = kiln_err(err, KILN_ERR_UNSUPPORTED, "kernels: the plan needs more than %d GPU modules", MAX_MODULES);
        return NULL;
    }
    kmod *m = &s->mods[s->n++];
    memset(m, 0, sizeof *m);
    snprintf(m->name, sizeof m->name, "%s", name);
    kiln_buf_printf(&m->src, "/* kiln GPU module (codegen/kernels_section.c) */\n");
    if (s->f32) kiln_buf_printf(&m->src, "#define KILN_F32 1\n");
    return m;
}
static void def_i(kmod *m, const char *k, long long v) { kiln_buf_printf(&m->src, "#define %s %lld\n", k, v); }
static void def_f(kmod *m, const char *k, float v) { kiln_buf_printf(&m->src, "#define %s %.9ef\n", k, (double)v); }
static void include(kmod *m, const char *file) { kiln_buf_printf(&m->src, "#include \"%s\"\n", file); }

/* GEMV launch shape for a weight of n rows x k columns (see the header comment). */
static void gemv_cfg(bool f32, bool multi, bool swiglu, int n, int k, int32_t c[KILN_KSEC_CFG_N]) {
    memset(c, 0, sizeof(int32_t) * KILN_KSEC_CFG_N);
    if (f32) {
        c[0] = 4, c[1] = 2, c[2] = 4, c[3] = 1; /* CUDA cores; M tiles of 1 */
    } else if (multi) {
        c[0] = 16, c[2] = k >= 8192 ? 2 : 1, c[3] = 8, c[4] = 1;
    } else if ((int64_t)n * k <= 4096LL * 4096 * 5 / 4) {
        c[0] = 16, c[2] = 1, c[3] = 8, c[4] = 1;
    } else if (n <= 8192 && k < 8192 && !swiglu) {
        c[0] = 8, c[1] = 1, c[2] = 4, c[3] = 1;
    } else {
        c[0] = 4, c[1] = 4, c[2] = 2, c[3] = 1;
    }
    c[6] = swiglu;
}

static kiln_status add_gemv(kset *s, const char *epi, int n, int k, kiln_error *err) {
    static const char *variants[2] = {"m1", "mma"};
    for (int v = 0; v < (s->f32 ? 1 : 2); v++) {
        char name[KILN_KSEC_NAME_MAX];
        kiln_ksec_gemv_name(name, sizeof name, epi, n, k, variants[v]);
        kiln_status st;
        kmod *m = new_mod(s, name, err, &st);
        if (!m) {
            if (st) return st;
            continue;
        }
        bool swiglu = strcmp(epi, "swiglu") == 0, f32out = strcmp(epi, "f32out") == 0;
        gemv_cfg(s->f32, v == 1, swiglu, n, k, m->cfg);
        m->cfg[5] = f32out;
        def_i(m, "GEMV_WARPS", m->cfg[0]);
        def_i(m, "GEMV_ROWS", m->cfg[4] ? 2 : m->cfg[1]);
        def_i(m, "GEMV_UNROLL", m->cfg[2]);
        def_i(m, "GEMV_MT", m->cfg[4] ? 1 : m->cfg[3]);
        def_i(m, "GEMV_MMA", m->cfg[4]);
        def_i(m, "GEMV_OUT_F32", f32out);
        def_i(m, "GEMV_SWIGLU", swiglu);
        include(m, "gemv.cuh");
    }
    return KILN_OK;
}

/* The CUDA-core GEMV over a quantized [n, k] weight (gemv.cuh's kiln_gemv_ck for q4 and fp8,
 * kiln_quant_gemv_ck: module variant "<dtype>.ck"; kiln_gemv_ccq for q8 and fp8g128: "<dtype>.cc"),
 * which the runtime takes for one-token steps (kiln_gpu_bench --quant on the H200, docs/quantization.md: q8/fp8 at 52-89 %
 * of the bandwidth ceiling against the tensor cores' 39-69 %). */
static kiln_status add_gemv_quant_cc(kset *s, const char *epi, int n, int k, int qt, kiln_error *err) {
    char name[KILN_KSEC_NAME_MAX], variant[24];
    kiln_status st;
    const int bits = kiln_quant_bits(qt);
    const bool ck = kiln_quant_gemv_ck(qt);
    kiln_ksec_gemv_cc_variant(variant, sizeof variant, kiln_dtype_name((kiln_dtype)qt), ck);
    kiln_ksec_gemv_name(name, sizeof name, epi, n, k, variant);
    kmod *m = new_mod(s, name, err, &st);
    if (!m) return st;
    const bool swiglu = strcmp(epi, "swiglu") == 0, f32out = strcmp(epi, "f32out") == 0;
    memset(m->cfg, 0, sizeof m->cfg);
    if (bits == 4) {
        /* q4: 4 warps splitting K (a 32-column chunk a thread and pass: 4096 columns a pass), 8 rows a
         * block, 4 loaded together, the codes widened through f16 (GEMV_Q4CVT 1). In the Mistral-7B
         * int4 step on the H200 (docs/quantization.md) this beat 16 rows a block (1.21x), 8 rows loaded
         * together (1.07x), 4 (1.03x) or 2 rows a block and 8 or 14 warps for K = 14336 (one pass
         * there; 1.05x and 1.26x), and the tensor cores (1.14x). */
        m->cfg[0] = 4, m->cfg[1] = 8, m->cfg[2] = 4, m->cfg[3] = 1, m->cfg[4] = 2;
        def_i(m, "GEMV_CPL", 1);
        def_i(m, "GEMV_Q4CVT", 1);
        def_i(m, "GEMV_MINB", 4);
    } else if (ck) {
        /* fp8: 4 warps splitting K, 16 columns a chunk, 2 chunks a thread and pass (4096 columns a pass), 8
         * rows a block, 4 loaded together. With the norms folded in at one token (fold-norm-into-ck-gemv)
         * the fp8 7B step on the H200 was 4 % faster than on kiln_gemv_ccq; q8 on this kernel was 13 %
         * slower (10 % with one chunk a pass, 6 % with the norms folded), so q8 stays there. */
        m->cfg[0] = 4, m->cfg[1] = 8, m->cfg[2] = 4, m->cfg[3] = 1, m->cfg[4] = 2;
        def_i(m, "GEMV_CPL", 2);
        def_i(m, "GEMV_MINB", 4);
        def_i(m, "GEMV_CK", 1);
    } else {
        /* 4 warps of 2 rows, 2 steps in flight: within 1-3 % of the best on every shape */
        m->cfg[0] = 4, m->cfg[1] = 2, m->cfg[2] = 2, m->cfg[3] = 1; /* x rows per warp; CUDA cores */
    }
    m->cfg[5] = f32out;
    m->cfg[6] = swiglu;
    m->cfg[7] = qt;
    def_i(m, "GEMV_WARPS", m->cfg[0]);
    def_i(m, "GEMV_ROWS", m->cfg[1]);
    def_i(m, "GEMV_UNROLL", m->cfg[2]);
    def_i(m, "GEMV_MT", 1);
    def_i(m, "GEMV_MMA", 0);
    def_i(m, "GEMV_OUT_F32", f32out);
    def_i(m, "GEMV_SWIGLU", swiglu);
    def_i(m, "GEMV_QUANT", bits);
    def_i(m, "GEMV_FP8", kiln_quant_is_fp8(qt));
    def_i(m, "GEMV_GROUP", kiln_quant_group(qt)); /* fp8g128: a scale per row and 128 columns */
    include(m, "gemv.cuh");
    return KILN_OK;
}

/* The quantized GEMM over a quantized [n, k] weight (kernels/qgemm.cuh; q8, fp8 and q4gG, not fp8g128, whose
 * long steps run W8A8) for steps of 17 to 64 rows: modules "<dtype>.mx32" (32 rows of x a block, a ring of 4
 * chunks) and "<dtype>.mx" (64 rows, 3 chunks), 8 warps. On the H200 (kiln_gpu_bench --qgemm, Mistral-7B's
 * q4g128 and q8 matrices) the 32-row one was the faster up to 32 rows (gate/up 64.5-66.1 us against 87-89),
 * the 64-row one at 64 (93 against 126). */
static kiln_status add_qgemm(kset *s, const char *epi, int n, int k, int qt, kiln_error *err) {
    if (s->f32 || (kiln_quant_bits(qt) == 8 && kiln_quant_group(qt))) return KILN_OK; /* bf16 x only; fp8g128 */
    const bool swiglu = strcmp(epi, "swiglu") == 0, f32out = strcmp(epi, "f32out") == 0;
    for (int v = 0; v < 2; v++) {
        const int tm = v ? 64 : 32, stages = v ? 3 : 4;
        char name[KILN_KSEC_NAME_MAX], variant[24];
        kiln_status st;
        kiln_ksec_gemv_qg_variant(variant, sizeof variant, kiln_dtype_name((kiln_dtype)qt), tm);
        kiln_ksec_gemv_name(name, sizeof name, epi, n, k, variant);
        kmod *m = new_mod(s, name, err, &st);
        if (!m) {
            if (st) return st;
            continue;
        }
        memset(m->cfg, 0, sizeof m->cfg);
        m->cfg[0] = 8, m->cfg[1] = tm, m->cfg[2] = stages;
        m->cfg[5] = f32out;
        m->cfg[6] = swiglu;
        m->cfg[7] = qt;
        def_i(m, "QG_BITS", kiln_quant_bits(qt));
        def_i(m, "QG_GROUP", kiln_quant_group(qt));
        def_i(m, "QG_FP8", kiln_quant_is_fp8(qt));
        def_i(m, "QG_SWIGLU", swiglu);
        def_i(m, "QG_OUT_F32", f32out);
        def_i(m, "QG_WARPS", 8);
        def_i(m, "QG_TM", tm);
        def_i(m, "QG_STAGES", stages);
        include(m, "qgemm.cuh");
    }
    return KILN_OK;
}

/* The GEMV over a quantized [n, k] weight of dtype qt (q8, fp8, q4gG): one module, the tensor-core
 * variant with the codes dequantized in registers, for every M up to the runtime's GEMV limit
 * (gemv.cuh, GEMV_QUANT); steps with more rows dequantize into a dense copy for cuBLASLt (module
 * "dequant"). Warps split K: a warp step covers 128 (q4) or 64 (q8) columns. */
static kiln_status add_gemv_quant(kset *s, const char *epi, int n, int k, int qt, kiln_error *err) {
    char name[KILN_KSEC_NAME_MAX];
    kiln_status st;
    kiln_ksec_gemv_name(name, sizeof name, epi, n, k, kiln_dtype_name((kiln_dtype)qt));
    kmod *m = new_mod(s, name, err, &st);
    if (!m) return st;
    const bool swiglu = strcmp(epi, "swiglu") == 0, f32out = strcmp(epi, "f32out") == 0;
    const int group = kiln_quant_group(qt), bits = kiln_quant_bits(qt);
    memset(m->cfg, 0, sizeof m->cfg);
    /* warps (K split over them), 16-row tiles a warp and steps in flight, the best of kiln_gpu_bench
     * --quant on the H200 (docs/quantization.md): the tall-K and small-N shapes want the K split, and
     * q4's tall K two tiles a warp (down_proj 4096x14336: 20-25 % faster than one at M = 1 and 8;
     * elsewhere more tiles were no faster, or slower) */
    if (bits == 4) m->cfg[0] = k >= 8192 ? 16 : 8, m->cfg[1] = k >= 8192 ? 2 : 1, m->cfg[2] = k >= 8192 ? 1 : 2;
    else m->cfg[0] = k >= 8192 || n <= 4096 ? 16 : 8, m->cfg[1] = 1, m->cfg[2] = k >= 8192 || n <= 4096 ? 2 : 4;
    m->cfg[3] = 8, m->cfg[4] = 1;                /* x rows per block; tensor cores */
    m->cfg[5] = f32out;
    m->cfg[6] = swiglu;
    m->cfg[7] = qt;
    def_i(m, "GEMV_WARPS", m->cfg[0]);
    def_i(m, "GEMV_ROWS", 2);
    def_i(m, "GEMV_UNROLL", m->cfg[2]);
    def_i(m, "GEMV_MT", 1);
    def_i(m, "GEMV_MMA", 1);
    def_i(m, "GEMV_OUT_F32", f32out);
    def_i(m, "GEMV_SWIGLU", swiglu);
    def_i(m, "GEMV_QUANT", bits);
    def_i(m, "GEMV_GROUP", group);
    def_i(m, "GEMV_FP8", kiln_quant_is_fp8(qt));
    def_i(m, "GEMV_QT", m->cfg[1]);
    include(m, "gemv.cuh");
    if ((st = add_gemv_quant_cc(s, epi, n, k, qt, err))) return st;
    if ((st = add_qgemm(s, epi, n, k, qt, err))) return st;
    if ((m = new_mod(s, "dequant", err, &st)) != NULL) {
        m->cfg[0] = 256;
        def_i(m, "DEQUANT_THREADS", 256);
        include(m, "dequant.cuh");
    }
    return st;
}

/* The GEMV modules for a weight (plan value wv) of n rows and k columns: bf16 (f32) or quantized. */
static kiln_status add_gemv_for(kset *s, const kiln_plan *p, const char *epi, int n, int k, int32_t wv,
                                kiln_error *err) {
    const int dt = (int)p->weights[p->values[wv].weight].dtype;
    return kiln_dtype_is_quant(dt) ? add_gemv_quant(s, epi, n, k, dt, err) : add_gemv(s, epi, n, k, err);
}

static int64_t wrows(const kiln_plan *p, int32_t v) { return p->values[v].shape[0]; }
static int64_t wcols(const kiln_plan *p, int32_t v) { return p->values[v].shape[1]; }
static int64_t width(const kiln_plan *p, int32_t v) { return p->values[v].shape[2]; }


#define UNSUP(...) kiln_err(err, KILN_ERR_UNSUPPORTED, "kernels: " __VA_ARGS__)

/* A new expert-GEMV module (gemv.cuh with GEMV_MOE = mode) of variant `variant` for an [n, k] matrix, or
 * NULL when it exists already (*st: KILN_OK) or cannot be made; gate/up ("swiglu": the SwiGLU over the
 * checkpoint's halves layout, GEMV_SPLIT) or down (fp32 output). The caller sets cfg[0..4] and the
 * variant's defines; this sets cfg[5..6] and the defines both variants share. */
static kmod *moe_gemv_module(kset *s, const char *epi, int n, int k, const char *variant, int mode, kiln_error *err,
                             kiln_status *st) {
    char name[KILN_KSEC_NAME_MAX];
    kiln_ksec_gemv_name(name, sizeof name, epi, n, k, variant);
    kmod *m = new_mod(s, name, err, st);
    if (!m) return NULL;
    const bool swiglu = strcmp(epi, "swiglu") == 0;
    memset(m->cfg, 0, sizeof m->cfg);
    m->cfg[5] = !swiglu;
    m->cfg[6] = swiglu;
    def_i(m, "GEMV_OUT_F32", !swiglu);
    def_i(m, "GEMV_SWIGLU", swiglu);
    def_i(m, "GEMV_SPLIT", swiglu);
    def_i(m, "GEMV_MOE", mode);
    return m;
}

/* The expert GEMV over a chosen expert's [n, k] matrix (GEMV_MOE 1): the CUDA-core variant, one token
 * row per block, sized as the plain GEMV of that shape at one row. */
static kiln_status add_gemv_moe(kset *s, const char *epi, int n, int k, kiln_error *err) {
    kiln_status st;
    kmod *m = moe_gemv_module(s, epi, n, k, "moe", 1, err, &st);
    if (!m) return st;
    if (s->f32) m->cfg[0] = 4, m->cfg[1] = 2, m->cfg[2] = 4;
    else if ((int64_t)n * k <= 4096LL * 4096 / 4) m->cfg[0] = 4, m->cfg[1] = 2, m->cfg[2] = 2;
    else m->cfg[0] = 4, m->cfg[1] = 4, m->cfg[2] = 2;
    m->cfg[3] = 1;
    def_i(m, "GEMV_WARPS", m->cfg[0]);
    def_i(m, "GEMV_ROWS", m->cfg[1]);
    def_i(m, "GEMV_UNROLL", m->cfg[2]);
    def_i(m, "GEMV_MT", 1);
    include(m, "gemv.cuh");
    return KILN_OK;
}

/* The grouped expert GEMV (gemv.cuh with GEMV_MOE 2, bf16 tensor cores) for decode batches past the
 * pair GEMVs with the measure knob moe_grouped=1: cfg warps, x tiles per pass (cfg[1]), steps in
 * flight, 8 x rows a tile, mma. On the H200 at batch 64 it read Mixtral's experts at 2.5 TB/s with 8
 * warps splitting K and 1.8 with one warp over all of K, against cuBLASLt's 3.2 over every expert
 * (docs/benchmarks.md): not the default. */
static kiln_status add_gemv_moe_grouped(kset *s, const char *epi, int n, int k, kiln_error *err) {
    kiln_status st;
    kmod *m = moe_gemv_module(s, epi, n, k, "moeg", 2, err, &st);
    if (!m) return st;
    m->cfg[0] = 8, m->cfg[1] = 4, m->cfg[2] = 2, m->cfg[3] = 8, m->cfg[4] = 1;
    def_i(m, "GEMV_WARPS", m->cfg[0]);
    def_i(m, "GEMV_TILES", m->cfg[1]);
    def_i(m, "GEMV_UNROLL", m->cfg[2]);
    def_i(m, "GEMV_MMA", 1);
    include(m, "gemv.cuh");
    return KILN_OK;
}

/* The modules of one moe op: routing, grouping and combining (moe.cuh, one per (E, top_k, H, renorm)),
 * the expert GEMVs (decode), the halves-layout SwiGLU after a cuBLASLt gate/up GEMM (larger steps). */
static kiln_status add_moe(kset *s, const kiln_plan *p, const kiln_plan_op *op, kiln_error *err) {
    const kiln_op_attrs *a = &op->attrs;
    const int h = (int)width(p, op->in[0]), f = (int)p->values[op->in[3]].shape[2];
    if (a->top_k < 1 || a->top_k > 17 || a->top_k > a->n_experts || a->n_experts > 512)
        return UNSUP("layer %d: %d experts, top %d: the GPU router takes up to 512 experts and top_k up to 17",
                     a->layer, a->n_experts, a->top_k);
    for (int j = 1; j < 4; j++)
        if (kiln_dtype_is_quant((int)p->weights[p->values[op->in[j]].weight].dtype))
            return UNSUP("layer %d: quantized expert weights have no GPU kernel", a->layer);
    char name[KILN_KSEC_NAME_MAX];
    kiln_status st = KILN_OK;
    const bool nr = (a->flags & KILN_FLAG_MOE_NO_RENORM) != 0;
    snprintf(name, sizeof name, "moe.e%d.k%d.h%d%s", a->n_experts, a->top_k, h, nr ? ".nr" : "");
    kmod *m = new_mod(s, name, err, &st);
    if (m) {
        m->cfg[0] = 256;
        def_i(m, "HIDDEN", h);
        def_i(m, "MOE_E", a->n_experts);
        def_i(m, "MOE_K", a->top_k);
        def_i(m, "MOE_NO_RENORM", nr);
        def_i(m, "MOE_THREADS", 256);
        include(m, "moe.cuh");
    }
    if (st || (st = add_gemv_moe(s, "swiglu", 2 * f, h, err)) || (st = add_gemv_moe(s, "f32out", h, f, err)))
        return st;
    if (!s->f32 && ((st = add_gemv_moe_grouped(s, "swiglu", 2 * f, h, err)) ||
                    (st = add_gemv_moe_grouped(s, "f32out", h, f, err))))
        return st;
    snprintf(name, sizeof name, "swiglu.f%d.halves", f);
    if ((m = new_mod(s, name, err, &st)) != NULL) {
        m->cfg[0] = 256;
        def_i(m, "FFN", f);
        def_i(m, "SWIGLU_INTERLEAVED", 0);
        def_i(m, "SWIGLU_THREADS", 256);
        include(m, "swiglu.cuh");
    }
    return st;
}

/* Check one attention configuration against what the kernels take. */
static kiln_status check_attn(const kiln_op_attrs *a, bool f32, kiln_error *err) {
    if (a->n_kv_heads <= 0 || a->n_heads % a->n_kv_heads)
        return UNSUP("layer %d: %d query heads are not a multiple of %d KV heads", a->layer, a->n_heads, a->n_kv_heads);
    int lo = f32 ? 4 : 8, hi = f32 ? 128 : 256;
    if (!pow2(a->head_dim) || a->head_dim < lo || a->head_dim > hi)
        return UNSUP("layer %d: head_dim %d: the %s attention kernels take powers of two from %d to %d", a->layer,
                     a->head_dim, f32 ? "f32" : "bf16", lo, hi);
    if (a->n_heads / a->n_kv_heads > 16)
        return UNSUP("layer %d: %d query heads per KV head (at most 16)", a->layer, a->n_heads / a->n_kv_heads);
    return KILN_OK;
}

static kiln_status plan_modules(const kiln_plan *p, int block_size, kset *s, kiln_error *err) {
    kiln_status st = KILN_OK;
    s->f32 = true;
    for (uint32_t i = 0; i < p->n_weights; i++)
        if (p->weights[i].dtype != KILN_DTYPE_F32) s->f32 = false;
    /* the KV cache's codes: one kind for every layer (one rope_kv module writes them all) */
    s->kv8 = -1;
    for (uint32_t i = 0; i < p->n_ops; i++) {
        if (p->ops[i].kind != KILN_OP_ATTENTION) continue;
        const int k = kiln_kv8_of(p->ops[i].attrs.flags);
        if (s->kv8 >= 0 && k != s->kv8)
            return UNSUP("layer %d: its KV cache's element type differs from the layers' before it",
                         p->ops[i].attrs.layer);
        s->kv8 = k;
    }
    if (s->kv8 < 0) s->kv8 = 0;
    if (s->kv8 && s->f32) return UNSUP("an 8-bit KV cache (--kv-dtype) in an f32 engine: its kernels are bf16");
    kmod *m = new_mod(s, "util", err, &st);
    if (st) return st;
    include(m, "util.cuh");
    m = new_mod(s, "sample", err, &st);
    if (st) return st;
    m->cfg[0] = 1024;
    def_i(m, "SAMPLE_THREADS", 1024);
    include(m, "sample.cuh");
    const kiln_op_attrs *rope = NULL;
    char name[KILN_KSEC_NAME_MAX];
    for (uint32_t i = 0; i < p->n_ops && st == KILN_OK; i++) {
        const kiln_plan_op *op = &p->ops[i];
        const kiln_op_attrs *a = &op->attrs;
        switch ((kiln_op_kind)op->kind) {
        case KILN_OP_RMSNORM:
        case KILN_OP_ADD_RMSNORM: {
            uint32_t bits;
            memcpy(&bits, &a->eps, 4);
            snprintf(name, sizeof name, "rmsnorm.e%08x", bits);
            if ((m = new_mod(s, name, err, &st)) != NULL) {
                m->cfg[0] = 256;
                def_i(m, "HIDDEN", width(p, op->out[op->kind == KILN_OP_RMSNORM ? 0 : 1]));
                def_f(m, "RMS_EPS", a->eps);
                def_i(m, "NORM_THREADS", 256);
                include(m, "rmsnorm.cuh");
            }
            break;
        }
        case KILN_OP_QKV_ROPE:
        case KILN_OP_QKV_ROPE_PACKED: {
            if ((st = check_attn(a, s->f32, err)) != KILN_OK) break;
            if (rope && (rope->n_heads != a->n_heads || rope->n_kv_heads != a->n_kv_heads ||
                         rope->head_dim != a->head_dim || rope->rope_scaling != a->rope_scaling ||
                         rope->rope_theta != a->rope_theta || rope->rope_factor != a->rope_factor ||
                         rope->rope_low_freq_factor != a->rope_low_freq_factor ||
                         rope->rope_high_freq_factor != a->rope_high_freq_factor ||
                         rope->rope_original_max_pos != a->rope_original_max_pos || rope->flags != a->flags ||
                         ((a->flags & KILN_FLAG_QK_NORM) && rope->eps != a->eps))) {
                st = UNSUP("layer %d: heads, RoPE settings, biases or q/k norms differ from layer %d's (one rope_kv "
                           "module per model)",
                           a->layer, rope->layer);
                break;
            }
            if (!rope) {
                rope = a;
                m = new_mod(s, "rope_kv", err, &st);
                if (!m) break;
                m->cfg[0] = 128;
                m->cfg[1] = s->kv8;
                if (s->kv8) def_i(m, "KILN_KV8", s->kv8);
                def_i(m, "N_HEADS", a->n_heads);
                def_i(m, "N_KV_HEADS", a->n_kv_heads);
                def_i(m, "HEAD_DIM", a->head_dim);
                def_i(m, "BLOCK_SIZE", block_size);
                def_f(m, "ROPE_THETA", a->rope_theta);
                def_i(m, "ROPE_LLAMA3", a->rope_scaling == KILN_ROPE_SCALING_LLAMA3);
                if (a->rope_scaling == KILN_ROPE_SCALING_LLAMA3) {
                    def_f(m, "ROPE_FACTOR", a->rope_factor);
                    def_f(m, "ROPE_LOW_FREQ_FACTOR", a->rope_low_freq_factor);
                    def_f(m, "ROPE_HIGH_FREQ_FACTOR", a->rope_high_freq_factor);
                    def_f(m, "ROPE_ORIG_MAX_POS", a->rope_original_max_pos);
                }
                def_i(m, "ROPE_THREADS", 128);
                if (a->flags & KILN_FLAG_QKV_BIAS) def_i(m, "QKV_BIAS", 1);
                if (a->flags & KILN_FLAG_QK_NORM) {
                    def_i(m, "QK_NORM", 1);
                    def_f(m, "QK_NORM_EPS", a->eps);
                }
                include(m, "rope_kv.cuh");
            }
            int64_t n = op->kind == KILN_OP_QKV_ROPE_PACKED ? wrows(p, op->in[1])
                                                             : wrows(p, op->in[1]) + wrows(p, op->in[2]) + wrows(p, op->in[3]);
            st = add_gemv_for(s, p, "plain", (int)n, (int)width(p, op->in[0]), op->in[1], err);
            break;
        }
        case KILN_OP_ATTENTION: {
            if ((st = check_attn(a, s->f32, err)) != KILN_OK) break;
            if (a->window < 0) {
                st = UNSUP("layer %d: sliding window %d", a->layer, a->window);
                break;
            }
            for (int kind = 0; kind < 2 && st == KILN_OK; kind++) {
                snprintf(name, sizeof name, "%s.w%d", kind ? "attn_prefill" : "attn_decode", a->window);
                if ((m = new_mod(s, name, err, &st)) == NULL) continue;
                def_i(m, "N_HEADS", a->n_heads);
                def_i(m, "N_KV_HEADS", a->n_kv_heads);
                def_i(m, "HEAD_DIM", a->head_dim);
                def_i(m, "BLOCK_SIZE", block_size);
                def_i(m, "WINDOW", a->window);
                if (s->kv8) def_i(m, "KILN_KV8", s->kv8);
                if (kind == 0) {
                    /* splits of up to 1024 tokens: at batch 64 and contexts up to 1024 one block per
                     * (sequence, kv head) fills the H200 in one wave, with no combine step */
                    m->cfg[0] = 1024, m->cfg[1] = 4, m->cfg[2] = s->kv8;
                    def_i(m, "PARTITION", 1024);
                    def_i(m, "ATTN_WARPS", 4);
                    /* kiln_attn_decode_tc as well over an FP8 cache, for groups of 4 to 8 query heads
                     * a kv head at head_dim 128: there the CUDA-core kernel's 8-byte loads and
                     * per-token softmax left attention at 30 % of the read ceiling at batch 1024
                     * (the kernel takes bf16 caches too, measured slower than the CUDA-core one:
                     * docs/kernels.md) */
                    const int g = a->n_heads / a->n_kv_heads;
                    if (!s->f32 && s->kv8 == 1 && g >= 4 && g <= 8 && a->head_dim == 128) def_i(m, "ATTN_TC", 1);
                    include(m, "attn_decode.cuh");
                } else {
                    m->cfg[0] = !s->f32 && a->head_dim % 16 == 0; /* kiln_attn_prefill_mma exists */
                    m->cfg[1] = s->kv8;
                    include(m, "attn_prefill.cuh");
                }
            }
            break;
        }
        case KILN_OP_LINEAR:
        case KILN_OP_LINEAR_ADD:
            st = add_gemv_for(s, p, "plain", (int)wrows(p, op->in[1]), (int)wcols(p, op->in[1]), op->in[1], err);
            break;
        case KILN_OP_GATE_UP_SWIGLU:
        case KILN_OP_GATE_UP_SWIGLU_PACKED: {
            int f = (int)(op->kind == KILN_OP_GATE_UP_SWIGLU_PACKED ? wrows(p, op->in[1]) / 2 : wrows(p, op->in[1]));
            st = add_gemv_for(s, p, "swiglu", 2 * f, (int)wcols(p, op->in[1]), op->in[1], err);
            snprintf(name, sizeof name, "swiglu.f%d", f);
            if (st == KILN_OK && (m = new_mod(s, name, err, &st)) != NULL) {
                m->cfg[0] = 256;
                def_i(m, "FFN", f);
                def_i(m, "SWIGLU_INTERLEAVED", 1);
                def_i(m, "SWIGLU_THREADS", 256);
                include(m, "swiglu.cuh");
            }
            break;
        }
        case KILN_OP_LM_HEAD:
            st = add_gemv_for(s, p, "f32out", (int)wrows(p, op->in[1]), (int)wcols(p, op->in[1]), op->in[1], err);
            break;
        case KILN_OP_MOE: st = add_moe(s, p, op, err); break;
        default: break; /* the runtime refuses ops it has no kernels for, by name */
        }
    }
    for (int i = 0; i < s->n && st == KILN_OK; i++)
        if (s->mods[i].src.failed) st = kiln_err(err, KILN_ERR_NOMEM, "kernels: out of memory");
    return st;
}

/* Each module's owner: the first module with the same source text. */
static void share_sources(kset *s) {
    s->n_sources = 0;
    for (int i = 0; i < s->n; i++) {
        kmod *m = &s->mods[i];
        m->owner = i;
        for (int j = 0; j < i && m->owner == i; j++) {
            const kmod *o = &s->mods[j];
            if (o->owner == j && o->src.len == m->src.len && memcmp(o->src.data, m->src.data, m->src.len) == 0)
                m->owner = j;
        }
        s->n_sources += m->owner == i;
    }
}

void kiln_kernel_modules_free(kiln_kernel_modules *s) {
    if (!s) return;
    for (int i = 0; s->mods && i < s->n; i++) kiln_buf_free(&s->mods[i].src);
    free(s->mods);
    memset(s, 0, sizeof *s);
}

kiln_status kiln_kernels_modules(const kiln_plan *p, int kv_block_size, kiln_kernel_modules *s, kiln_error *err) {
    memset(s, 0, sizeof *s);
    int block_size = kv_block_size ? kv_block_size : 16;
    kiln_status st = kiln_kernels_check_block_size(block_size, err);
    if (st != KILN_OK) return st;
    if (!(s->mods = calloc(MAX_MODULES, sizeof *s->mods))) return kiln_err(err, KILN_ERR_NOMEM, "kernels: out of memory");
    if ((st = plan_modules(p, block_size, s, err)) != KILN_OK) {
        kiln_kernel_modules_free(s);
        return st;
    }
    share_sources(s);
    return KILN_OK;
}

/* ---- NVRTC jobs ---- */

typedef struct kjob {
    const kmod *m;
    int sm;
    bool cubin, ptx; /* wanted */
    kiln_buf cubin_out, ptx_out;
    kiln_status st;
    kiln_error err;
} kjob;

typedef struct kbatch {
    kjob *jobs;
    int done;
    bool no_cache;
    kiln_progress *progress; /* updated under `lock` as jobs finish */
    pthread_mutex_t lock;
} kbatch;

/* Pool task i: compile job i. */
static void kjob_run(void *arg, int i) {
    kbatch *b = arg;
    kjob *j = &b->jobs[i];
    kiln_nvrtc_opts o = {.no_cache = b->no_cache};
    j->st = kiln_nvrtc_compile_ex((const char *)j->m->src.data, j->m->name, NULL, 0, j->sm, j->ptx, &j->cubin_out,
                                  &j->ptx_out, &o, &j->err);
    pthread_mutex_lock(&b->lock);
    kiln_progress_update(b->progress, (uint64_t)++b->done);
    pthread_mutex_unlock(&b->lock);
}

static void put_name(uint8_t *p, const char *s, size_t cap) {
    memset(p, 0, cap);
    memcpy(p, s, strnlen(s, cap - 1));
}

int kiln_kernels_unsupported_op(const kiln_plan *p) {
    for (uint32_t i = 0; i < p->n_ops; i++)
        switch ((kiln_op_kind)p->ops[i].kind) {
        case KILN_OP_EMBEDDING:
        case KILN_OP_RMSNORM:
        case KILN_OP_ADD_RMSNORM:
        case KILN_OP_LINEAR:
        case KILN_OP_LINEAR_ADD:
        case KILN_OP_QKV_ROPE_PACKED:
        case KILN_OP_ATTENTION:
        case KILN_OP_GATE_UP_SWIGLU_PACKED:
        case KILN_OP_MOE:
        case KILN_OP_ALL_REDUCE: /* NCCL, or kiln_tp_sum (util) for ranks on one device */
        case KILN_OP_ALL_GATHER:
        case KILN_OP_PERMUTE: /* kiln_gather_cols (util) */
        case KILN_OP_LM_HEAD: break;
        default: return (int)i;
        }
    return -1;
}

int kiln_kernels_unsupported_weight(const kiln_plan *p, const char **why) {
    bool f32 = false;
    int q = -1;
    for (uint32_t i = 0; i < p->n_weights; i++) {
        const kiln_plan_weight *w = &p->weights[i];
        if (w->dtype == KILN_DTYPE_F32 && w->ndim == 2) f32 = true; /* an f32 engine (norms are f32 in any) */
        if (!kiln_dtype_is_quant((int)w->dtype)) continue;
        if (q < 0) q = (int)i;
        /* the GEMV's 16-byte loads of codes: 16 columns (q8, fp8), a group (q4) */
        if (w->ndim != 2 || (kiln_quant_bits((int)w->dtype) == 8 && w->shape[1] % 16)) {
            if (why) *why = "the GPU kernels read q8, fp8 and fp8g128 matrices whose columns are a multiple of 16";
            return (int)i;
        }
    }
    if (q >= 0 && f32) {
        if (why) *why = "the GPU kernels read quantized weights only in bf16 and f16 engines (--dtype bf16)";
        return q;
    }
    return -1;
}

kiln_status kiln_kernels_build(const kiln_plan *p, const kiln_kernel_targets *t, const kiln_kernels_opts *o,
                               kiln_buf *out, kiln_error *err) {
    kiln_kernels_opts def = {0};
    if (!o) o = &def;
    int block_size = o->kv_block_size ? o->kv_block_size : 16;
    kiln_status st = kiln_kernels_check_block_size(block_size, err);
    if (st != KILN_OK) return st;
    if (t->n_cubin + t->n_ptx == 0)
        return kiln_err(err, KILN_ERR_INVALID_ARG, "kernels: no targets (--target none makes no kernels section)");
    kset ks, *s = &ks;
    kjob *jobs = NULL;
    int n_jobs = 0;
    if ((st = kiln_kernels_modules(p, block_size, s, err)) != KILN_OK) return st;

    /* one job per (distinct source, SM): the cubin when sm_SM is a target, PTX when compute_SM is */
    int sms[2 * KILN_MAX_TARGETS], n_sms = 0;
    for (int i = 0; i < t->n_cubin; i++) sms[n_sms++] = t->cubin_sm[i];
    for (int i = 0; i < t->n_ptx; i++) sms[n_sms++] = t->ptx_sm[i];
    sort_unique(sms, &n_sms);
    jobs = calloc((size_t)s->n_sources * (size_t)n_sms, sizeof *jobs);
    if (!jobs) {
        st = kiln_err(err, KILN_ERR_NOMEM, "kernels: out of memory");
        goto out;
    }
    for (int mi = 0; mi < s->n; mi++)
        for (int k = 0; k < n_sms && s->mods[mi].owner == mi; k++) {
            kjob *j = &jobs[n_jobs++];
            j->m = &s->mods[mi];
            j->sm = sms[k];
            for (int c = 0; c < t->n_cubin; c++) j->cubin |= t->cubin_sm[c] == sms[k];
            for (int c = 0; c < t->n_ptx; c++) j->ptx |= t->ptx_sm[c] == sms[k];
        }
    {
        kbatch b = {.jobs = jobs, .no_cache = o->no_cache, .progress = o->progress};
        kiln_progress_phase(o->progress, "kernels", (uint64_t)n_jobs, "NVRTC builds", 1);
        pthread_mutex_init(&b.lock, NULL);
        kiln_pool *pool = kiln_pool_shared();
        int threads = o->threads > 0 ? o->threads : kiln_pool_ways(pool); /* 0: one per core */
        kiln_pool_for(pool, n_jobs, threads, kjob_run, &b);
        pthread_mutex_destroy(&b.lock);
    }
    for (int i = 0; i < n_jobs; i++)
        if (jobs[i].st != KILN_OK) {
            *err = jobs[i].err;
            st = jobs[i].st;
            goto out;
        }

    /* the section: header, module table, image table, data (owned sources, then images) */
    int n_images = 0;
    for (int i = 0; i < n_jobs; i++) n_images += jobs[i].cubin + jobs[i].ptx;
    size_t tables = KILN_KSEC_HEADER_SIZE + (size_t)s->n * KILN_KSEC_MODULE_SIZE + (size_t)n_images * KILN_KSEC_IMAGE_SIZE;
    kiln_buf data = {0};
    out->len = 0;
    if (!kiln_buf_zeros(out, tables)) {
        st = kiln_err(err, KILN_ERR_NOMEM, "kernels: out of memory");
        goto out;
    }
    uint8_t *h = out->data;
    memcpy(h, KILN_KSEC_MAGIC, 4);
    kiln_wr_u32(h + 4, KILN_KSEC_VERSION);
    kiln_wr_u32(h + 8, (uint32_t)s->n);
    kiln_wr_u32(h + 12, (uint32_t)n_images);
    kiln_wr_u32(h + 16, s->f32 ? KILN_KSEC_ELEM_F32 : KILN_KSEC_ELEM_BF16);
    kiln_wr_u32(h + 20, (uint32_t)block_size);
    for (int mi = 0; mi < s->n; mi++) {
        uint8_t *r = out->data + KILN_KSEC_HEADER_SIZE + (size_t)mi * KILN_KSEC_MODULE_SIZE;
        put_name(r, s->mods[mi].name, KILN_KSEC_NAME_MAX);
        for (int c = 0; c < KILN_KSEC_CFG_N; c++) kiln_wr_u32(r + 48 + 4 * c, (uint32_t)s->mods[mi].cfg[c]);
        if (s->mods[mi].owner != mi) { /* offset and length stay 0 */
            kiln_wr_u32(r + 96, (uint32_t)s->mods[mi].owner);
            continue;
        }
        kiln_wr_u64(r + 80, data.len);
        kiln_wr_u64(r + 88, s->mods[mi].src.len);
        kiln_wr_u32(r + 96, KILN_KSEC_OWN);
        kiln_buf_append(&data, s->mods[mi].src.data, s->mods[mi].src.len);
    }
    int im = 0;
    for (int i = 0; i < n_jobs; i++) {
        kjob *j = &jobs[i];
        for (int kind = 0; kind < 2; kind++) {
            if (kind == 0 ? !j->cubin : !j->ptx) continue;
            const kiln_buf *b = kind == 0 ? &j->cubin_out : &j->ptx_out;
            size_t pad = (size_t)kiln_align_up(data.len, KILN_KSEC_ALIGN) - data.len;
            kiln_buf_zeros(&data, pad);
            uint8_t *r = out->data + KILN_KSEC_HEADER_SIZE + (size_t)s->n * KILN_KSEC_MODULE_SIZE +
                         (size_t)im++ * KILN_KSEC_IMAGE_SIZE;
            kiln_wr_u32(r, (uint32_t)(j->m - s->mods));
            kiln_wr_u32(r + 4, (uint32_t)j->sm);
            kiln_wr_u32(r + 8, kind == 0 ? KILN_KSEC_CUBIN : KILN_KSEC_PTX);
            kiln_wr_u64(r + 16, data.len);
            kiln_wr_u64(r + 24, b->len + (size_t)kind); /* PTX keeps its NUL */
            kiln_buf_append(&data, b->data, b->len);
            if (kind == 1) kiln_buf_zeros(&data, 1);
        }
    }
    if (data.failed || !kiln_buf_append(out, data.data, data.len))
        st = kiln_err(err, KILN_ERR_NOMEM, "kernels: out of memory assembling the section");
    kiln_buf_free(&data);
out:
    for (int i = 0; i < n_jobs; i++) {
        kiln_buf_free(&jobs[i].cubin_out);
        kiln_buf_free(&jobs[i].ptx_out);
    }
    free(jobs);
    kiln_kernel_modules_free(s);
    return st;
}
