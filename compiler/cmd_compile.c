/*
 * cmd_compile.c — `kiln compile CKPT_DIR -o model.kiln`.
 */
#include <errno.h>
#include <getopt.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../codegen/kiln_kernels.h"
#include "../codegen/kiln_nvrtc.h"
#include "../common/kiln_progress.h"
#include "../codegen/kiln_package.h"
#include "../passes/kiln_passes.h"
#include "cli.h"
#include "kiln_compiler.h"

static void help(FILE *f) {
    fprintf(f,
            "usage: kiln compile CKPT_DIR -o OUTPUT.kiln [options]\n\n"
            "Compile a HuggingFace checkpoint directory (config.json, *.safetensors or a sharded\n"
            "model.safetensors.index.json, optional tokenizer.json) into one engine file.\n\n"
            "options:\n"
            "  -o, --output FILE     engine file to write (required); written atomically\n"
            "  --dtype DTYPE         weight dtype in the engine: f32, f16, bf16, or 'checkpoint' (default)\n"
            "  --quant Q             quantize the projections' weight matrices: int8 (per-row scales),\n"
            "                        fp8 (FP8 E4M3 codes, per-row scales), int4 (4 bits in groups of\n"
            "                        --group-size columns with a scale and a minimum each), or auto\n"
            "                        (each matrix its own, below); the LM head\n"
            "                        gets --quant-head, the embedding and norms keep --dtype\n"
            "                        (docs/quantization.md). Quantized engines run on both executors\n"
            "                        (on the GPU in bf16 and f16 engines)\n"
            "  --group-size G        int4 groups: 32, 64 or 128 columns (default 128); with --quant fp8,\n"
            "                        128 gives the projections a scale per row and 128 columns (fp8g128)\n"
            "  --quant-head H        the LM head's format: int8 (default with --quant), fp8, int4, or keep\n"
            "  --quant-embedding E   the embedding table's format (and a tied LM head's): keep (default),\n"
            "                        int8, fp8 or int4\n"
            "  --quant-method M      how an int4 group's range is chosen: mse (default: its ends moved in\n"
            "                        by up to 20%%, the least squared error) or rtn (its min and max)\n"
            "                        A published 4-bit AWQ (gemm) or GPTQ checkpoint (config.json with\n"
            "                        quantization_config) is read as it is, its projections repacked into\n"
            "                        kiln's int4 without rounding again: no --quant then; --quant-head and\n"
            "                        --quant-embedding apply to its LM head and embedding (default keep)\n"
            "  --quant auto          each projection matrix gets keep, int8, fp8 or int4 in groups of 32,\n"
            "                        64 or 128, chosen by measured damage within one budget: every matrix\n"
            "                        in every format alone is run on the calibration tokens on the CPU\n"
            "                        (mean KL divergence of the next-token distributions from the\n"
            "                        unquantized model's), then the least summed damage that fits is\n"
            "                        taken and the mix measured; the LM head and embedding follow\n"
            "                        --quant-head / --quant-embedding and count against the budget\n"
            "  --max-weight-bytes N  the budget: the engine's weight bytes (as `kiln inspect` counts\n"
            "                        them) at most N; suffixes K, M, G are decimal (18M = 18,000,000)\n"
            "  --target-bits B       the budget: at most B bits per weight on average over all weights\n"
            "  --max-ppl-increase P  the budget: the smallest mix (bisecting the byte budget) whose\n"
            "                        measured calibration perplexity is at most P%% over the unquantized\n"
            "                        engine's (1 = 1%%)\n"
            "  --awq                 with --quant: activation-aware scales, searched on the calibration\n"
            "                        tokens (CPU) for each group of projections sharing an input, folded\n"
            "                        into the weights (columns × s, the norm, up or v projection before\n"
            "                        them ÷ s) before rounding; with auto, searched for int4 g128 and\n"
            "                        auto then measures the scaled model; the engine's format is\n"
            "                        unchanged (docs/quantization.md)\n"
            "  --kv-dtype T          the KV cache's elements: bf16 (default: the engine's element type),\n"
            "                        fp8 (E4M3) or int8, with a scale per kv head of each layer for K\n"
            "                        and for V, from the largest value the calibration tokens put there\n"
            "                        (CPU); half the KV memory a token takes (docs/quantization.md)\n"
            "  --calib FILE          calibration text (UTF-8, the checkpoint's tokenizer, after BOS);\n"
            "                        default: kiln's built-in text (English prose, C and Python)\n"
            "  --calib-ids FILE      calibration token ids instead (a JSON array, or ids separated by\n"
            "                        whitespace or commas, as `kiln perplexity --ids-file`)\n"
            "  --calib-tokens N      calibration tokens used, 32..65536 (default 512 with --quant auto\n"
            "                        and --kv-dtype, 2048 with --awq)\n"
            "  --passes LIST         comma-separated passes to run, in that order, instead of the default\n"
            "                        pipeline (marked *); 'none' runs none (memory planning always runs).\n"
            "                        Every fusion the GPU runs is one of these, shown by --dump-ir:\n");
    int n;
    const kiln_pass *p = kiln_passes_default(&n);
    for (int i = 0; i < n; i++)
        fprintf(f, "                        %s %-22s %s\n", p[i].in_default ? "*" : " ", p[i].name, p[i].contract);
    const kiln_pass *tp = kiln_pass_tensor_parallel_entry();
    fprintf(f, "                        and, first, with --tp N > 1:\n"
               "                          %-22s %s\n", tp->name, tp->contract);
    fprintf(f, "  --tp N                tensor parallelism over N ranks (GPUs), 1..%d (default 1): the engine\n"
               "                        holds every rank's weight shards; heads, KV heads, intermediate_size\n"
               "                        and vocab_size must divide by N. The CPU executor runs such an engine\n"
               "                        rank by rank (docs/parallelism.md)\n", KILN_MAX_RANKS);
    fprintf(f, "  --target LIST         GPU targets of the kernels section: sm_NN (cubin) and compute_NN\n"
               "                        (PTX, JIT-compiled by newer GPUs), comma-separated; 'default' =\n"
               "                        sm_80,sm_86,sm_89,sm_90,compute_90 (when this kiln has NVRTC, else\n"
               "                        'none'); 'none' = no kernels (the engine runs on the CPU only)\n"
               "  --kv-block-size N     tokens per KV-cache block the kernels are built for: a power of\n"
               "                        two from 1 to 256 (default 16; only with GPU targets)\n"
               "  --threads N           parallel NVRTC jobs (default: one per core; only with GPU targets)\n"
               "  --tune                then time cuBLASLt's algorithms on this host's GPU 0 and record\n"
               "                        them in the engine, as `kiln tune ENGINE` does (needs a GPU)\n"
               "  --allow-unused PAT    let checkpoint tensors matching the glob PAT stay unused (repeatable;\n"
               "                        by default every tensor must be used, except *rotary_emb.inv_freq)\n"
               "  --compress            zstd-compress the weights section\n"
               "  --force               allow an output inside the checkpoint directory (never over\n"
               "                        one of the files the compile reads)\n"
               "  --dump-ir             print the graph after each pass to stdout (stderr with --json)\n"
               "  --standalone          write an executable with the engine built in instead of an engine\n"
               "                        file (as `kiln package`; needs LLVM and a C toolchain)\n"
               "  --no-chat-template    leave the checkpoint's chat template out (kiln refuses a template\n"
               "                        its Jinja subset cannot render; docs/chat.md)\n"
               "  --json                print a JSON summary on stdout\n"
               "  -h, --help            this help\n");
}

/* Option values checked before any work: a malformed or unsupported value,
 * or an option that does not apply to this compile, is a usage error (exit 2). */
/* The quant_method of CKPT_DIR/config.json's quantization_config (into buf), or NULL when it has none
 * or cannot be read (kiln_compile then says why). */
static const char *checkpoint_quantized(const char *dir, char *buf, size_t n) {
    char *path = kiln_path_join(dir, "config.json"), *text = NULL;
    size_t len = 0;
    kiln_error err = {0};
    /* read as kiln_config_load reads it: a regular file of bounded size (never a FIFO's open) */
    json_t *root = path && kiln_file_read(path, 16u << 20, &text, &len, &err) == KILN_OK ? json_loadb(text, len, 0, NULL)
                                                                                        : NULL;
    free(text);
    json_t *qc = json_object_get(root, "quantization_config");
    const bool quantized = json_is_object(qc);
    const char *method = quantized ? json_string_value(json_object_get(qc, "quant_method")) : NULL;
    if (quantized) snprintf(buf, n, "%s", method ? method : "?");
    json_decref(root);
    free(path);
    return quantized ? buf : NULL;
}

static int check_options(kiln_compile_options *opt, bool json, bool block_given, bool threads_given, bool tune) {
    kiln_error err = {0};
    if (!opt->targets) {
        /* the default targets need NVRTC; a build without CUDA makes CPU-only engines */
        int ver = 0;
        kiln_error e2 = {0};
        kiln_status nst = kiln_nvrtc_version(&ver, &e2);
        /* built with CUDA but libnvrtc not loadable: say so rather than quietly drop the GPU kernels */
        if (nst != KILN_OK && nst != KILN_ERR_UNSUPPORTED) return kiln_cli_fail("compile", &e2, json);
        bool have_nvrtc = nst == KILN_OK;
        opt->targets = have_nvrtc ? "default" : "none";
        opt->gpu_if_possible = true;
        if (!have_nvrtc && !json)
            fprintf(stderr, "kiln compile: note: this kiln has no NVRTC (built without CUDA); the engine gets no GPU "
                            "kernels and runs on the CPU only\n");
    }
    kiln_kernel_targets t;
    if (kiln_kernel_targets_parse(opt->targets, &t, &err) != KILN_OK ||
        kiln_kernel_targets_check(&t, &err) != KILN_OK)
        return kiln_cli_usage_error("compile", "%s", err.msg);
    bool kernels = t.n_cubin + t.n_ptx > 0;
    if (block_given && !kernels)
        return kiln_cli_usage_error("compile", "--kv-block-size applies to the GPU kernels, and --target %s makes "
                                               "none", opt->targets);
    if (threads_given && !kernels)
        return kiln_cli_usage_error("compile", "--threads sets the parallel NVRTC jobs, and --target %s builds no "
                                               "kernels", opt->targets);
    if (tune && !kernels)
        return kiln_cli_usage_error("compile", "--tune measures the engine's GPU kernels, and --target %s makes "
                                               "none", opt->targets);
    if (block_given && kiln_kernels_check_block_size(opt->kv_block_size, &err) != KILN_OK)
        return kiln_cli_usage_error("compile", "%s", err.msg);
    if (kiln_passes_check(opt->passes, &err) != KILN_OK) return kiln_cli_usage_error("compile", "%s", err.msg);
    return KILN_EXIT_OK;
}

/* "18M" → 18,000,000 (K, M, G decimal); 0 on success. */
static int parse_bytes(const char *s, uint64_t *out) {
    char *end = NULL;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (!*s || *s == '-' || end == s || errno) return -1;
    uint64_t mul = 1;
    if (*end == 'K') mul = 1000, end++;
    else if (*end == 'M') mul = 1000000, end++;
    else if (*end == 'G') mul = 1000000000, end++;
    if (*end || v == 0 || v > UINT64_MAX / mul) return -1;
    *out = (uint64_t)v * mul;
    return 0;
}

/* --quant auto's outcome on stderr: the mix, the bytes against the budget, predicted and measured damage. */
static void report_auto(const char *quant_json) {
    json_t *q = quant_json ? json_loads(quant_json, 0, NULL) : NULL;
    json_t *a = json_object_get(q, "auto");
    if (!a) {
        json_decref(q);
        return;
    }
    char mix[256] = "";
    const char *key;
    json_t *v;
    json_object_foreach(json_object_get(a, "mix"), key, v) {
        size_t n = strlen(mix);
        snprintf(mix + n, sizeof mix - n, "%s%lld %s", n ? ", " : "", (long long)json_integer_value(v), key);
    }
    fprintf(stderr, "kiln compile: --quant auto: %s; weights %.3f MB of a %.3f MB budget (%.3f bits per weight); "
                    "calibration KL %.6f predicted, %.6f measured, NLL %+.6f nats per token (%lld tokens)\n",
            mix, (double)json_integer_value(json_object_get(a, "weight_bytes")) / 1e6,
            (double)json_integer_value(json_object_get(json_object_get(a, "budget"), "max_weight_bytes")) / 1e6,
            json_real_value(json_object_get(a, "bits_per_weight")), json_real_value(json_object_get(a, "predicted_kl")),
            json_real_value(json_object_get(a, "measured_kl")),
            json_real_value(json_object_get(a, "measured_nll_change")),
            (long long)json_integer_value(json_object_get(json_object_get(a, "calibration"), "tokens")));
    json_decref(q);
}

/* tuning: `--tune`'s report (taken), added to the JSON object as "tuning" */
static void report(const char *dir, const kiln_compile_options *opt, const char *quant_json, double dt, bool json,
                   json_t *tuning) {
    struct stat st;
    long long size = stat(opt->output_path, &st) == 0 ? (long long)st.st_size : -1;
    if (json) {
        json_t *j = json_pack("{s:s, s:s, s:I, s:f}", "checkpoint", dir, "output", opt->output_path, "bytes",
                              (json_int_t)size, "seconds", dt);
        json_t *q = quant_json ? json_loads(quant_json, 0, NULL) : NULL;
        if (j && q) json_object_set_new(j, "quant", q); /* meta build.quant: --quant auto's choice and damage */
        if (j && tuning) json_object_set_new(j, "tuning", tuning), tuning = NULL;
        char *s = json_dumps(j, JSON_COMPACT);
        printf("%s\n", s);
        free(s);
        json_decref(j);
        json_decref(tuning);
    } else {
        report_auto(quant_json);
        fprintf(stderr, "kiln compile: wrote %s (%.1f MB) in %.2f s\n", opt->output_path, (double)size / 1e6, dt);
    }
}

/* --standalone: compile into a temporary engine beside the output, package
 * it into the executable -o names, remove the engine. */
static int compile_standalone(const char *dir, kiln_compile_options *opt, bool json) {
    kiln_error err = {0};
    if (!kiln_package_available()) {
        kiln_package_result r;
        kiln_package_options po = {.engine_path = "", .output_path = ""};
        kiln_package(&po, &r, &err); /* the message that says why */
        return kiln_cli_fail("compile", &err, json);
    }
    const char *exe = opt->output_path;
    size_t n = strlen(exe) + 32;
    char *engine = malloc(n);
    if (!engine) return kiln_cli_fail("compile", &(kiln_error){KILN_ERR_NOMEM, "out of memory"}, json);
    snprintf(engine, n, "%s.engine.XXXXXX", exe);
    int fd = mkstemp(engine); /* reserves the name; kiln_compile renames over it */
    if (fd < 0) {
        kiln_err(&err, KILN_ERR_IO, "%s: cannot create a temporary engine beside it", exe);
        free(engine);
        return kiln_cli_fail("compile", &err, json);
    }
    close(fd);
    int slot = kiln_guard_temp_add(engine); /* a signal unlinks it too (common/guard.c) */
    opt->output_path = engine;
    kiln_status st = kiln_compile(dir, opt, &err);
    kiln_progress_clear(opt->progress);
    int rc = st == KILN_OK ? KILN_EXIT_OK : kiln_cli_fail("compile", &err, json);
    if (rc == KILN_EXIT_OK) {
        kiln_package_options po = {.engine_path = engine, .output_path = exe, .payload = KILN_PACKAGE_AUTO};
        rc = kiln_cli_package_run(&po, json, "compile");
    }
    unlink(engine);
    kiln_guard_temp_remove(slot);
    free(engine);
    return rc;
}

int kiln_cmd_compile(int argc, char **argv) {
    enum { O_FORCE = 256, O_GROUP, O_QHEAD, O_QMETHOD, O_QEMB, O_MAXW, O_TBITS, O_MAXPPL, O_CALIB, O_CALIB_IDS,
           O_CALIB_TOKENS, O_AWQ, O_TUNE, O_KV };
    static const struct option longopts[] = {
        {"output", required_argument, 0, 'o'}, {"dtype", required_argument, 0, 'd'},
        {"passes", required_argument, 0, 'p'}, {"compress", no_argument, 0, 'z'},
        {"dump-ir", no_argument, 0, 'D'},      {"json", no_argument, 0, 'j'},
        {"help", no_argument, 0, 'h'},         {"quant", required_argument, 0, 'q'},
        {"target", required_argument, 0, 't'}, {"kv-block-size", required_argument, 0, 'b'},
        {"threads", required_argument, 0, 'T'}, {"force", no_argument, 0, O_FORCE},
        {"allow-unused", required_argument, 0, 'U'}, {"standalone", no_argument, 0, 'S'},
        {"no-chat-template", no_argument, 0, 'C'}, {"tp", required_argument, 0, 'P'},
        {"group-size", required_argument, 0, O_GROUP}, {"quant-head", required_argument, 0, O_QHEAD},
        {"quant-method", required_argument, 0, O_QMETHOD}, {"quant-embedding", required_argument, 0, O_QEMB},
        {"max-weight-bytes", required_argument, 0, O_MAXW}, {"target-bits", required_argument, 0, O_TBITS},
        {"max-ppl-increase", required_argument, 0, O_MAXPPL}, {"calib", required_argument, 0, O_CALIB},
        {"calib-ids", required_argument, 0, O_CALIB_IDS}, {"calib-tokens", required_argument, 0, O_CALIB_TOKENS},
        {"awq", no_argument, 0, O_AWQ},        {"tune", no_argument, 0, O_TUNE},
        {"kv-dtype", required_argument, 0, O_KV},
        {0, 0, 0, 0}};
    const char *quant = NULL, *quant_head = NULL, *quant_method = NULL, *quant_emb = NULL;
    long group = 128;
    bool group_set = false; /* --group-size given */
    bool calib_tokens_given = false;
    kiln_compile_options opt = {.weight_dtype = KILN_DTYPE_COUNT_, .dump_stream = stdout};
    const char *allow_unused[64]; /* --allow-unused patterns (pointing into argv) */
    opt.allow_unused = allow_unused;
    bool json = false, standalone = false, block_given = false, threads_given = false, tune = false;
    int c;
    optind = 1;
    opterr = 0;
    while ((c = getopt_long(argc, argv, "o:h", longopts, NULL)) != -1) {
        switch (c) {
        case 'o': opt.output_path = optarg; break;
        case 'q':
            if (strcmp(optarg, "int8") == 0 || strcmp(optarg, "fp8") == 0 || strcmp(optarg, "int4") == 0 ||
                strcmp(optarg, "auto") == 0) {
                quant = optarg;
                break;
            }
            /* --quant f32|f16|bf16|checkpoint: the weight dtype, as --dtype (kiln 0.1's spelling) */
            if (strcmp(optarg, "f32") && strcmp(optarg, "f16") && strcmp(optarg, "bf16") && strcmp(optarg, "checkpoint"))
                return kiln_cli_usage_error("compile", "--quant '%s': expected int8, fp8, int4 or auto", optarg);
            /* fall through */
        case 'd':
            if (strcmp(optarg, "checkpoint") == 0 || strcmp(optarg, "auto") == 0) {
                opt.weight_dtype = KILN_DTYPE_COUNT_;
            } else {
                int dt = kiln_dtype_from_name(optarg);
                if (dt < 0 || dt > KILN_DTYPE_BF16) /* i32, the quantized and checkpoint-only dtypes */
                    return kiln_cli_usage_error("compile", "unknown weight dtype '%s' (f32, f16, bf16, checkpoint)",
                                                optarg);
                opt.weight_dtype = (kiln_dtype)dt;
            }
            break;
        case 'p': opt.passes = optarg; break;
        case 'C': opt.no_chat_template = true; break;
        case 't': opt.targets = optarg; break;
        case 'b':
        case 'T': {
            char *end = NULL;
            long v = strtol(optarg, &end, 10);
            if (!*optarg || *end || v < 1 || v > 4096)
                return kiln_cli_usage_error("compile", "--%s '%s': expected a whole number from 1 to 4096",
                                            c == 'b' ? "kv-block-size" : "threads", optarg);
            if (c == 'b') opt.kv_block_size = (int)v, block_given = true;
            else opt.threads = (int)v, threads_given = true;
            break;
        }
        case 'P': {
            char *end = NULL;
            long v = strtol(optarg, &end, 10);
            if (!*optarg || *end || v < 1 || v > KILN_MAX_RANKS)
                return kiln_cli_usage_error("compile", "--tp '%s': expected a whole number of ranks from 1 to %d",
                                            optarg, KILN_MAX_RANKS);
            opt.tp = (int)v;
            break;
        }
        case 'U':
            if (!*optarg) return kiln_cli_usage_error("compile", "--allow-unused needs a tensor name or glob pattern");
            if (opt.n_allow_unused == (int)(sizeof allow_unused / sizeof *allow_unused))
                return kiln_cli_usage_error("compile", "more than %zu --allow-unused patterns",
                                            sizeof allow_unused / sizeof *allow_unused);
            allow_unused[opt.n_allow_unused++] = optarg;
            break;
        case O_GROUP: {
            char *end = NULL;
            group = strtol(optarg, &end, 10);
            if (!*optarg || *end || (group != 32 && group != 64 && group != 128))
                return kiln_cli_usage_error("compile", "--group-size '%s': expected 32, 64 or 128", optarg);
            group_set = true;
            break;
        }
        case O_QMETHOD:
            if (strcmp(optarg, "rtn") && strcmp(optarg, "mse"))
                return kiln_cli_usage_error("compile", "--quant-method '%s': expected rtn or mse", optarg);
            quant_method = optarg;
            break;
        case O_QHEAD:
        case O_QEMB:
            if (strcmp(optarg, "int8") && strcmp(optarg, "fp8") && strcmp(optarg, "int4") && strcmp(optarg, "keep"))
                return kiln_cli_usage_error("compile", "--quant-%s '%s': expected int8, fp8, int4 or keep",
                                            c == O_QHEAD ? "head" : "embedding", optarg);
            if (c == O_QHEAD) quant_head = optarg;
            else quant_emb = optarg;
            break;
        case O_MAXW:
            if (parse_bytes(optarg, &opt.max_weight_bytes) != 0)
                return kiln_cli_usage_error("compile", "--max-weight-bytes '%s': expected a whole number of bytes "
                                                       "above 0, with an optional K, M or G (decimal: 18M = "
                                                       "18,000,000)", optarg);
            break;
        case O_TBITS: {
            char *end = NULL;
            opt.target_bits = strtod(optarg, &end);
            if (!*optarg || *end || !(opt.target_bits > 0 && opt.target_bits <= 64))
                return kiln_cli_usage_error("compile", "--target-bits '%s': expected a number of bits above 0, at "
                                                       "most 64", optarg);
            break;
        }
        case O_MAXPPL: {
            char *end = NULL;
            opt.max_ppl_increase = strtod(optarg, &end);
            if (!*optarg || *end || !(opt.max_ppl_increase > 0 && opt.max_ppl_increase <= 1000))
                return kiln_cli_usage_error("compile", "--max-ppl-increase '%s': expected a percentage above 0, at "
                                                       "most 1000 (1 = 1%%)", optarg);
            break;
        }
        case O_AWQ: opt.awq = true; break;
        case O_TUNE: tune = true; break;
        case O_KV:
            if (strcmp(optarg, "bf16") && strcmp(optarg, "fp8") && strcmp(optarg, "int8"))
                return kiln_cli_usage_error("compile", "--kv-dtype '%s': expected bf16, fp8 or int8", optarg);
            opt.kv_dtype = !strcmp(optarg, "fp8") ? KILN_FLAG_KV_FP8 : !strcmp(optarg, "int8") ? KILN_FLAG_KV_INT8 : 0;
            opt.kv_bf16 = !opt.kv_dtype;
            break;
        case O_CALIB: opt.calib_path = optarg; break;
        case O_CALIB_IDS: opt.calib_ids_path = optarg; break;
        case O_CALIB_TOKENS: {
            char *end = NULL;
            long v = strtol(optarg, &end, 10);
            if (!*optarg || *end || v < 32 || v > 65536)
                return kiln_cli_usage_error("compile", "--calib-tokens '%s': expected a whole number from 32 to "
                                                       "65536", optarg);
            opt.calib_tokens = (int)v;
            calib_tokens_given = true;
            break;
        }
        case 'z': opt.compress = true; break;
        case 'S': standalone = true; break;
        case 'D': opt.dump_ir = true; break;
        case 'j': json = true; break;
        case O_FORCE: opt.force = true; break;
        case 'h': help(stdout); return KILN_EXIT_OK;
        default: return kiln_cli_usage_error("compile", "unknown or incomplete option '%s'", argv[optind - 1]);
        }
    }
    const int q4 = group == 32 ? KILN_DTYPE_Q4G32 : group == 64 ? KILN_DTYPE_Q4G64 : KILN_DTYPE_Q4G128;
    const bool q_auto = quant && strcmp(quant, "auto") == 0;
    /* int8, fp8 and int4's dtypes (int4: in groups of --group-size) */
#define QFMT(name) (!strcmp(name, "int8") ? KILN_DTYPE_Q8 : !strcmp(name, "fp8") ? KILN_DTYPE_FP8 : q4)
    if (quant) opt.quant = q_auto ? KILN_QUANT_AUTO : QFMT(quant);
    /* --quant fp8 --group-size 128: the projections' scales per row and 128 columns (fp8g128) */
    const bool fp8_groups = quant && !strcmp(quant, "fp8") && group_set;
    if (fp8_groups && group != 128)
        return kiln_cli_usage_error("compile", "--group-size %ld with --quant fp8: fp8 takes groups of 128 columns "
                                               "(or none: a scale per row)", group);
    if (fp8_groups) opt.quant = KILN_DTYPE_FP8G128;
    /* --quant auto: exactly one budget; the budgets and the calibration only with it */
    const int n_budgets = (opt.max_weight_bytes > 0) + (opt.target_bits > 0) + (opt.max_ppl_increase > 0);
    if (q_auto && n_budgets != 1)
        return kiln_cli_usage_error("compile", n_budgets ? "--quant auto: give one budget, --max-weight-bytes, "
                                                           "--target-bits or --max-ppl-increase, not two"
                                                         : "--quant auto needs a budget: --max-weight-bytes N, "
                                                           "--target-bits B or --max-ppl-increase P");
    if (!q_auto && n_budgets)
        return kiln_cli_usage_error("compile", "--%s applies with --quant auto",
                                    opt.max_weight_bytes ? "max-weight-bytes"
                                    : opt.target_bits    ? "target-bits"
                                                         : "max-ppl-increase");
    if (opt.awq && !quant)
        return kiln_cli_usage_error("compile", "--awq needs --quant int8, fp8, int4 or auto (the formats its scales "
                                    "are searched for)");
    if (!q_auto && !opt.awq && !opt.kv_dtype && (opt.calib_path || opt.calib_ids_path || calib_tokens_given))
        return kiln_cli_usage_error("compile", "--%s applies with --quant auto, --awq or --kv-dtype fp8|int8 (the "
                                    "calibration they measure on)",
                                    opt.calib_path ? "calib" : opt.calib_ids_path ? "calib-ids" : "calib-tokens");
    if (opt.calib_path && opt.calib_ids_path)
        return kiln_cli_usage_error("compile", "--calib and --calib-ids: give one calibration");
    /* auto: pycode-22m takes about 2 s a candidate on 2 cores at 512; --awq runs the calibration once, and
     * 512 tokens were too few there (docs/quantization.md) */
    if (!opt.calib_tokens) opt.calib_tokens = q_auto || !opt.awq ? 512 : 2048; /* with both, auto's (the same tokens) */
    /* a published quantized checkpoint (config.json quantization_config) is read as it is: no --quant, and
     * --quant-head / --quant-embedding apply to its dense LM head and embedding without one */
    char ckq_buf[64];
    const char *ckq = optind == argc - 1 ? checkpoint_quantized(argv[optind], ckq_buf, sizeof ckq_buf) : NULL;
    if (quant && ckq)
        return kiln_cli_usage_error("compile", "--quant %s: %s is already quantized (its config.json has "
                                    "quantization_config, quant_method \"%s\"); compile it without --quant",
                                    quant, argv[optind], ckq);
    if (quant_head && !quant && !ckq)
        return kiln_cli_usage_error("compile", "--quant-head applies with --quant or a quantized checkpoint");
    if (quant_emb && !quant && !ckq)
        return kiln_cli_usage_error("compile", "--quant-embedding applies with --quant or a quantized checkpoint");
    if (quant_method && !quant && !quant_head && !quant_emb)
        return kiln_cli_usage_error("compile", "--quant-method applies with --quant, --quant-head or "
                                               "--quant-embedding");
    opt.quant_method = !quant_method || !strcmp(quant_method, "mse") ? KILN_QUANT_MSE : KILN_QUANT_RTN;
    if (group_set && !fp8_groups && !(quant && !q_auto && kiln_quant_bits(opt.quant) == 4) &&
        !(quant_head && !strcmp(quant_head, "int4")) && !(quant_emb && !strcmp(quant_emb, "int4")))
        return kiln_cli_usage_error("compile", "--group-size applies to int4 (--quant int4, --quant-head int4 or "
                                               "--quant-embedding int4) and to --quant fp8 (128: fp8g128); "
                                               "--quant auto tries groups of 32, 64 and 128 itself");
    if (quant_emb && strcmp(quant_emb, "keep")) opt.quant_embedding = QFMT(quant_emb);
    if (quant) opt.quant_head = !quant_head ? KILN_DTYPE_Q8 : strcmp(quant_head, "keep") ? QFMT(quant_head) : 0;
    else if (quant_head && strcmp(quant_head, "keep")) /* a quantized checkpoint's LM head: keep by default */
        opt.quant_head = QFMT(quant_head);
#undef QFMT
    if ((opt.quant == KILN_QUANT_AUTO || opt.awq) && opt.tp > 1)
        return kiln_cli_usage_error("compile", "%s with --tp %d: not supported yet (give one format: --quant "
                                               "int8|fp8|int4)", opt.awq ? "--awq" : "--quant auto", opt.tp);
    if (optind != argc - 1)
        return kiln_cli_usage_error("compile", optind >= argc ? "missing the checkpoint directory"
                                                              : "expected one checkpoint directory");
    if (!opt.output_path) return kiln_cli_usage_error("compile", "missing -o OUTPUT.kiln");
    if (!*opt.output_path) return kiln_cli_usage_error("compile", "-o: empty output path");
    kiln_error err = {0};
    /* a signal or a shrinking input must not leave a temporary engine behind (common/guard.c);
     * installed before anything (NVRTC included) can start a thread */
    if (kiln_guard_install(&err) != KILN_OK) return kiln_cli_fail("compile", &err, json);
    if (tune && standalone)
        return kiln_cli_usage_error("compile", "--tune records into an engine file, not a --standalone executable "
                                               "(compile, `kiln tune` the engine, then `kiln package` it)");
    int rc = check_options(&opt, json, block_given, threads_given, tune);
    if (rc != KILN_EXIT_OK) return rc;
    /* --tune: a GPU to measure on, before the compile spends its time */
    if (tune && kiln_cli_tune_probe(&err) != KILN_OK) {
        kiln_err_prefix(&err, "--tune: no GPU to tune on: ");
        kiln_err_hint(&err, "compile without --tune, then run `kiln tune ENGINE` on a GPU host");
        return kiln_cli_fail("compile", &err, json);
    }
    /* with --json, stdout holds exactly the one JSON object: the IR dump goes to stderr */
    if (json) opt.dump_stream = stderr;
    const char *dir = argv[optind];
    /* a progress line on stderr when it is a terminal; silent otherwise */
    kiln_progress progress;
    kiln_progress_init(&progress, isatty(STDERR_FILENO) ? stderr : NULL, "kiln compile");
    opt.progress = &progress;
    if (standalone) return compile_standalone(dir, &opt, json);
    double t0 = kiln_now();
    char *quant_json = NULL;
    opt.quant_report = &quant_json;
    kiln_status st = kiln_compile(dir, &opt, &err);
    kiln_progress_clear(&progress);
    if (st != KILN_OK) {
        free(quant_json);
        return kiln_cli_fail("compile", &err, json);
    }
    const double dt = kiln_now() - t0;
    if (!json) report(dir, &opt, quant_json, dt, false, NULL);
    /* --tune: the written engine measured on this GPU and its record appended (a failure leaves the
     * engine as written, untuned, and is the command's failure) */
    json_t *tuning = NULL;
    if (tune && kiln_cli_tune_engine(opt.output_path, json ? &tuning : NULL, &err) != KILN_OK) {
        free(quant_json);
        kiln_err_prefix(&err, "wrote %s, but tuning it failed (the engine runs untuned): ", opt.output_path);
        return kiln_cli_fail("compile", &err, json);
    }
    if (json) report(dir, &opt, quant_json, dt, true, tuning);
    free(quant_json);
    return KILN_EXIT_OK;
}
