/*
 * fuzz_plan.c — libFuzzer target for the plan reader (runtime/plan.c): any
 * bytes must either load as a fully checked plan or be refused with a
 * status; never a crash, a hang or a leak. The weights-section size is taken
 * from the first 8 input bytes so offsets near the bound get exercised.
 */
#include <stddef.h>
#include <stdint.h>

#include "../format/kiln_plan.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 8) return 0;
    uint64_t wsize = kiln_rd_u64(data) & ((1ull << 40) - 1);
    kiln_plan *p = NULL;
    kiln_error err;
    if (kiln_plan_parse(data + 8, size - 8, wsize, &p, &err) == KILN_OK) kiln_plan_free(p);
    return 0;
}
