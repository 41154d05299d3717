/*
 * kiln_util.h — small helpers shared by every kiln module: error reports,
 * read-only file mapping, checked arithmetic, float conversions and a
 * growable byte buffer.
 *
 * Errors: library functions take a `kiln_error *err` as their last argument,
 * fill it through kiln_err() on failure and return the same status. The
 * message names the file, tensor, field or value at fault; a hint saying how
 * to fix it may follow after "\nhint: ". `err` may be NULL when the caller
 * does not want the text. There is no global error state.
 */
#ifndef KILN_UTIL_H
#define KILN_UTIL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kiln_status.h"

#define KILN_ERR_MSG_MAX 1024

typedef struct kiln_error {
    kiln_status code;
    char msg[KILN_ERR_MSG_MAX];
} kiln_error;

#if defined(__GNUC__)
#define KILN_PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define KILN_PRINTF(a, b)
#endif

/* Record `code` and a printf-formatted message in `err`; returns `code`. */
kiln_status kiln_err(kiln_error *err, kiln_status code, const char *fmt, ...) KILN_PRINTF(3, 4);
/* Prefix the message already in `err` with more context ("config.json: ..."); returns err->code. */
kiln_status kiln_err_prefix(kiln_error *err, const char *fmt, ...) KILN_PRINTF(2, 3);
/* Append "\nhint: ..." to the message in `err`; returns err->code. */
kiln_status kiln_err_hint(kiln_error *err, const char *fmt, ...) KILN_PRINTF(2, 3);
void kiln_err_clear(kiln_error *err);

/* ---- files ---- */

/* A read-only view of a whole file, mmapped (or empty for a 0-byte file). */
typedef struct kiln_mapped_file {
    const uint8_t *data;
    size_t size;
    char *path; /* owned copy of the path, for messages */
} kiln_mapped_file;

/* Every function here that opens a path the user named refuses anything
 * but a regular file ("X: not a regular file (a FIFO)") before opening it,
 * so a FIFO or device never blocks kiln, and names the path and the real
 * reason (strerror, a dangling symbolic link) when it cannot open it. */

/* Open a regular file for reading (O_NONBLOCK, O_CLOEXEC; the type is checked
 * before the open and again on the descriptor). *fd is -1 on failure. */
kiln_status kiln_file_open_regular(const char *path, int *fd, uint64_t *size, kiln_error *err);
/* KILN_OK when `path` is a directory (after following symbolic links); else
 * an error naming the path and why: missing, a loop of links, a file... */
kiln_status kiln_dir_check(const char *path, kiln_error *err);
/* Map a regular file read-only. While mapped, the range is registered with
 * the SIGBUS guard (kiln_guard_install), so a file that shrinks under kiln
 * becomes an error naming it instead of a crash. */
kiln_status kiln_file_map(const char *path, kiln_mapped_file *out, kiln_error *err);
void kiln_file_unmap(kiln_mapped_file *f);
/* Read a whole (small) regular file into a NUL-terminated malloc'd buffer,
 * refusing files over max_size. */
kiln_status kiln_file_read(const char *path, size_t max_size, char **out, size_t *out_len, kiln_error *err);
bool kiln_path_is_dir(const char *path);
/* Something is at `path`: a file, a directory, or a symbolic link (even a
 * dangling one, so that opening it reports what is wrong with it). */
bool kiln_path_exists(const char *path);
/* Join dir and name with '/' into a malloc'd string (NULL on allocation failure). */
char *kiln_path_join(const char *dir, const char *name);

/* ---- signals (common/guard.c) ---- */

/* Install kiln's handlers: SIGINT, SIGTERM, SIGHUP are blocked and taken by
 * a watcher thread that unlinks the registered temporary files and
 * re-raises (an ignored one stays ignored); SIGXFSZ is ignored (writes fail
 * with EFBIG instead); SIGBUS in a mapped input file is recorded for
 * kiln_guard_fault. For programs (the `kiln` CLI), not libraries; call it
 * before starting any thread (threads inherit the blocked signals). Once
 * per process; later calls do nothing. */
kiln_status kiln_guard_install(kiln_error *err);
/* Only the SIGBUS part of kiln_guard_install: for the runtime commands (run, serve, bench...), whose
 * SIGINT/SIGTERM are their own. Once per process. */
kiln_status kiln_guard_install_bus(kiln_error *err);
/* Register a temporary file to unlink on a fatal signal; returns a slot for
 * kiln_guard_temp_remove, or -1 when the registry is full. */
int kiln_guard_temp_add(const char *path);
void kiln_guard_temp_remove(int slot);
/* Mapped input ranges (kiln_file_map calls these; `path` must outlive the mapping). */
void kiln_guard_map_add(const void *base, size_t size, const char *path);
void kiln_guard_map_remove(const void *base);
/* True (and a message naming the file and the offset in `err`) once a mapped
 * input shrank under kiln; the bytes read from it since are zeros. */
bool kiln_guard_fault(kiln_error *err);
/* The same for one mapped file: true only when the recorded fault is in `path` (NULL: any). */
bool kiln_guard_fault_in(const char *path, kiln_error *err);
/* Forget a recorded fault (tests). */
void kiln_guard_fault_reset(void);

/* ---- checked arithmetic (return false on overflow) ---- */

static inline bool kiln_mul_u64(uint64_t a, uint64_t b, uint64_t *out) {
    return !__builtin_mul_overflow(a, b, out);
}
static inline bool kiln_add_u64(uint64_t a, uint64_t b, uint64_t *out) {
    return !__builtin_add_overflow(a, b, out);
}
static inline uint64_t kiln_align_up(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

/* ---- float formats ---- */

float kiln_bf16_to_f32(uint16_t h);
uint16_t kiln_f32_to_bf16(float f); /* round to nearest even, NaN kept quiet */
float kiln_f16_to_f32(uint16_t h);
uint16_t kiln_f32_to_f16(float f);  /* round to nearest even */

/* ---- little-endian load/store (files are little-endian) ---- */

static inline uint32_t kiln_rd_u32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static inline uint64_t kiln_rd_u64(const uint8_t *p) {
    return (uint64_t)kiln_rd_u32(p) | (uint64_t)kiln_rd_u32(p + 4) << 32;
}
static inline void kiln_wr_u32(uint8_t *p, uint32_t v) {
    p[0] = (uint8_t)v; p[1] = (uint8_t)(v >> 8); p[2] = (uint8_t)(v >> 16); p[3] = (uint8_t)(v >> 24);
}
static inline void kiln_wr_u64(uint8_t *p, uint64_t v) {
    kiln_wr_u32(p, (uint32_t)v);
    kiln_wr_u32(p + 4, (uint32_t)(v >> 32));
}

/* ---- growable byte buffer ---- */

typedef struct kiln_buf {
    uint8_t *data;
    size_t len, cap;
    bool failed; /* an allocation failed; later appends are no-ops */
} kiln_buf;

void kiln_buf_free(kiln_buf *b);
bool kiln_buf_reserve(kiln_buf *b, size_t extra);
bool kiln_buf_append(kiln_buf *b, const void *p, size_t n);
bool kiln_buf_u32(kiln_buf *b, uint32_t v);
bool kiln_buf_u64(kiln_buf *b, uint64_t v);
bool kiln_buf_f32(kiln_buf *b, float v);
bool kiln_buf_zeros(kiln_buf *b, size_t n);
bool kiln_buf_printf(kiln_buf *b, const char *fmt, ...) KILN_PRINTF(2, 3);

/* Monotonic clock in seconds. */
double kiln_now(void);
/* The source commit this build was made from ("abc123def456", "-dirty" appended when the tree had
 * changes, "unknown" outside git): found at build time (cmake/commit.cmake). */
const char *kiln_build_commit(void);

#endif /* KILN_UTIL_H */
