/*
 * golden_io.h — reading the golden files of tests/golden/ (made by
 * tests/golden/make_goldens.py): raw little-endian f32 logits and JSON id
 * lists. Header only; shared by the tests that compare against HF.
 */
#ifndef KILN_GOLDEN_IO_H
#define KILN_GOLDEN_IO_H

#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

/* The first `count` floats of a file (malloc'd), or NULL when it has fewer. */
static inline float *golden_read_f32(const char *path, size_t count) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    float *v = malloc(count * sizeof *v);
    size_t got = v ? fread(v, sizeof *v, count, f) : 0;
    fclose(f);
    if (got != count) {
        free(v);
        return NULL;
    }
    return v;
}

/* A JSON array of integers as int32 ids (malloc'd; *n = its length). */
static inline int32_t *golden_json_ids(json_t *a, int *n) {
    *n = (int)json_array_size(a);
    int32_t *v = malloc((size_t)(*n ? *n : 1) * sizeof *v);
    if (!v) {
        *n = 0;
        return NULL;
    }
    for (int i = 0; i < *n; i++) v[i] = (int32_t)json_integer_value(json_array_get(a, (size_t)i));
    return v;
}

#endif /* KILN_GOLDEN_IO_H */
