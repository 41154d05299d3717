/*
 * pool.c — the fork-join thread pool. Contracts in kiln_pool.h.
 *
 * One mutex guards the pool. A call puts a job (on the caller's stack) on
 * the pool's list, wakes up to max_ways - 1 idle workers, then claims and
 * runs tasks like a worker until none are left to claim, and waits until
 * the tasks others claimed have finished and no worker still holds the job.
 * A task is claimed under the lock and run outside it. A job leaves the list
 * when its last task is claimed, so no worker finds it after that.
 *
 * Why a mutex and condition variables rather than spinning: callers are the
 * CPU executor's matmuls (a few per layer; each one ~0.1-10 ms), engine
 * hashing and decoding (16 MiB pieces), uploads and NVRTC builds; a futex
 * wake-up (some microseconds) is small beside each of those, and idle
 * workers cost nothing while a server waits for requests.
 */
#include "kiln_pool.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <unistd.h>

#define POOL_MAX_WAYS 1024

typedef struct pool_job {
    kiln_pool_fn fn;
    void *arg;
    int n_tasks;
    int next;        /* the next task to claim */
    int done;        /* tasks finished */
    int helpers;     /* workers holding the job now */
    int max_helpers; /* max_ways - 1, at most the workers */
    struct pool_job *next_job; /* the pool's list: jobs with tasks left to claim */
} pool_job;

struct kiln_pool {
    pthread_mutex_t lock;
    pthread_cond_t work; /* workers wait here: a job was added, or stop */
    pthread_cond_t done; /* callers wait here: a job's last holder let go */
    pool_job *jobs;      /* oldest first */
    int n_workers;       /* threads started */
    int idle;            /* workers waiting on `work` */
    int active;          /* calls in progress (the shared pool's destructor looks) */
    bool stop;
    pid_t pid;           /* the process the workers run in (fork leaves them behind) */
    pthread_t *threads;  /* n_workers */
};

/* > 0 while this thread runs a task: calls made then run inline. */
static _Thread_local int in_task;

static void run_inline(int n_tasks, kiln_pool_fn fn, void *arg) {
    in_task++;
    for (int t = 0; t < n_tasks; t++) fn(arg, t);
    in_task--;
}

static void job_unlink(kiln_pool *pool, pool_job *j) {
    for (pool_job **p = &pool->jobs; *p; p = &(*p)->next_job)
        if (*p == j) {
            *p = j->next_job;
            return;
        }
}

/* Claim and run j's tasks until none are left to claim. Called and returns
 * with the lock held. */
static void job_work(kiln_pool *pool, pool_job *j) {
    while (j->next < j->n_tasks) {
        int t = j->next++;
        if (j->next == j->n_tasks) job_unlink(pool, j);
        pthread_mutex_unlock(&pool->lock);
        j->fn(j->arg, t);
        pthread_mutex_lock(&pool->lock);
        j->done++;
    }
}

/* The oldest job with tasks to claim and room for one more helper. */
static pool_job *job_find(kiln_pool *pool) {
    for (pool_job *j = pool->jobs; j; j = j->next_job)
        if (j->helpers < j->max_helpers) return j;
    return NULL;
}

static void *pool_worker(void *arg) {
    kiln_pool *pool = arg;
    in_task = 1; /* everything a worker runs is a task */
    pthread_mutex_lock(&pool->lock);
    while (!pool->stop) {
        pool_job *j = job_find(pool);
        if (!j) {
            pool->idle++;
            pthread_cond_wait(&pool->work, &pool->lock);
            pool->idle--;
            continue;
        }
        j->helpers++;
        job_work(pool, j);
        if (--j->helpers == 0 && j->done == j->n_tasks) pthread_cond_broadcast(&pool->done);
    }
    pthread_mutex_unlock(&pool->lock);
    return NULL;
}

static int online_cores(void) {
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n < 1 ? 1 : n > POOL_MAX_WAYS ? POOL_MAX_WAYS : (int)n;
}

kiln_pool *kiln_pool_new(int ways) {
    if (ways <= 0) ways = online_cores();
    if (ways > POOL_MAX_WAYS) ways = POOL_MAX_WAYS;
    kiln_pool *pool = calloc(1, sizeof *pool);
    if (!pool) return NULL;
    pool->threads = calloc((size_t)ways, sizeof *pool->threads);
    if (!pool->threads) goto out_free_pool;
    if (pthread_mutex_init(&pool->lock, NULL)) goto out_free_threads;
    if (pthread_cond_init(&pool->work, NULL)) goto out_free_lock;
    if (pthread_cond_init(&pool->done, NULL)) goto out_free_work;
    pool->pid = getpid();
    /* workers start under the lock so none runs before n_workers is final */
    pthread_mutex_lock(&pool->lock);
    for (int i = 0; i < ways - 1; i++) {
        if (pthread_create(&pool->threads[pool->n_workers], NULL, pool_worker, pool) != 0) break;
        pool->n_workers++;
    }
    pthread_mutex_unlock(&pool->lock);
    return pool;

out_free_work:
    pthread_cond_destroy(&pool->work);
out_free_lock:
    pthread_mutex_destroy(&pool->lock);
out_free_threads:
    free(pool->threads);
out_free_pool:
    free(pool);
    return NULL;
}

/* Stop the workers and join them; the pool stays usable (inline). */
static void pool_stop(kiln_pool *pool) {
    if (getpid() != pool->pid) return; /* after fork(): no workers here, the lock may be held */
    pthread_mutex_lock(&pool->lock);
    pool->stop = true;
    pthread_cond_broadcast(&pool->work);
    int n = pool->n_workers;
    pthread_mutex_unlock(&pool->lock);
    for (int i = 0; i < n; i++) pthread_join(pool->threads[i], NULL);
    pthread_mutex_lock(&pool->lock);
    pool->n_workers = 0;
    pthread_mutex_unlock(&pool->lock);
}

void kiln_pool_free(kiln_pool *pool) {
    if (!pool) return;
    pool_stop(pool);
    pthread_cond_destroy(&pool->done);
    pthread_cond_destroy(&pool->work);
    pthread_mutex_destroy(&pool->lock);
    free(pool->threads);
    free(pool);
}

int kiln_pool_ways(const kiln_pool *pool) { return pool ? 1 + pool->n_workers : 1; }

void kiln_pool_for(kiln_pool *pool, int n_tasks, int max_ways, kiln_pool_fn fn, void *arg) {
    if (n_tasks <= 0) return;
    /* after fork() the child's copy has no workers (and its lock may be held) */
    if (!pool || in_task || max_ways <= 1 || n_tasks == 1 || getpid() != pool->pid) {
        run_inline(n_tasks, fn, arg);
        return;
    }
    pthread_mutex_lock(&pool->lock);
    int helpers = max_ways - 1;
    if (helpers > n_tasks - 1) helpers = n_tasks - 1;
    if (helpers > pool->n_workers) helpers = pool->n_workers;
    if (helpers == 0) {
        pthread_mutex_unlock(&pool->lock);
        run_inline(n_tasks, fn, arg);
        return;
    }
    pool_job j = {.fn = fn, .arg = arg, .n_tasks = n_tasks, .max_helpers = helpers};
    pool_job **tail = &pool->jobs;
    while (*tail) tail = &(*tail)->next_job;
    *tail = &j;
    pool->active++;
    for (int i = 0; i < helpers && i < pool->idle; i++) pthread_cond_signal(&pool->work);
    in_task++;
    job_work(pool, &j);
    in_task--;
    while (j.done < j.n_tasks || j.helpers > 0) pthread_cond_wait(&pool->done, &pool->lock);
    pool->active--;
    pthread_mutex_unlock(&pool->lock);
}

/* ---- the process-wide pool ---- */

static kiln_pool *shared_pool;
static pthread_once_t shared_once = PTHREAD_ONCE_INIT;

static void shared_make(void) { shared_pool = kiln_pool_new(0); }

kiln_pool *kiln_pool_shared(void) {
    pthread_once(&shared_once, shared_make);
    return shared_pool;
}

/* At exit or dlclose: no worker may outlive the code it runs. If a call is
 * still in progress on another thread (exit() from elsewhere), only join:
 * that call finishes its tasks inline and the memory stays reachable. */
__attribute__((destructor)) static void shared_free(void) {
    kiln_pool *pool = shared_pool;
    if (!pool || getpid() != pool->pid) return;
    pool_stop(pool);
    pthread_mutex_lock(&pool->lock);
    bool idle = pool->active == 0;
    pthread_mutex_unlock(&pool->lock);
    if (idle) {
        shared_pool = NULL;
        kiln_pool_free(pool);
    }
}
