/*
 * tuning.c — the tuning section's reader and writer (format/kiln_tuning.h
 * is the layout; docs/engine-format.md "The tuning section").
 *
 * The reader treats the bytes as hostile: the counts are capped before
 * anything is allocated, the records must fill the section exactly, every
 * value is range-checked and every message names the record (its index and
 * sm) and the entry at fault. The writer runs the same checks on what it is
 * given, so it never writes a section the reader would refuse.
 */
#include "../format/kiln_tuning.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static float rd_f32(const uint8_t *p) {
    uint32_t u = kiln_rd_u32(p);
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static void wr_f32(uint8_t *p, float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    kiln_wr_u32(p, u);
}

void kiln_tuning_free(kiln_tuning *t) {
    if (!t) return;
    for (uint32_t i = 0; i < t->n_records && i < KILN_TUNING_MAX_RECORDS; i++) free(t->records[i].gemms);
    memset(t, 0, sizeof *t);
}

/* The rules every record obeys, for the reader and the writer (index i, for messages). */
static kiln_status check_record(const kiln_tuning_record *r, uint32_t i, const char *label, kiln_error *err) {
    if (r->sm < 50 || r->sm > 999)
        return kiln_err(err, KILN_ERR_FORMAT, "%s: tuning record %u: sm %u is outside 50..999", label, i, r->sm);
    size_t dl = strnlen(r->device, KILN_TUNING_DEVICE_MAX);
    if (dl == 0 || dl == KILN_TUNING_DEVICE_MAX)
        return kiln_err(err, KILN_ERR_FORMAT, "%s: tuning record %u (sm_%u): the device name is %s", label, i, r->sm,
                        dl ? "not NUL-terminated" : "empty");
    if (r->n_gemms > KILN_TUNING_MAX_GEMMS)
        return kiln_err(err, KILN_ERR_FORMAT, "%s: tuning record %u (sm_%u): %u GEMM entries (at most %d)", label, i,
                        r->sm, r->n_gemms, KILN_TUNING_MAX_GEMMS);
    if (r->gemv_max_m > 64 || r->qgemv_max_m > 64)
        return kiln_err(err, KILN_ERR_FORMAT,
                        "%s: tuning record %u (sm_%u): gemv_max_m %u / qgemv_max_m %u outside 0..64", label, i, r->sm,
                        r->gemv_max_m, r->qgemv_max_m);
    if (r->rope_split_max_t > 65536)
        return kiln_err(err, KILN_ERR_FORMAT, "%s: tuning record %u (sm_%u): rope_split_max_t %u outside 0..65536",
                        label, i, r->sm, r->rope_split_max_t);
    if (r->decode_tc_min > 65536)
        return kiln_err(err, KILN_ERR_FORMAT, "%s: tuning record %u (sm_%u): decode_tc_min %u outside 0..65536",
                        label, i, r->sm, r->decode_tc_min);
    if (!(r->attn_waves >= 0 && r->attn_waves <= 64)) /* also refuses NaN */
        return kiln_err(err, KILN_ERR_FORMAT, "%s: tuning record %u (sm_%u): attn_waves %g outside [0, 64]", label, i,
                        r->sm, (double)r->attn_waves);
    if (!(r->seconds >= 0 && isfinite(r->seconds)))
        return kiln_err(err, KILN_ERR_FORMAT, "%s: tuning record %u (sm_%u): seconds %g is not a time", label, i,
                        r->sm, (double)r->seconds);
    for (uint32_t j = 0; j < r->n_gemms; j++) {
        const kiln_tuning_gemm *g = &r->gemms[j];
        if (g->m < 1 || g->m > (1u << 20) || g->n < 1 || g->n > (1u << 24) || g->k < 1 || g->k > (1u << 24))
            return kiln_err(err, KILN_ERR_FORMAT,
                            "%s: tuning record %u (sm_%u), GEMM %u: shape M=%u N=%u K=%u is outside 1..2^20 x "
                            "1..2^24 x 1..2^24",
                            label, i, r->sm, j, g->m, g->n, g->k);
        if (g->flags & ~(uint32_t)KILN_TUNING_FLAGS_ALL_)
            return kiln_err(err, KILN_ERR_FORMAT, "%s: tuning record %u (sm_%u), GEMM %u: unknown flags 0x%x", label, i,
                            r->sm, j, g->flags);
        /* W8A8 multiplies E4M3 codes: not with fp32 inputs; 128-column scales only with it, fast
         * accumulation only with it and a scale a row */
        if (((g->flags & KILN_TUNING_FP8) && (g->flags & KILN_TUNING_IN_F32)) ||
            ((g->flags & KILN_TUNING_FP8_B128) && !(g->flags & KILN_TUNING_FP8)) ||
            ((g->flags & KILN_TUNING_FP8_FAST) && (g->flags & KILN_TUNING_FP8_B128 || !(g->flags & KILN_TUNING_FP8))))
            return kiln_err(err, KILN_ERR_FORMAT, "%s: tuning record %u (sm_%u), GEMM %u: flags 0x%x do not go "
                            "together", label, i, r->sm, j, g->flags);
        if (!(g->us > 0 && isfinite(g->us)) || !(isfinite(g->heuristic_us) && (g->heuristic_us > 0 || g->heuristic_us == -1)))
            return kiln_err(err, KILN_ERR_FORMAT,
                            "%s: tuning record %u (sm_%u), GEMM %u: times %g us / heuristic %g us (need > 0; the "
                            "heuristic's may be -1)",
                            label, i, r->sm, j, (double)g->us, (double)g->heuristic_us);
        if (g->candidates < 1 || g->candidates > 1024 || g->pick >= g->candidates)
            return kiln_err(err, KILN_ERR_FORMAT,
                            "%s: tuning record %u (sm_%u), GEMM %u: pick %u of %u candidates", label, i, r->sm, j,
                            g->pick, g->candidates);
        for (uint32_t k = 0; k < j; k++) {
            const kiln_tuning_gemm *h = &r->gemms[k];
            if (h->m == g->m && h->n == g->n && h->k == g->k && h->flags == g->flags)
                return kiln_err(err, KILN_ERR_FORMAT,
                                "%s: tuning record %u (sm_%u): GEMMs %u and %u are both M=%u N=%u K=%u flags %u", label,
                                i, r->sm, k, j, g->m, g->n, g->k, g->flags);
        }
    }
    return KILN_OK;
}

/* Two records for one GPU (same sm and device name) are refused. */
static kiln_status check_unique(const kiln_tuning *t, const char *label, kiln_error *err) {
    for (uint32_t i = 0; i < t->n_records; i++)
        for (uint32_t j = 0; j < i; j++)
            if (t->records[i].sm == t->records[j].sm && !strcmp(t->records[i].device, t->records[j].device))
                return kiln_err(err, KILN_ERR_FORMAT, "%s: tuning records %u and %u are both for sm_%u \"%s\"", label,
                                j, i, t->records[i].sm, t->records[i].device);
    return KILN_OK;
}

kiln_status kiln_tuning_parse(const uint8_t *d, size_t size, const char *label, kiln_tuning *out, kiln_error *err) {
    memset(out, 0, sizeof *out);
    if (!label) label = "tuning section";
    if (size < KILN_TUNING_HEADER_SIZE)
        return kiln_err(err, KILN_ERR_FORMAT, "%s: tuning section of %zu bytes is shorter than its %d-byte header",
                        label, size, KILN_TUNING_HEADER_SIZE);
    if (memcmp(d, KILN_TUNING_MAGIC, 4) != 0)
        return kiln_err(err, KILN_ERR_FORMAT, "%s: the tuning section does not start with \"KTUN\"", label);
    uint32_t version = kiln_rd_u32(d + 4), n = kiln_rd_u32(d + 8);
    if (version != KILN_TUNING_VERSION) {
        kiln_err(err, KILN_ERR_VERSION, "%s: tuning section version %u, this runtime reads version %d", label,
                 version, KILN_TUNING_VERSION);
        return kiln_err_hint(err, "run `kiln tune` again with this kiln to replace the record");
    }
    if (n > KILN_TUNING_MAX_RECORDS)
        return kiln_err(err, KILN_ERR_FORMAT, "%s: %u tuning records (at most %d)", label, n, KILN_TUNING_MAX_RECORDS);
    size_t off = KILN_TUNING_HEADER_SIZE;
    kiln_status st = KILN_OK;
    for (uint32_t i = 0; i < n; i++) {
        if (size - off < KILN_TUNING_RECORD_SIZE) {
            st = kiln_err(err, KILN_ERR_FORMAT, "%s: tuning record %u at byte %zu runs past the section's %zu bytes",
                          label, i, off, size);
            goto fail;
        }
        const uint8_t *p = d + off;
        kiln_tuning_record *r = &out->records[i];
        out->n_records = i + 1; /* so that a failure frees what was allocated */
        r->sm = kiln_rd_u32(p);
        r->driver_version = (int32_t)kiln_rd_u32(p + 4);
        r->lt_version = kiln_rd_u64(p + 8);
        memcpy(r->device, p + 16, KILN_TUNING_DEVICE_MAX);
        r->n_gemms = kiln_rd_u32(p + 144);
        r->gemv_max_m = kiln_rd_u32(p + 148);
        r->qgemv_max_m = kiln_rd_u32(p + 152);
        r->rope_split_max_t = kiln_rd_u32(p + 156);
        r->attn_waves = rd_f32(p + 160);
        r->seconds = rd_f32(p + 164);
        r->decode_tc_min = kiln_rd_u32(p + 168);
        off += KILN_TUNING_RECORD_SIZE;
        const uint32_t ng = r->n_gemms;
        if (ng > KILN_TUNING_MAX_GEMMS || (size - off) / KILN_TUNING_GEMM_SIZE < ng) {
            st = kiln_err(err, KILN_ERR_FORMAT,
                          "%s: tuning record %u (sm_%u): %u GEMM entries of %d bytes do not fit the %zu bytes left "
                          "(at most %d entries)",
                          label, i, r->sm, ng, KILN_TUNING_GEMM_SIZE, size - off, KILN_TUNING_MAX_GEMMS);
            r->n_gemms = 0;
            goto fail;
        }
        r->gemms = ng ? calloc(ng, sizeof *r->gemms) : NULL;
        if (ng && !r->gemms) {
            r->n_gemms = 0;
            st = kiln_err(err, KILN_ERR_NOMEM, "%s: out of memory for %u tuning entries", label, ng);
            goto fail;
        }
        for (uint32_t j = 0; j < ng; j++, off += KILN_TUNING_GEMM_SIZE) {
            const uint8_t *q = d + off;
            kiln_tuning_gemm *g = &r->gemms[j];
            g->m = kiln_rd_u32(q), g->n = kiln_rd_u32(q + 4), g->k = kiln_rd_u32(q + 8), g->flags = kiln_rd_u32(q + 12);
            g->us = rd_f32(q + 16), g->heuristic_us = rd_f32(q + 20);
            g->candidates = kiln_rd_u32(q + 24), g->pick = kiln_rd_u32(q + 28);
            memcpy(g->algo, q + 64, KILN_TUNING_ALGO_SIZE);
        }
        if ((st = check_record(r, i, label, err))) goto fail;
    }
    if (off != size) {
        st = kiln_err(err, KILN_ERR_FORMAT, "%s: %zu bytes after the last of %u tuning records", label, size - off, n);
        goto fail;
    }
    if ((st = check_unique(out, label, err))) goto fail;
    return KILN_OK;
fail:
    kiln_tuning_free(out);
    return st;
}

kiln_status kiln_tuning_load(const kiln_engine *e, kiln_tuning *out, bool *present, kiln_error *err) {
    memset(out, 0, sizeof *out);
    *present = false;
    const kiln_engine_section *s = kiln_engine_find(e, KILN_SECTION_TUNING);
    if (!s) return KILN_OK;
    const uint8_t *d;
    size_t n;
    bool owned;
    kiln_status st = kiln_engine_section_bytes(e, s, 1, &d, &n, &owned, err);
    if (st) return st;
    char label[300];
    snprintf(label, sizeof label, "%.256s", e->map.path ? e->map.path : "engine");
    st = kiln_tuning_parse(d, n, label, out, err);
    if (owned) free((void *)d);
    *present = st == KILN_OK;
    return st;
}

kiln_status kiln_tuning_write(const kiln_tuning *t, kiln_buf *out, kiln_error *err) {
    memset(out, 0, sizeof *out);
    if (t->n_records > KILN_TUNING_MAX_RECORDS)
        return kiln_err(err, KILN_ERR_INVALID_ARG, "tuning: %u records (at most %d)", t->n_records,
                        KILN_TUNING_MAX_RECORDS);
    kiln_status st;
    for (uint32_t i = 0; i < t->n_records; i++)
        if ((st = check_record(&t->records[i], i, "tuning (writing)", err))) return st;
    if ((st = check_unique(t, "tuning (writing)", err))) return st;
    uint8_t h[KILN_TUNING_HEADER_SIZE] = {0};
    memcpy(h, KILN_TUNING_MAGIC, 4);
    kiln_wr_u32(h + 4, KILN_TUNING_VERSION);
    kiln_wr_u32(h + 8, t->n_records);
    kiln_buf_append(out, h, sizeof h);
    for (uint32_t i = 0; i < t->n_records; i++) {
        const kiln_tuning_record *r = &t->records[i];
        uint8_t p[KILN_TUNING_RECORD_SIZE] = {0};
        kiln_wr_u32(p, r->sm);
        kiln_wr_u32(p + 4, (uint32_t)r->driver_version);
        kiln_wr_u64(p + 8, r->lt_version);
        memcpy(p + 16, r->device, strnlen(r->device, KILN_TUNING_DEVICE_MAX)); /* zero-padded */
        kiln_wr_u32(p + 144, r->n_gemms);
        kiln_wr_u32(p + 148, r->gemv_max_m);
        kiln_wr_u32(p + 152, r->qgemv_max_m);
        kiln_wr_u32(p + 156, r->rope_split_max_t);
        wr_f32(p + 160, r->attn_waves);
        wr_f32(p + 164, r->seconds);
        kiln_wr_u32(p + 168, r->decode_tc_min);
        kiln_buf_append(out, p, sizeof p);
        for (uint32_t j = 0; j < r->n_gemms; j++) {
            const kiln_tuning_gemm *g = &r->gemms[j];
            uint8_t q[KILN_TUNING_GEMM_SIZE] = {0};
            kiln_wr_u32(q, g->m), kiln_wr_u32(q + 4, g->n), kiln_wr_u32(q + 8, g->k), kiln_wr_u32(q + 12, g->flags);
            wr_f32(q + 16, g->us), wr_f32(q + 20, g->heuristic_us);
            kiln_wr_u32(q + 24, g->candidates), kiln_wr_u32(q + 28, g->pick);
            memcpy(q + 64, g->algo, KILN_TUNING_ALGO_SIZE);
            kiln_buf_append(out, q, sizeof q);
        }
    }
    if (out->failed) {
        kiln_buf_free(out);
        return kiln_err(err, KILN_ERR_NOMEM, "tuning: out of memory writing the section");
    }
    return KILN_OK;
}

kiln_status kiln_tuning_put(kiln_tuning *t, kiln_tuning_record *r, kiln_error *err) {
    uint32_t i = 0;
    while (i < t->n_records && !(t->records[i].sm == r->sm && !strcmp(t->records[i].device, r->device))) i++;
    if (i == KILN_TUNING_MAX_RECORDS)
        return kiln_err(err, KILN_ERR_INVALID_ARG, "tuning: the section already holds %d records (one per GPU type)",
                        KILN_TUNING_MAX_RECORDS);
    if (i < t->n_records) free(t->records[i].gemms);
    else t->n_records++;
    t->records[i] = *r;
    r->gemms = NULL;
    r->n_gemms = 0;
    return KILN_OK;
}

const kiln_tuning_record *kiln_tuning_pick(const kiln_tuning *t, int sm, const char *device) {
    const kiln_tuning_record *same_sm = NULL;
    for (uint32_t i = 0; i < t->n_records; i++) {
        const kiln_tuning_record *r = &t->records[i];
        if ((int)r->sm != sm) continue;
        if (device && !strcmp(r->device, device)) return r;
        if (!same_sm) same_sm = r;
    }
    return same_sm;
}

const kiln_tuning_gemm *kiln_tuning_find(const kiln_tuning_record *r, int M, int n, int k, uint32_t flags) {
    if (!r || M < 1) return NULL;
    uint32_t up = 1;
    while (up < (uint32_t)M && up < (1u << 20)) up *= 2;
    const kiln_tuning_gemm *bucket = NULL;
    for (uint32_t j = 0; j < r->n_gemms; j++) {
        const kiln_tuning_gemm *g = &r->gemms[j];
        if ((int)g->n != n || (int)g->k != k || g->flags != flags) continue;
        if ((int)g->m == M) return g;
        if (g->m == up) bucket = g;
    }
    return bucket;
}
