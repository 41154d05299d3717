/*
 * tokenizer_json.c — tokenizer.json → tokenizer blob (see kiln_tokjson.h).
 *
 * Reads the file with jansson (duplicate keys refused, NUL allowed in
 * strings), checks every field it uses for type and range, mirrors what HF
 * `tokenizers` does while loading (merges resolved to ids, added-token ids
 * assigned by content, template → prefix/suffix ids), and writes the chunks
 * described in runtime/kiln_tokenizer.h. Messages name the file and the JSON
 * path of the field at fault ("tokenizer.json: model.merges[17]: ...").
 */
#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../runtime/tokenizer_internal.h"
#include "kiln_tokjson.h"

#define TOKJSON_MAX_FILE (1ull << 30) /* 1 GiB: far above any real tokenizer.json */

typedef struct str {
    const char *p;
    size_t n;
} str;

typedef struct added_entry {
    uint32_t id;
    str content;
    bool special, lstrip, rstrip, normalized, single_word;
} added_entry;

typedef struct step {
    uint32_t kind, arg0, arg1;
    str a, b;
    char *owned; /* a regex built from a String pattern */
} step;

typedef struct cc { /* compile context */
    const char *label;     /* file name for messages */
    const char *config_label;
    kiln_error *err;
    json_t *root, *config;
    json_t *vocab;         /* model.vocab */
    uint32_t vocab_len;    /* entries in model.vocab (HF get_vocab_size) */
    uint32_t n_ids;
    str *id_str;           /* [n_ids] model token of each id */
    uint8_t *present;      /* [n_ids] */
    uint32_t model_flags;
    int32_t unk_id;
    uint32_t *merges;      /* 3 per merge */
    uint32_t n_merges;
    added_entry *added;    /* indexed by position in map_r order */
    uint32_t n_added;
    json_t *added_map;     /* content → id (JSON integers) */
    step norm[KILN_TOK_MAX_STEPS], pre[KILN_TOK_MAX_STEPS], dec[KILN_TOK_MAX_STEPS];
    uint32_t n_norm, n_pre, n_dec;
    int32_t prefix[64], suffix[64];
    uint32_t n_prefix, n_suffix;
    int32_t bos;
    int32_t eos[KILN_TOK_MAX_EOS];
    uint32_t n_eos;
} cc;

static kiln_status perr(cc *c, kiln_status code, const char *fmt, ...) KILN_PRINTF(3, 4);
static kiln_status perr(cc *c, kiln_status code, const char *fmt, ...) {
    char msg[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return kiln_err(c->err, code, "%s: %s", c->label, msg);
}

/* ---- typed field access ---- */

static const char *jtype(const json_t *j) {
    switch (json_typeof(j)) {
    case JSON_OBJECT: return "an object";
    case JSON_ARRAY: return "an array";
    case JSON_STRING: return "a string";
    case JSON_INTEGER: return "an integer";
    case JSON_REAL: return "a number";
    case JSON_TRUE:
    case JSON_FALSE: return "a boolean";
    default: return "null";
    }
}

static bool is_null(const json_t *j) { return !j || json_is_null(j); }

static kiln_status get_bool(cc *c, const json_t *obj, const char *key, const char *path, bool required, bool dflt, bool *out) {
    json_t *v = json_object_get(obj, key);
    *out = dflt;
    if (is_null(v)) {
        if (required && !v) return perr(c, KILN_ERR_PARSE, "%s.%s is missing (a boolean is expected)", path, key);
        return KILN_OK;
    }
    if (!json_is_boolean(v)) return perr(c, KILN_ERR_PARSE, "%s.%s is %s, expected a boolean", path, key, jtype(v));
    *out = json_is_true(v);
    return KILN_OK;
}

static kiln_status get_str(cc *c, const json_t *obj, const char *key, const char *path, bool required, str *out) {
    json_t *v = json_object_get(obj, key);
    out->p = NULL;
    out->n = 0;
    if (is_null(v)) {
        if (required) return perr(c, KILN_ERR_PARSE, "%s.%s is missing (a string is expected)", path, key);
        return KILN_OK;
    }
    if (!json_is_string(v)) return perr(c, KILN_ERR_PARSE, "%s.%s is %s, expected a string", path, key, jtype(v));
    out->p = json_string_value(v);
    out->n = json_string_length(v);
    return KILN_OK;
}

static bool str_is(str s, const char *lit) { return s.p && s.n == strlen(lit) && memcmp(s.p, lit, s.n) == 0; }

/* A short printable excerpt of a string for messages (cap >= 8). Each step
 * writes at most 4 bytes ("\xNN") and room always stays for "..." and the
 * NUL: a long string used to end 1-2 bytes past buf (found by
 * fuzz_tokenizer_config; seed fuzz/corpus/tokenizer_config/long_bos.json). */
static const char *show(str s, char *buf, size_t cap) {
    size_t k = 0, i = 0;
    for (; i < s.n && k + 8 <= cap; i++) {
        unsigned char ch = (unsigned char)s.p[i];
        if (ch < 0x20 || ch == 0x7F) k += (size_t)snprintf(buf + k, cap - k, "\\x%02X", ch);
        else buf[k++] = (char)ch;
    }
    if (i < s.n) {
        while (k > 0 && ((unsigned char)buf[k - 1] & 0xC0) == 0x80) k--; /* do not cut a character */
        if (k > 0 && (unsigned char)buf[k - 1] >= 0xC0) k--;
        memcpy(buf + k, "...", 4);
    } else {
        buf[k] = 0;
    }
    return buf;
}

/* Token id of a string in model.vocab, or -1. */
static int32_t vocab_id(cc *c, const char *p, size_t n) {
    json_t *v = json_object_getn(c->vocab, p, n);
    return v ? (int32_t)json_integer_value(v) : -1;
}

/* HF Tokenizer::token_to_id: added tokens first, then the model. */
static int32_t token_id(cc *c, const char *p, size_t n) {
    json_t *v = c->added_map ? json_object_getn(c->added_map, p, n) : NULL;
    if (v) return (int32_t)json_integer_value(v);
    return vocab_id(c, p, n);
}

/* ---- model ---- */

static kiln_status parse_vocab(cc *c, json_t *model) {
    json_t *vocab = json_object_get(model, "vocab");
    if (!vocab) return perr(c, KILN_ERR_PARSE, "model.vocab is missing");
    if (!json_is_object(vocab)) return perr(c, KILN_ERR_PARSE, "model.vocab is %s, expected an object {token: id}", jtype(vocab));
    c->vocab = vocab;
    size_t n = json_object_size(vocab);
    if (n == 0) return perr(c, KILN_ERR_PARSE, "model.vocab is empty");
    if (n > KILN_TOK_MAX_IDS) return perr(c, KILN_ERR_UNSUPPORTED, "model.vocab has %zu tokens (kiln supports up to %u)", n, KILN_TOK_MAX_IDS);
    c->vocab_len = (uint32_t)n;
    const char *key;
    size_t klen;
    json_t *v;
    int64_t max_id = -1;
    json_object_keylen_foreach(vocab, key, klen, v) {
        char b[96];
        str ks = {key, klen};
        if (!json_is_integer(v)) return perr(c, KILN_ERR_PARSE, "model.vocab[\"%s\"] is %s, expected an integer id", show(ks, b, sizeof b), jtype(v));
        json_int_t id = json_integer_value(v);
        if (id < 0 || id >= (json_int_t)KILN_TOK_MAX_IDS)
            return perr(c, KILN_ERR_PARSE, "model.vocab[\"%s\"] has id %lld (0..%u expected)", show(ks, b, sizeof b), (long long)id, KILN_TOK_MAX_IDS - 1);
        if (klen > KILN_TOK_MAX_TOKEN_BYTES)
            return perr(c, KILN_ERR_UNSUPPORTED, "model.vocab: token %lld is %zu bytes long (at most %d)", (long long)id, klen, KILN_TOK_MAX_TOKEN_BYTES);
        if (id > max_id) max_id = id;
    }
    c->n_ids = (uint32_t)max_id + 1;
    c->id_str = calloc(c->n_ids, sizeof *c->id_str);
    c->present = calloc(c->n_ids, 1);
    if (!c->id_str || !c->present) return perr(c, KILN_ERR_NOMEM, "out of memory for %u vocabulary ids", c->n_ids);
    json_object_keylen_foreach(vocab, key, klen, v) {
        uint32_t id = (uint32_t)json_integer_value(v);
        if (c->present[id]) {
            char b1[96], b2[96];
            return perr(c, KILN_ERR_PARSE, "model.vocab: id %u is given to both \"%s\" and \"%s\"", id,
                        show(c->id_str[id], b1, sizeof b1), show((str){key, klen}, b2, sizeof b2));
        }
        c->present[id] = 1;
        c->id_str[id] = (str){key, klen};
    }
    return KILN_OK;
}

static kiln_status add_merge(cc *c, size_t i, str a, str b, char *buf) {
    char s1[96], s2[96];
    int32_t ia = vocab_id(c, a.p, a.n), ib = vocab_id(c, b.p, b.n);
    if (ia < 0 || ib < 0)
        return perr(c, KILN_ERR_PARSE, "model.merges[%zu]: \"%s\" is not in model.vocab", i, show(ia < 0 ? a : b, s1, sizeof s1));
    if (a.n + b.n > 2 * KILN_TOK_MAX_TOKEN_BYTES) return perr(c, KILN_ERR_PARSE, "model.merges[%zu] is too long", i);
    memcpy(buf, a.p, a.n);
    memcpy(buf + a.n, b.p, b.n);
    int32_t im = vocab_id(c, buf, a.n + b.n);
    if (im < 0)
        return perr(c, KILN_ERR_PARSE, "model.merges[%zu]: \"%s\" + \"%s\" is not in model.vocab", i, show(a, s1, sizeof s1),
                    show(b, s2, sizeof s2));
    uint32_t *m = &c->merges[3 * (size_t)c->n_merges++];
    m[0] = (uint32_t)ia;
    m[1] = (uint32_t)ib;
    m[2] = (uint32_t)im;
    return KILN_OK;
}

static kiln_status parse_merges(cc *c, json_t *model) {
    json_t *merges = json_object_get(model, "merges");
    if (!merges) return perr(c, KILN_ERR_PARSE, "model.merges is missing");
    if (!json_is_array(merges)) return perr(c, KILN_ERR_PARSE, "model.merges is %s, expected an array", jtype(merges));
    size_t n = json_array_size(merges);
    if (n > KILN_TOK_MAX_MERGES) return perr(c, KILN_ERR_UNSUPPORTED, "model.merges has %zu entries (at most %u)", n, KILN_TOK_MAX_MERGES);
    c->merges = malloc((n + 1) * 3 * sizeof(uint32_t));
    char *buf = malloc(2 * KILN_TOK_MAX_TOKEN_BYTES + 1);
    if (!c->merges || !buf) {
        free(buf);
        return perr(c, KILN_ERR_NOMEM, "out of memory for %zu merges", n);
    }
    kiln_status st = KILN_OK;
    for (size_t i = 0; i < n && st == KILN_OK; i++) {
        json_t *m = json_array_get(merges, i);
        str a, b;
        if (json_is_string(m)) { /* legacy "a b": exactly one space */
            const char *s = json_string_value(m);
            size_t len = json_string_length(m);
            if (len >= 8 && memcmp(s, "#version", 8) == 0) continue;
            const char *sp = memchr(s, ' ', len);
            if (!sp || memchr(sp + 1, ' ', len - (size_t)(sp + 1 - s))) {
                char b1[96];
                st = perr(c, KILN_ERR_PARSE, "model.merges[%zu] is \"%s\", expected two tokens separated by one space", i,
                          show((str){s, len}, b1, sizeof b1));
                break;
            }
            a = (str){s, (size_t)(sp - s)};
            b = (str){sp + 1, len - a.n - 1};
        } else if (json_is_array(m) && json_array_size(m) == 2 && json_is_string(json_array_get(m, 0)) &&
                   json_is_string(json_array_get(m, 1))) {
            a = (str){json_string_value(json_array_get(m, 0)), json_string_length(json_array_get(m, 0))};
            b = (str){json_string_value(json_array_get(m, 1)), json_string_length(json_array_get(m, 1))};
        } else {
            st = perr(c, KILN_ERR_PARSE, "model.merges[%zu] is %s, expected \"a b\" or [\"a\", \"b\"]", i, jtype(m));
            break;
        }
        st = add_merge(c, i, a, b, buf);
    }
    free(buf);
    return st;
}

static kiln_status parse_model(cc *c) {
    json_t *model = json_object_get(c->root, "model");
    if (!model) return perr(c, KILN_ERR_PARSE, "the \"model\" object is missing");
    if (!json_is_object(model)) return perr(c, KILN_ERR_PARSE, "model is %s, expected an object", jtype(model));
    str type;
    kiln_status st = get_str(c, model, "type", "model", false, &type);
    if (st != KILN_OK) return st;
    if (!type.p) return perr(c, KILN_ERR_PARSE, "model.type is missing (expected \"BPE\")");
    if (!str_is(type, "BPE")) {
        char b[64];
        return perr(c, KILN_ERR_UNSUPPORTED, "model type \"%s\" is not supported (kiln implements BPE only; WordPiece, Unigram "
                    "and WordLevel tokenizers are refused)", show(type, b, sizeof b));
    }
    json_t *dropout = json_object_get(model, "dropout");
    if (!is_null(dropout) && !(json_is_number(dropout) && json_number_value(dropout) == 0.0))
        return perr(c, KILN_ERR_UNSUPPORTED, "model.dropout is set; BPE dropout is random and kiln encodes deterministically");
    str prefix, suffix;
    if ((st = get_str(c, model, "continuing_subword_prefix", "model", false, &prefix)) != KILN_OK) return st;
    if ((st = get_str(c, model, "end_of_word_suffix", "model", false, &suffix)) != KILN_OK) return st;
    if (prefix.n || suffix.n)
        return perr(c, KILN_ERR_UNSUPPORTED, "model.%s is non-empty; kiln supports BPE without subword prefixes/suffixes",
                    prefix.n ? "continuing_subword_prefix" : "end_of_word_suffix");
    bool byte_fallback, fuse_unk, ignore_merges;
    if ((st = get_bool(c, model, "byte_fallback", "model", false, false, &byte_fallback)) != KILN_OK) return st;
    if ((st = get_bool(c, model, "fuse_unk", "model", false, false, &fuse_unk)) != KILN_OK) return st;
    if ((st = get_bool(c, model, "ignore_merges", "model", false, false, &ignore_merges)) != KILN_OK) return st;
    c->model_flags = (byte_fallback ? KILN_TOK_MF_BYTE_FALLBACK : 0) | (fuse_unk ? KILN_TOK_MF_FUSE_UNK : 0) |
                     (ignore_merges ? KILN_TOK_MF_IGNORE_MERGES : 0);
    if ((st = parse_vocab(c, model)) != KILN_OK) return st;
    str unk;
    if ((st = get_str(c, model, "unk_token", "model", false, &unk)) != KILN_OK) return st;
    c->unk_id = -1;
    if (unk.p) {
        c->unk_id = vocab_id(c, unk.p, unk.n);
        char b[96];
        if (c->unk_id < 0) return perr(c, KILN_ERR_PARSE, "model.unk_token \"%s\" is not in model.vocab", show(unk, b, sizeof b));
    }
    return parse_merges(c, model);
}

/* ---- added tokens (HF AddedVocabulary::add_tokens) ---- */

static kiln_status parse_added(cc *c) {
    json_t *arr = json_object_get(c->root, "added_tokens");
    c->added_map = json_object();
    if (!c->added_map) return perr(c, KILN_ERR_NOMEM, "out of memory");
    if (is_null(arr)) return KILN_OK;
    if (!json_is_array(arr)) return perr(c, KILN_ERR_PARSE, "added_tokens is %s, expected an array", jtype(arr));
    size_t n = json_array_size(arr);
    if (n > KILN_TOK_MAX_ADDED) return perr(c, KILN_ERR_UNSUPPORTED, "added_tokens has %zu entries (at most %u)", n, KILN_TOK_MAX_ADDED);
    c->added = calloc(n + 1, sizeof *c->added);
    json_t *special_set = json_object();
    if (!c->added || !special_set) {
        json_decref(special_set);
        return perr(c, KILN_ERR_NOMEM, "out of memory for %zu added tokens", n);
    }
    kiln_status st = KILN_OK;
    /* HF: next id = vocab size (entries), or past the largest added id once that reaches it */
    uint64_t next_id = c->vocab_len;
    for (size_t i = 0; i < n; i++) {
        json_t *o = json_array_get(arr, i);
        char path[64], b[96];
        snprintf(path, sizeof path, "added_tokens[%zu]", i);
        if (!json_is_object(o)) {
            st = perr(c, KILN_ERR_PARSE, "%s is %s, expected an object", path, jtype(o));
            break;
        }
        added_entry e = {0};
        json_t *jid = json_object_get(o, "id");
        if (!json_is_integer(jid) || json_integer_value(jid) < 0) {
            st = perr(c, KILN_ERR_PARSE, "%s.id is %s, expected a non-negative integer", path, jid ? jtype(jid) : "missing");
            break;
        }
        if ((st = get_str(c, o, "content", path, true, &e.content)) != KILN_OK) break;
        if ((st = get_bool(c, o, "single_word", path, true, false, &e.single_word)) != KILN_OK) break;
        if ((st = get_bool(c, o, "lstrip", path, true, false, &e.lstrip)) != KILN_OK) break;
        if ((st = get_bool(c, o, "rstrip", path, true, false, &e.rstrip)) != KILN_OK) break;
        if ((st = get_bool(c, o, "normalized", path, true, false, &e.normalized)) != KILN_OK) break;
        if ((st = get_bool(c, o, "special", path, true, false, &e.special)) != KILN_OK) break;
        if (e.content.n == 0) continue; /* HF ignores empty tokens */
        if (e.content.n > KILN_TOK_MAX_TOKEN_BYTES) {
            st = perr(c, KILN_ERR_UNSUPPORTED, "%s.content is %zu bytes long (at most %d)", path, e.content.n, KILN_TOK_MAX_TOKEN_BYTES);
            break;
        }
        if (e.single_word) {
            st = perr(c, KILN_ERR_UNSUPPORTED, "%s (\"%s\"): single_word=true is not supported", path, show(e.content, b, sizeof b));
            break;
        }
        json_t *known = json_object_getn(c->added_map, e.content.p, e.content.n);
        int64_t new_id = -1;
        if (known) {
            uint32_t kid = (uint32_t)json_integer_value(known);
            for (uint32_t k = 0; k < c->n_added; k++) { /* identical token already there: skip */
                added_entry *x = &c->added[k];
                if (x->id == kid && x->content.n == e.content.n && memcmp(x->content.p, e.content.p, e.content.n) == 0 &&
                    x->special == e.special && x->lstrip == e.lstrip && x->rstrip == e.rstrip && x->normalized == e.normalized)
                    goto next;
            }
            new_id = kid;
        } else {
            new_id = vocab_id(c, e.content.p, e.content.n);
        }
        if (new_id < 0) new_id = (int64_t)next_id++;
        if (new_id >= (int64_t)KILN_TOK_MAX_IDS) {
            st = perr(c, KILN_ERR_UNSUPPORTED, "%s gets id %lld, past kiln's id space", path, (long long)new_id);
            break;
        }
        if (json_object_setn_new(c->added_map, e.content.p, e.content.n, json_integer(new_id)) != 0 ||
            (e.special && json_object_setn_new(special_set, e.content.p, e.content.n, json_true()) != 0)) {
            st = perr(c, KILN_ERR_NOMEM, "out of memory");
            break;
        }
        e.id = (uint32_t)new_id;
        {
            uint32_t k = 0; /* map_r[new_id] = token */
            while (k < c->n_added && c->added[k].id != e.id) k++;
            c->added[k] = e;
            if (k == c->n_added) c->n_added++;
        }
    next:;
    }
    /* HF tests membership in the set of special contents, not the token's own flag */
    for (uint32_t k = 0; st == KILN_OK && k < c->n_added; k++)
        c->added[k].special = json_object_getn(special_set, c->added[k].content.p, c->added[k].content.n) != NULL;
    json_decref(special_set);
    return st;
}

/* ---- normalizer, pre-tokenizer, decoder, post-processor ---- */

static kiln_status add_step(cc *c, step *steps, uint32_t *n, const char *what, step s) {
    if (*n >= KILN_TOK_MAX_STEPS) return perr(c, KILN_ERR_UNSUPPORTED, "%s has more than %d steps", what, KILN_TOK_MAX_STEPS);
    steps[(*n)++] = s;
    return KILN_OK;
}

static kiln_status parse_pattern(cc *c, json_t *o, const char *path, bool *is_regex, str *pat) {
    json_t *p = json_object_get(o, "pattern");
    if (!json_is_object(p)) return perr(c, KILN_ERR_PARSE, "%s.pattern is %s, expected {\"String\": ...} or {\"Regex\": ...}", path, p ? jtype(p) : "missing");
    json_t *s = json_object_get(p, "String"), *r = json_object_get(p, "Regex");
    json_t *v = s ? s : r;
    if (!json_is_string(v)) return perr(c, KILN_ERR_PARSE, "%s.pattern must hold a \"String\" or \"Regex\" string", path);
    *is_regex = s == NULL;
    *pat = (str){json_string_value(v), json_string_length(v)};
    return KILN_OK;
}

/* What a normalizer, pre-tokenizer, decoder and post-processor share: an object with a "type"; a
 * "Sequence" holds its parts in the array `parts_key`. Sets *type, and *parts to that array for a
 * Sequence (NULL otherwise). */
static kiln_status component(cc *c, json_t *n, const char *path, const char *parts_key, str *type, json_t **parts) {
    *parts = NULL;
    if (!json_is_object(n)) return perr(c, KILN_ERR_PARSE, "%s is %s, expected an object", path, jtype(n));
    kiln_status st = get_str(c, n, "type", path, true, type);
    if (st != KILN_OK || !str_is(*type, "Sequence")) return st;
    *parts = json_object_get(n, parts_key);
    if (!json_is_array(*parts)) return perr(c, KILN_ERR_PARSE, "%s.%s must be an array", path, parts_key);
    return KILN_OK;
}

/* The path of part i of a Sequence, in buf. */
static const char *part_path(char *buf, size_t n, const char *path, const char *parts_key, size_t i) {
    snprintf(buf, n, "%s.%s[%zu]", path, parts_key, i);
    return buf;
}

/* A Replace (normalizer or decoder): a non-empty String pattern (no Regex) into s->a, "content" into s->b. */
static kiln_status parse_replace(cc *c, json_t *n, const char *path, step *s) {
    bool rx = false;
    kiln_status st = parse_pattern(c, n, path, &rx, &s->a);
    if (st != KILN_OK) return st;
    if (rx) return perr(c, KILN_ERR_UNSUPPORTED, "%s: Replace with a Regex pattern is not supported (only String)", path);
    if (s->a.n == 0) return perr(c, KILN_ERR_UNSUPPORTED, "%s: Replace with an empty pattern is not supported", path);
    return get_str(c, n, "content", path, true, &s->b);
}

static kiln_status parse_normalizer(cc *c, json_t *n, const char *path) {
    if (is_null(n)) return KILN_OK;
    str type;
    json_t *parts;
    kiln_status st = component(c, n, path, "normalizers", &type, &parts);
    if (st != KILN_OK) return st;
    char sub[128], b[64];
    if (parts) {
        for (size_t i = 0; i < json_array_size(parts); i++)
            if ((st = parse_normalizer(c, json_array_get(parts, i), part_path(sub, sizeof sub, path, "normalizers", i))) != KILN_OK)
                return st;
        return KILN_OK;
    }
    step s = {0};
    if (str_is(type, "Prepend")) {
        s.kind = KILN_TOK_NORM_PREPEND;
        if ((st = get_str(c, n, "prepend", path, true, &s.a)) != KILN_OK) return st;
    } else if (str_is(type, "Replace")) {
        s.kind = KILN_TOK_NORM_REPLACE;
        if ((st = parse_replace(c, n, path, &s)) != KILN_OK) return st;
    } else if (str_is(type, "NFC")) {
        s.kind = KILN_TOK_NORM_NFC;
    } else {
        return perr(c, KILN_ERR_UNSUPPORTED, "%s: normalizer \"%s\" is not supported (kiln supports Prepend, Replace, NFC and "
                    "Sequence of them)", path, show(type, b, sizeof b));
    }
    return add_step(c, c->norm, &c->n_norm, "normalizer", s);
}

/* A literal string as a PCRE2 pattern: escape every ASCII non-alphanumeric (others are literal in UTF mode). */
static char *regex_escape(str s) {
    char *out = malloc(2 * s.n + 1), *w = out;
    if (!out) return NULL;
    for (size_t i = 0; i < s.n; i++) {
        unsigned char ch = (unsigned char)s.p[i];
        bool alnum = (ch >= '0' && ch <= '9') || (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z');
        if (ch < 0x80 && !alnum) *w++ = '\\';
        *w++ = (char)ch;
    }
    *w = 0;
    return out;
}

static kiln_status parse_pretok(cc *c, json_t *p, const char *path) {
    if (is_null(p)) return KILN_OK;
    str type;
    json_t *parts;
    kiln_status st = component(c, p, path, "pretokenizers", &type, &parts);
    if (st != KILN_OK) return st;
    char sub[128], b[64];
    if (parts) {
        for (size_t i = 0; i < json_array_size(parts); i++)
            if ((st = parse_pretok(c, json_array_get(parts, i), part_path(sub, sizeof sub, path, "pretokenizers", i))) != KILN_OK)
                return st;
        return KILN_OK;
    }
    if (c->n_pre > 0 && c->pre[c->n_pre - 1].kind == KILN_TOK_PRE_BYTELEVEL)
        return perr(c, KILN_ERR_UNSUPPORTED, "%s: a pre-tokenizer after ByteLevel is not supported (ByteLevel must be last)", path);
    step s = {0};
    if (str_is(type, "Split")) {
        bool rx, invert;
        str behavior;
        s.kind = KILN_TOK_PRE_SPLIT;
        if ((st = parse_pattern(c, p, path, &rx, &s.a)) != KILN_OK) return st;
        if ((st = get_str(c, p, "behavior", path, true, &behavior)) != KILN_OK) return st;
        if ((st = get_bool(c, p, "invert", path, true, false, &invert)) != KILN_OK) return st;
        if (!str_is(behavior, "Isolated"))
            return perr(c, KILN_ERR_UNSUPPORTED, "%s: Split behavior \"%s\" is not supported (only Isolated)", path, show(behavior, b, sizeof b));
        if (invert) return perr(c, KILN_ERR_UNSUPPORTED, "%s: Split with invert=true is not supported", path);
        if (s.a.n == 0) return perr(c, KILN_ERR_UNSUPPORTED, "%s: Split with an empty pattern is not supported", path);
        if (!rx) {
            s.owned = regex_escape(s.a);
            if (!s.owned) return perr(c, KILN_ERR_NOMEM, "out of memory");
            s.a = (str){s.owned, strlen(s.owned)};
        }
        /* a pattern kiln does not know must run in PCRE2 with the same meaning */
        if (kiln_tok_rx_known((const uint8_t *)s.a.p, s.a.n) == KILN_TOK_RX_PCRE2) {
            pcre2_code *re = NULL;
            kiln_error e2 = {0};
            if (kiln_tok_rx_compile((const uint8_t *)s.a.p, s.a.n, &re, &e2) != KILN_OK) {
                free(s.owned);
                return perr(c, KILN_ERR_UNSUPPORTED, "%s: %s", path, e2.msg);
            }
            pcre2_code_free(re);
        }
    } else if (str_is(type, "ByteLevel")) {
        bool aps, use_regex;
        if ((st = get_bool(c, p, "add_prefix_space", path, false, false, &aps)) != KILN_OK) return st;
        if ((st = get_bool(c, p, "use_regex", path, false, true, &use_regex)) != KILN_OK) return st;
        if (aps) return perr(c, KILN_ERR_UNSUPPORTED, "%s: ByteLevel with add_prefix_space=true is not supported", path);
        s.kind = KILN_TOK_PRE_BYTELEVEL;
        s.arg0 = use_regex;
        c->model_flags |= KILN_TOK_MF_BYTE_LEVEL;
    } else {
        return perr(c, KILN_ERR_UNSUPPORTED, "%s: pre-tokenizer \"%s\" is not supported (kiln supports Split, ByteLevel and "
                    "Sequence of them)", path, show(type, b, sizeof b));
    }
    st = add_step(c, c->pre, &c->n_pre, "pre_tokenizer", s);
    if (st != KILN_OK) free(s.owned);
    return st;
}

static kiln_status parse_decoder(cc *c, json_t *d, const char *path, bool top) {
    if (is_null(d)) {
        if (top) return perr(c, KILN_ERR_UNSUPPORTED, "decoder is null; kiln needs a ByteLevel or a ByteFallback/Replace decoder");
        return KILN_OK;
    }
    str type;
    json_t *parts;
    kiln_status st = component(c, d, path, "decoders", &type, &parts);
    if (st != KILN_OK) return st;
    char sub[128], b[64];
    if (parts) {
        for (size_t i = 0; i < json_array_size(parts); i++)
            if ((st = parse_decoder(c, json_array_get(parts, i), part_path(sub, sizeof sub, path, "decoders", i), false)) != KILN_OK)
                return st;
        return KILN_OK;
    }
    step s = {0};
    if (str_is(type, "ByteLevel")) {
        s.kind = KILN_TOK_DEC_BYTELEVEL;
    } else if (str_is(type, "Replace")) {
        s.kind = KILN_TOK_DEC_REPLACE;
        if ((st = parse_replace(c, d, path, &s)) != KILN_OK) return st;
    } else if (str_is(type, "ByteFallback")) {
        s.kind = KILN_TOK_DEC_BYTEFALLBACK;
    } else if (str_is(type, "Fuse")) {
        s.kind = KILN_TOK_DEC_FUSE;
    } else if (str_is(type, "Strip")) {
        s.kind = KILN_TOK_DEC_STRIP;
        if ((st = get_str(c, d, "content", path, true, &s.a)) != KILN_OK) return st;
        json_t *start = json_object_get(d, "start"), *stop = json_object_get(d, "stop");
        if (!json_is_integer(start) || !json_is_integer(stop) || json_integer_value(start) < 0 || json_integer_value(stop) < 0 ||
            json_integer_value(start) > 1000000)
            return perr(c, KILN_ERR_PARSE, "%s.start and .stop must be non-negative integers", path);
        s.arg0 = (uint32_t)json_integer_value(start);
        s.arg1 = (uint32_t)json_integer_value(stop);
    } else {
        return perr(c, KILN_ERR_UNSUPPORTED, "%s: decoder \"%s\" is not supported (kiln supports ByteLevel, or Replace, "
                    "ByteFallback, Fuse, Strip in a Sequence)", path, show(type, b, sizeof b));
    }
    return add_step(c, c->dec, &c->n_dec, "decoder", s);
}

static kiln_status template_ids(cc *c, json_t *tp, const char *path) {
    json_t *single = json_object_get(tp, "single"), *specials = json_object_get(tp, "special_tokens");
    if (!json_is_array(single)) return perr(c, KILN_ERR_PARSE, "%s.single must be an array", path);
    bool seen_a = false;
    c->n_prefix = c->n_suffix = 0;
    for (size_t i = 0; i < json_array_size(single); i++) {
        json_t *item = json_array_get(single, i), *sp, *seq;
        if ((seq = json_object_get(item, "Sequence"))) {
            str id;
            kiln_status st = get_str(c, seq, "id", path, true, &id);
            if (st != KILN_OK) return st;
            if (!str_is(id, "A") || seen_a)
                return perr(c, KILN_ERR_UNSUPPORTED, "%s.single[%zu]: only one Sequence \"A\" is supported", path, i);
            seen_a = true;
        } else if ((sp = json_object_get(item, "SpecialToken"))) {
            str name;
            char b[96];
            kiln_status st = get_str(c, sp, "id", path, true, &name);
            if (st != KILN_OK) return st;
            json_t *def = json_is_object(specials) ? json_object_getn(specials, name.p, name.n) : NULL;
            json_t *ids = def ? json_object_get(def, "ids") : NULL;
            if (!json_is_array(ids))
                return perr(c, KILN_ERR_PARSE, "%s.special_tokens has no ids for \"%s\"", path, show(name, b, sizeof b));
            for (size_t k = 0; k < json_array_size(ids); k++) {
                json_t *v = json_array_get(ids, k);
                if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) >= (json_int_t)KILN_TOK_MAX_IDS)
                    return perr(c, KILN_ERR_PARSE, "%s.special_tokens[\"%s\"].ids[%zu] is not a valid id", path, show(name, b, sizeof b), k);
                uint32_t *cnt = seen_a ? &c->n_suffix : &c->n_prefix;
                int32_t *dst = seen_a ? c->suffix : c->prefix;
                if (*cnt >= 64) return perr(c, KILN_ERR_UNSUPPORTED, "%s: more than 64 special ids", path);
                dst[(*cnt)++] = (int32_t)json_integer_value(v);
            }
        } else {
            return perr(c, KILN_ERR_PARSE, "%s.single[%zu] is neither a SpecialToken nor a Sequence", path, i);
        }
    }
    if (!seen_a) return perr(c, KILN_ERR_PARSE, "%s.single has no Sequence \"A\"", path);
    return KILN_OK;
}

static kiln_status parse_post(cc *c, json_t *p, const char *path, int *n_templates) {
    if (is_null(p)) return KILN_OK;
    str type;
    json_t *parts;
    kiln_status st = component(c, p, path, "processors", &type, &parts);
    if (st != KILN_OK) return st;
    char sub[128], b[64];
    if (parts) {
        for (size_t i = 0; i < json_array_size(parts); i++)
            if ((st = parse_post(c, json_array_get(parts, i), part_path(sub, sizeof sub, path, "processors", i), n_templates)) != KILN_OK)
                return st;
        return KILN_OK;
    }
    if (str_is(type, "ByteLevel")) return KILN_OK; /* only adjusts offsets */
    if (str_is(type, "TemplateProcessing")) {
        if (++*n_templates > 1) return perr(c, KILN_ERR_UNSUPPORTED, "%s: more than one TemplateProcessing", path);
        return template_ids(c, p, path);
    }
    return perr(c, KILN_ERR_UNSUPPORTED, "%s: post-processor \"%s\" is not supported (kiln supports TemplateProcessing, "
                "ByteLevel and Sequence of them)", path, show(type, b, sizeof b));
}

/* ---- tokenizer_config.json ---- */

/* bos_token / eos_token: a string, {"content": ...}, or null. */
static kiln_status config_token(cc *c, const char *key, int32_t *id) {
    *id = -1;
    json_t *v = json_object_get(c->config, key);
    if (is_null(v)) return KILN_OK;
    if (json_is_object(v)) v = json_object_get(v, "content");
    if (!json_is_string(v))
        return kiln_err(c->err, KILN_ERR_PARSE, "%s: %s must be a string or {\"content\": string}", c->config_label, key);
    str s = {json_string_value(v), json_string_length(v)};
    char b[96];
    *id = token_id(c, s.p, s.n);
    if (*id < 0)
        return kiln_err(c->err, KILN_ERR_PARSE, "%s: %s \"%s\" is not a token of %s", c->config_label, key, show(s, b, sizeof b),
                        c->label);
    return KILN_OK;
}

static kiln_status parse_config(cc *c) {
    c->bos = -1;
    c->n_eos = 0;
    if (!c->config) { /* no config: the template's first and last specials */
        if (c->n_prefix) c->bos = c->prefix[0];
        if (c->n_suffix) c->eos[c->n_eos++] = c->suffix[c->n_suffix - 1];
        return KILN_OK;
    }
    if (!json_is_object(c->config)) return kiln_err(c->err, KILN_ERR_PARSE, "%s: expected a JSON object", c->config_label);
    int32_t eos;
    kiln_status st;
    if ((st = config_token(c, "bos_token", &c->bos)) != KILN_OK) return st;
    if ((st = config_token(c, "eos_token", &eos)) != KILN_OK) return st;
    if (eos >= 0) c->eos[c->n_eos++] = eos;
    /* add_bos_token / add_eos_token, when given, decide (as transformers' Llama tokenizers do) */
    json_t *ab = json_object_get(c->config, "add_bos_token"), *ae = json_object_get(c->config, "add_eos_token");
    if (ab && !json_is_boolean(ab)) return kiln_err(c->err, KILN_ERR_PARSE, "%s: add_bos_token must be a boolean", c->config_label);
    if (ae && !json_is_boolean(ae)) return kiln_err(c->err, KILN_ERR_PARSE, "%s: add_eos_token must be a boolean", c->config_label);
    if (json_is_true(ab) && c->bos < 0) return kiln_err(c->err, KILN_ERR_PARSE, "%s: add_bos_token is true but bos_token is not set", c->config_label);
    if (json_is_true(ae) && eos < 0) return kiln_err(c->err, KILN_ERR_PARSE, "%s: add_eos_token is true but eos_token is not set", c->config_label);
    if (ab) {
        c->n_prefix = 0;
        if (json_is_true(ab)) c->prefix[c->n_prefix++] = c->bos;
    }
    if (ae) {
        c->n_suffix = 0;
        if (json_is_true(ae)) c->suffix[c->n_suffix++] = eos;
    }
    return KILN_OK;
}

/* ---- blob writing ---- */

static void put_u32(kiln_buf *b, uint32_t v) { kiln_buf_u32(b, v); }
static void pad4(kiln_buf *b, size_t n) { kiln_buf_zeros(b, (4 - n % 4) % 4); }

/* Begin a chunk: returns the offset of its size field, patched by chunk_end. */
static size_t chunk_begin(kiln_buf *b, uint32_t tag) {
    put_u32(b, tag);
    size_t at = b->len;
    put_u32(b, 0);
    return at;
}

static void chunk_end(kiln_buf *b, size_t at) {
    if (b->failed) return;
    size_t size = b->len - at - 4;
    kiln_wr_u32(b->data + at, (uint32_t)size);
    pad4(b, size);
}

static void write_steps(kiln_buf *b, uint32_t tag, const step *s, uint32_t n) {
    size_t at = chunk_begin(b, tag);
    put_u32(b, n);
    for (uint32_t i = 0; i < n; i++) {
        put_u32(b, s[i].kind);
        put_u32(b, s[i].arg0);
        put_u32(b, s[i].arg1);
        put_u32(b, (uint32_t)s[i].a.n);
        put_u32(b, (uint32_t)s[i].b.n);
        kiln_buf_append(b, s[i].a.p, s[i].a.n);
        kiln_buf_append(b, s[i].b.p, s[i].b.n);
        pad4(b, s[i].a.n + s[i].b.n);
    }
    chunk_end(b, at);
}

static int cmp_added(const void *x, const void *y) {
    const added_entry *a = x, *b = y;
    return a->id < b->id ? -1 : a->id > b->id;
}

static kiln_status write_blob(cc *c, kiln_buf *b) {
    uint32_t n_ids = c->n_ids;
    for (uint32_t i = 0; i < c->n_added; i++)
        if (c->added[i].id + 1 > n_ids) n_ids = c->added[i].id + 1;
    size_t start = b->len;
    kiln_buf_append(b, KILN_TOK_MAGIC, 8);
    uint8_t ver[4] = {KILN_TOK_MAJOR, 0, KILN_TOK_MINOR, 0};
    kiln_buf_append(b, ver, 4);
    put_u32(b, 9); /* chunks */

    size_t at = chunk_begin(b, KILN_TOK_CHUNK_MODL);
    put_u32(b, KILN_TOK_MODEL_BPE);
    put_u32(b, c->model_flags);
    put_u32(b, (uint32_t)c->unk_id);
    put_u32(b, c->vocab_len);
    chunk_end(b, at);

    at = chunk_begin(b, KILN_TOK_CHUNK_VOCB);
    uint64_t total = 0;
    for (uint32_t i = 0; i < c->n_ids; i++) total += c->id_str[i].n;
    if (total > UINT32_MAX / 2) return perr(c, KILN_ERR_UNSUPPORTED, "the vocabulary holds %llu bytes of text", (unsigned long long)total);
    put_u32(b, n_ids);
    put_u32(b, (uint32_t)total);
    uint32_t end = 0;
    for (uint32_t i = 0; i < n_ids; i++) {
        if (i < c->n_ids) end += (uint32_t)c->id_str[i].n;
        put_u32(b, end);
    }
    for (uint32_t i = 0; i < n_ids; i++) {
        uint8_t pr = i < c->n_ids ? c->present[i] : 0;
        kiln_buf_append(b, &pr, 1);
    }
    for (uint32_t i = 0; i < c->n_ids; i++) kiln_buf_append(b, c->id_str[i].p, c->id_str[i].n);
    chunk_end(b, at);

    at = chunk_begin(b, KILN_TOK_CHUNK_MERG);
    put_u32(b, c->n_merges);
    for (size_t i = 0; i < 3 * (size_t)c->n_merges; i++) put_u32(b, c->merges[i]);
    chunk_end(b, at);

    if (c->n_added) qsort(c->added, c->n_added, sizeof *c->added, cmp_added);
    at = chunk_begin(b, KILN_TOK_CHUNK_ADDT);
    put_u32(b, c->n_added);
    for (uint32_t i = 0; i < c->n_added; i++) {
        const added_entry *e = &c->added[i];
        put_u32(b, e->id);
        put_u32(b, (e->special ? KILN_TOK_AF_SPECIAL : 0) | (e->lstrip ? KILN_TOK_AF_LSTRIP : 0) |
                       (e->rstrip ? KILN_TOK_AF_RSTRIP : 0) | (e->normalized ? KILN_TOK_AF_NORMALIZED : 0));
        put_u32(b, (uint32_t)e->content.n);
    }
    for (uint32_t i = 0; i < c->n_added; i++) kiln_buf_append(b, c->added[i].content.p, c->added[i].content.n);
    chunk_end(b, at);

    write_steps(b, KILN_TOK_CHUNK_NORM, c->norm, c->n_norm);
    write_steps(b, KILN_TOK_CHUNK_PRET, c->pre, c->n_pre);
    write_steps(b, KILN_TOK_CHUNK_DECO, c->dec, c->n_dec);

    at = chunk_begin(b, KILN_TOK_CHUNK_POST);
    put_u32(b, c->n_prefix);
    put_u32(b, c->n_suffix);
    for (uint32_t i = 0; i < c->n_prefix; i++) put_u32(b, (uint32_t)c->prefix[i]);
    for (uint32_t i = 0; i < c->n_suffix; i++) put_u32(b, (uint32_t)c->suffix[i]);
    chunk_end(b, at);

    at = chunk_begin(b, KILN_TOK_CHUNK_SPEC);
    put_u32(b, (uint32_t)c->bos);
    put_u32(b, c->n_eos);
    for (uint32_t i = 0; i < c->n_eos; i++) put_u32(b, (uint32_t)c->eos[i]);
    chunk_end(b, at);

    if (b->failed) return perr(c, KILN_ERR_NOMEM, "out of memory writing the tokenizer blob");
    (void)start;
    return KILN_OK;
}

/* Template/config ids must name tokens (the runtime refuses holes). */
static kiln_status check_ids(cc *c) {
    const int32_t *lists[3] = {c->prefix, c->suffix, c->eos};
    uint32_t counts[3] = {c->n_prefix, c->n_suffix, c->n_eos};
    const char *names[3] = {"post_processor prefix", "post_processor suffix", "eos"};
    for (int l = 0; l < 3; l++)
        for (uint32_t i = 0; i < counts[l]; i++) {
            int32_t id = lists[l][i];
            bool known = (uint32_t)id < c->n_ids && c->present[id];
            for (uint32_t k = 0; !known && k < c->n_added; k++) known = c->added[k].id == (uint32_t)id;
            if (!known) return perr(c, KILN_ERR_PARSE, "%s id %d is not a token of the vocabulary", names[l], id);
        }
    return KILN_OK;
}

/* ---- the model's vocabulary (compile time) ----
 *
 * Every id the tokenizer can produce must be an id the model has rows for:
 * model.vocab ids (merge results are vocab ids), added tokens, and the bos,
 * eos and template ids that tokenizer_config.json and the post-processor
 * name. An id >= config.json's vocab_size would compile and then fail (or
 * read past the embedding) at run time, so it is refused here, naming the
 * token, its id and vocab_size. A model vocabulary larger than the
 * tokenizer's (rows padded for alignment) is normal and accepted. */

/* The role of id in the special lists, or NULL. */
static const char *special_role(const cc *c, uint32_t id) {
    if (c->bos >= 0 && (uint32_t)c->bos == id) return "the bos token";
    for (uint32_t i = 0; i < c->n_eos; i++)
        if ((uint32_t)c->eos[i] == id) return "an eos token";
    for (uint32_t i = 0; i < c->n_prefix; i++)
        if ((uint32_t)c->prefix[i] == id) return "a post_processor prefix token";
    for (uint32_t i = 0; i < c->n_suffix; i++)
        if ((uint32_t)c->suffix[i] == id) return "a post_processor suffix token";
    return NULL;
}

static kiln_status check_model_vocab(cc *c, int64_t model_vocab) {
    if (model_vocab <= 0) return KILN_OK;
    uint64_t v = (uint64_t)model_vocab, n_out = 0, lowest = UINT64_MAX, highest = 0;
    str name = {0};
    for (uint64_t id = v; id < c->n_ids; id++) {
        if (!c->present[id]) continue;
        if (n_out++ == 0) lowest = id, name = c->id_str[id];
        highest = id;
    }
    for (uint32_t k = 0; k < c->n_added; k++) {
        uint64_t id = c->added[k].id;
        if (id < v || (id < c->n_ids && c->present[id])) continue; /* counted above */
        n_out++;
        if (id < lowest) lowest = id, name = c->added[k].content;
        if (id > highest) highest = id;
    }
    if (n_out == 0) return KILN_OK;
    char b[96], role[64] = "";
    const char *r = special_role(c, (uint32_t)lowest);
    if (r) snprintf(role, sizeof role, " (%s)", r);
    kiln_err(c->err, KILN_ERR_PARSE,
             "%s: token \"%s\"%s has id %llu, outside the model's vocabulary: config.json's vocab_size is %lld "
             "(%llu tokenizer ids are outside it, the highest %llu)",
             c->label, show(name, b, sizeof b), role, (unsigned long long)lowest, (long long)model_vocab,
             (unsigned long long)n_out, (unsigned long long)highest);
    return kiln_err_hint(c->err, "this tokenizer.json is not this model's, or config.json's vocab_size is wrong");
}

static kiln_status load_json(const char *text, size_t len, const char *label, size_t flags, json_t **out, kiln_error *err) {
    json_error_t je;
    *out = json_loadb(text, len, JSON_REJECT_DUPLICATES | JSON_ALLOW_NUL | flags, &je);
    if (!*out)
        return kiln_err(err, KILN_ERR_PARSE, "%s:%d:%d: malformed JSON: %s", label, je.line, je.column, je.text);
    if (!json_is_object(*out)) {
        json_decref(*out);
        *out = NULL;
        return kiln_err(err, KILN_ERR_PARSE, "%s: expected a JSON object at the top level", label);
    }
    return KILN_OK;
}

static kiln_status compile_impl(const char *json, size_t len, const char *label, const char *config_json, size_t config_len,
                                const char *config_label, int64_t model_vocab, kiln_buf *out, kiln_error *err) {
    cc c = {.label = label ? label : "tokenizer.json", .config_label = config_label, .err = err, .bos = -1};
    kiln_status st = load_json(json, len, c.label, 0, &c.root, err);
    if (st != KILN_OK) return st;
    /* tokenizer_config.json holds numbers like model_max_length = 1e30 written as integers: read them as reals */
    if (config_json &&
        (st = load_json(config_json, config_len, config_label, JSON_DECODE_INT_AS_REAL, &c.config, err)) != KILN_OK)
        goto out;

    str version;
    if ((st = get_str(&c, c.root, "version", "(top level)", false, &version)) != KILN_OK) goto out;
    if (version.p && !str_is(version, "1.0")) {
        char b[32];
        st = perr(&c, KILN_ERR_UNSUPPORTED, "version \"%s\" is not supported (expected \"1.0\")", show(version, b, sizeof b));
        goto out;
    }
    if (!is_null(json_object_get(c.root, "truncation"))) {
        st = perr(&c, KILN_ERR_UNSUPPORTED, "truncation is set; kiln never truncates\nhint: set \"truncation\": null");
        goto out;
    }
    if (!is_null(json_object_get(c.root, "padding"))) {
        st = perr(&c, KILN_ERR_UNSUPPORTED, "padding is set; kiln never pads\nhint: set \"padding\": null");
        goto out;
    }
    int n_templates = 0;
    if ((st = parse_model(&c)) != KILN_OK) goto out;
    if ((st = parse_normalizer(&c, json_object_get(c.root, "normalizer"), "normalizer")) != KILN_OK) goto out;
    if ((st = parse_pretok(&c, json_object_get(c.root, "pre_tokenizer"), "pre_tokenizer")) != KILN_OK) goto out;
    if ((c.model_flags & KILN_TOK_MF_BYTE_LEVEL) && (c.model_flags & KILN_TOK_MF_BYTE_FALLBACK)) {
        st = perr(&c, KILN_ERR_UNSUPPORTED, "model.byte_fallback with a ByteLevel pre-tokenizer is not supported");
        goto out;
    }
    if ((st = parse_decoder(&c, json_object_get(c.root, "decoder"), "decoder", true)) != KILN_OK) goto out;
    if ((st = parse_post(&c, json_object_get(c.root, "post_processor"), "post_processor", &n_templates)) != KILN_OK) goto out;
    if ((st = parse_added(&c)) != KILN_OK) goto out;
    if ((st = parse_config(&c)) != KILN_OK) goto out;
    if ((st = check_ids(&c)) != KILN_OK) goto out;
    if ((st = check_model_vocab(&c, model_vocab)) != KILN_OK) goto out;
    st = write_blob(&c, out);
    /* the runtime's own checks (decoder order, regex, ...) run on the result, so a blob that
       compiles is a blob that loads */
    if (st == KILN_OK) {
        kiln_tokenizer *tok = NULL;
        st = kiln_tokenizer_load(out->data, out->len, &tok, err);
        if (st != KILN_OK) kiln_err_prefix(err, "%s: ", c.label);
        kiln_tokenizer_free(tok);
    }
out:
    for (uint32_t i = 0; i < c.n_pre; i++) free(c.pre[i].owned);
    free(c.id_str);
    free(c.present);
    free(c.merges);
    free(c.added);
    json_decref(c.added_map);
    json_decref(c.root);
    json_decref(c.config);
    return st;
}

kiln_status kiln_tokjson_compile_mem(const char *json, size_t len, const char *config_json, size_t config_len,
                                     const char *label, kiln_buf *out, kiln_error *err) {
    return compile_impl(json, len, label, config_json, config_len, "tokenizer_config.json", 0, out, err);
}

kiln_status kiln_tokjson_compile_for_vocab_mem(const char *json, size_t len, const char *config_json,
                                               size_t config_len, const char *label, int64_t model_vocab,
                                               kiln_buf *out, kiln_error *err) {
    return compile_impl(json, len, label, config_json, config_len, "tokenizer_config.json", model_vocab, out, err);
}

kiln_status kiln_tokjson_compile(const char *tokenizer_json_path, const char *tokenizer_config_path, kiln_buf *out,
                                 kiln_error *err) {
    return kiln_tokjson_compile_for_vocab(tokenizer_json_path, tokenizer_config_path, 0, out, err);
}

kiln_status kiln_tokjson_compile_for_vocab(const char *tokenizer_json_path, const char *tokenizer_config_path,
                                           int64_t model_vocab, kiln_buf *out, kiln_error *err) {
    char *text = NULL, *conf = NULL;
    size_t len = 0, conf_len = 0;
    kiln_status st = kiln_file_read(tokenizer_json_path, TOKJSON_MAX_FILE, &text, &len, err);
    if (st != KILN_OK) return st;
    if (tokenizer_config_path && (st = kiln_file_read(tokenizer_config_path, 64u << 20, &conf, &conf_len, err)) != KILN_OK) {
        free(text);
        return st;
    }
    st = compile_impl(text, len, tokenizer_json_path, conf, conf_len, tokenizer_config_path, model_vocab, out, err);
    free(text);
    free(conf);
    return st;
}

kiln_status kiln_tokenizer_load_json(const char *path, kiln_tokenizer **out, kiln_error *err) {
    *out = NULL;
    char *json_path = NULL, *dir = NULL, *conf_path = NULL;
    kiln_status st = KILN_OK;
    if (kiln_path_is_dir(path)) {
        dir = strdup(path);
        json_path = kiln_path_join(path, "tokenizer.json");
    } else {
        json_path = strdup(path);
        const char *slash = strrchr(path, '/');
        dir = slash ? strndup(path, (size_t)(slash - path)) : strdup(".");
    }
    if (!json_path || !dir) {
        st = kiln_err(err, KILN_ERR_NOMEM, "out of memory");
        goto out;
    }
    if (!kiln_path_exists(json_path)) {
        st = kiln_err(err, KILN_ERR_MISSING, "%s: no such file", json_path);
        goto out;
    }
    conf_path = kiln_path_join(dir, "tokenizer_config.json");
    if (!conf_path) {
        st = kiln_err(err, KILN_ERR_NOMEM, "out of memory");
        goto out;
    }
    kiln_buf blob = {0};
    st = kiln_tokjson_compile(json_path, kiln_path_exists(conf_path) ? conf_path : NULL, &blob, err);
    if (st == KILN_OK) st = kiln_tokenizer_load(blob.data, blob.len, out, err);
    kiln_buf_free(&blob);
out:
    free(json_path);
    free(dir);
    free(conf_path);
    return st;
}
