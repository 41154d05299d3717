/*
 * quant_choose.c — --quant auto's solver: which format each projection
 * matrix gets under a byte budget, minimising the summed measured damage
 * (kiln_passes.h states the problem).
 *
 * Exact dynamic programming over the budget in units of `unit` bytes:
 * best[b] is the least damage of the items so far within b units, and
 * from[i][b] the option item i takes there; the answer is read back from
 * the last item at the whole budget. Bytes are rounded up to units, so the
 * chosen mix never exceeds the budget in real bytes; the loss is at most
 * one unit per item. --quant auto passes the weights' 256-byte alignment,
 * which every option's bytes are a multiple of, so the answer is exact until
 * the table's cap grows the unit (a 7B model's 4 GB budget: 32 KB units,
 * at most 7 MB left unused).
 * Ties go to the option listed first among those of least damage, then to
 * fewer bytes, so the result does not depend on anything but the input.
 */
#include "kiln_passes.h"

#include <float.h>
#include <stdlib.h>
#include <string.h>

enum { MAX_CELLS = 64 << 20 }; /* from[] entries: n_items x (budget units + 1) */

kiln_status kiln_quant_choose(const kiln_quant_item *items, int n_items, uint64_t budget, uint64_t unit, int *pick,
                              uint64_t *min_bytes, kiln_error *err) {
    uint64_t least = 0;
    int *smallest = malloc((size_t)(n_items > 0 ? n_items : 1) * sizeof *smallest);
    if (!smallest) return kiln_err(err, KILN_ERR_NOMEM, "quant auto: out of memory");
    for (int i = 0; i < n_items; i++) {
        if (items[i].n < 1 || items[i].n > KILN_QUANT_OPTIONS) {
            free(smallest);
            return kiln_err(err, KILN_ERR_INVALID_ARG, "quant auto: item %d has %d options", i, items[i].n);
        }
        smallest[i] = 0;
        for (int j = 1; j < items[i].n; j++)
            if (items[i].bytes[j] < items[i].bytes[smallest[i]]) smallest[i] = j;
        least += items[i].bytes[smallest[i]];
    }
    *min_bytes = least;
    if (least > budget) {
        free(smallest);
        return kiln_err(err, KILN_ERR_INVALID_ARG, "the smallest formats take %llu bytes, over the budget of %llu",
                        (unsigned long long)least, (unsigned long long)budget);
    }
    if (unit < 1) unit = 1;
    while (n_items > 0 && (budget / unit + 1) * (uint64_t)n_items > MAX_CELLS) unit *= 2;
    const size_t B = (size_t)(budget / unit);
    double *best = malloc((B + 1) * sizeof *best), *next = malloc((B + 1) * sizeof *next);
    uint8_t *from = malloc((size_t)(n_items > 0 ? n_items : 1) * (B + 1));
    if (!best || !next || !from) {
        free(best), free(next), free(from), free(smallest);
        return kiln_err(err, KILN_ERR_NOMEM, "quant auto: out of memory for a %zu-unit table", B + 1);
    }
    for (size_t b = 0; b <= B; b++) best[b] = 0;
    for (int i = 0; i < n_items; i++) {
        const kiln_quant_item *it = &items[i];
        uint8_t *fr = from + (size_t)i * (B + 1);
        for (size_t b = 0; b <= B; b++) {
            double d = DBL_MAX;
            int arg = -1;
            for (int j = 0; j < it->n; j++) {
                const uint64_t u = (it->bytes[j] + unit - 1) / unit;
                if (u > b || best[b - u] == DBL_MAX) continue;
                const double v = best[b - u] + it->damage[j];
                if (v < d || (v == d && arg >= 0 && it->bytes[j] < it->bytes[arg])) d = v, arg = j;
            }
            next[b] = d;
            fr[b] = (uint8_t)(arg < 0 ? 0 : arg);
        }
        double *t = best;
        best = next, next = t;
    }
    if (n_items > 0 && best[B] == DBL_MAX) { /* fits in bytes, not in rounded units: the smallest */
        memcpy(pick, smallest, (size_t)n_items * sizeof *pick);
    } else {
        size_t b = B;
        for (int i = n_items - 1; i >= 0; i--) {
            const int j = from[(size_t)i * (B + 1) + b];
            pick[i] = j;
            b -= (size_t)((items[i].bytes[j] + unit - 1) / unit);
        }
    }
    free(best), free(next), free(from), free(smallest);
    return KILN_OK;
}
