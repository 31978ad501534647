/*
 * test_source_tokens.c -- llm.c shards and flat token files: document
 * boundaries at eos_id (before for llm.c, after for flat), both token widths,
 * multi-file sources, the .plidx sidecar (written once, reused, rebuilt when
 * stale or corrupt, or kept in memory), and the validation errors.
 */
#include "fixtures.h"
#include "config/config.h"
#include "testutil.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

static const char *g_dir;

static pl_source *open_src(pl_source_type type, const char *path,
                           pl_dtype dtype, int64_t eos, int write_index,
                           int *rc) {
    pl_source_options o = {0};
    o.version = PL_SOURCE_OPTIONS_VERSION;
    o.type = type;
    o.path = path;
    o.token_dtype = dtype;
    o.eos_id = eos;
    o.write_index = write_index;
    pl_source *s = NULL;
    *rc = pl_source_open(&o, &s);
    return s;
}

static int msg_ok(const pl_source *s, const char *file, const char *offset) {
    const char *m = pl_source_errmsg(s);
    int ok = strstr(m, file) != NULL && strstr(m, offset) != NULL;
    if (!ok) fprintf(stderr, "  message: %s\n", m);
    return ok;
}

/* Check that the source holds exactly the documents whose exclusive ends
 * are ends[0..n), over the concatenated tokens `all`. */
static void check_docs(pl_source *s, const int64_t *all, const int64_t *ends,
                       int64_t n) {
    CHECK_EQ_I64(pl_source_num_documents(s), n);
    if (pl_source_num_documents(s) != n) return;
    int64_t start = 0;
    for (int64_t i = 0; i < n; i++) {
        int64_t len = -1;
        CHECK_OK(pl_source_document_length(s, i, &len));
        CHECK_EQ_I64(len, ends[i] - start);
        if (len != ends[i] - start) return;
        int64_t *b64 = malloc((size_t)len * 8 + 8);
        int32_t *b32 = malloc((size_t)len * 4 + 4);
        CHECK_OK(pl_source_read(s, i, 0, len, b64, PL_DTYPE_INT64));
        CHECK_OK(pl_source_read(s, i, 0, len, b32, PL_DTYPE_INT32));
        for (int64_t j = 0; j < len; j++) {
            CHECK_EQ_I64(b64[j], all[start + j]);
            CHECK_EQ_I64(b32[j], (int32_t)all[start + j]);
        }
        if (len > 1) {
            CHECK_OK(pl_source_read(s, i, 1, len - 1, b64, PL_DTYPE_INT64));
            CHECK_EQ_I64(b64[0], all[start + 1]);
        }
        free(b64);
        free(b32);
        start = ends[i];
    }
}

static void sidecar_stat(const char *data, struct stat *st) {
    char p[4200];
    snprintf(p, sizeof p, "%s.plidx", data);
    memset(st, 0, sizeof *st);
    if (stat(p, st) != 0) st->st_ino = 0;
}

static void test_llmc(void) {
    const int64_t E = 50256;
    /* Documents start at each eos; the leading [7, 8] is one of its own. */
    const int64_t t[] = {7, 8, E, 1, 2, E, 3, E, E, 4};
    const int64_t ends[] = {2, 5, 7, 8, 10};
    char path[512];
    for (int u32 = 0; u32 < 2; u32++) {
        snprintf(path, sizeof path, "%s/shard_%d.bin", g_dir, u32);
        CHECK(plf_write_llmc(path, u32, t, 10) == 0);
        int rc;
        pl_source *s = open_src(PL_SOURCE_LLMC, path, 0, -1, 0, &rc);
        CHECK_OK(rc);
        CHECK_EQ_I64(pl_source_token_dtype(s),
                     u32 ? PL_DTYPE_UINT32 : PL_DTYPE_UINT16);
        check_docs(s, t, ends, 5);
        pl_source_free(s);
    }
    /* uint32 tokens beyond 16 bits; a shard starting with eos. */
    const int64_t t2[] = {E, 70000, 70001, E, 123456789, E};
    const int64_t ends2[] = {3, 5, 6};
    snprintf(path, sizeof path, "%s/shard_wide.bin", g_dir);
    CHECK(plf_write_llmc(path, 1, t2, 6) == 0);
    int rc;
    pl_source *s = open_src(PL_SOURCE_LLMC, path, 0, -1, 0, &rc);
    CHECK_OK(rc);
    check_docs(s, t2, ends2, 3);
    pl_source_free(s);
}

static void test_flat(void) {
    /* Documents end with (include) eos 0; trailing tokens form the last. */
    const int64_t t[] = {5, 6, 0, 7, 0, 0, 8, 9};
    const int64_t ends[] = {3, 5, 6, 8};
    char path[512];
    int rc;
    snprintf(path, sizeof path, "%s/flat16.bin", g_dir);
    CHECK(plf_write_flat(path, PL_DTYPE_UINT16, t, 8) == 0);
    pl_source *s = open_src(PL_SOURCE_FLAT, path, 0, -1, 0, &rc);
    CHECK_OK(rc);
    CHECK_EQ_I64(pl_source_token_dtype(s), PL_DTYPE_UINT16);
    check_docs(s, t, ends, 4);
    pl_source_free(s);

    const int64_t t32[] = {100000, 1, 2, 4000000000LL, 3, 2, 4000000000LL};
    const int64_t ends32[] = {4, 7};
    snprintf(path, sizeof path, "%s/flat32.bin", g_dir);
    CHECK(plf_write_flat(path, PL_DTYPE_UINT32, t32, 7) == 0);
    s = open_src(PL_SOURCE_FLAT, path, PL_DTYPE_UINT32, 4000000000LL, 0, &rc);
    CHECK_OK(rc);
    CHECK_EQ_I64(pl_source_token_dtype(s), PL_DTYPE_UINT32);
    check_docs(s, t32, ends32, 2);
    pl_source_free(s);

    /* Many documents: grows the index past its first allocation. */
    int64_t n = 100000;
    int64_t *big = malloc((size_t)n * 8);
    int64_t *bends = malloc((size_t)n * 8);
    int64_t nd = 0;
    for (int64_t i = 0; i < n; i++) {
        big[i] = i % 3 == 2 ? 0 : 1 + i % 1000;
        if (big[i] == 0) bends[nd++] = i + 1;
    }
    bends[nd++] = n; /* n % 3 == 1: a trailing document */
    snprintf(path, sizeof path, "%s/flat_big.bin", g_dir);
    CHECK(plf_write_flat(path, PL_DTYPE_UINT16, big, n) == 0);
    s = open_src(PL_SOURCE_FLAT, path, 0, -1, 0, &rc);
    CHECK_OK(rc);
    check_docs(s, big, bends, nd);
    pl_source_stats st = {.size = sizeof st};
    CHECK_OK(pl_source_get_stats(s, &st));
    CHECK_EQ_I64(st.tokens, n);
    CHECK_EQ_I64(st.length_max, 3);
    CHECK_EQ_I64(st.length_p50, 3);
    CHECK(pl_source_sizeof(s) < 64 * 1024);
    pl_source_free(s);
    /* Same again from the sidecar. */
    s = open_src(PL_SOURCE_FLAT, path, 0, -1, 0, &rc);
    CHECK_OK(rc);
    check_docs(s, big, bends, nd);
    pl_source_free(s);
    free(big);
    free(bends);
}

static void test_multi_file(void) {
    char dir[512], path[600];
    snprintf(dir, sizeof dir, "%s/shards", g_dir);
    mkdir(dir, 0755);
    const int64_t E = 60000; /* above every position: values == position */
    /* Concatenated in sorted order: a (0..9), b (10..14), c (15..24). */
    int64_t all[25];
    for (int64_t i = 0; i < 25; i++) all[i] = i;
    all[0] = E;
    all[4] = E;
    all[10] = E;
    all[15] = E;
    all[16] = E;
    all[20] = E;
    const int64_t ends[] = {4, 10, 15, 16, 20, 25};
    snprintf(path, sizeof path, "%s/train_c.bin", dir);
    CHECK(plf_write_llmc(path, 0, all + 15, 10) == 0);
    snprintf(path, sizeof path, "%s/train_a.bin", dir);
    CHECK(plf_write_llmc(path, 0, all, 10) == 0);
    snprintf(path, sizeof path, "%s/train_b.bin", dir);
    CHECK(plf_write_llmc(path, 0, all + 10, 5) == 0);

    int rc;
    pl_source *s = open_src(PL_SOURCE_LLMC, dir, 0, E, 0, &rc);
    CHECK_OK(rc);
    CHECK_EQ_I64(pl_source_num_files(s), 3);
    check_docs(s, all, ends, 6);
    pl_source_free(s);
    /* Sidecars now sit in the directory; they are not data files. */
    s = open_src(PL_SOURCE_LLMC, dir, 0, E, 0, &rc);
    CHECK_OK(rc);
    CHECK_EQ_I64(pl_source_num_files(s), 3);
    check_docs(s, all, ends, 6);
    pl_source_free(s);

    char pat[600];
    snprintf(pat, sizeof pat, "%s/train_*.bin", dir);
    s = open_src(PL_SOURCE_LLMC, pat, 0, E, 0, &rc);
    CHECK_OK(rc);
    CHECK_EQ_I64(pl_source_num_files(s), 3);
    check_docs(s, all, ends, 6);
    pl_source_free(s);

    snprintf(pat, sizeof pat, "%s/train_[bc].bin", dir);
    s = open_src(PL_SOURCE_LLMC, pat, 0, E, 0, &rc);
    CHECK_OK(rc);
    CHECK_EQ_I64(pl_source_num_files(s), 2);
    const int64_t ends_bc[] = {5, 6, 10, 15};
    check_docs(s, all + 10, ends_bc, 4);
    pl_source_free(s);
}

static void test_sidecar(void) {
    char path[512], ipath[600];
    snprintf(path, sizeof path, "%s/side.bin", g_dir);
    snprintf(ipath, sizeof ipath, "%s.plidx", path);
    const int64_t t[] = {1, 2, 0, 3, 0};
    const int64_t ends[] = {3, 5};
    CHECK(plf_write_flat(path, PL_DTYPE_UINT16, t, 5) == 0);
    int rc;
    pl_source *s = open_src(PL_SOURCE_FLAT, path, 0, -1, 0, &rc);
    CHECK_OK(rc);
    check_docs(s, t, ends, 2);
    pl_source_free(s);
    struct stat a, b;
    sidecar_stat(path, &a);
    CHECK(a.st_ino != 0);
    CHECK_EQ_I64(a.st_size, 64 + 2 * 8);

    /* Reused, not rewritten. */
    s = open_src(PL_SOURCE_FLAT, path, 0, -1, 0, &rc);
    CHECK_OK(rc);
    check_docs(s, t, ends, 2);
    pl_source_free(s);
    sidecar_stat(path, &b);
    CHECK_EQ_I64(b.st_ino, a.st_ino);
    CHECK_EQ_I64(b.st_mtim.tv_sec, a.st_mtim.tv_sec);
    CHECK_EQ_I64(b.st_mtim.tv_nsec, a.st_mtim.tv_nsec);

    /* A different eos_id does not reuse it. */
    const int64_t ends3[] = {4, 5};
    s = open_src(PL_SOURCE_FLAT, path, 0, 3, 0, &rc);
    CHECK_OK(rc);
    check_docs(s, t, ends3, 2);
    pl_source_free(s);
    sidecar_stat(path, &b);
    CHECK(b.st_ino != a.st_ino);

    /* The data file changes (size): rebuilt. */
    const int64_t t2[] = {1, 0, 2, 0, 3, 0, 4};
    const int64_t ends2[] = {2, 4, 6, 7};
    CHECK(plf_write_flat(path, PL_DTYPE_UINT16, t2, 7) == 0);
    sidecar_stat(path, &a);
    s = open_src(PL_SOURCE_FLAT, path, 0, -1, 0, &rc);
    CHECK_OK(rc);
    check_docs(s, t2, ends2, 4);
    pl_source_free(s);
    sidecar_stat(path, &b);
    CHECK(b.st_ino != a.st_ino);

    /* Same size, new content, new mtime: rebuilt. */
    const int64_t t3[] = {0, 0, 1, 1, 1, 1, 1};
    const int64_t ends4[] = {1, 2, 7};
    CHECK(plf_write_flat(path, PL_DTYPE_UINT16, t3, 7) == 0);
    struct timespec ts[2] = {{1000000000, 5}, {1000000000, 5}};
    CHECK(utimensat(AT_FDCWD, path, ts, 0) == 0);
    sidecar_stat(path, &a);
    s = open_src(PL_SOURCE_FLAT, path, 0, -1, 0, &rc);
    CHECK_OK(rc);
    check_docs(s, t3, ends4, 3);
    pl_source_free(s);
    sidecar_stat(path, &b);
    CHECK(b.st_ino != a.st_ino);

    /* A corrupt header (CRC) or a short file: rebuilt. */
    uint8_t junk = 0x5a;
    CHECK(plf_patch(ipath, 50, &junk, 1) == 0);
    s = open_src(PL_SOURCE_FLAT, path, 0, -1, 0, &rc);
    CHECK_OK(rc);
    check_docs(s, t3, ends4, 3);
    pl_source_free(s);
    CHECK(truncate(ipath, 70) == 0);
    s = open_src(PL_SOURCE_FLAT, path, 0, -1, 0, &rc);
    CHECK_OK(rc);
    check_docs(s, t3, ends4, 3);
    pl_source_free(s);
    sidecar_stat(path, &a);
    CHECK_EQ_I64(a.st_size, 64 + 3 * 8);

    /* A bad end offset inside a valid header (the CRC covers the header
     * only): open checks the offsets, rebuilds the sidecar, and the
     * documents read back right. */
    uint64_t bad = 1000;
    CHECK(plf_patch(ipath, 64 + 8, &bad, 8) == 0);
    s = open_src(PL_SOURCE_FLAT, path, 0, -1, 0, &rc);
    CHECK_OK(rc);
    check_docs(s, t3, ends4, 3);
    pl_source_free(s);
    {
        FILE *fi = fopen(ipath, "rb");
        uint64_t v = 0;
        CHECK(fi != NULL);
        if (fi) {
            CHECK(fseek(fi, 64 + 8, SEEK_SET) == 0 && fread(&v, 8, 1, fi) == 1);
            fclose(fi);
        }
        CHECK(v != 1000);
    }
    unlink(ipath);

    /* write_index -1: nothing on disk, same documents. */
    s = open_src(PL_SOURCE_FLAT, path, 0, -1, -1, &rc);
    CHECK_OK(rc);
    check_docs(s, t3, ends4, 3);
    CHECK(pl_source_sizeof(s) < 64 * 1024);
    pl_source_free(s);
    CHECK(access(ipath, F_OK) != 0);

    /* A directory we cannot write (only meaningful when not root). */
    if (geteuid() != 0) {
        char ro[512], rpath[600];
        snprintf(ro, sizeof ro, "%s/ro", g_dir);
        mkdir(ro, 0755);
        snprintf(rpath, sizeof rpath, "%s/data.bin", ro);
        CHECK(plf_write_flat(rpath, PL_DTYPE_UINT16, t3, 7) == 0);
        chmod(ro, 0555);
        s = open_src(PL_SOURCE_FLAT, rpath, 0, -1, 0, &rc);
        CHECK_OK(rc);
        check_docs(s, t3, ends4, 3);
        pl_source_free(s);
        chmod(ro, 0755);
    }
}

/* Inode of the .plidx this process maps (from /proc/self/maps), 0: none. */
static unsigned long mapped_plidx_inode(const char *ipath) {
    FILE *m = fopen("/proc/self/maps", "r");
    char line[8192];
    unsigned long ino = 0;
    while (m && fgets(line, sizeof line, m)) {
        char *nl = strchr(line, '\n');
        if (nl) *nl = '\0';
        size_t a = strlen(line), b = strlen(ipath);
        if (a < b || strcmp(line + a - b, ipath) != 0) continue;
        unsigned long x = 0;
        char perms[8], off[32], dev[32];
        if (sscanf(line, "%*s %7s %31s %31s %lu", perms, off, dev, &x) == 4) ino = x;
    }
    if (m) fclose(m);
    return ino;
}

static int count_tmp(const char *dir, const char *prefix) {
    DIR *d = opendir(dir);
    int n = 0;
    for (struct dirent *e; d && (e = readdir(d));)
        if (strncmp(e->d_name, prefix, strlen(prefix)) == 0 && strstr(e->d_name, ".tmp."))
            n++;
    if (d) closedir(d);
    return n;
}

/* Sidecar writing policy: one writer under a lock, read-only, memory only. */
static void test_sidecar_policy(void) {
    char path[512], ipath[600];
    snprintf(path, sizeof path, "%s/policy.bin", g_dir);
    snprintf(ipath, sizeof ipath, "%s.plidx", path);
    int64_t t[4000];
    for (int i = 0; i < 4000; i++) t[i] = i % 7 == 6 ? 0 : 1 + i % 50;
    CHECK(plf_write_flat(path, PL_DTYPE_UINT16, t, 4000) == 0);
    int rc;
    /* PL_INDEX_READ (what inspect does) and PL_INDEX_MEMORY write nothing. */
    pl_source *s = open_src(PL_SOURCE_FLAT, path, 0, -1, PL_INDEX_READ, &rc);
    CHECK_OK(rc);
    int64_t docs = pl_source_num_documents(s);
    CHECK_EQ_I64(docs, 4000 / 7 + 1);
    pl_source_free(s);
    CHECK(access(ipath, F_OK) != 0);
    s = open_src(PL_SOURCE_FLAT, path, 0, -1, PL_INDEX_MEMORY, &rc);
    CHECK_OK(rc);
    CHECK_EQ_I64(pl_source_num_documents(s), docs);
    {   /* releasing pages keeps an in-memory (anonymous) index intact */
        int64_t before[8], after[8];
        for (int i = 0; i < 8; i++)
            CHECK_OK(pl_source_document_length(s, docs - 1 - i * 37, &before[i]));
        CHECK_OK(pl_source_release_pages(s));
        CHECK_EQ_I64(pl_source_num_documents(s), docs);
        for (int i = 0; i < 8; i++) {
            CHECK_OK(pl_source_document_length(s, docs - 1 - i * 37, &after[i]));
            CHECK_EQ_I64(after[i], before[i]);
            CHECK(after[i] > 0);
        }
    }
    pl_source_free(s);
    CHECK(access(ipath, F_OK) != 0);
    s = open_src(PL_SOURCE_FLAT, path, 0, -1, 7, &rc);
    CHECK_EQ_I64(rc, PL_EINVAL);
    CHECK(strstr(pl_last_errmsg(), "write_index 7") != NULL);
    pl_source_free(s);

    /* While another process holds the writer's lock, an opener waits and
       writes nothing; when the lock is released it writes the sidecar. */
    int lockfd = open(path, O_RDONLY);
    CHECK(lockfd >= 0 && flock(lockfd, LOCK_EX) == 0);
    int pfd[2];
    CHECK(pipe(pfd) == 0);
    pid_t child = fork();
    if (child == 0) {
        close(pfd[0]);
        int crc;
        pl_source *cs = open_src(PL_SOURCE_FLAT, path, 0, -1, PL_INDEX_WRITE, &crc);
        int64_t n = crc == PL_OK ? pl_source_num_documents(cs) : -1;
        unsigned long ino = mapped_plidx_inode(ipath);
        if (write(pfd[1], &n, sizeof n) != sizeof n) _exit(3);
        if (write(pfd[1], &ino, sizeof ino) != sizeof ino) _exit(3);
        _exit(0);
    }
    close(pfd[1]);
    /* The child has had time to reach the lock: still running, nothing written. */
    for (int i = 0; i < 20; i++) usleep(10000);
    CHECK(waitpid(child, NULL, WNOHANG) == 0);
    CHECK(access(ipath, F_OK) != 0);
    CHECK_EQ_I64(count_tmp(g_dir, "policy.bin.plidx"), 0);
    flock(lockfd, LOCK_UN);
    close(lockfd);
    int64_t n = -2;
    unsigned long ino = 0;
    CHECK(read(pfd[0], &n, sizeof n) == sizeof n && read(pfd[0], &ino, sizeof ino) == sizeof ino);
    close(pfd[0]);
    int status = 0;
    waitpid(child, &status, 0);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    CHECK_EQ_I64(n, docs);
    struct stat a;
    sidecar_stat(path, &a);
    CHECK(a.st_ino != 0);
    CHECK_EQ_I64((int64_t)ino, (int64_t)a.st_ino); /* it mapped what it wrote */
    unlink(ipath);

    /* Eight processes open a file without a sidecar at once: one writes it,
       the others wait and map the same file (one inode, no leftovers). */
    enum { K = 8 };
    pid_t kids[K];
    int fds[K];
    for (int k = 0; k < K; k++) {
        int p2[2];
        CHECK(pipe(p2) == 0);
        kids[k] = fork();
        if (kids[k] == 0) {
            close(p2[0]);
            int crc;
            pl_source *cs = open_src(PL_SOURCE_FLAT, path, 0, -1, PL_INDEX_WRITE, &crc);
            int64_t cn = crc == PL_OK ? pl_source_num_documents(cs) : -1;
            unsigned long cino = mapped_plidx_inode(ipath);
            if (write(p2[1], &cn, sizeof cn) != sizeof cn) _exit(3);
            if (write(p2[1], &cino, sizeof cino) != sizeof cino) _exit(3);
            _exit(0);
        }
        close(p2[1]);
        fds[k] = p2[0];
    }
    unsigned long inos[K];
    for (int k = 0; k < K; k++) {
        int64_t cn = -2;
        inos[k] = 0;
        CHECK(read(fds[k], &cn, sizeof cn) == sizeof cn &&
              read(fds[k], &inos[k], sizeof inos[k]) == sizeof inos[k]);
        close(fds[k]);
        CHECK_EQ_I64(cn, docs);
        int st2 = 0;
        waitpid(kids[k], &st2, 0);
        CHECK(WIFEXITED(st2) && WEXITSTATUS(st2) == 0);
    }
    sidecar_stat(path, &a);
    for (int k = 0; k < K; k++) CHECK_EQ_I64((int64_t)inos[k], (int64_t)a.st_ino);
    CHECK_EQ_I64(count_tmp(g_dir, "policy.bin.plidx"), 0);

    /* The config key: sidecar_index: memory opens without touching disk. */
    unlink(ipath);
    char yaml[1024];
    snprintf(yaml, sizeof yaml,
             "seq_length: 64\nglobal_batch_size: 2\nmicro_batch_size: 1\n"
             "sidecar_index: memory\nsources:\n  - {name: f, type: flat, path: %s}\n",
             path);
    pl_config *cfg = NULL;
    CHECK_OK(pl_config_parse_string(yaml, strlen(yaml), "t", &cfg));
    int64_t v = -9;
    CHECK_OK(pl_config_get_int(cfg, "sidecar_index", &v));
    CHECK_EQ_I64(v, PL_INDEX_MEMORY);
    CHECK_OK(pl_config_open_source(cfg, 0, &s));
    CHECK_EQ_I64(pl_source_num_documents(s), docs);
    pl_source_free(s);
    CHECK(access(ipath, F_OK) != 0);
    CHECK_OK(pl_config_set(cfg, "sidecar_index", "write"));
    CHECK_OK(pl_config_open_source(cfg, 0, &s));
    pl_source_free(s);
    CHECK(access(ipath, F_OK) == 0);
    CHECK_EQ_I64(pl_config_set(cfg, "sidecar_index", "sometimes"), PL_ECONFIG);
    CHECK(strstr(pl_last_errmsg(), "sidecar_index") != NULL);
    pl_config_free(cfg);
}

static void test_empty(void) {
    char path[512];
    int rc;
    snprintf(path, sizeof path, "%s/empty.bin", g_dir);
    CHECK(plf_write_llmc(path, 0, NULL, 0) == 0);
    pl_source *s = open_src(PL_SOURCE_LLMC, path, 0, -1, 0, &rc);
    CHECK_OK(rc);
    CHECK_EQ_I64(pl_source_num_documents(s), 0);
    int64_t len;
    CHECK_EQ_I64(pl_source_document_length(s, 0, &len), PL_ERANGE);
    pl_source_free(s);
    s = open_src(PL_SOURCE_LLMC, path, 0, -1, 0, &rc); /* from the sidecar */
    CHECK_OK(rc);
    CHECK_EQ_I64(pl_source_num_documents(s), 0);
    pl_source_free(s);

    snprintf(path, sizeof path, "%s/empty_flat.bin", g_dir);
    CHECK(plf_write_flat(path, PL_DTYPE_UINT16, NULL, 0) == 0);
    s = open_src(PL_SOURCE_FLAT, path, 0, -1, -1, &rc);
    CHECK_OK(rc);
    CHECK_EQ_I64(pl_source_num_documents(s), 0);
    pl_source_stats st = {.size = sizeof st};
    CHECK_OK(pl_source_get_stats(s, &st));
    CHECK_EQ_I64(st.documents, 0);
    pl_source_free(s);
}

static void expect_error(pl_source_type type, const char *path, int code,
                         const char *file, const char *offset) {
    int rc;
    pl_source *s = open_src(type, path, 0, -1, 0, &rc);
    CHECK(s != NULL);
    if (rc != code)
        fprintf(stderr, "  %s: expected %s, got %s: %s\n", path,
                pl_err_name(code), pl_err_name(rc), pl_source_errmsg(s));
    CHECK_EQ_I64(rc, code);
    CHECK(msg_ok(s, file, offset));
    pl_source_free(s);
}

static void test_errors(void) {
    const int64_t t[] = {50256, 1, 2, 3};
    char path[512];
    int32_t v;

    snprintf(path, sizeof path, "%s/bad_magic.bin", g_dir);
    CHECK(plf_write_llmc(path, 0, t, 4) == 0);
    v = 12345;
    CHECK(plf_patch(path, 0, &v, 4) == 0);
    expect_error(PL_SOURCE_LLMC, path, PL_EMAGIC, "bad_magic.bin", "offset 0");

    snprintf(path, sizeof path, "%s/bad_version.bin", g_dir);
    CHECK(plf_write_llmc(path, 0, t, 4) == 0);
    v = 2;
    CHECK(plf_patch(path, 4, &v, 4) == 0);
    expect_error(PL_SOURCE_LLMC, path, PL_EVERSION, "bad_version.bin",
                 "offset 4");

    snprintf(path, sizeof path, "%s/short_header.bin", g_dir);
    CHECK(plf_write_llmc(path, 0, t, 4) == 0);
    CHECK(truncate(path, 100) == 0);
    expect_error(PL_SOURCE_LLMC, path, PL_ETRUNC, "short_header.bin",
                 "offset 100");

    snprintf(path, sizeof path, "%s/short_tokens.bin", g_dir);
    CHECK(plf_write_llmc(path, 0, t, 4) == 0);
    CHECK(truncate(path, 1024 + 6) == 0);
    expect_error(PL_SOURCE_LLMC, path, PL_ETRUNC, "short_tokens.bin",
                 "offset 1030");

    snprintf(path, sizeof path, "%s/bad_count.bin", g_dir);
    CHECK(plf_write_llmc(path, 0, t, 4) == 0);
    v = 3; /* the file holds 4 tokens */
    CHECK(plf_patch(path, 8, &v, 4) == 0);
    expect_error(PL_SOURCE_LLMC, path, PL_ECOUNT, "bad_count.bin", "offset 8");

    snprintf(path, sizeof path, "%s/odd_flat.bin", g_dir);
    CHECK(plf_write_flat(path, PL_DTYPE_UINT16, t, 4) == 0);
    CHECK(truncate(path, 7) == 0);
    expect_error(PL_SOURCE_FLAT, path, PL_ETRUNC, "odd_flat.bin", "offset 7");

    snprintf(path, sizeof path, "%s/missing.bin", g_dir);
    expect_error(PL_SOURCE_FLAT, path, PL_ENOENT, "missing.bin", "");
    snprintf(path, sizeof path, "%s/nomatch_*.bin", g_dir);
    expect_error(PL_SOURCE_LLMC, path, PL_ENOENT, "nomatch_*.bin", "");

    /* Flat files take uint16 or uint32 only. */
    snprintf(path, sizeof path, "%s/odd_flat.bin", g_dir);
    int rc;
    pl_source *s = open_src(PL_SOURCE_FLAT, path, PL_DTYPE_INT64, -1, 0, &rc);
    CHECK_EQ_I64(rc, PL_EINVAL);
    pl_source_free(s);
    s = open_src(PL_SOURCE_FLAT, path, 0, -7, 0, &rc);
    CHECK_EQ_I64(rc, PL_EINVAL);
    pl_source_free(s);
}

int main(void) {
    g_dir = pl_test_tmpdir();
    test_llmc();
    test_flat();
    test_multi_file();
    test_sidecar();
    test_sidecar_policy();
    test_empty();
    test_errors();
    TEST_END();
}
