/*
 * cli.h — shared pieces of the `kiln` command-line driver: error reporting
 * with exit codes, number parsing, and JSON output.
 *
 * Exit codes (documented in docs/cli.md):
 *   0  success
 *   1  the command failed (bad input file, unsupported model, runtime error)
 *   2  usage error (unknown option, missing or malformed argument)
 */
#ifndef KILN_CLI_H
#define KILN_CLI_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "../common/kiln_util.h"
#include "../format/kiln_engine.h"

enum { KILN_EXIT_OK = 0, KILN_EXIT_FAIL = 1, KILN_EXIT_USAGE = 2 };

/* Print "kiln CMD: error: MSG" (and the hint lines) to stderr; with json, also
 * print {"error": {...}} on stdout. Returns KILN_EXIT_FAIL. */
int kiln_cli_fail(const char *cmd, const kiln_error *err, bool json);
/* Print "kiln CMD: error: MSG" and a pointer to --help. Returns KILN_EXIT_USAGE. */
int kiln_cli_usage_error(const char *cmd, const char *fmt, ...) KILN_PRINTF(2, 3);

/* Strict number parsing: the whole string must be a number in range. */
bool kiln_cli_parse_int(const char *s, long long lo, long long hi, long long *out);
bool kiln_cli_parse_float(const char *s, double lo, double hi, double *out);
/* A memory amount: "4G", "512M", "1048576" → *bytes (K/M/G are powers of
 * 1024); a number in (0, 1] → *fraction (of free GPU memory). The other is 0. */
bool kiln_cli_parse_memory(const char *s, int64_t *bytes, double *fraction);
/* "1,306,461" or "[1, 306, 461]" → ids (malloc'd). */
bool kiln_cli_parse_ids(const char *s, int32_t **ids, int *n);
/* An ids file's text: ids separated by whitespace or commas ("1 306 461", one per line...): *ids
 * malloc'd (also when *n is 0); a word that is not an id in 0..INT32_MAX is KILN_ERR_PARSE naming
 * `label`, its byte offset and the word. */
kiln_status kiln_cli_parse_ids_text(const char *s, size_t len, const char *label, int32_t **ids, size_t *n,
                                    kiln_error *err);

/* --gpus LIST and --tp-timeout SECONDS, which every command that makes a context takes (run, bench,
 * perplexity, serve; kiln_ctx_options.gpus and .tp_timeout_s): checked here with the runtime's own
 * parser (kiln_gpus_parse), so that a bad value is a usage error before the engine is read; the
 * count against the engine's ranks is kiln_ctx_new's check. Each returns KILN_EXIT_OK, or
 * KILN_EXIT_USAGE after reporting "kiln CMD: error: --gpus ..." naming the item at fault. */
int kiln_cli_gpus_arg(const char *cmd, const char *s);
int kiln_cli_tp_timeout_arg(const char *cmd, const char *s, double *seconds);
/* Their --help lines, to follow an option column `width` characters wide (option and padding). */
void kiln_cli_gpus_help(FILE *f, int width);

/* `kiln compile --tune` (compiler/cmd_tune.c). kiln_cli_tune_probe: whether GPU 0 can be opened to tune
 * on (before a compile spends its time); KILN_ERR_DEVICE / KILN_ERR_UNSUPPORTED (no CUDA in this kiln)
 * with the reason. kiln_cli_tune_engine: tune the engine at path as `kiln tune PATH` does (its default
 * batches and prefill sizes, GPU 0) and record it in place; the report as a JSON object into *json_out
 * when json_out is given, else printed as text. On failure the engine is unchanged. */
struct json_t;
kiln_status kiln_cli_tune_probe(kiln_error *err);
kiln_status kiln_cli_tune_engine(const char *path, struct json_t **json_out, kiln_error *err);

/* What `kiln inspect` found in the kernels section (present = false: none). */
typedef struct kiln_inspect_kernels {
    bool present;
    int n_modules, n_sources, n_images, block_size, elem; /* n_sources: distinct (modules owning theirs);
                                                           * elem: KILN_KSEC_ELEM_* */
} kiln_inspect_kernels;
struct kiln_model;
/* inspect's cross-checks of an opened engine (compiler/cmd_inspect.c): the
 * kernels section parsed, and meta against the plan, the weights, the
 * tokenizer and the kernels section. A mismatch is KILN_ERR_FORMAT naming
 * both values. *kernels is filled when the kernels section was read. */
kiln_status kiln_inspect_verify(const struct kiln_model *m, kiln_inspect_kernels *kernels, kiln_error *err);

/* `tokenize` as kiln and kiln-run share it (cmd_tokenize.c): engines are read
 * here; any other TOKENIZER (a tokenizer.json, a checkpoint directory) goes to
 * `load_json`, the front end's loader, which only the full kiln links
 * (kiln_cmd_tokenize passes kiln_tokenizer_load_json); kiln-run passes NULL
 * and refuses such paths with a hint. This keeps the front end out of the
 * CLI library that kiln-run links. */
struct kiln_tokenizer;
typedef kiln_status (*kiln_cli_tokjson_loader)(const char *path, struct kiln_tokenizer **out, kiln_error *err);
int kiln_cli_tokenize(int argc, char **argv, kiln_cli_tokjson_loader load_json);

/* A command-line tool made of subcommands: `kiln` (compiler/main.c) and
 * `kiln-run` (compiler/run_main.c) are each one table of these. */
typedef struct kiln_cli_command {
    const char *name;
    int (*run)(int argc, char **argv); /* argv[0] is the command's name; returns the exit code */
    const char *help;                  /* one line for the usage text */
} kiln_cli_command;

typedef struct kiln_cli_tool {
    const char *prog;                  /* "kiln", "kiln-run" */
    const char *usage;                 /* the text after "usage: " and before the command list */
    const char *help_note;             /* the line after the list ("'kiln <command> --help' describes...") */
    const kiln_cli_command *commands;
    size_t n_commands;
    const char *missing, *missing_hint; /* a command of the full kiln this tool lacks (NULL = none), and why */
} kiln_cli_tool;

/* main() of a tool: --help, --version (kiln_cli_print_version), a command, or
 * a usage error naming what is wrong. Returns the exit code. */
int kiln_cli_main(const kiln_cli_tool *t, int argc, char **argv);
/* The running tool's name ("kiln" or "kiln-run", set by kiln_cli_main): command usage texts start
 * "usage: <prog> <command>". */
extern const char *kiln_cli_prog;
/* "PROG VERSION (engine format M.N, kernels section version K, commit C)": the
 * formats this build reads and writes, from the headers that define them. */
void kiln_cli_print_version(const char *prog);

int kiln_cmd_compile(int argc, char **argv);
int kiln_cmd_inspect(int argc, char **argv);
int kiln_cmd_run(int argc, char **argv);
int kiln_cmd_tokenize(int argc, char **argv);
int kiln_cmd_bench(int argc, char **argv);
int kiln_cmd_package(int argc, char **argv);
int kiln_cmd_serve(int argc, char **argv); /* cmd_serve.c: the OpenAI-compatible HTTP server */
int kiln_cmd_perplexity(int argc, char **argv); /* cmd_perplexity.c */
int kiln_cmd_tune(int argc, char **argv);       /* cmd_tune.c: per-GPU tuning records */
/* Package (codegen/kiln_package.h) and report as `kiln CMD` does; the exit code.
 * Shared by `kiln package` and `kiln compile --standalone`. */
struct kiln_package_options;
int kiln_cli_package_run(const struct kiln_package_options *o, bool json, const char *cmd);

/* run, bench and inspect with an engine that is not named on the command
 * line (no ENGINE argument): the one built into a packaged executable
 * (compiler/standalone.c). NULL = the plain commands above. */
int kiln_cmd_run_builtin(int argc, char **argv, const kiln_engine_src *builtin);
int kiln_cmd_bench_builtin(int argc, char **argv, const kiln_engine_src *builtin);
int kiln_cmd_inspect_builtin(int argc, char **argv, const kiln_engine_src *builtin);

#endif /* KILN_CLI_H */
