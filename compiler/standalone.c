/*
 * standalone.c — the command line of a packaged executable (`kiln package`).
 *
 *   NAME run [options]      = kiln run ENGINE [options]
 *   NAME bench [options]    = kiln bench ENGINE [options]
 *   NAME inspect [options]  = kiln inspect ENGINE [options]
 *   NAME --version          the build's identity
 *
 * The generated main() calls kiln_standalone_main with the executable's
 * description (format/kiln_standalone.h); the engine is located only for
 * the three commands, so --help and --version work on a damaged copy.
 */
#include <stdio.h>
#include <string.h>

#include "../format/kiln_standalone.h"
#include "cli.h"

static const struct {
    const char *name;
    int (*run)(int argc, char **argv, const kiln_engine_src *builtin);
    const char *help;
} commands[] = {
    {"run", kiln_cmd_run_builtin, "generate tokens (the options of `kiln run`)"},
    {"bench", kiln_cmd_bench_builtin, "measure load, prefill and decode speed (the options of `kiln bench`)"},
    {"inspect", kiln_cmd_inspect_builtin, "verify the built-in engine and show what it holds"},
};

static const char *payload_name(uint32_t p) {
    return p == KILN_PAYLOAD_EMBEDDED ? "embedded" : p == KILN_PAYLOAD_APPENDED ? "appended" : "unknown";
}

static void usage(FILE *f, const char *self, const kiln_standalone_desc *d) {
    fprintf(f, "usage: %s <command> [options]\n\n"
               "A kiln engine packaged as one executable (kiln %s). The commands take the options of\n"
               "`kiln <command> ENGINE`, without the ENGINE argument.\n\ncommands:\n",
            self, d->kiln_version);
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        fprintf(f, "  %-9s %s\n", commands[i].name, commands[i].help);
    fprintf(f, "\n'%s <command> --help' describes a command. '%s --version' prints the build's identity.\n"
               "Exit codes: 0 success, 1 failure, 2 usage error.\n",
            self, self);
}

int kiln_standalone_main(int argc, char **argv, const kiln_standalone_desc *d) {
    const char *self = argc > 0 && argv[0] ? argv[0] : "kiln-standalone";
    if (argc < 2) {
        usage(stderr, self, d);
        return KILN_EXIT_USAGE;
    }
    if (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "help") == 0) {
        usage(stdout, self, d);
        return KILN_EXIT_OK;
    }
    if (strcmp(argv[1], "--version") == 0 && d->engine_size == 0 && d->engine_checksum == KILN_STANDALONE_TEMPLATE) {
        printf("%s: kiln executable template by kiln %s (commit %s): takes the engine appended to it, %s\n", self,
               d->kiln_version, d->commit && d->commit[0] ? d->commit : "unknown",
               kiln_payload_trailer_read("/proc/self/exe", self, &(kiln_payload_trailer){0}, &(kiln_error){0}) == KILN_OK
                   ? "appended"
                   : "none yet");
        return KILN_EXIT_OK;
    }
    if (strcmp(argv[1], "--version") == 0) {
        printf("%s: kiln engine packaged by kiln %s (commit %s), engine %llu bytes, checksum %016llx, %s\n", self,
               d->kiln_version, d->commit && d->commit[0] ? d->commit : "unknown",
               (unsigned long long)d->engine_size, (unsigned long long)d->engine_checksum, payload_name(d->payload));
        return KILN_EXIT_OK;
    }
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++) {
        if (strcmp(argv[1], commands[i].name) != 0) continue;
        kiln_engine_src src;
        kiln_error err = {0};
        if (kiln_standalone_engine(d, NULL, self, &src, &err) != KILN_OK) {
            bool json = false;
            for (int a = 2; a < argc; a++) json = json || strcmp(argv[a], "--json") == 0;
            return kiln_cli_fail(commands[i].name, &err, json);
        }
        return commands[i].run(argc - 1, argv + 1, &src);
    }
    fprintf(stderr, "%s: unknown command '%s'\n\n", self, argv[1]);
    usage(stderr, self, d);
    return KILN_EXIT_USAGE;
}
