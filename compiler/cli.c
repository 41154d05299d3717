/*
 * cli.c — error reporting and argument parsing shared by the subcommands.
 */
#include "cli.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int kiln_cli_fail(const char *cmd, const kiln_error *err, bool json) {
    const char *msg = err && err->msg[0] ? err->msg : "failed";
    fprintf(stderr, "kiln %s: error: %s\n", cmd, msg);
    if (json) {
        kiln_status code = err ? err->code : KILN_ERR_INTERNAL;
        json_t *j = json_pack("{s:{s:s, s:i, s:s}}", "error", "status", kiln_status_str(code), "code", (int)code,
                              "message", msg);
        char *s = j ? json_dumps(j, JSON_COMPACT) : NULL;
        if (s) printf("%s\n", s);
        free(s);
        json_decref(j);
    }
    return KILN_EXIT_FAIL;
}

int kiln_cli_usage_error(const char *cmd, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "kiln %s: error: ", cmd);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, "\nrun 'kiln %s --help' for usage\n", cmd);
    return KILN_EXIT_USAGE;
}

bool kiln_cli_parse_int(const char *s, long long lo, long long hi, long long *out) {
    if (!s || !*s) return false;
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || *end || v < lo || v > hi) return false;
    *out = v;
    return true;
}

bool kiln_cli_parse_float(const char *s, double lo, double hi, double *out) {
    if (!s || !*s) return false;
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || *end || !isfinite(v) || v < lo || v > hi) return false;
    *out = v;
    return true;
}

bool kiln_cli_parse_ids(const char *s, int32_t **ids, int *n) {
    *ids = NULL;
    *n = 0;
    size_t cap = 16, k = 0;
    int32_t *v = malloc(cap * sizeof *v);
    if (!v) return false;
    const char *p = s;
    while (*p == ' ' || *p == '[') p++;
    while (*p && *p != ']') {
        char *end;
        errno = 0;
        long long x = strtoll(p, &end, 10);
        if (end == p || errno || x < 0 || x > INT32_MAX) goto bad;
        if (k == cap) {
            int32_t *nv = realloc(v, (cap *= 2) * sizeof *v);
            if (!nv) goto bad;
            v = nv;
        }
        v[k++] = (int32_t)x;
        p = end;
        while (*p == ' ') p++;
        if (*p == ',') {
            p++;
            while (*p == ' ') p++;
            if (!*p || *p == ']') goto bad; /* trailing comma */
        } else if (*p && *p != ']') {
            goto bad;
        }
    }
    if (*p == ']') {
        p++;
        while (*p == ' ' || *p == '\n') p++;
        if (*p) goto bad;
    }
    if (k == 0) goto bad;
    *ids = v;
    *n = (int)k;
    return true;
bad:
    free(v);
    return false;
}

bool kiln_cli_parse_memory(const char *s, int64_t *bytes, double *fraction) {
    double v;
    char *end;
    *bytes = 0;
    *fraction = 0;
    if (!s || !*s) return false;
    v = strtod(s, &end);
    if (end == s || !isfinite(v) || v <= 0) return false;
    double mult = 1;
    if (*end) {
        if (end[1]) return false;
        switch (*end) {
        case 'K': case 'k': mult = 1024.0; break;
        case 'M': case 'm': mult = 1024.0 * 1024; break;
        case 'G': case 'g': mult = 1024.0 * 1024 * 1024; break;
        default: return false;
        }
    } else if (v <= 1) {
        *fraction = v;
        return true;
    }
    v *= mult;
    if (v > 9.0e18 || v != floor(v)) return false;
    *bytes = (int64_t)v;
    return true;
}
