/*
 * fuzz_cli_values.c — libFuzzer target for the command line's value parsers
 * (compiler/cli.c): kiln_cli_parse_ids, _memory, _int, _float and _ids_text. Besides
 * "no crash, no leak", it checks their promises:
 *   ids     on success 1+ ids in 0..INT32_MAX; printing them back as
 *           "a,b,c" and as "[a, b, c]" parses to the same ids; on failure
 *           nothing is returned
 *   memory  never both bytes and a fraction; on success exactly one, bytes
 *           > 0 or a fraction in (0, 1]; on failure both 0
 *   int     the value lies in [lo, hi]; printed back it parses to itself
 *   float   finite and in [lo, hi]
 *   ids text (kiln_cli_parse_ids_text, `kiln perplexity --ids-file`) on success ids in
 *           0..INT32_MAX that print back, space-separated, to the same ids; on failure a message
 *   gpus    (kiln_gpus_parse, runtime/gpus.c: --gpus and kiln_ctx_options.gpus) on success 0..64
 *           ordinals in 0..1023, none for "" only, printed back "a,b,c" parse to the same; on
 *           failure KILN_ERR_INVALID_ARG, a message and an empty list
 * Input: byte 0 picks the parser (and, for int/float, bytes 1..2 the range);
 * the rest is the argument text, cut at its first NUL like a real argv.
 *   ./fuzz_cli_values -max_total_time=30 fuzz/corpus/cli_values
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../compiler/cli.h"
#include "../runtime/kiln_rt.h"

static void check_gpus(const char *s) {
    kiln_gpu_list g, again;
    kiln_error err = {0};
    kiln_status st = kiln_gpus_parse(s, &g, &err);
    if (st != KILN_OK) {
        if (st != KILN_ERR_INVALID_ARG || !err.msg[0] || g.n != 0) abort();
        return;
    }
    if (g.n < 0 || g.n > KILN_MAX_RANKS || (g.n == 0) != (*s == 0)) abort();
    char back[KILN_MAX_RANKS * 5 + 1];
    size_t used = 0;
    back[0] = 0;
    for (int i = 0; i < g.n; i++) {
        if (g.ordinal[i] < 0 || g.ordinal[i] > KILN_GPU_ORDINAL_MAX) abort();
        used += (size_t)snprintf(back + used, sizeof back - used, i ? ",%d" : "%d", g.ordinal[i]);
    }
    if (kiln_gpus_parse(back, &again, &err) != KILN_OK || again.n != g.n ||
        memcmp(again.ordinal, g.ordinal, (size_t)g.n * sizeof *g.ordinal) != 0)
        abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check_ids(const char *s) {
    int32_t *ids = (int32_t *)1, *again = NULL;
    int n = -1, n2 = 0;
    if (!kiln_cli_parse_ids(s, &ids, &n)) {
        if (ids || n) abort();
        return;
    }
    if (n < 1 || !ids) abort();
    for (int form = 0; form < 2; form++) {
        kiln_buf b = {0};
        kiln_buf_printf(&b, form ? "[" : "");
        for (int i = 0; i < n; i++) {
            if (ids[i] < 0) abort();
            kiln_buf_printf(&b, i ? (form ? ", %d" : ",%d") : "%d", ids[i]);
        }
        kiln_buf_printf(&b, form ? "]" : "");
        if (b.failed) abort();
        if (!kiln_cli_parse_ids((const char *)b.data, &again, &n2) || n2 != n ||
            memcmp(again, ids, (size_t)n * sizeof *ids) != 0)
            abort();
        free(again);
        kiln_buf_free(&b);
    }
    free(ids);
}

static void check_ids_text(const char *s) {
    int32_t *ids = NULL, *again = NULL;
    size_t n = 0, n2 = 0;
    kiln_error err = {0};
    if (kiln_cli_parse_ids_text(s, strlen(s), "in", &ids, &n, &err) != KILN_OK) {
        if (ids || !err.msg[0]) abort();
        return;
    }
    kiln_buf b = {0};
    for (size_t i = 0; i < n; i++) {
        if (ids[i] < 0) abort();
        kiln_buf_printf(&b, i ? " %d" : "%d", ids[i]);
    }
    kiln_buf_printf(&b, "%s", "");
    if (b.failed || kiln_cli_parse_ids_text(b.data ? (const char *)b.data : "", b.len, "back", &again, &n2, &err) ||
        n2 != n || (n && memcmp(again, ids, n * sizeof *ids) != 0))
        abort();
    free(again);
    free(ids);
    kiln_buf_free(&b);
}

static void check_memory(const char *s) {
    int64_t bytes = -1;
    double fraction = -1;
    bool ok = kiln_cli_parse_memory(s, &bytes, &fraction);
    if (bytes && fraction) abort(); /* never both */
    if (!ok && (bytes || fraction)) abort();
    if (ok && !(bytes > 0 || (fraction > 0 && fraction <= 1))) abort();
}

static void check_int(const char *s, uint8_t a, uint8_t b) {
    static const long long edges[] = {INT64_MIN, -1000000, -1, 0, 1, 7, 256, 1 << 24, INT32_MAX, INT64_MAX};
    long long lo = edges[a % 10], hi = edges[b % 10], v = 12345, w;
    if (!kiln_cli_parse_int(s, lo, hi, &v)) return;
    if (v < lo || v > hi) abort();
    char back[32];
    snprintf(back, sizeof back, "%lld", v);
    if (!kiln_cli_parse_int(back, lo, hi, &w) || w != v) abort();
}

static void check_float(const char *s, uint8_t a, uint8_t b) {
    static const double edges[] = {-1e300, -1, 0, 1e-9, 0.5, 1, 2, 1e6, 1e300, INFINITY};
    double lo = edges[a % 10], hi = edges[b % 10], v;
    if (!kiln_cli_parse_float(s, lo, hi, &v)) return;
    if (!isfinite(v) || v < lo || v > hi) abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 3) return 0;
    char *s = malloc(size - 2);
    if (!s) return 0;
    memcpy(s, data + 3, size - 3);
    s[size - 3] = 0;
    switch (data[0] % 6) {
    case 0: check_ids(s); break;
    case 1: check_memory(s); break;
    case 2: check_int(s, data[1], data[2]); break;
    case 3: check_float(s, data[1], data[2]); break;
    case 4: check_ids_text(s); break;
    default: check_gpus(s); break;
    }
    free(s);
    return 0;
}
