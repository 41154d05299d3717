/*
 * test_api_gen_defaults.c — kiln_request_options_init_from_engine: an
 * engine compiled from a checkpoint whose generation_config.json samples
 * (do_sample true, temperature 0.7, top_p 0.9, top_k absent → 50) hands
 * those defaults to a program; one without sampling settings is greedy; a
 * NULL engine gives the plain defaults and KILN_ERR_INVALID_ARG.
 * The checkpoint is stories260k's config.json and weights (symlinked) in a
 * temporary directory with a generation_config.json written here.
 */
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "../compiler/kiln_compiler.h"
#include "../runtime/kiln.h"
#include "kt.h"

#define MODEL KILN_SOURCE_DIR "/models/stories260k"

static int write_text(const char *dir, const char *name, const char *text) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "w");
    if (!f) return 0;
    fputs(text, f);
    return fclose(f) == 0;
}

/* Compile a checkpoint made of stories260k and `gen_config` (JSON text);
 * fill *ro from the engine. Returns the compile/open status. */
static kiln_status defaults_for(const char *gen_config, kiln_request_options *ro) {
    char dir[] = "/tmp/kiln-test-gen-XXXXXX", path[600], engine[600];
    if (!mkdtemp(dir)) return KILN_ERR_IO;
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    int ok = symlink(MODEL "/model.safetensors", path) == 0;
    snprintf(path, sizeof path, "%s/config.json", dir);
    ok = ok && symlink(MODEL "/config.json", path) == 0 && write_text(dir, "generation_config.json", gen_config);
    snprintf(engine, sizeof engine, "%s/e.kiln", dir);
    kiln_compile_options opt = {.output_path = engine, .weight_dtype = KILN_DTYPE_COUNT_, .targets = "none"};
    kiln_error err = {0};
    kiln_status st = ok ? kiln_compile(dir, &opt, &err) : KILN_ERR_IO;
    if (st != KILN_OK) fprintf(stderr, "  compile: %s\n", err.msg);
    kiln_t *k = NULL;
    if (st == KILN_OK && (st = kiln_open(engine, 1, &k)) == KILN_OK) st = kiln_request_options_init_from_engine(k, ro);
    kiln_close(k);
    unlink(engine);
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    unlink(path);
    snprintf(path, sizeof path, "%s/config.json", dir);
    unlink(path);
    snprintf(path, sizeof path, "%s/generation_config.json", dir);
    unlink(path);
    rmdir(dir);
    return st;
}

static void test_sampling_defaults(void) {
    kiln_request_options ro;
    KT_REQUIRE(defaults_for("{\"do_sample\": true, \"temperature\": 0.7, \"top_p\": 0.9, \"eos_token_id\": 2}",
                            &ro) == KILN_OK);
    KT_EQ_INT(ro.struct_size, sizeof ro);
    KT_CHECK(ro.temperature > 0.699f && ro.temperature < 0.701f);
    KT_EQ_INT(ro.top_k, 50); /* transformers' default when sampling */
    KT_CHECK(ro.top_p > 0.899f && ro.top_p < 0.901f);
    KT_EQ_INT(ro.max_tokens, 128);
}

static void test_greedy(void) {
    kiln_request_options ro;
    KT_REQUIRE(defaults_for("{\"temperature\": 0.7, \"top_k\": 5, \"eos_token_id\": 2}", &ro) == KILN_OK);
    KT_CHECK(ro.temperature == 0 && ro.top_k == 0 && ro.top_p == 1); /* do_sample absent: greedy */
}

static void test_null_engine(void) {
    kiln_request_options ro;
    KT_EQ_INT(kiln_request_options_init_from_engine(NULL, &ro), KILN_ERR_INVALID_ARG);
    KT_CHECK(ro.struct_size == sizeof ro && ro.temperature == 0 && ro.top_p == 1 && ro.max_tokens == 128);
    KT_EQ_INT(kiln_request_options_init_from_engine(NULL, NULL), KILN_ERR_INVALID_ARG);
}

int main(void) {
    KT_RUN(test_sampling_defaults);
    KT_RUN(test_greedy);
    KT_RUN(test_null_engine);
    return KT_END();
}
