/*
 * golden_io.h — reading the golden files of tests/golden/ (made by
 * tests/golden/make_goldens.py): raw little-endian f32 logits, JSON id
 * lists, and the cases of a golden.json. Header only; shared by the tests
 * that compare against HF.
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

/* One case of a golden.json: the prompt, HF's greedy continuation, and HF's logits at every position
 * (read from the case's "logits" file in the golden folder; NULL when it is missing or short). */
typedef struct golden_case {
    int32_t *prompt, *greedy;
    int np, ng;        /* their lengths */
    int positions;     /* rows of logits: np + ng */
    int vocab;
    double range;      /* max - min over the logits */
    float *logits;     /* [positions][vocab] */
} golden_case;

static inline void golden_case_read(json_t *c, const char *golden_dir, golden_case *g) {
    g->prompt = golden_json_ids(json_object_get(c, "prompt"), &g->np);
    g->greedy = golden_json_ids(json_object_get(c, "greedy"), &g->ng);
    g->positions = (int)json_integer_value(json_object_get(c, "positions"));
    g->vocab = (int)json_integer_value(json_object_get(c, "vocab"));
    g->range = json_real_value(json_object_get(c, "logit_range"));
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", golden_dir, json_string_value(json_object_get(c, "logits")));
    g->logits = golden_read_f32(path, (size_t)g->positions * (size_t)g->vocab);
}

static inline void golden_case_free(golden_case *g) {
    free(g->prompt);
    free(g->greedy);
    free(g->logits);
}

#endif /* KILN_GOLDEN_IO_H */
