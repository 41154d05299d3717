/*
 * cmd_run.c — `kiln run model.kiln --prompt-ids 1,306,461 | --prompt TEXT ...`
 *
 * Five steps, one function each: parse the options (run_parse), read the
 * prompt text (read_prompt), turn it into ids (prompt_ids), generate through
 * the public API (generate: runtime/kiln.h) and print the result (print_json
 * or the streamed text). Text needs the engine's tokenizer; without --json
 * the text (or the ids) is printed as it is produced.
 *
 * Prompts are never silently empty: a prompt file or stdin that cannot be
 * read is an error naming it and the reason, and an empty prompt file, an
 * empty stdin or `--prompt-ids ''` is refused. Only `--prompt ''`, said
 * explicitly, means "start from BOS alone" (an error if the engine has none).
 */
#include <errno.h>
#include <getopt.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "../runtime/kiln.h"
#include "../runtime/kiln_rt.h"
#include "../runtime/kiln_tokenizer.h"
#include "chat_cli.h"
#include "cli.h"

static void help(FILE *f) {
    fprintf(f, "usage: %s ", kiln_cli_prog);
    fprintf(f,
            "run ENGINE.kiln (--prompt TEXT | --prompt-file FILE | --prompt-ids IDS) [options]\n\n"
            "Generate tokens. With no prompt option and text on stdin, the prompt is read from stdin.\n"
            "An empty prompt file or stdin is refused; --prompt '' starts from BOS alone.\n\n"
            "prompt:\n"
            "  --prompt TEXT         prompt text (needs an engine built with a tokenizer)\n"
            "  --prompt-file FILE    read the prompt text from FILE ('-' = stdin)\n"
            "  --prompt-ids IDS      token ids, e.g. 1,306,461 or [1, 306, 461]\n"
            "  --bos                 add the special tokens the tokenizer's config asks for (default)\n"
            "  --no-bos              do not add the beginning-of-sequence token to a text prompt\n"
            "  --no-special          treat special-token strings in the text as plain text\n"
            "  --chat                the prompt is a user message: render it with the engine's chat\n"
            "                        template (as HF apply_chat_template, add_generation_prompt=True)\n"
            "  --system TEXT         with --chat: a system message before it\n"
            "sampling:\n"
            "  --max-tokens N        tokens to generate at most (default 128)\n"
            "  --temperature T       0 = greedy (default: the engine's, from generation_config.json; else 0)\n"
            "  --top-k K             sample from the K most likely tokens (0 = off; default: the engine's)\n"
            "  --top-p P             nucleus sampling threshold in (0, 1] (default: the engine's, else 1 = off)\n"
            "  --min-p P             drop tokens below P x the most likely one's probability (0..1; 0 = off)\n"
            "  --presence-penalty X  subtract X from the logits of tokens already generated (-2..2; 0 = off)\n"
            "  --frequency-penalty X subtract X per time a token was generated (-2..2; 0 = off)\n"
            "  --repetition-penalty X  HF's: shrink the logits of tokens in the prompt or output by X\n"
            "                        ((0, 10]; 1 = off)\n"
            "  --seed S              random seed (default: from the clock; printed with --json)\n"
            "  --ignore-eos          keep generating after an end-of-sequence token\n"
            "execution:\n"
            "  --device DEV          gpu, cpu (the fp32 reference executor) or auto = gpu when this\n"
            "                        build and host have one, else cpu (default: auto)\n"
            "  --threads N           CPU threads (default: one per core)\n"
            "  --max-context N       context length to allocate (default: the model's)\n"
            "  --gpu-memory X        KV-cache memory on the GPU: bytes (suffix K, M, G) or a fraction\n"
            "                        of the free memory after the weights (default 0.9)\n");
    kiln_cli_gpus_help(f, 24);
    fprintf(f,
            "output:\n"
            "  --json                print one JSON object (prompt_ids, ids, text, stop_reason, timings)\n"
            "  --logprobs K          with --json: each generated token's log-probability under the model\n"
            "                        (before temperature and penalties) and its K most likely\n"
            "                        alternatives (0..20), as \"logprobs\": [{id, logprob, top: [...]}]\n"
            "  --prompt-logprobs K   with --json: the same for each prompt token, as \"prompt_logprobs\"\n"
            "                        (null for the first, which has no context); with --max-tokens 0\n"
            "                        the prompt is only scored\n"
            "  -h, --help            this help\n");
}

typedef struct run_out {
    int32_t *ids; /* generated ids */
    int n_ids, cap;
    int32_t stop;  /* kiln_stop_reason of the finished call */
    double t_submit, t_first, t_last;
    kiln_tok_stream stream;  /* streaming text decoder (when has_stream) */
    bool has_stream;         /* else print ids */
    bool json;
    bool first;
    kiln_request_options sampling; /* what the request ran with (for --json) */
    kiln_token_info *info;         /* --logprobs: each generated token's, [cap] */
    kiln_token_info *pinfo;        /* --prompt-logprobs: each prompt token's but the first's, [n_p] */
    int n_p, cap_p;
    double ctx_s, kernels_s;       /* kiln_ctx_new, and the kernel modules' load in it (a PTX JIT included) */
    bool jitted;                   /* the engine had no cubin for this GPU: its PTX was JIT-compiled */
} run_out;

/* A token arrived (t: its log-probabilities with --logprobs, else NULL). */
static int32_t took(run_out *o, int32_t id, const kiln_token_info *t, int32_t finished, int32_t stop_reason) {
    if (finished) o->stop = stop_reason;
    if (id < 0) return 0;
    double now = kiln_now();
    if (o->n_ids == 0) o->t_first = now;
    o->t_last = now;
    if (o->n_ids == o->cap) {
        int cap = o->cap ? 2 * o->cap : 256;
        int32_t *v = realloc(o->ids, (size_t)cap * sizeof *v);
        if (v) o->ids = v;
        kiln_token_info *ti = t ? realloc(o->info, (size_t)cap * sizeof *ti) : NULL;
        if (ti) o->info = ti;
        if (!v || (t && !ti)) return 1; /* out of memory: stop the request */
        o->cap = cap;
    }
    if (t) o->info[o->n_ids] = *t;
    o->ids[o->n_ids++] = id;
    if (o->json) return 0;
    if (o->has_stream) {
        const char *text;
        size_t len;
        kiln_error err;
        if (kiln_tok_stream_push(&o->stream, id, &text, &len, &err) == KILN_OK && len) fwrite(text, 1, len, stdout);
    } else {
        printf(o->first ? "%d" : " %d", id);
    }
    o->first = false;
    fflush(stdout);
    return 0;
}

static int32_t on_token(void *user, int64_t request, int32_t id, int32_t finished, int32_t stop_reason) {
    (void)request;
    return took(user, id, NULL, finished, stop_reason);
}

static int32_t on_token_info(void *user, int64_t request, const kiln_token_info *t, int32_t finished,
                             int32_t stop_reason) {
    (void)request;
    run_out *o = user;
    if (t && t->prompt) { /* --prompt-logprobs: kept for the JSON */
        if (o->n_p == o->cap_p) {
            int cap = o->cap_p ? 2 * o->cap_p : 256;
            kiln_token_info *v = realloc(o->pinfo, (size_t)cap * sizeof *v);
            if (!v) return 1; /* out of memory: stop the request */
            o->pinfo = v;
            o->cap_p = cap;
        }
        o->pinfo[o->n_p++] = *t;
        return 0;
    }
    return took(o, t ? t->token : -1, t, finished, stop_reason);
}

#define PROMPT_MAX_BYTES (256u << 20) /* a prompt file or stdin larger than this is refused */

/* The command line, with its defaults. */
typedef struct run_opts {
    const char *engine;
    const char *prompt, *prompt_file, *ids_arg; /* at most one is set */
    const char *device;
    const char *gpus;   /* --gpus, checked (kiln_cli_gpus_arg); NULL = the default */
    double tp_timeout;  /* --tp-timeout, seconds; 0 = the runtime's */
    const char *system; /* --system, with --chat */
    long long max_tokens, top_k, threads, max_ctx, seed, logprobs, prompt_logprobs; /* -1 = off */
    double temperature, top_p, min_p, presence, frequency, repetition;
    bool json, no_bos, no_special, ignore_eos, chat;
    bool temp_set, top_k_set, top_p_set; /* else the engine's defaults (generation_config.json) */
    int64_t kv_bytes;
    double kv_fraction;
} run_opts;

/* Parse the command line into *o. Returns -1 to go on, else the exit code
 * (0 after --help, 2 after a usage error, already reported). */
static int run_parse(int argc, char **argv, const kiln_engine_src *builtin, run_opts *o) {
    enum { O_PROMPT = 256, O_PFILE, O_IDS, O_MAX, O_TEMP, O_TOPK, O_TOPP, O_SEED, O_DEV, O_THR, O_JSON, O_CTX,
           O_NOBOS, O_NOSPECIAL, O_IGNEOS, O_GPUMEM, O_BOS, O_CHAT, O_SYSTEM, O_MINP, O_PRES, O_FREQ, O_REP,
           O_LOGPROBS, O_GPUS, O_TPTIME, O_PLOGPROBS };
    static const struct option longopts[] = {
        {"prompt", required_argument, 0, O_PROMPT},     {"prompt-file", required_argument, 0, O_PFILE},
        {"prompt-ids", required_argument, 0, O_IDS},    {"max-tokens", required_argument, 0, O_MAX},
        {"temperature", required_argument, 0, O_TEMP},  {"top-k", required_argument, 0, O_TOPK},
        {"top-p", required_argument, 0, O_TOPP},        {"seed", required_argument, 0, O_SEED},
        {"device", required_argument, 0, O_DEV},        {"threads", required_argument, 0, O_THR},
        {"max-context", required_argument, 0, O_CTX},   {"json", no_argument, 0, O_JSON},
        {"no-bos", no_argument, 0, O_NOBOS},            {"no-special", no_argument, 0, O_NOSPECIAL},
        {"ignore-eos", no_argument, 0, O_IGNEOS},       {"gpu-memory", required_argument, 0, O_GPUMEM},
        {"bos", no_argument, 0, O_BOS},                 {"help", no_argument, 0, 'h'},
        {"chat", no_argument, 0, O_CHAT},               {"system", required_argument, 0, O_SYSTEM},
        {"min-p", required_argument, 0, O_MINP},        {"presence-penalty", required_argument, 0, O_PRES},
        {"frequency-penalty", required_argument, 0, O_FREQ}, {"repetition-penalty", required_argument, 0, O_REP},
        {"logprobs", required_argument, 0, O_LOGPROBS}, {"gpus", required_argument, 0, O_GPUS},
        {"prompt-logprobs", required_argument, 0, O_PLOGPROBS},
        {"tp-timeout", required_argument, 0, O_TPTIME},
        {0, 0, 0, 0}};
    *o = (run_opts){.device = "auto", .max_tokens = 128, .seed = -1, .top_p = 1, .repetition = 1, .logprobs = -1,
                    .prompt_logprobs = -1};
    bool bos = false;
    int c, rc;
    optind = 1;
    opterr = 0;
    while ((c = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
        switch (c) {
        case O_PROMPT: o->prompt = optarg; break;
        case O_PFILE: o->prompt_file = optarg; break;
        case O_IDS: o->ids_arg = optarg; break;
        case O_MAX:
            if (!kiln_cli_parse_int(optarg, 0, 1 << 24, &o->max_tokens))
                return kiln_cli_usage_error("run", "--max-tokens '%s' is not a whole number >= 0", optarg);
            break;
        case O_TEMP:
            if (!kiln_cli_parse_float(optarg, 0, 1e6, &o->temperature))
                return kiln_cli_usage_error("run", "--temperature '%s' is not a number >= 0", optarg);
            o->temp_set = true;
            break;
        case O_TOPK:
            if (!kiln_cli_parse_int(optarg, 0, 1 << 24, &o->top_k))
                return kiln_cli_usage_error("run", "--top-k '%s' is not a whole number >= 0", optarg);
            o->top_k_set = true;
            break;
        case O_TOPP:
            if (!kiln_cli_parse_float(optarg, 1e-9, 1, &o->top_p))
                return kiln_cli_usage_error("run", "--top-p '%s' is not a number in (0, 1]", optarg);
            o->top_p_set = true;
            break;
        case O_MINP:
            if (!kiln_cli_parse_float(optarg, 0, 1, &o->min_p))
                return kiln_cli_usage_error("run", "--min-p '%s' is not a number in [0, 1]", optarg);
            break;
        case O_PRES:
        case O_FREQ:
            if (!kiln_cli_parse_float(optarg, -2, 2, c == O_PRES ? &o->presence : &o->frequency))
                return kiln_cli_usage_error("run", "--%s-penalty '%s' is not a number in [-2, 2]",
                                            c == O_PRES ? "presence" : "frequency", optarg);
            break;
        case O_REP:
            if (!kiln_cli_parse_float(optarg, 1e-6, 10, &o->repetition))
                return kiln_cli_usage_error("run", "--repetition-penalty '%s' is not a number in (0, 10]", optarg);
            break;
        case O_SEED:
            if (!kiln_cli_parse_int(optarg, 0, INT64_MAX, &o->seed))
                return kiln_cli_usage_error("run", "--seed '%s' is not a whole number >= 0", optarg);
            break;
        case O_DEV: o->device = optarg; break;
        case O_GPUS:
            if ((rc = kiln_cli_gpus_arg("run", optarg)) != KILN_EXIT_OK) return rc;
            o->gpus = optarg;
            break;
        case O_TPTIME:
            if ((rc = kiln_cli_tp_timeout_arg("run", optarg, &o->tp_timeout)) != KILN_EXIT_OK) return rc;
            break;
        case O_THR:
            if (!kiln_cli_parse_int(optarg, 1, 256, &o->threads))
                return kiln_cli_usage_error("run", "--threads '%s' is not a number in 1..256", optarg);
            break;
        case O_CTX:
            if (!kiln_cli_parse_int(optarg, 1, 1 << 24, &o->max_ctx))
                return kiln_cli_usage_error("run", "--max-context '%s' is not a positive number", optarg);
            break;
        case O_GPUMEM:
            if (!kiln_cli_parse_memory(optarg, &o->kv_bytes, &o->kv_fraction))
                return kiln_cli_usage_error("run", "--gpu-memory '%s' is neither bytes (e.g. 4G) nor a fraction in "
                                                   "(0, 1]", optarg);
            break;
        case O_JSON: o->json = true; break;
        case O_BOS: bos = true; break;
        case O_NOBOS: o->no_bos = true; break;
        case O_NOSPECIAL: o->no_special = true; break;
        case O_IGNEOS: o->ignore_eos = true; break;
        case O_CHAT: o->chat = true; break;
        case O_LOGPROBS:
            if (!kiln_cli_parse_int(optarg, 0, KILN_MAX_LOGPROBS, &o->logprobs))
                return kiln_cli_usage_error("run", "--logprobs '%s' is not a number in 0..%d", optarg,
                                            KILN_MAX_LOGPROBS);
            break;
        case O_PLOGPROBS:
            if (!kiln_cli_parse_int(optarg, 0, KILN_MAX_LOGPROBS, &o->prompt_logprobs))
                return kiln_cli_usage_error("run", "--prompt-logprobs '%s' is not a number in 0..%d", optarg,
                                            KILN_MAX_LOGPROBS);
            break;
        case O_SYSTEM: o->system = optarg; break;
        case 'h': help(stdout); return KILN_EXIT_OK;
        default: return kiln_cli_usage_error("run", "unknown or incomplete option '%s'", argv[optind - 1]);
        }
    }
    if (optind != argc - !builtin)
        return kiln_cli_usage_error("run", builtin ? "takes no engine file: the engine is built in"
                                                   : "expected one engine file");
    o->engine = builtin ? kiln_engine_src_label(builtin) : argv[optind];
    if (!!o->prompt + !!o->prompt_file + !!o->ids_arg > 1)
        return kiln_cli_usage_error("run", "give only one of --prompt, --prompt-file, --prompt-ids");
    if ((o->system && !o->chat) || (o->chat && (o->ids_arg || o->no_special)))
        return kiln_cli_usage_error("run", o->system && !o->chat ? "--system needs --chat"
                                           : o->ids_arg          ? "--chat takes a text prompt, not --prompt-ids"
                                                                 : "--no-special cannot go with --chat: the template's "
                                                                   "special tokens must stay special");
    if (bos && o->no_bos) return kiln_cli_usage_error("run", "--bos and --no-bos contradict each other");
    if ((o->logprobs >= 0 || o->prompt_logprobs >= 0) && !o->json)
        return kiln_cli_usage_error("run", "--%s goes with --json (the log-probabilities are printed there)",
                                    o->logprobs >= 0 ? "logprobs" : "prompt-logprobs");
    if (o->ids_arg && (bos || o->no_bos || o->no_special))
        return kiln_cli_usage_error("run", "--bos, --no-bos and --no-special apply to text prompts, not --prompt-ids");
    if (strcmp(o->device, "cpu") != 0 && strcmp(o->device, "auto") != 0 && strcmp(o->device, "gpu") != 0)
        return kiln_cli_usage_error("run", "unknown device '%s' (gpu, cpu, auto)", o->device);
    if (o->kv_fraction > 0 && strcmp(o->device, "cpu") == 0)
        return kiln_cli_usage_error("run", "--gpu-memory %g is a fraction of GPU memory, which does not apply to "
                                           "--device cpu; give bytes (e.g. 512M)", o->kv_fraction);
    if (o->temp_set && o->temperature == 0 && ((o->top_k_set && o->top_k > 0) || (o->top_p_set && o->top_p < 1)))
        return kiln_cli_usage_error("run", "--%s applies to sampling, and --temperature 0 decodes greedily",
                                    o->top_k_set && o->top_k > 0 ? "top-k" : "top-p");
    if (o->seed < 0) o->seed = (long long)time(NULL);
    return -1;
}

/* Read all of f (named `name` in messages) into a malloc'd NUL-terminated
 * string. A directory, a read error or more than PROMPT_MAX_BYTES is an error
 * naming the file and the reason; any stream (file, pipe, FIFO, terminal) is read. */
static kiln_status read_stream(FILE *f, const char *name, char **text, size_t *len, kiln_error *err) {
    struct stat sb;
    if (fstat(fileno(f), &sb) == 0 && S_ISDIR(sb.st_mode))
        return kiln_err(err, KILN_ERR_IO, "%s: cannot read the prompt: it is a directory", name);
    kiln_buf b = {0};
    char chunk[65536];
    size_t n;
    while ((n = fread(chunk, 1, sizeof chunk, f)) > 0) {
        if (b.len + n > PROMPT_MAX_BYTES) {
            kiln_buf_free(&b);
            kiln_err(err, KILN_ERR_INVALID_ARG, "%s: the prompt is larger than %u MiB", name, PROMPT_MAX_BYTES >> 20);
            return kiln_err_hint(err, "give a shorter prompt");
        }
        kiln_buf_append(&b, chunk, n);
    }
    int e = ferror(f) ? errno : 0;
    kiln_buf_append(&b, "", 1);
    if (e || b.failed) {
        kiln_buf_free(&b);
        if (e) return kiln_err(err, KILN_ERR_IO, "%s: cannot read the prompt: %s", name, strerror(e));
        return kiln_err(err, KILN_ERR_NOMEM, "%s: out of memory reading the prompt", name);
    }
    *len = b.len - 1;
    *text = (char *)b.data;
    return KILN_OK;
}

/* The prompt text of --prompt, --prompt-file or stdin: *text (malloc'd) and
 * *len. *explicit_empty is set for `--prompt ''`, the one empty prompt allowed.
 * Returns -1 with *text set, or an exit code (a failure or usage error, reported). */
static int read_prompt(const run_opts *o, char **text, size_t *len, bool *explicit_empty) {
    kiln_error err = {0};
    *text = NULL;
    *len = 0;
    *explicit_empty = false;
    if (o->prompt) {
        *len = strlen(o->prompt);
        *explicit_empty = *len == 0;
        if (!(*text = strdup(o->prompt))) {
            kiln_err(&err, KILN_ERR_NOMEM, "out of memory copying the prompt");
            return kiln_cli_fail("run", &err, o->json);
        }
        return -1;
    }
    bool from_stdin = !o->prompt_file || strcmp(o->prompt_file, "-") == 0;
    if (!o->prompt_file && isatty(0))
        return kiln_cli_usage_error("run", "no prompt: give --prompt, --prompt-file or --prompt-ids");
    const char *name = from_stdin ? "stdin" : o->prompt_file;
    FILE *f = stdin;
    if (!from_stdin) { /* a regular file: a FIFO or device is refused, never waited on (a pipe comes as stdin) */
        int fd = -1;
        if (kiln_file_open_regular(o->prompt_file, &fd, NULL, &err) != KILN_OK) {
            kiln_err_prefix(&err, "--prompt-file: ");
            return kiln_cli_fail("run", &err, o->json);
        }
        if (!(f = fdopen(fd, "rb"))) {
            close(fd);
            kiln_err(&err, KILN_ERR_NOMEM, "%s: out of memory opening the prompt file", o->prompt_file);
            return kiln_cli_fail("run", &err, o->json);
        }
    }
    kiln_status st = read_stream(f, name, text, len, &err);
    if (f != stdin) fclose(f);
    if (st == KILN_OK && *len == 0) {
        free(*text);
        *text = NULL;
        kiln_err(&err, KILN_ERR_INVALID_ARG, "%s: the prompt is empty", name);
        kiln_err_hint(&err, "write the prompt there, or give --prompt '' to start from the BOS token alone");
        st = KILN_ERR_INVALID_ARG;
    }
    return st == KILN_OK ? -1 : kiln_cli_fail("run", &err, o->json);
}

/* The prompt text as ids, encoded with the engine's tokenizer. `--prompt ''`
 * is the BOS token alone, tokenizer or not. On success *ids is malloc'd. */
static kiln_status prompt_ids(const run_opts *o, const kiln_model *m, const char *text, size_t len,
                              bool explicit_empty, int32_t **ids, int *n, kiln_error *err) {
    *ids = NULL;
    *n = 0;
    if (explicit_empty) { /* needs no tokenizer: the engine's bos id is in its meta */
        if (m->bos_id < 0 || o->no_bos) {
            kiln_err(err, KILN_ERR_INVALID_ARG, "--prompt '': an empty prompt starts from the BOS token alone, but %s",
                     o->no_bos ? "--no-bos leaves it out" : "the engine has no BOS token");
            return kiln_err_hint(err, "give a non-empty prompt");
        }
        if (!(*ids = malloc(sizeof **ids))) return kiln_err(err, KILN_ERR_NOMEM, "out of memory");
        (*ids)[0] = m->bos_id;
        *n = 1;
        return KILN_OK;
    }
    if (!m->tokenizer) {
        kiln_err(err, KILN_ERR_MISSING, "%s: the engine has no tokenizer, so it cannot take a text prompt", o->engine);
        return kiln_err_hint(err, "give --prompt-ids, or compile from a checkpoint directory that has tokenizer.json");
    }
    size_t got = 0;
    /* --chat: HF apply_chat_template + encode(add_special_tokens=False): the template writes the specials */
    unsigned flags = (o->no_bos || o->chat ? 0 : KILN_TOK_ADD_SPECIAL) | (o->no_special ? KILN_TOK_NO_SPECIAL : 0);
    kiln_status st = kiln_tokenizer_encode(m->tokenizer, text, len, flags, ids, &got, err);
    if (st != KILN_OK) return st;
    if (got == 0 || got > INT32_MAX) {
        free(*ids);
        *ids = NULL;
        kiln_err(err, KILN_ERR_INVALID_ARG, "the prompt encodes to %zu tokens", got);
        return kiln_err_hint(err, got ? "give a shorter prompt" : "give a non-empty prompt");
    }
    *n = (int)got;
    return KILN_OK;
}

/* The request's sampling: generation_config.json's defaults stored in the
 * engine, each replaced by the option when given. --top-k or --top-p that
 * greedy decoding (temperature 0, given or the engine's) would ignore are
 * refused rather than silently dropped. */
static kiln_status sampling_options(const run_opts *o, const kiln_t *k, kiln_request_options *ro, kiln_error *err) {
    kiln_request_options_init_from_engine(k, ro);
    if (o->temp_set) ro->temperature = (float)o->temperature;
    if (o->top_k_set) ro->top_k = (int32_t)o->top_k;
    if (o->top_p_set) ro->top_p = (float)o->top_p;
    ro->min_p = (float)o->min_p;
    ro->presence_penalty = (float)o->presence;
    ro->frequency_penalty = (float)o->frequency;
    ro->repetition_penalty = (float)o->repetition;
    if (ro->temperature == 0 && ((o->top_k_set && o->top_k > 0) || (o->top_p_set && o->top_p < 1))) {
        kiln_err(err, KILN_ERR_INVALID_ARG, "--%s applies to sampling, and this engine decodes greedily by default "
                 "(its generation_config.json has no do_sample)", o->top_k_set && o->top_k > 0 ? "top-k" : "top-p");
        return kiln_err_hint(err, "give --temperature T > 0 as well");
    }
    return KILN_OK;
}

/* Create a context on the chosen device and run the one request to its end
 * with the given sampling, streaming through on_token into *out. dev_used gets the device's name. */
static kiln_status generate(const run_opts *o, kiln_t *k, const int32_t *ids, int n,
                            const kiln_request_options *sampling, run_out *out, kiln_ctx_t **ctx, char dev_used[16],
                            kiln_error *err) {
    kiln_ctx_options co;
    kiln_ctx_options_init(&co);
    co.device = o->device;
    co.max_batch = 1;
    co.max_context = (int32_t)o->max_ctx;
    co.threads = (int32_t)o->threads;
    co.kv_bytes = o->kv_bytes;
    if (o->kv_fraction > 0) co.kv_fraction = o->kv_fraction;
    co.gpus = o->gpus;
    co.tp_timeout_s = o->tp_timeout;
    double t0 = kiln_now();
    kiln_status st = kiln_ctx_new(k, &co, ctx);
    if (st != KILN_OK) return kiln_err(err, st, "%s", kiln_last_error(*ctx));
    out->ctx_s = kiln_now() - t0;
    kiln_ctx_info info = {.struct_size = sizeof info};
    bool have_info = kiln_ctx_info_get(*ctx, &info) == KILN_OK;
    snprintf(dev_used, 16, "%s", have_info ? info.device : o->device);
    out->kernels_s = have_info ? info.kernels_load_seconds : 0;
    out->jitted = have_info && info.kernels_jitted;
    kiln_request_options ro = *sampling;
    ro.max_tokens = (int32_t)o->max_tokens;
    ro.seed = (uint64_t)o->seed;
    ro.ignore_eos = o->ignore_eos;
    const bool with_info = o->logprobs >= 0 || o->prompt_logprobs >= 0;
    ro.on_token = with_info ? NULL : on_token;
    ro.on_token_info = with_info ? on_token_info : NULL;
    ro.logprobs = (int32_t)o->logprobs;
    ro.prompt_logprobs = (int32_t)o->prompt_logprobs;
    ro.user = out;
    int64_t id;
    out->sampling = ro;
    out->t_submit = kiln_now();
    if ((st = kiln_submit(*ctx, ids, n, &ro, &id)) != KILN_OK || (st = kiln_run(*ctx)) != KILN_OK)
        return kiln_err(err, st, "%s", kiln_last_error(*ctx));
    if (out->stop == KILN_STOP_ERROR) return kiln_err(err, KILN_ERR_DEVICE, "%s", kiln_last_error(*ctx));
    return KILN_OK;
}

/* One token's log-probabilities: {id, logprob, top: [{id, logprob}...]}. */
static json_t *token_json(const kiln_token_info *t) {
    json_t *top = json_array();
    for (int a = 0; a < t->n_top; a++)
        json_array_append_new(top, json_pack("{s:i, s:f}", "id", t->top_token[a], "logprob", (double)t->top_logprob[a]));
    return json_pack("{s:i, s:f, s:o}", "id", t->token, "logprob", (double)t->logprob, "top", top);
}

/* --json: one object with the prompt, the ids, the text and the timings. */
static kiln_status print_json(const run_opts *o, const kiln_t *k, const int32_t *ids, int n, const run_out *out,
                              const char *dev_used, kiln_error *err) {
    const kiln_model *m = kiln_api_model(k);
    double prefill_s = out->n_ids ? out->t_first - out->t_submit : 0;
    double decode_s = out->n_ids > 1 ? out->t_last - out->t_first : 0;
    json_t *pid = json_array(), *gid = json_array();
    for (int i = 0; i < n; i++) json_array_append_new(pid, json_integer(ids[i]));
    for (int i = 0; i < out->n_ids; i++) json_array_append_new(gid, json_integer(out->ids[i]));
    json_t *j = json_pack("{s:o, s:o, s:s, s:s, s:I, s:{s:f, s:f, s:f, s:f, s:f}}", "prompt_ids", pid, "ids", gid,
                          "stop_reason", kiln_stop_reason_str((kiln_stop_reason)out->stop), "device", dev_used,
                          "seed", (json_int_t)o->seed, "timings", "load_s", kiln_open_seconds(k), "prefill_s",
                          prefill_s, "decode_s", decode_s, "prefill_tokens_per_s", prefill_s > 0 ? n / prefill_s : 0.0,
                          "decode_tokens_per_s", decode_s > 0 ? (out->n_ids - 1) / decode_s : 0.0);
    if (!j) return kiln_err(err, KILN_ERR_NOMEM, "out of memory building the JSON output");
    if (m->tokenizer) {
        char *gen = NULL;
        size_t glen = 0;
        kiln_status st = kiln_tokenizer_decode(m->tokenizer, out->ids, (size_t)out->n_ids, true, &gen, &glen, err);
        if (st != KILN_OK) {
            json_decref(j);
            return st;
        }
        json_object_set_new(j, "text", json_stringn(gen, glen));
        free(gen);
    }
    json_t *tm = json_object_get(j, "timings");
    json_object_set_new(tm, "context_s", json_real(out->ctx_s)); /* the device: weights, KV pool, kernels */
    json_object_set_new(tm, "kernels_load_s", json_real(out->kernels_s));
    json_object_set_new(j, "ptx_jit", json_boolean(out->jitted));
    const kiln_request_options *so = &out->sampling;
    json_object_set_new(j, "sampling", json_pack("{s:f, s:i, s:f, s:f, s:f, s:f, s:f}", "temperature",
                                                 (double)so->temperature, "top_k", (int)so->top_k, "top_p",
                                                 (double)so->top_p, "min_p", (double)so->min_p, "presence_penalty",
                                                 (double)so->presence_penalty, "frequency_penalty",
                                                 (double)so->frequency_penalty, "repetition_penalty",
                                                 (double)so->repetition_penalty));
    if (o->logprobs >= 0) { /* each generated token's, with its alternatives */
        json_t *lp = json_array();
        for (int i = 0; i < out->n_ids; i++) json_array_append_new(lp, token_json(&out->info[i]));
        json_object_set_new(j, "logprobs", lp);
    }
    if (o->prompt_logprobs >= 0) { /* each prompt token's but the first's */
        json_t *lp = json_array();
        if (n > 0) json_array_append_new(lp, json_null());
        for (int i = 0; i < out->n_p; i++) json_array_append_new(lp, token_json(&out->pinfo[i]));
        json_object_set_new(j, "prompt_logprobs", lp);
    }
    char *s = json_dumps(j, JSON_COMPACT);
    if (s) printf("%s\n", s);
    free(s);
    json_decref(j);
    return KILN_OK;
}

/* Text mode: the rest of the streamed text, a newline, and a summary on stderr. */
static void print_text_end(run_out *out, const char *dev_used) {
    double prefill_s = out->n_ids ? out->t_first - out->t_submit : 0;
    double decode_s = out->n_ids > 1 ? out->t_last - out->t_first : 0;
    if (out->has_stream) {
        const char *tail;
        size_t len;
        kiln_error err = {0};
        if (kiln_tok_stream_finish(&out->stream, &tail, &len, &err) == KILN_OK && len) fwrite(tail, 1, len, stdout);
    }
    printf("\n");
    fprintf(stderr, "kiln run: %d tokens on %s, stop: %s, first token after %.1f ms, decode %.1f tok/s\n", out->n_ids,
            dev_used, kiln_stop_reason_str((kiln_stop_reason)out->stop), prefill_s * 1e3,
            decode_s > 0 ? (out->n_ids - 1) / decode_s : 0.0);
    if (out->jitted)
        fprintf(stderr, "kiln run: note: the engine has no cubin for this GPU, so the driver JIT-compiled its PTX in "
                        "%.2f s (it caches the result for the next load; compile with --target sm_NN to skip it)\n",
                out->kernels_s);
}

int kiln_cmd_run(int argc, char **argv) { return kiln_cmd_run_builtin(argc, argv, NULL); }

int kiln_cmd_run_builtin(int argc, char **argv, const kiln_engine_src *builtin) {
    run_opts o;
    int rc = run_parse(argc, argv, builtin, &o);
    if (rc >= 0) return rc;
    int32_t *ids = NULL;
    int n_ids = 0;
    char *text = NULL;
    size_t len = 0;
    bool explicit_empty = false;
    if (o.ids_arg && !kiln_cli_parse_ids(o.ids_arg, &ids, &n_ids)) {
        if (strspn(o.ids_arg, " []\n") == strlen(o.ids_arg))
            return kiln_cli_usage_error("run", "--prompt-ids '%s' holds no token id: a prompt needs at least one",
                                        o.ids_arg);
        return kiln_cli_usage_error("run", "--prompt-ids '%s' is not a list of token ids like 1,306,461", o.ids_arg);
    }
    if (!o.ids_arg && (rc = read_prompt(&o, &text, &len, &explicit_empty)) >= 0) return rc;

    kiln_error err = {0};
    kiln_t *k = NULL;
    kiln_ctx_t *ctx = NULL;
    run_out out = {.json = o.json, .first = true, .stop = KILN_STOP_ERROR};
    char dev_used[16] = "";
    const kiln_model *m = NULL;
    kiln_engine_src src = builtin ? *builtin : (kiln_engine_src){.path = o.engine};
    kiln_status st = kiln_open_src(&src, (int32_t)o.threads, &k);
    if (st != KILN_OK) {
        kiln_err(&err, st, "%s", kiln_error_message(k));
        goto out_fail;
    }
    m = kiln_api_model(k);
    if (o.chat) { /* the prompt (even '') is the user's message, rendered with the engine's template */
        explicit_empty = false;
        if (kiln_cli_chat_prompt(k, o.system, &text, &len, &err) != KILN_OK) goto out_fail;
    }
    if (!o.ids_arg && prompt_ids(&o, m, text, len, explicit_empty, &ids, &n_ids, &err) != KILN_OK) goto out_fail;
    if (m->tokenizer && !o.json) {
        kiln_tok_stream_init(&out.stream, m->tokenizer, true);
        out.has_stream = true;
    }
    kiln_request_options sampling;
    if (sampling_options(&o, k, &sampling, &err) != KILN_OK) { /* an option the engine's defaults make moot */
        kiln_cli_fail("run", &err, o.json);
        rc = KILN_EXIT_USAGE;
        goto out_free;
    }
    if (generate(&o, k, ids, n_ids, &sampling, &out, &ctx, dev_used, &err) != KILN_OK) goto out_fail;
    if (o.json) {
        if (print_json(&o, k, ids, n_ids, &out, dev_used, &err) != KILN_OK) goto out_fail;
    } else {
        print_text_end(&out, dev_used);
    }
    rc = KILN_EXIT_OK;
    goto out_free;
out_fail:
    rc = kiln_cli_fail("run", &err, o.json);
out_free:
    free(out.ids);
    free(out.info);
    free(out.pinfo);
    free(text);
    free(ids);
    if (out.has_stream) kiln_tok_stream_free(&out.stream);
    kiln_ctx_free(ctx);
    kiln_close(k);
    return rc;
}
