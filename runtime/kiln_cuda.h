/*
 * kiln_cuda.h — the runtime's GPU layer: CUDA driver API only (no cudart),
 * loaded with dlopen, plus cuBLASLt for dense GEMMs.
 *
 * Why dlopen: a binary linked against libcuda.so.1 does not even start on a
 * host without the NVIDIA driver (the CI machine has the toolkit but no
 * driver); with dlopen, kiln_cuda_init() returns KILN_ERR_DEVICE with a
 * message saying the driver is missing, and everything else still works.
 * The symbol names come from the toolkit's cuda.h (its macros map cuMemAlloc
 * to cuMemAlloc_v2 and so on), so prototypes and symbols always agree.
 *
 * State: everything lives in a kiln_cuda struct the caller owns (no global
 * state). One kiln_cuda = one device, its primary context made current on
 * the calling thread by kiln_cuda_init() and kiln_cuda_make_current().
 *
 * Checking: every driver call goes through KILN_CU_CALL and every cuBLASLt
 * call through KILN_CUBLASLT_CALL; on failure they record the call text,
 * file, line and the library's error name in a kiln_error and yield the
 * status (never exit). Kernel launches go through kiln_cuda_launch, which
 * names the kernel in its error.
 */
#ifndef KILN_CUDA_H
#define KILN_CUDA_H

#include <cuda.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdint.h>

#include "../common/kiln_util.h"
#include "../format/kiln_tuning.h"

/* The driver entry points kiln uses, as X(name). Members keep cuda.h's names. */
#define KILN_CU_FUNCS(X)                                                                        \
    X(cuInit) X(cuDriverGetVersion) X(cuGetErrorName) X(cuGetErrorString)                      \
    X(cuDeviceGetCount) X(cuDeviceGet) X(cuDeviceGetName) X(cuDeviceGetAttribute)              \
    X(cuDeviceTotalMem) X(cuDevicePrimaryCtxRetain) X(cuDevicePrimaryCtxRelease)               \
    X(cuCtxSetCurrent) X(cuCtxSynchronize)                                                     \
    X(cuModuleLoadDataEx) X(cuModuleUnload) X(cuModuleGetFunction) X(cuModuleGetGlobal)        \
    X(cuFuncSetAttribute) X(cuFuncGetAttribute) X(cuLaunchKernel)                              \
    X(cuMemAlloc) X(cuMemFree) X(cuMemAllocHost) X(cuMemFreeHost) X(cuMemGetInfo)              \
    X(cuMemcpyHtoD) X(cuMemcpyDtoH) X(cuMemcpyDtoD) X(cuMemcpyHtoDAsync) X(cuMemcpyDtoHAsync)  \
    X(cuMemcpyDtoDAsync) X(cuMemsetD8) X(cuMemsetD16) X(cuMemsetD32) X(cuMemsetD8Async)        \
    X(cuStreamCreate) X(cuStreamDestroy) X(cuStreamSynchronize)                                \
    X(cuEventCreate) X(cuEventDestroy) X(cuEventRecord) X(cuEventSynchronize)                  \
    X(cuEventElapsedTime)                                                                      \
    X(cuStreamBeginCapture) X(cuStreamEndCapture) X(cuGraphInstantiate) X(cuGraphLaunch)       \
    X(cuGraphExecDestroy) X(cuGraphDestroy) X(cuCtxGetCurrent) X(cuStreamWaitEvent)            \
    X(cuMemcpy2DAsync) X(cuCtxGetLimit) X(cuLaunchKernelEx) X(cuEventQuery) \
    X(cuDeviceCanAccessPeer) X(cuCtxEnablePeerAccess)                                        \
    X(cuModuleGetFunctionCount) X(cuModuleEnumerateFunctions) X(cuFuncGetName)

#define KILN_CU_MEMBER_(fn) __typeof__(fn) *fn;

/* The driver's function table, filled by kiln_cuda_init(). */
typedef struct kiln_cu_api {
    void *lib; /* dlopen handle of libcuda.so.1 */
    KILN_CU_FUNCS(KILN_CU_MEMBER_)
} kiln_cu_api;

/* One device and its primary context. */
typedef struct kiln_cuda {
    kiln_cu_api api;
    CUdevice dev;
    CUcontext ctx;         /* the device's primary context (retained) */
    int ordinal;           /* device index as the driver counts them */
    int sm;                /* compute capability major*10+minor, e.g. 90 */
    int n_sm;              /* multiprocessors */
    int driver_version;    /* e.g. 13000 */
    int l2_bytes;          /* L2 cache size */
    int smem_optin;        /* largest dynamic shared memory a block may opt into, bytes */
    size_t total_mem;      /* device memory, bytes */
    char name[256];        /* "NVIDIA H200" */
} kiln_cuda;

/*
 * Open device `ordinal`: dlopen the driver, cuInit, retain the primary
 * context and make it current. Fails with KILN_ERR_DEVICE and a message that
 * says which step failed ("no CUDA driver: ...", "no CUDA device: ...").
 * On failure *cu is left zeroed and needs no kiln_cuda_free.
 */
kiln_status kiln_cuda_init(kiln_cuda *cu, int ordinal, kiln_error *err);
void kiln_cuda_free(kiln_cuda *cu);
kiln_status kiln_cuda_make_current(kiln_cuda *cu, kiln_error *err);
kiln_status kiln_cuda_sync(kiln_cuda *cu, kiln_error *err);

/* The checking macro for driver calls; yields a kiln_status. */
#define KILN_CU_CALL(cu, err, call) kiln_cu_check_((cu), (int)(call), #call, __FILE__, __LINE__, (err))
kiln_status kiln_cu_check_(const kiln_cuda *cu, int result, const char *call, const char *file, int line,
                           kiln_error *err);

/* ---- modules ---- */

/* One compiled image of a kernel module: a cubin for sm, or PTX for compute_sm. */
typedef struct kiln_cuda_image {
    int sm;           /* 90 for sm_90 / compute_90 */
    bool is_ptx;      /* PTX text (NUL-terminated) rather than a cubin */
    const void *data;
    size_t len;
} kiln_cuda_image;

/*
 * Load the image that fits this device: a cubin of the same major version
 * and the highest minor not above the device's; else the newest PTX not
 * above the device's SM, JIT-compiled by the driver (*jitted = true). When
 * none fits, KILN_ERR_UNSUPPORTED names the device, its SM and the targets
 * that were offered. `what` names the module in messages.
 */
kiln_status kiln_cuda_module_load(kiln_cuda *cu, const kiln_cuda_image *images, int n_images, const char *what,
                                  CUmodule *out, bool *jitted, kiln_error *err);
/* Index into `images` of the one kiln_cuda_module_load would pick for a
 * device of compute capability `device_sm`, or -1 when none fits. */
int kiln_cuda_pick_image(const kiln_cuda_image *images, int n_images, int device_sm);

kiln_status kiln_cuda_module_function(kiln_cuda *cu, CUmodule mod, const char *name, CUfunction *out,
                                      kiln_error *err);
/* Whether module `mod` holds entry `name` (*out its handle, else NULL), found among the module's
 * functions rather than by asking for the name, so that an entry a module may lack (one compiled only
 * for some targets) is not a failed driver call (compute-sanitizer reports those). */
bool kiln_cuda_module_has(kiln_cuda *cu, CUmodule mod, const char *name, CUfunction *out);
void kiln_cuda_module_unload(kiln_cuda *cu, CUmodule mod);

/* Launch geometry of one kernel launch. */
typedef struct kiln_cuda_dims {
    unsigned grid[3], block[3];
    unsigned smem; /* dynamic shared memory, bytes */
} kiln_cuda_dims;

/*
 * cuLaunchKernel with `args` (an array of pointers to each parameter, as the
 * driver wants). Raises the function's dynamic shared-memory limit first
 * when d->smem is over 48 KiB. `what` names the kernel in messages. Errors
 * in the kernel itself surface at the next synchronising call.
 */
kiln_status kiln_cuda_launch(kiln_cuda *cu, CUfunction f, const kiln_cuda_dims *d, CUstream stream, void **args,
                             const char *what, kiln_error *err);
/* The same; with `pdl` (sm_90+) the launch may start before the previous
 * kernel in the stream ends (programmatic stream serialization): the
 * kernel must begin with kiln_pdl_wait() (kernels/common.cuh). */
/* Lets f take `dynamic` bytes of dynamic shared memory beside its static ones (the opt-in past 48 KB
 * in all); an error naming the kernel when the device has less. */
kiln_status kiln_cuda_func_smem(kiln_cuda *cu, CUfunction f, unsigned dynamic, const char *what, kiln_error *err);
kiln_status kiln_cuda_launch_ex(kiln_cuda *cu, CUfunction f, const kiln_cuda_dims *d, CUstream stream, void **args,
                                bool pdl, const char *what, kiln_error *err);

/* ---- launch geometry of the kernel families in kernels/ ---- */

/* CUDA's grid limits: x up to 2^31 - 1, y and z up to 65,535 blocks. */
#define KILN_CUDA_GRID_X_MAX 2147483647u
#define KILN_CUDA_GRID_YZ_MAX 65535u
/* KILN_OK when d's grid is within CUDA's limits and not empty, else
 * KILN_ERR_INVALID_ARG naming the kernel `what` and the dims (every launch
 * passes through this before the driver, which would only say
 * CUDA_ERROR_INVALID_VALUE). */
kiln_status kiln_cuda_dims_check(const kiln_cuda_dims *d, const char *what, kiln_error *err);
/* Grid and block of kiln_swiglu (swiglu.cuh) for M rows of ffn outputs with `threads` threads a
 * block and `vec` elements per 16-byte chunk (8 bf16, 4 fp32): grid y is min(M, 65535), the kernel
 * strides over the rows. */
kiln_cuda_dims kiln_swiglu_dims(int ffn, int M, int threads, int vec);
/* kiln_swiglu_fp8's block (swiglu.cuh's SWIGLU_FP8_THREADS) */
#define KILN_SWIGLU_FP8_THREADS 1024

/* The GEMV's compile-time shape (gemv.cuh's GEMV_* constants). */
typedef struct kiln_gemv_cfg {
    int warps, rows, unroll, mt;
    int mma; /* 1: GEMV_MMA, the tensor-core variant (16 rows x 8 x-rows per block; mt ignored, and rows
              * the quantized GEMV's 16-row tiles per warp, GEMV_QT: 0 or 1 is one); 2: the q4 CUDA-core
              * GEMV (GEMV_MMA 0, GEMV_QUANT 4), whose block's warps split K over `rows` rows, one x row
              * a block (mt ignored) */
} kiln_gemv_cfg;

/* Grid and block of kiln_gemv for an M x K by N x K product (the tensor-core
 * variant puts the x tiles in grid.x and the row groups in grid.y). */
kiln_cuda_dims kiln_gemv_dims(const kiln_gemv_cfg *c, int M, int N);
/* The quantized GEMM (qgemm.cuh) as a module was built: QG_WARPS (16 rows of W each), QG_TM rows of x,
 * QG_STAGES, and the weight's bits and q4 group. */
typedef struct kiln_qgemm_cfg {
    int warps, tm, stages, bits, group;
} kiln_qgemm_cfg;
/* The split of K for a step of M rows by an N x K matrix on a GPU of `sms` SMs: where the step's tiles
 * fill fewer than `sms`, K is split over up to 2 * sms blocks, each at least one 128-column chunk
 * (*chunks per split); 1 otherwise. kiln_qgemm_dims: grid, block and the ring's dynamic shared
 * memory. kiln_qgemm_ws_floats: the f32 workspace any split on such a GPU needs (tiles * splits <=
 * 2 * sms), kiln_qgemm_cnt the tile counters. */
int kiln_qgemm_splits(const kiln_qgemm_cfg *c, int M, int N, int K, int sms, int *chunks);
kiln_cuda_dims kiln_qgemm_dims(const kiln_qgemm_cfg *c, int M, int N, int splits);
size_t kiln_qgemm_ws_floats(const kiln_qgemm_cfg *c, int sms);
size_t kiln_qgemm_cnt(int sms);
/* Dynamic shared memory of kiln_attn_decode and kiln_attn_prefill. */
unsigned kiln_attn_decode_smem(int n_heads, int n_kv_heads, int head_dim, int block_size, int partition_max, int warps);
/* ... and of kiln_attn_decode_tc (the tensor-core decode kernel: a warp a kv head, grid
 * (ceil(n_kv_heads / warps), B, max_splits)), kv_es bytes an element of the cache */
unsigned kiln_attn_decode_tc_smem(int head_dim, int block_size, int partition_max, int warps, int kv_es);
unsigned kiln_attn_prefill_smem(int head_dim);
/* kiln_attn_prefill_mma (tensor cores) comes as two kernels: kiln_attn_prefill_mma with mt = 2
 * m16 tiles (32 query rows) per warp, its q staged in shared memory, and kiln_attn_prefill_mma16
 * with mt = 1 (16 rows, q in registers), for devices whose shared memory the first does not fit.
 * KILN_PF_MMA_WARPS is their warps per block (PF_MMA_WARPS) as compiled by codegen, which leaves
 * the kernel's default. */
#define KILN_PF_MMA_WARPS 4
unsigned kiln_attn_prefill_mma_smem(int head_dim, int warps, int mt, bool kv8);
/* Grid, block and shared memory of kiln_attn_prefill_mma (mt 2) or _mma16 (mt 1) compiled with
 * PF_MMA_WARPS = warps, for a batch of B sequences whose longest chunk has max_q queries; kv8: built
 * for an 8-bit KV cache (KILN_KV8), which stages the codes too. */
kiln_cuda_dims kiln_attn_prefill_mma_dims(int warps, int mt, int n_heads, int B, int max_q, int head_dim, bool kv8);
/* kiln_attn_prefill_wg (sm_90a's wgmma; attn_prefill.cuh): `groups` warpgroups of 64 query rows a block
 * (the kernel's PF_WG_GROUPS, KILN_PF_WG_GROUPS as codegen compiles it), key tiles of 128 in
 * KILN_PF_WG_STAGES stages; its shared memory and launch dimensions for a batch of B sequences whose
 * longest chunk has max_q queries. */
#define KILN_PF_WG_GROUPS 2
#define KILN_PF_WG_STAGES 3
unsigned kiln_attn_prefill_wg_smem(int head_dim, int groups);
kiln_cuda_dims kiln_attn_prefill_wg_dims(int groups, int n_heads, int B, int max_q, int head_dim);
/* Splits kiln_attn_decode needs for a context of `len` tokens. */
int kiln_attn_decode_splits(int len, int window, int partition);
/* The split size for a decode step: short enough that batch x kv heads x
 * splits fills about two waves of the GPU's `n_sm` multiprocessors, a
 * multiple of 32, at least 32 and at most partition_max (the kernel's
 * PARTITION). `max_len` is the longest context in the batch. */
int kiln_attn_decode_partition(int batch, int n_kv_heads, int max_len, int window, int n_sm, int partition_max);

/* ---- memory ---- */

kiln_status kiln_cuda_alloc(kiln_cuda *cu, size_t bytes, CUdeviceptr *out, kiln_error *err);
void kiln_cuda_release(kiln_cuda *cu, CUdeviceptr p); /* cuMemFree; 0 is a no-op */
kiln_status kiln_cuda_upload(kiln_cuda *cu, CUdeviceptr dst, const void *src, size_t bytes, kiln_error *err);
kiln_status kiln_cuda_download(kiln_cuda *cu, void *dst, CUdeviceptr src, size_t bytes, kiln_error *err);
/* Fill `bytes` bytes (a multiple of 2) with the 16-bit pattern (e.g. a bf16 NaN, to poison outputs). */
kiln_status kiln_cuda_fill16(kiln_cuda *cu, CUdeviceptr dst, uint16_t pattern, size_t bytes, kiln_error *err);
/* Fill `bytes` bytes (a multiple of 4) with a 32-bit pattern. */
kiln_status kiln_cuda_fill32(kiln_cuda *cu, CUdeviceptr dst, uint32_t pattern, size_t bytes, kiln_error *err);

/* ---- cuBLASLt (dense GEMMs: prefill, and decode steps above the GEMV's token limit) ---- */

/* The checking macro for cuBLASLt calls; yields a kiln_status. */
#define KILN_CUBLASLT_CALL(err, call) kiln_cublaslt_check_((int)(call), #call, __FILE__, __LINE__, (err))
kiln_status kiln_cublaslt_check_(int result, const char *call, const char *file, int line, kiln_error *err);

typedef struct kiln_cublaslt kiln_cublaslt; /* opaque: handle, workspace, plan cache */

kiln_status kiln_cublaslt_create(kiln_cuda *cu, size_t workspace_bytes, kiln_cublaslt **out, kiln_error *err);
void kiln_cublaslt_destroy(kiln_cublaslt *lt);
/*
 * y[M,N] = x[M,K] · W[N,K]^T (+ y when accumulate), all row-major bf16, fp32
 * accumulation: the layout of a HuggingFace Linear (weight [out, in]).
 */
kiln_status kiln_cublaslt_gemm_bf16(kiln_cublaslt *lt, int M, int N, int K, CUdeviceptr x, CUdeviceptr w,
                                    CUdeviceptr y, bool accumulate, CUstream stream, kiln_error *err);
/* The same with the element types chosen: x and W fp32 (strict fp32
 * arithmetic, no TF32) or bf16; y fp32 or bf16 (fp32 logits from bf16
 * weights, for one). */
kiln_status kiln_cublaslt_gemm_ex(kiln_cublaslt *lt, bool in_f32, bool out_f32, int M, int N, int K, CUdeviceptr x,
                                  CUdeviceptr w, CUdeviceptr y, bool accumulate, CUstream stream, kiln_error *err);
/* W8A8's scales and accumulation (kiln_cublaslt_gemm_fp8): a scale per row of x and of W, with the
 * tensor cores' partial sums promoted to fp32 along K or (fast: the plan's +fast_accum) not, or a scale
 * per row and 128 columns (fp8g128; cuBLASLt 130100 has no fast accumulation for it). */
typedef enum kiln_lt_fp8 {
    KILN_LT_FP8_ROWS = 1,
    KILN_LT_FP8_BLOCK128 = 2,
    KILN_LT_FP8_ROWS_FAST = 3,
} kiln_lt_fp8;
/* W8A8: y[M,N] = (x_scale[m] * w_scale[n]) * sum_k x[m,k] W[n,k] (+ y when accumulate), x and W
 * FP8 E4M3 codes (row-major [M,K] and [N,K], K % 16 == 0), the scales f32 [M] and [N] (16-byte
 * aligned), y bf16 or fp32 (out_f32): cuBLASLt's FP8 GEMM with outer-vector scales (sm_89+,
 * cuBLASLt 12.9+). KILN_LT_FP8_BLOCK128: a scale per 128 columns instead, for each group g of K (the
 * last the rest) y[m,n] = sum_g x_scale[g M + m] w_scale[g N + n] sum_{k in g} x[m,k] W[n,k]
 * (group-major scales; M a multiple of 4: cuBLASLt 130100 on the H200 has no algorithm otherwise).
 * KILN_ERR_UNSUPPORTED when the library has no algorithm for it (the caller then takes another
 * route). */
kiln_status kiln_cublaslt_gemm_fp8(kiln_cublaslt *lt, bool out_f32, kiln_lt_fp8 mode, int M, int N, int K, CUdeviceptr x,
                                   CUdeviceptr x_scale, CUdeviceptr w, CUdeviceptr w_scale, CUdeviceptr y,
                                   bool accumulate, CUstream stream, kiln_error *err);
/*
 * Pick the algorithm of gemm_ex's shape (in_f32, out_f32, M, N, K,
 * accumulate) by timing: the heuristic's first 12 answers that fit the
 * workspace each run a few times on `stream` over the weights w[0..n_w-1]
 * in turn (every layer's copy of this shape, so the runs read HBM rather
 * than L2) with x [M,K] and y [M,N] as scratch: their contents are
 * overwritten (y is also read when accumulate), never pass live buffers.
 * The fastest is kept in the plan cache (pinned: later gemm_ex calls of the
 * shape use it, and prefill's shapes never evict it); tuning a shape twice
 * does nothing. Queues work and synchronises `stream`, which must be a
 * created stream (the legacy one cannot be captured) and not capturing.
 * A failure to time (no candidate ran, the table of pinned plans is full)
 * is not an error: the heuristic's first answer stays and `log` (NULL =
 * silent) says why. With `log` each candidate's configuration and time
 * and the choice are written there. Errors only when even the heuristic's
 * plan could not be made (what gemm_ex would fail on too).
 */
kiln_status kiln_cublaslt_tune(kiln_cublaslt *lt, bool in_f32, bool out_f32, int M, int N, int K, bool accumulate,
                               const CUdeviceptr *w, int n_w, CUdeviceptr x, CUdeviceptr y, CUstream stream, FILE *log,
                               kiln_error *err);
/* Whether tuning also times variants of the heuristic's fastest answers (other tiles, split-K) where
 * those fill less than a wave of the GPU (runtime/cuda/cublaslt.c; off by default). */
void kiln_cublaslt_set_search(kiln_cublaslt *lt, bool on);
/* The same for kiln_cublaslt_gemm_fp8's shape: w the weights' E4M3 codes, x [M,K] E4M3 scratch, the
 * scales x_scale [M] and w_scale [N] any f32 values (the timing does not depend on them). */
kiln_status kiln_cublaslt_tune_fp8(kiln_cublaslt *lt, bool out_f32, kiln_lt_fp8 mode, int M, int N, int K, bool accumulate,
                                   const CUdeviceptr *w, int n_w, CUdeviceptr x, CUdeviceptr x_scale,
                                   CUdeviceptr w_scale, CUdeviceptr y, CUstream stream, FILE *log, kiln_error *err);

/* ---- the engine's tuning record (format/kiln_tuning.h) ---- */

/* cublasLtGetVersion() of the loaded library (e.g. 130100). */
size_t kiln_cublaslt_version(const kiln_cublaslt *lt);
/* Use `r`'s algorithms (copied; NULL = none): a plan made from then on for a
 * shape the record has (kiln_tuning_find: M exactly, else M's power-of-two
 * bucket) takes the recorded algorithm when cublasLtMatmulAlgoCheck accepts
 * it for the plan's descriptors and workspace, else the heuristic's answer;
 * kiln_cublaslt_tune then keeps a recorded plan as it is, without timing. */
kiln_status kiln_cublaslt_use_recorded(kiln_cublaslt *lt, const kiln_tuning_record *r, kiln_error *err);
/* Of the record's entries: how many some plan used, how many AlgoCheck refused. */
void kiln_cublaslt_recorded_counts(const kiln_cublaslt *lt, int *used, int *refused);
/* The measured choices of kiln_cublaslt_tune (plans it timed, not recorded
 * ones) into out[0..cap-1]; returns how many there are (may exceed cap). */
int kiln_cublaslt_export(const kiln_cublaslt *lt, kiln_tuning_gemm *out, int cap);
/* "algo 66 tile 20 stages 31 ...": a recorded algorithm's configuration, for reports. */
void kiln_cublaslt_algo_str(const kiln_cublaslt *lt, const uint8_t algo[KILN_TUNING_ALGO_SIZE], char *buf, size_t n);

#endif /* KILN_CUDA_H */
