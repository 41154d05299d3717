/*
 * kt_fixture.h — what several test programs set up the same way: a private
 * temporary folder, and engines compiled from checkpoints. Header-only, like
 * kt.h: each test file is its own program.
 */
#ifndef KT_FIXTURE_H
#define KT_FIXTURE_H

#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>

#include "compiler/kiln_compiler.h"

/* dir = $TMPDIR (or /tmp)/kiln-TAG-XXXXXX, created; false if it could not be. */
static inline bool kt_tmpdir(char *dir, size_t n, const char *tag) {
    const char *t = getenv("TMPDIR");
    snprintf(dir, (size_t)n, "%s/kiln-%s-XXXXXX", t ? t : "/tmp", tag);
    return mkdtemp(dir) != NULL;
}

/* kiln_compile of the checkpoint folder ckpt with opt; a failure is reported on stderr. */
static inline kiln_status kt_compile(const char *ckpt, const kiln_compile_options *opt) {
    kiln_error err = {0};
    kiln_status st = kiln_compile(ckpt, opt, &err);
    if (st != KILN_OK) fprintf(stderr, "  compile %s: %s\n", ckpt, err.msg);
    return st;
}

/* ||a - b|| / ||b|| over n values (||a - b|| when b is all zeros); a NaN in a gives +inf. */
static inline double kt_rel_l2(const float *a, const float *b, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        if (isnan(a[i])) return INFINITY;
        const double d = (double)a[i] - b[i];
        num += d * d;
        den += (double)b[i] * b[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

/* The default pipeline without w8a8: fp8 matrices multiply the activations as they are at every step, the
 * weight-only numerics the HF goldens hold (with w8a8, steps past 32 rows round the activations to E4M3:
 * test_golden's test_w8a8_cpu). */
#define PASSES_NO_W8A8                                                                                                 \
    "fuse-add-rmsnorm,fuse-qkv-rope,fuse-gate-up-swiglu,fuse-linear-residual,pack-weights,decode-attention-rope,"     \
    "dce,fold-norm-into-ck-gemv"

#endif
