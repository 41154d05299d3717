/*
 * tp.c — a tensor-parallel engine on GPUs: one kiln_executor over N ranks.
 *
 * One host thread drives every rank (kiln_cuda_rank.h): all work is
 * asynchronous, so the thread enqueues each rank's piece of the program in
 * turn on that rank's stream and the GPUs run at once. The collectives are
 * issued in the same order on every rank by construction, with no rank
 * threads, no step broadcast and no barrier on the host; a step is one
 * CUDA graph launch per rank at decode. (docs/parallelism.md: why one
 * thread, and how this extends across hosts.)
 *
 * Collectives:
 *  - ranks on distinct devices: NCCL (dlopen, kiln_nccl.h), one
 *    communicator per rank from ncclCommInitAll, every collective of a step
 *    issued for all ranks inside ncclGroupStart/End; all_reduce sums bf16
 *    (or f32) vectors in place, all_gather collects the LM head's f32
 *    slices, which rank 0 reorders into [B, vocab] rows for its sampler;
 *  - where every rank can address every other's memory (peer access over
 *    NVLink, enabled here), the one-shot kernel kiln_tp_oneshot takes the
 *    all-reduces up to TP_ONESHOT_BYTES (a decode step's: latency-bound,
 *    where NCCL's protocol costs more than the bytes) and the gather: each
 *    rank's blocks meet their peers' at flags in device memory, then read
 *    the peers' partials directly (kiln_cuda_exec_opts.tp_oneshot: 0 auto,
 *    1 never, 2 always; the C API passes never unless --measure tp_oneshot
 *    asks, since it is not yet timed against NCCL between two GPUs);
 *  - every rank on one device (a tp engine tested on a one-GPU host): the
 *    ranks share rank 0's stream and kiln_tp_sum adds their partials in rank
 *    order (the CPU executor's order, bit for bit in fp32); the gather is
 *    a strided copy per rank into rank 0's logits. With tp_oneshot 2 they
 *    get a stream each and the one-shot kernel instead, which is how its
 *    barrier is tested without a second GPU.
 * Rank 0 samples and reports; the other ranks' logits are not gathered.
 *
 * Failure: a step waits on every rank's `done` event by polling, checking
 * NCCL's asynchronous errors as it goes; a rank that reports an error, or
 * a step not finished on every rank within the timeout, aborts every
 * communicator (which releases ranks blocked in a collective) and fails
 * with KILN_ERR_DEVICE naming the rank, its GPU and the step. The executor
 * is then broken: every later step returns that error (the weights are
 * split N ways at compile time; there is no going on with fewer ranks).
 */
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kiln_cuda_rank.h"
#include "kiln_nccl.h"

#define TP_MAX_GRAPHS 24
#define TP_DEFAULT_TIMEOUT_S 60.0
#define TP_ONESHOT_BYTES (1u << 20) /* all-reduces up to this many bytes take the one-shot kernel (auto) */

typedef struct tp_graph {
    int B;
    CUgraphExec *exec; /* [n] per rank; ranks on one device: exec[0] only */
} tp_graph;

typedef struct tpx {
    kiln_executor base; /* first member */
    int n;              /* ranks */
    kiln_cx **r;        /* [n] */
    int *dev;           /* [n] CUDA device of each rank */
    bool same_device;   /* every rank on one device (for testing on one GPU) */
    bool local;         /* ... and on one stream: kiln_tp_sum, the gather as copies */
    bool oneshot;       /* kiln_tp_oneshot for all-reduces up to `half` bytes and the gather */
    bool nccl_on;       /* NCCL for what the one-shot kernel does not take */
    kiln_nccl nccl;
    kiln_nccl_comm *comm; /* [n] (NCCL) */
    /* the one-shot kernel's memory, per rank: staging (2 halves of `half` bytes), flags, counters and
     * poison; and its fault word in mapped host memory (the peer it waited for in vain, + 1) */
    CUdeviceptr *os_stage, *os_flags, *os_count;
    unsigned **os_fault;
    size_t half;
    tp_graph graphs[TP_MAX_GRAPHS];
    int n_graphs;
    double timeout_s;
    int64_t steps;
    bool broken;
    kiln_error broken_err; /* why, returned by every later step */
    kiln_cx_shape *sh;     /* [n] the step's shape on each rank */
    bool *fin;             /* [n] scratch: rank finished */
} tpx;

static kiln_status cur(tpx *t, int r, kiln_error *err) { return kiln_cuda_make_current(kiln_cx_cuda(t->r[r]), err); }

static const char *mode_name(const tpx *t) {
    return t->local ? "one device" : t->nccl_on ? (t->oneshot ? "NCCL and the one-shot kernel" : "NCCL")
                                                : "the one-shot kernel";
}

/* "rank 1 (GPU 1, NVIDIA H200)" */
static void rank_name(tpx *t, int r, char *buf, size_t cap) {
    snprintf(buf, cap, "rank %d (GPU %d, %.60s)", r, t->dev[r], kiln_cx_cuda(t->r[r])->name);
}

/* Abort every communicator (peers blocked in a collective return) and keep `err` as the executor's
 * state: every later step fails with it. */
static kiln_status tp_break(tpx *t, kiln_error *err) {
    if (t->nccl_on && t->comm)
        for (int r = 0; r < t->n; r++)
            if (t->comm[r]) t->nccl.CommAbort(t->comm[r]);
    if (t->comm) memset(t->comm, 0, (size_t)t->n * sizeof *t->comm); /* aborted ones are freed */
    t->broken = true;
    t->broken_err = *err;
    return err->code;
}

/* ---- collectives ---- */

/* Rank 0's logits [rows, out_width] from each rank's slice [rows, width] at column rank x width
 * (src[q]: rank q's slice, or its block of NCCL's gather output). */
static kiln_status gather_rows(tpx *t, const kiln_cx_coll_desc *d0, const CUdeviceptr *src, kiln_error *err) {
    kiln_cuda *cu = kiln_cx_cuda(t->r[0]);
    for (int q = 0; q < t->n; q++) {
        CUDA_MEMCPY2D c = {0};
        c.srcMemoryType = CU_MEMORYTYPE_DEVICE;
        c.srcDevice = src[q];
        c.srcPitch = (size_t)d0->width * 4;
        c.dstMemoryType = CU_MEMORYTYPE_DEVICE;
        c.dstDevice = d0->out + (size_t)q * (size_t)d0->width * 4;
        c.dstPitch = (size_t)d0->out_width * 4;
        c.WidthInBytes = (size_t)d0->width * 4;
        c.Height = (size_t)d0->rows;
        kiln_status st = KILN_CU_CALL(cu, err, cu->api.cuMemcpy2DAsync(&c, kiln_cx_stream(t->r[0])));
        if (st) return kiln_err_prefix(err, "tensor parallel: gathering the logits: ");
    }
    return KILN_OK;
}

/* Collective instruction i of the program, across the ranks. */
static kiln_status run_coll(tpx *t, int i, kiln_error *err) {
    kiln_cx_coll_desc d[KILN_MAX_RANKS];
    CUdeviceptr in[KILN_MAX_RANKS], out[KILN_MAX_RANKS];
    kiln_status st = KILN_OK;
    for (int r = 0; r < t->n; r++) {
        kiln_cx_coll(t->r[r], i, &t->sh[r], &d[r]);
        in[r] = d[r].in;
        out[r] = d[r].out;
        if ((st = cur(t, r, err))) return st;
        kiln_cx_mark(t->r[r], i, false);
    }
    const size_t count = (size_t)d[0].rows * (size_t)d[0].width;
    const size_t es = d[0].f32 || d[0].gather ? 4 : 2;
    if (t->oneshot && (d[0].gather ? d[0].width % 4 == 0 && d[0].out_width % 4 == 0
                                   : count * es <= t->half && (count * es) % 16 == 0)) {
        kiln_tp_oneshot_params prm = {.n = (long long)count, .half = (long long)t->half, .rows = d[0].rows,
                                      .width = d[0].width, .out_width = d[0].out_width, .n_ranks = t->n,
                                      .mode = d[0].gather ? 1 : 0, .f32 = d[0].f32 || d[0].gather,
                                      .timeout_ns = (long long)(t->timeout_s * 1e9)};
        for (int q = 0; q < t->n; q++) {
            prm.stage[q] = t->os_stage[q];
            prm.src[q] = d[q].in;
            prm.flags[q] = t->os_flags[q];
        }
        for (int r = 0; r < t->n && !st; r++) {
            prm.rank = r;
            prm.in = d[r].in;
            prm.out = d[r].out;
            prm.counter = t->os_count[r];
            prm.fault = (CUdeviceptr)(uintptr_t)t->os_fault[r]; /* unified addressing: the same pointer */
            if (!(st = cur(t, r, err))) st = kiln_cx_tp_oneshot(t->r[r], &prm, err);
        }
    } else if (!t->local && !t->nccl_on) {
        st = kiln_err(err, KILN_ERR_UNSUPPORTED, "tensor parallel: a %s of %zu bytes: the one-shot kernel takes at "
                      "most %zu (and whole 16-byte vectors), and NCCL is off", d[0].gather ? "gather" : "sum",
                      count * es, t->half);
    } else if (t->local) {
        if ((st = cur(t, 0, err))) return st;
        st = d[0].gather ? gather_rows(t, &d[0], in, err) : kiln_cx_tp_sum(t->r[0], in, out, t->n, count, d[0].f32, err);
    } else {
        kiln_nccl *nc = &t->nccl; /* NCCL */
        if ((st = KILN_NCCL_CALL(nc, NULL, err, nc->GroupStart()))) return st;
        for (int r = 0; r < t->n && !st; r++) {
            CUstream s = kiln_cx_stream(t->r[r]);
            st = d[r].gather
                     ? KILN_NCCL_CALL(nc, t->comm[r], err,
                                      nc->AllGather((const void *)d[r].in, (void *)d[r].tmp, count, KILN_NCCL_FLOAT32,
                                                    t->comm[r], s))
                     : KILN_NCCL_CALL(nc, t->comm[r], err,
                                      nc->AllReduce((const void *)d[r].in, (void *)d[r].out, count,
                                                    d[r].f32 ? KILN_NCCL_FLOAT32 : KILN_NCCL_BFLOAT16, KILN_NCCL_SUM,
                                                    t->comm[r], s));
            if (st) {
                char rn[96];
                rank_name(t, r, rn, sizeof rn);
                kiln_err_prefix(err, "%s: ", rn);
            }
        }
        kiln_status ge = KILN_NCCL_CALL(nc, NULL, st ? &(kiln_error){0} : err, nc->GroupEnd());
        if (!st) st = ge;
        if (!st && d[0].gather) {
            CUdeviceptr blocks[KILN_MAX_RANKS];
            for (int q = 0; q < t->n; q++) blocks[q] = d[0].tmp + (size_t)q * count * 4;
            if (!(st = cur(t, 0, err))) st = gather_rows(t, &d[0], blocks, err);
        }
    }
    if (st) return kiln_err_prefix(err, "tensor parallel: plan op %d (%s): ", d[0].op,
                                   d[0].gather ? "all_gather" : "all_reduce");
    for (int r = 0; r < t->n && !st; r++)
        if (!(st = cur(t, r, err))) kiln_cx_mark(t->r[r], i, true);
    return st;
}

/* The program on every rank, segment by segment between the collectives, then rank 0's sampler. */
static kiln_status run_all(tpx *t, kiln_error *err) {
    const int n_prog = kiln_cx_program_size(t->r[0]);
    kiln_status st;
    for (int from = 0;;) {
        int stop = -1;
        for (int r = 0; r < t->n; r++) {
            int s = 0;
            if ((st = cur(t, r, err)) || (st = kiln_cx_run(t->r[r], &t->sh[r], from, &s, err))) {
                char rn[96];
                rank_name(t, r, rn, sizeof rn);
                return kiln_err_prefix(err, "tensor parallel, %s: ", rn);
            }
            if (r > 0 && s != stop)
                return kiln_err(err, KILN_ERR_INTERNAL, "tensor parallel: rank %d stopped at instruction %d, rank 0 at %d",
                                r, s, stop);
            stop = s;
        }
        if (stop >= n_prog) break;
        if ((st = run_coll(t, stop, err))) return st;
        from = stop + 1;
    }
    if ((st = cur(t, 0, err))) return st;
    return kiln_cx_sample(t->r[0], &t->sh[0], err);
}

/* The streams a step runs on: rank 0's alone when every rank is on one device. */
static int n_streams(const tpx *t) { return t->local ? 1 : t->n; }

/* Batch B's decode graphs (one per stream), captured once: the cuBLASLt algorithms timed first, then
 * every rank's stream captured at once while run_all enqueues the step. */
static kiln_status graph_for(tpx *t, int B, tp_graph **out, kiln_error *err) {
    *out = NULL;
    for (int i = 0; i < t->n_graphs; i++)
        if (t->graphs[i].B == B) {
            *out = &t->graphs[i];
            return KILN_OK;
        }
    if (t->n_graphs == TP_MAX_GRAPHS) return KILN_OK; /* run without */
    kiln_status st;
    for (int r = 0; r < t->n; r++) {
        if ((st = cur(t, r, err))) return st;
        kiln_cx_tune_decode(t->r[r], B);
    }
    tp_graph *g = &t->graphs[t->n_graphs];
    g->B = B;
    if (!(g->exec = calloc((size_t)t->n, sizeof *g->exec)))
        return kiln_err(err, KILN_ERR_NOMEM, "tensor parallel: out of memory");
    const int ns = n_streams(t);
    int begun = 0;
    for (; begun < ns; begun++) {
        kiln_cuda *cu = kiln_cx_cuda(t->r[begun]);
        if ((st = cur(t, begun, err)) ||
            (st = KILN_CU_CALL(cu, err, cu->api.cuStreamBeginCapture(kiln_cx_stream(t->r[begun]),
                                                                     CU_STREAM_CAPTURE_MODE_RELAXED))))
            break;
    }
    kiln_error run_err = {0};
    kiln_status rst = st ? st : run_all(t, &run_err);
    for (int r = 0; r < begun; r++) { /* end every capture begun, whatever happened */
        kiln_cuda *cu = kiln_cx_cuda(t->r[r]);
        CUgraph gr = NULL;
        kiln_error e = {0};
        kiln_status est = cur(t, r, &e);
        if (!est) est = KILN_CU_CALL(cu, &e, cu->api.cuStreamEndCapture(kiln_cx_stream(t->r[r]), &gr));
        if (!est && !rst && !st) est = KILN_CU_CALL(cu, &e, cu->api.cuGraphInstantiate(&g->exec[r], gr, 0));
        if (gr) cu->api.cuGraphDestroy(gr);
        if (est && !st && !rst) {
            st = est;
            *err = e;
        }
    }
    if (rst && !st) {
        st = rst;
        *err = run_err;
    }
    if (st) {
        for (int r = 0; r < ns; r++)
            if (g->exec[r] && !cur(t, r, &(kiln_error){0})) kiln_cx_cuda(t->r[r])->api.cuGraphExecDestroy(g->exec[r]);
        free(g->exec);
        g->exec = NULL;
        return kiln_err_prefix(err, "tensor parallel: capturing the decode graph of batch %d: ", B);
    }
    t->n_graphs++;
    *out = g;
    return KILN_OK;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Wait until every rank's step has finished: each `done` event polled, NCCL's asynchronous errors
 * checked between polls, the timeout enforced. A failure breaks the executor (tp_break). */
static kiln_status wait_all(tpx *t, const kiln_step *s, kiln_error *err) {
    const double t0 = now_s();
    /* ranks on one device: the last rank's event, recorded last on the one stream, says it all */
    const int ns = t->local ? t->n : n_streams(t), r0 = t->local ? t->n - 1 : 0;
    for (int r = 0; r < ns; r++) t->fin[r] = r < r0;
    for (long spins = 0;; spins++) {
        bool all = true;
        for (int r = 0; r < ns; r++) {
            if (t->fin[r]) continue;
            kiln_cuda *cu = kiln_cx_cuda(t->r[r]);
            CUresult q = cu->api.cuEventQuery(kiln_cx_done(t->r[r]));
            if (q == CUDA_SUCCESS) {
                t->fin[r] = true;
                continue;
            }
            all = false;
            if (q != CUDA_ERROR_NOT_READY) {
                char rn[96];
                rank_name(t, r, rn, sizeof rn);
                KILN_CU_CALL(cu, err, q);
                kiln_err_prefix(err, "tensor parallel: %s failed in step %lld (%d sequences): ", rn,
                                (long long)t->steps, s->n_seqs);
                return tp_break(t, err);
            }
        }
        if (all) return KILN_OK;
        for (int r = 0; t->nccl_on && t->comm && r < t->n; r++) {
            int ae = KILN_NCCL_SUCCESS;
            if (t->nccl.CommGetAsyncError(t->comm[r], &ae) == KILN_NCCL_SUCCESS && ae != KILN_NCCL_SUCCESS &&
                ae != KILN_NCCL_IN_PROGRESS) {
                char rn[96];
                rank_name(t, r, rn, sizeof rn);
                KILN_NCCL_CALL(&t->nccl, t->comm[r], err, ae);
                kiln_err_prefix(err, "tensor parallel: NCCL reported an error on %s in step %lld: ", rn,
                                (long long)t->steps);
                return tp_break(t, err);
            }
        }
        const double el = now_s() - t0;
        if (el > t->timeout_s) {
            char late[256] = "";
            size_t o = 0;
            for (int r = 0; r < ns && o < sizeof late; r++)
                if (!t->fin[r]) {
                    char rn[96];
                    rank_name(t, r, rn, sizeof rn);
                    o += (size_t)snprintf(late + o, sizeof late - o, "%s%s", o ? ", " : "", rn);
                }
            kiln_err(err, KILN_ERR_DEVICE, "tensor parallel (%s): step %lld (%d sequences) did not finish within %g s "
                     "on %s; every rank's collectives were aborted", mode_name(t), (long long)t->steps, s->n_seqs,
                     t->timeout_s, late);
            kiln_err_hint(err, "a GPU that stopped (nvidia-smi, the kernel log's Xid messages) or a peer link that "
                               "failed; a longer --tp-timeout if steps are that slow");
            return tp_break(t, err);
        }
        if (spins > 2000) { /* past the first ~ms: sleep between polls */
            struct timespec ts = {0, 50000};
            nanosleep(&ts, NULL);
        } else {
            sched_yield();
        }
    }
}

/* After a step: a one-shot collective that gave up waiting for a peer (its fault word says which)
 * made the step's results garbage, though every rank finished. */
static kiln_status oneshot_faults(tpx *t, const kiln_step *s, kiln_error *err) {
    for (int r = 0; t->oneshot && r < t->n; r++) {
        const unsigned q = *(volatile unsigned *)t->os_fault[r];
        if (!q) continue;
        char rn[96], qn[96];
        rank_name(t, r, rn, sizeof rn);
        rank_name(t, (int)q - 1 < t->n ? (int)q - 1 : 0, qn, sizeof qn);
        kiln_err(err, KILN_ERR_DEVICE, "tensor parallel (%s): in step %lld (%d sequences), %s waited %g s in a "
                 "collective for %s, which never arrived", mode_name(t), (long long)t->steps, s->n_seqs, rn,
                 t->timeout_s, qn);
        kiln_err_hint(err, "a GPU that stopped (nvidia-smi, the kernel log's Xid messages) or a peer link that "
                           "failed; a longer --tp-timeout if steps are that slow");
        return tp_break(t, err);
    }
    return KILN_OK;
}

/* ---- the kiln_executor ---- */

static kiln_status tp_step(kiln_executor *e, const kiln_step *s, kiln_error *err) {
    tpx *t = (tpx *)e;
    if (t->broken) {
        *err = t->broken_err;
        return err->code;
    }
    kiln_status st;
    for (int r = 0; r < t->n; r++) {
        if ((st = cur(t, r, err)) || (st = kiln_cx_step_begin(t->r[r], s, &t->sh[r], err))) {
            if (r == 0) return st; /* checked before anything changed */
            kiln_err_prefix(err, "tensor parallel: rank %d, after rank 0 had begun the step: ", r);
            return tp_break(t, err);
        }
    }
    tp_graph *g = NULL;
    if (t->sh[0].graph && (st = graph_for(t, t->sh[0].B, &g, err))) return tp_break(t, err);
    if (g) {
        for (int r = 0; r < n_streams(t); r++) {
            kiln_cuda *cu = kiln_cx_cuda(t->r[r]);
            if ((st = cur(t, r, err)) ||
                (st = KILN_CU_CALL(cu, err, cu->api.cuGraphLaunch(g->exec[r], kiln_cx_stream(t->r[r]))))) {
                kiln_err_prefix(err, "tensor parallel: rank %d: decode graph of batch %d: ", r, g->B);
                return tp_break(t, err);
            }
        }
    } else if ((st = run_all(t, err))) {
        return tp_break(t, err);
    }
    for (int r = 0; r < t->n; r++)
        if ((st = cur(t, r, err)) || (st = kiln_cx_step_end(t->r[r], s->n_seqs, r == 0, err))) return tp_break(t, err);
    if ((st = wait_all(t, s, err)) || (st = oneshot_faults(t, s, err))) return st;
    for (int r = 0; r < t->n; r++)
        if ((st = cur(t, r, err)) || (st = kiln_cx_step_finish(t->r[r], s, &t->sh[r], r == 0, err)))
            return tp_break(t, err);
    t->steps++;
    return KILN_OK;
}

static kiln_status tp_reserve(kiln_executor *e, int slot, int tokens, bool *fits, kiln_error *err) {
    tpx *t = (tpx *)e;
    *fits = true;
    for (int r = 0; r < t->n; r++) { /* identical pools: every rank answers as rank 0 */
        kiln_executor *x = kiln_cx_executor(t->r[r]);
        bool f = false;
        kiln_status st = x->ops->reserve(x, slot, tokens, &f, err);
        if (st) return st;
        if (r > 0 && f != *fits)
            return kiln_err(err, KILN_ERR_INTERNAL, "tensor parallel: rank %d's KV pool answers otherwise than rank 0's",
                            r);
        *fits = f;
    }
    return KILN_OK;
}

static void tp_release(kiln_executor *e, int slot) {
    tpx *t = (tpx *)e;
    for (int r = 0; r < t->n; r++) {
        kiln_executor *x = kiln_cx_executor(t->r[r]);
        x->ops->release(x, slot);
    }
}

static void tp_info(kiln_executor *e, kiln_executor_info *info) {
    tpx *t = (tpx *)e;
    for (int r = 0; r < t->n; r++) {
        kiln_executor *x = kiln_cx_executor(t->r[r]);
        kiln_executor_info ri = {0};
        x->ops->info(x, &ri);
        if (r == 0) {
            *info = ri;
            char v[32] = "";
            if (t->nccl_on) kiln_nccl_version_str(&t->nccl, v, sizeof v);
            snprintf(info->device_name, sizeof info->device_name, "%d x %.60s (tensor parallel, %s%s%s%s)", t->n,
                     ri.device_name, t->same_device ? "every rank on one GPU" : "NCCL", v[0] ? " " : "", v,
                     t->oneshot ? ", one-shot kernel" : "");
            continue;
        }
        info->device_bytes += ri.device_bytes;
        info->device_peak_bytes += ri.device_peak_bytes;
        info->weight_bytes += ri.weight_bytes;
        info->kv_bytes += ri.kv_bytes;
        info->scratch_bytes += ri.scratch_bytes;
        if (ri.kernels_load_seconds > info->kernels_load_seconds) info->kernels_load_seconds = ri.kernels_load_seconds;
        info->kernels_jitted |= ri.kernels_jitted;
    }
}

static int tp_profile(kiln_executor *e, kiln_profile_row *rows, int cap) {
    tpx *t = (tpx *)e;
    kiln_executor *x = kiln_cx_executor(t->r[0]); /* rank 0's instructions (every rank runs the same) */
    return x->ops->profile ? x->ops->profile(x, rows, cap) : 0;
}

static void tp_destroy(kiln_executor *e) {
    tpx *t = (tpx *)e;
    if (!t) return;
    for (int r = 0; t->r && r < t->n; r++) /* nothing in flight before anything goes */
        if (t->r[r] && !cur(t, r, &(kiln_error){0})) kiln_cx_cuda(t->r[r])->api.cuStreamSynchronize(kiln_cx_stream(t->r[r]));
    for (int i = 0; i < t->n_graphs; i++) {
        for (int r = 0; r < n_streams(t); r++)
            if (t->graphs[i].exec[r] && !cur(t, r, &(kiln_error){0}))
                kiln_cx_cuda(t->r[r])->api.cuGraphExecDestroy(t->graphs[i].exec[r]);
        free(t->graphs[i].exec);
    }
    for (int r = 0; t->comm && r < t->n; r++)
        if (t->comm[r]) t->nccl.CommDestroy(t->comm[r]);
    for (int r = 0; t->os_stage && t->r && r < t->n; r++) {
        if (!t->r[r] || cur(t, r, &(kiln_error){0})) continue;
        kiln_cu_api *a = &kiln_cx_cuda(t->r[r])->api;
        CUdeviceptr *ps[] = {&t->os_stage[r], &t->os_flags[r], &t->os_count[r]};
        for (int i = 0; i < 3; i++)
            if (*ps[i]) a->cuMemFree(*ps[i]);
        if (t->os_fault[r]) a->cuMemFreeHost(t->os_fault[r]);
    }
    free(t->os_stage);
    free(t->os_flags);
    free(t->os_count);
    free(t->os_fault);
    for (int r = t->n - 1; t->r && r >= 0; r--) /* rank 0 last: ranks on one device use its stream */
        if (t->r[r]) kiln_cx_destroy(t->r[r]);
    if (t->nccl.lib) kiln_nccl_unload(&t->nccl);
    free(t->r);
    free(t->dev);
    free(t->comm);
    free(t->sh);
    free(t->fin);
    free(t);
}

static const kiln_executor_ops tp_ops = {
    .name = "cuda",
    .step = tp_step,
    .reserve = tp_reserve,
    .release = tp_release,
    .destroy = tp_destroy,
    .info = tp_info,
    .profile = tp_profile,
};

kiln_cx *kiln_cuda_tp_cx(kiln_executor *e, int rank) {
    if (!e || e->ops != &tp_ops) return NULL;
    tpx *t = (tpx *)e;
    return rank >= 0 && rank < t->n ? t->r[rank] : NULL;
}

kiln_executor *kiln_cuda_tp_rank(kiln_executor *e, int rank) {
    kiln_cx *x = kiln_cuda_tp_cx(e, rank);
    return x ? kiln_cx_executor(x) : NULL;
}

/* ---- creation ---- */

/* The one-shot kernel's memory on every rank, when every rank can address every other's (one device,
 * or peer access between every pair of GPUs, enabled here); else t->oneshot stays false (NCCL does it
 * all) unless asked for (tp_oneshot 2), which is then an error. Staging holds the largest all-reduce
 * it takes: TP_ONESHOT_BYTES (auto), or a whole step's (always). */
static kiln_status oneshot_init(tpx *t, const kiln_cuda_exec_opts *o, kiln_error *err) {
    kiln_status st;
    for (int r = 0; r < t->n && !t->same_device; r++)
        for (int q = 0; q < t->n; q++) {
            if (q == r) continue;
            kiln_cuda *cr = kiln_cx_cuda(t->r[r]), *cq = kiln_cx_cuda(t->r[q]);
            int can = 0;
            if (cr->api.cuDeviceCanAccessPeer(&can, cr->dev, cq->dev) != CUDA_SUCCESS || !can) {
                if (o->tp_oneshot != 2) return KILN_OK; /* NCCL, which finds its own way */
                return kiln_err(err, KILN_ERR_UNSUPPORTED, "tensor parallel: GPU %d cannot address GPU %d's memory "
                                "(no peer access), which the one-shot kernel (tp_oneshot=2) needs", t->dev[r], t->dev[q]);
            }
            if ((st = cur(t, r, err))) return st;
            CUresult e = cr->api.cuCtxEnablePeerAccess(cq->ctx, 0);
            if (e != CUDA_SUCCESS && e != CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED) {
                KILN_CU_CALL(cr, err, e);
                return kiln_err_prefix(err, "tensor parallel: peer access from GPU %d to GPU %d: ", t->dev[r], t->dev[q]);
            }
        }
    size_t most = TP_ONESHOT_BYTES;
    if (o->tp_oneshot == 2) { /* every all-reduce of a step: its rows x the widest value */
        const kiln_executor *x0 = kiln_cx_executor(t->r[0]);
        most = (size_t)x0->max_step_tokens * (size_t)kiln_cx_widest_collective(t->r[0]);
    }
    t->half = (most + 255) / 256 * 256;
    t->os_stage = calloc((size_t)t->n, sizeof *t->os_stage);
    t->os_flags = calloc((size_t)t->n, sizeof *t->os_flags);
    t->os_count = calloc((size_t)t->n, sizeof *t->os_count);
    t->os_fault = calloc((size_t)t->n, sizeof *t->os_fault);
    if (!t->os_stage || !t->os_flags || !t->os_count || !t->os_fault)
        return kiln_err(err, KILN_ERR_NOMEM, "tensor parallel: out of memory");
    const size_t fl = (size_t)KILN_TP_ONESHOT_BLOCKS * (size_t)t->n * 4, cn = (size_t)(KILN_TP_ONESHOT_BLOCKS + 1) * 4;
    for (int r = 0; r < t->n; r++) {
        kiln_cuda *cu = kiln_cx_cuda(t->r[r]);
        if ((st = cur(t, r, err)) || (st = KILN_CU_CALL(cu, err, cu->api.cuMemAlloc(&t->os_stage[r], 2 * t->half))) ||
            (st = KILN_CU_CALL(cu, err, cu->api.cuMemAlloc(&t->os_flags[r], fl))) ||
            (st = KILN_CU_CALL(cu, err, cu->api.cuMemAlloc(&t->os_count[r], cn))) ||
            (st = KILN_CU_CALL(cu, err, cu->api.cuMemsetD8(t->os_flags[r], 0, fl))) ||
            (st = KILN_CU_CALL(cu, err, cu->api.cuMemsetD8(t->os_count[r], 0, cn))) ||
            (st = KILN_CU_CALL(cu, err, cu->api.cuMemAllocHost((void **)&t->os_fault[r], sizeof(unsigned)))))
            return kiln_err_prefix(err, "tensor parallel: the one-shot kernel's memory (%.1f MiB) on GPU %d: ",
                                   (double)(2 * t->half) / 1048576.0, t->dev[r]);
    }
    for (int r = 0; r < t->n; r++) *(volatile unsigned *)t->os_fault[r] = 0;
    t->oneshot = true;
    return KILN_OK;
}

typedef struct make_job {
    const kiln_model *m;
    const kiln_cuda_exec_opts *o;
    int rank, device;
    kiln_cx *x;
    kiln_status st;
    kiln_error err;
} make_job;

static void *make_rank(void *arg) {
    make_job *j = arg;
    j->st = kiln_cx_new(j->m, j->o, j->rank, j->device, NULL, &j->x, &j->err);
    return NULL;
}

/* Every rank's executor: rank 0 first then the others on its stream (one device), or all at once,
 * a thread each (each uploads its own weights). */
static kiln_status make_ranks(tpx *t, const kiln_model *m, const kiln_cuda_exec_opts *o, kiln_error *err) {
    kiln_status st;
    if (t->same_device) { /* one after another: each sees the memory the ones before took */
        for (int r = 0; r < t->n; r++) {
            CUstream s = r && t->local ? kiln_cx_stream(t->r[0]) : NULL;
            if ((st = kiln_cx_new(m, o, r, t->dev[r], s, &t->r[r], err))) return st;
        }
        return KILN_OK;
    }
    const size_t nr = (unsigned)t->n; /* 2..KILN_MAX_RANKS */
    make_job *jobs = calloc(nr, sizeof *jobs);
    pthread_t *th = calloc(nr, sizeof *th);
    bool *started = calloc(nr, sizeof *started);
    if (!jobs || !th || !started) {
        free(jobs);
        free(th);
        free(started);
        return kiln_err(err, KILN_ERR_NOMEM, "tensor parallel: out of memory");
    }
    for (int r = 0; r < t->n; r++) {
        jobs[r] = (make_job){.m = m, .o = o, .rank = r, .device = t->dev[r]};
        started[r] = pthread_create(&th[r], NULL, make_rank, &jobs[r]) == 0;
        if (!started[r]) make_rank(&jobs[r]);
    }
    st = KILN_OK;
    for (int r = 0; r < t->n; r++) {
        if (started[r]) pthread_join(th[r], NULL);
        t->r[r] = jobs[r].x;
        if (jobs[r].st && !st) {
            st = jobs[r].st;
            *err = jobs[r].err;
        }
    }
    free(jobs);
    free(th);
    free(started);
    return st;
}

kiln_status kiln_cuda_tp_new(const kiln_model *m, const kiln_cuda_exec_opts *o, kiln_executor **out,
                             kiln_error *err) {
    *out = NULL;
    const int n = (int)m->plan->n_ranks;
    if (o->n_devices && o->n_devices != n) {
        kiln_err(err, KILN_ERR_INVALID_ARG, "tensor parallel: %d GPUs given for an engine of %d ranks", o->n_devices, n);
        return kiln_err_hint(err, "give one GPU per rank (--gpus with %d devices)", n);
    }
    if (o->tp_timeout_s < 0)
        return kiln_err(err, KILN_ERR_INVALID_ARG, "tensor parallel: timeout %g s is negative", o->tp_timeout_s);
    tpx *t = calloc(1, sizeof *t);
    if (!t) return kiln_err(err, KILN_ERR_NOMEM, "tensor parallel: out of memory");
    t->n = n;
    t->timeout_s = o->tp_timeout_s > 0 ? o->tp_timeout_s : TP_DEFAULT_TIMEOUT_S;
    t->r = calloc((size_t)n, sizeof *t->r);
    t->dev = calloc((size_t)n, sizeof *t->dev);
    t->sh = calloc((size_t)n, sizeof *t->sh);
    t->fin = calloc((size_t)n, sizeof *t->fin);
    kiln_status st = KILN_OK;
    if (!t->r || !t->dev || !t->sh || !t->fin) {
        st = kiln_err(err, KILN_ERR_NOMEM, "tensor parallel: out of memory");
        goto fail;
    }
    /* the devices: all distinct (NCCL) or all one (for testing on one GPU) */
    int same = 0;
    for (int r = 0; r < n; r++) {
        t->dev[r] = o->n_devices ? o->devices[r] : o->device + r;
        for (int q = 0; q < r; q++)
            if (t->dev[q] == t->dev[r]) same++;
    }
    t->same_device = same > 0;
    if (t->same_device && same != n * (n - 1) / 2) {
        st = kiln_err(err, KILN_ERR_UNSUPPORTED, "tensor parallel: ranks share some GPUs but not all (rank r on device "
                      "devices[r]); kiln runs the ranks each on its own GPU, or all on one");
        goto fail;
    }
    /* collectives: ranks on one device add on one stream (kiln_tp_sum) unless the one-shot kernel is asked
     * for (a stream each); ranks on their own GPUs take NCCL, and the one-shot kernel for small all-reduces
     * and the gather where every pair has peer access (auto) or always (tp_oneshot 2) */
    t->local = t->same_device && o->tp_oneshot != 2;
    if (n > KILN_TP_LOCAL_RANKS && (t->same_device || o->tp_oneshot == 2)) {
        st = kiln_err(err, KILN_ERR_UNSUPPORTED, "tensor parallel: %d ranks on one GPU or with the one-shot kernel "
                      "(at most %d)", n, KILN_TP_LOCAL_RANKS);
        goto fail;
    }
    t->nccl_on = !t->same_device && o->tp_oneshot != 2;
    if (t->nccl_on && (st = kiln_nccl_load(&t->nccl, n, err))) goto fail; /* before any weight moves */
    if ((st = make_ranks(t, m, o, err))) goto fail;
    if (!t->local && o->tp_oneshot != 1 && n <= KILN_TP_LOCAL_RANKS && (st = oneshot_init(t, o, err))) goto fail;
    /* the same step budget and KV block count on every rank: the least any rank took or can take */
    int64_t nb = 0;
    int step = 0;
    for (int r = 0; r < n; r++) {
        const kiln_executor *x = kiln_cx_executor(t->r[r]);
        if (r == 0 || x->max_step_tokens < step) step = x->max_step_tokens;
        if (t->local && r > 0) continue; /* one device: rank 0 measures for all */
        int64_t b = 0;
        if ((st = cur(t, r, err)) || (st = kiln_cx_kv_fit(t->r[r], o, t->local ? n : 1, &b, err))) goto fail;
        if (r == 0 || b < nb) nb = b;
    }
    for (int r = 0; r < n; r++)
        if ((st = cur(t, r, err)) || (st = kiln_cx_kv_alloc(t->r[r], nb, err))) goto fail;
    if (t->nccl_on) {
        if (!(t->comm = calloc((size_t)n, sizeof *t->comm))) {
            st = kiln_err(err, KILN_ERR_NOMEM, "tensor parallel: out of memory");
            goto fail;
        }
        if ((st = KILN_NCCL_CALL(&t->nccl, NULL, err, t->nccl.CommInitAll(t->comm, n, t->dev)))) {
            kiln_err_prefix(err, "tensor parallel: joining %d GPUs: ", n);
            memset(t->comm, 0, (size_t)n * sizeof *t->comm);
            goto fail;
        }
    }
    const kiln_executor *x0 = kiln_cx_executor(t->r[0]);
    t->base = (kiln_executor){.ops = &tp_ops,
                              .max_seqs = x0->max_seqs,
                              .max_context = x0->max_context,
                              .max_step_tokens = step,
                              .vocab = x0->vocab};
    *out = &t->base;
    return KILN_OK;
fail:
    tp_destroy(&t->base);
    return st;
}
