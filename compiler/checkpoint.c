/*
 * checkpoint.c — a HuggingFace checkpoint directory → config + one sorted
 * name index over the tensors of all its safetensors shards.
 *
 * Which files hold the weights, in order of preference:
 *   1. model.safetensors.index.json: {"metadata": {...},
 *        "weight_map": {"<tensor name>": "<shard file name>", ...}}
 *      Every shard it names must exist in the directory (plain file names
 *      only: no '/', no "." or ".."), each is opened once, and every tensor it
 *      lists must be in the shard it names.
 *   2. model.safetensors.
 *   3. the only *.safetensors file in the directory (two or more without an
 *      index are refused: which ones belong together is unknown).
 * A tensor name present in two shards is refused, naming both.
 *
 * Ownership: the kiln_checkpoint owns its shards (mmapped) and the index
 * array; index entries point into the shards' tensor tables.
 */
#include "kiln_compiler.h"

#include <dirent.h>
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CK_MAX_INDEX_FILE (64u << 20)
#define CK_INDEX_NAME "model.safetensors.index.json"

/* A tensor with the shard it came from, while building the index. */
typedef struct ck_entry {
    const kiln_st_tensor *t;
    size_t shard;
} ck_entry;

/* By name, then by shard (so a duplicate's message is deterministic). */
static int ck_cmp_entry(const void *a, const void *b) {
    const ck_entry *x = a, *y = b;
    int c = strcmp(x->t->name, y->t->name);
    if (c) return c;
    return (x->shard > y->shard) - (x->shard < y->shard);
}

static int ck_cmp_str(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* Binary search of a shard's name-sorted tensor table. */
static const kiln_st_tensor *ck_find_in(const kiln_st_file *f, const char *name) {
    size_t lo = 0, hi = f->n_tensors;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int c = strcmp(f->tensors[mid].name, name);
        if (c == 0) return &f->tensors[mid];
        if (c < 0) lo = mid + 1;
        else hi = mid;
    }
    return NULL;
}

static bool ck_plain_name(const char *s) {
    return s[0] && !strchr(s, '/') && strcmp(s, ".") != 0 && strcmp(s, "..") != 0;
}

/* Open shard file `name` of the directory as ck->shards[ck->n_shards++]. */
static kiln_status ck_open_shard(kiln_checkpoint *ck, const char *name, kiln_error *err) {
    char *p = kiln_path_join(ck->dir, name);
    if (!p) return kiln_err(err, KILN_ERR_NOMEM, "%s: out of memory", ck->dir);
    kiln_status st = kiln_st_open(p, &ck->shards[ck->n_shards], err);
    free(p);
    if (st == KILN_OK) ck->n_shards++;
    return st;
}

/* Weights from model.safetensors.index.json (`index_path`). */
static kiln_status ck_open_indexed(kiln_checkpoint *ck, const char *index_path, kiln_error *err) {
    char *text = NULL;
    size_t len = 0;
    const char **names = NULL;
    kiln_status st = kiln_file_read(index_path, CK_MAX_INDEX_FILE, &text, &len, err);
    if (st) return st;
    json_error_t je;
    json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &je);
    free(text);
    if (!root)
        return kiln_err(err, KILN_ERR_PARSE, "%s: not valid JSON: %s (line %d, column %d)", index_path, je.text,
                        je.line, je.column);
    json_t *wm = json_is_object(root) ? json_object_get(root, "weight_map") : NULL;
    if (!json_is_object(root)) {
        st = kiln_err(err, KILN_ERR_PARSE, "%s: the top level is not a JSON object", index_path);
        goto out;
    }
    if (!wm) {
        st = kiln_err(err, KILN_ERR_MISSING, "%s: no \"weight_map\"", index_path);
        goto out;
    }
    if (!json_is_object(wm)) {
        st = kiln_err(err, KILN_ERR_PARSE, "%s: \"weight_map\" is not an object of tensor name → shard file",
                      index_path);
        goto out;
    }
    size_t n = json_object_size(wm);
    if (n == 0) {
        st = kiln_err(err, KILN_ERR_MISSING, "%s: \"weight_map\" lists no tensors", index_path);
        goto out;
    }

    /* distinct shard names, checked, sorted */
    names = malloc(n * sizeof *names);
    if (!names) {
        st = kiln_err(err, KILN_ERR_NOMEM, "%s: out of memory", index_path);
        goto out;
    }
    size_t k = 0;
    const char *tname;
    json_t *v;
    json_object_foreach(wm, tname, v) {
        if (!json_is_string(v)) {
            st = kiln_err(err, KILN_ERR_PARSE, "%s: weight_map entry \"%s\" is not a string (a shard file name)",
                          index_path, tname);
            goto out;
        }
        const char *s = json_string_value(v);
        if (!ck_plain_name(s)) {
            st = kiln_err(err, KILN_ERR_PARSE,
                          "%s: weight_map entry \"%s\" names shard \"%s\", which is not a plain file name in the directory",
                          index_path, tname, s);
            goto out;
        }
        names[k++] = s;
    }
    qsort(names, k, sizeof *names, ck_cmp_str);
    size_t n_distinct = 0;
    for (size_t i = 0; i < k; i++)
        if (i == 0 || strcmp(names[i], names[n_distinct - 1]) != 0) names[n_distinct++] = names[i];

    ck->shards = calloc(n_distinct, sizeof *ck->shards);
    if (!ck->shards) {
        st = kiln_err(err, KILN_ERR_NOMEM, "%s: out of memory", index_path);
        goto out;
    }
    for (size_t i = 0; i < n_distinct; i++) {
        char *p = kiln_path_join(ck->dir, names[i]);
        bool exists = p && kiln_path_exists(p);
        free(p);
        if (!exists) {
            st = kiln_err(err, KILN_ERR_MISSING, "%s: names shard \"%s\", which is not in %s", index_path, names[i],
                          ck->dir);
            kiln_err_hint(err, "download every shard the index lists");
            goto out;
        }
        if ((st = ck_open_shard(ck, names[i], err))) goto out;
    }

    /* every tensor in the shard the index names */
    json_object_foreach(wm, tname, v) {
        const char *s = json_string_value(v);
        const char **hit = bsearch(&s, names, n_distinct, sizeof *names, ck_cmp_str);
        size_t si = (size_t)(hit - names); /* found: the shard list was made from these values */
        if (!ck_find_in(&ck->shards[si], tname)) {
            st = kiln_err(err, KILN_ERR_MISSING, "%s: tensor \"%s\" is listed in shard \"%s\", which does not hold it",
                          index_path, tname, s);
            goto out;
        }
    }
out:
    free(names);
    json_decref(root);
    return st;
}

/* The only *.safetensors file of the directory, as a malloc'd name. */
static kiln_status ck_only_safetensors(const char *dir, char **out, kiln_error *err) {
    *out = NULL;
    DIR *d = opendir(dir);
    if (!d) return kiln_err(err, KILN_ERR_IO, "%s: cannot list the directory: %s", dir, strerror(errno));
    kiln_status st = KILN_OK;
    struct dirent *e;
    while ((e = readdir(d))) {
        size_t l = strlen(e->d_name);
        const char *ext = ".safetensors";
        if (l <= strlen(ext) || strcmp(e->d_name + l - strlen(ext), ext) != 0) continue;
        if (*out) {
            st = kiln_err(err, KILN_ERR_MISSING,
                          "%s: several *.safetensors files (%s, %s...) and no model.safetensors.index.json", dir, *out,
                          e->d_name);
            kiln_err_hint(err, "a sharded checkpoint needs its %s to say which tensor is in which shard",
                          CK_INDEX_NAME);
            free(*out);
            *out = NULL;
            break;
        }
        *out = strdup(e->d_name);
        if (!*out) {
            st = kiln_err(err, KILN_ERR_NOMEM, "%s: out of memory", dir);
            break;
        }
    }
    closedir(d);
    if (st == KILN_OK && !*out) {
        st = kiln_err(err, KILN_ERR_MISSING, "%s: no weights: no %s, no model.safetensors, no *.safetensors file", dir,
                      CK_INDEX_NAME);
        kiln_err_hint(err, "kiln reads safetensors checkpoints; convert a PyTorch .bin checkpoint with "
                           "transformers' save_pretrained(safe_serialization=True)");
    }
    return st;
}

/* One sorted index over all shards; duplicates across shards refused. */
static kiln_status ck_build_index(kiln_checkpoint *ck, kiln_error *err) {
    size_t total = 0;
    for (size_t i = 0; i < ck->n_shards; i++) total += ck->shards[i].n_tensors;
    ck_entry *es = malloc((total ? total : 1) * sizeof *es);
    ck->index = malloc((total ? total : 1) * sizeof *ck->index);
    if (!es || !ck->index) {
        free(es);
        return kiln_err(err, KILN_ERR_NOMEM, "%s: out of memory for %zu tensors", ck->dir, total);
    }
    size_t k = 0;
    for (size_t i = 0; i < ck->n_shards; i++)
        for (size_t j = 0; j < ck->shards[i].n_tensors; j++) es[k++] = (ck_entry){&ck->shards[i].tensors[j], i};
    qsort(es, total, sizeof *es, ck_cmp_entry);
    for (size_t i = 0; i < total; i++) {
        if (i > 0 && strcmp(es[i].t->name, es[i - 1].t->name) == 0) {
            kiln_status st = kiln_err(err, KILN_ERR_PARSE, "%s: tensor \"%s\" is in two shards: %s and %s", ck->dir,
                                      es[i].t->name, ck->shards[es[i - 1].shard].map.path,
                                      ck->shards[es[i].shard].map.path);
            free(es);
            return st;
        }
        ck->index[i] = es[i].t;
    }
    ck->n_index = total;
    free(es);
    return KILN_OK;
}

/* Path of `name` in the dir when something is there (a file, or a link even
 * a broken one, so that opening it reports what is wrong), else NULL. */
static kiln_status ck_optional_file(const char *dir, const char *name, char **out, kiln_error *err) {
    *out = kiln_path_join(dir, name);
    if (!*out) return kiln_err(err, KILN_ERR_NOMEM, "%s: out of memory", dir);
    if (!kiln_path_exists(*out)) {
        free(*out);
        *out = NULL;
    }
    return KILN_OK;
}

kiln_status kiln_checkpoint_open(const char *dir, kiln_checkpoint *out, kiln_error *err) {
    memset(out, 0, sizeof *out);
    kiln_status st;
    char *cfg_path = NULL, *index_path = NULL, *single = NULL, *only = NULL;
    if ((st = kiln_dir_check(dir, err)) != KILN_OK) {
        if (st == KILN_ERR_INVALID_ARG)
            return kiln_err_hint(err, "pass the folder holding config.json and the *.safetensors files, not a file "
                                      "in it");
        if (err && !strchr(err->msg, '\n'))
            kiln_err_hint(err, "pass the checkpoint directory (the folder holding config.json and *.safetensors)");
        return st;
    }
    out->dir = strdup(dir);
    if (!out->dir) return kiln_err(err, KILN_ERR_NOMEM, "%s: out of memory", dir);

    if ((st = ck_optional_file(dir, "config.json", &cfg_path, err))) goto fail;
    if (!cfg_path) {
        st = kiln_err(err, KILN_ERR_MISSING, "%s: no config.json", dir);
        kiln_err_hint(err, "a HuggingFace checkpoint directory has config.json beside its *.safetensors files");
        goto fail;
    }
    if ((st = kiln_config_load(cfg_path, &out->config, err))) goto fail;

    if ((st = ck_optional_file(dir, CK_INDEX_NAME, &index_path, err))) goto fail;
    if (index_path) {
        if ((st = ck_open_indexed(out, index_path, err))) goto fail;
    } else {
        if ((st = ck_optional_file(dir, "model.safetensors", &single, err))) goto fail;
        if (!single && (st = ck_only_safetensors(dir, &only, err))) goto fail;
        out->shards = calloc(1, sizeof *out->shards);
        if (!out->shards) {
            st = kiln_err(err, KILN_ERR_NOMEM, "%s: out of memory", dir);
            goto fail;
        }
        if ((st = ck_open_shard(out, single ? "model.safetensors" : only, err))) goto fail;
    }
    if ((st = ck_build_index(out, err))) goto fail;

    if ((st = ck_optional_file(dir, "tokenizer.json", &out->tokenizer_json_path, err)) ||
        (st = ck_optional_file(dir, "tokenizer_config.json", &out->tokenizer_config_path, err)))
        goto fail;
    free(cfg_path);
    free(index_path);
    free(single);
    free(only);
    return KILN_OK;
fail:
    free(cfg_path);
    free(index_path);
    free(single);
    free(only);
    kiln_checkpoint_close(out);
    return st;
}

void kiln_checkpoint_close(kiln_checkpoint *ck) {
    for (size_t i = 0; i < ck->n_shards; i++) kiln_st_close(&ck->shards[i]);
    free(ck->shards);
    free(ck->index);
    free(ck->dir);
    free(ck->tokenizer_json_path);
    free(ck->tokenizer_config_path);
    memset(ck, 0, sizeof *ck);
}

const kiln_st_tensor *kiln_checkpoint_find(const kiln_checkpoint *ck, const char *name) {
    size_t lo = 0, hi = ck->n_index;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int c = strcmp(ck->index[mid]->name, name);
        if (c == 0) return ck->index[mid];
        if (c < 0) lo = mid + 1;
        else hi = mid;
    }
    return NULL;
}
