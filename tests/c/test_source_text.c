/*
 * Raw text sources: JSON Lines (plain, .gz, .zst) and text files, tokenized
 * online with the built-in byte tokenizer (token = UTF-8 byte, eos 256), so
 * every expected token is known: records found at open, lengths and tokens,
 * bad records named by file, line and byte offset, truncated and corrupt
 * compressed files, the .plrec sidecar, and plans that do not depend on the
 * number of tokenizer threads or the lookahead.
 */
#include "config/config.h"
#include "source/source.h"
#include "testutil.h"
#ifdef PL_WITH_SIMDJSON
#include "source/text/json_shim.h"
#endif

#include <time.h>
#include <pthread.h>
#include <stdatomic.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <zlib.h>
#include <zstd.h>

static const char *dir;

#define NDOC 300

/* Document i's text (deterministic, varied lengths, some escapes). */
static void doc_text(int i, char *buf, size_t cap) {
    int n = 1 + (i * 37) % 200;
    size_t k = 0;
    k += (size_t)snprintf(buf + k, cap - k, "doc %d:", i);
    for (int j = 0; j < n && k + 2 < cap; j++) buf[k++] = (char)('a' + (i + j) % 26);
    if (i % 7 == 0 && k + 4 < cap) {
        memcpy(buf + k, "\n\"\xc3\xa9", 4); /* newline, quote, e-acute */
        k += 4;
    }
    buf[k] = '\0';
}

/* JSON-escape s into out. */
static void json_escape(const char *s, char *out) {
    size_t k = 0;
    for (; *s; s++) {
        if (*s == '\n') out[k++] = '\\', out[k++] = 'n';
        else if (*s == '"') out[k++] = '\\', out[k++] = '"';
        else out[k++] = *s;
    }
    out[k] = '\0';
}

static size_t jsonl_corpus(char *buf, size_t cap) {
    size_t k = 0;
    char t[512], e[1100];
    for (int i = 0; i < NDOC; i++) {
        doc_text(i, t, sizeof t);
        json_escape(t, e);
        k += (size_t)snprintf(buf + k, cap - k, "{\"id\": %d, \"text\": \"%s\"}\n", i, e);
        if (i % 50 == 3) k += (size_t)snprintf(buf + k, cap - k, "   \n"); /* blank */
    }
    return k;
}

static int open_text(const char *path, pl_source_type type, int write_index,
                     int threads, int64_t max_record, pl_source **out) {
    pl_tokenizer tok;
    pl_tokenizer_bytes(&tok);
    pl_source_options o;
    memset(&o, 0, sizeof o);
    o.version = PL_SOURCE_OPTIONS_VERSION;
    o.type = type;
    o.path = path;
    o.name = "t";
    o.eos_id = -1;
    o.tokenizer = &tok;
    o.add_eos = 1;
    o.tokenizer_threads = threads;
    o.lookahead = 16;
    o.max_record_bytes = max_record;
    o.write_index = write_index;
    return pl_source_open(&o, out);
}

/* Every document of src has the bytes of doc_text(i) plus eos. */
static void check_docs(pl_source *src, const char *what) {
    CHECK_EQ_I64(pl_source_num_documents(src), NDOC);
    char t[512];
    int64_t tok[600];
    int bad = 0;
    for (int i = 0; i < NDOC && !bad; i++) {
        doc_text(i, t, sizeof t);
        int64_t n = (int64_t)strlen(t), len = -1;
        int rc = pl_source_document_length(src, i, &len);
        if (rc || len != n + 1) {
            fprintf(stderr, "%s: doc %d: rc %d len %lld want %lld: %s\n", what, i, rc,
                    (long long)len, (long long)n + 1, pl_source_errmsg(src));
            bad = 1;
            break;
        }
        rc = pl_source_read(src, i, 0, len, tok, PL_DTYPE_INT64);
        for (int64_t j = 0; j < n && !rc; j++)
            if (tok[j] != (uint8_t)t[j]) bad = 1;
        if (rc || tok[n] != 256) bad = 1;
    }
    CHECK(!bad);
}

static void write_gz(const char *path, const char *data, size_t n, size_t cut) {
    uLongf cap = compressBound((uLong)n) + 64;
    unsigned char *out = malloc(cap);
    z_stream z;
    memset(&z, 0, sizeof z);
    deflateInit2(&z, 6, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY);
    z.next_in = (Bytef *)data;
    z.avail_in = (uInt)n;
    z.next_out = out;
    z.avail_out = (uInt)cap;
    deflate(&z, Z_FINISH);
    size_t len = z.total_out;
    deflateEnd(&z);
    if (cut) len = cut < len ? cut : len;
    pl_test_write_file(path, out, len);
    free(out);
}

static size_t write_zst(const char *path, const char *data, size_t n, size_t cut) {
    size_t cap = ZSTD_compressBound(n);
    char *out = malloc(cap);
    size_t len = ZSTD_compress(out, cap, data, n, 3);
    size_t full = len;
    if (cut) len = cut < len ? cut : len;
    pl_test_write_file(path, out, len);
    free(out);
    return full;
}

static void test_formats(void) {
    static char corpus[NDOC * 1200];
    size_t n = jsonl_corpus(corpus, sizeof corpus);
    char p[512];
    pl_source *src;

    snprintf(p, sizeof p, "%s/plain.jsonl", dir);
    pl_test_write_file(p, corpus, n);
    CHECK_OK(open_text(p, PL_SOURCE_JSONL, 0, 2, 0, &src));
    check_docs(src, "plain");
    /* Each document was tokenized once (lookahead or read, not both). */
    CHECK(pl_source_num_tokenized(src) >= NDOC);
    {
        /* Tokenizing was timed: some CPU, and no more than the process used. */
        struct timespec ts;
        clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
        int64_t proc = (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
        int64_t tok = pl_source_tokenize_cpu_ns(src);
        CHECK(tok > 0);
        CHECK(tok <= proc);
        CHECK(pl_source_tokenize_cpu_ns(src) >= tok); /* never goes back */
        CHECK_EQ_I64(pl_source_tokenize_cpu_ns(NULL), 0);
    }
    CHECK_EQ_I64(pl_source_token_dtype(src), PL_DTYPE_INT32);
    pl_source_free(src);

    snprintf(p, sizeof p, "%s/z.jsonl.gz", dir);
    write_gz(p, corpus, n, 0);
    CHECK_OK(open_text(p, PL_SOURCE_JSONL, 0, 1, 0, &src));
    check_docs(src, "gz");
    pl_source_free(src);

    snprintf(p, sizeof p, "%s/z.jsonl.zst", dir);
    size_t zlen = write_zst(p, corpus, n, 0);
    CHECK_OK(open_text(p, PL_SOURCE_JSONL, 0, 1, 0, &src));
    check_docs(src, "zst");
    pl_source_free(src);

    /* Truncated: refused with the file and offset, or (skip) the complete
       records kept and the partial one counted. */
    snprintf(p, sizeof p, "%s/cut.jsonl.zst", dir);
    write_zst(p, corpus, n, zlen / 2);
    int rc = open_text(p, PL_SOURCE_JSONL, 0, 1, 0, &src);
    CHECK_EQ_I64(rc, PL_ETRUNC);
    CHECK(strstr(pl_source_errmsg(src), "cut.jsonl.zst") != NULL);
    CHECK(strstr(pl_source_errmsg(src), "truncated") != NULL);
    pl_source_free(src);
    snprintf(p, sizeof p, "%s/cut.jsonl.gz", dir);
    write_gz(p, corpus, n, 2000);
    rc = open_text(p, PL_SOURCE_JSONL, 0, 1, 0, &src);
    CHECK_EQ_I64(rc, PL_ETRUNC);
    CHECK(strstr(pl_source_errmsg(src), "cut.jsonl.gz: gzip stream truncated at "
                                        "compressed byte offset 2000") != NULL);
    pl_source_free(src);
    {
        pl_tokenizer tok;
        pl_tokenizer_bytes(&tok);
        pl_source_options o;
        memset(&o, 0, sizeof o);
        o.version = PL_SOURCE_OPTIONS_VERSION;
        o.type = PL_SOURCE_JSONL;
        o.path = p;
        o.eos_id = -1;
        o.tokenizer = &tok;
        CHECK_OK(pl__source_open(&o, 1, &src));
        int64_t docs = pl_source_num_documents(src);
        CHECK(docs > 0 && docs < NDOC);
        CHECK_EQ_I64(pl_source_num_skipped(src), 1);
        /* The kept records are the first ones, intact. */
        char t[512];
        int64_t len = 0;
        doc_text((int)docs - 1, t, sizeof t);
        CHECK_OK(pl_source_document_length(src, docs - 1, &len));
        CHECK_EQ_I64(len, (int64_t)strlen(t));
        pl_source_free(src);
    }
    /* Corrupt gzip data. */
    snprintf(p, sizeof p, "%s/bad.jsonl.gz", dir);
    write_gz(p, corpus, n, 0);
    {
        FILE *f = fopen(p, "r+b");
        fseek(f, 40, SEEK_SET);
        fputs("\xff\xff\xff\xff\xff\xff\xff\xff", f);
        fclose(f);
    }
    rc = open_text(p, PL_SOURCE_JSONL, 0, 1, 0, &src);
    CHECK(rc == PL_ERECORD || rc == PL_ETRUNC);
    CHECK(strstr(pl_source_errmsg(src), "bad.jsonl.gz") != NULL);
    pl_source_free(src);

    /* The .plrec sidecar: written with write_index 1, then used. */
    snprintf(p, sizeof p, "%s/side.jsonl", dir);
    pl_test_write_file(p, corpus, n);
    CHECK_OK(open_text(p, PL_SOURCE_JSONL, 1, 1, 0, &src));
    pl_source_free(src);
    char side[600];
    snprintf(side, sizeof side, "%s.plrec", p);
    struct stat st;
    CHECK(stat(side, &st) == 0 && st.st_size == 48 + NDOC * 16);
    CHECK_OK(open_text(p, PL_SOURCE_JSONL, 1, 1, 0, &src));
    check_docs(src, "sidecar");
    pl_source_free(src);
    /* Not written by default (write_index 0). */
    snprintf(p, sizeof p, "%s/plain.jsonl.plrec", dir);
    CHECK(stat(p, &st) != 0);

    /* type text: one document per file, a directory of them. */
    char d2[512];
    snprintf(d2, sizeof d2, "%s/texts", dir);
    mkdir(d2, 0755);
    for (int i = 0; i < 5; i++) {
        char t[512];
        doc_text(i, t, sizeof t);
        snprintf(p, sizeof p, "%s/f%02d.txt", d2, i);
        pl_test_write_file(p, t, strlen(t));
    }
    CHECK_OK(open_text(d2, PL_SOURCE_TEXT, 0, 1, 0, &src));
    CHECK_EQ_I64(pl_source_num_documents(src), 5);
    for (int i = 0; i < 5; i++) {
        char t[512];
        int64_t len = 0;
        doc_text(i, t, sizeof t);
        CHECK_OK(pl_source_document_length(src, i, &len));
        CHECK_EQ_I64(len, (int64_t)strlen(t) + 1);
    }
    pl_source_free(src);
}

/* One bad record among good ones: PL_ERECORD naming file, line, offset. */
static void check_bad(const char *name, const char *line2, const char *want,
                      int64_t max_record) {
    char p[512];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    char buf[1024];
    int n = snprintf(buf, sizeof buf, "{\"text\": \"good\"}\n%s\n{\"text\": \"ok\"}\n", line2);
    pl_test_write_file(p, buf, (size_t)n);
    pl_source *src;
    CHECK_OK(open_text(p, PL_SOURCE_JSONL, 0, 1, max_record, &src));
    CHECK_EQ_I64(pl_source_num_documents(src), 3);
    int64_t len;
    CHECK_OK(pl_source_document_length(src, 0, &len));
    int rc = pl_source_document_length(src, 1, &len);
    CHECK_EQ_I64(rc, PL_ERECORD);
    const char *m = pl_source_errmsg(src);
    int ok = strstr(m, name) && strstr(m, "line 2 (byte offset 17)") && strstr(m, want);
    if (!ok) fprintf(stderr, "%s: message: %s (want %s)\n", name, m, want);
    CHECK(ok);
    int64_t out[8];
    CHECK_EQ_I64(pl_source_read(src, 1, 0, 1, out, PL_DTYPE_INT64), PL_ERECORD);
    CHECK_OK(pl_source_document_length(src, 2, &len));
    CHECK_EQ_I64(len, 3);
    pl_source_free(src);
}

/* Line numbers far into a file (past the line checkpoints), with blank lines. */
static void test_line_numbers(void) {
    char p[512];
    snprintf(p, sizeof p, "%s/long.jsonl", dir);
    FILE *f = fopen(p, "w");
    long off = 0, bad_off = 0;
    for (int i = 0; i < 10000; i++) {
        if (i % 1000 == 7) off += fprintf(f, "\n"); /* blank: not a record */
        if (i == 9500) {
            bad_off = off;
            off += fprintf(f, "{\"text\": null}\n");
        } else {
            off += fprintf(f, "{\"text\": \"d%d\"}\n", i);
        }
    }
    fclose(f);
    pl_source *src;
    CHECK_OK(open_text(p, PL_SOURCE_JSONL, 0, 1, 0, &src));
    CHECK_EQ_I64(pl_source_num_documents(src), 10000);
    int64_t len;
    CHECK_EQ_I64(pl_source_document_length(src, 9500, &len), PL_ERECORD);
    char want[128];
    /* 9500 records and 10 blank lines before it: line 9511. */
    snprintf(want, sizeof want, "line 9511 (byte offset %ld)", bad_off);
    if (!strstr(pl_source_errmsg(src), want))
        fprintf(stderr, "message: %s (want %s)\n", pl_source_errmsg(src), want);
    CHECK(strstr(pl_source_errmsg(src), want) != NULL);
    pl_source_free(src);
    /* The same in a .zst (decompressed in memory). */
    static char buf[400000];
    FILE *g = fopen(p, "rb");
    size_t n = fread(buf, 1, sizeof buf, g);
    fclose(g);
    snprintf(p, sizeof p, "%s/long.jsonl.zst", dir);
    write_zst(p, buf, n, 0);
    CHECK_OK(open_text(p, PL_SOURCE_JSONL, 0, 1, 0, &src));
    CHECK_EQ_I64(pl_source_document_length(src, 9500, &len), PL_ERECORD);
    CHECK(strstr(pl_source_errmsg(src), want) != NULL);
    pl_source_free(src);
}

static void test_bad_records(void) {
    check_bad("malformed.jsonl", "{\"text\": \"abc", "malformed JSON", 0);
    check_bad("missing.jsonl", "{\"body\": \"abc\"}", "key 'text' is missing", 0);
    check_bad("nonstring.jsonl", "{\"text\": 42}", "key 'text' is not a string", 0);
    check_bad("array.jsonl", "[1, 2]", "expected a JSON object", 0);
    check_bad("utf8.jsonl", "{\"text\": \"ab\xff\"}", "invalid UTF-8", 0);
    check_bad("empty.jsonl", "{\"text\": \"\"}", "empty document", 0);
    check_bad("huge.jsonl", "{\"text\": \"0123456789012345678901234567890123456789\"}",
              "over the limit of 32 (max_record_bytes)", 32);
    /* type text: invalid UTF-8 names the byte offset. */
    char p[512];
    snprintf(p, sizeof p, "%s/bad.txt", dir);
    pl_test_write_file(p, "hello \xc3\x28 world", 15);
    pl_source *src;
    CHECK_OK(open_text(p, PL_SOURCE_TEXT, 0, 1, 0, &src));
    int64_t len;
    CHECK_EQ_I64(pl_source_document_length(src, 0, &len), PL_ERECORD);
    CHECK(strstr(pl_source_errmsg(src), "bad.txt: invalid UTF-8 at byte offset 6") != NULL);
    pl_source_free(src);
    /* JSONL: the offset of the bad byte itself, in the file (record 1 starts at
       byte 15; its 0xff is byte 12 of the record: 27). */
    snprintf(p, sizeof p, "%s/badoff.jsonl", dir);
    pl_test_write_file(p, "{\"text\": \"ok\"}\n{\"text\": \"ab\xff\"}\n", 31);
    CHECK_OK(open_text(p, PL_SOURCE_JSONL, 0, 1, 0, &src));
    CHECK_EQ_I64(pl_source_document_length(src, 1, &len), PL_ERECORD);
    if (!strstr(pl_source_errmsg(src), "invalid UTF-8 at byte offset 27"))
        fprintf(stderr, "message: %s\n", pl_source_errmsg(src));
    CHECK(strstr(pl_source_errmsg(src), "invalid UTF-8 at byte offset 27") != NULL);
    pl_source_free(src);
}

/* JSON records read the same by either parser (simdjson where built, else
 * Jansson): escapes, a key given twice (the last), numbers past int64, nested
 * values, a NUL escape; in a plain file (read with padding) and a .zst one
 * (parsed in the decompressed buffer, the last record at its very end). */
static void test_json_records(void) {
    static const char *const lines[] = {
        "{\"text\": \"a\\nb\\t\\\"\\\\\\/\\u00e9\\ud83d\\ude00\\u0000z\"}",
        "{\"text\": \"first\", \"id\": 1, \"text\": \"second\"}",
        "{\"id\": 99999999999999999999999, \"n\": -1e300, \"text\": \"big\"}",
        "{\"meta\": {\"text\": \"inner\", \"a\": [1, {\"b\": null}, true]}, \"text\": \"outer\"}",
        "  {\"text\":\"spaces\"}  ",
    };
    static const char want0[] = "a\nb\t\"\\/\xc3\xa9\xf0\x9f\x98\x80\0z";
    const char *want[5] = {want0, "second", "big", "outer", "spaces"};
    const size_t wlen[5] = {sizeof want0 - 1, 6, 3, 5, 6};
    char buf[1024];
    size_t k = 0;
    for (int i = 0; i < 5; i++)
        k += (size_t)snprintf(buf + k, sizeof buf - k, "%s%s", lines[i], i < 4 ? "\n" : "");
    char p[512];
    for (int z = 0; z < 2; z++) {
        if (z == 0) {
            snprintf(p, sizeof p, "%s/records.jsonl", dir);
            pl_test_write_file(p, buf, k);
        } else {
            snprintf(p, sizeof p, "%s/records.jsonl.zst", dir);
            write_zst(p, buf, k, 0);
        }
        pl_source *src;
        CHECK_OK(open_text(p, PL_SOURCE_JSONL, 0, 1, 0, &src));
        CHECK_EQ_I64(pl_source_num_documents(src), 5);
        for (int i = 0; i < 5; i++) {
            int64_t len = -1, tok[64];
            CHECK_OK(pl_source_document_length(src, i, &len));
            CHECK_EQ_I64(len, (int64_t)wlen[i] + 1);
            CHECK_OK(pl_source_read(src, i, 0, len, tok, PL_DTYPE_INT64));
            int same = tok[wlen[i]] == 256;
            for (size_t j = 0; j < wlen[i]; j++) same &= tok[j] == (uint8_t)want[i][j];
            if (!same) fprintf(stderr, "%s: record %d differs\n", p, i);
            CHECK(same);
        }
        pl_source_free(src);
    }
    /* Refused by both, with Jansson's message. */
    check_bad("surrogate.jsonl", "{\"text\": \"a\\ud800b\"}", "malformed JSON", 0);
    check_bad("lowsurrogate.jsonl", "{\"text\": \"a\\udc00b\"}", "malformed JSON", 0);
    check_bad("trailing.jsonl", "{\"text\": \"x\"} y", "malformed JSON", 0);
    check_bad("nested_only.jsonl", "{\"m\": {\"text\": \"x\"}}", "key 'text' is missing", 0);
    check_bad("other_utf8.jsonl", "{\"o\": \"\xff\", \"text\": \"ok\"}", "invalid UTF-8", 0);
    check_bad("escape.jsonl", "{\"text\": \"a\\qb\"}", "malformed JSON", 0);
    /* A NUL escape in a key (Jansson cannot hold one): refused in both builds. */
    check_bad("nulkey.jsonl", "{\"text\": \"x\", \"k\\u0000\": 1}", "NUL byte in object key", 0);
    check_bad("nulkey_nested.jsonl", "{\"m\": {\"\\u0000\": 2}, \"text\": \"x\"}",
              "NUL byte in object key", 0);
}

/* A tokenizer (vocabulary of 300) that gives the byte tokenizer's ids, except
 * for a text starting "big" (one id 300 in the middle) or "neg" (id -5). */
static int oov_encode(void *ctx, int64_t n, const char *const *texts, const size_t *lens,
                      int32_t **ids, int64_t *counts, char *err, size_t errcap) {
    pl_tokenizer *bytes = ctx;
    int rc = bytes->encode_batch(bytes->ctx, n, texts, lens, ids, counts, err, errcap);
    for (int64_t i = 0; i < n && rc == PL_OK; i++) {
        if (lens[i] >= 4 && memcmp(texts[i], "big", 3) == 0) ids[i][2] = 300;
        if (lens[i] >= 4 && memcmp(texts[i], "neg", 3) == 0) ids[i][lens[i] - 1] = -5;
    }
    return rc;
}

/* Ids outside the tokenizer's vocabulary refuse their record (named, with the
 * id), never reach a batch; the other records keep their exact ids. */
static void test_ids_outside_vocabulary(void) {
    char p[512];
    snprintf(p, sizeof p, "%s/oov.jsonl", dir);
    const char *body = "{\"text\": \"good one\"}\n{\"text\": \"big one\"}\n"
                       "{\"text\": \"neg one\"}\n{\"text\": \"fine\"}\n";
    pl_test_write_file(p, body, strlen(body));
    pl_tokenizer bytes, tok;
    pl_tokenizer_bytes(&bytes);
    tok = bytes;
    tok.ctx = &bytes;
    tok.encode_batch = oov_encode;
    tok.destroy = NULL;
    tok.vocab_size = 300;
    tok.name = "oov";
    pl_source_options o;
    memset(&o, 0, sizeof o);
    o.version = PL_SOURCE_OPTIONS_VERSION;
    o.type = PL_SOURCE_JSONL;
    o.path = p;
    o.name = "t";
    o.eos_id = -1;
    o.tokenizer = &tok;
    o.add_eos = 1;
    o.tokenizer_threads = 1;
    o.lookahead = 4;
    pl_source *src;
    CHECK_OK(pl_source_open(&o, &src));
    int64_t len, out[16];
    CHECK_OK(pl_source_document_length(src, 0, &len));
    CHECK_EQ_I64(len, 9);
    CHECK_OK(pl_source_read(src, 0, 0, len, out, PL_DTYPE_INT64));
    CHECK(out[0] == 'g' && out[7] == 'e' && out[8] == 256);
    CHECK_EQ_I64(pl_source_document_length(src, 1, &len), PL_ERECORD);
    CHECK(strstr(pl_source_errmsg(src), "gave id 300 outside its vocabulary of 300") != NULL);
    CHECK_EQ_I64(pl_source_document_length(src, 2, &len), PL_ERECORD);
    CHECK(strstr(pl_source_errmsg(src), "gave id -5 outside its vocabulary of 300") != NULL);
    CHECK_OK(pl_source_document_length(src, 3, &len));
    CHECK_EQ_I64(len, 5);
    pl_source_free(src);
    if (bytes.destroy) bytes.destroy(bytes.ctx);
}

/* Zero bytes after a .gz file's last member are padding (gzip(1) ignores
 * them): the records are read; other bytes after it stay an error. */
static void test_gz_trailing_zeros(void) {
    char p[512];
    const char *body = "{\"text\": \"abc\"}\n{\"text\": \"de\"}\n";
    snprintf(p, sizeof p, "%s/pad.jsonl.gz", dir);
    write_gz(p, body, strlen(body), 0);
    static const char zeros[700];
    FILE *f = fopen(p, "ab");
    fwrite(zeros, 1, sizeof zeros, f);
    fclose(f);
    pl_source *src;
    CHECK_OK(open_text(p, PL_SOURCE_JSONL, 0, 1, 0, &src));
    CHECK_EQ_I64(pl_source_num_documents(src), 2);
    int64_t len, out[8];
    CHECK_OK(pl_source_document_length(src, 1, &len));
    CHECK_EQ_I64(len, 3);
    CHECK_OK(pl_source_read(src, 1, 0, len, out, PL_DTYPE_INT64));
    CHECK(out[0] == 'd' && out[1] == 'e' && out[2] == 256);
    pl_source_free(src);
    /* Zeros, then a byte that is not: damaged, as before. */
    f = fopen(p, "ab");
    fputc('x', f);
    fclose(f);
    src = NULL;
    CHECK(open_text(p, PL_SOURCE_JSONL, 0, 1, 0, &src) != PL_OK);
    if (src) CHECK(strstr(pl_source_errmsg(src), "corrupt gzip data") != NULL);
    pl_source_free(src); /* a failed open keeps its message in the source */
}

/* A UTF-8 byte order mark opening a JSON Lines file (plain and .gz) is not
 * part of its first record, which is read; one inside a line is. */
static void test_bom(void) {
    const char *body = "\xef\xbb\xbf{\"text\": \"ab\"}\n{\"text\": \"c\"}\n";
    char p[512];
    for (int z = 0; z < 2; z++) {
        snprintf(p, sizeof p, "%s/bom%d.jsonl%s", dir, z, z ? ".gz" : "");
        if (z) write_gz(p, body, strlen(body), 0);
        else pl_test_write_file(p, body, strlen(body));
        pl_source *src;
        CHECK_OK(open_text(p, PL_SOURCE_JSONL, 0, 1, 0, &src));
        CHECK_EQ_I64(pl_source_num_documents(src), 2);
        int64_t len, out[8];
        CHECK_OK(pl_source_document_length(src, 0, &len));
        CHECK_EQ_I64(len, 3);
        CHECK_OK(pl_source_read(src, 0, 0, len, out, PL_DTYPE_INT64));
        CHECK(out[0] == 'a' && out[1] == 'b' && out[2] == 256);
        pl_source_free(src);
    }
    check_bad("bom_mid.jsonl", "\xef\xbb\xbf{\"text\": \"x\"}", "malformed JSON", 0);

    /* A .plrec sidecar written before the mark was skipped (its first span
       starts at byte 0, its header of version 1) is not used: the file is
       scanned again and its first record read. */
    snprintf(p, sizeof p, "%s/bom_side.jsonl", dir);
    pl_test_write_file(p, body, strlen(body));
    pl_source *src;
    CHECK_OK(open_text(p, PL_SOURCE_JSONL, 1, 1, 0, &src));
    pl_source_free(src);
    char side[600];
    snprintf(side, sizeof side, "%s.plrec", p);
    FILE *sf = fopen(side, "r+b");
    CHECK(sf != NULL);
    if (sf) {
        uint8_t h[48 + 16];
        CHECK(fread(h, 1, sizeof h, sf) == sizeof h);
        CHECK(pl__ld_u64(h + 48) == 3); /* written now: after the mark */
        pl__st_u32(h + 8, 1u);
        pl__st_u32(h + 44, pl__crc32(0, h, 44));
        pl__st_u64(h + 48, 0);
        fseek(sf, 0, SEEK_SET);
        CHECK(fwrite(h, 1, sizeof h, sf) == sizeof h);
        fclose(sf);
    }
    CHECK_OK(open_text(p, PL_SOURCE_JSONL, 1, 1, 0, &src));
    int64_t len, out[8];
    CHECK_OK(pl_source_document_length(src, 0, &len));
    CHECK_EQ_I64(len, 3);
    CHECK_OK(pl_source_read(src, 0, 0, len, out, PL_DTYPE_INT64));
    CHECK(out[0] == 'a' && out[1] == 'b' && out[2] == 256);
    pl_source_free(src);
}

#ifdef PL_WITH_SIMDJSON
/* A thread's simdjson parser grown by a record longer than PL__JSON_KEEP
 * gives its buffers back at the next shorter record; both are read right. */
static void test_json_parser_kept(void) {
    const size_t n = PL__JSON_KEEP + ((size_t)1 << 20);
    char *big = malloc(n + PL__JSON_PADDING);
    CHECK(big != NULL);
    if (!big) return;
    memcpy(big, "{\"text\":\"", 9);
    memset(big + 9, 'a', n - 11);
    memcpy(big + n - 2, "\"}", 2);
    const char *const keys[1] = {"text"};
    pl__jfield f[1];
    CHECK_EQ_I64(pl__json_fields(big, n, n, keys, 1, f), 0);
    CHECK(f[0].kind == PL__JF_STRING && f[0].len == n - 11 && f[0].s[n - 12] == 'a');
    CHECK(pl__json_kept_bytes() >= n);
    free(big);
    CHECK_EQ_I64(pl__json_fields("{\"text\":\"b\"}", 12, 12, keys, 1, f), 0);
    CHECK(f[0].kind == PL__JF_STRING && f[0].len == 1 && f[0].s[0] == 'b');
    CHECK(pl__json_kept_bytes() <= PL__JSON_KEEP);
}
#endif

/* Plans through a config: the same for 1 and 3 tokenizer threads and for
 * any lookahead, and equal reads; on_error: skip counts bad records. */
/* ... and with at most max_tokenized documents tokenized (each once per epoch
 * it is drawn in, plus the lookahead). */
static char *plans_of(const char *yaml, int64_t steps, int64_t max_tokenized) {
    pl_config *cfg;
    if (pl_config_parse_string(yaml, strlen(yaml), "t", &cfg)) {
        fprintf(stderr, "config: %s\n", pl_config_errmsg(cfg));
        pl_config_free(cfg);
        return NULL;
    }
    pl_source *src;
    int rc = pl_config_open_source(cfg, 0, &src);
    if (rc) fprintf(stderr, "open: %s\n", pl_source_errmsg(src));
    pl_planner *pl;
    rc = rc ? rc : pl_planner_create(cfg, &src, 1, &pl);
    size_t cap = 1 << 20, k = 0;
    char *out = calloc(1, cap);
    for (int64_t s = 0; s < steps && rc == PL_OK; s++) {
        pl_plan *plan;
        rc = pl_planner_next(pl, &plan);
        if (rc) {
            fprintf(stderr, "plan: %s\n", pl_planner_errmsg(pl));
            break;
        }
        for (int64_t c = 0; c < plan->n_chunks; c++) {
            const pl_chunk *ch = &plan->chunks[c];
            int64_t tok[64];
            if (pl_source_read(src, ch->index, ch->offset, ch->length, tok, PL_DTYPE_INT64))
                rc = PL_EIO;
            uint64_t h = pl__hash64(tok, (size_t)ch->length * 8, 0);
            k += (size_t)snprintf(out + k, cap - k, "%lld:%lld+%lld=%llx ",
                                  (long long)ch->index, (long long)ch->offset,
                                  (long long)ch->length, (unsigned long long)h);
        }
        pl_plan_free(plan);
    }
    if (rc == PL_OK && pl_source_num_tokenized(src) > max_tokenized) {
        fprintf(stderr, "tokenized %lld documents, expected at most %lld\n",
                (long long)pl_source_num_tokenized(src), (long long)max_tokenized);
        rc = PL_EINVAL;
    }
    if (rc) {
        free(out);
        out = NULL;
    }
    pl_planner_free(pl);
    pl_source_free(src);
    pl_config_free(cfg);
    return out;
}

static void test_plans(void) {
    char p[512], yaml[2048];
    snprintf(p, sizeof p, "%s/plain.jsonl", dir);
    const char *fmt = "seed: 5\nseq_length: 64\nglobal_batch_size: 4\nmicro_batch_size: 1\n"
                      "topology: {dp: 2}\non_error: %s\n"
                      "sources:\n  - {name: web, type: jsonl, path: '%s', lookahead: %d,\n"
                      "     tokenizer: {type: bytes, threads: %d}}\n";
    snprintf(yaml, sizeof yaml, fmt, "fail", p, 4, 1);
    char *a = plans_of(yaml, 40, NDOC + 64);
    snprintf(yaml, sizeof yaml, fmt, "fail", p, 100, 3);
    char *b = plans_of(yaml, 40, NDOC + 100);
    CHECK(a && b && strcmp(a, b) == 0);
    free(a);
    free(b);

    /* A top-level tokenizer serves sources without their own. */
    snprintf(yaml, sizeof yaml,
             "seq_length: 64\nglobal_batch_size: 4\nmicro_batch_size: 1\n"
             "tokenizer: {type: hf, path: tok.json}\n"
             "sources:\n  - {name: web, type: jsonl, path: '%s'}\n", p);
    pl_config *cfg;
    CHECK_OK(pl_config_parse_string(yaml, strlen(yaml), "t", &cfg));
    pl_source *src;
    /* hf is not built into the C library: a clear error without a host. */
    CHECK_EQ_I64(pl_config_open_source(cfg, 0, &src), PL_ECONFIG);
    CHECK(strstr(pl_source_errmsg(src), "tokenizer type hf") != NULL);
    pl_source_free(src);
    pl_config_free(cfg);

    /* Config errors. */
    const char *bad[][2] = {
        {"sources:\n  - {name: a, type: jsonl, path: x}\n", "needs a tokenizer"},
        {"sources:\n  - {name: a, type: megatron, path: x, text_key: t}\n",
         "apply only to jsonl, text and parquet"},
        {"sources:\n  - {name: a, type: jsonl, path: x, tokenizer: {type: hf}}\n",
         "missing key 'path'"},
        {"sources:\n  - {name: a, type: jsonl, path: x, tokenizer: {type: gpt}}\n",
         "unknown value 'gpt'"},
        {"sources:\n  - {name: a, type: text, path: x, text_key: b, tokenizer: {type: bytes}}\n",
         "text_key applies only to jsonl"},
        {"sources:\n  - {name: a, type: parquet, path: x, prompt_key: p, response_key: r, "
         "tokenizer: {type: bytes}}\n",
         "prompt_key/response_key applies only to jsonl"},
        {"sources:\n  - {name: a, type: jsonl, path: x, tokenizer: {type: hf, path: t, "
         "pat_str: x}}\n",
         "pat_str applies only to type tiktoken"},
        {"sources:\n  - {name: a, type: jsonl, path: x, tokenizer: {type: tiktoken, path: t}}\n",
         "needs one of: 'encoding'"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        CHECK_EQ_I64(pl_config_parse_string(bad[i][0], strlen(bad[i][0]), "t", &cfg),
                     PL_ECONFIG);
        if (!strstr(pl_config_errmsg(cfg), bad[i][1]))
            fprintf(stderr, "config %zu: %s\n", i, pl_config_errmsg(cfg));
        CHECK(strstr(pl_config_errmsg(cfg), bad[i][1]) != NULL);
        pl_config_free(cfg);
    }

    /* on_error: skip: a file with bad records plans around them. */
    char q[512];
    snprintf(q, sizeof q, "%s/mixed.jsonl", dir);
    FILE *f = fopen(q, "w");
    for (int i = 0; i < 200; i++) {
        if (i % 10 == 5) fprintf(f, "{\"text\": %d}\n", i);
        else fprintf(f, "{\"text\": \"document number %d\"}\n", i);
    }
    fclose(f);
    snprintf(yaml, sizeof yaml, fmt, "fail", q, 8, 1);
    CHECK(plans_of(yaml, 30, 1000) == NULL); /* fail: the first bad one stops it */
    snprintf(yaml, sizeof yaml, fmt, "skip", q, 8, 2);
    a = plans_of(yaml, 30, 2 * 200 + 8); /* two epochs, plus the lookahead */
    snprintf(yaml, sizeof yaml, fmt, "skip", q, 50, 1);
    b = plans_of(yaml, 30, 2 * 200 + 50);
    CHECK(a && b && strcmp(a, b) == 0);
    free(a);
    free(b);
}

/* A lengths provider backed by a real source (as a Ray source loader). */
static int remote_lengths(void *ctx, int64_t source, int64_t n, const int64_t *index,
                          int64_t *lengths, char **messages, char *err, size_t errcap) {
    (void)source;
    (void)err;
    (void)errcap;
    pl_source *real = ctx;
    int rc = pl_source_lengths(real, index, n, lengths);
    for (int64_t i = 0; i < n && rc == PL_OK; i++)
        if (lengths[i] < 0) {
            int64_t len;
            pl_source_document_length(real, index[i], &len);
            /* This runs on the remote source's tokenizer threads, several at
               once: the calling thread's message, not the handle's (which
               another thread may be writing). */
            messages[i] = strdup(pl_last_errmsg());
        }
    return rc;
}

/* Chunk lists of `steps` plans of a one-source config (no reads). */
static char *chunks_of(pl_config *cfg, pl_source *src, int64_t steps) {
    pl_planner *pl;
    if (pl_planner_create(cfg, &src, 1, &pl)) return NULL;
    size_t cap = 1 << 20, k = 0;
    char *out = calloc(1, cap);
    for (int64_t s = 0; s < steps; s++) {
        pl_plan *plan;
        if (pl_planner_next(pl, &plan)) {
            fprintf(stderr, "plan: %s\n", pl_planner_errmsg(pl));
            free(out);
            out = NULL;
            break;
        }
        for (int64_t c = 0; c < plan->n_chunks; c++)
            k += (size_t)snprintf(out + k, cap - k, "%lld:%lld+%lld ",
                                  (long long)plan->chunks[c].index,
                                  (long long)plan->chunks[c].offset,
                                  (long long)plan->chunks[c].length);
        pl_plan_free(plan);
    }
    pl_planner_free(pl);
    return out;
}

static void test_lengths_only(void) {
    char q[512], yaml[1024];
    snprintf(q, sizeof q, "%s/mixed.jsonl", dir); /* written by test_plans */
    snprintf(yaml, sizeof yaml,
             "seed: 3\nseq_length: 64\nglobal_batch_size: 4\nmicro_batch_size: 1\n"
             "on_error: skip\nsidecar_index: memory\nsources:\n  - {name: web, type: jsonl, "
             "path: '%s', lookahead: 16, tokenizer: {type: bytes, threads: 2}}\n", q);
    pl_config *cfg;
    CHECK_OK(pl_config_parse_string(yaml, strlen(yaml), "t", &cfg));
    pl_source *real, *local, *remote;
    CHECK_OK(pl_config_open_source(cfg, 0, &real));
    CHECK_OK(pl_config_open_source(cfg, 0, &local));
    /* pl_source_lengths: the lengths of document_length, bad ones as codes. */
    int64_t idx[200], lens[200];
    for (int i = 0; i < 200; i++) idx[i] = 199 - i;
    CHECK_OK(pl_source_lengths(real, idx, 200, lens));
    int same = 1;
    for (int i = 0; i < 200; i++) {
        int64_t len = -1;
        int rc = pl_source_document_length(real, idx[i], &len);
        if ((rc ? rc : len) != lens[i]) same = 0;
        if ((idx[i] % 10 == 5) != (lens[i] == PL_ERECORD)) same = 0;
    }
    CHECK(same);
    int64_t bad = 200;
    CHECK_EQ_I64(pl_source_lengths(real, &bad, 1, lens), PL_ERANGE);
    pl_config_set_lengths_provider(cfg, remote_lengths, real);
    CHECK_OK(pl_config_open_source(cfg, 0, &remote));
    int64_t out[4];
    CHECK_EQ_I64(pl_source_read(remote, 0, 0, 1, out, PL_DTYPE_INT64), PL_EINVAL);
    char *a = chunks_of(cfg, local, 40), *b = chunks_of(cfg, remote, 40);
    CHECK(a && b && strcmp(a, b) == 0);
    /* The remote source tokenized nothing itself; the real one did it all. */
    CHECK_EQ_I64(pl_source_num_tokenized(remote), 0);
    CHECK(pl_source_num_tokenized(real) >= 200);
    free(a);
    free(b);
    pl_source_free(remote);
    pl_source_free(local);
    pl_source_free(real);
    pl_config_free(cfg);
}

/* A tokenizer that counts how often each document of the corpus is
 * tokenized (the text starts "doc N:"), then encodes as the byte tokenizer. */
static atomic_int tok_count[NDOC];

static int counting_encode(void *ctx, int64_t n, const char *const *texts,
                           const size_t *lens, int32_t **ids, int64_t *counts,
                           char *err, size_t errcap) {
    pl_tokenizer *bytes = ctx;
    for (int64_t i = 0; i < n; i++) {
        int d = -1;
        if (lens[i] > 4 && memcmp(texts[i], "doc ", 4) == 0) d = atoi(texts[i] + 4);
        if (d >= 0 && d < NDOC) atomic_fetch_add(&tok_count[d], 1);
    }
    return bytes->encode_batch(bytes->ctx, n, texts, lens, ids, counts, err, errcap);
}

static int counting_factory(void *ctx, const char *type, const char *path,
                            pl_tokenizer *out, char *err, size_t errcap) {
    (void)type;
    (void)path;
    (void)err;
    (void)errcap;
    pl_tokenizer_bytes(out);
    out->ctx = ctx;
    out->encode_batch = counting_encode;
    out->name = "counting";
    return PL_OK;
}

/* Runs `steps` plans of `cfg` (all when 0) through the planner, reading
 * every chunk; the counts of tokenizations per document are in tok_count.
 * Returns the planner's last status (PL_OK, or PL_DONE at a pass's end). */
static int run_pass(pl_config *cfg, int64_t steps) {
    static pl_tokenizer bytes;
    pl_tokenizer_bytes(&bytes);
    pl_config_set_tokenizer_factory(cfg, counting_factory, &bytes);
    for (int i = 0; i < NDOC; i++) atomic_store(&tok_count[i], 0);
    pl_source *src;
    pl_planner *pl = NULL;
    int rc = pl_config_open_source(cfg, 0, &src);
    if (rc == PL_OK) rc = pl_planner_create(cfg, &src, 1, &pl);
    for (int64_t s = 0; (!steps || s < steps) && rc == PL_OK; s++) {
        pl_plan *plan;
        rc = pl_planner_next(pl, &plan);
        if (rc) break;
        for (int64_t c = 0; c < plan->n_chunks; c++) {
            const pl_chunk *ch = &plan->chunks[c];
            int64_t tok[256];
            if (pl_source_read(src, ch->index, ch->offset, ch->length, tok,
                               PL_DTYPE_INT64))
                rc = PL_EIO;
        }
        pl_plan_free(plan);
    }
    if (rc != PL_OK && rc != PL_DONE)
        fprintf(stderr, "pass: rc %d: %s\n", rc, pl_planner_errmsg(pl));
    pl_planner_free(pl);
    pl_source_free(src); /* joins the tokenizer threads */
    return rc;
}

/* A split source (train [0, 150), valid [150, 300) of the 300 documents):
 * the lookahead tokenizes the documents of the split in the order the
 * planner draws them (index order in an evaluation pass), so every document
 * is tokenized once, and none outside the split. */
static void test_split_lookahead(void) {
    char p[512], yaml[1024];
    snprintf(p, sizeof p, "%s/plain.jsonl", dir);
    snprintf(yaml, sizeof yaml,
             "seed: 9\nseq_length: 256\nglobal_batch_size: 4\nmicro_batch_size: 1\n"
             "split: 50,50,0\nsources:\n  - {name: web, type: jsonl, path: '%s', "
             "lookahead: 32, tokenizer: {type: hf, path: counting, threads: 2}}\n", p);
    pl_config *cfg, *valid;
    CHECK_OK(pl_config_parse_string(yaml, strlen(yaml), "t", &cfg));
    CHECK_OK(pl_config_split(cfg, PL_SPLIT_VALID, &valid));
    CHECK_EQ_I64(run_pass(valid, 0), PL_DONE);
    int bad = 0;
    for (int i = 0; i < NDOC; i++)
        if (atomic_load(&tok_count[i]) != (i >= NDOC / 2)) {
            if (!bad) fprintf(stderr, "valid: document %d tokenized %d times\n", i,
                              atomic_load(&tok_count[i]));
            bad = 1;
        }
    CHECK(!bad);
    /* Training: 8 steps draw fewer than the train split's 150 documents;
       those and the lookahead's are tokenized once, all in the split. */
    CHECK_OK(run_pass(cfg, 8));
    int seen = 0;
    bad = 0;
    for (int i = 0; i < NDOC; i++) {
        int c = atomic_load(&tok_count[i]);
        seen += c;
        if (c > 1 || (c && i >= NDOC / 2)) bad = 1;
    }
    CHECK(!bad);
    CHECK(seen > 32 && seen < NDOC / 2);
    pl_config_free(valid);
    pl_config_free(cfg);
}

/* Threads asking for lengths (singly and in batches) and reading tokens at
 * once, while the lookahead runs: every answer is the document's bytes, and
 * each document is tokenized exactly once (nothing is dropped: the cache is
 * large and documents are read by one thread each, after every length). */
typedef struct conc_arg {
    pl_source *src;
    int id;
    int bad;
    pthread_barrier_t *bar;
} conc_arg;

static void *conc_thread(void *arg) {
    conc_arg *a = arg;
    char t[512];
    int64_t idx[NDOC], lens[NDOC], tok[600];
    /* Lengths: thread k walks the documents from its own start, alternately
       one at a time and in batches of 37 (pl_source_lengths). */
    for (int i = 0; i < NDOC; i++) idx[i] = (i * 7 + a->id * 61) % NDOC;
    for (int i = 0; i < NDOC;) {
        int k = (i / 37) % 2 ? 37 : 1;
        if (k > NDOC - i) k = NDOC - i;
        if (k == 1) {
            if (pl_source_document_length(a->src, idx[i], &lens[i])) a->bad = 1;
        } else if (pl_source_lengths(a->src, idx + i, k, lens + i)) {
            a->bad = 1;
        }
        i += k;
    }
    for (int i = 0; i < NDOC; i++) {
        doc_text((int)idx[i], t, sizeof t);
        if (lens[i] != (int64_t)strlen(t) + 1) a->bad = 1;
    }
    pthread_barrier_wait(a->bar);
    /* Reads: thread k reads the documents i with i % 4 == k, in two pieces. */
    for (int i = a->id; i < NDOC; i += 4) {
        doc_text(i, t, sizeof t);
        int64_t n = (int64_t)strlen(t) + 1, h = n / 2;
        if (pl_source_read(a->src, i, 0, h, tok, PL_DTYPE_INT64) ||
            pl_source_read(a->src, i, h, n - h, tok + h, PL_DTYPE_INT64))
            a->bad = 1;
        for (int64_t j = 0; j + 1 < n; j++)
            if (tok[j] != (uint8_t)t[j]) a->bad = 1;
        if (tok[n - 1] != 256) a->bad = 1;
    }
    return NULL;
}

static void test_concurrent(void) {
    char p[512];
    snprintf(p, sizeof p, "%s/plain.jsonl", dir);
    for (int round = 0; round < 3; round++) {
        pl_source *src;
        CHECK_OK(open_text(p, PL_SOURCE_JSONL, 0, 3, 0, &src));
        pl__perm perm;
        pl__perm_init(&perm, NDOC, 11, "t", 0);
        /* The lookahead over the first half of the order (a planner's
           window), racing the threads below. */
        for (int64_t pos = 0; pos < NDOC / 2; pos += 8)
            pl__source_lookahead(src, &perm, 0, NDOC, 0, pos);
        pthread_barrier_t bar;
        pthread_barrier_init(&bar, NULL, 4);
        conc_arg a[4];
        pthread_t th[4];
        for (int k = 0; k < 4; k++) {
            a[k] = (conc_arg){src, k, 0, &bar};
            pthread_create(&th[k], NULL, conc_thread, &a[k]);
        }
        int bad = 0;
        for (int k = 0; k < 4; k++) {
            pthread_join(th[k], NULL);
            bad |= a[k].bad;
        }
        pthread_barrier_destroy(&bar);
        CHECK(!bad);
        CHECK_EQ_I64(pl_source_num_tokenized(src), NDOC);
        pl_source_free(src);
    }
}

/* Instruction data: prompt '?' + lowercase + ':', response uppercase + '!'
 * (byte tokens, eos 256), so every token tells which part it is from. */
static int sft_is_response(int64_t id) {
    return id == 256 || id == '!' || (id >= 'A' && id <= 'Z');
}

static void test_instruction(void) {
    char p[512], yaml[1024];
    snprintf(p, sizeof p, "%s/sft.jsonl", dir);
    FILE *f = fopen(p, "w");
    for (int i = 0; i < 40; i++) {
        char q[200], a[64];
        int nq = i == 7 ? 150 : 1 + (i * 5) % 17, na = 1 + (i * 3) % 11;
        int k = 0;
        if (i != 11) q[k++] = '?';
        for (int j = 0; j < nq - 1 && i != 11; j++) q[k++] = (char)('a' + (i + j) % 26);
        if (i != 11) q[k++] = ':';
        q[k] = '\0'; /* record 11: an empty prompt */
        for (k = 0; k < na; k++) a[k] = (char)('A' + (i + k) % 26);
        a[k++] = '!';
        a[k] = '\0';
        fprintf(f, "{\"prompt\": \"%s\", \"response\": \"%s\", \"id\": %d}\n", q, a, i);
    }
    fclose(f);
    /* The source alone: lengths are prompt + response + eos; pl_source_read
       gives plain ids, pl_source_read_many the marked form. */
    {
        pl_tokenizer tok;
        pl_tokenizer_bytes(&tok);
        pl_source_options o;
        memset(&o, 0, sizeof o);
        o.version = PL_SOURCE_OPTIONS_VERSION;
        o.type = PL_SOURCE_JSONL;
        o.path = p;
        o.eos_id = -1;
        o.tokenizer = &tok;
        o.add_eos = 1;
        o.prompt_key = "prompt";
        o.response_key = "response";
        pl_source *src;
        CHECK_OK(pl_source_open(&o, &src));
        int64_t len = 0, plain[64], marked[64];
        CHECK_OK(pl_source_document_length(src, 1, &len));
        /* record 1: prompt 7 bytes ("?bcdef:"), response 5 ("BCDE!"), eos */
        CHECK_EQ_I64(len, 7 + 5 + 1);
        CHECK_OK(pl_source_read(src, 1, 0, len, plain, PL_DTYPE_INT64));
        pl_read rd = {0, 0, 1, 0, len};
        CHECK_OK(pl_source_read_many(src, &rd, 1, marked));
        int ok = plain[0] == '?' && plain[6] == ':' && plain[7] == 'B' &&
                 plain[len - 1] == 256;
        for (int64_t k = 0; k < len; k++)
            if (marked[k] != (k < 7 ? -1 - plain[k] : plain[k])) ok = 0;
        CHECK(ok);
        pl_source_free(src);
    }
    snprintf(yaml, sizeof yaml,
             "seed: 4\nseq_length: 64\nglobal_batch_size: 2\nmicro_batch_size: 1\n"
             "topology: {dp: 2}\nsources:\n  - {name: sft, type: jsonl, path: '%s', "
             "prompt_key: prompt, response_key: response,\n"
             "     tokenizer: {type: bytes, add_eos: true, threads: 2}}\n", p);
    pl_config *cfg;
    CHECK_OK(pl_config_parse_string(yaml, strlen(yaml), "t", &cfg));
    pl_loader_options lo = {PL_LOADER_OPTIONS_VERSION, NULL, 0, 2, 2};
    pl_loader *l = NULL;
    int rc = pl_loader_create(cfg, &lo, &l);
    if (rc) fprintf(stderr, "loader: %s\n", pl_loader_errmsg(l));
    CHECK_OK(rc);
    int bad = 0;
    int64_t trained = 0, prompts = 0;
    for (int step = 0; step < 30 && !rc && !bad; step++)
        for (int64_t r = 0; r < 2 && !bad; r++) {
            const pl_batch *b = NULL;
            rc = pl_loader_next(l, r, &b);
            if (rc) {
                fprintf(stderr, "next: %s\n", pl_loader_errmsg(l));
                break;
            }
            const int64_t *ids = b->input_ids, *lab = b->labels;
            for (int64_t k = 0; k + 1 < b->n_cu_seqlens; k++) {
                if (b->segment_sources[k] < 0) continue; /* padding */
                int64_t s0 = b->cu_seqlens[k], s1 = b->cu_seqlens[k + 1];
                for (int64_t t = s0; t < s1; t++) {
                    int64_t id = ids[t];
                    float m = b->loss_mask[t];
                    if (id < 0 || id > 256) bad = 1;
                    if (!sft_is_response(id)) prompts++;
                    if (t + 1 < s1) {
                        int want = sft_is_response(ids[t + 1]);
                        if (m != (float)want || lab[t] != (want ? ids[t + 1] : -100))
                            bad = 1;
                    } else if (id == 256) {
                        if (m != 0.0f || lab[t] != -100) bad = 1;
                    } else if ((m != 0.0f) != (lab[t] != -100) ||
                               (lab[t] != -100 && !sft_is_response(lab[t]))) {
                        bad = 1; /* a split document: the label is the next chunk's */
                    }
                    trained += m != 0.0f;
                    if (bad) {
                        fprintf(stderr, "step %d rank %lld pos %lld: id %lld mask %g "
                                        "label %lld\n",
                                step, (long long)r, (long long)t, (long long)id, m,
                                (long long)lab[t]);
                        break;
                    }
                }
            }
        }
    CHECK_OK(rc);
    CHECK(!bad);
    CHECK(trained > 100 && prompts > 100);
    pl_loader_free(l);
    pl_config_free(cfg);

    /* Config errors and bad records. */
    const char *badcfg[][2] = {
        {"sources:\n  - {name: a, type: jsonl, path: x, prompt_key: p, tokenizer: {type: bytes}}\n",
         "needs both prompt_key and response_key"},
        {"sources:\n  - {name: a, type: jsonl, path: x, prompt_key: p, response_key: r, "
         "text_key: t, tokenizer: {type: bytes}}\n",
         "text_key is not used with prompt_key"},
        {"sources:\n  - {name: a, type: text, path: x, prompt_key: p, response_key: r, "
         "tokenizer: {type: bytes}}\n",
         "prompt_key/response_key applies only to jsonl"},
    };
    for (size_t i = 0; i < sizeof badcfg / sizeof badcfg[0]; i++) {
        CHECK_EQ_I64(pl_config_parse_string(badcfg[i][0], strlen(badcfg[i][0]), "t", &cfg),
                     PL_ECONFIG);
        if (!strstr(pl_config_errmsg(cfg), badcfg[i][1]))
            fprintf(stderr, "config %zu: %s\n", i, pl_config_errmsg(cfg));
        CHECK(strstr(pl_config_errmsg(cfg), badcfg[i][1]) != NULL);
        pl_config_free(cfg);
    }
    const char *recs[][2] = {
        {"{\"prompt\": \"q\"}", "key 'response' is missing"},
        {"{\"prompt\": 3, \"response\": \"a\"}", "key 'prompt' is not a string"},
        {"{\"prompt\": \"q\", \"response\": \"\"}", "empty response (key 'response'"},
    };
    for (size_t i = 0; i < sizeof recs / sizeof recs[0]; i++) {
        snprintf(p, sizeof p, "%s/sftbad%zu.jsonl", dir, i);
        f = fopen(p, "w");
        fprintf(f, "{\"prompt\": \"a\", \"response\": \"b\"}\n%s\n", recs[i][0]);
        fclose(f);
        pl_tokenizer tok;
        pl_tokenizer_bytes(&tok);
        pl_source_options o;
        memset(&o, 0, sizeof o);
        o.version = PL_SOURCE_OPTIONS_VERSION;
        o.type = PL_SOURCE_JSONL;
        o.path = p;
        o.eos_id = -1;
        o.tokenizer = &tok;
        o.prompt_key = "prompt";
        o.response_key = "response";
        pl_source *src;
        CHECK_OK(pl_source_open(&o, &src));
        int64_t len;
        CHECK_EQ_I64(pl_source_document_length(src, 1, &len), PL_ERECORD);
        const char *m = pl_source_errmsg(src);
        int ok = strstr(m, "line 2 (byte offset 33)") && strstr(m, recs[i][1]);
        if (!ok) fprintf(stderr, "sft record %zu: %s\n", i, m);
        CHECK(ok);
        CHECK_OK(pl_source_document_length(src, 0, &len));
        CHECK_EQ_I64(len, 2);
        pl_source_free(src);
    }
}

/* The length cache: <file>.pllen written after the lengths are known, then
 * used without tokenizing; ignored when stale, damaged or of another key;
 * not written under sidecar_index read or memory; plans unchanged. */
static pl_source *open_cfg(const char *yaml) {
    pl_config *cfg;
    pl_source *src = NULL;
    if (pl_config_parse_string(yaml, strlen(yaml), "t", &cfg)) {
        fprintf(stderr, "config: %s\n", pl_config_errmsg(cfg));
    } else if (pl_config_open_source(cfg, 0, &src)) {
        fprintf(stderr, "open: %s\n", pl_source_errmsg(src));
        pl_source_free(src);
        src = NULL;
    }
    pl_config_free(cfg);
    return src;
}

static void test_length_cache(void) {
    static char corpus[NDOC * 1200];
    size_t n = jsonl_corpus(corpus, sizeof corpus);
    char p[512], side[600], yaml[1024];
    snprintf(p, sizeof p, "%s/lc.jsonl", dir);
    snprintf(side, sizeof side, "%s.pllen", p);
    pl_test_write_file(p, corpus, n);
    const char *fmt = "seed: 5\nseq_length: 64\nglobal_batch_size: 4\nmicro_batch_size: 1\n"
                      "%s\nsources:\n  - {name: web, type: jsonl, path: '%s', lookahead: 8,\n"
                      "     tokenizer: {type: bytes, add_eos: %s}}\n";
    snprintf(yaml, sizeof yaml, fmt, "", p, "true");
    int64_t idx[NDOC], lens[NDOC], again[NDOC];
    for (int i = 0; i < NDOC; i++) idx[i] = i;
    pl_source *src = open_cfg(yaml);
    CHECK(src != NULL);
    if (!src) return;
    CHECK_OK(pl_source_lengths(src, idx, NDOC, lens));
    /* Every length known: written by the tokenizer thread or at free. */
    pl_source_free(src);
    struct stat st;
    CHECK(stat(side, &st) == 0 && st.st_size == 56 + NDOC * 8);
    src = open_cfg(yaml);
    int same = 1;
    for (int i = 0; i < NDOC; i++) {
        int64_t len = -1;
        if (pl_source_document_length(src, i, &len) || len != lens[i]) same = 0;
    }
    CHECK(same);
    CHECK_EQ_I64(pl_source_num_tokenized(src), 0); /* from the sidecar */
    CHECK_OK(pl_source_lengths(src, idx, NDOC, again));
    CHECK(memcmp(lens, again, sizeof lens) == 0);
    CHECK_EQ_I64(pl_source_num_tokenized(src), 0);
    check_docs(src, "length cache"); /* the reads tokenize */
    pl_source_free(src);
    /* Another key (add_eos false): ignored, and lengths one shorter. */
    snprintf(yaml, sizeof yaml, fmt, "sidecar_index: read", p, "false");
    src = open_cfg(yaml);
    CHECK_OK(pl_source_lengths(src, idx, NDOC, again));
    same = 1;
    for (int i = 0; i < NDOC; i++) same &= again[i] == lens[i] - 1;
    CHECK(same);
    CHECK_EQ_I64(pl_source_num_tokenized(src), NDOC);
    pl_source_free(src);
    CHECK(stat(side, &st) == 0 && st.st_size == 56 + NDOC * 8); /* read: kept */
    /* A damaged header: ignored (and rewritten). */
    {
        FILE *f = fopen(side, "r+b");
        fseek(f, 20, SEEK_SET);
        fputc('x', f);
        fclose(f);
    }
    snprintf(yaml, sizeof yaml, fmt, "", p, "true");
    src = open_cfg(yaml);
    CHECK_OK(pl_source_lengths(src, idx, NDOC, again));
    CHECK(memcmp(lens, again, sizeof lens) == 0);
    CHECK_EQ_I64(pl_source_num_tokenized(src), NDOC);
    pl_source_free(src);
    src = open_cfg(yaml);
    CHECK_OK(pl_source_lengths(src, idx, NDOC, again));
    CHECK_EQ_I64(pl_source_num_tokenized(src), 0); /* rewritten whole */
    pl_source_free(src);
    /* A damaged body (the header's CRC of the lengths): ignored. */
    {
        FILE *f = fopen(side, "r+b");
        fseek(f, 56 + 8 * 5, SEEK_SET);
        fputc(0x7f, f);
        fclose(f);
    }
    src = open_cfg(yaml);
    CHECK_OK(pl_source_lengths(src, idx, NDOC, again));
    CHECK(memcmp(lens, again, sizeof lens) == 0);
    CHECK_EQ_I64(pl_source_num_tokenized(src), NDOC);
    pl_source_free(src);
    /* A sidecar that passes its checks but lies (a length one too short, CRCs
       recomputed): the planner sees its length, the read refuses the
       document naming the sidecar instead of leaving a token out. */
    {
        FILE *f = fopen(side, "r+b");
        uint8_t h[56];
        int64_t v[NDOC];
        CHECK(fread(h, 1, 56, f) == 56 && fread(v, 8, NDOC, f) == NDOC);
        v[3] -= 1;
        pl__st_u32(h + 12, pl__crc32(0, v, sizeof v));
        pl__st_u32(h + 48, pl__crc32(0, h, 48));
        fseek(f, 0, SEEK_SET);
        fwrite(h, 1, 56, f);
        fwrite(v, 8, NDOC, f);
        fclose(f);
        src = open_cfg(yaml);
        int64_t len = 0, tok[600];
        CHECK_OK(pl_source_document_length(src, 3, &len));
        CHECK_EQ_I64(len, lens[3] - 1);
        CHECK_EQ_I64(pl_source_read(src, 3, 0, len, tok, PL_DTYPE_INT64), PL_EDOCIDX);
        CHECK(strstr(pl_source_errmsg(src), "lc.jsonl.pllen: record 3: the length cache "
                                            "says") != NULL);
        pl_source_free(src);
        unlink(side);
    }
    /* The data file changed (a record appended): the sidecar is stale. */
    {
        FILE *f = fopen(p, "ab");
        fputs("{\"text\": \"one more\"}\n", f);
        fclose(f);
        struct timespec ts[2] = {{0, UTIME_OMIT}, {12345, 0}}; /* another mtime */
        utimensat(AT_FDCWD, p, ts, 0);
    }
    src = open_cfg(yaml);
    CHECK_EQ_I64(pl_source_num_documents(src), NDOC + 1);
    CHECK_OK(pl_source_lengths(src, idx, NDOC, again));
    CHECK(memcmp(lens, again, sizeof lens) == 0);
    CHECK_EQ_I64(pl_source_num_tokenized(src), NDOC);
    int64_t last = 0;
    CHECK_OK(pl_source_document_length(src, NDOC, &last));
    CHECK_EQ_I64(last, 9); /* "one more" + eos */
    pl_source_free(src);
    /* sidecar_index: memory writes nothing. */
    snprintf(p, sizeof p, "%s/lc2.jsonl", dir);
    pl_test_write_file(p, corpus, n);
    snprintf(yaml, sizeof yaml, fmt, "sidecar_index: memory", p, "true");
    src = open_cfg(yaml);
    CHECK_OK(pl_source_lengths(src, idx, NDOC, lens));
    pl_source_free(src);
    snprintf(side, sizeof side, "%s.pllen", p);
    CHECK(stat(side, &st) != 0);
    /* Plans with the cache equal plans without it (the first run writes it). */
    snprintf(p, sizeof p, "%s/lc3.jsonl", dir);
    pl_test_write_file(p, corpus, n);
    snprintf(yaml, sizeof yaml, fmt, "", p, "true");
    char *a = plans_of(yaml, 30, NDOC + 64);
    snprintf(side, sizeof side, "%s.pllen", p);
    CHECK(stat(side, &st) == 0);
    char *b = plans_of(yaml, 30, NDOC + 64);
    CHECK(a && b && strcmp(a, b) == 0);
    free(a);
    free(b);
}

/* Chat data: messages rendered with ChatML; trained on are the assistant's
 * content and its "<|im_end|>\n", and the eos after an assistant turn. */
static void test_chat(void) {
    char p[512], yaml[1024];
    snprintf(p, sizeof p, "%s/chat.jsonl", dir);
    FILE *f = fopen(p, "w");
    fprintf(f, "{\"messages\": [{\"role\": \"system\", \"content\": \"Be brief.\"}, "
               "{\"role\": \"user\", \"content\": \"Hi?\"}, "
               "{\"role\": \"assistant\", \"content\": \"Hello!\"}, "
               "{\"role\": \"user\", \"content\": \"Bye?\"}, "
               "{\"role\": \"assistant\", \"content\": \"Bye.\"}]}\n");
    fprintf(f, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}, "
               "{\"role\": \"assistant\", \"content\": \"y\"}, "
               "{\"role\": \"user\", \"content\": \"z\"}]}\n");
    fprintf(f, "{\"messages\": [{\"role\": \"tool\", \"content\": \"x\"}]}\n");
    fprintf(f, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}]}\n");
    fprintf(f, "{\"messages\": [{\"role\": \"assistant\"}]}\n");
    fprintf(f, "{\"messages\": []}\n");
    fclose(f);
    snprintf(yaml, sizeof yaml,
             "seq_length: 256\nglobal_batch_size: 1\nmicro_batch_size: 1\n"
             "on_error: skip\nsources:\n  - {name: chat, type: jsonl, path: '%s', "
             "messages_key: messages, chat_template: chatml,\n"
             "     tokenizer: {type: bytes, add_eos: true}}\n", p);
    pl_source *src = open_cfg(yaml);
    CHECK(src != NULL);
    if (!src) return;
    /* Record 0, rendered, with the trained parts in upper case of a mask. */
    const char *parts[][2] = {
        {"<|im_start|>system\nBe brief.<|im_end|>\n", NULL},
        {"<|im_start|>user\nHi?<|im_end|>\n", NULL},
        {"<|im_start|>assistant\n", "Hello!<|im_end|>\n"},
        {"<|im_start|>user\nBye?<|im_end|>\n", NULL},
        {"<|im_start|>assistant\n", "Bye.<|im_end|>\n"},
    };
    char text[512];
    char train[512];
    size_t k = 0;
    for (size_t i = 0; i < 5; i++)
        for (int h = 0; h < 2; h++)
            for (const char *c = parts[i][h]; c && *c; c++) {
                train[k] = (char)h;
                text[k++] = *c;
            }
    int64_t len = 0, plain[600], marked[600];
    CHECK_OK(pl_source_document_length(src, 0, &len));
    CHECK_EQ_I64(len, (int64_t)k + 1);
    CHECK_OK(pl_source_read(src, 0, 0, len, plain, PL_DTYPE_INT64));
    pl_read rd = {0, 0, 0, 0, len};
    CHECK_OK(pl_source_read_many(src, &rd, 1, marked));
    int ok = plain[len - 1] == 256 && marked[len - 1] == 256;
    for (size_t i = 0; i < k && ok; i++)
        ok = plain[i] == (uint8_t)text[i] &&
             marked[i] == (train[i] ? plain[i] : -1 - plain[i]);
    CHECK(ok);
    /* Record 1 ends with a user turn: its eos is not trained on. */
    CHECK_OK(pl_source_document_length(src, 1, &len));
    rd.index = 1;
    rd.count = len;
    CHECK_OK(pl_source_read_many(src, &rd, 1, marked));
    CHECK_EQ_I64(marked[len - 1], -1 - 256);
    const char *want[] = {"message 0: role 'tool' is not system, user or assistant",
                          "no assistant message with content",
                          "message 0: 'content' is missing",
                          "key 'messages' is not a non-empty list"};
    for (int i = 0; i < 4; i++) {
        CHECK_EQ_I64(pl_source_document_length(src, 2 + i, &len), PL_ERECORD);
        ok = strstr(pl_source_errmsg(src), want[i]) && strstr(pl_source_errmsg(src), "chat.jsonl: line");
        if (!ok) fprintf(stderr, "chat record %d: %s\n", 2 + i, pl_source_errmsg(src));
        CHECK(ok);
    }
    pl_source_free(src);
    /* Through a loader: ids are plain, masks follow the marked form. */
    pl_config *cfg;
    CHECK_OK(pl_config_parse_string(yaml, strlen(yaml), "t", &cfg));
    pl_loader_options lo = {PL_LOADER_OPTIONS_VERSION, NULL, 0, 1, 2};
    pl_loader *l = NULL;
    CHECK_OK(pl_loader_create(cfg, &lo, &l));
    int bad = 0, rows = 0;
    for (int step = 0; step < 4 && l; step++) {
        const pl_batch *b = NULL;
        if (pl_loader_next(l, 0, &b)) {
            bad = 1;
            break;
        }
        const int64_t *ids = b->input_ids, *lab = b->labels;
        for (int64_t t = 0; t < b->cols; t++) {
            if (ids[t] < 0) bad = 1;
            if ((b->loss_mask[t] == 0.0f) != (lab[t] == -100)) bad = 1;
        }
        /* The segment of record 0: masks follow its trained parts. */
        for (int64_t g = 0; g + 1 < b->n_cu_seqlens; g++) {
            int64_t s0 = b->cu_seqlens[g];
            if (b->cu_seqlens[g + 1] - s0 != (int64_t)k + 1) continue;
            int same = 1;
            for (size_t i = 0; i < k && same; i++) same = ids[s0 + (int64_t)i] == (uint8_t)text[i];
            if (!same) continue;
            for (size_t i = 0; i + 1 < k; i++)
                if (b->loss_mask[s0 + (int64_t)i] != (train[i + 1] ? 1.0f : 0.0f)) bad = 1;
            if (b->loss_mask[s0 + (int64_t)k - 1] != 1.0f || b->loss_mask[s0 + (int64_t)k] != 0.0f)
                bad = 1; /* the eos is predicted; the eos position predicts nothing */
            rows++;
        }
    }
    CHECK(!bad);
    CHECK(rows > 0);
    pl_loader_free(l);
    pl_config_free(cfg);
    /* Config errors. */
    const char *badcfg[][2] = {
        {"sources:\n  - {name: a, type: jsonl, path: x, messages_key: m, tokenizer: {type: bytes}}\n",
         "messages_key needs chat_template"},
        {"sources:\n  - {name: a, type: jsonl, path: x, messages_key: m, chat_template: {user: "
         "'{content}', system: 's', assistant: '{content}'}, tokenizer: {type: bytes}}\n",
         "chat_template.system must hold {content} once"},
        {"sources:\n  - {name: a, type: jsonl, path: x, messages_key: m, chat_template: llama, "
         "tokenizer: {type: bytes}}\n",
         "unknown value 'llama'"},
        {"sources:\n  - {name: a, type: jsonl, path: x, messages_key: m, prompt_key: p, "
         "response_key: r, chat_template: chatml, tokenizer: {type: bytes}}\n",
         "give one kind"},
    };
    for (size_t i = 0; i < sizeof badcfg / sizeof badcfg[0]; i++) {
        CHECK_EQ_I64(pl_config_parse_string(badcfg[i][0], strlen(badcfg[i][0]), "t", &cfg),
                     PL_ECONFIG);
        if (!strstr(pl_config_errmsg(cfg), badcfg[i][1]))
            fprintf(stderr, "chat config %zu: %s\n", i, pl_config_errmsg(cfg));
        CHECK(strstr(pl_config_errmsg(cfg), badcfg[i][1]) != NULL);
        pl_config_free(cfg);
    }
}


/* A factory that counts the tokenizers it makes and destroys (byte tokens). */
typedef struct {
    atomic_int made, destroyed;
    pl_tokenizer bytes;
} share_counts;

static int share_encode(void *ctx, int64_t n, const char *const *texts,
                        const size_t *lens, int32_t **ids, int64_t *counts, char *err,
                        size_t errcap) {
    share_counts *c = ctx;
    return c->bytes.encode_batch(c->bytes.ctx, n, texts, lens, ids, counts, err, errcap);
}

static void share_destroy(void *ctx) {
    share_counts *c = ctx;
    atomic_fetch_add(&c->destroyed, 1);
}

static int share_factory(void *ctx, const char *type, const char *path, pl_tokenizer *out,
                         char *err, size_t errcap) {
    (void)type;
    if (access(path, R_OK) != 0) {
        snprintf(err, errcap, "cannot read %s", path);
        return PL_ECONFIG;
    }
    share_counts *c = ctx;
    pl_tokenizer_bytes(out);
    out->ctx = c;
    out->encode_batch = share_encode;
    out->destroy = share_destroy;
    out->name = "counted";
    atomic_fetch_add(&c->made, 1);
    return PL_OK;
}

/* Sources naming the same tokenizer file share one loaded tokenizer (the
 * factory runs once per file); release drops a source's reference (the last
 * one destroys it), the next tokenization loads it again with the same
 * tokens, and a file changed meanwhile is refused, never used. */
static void test_shared_tokenizer(void) {
    static char corpus[NDOC * 1200];
    size_t n = jsonl_corpus(corpus, sizeof corpus);
    char p[512], ta[512], tb[512], yaml[2048];
    snprintf(p, sizeof p, "%s/share.jsonl", dir);
    snprintf(ta, sizeof ta, "%s/tok_a.json", dir);
    snprintf(tb, sizeof tb, "%s/tok_b.json", dir);
    pl_test_write_file(p, corpus, n);
    pl_test_write_file(ta, "a", 1);
    pl_test_write_file(tb, "b", 1);
    snprintf(yaml, sizeof yaml,
             "seed: 5\nseq_length: 64\nglobal_batch_size: 4\nmicro_batch_size: 1\n"
             "sidecar_index: memory\nsources:\n"
             "  - {name: a1, type: jsonl, path: '%s', tokenizer: {type: hf, path: '%s'}}\n"
             "  - {name: a2, type: jsonl, path: '%s', tokenizer: {type: hf, path: '%s'}}\n"
             "  - {name: b, type: jsonl, path: '%s', tokenizer: {type: hf, path: '%s'}}\n",
             p, ta, p, ta, p, tb);
    static share_counts c;
    atomic_store(&c.made, 0);
    atomic_store(&c.destroyed, 0);
    pl_tokenizer_bytes(&c.bytes);
    pl_config *cfg;
    CHECK_OK(pl_config_parse_string(yaml, strlen(yaml), "t", &cfg));
    pl_config_set_tokenizer_factory(cfg, share_factory, &c);
    pl_source *s[3] = {NULL, NULL, NULL};
    for (int i = 0; i < 3; i++) CHECK_OK(pl_config_open_source(cfg, i, &s[i]));
    pl_config_free(cfg); /* the sources keep how to load their tokenizers */
    if (!s[0] || !s[1] || !s[2]) return;
    CHECK_EQ_I64(atomic_load(&c.made), 2); /* tok_a once, tok_b once */
    int64_t loads = -1, shared = -1;
    CHECK_EQ_I64(pl_source_tokenizer_state(s[0], &loads, &shared), 1);
    CHECK_EQ_I64(loads, 1);
    CHECK_EQ_I64(shared, 2);
    CHECK_EQ_I64(pl_source_tokenizer_state(s[2], NULL, &shared), 1);
    CHECK_EQ_I64(shared, 1);
    int64_t idx[NDOC], ref[NDOC], got[NDOC];
    for (int i = 0; i < NDOC; i++) idx[i] = i;
    CHECK_OK(pl_source_lengths(s[0], idx, NDOC / 2, ref));
    /* One releases: the other holds tok_a still. */
    CHECK_OK(pl_source_release_tokenizer(s[0]));
    CHECK_OK(pl_source_release_tokenizer(s[0])); /* again: nothing to drop */
    CHECK_EQ_I64(pl_source_tokenizer_state(s[0], NULL, &shared), 0);
    CHECK_EQ_I64(shared, 0);
    CHECK_EQ_I64(pl_source_tokenizer_state(s[1], NULL, &shared), 1);
    CHECK_EQ_I64(shared, 1);
    CHECK_EQ_I64(atomic_load(&c.destroyed), 0);
    CHECK_OK(pl_source_release_tokenizer(s[1]));
    CHECK_EQ_I64(atomic_load(&c.destroyed), 1); /* the last holder let go */
    /* The next tokenization loads it again, with the same tokens. */
    CHECK_OK(pl_source_lengths(s[1], idx, NDOC / 2, got));
    CHECK(memcmp(ref, got, sizeof ref / 2) == 0);
    CHECK_EQ_I64(atomic_load(&c.made), 3);
    CHECK_EQ_I64(pl_source_tokenizer_state(s[1], &loads, &shared), 1);
    CHECK_EQ_I64(loads, 2);
    CHECK_EQ_I64(shared, 1);
    /* s[0] takes the one s[1] loaded (no new load) to tokenize a document
       it has not seen, and reads its tokens. */
    int64_t tok[1];
    CHECK_OK(pl_source_read(s[0], NDOC - 1, 0, 1, tok, PL_DTYPE_INT64));
    char first[512];
    doc_text(NDOC - 1, first, sizeof first);
    CHECK_EQ_I64(tok[0], (unsigned char)first[0]); /* byte tokens of its text */
    CHECK_EQ_I64(atomic_load(&c.made), 3);
    CHECK_EQ_I64(pl_source_tokenizer_state(s[0], NULL, &shared), 1);
    CHECK_EQ_I64(shared, 2);
    /* tok_b changes while released: its documents fail, naming the file. */
    CHECK_OK(pl_source_release_tokenizer(s[2]));
    pl_test_write_file(tb, "bb", 2);
    int64_t bad[2];
    CHECK_OK(pl_source_lengths(s[2], idx, 2, bad));
    CHECK(bad[0] < 0 && bad[1] < 0);
    int64_t len = 0;
    CHECK(pl_source_document_length(s[2], 0, &len) != PL_OK);
    CHECK(strstr(pl_source_errmsg(s[2]), "tok_b.json changed") != NULL);
    CHECK_EQ_I64(atomic_load(&c.made), 3); /* never loaded from the new file */
    /* A source opened directly with a tokenizer cannot release it. */
    pl_source_options o;
    memset(&o, 0, sizeof o);
    o.version = PL_SOURCE_OPTIONS_VERSION;
    o.type = PL_SOURCE_JSONL;
    o.path = p;
    pl_tokenizer bt;
    pl_tokenizer_bytes(&bt);
    o.tokenizer = &bt;
    pl_source *direct = NULL;
    CHECK_OK(pl_source_open(&o, &direct));
    CHECK_EQ_I64(pl_source_release_tokenizer(direct), PL_EINVAL);
    CHECK_EQ_I64(pl_source_tokenizer_state(direct, NULL, NULL), -1);
    pl_source_free(direct);
    /* A tokenize pool: the same lengths, tokenized on its threads. */
    CHECK_EQ_I64(pl_set_tokenize_threads(-1), PL_EINVAL);
    CHECK_OK(pl_set_tokenize_threads(2));
    CHECK_EQ_I64(pl_tokenize_threads(), 2);
    int64_t rest[NDOC], fresh[NDOC];
    CHECK_OK(pl_source_lengths(s[1], idx + NDOC / 2, NDOC - NDOC / 2, rest));
    CHECK_OK(pl_set_tokenize_threads(1));
    CHECK_OK(pl_source_lengths(s[0], idx + NDOC / 2, NDOC - NDOC / 2, fresh));
    CHECK(memcmp(rest, fresh, (size_t)(NDOC - NDOC / 2) * sizeof *rest) == 0);
    CHECK_OK(pl_set_tokenize_threads(0));
    CHECK_EQ_I64(pl_tokenize_threads(), 0);
    for (int i = 0; i < 3; i++) pl_source_free(s[i]);
    CHECK_EQ_I64(atomic_load(&c.destroyed), 3);
}

int main(void) {
    dir = pl_test_tmpdir();
    test_formats();
    test_bad_records();
    test_json_records();
    test_gz_trailing_zeros();
    test_bom();
#ifdef PL_WITH_SIMDJSON
    test_json_parser_kept();
#endif
    test_ids_outside_vocabulary();
    test_line_numbers();
    test_plans();
    test_lengths_only();
    test_split_lookahead();
    test_concurrent();
    test_instruction();
    test_length_cache();
    test_chat();
    test_shared_tokenizer();
    TEST_END();
}
