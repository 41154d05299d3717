/*
 * test_tokjson_vocab.c — tokenizer ids against the model's vocab_size
 * (compiler/tokenizer_json.c, kiln_tokjson_compile_for_vocab*): a real
 * tokenizer compiles for a model of exactly its size or larger, and is
 * refused for a smaller one naming the first token outside, its id, the
 * vocab_size and how many are outside; an added token and a bos token past
 * the model's rows are named with their role.
 */
#include "../compiler/kiln_tokjson.h"
#include "kt.h"

static char *slurp(const char *path, size_t *len) {
    char *text = NULL;
    kiln_error e = {0};
    return kiln_file_read(path, 1u << 30, &text, len, &e) == KILN_OK ? text : NULL;
}

static kiln_status compile_for(const char *json, size_t len, const char *conf, int64_t vocab, kiln_error *e) {
    kiln_buf b = {0};
    kiln_status st = kiln_tokjson_compile_for_vocab_mem(json, len, conf, conf ? strlen(conf) : 0, "tok.json", vocab,
                                                        &b, e);
    kiln_buf_free(&b);
    return st;
}

static void test_llama2_sizes(void) {
    size_t len = 0;
    char *json = slurp(KILN_SHARED_DIR "/tokenizers/llama2/tokenizer.json", &len);
    if (!json) KT_SKIP("no shared llama2 tokenizer at %s", KILN_SHARED_DIR);
    kiln_error e = {0};
    KT_EQ_INT(compile_for(json, len, NULL, 32000, &e), KILN_OK);
    KT_EQ_INT(compile_for(json, len, NULL, 32064, &e), KILN_OK); /* padded rows */
    KT_EQ_INT(compile_for(json, len, NULL, 0, &e), KILN_OK);     /* no check */
    KT_EQ_INT(compile_for(json, len, NULL, 31999, &e), KILN_ERR_PARSE);
    KT_CONTAINS(e.msg, "has id 31999, outside the model's vocabulary: config.json's vocab_size is 31999");
    KT_CONTAINS(e.msg, "(1 tokenizer ids are outside it, the highest 31999)");
    KT_CONTAINS(e.msg, "hint:");
    /* the bos token <s> is id 1: named with its role */
    KT_EQ_INT(compile_for(json, len, "{\"bos_token\": \"<s>\", \"add_bos_token\": true}", 1, &e), KILN_ERR_PARSE);
    KT_CONTAINS(e.msg, "token \"<s>\" (the bos token) has id 1");
    free(json);
}

/* A tiny BPE tokenizer whose added token lies past the model's rows. */
static void test_added_token(void) {
    const char *json =
        "{\"version\":\"1.0\",\"truncation\":null,\"padding\":null,"
        "\"added_tokens\":[{\"id\":3,\"content\":\"<end>\",\"single_word\":false,\"lstrip\":false,\"rstrip\":false,"
        "\"normalized\":false,\"special\":true}],"
        "\"normalizer\":null,\"post_processor\":null,"
        "\"pre_tokenizer\":{\"type\":\"ByteLevel\",\"add_prefix_space\":false,\"trim_offsets\":true,\"use_regex\":true},"
        "\"decoder\":{\"type\":\"ByteLevel\",\"add_prefix_space\":true,\"trim_offsets\":true,\"use_regex\":true},"
        "\"model\":{\"type\":\"BPE\",\"dropout\":null,\"unk_token\":null,\"continuing_subword_prefix\":null,"
        "\"end_of_word_suffix\":null,\"fuse_unk\":false,\"byte_fallback\":false,"
        "\"vocab\":{\"a\":0,\"b\":1,\"ab\":2},\"merges\":[\"a b\"]}}";
    kiln_error e = {0};
    KT_EQ_INT(compile_for(json, strlen(json), NULL, 4, &e), KILN_OK);
    KT_EQ_INT(compile_for(json, strlen(json), "{\"eos_token\": \"<end>\"}", 3, &e), KILN_ERR_PARSE);
    KT_CONTAINS(e.msg, "token \"<end>\" (an eos token) has id 3, outside the model's vocabulary: config.json's "
                       "vocab_size is 3 (1 tokenizer ids");
    KT_EQ_INT(compile_for(json, strlen(json), NULL, 2, &e), KILN_ERR_PARSE);
    KT_CONTAINS(e.msg, "token \"ab\" has id 2");
    KT_CONTAINS(e.msg, "(2 tokenizer ids are outside it, the highest 3)");
}

int main(void) {
    KT_RUN(test_llama2_sizes);
    KT_RUN(test_added_token);
    return KT_END();
}
