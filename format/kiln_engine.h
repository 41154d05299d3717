/*
 * kiln_engine.h — the engine file: constants of the format and the reader.
 * docs/engine-format.md is the byte-level specification; keep both in step.
 *
 * Layout (all integers little-endian):
 *
 *   offset 0   header, 64 bytes
 *       0  u8[8]  magic "KILNENG\0"
 *       8  u16    format major (a reader refuses a major it does not know)
 *      10  u16    format minor (additions only; readers ignore what they don't know)
 *      12  u32    section count (1..KILN_ENGINE_MAX_SECTIONS)
 *      16  u64    section table offset
 *      24  u64    file size (the whole file, for truncation checks)
 *      32  u64    XXH64 (seed 0) of the section table bytes
 *      40  u8[16] reserved, zero
 *      56  u64    XXH64 (seed 0) of header bytes 0..55
 *   sections, each at an offset aligned to KILN_ENGINE_ALIGN (4096)
 *   section table: count entries of 64 bytes
 *       0  u32    kind (kiln_section_kind)
 *       4  u32    codec (kiln_codec)
 *       8  u64    offset of the stored bytes in the file
 *      16  u64    stored size (bytes in the file)
 *      24  u64    raw size (bytes after decoding)
 *      32  u64    checksum of the stored bytes: in format 2, XXH3-64 of the
 *                 XXH3-64 digests (u64 each) of its pieces of
 *                 KILN_ENGINE_HASH_PIECE bytes, so readers verify a large
 *                 section in parallel; in format 1, XXH64 (seed 0)
 *      40  u8[24] reserved, zero
 *
 * A reader verifies everything before it trusts anything: magic, version,
 * header checksum, file size, table bounds and checksum, every section inside
 * the file and not overlapping another, each section's checksum, and for
 * decoded sections the raw size.
 */
#ifndef KILN_ENGINE_H
#define KILN_ENGINE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../common/kiln_util.h"

#define KILN_ENGINE_MAGIC "KILNENG"  /* 8 bytes with the NUL */
#define KILN_ENGINE_MAJOR 2       /* 2: piecewise section checksums; 1 (XXH64) is still read */
#define KILN_ENGINE_MINOR 9       /* 1: meta.generation has sampling defaults (do_sample, temperature, top_k,
                                     top_p), and the chat section (kind 6); 2: the plan section is version 2
                                     (variable ops, keyed attributes with the passes' lowering flags); 3: plans
                                     may hold ops 16-19 (bias_add, moe, all_reduce, all_gather), the flags
                                     qkv_bias, qk_norm, no_renorm, quantized weights (dtypes 4-7) and, with
                                     tensor parallelism, plan version 3 (kiln 0.3); 4: weight dtype 9 (fp8,
                                     FP8 E4M3 codes with per-row scales), which a reader of 2.3 refuses naming
                                     the weight and the dtype, and the tuning section (kind 7), which `kiln
                                     tune` appends in place (an older reader verifies and skips it; appending
                                     keeps the file's major and minor); 5: weight dtype 11 (fp8g128, E4M3
                                     codes with a scale per row and 128 columns: block-FP8 checkpoints),
                                     which a reader of 2.4 refuses naming the weight and the dtype; 6: the
                                     attention flags kv_fp8 and kv_int8 (an 8-bit KV cache, with a fifth
                                     input kv_scale), which a reader of 2.5 refuses as unknown flags; 7: plan
                                     version 4 (outputs in a dying input's slot, in place), which a reader
                                     of 2.6 refuses by the plan's version; 8: the projection flag fast_accum
                                     (W8A8 with FP8 fast accumulation), out_fp8 on rmsnorm and the tuning
                                     entries' flag 32, which a reader of 2.7 refuses as unknown flags or
                                     flags that do not apply; 9: op 20 (permute, act-order GPTQ), its i32
                                     index weight and the norms' flag out_perm, which a reader of 2.8 refuses
                                     naming the op kind or as an unknown flag */
#define KILN_ENGINE_HASH_PIECE (16u << 20) /* bytes per checksum piece (format 2) */
#define KILN_ENGINE_HEADER_SIZE 64
#define KILN_ENGINE_ENTRY_SIZE 64
#define KILN_ENGINE_ALIGN 4096
#define KILN_ENGINE_MAX_SECTIONS 64
#define KILN_ENGINE_ZSTD_CHUNK (4u << 20) /* raw bytes per zstd chunk the writer makes */
#define KILN_ENGINE_ZSTD_LEVEL 3

typedef enum kiln_section_kind {
    KILN_SECTION_META = 1,      /* JSON: model config, compiler version, targets, options, tokenizer summary */
    KILN_SECTION_PLAN = 2,      /* binary plan (format/kiln_plan.h) */
    KILN_SECTION_WEIGHTS = 3,   /* weight bytes; tensors at offsets given by the plan, 256-aligned */
    KILN_SECTION_KERNELS = 4,   /* cubins per SM + PTX (GPU issue) */
    KILN_SECTION_TOKENIZER = 5, /* compact binary tokenizer (runtime/kiln_tokenizer.h) */
    KILN_SECTION_CHAT = 6,      /* JSON: chat template + its special tokens (runtime/kiln_chat.h); minor 1 */
    KILN_SECTION_TUNING = 7,    /* per-GPU tuning records (format/kiln_tuning.h), appended by `kiln tune`; minor 4 */
} kiln_section_kind;

typedef enum kiln_codec {
    KILN_CODEC_NONE = 0,
    /* zstd in independent chunks so they can be decoded in parallel. Stored
     * bytes (the index trails the frames so a writer can stream):
     *   chunk count zstd frames, back to back (frame i = raw bytes
     *       [i*chunk size, min((i+1)*chunk size, raw size)));
     *   u64 stored size of each frame, chunk count of them;
     *   footer, the last 16 bytes: u64 raw size, u32 chunk size (raw bytes per
     *       chunk, the last may be shorter), u32 chunk count
     *       (= ceil(raw size / chunk size); 0 for an empty section). */
    KILN_CODEC_ZSTD_CHUNKED = 1,
} kiln_codec;

const char *kiln_section_kind_name(uint32_t kind); /* "meta"... or "unknown" */
const char *kiln_codec_name(uint32_t codec);

typedef struct kiln_engine_section {
    uint32_t kind, codec;
    uint64_t offset, stored_size, raw_size, checksum;
} kiln_engine_section;

typedef struct kiln_engine {
    kiln_mapped_file map;       /* the mapping (for a range: from the page below it); from memory: only
                                   map.path; map.path is the label for messages */
    const uint8_t *data;        /* the whole file */
    size_t size;
    uint16_t major, minor;
    uint32_t n_sections;
    kiln_engine_section sections[KILN_ENGINE_MAX_SECTIONS];
} kiln_engine;

/* Open and fully verify an engine file (see the list above). */
kiln_status kiln_engine_open(const char *path, kiln_engine *out, kiln_error *err);
/* The same over bytes in memory (fuzzing, tests); `data` must outlive `out`,
 * `label` names it in messages; close it with kiln_engine_close too. */
kiln_status kiln_engine_open_mem(const uint8_t *data, size_t size, const char *label,
                                 kiln_engine *out, kiln_error *err);
/* The same over `size` bytes of the file `path` starting at `offset` (a
 * packaged executable's appended engine): the range is mmapped (from the
 * page below `offset`), so loading is as fast as from an engine file.
 * `label` (NULL = path) names it in messages. A range that runs past the
 * end of the file is KILN_ERR_FORMAT (truncated). */
kiln_status kiln_engine_open_range(const char *path, uint64_t offset, uint64_t size, const char *label,
                                   kiln_engine *out, kiln_error *err);
void kiln_engine_close(kiln_engine *e);

/* Where an engine's bytes are: a whole file (path), a range of a file
 * (path, offset, size), or bytes in memory (data, size). */
typedef struct kiln_engine_src {
    const char *path;     /* the engine file, or the file holding the range; NULL for memory */
    uint64_t offset;      /* range start in `path` (with range = true) */
    uint64_t size;        /* bytes: of the range, or of `data` */
    bool range;           /* open [offset, offset + size) of `path`, not the whole file */
    const uint8_t *data;  /* bytes in memory (path NULL); must outlive the engine */
    const char *label;    /* names the engine in messages; NULL = path or "(memory)" */
} kiln_engine_src;

/* Open any of the three (dispatches to the functions above). */
kiln_status kiln_engine_open_src(const kiln_engine_src *src, kiln_engine *out, kiln_error *err);
/* The label messages use for `src`. */
const char *kiln_engine_src_label(const kiln_engine_src *src);

/* ---- the engine appended to a packaged executable (`kiln package`) ----
 *
 * `kiln package --payload appended` writes the linked executable, zero
 * padding up to a multiple of KILN_ENGINE_ALIGN, the engine file's bytes
 * unchanged, and this trailer as the file's last 64 bytes:
 *
 *       0  u8[8]  magic "KILNPAY\0"
 *       8  u32    trailer version (1)
 *      12  u32    reserved, zero
 *      16  u64    engine offset in the executable (a multiple of 4096)
 *      24  u64    engine size in bytes
 *      32  u64    the engine's header checksum (its u64 at 56): which engine
 *      40  u8[16] reserved, zero
 *      56  u64    XXH64 (seed 0) of trailer bytes 0..55
 *
 * The engine must end where the trailer starts. The engine itself is then
 * verified like an engine file (every check, every checksum). */
#define KILN_PAYLOAD_MAGIC "KILNPAY" /* 8 bytes with the NUL */
#define KILN_PAYLOAD_VERSION 1
#define KILN_PAYLOAD_TRAILER_SIZE 64

typedef struct kiln_payload_trailer {
    uint64_t offset, size, engine_checksum;
} kiln_payload_trailer;

/* Fill the 64 bytes of a trailer. */
void kiln_payload_trailer_write(uint8_t out[KILN_PAYLOAD_TRAILER_SIZE], const kiln_payload_trailer *t);
/* Read and check the trailer at the end of `path` (`label` names it in
 * messages): magic, version, checksum, and that the engine lies right
 * before it. KILN_ERR_FORMAT (no trailer: truncated or stripped; bad
 * range), KILN_ERR_VERSION, KILN_ERR_CHECKSUM, KILN_ERR_IO. */
kiln_status kiln_payload_trailer_read(const char *path, const char *label, kiln_payload_trailer *out,
                                      kiln_error *err);

/* The checksum of a section's stored bytes as format `major` defines it
 * (see the layout above); `threads` > 1 hashes pieces on up to that many
 * ways of the process-wide thread pool (common/kiln_pool.h). */
uint64_t kiln_engine_checksum(uint16_t major, const uint8_t *data, size_t n, int threads);

/* The first section of a kind, or NULL. */
const kiln_engine_section *kiln_engine_find(const kiln_engine *e, uint32_t kind);

/* A section's decoded bytes. For codec none, `*data` points into the mapped
 * file and `*owned` is false; otherwise a malloc'd buffer (aligned to 4096)
 * the caller frees with free(). `threads` > 1 decodes chunks on up to that
 * many ways of the process-wide thread pool. */
kiln_status kiln_engine_section_bytes(const kiln_engine *e, const kiln_engine_section *s, int threads,
                                      const uint8_t **data, size_t *size, bool *owned, kiln_error *err);
/* Decoded bytes [begin, end) of a section only: a tensor-parallel rank's range of the weights
 * section (kiln_plan_rank_range). For codec none, `*data` points into the mapped file and `*base`
 * is NULL; for zstd-chunked, only the chunks that hold the range are decoded, into a buffer
 * (aligned to 4096) that *base points to and the caller frees with free(); *data points inside it. */
kiln_status kiln_engine_section_range(const kiln_engine *e, const kiln_engine_section *s, uint64_t begin,
                                      uint64_t end, int threads, const uint8_t **data, const uint8_t **base,
                                      kiln_error *err);

/* ---- writer (used by codegen/; lives here so the format is defined once) ---- */

typedef struct kiln_engine_writer kiln_engine_writer;

/* Start writing to `path`: bytes go to a temporary file beside it, which
 * kiln_engine_writer_finish renames into place; on any failure or abort the
 * temporary file is removed, so no partial engine is ever left behind. */
kiln_status kiln_engine_writer_open(const char *path, kiln_engine_writer **out, kiln_error *err);
/* Stream one section: begin, write any number of times, end. With
 * KILN_CODEC_ZSTD_CHUNKED the writer compresses in chunks of
 * KILN_ENGINE_ZSTD_CHUNK raw bytes at level KILN_ENGINE_ZSTD_LEVEL, holding
 * one chunk in memory at a time. */
kiln_status kiln_engine_writer_begin(kiln_engine_writer *w, uint32_t kind, uint32_t codec, kiln_error *err);
kiln_status kiln_engine_writer_write(kiln_engine_writer *w, const void *p, size_t n, kiln_error *err);
kiln_status kiln_engine_writer_end(kiln_engine_writer *w, kiln_error *err);
/* Convenience: a whole section from one buffer. */
kiln_status kiln_engine_writer_section(kiln_engine_writer *w, uint32_t kind, uint32_t codec,
                                       const void *p, size_t n, kiln_error *err);
/* Write the table and header, flush, rename into place, free `w`. */
kiln_status kiln_engine_writer_finish(kiln_engine_writer *w, kiln_error *err);
/* Remove the temporary file and free `w` (safe on NULL). */
void kiln_engine_writer_abort(kiln_engine_writer *w);
/* Report the raw bytes of the open section to `p` as they are written
 * (common/kiln_progress.h; the caller sets the phase and its total); NULL
 * stops reporting. */
struct kiln_progress;
void kiln_engine_writer_set_progress(kiln_engine_writer *w, struct kiln_progress *p);

#endif /* KILN_ENGINE_H */
