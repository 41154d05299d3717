/*
 * kiln_tokjson.h — tokenizer.json (+ tokenizer_config.json) → the compact
 * tokenizer blob that the runtime loads (format: runtime/kiln_tokenizer.h,
 * docs/tokenizer.md). The compile driver stores the blob as the engine
 * file's tokenizer section, as-is.
 *
 * The compiler resolves everything HF resolves when it loads the file —
 * merges to id triples, added-token ids (HF assigns them by content; the
 * "id" fields of tokenizer.json are only checked by HF, never used), the
 * post-processor template to prefix/suffix ids, bos/eos from
 * tokenizer_config.json — so the runtime needs no JSON. What kiln cannot
 * reproduce exactly is refused by name with KILN_ERR_UNSUPPORTED: models
 * other than BPE (WordPiece, Unigram, WordLevel), and normalizers,
 * pre-tokenizers, post-processors and decoders outside the supported set
 * listed in kiln_tokenizer.h. Malformed JSON or fields of the wrong type are
 * KILN_ERR_PARSE naming the file, line/field and what was expected.
 */
#ifndef KILN_TOKJSON_H
#define KILN_TOKJSON_H

#include <stddef.h>
#include <stdint.h>

#include "../common/kiln_util.h"
#include "../runtime/kiln_tokenizer.h"

/* Compile files. `tokenizer_config_path` may be NULL (then bos/eos come from
 * the post-processor template). `out_blob` is appended to; on failure its
 * content is unspecified and the caller frees it either way. */
kiln_status kiln_tokjson_compile(const char *tokenizer_json_path, const char *tokenizer_config_path,
                                 kiln_buf *out_blob, kiln_error *err);

/* The same over text in memory (tests, fuzzing). `config_json` may be NULL.
 * `label` names the input in messages. */
kiln_status kiln_tokjson_compile_mem(const char *json, size_t len, const char *config_json, size_t config_len,
                                     const char *label, kiln_buf *out_blob, kiln_error *err);

/* The same, for the model whose config.json has `model_vocab` ids (0 = no
 * check): every id the tokenizer can produce (vocab, added tokens, bos/eos,
 * template ids) must be below it, else KILN_ERR_PARSE naming the token, its
 * id and vocab_size. The compile driver uses these. */
kiln_status kiln_tokjson_compile_for_vocab(const char *tokenizer_json_path, const char *tokenizer_config_path,
                                           int64_t model_vocab, kiln_buf *out_blob, kiln_error *err);
kiln_status kiln_tokjson_compile_for_vocab_mem(const char *json, size_t len, const char *config_json,
                                               size_t config_len, const char *label, int64_t model_vocab,
                                               kiln_buf *out_blob, kiln_error *err);

/* Compile and load in one step: `path` is a tokenizer.json file or a
 * directory holding one; a tokenizer_config.json beside it is used when
 * present. For tests and `kiln tokenize`. */
kiln_status kiln_tokenizer_load_json(const char *path, kiln_tokenizer **out, kiln_error *err);

/* The ids text `kiln tokenize --decode` reads: a JSON array of integers in
 * 0..INT32_MAX (whitespace around it allowed). On success *ids is malloc'd
 * (the caller frees it, also when *n is 0). `label` names the input in messages. */
kiln_status kiln_tokenize_parse_ids(const char *text, size_t len, const char *label, int32_t **ids, size_t *n,
                                    kiln_error *err);

/* `kiln tokenize` (compiler/cmd_tokenize.c); argv[0] is "tokenize". Returns the exit code. */
int kiln_cmd_tokenize(int argc, char **argv);

#endif /* KILN_TOKJSON_H */
