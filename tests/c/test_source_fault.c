/*
 * A file that shrinks while a source reads it through its mapping: every
 * read and index lookup returns PL_ETRUNC naming the file, also in the
 * 10 ms during which a size seen by fstat(2) is trusted (the mapped copy
 * faults with SIGBUS and the library's handler turns the fault into the
 * error).  A SIGBUS that is not the library's still reaches the handler the
 * program installed before.
 */
#include "fixtures.h"
#include "source/source.h"
#include "testutil.h"

#include <fcntl.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <sys/mman.h>

#define NDOC 8
#define DOCLEN 3000

static const char *dir;
static sigjmp_buf user_jb;
static volatile sig_atomic_t user_hits;

static void user_handler(int sig) {
    (void)sig;
    user_hits++;
    siglongjmp(user_jb, 1);
}

static void write_source(const char *prefix) {
    int64_t lens[NDOC];
    for (int i = 0; i < NDOC; i++) lens[i] = DOCLEN;
    if (plf_write_megatron(prefix, PL_DTYPE_INT32, NDOC, lens, 0) != 0) exit(2);
}

static pl_source *open_megatron(const char *prefix) {
    pl_source_options o = {0};
    o.version = PL_SOURCE_OPTIONS_VERSION;
    o.type = PL_SOURCE_MEGATRON;
    o.path = prefix;
    pl_source *src = NULL;
    CHECK_OK(pl_source_open(&o, &src));
    return src;
}

/* A read right after the truncation (inside the trusted 10 ms). */
static void test_data_read(int round) {
    char p[512], bin[600];
    snprintf(p, sizeof p, "%s/d%d", dir, round);
    snprintf(bin, sizeof bin, "%s.bin", p);
    write_source(p);
    pl_source *s = open_megatron(p);
    int64_t *big = calloc(DOCLEN, sizeof *big);
    CHECK_OK(pl_source_read(s, 5, 0, DOCLEN, big, PL_DTYPE_INT64)); /* size seen */
    CHECK_EQ_I64(big[0], 5 * DOCLEN);
    CHECK(truncate(bin, DOCLEN * 4) == 0); /* keeps document 0 */
    CHECK_EQ_I64(pl_source_read(s, 5, 0, DOCLEN, big, PL_DTYPE_INT64), PL_ETRUNC);
    CHECK(strstr(pl_source_errmsg(s), bin) != NULL);
    CHECK(strstr(pl_source_errmsg(s), "truncated") != NULL);
    CHECK_EQ_I64(pl_source_read(s, 7, 10, 100, big, PL_DTYPE_INT32), PL_ETRUNC);
    /* Document 0 still reads, and the thread reads on after the faults. */
    CHECK_OK(pl_source_read(s, 0, 0, DOCLEN, big, PL_DTYPE_INT64));
    CHECK_EQ_I64(big[DOCLEN - 1], DOCLEN - 1);
    free(big);
    pl_source_free(s);
}

/* The same read on another thread (the guard is per thread). */
static pl_source *thr_src;
static void *thr_read(void *arg) {
    int64_t *big = calloc(DOCLEN, sizeof *big);
    *(int *)arg = pl_source_read(thr_src, 6, 0, DOCLEN, big, PL_DTYPE_INT64);
    free(big);
    return NULL;
}

static void test_thread_read(void) {
    char p[512], bin[600];
    snprintf(p, sizeof p, "%s/thr", dir);
    snprintf(bin, sizeof bin, "%s.bin", p);
    write_source(p);
    thr_src = open_megatron(p);
    int64_t *big = calloc(DOCLEN, sizeof *big);
    CHECK_OK(pl_source_read(thr_src, 6, 0, DOCLEN, big, PL_DTYPE_INT64));
    free(big);
    CHECK(truncate(bin, DOCLEN * 4) == 0);
    int rc = 1;
    pthread_t t;
    CHECK(pthread_create(&t, NULL, thr_read, &rc) == 0);
    pthread_join(t, NULL);
    CHECK_EQ_I64(rc, PL_ETRUNC);
    pl_source_free(thr_src);
}

/* An index lookup right after the index was truncated. */
static void test_index_lookup(int round) {
    char p[512], idx[600];
    snprintf(p, sizeof p, "%s/i%d", dir, round);
    snprintf(idx, sizeof idx, "%s.idx", p);
    int64_t *lens = calloc(3000, sizeof *lens);
    for (int i = 0; i < 3000; i++) lens[i] = 2;
    CHECK(plf_write_megatron(p, PL_DTYPE_INT32, 3000, lens, 0) == 0);
    free(lens);
    pl_source *s = open_megatron(p);
    int64_t len = 0;
    CHECK_OK(pl_source_document_length(s, 2900, &len));
    CHECK_EQ_I64(len, 2);
    CHECK(truncate(idx, 4096) == 0);
    CHECK_EQ_I64(pl_source_document_length(s, 2900, &len), PL_ETRUNC);
    CHECK(strstr(pl_source_errmsg(s), idx) != NULL);
    /* The planner's lookup without the size check is guarded too. */
    char err[512];
    CHECK_EQ_I64(pl__source_length_unchecked(s, 2950, &len, err, sizeof err), PL_ETRUNC);
    CHECK(strstr(err, idx) != NULL);
    pl_source_free(s);
}

/* A loader whose .bin is truncated after its first batch: an error naming
 * the file, not a dead process. */
static void test_loader(void) {
    char p[512], bin[600], y[1024];
    snprintf(p, sizeof p, "%s/loader", dir);
    snprintf(bin, sizeof bin, "%s.bin", p);
    int64_t *lens = calloc(4000, sizeof *lens);
    for (int i = 0; i < 4000; i++) lens[i] = 1000 + i % 7;
    CHECK(plf_write_megatron(p, PL_DTYPE_INT32, 4000, lens, 0) == 0);
    free(lens);
    snprintf(y, sizeof y,
             "seq_length: 1024\nglobal_batch_size: 8\nmicro_batch_size: 2\nthreads: 2\n"
             "prefetch: 2\nsources:\n  - {name: a, type: megatron, path: %s}\n", p);
    pl_config *cfg = NULL;
    CHECK_OK(pl_config_parse_string(y, strlen(y), "t", &cfg));
    pl_loader *l = NULL;
    CHECK_OK(pl_loader_create(cfg, NULL, &l));
    const pl_batch *b = NULL;
    CHECK_OK(pl_loader_next(l, 0, &b));
    CHECK(truncate(bin, 4096) == 0);
    int rc = PL_OK;
    for (int i = 0; i < 200 && rc == PL_OK; i++) rc = pl_loader_next(l, 0, &b);
    CHECK_EQ_I64(rc, PL_ETRUNC);
    CHECK(strstr(pl_loader_errmsg(l), bin) != NULL);
    pl_loader_free(l);
    pl_config_free(cfg);
}

/* A SIGBUS outside the library's reads goes to the program's handler. */
static void test_foreign_fault(void) {
    char path[600];
    snprintf(path, sizeof path, "%s/foreign", dir);
    int fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0644);
    CHECK(fd >= 0);
    CHECK(ftruncate(fd, 3 * 4096) == 0);
    volatile const uint8_t *m = mmap(NULL, 3 * 4096, PROT_READ, MAP_SHARED, fd, 0);
    CHECK(m != MAP_FAILED);
    CHECK(ftruncate(fd, 0) == 0);
    user_hits = 0;
    if (sigsetjmp(user_jb, 1) == 0) {
        uint8_t v = m[2 * 4096];
        (void)v;
        CHECK(0); /* not reached: the load faults */
    }
    CHECK_EQ_I64(user_hits, 1);
    munmap((void *)m, 3 * 4096);
    close(fd);
}

int main(void) {
    /* The program's own SIGBUS handler, installed before any source opens. */
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = user_handler;
    sigemptyset(&sa.sa_mask);
    CHECK(sigaction(SIGBUS, &sa, NULL) == 0);
    dir = pl_test_tmpdir();
    for (int r = 0; r < 5; r++) test_data_read(r);
    for (int r = 0; r < 5; r++) test_index_lookup(r);
    test_thread_read();
    test_loader();
    test_foreign_fault();
    TEST_END();
}
