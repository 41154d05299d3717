/*
 * kiln_kvpool.h — the paged KV cache's bookkeeping (host side, no CUDA):
 * which physical blocks each sequence slot holds, and what is promised.
 *
 * The device memory is n_blocks blocks per layer for K and for V; a block
 * holds block_size consecutive positions of one sequence. Slot s's logical
 * block b (positions b*bs .. b*bs+bs-1) lives in physical block
 * table[b]; a token's cache slot, as the kernels take it, is
 * table[pos / bs] * bs + pos % bs.
 *
 * Promises: reserve(slot, T) commits enough blocks for the slot to grow to
 * T tokens, or answers "not now" (fits = false) when the uncommitted part
 * of the pool is too small; a slot never holds more blocks than it was
 * promised, so an append within a reserve always finds free blocks.
 * release() returns the slot's blocks and promise.
 *
 * Sliding window W (0 = none): a query at position p sees keys p-W+1 .. p,
 * so before a step that starts at position `start`, blocks whose last
 * position is below start - W + 1 are returned to the pool. A slot then
 * needs at most ceil((S + W - 1) / bs) + 1 blocks at once, S the largest
 * step (max_step), however long it grows.
 */
#ifndef KILN_KVPOOL_H
#define KILN_KVPOOL_H

#include <stdbool.h>
#include <stdint.h>

#include "../../common/kiln_util.h"

typedef struct kiln_kvslot {
    int len;        /* tokens in the cache */
    int reserved;   /* tokens granted by reserve */
    int commit;     /* blocks promised */
    int live;       /* blocks held now */
    int first;      /* first logical block still held (window) */
    int n_logical;  /* logical blocks taken so far (table[first .. n_logical-1] valid) */
    int32_t *table; /* [max_blocks] physical block per logical block, -1 = none */
} kiln_kvslot;

typedef struct kiln_kvpool {
    int max_seqs, max_context, block_size, max_blocks; /* max_blocks = ceil(max_context / block_size) */
    int n_blocks;   /* physical blocks */
    int window;     /* tokens; 0 = full attention */
    int max_step;   /* largest step (tokens of one sequence in one step) */
    int64_t committed;
    int32_t *free_blocks; /* stack */
    int n_free;
    kiln_kvslot *slots;
} kiln_kvpool;

kiln_status kiln_kvpool_init(kiln_kvpool *kv, int max_seqs, int max_context, int block_size, int n_blocks, int window,
                             int max_step, kiln_error *err);
void kiln_kvpool_free(kiln_kvpool *kv);

/* Blocks a slot growing to `tokens` may hold at once. */
int kiln_kvpool_blocks_for(const kiln_kvpool *kv, int tokens);

/* kiln_exec.h's reserve: KILN_ERR_CONTEXT past max_context, else *fits. */
kiln_status kiln_kvpool_reserve(kiln_kvpool *kv, int slot, int tokens, bool *fits, kiln_error *err);
void kiln_kvpool_release(kiln_kvpool *kv, int slot);

/* Before a step adds n tokens at the slot's end: return blocks the window no
 * longer needs and take blocks for the new positions. KILN_ERR_INTERNAL when
 * the slot grows past its reserve (a scheduler bug), never a crash. */
kiln_status kiln_kvpool_append(kiln_kvpool *kv, int slot, int n, kiln_error *err);
/* After the step ran: the n tokens are in the cache. */
void kiln_kvpool_advance(kiln_kvpool *kv, int slot, int n);

/* The cache slot of position `pos` of `slot` (its block must be held). */
static inline int32_t kiln_kvpool_cache_slot(const kiln_kvpool *kv, int slot, int pos) {
    return kv->slots[slot].table[pos / kv->block_size] * kv->block_size + pos % kv->block_size;
}

#endif /* KILN_KVPOOL_H */
