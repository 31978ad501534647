/*
 * test_source_megatron.c -- Megatron indexed datasets: every dtype, multi-file
 * sources (directory, glob), one corrupt fixture per validation error, range
 * errors, statistics, concurrency and the handle's memory.
 */
#include "fixtures.h"
#include "source/source.h"
#include "testutil.h"

#include <pthread.h>
#include <sys/stat.h>
#include <unistd.h>

static const char *g_dir;

static pl_source *open_megatron(const char *path, int *rc) {
    pl_source_options o = {0};
    o.version = PL_SOURCE_OPTIONS_VERSION;
    o.type = PL_SOURCE_MEGATRON;
    o.path = path;
    o.eos_id = -1;
    pl_source *s = NULL;
    *rc = pl_source_open(&o, &s);
    return s;
}

/* The message names the file and a byte offset. */
static int msg_ok(const pl_source *s, const char *file, const char *offset) {
    const char *m = pl_source_errmsg(s);
    int ok = strstr(m, file) != NULL && strstr(m, offset) != NULL;
    if (!ok) fprintf(stderr, "  message: %s\n", m);
    return ok;
}

/* Raw .idx with explicit arrays; bin_bytes zero bytes of .bin. */
static void write_raw(const char *prefix, int dtype, int64_t s,
                      const int32_t *lengths, const int64_t *ptrs, int64_t d,
                      const int64_t *docidx, int64_t bin_bytes) {
    char path[4096];
    snprintf(path, sizeof path, "%s.idx", prefix);
    FILE *f = fopen(path, "wb");
    uint64_t version = 1, us = (uint64_t)s, ud = (uint64_t)d;
    uint8_t code = (uint8_t)dtype;
    fwrite("MMIDIDX\0\0", 1, 9, f);
    fwrite(&version, 8, 1, f);
    fwrite(&code, 1, 1, f);
    fwrite(&us, 8, 1, f);
    fwrite(&ud, 8, 1, f);
    if (s) fwrite(lengths, 4, (size_t)s, f);
    if (s) fwrite(ptrs, 8, (size_t)s, f);
    if (d) fwrite(docidx, 8, (size_t)d, f);
    fclose(f);
    snprintf(path, sizeof path, "%s.bin", prefix);
    f = fopen(path, "wb");
    for (int64_t i = 0; i < bin_bytes; i++) fputc(0, f);
    fclose(f);
}

/* Read every document whole and in two pieces; values must run from base. */
static void check_positions(pl_source *s, int64_t base, int64_t ndocs,
                            int dtype) {
    CHECK_EQ_I64(pl_source_num_documents(s), ndocs);
    int64_t k = base;
    int64_t buf[256];
    int32_t buf32[256];
    for (int64_t i = 0; i < ndocs; i++) {
        int64_t len = -1;
        CHECK_OK(pl_source_document_length(s, i, &len));
        CHECK(len >= 0 && len <= 256);
        if (len < 0 || len > 256) return;
        CHECK_OK(pl_source_read(s, i, 0, len, buf, PL_DTYPE_INT64));
        CHECK_OK(pl_source_read(s, i, 0, len, buf32, PL_DTYPE_INT32));
        for (int64_t j = 0; j < len; j++) {
            int64_t want = k + j;
            if (dtype == PL_DTYPE_UINT8) want = (uint8_t)want;
            if (dtype == PL_DTYPE_INT8) want = (int8_t)want;
            CHECK_EQ_I64(buf[j], want);
            CHECK_EQ_I64(buf32[j], (int32_t)want);
        }
        if (len >= 2) { /* a piece from the middle */
            int64_t piece[2] = {-1, -1};
            CHECK_OK(pl_source_read(s, i, len - 2, 2, piece, PL_DTYPE_INT64));
            CHECK_EQ_I64(piece[0], buf[len - 2]);
            CHECK_EQ_I64(piece[1], buf[len - 1]);
        }
        k += len;
    }
}

static void test_dtypes(void) {
    static const int dtypes[] = {PL_DTYPE_UINT8,   PL_DTYPE_INT8,
                                 PL_DTYPE_INT16,   PL_DTYPE_INT32,
                                 PL_DTYPE_INT64,   PL_DTYPE_UINT16};
    const int64_t lengths[] = {3, 0, 7, 1, 20};
    for (size_t t = 0; t < sizeof dtypes / sizeof *dtypes; t++) {
        char prefix[512];
        snprintf(prefix, sizeof prefix, "%s/dt_%s", g_dir,
                 pl_dtype_name(dtypes[t]));
        /* int8 wraps past 127: start low so values stay exact. */
        int64_t base = dtypes[t] == PL_DTYPE_INT8 ? -10 : 100;
        if (dtypes[t] == PL_DTYPE_INT64) base = (int64_t)1 << 40;
        CHECK(plf_write_megatron(prefix, dtypes[t], 5, lengths, base) == 0);
        int rc;
        pl_source *s = open_megatron(prefix, &rc);
        CHECK_OK(rc);
        CHECK_EQ_I64(pl_source_token_dtype(s), dtypes[t]);
        CHECK_EQ_I64(pl_source_num_files(s), 1);
        CHECK_EQ_I64(pl_source_get_type(s), PL_SOURCE_MEGATRON);
        CHECK(strcmp(pl_source_name(s), prefix) == 0);
        check_positions(s, base, 5, dtypes[t]);
        int64_t len = -1;
        CHECK_OK(pl_source_document_length(s, 1, &len));
        CHECK_EQ_I64(len, 0);
        pl_source_free(s);
    }
}

/* Float arrays (megatron-core's codes 6 and 7) hold no token ids: refused at
 * open, not truncated into ids. */
static void expect_open_error(const char *prefix, int code, const char *file,
                              const char *offset);
static void test_float_refused(void) {
    const int codes[2] = {PL_DTYPE_FLOAT64, PL_DTYPE_FLOAT32};
    for (int c = 0; c < 2; c++) {
        char prefix[512];
        snprintf(prefix, sizeof prefix, "%s/float_%d", g_dir, codes[c]);
        const int64_t lengths[] = {3};
        CHECK(plf_write_megatron(prefix, codes[c], 1, lengths, 0) == 0);
        expect_open_error(prefix, PL_EDTYPE, "not a token dtype", "offset 17");
        int rc;
        pl_source *s = open_megatron(prefix, &rc);
        CHECK_EQ_I64(rc, PL_EDTYPE);
        CHECK(strstr(pl_source_errmsg(s), pl_dtype_name(codes[c])) != NULL);
        pl_source_free(s);
    }
}

static void test_multi_file(void) {
    char dir[512], prefix[600];
    snprintf(dir, sizeof dir, "%s/multi", g_dir);
    mkdir(dir, 0755);
    /* Written out of order; the source must number them a, b, c. */
    const int64_t la[] = {4, 1, 9}, lb[] = {2, 2}, lc[] = {5, 0, 3, 6};
    snprintf(prefix, sizeof prefix, "%s/web_c", dir);
    CHECK(plf_write_megatron(prefix, PL_DTYPE_UINT16, 4, lc, 14 + 4) == 0);
    snprintf(prefix, sizeof prefix, "%s/web_a", dir);
    CHECK(plf_write_megatron(prefix, PL_DTYPE_UINT16, 3, la, 0) == 0);
    snprintf(prefix, sizeof prefix, "%s/web_b", dir);
    CHECK(plf_write_megatron(prefix, PL_DTYPE_UINT16, 2, lb, 14) == 0);
    /* An empty dataset in the middle of the order is fine. */
    snprintf(prefix, sizeof prefix, "%s/web_bb", dir);
    CHECK(plf_write_megatron(prefix, PL_DTYPE_UINT16, 0, NULL, 0) == 0);

    int rc;
    pl_source *s = open_megatron(dir, &rc);
    CHECK_OK(rc);
    CHECK_EQ_I64(pl_source_num_files(s), 4);
    check_positions(s, 0, 9, PL_DTYPE_UINT16);
    pl_source_free(s);

    char pat[600];
    snprintf(pat, sizeof pat, "%s/web_*", dir);
    s = open_megatron(pat, &rc);
    CHECK_OK(rc);
    CHECK_EQ_I64(pl_source_num_files(s), 4);
    check_positions(s, 0, 9, PL_DTYPE_UINT16);
    pl_source_free(s);

    snprintf(pat, sizeof pat, "%s/web_[ab]", dir);
    s = open_megatron(pat, &rc);
    CHECK_OK(rc);
    CHECK_EQ_I64(pl_source_num_files(s), 2);
    check_positions(s, 0, 5, PL_DTYPE_UINT16);
    pl_source_free(s);

    /* Naming the .idx instead of the prefix. */
    snprintf(pat, sizeof pat, "%s/web_b.idx", dir);
    s = open_megatron(pat, &rc);
    CHECK_OK(rc);
    check_positions(s, 14, 2, PL_DTYPE_UINT16);
    pl_source_free(s);

    /* Statistics over lengths 4 1 9 2 2 5 0 3 6. */
    s = open_megatron(dir, &rc);
    pl_source_stats st = {.size = sizeof st};
    CHECK_OK(pl_source_get_stats(s, &st));
    CHECK_EQ_I64(st.files, 4);
    CHECK_EQ_I64(st.documents, 9);
    CHECK_EQ_I64(st.tokens, 32);
    CHECK_EQ_I64(st.length_max, 9);
    CHECK_EQ_I64(st.length_p50, 3); /* sorted 0 1 2 2 3 4 5 6 9: 5th */
    CHECK_EQ_I64(st.length_p90, 9); /* ceil(8.1) = 9th */
    CHECK_EQ_I64(st.length_p99, 9);
    pl_source_free(s);
}

static void test_stats_large(void) {
    /* 100 overlapping sequences (all at pointer 0) of length 70000*i + 3:
     * exercises the histogram narrowing past 16 bits. */
    char prefix[512];
    snprintf(prefix, sizeof prefix, "%s/big", g_dir);
    int32_t lengths[100];
    int64_t ptrs[100], docidx[101];
    for (int i = 0; i < 100; i++) {
        lengths[i] = 70000 * (100 - i) + 3; /* unsorted */
        ptrs[i] = 0;
        docidx[i] = i;
    }
    docidx[100] = 100;
    write_raw(prefix, PL_DTYPE_UINT8, 100, lengths, ptrs, 101, docidx,
              70000 * 100 + 3);
    int rc;
    pl_source *s = open_megatron(prefix, &rc);
    CHECK_OK(rc);
    pl_source_stats st = {.size = sizeof st};
    CHECK_OK(pl_source_get_stats(s, &st));
    CHECK_EQ_I64(st.length_p50, 70000 * 50 + 3);
    CHECK_EQ_I64(st.length_p90, 70000 * 90 + 3);
    CHECK_EQ_I64(st.length_p99, 70000 * 99 + 3);
    CHECK_EQ_I64(st.length_max, 70000 * 100 + 3);
    CHECK_EQ_I64(st.tokens, 70000LL * 5050 + 300);
    pl_source_free(s);
}

static void test_empty(void) {
    char prefix[512];
    snprintf(prefix, sizeof prefix, "%s/empty", g_dir);
    CHECK(plf_write_megatron(prefix, PL_DTYPE_INT32, 0, NULL, 0) == 0);
    int rc;
    pl_source *s = open_megatron(prefix, &rc);
    CHECK_OK(rc);
    CHECK_EQ_I64(pl_source_num_documents(s), 0);
    int64_t len;
    CHECK_EQ_I64(pl_source_document_length(s, 0, &len), PL_ERANGE);
    pl_source_stats st = {.size = sizeof st};
    CHECK_OK(pl_source_get_stats(s, &st));
    CHECK_EQ_I64(st.documents, 0);
    CHECK_EQ_I64(st.length_max, 0);
    pl_source_free(s);
}

static void test_ranges_and_sizeof(void) {
    char prefix[512];
    snprintf(prefix, sizeof prefix, "%s/rng", g_dir);
    const int64_t lengths[] = {5, 6};
    CHECK(plf_write_megatron(prefix, PL_DTYPE_INT32, 2, lengths, 0) == 0);
    int rc;
    pl_source *s = open_megatron(prefix, &rc);
    CHECK_OK(rc);
    int64_t out[16], len;
    CHECK_EQ_I64(pl_source_document_length(s, -1, &len), PL_ERANGE);
    CHECK(strstr(pl_source_errmsg(s), "-1") != NULL);
    CHECK_EQ_I64(pl_source_document_length(s, 2, &len), PL_ERANGE);
    CHECK_EQ_I64(pl_source_read(s, 2, 0, 1, out, PL_DTYPE_INT64), PL_ERANGE);
    CHECK_EQ_I64(pl_source_read(s, 0, 3, 3, out, PL_DTYPE_INT64), PL_ERANGE);
    CHECK_EQ_I64(pl_source_read(s, 0, -1, 2, out, PL_DTYPE_INT64), PL_ERANGE);
    CHECK_EQ_I64(pl_source_read(s, 0, 0, -1, out, PL_DTYPE_INT64), PL_ERANGE);
    CHECK_EQ_I64(pl_source_read(s, 0, 0, 2, out, PL_DTYPE_UINT16), PL_EINVAL);
    CHECK_EQ_I64(pl_source_read(s, 0, 0, 2, NULL, PL_DTYPE_INT64), PL_EINVAL);
    CHECK_OK(pl_source_read(s, 0, 5, 0, out, PL_DTYPE_INT64));
    CHECK_OK(pl_source_read(s, 1, 2, 4, out, PL_DTYPE_INT64));
    CHECK_EQ_I64(out[0], 7);
    CHECK_EQ_I64(out[3], 10);
    size_t sz = pl_source_sizeof(s);
    CHECK(sz > sizeof(void *) && sz < 64 * 1024);
    pl_source_free(s);
    pl_source_free(NULL);
}

/* ---------------------------------------------------------- release pages */

/* Resident KiB (smaps "Rss:") of this process's mappings of files whose path
 * ends with suffix; -1 when no such mapping. */
static long mapped_rss_kib(const char *suffix) {
    FILE *f = fopen("/proc/self/smaps", "r");
    if (!f) return -1;
    char line[4096];
    int in = 0;
    long total = -1;
    size_t ns = strlen(suffix);
    while (fgets(line, sizeof line, f)) {
        char *sp = strchr(line, ' ');
        if (sp && sp > line && strchr(line, '-') && strchr(line, '-') < sp &&
            line[sp - line - 1] != ':') { /* a mapping's header */
            size_t n = strlen(line);
            while (n && (line[n - 1] == '\n' || line[n - 1] == ' ')) line[--n] = 0;
            in = n >= ns && strcmp(line + n - ns, suffix) == 0;
            if (in && total < 0) total = 0;
        } else if (in && strncmp(line, "Rss:", 4) == 0) {
            total += strtol(line + 4, NULL, 10);
        }
    }
    fclose(f);
    return total;
}

/* pl_source_release_pages: the .idx pages leave the process, the source
 * reads the same bytes afterwards (faulted back in), and NULL is EINVAL. */
static void test_release_pages(void) {
    char prefix[512];
    snprintf(prefix, sizeof prefix, "%s/release", g_dir);
    enum { N = 3000 }; /* .idx: 34 + 20 * N bytes, 15 pages of 4 KiB */
    static int64_t lengths[N];
    for (int64_t i = 0; i < N; i++) lengths[i] = 1 + (i * 7) % 40;
    CHECK(plf_write_megatron(prefix, PL_DTYPE_UINT16, N, lengths, 0) == 0);
    int rc;
    pl_source *s = open_megatron(prefix, &rc);
    CHECK_OK(rc);
    check_positions(s, 0, N, PL_DTYPE_UINT16); /* touches the whole .idx */
    long before = mapped_rss_kib("/release.idx");
    /* the lengths and pointers (36,034 bytes: 9 pages) are resident; the
       document_indices after them (24,000 bytes) were unmapped at open */
    long page_kib = sysconf(_SC_PAGESIZE) / 1024;
    CHECK(before >= 32 && before <= (36034 / (page_kib * 1024) + 1) * page_kib);
    CHECK_OK(pl_source_release_pages(s));
    CHECK_EQ_I64(mapped_rss_kib("/release.idx"), 0);
    CHECK_EQ_I64(mapped_rss_kib("/release.bin") > 0 ? 1 : 0, 0);
    check_positions(s, 0, N, PL_DTYPE_UINT16); /* same bytes, paged back in */
    CHECK(mapped_rss_kib("/release.idx") > 0);
    CHECK_OK(pl_source_release_pages(s)); /* twice is fine */
    CHECK_OK(pl_source_release_pages(s));
    int64_t len = -1;
    CHECK_OK(pl_source_document_length(s, N - 1, &len));
    CHECK_EQ_I64(len, lengths[N - 1]);
    CHECK_EQ_I64(pl_source_release_pages(NULL), PL_EINVAL);
    pl_source_free(s);
}

/* ---------------------------------------------------------- corruption */

static void expect_open_error(const char *prefix, int code, const char *file,
                              const char *offset) {
    int rc;
    pl_source *s = open_megatron(prefix, &rc);
    CHECK(s != NULL);
    if (rc != code)
        fprintf(stderr, "  %s: expected %s, got %s: %s\n", prefix,
                pl_err_name(code), pl_err_name(rc), pl_source_errmsg(s));
    CHECK_EQ_I64(rc, code);
    CHECK(msg_ok(s, file, offset));
    CHECK_EQ_I64(pl_source_num_documents(s), 0);
    pl_source_free(s);
}

/* A good 3-document uint16 fixture named `name`; returns its .idx path. */
static void good(const char *name, char *prefix, size_t cap) {
    const int64_t lengths[] = {4, 5, 6};
    snprintf(prefix, cap, "%s/%s", g_dir, name);
    CHECK(plf_write_megatron(prefix, PL_DTYPE_UINT16, 3, lengths, 0) == 0);
}

static void test_corrupt(void) {
    char p[512], idx[600], bin[600];
    /* Offsets in a 3-sequence .idx: lengths at 34, pointers at 46, document
     * indices at 70 (4 entries), end at 102. */
#define PATHS()                                  \
    snprintf(idx, sizeof idx, "%s.idx", p);      \
    snprintf(bin, sizeof bin, "%s.bin", p)

    good("bad_magic", p, sizeof p);
    PATHS();
    CHECK(plf_patch(idx, 0, "XMIDIDX", 7) == 0);
    expect_open_error(p, PL_EMAGIC, "bad_magic.idx", "offset 0");

    good("bad_version", p, sizeof p);
    PATHS();
    uint64_t v2 = 2;
    CHECK(plf_patch(idx, 9, &v2, 8) == 0);
    expect_open_error(p, PL_EVERSION, "bad_version.idx", "offset 9");

    good("bad_dtype", p, sizeof p);
    PATHS();
    uint8_t code = 9;
    CHECK(plf_patch(idx, 17, &code, 1) == 0);
    expect_open_error(p, PL_EDTYPE, "bad_dtype.idx", "offset 17");

    good("bad_count", p, sizeof p);
    PATHS();
    uint64_t s4 = 4;
    CHECK(plf_patch(idx, 18, &s4, 8) == 0);
    expect_open_error(p, PL_ECOUNT, "bad_count.idx", "offset 18");

    good("short_idx", p, sizeof p);
    PATHS();
    CHECK(truncate(idx, 20) == 0);
    expect_open_error(p, PL_ETRUNC, "short_idx.idx", "offset 20");

    good("short_bin", p, sizeof p);
    PATHS();
    CHECK(truncate(bin, 29) == 0); /* 15 tokens = 30 bytes */
    expect_open_error(p, PL_ETRUNC, "short_bin.bin", "offset 29");

    good("doc_first", p, sizeof p);
    PATHS();
    int64_t one = 1;
    CHECK(plf_patch(idx, 70, &one, 8) == 0);
    expect_open_error(p, PL_EDOCIDX, "doc_first.idx", "offset 70");

    good("doc_decr", p, sizeof p);
    PATHS();
    int64_t d[2] = {2, 1}; /* 0 2 1 3 */
    CHECK(plf_patch(idx, 78, d, 16) == 0);
    expect_open_error(p, PL_EDOCIDX, "doc_decr.idx", "offset 86");

    good("doc_last", p, sizeof p);
    PATHS();
    int64_t two = 2;
    CHECK(plf_patch(idx, 94, &two, 8) == 0);
    expect_open_error(p, PL_EDOCIDX, "doc_last.idx", "offset 94");

    /* Missing files. */
    snprintf(p, sizeof p, "%s/nothing_here", g_dir);
    expect_open_error(p, PL_ENOENT, "nothing_here.idx", "");
    good("no_bin", p, sizeof p);
    PATHS();
    CHECK(unlink(bin) == 0);
    expect_open_error(p, PL_ENOENT, "no_bin.bin", "");
    snprintf(p, sizeof p, "%s/zz*", g_dir);
    expect_open_error(p, PL_ENOENT, "zz*", "");
#undef PATHS
}

/* A bad pointer or length fails that document only. */
static void test_bounds(void) {
    char p[512], idx[600];
    good("bad_ptr", p, sizeof p);
    snprintf(idx, sizeof idx, "%s.idx", p);
    int64_t far = 1000;
    CHECK(plf_patch(idx, 46 + 8, &far, 8) == 0); /* record 1's pointer */
    int rc;
    pl_source *s = open_megatron(p, &rc);
    CHECK_OK(rc);
    int64_t len, out[8];
    CHECK_EQ_I64(pl_source_document_length(s, 1, &len), PL_EBOUNDS);
    CHECK(msg_ok(s, "bad_ptr.idx", "offset 54"));
    CHECK(strstr(pl_source_errmsg(s), "record 1") != NULL);
    CHECK_EQ_I64(pl_source_read(s, 1, 0, 1, out, PL_DTYPE_INT64), PL_EBOUNDS);
    CHECK_OK(pl_source_read(s, 0, 0, 4, out, PL_DTYPE_INT64));
    CHECK_EQ_I64(out[3], 3);
    CHECK_OK(pl_source_read(s, 2, 0, 6, out, PL_DTYPE_INT64));
    CHECK_EQ_I64(out[0], 9);
    /* Other documents still read, and stats reports the bad one. */
    pl_source_stats st = {.size = sizeof st};
    CHECK_EQ_I64(pl_source_get_stats(s, &st), PL_EBOUNDS);
    pl_source_free(s);

    good("neg_len", p, sizeof p);
    snprintf(idx, sizeof idx, "%s.idx", p);
    int32_t neg = -5;
    CHECK(plf_patch(idx, 34, &neg, 4) == 0); /* record 0's length */
    s = open_megatron(p, &rc);
    CHECK_OK(rc);
    CHECK_EQ_I64(pl_source_document_length(s, 0, &len), PL_EBOUNDS);
    CHECK(msg_ok(s, "neg_len.idx", "offset 34"));
    CHECK_OK(pl_source_document_length(s, 1, &len));
    CHECK_EQ_I64(len, 5);
    pl_source_free(s);

    /* A length running past the .bin (not the last record). */
    good("long_len", p, sizeof p);
    snprintf(idx, sizeof idx, "%s.idx", p);
    int32_t big = 100;
    CHECK(plf_patch(idx, 34 + 4, &big, 4) == 0);
    s = open_megatron(p, &rc);
    CHECK_OK(rc);
    char err[PL__ERRMSG_CAP];
    CHECK_EQ_I64(pl__source_length(s, 1, &len, err, sizeof err), PL_EBOUNDS);
    CHECK(strstr(err, "long_len.idx") && strstr(err, "offset 38"));
    CHECK_EQ_I64(pl_source_errmsg(s)[0], 0); /* internal call: handle clean */
    pl_source_free(s);
}

/* ---------------------------------------------------------- threads */

typedef struct {
    pl_source *s;
    int bad;
} reader_arg;

static void *reader(void *p) {
    reader_arg *a = p;
    char err[PL__ERRMSG_CAP];
    int64_t buf[64];
    for (int rep = 0; rep < 200; rep++) {
        int64_t k = 0;
        for (int64_t i = 0; i < pl_source_num_documents(a->s); i++) {
            int64_t len;
            if (pl__source_length(a->s, i, &len, err, sizeof err)) a->bad++;
            if (pl__source_read(a->s, i, 0, len, buf, PL_DTYPE_INT64, err,
                                sizeof err))
                a->bad++;
            for (int64_t j = 0; j < len; j++)
                if (buf[j] != k + j) a->bad++;
            k += len;
        }
    }
    return NULL;
}

static void test_threads(void) {
    char prefix[512];
    snprintf(prefix, sizeof prefix, "%s/thr", g_dir);
    int64_t lengths[40];
    for (int i = 0; i < 40; i++) lengths[i] = 1 + (i * 7) % 60;
    CHECK(plf_write_megatron(prefix, PL_DTYPE_INT32, 40, lengths, 0) == 0);
    int rc;
    pl_source *s = open_megatron(prefix, &rc);
    CHECK_OK(rc);
    pthread_t th[4];
    reader_arg a[4];
    for (int i = 0; i < 4; i++) {
        a[i].s = s;
        a[i].bad = 0;
        pthread_create(&th[i], NULL, reader, &a[i]);
    }
    for (int i = 0; i < 4; i++) {
        pthread_join(th[i], NULL);
        CHECK_EQ_I64(a[i].bad, 0);
    }
    pl_source_free(s);
}

static void test_bad_options(void) {
    pl_source *s = NULL;
    CHECK_EQ_I64(pl_source_open(NULL, &s), PL_EINVAL);
    pl_source_free(s);
    pl_source_options o = {0};
    o.version = 99;
    o.type = PL_SOURCE_MEGATRON;
    o.path = "x";
    CHECK_EQ_I64(pl_source_open(&o, &s), PL_EINVAL);
    pl_source_free(s);
    o.version = PL_SOURCE_OPTIONS_VERSION;
    o.type = (pl_source_type)7;
    CHECK_EQ_I64(pl_source_open(&o, &s), PL_EINVAL);
    pl_source_free(s);
    CHECK_EQ_I64(pl_source_open(&o, NULL), PL_EINVAL);
}

/* A prefix that is also a directory (megatron-core's GPTDataset keeps its
 * index cache in PREFIX/cache) opens as the prefix. */
static void test_prefix_beside_directory(void) {
    char prefix[512], sub[600];
    snprintf(prefix, sizeof prefix, "%s/withcache", g_dir);
    const int64_t lengths[] = {4, 2};
    CHECK(plf_write_megatron(prefix, PL_DTYPE_INT32, 2, lengths, 0) == 0);
    mkdir(prefix, 0755);
    snprintf(sub, sizeof sub, "%s/cache", prefix);
    mkdir(sub, 0755);
    int rc;
    pl_source *s = open_megatron(prefix, &rc);
    CHECK_OK(rc);
    CHECK_EQ_I64(pl_source_num_documents(s), 2);
    pl_source_free(s);
}

int main(void) {
    g_dir = pl_test_tmpdir();
    test_prefix_beside_directory();
    test_dtypes();
    test_float_refused();
    test_multi_file();
    test_stats_large();
    test_empty();
    test_ranges_and_sizeof();
    test_release_pages();
    test_corrupt();
    test_bounds();
    test_threads();
    test_bad_options();
    TEST_END();
}
