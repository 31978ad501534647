/*
 * Data files are read through the descriptor kept from open time: a file
 * replaced by rename(2) is still read from the file that was opened (or,
 * beyond the descriptor budget, refused), and a file that shrinks after
 * open gives PL_ETRUNC instead of SIGBUS.
 */
#include "fixtures.h"
#include "testutil.h"

#include <sys/resource.h>

#define NS 40
#define NDOC 8

static const char *dir;

static void prefix_of(int s, char *p, size_t cap) { snprintf(p, cap, "%s/m%02d", dir, s); }

/* Source s: NDOC documents of 3000 int32 tokens (several pages), token k of
 * the file = base + k. */
static void write_source(int s, int64_t base) {
    char p[512];
    prefix_of(s, p, sizeof p);
    int64_t lens[NDOC];
    for (int i = 0; i < NDOC; i++) lens[i] = 3000;
    if (plf_write_megatron(p, PL_DTYPE_INT32, NDOC, lens, base) != 0) exit(2);
}

/* Write a new version of source s next to it and rename it over the old. */
static void replace_source(int s, int64_t base) {
    char p[512], tmp[600], from[700], to[700];
    prefix_of(s, p, sizeof p);
    snprintf(tmp, sizeof tmp, "%s.new", p);
    int64_t lens[NDOC];
    for (int i = 0; i < NDOC; i++) lens[i] = 3000;
    if (plf_write_megatron(tmp, PL_DTYPE_INT32, NDOC, lens, base) != 0) exit(2);
    const char *ext[2] = {".bin", ".idx"};
    for (int e = 0; e < 2; e++) {
        snprintf(from, sizeof from, "%s%s", tmp, ext[e]);
        snprintf(to, sizeof to, "%s%s", p, ext[e]);
        if (rename(from, to) != 0) exit(2);
    }
}

static pl_source *open_source(int s) {
    char p[512];
    prefix_of(s, p, sizeof p);
    pl_source_options o = {0};
    o.version = PL_SOURCE_OPTIONS_VERSION;
    o.type = PL_SOURCE_MEGATRON;
    o.path = p;
    pl_source *src = NULL;
    CHECK_OK(pl_source_open(&o, &src));
    return src;
}

int main(void) {
    /* A small descriptor limit, set before any source is opened: the budget
       is half of it (32), so sources 32.. keep no descriptor. */
    struct rlimit rl;
    CHECK(getrlimit(RLIMIT_NOFILE, &rl) == 0);
    rl.rlim_cur = 64;
    CHECK(setrlimit(RLIMIT_NOFILE, &rl) == 0);
    dir = pl_test_tmpdir();
    for (int s = 0; s < NS; s++) write_source(s, 1000000 * (s + 1));
    pl_source *src[NS];
    for (int s = 0; s < NS; s++) src[s] = open_source(s);

    /* Replaced by mv after open: the kept descriptor reads the old file. */
    replace_source(0, 77000000);
    pl_read rd = {0, 0, 2, 10, 5};
    int64_t out[8] = {0};
    CHECK_OK(pl_source_read_many(src[0], &rd, 1, out));
    CHECK_EQ_I64(out[0], 1000000 + 2 * 3000 + 10);
    CHECK_EQ_I64(out[4], 1000000 + 2 * 3000 + 14);
    CHECK_OK(pl_source_read(src[0], 2, 10, 5, out, PL_DTYPE_INT64));
    CHECK_EQ_I64(out[0], 1000000 + 2 * 3000 + 10);

    /* Beyond the budget a replaced file is refused, not read as the new. */
    replace_source(NS - 1, 88000000);
    CHECK_EQ_I64(pl_source_read_many(src[NS - 1], &rd, 1, out), PL_EIO);
    CHECK(strstr(pl_source_errmsg(src[NS - 1]), "replaced since the source was opened") != NULL);
    CHECK_EQ_I64(pl_source_read(src[NS - 1], 2, 10, 5, out, PL_DTYPE_INT64), PL_EIO);
    /* ... and one that was not replaced is still read beyond the budget. */
    CHECK_OK(pl_source_read_many(src[NS - 2], &rd, 1, out));
    CHECK_EQ_I64(out[0], 1000000 * (NS - 1) + 2 * 3000 + 10);

    /* Shrunk after open: PL_ETRUNC naming the file, no SIGBUS through the
       mapping.  Documents before the new end still read. */
    for (int s = 1; s <= 2; s++) {
        int victim = s == 1 ? 1 : NS - 2; /* with and without a kept fd */
        char p[512], bin[600];
        prefix_of(victim, p, sizeof p);
        snprintf(bin, sizeof bin, "%s.bin", p);
        CHECK(truncate(bin, 3000 * 4) == 0); /* keeps document 0 */
        usleep(20000); /* past the 10 ms a seen size is trusted */
        int64_t *big = calloc(3000, sizeof *big);
        CHECK_OK(pl_source_read(src[victim], 0, 0, 3000, big, PL_DTYPE_INT64));
        CHECK_EQ_I64(big[2999], 1000000 * (victim + 1) + 2999);
        CHECK_EQ_I64(pl_source_read(src[victim], 5, 0, 3000, big, PL_DTYPE_INT64), PL_ETRUNC);
        CHECK(strstr(pl_source_errmsg(src[victim]), bin) != NULL);
        CHECK(strstr(pl_source_errmsg(src[victim]), "truncated") != NULL);
        pl_read r5 = {0, 0, 5, 0, 3000};
        CHECK_EQ_I64(pl_source_read_many(src[victim], &r5, 1, big), PL_ETRUNC);
        CHECK(strstr(pl_source_errmsg(src[victim]), bin) != NULL);
        free(big);
    }
    for (int s = 0; s < NS; s++) pl_source_free(src[s]);

    /* An index that shrinks after open: the lookups through its mapping
       give PL_ETRUNC, not SIGBUS (indexes of several pages). */
    {
        char p[512], idx[600];
        snprintf(p, sizeof p, "%s/bigidx", dir);
        int64_t *lens = calloc(1500, sizeof *lens);
        for (int i = 0; i < 1500; i++) lens[i] = 2;
        CHECK(plf_write_megatron(p, PL_DTYPE_INT32, 1500, lens, 0) == 0);
        free(lens);
        pl_source_options o = {0};
        o.version = PL_SOURCE_OPTIONS_VERSION;
        o.type = PL_SOURCE_MEGATRON;
        o.path = p;
        pl_source *m = NULL;
        CHECK_OK(pl_source_open(&o, &m));
        int64_t len = 0;
        CHECK_OK(pl_source_document_length(m, 1400, &len));
        snprintf(idx, sizeof idx, "%s.idx", p);
        CHECK(truncate(idx, 4096) == 0);
        usleep(20000); /* past the 10 ms a seen size is trusted */
        CHECK_EQ_I64(pl_source_document_length(m, 1400, &len), PL_ETRUNC);
        CHECK(strstr(pl_source_errmsg(m), idx) != NULL);
        pl_source_stats st = {.size = sizeof st};
        CHECK_EQ_I64(pl_source_get_stats(m, &st), PL_ETRUNC);
        pl_source_free(m);
    }
    /* The planner checks its sources' indexes once per step. */
    {
        char p[512], idx[600], y[1024];
        snprintf(p, sizeof p, "%s/planidx", dir);
        int64_t *lens = calloc(1500, sizeof *lens);
        for (int i = 0; i < 1500; i++) lens[i] = 1 + i % 50;
        CHECK(plf_write_megatron(p, PL_DTYPE_INT32, 1500, lens, 0) == 0);
        free(lens);
        snprintf(y, sizeof y,
                 "seq_length: 64\nglobal_batch_size: 4\nmicro_batch_size: 1\n"
                 "sources:\n  - {name: a, type: megatron, path: %s}\n", p);
        pl_config *cfg = NULL;
        CHECK_OK(pl_config_parse_string(y, strlen(y), "t", &cfg));
        pl_source *a = NULL;
        CHECK_OK(pl_config_open_source(cfg, 0, &a));
        pl_planner *pp = NULL;
        CHECK_OK(pl_planner_create(cfg, &a, 1, &pp));
        pl_plan *pl = NULL;
        CHECK_OK(pl_planner_next(pp, &pl));
        pl_plan_free(pl);
        snprintf(idx, sizeof idx, "%s.idx", p);
        CHECK(truncate(idx, 4096) == 0);
        usleep(20000);
        pl = NULL;
        CHECK_EQ_I64(pl_planner_next(pp, &pl), PL_ETRUNC);
        CHECK(strstr(pl_planner_errmsg(pp), idx) != NULL);
        pl_planner_free(pp);
        pl_source_free(a);
        pl_config_free(cfg);
    }
    {
        char f[512], sidecar[600];
        snprintf(f, sizeof f, "%s/flat.bin", dir);
        int64_t *tok = calloc(3000, sizeof *tok);
        for (int i = 0; i < 3000; i++) tok[i] = i % 2 ? 0 : 5; /* 1500 documents */
        CHECK(plf_write_flat(f, PL_DTYPE_UINT16, tok, 3000) == 0);
        free(tok);
        pl_source_options o = {0};
        o.version = PL_SOURCE_OPTIONS_VERSION;
        o.type = PL_SOURCE_FLAT;
        o.path = f;
        pl_source *fl = NULL;
        CHECK_OK(pl_source_open(&o, &fl)); /* writes and maps the .plidx */
        int64_t len = 0;
        CHECK_OK(pl_source_document_length(fl, 1490, &len));
        CHECK_EQ_I64(len, 2);
        snprintf(sidecar, sizeof sidecar, "%s.plidx", f);
        CHECK(truncate(sidecar, 4096) == 0);
        usleep(20000);
        CHECK_EQ_I64(pl_source_document_length(fl, 1490, &len), PL_ETRUNC);
        CHECK(strstr(pl_source_errmsg(fl), sidecar) != NULL);
        pl_source_free(fl);
    }
    TEST_END();
}
