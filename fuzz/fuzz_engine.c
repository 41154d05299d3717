/*
 * fuzz_engine.c — libFuzzer target for the engine reader: open the input
 * with kiln_engine_open_mem, then decode every section.
 *
 * A mutated input almost never has valid checksums, which would stop every
 * run at the header checksum. So each input is tried twice: once as it is
 * (the checks up to the checksums, truncation, foreign files), and once
 * "resealed": this target rewrites the recorded file size and recomputes the
 * section, table and header checksums wherever the input's own table lets it,
 * so the fuzzer reaches the table and section validation, the zstd chunk
 * index and the decoder (fuzz_reseal.h). Build with -DKILN_FUZZ_ENGINE_RESEAL=0
 * to fuzz only the first pass. fuzz_engine_load.c goes on from here: the
 * whole model load (plan, weights, meta, tokenizer) and inspect's checks.
 *
 * Seeds: fuzz/corpus/engine/, written by tests/test_engine.c
 * (KILN_WRITE_FUZZ_CORPUS=fuzz/corpus/engine ./test_engine).
 *   CC=clang cmake -S . -B build-fuzz-engine -DKILN_FUZZ=ON -DKILN_SANITIZE=ON -DKILN_TESTS=OFF
 *   cmake --build build-fuzz-engine --target fuzz_engine
 *   ./build-fuzz-engine/fuzz_engine -max_total_time=30 fuzz/corpus/engine
 */
#include "../format/kiln_engine.h"

#include <stdlib.h>
#include <string.h>

#include "fuzz_reseal.h"

#ifndef KILN_FUZZ_ENGINE_RESEAL
#define KILN_FUZZ_ENGINE_RESEAL 1
#endif

/* Sections claiming more raw bytes than this are opened but not decoded, to
 * keep each run fast and under libFuzzer's memory limit. */
#define FUZZ_MAX_DECODE ((uint64_t)64 << 20)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void open_and_decode(const uint8_t *data, size_t size) {
    kiln_engine e;
    kiln_error err = {0};
    if (kiln_engine_open_mem(data, size, "fuzz.kiln", &e, &err) != KILN_OK) return;
    for (uint32_t i = 0; i < e.n_sections; i++) {
        const kiln_engine_section *s = &e.sections[i];
        if (s->raw_size > FUZZ_MAX_DECODE) continue;
        const uint8_t *d;
        size_t n;
        bool owned;
        /* two threads: multi-chunk sections take the parallel path */
        if (kiln_engine_section_bytes(&e, s, 2, &d, &n, &owned, &err) != KILN_OK) continue;
        if (n != s->raw_size) abort(); /* the reader's contract */
        if (n) {
            volatile uint8_t sink = d[0] ^ d[n - 1]; /* touch both ends */
            (void)sink;
        }
        if (owned) free((void *)d);
    }
    (void)kiln_engine_find(&e, KILN_SECTION_WEIGHTS);
    kiln_engine_close(&e);
}


int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    open_and_decode(data, size);
#if KILN_FUZZ_ENGINE_RESEAL
    if (size >= KILN_ENGINE_HEADER_SIZE) {
        uint8_t *copy = malloc(size); /* exactly sized: ASan sees any overread */
        if (!copy) return 0;
        memcpy(copy, data, size);
        kiln_fuzz_reseal(copy, size);
        open_and_decode(copy, size);
        free(copy);
    }
#endif
    return 0;
}
