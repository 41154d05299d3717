/*
 * cmd_tokenize.c — `kiln tokenize TOKENIZER`: UTF-8 text on stdin → a JSON
 * array of ids on stdout; with --decode, a JSON array of ids → text. This is
 * how parity with HF is scripted from the shell.
 *
 * TOKENIZER is a tokenizer.json, a checkpoint directory holding one (its
 * tokenizer_config.json is used when present), or an engine file (its
 * tokenizer section). Encoding adds the special tokens the tokenizer's config
 * asks for (HF add_special_tokens=True), as `kiln run --prompt` does;
 * --no-bos leaves them out. Exit status: 0 on success, 1 on an error (message on
 * stderr naming the file and what is wrong), 2 on a usage error.
 */
#include <errno.h>
#include <getopt.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/stat.h>

#include "../format/kiln_engine.h"
#include "cli.h"
#include "kiln_tokjson.h"

#define TOKENIZE_MAX_INPUT (1ull << 31) /* 2 GiB of stdin */

static const char kUsage[] =
    "usage: kiln tokenize TOKENIZER [--bos | --no-bos] [--no-special] [--decode] [--skip-special] [--json]\n"
    "\n"
    "Encode UTF-8 text read from stdin into token ids (a JSON array on stdout),\n"
    "or with --decode, read a JSON array of ids and print the text.\n"
    "\n"
    "TOKENIZER       a tokenizer.json file, a checkpoint directory holding one,\n"
    "                or an engine file made by `kiln compile`\n"
    "--bos           add the special tokens the tokenizer's config asks for (its\n"
    "                add_bos_token / add_eos_token, else the template), as HF\n"
    "                add_special_tokens=True and `kiln run --prompt` do (default;\n"
    "                --special is the same)\n"
    "--no-bos        add none (HF add_special_tokens=False; `kiln run --no-bos`)\n"
    "--no-special    read special-token strings in the text (\"<s>\", \"<|im_start|>\")\n"
    "                as plain text (HF encode_special_tokens=True)\n"
    "--decode        ids in, text out\n"
    "--skip-special  with --decode: leave special tokens out of the text\n"
    "--json          encode: {\"ids\": [...], \"tokens\": [...]}; decode: {\"text\": \"...\"}\n"
    "--help          this text\n";

/* What the command line asked for. */
typedef struct tok_args {
    const char *path;
    int bos;  /* 1 = --bos/--special, 0 = --no-bos, -1 = not given (the default: add) */
    bool no_special, decode, skip_special, json;
} tok_args;

/* All of stdin, NUL-terminated (malloc'd), or NULL with the reason in *err. */
static char *read_stdin(size_t *len, kiln_error *err) {
    struct stat sb;
    if (fstat(0, &sb) == 0 && S_ISDIR(sb.st_mode)) {
        kiln_err(err, KILN_ERR_IO, "stdin: cannot read: it is a directory");
        return NULL;
    }
    kiln_buf b = {0};
    for (;;) {
        if (!kiln_buf_reserve(&b, 1 << 16)) break;
        size_t n = fread(b.data + b.len, 1, 1 << 16, stdin);
        b.len += n;
        if (n == 0 || b.len > TOKENIZE_MAX_INPUT) break;
    }
    int e = ferror(stdin) ? errno : 0;
    if (e || b.failed || b.len > TOKENIZE_MAX_INPUT || !kiln_buf_append(&b, "", 1)) {
        if (e) kiln_err(err, KILN_ERR_IO, "stdin: cannot read: %s", strerror(e));
        else if (b.len > TOKENIZE_MAX_INPUT) kiln_err(err, KILN_ERR_INVALID_ARG, "stdin: more than 2 GiB");
        else kiln_err(err, KILN_ERR_NOMEM, "stdin: out of memory");
        kiln_buf_free(&b);
        return NULL;
    }
    *len = b.len - 1;
    return (char *)b.data;
}

/* An engine file starts with "KILNENG\0". Anything else, including what is
 * not a regular file (a FIFO is never opened), goes to the tokenizer.json
 * loader, whose error says what is wrong with it. */
static bool is_engine(const char *path) {
    int fd;
    if (kiln_file_open_regular(path, &fd, NULL, NULL) != KILN_OK) return false;
    char magic[8] = {0};
    ssize_t n = read(fd, magic, 8);
    close(fd);
    return n == 8 && memcmp(magic, KILN_ENGINE_MAGIC, 8) == 0;
}

static kiln_status load_engine_tokenizer(const char *path, kiln_tokenizer **out, kiln_error *err) {
    kiln_engine e;
    kiln_status st = kiln_engine_open(path, &e, err);
    if (st != KILN_OK) return st;
    const kiln_engine_section *s = kiln_engine_find(&e, KILN_SECTION_TOKENIZER);
    if (!s) {
        kiln_engine_close(&e);
        return kiln_err(err, KILN_ERR_MISSING, "%s: the engine has no tokenizer section", path);
    }
    const uint8_t *data;
    size_t size;
    bool owned;
    st = kiln_engine_section_bytes(&e, s, 1, &data, &size, &owned, err);
    if (st == KILN_OK) {
        st = kiln_tokenizer_load(data, size, out, err);
        if (st != KILN_OK) kiln_err_prefix(err, "%s: ", path);
        if (owned) free((void *)data);
    }
    kiln_engine_close(&e);
    return st;
}

static int do_encode(const kiln_tokenizer *tok, unsigned flags, bool json) {
    size_t len;
    kiln_error err = {0};
    char *text = read_stdin(&len, &err);
    if (!text) return kiln_cli_fail("tokenize", &err, false);
    int32_t *ids;
    size_t n;
    kiln_status st = kiln_tokenizer_encode(tok, text, len, flags, &ids, &n, &err);
    free(text);
    if (st != KILN_OK) {
        fprintf(stderr, "kiln tokenize: error: stdin: %s\n", err.msg);
        return 1;
    }
    kiln_buf out = {0};
    kiln_buf_append(&out, json ? "{\"ids\": [" : "[", json ? 9 : 1);
    for (size_t i = 0; i < n; i++) kiln_buf_printf(&out, i ? ", %d" : "%d", ids[i]);
    if (json) {
        kiln_buf_append(&out, "], \"tokens\": [", 14);
        for (size_t i = 0; i < n; i++) {
            size_t tl;
            const char *t = kiln_tokenizer_token(tok, ids[i], &tl);
            json_t *js = json_stringn(t, tl);
            char *q = js ? json_dumps(js, JSON_ENCODE_ANY) : NULL;
            json_decref(js);
            if (q) {
                if (i) kiln_buf_append(&out, ", ", 2);
                kiln_buf_append(&out, q, strlen(q));
                free(q);
            }
        }
        kiln_buf_append(&out, "]}", 2);
    } else {
        kiln_buf_append(&out, "]", 1);
    }
    kiln_buf_append(&out, "\n", 1);
    free(ids);
    int rc = 0;
    if (out.failed || fwrite(out.data, 1, out.len, stdout) != out.len || fflush(stdout) != 0) {
        fprintf(stderr, "kiln tokenize: error: cannot write the ids to stdout\n");
        rc = 1;
    }
    kiln_buf_free(&out);
    return rc;
}

kiln_status kiln_tokenize_parse_ids(const char *text, size_t len, const char *label, int32_t **ids, size_t *n,
                                    kiln_error *err) {
    *ids = NULL;
    *n = 0;
    json_error_t je;
    json_t *arr = json_loadb(text, len, JSON_DECODE_ANY, &je);
    if (!arr || !json_is_array(arr)) {
        json_decref(arr);
        if (arr) return kiln_err(err, KILN_ERR_PARSE, "%s: expected a JSON array of ids", label);
        return kiln_err(err, KILN_ERR_PARSE, "%s:%d:%d: %s", label, je.line, je.column, je.text);
    }
    size_t count = json_array_size(arr);
    int32_t *v = malloc((count + 1) * sizeof *v);
    if (!v) {
        json_decref(arr);
        return kiln_err(err, KILN_ERR_NOMEM, "%s: out of memory for %zu ids", label, count);
    }
    for (size_t i = 0; i < count; i++) {
        json_t *x = json_array_get(arr, i);
        if (!json_is_integer(x) || json_integer_value(x) < 0 || json_integer_value(x) > INT32_MAX) {
            free(v);
            json_decref(arr);
            return kiln_err(err, KILN_ERR_PARSE, "%s: element %zu is not a token id (a non-negative integer)", label, i);
        }
        v[i] = (int32_t)json_integer_value(x);
    }
    json_decref(arr);
    *ids = v;
    *n = count;
    return KILN_OK;
}

static int do_decode(const kiln_tokenizer *tok, bool skip_special, bool json) {
    size_t len;
    kiln_error err = {0};
    char *text = read_stdin(&len, &err);
    if (!text) return kiln_cli_fail("tokenize", &err, false);
    int32_t *ids;
    size_t n;
    kiln_status st = kiln_tokenize_parse_ids(text, len, "stdin", &ids, &n, &err);
    free(text);
    if (st != KILN_OK) {
        fprintf(stderr, "kiln tokenize: error: --decode: %s\n", err.msg);
        return 1;
    }
    char *out;
    size_t out_len;
    st = kiln_tokenizer_decode(tok, ids, n, skip_special, &out, &out_len, &err);
    free(ids);
    if (st != KILN_OK) {
        fprintf(stderr, "kiln tokenize: error: --decode: %s\n", err.msg);
        return 1;
    }
    int rc = 0;
    if (json) {
        json_t *o = json_pack("{s:s%}", "text", out, out_len);
        char *q = o ? json_dumps(o, 0) : NULL;
        if (!q || printf("%s\n", q) < 0) rc = 1;
        free(q);
        json_decref(o);
    } else if (fwrite(out, 1, out_len, stdout) != out_len) {
        rc = 1;
    }
    if (fflush(stdout) != 0) rc = 1;
    if (rc) fprintf(stderr, "kiln tokenize: error: --decode: cannot write the text to stdout\n");
    free(out);
    return rc;
}

/* Parse the command line into *a. Returns -1 to go on, else the exit code
 * (0 after --help, 2 after a usage error, already reported). */
static int parse_args(int argc, char **argv, tok_args *a) {
    enum { O_BOS = 256, O_NOBOS, O_NOSPECIAL, O_DECODE, O_SKIP, O_JSON };
    static const struct option longopts[] = {
        {"bos", no_argument, 0, O_BOS},           {"special", no_argument, 0, O_BOS},
        {"no-bos", no_argument, 0, O_NOBOS},      {"no-special", no_argument, 0, O_NOSPECIAL},
        {"decode", no_argument, 0, O_DECODE},     {"skip-special", no_argument, 0, O_SKIP},
        {"json", no_argument, 0, O_JSON},         {"help", no_argument, 0, 'h'},
        {0, 0, 0, 0}};
    *a = (tok_args){.bos = -1};
    int c;
    optind = 1;
    opterr = 0;
    while ((c = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
        switch (c) {
        case O_BOS:
        case O_NOBOS:
            if (a->bos == (c == O_NOBOS)) return kiln_cli_usage_error("tokenize", "--bos and --no-bos contradict each other");
            a->bos = c == O_BOS;
            break;
        case O_NOSPECIAL: a->no_special = true; break;
        case O_DECODE: a->decode = true; break;
        case O_SKIP: a->skip_special = true; break;
        case O_JSON: a->json = true; break;
        case 'h': fputs(kUsage, stdout); return KILN_EXIT_OK;
        default: return kiln_cli_usage_error("tokenize", "unknown or incomplete option '%s'", argv[optind - 1]);
        }
    }
    if (optind == argc) return kiln_cli_usage_error("tokenize", "no TOKENIZER given");
    if (optind < argc - 1)
        return kiln_cli_usage_error("tokenize", "more than one TOKENIZER given (%s and %s)", argv[optind],
                                    argv[optind + 1]);
    a->path = argv[optind];
    if (a->decode && (a->bos >= 0 || a->no_special))
        return kiln_cli_usage_error("tokenize", "--bos, --no-bos and --no-special apply to encoding, not to --decode");
    if (!a->decode && a->skip_special) return kiln_cli_usage_error("tokenize", "--skip-special applies to --decode only");
    return -1;
}

/* load_json: the front end's tokenizer.json loader (kiln), or NULL (kiln-run: engines only). */
int kiln_cli_tokenize(int argc, char **argv, kiln_cli_tokjson_loader load_json) {
    tok_args a;
    int rc = parse_args(argc, argv, &a);
    if (rc >= 0) return rc;
    kiln_error err = {0};
    if (!kiln_path_exists(a.path)) {
        kiln_err(&err, KILN_ERR_IO, "%s: no such file or directory", a.path);
        return kiln_cli_fail("tokenize", &err, false);
    }
    kiln_tokenizer *tok = NULL;
    bool engine = !kiln_path_is_dir(a.path) && is_engine(a.path);
    if (!engine && !load_json) {
        kiln_err(&err, KILN_ERR_UNSUPPORTED, "%s is not an engine file, and kiln-run reads engines' tokenizers only",
                 a.path);
        kiln_err_hint(&err, "for a tokenizer.json or a checkpoint, use `kiln tokenize %s` on the build machine", a.path);
        return kiln_cli_fail("tokenize", &err, false);
    }
    kiln_status st = engine ? load_engine_tokenizer(a.path, &tok, &err) : load_json(a.path, &tok, &err);
    if (st != KILN_OK) return kiln_cli_fail("tokenize", &err, false);
    unsigned flags = (a.bos != 0 ? KILN_TOK_ADD_SPECIAL : 0) | (a.no_special ? KILN_TOK_NO_SPECIAL : 0);
    rc = a.decode ? do_decode(tok, a.skip_special, a.json) : do_encode(tok, flags, a.json);
    kiln_tokenizer_free(tok);
    return rc;
}
