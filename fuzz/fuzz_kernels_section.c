/*
 * fuzz_kernels_section.c — libFuzzer target for the kernels-section reader
 * (format/ksec.c, layout in format/kiln_ksec.h). The reader is
 * plain C and builds without CUDA (CMake's kiln_ksec), so CI fuzzes it with
 * -DKILN_CUDA=OFF. Checks: OK or an error with a message; on OK every
 * module's source and every image lies inside the input (touched at both
 * ends, so ASan sees an overread), PTX ends in its NUL, every module is
 * found by its name, a sharing module's owner is an earlier owner whose
 * source and images it has, images belong to owners, and the image and
 * source counts add up.
 * Seeds: fuzz/corpus/kernels_section/ (fuzz/data/make_ksec_seeds.py).
 *   ./fuzz_kernels_section -max_total_time=30 fuzz/corpus/kernels_section
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../format/kiln_ksec_read.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void touch(const void *p, size_t n, const uint8_t *lo, size_t size) {
    const uint8_t *b = p;
    if (n == 0) return;
    if (b < lo || b + n > lo + size) abort();
    volatile uint8_t sink = b[0] ^ b[n - 1];
    (void)sink;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    uint8_t *copy = malloc(size ? size : 1); /* exactly sized: ASan sees any overread */
    if (!copy) return 0;
    memcpy(copy, data, size);
    kiln_ksec k;
    kiln_error err = {0};
    if (kiln_ksec_parse(copy, size, &k, &err) != KILN_OK) {
        if (!err.msg[0] || k.modules || k.images) abort();
        free(copy);
        return 0;
    }
    int images = 0, sources = 0;
    for (int i = 0; i < k.n_modules; i++) {
        const kiln_ksec_module *m = &k.modules[i];
        if (!m->name[0] || kiln_ksec_find(&k, m->name) != m) abort();
        touch(m->source, m->source_len, copy, size);
        if (m->owner < 0 || m->owner > i) abort();
        const kiln_ksec_module *o = &k.modules[m->owner];
        if (o->owner != m->owner || o->source != m->source || o->source_len != m->source_len ||
            o->n_images != m->n_images)
            abort();
        if (m->owner == i) images += m->n_images, sources++;
    }
    if (images != k.n_images || sources != k.n_sources) abort();
    for (int i = 0; i < k.n_images; i++) {
        const kiln_ksec_image *im = &k.images[i];
        if (im->module < 0 || im->module >= k.n_modules || im->len == 0) abort();
        if (k.modules[im->module].owner != im->module) abort();
        touch(im->data, im->len, copy, size);
        if (im->is_ptx && ((const uint8_t *)im->data)[im->len - 1] != 0) abort();
    }
    kiln_ksec_free(&k);
    free(copy);
    return 0;
}
