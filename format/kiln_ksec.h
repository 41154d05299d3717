/*
 * kiln_ksec.h — the engine's kernels section: the GPU modules codegen
 * compiled for one model, each as a cubin per target SM and/or PTX; modules
 * whose source text is identical share one stored source and one set of
 * images.
 * codegen/kernels_section.c writes it; format/ksec.c reads it. Plain
 * C, no CUDA header: the compiler includes it in every build.
 * docs/engine-format.md ("kernels section") is the byte-level spec.
 *
 * Layout, version 3, little-endian (the version also stands for the launch
 * contract between the runtime and the kernels: 2 = one-pass attn_decode,
 * whose shared memory kiln_attn_decode_smem sizes; 3 = that, plus modules
 * sharing an earlier module's source and images; a runtime reads only its
 * own version):
 *   header, 32 bytes:
 *      0 u8[4] "KKRN"   4 u32 version (3)   8 u32 n_modules   12 u32 n_images
 *     16 u32 elem (0 = bf16, 1 = f32: the element type every module was built for)
 *     20 u32 KV block size (tokens)   24 u32 reserved (0)   28 u32 reserved (0)
 *   modules: n_modules × 104 bytes:
 *      0 char name[48] (NUL-terminated, unique)
 *     48 i32 cfg[8]    (what the runtime needs to launch it: see below)
 *     80 u64 source offset   88 u64 source length   (the generated CUDA C, in data)
 *     96 u32 shares: KILN_KSEC_OWN, or the index of an earlier module that
 *        owns its source and images (codegen writes one source per distinct
 *        text: the GEMVs of one model often differ only in name). A sharing
 *        module has source offset and length 0 and no images of its own; the
 *        module it names shares nothing itself.
 *    100 u32 reserved (0)
 *   images: n_images × 32 bytes:
 *      0 u32 module index (a module that owns its source)
 *      4 u32 sm (80 = sm_80 / compute_80)
 *      8 u32 kind (0 = cubin for sm_<sm>, 1 = PTX for compute_<sm>, NUL-terminated)
 *     12 u32 reserved (0)   16 u64 offset   24 u64 size   (in data; 16-aligned)
 *   data: the rest of the section; offsets are relative to its start
 *         (32 + 104 n_modules + 32 n_images).
 *
 * Module names and cfg (the runtime finds modules by name):
 *   "util"                          kiln_gather_rows
 *   "rmsnorm.e<eps bits, 8 hex>"    kiln_rmsnorm; cfg[0] = NORM_THREADS
 *   "rope_kv"                       kiln_rope_kv; cfg[0] = ROPE_THREADS, cfg[1] = KILN_KV8 (the KV cache's
 *                                   codes: 0 elements, 1 FP8 E4M3, 2 int8)
 *   "attn_decode.w<window>"         kiln_attn_decode, kiln_attn_decode_combine;
 *                                   cfg[0] = PARTITION, cfg[1] = ATTN_WARPS, cfg[2] = KILN_KV8
 *   "attn_prefill.w<window>"        kiln_attn_prefill (+ kiln_attn_prefill_mma and kiln_attn_prefill_mma16 when cfg[0] = 1);
 *                                   cfg[1] = KILN_KV8
 *   "swiglu.f<ffn>"                 kiln_swiglu, gate/up interleaved; cfg[0] = SWIGLU_THREADS
 *   "sample"                        kiln_sample; cfg[0] = SAMPLE_THREADS
 *   "gemv.<epi>.<N>x<K>.<variant>"  kiln_gemv; epi: plain, swiglu (N = 2 FFN,
 *                                   interleaved rows), f32out (logits);
 *                                   variant: m1 (one token), mma (2..8 tokens);
 *                                   quantized: <dtype> (tensor cores), <dtype>.cc (q8/fp8 on CUDA
 *                                   cores, one token), <dtype>.ck (q4 on CUDA cores, one token);
 *                                   cfg = {warps, rows, unroll, mt, mma, out_f32, swiglu, dtype}
 *                                   (mma 2: .ck's launch, rows a block, its warps splitting K)
 */
#ifndef KILN_KSEC_H
#define KILN_KSEC_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#define KILN_KSEC_MAGIC "KKRN"
#define KILN_KSEC_VERSION 3
#define KILN_KSEC_HEADER_SIZE 32
#define KILN_KSEC_MODULE_SIZE 104
#define KILN_KSEC_IMAGE_SIZE 32
#define KILN_KSEC_NAME_MAX 48
#define KILN_KSEC_CFG_N 8
#define KILN_KSEC_MAX_ITEMS 4096
#define KILN_KSEC_ALIGN 16
#define KILN_KSEC_OWN 0xFFFFFFFFu /* a module's "shares" field: it owns its source and images */

enum { KILN_KSEC_ELEM_BF16 = 0, KILN_KSEC_ELEM_F32 = 1 };
enum { KILN_KSEC_CUBIN = 0, KILN_KSEC_PTX = 1 };

/* The GEMV variants by tokens per step: m1 for one token, mma (bf16) or
 * the CUDA-core kernel (f32) up to KILN_GEMV_MAX_M; cuBLASLt above. (The
 * tensor-core GEMV at 16 and 64 tokens took 7.1 and 21.7 ms per Mistral-7B
 * step on the H200, cuBLASLt 5.5 and 7.3 ms.) */
#define KILN_GEMV_MAX_M 8

/* The name of a GEMV module: "gemv.<epi>.<N>x<K>.<variant>". */
static inline void kiln_ksec_gemv_name(char *buf, size_t cap, const char *epi, int n, int k, const char *variant) {
    snprintf(buf, cap, "gemv.%s.%dx%d.%s", epi, n, k, variant);
}
/* The variants of the CUDA-core GEMV over a quantized weight of dtype name `dtype`, for one-token steps
 * (beside the tensor-core variant named `dtype`): "<dtype>.cc", a warp's rows over all of K (cfg[4] =
 * 0), or "<dtype>.ck", the block's warps splitting K (cfg[4] = 2; which dtypes take it is codegen's
 * kiln_quant_gemv_ck: q4 in engines from 2026-12-02 on, fp8 from the commit after 912f7b4). A matrix has
 * at most one of the two; a runtime takes ".ck" where it is, else ".cc". Runtimes before ".ck" look for
 * ".cc" only and keep the tensor cores. */
static inline void kiln_ksec_gemv_cc_variant(char *buf, size_t cap, const char *dtype, bool ck) {
    snprintf(buf, cap, "%s.%s", dtype, ck ? "ck" : "cc");
}
/* The quantized GEMM's variants for a quantized weight of dtype name `dtype` (kernels/qgemm.cuh, entry
 * kiln_qgemm; engines from 2026-12-04): "<dtype>.mx32", 32 rows of x a block, and "<dtype>.mx", 64, for
 * steps of more rows than the GEMV takes. cfg[0] warps, cfg[1] rows of x a block (32 or 64), cfg[2] the
 * ring's stages; runtimes before them look for neither. */
static inline void kiln_ksec_gemv_qg_variant(char *buf, size_t cap, const char *dtype, int tm) {
    snprintf(buf, cap, "%s.mx%s", dtype, tm == 32 ? "32" : "");
}

#endif /* KILN_KSEC_H */
