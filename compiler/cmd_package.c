/*
 * cmd_package.c — `kiln package ENGINE.kiln -o NAME`: one executable with the
 * engine built in (codegen/package.c does the work; docs/cli.md).
 */
#include <getopt.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../codegen/kiln_package.h"
#include "cli.h"

static void help(FILE *f) {
    fprintf(f,
            "usage: kiln package ENGINE.kiln -o NAME [options]\n\n"
            "Write one executable with the engine built in: `NAME run|bench|inspect [options]` behave as\n"
            "`kiln run|bench|inspect ENGINE.kiln [options]`. It needs only the runtime's shared libraries\n"
            "(and the NVIDIA driver for the GPU), not LLVM, the toolchain or the engine file. Packaging\n"
            "needs this kiln built with LLVM and a C toolchain (cc, or $CC) on this machine.\n\n"
            "options:\n"
            "  -o, --output NAME     executable to write (required); written atomically\n"
            "  --payload MODE        where the engine goes: auto (default: embedded up to --embed-limit,\n"
            "                        else appended), embedded (a read-only section, in memory at start),\n"
            "                        appended (after the executable, mmapped at start)\n"
            "  --embed-limit SIZE    largest engine auto embeds: bytes, or with K, M, G (default 256M,\n"
            "                        at most 1G)\n"
            "  --cc DRIVER           C compiler driver that links (default: $CC, else cc)\n"
            "  --template            write a template instead (no ENGINE): an executable for an appended\n"
            "                        engine not chosen yet\n"
            "  --from-template T     attach ENGINE (appended) to a copy of the template T: needs neither\n"
            "                        LLVM nor a C toolchain\n"
            "  --verbose             print the link command\n"
            "  --json                print a JSON summary on stdout\n"
            "  -h, --help            this help\n");
}

int kiln_cmd_package(int argc, char **argv) {
    enum { O_PAYLOAD = 256, O_LIMIT, O_CC, O_VERBOSE, O_JSON, O_TEMPLATE, O_FROM };
    static const struct option longopts[] = {
        {"output", required_argument, 0, 'o'},        {"payload", required_argument, 0, O_PAYLOAD},
        {"embed-limit", required_argument, 0, O_LIMIT}, {"cc", required_argument, 0, O_CC},
        {"verbose", no_argument, 0, O_VERBOSE},       {"json", no_argument, 0, O_JSON},
        {"template", no_argument, 0, O_TEMPLATE},     {"from-template", required_argument, 0, O_FROM},
        {"help", no_argument, 0, 'h'},                {0, 0, 0, 0}};
    kiln_package_options o = {.payload = KILN_PACKAGE_AUTO};
    bool json = false;
    int c;
    optind = 1;
    opterr = 0;
    while ((c = getopt_long(argc, argv, "o:h", longopts, NULL)) != -1) {
        switch (c) {
        case 'o': o.output_path = optarg; break;
        case O_PAYLOAD:
            if (strcmp(optarg, "auto") == 0) o.payload = KILN_PACKAGE_AUTO;
            else if (strcmp(optarg, "embedded") == 0) o.payload = KILN_PACKAGE_EMBEDDED;
            else if (strcmp(optarg, "appended") == 0) o.payload = KILN_PACKAGE_APPENDED;
            else return kiln_cli_usage_error("package", "unknown --payload '%s' (auto, embedded, appended)", optarg);
            break;
        case O_LIMIT: {
            int64_t bytes;
            double frac;
            if (!kiln_cli_parse_memory(optarg, &bytes, &frac) || frac > 0 || bytes < 1 ||
                (uint64_t)bytes > KILN_PACKAGE_EMBED_MAX)
                return kiln_cli_usage_error("package", "--embed-limit '%s' is not a size from 2 bytes to 1G", optarg);
            o.embed_limit = (uint64_t)bytes;
            break;
        }
        case O_CC: o.cc = optarg; break;
        case O_VERBOSE: o.verbose = true; break;
        case O_TEMPLATE: o.template_only = true; break;
        case O_FROM: o.from_template = optarg; break;
        case O_JSON: json = true; break;
        case 'h': help(stdout); return KILN_EXIT_OK;
        default: return kiln_cli_usage_error("package", "unknown or incomplete option '%s'", argv[optind - 1]);
        }
    }
    if (o.template_only && o.from_template)
        return kiln_cli_usage_error("package", "give only one of --template and --from-template");
    if (o.template_only && optind != argc)
        return kiln_cli_usage_error("package", "--template takes no engine file");
    if (!o.template_only && optind != argc - 1)
        return kiln_cli_usage_error("package", optind >= argc ? "missing the engine file" : "expected one engine file");
    if (o.from_template && o.payload == KILN_PACKAGE_EMBEDDED)
        return kiln_cli_usage_error("package", "--from-template attaches an appended engine, not an embedded one");
    if (!o.output_path) return kiln_cli_usage_error("package", "missing -o NAME");
    o.engine_path = o.template_only ? NULL : argv[optind];
    /* a signal must not leave the half-written executable behind (common/guard.c) */
    kiln_error err = {0};
    if (kiln_guard_install(&err) != KILN_OK) return kiln_cli_fail("package", &err, json);
    return kiln_cli_package_run(&o, json, "package");
}

int kiln_cli_package_run(const kiln_package_options *o, bool json, const char *cmd) {
    kiln_error err = {0};
    kiln_package_result r;
    double t0 = kiln_now();
    if (kiln_package(o, &r, &err) != KILN_OK) return kiln_cli_fail(cmd, &err, json);
    double dt = kiln_now() - t0;
    const char *payload = o->template_only ? "template" : r.payload == KILN_PACKAGE_EMBEDDED ? "embedded" : "appended";
    if (json) {
        json_t *j = json_pack("{s:s?, s:s, s:s, s:I, s:I, s:s, s:f}", "engine", o->engine_path, "output",
                              o->output_path, "payload", payload, "engine_bytes", (json_int_t)r.engine_bytes,
                              "bytes", (json_int_t)r.output_bytes, "llvm", kiln_package_llvm_version(), "seconds",
                              dt);
        char *s = json_dumps(j, JSON_COMPACT);
        printf("%s\n", s);
        free(s);
        json_decref(j);
    } else {
        fprintf(stderr, "kiln %s: wrote %s (%.1f MB, engine %s) in %.2f s\n", cmd, o->output_path,
                (double)r.output_bytes / 1e6, payload, dt);
    }
    return KILN_EXIT_OK;
}
