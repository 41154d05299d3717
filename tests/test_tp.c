/*
 * test_tp.c — tensor parallelism on the CPU (kiln compile --tp N, pass
 * tensor-parallel, plan version 3, docs/parallelism.md):
 *   - the pass: which ops are split and how (weight shards, head counts,
 *     all_reduce after o_proj, down_proj and the embedding, all_gather after
 *     the LM head), that the fusions after it leave the residual add after
 *     the reduction, and refusals when a size does not divide;
 *   - the engine: every rank's shards in their own aligned range, rank r's
 *     shard equal to the r-th slice of the tp=1 weight; a tp=1 engine is the
 *     same bytes whether --tp 1 is given or not;
 *   - numbers: the tp=N plan run rank by rank on the CPU executor (the
 *     all-reduce done in memory) gives the tp=1 logits to fp32 rounding at
 *     every position, and the same greedy tokens through the KV cache, for
 *     every reference model (GQA, sliding window, llama3 RoPE, tied
 *     embeddings, Qwen3's head norms, Qwen2's q/k/v biases, and the shared pycode-22m when present),
 *     with the default passes and none.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "codegen/kiln_codegen.h"
#include "compiler/kiln_compiler.h"
#include "kt.h"
#include "kt_fixture.h"
#include "passes/kiln_passes.h"
#include "runtime/kiln_rt.h"

static char tmpdir[256];

static const char *src_path(const char *rel) {
    static char buf[4][1024];
    static int k;
    char *b = buf[k++ % 4];
    snprintf(b, sizeof buf[0], "%s/%s", KILN_SOURCE_DIR, rel);
    return b;
}

static kiln_graph *import(const char *rel, kiln_checkpoint *ck) {
    kiln_error err = {0};
    if (kiln_checkpoint_open(src_path(rel), ck, &err) != KILN_OK) {
        fprintf(stderr, "  %s\n", err.msg);
        return NULL;
    }
    kiln_graph *g = NULL;
    if (kiln_import(ck, &g, &err) != KILN_OK) fprintf(stderr, "  import: %s\n", err.msg);
    return g;
}

/* The live weight named `name`, or NULL. */
static const kiln_value *weight(const kiln_graph *g, const char *name) {
    for (int v = 0; v < g->n_values; v++)
        if (!g->values[v].dead && g->values[v].kind == KILN_VALUE_WEIGHT && strcmp(g->values[v].name, name) == 0)
            return &g->values[v];
    return NULL;
}

/* The op that reads value v (first live one), or NULL. */
static const kiln_op *reader(const kiln_graph *g, int v) {
    for (int i = 0; i < g->n_ops; i++)
        if (!g->ops[i].dead)
            for (int j = 0; j < g->ops[i].n_in; j++)
                if (g->ops[i].in[j] == v) return &g->ops[i];
    return NULL;
}

/* tiny-mistral (4 heads, 2 KV heads, head_dim 16, hidden 64, ffn 128, vocab 256, 2 layers) over 2 ranks. */
static void test_pass_splits(void) {
    kiln_checkpoint ck;
    kiln_graph *g = import("tests/data/tiny-mistral", &ck);
    KT_REQUIRE(g != NULL);
    kiln_error err = {0};
    g->tp_request = 2;
    int n = kiln_pass_tensor_parallel(g, &err);
    KT_CHECKF(n > 0, "%s", err.msg);
    KT_CHECK(kiln_ir_verify(g, &err) == KILN_OK);
    KT_EQ_INT(g->n_ranks, 2);
    KT_EQ_INT(g->info.n_kv_heads, 1); /* one rank's KV cache */
    KT_EQ_INT(kiln_ir_count_ops(g, KILN_OP_ALL_REDUCE), 1 + 2 * 2); /* embedding, o_proj and down_proj per layer */
    KT_EQ_INT(kiln_ir_count_ops(g, KILN_OP_ALL_GATHER), 1);          /* the logits */
    struct { const char *name; kiln_shard shard; int64_t rows, cols; } want[] = {
        {"model.embed_tokens.weight", KILN_SHARD_ROWS, 128, 64},
        {"model.layers.0.self_attn.q_proj.weight", KILN_SHARD_ROWS, 32, 64},
        {"model.layers.0.self_attn.k_proj.weight", KILN_SHARD_ROWS, 16, 64},
        {"model.layers.0.self_attn.v_proj.weight", KILN_SHARD_ROWS, 16, 64},
        {"model.layers.1.self_attn.o_proj.weight", KILN_SHARD_COLS, 64, 32},
        {"model.layers.1.mlp.gate_proj.weight", KILN_SHARD_ROWS, 64, 64},
        {"model.layers.1.mlp.up_proj.weight", KILN_SHARD_ROWS, 64, 64},
        {"model.layers.0.mlp.down_proj.weight", KILN_SHARD_COLS, 64, 64},
        {"lm_head.weight", KILN_SHARD_ROWS, 128, 64},
        {"model.layers.0.input_layernorm.weight", KILN_SHARD_NONE, 64, 0},
        {"model.norm.weight", KILN_SHARD_NONE, 64, 0},
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        const kiln_value *w = weight(g, want[i].name);
        KT_CHECKF(w != NULL, "%s", want[i].name);
        if (!w) continue;
        KT_CHECKF(w->shard == want[i].shard && w->shape[0] == want[i].rows && (w->ndim == 1 || w->shape[1] == want[i].cols),
                  "%s: shard %d [%lld,%lld]", want[i].name, (int)w->shard, (long long)w->shape[0],
                  (long long)(w->ndim > 1 ? w->shape[1] : 0));
    }
    int attention = 0;
    for (int i = 0; i < g->n_ops; i++) {
        const kiln_op *op = &g->ops[i];
        if (op->dead) continue;
        if (op->kind == KILN_OP_ATTENTION) {
            attention++;
            KT_EQ_INT(op->attrs.n_heads, 2);
            KT_EQ_INT(op->attrs.n_kv_heads, 1);
        }
        if (op->kind == KILN_OP_EMBEDDING) KT_EQ_INT(op->attrs.ranks, 2);
        /* a row-parallel projection's partial sums go straight into an all_reduce */
        if (op->kind == KILN_OP_LINEAR && g->values[op->in[1]].shard == KILN_SHARD_COLS) {
            const kiln_op *r = reader(g, op->out[0]);
            KT_CHECK(r && r->kind == KILN_OP_ALL_REDUCE && r->attrs.ranks == 2);
        }
    }
    KT_EQ_INT(attention, 2);
    const kiln_value *lg = &g->values[g->logits];
    KT_EQ_INT(lg->shape[2], 256);
    KT_EQ_INT(g->ops[lg->producer].kind, KILN_OP_ALL_GATHER);

    /* the default fusions after it: q/k/v and gate/up still pack (per rank), the residual add stays
     * after each all_reduce (fuse-linear-residual would add it once per rank) */
    KT_CHECK(kiln_passes_run(g, NULL, NULL, &err) == KILN_OK);
    KT_EQ_INT(kiln_ir_count_ops(g, KILN_OP_LINEAR_ADD), 0);
    KT_EQ_INT(kiln_ir_count_ops(g, KILN_OP_QKV_ROPE_PACKED), 2);
    KT_EQ_INT(kiln_ir_count_ops(g, KILN_OP_GATE_UP_SWIGLU_PACKED), 2);
    KT_EQ_INT(kiln_ir_count_ops(g, KILN_OP_ALL_REDUCE), 5);
    kiln_graph_free(g);
    kiln_checkpoint_close(&ck);
}

/* kiln_passes_run runs the pass first when tp_request > 1, whatever --passes says; not at all at 1. */
static void test_pass_runs_with_tp_only(void) {
    kiln_checkpoint ck;
    kiln_graph *g = import("tests/data/tiny-mistral", &ck);
    KT_REQUIRE(g != NULL);
    kiln_error err = {0};
    KT_CHECK(kiln_passes_run(g, "none", NULL, &err) == KILN_OK);
    KT_EQ_INT(kiln_ir_count_ops(g, KILN_OP_ALL_REDUCE), 0);
    KT_EQ_INT(g->n_ranks, 0);
    kiln_graph_free(g);
    kiln_checkpoint_close(&ck);
    g = import("tests/data/tiny-mistral", &ck);
    KT_REQUIRE(g != NULL);
    g->tp_request = 2;
    KT_CHECK(kiln_passes_run(g, "none", NULL, &err) == KILN_OK);
    KT_EQ_INT(kiln_ir_count_ops(g, KILN_OP_ALL_REDUCE), 5);
    /* the verifier refuses a collective for another rank count */
    for (int i = 0; i < g->n_ops; i++)
        if (g->ops[i].kind == KILN_OP_ALL_REDUCE) {
            g->ops[i].attrs.ranks = 4;
            break;
        }
    KT_CHECK(kiln_ir_verify(g, &err) == KILN_ERR_VERIFY);
    kiln_graph_free(g);
    kiln_checkpoint_close(&ck);
}

/* Sizes that do not divide are refused by name, before any work. */
static void test_refuses_indivisible(void) {
    char out[512];
    snprintf(out, sizeof out, "%s/bad.kiln", tmpdir);
    struct { int tp; const char *name; } cases[] = {{3, "num_attention_heads"}, {4, "num_key_value_heads"}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        kiln_compile_options opt = {.output_path = out, .weight_dtype = KILN_DTYPE_COUNT_, .tp = cases[i].tp};
        kiln_error err = {0};
        KT_EQ_INT(kiln_compile(src_path("tests/data/tiny-mistral"), &opt, &err), KILN_ERR_UNSUPPORTED);
        KT_CHECKF(strstr(err.msg, cases[i].name) && strstr(err.msg, "--tp"), "%s", err.msg);
        KT_CHECK(access(out, F_OK) != 0);
    }
    /* the pass itself, on a graph the driver did not check: the KV heads */
    kiln_checkpoint ck;
    kiln_graph *g = import("tests/data/tiny-mistral", &ck);
    KT_REQUIRE(g != NULL);
    kiln_error err = {0};
    g->tp_request = 4;
    KT_EQ_INT(kiln_pass_tensor_parallel(g, &err), -1);
    KT_CHECKF(strstr(err.msg, "KV heads") != NULL, "%s", err.msg);
    kiln_graph_free(g);
    kiln_checkpoint_close(&ck);
}

/* The KV cache the engines below get (0: the element type; KILN_FLAG_KV_FP8 / _INT8: 8 bits), with
 * g_kv_scales as its scales, or (NULL) calibrated on g_kv_ids. */
static uint32_t g_kv;
static const float *g_kv_scales;
static char g_kv_ids[512];

static int g_quant; /* --quant for the engines below (0: none; the LM head then int8, as the CLI's default) */

static int compile(const char *ckpt, const char *passes, int tp, const char *out) {
    kiln_compile_options opt = {.output_path = out, .weight_dtype = KILN_DTYPE_COUNT_, .passes = passes, .tp = tp,
                                .quant = g_quant, .quant_head = g_quant ? KILN_DTYPE_Q8 : 0,
                                .kv_dtype = g_kv, .kv_scales = g_kv ? g_kv_scales : NULL,
                                .calib_ids_path = g_kv && !g_kv_scales ? g_kv_ids : NULL,
                                .calib_tokens = g_kv && !g_kv_scales ? 256 : 0};
    return kt_compile(ckpt, &opt);
}

/* The engine holds each rank's shards in its own range; rank r's q_proj shard is rows r*R.. of the
 * tp=1 engine's q_proj, rank r's o_proj shard the columns r*C.. of each row. */
static void test_engine_layout(void) {
    char e1[512], e2[512];
    snprintf(e1, sizeof e1, "%s/layout1.kiln", tmpdir);
    snprintf(e2, sizeof e2, "%s/layout2.kiln", tmpdir);
    const char *ck = src_path("tests/data/tiny-mistral");
    KT_REQUIRE(compile(ck, "none", 1, e1) == KILN_OK && compile(ck, "none", 2, e2) == KILN_OK);
    kiln_model *m1 = NULL, *m2 = NULL;
    kiln_error err = {0};
    KT_REQUIRE(kiln_model_open(e1, 1, &m1, &err) == KILN_OK);
    KT_REQUIRE(kiln_model_open(e2, 1, &m2, &err) == KILN_OK);
    const kiln_plan *p1 = m1->plan, *p2 = m2->plan;
    KT_EQ_INT(p1->n_ranks, 1);
    KT_EQ_INT(p2->n_ranks, 2);
    KT_EQ_INT(p2->n_weights, p1->n_weights);
    uint64_t b0, e0, b1, eend;
    kiln_plan_rank_range(p2, 0, &b0, &e0);
    kiln_plan_rank_range(p2, 1, &b1, &eend);
    KT_EQ_INT(b0, 0);
    KT_CHECK(e0 <= b1 && b1 % KILN_PLAN_RANK_ALIGN == 0 && eend == m2->weights_size);
    for (uint32_t i = 0; i < p1->n_weights; i++) {
        const kiln_plan_weight *w = &p1->weights[i];
        bool rows = strstr(w->name, "q_proj") != NULL, cols = strstr(w->name, "o_proj") != NULL;
        if (!rows && !cols) continue;
        const size_t es = (size_t)kiln_dtype_size((kiln_dtype)w->dtype);
        for (uint32_t r = 0; r < 2; r++) {
            const kiln_plan_weight *s = &kiln_plan_rank_weights(p2, r)[i];
            KT_EQ_STR(s->name, w->name);
            KT_EQ_INT(rows ? s->shape[0] * 2 : s->shape[1] * 2, rows ? w->shape[0] : w->shape[1]);
            bool same = true;
            for (int64_t row = 0; row < s->shape[0]; row++) {
                const uint8_t *a = m2->weights + s->offset + (size_t)row * (size_t)s->shape[1] * es;
                const uint8_t *b = rows ? m1->weights + w->offset + (size_t)(r * s->shape[0] + row) * (size_t)w->shape[1] * es
                                        : m1->weights + w->offset + ((size_t)row * (size_t)w->shape[1] + r * (size_t)s->shape[1]) * es;
                same &= memcmp(a, b, (size_t)s->shape[1] * es) == 0;
            }
            KT_CHECKF(same, "%s rank %u", w->name, r);
        }
    }
    kiln_model_close(m1);
    kiln_model_close(m2);
    unlink(e1);
    unlink(e2);
}

/* Each rank can read its own range of the weights section alone: a pointer into the file when the
 * engine is uncompressed, only the zstd chunks that hold it otherwise. The chunks are 4 MiB, so
 * tiny-mistral has one; the shared pycode-22m (44 MB), when present, has eleven and rank 1's range
 * starts inside one of them. */
static void test_rank_reads_its_range(void) {
    char pycode[1024];
    snprintf(pycode, sizeof pycode, "%s/models/pycode-22m", KILN_SHARED_DIR);
    const struct { const char *ck; bool compress; } cases[] = {
        {src_path("tests/data/tiny-mistral"), false}, {src_path("tests/data/tiny-mistral"), true},
        {pycode, true}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        if (!kiln_path_is_dir(cases[c].ck)) {
            fprintf(stderr, "  (%s not present: no many-chunk case)\n", cases[c].ck);
            continue;
        }
        char e[512];
        snprintf(e, sizeof e, "%s/range.kiln", tmpdir);
        kiln_compile_options opt = {.output_path = e, .weight_dtype = KILN_DTYPE_COUNT_, .tp = 2,
                                    .compress = cases[c].compress};
        KT_REQUIRE(kt_compile(cases[c].ck, &opt) == KILN_OK);
        kiln_model *m = NULL;
        kiln_error err = {0};
        KT_REQUIRE(kiln_model_open_ex(e, 2, KILN_MODEL_NO_F32, &m, &err) == KILN_OK);
        const kiln_engine_section *s = kiln_engine_find(&m->engine, KILN_SECTION_WEIGHTS);
        KT_REQUIRE(s != NULL);
        for (uint32_t r = 0; r < m->plan->n_ranks; r++) {
            uint64_t b, end;
            kiln_plan_rank_range(m->plan, r, &b, &end);
            const uint8_t *d = NULL, *base = NULL;
            KT_CHECK(kiln_engine_section_range(&m->engine, s, b, end, 2, &d, &base, &err) == KILN_OK);
            KT_CHECK(d && memcmp(d, m->weights + b, (size_t)(end - b)) == 0);
            KT_CHECK(cases[c].compress ? base != NULL : (base == NULL && d == m->weights + b));
            free((void *)base);
        }
        const uint8_t *d = NULL, *base = NULL;
        KT_EQ_INT(kiln_engine_section_range(&m->engine, s, 1, s->raw_size + 1, 1, &d, &base, &err),
                  KILN_ERR_INVALID_ARG);
        kiln_model_close(m);
        unlink(e);
    }
}

/* --tp 1 and no --tp write the same bytes (a tp=1 engine is what kiln wrote before tensor parallelism). */
static void test_tp1_same_bytes(void) {
    char a[512], b[512];
    snprintf(a, sizeof a, "%s/tp0.kiln", tmpdir);
    snprintf(b, sizeof b, "%s/tp1.kiln", tmpdir);
    const char *ck = src_path("tests/data/tiny-llama3");
    KT_REQUIRE(compile(ck, NULL, 0, a) == KILN_OK && compile(ck, NULL, 1, b) == KILN_OK);
    size_t na = 0, nb = 0;
    char *da = NULL, *db = NULL;
    kiln_error err = {0};
    KT_CHECK(kiln_file_read(a, 1 << 26, &da, &na, &err) == KILN_OK && kiln_file_read(b, 1 << 26, &db, &nb, &err) == KILN_OK);
    KT_CHECK(da && db && na == nb && memcmp(da, db, na) == 0);
    free(da);
    free(db);
    unlink(a);
    unlink(b);
}

/* The plan reader refuses a version 3 plan whose rank count, weight table or collectives disagree. */
static void test_plan_reader_refusals(void) {
    char e2[512];
    snprintf(e2, sizeof e2, "%s/reader.kiln", tmpdir);
    KT_REQUIRE(compile(src_path("tests/data/tiny-mistral"), NULL, 2, e2) == KILN_OK);
    kiln_model *m = NULL;
    kiln_error err = {0};
    KT_REQUIRE(kiln_model_open_ex(e2, 1, KILN_MODEL_NO_F32, &m, &err) == KILN_OK);
    const kiln_engine_section *s = kiln_engine_find(&m->engine, KILN_SECTION_PLAN);
    const uint8_t *d = NULL;
    size_t n = 0;
    bool owned = false;
    KT_REQUIRE(s && kiln_engine_section_bytes(&m->engine, s, 1, &d, &n, &owned, &err) == KILN_OK);
    uint8_t *b = malloc(n);
    KT_REQUIRE(b != NULL);
    const uint64_t wsize = m->weights_size;
    kiln_plan *p = NULL;
    memcpy(b, d, n);
    KT_CHECK(kiln_plan_parse(b, n, wsize, &p, &err) == KILN_OK && p && p->n_ranks == 2);
    const uint32_t n_values = p ? p->n_values : 0, n_slots = p ? p->n_slots : 0, n_weights = p ? p->n_weights : 0;
    kiln_plan_free(p);
    kiln_wr_u32(b + 60, 3); /* 3 ranks: the weight table no longer fits the section */
    KT_EQ_INT(kiln_plan_parse(b, n, wsize, &p, &err), KILN_ERR_FORMAT);
    kiln_wr_u32(b + 4, KILN_PLAN_VERSION_TP); /* version 3 (a reader's older format) of one rank */
    kiln_wr_u32(b + 60, 1);
    KT_EQ_INT(kiln_plan_parse(b, n, wsize, &p, &err), KILN_ERR_FORMAT);
    KT_CHECKF(strstr(err.msg, "ranks") != NULL, "%s", err.msg);
    memcpy(b, d, n);
    kiln_wr_u32(b + 4, 2); /* the tp plan labelled version 2: one weight table, and collectives for 2 ranks */
    kiln_wr_u32(b + 60, 0);
    KT_EQ_INT(kiln_plan_parse(b, n, wsize, &p, &err), KILN_ERR_FORMAT);
    memcpy(b, d, n);
    /* rank 1's record of weight 0 renamed */
    size_t rec1 = KILN_PLAN_HEADER_SIZE + (size_t)n_slots * KILN_PLAN_SLOT_SIZE +
                  (size_t)n_values * KILN_PLAN_VALUE_SIZE + (size_t)n_weights * KILN_PLAN_WEIGHT_SIZE;
    b[rec1] ^= 1;
    KT_EQ_INT(kiln_plan_parse(b, n, wsize, &p, &err), KILN_ERR_FORMAT);
    KT_CHECKF(strstr(err.msg, "does not match rank 0") != NULL, "%s", err.msg);
    free(b);
    if (owned) free((void *)d);
    kiln_model_close(m);
    unlink(e2);
}

static double max_logit_diff_seen; /* over every model and pipeline: the report's number */

/* Compile ckpt at tp=1 and tp=n with `passes`; compare all logits of one forward over `len` tokens
 * and greedy decoding through the KV cache. */
static void check_tp_logits(const char *ckpt, const char *passes, int n, int len) {
    char e1[512], en[512];
    snprintf(e1, sizeof e1, "%s/ref.kiln", tmpdir);
    snprintf(en, sizeof en, "%s/tp%d.kiln", tmpdir, n);
    KT_REQUIRE(compile(ckpt, passes, 1, e1) == KILN_OK && compile(ckpt, passes, n, en) == KILN_OK);
    kiln_model *m1 = NULL, *mn = NULL;
    kiln_error err = {0};
    KT_REQUIRE(kiln_model_open(e1, 2, &m1, &err) == KILN_OK);
    KT_REQUIRE(kiln_model_open(en, 2, &mn, &err) == KILN_OK);
    KT_EQ_INT(mn->plan->n_ranks, n);
    const int vocab = m1->plan->vocab_size;
    int32_t *toks = malloc((size_t)len * sizeof *toks);
    for (int i = 0; i < len; i++) toks[i] = (int32_t)((i * 7919 + 13) % vocab);
    float *l1 = malloc((size_t)len * (size_t)vocab * sizeof *l1), *ln = malloc((size_t)len * (size_t)vocab * sizeof *ln);
    kiln_cpu_ctx *c1 = NULL, *cn = NULL;
    KT_REQUIRE(kiln_cpu_ctx_new(m1, 0, len, 2, &c1, &err) == KILN_OK);
    KT_REQUIRE(kiln_cpu_ctx_new(mn, 0, len, 2, &cn, &err) == KILN_OK);
    KT_CHECK(kiln_cpu_forward(c1, toks, len, true, l1, &err) == KILN_OK);
    KT_CHECK(kiln_cpu_forward(cn, toks, len, true, ln, &err) == KILN_OK);
    double max_diff = 0, lo = INFINITY, hi = -INFINITY;
    for (size_t i = 0; i < (size_t)len * (size_t)vocab; i++) {
        double d = fabs((double)l1[i] - (double)ln[i]);
        if (!(d <= max_diff)) max_diff = d; /* NaN propagates */
        if (l1[i] < lo) lo = l1[i];
        if (l1[i] > hi) hi = l1[i];
    }
    const double range = hi - lo;
    /* fp32: the reduction adds the ranks' partial sums where tp=1 adds one dot product: a few ulps */
    KT_CHECKF(max_diff <= 1e-5 * range, "%s --passes %s --tp %d: max |logit diff| %.3g > 1e-5 x range %.3g", ckpt,
              passes ? passes : "default", n, max_diff, range);
    fprintf(stderr, "  %s --passes %s --tp %d: %d positions, max |tp%d - tp1| logit %.3g (range %.3g)\n", ckpt,
            passes ? passes : "default", n, len, n, max_diff, range);
    if (max_diff > max_logit_diff_seen && !g_quant) max_logit_diff_seen = max_diff;
    /* greedy decoding, token by token through each rank's KV cache */
    kiln_cpu_ctx_reset(c1);
    kiln_cpu_ctx_reset(cn);
    kiln_generate_opts o = {.max_tokens = 24, .temperature = 0, .top_p = 1, .ignore_eos = true};
    kiln_generate_result r1 = {0}, rn = {0};
    KT_CHECK(kiln_generate(c1, toks, 5, &o, &r1, &err) == KILN_OK);
    KT_CHECK(kiln_generate(cn, toks, 5, &o, &rn, &err) == KILN_OK);
    KT_CHECK(r1.n_ids == rn.n_ids && r1.n_ids > 0 && memcmp(r1.ids, rn.ids, (size_t)r1.n_ids * sizeof *r1.ids) == 0);
    free(r1.ids);
    free(rn.ids);
    kiln_cpu_ctx_free(c1);
    kiln_cpu_ctx_free(cn);
    free(toks);
    free(l1);
    free(ln);
    kiln_model_close(m1);
    kiln_model_close(mn);
    unlink(e1);
    unlink(en);
}

static void test_logits_tiny_mistral(void) { /* GQA 4/2, sliding window 8 (the sequence is longer) */
    check_tp_logits(src_path("tests/data/tiny-mistral"), NULL, 2, 20);
    check_tp_logits(src_path("tests/data/tiny-mistral"), "none", 2, 20);
}

static void test_logits_tiny_llama3(void) { /* llama3 RoPE scaling, tied embeddings: one table, two uses */
    check_tp_logits(src_path("tests/data/tiny-llama3"), NULL, 2, 16);
}

static void test_logits_tiny_qwen3(void) { /* per-head q/k RMSNorm on each rank's heads */
    check_tp_logits(src_path("tests/data/tiny-qwen3"), NULL, 2, 16);
}

static void test_logits_tiny_qwen2(void) { /* q/k/v biases split with their rows, a window on one layer, tied */
    check_tp_logits(src_path("tests/data/tiny-qwen2"), NULL, 2, 16);
    check_tp_logits(src_path("tests/data/tiny-qwen2"), "none", 2, 16);
}

static void test_logits_stories260k(void) { /* a trained model: 8/4 heads, ffn 172, vocab 512: tp 2 and 4 */
    check_tp_logits(src_path("models/stories260k"), NULL, 2, 32);
    check_tp_logits(src_path("models/stories260k"), NULL, 4, 32);
    check_tp_logits(src_path("models/stories260k"), "none", 4, 32);
}

/* An 8-bit KV cache (--kv-dtype fp8|int8) split with the heads: each rank's attention holds its kv
 * heads' codes and reads its shard of each layer's scales ([K of its heads; V of its heads]), so the
 * tp=N plan gives the tp=1 logits to fp32 rounding as with a bf16 cache: with given scales, and with
 * scales calibrated (on the whole model, whatever --tp says, so both engines get the same ones). */
static void test_logits_kv8(void) {
    static float scales[5 * 2 * 4]; /* stories260k's 5 layers x 2 x 4 kv heads, the most here */
    for (size_t i = 0; i < sizeof scales / sizeof scales[0]; i++) scales[i] = 0.02f + 0.005f * (float)(i % 7);
    snprintf(g_kv_ids, sizeof g_kv_ids, "%s/kv-calib.ids", tmpdir);
    FILE *f = fopen(g_kv_ids, "w");
    KT_REQUIRE(f != NULL);
    for (int i = 0; i < 256; i++) fprintf(f, "%d ", (i * 104729 + 11) % 250);
    fclose(f);
    const uint32_t kinds[2] = {KILN_FLAG_KV_FP8, KILN_FLAG_KV_INT8};
    for (int k = 0; k < 2; k++) {
        g_kv = kinds[k];
        g_kv_scales = scales;
        check_tp_logits(src_path("tests/data/tiny-mistral"), NULL, 2, 20);  /* 2 kv heads: one a rank */
        check_tp_logits(src_path("models/stories260k"), NULL, 4, 32);      /* 4 kv heads over 4 ranks */
        g_kv_scales = NULL;                                                 /* calibrated */
        check_tp_logits(src_path("tests/data/tiny-mistral"), NULL, 2, 20);
    }
    /* the engine: rank r's kv_scale shard is [K scales of its heads; V scales of its heads] */
    g_kv = KILN_FLAG_KV_FP8;
    g_kv_scales = scales;
    char en[512];
    snprintf(en, sizeof en, "%s/kv8-tp4.kiln", tmpdir);
    KT_REQUIRE(compile(src_path("models/stories260k"), NULL, 4, en) == KILN_OK);
    kiln_model *m = NULL;
    kiln_error err = {0};
    KT_REQUIRE(kiln_model_open(en, 1, &m, &err) == KILN_OK);
    int seen = 0;
    for (int r = 0; r < 4; r++)
        for (uint32_t i = 0; i < m->plan->n_weights; i++) {
            const kiln_plan_weight *w = &m->plan->weights[i];
            int layer = -1;
            const char *tail = strstr(w->name, ".self_attn.kv_scale");
            if (!tail || strcmp(tail, ".self_attn.kv_scale") || sscanf(w->name, "model.layers.%d.", &layer) != 1) continue;
            KT_EQ_INT(w->shape[0], 2); /* one kv head a rank: its K scale, its V scale */
            const float *got = m->wf32[(size_t)r * m->plan->n_weights + i];
            KT_CHECK(got[0] == kiln_kv_scale_bf16(scales[layer * 8 + r]) &&
                     got[1] == kiln_kv_scale_bf16(scales[layer * 8 + 4 + r]));
            seen++;
        }
    KT_EQ_INT(seen, 4 * 5);
    kiln_model_close(m);
    unlink(en);
    g_kv = 0;
    g_kv_scales = NULL;
}

/* All logits of one forward over `len` tokens of the engine compiled from ckpt with g_quant at --tp tp. */
static float *quant_logits(const char *ckpt, int tp, int len, int *vocab) {
    char e[512];
    snprintf(e, sizeof e, "%s/ql-%d.kiln", tmpdir, tp);
    kiln_model *m = NULL;
    kiln_error err = {0};
    if (compile(ckpt, NULL, tp, e) != KILN_OK || kiln_model_open(e, 2, &m, &err) != KILN_OK) return NULL;
    *vocab = m->plan->vocab_size;
    int32_t *toks = malloc((size_t)len * sizeof *toks);
    float *l = malloc((size_t)len * (size_t)*vocab * sizeof *l);
    for (int i = 0; i < len; i++) toks[i] = (int32_t)((i * 7919 + 13) % *vocab);
    kiln_cpu_ctx *c = NULL;
    if (kiln_cpu_ctx_new(m, 0, len, 2, &c, &err) != KILN_OK || kiln_cpu_forward(c, toks, len, true, l, &err) != KILN_OK) {
        fprintf(stderr, "  %s: %s\n", e, err.msg);
        free(l);
        l = NULL;
    }
    kiln_cpu_ctx_free(c);
    kiln_model_close(m);
    unlink(e);
    free(toks);
    return l;
}


/* q8 / fp8 at --tp n: a row-parallel shard (o_proj, down_proj) gets its own scale per row over its
 * columns, so its codes are another rounding of the same weights than tp=1's: the tp=n engine must be
 * as near the unquantized model as the tp=1 one (its logits' relative error at most 1.5 x tp=1's). */
static void check_tp_quant_noise(const char *ckpt, int quant, int n, int len) {
    int V = 0;
    g_quant = 0;
    float *dense = quant_logits(ckpt, 1, len, &V);
    g_quant = quant;
    float *q1 = quant_logits(ckpt, 1, len, &V), *qn = quant_logits(ckpt, n, len, &V);
    g_quant = 0;
    KT_REQUIRE(dense && q1 && qn);
    const size_t all = (size_t)len * (size_t)V;
    const double e1 = kt_rel_l2(q1, dense, all), en = kt_rel_l2(qn, dense, all);
    fprintf(stderr, "  %s --quant %s: logits rel err against the unquantized model %.3g at tp 1, %.3g at tp %d\n",
            ckpt, kiln_dtype_name((kiln_dtype)quant), e1, en, n);
    KT_CHECKF(en <= 1.5 * e1 + 1e-4 && e1 > 0, "%s --quant %s --tp %d: %.3g against tp 1's %.3g", ckpt,
              kiln_dtype_name((kiln_dtype)quant), n, en, e1);
    free(dense), free(q1), free(qn);
}

/* --quant with --tp: each rank's shard of a matrix quantized as that rank's matrix. q4g32 on tiny-mistral:
 * a row-parallel shard's columns are whole groups of the row and the other matrices keep whole rows, so
 * every code and scale is the tp=1 engine's: the tp=1 logits to fp32 rounding and the same tokens. q8 and
 * fp8 (and stories260k, whose down_proj columns take no q4 group: q8): check_tp_quant_noise; and rank r's
 * int8 o_proj shard, dequantized, is the dense weight's columns of that rank within half a step of its own
 * per-row scale (max |w| / 127). */
static void test_logits_quant(void) {
    g_quant = KILN_DTYPE_Q4G32;
    check_tp_logits(src_path("tests/data/tiny-mistral"), NULL, 2, 20);
    check_tp_logits(src_path("tests/data/tiny-mistral"), "none", 2, 20);
    g_quant = 0;
    check_tp_quant_noise(src_path("models/stories260k"), KILN_DTYPE_Q4G32, 2, 32);
    const int q8[2] = {KILN_DTYPE_Q8, KILN_DTYPE_FP8};
    for (int k = 0; k < 2; k++) {
        check_tp_quant_noise(src_path("tests/data/tiny-mistral"), q8[k], 2, 20);
        check_tp_quant_noise(src_path("models/stories260k"), q8[k], 4, 32);
    }
    /* the int8 o_proj shards against the dense weight */
    char ed[512], eq[512];
    snprintf(ed, sizeof ed, "%s/dense.kiln", tmpdir);
    snprintf(eq, sizeof eq, "%s/q8tp2.kiln", tmpdir);
    g_quant = 0;
    KT_REQUIRE(compile(src_path("tests/data/tiny-mistral"), NULL, 1, ed) == KILN_OK);
    g_quant = KILN_DTYPE_Q8;
    KT_REQUIRE(compile(src_path("tests/data/tiny-mistral"), NULL, 2, eq) == KILN_OK);
    g_quant = 0;
    kiln_model *md = NULL, *mq = NULL;
    kiln_error err = {0};
    KT_REQUIRE(kiln_model_open(ed, 1, &md, &err) == KILN_OK && kiln_model_open(eq, 1, &mq, &err) == KILN_OK);
    const char *name = "model.layers.1.self_attn.o_proj.weight";
    int wd = -1, wq = -1;
    for (uint32_t i = 0; i < md->plan->n_weights; i++)
        if (!strcmp(md->plan->weights[i].name, name)) wd = (int)i;
    for (uint32_t i = 0; i < mq->plan->n_weights; i++)
        if (!strcmp(mq->plan->weights[i].name, name)) wq = (int)i;
    KT_REQUIRE(wd >= 0 && wq >= 0);
    KT_EQ_INT(mq->plan->weights[wq].dtype, KILN_DTYPE_Q8);
    const int64_t N = md->plan->weights[wd].shape[0], K = md->plan->weights[wd].shape[1], C = K / 2;
    KT_EQ_INT(mq->plan->weights[wq].shape[1], C);
    size_t bad = 0;
    for (int r = 0; r < 2; r++) {
        const float *dense = md->wf32[wd], *got = mq->wf32[(size_t)r * mq->plan->n_weights + (size_t)wq];
        for (int64_t n = 0; n < N; n++) {
            float amax = 0;
            for (int64_t c = 0; c < C; c++) amax = fmaxf(amax, fabsf(dense[n * K + r * C + c]));
            for (int64_t c = 0; c < C; c++)
                bad += !(fabsf(got[n * C + c] - dense[n * K + r * C + c]) <= amax / 127 * 0.5f * 1.001f + 1e-7f);
        }
    }
    KT_CHECKF(bad == 0, "%zu int8 o_proj shard elements off the dense slice by more than half their row's step", bad);
    kiln_model_close(md);
    kiln_model_close(mq);
    unlink(ed);
    unlink(eq);
}

static void test_logits_pycode(void) { /* the shared 22M-parameter model: 6/2 heads, vocab 32000 */
    char ckpt[1024];
    snprintf(ckpt, sizeof ckpt, "%s/models/pycode-22m", KILN_SHARED_DIR);
    if (!kiln_path_is_dir(ckpt)) KT_SKIP("%s not present (the shared test models)", ckpt);
    check_tp_logits(ckpt, NULL, 2, 16);
}

int main(void) {
    if (!kt_tmpdir(tmpdir, sizeof tmpdir, "tp")) return 1;
    KT_RUN(test_pass_splits);
    KT_RUN(test_pass_runs_with_tp_only);
    KT_RUN(test_refuses_indivisible);
    KT_RUN(test_engine_layout);
    KT_RUN(test_tp1_same_bytes);
    KT_RUN(test_plan_reader_refusals);
    KT_RUN(test_rank_reads_its_range);
    KT_RUN(test_logits_tiny_mistral);
    KT_RUN(test_logits_tiny_llama3);
    KT_RUN(test_logits_tiny_qwen3);
    KT_RUN(test_logits_tiny_qwen2);
    KT_RUN(test_logits_stories260k);
    KT_RUN(test_logits_pycode);
    KT_RUN(test_logits_kv8);
    KT_RUN(test_logits_quant);
    fprintf(stderr, "  max |tpN - tp1| logit over all models: %.3g\n", max_logit_diff_seen);
    rmdir(tmpdir);
    return KT_END();
}
