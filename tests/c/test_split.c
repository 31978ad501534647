/*
 * Validation and test data (config `split`, valid_sources, pl_config_split):
 *  - split parses as megatron-core's --split (normalized, up to three parts)
 *    and bad values are PL_ECONFIG naming the key;
 *  - document ranges are megatron-core's (round half to even of the
 *    cumulative fractions);
 *  - training draws only from each source's train range;
 *  - an evaluation pass reads every document of the split exactly once, in
 *    index order within a source, then ends with PL_DONE; it is the same
 *    every time, with other thread counts, and whatever the training loader
 *    did; valid_sources are read whole.
 */
#include "corpus.h"
#include "planner/planner.h"

#include <math.h>

static const char *BASE = "seq_length: 64\nglobal_batch_size: 8\nmicro_batch_size: 2\n"
                          "topology: {dp: 2}\nseed: 11\n";

static void test_parse(void) {
    const char *bad[] = {
        "split: -1,2\n", "split: 1,2,3,4\n", "split: 0,0\n", "split: abc\n",
    };
    for (int i = 0; i < 4; i++) {
        char y[512];
        snprintf(y, sizeof y, "%ssources:\n  - {name: a, type: megatron, path: x}\n", bad[i]);
        pl_config *cfg = NULL;
        CHECK_EQ_I64(pl_config_parse_string(y, strlen(y), "t", &cfg), PL_ECONFIG);
        CHECK(strstr(pl_config_errmsg(cfg), "split") != NULL);
        pl_config_free(cfg);
    }
    /* split on a valid_sources entry, and an unknown key there */
    const char *y2 = "sources:\n  - {name: a, type: megatron, path: x}\n"
                     "valid_sources:\n  - {name: v, type: megatron, path: y, split: 1,1}\n";
    pl_config *cfg = NULL;
    CHECK_EQ_I64(pl_config_parse_string(y2, strlen(y2), "t", &cfg), PL_ECONFIG);
    CHECK(strstr(pl_config_errmsg(cfg), "valid_sources[0].split") != NULL);
    pl_config_free(cfg);
    /* normalized fractions, and no validation data */
    const char *y3 = "split: 969,30,1\nsources:\n  - {name: a, type: megatron, path: x}\n"
                     "  - {name: b, type: megatron, path: y, split: '100'}\n";
    CHECK_OK(pl_config_parse_string(y3, strlen(y3), "t", &cfg));
    CHECK(fabs(cfg->split[0] - 0.969) < 1e-12 && fabs(cfg->split[2] - 0.001) < 1e-12);
    CHECK(cfg->sources[1].has_split && cfg->sources[1].split[0] == 1.0);
    pl_config *v = NULL;
    CHECK_OK(pl_config_split(cfg, PL_SPLIT_VALID, &v));
    CHECK(v->sources[0].weight > 0 && v->sources[1].weight == 0); /* b: all train */
    CHECK_EQ_I64(pl_config_split(v, PL_SPLIT_VALID, &(pl_config *){NULL}), PL_EINVAL);
    pl_config_free(v);
    pl_config_free(cfg);
    const char *y4 = "sources:\n  - {name: a, type: megatron, path: x}\n";
    CHECK_OK(pl_config_parse_string(y4, strlen(y4), "t", &cfg));
    CHECK_EQ_I64(pl_config_split(cfg, PL_SPLIT_TEST, &v), PL_ECONFIG);
    CHECK(strstr(pl_config_errmsg(v), "no test data") != NULL);
    pl_config_free(v);
    pl_config_free(cfg);
}

/* megatron-core's bookends: [0, .969, .999, 1.0] * 1000 and its rounding. */
static void test_ranges(void) {
    const double f[3] = {0.969, 0.03, 0.001};
    int64_t lo, hi;
    pl__split_range(f, 0, 1000, &lo, &hi);
    CHECK(lo == 0 && hi == 969);
    pl__split_range(f, 1, 1000, &lo, &hi);
    CHECK(lo == 969 && hi == 999);
    pl__split_range(f, 2, 1000, &lo, &hi);
    CHECK(lo == 999 && hi == 1000);
    const double h[3] = {0.5, 0.25, 0.25}; /* 2.5 rounds to 2 (half to even) */
    pl__split_range(h, 0, 5, &lo, &hi);
    CHECK(lo == 0 && hi == 2);
    pl__split_range(h, 1, 5, &lo, &hi);
    CHECK(lo == 2 && hi == 4); /* 3.75 -> 4 */
}

typedef struct opened {
    pl_config *cfg;
    pl_source *src[NSRC];
    pl_planner *p;
} opened;

static void open_planner(opened *o, pl_config *cfg) {
    o->cfg = cfg;
    for (int s = 0; s < NSRC; s++) CHECK_OK(pl__config_open_source(cfg, s, &o->src[s]));
    CHECK_OK(pl_planner_create(cfg, o->src, NSRC, &o->p));
}

static void close_planner(opened *o) {
    pl_planner_free(o->p);
    for (int s = 0; s < NSRC; s++) pl_source_free(o->src[s]);
    pl_config_free(o->cfg);
}

static void range_of(const corpus *c, const pl_config *cfg, int s, int part,
                     int64_t *lo, int64_t *hi) {
    pl__split_range(pl__source_split(cfg, s), part, c->n[s], lo, hi);
}

static void test_train_range(corpus *c) {
    char y[1024];
    snprintf(y, sizeof y, "%ssplit: 80,10,10\n", BASE);
    opened o;
    open_planner(&o, corpus_config(c, y, NULL));
    int64_t hi[NSRC], lo;
    for (int s = 0; s < NSRC; s++) range_of(c, o.cfg, s, 0, &lo, &hi[s]);
    int64_t n = 0;
    for (int step = 0; step < 60; step++) { /* several epochs of the train range */
        pl_plan *pl = NULL;
        CHECK_OK(pl_planner_next(o.p, &pl));
        for (int64_t j = 0; j < pl->n_chunks; j++, n++)
            CHECK(pl->chunks[j].index < hi[pl->chunks[j].source]);
        pl_plan_free(pl);
    }
    CHECK(n > 100);
    close_planner(&o);
}

/* The pass over `part` of cfg (consumed: freed) by the planner: every
 * document of the split exactly once, whole, in index order per source. */
static int64_t check_pass(corpus *c, pl_config *cfg, int part, const int *whole,
                          int64_t *steps_out) {
    pl_config *e = NULL;
    CHECK_OK(pl_config_split(cfg, part, &e));
    opened o;
    open_planner(&o, e);
    int64_t *seen[NSRC], last[NSRC], lo[NSRC], hi[NSRC], tokens = 0, steps = 0;
    for (int s = 0; s < NSRC; s++) {
        seen[s] = calloc((size_t)c->n[s], sizeof(int64_t));
        last[s] = -1;
        if (whole && whole[s]) {
            lo[s] = 0;
            hi[s] = c->n[s];
        } else if (whole) {
            lo[s] = hi[s] = 0;
        } else {
            range_of(c, cfg, s, part, &lo[s], &hi[s]);
        }
    }
    for (;;) {
        pl_plan *pl = NULL;
        int rc = pl_planner_next(o.p, &pl);
        if (rc == PL_DONE) break;
        CHECK_OK(rc);
        if (rc) break;
        steps++;
        CHECK_EQ_I64(pl->n_sequences, 8);
        for (int64_t q = 0; q < pl->n_sequences; q++)
            for (int64_t j = pl->seq_offsets[q]; j < pl->seq_offsets[q + 1]; j++) {
                const pl_chunk *ch = &pl->chunks[j];
                int s = ch->source;
                CHECK(ch->index >= lo[s] && ch->index < hi[s]);
                if (ch->offset == 0 && o.cfg->packing == PL__PACK_CONCAT_CHUNK) {
                    /* draw order (which concat_chunk keeps) is index order */
                    CHECK(ch->index > last[s]);
                    last[s] = ch->index;
                }
                seen[s][ch->index] += ch->length;
                tokens += ch->length;
            }
        pl_plan_free(pl);
    }
    CHECK_EQ_I64(pl_planner_next(o.p, &(pl_plan *){NULL}), PL_DONE); /* stays done */
    for (int s = 0; s < NSRC; s++) {
        for (int64_t i = 0; i < c->n[s]; i++)
            CHECK_EQ_I64(seen[s][i], i >= lo[s] && i < hi[s] ? c->len[s][i] : 0);
        free(seen[s]);
    }
    close_planner(&o);
    pl_config_free(cfg);
    *steps_out = steps;
    return tokens;
}

static void test_pass(corpus *c) {
    char y[1024];
    snprintf(y, sizeof y, "%ssplit: 80,10,10\n", BASE);
    int64_t steps = 0, want = 0;
    pl_config *cfg = corpus_config(c, y, NULL);
    for (int s = 0; s < NSRC; s++) {
        int64_t lo, hi;
        range_of(c, cfg, s, 1, &lo, &hi);
        CHECK(hi > lo);
        for (int64_t i = lo; i < hi; i++) want += c->len[s][i];
    }
    CHECK_EQ_I64(check_pass(c, cfg, PL_SPLIT_VALID, NULL, &steps), want);
    CHECK(steps > 1);
    snprintf(y, sizeof y, "%ssplit: 80,10,10\npacking: concat_chunk\n", BASE);
    CHECK_EQ_I64(check_pass(c, corpus_config(c, y, NULL), PL_SPLIT_VALID, NULL, &steps), want);
    snprintf(y, sizeof y, "%ssplit: 80,10,10\nbalance: karmarkar_karp\n", BASE);
    CHECK_EQ_I64(check_pass(c, corpus_config(c, y, NULL), PL_SPLIT_VALID, NULL, &steps), want);
    snprintf(y, sizeof y, "%ssplit: 80,10,10\n", BASE);
    check_pass(c, corpus_config(c, y, NULL), PL_SPLIT_TEST, NULL, &steps);
    /* valid_sources: read whole; the train sources keep all their documents */
    char v[2048];
    snprintf(v, sizeof v,
             "%svalid_sources:\n  - {name: v1, type: megatron, path: %s/src1}\n", BASE,
             c->dir);
    const int whole[NSRC] = {0, 1, 0};
    /* the pass has one source; check_pass opens NSRC sources from the split
       config, so give it three entries with two of weight 0 */
    snprintf(v, sizeof v,
             "%svalid_sources:\n  - {name: v0, type: megatron, path: %s/src0, weight: 0}\n"
             "  - {name: v1, type: megatron, path: %s/src1}\n"
             "  - {name: v2, type: megatron, path: %s/src2, weight: 0}\n",
             BASE, c->dir, c->dir, c->dir);
    int64_t all1 = 0;
    for (int64_t i = 0; i < c->n[1]; i++) all1 += c->len[1][i];
    CHECK_EQ_I64(check_pass(c, corpus_config(c, v, NULL), PL_SPLIT_VALID, whole, &steps), all1);
}

static uint64_t batch_hash(const pl_batch *b) {
    size_t n = (size_t)(b->rows * b->cols), es = pl_dtype_size(b->dtype);
    uint64_t h = pl__hash64(b->input_ids, n * es, (uint64_t)b->step);
    h = pl__hash64(b->labels, n * es, h);
    h = pl__hash64(b->loss_mask, n * sizeof(float), h);
    h = pl__hash64(b->position_ids, n * sizeof(int64_t), h);
    return pl__hash64(b->cu_seqlens, (size_t)b->n_cu_seqlens * sizeof(int32_t), h);
}

/* The loader over a split config: both DP ranks until PL_DONE; the hash of
 * every batch and the tokens. */
static uint64_t loader_pass(pl_config *e, int threads, int64_t *tokens, int64_t *batches) {
    pl_loader_options o = {PL_LOADER_OPTIONS_VERSION, NULL, 0, threads, 3};
    pl_loader *l = NULL;
    int rc = pl_loader_create(e, &o, &l);
    if (rc) fprintf(stderr, "loader: %s\n", pl_loader_errmsg(l));
    CHECK_OK(rc);
    uint64_t h = 0;
    *tokens = *batches = 0;
    for (int done = 0; !done;) {
        for (int64_t r = 0; r < 2; r++) {
            const pl_batch *b = NULL;
            rc = pl_loader_next(l, r, &b);
            if (rc == PL_DONE) {
                done = 1;
                continue;
            }
            CHECK_OK(rc);
            if (rc) return 0;
            h = pl__hash64(&h, sizeof h, batch_hash(b));
            *tokens += b->tokens;
            ++*batches;
        }
    }
    pl_loader_free(l);
    return h;
}

static void test_loader_pass(corpus *c) {
    char y[1024];
    snprintf(y, sizeof y, "%ssplit: 80,10,10\n", BASE);
    pl_config *cfg = corpus_config(c, y, NULL), *e = NULL;
    CHECK_OK(pl_config_split(cfg, PL_SPLIT_VALID, &e));
    int64_t want = 0;
    for (int s = 0; s < NSRC; s++) {
        int64_t lo, hi;
        range_of(c, cfg, s, 1, &lo, &hi);
        for (int64_t i = lo; i < hi; i++) want += c->len[s][i];
    }
    int64_t t1, n1, t2, n2;
    uint64_t h1 = loader_pass(e, 1, &t1, &n1);
    /* a training loader that ran meanwhile changes nothing */
    pl_loader_options o = {PL_LOADER_OPTIONS_VERSION, NULL, 0, 2, 2};
    pl_loader *train = NULL;
    CHECK_OK(pl_loader_create(cfg, &o, &train));
    for (int k = 0; k < 10; k++) {
        const pl_batch *b = NULL;
        CHECK_OK(pl_loader_next(train, 0, &b));
        CHECK_OK(pl_loader_next(train, 1, &b));
    }
    uint64_t h2 = loader_pass(e, 3, &t2, &n2);
    pl_loader_free(train);
    CHECK_EQ_I64(t1, want);
    CHECK_EQ_I64(t2, want);
    CHECK(h1 == h2 && n1 == n2 && n1 > 2);
    /* eval steps: train_steps on the split config stops the pass early */
    CHECK_OK(pl_config_set(e, "train_steps", "1"));
    loader_pass(e, 2, &t2, &n2);
    CHECK_EQ_I64(n2, 2 * 2); /* 1 step x 2 micro-batches x 2 ranks */
    pl_config_free(e);
    pl_config_free(cfg);
}

int main(void) {
    corpus c;
    corpus_make(&c, 64);
    test_parse();
    test_ranges();
    test_train_range(&c);
    test_pass(&c);
    test_loader_pass(&c);
    corpus_free(&c);
    TEST_END();
}
