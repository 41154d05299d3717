/*
 * standalone.c — find the engine of a packaged executable (kiln_standalone.h).
 *
 * Embedded: the engine is a section of the executable, already mapped by the
 * loader; the engine is opened from memory. Appended: the engine follows the
 * linked executable in its file; the trailer at the end of /proc/self/exe
 * says where, and the engine is opened as a range of that file (mmapped from
 * a page boundary, like an engine file). In both cases the engine reader
 * then verifies everything it verifies for an engine file.
 */
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include <xxhash.h>

#include "kiln_standalone.h"

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
        kiln_status st = check_identity(d->engine, d, label, err);
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
