/*
 * gpu_logits.c — the CUDA executor's logits, written out for comparison with
 * HuggingFace (bench/check_logits.py, bench/perplexity.py). Built as
 * kiln_gpu_logits where CUDA is. Internal API: engine, CUDA executor, steps.
 *
 *   kiln_gpu_logits ENGINE logits --ids IDS.i32 --lengths 1,17,512 --out DIR
 *                                 [--decode 4] [--chunk 2048]
 *       For each length L: a fresh sequence reads ids[0..L) in prefill steps
 *       of at most --chunk tokens; the logits of the last step (position L-1)
 *       are row 0. Then ids[L..L+decode) are teacher-forced one token per
 *       step (the decode path, CUDA graphs); the step reading ids[L+k-1] gives
 *       row k (position L+k-1). Writes DIR/kiln_L<L>.f32: [decode+1, vocab]
 *       little-endian f32, row-major. A full forward over ids[0..L+decode)
 *       gives the same rows at its last decode+1 positions.
 *
 *   kiln_gpu_logits ENGINE ppl --ids TEXT.i32 --out NLL.f32 [--window 2048]
 *                             [--bos ID] [--batch 32]
 *       TEXT.i32 holds the text's token ids without BOS. The text is cut into
 *       consecutive pieces of window-1 tokens (the last may be shorter); each
 *       piece is read as its own sequence [BOS, x1 .. xn] (at most --window
 *       tokens), so every text token is scored exactly once:
 *           nll(x_i) = -log softmax(logits after [BOS, x1 .. x_{i-1}])[x_i]
 *       Every position is read in its own one-token step (decode path); up to
 *       --batch pieces run side by side as one batch. Writes the per-token
 *       NLL in text order as f32 and prints {tokens, windows, nll_mean, ppl}
 *       (ppl = exp(mean nll)). bench/perplexity.py scores the same pieces.
 *
 * --cpu runs the same steps on the fp32 CPU executor (runtime/cpu_backend.c),
 * so the tool and the scripts can be checked on a machine without a GPU.
 *
 * IDS files: raw little-endian int32 token ids; every id must be inside the
 * model's vocabulary. Output is one JSON line per result on stdout; errors go
 * to stderr with the executor's message, and the exit status is 1.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/kiln_pool.h"
#include "runtime/cuda/kiln_cuda_exec.h"
#include "runtime/kiln_rt.h"

#define GL_MAX_LENGTHS 32
#define GL_MAX_IDS (64 * 1024 * 1024) /* ids in one file, a sanity cap */

typedef struct gl_opts {
    const char *engine, *mode, *ids_path, *out;
    int lengths[GL_MAX_LENGTHS], n_lengths;
    int decode, chunk, window, bos, batch;
    bool cpu; /* the fp32 CPU executor instead (to test this tool without a GPU) */
    int gpus[64], n_gpus; /* --gpus 0,1: a tensor-parallel engine's GPU per rank */
} gl_opts;

/* Read IDS (raw int32) into *ids / *n, checking each id against vocab. */
static kiln_status read_ids(const char *path, int vocab, int32_t **ids, int *n, kiln_error *err) {
    kiln_mapped_file f = {0};
    kiln_status st = kiln_file_map(path, &f, err);
    if (st) return st;
    if (f.size % 4 || f.size == 0 || f.size / 4 > GL_MAX_IDS) {
        st = kiln_err(err, KILN_ERR_INVALID_ARG, "%s: %zu bytes is not 1..%d int32 token ids", path, f.size, GL_MAX_IDS);
        goto out;
    }
    *n = (int)(f.size / 4);
    *ids = malloc(f.size);
    if (!*ids) {
        st = kiln_err(err, KILN_ERR_NOMEM, "%s: no memory for %d ids", path, *n);
        goto out;
    }
    for (int i = 0; i < *n; i++) {
        int32_t v = (int32_t)kiln_rd_u32(f.data + 4 * (size_t)i);
        if (v < 0 || v >= vocab) {
            st = kiln_err(err, KILN_ERR_INVALID_ARG, "%s: id %d at index %d is outside the vocabulary (0..%d)", path, v,
                          i, vocab - 1);
            free(*ids);
            *ids = NULL;
            goto out;
        }
        (*ids)[i] = v;
    }
out:
    kiln_file_unmap(&f);
    return st;
}

static kiln_status write_f32(const char *path, const float *v, size_t n, kiln_error *err) {
    FILE *fp = fopen(path, "wb");
    if (!fp) return kiln_err(err, KILN_ERR_IO, "%s: %s", path, strerror(errno));
    size_t w = fwrite(v, sizeof *v, n, fp);
    if (fclose(fp) != 0 || w != n) return kiln_err(err, KILN_ERR_IO, "%s: short write (%zu of %zu floats)", path, w, n);
    return KILN_OK;
}

/* One sequence in slot 0: prefill ids[0..L) in chunks, then `decode`
 * one-token steps; rows [decode+1, vocab] into `rows`. */
static kiln_status logits_one(kiln_executor *x, const int32_t *ids, int L, int decode, int chunk, float *rows,
                              int *chunks, kiln_error *err) {
    const int V = x->vocab;
    bool fits = false;
    kiln_status st = x->ops->reserve(x, 0, L + decode, &fits, err);
    if (st) return kiln_err_prefix(err, "length %d: ", L);
    if (!fits) return kiln_err(err, KILN_ERR_NOMEM, "length %d: the KV pool cannot hold %d tokens", L, L + decode);
    int32_t slot = 0, n_new, start, next;
    bool want;
    kiln_sampling samp = {.temperature = 0.0f, .top_k = 0, .top_p = 1.0f, .seed = 1};
    *chunks = 0;
    for (int pos = 0; pos < L; pos += n_new) {
        n_new = L - pos < chunk ? L - pos : chunk;
        start = pos;
        want = pos + n_new == L;
        kiln_step s = {1, &slot, &n_new, &start, ids + pos, &want, &samp, &next, want ? rows : NULL, NULL, NULL};
        if ((st = x->ops->step(x, &s, err))) goto out;
        (*chunks)++;
    }
    for (int k = 1; k <= decode; k++) {
        n_new = 1, start = L + k - 1, want = true;
        kiln_step s = {1, &slot, &n_new, &start, ids + L + k - 1, &want, &samp, &next, rows + (size_t)k * V, NULL, NULL};
        if ((st = x->ops->step(x, &s, err))) goto out;
    }
out:
    x->ops->release(x, 0);
    if (st) kiln_err_prefix(err, "length %d: ", L);
    return st;
}

static int run_logits(kiln_executor *x, const gl_opts *o, const int32_t *ids, int n_ids) {
    kiln_error err = {0};
    const int V = x->vocab;
    float *rows = malloc((size_t)(o->decode + 1) * (size_t)V * sizeof(float));
    if (!rows) {
        fprintf(stderr, "no memory for %d logit rows\n", o->decode + 1);
        return 1;
    }
    int rc = 0;
    for (int i = 0; i < o->n_lengths && !rc; i++) {
        const int L = o->lengths[i];
        if (L + o->decode > n_ids) {
            fprintf(stderr, "%s: %d ids; length %d with %d decode steps needs %d\n", o->ids_path, n_ids, L, o->decode,
                    L + o->decode);
            rc = 1;
            break;
        }
        int chunks = 0;
        double t0 = kiln_now();
        if (logits_one(x, ids, L, o->decode, o->chunk, rows, &chunks, &err)) {
            fprintf(stderr, "logits: %s\n", err.msg);
            rc = 1;
            break;
        }
        double t1 = kiln_now();
        char name[64];
        snprintf(name, sizeof name, "kiln_L%d.f32", L);
        char *path = kiln_path_join(o->out, name);
        if (!path || write_f32(path, rows, (size_t)(o->decode + 1) * (size_t)V, &err)) {
            fprintf(stderr, "%s\n", path ? err.msg : "no memory");
            rc = 1;
        } else {
            int finite = 1;
            for (size_t j = 0; j < (size_t)(o->decode + 1) * (size_t)V; j++) finite &= isfinite(rows[j]) != 0;
            printf("{\"length\": %d, \"decode\": %d, \"chunks\": %d, \"chunk\": %d, \"rows\": %d, \"vocab\": %d, "
                   "\"finite\": %s, \"seconds\": %.4f, \"file\": \"%s\"}\n",
                   L, o->decode, chunks, o->chunk, o->decode + 1, V, finite ? "true" : "false", t1 - t0, path);
            fflush(stdout);
        }
        free(path);
    }
    free(rows);
    return rc;
}

/* log softmax(row)[target], in double. */
static double log_prob(const float *row, int V, int target) {
    float mx = row[0];
    for (int j = 1; j < V; j++) mx = row[j] > mx ? row[j] : mx;
    double s = 0.0;
    for (int j = 0; j < V; j++) s += exp((double)row[j] - (double)mx);
    return (double)row[target] - (double)mx - log(s);
}

/* Score rows [lo, hi) of a step as one task of the process-wide pool:
 * 32000-wide log-softmax rows cost ~0.1 ms each, so a batch of 32 is split
 * over threads. */
typedef struct ppl_job {
    const float *logits;  /* [k, V] */
    const int32_t *win;   /* [k] piece of each row */
    const int32_t *text;
    float *nll;           /* [N] out */
    double sum;           /* out: the rows' NLL sum */
    int V, piece, t, lo, hi;
} ppl_job;

/* Pool task `part` of the array of jobs `arg`. */
static void ppl_rows(void *arg, int part) {
    ppl_job *j = (ppl_job *)arg + part;
    j->sum = 0.0;
    for (int r = j->lo; r < j->hi; r++) {
        const int idx = j->win[r] * j->piece + j->t; /* the target x_{t+1} */
        double lp = log_prob(j->logits + (size_t)r * j->V, j->V, j->text[idx]);
        j->nll[idx] = (float)-lp;
        j->sum += -lp;
    }
}

#define GL_THREADS 8

static int run_ppl(kiln_executor *x, const gl_opts *o, const int32_t *text, int n) {
    kiln_error err = {0};
    const int V = x->vocab, piece = o->window - 1, B = o->batch;
    const int n_win = (n + piece - 1) / piece;
    float *nll = malloc((size_t)n * sizeof(float));
    float *logits = malloc((size_t)B * (size_t)V * sizeof(float));
    int32_t *slot = malloc((size_t)B * 4), *n_new = malloc((size_t)B * 4), *start = malloc((size_t)B * 4);
    int32_t *tok = malloc((size_t)B * 4), *next = malloc((size_t)B * 4), *win = malloc((size_t)B * 4);
    bool *want = malloc((size_t)B);
    kiln_sampling *samp = calloc((size_t)B, sizeof *samp);
    int rc = 1;
    if (!nll || !logits || !slot || !n_new || !start || !tok || !next || !win || !want || !samp) {
        fprintf(stderr, "no memory for the perplexity buffers\n");
        goto out;
    }
    double t0 = kiln_now(), sum = 0.0;
    int64_t steps = 0;
    for (int g0 = 0; g0 < n_win; g0 += B) {
        const int G = n_win - g0 < B ? n_win - g0 : B;
        for (int i = 0; i < G; i++) {
            const int w = g0 + i, len = (w + 1) * piece <= n ? piece : n - w * piece; /* text tokens in piece w */
            bool fits = false;
            if (x->ops->reserve(x, i, len, &fits, &err) || !fits) {
                fprintf(stderr, "ppl: window %d of %d tokens: %s\n", w, len + 1, fits ? err.msg : "no KV room");
                goto out;
            }
        }
        /* position t of every piece: read token t ([BOS, x1 ..][t]), score x_{t+1} */
        for (int t = 0;; t++) {
            int k = 0;
            for (int i = 0; i < G; i++) {
                const int w = g0 + i, base = w * piece, len = (w + 1) * piece <= n ? piece : n - base;
                if (t >= len) continue; /* this piece's last target was scored */
                slot[k] = i, n_new[k] = 1, start[k] = t, want[k] = true, win[k] = w;
                tok[k] = t == 0 ? o->bos : text[base + t - 1];
                samp[k] = (kiln_sampling){.temperature = 0.0f, .top_k = 0, .top_p = 1.0f, .seed = 1};
                k++;
            }
            if (!k) break;
            kiln_step s = {k, slot, n_new, start, tok, want, samp, next, logits, NULL, NULL};
            if (x->ops->step(x, &s, &err)) {
                fprintf(stderr, "ppl: step at position %d of windows %d..%d: %s\n", t, g0, g0 + G - 1, err.msg);
                goto out;
            }
            steps++;
            ppl_job jobs[GL_THREADS];
            const int nt = k < GL_THREADS ? k : GL_THREADS;
            for (int j = 0; j < nt; j++)
                jobs[j] = (ppl_job){logits, win, text, nll, 0.0, V, piece, t, k * j / nt, k * (j + 1) / nt};
            kiln_pool_for(kiln_pool_shared(), nt, nt, ppl_rows, jobs);
            for (int j = 0; j < nt; j++) sum += jobs[j].sum; /* in order: the sum does not depend on timing */
        }
        for (int i = 0; i < G; i++) x->ops->release(x, i);
    }
    double t1 = kiln_now();
    if (write_f32(o->out, nll, (size_t)n, &err)) {
        fprintf(stderr, "%s\n", err.msg);
        goto out;
    }
    for (int i = 0; i < n; i++)
        if (!isfinite(nll[i])) {
            fprintf(stderr, "ppl: token %d has a non-finite NLL (%g)\n", i, (double)nll[i]);
            goto out;
        }
    printf("{\"mode\": \"ppl\", \"tokens\": %d, \"windows\": %d, \"window\": %d, \"bos\": %d, \"batch\": %d, "
           "\"steps\": %lld, \"nll_mean\": %.8f, \"ppl\": %.6f, \"seconds\": %.3f, \"file\": \"%s\"}\n",
           n, n_win, o->window, o->bos, B, (long long)steps, sum / n, exp(sum / n), t1 - t0, o->out);
    rc = 0;
out:
    free(nll), free(logits), free(slot), free(n_new), free(start), free(tok), free(next), free(win), free(want);
    free(samp);
    return rc;
}

static int usage(const char *argv0) {
    fprintf(stderr,
            "usage: %s ENGINE logits --ids IDS.i32 --lengths 1,17,512 --out DIR [--decode 4] [--chunk 2048] [--cpu]\n"
            "       %s ENGINE ppl --ids TEXT.i32 --out NLL.f32 [--window 2048] [--bos ID] [--batch 32] [--cpu]\n"
            "  either with [--gpus 0,1]: the GPU of each rank of a tensor-parallel engine\n",
            argv0, argv0);
    return 2;
}

static bool parse_int(const char *s, int lo, int hi, int *out) {
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi) return false;
    *out = (int)v;
    return true;
}

int main(int argc, char **argv) {
    if (argc < 3) return usage(argv[0]);
    gl_opts o = {.engine = argv[1], .mode = argv[2], .decode = 4, .chunk = 2048, .window = 0, .bos = -1, .batch = 32};
    for (int i = 3; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        bool ok = v != NULL;
        if (!strcmp(a, "--cpu")) {
            o.cpu = true;
            continue;
        }
        if (!strcmp(a, "--ids") && v) o.ids_path = v;
        else if (!strcmp(a, "--out") && v) o.out = v;
        else if (!strcmp(a, "--decode") && v) ok = parse_int(v, 0, 4096, &o.decode);
        else if (!strcmp(a, "--chunk") && v) ok = parse_int(v, 1, 1 << 20, &o.chunk);
        else if (!strcmp(a, "--window") && v) ok = parse_int(v, 2, 1 << 20, &o.window);
        else if (!strcmp(a, "--bos") && v) ok = parse_int(v, 0, 1 << 30, &o.bos);
        else if (!strcmp(a, "--batch") && v) ok = parse_int(v, 1, 1024, &o.batch);
        else if (!strcmp(a, "--gpus") && v) {
            o.n_gpus = 0;
            for (char *p = argv[i + 1]; *p && ok;) {
                char *end;
                long d = strtol(p, &end, 10);
                if (end == p || d < 0 || d > 1023 || o.n_gpus == 64) ok = false;
                else o.gpus[o.n_gpus++] = (int)d;
                p = *end == ',' ? end + 1 : end;
                if (*end && *end != ',') ok = false;
            }
        } else if (!strcmp(a, "--lengths") && v) {
            o.n_lengths = 0;
            for (char *p = argv[i + 1]; *p && ok;) {
                char *end;
                long L = strtol(p, &end, 10);
                if (end == p || L < 1 || L > (1 << 24) || o.n_lengths == GL_MAX_LENGTHS) ok = false;
                else o.lengths[o.n_lengths++] = (int)L;
                p = *end == ',' ? end + 1 : end;
                if (*p && *end != ',') ok = false;
            }
        } else ok = false;
        if (!ok) {
            fprintf(stderr, "bad option %s%s%s\n", a, v ? " " : "", v ? v : "");
            return usage(argv[0]);
        }
        i++;
    }
    const bool ppl = !strcmp(o.mode, "ppl");
    if ((!ppl && strcmp(o.mode, "logits")) || !o.ids_path || !o.out || (!ppl && !o.n_lengths)) return usage(argv[0]);

    kiln_error err = {0};
    kiln_model *m = NULL;
    kiln_executor *x = NULL;
    int32_t *ids = NULL;
    int n_ids = 0, rc = 1;
    if (kiln_model_open_ex(o.engine, 16, KILN_MODEL_NO_F32, &m, &err)) {
        fprintf(stderr, "open: %s\n", err.msg);
        return 1;
    }
    const int ctx_model = m->plan->max_context;
    if (ppl) {
        if (!o.window) o.window = ctx_model;
        if (o.bos < 0) o.bos = m->bos_id;
        if (o.bos < 0) {
            fprintf(stderr, "%s has no BOS id: give --bos\n", o.engine);
            goto out;
        }
        if (o.bos >= m->plan->vocab_size || o.window > ctx_model) {
            fprintf(stderr, "--bos %d / --window %d: the model has %d ids and a context of %d\n", o.bos, o.window,
                    m->plan->vocab_size, ctx_model);
            goto out;
        }
    }
    if (read_ids(o.ids_path, m->plan->vocab_size, &ids, &n_ids, &err)) {
        fprintf(stderr, "%s\n", err.msg);
        goto out;
    }
    int ctx = 0, seqs = 1, step_tokens = 0;
    if (ppl) {
        ctx = o.window, seqs = o.batch, step_tokens = o.batch;
    } else {
        for (int i = 0; i < o.n_lengths; i++)
            if (o.lengths[i] + o.decode > ctx) ctx = o.lengths[i] + o.decode;
        step_tokens = o.chunk;
    }
    if (ctx > ctx_model) {
        fprintf(stderr, "%d tokens per sequence asked for; %s holds %d\n", ctx, o.engine, ctx_model);
        goto out;
    }
    /* the KV pool is capped at what seqs x ctx needs; 0.5 leaves room for a
     * reference running on the same GPU */
    kiln_cuda_exec_opts eo = {.max_seqs = seqs, .max_context = ctx, .max_step_tokens = step_tokens, .kv_fraction = 0.5,
                              .devices = o.n_gpus ? o.gpus : NULL, .n_devices = o.n_gpus};
    if (o.cpu ? (kiln_model_load_f32(m, &err) || kiln_cpu_executor_new(m, seqs, ctx, 0, 0, &x, &err))
              : kiln_cuda_executor_new(m, &eo, &x, &err)) {
        fprintf(stderr, "executor: %s\n", err.msg);
        goto out;
    }
    kiln_cuda_exec_stats cs = {0};
    kiln_cuda_exec_get_stats(x, &cs);
    kiln_executor_info info = {0};
    if (x->ops->info) x->ops->info(x, &info);
    printf("{\"engine\": \"%s\", \"gpu\": \"%s\", \"f32\": %s, \"sm\": %d, \"pdl\": %s, \"vocab\": %d, \"max_context\": %d, "
           "\"max_seqs\": %d}\n",
           o.engine, info.device_name, cs.f32 ? "true" : "false", cs.sm, cs.pdl ? "true" : "false", x->vocab, ctx, seqs);
    fflush(stdout);
    rc = ppl ? run_ppl(x, &o, ids, n_ids) : run_logits(x, &o, ids, n_ids);
out:
    if (x) x->ops->destroy(x);
    kiln_model_close(m);
    free(ids);
    return rc;
}
