/*
 * kiln_tuning.h — the tuning section (kind 7, KILN_SECTION_TUNING): choices
 * that are stable for one GPU type, measured once (`kiln tune`) and reused
 * at every load, so an engine runs the same kernels every time.
 * docs/engine-format.md ("The tuning section") is the specification; the
 * reader is runtime/tuning.c, the in-place append runtime/engine_append.c.
 *
 * Why: cuBLASLt's heuristic ranks algorithms by a model and its answer can
 * change with a library update, which silently changes an engine's speed;
 * the executor's thresholds (GEMV token limits, RoPE split limit, attention
 * waves) are per-SM choices too. A record names the GPU and library it was
 * measured with; the executor uses its algorithms only when the cuBLASLt
 * version matches and cublasLtMatmulAlgoCheck accepts each one.
 *
 * Layout (little-endian), version 1:
 *
 *   header, 16 bytes
 *      0 u8[4] "KTUN"   4 u32 version (1)   8 u32 n_records (0..KILN_TUNING_MAX_RECORDS)   12 u32 reserved (0)
 *   n_records records, each a header of 192 bytes and then n_gemms entries of 128 bytes:
 *      0 u32 sm (compute capability major·10 + minor: 90 = sm_90; 50..999)
 *      4 i32 driver version (cuDriverGetVersion, e.g. 13000; informative)
 *      8 u64 cuBLASLt version (cublasLtGetVersion, e.g. 130100): algorithms are used only when it matches
 *     16 char device[128] (cuDeviceGetName; NUL-terminated, non-empty)
 *    144 u32 n_gemms (0..KILN_TUNING_MAX_GEMMS)
 *    148 u32 gemv_max_m    most tokens per step the bf16 tensor-core GEMV takes (0 = the runtime's default, else 1..64)
 *    152 u32 qgemv_max_m   ... the quantized GEMV takes (0 = default, else 1..64)
 *    156 u32 rope_split_max_t  steps of at most this many tokens spread rope_kv over heads (0 = default, else 1..65536)
 *    160 f32 attn_waves    decode attention's splits aim for this many waves (0 = default, else (0, 64])
 *    164 f32 seconds       how long the measurement took (>= 0, informative)
 *    168 u32 decode_tc_min decode attention takes the tensor-core kernel (engines that have it: an FP8 KV cache)
 *                          at steps of at least this many sequences (0 = the runtime's default, 80; else 1..65536;
 *                          records before 2026-12-04 hold 0 here, and readers before then ignore it)
 *    172 u8[20] reserved (0)
 *   gemm entry, 128 bytes: one cuBLASLt GEMM shape y[M,N] = x[M,K]·W[N,K]^T (runtime/kiln_cuda.h)
 *      0 u32 m       rows it was timed at: a decode batch, or a prefill step size; a GEMM of M rows uses the
 *                    entry with m = M, else the one with m = M rounded up to a power of two (1..1<<20)
 *      4 u32 n   8 u32 k   (1..1<<24 each)
 *     12 u32 flags   1 = x and W fp32 (else bf16), 2 = y fp32 (else bf16), 4 = accumulate (y += ...),
 *                    8 = W8A8 (x and W E4M3 codes with their scales; not with 1), 16 = with 8, W's and x's
 *                    scales per 128 columns (fp8g128), 32 = with 8 and not 16, FP8 fast accumulation (the
 *                    plan's +fast_accum); no others
 *     16 f32 us      the chosen algorithm's measured time per GEMM, microseconds (> 0)
 *     20 f32 heuristic_us  the heuristic's first answer's, or -1 when it did not run
 *     24 u32 candidates    algorithms timed    28 u32 pick  the chosen one's rank: in the heuristic's
 *                          list, then split-K variants after its answers (runtime/cuda/cublaslt.c)
 *     32 u8[32] reserved (0)
 *     64 u8[64] the cublasLtMatmulAlgo_t, as the library gave it (opaque)
 *
 * The records fill the section exactly. No two records have the same sm and
 * device; no two entries of a record the same (m, n, k, flags). A reader
 * refuses anything else with KILN_ERR_FORMAT naming the record and entry.
 */
#ifndef KILN_TUNING_H
#define KILN_TUNING_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../common/kiln_util.h"
#include "kiln_engine.h"

#define KILN_TUNING_MAGIC "KTUN"
#define KILN_TUNING_VERSION 1
#define KILN_TUNING_HEADER_SIZE 16
#define KILN_TUNING_RECORD_SIZE 192
#define KILN_TUNING_GEMM_SIZE 128
#define KILN_TUNING_ALGO_SIZE 64 /* sizeof(cublasLtMatmulAlgo_t): uint64_t data[8] */
#define KILN_TUNING_MAX_RECORDS 32
#define KILN_TUNING_MAX_GEMMS 4096
#define KILN_TUNING_DEVICE_MAX 128

enum {
    KILN_TUNING_IN_F32 = 1,
    KILN_TUNING_OUT_F32 = 2,
    KILN_TUNING_ACCUMULATE = 4,
    KILN_TUNING_FP8 = 8,      /* W8A8 */
    KILN_TUNING_FP8_B128 = 16, /* with FP8: scales per 128 columns (fp8g128) */
    KILN_TUNING_FP8_FAST = 32, /* with FP8, not B128: FP8 fast accumulation (+fast_accum) */
    KILN_TUNING_FLAGS_ALL_ = KILN_TUNING_IN_F32 | KILN_TUNING_OUT_F32 | KILN_TUNING_ACCUMULATE | KILN_TUNING_FP8 |
                             KILN_TUNING_FP8_B128 | KILN_TUNING_FP8_FAST /* what a reader knows: a new bit goes here too */
};
/* A GEMM's input and output types by name, for kiln tune and kiln inspect */
static inline const char *kiln_tuning_in_type(uint32_t flags) {
    return flags & KILN_TUNING_FP8_B128 ? "fp8g128" : flags & KILN_TUNING_FP8 ? "fp8" : flags & KILN_TUNING_IN_F32 ? "f32" : "bf16";
}
static inline const char *kiln_tuning_out_type(uint32_t flags) { return flags & KILN_TUNING_OUT_F32 ? "f32" : "bf16"; }

typedef struct kiln_tuning_gemm {
    uint32_t m, n, k, flags;
    float us, heuristic_us;
    uint32_t candidates, pick;
    uint8_t algo[KILN_TUNING_ALGO_SIZE];
} kiln_tuning_gemm;

typedef struct kiln_tuning_record {
    uint32_t sm;
    int32_t driver_version;
    uint64_t lt_version;
    char device[KILN_TUNING_DEVICE_MAX];
    uint32_t gemv_max_m, qgemv_max_m, rope_split_max_t; /* 0 = the runtime's default */
    float attn_waves;                                   /* 0 = the runtime's default */
    uint32_t decode_tc_min;                             /* 0 = the runtime's default */
    float seconds;
    uint32_t n_gemms;
    kiln_tuning_gemm *gemms; /* malloc'd, n_gemms */
} kiln_tuning_record;

typedef struct kiln_tuning {
    uint32_t n_records;
    kiln_tuning_record records[KILN_TUNING_MAX_RECORDS];
} kiln_tuning;

/* Parse a tuning section's bytes (hostile input: every size checked, the
 * caps above). `label` names it in messages. Free with kiln_tuning_free. */
kiln_status kiln_tuning_parse(const uint8_t *data, size_t size, const char *label, kiln_tuning *out, kiln_error *err);
/* The engine's tuning section parsed; *present = false (and *out empty) when it has none. */
kiln_status kiln_tuning_load(const kiln_engine *e, kiln_tuning *out, bool *present, kiln_error *err);
void kiln_tuning_free(kiln_tuning *t);
/* The section's bytes for `t` (checked as the reader checks them: a record
 * the reader would refuse is refused here too). out->data is malloc'd. */
kiln_status kiln_tuning_write(const kiln_tuning *t, kiln_buf *out, kiln_error *err);
/* Put `r` into `t`, replacing the record with its sm and device; `t` takes
 * the record's gemms (r->gemms is set to NULL). */
kiln_status kiln_tuning_put(kiln_tuning *t, kiln_tuning_record *r, kiln_error *err);
/* The record for a GPU: the one with its sm and device name, else the first
 * with its sm; NULL when none. */
const kiln_tuning_record *kiln_tuning_pick(const kiln_tuning *t, int sm, const char *device);
/* The entry of `r` a GEMM of M rows with (n, k, flags) uses: m = M, else m =
 * M rounded up to a power of two; NULL when none. */
const kiln_tuning_gemm *kiln_tuning_find(const kiln_tuning_record *r, int M, int n, int k, uint32_t flags);

/* Replace the engine file's first section of `kind` (or add one) with `n`
 * bytes of codec none, in place: the new section goes after the current end
 * of the file, then a new section table, then the 64-byte header is
 * rewritten (same major and minor, reserved bytes kept). The engine is fully
 * verified first. Any failure truncates the file back to its original size,
 * so it is left byte-identical; signals are held off while the file is
 * inconsistent. *old_size and *new_size (may be NULL) get the sizes. */
kiln_status kiln_engine_put_section(const char *path, uint32_t kind, const void *p, size_t n, uint64_t *old_size,
                                    uint64_t *new_size, kiln_error *err);

#endif /* KILN_TUNING_H */
