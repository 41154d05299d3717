/*
 * cmd_tokenize.c — `kiln tokenize TOKENIZER`: UTF-8 text on stdin → a JSON
 * array of ids on stdout; with --decode, a JSON array of ids → text. This is
 * how parity with HF is scripted from the shell.
 *
 * TOKENIZER is a tokenizer.json, a checkpoint directory holding one (its
 * tokenizer_config.json is used when present), or an engine file (its
 * tokenizer section). Exit status: 0 on success, 1 on an error (message on
 * stderr naming the file and what is wrong), 2 on a usage error.
 */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../runtime/kiln_engine.h"
#include "cli.h"
#include "kiln_tokjson.h"

#define TOKENIZE_MAX_INPUT (1ull << 31) /* 2 GiB of stdin */

static const char kUsage[] =
    "usage: kiln tokenize TOKENIZER [--special] [--no-special] [--decode] [--skip-special] [--json]\n"
    "\n"
    "Encode UTF-8 text read from stdin into token ids (a JSON array on stdout),\n"
    "or with --decode, read a JSON array of ids and print the text.\n"
    "\n"
    "TOKENIZER       a tokenizer.json file, a checkpoint directory holding one,\n"
    "                or an engine file made by `kiln compile`\n"
    "--special       add bos/eos as HF add_special_tokens=True does\n"
    "--no-special    read special-token strings in the text (\"<s>\", \"<|im_start|>\")\n"
    "                as plain text (HF encode_special_tokens=True)\n"
    "--decode        ids in, text out\n"
    "--skip-special  with --decode: leave special tokens out of the text\n"
    "--json          encode: {\"ids\": [...], \"tokens\": [...]}; decode: {\"text\": \"...\"}\n"
    "--help          this text\n";

static char *read_stdin(size_t *len) {
    kiln_buf b = {0};
    for (;;) {
        if (!kiln_buf_reserve(&b, 1 << 16)) break;
        size_t n = fread(b.data + b.len, 1, 1 << 16, stdin);
        b.len += n;
        if (n == 0 || b.len > TOKENIZE_MAX_INPUT) break;
    }
    if (b.failed || ferror(stdin) || b.len > TOKENIZE_MAX_INPUT || !kiln_buf_append(&b, "", 1)) {
        kiln_buf_free(&b);
        return NULL;
    }
    *len = b.len - 1;
    return (char *)b.data;
}

/* An engine file starts with "KILNENG\0". */
static bool is_engine(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return false;
    char magic[8] = {0};
    size_t n = fread(magic, 1, 8, f);
    fclose(f);
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
    char *text = read_stdin(&len);
    if (!text) {
        fprintf(stderr, "kiln tokenize: cannot read stdin (read error, out of memory, or more than 2 GiB)\n");
        return 1;
    }
    kiln_error err = {0};
    int32_t *ids;
    size_t n;
    kiln_status st = kiln_tokenizer_encode(tok, text, len, flags, &ids, &n, &err);
    free(text);
    if (st != KILN_OK) {
        fprintf(stderr, "kiln tokenize: stdin: %s\n", err.msg);
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
        fprintf(stderr, "kiln tokenize: cannot write the ids to stdout\n");
        rc = 1;
    }
    kiln_buf_free(&out);
    return rc;
}

static int do_decode(const kiln_tokenizer *tok, bool skip_special, bool json) {
    size_t len;
    char *text = read_stdin(&len);
    if (!text) {
        fprintf(stderr, "kiln tokenize: cannot read stdin (read error, out of memory, or more than 2 GiB)\n");
        return 1;
    }
    json_error_t je;
    json_t *arr = json_loadb(text, len, JSON_DECODE_ANY, &je);
    free(text);
    if (!arr || !json_is_array(arr)) {
        if (arr) fprintf(stderr, "kiln tokenize --decode: stdin: expected a JSON array of ids\n");
        else fprintf(stderr, "kiln tokenize --decode: stdin:%d:%d: %s\n", je.line, je.column, je.text);
        json_decref(arr);
        return 1;
    }
    size_t n = json_array_size(arr);
    int32_t *ids = malloc((n + 1) * sizeof *ids);
    if (!ids) {
        json_decref(arr);
        fprintf(stderr, "kiln tokenize --decode: out of memory for %zu ids\n", n);
        return 1;
    }
    for (size_t i = 0; i < n; i++) {
        json_t *v = json_array_get(arr, i);
        if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > INT32_MAX) {
            fprintf(stderr, "kiln tokenize --decode: stdin: element %zu is not a token id (a non-negative integer)\n", i);
            free(ids);
            json_decref(arr);
            return 1;
        }
        ids[i] = (int32_t)json_integer_value(v);
    }
    json_decref(arr);
    kiln_error err = {0};
    char *out;
    size_t out_len;
    kiln_status st = kiln_tokenizer_decode(tok, ids, n, skip_special, &out, &out_len, &err);
    free(ids);
    if (st != KILN_OK) {
        fprintf(stderr, "kiln tokenize --decode: %s\n", err.msg);
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
    if (rc) fprintf(stderr, "kiln tokenize --decode: cannot write the text to stdout\n");
    free(out);
    return rc;
}

/* load_json: the front end's tokenizer.json loader (kiln), or NULL (kiln-run: engines only). */
int kiln_cli_tokenize(int argc, char **argv, kiln_cli_tokjson_loader load_json) {
    const char *path = NULL;
    bool special = false, no_special = false, decode = false, skip_special = false, json = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            if (!load_json) /* kiln-run */
                fputs("kiln-run tokenize: TOKENIZER must be an engine file (tokenizer.json needs `kiln`)\n", stdout);
            fputs(kUsage, stdout);
            return 0;
        } else if (!strcmp(a, "--special")) {
            special = true;
        } else if (!strcmp(a, "--no-special")) {
            no_special = true;
        } else if (!strcmp(a, "--decode")) {
            decode = true;
        } else if (!strcmp(a, "--skip-special")) {
            skip_special = true;
        } else if (!strcmp(a, "--json")) {
            json = true;
        } else if (a[0] == '-' && a[1]) {
            fprintf(stderr, "kiln tokenize: unknown option %s\n%s", a, kUsage);
            return 2;
        } else if (!path) {
            path = a;
        } else {
            fprintf(stderr, "kiln tokenize: more than one TOKENIZER given (%s and %s)\n", path, a);
            return 2;
        }
    }
    if (!path) {
        fprintf(stderr, "kiln tokenize: no TOKENIZER given\n%s", kUsage);
        return 2;
    }
    if (decode && (special || no_special)) {
        fprintf(stderr, "kiln tokenize: --special and --no-special apply to encoding, not to --decode\n");
        return 2;
    }
    if (!decode && skip_special) {
        fprintf(stderr, "kiln tokenize: --skip-special applies to --decode only\n");
        return 2;
    }
    if (!kiln_path_exists(path)) {
        fprintf(stderr, "kiln tokenize: %s: no such file or directory\n", path);
        return 1;
    }
    kiln_error err = {0};
    kiln_tokenizer *tok = NULL;
    bool engine = !kiln_path_is_dir(path) && is_engine(path);
    if (!engine && !load_json) {
        fprintf(stderr, "kiln-run tokenize: %s is not an engine file\nhint: kiln-run reads an engine's tokenizer; "
                        "for a tokenizer.json or a checkpoint, use `kiln tokenize %s` on the build machine\n",
                path, path);
        return 1;
    }
    kiln_status st = engine ? load_engine_tokenizer(path, &tok, &err) : load_json(path, &tok, &err);
    if (st != KILN_OK) {
        fprintf(stderr, "kiln tokenize: %s\n", err.msg);
        return 1;
    }
    int rc = decode ? do_decode(tok, skip_special, json)
                    : do_encode(tok, (special ? KILN_TOK_ADD_SPECIAL : 0) | (no_special ? KILN_TOK_NO_SPECIAL : 0), json);
    kiln_tokenizer_free(tok);
    return rc;
}
