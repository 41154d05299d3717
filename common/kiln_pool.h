/*
 * kiln_pool.h — one fork-join thread pool: worker threads started once and
 * reused by every parallel loop in kiln (the CPU executor's matmuls, engine
 * hashing and zstd decoding, weight upload, NVRTC jobs), instead of a
 * pthread_create/pthread_join per call.
 *
 * kiln_pool_for(pool, n_tasks, max_ways, fn, arg) runs fn(arg, 0) ..
 * fn(arg, n_tasks - 1), each exactly once, and returns when all have
 * finished. The calling thread runs tasks too; at most max_ways threads
 * (the caller and max_ways - 1 workers) run the call's tasks at once, so a
 * `--threads N` / `threads` option keeps meaning "at most N ways of
 * parallelism" (and never more than the pool has). Tasks are handed out in
 * index order, one at a time; which thread runs a task is not defined, so a
 * task's result must depend on its index alone.
 *
 * Semantics:
 * - Concurrent calls from several threads each get their own job; free
 *   workers help whichever job has tasks left, oldest first. Every caller
 *   runs its own tasks, so a call always finishes even when every worker is
 *   busy elsewhere (no call waits for another call).
 * - A call made from inside a task (on a worker or on the calling thread),
 *   on any pool, runs its tasks inline, in order: nested use cannot
 *   deadlock and never oversubscribes.
 * - Never fails: with no pool (NULL), no workers (a pool of 1 way, or
 *   pthread_create refused every thread), max_ways <= 1, or after fork() in
 *   the child (whose copy of the pool has no threads), the tasks run inline.
 *
 * Sizing and lifetime: kiln_pool_shared() is the process-wide pool, made at
 * its first use with one way per online core (the caller plus cores - 1
 * workers). It is the one piece of process-wide state in kiln (STYLE.md
 * habit 4): a pool per context would start threads per context, which is
 * what this replaces. A destructor (exit, or dlclose of libkiln.so) stops
 * and joins its workers and frees it, so no thread outlives the library's
 * code and LeakSanitizer sees nothing; if another thread is still inside a
 * call at that moment, the workers are joined and the memory is left
 * (reachable) so that call finishes inline. kiln_pool_new/kiln_pool_free
 * make private pools (tests).
 */
#ifndef KILN_POOL_H
#define KILN_POOL_H

typedef struct kiln_pool kiln_pool;

/* One task: `task` is its index in 0 .. n_tasks - 1. */
typedef void (*kiln_pool_fn)(void *arg, int task);

/* A pool of `ways` ways: the caller plus ways - 1 worker threads (ways <= 0:
 * one per online core). Threads that cannot be started are done without.
 * NULL when out of memory (kiln_pool_for(NULL, ...) runs inline). */
kiln_pool *kiln_pool_new(int ways);
/* Stop and join the workers, then free. No call may be in progress. */
void kiln_pool_free(kiln_pool *pool);
/* The process-wide pool, made at first use (thread-safe); may be NULL. */
kiln_pool *kiln_pool_shared(void);
/* Ways a call can get at most: 1 + the workers running (1 for NULL). */
int kiln_pool_ways(const kiln_pool *pool);
/* Run fn(arg, t) for t in 0 .. n_tasks - 1 on at most max_ways threads,
 * the caller included; returns when every task has finished. */
void kiln_pool_for(kiln_pool *pool, int n_tasks, int max_ways, kiln_pool_fn fn, void *arg);

#endif
