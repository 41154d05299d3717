/*
 * fuzz_reseal.h — make a mutated engine file's checksums agree with its bytes,
 * for the engine fuzz targets (fuzz_engine.c, fuzz_engine_load.c).
 *
 * A mutated input almost never has valid checksums, which would stop every
 * run at the header checksum. Resealing rewrites the recorded file size and
 * recomputes the section, table and header checksums wherever the input's
 * own table lets it (never reading out of bounds), so the fuzzer reaches the
 * table and section validation and everything after it. The reseal lives in
 * the fuzz targets only; the reader never skips a check.
 */
#ifndef KILN_FUZZ_RESEAL_H
#define KILN_FUZZ_RESEAL_H

#include <stddef.h>
#include <stdint.h>

#include <xxhash.h>

#include "../format/kiln_engine.h"

static inline void kiln_fuzz_reseal(uint8_t *f, size_t size) {
    if (size < KILN_ENGINE_HEADER_SIZE) return;
    kiln_wr_u64(f + 24, size);
    uint32_t count = kiln_rd_u32(f + 12);
    uint64_t toff = kiln_rd_u64(f + 16);
    if (count <= KILN_ENGINE_MAX_SECTIONS && toff >= KILN_ENGINE_HEADER_SIZE && toff <= size &&
        (size - toff) / KILN_ENGINE_ENTRY_SIZE >= count) {
        for (uint32_t i = 0; i < count; i++) {
            uint8_t *t = f + toff + (size_t)i * KILN_ENGINE_ENTRY_SIZE;
            uint64_t off = kiln_rd_u64(t + 8), n = kiln_rd_u64(t + 16);
            uint16_t major = (uint16_t)(f[8] | f[9] << 8);
            if (off <= size && n <= size - off) kiln_wr_u64(t + 32, kiln_engine_checksum(major, f + off, (size_t)n, 1));
        }
        kiln_wr_u64(f + 32, XXH64(f + toff, (size_t)count * KILN_ENGINE_ENTRY_SIZE, 0));
    }
    kiln_wr_u64(f + 56, XXH64(f, 56, 0));
}

#endif /* KILN_FUZZ_RESEAL_H */
