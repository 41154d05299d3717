/*
 * test_config.c — config.json parsing: the real configs of the two test
 * models (transformers 4.x and 5.x spellings), llama3 rope scaling in both
 * spellings, defaults, and one test per refusal (status + message naming the
 * field and value).
 *
 * Most cases start from BASE (a Llama config in transformers 4.x form) and
 * change one field through jansson, so each test says only what differs.
 */
#include "../compiler/kiln_compiler.h"
#include "kt.h"

#include <jansson.h>

static const char *const BASE =
    "{\"architectures\":[\"LlamaForCausalLM\"],\"model_type\":\"llama\",\"hidden_size\":256,"
    "\"num_hidden_layers\":4,\"num_attention_heads\":8,\"num_key_value_heads\":4,\"intermediate_size\":688,"
    "\"vocab_size\":1000,\"max_position_embeddings\":2048,\"rms_norm_eps\":1e-06,\"rope_theta\":10000.0,"
    "\"rope_scaling\":null,\"hidden_act\":\"silu\",\"attention_bias\":false,\"mlp_bias\":false,"
    "\"tie_word_embeddings\":false,\"bos_token_id\":1,\"eos_token_id\":2,\"torch_dtype\":\"bfloat16\"}";

/* Parse BASE with `key` set to the JSON text `value` (NULL: key removed). */
static kiln_status parse_with(const char *key, const char *value, kiln_model_config *m, kiln_error *e) {
    json_t *root = json_loads(BASE, 0, NULL);
    if (value) {
        json_error_t je;
        json_t *v = json_loads(value, JSON_DECODE_ANY, &je);
        if (!v) {
            fprintf(stderr, "bad test value %s: %s\n", value, je.text);
            abort();
        }
        json_object_set_new(root, key, v);
    } else {
        json_object_del(root, key);
    }
    char *text = json_dumps(root, JSON_REAL_PRECISION(17));
    json_decref(root);
    kiln_status st = kiln_config_parse(text, strlen(text), "config.json", m, e);
    free(text);
    return st;
}

/* BASE with one change must fail with `code` and a message containing `needle`. */
static void expect_fail(const char *key, const char *value, kiln_status code, const char *needle) {
    kiln_model_config m;
    kiln_error e = {0};
    kiln_status st = parse_with(key, value, &m, &e);
    KT_EQ_INT(st, code);
    KT_EQ_INT(e.code, code);
    KT_CONTAINS(e.msg, "config.json: ");
    KT_CONTAINS(e.msg, needle);
}

static kiln_status parse_str(const char *s, kiln_model_config *m, kiln_error *e) {
    return kiln_config_parse(s, strlen(s), "config.json", m, e);
}

/* ---- real configs ---- */

static void test_stories260k(void) {
    kiln_model_config m;
    kiln_error e = {0};
    kiln_status st = kiln_config_load(KILN_SOURCE_DIR "/models/stories260k/config.json", &m, &e);
    KT_CHECKF(st == KILN_OK, "%s", e.msg);
    KT_EQ_INT(m.arch, KILN_ARCH_LLAMA);
    KT_EQ_INT(m.hidden_size, 64);
    KT_EQ_INT(m.n_layers, 5);
    KT_EQ_INT(m.n_heads, 8);
    KT_EQ_INT(m.n_kv_heads, 4);
    KT_EQ_INT(m.head_dim, 8);
    KT_EQ_INT(m.intermediate_size, 172);
    KT_EQ_INT(m.vocab_size, 512);
    KT_EQ_INT(m.max_position_embeddings, 512);
    KT_CHECK(m.rms_norm_eps == 1e-5);
    KT_CHECK(m.rope_theta == 10000.0);
    KT_EQ_INT(m.rope_type, KILN_ROPE_DEFAULT);
    KT_EQ_INT(m.sliding_window, 0);
    KT_CHECK(m.tie_word_embeddings);
    KT_EQ_INT(m.bos_token_id, 1);
    KT_EQ_INT(m.n_eos, 1);
    KT_EQ_INT(m.eos_token_ids[0], 2);
    KT_EQ_INT(m.torch_dtype, KILN_DTYPE_F32);
}

static void test_pycode_transformers5(void) {
    const char *path = KILN_SHARED_DIR "/models/pycode-22m/config.json";
    FILE *f = fopen(path, "rb");
    if (!f) KT_SKIP("%s is absent", path);
    fclose(f);
    kiln_model_config m;
    kiln_error e = {0};
    kiln_status st = kiln_config_load(path, &m, &e);
    KT_CHECKF(st == KILN_OK, "%s", e.msg);
    KT_EQ_INT(m.arch, KILN_ARCH_MISTRAL);
    KT_EQ_INT(m.hidden_size, 384);
    KT_EQ_INT(m.n_layers, 6);
    KT_EQ_INT(m.n_heads, 6);
    KT_EQ_INT(m.n_kv_heads, 2);
    KT_EQ_INT(m.head_dim, 64);
    KT_EQ_INT(m.intermediate_size, 1024);
    KT_EQ_INT(m.vocab_size, 32000);
    KT_EQ_INT(m.max_position_embeddings, 2048);
    KT_CHECK(m.rope_theta == 10000.0); /* from rope_parameters: there is no top-level rope_theta */
    KT_EQ_INT(m.rope_type, KILN_ROPE_DEFAULT);
    KT_EQ_INT(m.sliding_window, 256);
    KT_CHECK(m.tie_word_embeddings);
    KT_EQ_INT(m.torch_dtype, KILN_DTYPE_BF16); /* "dtype", not "torch_dtype" */
    KT_EQ_INT(m.bos_token_id, 1);
    KT_EQ_INT(m.n_eos, 1);
    KT_EQ_INT(m.eos_token_ids[0], 2);
}

static void test_base_values(void) {
    kiln_model_config m;
    kiln_error e = {0};
    KT_EQ_INT(parse_str(BASE, &m, &e), KILN_OK);
    KT_EQ_INT(m.head_dim, 32); /* 256 / 8 */
    KT_CHECK(m.rms_norm_eps == 1e-6);
    KT_EQ_INT(m.torch_dtype, KILN_DTYPE_BF16);
    KT_CHECK(!m.tie_word_embeddings);
}

/* ---- rope ---- */

static void check_llama3(const kiln_model_config *m) {
    KT_EQ_INT(m->rope_type, KILN_ROPE_LLAMA3);
    KT_CHECK(m->rope_theta == 500000.0);
    KT_CHECK(m->rope_factor == 8.0);
    KT_CHECK(m->rope_low_freq_factor == 1.0);
    KT_CHECK(m->rope_high_freq_factor == 4.0);
    KT_EQ_INT(m->rope_original_max_pos, 8192);
}

/* Llama-3.1-8B's config.json (transformers 4.43), trimmed to what kiln reads. */
static const char *const LLAMA31_V4 =
    "{\"architectures\":[\"LlamaForCausalLM\"],\"attention_bias\":false,\"bos_token_id\":128000,"
    "\"eos_token_id\":[128001,128008,128009],\"hidden_act\":\"silu\",\"hidden_size\":4096,"
    "\"intermediate_size\":14336,\"max_position_embeddings\":131072,\"mlp_bias\":false,\"model_type\":\"llama\","
    "\"num_attention_heads\":32,\"num_hidden_layers\":32,\"num_key_value_heads\":8,\"pretraining_tp\":1,"
    "\"rms_norm_eps\":1e-05,\"rope_scaling\":{\"factor\":8.0,\"low_freq_factor\":1.0,\"high_freq_factor\":4.0,"
    "\"original_max_position_embeddings\":8192,\"rope_type\":\"llama3\"},\"rope_theta\":500000.0,"
    "\"tie_word_embeddings\":false,\"torch_dtype\":\"bfloat16\",\"vocab_size\":128256}";

static void test_llama3_rope_v4(void) {
    kiln_model_config m;
    kiln_error e = {0};
    KT_EQ_INT(parse_str(LLAMA31_V4, &m, &e), KILN_OK);
    check_llama3(&m);
    KT_EQ_INT(m.hidden_size, 4096);
    KT_EQ_INT(m.head_dim, 128);
    KT_EQ_INT(m.n_eos, 3);
    KT_EQ_INT(m.eos_token_ids[0], 128001);
    KT_EQ_INT(m.eos_token_ids[2], 128009);
    KT_EQ_INT(m.bos_token_id, 128000);
    /* the older key "type" instead of "rope_type" */
    KT_EQ_INT(parse_with("rope_scaling",
                         "{\"type\":\"llama3\",\"factor\":8.0,\"low_freq_factor\":1.0,\"high_freq_factor\":4.0,"
                         "\"original_max_position_embeddings\":8192}",
                         &m, &e),
              KILN_OK);
    KT_EQ_INT(m.rope_type, KILN_ROPE_LLAMA3);
    KT_CHECK(m.rope_theta == 10000.0); /* BASE's top-level theta */
    KT_EQ_INT(m.rope_original_max_pos, 8192);
}

static void test_llama3_rope_v5(void) {
    kiln_model_config m;
    kiln_error e = {0};
    /* transformers 5 form: theta inside rope_parameters, no top-level rope_theta */
    const char *rp = "{\"rope_type\":\"llama3\",\"rope_theta\":500000.0,\"factor\":8.0,\"low_freq_factor\":1.0,"
                     "\"high_freq_factor\":4.0,\"original_max_position_embeddings\":8192}";
    json_t *root = json_loads(BASE, 0, NULL);
    json_object_del(root, "rope_theta");
    json_object_del(root, "rope_scaling");
    json_object_set_new(root, "rope_parameters", json_loads(rp, 0, NULL));
    char *text = json_dumps(root, 0);
    json_decref(root);
    kiln_status st = parse_str(text, &m, &e);
    free(text);
    KT_CHECKF(st == KILN_OK, "%s", e.msg);
    check_llama3(&m);
    /* original_max_position_embeddings defaults to max_position_embeddings, as in transformers */
    KT_EQ_INT(parse_with("rope_parameters",
                         "{\"rope_type\":\"llama3\",\"factor\":8,\"low_freq_factor\":1,\"high_freq_factor\":4}", &m, &e),
              KILN_OK);
    KT_EQ_INT(m.rope_original_max_pos, 2048);
    KT_CHECK(m.rope_theta == 10000.0); /* none in the dict: the top-level one */
}

static void test_rope_precedence(void) {
    kiln_model_config m;
    kiln_error e = {0};
    /* rope_parameters' theta wins over the top-level one */
    KT_EQ_INT(parse_with("rope_parameters", "{\"rope_type\":\"default\",\"rope_theta\":1000000.0}", &m, &e), KILN_OK);
    KT_CHECK(m.rope_theta == 1e6);
    KT_EQ_INT(m.rope_type, KILN_ROPE_DEFAULT);
    /* no theta anywhere: the transformers default 10000 */
    KT_EQ_INT(parse_with("rope_theta", NULL, &m, &e), KILN_OK);
    KT_CHECK(m.rope_theta == 10000.0);
}

static void test_rope_types_refused(void) {
    static const char *const types[] = {"linear", "dynamic", "yarn", "longrope", "su", "made_up"};
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++) {
        char v[160], want[64];
        snprintf(v, sizeof v, "{\"rope_type\":\"%s\",\"factor\":2.0}", types[i]);
        snprintf(want, sizeof want, "rope type \"%s\"", types[i]);
        expect_fail("rope_scaling", v, KILN_ERR_UNSUPPORTED, want);
        expect_fail("rope_parameters", v, KILN_ERR_UNSUPPORTED, want);
        snprintf(v, sizeof v, "{\"type\":\"%s\",\"factor\":2.0}", types[i]);
        expect_fail("rope_scaling", v, KILN_ERR_UNSUPPORTED, want);
    }
}

static void test_rope_bad_fields(void) {
    expect_fail("rope_scaling", "[8.0]", KILN_ERR_PARSE, "field \"rope_scaling\" is [8.0]");
    expect_fail("rope_parameters", "\"llama3\"", KILN_ERR_PARSE, "field \"rope_parameters\"");
    expect_fail("rope_scaling", "{\"rope_type\":3}", KILN_ERR_PARSE, "field \"rope_scaling.rope_type\" is 3");
    expect_fail("rope_scaling", "{\"rope_type\":\"llama3\",\"low_freq_factor\":1.0,\"high_freq_factor\":4.0}",
                KILN_ERR_MISSING, "\"rope_scaling.factor\"");
    expect_fail("rope_scaling", "{\"rope_type\":\"llama3\",\"factor\":0.5,\"low_freq_factor\":1.0,\"high_freq_factor\":4.0}",
                KILN_ERR_PARSE, "field \"rope_scaling.factor\" is 0.5");
    expect_fail("rope_scaling", "{\"rope_type\":\"llama3\",\"factor\":8,\"low_freq_factor\":4.0,\"high_freq_factor\":1.0}",
                KILN_ERR_PARSE, "field \"rope_scaling.high_freq_factor\" is 1, which is not greater than low_freq_factor 4");
    expect_fail("rope_parameters", "{\"rope_type\":\"llama3\",\"factor\":8,\"low_freq_factor\":1,\"high_freq_factor\":4,"
                "\"original_max_position_embeddings\":8192.0}",
                KILN_ERR_PARSE, "field \"rope_parameters.original_max_position_embeddings\" is 8192.0");
    expect_fail("rope_parameters", "{\"rope_theta\":-1.0}", KILN_ERR_PARSE, "field \"rope_parameters.rope_theta\" is -1");
    expect_fail("rope_theta", "0", KILN_ERR_PARSE, "field \"rope_theta\" is 0");
    expect_fail("rope_theta", "\"10000\"", KILN_ERR_PARSE, "field \"rope_theta\" is \"10000\"");
}

/* ---- defaults ---- */

static void test_defaults(void) {
    static const char *const optional[] = {"num_key_value_heads", "bos_token_id", "eos_token_id",
                                           "tie_word_embeddings", "torch_dtype", "hidden_act",
                                           "attention_bias", "rope_scaling", "sliding_window"};
    kiln_model_config m;
    kiln_error e = {0};
    json_t *root = json_loads(BASE, 0, NULL);
    for (size_t i = 0; i < sizeof optional / sizeof optional[0]; i++) json_object_del(root, optional[i]);
    char *text = json_dumps(root, 0);
    json_decref(root);
    kiln_status st = parse_str(text, &m, &e);
    free(text);
    KT_CHECKF(st == KILN_OK, "%s", e.msg);
    KT_EQ_INT(m.n_kv_heads, 8);
    KT_EQ_INT(m.head_dim, 32);
    KT_EQ_INT(m.bos_token_id, -1);
    KT_EQ_INT(m.n_eos, 0);
    KT_CHECK(!m.tie_word_embeddings);
    KT_EQ_INT(m.torch_dtype, KILN_DTYPE_F32);
    KT_EQ_INT(m.sliding_window, 0);
    /* null means absent */
    KT_EQ_INT(parse_with("num_key_value_heads", "null", &m, &e), KILN_OK);
    KT_EQ_INT(m.n_kv_heads, 8);
    KT_EQ_INT(parse_with("head_dim", "null", &m, &e), KILN_OK);
    KT_EQ_INT(m.head_dim, 32);
    KT_EQ_INT(parse_with("bos_token_id", "null", &m, &e), KILN_OK);
    KT_EQ_INT(m.bos_token_id, -1);
    /* head_dim given explicitly may differ from hidden / heads (Mistral-Nemo does this) */
    KT_EQ_INT(parse_with("head_dim", "64", &m, &e), KILN_OK);
    KT_EQ_INT(m.head_dim, 64);
}

static void test_sliding_window(void) {
    kiln_model_config m;
    kiln_error e = {0};
    const char *mistral = "{\"architectures\":[\"MistralForCausalLM\"],\"hidden_size\":256,\"num_hidden_layers\":2,"
                          "\"num_attention_heads\":8,\"num_key_value_heads\":2,\"intermediate_size\":512,"
                          "\"vocab_size\":1000,\"max_position_embeddings\":32768,\"rms_norm_eps\":1e-5,"
                          "\"rope_theta\":1000000.0,\"sliding_window\":4096}";
    KT_EQ_INT(parse_str(mistral, &m, &e), KILN_OK);
    KT_EQ_INT(m.arch, KILN_ARCH_MISTRAL);
    KT_EQ_INT(m.sliding_window, 4096);
    /* transformers' Llama ignores sliding_window: checked, then dropped */
    KT_EQ_INT(parse_with("sliding_window", "4096", &m, &e), KILN_OK);
    KT_EQ_INT(m.sliding_window, 0);
    KT_EQ_INT(parse_with("sliding_window", "null", &m, &e), KILN_OK);
    KT_EQ_INT(m.sliding_window, 0);
    expect_fail("sliding_window", "0", KILN_ERR_PARSE, "field \"sliding_window\" is 0; it must be at least 1");
    expect_fail("sliding_window", "-5", KILN_ERR_PARSE, "field \"sliding_window\" is -5");
    expect_fail("sliding_window", "4096.0", KILN_ERR_PARSE, "field \"sliding_window\" is 4096.0 (a real number)");
}

/* Qwen2 in the transformers 4.x form (no layer_types): the window on layers from max_window_layers on */
static void test_qwen2(void) {
    kiln_model_config m;
    kiln_error e = {0};
    char path[1024];
    snprintf(path, sizeof path, "%s/tests/data/tiny-qwen2/config.json", KILN_SOURCE_DIR);
    KT_REQUIRE(kiln_config_load(path, &m, &e) == KILN_OK);
    KT_EQ_INT(m.arch, KILN_ARCH_QWEN2);
    KT_EQ_INT(m.sliding_window, 8);
    KT_CHECK(!m.layer_windowed[0] && m.layer_windowed[1]);
    KT_CHECK(m.tie_word_embeddings);
    KT_CHECK(m.rope_theta == 1e6);
    KT_EQ_INT(parse_str("{\"model_type\":\"qwen2\",\"hidden_size\":64,\"num_hidden_layers\":1,"
                        "\"num_attention_heads\":4,\"intermediate_size\":8,\"vocab_size\":16,"
                        "\"max_position_embeddings\":32,\"rms_norm_eps\":1e-6}", &m, &e), KILN_OK);
    KT_EQ_INT(m.arch, KILN_ARCH_QWEN2);
}

/* Qwen3: its own architecture; its per-layer sliding windows */
static void test_qwen3(void) {
    kiln_model_config m;
    kiln_error e = {0};
    char path[1024];
    snprintf(path, sizeof path, "%s/tests/data/tiny-qwen3/config.json", KILN_SOURCE_DIR);
    KT_REQUIRE(kiln_config_load(path, &m, &e) == KILN_OK);
    KT_EQ_INT(m.arch, KILN_ARCH_QWEN3);
    KT_EQ_INT(m.head_dim, 24); /* explicit: hidden / heads would be 16 */
    KT_EQ_INT(m.sliding_window, 0);
    KT_CHECK(m.rope_theta == 1e6);
    const char *q = "{\"architectures\":[\"Qwen3ForCausalLM\"],\"hidden_size\":64,\"num_hidden_layers\":2,"
                    "\"num_attention_heads\":4,\"num_key_value_heads\":2,\"head_dim\":24,\"intermediate_size\":160,"
                    "\"vocab_size\":256,\"max_position_embeddings\":256,\"rms_norm_eps\":1e-6,\"rope_theta\":1e6,%s}";
    char buf[1024];
    /* per-layer windows as transformers decides them: max_window_layers without layer_types... */
    snprintf(buf, sizeof buf, q, "\"use_sliding_window\":true,\"sliding_window\":64,\"max_window_layers\":1");
    KT_EQ_INT(parse_str(buf, &m, &e), KILN_OK);
    KT_EQ_INT(m.sliding_window, 64);
    KT_CHECK(!m.layer_windowed[0] && m.layer_windowed[1]);
    snprintf(buf, sizeof buf, q, "\"use_sliding_window\":true,\"sliding_window\":64"); /* default 28: none */
    KT_EQ_INT(parse_str(buf, &m, &e), KILN_OK);
    KT_CHECK(!m.layer_windowed[0] && !m.layer_windowed[1]);
    KT_EQ_INT(m.sliding_window, 0);
    /* ...layer_types when given (transformers 5), and no window at all without use_sliding_window */
    snprintf(buf, sizeof buf, q, "\"use_sliding_window\":true,\"sliding_window\":64,"
                                 "\"layer_types\":[\"sliding_attention\",\"full_attention\"]");
    KT_EQ_INT(parse_str(buf, &m, &e), KILN_OK);
    KT_CHECK(m.layer_windowed[0] && !m.layer_windowed[1]);
    snprintf(buf, sizeof buf, q, "\"sliding_window\":64,\"layer_types\":[\"sliding_attention\",\"full_attention\"]");
    KT_EQ_INT(parse_str(buf, &m, &e), KILN_OK);
    KT_CHECK(!m.layer_windowed[0] && !m.layer_windowed[1]);
    snprintf(buf, sizeof buf, q, "\"layer_types\":[\"full_attention\",\"chunked_attention\"]");
    KT_EQ_INT(parse_str(buf, &m, &e), KILN_ERR_UNSUPPORTED);
    KT_CONTAINS(e.msg, "layer_types\"[1]");
    snprintf(buf, sizeof buf, q, "\"layer_types\":[\"full_attention\"]");
    KT_EQ_INT(parse_str(buf, &m, &e), KILN_ERR_PARSE);
    KT_CONTAINS(e.msg, "one per layer");
    snprintf(buf, sizeof buf, q, "\"attention_bias\":true");
    KT_EQ_INT(parse_str(buf, &m, &e), KILN_ERR_UNSUPPORTED);
    KT_CONTAINS(e.msg, "attention_bias");
    snprintf(buf, sizeof buf, q, "\"sliding_window\":64");
    KT_EQ_INT(parse_str(buf, &m, &e), KILN_OK); /* a window without use_sliding_window is not used, as in HF */
    KT_EQ_INT(m.sliding_window, 0);
    KT_EQ_INT(parse_str("{\"model_type\":\"qwen3\",\"hidden_size\":64,\"num_hidden_layers\":1,"
                        "\"num_attention_heads\":4,\"intermediate_size\":8,\"vocab_size\":16,"
                        "\"max_position_embeddings\":8,\"rms_norm_eps\":1e-6}", &m, &e), KILN_OK);
    KT_EQ_INT(m.arch, KILN_ARCH_QWEN3);
}

/* Mixtral: both config forms (the tiny checkpoint's transformers 5 one, and 4.x's top-level rope_theta and
 * torch_dtype), HF's defaults, its sliding window kept, and the variants kiln cannot run refused by name */
static void test_mixtral(void) {
    kiln_model_config m;
    kiln_error e = {0};
    char path[1024];
    snprintf(path, sizeof path, "%s/tests/data/tiny-mixtral/config.json", KILN_SOURCE_DIR);
    KT_REQUIRE(kiln_config_load(path, &m, &e) == KILN_OK);
    KT_EQ_INT(m.arch, KILN_ARCH_MIXTRAL);
    KT_EQ_INT(m.n_experts, 8);
    KT_EQ_INT(m.n_experts_per_tok, 2);
    KT_EQ_INT(m.intermediate_size, 16);
    KT_EQ_INT(m.moe_intermediate_size, 16); /* the experts are the MLP */
    KT_CHECK(m.norm_topk_prob && m.layer_sparse[0] && m.layer_sparse[1]);
    KT_EQ_INT(m.sliding_window, 0);
    KT_CHECK(m.rope_theta == 1e6);
    KT_EQ_INT(m.torch_dtype, KILN_DTYPE_BF16);
    /* transformers 4.x form, as Mixtral-8x7B-v0.1's config.json */
    const char *v4 = "{\"architectures\":[\"MixtralForCausalLM\"],\"hidden_size\":64,\"num_hidden_layers\":2,"
                     "\"num_attention_heads\":4,\"num_key_value_heads\":2,\"intermediate_size\":16,"
                     "\"vocab_size\":256,\"max_position_embeddings\":256,\"rms_norm_eps\":1e-5,%s}";
    char buf[1024];
    snprintf(buf, sizeof buf, v4, "\"rope_theta\":1e6,\"torch_dtype\":\"bfloat16\",\"num_local_experts\":4,"
                                  "\"num_experts_per_tok\":2,\"router_aux_loss_coef\":0.02,\"router_jitter_noise\":0.0,"
                                  "\"output_router_logits\":false,\"sliding_window\":4096");
    KT_EQ_INT(parse_str(buf, &m, &e), KILN_OK);
    KT_EQ_INT(m.n_experts, 4);
    KT_EQ_INT(m.sliding_window, 4096); /* Mixtral's attention honours it, as Mistral's */
    KT_EQ_INT(m.torch_dtype, KILN_DTYPE_BF16);
    /* HF's defaults: 8 experts, top 2, theta 1e6 (MixtralConfig.default_theta) */
    snprintf(buf, sizeof buf, v4, "\"sliding_window\":null");
    KT_EQ_INT(parse_str(buf, &m, &e), KILN_OK);
    KT_EQ_INT(m.n_experts, 8);
    KT_EQ_INT(m.n_experts_per_tok, 2);
    KT_CHECK(m.rope_theta == 1e6);
    /* transformers 5's alias num_experts */
    snprintf(buf, sizeof buf, v4, "\"num_experts\":6");
    KT_EQ_INT(parse_str(buf, &m, &e), KILN_OK);
    KT_EQ_INT(m.n_experts, 6);
    snprintf(buf, sizeof buf, v4, "\"num_experts\":6,\"num_local_experts\":4");
    KT_EQ_INT(parse_str(buf, &m, &e), KILN_ERR_PARSE);
    KT_CONTAINS(e.msg, "field \"num_experts\" is 6 but \"num_local_experts\" is 4");
    /* refusals, by name */
    snprintf(buf, sizeof buf, v4, "\"num_local_experts\":4,\"num_experts_per_tok\":5");
    KT_EQ_INT(parse_str(buf, &m, &e), KILN_ERR_PARSE);
    KT_CONTAINS(e.msg, "field \"num_experts_per_tok\" is 5, more than the 4 experts");
    snprintf(buf, sizeof buf, v4, "\"num_experts_per_tok\":0");
    KT_EQ_INT(parse_str(buf, &m, &e), KILN_ERR_PARSE);
    KT_CONTAINS(e.msg, "field \"num_experts_per_tok\" is 0; it must be at least 1");
    snprintf(buf, sizeof buf, v4, "\"num_local_experts\":513");
    KT_EQ_INT(parse_str(buf, &m, &e), KILN_ERR_UNSUPPORTED);
    KT_CONTAINS(e.msg, "field \"num_local_experts\" is 513, above kiln's limit of 512");
    snprintf(buf, sizeof buf, v4, "\"num_local_experts\":8.0");
    KT_EQ_INT(parse_str(buf, &m, &e), KILN_ERR_PARSE);
    KT_CONTAINS(e.msg, "field \"num_local_experts\" is 8.0 (a real number)");
    snprintf(buf, sizeof buf, v4, "\"router_jitter_noise\":-0.1");
    KT_EQ_INT(parse_str(buf, &m, &e), KILN_ERR_PARSE);
    KT_CONTAINS(e.msg, "router_jitter_noise");
    snprintf(buf, sizeof buf, v4, "\"output_router_logits\":\"yes\"");
    KT_EQ_INT(parse_str(buf, &m, &e), KILN_ERR_PARSE);
    KT_CONTAINS(e.msg, "output_router_logits");
    snprintf(buf, sizeof buf, v4, "\"hidden_act\":\"gelu\"");
    KT_EQ_INT(parse_str(buf, &m, &e), KILN_ERR_UNSUPPORTED);
    KT_CONTAINS(e.msg, "hidden_act");
    /* model_type alone; a dense architecture ignores the expert fields */
    KT_EQ_INT(parse_str("{\"model_type\":\"mixtral\",\"hidden_size\":64,\"num_hidden_layers\":1,"
                        "\"num_attention_heads\":4,\"intermediate_size\":8,\"vocab_size\":16,"
                        "\"max_position_embeddings\":8,\"rms_norm_eps\":1e-6}", &m, &e), KILN_OK);
    KT_EQ_INT(m.arch, KILN_ARCH_MIXTRAL);
    KT_EQ_INT(m.n_experts, 8);
    KT_EQ_INT(parse_str("{\"model_type\":\"mistral\",\"hidden_size\":64,\"num_hidden_layers\":1,"
                        "\"num_attention_heads\":4,\"intermediate_size\":8,\"vocab_size\":16,"
                        "\"max_position_embeddings\":8,\"rms_norm_eps\":1e-6,\"num_local_experts\":8}", &m, &e),
              KILN_OK);
    KT_EQ_INT(m.n_experts, 0);
    KT_CHECK(m.rope_theta == 10000.0);
}

/* ---- refusals: input ---- */

static void test_not_json(void) {
    kiln_model_config m;
    kiln_error e = {0};
    KT_EQ_INT(parse_str("{\"hidden_size\": 64,\n \"vocab_size\": }", &m, &e), KILN_ERR_PARSE);
    KT_CONTAINS(e.msg, "config.json: not valid JSON");
    KT_CONTAINS(e.msg, "line 2");
    KT_EQ_INT(parse_str("", &m, &e), KILN_ERR_PARSE);
    KT_CONTAINS(e.msg, "config.json: not valid JSON");
}

static void test_not_object(void) {
    kiln_model_config m;
    kiln_error e = {0};
    KT_EQ_INT(parse_str("[1, 2]", &m, &e), KILN_ERR_PARSE);
    KT_CONTAINS(e.msg, "config.json: the top level is an array");
}

static void test_duplicate_key(void) {
    kiln_model_config m;
    kiln_error e = {0};
    KT_EQ_INT(parse_str("{\"hidden_size\": 64, \"hidden_size\": 128}", &m, &e), KILN_ERR_PARSE);
    KT_CONTAINS(e.msg, "duplicate object key near '\"hidden_size\"'");
}

static void test_load_missing_file(void) {
    kiln_model_config m;
    kiln_error e = {0};
    KT_EQ_INT(kiln_config_load("/nonexistent/kiln/config.json", &m, &e), KILN_ERR_IO);
    KT_CONTAINS(e.msg, "/nonexistent/kiln/config.json");
}

/* Qwen3-MoE: the tiny checkpoint's transformers 5 form (num_local_experts, rope_parameters, dtype), the
 * 4.x form of the published Qwen3-30B-A3B config.json (num_experts, rope_theta, torch_dtype,
 * max_window_layers), HF's defaults, which layers are sparse, the sliding window, and refusals by name */
static void test_qwen3_moe(void) {
    kiln_model_config m;
    kiln_error e = {0};
    char path[1024];
    snprintf(path, sizeof path, "%s/tests/data/tiny-qwen3-moe/config.json", KILN_SOURCE_DIR);
    KT_REQUIRE(kiln_config_load(path, &m, &e) == KILN_OK);
    KT_EQ_INT(m.arch, KILN_ARCH_QWEN3_MOE);
    KT_EQ_INT(m.n_experts, 16);
    KT_EQ_INT(m.n_experts_per_tok, 4);
    KT_EQ_INT(m.moe_intermediate_size, 16);
    KT_EQ_INT(m.intermediate_size, 96);
    KT_CHECK(m.norm_topk_prob);
    KT_CHECK(m.layer_sparse[0] && !m.layer_sparse[1] && m.layer_sparse[2]); /* mlp_only_layers [1] */
    KT_EQ_INT(m.sliding_window, 0);
    KT_CHECK(m.rope_theta == 1e6);
    KT_EQ_INT(m.head_dim, 16);
    KT_EQ_INT(m.torch_dtype, KILN_DTYPE_BF16);
    /* transformers 4.x form, as Qwen3-30B-A3B's config.json (shrunk) */
    const char *v4 = "{\"architectures\":[\"Qwen3MoeForCausalLM\"],\"model_type\":\"qwen3_moe\",\"hidden_size\":64,"
                     "\"num_hidden_layers\":4,\"num_attention_heads\":4,\"num_key_value_heads\":2,\"head_dim\":32,"
                     "\"intermediate_size\":96,\"vocab_size\":256,\"max_position_embeddings\":256,"
                     "\"rms_norm_eps\":1e-6,\"attention_bias\":false,\"hidden_act\":\"silu\",%s}";
    char buf[1536];
    snprintf(buf, sizeof buf, v4, "\"num_experts\":8,\"num_experts_per_tok\":2,\"moe_intermediate_size\":24,"
                                  "\"norm_topk_prob\":true,\"decoder_sparse_step\":1,\"mlp_only_layers\":[],"
                                  "\"max_window_layers\":4,\"use_sliding_window\":false,\"sliding_window\":null,"
                                  "\"rope_scaling\":null,\"rope_theta\":1000000.0,\"router_aux_loss_coef\":0.001,"
                                  "\"output_router_logits\":false,\"torch_dtype\":\"bfloat16\"");
    KT_EQ_INT(parse_str(buf, &m, &e), KILN_OK);
    KT_EQ_INT(m.n_experts, 8);
    KT_EQ_INT(m.n_experts_per_tok, 2);
    KT_EQ_INT(m.moe_intermediate_size, 24);
    KT_CHECK(m.norm_topk_prob);
    for (int l = 0; l < 4; l++) KT_CHECK(m.layer_sparse[l]);
    KT_EQ_INT(m.sliding_window, 0);
    KT_CHECK(m.rope_theta == 1e6);
    KT_EQ_INT(m.torch_dtype, KILN_DTYPE_BF16);
    /* Qwen3MoeConfig's defaults: 128 experts, top 8, width 768, not renormalised, theta 10000 */
    snprintf(buf, sizeof buf, v4, "\"sliding_window\":null");
    KT_EQ_INT(parse_str(buf, &m, &e), KILN_OK);
    KT_EQ_INT(m.n_experts, 128);
    KT_EQ_INT(m.n_experts_per_tok, 8);
    KT_EQ_INT(m.moe_intermediate_size, 768);
    KT_CHECK(!m.norm_topk_prob);
    KT_CHECK(m.rope_theta == 10000.0);
    /* decoder_sparse_step 2: layers 1 and 3 sparse; with mlp_only_layers [3], layer 1 alone */
    snprintf(buf, sizeof buf, v4, "\"num_experts\":8,\"decoder_sparse_step\":2");
    KT_EQ_INT(parse_str(buf, &m, &e), KILN_OK);
    KT_CHECK(!m.layer_sparse[0] && m.layer_sparse[1] && !m.layer_sparse[2] && m.layer_sparse[3]);
    snprintf(buf, sizeof buf, v4, "\"num_experts\":8,\"decoder_sparse_step\":2,\"mlp_only_layers\":[3]");
    KT_EQ_INT(parse_str(buf, &m, &e), KILN_OK);
    KT_CHECK(!m.layer_sparse[0] && m.layer_sparse[1] && !m.layer_sparse[2] && !m.layer_sparse[3]);
    /* the sliding window: every layer with use_sliding_window (transformers 5), none without */
    snprintf(buf, sizeof buf, v4, "\"num_experts\":8,\"use_sliding_window\":true,\"sliding_window\":16");
    KT_EQ_INT(parse_str(buf, &m, &e), KILN_OK);
    KT_EQ_INT(m.sliding_window, 16);
    for (int l = 0; l < 4; l++) KT_CHECK(m.layer_windowed[l]);
    snprintf(buf, sizeof buf, v4, "\"num_experts\":8,\"use_sliding_window\":true,\"sliding_window\":16,"
                                  "\"max_window_layers\":0");
    KT_EQ_INT(parse_str(buf, &m, &e), KILN_OK);
    KT_CHECK(m.layer_windowed[0] && m.layer_windowed[3]);
    snprintf(buf, sizeof buf, v4, "\"num_experts\":8,\"use_sliding_window\":false,\"sliding_window\":16,"
                                  "\"max_window_layers\":2");
    KT_EQ_INT(parse_str(buf, &m, &e), KILN_OK);
    KT_EQ_INT(m.sliding_window, 0);
    KT_CHECK(!m.layer_windowed[0] && !m.layer_windowed[3]);
    /* layer_types, which transformers does not read for Qwen3-MoE, must agree with that */
    snprintf(buf, sizeof buf, v4, "\"num_experts\":8,\"layer_types\":[\"full_attention\",\"full_attention\","
                                  "\"full_attention\",\"full_attention\"]");
    KT_EQ_INT(parse_str(buf, &m, &e), KILN_OK);
    KT_EQ_INT(m.sliding_window, 0);
    snprintf(buf, sizeof buf, v4, "\"num_experts\":8,\"layer_types\":[\"full_attention\",\"sliding_attention\","
                                  "\"full_attention\",\"full_attention\"],\"use_sliding_window\":false");
    KT_EQ_INT(parse_str(buf, &m, &e), KILN_ERR_UNSUPPORTED);
    KT_CONTAINS(e.msg, "field \"layer_types\"[1] is \"sliding_attention\", but transformers' Qwen3MoeForCausalLM "
                       "does not read layer_types: every layer is unwindowed");
    /* refusals, by name */
    snprintf(buf, sizeof buf, v4, "\"num_experts\":8,\"use_sliding_window\":true,\"sliding_window\":16,"
                                  "\"max_window_layers\":2");
    KT_EQ_INT(parse_str(buf, &m, &e), KILN_ERR_UNSUPPORTED);
    KT_CONTAINS(e.msg, "use_sliding_window is true with sliding_window 16 and max_window_layers 2");
    KT_CONTAINS(e.msg, "hint: set \"max_window_layers\": 0");
    snprintf(buf, sizeof buf, v4, "\"num_experts\":8,\"num_local_experts\":16");
    KT_EQ_INT(parse_str(buf, &m, &e), KILN_ERR_PARSE);
    KT_CONTAINS(e.msg, "field \"num_experts\" is 8 but \"num_local_experts\" is 16");
    snprintf(buf, sizeof buf, v4, "\"num_experts\":8,\"num_experts_per_tok\":9");
    KT_EQ_INT(parse_str(buf, &m, &e), KILN_ERR_PARSE);
    KT_CONTAINS(e.msg, "field \"num_experts_per_tok\" is 9, more than the 8 experts");
    snprintf(buf, sizeof buf, v4, "\"num_experts\":0");
    KT_EQ_INT(parse_str(buf, &m, &e), KILN_ERR_PARSE);
    KT_CONTAINS(e.msg, "field \"num_experts\" is 0; it must be at least 1");
    snprintf(buf, sizeof buf, v4, "\"moe_intermediate_size\":0");
    KT_EQ_INT(parse_str(buf, &m, &e), KILN_ERR_PARSE);
    KT_CONTAINS(e.msg, "field \"moe_intermediate_size\" is 0; it must be at least 1");
    snprintf(buf, sizeof buf, v4, "\"norm_topk_prob\":1");
    KT_EQ_INT(parse_str(buf, &m, &e), KILN_ERR_PARSE);
    KT_CONTAINS(e.msg, "field \"norm_topk_prob\" is 1 (an integer); it must be true or false");
    snprintf(buf, sizeof buf, v4, "\"decoder_sparse_step\":0");
    KT_EQ_INT(parse_str(buf, &m, &e), KILN_ERR_PARSE);
    KT_CONTAINS(e.msg, "field \"decoder_sparse_step\" is 0; it must be at least 1");
    snprintf(buf, sizeof buf, v4, "\"mlp_only_layers\":[4]");
    KT_EQ_INT(parse_str(buf, &m, &e), KILN_ERR_PARSE);
    KT_CONTAINS(e.msg, "field \"mlp_only_layers\"[0] is 4, not a layer index in [0, 4)");
    snprintf(buf, sizeof buf, v4, "\"mlp_only_layers\":[\"1\"]");
    KT_EQ_INT(parse_str(buf, &m, &e), KILN_ERR_PARSE);
    KT_CONTAINS(e.msg, "field \"mlp_only_layers\" is [\"1\"] (an array); it must be a list of layer indices");
    snprintf(buf, sizeof buf, v4, "\"mlp_only_layers\":2");
    KT_EQ_INT(parse_str(buf, &m, &e), KILN_ERR_PARSE);
    KT_CONTAINS(e.msg, "mlp_only_layers");
    snprintf(buf, sizeof buf, v4, "\"router_aux_loss_coef\":\"x\"");
    KT_EQ_INT(parse_str(buf, &m, &e), KILN_ERR_PARSE);
    KT_CONTAINS(e.msg, "router_aux_loss_coef");
    snprintf(buf, sizeof buf, v4, "\"mlp_bias\":true");
    KT_EQ_INT(parse_str(buf, &m, &e), KILN_ERR_UNSUPPORTED);
    KT_CONTAINS(e.msg, "field \"mlp_bias\" is true");
    /* model_type alone */
    KT_EQ_INT(parse_str("{\"model_type\":\"qwen3_moe\",\"hidden_size\":64,\"num_hidden_layers\":1,"
                        "\"num_attention_heads\":4,\"intermediate_size\":8,\"vocab_size\":16,"
                        "\"max_position_embeddings\":8,\"rms_norm_eps\":1e-6}", &m, &e), KILN_OK);
    KT_EQ_INT(m.arch, KILN_ARCH_QWEN3_MOE);
    KT_EQ_INT(m.n_experts, 128);
}

/* ---- refusals: architecture and features ---- */

/* quantization_config: 4-bit AWQ (gemm) and GPTQ (v1, v2) are read (docs/quantization.md); every other
 * method, version or setting is refused naming the field. */
static void test_quantized_checkpoint(void) {
    kiln_model_config m;
    kiln_error e = {0};
    KT_EQ_INT(parse_with("quantization_config", "null", &m, &e), KILN_OK); /* null: none */
    KT_EQ_INT(m.quant.method, KILN_CKPT_QUANT_NONE);
    KT_EQ_INT(parse_with("quantization_config", "{\"quant_method\": \"awq\", \"bits\": 4, \"group_size\": 128, "
                         "\"zero_point\": true, \"version\": \"gemm\", \"modules_to_not_convert\": null}", &m, &e),
              KILN_OK);
    KT_EQ_INT(m.quant.method, KILN_CKPT_QUANT_AWQ);
    KT_EQ_INT(m.quant.group_size, 128);
    KT_EQ_STR(kiln_ckpt_quant_name(&m.quant), "awq");
    /* GPTQ: v1 unless checkpoint_format (or GPTQModel's format) says gptq_v2; sym and desc_act as given */
    KT_EQ_INT(parse_with("quantization_config", "{\"quant_method\": \"gptq\", \"bits\": 4, \"group_size\": 32, "
                         "\"sym\": false, \"desc_act\": true}", &m, &e), KILN_OK);
    KT_EQ_INT(m.quant.method, KILN_CKPT_QUANT_GPTQ);
    KT_CHECK(!m.quant.gptq_v2 && !m.quant.sym && m.quant.desc_act);
    KT_EQ_INT(parse_with("quantization_config", "{\"quant_method\": \"gptq\", \"bits\": 4, \"group_size\": 64, "
                         "\"format\": \"gptq_v2\", \"dynamic\": {}}", &m, &e), KILN_OK);
    KT_CHECK(m.quant.gptq_v2 && m.quant.sym && m.quant.group_size == 64);
    KT_EQ_STR(kiln_ckpt_quant_name(&m.quant), "gptq_v2");

    expect_fail("quantization_config", "{\"quant_method\": \"bitsandbytes\"}", KILN_ERR_UNSUPPORTED,
                "field \"quantization_config.quant_method\" is \"bitsandbytes\": kiln reads only \"awq\", \"gptq\", "
                "\"compressed-tensors\" and \"fp8\"");
    expect_fail("quantization_config", "{\"bits\": 4}", KILN_ERR_MISSING, "\"quantization_config.quant_method\"");
    expect_fail("quantization_config", "{\"quant_method\": \"awq\", \"bits\": 4}", KILN_ERR_MISSING,
                "\"quantization_config.group_size\"");
    expect_fail("quantization_config", "[1]", KILN_ERR_PARSE, "field \"quantization_config\" is [1]");
    expect_fail("quantization_config", "{\"quant_method\": \"gptq\", \"bits\": 8, \"group_size\": 128}",
                KILN_ERR_UNSUPPORTED, "field \"quantization_config.bits\" is 8: kiln reads 4-bit checkpoints only");
    expect_fail("quantization_config", "{\"quant_method\": \"gptq\", \"bits\": 4, \"group_size\": -1}",
                KILN_ERR_UNSUPPORTED, "\"quantization_config.group_size\" is -1: per-channel scales");
    expect_fail("quantization_config", "{\"quant_method\": \"awq\", \"bits\": 4, \"group_size\": 256}",
                KILN_ERR_UNSUPPORTED, "\"quantization_config.group_size\" is 256: kiln's int4 format has groups of 32");
    expect_fail("quantization_config", "{\"quant_method\": \"awq\", \"bits\": 4, \"group_size\": 128, \"version\": "
                "\"gemv\"}", KILN_ERR_UNSUPPORTED, "\"quantization_config.version\" is \"gemv\"");
    expect_fail("quantization_config", "{\"quant_method\": \"awq\", \"bits\": 4, \"group_size\": 128, \"zero_point\": "
                "false}", KILN_ERR_UNSUPPORTED, "\"quantization_config.zero_point\" is false");
    expect_fail("quantization_config", "{\"quant_method\": \"gptq\", \"bits\": 4, \"group_size\": 128, "
                "\"checkpoint_format\": \"marlin\"}", KILN_ERR_UNSUPPORTED,
                "\"quantization_config.checkpoint_format\" is \"marlin\"");
    expect_fail("quantization_config", "{\"quant_method\": \"gptq\", \"bits\": 4, \"group_size\": 128, "
                "\"checkpoint_format\": \"gptq\", \"format\": \"gptq_v2\"}", KILN_ERR_PARSE, "disagree");
    /* GPTQModel's dynamic map: rules in the map's order, the first whose pattern matches a module's name
     * from its start decides it */
    KT_EQ_INT(parse_with("quantization_config", "{\"quant_method\": \"gptq\", \"bits\": 4, \"group_size\": 128, "
                         "\"dynamic\": {\"-:.*\\\\.0\\\\..*down\": {}, \"+:model\\\\.layers\\\\.\\\\d+\\\\.mlp\\\\.(gate|up)_proj\": "
                         "{\"group_size\": 32, \"bits\": 4, \"damp_percent\": 0.1}, \".*_proj\": {\"group_size\": 64, "
                         "\"sym\": true}, \".*\": {\"bits\": 8}}}", &m, &e), KILN_OK);
    KT_EQ_INT(m.quant.n_rules, 4);
    static const struct {
        const char *module;
        int group, rule; /* group 0: left unquantized; rule -1: none decides */
    } dyn[] = {{"model.layers.0.mlp.down_proj", 0, 0},       {"model.layers.10.mlp.down_proj", 64, 2},
               {"model.layers.3.mlp.up_proj", 32, 1},        {"model.layers.3.self_attn.q_proj", 64, 2},
               {"xmodel.layers.3.mlp.gate_proj", 64, 2}, /* re.match: anchored at the start, */
               {"model.layers.3.mlp.gate_proj.extra", 32, 1}}; /* not at the end */
    for (size_t i = 0; i < sizeof dyn / sizeof dyn[0]; i++) {
        int group = -1;
        const kiln_gptq_rule *rule = NULL;
        KT_EQ_INT(kiln_ckpt_quant_module(&m.quant, dyn[i].module, &group, &rule, &e), KILN_OK);
        KT_EQ_INT(group, dyn[i].group);
        KT_EQ_INT(rule ? (int)(rule - m.quant.rules) : -1, dyn[i].rule);
    }
    /* the last rule matches what the others leave and gives 8 bits: refused for that module */
    int group;
    const kiln_gptq_rule *rule;
    KT_EQ_INT(kiln_ckpt_quant_module(&m.quant, "lm_head", &group, &rule, &e), KILN_ERR_UNSUPPORTED);
    KT_CONTAINS(e.msg, "rule \".*\" gives module 'lm_head' 8 bits: kiln reads 4-bit GPTQ only");
    /* a pattern that backtracks exponentially over a module name is stopped, not left to run */
    KT_EQ_INT(parse_with("quantization_config", "{\"quant_method\": \"gptq\", \"bits\": 4, \"group_size\": 128, "
                         "\"dynamic\": {\"-:(.*)*(.*)*x\": {}}}", &m, &e), KILN_OK);
    KT_EQ_INT(kiln_ckpt_quant_module(&m.quant, "model.layers.12.self_attn.q_proj.weight.extra.long.name", &group, &rule,
                                     &e), KILN_ERR_UNSUPPORTED);
    KT_CONTAINS(e.msg, "match limit");
    expect_fail("quantization_config", "{\"quant_method\": \"gptq\", \"bits\": 4, \"group_size\": 128, "
                "\"dynamic\": {\"+:(unclosed\": {}}}", KILN_ERR_PARSE,
                "the pattern of rule \"+:(unclosed\" of \"quantization_config.dynamic\" does not compile");
    expect_fail("quantization_config", "{\"quant_method\": \"gptq\", \"bits\": 4, \"group_size\": 128, "
                "\"dynamic\": {\".*\": {\"group_size\": 256}}}", KILN_ERR_UNSUPPORTED,
                "\"quantization_config.dynamic..*.group_size\" is 256: kiln's int4 format has groups of 32");
    expect_fail("quantization_config", "{\"quant_method\": \"gptq\", \"bits\": 4, \"group_size\": 128, "
                "\"dynamic\": {\".*\": {\"pack_dtype\": \"int16\"}}}", KILN_ERR_UNSUPPORTED,
                "\"quantization_config.dynamic..*.pack_dtype\" is \"int16\": kiln reads the overrides bits");
    expect_fail("quantization_config", "{\"quant_method\": \"gptq\", \"bits\": 4, \"group_size\": 128, "
                "\"dynamic\": {\"-:.*down\": {\"bits\": 8}}}", KILN_ERR_UNSUPPORTED, "takes no overrides");
    expect_fail("quantization_config", "{\"quant_method\": \"gptq\", \"bits\": 4, \"group_size\": 128, "
                "\"dynamic\": [1]}", KILN_ERR_PARSE, "field \"quantization_config.dynamic\" is [1]");
    expect_fail("quantization_config", "{\"quant_method\": \"gptq\", \"bits\": 4, \"group_size\": 128, "
                "\"dynamic\": {\".*\": 3}}", KILN_ERR_PARSE, "it must be an object of overrides");
    expect_fail("quantization_config", "{\"quant_method\": \"gptq\", \"bits\": 4, \"group_size\": 128, "
                "\"lm_head\": true}", KILN_ERR_UNSUPPORTED, "\"quantization_config.lm_head\" is true");
    expect_fail("quantization_config", "{\"quant_method\": \"gptq\", \"bits\": 4, \"group_size\": 128, "
                "\"sym\": 1}", KILN_ERR_PARSE, "field \"quantization_config.sym\" is 1");
}

/* A compressed-tensors quantization_config as llm-compressor writes W4A16 (group 32, symmetric), with
 * `group` added to the group's fields, `weights` to its weights' and `top` to the top level
 * (later keys win: jansson keeps the last of duplicates). */
static const char *ct_config(char *buf, size_t n, const char *weights, const char *group, const char *top) {
    snprintf(buf, n,
             "{\"quant_method\": \"compressed-tensors\", \"format\": \"pack-quantized\", \"quantization_status\": "
             "\"compressed\", \"ignore\": [\"lm_head\"], \"kv_cache_scheme\": null, \"sparsity_config\": {}, "
             "\"transform_config\": {}, \"global_compression_ratio\": null, \"version\": \"0.12.2\", "
             "\"config_groups\": {\"group_0\": {\"targets\": [\"Linear\"], \"input_activations\": null, "
             "\"output_activations\": null, \"format\": \"pack-quantized\", \"weights\": {\"num_bits\": 4, "
             "\"type\": \"int\", \"symmetric\": true, \"strategy\": \"group\", \"group_size\": 32, \"dynamic\": false, "
             "\"actorder\": null, \"block_structure\": null, \"observer\": \"minmax\", \"observer_kwargs\": {}%s}%s}}%s}",
             weights, group, top);
    return buf;
}

/* compressed-tensors: pack-quantized int4 groups are read (W4A16, symmetric or not); other formats,
 * widths, strategies, act-order, quantized activations or KV cache, mixed groups, sparsity and
 * transforms are refused naming the field. */
static void test_compressed_tensors_config(void) {
    kiln_model_config m;
    kiln_error e = {0};
    char b[2048];
    KT_EQ_INT(parse_with("quantization_config", ct_config(b, sizeof b, "", "", ""), &m, &e), KILN_OK);
    KT_EQ_INT(m.quant.method, KILN_CKPT_QUANT_CT);
    KT_CHECK(m.quant.sym && m.quant.bits == 4 && m.quant.group_size == 32);
    KT_EQ_STR(kiln_ckpt_quant_name(&m.quant), "compressed-tensors");
    /* asymmetric, group 128, act-order "weight" (groups in order), no per-group format, projections targeted
     * by name, a second group with the same settings */
    KT_EQ_INT(parse_with("quantization_config",
                         ct_config(b, sizeof b, ", \"symmetric\": false, \"group_size\": 128, \"actorder\": \"weight\"",
                                   ", \"format\": null, \"targets\": [\"re:.*q_proj$\", \"down_proj\"]", ""),
                         &m, &e), KILN_OK);
    KT_CHECK(!m.quant.sym && m.quant.group_size == 128 && !m.quant.desc_act);
    /* act-order "group" (and its aliases): each projection's weight_g_idx is read (desc_act) */
    static const char *const group_orders[] = {", \"actorder\": \"group\"", ", \"actorder\": \"dynamic\"",
                                               ", \"actorder\": true"};
    for (int i = 0; i < 3; i++) {
        KT_EQ_INT(parse_with("quantization_config", ct_config(b, sizeof b, group_orders[i], "", ""), &m, &e), KILN_OK);
        KT_CHECK(m.quant.desc_act);
    }
    /* no strategy with a group size: group (as compressed-tensors infers it) */
    KT_EQ_INT(parse_with("quantization_config", ct_config(b, sizeof b, ", \"strategy\": null", "", ""), &m, &e),
              KILN_OK);
    KT_EQ_INT(m.quant.group_size, 32);

    static const struct { const char *w, *g, *top; kiln_status code; const char *needle; } bad[] = {
        {"", "", ", \"format\": \"float-quantized\"", KILN_ERR_UNSUPPORTED,
         "\"quantization_config.format\" is \"float-quantized\": config group \"group_0\" says \"pack-quantized\""},
        {"", ", \"format\": \"marlin-24\"", "", KILN_ERR_UNSUPPORTED,
         "\"quantization_config.config_groups.group_0.format\" is \"marlin-24\""},
        {"", ", \"format\": null", ", \"format\": \"int-quantized\"", KILN_ERR_UNSUPPORTED,
         "\"quantization_config.format\" is \"int-quantized\""},
        {", \"num_bits\": 8", "", "", KILN_ERR_UNSUPPORTED,
         "\"quantization_config.config_groups.group_0.weights.num_bits\" is 8: kiln reads 4-bit"},
        {", \"type\": \"float\"", "", "", KILN_ERR_UNSUPPORTED,
         "\"quantization_config.config_groups.group_0.weights.type\" is \"float\""},
        {", \"strategy\": \"channel\"", "", "", KILN_ERR_UNSUPPORTED,
         "\"quantization_config.config_groups.group_0.weights.strategy\" is \"channel\": only per-group scales"},
        {", \"group_size\": 16", "", "", KILN_ERR_UNSUPPORTED,
         "\"quantization_config.config_groups.group_0.weights.group_size\" is 16"},
        {", \"actorder\": \"columns\"", "", "", KILN_ERR_UNSUPPORTED,
         "\"quantization_config.config_groups.group_0.weights.actorder\" is \"columns\": kiln reads act-order"},
        {", \"dynamic\": true", "", "", KILN_ERR_UNSUPPORTED,
         "\"quantization_config.config_groups.group_0.weights.dynamic\" is true"},
        {"", ", \"input_activations\": {\"num_bits\": 8, \"type\": \"int\", \"dynamic\": true}", "",
         KILN_ERR_UNSUPPORTED, "\"quantization_config.config_groups.group_0.input_activations\" is {"},
        {"", ", \"targets\": [\"Embedding\"]", "", KILN_ERR_UNSUPPORTED,
         "\"quantization_config.config_groups.group_0.targets\" is \"Embedding\""},
        {"", ", \"weights\": null", "", KILN_ERR_UNSUPPORTED,
         "\"quantization_config.config_groups.group_0.weights\" is null"},
        {"", "", ", \"kv_cache_scheme\": {\"num_bits\": 8, \"type\": \"float\"}", KILN_ERR_UNSUPPORTED,
         "\"quantization_config.kv_cache_scheme.strategy\" is absent: kiln reads static KV scales per tensor or per "
         "head (attn_head) only"},
        {"", "", ", \"kv_cache_scheme\": {\"num_bits\": 8, \"type\": \"float\", \"strategy\": \"channel\"}",
         KILN_ERR_UNSUPPORTED, "\"quantization_config.kv_cache_scheme.strategy\" is \"channel\": kiln reads static KV"},
        {"", "", ", \"sparsity_config\": {\"format\": \"sparse-24-bitmask\"}", KILN_ERR_UNSUPPORTED,
         "\"quantization_config.sparsity_config\" is {"},
        {"", "", ", \"transform_config\": {\"config_groups\": {}}", KILN_ERR_UNSUPPORTED,
         "\"quantization_config.transform_config\" is {"},
        {"", "", ", \"quantization_status\": \"frozen\"", KILN_ERR_UNSUPPORTED,
         "\"quantization_config.quantization_status\" is \"frozen\""},
        {"", "", ", \"config_groups\": {}", KILN_ERR_PARSE, "\"quantization_config.config_groups\" is {}"},
        {"", "", ", \"ignore\": \"lm_head\"", KILN_ERR_PARSE, "\"quantization_config.ignore\" is \"lm_head\""},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        expect_fail("quantization_config", ct_config(b, sizeof b, bad[i].w, bad[i].g, bad[i].top), bad[i].code,
                    bad[i].needle);
    /* two groups with different settings (mixed precision) */
    expect_fail("quantization_config",
                "{\"quant_method\": \"compressed-tensors\", \"format\": \"pack-quantized\", \"config_groups\": {"
                "\"group_0\": {\"targets\": [\"Linear\"], \"weights\": {\"num_bits\": 4, \"strategy\": \"group\", "
                "\"group_size\": 32}}, \"group_1\": {\"targets\": [\"down_proj\"], \"weights\": {\"num_bits\": 8, "
                "\"strategy\": \"group\", \"group_size\": 32}}}}",
                KILN_ERR_UNSUPPORTED, "\"quantization_config.config_groups.group_1.weights\" is not group \"group_0\"'s");
    expect_fail("quantization_config", "{\"quant_method\": \"compressed-tensors\"}", KILN_ERR_MISSING,
                "\"quantization_config.config_groups\"");
}

/* FP8 checkpoints: quant_method "fp8" with one scale per tensor (AutoFP8, vLLM, transformers), dynamic or
 * static activations; block scales, another fmt, FP8 embeddings and a KV cache scheme refused naming the field. */
static void test_fp8_config(void) {
    kiln_model_config m;
    kiln_error e = {0};
    KT_EQ_INT(parse_with("quantization_config", "{\"quant_method\": \"fp8\"}", &m, &e), KILN_OK);
    KT_EQ_INT(m.quant.method, KILN_CKPT_QUANT_FP8);
    KT_CHECK(m.quant.fp8 && !m.quant.fp8_channel && !m.quant.static_input && m.quant.bits == 8);
    KT_EQ_STR(kiln_ckpt_quant_name(&m.quant), "fp8");
    /* AutoFP8's static config; transformers lowercases the scheme, so "Static" is static */
    KT_EQ_INT(parse_with("quantization_config", "{\"quant_method\": \"fp8\", \"activation_scheme\": \"Static\", "
                         "\"ignored_layers\": [\"lm_head\"], \"fmt\": \"e4m3\", \"weight_block_size\": null, "
                         "\"kv_cache_scheme\": null, \"modules_to_convert\": []}", &m, &e), KILN_OK);
    KT_CHECK(m.quant.fp8 && m.quant.static_input && !m.quant.fp8_block_n);
    /* block FP8 (DeepSeek-V3, Qwen3-FP8): blocks of 128 columns and any rows */
    KT_EQ_INT(parse_with("quantization_config", "{\"quant_method\": \"fp8\", \"activation_scheme\": \"dynamic\", "
                         "\"fmt\": \"e4m3\", \"weight_block_size\": [128, 128]}", &m, &e), KILN_OK);
    KT_CHECK(m.quant.fp8 && m.quant.fp8_block_n == 128 && !m.quant.fp8_channel);
    KT_EQ_INT(parse_with("quantization_config", "{\"quant_method\": \"fp8\", \"weight_block_size\": [1, 128]}", &m, &e),
              KILN_OK);
    KT_EQ_INT(m.quant.fp8_block_n, 1);
    static const struct { const char *qc; kiln_status code; const char *needle; } bad[] = {
        {"{\"quant_method\": \"fp8\", \"weight_block_size\": [128, 64]}", KILN_ERR_UNSUPPORTED,
         "\"quantization_config.weight_block_size\" is [128,64]: kiln reads block-wise FP8 with blocks of 128 columns"},
        {"{\"quant_method\": \"fp8\", \"weight_block_size\": [0, 128]}", KILN_ERR_UNSUPPORTED,
         "\"quantization_config.weight_block_size\" is [0,128]"},
        {"{\"quant_method\": \"fp8\", \"weight_block_size\": [128]}", KILN_ERR_PARSE,
         "\"quantization_config.weight_block_size\" is [128]"},
        {"{\"quant_method\": \"fp8\", \"weight_block_size\": \"128x128\"}", KILN_ERR_PARSE,
         "\"quantization_config.weight_block_size\" is \"128x128\""},
        {"{\"quant_method\": \"fp8\", \"activation_scheme\": \"per-token\"}", KILN_ERR_UNSUPPORTED,
         "\"quantization_config.activation_scheme\" is \"per-token\""},
        {"{\"quant_method\": \"fp8\", \"fmt\": \"e5m2\"}", KILN_ERR_UNSUPPORTED,
         "\"quantization_config.fmt\" is \"e5m2\": kiln reads E4M3"},
        {"{\"quant_method\": \"fp8\", \"kv_cache_scheme\": \"static\"}", KILN_ERR_UNSUPPORTED,
         "\"quantization_config.kv_cache_scheme\" is \"static\": its k_scale and v_scale are read from compressed-tensors "
         "checkpoints only"},
        {"{\"quant_method\": \"fp8\", \"modules_to_convert\": [\"embed_tokens\"]}", KILN_ERR_UNSUPPORTED,
         "\"quantization_config.modules_to_convert\" is [\"embed_tokens\"]"},
        {"{\"quant_method\": \"fp8\", \"ignored_layers\": \"lm_head\"}", KILN_ERR_PARSE,
         "\"quantization_config.ignored_layers\" is \"lm_head\""},
        {"{\"quant_method\": \"fp8\", \"activation_scheme\": 1}", KILN_ERR_PARSE,
         "\"quantization_config.activation_scheme\" is 1"},
        {"{\"quant_method\": \"fbgemm_fp8\"}", KILN_ERR_UNSUPPORTED, "\"quantization_config.quant_method\" is \"fbgemm_fp8\""},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) expect_fail("quantization_config", bad[i].qc, bad[i].code, bad[i].needle);
}

/* A compressed-tensors float-quantized config as llm-compressor writes FP8_DYNAMIC (channel weights,
 * dynamic per-token inputs), with `weights` added to the weights' fields, `inputs` to the input
 * activations' and `group` to the group's. */
static const char *ct_fp8_config(char *buf, size_t n, const char *weights, const char *inputs, const char *group) {
    snprintf(buf, n,
             "{\"quant_method\": \"compressed-tensors\", \"format\": \"float-quantized\", \"quantization_status\": "
             "\"compressed\", \"ignore\": [\"lm_head\"], \"kv_cache_scheme\": null, \"sparsity_config\": {}, "
             "\"config_groups\": {\"group_0\": {\"targets\": [\"Linear\"], \"output_activations\": null, "
             "\"format\": \"float-quantized\", \"weights\": {\"num_bits\": 8, \"type\": \"float\", \"symmetric\": true, "
             "\"strategy\": \"channel\", \"group_size\": null, \"dynamic\": false, \"actorder\": null, "
             "\"block_structure\": null, \"observer\": \"minmax\"%s}, \"input_activations\": {\"num_bits\": 8, "
             "\"type\": \"float\", \"symmetric\": true, \"strategy\": \"token\", \"dynamic\": true%s}%s}}}",
             weights, inputs, group);
    return buf;
}

/* compressed-tensors float-quantized: FP8 E4M3 weights per tensor or channel, FP8 or no input activations
 * (static ones per tensor); blocks, groups, other widths and types, asymmetry, quantized outputs refused. */
static void test_compressed_tensors_fp8_config(void) {
    kiln_model_config m;
    kiln_error e = {0};
    char b[2048];
    KT_EQ_INT(parse_with("quantization_config", ct_fp8_config(b, sizeof b, "", "", ""), &m, &e), KILN_OK);
    KT_EQ_INT(m.quant.method, KILN_CKPT_QUANT_CT);
    KT_CHECK(m.quant.fp8 && m.quant.fp8_channel && !m.quant.static_input && m.quant.bits == 8);
    KT_EQ_STR(kiln_ckpt_quant_name(&m.quant), "compressed-tensors");
    /* llm-compressor's FP8 (static W8A8): tensor weights, static tensor inputs */
    KT_EQ_INT(parse_with("quantization_config",
                         ct_fp8_config(b, sizeof b, ", \"strategy\": \"tensor\"",
                                       ", \"strategy\": \"tensor\", \"dynamic\": false", ""), &m, &e), KILN_OK);
    KT_CHECK(m.quant.fp8 && !m.quant.fp8_channel && m.quant.static_input);
    /* no input activations; no strategy and no group size is per tensor */
    KT_EQ_INT(parse_with("quantization_config",
                         ct_fp8_config(b, sizeof b, ", \"strategy\": null", "", ", \"input_activations\": null"),
                         &m, &e), KILN_OK);
    KT_CHECK(m.quant.fp8 && !m.quant.fp8_channel && !m.quant.static_input);
    /* llm-compressor's FP8_BLOCK: block weights [128, 128], dynamic inputs per group of 128 (nothing stored) */
    KT_EQ_INT(parse_with("quantization_config",
                         ct_fp8_config(b, sizeof b, ", \"strategy\": \"block\", \"block_structure\": [128, 128]",
                                       ", \"strategy\": \"group\", \"group_size\": 128", ""), &m, &e), KILN_OK);
    KT_CHECK(m.quant.fp8 && m.quant.fp8_block_n == 128 && !m.quant.fp8_channel && !m.quant.static_input);
    static const struct { const char *w, *in, *g; kiln_status code; const char *needle; } bad[] = {
        {", \"strategy\": \"block\", \"block_structure\": [128, 64]", "", "", KILN_ERR_UNSUPPORTED,
         "\"quantization_config.config_groups.group_0.weights.block_structure\" is [128,64]: kiln reads block-wise FP8 "
         "with blocks of 128 columns"},
        {", \"strategy\": \"block\"", "", "", KILN_ERR_MISSING,
         "\"quantization_config.config_groups.group_0.weights.block_structure\""},
        {", \"strategy\": \"block\", \"block_structure\": \"128x128\"", "", "", KILN_ERR_PARSE,
         "\"quantization_config.config_groups.group_0.weights.block_structure\" is \"128x128\""},
        {", \"block_structure\": [128, 128]", "", "", KILN_ERR_UNSUPPORTED,
         "\"quantization_config.config_groups.group_0.weights.block_structure\" is [128,128]: block-wise FP8"},
        {", \"strategy\": \"group\", \"group_size\": 128", "", "", KILN_ERR_UNSUPPORTED,
         "\"quantization_config.config_groups.group_0.weights.strategy\" is \"group\""},
        {", \"strategy\": null, \"group_size\": 128", "", "", KILN_ERR_UNSUPPORTED,
         "\"quantization_config.config_groups.group_0.weights.strategy\" is \"group\""},
        {", \"group_size\": 128", "", "", KILN_ERR_UNSUPPORTED,
         "\"quantization_config.config_groups.group_0.weights.group_size\" is 128"},
        {", \"num_bits\": 4", "", "", KILN_ERR_UNSUPPORTED,
         "\"quantization_config.config_groups.group_0.weights.num_bits\" is 4: kiln reads 8-bit (E4M3)"},
        {", \"type\": \"int\"", "", "", KILN_ERR_UNSUPPORTED,
         "\"quantization_config.config_groups.group_0.weights.type\" is \"int\""},
        {", \"symmetric\": false", "", "", KILN_ERR_UNSUPPORTED,
         "\"quantization_config.config_groups.group_0.weights.symmetric\" is false: asymmetric FP8"},
        {", \"dynamic\": true", "", "", KILN_ERR_UNSUPPORTED,
         "\"quantization_config.config_groups.group_0.weights.dynamic\" is true"},
        {", \"actorder\": \"group\"", "", "", KILN_ERR_UNSUPPORTED,
         "\"quantization_config.config_groups.group_0.weights.actorder\" is \"group\""},
        {"", ", \"type\": \"int\"", "", KILN_ERR_UNSUPPORTED,
         "\"quantization_config.config_groups.group_0.input_activations\" is {"},
        {"", ", \"dynamic\": false", "", KILN_ERR_UNSUPPORTED,
         "\"quantization_config.config_groups.group_0.input_activations.strategy\" is \"token\": static input scales"},
        {"", ", \"symmetric\": false", "", KILN_ERR_UNSUPPORTED,
         "\"quantization_config.config_groups.group_0.input_activations.symmetric\" is false"},
        {"", ", \"dynamic\": \"local\"", "", KILN_ERR_UNSUPPORTED,
         "\"quantization_config.config_groups.group_0.input_activations.dynamic\" is \"local\""},
        {"", "", ", \"output_activations\": {\"num_bits\": 8, \"type\": \"float\"}", KILN_ERR_UNSUPPORTED,
         "\"quantization_config.config_groups.group_0.output_activations\" is {"},
        {"", "", ", \"format\": \"nvfp4-pack-quantized\"", KILN_ERR_UNSUPPORTED,
         "\"quantization_config.config_groups.group_0.format\" is \"nvfp4-pack-quantized\""},
        {"", "", ", \"format\": \"pack-quantized\"", KILN_ERR_UNSUPPORTED,
         "\"quantization_config.format\" is \"float-quantized\": config group \"group_0\" says \"pack-quantized\""},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        expect_fail("quantization_config", ct_fp8_config(b, sizeof b, bad[i].w, bad[i].in, bad[i].g), bad[i].code,
                    bad[i].needle);
}

static void test_architecture(void) {
    expect_fail("architectures", "[\"GPT2LMHeadModel\"]", KILN_ERR_UNSUPPORTED,
                "architecture [\"GPT2LMHeadModel\"] is not supported (supported: LlamaForCausalLM, MistralForCausalLM, "
                "Qwen2ForCausalLM, Qwen3ForCausalLM, MixtralForCausalLM, Qwen3MoeForCausalLM)");
    expect_fail("architectures", "[]", KILN_ERR_PARSE, "field \"architectures\" is []");
    expect_fail("architectures", "\"LlamaForCausalLM\"", KILN_ERR_PARSE, "field \"architectures\" is \"LlamaForCausalLM\"");
    expect_fail("architectures", "[7]", KILN_ERR_PARSE, "field \"architectures\" is [7]");
    /* without architectures, model_type decides */
    kiln_model_config m;
    kiln_error e = {0};
    KT_EQ_INT(parse_with("architectures", NULL, &m, &e), KILN_OK);
    KT_EQ_INT(m.arch, KILN_ARCH_LLAMA);
    const char *bare = "{\"hidden_size\":64}";
    KT_EQ_INT(parse_str(bare, &m, &e), KILN_ERR_MISSING);
    KT_CONTAINS(e.msg, "config.json: field \"architectures\" is missing");
    KT_EQ_INT(parse_str("{\"model_type\":\"gpt2\"}", &m, &e), KILN_ERR_UNSUPPORTED);
    KT_CONTAINS(e.msg, "model_type \"gpt2\"");
}

static void test_hidden_act(void) {
    expect_fail("hidden_act", "\"gelu\"", KILN_ERR_UNSUPPORTED, "field \"hidden_act\" is \"gelu\"");
    expect_fail("hidden_act", "1", KILN_ERR_PARSE, "field \"hidden_act\" is 1");
}

static void test_biases(void) {
    expect_fail("attention_bias", "true", KILN_ERR_UNSUPPORTED, "field \"attention_bias\" is true");
    expect_fail("mlp_bias", "true", KILN_ERR_UNSUPPORTED, "field \"mlp_bias\" is true");
    expect_fail("attention_bias", "\"no\"", KILN_ERR_PARSE, "field \"attention_bias\" is \"no\"");
}

/* ---- refusals: sizes ---- */

static const char *const required_fields[] = {"hidden_size", "num_hidden_layers", "num_attention_heads",
                                              "intermediate_size", "vocab_size", "max_position_embeddings",
                                              "rms_norm_eps"};

static void test_required_missing(void) {
    for (size_t i = 0; i < sizeof required_fields / sizeof required_fields[0]; i++) {
        char want[80];
        snprintf(want, sizeof want, "required field \"%s\" is missing", required_fields[i]);
        expect_fail(required_fields[i], NULL, KILN_ERR_MISSING, want);
        expect_fail(required_fields[i], "null", KILN_ERR_MISSING, want);
    }
}

static void test_int_fields_reject_floats_and_strings(void) {
    static const char *const ints[] = {"hidden_size", "num_hidden_layers", "num_attention_heads",
                                       "num_key_value_heads", "intermediate_size", "vocab_size",
                                       "max_position_embeddings", "head_dim", "bos_token_id", "eos_token_id"};
    for (size_t i = 0; i < sizeof ints / sizeof ints[0]; i++) {
        char want[96];
        snprintf(want, sizeof want, "field \"%s\" is 4.0 (a real number); it must be an integer", ints[i]);
        expect_fail(ints[i], "4.0", KILN_ERR_PARSE, want);
        snprintf(want, sizeof want, "field \"%s\" is \"4\" (a string)", ints[i]);
        expect_fail(ints[i], "\"4\"", KILN_ERR_PARSE, want);
    }
}

static void test_sizes_not_positive(void) {
    static const char *const ints[] = {"hidden_size", "num_hidden_layers", "num_attention_heads",
                                       "num_key_value_heads", "intermediate_size", "vocab_size",
                                       "max_position_embeddings", "head_dim"};
    for (size_t i = 0; i < sizeof ints / sizeof ints[0]; i++) {
        char want[96];
        snprintf(want, sizeof want, "field \"%s\" is 0; it must be at least 1", ints[i]);
        expect_fail(ints[i], "0", KILN_ERR_PARSE, want);
        snprintf(want, sizeof want, "field \"%s\" is -8", ints[i]);
        expect_fail(ints[i], "-8", KILN_ERR_PARSE, want);
    }
}

static void test_sizes_capped(void) {
    expect_fail("hidden_size", "65537", KILN_ERR_UNSUPPORTED, "field \"hidden_size\" is 65537, above kiln's limit of 65536");
    expect_fail("num_hidden_layers", "1025", KILN_ERR_UNSUPPORTED, "field \"num_hidden_layers\" is 1025");
    expect_fail("num_attention_heads", "1025", KILN_ERR_UNSUPPORTED, "field \"num_attention_heads\" is 1025");
    expect_fail("vocab_size", "16777217", KILN_ERR_UNSUPPORTED, "field \"vocab_size\" is 16777217");
    expect_fail("max_position_embeddings", "16777217", KILN_ERR_UNSUPPORTED, "field \"max_position_embeddings\" is 16777217");
    expect_fail("intermediate_size", "9223372036854775807", KILN_ERR_UNSUPPORTED,
                "field \"intermediate_size\" is 9223372036854775807");
    expect_fail("head_dim", "2048", KILN_ERR_UNSUPPORTED, "field \"head_dim\" is 2048");
}

static void test_kv_heads_divide(void) {
    expect_fail("num_key_value_heads", "3", KILN_ERR_PARSE,
                "config.json: field \"num_key_value_heads\" is 3, which does not divide num_attention_heads 8");
    expect_fail("num_key_value_heads", "16", KILN_ERR_PARSE, "field \"num_key_value_heads\" is 16");
}

static void test_head_dim(void) {
    expect_fail("head_dim", "33", KILN_ERR_PARSE, "field \"head_dim\" is 33; rotary embeddings need an even head_dim");
    /* without head_dim, hidden must split evenly over the heads */
    kiln_model_config m;
    kiln_error e = {0};
    json_t *root = json_loads(BASE, 0, NULL);
    json_object_set_new(root, "hidden_size", json_integer(260));
    char *text = json_dumps(root, 0);
    KT_EQ_INT(parse_str(text, &m, &e), KILN_ERR_PARSE);
    KT_CONTAINS(e.msg, "field \"hidden_size\" is 260, which num_attention_heads 8 does not divide");
    free(text);
    json_object_set_new(root, "head_dim", json_integer(32)); /* explicit head_dim: fine */
    text = json_dumps(root, 0);
    KT_EQ_INT(parse_str(text, &m, &e), KILN_OK);
    free(text);
    json_decref(root);
}

static void test_eps(void) {
    expect_fail("rms_norm_eps", "0", KILN_ERR_PARSE, "field \"rms_norm_eps\" is 0; it must be a positive number");
    expect_fail("rms_norm_eps", "-1e-6", KILN_ERR_PARSE, "field \"rms_norm_eps\" is -1e-06");
    expect_fail("rms_norm_eps", "\"1e-6\"", KILN_ERR_PARSE, "field \"rms_norm_eps\" is \"1e-6\" (a string)");
    kiln_model_config m;
    kiln_error e = {0};
    KT_EQ_INT(parse_with("rms_norm_eps", "1", &m, &e), KILN_OK); /* an integer is a number too */
    KT_CHECK(m.rms_norm_eps == 1.0);
}

/* ---- refusals: the rest ---- */

static void test_tie_word_embeddings(void) {
    expect_fail("tie_word_embeddings", "\"true\"", KILN_ERR_PARSE, "field \"tie_word_embeddings\" is \"true\"");
    kiln_model_config m;
    kiln_error e = {0};
    KT_EQ_INT(parse_with("tie_word_embeddings", "true", &m, &e), KILN_OK);
    KT_CHECK(m.tie_word_embeddings);
}

static void test_token_ids(void) {
    expect_fail("bos_token_id", "1000", KILN_ERR_PARSE, "field \"bos_token_id\" is 1000, outside the vocabulary [0, 1000)");
    expect_fail("bos_token_id", "-1", KILN_ERR_PARSE, "field \"bos_token_id\" is -1");
    expect_fail("eos_token_id", "[1,2,3,4,5,6,7,8,9]", KILN_ERR_UNSUPPORTED, "field \"eos_token_id\" lists 9 ids");
    expect_fail("eos_token_id", "[2,\"x\"]", KILN_ERR_PARSE, "field \"eos_token_id[1]\" is \"x\"");
    expect_fail("eos_token_id", "[2,null]", KILN_ERR_PARSE, "field \"eos_token_id[1]\" is null");
    expect_fail("eos_token_id", "[2,5000]", KILN_ERR_PARSE, "field \"eos_token_id[1]\" is 5000, outside the vocabulary");
    expect_fail("eos_token_id", "{\"a\":2}", KILN_ERR_PARSE, "field \"eos_token_id\" is {\"a\":2}");
    kiln_model_config m;
    kiln_error e = {0};
    KT_EQ_INT(parse_with("eos_token_id", "[7, 9]", &m, &e), KILN_OK);
    KT_EQ_INT(m.n_eos, 2);
    KT_EQ_INT(m.eos_token_ids[1], 9);
    KT_EQ_INT(parse_with("eos_token_id", "[]", &m, &e), KILN_OK);
    KT_EQ_INT(m.n_eos, 0);
}

static void test_dtype(void) {
    kiln_model_config m;
    kiln_error e = {0};
    KT_EQ_INT(parse_with("torch_dtype", "\"float16\"", &m, &e), KILN_OK);
    KT_EQ_INT(m.torch_dtype, KILN_DTYPE_F16);
    KT_EQ_INT(parse_with("torch_dtype", "\"float32\"", &m, &e), KILN_OK);
    KT_EQ_INT(m.torch_dtype, KILN_DTYPE_F32);
    KT_EQ_INT(parse_with("dtype", "\"float16\"", &m, &e), KILN_OK); /* "dtype" wins over torch_dtype bfloat16 */
    KT_EQ_INT(m.torch_dtype, KILN_DTYPE_F16);
    expect_fail("torch_dtype", "\"float8_e4m3fn\"", KILN_ERR_UNSUPPORTED, "field \"torch_dtype\" is \"float8_e4m3fn\"");
    expect_fail("dtype", "\"int8\"", KILN_ERR_UNSUPPORTED, "field \"dtype\" is \"int8\"");
    expect_fail("torch_dtype", "16", KILN_ERR_PARSE, "field \"torch_dtype\" is 16");
}

static void test_out_untouched_fields_on_error(void) {
    /* a failed parse leaves a zeroed config, not half of one */
    kiln_model_config m;
    memset(&m, 0x5a, sizeof m);
    kiln_error e = {0};
    KT_EQ_INT(parse_with("num_key_value_heads", "3", &m, &e), KILN_ERR_PARSE);
    KT_EQ_INT(m.hidden_size, 0);
    KT_EQ_INT(m.n_layers, 0);
}

int main(void) {
    KT_RUN(test_stories260k);
    KT_RUN(test_qwen3);
    KT_RUN(test_qwen2);
    KT_RUN(test_mixtral);
    KT_RUN(test_qwen3_moe);
    KT_RUN(test_pycode_transformers5);
    KT_RUN(test_base_values);
    KT_RUN(test_llama3_rope_v4);
    KT_RUN(test_llama3_rope_v5);
    KT_RUN(test_rope_precedence);
    KT_RUN(test_rope_types_refused);
    KT_RUN(test_rope_bad_fields);
    KT_RUN(test_defaults);
    KT_RUN(test_sliding_window);
    KT_RUN(test_not_json);
    KT_RUN(test_not_object);
    KT_RUN(test_duplicate_key);
    KT_RUN(test_load_missing_file);
    KT_RUN(test_architecture);
    KT_RUN(test_quantized_checkpoint);
    KT_RUN(test_compressed_tensors_config);
    KT_RUN(test_fp8_config);
    KT_RUN(test_compressed_tensors_fp8_config);
    KT_RUN(test_hidden_act);
    KT_RUN(test_biases);
    KT_RUN(test_required_missing);
    KT_RUN(test_int_fields_reject_floats_and_strings);
    KT_RUN(test_sizes_not_positive);
    KT_RUN(test_sizes_capped);
    KT_RUN(test_kv_heads_divide);
    KT_RUN(test_head_dim);
    KT_RUN(test_eps);
    KT_RUN(test_tie_word_embeddings);
    KT_RUN(test_token_ids);
    KT_RUN(test_dtype);
    KT_RUN(test_out_untouched_fields_on_error);
    return KT_END();
}
