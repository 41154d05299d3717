/*
 * test_sched.c — the sampler, the CPU executor behind the scheduler, and the
 * continuous-batching scheduler, on real engines compiled from
 * models/stories260k, tests/data/tiny-mistral and tests/data/tiny-llama3.
 *
 * The oracle for "batched = alone" is twofold: the HF greedy ids of
 * tests/golden/<model>/golden.json (made by tests/golden/make_goldens.py),
 * and kiln_generate, a separate one-sequence loop that never goes through
 * the scheduler. Sampling is checked against a brute-force reference
 * sampler written here (full sort, HF's warper order).
 */
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "compiler/kiln_compiler.h"
#include "kt.h"
#include "kt_fixture.h"
#include "runtime/kiln_exec.h"
#include "runtime/kiln_rt.h"
#include "runtime/kiln_sched.h"

static char tmpdir[256];
static kiln_model *stories, *mistral, *llama3;

/* ---- fixtures ---- */

static kiln_model *compile_and_open(const char *ckpt_rel, const char *name) {
    char ckpt[1024], out[512];
    snprintf(ckpt, sizeof ckpt, "%s/%s", KILN_SOURCE_DIR, ckpt_rel);
    snprintf(out, sizeof out, "%s/%s.kiln", tmpdir, name);
    kiln_compile_options opt = {.output_path = out, .weight_dtype = KILN_DTYPE_COUNT_};
    if (kt_compile(ckpt, &opt) != KILN_OK) return NULL;
    kiln_error err = {0};
    kiln_model *m = NULL;
    if (kiln_model_open(out, 1, &m, &err) != KILN_OK) fprintf(stderr, "  open %s: %s\n", out, err.msg);
    unlink(out);
    return m;
}

typedef struct golden_case {
    int32_t prompt[64];
    int n_prompt;
    int32_t greedy[128];
    int n_greedy;
    int eos_index; /* -1 when greedy never hits eos */
} golden_case;

static int load_golden(const char *model_rel, golden_case *cases, int max_cases) {
    char path[1024];
    snprintf(path, sizeof path, "%s/tests/golden/%s/golden.json", KILN_SOURCE_DIR, model_rel);
    json_error_t je;
    json_t *g = json_load_file(path, 0, &je);
    if (!g) return 0;
    json_t *cs = json_object_get(g, "cases");
    int n = 0;
    for (size_t i = 0; i < json_array_size(cs) && n < max_cases; i++) {
        json_t *c = json_array_get(cs, i);
        json_t *p = json_object_get(c, "prompt"), *gr = json_object_get(c, "greedy");
        golden_case *gc = &cases[n];
        if (json_array_size(p) > 64 || json_array_size(gr) > 128) continue;
        gc->n_prompt = (int)json_array_size(p);
        gc->n_greedy = (int)json_array_size(gr);
        for (int k = 0; k < gc->n_prompt; k++) gc->prompt[k] = (int32_t)json_integer_value(json_array_get(p, (size_t)k));
        for (int k = 0; k < gc->n_greedy; k++) gc->greedy[k] = (int32_t)json_integer_value(json_array_get(gr, (size_t)k));
        json_t *ei = json_object_get(c, "eos_index");
        gc->eos_index = json_is_integer(ei) ? (int)json_integer_value(ei) : -1;
        n++;
    }
    json_decref(g);
    return n;
}

/* ---- a job: one request and what came back ---- */

typedef struct job {
    const int32_t *prompt;
    int n_prompt;
    kiln_sampling samp;
    int max_tokens;
    bool ignore_eos;
    int submit_step; /* submitted before this step */
    bool use_cb;     /* callback delivery, else polling */
    int cancel_after; /* callback mode: return non-zero after this many tokens (0 = never) */
    kiln_penalties pen; /* zeros = none */
    int logprobs;       /* > 0: this many alternatives through the info callback (use_cb) */
    float lp[600];      /* the delivered log-probability of each token */
    int prompt_lp;      /* > 0: prompt log-probabilities with prompt_lp - 1 alternatives (use_cb) */
    int cancel_at_pos;  /* > 0: cancel from the prompt log-probability of this position */
    float plp[64];      /* the prompt's, position 1 on */
    int n_plp, plp_bad; /* delivered; delivered out of order, twice, after a generated token or wrong */
    int32_t top0[600];  /* the most likely alternative of each token */
    /* results */
    int64_t id;
    kiln_status submit_status;
    int32_t got[600];
    int n_got;
    int stop;
    bool done;
    int cb_calls_after_done;
} job;

static int32_t job_cb(void *user, int64_t id, int32_t token, int32_t finished, int32_t reason) {
    job *j = user;
    if (j->done) j->cb_calls_after_done++;
    KT_CHECK(id == j->id);
    if (token >= 0 && j->n_got < 600) j->got[j->n_got++] = token;
    if (finished) {
        j->done = true;
        j->stop = reason;
    } else {
        KT_EQ_INT(reason, -1);
    }
    return j->cancel_after > 0 && j->n_got >= j->cancel_after;
}

static int32_t job_info_cb(void *user, int64_t id, const kiln_token_info *t, int32_t finished, int32_t reason) {
    job *j = user;
    if (t && t->prompt) {
        const bool ok = !finished && j->n_got == 0 && t->position == j->n_plp + 1 && t->position < j->n_prompt &&
                        t->token == j->prompt[t->position] && t->n_top == j->prompt_lp - 1 && j->n_plp < 64;
        if (!ok) {
            j->plp_bad++;
            return 0;
        }
        for (int i = 1; i < t->n_top; i++) KT_CHECK(t->top_logprob[i] <= t->top_logprob[i - 1]);
        if (t->n_top > 0) KT_CHECK(t->top_logprob[0] >= t->logprob);
        j->plp[j->n_plp++] = t->logprob;
        return j->cancel_at_pos > 0 && t->position >= j->cancel_at_pos;
    }
    if (t) KT_EQ_INT(t->position, j->n_prompt + j->n_got);
    if (t && j->n_got < 600) {
        j->lp[j->n_got] = t->logprob;
        KT_EQ_INT(t->n_top, j->logprobs);
        j->top0[j->n_got] = t->n_top > 0 ? t->top_token[0] : -1;
        for (int i = 1; i < t->n_top; i++) KT_CHECK(t->top_logprob[i] <= t->top_logprob[i - 1]);
    }
    return job_cb(user, id, t ? t->token : -1, finished, reason);
}

static int g_lookahead; /* kv_lookahead of the schedulers run_jobs makes (0 = default) */
static bool g_last_rows; /* run_jobs' executors return only each sequence's last row of logits */

static kiln_sampling greedy(void) { return (kiln_sampling){.temperature = 0, .top_p = 1}; }

static void poll_job(kiln_sched *s, job *j) {
    if (j->use_cb || j->done || j->id <= 0) return;
    int n = 0, why = -1;
    bool fin = false;
    kiln_error err = {0};
    KT_CHECK(kiln_sched_poll(s, j->id, j->got + j->n_got, 600 - j->n_got, &n, &fin, &why, &err) == KILN_OK);
    j->n_got += n;
    if (fin) {
        j->done = true;
        j->stop = why;
    }
}

/* Run jobs through a scheduler over a fresh CPU executor. Returns the stats. */
static kiln_sched_stats run_jobs(const kiln_model *m, int max_seqs, int max_context, int64_t kv_tokens, int max_step,
                                 job *jobs, int n_jobs) {
    kiln_sched_stats st = {0};
    kiln_executor *x = NULL;
    kiln_sched *s = NULL;
    kiln_error err = {0};
    if (kiln_cpu_executor_new(m, max_seqs, max_context, kv_tokens, 2, &x, &err) != KILN_OK) {
        KT_CHECKF(0, "executor: %s", err.msg);
        return st;
    }
    kiln_sched_opts so = {
        .max_step_tokens = max_step, .eos_ids = m->eos_ids, .n_eos = m->n_eos, .kv_lookahead = g_lookahead};
    if (kiln_sched_new(x, &so, &s, &err) != KILN_OK) {
        KT_CHECKF(0, "scheduler: %s", err.msg);
        x->ops->destroy(x);
        return st;
    }
    if (g_last_rows) x->all_logits = false;
    for (int step = 0; step < 100000; step++) {
        bool more = false;
        for (int i = 0; i < n_jobs; i++) {
            job *j = &jobs[i];
            if (j->submit_step == step) {
                kiln_sched_request r = {.prompt = j->prompt,
                                        .n_prompt = j->n_prompt,
                                        .samp = j->samp,
                                        .max_tokens = j->max_tokens,
                                        .ignore_eos = j->ignore_eos,
                                        .cb = j->use_cb && !j->logprobs && !j->prompt_lp ? job_cb : NULL,
                                        .cb_info = j->use_cb && (j->logprobs || j->prompt_lp) ? job_info_cb : NULL,
                                        .prompt_logprobs = j->prompt_lp > 0,
                                        .prompt_top_logprobs = j->prompt_lp - 1,
                                        .pen = j->pen,
                                        .logprobs = j->logprobs > 0,
                                        .top_logprobs = j->logprobs,
                                        .user = j};
                j->submit_status = kiln_sched_submit(s, &r, &j->id, &err);
                if (j->submit_status != KILN_OK) j->done = true;
            }
            if (j->submit_step > step) more = true;
        }
        KT_CHECKF(kiln_sched_step(s, NULL, &err) == KILN_OK, "step %d: %s", step, err.msg);
        for (int i = 0; i < n_jobs; i++) poll_job(s, &jobs[i]);
        if (!more && kiln_sched_pending(s) == 0) break;
    }
    for (int i = 0; i < n_jobs; i++) poll_job(s, &jobs[i]);
    kiln_sched_get_stats(s, &st);
    kiln_sched_free(s);
    x->ops->destroy(x);
    for (int i = 0; i < n_jobs; i++) {
        KT_CHECKF(jobs[i].done, "job %d never finished", i);
        KT_EQ_INT(jobs[i].cb_calls_after_done, 0);
    }
    return st;
}

/* The job alone through kiln_generate: one sequence, no scheduler. */
static void run_alone(const kiln_model *m, int max_context, const job *tmpl, job *out) {
    *out = *tmpl;
    out->n_got = 0;
    out->done = false;
    kiln_cpu_ctx *c = NULL;
    kiln_error err = {0};
    KT_REQUIRE(kiln_cpu_ctx_new(m, max_context, 7, 1, &c, &err) == KILN_OK);
    kiln_generate_opts go = {.max_tokens = tmpl->max_tokens,
                             .temperature = tmpl->samp.temperature,
                             .top_k = tmpl->samp.top_k,
                             .top_p = tmpl->samp.top_p,
                             .seed = tmpl->samp.seed,
                             .ignore_eos = tmpl->ignore_eos};
    kiln_generate_result r;
    KT_CHECKF(kiln_generate(c, tmpl->prompt, tmpl->n_prompt, &go, &r, &err) == KILN_OK, "%s", err.msg);
    for (int i = 0; i < r.n_ids && i < 600; i++) out->got[out->n_got++] = r.ids[i];
    out->stop = (int)r.stop;
    out->done = true;
    free(r.ids);
    kiln_cpu_ctx_free(c);
}

/* The job alone through the scheduler, with one slot. */
static void run_alone_sched(const kiln_model *m, int max_context, const job *tmpl, job *out) {
    *out = *tmpl;
    out->submit_step = 0;
    out->n_got = 0;
    out->done = false;
    run_jobs(m, 1, max_context, 0, 0, out, 1);
}

static void expect_same_tokens(const job *a, const job *b, const char *what, int idx) {
    KT_CHECKF(a->n_got == b->n_got, "%s job %d: %d tokens batched vs %d alone", what, idx, a->n_got, b->n_got);
    KT_CHECKF(a->stop == b->stop, "%s job %d: stop %d batched vs %d alone", what, idx, a->stop, b->stop);
    for (int i = 0; i < a->n_got && i < b->n_got; i++)
        if (a->got[i] != b->got[i]) {
            KT_CHECKF(0, "%s job %d: token %d is %d batched but %d alone", what, idx, i, a->got[i], b->got[i]);
            return;
        }
}

/* ---- the sampler ---- */

/* Brute force: rank all ids by (logit desc, id asc), softmax with T,
 * keep top-k, renormalise, keep while the mass before a token is < top_p,
 * pick the first whose cumulative mass exceeds u × kept mass. */
static const float *ref_logits_;
static int ref_by_rank(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    float lx = ref_logits_[x], ly = ref_logits_[y];
    if (lx != ly) return lx > ly ? -1 : 1;
    return x < y ? -1 : 1;
}

static int32_t ref_sample(const float *logits, int vocab, const kiln_sampling *s, double u) {
    int32_t *ids = malloc((size_t)vocab * sizeof *ids);
    double *p = malloc((size_t)vocab * sizeof *p);
    for (int i = 0; i < vocab; i++) ids[i] = i;
    ref_logits_ = logits;
    qsort(ids, (size_t)vocab, sizeof *ids, ref_by_rank);
    if (s->temperature == 0 || s->top_k == 1) {
        int32_t r = ids[0];
        free(ids);
        free(p);
        return r;
    }
    float mx = logits[ids[0]];
    for (int i = 0; i < vocab; i++) p[i] = (double)expf((logits[ids[i]] - mx) / s->temperature);
    int keep = s->top_k > 0 && s->top_k < vocab ? s->top_k : vocab;
    double mass = 0;
    if (keep < vocab)
        for (int i = 0; i < keep; i++) mass += p[i]; /* rank order, as kiln pops them */
    else
        for (int i = 0; i < vocab; i++) mass += (double)expf((logits[i] - mx) / s->temperature); /* id order */
    if (s->top_p < 1) {
        double before = 0, want = (double)s->top_p * mass;
        int k = 0;
        while (k < keep && (k == 0 || before < want)) before += p[k++];
        keep = k;
    }
    if (s->min_p > 0)
        while (keep > 1 && !(p[keep - 1] >= s->min_p)) keep--;
    /* the draw walks the kept ids in id order */
    double *pid = calloc((size_t)vocab, sizeof *pid);
    for (int i = 0; i < keep; i++) pid[ids[i]] = p[i];
    double kept = 0;
    for (int i = 0; i < vocab; i++) kept += pid[i];
    double r = u * kept, cum = 0;
    int32_t pick = -1;
    for (int i = 0; i < vocab; i++) {
        if (pid[i] == 0) continue;
        pick = i; /* the last kept id if rounding leaves none */
        cum += pid[i];
        if (r < cum) break;
    }
    free(pid);
    free(ids);
    free(p);
    return pick;
}

static void test_sample_uniform(void) {
    double sum = 0;
    int n = 20000;
    for (int i = 0; i < n; i++) {
        double u = kiln_sample_uniform(42, i);
        KT_REQUIRE(u >= 0 && u < 1);
        sum += u;
    }
    KT_CHECKF(fabs(sum / n - 0.5) < 0.01, "mean %g", sum / n);
    KT_CHECK(kiln_sample_uniform(42, 7) == kiln_sample_uniform(42, 7));
    KT_CHECK(kiln_sample_uniform(42, 7) != kiln_sample_uniform(43, 7));
    KT_CHECK(kiln_sample_uniform(42, 7) != kiln_sample_uniform(42, 8));
    KT_CHECK(kiln_sample_uniform(0, 0) != kiln_sample_uniform(0, 1));
}

static void test_sample_greedy_and_ties(void) {
    float l[6] = {1, 5, 3, 5, -2, 5};
    float scratch[12];
    kiln_sampling g = {.temperature = 0, .top_p = 1};
    KT_EQ_INT(kiln_sample_logits(l, 6, &g, 0.99, scratch), 1); /* ties: lowest id */
    KT_EQ_INT(kiln_argmax(l, 6), 1);
    kiln_sampling k1 = {.temperature = 1, .top_k = 1, .top_p = 1};
    KT_EQ_INT(kiln_sample_logits(l, 6, &k1, 0.99, scratch), 1);
    /* top-k 3 over the three tied 5s: u splits evenly, ids in rank order 1, 3, 5 */
    kiln_sampling k3 = {.temperature = 1, .top_k = 3, .top_p = 1};
    KT_EQ_INT(kiln_sample_logits(l, 6, &k3, 0.1, scratch), 1);
    KT_EQ_INT(kiln_sample_logits(l, 6, &k3, 0.5, scratch), 3);
    KT_EQ_INT(kiln_sample_logits(l, 6, &k3, 0.9, scratch), 5);
    /* NaN never wins the argmax; but a row holding a NaN or +inf, or nothing above -inf, gives no
     * token, greedy or not (rule 0) */
    float n[3] = {NAN, -1, -3};
    KT_EQ_INT(kiln_argmax(n, 3), 1);
    kiln_sampling t = {.temperature = 1, .top_p = 1}, tk = {.temperature = 0.7f, .top_k = 2, .top_p = 0.9f};
    const float bad[][3] = {{NAN, -1, -3}, {-1, 2, NAN}, {INFINITY, 0, 1}, {0, 1, INFINITY},
                            {-INFINITY, -INFINITY, -INFINITY}, {NAN, NAN, NAN}, {-INFINITY, NAN, -INFINITY}};
    for (size_t r = 0; r < sizeof bad / sizeof bad[0]; r++) {
        KT_EQ_INT(kiln_sample_logits(bad[r], 3, &g, 0.5, scratch), KILN_TOKEN_NONFINITE);
        KT_EQ_INT(kiln_sample_logits(bad[r], 3, &tk, 0.5, scratch), KILN_TOKEN_NONFINITE);
        for (int i = 0; i < 10; i++) KT_EQ_INT(kiln_sample_logits(bad[r], 3, &t, i / 10.0, scratch), KILN_TOKEN_NONFINITE);
    }
    /* -inf alone is a masked id: never drawn */
    float m[3] = {-INFINITY, 0.5f, -INFINITY};
    KT_EQ_INT(kiln_sample_logits(m, 3, &g, 0.5, scratch), 1);
    for (int i = 0; i < 10; i++) KT_EQ_INT(kiln_sample_logits(m, 3, &t, i / 10.0, scratch), 1);
    /* one-token vocabulary */
    float one[1] = {0};
    KT_EQ_INT(kiln_sample_logits(one, 1, &t, 0.7, scratch), 0);
}

/* Against the brute-force reference over random logits (with ties and
 * -inf), vocab
 * sizes 1, 2, 7, 100, 4097, settings of T, k, p, many u. */
static void test_sample_matches_reference(void) {
    const int vocabs[] = {1, 2, 7, 100, 4097};
    const kiln_sampling settings[] = {
        {.temperature = 1, .top_k = 0, .top_p = 1},      {.temperature = 0.8f, .top_k = 40, .top_p = 0.9f},
        {.temperature = 0.5f, .top_k = 5, .top_p = 1},   {.temperature = 1.3f, .top_k = 0, .top_p = 0.5f},
        {.temperature = 1, .top_k = 3, .top_p = 0.3f},   {.temperature = 2, .top_k = 5000, .top_p = 0.95f},
        {.temperature = 0.01f, .top_k = 0, .top_p = 1},   {.temperature = 3, .top_k = 0, .top_p = 0.99f},
        {.temperature = 0.7f, .top_k = 0, .top_p = 0.05f},
        {.temperature = 1, .top_p = 1, .min_p = 0.1f},    {.temperature = 0.8f, .top_k = 40, .top_p = 0.9f, .min_p = 0.05f},
        {.temperature = 1.3f, .top_p = 0.5f, .min_p = 0.3f}, {.temperature = 2, .top_p = 1, .min_p = 0.5f},
        {.temperature = 1, .top_k = 5, .top_p = 1, .min_p = 0.9f}, {.temperature = 0.9f, .top_p = 0.99f, .min_p = 1},
    };
    uint64_t rng = 12345;
    int checked = 0, mismatches = 0;
    for (size_t vi = 0; vi < sizeof vocabs / sizeof vocabs[0]; vi++) {
        int v = vocabs[vi];
        float *l = malloc((size_t)v * sizeof *l), *scratch = malloc(2 * (size_t)v * sizeof *scratch);
        for (int i = 0; i < v; i++) {
            rng = rng * 6364136223846793005ull + 1442695040888963407ull;
            l[i] = (float)((int)(rng >> 40) % 200) / 20.0f; /* coarse: many ties */
            if (i % 13 == 5) l[i] = -INFINITY;                /* masked tokens */
        }
        for (size_t si = 0; si < sizeof settings / sizeof settings[0]; si++)
            for (int t = 0; t < 40; t++) {
                double u = kiln_sample_uniform(si, t);
                int32_t a = kiln_sample_logits(l, v, &settings[si], u, scratch);
                int32_t b = ref_sample(l, v, &settings[si], u);
                checked++;
                if (a != b) {
                    if (mismatches++ < 5)
                        fprintf(stderr, "  vocab %d setting %zu u %.6f: kiln %d, reference %d\n", v, si, u, a, b);
                }
            }
        free(l);
        free(scratch);
    }
    KT_CHECKF(mismatches == 0, "%d of %d draws differ from the reference sampler", mismatches, checked);
}

/* A sampled distribution follows softmax: over many u, token frequencies
 * match the probabilities within a few standard errors. */
static void test_sample_distribution(void) {
    float l[4] = {2.0f, 1.0f, 0.0f, -1.0f};
    float scratch[8];
    kiln_sampling s = {.temperature = 1, .top_p = 1};
    int count[4] = {0};
    int n = 40000;
    for (int i = 0; i < n; i++) count[kiln_sample_logits(l, 4, &s, kiln_sample_uniform(9, i), scratch)]++;
    double z = 0;
    for (int i = 0; i < 4; i++) z += exp(l[i]);
    for (int i = 0; i < 4; i++) {
        double p = exp(l[i]) / z, f = (double)count[i] / n, se = sqrt(p * (1 - p) / n);
        KT_CHECKF(fabs(f - p) < 5 * se, "token %d: frequency %.4f vs probability %.4f", i, f, p);
    }
    /* top-p 0.7 keeps tokens 0 (0.64) and 1 (0.24): never 2 or 3 */
    kiln_sampling tp = {.temperature = 1, .top_p = 0.7f};
    for (int i = 0; i < 2000; i++) KT_CHECK(kiln_sample_logits(l, 4, &tp, kiln_sample_uniform(3, i), scratch) < 2);
}

/* Top-k over a 128k vocabulary must not sort the vocabulary per token. */
static void test_sample_large_vocab_cost(void) {
    int v = 128256;
    float *l = malloc((size_t)v * sizeof *l), *scratch = malloc(2 * (size_t)v * sizeof *scratch);
    for (int i = 0; i < v; i++) l[i] = (float)((i * 7919) % 10007) / 1000.0f;
    kiln_sampling s = {.temperature = 0.8f, .top_k = 40, .top_p = 0.9f, .seed = 1};
    double t0 = kiln_now();
    int reps = 50;
    for (int i = 0; i < reps; i++) (void)kiln_sample_logits(l, v, &s, kiln_sample_uniform(1, i), scratch);
    double per = (kiln_now() - t0) / reps;
    fprintf(stderr, "  top-k 40 / top-p 0.9 over %d logits: %.3f ms per token\n", v, per * 1e3);
    int32_t a = kiln_sample_logits(l, v, &s, 0.37, scratch), b = ref_sample(l, v, &s, 0.37);
    KT_EQ_INT(a, b);
    free(l);
    free(scratch);
}

/* ---- the CPU executor ---- */

static void test_cpu_executor_reserve(void) {
    KT_REQUIRE(stories);
    kiln_executor *x = NULL;
    kiln_error err = {0};
    KT_REQUIRE(kiln_cpu_executor_new(stories, 3, 64, 100, 1, &x, &err) == KILN_OK);
    KT_EQ_STR(x->ops->name, "cpu");
    KT_EQ_INT(x->max_seqs, 3);
    KT_EQ_INT(x->max_context, 64);
    KT_EQ_INT(x->vocab, 512);
    bool fits = false;
    KT_EQ_INT(x->ops->reserve(x, 0, 65, &fits, &err), KILN_ERR_CONTEXT);
    KT_CONTAINS(err.msg, "64-token context");
    KT_EQ_INT(x->ops->reserve(x, 3, 10, &fits, &err), KILN_ERR_INVALID_ARG);
    KT_CHECK(x->ops->reserve(x, 0, 60, &fits, &err) == KILN_OK && fits);
    KT_CHECK(x->ops->reserve(x, 1, 41, &fits, &err) == KILN_OK && !fits); /* 60 + 41 > 100 */
    KT_CHECK(x->ops->reserve(x, 1, 40, &fits, &err) == KILN_OK && fits);
    KT_CHECK(x->ops->reserve(x, 0, 50, &fits, &err) == KILN_OK && fits); /* already holds 60 */
    x->ops->release(x, 0);
    KT_CHECK(x->ops->reserve(x, 2, 60, &fits, &err) == KILN_OK && fits);
    kiln_executor_info info = {0};
    x->ops->info(x, &info);
    KT_EQ_STR(info.device_name, "cpu");
    KT_EQ_INT(info.kv_capacity_tokens, 100);

    /* a step that does not match the executor's state is refused, not run */
    int32_t slot = 1, n_new = 3, start = 5, toks[3] = {1, 2, 3}, next = -7;
    bool want = true;
    kiln_sampling sm = greedy();
    kiln_step st = {.n_seqs = 1, .slot = &slot, .n_new = &n_new, .start = &start, .tokens = toks,
                    .want_token = &want, .samp = &sm, .next = &next};
    KT_EQ_INT(x->ops->step(x, &st, &err), KILN_ERR_INTERNAL);
    KT_CONTAINS(err.msg, "cached");
    start = 0;
    slot = 0; /* released: no reserve */
    KT_EQ_INT(x->ops->step(x, &st, &err), KILN_ERR_INTERNAL);
    KT_CONTAINS(err.msg, "reserve");
    slot = 1;
    toks[1] = 512;
    KT_EQ_INT(x->ops->step(x, &st, &err), KILN_ERR_INVALID_ARG);
    KT_CONTAINS(err.msg, "vocabulary");
    x->ops->destroy(x);

    KT_EQ_INT(kiln_cpu_executor_new(stories, 0, 64, 0, 1, &x, &err), KILN_ERR_INVALID_ARG);
    KT_EQ_INT(kiln_cpu_executor_new(stories, 2, 513, 0, 1, &x, &err), KILN_ERR_INVALID_ARG);
    KT_CONTAINS(err.msg, "512");
}

/* ---- the scheduler ---- */

/* The two "alone" paths agree: the scheduler with one slot and
 * kiln_generate (chunk size 7 there, one step here), greedy and sampled. */
static void test_alone_paths_agree(void) {
    KT_REQUIRE(stories && mistral);
    const kiln_model *models[2] = {stories, mistral};
    const char *goldens[2] = {"stories260k", "tiny-mistral"}; /* each model's own prompts (vocabularies differ) */
    for (int mi = 0; mi < 2; mi++) {
        golden_case gc[3];
        KT_REQUIRE(load_golden(goldens[mi], gc, 3) == 3);
        for (int i = 0; i < 2; i++) {
            job j = {.prompt = gc[2].prompt, .n_prompt = gc[2].n_prompt, .max_tokens = 30, .ignore_eos = i == 0,
                     .samp = i ? (kiln_sampling){.temperature = 0.8f, .top_k = 40, .top_p = 0.9f, .seed = 5}
                               : greedy()};
            job a, b;
            run_alone_sched(models[mi], 0, &j, &a);
            run_alone(models[mi], 0, &j, &b);
            expect_same_tokens(&a, &b, "alone", mi * 2 + i);
        }
    }
}

/* (a) greedy: requests of different prompt lengths, admitted at different
 * steps, some polled and some by callback, give the tokens each gets alone
 * and HF's greedy ids. */
static void check_batched_greedy(const kiln_model *m, const char *golden_rel) {
    golden_case gc[6];
    int ng = load_golden(golden_rel, gc, 6);
    KT_REQUIRE(ng >= 3);
    job jobs[8];
    int nj = 0;
    for (int i = 0; i < ng; i++)
        jobs[nj++] = (job){.prompt = gc[i].prompt, .n_prompt = gc[i].n_prompt, .samp = greedy(),
                           .max_tokens = gc[i].n_greedy, .ignore_eos = true, .submit_step = 3 * i,
                           .use_cb = i % 2 == 1};
    /* and each golden prompt again later, with fewer tokens */
    for (int i = 0; i < ng && nj < 8; i++)
        jobs[nj++] = (job){.prompt = gc[i].prompt, .n_prompt = gc[i].n_prompt, .samp = greedy(),
                           .max_tokens = 20 + 3 * i, .ignore_eos = true, .submit_step = 5 + 7 * i,
                           .use_cb = i % 2 == 0};
    kiln_sched_stats st = run_jobs(m, 4, 0, 0, 0, jobs, nj);
    KT_CHECK(st.max_running >= 3); /* they really ran together */
    for (int i = 0; i < nj; i++) {
        job alone;
        run_alone(m, 0, &jobs[i], &alone);
        expect_same_tokens(&jobs[i], &alone, golden_rel, i);
        KT_EQ_INT(jobs[i].stop, KILN_STOP_MAX_TOKENS);
        const golden_case *g = &gc[i % ng];
        int same = 0;
        while (same < jobs[i].n_got && same < g->n_greedy && jobs[i].got[same] == g->greedy[same]) same++;
        KT_CHECKF(same == jobs[i].n_got, "%s job %d: differs from HF greedy at token %d", golden_rel, i, same);
    }
}

static void test_batched_greedy_stories(void) {
    KT_REQUIRE(stories);
    check_batched_greedy(stories, "stories260k");
}
static void test_batched_greedy_tiny_mistral(void) {
    KT_REQUIRE(mistral);
    check_batched_greedy(mistral, "tiny-mistral");
}

/* (b) sampling with fixed seeds (T 0.8, top-p 0.9, top-k 40). */
static void check_batched_sampling(const kiln_model *m, const char *golden_rel) {
    golden_case gc[6];
    int ng = load_golden(golden_rel, gc, 6);
    KT_REQUIRE(ng >= 3);
    job jobs[6];
    int nj = 0;
    for (int i = 0; i < 6; i++) {
        const golden_case *g = &gc[i % ng];
        jobs[nj++] = (job){.prompt = g->prompt, .n_prompt = g->n_prompt,
                           .samp = {.temperature = 0.8f, .top_k = 40, .top_p = 0.9f, .seed = 1000 + (uint64_t)i / 2},
                           .max_tokens = 40, .ignore_eos = true, .submit_step = 2 * i, .use_cb = i % 3 == 0};
    }
    run_jobs(m, 3, 0, 0, 0, jobs, nj);
    int differ_from_greedy = 0;
    for (int i = 0; i < nj; i++) {
        job alone;
        run_alone(m, 0, &jobs[i], &alone);
        expect_same_tokens(&jobs[i], &alone, golden_rel, i);
        const golden_case *g = &gc[i % ng];
        for (int k = 0; k < jobs[i].n_got && k < g->n_greedy; k++)
            if (jobs[i].got[k] != g->greedy[k]) {
                differ_from_greedy++;
                break;
            }
    }
    KT_CHECKF(differ_from_greedy >= 4, "only %d of 6 sampled runs differ from greedy", differ_from_greedy);
    /* jobs 0 and 3 share a prompt (with 3 golden cases) but not a seed */
    if (ng == 3) KT_CHECK(memcmp(jobs[0].got, jobs[3].got, 40 * sizeof(int32_t)) != 0);
}

static void test_batched_sampling_stories(void) {
    KT_REQUIRE(stories);
    check_batched_sampling(stories, "stories260k");
}
static void test_batched_sampling_tiny_mistral(void) {
    KT_REQUIRE(mistral);
    check_batched_sampling(mistral, "tiny-mistral");
}

/* (c) chunked prefill: a 4-token step budget splits the prompts across many
 * steps, with decode tokens of running requests first; same tokens. */
static void test_chunked_prefill(void) {
    KT_REQUIRE(stories && mistral);
    const kiln_model *models[2] = {stories, mistral};
    const char *names[2] = {"stories260k", "tiny-mistral"};
    for (int mi = 0; mi < 2; mi++) {
        golden_case gc[6];
        int ng = load_golden(names[mi], gc, 6);
        KT_REQUIRE(ng >= 3);
        job big[4], small[4];
        for (int i = 0; i < 4; i++) {
            const golden_case *g = &gc[(i + 2) % ng];
            kiln_sampling sm = i % 2 ? (kiln_sampling){.temperature = 0.8f, .top_k = 40, .top_p = 0.9f, .seed = 7}
                                     : greedy();
            big[i] = (job){.prompt = g->prompt, .n_prompt = g->n_prompt, .samp = sm, .max_tokens = 24,
                           .ignore_eos = true, .submit_step = i, .use_cb = i == 1};
            small[i] = big[i];
        }
        kiln_sched_stats a = run_jobs(models[mi], 4, 0, 0, 512, big, 4);
        kiln_sched_stats b = run_jobs(models[mi], 4, 0, 0, 4, small, 4);
        KT_CHECK(a.max_step_tokens_used > 4);
        KT_CHECK(b.max_step_tokens_used <= 4);
        KT_CHECKF(b.steps > a.steps, "chunked %lld steps vs %lld", (long long)b.steps, (long long)a.steps);
        for (int i = 0; i < 4; i++) expect_same_tokens(&small[i], &big[i], names[mi], i);
    }
}

/* (d) the context: a prompt over it is refused at submit; one that fills it
 * is accepted and yields one token. */
static void test_context_limits(void) {
    KT_REQUIRE(stories);
    kiln_executor *x = NULL;
    kiln_sched *s = NULL;
    kiln_error err = {0};
    KT_REQUIRE(kiln_cpu_executor_new(stories, 2, 32, 0, 1, &x, &err) == KILN_OK);
    kiln_sched_opts so = {.eos_ids = stories->eos_ids, .n_eos = stories->n_eos};
    KT_REQUIRE(kiln_sched_new(x, &so, &s, &err) == KILN_OK);
    int32_t prompt[40];
    for (int i = 0; i < 40; i++) prompt[i] = 1 + (i * 37) % 500;
    int64_t id = -5;
    kiln_sched_request r = {.prompt = prompt, .n_prompt = 33, .samp = greedy(), .max_tokens = 4};
    KT_EQ_INT(kiln_sched_submit(s, &r, &id, &err), KILN_ERR_CONTEXT);
    KT_CONTAINS(err.msg, "33 tokens");
    KT_CONTAINS(err.msg, "context holds 32");
    KT_EQ_INT(id, 0);
    KT_EQ_INT(kiln_sched_pending(s), 0);
    /* other refusals */
    r.n_prompt = 0;
    KT_EQ_INT(kiln_sched_submit(s, &r, &id, &err), KILN_ERR_INVALID_ARG);
    KT_CONTAINS(err.msg, "empty");
    r.n_prompt = 3;
    prompt[1] = 512;
    KT_EQ_INT(kiln_sched_submit(s, &r, &id, &err), KILN_ERR_INVALID_ARG);
    KT_CONTAINS(err.msg, "index 1");
    prompt[1] = -1;
    KT_EQ_INT(kiln_sched_submit(s, &r, &id, &err), KILN_ERR_INVALID_ARG);
    prompt[1] = 5;
    r.max_tokens = -1;
    KT_EQ_INT(kiln_sched_submit(s, &r, &id, &err), KILN_ERR_INVALID_ARG);
    r.max_tokens = 4;
    r.samp.top_p = 0;
    KT_EQ_INT(kiln_sched_submit(s, &r, &id, &err), KILN_ERR_INVALID_ARG);
    KT_CONTAINS(err.msg, "top-p");
    r.samp = greedy();
    r.samp.temperature = NAN;
    KT_EQ_INT(kiln_sched_submit(s, &r, &id, &err), KILN_ERR_INVALID_ARG);
    r.samp = greedy();
    r.samp.top_k = -2;
    KT_EQ_INT(kiln_sched_submit(s, &r, &id, &err), KILN_ERR_INVALID_ARG);
    kiln_sched_free(s);
    x->ops->destroy(x);

    /* a prompt of exactly the context: one token, stop context */
    job full = {.prompt = prompt, .n_prompt = 32, .samp = greedy(), .max_tokens = 10, .ignore_eos = true};
    run_jobs(stories, 1, 32, 0, 0, &full, 1);
    KT_EQ_INT(full.submit_status, KILN_OK);
    KT_EQ_INT(full.n_got, 1);
    KT_EQ_INT(full.stop, KILN_STOP_CONTEXT);
}

/* (e) a KV budget for two requests at a time: the rest queue, all complete
 * with their own tokens, and never more run than fit. */
static void test_kv_budget_queueing(void) {
    KT_REQUIRE(stories);
    golden_case gc[3];
    KT_REQUIRE(load_golden("stories260k", gc, 3) == 3);
    /* each needs 20 + 30 − 1 = 49 KV tokens; the budget is 100 */
    job jobs[5];
    for (int i = 0; i < 5; i++)
        jobs[i] = (job){.prompt = gc[2].prompt, .n_prompt = gc[2].n_prompt,
                        .samp = i % 2 ? greedy() : (kiln_sampling){.temperature = 0.8f, .top_k = 40, .top_p = 0.9f,
                                                                   .seed = (uint64_t)i},
                        .max_tokens = 30, .ignore_eos = true, .submit_step = 0, .use_cb = i == 2};
    kiln_sched_stats st = run_jobs(stories, 4, 0, 100, 0, jobs, 5);
    /* KV grows as they generate, so three start together, and the newest is
     * preempted when the budget runs out */
    KT_EQ_INT(st.max_running, 3);
    KT_CHECK(st.preemptions > 0);
    for (int i = 0; i < 5; i++) {
        KT_EQ_INT(jobs[i].n_got, 30);
        job alone;
        run_alone(stories, 0, &jobs[i], &alone);
        expect_same_tokens(&jobs[i], &alone, "kv budget", i);
    }
    /* a request needing more than the whole budget is refused at submit */
    job huge = {.prompt = gc[2].prompt, .n_prompt = gc[2].n_prompt, .samp = greedy(), .max_tokens = 200};
    run_jobs(stories, 4, 0, 100, 0, &huge, 1);
    KT_EQ_INT(huge.submit_status, KILN_ERR_CONTEXT);
}

/* The real step of an executor whose ops wrap_ops replaced. */
static kiln_status (*g_real_step)(kiln_executor *, const kiln_step *, kiln_error *);
/* Point x at *ops, a copy of its ops for the caller to edit (g_real_step: the original step); returns
 * the original ops, to put back before x is destroyed. */
static const kiln_executor_ops *wrap_ops(kiln_executor *x, kiln_executor_ops *ops) {
    const kiln_executor_ops *saved = x->ops;
    *ops = *saved;
    g_real_step = saved->step;
    x->ops = ops;
    return saved;
}

/* An executor whose reserve() says "not now" to everything: with nothing
 * running the request can never run, so it ends with an error instead of
 * waiting forever. */
static kiln_status never_reserve(kiln_executor *x, int slot, int tokens, bool *fits, kiln_error *err) {
    *fits = false;
    return KILN_OK;
}
static void test_never_fits(void) {
    KT_REQUIRE(stories);
    kiln_executor *x = NULL;
    kiln_sched *s = NULL;
    kiln_error err = {0};
    KT_REQUIRE(kiln_cpu_executor_new(stories, 2, 64, 0, 1, &x, &err) == KILN_OK);
    kiln_executor_ops ops;
    const kiln_executor_ops *saved = wrap_ops(x, &ops);
    ops.reserve = never_reserve;
    ops.info = NULL;
    kiln_sched_opts so = {0};
    KT_REQUIRE(kiln_sched_new(x, &so, &s, &err) == KILN_OK);
    int32_t p[3] = {1, 2, 3};
    kiln_sched_request r = {.prompt = p, .n_prompt = 3, .samp = greedy(), .max_tokens = 5};
    int64_t id;
    KT_REQUIRE(kiln_sched_submit(s, &r, &id, &err) == KILN_OK);
    KT_EQ_INT(kiln_sched_step(s, NULL, &err), KILN_ERR_CONTEXT);
    KT_CONTAINS(err.msg, "KV");
    int32_t buf[8];
    int n;
    bool fin;
    int why;
    KT_CHECK(kiln_sched_poll(s, id, buf, 8, &n, &fin, &why, &err) == KILN_OK);
    KT_CHECK(fin);
    KT_EQ_INT(why, KILN_STOP_ERROR);
    KT_EQ_INT(n, 0);
    kiln_sched_free(s);
    x->ops = saved;
    x->ops->destroy(x);
}

/* An executor whose logits for slot 1 turn untrusted at its 4th sampled token (the CPU step, then
 * that sequence's token replaced by what a sampler gives for a NaN row): that request fails with
 * KILN_ERR_NUMERIC after its 3 good tokens, the other runs to the end with the tokens it has alone. */
static int g_slot1_tokens;
static kiln_status nan_step(kiln_executor *x, const kiln_step *st, kiln_error *err) {
    kiln_status s = g_real_step(x, st, err);
    for (int i = 0; s == KILN_OK && i < st->n_seqs; i++)
        if (st->slot[i] == 1 && st->want_token[i] && ++g_slot1_tokens >= 4) st->next[i] = KILN_TOKEN_NONFINITE;
    return s;
}
static void test_nonfinite_logits(void) {
    KT_REQUIRE(stories);
    kiln_executor *x = NULL;
    kiln_sched *s = NULL;
    kiln_error err = {0};
    KT_REQUIRE(kiln_cpu_executor_new(stories, 2, 0, 0, 1, &x, &err) == KILN_OK);
    kiln_executor_ops ops;
    const kiln_executor_ops *saved = wrap_ops(x, &ops);
    g_slot1_tokens = 0;
    ops.step = nan_step;
    kiln_sched_opts so = {0};
    KT_REQUIRE(kiln_sched_new(x, &so, &s, &err) == KILN_OK);
    int32_t p[4] = {1, 300, 310, 320};
    kiln_sched_request r = {.prompt = p, .n_prompt = 4, .samp = greedy(), .max_tokens = 12, .ignore_eos = true};
    int64_t id[2];
    KT_REQUIRE(kiln_sched_submit(s, &r, &id[0], &err) == KILN_OK);
    KT_REQUIRE(kiln_sched_submit(s, &r, &id[1], &err) == KILN_OK);
    int failed = 0;
    kiln_status last = KILN_OK;
    for (int step = 0; step < 64 && kiln_sched_pending(s) > 0; step++) {
        kiln_error se = {0};
        kiln_status st = kiln_sched_step(s, NULL, &se);
        if (st != KILN_OK) {
            failed++;
            last = st;
            KT_CONTAINS(se.msg, "not finite");
            KT_CONTAINS(se.msg, "no token was sampled");
        }
    }
    KT_EQ_INT(failed, 1);
    KT_EQ_INT(last, KILN_ERR_NUMERIC);
    int32_t buf[2][16];
    int n[2], why[2];
    for (int j = 0; j < 2; j++) {
        bool fin = false;
        KT_CHECK(kiln_sched_poll(s, id[j], buf[j], 16, &n[j], &fin, &why[j], &err) == KILN_OK);
        KT_CHECK(fin);
    }
    /* which request took slot 1 is the scheduler's choice: one failed after 3 tokens, one finished */
    const int bad = why[0] == KILN_STOP_ERROR ? 0 : 1, good = 1 - bad;
    KT_EQ_INT(why[bad], KILN_STOP_ERROR);
    KT_EQ_INT(n[bad], 3);
    KT_EQ_INT(why[good], KILN_STOP_MAX_TOKENS);
    KT_EQ_INT(n[good], 12);
    for (int i = 0; i < 3; i++) KT_EQ_INT(buf[bad][i], buf[good][i]); /* the same prompt, greedy */
    kiln_sched_free(s);
    x->ops = saved;
    x->ops->destroy(x);
}

/* kiln_score_seqs refuses a step whose logits hold a NaN (the CPU step's rows, one element of the first
 * row poisoned) with KILN_ERR_NUMERIC naming where, rather than scoring it as probability 0. */
static int g_score_steps;
static kiln_status nan_rows_step(kiln_executor *x, const kiln_step *st, kiln_error *err) {
    kiln_status s = g_real_step(x, st, err);
    if (s == KILN_OK && st->logits && ++g_score_steps == 1) st->logits[5] = NAN;
    return s;
}
static void test_score_nonfinite(void) {
    KT_REQUIRE(stories);
    kiln_executor *x = NULL;
    kiln_error err = {0};
    KT_REQUIRE(kiln_cpu_executor_new(stories, 1, 0, 0, 1, &x, &err) == KILN_OK);
    const int32_t ids[6] = {1, 300, 310, 320, 330, 340}, n = 6;
    const int32_t *seq = ids;
    float lp[6], *out = lp;
    KT_REQUIRE(kiln_score_seqs(x, 1, 64, &seq, &n, 1, &out, &err) == KILN_OK); /* unpoisoned: scores */
    for (int i = 0; i < n - 1; i++) KT_CHECK(isfinite(lp[i]) && lp[i] < 0);
    kiln_executor_ops ops;
    const kiln_executor_ops *saved = wrap_ops(x, &ops);
    g_score_steps = 0;
    ops.step = nan_rows_step;
    KT_EQ_INT(kiln_score_seqs(x, 1, 64, &seq, &n, 1, &out, &err), KILN_ERR_NUMERIC);
    KT_CONTAINS(err.msg, "not finite");
    KT_CONTAINS(err.msg, "sequence 0");
    x->ops = saved;
    x->ops->destroy(x);
}

/* Prompt log-probabilities from a row the sampler could not trust (the same poisoned first row: the one
 * predicting position 1) are not delivered as -inf: the request fails with KILN_ERR_NUMERIC before any. */
static int g_prompt_lps;
static int32_t count_info(void *user, int64_t id, const kiln_token_info *t, int32_t fin, int32_t why) {
    (void)user, (void)id, (void)fin, (void)why;
    g_prompt_lps += t && t->prompt; /* finish() reports an error with no token */
    return 0;
}
static void test_prompt_logprobs_nonfinite(void) {
    KT_REQUIRE(stories);
    kiln_executor *x = NULL;
    kiln_sched *s = NULL;
    kiln_error err = {0};
    KT_REQUIRE(kiln_cpu_executor_new(stories, 1, 0, 0, 1, &x, &err) == KILN_OK);
    kiln_executor_ops ops;
    const kiln_executor_ops *saved = wrap_ops(x, &ops);
    g_score_steps = 0;
    g_prompt_lps = 0;
    ops.step = nan_rows_step;
    kiln_sched_opts so = {0};
    KT_REQUIRE(kiln_sched_new(x, &so, &s, &err) == KILN_OK);
    int32_t p[4] = {1, 300, 310, 320};
    kiln_sched_request r = {.prompt = p, .n_prompt = 4, .samp = greedy(), .max_tokens = 4, .prompt_logprobs = true,
                            .cb_info = count_info};
    int64_t id;
    KT_REQUIRE(kiln_sched_submit(s, &r, &id, &err) == KILN_OK);
    KT_EQ_INT(kiln_sched_step(s, NULL, &err), KILN_ERR_NUMERIC);
    KT_CONTAINS(err.msg, "logits for position 1 are not finite");
    KT_EQ_INT(g_prompt_lps, 0);
    KT_EQ_INT(kiln_sched_pending(s), 0);
    kiln_sched_free(s);
    x->ops = saved;
    x->ops->destroy(x);
}

/* (f) cancel a queued and a running request; a callback that cancels. */
static void test_cancel(void) {
    KT_REQUIRE(stories);
    kiln_executor *x = NULL;
    kiln_sched *s = NULL;
    kiln_error err = {0};
    KT_REQUIRE(kiln_cpu_executor_new(stories, 1, 0, 0, 1, &x, &err) == KILN_OK);
    kiln_sched_opts so = {.eos_ids = stories->eos_ids, .n_eos = stories->n_eos};
    KT_REQUIRE(kiln_sched_new(x, &so, &s, &err) == KILN_OK);
    int32_t p[4] = {1, 300, 310, 320};
    kiln_sched_request r = {.prompt = p, .n_prompt = 4, .samp = greedy(), .max_tokens = 50, .ignore_eos = true};
    int64_t a, b, c;
    KT_REQUIRE(kiln_sched_submit(s, &r, &a, &err) == KILN_OK);
    KT_REQUIRE(kiln_sched_submit(s, &r, &b, &err) == KILN_OK);
    KT_CHECK(a > 0 && b > a);
    for (int i = 0; i < 3; i++) KT_CHECK(kiln_sched_step(s, NULL, &err) == KILN_OK);
    kiln_sched_stats st;
    kiln_sched_get_stats(s, &st);
    KT_EQ_INT(st.running, 1);
    KT_EQ_INT(st.queued, 1);
    /* queued b */
    KT_CHECK(kiln_sched_cancel(s, b, &err) == KILN_OK);
    int32_t buf[64];
    int n, why;
    bool fin;
    KT_CHECK(kiln_sched_poll(s, b, buf, 64, &n, &fin, &why, &err) == KILN_OK);
    KT_CHECK(fin);
    KT_EQ_INT(n, 0);
    KT_EQ_INT(why, KILN_STOP_CANCELLED);
    KT_EQ_INT(kiln_sched_poll(s, b, buf, 64, &n, &fin, &why, &err), KILN_ERR_INVALID_ARG); /* forgotten */
    KT_CONTAINS(err.msg, "already polled");
    /* running a: 3 steps gave 3 tokens */
    KT_CHECK(kiln_sched_poll(s, a, buf, 2, &n, &fin, &why, &err) == KILN_OK);
    KT_EQ_INT(n, 2);
    KT_CHECK(!fin);
    KT_CHECK(kiln_sched_cancel(s, a, &err) == KILN_OK);
    KT_EQ_INT(kiln_sched_pending(s), 0);
    KT_CHECK(kiln_sched_poll(s, a, buf + 2, 62, &n, &fin, &why, &err) == KILN_OK);
    KT_EQ_INT(n, 1);
    KT_CHECK(fin);
    KT_EQ_INT(why, KILN_STOP_CANCELLED);
    /* the slot is free again: a new request runs to the end */
    KT_REQUIRE(kiln_sched_submit(s, &r, &c, &err) == KILN_OK);
    while (kiln_sched_pending(s) > 0) KT_REQUIRE(kiln_sched_step(s, NULL, &err) == KILN_OK);
    int32_t all[64];
    KT_CHECK(kiln_sched_poll(s, c, all, 64, &n, &fin, &why, &err) == KILN_OK);
    KT_EQ_INT(n, 50);
    KT_EQ_INT(why, KILN_STOP_MAX_TOKENS);
    KT_CHECK(memcmp(all, buf, 3 * sizeof *buf) == 0); /* a's tokens were the same start */
    /* unknown ids; finished ids are a no-op */
    KT_EQ_INT(kiln_sched_cancel(s, 999, &err), KILN_ERR_INVALID_ARG);
    KT_CONTAINS(err.msg, "no request 999");
    KT_EQ_INT(kiln_sched_cancel(s, 0, &err), KILN_ERR_INVALID_ARG);
    KT_EQ_INT(kiln_sched_cancel(s, c, &err), KILN_OK);
    kiln_sched_free(s);
    x->ops->destroy(x);

    /* a callback that returns non-zero after 5 tokens */
    job j = {.prompt = p, .n_prompt = 4, .samp = greedy(), .max_tokens = 50, .ignore_eos = true, .use_cb = true,
             .cancel_after = 5};
    run_jobs(stories, 2, 0, 0, 0, &j, 1);
    KT_EQ_INT(j.n_got, 5);
    KT_EQ_INT(j.stop, KILN_STOP_CANCELLED);

    /* freeing a scheduler with queued and running work leaks nothing (ASan) */
    KT_REQUIRE(kiln_cpu_executor_new(stories, 1, 0, 0, 1, &x, &err) == KILN_OK);
    KT_REQUIRE(kiln_sched_new(x, &so, &s, &err) == KILN_OK);
    KT_REQUIRE(kiln_sched_submit(s, &r, &a, &err) == KILN_OK);
    KT_REQUIRE(kiln_sched_submit(s, &r, &b, &err) == KILN_OK);
    KT_REQUIRE(kiln_sched_step(s, NULL, &err) == KILN_OK);
    kiln_sched_free(s);
    x->ops->destroy(x);
}

/* (g) eos, max_tokens and a full context stop a request. */
static void test_stops(void) {
    KT_REQUIRE(llama3);
    golden_case gc[6];
    int ng = load_golden("tiny-llama3", gc, 6);
    const golden_case *g = NULL;
    for (int i = 0; i < ng && !g; i++)
        if (gc[i].eos_index >= 0) g = &gc[i];
    KT_REQUIRE(g);
    KT_REQUIRE(llama3->n_eos > 0);
    job jobs[4] = {
        /* eos: stops right after the golden eos, which is delivered */
        {.prompt = g->prompt, .n_prompt = g->n_prompt, .samp = greedy(), .max_tokens = 60, .submit_step = 0},
        /* ignore_eos: runs on to max_tokens through the eos */
        {.prompt = g->prompt, .n_prompt = g->n_prompt, .samp = greedy(), .max_tokens = 30, .ignore_eos = true,
         .submit_step = 1, .use_cb = true},
        /* max_tokens before the eos */
        {.prompt = g->prompt, .n_prompt = g->n_prompt, .samp = greedy(), .max_tokens = g->eos_index,
         .submit_step = 2},
        /* max_tokens 0: finishes without a token */
        {.prompt = g->prompt, .n_prompt = g->n_prompt, .samp = greedy(), .max_tokens = 0, .submit_step = 2,
         .use_cb = true},
    };
    run_jobs(llama3, 4, 0, 0, 0, jobs, 4);
    KT_EQ_INT(jobs[0].stop, KILN_STOP_EOS);
    KT_EQ_INT(jobs[0].n_got, g->eos_index + 1);
    KT_CHECK(memcmp(jobs[0].got, g->greedy, (size_t)(g->eos_index + 1) * sizeof(int32_t)) == 0);
    KT_EQ_INT(jobs[1].stop, KILN_STOP_MAX_TOKENS);
    KT_EQ_INT(jobs[1].n_got, 30);
    KT_CHECK(memcmp(jobs[1].got, g->greedy, 30 * sizeof(int32_t)) == 0);
    KT_EQ_INT(jobs[2].stop, KILN_STOP_MAX_TOKENS);
    KT_EQ_INT(jobs[2].n_got, g->eos_index);
    KT_EQ_INT(jobs[3].stop, KILN_STOP_MAX_TOKENS);
    KT_EQ_INT(jobs[3].n_got, 0);

    /* context full: 16-token context, 8-token prompt → KV fills after 8 more
     * tokens fed; the 9th sampled token is delivered and the request stops */
    KT_REQUIRE(mistral);
    golden_case mg[6];
    KT_REQUIRE(load_golden("tiny-mistral", mg, 6) >= 2);
    KT_REQUIRE(mg[1].n_prompt == 8);
    job cf = {.prompt = mg[1].prompt, .n_prompt = 8, .samp = greedy(), .max_tokens = 100, .ignore_eos = true};
    run_jobs(mistral, 2, 16, 0, 0, &cf, 1);
    KT_EQ_INT(cf.stop, KILN_STOP_CONTEXT);
    KT_EQ_INT(cf.n_got, 9);
    KT_CHECK(memcmp(cf.got, mg[1].greedy, 9 * sizeof(int32_t)) == 0);
    job alone;
    run_alone(mistral, 16, &cf, &alone);
    expect_same_tokens(&cf, &alone, "context full", 0);
}

/* Bad scheduler options. */
static void test_sched_options(void) {
    KT_REQUIRE(stories);
    kiln_executor *x = NULL;
    kiln_sched *s = NULL;
    kiln_error err = {0};
    KT_REQUIRE(kiln_cpu_executor_new(stories, 4, 64, 0, 1, &x, &err) == KILN_OK);
    kiln_sched_opts so = {.max_seqs = 5};
    KT_EQ_INT(kiln_sched_new(x, &so, &s, &err), KILN_ERR_INVALID_ARG);
    KT_CONTAINS(err.msg, "max batch 5");
    so = (kiln_sched_opts){.max_step_tokens = 3};
    KT_EQ_INT(kiln_sched_new(x, &so, &s, &err), KILN_ERR_INVALID_ARG);
    KT_CONTAINS(err.msg, "max step tokens 3");
    so = (kiln_sched_opts){.max_context = 65};
    KT_EQ_INT(kiln_sched_new(x, &so, &s, &err), KILN_ERR_INVALID_ARG);
    so = (kiln_sched_opts){0};
    KT_REQUIRE(kiln_sched_new(x, &so, &s, &err) == KILN_OK);
    KT_EQ_INT(kiln_sched_max_seqs(s), 4);
    KT_EQ_INT(kiln_sched_max_context(s), 64);
    KT_EQ_INT(kiln_sched_max_step_tokens(s), 256); /* 512 capped at the executor's 4 × 64 */
    kiln_sched_free(s);
    x->ops->destroy(x);
}


/* ---- penalties, min-p, log-probabilities, preemption ---- */

/* Penalties the plain way: for every token id, its count among the outputs
 * and whether it occurs at all. */
static void ref_penalties(float *l, int vocab, const int32_t *toks, int n_prompt, int n_total,
                          const kiln_penalties *p) {
    for (int t = 0; t < vocab; t++) {
        int out = 0, any = 0;
        for (int i = 0; i < n_total; i++)
            if (toks[i] == t) {
                any = 1;
                out += i >= n_prompt;
            }
        if (!any) continue;
        float v = l[t];
        if (p->repetition != 1) v = v > 0 ? v / p->repetition : v * p->repetition;
        if (out) v -= p->frequency * (float)out + p->presence;
        l[t] = v;
    }
}

static void test_penalties_reference(void) {
    const int V = 300;
    float a[300], b[300];
    int32_t counts[300] = {0}, toks[200];
    const kiln_penalties ps[] = {{0.5f, 0.25f, 1.3f}, {-1, 2, 1}, {0, 0, 0.7f}, {2, 0, 1}, {0, -2, 5}};
    uint64_t rng = 99;
    for (size_t pi = 0; pi < sizeof ps / sizeof ps[0]; pi++)
        for (int rep = 0; rep < 20; rep++) {
            int n_total = 1 + rep * 9, n_prompt = rep * 4 < n_total ? rep * 4 : n_total;
            for (int i = 0; i < V; i++) {
                rng = rng * 6364136223846793005ull + 1442695040888963407ull;
                a[i] = b[i] = (float)((int)(rng >> 40) % 400 - 200) / 37.0f;
            }
            for (int i = 0; i < n_total; i++) {
                rng = rng * 6364136223846793005ull + 1442695040888963407ull;
                toks[i] = (int32_t)((rng >> 33) % 40); /* few ids: many repeats */
            }
            kiln_apply_penalties(a, V, toks, n_prompt, n_total, &ps[pi], counts);
            ref_penalties(b, V, toks, n_prompt, n_total, &ps[pi]);
            KT_CHECKF(memcmp(a, b, sizeof a) == 0, "penalties %zu, case %d differ from the reference", pi, rep);
            int dirty = 0;
            for (int i = 0; i < V; i++) dirty += counts[i] != 0;
            KT_EQ_INT(dirty, 0);
        }
}

static void test_logprobs_reference(void) {
    const int V = 1000;
    float *l = malloc((size_t)V * sizeof *l);
    for (int i = 0; i < V; i++) l[i] = (float)((i * 7919) % 1009) / 97.0f - 5;
    l[17] = NAN;
    l[18] = -INFINITY;
    double mx = -INFINITY, sum = 0;
    for (int i = 0; i < V; i++)
        if (!isnan(l[i]) && l[i] > mx) mx = l[i];
    for (int i = 0; i < V; i++)
        if (!isnan(l[i])) sum += exp((double)l[i] - mx);
    int32_t top[20];
    float lp, tl[20];
    kiln_logprobs(l, V, 5, 20, &lp, top, tl);
    KT_CHECK(fabs(lp - ((double)l[5] - mx - log(sum))) < 1e-5);
    for (int i = 0; i < 20; i++) {
        KT_CHECK(fabs(tl[i] - ((double)l[top[i]] - mx - log(sum))) < 1e-5);
        /* rank: no id outside the list has a larger logit */
        for (int j = 0; j < V; j++) {
            bool listed = false;
            for (int k = 0; k <= i; k++) listed |= top[k] == j;
            if (!listed && !isnan(l[j])) KT_CHECK(l[j] < l[top[i]] || (l[j] == l[top[i]] && j > top[i]));
        }
    }
    kiln_logprobs(l, V, 17, 0, &lp, top, tl);
    KT_CHECK(isinf(lp) && lp < 0); /* NaN: probability 0 */
    kiln_logprobs(l, V, 18, 0, &lp, top, tl);
    KT_CHECK(isinf(lp) && lp < 0);
    free(l);
}

/* The oracle for host sampling: one sequence through a CPU context, greedy
 * on logits penalised by ref_penalties, and the log-softmax of the raw
 * logits. */
static void run_penalised_oracle(const kiln_model *m, const job *j, int32_t *got, double *lp) {
    kiln_cpu_ctx *c = NULL;
    kiln_error err = {0};
    KT_REQUIRE(kiln_cpu_ctx_new(m, 0, 64, 1, &c, &err) == KILN_OK);
    const int V = m->plan->vocab_size;
    float *l = malloc((size_t)V * sizeof *l);
    int32_t toks[700];
    memcpy(toks, j->prompt, (size_t)j->n_prompt * sizeof *toks);
    int n = j->n_prompt;
    KT_REQUIRE(kiln_cpu_forward(c, toks, n, false, l, &err) == KILN_OK);
    for (int k = 0; k < j->max_tokens; k++) {
        double mx = -INFINITY, sum = 0;
        for (int i = 0; i < V; i++) mx = l[i] > mx ? l[i] : mx;
        for (int i = 0; i < V; i++) sum += exp((double)l[i] - mx);
        kiln_penalties pen = j->pen;
        if (pen.repetition == 0) pen.repetition = 1;
        float *w = malloc((size_t)V * sizeof *w);
        memcpy(w, l, (size_t)V * sizeof *w);
        ref_penalties(w, V, toks, j->n_prompt, n, &pen);
        int32_t t = kiln_argmax(w, V);
        free(w);
        got[k] = t;
        lp[k] = (double)l[t] - mx - log(sum);
        toks[n++] = t;
        if (k + 1 < j->max_tokens) KT_REQUIRE(kiln_cpu_forward(c, &t, 1, false, l, &err) == KILN_OK);
    }
    free(l);
    kiln_cpu_ctx_free(c);
}

/* Greedy with penalties and logprobs through the scheduler, batched beside
 * plain requests: the tokens of the oracle, the log-probabilities of the raw
 * logits; and the penalties really change the text. */
static void test_penalties_end_to_end(void) {
    KT_REQUIRE(stories);
    golden_case gc[3];
    KT_REQUIRE(load_golden("stories260k", gc, 3) == 3);
    const kiln_penalties pens[3] = {{1.5f, 0.5f, 1.3f}, {0, 0, 2.0f}, {0, 1.0f, 0}};
    job jobs[6];
    for (int i = 0; i < 6; i++)
        jobs[i] = (job){.prompt = gc[i % 3].prompt, .n_prompt = gc[i % 3].n_prompt, .samp = greedy(),
                        .max_tokens = 40, .ignore_eos = true, .submit_step = i, .use_cb = i < 3,
                        .pen = i < 3 ? pens[i] : (kiln_penalties){0}, .logprobs = i < 3 ? 1 + 2 * i : 0};
    kiln_sched_stats st = run_jobs(stories, 4, 0, 0, 0, jobs, 6);
    KT_CHECK(st.host_sampled >= 3 * 40);
    for (int i = 0; i < 3; i++) {
        int32_t want[40];
        double lp[40];
        run_penalised_oracle(stories, &jobs[i], want, lp);
        KT_EQ_INT(jobs[i].n_got, 40);
        int same = 0;
        while (same < 40 && jobs[i].got[same] == want[same]) same++;
        KT_CHECKF(same == 40, "penalised job %d differs from the oracle at token %d", i, same);
        for (int k = 0; k < 40; k++) KT_CHECKF(fabs(jobs[i].lp[k] - lp[k]) < 1e-4, "job %d token %d: logprob %g vs %g", i, k, (double)jobs[i].lp[k], lp[k]);
        /* and they are not plain greedy's tokens */
        KT_CHECKF(memcmp(jobs[i].got, jobs[i + 3].got, 40 * sizeof(int32_t)) != 0, "penalties %d changed nothing", i);
    }
    /* plain greedy's top alternative is its own token */
    job g = {.prompt = gc[0].prompt, .n_prompt = gc[0].n_prompt, .samp = greedy(), .max_tokens = 20,
             .ignore_eos = true, .use_cb = true, .logprobs = 3};
    run_jobs(stories, 1, 0, 0, 0, &g, 1);
    for (int k = 0; k < g.n_got; k++) KT_EQ_INT(g.top0[k], g.got[k]);
    KT_CHECK(memcmp(g.got, gc[0].greedy, (size_t)g.n_got * sizeof(int32_t)) == 0);
}

/* Preemption under a tight KV budget: twelve requests of mixed lengths,
 * sampling, penalties and delivery, with a one-token lookahead so the
 * budget runs out mid-generation again and again; each gives exactly the
 * tokens it gives alone. */
static void test_preemption(void) {
    KT_REQUIRE(stories);
    golden_case gc[3];
    KT_REQUIRE(load_golden("stories260k", gc, 3) == 3);
    job jobs[12];
    for (int i = 0; i < 12; i++) {
        const golden_case *g = &gc[i % 3];
        jobs[i] = (job){.prompt = g->prompt, .n_prompt = g->n_prompt, .max_tokens = 20 + 7 * (i % 5),
                        .ignore_eos = true, .submit_step = i / 2, .use_cb = i % 2 == 1,
                        .samp = i % 3 ? (kiln_sampling){.temperature = 0.9f, .top_k = 30, .top_p = 0.95f,
                                                        .seed = 77 + (uint64_t)i, .min_p = i % 4 ? 0 : 0.05f}
                                      : greedy(),
                        .pen = i % 4 == 1 ? (kiln_penalties){0.3f, 0.2f, 1.1f} : (kiln_penalties){0}};
    }
    g_lookahead = 1;
    /* the longest needs prompt + 47 tokens; 160 hold about three at a time */
    kiln_sched_stats st = run_jobs(stories, 6, 0, 160, 8, jobs, 12);
    g_lookahead = 0;
    KT_CHECKF(st.preemptions >= 3, "only %lld preemptions", (long long)st.preemptions);
    KT_CHECK(st.tokens_recomputed > 0);
    for (int i = 0; i < 12; i++) {
        KT_EQ_INT(jobs[i].stop, KILN_STOP_MAX_TOKENS);
        KT_EQ_INT(jobs[i].n_got, jobs[i].max_tokens);
        job alone = jobs[i];
        alone.submit_step = 0;
        alone.n_got = 0;
        alone.done = false;
        run_jobs(stories, 1, 0, 0, 0, &alone, 1);
        expect_same_tokens(&jobs[i], &alone, "preempted", i);
    }
}

/* Prompt log-probabilities (kiln_sched_request.prompt_logprobs): each position once, in order, before
 * the generated tokens, equal to kiln_score_seqs' over the same ids, and generation as without them;
 * whether the prompt is read in chunks beside other requests, one token a step (an executor that
 * returns only each sequence's last row), or preempted and resumed; with max_tokens 0 the prompt is
 * read for them alone; a callback's cancel stops the request. */
static void test_prompt_logprobs(void) {
    KT_REQUIRE(stories);
    golden_case gc[3];
    KT_REQUIRE(load_golden("stories260k", gc, 3) == 3);
    float ref[3][64];
    kiln_executor *x = NULL;
    kiln_error err = {0};
    KT_REQUIRE(kiln_cpu_executor_new(stories, 1, 0, 0, 2, &x, &err) == KILN_OK);
    for (int c = 0; c < 3; c++) {
        if (gc[c].n_prompt < 2) continue;
        const int32_t *seq = gc[c].prompt;
        float *out = ref[c];
        KT_REQUIRE(kiln_score_seqs(x, 1, 64, &seq, &gc[c].n_prompt, 1, &out, &err) == KILN_OK);
    }
    x->ops->destroy(x);
    for (int mode = 0; mode < 3; mode++) { /* chunks beside others; one token a step; preemption */
        job jobs[10];
        for (int i = 0; i < 10; i++) {
            const golden_case *g = &gc[i % 3];
            jobs[i] = (job){.prompt = g->prompt, .n_prompt = g->n_prompt, .max_tokens = i % 4 == 0 ? 0 : 12,
                            .ignore_eos = true, .submit_step = i / 3, .use_cb = i != 9,
                            .prompt_lp = i == 9 ? 0 : 1 + 4 * (i % 2), .logprobs = i == 5 ? 2 : 0,
                            .samp = i % 2 ? greedy() : (kiln_sampling){.temperature = 0.8f, .top_p = 0.9f,
                                                                       .seed = 5 + (uint64_t)i}};
        }
        jobs[7].cancel_at_pos = mode == 0 ? 3 : 0; /* a 20-token prompt */
        g_last_rows = mode == 1;
        g_lookahead = mode == 2 ? 1 : 0;
        kiln_sched_stats st = run_jobs(stories, 4, 0, mode == 2 ? 48 : 0, 8, jobs, 10);
        g_last_rows = false;
        g_lookahead = 0;
        if (mode == 2) KT_CHECKF(st.preemptions >= 1, "no preemption");
        for (int i = 0; i < 10; i++) {
            const job *j = &jobs[i];
            KT_EQ_INT(j->plp_bad, 0);
            if (j->cancel_at_pos) {
                KT_EQ_INT(j->stop, KILN_STOP_CANCELLED);
                KT_EQ_INT(j->n_plp, j->cancel_at_pos);
                KT_EQ_INT(j->n_got, 0);
                continue;
            }
            KT_EQ_INT(j->n_plp, j->prompt_lp ? j->n_prompt - 1 : 0);
            for (int t = 0; t < j->n_plp; t++)
                KT_CHECKF(fabsf(j->plp[t] - ref[i % 3][t]) <= 1e-5f, "mode %d job %d position %d: %g against %g",
                          mode, i, t + 1, (double)j->plp[t], (double)ref[i % 3][t]);
            KT_EQ_INT(j->stop, KILN_STOP_MAX_TOKENS);
            KT_EQ_INT(j->n_got, j->max_tokens);
            job plain = *j, alone;
            plain.prompt_lp = 0;
            plain.logprobs = 0;
            run_alone_sched(stories, 0, &plain, &alone);
            expect_same_tokens(j, &alone, "prompt logprobs", i);
        }
    }
}

/* Out-of-range options are refused at submit, naming them. */
static void test_option_ranges(void) {
    KT_REQUIRE(stories);
    kiln_executor *x = NULL;
    kiln_sched *s = NULL;
    kiln_error err = {0};
    KT_REQUIRE(kiln_cpu_executor_new(stories, 1, 64, 0, 1, &x, &err) == KILN_OK);
    kiln_sched_opts so = {0};
    KT_REQUIRE(kiln_sched_new(x, &so, &s, &err) == KILN_OK);
    int32_t p[3] = {1, 2, 3};
    int64_t id;
    struct { kiln_sched_request r; const char *says; } bad[] = {
        {{.samp = {.top_p = 1, .min_p = 1.5f}}, "min-p"},
        {{.samp = {.top_p = 1, .min_p = NAN}}, "min-p"},
        {{.samp = {.top_p = 1}, .pen = {.presence = 2.5f}}, "presence"},
        {{.samp = {.top_p = 1}, .pen = {.frequency = -3}}, "frequency"},
        {{.samp = {.top_p = 1}, .pen = {.repetition = -1}}, "repetition"},
        {{.samp = {.top_p = 1}, .pen = {.repetition = 11}}, "repetition"},
        {{.samp = {.top_p = 1}, .logprobs = true, .top_logprobs = 21, .cb_info = job_info_cb}, "logprobs"},
        {{.samp = {.top_p = 1}, .logprobs = true, .top_logprobs = 2}, "on_token_info"},
        {{.samp = {.top_p = 1}, .cb = job_cb, .cb_info = job_info_cb}, "not both"},
        {{.samp = {.top_p = 1}, .prompt_logprobs = true, .prompt_top_logprobs = 21, .cb_info = job_info_cb},
         "prompt logprobs"},
        {{.samp = {.top_p = 1}, .prompt_logprobs = true, .prompt_top_logprobs = -1, .cb_info = job_info_cb},
         "prompt logprobs"},
        {{.samp = {.top_p = 1}, .prompt_logprobs = true, .cb = job_cb}, "on_token_info"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        bad[i].r.prompt = p;
        bad[i].r.n_prompt = 3;
        bad[i].r.max_tokens = 2;
        KT_EQ_INT(kiln_sched_submit(s, &bad[i].r, &id, &err), KILN_ERR_INVALID_ARG);
        KT_CONTAINS(err.msg, bad[i].says);
    }
    kiln_sched_free(s);
    x->ops->destroy(x);
}

int main(void) {
    if (!kt_tmpdir(tmpdir, sizeof tmpdir, "sched")) return 1;
    stories = compile_and_open("models/stories260k", "stories");
    mistral = compile_and_open("tests/data/tiny-mistral", "mistral");
    llama3 = compile_and_open("tests/data/tiny-llama3", "llama3");
    rmdir(tmpdir);
    KT_RUN(test_sample_uniform);
    KT_RUN(test_sample_greedy_and_ties);
    KT_RUN(test_sample_matches_reference);
    KT_RUN(test_sample_distribution);
    KT_RUN(test_sample_large_vocab_cost);
    KT_RUN(test_cpu_executor_reserve);
    KT_RUN(test_alone_paths_agree);
    KT_RUN(test_batched_greedy_stories);
    KT_RUN(test_batched_greedy_tiny_mistral);
    KT_RUN(test_batched_sampling_stories);
    KT_RUN(test_batched_sampling_tiny_mistral);
    KT_RUN(test_chunked_prefill);
    KT_RUN(test_context_limits);
    KT_RUN(test_kv_budget_queueing);
    KT_RUN(test_never_fits);
    KT_RUN(test_nonfinite_logits);
    KT_RUN(test_score_nonfinite);
    KT_RUN(test_prompt_logprobs_nonfinite);
    KT_RUN(test_cancel);
    KT_RUN(test_stops);
    KT_RUN(test_sched_options);
    KT_RUN(test_penalties_reference);
    KT_RUN(test_logprobs_reference);
    KT_RUN(test_penalties_end_to_end);
    KT_RUN(test_preemption);
    KT_RUN(test_prompt_logprobs);
    KT_RUN(test_option_ranges);
    kiln_model_close(stories);
    kiln_model_close(mistral);
    kiln_model_close(llama3);
    return KT_END();
}
