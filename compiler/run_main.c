/*
 * run_main.c — `kiln-run`, the runtime-only command-line tool for production
 * hosts: run, bench, inspect and tokenize on an engine file, the same
 * commands (the CLI library, compiler/cli.h) as the full `kiln`, without
 * the compiler. It links no NVRTC, LLVM or front end (compiler/ beyond the
 * CLI library, passes/, codegen/, ir/): it needs the NVIDIA driver (dlopen),
 * cuBLASLt (dlopen, for GPU contexts) and small C libraries only
 * (tests/linkage.sh checks). `tokenize` reads an engine's tokenizer; a
 * tokenizer.json needs the front end, so `kiln tokenize` on the build machine.
 */
#include <stdio.h>
#include <string.h>

#include "../runtime/cuda/kiln_ksec.h"
#include "../runtime/kiln_engine.h"
#include "cli.h"

/* tokenize without the front end: engines only (kiln_cli_tokenize refuses the rest with a hint). */
static int cmd_tokenize_engine(int argc, char **argv) {
    for (int i = 1; i < argc; i++)
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0)
            puts("kiln-run tokenize: TOKENIZER must be an engine file (a tokenizer.json or a checkpoint needs "
                 "`kiln tokenize`)");
    return kiln_cli_tokenize(argc, argv, NULL);
}

static const struct {
    const char *name;
    int (*run)(int argc, char **argv);
    const char *help;
} commands[] = {
    {"run", kiln_cmd_run, "generate tokens from an engine"},
    {"bench", kiln_cmd_bench, "measure load, prefill, time to first token and decode speed"},
    {"inspect", kiln_cmd_inspect, "show what an engine file holds"},
    {"tokenize", cmd_tokenize_engine, "text on stdin → token ids with an engine's tokenizer (or --decode)"},
};

static void usage(FILE *f) {
    fprintf(f, "usage: kiln-run <command> ENGINE [options]\n\n"
               "kiln-run runs engines made by `kiln compile`: the runtime alone, for production hosts\n"
               "(needs the NVIDIA driver and libcublasLt for GPUs; no CUDA toolkit, no compiler).\n\ncommands:\n");
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        fprintf(f, "  %-9s %s\n", commands[i].name, commands[i].help);
    fprintf(f, "\n'kiln-run <command> --help' describes a command (its text says `kiln <command>`: the\n"
               "options are the same). 'kiln-run --version' prints the version.\n"
               "Exit codes: 0 success, 1 failure, 2 usage error.\n");
}

int main(int argc, char **argv) {
    if (argc < 2) {
        usage(stderr);
        return KILN_EXIT_USAGE;
    }
    if (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "help") == 0) {
        usage(stdout);
        return KILN_EXIT_OK;
    }
    if (strcmp(argv[1], "--version") == 0) {
        /* as `kiln --version`: the formats this build reads, and its commit */
        printf("kiln-run %s (engine format %d.%d, kernels section version %d", KILN_VERSION, KILN_ENGINE_MAJOR,
               KILN_ENGINE_MINOR, KILN_KSEC_VERSION);
#ifdef KILN_COMMIT
        printf(", commit %s", KILN_COMMIT);
#endif
        printf(")\n");
        return KILN_EXIT_OK;
    }
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        if (strcmp(argv[1], commands[i].name) == 0) return commands[i].run(argc - 1, argv + 1);
    if (strcmp(argv[1], "compile") == 0) {
        fprintf(stderr, "kiln-run: 'compile' is not in kiln-run (the runtime alone)\n"
                        "hint: compile engines with `kiln compile` on a build machine, then copy the engine here\n");
        return KILN_EXIT_USAGE;
    }
    fprintf(stderr, "kiln-run: error: unknown command '%s'\n\n", argv[1]);
    usage(stderr);
    return KILN_EXIT_USAGE;
}
