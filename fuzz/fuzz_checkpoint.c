/*
 * fuzz_checkpoint.c — libFuzzer target for a whole checkpoint directory:
 * config.json, the sharded index (model.safetensors.index.json with its
 * cross-shard checks), the safetensors shards, and the import that checks
 * every tensor's name, shape and dtype against the config, refuses unused
 * tensors and compares a tied lm_head, then the value checks of every
 * weight (kiln_weight_convert). Any input must give KILN_OK or a clean error.
 *
 * Input: up to four parts separated by the line "#####":
 *   config.json | index JSON | shard 1 | shard 2
 * With an empty index part the first shard is written as model.safetensors
 * and there is no index; otherwise the shards are s1.safetensors and
 * s2.safetensors (the index names them). The files go to a fresh directory
 * from mkdtemp under $TMPDIR (or /tmp), with fixed names only, and are
 * removed after each input.
 *
 *   ./fuzz_checkpoint -max_total_time=60 fuzz/corpus/checkpoint
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../codegen/kiln_codegen.h"
#include "../compiler/kiln_compiler.h"

#define SEP "\n#####\n"
#define N_PARTS 4

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

typedef struct part {
    const uint8_t *p;
    size_t n;
} part;

/* Split data at SEP into at most N_PARTS parts (missing ones are empty). */
static void split(const uint8_t *data, size_t size, part *parts) {
    size_t sep = strlen(SEP), k = 0, start = 0;
    memset(parts, 0, N_PARTS * sizeof *parts);
    for (size_t i = 0; i + sep <= size && k < N_PARTS - 1; i++) {
        if (memcmp(data + i, SEP, sep) != 0) continue;
        parts[k++] = (part){data + start, i - start};
        start = i + sep;
        i += sep - 1;
    }
    parts[k] = (part){data + start, size - start};
}

static const char *const names[5] = {"config.json", "model.safetensors.index.json", "s1.safetensors", "s2.safetensors",
                                     "model.safetensors"};

/* Write the part as dir/name; false on failure. */
static int write_file(const char *dir, const char *name, part p) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (!f) return 0;
    int ok = fwrite(p.p, 1, p.n, f) == p.n;
    return fclose(f) == 0 && ok;
}

static void remove_all(const char *dir) {
    char path[512];
    for (int i = 0; i < 5; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        unlink(path);
    }
    rmdir(dir);
}

/* Every weight's values through the checks of the engine writer. */
static void convert_all(const kiln_graph *g) {
    static uint8_t buf[4096 * 4];
    for (int v = 0; v < g->n_values; v++) {
        const kiln_value *val = &g->values[v];
        /* a stack of experts' matrices has no bytes of its own: its parts are converted as themselves */
        if (val->kind != KILN_VALUE_WEIGHT || val->pack != KILN_PACK_NONE || !val->src) continue;
        if (val->qsrc.format != KILN_QSRC_NONE) { /* quantized in the checkpoint: repacked row by row */
            uint8_t *out = malloc(kiln_weight_nbytes(val->dtype, 2, val->shape));
            const bool fp8 = kiln_qsrc_is_fp8(&val->qsrc);
            for (int64_t r = 0; out && r < val->shape[0]; r++)
                if (fp8) kiln_quant_repack_fp8_row(&val->qsrc, val->shape[1], r, val->shape[0], r, out);
                else kiln_quant_repack_row(&val->qsrc, val->dtype, val->shape[0], val->shape[1], r, val->shape[0], r, out);
            free(out);
            continue;
        }
        uint64_t count = 1;
        for (int d = 0; d < val->ndim; d++) count *= (uint64_t)val->shape[d];
        size_t ss = (size_t)kiln_dtype_size(val->src_dtype);
        kiln_error err;
        for (uint64_t i = 0; i < count; i += 4096) {
            size_t m = (size_t)(count - i < 4096 ? count - i : 4096);
            if (kiln_weight_convert(val, i, (const uint8_t *)val->src + i * ss, buf, m, &err) != KILN_OK) return;
        }
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    part parts[N_PARTS];
    split(data, size, parts);
    const char *tmp = getenv("TMPDIR");
    char dir[256];
    snprintf(dir, sizeof dir, "%s/kiln-fuzz-ckpt-XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(dir)) return 0;
    int ok = write_file(dir, names[0], parts[0]);
    if (parts[1].n) {
        ok = ok && write_file(dir, names[1], parts[1]) && write_file(dir, names[2], parts[2]) &&
             write_file(dir, names[3], parts[3]);
    } else {
        ok = ok && write_file(dir, names[4], parts[2]);
    }
    kiln_checkpoint ck;
    kiln_error err;
    if (ok && kiln_checkpoint_open(dir, &ck, &err) == KILN_OK) {
        kiln_graph *g = NULL;
        const char *allow[1] = {"*.fuzz_allowed"};
        kiln_import_options o = {.weight_dtype = (kiln_dtype)(size % 4 == 3 ? KILN_DTYPE_COUNT_ : size % 3),
                                 .allow_unused = allow, .n_allow_unused = 1};
        if (kiln_import_ex(&ck, &o, &g, &err) == KILN_OK) convert_all(g);
        kiln_graph_free(g);
        kiln_checkpoint_close(&ck);
    }
    remove_all(dir);
    return 0;
}
