/*
 * guard.c — what happens to kiln's files when a signal arrives.
 *
 * - Temporary files. The engine writer registers its "<out>.tmp.XXXXXX"
 *   (kiln_guard_temp_add) while it exists. SIGINT, SIGTERM and SIGHUP are
 *   blocked in every thread and taken by one watcher thread (sigwait),
 *   which unlinks every registered path, restores the default action and
 *   re-raises the signal, so the process still ends "killed by SIGINT"
 *   (exit status 130 in a shell) and leaves nothing behind. Why a thread and
 *   not a handler: NVRTC installs handlers of its own while it compiles (one
 *   that ends the process with status 4 on SIGTERM was seen), replacing
 *   ours at exactly the moment a long compile is interrupted. A blocked
 *   signal never reaches any handler; sigwait takes it whatever the
 *   disposition is. Threads started later (the NVRTC pool, NVRTC's own)
 *   inherit the blocked mask, which is why kiln_guard_install must run
 *   before any thread is started.
 * - SIGXFSZ (a write past `ulimit -f`) is ignored: the write then fails with
 *   EFBIG and the writer reports an ordinary error naming the file and
 *   removes its temporary file.
 * - SIGBUS on a mapped input. kiln_file_map registers each mapping
 *   (kiln_guard_map_add). When a mapped file shrinks while kiln reads it,
 *   touching a page past the new end raises SIGBUS. The handler, when the
 *   faulting address lies in a registered mapping, records the file and the
 *   offset, maps anonymous zero pages over the rest of that mapping
 *   (MAP_FIXED, so the faulting load re-executes and reads zeros; no later
 *   access faults again), and returns. The engine writer checks
 *   kiln_guard_fault() before each write and before finishing, so the
 *   compile stops with "FILE: the file shrank while kiln read it (SIGBUS at
 *   offset N)" and the zeros never reach an engine. This was chosen over
 *   sigsetjmp/siglongjmp around the weight copy because jumping out of the
 *   copy would skip the cleanup (buffers, the temporary file) of every frame
 *   in between; here every function returns normally. mmap(2) is not on
 *   POSIX's async-signal-safe list, but on Linux it is a plain system call
 *   with no lock in user space, which is what makes this safe in practice.
 *   A SIGBUS anywhere else is fatal as before (after unlinking temporaries).
 *
 *   The runtime registers its engine mapping too: the CLI installs only the
 *   SIGBUS handler for every command (kiln_guard_install_bus), and loading an
 *   engine (kiln_model_open, the f32 conversion, a GPU context's upload)
 *   checks kiln_guard_fault_in for it, so an engine rewritten in place under
 *   `kiln run` or `kiln serve` is an error naming it, not a crash. After
 *   that, nothing reads the mapping (plan, meta, tokenizer, chat template and
 *   weights are copies or on the GPU).
 *
 * Global state: a signal handler receives no context pointer, so the
 * registries it reads (temporary paths, mapped ranges), the fault record
 * it writes and the watched signal set are file-scope. They are fixed-size arrays of lock-free atomics
 * and plain bytes: nothing in the handler allocates or takes a lock.
 * Registration is thread-safe (NVRTC cache reads map files on worker
 * threads). The handlers are installed only by kiln_guard_install, which
 * the `kiln compile` command calls; a library user gets registration (cheap)
 * but no handler unless it installs one.
 */
#include "kiln_util.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define GUARD_TEMPS 8
#define GUARD_PATH_MAX 4096
#define GUARD_MAPS 4096

enum { SLOT_FREE = 0, SLOT_BUSY = 1, SLOT_LIVE = 2 };

static struct {
    atomic_int state;
    char path[GUARD_PATH_MAX];
} g_temps[GUARD_TEMPS];

static struct {
    atomic_int state;
    const uint8_t *base;
    size_t size;
    const char *path; /* the kiln_mapped_file's own copy: valid while mapped */
} g_maps[GUARD_MAPS];

static atomic_int g_fault_claimed;   /* the first fault wins the record */
static atomic_int g_fault_ready;     /* the record below is complete */
static char g_fault_path[GUARD_PATH_MAX];
static size_t g_fault_offset;
static size_t g_page_size = 4096;    /* set by kiln_guard_install (sysconf is not async-signal-safe) */

/* ---- registries (normal context) ---- */

int kiln_guard_temp_add(const char *path) {
    size_t n = strlen(path);
    if (n >= GUARD_PATH_MAX) return -1;
    for (int i = 0; i < GUARD_TEMPS; i++) {
        int expect = SLOT_FREE;
        if (!atomic_compare_exchange_strong(&g_temps[i].state, &expect, SLOT_BUSY)) continue;
        memcpy(g_temps[i].path, path, n + 1);
        atomic_store(&g_temps[i].state, SLOT_LIVE);
        return i;
    }
    return -1; /* full: the file is still removed on errors, only not on signals */
}

void kiln_guard_temp_remove(int slot) {
    if (slot >= 0 && slot < GUARD_TEMPS) atomic_store(&g_temps[slot].state, SLOT_FREE);
}

void kiln_guard_map_add(const void *base, size_t size, const char *path) {
    for (int i = 0; i < GUARD_MAPS; i++) {
        int expect = SLOT_FREE;
        if (!atomic_compare_exchange_strong(&g_maps[i].state, &expect, SLOT_BUSY)) continue;
        g_maps[i].base = base;
        g_maps[i].size = size;
        g_maps[i].path = path;
        atomic_store(&g_maps[i].state, SLOT_LIVE);
        return;
    }
    /* full: this mapping is unguarded (a SIGBUS in it ends the process, as without the guard) */
}

void kiln_guard_map_remove(const void *base) {
    for (int i = 0; i < GUARD_MAPS; i++)
        if (atomic_load(&g_maps[i].state) == SLOT_LIVE && g_maps[i].base == base) {
            atomic_store(&g_maps[i].state, SLOT_FREE);
            return;
        }
}

bool kiln_guard_fault(kiln_error *err) { return kiln_guard_fault_in(NULL, err); }

bool kiln_guard_fault_in(const char *path, kiln_error *err) {
    if (!atomic_load(&g_fault_ready) || (path && strcmp(path, g_fault_path) != 0)) return false;
    kiln_err(err, KILN_ERR_IO, "%s: the file shrank while kiln read it (SIGBUS at offset %zu)", g_fault_path,
             g_fault_offset);
    kiln_err_hint(err, "another program truncated or rewrote the file while kiln read it: replace a file by "
                       "writing a new one and renaming it over the old (as kiln compile does), not in place; then "
                       "run the command again");
    return true;
}

void kiln_guard_fault_reset(void) {
    atomic_store(&g_fault_ready, 0);
    atomic_store(&g_fault_claimed, 0);
}

/* ---- handlers (async-signal-safe from here on) ---- */

static void unlink_temps(void) {
    for (int i = 0; i < GUARD_TEMPS; i++)
        if (atomic_load(&g_temps[i].state) == SLOT_LIVE) unlink(g_temps[i].path);
}

static void die_by(int sig) {
    int saved = errno;
    unlink_temps();
    signal(sig, SIG_DFL);
    raise(sig); /* pending until the handler returns (sig is blocked while it runs) */
    errno = saved;
}

/* The watcher thread (normal context, not a handler): every SIGINT, SIGTERM,
 * SIGHUP, blocked everywhere, comes here. */
static sigset_t g_watched;
static atomic_int g_installed;

static void *watch_signals(void *arg) {
    (void)arg;
    for (;;) {
        int sig = 0;
        if (sigwait(&g_watched, &sig) != 0) continue;
        unlink_temps();
        struct sigaction dfl = {0};
        dfl.sa_handler = SIG_DFL;
        sigemptyset(&dfl.sa_mask);
        sigaction(sig, &dfl, NULL);
        sigset_t one;
        sigemptyset(&one);
        sigaddset(&one, sig);
        pthread_sigmask(SIG_UNBLOCK, &one, NULL);
        raise(sig); /* the default action ends the process, "killed by" sig */
        _exit(128 + sig);
    }
    return NULL;
}

/* A fault in a registered mapping: zeros over the rest of it, and a record. */
static bool absorb_fault(const uint8_t *addr) {
    for (int i = 0; i < GUARD_MAPS; i++) {
        if (atomic_load(&g_maps[i].state) != SLOT_LIVE) continue;
        const uint8_t *b = g_maps[i].base;
        size_t size = g_maps[i].size;
        if (addr < b || addr >= b + size) continue;
        uintptr_t page = (uintptr_t)addr & ~(uintptr_t)(g_page_size - 1);
        uintptr_t end = ((uintptr_t)b + size + g_page_size - 1) & ~(uintptr_t)(g_page_size - 1);
        void *p = mmap((void *)page, end - page, PROT_READ, MAP_PRIVATE | MAP_FIXED | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED) return false;
        int expect = 0;
        if (atomic_compare_exchange_strong(&g_fault_claimed, &expect, 1)) {
            const char *s = g_maps[i].path ? g_maps[i].path : "(a mapped file)";
            size_t k = 0;
            for (; s[k] && k < GUARD_PATH_MAX - 1; k++) g_fault_path[k] = s[k];
            g_fault_path[k] = 0;
            g_fault_offset = (size_t)(addr - b);
            atomic_store(&g_fault_ready, 1);
        }
        return true;
    }
    return false;
}

static void on_bus(int sig, siginfo_t *si, void *uc) {
    (void)uc;
    int saved = errno;
    bool fault = si && si->si_code > 0; /* raised by the kernel for an access, not sent by kill */
    if (fault && absorb_fault(si->si_addr)) {
        errno = saved;
        return;
    }
    die_by(sig);
}

static atomic_int g_bus_installed;

kiln_status kiln_guard_install_bus(kiln_error *err) {
    if (atomic_exchange(&g_bus_installed, 1)) return KILN_OK; /* once per process */
    long ps = sysconf(_SC_PAGESIZE);
    if (ps > 0) g_page_size = (size_t)ps;
    struct sigaction bus = {0};
    bus.sa_sigaction = on_bus;
    bus.sa_flags = SA_SIGINFO;
    sigemptyset(&bus.sa_mask);
    if (sigaction(SIGBUS, &bus, NULL) != 0) {
        atomic_store(&g_bus_installed, 0);
        return kiln_err(err, KILN_ERR_INTERNAL, "cannot install the SIGBUS handler: %s", strerror(errno));
    }
    return KILN_OK;
}

kiln_status kiln_guard_install(kiln_error *err) {
    if (atomic_exchange(&g_installed, 1)) return KILN_OK; /* once per process */
    if (kiln_guard_install_bus(err) != KILN_OK) return err ? err->code : KILN_ERR_INTERNAL;
    static const int fatal[] = {SIGINT, SIGTERM, SIGHUP};
    sigemptyset(&g_watched);
    for (size_t i = 0; i < sizeof fatal / sizeof fatal[0]; i++) {
        struct sigaction old;
        if (sigaction(fatal[i], NULL, &old) != 0) goto fail;
        if (old.sa_handler != SIG_IGN) sigaddset(&g_watched, fatal[i]); /* nohup, a background job: keep ignoring */
    }
    int e = pthread_sigmask(SIG_BLOCK, &g_watched, NULL);
    pthread_t tid;
    if (e == 0 && (e = pthread_create(&tid, NULL, watch_signals, NULL)) != 0)
        pthread_sigmask(SIG_UNBLOCK, &g_watched, NULL); /* no watcher: the signals must still end kiln */
    if (e == 0) pthread_detach(tid);
    if (e != 0) {
        errno = e;
        goto fail;
    }
    struct sigaction ign = {0};
    ign.sa_handler = SIG_IGN;
    sigemptyset(&ign.sa_mask);
    if (sigaction(SIGXFSZ, &ign, NULL) != 0) goto fail;
    return KILN_OK;
fail:
    return kiln_err(err, KILN_ERR_INTERNAL, "cannot install the signal handlers: %s", strerror(errno));
}
