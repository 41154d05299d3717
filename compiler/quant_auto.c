/*
 * quant_auto.c — `kiln compile --quant auto`: each projection matrix's
 * format chosen by its measured damage under a byte budget.
 *
 *   calibration engine (the same compile, every weight dense) → CPU executor
 *   → reference: the unquantized model's log-softmax at every calibration position
 *   → the base: the LM head and embedding in their --quant-head / --quant-embedding
 *     formats (fixed: every mix has them); its KL from the reference
 *   → each matrix × {q8, fp8, q4g32, q4g64, q4g128} alone on the base: the KL it adds
 *   → kiln_quant_choose (passes/quant_choose.c): least summed KL in the budget
 *   → the chosen mix, all at once: its measured KL and NLL change
 *
 * The budget: --max-weight-bytes or --target-bits as bytes of the weights
 * section; --max-ppl-increase P bisects the byte budget between the
 * smallest and the largest mix, measuring each least-KL mix, for the least
 * whose calibration perplexity is at most P% over the reference.
 *
 * The calibration engine is a temporary file beside the output (removed at
 * once after it is mapped; a signal removes it too). A candidate is
 * evaluated by replacing the matrix's f32 copy in the CPU executor's model
 * (kiln_model.wf32) with the matrix quantized from those values and
 * dequantized by common/quant.c, the functions the writer and the loader
 * use, so a candidate runs the values its engine would. (The writer
 * quantizes the checkpoint's values; the two agree unless --dtype rounds the
 * checkpoint's matrices.)
 *
 * Calibration: --calib FILE (text, the checkpoint's tokenizer), --calib-ids
 * FILE (ids), or the built-in text (compiler/calib/default.txt, embedded at
 * build time), after BOS when the model has one, cut to --calib-tokens and
 * read in sequences of at most the model's context, each from its first
 * token with the full distribution kept for every position that has a next
 * token. Sums run in position order: the result does not depend on threads.
 */
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <xxhash.h>

#include "../common/kiln_pool.h"
#include "../common/kiln_progress.h"
#include "../passes/kiln_passes.h"
#include "../runtime/kiln_rt.h"
#include "../runtime/kiln_tokenizer.h"
#include "cli.h"
#include "kiln_compiler.h"
#include "kiln_tokjson.h"

extern const char kiln_calib_default_text[]; /* compiler/calib/default.txt (build/kiln_calib_text.c) */
extern const size_t kiln_calib_default_len;

enum { MIN_CALIB_TOKENS = 32 };

/* The formats a projection may take besides keep, smallest damage first in a tie. */
static const int quant_formats[] = {KILN_DTYPE_Q8,    KILN_DTYPE_FP8,    KILN_DTYPE_FP8G128,
                                    KILN_DTYPE_Q4G32, KILN_DTYPE_Q4G64,  KILN_DTYPE_Q4G128};
enum { N_FORMATS = sizeof quant_formats / sizeof quant_formats[0] };

/* One projection matrix: its plan weight and, per option (0 = keep), the dtype and its damage. */
typedef struct qa_matrix {
    int weight;                       /* plan weight index */
    kiln_quant_item item;             /* bytes and measured mean KL per option */
    int dtype[KILN_QUANT_OPTIONS];    /* option → dtype (0 = keep) */
    double nll[KILN_QUANT_OPTIONS];   /* mean NLL change per option */
} qa_matrix;

typedef struct qa_ctx {
    kiln_model *m;
    kiln_cpu_ctx *c;
    const int32_t *toks; /* calibration tokens [n_toks] */
    int n_toks, seq;     /* seq: tokens per sequence (the last may be shorter) */
    int V;
    float *ref;          /* [positions, V]: the reference log-softmax */
    float *logits;       /* [seq, V] */
    double *row_kl, *row_nll; /* [positions] */
    float *ref_nll;      /* [positions]: -log p_ref(next) */
    int positions;
    double base_kl, base_nll; /* the head and embedding's formats alone: KL and NLL change */
    int method;          /* q4 ranges */
} qa_ctx;

/* ---- evaluation ---- */

typedef struct kl_job {
    const float *logits; /* [rows, V] */
    const float *ref;    /* [rows, V] reference log-softmax, or NULL: write the log-softmax into out */
    float *out;
    const int32_t *next; /* [rows] next tokens */
    double *kl, *nll;    /* [rows] */
    int rows, V, parts;
} kl_job;

/* Rows of one sequence: log-softmax in double, then KL(ref || this) and -log p(next). */
static void kl_rows(void *arg, int part) {
    const kl_job *j = arg;
    for (int r = j->rows * part / j->parts; r < j->rows * (part + 1) / j->parts; r++) {
        const float *l = j->logits + (size_t)r * (size_t)j->V;
        double mx = -INFINITY, sum = 0;
        for (int v = 0; v < j->V; v++) mx = l[v] > mx ? l[v] : mx;
        for (int v = 0; v < j->V; v++) sum += exp((double)l[v] - mx);
        const double lse = mx + log(sum);
        j->nll[r] = lse - (double)l[j->next[r]];
        if (!j->ref) {
            float *o = j->out + (size_t)r * (size_t)j->V;
            for (int v = 0; v < j->V; v++) o[v] = (float)((double)l[v] - lse);
            j->kl[r] = 0;
            continue;
        }
        const float *lr = j->ref + (size_t)r * (size_t)j->V;
        double kl = 0;
        for (int v = 0; v < j->V; v++) {
            const double lp = lr[v];
            kl += exp(lp) * (lp - ((double)l[v] - lse));
        }
        j->kl[r] = kl;
    }
}

/* Run every calibration sequence; with `reference`, store the log-softmax as the reference, else
 * the mean KL against it and the mean NLL change into *kl, *dnll. */
static kiln_status evaluate(qa_ctx *q, bool reference, double *kl, double *dnll, kiln_error *err) {
    int pos = 0;
    for (int s0 = 0; s0 + 1 < q->n_toks; s0 += q->seq) {
        const int n = q->n_toks - s0 < q->seq ? q->n_toks - s0 : q->seq;
        if (n < 2) break;
        kiln_cpu_ctx_reset(q->c);
        kiln_status st = kiln_cpu_forward(q->c, q->toks + s0, n, true, q->logits, err);
        if (st != KILN_OK) return kiln_err_prefix(err, "quant auto: calibration tokens %d..%d: ", s0, s0 + n - 1);
        const int parts = kiln_pool_ways(kiln_pool_shared()) * 4;
        kl_job j = {q->logits, reference ? NULL : q->ref + (size_t)pos * (size_t)q->V,
                    q->ref + (size_t)pos * (size_t)q->V, q->toks + s0 + 1, q->row_kl + pos, q->row_nll + pos,
                    n - 1, q->V, parts < n - 1 ? parts : n - 1};
        kiln_pool_for(kiln_pool_shared(), j.parts, j.parts, kl_rows, &j);
        pos += n - 1;
    }
    double skl = 0, snll = 0;
    for (int r = 0; r < q->positions; r++) {
        if (reference) q->ref_nll[r] = (float)q->row_nll[r];
        skl += q->row_kl[r];
        snll += q->row_nll[r] - q->ref_nll[r];
    }
    if (kl) *kl = skl / q->positions;
    if (dnll) *dnll = snll / q->positions;
    return KILN_OK;
}

typedef struct quant_job {
    const float *w;
    uint8_t *codes;
    float *out;
    int64_t n, k;
    int dtype, method, parts;
} quant_job;

/* Rows of one matrix quantized as the writer does, then dequantized as the loader does. */
static void quant_rows(void *arg, int part) {
    const quant_job *j = arg;
    const int64_t r0 = j->n * part / j->parts, r1 = j->n * (part + 1) / j->parts;
    for (int64_t r = r0; r < r1; r++) kiln_quant_row_ex(j->dtype, j->n, j->k, r, j->w + r * j->k, j->codes, j->method);
    if (r1 > r0) kiln_dequant_rows(j->dtype, j->codes, j->n, j->k, r0, r1 - r0, j->out + r0 * j->k);
}

/* The f32 values plan weight `w` takes as `dtype` (malloc'd), from the model's own f32 copy. */
static float *quant_dequant(const qa_ctx *q, int w, int dtype, kiln_error *err) {
    const kiln_plan_weight *pw = &q->m->plan->weights[w];
    const int64_t n = pw->shape[0], k = pw->shape[1];
    uint8_t *codes = malloc(kiln_weight_nbytes(dtype, 2, pw->shape));
    float *out = malloc((size_t)(n * k) * sizeof *out);
    if (!codes || !out) {
        free(codes), free(out);
        kiln_err(err, KILN_ERR_NOMEM, "quant auto: out of memory quantizing '%s'", pw->name);
        return NULL;
    }
    const int ways = kiln_pool_ways(kiln_pool_shared()) * 2;
    quant_job j = {q->m->wf32[w], codes, out, n, k, dtype, q->method, (int)(n < ways ? n : ways)};
    kiln_pool_for(kiln_pool_shared(), j.parts, j.parts, quant_rows, &j);
    free(codes);
    return out;
}

/* ---- the matrices ---- */

static bool used_by_embedding(const kiln_plan *p, int w) {
    for (uint32_t i = 0; i < p->n_ops; i++)
        if (p->ops[i].kind == KILN_OP_EMBEDDING && p->values[p->ops[i].in[1]].weight == w) return true;
    return false;
}

/* The projections' matrices the pass quantize would give --quant's format, in plan order, each
 * with its options: keep, then each format its shape takes. Returns how many (<= cap). */
static int list_matrices(const kiln_plan *p, qa_matrix *mx, int cap) {
    int n = 0;
    for (uint32_t i = 0; i < p->n_ops; i++) {
        const kiln_plan_op *op = &p->ops[i];
        int first = 1, last = 1;
        switch (op->kind) {
        case KILN_OP_LINEAR:
        case KILN_OP_LINEAR_ADD:
        case KILN_OP_QKV_ROPE_PACKED:
        case KILN_OP_GATE_UP_SWIGLU_PACKED: break;
        case KILN_OP_QKV_ROPE: last = 3; break;
        case KILN_OP_GATE_UP_SWIGLU: last = 2; break;
        default: continue;
        }
        for (int j = first; j <= last && n < cap; j++) {
            const int w = p->values[op->in[j]].weight;
            const kiln_plan_weight *pw = &p->weights[w];
            bool seen = false;
            for (int e = 0; e < n; e++) seen |= mx[e].weight == w;
            if (seen || pw->ndim != 2 || kiln_dtype_is_quant((int)pw->dtype) || used_by_embedding(p, w)) continue;
            qa_matrix *x = &mx[n++];
            memset(x, 0, sizeof *x);
            x->weight = w;
            x->item.bytes[0] = kiln_align_up(pw->nbytes, KILN_PLAN_WEIGHT_ALIGN);
            x->item.n = 1;
            for (int f = 0; f < N_FORMATS; f++) {
                const uint64_t b = kiln_weight_nbytes(quant_formats[f], 2, pw->shape);
                if (!b) continue; /* the group does not divide its columns */
                x->dtype[x->item.n] = quant_formats[f];
                x->item.bytes[x->item.n++] = kiln_align_up(b, KILN_PLAN_WEIGHT_ALIGN);
            }
        }
    }
    return n;
}

/* The LM head and the embedding as the pass quantize will store them (a tied head is the table and
 * follows the embedding; a q4 group that does not divide the columns gives q8): their plan weights
 * and dtypes into w, dt. Returns how many (0..2). */
static int base_weights(const kiln_plan *p, const kiln_compile_options *opt, int w[2], int dt[2]) {
    int n = 0, emb = -1;
    for (int pass = 0; pass < 2; pass++)
        for (uint32_t i = 0; i < p->n_ops; i++) {
            const kiln_plan_op *op = &p->ops[i];
            if (op->kind != (pass ? KILN_OP_LM_HEAD : KILN_OP_EMBEDDING)) continue;
            const int x = p->values[op->in[1]].weight, t = pass ? opt->quant_head : opt->quant_embedding;
            const kiln_plan_weight *pw = &p->weights[x];
            if (pass == 0) emb = x;
            if (!t || (pass && x == emb) || pw->ndim != 2 || kiln_dtype_is_quant((int)pw->dtype) || n == 2) continue;
            w[n] = x;
            dt[n++] = kiln_weight_nbytes(t, 2, pw->shape) ? t : KILN_DTYPE_Q8;
        }
    return n;
}

/* ---- calibration tokens ---- */

kiln_status kiln_calib_tokens(const kiln_compile_options *opt, const kiln_model *m, const char *what, int32_t **ids,
                              size_t *n, json_t **source, kiln_error *err) {
    char *data = NULL;
    size_t len = 0;
    const char *file = opt->calib_ids_path ? opt->calib_ids_path : opt->calib_path;
    kiln_status st = KILN_OK;
    if (file && (st = kiln_file_read(file, 256u << 20, &data, &len, err)) != KILN_OK)
        return kiln_err_prefix(err, "--calib%s: ", opt->calib_ids_path ? "-ids" : "");
    const char *text = file ? data : kiln_calib_default_text;
    if (!file) len = kiln_calib_default_len;
    if (opt->calib_ids_path) {
        size_t i = 0;
        while (i < len && (data[i] == ' ' || data[i] == '\n' || data[i] == '\t' || data[i] == '\r')) i++;
        st = i < len && data[i] == '[' ? kiln_tokenize_parse_ids(data, len, file, ids, n, err)
                                       : kiln_cli_parse_ids_text(data, len, file, ids, n, err);
        for (size_t k = 0; st == KILN_OK && k < *n; k++)
            if ((*ids)[k] < 0 || (*ids)[k] >= (int32_t)m->plan->vocab_size)
                st = kiln_err(err, KILN_ERR_INVALID_ARG, "--calib-ids %s: id %d (at %zu) is outside the model's "
                              "vocabulary 0..%d", file, (*ids)[k], k, (int)m->plan->vocab_size - 1);
    } else if (!m->tokenizer) {
        st = kiln_err(err, KILN_ERR_UNSUPPORTED, "%s: the checkpoint has no tokenizer.json to read %s with", what,
                      file ? file : "the built-in calibration text");
        kiln_err_hint(err, "give the calibration as token ids: --calib-ids FILE");
    } else {
        int32_t *t = NULL;
        size_t nt = 0;
        if ((st = kiln_tokenizer_encode(m->tokenizer, text, len, 0, &t, &nt, err)) != KILN_OK) {
            kiln_err_prefix(err, "--calib %s: ", file ? file : "(built-in)");
        } else if (!(*ids = malloc((nt + 1) * sizeof **ids))) {
            st = kiln_err(err, KILN_ERR_NOMEM, "out of memory");
        } else { /* read after BOS, as `kiln perplexity --bos` */
            *n = 0;
            if (m->bos_id >= 0) (*ids)[(*n)++] = m->bos_id;
            memcpy(*ids + *n, t, nt * sizeof *t);
            *n += nt;
        }
        free(t);
    }
    if (st == KILN_OK) {
        char hash[17];
        snprintf(hash, sizeof hash, "%016llx", (unsigned long long)XXH64(text, len, 0));
        *source = json_pack("{s:s, s:I, s:s}", "source",
                            opt->calib_ids_path ? "file of token ids" : file ? "text file" : "built-in text",
                            "bytes", (json_int_t)len, "xxh64", hash);
    }
    free(data);
    return st;
}

/* ---- the pass ---- */

/* The calibration engine: this compile with the projections dense (and `passes`, NULL = the compile's),
 * into `path`. */
static kiln_status calibration_engine(const char *ckpt_dir, const kiln_compile_options *opt, const char *what,
                                      const char *passes, const char *path, kiln_error *err) {
    kiln_compile_options o = *opt;
    o.output_path = path;
    if (passes) o.passes = passes;
    o.awq = false;
    o.quant = 0; /* every weight dense: the reference is the unquantized model */
    o.quant_head = 0;
    o.quant_embedding = 0;
    o.kv_dtype = 0; /* the KV cache in the element type (a kv_cache_scheme checkpoint's too): the reference */
    o.kv_scales = NULL;
    o.kv_bf16 = true;
    o.tp = 1; /* the whole model: calibration's activations and KV heads are the unsplit ones */
    o.targets = "none";
    o.gpu_if_possible = false;
    o.progress = NULL;
    o.dump_ir = false;
    o.compress = false;
    o.no_chat_template = true;
    o.quant_report = NULL;
    o.force = true; /* beside the output, which was checked */
    kiln_status st = kiln_compile(ckpt_dir, &o, err);
    return st == KILN_OK ? st : kiln_err_prefix(err, "%s: the calibration engine: ", what);
}

static json_t *matrix_json(const qa_ctx *q, const qa_matrix *x, int pick) {
    const kiln_plan_weight *pw = &q->m->plan->weights[x->weight];
    json_t *kl = json_object();
    for (int j = 1; j < x->item.n; j++)
        json_object_set_new(kl, kiln_dtype_name((kiln_dtype)x->dtype[j]), json_real(x->item.damage[j]));
    const char *fmt = pick ? kiln_dtype_name((kiln_dtype)x->dtype[pick]) : kiln_dtype_name((kiln_dtype)pw->dtype);
    return json_pack("{s:s, s:s, s:I, s:f, s:o}", "name", pw->name, "format", fmt, "bytes",
                     (json_int_t)x->item.bytes[pick], "kl", x->item.damage[pick], "kl_each", kl);
}

/* The budget in bytes, refused when even the smallest mix exceeds it (naming that size). `fixed`: what
 * the weights but the projections take (the head, the embedding, the norms, padding). */
static kiln_status check_budget(const kiln_compile_options *opt, const qa_matrix *mx, int nm, uint64_t fixed,
                                uint64_t elems, uint64_t *budget, kiln_error *err) {
    *budget = opt->max_weight_bytes ? opt->max_weight_bytes
              : opt->target_bits    ? (uint64_t)(opt->target_bits * (double)elems / 8)
                                    : UINT64_MAX; /* --max-ppl-increase: bisected later */
    uint64_t least = fixed;
    for (int i = 0; i < nm; i++) {
        uint64_t s = mx[i].item.bytes[0];
        for (int j = 1; j < mx[i].item.n; j++) s = mx[i].item.bytes[j] < s ? mx[i].item.bytes[j] : s;
        least += s;
    }
    if (least <= *budget) return KILN_OK;
    char want[80];
    if (opt->max_weight_bytes) snprintf(want, sizeof want, "--max-weight-bytes %llu", (unsigned long long)*budget);
    else snprintf(want, sizeof want, "--target-bits %g (%llu bytes)", opt->target_bits, (unsigned long long)*budget);
    kiln_err(err, KILN_ERR_INVALID_ARG, "%s: the smallest mix (every projection at its smallest format, the LM head "
             "and embedding as asked) takes %llu weight bytes (%.3f bits per weight)", want,
             (unsigned long long)least, (double)least * 8 / (double)elems);
    return kiln_err_hint(err, "give a budget of at least %llu bytes, or quantize the LM head or embedding too "
                         "(--quant-head, --quant-embedding)", (unsigned long long)least);
}

/* Each matrix in each format alone: item.damage[j] (mean KL) and nll[j]. */
static kiln_status measure_each(qa_ctx *q, qa_matrix *mx, int nm, kiln_progress *progress, kiln_error *err) {
    int total = 0, done = 0;
    for (int i = 0; i < nm; i++) total += mx[i].item.n - 1;
    kiln_progress_phase(progress, "calibrate", (uint64_t)total, "matrix formats", 1);
    kiln_status st = KILN_OK;
    for (int i = 0; i < nm && st == KILN_OK; i++) {
        float *dense = q->m->wf32[mx[i].weight];
        for (int j = 1; j < mx[i].item.n && st == KILN_OK; j++) {
            float *qv = quant_dequant(q, mx[i].weight, mx[i].dtype[j], err);
            if (!qv) return KILN_ERR_NOMEM;
            q->m->wf32[mx[i].weight] = qv;
            st = evaluate(q, false, &mx[i].item.damage[j], &mx[i].nll[j], err);
            mx[i].item.damage[j] -= q->base_kl; /* what the matrix adds to the base */
            mx[i].nll[j] -= q->base_nll;
            q->m->wf32[mx[i].weight] = dense;
            free(qv);
            kiln_progress_update(progress, (uint64_t)++done);
        }
    }
    return st;
}

/* The chosen mix, every matrix replaced at once: its mean KL and NLL change. */
static kiln_status measure_mix(qa_ctx *q, const qa_matrix *mx, int nm, const int *pick, double *kl, double *dnll,
                               kiln_error *err) {
    float **dense = calloc((size_t)nm, sizeof *dense);
    kiln_status st = dense ? KILN_OK : kiln_err(err, KILN_ERR_NOMEM, "out of memory");
    for (int i = 0; i < nm && st == KILN_OK; i++) {
        if (!pick[i]) continue;
        float *qv = quant_dequant(q, mx[i].weight, mx[i].dtype[pick[i]], err);
        if (!qv) {
            st = KILN_ERR_NOMEM;
            break;
        }
        dense[i] = q->m->wf32[mx[i].weight];
        q->m->wf32[mx[i].weight] = qv;
    }
    if (st == KILN_OK) st = evaluate(q, false, kl, dnll, err);
    for (int i = 0; i < nm && dense; i++)
        if (dense[i]) {
            free(q->m->wf32[mx[i].weight]);
            q->m->wf32[mx[i].weight] = dense[i];
        }
    free(dense);
    return st;
}

/* --max-ppl-increase P: the least byte budget (bisected between the smallest and the largest mix, to
 * a 1/1000 of their difference or 4 KB) whose least-KL mix measures a calibration perplexity at most
 * P% over the reference; the measured perplexity need not fall strictly as the budget grows, so this
 * is the bisection's answer, not a search of every budget. *budget, pick and the mix's KL and NLL
 * change are the answer's (the largest mix, every matrix kept, always qualifies). */
static kiln_status bisect_ppl(qa_ctx *q, const kiln_compile_options *opt, const qa_matrix *mx,
                              const kiln_quant_item *items, int nm, uint64_t fixed, uint64_t keep_all, int *pick,
                              uint64_t *budget, double *kl, double *dnll, kiln_error *err) {
    const double limit = log1p(opt->max_ppl_increase / 100);
    int *trial = malloc((size_t)nm * sizeof *trial);
    if (!trial) return kiln_err(err, KILN_ERR_NOMEM, "out of memory");
    uint64_t least = 0; /* the projections' bytes in the smallest mix */
    for (int i = 0; i < nm; i++) {
        uint64_t s = items[i].bytes[0];
        for (int j = 1; j < items[i].n; j++) s = items[i].bytes[j] < s ? items[i].bytes[j] : s;
        least += s;
    }
    if (q->base_nll > limit) {
        free(trial);
        kiln_err(err, KILN_ERR_INVALID_ARG, "--max-ppl-increase %g: the LM head and embedding in their formats "
                 "alone raise the calibration perplexity by %.3f%%", opt->max_ppl_increase, expm1(q->base_nll) * 100);
        return kiln_err_hint(err, "allow more, or keep them denser (--quant-head, --quant-embedding)");
    }
    for (int i = 0; i < nm; i++) pick[i] = 0; /* every matrix kept: the largest mix, which holds (above) */
    *kl = q->base_kl, *dnll = q->base_nll;
    const uint64_t tol = (keep_all - least) / 1000 > 4096 ? (keep_all - least) / 1000 : 4096;
    kiln_progress_phase(opt->progress, "bisect the budget", 0, NULL, 0);
    kiln_status st = KILN_OK;
    /* the smallest mix first, then halve [lo, hi): lo fails, hi holds */
    uint64_t lo = least, hi = keep_all;
    for (uint64_t b = least; st == KILN_OK && b < hi; b = lo + (hi - lo) / 2) {
        uint64_t unused;
        double tk = 0, tn = 0;
        if ((st = kiln_quant_choose(items, nm, b, KILN_PLAN_WEIGHT_ALIGN, trial, &unused, err)) != KILN_OK ||
            (st = measure_mix(q, mx, nm, trial, &tk, &tn, err)) != KILN_OK)
            break;
        if (tn <= limit) {
            hi = b, *kl = tk, *dnll = tn;
            memcpy(pick, trial, (size_t)nm * sizeof *pick);
        } else {
            lo = b;
        }
        if (hi - lo <= tol) break;
    }
    free(trial);
    *budget = fixed + hi;
    return st;
}

/* The picks by name for the pass quantize, and meta build.quant.auto. */
static kiln_status record(const qa_ctx *q, const kiln_compile_options *opt, const qa_matrix *mx, int nm,
                          const int *pick, const uint64_t sizes[4], uint64_t elems, const double m[4],
                          json_t *calib, kiln_quant_auto *out, kiln_error *err) {
    const kiln_plan *p = q->m->plan;
    out->picks = calloc((size_t)nm, sizeof *out->picks);
    json_t *mats = json_array(), *mix = json_object();
    int counts[KILN_DTYPE_COUNT_] = {0};
    double predicted = q->base_kl;
    uint64_t bytes = sizes[1];
    for (int i = 0; out->picks && i < nm; i++) {
        snprintf(out->picks[i].name, sizeof out->picks[i].name, "%s", p->weights[mx[i].weight].name);
        out->picks[i].dtype = mx[i].dtype[pick[i]];
        counts[pick[i] ? mx[i].dtype[pick[i]] : (int)p->weights[mx[i].weight].dtype]++;
        predicted += mx[i].item.damage[pick[i]];
        bytes += mx[i].item.bytes[pick[i]];
        json_array_append_new(mats, matrix_json(q, &mx[i], pick[i]));
    }
    out->n_picks = nm;
    for (int d = 0; d < KILN_DTYPE_COUNT_; d++)
        if (counts[d]) json_object_set_new(mix, kiln_dtype_name((kiln_dtype)d), json_integer(counts[d]));
    json_object_set_new(calib, "tokens", json_integer(q->n_toks));
    json_object_set_new(calib, "positions", json_integer(q->positions));
    json_object_set_new(calib, "sequence", json_integer(q->seq));
    json_t *bud = opt->max_weight_bytes ? json_pack("{s:I}", "max_weight_bytes", (json_int_t)sizes[0])
                  : opt->target_bits  ? json_pack("{s:f, s:I}", "target_bits", opt->target_bits, "max_weight_bytes",
                                                  (json_int_t)sizes[0])
                                      : json_pack("{s:f, s:I}", "max_ppl_increase", opt->max_ppl_increase,
                                                  "max_weight_bytes", (json_int_t)sizes[0]);
    out->report = json_pack(
        "{s:o, s:I, s:f, s:I, s:I, s:O, s:s, s:f, s:f, s:f, s:f, s:f, s:f, s:o, s:o}", "budget", bud,
        "weight_bytes", (json_int_t)bytes, "bits_per_weight", (double)bytes * 8 / (double)elems, "smallest_bytes",
        (json_int_t)sizes[2], "largest_bytes", (json_int_t)sizes[3], "calibration", calib, "metric",
        "mean KL(unquantized || quantized) of the next-token distributions over the calibration positions, nats; "
        "NLL change in nats per token; base: the LM head and embedding's formats alone; a matrix's kl: what it "
        "adds to the base; predicted: base + the matrices'",
        "reference_nll", m[0], "base_kl", q->base_kl, "base_nll_change", q->base_nll, "predicted_kl", predicted,
        "measured_kl", m[1], "measured_nll_change", m[2], "mix", mix, "matrices", mats);
    return out->picks && out->report ? KILN_OK : kiln_err(err, KILN_ERR_NOMEM, "out of memory");
}

/* Calibration tokens, the matrices and their options, the budget; then measure, choose, measure the mix. */
static kiln_status choose(const char *ckpt_dir, const kiln_compile_options *opt, kiln_model *m,
                          kiln_quant_auto *out, kiln_error *err) {
    const kiln_plan *p = m->plan;
    qa_ctx q = {.m = m, .V = (int)p->vocab_size, .method = opt->quant_method};
    int32_t *ids = NULL;
    size_t n_ids = 0;
    json_t *calib = NULL;
    int bw[2], bdt[2], nb = 0; /* the head and embedding: plan weights, formats, their dense values */
    float *bdense[2] = {NULL, NULL};
    qa_matrix *mx = calloc(p->n_weights ? p->n_weights : 1, sizeof *mx);
    int *pick = calloc(p->n_weights ? p->n_weights : 1, sizeof *pick);
    kiln_quant_item *items = calloc(p->n_weights ? p->n_weights : 1, sizeof *items);
    kiln_status st = mx && pick && items ? KILN_OK : kiln_err(err, KILN_ERR_NOMEM, "out of memory");
    if (st == KILN_OK) st = kiln_calib_tokens(opt, m, "--quant auto", &ids, &n_ids, &calib, err);
    if (st != KILN_OK) goto out;
    if (n_ids < MIN_CALIB_TOKENS) {
        st = kiln_err(err, KILN_ERR_INVALID_ARG, "--quant auto: the calibration (%s) has %zu tokens; at least %d "
                      "are needed", opt->calib_ids_path ? opt->calib_ids_path : opt->calib_path ? opt->calib_path
                                                                                               : "built-in text",
                      n_ids, MIN_CALIB_TOKENS);
        goto out;
    }
    /* sequences of at most the context; every position with a next token is scored */
    q.toks = ids;
    q.n_toks = n_ids < (size_t)opt->calib_tokens ? (int)n_ids : opt->calib_tokens;
    q.seq = q.n_toks < (int)p->max_context ? q.n_toks : (int)p->max_context;
    for (int s0 = 0; s0 + 1 < q.n_toks; s0 += q.seq)
        q.positions += q.n_toks - s0 < q.seq ? q.n_toks - s0 - 1 : q.seq - 1;
    const int nm = list_matrices(p, mx, (int)p->n_weights);
    if (nm == 0) {
        st = kiln_err(err, KILN_ERR_UNSUPPORTED, "--quant auto: %s has no projection matrix to quantize", ckpt_dir);
        goto out;
    }
    /* the budget counts the weights section, as `kiln inspect` does */
    uint64_t keep_all = 0, elems = 0, budget = 0, min_bytes = 0;
    for (int i = 0; i < nm; i++) keep_all += mx[i].item.bytes[0];
    for (uint32_t w = 0; w < p->n_weights; w++) {
        uint64_t e = 1;
        for (uint32_t d = 0; d < p->weights[w].ndim; d++) e *= (uint64_t)p->weights[w].shape[d];
        elems += e;
    }
    /* the head and embedding in their formats: fixed in every mix */
    nb = base_weights(p, opt, bw, bdt);
    uint64_t fixed = m->weights_size;
    for (int b = 0; b < nb; b++)
        fixed += kiln_align_up(kiln_weight_nbytes(bdt[b], 2, p->weights[bw[b]].shape), KILN_PLAN_WEIGHT_ALIGN);
    for (int b = 0; b < nb; b++) fixed -= kiln_align_up(p->weights[bw[b]].nbytes, KILN_PLAN_WEIGHT_ALIGN);
    fixed -= keep_all;
    if ((st = check_budget(opt, mx, nm, fixed, elems, &budget, err)) != KILN_OK) goto out;
    q.logits = malloc((size_t)q.seq * (size_t)q.V * sizeof(float));
    q.ref = malloc((size_t)q.positions * (size_t)q.V * sizeof(float));
    q.row_kl = malloc((size_t)q.positions * sizeof(double));
    q.row_nll = malloc((size_t)q.positions * sizeof(double));
    q.ref_nll = malloc((size_t)q.positions * sizeof(float));
    if (!q.logits || !q.ref || !q.row_kl || !q.row_nll || !q.ref_nll) {
        st = kiln_err(err, KILN_ERR_NOMEM, "--quant auto: out of memory for %d positions of %d logits", q.positions,
                      q.V);
        goto out;
    }
    double measured[4] = {0}; /* reference NLL, the mix's KL and NLL change */
    if ((st = kiln_cpu_ctx_new(m, q.seq, q.seq, kiln_pool_ways(kiln_pool_shared()), &q.c, err)) != KILN_OK) {
        kiln_err_prefix(err, "--quant auto: the CPU executor: ");
        goto out;
    }
    if ((st = evaluate(&q, true, NULL, NULL, err)) != KILN_OK) goto out;
    for (int b = 0; b < nb; b++) {
        float *qv = quant_dequant(&q, bw[b], bdt[b], err);
        if (!qv) {
            st = KILN_ERR_NOMEM;
            goto out;
        }
        bdense[b] = m->wf32[bw[b]];
        m->wf32[bw[b]] = qv;
    }
    if ((st = evaluate(&q, false, &q.base_kl, &q.base_nll, err)) != KILN_OK ||
        (st = measure_each(&q, mx, nm, opt->progress, err)) != KILN_OK)
        goto out;
    for (int r = 0; r < q.positions; r++) measured[0] += q.ref_nll[r];
    measured[0] /= q.positions;
    for (int i = 0; i < nm; i++) items[i] = mx[i].item;
    if (opt->max_ppl_increase > 0) {
        st = bisect_ppl(&q, opt, mx, items, nm, fixed, keep_all, pick, &budget, &measured[1], &measured[2], err);
        if (st != KILN_OK) goto out;
        for (int i = 0; i < nm; i++) { /* the smallest mix's size, for the record */
            uint64_t s = items[i].bytes[0];
            for (int j = 1; j < items[i].n; j++) s = items[i].bytes[j] < s ? items[i].bytes[j] : s;
            min_bytes += s;
        }
    } else {
        if ((st = kiln_quant_choose(items, nm, budget - fixed, KILN_PLAN_WEIGHT_ALIGN, pick, &min_bytes, err)) != KILN_OK) goto out;
        kiln_progress_phase(opt->progress, "calibrate the mix", 0, NULL, 0);
        if ((st = measure_mix(&q, mx, nm, pick, &measured[1], &measured[2], err)) != KILN_OK) goto out;
    }
    const uint64_t sizes[4] = {budget, fixed, fixed + min_bytes, fixed + keep_all};
    st = record(&q, opt, mx, nm, pick, sizes, elems, measured, calib, out, err);
out:
    for (int b = 0; b < nb; b++)
        if (bdense[b]) {
            free(m->wf32[bw[b]]);
            m->wf32[bw[b]] = bdense[b];
        }
    json_decref(calib);
    kiln_cpu_ctx_free(q.c);
    free(q.logits), free(q.ref), free(q.row_kl), free(q.row_nll), free(q.ref_nll);
    free(ids), free(mx), free(pick), free(items);
    return st;
}

kiln_status kiln_calib_model(const char *ckpt_dir, const kiln_compile_options *opt, const char *what,
                             const char *passes, kiln_model **out, kiln_error *err) {
    *out = NULL;
    const size_t n = strlen(opt->output_path) + 32;
    char *path = malloc(n);
    if (!path) return kiln_err(err, KILN_ERR_NOMEM, "out of memory");
    snprintf(path, n, "%s.calib.XXXXXX", opt->output_path);
    int fd = mkstemp(path); /* reserves the name; kiln_compile renames over it */
    if (fd < 0) {
        kiln_err(err, KILN_ERR_IO, "%s: cannot create the calibration engine beside it", opt->output_path);
        free(path);
        return KILN_ERR_IO;
    }
    close(fd);
    const int slot = kiln_guard_temp_add(path);
    kiln_progress_phase(opt->progress, "calibration engine", 0, NULL, 0);
    kiln_status st = calibration_engine(ckpt_dir, opt, what, passes, path, err);
    if (st == KILN_OK && (st = kiln_model_open(path, kiln_pool_ways(kiln_pool_shared()), out, err)) != KILN_OK) {
        kiln_err_prefix(err, "%s: the CPU executor cannot open the calibration engine: ", what);
        kiln_err_hint(err, "calibration runs on the CPU executor, which holds every weight as f32; without it, "
                           "use --quant int8|int4 alone");
    }
    unlink(path); /* mapped: the pages stay until the model is freed */
    kiln_guard_temp_remove(slot);
    free(path);
    return st;
}

kiln_status kiln_quant_auto_run(const char *ckpt_dir, const kiln_compile_options *opt, kiln_quant_auto *out,
                                kiln_error *err) {
    memset(out, 0, sizeof *out);
    kiln_model *m = NULL;
    kiln_status st = kiln_calib_model(ckpt_dir, opt, "--quant auto", NULL, &m, err);
    if (st == KILN_OK) st = choose(ckpt_dir, opt, m, out, err);
    kiln_model_close(m);
    if (st != KILN_OK) kiln_quant_auto_free(out);
    return st;
}

void kiln_quant_auto_free(kiln_quant_auto *qa) {
    free(qa->picks);
    json_decref(qa->report);
    memset(qa, 0, sizeof *qa);
}
