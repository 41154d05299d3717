/*
 * main.c — the `kiln` command-line driver: dispatches to a subcommand.
 * Each subcommand lives in cmd_<name>.c and returns the process exit code
 * (cli.h); only this function exits. kiln-run (run_main.c) is the same
 * dispatcher (kiln_cli_main) over the runtime's commands alone.
 */
#include "cli.h"

static const kiln_cli_command commands[] = {
    {"compile", kiln_cmd_compile, "compile a HuggingFace checkpoint directory into an engine file"},
    {"inspect", kiln_cmd_inspect, "show what an engine file holds"},
    {"run", kiln_cmd_run, "generate tokens from an engine"},
    {"bench", kiln_cmd_bench, "measure load, prefill, time to first token and decode speed"},
    {"tokenize", kiln_cmd_tokenize, "text on stdin → token ids (or --decode ids → text)"},
    {"package", kiln_cmd_package, "write one executable with an engine built in (run/bench/inspect)"},
    {"serve", kiln_cmd_serve, "serve the engine over HTTP with OpenAI's API (docs/serving.md)"},
    {"perplexity", kiln_cmd_perplexity, "how well the engine predicts a text (perplexity, bits per token)"},
    {"tune", kiln_cmd_tune, "measure this GPU's GEMM algorithms and record them in the engine (GPU)"},
};

static const kiln_cli_tool kiln_tool = {
    .prog = "kiln",
    .usage = "kiln <command> [options]\n\n"
             "kiln is an ahead-of-time compiler for transformer language models.\n",
    .help_note = "'kiln <command> --help' describes a command. 'kiln --version' prints the version.",
    .commands = commands,
    .n_commands = sizeof commands / sizeof commands[0],
};

int main(int argc, char **argv) { return kiln_cli_main(&kiln_tool, argc, argv); }
