/*
 * output_check.c — refuse an output path that would destroy an input or
 * cannot be an engine file, before any heavy work.
 *
 * The engine writer renames its temporary file over the output path, so an
 * output that is one of the checkpoint's files replaces it. Rules:
 *   - the output exists and is a directory, a FIFO, a device...: refused
 *     (only a regular file is ever replaced);
 *   - the folder the output goes into does not exist: refused;
 *   - the output is the same file (device + inode, so through symbolic and
 *     hard links too) as a file the compile reads — config.json, the index,
 *     a shard, tokenizer.json, tokenizer_config.json: always refused;
 *   - the output lies inside the checkpoint directory (or a folder below
 *     it) but is none of those: refused unless `force` (--force).
 * Identity is decided by stat(2) (links followed), never by comparing path
 * strings, so "./ckpt/../ckpt/model.safetensors" is caught as well.
 */
#include "kiln_compiler.h"

#include <errno.h>
#include <libgen.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static bool same_file(const struct stat *a, const struct stat *b) {
    return a->st_dev == b->st_dev && a->st_ino == b->st_ino;
}

/* The output path itself: a regular file or nothing, in a folder that exists. */
kiln_status kiln_output_precheck(const char *out, kiln_error *err) {
    if (!out || !*out) return kiln_err(err, KILN_ERR_INVALID_ARG, "no output path");
    struct stat st;
    if (stat(out, &st) == 0) {
        if (S_ISDIR(st.st_mode)) {
            kiln_err(err, KILN_ERR_INVALID_ARG, "-o %s: is a directory", out);
            return kiln_err_hint(err, "give the engine file's path, e.g. -o %s/model.kiln", out);
        }
        if (!S_ISREG(st.st_mode)) {
            kiln_err(err, KILN_ERR_INVALID_ARG, "-o %s: exists and is not a regular file (%s)", out,
                     S_ISFIFO(st.st_mode) ? "a FIFO" : S_ISSOCK(st.st_mode) ? "a socket" : "a device");
            return kiln_err_hint(err, "kiln replaces the output file; write the engine to a new path");
        }
        return KILN_OK;
    }
    if (errno != ENOENT) return kiln_err(err, KILN_ERR_IO, "-o %s: %s", out, strerror(errno));
    char *copy = strdup(out);
    if (!copy) return kiln_err(err, KILN_ERR_NOMEM, "out of memory");
    const char *parent = dirname(copy);
    kiln_status s = KILN_OK;
    int e = stat(parent, &st) != 0 ? errno : S_ISDIR(st.st_mode) ? 0 : ENOTDIR;
    if (e) {
        s = kiln_err(err, KILN_ERR_IO, "-o %s: the folder %s: %s", out, parent, strerror(e));
        kiln_err_hint(err, "create the folder first, or write the engine elsewhere");
    }
    free(copy);
    return s;
}

/* Is `dir_st` the folder `path` lies in, or one above it? */
static kiln_status inside(const char *path, const struct stat *dir_st, bool *yes, kiln_error *err) {
    *yes = false;
    char *copy = strdup(path);
    char *real = copy ? realpath(dirname(copy), NULL) : NULL;
    free(copy);
    if (!real) return kiln_err(err, KILN_ERR_IO, "-o %s: cannot resolve its folder: %s", path, strerror(errno));
    for (;;) {
        struct stat st;
        if (stat(real, &st) == 0 && same_file(&st, dir_st)) {
            *yes = true;
            break;
        }
        char *slash = strrchr(real, '/');
        if (!slash || slash == real) {
            if (slash && real[1] && stat("/", &st) == 0 && same_file(&st, dir_st)) *yes = true;
            break;
        }
        *slash = 0;
    }
    free(real);
    return KILN_OK;
}

/* Refuse when `out_st` is the file at `path` (when that exists). */
static kiln_status not_input(const char *out, const struct stat *out_st, const char *path, kiln_error *err) {
    struct stat st;
    if (!path || stat(path, &st) != 0 || !same_file(&st, out_st)) return KILN_OK;
    kiln_err(err, KILN_ERR_INVALID_ARG, "-o %s: is the input file %s; writing the engine there would destroy it", out,
             path);
    return kiln_err_hint(err, "write the engine outside the checkpoint, e.g. -o model.kiln");
}

static kiln_status not_named_input(const char *out, const struct stat *out_st, const kiln_checkpoint *ck,
                                   const char *name, kiln_error *err) {
    char *p = kiln_path_join(ck->dir, name);
    if (!p) return kiln_err(err, KILN_ERR_NOMEM, "out of memory");
    kiln_status s = not_input(out, out_st, p, err);
    free(p);
    return s;
}

kiln_status kiln_output_check(const char *out, const kiln_checkpoint *ck, bool force, kiln_error *err) {
    kiln_status s = kiln_output_precheck(out, err);
    if (s != KILN_OK) return s;
    struct stat out_st, dir_st;
    if (stat(out, &out_st) == 0) {
        for (size_t i = 0; i < ck->n_shards && s == KILN_OK; i++)
            s = not_input(out, &out_st, ck->shards[i].map.path, err);
        if (s == KILN_OK) s = not_input(out, &out_st, ck->tokenizer_json_path, err);
        if (s == KILN_OK) s = not_input(out, &out_st, ck->tokenizer_config_path, err);
        if (s == KILN_OK) s = not_named_input(out, &out_st, ck, "config.json", err);
        if (s == KILN_OK) s = not_named_input(out, &out_st, ck, "model.safetensors.index.json", err);
        if (s == KILN_OK) s = not_named_input(out, &out_st, ck, "generation_config.json", err);
        if (s != KILN_OK) return s;
    }
    if (force) return KILN_OK;
    if (stat(ck->dir, &dir_st) != 0) return kiln_err(err, KILN_ERR_IO, "%s: %s", ck->dir, strerror(errno));
    bool in = false;
    if ((s = inside(out, &dir_st, &in, err)) != KILN_OK) return s;
    if (in) {
        kiln_err(err, KILN_ERR_INVALID_ARG, "-o %s: inside the checkpoint directory %s", out, ck->dir);
        return kiln_err_hint(err, "write the engine outside the checkpoint, or pass --force to write it there "
                                  "anyway (never over one of its input files)");
    }
    return KILN_OK;
}
