/*
 * Parquet sources (type parquet: src/source/text/parquet_shim.cc over Apache Arrow's C++
 * reader), tokenized online with the byte tokenizer (token = UTF-8 byte, eos
 * 256), so every expected token is known.  The Parquet files are written by
 * pyarrow (the real writer) from a JSON Lines file this test writes: the
 * Python of the build (PL_TEST_PYTHON) runs once, as a fixture writer only.
 * Checks: documents across row groups and files, the same tokens with 1 and
 * 3 tokenizer threads, concurrent lengths and reads racing the lookahead (run
 * under ThreadSanitizer too), another schema (PL_ERECORD naming the file, or
 * left out and counted with skip_damaged), and a truncated file.  Without
 * parquet support (PL_TEST_PARQUET unset) a parquet source must be
 * PL_ECONFIG "parquet support not built".
 */
#include "config/config.h"
#include "source/source.h"
#include "testutil.h"

#include <pthread.h>

#define NDOC 300

static const char *dir;

/* Document i's text (deterministic, varied lengths, UTF-8). */
static void doc_text(int i, char *buf, size_t cap) {
    int n = 1 + (i * 37) % 200;
    size_t k = (size_t)snprintf(buf, cap, "doc %d:", i);
    for (int j = 0; j < n && k + 2 < cap; j++) buf[k++] = (char)('a' + (i + j) % 26);
    if (i % 7 == 0 && k + 4 < cap) {
        memcpy(buf + k, "\n\"\xc3\xa9", 4);
        k += 4;
    }
    buf[k] = '\0';
}

static int open_pq(const char *path, const char *key, int threads, int skip,
                   pl_source **out) {
    pl_tokenizer tok;
    pl_tokenizer_bytes(&tok);
    pl_source_options o;
    memset(&o, 0, sizeof o);
    o.version = PL_SOURCE_OPTIONS_VERSION;
    o.type = PL_SOURCE_PARQUET;
    o.path = path;
    o.name = "pq";
    o.eos_id = -1;
    o.tokenizer = &tok;
    o.add_eos = 1;
    o.tokenizer_threads = threads;
    o.lookahead = 16;
    o.text_key = key;
    return pl__source_open(&o, skip, out);
}

#ifndef PL_TEST_PARQUET
int main(void) {
    dir = pl_test_tmpdir();
    char p[512];
    snprintf(p, sizeof p, "%s/a.parquet", dir);
    CHECK(pl_test_write_file(p, "PAR1....PAR1", 12) == 0);
    pl_source *src = NULL;
    CHECK_EQ_I64(open_pq(p, "text", 1, 0, &src), PL_ECONFIG);
    CHECK(strstr(pl_source_errmsg(src), "parquet support not built") != NULL);
    pl_source_free(src);
    TEST_END();
}
#else

/* pyarrow writes JSON Lines file `in`'s texts (lines [from, to)) to `out`:
 * column `key`, an int column "id" first, row groups of `group` rows. */
static void write_parquet(const char *in, int from, int to, const char *out,
                          const char *key, int group) {
    char cmd[4096];
    snprintf(cmd, sizeof cmd,
             "'%s' -c \"import json, sys, pyarrow as pa, pyarrow.parquet as pq; "
             "t = [json.loads(l)['text'] for l in open(sys.argv[1])][%d:%d]; "
             "pq.write_table(pa.table({'id': list(range(len(t))), sys.argv[3]: t}), "
             "sys.argv[2], row_group_size=%d)\" '%s' '%s' '%s'",
             PL_TEST_PYTHON, from, to, group, in, out, key);
    if (system(cmd) != 0) {
        fprintf(stderr, "cannot write %s with pyarrow (%s)\n", out, PL_TEST_PYTHON);
        exit(2);
    }
}

static void check_docs(pl_source *src, int first, int n, const char *what) {
    CHECK_EQ_I64(pl_source_num_documents(src), n);
    char t[512];
    int64_t tok[600];
    int bad = 0;
    for (int i = 0; i < n && !bad; i++) {
        doc_text(first + i, t, sizeof t);
        int64_t m = (int64_t)strlen(t), len = -1;
        int rc = pl_source_document_length(src, i, &len);
        if (rc || len != m + 1) {
            fprintf(stderr, "%s: doc %d: rc %d len %lld want %lld: %s\n", what, i, rc,
                    (long long)len, (long long)m + 1, pl_source_errmsg(src));
            bad = 1;
            break;
        }
        rc = pl_source_read(src, i, 0, len, tok, PL_DTYPE_INT64);
        for (int64_t j = 0; j < m && !rc; j++)
            if (tok[j] != (uint8_t)t[j]) bad = 1;
        if (rc || tok[m] != 256) bad = 1;
    }
    CHECK(!bad);
}

typedef struct {
    pl_source *src;
    int id, bad;
} conc_arg;

static void *conc_thread(void *arg) {
    conc_arg *a = arg;
    char t[512];
    int64_t tok[600];
    for (int k = 0; k < NDOC; k++) {
        int i = (k * 7 + a->id * 61) % NDOC;
        int64_t len = 0;
        doc_text(i, t, sizeof t);
        int64_t m = (int64_t)strlen(t);
        if (pl_source_document_length(a->src, i, &len) || len != m + 1 ||
            pl_source_read(a->src, i, 0, len, tok, PL_DTYPE_INT64) || tok[m] != 256) {
            a->bad = 1;
            continue;
        }
        for (int64_t j = 0; j < m; j++)
            if (tok[j] != (uint8_t)t[j]) a->bad = 1;
    }
    return NULL;
}

int main(void) {
    dir = pl_test_tmpdir();
    char jl[512], a[512], b[512], d[512], nokey[512], cut[512];
    snprintf(jl, sizeof jl, "%s/docs.jsonl", dir);
    FILE *f = fopen(jl, "w");
    CHECK(f != NULL);
    for (int i = 0; i < NDOC && f; i++) {
        char t[512], e[1100];
        doc_text(i, t, sizeof t);
        size_t k = 0;
        for (const char *s = t; *s; s++) {
            if (*s == '\n') e[k++] = '\\', e[k++] = 'n';
            else if (*s == '"') e[k++] = '\\', e[k++] = '"';
            else e[k++] = *s;
        }
        e[k] = '\0';
        fprintf(f, "{\"text\": \"%s\"}\n", e);
    }
    if (f) fclose(f);
    snprintf(d, sizeof d, "%s/parts", dir);
    mkdir(d, 0755);
    snprintf(a, sizeof a, "%s/parts/a.parquet", dir);
    snprintf(b, sizeof b, "%s/parts/b.parquet", dir);
    write_parquet(jl, 0, 100, a, "text", 13);
    write_parquet(jl, 100, NDOC, b, "text", 64);

    /* A directory of two files, row groups of 13 and 64 rows. */
    for (int threads = 1; threads <= 3; threads += 2) {
        pl_source *src = NULL;
        CHECK_OK(open_pq(d, "text", threads, 0, &src));
        CHECK_EQ_I64(pl_source_num_files(src), 2);
        check_docs(src, 0, NDOC, threads == 1 ? "1 thread" : "3 threads");
        CHECK_EQ_I64(pl_source_num_tokenized(src), NDOC);
        pl_source_free(src);
    }

    /* Lengths and reads from 4 threads while the lookahead queues the order. */
    for (int round = 0; round < 2; round++) {
        pl_source *src = NULL;
        CHECK_OK(open_pq(d, "text", 3, 0, &src));
        pl__perm perm;
        pl__perm_init(&perm, NDOC, 11, "t", 0);
        for (int64_t pos = 0; pos < NDOC / 2; pos += 8)
            pl__source_lookahead(src, &perm, 0, NDOC, 0, pos);
        conc_arg ca[4];
        pthread_t th[4];
        for (int k = 0; k < 4; k++) {
            ca[k] = (conc_arg){src, k, 0};
            pthread_create(&th[k], NULL, conc_thread, &ca[k]);
        }
        int bad = 0;
        for (int k = 0; k < 4; k++) {
            pthread_join(th[k], NULL);
            bad |= ca[k].bad;
        }
        CHECK(!bad);
        pl_source_free(src);
    }

    /* Another schema: no column "text". */
    snprintf(nokey, sizeof nokey, "%s/parts/c.parquet", dir);
    write_parquet(jl, 0, 10, nokey, "body", 4);
    pl_source *src = NULL;
    CHECK_EQ_I64(open_pq(d, "text", 1, 0, &src), PL_ERECORD);
    CHECK(strstr(pl_source_errmsg(src), "c.parquet: no column 'text'") != NULL);
    pl_source_free(src);
    src = NULL;
    CHECK_OK(open_pq(d, "text", 1, 1, &src)); /* skip_damaged: c is left out */
    CHECK_EQ_I64(pl_source_num_skipped(src), 1);
    check_docs(src, 0, NDOC, "skip");
    pl_source_free(src);
    src = NULL;
    CHECK_OK(open_pq(nokey, "body", 1, 0, &src)); /* the same file by its own key */
    check_docs(src, 0, 10, "body");
    pl_source_free(src);

    /* Truncated: the footer is gone. */
    snprintf(cut, sizeof cut, "%s/cut.parquet", dir);
    {
        FILE *in = fopen(a, "rb");
        static char buf[1 << 20];
        size_t n = in ? fread(buf, 1, sizeof buf, in) : 0;
        if (in) fclose(in);
        CHECK(n > 100);
        CHECK(pl_test_write_file(cut, buf, n - 50) == 0);
    }
    src = NULL;
    CHECK_EQ_I64(open_pq(cut, "text", 1, 0, &src), PL_ETRUNC);
    CHECK(strstr(pl_source_errmsg(src), "cut.parquet: truncated Parquet file") != NULL);
    pl_source_free(src);
    TEST_END();
}
#endif
