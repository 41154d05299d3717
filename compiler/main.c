/*
 * main.c — the `kiln` command-line driver: dispatches to a subcommand.
 * Each subcommand lives in cmd_<name>.c and returns the process exit code
 * (cli.h); only this function exits.
 */
#include <stdio.h>
#include <string.h>

#include "../runtime/cuda/kiln_ksec.h"
#include "../runtime/kiln_engine.h"
#include "cli.h"

static const struct {
    const char *name;
    int (*run)(int argc, char **argv);
    const char *help;
} commands[] = {
    {"compile", kiln_cmd_compile, "compile a HuggingFace checkpoint directory into an engine file"},
    {"inspect", kiln_cmd_inspect, "show what an engine file holds"},
    {"run", kiln_cmd_run, "generate tokens from an engine"},
    {"bench", kiln_cmd_bench, "measure load, prefill, time to first token and decode speed"},
    {"tokenize", kiln_cmd_tokenize, "text on stdin → token ids (or --decode ids → text)"},
};

static void usage(FILE *f) {
    fprintf(f, "usage: kiln <command> [options]\n\n"
               "kiln is an ahead-of-time compiler for transformer language models.\n\ncommands:\n");
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        fprintf(f, "  %-9s %s\n", commands[i].name, commands[i].help);
    fprintf(f, "\n'kiln <command> --help' describes a command. 'kiln --version' prints the version.\n"
               "Exit codes: 0 success, 1 failure, 2 usage error.\n");
}

/* The version, the formats this build writes and reads (from the headers that
 * define them), and the commit it was built from when CMake knew it. */
static void print_version(void) {
    printf("kiln %s (engine format %d.%d, kernels section version %d", KILN_VERSION, KILN_ENGINE_MAJOR,
           KILN_ENGINE_MINOR, KILN_KSEC_VERSION);
#ifdef KILN_COMMIT
    printf(", commit %s", KILN_COMMIT);
#endif
    printf(")\n");
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "kiln: error: no command given\n\n");
        usage(stderr);
        return KILN_EXIT_USAGE;
    }
    if (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "help") == 0) {
        usage(stdout);
        return KILN_EXIT_OK;
    }
    if (strcmp(argv[1], "--version") == 0) {
        print_version();
        return KILN_EXIT_OK;
    }
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        if (strcmp(argv[1], commands[i].name) == 0) return commands[i].run(argc - 1, argv + 1);
    fprintf(stderr, "kiln: error: unknown command '%s'\n\n", argv[1]);
    usage(stderr);
    return KILN_EXIT_USAGE;
}
