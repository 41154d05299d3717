/*
 * cli.c — error reporting and argument parsing shared by the subcommands,
 * and the one main() of the tools made of them (kiln, kiln-run).
 */
#include "cli.h"

#include <ctype.h>
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../format/kiln_ksec.h"
#include "../format/kiln_engine.h"
#include "../runtime/kiln_rt.h"

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

int kiln_cli_gpus_arg(const char *cmd, const char *s) {
    kiln_gpu_list g;
    kiln_error err = {0};
    if (kiln_gpus_parse(s, &g, &err) != KILN_OK) return kiln_cli_usage_error(cmd, "--gpus %s", err.msg);
    return KILN_EXIT_OK;
}

int kiln_cli_tp_timeout_arg(const char *cmd, const char *s, double *seconds) {
    if (!kiln_cli_parse_float(s, 0, KILN_TP_TIMEOUT_MAX_S, seconds))
        return kiln_cli_usage_error(cmd, "--tp-timeout '%s' is not a number of seconds in 0..%d (0 = 60)", s,
                                    KILN_TP_TIMEOUT_MAX_S);
    return KILN_EXIT_OK;
}

void kiln_cli_gpus_help(FILE *f, int width) {
    static const char *const lines[][2] = {
        {"--gpus LIST", "CUDA devices, one per tensor-parallel rank in rank order, e.g. 0,1"},
        {"", "(default: rank r on GPU r); a plain engine takes one, the GPU to"},
        {"", "run on; 0,0 puts both ranks on GPU 0"},
        {"--tp-timeout S", "seconds a tensor-parallel step may take on the GPUs before every"},
        {"", "rank's collectives are aborted (default 60)"},
    };
    for (size_t i = 0; i < sizeof lines / sizeof lines[0]; i++)
        fprintf(f, "  %-*s%s\n", width - 2, lines[i][0], lines[i][1]);
}

static void tool_usage(const kiln_cli_tool *t, FILE *f) {
    fprintf(f, "usage: %s\ncommands:\n", t->usage);
    for (size_t i = 0; i < t->n_commands; i++) fprintf(f, "  %-10s  %s\n", t->commands[i].name, t->commands[i].help);
    fprintf(f, "\n%s\nExit codes: 0 success, 1 failure, 2 usage error.\n", t->help_note);
}

void kiln_cli_print_version(const char *prog) {
    printf("%s %s (engine format %d.%d, kernels section version %d", prog, KILN_VERSION, KILN_ENGINE_MAJOR,
           KILN_ENGINE_MINOR, KILN_KSEC_VERSION);
    printf(", commit %s)\n", kiln_build_commit());
}

const char *kiln_cli_prog = "kiln";

int kiln_cli_main(const kiln_cli_tool *t, int argc, char **argv) {
    kiln_cli_prog = t->prog;
    /* an input file rewritten in place under any command is an error naming it, not a crash (common/guard.c);
     * `kiln compile` and `kiln package` add the rest of the guard */
    kiln_error gerr = {0};
    if (kiln_guard_install_bus(&gerr) != KILN_OK) fprintf(stderr, "%s: warning: %s\n", t->prog, gerr.msg);
    if (argc < 2) {
        fprintf(stderr, "%s: error: no command given\n\n", t->prog);
        tool_usage(t, stderr);
        return KILN_EXIT_USAGE;
    }
    if (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "help") == 0) {
        tool_usage(t, stdout);
        return KILN_EXIT_OK;
    }
    if (strcmp(argv[1], "--version") == 0) {
        kiln_cli_print_version(t->prog);
        return KILN_EXIT_OK;
    }
    for (size_t i = 0; i < t->n_commands; i++)
        if (strcmp(argv[1], t->commands[i].name) == 0) return t->commands[i].run(argc - 1, argv + 1);
    if (t->missing && strcmp(argv[1], t->missing) == 0) {
        fprintf(stderr, "%s: error: '%s' is not in %s\nhint: %s\n", t->prog, t->missing, t->prog, t->missing_hint);
        return KILN_EXIT_USAGE;
    }
    fprintf(stderr, "%s: error: unknown command '%s'\n\n", t->prog, argv[1]);
    tool_usage(t, stderr);
    return KILN_EXIT_USAGE;
}

kiln_status kiln_cli_parse_ids_text(const char *s, size_t len, const char *label, int32_t **ids, size_t *n,
                                    kiln_error *err) {
    size_t cap = len / 2 + 1, k = 0;
    int32_t *v = malloc(cap * sizeof *v);
    if (!v) return kiln_err(err, KILN_ERR_NOMEM, "%s: out of memory", label);
    for (size_t i = 0; i < len;) {
        if (isspace((unsigned char)s[i]) || s[i] == ',') {
            i++;
            continue;
        }
        size_t j = i;
        long long x = 0;
        while (j < len && isdigit((unsigned char)s[j]) && x <= INT32_MAX) x = x * 10 + (s[j++] - '0');
        if (j == i || x > INT32_MAX || (j < len && !isspace((unsigned char)s[j]) && s[j] != ',')) {
            size_t e = i; /* the word at fault, up to the next separator */
            while (e < len && e - i < 24 && !isspace((unsigned char)s[e]) && s[e] != ',') e++;
            free(v);
            return kiln_err(err, KILN_ERR_PARSE, "%s: byte %zu: '%.*s' is not a token id (a non-negative integer)",
                            label, i, (int)(e - i), s + i);
        }
        v[k++] = (int32_t)x;
        i = j;
    }
    *ids = v;
    *n = k;
    return KILN_OK;
}
