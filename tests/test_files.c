/*
 * test_files.c — opening the files a user names (common/util.c) and the
 * signal guard (common/guard.c): anything but a regular file is refused
 * without blocking and named with its type; links that loop or dangle and
 * unreadable files are reported with the real reason; a mapped file that
 * shrinks gives an error naming it (no SIGBUS crash), and the engine writer
 * then fails and leaves no temporary file.
 *
 * alarm() bounds the whole run: a FIFO opened by mistake would block forever.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "../codegen/kiln_codegen.h"
#include "../common/kiln_util.h"
#include "../compiler/kiln_compiler.h"
#include "../runtime/kiln.h"
#include "../format/kiln_engine.h"
#include "../runtime/kiln_rt.h"
#include "kt.h"
#include "kt_fixture.h"

static char g_dir[256];

static char *in_dir(const char *name) {
    static char buf[4][512];
    static int k;
    char *b = buf[k++ % 4];
    snprintf(b, 512, "%s/%s", g_dir, name);
    return b;
}

static void write_file(const char *path, size_t n) {
    FILE *f = fopen(path, "wb");
    for (size_t i = 0; f && i < n; i++) fputc((int)(i % 251) + 1, f);
    if (f) fclose(f);
}

/* Both the whole-file reader and the mapper refuse `path` with `want` in the message. */
static void refuse_both(const char *path, const char *want) {
    kiln_error err = {0};
    char *text = NULL;
    size_t len = 0;
    KT_CHECK(kiln_file_read(path, 1 << 20, &text, &len, &err) != KILN_OK);
    KT_CHECK(text == NULL);
    KT_CONTAINS(err.msg, path);
    KT_CONTAINS(err.msg, want);
    kiln_mapped_file m;
    kiln_err_clear(&err);
    KT_CHECK(kiln_file_map(path, &m, &err) != KILN_OK);
    KT_CHECK(m.data == NULL && m.path == NULL);
    KT_CONTAINS(err.msg, path);
    KT_CONTAINS(err.msg, want);
    int fd = 7;
    KT_CHECK(kiln_file_open_regular(path, &fd, NULL, NULL) != KILN_OK);
    KT_EQ_INT(fd, -1);
}

static void test_fifo(void) {
    const char *p = in_dir("fifo");
    KT_REQUIRE(mkfifo(p, 0600) == 0);
    refuse_both(p, "not a regular file (a FIFO)");
    kiln_error err = {0};
    KT_CHECK(kiln_dir_check(p, &err) != KILN_OK);
    KT_CONTAINS(err.msg, "not a directory (a FIFO)");
}

static void test_directory(void) {
    const char *p = in_dir("tokenizer.json");
    KT_REQUIRE(mkdir(p, 0700) == 0);
    refuse_both(p, "not a regular file (a directory)");
    KT_EQ_INT(kiln_dir_check(p, NULL), KILN_OK);
}

static void test_socket(void) {
    const char *p = in_dir("sock");
    int s = socket(AF_UNIX, SOCK_STREAM, 0);
    KT_REQUIRE(s >= 0);
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    if (strlen(p) >= sizeof a.sun_path) {
        close(s);
        KT_SKIP("socket path too long: %s", p);
    }
    strcpy(a.sun_path, p);
    KT_REQUIRE(bind(s, (struct sockaddr *)&a, sizeof a) == 0);
    refuse_both(p, "not a regular file (a socket)");
    close(s);
}

static void test_device(void) {
    refuse_both("/dev/null", "not a regular file (a character device)");
}

static void test_symlink_loop(void) {
    const char *a = in_dir("loop-a"), *b = in_dir("loop-b");
    KT_REQUIRE(symlink("loop-b", a) == 0 && symlink("loop-a", b) == 0);
    refuse_both(a, strerror(ELOOP));
    kiln_error err = {0};
    KT_CHECK(kiln_dir_check(a, &err) != KILN_OK);
    KT_CONTAINS(err.msg, a);
    KT_CONTAINS(err.msg, strerror(ELOOP));
    KT_CHECK(kiln_path_exists(a)); /* the link is there; opening it says what is wrong */
}

static void test_dangling_symlink(void) {
    const char *p = in_dir("dangling");
    KT_REQUIRE(symlink("no-such-target", p) == 0);
    refuse_both(p, "symbolic link to \"no-such-target\", which does not exist");
    kiln_error err = {0};
    KT_CHECK(kiln_dir_check(p, &err) != KILN_OK);
    KT_CONTAINS(err.msg, "no-such-target");
}

static void test_missing(void) {
    const char *p = in_dir("absent.json");
    refuse_both(p, strerror(ENOENT));
    kiln_error err = {0};
    KT_CHECK(kiln_dir_check(p, &err) == KILN_ERR_MISSING);
    KT_CONTAINS(err.msg, "no such directory");
    KT_CHECK(!kiln_path_exists(p));
}

static void test_unreadable(void) {
    if (geteuid() == 0) KT_SKIP("running as root: permissions do not stop root");
    const char *p = in_dir("secret.json");
    write_file(p, 10);
    KT_REQUIRE(chmod(p, 0) == 0);
    refuse_both(p, strerror(EACCES));
}

static void test_regular(void) {
    const char *p = in_dir("ok.json");
    write_file(p, 100000);
    kiln_error err = {0};
    char *text = NULL;
    size_t len = 0;
    KT_EQ_INT(kiln_file_read(p, 1 << 20, &text, &len, &err), KILN_OK);
    KT_EQ_INT(len, 100000);
    KT_CHECK(text && text[len] == 0 && (unsigned char)text[99999] == 99999 % 251 + 1);
    free(text);
    KT_CHECK(kiln_file_read(p, 1000, &text, &len, &err) == KILN_ERR_PARSE);
    KT_CONTAINS(err.msg, "1000-byte limit");
    kiln_mapped_file m;
    KT_EQ_INT(kiln_file_map(p, &m, &err), KILN_OK);
    KT_EQ_INT(m.size, 100000);
    kiln_file_unmap(&m);
    KT_CHECK(kiln_dir_check(p, &err) == KILN_ERR_INVALID_ARG);
    KT_CONTAINS(err.msg, "not a directory (a regular file)");
}

/* Names in g_dir starting with `prefix`. */
static int count_prefixed(const char *prefix) {
    DIR *d = opendir(g_dir);
    int n = 0;
    struct dirent *e;
    while (d && (e = readdir(d)))
        if (strncmp(e->d_name, prefix, strlen(prefix)) == 0) n++;
    if (d) closedir(d);
    return n;
}

/* A mapped file truncated under us: the read gives zeros instead of SIGBUS,
 * the fault names the file and the offset, and the writer refuses to go on. */
static void test_shrunk_mapping(void) {
    long page = sysconf(_SC_PAGESIZE);
    const char *p = in_dir("model.safetensors");
    write_file(p, (size_t)page * 3);
    kiln_error err = {0};
    KT_REQUIRE(kiln_guard_install(&err) == KILN_OK);
    kiln_guard_fault_reset();
    kiln_mapped_file m;
    KT_REQUIRE(kiln_file_map(p, &m, &err) == KILN_OK);
    kiln_engine_writer *w = NULL;
    KT_REQUIRE(kiln_engine_writer_open(in_dir("out.kiln"), &w, &err) == KILN_OK);
    KT_EQ_INT(count_prefixed("out.kiln.tmp."), 1);
    KT_EQ_INT(kiln_engine_writer_begin(w, KILN_SECTION_WEIGHTS, KILN_CODEC_NONE, &err), KILN_OK);
    KT_EQ_INT(kiln_engine_writer_write(w, m.data, (size_t)page, &err), KILN_OK);
    KT_REQUIRE(truncate(p, page) == 0);
    size_t off = (size_t)page * 2 + 5;
    volatile uint8_t v = m.data[off]; /* past the new end: SIGBUS, absorbed */
    KT_EQ_INT(v, 0);
    KT_EQ_INT(m.data[0], 1); /* the part still in the file reads as before */
    kiln_error fault = {0};
    KT_REQUIRE(kiln_guard_fault(&fault));
    KT_CONTAINS(fault.msg, p);
    KT_CONTAINS(fault.msg, "the file shrank while kiln read it");
    char want[64];
    snprintf(want, sizeof want, "SIGBUS at offset %zu", off);
    KT_CONTAINS(fault.msg, want);
    KT_CHECK(kiln_engine_writer_write(w, m.data + page, (size_t)page, &err) != KILN_OK);
    KT_CONTAINS(err.msg, "the file shrank");
    KT_EQ_INT(count_prefixed("out.kiln.tmp."), 0); /* removed at the failure, not only at abort */
    kiln_engine_writer_abort(w);
    KT_EQ_INT(count_prefixed("out.kiln"), 0);
    kiln_file_unmap(&m);
    kiln_guard_fault_reset();
    KT_CHECK(!kiln_guard_fault(NULL));
}

/* The real weight copy (kiln_weights_write) over a checkpoint whose shard is
 * truncated after it was opened and imported: an error naming the shard. */
static void test_shrunk_checkpoint(void) {
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "cp -r '%s/tests/data/tiny-mistral' '%s/ck' && chmod -R u+w '%s/ck'", KILN_SOURCE_DIR,
             g_dir, g_dir);
    KT_REQUIRE(system(cmd) == 0);
    kiln_error err = {0};
    KT_REQUIRE(kiln_guard_install(&err) == KILN_OK);
    kiln_guard_fault_reset();
    kiln_checkpoint ck;
    KT_REQUIRE(kiln_checkpoint_open(in_dir("ck"), &ck, &err) == KILN_OK);
    kiln_graph *g = NULL;
    kiln_engine_writer *w = NULL;
    KT_REQUIRE(kiln_import(&ck, &g, &err) == KILN_OK);
    const char *shard = in_dir("ck/model.safetensors");
    KT_REQUIRE(truncate(shard, 0) == 0);
    KT_REQUIRE(kiln_engine_writer_open(in_dir("ck.kiln"), &w, &err) == KILN_OK);
    KT_CHECK(kiln_engine_writer_begin(w, KILN_SECTION_WEIGHTS, KILN_CODEC_NONE, &err) == KILN_OK);
    uint64_t size = 0;
    KT_CHECK(kiln_weights_write(g, w, &size, &err) != KILN_OK);
    KT_CONTAINS(err.msg, shard);
    KT_CONTAINS(err.msg, "the file shrank while kiln read it (SIGBUS at offset");
    kiln_engine_writer_abort(w);
    KT_EQ_INT(count_prefixed("ck.kiln"), 0);
    kiln_graph_free(g);
    kiln_checkpoint_close(&ck);
    kiln_guard_fault_reset();
}

/* An engine rewritten in place while the runtime reads it (`cp new.kiln live.kiln` under kiln serve):
 * the weights it reads after the truncation are zeros, and the load says so, naming the engine, at
 * the f32 conversion and at a context's creation through the C API; nothing crashes. */
static void test_shrunk_engine(void) {
    kiln_error err = {0};
    KT_REQUIRE(kiln_guard_install_bus(&err) == KILN_OK);
    kiln_guard_fault_reset();
    char ck[1024];
    snprintf(ck, sizeof ck, "%s/tests/data/tiny-mistral", KILN_SOURCE_DIR);
    const char *eng = in_dir("live.kiln");
    kiln_compile_options opt = {.output_path = eng, .weight_dtype = KILN_DTYPE_COUNT_, .targets = "none"};
    KT_REQUIRE(kt_compile(ck, &opt) == KILN_OK);
    struct stat sb;
    KT_REQUIRE(stat(eng, &sb) == 0);

    kiln_model *m = NULL;
    KT_REQUIRE(kiln_model_open_ex(eng, 1, KILN_MODEL_NO_F32, &m, &err) == KILN_OK);
    KT_REQUIRE(truncate(eng, 4096) == 0);
    KT_EQ_INT(kiln_model_load_f32(m, &err), KILN_ERR_IO);
    KT_CONTAINS(err.msg, eng);
    KT_CONTAINS(err.msg, "the file shrank while kiln read it (SIGBUS at offset");
    KT_CONTAINS(err.msg, "renaming it over the old");
    kiln_model_close(m);
    kiln_guard_fault_reset();

    /* the C API: kiln_open, then the file shrinks before the CPU context converts the weights */
    KT_REQUIRE(kt_compile(ck, &opt) == KILN_OK);
    kiln_t *k = NULL;
    KT_REQUIRE(kiln_open(eng, 1, &k) == KILN_OK);
    KT_REQUIRE(truncate(eng, 4096) == 0);
    kiln_ctx_options co;
    kiln_ctx_options_init(&co);
    co.device = "cpu";
    kiln_ctx_t *c = NULL;
    KT_EQ_INT(kiln_ctx_new(k, &co, &c), KILN_ERR_IO);
    KT_CONTAINS(kiln_last_error(c), "the file shrank while kiln read it");
    kiln_ctx_free(c);
    kiln_close(k);
    kiln_guard_fault_reset();
    /* a fault in another file is not this engine's: a fresh copy opens and converts */
    KT_REQUIRE(kt_compile(ck, &opt) == KILN_OK);
    KT_REQUIRE(kiln_model_open(eng, 1, &m, &err) == KILN_OK);
    kiln_model_close(m);
    unlink(eng);
}

static void rm_dir(void) {
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", g_dir);
}

int main(void) {
    alarm(60); /* a regression that blocks on a FIFO fails instead of hanging */
    const char *tmp = getenv("TMPDIR");
    snprintf(g_dir, sizeof g_dir, "%s/kiln-files-XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(g_dir)) {
        perror("mkdtemp");
        return 1;
    }
    KT_RUN(test_fifo);
    KT_RUN(test_directory);
    KT_RUN(test_socket);
    KT_RUN(test_device);
    KT_RUN(test_symlink_loop);
    KT_RUN(test_dangling_symlink);
    KT_RUN(test_missing);
    KT_RUN(test_unreadable);
    KT_RUN(test_regular);
    KT_RUN(test_shrunk_mapping);
    KT_RUN(test_shrunk_checkpoint);
    KT_RUN(test_shrunk_engine);
    rm_dir();
    return KT_END();
}
