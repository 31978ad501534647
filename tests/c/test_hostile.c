/*
 * Hostile input: blobs, plans and configs that are well-formed enough to
 * pass their checksums but whose values would overflow, index out of bounds
 * or take unbounded time.  Each is refused with a clear status.
 */
#include "corpus.h"
#include "planner/planner.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <time.h>

/* CPU time of this process: the bounds below tell linear from quadratic work
 * (or work done from work refused) and must not fail because other processes
 * load the machine, as wall-clock time does. */
static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Recompute the trailing CRC-32 of a state or plan blob. */
static void reseal(unsigned char *b, size_t n) {
    uint32_t crc = pl__crc32(0, b, n - 4);
    memcpy(b + n - 4, &crc, 4);
}

static void put_i64(unsigned char *b, size_t off, int64_t v) { memcpy(b + off, &v, 8); }
static int64_t get_i64(const unsigned char *b, size_t off) {
    int64_t v;
    memcpy(&v, b + off, 8);
    return v;
}

/* Offsets of a state blob's per-source records and carried chunks
 * (the layout of src/planner/state.c). */
#define ST_STEP 24
#define ST_NSRC 96
typedef struct st_layout {
    size_t src_fields[64]; /* offset of "documents in the source" of source j */
    uint32_t ns;
    size_t carry;          /* offset of the u32 chunk count */
} st_layout;

static void st_parse(const unsigned char *b, st_layout *o) {
    memcpy(&o->ns, b + ST_NSRC, 4);
    size_t at = ST_NSRC + 4;
    for (uint32_t j = 0; j < o->ns; j++) {
        uint32_t n;
        memcpy(&n, b + at, 4);
        at += 4 + n;
        memcpy(&n, b + at, 4);
        at += 4 + n;
        if (j < 64) o->src_fields[j] = at;
        at += 13 * 8; /* version 3: 12 counters (the target in two) and the step's weight */
    }
    o->carry = at;
}
/* Field k (0 nd, 1 epoch, 2 drawn_in_epoch, 3 cur_index, 4 cur_offset,
 * 5 cur_length, ...) of source j. */
static size_t st_field(const st_layout *o, uint32_t j, int k) {
    return o->src_fields[j] + 8 * (size_t)k;
}

static unsigned char *planner_blob(pl_planner *p, size_t *n) {
    CHECK_OK(pl_planner_get_state(p, NULL, 0, n));
    unsigned char *b = malloc(*n);
    CHECK_OK(pl_planner_get_state(p, b, *n, n));
    return b;
}

static void test_state_step_bound(const corpus *c) {
    pl_config *cfg = corpus_config(c, "seq_length: 64\nglobal_batch_size: 64\nmicro_batch_size: 1", NULL);
    pl_source *src[NSRC];
    for (int s = 0; s < NSRC; s++) CHECK_OK(pl__config_open_source(cfg, s, &src[s]));
    pl_planner *p = NULL;
    CHECK_OK(pl_planner_create(cfg, src, NSRC, &p));
    size_t n = 0;
    unsigned char *b = planner_blob(p, &n);
    /* 2^48 steps of 64 micro-batches: 2^54 micro-batches, above 2^50. */
    put_i64(b, ST_STEP, (int64_t)1 << 48);
    reseal(b, n);
    CHECK_EQ_I64(pl_planner_set_state(p, b, n), PL_ESTATE);
    CHECK(strstr(pl_planner_errmsg(p), "limit") != NULL);
    /* Through the loader: the cursor step * nmb would overflow. */
    pl_loader *l = NULL;
    CHECK_OK(pl_loader_create(cfg, NULL, &l));
    put_i64(b, ST_STEP, ((int64_t)1 << 50) - 1);
    reseal(b, n);
    CHECK_EQ_I64(pl_loader_set_state(l, b, n), PL_ESTATE);
    /* A step just inside the bound is accepted. */
    put_i64(b, ST_STEP, ((int64_t)1 << 50) / 64);
    reseal(b, n);
    CHECK_OK(pl_planner_set_state(p, b, n));
    pl_loader_free(l);
    free(b);
    pl_planner_free(p);
    for (int s = 0; s < NSRC; s++) pl_source_free(src[s]);
    pl_config_free(cfg);
}

static void test_train_steps_product(const corpus *c) {
    char y[4096];
    snprintf(y, sizeof y,
             "seq_length: 64\nglobal_batch_size: 16384\nmicro_batch_size: 1\n"
             "train_steps: %lld\nsources:\n  - {name: a, type: megatron, path: %s/src0}\n",
             (long long)1 << 40, c->dir);
    pl_config *cfg = NULL;
    CHECK_EQ_I64(pl_config_parse_string(y, strlen(y), "t", &cfg), PL_ECONFIG);
    CHECK(strstr(pl_config_errmsg(cfg), "train_steps") != NULL);
    pl_config_free(cfg);
    snprintf(y, sizeof y,
             "seq_length: 64\nglobal_batch_size: 16384\nmicro_batch_size: 1\n"
             "train_steps: %lld\nsources:\n  - {name: a, type: megatron, path: %s/src0}\n",
             (long long)1 << 36, c->dir);
    CHECK_OK(pl_config_parse_string(y, strlen(y), "t", &cfg));
    pl_config_free(cfg);
}

/* The current document and carried chunks of a state are checked against
 * the sources at load. */
static void test_state_documents(const corpus *c) {
    pl_config *cfg = corpus_config(c, "seq_length: 64\nglobal_batch_size: 4\nmicro_batch_size: 1", NULL);
    pl_source *src[NSRC];
    for (int s = 0; s < NSRC; s++) CHECK_OK(pl__config_open_source(cfg, s, &src[s]));
    pl_planner *p = NULL;
    CHECK_OK(pl_planner_create(cfg, src, NSRC, &p));
    int found = -1;
    for (int step = 0; step < 200 && found < 0; step++) {
        pl_plan *pl = NULL;
        CHECK_OK(pl_planner_next(p, &pl));
        pl_plan_free(pl);
        for (int s = 0; s < NSRC; s++)
            if (p->src[s].cur_index >= 0 && p->carry.n > 0) found = s;
    }
    CHECK(found >= 0);
    if (found >= 0) {
        size_t n = 0;
        unsigned char *b = planner_blob(p, &n);
        st_layout o;
        st_parse(b, &o);
        CHECK_EQ_I64(o.ns, NSRC);
        CHECK_OK(pl_planner_set_state(p, b, n)); /* as saved: fine */
        /* current document of another length */
        unsigned char *x = malloc(n);
        memcpy(x, b, n);
        size_t f = st_field(&o, (uint32_t)found, 5);
        CHECK_EQ_I64(get_i64(x, f), p->src[found].cur_length);
        put_i64(x, f, get_i64(x, f) + 1);
        reseal(x, n);
        CHECK_EQ_I64(pl_planner_set_state(p, x, n), PL_ESTATE);
        CHECK(strstr(pl_planner_errmsg(p), "length") != NULL);
        /* current document index pointing at another document */
        memcpy(x, b, n);
        int64_t cur = get_i64(x, st_field(&o, (uint32_t)found, 3)), other = -1;
        for (int64_t d = 0; d < c->n[found] && other < 0; d++)
            if (c->len[found][d] != c->len[found][cur]) other = d;
        put_i64(x, st_field(&o, (uint32_t)found, 3), other);
        reseal(x, n);
        CHECK_EQ_I64(pl_planner_set_state(p, x, n), PL_ESTATE);
        free(x);
        free(b);
    }
    pl_planner_free(p);
    for (int s = 0; s < NSRC; s++) pl_source_free(src[s]);
    pl_config_free(cfg);

    /* A source with a damaged record 3: a carried chunk or current document
       there cannot be range-checked, so the state is refused. */
    char prefix[512], y[2048];
    snprintf(prefix, sizeof prefix, "%s/damaged", c->dir);
    int64_t lens[12];
    for (int i = 0; i < 12; i++) lens[i] = 40 + 7 * i;
    CHECK(plf_write_megatron(prefix, PL_DTYPE_INT32, 12, lens, 0) == 0);
    char idx[600];
    snprintf(idx, sizeof idx, "%s.idx", prefix);
    int64_t bad_ptr = (int64_t)1 << 40;
    CHECK(plf_patch(idx, 34 + 4 * 12 + 8 * 3, &bad_ptr, 8) == 0);
    snprintf(y, sizeof y,
             "seq_length: 64\nglobal_batch_size: 4\nmicro_batch_size: 1\non_error: skip\n"
             "sources:\n  - {name: d, type: megatron, path: %s}\n", prefix);
    CHECK_OK(pl_config_parse_string(y, strlen(y), "t", &cfg));
    pl_source *d = NULL;
    CHECK_OK(pl__config_open_source(cfg, 0, &d));
    CHECK_OK(pl_planner_create(cfg, &d, 1, &p));
    int64_t dummy = 0;
    CHECK(pl_source_document_length(d, 3, &dummy) == PL_EBOUNDS);
    for (int step = 0; step < 50 && p->carry.n == 0; step++) {
        pl_plan *pl = NULL;
        CHECK_OK(pl_planner_next(p, &pl));
        pl_plan_free(pl);
    }
    CHECK(p->carry.n > 0);
    if (p->carry.n > 0) {
        size_t n = 0;
        unsigned char *b = planner_blob(p, &n);
        st_layout o;
        st_parse(b, &o);
        CHECK_OK(pl_planner_set_state(p, b, n));
        /* carried chunk 0 (i32 source, i32 flags, i64 index, offset, length) */
        size_t ch = o.carry + 4;
        put_i64(b, ch + 8, 3);
        put_i64(b, ch + 16, 0);
        put_i64(b, ch + 24, 1);
        reseal(b, n);
        CHECK_EQ_I64(pl_planner_set_state(p, b, n), PL_ESTATE);
        free(b);
        b = planner_blob(p, &n);
        st_parse(b, &o);
        put_i64(b, st_field(&o, 0, 3), 3); /* current document: the damaged one */
        put_i64(b, st_field(&o, 0, 4), 1);
        put_i64(b, st_field(&o, 0, 5), 54);
        reseal(b, n);
        CHECK_EQ_I64(pl_planner_set_state(p, b, n), PL_ESTATE);
        CHECK(strstr(pl_planner_errmsg(p), "cannot be checked") != NULL);
        free(b);
    }
    pl_planner_free(p);
    pl_source_free(d);
    pl_config_free(cfg);
}

/* pl_plan_decode bounds seq_length, so its sums and count = length + 1 of
 * pl_plan_reads cannot overflow. */
static void test_plan_bounds(const corpus *c) {
    pl_config *cfg = corpus_config(c, "seq_length: 64\nglobal_batch_size: 4\nmicro_batch_size: 1", NULL);
    pl_source *src[NSRC];
    for (int s = 0; s < NSRC; s++) CHECK_OK(pl__config_open_source(cfg, s, &src[s]));
    pl_planner *p = NULL;
    CHECK_OK(pl_planner_create(cfg, src, NSRC, &p));
    pl_plan *pl = NULL;
    CHECK_OK(pl_planner_next(p, &pl));
    size_t n = 0;
    CHECK_OK(pl_plan_encode(pl, NULL, 0, &n));
    unsigned char *b = malloc(n), *x = malloc(n);
    CHECK_OK(pl_plan_encode(pl, b, n, &n));
    pl_plan *back = NULL;
    CHECK_OK(pl_plan_decode(b, n, &back));
    pl_plan_free(back);
    /* seq_length (header field 5) INT64_MAX with a chunk of INT64_MAX tokens */
    memcpy(x, b, n);
    put_i64(x, 16 + 5 * 8, INT64_MAX);
    put_i64(x, 16 + 10 * 8 + 24, INT64_MAX); /* chunks[0].length */
    reseal(x, n);
    back = NULL;
    CHECK_EQ_I64(pl_plan_decode(x, n, &back), PL_EINVAL);
    CHECK(back == NULL);
    /* seq_length just above the config limit */
    memcpy(x, b, n);
    put_i64(x, 16 + 5 * 8, ((int64_t)1 << 24) + 1);
    reseal(x, n);
    CHECK_EQ_I64(pl_plan_decode(x, n, &back), PL_EINVAL);
    /* a chunk offset near INT64_MAX (offset + length would overflow) */
    memcpy(x, b, n);
    put_i64(x, 16 + 10 * 8 + 16, INT64_MAX - 1);
    reseal(x, n);
    CHECK_EQ_I64(pl_plan_decode(x, n, &back), PL_EINVAL);
    free(x);
    free(b);
    pl_plan_free(pl);
    pl_planner_free(p);
    for (int s = 0; s < NSRC; s++) pl_source_free(src[s]);
    pl_config_free(cfg);
}

/* Plans built by hand: rank_sequences and seq_offsets are checked. */
static void test_hand_built_plan(const corpus *c) {
    pl_config *cfg = corpus_config(c, "seq_length: 64\nglobal_batch_size: 2\nmicro_batch_size: 1", NULL);
    pl_constructor *k = NULL;
    CHECK_OK(pl_constructor_create(cfg, &k));
    pl_chunk chunks[2] = {{0, PL_CHUNK_DOC_END, 0, 0, 3}, {1, PL_CHUNK_DOC_END, 0, 0, 2}};
    int64_t offsets[3] = {0, 1, 2}, tokens[2] = {3, 2}, ranks[2] = {0, 1};
    double cost[2] = {0, 0}, rcost[1] = {0};
    pl_plan plan = {0};
    plan.dp = 1;
    plan.global_batch_size = 2;
    plan.micro_batch_size = 1;
    plan.micro_batches_per_rank = 2;
    plan.seq_length = 64;
    plan.n_sequences = 2;
    plan.n_chunks = 2;
    plan.chunks = chunks;
    plan.seq_offsets = offsets;
    plan.seq_tokens = tokens;
    plan.seq_cost = cost;
    plan.rank_sequences = ranks;
    plan.rank_cost = rcost;
    int64_t t0[3] = {7, 8, 9}, t1[2] = {5, 6};
    const int64_t *pay[1] = {t0};
    int64_t plen[1] = {3};
    pl_batch *out = NULL;
    CHECK_OK(pl_constructor_build(k, &plan, 0, 0, pay, plen, 1, &out));
    pl_batch_release(out);
    pay[0] = t1;
    plen[0] = 2;
    CHECK_OK(pl_constructor_build(k, &plan, 0, 1, pay, plen, 1, &out));
    pl_batch_release(out);
    /* seq_offsets of sequence 1 far past the chunks */
    offsets[1] = (int64_t)1 << 40;
    offsets[2] = ((int64_t)1 << 40) + 1;
    out = NULL;
    CHECK_EQ_I64(pl_constructor_build(k, &plan, 0, 1, pay, plen, 1, &out), PL_EINVAL);
    CHECK(out == NULL);
    int64_t nr = 0;
    CHECK_EQ_I64(pl_plan_reads(&plan, 0, 1, NULL, 0, &nr), PL_EINVAL);
    offsets[1] = 1;
    offsets[2] = 2;
    /* a negative start, and a rank slot naming a sequence that is not there */
    offsets[1] = -((int64_t)1 << 40);
    CHECK_EQ_I64(pl_constructor_build(k, &plan, 0, 1, pay, plen, 1, &out), PL_EINVAL);
    offsets[1] = 1;
    ranks[1] = 1 << 30;
    CHECK_EQ_I64(pl_constructor_build(k, &plan, 0, 1, pay, plen, 1, &out), PL_EINVAL);
    CHECK_EQ_I64(pl_plan_reads(&plan, 0, 1, NULL, 0, &nr), PL_EINVAL);
    ranks[1] = 1;
    /* more micro-batches per rank than the sequences hold */
    plan.micro_batches_per_rank = 3;
    CHECK_EQ_I64(pl_constructor_build(k, &plan, 0, 2, pay, plen, 1, &out), PL_EINVAL);
    CHECK_EQ_I64(pl_plan_reads(&plan, 0, 2, NULL, 0, &nr), PL_EINVAL);
    plan.micro_batches_per_rank = 2;
    /* a chunk longer than seq_length, with a huge length that would overflow
       the padded sum */
    chunks[1].length = INT64_MAX - 1;
    CHECK_EQ_I64(pl_constructor_build(k, &plan, 0, 1, pay, plen, 1, &out), PL_EINVAL);
    /* ... and pl_plan_reads would compute count = length + 1 from it */
    chunks[1].length = INT64_MAX;
    CHECK_EQ_I64(pl_plan_reads(&plan, 0, 1, NULL, 0, &nr), PL_EINVAL);
    plan.seq_length = INT64_MAX;
    CHECK_EQ_I64(pl_plan_reads(&plan, 0, 1, NULL, 0, &nr), PL_EINVAL);
    plan.seq_length = 64;
    chunks[1].length = 2;
    CHECK_OK(pl_plan_reads(&plan, 0, 1, NULL, 0, &nr));
    CHECK_EQ_I64(nr, 1);
    /* NULL payloads with a count: refused before a buffer is taken from the
       pool (the ASan build's leak check fails if a buffer leaks) */
    CHECK_EQ_I64(pl_constructor_build(k, &plan, 0, 1, NULL, NULL, 1, &out), PL_EINVAL);
    CHECK(strstr(pl_constructor_errmsg(k), "NULL payloads") != NULL);
    CHECK_EQ_I64(pl_constructor_build(k, NULL, 0, 1, pay, plen, 1, &out), PL_EINVAL);
    pl_constructor_free(k);
    pl_config_free(cfg);
}

/* An empty .bin (every document empty) opens and reads without pointer
 * arithmetic on NULL (clang's UBSan reports NULL + 0). */
static void test_empty_bin(const corpus *c) {
    char prefix[512];
    snprintf(prefix, sizeof prefix, "%s/emptybin", c->dir);
    int64_t lens[3] = {0, 0, 0};
    CHECK(plf_write_megatron(prefix, PL_DTYPE_UINT16, 3, lens, 0) == 0);
    pl_source_options o = {0};
    o.version = PL_SOURCE_OPTIONS_VERSION;
    o.type = PL_SOURCE_MEGATRON;
    o.path = prefix;
    pl_source *s = NULL;
    CHECK_OK(pl_source_open(&o, &s));
    int64_t len = -1, tok = 0;
    CHECK_OK(pl_source_document_length(s, 1, &len));
    CHECK_EQ_I64(len, 0);
    CHECK_OK(pl_source_read(s, 2, 0, 0, &tok, PL_DTYPE_INT64));
    pl_read rd = {0, 0, 0, 0, 0};
    CHECK_OK(pl_source_read_many(s, &rd, 1, &tok));
    pl_source_free(s);
}

/* Work linear in the number of sources: config parsing (duplicate names,
 * schedule names) and state decoding (names matched by index). */
/* CPU seconds of the calling thread (not wall time: other processes on the
 * machine do not move it). */
static double cpu_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static char *many_yaml(const corpus *c, int64_t N, size_t *len) {
    size_t cap = (size_t)N * 400 + 4096, at = 0;
    char *y = malloc(cap);
    at += (size_t)snprintf(y + at, cap - at,
                           "seq_length: 64\nglobal_batch_size: 4\nmicro_batch_size: 1\nsources:\n");
    for (int64_t i = 0; i < N; i++)
        at += (size_t)snprintf(y + at, cap - at,
                               "  - {name: source_with_a_long_common_prefix_%06lld, type: megatron, "
                               "path: %s/src0, weight: 1}\n",
                               (long long)i, c->dir);
    at += (size_t)snprintf(y + at, cap - at, "schedule:\n  points:\n    - step: 0\n      weights: {");
    for (int64_t i = 0; i < N; i += 2)
        at += (size_t)snprintf(y + at, cap - at, "%ssource_with_a_long_common_prefix_%06lld: 1",
                               i ? ", " : "", (long long)i);
    at += (size_t)snprintf(y + at, cap - at, "}\n");
    *len = at;
    return y;
}

/* CPU time of parsing the config of n sources, the least of `reps` runs. */
static double parse_cpu(const corpus *c, int64_t n, int reps) {
    size_t at = 0;
    char *y = many_yaml(c, n, &at);
    double best = 1e30;
    for (int r = 0; r < reps; r++) {
        double t0 = cpu_s();
        pl_config *cfg = NULL;
        CHECK_OK(pl_config_parse_string(y, at, "many", &cfg));
        double t = cpu_s() - t0;
        if (t < best) best = t;
        pl_config_free(cfg);
    }
    free(y);
    return best;
}

static void test_many_sources(const corpus *c) {
    const int64_t N = 40000;
    size_t at = 0;
    char *y = many_yaml(c, N, &at);
    double t0 = cpu_s();
    pl_config *cfg = NULL;
    CHECK_OK(pl_config_parse_string(y, at, "many", &cfg));
    double t_parse = cpu_s() - t0;
    double t_quarter = parse_cpu(c, N / 4, 2);
    pl_source *s0 = NULL;
    CHECK_OK(pl__config_open_source(cfg, 0, &s0));
    pl_source **src = malloc((size_t)N * sizeof *src);
    for (int64_t i = 0; i < N; i++) src[i] = s0; /* one file serves them all */
    pl_planner *p = NULL;
    CHECK_OK(pl_planner_create(cfg, src, N, &p));
    pl_plan *pl = NULL;
    CHECK_OK(pl_planner_next(p, &pl));
    pl_plan_free(pl);
    size_t n = 0;
    unsigned char *b = planner_blob(p, &n);
    t0 = cpu_s();
    CHECK_OK(pl_planner_set_state(p, b, n));
    double t_state = cpu_s() - t0;
    /* Linear work: 4x the sources cost about 4x the CPU time (quadratic work
     * 16x); state decoding took seconds when quadratic, milliseconds now.
     * CPU time of this thread, so a loaded machine does not fail the test. */
    fprintf(stderr, "many sources (%lld): parse %.3f s CPU (%lld sources: %.3f s), state "
            "decode %.3f s CPU\n", (long long)N, t_parse, (long long)(N / 4), t_quarter,
            t_state);
    CHECK(t_parse < 9.0 * t_quarter + 0.05);
    CHECK(t_state < 1.0);
    /* a duplicate name is still found, on the line of the second */
    memcpy(strstr(y, "prefix_000007"), "prefix_000003", 13);
    pl_config *dup = NULL;
    CHECK_EQ_I64(pl_config_parse_string(y, at, "many", &dup), PL_ECONFIG);
    CHECK(strstr(pl_config_errmsg(dup), "duplicate source name 'source_with_a_long_common_prefix_000003'") != NULL);
    CHECK(strstr(pl_config_errmsg(dup), "many:12:") != NULL);
    pl_config_free(dup);
    free(b);
    pl_planner_free(p);
    free(src);
    pl_source_free(s0);
    pl_config_free(cfg);
    free(y);
}

static void test_config_limits(const corpus *c) {
    /* 100k nested flow mappings: refused at the depth limit, quickly. */
    const int depth = 100000;
    size_t cap = (size_t)depth * 5 + 256;
    char *y = malloc(cap);
    size_t at = (size_t)snprintf(y, cap, "seed: ");
    for (int i = 0; i < depth; i++) at += (size_t)snprintf(y + at, cap - at, "{a: ");
    at += (size_t)snprintf(y + at, cap - at, "1");
    for (int i = 0; i < depth; i++) y[at++] = '}';
    y[at++] = '\n';
    double t0 = now_s();
    pl_config *cfg = NULL;
    CHECK_EQ_I64(pl_config_parse_string(y, at, "deep", &cfg), PL_ECONFIG);
    CHECK(strstr(pl_config_errmsg(cfg), "nesting deeper than the limit") != NULL);
    CHECK(now_s() - t0 < 2.0);
    pl_config_free(cfg);
    free(y);
    /* Depth 8 is fine (the walker then rejects the unknown shape itself). */
    char ok[1024];
    snprintf(ok, sizeof ok,
             "seq_length: 64\nglobal_batch_size: 4\nmicro_batch_size: 1\n"
             "sources:\n  - {name: a, type: megatron, path: %s/src0}\n", c->dir);
    CHECK_OK(pl_config_parse_string(ok, strlen(ok), "ok", &cfg));
    pl_config_free(cfg);
    /* Larger than 64 MiB: refused by size before parsing. */
    size_t big = ((size_t)64 << 20) + 1;
    char *z = malloc(big);
    memset(z, '#', big);
    CHECK_EQ_I64(pl_config_parse_string(z, big, "big", &cfg), PL_ECONFIG);
    CHECK(strstr(pl_config_errmsg(cfg), "above the limit") != NULL);
    pl_config_free(cfg);
    free(z);
    /* A config file above the limit (sparse, 1 GiB) is refused unread. */
    char path[600];
    snprintf(path, sizeof path, "%s/huge.yaml", c->dir);
    FILE *f = fopen(path, "wb");
    CHECK(f != NULL);
    if (f) fclose(f);
    CHECK(truncate(path, (off_t)1 << 30) == 0);
    t0 = now_s();
    CHECK_EQ_I64(pl_config_parse_file(path, &cfg), PL_ECONFIG);
    CHECK(strstr(pl_config_errmsg(cfg), "above the limit") != NULL);
    CHECK(now_s() - t0 < 0.5);
    pl_config_free(cfg);
    unlink(path);
}

/* on_error: skip opens a Megatron file whose .bin was truncated without its
 * trailing records, and counts them; on_error: fail refuses it. */
static void test_skip_truncated_bin(const corpus *c) {
    char prefix[512], bin[600], y[2048];
    snprintf(prefix, sizeof prefix, "%s/cut", c->dir);
    snprintf(bin, sizeof bin, "%s.bin", prefix);
    int64_t lens[10];
    for (int i = 0; i < 10; i++) lens[i] = 30;
    CHECK(plf_write_megatron(prefix, PL_DTYPE_INT32, 10, lens, 0) == 0);
    CHECK(truncate(bin, (7 * 30 + 11) * 4) == 0); /* documents 7.. past the end */
    for (int skip = 0; skip < 2; skip++) {
        snprintf(y, sizeof y,
                 "seq_length: 64\nglobal_batch_size: 2\nmicro_batch_size: 1\n"
                 "on_error: %s\nsources:\n  - {name: cut, type: megatron, path: %s}\n",
                 skip ? "skip" : "fail", prefix);
        pl_config *cfg = NULL;
        CHECK_OK(pl_config_parse_string(y, strlen(y), "t", &cfg));
        pl_source *s = NULL;
        int rc = pl__config_open_source(cfg, 0, &s);
        if (!skip) {
            CHECK_EQ_I64(rc, PL_ETRUNC);
            CHECK(strstr(pl_source_errmsg(s), "truncated") != NULL);
        } else {
            CHECK_OK(rc);
            CHECK_EQ_I64(pl_source_num_documents(s), 7);
            CHECK_EQ_I64(pl_source_num_skipped(s), 3);
            int64_t t = -1;
            CHECK_OK(pl_source_read(s, 6, 29, 1, &t, PL_DTYPE_INT64));
            CHECK_EQ_I64(t, 6 * 30 + 29);
            pl_planner *p = NULL;
            CHECK_OK(pl_planner_create(cfg, &s, 1, &p));
            CHECK_EQ_I64(p->src[0].skipped, 3);
            for (int step = 0; step < 20; step++) {
                pl_plan *pl = NULL;
                CHECK_OK(pl_planner_next(p, &pl));
                for (int64_t j = 0; pl && j < pl->n_chunks; j++) CHECK(pl->chunks[j].index < 7);
                pl_plan_free(pl);
            }
            pl_planner_free(p);
        }
        pl_source_free(s);
        pl_config_free(cfg);
    }
    pl_source_options o = {0};
    o.version = PL_SOURCE_OPTIONS_VERSION;
    o.type = PL_SOURCE_MEGATRON;
    o.path = prefix;
    pl_source *s = NULL;
    CHECK_EQ_I64(pl_source_open(&o, &s), PL_ETRUNC); /* the public open refuses */
    pl_source_free(s);
}

int main(void) {
    corpus c;
    corpus_make(&c, 64);
    test_state_step_bound(&c);
    test_train_steps_product(&c);
    test_state_documents(&c);
    test_plan_bounds(&c);
    test_hand_built_plan(&c);
    test_empty_bin(&c);
    test_many_sources(&c);
    test_config_limits(&c);
    test_skip_truncated_bin(&c);
    corpus_free(&c);
    TEST_END();
}
