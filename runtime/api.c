/*
 * api.c — the public C API (kiln.h) over the runtime's internals:
 *
 *   kiln_t      → kiln_model (model.c): the opened engine, read-only
 *   kiln_ctx_t  → an executor (cpu_backend.c, or the CUDA one) + a
 *                 kiln_sched (scheduler.c)
 *
 * Everything here is argument checking, option defaults, device choice and
 * error bookkeeping; the work is in the scheduler and the executors. Each
 * handle keeps the message of its last failure (kiln_error_message /
 * kiln_last_error). A constructor that fails still returns a handle that
 * holds only its message (like sqlite3_open), so a caller through FFI can
 * always read why.
 *
 * Device choice: the executors are kinds (kiln_rt.h: kiln_executor_kind) in
 * a table, by device name: "gpu" (runtime/cuda/kind.c, or
 * runtime/nogpu/gpu_absent.c in a build without the CUDA toolkit: the build
 * picks the file, no #ifdef here) and "cpu", the fp32 reference executor.
 * This file is the one that holds the table, so it is a library of its own
 * (kiln_api) above kiln_rt and kiln_cuda, and no link points back down;
 * "auto" tries them in order and passes to the next only when one is
 * unavailable (KILN_ERR_DEVICE), never to hide another failure. Options that
 * only the GPU takes (measurement knobs, a device list) make "auto" the GPU
 * or an error, never a quiet run on the CPU.
 */
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "kiln.h"
#include "kiln_chat.h"
#include "kiln_exec.h"
#include "kiln_rt.h"
#include "kiln_sched.h"
#include "kiln_tokenizer.h"

struct kiln_t {
    kiln_model *m; /* NULL in a failed handle */
    kiln_chat_section *chat; /* the chat template, NULL when the engine has none */
    kiln_error err;
    double open_seconds;
    /* The model opens without f32 weights (a GPU context reads the weights
     * section itself); the first CPU context converts them, under this lock. */
    pthread_mutex_t f32_lock;
};

struct kiln_ctx_t {
    const kiln_t *k;  /* NULL in a failed handle */
    kiln_executor *x;
    kiln_sched *s;
    char device[16];  /* "cpu" or "gpu" */
    pthread_mutex_t err_lock;
    kiln_error last;  /* the last failure */
    kiln_error cause; /* why kiln_ctx_new failed: later messages quote this,
                         never `last`, so they do not nest into each other */
};

#define DEFAULT_MAX_BATCH 8
#define DEFAULT_MAX_STEP_TOKENS 8192 /* as the CUDA executor's default (fewer there when memory is tight) */
#define DEFAULT_KV_FRACTION 0.9
#define DEFAULT_MAX_TOKENS 128
#define MAX_BATCH_LIMIT 1024
#define MAX_THREADS 1024

static int cores(void) {
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n < 1 ? 1 : n > MAX_THREADS ? MAX_THREADS : (int)n;
}

/* ---- engines ---- */

/* kiln_open, kiln_open_range and kiln_open_memory: the engine in `src`. */
kiln_status kiln_open_src(const kiln_engine_src *src, int32_t threads, kiln_t **out) {
    if (!out) return KILN_ERR_INVALID_ARG;
    *out = NULL;
    kiln_t *k = calloc(1, sizeof *k);
    if (!k) return KILN_ERR_NOMEM;
    if (pthread_mutex_init(&k->f32_lock, NULL)) {
        free(k);
        return KILN_ERR_NOMEM;
    }
    *out = k;
    if (!src->path && !src->data) return kiln_err(&k->err, KILN_ERR_INVALID_ARG, "kiln_open: path is NULL");
    if (threads < 0 || threads > MAX_THREADS)
        return kiln_err(&k->err, KILN_ERR_INVALID_ARG, "kiln_open: threads %d is outside 0..%d (0 = one per core)",
                        threads, MAX_THREADS);
    double t0 = kiln_now();
    kiln_status st = kiln_model_open_src(src, threads ? threads : cores(), KILN_MODEL_NO_F32, &k->m, &k->err);
    if (st != KILN_OK) {
        k->m = NULL;
        return st;
    }
    if ((st = kiln_chat_from_engine(&k->m->engine, kiln_engine_src_label(src), &k->chat, &k->err)) != KILN_OK) return st;
    k->open_seconds = kiln_now() - t0;
    return KILN_OK;
}

kiln_status kiln_open(const char *path, int32_t threads, kiln_t **out) {
    kiln_engine_src src = {.path = path};
    return kiln_open_src(&src, threads, out);
}

kiln_status kiln_open_range(const char *path, uint64_t offset, uint64_t size, int32_t threads, kiln_t **out) {
    kiln_engine_src src = {.path = path, .offset = offset, .size = size, .range = true};
    return kiln_open_src(&src, threads, out);
}

kiln_status kiln_open_memory(const void *data, uint64_t size, const char *label, int32_t threads, kiln_t **out) {
    kiln_engine_src src = {.data = data, .size = size, .label = label ? label : "(memory)"};
    return kiln_open_src(&src, threads, out);
}

void kiln_close(kiln_t *k) {
    if (!k) return;
    kiln_chat_section_free(k->chat);
    kiln_model_close(k->m);
    pthread_mutex_destroy(&k->f32_lock);
    free(k);
}

const kiln_model *kiln_api_model(const kiln_t *k) { return k ? k->m : NULL; }
const kiln_chat_section *kiln_api_chat(const kiln_t *k) { return k && k->m ? k->chat : NULL; }

const char *kiln_error_message(const kiln_t *k) { return k ? k->err.msg : "kiln_t is NULL"; }

int32_t kiln_vocab_size(const kiln_t *k) { return k && k->m ? k->m->plan->vocab_size : 0; }
int32_t kiln_max_context(const kiln_t *k) { return k && k->m ? k->m->plan->max_context : 0; }
int32_t kiln_bos_id(const kiln_t *k) { return k && k->m ? k->m->bos_id : -1; }
int32_t kiln_has_tokenizer(const kiln_t *k) { return k && k->m && k->m->tokenizer ? 1 : 0; }
const char *kiln_meta_json(const kiln_t *k) { return k && k->m ? k->m->meta_json : NULL; }
double kiln_open_seconds(const kiln_t *k) { return k && k->m ? k->open_seconds : 0; }

int32_t kiln_eos_ids(const kiln_t *k, int32_t *ids, int32_t cap) {
    if (!k || !k->m) return 0;
    for (int i = 0; i < k->m->n_eos && i < cap && ids; i++) ids[i] = k->m->eos_ids[i];
    return k->m->n_eos;
}

/* ---- contexts ---- */

void kiln_ctx_options_init(kiln_ctx_options *o) {
    if (!o) return;
    *o = (kiln_ctx_options){.struct_size = sizeof *o,
                            .device = "auto",
                            .max_batch = DEFAULT_MAX_BATCH,
                            .max_context = 0,
                            .kv_bytes = 0,
                            .kv_fraction = DEFAULT_KV_FRACTION,
                            .max_step_tokens = 0,
                            .threads = 0,
                            .measure = NULL,
                            .gpus = NULL,
                            .tp_timeout_s = 0};
}

static kiln_status fail_ctx(kiln_ctx_t *c, kiln_error *e) {
    pthread_mutex_lock(&c->err_lock);
    c->last = *e;
    pthread_mutex_unlock(&c->err_lock);
    return e->code;
}

/* kiln_ctx_new's failure: kept as the cause that later calls quote. */
static kiln_status fail_new(kiln_ctx_t *c, kiln_error *e) {
    c->cause = *e;
    return fail_ctx(c, e);
}

/* The measurement knobs of kiln_ctx_options.measure ("key=value,..."), parsed and range-checked. */
static kiln_status parse_measure(const char *spec, kiln_measure_knobs *k, kiln_error *err) {
    *k = (kiln_measure_knobs){.lt_tune = -1, .pdl = -1, .graphs = -1, .recorded = -1, .moe_grouped = -1, .qgemv_cc = -1, .qgemm = -1, .w8a8 = -1,
                              .tp_oneshot = -1, .prefill_wg = -1, .decode_tc = -1, .lt_search = -1, .w8a8_fast = -1};
    if (!spec || !*spec) return KILN_OK;
    if (strlen(spec) > 256) return kiln_err(err, KILN_ERR_INVALID_ARG, "measure: longer than 256 characters");
    char buf[260];
    snprintf(buf, sizeof buf, "%s", spec);
    char *save = NULL;
    for (char *item = strtok_r(buf, ",", &save); item; item = strtok_r(NULL, ",", &save)) {
        char shown[64];
        snprintf(shown, sizeof shown, "%s", item);
        char *eq = strchr(item, '=');
        char *end = NULL;
        if (!eq || eq == item || !eq[1]) goto bad;
        *eq = 0;
        const char *key = item, *val = eq + 1;
        double d = strtod(val, &end);
        if (*end) goto bad;
        bool whole = d == (double)(long)d;
        if (!strcmp(key, "gemv_max_m") && whole && d >= 1 && d <= 64) k->gemv_max_m = (int)d;
        else if (!strcmp(key, "attn_waves") && d > 0 && d <= 64) k->attn_waves = d;
        else if (!strcmp(key, "lt_tune") && whole && d >= 0 && d <= 2) k->lt_tune = (int)d;
        else if (!strcmp(key, "pdl") && whole && (d == 0 || d == 1)) k->pdl = (int)d;
        else if (!strcmp(key, "graphs") && whole && (d == 0 || d == 1)) k->graphs = (int)d;
        else if (!strcmp(key, "profile") && whole && (d == 0 || d == 1)) k->profile = d == 1;
        else if (!strcmp(key, "recorded") && whole && (d == 0 || d == 1)) k->recorded = (int)d;
        else if (!strcmp(key, "moe_grouped") && whole && (d == 0 || d == 1)) k->moe_grouped = (int)d;
        else if (!strcmp(key, "qgemv_cc") && whole && (d == 0 || d == 1)) k->qgemv_cc = (int)d;
        else if (!strcmp(key, "qgemm") && whole && (d == 0 || d == 1)) k->qgemm = (int)d;
        else if (!strcmp(key, "w8a8") && whole && d >= 0 && d <= 2) k->w8a8 = (int)d;
        else if (!strcmp(key, "tp_oneshot") && whole && d >= 0 && d <= 2) k->tp_oneshot = (int)d;
        else if (!strcmp(key, "prefill_wg") && whole && (d == 0 || d == 1)) k->prefill_wg = (int)d;
        else if (!strcmp(key, "decode_tc") && whole && d >= 0 && d <= 2) k->decode_tc = (int)d;
        else if (!strcmp(key, "decode_tc_min") && whole && d >= 1 && d <= 65536) k->decode_tc_min = (int)d;
        else if (!strcmp(key, "lt_search") && whole && (d == 0 || d == 1)) k->lt_search = (int)d;
        else if (!strcmp(key, "w8a8_fast") && whole && (d == 0 || d == 1)) k->w8a8_fast = (int)d;
        else
            goto bad;
        k->any = true;
        continue;
    bad:
        kiln_err(err, KILN_ERR_INVALID_ARG, "measure: '%s' is not a known knob with a value in its range", shown);
        return kiln_err_hint(err, "knobs: gemv_max_m=1..64, attn_waves=(0,64], lt_tune=0|1|2, pdl=0|1, graphs=0|1, "
                                  "profile=0|1, recorded=0|1, moe_grouped=0|1, qgemv_cc=0|1, qgemm=0|1, w8a8=0|1|2, tp_oneshot=0|1|2, "
                                  "prefill_wg=0|1, decode_tc=0|1|2, decode_tc_min=1..65536, lt_search=0|1, "
                                  "w8a8_fast=0|1");
    }
    return KILN_OK;
}

/* The executors, in the order "auto" tries them. */
static const kiln_executor_kind *const executor_kinds[] = {&kiln_executor_gpu, &kiln_executor_cpu};

/* Whether "auto" tries `kind`: options that only some kinds take (knobs, a device list) leave the
 * others out, whatever the engine; without them, a kind passes over engines it is not for (the GPU
 * over an engine with no kernels). */
static bool auto_tries(const kiln_executor_kind *kind, const kiln_model *m, const kiln_measure_knobs *mk,
                       const kiln_gpu_list *gpus) {
    if (mk->any || gpus->n) return (!mk->any || kind->takes_knobs) && (!gpus->n || kind->takes_gpus);
    return !kind->auto_for || kind->auto_for(m);
}

/* The executor for device `dev` ("cpu", "gpu", "auto") into *x, its name into `device`. */
static kiln_status new_executor(const kiln_t *k, const char *dev, const kiln_ctx_options *o,
                                const kiln_measure_knobs *mk, const kiln_gpu_list *gpus, kiln_executor **x,
                                char *device, size_t cap, kiln_error *err) {
    const bool any = strcmp(dev, "auto") == 0;
    kiln_status st = KILN_ERR_DEVICE;
    for (size_t i = 0; i < sizeof executor_kinds / sizeof executor_kinds[0]; i++) {
        const kiln_executor_kind *kind = executor_kinds[i];
        if (!any && strcmp(dev, kind->device)) continue;
        if (any && !auto_tries(kind, k->m, mk, gpus)) continue;
        *err = (kiln_error){0};
        st = KILN_OK;
        if (kind->needs_f32) { /* the first context that needs them converts the weights */
            pthread_mutex_lock((pthread_mutex_t *)&k->f32_lock);
            st = kiln_model_load_f32(k->m, err);
            pthread_mutex_unlock((pthread_mutex_t *)&k->f32_lock);
        }
        if (st == KILN_OK) st = kind->create(k->m, o, mk, gpus, x, err);
        if (st == KILN_OK) snprintf(device, cap, "%s", kind->device);
        if (st != KILN_ERR_DEVICE || !any) return st;
    }
    return st;
}

static kiln_status check_ctx_options(const kiln_model *m, const kiln_ctx_options *o, kiln_error *err) {
    if (o->max_batch < 1 || o->max_batch > MAX_BATCH_LIMIT)
        return kiln_err(err, KILN_ERR_INVALID_ARG, "max_batch %d is outside 1..%d", o->max_batch, MAX_BATCH_LIMIT);
    if (o->max_context < 0 || o->max_context > m->plan->max_context) {
        kiln_err(err, KILN_ERR_INVALID_ARG, "max_context %d is outside 0..%d (the model's context)", o->max_context,
                 m->plan->max_context);
        return kiln_err_hint(err, "0 means the model's context of %d tokens", m->plan->max_context);
    }
    if (o->kv_bytes < 0) return kiln_err(err, KILN_ERR_INVALID_ARG, "kv_bytes %lld is negative", (long long)o->kv_bytes);
    if (!(o->kv_fraction > 0 && o->kv_fraction <= 1))
        return kiln_err(err, KILN_ERR_INVALID_ARG, "kv_fraction %g is outside (0, 1]", o->kv_fraction);
    if (o->max_step_tokens < 0)
        return kiln_err(err, KILN_ERR_INVALID_ARG, "max_step_tokens %d is negative (0 = %d)", o->max_step_tokens,
                        DEFAULT_MAX_STEP_TOKENS);
    if (o->max_step_tokens > 0 && o->max_step_tokens < o->max_batch) {
        kiln_err(err, KILN_ERR_INVALID_ARG, "max_step_tokens %d is below max_batch %d", o->max_step_tokens,
                 o->max_batch);
        return kiln_err_hint(err, "each running sequence decodes one token per step, so a step needs at least "
                                  "max_batch tokens");
    }
    if (o->threads < 0 || o->threads > MAX_THREADS)
        return kiln_err(err, KILN_ERR_INVALID_ARG, "threads %d is outside 0..%d (0 = one per core)", o->threads,
                        MAX_THREADS);
    if (!(o->tp_timeout_s >= 0 && o->tp_timeout_s <= (double)KILN_TP_TIMEOUT_MAX_S)) /* NaN too */
        return kiln_err(err, KILN_ERR_INVALID_ARG, "tp_timeout_s %g is outside 0..%g seconds (0 = 60)",
                        o->tp_timeout_s, (double)KILN_TP_TIMEOUT_MAX_S);
    return KILN_OK;
}

/* kiln_ctx_options.gpus parsed into *g and checked against the device and the engine: a list is the
 * GPU's, and names one device per tensor-parallel rank. */
static kiln_status check_gpus(const kiln_model *m, const char *spec, bool want_cpu, kiln_gpu_list *g,
                              kiln_error *err) {
    kiln_status st = kiln_gpus_parse(spec, g, err);
    if (st != KILN_OK) return kiln_err_prefix(err, "gpus ");
    if (g->n && want_cpu) {
        kiln_err(err, KILN_ERR_INVALID_ARG, "gpus \"%.64s\" lists GPUs, which do not apply to device \"cpu\"", spec);
        return kiln_err_hint(err, "drop the device list, or use device \"gpu\"");
    }
    const int ranks = (int)m->plan->n_ranks;
    if (g->n && g->n != ranks) {
        if (ranks == 1) {
            kiln_err(err, KILN_ERR_INVALID_ARG, "gpus \"%.64s\" lists %d devices, but the engine has 1 rank (it is not "
                     "tensor-parallel): give 1 device, the GPU to run on", spec, g->n);
            return kiln_err_hint(err, "compile with --tp N for an engine that runs on N GPUs");
        }
        kiln_err(err, KILN_ERR_INVALID_ARG, "gpus \"%.64s\" lists %d device%s, but the engine has %d tensor-parallel "
                 "ranks: give %d devices", spec, g->n, g->n == 1 ? "" : "s", ranks, ranks);
        return kiln_err_hint(err, "one device per rank, in rank order: \"0,1\" runs rank 0 on GPU 0 and rank 1 on "
                                  "GPU 1; the same device for every rank (\"0,0\") runs them all on one GPU");
    }
    return KILN_OK;
}

kiln_status kiln_ctx_new(const kiln_t *k, const kiln_ctx_options *opts, kiln_ctx_t **out) {
    if (!out) return KILN_ERR_INVALID_ARG;
    *out = NULL;
    kiln_ctx_t *c = calloc(1, sizeof *c);
    if (!c) return KILN_ERR_NOMEM;
    if (pthread_mutex_init(&c->err_lock, NULL)) {
        free(c);
        return KILN_ERR_NOMEM;
    }
    *out = c;
    kiln_error e = {0};
    kiln_status st;
    if (!k) {
        kiln_err(&e, KILN_ERR_INVALID_ARG, "kiln_ctx_new: the engine handle is NULL");
        return fail_new(c, &e);
    }
    if (!k->m) {
        kiln_err(&e, KILN_ERR_INVALID_ARG, "kiln_ctx_new: the engine handle did not open: %s", k->err.msg);
        return fail_new(c, &e);
    }
    /* options: defaults, then as much of the caller's struct as it has */
    kiln_ctx_options o;
    kiln_ctx_options_init(&o);
    if (opts) {
        if (opts->struct_size < offsetof(kiln_ctx_options, device) + sizeof opts->device) {
            kiln_err(&e, KILN_ERR_INVALID_ARG, "kiln_ctx_new: options.struct_size is %u", opts->struct_size);
            kiln_err_hint(&e, "initialise the options with kiln_ctx_options_init()");
            return fail_new(c, &e);
        }
        memcpy(&o, opts, opts->struct_size < sizeof o ? opts->struct_size : sizeof o);
        o.struct_size = sizeof o;
    }
    const char *dev = o.device ? o.device : "auto";
    bool want_cpu = strcmp(dev, "cpu") == 0, want_gpu = strcmp(dev, "gpu") == 0, want_auto = strcmp(dev, "auto") == 0;
    if (!want_cpu && !want_gpu && !want_auto) {
        kiln_err(&e, KILN_ERR_INVALID_ARG, "kiln_ctx_new: unknown device \"%.40s\"", dev);
        kiln_err_hint(&e, "use \"cpu\", \"gpu\" or \"auto\"");
        return fail_new(c, &e);
    }
    if ((st = check_ctx_options(k->m, &o, &e)) != KILN_OK) {
        kiln_err_prefix(&e, "kiln_ctx_new: ");
        return fail_new(c, &e);
    }
    kiln_measure_knobs mk;
    if ((st = parse_measure(o.measure, &mk, &e)) != KILN_OK || (want_cpu && mk.any)) {
        if (st == KILN_OK) {
            st = kiln_err(&e, KILN_ERR_INVALID_ARG, "measure knobs '%s' apply to the GPU executor, not device \"cpu\"",
                          o.measure);
        }
        kiln_err_prefix(&e, "kiln_ctx_new: ");
        return fail_new(c, &e);
    }
    kiln_gpu_list gpus;
    if ((st = check_gpus(k->m, o.gpus, want_cpu, &gpus, &e)) != KILN_OK) {
        kiln_err_prefix(&e, "kiln_ctx_new: ");
        return fail_new(c, &e);
    }
    st = new_executor(k, dev, &o, &mk, &gpus, &c->x, c->device, sizeof c->device, &e);
    if (st == KILN_ERR_DEVICE && want_auto && gpus.n) /* say why "auto" did not take the CPU */
        kiln_err_prefix(&e, "gpus \"%.64s\" asks for the GPU, so device \"auto\" does not fall back to the CPU: ",
                        o.gpus);
    if (st == KILN_OK && c->x && kiln_model_shrank(k->m, &e)) { /* the upload read zeros past a new end */
        c->x->ops->destroy(c->x);
        c->x = NULL;
        st = e.code;
    }
    if (st != KILN_OK) {
        kiln_err_prefix(&e, "kiln_ctx_new: ");
        return fail_new(c, &e);
    }
    kiln_sched_opts so = {.max_seqs = o.max_batch,
                          .max_context = c->x->max_context,
                          .max_step_tokens = o.max_step_tokens ? o.max_step_tokens : DEFAULT_MAX_STEP_TOKENS,
                          .eos_ids = k->m->eos_ids,
                          .n_eos = k->m->n_eos};
    if (so.max_step_tokens < so.max_seqs) so.max_step_tokens = so.max_seqs;
    if (so.max_step_tokens > c->x->max_step_tokens) so.max_step_tokens = c->x->max_step_tokens;
    if ((st = kiln_sched_new(c->x, &so, &c->s, &e)) != KILN_OK) {
        kiln_err_prefix(&e, "kiln_ctx_new: ");
        c->x->ops->destroy(c->x);
        c->x = NULL;
        return fail_new(c, &e);
    }
    c->k = k;
    return KILN_OK;
}

void kiln_ctx_free(kiln_ctx_t *c) {
    if (!c) return;
    kiln_sched_free(c->s);
    if (c->x) c->x->ops->destroy(c->x);
    pthread_mutex_destroy(&c->err_lock);
    free(c);
}

const char *kiln_last_error(const kiln_ctx_t *c) { return c ? c->last.msg : "kiln_ctx_t is NULL"; }

/* Common entry check: a usable context. */
static kiln_status usable(kiln_ctx_t *c, const char *fn) {
    if (!c) return KILN_ERR_INVALID_ARG;
    if (!c->s) {
        kiln_error e = {0};
        kiln_err(&e, KILN_ERR_INVALID_ARG, "%s: this context failed to be created (%.900s)", fn, c->cause.msg);
        return fail_ctx(c, &e);
    }
    return KILN_OK;
}

static void info_fill(kiln_ctx_t *c, kiln_ctx_info *info);

kiln_status kiln_ctx_info_get(kiln_ctx_t *c, kiln_ctx_info *info) {
    kiln_status st = usable(c, "kiln_ctx_info_get");
    if (st != KILN_OK) return st;
    kiln_error e = {0};
    /* 0.1's struct ended at kernels_jitted; a caller built against it gets the fields it knows */
    const size_t v01 = offsetof(kiln_ctx_info, kernels_jitted) + sizeof info->kernels_jitted;
    if (!info || info->struct_size < v01) {
        kiln_err(&e, KILN_ERR_INVALID_ARG, "kiln_ctx_info_get: info is NULL or its struct_size is below %zu", v01);
        kiln_err_hint(&e, "set info.struct_size = sizeof(kiln_ctx_info) before the call");
        return fail_ctx(c, &e);
    }
    const size_t caller_size = info->struct_size < sizeof *info ? info->struct_size : sizeof *info;
    kiln_ctx_info all;
    info_fill(c, &all);
    memcpy(info, &all, caller_size);
    info->struct_size = (uint32_t)caller_size;
    return KILN_OK;
}

static void info_fill(kiln_ctx_t *c, kiln_ctx_info *info) {
    kiln_executor_info xi = {0};
    if (c->x->ops->info) c->x->ops->info(c->x, &xi);
    kiln_sched_stats ss;
    kiln_sched_get_stats(c->s, &ss);
    memset(info, 0, sizeof *info);
    info->struct_size = sizeof *info;
    snprintf(info->device, sizeof info->device, "%s", c->device);
    snprintf(info->device_name, sizeof info->device_name, "%s", xi.device_name[0] ? xi.device_name : c->device);
    info->max_batch = kiln_sched_max_seqs(c->s);
    info->max_context = kiln_sched_max_context(c->s);
    info->max_step_tokens = kiln_sched_max_step_tokens(c->s);
    info->kv_capacity_tokens = xi.kv_capacity_tokens;
    info->device_bytes = xi.device_bytes;
    info->device_peak_bytes = xi.device_peak_bytes;
    info->weight_bytes = xi.weight_bytes;
    info->kv_bytes = xi.kv_bytes;
    info->scratch_bytes = xi.scratch_bytes;
    info->kernels_load_seconds = xi.kernels_load_seconds;
    info->kernels_jitted = xi.kernels_jitted;
    snprintf(info->tuning, sizeof info->tuning, "%s", xi.tuning);
    info->gemm_fp8 = xi.gemm_fp8;
    info->gemm_q = xi.gemm_q;
    struct rusage ru;
    if (getrusage(RUSAGE_SELF, &ru) == 0) info->host_peak_bytes = (int64_t)ru.ru_maxrss * 1024; /* Linux: kB */
    info->steps = ss.steps;
    info->max_running = ss.max_running;
    info->requests_running = ss.running;
    info->requests_waiting = ss.queued;
    info->kv_used_tokens = xi.kv_used_tokens;
    info->preemptions = ss.preemptions;
    info->tokens_recomputed = ss.tokens_recomputed;
}

/* ---- requests ---- */

void kiln_request_options_init(kiln_request_options *o) {
    if (!o) return;
    *o = (kiln_request_options){.struct_size = sizeof *o,
                                .max_tokens = DEFAULT_MAX_TOKENS,
                                .top_p = 1.0f,
                                .repetition_penalty = 1.0f,
                                .logprobs = -1,
                                .prompt_logprobs = -1};
}

kiln_status kiln_request_options_init_from_engine(const kiln_t *k, kiln_request_options *o) {
    if (!o) return KILN_ERR_INVALID_ARG;
    kiln_request_options_init(o);
    if (!k || !k->m) return KILN_ERR_INVALID_ARG;
    o->temperature = k->m->gen_temperature;
    o->top_k = k->m->gen_top_k;
    o->top_p = k->m->gen_top_p;
    return KILN_OK;
}

kiln_status kiln_submit(kiln_ctx_t *c, const int32_t *prompt, int32_t n_prompt, const kiln_request_options *opts,
                        int64_t *id) {
    kiln_status st = usable(c, "kiln_submit");
    if (id) *id = 0;
    if (st != KILN_OK) return st;
    kiln_error e = {0};
    if (!id) {
        kiln_err(&e, KILN_ERR_INVALID_ARG, "kiln_submit: id is NULL");
        return fail_ctx(c, &e);
    }
    if (n_prompt > 0 && !prompt) {
        kiln_err(&e, KILN_ERR_INVALID_ARG, "kiln_submit: prompt is NULL with n_prompt %d", n_prompt);
        return fail_ctx(c, &e);
    }
    kiln_request_options o;
    kiln_request_options_init(&o);
    if (opts) {
        if (opts->struct_size < offsetof(kiln_request_options, max_tokens) + sizeof opts->max_tokens) {
            kiln_err(&e, KILN_ERR_INVALID_ARG, "kiln_submit: options.struct_size is %u", opts->struct_size);
            kiln_err_hint(&e, "initialise the options with kiln_request_options_init()");
            return fail_ctx(c, &e);
        }
        memcpy(&o, opts, opts->struct_size < sizeof o ? opts->struct_size : sizeof o);
    }
    if (o.repetition_penalty == 0) { /* the scheduler reads 0 as "off"; in this API 1 is */
        kiln_err(&e, KILN_ERR_INVALID_ARG, "submit: repetition penalty 0 must be in (0, 10] (1 = off)");
        return fail_ctx(c, &e);
    }
    kiln_sched_request r = {.prompt = prompt,
                            .n_prompt = n_prompt,
                            .samp = {.temperature = o.temperature,
                                     .top_k = o.top_k,
                                     .top_p = o.top_p,
                                     .seed = o.seed,
                                     .min_p = o.min_p},
                            .pen = {.presence = o.presence_penalty,
                                    .frequency = o.frequency_penalty,
                                    .repetition = o.repetition_penalty},
                            .logprobs = o.logprobs != -1,
                            .top_logprobs = o.logprobs,
                            .prompt_logprobs = o.prompt_logprobs != -1,
                            .prompt_top_logprobs = o.prompt_logprobs,
                            .max_tokens = o.max_tokens,
                            .ignore_eos = o.ignore_eos != 0,
                            .cb = o.on_token,
                            .cb_info = o.on_token_info,
                            .user = o.user};
    if ((st = kiln_sched_submit(c->s, &r, id, &e)) != KILN_OK) return fail_ctx(c, &e);
    return KILN_OK;
}

kiln_status kiln_run_step(kiln_ctx_t *c) {
    kiln_status st = usable(c, "kiln_run_step");
    if (st != KILN_OK) return st;
    kiln_error e = {0};
    if ((st = kiln_sched_step(c->s, NULL, &e)) != KILN_OK) return fail_ctx(c, &e);
    return KILN_OK;
}

kiln_status kiln_run(kiln_ctx_t *c) {
    kiln_status st = usable(c, "kiln_run");
    if (st != KILN_OK) return st;
    kiln_error e = {0};
    while (kiln_sched_pending(c->s) > 0) {
        bool ran = false;
        if ((st = kiln_sched_step(c->s, &ran, &e)) != KILN_OK) return fail_ctx(c, &e);
        if (!ran && kiln_sched_pending(c->s) > 0) {
            kiln_err(&e, KILN_ERR_INTERNAL, "kiln_run: %d requests pending but the scheduler made no step",
                     kiln_sched_pending(c->s));
            return fail_ctx(c, &e);
        }
    }
    return KILN_OK;
}

int32_t kiln_pending(kiln_ctx_t *c) { return c && c->s ? kiln_sched_pending(c->s) : 0; }

kiln_status kiln_score(kiln_ctx_t *c, const int32_t *const *seqs, const int32_t *lens, int32_t n_seqs,
                       float *const *logprobs) {
    kiln_status st0 = usable(c, "kiln_score");
    if (st0 != KILN_OK) return st0;
    kiln_error e = {0};
    if (!seqs || !lens || !logprobs || n_seqs < 1) {
        kiln_err(&e, KILN_ERR_INVALID_ARG, "kiln_score: %s", n_seqs < 1 ? "n_seqs must be at least 1"
                                                                        : "seqs, lens and logprobs must not be NULL");
        return fail_ctx(c, &e);
    }
    const int ctx_len = kiln_sched_max_context(c->s), vocab = c->x->vocab;
    for (int32_t s = 0; s < n_seqs; s++) {
        if (!seqs[s] || !logprobs[s]) {
            kiln_err(&e, KILN_ERR_INVALID_ARG, "kiln_score: sequence %d: NULL ids or logprobs", s);
            return fail_ctx(c, &e);
        }
        if (lens[s] < 2 || lens[s] > ctx_len) {
            kiln_err(&e, KILN_ERR_INVALID_ARG, "kiln_score: sequence %d has %d ids; 2 .. %d (the context) can be "
                                               "scored", s, lens[s], ctx_len);
            return fail_ctx(c, &e);
        }
        for (int32_t i = 0; i < lens[s]; i++)
            if (seqs[s][i] < 0 || seqs[s][i] >= vocab) {
                kiln_err(&e, KILN_ERR_INVALID_ARG, "kiln_score: sequence %d, position %d: id %d is outside the "
                                                   "vocabulary (0..%d)", s, i, seqs[s][i], vocab - 1);
                return fail_ctx(c, &e);
            }
    }
    if (kiln_sched_exclusive_begin(c->s, &e) != KILN_OK) {
        kiln_err_prefix(&e, "kiln_score: ");
        return fail_ctx(c, &e);
    }
    kiln_status st = kiln_score_seqs(c->x, kiln_sched_max_seqs(c->s), kiln_sched_max_step_tokens(c->s), seqs, lens,
                                     n_seqs, logprobs, &e);
    kiln_sched_exclusive_end(c->s);
    return st == KILN_OK ? KILN_OK : fail_ctx(c, &e);
}

kiln_status kiln_poll(kiln_ctx_t *c, int64_t id, int32_t *buf, int32_t cap, int32_t *n, int32_t *finished,
                      int32_t *stop_reason) {
    if (n) *n = 0;
    if (finished) *finished = 0;
    if (stop_reason) *stop_reason = -1;
    kiln_status st = usable(c, "kiln_poll");
    if (st != KILN_OK) return st;
    kiln_error e = {0};
    int got = 0, why = -1;
    bool fin = false;
    if (!n || !finished) {
        kiln_err(&e, KILN_ERR_INVALID_ARG, "kiln_poll: n and finished must not be NULL");
        return fail_ctx(c, &e);
    }
    if ((st = kiln_sched_poll(c->s, id, buf, cap, &got, &fin, &why, &e)) != KILN_OK) return fail_ctx(c, &e);
    *n = got;
    *finished = fin ? 1 : 0;
    if (stop_reason) *stop_reason = why;
    return KILN_OK;
}

kiln_status kiln_cancel(kiln_ctx_t *c, int64_t id) {
    kiln_status st = usable(c, "kiln_cancel");
    if (st != KILN_OK) return st;
    kiln_error e = {0};
    if ((st = kiln_sched_cancel(c->s, id, &e)) != KILN_OK) return fail_ctx(c, &e);
    return KILN_OK;
}

/* ---- tokenizer ---- */

static kiln_status tokenizer_of(kiln_ctx_t *c, const char *fn, const kiln_tokenizer **tok) {
    kiln_status st = usable(c, fn);
    if (st != KILN_OK) return st;
    *tok = c->k->m->tokenizer;
    if (*tok) return KILN_OK;
    kiln_error e = {0};
    kiln_err(&e, KILN_ERR_MISSING, "%s: this engine has no tokenizer", fn);
    kiln_err_hint(&e, "compile from a checkpoint directory that has tokenizer.json, or pass token ids");
    return fail_ctx(c, &e);
}

kiln_status kiln_tokenize(kiln_ctx_t *c, const char *text, size_t len, int32_t add_special, int32_t *ids,
                          int32_t cap, int32_t *n) {
    if (n) *n = 0;
    const kiln_tokenizer *tok = NULL;
    kiln_status st = tokenizer_of(c, "kiln_tokenize", &tok);
    if (st != KILN_OK) return st;
    kiln_error e = {0};
    if (!n || (!text && len > 0) || cap < 0 || (cap > 0 && !ids)) {
        kiln_err(&e, KILN_ERR_INVALID_ARG, "kiln_tokenize: NULL text, ids or n, or a negative cap");
        return fail_ctx(c, &e);
    }
    int32_t *v = NULL;
    size_t got = 0;
    st = kiln_tokenizer_encode(tok, text ? text : "", len, add_special ? KILN_TOK_ADD_SPECIAL : 0, &v, &got, &e);
    if (st != KILN_OK) return fail_ctx(c, &e);
    if (got > INT32_MAX) {
        free(v);
        kiln_err(&e, KILN_ERR_INVALID_ARG, "kiln_tokenize: the text makes %zu ids, more than an int32_t counts", got);
        return fail_ctx(c, &e);
    }
    *n = (int32_t)got;
    if (got > (size_t)cap) {
        free(v);
        kiln_err(&e, KILN_ERR_INVALID_ARG, "kiln_tokenize: the text makes %zu ids but the buffer holds %d", got, cap);
        kiln_err_hint(&e, "call again with a buffer of *n ids");
        return fail_ctx(c, &e);
    }
    if (got) memcpy(ids, v, got * sizeof *ids);
    free(v);
    return KILN_OK;
}

kiln_status kiln_detokenize(kiln_ctx_t *c, const int32_t *ids, int32_t n, int32_t skip_special, char *text,
                            size_t cap, size_t *len) {
    if (len) *len = 0;
    if (text && cap > 0) text[0] = 0;
    const kiln_tokenizer *tok = NULL;
    kiln_status st = tokenizer_of(c, "kiln_detokenize", &tok);
    if (st != KILN_OK) return st;
    kiln_error e = {0};
    if (!len || n < 0 || (n > 0 && !ids) || (cap > 0 && !text)) {
        kiln_err(&e, KILN_ERR_INVALID_ARG, "kiln_detokenize: NULL ids, text or len, or a negative count");
        return fail_ctx(c, &e);
    }
    char *s = NULL;
    size_t got = 0;
    if ((st = kiln_tokenizer_decode(tok, ids, (size_t)n, skip_special != 0, &s, &got, &e)) != KILN_OK)
        return fail_ctx(c, &e);
    *len = got;
    if (got + 1 > cap) {
        free(s);
        kiln_err(&e, KILN_ERR_INVALID_ARG, "kiln_detokenize: the text has %zu bytes but the buffer holds %zu with "
                                           "its NUL",
                 got, cap);
        kiln_err_hint(&e, "call again with a buffer of *len + 1 bytes");
        return fail_ctx(c, &e);
    }
    memcpy(text, s, got + 1);
    free(s);
    return KILN_OK;
}

int kiln_ctx_profile_rows(kiln_ctx_t *c, kiln_profile_row *rows, int cap) {
    if (!c || !c->x || !c->x->ops->profile) return 0;
    return c->x->ops->profile(c->x, rows, cap);
}
