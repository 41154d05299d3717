/*
 * test_ir.c — the IR builder and verifier, each pass's rewrite on a real
 * model graph, memory planning, and the plan's round trip and checks.
 * (That passes keep the numbers is shown end to end in test_golden.c.)
 */
#include <stdlib.h>
#include <string.h>

#include "codegen/kiln_codegen.h"
#include "compiler/kiln_compiler.h"
#include "kt.h"
#include "kt_fixture.h"
#include "passes/kiln_passes.h"
#include "../format/kiln_plan.h"

static kiln_checkpoint ck;
static bool ck_open;

static kiln_graph *stories_graph(void) {
    kiln_error err = {0};
    if (!ck_open) {
        char dir[1024];
        snprintf(dir, sizeof dir, "%s/models/stories260k", KILN_SOURCE_DIR);
        if (kiln_checkpoint_open(dir, &ck, &err) != KILN_OK) {
            fprintf(stderr, "  %s\n", err.msg);
            return NULL;
        }
        ck_open = true;
    }
    kiln_graph *g = NULL;
    if (kiln_import(&ck, &g, &err) != KILN_OK) fprintf(stderr, "  import: %s\n", err.msg);
    return g;
}

/* A tiny hand-built graph: embedding → rmsnorm → lm_head. */
static kiln_graph *small_graph(void) {
    kiln_error err;
    kiln_graph *g = kiln_graph_new();
    static float table[16 * 4], norm[4];
    const int64_t bs[2] = {KILN_DIM_BATCH, KILN_DIM_SEQ}, ts[2] = {16, 4}, ns[1] = {4};
    g->tokens = kiln_ir_input(g, "tokens", KILN_DTYPE_I32, 2, bs, &err);
    g->positions = kiln_ir_input(g, "positions", KILN_DTYPE_I32, 2, bs, &err);
    int t = kiln_ir_weight(g, "embed", KILN_DTYPE_F32, 2, ts, table, KILN_DTYPE_F32, &err);
    int w = kiln_ir_weight(g, "norm", KILN_DTYPE_F32, 1, ns, norm, KILN_DTYPE_F32, &err);
    int x = kiln_ir_op1(g, KILN_OP_EMBEDDING, (int[]){g->tokens, t}, 2, NULL, "x", &err);
    kiln_op_attrs a = {.eps = 1e-5f};
    int h = kiln_ir_op1(g, KILN_OP_RMSNORM, (int[]){x, w}, 2, &a, "h", &err);
    g->logits = kiln_ir_op1(g, KILN_OP_LM_HEAD, (int[]){h, t}, 2, NULL, "logits", &err);
    g->info = (kiln_graph_info){.n_layers = 1, .n_kv_heads = 1, .head_dim = 4, .hidden_size = 4, .vocab_size = 16,
                                .max_context = 8};
    return g;
}

/* The op table (common/ops.c): a row for every kind, names that read back, counts within the plan's
 * limits, in-place inputs and matrices among an op's inputs, and what the passes and executors rely on. */
static void test_op_table(void) {
    for (int k = 0; k < KILN_OP_COUNT_; k++) {
        const char *n = kiln_op_name((kiln_op_kind)k);
        KT_CHECKF(strcmp(n, "?") != 0 && kiln_op_from_name(n) == k, "op kind %d: '%s'", k, n);
        const int ni = kiln_op_n_in((kiln_op_kind)k), no = kiln_op_n_out((kiln_op_kind)k);
        KT_CHECKF(ni >= 1 && ni <= KILN_MAX_OP_IN && no >= 1 && no <= KILN_MAX_OP_OUT, "%s: %d in, %d out", n, ni, no);
        KT_CHECKF(kiln_op_matrices((kiln_op_kind)k) < ni, "%s", n);
        KT_CHECKF((kiln_op_inplace((kiln_op_kind)k, 0) >> ni) == 0 && kiln_op_inplace((kiln_op_kind)k, 1) == 0, "%s", n);
        KT_CHECKF((kiln_op_flags_allowed((kiln_op_kind)k) & ~(uint32_t)KILN_FLAG_ALL_) == 0, "%s", n);
        /* W8A8 applies to exactly the projections */
        KT_CHECKF(!(kiln_op_flags_allowed((kiln_op_kind)k) & KILN_FLAG_ACT_FP8) == !kiln_op_matrices((kiln_op_kind)k),
                  "%s", n);
    }
    KT_EQ_INT(kiln_op_n_in(KILN_OP_COUNT_), -1);
    KT_CHECK(strcmp(kiln_op_name(KILN_OP_COUNT_), "?") == 0 && kiln_op_from_name("nonesuch") == -1);
    KT_EQ_INT((int)kiln_op_inplace(KILN_OP_LINEAR_ADD, 0), 1 << 2); /* y over r, never over x */
    KT_EQ_INT((int)kiln_op_inplace(KILN_OP_ADD_RMSNORM, 1), 0);      /* the normed output never in place */
    KT_EQ_INT((int)kiln_op_inplace(KILN_OP_LINEAR, 0), 0);
    KT_EQ_INT(kiln_op_n_out(KILN_OP_QKV_ROPE_PACKED), 3);
    KT_EQ_INT(kiln_op_matrices(KILN_OP_QKV_ROPE), 3);
    KT_CHECK(kiln_op_flags_allowed(KILN_OP_ATTENTION) & KILN_FLAG_DECODE_ROPE);
    KT_CHECK(!(kiln_op_flags_allowed(KILN_OP_LINEAR) & KILN_FLAG_FOLD_INTO_GEMV));
}

static void test_builder_infers_and_rejects_shapes(void) {
    kiln_graph *g = small_graph();
    kiln_error err = {0};
    KT_REQUIRE(g);
    KT_EQ_INT(kiln_ir_verify(g, &err), KILN_OK);
    KT_EQ_INT(g->values[g->logits].shape[2], 16);
    /* a linear whose weight does not match the input width is refused by the builder */
    static float wbad[3 * 5];
    const int64_t s[2] = {3, 5};
    int wb = kiln_ir_weight(g, "bad", KILN_DTYPE_F32, 2, s, wbad, KILN_DTYPE_F32, &err);
    int h = g->ops[1].out[0];
    KT_EQ_INT(kiln_ir_op1(g, KILN_OP_LINEAR, (int[]){h, wb}, 2, NULL, "y", &err), -1);
    KT_EQ_INT(err.code, KILN_ERR_VERIFY);
    KT_CONTAINS(err.msg, "bad");
    /* rope with an odd head_dim is refused */
    kiln_op_attrs r = {.n_heads = 1, .head_dim = 3, .rope_theta = 10000};
    KT_EQ_INT(kiln_ir_op1(g, KILN_OP_ROPE, (int[]){h, g->positions}, 2, &r, "r", &err), -1);
    /* permute: an i32 vector of the input's width, owned by the graph; f32 indices or another length refused */
    const int64_t hw = g->values[h].shape[2], hw1 = hw - 1;
    int32_t *order = malloc((size_t)hw * sizeof *order);
    KT_REQUIRE(order != NULL);
    for (int64_t i = 0; i < hw; i++) order[i] = (int32_t)(hw - 1 - i);
    int pw = kiln_ir_weight_owned(g, "order", KILN_DTYPE_I32, 1, &hw, order, &err);
    KT_REQUIRE(pw >= 0);
    int y = kiln_ir_op1(g, KILN_OP_PERMUTE, (int[]){h, pw}, 2, NULL, "p", &err);
    KT_REQUIRE(y >= 0);
    KT_EQ_INT(g->values[y].shape[2], hw);
    static float fidx[64];
    int fw = kiln_ir_weight(g, "fidx", KILN_DTYPE_F32, 1, &hw, fidx, KILN_DTYPE_F32, &err);
    KT_EQ_INT(kiln_ir_op1(g, KILN_OP_PERMUTE, (int[]){h, fw}, 2, NULL, "p2", &err), -1);
    KT_CONTAINS(err.msg, "permute: fidx must be an i32 vector");
    int32_t *shorter = calloc((size_t)hw1, sizeof *shorter);
    int sw = kiln_ir_weight_owned(g, "short", KILN_DTYPE_I32, 1, &hw1, shorter, &err);
    KT_EQ_INT(kiln_ir_op1(g, KILN_OP_PERMUTE, (int[]){h, sw}, 2, NULL, "p3", &err), -1);
    KT_CONTAINS(err.msg, "short must be an i32 vector");
    kiln_graph_free(g); /* frees order and shorter */
}

static void test_verifier_catches_broken_graphs(void) {
    kiln_error err = {0};
    kiln_graph *g = small_graph();
    KT_REQUIRE(g);
    /* use before definition: swap the first two ops */
    kiln_op tmp = g->ops[0];
    g->ops[0] = g->ops[1];
    g->ops[1] = tmp;
    kiln_ir_reindex(g);
    KT_EQ_INT(kiln_ir_verify(g, &err), KILN_ERR_VERIFY);
    KT_CONTAINS(err.msg, "before it is defined");
    kiln_graph_free(g);

    g = small_graph();
    /* an op output with the wrong recorded shape */
    g->values[g->ops[1].out[0]].shape[2] = 5;
    KT_EQ_INT(kiln_ir_verify(g, &err), KILN_ERR_VERIFY);
    kiln_graph_free(g);

    g = small_graph();
    /* a value defined twice */
    g->ops[2].out[0] = g->ops[1].out[0];
    KT_EQ_INT(kiln_ir_verify(g, &err), KILN_ERR_VERIFY);
    kiln_graph_free(g);

    g = small_graph();
    g->logits = -1;
    KT_EQ_INT(kiln_ir_verify(g, &err), KILN_ERR_VERIFY);
    kiln_graph_free(g);
}

static void test_fusion_passes_on_stories260k(void) {
    kiln_error err = {0};
    kiln_graph *g = stories_graph();
    KT_REQUIRE(g);
    int layers = 5;
    KT_EQ_INT(kiln_ir_count_ops(g, KILN_OP_LINEAR), 7 * layers);
    KT_EQ_INT(kiln_ir_count_ops(g, KILN_OP_ROPE), 2 * layers);
    KT_EQ_INT(kiln_ir_count_ops(g, KILN_OP_ADD), 2 * layers);
    KT_EQ_INT(kiln_ir_count_ops(g, KILN_OP_RMSNORM), 2 * layers + 1);
    KT_EQ_INT(kiln_pass_fuse_add_rmsnorm(g, &err), 2 * layers); /* after each residual add but the last */
    KT_EQ_INT(kiln_ir_verify(g, &err), KILN_OK);
    KT_EQ_INT(kiln_pass_fuse_qkv_rope(g, &err), layers);
    KT_EQ_INT(kiln_ir_verify(g, &err), KILN_OK);
    KT_EQ_INT(kiln_pass_fuse_gate_up_swiglu(g, &err), layers);
    KT_EQ_INT(kiln_ir_verify(g, &err), KILN_OK);
    /* running a fusion again finds nothing new */
    KT_EQ_INT(kiln_pass_fuse_qkv_rope(g, &err), 0);
    int removed = kiln_pass_dce(g, &err);
    KT_CHECK(removed > 0);
    KT_EQ_INT(kiln_ir_verify(g, &err), KILN_OK);
    KT_EQ_INT(kiln_ir_count_ops(g, KILN_OP_ROPE), 0);
    KT_EQ_INT(kiln_ir_count_ops(g, KILN_OP_SILU), 0);
    KT_EQ_INT(kiln_ir_count_ops(g, KILN_OP_MUL), 0);
    KT_EQ_INT(kiln_ir_count_ops(g, KILN_OP_ADD), 0);
    KT_EQ_INT(kiln_ir_count_ops(g, KILN_OP_LINEAR), 2 * layers); /* o_proj and down_proj */
    KT_EQ_INT(kiln_ir_count_ops(g, KILN_OP_QKV_ROPE), layers);
    KT_EQ_INT(kiln_ir_count_ops(g, KILN_OP_GATE_UP_SWIGLU), layers);
    KT_EQ_INT(kiln_ir_count_ops(g, KILN_OP_ADD_RMSNORM), 2 * layers);
    KT_EQ_INT(kiln_ir_count_ops(g, KILN_OP_RMSNORM), 1); /* the first layer's input norm */
    /* the residual adds into o_proj and down_proj: every add_rmsnorm after a projection becomes
     * linear_add + rmsnorm (all 2 x layers of them here) */
    KT_EQ_INT(kiln_pass_fuse_linear_residual(g, &err), 2 * layers);
    KT_EQ_INT(kiln_ir_verify(g, &err), KILN_OK);
    KT_CHECK(kiln_pass_dce(g, &err) > 0);
    KT_EQ_INT(kiln_ir_count_ops(g, KILN_OP_LINEAR), 0);
    KT_EQ_INT(kiln_ir_count_ops(g, KILN_OP_LINEAR_ADD), 2 * layers);
    KT_EQ_INT(kiln_ir_count_ops(g, KILN_OP_ADD_RMSNORM), 0);
    KT_EQ_INT(kiln_ir_count_ops(g, KILN_OP_RMSNORM), 2 * layers + 1);
    /* the decode fusions are flags on the ops, recorded once */
    KT_EQ_INT(kiln_pass_decode_attention_rope(g, &err), layers);
    KT_EQ_INT(kiln_pass_decode_attention_rope(g, &err), 0);
    KT_EQ_INT(kiln_pass_decode_attention_merge(g, &err), layers);
    /* every rmsnorm feeds the projection right after it: the input norms, the post-attention norms
     * and the final norm before the LM head */
    KT_EQ_INT(kiln_pass_fold_norm_into_gemv(g, &err), 2 * layers + 1);
    KT_EQ_INT(kiln_ir_verify(g, &err), KILN_OK);
    int flagged = 0;
    for (int i = 0; i < g->n_ops; i++)
        if (!g->ops[i].dead && g->ops[i].kind == KILN_OP_ATTENTION)
            flagged += g->ops[i].attrs.flags == (KILN_FLAG_DECODE_ROPE | KILN_FLAG_MERGE_SPLITS);
    KT_EQ_INT(flagged, layers);
    /* a flag on an op it does not apply to fails the verifier */
    for (int i = 0; i < g->n_ops; i++)
        if (!g->ops[i].dead && g->ops[i].kind == KILN_OP_LINEAR_ADD) {
            g->ops[i].attrs.flags = KILN_FLAG_DECODE_ROPE;
            break;
        }
    KT_EQ_INT(kiln_ir_verify(g, &err), KILN_ERR_VERIFY);
    KT_CONTAINS(err.msg, "do not apply");
    kiln_graph_free(g);
}

/* Qwen's extras fuse into qkv_rope (+qkv_bias, +qk_norm) and pack with it; the decode attention keeps
 * its own rotation off them (rope_kv does the biases and norms) */
static void check_qwen_fusion(const char *dir_rel, uint32_t want_flags, int bias_ops, int norm_ops) {
    kiln_error err = {0};
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/%s", KILN_SOURCE_DIR, dir_rel);
    kiln_checkpoint c;
    KT_REQUIRE(kiln_checkpoint_open(dir, &c, &err) == KILN_OK);
    kiln_graph *g = NULL;
    KT_REQUIRE(kiln_import(&c, &g, &err) == KILN_OK);
    const int layers = 2;
    KT_EQ_INT(kiln_ir_count_ops(g, KILN_OP_BIAS_ADD), bias_ops * layers);
    KT_EQ_INT(kiln_ir_count_ops(g, KILN_OP_HEAD_RMSNORM), norm_ops * layers);
    KT_EQ_INT(kiln_passes_run(g, NULL, NULL, &err), KILN_OK);
    KT_EQ_INT(kiln_ir_count_ops(g, KILN_OP_BIAS_ADD), 0);
    KT_EQ_INT(kiln_ir_count_ops(g, KILN_OP_HEAD_RMSNORM), 0);
    KT_EQ_INT(kiln_ir_count_ops(g, KILN_OP_QKV_ROPE_PACKED), layers);
    for (int i = 0; i < g->n_ops; i++) {
        const kiln_op *op = &g->ops[i];
        if (op->dead) continue;
        if (op->kind == KILN_OP_QKV_ROPE_PACKED) {
            KT_EQ_INT(op->attrs.flags, want_flags);
            KT_EQ_INT(op->n_in, 3 + ((want_flags & KILN_FLAG_QKV_BIAS) ? 1 : 0) + ((want_flags & KILN_FLAG_QK_NORM) ? 2 : 0));
            if (want_flags & KILN_FLAG_QKV_BIAS) { /* [bq; bk; bv]: (4 + 2 x 2) heads of head_dim */
                const kiln_value *b = &g->values[op->in[3]];
                KT_EQ_INT(b->ndim, 1);
                KT_EQ_INT(b->shape[0], 8 * c.config.head_dim);
                KT_CHECK(strstr(b->name, "qkv_proj.bias") != NULL);
            }
        }
        if (op->kind == KILN_OP_ATTENTION) KT_EQ_INT(op->attrs.flags & KILN_FLAG_DECODE_ROPE, 0);
    }
    /* an op carrying the bias flag without its inputs fails the verifier */
    for (int i = 0; i < g->n_ops; i++)
        if (!g->ops[i].dead && g->ops[i].kind == KILN_OP_QKV_ROPE_PACKED) {
            g->ops[i].attrs.flags ^= KILN_FLAG_QKV_BIAS;
            break;
        }
    KT_EQ_INT(kiln_ir_verify(g, &err), KILN_ERR_VERIFY);
    KT_CONTAINS(err.msg, "inputs");
    kiln_graph_free(g);
    kiln_checkpoint_close(&c);
}

static void test_qwen_extras_fuse_into_qkv_rope(void) {
    check_qwen_fusion("tests/data/tiny-qwen2", KILN_FLAG_QKV_BIAS, 3, 0);
    check_qwen_fusion("tests/data/tiny-qwen3", KILN_FLAG_QK_NORM, 0, 2);
}

static void test_dce_removes_unused_and_keeps_output(void) {
    kiln_error err = {0};
    kiln_graph *g = small_graph();
    KT_REQUIRE(g);
    int x = g->ops[0].out[0];
    kiln_ir_op1(g, KILN_OP_SILU, (int[]){x}, 1, NULL, "unused", &err);
    KT_EQ_INT(g->n_ops, 4);
    KT_EQ_INT(kiln_ir_dce(g), 1);
    KT_EQ_INT(g->n_ops, 3);
    KT_EQ_INT(kiln_ir_verify(g, &err), KILN_OK);
    KT_EQ_INT(kiln_ir_dce(g), 0);
    kiln_graph_free(g);
}

/* After memory planning no two values that are live at once share a slot, but for an output that
 * overwrites, in place, an input its op reads last (kiln_op_inplace): every linear_add's y takes its
 * residual's slot (the default passes) and every add_rmsnorm's sum one of its addends' (the passes
 * fuse-add-rmsnorm and dce alone) here. */
static void check_memory_planning(const char *passes) {
    kiln_error err = {0};
    kiln_graph *g = stories_graph();
    KT_REQUIRE(g);
    KT_REQUIRE(kiln_passes_run(g, passes, NULL, &err) == KILN_OK);
    int n_slots = 0;
    for (int v = 0; v < g->n_values; v++)
        if (!g->values[v].dead && g->values[v].kind == KILN_VALUE_ACT) {
            KT_CHECK(g->values[v].slot >= 0);
            if (g->values[v].slot >= n_slots) n_slots = g->values[v].slot + 1;
        }
    int *def = calloc((size_t)g->n_values, sizeof *def), *last = calloc((size_t)g->n_values, sizeof *last);
    for (int i = 0; i < g->n_ops; i++) {
        for (int j = 0; j < g->ops[i].n_out; j++) def[g->ops[i].out[j]] = i, last[g->ops[i].out[j]] = i;
        for (int j = 0; j < g->ops[i].n_in; j++) last[g->ops[i].in[j]] = i;
    }
    last[g->logits] = g->n_ops;
    int in_place = 0, linear_adds = 0, add_norms = 0;
    for (int i = 0; i < g->n_ops; i++) {
        const kiln_op *op = &g->ops[i];
        if (op->kind == KILN_OP_LINEAR_ADD) {
            linear_adds++;
            KT_CHECK(g->values[op->out[0]].slot == g->values[op->in[2]].slot);
        } else if (op->kind == KILN_OP_ADD_RMSNORM) {
            add_norms++;
            KT_CHECK(g->values[op->out[0]].slot == g->values[op->in[0]].slot ||
                     g->values[op->out[0]].slot == g->values[op->in[1]].slot);
            KT_CHECK(g->values[op->out[1]].slot != g->values[op->in[0]].slot &&
                     g->values[op->out[1]].slot != g->values[op->in[1]].slot);
        }
    }
    KT_CHECKF(passes ? add_norms > 0 : linear_adds > 0, "%s: %d linear_add, %d add_rmsnorm", passes ? passes : "default",
              linear_adds, add_norms);
    int overlaps = 0;
    for (int a = 0; a < g->n_values; a++)
        for (int b = a + 1; b < g->n_values; b++) {
            const kiln_value *va = &g->values[a], *vb = &g->values[b];
            if (va->dead || vb->dead || va->kind != KILN_VALUE_ACT || vb->kind != KILN_VALUE_ACT) continue;
            if (va->slot != vb->slot) continue;
            /* lifetimes [def, last] must not overlap, but where the later value is an output that its op
             * (the earlier value's last reader) writes over it in place */
            const int first = def[a] <= def[b] ? a : b, second = first == a ? b : a;
            if (last[first] < def[second]) continue;
            const kiln_op *op = &g->ops[def[second]];
            bool ok = false;
            for (int j = 0; j < op->n_out; j++)
                for (int k = 0; k < op->n_in; k++)
                    if (op->out[j] == second && op->in[k] == first && last[first] == def[second] &&
                        (kiln_op_inplace(op->kind, j) >> k & 1))
                        ok = true;
            if (ok) in_place++;
            else overlaps++;
        }
    KT_CHECK(in_place >= linear_adds + add_norms);
    KT_EQ_INT(overlaps, 0);
    KT_CHECK(n_slots < 20); /* far fewer buffers than activations */
    free(def);
    free(last);
    kiln_graph_free(g);
}

static void test_memory_planning_never_aliases_live_values(void) {
    check_memory_planning(NULL);
    check_memory_planning("fuse-add-rmsnorm,dce");
}

static void test_unknown_pass_is_refused(void) {
    kiln_error err = {0};
    kiln_graph *g = stories_graph();
    KT_REQUIRE(g);
    KT_EQ_INT(kiln_passes_run(g, "fuse-qkv-rope,frobnicate", NULL, &err), KILN_ERR_INVALID_ARG);
    KT_CONTAINS(err.msg, "frobnicate");
    KT_CONTAINS(err.msg, "fuse-add-rmsnorm");
    kiln_graph_free(g);
}

static void test_plan_round_trip_and_checks(void) {
    kiln_error err = {0};
    kiln_graph *g = stories_graph();
    KT_REQUIRE(g);
    KT_REQUIRE(kiln_passes_run(g, NULL, NULL, &err) == KILN_OK);
    kiln_buf b = {0};
    KT_REQUIRE(kiln_plan_serialize(g, &b, &err) == KILN_OK);
    uint64_t wsize = 1u << 20; /* stories260k weights are 1,040,128 bytes once aligned */
    const char *corpus = getenv("KILN_WRITE_FUZZ_CORPUS");
    if (corpus) { /* seed for fuzz/fuzz_plan.c: u64 weights size, then the plan */
        char path[1024];
        snprintf(path, sizeof path, "%s/stories260k.plan", corpus);
        FILE *f = fopen(path, "wb");
        uint8_t ws[8];
        kiln_wr_u64(ws, wsize);
        if (f) {
            fwrite(ws, 1, 8, f);
            fwrite(b.data, 1, b.len, f);
            fclose(f);
        }
    }
    kiln_plan *p = NULL;
    KT_EQ_INT(kiln_plan_parse(b.data, b.len, wsize, &p, &err), KILN_OK);
    if (p) {
        KT_EQ_INT(p->n_ops, g->n_ops);
        KT_EQ_INT(p->vocab_size, 512);
        KT_EQ_INT(p->n_layers, 5);
        /* the 47 tensors, QKV and gate/up packed (5 x 9 → 5 x 6 per layer), the embedding shared by the head */
        KT_EQ_INT(p->n_weights, 32);
        kiln_plan_free(p);
    }
    /* weights section too small for the weights */
    KT_EQ_INT(kiln_plan_parse(b.data, b.len, 1000, &p, &err), KILN_ERR_FORMAT);
    KT_CONTAINS(err.msg, "outside");
    /* truncated, and one byte too long */
    KT_EQ_INT(kiln_plan_parse(b.data, b.len - 1, wsize, &p, &err), KILN_ERR_FORMAT);
    uint8_t *copy = malloc(b.len + 1);
    memcpy(copy, b.data, b.len);
    copy[b.len] = 0;
    KT_EQ_INT(kiln_plan_parse(copy, b.len + 1, wsize, &p, &err), KILN_ERR_FORMAT);
    /* the ops: variable records after the fixed tables (kiln_plan.h) */
    size_t ops_at = KILN_PLAN_HEADER_SIZE + (size_t)kiln_rd_u32(b.data + 20) * KILN_PLAN_SLOT_SIZE +
                    (size_t)kiln_rd_u32(b.data + 8) * KILN_PLAN_VALUE_SIZE +
                    (size_t)kiln_rd_u32(b.data + 16) * KILN_PLAN_WEIGHT_SIZE;
    size_t first_attn = 0;
    for (size_t at = ops_at, i = 0; i < (size_t)g->n_ops; i++) {
        if (kiln_rd_u32(b.data + at) == KILN_OP_ATTENTION && !first_attn) first_attn = at;
        at += KILN_PLAN_OP_HEADER_SIZE +
              4 * (kiln_rd_u32(b.data + at + 4) + kiln_rd_u32(b.data + at + 8)) +
              KILN_PLAN_ATTR_SIZE * kiln_rd_u32(b.data + at + 12);
    }
    KT_REQUIRE(first_attn > 0);
    /* an op reading a value out of range */
    memcpy(copy, b.data, b.len);
    kiln_wr_u32(copy + ops_at + KILN_PLAN_OP_HEADER_SIZE, 0x7fffffff);
    KT_EQ_INT(kiln_plan_parse(copy, b.len, wsize, &p, &err), KILN_ERR_FORMAT);
    /* an unknown op kind */
    memcpy(copy, b.data, b.len);
    kiln_wr_u32(copy + ops_at, 999);
    KT_EQ_INT(kiln_plan_parse(copy, b.len, wsize, &p, &err), KILN_ERR_FORMAT);
    KT_CONTAINS(err.msg, "unknown kind");
    /* another plan version (the last format, 1, is refused with a rebuild hint) */
    memcpy(copy, b.data, b.len);
    kiln_wr_u32(copy + 4, 1);
    KT_EQ_INT(kiln_plan_parse(copy, b.len, wsize, &p, &err), KILN_ERR_VERSION);
    KT_CONTAINS(err.msg, "recompile");
    /* an op whose input count runs past the section */
    memcpy(copy, b.data, b.len);
    kiln_wr_u32(copy + first_attn + 4, 1000000);
    KT_EQ_INT(kiln_plan_parse(copy, b.len, wsize, &p, &err), KILN_ERR_FORMAT);
    /* the attention op's attributes: layer (key 1), n_heads (2), ... in order */
    const size_t attrs = first_attn + KILN_PLAN_OP_HEADER_SIZE +
                         4 * (kiln_rd_u32(b.data + first_attn + 4) + kiln_rd_u32(b.data + first_attn + 8));
    size_t heads_at = 0;
    for (uint32_t k = 0; k < kiln_rd_u32(b.data + first_attn + 12); k++)
        if (kiln_rd_u32(b.data + attrs + 8 * k) == KILN_ATTR_N_HEADS) heads_at = attrs + 8 * k;
    KT_REQUIRE(heads_at > 0);
    /* a head count the op cannot have: shape checking re-runs at load */
    memcpy(copy, b.data, b.len);
    kiln_wr_u32(copy + heads_at + 4, 3); /* n_heads 8 → 3 */
    KT_EQ_INT(kiln_plan_parse(copy, b.len, wsize, &p, &err), KILN_ERR_FORMAT);
    /* an attribute key this reader does not know (a newer kiln's) */
    memcpy(copy, b.data, b.len);
    kiln_wr_u32(copy + heads_at + 8, 999); /* the next key (n_kv_heads): still ascending, but unknown */
    KT_EQ_INT(kiln_plan_parse(copy, b.len, wsize, &p, &err), KILN_ERR_FORMAT);
    KT_CONTAINS(err.msg, "unknown to this runtime");
    /* keys out of order: n_heads twice */
    memcpy(copy, b.data, b.len);
    kiln_wr_u32(copy + heads_at + 8, KILN_ATTR_N_HEADS);
    KT_EQ_INT(kiln_plan_parse(copy, b.len, wsize, &p, &err), KILN_ERR_FORMAT);
    KT_CONTAINS(err.msg, "out of order");
    /* slots: this plan's linear_adds write y over their residual in place, which version 2 (no output in
     * an input's slot) does not allow */
    memcpy(copy, b.data, b.len);
    kiln_wr_u32(copy + 4, KILN_PLAN_VERSION_ONE);
    KT_EQ_INT(kiln_plan_parse(copy, b.len, wsize, &p, &err), KILN_ERR_FORMAT);
    KT_CONTAINS(err.msg, "that it reads");
    /* a newer kiln's plan */
    memcpy(copy, b.data, b.len);
    kiln_wr_u32(copy + 4, KILN_PLAN_VERSION + 1);
    KT_EQ_INT(kiln_plan_parse(copy, b.len, wsize, &p, &err), KILN_ERR_VERSION);
    KT_CONTAINS(err.msg, "newer kiln");
    /* the first attention's output moved into the residual stream's slot, whose value the o_proj's
     * linear_add reads after it: refused, not computed over */
    const int32_t attn_out = (int32_t)kiln_rd_u32(b.data + first_attn + KILN_PLAN_OP_HEADER_SIZE +
                                                  4 * kiln_rd_u32(b.data + first_attn + 4));
    const size_t values_at = KILN_PLAN_HEADER_SIZE + (size_t)kiln_rd_u32(b.data + 20) * KILN_PLAN_SLOT_SIZE;
    size_t first_la = 0;
    for (size_t at = ops_at, i = 0; i < (size_t)g->n_ops; i++) {
        if (kiln_rd_u32(b.data + at) == KILN_OP_LINEAR_ADD && !first_la) first_la = at;
        at += KILN_PLAN_OP_HEADER_SIZE + 4 * (kiln_rd_u32(b.data + at + 4) + kiln_rd_u32(b.data + at + 8)) +
              KILN_PLAN_ATTR_SIZE * kiln_rd_u32(b.data + at + 12);
    }
    KT_REQUIRE(first_la > first_attn);
    const int32_t resid = (int32_t)kiln_rd_u32(b.data + first_la + KILN_PLAN_OP_HEADER_SIZE + 4 * 2);
    const uint32_t resid_slot = kiln_rd_u32(b.data + values_at + (size_t)resid * KILN_PLAN_VALUE_SIZE + 12);
    KT_CHECK(resid_slot != kiln_rd_u32(b.data + values_at + (size_t)attn_out * KILN_PLAN_VALUE_SIZE + 12));
    memcpy(copy, b.data, b.len);
    kiln_wr_u32(copy + values_at + (size_t)attn_out * KILN_PLAN_VALUE_SIZE + 12, resid_slot);
    KT_EQ_INT(kiln_plan_parse(copy, b.len, wsize, &p, &err), KILN_ERR_FORMAT);
    KT_CONTAINS(err.msg, "still reads");
    free(copy);
    kiln_buf_free(&b);
    kiln_graph_free(g);
}

/* A hand-built MoE graph: embedding → moe (E experts of width F, top k, experts stacked from 3E 2-D
 * per-expert weights) → lm_head. */
enum { MOE_E = 4, MOE_F = 3, MOE_H = 4, MOE_V = 16 };
static kiln_graph *moe_graph(int top_k, kiln_error *err) {
    kiln_graph *g = kiln_graph_new();
    static float table[MOE_V * MOE_H], router[MOE_E * MOE_H], gu[2 * MOE_E][MOE_F * MOE_H], dn[MOE_E][MOE_H * MOE_F];
    const int64_t bs[2] = {KILN_DIM_BATCH, KILN_DIM_SEQ}, ts[2] = {MOE_V, MOE_H}, rs[2] = {MOE_E, MOE_H};
    const int64_t gs[2] = {MOE_F, MOE_H}, ds[2] = {MOE_H, MOE_F};
    g->tokens = kiln_ir_input(g, "tokens", KILN_DTYPE_I32, 2, bs, err);
    g->positions = kiln_ir_input(g, "positions", KILN_DTYPE_I32, 2, bs, err);
    int t = kiln_ir_weight(g, "embed", KILN_DTYPE_F32, 2, ts, table, KILN_DTYPE_F32, err);
    int r = kiln_ir_weight(g, "router", KILN_DTYPE_F32, 2, rs, router, KILN_DTYPE_F32, err);
    int gp[2 * MOE_E], dp[MOE_E];
    for (int e = 0; e < 2 * MOE_E; e++) gp[e] = kiln_ir_weight(g, "gu", KILN_DTYPE_F32, 2, gs, gu[e], KILN_DTYPE_F32, err);
    for (int e = 0; e < MOE_E; e++) dp[e] = kiln_ir_weight(g, "dn", KILN_DTYPE_F32, 2, ds, dn[e], KILN_DTYPE_F32, err);
    int wgu = kiln_ir_weight_stacked(g, "experts.gate_up", gp, 2 * MOE_E, (const int64_t[]){MOE_E, 2 * MOE_F, MOE_H}, err);
    int wdn = kiln_ir_weight_stacked(g, "experts.down", dp, MOE_E, (const int64_t[]){MOE_E, MOE_H, MOE_F}, err);
    int x = kiln_ir_op1(g, KILN_OP_EMBEDDING, (int[]){g->tokens, t}, 2, NULL, "x", err);
    kiln_op_attrs a = {.n_experts = MOE_E, .top_k = top_k};
    int y = kiln_ir_op1(g, KILN_OP_MOE, (int[]){x, r, wgu, wdn}, 4, &a, "moe", err);
    g->logits = kiln_ir_op1(g, KILN_OP_LM_HEAD, (int[]){y, t}, 2, NULL, "logits", err);
    g->info = (kiln_graph_info){.n_layers = 1, .n_kv_heads = 1, .head_dim = 4, .hidden_size = MOE_H,
                                .vocab_size = MOE_V, .max_context = 8};
    if (g->logits < 0) {
        kiln_graph_free(g);
        return NULL;
    }
    return g;
}

/* moe: stacked expert weights (parts dead, bytes concatenated), its shape rules, and the plan's 3-D weights */
static void test_moe_stacks_and_plan(void) {
    kiln_error err = {0};
    kiln_graph *g = moe_graph(2, &err);
    KT_REQUIRE(g != NULL);
    KT_EQ_INT(kiln_ir_verify(g, &err), KILN_OK);
    const kiln_op *moe = &g->ops[1];
    KT_EQ_INT(moe->kind, KILN_OP_MOE);
    const kiln_value *wgu = &g->values[moe->in[2]];
    KT_EQ_INT(wgu->ndim, 3);
    KT_EQ_INT(wgu->shape[1], 2 * MOE_F);
    KT_EQ_INT(wgu->n_parts, 2 * MOE_E);
    KT_CHECK(g->values[wgu->parts[0]].dead); /* the parts are only the stack's source */
    /* stacks whose parts do not fit are refused */
    const int64_t bad_rows[3] = {MOE_E, MOE_F, MOE_H}; /* 2E parts of F rows for E x F rows */
    KT_EQ_INT(kiln_ir_weight_stacked(g, "s", wgu->parts, 2 * MOE_E, bad_rows, &err), -1);
    KT_CONTAINS(err.msg, "rows of parts");
    const kiln_value *wdn = &g->values[moe->in[3]];
    const int mixed[2] = {wgu->parts[0], wdn->parts[0]}; /* [F,H] and [H,F] */
    KT_EQ_INT(kiln_ir_weight_stacked(g, "s", mixed, 2, (const int64_t[]){2, MOE_F, MOE_H}, &err), -1);
    KT_CONTAINS(err.msg, "does not match");
    /* moe's signature: top_k within the experts, the weights' shapes */
    int x = moe->in[0];
    kiln_op_attrs a = {.n_experts = MOE_E, .top_k = MOE_E + 1};
    KT_EQ_INT(kiln_ir_op1(g, KILN_OP_MOE, (int[]){x, moe->in[1], moe->in[2], moe->in[3]}, 4, &a, "m", &err), -1);
    KT_CONTAINS(err.msg, "top_k 5 of 4 experts");
    a.top_k = 2;
    KT_EQ_INT(kiln_ir_op1(g, KILN_OP_MOE, (int[]){x, moe->in[1], moe->in[3], moe->in[2]}, 4, &a, "m", &err), -1);
    KT_CONTAINS(err.msg, "gate/up weight");
    a.n_experts = 3;
    KT_EQ_INT(kiln_ir_op1(g, KILN_OP_MOE, (int[]){x, moe->in[1], moe->in[2], moe->in[3]}, 4, &a, "m", &err), -1);
    KT_CONTAINS(err.msg, "router");
    /* flags: moe_no_renorm is moe's (Qwen3-MoE's norm_topk_prob false), and only moe's */
    a.n_experts = MOE_E;
    a.flags = KILN_FLAG_MOE_NO_RENORM;
    KT_CHECK(kiln_ir_op1(g, KILN_OP_MOE, (int[]){x, moe->in[1], moe->in[2], moe->in[3]}, 4, &a, "m", &err) >= 0);
    a.flags = KILN_FLAG_QK_NORM;
    KT_EQ_INT(kiln_ir_op1(g, KILN_OP_MOE, (int[]){x, moe->in[1], moe->in[2], moe->in[3]}, 4, &a, "m", &err), -1);
    KT_CONTAINS(err.msg, "moe: lowering flags 0x10 do not apply to it");
    kiln_op_attrs n = {.eps = 1e-5f, .flags = KILN_FLAG_MOE_NO_RENORM};
    KT_EQ_INT(kiln_ir_op1(g, KILN_OP_RMSNORM, (int[]){x, moe->in[1]}, 2, &n, "n", &err), -1);
    KT_CONTAINS(err.msg, "rmsnorm: lowering flags 0x20 do not apply to it");
    KT_EQ_INT(kiln_ir_verify(g, &err), KILN_OK);
    /* the plan: 3-D weights, attrs n_experts and top_k; the part values are not weights of their own */
    KT_REQUIRE(kiln_passes_run(g, "none", NULL, &err) == KILN_OK);
    kiln_buf b = {0};
    KT_REQUIRE(kiln_plan_serialize(g, &b, &err) == KILN_OK);
    kiln_plan *p = NULL;
    const uint64_t wsize = 1 << 16;
    KT_EQ_INT(kiln_plan_parse(b.data, b.len, wsize, &p, &err), KILN_OK);
    if (p) {
        KT_EQ_INT(p->n_weights, 4); /* embed, router, the two stacks */
        KT_EQ_INT(p->weights[2].ndim, 3);
        KT_EQ_INT(p->ops[1].attrs.n_experts, MOE_E);
        KT_EQ_INT(p->ops[1].attrs.top_k, 2);
        kiln_plan_free(p);
    }
    size_t w_at = KILN_PLAN_HEADER_SIZE + (size_t)kiln_rd_u32(b.data + 20) * KILN_PLAN_SLOT_SIZE +
                  (size_t)kiln_rd_u32(b.data + 8) * KILN_PLAN_VALUE_SIZE;
    size_t ops_at = w_at + (size_t)kiln_rd_u32(b.data + 16) * KILN_PLAN_WEIGHT_SIZE;
    size_t moe_at = ops_at + KILN_PLAN_OP_HEADER_SIZE + 4 * (2 + 1); /* after the embedding (no attrs) */
    uint8_t *copy = malloc(b.len);
    KT_REQUIRE(copy != NULL);
    KT_EQ_INT(kiln_rd_u32(b.data + moe_at), KILN_OP_MOE);
    /* a 4-D weight is refused */
    memcpy(copy, b.data, b.len);
    kiln_wr_u32(copy + w_at + 2 * KILN_PLAN_WEIGHT_SIZE + 132, 4);
    KT_EQ_INT(kiln_plan_parse(copy, b.len, wsize, &p, &err), KILN_ERR_FORMAT);
    KT_CONTAINS(err.msg, "4 dimensions");
    /* moe's record read as another kind (bias_add: 2 inputs) is refused */
    memcpy(copy, b.data, b.len);
    kiln_wr_u32(copy + moe_at, KILN_OP_BIAS_ADD);
    KT_EQ_INT(kiln_plan_parse(copy, b.len, wsize, &p, &err), KILN_ERR_FORMAT);
    KT_CONTAINS(err.msg, "bias_add");
    /* top_k above the experts, written by hand: shape checking re-runs at load */
    const size_t moe_attrs = moe_at + KILN_PLAN_OP_HEADER_SIZE + 4 * (4 + 1);
    size_t topk_at = 0;
    for (uint32_t k = 0; k < kiln_rd_u32(b.data + moe_at + 12); k++)
        if (kiln_rd_u32(b.data + moe_attrs + 8 * k) == KILN_ATTR_TOP_K) topk_at = moe_attrs + 8 * k;
    KT_REQUIRE(topk_at > 0);
    memcpy(copy, b.data, b.len);
    kiln_wr_u32(copy + topk_at + 4, MOE_E + 1);
    KT_EQ_INT(kiln_plan_parse(copy, b.len, wsize, &p, &err), KILN_ERR_FORMAT);
    KT_CONTAINS(err.msg, "top_k 5 of 4 experts");
    free(copy);
    kiln_buf_free(&b);
    kiln_graph_free(g);
}

static void test_dump_ir_prints_each_pass(void) {
    kiln_error err = {0};
    kiln_graph *g = stories_graph();
    KT_REQUIRE(g);
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    KT_REQUIRE(kiln_passes_run(g, NULL, f, &err) == KILN_OK);
    fclose(f);
    KT_CONTAINS(text, ";; imported");
    KT_CONTAINS(text, ";; after fuse-add-rmsnorm");
    KT_CONTAINS(text, ";; after dce");
    KT_CONTAINS(text, "qkv_rope(");
    KT_CONTAINS(text, ";; after fuse-linear-residual");
    KT_CONTAINS(text, "linear_add(");
    KT_CONTAINS(text, "+decode_rope");
    KT_CONTAINS(text, "@model.layers.4.mlp.down_proj.weight");
    free(text);
    kiln_graph_free(g);
}

/* Norms folded at one-token steps by the default pipeline's fold-norm-into-ck-gemv: count them. */
static int one_token_folds(const kiln_graph *g) {
    int n = 0;
    for (int i = 0; i < g->n_ops; i++)
        n += !g->ops[i].dead && g->ops[i].kind == KILN_OP_RMSNORM &&
             (g->ops[i].attrs.flags & (KILN_FLAG_FOLD_INTO_GEMV | KILN_FLAG_FOLD_ONE_TOKEN)) ==
                 (KILN_FLAG_FOLD_INTO_GEMV | KILN_FLAG_FOLD_ONE_TOKEN);
    return n;
}

/* stories260k with the projections (and with `tied` its embedding, which is its LM head) quantized as
 * asked and `list` as --passes: the norms it folds. */
static int q4_folds(int quant, int tied, const char *list, char **dump) {
    kiln_error err = {0};
    kiln_graph *g = stories_graph();
    if (!g) return -1;
    g->quant_weights = quant;
    g->quant_head = g->quant_embedding = tied; /* its LM head is the embedding table */
    size_t len = 0;
    FILE *f = dump ? open_memstream(dump, &len) : NULL;
    int n = kiln_passes_run(g, list, f, &err) == KILN_OK ? one_token_folds(g) : -1;
    if (f) fclose(f);
    if (n < 0) fprintf(stderr, "  passes: %s\n", err.msg);
    kiln_graph_free(g);
    return n;
}

/* fold-norm-into-ck-gemv runs after quantize, wherever it is listed, and flags only the norms whose
 * projection is q4 or fp8 (q8 and fp8g128 take another one-token kernel): stories260k's q/k/v and gate/up read 64 columns (q4g32 takes them, q4g128 does
 * not and leaves q8), its down_proj reads no norm, its LM head is its embedding table. */
static void test_fold_norm_into_ck_gemv(void) {
    const int layers = 5;
    char *dump = NULL;
    KT_EQ_INT(q4_folds(KILN_DTYPE_Q4G32, 0, NULL, &dump), 2 * layers);
    KT_REQUIRE(dump);
    const char *quant = strstr(dump, ";; after quantize"), *fold = strstr(dump, ";; after fold-norm-into-ck-gemv");
    KT_CHECK(quant && fold && quant < fold);
    KT_CONTAINS(dump, "+fold_into_gemv +one_token");
    free(dump);
    KT_EQ_INT(q4_folds(KILN_DTYPE_Q4G32, KILN_DTYPE_Q4G32, NULL, NULL), 2 * layers + 1); /* the final norm too */
    KT_EQ_INT(q4_folds(KILN_DTYPE_Q4G32, KILN_DTYPE_Q8, NULL, NULL), 2 * layers);
    KT_EQ_INT(q4_folds(0, KILN_DTYPE_Q4G32, NULL, NULL), 1); /* only the final norm */
    KT_EQ_INT(q4_folds(KILN_DTYPE_Q4G128, 0, NULL, NULL), 0); /* every matrix fell back to q8 */
    KT_EQ_INT(q4_folds(KILN_DTYPE_Q8, 0, NULL, NULL), 0);
    KT_EQ_INT(q4_folds(KILN_DTYPE_FP8, 0, NULL, NULL), 2 * layers); /* fp8 takes the same kernel */
    KT_EQ_INT(q4_folds(KILN_DTYPE_FP8G128, 0, NULL, NULL), 0);
    KT_EQ_INT(q4_folds(0, 0, NULL, NULL), 0);
    /* named first in --passes, it still runs after quantize; left out, it does not run */
    KT_EQ_INT(q4_folds(KILN_DTYPE_Q4G32, 0, "fold-norm-into-ck-gemv,fuse-add-rmsnorm,fuse-qkv-rope,fuse-gate-up-swiglu,"
                       "fuse-linear-residual,dce", NULL),
              2 * layers);
    KT_EQ_INT(q4_folds(KILN_DTYPE_Q4G32, 0, "fuse-add-rmsnorm,fuse-qkv-rope,fuse-gate-up-swiglu,fuse-linear-residual,dce", NULL), 0);
    /* the general fold (every GEMV step) comes first and is left as it is */
    KT_EQ_INT(q4_folds(KILN_DTYPE_Q4G32, 0,
                       "fuse-add-rmsnorm,fuse-qkv-rope,fuse-gate-up-swiglu,fuse-linear-residual,fold-norm-into-gemv,"
                       "fold-norm-into-ck-gemv,dce", NULL),
              0);
    /* +one_token means nothing without the fold: the verifier refuses it */
    kiln_error err = {0};
    kiln_graph *g = stories_graph();
    KT_REQUIRE(g);
    for (int i = 0; i < g->n_ops; i++)
        if (!g->ops[i].dead && g->ops[i].kind == KILN_OP_RMSNORM) {
            g->ops[i].attrs.flags = KILN_FLAG_FOLD_ONE_TOKEN;
            break;
        }
    KT_EQ_INT(kiln_ir_verify(g, &err), KILN_ERR_VERIFY);
    KT_CONTAINS(err.msg, "+one_token without +fold_into_gemv");
    kiln_graph_free(g);
}

/* w8a8 (default, after quantize) flags the projections whose matrices are fp8 or fp8g128 with +act_fp8;
 * the verifier refuses the flag over other matrices and on ops that multiply nothing. */
static void test_w8a8_pass(void) {
    const int layers = 5; /* stories260k: packed q/k/v, o_proj, gate/up, down a layer; its LM head is the
                             embedding table, which keeps its dtype here */
    static const struct {
        int quant, want;
    } cases[] = {{KILN_DTYPE_FP8, 4 * layers}, {KILN_DTYPE_FP8G128, 4 * layers}, {KILN_DTYPE_Q8, 0},
                 {KILN_DTYPE_Q4G32, 0}, {0, 0}};
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        kiln_error err = {0};
        kiln_graph *g = stories_graph();
        KT_REQUIRE(g);
        g->quant_weights = cases[ci].quant;
        KT_REQUIRE(kiln_passes_run(g, NULL, NULL, &err) == KILN_OK);
        int n = 0, nf = 0;
        for (int i = 0; i < g->n_ops; i++) {
            n += !g->ops[i].dead && (g->ops[i].attrs.flags & KILN_FLAG_ACT_FP8);
            nf += !g->ops[i].dead && (g->ops[i].attrs.flags & KILN_FLAG_FP8_FAST);
        }
        KT_EQ_INT(n, cases[ci].want);
        /* w8a8-fast-accum: every W8A8 projection over per-row fp8, none over fp8g128 (no fast mode) */
        KT_EQ_INT(nf, cases[ci].quant == KILN_DTYPE_FP8 ? cases[ci].want : 0);
        if (cases[ci].quant == KILN_DTYPE_FP8G128) { /* the flag there fails the verifier, naming the matrix */
            for (int i = 0; i < g->n_ops && nf == 0; i++)
                if (!g->ops[i].dead && (g->ops[i].attrs.flags & KILN_FLAG_ACT_FP8)) {
                    g->ops[i].attrs.flags |= KILN_FLAG_FP8_FAST;
                    nf = 1;
                }
            KT_EQ_INT(kiln_ir_verify(g, &err), KILN_ERR_VERIFY);
            KT_CONTAINS(err.msg, "+fast_accum over");
            KT_CONTAINS(err.msg, "not fp8 with a scale a row");
        }
        if (cases[ci].quant == KILN_DTYPE_FP8) {
            /* +fast_accum without +act_fp8 fails the verifier */
            for (int i = 0; i < g->n_ops; i++)
                if (!g->ops[i].dead && (g->ops[i].attrs.flags & KILN_FLAG_FP8_FAST)) {
                    g->ops[i].attrs.flags &= ~KILN_FLAG_ACT_FP8;
                    KT_EQ_INT(kiln_ir_verify(g, &err), KILN_ERR_VERIFY);
                    KT_CONTAINS(err.msg, "+fast_accum without +act_fp8");
                    g->ops[i].attrs.flags |= KILN_FLAG_ACT_FP8;
                    break;
                }
            KT_EQ_INT(kiln_ir_verify(g, &err), KILN_OK);
            /* the flag over an f32 matrix (the LM head's), and on an rmsnorm, fail the verifier */
            for (int i = 0; i < g->n_ops; i++)
                if (!g->ops[i].dead && g->ops[i].kind == KILN_OP_LM_HEAD) g->ops[i].attrs.flags |= KILN_FLAG_ACT_FP8;
            KT_EQ_INT(kiln_ir_verify(g, &err), KILN_ERR_VERIFY);
            KT_CONTAINS(err.msg, "+act_fp8 over");
            for (int i = 0; i < g->n_ops; i++)
                if (!g->ops[i].dead && g->ops[i].kind == KILN_OP_LM_HEAD) g->ops[i].attrs.flags &= ~KILN_FLAG_ACT_FP8;
            KT_EQ_INT(kiln_ir_verify(g, &err), KILN_OK);
            for (int i = 0; i < g->n_ops; i++)
                if (!g->ops[i].dead && g->ops[i].kind == KILN_OP_RMSNORM) {
                    g->ops[i].attrs.flags = KILN_FLAG_ACT_FP8;
                    break;
                }
            KT_EQ_INT(kiln_ir_verify(g, &err), KILN_ERR_VERIFY);
            KT_CONTAINS(err.msg, "do not apply");
        }
        kiln_graph_free(g);
    }
    /* left out of --passes, it flags nothing */
    kiln_error err = {0};
    kiln_graph *g = stories_graph();
    KT_REQUIRE(g);
    g->quant_weights = KILN_DTYPE_FP8;
    KT_REQUIRE(kiln_passes_run(g, "fuse-add-rmsnorm,fuse-qkv-rope,fuse-gate-up-swiglu,dce", NULL, &err) == KILN_OK);
    for (int i = 0; i < g->n_ops; i++)
        KT_CHECK(g->ops[i].dead || !(g->ops[i].attrs.flags & (KILN_FLAG_ACT_FP8 | KILN_FLAG_FP8_FAST)));
    kiln_graph_free(g);
    /* w8a8 without w8a8-fast-accum: W8A8 that promotes its partial sums */
    g = stories_graph();
    KT_REQUIRE(g);
    g->quant_weights = KILN_DTYPE_FP8;
    KT_REQUIRE(kiln_passes_run(g, "fuse-add-rmsnorm,fuse-qkv-rope,fuse-gate-up-swiglu,w8a8,dce", NULL, &err) == KILN_OK);
    int n8 = 0;
    for (int i = 0; i < g->n_ops; i++) {
        n8 += !g->ops[i].dead && (g->ops[i].attrs.flags & KILN_FLAG_ACT_FP8);
        KT_CHECK(g->ops[i].dead || !(g->ops[i].attrs.flags & KILN_FLAG_FP8_FAST));
    }
    KT_EQ_INT(n8, 4 * layers);
    kiln_graph_free(g);
}

/* swiglu-out-fp8 and norm-out-fp8 (default, after w8a8) flag each layer's gate_up_swiglu +out_fp8 when
 * down_proj after it runs W8A8 over per-row fp8, and its two RMSNorms when q/k/v and gate/up after them do
 * (the final norm's reader, the LM head, keeps its dtype here), and no other: not fp8g128's (scales per 128
 * columns), int8's or bf16's, nor without w8a8 (no +act_fp8 to write codes for), nor a pass left out; the
 * verifier refuses the flag on other ops. */
static void test_swiglu_out_fp8_pass(void) {
    const int layers = 5;
    static const struct {
        int quant;
        const char *passes;
        int want, want_norms;
    } cases[] = {{KILN_DTYPE_FP8, NULL, layers, 2 * layers},
                 {KILN_DTYPE_FP8G128, NULL, 0, 0},
                 {KILN_DTYPE_Q8, NULL, 0, 0},
                 {0, NULL, 0, 0},
                 {KILN_DTYPE_FP8, PASSES_NO_W8A8 ",swiglu-out-fp8,norm-out-fp8", 0, 0},
                 {KILN_DTYPE_FP8, PASSES_NO_W8A8 ",w8a8,norm-out-fp8", 0, 2 * layers},
                 {KILN_DTYPE_FP8, PASSES_NO_W8A8 ",w8a8,swiglu-out-fp8", layers, 0}};
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        kiln_error err = {0};
        kiln_graph *g = stories_graph();
        KT_REQUIRE(g);
        g->quant_weights = cases[ci].quant;
        KT_REQUIRE(kiln_passes_run(g, cases[ci].passes, NULL, &err) == KILN_OK);
        int n = 0, nn = 0;
        for (int i = 0; i < g->n_ops; i++)
            if (!g->ops[i].dead && (g->ops[i].attrs.flags & KILN_FLAG_OUT_FP8)) {
                KT_CHECK(g->ops[i].kind == KILN_OP_GATE_UP_SWIGLU_PACKED || g->ops[i].kind == KILN_OP_RMSNORM);
                n += g->ops[i].kind == KILN_OP_GATE_UP_SWIGLU_PACKED;
                nn += g->ops[i].kind == KILN_OP_RMSNORM;
            }
        KT_EQ_INT(n, cases[ci].want);
        KT_EQ_INT(nn, cases[ci].want_norms);
        if (ci == 0) {
            for (int i = 0; i < g->n_ops; i++)
                if (!g->ops[i].dead && g->ops[i].kind == KILN_OP_LINEAR_ADD) {
                    g->ops[i].attrs.flags |= KILN_FLAG_OUT_FP8;
                    break;
                }
            KT_EQ_INT(kiln_ir_verify(g, &err), KILN_ERR_VERIFY);
            KT_CONTAINS(err.msg, "do not apply");
        }
        kiln_graph_free(g);
    }
}

int main(void) {
    KT_RUN(test_op_table);
    KT_RUN(test_builder_infers_and_rejects_shapes);
    KT_RUN(test_verifier_catches_broken_graphs);
    KT_RUN(test_fusion_passes_on_stories260k);
    KT_RUN(test_qwen_extras_fuse_into_qkv_rope);
    KT_RUN(test_dce_removes_unused_and_keeps_output);
    KT_RUN(test_memory_planning_never_aliases_live_values);
    KT_RUN(test_unknown_pass_is_refused);
    KT_RUN(test_plan_round_trip_and_checks);
    KT_RUN(test_moe_stacks_and_plan);
    KT_RUN(test_dump_ir_prints_each_pass);
    KT_RUN(test_fold_norm_into_ck_gemv);
    KT_RUN(test_w8a8_pass);
    KT_RUN(test_swiglu_out_fp8_pass);
    if (ck_open) kiln_checkpoint_close(&ck);
    return KT_END();
}
