/*
 * standalone.c — find the engine of a packaged executable (kiln_standalone.h).
 *
 * Embedded: the engine is a section of the executable, already mapped by the
 * loader; the engine is opened from memory. Appended: the engine follows the
 * linked executable in its file; the trailer at the end of /proc/self/exe
 * says where, and the engine is opened as a range of that file (mmapped from
 * a page boundary, like an engine file). In both cases the engine reader
 * then verifies everything it verifies for an engine file.
 *
 * An embedded engine is the last segment of the file (codegen/package.c
 * places it there), so a copy cut short still starts; before a byte of it is
 * read, the file's size is checked against where the engine's last byte lies
 * (its address mapped back to a file offset through the program headers):
 * reading pages past the end of a mapped file would be a SIGBUS.
 */
#include <fcntl.h>
#include <link.h>
#include <stdio.h>
#include <sys/stat.h>
#include <string.h>
#include <unistd.h>

#include <xxhash.h>

#include "../format/kiln_standalone.h"

/* Refuse an engine whose header is intact but is not the one `d` was built
 * with (a damaged header is left to the engine reader, which names it). */
static kiln_status check_identity(const uint8_t h[KILN_ENGINE_HEADER_SIZE], const kiln_standalone_desc *d,
                                  const char *label, kiln_error *err) {
    uint64_t sum = kiln_rd_u64(h + 56);
    if (memcmp(h, KILN_ENGINE_MAGIC, 8) == 0 && XXH64(h, 56, 0) == sum && sum != d->engine_checksum) {
        kiln_err(err, KILN_ERR_FORMAT, "%s: the built-in engine (header checksum %016llx) is not the one this "
                 "executable was built with (%016llx)", label, (unsigned long long)sum,
                 (unsigned long long)d->engine_checksum);
        return kiln_err_hint(err, "rebuild the executable with `kiln package`");
    }
    return KILN_OK;
}

typedef struct seg_find {
    uintptr_t addr;   /* the embedded engine's address */
    uint64_t offset;  /* out: its offset in the executable's file */
    bool found;
} seg_find;

/* dl_iterate_phdr callback: the main program (the first object) only. */
static int find_offset(struct dl_phdr_info *info, size_t size, void *user) {
    (void)size;
    seg_find *f = user;
    for (int i = 0; i < info->dlpi_phnum; i++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        uintptr_t start = info->dlpi_addr + ph->p_vaddr;
        if (ph->p_type != PT_LOAD || f->addr < start || f->addr - start >= ph->p_filesz) continue;
        f->offset = ph->p_offset + (f->addr - start);
        f->found = true;
    }
    return 1; /* stop after the main program */
}

/* The embedded engine's bytes are all in the file (a copy cut short is refused
 * here, before its pages are touched). */
static kiln_status check_embedded_size(const kiln_standalone_desc *d, const char *exe, const char *label,
                                       kiln_error *err) {
    seg_find f = {.addr = (uintptr_t)d->engine};
    dl_iterate_phdr(find_offset, &f);
    struct stat st;
    if (!f.found || stat(exe, &st) != 0)
        return KILN_OK; /* cannot tell (no /proc): the engine reader's checks still apply */
    uint64_t need = f.offset + d->engine_size;
    if ((uint64_t)st.st_size < need) {
        kiln_err(err, KILN_ERR_FORMAT, "%s: the executable is truncated: %llu bytes, but its built-in engine "
                 "ends at byte %llu", label, (unsigned long long)st.st_size, (unsigned long long)need);
        return kiln_err_hint(err, "copy the executable again, or rebuild it with `kiln package`");
    }
    return KILN_OK;
}

kiln_status kiln_standalone_engine(const kiln_standalone_desc *d, const char *exe, const char *label,
                                   kiln_engine_src *out, kiln_error *err) {
    memset(out, 0, sizeof *out);
    if (!exe) exe = "/proc/self/exe";
    if (!label) label = exe;
    if (!d || d->struct_size != sizeof *d)
        return kiln_err(err, KILN_ERR_INTERNAL, "%s: the executable's description has %u bytes, this runtime "
                        "expects %zu", label, d ? d->struct_size : 0, sizeof *d);
    if (d->payload == KILN_PAYLOAD_EMBEDDED) {
        if (!d->engine || d->engine_size < KILN_ENGINE_HEADER_SIZE)
            return kiln_err(err, KILN_ERR_FORMAT, "%s: the embedded engine is missing (%llu bytes)", label,
                            (unsigned long long)d->engine_size);
        kiln_status st = check_embedded_size(d, exe, label, err);
        if (st == KILN_OK) st = check_identity(d->engine, d, label, err);
        if (st != KILN_OK) return st;
        *out = (kiln_engine_src){.data = d->engine, .size = d->engine_size, .label = label};
        return KILN_OK;
    }
    if (d->payload != KILN_PAYLOAD_APPENDED)
        return kiln_err(err, KILN_ERR_INTERNAL, "%s: unknown payload kind %u", label, d->payload);
    bool any = d->engine_size == 0 && d->engine_checksum == KILN_STANDALONE_TEMPLATE;
    kiln_payload_trailer t;
    kiln_status st = kiln_payload_trailer_read(exe, label, &t, err);
    if (st != KILN_OK && any)
        return kiln_err_hint(err, "this is a template: attach an engine with `kiln package ENGINE -o NAME "
                                  "--from-template %s`", label);
    if (st != KILN_OK) return st;
    if (!any && (t.size != d->engine_size || t.engine_checksum != d->engine_checksum)) {
        kiln_err(err, KILN_ERR_FORMAT, "%s: the appended engine (%llu bytes, checksum %016llx) is not the one this "
                 "executable was built with (%llu bytes, checksum %016llx)", label, (unsigned long long)t.size,
                 (unsigned long long)t.engine_checksum, (unsigned long long)d->engine_size,
                 (unsigned long long)d->engine_checksum);
        return kiln_err_hint(err, "rebuild the executable with `kiln package`");
    }
    uint8_t h[KILN_ENGINE_HEADER_SIZE];
    int fd = open(exe, O_RDONLY | O_CLOEXEC);
    bool got = fd >= 0 && pread(fd, h, sizeof h, (off_t)t.offset) == (ssize_t)sizeof h;
    if (fd >= 0) close(fd);
    if (got && !any && (st = check_identity(h, d, label, err)) != KILN_OK) return st;
    *out = (kiln_engine_src){.path = exe, .offset = t.offset, .size = t.size, .range = true, .label = label};
    return KILN_OK;
}
