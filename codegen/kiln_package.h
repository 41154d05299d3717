/*
 * kiln_package.h — `kiln package`: an engine → one standalone executable.
 *
 * codegen/package.c emits, through the LLVM C API, an object file with
 * main(), the build's identity and the engine (embedded as a read-only,
 * 4096-aligned section, or described as appended), then links it with the
 * static runtime by invoking the system C compiler driver ($CC, else cc).
 * The layout is in format/kiln_standalone.h (what the object holds) and
 * format/kiln_engine.h (the appended engine's trailer).
 *
 * Which static libraries it links, and with which flags, is recorded at
 * configure time in the generated kiln_package_link.h (cmake/llvm.cmake);
 * they are looked for, in order, in $KILN_PACKAGE_LIBDIR, in ../lib/kiln
 * beside the kiln executable (an install), and in the build tree.
 */
#ifndef KILN_PACKAGE_H
#define KILN_PACKAGE_H

#include <stdbool.h>
#include <stdint.h>

#include "../common/kiln_util.h"

#define KILN_PACKAGE_EMBED_LIMIT (256ull << 20) /* default: embed engines up to 256 MiB */
#define KILN_PACKAGE_EMBED_MAX (1ull << 30)     /* embedded engines above 1 GiB are refused (code model) */

typedef enum kiln_package_payload {
    KILN_PACKAGE_AUTO = -1,    /* embedded up to embed_limit bytes, else appended */
    KILN_PACKAGE_EMBEDDED = 0, /* = KILN_PAYLOAD_EMBEDDED */
    KILN_PACKAGE_APPENDED = 1, /* = KILN_PAYLOAD_APPENDED */
} kiln_package_payload;

typedef struct kiln_package_options {
    const char *engine_path;   /* the engine file to package (verified first) */
    const char *output_path;   /* the executable to write; written atomically */
    int payload;               /* kiln_package_payload */
    uint64_t embed_limit;      /* with KILN_PACKAGE_AUTO; 0 = KILN_PACKAGE_EMBED_LIMIT */
    const char *cc;            /* the C compiler driver; NULL = $CC, else "cc" */
    bool verbose;              /* print the link command on stderr */
    bool template_only;        /* write a template (KILN_STANDALONE_TEMPLATE): appended payload, no
                                  engine, engine_path unused; needs LLVM and a C toolchain */
    const char *from_template; /* attach the engine to a copy of this template instead of emitting and
                                  linking: needs neither LLVM nor a toolchain (payload appended) */
} kiln_package_options;

typedef struct kiln_package_result {
    int payload;               /* the one used: KILN_PACKAGE_EMBEDDED or _APPENDED */
    uint64_t engine_bytes;     /* the engine's size */
    uint64_t engine_checksum;  /* its header checksum */
    uint64_t output_bytes;     /* the executable's size */
} kiln_package_result;

/* true when this kiln was built with LLVM (KILN_LLVM), so kiln_package works. */
bool kiln_package_available(void);
/* The LLVM version kiln_package uses ("16.0.6"), or "" without LLVM. */
const char *kiln_package_llvm_version(void);

/* Write the executable. Without LLVM (and without from_template):
 * KILN_ERR_UNSUPPORTED with a hint.
 * A damaged engine is refused as by the runtime; a missing C toolchain or a
 * failed link is KILN_ERR_IO naming the command. Nothing is left at
 * output_path on failure. */
kiln_status kiln_package(const kiln_package_options *o, kiln_package_result *res, kiln_error *err);

#endif /* KILN_PACKAGE_H */
