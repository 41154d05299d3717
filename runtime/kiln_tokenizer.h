/*
 * kiln_tokenizer.h — the tokenizer runtime: text → ids and ids → text with
 * exactly the results of HuggingFace `tokenizers` for the same tokenizer.json.
 *
 * The compiler (compiler/kiln_tokjson.h) turns tokenizer.json (and
 * tokenizer_config.json) into a compact binary blob, stored as the engine
 * file's tokenizer section. This runtime loads that blob — treating it as
 * hostile input — builds its hash tables in a few milliseconds, and encodes
 * and decodes. No JSON parser, no Python, no ICU at runtime: the Llama 3,
 * Qwen2 and GPT-2 pre-tokenizer regexes are matched by built-in code over
 * character tables read from HF's own engine, other regexes by PCRE2, and
 * generated tables (runtime/tokenizer_unicode_tables.c) do NFC.
 * docs/tokenizer.md tells the whole story.
 *
 * Supported (anything else is refused by name at compile time):
 *   model          BPE (merges by rank, byte_fallback, unk/fuse_unk, ignore_merges)
 *   normalizer     Prepend, Replace (string pattern), NFC, Sequence of those
 *   pre_tokenizer  Split (regex or string, Isolated), ByteLevel (add_prefix_space
 *                  false, with or without its GPT-2 regex), Sequence of those
 *   post_processor TemplateProcessing, ByteLevel, Sequence of those
 *   decoder        ByteLevel; or Sequence of Replace*, ByteFallback, Fuse, Strip
 *   added tokens   special or not, lstrip, rstrip, normalized (not single_word)
 *
 * ---- The blob (format version 1.0; all integers little-endian) ----
 *
 *   header, 16 bytes:
 *     0  u8[8]  magic "KILNTOK\0"
 *     8  u16    major (1; a reader refuses another major)
 *    10  u16    minor (0; additions only)
 *    12  u32    chunk count (≤ 64)
 *   chunks, back to back, each:
 *     u32 tag (four ASCII bytes, e.g. "VOCB" stored as 'V','O','C','B'),
 *     u32 payload size, payload, zero padding to a multiple of 4.
 *   Unknown tags are skipped (room for minor versions); each known tag
 *   appears at most once. Chunks:
 *
 *   "MODL" (required)  u32 model type (1 = BPE); u32 flags (bit 0 byte_fallback,
 *                      bit 1 fuse_unk, bit 2 ignore_merges, bit 3 byte-level
 *                      input: words are raw bytes, each token's bytes are its
 *                      string through the GPT-2 byte↔char table); i32 unk id (-1
 *                      none); u32 HF vocab size (entries of model.vocab)
 *   "VOCB" (required)  u32 n_ids (the id space, 1..2^24); u32 n_bytes;
 *                      u32 end[n_ids] (token i = bytes[end[i-1] .. end[i]),
 *                      end[-1] = 0, non-decreasing, end[n_ids-1] = n_bytes);
 *                      u8 present[n_ids] (1 = id i is in model.vocab, 0 = hole);
 *                      u8 bytes[n_bytes] (UTF-8 token strings as in tokenizer.json)
 *   "MERG"             u32 n; n × {u32 left id, u32 right id, u32 merged id}
 *                      in rank order (rank = index; a repeated pair takes the
 *                      later rank, as HF's map does)
 *   "ADDT"             u32 n; n × {u32 id, u32 flags, u32 content length}; then
 *                      the contents back to back. flags: bit 0 special, bit 1
 *                      lstrip, bit 2 rstrip, bit 3 normalized. Ids as HF
 *                      assigns them (tokenizer.json's "id" is only a hint to
 *                      HF too); one entry per id, ascending.
 *   "NORM", "PRET", "DECO"   u32 n; n steps, each
 *                      {u32 kind, u32 arg0, u32 arg1, u32 len a, u32 len b,
 *                       u8 a[len a], u8 b[len b], zero padding to 4}
 *     NORM kinds: 1 Prepend(a)  2 Replace(a → b)  3 NFC
 *     PRET kinds: 1 Split(regex a; Isolated)  2 ByteLevel(arg0 = use GPT-2 regex)
 *     DECO kinds: 1 ByteLevel  2 Replace(a → b)  3 ByteFallback  4 Fuse
 *                 5 Strip(char a, arg0 = start, arg1 = stop)
 *   "POST"             u32 n prefix, u32 n suffix, then the ids: what
 *                      KILN_TOK_ADD_SPECIAL puts before and after the text
 *   "SPEC"             i32 bos id (-1 none); u32 n eos (≤ 8); eos ids
 *
 * Thread safety: a loaded tokenizer is read-only; encode and decode may run
 * on it from many threads at once (each call allocates its own scratch).
 */
#ifndef KILN_TOKENIZER_H
#define KILN_TOKENIZER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../common/kiln_util.h"

#define KILN_TOK_MAGIC "KILNTOK"       /* 8 bytes with the NUL */
#define KILN_TOK_MAJOR 1
#define KILN_TOK_MINOR 0
#define KILN_TOK_MAX_IDS (1u << 24)    /* id space cap */
#define KILN_TOK_MAX_EOS 8

typedef struct kiln_tokenizer kiln_tokenizer;

/* Load a blob made by kiln_tokjson_compile. The blob is copied; the caller
 * may free it afterwards. A truncated, corrupted or foreign blob is refused
 * with KILN_ERR_FORMAT (or KILN_ERR_VERSION / KILN_ERR_UNSUPPORTED) naming
 * the chunk and field at fault. */
kiln_status kiln_tokenizer_load(const uint8_t *blob, size_t len, kiln_tokenizer **out, kiln_error *err);
void kiln_tokenizer_free(kiln_tokenizer *tok);

/* Encode flags. */
#define KILN_TOK_ADD_SPECIAL 1u /* add bos/eos around the text as HF add_special_tokens=True does */
#define KILN_TOK_NO_SPECIAL 2u  /* special-token strings in the text are plain text (HF
                                   encode_special_tokens=True; non-special added tokens
                                   such as qwen3's <think> still match) */

/* Encode `len` bytes of UTF-8 text. On success *ids is a malloc'd array of
 * *n ids (NULL when *n is 0) the caller frees. Invalid UTF-8 is refused
 * (KILN_ERR_TOKENIZER, naming the byte offset). */
kiln_status kiln_tokenizer_encode(const kiln_tokenizer *tok, const char *text, size_t len, unsigned flags,
                                  int32_t **ids, size_t *n, kiln_error *err);

/* Decode ids to text exactly as HF decode(ids, skip_special_tokens) does. On
 * success *text is a malloc'd NUL-terminated string of *len bytes (valid
 * UTF-8; bytes that do not form characters become U+FFFD as in HF). An id
 * outside the vocabulary is refused (KILN_ERR_TOKENIZER) where HF would drop it. */
kiln_status kiln_tokenizer_decode(const kiln_tokenizer *tok, const int32_t *ids, size_t n, bool skip_special,
                                  char **text, size_t *len, kiln_error *err);

/* ---- accessors ---- */
uint32_t kiln_tokenizer_vocab_size(const kiln_tokenizer *tok); /* the id space: max id + 1 */
int32_t kiln_tokenizer_bos(const kiln_tokenizer *tok);         /* -1 when the tokenizer has none */
/* The eos ids (tokenizer_config.json's eos_token, else the template's last special); returns the count. */
int kiln_tokenizer_eos(const kiln_tokenizer *tok, const int32_t **ids);
/* The token's string as tokenizer.json spells it ("ĠHello", "▁the", "<s>"),
 * not NUL-terminated; NULL for an id outside the vocabulary. */
const char *kiln_tokenizer_token(const kiln_tokenizer *tok, int32_t id, size_t *len);
/* Id of an exact token string (added tokens first, then the model's
 * vocabulary), or -1. Hashed, except a byte-level model's own tokens, which
 * are searched linearly (the hash is keyed by bytes): not for hot loops. */
int32_t kiln_tokenizer_token_id(const kiln_tokenizer *tok, const char *s, size_t len);
bool kiln_tokenizer_is_special(const kiln_tokenizer *tok, int32_t id);

/* ---- incremental decoding, for streaming ----
 *
 * Push ids one by one; each push returns the text that became final, never
 * half a UTF-8 character: bytes of a character split across byte-level
 * tokens or byte-fallback pieces (<0xE4><0xB8><0xAD>) are held until the
 * character is complete. finish() returns what is still held (an incomplete
 * character at the end becomes U+FFFD, as in a full decode). The
 * concatenation of everything returned equals kiln_tokenizer_decode of all
 * ids, with one documented exception: a byte-fallback run that turns out to
 * be invalid UTF-8 after some valid characters were printed (HF replaces the
 * whole run, one U+FFFD per byte; the stream already printed the valid
 * characters and replaces only the rest).
 * The returned pointer is valid until the next call on the stream. */
typedef struct kiln_tok_stream {
    const kiln_tokenizer *tok;
    bool skip_special;
    uint8_t pending[4];   /* bytes of an unfinished character */
    uint8_t n_pending;
    bool in_run;          /* inside a byte-fallback run */
    bool run_bad;         /* that run already had invalid bytes */
    uint32_t strip_left;  /* leading Strip characters still to drop */
    kiln_buf out;         /* the text returned by the last call */
} kiln_tok_stream;

void kiln_tok_stream_init(kiln_tok_stream *s, const kiln_tokenizer *tok, bool skip_special);
kiln_status kiln_tok_stream_push(kiln_tok_stream *s, int32_t id, const char **text, size_t *len, kiln_error *err);
kiln_status kiln_tok_stream_finish(kiln_tok_stream *s, const char **text, size_t *len, kiln_error *err);
void kiln_tok_stream_free(kiln_tok_stream *s);

#endif /* KILN_TOKENIZER_H */
