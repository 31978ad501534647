/*
 * testutil.h -- a few assertion macros for the C unit tests, and helpers to
 * write fixture files.  A failed CHECK prints file:line and the expression
 * and counts a failure; main returns the count via TEST_END, so ctest sees
 * a non-zero exit.
 */
#ifndef PL_TESTUTIL_H
#define PL_TESTUTIL_H

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int pl_test_failures = 0;
static int pl_test_checks = 0;

#define CHECK(cond)                                                          \
    do {                                                                     \
        pl_test_checks++;                                                    \
        if (!(cond)) {                                                       \
            fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, \
                    #cond);                                                  \
            pl_test_failures++;                                              \
        }                                                                    \
    } while (0)

#define CHECK_EQ_I64(a, b)                                                   \
    do {                                                                     \
        int64_t va_ = (int64_t)(a), vb_ = (int64_t)(b);                      \
        pl_test_checks++;                                                    \
        if (va_ != vb_) {                                                    \
            fprintf(stderr, "%s:%d: CHECK failed: %s == %s (%" PRId64        \
                            " != %" PRId64 ")\n",                            \
                    __FILE__, __LINE__, #a, #b, va_, vb_);                   \
            pl_test_failures++;                                              \
        }                                                                    \
    } while (0)

#define CHECK_OK(expr)                                                       \
    do {                                                                     \
        int rc_ = (expr);                                                    \
        pl_test_checks++;                                                    \
        if (rc_ != 0) {                                                      \
            fprintf(stderr, "%s:%d: %s returned %d (%s)\n", __FILE__,        \
                    __LINE__, #expr, rc_, pl_err_name(rc_));                 \
            pl_test_failures++;                                              \
        }                                                                    \
    } while (0)

#define TEST_END()                                                           \
    do {                                                                     \
        fprintf(stderr, "%d checks, %d failed\n", pl_test_checks,            \
                pl_test_failures);                                           \
        return pl_test_failures ? 1 : 0;                                     \
    } while (0)

/* Make a fresh temporary directory; returns a static path. */
static inline const char *pl_test_tmpdir(void) {
    static char dir[256];
    const char *base = getenv("TMPDIR");
    snprintf(dir, sizeof dir, "%s/pltest.XXXXXX", base ? base : "/tmp");
    if (!mkdtemp(dir)) {
        perror("mkdtemp");
        exit(2);
    }
    return dir;
}

static inline int pl_test_write_file(const char *path, const void *data,
                                     size_t len) {
    FILE *f = fopen(path, "wb");
    if (!f) return -1;
    size_t n = fwrite(data, 1, len, f);
    fclose(f);
    return n == len ? 0 : -1;
}

#endif
