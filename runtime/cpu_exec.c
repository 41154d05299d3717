/*
 * cpu_exec.c — the CPU reference executor: runs a plan in f32, one sequence
 * at a time, with a KV cache. It is the oracle GPU kernels are tested
 * against, so it favours plain, checkable loops over speed: each op below is
 * the textbook formula, written once, with HuggingFace's conventions
 * (rotate_half RoPE pairing i with i + head_dim/2; RMSNorm as
 * w * x / sqrt(mean(x^2) + eps); causal attention where a sliding window W
 * lets position p see keys p-W+1 .. p).
 *
 * Memory: one buffer per plan slot, max_step_tokens × slot width floats;
 * KV cache per layer: max_context × n_kv_heads × head_dim floats for K and V.
 * The plan was fully checked at load (runtime/plan.c), so shapes and indices
 * are trusted here; token ids and lengths are not.
 *
 * Tensor parallelism (a plan of several ranks, kiln compile --tp N): the
 * context holds every rank's state (activation buffers, KV cache, weight
 * shards) and runs the plan rank by rank, op by op: op i on rank 0, 1, ...,
 * then op i + 1. The collectives run once their last rank is reached, in
 * memory: all_reduce adds the ranks' partial sums in rank order, all_gather
 * concatenates. This is how a tp plan is checked against the tp=1 logits on
 * a machine without GPUs; the GPU runtime does the same with NCCL.
 *
 * Threads: matmuls split their output columns over the process-wide pool
 * (common/kiln_pool.h), at most `threads` ways; each output element is one
 * dot product whatever the split, so results do not depend on `threads`.
 * Everything else runs on the calling thread.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../common/kiln_pool.h"
#include "kiln_rt.h"

/* One tensor-parallel rank's state (a plan of one rank has one). */
typedef struct cpu_rank {
    float **slots;    /* per slot: max_step × width */
    float *kcache;    /* [layers][max_context][kv_width] */
    float *vcache;
} cpu_rank;

struct kiln_cpu_ctx {
    const kiln_model *m;
    const kiln_plan *p;
    int max_context, max_step, threads; /* threads: ways of parallelism a matmul may use */
    kiln_pool *pool;  /* the process-wide pool (NULL: inline) */
    int pos;          /* tokens in the cache */
    int n_ranks;      /* the plan's tensor-parallel ranks (1: none) */
    cpu_rank *ranks;  /* [n_ranks] */
    /* the rank the interpreter is running now (use_rank): its buffers, cache and weights */
    int rank;
    float **slots;
    float *kcache;
    float *vcache;
    float *const *w;  /* its weights as f32: m->wf32 + rank × n_weights */
    size_t kv_width;  /* n_kv_heads × head_dim (one rank's heads) */
    int32_t *positions; /* max_step */
    kiln_cpu_moe_trace_fn moe_trace; /* routing trace (tests); NULL = none */
    void *moe_trace_user;
    kiln_cpu_op_trace_fn op_trace; /* activation trace (calibration); NULL = none */
    void *op_trace_user;
    kiln_cpu_kv_trace_fn kv_trace; /* KV trace (calibration); NULL = none */
    void *kv_trace_user;
    /* W8A8 (+act_fp8 ops): the step's input rows as E4M3 codes read back (max_step × aq_k), one row's
     * codes and scales; NULL when no op has the flag */
    float *aq, *aq_scales;
    uint8_t *aq_codes;
    int64_t aq_k;
};

static void use_rank(kiln_cpu_ctx *c, int r) {
    c->rank = r;
    c->slots = c->ranks[r].slots;
    c->kcache = c->ranks[r].kcache;
    c->vcache = c->ranks[r].vcache;
    c->w = c->m->wf32 + (size_t)r * c->p->n_weights;
}

/* ---- context ---- */

kiln_status kiln_cpu_ctx_new(const kiln_model *m, int max_context, int max_step_tokens, int threads,
                             kiln_cpu_ctx **out, kiln_error *err) {
    *out = NULL;
    const kiln_plan *p = m->plan;
    if (max_context <= 0 || max_context > p->max_context) max_context = p->max_context;
    if (max_step_tokens <= 0 || max_step_tokens > max_context) max_step_tokens = max_context;
    if (threads <= 0) threads = 1;
    kiln_cpu_ctx *c = calloc(1, sizeof *c);
    if (!c) return kiln_err(err, KILN_ERR_NOMEM, "out of memory creating the CPU context");
    c->m = m;
    c->p = p;
    c->max_context = max_context;
    c->max_step = max_step_tokens;
    c->threads = threads;
    c->pool = threads > 1 ? kiln_pool_shared() : NULL;
    c->kv_width = (size_t)p->n_kv_heads * (size_t)p->head_dim;
    size_t kv = (size_t)p->n_layers * (size_t)max_context * c->kv_width;
    c->n_ranks = (int)p->n_ranks;
    c->ranks = calloc((size_t)c->n_ranks, sizeof *c->ranks);
    c->positions = malloc((size_t)max_step_tokens * sizeof *c->positions);
    if (!c->ranks || !c->positions) goto nomem;
    for (int r = 0; r < c->n_ranks; r++) {
        cpu_rank *rk = &c->ranks[r];
        rk->kcache = malloc(kv * sizeof(float));
        rk->vcache = malloc(kv * sizeof(float));
        rk->slots = calloc(p->n_slots ? p->n_slots : 1, sizeof *rk->slots);
        if (!rk->kcache || !rk->vcache || !rk->slots) goto nomem;
        for (uint32_t s = 0; s < p->n_slots; s++) {
            rk->slots[s] = malloc((size_t)max_step_tokens * p->slots[s].width * sizeof(float));
            if (!rk->slots[s]) goto nomem;
        }
    }
    for (uint32_t i = 0; i < p->n_ops; i++) /* the widest input a +act_fp8 op quantizes */
        if (p->ops[i].attrs.flags & KILN_FLAG_ACT_FP8) {
            const kiln_plan_value *x = &p->values[p->ops[i].in[0]];
            if (x->shape[x->ndim - 1] > c->aq_k) c->aq_k = x->shape[x->ndim - 1];
        }
    if (c->aq_k) {
        c->aq = malloc((size_t)max_step_tokens * (size_t)c->aq_k * sizeof(float));
        c->aq_codes = malloc((size_t)c->aq_k);
        c->aq_scales = malloc((size_t)(c->aq_k / 128 + 1) * sizeof(float));
        if (!c->aq || !c->aq_codes || !c->aq_scales) goto nomem;
    }
    use_rank(c, 0);
    *out = c;
    return KILN_OK;
nomem:;
    const size_t kv_mb = kv * 2 * sizeof(float) * p->n_ranks >> 20; /* every rank's cache */
    kiln_cpu_ctx_free(c);
    return kiln_err(err, KILN_ERR_NOMEM, "out of memory for a %d-token context (KV cache %zu MB)", max_context,
                    kv_mb);
}

void kiln_cpu_ctx_free(kiln_cpu_ctx *c) {
    if (!c) return;
    for (int r = 0; c->ranks && r < c->n_ranks; r++) {
        cpu_rank *rk = &c->ranks[r];
        if (rk->slots)
            for (uint32_t s = 0; s < c->p->n_slots; s++) free(rk->slots[s]);
        free(rk->slots);
        free(rk->kcache);
        free(rk->vcache);
    }
    free(c->ranks);
    free(c->positions);
    free(c->aq);
    free(c->aq_codes);
    free(c->aq_scales);
    free(c);
}

int kiln_cpu_ctx_pos(const kiln_cpu_ctx *c) { return c->pos; }
int kiln_cpu_ctx_max_context(const kiln_cpu_ctx *c) { return c->max_context; }
int kiln_cpu_ctx_max_step(const kiln_cpu_ctx *c) { return c->max_step; }
const kiln_model *kiln_cpu_ctx_model(const kiln_cpu_ctx *c) { return c->m; }
void kiln_cpu_ctx_reset(kiln_cpu_ctx *c) { c->pos = 0; }
void kiln_cpu_ctx_set_op_trace(kiln_cpu_ctx *c, kiln_cpu_op_trace_fn fn, void *user) {
    c->op_trace = fn;
    c->op_trace_user = user;
}

void kiln_cpu_ctx_set_kv_trace(kiln_cpu_ctx *c, kiln_cpu_kv_trace_fn fn, void *user) {
    c->kv_trace = fn;
    c->kv_trace_user = user;
}

void kiln_cpu_ctx_set_moe_trace(kiln_cpu_ctx *c, kiln_cpu_moe_trace_fn fn, void *user) {
    c->moe_trace = fn;
    c->moe_trace_user = user;
}

/* ---- kernels ---- */

static float dot(const float *a, const float *b, int64_t n) {
    float acc[8] = {0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int k = 0; k < 8; k++) acc[k] += a[i + k] * b[i + k];
    float s = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
    for (; i < n; i++) s += a[i] * b[i];
    return s;
}

typedef struct matmul_job {
    const float *x;    /* [rows, k] */
    const float *w;    /* [n, k] */
    float *y;          /* [rows, n] */
    const float *res;  /* [rows, n] added to each product (linear_add's residual, which y may be), or NULL */
    int64_t rows, k, n;
    int parts;         /* output columns split in this many ranges, one task each */
} matmul_job;

/* Task `part`: output columns n*part/parts .. n*(part+1)/parts - 1, every row. */
static void matmul_range(void *arg, int part) {
    const matmul_job *j = arg;
    int64_t n0 = j->n * part / j->parts, n1 = j->n * (part + 1) / j->parts;
    for (int64_t o = n0; o < n1; o++) {
        const float *wr = j->w + o * j->k;
        for (int64_t t = 0; t < j->rows; t++) {
            const float d = dot(j->x + t * j->k, wr, j->k); /* rounded to f32, then the residual added */
            j->y[t * j->n + o] = j->res ? d + j->res[t * j->n + o] : d;
        }
    }
}

/* y[rows, n] = x[rows, k] · w[n, k]^T (+ res), split over output columns on the
 * process-wide pool, at most c->threads ways. Each y element is one dot()
 * whatever the split, so results do not depend on the number of threads. */
static void matmul_add(const kiln_cpu_ctx *c, const float *x, const float *w, float *y, const float *res,
                       int64_t rows, int64_t k, int64_t n) {
    int ways = c->threads;
    if ((double)rows * (double)k * (double)n < 2e6) ways = 1;
    if (ways > 16) ways = 16;
    if (ways > n) ways = n > 0 ? (int)n : 1;
    matmul_job j = {x, w, y, res, rows, k, n, ways};
    kiln_pool_for(c->pool, ways, ways, matmul_range, &j);
}

static void matmul(const kiln_cpu_ctx *c, const float *x, const float *w, float *y, int64_t rows, int64_t k,
                   int64_t n) {
    matmul_add(c, x, w, y, NULL, rows, k, n);
}

/* y = rmsnorm(x) * w row by row; with `perm` (+out_perm: the order as exact floats) element i of a row is the
 * normalised element perm[i]. */
static void rmsnorm_p(const float *x, const float *w, float *y, int64_t rows, int64_t n, float eps, const float *perm) {
    for (int64_t t = 0; t < rows; t++) {
        const float *xr = x + t * n;
        double ss = 0;
        for (int64_t i = 0; i < n; i++) ss += (double)xr[i] * xr[i];
        float inv = 1.0f / sqrtf((float)(ss / (double)n) + eps);
        for (int64_t i = 0; i < n; i++) {
            const int64_t j = perm ? (int64_t)perm[i] : i;
            y[t * n + i] = w[j] * (xr[j] * inv);
        }
    }
}
static void rmsnorm(const float *x, const float *w, float *y, int64_t rows, int64_t n, float eps) {
    rmsnorm_p(x, w, y, rows, n, eps, NULL);
}

static float silu(float v) { return v / (1.0f + expf(-v)); }

/* Inverse frequencies as HuggingFace computes them in f32, with llama3 scaling. */
static void rope_inv_freq(const kiln_op_attrs *a, float *inv) {
    int half = a->head_dim / 2;
    for (int i = 0; i < half; i++) {
        float e = (float)(2 * i) / (float)a->head_dim;
        inv[i] = 1.0f / powf(a->rope_theta, e);
    }
    if (a->rope_scaling != KILN_ROPE_SCALING_LLAMA3) return;
    const float pi = 3.14159265358979323846f;
    float old_len = a->rope_original_max_pos, factor = a->rope_factor;
    float lo = a->rope_low_freq_factor, hi = a->rope_high_freq_factor;
    float low_wavelen = old_len / lo, high_wavelen = old_len / hi;
    for (int i = 0; i < half; i++) {
        float wavelen = 2 * pi / inv[i];
        float f = wavelen > low_wavelen ? inv[i] / factor : inv[i];
        if (!(wavelen < high_wavelen) && !(wavelen > low_wavelen)) {
            float smooth = (old_len / wavelen - lo) / (hi - lo);
            f = (1 - smooth) * f / factor + smooth * f;
        }
        inv[i] = f;
    }
}

/* Rotate each head of x[rows, heads*hd] in place by its token's position. */
static void rope(float *x, const int32_t *pos, int64_t rows, int heads, int hd, const float *inv) {
    int half = hd / 2;
    for (int64_t t = 0; t < rows; t++)
        for (int h = 0; h < heads; h++) {
            float *v = x + (t * heads + h) * hd;
            for (int i = 0; i < half; i++) {
                float ang = (float)pos[t] * inv[i];
                float cs = (float)cos((double)ang), sn = (float)sin((double)ang);
                float x1 = v[i], x2 = v[i + half];
                v[i] = x1 * cs - x2 * sn;
                v[i + half] = x2 * cs + x1 * sn;
            }
        }
}

/* Row x of a kv width into the cache: as it is, or (kvs: an 8-bit KV cache, +kv_fp8 / +kv_int8) each
 * element as its code's value, kiln_kv_code then kiln_kv_value with its kv head's scale. */
static void kv_store(float *dst, const float *x, size_t kvw, int hd, const float *kvs, bool int8) {
    if (!kvs) {
        memcpy(dst, x, kvw * sizeof(float));
        return;
    }
    for (size_t i = 0; i < kvw; i++) {
        const float s = kvs[i / (size_t)hd];
        dst[i] = kiln_kv_value(kiln_kv_code(x[i], s, int8), s, int8);
    }
}

/* Append k, v of the new tokens to the layer's cache (kvs: an 8-bit cache's scales, K's kv heads then
 * V's), then attend. */
static void attention(kiln_cpu_ctx *c, const kiln_op_attrs *a, const float *q, const float *k, const float *v,
                      const float *kvs, float *out, int64_t rows) {
    const int hd = a->head_dim, nh = a->n_heads, nkv = a->n_kv_heads, group = nh / nkv;
    const size_t kvw = c->kv_width;
    float *kc = c->kcache + (size_t)a->layer * (size_t)c->max_context * kvw;
    float *vc = c->vcache + (size_t)a->layer * (size_t)c->max_context * kvw;
    if (c->kv_trace) c->kv_trace(c->kv_trace_user, a->layer, k, v, (int)rows, (int64_t)kvw);
    const bool int8 = (a->flags & KILN_FLAG_KV_INT8) != 0;
    for (int64_t t = 0; t < rows; t++) {
        kv_store(kc + (size_t)c->positions[t] * kvw, k + t * (int64_t)kvw, kvw, hd, kvs, int8);
        kv_store(vc + (size_t)c->positions[t] * kvw, v + t * (int64_t)kvw, kvw, hd, kvs ? kvs + nkv : NULL, int8);
    }
    const float scale = 1.0f / sqrtf((float)hd);
    float *scores = malloc((size_t)c->max_context * sizeof *scores);
    if (!scores) return; /* cannot happen on a sane host; leaves zeros */
    for (int64_t t = 0; t < rows; t++) {
        int p = c->positions[t];
        int start = a->window > 0 && p - a->window + 1 > 0 ? p - a->window + 1 : 0;
        for (int h = 0; h < nh; h++) {
            const float *qh = q + (t * nh + h) * hd;
            int kvh = h / group;
            float mx = -INFINITY;
            for (int j = start; j <= p; j++) {
                scores[j] = dot(qh, kc + (size_t)j * kvw + (size_t)kvh * hd, hd) * scale;
                if (scores[j] > mx) mx = scores[j];
            }
            double sum = 0;
            for (int j = start; j <= p; j++) {
                scores[j] = expf(scores[j] - mx);
                sum += scores[j];
            }
            float *oh = out + (t * nh + h) * hd;
            for (int i = 0; i < hd; i++) oh[i] = 0;
            for (int j = start; j <= p; j++) {
                float wgt = (float)(scores[j] / sum);
                const float *vr = vc + (size_t)j * kvw + (size_t)kvh * hd;
                for (int i = 0; i < hd; i++) oh[i] += wgt * vr[i];
            }
        }
    }
    free(scores);
}

/* The sparse MoE block of Mixtral and Qwen3-MoE over `rows` tokens x[rows, h] (KILN_OP_MOE), as HF's eager
 * code computes it: router logits, softmax in f32, torch.topk's choice, the chosen probabilities renormalised
 * (p / their sum, as torch divides; not with KILN_FLAG_MOE_NO_RENORM: Qwen3-MoE's norm_topk_prob false); then
 * expert by expert in index order, the SwiGLU of the tokens routed to it, each output scaled by the
 * token's weight and added into y (so a token's terms are summed in expert order, from 0). Every
 * product is one dot() whatever tokens share an expert, so prefill and decode agree. */
static kiln_status moe(kiln_cpu_ctx *c, const kiln_op_attrs *a, const float *x, const float *router,
                       const float *gu, const float *down, float *y, int64_t rows, int64_t h, int64_t f,
                       kiln_error *err) {
    const int ne = a->n_experts, k = a->top_k;
    float *logits = malloc((size_t)(rows * ne) * sizeof *logits);
    float *wsel = malloc((size_t)(rows * k) * sizeof *wsel);       /* [rows, k] weights */
    int32_t *sel = malloc((size_t)(rows * k) * sizeof *sel);       /* [rows, k] experts */
    float *xs = malloc((size_t)(rows * h) * sizeof *xs);           /* the tokens of one expert */
    float *t = malloc((size_t)(rows * 2 * f) * sizeof *t);         /* their gate and up products */
    float *act = malloc((size_t)(rows * f) * sizeof *act);
    float *o = malloc((size_t)(rows * h) * sizeof *o);
    int64_t *tok = malloc((size_t)rows * sizeof *tok);              /* token of each gathered row */
    float *tw = malloc((size_t)rows * sizeof *tw);                 /* its weight for this expert */
    kiln_status st = KILN_OK;
    if (!logits || !wsel || !sel || !xs || !t || !act || !o || !tok || !tw) {
        st = kiln_err(err, KILN_ERR_NOMEM, "forward: out of memory in layer %d's experts", a->layer);
        goto out;
    }
    matmul(c, x, router, logits, rows, h, ne);
    for (int64_t r = 0; r < rows && st == KILN_OK; r++) {
        float *p = logits + r * ne; /* softmax in place, as torch: exp(l - max) times 1 / sum */
        float mx = p[0];
        for (int e = 1; e < ne; e++) mx = p[e] > mx ? p[e] : mx;
        float sum = 0;
        for (int e = 0; e < ne; e++) sum += p[e] = expf(p[e] - mx);
        const float inv = 1.0f / sum;
        for (int e = 0; e < ne; e++) p[e] *= inv;
        if ((st = kiln_topk(p, ne, k, sel + r * k, err)) != KILN_OK) break;
        float top = 0;
        for (int j = 0; j < k; j++) top += p[sel[r * k + j]];
        if (a->flags & KILN_FLAG_MOE_NO_RENORM) top = 1.0f;
        for (int j = 0; j < k; j++) wsel[r * k + j] = p[sel[r * k + j]] / top;
        if (c->moe_trace) c->moe_trace(c->moe_trace_user, a->layer, c->positions[r], k, sel + r * k, wsel + r * k);
    }
    memset(y, 0, (size_t)(rows * h) * sizeof *y);
    for (int e = 0; e < ne && st == KILN_OK; e++) {
        int64_t m = 0;
        for (int64_t r = 0; r < rows; r++)
            for (int j = 0; j < k; j++)
                if (sel[r * k + j] == e) {
                    memcpy(xs + m * h, x + r * h, (size_t)h * sizeof *xs);
                    tok[m] = r;
                    tw[m++] = wsel[r * k + j];
                }
        if (m == 0) continue;
        matmul(c, xs, gu + (int64_t)e * 2 * f * h, t, m, h, 2 * f); /* rows: F gate, then F up */
        for (int64_t r = 0; r < m; r++)
            for (int64_t i = 0; i < f; i++) act[r * f + i] = silu(t[r * 2 * f + i]) * t[r * 2 * f + f + i];
        matmul(c, act, down + (int64_t)e * h * f, o, m, f, h);
        for (int64_t r = 0; r < m; r++)
            for (int64_t i = 0; i < h; i++) y[tok[r] * h + i] += o[r * h + i] * tw[r];
    }
out:
    free(logits);
    free(wsel);
    free(sel);
    free(xs);
    free(t);
    free(act);
    free(o);
    free(tok);
    free(tw);
    return st;
}

/* ---- the interpreter ---- */

static float *act(const kiln_cpu_ctx *c, int32_t v) { return c->slots[c->p->values[v].slot]; }
static const float *wt(const kiln_cpu_ctx *c, int32_t v) { return c->w[c->p->values[v].weight]; }
static int64_t width(const kiln_cpu_ctx *c, int32_t v) { return c->p->values[v].shape[2]; }
static int64_t wrows(const kiln_cpu_ctx *c, int32_t v) { return c->p->values[v].shape[0]; }

/* A projection's input rows r0 .. r0 + rows - 1 as its matrices multiply them: with +act_fp8 (pass w8a8)
 * in a step of more rows than the quantized GEMV takes (KILN_QGEMV_MAX_ROWS), each row quantized to
 * E4M3 with a scale per token (per 128 columns over fp8g128 matrices; kiln_act_fp8_row, the codes the
 * GPU's kiln_act_fp8 makes) and read back as code x scale into c->aq, so that the f32 product is the
 * GPU's W8A8 one up to fp32 rounding; otherwise the rows as they are. */
static const float *proj_input(kiln_cpu_ctx *c, const kiln_plan_op *op, int64_t r0, int64_t rows) {
    const int64_t k = width(c, op->in[0]);
    const float *x = act(c, op->in[0]) + r0 * k;
    if (!(op->attrs.flags & KILN_FLAG_ACT_FP8) || rows <= KILN_QGEMV_MAX_ROWS) return x;
    const int group = c->p->weights[c->p->values[op->in[1]].weight].dtype == KILN_DTYPE_FP8G128 ? 128 : 0;
    for (int64_t t = 0; t < rows; t++) {
        kiln_act_fp8_row(x + t * k, k, group, c->aq_codes, c->aq_scales);
        for (int64_t j = 0; j < k; j++)
            c->aq[t * k + j] = kiln_e4m3_to_f32(c->aq_codes[j]) * c->aq_scales[group ? j / group : 0];
    }
    return c->aq;
}

/* all_reduce and all_gather, in memory, once the last rank has run op `op`: every rank's input is
 * ready. The sum adds the ranks in rank order (NCCL's ring adds in another order, so GPU sums may
 * differ from these in the last bits); the gather puts rank r's row block at columns r × width.
 * Only rows first..n-1 are touched. */
static void collective(kiln_cpu_ctx *c, const kiln_plan_op *op, int first, int n) {
    const kiln_plan *p = c->p;
    const int s_in = p->values[op->in[0]].slot, s_out = p->values[op->out[0]].slot;
    const int64_t w = p->values[op->in[0]].shape[2], wo = p->values[op->out[0]].shape[2];
    float *z0 = c->ranks[0].slots[s_out];
    for (int64_t t = first; t < n; t++) {
        if (op->kind == KILN_OP_ALL_REDUCE)
            for (int64_t k = 0; k < w; k++) {
                float s = c->ranks[0].slots[s_in][t * w + k];
                for (int r = 1; r < c->n_ranks; r++) s += c->ranks[r].slots[s_in][t * w + k];
                z0[t * wo + k] = s;
            }
        else
            for (int r = 0; r < c->n_ranks; r++)
                memcpy(z0 + t * wo + r * w, c->ranks[r].slots[s_in] + t * w, (size_t)w * sizeof(float));
    }
    for (int r = 1; r < c->n_ranks; r++)
        memcpy(c->ranks[r].slots[s_out] + first * wo, z0 + first * wo, (size_t)((n - first) * wo) * sizeof(float));
}

/* After a qkv_rope's projections into its outputs q, k, v: the biases (when given), the per-head q/k
 * RMSNorm (+qk_norm: weights at norm[0], norm[1]), then RoPE on q and k: the order of the unfused ops. */
static void qkv_finish(const kiln_cpu_ctx *c, const kiln_plan_op *op, const float *const bias[3],
                       const int32_t *norm, int n, float *inv) {
    const kiln_op_attrs *a = &op->attrs;
    for (int j = 0; j < 3; j++) {
        if (!bias[j]) continue;
        float *y = act(c, op->out[j]);
        int64_t w = width(c, op->out[j]);
        for (int64_t t = 0; t < n; t++)
            for (int64_t k = 0; k < w; k++) y[t * w + k] += bias[j][k];
    }
    if (a->flags & KILN_FLAG_QK_NORM) {
        rmsnorm(act(c, op->out[0]), wt(c, norm[0]), act(c, op->out[0]), n * a->n_heads, a->head_dim, a->eps);
        rmsnorm(act(c, op->out[1]), wt(c, norm[1]), act(c, op->out[1]), n * a->n_kv_heads, a->head_dim, a->eps);
    }
    rope_inv_freq(a, inv);
    rope(act(c, op->out[0]), c->positions, n, a->n_heads, a->head_dim, inv);
    rope(act(c, op->out[1]), c->positions, n, a->n_kv_heads, a->head_dim, inv);
}

kiln_status kiln_cpu_forward(kiln_cpu_ctx *c, const int32_t *tokens, int n, bool all_logits, float *logits,
                             kiln_error *err) {
    const kiln_plan *p = c->p;
    if (n <= 0 || n > c->max_step)
        return kiln_err(err, KILN_ERR_INVALID_ARG, "forward: %d tokens in one step (1..%d allowed)", n, c->max_step);
    if (c->pos + n > c->max_context)
        return kiln_err(err, KILN_ERR_CONTEXT, "forward: %d + %d tokens exceed the %d-token context", c->pos, n,
                        c->max_context);
    for (int t = 0; t < n; t++) {
        if (tokens[t] < 0 || tokens[t] >= p->vocab_size)
            return kiln_err(err, KILN_ERR_INVALID_ARG, "token id %d at index %d is outside the vocabulary (0..%d)",
                            tokens[t], t, p->vocab_size - 1);
        c->positions[t] = c->pos + t;
    }
    float inv[2048];
    /* op by op, and each op rank by rank (one rank unless the plan is tensor-parallel) */
    for (uint32_t step = 0; step < p->n_ops * (uint32_t)c->n_ranks; step++) {
        const uint32_t i = step / (uint32_t)c->n_ranks;
        use_rank(c, (int)(step % (uint32_t)c->n_ranks));
        const kiln_plan_op *op = &p->ops[i];
        const kiln_op_attrs *a = &op->attrs;
        const int32_t *in = op->in, *o = op->out;
        if (c->op_trace && op->n_in > 0 && p->values[in[0]].kind == KILN_PV_ACT)
            c->op_trace(c->op_trace_user, i, act(c, in[0]), n, width(c, in[0]), c->pos);
        switch ((kiln_op_kind)op->kind) {
        case KILN_OP_EMBEDDING: {
            /* vocabulary-parallel (ranks): this rank's table holds ids first .. first + rows - 1, others
             * give zero rows (the all_reduce after it adds the ranks' rows) */
            int64_t h = width(c, o[0]), rows = wrows(c, in[1]), first = a->ranks ? c->rank * rows : 0;
            const float *table = wt(c, in[1]);
            for (int t = 0; t < n; t++) {
                int64_t id = (int64_t)tokens[t] - first;
                if (id >= 0 && id < rows)
                    memcpy(act(c, o[0]) + t * h, table + id * h, (size_t)h * sizeof(float));
                else
                    memset(act(c, o[0]) + t * h, 0, (size_t)h * sizeof(float));
            }
            break;
        }
        case KILN_OP_ALL_REDUCE:
        case KILN_OP_ALL_GATHER:
            /* the gathered logits: only the rows the LM head computed */
            if (c->rank == c->n_ranks - 1) collective(c, op, o[0] == p->logits && !all_logits ? n - 1 : 0, n);
            break;
        case KILN_OP_RMSNORM:
            rmsnorm_p(act(c, in[0]), wt(c, in[1]), act(c, o[0]), n, width(c, o[0]), a->eps,
                      (a->flags & KILN_FLAG_OUT_PERM) ? wt(c, in[2]) : NULL);
            break;
        case KILN_OP_HEAD_RMSNORM: /* each head's vector alone: n x heads rows of head_dim */
            rmsnorm(act(c, in[0]), wt(c, in[1]), act(c, o[0]), n * a->n_heads, a->head_dim, a->eps);
            break;
        case KILN_OP_PERMUTE: { /* the indices, checked at load (runtime/model.c), as exact floats */
            const float *x = act(c, in[0]), *pm = wt(c, in[1]);
            float *z = act(c, o[0]);
            const int64_t w = width(c, o[0]);
            for (int64_t t = 0; t < n; t++)
                for (int64_t k = 0; k < w; k++) z[t * w + k] = x[t * w + (int64_t)pm[k]];
            break;
        }
        case KILN_OP_BIAS_ADD: {
            const float *x = act(c, in[0]), *b = wt(c, in[1]);
            float *z = act(c, o[0]);
            int64_t w = width(c, o[0]);
            for (int64_t t = 0; t < n; t++)
                for (int64_t k = 0; k < w; k++) z[t * w + k] = x[t * w + k] + b[k];
            break;
        }
        case KILN_OP_ADD:
        case KILN_OP_MUL: {
            const float *x = act(c, in[0]), *y = act(c, in[1]);
            float *z = act(c, o[0]);
            int64_t m = n * width(c, o[0]);
            if (op->kind == KILN_OP_ADD)
                for (int64_t k = 0; k < m; k++) z[k] = x[k] + y[k];
            else
                for (int64_t k = 0; k < m; k++) z[k] = x[k] * y[k];
            break;
        }
        case KILN_OP_SILU: {
            const float *x = act(c, in[0]);
            float *z = act(c, o[0]);
            for (int64_t k = 0; k < n * width(c, o[0]); k++) z[k] = silu(x[k]);
            break;
        }
        case KILN_OP_LINEAR:
            matmul(c, proj_input(c, op, 0, n), wt(c, in[1]), act(c, o[0]), n, width(c, in[0]), width(c, o[0]));
            break;
        case KILN_OP_LINEAR_ADD: { /* the product, then the residual added: the rounding of linear + add */
            /* y may be r's slot (in place, plan memory): each element is read before it is written */
            matmul_add(c, proj_input(c, op, 0, n), wt(c, in[1]), act(c, o[0]), act(c, in[2]), n, width(c, in[0]),
                       width(c, o[0]));
            break;
        }
        case KILN_OP_LM_HEAD: {
            /* only the rows the caller wants */
            int64_t k = width(c, in[0]), v = width(c, o[0]);
            int first = all_logits ? 0 : n - 1;
            matmul(c, proj_input(c, op, first, n - first), wt(c, in[1]), act(c, o[0]) + first * v, n - first, k, v);
            break;
        }
        case KILN_OP_ROPE: {
            float *x = act(c, o[0]);
            memcpy(x, act(c, in[0]), (size_t)(n * width(c, o[0])) * sizeof(float));
            rope_inv_freq(a, inv);
            rope(x, c->positions, n, a->n_heads, a->head_dim, inv);
            break;
        }
        case KILN_OP_ATTENTION:
            attention(c, a, act(c, in[0]), act(c, in[1]), act(c, in[2]),
                      (a->flags & (KILN_FLAG_KV_FP8 | KILN_FLAG_KV_INT8)) ? wt(c, in[4]) : NULL, act(c, o[0]), n);
            break;
        case KILN_OP_ADD_RMSNORM: {
            const float *x = act(c, in[0]), *r = act(c, in[1]);
            float *s = act(c, o[0]);
            int64_t h = width(c, o[0]);
            for (int64_t k = 0; k < n * h; k++) s[k] = x[k] + r[k];
            rmsnorm_p(s, wt(c, in[2]), act(c, o[1]), n, h, a->eps, (a->flags & KILN_FLAG_OUT_PERM) ? wt(c, in[3]) : NULL);
            break;
        }
        case KILN_OP_QKV_ROPE: {
            int64_t k = width(c, in[0]);
            const float *x = proj_input(c, op, 0, n);
            matmul(c, x, wt(c, in[1]), act(c, o[0]), n, k, wrows(c, in[1]));
            matmul(c, x, wt(c, in[2]), act(c, o[1]), n, k, wrows(c, in[2]));
            matmul(c, x, wt(c, in[3]), act(c, o[2]), n, k, wrows(c, in[3]));
            const float *bias[3] = {NULL, NULL, NULL};
            if (a->flags & KILN_FLAG_QKV_BIAS)
                for (int j = 0; j < 3; j++) bias[j] = wt(c, in[5 + j]);
            qkv_finish(c, op, bias, in + ((a->flags & KILN_FLAG_QKV_BIAS) ? 8 : 5), n, inv);
            break;
        }
        case KILN_OP_QKV_ROPE_PACKED: {
            /* W = [Wq; Wk; Wv]: each output from its rows of W, the same products as unpacked */
            int64_t k = width(c, in[0]), nq = width(c, o[0]), nk = width(c, o[1]);
            const float *x = proj_input(c, op, 0, n), *w = wt(c, in[1]);
            matmul(c, x, w, act(c, o[0]), n, k, nq);
            matmul(c, x, w + nq * k, act(c, o[1]), n, k, nk);
            matmul(c, x, w + (nq + nk) * k, act(c, o[2]), n, k, nk);
            const float *bias[3] = {NULL, NULL, NULL};
            if (a->flags & KILN_FLAG_QKV_BIAS) { /* [bq; bk; bv] */
                bias[0] = wt(c, in[3]);
                bias[1] = bias[0] + nq;
                bias[2] = bias[1] + nk;
            }
            qkv_finish(c, op, bias, in + ((a->flags & KILN_FLAG_QKV_BIAS) ? 4 : 3), n, inv);
            break;
        }
        case KILN_OP_GATE_UP_SWIGLU_PACKED: {
            /* rows interleaved (gate_f, up_f): all 2F products, then silu(gate) * up */
            int64_t k = width(c, in[0]), f = width(c, o[0]);
            float *g = act(c, o[0]);
            float *t = malloc((size_t)(n * 2 * f) * sizeof *t);
            if (!t) return kiln_err(err, KILN_ERR_NOMEM, "forward: out of memory");
            matmul(c, proj_input(c, op, 0, n), wt(c, in[1]), t, n, k, 2 * f);
            for (int64_t r = 0; r < n; r++)
                for (int64_t e = 0; e < f; e++) g[r * f + e] = silu(t[r * 2 * f + 2 * e]) * t[r * 2 * f + 2 * e + 1];
            free(t);
            break;
        }
        case KILN_OP_GATE_UP_SWIGLU: {
            /* gate into the output, up into a scratch row block, then combine */
            int64_t k = width(c, in[0]), f = width(c, o[0]);
            float *g = act(c, o[0]);
            float *u = malloc((size_t)(n * f) * sizeof *u);
            if (!u) return kiln_err(err, KILN_ERR_NOMEM, "forward: out of memory");
            const float *x = proj_input(c, op, 0, n);
            matmul(c, x, wt(c, in[1]), g, n, k, f);
            matmul(c, x, wt(c, in[2]), u, n, k, f);
            for (int64_t e = 0; e < n * f; e++) g[e] = silu(g[e]) * u[e];
            free(u);
            break;
        }
        case KILN_OP_MOE: { /* Wgu [E, 2F, H], Wdown [E, H, F] */
            kiln_status st = moe(c, a, act(c, in[0]), wt(c, in[1]), wt(c, in[2]), wt(c, in[3]), act(c, o[0]), n,
                                 width(c, in[0]), c->p->values[in[3]].shape[2], err);
            if (st != KILN_OK) return st;
            break;
        }
        default: return kiln_err(err, KILN_ERR_INTERNAL, "forward: op %u has unknown kind %u", i, op->kind);
        }
    }
    const float *lg = act(c, p->logits);
    int64_t v = p->vocab_size;
    if (all_logits)
        memcpy(logits, lg, (size_t)(n * v) * sizeof(float));
    else
        memcpy(logits, lg + (int64_t)(n - 1) * v, (size_t)v * sizeof(float));
    c->pos += n;
    return KILN_OK;
}
