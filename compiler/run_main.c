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

#include "cli.h"

/* tokenize without the front end: engines only (kiln_cli_tokenize refuses the rest with a hint). */
static int cmd_tokenize_engine(int argc, char **argv) {
    for (int i = 1; i < argc; i++)
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0)
            puts("kiln-run tokenize: TOKENIZER must be an engine file (a tokenizer.json or a checkpoint needs "
                 "`kiln tokenize`)");
    return kiln_cli_tokenize(argc, argv, NULL);
}

static const kiln_cli_command commands[] = {
    {"run", kiln_cmd_run, "generate tokens from an engine"},
    {"bench", kiln_cmd_bench, "measure load, prefill, time to first token and decode speed"},
    {"inspect", kiln_cmd_inspect, "show what an engine file holds"},
    {"tokenize", cmd_tokenize_engine, "text on stdin → token ids with an engine's tokenizer (or --decode)"},
    {"serve", kiln_cmd_serve, "serve the engine over HTTP with OpenAI's API (docs/serving.md)"},
    {"perplexity", kiln_cmd_perplexity, "how well the engine predicts a text (perplexity, bits per token)"},
    {"tune", kiln_cmd_tune, "measure this GPU's GEMM algorithms and record them in the engine (GPU)"},
};

static const kiln_cli_tool kiln_run_tool = {
    .prog = "kiln-run",
    .usage = "kiln-run <command> ENGINE [options]\n\n"
             "kiln-run runs engines made by `kiln compile`: the runtime alone, for production hosts\n"
             "(needs the NVIDIA driver and libcublasLt for GPUs; no CUDA toolkit, no compiler).\n",
    .help_note = "'kiln-run <command> --help' describes a command (the options are those of `kiln\n"
                 "<command>`). 'kiln-run --version' prints the version.",
    .commands = commands,
    .n_commands = sizeof commands / sizeof commands[0],
    .missing = "compile",
    .missing_hint = "compile engines with `kiln compile` on a build machine, then copy the engine here (kiln-run "
                    "is the runtime alone)",
};

int main(int argc, char **argv) { return kiln_cli_main(&kiln_run_tool, argc, argv); }
