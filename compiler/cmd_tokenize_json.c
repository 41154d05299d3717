/*
 * cmd_tokenize_json.c — `kiln tokenize` in the full tool: the shared command
 * (cmd_tokenize.c, in the CLI library kiln-run links too) with the front
 * end's tokenizer.json loader, so `kiln tokenize` also takes tokenizer.json
 * files and checkpoint directories.
 */
#include "cli.h"
#include "kiln_tokjson.h"

int kiln_cmd_tokenize(int argc, char **argv) {
    return kiln_cli_tokenize(argc, argv, kiln_tokenizer_load_json);
}
