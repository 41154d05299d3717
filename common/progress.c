/*
 * progress.c — the progress line of kiln_progress.h. The line is erased and
 * redrawn with "\r" + ESC[K, so a shorter line leaves no tail behind; it is
 * only ever written when `out` was given (a terminal), so piped stderr and
 * --json stdout never see it.
 */
#include "kiln_progress.h"

#include "kiln_util.h"

#define PROGRESS_PERIOD 0.1 /* seconds between redraws: at most ten a second */

void kiln_progress_init(kiln_progress *p, FILE *out, const char *label) {
    *p = (kiln_progress){.out = out, .label = label ? label : "kiln"};
}

static void draw(kiln_progress *p, double now) {
    double secs = now - p->t_phase;
    fprintf(p->out, "\r\033[K%s: %s", p->label, p->phase);
    if (p->unit && p->total) {
        double done = (double)p->done * p->scale, total = (double)p->total * p->scale;
        const char *fmt = p->scale < 1 ? "  %.1f/%.1f %s  %3.0f%%" : "  %.0f/%.0f %s  %3.0f%%";
        fprintf(p->out, fmt, done, total, p->unit, 100.0 * (double)p->done / (double)p->total);
        if (secs > 0.2) fprintf(p->out, "  %.1f %s/s", done / secs, p->unit);
    } else if (secs >= 1) {
        fprintf(p->out, "  %.0f s", secs);
    }
    fflush(p->out);
    p->t_drawn = now;
    p->shown = true;
}

void kiln_progress_phase(kiln_progress *p, const char *phase, uint64_t total, const char *unit, double scale) {
    if (!p || !p->out) return;
    p->phase = phase;
    p->total = total;
    p->done = 0;
    p->unit = unit;
    p->scale = scale > 0 ? scale : 1;
    p->t_phase = kiln_now();
    draw(p, p->t_phase);
}

void kiln_progress_update(kiln_progress *p, uint64_t done) {
    if (!p || !p->out || !p->phase) return;
    bool completes = p->total && done >= p->total && p->done < p->total; /* drawn once, whatever the clock */
    p->done = done > p->total && p->total ? p->total : done;
    double now = kiln_now();
    if (completes || now - p->t_drawn >= PROGRESS_PERIOD) draw(p, now);
}

void kiln_progress_clear(kiln_progress *p) {
    if (!p || !p->out || !p->shown) return;
    fputs("\r\033[K", p->out);
    fflush(p->out);
    p->shown = false;
}
