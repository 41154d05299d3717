/*
 * test_checkpoint.c — checkpoint directories: the real single-file
 * (stories260k) and sharded (pycode-22m) models, and one test per refusal,
 * on small directories written to a temp dir.
 */
#include "../compiler/kiln_compiler.h"
#include "kt.h"

#include <dirent.h>
#include <stdint.h>
#include <stdlib.h>
#include <unistd.h>

static const char *const MINI_CFG =
    "{\"architectures\":[\"LlamaForCausalLM\"],\"hidden_size\":8,\"num_hidden_layers\":1,"
    "\"num_attention_heads\":2,\"intermediate_size\":16,\"vocab_size\":4,\"max_position_embeddings\":16,"
    "\"rms_norm_eps\":1e-5,\"rope_theta\":10000.0}";

/* A one-F32-tensor-per-name header for `names` laid out back to back, 4 floats each. */
static const char *const HDR_AB = "{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]},"
                                  "\"b\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[16,32]}}";
static const char *const HDR_C = "{\"c\":{\"dtype\":\"BF16\",\"shape\":[2,2],\"data_offsets\":[0,8]}}";
static const char *const HDR_BC = "{\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
                                  "\"c\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}";

/* ---- temp dir helpers ---- */

static char *make_tmpdir(void) {
    char *d = strdup("/tmp/kiln_test_ckpt_XXXXXX");
    if (!mkdtemp(d)) {
        perror("mkdtemp");
        abort();
    }
    return d;
}

static void rm_tmpdir(char *dir) {
    DIR *d = opendir(dir);
    if (d) {
        struct dirent *e;
        while ((e = readdir(d))) {
            if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
            char *p = kiln_path_join(dir, e->d_name);
            unlink(p);
            free(p);
        }
        closedir(d);
    }
    rmdir(dir);
    free(dir);
}

static void write_file(const char *dir, const char *name, const void *p, size_t n) {
    char *path = kiln_path_join(dir, name);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(p, 1, n, f) != n) {
        perror(path);
        abort();
    }
    fclose(f);
    free(path);
}

static void write_text(const char *dir, const char *name, const char *text) {
    write_file(dir, name, text, strlen(text));
}

/* A safetensors file: header text + data_len bytes (byte i = i). */
static void write_st(const char *dir, const char *name, const char *header, size_t data_len) {
    size_t h = strlen(header), n = 8 + h + data_len;
    uint8_t *p = malloc(n);
    kiln_wr_u64(p, h);
    memcpy(p + 8, header, h);
    for (size_t i = 0; i < data_len; i++) p[8 + h + i] = (uint8_t)i;
    write_file(dir, name, p, n);
    free(p);
}

/* A dir with MINI_CFG and shards s1 (a, b) and s2 (c) plus an index. */
static char *sharded_dir(const char *index) {
    char *d = make_tmpdir();
    write_text(d, "config.json", MINI_CFG);
    write_st(d, "s1.safetensors", HDR_AB, 32);
    write_st(d, "s2.safetensors", HDR_C, 8);
    write_text(d, "model.safetensors.index.json", index);
    return d;
}

static const char *const GOOD_INDEX =
    "{\"metadata\":{\"total_size\":40},\"weight_map\":{\"a\":\"s1.safetensors\",\"b\":\"s1.safetensors\","
    "\"c\":\"s2.safetensors\"}}";

/* Open `dir`, expect `code` and a message containing `n1` and `n2` (NULL: skip). */
static void expect_open_fail(const char *dir, kiln_status code, const char *n1, const char *n2) {
    kiln_checkpoint ck;
    kiln_error e = {0};
    KT_EQ_INT(kiln_checkpoint_open(dir, &ck, &e), code);
    KT_EQ_INT(e.code, code);
    if (n1) KT_CONTAINS(e.msg, n1);
    if (n2) KT_CONTAINS(e.msg, n2);
    /* a failed open leaves nothing to close */
    KT_CHECK(ck.shards == NULL && ck.index == NULL && ck.dir == NULL && ck.n_index == 0);
}

/* ---- real models ---- */

static void test_stories260k(void) {
    kiln_checkpoint ck;
    kiln_error e = {0};
    kiln_status st = kiln_checkpoint_open(KILN_SOURCE_DIR "/models/stories260k", &ck, &e);
    KT_CHECKF(st == KILN_OK, "%s", e.msg);
    if (st) return;
    KT_EQ_INT(ck.n_shards, 1);
    KT_EQ_INT(ck.n_index, 47);
    KT_EQ_INT(ck.config.arch, KILN_ARCH_LLAMA);
    KT_CHECK(ck.config.tie_word_embeddings);
    for (size_t i = 1; i < ck.n_index; i++) KT_CHECK(strcmp(ck.index[i - 1]->name, ck.index[i]->name) < 0);
    const kiln_st_tensor *t = kiln_checkpoint_find(&ck, "model.embed_tokens.weight");
    KT_REQUIRE(t != NULL);
    KT_EQ_INT(t->ndim, 2);
    KT_EQ_INT(t->shape[0], 512);
    KT_EQ_INT(t->shape[1], 64);
    KT_EQ_INT(t->dtype, KILN_DTYPE_F32);
    t = kiln_checkpoint_find(&ck, "model.layers.4.self_attn.k_proj.weight");
    KT_REQUIRE(t != NULL);
    KT_EQ_INT(t->shape[0], 32); /* 4 kv heads * head_dim 8 */
    KT_EQ_INT(t->shape[1], 64);
    KT_CHECK(kiln_checkpoint_find(&ck, "lm_head.weight") == NULL); /* tied */
    KT_CHECK(kiln_checkpoint_find(&ck, "model.layers.5.mlp.up_proj.weight") == NULL);
    KT_CHECK(kiln_checkpoint_find(&ck, "") == NULL);
    kiln_checkpoint_close(&ck);
    KT_CHECK(ck.shards == NULL && ck.index == NULL);
}

static void test_pycode_sharded(void) {
    const char *dir = KILN_SHARED_DIR "/models/pycode-22m";
    if (!kiln_path_is_dir(dir)) KT_SKIP("%s is absent", dir);
    kiln_checkpoint ck;
    kiln_error e = {0};
    kiln_status st = kiln_checkpoint_open(dir, &ck, &e);
    KT_CHECKF(st == KILN_OK, "%s", e.msg);
    if (st) return;
    KT_EQ_INT(ck.n_shards, 2);
    KT_EQ_INT(ck.n_index, 56); /* 6 layers * 9 + embed + norm, as the index lists */
    KT_EQ_INT(ck.config.arch, KILN_ARCH_MISTRAL);
    KT_EQ_INT(ck.config.sliding_window, 256);
    const kiln_st_tensor *t = kiln_checkpoint_find(&ck, "model.embed_tokens.weight"); /* in shard 1 */
    KT_REQUIRE(t != NULL);
    KT_EQ_INT(t->dtype, KILN_DTYPE_BF16);
    KT_EQ_INT(t->shape[0], 32000);
    KT_EQ_INT(t->shape[1], 384);
    t = kiln_checkpoint_find(&ck, "model.norm.weight"); /* in shard 2 */
    KT_REQUIRE(t != NULL);
    KT_EQ_INT(t->dtype, KILN_DTYPE_BF16);
    KT_EQ_INT(t->shape[0], 384);
    /* bf16 bits from the reference reader:
     *   python3 -c "from safetensors.torch import load_file as l; import torch;
     *     print(l('.../model-00002-of-00002.safetensors')['model.norm.weight'][:2].view(torch.int16).tolist())"
     *   → [16339, 16392] (1.6484375, 2.125) */
    uint16_t h0 = (uint16_t)(t->data[0] | t->data[1] << 8), h1 = (uint16_t)(t->data[2] | t->data[3] << 8);
    KT_EQ_INT(h0, 16339);
    KT_EQ_INT(h1, 16392);
    KT_CHECK(kiln_bf16_to_f32(h0) == 1.6484375f);
    KT_CHECK(kiln_checkpoint_find(&ck, "lm_head.weight") == NULL);
    KT_REQUIRE(ck.tokenizer_json_path != NULL);
    KT_CONTAINS(ck.tokenizer_json_path, "pycode-22m/tokenizer.json");
    KT_REQUIRE(ck.tokenizer_config_path != NULL);
    KT_CONTAINS(ck.tokenizer_config_path, "pycode-22m/tokenizer_config.json");
    kiln_checkpoint_close(&ck);
}

/* ---- small directories that work ---- */

static void test_indexed(void) {
    char *d = sharded_dir(GOOD_INDEX);
    write_text(d, "tokenizer.json", "{}");
    kiln_checkpoint ck;
    kiln_error e = {0};
    kiln_status st = kiln_checkpoint_open(d, &ck, &e);
    KT_CHECKF(st == KILN_OK, "%s", e.msg);
    if (st == KILN_OK) {
        KT_EQ_INT(ck.n_shards, 2);
        KT_EQ_INT(ck.n_index, 3);
        const kiln_st_tensor *b = kiln_checkpoint_find(&ck, "b"), *c = kiln_checkpoint_find(&ck, "c");
        KT_REQUIRE(b && c);
        KT_EQ_INT(b->data[0], 16); /* b's bytes start 16 into s1's data buffer */
        KT_EQ_INT(c->dtype, KILN_DTYPE_BF16);
        KT_EQ_INT(c->nbytes, 8);
        KT_CHECK(kiln_checkpoint_find(&ck, "d") == NULL);
        KT_CHECK(ck.tokenizer_json_path != NULL);
        KT_CHECK(ck.tokenizer_config_path == NULL);
        kiln_checkpoint_close(&ck);
    }
    rm_tmpdir(d);
}

static void test_only_safetensors_file(void) {
    /* no index and no model.safetensors: the one *.safetensors file there is */
    char *d = make_tmpdir();
    write_text(d, "config.json", MINI_CFG);
    write_st(d, "weights.safetensors", HDR_AB, 32);
    kiln_checkpoint ck;
    kiln_error e = {0};
    kiln_status st = kiln_checkpoint_open(d, &ck, &e);
    KT_CHECKF(st == KILN_OK, "%s", e.msg);
    if (st == KILN_OK) {
        KT_EQ_INT(ck.n_index, 2);
        KT_CHECK(kiln_checkpoint_find(&ck, "a") != NULL);
        kiln_checkpoint_close(&ck);
    }
    /* model.safetensors is preferred over the others */
    write_st(d, "model.safetensors", HDR_C, 8);
    st = kiln_checkpoint_open(d, &ck, &e);
    KT_CHECKF(st == KILN_OK, "%s", e.msg);
    if (st == KILN_OK) {
        KT_EQ_INT(ck.n_index, 1);
        KT_CHECK(kiln_checkpoint_find(&ck, "c") != NULL);
        kiln_checkpoint_close(&ck);
    }
    rm_tmpdir(d);
}

/* ---- refusals ---- */

static void test_no_such_dir(void) {
    expect_open_fail("/nonexistent/kiln/ckpt", KILN_ERR_MISSING, "/nonexistent/kiln/ckpt: no such directory", "hint:");
}

static void test_not_a_dir(void) {
    expect_open_fail(KILN_SOURCE_DIR "/models/stories260k/model.safetensors", KILN_ERR_INVALID_ARG,
                     "model.safetensors: not a directory", "hint: pass the folder");
}

static void test_no_config(void) {
    char *d = make_tmpdir();
    write_st(d, "model.safetensors", HDR_AB, 32);
    expect_open_fail(d, KILN_ERR_MISSING, "no config.json", "hint:");
    rm_tmpdir(d);
}

static void test_bad_config(void) {
    char *d = make_tmpdir();
    write_text(d, "config.json", "{\"architectures\":[\"BertModel\"]}");
    write_st(d, "model.safetensors", HDR_AB, 32);
    expect_open_fail(d, KILN_ERR_UNSUPPORTED, "/config.json: architecture [\"BertModel\"]", NULL);
    rm_tmpdir(d);
}

static void test_no_weights(void) {
    char *d = make_tmpdir();
    write_text(d, "config.json", MINI_CFG);
    write_text(d, "pytorch_model.bin", "x");
    expect_open_fail(d, KILN_ERR_MISSING, "no weights", "hint:");
    rm_tmpdir(d);
}

static void test_several_without_index(void) {
    char *d = make_tmpdir();
    write_text(d, "config.json", MINI_CFG);
    write_st(d, "s1.safetensors", HDR_AB, 32);
    write_st(d, "s2.safetensors", HDR_C, 8);
    expect_open_fail(d, KILN_ERR_MISSING, "several *.safetensors files", "model.safetensors.index.json");
    rm_tmpdir(d);
}

static void test_bad_shard(void) {
    char *d = make_tmpdir();
    write_text(d, "config.json", MINI_CFG);
    write_st(d, "model.safetensors", HDR_AB, 30); /* b runs past the buffer */
    expect_open_fail(d, KILN_ERR_PARSE, "/model.safetensors: tensor \"b\"", "run past the end");
    rm_tmpdir(d);
}

static void test_index_missing_shard(void) {
    char *d = sharded_dir("{\"weight_map\":{\"a\":\"s1.safetensors\",\"c\":\"s3.safetensors\"}}");
    expect_open_fail(d, KILN_ERR_MISSING, "model.safetensors.index.json: names shard \"s3.safetensors\"", "hint:");
    rm_tmpdir(d);
}

static void test_index_tensor_not_in_shard(void) {
    char *d = sharded_dir("{\"weight_map\":{\"a\":\"s1.safetensors\",\"b\":\"s1.safetensors\","
                          "\"c\":\"s1.safetensors\"}}");
    expect_open_fail(d, KILN_ERR_MISSING,
                     "model.safetensors.index.json: tensor \"c\" is listed in shard \"s1.safetensors\", which does not hold it",
                     NULL);
    rm_tmpdir(d);
}

static void test_index_shard_path(void) {
    static const char *const bad[] = {"../s1.safetensors", "sub/s1.safetensors", "/etc/passwd", "..", "."};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char idx[256], want[128];
        snprintf(idx, sizeof idx, "{\"weight_map\":{\"a\":\"%s\"}}", bad[i]);
        snprintf(want, sizeof want, "names shard \"%s\", which is not a plain file name", bad[i]);
        char *d = sharded_dir(idx);
        expect_open_fail(d, KILN_ERR_PARSE, want, "entry \"a\"");
        rm_tmpdir(d);
    }
}

static void test_duplicate_across_shards(void) {
    char *d = sharded_dir("{\"weight_map\":{\"a\":\"s1.safetensors\",\"b\":\"s1.safetensors\","
                          "\"c\":\"s3.safetensors\"}}");
    write_st(d, "s3.safetensors", HDR_BC, 8); /* holds b too */
    expect_open_fail(d, KILN_ERR_PARSE, "tensor \"b\" is in two shards", "s1.safetensors and");
    expect_open_fail(d, KILN_ERR_PARSE, "s3.safetensors", NULL);
    rm_tmpdir(d);
}

static void test_index_malformed(void) {
    char *d = sharded_dir("{\"weight_map\": ");
    expect_open_fail(d, KILN_ERR_PARSE, "model.safetensors.index.json: not valid JSON", NULL);
    rm_tmpdir(d);
    d = sharded_dir("[]");
    expect_open_fail(d, KILN_ERR_PARSE, "model.safetensors.index.json: the top level is not a JSON object", NULL);
    rm_tmpdir(d);
    d = sharded_dir("{\"metadata\":{}}");
    expect_open_fail(d, KILN_ERR_MISSING, "model.safetensors.index.json: no \"weight_map\"", NULL);
    rm_tmpdir(d);
    d = sharded_dir("{\"weight_map\":[\"s1.safetensors\"]}");
    expect_open_fail(d, KILN_ERR_PARSE, "model.safetensors.index.json: \"weight_map\" is not an object", NULL);
    rm_tmpdir(d);
    d = sharded_dir("{\"weight_map\":{}}");
    expect_open_fail(d, KILN_ERR_MISSING, "\"weight_map\" lists no tensors", NULL);
    rm_tmpdir(d);
    d = sharded_dir("{\"weight_map\":{\"a\":1}}");
    expect_open_fail(d, KILN_ERR_PARSE, "weight_map entry \"a\" is not a string", NULL);
    rm_tmpdir(d);
    d = sharded_dir("{\"weight_map\":{\"a\":\"s1.safetensors\",\"a\":\"s2.safetensors\"}}");
    expect_open_fail(d, KILN_ERR_PARSE, "duplicate object key near '\"a\"'", NULL);
    rm_tmpdir(d);
}

int main(void) {
    KT_RUN(test_stories260k);
    KT_RUN(test_pycode_sharded);
    KT_RUN(test_indexed);
    KT_RUN(test_only_safetensors_file);
    KT_RUN(test_no_such_dir);
    KT_RUN(test_not_a_dir);
    KT_RUN(test_no_config);
    KT_RUN(test_bad_config);
    KT_RUN(test_no_weights);
    KT_RUN(test_several_without_index);
    KT_RUN(test_bad_shard);
    KT_RUN(test_index_missing_shard);
    KT_RUN(test_index_tensor_not_in_shard);
    KT_RUN(test_index_shard_path);
    KT_RUN(test_duplicate_across_shards);
    KT_RUN(test_index_malformed);
    return KT_END();
}
