/*
 * kiln_progress.h — one progress line on a terminal for long work: the
 * phase, a count against its total, the percentage and the rate, redrawn in
 * place (\r) at most ten times a second.
 *
 *   kiln compile: weights  412.3/1460.2 MB  28%  310.4 MB/s
 *
 * The caller owns the struct and passes it down (compile options, kernel
 * options, the engine writer); there is no global state. A progress whose
 * `out` is NULL is silent, so callers never test for a terminal themselves:
 * the command that creates it decides (stderr is a TTY). Not thread-safe:
 * callers updating from several threads hold their own lock.
 */
#ifndef KILN_PROGRESS_H
#define KILN_PROGRESS_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

typedef struct kiln_progress {
    FILE *out;            /* where the line goes; NULL = silent */
    const char *label;    /* "kiln compile" */
    const char *phase;    /* "weights", "kernels"...; NULL before the first phase */
    const char *unit;     /* "MB", "NVRTC builds"; NULL = a phase without a count */
    double scale;         /* units per counted item (1e-6 for bytes shown as MB) */
    uint64_t done, total; /* counted items */
    double t_phase;       /* when the phase began (kiln_now) */
    double t_drawn;       /* when the line was last drawn */
    bool shown;           /* a line is on screen */
} kiln_progress;

/* Start silent, or drawing to `out` when it is non-NULL (a terminal). */
void kiln_progress_init(kiln_progress *p, FILE *out, const char *label);
/* A new phase of `total` items shown in `unit` (x scale); total 0 = no count. Drawn at once. */
void kiln_progress_phase(kiln_progress *p, const char *phase, uint64_t total, const char *unit, double scale);
/* `done` items of the phase so far; redrawn when 100 ms passed or the phase is complete. */
void kiln_progress_update(kiln_progress *p, uint64_t done);
/* Erase the line (before the command prints its result or error). */
void kiln_progress_clear(kiln_progress *p);

#endif /* KILN_PROGRESS_H */
