/*
 * test_generation_config.c — generation_config.json parsing and resolution
 * (compiler/generation_config.c): the real files of the test models, eos as
 * an int or a list, transformers' rules (the file replaces config.json's
 * ids; do_sample false is greedy; do_sample true defaults to temperature 1,
 * top_k 50, top_p 1), and one test per refusal naming field and value.
 */
#include "../compiler/kiln_compiler.h"
#include "kt.h"

#define VOCAB 1000

static kiln_status parse(const char *json, kiln_generation_config *g, kiln_error *e) {
    return kiln_generation_config_parse(json, strlen(json), "gc.json", VOCAB, g, e);
}

/* A config.json-side model config: bos 1, eos 2. */
static kiln_model_config model(void) {
    kiln_model_config c = {.vocab_size = VOCAB, .bos_token_id = 1, .n_eos = 1, .eos_token_ids = {2}};
    return c;
}

static void test_real_files(void) {
    const char *files[2] = {KILN_SOURCE_DIR "/tests/data/tiny-mistral/generation_config.json",
                            KILN_SOURCE_DIR "/models/stories260k/generation_config.json"};
    for (int i = 0; i < 2; i++) {
        kiln_generation_config g;
        kiln_error e = {0};
        KT_EQ_INT(kiln_generation_config_load(files[i], 32000, &g, &e), KILN_OK);
        KT_CHECK(g.has_bos && g.bos_token_id == 1);
        KT_CHECK(g.n_eos == 1 && g.eos_token_ids[0] == 2);
        KT_CHECK(!g.do_sample);
    }
}

/* The file's eos replaces config.json's, an int or a list; no eos in the file = none. */
static void test_ids_from_file(void) {
    kiln_model_config c = model();
    kiln_generation_config g;
    kiln_generation r;
    kiln_error e = {0};
    KT_EQ_INT(parse("{\"eos_token_id\": [7, 9], \"bos_token_id\": 3, \"pad_token_id\": 0}", &g, &e), KILN_OK);
    kiln_generation_resolve(&c, &g, &r);
    KT_EQ_INT(r.n_eos, 2);
    KT_EQ_INT(r.eos_token_ids[0], 7);
    KT_EQ_INT(r.eos_token_ids[1], 9);
    KT_EQ_INT(r.bos_token_id, 3);
    KT_EQ_INT(r.pad_token_id, 0);
    KT_EQ_STR(r.ids_src, "generation_config.json");
    KT_EQ_INT(parse("{\"eos_token_id\": 5}", &g, &e), KILN_OK);
    kiln_generation_resolve(&c, &g, &r);
    KT_CHECK(r.n_eos == 1 && r.eos_token_ids[0] == 5 && r.bos_token_id == -1);
    KT_EQ_INT(parse("{\"do_sample\": false}", &g, &e), KILN_OK);
    kiln_generation_resolve(&c, &g, &r);
    KT_EQ_INT(r.n_eos, 0);
    /* no file: config.json's */
    kiln_generation_resolve(&c, NULL, &r);
    KT_CHECK(r.n_eos == 1 && r.eos_token_ids[0] == 2 && r.bos_token_id == 1);
    KT_EQ_STR(r.ids_src, "config.json");
    KT_EQ_STR(r.temperature_src, "greedy");
}

/* do_sample false: greedy whatever the other fields; true: given or HF defaults. */
static void test_sampling(void) {
    kiln_model_config c = model();
    kiln_generation_config g;
    kiln_generation r;
    kiln_error e = {0};
    KT_EQ_INT(parse("{\"temperature\": 0.7, \"top_k\": 20, \"top_p\": 0.9}", &g, &e), KILN_OK);
    kiln_generation_resolve(&c, &g, &r);
    KT_CHECK(!r.do_sample && r.temperature == 0 && r.top_k == 0 && r.top_p == 1);
    KT_EQ_STR(r.do_sample_src, "default");
    KT_EQ_INT(parse("{\"do_sample\": true, \"temperature\": 0.7, \"top_k\": 20, \"top_p\": 0.9}", &g, &e), KILN_OK);
    kiln_generation_resolve(&c, &g, &r);
    KT_CHECK(r.do_sample && r.temperature == 0.7 && r.top_k == 20 && r.top_p == 0.9);
    KT_EQ_STR(r.top_k_src, "generation_config.json");
    KT_EQ_INT(parse("{\"do_sample\": true}", &g, &e), KILN_OK);
    kiln_generation_resolve(&c, &g, &r);
    KT_CHECK(r.temperature == 1.0 && r.top_k == 50 && r.top_p == 1.0);
    KT_EQ_STR(r.temperature_src, "default");
    KT_EQ_INT(parse("{\"do_sample\": true, \"top_k\": 0, \"temperature\": 2}", &g, &e), KILN_OK);
    kiln_generation_resolve(&c, &g, &r);
    KT_CHECK(r.top_k == 0 && r.temperature == 2.0);
    /* null is "not given" */
    KT_EQ_INT(parse("{\"do_sample\": true, \"top_k\": null, \"eos_token_id\": null}", &g, &e), KILN_OK);
    KT_CHECK(!g.has_top_k && !g.has_eos);
}

/* Keys kiln does not apply are listed. */
static void test_not_applied(void) {
    kiln_generation_config g;
    kiln_error e = {0};
    KT_EQ_INT(parse("{\"repetition_penalty\": 1.1, \"max_new_tokens\": 64, \"use_cache\": true, \"eos_token_id\": 2,"
                    " \"transformers_version\": \"5.0\"}", &g, &e), KILN_OK);
    KT_EQ_STR(g.not_applied, "max_new_tokens,repetition_penalty");
}

static void refused(const char *json, kiln_status code, const char *needle) {
    kiln_generation_config g;
    kiln_error e = {0};
    KT_EQ_INT(parse(json, &g, &e), code);
    KT_CONTAINS(e.msg, needle);
    KT_CONTAINS(e.msg, "gc.json");
}

static void test_refusals(void) {
    refused("{ not json", KILN_ERR_PARSE, "not valid JSON");
    refused("[1, 2]", KILN_ERR_PARSE, "not a JSON object");
    refused("{\"a\": 1, \"a\": 2}", KILN_ERR_PARSE, "duplicate");
    refused("{\"eos_token_id\": 1000}", KILN_ERR_PARSE, "\"eos_token_id\" is 1000, outside the model's vocabulary [0, 1000)");
    refused("{\"eos_token_id\": [1, -1]}", KILN_ERR_PARSE, "\"eos_token_id[1]\" is -1");
    refused("{\"eos_token_id\": \"2\"}", KILN_ERR_PARSE, "\"eos_token_id\" is \"2\"; it must be an integer token id");
    refused("{\"eos_token_id\": [1, 2.0]}", KILN_ERR_PARSE, "eos_token_id[1]");
    refused("{\"eos_token_id\": [1,2,3,4,5,6,7,8,9]}", KILN_ERR_UNSUPPORTED, "lists 9 ids");
    refused("{\"bos_token_id\": 5000}", KILN_ERR_PARSE, "\"bos_token_id\" is 5000");
    refused("{\"pad_token_id\": true}", KILN_ERR_PARSE, "pad_token_id");
    refused("{\"do_sample\": 1}", KILN_ERR_PARSE, "\"do_sample\" is 1; it must be true or false");
    refused("{\"temperature\": -0.5}", KILN_ERR_PARSE, "\"temperature\" is -0.5");
    refused("{\"temperature\": \"hot\"}", KILN_ERR_PARSE, "it must be a number");
    refused("{\"top_p\": 1.5}", KILN_ERR_PARSE, "\"top_p\" is 1.5; it must be in [0, 1]");
    refused("{\"top_k\": -1}", KILN_ERR_PARSE, "\"top_k\" is -1");
    refused("{\"top_k\": 5.5}", KILN_ERR_PARSE, "must be an integer");
    refused("{\"do_sample\": true, \"temperature\": 0}", KILN_ERR_PARSE, "\"temperature\" is 0 with \"do_sample\": true");
    refused("{\"do_sample\": true, \"top_p\": 0}", KILN_ERR_UNSUPPORTED, "\"top_p\" is 0");
}

/* A directory or a missing file by that name: an error, never a hang. */
static void test_not_a_file(void) {
    kiln_generation_config g;
    kiln_error e = {0};
    KT_EQ_INT(kiln_generation_config_load(KILN_SOURCE_DIR "/tests", VOCAB, &g, &e), KILN_ERR_IO);
    KT_CONTAINS(e.msg, "not a regular file");
    KT_EQ_INT(kiln_generation_config_load(KILN_SOURCE_DIR "/tests/nonexistent.json", VOCAB, &g, &e), KILN_ERR_IO);
}

int main(void) {
    KT_RUN(test_real_files);
    KT_RUN(test_ids_from_file);
    KT_RUN(test_sampling);
    KT_RUN(test_not_applied);
    KT_RUN(test_refusals);
    KT_RUN(test_not_a_file);
    return KT_END();
}
