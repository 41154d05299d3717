/*
 * common.cuh — what every kiln kernel shares: bf16 as raw 16-bit storage
 * with fp32 arithmetic, 16-byte loads, warp reductions.
 *
 * Decisions:
 * - No toolkit header is included (not even cuda_bf16.h): kernels compile
 *   fast under NVRTC and need nothing on disk. bf16 is `unsigned short`
 *   bits; widening is a shift, narrowing is PTX cvt.rn (round to nearest
 *   even, sm_80+), the same rounding torch uses.
 * - Weights stream through ld.global.nc.L1::no_allocate: each weight byte
 *   is read once per step and should not evict activations from L1.
 */
#ifndef KILN_COMMON_CUH
#define KILN_COMMON_CUH

#include "params.cuh"

typedef unsigned short kiln_bf16; /* bfloat16 bits */

#define KILN_DEV static __device__ __forceinline__
#define KILN_WARP 32
#define KILN_FULL_MASK 0xffffffffu
#define KILN_NEG_INF (-__int_as_float(0x7f800000))

KILN_DEV float kiln_bf2f(kiln_bf16 h) { return __uint_as_float(((unsigned)h) << 16); }

KILN_DEV kiln_bf16 kiln_f2bf(float f) {
    unsigned short r;
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(r) : "f"(f));
    return r;
}

/* Two floats to a packed bf16x2 word: lo in the low half (the lower address). */
KILN_DEV unsigned kiln_f2bf2(float lo, float hi) {
    unsigned r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}

/* The two bf16 of a packed word, widened. */
KILN_DEV float kiln_lo(unsigned w) { return __uint_as_float(w << 16); }
KILN_DEV float kiln_hi(unsigned w) { return __uint_as_float(w & 0xffff0000u); }

/* 16-byte loads: streaming (read once, skip L1) and ordinary read-only. */
KILN_DEV uint4 kiln_ld_stream(const void *p) {
    uint4 r;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
                 : "l"(p));
    return r;
}
KILN_DEV uint4 kiln_ld16(const void *p) { return __ldg((const uint4 *)p); }

/* 8 bf16 (one uint4) widened into f[0..7]. */
KILN_DEV void kiln_unpack8(uint4 v, float f[8]) {
    f[0] = kiln_lo(v.x); f[1] = kiln_hi(v.x);
    f[2] = kiln_lo(v.y); f[3] = kiln_hi(v.y);
    f[4] = kiln_lo(v.z); f[5] = kiln_hi(v.z);
    f[6] = kiln_lo(v.w); f[7] = kiln_hi(v.w);
}

KILN_DEV uint4 kiln_pack8(const float f[8]) {
    uint4 v;
    v.x = kiln_f2bf2(f[0], f[1]);
    v.y = kiln_f2bf2(f[2], f[3]);
    v.z = kiln_f2bf2(f[4], f[5]);
    v.w = kiln_f2bf2(f[6], f[7]);
    return v;
}

/* Dot of 8 bf16 pairs, accumulated into acc (fp32). */
KILN_DEV float kiln_dot8(uint4 a, uint4 b, float acc) {
    acc = fmaf(kiln_lo(a.x), kiln_lo(b.x), acc);
    acc = fmaf(kiln_hi(a.x), kiln_hi(b.x), acc);
    acc = fmaf(kiln_lo(a.y), kiln_lo(b.y), acc);
    acc = fmaf(kiln_hi(a.y), kiln_hi(b.y), acc);
    acc = fmaf(kiln_lo(a.z), kiln_lo(b.z), acc);
    acc = fmaf(kiln_hi(a.z), kiln_hi(b.z), acc);
    acc = fmaf(kiln_lo(a.w), kiln_lo(b.w), acc);
    acc = fmaf(kiln_hi(a.w), kiln_hi(b.w), acc);
    return acc;
}

/* ---- the element type of activations, weights and the KV cache ----
 * bf16 by default; fp32 when codegen defines KILN_F32=1 (engines compiled in
 * f32 run an f32 path, so they match an f32 reference to rounding). Kernels
 * are written once against these names:
 *   kiln_elem          the storage type (kiln_bf16 or float)
 *   KILN_VEC           elements per 16-byte vector (8 or 4)
 *   kiln_e2f/kiln_f2e  widen / narrow one element (narrowing rounds to bf16)
 *   kiln_round(x)      x rounded to the element type and widened again
 *   kiln_unpackv/packv/dotv   one 16-byte vector as KILN_VEC floats */
#ifndef KILN_F32
#define KILN_F32 0
#endif
#if KILN_F32
typedef float kiln_elem;
#define KILN_VEC 4
KILN_DEV float kiln_e2f(float v) { return v; }
KILN_DEV float kiln_f2e(float f) { return f; }
KILN_DEV float kiln_round(float f) { return f; }
KILN_DEV void kiln_unpackv(uint4 v, float f[4]) {
    f[0] = __uint_as_float(v.x); f[1] = __uint_as_float(v.y);
    f[2] = __uint_as_float(v.z); f[3] = __uint_as_float(v.w);
}
KILN_DEV uint4 kiln_packv(const float f[4]) {
    return make_uint4(__float_as_uint(f[0]), __float_as_uint(f[1]), __float_as_uint(f[2]), __float_as_uint(f[3]));
}
KILN_DEV float kiln_dotv(uint4 a, uint4 b, float acc) {
    acc = fmaf(__uint_as_float(a.x), __uint_as_float(b.x), acc);
    acc = fmaf(__uint_as_float(a.y), __uint_as_float(b.y), acc);
    acc = fmaf(__uint_as_float(a.z), __uint_as_float(b.z), acc);
    acc = fmaf(__uint_as_float(a.w), __uint_as_float(b.w), acc);
    return acc;
}
#else
typedef kiln_bf16 kiln_elem;
#define KILN_VEC 8
KILN_DEV float kiln_e2f(kiln_bf16 v) { return kiln_bf2f(v); }
KILN_DEV kiln_bf16 kiln_f2e(float f) { return kiln_f2bf(f); }
KILN_DEV float kiln_round(float f) { return kiln_bf2f(kiln_f2bf(f)); }
KILN_DEV void kiln_unpackv(uint4 v, float f[8]) { kiln_unpack8(v, f); }
KILN_DEV uint4 kiln_packv(const float f[8]) { return kiln_pack8(f); }
KILN_DEV float kiln_dotv(uint4 a, uint4 b, float acc) { return kiln_dot8(a, b, acc); }
#endif

/* ---- programmatic dependent launch (sm_90+) ----
 * The runtime may launch a kernel before the previous one in the stream
 * has finished (cuLaunchKernelEx with programmatic stream serialization).
 * Every kernel therefore starts with kiln_pdl_wait(): it returns once the
 * previous grid has completed and its writes are visible, so nothing a
 * kernel reads from an earlier one is read early. Only work that needs no
 * earlier result (prefetching weights) may come before it. The GEMV calls
 * kiln_pdl_launch() once its loads are issued, so the next kernel's launch
 * overlaps its tail; the other kernels trigger implicitly when they exit.
 * (Triggering at every kernel's start let waiting blocks crowd the SMs: a
 * Mistral-7B decode step took 6% longer than without PDL on the H200; this
 * placement takes 1% less.) Both are no-ops on older GPUs and for kernels
 * launched the ordinary way. */
KILN_DEV void kiln_pdl_wait(void) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
KILN_DEV void kiln_pdl_launch(void) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" :::);
#endif
}
/* Pull 16 bytes of a weight toward L2 (no earlier result needed: before kiln_pdl_wait). */
KILN_DEV void kiln_prefetch_l2(const void *p) { asm volatile("prefetch.global.L2 [%0];" ::"l"(p)); }

/* The shared-window address of a generic pointer into shared memory. */
KILN_DEV unsigned kiln_saddr(const void *p) {
    unsigned a;
    asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(a) : "l"(p));
    return a;
}

/* cp.async: 16 bytes global -> shared, bypassing L1; src_bytes 0 writes 16 zeros and reads nothing.
 * Before sm_80 (f32 engines may target older GPUs) a plain load and store: done at once. */
KILN_DEV void kiln_cp16(unsigned dst, const void *src, int src_bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "r"(src_bytes) : "memory");
#else
    const uint4 v = src_bytes ? *(const uint4 *)src : make_uint4(0, 0, 0, 0);
    asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};" ::"r"(dst), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w) : "memory");
#endif
}
/* cp.async of 8 bytes (through L1: .cg takes 16 only); src_bytes 0 writes 8 zeros. */
KILN_DEV void kiln_cp8(unsigned dst, const void *src, int src_bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;" ::"r"(dst), "l"(src), "r"(src_bytes) : "memory");
#else
    const uint2 v = src_bytes ? *(const uint2 *)src : make_uint2(0, 0);
    asm volatile("st.shared.v2.u32 [%0], {%1, %2};" ::"r"(dst), "r"(v.x), "r"(v.y) : "memory");
#endif
}
/* cp.async of 4 bytes (through L1); src_bytes 0 writes 4 zeros. */
KILN_DEV void kiln_cp4(unsigned dst, const void *src, int src_bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;" ::"r"(dst), "l"(src), "r"(src_bytes) : "memory");
#else
    const unsigned v = src_bytes ? *(const unsigned *)src : 0u;
    asm volatile("st.shared.u32 [%0], %1;" ::"r"(dst), "r"(v) : "memory");
#endif
}
KILN_DEV void kiln_cp_commit(void) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.commit_group;" ::: "memory");
#endif
}
/* Wait until at most N of this thread's latest groups are in flight. */
template <int N> KILN_DEV void kiln_cp_wait(void) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
#endif
}

/* ---- RoPE, shared by rope_kv.cuh and decode attention's fused path ----
 * inv_freq[i] (i < head_dim/2) as HF's default / llama3 rope init computes it
 * in fp32, and the rotate_half rotation of one element; every operation is
 * explicitly rounded (no contraction into fma), so both kernels give the
 * same bits whether the parameters are compile-time constants or not. */
KILN_DEV float kiln_rope_freq(int i, int head_dim, float theta, int llama3, float factor, float low_ff, float high_ff,
                              float orig_max_pos) {
    float inv = __fdiv_rn(1.0f, powf(theta, __fdiv_rn((float)(2 * i), (float)head_dim)));
    if (llama3) {
        const float lo_wavelen = __fdiv_rn(orig_max_pos, low_ff), hi_wavelen = __fdiv_rn(orig_max_pos, high_ff);
        const float wavelen = __fdiv_rn(__fmul_rn(2.0f, 3.14159265358979323846f), inv);
        if (wavelen > lo_wavelen) {
            inv = __fdiv_rn(inv, factor); /* low frequencies: fully scaled */
        } else if (!(wavelen < hi_wavelen)) {
            /* medium: smooth blend between scaled and unscaled */
            const float smooth = __fdiv_rn(__fsub_rn(__fdiv_rn(orig_max_pos, wavelen), low_ff), __fsub_rn(high_ff, low_ff));
            inv = __fadd_rn(__fdiv_rn(__fmul_rn(__fsub_rn(1.0f, smooth), inv), factor), __fmul_rn(smooth, inv));
        }
    }
    return inv;
}
/* Element d of a rotated head: x = head[d], partner = head[d +- head_dim/2],
 * first = d < head_dim/2: x cos - partner sin, else x cos + partner sin. */
KILN_DEV float kiln_rope_rot(float x, float partner, float c, float s, bool first) {
    return first ? __fsub_rn(__fmul_rn(x, c), __fmul_rn(partner, s)) : __fadd_rn(__fmul_rn(x, c), __fmul_rn(partner, s));
}

/* ---- the GEMV's and the quantized GEMM's shared pieces ---- */
KILN_DEV float kiln_silu(float g) { return g / (1.0f + __expf(-g)); }

/* D = A(16x16 bf16, row) * B(16x8 bf16, col) + D, fp32. */
KILN_DEV void kiln_mma_bf16(float (&d)[4], unsigned a0, unsigned a1, unsigned a2, unsigned a3, unsigned b0,
                            unsigned b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
                 "{%8, %9}, {%0, %1, %2, %3};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

/* ---- 8-bit codes: int8 (q8) and FP8 E4M3 (fp8), widened exactly; E4M3 rounding ---- */
KILN_DEV unsigned kiln_bf2_fma(unsigned a, unsigned b, unsigned c) {
    unsigned d;
    asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    return d;
}

/* q8: the 4 int8 codes of one word (byte i = column i) as 2 bf16x2 words (columns 0,1 and 2,3),
 * exact: 0x4B0000uu is 2^23 + uu in fp32, uu = code + 128. The row's scale comes in the epilogue. */
KILN_DEV void kiln_q8_deq(unsigned w, unsigned (&o)[2]) {
    const unsigned u = w ^ 0x80808080u;
    const float f0 = __uint_as_float(__byte_perm(u, 0x4B000000u, 0x7440)) - 8388736.0f;
    const float f1 = __uint_as_float(__byte_perm(u, 0x4B000000u, 0x7441)) - 8388736.0f;
    const float f2 = __uint_as_float(__byte_perm(u, 0x4B000000u, 0x7442)) - 8388736.0f;
    const float f3 = __uint_as_float(__byte_perm(u, 0x4B000000u, 0x7443)) - 8388736.0f;
    o[0] = kiln_f2bf2(f0, f1);
    o[1] = kiln_f2bf2(f2, f3);
}

/* fp8: the 4 E4M3 codes of one word (byte i = column i) as 2 bf16x2 words (columns 0,1 and 2,3),
 * exact. E4M3's sign, exponent and mantissa fields moved into bf16's (sign to bit 15, the 7 other bits
 * to bits 10..4) make a bf16 whose value is the code's times 2^-120, subnormals included (both
 * formats' subnormals continue their normals the same way: bias 7 against 127); one bf16x2 fma by
 * 2^120 (0x7B80) restores it exactly (bf16 arithmetic keeps subnormals). NaN codes (never written)
 * would come out as large finite values. The row's scale comes in the epilogue. */
KILN_DEV void kiln_fp8_deq(unsigned w, unsigned (&o)[2]) {
    const unsigned lo = __byte_perm(w, 0u, 0x1404); /* bytes 0 and 1 into the high bytes of each half */
    const unsigned hi = __byte_perm(w, 0u, 0x3424); /* bytes 2 and 3 */
    const unsigned a = (lo & 0x80008000u) | ((lo >> 4) & 0x07F007F0u);
    const unsigned b = (hi & 0x80008000u) | ((hi >> 4) & 0x07F007F0u);
    o[0] = kiln_bf2_fma(a, 0x7B807B80u, 0x80008000u);
    o[1] = kiln_bf2_fma(b, 0x7B807B80u, 0x80008000u);
}

/* q8 on CUDA cores: the 4 int8 codes of one word in fp32, exact (kiln_q8_deq's values). */
KILN_DEV void kiln_q8_f32(unsigned w, float (&f)[4]) {
    const unsigned u = w ^ 0x80808080u;
    f[0] = __uint_as_float(__byte_perm(u, 0x4B000000u, 0x7440)) - 8388736.0f;
    f[1] = __uint_as_float(__byte_perm(u, 0x4B000000u, 0x7441)) - 8388736.0f;
    f[2] = __uint_as_float(__byte_perm(u, 0x4B000000u, 0x7442)) - 8388736.0f;
    f[3] = __uint_as_float(__byte_perm(u, 0x4B000000u, 0x7443)) - 8388736.0f;
}
/* fp8 on CUDA cores: the 4 E4M3 codes of one word (byte i = column i) in fp32, exact. On sm_89 and
 * later (GEMV_FP8_CVT 1, the default there) the hardware's conversion, two codes an instruction,
 * to f16 (which holds every E4M3 value, subnormals included) and then to fp32; elsewhere (or with
 * GEMV_FP8_CVT 0, for kiln_gpu_bench) kiln_fp8_deq's exact bf16, widened. */
#ifndef GEMV_FP8_CVT
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
#define GEMV_FP8_CVT 1
#else
#define GEMV_FP8_CVT 0
#endif
#endif
#if __CUDA_ARCH__ >= 890
/* The 4 E4M3 codes of w (byte i = element i) as two f16x2, exact (f16 holds every E4M3 value): lo
 * elements 0, 1, hi 2, 3; sm_89's conversion, two codes an instruction. */
KILN_DEV void kiln_e4m3x4_f16x2(unsigned w, unsigned &lo, unsigned &hi) {
    asm("{\n\t.reg .b16 a, b;\n\tmov.b32 {a, b}, %2;\n\t"
        "cvt.rn.f16x2.e4m3x2 %0, a;\n\tcvt.rn.f16x2.e4m3x2 %1, b;\n\t}"
        : "=r"(lo), "=r"(hi)
        : "r"(w));
}
#endif
/* the two f16 halves of v (lo first) in fp32 */
KILN_DEV void kiln_f16x2_f32(unsigned v, float &lo, float &hi) {
    asm("{\n\t.reg .b16 a, b;\n\tmov.b32 {a, b}, %2;\n\tcvt.f32.f16 %0, a;\n\tcvt.f32.f16 %1, b;\n\t}"
        : "=f"(lo), "=f"(hi)
        : "r"(v));
}
KILN_DEV void kiln_fp8_f32(unsigned w, float (&f)[4]) {
#if GEMV_FP8_CVT
    unsigned lo, hi;
    kiln_e4m3x4_f16x2(w, lo, hi);
    kiln_f16x2_f32(lo, f[0], f[1]);
    kiln_f16x2_f32(hi, f[2], f[3]);
#else
    unsigned o[2];
    kiln_fp8_deq(w, o);
    f[0] = __uint_as_float(o[0] << 16);
    f[1] = __uint_as_float(o[0] & 0xFFFF0000u);
    f[2] = __uint_as_float(o[1] << 16);
    f[3] = __uint_as_float(o[1] & 0xFFFF0000u);
#endif
}

/* x (|x| <= 448 up to rounding) as E4M3, nearest even, saturated: the hardware conversion on
 * sm_89+, elsewhere common/quant.c's kiln_f32_to_e4m3 written out (the same codes). */
KILN_DEV unsigned kiln_e4m3_rn(float x) {
#if __CUDA_ARCH__ >= 890
    unsigned short r;
    asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(r) : "f"(0.0f), "f"(x));
    return r & 0xFFu;
#else
    const unsigned sign = __float_as_uint(x) >> 31 << 7;
    const float a = fabsf(x);
    unsigned code;
    if (a >= 448.0f) code = 0x7Eu;
    else if (a < 0.015625f) code = (unsigned)rintf(a * 512.0f); /* subnormals m 2^-9 */
    else {
        int ex;
        const float f = frexpf(a, &ex);
        const int c = ((ex + 6) << 3) + (int)rintf((f * 2.0f - 1.0f) * 8.0f);
        code = (unsigned)(c > 0x7E ? 0x7E : c);
    }
    return sign | code;
#endif
}

/* The 8 values f times inv as E4M3 codes (kiln_e4m3_rn), value e in byte e: a 16-byte chunk of W8A8's
 * per-token activations as kiln_act_fp8 and the kernels that write its codes for it store them. */
KILN_DEV uint2 kiln_e4m3_pack8(const float f[8], float inv) {
    unsigned w[2] = {0, 0};
#pragma unroll
    for (int e = 0; e < 8; e++) w[e >> 2] |= kiln_e4m3_rn(f[e] * inv) << (8 * (e & 3));
    return make_uint2(w[0], w[1]);
}

/* ---- an 8-bit KV cache (KILN_KV8 1: FP8 E4M3, 2: int8; attention +kv_fp8 / +kv_int8) ----
 * The cache holds one byte per element in the bf16 cache's layout; a kv head's K and V each have a
 * scale (kv_scale, [2][N_KV_HEADS]). kiln_kv_code8 is common/quant.c's kiln_kv_code: x / scale (one
 * IEEE division) rounded to nearest even, E4M3 saturated at 448 or int8 clamped to +-127;
 * kiln_kv_dec4 widens the 4 codes of a word (byte i = element i) to floats, exactly, without the
 * scale (the kernels fold K's into q and V's into the output). */
#ifndef KILN_KV8
#define KILN_KV8 0
#endif
#if KILN_KV8 && KILN_F32
#error "an 8-bit KV cache (KILN_KV8) is for bf16 engines"
#endif
KILN_DEV unsigned kiln_kv_code8(float x, float scale) {
    const float y = __fdiv_rn(x, scale);
#if KILN_KV8 == 2
    return y != y ? 0u : (unsigned)(int)rintf(fminf(fmaxf(y, -127.0f), 127.0f)) & 0xFFu;
#else
    return kiln_e4m3_rn(y);
#endif
}
KILN_DEV void kiln_kv_dec4(unsigned w, float (&f)[4]) {
#if KILN_KV8 == 2
    kiln_q8_f32(w, f);
#else
    kiln_fp8_f32(w, f);
#endif
}
/* Scale i of a layer's kv_scale weight, which the executor uploads in the element type like every
 * vector weight (the compiler makes the scales bf16 values: kiln_kv_scale_for). */
KILN_DEV float kiln_kv_scale(kiln_dptr scales, int i) { return kiln_e2f(((const kiln_elem *)scales)[i]); }
/* Element `at` of an 8-bit cache, times its scale. */
KILN_DEV float kiln_kv_get8(const void *cache, size_t at, float scale) {
    float f[4];
    kiln_kv_dec4((unsigned)((const unsigned char *)cache)[at], f);
    return f[0] * scale;
}
/* f[0..7] as 8 codes (a uint2, 8-byte aligned) at dst */
KILN_DEV void kiln_kv_store8(unsigned char *dst, const float f[8], float scale) {
    unsigned w[2] = {0u, 0u};
#pragma unroll
    for (int e = 0; e < 8; e++) w[e >> 2] |= kiln_kv_code8(f[e], scale) << (8 * (e & 3));
    *(uint2 *)dst = make_uint2(w[0], w[1]);
}
/* 8 codes (a uint2) widened into f[0..7] */
KILN_DEV void kiln_kv_dec8(uint2 w, float f[8]) {
    float a[4], b[4];
    kiln_kv_dec4(w.x, a);
    kiln_kv_dec4(w.y, b);
#pragma unroll
    for (int e = 0; e < 4; e++) f[e] = a[e], f[4 + e] = b[e];
}

#if defined(N_KV_HEADS) && defined(BLOCK_SIZE) && defined(HEAD_DIM)
/* The paged KV cache layout (params.cuh: [block][kv head][BLOCK_SIZE][HEAD_DIM]): the element offset
 * of dim d of kv head h at offset o of KV block blk. For the kernels compiled with the cache constants. */
KILN_DEV size_t kiln_kv_at(int blk, int h, int o, int d) {
    return (((size_t)blk * N_KV_HEADS + h) * BLOCK_SIZE + o) * HEAD_DIM + d;
}
#endif

KILN_DEV float kiln_warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(KILN_FULL_MASK, v, o);
    return v;
}
KILN_DEV float kiln_warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(KILN_FULL_MASK, v, o));
    return v;
}

/* Sum over all threads of the block (blockDim.x a multiple of 32, <= 1024).
 * `scratch` holds 32 floats of shared memory; every thread gets the sum.
 * The order of additions is fixed, so the result is deterministic. */
KILN_DEV float kiln_block_sum(float v, float *scratch) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = kiln_warp_sum(v);
    __syncthreads(); /* scratch may still be read by a previous call */
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    v = lane < nw ? scratch[lane] : 0.0f;
    return kiln_warp_sum(v);
}
KILN_DEV float kiln_block_max(float v, float *scratch) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = kiln_warp_max(v);
    __syncthreads();
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    v = lane < nw ? scratch[lane] : KILN_NEG_INF;
    return kiln_warp_max(v);
}

#endif /* KILN_COMMON_CUH */
