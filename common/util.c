/*
 * util.c — error reports, file mapping, float conversion, byte buffers.
 * See kiln_util.h for the contracts.
 */

#include "kiln_util.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static const char *const status_names[KILN_STATUS_COUNT_] = {
    [KILN_OK] = "ok",
    [KILN_ERR_IO] = "I/O error",
    [KILN_ERR_NOMEM] = "out of host memory",
    [KILN_ERR_INVALID_ARG] = "invalid argument",
    [KILN_ERR_PARSE] = "malformed input",
    [KILN_ERR_UNSUPPORTED] = "unsupported",
    [KILN_ERR_MISSING] = "missing file, field or tensor",
    [KILN_ERR_SHAPE] = "wrong shape or size",
    [KILN_ERR_FORMAT] = "bad engine file",
    [KILN_ERR_VERSION] = "unsupported engine format version",
    [KILN_ERR_CHECKSUM] = "checksum mismatch",
    [KILN_ERR_CONTEXT] = "request does not fit the context",
    [KILN_ERR_VERIFY] = "IR verification failed",
    [KILN_ERR_INTERNAL] = "internal error",
    [KILN_ERR_DEVICE] = "device error",
    [KILN_ERR_CODEC] = "compression error",
    [KILN_ERR_TOKENIZER] = "tokenizer error",
    [KILN_ERR_NUMERIC] = "non-finite result",
};

const char *kiln_status_str(kiln_status s) {
    if ((unsigned)s >= KILN_STATUS_COUNT_ || !status_names[s]) return "unknown status";
    return status_names[s];
}

kiln_status kiln_err(kiln_error *err, kiln_status code, const char *fmt, ...) {
    if (!err) return code;
    err->code = code;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->msg, sizeof err->msg, fmt, ap);
    va_end(ap);
    return code;
}

kiln_status kiln_err_prefix(kiln_error *err, const char *fmt, ...) {
    if (!err) return KILN_ERR_INTERNAL;
    char old[KILN_ERR_MSG_MAX];
    memcpy(old, err->msg, sizeof old);
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(err->msg, sizeof err->msg, fmt, ap);
    va_end(ap);
    if (n < 0) n = 0;
    size_t k = (size_t)n < sizeof err->msg ? (size_t)n : sizeof err->msg - 1;
    size_t rest = strnlen(old, sizeof old - 1);
    if (rest > sizeof err->msg - 1 - k) rest = sizeof err->msg - 1 - k;
    memcpy(err->msg + k, old, rest);
    err->msg[k + rest] = 0;
    return err->code;
}

kiln_status kiln_err_hint(kiln_error *err, const char *fmt, ...) {
    if (!err) return KILN_ERR_INTERNAL;
    size_t n = strlen(err->msg);
    if (n + 8 >= sizeof err->msg) return err->code;
    memcpy(err->msg + n, "\nhint: ", 7);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->msg + n + 7, sizeof err->msg - n - 7, fmt, ap);
    va_end(ap);
    return err->code;
}

void kiln_err_clear(kiln_error *err) {
    if (!err) return;
    err->code = KILN_OK;
    err->msg[0] = 0;
}

/* ---- files ---- */

/* "a FIFO", "a directory"... for "not a regular file (...)" messages. */
static const char *file_type_name(mode_t m) {
    if (S_ISDIR(m)) return "a directory";
    if (S_ISFIFO(m)) return "a FIFO";
    if (S_ISSOCK(m)) return "a socket";
    if (S_ISCHR(m)) return "a character device";
    if (S_ISBLK(m)) return "a block device";
    if (S_ISLNK(m)) return "a symbolic link";
    return "not a file kiln can read";
}

/* The message for a failed stat/open of `path` with errno `e` (always
 * KILN_ERR_IO, as before): a dangling symbolic link is named as such, every
 * other reason by strerror. */
static kiln_status path_error(const char *path, const char *what, int e, kiln_error *err) {
    struct stat ls;
    if (e == ENOENT && lstat(path, &ls) == 0 && S_ISLNK(ls.st_mode)) {
        char target[512];
        ssize_t n = readlink(path, target, sizeof target - 1);
        target[n > 0 ? n : 0] = 0;
        kiln_err(err, KILN_ERR_IO, "%s: a symbolic link to \"%s\", which does not exist", path, target);
        return kiln_err_hint(err, "fix or remove the link");
    }
    kiln_err(err, KILN_ERR_IO, "%s: %s: %s", path, what, strerror(e));
    if (e == EACCES) kiln_err_hint(err, "check the permissions of the file and of the folders above it");
    if (e == ELOOP) kiln_err_hint(err, "a symbolic link in this path points, directly or not, to itself");
    return KILN_ERR_IO;
}

static kiln_status not_regular(const char *path, mode_t m, kiln_error *err) {
    return kiln_err(err, KILN_ERR_IO, "%s: not a regular file (%s)", path, file_type_name(m));
}

/* stat first so a FIFO or device is refused without being opened (opening a
 * FIFO blocks until a writer comes); then open non-blocking and check the
 * descriptor again, in case the path was replaced between the two calls. */
kiln_status kiln_file_open_regular(const char *path, int *out_fd, uint64_t *out_size, kiln_error *err) {
    *out_fd = -1;
    struct stat st;
    if (stat(path, &st) != 0) return path_error(path, "cannot open", errno, err);
    if (!S_ISREG(st.st_mode)) return not_regular(path, st.st_mode, err);
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
    if (fd < 0) return path_error(path, "cannot open", errno, err);
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return path_error(path, "cannot stat", e, err);
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return not_regular(path, st.st_mode, err);
    }
    *out_fd = fd;
    if (out_size) *out_size = (uint64_t)st.st_size;
    return KILN_OK;
}

kiln_status kiln_dir_check(const char *path, kiln_error *err) {
    struct stat st;
    if (stat(path, &st) != 0) {
        int e = errno;
        if (e == ENOENT) {
            struct stat ls;
            if (lstat(path, &ls) == 0) return path_error(path, "no such directory", e, err);
            return kiln_err(err, KILN_ERR_MISSING, "%s: no such directory", path);
        }
        return path_error(path, "cannot open the directory", e, err);
    }
    if (!S_ISDIR(st.st_mode))
        return kiln_err(err, KILN_ERR_INVALID_ARG, "%s: not a directory (%s)", path,
                        S_ISREG(st.st_mode) ? "a regular file" : file_type_name(st.st_mode));
    return KILN_OK;
}

kiln_status kiln_file_map(const char *path, kiln_mapped_file *out, kiln_error *err) {
    memset(out, 0, sizeof *out);
    int fd;
    uint64_t size;
    kiln_status st = kiln_file_open_regular(path, &fd, &size, err);
    if (st != KILN_OK) return st;
    if (size > SIZE_MAX) {
        close(fd);
        return kiln_err(err, KILN_ERR_IO, "%s: %" PRIu64 " bytes do not fit in this process's memory", path, size);
    }
    out->path = strdup(path);
    if (!out->path) {
        close(fd);
        return kiln_err(err, KILN_ERR_NOMEM, "%s: out of memory", path);
    }
    out->size = (size_t)size;
    if (out->size > 0) {
        void *p = mmap(NULL, out->size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (p == MAP_FAILED) {
            int e = errno;
            close(fd);
            free(out->path);
            out->path = NULL;
            return kiln_err(err, KILN_ERR_IO, "%s: cannot mmap: %s", path, strerror(e));
        }
        out->data = p;
        kiln_guard_map_add(out->data, out->size, out->path);
    }
    close(fd);
    return KILN_OK;
}

void kiln_file_unmap(kiln_mapped_file *f) {
    if (f->data && f->size) {
        kiln_guard_map_remove(f->data);
        munmap((void *)f->data, f->size);
    }
    free(f->path);
    memset(f, 0, sizeof *f);
}

kiln_status kiln_file_read(const char *path, size_t max_size, char **out, size_t *out_len, kiln_error *err) {
    *out = NULL;
    if (out_len) *out_len = 0;
    int fd;
    uint64_t size;
    kiln_status st = kiln_file_open_regular(path, &fd, &size, err);
    if (st != KILN_OK) return st;
    kiln_buf b = {0};
    char chunk[65536];
    for (;;) {
        ssize_t n = read(fd, chunk, sizeof chunk);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) {
            st = kiln_err(err, KILN_ERR_IO, "%s: cannot read: %s", path, strerror(errno));
            goto out_free;
        }
        if (n == 0) break;
        if (b.len + (size_t)n > max_size) {
            st = kiln_err(err, KILN_ERR_PARSE, "%s: larger than the %zu-byte limit for this kind of file", path,
                          max_size);
            goto out_free;
        }
        if (!kiln_buf_append(&b, chunk, (size_t)n)) {
            st = kiln_err(err, KILN_ERR_NOMEM, "%s: out of memory", path);
            goto out_free;
        }
    }
    if (!kiln_buf_append(&b, "", 1)) {
        st = kiln_err(err, KILN_ERR_NOMEM, "%s: out of memory", path);
        goto out_free;
    }
    close(fd);
    *out = (char *)b.data;
    if (out_len) *out_len = b.len - 1;
    return KILN_OK;
out_free:
    close(fd);
    kiln_buf_free(&b);
    return st;
}

bool kiln_path_is_dir(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

bool kiln_path_exists(const char *path) {
    struct stat st;
    return lstat(path, &st) == 0;
}

char *kiln_path_join(const char *dir, const char *name) {
    size_t a = strlen(dir), b = strlen(name);
    char *s = malloc(a + b + 2);
    if (!s) return NULL;
    memcpy(s, dir, a);
    size_t k = a;
    if (a && dir[a - 1] != '/') s[k++] = '/';
    memcpy(s + k, name, b + 1);
    return s;
}

/* ---- float formats ---- */

static inline float bits_f32(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static inline uint32_t f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

float kiln_bf16_to_f32(uint16_t h) { return bits_f32((uint32_t)h << 16); }

uint16_t kiln_f32_to_bf16(float f) {
    uint32_t u = f32_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40); /* quiet NaN */
    u += 0x7fffu + ((u >> 16) & 1);
    return (uint16_t)(u >> 16);
}

float kiln_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1f, man = h & 0x3ff;
    if (exp == 0) {
        if (man == 0) return bits_f32(sign);
        float v = ldexpf((float)man, -24); /* subnormal */
        return sign ? -v : v;
    }
    if (exp == 31) return bits_f32(sign | 0x7f800000u | (man << 13));
    return bits_f32(sign | ((exp + 112) << 23) | (man << 13));
}

uint16_t kiln_f32_to_f16(float f) {
    uint32_t u = f32_bits(f);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000);
    uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return sign | 0x7e00;              /* NaN */
    if (a >= 0x477ff000u) return sign | 0x7c00;             /* overflow → inf */
    if (a < 0x38800000u) {                                  /* subnormal or zero */
        float v = bits_f32(a);
        return sign | (uint16_t)lrintf(v * 16777216.0f);    /* v / 2^-24, round-to-even */
    }
    uint32_t r = a + 0xfffu + ((a >> 13) & 1) - (112u << 23);
    return sign | (uint16_t)(r >> 13);
}

/* ---- byte buffer ---- */

void kiln_buf_free(kiln_buf *b) {
    free(b->data);
    memset(b, 0, sizeof *b);
}

bool kiln_buf_reserve(kiln_buf *b, size_t extra) {
    if (b->failed) return false;
    if (b->len + extra <= b->cap) return true;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->len + extra) {
        if (cap > SIZE_MAX / 2) {
            b->failed = true;
            return false;
        }
        cap *= 2;
    }
    uint8_t *p = realloc(b->data, cap);
    if (!p) {
        b->failed = true;
        return false;
    }
    b->data = p;
    b->cap = cap;
    return true;
}

bool kiln_buf_append(kiln_buf *b, const void *p, size_t n) {
    if (!kiln_buf_reserve(b, n)) return false;
    if (n) memcpy(b->data + b->len, p, n);
    b->len += n;
    return true;
}

bool kiln_buf_u32(kiln_buf *b, uint32_t v) {
    uint8_t t[4];
    kiln_wr_u32(t, v);
    return kiln_buf_append(b, t, 4);
}

bool kiln_buf_u64(kiln_buf *b, uint64_t v) {
    uint8_t t[8];
    kiln_wr_u64(t, v);
    return kiln_buf_append(b, t, 8);
}

bool kiln_buf_f32(kiln_buf *b, float v) { return kiln_buf_u32(b, f32_bits(v)); }

bool kiln_buf_zeros(kiln_buf *b, size_t n) {
    if (!kiln_buf_reserve(b, n)) return false;
    memset(b->data + b->len, 0, n);
    b->len += n;
    return true;
}

bool kiln_buf_printf(kiln_buf *b, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n < 0 || !kiln_buf_reserve(b, (size_t)n + 1)) return false;
    va_start(ap, fmt);
    vsnprintf((char *)b->data + b->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    b->len += (size_t)n;
    return true;
}

double kiln_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}
