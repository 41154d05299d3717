/*
 * test_golden.c — end to end against HuggingFace transformers: compile each
 * reference checkpoint, run the CPU executor, and compare with the goldens
 * tests/golden/make_goldens.py made (fp32, eager attention):
 *   - logits of one forward over prompt + continuation at every position:
 *     max |kiln − HF| ≤ 1e-4 × (logit range of that case);
 *   - greedy generation of all golden tokens, token by token through the KV
 *     cache: identical ids.
 * Each model is checked with the default pass pipeline, with no passes and
 * with every pass, so every fusion is shown to keep the numbers. Sharded and single-file
 * checkpoints of one model must give byte-identical engines.
 * The routing of Mixtral and Qwen3-MoE is checked too: the experts the CPU
 * executor picks for every token in every sparse layer (its routing trace),
 * over the full forward and through the KV cache, are HF's, in torch.topk's
 * order, including the tokens where two tied router probabilities decide;
 * kiln_topk reproduces torch.topk's order on inputs full of ties.
 */
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "compiler/kiln_compiler.h"
#include "golden_io.h"
#include "kt.h"
#include "kt_fixture.h"
#include "runtime/kiln.h"
#include "runtime/kiln_rt.h"
#include "runtime/kiln_tokenizer.h"

static char tmpdir[256];

static char *src_path(const char *rel) {
    static char buf[4][1024];
    static int k;
    char *b = buf[k++ % 4];
    snprintf(b, sizeof buf[0], "%s/%s", KILN_SOURCE_DIR, rel);
    return b;
}

static int compile_to(const char *ckpt, const char *passes, const char *out, kiln_dtype dt) {
    kiln_compile_options opt = {.output_path = out, .weight_dtype = dt, .passes = passes};
    return kt_compile(ckpt, &opt);
}


/* Check one engine against one model's golden file. */
static void check_engine(const char *engine, const char *golden_dir) {
    char path[1024];
    snprintf(path, sizeof path, "%s/golden.json", golden_dir);
    json_error_t je;
    json_t *g = json_load_file(path, 0, &je);
    KT_REQUIRE(g != NULL);
    kiln_model *m = NULL;
    kiln_error err = {0};
    KT_REQUIRE(kiln_model_open(engine, 2, &m, &err) == KILN_OK);
    json_t *cases = json_object_get(g, "cases");
    size_t ci;
    json_t *c;
    json_array_foreach(cases, ci, c) {
        golden_case gc;
        golden_case_read(c, golden_dir, &gc);
        const int np = gc.np, ng = gc.ng, positions = gc.positions, vocab = gc.vocab;
        const int32_t *prompt = gc.prompt, *greedy = gc.greedy;
        const float *want = gc.logits;
        const double range = gc.range;
        KT_EQ_INT(positions, np + ng);
        KT_EQ_INT(vocab, m->plan->vocab_size);
        KT_CHECK(want != NULL);

        /* 1. one forward over the whole sequence, all logits */
        int32_t *seq = malloc((size_t)positions * sizeof *seq);
        memcpy(seq, prompt, (size_t)np * sizeof *seq);
        memcpy(seq + np, greedy, (size_t)ng * sizeof *seq);
        float *got = malloc((size_t)positions * (size_t)vocab * sizeof *got);
        kiln_cpu_ctx *ctx = NULL;
        KT_CHECK(kiln_cpu_ctx_new(m, 0, positions, 2, &ctx, &err) == KILN_OK);
        if (ctx && want) {
            KT_CHECK(kiln_cpu_forward(ctx, seq, positions, true, got, &err) == KILN_OK);
            double max_err = 0;
            for (size_t i = 0; i < (size_t)positions * (size_t)vocab; i++) {
                double e = fabs((double)got[i] - (double)want[i]);
                if (!(e <= max_err)) max_err = e; /* NaN propagates */
            }
            KT_CHECKF(max_err <= 1e-4 * range, "%s case %zu: max abs logit error %.3g > 1e-4 x range %.3g", engine,
                      ci, max_err, range);
            fprintf(stderr, "  %s case %zu: max abs logit error %.3g (%.2g of range)\n", golden_dir, ci, max_err,
                    max_err / range);
        }
        /* 2. greedy generation through the KV cache */
        if (ctx) {
            kiln_cpu_ctx_reset(ctx);
            kiln_generate_opts o = {.max_tokens = ng, .temperature = 0, .top_p = 1, .ignore_eos = true};
            kiln_generate_result r;
            KT_CHECK(kiln_generate(ctx, prompt, np, &o, &r, &err) == KILN_OK);
            KT_EQ_INT(r.n_ids, ng);
            int first_diff = -1;
            for (int i = 0; i < ng && i < r.n_ids; i++)
                if (r.ids[i] != greedy[i]) {
                    first_diff = i;
                    break;
                }
            KT_CHECKF(first_diff < 0, "%s case %zu: greedy ids differ from HF at step %d", engine, ci, first_diff);
            free(r.ids);
        }
        kiln_cpu_ctx_free(ctx);
        free(got);
        free(seq);
        golden_case_free(&gc);
    }
    kiln_model_close(m);
    json_decref(g);
}

static void check_model(const char *ckpt_rel, const char *golden_rel, kiln_dtype dt) {
    char out[512];
    /* the default pipeline, none, and every pass (the optional GPU ones only set flags the CPU ignores,
     * but they must keep a verified plan that loads) */
    const char *pass_sets[3] = {NULL, "none",
                                "fuse-add-rmsnorm,fuse-qkv-rope,fuse-gate-up-swiglu,fuse-linear-residual,"
                                "decode-attention-rope,decode-attention-merge,fold-norm-into-gemv,dce"};
    for (int k = 0; k < 3; k++) {
        snprintf(out, sizeof out, "%s/golden-%d.kiln", tmpdir, k);
        KT_REQUIRE(compile_to(src_path(ckpt_rel), pass_sets[k], out, dt) == KILN_OK);
        check_engine(out, src_path(golden_rel));
        unlink(out);
    }
}

/* A quantized engine (--quant) against HF run on the same weights rounded the same way
 * (make_goldens.py rtn_q8 / rtn_q4, written again in numpy): the default pipeline (packed q/k/v and
 * gate/up quantized as one) and none (each matrix alone) must both match. */
static void check_quant(const char *golden_rel, int quant, int head, int embedding) {
    char out[512];
    const char *pass_sets[2] = {kiln_quant_is_fp8(quant) ? PASSES_NO_W8A8 : NULL, "none"};
    for (int k = 0; k < 2; k++) {
        snprintf(out, sizeof out, "%s/quant-%d.kiln", tmpdir, k);
        kiln_compile_options opt = {.output_path = out, .weight_dtype = KILN_DTYPE_COUNT_, .passes = pass_sets[k],
                                    .quant = quant, .quant_head = head, .quant_embedding = embedding,
                                    .quant_method = KILN_QUANT_RTN};
        KT_REQUIRE(kt_compile(src_path("tests/data/tiny-mistral"), &opt) == KILN_OK);
        check_engine(out, src_path(golden_rel));
        kiln_model *m = NULL;
        kiln_error err = {0};
        KT_REQUIRE(kiln_model_open(out, 1, &m, &err) == KILN_OK);
        int nq = 0, nh = 0;
        for (uint32_t i = 0; i < m->plan->n_weights; i++) {
            const kiln_plan_weight *w = &m->plan->weights[i];
            nq += (int)w->dtype == quant;
            nh += strcmp(w->name, "lm_head.weight") == 0 && (int)w->dtype == head;
            if (strstr(w->name, "norm")) KT_CHECK(!kiln_dtype_is_quant((int)w->dtype));
            if (strstr(w->name, "embed_tokens")) KT_EQ_INT(w->dtype, embedding ? (uint32_t)embedding : w->dtype);
            if (strstr(w->name, "embed_tokens") && !embedding) KT_CHECK(!kiln_dtype_is_quant((int)w->dtype));
        }
        /* per layer: packed qkv, o, gate/up, down (or 7 unpacked), + the head and the embedding when alike */
        KT_EQ_INT(nq, (k == 0 ? 4 : 7) * 2 + (quant == head) + (quant == embedding));
        KT_EQ_INT(nh, 1);
        kiln_model_close(m);
        unlink(out);
    }
}
static void test_tiny_mistral_int8(void) {
    check_quant("tests/golden/tiny-mistral-int8", KILN_DTYPE_Q8, KILN_DTYPE_Q8, KILN_DTYPE_Q8);
}
static void test_tiny_mistral_int4(void) {
    check_quant("tests/golden/tiny-mistral-int4g32", KILN_DTYPE_Q4G32, KILN_DTYPE_Q8, 0);
}
/* --quant fp8 --quant-head fp8 --quant-embedding fp8: every matrix in E4M3 codes (make_goldens.py rtn_fp8) */
static void test_tiny_mistral_fp8(void) {
    check_quant("tests/golden/tiny-mistral-fp8", KILN_DTYPE_FP8, KILN_DTYPE_FP8, KILN_DTYPE_FP8);
}

/* A published quantized checkpoint (AWQ, GPTQ, compressed-tensors, FP8; tests/golden/make_quant_ckpt_goldens.py)
 * read as it is: against HF run on an independent numpy dequantization of the stored tensors, with the
 * default pipeline (q/k/v and gate/up packed from the repacked matrices) and none. Every projection is
 * `dtype` (q4g32, the checkpoints' group, fp8 or fp8g128), the embedding and LM head bf16 (tiny-llama3's f16)
 * as in the checkpoint. */
/* As check_quant_checkpoint_as, with the counts of `dtype` matrices the engines hold with the default passes
 * (q/k/v and gate/up packed) and with none. */
static void check_quant_checkpoint_n(const char *name, kiln_dtype dtype, int n_default, int n_none) {
    char ckpt[256], golden[256], out[512];
    snprintf(ckpt, sizeof ckpt, "tests/data/%s", name);
    snprintf(golden, sizeof golden, "tests/golden/%s", name);
    const char *pass_sets[2] = {kiln_quant_is_fp8(dtype) ? PASSES_NO_W8A8 : NULL, "none"};
    for (int k = 0; k < 2; k++) {
        snprintf(out, sizeof out, "%s/qckpt-%d.kiln", tmpdir, k);
        KT_REQUIRE(compile_to(src_path(ckpt), pass_sets[k], out, KILN_DTYPE_COUNT_) == KILN_OK);
        check_engine(out, src_path(golden));
        kiln_model *m = NULL;
        kiln_error err = {0};
        KT_REQUIRE(kiln_model_open(out, 1, &m, &err) == KILN_OK);
        int nq = 0;
        for (uint32_t i = 0; i < m->plan->n_weights; i++) {
            const kiln_plan_weight *w = &m->plan->weights[i];
            nq += w->dtype == (uint32_t)dtype;
            if (strstr(w->name, "embed_tokens") || strstr(w->name, "lm_head")) /* as in the checkpoint */
                KT_EQ_INT(w->dtype, strstr(name, "llama3") ? KILN_DTYPE_F16 : KILN_DTYPE_BF16);
        }
        KT_EQ_INT(nq, k == 0 ? n_default : n_none);
        kiln_model_close(m);
        unlink(out);
    }
}
static void check_quant_checkpoint_as(const char *name, kiln_dtype dtype) {
    check_quant_checkpoint_n(name, dtype, 4 * 2, 7 * 2);
}
/* W8A8 on the CPU (pass w8a8, +act_fp8): an fp8 engine with the default pipeline against the same engine
 * without the pass, over golden case 0's whole sequence in one step (80 rows: past KILN_QGEMV_MAX_ROWS,
 * so every projection's input is rounded to E4M3 per token, or per 128 columns for fp8g128) and over its
 * first 32 tokens (the quantized GEMV's steps, which read the activations as they are: the same bits).
 * Against HF's weight-only logits, W8A8 stays within the bound the GPU's W8A8 is held to (0.12), and moves
 * the logits off the weight-only ones. */
static void check_w8a8_cpu(const char *ckpt_rel, const char *golden_rel, int quant, int flagged) {
    char eng[2][512];
    kiln_model *m[2] = {NULL, NULL};
    kiln_error err = {0};
    for (int k = 0; k < 2; k++) {
        snprintf(eng[k], sizeof eng[k], "%s/w8a8-%d.kiln", tmpdir, k);
        kiln_compile_options opt = {.output_path = eng[k], .weight_dtype = KILN_DTYPE_COUNT_,
                                    .passes = k ? PASSES_NO_W8A8 : NULL, .quant = quant, .quant_head = quant,
                                    .quant_embedding = quant,
                                    .quant_method = KILN_QUANT_RTN};
        KT_REQUIRE(kt_compile(src_path(ckpt_rel), &opt) == KILN_OK);
        KT_REQUIRE(kiln_model_open(eng[k], 2, &m[k], &err) == KILN_OK);
        int n = 0;
        for (uint32_t i = 0; i < m[k]->plan->n_ops; i++) n += (m[k]->plan->ops[i].attrs.flags & KILN_FLAG_ACT_FP8) != 0;
        KT_EQ_INT(n, k ? 0 : flagged);
    }
    char path[1024];
    snprintf(path, sizeof path, "%s/golden.json", src_path(golden_rel));
    json_error_t je;
    json_t *g = json_load_file(path, 0, &je);
    KT_REQUIRE(g != NULL);
    golden_case gc;
    golden_case_read(json_array_get(json_object_get(g, "cases"), 0), src_path(golden_rel), &gc);
    const int T = gc.positions, V = gc.vocab;
    KT_REQUIRE(T > KILN_QGEMV_MAX_ROWS && gc.logits != NULL);
    int32_t *seq = malloc((size_t)T * sizeof *seq);
    memcpy(seq, gc.prompt, (size_t)gc.np * sizeof *seq);
    memcpy(seq + gc.np, gc.greedy, (size_t)gc.ng * sizeof *seq);
    float *lg[2], *sh[2];
    for (int k = 0; k < 2; k++) {
        lg[k] = malloc(sizeof(float) * (size_t)T * V);
        sh[k] = malloc(sizeof(float) * (size_t)KILN_QGEMV_MAX_ROWS * V);
        kiln_cpu_ctx *c = NULL;
        KT_REQUIRE(kiln_cpu_ctx_new(m[k], 0, T, 2, &c, &err) == KILN_OK);
        KT_CHECK(kiln_cpu_forward(c, seq, T, true, lg[k], &err) == KILN_OK);
        kiln_cpu_ctx_reset(c);
        KT_CHECK(kiln_cpu_forward(c, seq, KILN_QGEMV_MAX_ROWS, true, sh[k], &err) == KILN_OK);
        kiln_cpu_ctx_free(c);
    }
    const size_t all = (size_t)T * V;
    const double w8 = kt_rel_l2(lg[0], gc.logits, all), wo = kt_rel_l2(lg[1], gc.logits, all);
    const double moved = kt_rel_l2(lg[0], lg[1], all);
    fprintf(stderr, "  %s: W8A8 over %d rows: logits rel err %.3g against HF's weight-only (without w8a8 %.2g), "
            "%.3g off the weight-only engine\n", ckpt_rel, T, w8, wo, moved);
    KT_CHECKF(w8 < 0.12 && moved > 1e-3 && wo < 1e-3, "%s: W8A8 %.3g, weight-only %.3g, moved %.3g", ckpt_rel, w8, wo,
              moved);
    KT_CHECKF(memcmp(sh[0], sh[1], sizeof(float) * (size_t)KILN_QGEMV_MAX_ROWS * V) == 0,
              "%s: a %d-row step differs with +act_fp8 (it is the quantized GEMV's)", ckpt_rel, KILN_QGEMV_MAX_ROWS);
    for (int k = 0; k < 2; k++) {
        free(lg[k]), free(sh[k]);
        kiln_model_close(m[k]);
        unlink(eng[k]);
    }
    free(seq);
    golden_case_free(&gc);
    json_decref(g);
}
static void test_w8a8_cpu(void) {
    /* per layer: packed q/k/v, o_proj, gate/up, down; and the LM head (fp8 too) */
    check_w8a8_cpu("tests/data/tiny-mistral", "tests/golden/tiny-mistral-fp8", KILN_DTYPE_FP8, 4 * 2 + 1);
    /* block FP8 read as it is (fp8g128: a scale per token and 128 columns; its LM head stays bf16) */
    check_w8a8_cpu("tests/data/tiny-mistral-fp8-block", "tests/golden/tiny-mistral-fp8-block", 0, 4 * 2);
}

static void check_quant_checkpoint(const char *name) { check_quant_checkpoint_as(name, KILN_DTYPE_Q4G32); }
static void test_awq_checkpoint(void) { check_quant_checkpoint("tiny-mistral-awq"); }
static void test_gptq_checkpoint_sym(void) { check_quant_checkpoint("tiny-mistral-gptq"); }
static void test_gptq_checkpoint_asym_desc_act(void) { check_quant_checkpoint("tiny-mistral-gptq-asym"); }
/* act-order: permuting g_idx, so each projection's columns are sorted by group and its input permuted
 * (one permute op per input: q/k/v's, o_proj's, gate/up's and down_proj's in layer 0; q/k/v's and
 * down_proj's in layer 1, whose o_proj keeps its groups in order and whose gate/up a dynamic rule leaves
 * bf16: 6, of which the default passes fold the two down_proj ones into gate/up's rows (quantized and
 * repacked in layer 0, dense in layer 1: fold-permute-into-rows) and the three after norms into the norms
 * (fold-permute-into-norm, +out_perm): 1 left; both pass sets are checked against HF), and opening an
 * engine refuses a permute weight that is not a permutation */
static void test_gptq_checkpoint_act_order(void) {
    check_quant_checkpoint_n("tiny-mistral-gptq-actorder", KILN_DTYPE_Q4G32, 4 + 3, 7 + 5);
    char out[512];
    snprintf(out, sizeof out, "%s/actorder.kiln", tmpdir);
    KT_REQUIRE(compile_to(src_path("tests/data/tiny-mistral-gptq-actorder"), NULL, out, KILN_DTYPE_COUNT_) == KILN_OK);
    kiln_model *m = NULL;
    kiln_error err = {0};
    KT_REQUIRE(kiln_model_open(out, 1, &m, &err) == KILN_OK);
    const kiln_plan *p = m->plan;
    int n_perm = 0;
    const kiln_plan_weight *w = NULL;
    for (uint32_t i = 0; i < p->n_ops; i++)
        if (p->ops[i].kind == KILN_OP_PERMUTE) {
            n_perm++;
            w = &p->weights[p->values[p->ops[i].in[1]].weight];
        }
    KT_EQ_INT(n_perm, 1);
    int n_out_perm = 0;
    for (uint32_t i = 0; i < p->n_ops; i++) n_out_perm += (p->ops[i].attrs.flags & KILN_FLAG_OUT_PERM) != 0;
    KT_EQ_INT(n_out_perm, 3);
    KT_REQUIRE(w != NULL && w->dtype == KILN_DTYPE_I32);
    KT_CONTAINS(w->name, "g_idx");
    uint8_t *copy = malloc(m->weights_size);
    KT_REQUIRE(copy != NULL);
    memcpy(copy, m->weights, m->weights_size);
    KT_EQ_INT(kiln_plan_check_permutations(p, copy, "x.kiln", &err), KILN_OK);
    uint8_t *idx = copy + w->offset;
    memcpy(idx + 4, idx, 4); /* index 1 = index 0: a column taken twice */
    KT_EQ_INT(kiln_plan_check_permutations(p, copy, "x.kiln", &err), KILN_ERR_FORMAT);
    KT_CONTAINS(err.msg, "element 1 is");
    KT_CONTAINS(err.msg, "a column already taken");
    kiln_wr_u32(idx + 4, (uint32_t)w->shape[0]); /* past the row */
    KT_EQ_INT(kiln_plan_check_permutations(p, copy, "x.kiln", &err), KILN_ERR_FORMAT);
    KT_CONTAINS(err.msg, "outside the row");
    kiln_wr_u32(idx + 4, 0xFFFFFFFFu); /* -1 */
    KT_EQ_INT(kiln_plan_check_permutations(p, copy, "x.kiln", &err), KILN_ERR_FORMAT);
    KT_CONTAINS(err.msg, "is -1, outside the row");
    /* a +out_perm norm's order is checked the same way */
    memcpy(copy, m->weights, m->weights_size);
    const kiln_plan_weight *nw = NULL;
    for (uint32_t i = 0; i < p->n_ops && !nw; i++) {
        const int oi = kiln_op_order_input((kiln_op_kind)p->ops[i].kind, p->ops[i].attrs.flags);
        if (oi >= 0 && p->ops[i].kind != KILN_OP_PERMUTE) nw = &p->weights[p->values[p->ops[i].in[oi]].weight];
    }
    KT_REQUIRE(nw != NULL && nw->dtype == KILN_DTYPE_I32);
    kiln_wr_u32(copy + nw->offset + 8, (uint32_t)nw->shape[0] + 7u);
    KT_EQ_INT(kiln_plan_check_permutations(p, copy, "x.kiln", &err), KILN_ERR_FORMAT);
    KT_CONTAINS(err.msg, "rmsnorm): element 2 is");
    free(copy);
    kiln_model_close(m);
    unlink(out);
}
static void test_gptq_v2_checkpoint(void) { check_quant_checkpoint("tiny-mistral-gptq-v2"); }
/* compressed-tensors with actorder "group": each projection's weight_g_idx read as GPTQ's g_idx */
static void test_ct_checkpoint_act_order(void) { check_quant_checkpoint("tiny-mistral-ct-actorder"); }
/* GPTQModel's dynamic map (make_quant_ckpt_goldens.py DYNAMIC): layer 0's q/k/v/o read dense (bf16), layer
 * 1's MLP in groups of 64, the rest in groups of 32; against HF on the dense dequantized model, with
 * the default passes (q/k/v and gate/up packed) and none. */
static void test_gptq_dynamic_checkpoint(void) {
    char out[512];
    const char *pass_sets[2] = {NULL, "none"};
    /* matrices in q4g32, q4g64, bf16 (the embedding and LM head included): packed, and not */
    static const int want[2][3] = {{4, 2, 4}, {7, 3, 6}};
    for (int k = 0; k < 2; k++) {
        snprintf(out, sizeof out, "%s/qdyn-%d.kiln", tmpdir, k);
        KT_REQUIRE(compile_to(src_path("tests/data/tiny-mistral-gptq-dynamic"), pass_sets[k], out, KILN_DTYPE_COUNT_) ==
                   KILN_OK);
        check_engine(out, src_path("tests/golden/tiny-mistral-gptq-dynamic"));
        kiln_model *m = NULL;
        kiln_error err = {0};
        KT_REQUIRE(kiln_model_open(out, 1, &m, &err) == KILN_OK);
        int n[3] = {0, 0, 0};
        for (uint32_t i = 0; i < m->plan->n_weights; i++) {
            const kiln_plan_weight *w = &m->plan->weights[i];
            n[0] += w->dtype == KILN_DTYPE_Q4G32;
            n[1] += w->dtype == KILN_DTYPE_Q4G64;
            n[2] += w->dtype == KILN_DTYPE_BF16 && w->ndim == 2;
            if (strstr(w->name, "layers.0.self_attn")) KT_EQ_INT(w->dtype, KILN_DTYPE_BF16);
            if (strstr(w->name, "layers.1.mlp")) KT_EQ_INT(w->dtype, KILN_DTYPE_Q4G64);
        }
        for (int d = 0; d < 3; d++) KT_EQ_INT(n[d], want[k][d]);
        kiln_model_close(m);
        unlink(out);
    }
}
static void test_ct_checkpoint_sym(void) { check_quant_checkpoint("tiny-mistral-ct"); }
static void test_ct_checkpoint_asym(void) { check_quant_checkpoint("tiny-mistral-ct-asym"); }
/* FP8 E4M3 checkpoints: the codes copied, one scale per row (the tensor's or the channel's) */
static void test_fp8_checkpoint_tensor_static(void) { check_quant_checkpoint_as("tiny-mistral-fp8-tensor", KILN_DTYPE_FP8); }
static void test_fp8_ct_checkpoint_channel(void) { check_quant_checkpoint_as("tiny-mistral-fp8-channel", KILN_DTYPE_FP8); }
static void test_fp8_ct_checkpoint_tensor_static(void) {
    check_quant_checkpoint_as("tiny-mistral-fp8-ct-tensor", KILN_DTYPE_FP8);
}
/* block FP8 (weight_block_size [128, 128]): the codes copied, each row's groups of 128 columns the scale of
 * their block (fp8g128; tiny-mistral's 64-column matrices have one short group a row) */
static void test_fp8_checkpoint_block(void) { check_quant_checkpoint_as("tiny-mistral-fp8-block", KILN_DTYPE_FP8G128); }
/* tiny-llama3's 192-wide MLP: scales that differ along gate/up's rows (two row blocks) and down's columns (two
 * groups, the second 64 wide) */
static void test_fp8_checkpoint_block_rows_cols(void) {
    check_quant_checkpoint_as("tiny-llama3-fp8-block", KILN_DTYPE_FP8G128);
}
/* compressed-tensors' FP8_BLOCK (strategy block, block_structure [128, 128], bf16 weight_scale per block) */
static void test_fp8_ct_checkpoint_block(void) { check_quant_checkpoint_as("tiny-llama3-fp8-ct-block", KILN_DTYPE_FP8G128); }

static void test_stories260k(void) { check_model("models/stories260k", "tests/golden/stories260k", KILN_DTYPE_COUNT_); }
static void test_tiny_mistral_sliding_window(void) {
    check_model("tests/data/tiny-mistral", "tests/golden/tiny-mistral", KILN_DTYPE_COUNT_);
}
static void test_tiny_llama3_rope_scaling_tied(void) {
    check_model("tests/data/tiny-llama3", "tests/golden/tiny-llama3", KILN_DTYPE_COUNT_);
}
/* Qwen3: per-head q/k RMSNorm before RoPE, head_dim 24 while hidden / heads is 16 */
static void test_tiny_qwen3_qk_norm(void) {
    check_model("tests/data/tiny-qwen3", "tests/golden/tiny-qwen3", KILN_DTYPE_COUNT_);
}
/* Qwen2: q/k/v biases, a window on layer 1 only (max_window_layers, 4.x config), tied */
static void test_tiny_qwen2_bias_layer_window(void) {
    check_model("tests/data/tiny-qwen2", "tests/golden/tiny-qwen2", KILN_DTYPE_COUNT_);
}
/* Mixtral: 8 experts, top-2 routing, GQA (its experts stacked into [E,2F,H] and [E,H,F] weights) */
static void test_tiny_mixtral_moe(void) {
    check_model("tests/data/tiny-mixtral", "tests/golden/tiny-mixtral", KILN_DTYPE_COUNT_);
}

/* the expert stacks converted bf16 → f32 part by part (exact) */
static void test_tiny_mixtral_as_f32(void) {
    check_model("tests/data/tiny-mixtral", "tests/golden/tiny-mixtral", KILN_DTYPE_F32);
}

/* Qwen3-MoE: 16 experts top-4 renormalised, q/k norms, layer 1 dense (mlp_only_layers, its own width) */
static void test_tiny_qwen3_moe(void) {
    check_model("tests/data/tiny-qwen3-moe", "tests/golden/tiny-qwen3-moe", KILN_DTYPE_COUNT_);
}

/* Qwen3-MoE's other variants: norm_topk_prob false (flag moe_no_renorm), decoder_sparse_step 2 (layer 0
 * dense), 8 experts top-2, a window of 8 on every layer */
static void test_tiny_qwen3_moe_nonorm(void) {
    check_model("tests/data/tiny-qwen3-moe-nonorm", "tests/golden/tiny-qwen3-moe-nonorm", KILN_DTYPE_COUNT_);
}

/* ---- routing against HF's ---- */

typedef struct route_log {
    int layers, positions, k;
    int32_t *experts; /* [layers][positions][k], -1 = not routed */
    bool renorm;      /* the weights of a token sum to 1 (else: to its top-k probabilities' sum, below 1) */
    int calls, bad;
} route_log;

static void record_route(void *user, int layer, int pos, int top_k, const int32_t *experts, const float *weights) {
    route_log *r = user;
    r->calls++;
    if (layer < 0 || layer >= r->layers || pos < 0 || pos >= r->positions || top_k != r->k) {
        r->bad++;
        return;
    }
    float sum = 0;
    for (int j = 0; j < top_k; j++) {
        r->experts[((size_t)layer * r->positions + pos) * r->k + j] = experts[j];
        sum += weights[j];
    }
    if (r->renorm ? !(fabsf(sum - 1) < 1e-5f) : !(sum > 0 && sum < 1)) r->bad++;
}

/* Positions 0..n-1 of the log against the golden's "routing" [layer][position][k] (a dense layer: [] and
 * nothing routed); returns the first differing position (and prints it), or -1. */
static int routing_diff(const route_log *r, json_t *want, int n, const char *what, size_t ci) {
    for (int l = 0; l < r->layers; l++)
        for (int t = 0; t < n; t++) {
            if (json_array_size(json_array_get(want, (size_t)l)) == 0) {
                if (r->experts[((size_t)l * r->positions + t) * r->k] == -1) continue;
                fprintf(stderr, "  case %zu %s: layer %d (dense in HF) routed position %d\n", ci, what, l, t);
                return t;
            }
            for (int j = 0; j < r->k; j++) {
                json_t *e = json_array_get(json_array_get(json_array_get(want, (size_t)l), (size_t)t), (size_t)j);
                int32_t got = r->experts[((size_t)l * r->positions + t) * r->k + j];
                if (!e || json_integer_value(e) != got) {
                    fprintf(stderr, "  case %zu %s: layer %d position %d: expert %d of the top %d is %d, HF's is "
                                    "%lld\n", ci, what, l, t, j, r->k, got, e ? (long long)json_integer_value(e) : -1LL);
                    return t;
                }
            }
        }
    return -1;
}

/* The routing of a MoE checkpoint's engine against its golden's: top-k `k`, `sparse` of the layers routed,
 * weights renormalised or not. */
static void check_routing(const char *ckpt_rel, const char *golden_rel, int k, int sparse, bool renorm) {
    char out[512], path[1024];
    snprintf(out, sizeof out, "%s/moe.kiln", tmpdir);
    KT_REQUIRE(compile_to(src_path(ckpt_rel), NULL, out, KILN_DTYPE_COUNT_) == KILN_OK);
    snprintf(path, sizeof path, "%s/golden.json", src_path(golden_rel));
    json_error_t je;
    json_t *g = json_load_file(path, 0, &je);
    KT_REQUIRE(g != NULL);
    kiln_model *m = NULL;
    kiln_error err = {0};
    KT_REQUIRE(kiln_model_open(out, 2, &m, &err) == KILN_OK);
    size_t ci;
    json_t *c;
    int ties = 0;
    json_array_foreach(json_object_get(g, "cases"), ci, c) {
        golden_case gc;
        golden_case_read(c, src_path(golden_rel), &gc);
        json_t *want = json_object_get(c, "routing");
        route_log r = {.layers = m->plan->n_layers, .positions = gc.positions, .k = k, .renorm = renorm};
        const size_t n_log = (size_t)r.layers * (size_t)r.positions * (size_t)k;
        KT_EQ_INT(json_array_size(want), r.layers);
        int routed = 0;
        for (int l = 0; l < r.layers; l++) {
            size_t n = json_array_size(json_array_get(want, (size_t)l));
            KT_CHECK(n == 0 || n == (size_t)gc.positions);
            routed += n > 0;
        }
        KT_EQ_INT(routed, sparse);
        r.experts = malloc(n_log * sizeof *r.experts);
        int32_t *seq = malloc((size_t)gc.positions * sizeof *seq);
        float *logits = malloc((size_t)gc.positions * (size_t)gc.vocab * sizeof *logits);
        KT_REQUIRE(r.experts && seq && logits);
        memcpy(seq, gc.prompt, (size_t)gc.np * sizeof *seq);
        memcpy(seq + gc.np, gc.greedy, (size_t)gc.ng * sizeof *seq);
        kiln_cpu_ctx *ctx = NULL;
        KT_REQUIRE(kiln_cpu_ctx_new(m, 0, gc.positions, 2, &ctx, &err) == KILN_OK);
        kiln_cpu_ctx_set_moe_trace(ctx, record_route, &r);
        /* 1. one forward over the whole sequence */
        memset(r.experts, 0xff, n_log * sizeof *r.experts);
        KT_CHECK(kiln_cpu_forward(ctx, seq, gc.positions, true, logits, &err) == KILN_OK);
        KT_EQ_INT(r.calls, sparse * gc.positions);
        KT_EQ_INT(r.bad, 0);
        KT_CHECKF(routing_diff(&r, want, gc.positions, "full forward", ci) < 0, "case %zu: routing differs", ci);
        /* 2. prompt, then one token at a time through the KV cache (the last token is never fed) */
        kiln_cpu_ctx_reset(ctx);
        memset(r.experts, 0xff, n_log * sizeof *r.experts);
        r.calls = 0;
        kiln_generate_opts o = {.max_tokens = gc.ng, .temperature = 0, .top_p = 1, .ignore_eos = true};
        kiln_generate_result res;
        KT_CHECK(kiln_generate(ctx, gc.prompt, gc.np, &o, &res, &err) == KILN_OK);
        KT_EQ_INT(r.calls, sparse * (gc.positions - 1));
        KT_CHECKF(routing_diff(&r, want, gc.positions - 1, "KV cache", ci) < 0, "case %zu: routing differs", ci);
        free(res.ids);
        int n_ties = (int)json_array_size(json_object_get(c, "router_ties"));
        ties += n_ties;
        fprintf(stderr, "  %s case %zu: %d layers x %d positions routed as HF, %d of them decided by tied "
                        "probabilities\n", golden_rel, ci, sparse, gc.positions, n_ties);
        kiln_cpu_ctx_free(ctx);
        free(logits);
        free(seq);
        free(r.experts);
        golden_case_free(&gc);
    }
    KT_CHECK(ties > 0); /* the golden exercises the tie order */
    kiln_model_close(m);
    json_decref(g);
    unlink(out);
}

static void test_tiny_mixtral_routing(void) {
    check_routing("tests/data/tiny-mixtral", "tests/golden/tiny-mixtral", 2, 2, true);
}
static void test_tiny_qwen3_moe_routing(void) {
    check_routing("tests/data/tiny-qwen3-moe", "tests/golden/tiny-qwen3-moe", 4, 2, true);
}
static void test_tiny_qwen3_moe_nonorm_routing(void) {
    check_routing("tests/data/tiny-qwen3-moe-nonorm", "tests/golden/tiny-qwen3-moe-nonorm", 2, 1, false);
}

/* kiln_topk against torch.topk on inputs full of ties (null = NaN) */
static void test_topk_ties(void) {
    char path[1024];
    snprintf(path, sizeof path, "%s/golden.json", src_path("tests/golden/topk-ties"));
    json_error_t je;
    json_t *g = json_load_file(path, 0, &je);
    KT_REQUIRE(g != NULL);
    size_t ci;
    json_t *c;
    int n_cases = 0, n_bad = 0;
    json_array_foreach(json_object_get(g, "cases"), ci, c) {
        json_t *vals = json_object_get(c, "values");
        int n = (int)json_array_size(vals), k = (int)json_integer_value(json_object_get(c, "k")), nw;
        int32_t *want = golden_json_ids(json_object_get(c, "indices"), &nw);
        float *v = malloc((size_t)n * sizeof *v);
        int32_t *got = malloc((size_t)k * sizeof *got);
        KT_REQUIRE(v && got && want && nw == k);
        for (int i = 0; i < n; i++) {
            json_t *e = json_array_get(vals, (size_t)i);
            v[i] = json_is_null(e) ? NAN : (float)json_number_value(e);
        }
        kiln_error err = {0};
        KT_CHECK(kiln_topk(v, n, k, got, &err) == KILN_OK);
        if (memcmp(got, want, (size_t)k * sizeof *got) != 0) {
            n_bad++;
            fprintf(stderr, "  case %zu: top %d of %d: kiln's first index %d, torch's %d\n", ci, k, n, got[0], want[0]);
        }
        n_cases++;
        free(v);
        free(got);
        free(want);
    }
    KT_CHECK(n_cases > 100);
    KT_EQ_INT(n_bad, 0);
    fprintf(stderr, "  %d topk cases in torch.topk's order\n", n_cases);
    kiln_error err = {0};
    int32_t idx[2];
    KT_EQ_INT(kiln_topk((const float[]){1, 2}, 2, 3, idx, &err), KILN_ERR_INVALID_ARG);
    json_decref(g);
}

/* bf16 → f32 conversion at compile time is exact, so the goldens still hold */
static void test_tiny_mistral_as_f32(void) {
    check_model("tests/data/tiny-mistral", "tests/golden/tiny-mistral", KILN_DTYPE_F32);
}

static void test_sharded_equals_single(void) {
    char a[512], b[512];
    snprintf(a, sizeof a, "%s/single.kiln", tmpdir);
    snprintf(b, sizeof b, "%s/sharded.kiln", tmpdir);
    KT_REQUIRE(compile_to(src_path("tests/data/tiny-mistral"), NULL, a, KILN_DTYPE_COUNT_) == KILN_OK);
    KT_REQUIRE(compile_to(src_path("tests/data/tiny-mistral-sharded"), NULL, b, KILN_DTYPE_COUNT_) == KILN_OK);
    kiln_mapped_file fa, fb;
    kiln_error err;
    KT_REQUIRE(kiln_file_map(a, &fa, &err) == KILN_OK);
    KT_REQUIRE(kiln_file_map(b, &fb, &err) == KILN_OK);
    KT_EQ_INT(fa.size, fb.size);
    KT_CHECK(fa.size == fb.size && memcmp(fa.data, fb.data, fa.size) == 0);
    kiln_file_unmap(&fa);
    kiln_file_unmap(&fb);
    unlink(a);
    unlink(b);
}

/* Text end to end on the real pycode-22m (bf16 weights, sliding window 256,
 * Llama-2 tokenizer): the prompt text encodes to HF's ids, greedy ids match
 * HF's float32 run, and the decoded text matches HF's. */
static void test_pycode_text(void) {
    char ckpt[1024], golden[1024], out[512];
    snprintf(ckpt, sizeof ckpt, "%s/models/pycode-22m", KILN_SHARED_DIR);
    if (!kiln_path_is_dir(ckpt)) KT_SKIP("%s not present (the shared test models)", ckpt);
    snprintf(golden, sizeof golden, "%s/tests/golden/pycode-22m/golden.json", KILN_SOURCE_DIR);
    snprintf(out, sizeof out, "%s/pycode.kiln", tmpdir);
    KT_REQUIRE(compile_to(ckpt, NULL, out, KILN_DTYPE_COUNT_) == KILN_OK);
    json_error_t je;
    json_t *g = json_load_file(golden, 0, &je);
    KT_REQUIRE(g != NULL);
    kiln_model *m = NULL;
    kiln_error err = {0};
    KT_REQUIRE(kiln_model_open(out, 2, &m, &err) == KILN_OK);
    KT_REQUIRE(m->tokenizer != NULL);
    size_t ci;
    json_t *c;
    json_array_foreach(json_object_get(g, "cases"), ci, c) {
        const char *text = json_string_value(json_object_get(c, "text"));
        int np, ng;
        int32_t *want_prompt = golden_json_ids(json_object_get(c, "prompt"), &np);
        json_t *f32 = json_object_get(c, "float32");
        int32_t *want = golden_json_ids(json_object_get(f32, "greedy"), &ng);
        int32_t *ids = NULL;
        size_t n = 0;
        KT_CHECK(kiln_tokenizer_encode(m->tokenizer, text, strlen(text), KILN_TOK_ADD_SPECIAL, &ids, &n, &err) ==
                 KILN_OK);
        KT_EQ_INT(n, np);
        KT_CHECK(ids && (int)n == np && memcmp(ids, want_prompt, n * sizeof *ids) == 0);
        kiln_cpu_ctx *ctx = NULL;
        KT_CHECK(kiln_cpu_ctx_new(m, 0, 512, 2, &ctx, &err) == KILN_OK);
        if (ctx && ids) {
            kiln_generate_opts o = {.max_tokens = ng, .temperature = 0, .top_p = 1, .ignore_eos = true};
            kiln_generate_result r;
            KT_CHECK(kiln_generate(ctx, ids, (int)n, &o, &r, &err) == KILN_OK);
            int diff = -1;
            for (int i = 0; i < ng && i < r.n_ids; i++)
                if (r.ids[i] != want[i]) {
                    diff = i;
                    break;
                }
            KT_CHECKF(diff < 0 && r.n_ids == ng, "case %zu (%s): greedy ids differ from HF at step %d", ci, text, diff);
            char *gen = NULL;
            size_t glen = 0;
            KT_CHECK(kiln_tokenizer_decode(m->tokenizer, r.ids, (size_t)r.n_ids, true, &gen, &glen, &err) == KILN_OK);
            const char *want_text = json_string_value(json_object_get(f32, "completion_text"));
            KT_CHECK(gen && want_text && glen == strlen(want_text) && memcmp(gen, want_text, glen) == 0);
            free(gen);
            free(r.ids);
        }
        kiln_cpu_ctx_free(ctx);
        free(ids);
        free(want);
        free(want_prompt);
    }
    kiln_model_close(m);
    json_decref(g);
    unlink(out);
}

/* What a request's prompt_logprobs delivered (collect_prompt_lp). */
typedef struct prompt_lps {
    const int32_t *seq;
    int n, next, generated, stop, bad;
    float lp[128], top_lp[128][2];
    int32_t top[128][2];
} prompt_lps;

static int32_t collect_prompt_lp(void *user, int64_t id, const kiln_token_info *t, int32_t finished, int32_t why) {
    prompt_lps *p = user;
    if (finished) p->stop = why;
    if (!t) return 0;
    if (!t->prompt) {
        p->generated++;
        return 0;
    }
    /* in position order, each once, the prompt's own token, two alternatives */
    if (t->position != p->next || t->token != p->seq[t->position] || t->n_top != 2 || p->n >= 128) {
        p->bad++;
        return 0;
    }
    p->next++;
    p->lp[p->n] = t->logprob;
    for (int a = 0; a < 2; a++) p->top[p->n][a] = t->top_token[a], p->top_lp[p->n][a] = t->top_logprob[a];
    p->n++;
    return 0;
}

/* kiln_score (the C API's teacher forcing, `kiln perplexity`'s path) against HF's log-softmax of the
 * golden logits: every case of tiny-mistral (sliding window 8 over 73..92 positions) scored at once,
 * each position's log-probability of the next id within 2e-4 of the logit range; then each case
 * as a prompt with prompt_logprobs (kiln_request_options), against kiln_score's and HF's. */
static void test_score_against_hf(void) {
    char out[512];
    snprintf(out, sizeof out, "%s/score.kiln", tmpdir);
    KT_REQUIRE(compile_to(src_path("tests/data/tiny-mistral"), NULL, out, KILN_DTYPE_COUNT_) == KILN_OK);
    json_error_t je;
    json_t *g = json_load_file(src_path("tests/golden/tiny-mistral/golden.json"), 0, &je);
    KT_REQUIRE(g);
    json_t *cases = json_object_get(g, "cases");
    const int nc = (int)json_array_size(cases);
    golden_case gcs[8];
    int32_t *seqs[8], lens[8];
    float *lps[8];
    KT_REQUIRE(nc >= 2 && nc <= 8);
    for (int i = 0; i < nc; i++) {
        golden_case_read(json_array_get(cases, (size_t)i), src_path("tests/golden/tiny-mistral"), &gcs[i]);
        lens[i] = gcs[i].np + gcs[i].ng;
        seqs[i] = malloc((size_t)lens[i] * sizeof *seqs[i]);
        lps[i] = malloc((size_t)lens[i] * sizeof *lps[i]);
        memcpy(seqs[i], gcs[i].prompt, (size_t)gcs[i].np * sizeof(int32_t));
        memcpy(seqs[i] + gcs[i].np, gcs[i].greedy, (size_t)gcs[i].ng * sizeof(int32_t));
    }
    kiln_t *k = NULL;
    KT_REQUIRE(kiln_open(out, 2, &k) == KILN_OK);
    kiln_ctx_options o;
    kiln_ctx_options_init(&o);
    o.device = "cpu";
    o.max_batch = 2; /* fewer slots than sequences: they run two at a time */
    kiln_ctx_t *c = NULL;
    KT_REQUIRE(kiln_ctx_new(k, &o, &c) == KILN_OK);
    KT_EQ_INT(kiln_score(c, (const int32_t *const *)seqs, lens, nc, lps), KILN_OK);
    for (int i = 0; i < nc; i++) {
        double worst = 0;
        for (int t = 0; t + 1 < lens[i]; t++) {
            const float *row = gcs[i].logits + (size_t)t * (size_t)gcs[i].vocab;
            double mx = row[0], sum = 0;
            for (int v = 1; v < gcs[i].vocab; v++) mx = row[v] > mx ? row[v] : mx;
            for (int v = 0; v < gcs[i].vocab; v++) sum += exp((double)row[v] - mx);
            double want = (double)row[seqs[i][t + 1]] - mx - log(sum), e = fabs(want - (double)lps[i][t]);
            if (!(e <= worst)) worst = e;
        }
        KT_CHECKF(worst <= 2e-4 * gcs[i].range, "case %d: log-probability off HF's by %.3g (logit range %.3g)", i,
                  worst, gcs[i].range);
        fprintf(stderr, "  case %d: %d positions scored, max |log p - HF's| %.3g\n", i, lens[i] - 1, worst);
    }
    /* the same sequences as prompts with prompt_logprobs 2 and max_tokens 0, through kiln_submit: each
     * position once, in order, equal to kiln_score's, the alternatives HF's two most likely */
    for (int i = 0; i < nc; i++) {
        prompt_lps got = {.seq = seqs[i], .n = 0, .next = 1};
        kiln_request_options ro;
        kiln_request_options_init(&ro);
        ro.max_tokens = 0;
        ro.prompt_logprobs = 2;
        ro.on_token_info = collect_prompt_lp;
        ro.user = &got;
        int64_t id = 0;
        KT_REQUIRE(kiln_submit(c, seqs[i], lens[i], &ro, &id) == KILN_OK);
        KT_REQUIRE(kiln_run(c) == KILN_OK);
        KT_EQ_INT(got.stop, KILN_STOP_MAX_TOKENS);
        KT_EQ_INT(got.generated, 0);
        KT_EQ_INT(got.n, lens[i] - 1);
        double worst = 0, worst_top = 0;
        for (int t = 0; t < got.n && t + 1 < lens[i]; t++) {
            worst = fmax(worst, fabs((double)got.lp[t] - (double)lps[i][t]));
            const float *row = gcs[i].logits + (size_t)t * (size_t)gcs[i].vocab;
            double mx = row[0], sum = 0;
            for (int v = 1; v < gcs[i].vocab; v++) mx = row[v] > mx ? row[v] : mx;
            for (int v = 0; v < gcs[i].vocab; v++) sum += exp((double)row[v] - mx);
            for (int a = 0; a < 2; a++) /* HF's log-probability of the alternative kiln names */
                worst_top = fmax(worst_top, fabs((double)row[got.top[t][a]] - mx - log(sum) - (double)got.top_lp[t][a]));
            KT_CHECKF(row[got.top[t][0]] >= row[got.top[t][1]] && got.top_lp[t][0] >= got.top_lp[t][1],
                      "case %d position %d: alternatives out of order", i, t + 1);
            double second = -INFINITY; /* HF's second largest logit */
            for (int v = 0; v < gcs[i].vocab; v++)
                if (v != got.top[t][0] && row[v] > second) second = row[v];
            KT_CHECKF(row[got.top[t][0]] == mx && (mx - row[got.top[t][1]]) <= (mx - second) + 2e-4 * gcs[i].range,
                      "case %d position %d: kiln's alternatives %d, %d are not HF's two most likely", i, t + 1,
                      got.top[t][0], got.top[t][1]);
        }
        KT_CHECKF(worst <= 1e-5, "case %d: prompt log-probabilities off kiln_score's by %.3g", i, worst);
        KT_CHECKF(worst_top <= 2e-4 * gcs[i].range, "case %d: alternatives' log-probabilities off HF's by %.3g", i,
                  worst_top);
        KT_CHECK(got.bad == 0);
    }
    kiln_ctx_free(c);
    kiln_close(k);
    for (int i = 0; i < nc; i++) free(seqs[i]), free(lps[i]), golden_case_free(&gcs[i]);
    json_decref(g);
    unlink(out);
}

int main(void) {
    if (!kt_tmpdir(tmpdir, sizeof tmpdir, "golden")) return 1;
    KT_RUN(test_stories260k);
    KT_RUN(test_tiny_mistral_sliding_window);
    KT_RUN(test_tiny_llama3_rope_scaling_tied);
    KT_RUN(test_tiny_qwen3_qk_norm);
    KT_RUN(test_tiny_qwen2_bias_layer_window);
    KT_RUN(test_tiny_mixtral_moe);
    KT_RUN(test_tiny_mixtral_as_f32);
    KT_RUN(test_tiny_mixtral_routing);
    KT_RUN(test_tiny_qwen3_moe);
    KT_RUN(test_tiny_qwen3_moe_routing);
    KT_RUN(test_tiny_qwen3_moe_nonorm);
    KT_RUN(test_tiny_qwen3_moe_nonorm_routing);
    KT_RUN(test_topk_ties);
    KT_RUN(test_tiny_mistral_as_f32);
    KT_RUN(test_tiny_mistral_int8);
    KT_RUN(test_tiny_mistral_int4);
    KT_RUN(test_tiny_mistral_fp8);
    KT_RUN(test_w8a8_cpu);
    KT_RUN(test_awq_checkpoint);
    KT_RUN(test_gptq_checkpoint_sym);
    KT_RUN(test_gptq_checkpoint_asym_desc_act);
    KT_RUN(test_gptq_checkpoint_act_order);
    KT_RUN(test_ct_checkpoint_act_order);
    KT_RUN(test_gptq_v2_checkpoint);
    KT_RUN(test_gptq_dynamic_checkpoint);
    KT_RUN(test_ct_checkpoint_sym);
    KT_RUN(test_ct_checkpoint_asym);
    KT_RUN(test_fp8_checkpoint_tensor_static);
    KT_RUN(test_fp8_ct_checkpoint_channel);
    KT_RUN(test_fp8_ct_checkpoint_tensor_static);
    KT_RUN(test_fp8_checkpoint_block);
    KT_RUN(test_fp8_checkpoint_block_rows_cols);
    KT_RUN(test_fp8_ct_checkpoint_block);
    KT_RUN(test_sharded_equals_single);
    KT_RUN(test_pycode_text);
    KT_RUN(test_score_against_hf);
    rmdir(tmpdir);
    return KT_END();
}
