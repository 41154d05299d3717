/*
 * kiln_status.h — the status codes every kiln function returns, shared by all
 * modules (common/ sits below the others) and part of the public C API:
 * installed beside kiln.h, which includes it.
 *
 * The enum is append-only: values never change meaning, new ones go at the
 * end (they are returned across the library's ABI).
 */
#ifndef KILN_STATUS_H
#define KILN_STATUS_H

#ifdef __cplusplus
extern "C" {
#endif

typedef enum kiln_status {
    KILN_OK = 0,              /* success */
    KILN_ERR_IO = 1,          /* a file could not be opened, read, written or mapped */
    KILN_ERR_NOMEM = 2,       /* host memory allocation failed */
    KILN_ERR_INVALID_ARG = 3, /* a caller passed a bad argument or option value */
    KILN_ERR_PARSE = 4,       /* malformed input: JSON, safetensors, tokenizer.json... */
    KILN_ERR_UNSUPPORTED = 5, /* valid input kiln does not support (architecture, dtype, field) */
    KILN_ERR_MISSING = 6,     /* a required file, field or tensor is absent */
    KILN_ERR_SHAPE = 7,       /* a tensor has the wrong shape or byte count */
    KILN_ERR_FORMAT = 8,      /* an engine file is truncated, corrupted or foreign */
    KILN_ERR_VERSION = 9,     /* an engine file has a format version this runtime cannot read */
    KILN_ERR_CHECKSUM = 10,   /* a section's checksum does not match its bytes */
    KILN_ERR_CONTEXT = 11,    /* a request does not fit the context window */
    KILN_ERR_VERIFY = 12,     /* the IR verifier found an ill-formed graph (internal) */
    KILN_ERR_INTERNAL = 13,   /* an invariant of kiln itself failed */
    KILN_ERR_DEVICE = 14,     /* the requested device is unavailable or failed */
    KILN_ERR_CODEC = 15,      /* compression or decompression failed */
    KILN_ERR_TOKENIZER = 16,  /* text could not be tokenized or ids decoded */
    KILN_ERR_NUMERIC = 17,    /* a computed value that must be finite is not (NaN or infinity in the logits) */
    KILN_STATUS_COUNT_        /* keep last; not a status */
} kiln_status;

/* A static, generic description of a status code ("I/O error"...). */
const char *kiln_status_str(kiln_status s);

#ifdef __cplusplus
}
#endif

#endif /* KILN_STATUS_H */
