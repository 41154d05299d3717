/*
 * engine.c — the engine file reader: open (mmap or memory), verify, find a
 * section, decode a section.
 *
 * The byte layout is in kiln_engine.h's header comment and, in full, in
 * docs/engine-format.md. The file is hostile input: every offset and size
 * is bounds- and overflow-checked before it is used, and nothing from the
 * file is trusted until the checks below have passed, in this order (the
 * first failure is the one reported):
 *
 *   1. size >= header size                        KILN_ERR_FORMAT (truncated)
 *   2. magic                                      KILN_ERR_FORMAT (foreign file)
 *   3. major version known (1..KILN_ENGINE_MAJOR) KILN_ERR_VERSION; any minor is read
 *   4. header checksum                            KILN_ERR_CHECKSUM
 *   5. recorded file size == actual size          KILN_ERR_FORMAT (truncated / appended)
 *   6. section count in 1..KILN_ENGINE_MAX_SECTIONS
 *   7. table inside the file, after the header
 *   8. table checksum                             KILN_ERR_CHECKSUM
 *   9. per section: known codec, raw size agrees with the codec, offset
 *      aligned, inside the file, no overlap with the header, the table or
 *      another section                            KILN_ERR_FORMAT
 *  10. per section: checksum of the stored bytes  KILN_ERR_CHECKSUM
 *      (format 2: 16 MiB pieces hashed on up to 16 ways of the process-wide
 *      thread pool, then their digests; format 1: one XXH64 pass)
 *  11. per zstd section: the chunk index is consistent with the section's
 *      sizes                                      KILN_ERR_FORMAT
 *
 * Sections of a kind this reader does not know are verified like any other
 * (they are part of the container) and otherwise ignored: a newer minor
 * version may add kinds.
 *
 * Decoding a KILN_CODEC_ZSTD_CHUNKED section fills one 4096-aligned buffer;
 * each chunk decodes into its own slice, so chunks are independent and are
 * spread over up to `threads` ways (at most 64) of the process-wide thread
 * pool (common/kiln_pool.h), as interleaved lanes of chunks. Every frame
 * must decode to exactly its chunk's share of the raw size.
 */
#include "../format/kiln_engine.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <xxhash.h>
#include <zstd.h>

#include "../common/kiln_pool.h"

/* Per RFC 8878 a zstd block holds at most 128 KiB of raw bytes and costs at
 * least 4 stored bytes (3-byte block header + 1 byte of an RLE block), so a
 * chunk of R raw bytes needs at least 4 * ceil(R / 128 KiB) stored bytes.
 * Checking it bounds the allocation a hostile file can ask for (at most
 * 32768 x the file size). */
#define ZSTD_BLOCK_MAX 131072u
#define ZSTD_BLOCK_MIN_STORED 4u
#define ZSTD_FOOTER_SIZE 16u

const char *kiln_section_kind_name(uint32_t kind) {
    switch (kind) {
    case KILN_SECTION_META: return "meta";
    case KILN_SECTION_PLAN: return "plan";
    case KILN_SECTION_WEIGHTS: return "weights";
    case KILN_SECTION_KERNELS: return "kernels";
    case KILN_SECTION_TOKENIZER: return "tokenizer";
    case KILN_SECTION_CHAT: return "chat";
    case KILN_SECTION_TUNING: return "tuning";
    default: return "unknown";
    }
}

const char *kiln_codec_name(uint32_t codec) {
    switch (codec) {
    case KILN_CODEC_NONE: return "none";
    case KILN_CODEC_ZSTD_CHUNKED: return "zstd-chunked";
    default: return "unknown";
    }
}

/* "'weights'" for a known kind, "#3 (unknown kind 9)" otherwise; for messages. */
static const char *section_label(char *buf, size_t cap, uint32_t index, uint32_t kind) {
    const char *name = kiln_section_kind_name(kind);
    if (strcmp(name, "unknown") != 0)
        snprintf(buf, cap, "'%s'", name);
    else
        snprintf(buf, cap, "#%u (unknown kind %u)", index, kind);
    return buf;
}

/* ---- section checksums ---- */

typedef struct hash_job {
    const uint8_t *data;
    size_t n;
    uint64_t *digests; /* one per piece */
    size_t lanes, pieces;
} hash_job;

/* Pool task `lane`: pieces lane, lane + lanes, ... */
static void hash_run(void *arg, int lane) {
    const hash_job *j = arg;
    for (size_t i = (size_t)lane; i < j->pieces; i += j->lanes) {
        size_t off = i * (size_t)KILN_ENGINE_HASH_PIECE;
        size_t len = j->n - off < KILN_ENGINE_HASH_PIECE ? j->n - off : KILN_ENGINE_HASH_PIECE;
        j->digests[i] = XXH3_64bits(j->data + off, len);
    }
}

/* Format 2: XXH3-64 over the pieces' XXH3-64 digests, each as 8 little-endian
 * bytes. The digests are computed on up to `threads` ways (at most 16) of the
 * process-wide pool, as interleaved lanes of pieces; if the list
 * cannot be allocated they are streamed into the outer hash one by one. */
uint64_t kiln_engine_checksum(uint16_t major, const uint8_t *data, size_t n, int threads) {
    if (major < 2) return XXH64(data, n, 0);
    const size_t piece = KILN_ENGINE_HASH_PIECE;
    size_t pieces = n / piece + (n % piece != 0);
    uint8_t le[8];
    if (pieces <= 1) {
        kiln_wr_u64(le, XXH3_64bits(data, n));
        return pieces ? XXH3_64bits(le, 8) : XXH3_64bits(le, 0);
    }
    uint64_t *dig = malloc(pieces * sizeof *dig);
    if (!dig) {
        XXH3_state_t *st = XXH3_createState();
        if (!st) return 0; /* cannot match: reported as a checksum mismatch */
        XXH3_64bits_reset(st);
        for (size_t i = 0; i < pieces; i++) {
            size_t off = i * piece;
            kiln_wr_u64(le, XXH3_64bits(data + off, n - off < piece ? n - off : piece));
            XXH3_64bits_update(st, le, 8);
        }
        uint64_t d = XXH3_64bits_digest(st);
        XXH3_freeState(st);
        return d;
    }
    size_t nt = threads > 1 ? (size_t)threads : 1;
    if (nt > pieces) nt = pieces;
    if (nt > 16) nt = 16;
    hash_job job = {data, n, dig, nt, pieces};
    kiln_pool_for(nt > 1 ? kiln_pool_shared() : NULL, (int)nt, (int)nt, hash_run, &job);
    uint8_t *list = (uint8_t *)dig; /* rewritten in place as little-endian bytes */
    for (size_t i = 0; i < pieces; i++) {
        uint64_t v = dig[i];
        kiln_wr_u64(list + 8 * i, v);
    }
    uint64_t d = XXH3_64bits(list, pieces * 8);
    free(dig);
    return d;
}

/* ---- the chunk index of a zstd section ---- */

/* The index of a KILN_CODEC_ZSTD_CHUNKED section, read from its stored bytes. */
typedef struct zstd_index {
    uint64_t raw_size;       /* from the footer; equals the table's raw size */
    uint32_t chunk_size;     /* raw bytes per chunk; the last may be shorter */
    uint32_t chunk_count;
    const uint8_t *sizes;    /* chunk_count little-endian u64 stored sizes */
    const uint8_t *frames;   /* the first frame; frames follow each other */
} zstd_index;

/* Check the index of a zstd section against its sizes. On failure writes a
 * message (without the file label) into `why`. */
static bool zstd_index_read(const uint8_t *stored, uint64_t stored_size, uint64_t table_raw_size,
                            zstd_index *ix, char *why, size_t why_cap) {
    memset(ix, 0, sizeof *ix);
    if (stored_size < ZSTD_FOOTER_SIZE) {
        snprintf(why, why_cap, "%llu stored bytes cannot hold the 16-byte zstd chunk footer",
                 (unsigned long long)stored_size);
        return false;
    }
    const uint8_t *foot = stored + stored_size - ZSTD_FOOTER_SIZE;
    ix->raw_size = kiln_rd_u64(foot);
    ix->chunk_size = kiln_rd_u32(foot + 8);
    ix->chunk_count = kiln_rd_u32(foot + 12);
    if (ix->raw_size != table_raw_size) {
        snprintf(why, why_cap, "zstd footer says %llu raw bytes, the section table says %llu",
                 (unsigned long long)ix->raw_size, (unsigned long long)table_raw_size);
        return false;
    }
    uint64_t want_count = 0;
    if (ix->raw_size > 0) {
        if (ix->chunk_size == 0) {
            snprintf(why, why_cap, "zstd chunk size is 0 for %llu raw bytes", (unsigned long long)ix->raw_size);
            return false;
        }
        want_count = ix->raw_size / ix->chunk_size + (ix->raw_size % ix->chunk_size != 0);
    }
    if (want_count != ix->chunk_count) {
        snprintf(why, why_cap, "zstd chunk count is %u, but %llu raw bytes in chunks of %u make %llu",
                 ix->chunk_count, (unsigned long long)ix->raw_size, ix->chunk_size,
                 (unsigned long long)want_count);
        return false;
    }
    /* chunk_count < 2^32, so 8 * count + 16 cannot overflow u64 */
    uint64_t index_bytes = (uint64_t)ix->chunk_count * 8u + ZSTD_FOOTER_SIZE;
    if (index_bytes > stored_size) {
        snprintf(why, why_cap, "zstd chunk index (%u chunks, %llu bytes) is larger than the section (%llu bytes)",
                 ix->chunk_count, (unsigned long long)index_bytes, (unsigned long long)stored_size);
        return false;
    }
    uint64_t frames_size = stored_size - index_bytes;
    ix->frames = stored;
    ix->sizes = stored + frames_size;
    uint64_t sum = 0;
    for (uint32_t i = 0; i < ix->chunk_count; i++) {
        uint64_t n = kiln_rd_u64(ix->sizes + (size_t)i * 8);
        uint64_t raw = i + 1 < ix->chunk_count ? ix->chunk_size
                                               : ix->raw_size - (uint64_t)i * ix->chunk_size;
        /* raw > 0 for every chunk, as chunk_count = ceil(raw_size / chunk_size) */
        uint64_t min_stored = (raw / ZSTD_BLOCK_MAX + (raw % ZSTD_BLOCK_MAX != 0)) * ZSTD_BLOCK_MIN_STORED;
        if (n < min_stored) {
            snprintf(why, why_cap, "zstd chunk %u of %u: %llu stored bytes cannot hold %llu raw bytes",
                     i, ix->chunk_count, (unsigned long long)n, (unsigned long long)raw);
            return false;
        }
        if (!kiln_add_u64(sum, n, &sum) || sum > frames_size) {
            snprintf(why, why_cap, "zstd chunk sizes add up to more than the %llu bytes of frames",
                     (unsigned long long)frames_size);
            return false;
        }
    }
    if (sum != frames_size) {
        snprintf(why, why_cap, "zstd chunk sizes add up to %llu bytes, the frames take %llu",
                 (unsigned long long)sum, (unsigned long long)frames_size);
        return false;
    }
    return true;
}

/* ---- open and verify ---- */

static bool looks_like_json_or_safetensors(const uint8_t *d, size_t n) {
    size_t i = 0;
    while (i < n && i < 64 && (d[i] == ' ' || d[i] == '\t' || d[i] == '\r' || d[i] == '\n')) i++;
    if (i < n && (d[i] == '{' || d[i] == '[')) return true;
    /* safetensors: u64 header length, then a JSON object */
    return n >= 9 && d[8] == '{';
}

/* Checks 1..11 over `data`; fills `out` except out->map. */
static kiln_status engine_verify(const uint8_t *data, size_t size, const char *label, kiln_engine *out,
                                 kiln_error *err) {
    memset(out, 0, sizeof *out);
    if (!data && size) return kiln_err(err, KILN_ERR_INVALID_ARG, "%s: no data", label);
    char lab[64];

    /* 1. size */
    if (size < KILN_ENGINE_HEADER_SIZE) {
        kiln_err(err, KILN_ERR_FORMAT, "%s: truncated: %zu bytes is smaller than the %d-byte engine header",
                 label, size, KILN_ENGINE_HEADER_SIZE);
        if (size > 0 && looks_like_json_or_safetensors(data, size))
            kiln_err_hint(err, "this looks like a JSON file: did you pass the checkpoint instead of the engine?");
        return KILN_ERR_FORMAT;
    }
    const uint8_t *h = data;

    /* 2. magic (8 bytes, including the NUL) */
    if (memcmp(h, KILN_ENGINE_MAGIC, 8) != 0) {
        kiln_err(err, KILN_ERR_FORMAT,
                 "%s: not a kiln engine file (starts with %02x %02x %02x %02x %02x %02x %02x %02x, "
                 "expected \"KILNENG\\0\")",
                 label, h[0], h[1], h[2], h[3], h[4], h[5], h[6], h[7]);
        if (looks_like_json_or_safetensors(data, size))
            kiln_err_hint(err, "this looks like a safetensors/JSON file: did you pass the checkpoint instead of "
                               "the engine? Build an engine with `kiln compile CKPT_DIR -o model.kiln`");
        return KILN_ERR_FORMAT;
    }

    /* 3. version: a major we know, any minor */
    uint16_t major = (uint16_t)(h[8] | h[9] << 8), minor = (uint16_t)(h[10] | h[11] << 8);
    if (major == 0)
        return kiln_err(err, KILN_ERR_VERSION, "%s: engine format %u.%u is not a valid version (reads %d.x)",
                        label, major, minor, KILN_ENGINE_MAJOR);
    if (major > KILN_ENGINE_MAJOR) {
        kiln_err(err, KILN_ERR_VERSION, "%s: engine format %u.x is newer than this runtime (reads %d.x)", label,
                 major, KILN_ENGINE_MAJOR);
        return kiln_err_hint(err, "rebuild the engine with this kiln or upgrade the runtime");
    }

    /* 4. header checksum over bytes 0..55 */
    uint64_t hsum = kiln_rd_u64(h + 56);
    if (XXH64(h, 56, 0) != hsum) {
        kiln_err(err, KILN_ERR_CHECKSUM, "%s: engine header checksum mismatch: the file is corrupted", label);
        return kiln_err_hint(err, "copy the engine again or rebuild it");
    }

    /* 5. recorded file size */
    uint32_t count = kiln_rd_u32(h + 12);
    uint64_t table_off = kiln_rd_u64(h + 16);
    uint64_t file_size = kiln_rd_u64(h + 24);
    uint64_t table_sum = kiln_rd_u64(h + 32);
    if (file_size != (uint64_t)size) {
        kiln_err(err, KILN_ERR_FORMAT, "%s: %s: header says %llu bytes, file has %zu", label,
                 (uint64_t)size < file_size ? "truncated" : "wrong size", (unsigned long long)file_size, size);
        return kiln_err_hint(err, (uint64_t)size < file_size
                                      ? "the copy or the build was interrupted; copy the engine again"
                                      : "bytes were appended to the engine; copy it again (or, if `kiln tune` "
                                        "was killed while appending its section, truncate the file to the "
                                        "header's size: the bytes before it are the engine as it was)");
    }

    /* 6. section count */
    if (count == 0 || count > KILN_ENGINE_MAX_SECTIONS)
        return kiln_err(err, KILN_ERR_FORMAT, "%s: section count %u is outside 1..%d", label, count,
                        KILN_ENGINE_MAX_SECTIONS);

    /* 7. table bounds: after the header, inside the file */
    uint64_t table_size = (uint64_t)count * KILN_ENGINE_ENTRY_SIZE, table_end;
    if (table_off < KILN_ENGINE_HEADER_SIZE || !kiln_add_u64(table_off, table_size, &table_end) ||
        table_end > size)
        return kiln_err(err, KILN_ERR_FORMAT,
                        "%s: section table (offset %llu, %u entries of %d bytes) is not inside the file "
                        "(%zu bytes, header %d)",
                        label, (unsigned long long)table_off, count, KILN_ENGINE_ENTRY_SIZE, size,
                        KILN_ENGINE_HEADER_SIZE);

    /* 8. table checksum */
    const uint8_t *table = data + table_off;
    if (XXH64(table, (size_t)table_size, 0) != table_sum) {
        kiln_err(err, KILN_ERR_CHECKSUM, "%s: section table checksum mismatch: the file is corrupted", label);
        return kiln_err_hint(err, "copy the engine again or rebuild it");
    }

    /* 9. each section's entry */
    out->data = data;
    out->size = size;
    out->major = major;
    out->minor = minor;
    out->n_sections = count;
    for (uint32_t i = 0; i < count; i++) {
        const uint8_t *t = table + (size_t)i * KILN_ENGINE_ENTRY_SIZE;
        kiln_engine_section *s = &out->sections[i];
        s->kind = kiln_rd_u32(t);
        s->codec = kiln_rd_u32(t + 4);
        s->offset = kiln_rd_u64(t + 8);
        s->stored_size = kiln_rd_u64(t + 16);
        s->raw_size = kiln_rd_u64(t + 24);
        s->checksum = kiln_rd_u64(t + 32);
        section_label(lab, sizeof lab, i, s->kind);
        kiln_status st = KILN_OK;
        uint64_t end = 0;
        if (s->codec != KILN_CODEC_NONE && s->codec != KILN_CODEC_ZSTD_CHUNKED) {
            st = kiln_err(err, KILN_ERR_FORMAT, "%s: section %s uses unknown codec %u", label, lab, s->codec);
            kiln_err_hint(err, "the engine was written by a newer kiln; upgrade the runtime");
        } else if (s->codec == KILN_CODEC_NONE && s->raw_size != s->stored_size) {
            st = kiln_err(err, KILN_ERR_FORMAT, "%s: section %s is stored uncompressed but its raw size %llu "
                          "differs from its stored size %llu",
                          label, lab, (unsigned long long)s->raw_size, (unsigned long long)s->stored_size);
        } else if (s->offset % KILN_ENGINE_ALIGN != 0) {
            st = kiln_err(err, KILN_ERR_FORMAT, "%s: section %s offset %llu is not a multiple of %d", label, lab,
                          (unsigned long long)s->offset, KILN_ENGINE_ALIGN);
        } else if (!kiln_add_u64(s->offset, s->stored_size, &end) || end > size) {
            st = kiln_err(err, KILN_ERR_FORMAT, "%s: section %s (offset %llu, %llu bytes) runs past the end of "
                          "the file (%zu bytes)",
                          label, lab, (unsigned long long)s->offset, (unsigned long long)s->stored_size, size);
        } else if (s->offset < KILN_ENGINE_HEADER_SIZE) {
            st = kiln_err(err, KILN_ERR_FORMAT, "%s: section %s (offset %llu) overlaps the header", label, lab,
                          (unsigned long long)s->offset);
        } else if (s->stored_size > 0 && s->offset < table_end && table_off < end) {
            st = kiln_err(err, KILN_ERR_FORMAT, "%s: section %s (bytes %llu..%llu) overlaps the section table "
                          "(bytes %llu..%llu)",
                          label, lab, (unsigned long long)s->offset, (unsigned long long)end,
                          (unsigned long long)table_off, (unsigned long long)table_end);
        }
        for (uint32_t j = 0; j < i && st == KILN_OK; j++) {
            const kiln_engine_section *o = &out->sections[j];
            uint64_t oend = o->offset + o->stored_size; /* checked when j was verified */
            if (s->stored_size > 0 && o->stored_size > 0 && s->offset < oend && o->offset < end) {
                char olab[64];
                st = kiln_err(err, KILN_ERR_FORMAT, "%s: section %s (bytes %llu..%llu) overlaps section %s "
                              "(bytes %llu..%llu)",
                              label, lab, (unsigned long long)s->offset, (unsigned long long)end,
                              section_label(olab, sizeof olab, j, o->kind), (unsigned long long)o->offset,
                              (unsigned long long)oend);
            }
        }
        if (st != KILN_OK) {
            memset(out, 0, sizeof *out);
            return st;
        }
    }

    /* 10. each section's checksum */
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    int threads = cores > 16 ? 16 : cores > 0 ? (int)cores : 1;
    for (uint32_t i = 0; i < count; i++) {
        const kiln_engine_section *s = &out->sections[i];
        if (kiln_engine_checksum(major, data + s->offset, (size_t)s->stored_size, threads) != s->checksum) {
            kiln_err(err, KILN_ERR_CHECKSUM, "%s: section %s checksum mismatch: the file is corrupted", label,
                     section_label(lab, sizeof lab, i, s->kind));
            memset(out, 0, sizeof *out);
            return kiln_err_hint(err, "copy the engine again or rebuild it");
        }
    }

    /* 11. each zstd section's chunk index */
    for (uint32_t i = 0; i < count; i++) {
        const kiln_engine_section *s = &out->sections[i];
        if (s->codec != KILN_CODEC_ZSTD_CHUNKED) continue;
        zstd_index ix;
        char why[256];
        if (!zstd_index_read(data + s->offset, s->stored_size, s->raw_size, &ix, why, sizeof why)) {
            kiln_err(err, KILN_ERR_FORMAT, "%s: section %s: %s", label, section_label(lab, sizeof lab, i, s->kind),
                     why);
            memset(out, 0, sizeof *out);
            return KILN_ERR_FORMAT;
        }
    }
    return KILN_OK;
}

kiln_status kiln_engine_open_mem(const uint8_t *data, size_t size, const char *label, kiln_engine *out,
                                 kiln_error *err) {
    if (!label) label = "(memory)";
    kiln_status st = engine_verify(data, size, label, out, err);
    if (st != KILN_OK) return st;
    out->map.path = strdup(label); /* for messages; map.data stays NULL */
    if (!out->map.path) {
        memset(out, 0, sizeof *out);
        return kiln_err(err, KILN_ERR_NOMEM, "%s: out of memory", label);
    }
    return KILN_OK;
}

kiln_status kiln_engine_open(const char *path, kiln_engine *out, kiln_error *err) {
    memset(out, 0, sizeof *out);
    if (kiln_path_is_dir(path)) {
        kiln_err(err, KILN_ERR_IO, "%s: is a directory, not an engine file", path);
        return kiln_err_hint(err, "did you pass the checkpoint directory instead of the engine? "
                                  "Build one with `kiln compile %s -o model.kiln`", path);
    }
    kiln_mapped_file map;
    kiln_status st = kiln_file_map(path, &map, err);
    if (st != KILN_OK) return st;
    st = engine_verify(map.data, map.size, path, out, err);
    if (st != KILN_OK) {
        kiln_file_unmap(&map);
        return st;
    }
    out->map = map;
    return KILN_OK;
}

/* Map [offset, offset + size) of `path`: the mapping starts at the page
 * below `offset` (an appended engine is 4096-aligned, a page may be larger),
 * `*data` points at `offset` inside it, and `map` records the whole mapping
 * so kiln_file_unmap releases it. */
static kiln_status map_range(const char *path, uint64_t offset, uint64_t size, const char *label,
                             kiln_mapped_file *map, const uint8_t **data, kiln_error *err) {
    memset(map, 0, sizeof *map);
    *data = NULL;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return kiln_err(err, KILN_ERR_IO, "%s: cannot open %s: %s", label, path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return kiln_err(err, KILN_ERR_IO, "%s: %s is not a regular file", label, path);
    }
    uint64_t end, file_size = (uint64_t)st.st_size;
    if (!kiln_add_u64(offset, size, &end) || end > file_size) {
        close(fd);
        kiln_err(err, KILN_ERR_FORMAT, "%s: truncated: the engine at offset %llu (%llu bytes) runs past the end of "
                 "%s (%llu bytes)", label, (unsigned long long)offset, (unsigned long long)size, path,
                 (unsigned long long)file_size);
        return kiln_err_hint(err, "the copy was interrupted; copy it again or rebuild it");
    }
    long page = sysconf(_SC_PAGESIZE);
    uint64_t pg = page > 0 ? (uint64_t)page : 4096, start = offset / pg * pg, len = end - start;
    if (len > SIZE_MAX) {
        close(fd);
        return kiln_err(err, KILN_ERR_NOMEM, "%s: %llu bytes do not fit in the address space", label,
                        (unsigned long long)len);
    }
    map->path = strdup(label);
    if (!map->path) {
        close(fd);
        return kiln_err(err, KILN_ERR_NOMEM, "%s: out of memory", label);
    }
    if (len > 0) {
        void *p = mmap(NULL, (size_t)len, PROT_READ, MAP_PRIVATE, fd, (off_t)start);
        if (p == MAP_FAILED) {
            int e = errno;
            close(fd);
            free(map->path);
            map->path = NULL;
            return kiln_err(err, KILN_ERR_IO, "%s: cannot mmap %s: %s", label, path, strerror(e));
        }
        map->data = p;
        map->size = (size_t)len;
        kiln_guard_map_add(map->data, map->size, map->path); /* kiln_file_unmap removes it */
    }
    close(fd);
    *data = map->data ? map->data + (offset - start) : (const uint8_t *)"";
    return KILN_OK;
}

kiln_status kiln_engine_open_range(const char *path, uint64_t offset, uint64_t size, const char *label,
                                   kiln_engine *out, kiln_error *err) {
    memset(out, 0, sizeof *out);
    if (!label) label = path;
    kiln_mapped_file map;
    const uint8_t *data;
    kiln_status st = map_range(path, offset, size, label, &map, &data, err);
    if (st != KILN_OK) return st;
    st = engine_verify(data, (size_t)size, label, out, err);
    if (st != KILN_OK) {
        kiln_file_unmap(&map);
        return st;
    }
    out->map = map;
    return KILN_OK;
}

const char *kiln_engine_src_label(const kiln_engine_src *src) {
    return src->label ? src->label : src->path ? src->path : "(memory)";
}

kiln_status kiln_engine_open_src(const kiln_engine_src *src, kiln_engine *out, kiln_error *err) {
    const char *label = kiln_engine_src_label(src);
    if (!src->path) {
        memset(out, 0, sizeof *out);
        if (!src->data || src->size > SIZE_MAX)
            return kiln_err(err, KILN_ERR_INVALID_ARG, "%s: no engine bytes given", label);
        return kiln_engine_open_mem(src->data, (size_t)src->size, label, out, err);
    }
    if (src->range) return kiln_engine_open_range(src->path, src->offset, src->size, label, out, err);
    return kiln_engine_open(src->path, out, err);
}

/* ---- the trailer of a packaged executable's appended engine ---- */

void kiln_payload_trailer_write(uint8_t out[KILN_PAYLOAD_TRAILER_SIZE], const kiln_payload_trailer *t) {
    memset(out, 0, KILN_PAYLOAD_TRAILER_SIZE);
    memcpy(out, KILN_PAYLOAD_MAGIC, 8);
    kiln_wr_u32(out + 8, KILN_PAYLOAD_VERSION);
    kiln_wr_u64(out + 16, t->offset);
    kiln_wr_u64(out + 24, t->size);
    kiln_wr_u64(out + 32, t->engine_checksum);
    kiln_wr_u64(out + 56, XXH64(out, 56, 0));
}

kiln_status kiln_payload_trailer_read(const char *path, const char *label, kiln_payload_trailer *out,
                                      kiln_error *err) {
    memset(out, 0, sizeof *out);
    if (!label) label = path;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return kiln_err(err, KILN_ERR_IO, "%s: cannot open %s: %s", label, path, strerror(errno));
    struct stat st;
    uint8_t t[KILN_PAYLOAD_TRAILER_SIZE];
    ssize_t got = -1;
    if (fstat(fd, &st) == 0 && st.st_size >= KILN_PAYLOAD_TRAILER_SIZE)
        got = pread(fd, t, sizeof t, st.st_size - KILN_PAYLOAD_TRAILER_SIZE);
    int e = errno;
    close(fd);
    if (got != (ssize_t)sizeof t || memcmp(t, KILN_PAYLOAD_MAGIC, 8) != 0) {
        if (got < 0 && st.st_size >= KILN_PAYLOAD_TRAILER_SIZE)
            return kiln_err(err, KILN_ERR_IO, "%s: cannot read %s: %s", label, path, strerror(e));
        kiln_err(err, KILN_ERR_FORMAT, "%s: the appended engine's trailer is missing (the last %d bytes of %s do "
                 "not start with \"KILNPAY\\0\"): the executable is truncated, or was stripped or edited",
                 label, KILN_PAYLOAD_TRAILER_SIZE, path);
        return kiln_err_hint(err, "copy the executable again, or rebuild it with `kiln package`");
    }
    uint32_t version = kiln_rd_u32(t + 8);
    if (version == 0 || version > KILN_PAYLOAD_VERSION)
        return kiln_err(err, KILN_ERR_VERSION, "%s: appended-engine trailer version %u is not one this runtime "
                        "reads (%d)", label, version, KILN_PAYLOAD_VERSION);
    if (XXH64(t, 56, 0) != kiln_rd_u64(t + 56)) {
        kiln_err(err, KILN_ERR_CHECKSUM, "%s: the appended engine's trailer checksum does not match: the "
                 "executable is corrupted", label);
        return kiln_err_hint(err, "copy the executable again, or rebuild it with `kiln package`");
    }
    out->offset = kiln_rd_u64(t + 16);
    out->size = kiln_rd_u64(t + 24);
    out->engine_checksum = kiln_rd_u64(t + 32);
    uint64_t end, body = (uint64_t)st.st_size - KILN_PAYLOAD_TRAILER_SIZE;
    if (out->offset % KILN_ENGINE_ALIGN != 0 || !kiln_add_u64(out->offset, out->size, &end) || end != body)
        return kiln_err(err, KILN_ERR_FORMAT, "%s: the appended engine (offset %llu, %llu bytes) does not end where "
                        "the trailer starts (byte %llu) or is not %d-aligned: the executable is corrupted",
                        label, (unsigned long long)out->offset, (unsigned long long)out->size,
                        (unsigned long long)body, KILN_ENGINE_ALIGN);
    return KILN_OK;
}

void kiln_engine_close(kiln_engine *e) {
    if (!e) return;
    kiln_file_unmap(&e->map); /* frees the label; unmaps only a mapping */
    memset(e, 0, sizeof *e);
}

const kiln_engine_section *kiln_engine_find(const kiln_engine *e, uint32_t kind) {
    for (uint32_t i = 0; i < e->n_sections; i++)
        if (e->sections[i].kind == kind) return &e->sections[i];
    return NULL;
}

/* ---- decoding ---- */

/* One decoding lane's share: chunks first, first+stride, ... */
typedef struct decode_job {
    const zstd_index *ix;
    uint8_t *dst;           /* the raw bytes from dst_skip on (0: the whole raw buffer) */
    uint64_t dst_skip;
    uint32_t first, stride, end; /* chunks first, first + stride, ... below end */
    /* result: the lowest failing chunk, or UINT32_MAX */
    uint32_t bad_chunk;
    char why[160];
} decode_job;

/* Pool task `lane` of the array of lanes `arg`. */
static void decode_run(void *arg, int lane) {
    decode_job *j = (decode_job *)arg + lane;
    j->bad_chunk = UINT32_MAX;
    const zstd_index *ix = j->ix;
    ZSTD_DCtx *dctx = ZSTD_createDCtx();
    if (!dctx) {
        j->bad_chunk = j->first;
        snprintf(j->why, sizeof j->why, "cannot create a zstd decoder (out of memory)");
        return;
    }
    /* where chunk `first` starts among the frames */
    uint64_t src_off = 0;
    for (uint32_t i = 0; i < j->first && i < ix->chunk_count; i++) src_off += kiln_rd_u64(ix->sizes + (size_t)i * 8);
    for (uint64_t i = j->first; i < j->end; i += j->stride) {
        uint64_t n = kiln_rd_u64(ix->sizes + (size_t)i * 8);
        uint64_t raw_off = i * ix->chunk_size;
        uint64_t raw = i + 1 < ix->chunk_count ? ix->chunk_size : ix->raw_size - raw_off;
        size_t got = ZSTD_decompressDCtx(dctx, j->dst + (raw_off - j->dst_skip), (size_t)raw, ix->frames + src_off,
                                         (size_t)n);
        if (ZSTD_isError(got)) {
            j->bad_chunk = (uint32_t)i;
            snprintf(j->why, sizeof j->why, "zstd: %s", ZSTD_getErrorName(got));
            break;
        }
        if (got != raw) {
            j->bad_chunk = (uint32_t)i;
            snprintf(j->why, sizeof j->why, "decoded to %zu bytes, expected %llu", got, (unsigned long long)raw);
            break;
        }
        /* skip to chunk i + stride */
        for (uint64_t k = i; k < i + j->stride && k < ix->chunk_count; k++)
            src_off += kiln_rd_u64(ix->sizes + (size_t)k * 8);
    }
    ZSTD_freeDCtx(dctx);
}

/* Decode chunks c0 .. c1-1 of a zstd-chunked section into dst (raw byte c0 × chunk size first), on
 * up to `threads` ways of the pool. */
static kiln_status decode_chunks(const zstd_index *ix, uint32_t c0, uint32_t c1, int threads, uint8_t *dst,
                                 const char *label, const char *lab, kiln_error *err) {
    uint32_t n_threads = threads > 1 ? (uint32_t)threads : 1;
    if (n_threads > c1 - c0) n_threads = c1 - c0;
    if (n_threads > 64) n_threads = 64;
    decode_job jobs[64];
    for (uint32_t t = 0; t < n_threads; t++)
        jobs[t] = (decode_job){.ix = ix, .dst = dst, .dst_skip = (uint64_t)c0 * ix->chunk_size, .first = c0 + t,
                               .stride = n_threads, .end = c1, .bad_chunk = UINT32_MAX};
    kiln_pool_for(n_threads > 1 ? kiln_pool_shared() : NULL, (int)n_threads, (int)n_threads, decode_run, jobs);
    const decode_job *bad = NULL;
    for (uint32_t t = 0; t < n_threads; t++)
        if (jobs[t].bad_chunk != UINT32_MAX && (!bad || jobs[t].bad_chunk < bad->bad_chunk)) bad = &jobs[t];
    if (bad) {
        kiln_err(err, KILN_ERR_CODEC, "%s: section %s, zstd chunk %u of %u: %s", label, lab, bad->bad_chunk,
                 ix->chunk_count, bad->why);
        return kiln_err_hint(err, "the engine is corrupted or was written by a broken writer; rebuild it");
    }
    return KILN_OK;
}

kiln_status kiln_engine_section_bytes(const kiln_engine *e, const kiln_engine_section *s, int threads,
                                      const uint8_t **data, size_t *size, bool *owned, kiln_error *err) {
    *size = 0;
    const uint8_t *base = NULL;
    kiln_status st = kiln_engine_section_range(e, s, 0, s->raw_size, threads, data, &base, err);
    *owned = base != NULL;
    if (st == KILN_OK) *size = (size_t)s->raw_size;
    return st;
}

kiln_status kiln_engine_section_range(const kiln_engine *e, const kiln_engine_section *s, uint64_t begin,
                                      uint64_t end, int threads, const uint8_t **data, const uint8_t **base,
                                      kiln_error *err) {
    *data = NULL;
    *base = NULL;
    const char *label = e->map.path ? e->map.path : "(engine)";
    char lab[64];
    uint32_t index = (uint32_t)(s >= e->sections && s < e->sections + e->n_sections ? s - e->sections : 0);
    section_label(lab, sizeof lab, index, s->kind);
    uint64_t stored_end;
    if (!kiln_add_u64(s->offset, s->stored_size, &stored_end) || stored_end > e->size)
        return kiln_err(err, KILN_ERR_INVALID_ARG, "%s: section %s is not inside the engine", label, lab);
    if (begin > end || end > s->raw_size)
        return kiln_err(err, KILN_ERR_INVALID_ARG, "%s: section %s: bytes [%llu, %llu) are not inside its %llu",
                        label, lab, (unsigned long long)begin, (unsigned long long)end,
                        (unsigned long long)s->raw_size);
    const uint8_t *stored = e->data + s->offset;

    if (s->codec == KILN_CODEC_NONE) {
        *data = stored + begin;
        return KILN_OK;
    }
    if (s->codec != KILN_CODEC_ZSTD_CHUNKED)
        return kiln_err(err, KILN_ERR_FORMAT, "%s: section %s uses unknown codec %u", label, lab, s->codec);

    zstd_index ix;
    char why[256];
    if (!zstd_index_read(stored, s->stored_size, s->raw_size, &ix, why, sizeof why))
        return kiln_err(err, KILN_ERR_FORMAT, "%s: section %s: %s", label, lab, why);
    if (begin == end) {
        *data = stored; /* a valid pointer to no bytes */
        return KILN_OK;
    }
    /* the chunks that hold [begin, end) */
    const uint32_t c0 = (uint32_t)(begin / ix.chunk_size), c1 = (uint32_t)((end - 1) / ix.chunk_size + 1);
    const uint64_t from = (uint64_t)c0 * ix.chunk_size, to = c1 < ix.chunk_count ? (uint64_t)c1 * ix.chunk_size
                                                                                 : ix.raw_size;
    if (to - from > SIZE_MAX - KILN_ENGINE_ALIGN)
        return kiln_err(err, KILN_ERR_NOMEM, "%s: section %s: %llu raw bytes do not fit in memory", label, lab,
                        (unsigned long long)(to - from));
    size_t cap = (size_t)kiln_align_up(to - from, KILN_ENGINE_ALIGN);
    uint8_t *dst = aligned_alloc(KILN_ENGINE_ALIGN, cap);
    if (!dst)
        return kiln_err(err, KILN_ERR_NOMEM, "%s: section %s: cannot allocate %llu bytes to decode it", label, lab,
                        (unsigned long long)(to - from));
    kiln_status st = decode_chunks(&ix, c0, c1, threads, dst, label, lab, err);
    if (st != KILN_OK) {
        free(dst);
        return st;
    }
    *data = dst + (begin - from);
    *base = dst;
    return KILN_OK;
}
