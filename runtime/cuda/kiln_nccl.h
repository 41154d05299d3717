/*
 * kiln_nccl.h — NCCL, loaded with dlopen for tensor-parallel engines only.
 *
 * As with the driver and cuBLASLt, kiln never links NCCL: a host that runs
 * only plain engines needs no libnccl, and a tensor-parallel engine whose
 * ranks sit on different GPUs loads libnccl.so.2 when its context is made.
 * The few types and constants used are declared here with NCCL's values
 * (nccl.h is not needed to build kiln). Every call goes through
 * KILN_NCCL_CALL, which records the call, file and line and NCCL's own
 * description of the failure in a kiln_error.
 */
#ifndef KILN_NCCL_H
#define KILN_NCCL_H

#include <cuda.h>
#include <stddef.h>

#include "../../common/kiln_util.h"

#define KILN_NCCL_SONAME "libnccl.so.2"
/* The oldest NCCL kiln runs with: bf16 sums (2.10), collectives in CUDA graphs, ncclCommAbort that
 * releases peers blocked in a collective, ncclGetLastError (2.13). */
#define KILN_NCCL_MIN_VERSION 21300

/* NCCL's values (nccl.h) */
enum { KILN_NCCL_SUCCESS = 0, KILN_NCCL_IN_PROGRESS = 7 };
enum { KILN_NCCL_FLOAT32 = 7, KILN_NCCL_BFLOAT16 = 9 };
enum { KILN_NCCL_SUM = 0 };

typedef void *kiln_nccl_comm;

typedef struct kiln_nccl {
    void *lib;
    int version; /* e.g. 22703 for 2.27.3 */
    int (*GetVersion)(int *version);
    int (*CommInitAll)(kiln_nccl_comm *comms, int ndev, const int *devlist);
    int (*AllReduce)(const void *send, void *recv, size_t count, int dtype, int op, kiln_nccl_comm comm, CUstream s);
    int (*AllGather)(const void *send, void *recv, size_t count, int dtype, kiln_nccl_comm comm, CUstream s);
    int (*GroupStart)(void);
    int (*GroupEnd)(void);
    int (*CommGetAsyncError)(kiln_nccl_comm comm, int *result);
    int (*CommAbort)(kiln_nccl_comm comm);
    int (*CommDestroy)(kiln_nccl_comm comm);
    const char *(*GetErrorString)(int result);
    const char *(*GetLastError)(kiln_nccl_comm comm);
} kiln_nccl;

/* dlopen NCCL and resolve its entry points; KILN_ERR_MISSING naming the library (and what needs it:
 * an engine of n_ranks ranks) when it cannot be loaded, or is older than KILN_NCCL_MIN_VERSION. */
kiln_status kiln_nccl_load(kiln_nccl *n, int n_ranks, kiln_error *err);
void kiln_nccl_unload(kiln_nccl *n);
/* "2.27.3" */
void kiln_nccl_version_str(const kiln_nccl *n, char *buf, size_t cap);

#define KILN_NCCL_CALL(n, comm, err, call) kiln_nccl_check_((n), (call), (comm), #call, __FILE__, __LINE__, (err))
kiln_status kiln_nccl_check_(const kiln_nccl *n, int result, kiln_nccl_comm comm, const char *call, const char *file,
                             int line, kiln_error *err);

#endif /* KILN_NCCL_H */
