/*
 * tokenizer_internal.h — private to runtime/tokenizer*.c: the loaded
 * tokenizer's layout, the blob's chunk and step constants (shared with the
 * compiler, compiler/tokenizer_json.c, which writes them), UTF-8 helpers and
 * the Unicode tables.
 */
#ifndef KILN_TOKENIZER_INTERNAL_H
#define KILN_TOKENIZER_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kiln_tokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

/* ---- blob constants ---- */

#define KILN_TOK_TAG(a, b, c, d) ((uint32_t)(a) | (uint32_t)(b) << 8 | (uint32_t)(c) << 16 | (uint32_t)(d) << 24)
#define KILN_TOK_CHUNK_MODL KILN_TOK_TAG('M', 'O', 'D', 'L')
#define KILN_TOK_CHUNK_VOCB KILN_TOK_TAG('V', 'O', 'C', 'B')
#define KILN_TOK_CHUNK_MERG KILN_TOK_TAG('M', 'E', 'R', 'G')
#define KILN_TOK_CHUNK_ADDT KILN_TOK_TAG('A', 'D', 'D', 'T')
#define KILN_TOK_CHUNK_NORM KILN_TOK_TAG('N', 'O', 'R', 'M')
#define KILN_TOK_CHUNK_PRET KILN_TOK_TAG('P', 'R', 'E', 'T')
#define KILN_TOK_CHUNK_DECO KILN_TOK_TAG('D', 'E', 'C', 'O')
#define KILN_TOK_CHUNK_POST KILN_TOK_TAG('P', 'O', 'S', 'T')
#define KILN_TOK_CHUNK_SPEC KILN_TOK_TAG('S', 'P', 'E', 'C')
#define KILN_TOK_HEADER_SIZE 16
#define KILN_TOK_MAX_CHUNKS 64
#define KILN_TOK_MAX_STEPS 16
#define KILN_TOK_MAX_ADDED (1u << 20)
#define KILN_TOK_MAX_MERGES (1u << 24)
#define KILN_TOK_MAX_TOKEN_BYTES 4096   /* one token's string, and one added token's content */

enum { KILN_TOK_MODEL_BPE = 1 };
enum {
    KILN_TOK_MF_BYTE_FALLBACK = 1u << 0,
    KILN_TOK_MF_FUSE_UNK = 1u << 1,
    KILN_TOK_MF_IGNORE_MERGES = 1u << 2,
    KILN_TOK_MF_BYTE_LEVEL = 1u << 3,
    KILN_TOK_MF_ALL_ = KILN_TOK_MF_BYTE_FALLBACK | KILN_TOK_MF_FUSE_UNK | KILN_TOK_MF_IGNORE_MERGES | KILN_TOK_MF_BYTE_LEVEL,
};
enum {
    KILN_TOK_AF_SPECIAL = 1u << 0,
    KILN_TOK_AF_LSTRIP = 1u << 1,
    KILN_TOK_AF_RSTRIP = 1u << 2,
    KILN_TOK_AF_NORMALIZED = 1u << 3,
    KILN_TOK_AF_ALL_ = 0xFu,
};
enum { KILN_TOK_NORM_PREPEND = 1, KILN_TOK_NORM_REPLACE = 2, KILN_TOK_NORM_NFC = 3 };
enum { KILN_TOK_PRE_SPLIT = 1, KILN_TOK_PRE_BYTELEVEL = 2 };
enum {
    KILN_TOK_DEC_BYTELEVEL = 1,
    KILN_TOK_DEC_REPLACE = 2,
    KILN_TOK_DEC_BYTEFALLBACK = 3,
    KILN_TOK_DEC_FUSE = 4,
    KILN_TOK_DEC_STRIP = 5,
};

/* The regex ByteLevel uses when use_regex is true (GPT-2's). */
#define KILN_TOK_GPT2_REGEX "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+"

/* ---- the loaded tokenizer ---- */

/* A string inside the tokenizer's owned storage. */
typedef struct tok_span {
    uint32_t off, len;
} tok_span;

/* Open-addressing hash from a byte string to an id; keys live in `base`. */
typedef struct tok_strmap {
    uint32_t *slot_id;   /* id + 1 per slot, 0 = empty */
    uint32_t *slot_hash; /* the key's hash, to skip most compares */
    uint32_t mask;       /* capacity - 1 (a power of two) */
} tok_strmap;

/* Merge table: (left id, right id) → (rank, merged id); open addressing,
 * one 16-byte slot per entry so a probe touches one cache line. */
typedef struct tok_merge_slot {
    uint64_t key;        /* left << 32 | right, UINT64_MAX = empty */
    uint32_t rank;
    int32_t merged;
} tok_merge_slot;

typedef struct tok_mergemap {
    tok_merge_slot *slots;
    uint64_t mask;
    unsigned shift;      /* 64 - log2(capacity): slot = (key * golden ratio) >> shift */
} tok_mergemap;

static inline uint64_t kiln_tok_merge_slot(const tok_mergemap *m, uint64_t key) {
    return (key * 0x9E3779B97F4A7C15ull) >> m->shift; /* the top bits mix every key bit */
}

typedef struct tok_added {
    int32_t id;
    uint32_t flags;      /* KILN_TOK_AF_* */
    tok_span content;    /* what is matched: content, or its normalized form when normalized */
} tok_added;

/* Matches added tokens at a position: candidates grouped by first byte. */
typedef struct tok_matcher {
    uint32_t n;              /* number of patterns */
    uint32_t *order;         /* indexes into tok->added, sorted by (first byte, length descending) */
    uint32_t first[257];     /* order[first[b] .. first[b+1]) start with byte b */
} tok_matcher;

typedef struct tok_step {
    uint32_t kind, arg0, arg1;
    tok_span a, b;
} tok_step;

struct kiln_tokenizer {
    uint8_t *store;           /* owned bytes every tok_span points into */
    size_t store_len;

    /* model */
    uint32_t model_flags;     /* KILN_TOK_MF_* */
    int32_t unk_id;
    uint32_t n_ids;
    tok_span *tok_str;        /* [n_ids] token string (added content for added-only ids) */
    uint8_t *id_kind;         /* [n_ids] bit 0 in model vocab, bit 1 added, bit 2 special (skip in decode) */
    tok_strmap vocab;         /* model vocab: key = token bytes (raw bytes in byte-level mode) */
    tok_span *vocab_key;      /* [n_ids] the key each vocab id is hashed by */
    int32_t byte_sym[256];    /* byte-level: id of the one-byte token; else id of <0xNN> (-1 none) */
    int32_t ascii_id[128];    /* character models: id of each one-byte character's token (-1 none) */
    tok_mergemap merges;
    uint32_t n_merges;
    /* Words may be cut before each occurrence of this character that follows
     * another character, because no token contains "<other char><this one>"
     * (so no merge can cross such a point; checked at load). SentencePiece-
     * style models (llama2: "▁") otherwise BPE whole lines. len 0 = none. */
    tok_span split_char;

    /* added tokens */
    uint32_t n_added;
    tok_added *added;
    tok_matcher match_raw;    /* non-normalized added tokens, matched in the input */
    tok_matcher match_norm;   /* normalized ones, matched in normalized pieces */
    tok_strmap added_map;     /* content → index in added (for token_id lookups) */
    tok_span *added_key;      /* [n_added] original contents, the keys of added_map */

    /* pipeline */
    uint32_t n_norm, n_pre, n_dec;
    tok_step norm[KILN_TOK_MAX_STEPS];
    tok_step pre[KILN_TOK_MAX_STEPS];
    pcre2_code *pre_re[KILN_TOK_MAX_STEPS];   /* compiled regex per Split step (or GPT-2's) */
    uint8_t pre_rx[KILN_TOK_MAX_STEPS];       /* KILN_TOK_RX_*: a known pattern, run by the built-in matcher */
    tok_step dec[KILN_TOK_MAX_STEPS];

    /* decoding: per id, the text the decoder chain works with */
    bool dec_byte_level;      /* decoder is ByteLevel: pieces are raw bytes, lossy UTF-8 at the end */
    bool dec_byte_fallback;   /* chain has ByteFallback: <0xNN> pieces are bytes */
    bool dec_strip;           /* chain ends with Strip after Fuse */
    uint32_t strip_char;      /* code point stripped */
    uint32_t strip_start;     /* up to this many leading ones */
    tok_span *dec_piece;      /* [n_ids] piece bytes */
    int16_t *dec_byte;        /* [n_ids] byte value of a <0xNN> piece, else -1 */

    /* specials */
    uint32_t n_prefix, n_suffix;
    int32_t *prefix, *suffix;
    int32_t bos;
    uint32_t n_eos;
    int32_t eos[KILN_TOK_MAX_EOS];
};

static inline const uint8_t *tok_bytes(const kiln_tokenizer *t, tok_span s) { return t->store + s.off; }

/* ---- hashing (FNV-1a over 4-byte words; good enough for token strings) ---- */
uint32_t kiln_tok_hash(const uint8_t *p, size_t n);
int32_t kiln_tok_strmap_get(const tok_strmap *m, const kiln_tokenizer *t, const tok_span *keys,
                            const uint8_t *p, size_t n);

/* ---- UTF-8 ---- */

/* Length of the valid UTF-8 prefix of p[0..n), i.e. the offset of the first
 * invalid byte, or n when all of it is valid (strict: no surrogates, no
 * overlongs, ≤ U+10FFFF). */
size_t kiln_utf8_valid_prefix(const uint8_t *p, size_t n);
/* Decode one character of valid UTF-8 at p (n ≥ 1 bytes available); stores its length. */
uint32_t kiln_utf8_decode(const uint8_t *p, size_t n, size_t *len);
/* Encode a code point; returns the byte count (1..4). */
size_t kiln_utf8_encode(uint32_t cp, uint8_t out[4]);
/* The byte count a lead byte announces (1..4), or 0 for a byte that cannot start a character. */
int kiln_utf8_lead_len(uint8_t b);
/* Append `n` bytes to `out` the way Rust's String::from_utf8_lossy does:
 * each maximal invalid subpart becomes one U+FFFD. */
bool kiln_utf8_lossy_append(kiln_buf *out, const uint8_t *p, size_t n);

/* ---- Unicode (runtime/tokenizer_unicode.c + the generated tables) ---- */

typedef struct kiln_uni_range {
    uint32_t first, last;
    uint32_t value;
} kiln_uni_range;
typedef struct kiln_uni_decomp_entry {
    uint32_t cp;
    uint16_t offset, length;
} kiln_uni_decomp_entry;
typedef struct kiln_uni_comp_entry {
    uint32_t first, second, composite;
} kiln_uni_comp_entry;
typedef struct kiln_uni_fold_entry {
    uint32_t cp;
    char letter;
} kiln_uni_fold_entry;

/* Character classes as HF's regex engine sees them (see the generator). */
enum { KILN_UNI_L = 1, KILN_UNI_N = 2, KILN_UNI_WS = 4 };
extern const uint16_t kiln_uni_class_stage1[0x1100];
extern const uint8_t kiln_uni_class_blocks[][256];
extern const kiln_uni_fold_entry kiln_uni_fold[];
extern const uint32_t kiln_uni_fold_count;

static inline unsigned kiln_uni_class(uint32_t cp) {
    if (cp >= 0x110000) return 0;
    return kiln_uni_class_blocks[kiln_uni_class_stage1[cp >> 8]][cp & 0xFF];
}

extern const char kiln_uni_version[];
extern const kiln_uni_range kiln_uni_ccc[];
extern const uint32_t kiln_uni_ccc_count;
extern const kiln_uni_decomp_entry kiln_uni_decomp[];
extern const uint32_t kiln_uni_decomp_count;
extern const uint32_t kiln_uni_decomp_pool[];
extern const kiln_uni_comp_entry kiln_uni_comp[];
extern const uint32_t kiln_uni_comp_count;
extern const kiln_uni_range kiln_uni_nfc_qc[];
extern const uint32_t kiln_uni_nfc_qc_count;
/* White_Space, as the \\s of HF's regexes (added tokens' lstrip/rstrip, Split patterns). */
static inline bool kiln_uni_is_space(uint32_t cp) { return kiln_uni_class(cp) & KILN_UNI_WS; }
/* NFC of valid UTF-8 text p[0..n), appended to out. Returns false on allocation failure. */
bool kiln_uni_nfc(const uint8_t *p, size_t n, kiln_buf *out);
/* True when p[0..n) is certainly already NFC (quick check says Yes). */
bool kiln_uni_nfc_quick(const uint8_t *p, size_t n);

/* ---- pre-tokenizer regexes (runtime/tokenizer_pretok.c) ---- */

/* Patterns kiln matches with its own code, exactly as HF's Oniguruma does
 * and over the same Unicode tables; any other pattern goes to PCRE2. */
enum {
    KILN_TOK_RX_PCRE2 = 0,
    KILN_TOK_RX_LLAMA3 = 1, /* Llama 3: \p{N}{1,3}, case-insensitive contractions */
    KILN_TOK_RX_QWEN2 = 2,  /* Qwen2/2.5/3: the same with single digits */
    KILN_TOK_RX_GPT2 = 3,   /* GPT-2 (ByteLevel's use_regex) */
};
int kiln_tok_rx_known(const uint8_t *pat, size_t len);
/* End of the match of known pattern `kind` that starts at i in p[0..n), or i when none does. */
size_t kiln_tok_rx_match(int kind, const uint8_t *p, size_t n, size_t i);
/* Rewrite an HF (Oniguruma) pattern for PCRE2 so it means the same: \s and
 * \S become the White_Space set (PCRE2's \s also takes U+180E). Constructs
 * whose meaning differs between the engines (\w \d \b \h, ^ $, nested
 * classes...) are refused: returns false with the reason in `why`. */
bool kiln_tok_rx_to_pcre2(const uint8_t *pat, size_t len, kiln_buf *out, char *why, size_t why_cap);
/* Translate and compile (JIT when available) a pattern that is not a known one. */
kiln_status kiln_tok_rx_compile(const uint8_t *pat, size_t len, pcre2_code **out, kiln_error *err);

/* ---- the GPT-2 byte ↔ char table ---- */

/* The code point ByteLevel maps byte b to. */
uint32_t kiln_bytelevel_char(uint8_t b);
/* The byte a code point stands for, or -1 when it is not one of the 256. */
int kiln_bytelevel_byte(uint32_t cp);

/* ---- shared by tokenizer.c / tokenizer_encode.c / tokenizer_decode.c ---- */
/* HF ByteFallback's test: a "<0xNN>" piece and its byte. */
bool kiln_tok_decode_piece_is_byte(const uint8_t *p, size_t n, uint8_t *byte);
/* Run the normalizer steps over p[0..n) into *out (cleared first); `tmp` is
 * scratch. Returns KILN_ERR_NOMEM (without a message) on allocation failure. */
kiln_status kiln_tok_normalize(const kiln_tokenizer *t, const uint8_t *p, size_t n, kiln_buf *out, kiln_buf *tmp);

#endif /* KILN_TOKENIZER_INTERNAL_H */
