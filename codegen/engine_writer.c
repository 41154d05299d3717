/*
 * engine_writer.c — writes an engine file (format: format/kiln_engine.h,
 * docs/engine-format.md).
 *
 * Decisions:
 * - Atomic output. Bytes go to "<path>.tmp.XXXXXX" (mkstemp) beside the
 *   target; finish fsyncs it and rename(2)s it over the target. Any failure,
 *   and abort, unlink the temporary file, so neither a partial engine at the
 *   target nor a stray temporary file beside it is ever left behind. A failed
 *   step poisons the writer: later calls return the first error.
 * - Header last. A zeroed 64-byte placeholder is written first; sections are
 *   streamed, each at a 4096-aligned offset (zero padding); the section table
 *   follows the last section at a 64-aligned offset; then the real header is
 *   written at offset 0 with pwrite.
 * - Streaming. Checksums are computed as bytes go out: a section's (format
 *   2) as XXH3 states, one for the current KILN_ENGINE_HASH_PIECE-byte piece
 *   and one over the finished pieces' digests; the table's as XXH64. A zstd
 *   section holds one raw chunk (KILN_ENGINE_ZSTD_CHUNK) in memory,
 *   compresses it into one independent frame when full, and writes
 *   its chunk index and footer after the frames (the chunk count is only
 *   known at the end). Memory use is independent of the section sizes.
 * - Determinism. The output depends only on the sections given: no time,
 *   no path, no uninitialised bytes; zstd is single-threaded at a fixed level.
 * - The file is created 0600 by mkstemp and set to 0644 before the rename.
 * - Signals. The temporary path is registered with common/guard.c while it
 *   exists, so SIGINT/SIGTERM/SIGHUP unlink it too (when the program
 *   installed kiln_guard_install). A mapped input that shrank (SIGBUS turned
 *   into a record by the guard) fails the next write and the finish, so an
 *   engine holding the zeros read in its place is never renamed into place.
 */
#include "../format/kiln_engine.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <libgen.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/kiln_progress.h"

#include <xxhash.h>
#include <zstd.h>

#define OUT_BUF_SIZE (1u << 20) /* bytes buffered before a write(2) */

struct kiln_engine_writer {
    char *path;                 /* the target */
    char *tmp_path;             /* the temporary file beside it; NULL once unlinked or renamed */
    int tmp_slot;               /* its kiln_guard_temp_add slot (-1: none) */
    int fd;
    uint64_t pos;               /* bytes emitted so far (file offset of the next byte) */
    uint8_t *out;               /* OUT_BUF_SIZE bytes waiting to be written */
    size_t out_len;
    kiln_status failed;         /* first failure; KILN_OK while healthy */
    kiln_error failure;         /* its message, repeated by later calls */
    kiln_progress *progress;    /* raw bytes of the open section, when set */

    kiln_engine_section sections[KILN_ENGINE_MAX_SECTIONS];
    uint32_t n_sections;

    /* the section being written (between begin and end) */
    bool in_section;
    kiln_engine_section cur;    /* kind, codec, offset; sizes and checksum filled at end */
    XXH64_state_t *hash;        /* the section table's */
    XXH3_state_t *piece;        /* the current checksum piece of `cur` */
    XXH3_state_t *outer;        /* the digests of `cur`'s finished pieces */
    uint64_t piece_fill;        /* bytes in the current piece */

    /* zstd state: one raw chunk, its compressed frame, the frames' sizes */
    ZSTD_CCtx *cctx;
    uint8_t *chunk;             /* KILN_ENGINE_ZSTD_CHUNK raw bytes */
    size_t chunk_len;
    uint8_t *frame;             /* ZSTD_compressBound(KILN_ENGINE_ZSTD_CHUNK) bytes */
    size_t frame_cap;
    kiln_buf frame_sizes;       /* u64 LE stored size per chunk so far */
    uint32_t chunk_count;
};

/* Unlink the temporary file (once). */
static void w_drop_tmp(kiln_engine_writer *w) {
    if (w->tmp_path) unlink(w->tmp_path); /* before unregistering: a signal in between finds nothing left */
    kiln_guard_temp_remove(w->tmp_slot);
    w->tmp_slot = -1;
    free(w->tmp_path);
    w->tmp_path = NULL;
}

/* Record the first failure, unlink the temporary file, return the status. */
static kiln_status w_fail(kiln_engine_writer *w, kiln_error *err, kiln_status code, const char *fmt, ...)
    KILN_PRINTF(4, 5);
static kiln_status w_fail(kiln_engine_writer *w, kiln_error *err, kiln_status code, const char *fmt, ...) {
    char msg[KILN_ERR_MSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (w->failed == KILN_OK) {
        w->failed = code;
        kiln_err(&w->failure, code, "%s: %s", w->path, msg);
    }
    w_drop_tmp(w);
    if (err) *err = w->failure;
    return w->failed;
}

/* Fail with an input's fault (a mapped file shrank), which names that file. */
static kiln_status w_check_inputs(kiln_engine_writer *w, kiln_error *err) {
    kiln_error cause = {0};
    if (w->failed != KILN_OK || !kiln_guard_fault(&cause)) return w->failed;
    w->failed = cause.code;
    w->failure = cause;
    w_drop_tmp(w);
    if (err) *err = w->failure;
    return w->failed;
}

/* Repeat the first failure, if any. */
static kiln_status w_check(kiln_engine_writer *w, kiln_error *err) {
    if (w->failed != KILN_OK && err) *err = w->failure;
    return w->failed;
}

static kiln_status w_flush(kiln_engine_writer *w, kiln_error *err) {
    size_t done = 0;
    while (done < w->out_len) {
        ssize_t n = write(w->fd, w->out + done, w->out_len - done);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0 && errno == EFBIG) {
            w_fail(w, NULL, KILN_ERR_IO, "cannot write %s: %s at %" PRIu64 " bytes", w->tmp_path, strerror(EFBIG),
                   w->pos - w->out_len + done);
            kiln_err_hint(&w->failure, "the file size limit (ulimit -f) or the file system's largest file is "
                                       "smaller than the engine");
            return w_check(w, err);
        }
        if (n <= 0)
            return w_fail(w, err, KILN_ERR_IO, "cannot write %s: %s", w->tmp_path ? w->tmp_path : "",
                          n < 0 ? strerror(errno) : "no progress");
        done += (size_t)n;
    }
    w->out_len = 0;
    return KILN_OK;
}

/* Emit bytes (NULL = zeros) at the current position; hashed into the
 * current section when one is open. */
/* Close the current checksum piece: its digest goes into the outer hash. */
static void w_piece_done(kiln_engine_writer *w) {
    uint8_t le[8];
    kiln_wr_u64(le, XXH3_64bits_digest(w->piece));
    XXH3_64bits_update(w->outer, le, 8);
    XXH3_64bits_reset(w->piece);
    w->piece_fill = 0;
}

/* Hash n bytes (NULL = zeros) into the section checksum, piece by piece. */
static void w_hash(kiln_engine_writer *w, const uint8_t *src, size_t n) {
    static const uint8_t zeros[256];
    while (n > 0) {
        size_t take = KILN_ENGINE_HASH_PIECE - w->piece_fill;
        if (take > n) take = n;
        if (!src && take > sizeof zeros) take = sizeof zeros;
        XXH3_64bits_update(w->piece, src ? src : zeros, take);
        w->piece_fill += take;
        if (src) src += take;
        n -= take;
        if (w->piece_fill == KILN_ENGINE_HASH_PIECE) w_piece_done(w);
    }
}

static kiln_status w_put(kiln_engine_writer *w, const void *p, size_t n, kiln_error *err) {
    const uint8_t *src = p;
    if (w->in_section && n) w_hash(w, src, n);
    while (n > 0) {
        size_t room = OUT_BUF_SIZE - w->out_len, take = n < room ? n : room;
        if (src) {
            memcpy(w->out + w->out_len, src, take);
            src += take;
        } else {
            memset(w->out + w->out_len, 0, take);
        }
        w->out_len += take;
        w->pos += take;
        n -= take;
        if (w->out_len == OUT_BUF_SIZE && w_flush(w, err) != KILN_OK) return w->failed;
    }
    return KILN_OK;
}

static kiln_status w_pad_to(kiln_engine_writer *w, uint64_t align, kiln_error *err) {
    return w_put(w, NULL, (size_t)(kiln_align_up(w->pos, align) - w->pos), err);
}

static void w_free(kiln_engine_writer *w) {
    if (w->fd >= 0) close(w->fd);
    w_drop_tmp(w);
    free(w->path);
    free(w->out);
    free(w->chunk);
    free(w->frame);
    kiln_buf_free(&w->frame_sizes);
    XXH64_freeState(w->hash);
    if (w->piece) XXH3_freeState(w->piece);
    if (w->outer) XXH3_freeState(w->outer);
    ZSTD_freeCCtx(w->cctx);
    free(w);
}

kiln_status kiln_engine_writer_open(const char *path, kiln_engine_writer **out, kiln_error *err) {
    *out = NULL;
    if (!path || !*path) return kiln_err(err, KILN_ERR_INVALID_ARG, "engine writer: empty output path");
    kiln_engine_writer *w = calloc(1, sizeof *w);
    if (!w) return kiln_err(err, KILN_ERR_NOMEM, "%s: out of memory", path);
    w->fd = -1;
    w->tmp_slot = -1;
    size_t n = strlen(path);
    w->path = strdup(path);
    w->tmp_path = malloc(n + sizeof ".tmp.XXXXXX");
    w->out = malloc(OUT_BUF_SIZE);
    w->hash = XXH64_createState();
    w->piece = XXH3_createState();
    w->outer = XXH3_createState();
    if (!w->path || !w->tmp_path || !w->out || !w->hash || !w->piece || !w->outer) {
        w_free(w);
        return kiln_err(err, KILN_ERR_NOMEM, "%s: out of memory", path);
    }
    memcpy(w->tmp_path, path, n);
    memcpy(w->tmp_path + n, ".tmp.XXXXXX", sizeof ".tmp.XXXXXX");
    w->fd = mkostemp(w->tmp_path, O_CLOEXEC);
    if (w->fd >= 0) w->tmp_slot = kiln_guard_temp_add(w->tmp_path); /* right away: the signal watcher unlinks it */
    if (w->fd < 0) {
        int e = errno;
        free(w->tmp_path);
        w->tmp_path = NULL; /* nothing was created */
        kiln_err(err, KILN_ERR_IO, "%s: cannot create the output file: %s", path, strerror(e));
        if (e == ENOENT) kiln_err_hint(err, "does the output directory exist?");
        w_free(w);
        return KILN_ERR_IO;
    }
    /* the header placeholder; the real header is written by finish */
    if (w_put(w, NULL, KILN_ENGINE_HEADER_SIZE, err) != KILN_OK) {
        w_free(w);
        return KILN_ERR_IO;
    }
    *out = w;
    return KILN_OK;
}

kiln_status kiln_engine_writer_begin(kiln_engine_writer *w, uint32_t kind, uint32_t codec, kiln_error *err) {
    if (w_check(w, err) != KILN_OK) return w->failed;
    if (w->in_section)
        return w_fail(w, err, KILN_ERR_INTERNAL, "section '%s' begun while another is open",
                      kiln_section_kind_name(kind));
    if (codec != KILN_CODEC_NONE && codec != KILN_CODEC_ZSTD_CHUNKED)
        return w_fail(w, err, KILN_ERR_INVALID_ARG, "section '%s': unknown codec %u", kiln_section_kind_name(kind),
                      codec);
    if (w->n_sections == KILN_ENGINE_MAX_SECTIONS)
        return w_fail(w, err, KILN_ERR_INVALID_ARG, "more than %d sections", KILN_ENGINE_MAX_SECTIONS);
    if (w_pad_to(w, KILN_ENGINE_ALIGN, err) != KILN_OK) return w->failed;
    if (codec == KILN_CODEC_ZSTD_CHUNKED && !w->cctx) {
        w->cctx = ZSTD_createCCtx();
        w->chunk = malloc(KILN_ENGINE_ZSTD_CHUNK);
        w->frame_cap = ZSTD_compressBound(KILN_ENGINE_ZSTD_CHUNK);
        w->frame = malloc(w->frame_cap);
        if (!w->cctx || !w->chunk || !w->frame)
            return w_fail(w, err, KILN_ERR_NOMEM, "out of memory for the zstd compressor");
    }
    w->cur = (kiln_engine_section){.kind = kind, .codec = codec, .offset = w->pos};
    w->chunk_len = 0;
    w->chunk_count = 0;
    w->frame_sizes.len = 0;
    XXH3_64bits_reset(w->piece);
    XXH3_64bits_reset(w->outer);
    w->piece_fill = 0;
    w->in_section = true;
    return KILN_OK;
}

/* Compress the buffered raw chunk into one frame and emit it. */
static kiln_status w_flush_chunk(kiln_engine_writer *w, kiln_error *err) {
    if (w->chunk_len == 0) return KILN_OK;
    if (w->chunk_count == UINT32_MAX)
        return w_fail(w, err, KILN_ERR_INVALID_ARG, "section '%s': too many zstd chunks",
                      kiln_section_kind_name(w->cur.kind));
    size_t n = ZSTD_compressCCtx(w->cctx, w->frame, w->frame_cap, w->chunk, w->chunk_len, KILN_ENGINE_ZSTD_LEVEL);
    if (ZSTD_isError(n))
        return w_fail(w, err, KILN_ERR_CODEC, "section '%s', zstd chunk %u: %s",
                      kiln_section_kind_name(w->cur.kind), w->chunk_count, ZSTD_getErrorName(n));
    if (!kiln_buf_u64(&w->frame_sizes, n)) return w_fail(w, err, KILN_ERR_NOMEM, "out of memory");
    w->chunk_count++;
    w->chunk_len = 0;
    return w_put(w, w->frame, n, err);
}

kiln_status kiln_engine_writer_write(kiln_engine_writer *w, const void *p, size_t n, kiln_error *err) {
    if (w_check(w, err) != KILN_OK || w_check_inputs(w, err) != KILN_OK) return w->failed;
    if (!w->in_section) return w_fail(w, err, KILN_ERR_INTERNAL, "bytes written outside a section");
    if (n && !p) return w_fail(w, err, KILN_ERR_INVALID_ARG, "NULL data for %zu bytes", n);
    if (!kiln_add_u64(w->cur.raw_size, n, &w->cur.raw_size))
        return w_fail(w, err, KILN_ERR_INVALID_ARG, "section '%s' is too large", kiln_section_kind_name(w->cur.kind));
    kiln_progress_update(w->progress, w->cur.raw_size);
    if (w->cur.codec == KILN_CODEC_NONE) return w_put(w, p, n, err);
    const uint8_t *src = p;
    while (n > 0) {
        size_t room = KILN_ENGINE_ZSTD_CHUNK - w->chunk_len, take = n < room ? n : room;
        memcpy(w->chunk + w->chunk_len, src, take);
        w->chunk_len += take;
        src += take;
        n -= take;
        if (w->chunk_len == KILN_ENGINE_ZSTD_CHUNK && w_flush_chunk(w, err) != KILN_OK) return w->failed;
    }
    return KILN_OK;
}

kiln_status kiln_engine_writer_end(kiln_engine_writer *w, kiln_error *err) {
    if (w_check(w, err) != KILN_OK) return w->failed;
    if (!w->in_section) return w_fail(w, err, KILN_ERR_INTERNAL, "section ended but none was begun");
    if (w->cur.codec == KILN_CODEC_ZSTD_CHUNKED) {
        /* last frame, then the chunk index and the footer */
        uint8_t foot[16];
        kiln_wr_u64(foot, w->cur.raw_size);
        kiln_wr_u32(foot + 8, KILN_ENGINE_ZSTD_CHUNK);
        if (w_flush_chunk(w, err) != KILN_OK) return w->failed;
        kiln_wr_u32(foot + 12, w->chunk_count);
        if (w->frame_sizes.failed) return w_fail(w, err, KILN_ERR_NOMEM, "out of memory");
        if (w_put(w, w->frame_sizes.data, w->frame_sizes.len, err) != KILN_OK) return w->failed;
        if (w_put(w, foot, sizeof foot, err) != KILN_OK) return w->failed;
    }
    w->cur.stored_size = w->pos - w->cur.offset;
    if (w->piece_fill > 0) w_piece_done(w);
    w->cur.checksum = XXH3_64bits_digest(w->outer);
    w->sections[w->n_sections++] = w->cur;
    w->in_section = false;
    return KILN_OK;
}

kiln_status kiln_engine_writer_section(kiln_engine_writer *w, uint32_t kind, uint32_t codec, const void *p,
                                       size_t n, kiln_error *err) {
    kiln_status st = kiln_engine_writer_begin(w, kind, codec, err);
    if (st == KILN_OK) st = kiln_engine_writer_write(w, p, n, err);
    if (st == KILN_OK) st = kiln_engine_writer_end(w, err);
    return st;
}

/* fsync the directory holding `path` so the rename is durable (best effort:
 * the engine is complete and in place whether or not this succeeds). */
static void sync_parent_dir(const char *path) {
    char *copy = strdup(path);
    if (!copy) return;
    int dfd = open(dirname(copy), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd >= 0) {
        (void)fsync(dfd);
        close(dfd);
    }
    free(copy);
}

kiln_status kiln_engine_writer_finish(kiln_engine_writer *w, kiln_error *err) {
    kiln_status st = w_check(w, err);
    if (st == KILN_OK) st = w_check_inputs(w, err);
    if (st != KILN_OK) goto out_free;
    if (w->in_section) {
        st = w_fail(w, err, KILN_ERR_INTERNAL, "finished while section '%s' is still open",
                    kiln_section_kind_name(w->cur.kind));
        goto out_free;
    }
    if (w->n_sections == 0) {
        st = w_fail(w, err, KILN_ERR_INVALID_ARG, "an engine needs at least one section");
        goto out_free;
    }

    /* the section table */
    if ((st = w_pad_to(w, KILN_ENGINE_ENTRY_SIZE, err)) != KILN_OK) goto out_free;
    uint64_t table_off = w->pos;
    XXH64_state_t *hash = w->hash;
    XXH64_reset(hash, 0);
    for (uint32_t i = 0; i < w->n_sections; i++) {
        const kiln_engine_section *s = &w->sections[i];
        uint8_t e[KILN_ENGINE_ENTRY_SIZE] = {0};
        kiln_wr_u32(e, s->kind);
        kiln_wr_u32(e + 4, s->codec);
        kiln_wr_u64(e + 8, s->offset);
        kiln_wr_u64(e + 16, s->stored_size);
        kiln_wr_u64(e + 24, s->raw_size);
        kiln_wr_u64(e + 32, s->checksum);
        XXH64_update(hash, e, sizeof e);
        if ((st = w_put(w, e, sizeof e, err)) != KILN_OK) goto out_free;
    }
    if ((st = w_flush(w, err)) != KILN_OK) goto out_free;

    /* the header, last */
    uint8_t h[KILN_ENGINE_HEADER_SIZE] = {0};
    memcpy(h, KILN_ENGINE_MAGIC, 8);
    h[8] = KILN_ENGINE_MAJOR & 0xff;
    h[9] = KILN_ENGINE_MAJOR >> 8;
    h[10] = KILN_ENGINE_MINOR & 0xff;
    h[11] = KILN_ENGINE_MINOR >> 8;
    kiln_wr_u32(h + 12, w->n_sections);
    kiln_wr_u64(h + 16, table_off);
    kiln_wr_u64(h + 24, w->pos);
    kiln_wr_u64(h + 32, XXH64_digest(hash));
    kiln_wr_u64(h + 56, XXH64(h, 56, 0));
    ssize_t n;
    do n = pwrite(w->fd, h, sizeof h, 0);
    while (n < 0 && errno == EINTR);
    if (n != (ssize_t)sizeof h) {
        st = w_fail(w, err, KILN_ERR_IO, "cannot write the header: %s", n < 0 ? strerror(errno) : "short write");
        goto out_free;
    }

    /* make it durable, then put it in place */
    if (fchmod(w->fd, 0644) != 0) {
        st = w_fail(w, err, KILN_ERR_IO, "cannot set permissions: %s", strerror(errno));
        goto out_free;
    }
    if (fsync(w->fd) != 0) {
        st = w_fail(w, err, KILN_ERR_IO, "cannot flush to disk: %s", strerror(errno));
        goto out_free;
    }
    int fd = w->fd;
    w->fd = -1;
    if (close(fd) != 0) {
        st = w_fail(w, err, KILN_ERR_IO, "cannot close: %s", strerror(errno));
        goto out_free;
    }
    if (rename(w->tmp_path, w->path) != 0) {
        st = w_fail(w, err, KILN_ERR_IO, "cannot rename %s into place: %s", w->tmp_path, strerror(errno));
        goto out_free;
    }
    kiln_guard_temp_remove(w->tmp_slot);
    w->tmp_slot = -1;
    free(w->tmp_path);
    w->tmp_path = NULL; /* it is the engine now */
    sync_parent_dir(w->path);
    st = KILN_OK;
out_free:
    w_free(w);
    return st;
}

void kiln_engine_writer_set_progress(kiln_engine_writer *w, kiln_progress *p) {
    if (w) w->progress = p;
}

void kiln_engine_writer_abort(kiln_engine_writer *w) {
    if (w) w_free(w);
}
