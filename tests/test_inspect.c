/*
 * test_inspect.c — `kiln inspect` refuses engines whose sections disagree.
 *
 * One good engine is compiled from tests/data/tiny-mistral (no kernels, no
 * tokenizer). Each case rebuilds it with the engine writer, the meta JSON
 * edited by one rule (or a kernels / tokenizer section added), so checksums
 * are valid and only the cross-check can catch it; kiln_inspect_verify must
 * fail with a message naming both values, and the `kiln inspect` binary must
 * exit 1. Consistent variants (a tokenizer that fits, a kernels section that
 * matches meta's targets and block size) must pass.
 */
#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "compiler/cli.h"
#include "compiler/kiln_tokjson.h"
#include "fuzz/tiny_tokenizer.h"
#include "kt.h"
#include "kt_fixture.h"
#include "../format/kiln_ksec.h"
#include "runtime/kiln_rt.h"

static char dir[512], good[600];

/* Extra sections a case adds. */
typedef struct extra {
    const kiln_buf *kernels, *tokenizer;
} extra;

/* Rewrite `good` to path: meta edited by `edit` (may be NULL), extras added. */
static bool rewrite(const char *path, void (*edit)(json_t *meta, const void *arg), const void *arg, const extra *x) {
    kiln_engine e;
    kiln_error err = {0};
    if (kiln_engine_open(good, &e, &err) != KILN_OK) return false;
    kiln_engine_writer *w = NULL;
    kiln_status st = kiln_engine_writer_open(path, &w, &err);
    for (uint32_t i = 0; st == KILN_OK && i < e.n_sections; i++) {
        const kiln_engine_section *s = &e.sections[i];
        const uint8_t *d;
        size_t n;
        bool owned;
        if ((st = kiln_engine_section_bytes(&e, s, 1, &d, &n, &owned, &err)) != KILN_OK) break;
        if (s->kind == KILN_SECTION_META) {
            json_t *meta = json_loadb((const char *)d, n, 0, NULL);
            if (edit) edit(meta, arg);
            char *text = json_dumps(meta, JSON_COMPACT);
            st = kiln_engine_writer_section(w, s->kind, KILN_CODEC_NONE, text, strlen(text), &err);
            free(text);
            json_decref(meta);
        } else {
            st = kiln_engine_writer_section(w, s->kind, s->codec, d, n, &err);
        }
        if (owned) free((void *)d);
    }
    if (st == KILN_OK && x && x->kernels)
        st = kiln_engine_writer_section(w, KILN_SECTION_KERNELS, KILN_CODEC_NONE, x->kernels->data, x->kernels->len, &err);
    if (st == KILN_OK && x && x->tokenizer)
        st = kiln_engine_writer_section(w, KILN_SECTION_TOKENIZER, KILN_CODEC_ZSTD_CHUNKED, x->tokenizer->data,
                                        x->tokenizer->len, &err);
    if (st == KILN_OK) st = kiln_engine_writer_finish(w, &err);
    else kiln_engine_writer_abort(w);
    kiln_engine_close(&e);
    if (st != KILN_OK) fprintf(stderr, "  rewrite: %s\n", err.msg);
    return st == KILN_OK;
}

/* Open path and verify it: the status, and the message in *msg. */
static kiln_status verify(const char *path, char *msg, size_t cap) {
    kiln_model *m = NULL;
    kiln_error err = {0};
    kiln_inspect_kernels k;
    kiln_status st = kiln_model_open_ex(path, 1, KILN_MODEL_NO_F32, &m, &err);
    if (st == KILN_OK) st = kiln_inspect_verify(m, &k, &err);
    snprintf(msg, cap, "%s", err.msg);
    kiln_model_close(m);
    return st;
}

/* `kiln inspect path`'s exit code (stdout and stderr to /dev/null). */
static int cli_inspect(const char *path) {
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "'%s' inspect '%s' >/dev/null 2>&1", KILN_EXE, path);
    int rc = system(cmd);
    return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

/* ---- meta edits: a JSON path and a value ---- */

typedef struct setting {
    const char *obj, *key, *value; /* meta[obj][key] = value (JSON text); obj NULL = top level; value NULL = delete */
} setting;

static void apply(json_t *meta, const void *arg) {
    const setting *s = arg;
    json_t *o = s->obj ? json_object_get(meta, s->obj) : meta;
    if (!s->value) json_object_del(o, s->key);
    else json_object_set_new(o, s->key, json_loads(s->value, JSON_DECODE_ANY, NULL));
}

/* The engine with meta[obj][key] = value must be refused, naming each of want[]. */
static void refused(const char *label, setting s, const char *want1, const char *want2, const extra *x) {
    char path[700], msg[KILN_ERR_MSG_MAX];
    snprintf(path, sizeof path, "%s/bad.kiln", dir);
    KT_REQUIRE(rewrite(path, apply, &s, x));
    kiln_status st = verify(path, msg, sizeof msg);
    KT_CHECKF(st == KILN_ERR_FORMAT, "%s: status %d (%s)", label, st, msg);
    KT_CHECKF(strstr(msg, want1) != NULL, "%s: message '%s' lacks '%s'", label, msg, want1);
    KT_CHECKF(!want2 || strstr(msg, want2) != NULL, "%s: message '%s' lacks '%s'", label, msg, want2);
    KT_CHECKF(cli_inspect(path) == 1, "%s: kiln inspect did not exit 1", label);
    unlink(path);
}

static void accepted(const char *label, setting s, const extra *x) {
    char path[700], msg[KILN_ERR_MSG_MAX];
    snprintf(path, sizeof path, "%s/ok.kiln", dir);
    KT_REQUIRE(rewrite(path, s.key ? apply : NULL, &s, x));
    kiln_status st = verify(path, msg, sizeof msg);
    KT_CHECKF(st == KILN_OK, "%s: refused: %s", label, msg);
    KT_CHECKF(cli_inspect(path) == 0, "%s: kiln inspect did not exit 0", label);
    unlink(path);
}

static void test_good(void) {
    char msg[KILN_ERR_MSG_MAX];
    KT_EQ_INT(verify(good, msg, sizeof msg), KILN_OK);
    accepted("rewritten unchanged", (setting){0}, NULL);
    /* generation keys inspect does not know are fine (printed generically) */
    accepted("extra generation key", (setting){"generation", "temperature", "0.7"}, NULL);
}

/* tiny-mistral: vocab 256, 2 layers, hidden 64, 4 heads / 2 KV heads, head_dim 16, context 256 */
static void test_meta_vs_plan(void) {
    refused("vocab", (setting){"model", "vocab_size", "999"}, "vocab_size is 999", "256", NULL);
    refused("layers", (setting){"model", "num_hidden_layers", "3"}, "num_hidden_layers is 3", "is 2", NULL);
    refused("hidden", (setting){"model", "hidden_size", "65"}, "hidden_size is 65", "is 64", NULL);
    refused("kv heads", (setting){"model", "num_key_value_heads", "1"}, "num_key_value_heads is 1", "is 2", NULL);
    refused("head_dim", (setting){"model", "head_dim", "32"}, "head_dim is 32", "is 16", NULL);
    refused("heads", (setting){"model", "num_attention_heads", "8"}, "has 4 heads", "says 8", NULL);
    refused("heads type", (setting){"model", "num_attention_heads", "\"4\""}, "num_attention_heads", "not an integer", NULL);
    refused("max pos", (setting){"model", "max_position_embeddings", "100"}, "max_position_embeddings is 100", "256", NULL);
    refused("max context", (setting){"generation", "max_context", "999"}, "max_context is 999", "256", NULL);
    refused("no model", (setting){NULL, "model", NULL}, "no 'model' object", NULL, NULL);
    refused("format", (setting){"format_version", "major", "1"}, "format_version.major is 1", "is 2", NULL);
}

static void test_meta_generation(void) {
    refused("bos", (setting){"generation", "bos_token_id", "300"}, "bos_token_id 300", "256", NULL);
    refused("bos negative", (setting){"generation", "bos_token_id", "-7"}, "bos_token_id -7", NULL, NULL);
    refused("eos", (setting){"generation", "eos_token_ids", "[2, 256]"}, "eos_token_ids[1] = 256", "256", NULL);
    refused("eos type", (setting){"generation", "eos_token_ids", "[\"2\"]"}, "eos_token_ids[0]", NULL, NULL);
    refused("generation type", (setting){NULL, "generation", "[]"}, "generation is not an object", NULL, NULL);
    /* 2^32 + 1 must not pass for 1 through an int32 cast */
    refused("bos wide", (setting){"generation", "bos_token_id", "4294967297"}, "bos_token_id 4294967297", NULL, NULL);
    /* the loader, which `kiln run` uses, refuses a bos or eos outside the vocabulary (a run would stop at
     * the wrong token or never) */
    char path[700];
    snprintf(path, sizeof path, "%s/gen.kiln", dir);
    setting wide_bos = {"generation", "bos_token_id", "4294967297"}, big_eos = {"generation", "eos_token_ids", "[2222, 2]"};
    kiln_model *m = NULL;
    kiln_error err = {0};
    KT_REQUIRE(rewrite(path, apply, &wide_bos, NULL));
    KT_EQ_INT(kiln_model_open_ex(path, 1, KILN_MODEL_NO_F32, &m, &err), KILN_ERR_FORMAT);
    KT_CONTAINS(err.msg, "bos_token_id 4294967297 is outside the model's vocabulary");
    KT_REQUIRE(rewrite(path, apply, &big_eos, NULL));
    KT_EQ_INT(kiln_model_open_ex(path, 1, KILN_MODEL_NO_F32, &m, &err), KILN_ERR_FORMAT);
    KT_CONTAINS(err.msg, "eos_token_ids[0] = 2222 is not an id in the model's vocabulary of 256");
    unlink(path);
}

static void test_meta_vs_weights(void) {
    kiln_model *m = NULL;
    kiln_error err = {0};
    KT_REQUIRE(kiln_model_open_ex(good, 1, KILN_MODEL_NO_F32, &m, &err) == KILN_OK);
    char bytes[32], want[64];
    snprintf(bytes, sizeof bytes, "%zu", m->weights_size + 256);
    snprintf(want, sizeof want, "size is %zu", m->weights_size);
    kiln_model_close(m);
    refused("weights bytes", (setting){"weights", "bytes", bytes}, bytes, want, NULL);
    refused("weights count", (setting){"weights", "count", "5"}, "weights.count is 5", "is 15", NULL); /* 21 tensors, QKV and gate/up packed */
    refused("weights codec", (setting){"weights", "codec", "\"zstd-chunked\""}, "'zstd-chunked'", "stored 'none'", NULL);
    refused("weights dtype", (setting){"weights", "dtype", "\"f16\""}, "weights.dtype is 'f16'", "is bf16", NULL);
    refused("targets without kernels", (setting){NULL, "targets", "[\"sm_80\"]"}, "1 GPU targets",
            "no kernels section", NULL);
}

/* A kernels section (kiln_ksec.h): module "util" with a cubin for sm_80, and
 * "sample" sharing its source and image. */
static void make_ksec(kiln_buf *b, uint32_t version, uint32_t block) {
    uint8_t head[32] = "KKRN", mod[KILN_KSEC_MODULE_SIZE] = "util", mod2[KILN_KSEC_MODULE_SIZE] = "sample",
            img[32] = {0};
    kiln_wr_u32(head + 4, version);
    kiln_wr_u32(head + 8, 2);
    kiln_wr_u32(head + 12, 1);
    kiln_wr_u32(head + 16, KILN_KSEC_ELEM_BF16);
    kiln_wr_u32(head + 20, block);
    kiln_wr_u64(mod + 80, 0);
    kiln_wr_u64(mod + 88, 16); /* source: the first 16 data bytes */
    kiln_wr_u32(mod + 96, KILN_KSEC_OWN);
    kiln_wr_u32(mod2 + 96, 0); /* shares util's */
    kiln_wr_u32(img + 0, 0);
    kiln_wr_u32(img + 4, 80);
    kiln_wr_u32(img + 8, KILN_KSEC_CUBIN);
    kiln_wr_u64(img + 16, 16);
    kiln_wr_u64(img + 24, 16);
    kiln_buf_append(b, head, sizeof head);
    kiln_buf_append(b, mod, sizeof mod);
    kiln_buf_append(b, mod2, sizeof mod2);
    kiln_buf_append(b, img, sizeof img);
    kiln_buf_append(b, "// util source..\x7f" "ELF cubin bytes", 32);
}

static void set_targets_block(json_t *meta, const void *arg) {
    json_object_set_new(meta, "targets", json_loads("[\"sm_80\"]", 0, NULL));
    json_object_set_new(json_object_get(meta, "build"), "kv_block_size", json_integer(*(const int *)arg));
}

static void test_kernels(void) {
    kiln_buf ks = {0}, bad = {0};
    make_ksec(&ks, KILN_KSEC_VERSION, 16);
    make_ksec(&bad, KILN_KSEC_VERSION + 7, 16);
    extra x = {.kernels = &ks}, xb = {.kernels = &bad};
    char path[700], msg[KILN_ERR_MSG_MAX];
    snprintf(path, sizeof path, "%s/k.kiln", dir);
    int block = 16;
    KT_REQUIRE(rewrite(path, set_targets_block, &block, &x));
    KT_CHECKF(verify(path, msg, sizeof msg) == KILN_OK, "matching kernels section refused: %s", msg);
    KT_EQ_INT(cli_inspect(path), 0);
    block = 32;
    KT_REQUIRE(rewrite(path, set_targets_block, &block, &x));
    KT_EQ_INT(verify(path, msg, sizeof msg), KILN_ERR_FORMAT);
    KT_CONTAINS(msg, "kv_block_size is 32 but the kernels section is built for 16");
    KT_EQ_INT(cli_inspect(path), 1);
    /* meta lists no target, but the section has an sm_80 image */
    refused("unlisted image", (setting){NULL, "targets", "[]"}, "image for sm_80", "does not list", &x);
    refused("missing image", (setting){NULL, "targets", "[\"sm_80\", \"compute_90\"]"}, "'compute_90' has no image",
            NULL, &x);
    /* the section itself is parsed: a version this kiln does not read */
    block = 16;
    KT_REQUIRE(rewrite(path, set_targets_block, &block, &xb));
    KT_EQ_INT(verify(path, msg, sizeof msg), KILN_ERR_VERSION);
    char want[64];
    snprintf(want, sizeof want, "kernels section: version %d, this runtime reads version %d", KILN_KSEC_VERSION + 7,
             KILN_KSEC_VERSION);
    KT_CONTAINS(msg, want);
    KT_EQ_INT(cli_inspect(path), 1);
    unlink(path);
    kiln_buf_free(&ks);
    kiln_buf_free(&bad);
}

static void set_tokenizer(json_t *meta, const void *arg) {
    const kiln_buf *b = arg;
    json_object_set_new(meta, "tokenizer", json_pack("{s:I}", "bytes", (json_int_t)b->len));
}

static void test_tokenizer(void) {
    kiln_buf tiny = {0}, wide = {0};
    kiln_error err = {0};
    KT_REQUIRE(kiln_tokjson_compile_mem(kTinyTokenizerJson, sizeof kTinyTokenizerJson - 1, kTinyTokenizerConfig,
                                        strlen(kTinyTokenizerConfig), "tiny", &tiny, &err) == KILN_OK);
    KT_REQUIRE(kiln_tokjson_compile_mem(kByteLevelTokenizerJson, sizeof kByteLevelTokenizerJson - 1, NULL, 0, "wide",
                                        &wide, &err) == KILN_OK);
    char path[700], msg[KILN_ERR_MSG_MAX];
    snprintf(path, sizeof path, "%s/t.kiln", dir);
    extra x = {.tokenizer = &tiny}, xw = {.tokenizer = &wide};
    /* 138 ids in a vocabulary of 256, bos 1 = the tokenizer's <s> */
    KT_REQUIRE(rewrite(path, set_tokenizer, &tiny, &x));
    KT_CHECKF(verify(path, msg, sizeof msg) == KILN_OK, "fitting tokenizer refused: %s", msg);
    /* meta says no tokenizer, or another size */
    KT_REQUIRE(rewrite(path, NULL, NULL, &x));
    KT_EQ_INT(verify(path, msg, sizeof msg), KILN_ERR_FORMAT);
    KT_CONTAINS(msg, "meta tokenizer is null but the engine has a tokenizer section");
    refused("no tokenizer section", (setting){NULL, "tokenizer", "{\"bytes\": 5}"}, "meta tokenizer is set",
            "engine has no tokenizer section", NULL);
    /* a tokenizer with ids past the model's vocabulary */
    KT_REQUIRE(rewrite(path, set_tokenizer, &wide, &xw));
    KT_EQ_INT(verify(path, msg, sizeof msg), KILN_ERR_FORMAT);
    KT_CONTAINS(msg, "the model's vocabulary is 256");
    KT_EQ_INT(cli_inspect(path), 1);
    unlink(path);
    kiln_buf_free(&tiny);
    kiln_buf_free(&wide);
}

int main(void) {
    if (!kt_tmpdir(dir, sizeof dir, "inspect")) {
        fprintf(stderr, "cannot make a temporary folder\n");
        return 1;
    }
    snprintf(good, sizeof good, "%s/good.kiln", dir);
    kiln_compile_options opt = {.output_path = good, .weight_dtype = KILN_DTYPE_COUNT_, .targets = "none"};
    if (kt_compile(KILN_SOURCE_DIR "/tests/data/tiny-mistral", &opt) != KILN_OK) return 1;
    KT_RUN(test_good);
    KT_RUN(test_meta_vs_plan);
    KT_RUN(test_meta_generation);
    KT_RUN(test_meta_vs_weights);
    KT_RUN(test_kernels);
    KT_RUN(test_tokenizer);
    unlink(good);
    rmdir(dir);
    return KT_END();
}
