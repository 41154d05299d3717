/*
 * test_api_bench.c — `kiln bench` (compiler/cmd_bench.c, which drives the
 * public API) on engines compiled from models/stories260k and
 * tests/data/tiny-mistral: the JSON lines it prints (fields, metrics, units,
 * plausible values), queued requests over a small KV pool (they complete,
 * percentiles ordered, no full-batch decode figures), the table, and its
 * exit codes for usage errors (2) and failures (1).
 */
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "compiler/kiln_compiler.h"
#include "kt.h"
#include "kt_fixture.h"

int kiln_cmd_bench(int argc, char **argv);

static char tmpdir[256], engine[512], tiny[512], out_path[512], err_path[512];

/* Run kiln_cmd_bench with stdout and stderr captured; returns its exit code. */
static int bench(char **out, char **errtext, int argc, ...) {
    char *argv[32];
    va_list ap;
    va_start(ap, argc);
    argv[0] = "bench";
    for (int i = 1; i < argc && i < 31; i++) argv[i] = va_arg(ap, char *);
    va_end(ap);
    argv[argc] = NULL;
    fflush(stdout);
    fflush(stderr);
    int so = dup(1), se = dup(2);
    FILE *fo = fopen(out_path, "w"), *fe = fopen(err_path, "w");
    dup2(fileno(fo), 1);
    dup2(fileno(fe), 2);
    int rc = kiln_cmd_bench(argc, argv);
    fflush(stdout);
    fflush(stderr);
    dup2(so, 1);
    dup2(se, 2);
    close(so);
    close(se);
    fclose(fo);
    fclose(fe);
    kiln_error e;
    size_t len;
    *out = NULL;
    *errtext = NULL;
    kiln_file_read(out_path, 1 << 20, out, &len, &e);
    kiln_file_read(err_path, 1 << 20, errtext, &len, &e);
    return rc;
}

static void test_bench_json(void) {
    char *out, *err;
    setenv("KILN_COMMIT", "test-commit", 1);
    int rc = bench(&out, &err, 13, "--batch", "3", "--input-len", "9", "--output-len", "6", "--device", "cpu",
                   "--reps", "3", "--json", engine);
    unsetenv("KILN_COMMIT");
    KT_EQ_INT(rc, 0);
    KT_REQUIRE(out);
    const char *fields[] = {"model", "dtype", "batch", "requests", "input_len", "output_len", "metric",
                            "value", "unit", "device", "gpu", "gpus", "commit"};
    int seen_b1 = 0, seen_b3 = 0, lines = 0;
    bool load = false, tps = false, mspt = false, mem = false;
    for (char *line = strtok(out, "\n"); line; line = strtok(NULL, "\n")) {
        lines++;
        json_error_t je;
        json_t *j = json_loads(line, 0, &je);
        KT_REQUIRE(json_is_object(j));
        KT_EQ_INT(json_object_size(j), 13);
        for (size_t f = 0; f < sizeof fields / sizeof fields[0]; f++)
            KT_CHECKF(json_object_get(j, fields[f]) != NULL, "line %d lacks \"%s\"", lines, fields[f]);
        KT_EQ_STR(json_string_value(json_object_get(j, "model")), "stories");
        KT_EQ_STR(json_string_value(json_object_get(j, "dtype")), "f32");
        KT_EQ_STR(json_string_value(json_object_get(j, "device")), "cpu");
        KT_EQ_STR(json_string_value(json_object_get(j, "gpu")), "none");
        KT_EQ_STR(json_string_value(json_object_get(j, "gpus")), "none");
        KT_EQ_STR(json_string_value(json_object_get(j, "commit")), "test-commit");
        KT_EQ_INT(json_integer_value(json_object_get(j, "input_len")), 9);
        KT_EQ_INT(json_integer_value(json_object_get(j, "output_len")), 6);
        int b = (int)json_integer_value(json_object_get(j, "batch"));
        seen_b1 += b == 1;
        seen_b3 += b == 3;
        KT_EQ_INT(json_integer_value(json_object_get(j, "requests")), b);
        const char *metric = json_string_value(json_object_get(j, "metric"));
        const char *unit = json_string_value(json_object_get(j, "unit"));
        double v = json_number_value(json_object_get(j, "value"));
        KT_CHECKF(v > 0 && v < 1e9, "%s = %g", metric, v);
        if (strcmp(metric, "load_ms") == 0) load = true;
        if (strcmp(metric, "decode_tokens_per_s") == 0) {
            tps = true;
            KT_EQ_STR(unit, "tokens/s");
        }
        if (strcmp(metric, "decode_ms_per_token") == 0) {
            mspt = true;
            KT_EQ_STR(unit, "ms");
        }
        if (strcmp(metric, "peak_host_memory") == 0) {
            mem = true;
            KT_EQ_STR(unit, "MiB");
        }
        json_decref(j);
    }
    /* prefill+ttft at batch 1; at batch 3: load, prefill, ttft, decode x2, e2e x3, ttft and tpot
     * percentiles x6, max_step_tokens, kv_capacity_tokens, max_running, peak host memory */
    KT_EQ_INT(lines, 20);
    KT_EQ_INT(seen_b1, 2);
    KT_EQ_INT(seen_b3, 18);
    KT_CHECK(load && tps && mspt && mem);
    free(out);
    free(err);
}

/* The value of `metric` at batch `batch` in JSON lines `out` (NAN when absent). */
static double metric_of(const char *out, const char *metric, int batch) {
    char *copy = strdup(out), *save = NULL;
    double v = NAN;
    for (char *line = strtok_r(copy, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        json_error_t je;
        json_t *j = json_loads(line, 0, &je);
        const char *m = json_string_value(json_object_get(j, "metric"));
        if (m && strcmp(m, metric) == 0 && json_integer_value(json_object_get(j, "batch")) == batch)
            v = json_number_value(json_object_get(j, "value"));
        json_decref(j);
    }
    free(copy);
    return v;
}

/* 50 requests over a KV pool that holds 4 at a time (tiny-mistral on the CPU: 512 bytes of K and
 * V a token, 64 KiB = 128 tokens, a request needs 16 + 16 - 1): they wait for KV memory, every one
 * completes, and the queued run reports end-to-end figures and ordered percentiles, not the
 * full-batch decode figures. A request the pool can never hold is refused, not waited for. */
static void test_bench_queued(void) {
    char *out, *err;
    int rc = bench(&out, &err, 19, "--batch", "8", "--requests", "50", "--input-len", "16", "--output-len", "16",
                   "--kv-memory", "64K", "--device", "cpu", "--threads", "1", "--reps", "1", "--json", tiny);
    KT_EQ_INT(rc, 0);
    KT_REQUIRE(out);
    KT_EQ_INT((int)metric_of(out, "kv_capacity_tokens", 8), 128);
    KT_EQ_INT((int)metric_of(out, "max_running", 8), 4);
    double e2e = metric_of(out, "e2e_output_tokens_per_s", 8), tot = metric_of(out, "e2e_total_tokens_per_s", 8);
    KT_CHECKF(e2e > 0 && tot > e2e, "e2e output %g, total %g tokens/s", e2e, tot);
    KT_CHECKF(fabs(tot / e2e - 2.0) < 1e-3, "total/output %g, want (16+16)/16", tot / e2e);
    const char *pct[2][3] = {{"ttft_p50_ms", "ttft_p90_ms", "ttft_p99_ms"}, {"tpot_p50_ms", "tpot_p90_ms", "tpot_p99_ms"}};
    for (int i = 0; i < 2; i++) {
        double p50 = metric_of(out, pct[i][0], 8), p90 = metric_of(out, pct[i][1], 8), p99 = metric_of(out, pct[i][2], 8);
        KT_CHECKF(p50 > 0 && p50 <= p90 && p90 <= p99, "%s %g, %s %g, %s %g", pct[i][0], p50, pct[i][1], p90, pct[i][2],
                  p99);
    }
    /* queueing: the last requests wait for about 12 rounds of 4 requests of 16 tokens */
    KT_CHECKF(metric_of(out, "ttft_p99_ms", 8) > 10 * metric_of(out, "tpot_p50_ms", 8), "ttft p99 %g, tpot p50 %g",
              metric_of(out, "ttft_p99_ms", 8), metric_of(out, "tpot_p50_ms", 8));
    KT_CHECK(isnan(metric_of(out, "decode_tokens_per_s", 8)) && isnan(metric_of(out, "prefill_ms", 8)));
    free(out);
    free(err);
    /* 16 + 16 - 1 KV tokens can never fit a pool of 16: refused at once */
    rc = bench(&out, &err, 18, "--batch", "2", "--requests", "5", "--input-len", "16", "--output-len", "16",
               "--kv-memory", "8K", "--device", "cpu", "--reps", "1", "--warmup", "0", tiny);
    KT_EQ_INT(rc, 1);
    KT_CONTAINS(err, "KV memory holds 16");
    free(out);
    free(err);
}

static void test_bench_table(void) {
    char *out, *err;
    int rc = bench(&out, &err, 10, "--input-len", "4", "--output-len", "3", "--reps", "1", "--warmup", "0", engine);
    KT_EQ_INT(rc, 0);
    KT_CONTAINS(out, "kiln bench stories");
    KT_CONTAINS(out, "decode_tokens_per_s");
    KT_CONTAINS(out, "ttft_ms");
    free(out);
    free(err);
    rc = bench(&out, &err, 2, "--help");
    KT_EQ_INT(rc, 0);
    KT_CONTAINS(out, "usage: kiln bench");
    free(out);
    free(err);
}

static void test_bench_errors(void) {
    char *out, *err;
    struct {
        int code;
        const char *msg;
        int argc;
        char *argv[6];
    } cases[] = {
        {2, "--batch '0'", 4, {"--batch", "0", engine}},
        {2, "--input-len 'x'", 4, {"--input-len", "x", engine}},
        {2, "unknown device 'tpu'", 4, {"--device", "tpu", engine}},
        {2, "unknown or incomplete option '--frobnicate'", 3, {"--frobnicate", engine}},
        {2, "expected one engine file", 1, {0}},
        {2, "--kv-memory '5X'", 4, {"--kv-memory", "5X", engine}},
        {2, "--requests '0'", 4, {"--requests", "0", engine}},
        {2, "--max-step-tokens 2 is below --batch 4", 6, {"--batch", "4", "--max-step-tokens", "2", engine}},
        {1, "no-such.kiln", 2, {"/nonexistent/no-such.kiln"}},
        {1, "do not fit the 512-token context", 6, {"--input-len", "500", "--output-len", "50", engine}},
        {1, "holds no token", 6, {"--device", "cpu", "--kv-memory", "10", engine}},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char **a = cases[i].argv;
        int rc = bench(&out, &err, cases[i].argc, a[0], a[1], a[2], a[3], a[4]);
        KT_CHECKF(rc == cases[i].code, "case %zu: exit %d, expected %d", i, rc, cases[i].code);
        KT_CONTAINS(err, cases[i].msg);
        free(out);
        free(err);
    }
    /* --json failure: the error object on stdout */
    int rc = bench(&out, &err, 3, "--json", "/nonexistent/no-such.kiln");
    KT_EQ_INT(rc, 1);
    KT_CONTAINS(out, "\"error\"");
    free(out);
    free(err);
    /* gpu in a build or host without one: a device failure */
    rc = bench(&out, &err, 8, "--device", "gpu", "--input-len", "4", "--output-len", "2", engine);
    if (rc != 0) {
        KT_EQ_INT(rc, 1);
        KT_CONTAINS(err, "gpu");
    }
    free(out);
    free(err);
}

int main(void) {
    if (!kt_tmpdir(tmpdir, sizeof tmpdir, "bench")) return 1;
    snprintf(engine, sizeof engine, "%s/stories.kiln", tmpdir);
    snprintf(out_path, sizeof out_path, "%s/out.txt", tmpdir);
    snprintf(err_path, sizeof err_path, "%s/err.txt", tmpdir);
    char ckpt[1024];
    snprintf(ckpt, sizeof ckpt, "%s/models/stories260k", KILN_SOURCE_DIR);
    kiln_compile_options opt = {.output_path = engine, .weight_dtype = KILN_DTYPE_COUNT_};
    if (kt_compile(ckpt, &opt) != KILN_OK) return 1;
    snprintf(tiny, sizeof tiny, "%s/tiny.kiln", tmpdir);
    snprintf(ckpt, sizeof ckpt, "%s/tests/data/tiny-mistral", KILN_SOURCE_DIR);
    kiln_compile_options topt = {.output_path = tiny, .weight_dtype = KILN_DTYPE_COUNT_};
    if (kt_compile(ckpt, &topt) != KILN_OK) return 1;
    KT_RUN(test_bench_json);
    KT_RUN(test_bench_queued);
    KT_RUN(test_bench_table);
    KT_RUN(test_bench_errors);
    unlink(engine);
    unlink(tiny);
    unlink(out_path);
    unlink(err_path);
    rmdir(tmpdir);
    return KT_END();
}
