/*
 * kiln_standalone.h — what a packaged executable (`kiln package`) is made of.
 *
 * `kiln package ENGINE -o NAME` emits, through the LLVM C API
 * (codegen/package.c), one object file holding
 *
 *   main(argc, argv)  → return kiln_standalone_main(argc, argv, &kiln_standalone);
 *   kiln_standalone   a kiln_standalone_desc: the build's identity and where
 *                     the engine is;
 *   the engine bytes  in a read-only, 4096-aligned section ".kiln_engine"
 *                     (payload "embedded"), or nothing (payload "appended":
 *                     the engine follows the linked executable, found
 *                     through the trailer described in kiln_engine.h),
 *
 * and links it with the static runtime and the run/bench/inspect commands
 * with the system C compiler driver. The layout of kiln_standalone_desc is
 * written by codegen/package.c as an LLVM struct type: change both together
 * (fields are 8-byte aligned so the C and LLVM layouts agree on LP64 hosts;
 * struct_size guards against a mismatch).
 */
#ifndef KILN_STANDALONE_H
#define KILN_STANDALONE_H

#include <stdint.h>

#include "kiln_engine.h"

typedef enum kiln_payload {
    KILN_PAYLOAD_EMBEDDED = 0, /* the engine is a section of the executable, in memory at start */
    KILN_PAYLOAD_APPENDED = 1, /* the engine is appended to the executable file and mmapped */
} kiln_payload;

/* An appended-payload executable built for no engine in particular (`kiln
 * package --template`) has engine_size 0 and this engine_checksum ("KILNTPL1"
 * little-endian): it takes the engine its trailer names (still fully
 * verified), so `kiln package --from-template` can attach an engine on a
 * host without LLVM or a C toolchain, by copying it and appending. */
#define KILN_STANDALONE_TEMPLATE 0x314C50544E4C494Bull

typedef struct kiln_standalone_desc {
    uint32_t struct_size;     /* sizeof(kiln_standalone_desc) as the packager laid it out (48 on LP64) */
    uint32_t payload;         /* kiln_payload */
    const char *kiln_version; /* the kiln that packaged it (its runtime is the one linked in) */
    const char *commit;       /* that kiln's commit, "" when unknown */
    uint64_t engine_size;     /* bytes of the engine */
    uint64_t engine_checksum; /* the engine header's checksum (its u64 at 56): which engine */
    const uint8_t *engine;    /* embedded: the engine's first byte (4096-aligned); appended: NULL */
} kiln_standalone_desc;

/* Where the engine of the executable described by `d` is. `label` (argv[0])
 * names it in messages. Embedded: the bytes in memory. Appended: the range
 * of `exe` (NULL = "/proc/self/exe") that its trailer gives, which must
 * match `d`'s size and checksum. Either way an engine whose header is intact
 * but is not `d`'s is refused. The engine itself is verified when opened. */
kiln_status kiln_standalone_engine(const kiln_standalone_desc *d, const char *exe, const char *label,
                                   kiln_engine_src *out, kiln_error *err);

/* The packaged executable's entry point: `NAME run|bench|inspect [options]`
 * behave as `kiln run|bench|inspect ENGINE [options]` with the built-in
 * engine; `NAME --version` prints the identity. Returns the exit code.
 * Defined by the CLI (compiler/standalone.c), which is linked into the
 * executable with the runtime. */
int kiln_standalone_main(int argc, char **argv, const kiln_standalone_desc *d);

#endif /* KILN_STANDALONE_H */
