/*
 * quant_awq.c — `kiln compile --quant int4 --awq`: activation-aware scales
 * (the idea of AWQ, Lin et al. 2023), searched on calibration tokens and
 * folded into the weights before they are rounded.
 *
 * A projection's output is W x. For any positive s (one per input channel),
 * W x = (W diag(s)) (x / s), so multiplying W's columns by s and dividing
 * whatever makes x by s leaves the model's function unchanged, while the
 * columns of W that meet large activations (the salient ones) get larger
 * and lose less to rounding. Where x comes from decides whether dividing it
 * is free:
 *
 *   x = rmsnorm(h) * g          → g / s            (q/k/v; gate/up)
 *   x = silu(gate) * (W_up h)   → W_up's rows / s  (down)
 *   x = attention(q, k, v)      → W_v's rows (and v's bias) / s, with s
 *                                 equal over the query heads that share a
 *                                 KV head (o; GQA)
 *
 * Other inputs (a mixture of experts, anything new) are left unscaled and
 * named in the report. The scales become kiln_value.row_mul / col_mul on
 * the imported graph (by checkpoint name): the writer multiplies the
 * checkpoint's values by them as it reads them, before --quant rounds, so
 * the engine's format, kernels and executors do not change at all.
 *
 * The search, per group of projections that share an input:
 *
 *   calibration → the plan with no fusions on the CPU executor, tracing each
 *   projection input: mean |x_c| over every calibration token, and up to
 *   AWQ_ROWS rows sampled evenly
 *   for alpha in 0, 0.05, …, 1:  s_c = max(mean|x_c|, 1e-4)^alpha / sqrt(max s · min s)
 *     error(alpha) = Σ over the group's matrices and sampled rows of
 *                    ‖W x − Q(W diag(s)) (x / s)‖²   (Q: --quant's format and --quant-method)
 *     or, for gate/up feeding down(silu(gate) * up) (find_mlp), on the MLP's output with down
 *     unrounded, as AutoAWQ measures them (mlp_job)
 *   the alpha of least error (alpha 0 — no scaling — in a tie)
 *
 * so on the sampled rows a group's output error is never above plain
 * rounding's. Statistics come from the unquantized model, group by group
 * (as AutoAWQ does it, not layer by layer through the quantized model).
 * Sums are over fixed parts in a fixed order: the engine does not depend on
 * the thread count.
 */
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../common/kiln_pool.h"
#include "../common/kiln_progress.h"
#include "../runtime/kiln_rt.h"
#include "kiln_compiler.h"

enum {
    AWQ_ROWS = 128,  /* sampled input rows per group */
    AWQ_GRID = 21,   /* alpha = 0, 0.05, ..., 1 */
    AWQ_PARTS = 64,  /* fixed row partition of a matrix: sums do not depend on threads */
    AWQ_MAX_MATS = 8 /* projections sharing one input (q, k, v; gate, up) */
};

typedef enum { FOLD_NONE, FOLD_NORM, FOLD_UP, FOLD_V } awq_fold;

/* One activation that projections read: its statistics, sampled rows and what makes it. */
typedef struct awq_group {
    int32_t value;        /* plan value */
    uint32_t first_op;    /* the first projection reading it (traced once per step) */
    int64_t width;        /* K */
    double *abs_sum;      /* [width] Σ |x_c| over the calibration tokens */
    int64_t tokens;
    float *rows;          /* [AWQ_ROWS, width] */
    int n_rows;
    int mats[AWQ_MAX_MATS]; /* plan weights of the projections reading it */
    int n_mats;
    awq_fold fold;
    int fold_w, bias_w;   /* the weight the inverse scale goes into (FOLD_*), v's bias (FOLD_V, or -1) */
    int heads, kv_heads, head_dim; /* FOLD_V */
    int mlp_gate, mlp_up, mlp_down; /* gate/up feeding down(silu(gate) * up): measured on the MLP's output
                                       (plan weights), else -1 */
    const char *skip;     /* why it is left unscaled (NULL: searched) */
    double err0, err;     /* error with no scaling, with the chosen alpha */
    int alpha;            /* chosen grid index */
    float *s;             /* [width] the chosen scales (NULL: none) */
} awq_group;

typedef struct awq_ctx {
    const kiln_model *m;
    const kiln_plan *p;
    awq_group *g;
    int n_g;
    int *group_of; /* [n_values]: group index or -1 */
    int64_t tok_base, stride;
} awq_ctx;

/* ---- calibration trace ---- */

static void trace(void *user, uint32_t op, const float *x, int n, int64_t width, int pos0) {
    (void)pos0;
    awq_ctx *a = user;
    const kiln_plan_op *o = &a->p->ops[op];
    if (o->kind != KILN_OP_LINEAR) return;
    const int gi = a->group_of[o->in[0]];
    if (gi < 0 || a->g[gi].first_op != op) return;
    awq_group *g = &a->g[gi];
    for (int t = 0; t < n; t++) {
        const float *r = x + (int64_t)t * width;
        for (int64_t c = 0; c < width; c++) g->abs_sum[c] += fabsf(r[c]);
        if ((a->tok_base + t) % a->stride == 0 && g->n_rows < AWQ_ROWS)
            memcpy(g->rows + (int64_t)g->n_rows++ * width, r, (size_t)width * sizeof *r);
    }
    g->tokens += n;
}

/* ---- where each input comes from ---- */

static int producer(const kiln_plan *p, int32_t v) {
    for (uint32_t i = 0; i < p->n_ops; i++)
        for (uint32_t j = 0; j < p->ops[i].n_out; j++)
            if (p->ops[i].out[j] == v) return (int)i;
    return -1;
}

/* How many op inputs read value v. */
static int uses(const kiln_plan *p, int32_t v) {
    int n = 0;
    for (uint32_t i = 0; i < p->n_ops; i++)
        for (uint32_t j = 0; j < p->ops[i].n_in; j++) n += p->ops[i].in[j] == v;
    return n;
}

static int weight_of(const kiln_plan *p, int32_t v) {
    return p->values[v].kind == KILN_PV_WEIGHT ? p->values[v].weight : -1;
}

/* Value v as the output of a projection read by nothing else: the projection's op, else -1. */
static int sole_linear(const kiln_plan *p, int32_t v) {
    const int o = producer(p, v);
    return o >= 0 && p->ops[o].kind == KILN_OP_LINEAR && uses(p, v) == 1 ? o : -1;
}

/* Decide where group g's inverse scale can go (kiln_awq_scale comment at the top). */
static void find_fold(const kiln_plan *p, awq_group *g) {
    g->fold_w = g->bias_w = -1;
    const int o = producer(p, g->value);
    const kiln_plan_op *op = o >= 0 ? &p->ops[o] : NULL;
    g->skip = "its input comes from an op the scales cannot be folded into";
    if (!op) return;
    if (op->kind == KILN_OP_RMSNORM) {
        const int w = weight_of(p, op->in[1]);
        if (w < 0 || uses(p, op->in[1]) != 1) {
            g->skip = "its RMSNorm's weight is shared";
            return;
        }
        g->fold = FOLD_NORM, g->fold_w = w;
    } else if (op->kind == KILN_OP_MUL) {
        /* silu(gate) * up: the operand a projection makes directly is up's output */
        for (int j = 0; j < 2 && g->fold == FOLD_NONE; j++) {
            const int lo = sole_linear(p, op->in[j]);
            const int other = producer(p, op->in[1 - j]);
            if (lo >= 0 && other >= 0 && p->ops[other].kind == KILN_OP_SILU)
                g->fold = FOLD_UP, g->fold_w = weight_of(p, p->ops[lo].in[1]);
        }
        if (g->fold == FOLD_NONE) {
            g->skip = "its product is not silu(gate) * up";
            return;
        }
    } else if (op->kind == KILN_OP_ATTENTION) {
        int32_t v = op->in[2];
        int vo = producer(p, v);
        if (vo >= 0 && p->ops[vo].kind == KILN_OP_BIAS_ADD && uses(p, v) == 1) {
            g->bias_w = weight_of(p, p->ops[vo].in[1]);
            v = p->ops[vo].in[0];
        }
        const int lo = sole_linear(p, v);
        if (lo < 0 || (g->bias_w < 0 && producer(p, op->in[2]) != lo)) {
            g->skip = "its attention's v is not a projection's output alone";
            return;
        }
        g->fold = FOLD_V, g->fold_w = weight_of(p, p->ops[lo].in[1]);
        g->heads = op->attrs.n_heads, g->kv_heads = op->attrs.n_kv_heads, g->head_dim = op->attrs.head_dim;
        if (g->heads <= 0 || g->kv_heads <= 0 || g->heads % g->kv_heads ||
            (int64_t)g->heads * g->head_dim != g->width) {
            g->fold = FOLD_NONE, g->skip = "its attention's head shape does not match the projection";
            return;
        }
    } else {
        return;
    }
    g->skip = g->fold_w < 0 ? "the weight to fold into is not a checkpoint tensor" : NULL;
    if (g->skip) g->fold = FOLD_NONE;
}

/* ---- the search ---- */

typedef struct err_job {
    const float *w;    /* [n, k] */
    const float *y;    /* [rows, n]: W x on the sampled rows */
    const float *xs;   /* [rows, k]: x / s */
    const float *s;    /* [k] */
    int64_t n, k;
    int rows, dtype, method, parts;
    double part_err[AWQ_PARTS];
    int nomem;
} err_job;

static void err_rows(void *arg, int part) {
    err_job *j = arg;
    const int64_t r0 = j->n * part / j->parts, r1 = j->n * (part + 1) / j->parts;
    const int64_t shape[2] = {1, j->k};
    float *ws = malloc((size_t)j->k * sizeof *ws), *wq = malloc((size_t)j->k * sizeof *wq);
    uint8_t *codes = malloc(kiln_weight_nbytes(j->dtype, 2, shape));
    double e = 0;
    if (!ws || !wq || !codes) {
        j->nomem = 1;
    } else {
        for (int64_t r = r0; r < r1; r++) {
            const float *w = j->w + r * j->k;
            for (int64_t c = 0; c < j->k; c++) ws[c] = w[c] * j->s[c];
            kiln_quant_row_ex(j->dtype, 1, j->k, 0, ws, codes, j->method);
            kiln_dequant_rows(j->dtype, codes, 1, j->k, 0, 1, wq);
            for (int t = 0; t < j->rows; t++) {
                const float *x = j->xs + (int64_t)t * j->k;
                double d = 0;
                for (int64_t c = 0; c < j->k; c++) d += (double)wq[c] * x[c];
                d -= j->y[(int64_t)t * j->n + r];
                e += d * d;
            }
        }
    }
    j->part_err[part] = e;
    free(ws), free(wq), free(codes);
}

typedef struct ref_job {
    const float *w, *x;
    float *y;
    int64_t n, k;
    int rows, parts;
} ref_job;

static void ref_rows(void *arg, int part) {
    ref_job *j = arg;
    for (int64_t r = j->n * part / j->parts; r < j->n * (part + 1) / j->parts; r++)
        for (int t = 0; t < j->rows; t++) {
            double d = 0;
            for (int64_t c = 0; c < j->k; c++) d += (double)j->w[r * j->k + c] * j->x[(int64_t)t * j->k + c];
            j->y[(int64_t)t * j->n + r] = (float)d;
        }
}

/* The MLP's output on the sampled rows (find_mlp): phase 1 over gate/up's rows, h = silu(G' xs) * (U' xs)
 * with G' and U' the matrices times s, rounded by --quant (not for the reference); phase 2 over down's
 * rows, y = D h, into y (the reference) or its squared distance from y_ref per part. */
typedef struct mlp_job {
    const float *g, *u, *d; /* [F, H], [F, H], [H, F] */
    const float *xs, *s;    /* [rows, H], [H] */
    float *h, *y;           /* [rows, F], [rows, H] */
    const float *y_ref;     /* NULL: write y */
    int64_t f, hd;
    int rows, dtype, method, quant, parts, phase;
    double part_err[AWQ_PARTS];
    int nomem;
} mlp_job;

static float silu_f(float v) { return v / (1.0f + expf(-v)); }

static void mlp_rows(void *arg, int part) {
    mlp_job *j = arg;
    if (j->phase == 1) {
        const int64_t r0 = j->f * part / j->parts, r1 = j->f * (part + 1) / j->parts, k = j->hd;
        const int64_t shape[2] = {1, k};
        float *wg = malloc((size_t)k * sizeof *wg), *wu = malloc((size_t)k * sizeof *wu);
        float *tmp = malloc((size_t)k * sizeof *tmp);
        uint8_t *codes = j->quant ? malloc(kiln_weight_nbytes(j->dtype, 2, shape)) : NULL;
        if (!wg || !wu || !tmp || (j->quant && !codes)) {
            j->nomem = 1;
        } else {
            for (int64_t r = r0; r < r1; r++) {
                float *w2[2] = {wg, wu};
                const float *src[2] = {j->g + r * k, j->u + r * k};
                for (int m = 0; m < 2; m++) {
                    for (int64_t c = 0; c < k; c++) tmp[c] = src[m][c] * (j->s ? j->s[c] : 1.0f);
                    if (j->quant) {
                        kiln_quant_row_ex(j->dtype, 1, k, 0, tmp, codes, j->method);
                        kiln_dequant_rows(j->dtype, codes, 1, k, 0, 1, w2[m]);
                    } else {
                        memcpy(w2[m], tmp, (size_t)k * sizeof *tmp);
                    }
                }
                for (int t = 0; t < j->rows; t++) {
                    const float *x = j->xs + (int64_t)t * k;
                    double ga = 0, ub = 0;
                    for (int64_t c = 0; c < k; c++) ga += (double)wg[c] * x[c], ub += (double)wu[c] * x[c];
                    j->h[(int64_t)t * j->f + r] = silu_f((float)ga) * (float)ub;
                }
            }
        }
        free(wg), free(wu), free(tmp), free(codes);
        return;
    }
    const int64_t n0 = j->hd * part / j->parts, n1 = j->hd * (part + 1) / j->parts;
    double e = 0;
    for (int64_t n = n0; n < n1; n++)
        for (int t = 0; t < j->rows; t++) {
            double y = 0;
            for (int64_t r = 0; r < j->f; r++) y += (double)j->d[n * j->f + r] * j->h[(int64_t)t * j->f + r];
            if (j->y_ref) e += (y - j->y_ref[(int64_t)t * j->hd + n]) * (y - j->y_ref[(int64_t)t * j->hd + n]);
            else j->y[(int64_t)t * j->hd + n] = (float)y;
        }
    j->part_err[part] = e;
}

/* Run both phases of j; the summed error (phase 2 with y_ref). */
static double mlp_run(mlp_job *j) {
    j->phase = 1;
    j->parts = (int)(j->f < AWQ_PARTS ? j->f : AWQ_PARTS);
    kiln_pool_for(kiln_pool_shared(), j->parts, j->parts, mlp_rows, j);
    j->phase = 2;
    j->parts = (int)(j->hd < AWQ_PARTS ? j->hd : AWQ_PARTS);
    kiln_pool_for(kiln_pool_shared(), j->parts, j->parts, mlp_rows, j);
    double e = 0;
    for (int p = 0; p < j->parts; p++) e += j->part_err[p];
    return e;
}

/* The format --quant gives an [n, k] projection: q8 when the q4 group does not divide k (the pass's rule). */
static int format_for(int quant, int64_t n, int64_t k) {
    const int64_t shape[2] = {n, k};
    return kiln_weight_nbytes(quant, 2, shape) ? quant : KILN_DTYPE_Q8;
}

/* Scales for grid point a: per channel statistic^alpha, normalised by sqrt(max · min). */
static void scales_for(const double *stat, int64_t k, int a, float *s) {
    const double alpha = (double)a / (AWQ_GRID - 1);
    double lo = INFINITY, hi = 0;
    for (int64_t c = 0; c < k; c++) {
        const double v = pow(stat[c] > 1e-4 ? stat[c] : 1e-4, alpha);
        s[c] = (float)v;
        lo = v < lo ? v : lo, hi = v > hi ? v : hi;
    }
    const double norm = sqrt(hi * lo);
    for (int64_t c = 0; c < k; c++) s[c] = (float)(s[c] / norm);
}

/* The error of the group's projections, each on its own output, with scales s (x / s in xs): summed
 * over the matrices in order; -1 when out of memory. */
static double mats_error(const awq_ctx *a, const awq_group *g, float *const *y, const float *s, const float *xs,
                         int quant, int method, err_job *j) {
    double e = 0;
    for (int i = 0; i < g->n_mats; i++) {
        const kiln_plan_weight *pw = &a->p->weights[g->mats[i]];
        *j = (err_job){.w = a->m->wf32[g->mats[i]], .y = y[i], .xs = xs, .s = s, .n = pw->shape[0], .k = g->width,
                       .rows = g->n_rows, .dtype = format_for(quant, pw->shape[0], g->width), .method = method};
        j->parts = (int)(j->n < AWQ_PARTS ? j->n : AWQ_PARTS);
        kiln_pool_for(kiln_pool_shared(), j->parts, j->parts, err_rows, j);
        if (j->nomem) return -1;
        for (int p = 0; p < j->parts; p++) e += j->part_err[p];
    }
    return e;
}

/* Search group g's alpha; g->s gets the chosen scales (NULL when alpha 0 wins). The error is each
 * projection's on its own output, or for gate/up feeding down (find_mlp) the MLP's (mlp_job). */
static kiln_status search(const awq_ctx *a, awq_group *g, int quant, int method, kiln_error *err) {
    const int64_t k = g->width;
    const int rows = g->n_rows;
    const bool mlp = g->mlp_down >= 0;
    const int64_t f = mlp ? a->p->weights[g->mlp_gate].shape[0] : 0;
    const char *name = a->p->weights[g->mats[0]].name;
    double *stat = malloc((size_t)k * sizeof *stat);
    float *s = malloc((size_t)k * sizeof *s), *xs = malloc((size_t)rows * (size_t)k * sizeof *xs);
    float *h = mlp ? malloc((size_t)rows * (size_t)f * sizeof *h) : NULL;
    float *y[AWQ_MAX_MATS] = {0}; /* the reference outputs on the sampled rows: each matrix's, or the MLP's */
    err_job *ej = calloc(1, sizeof *ej);
    mlp_job *mj = calloc(1, sizeof *mj);
    kiln_status st = stat && s && xs && ej && mj && (!mlp || h) ? KILN_OK : KILN_ERR_NOMEM;
    for (int i = 0; i < (mlp ? 1 : g->n_mats) && st == KILN_OK; i++) {
        const int64_t n = mlp ? k : a->p->weights[g->mats[i]].shape[0];
        if (!(y[i] = malloc((size_t)rows * (size_t)n * sizeof(float)))) st = KILN_ERR_NOMEM;
    }
    if (st != KILN_OK) {
        kiln_err(err, st, "--awq: out of memory searching the scales of '%s'", name);
        goto out;
    }
    /* the statistic per input channel: mean |x|; for o, the mean over the query heads of one KV head */
    for (int64_t c = 0; c < k; c++) stat[c] = g->abs_sum[c] / (double)g->tokens;
    if (g->fold == FOLD_V) {
        const int G = g->heads / g->kv_heads, hd = g->head_dim;
        for (int kv = 0; kv < g->kv_heads; kv++)
            for (int d = 0; d < hd; d++) {
                double m = 0;
                for (int q = 0; q < G; q++) m += stat[((int64_t)kv * G + q) * hd + d];
                for (int q = 0; q < G; q++) stat[((int64_t)kv * G + q) * hd + d] = m / G;
            }
    }
    if (mlp) { /* the reference: unscaled, unrounded */
        *mj = (mlp_job){.g = a->m->wf32[g->mlp_gate], .u = a->m->wf32[g->mlp_up], .d = a->m->wf32[g->mlp_down],
                        .xs = g->rows, .h = h, .y = y[0], .f = f, .hd = k, .rows = rows,
                        .dtype = format_for(quant, f, k), .method = method};
        mlp_run(mj);
    } else {
        for (int i = 0; i < g->n_mats; i++) {
            const kiln_plan_weight *pw = &a->p->weights[g->mats[i]];
            ref_job r = {a->m->wf32[g->mats[i]], g->rows, y[i], pw->shape[0], k, rows, 0};
            r.parts = (int)(r.n < AWQ_PARTS ? r.n : AWQ_PARTS);
            kiln_pool_for(kiln_pool_shared(), r.parts, r.parts, ref_rows, &r);
        }
    }
    int best = 0;
    for (int ai = 0; ai < AWQ_GRID; ai++) {
        scales_for(stat, k, ai, s);
        for (int t = 0; t < rows; t++)
            for (int64_t c = 0; c < k; c++) xs[(int64_t)t * k + c] = g->rows[(int64_t)t * k + c] / s[c];
        double e;
        if (mlp) {
            mj->xs = xs, mj->s = s, mj->quant = 1, mj->y_ref = y[0];
            e = mlp_run(mj);
        } else {
            e = mats_error(a, g, y, s, xs, quant, method, ej);
        }
        if (mj->nomem || e < 0) {
            st = kiln_err(err, KILN_ERR_NOMEM, "--awq: out of memory searching the scales of '%s'", name);
            goto out;
        }
        if (ai == 0) g->err0 = g->err = e;
        else if (e < g->err) g->err = e, best = ai;
    }
    g->alpha = best;
    if (best > 0) {
        scales_for(stat, k, best, s);
        g->s = s;
        s = NULL;
    }
out:
    for (int i = 0; i < AWQ_MAX_MATS; i++) free(y[i]);
    free(stat), free(s), free(xs), free(h), free(ej), free(mj);
    return st;
}

/* ---- the result ---- */

static kiln_status add_scale(kiln_quant_awq *out, const char *name, const float *v, int64_t n, bool invert,
                             bool rows, kiln_error *err) {
    kiln_awq_scale *ns = realloc(out->scales, (size_t)(out->n_scales + 1) * sizeof *ns);
    if (!ns) return kiln_err(err, KILN_ERR_NOMEM, "out of memory");
    out->scales = ns;
    float *f = malloc((size_t)n * sizeof *f);
    char *nm = strdup(name);
    if (!f || !nm) {
        free(f), free(nm);
        return kiln_err(err, KILN_ERR_NOMEM, "out of memory");
    }
    for (int64_t i = 0; i < n; i++) f[i] = invert ? 1.0f / v[i] : v[i];
    ns[out->n_scales++] = (kiln_awq_scale){.name = nm, .row_mul = rows ? f : NULL, .col_mul = rows ? NULL : f};
    return KILN_OK;
}

/* Group g's scales: s on each projection's columns, 1/s where its input is made. */
static kiln_status emit(const kiln_plan *p, const awq_group *g, kiln_quant_awq *out, kiln_error *err) {
    kiln_status st = KILN_OK;
    for (int i = 0; i < g->n_mats && st == KILN_OK; i++)
        st = add_scale(out, p->weights[g->mats[i]].name, g->s, g->width, false, false, err);
    if (st != KILN_OK) return st;
    const char *fold = p->weights[g->fold_w].name;
    if (g->fold == FOLD_NORM) return add_scale(out, fold, g->s, g->width, true, false, err);
    if (g->fold == FOLD_UP) return add_scale(out, fold, g->s, g->width, true, true, err);
    /* FOLD_V: v's rows are KV heads; the scales are equal over the query heads of one (search) */
    const int G = g->heads / g->kv_heads, hd = g->head_dim;
    float *sv = malloc((size_t)g->kv_heads * (size_t)hd * sizeof *sv);
    if (!sv) return kiln_err(err, KILN_ERR_NOMEM, "out of memory");
    for (int kv = 0; kv < g->kv_heads; kv++)
        for (int d = 0; d < hd; d++) sv[kv * hd + d] = g->s[((int64_t)kv * G) * hd + d];
    st = add_scale(out, fold, sv, (int64_t)g->kv_heads * hd, true, true, err);
    if (st == KILN_OK && g->bias_w >= 0)
        st = add_scale(out, p->weights[g->bias_w].name, sv, (int64_t)g->kv_heads * hd, true, false, err);
    free(sv);
    return st;
}

static json_t *group_json(const kiln_plan *p, const awq_group *g) {
    json_t *mats = json_array();
    for (int i = 0; i < g->n_mats; i++) json_array_append_new(mats, json_string(p->weights[g->mats[i]].name));
    if (g->skip) return json_pack("{s:o, s:s}", "matrices", mats, "skipped", g->skip);
    return json_pack("{s:o, s:s, s:f, s:f, s:f}", "matrices", mats, "fold", p->weights[g->fold_w].name, "alpha",
                     (double)g->alpha / (AWQ_GRID - 1), "error", g->err, "error_unscaled", g->err0);
}

/* The output of the projection with plan weight w reading value x: its op's output, or -1. */
static int32_t linear_out(const kiln_plan *p, int32_t x, int w) {
    for (uint32_t i = 0; i < p->n_ops; i++)
        if (p->ops[i].kind == KILN_OP_LINEAR && p->ops[i].in[0] == x && weight_of(p, p->ops[i].in[1]) == w)
            return p->ops[i].out[0];
    return -1;
}

/* A gate/up group whose outputs make down(silu(gate) * up) alone: its search measures the MLP's output
 * (as AutoAWQ does), with down unquantized, rather than gate's and up's outputs. */
static void find_mlp(const kiln_plan *p, awq_group *g) {
    if (g->n_mats != 2) return;
    for (int j = 0; j < 2; j++) {
        const int32_t og = linear_out(p, g->value, g->mats[j]), ou = linear_out(p, g->value, g->mats[1 - j]);
        if (og < 0 || ou < 0 || uses(p, og) != 1 || uses(p, ou) != 1) continue;
        for (uint32_t i = 0; i < p->n_ops; i++) {
            const kiln_plan_op *si = &p->ops[i];
            if (si->kind != KILN_OP_SILU || si->in[0] != og || uses(p, si->out[0]) != 1) continue;
            for (uint32_t k = 0; k < p->n_ops; k++) {
                const kiln_plan_op *mu = &p->ops[k];
                if (mu->kind != KILN_OP_MUL || mu->in[0] != si->out[0] || mu->in[1] != ou || uses(p, mu->out[0]) != 1)
                    continue;
                for (uint32_t d = 0; d < p->n_ops; d++)
                    if (p->ops[d].kind == KILN_OP_LINEAR && p->ops[d].in[0] == mu->out[0]) {
                        const int wd = weight_of(p, p->ops[d].in[1]);
                        if (wd < 0) return;
                        g->mlp_gate = g->mats[j], g->mlp_up = g->mats[1 - j], g->mlp_down = wd;
                        return;
                    }
            }
        }
    }
}

/* Groups: one per activation that projections read, in plan order. */
static kiln_status make_groups(awq_ctx *a, kiln_error *err) {
    const kiln_plan *p = a->p;
    a->group_of = malloc((size_t)p->n_values * sizeof *a->group_of);
    a->g = calloc(p->n_ops ? p->n_ops : 1, sizeof *a->g);
    if (!a->group_of || !a->g) return kiln_err(err, KILN_ERR_NOMEM, "out of memory");
    for (uint32_t v = 0; v < p->n_values; v++) a->group_of[v] = -1;
    for (uint32_t i = 0; i < p->n_ops; i++) {
        const kiln_plan_op *op = &p->ops[i];
        const int w = op->kind == KILN_OP_LINEAR ? weight_of(p, op->in[1]) : -1;
        if (w < 0 || p->weights[w].ndim != 2 || kiln_dtype_is_quant((int)p->weights[w].dtype)) continue;
        int gi = a->group_of[op->in[0]];
        if (gi < 0) {
            gi = a->group_of[op->in[0]] = a->n_g++;
            awq_group *g = &a->g[gi];
            g->value = op->in[0], g->first_op = i, g->width = p->values[op->in[0]].shape[2];
            g->abs_sum = calloc((size_t)g->width, sizeof *g->abs_sum);
            g->rows = malloc((size_t)AWQ_ROWS * (size_t)g->width * sizeof *g->rows);
            if (!g->abs_sum || !g->rows) return kiln_err(err, KILN_ERR_NOMEM, "--awq: out of memory");
        }
        awq_group *g = &a->g[gi];
        if (g->n_mats == AWQ_MAX_MATS) {
            g->skip = "more projections share its input than --awq handles";
            continue;
        }
        g->mats[g->n_mats++] = w;
    }
    for (int gi = 0; gi < a->n_g; gi++) {
        a->g[gi].mlp_gate = a->g[gi].mlp_up = a->g[gi].mlp_down = -1;
        if (!a->g[gi].skip) find_fold(p, &a->g[gi]), find_mlp(p, &a->g[gi]);
    }
    return KILN_OK;
}

static kiln_status run(const kiln_compile_options *opt, kiln_model *m, kiln_quant_awq *out, kiln_error *err) {
    awq_ctx a = {.m = m, .p = m->plan};
    int32_t *ids = NULL;
    size_t n_ids = 0;
    json_t *calib = NULL, *groups = NULL;
    float *logits = NULL;
    kiln_cpu_ctx *c = NULL;
    kiln_status st = kiln_calib_tokens(opt, m, "--awq", &ids, &n_ids, &calib, err);
    if (st != KILN_OK) goto out;
    const int n_toks = n_ids < (size_t)opt->calib_tokens ? (int)n_ids : opt->calib_tokens;
    if (n_toks < 32) {
        st = kiln_err(err, KILN_ERR_INVALID_ARG, "--awq: the calibration has %d tokens; at least 32 are needed", n_toks);
        goto out;
    }
    const int seq = n_toks < (int)a.p->max_context ? n_toks : (int)a.p->max_context;
    a.stride = (n_toks + AWQ_ROWS - 1) / AWQ_ROWS;
    if ((st = make_groups(&a, err)) != KILN_OK) goto out;
    if ((st = kiln_model_load_f32(m, err)) != KILN_OK ||
        (st = kiln_cpu_ctx_new(m, seq, seq, kiln_pool_ways(kiln_pool_shared()), &c, err)) != KILN_OK) {
        kiln_err_prefix(err, "--awq: the CPU executor: ");
        goto out;
    }
    if (!(logits = malloc((size_t)a.p->vocab_size * sizeof *logits))) {
        st = kiln_err(err, KILN_ERR_NOMEM, "out of memory");
        goto out;
    }
    kiln_cpu_ctx_set_op_trace(c, trace, &a);
    kiln_progress_phase(opt->progress, "awq: calibrate", 0, NULL, 0);
    for (int s0 = 0; s0 < n_toks && st == KILN_OK; s0 += seq) {
        kiln_cpu_ctx_reset(c);
        a.tok_base = s0;
        st = kiln_cpu_forward(c, ids + s0, n_toks - s0 < seq ? n_toks - s0 : seq, false, logits, err);
    }
    if (st != KILN_OK) goto out;
    int searched = 0;
    for (int gi = 0; gi < a.n_g; gi++) searched += !a.g[gi].skip;
    kiln_progress_phase(opt->progress, "awq: search scales", (uint64_t)searched, "groups", 0);
    groups = json_array();
    double e0 = 0, e1 = 0;
    int done = 0, scaled = 0;
    for (int gi = 0; gi < a.n_g && st == KILN_OK; gi++) {
        awq_group *g = &a.g[gi];
        if (!g->skip) {
            /* under --quant auto the formats are not chosen yet: the scales are searched for int4 g128,
             * the smallest format auto may pick for a projection */
            const int fmt = opt->quant == KILN_QUANT_AUTO ? KILN_DTYPE_Q4G128 : opt->quant;
            if ((st = search(&a, g, fmt, opt->quant_method, err)) != KILN_OK) break;
            if (g->s && (st = emit(a.p, g, out, err)) != KILN_OK) break;
            e0 += g->err0, e1 += g->err, scaled += g->s != NULL;
            kiln_progress_update(opt->progress, (uint64_t)++done);
        }
        json_array_append_new(groups, group_json(a.p, g));
    }
    if (st != KILN_OK) goto out;
    out->report = json_pack("{s:o, s:i, s:i, s:i, s:f, s:f, s:o}", "calibration", calib, "tokens", n_toks,
                            "groups_searched", searched, "groups_scaled", scaled, "error", e1, "error_unscaled", e0,
                            "groups", groups);
    calib = groups = NULL;
out:
    kiln_cpu_ctx_free(c);
    for (int gi = 0; gi < a.n_g; gi++) free(a.g[gi].abs_sum), free(a.g[gi].rows), free(a.g[gi].s);
    free(a.g), free(a.group_of), free(logits), free(ids);
    json_decref(calib), json_decref(groups);
    return st;
}

kiln_status kiln_quant_awq_run(const char *ckpt_dir, const kiln_compile_options *opt, kiln_quant_awq *out,
                               kiln_error *err) {
    memset(out, 0, sizeof *out);
    kiln_model *m = NULL;
    kiln_status st = kiln_calib_model(ckpt_dir, opt, "--awq", "", &m, err);
    if (st == KILN_OK) st = run(opt, m, out, err);
    kiln_model_close(m);
    if (st != KILN_OK) kiln_quant_awq_free(out);
    return st;
}

kiln_status kiln_quant_awq_apply(const kiln_quant_awq *qa, kiln_graph *g, kiln_error *err) {
    for (int i = 0; i < qa->n_scales; i++) {
        const kiln_awq_scale *s = &qa->scales[i];
        int v = 0;
        while (v < g->n_values && !(g->values[v].kind == KILN_VALUE_WEIGHT && strcmp(g->values[v].name, s->name) == 0))
            v++;
        if (v == g->n_values)
            return kiln_err(err, KILN_ERR_INTERNAL, "--awq: weight '%s' of the calibration engine is not in the graph",
                            s->name);
        /* copies: the same scales go into the calibration engine of --quant auto and into the engine */
        const kiln_value *val = &g->values[v];
        const int64_t n = s->row_mul ? val->shape[0] : val->ndim == 2 ? val->shape[1] : val->shape[0];
        float *c = malloc((size_t)n * sizeof *c);
        if (!c) return kiln_err(err, KILN_ERR_NOMEM, "out of memory");
        memcpy(c, s->row_mul ? s->row_mul : s->col_mul, (size_t)n * sizeof *c);
        kiln_status st = kiln_ir_weight_scale(g, v, s->row_mul ? c : NULL, s->row_mul ? NULL : c, err);
        if (st != KILN_OK) return kiln_err_prefix(err, "--awq: ");
    }
    return KILN_OK;
}

void kiln_quant_awq_free(kiln_quant_awq *qa) {
    for (int i = 0; i < qa->n_scales; i++) free(qa->scales[i].name), free(qa->scales[i].row_mul), free(qa->scales[i].col_mul);
    free(qa->scales);
    json_decref(qa->report);
    memset(qa, 0, sizeof *qa);
}
