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
 *  - every rank on one device (a tp engine tested on a one-GPU host): the
 *    ranks share rank 0's stream and kiln_tp_sum adds their partials in rank
 *    order (the CPU executor's order, bit for bit in fp32); the gather is
 *    a strided copy per rank into rank 0's logits.
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

typedef struct tp_graph {
    int B;
    CUgraphExec *exec; /* [n] per rank; ranks on one device: exec[0] only */
} tp_graph;

typedef struct tpx {
    kiln_executor base; /* first member */
    int n;              /* ranks */
    kiln_cx **r;        /* [n] */
    int *dev;           /* [n] CUDA device of each rank */
    bool local;         /* every rank on one device: one stream, kiln_tp_sum */
    kiln_nccl nccl;
    kiln_nccl_comm *comm; /* [n] (NCCL) */
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

static const char *mode_name(const tpx *t) { return t->local ? "one device" : "NCCL"; }

/* "rank 1 (GPU 1, NVIDIA H200)" */
static void rank_name(tpx *t, int r, char *buf, size_t cap) {
    snprintf(buf, cap, "rank %d (GPU %d, %.60s)", r, t->dev[r], kiln_cx_cuda(t->r[r])->name);
}

/* Abort every communicator (peers blocked in a collective return) and keep `err` as the executor's
 * state: every later step fails with it. */
static kiln_status tp_break(tpx *t, kiln_error *err) {
    if (!t->local && t->comm)
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
    if (t->local) {
        if ((st = cur(t, 0, err))) return st;
        st = d[0].gather ? gather_rows(t, &d[0], in, err) : kiln_cx_tp_sum(t->r[0], in, out, t->n, count, d[0].f32, err);
    } else {
        kiln_nccl *nc = &t->nccl;
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
        for (int r = 0; !t->local && r < t->n; r++) {
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
            kiln_err(err, KILN_ERR_DEVICE, "tensor parallel (%s): step %lld (%d sequences) did not finish within %.0f s "
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
    if ((st = wait_all(t, s, err))) return st;
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
            if (!t->local) kiln_nccl_version_str(&t->nccl, v, sizeof v);
            snprintf(info->device_name, sizeof info->device_name, "%d x %.60s (tensor parallel, %s%s%s)", t->n,
                     ri.device_name, t->local ? "every rank on one GPU" : "NCCL", v[0] ? " " : "", v);
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

kiln_executor *kiln_cuda_tp_rank(kiln_executor *e, int rank) {
    if (!e || e->ops != &tp_ops) return NULL;
    tpx *t = (tpx *)e;
    return rank >= 0 && rank < t->n ? kiln_cx_executor(t->r[rank]) : NULL;
}

/* ---- creation ---- */

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
    if (t->local) {
        for (int r = 0; r < t->n; r++) {
            CUstream s = r ? kiln_cx_stream(t->r[0]) : NULL;
            if ((st = kiln_cx_new(m, o, r, t->dev[r], s, &t->r[r], err))) return st;
        }
        return KILN_OK;
    }
    make_job *jobs = calloc((size_t)t->n, sizeof *jobs);
    pthread_t *th = calloc((size_t)t->n, sizeof *th);
    bool *started = calloc((size_t)t->n, sizeof *started);
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
    t->local = same > 0;
    if (t->local && same != n * (n - 1) / 2) {
        st = kiln_err(err, KILN_ERR_UNSUPPORTED, "tensor parallel: ranks share some GPUs but not all (rank r on device "
                      "devices[r]); kiln runs the ranks each on its own GPU, or all on one");
        goto fail;
    }
    if (t->local && n > KILN_TP_LOCAL_RANKS) {
        st = kiln_err(err, KILN_ERR_UNSUPPORTED, "tensor parallel: %d ranks on one GPU (at most %d)", n,
                      KILN_TP_LOCAL_RANKS);
        goto fail;
    }
    if (!t->local && (st = kiln_nccl_load(&t->nccl, n, err))) goto fail; /* before any weight moves */
    if ((st = make_ranks(t, m, o, err))) goto fail;
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
    if (!t->local) {
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
