/*
 * engine_append.c — replace or add one section of an engine file in place
 * (kiln_engine_put_section, format/kiln_tuning.h): how `kiln tune` records
 * its measurements without rewriting a 15 GB engine.
 *
 * The file is never left broken:
 * - it is verified in full first (every check and checksum of engine.c);
 * - the new section is written after the file's current end (4096-aligned,
 *   zero padding), then a new section table; nothing the current header
 *   refers to is touched, so until the header is rewritten the old header
 *   still describes the old bytes exactly;
 * - the data is fsync'd, then the 64-byte header (same magic, major, minor
 *   and reserved bytes; new count, table offset, file size and checksums)
 *   is written in one pwrite and fsync'd;
 * - any failure truncates the file to its original size (and restores the
 *   original header if it had been written), so it is byte-identical;
 *   SIGINT, SIGTERM and SIGHUP are held off from the first write to the
 *   end. A crash or power loss in that window leaves the original bytes
 *   followed by the new ones: the header still names the original size, and
 *   truncating to it restores the engine (the reader's hint says so).
 * The old section and table stay in the file as unreferenced bytes (a few
 * KiB per `kiln tune` run; readers accept gaps, docs/engine-format.md).
 * An exclusive flock keeps two `kiln tune` runs from appending at once.
 */
#include "../format/kiln_tuning.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <xxhash.h>

/* Write all n bytes at off (EINTR retried). */
static bool pwrite_all(int fd, const void *p, size_t n, uint64_t off) {
    const uint8_t *b = p;
    while (n) {
        ssize_t w = pwrite(fd, b, n, (off_t)off);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return false;
        b += w, n -= (size_t)w, off += (uint64_t)w;
    }
    return true;
}

kiln_status kiln_engine_put_section(const char *path, uint32_t kind, const void *p, size_t n, uint64_t *old_size,
                                    uint64_t *new_size, kiln_error *err) {
    kiln_engine e;
    kiln_status st = kiln_engine_open(path, &e, err);
    if (st) return kiln_err_prefix(err, "cannot add a section: ");
    /* the new table: every entry but those of `kind`, then the new section */
    kiln_engine_section tab[KILN_ENGINE_MAX_SECTIONS];
    uint32_t count = 0;
    for (uint32_t i = 0; i < e.n_sections; i++)
        if (e.sections[i].kind != kind) tab[count++] = e.sections[i];
    const uint64_t size0 = e.size, sec_off = kiln_align_up(size0, KILN_ENGINE_ALIGN);
    const uint16_t major = e.major;
    uint8_t h0[KILN_ENGINE_HEADER_SIZE];
    memcpy(h0, e.data, sizeof h0);
    if (count == KILN_ENGINE_MAX_SECTIONS) {
        kiln_engine_close(&e);
        return kiln_err(err, KILN_ERR_FORMAT, "%s: already %d sections, no room for a %s section", path,
                        KILN_ENGINE_MAX_SECTIONS, kiln_section_kind_name(kind));
    }
    tab[count++] = (kiln_engine_section){.kind = kind,
                                         .codec = KILN_CODEC_NONE,
                                         .offset = sec_off,
                                         .stored_size = n,
                                         .raw_size = n,
                                         .checksum = kiln_engine_checksum(major, p, n, 1)};
    kiln_engine_close(&e);
    uint64_t table_off = kiln_align_up(sec_off + n, KILN_ENGINE_ENTRY_SIZE);
    uint64_t size1 = table_off + (uint64_t)count * KILN_ENGINE_ENTRY_SIZE;
    uint8_t table[KILN_ENGINE_MAX_SECTIONS * KILN_ENGINE_ENTRY_SIZE] = {0};
    for (uint32_t i = 0; i < count; i++) {
        uint8_t *q = table + (size_t)i * KILN_ENGINE_ENTRY_SIZE;
        kiln_wr_u32(q, tab[i].kind);
        kiln_wr_u32(q + 4, tab[i].codec);
        kiln_wr_u64(q + 8, tab[i].offset);
        kiln_wr_u64(q + 16, tab[i].stored_size);
        kiln_wr_u64(q + 24, tab[i].raw_size);
        kiln_wr_u64(q + 32, tab[i].checksum);
    }
    const size_t table_bytes = (size_t)count * KILN_ENGINE_ENTRY_SIZE;
    uint8_t h1[KILN_ENGINE_HEADER_SIZE];
    memcpy(h1, h0, sizeof h1); /* magic, major, minor and reserved bytes as they were */
    kiln_wr_u32(h1 + 12, count);
    kiln_wr_u64(h1 + 16, table_off);
    kiln_wr_u64(h1 + 24, size1);
    kiln_wr_u64(h1 + 32, XXH64(table, table_bytes, 0));
    kiln_wr_u64(h1 + 56, XXH64(h1, 56, 0));

    int fd = open(path, O_RDWR | O_CLOEXEC);
    if (fd < 0) return kiln_err(err, KILN_ERR_IO, "%s: cannot open for writing: %s", path, strerror(errno));
    if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
        st = kiln_err(err, KILN_ERR_IO, "%s: another process holds a lock on it (`kiln tune` running?): %s", path,
                      strerror(errno));
        close(fd);
        return st;
    }
    struct stat sb;
    if (fstat(fd, &sb) != 0 || (uint64_t)sb.st_size != size0) {
        st = kiln_err(err, KILN_ERR_IO, "%s: changed while it was being verified; nothing written", path);
        close(fd);
        return st;
    }
    sigset_t hold, old;
    sigemptyset(&hold);
    sigaddset(&hold, SIGINT), sigaddset(&hold, SIGTERM), sigaddset(&hold, SIGHUP);
    pthread_sigmask(SIG_BLOCK, &hold, &old);
    bool header_written = false;
    const char *what = "the section";
    static const uint8_t zeros[KILN_ENGINE_ALIGN];
    if (sec_off > size0 && !pwrite_all(fd, zeros, (size_t)(sec_off - size0), size0)) goto io_fail;
    if (n && !pwrite_all(fd, p, n, sec_off)) goto io_fail;
    what = "the section table";
    if (table_off > sec_off + n && !pwrite_all(fd, zeros, (size_t)(table_off - sec_off - n), sec_off + n)) goto io_fail;
    if (!pwrite_all(fd, table, table_bytes, table_off)) goto io_fail;
    what = "the new bytes to disk";
    if (fdatasync(fd) != 0) goto io_fail;
    what = "the header";
    header_written = true; /* from here a failure restores h0 too */
    if (!pwrite_all(fd, h1, sizeof h1, 0)) goto io_fail;
    what = "the header to disk";
    if (fsync(fd) != 0) goto io_fail;
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    close(fd);
    if (old_size) *old_size = size0;
    if (new_size) *new_size = size1;
    return KILN_OK;
io_fail:
    st = kiln_err(err, KILN_ERR_IO, "%s: writing %s failed: %s", path, what, strerror(errno ? errno : EIO));
    {
        bool restored = (!header_written || pwrite_all(fd, h0, sizeof h0, 0)) && ftruncate(fd, (off_t)size0) == 0 &&
                        fsync(fd) == 0;
        if (restored)
            kiln_err_hint(err, "the engine was left as it was (truncated back to %llu bytes)",
                          (unsigned long long)size0);
        else
            kiln_err_hint(err, "restoring it failed too: truncate the file to %llu bytes (`truncate -s %llu %s`) "
                               "to get the engine back",
                          (unsigned long long)size0, (unsigned long long)size0, path);
    }
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    close(fd);
    return st;
}
