/*
 * kt.h — kiln's minimal test harness (header only).
 *
 * A test file defines `static void test_x(void)` functions and lists them in
 * main() with KT_RUN(test_x). Checks record a failure with file and line and
 * go on; KT_REQUIRE returns from the test. main() ends with KT_END(), which
 * prints "N passed, N failed" and returns non-zero on any failure.
 * A test that cannot run here (no GPU, missing shared data) calls
 * KT_SKIP("why"), which prints the reason and counts as skipped.
 * KILN_TEST_ONLY=test_a,test_b runs only the tests it names (the others are
 * neither run nor counted).
 */
#ifndef KILN_KT_H
#define KILN_KT_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int kt_failed_checks_;
static int kt_passed_, kt_failed_, kt_skipped_;
static int kt_skip_flag_;

#define KT_CHECK(cond)                                                               \
    do {                                                                             \
        if (!(cond)) {                                                               \
            fprintf(stderr, "  FAIL %s:%d: %s\n", __FILE__, __LINE__, #cond);      \
            kt_failed_checks_++;                                                     \
        }                                                                            \
    } while (0)

#define KT_CHECKF(cond, ...)                                                         \
    do {                                                                             \
        if (!(cond)) {                                                               \
            fprintf(stderr, "  FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond);      \
            fprintf(stderr, __VA_ARGS__);                                            \
            fputc('\n', stderr);                                                     \
            kt_failed_checks_++;                                                     \
        }                                                                            \
    } while (0)

#define KT_REQUIRE(cond)                                                             \
    do {                                                                             \
        if (!(cond)) {                                                               \
            fprintf(stderr, "  FAIL %s:%d: %s (required)\n", __FILE__, __LINE__, #cond); \
            kt_failed_checks_++;                                                     \
            return;                                                                  \
        }                                                                            \
    } while (0)

#define KT_EQ_INT(a, b)                                                              \
    do {                                                                             \
        long long kt_a_ = (long long)(a), kt_b_ = (long long)(b);                    \
        if (kt_a_ != kt_b_) {                                                        \
            fprintf(stderr, "  FAIL %s:%d: %s == %s (%lld vs %lld)\n", __FILE__,   \
                    __LINE__, #a, #b, kt_a_, kt_b_);                                 \
            kt_failed_checks_++;                                                     \
        }                                                                            \
    } while (0)

#define KT_EQ_STR(a, b)                                                              \
    do {                                                                             \
        const char *kt_a_ = (a), *kt_b_ = (b);                                       \
        if (!kt_a_ || !kt_b_ || strcmp(kt_a_, kt_b_) != 0) {                         \
            fprintf(stderr, "  FAIL %s:%d: %s == %s (\"%s\" vs \"%s\")\n", __FILE__, \
                    __LINE__, #a, #b, kt_a_ ? kt_a_ : "(null)", kt_b_ ? kt_b_ : "(null)"); \
            kt_failed_checks_++;                                                     \
        }                                                                            \
    } while (0)

/* substring check, for error messages */
#define KT_CONTAINS(hay, needle)                                                     \
    do {                                                                             \
        const char *kt_h_ = (hay), *kt_n_ = (needle);                                \
        if (!kt_h_ || !strstr(kt_h_, kt_n_)) {                                       \
            fprintf(stderr, "  FAIL %s:%d: \"%s\" does not contain \"%s\"\n",        \
                    __FILE__, __LINE__, kt_h_ ? kt_h_ : "(null)", kt_n_);           \
            kt_failed_checks_++;                                                     \
        }                                                                            \
    } while (0)

#define KT_SKIP(...)                                                                 \
    do {                                                                             \
        fprintf(stderr, "  SKIP: ");                                                 \
        fprintf(stderr, __VA_ARGS__);                                                \
        fputc('\n', stderr);                                                         \
        kt_skip_flag_ = 1;                                                           \
        return;                                                                      \
    } while (0)

/* Is test `name` selected by KILN_TEST_ONLY (a comma-separated list; unset or empty: all)? */
static int kt_selected_(const char *name) {
    const char *only = getenv("KILN_TEST_ONLY");
    if (!only || !*only) return 1;
    size_t n = strlen(name);
    for (const char *p = only; *p;) {
        const char *e = strchr(p, ',');
        size_t len = e ? (size_t)(e - p) : strlen(p);
        if (len == n && strncmp(p, name, n) == 0) return 1;
        p += len + (e ? 1 : 0);
    }
    return 0;
}

#define KT_RUN(fn)                                                                   \
    do {                                                                             \
        if (!kt_selected_(#fn)) break;                                               \
        int kt_before_ = kt_failed_checks_;                                          \
        kt_skip_flag_ = 0;                                                           \
        fprintf(stderr, "[ RUN  ] %s\n", #fn);                                       \
        fn();                                                                        \
        if (kt_failed_checks_ != kt_before_) {                                       \
            kt_failed_++;                                                            \
            fprintf(stderr, "[ FAIL ] %s\n", #fn);                                   \
        } else if (kt_skip_flag_) {                                                  \
            kt_skipped_++;                                                           \
            fprintf(stderr, "[ SKIP ] %s\n", #fn);                                   \
        } else {                                                                     \
            kt_passed_++;                                                            \
            fprintf(stderr, "[  OK  ] %s\n", #fn);                                   \
        }                                                                            \
    } while (0)

/* The summary line and the exit status main must return (`return KT_END();`): a result left unused is a
 * compile warning, since a main that drops it exits 0 whatever failed. */
__attribute__((warn_unused_result)) static inline int kt_end_(void) {
    printf("%d passed, %d failed, %d skipped\n", kt_passed_, kt_failed_, kt_skipped_);
    return kt_failed_ ? 1 : 0;
}
#define KT_END() kt_end_()

#endif /* KILN_KT_H */
