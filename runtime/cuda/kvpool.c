/*
 * kvpool.c — paged KV cache bookkeeping. Contracts in kiln_kvpool.h.
 */
#include "kiln_kvpool.h"

#include <stdlib.h>
#include <string.h>

kiln_status kiln_kvpool_init(kiln_kvpool *kv, int max_seqs, int max_context, int block_size, int n_blocks, int window,
                             int max_step, kiln_error *err) {
    memset(kv, 0, sizeof *kv);
    if (max_seqs < 1 || max_context < 1 || block_size < 1 || n_blocks < 1 || window < 0 || max_step < 1)
        return kiln_err(err, KILN_ERR_INVALID_ARG,
                        "KV pool: bad shape (%d slots, context %d, block %d, %d blocks, window %d, step %d)", max_seqs,
                        max_context, block_size, n_blocks, window, max_step);
    kv->max_seqs = max_seqs;
    kv->max_context = max_context;
    kv->block_size = block_size;
    kv->max_blocks = (max_context + block_size - 1) / block_size;
    kv->n_blocks = n_blocks;
    kv->window = window;
    kv->max_step = max_step < max_context ? max_step : max_context;
    kv->free_blocks = malloc((size_t)n_blocks * sizeof *kv->free_blocks);
    kv->slots = calloc((size_t)max_seqs, sizeof *kv->slots);
    if (!kv->free_blocks || !kv->slots) goto nomem;
    for (int s = 0; s < max_seqs; s++) {
        kv->slots[s].table = malloc((size_t)kv->max_blocks * sizeof(int32_t));
        if (!kv->slots[s].table) goto nomem;
        for (int b = 0; b < kv->max_blocks; b++) kv->slots[s].table[b] = -1;
    }
    /* the stack pops low ids first */
    for (int i = 0; i < n_blocks; i++) kv->free_blocks[i] = n_blocks - 1 - i;
    kv->n_free = n_blocks;
    return KILN_OK;
nomem:
    kiln_kvpool_free(kv);
    return kiln_err(err, KILN_ERR_NOMEM, "KV pool: out of host memory for %d slots x %d block ids", max_seqs,
                    (max_context + block_size - 1) / block_size);
}

void kiln_kvpool_free(kiln_kvpool *kv) {
    if (kv->slots)
        for (int s = 0; s < kv->max_seqs; s++) free(kv->slots[s].table);
    free(kv->slots);
    free(kv->free_blocks);
    memset(kv, 0, sizeof *kv);
}

int kiln_kvpool_blocks_for(const kiln_kvpool *kv, int tokens) {
    const int bs = kv->block_size;
    int full = (tokens + bs - 1) / bs;
    if (kv->window <= 0) return full;
    int step = kv->max_step < tokens ? kv->max_step : tokens;
    int rolling = (step + kv->window - 1 + bs - 1) / bs + 1;
    return rolling < full ? rolling : full;
}

kiln_status kiln_kvpool_reserve(kiln_kvpool *kv, int slot, int tokens, bool *fits, kiln_error *err) {
    *fits = false;
    if (slot < 0 || slot >= kv->max_seqs)
        return kiln_err(err, KILN_ERR_INVALID_ARG, "cuda executor: slot %d is outside 0..%d", slot, kv->max_seqs - 1);
    if (tokens < 0) return kiln_err(err, KILN_ERR_INVALID_ARG, "cuda executor: reserve of %d tokens", tokens);
    if (tokens > kv->max_context)
        return kiln_err(err, KILN_ERR_CONTEXT, "cuda executor: %d tokens do not fit the %d-token context", tokens,
                        kv->max_context);
    kiln_kvslot *s = &kv->slots[slot];
    int need = kiln_kvpool_blocks_for(kv, tokens);
    if (need > s->commit) {
        if (kv->committed + (need - s->commit) > kv->n_blocks) return KILN_OK; /* not now */
        kv->committed += need - s->commit;
        s->commit = need;
    }
    if (tokens > s->reserved) s->reserved = tokens;
    *fits = true;
    return KILN_OK;
}

static void give_back(kiln_kvpool *kv, kiln_kvslot *s, int b) {
    if (s->table[b] >= 0) {
        kv->free_blocks[kv->n_free++] = s->table[b];
        s->table[b] = -1;
        s->live--;
    }
}

void kiln_kvpool_release(kiln_kvpool *kv, int slot) {
    if (slot < 0 || slot >= kv->max_seqs) return;
    kiln_kvslot *s = &kv->slots[slot];
    for (int b = s->first; b < s->n_logical; b++) give_back(kv, s, b);
    kv->committed -= s->commit;
    int32_t *table = s->table;
    memset(s, 0, sizeof *s);
    s->table = table;
}

kiln_status kiln_kvpool_append(kiln_kvpool *kv, int slot, int n, kiln_error *err) {
    kiln_kvslot *s = &kv->slots[slot];
    const int bs = kv->block_size;
    int end = s->len + n;
    if (n < 1 || end > s->reserved || end > kv->max_context)
        return kiln_err(err, KILN_ERR_INTERNAL,
                        "cuda executor: slot %d grows to %d tokens past its reserve of %d (context %d)", slot, end,
                        s->reserved, kv->max_context);
    if (kv->window > 0) {
        int keep_from = s->len - kv->window + 1; /* the first key any new query sees */
        int drop = keep_from > 0 ? keep_from / bs : 0;
        for (; s->first < drop && s->first < s->n_logical; s->first++) give_back(kv, s, s->first);
        if (s->first < drop) s->first = drop;
    }
    int last = (end - 1) / bs;
    for (int b = s->n_logical; b <= last; b++) {
        if (b < s->first) continue; /* cannot happen: new blocks are past the window's start */
        if (s->live >= s->commit || kv->n_free == 0)
            return kiln_err(err, KILN_ERR_INTERNAL,
                            "cuda executor: slot %d needs a KV block past its promise of %d (%d free in the pool)",
                            slot, s->commit, kv->n_free);
        s->table[b] = kv->free_blocks[--kv->n_free];
        s->live++;
    }
    if (last + 1 > s->n_logical) s->n_logical = last + 1;
    return KILN_OK;
}

void kiln_kvpool_advance(kiln_kvpool *kv, int slot, int n) { kv->slots[slot].len += n; }
