/*
 * ksec.c — reads and checks an engine's kernels section (layout in
 * kiln_ksec.h). Hostile input like any section: counts capped, the tables
 * must fit, every source and image must lie inside the data, names must be
 * terminated and unique, PTX must end in its NUL, a module may share only an
 * earlier module that owns its source (no chains, no cycles), and images
 * belong to owners only. Plain C with no CUDA header: built in every
 * configuration (CMake's kiln_ksec), so `kiln inspect` verifies the section
 * and fuzz/fuzz_kernels_section.c fuzzes it anywhere.
 */
#include "kiln_ksec_read.h"

#include <stdlib.h>
#include <string.h>

#define BAD(...) kiln_err(err, KILN_ERR_FORMAT, "kernels section: " __VA_ARGS__)

void kiln_ksec_free(kiln_ksec *k) {
    if (!k) return;
    free(k->modules);
    free(k->images);
    memset(k, 0, sizeof *k);
}

/* Module i (its name read) shares module `shares`: an earlier one that owns
 * its source, and i stores no source of its own. */
static kiln_status check_shares(const kiln_ksec *k, uint32_t i, uint32_t shares, uint32_t nm, uint64_t off,
                                uint64_t len, kiln_error *err) {
    const char *name = k->modules[i].name;
    if (shares >= nm) return BAD("module %u '%s' shares module %u, out of range (%u modules)", i, name, shares, nm);
    if (shares == i) return BAD("module %u '%s' shares itself", i, name);
    if (shares > i) return BAD("module %u '%s' shares module %u, a later one (only earlier modules)", i, name, shares);
    const kiln_ksec_module *o = &k->modules[shares];
    if (o->owner != (int)shares)
        return BAD("module %u '%s' shares module %u '%s', which shares module %u itself (no chains)", i, name, shares,
                   o->name, o->owner);
    if (off != 0 || len != 0)
        return BAD("module %u '%s' shares module %u '%s' but has a source of its own (%llu bytes at %llu)", i, name,
                   shares, o->name, (unsigned long long)len, (unsigned long long)off);
    return KILN_OK;
}

kiln_status kiln_ksec_parse(const uint8_t *d, size_t size, kiln_ksec *out, kiln_error *err) {
    memset(out, 0, sizeof *out);
    if (size < KILN_KSEC_HEADER_SIZE) return BAD("%zu bytes cannot hold the %d-byte header", size, KILN_KSEC_HEADER_SIZE);
    if (memcmp(d, KILN_KSEC_MAGIC, 4) != 0) return BAD("bad magic (expected \"KKRN\")");
    uint32_t ver = kiln_rd_u32(d + 4), nm = kiln_rd_u32(d + 8), ni = kiln_rd_u32(d + 12);
    if (ver != KILN_KSEC_VERSION) {
        kiln_err(err, KILN_ERR_VERSION, "kernels section: version %u, this runtime reads version %d only", ver,
                 KILN_KSEC_VERSION);
        return kiln_err_hint(err, "recompile the engine with this kiln (`kiln compile`)");
    }
    if (nm == 0 || nm > KILN_KSEC_MAX_ITEMS || ni > KILN_KSEC_MAX_ITEMS * 8)
        return BAD("%u modules and %u images (1..%d modules allowed)", nm, ni, KILN_KSEC_MAX_ITEMS);
    uint32_t elem = kiln_rd_u32(d + 16), bs = kiln_rd_u32(d + 20);
    if (elem != KILN_KSEC_ELEM_BF16 && elem != KILN_KSEC_ELEM_F32) return BAD("unknown element type %u", elem);
    if (bs == 0 || bs > 256 || (bs & (bs - 1))) return BAD("KV block size %u is not a power of two up to 256", bs);
    size_t tables = KILN_KSEC_HEADER_SIZE + (size_t)nm * KILN_KSEC_MODULE_SIZE + (size_t)ni * KILN_KSEC_IMAGE_SIZE;
    if (tables > size) return BAD("tables (%zu bytes) run past the section (%zu bytes)", tables, size);
    const uint8_t *data = d + tables;
    uint64_t data_size = size - tables;
    out->elem = (int)elem;
    out->block_size = (int)bs;
    out->n_modules = (int)nm;
    out->n_images = (int)ni;
    out->modules = calloc(nm, sizeof *out->modules);
    out->images = calloc(ni ? ni : 1, sizeof *out->images);
    if (!out->modules || !out->images) {
        kiln_ksec_free(out);
        return kiln_err(err, KILN_ERR_NOMEM, "kernels section: out of memory");
    }
    kiln_status st = KILN_OK;
    for (uint32_t i = 0; i < nm && st == KILN_OK; i++) {
        const uint8_t *r = d + KILN_KSEC_HEADER_SIZE + (size_t)i * KILN_KSEC_MODULE_SIZE;
        kiln_ksec_module *m = &out->modules[i];
        if (!memchr(r, 0, KILN_KSEC_NAME_MAX) || r[0] == 0) {
            st = BAD("module %u has an empty or unterminated name", i);
            break;
        }
        memcpy(m->name, r, KILN_KSEC_NAME_MAX);
        for (int c = 0; c < KILN_KSEC_CFG_N; c++) m->cfg[c] = (int32_t)kiln_rd_u32(r + 48 + 4 * c);
        uint64_t off = kiln_rd_u64(r + 80), len = kiln_rd_u64(r + 88), end;
        uint32_t shares = kiln_rd_u32(r + 96);
        if (shares != KILN_KSEC_OWN) {
            if ((st = check_shares(out, i, shares, nm, off, len, err)) != KILN_OK) break;
            const kiln_ksec_module *o = &out->modules[shares];
            m->owner = (int)shares;
            m->source = o->source;
            m->source_len = o->source_len;
        } else {
            if (!kiln_add_u64(off, len, &end) || end > data_size) {
                st = BAD("module '%s': source (%llu bytes at %llu) lies outside the data", m->name,
                         (unsigned long long)len, (unsigned long long)off);
                break; /* before the pointer is formed: data + off may lie past the buffer */
            }
            m->owner = (int)i;
            m->source = (const char *)data + off;
            m->source_len = (size_t)len;
            out->n_sources++;
        }
        for (uint32_t j = 0; j < i && st == KILN_OK; j++)
            if (strcmp(out->modules[j].name, m->name) == 0) st = BAD("module name '%s' appears twice", m->name);
    }
    for (uint32_t i = 0; i < ni && st == KILN_OK; i++) {
        const uint8_t *r = d + KILN_KSEC_HEADER_SIZE + (size_t)nm * KILN_KSEC_MODULE_SIZE + (size_t)i * KILN_KSEC_IMAGE_SIZE;
        uint32_t mod = kiln_rd_u32(r), sm = kiln_rd_u32(r + 4), kind = kiln_rd_u32(r + 8);
        uint64_t off = kiln_rd_u64(r + 16), len = kiln_rd_u64(r + 24), end;
        if (mod >= nm) { st = BAD("image %u names module %u of %u", i, mod, nm); break; }
        if (out->modules[mod].owner != (int)mod) {
            st = BAD("image %u names module '%s', which owns no images (it shares module '%s')", i,
                     out->modules[mod].name, out->modules[out->modules[mod].owner].name);
            break;
        }
        if (kind != KILN_KSEC_CUBIN && kind != KILN_KSEC_PTX) { st = BAD("image %u has unknown kind %u", i, kind); break; }
        if (sm < 50 || sm > 999) { st = BAD("image %u targets SM %u", i, sm); break; }
        if (len == 0 || !kiln_add_u64(off, len, &end) || end > data_size || off % KILN_KSEC_ALIGN) {
            st = BAD("image %u of module '%s' (%llu bytes at %llu) lies outside the data or is misaligned", i,
                     out->modules[mod].name, (unsigned long long)len, (unsigned long long)off);
            break;
        }
        if (kind == KILN_KSEC_PTX && data[end - 1] != 0) {
            st = BAD("PTX image %u of module '%s' is not NUL-terminated", i, out->modules[mod].name);
            break;
        }
        kiln_ksec_image *im = &out->images[i];
        im->module = (int)mod;
        im->sm = (int)sm;
        im->is_ptx = kind == KILN_KSEC_PTX;
        im->data = data + off;
        im->len = (size_t)len;
        out->modules[mod].n_images++;
    }
    for (uint32_t i = 0; i < nm && st == KILN_OK; i++) /* a sharing module has its owner's images */
        out->modules[i].n_images = out->modules[out->modules[i].owner].n_images;
    if (st != KILN_OK) kiln_ksec_free(out);
    return st;
}

const kiln_ksec_module *kiln_ksec_find(const kiln_ksec *k, const char *name) {
    for (int i = 0; i < k->n_modules; i++)
        if (strcmp(k->modules[i].name, name) == 0) return &k->modules[i];
    return NULL;
}
