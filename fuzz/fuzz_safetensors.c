/*
 * fuzz_safetensors.c — libFuzzer target for the safetensors header parser
 * (kiln_st_parse): any byte string must give KILN_OK or a clean error, never
 * a crash, leak or out-of-bounds read. On success every tensor must lie
 * inside the input, which is checked here too.
 *
 *   ./fuzz_safetensors -max_total_time=30 fuzz/corpus/safetensors
 */
#include <stdint.h>
#include <stdlib.h>

#include "../compiler/kiln_compiler.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    kiln_st_tensor *t = NULL;
    size_t n = 0;
    kiln_error err;
    if (kiln_st_parse(data, size, "fuzz.safetensors", &t, &n, &err) == KILN_OK) {
        for (size_t i = 0; i < n; i++) {
            if (t[i].data < data || t[i].nbytes > size || t[i].data + t[i].nbytes > data + size) abort();
            if (t[i].ndim < 0 || t[i].ndim > KILN_MAX_DIMS) abort();
        }
        kiln_st_tensors_free(t, n);
    }
    return 0;
}
