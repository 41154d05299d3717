/*
 * test_pool.c — the fork-join thread pool (common/kiln_pool.h): every task
 * runs exactly once over a grid of task counts and way limits, no more than
 * max_ways threads run a call's tasks at once, nested calls run inline on
 * the task's thread, four threads calling at once each get complete
 * results, a 1-way pool (or max_ways 1, or no pool) runs inline in order,
 * a forked child runs inline, and pools are made and freed repeatedly (the
 * sanitizer build checks for leaks and races on memory). Then the CPU
 * executor on the pool: stories260k's logits are bit-identical for 1..16
 * threads, and two contexts stepping on two threads at once each get them.
 */
#include "../common/kiln_pool.h"
#include "kt.h"
#include "kt_fixture.h"
#include "runtime/kiln_rt.h"

#include <pthread.h>
#include <stdatomic.h>
#include <sys/wait.h>
#include <unistd.h>

/* A little work so that tasks overlap in time. */
static unsigned spin(int task) {
    volatile unsigned x = (unsigned)task;
    for (int i = 0; i < 2000; i++) x = x * 1664525u + 1013904223u;
    return x;
}

typedef struct count_job {
    atomic_int *runs;     /* per task: how many times it ran */
    atomic_int running;   /* tasks running now */
    atomic_int most;      /* the most that ran at once */
    unsigned *out;        /* per task: spin(task) */
} count_job;

static void count_task(void *arg, int task) {
    count_job *j = arg;
    int now = atomic_fetch_add(&j->running, 1) + 1;
    for (int m = atomic_load(&j->most); now > m && !atomic_compare_exchange_weak(&j->most, &m, now);) {
    }
    atomic_fetch_add(&j->runs[task], 1);
    j->out[task] = spin(task);
    atomic_fetch_sub(&j->running, 1);
}

/* Run n tasks with max_ways on pool; check each ran once with its result. */
static void check_for(kiln_pool *pool, int n, int max_ways) {
    atomic_int *runs = calloc((size_t)n, sizeof *runs);
    unsigned *out = calloc((size_t)n, sizeof *out);
    KT_REQUIRE(runs && out);
    count_job j = {.runs = runs, .out = out};
    kiln_pool_for(pool, n, max_ways, count_task, &j);
    int bad = 0;
    for (int t = 0; t < n; t++) bad += atomic_load(&runs[t]) != 1 || out[t] != spin(t);
    KT_CHECKF(bad == 0, "%d of %d tasks ran other than once (max_ways %d)", bad, n, max_ways);
    int limit = max_ways < 1 ? 1 : max_ways;
    KT_CHECKF(atomic_load(&j.most) <= limit, "%d tasks at once, max_ways %d", atomic_load(&j.most), max_ways);
    free(runs);
    free(out);
}

static void test_every_task_once(void) {
    kiln_pool *pool = kiln_pool_new(4);
    KT_REQUIRE(pool);
    KT_EQ_INT(kiln_pool_ways(pool), 4);
    const int ns[] = {1, 2, 3, 7, 64, 4097};
    const int ways[] = {0, 1, 2, 3, 4, 64};
    for (size_t a = 0; a < sizeof ns / sizeof *ns; a++)
        for (size_t b = 0; b < sizeof ways / sizeof *ways; b++) check_for(pool, ns[a], ways[b]);
    kiln_pool_for(pool, 0, 4, count_task, NULL); /* no tasks: fn is not called */
    kiln_pool_free(pool);
}

static void test_shared(void) {
    kiln_pool *p = kiln_pool_shared();
    KT_REQUIRE(p);
    KT_CHECK(kiln_pool_shared() == p);
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    KT_EQ_INT(kiln_pool_ways(p), cores < 1 ? 1 : cores);
    check_for(p, 1000, 1024);
}

typedef struct nest_job {
    kiln_pool *pool;
    pthread_t outer[8];
    atomic_int inner_elsewhere; /* inner tasks that ran off their outer task's thread */
    atomic_int inner_runs[8][50];
    atomic_int order_bad;       /* inner tasks that ran out of order */
} nest_job;

typedef struct nest_inner {
    nest_job *n;
    int outer, last;
} nest_inner;

static void inner_task(void *arg, int task) {
    nest_inner *in = arg;
    if (!pthread_equal(pthread_self(), in->n->outer[in->outer])) atomic_fetch_add(&in->n->inner_elsewhere, 1);
    if (task != in->last + 1) atomic_fetch_add(&in->n->order_bad, 1);
    in->last = task;
    atomic_fetch_add(&in->n->inner_runs[in->outer][task], 1);
    spin(task);
}

static void outer_task(void *arg, int task) {
    nest_job *n = arg;
    n->outer[task] = pthread_self();
    nest_inner in = {n, task, -1};
    kiln_pool_for(n->pool, 50, 4, inner_task, &in);
}

static void test_nested(void) {
    kiln_pool *pools[2] = {kiln_pool_new(3), NULL};
    pools[1] = kiln_pool_shared();
    for (int p = 0; p < 2; p++) {
        KT_REQUIRE(pools[p]);
        nest_job *n = calloc(1, sizeof *n);
        KT_REQUIRE(n);
        n->pool = pools[p];
        kiln_pool_for(pools[p], 8, 3, outer_task, n);
        int bad = 0;
        for (int o = 0; o < 8; o++)
            for (int t = 0; t < 50; t++) bad += atomic_load(&n->inner_runs[o][t]) != 1;
        KT_EQ_INT(bad, 0);
        KT_EQ_INT(atomic_load(&n->inner_elsewhere), 0);
        KT_EQ_INT(atomic_load(&n->order_bad), 0);
        free(n);
    }
    kiln_pool_free(pools[0]);
}

typedef struct caller {
    kiln_pool *pool;
    int seed;
    int failures;
} caller;

typedef struct sum_job {
    atomic_int *runs;
    long long *vals;
} sum_job;

static void sum_task(void *arg, int task) {
    sum_job *s = arg;
    atomic_fetch_add(&s->runs[task], 1);
    s->vals[task] = (long long)spin(task) + task;
}

static void *caller_main(void *arg) {
    caller *c = arg;
    for (int it = 0; it < 200; it++) {
        int n = 1 + (c->seed * 7919 + it * 104729) % 300;
        int ways = 1 + (c->seed + it) % 5;
        atomic_int *runs = calloc((size_t)n, sizeof *runs);
        long long *vals = calloc((size_t)n, sizeof *vals);
        if (!runs || !vals) {
            c->failures++;
            free(runs);
            free(vals);
            continue;
        }
        sum_job s = {runs, vals};
        kiln_pool_for(c->pool, n, ways, sum_task, &s);
        for (int t = 0; t < n; t++)
            if (atomic_load(&runs[t]) != 1 || vals[t] != (long long)spin(t) + t) c->failures++;
        free(runs);
        free(vals);
    }
    return NULL;
}

static void test_concurrent(void) {
    kiln_pool *pools[2] = {kiln_pool_new(3), kiln_pool_shared()};
    for (int p = 0; p < 2; p++) {
        KT_REQUIRE(pools[p]);
        pthread_t th[4];
        caller c[4];
        for (int k = 0; k < 4; k++) {
            c[k] = (caller){pools[p], k + 1, 0};
            KT_REQUIRE(pthread_create(&th[k], NULL, caller_main, &c[k]) == 0);
        }
        for (int k = 0; k < 4; k++) {
            pthread_join(th[k], NULL);
            KT_EQ_INT(c[k].failures, 0);
        }
    }
    kiln_pool_free(pools[0]);
}

typedef struct order_job {
    pthread_t caller;
    int next, bad;
} order_job;

static void order_task(void *arg, int task) {
    order_job *o = arg;
    if (!pthread_equal(pthread_self(), o->caller) || task != o->next) o->bad++;
    o->next = task + 1;
}

/* Inline: on the caller's thread, tasks in order. */
static void check_inline(kiln_pool *pool, int max_ways) {
    order_job o = {.caller = pthread_self()};
    kiln_pool_for(pool, 100, max_ways, order_task, &o);
    KT_EQ_INT(o.next, 100);
    KT_EQ_INT(o.bad, 0);
}

static void test_one_way_inline(void) {
    kiln_pool *one = kiln_pool_new(1);
    KT_REQUIRE(one);
    KT_EQ_INT(kiln_pool_ways(one), 1);
    check_inline(one, 8);
    kiln_pool_free(one);
    kiln_pool *four = kiln_pool_new(4);
    KT_REQUIRE(four);
    check_inline(four, 1);
    check_inline(four, 0);
    kiln_pool_free(four);
    check_inline(NULL, 8);
    KT_EQ_INT(kiln_pool_ways(NULL), 1);
}

/* The child's copy of the pool has no workers: calls run inline there. */
static void test_fork_child_inline(void) {
    kiln_pool *pool = kiln_pool_new(3);
    KT_REQUIRE(pool);
    check_for(pool, 100, 3); /* workers have run before the fork */
    fflush(NULL);
    pid_t pid = fork();
    KT_REQUIRE(pid >= 0);
    if (pid == 0) {
        order_job o = {.caller = pthread_self()};
        kiln_pool_for(pool, 100, 3, order_task, &o);
        _exit(o.next == 100 && o.bad == 0 ? 0 : 1);
    }
    int status = 0;
    KT_REQUIRE(waitpid(pid, &status, 0) == pid);
    KT_CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    kiln_pool_free(pool);
}

static void test_new_free_repeatedly(void) {
    for (int i = 0; i < 50; i++) {
        kiln_pool *pool = kiln_pool_new(1 + i % 4);
        KT_REQUIRE(pool);
        if (i % 2) check_for(pool, 10, 4);
        kiln_pool_free(pool);
    }
    kiln_pool_free(NULL);
}

/* ---- the CPU executor on the pool ---- */

enum { CPU_PROMPT = 64 }; /* 64 rows: the LM head (64 x 64 x 512) is split over threads */

/* Logits of CPU_PROMPT tokens (all rows), then of one more: [CPU_PROMPT + 1][vocab]. */
static bool cpu_logits(const kiln_model *m, int threads, float *out, int vocab) {
    kiln_cpu_ctx *c = NULL;
    kiln_error err = {0};
    if (kiln_cpu_ctx_new(m, 0, CPU_PROMPT, threads, &c, &err) != KILN_OK) return false;
    int32_t ids[CPU_PROMPT];
    for (int i = 0; i < CPU_PROMPT; i++) ids[i] = 1 + (i * 37) % (vocab - 1);
    bool ok = kiln_cpu_forward(c, ids, CPU_PROMPT, true, out, &err) == KILN_OK &&
              kiln_cpu_forward(c, ids, 1, false, out + (size_t)CPU_PROMPT * vocab, &err) == KILN_OK;
    kiln_cpu_ctx_free(c);
    return ok;
}

typedef struct stepper {
    const kiln_model *m;
    const float *want;
    int vocab, mismatches;
} stepper;

static void *stepper_main(void *arg) {
    stepper *s = arg;
    size_t n = (size_t)(CPU_PROMPT + 1) * s->vocab;
    float *got = malloc(n * sizeof *got);
    for (int it = 0; it < 10; it++)
        if (!got || !cpu_logits(s->m, 2, got, s->vocab) || memcmp(got, s->want, n * sizeof *got) != 0) s->mismatches++;
    free(got);
    return NULL;
}

static void test_cpu_exec_threads(void) {
    char dir[256], out[512];
    KT_REQUIRE(kt_tmpdir(dir, sizeof dir, "pool"));
    snprintf(out, sizeof out, "%s/s260k.kiln", dir);
    kiln_compile_options opt = {.output_path = out, .weight_dtype = KILN_DTYPE_COUNT_};
    KT_REQUIRE(kt_compile(KILN_SOURCE_DIR "/models/stories260k", &opt) == KILN_OK);
    kiln_model *m = NULL;
    kiln_error err = {0};
    KT_REQUIRE(kiln_model_open(out, 4, &m, &err) == KILN_OK);
    const int vocab = (int)m->plan->vocab_size;
    size_t n = (size_t)(CPU_PROMPT + 1) * (size_t)vocab;
    float *want = malloc(n * sizeof *want), *got = malloc(n * sizeof *got);
    KT_REQUIRE(want && got);
    KT_REQUIRE(cpu_logits(m, 1, want, vocab));
    const int threads[] = {2, 3, 4, 16};
    for (size_t i = 0; i < sizeof threads / sizeof *threads; i++) {
        KT_REQUIRE(cpu_logits(m, threads[i], got, vocab));
        KT_CHECKF(memcmp(got, want, n * sizeof *got) == 0, "%d threads: logits differ from 1 thread's", threads[i]);
    }
    stepper s[2] = {{m, want, vocab, 0}, {m, want, vocab, 0}};
    pthread_t th[2];
    for (int k = 0; k < 2; k++) KT_REQUIRE(pthread_create(&th[k], NULL, stepper_main, &s[k]) == 0);
    for (int k = 0; k < 2; k++) {
        pthread_join(th[k], NULL);
        KT_EQ_INT(s[k].mismatches, 0);
    }
    free(want);
    free(got);
    kiln_model_close(m);
    unlink(out);
    rmdir(dir);
}

int main(void) {
    KT_RUN(test_every_task_once);
    KT_RUN(test_shared);
    KT_RUN(test_nested);
    KT_RUN(test_concurrent);
    KT_RUN(test_one_way_inline);
    KT_RUN(test_fork_child_inline);
    KT_RUN(test_new_free_repeatedly);
    KT_RUN(test_cpu_exec_threads);
    return KT_END();
}
