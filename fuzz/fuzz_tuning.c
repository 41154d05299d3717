/*
 * fuzz_tuning.c — libFuzzer target for the tuning-section reader
 * (runtime/tuning.c, layout in format/kiln_tuning.h). Checks: OK or an
 * error with a message and nothing left allocated; on OK the records obey
 * the reader's rules (caps, ranges), the writer accepts them and its bytes
 * parse back to the same records, and pick/find over them stay inside them.
 * Seeds: fuzz/corpus/tuning/ (fuzz/data/make_tuning_seeds.py).
 *   ./fuzz_tuning -max_total_time=30 fuzz/corpus/tuning
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../format/kiln_tuning.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static bool same_record(const kiln_tuning_record *a, const kiln_tuning_record *b) {
    if (a->sm != b->sm || a->driver_version != b->driver_version || a->lt_version != b->lt_version ||
        strcmp(a->device, b->device) || a->n_gemms != b->n_gemms || a->gemv_max_m != b->gemv_max_m ||
        a->qgemv_max_m != b->qgemv_max_m || a->rope_split_max_t != b->rope_split_max_t ||
        memcmp(&a->attn_waves, &b->attn_waves, 4) || memcmp(&a->seconds, &b->seconds, 4))
        return false;
    for (uint32_t j = 0; j < a->n_gemms; j++) {
        const kiln_tuning_gemm *g = &a->gemms[j], *h = &b->gemms[j];
        if (g->m != h->m || g->n != h->n || g->k != h->k || g->flags != h->flags || memcmp(&g->us, &h->us, 4) ||
            memcmp(&g->heuristic_us, &h->heuristic_us, 4) || g->candidates != h->candidates || g->pick != h->pick ||
            memcmp(g->algo, h->algo, KILN_TUNING_ALGO_SIZE))
            return false;
    }
    return true;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    uint8_t *copy = malloc(size ? size : 1); /* exactly sized: ASan sees any overread */
    if (!copy) return 0;
    memcpy(copy, data, size);
    kiln_tuning t;
    kiln_error err = {0};
    if (kiln_tuning_parse(copy, size, "fuzz", &t, &err) != KILN_OK) {
        if (!err.msg[0] || t.n_records) abort();
        free(copy);
        return 0;
    }
    if (t.n_records > KILN_TUNING_MAX_RECORDS) abort();
    for (uint32_t i = 0; i < t.n_records; i++) {
        const kiln_tuning_record *r = &t.records[i];
        if (r->n_gemms > KILN_TUNING_MAX_GEMMS || r->sm < 50 || r->sm > 999 || !r->device[0] ||
            strnlen(r->device, KILN_TUNING_DEVICE_MAX) == KILN_TUNING_DEVICE_MAX || !(r->attn_waves >= 0))
            abort();
        if (kiln_tuning_pick(&t, (int)r->sm, r->device) != r) abort(); /* one record per (sm, device) */
        for (uint32_t j = 0; j < r->n_gemms; j++) {
            const kiln_tuning_gemm *g = &r->gemms[j];
            const kiln_tuning_gemm *f = kiln_tuning_find(r, (int)g->m, (int)g->n, (int)g->k, g->flags);
            if (f != g || !(g->us > 0) || g->pick >= g->candidates) abort();
        }
    }
    kiln_buf out;
    if (kiln_tuning_write(&t, &out, &err) != KILN_OK) abort(); /* what reads, writes */
    kiln_tuning u;
    if (kiln_tuning_parse(out.data, out.len, "rewritten", &u, &err) != KILN_OK || u.n_records != t.n_records) abort();
    for (uint32_t i = 0; i < t.n_records; i++)
        if (!same_record(&t.records[i], &u.records[i])) abort();
    kiln_tuning_free(&u);
    kiln_buf_free(&out);
    kiln_tuning_free(&t);
    free(copy);
    return 0;
}
