/*
 * test_tokenizer.c — the tokenizer against HuggingFace `tokenizers`.
 *
 * Goldens: tests/golden/tokenizer/, made by tests/golden/make_tokenizer_goldens.py
 * from HF tokenizers (Tokenizer.from_file) on the real tokenizer.json files
 * of llama2, llama3 and qwen3 in KILN_SHARED_DIR/tokenizers. For every
 * corpus text: encode with and without special tokens, with special-token
 * strings as text, decode with and without skipping specials, incremental
 * decode; plus decode goldens for arbitrary id sequences and a synthetic
 * tokenizer exercising added-token flags. Then the refusals: invalid UTF-8,
 * unknown model types, unsupported components, malformed JSON, hostile
 * blobs; and `kiln tokenize` through kiln_cmd_tokenize.
 *
 * `test_tokenizer --bench FILE` is the benchmark driver used by
 * bench/bench_tokenizer.sh (not run by ctest).
 */
#include <fcntl.h>
#include <jansson.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../compiler/kiln_tokjson.h"
#include "../format/kiln_engine.h"
#include "../runtime/kiln_tokenizer.h"
#include "kt.h"

#define GOLDEN KILN_SOURCE_DIR "/tests/golden/tokenizer/"
#define TOKDIR KILN_SHARED_DIR "/tokenizers/"

static const char *kNames[3] = {"llama2", "llama3", "qwen3"};

/* ---- helpers ---- */

static json_t **read_jsonl(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    *n = 0;
    if (!f) return NULL;
    size_t cap = 64;
    json_t **rows = malloc(cap * sizeof *rows);
    char *line = NULL;
    size_t lcap = 0;
    ssize_t len;
    while ((len = getline(&line, &lcap, f)) > 0) {
        json_error_t je;
        json_t *j = json_loadb(line, (size_t)len, JSON_DECODE_ANY | JSON_ALLOW_NUL, &je);
        if (!j) {
            fprintf(stderr, "  %s:%zu: %s\n", path, *n + 1, je.text);
            break;
        }
        if (*n == cap) rows = realloc(rows, (cap *= 2) * sizeof *rows);
        rows[(*n)++] = j;
    }
    free(line);
    fclose(f);
    return rows;
}

static void free_rows(json_t **rows, size_t n) {
    for (size_t i = 0; i < n; i++) json_decref(rows[i]);
    free(rows);
}

static bool ids_equal(const int32_t *ids, size_t n, const json_t *arr) {
    if (!json_is_array(arr) || json_array_size(arr) != n) return false;
    for (size_t i = 0; i < n; i++)
        if (json_integer_value(json_array_get(arr, i)) != ids[i]) return false;
    return true;
}

static void print_ids(const char *what, const int32_t *ids, size_t n) {
    fprintf(stderr, "    %s (%zu):", what, n);
    for (size_t i = 0; i < n && i < 40; i++) fprintf(stderr, " %d", ids[i]);
    fprintf(stderr, n > 40 ? " ...\n" : "\n");
}

static void print_golden(const char *what, const json_t *arr) {
    size_t n = json_array_size(arr);
    fprintf(stderr, "    %s (%zu):", what, n);
    for (size_t i = 0; i < n && i < 40; i++) fprintf(stderr, " %lld", (long long)json_integer_value(json_array_get(arr, i)));
    fprintf(stderr, n > 40 ? " ...\n" : "\n");
}

static int32_t *golden_ids(const json_t *arr, size_t *n) {
    *n = json_array_size(arr);
    int32_t *ids = malloc((*n + 1) * sizeof *ids);
    for (size_t i = 0; i < *n; i++) ids[i] = (int32_t)json_integer_value(json_array_get(arr, i));
    return ids;
}

static bool have_shared(void) {
    char p[4096];
    snprintf(p, sizeof p, "%s%s/tokenizer.json", TOKDIR, "llama2");
    return kiln_path_exists(p);
}

/* Each real tokenizer is compiled and loaded once for the whole run (compiling
 * the 9-11 MB JSON files dominates this test's time under sanitizers). */
static kiln_tokenizer *g_loaded[3];

static kiln_tokenizer *load_named_fresh(const char *name);

static const kiln_tokenizer *get_tok(int which) {
    if (!g_loaded[which]) g_loaded[which] = load_named_fresh(kNames[which]);
    return g_loaded[which];
}

static kiln_tokenizer *load_named_fresh(const char *name) {
    char dir[4096];
    snprintf(dir, sizeof dir, "%s%s", TOKDIR, name);
    kiln_error err = {0};
    kiln_tokenizer *tok = NULL;
    double t0 = kiln_now();
    kiln_status st = kiln_tokenizer_load_json(dir, &tok, &err);
    if (st != KILN_OK) fprintf(stderr, "  load %s: %s\n", name, err.msg);
    else fprintf(stderr, "  %s: compiled + loaded in %.0f ms\n", name, (kiln_now() - t0) * 1e3);
    return tok;
}

static bool utf8_ok(const char *p, size_t n) {
    /* strict check via the encoder: valid UTF-8 encodes (or is refused by offset) */
    size_t i = 0;
    const unsigned char *s = (const unsigned char *)p;
    while (i < n) {
        unsigned char c = s[i];
        size_t need = c < 0x80 ? 1 : c >= 0xC2 && c <= 0xDF ? 2 : c >= 0xE0 && c <= 0xEF ? 3 : c >= 0xF0 && c <= 0xF4 ? 4 : 0;
        if (!need || i + need > n) return false;
        for (size_t k = 1; k < need; k++)
            if ((s[i + k] & 0xC0) != 0x80) return false;
        i += need;
    }
    return true;
}

/* Incremental decode of all ids, concatenated; NULL when a piece is not whole UTF-8 characters. */
static char *stream_decode(const kiln_tokenizer *tok, const int32_t *ids, size_t n, bool skip, size_t *len) {
    kiln_tok_stream s;
    kiln_tok_stream_init(&s, tok, skip);
    kiln_buf all = {0};
    kiln_error err = {0};
    const char *piece;
    size_t plen;
    for (size_t i = 0; i < n; i++) {
        if (kiln_tok_stream_push(&s, ids[i], &piece, &plen, &err) != KILN_OK) {
            kiln_tok_stream_free(&s);
            kiln_buf_free(&all);
            return NULL;
        }
        if (!utf8_ok(piece, plen)) { /* never half a character */
            kiln_tok_stream_free(&s);
            kiln_buf_free(&all);
            return NULL;
        }
        kiln_buf_append(&all, piece, plen);
    }
    kiln_tok_stream_finish(&s, &piece, &plen, &err);
    kiln_buf_append(&all, piece, plen);
    kiln_buf_append(&all, "", 1);
    kiln_tok_stream_free(&s);
    *len = all.len - 1;
    return (char *)all.data;
}

/* ---- golden parity ---- */

typedef struct counts {
    int enc, enc_sp, enc_nosp, dec, dec_skip, stream, rt;
} counts;

static void check_corpus(const char *name, const kiln_tokenizer *tok, const char *corpus_file, const char *golden_file,
                         counts *bad, size_t *n_rows) {
    size_t nc = 0, ng = 0;
    json_t **corpus = read_jsonl(corpus_file, &nc);
    json_t **gold = read_jsonl(golden_file, &ng);
    KT_CHECKF(corpus && gold && nc == ng && nc > 0, "%s: corpus %zu lines, golden %zu lines", name, nc, ng);
    *n_rows = nc < ng ? nc : ng;
    for (size_t i = 0; i < nc && i < ng; i++) {
        const char *text = json_string_value(corpus[i]);
        size_t tlen = json_string_length(corpus[i]);
        json_t *g = gold[i];
        json_t *g_ids = json_object_get(g, "ids");
        json_t *g_sp = json_object_get(g, "ids_sp"), *g_nosp = json_object_get(g, "ids_nosp");
        if (!g_sp) g_sp = g_ids;
        if (!g_nosp) g_nosp = g_ids;
        struct {
            unsigned flags;
            json_t *want;
            int *bad;
            const char *what;
        } cases[3] = {{0, g_ids, &bad->enc, "encode"},
                      {KILN_TOK_ADD_SPECIAL, g_sp, &bad->enc_sp, "encode --special"},
                      {KILN_TOK_NO_SPECIAL, g_nosp, &bad->enc_nosp, "encode --no-special"}};
        for (int c = 0; c < 3; c++) {
            int32_t *ids = NULL;
            size_t n = 0;
            kiln_error err = {0};
            kiln_status st = kiln_tokenizer_encode(tok, text, tlen, cases[c].flags, &ids, &n, &err);
            if (st != KILN_OK || !ids_equal(ids, n, cases[c].want)) {
                if ((*cases[c].bad)++ < 3) {
                    fprintf(stderr, "  %s: %s mismatch on corpus line %zu (%zu bytes)%s%s\n", name, cases[c].what, i + 1, tlen,
                            st ? ": " : "", st ? err.msg : "");
                    print_ids("kiln", ids, n);
                    print_golden("HF  ", cases[c].want);
                }
            }
            free(ids);
        }
        /* decode the golden ids */
        size_t n;
        int32_t *ids = golden_ids(g_ids, &n);
        const char *want = json_string_value(json_object_get(g, "dec"));
        size_t want_len = json_string_length(json_object_get(g, "dec"));
        json_t *jskip = json_object_get(g, "dec_skip");
        const char *want_skip = jskip ? json_string_value(jskip) : want;
        size_t want_skip_len = jskip ? json_string_length(jskip) : want_len;
        char *out = NULL;
        size_t out_len = 0;
        kiln_error err = {0};
        if (kiln_tokenizer_decode(tok, ids, n, false, &out, &out_len, &err) != KILN_OK || out_len != want_len ||
            memcmp(out, want, want_len) != 0) {
            if (bad->dec++ < 3) fprintf(stderr, "  %s: decode mismatch on line %zu: kiln \"%.80s\" HF \"%.80s\"\n", name, i + 1, out ? out : err.msg, want);
        }
        free(out);
        out = NULL;
        if (kiln_tokenizer_decode(tok, ids, n, true, &out, &out_len, &err) != KILN_OK || out_len != want_skip_len ||
            memcmp(out, want_skip, want_skip_len) != 0) {
            if (bad->dec_skip++ < 3) fprintf(stderr, "  %s: decode(skip) mismatch on line %zu: kiln \"%.80s\" HF \"%.80s\"\n", name, i + 1, out ? out : err.msg, want_skip);
        }
        free(out);
        /* round trip where HF has it */
        if (json_is_true(json_object_get(g, "rt")) && (want_len != tlen || memcmp(want, text, tlen) != 0)) bad->rt++;
        /* incremental == full */
        for (int skip = 0; skip < 2; skip++) {
            size_t sl;
            char *s = stream_decode(tok, ids, n, skip, &sl);
            const char *w = skip ? want_skip : want;
            size_t wl = skip ? want_skip_len : want_len;
            if (!s || sl != wl || memcmp(s, w, wl) != 0) {
                if (bad->stream++ < 3) fprintf(stderr, "  %s: stream decode mismatch on line %zu: \"%.80s\" vs \"%.80s\"\n", name, i + 1, s ? s : "(error)", w);
            }
            free(s);
        }
        free(ids);
    }
    free_rows(corpus, nc);
    free_rows(gold, ng);
}

static void test_golden_one(int which) {
    if (!have_shared()) KT_SKIP("%s is absent: no tokenizer.json files to test against", TOKDIR);
    const char *name = kNames[which];
    const kiln_tokenizer *tok = get_tok(which);
    KT_REQUIRE(tok);
    char gpath[512];
    snprintf(gpath, sizeof gpath, GOLDEN "%s.jsonl", name);
    counts bad = {0};
    size_t rows = 0;
    check_corpus(name, tok, GOLDEN "corpus.jsonl", gpath, &bad, &rows);
    fprintf(stderr, "  %s: %zu texts; mismatches: encode %d, +special %d, no-special %d, decode %d, decode(skip) %d, stream %d\n",
            name, rows, bad.enc, bad.enc_sp, bad.enc_nosp, bad.dec, bad.dec_skip, bad.stream);
    KT_CHECK(rows >= 300);
    KT_EQ_INT(bad.enc, 0);
    KT_EQ_INT(bad.enc_sp, 0);
    KT_EQ_INT(bad.enc_nosp, 0);
    KT_EQ_INT(bad.dec, 0);
    KT_EQ_INT(bad.dec_skip, 0);
    KT_EQ_INT(bad.stream, 0);
    KT_EQ_INT(bad.rt, 0);

    /* decode goldens for id sequences that are not encodings */
    snprintf(gpath, sizeof gpath, GOLDEN "%s_decode.jsonl", name);
    size_t ng = 0;
    json_t **gold = read_jsonl(gpath, &ng);
    KT_CHECK(gold && ng > 50);
    int dbad = 0, sbad = 0, sdiff = 0;
    for (size_t i = 0; i < ng; i++) {
        size_t n;
        int32_t *ids = golden_ids(json_object_get(gold[i], "ids"), &n);
        for (int skip = 0; skip < 2; skip++) {
            json_t *w = json_object_get(gold[i], skip && json_object_get(gold[i], "dec_skip") ? "dec_skip" : "dec");
            char *out = NULL;
            size_t out_len;
            kiln_error err = {0};
            kiln_status st = kiln_tokenizer_decode(tok, ids, n, skip, &out, &out_len, &err);
            bool same = st == KILN_OK && out_len == json_string_length(w) && memcmp(out, json_string_value(w), out_len) == 0;
            if (!same && dbad++ < 3)
                fprintf(stderr, "  %s: decode golden %zu (skip=%d): kiln \"%.60s\" HF \"%.60s\"\n", name, i + 1, skip, out ? out : err.msg,
                        json_string_value(w));
            /* the stream: never half a character; equal to the full decode except where HF
               replaced a whole invalid byte-fallback run (then the full text has U+FFFD) */
            size_t sl;
            char *s = stream_decode(tok, ids, n, skip, &sl);
            if (!s || !utf8_ok(s, sl)) sbad++;
            else if (out && (sl != out_len || memcmp(s, out, sl) != 0)) {
                if (!strstr(out, "\xEF\xBF\xBD")) {
                    if (sbad++ < 3) fprintf(stderr, "  %s: stream differs on decode golden %zu: \"%.60s\" vs \"%.60s\"\n", name, i + 1, s, out);
                } else {
                    sdiff++;
                }
            }
            free(s);
            free(out);
        }
        free(ids);
    }
    fprintf(stderr, "  %s: %zu decode goldens; mismatches %d; stream faults %d (documented invalid-run differences: %d)\n", name, ng,
            dbad, sbad, sdiff);
    KT_EQ_INT(dbad, 0);
    KT_EQ_INT(sbad, 0);
    free_rows(gold, ng);
}

static void test_golden_llama2(void) { test_golden_one(0); }
static void test_golden_llama3(void) { test_golden_one(1); }
static void test_golden_qwen3(void) { test_golden_one(2); }

/* llama2's tokenizer.json edited in memory, compiled and loaded (no tokenizer_config.json). */
static kiln_tokenizer *load_variant(void (*edit)(json_t *root, int arg), int arg) {
    json_error_t je;
    json_t *j = json_load_file(TOKDIR "llama2/tokenizer.json", JSON_ALLOW_NUL, &je);
    if (!j) return NULL;
    edit(j, arg);
    char *text = json_dumps(j, 0);
    json_decref(j);
    if (!text) return NULL;
    kiln_buf blob = {0};
    kiln_error err = {0};
    kiln_tokenizer *tok = NULL;
    kiln_status st = kiln_tokjson_compile_mem(text, strlen(text), NULL, 0, "variant/tokenizer.json", &blob, &err);
    free(text);
    if (st == KILN_OK) st = kiln_tokenizer_load(blob.data, blob.len, &tok, &err);
    if (st != KILN_OK) fprintf(stderr, "  variant: %s\n", err.msg);
    kiln_buf_free(&blob);
    return tok;
}

/* As make_tokenizer_goldens.py's synth_tokenizer(). */
static void edit_synth(json_t *j, int arg) {
    (void)arg;
    size_t n = json_object_size(json_object_get(json_object_get(j, "model"), "vocab"));
    json_t *added = json_object_get(j, "added_tokens");
    json_array_append_new(added, json_pack("{s:I,s:s,s:b,s:b,s:b,s:b,s:b}", "id", (json_int_t)n, "content", "<mask>", "single_word", 0,
                                           "lstrip", 1, "rstrip", 1, "normalized", 0, "special", 1));
    json_array_append_new(added, json_pack("{s:I,s:s,s:b,s:b,s:b,s:b,s:b}", "id", (json_int_t)n + 1, "content", "foo", "single_word", 0,
                                           "lstrip", 0, "rstrip", 0, "normalized", 1, "special", 0));
    json_array_append_new(added, json_pack("{s:I,s:s,s:b,s:b,s:b,s:b,s:b}", "id", (json_int_t)n + 2, "content", "<ctl>", "single_word", 0,
                                           "lstrip", 0, "rstrip", 1, "normalized", 0, "special", 0));
}

/* As make_tokenizer_goldens.py's unk_tokenizer(): no byte fallback, unknown characters → <unk>. */
static void edit_unk(json_t *j, int fuse) {
    json_t *model = json_object_get(j, "model");
    json_object_set_new(model, "byte_fallback", json_false());
    json_object_set_new(model, "fuse_unk", json_boolean(fuse));
}

/* Added-token flags (lstrip, rstrip, normalized, non-special). */
static void test_golden_synth_added_flags(void) {
    if (!have_shared()) KT_SKIP("%s is absent", TOKDIR);
    kiln_tokenizer *tok = load_variant(edit_synth, 0);
    KT_REQUIRE(tok);
    counts bad = {0};
    size_t rows = 0;
    check_corpus("synth", tok, GOLDEN "synth_corpus.jsonl", GOLDEN "llama2_synth.jsonl", &bad, &rows);
    KT_CHECK(rows >= 20);
    KT_EQ_INT(bad.enc + bad.enc_sp + bad.enc_nosp + bad.dec + bad.dec_skip + bad.stream + bad.rt, 0);
    KT_EQ_INT(kiln_tokenizer_token_id(tok, "<ctl>", 5), 32001);
    kiln_tokenizer_free(tok);
}

/* <unk> for characters without a token, fused (runs → one <unk>) or not. */
static void test_golden_unk(void) {
    if (!have_shared()) KT_SKIP("%s is absent", TOKDIR);
    for (int fuse = 1; fuse >= 0; fuse--) {
        kiln_tokenizer *tok = load_variant(edit_unk, fuse);
        KT_REQUIRE(tok);
        counts bad = {0};
        size_t rows = 0;
        check_corpus(fuse ? "unk-fused" : "unk-unfused", tok, GOLDEN "unk_corpus.jsonl",
                     fuse ? GOLDEN "llama2_unk_fused.jsonl" : GOLDEN "llama2_unk_unfused.jsonl", &bad, &rows);
        KT_CHECK(rows >= 10);
        KT_EQ_INT(bad.enc + bad.enc_sp + bad.enc_nosp + bad.dec + bad.dec_skip + bad.stream + bad.rt, 0);
        kiln_tokenizer_free(tok);
    }
}

/* ---- accessors, refusals ---- */

static void test_accessors(void) {
    if (!have_shared()) KT_SKIP("%s is absent", TOKDIR);
    struct {
        const char *name;
        uint32_t vocab;
        int32_t bos, eos;
        int32_t probe_id;
        const char *probe;
    } want[3] = {{"llama2", 32000, 1, 2, 22557, "\xE2\x96\x81Hello"},
                 {"llama3", 128256, 128000, 128001, 9906, "Hello"},
                 {"qwen3", 151669, -1, 151645, 151644, "<|im_start|>"}};
    for (int i = 0; i < 3; i++) {
        const kiln_tokenizer *tok = get_tok(i);
        KT_REQUIRE(tok);
        KT_EQ_INT(kiln_tokenizer_vocab_size(tok), want[i].vocab);
        KT_EQ_INT(kiln_tokenizer_bos(tok), want[i].bos);
        const int32_t *eos;
        KT_EQ_INT(kiln_tokenizer_eos(tok, &eos), 1);
        KT_EQ_INT(eos[0], want[i].eos);
        size_t len;
        const char *s = kiln_tokenizer_token(tok, want[i].probe_id, &len);
        KT_CHECK(s && len == strlen(want[i].probe) && memcmp(s, want[i].probe, len) == 0);
        KT_EQ_INT(kiln_tokenizer_token_id(tok, want[i].probe, strlen(want[i].probe)), want[i].probe_id);
        KT_CHECK(kiln_tokenizer_token(tok, -1, &len) == NULL);
        KT_CHECK(kiln_tokenizer_token(tok, (int32_t)want[i].vocab, &len) == NULL);
        /* ids outside the vocabulary are refused by decode and the stream */
        int32_t bad_ids[2] = {5, (int32_t)want[i].vocab};
        char *out;
        kiln_error err = {0};
        KT_EQ_INT(kiln_tokenizer_decode(tok, bad_ids, 2, false, &out, &len, &err), KILN_ERR_TOKENIZER);
        KT_CONTAINS(err.msg, "position 1");
        kiln_tok_stream ts;
        kiln_tok_stream_init(&ts, tok, false);
        const char *piece;
        KT_EQ_INT(kiln_tok_stream_push(&ts, -7, &piece, &len, &err), KILN_ERR_TOKENIZER);
        kiln_tok_stream_free(&ts);
    }
}

static void test_invalid_utf8(void) {
    if (!have_shared()) KT_SKIP("%s is absent", TOKDIR);
    const kiln_tokenizer *tok = get_tok(1);
    KT_REQUIRE(tok);
    struct {
        const char *s;
        size_t len, at;
    } bad[] = {{"ab\xFF" "cd", 5, 2},   {"\xC0\xAF", 2, 0},          {"ok \xED\xA0\x80", 6, 3}, /* surrogate */
               {"tail \xE4\xB8", 7, 5}, {"x\xF4\x90\x80\x80", 5, 1}, /* > U+10FFFF */
               {"\x80", 1, 0},          {"caf\xC3", 4, 3}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        int32_t *ids = (int32_t *)1;
        size_t n = 99;
        kiln_error err = {0};
        KT_EQ_INT(kiln_tokenizer_encode(tok, bad[i].s, bad[i].len, 0, &ids, &n, &err), KILN_ERR_TOKENIZER);
        char want[64];
        snprintf(want, sizeof want, "byte offset %zu", bad[i].at);
        KT_CONTAINS(err.msg, want);
        KT_CHECK(ids == NULL && n == 0);
    }
    /* NUL is valid UTF-8 */
    int32_t *ids;
    size_t n;
    kiln_error err = {0};
    KT_EQ_INT(kiln_tokenizer_encode(tok, "a\0b", 3, 0, &ids, &n, &err), KILN_OK);
    KT_EQ_INT(n, 3);
    free(ids);
    KT_EQ_INT(kiln_tokenizer_encode(tok, "x", 1, 0x80, &ids, &n, &err), KILN_ERR_INVALID_ARG);
}

/* A minimal valid tokenizer.json, with `model_extra`, normalizer, pre_tokenizer, decoder overridable. */
static char *mini_json(const char *model, const char *normalizer, const char *pretok, const char *decoder) {
    const char *def_model =
        "{\"type\":\"BPE\",\"dropout\":null,\"unk_token\":null,\"continuing_subword_prefix\":null,\"end_of_word_suffix\":null,"
        "\"fuse_unk\":false,\"byte_fallback\":false,\"vocab\":{\"a\":0,\"b\":1,\"ab\":2,\"\xC4\xA0\":3},\"merges\":[\"a b\"]}";
    size_t cap = 4096;
    char *s = malloc(cap);
    snprintf(s, cap,
             "{\"version\":\"1.0\",\"truncation\":null,\"padding\":null,\"added_tokens\":[],\"normalizer\":%s,"
             "\"pre_tokenizer\":%s,\"post_processor\":null,\"decoder\":%s,\"model\":%s}",
             normalizer ? normalizer : "null",
             pretok ? pretok : "{\"type\":\"ByteLevel\",\"add_prefix_space\":false,\"trim_offsets\":true,\"use_regex\":true}",
             decoder ? decoder : "{\"type\":\"ByteLevel\",\"add_prefix_space\":true,\"trim_offsets\":true,\"use_regex\":true}",
             model ? model : def_model);
    return s;
}

static kiln_status compile_text(const char *text, kiln_error *err) {
    kiln_buf blob = {0};
    kiln_status st = kiln_tokjson_compile_mem(text, strlen(text), NULL, 0, "t.json", &blob, err);
    kiln_buf_free(&blob);
    return st;
}

static void test_mini_and_refusals(void) {
    kiln_error err = {0};
    char *s = mini_json(NULL, NULL, NULL, NULL);
    kiln_buf blob = {0};
    KT_EQ_INT(kiln_tokjson_compile_mem(s, strlen(s), NULL, 0, "t.json", &blob, &err), KILN_OK);
    free(s);
    kiln_tokenizer *tok = NULL;
    KT_EQ_INT(kiln_tokenizer_load(blob.data, blob.len, &tok, &err), KILN_OK);
    KT_REQUIRE(tok);
    int32_t *ids;
    size_t n;
    KT_EQ_INT(kiln_tokenizer_encode(tok, "ab a", 4, 0, &ids, &n, &err), KILN_OK);
    /* "ab" merges; " a" = Ġ a; Ġ exists, so [ab, Ġ, a] */
    KT_EQ_INT(n, 3);
    if (n == 3) {
        KT_EQ_INT(ids[0], 2);
        KT_EQ_INT(ids[1], 3);
        KT_EQ_INT(ids[2], 0);
    }
    free(ids);
    /* bytes with no token are dropped, as HF drops characters it cannot represent */
    KT_EQ_INT(kiln_tokenizer_encode(tok, "c", 1, 0, &ids, &n, &err), KILN_OK);
    KT_EQ_INT(n, 0);
    free(ids);
    kiln_tokenizer_free(tok);

    /* hostile blobs: every truncation and single-byte corruption fails cleanly or loads */
    for (size_t cut = 0; cut < blob.len; cut += (cut < 64 ? 1 : 7)) {
        kiln_tokenizer *t2 = NULL;
        kiln_status st = kiln_tokenizer_load(blob.data, cut, &t2, &err);
        KT_CHECKF(st != KILN_OK && t2 == NULL, "truncated to %zu bytes loaded", cut);
        kiln_tokenizer_free(t2);
    }
    int loaded = 0;
    for (size_t i = 0; i < blob.len; i++) {
        uint8_t *copy = malloc(blob.len);
        memcpy(copy, blob.data, blob.len);
        copy[i] ^= (uint8_t)(0x5A + i);
        kiln_tokenizer *t2 = NULL;
        if (kiln_tokenizer_load(copy, blob.len, &t2, &err) == KILN_OK) {
            loaded++;
            int32_t *x;
            size_t nx;
            if (kiln_tokenizer_encode(t2, "ab ba\xC4\xA0", 7, 0, &x, &nx, &err) == KILN_OK) free(x);
        }
        kiln_tokenizer_free(t2);
        free(copy);
    }
    fprintf(stderr, "  %zu corrupted blobs: %d still loaded (string bytes), the rest refused\n", blob.len, loaded);
    {
        uint8_t *copy = malloc(blob.len);
        memcpy(copy, blob.data, blob.len);
        copy[0] = 'X';
        KT_EQ_INT(kiln_tokenizer_load(copy, blob.len, &tok, &err), KILN_ERR_FORMAT);
        KT_CONTAINS(err.msg, "magic");
        memcpy(copy, blob.data, blob.len);
        copy[8] = 2;
        KT_EQ_INT(kiln_tokenizer_load(copy, blob.len, &tok, &err), KILN_ERR_VERSION);
        free(copy);
    }
    kiln_buf_free(&blob);

    /* a Split regex kiln does not know runs in PCRE2 with Oniguruma's \s: U+180E is not a space */
    s = mini_json(NULL, NULL,
                  "{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"Split\",\"pattern\":{\"Regex\":\"\\\\s+\"},"
                  "\"behavior\":\"Isolated\",\"invert\":false},{\"type\":\"ByteLevel\",\"add_prefix_space\":false,\"use_regex\":false}]}",
                  NULL);
    KT_EQ_INT(kiln_tokjson_compile_mem(s, strlen(s), NULL, 0, "t.json", &blob, &err), KILN_OK);
    free(s);
    tok = NULL;
    KT_EQ_INT(kiln_tokenizer_load(blob.data, blob.len, &tok, &err), KILN_OK);
    kiln_buf_free(&blob);
    if (tok) {
        /* one word: the unknown bytes of U+180E drop out and "a" "b" merge; split, they could not */
        KT_EQ_INT(kiln_tokenizer_encode(tok, "a\xE1\xA0\x8E" "b", 5, 0, &ids, &n, &err), KILN_OK);
        KT_EQ_INT(n, 1);
        if (n == 1) KT_EQ_INT(ids[0], 2);
        free(ids);
        KT_EQ_INT(kiln_tokenizer_encode(tok, "a\xE3\x80\x80" "b", 5, 0, &ids, &n, &err), KILN_OK); /* U+3000 is */
        KT_EQ_INT(n, 2);
        free(ids);
        kiln_tokenizer_free(tok);
    }

    /* unknown model types, by name */
    const char *models[] = {"WordPiece", "Unigram", "WordLevel"};
    for (int i = 0; i < 3; i++) {
        char m[256];
        snprintf(m, sizeof m, "{\"type\":\"%s\",\"vocab\":{\"a\":0},\"unk_token\":\"a\"}", models[i]);
        s = mini_json(m, NULL, NULL, NULL);
        KT_EQ_INT(compile_text(s, &err), KILN_ERR_UNSUPPORTED);
        KT_CONTAINS(err.msg, models[i]);
        free(s);
    }
    /* unsupported components, by name */
    struct {
        const char *norm, *pre, *dec, *name;
    } comp[] = {
        {"{\"type\":\"NFKC\"}", NULL, NULL, "NFKC"},
        {"{\"type\":\"Lowercase\"}", NULL, NULL, "Lowercase"},
        {"{\"type\":\"Sequence\",\"normalizers\":[{\"type\":\"NFC\"},{\"type\":\"StripAccents\"}]}", NULL, NULL, "StripAccents"},
        {"{\"type\":\"Replace\",\"pattern\":{\"Regex\":\" +\"},\"content\":\" \"}", NULL, NULL, "Regex"},
        {NULL, "{\"type\":\"Metaspace\",\"replacement\":\"_\",\"prepend_scheme\":\"always\",\"split\":true}", NULL, "Metaspace"},
        {NULL, "{\"type\":\"Whitespace\"}", NULL, "Whitespace"},
        {NULL, "{\"type\":\"ByteLevel\",\"add_prefix_space\":true}", NULL, "add_prefix_space"},
        {NULL, "{\"type\":\"Split\",\"pattern\":{\"Regex\":\"a\"},\"behavior\":\"Removed\",\"invert\":false}", NULL, "Removed"},
        {NULL, "{\"type\":\"Split\",\"pattern\":{\"Regex\":\"(a\"},\"behavior\":\"Isolated\",\"invert\":false}", NULL, "does not compile"},
        {NULL, "{\"type\":\"Split\",\"pattern\":{\"Regex\":\"\\\\w+\"},\"behavior\":\"Isolated\",\"invert\":false}", NULL, "\\w at offset 0"},
        {NULL, "{\"type\":\"Split\",\"pattern\":{\"Regex\":\"^a\"},\"behavior\":\"Isolated\",\"invert\":false}", NULL, "anchors"},
        {NULL, NULL, "{\"type\":\"WordPiece\",\"prefix\":\"##\",\"cleanup\":true}", "WordPiece"},
        {NULL, NULL, "{\"type\":\"Metaspace\"}", "Metaspace"},
        {NULL, NULL, "null", "decoder is null"},
    };
    for (size_t i = 0; i < sizeof comp / sizeof comp[0]; i++) {
        s = mini_json(NULL, comp[i].norm, comp[i].pre, comp[i].dec);
        KT_EQ_INT(compile_text(s, &err), KILN_ERR_UNSUPPORTED);
        KT_CONTAINS(err.msg, comp[i].name);
        free(s);
    }
    /* malformed JSON and wrong fields: KILN_ERR_PARSE naming what is wrong */
    struct {
        const char *text, *msg;
    } bad[] = {
        {"", "malformed JSON"},
        {"{\"model\": {", "malformed JSON"},
        {"[1,2]", "JSON object"},
        {"{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[]},\"model\":1}", "malformed JSON"}, /* duplicate key */
        {"{\"version\":\"1.0\"}", "\"model\" object is missing"},
        {"{\"model\":{\"type\":\"BPE\",\"vocab\":[],\"merges\":[]},\"decoder\":{\"type\":\"ByteLevel\"}}", "model.vocab is an array"},
        {"{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":-1},\"merges\":[]},\"decoder\":{\"type\":\"ByteLevel\"}}", "has id -1"},
        {"{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":0},\"merges\":[]},\"decoder\":{\"type\":\"ByteLevel\"}}", "id 0 is given to both"},
        {"{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[\"a c\"]},\"decoder\":{\"type\":\"ByteLevel\"}}", "\"c\" is not in model.vocab"},
        {"{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[\"a a\"]},\"decoder\":{\"type\":\"ByteLevel\"}}", "\"a\" + \"a\" is not in model.vocab"},
        {"{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[\"aa\"]},\"decoder\":{\"type\":\"ByteLevel\"}}", "two tokens separated by one space"},
        {"{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[7]},\"decoder\":{\"type\":\"ByteLevel\"}}", "model.merges[0] is an integer"},
        {"{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[],\"unk_token\":\"<unk>\"},\"decoder\":{\"type\":\"ByteLevel\"}}", "unk_token"},
        {"{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[]},\"decoder\":{\"type\":\"ByteLevel\"},\"added_tokens\":[{\"id\":1}]}", "added_tokens[0].content"},
        {"{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[]},\"decoder\":{\"type\":\"ByteLevel\"},\"added_tokens\":[{\"id\":1,\"content\":\"x\",\"single_word\":false,\"lstrip\":0,\"rstrip\":false,\"normalized\":false,\"special\":true}]}", "lstrip is an integer"},
        {"{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[]},\"decoder\":{\"type\":\"ByteLevel\"},\"normalizer\":{\"type\":\"Prepend\"}}", "prepend is missing"},
        {"{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[]},\"decoder\":{\"type\":\"ByteLevel\"},\"post_processor\":{\"type\":\"TemplateProcessing\",\"single\":[{\"SpecialToken\":{\"id\":\"<s>\",\"type_id\":0}},{\"Sequence\":{\"id\":\"A\",\"type_id\":0}}],\"special_tokens\":{}}}", "no ids for \"<s>\""},
        {"{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[]},\"decoder\":{\"type\":\"ByteLevel\"},\"truncation\":{\"max_length\":5}}", "truncation"},
        {"{\"model\":{\"vocab\":{\"a\":0},\"merges\":[]}}", "model.type is missing"},
        {"{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[],\"dropout\":0.1},\"decoder\":{\"type\":\"ByteLevel\"}}", "dropout"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        kiln_status st = compile_text(bad[i].text, &err);
        KT_CHECKF(st == KILN_ERR_PARSE || st == KILN_ERR_UNSUPPORTED, "case %zu: status %d (%s)", i, st, err.msg);
        KT_CONTAINS(err.msg, bad[i].msg);
        KT_CONTAINS(err.msg, "t.json");
    }
    /* tokenizer_config.json naming an unknown token */
    s = mini_json(NULL, NULL, NULL, NULL);
    const char *conf = "{\"bos_token\": \"<nope>\", \"add_bos_token\": true}";
    KT_EQ_INT(kiln_tokjson_compile_mem(s, strlen(s), conf, strlen(conf), "t.json", &blob, &err), KILN_ERR_PARSE);
    KT_CONTAINS(err.msg, "bos_token \"<nope>\"");
    kiln_buf_free(&blob);
    conf = "{\"bos_token\": {\"content\": \"a\"}, \"add_bos_token\": true, \"eos_token\": \"b\"}";
    KT_EQ_INT(kiln_tokjson_compile_mem(s, strlen(s), conf, strlen(conf), "t.json", &blob, &err), KILN_OK);
    KT_EQ_INT(kiln_tokenizer_load(blob.data, blob.len, &tok, &err), KILN_OK);
    if (tok) {
        KT_EQ_INT(kiln_tokenizer_bos(tok), 0);
        KT_EQ_INT(kiln_tokenizer_encode(tok, "b", 1, KILN_TOK_ADD_SPECIAL, &ids, &n, &err), KILN_OK);
        KT_EQ_INT(n, 2);
        if (n == 2) KT_EQ_INT(ids[0], 0);
        free(ids);
        kiln_tokenizer_free(tok);
    }
    kiln_buf_free(&blob);
    free(s);
    /* missing files */
    KT_EQ_INT(kiln_tokenizer_load_json("/nonexistent/tokenizer.json", &tok, &err), KILN_ERR_MISSING);
    KT_CONTAINS(err.msg, "/nonexistent/tokenizer.json");
}

/* Long runs stay fast (no quadratic BPE): 200k 'a' and 100k spaces. */
static void test_long_runs(void) {
    if (!have_shared()) KT_SKIP("%s is absent", TOKDIR);
    for (int w = 0; w < 3; w++) {
        const kiln_tokenizer *tok = get_tok(w);
        KT_REQUIRE(tok);
        size_t len = 200000;
        char *s = malloc(len);
        memset(s, 'a', len);
        double t0 = kiln_now();
        int32_t *ids;
        size_t n;
        kiln_error err = {0};
        KT_EQ_INT(kiln_tokenizer_encode(tok, s, len, 0, &ids, &n, &err), KILN_OK);
        char *back;
        size_t bl;
        KT_EQ_INT(kiln_tokenizer_decode(tok, ids, n, false, &back, &bl, &err), KILN_OK);
        KT_CHECK(bl == len && memcmp(back, s, len) == 0);
        free(back);
        free(ids);
        memset(s, ' ', len / 2);
        KT_EQ_INT(kiln_tokenizer_encode(tok, s, len / 2, 0, &ids, &n, &err), KILN_OK);
        free(ids);
        double dt = kiln_now() - t0;
        fprintf(stderr, "  %s: 200k 'a' + 100k ' ' in %.0f ms\n", kNames[w], dt * 1e3);
        KT_CHECK(dt < 20.0); /* generous for sanitizer builds; quadratic would take minutes */
        free(s);
    }
}

/* One tokenizer shared by four threads gives each the same ids as one thread
 * (encode and decode keep all state per call). */
typedef struct thread_job {
    const kiln_tokenizer *tok;
    json_t **corpus;
    size_t n;
    uint64_t hash;
    int failures;
} thread_job;

static void *thread_encode(void *arg) {
    thread_job *j = arg;
    for (int rep = 0; rep < 2; rep++)
        for (size_t i = 0; i < j->n; i++) {
            int32_t *ids;
            size_t n;
            kiln_error err;
            if (kiln_tokenizer_encode(j->tok, json_string_value(j->corpus[i]), json_string_length(j->corpus[i]), 0, &ids, &n,
                                      &err) != KILN_OK) {
                j->failures++;
                continue;
            }
            char *text;
            size_t len;
            if (kiln_tokenizer_decode(j->tok, ids, n, false, &text, &len, &err) != KILN_OK) j->failures++;
            else free(text);
            if (rep == 0)
                for (size_t k = 0; k < n; k++) j->hash = j->hash * 1000003u + (uint64_t)ids[k];
            free(ids);
        }
    return NULL;
}

static void test_threads(void) {
    if (!have_shared()) KT_SKIP("%s is absent", TOKDIR);
    size_t nc = 0;
    json_t **corpus = read_jsonl(GOLDEN "corpus.jsonl", &nc);
    KT_REQUIRE(corpus);
    for (int w = 0; w < 3; w++) {
        thread_job one = {get_tok(w), corpus, nc, 0, 0};
        thread_encode(&one);
        thread_job jobs[4];
        pthread_t th[4];
        for (int k = 0; k < 4; k++) {
            jobs[k] = one;
            jobs[k].hash = 0;
            pthread_create(&th[k], NULL, thread_encode, &jobs[k]);
        }
        for (int k = 0; k < 4; k++) {
            pthread_join(th[k], NULL);
            KT_EQ_INT(jobs[k].failures, 0);
            KT_CHECK(jobs[k].hash == one.hash);
        }
    }
    free_rows(corpus, nc);
}

/* ---- kiln tokenize ---- */

typedef struct cmd_result {
    int rc;
    char out[65536], err[8192];
} cmd_result;

static void run_cmd(cmd_result *r, const char *input, size_t in_len, int argc, char **argv) {
    char in_path[] = "/tmp/kiln_tok_inXXXXXX", out_path[] = "/tmp/kiln_tok_outXXXXXX", err_path[] = "/tmp/kiln_tok_errXXXXXX";
    int fi = mkstemp(in_path), fo = mkstemp(out_path), fe = mkstemp(err_path);
    if (in_len && write(fi, input, in_len) != (ssize_t)in_len) fprintf(stderr, "write failed\n");
    lseek(fi, 0, SEEK_SET);
    fflush(stdout);
    fflush(stderr);
    int s0 = dup(0), s1 = dup(1), s2 = dup(2);
    dup2(fi, 0);
    dup2(fo, 1);
    dup2(fe, 2);
    clearerr(stdin);
    r->rc = kiln_cmd_tokenize(argc, argv);
    fflush(stdout);
    fflush(stderr);
    dup2(s0, 0);
    dup2(s1, 1);
    dup2(s2, 2);
    close(s0);
    close(s1);
    close(s2);
    clearerr(stdin);
    memset(r->out, 0, sizeof r->out);
    memset(r->err, 0, sizeof r->err);
    lseek(fo, 0, SEEK_SET);
    lseek(fe, 0, SEEK_SET);
    ssize_t k = read(fo, r->out, sizeof r->out - 1);
    (void)k;
    k = read(fe, r->err, sizeof r->err - 1);
    (void)k;
    close(fi);
    close(fo);
    close(fe);
    unlink(in_path);
    unlink(out_path);
    unlink(err_path);
}

static void test_cmd_tokenize(void) {
    if (!have_shared()) KT_SKIP("%s is absent", TOKDIR);
    static cmd_result r;
    char *dir = TOKDIR "llama2", *file = TOKDIR "llama2/tokenizer.json";
    char *a1[] = {"tokenize", dir};
    /* the default follows tokenizer_config.json's add_bos_token (true here), as `kiln run --prompt` does */
    run_cmd(&r, "Hello world", 11, 2, a1);
    KT_EQ_INT(r.rc, 0);
    KT_EQ_STR(r.out, "[1, 22557, 1526]\n");
    char *a1n[] = {"tokenize", dir, "--no-bos"};
    run_cmd(&r, "Hello world", 11, 3, a1n);
    KT_EQ_INT(r.rc, 0);
    KT_EQ_STR(r.out, "[22557, 1526]\n");
    char *a1c[] = {"tokenize", dir, "--bos", "--no-bos"};
    run_cmd(&r, "Hello world", 11, 4, a1c);
    KT_EQ_INT(r.rc, 2);
    KT_CONTAINS(r.err, "kiln tokenize: error: --bos and --no-bos");
    char *a2[] = {"tokenize", file, "--special"};
    run_cmd(&r, "Hello world", 11, 3, a2);
    KT_EQ_STR(r.out, "[1, 22557, 1526]\n");
    char *a3[] = {"tokenize", dir, "--decode"};
    run_cmd(&r, "[1, 22557, 1526]", 16, 3, a3);
    KT_EQ_INT(r.rc, 0);
    KT_EQ_STR(r.out, "<s> Hello world");
    char *a4[] = {"tokenize", dir, "--decode", "--skip-special", "--json"};
    run_cmd(&r, "[1, 22557, 1526]", 16, 5, a4);
    KT_EQ_STR(r.out, "{\"text\": \"Hello world\"}\n");
    char *a5[] = {"tokenize", TOKDIR "qwen3", "--json"};
    run_cmd(&r, "<|im_start|>hi", 14, 3, a5);
    KT_EQ_STR(r.out, "{\"ids\": [151644, 6023], \"tokens\": [\"<|im_start|>\", \"hi\"]}\n");
    char *a6[] = {"tokenize", TOKDIR "qwen3", "--no-special"};
    run_cmd(&r, "<|im_start|>", 12, 3, a6);
    KT_EQ_STR(r.out, "[27, 91, 318, 4906, 91, 29]\n");
    /* errors */
    run_cmd(&r, "ab\xFF", 3, 2, a1);
    KT_EQ_INT(r.rc, 1);
    KT_CONTAINS(r.err, "kiln tokenize: error: ");
    KT_CONTAINS(r.err, "byte offset 2");
    KT_EQ_STR(r.out, "");
    char *b1[] = {"tokenize", "/nonexistent/dir"};
    run_cmd(&r, "", 0, 2, b1);
    KT_EQ_INT(r.rc, 1);
    KT_CONTAINS(r.err, "/nonexistent/dir");
    char *b2[] = {"tokenize", dir, "--frobnicate"};
    run_cmd(&r, "", 0, 3, b2);
    KT_EQ_INT(r.rc, 2);
    KT_CONTAINS(r.err, "--frobnicate");
    char *b3[] = {"tokenize"};
    run_cmd(&r, "", 0, 1, b3);
    KT_EQ_INT(r.rc, 2);
    run_cmd(&r, "[1, \"x\"]", 8, 3, a3);
    KT_EQ_INT(r.rc, 1);
    KT_CONTAINS(r.err, "element 1");
    run_cmd(&r, "[1, 99999999]", 13, 3, a3);
    KT_EQ_INT(r.rc, 1);
    KT_CONTAINS(r.err, "99999999");
    run_cmd(&r, "[1,", 3, 3, a3);
    KT_EQ_INT(r.rc, 1);
    char *h[] = {"tokenize", "--help"};
    run_cmd(&r, "", 0, 2, h);
    KT_EQ_INT(r.rc, 0);
    KT_CONTAINS(r.out, "usage: kiln tokenize");
    /* a file that is not a tokenizer */
    char *b4[] = {"tokenize", KILN_SOURCE_DIR "/CMakeLists.txt"};
    run_cmd(&r, "x", 1, 2, b4);
    KT_EQ_INT(r.rc, 1);
    KT_CONTAINS(r.err, "CMakeLists.txt");

    /* an engine file holding the tokenizer section */
    kiln_buf blob = {0};
    kiln_error err = {0};
    KT_EQ_INT(kiln_tokjson_compile(file, TOKDIR "llama2/tokenizer_config.json", &blob, &err), KILN_OK);
    char eng[4096];
    snprintf(eng, sizeof eng, "%s/test_tokenizer.kiln", KILN_BINARY_DIR);
    kiln_engine_writer *w = NULL;
    kiln_status st = kiln_engine_writer_open(eng, &w, &err);
    if (st == KILN_OK) st = kiln_engine_writer_section(w, KILN_SECTION_META, KILN_CODEC_NONE, "{}", 2, &err);
    if (st == KILN_OK) st = kiln_engine_writer_section(w, KILN_SECTION_TOKENIZER, KILN_CODEC_ZSTD_CHUNKED, blob.data, blob.len, &err);
    if (st == KILN_OK) st = kiln_engine_writer_finish(w, &err);
    else kiln_engine_writer_abort(w);
    kiln_buf_free(&blob);
    KT_CHECKF(st == KILN_OK, "engine writer: %s", err.msg);
    if (st == KILN_OK) {
        char *e1[] = {"tokenize", eng, "--special"};
        run_cmd(&r, "Hello world", 11, 3, e1);
        KT_EQ_INT(r.rc, 0);
        KT_EQ_STR(r.out, "[1, 22557, 1526]\n");
        unlink(eng);
    }
}

/* ---- benchmark driver (bench/bench_tokenizer.sh) ----
 * --bench TOKENIZER_DIR FILE: encode FILE line by line (each line with its
 * newline, as the Python side does), print one JSON line. */
static int bench(const char *dir, const char *file) {
    kiln_error err = {0};
    char path[4096];
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    kiln_buf blob = {0};
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    char jpath[4096];
    snprintf(jpath, sizeof jpath, "%s/tokenizer.json", dir);
    if (kiln_tokjson_compile(jpath, kiln_path_exists(path) ? path : NULL, &blob, &err) != KILN_OK) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    kiln_tokenizer *tok = NULL;
    double best_load = 1e9;
    for (int i = 0; i < 5; i++) {
        double t0 = kiln_now();
        if (kiln_tokenizer_load(blob.data, blob.len, &tok, &err) != KILN_OK) {
            fprintf(stderr, "%s\n", err.msg);
            return 1;
        }
        double dt = kiln_now() - t0;
        if (dt < best_load) best_load = dt;
        if (i < 4) kiln_tokenizer_free(tok);
    }
    char *text;
    size_t len;
    if (kiln_file_read(file, 1u << 30, &text, &len, &err) != KILN_OK) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    size_t total_ids = 0;
    uint64_t hash = 0; /* order-sensitive, the same as bench_tokenizer.py's, to check the ids match */
    double t0 = kiln_now();
    size_t at = 0;
    while (at < len) {
        const char *nl = memchr(text + at, '\n', len - at);
        size_t end = nl ? (size_t)(nl - text) + 1 : len;
        int32_t *ids;
        size_t n;
        if (kiln_tokenizer_encode(tok, text + at, end - at, 0, &ids, &n, &err) != KILN_OK) {
            fprintf(stderr, "%s\n", err.msg);
            return 1;
        }
        total_ids += n;
        for (size_t i = 0; i < n; i++) hash = hash * 1000003u + (uint64_t)ids[i];
        free(ids);
        at = end;
    }
    double dt = kiln_now() - t0;
    printf("{\"impl\": \"kiln\", \"bytes\": %zu, \"seconds\": %.4f, \"ids\": %zu, \"ids_hash\": \"%016llx\", \"load_ms\": %.2f, "
           "\"blob_bytes\": %zu}\n", len, dt, total_ids, (unsigned long long)hash, best_load * 1e3, blob.len);
    free(text);
    kiln_buf_free(&blob);
    kiln_tokenizer_free(tok);
    return 0;
}

int main(int argc, char **argv) {
    if (argc == 4 && !strcmp(argv[1], "--bench")) return bench(argv[2], argv[3]);
    KT_RUN(test_mini_and_refusals);
    KT_RUN(test_invalid_utf8);
    KT_RUN(test_accessors);
    KT_RUN(test_golden_llama2);
    KT_RUN(test_golden_llama3);
    KT_RUN(test_golden_qwen3);
    KT_RUN(test_golden_synth_added_flags);
    KT_RUN(test_golden_unk);
    KT_RUN(test_long_runs);
    KT_RUN(test_threads);
    KT_RUN(test_cmd_tokenize);
    for (int i = 0; i < 3; i++) kiln_tokenizer_free(g_loaded[i]);
    return KT_END();
}
