/*
 * The pipeline (pl_pipeline) both deployments drive:
 *  - packages (pl_package_encode of the planner's plan and stored-width
 *    reads) pushed into external loaders give exactly the embedded loader's
 *    batches, state blobs (at every consumed position) and statistics, for
 *    dp x cp x tp and dp x pp topologies;
 *  - the lag policy: a served rank that never consumes is dropped after
 *    max_lag_steps, gets PL_ELAG alone, and memory stays bounded over 1,000
 *    steps; a late starter within the limit is served from its position;
 *  - corrupt packages and state blobs are refused; state accessors;
 *  - a transport thread blocked in pl_loader_want_step gets the whole
 *    prefetch window while the consumer stands still (no lost wake-up);
 *  - pl_loader_want_steps grants bursts of steps with hysteresis, same
 *    batches.
 */
#include "corpus.h"
#include "runtime/runtime.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <time.h>

static uint64_t bhash(const pl_batch *b) {
    size_t n = (size_t)(b->rows * b->cols), es = pl_dtype_size(b->dtype);
    uint64_t h = pl__hash64(&b->step, 8, 1);
    h = pl__hash64(&b->fields, 4, h);
    if (b->input_ids) h = pl__hash64(b->input_ids, n * es, h);
    if (b->labels) h = pl__hash64(b->labels, n * es, h);
    if (b->loss_mask) h = pl__hash64(b->loss_mask, n * 4, h);
    if (b->position_ids) h = pl__hash64(b->position_ids, n * 8, h);
    if (b->cu_seqlens) h = pl__hash64(b->cu_seqlens, (size_t)b->n_cu_seqlens * 4, h);
    return pl__hash64(&b->max_seqlen, 8, h);
}

/* The package of (plan, dp_rank) with the state blob `st`, read at stored
 * width from the sources (what a data constructor does). */
static void *make_package(pl_source **src, const pl_plan *plan, int64_t dp, const void *st,
                          size_t st_len, size_t *len) {
    int64_t n = 0;
    CHECK_OK(pl_plan_step_reads(plan, dp, NULL, 0, &n));
    pl_read *reads = calloc((size_t)n + 1, sizeof *reads);
    pl_payload *pay = calloc((size_t)n + 1, sizeof *pay);
    CHECK_OK(pl_plan_step_reads(plan, dp, reads, n, &n));
    for (int64_t i = 0; i < n; i++) {
        pl_source *s = src[reads[i].source];
        size_t es = pl_dtype_size(pl_source_token_dtype(s));
        void *buf = malloc((size_t)reads[i].count * es + 1);
        CHECK_OK(pl_source_read_raw(s, &reads[i], 1, buf, (size_t)reads[i].count * es));
        pay[i] = (pl_payload){buf, pl_source_token_dtype(s), 0, reads[i].count};
    }
    CHECK_OK(pl_package_encode(plan, dp, st, st_len, pay, n, NULL, 0, len));
    void *out = malloc(*len);
    CHECK_OK(pl_package_encode(plan, dp, st, st_len, pay, n, out, *len, len));
    /* Too few payloads, or a short one, are refused. */
    size_t dummy = 0;
    if (n > 0) {
        CHECK_EQ_I64(pl_package_encode(plan, dp, st, st_len, pay, n - 1, NULL, 0, &dummy),
                     PL_EINVAL);
        pay[0].count--;
        CHECK_EQ_I64(pl_package_encode(plan, dp, st, st_len, pay, n, NULL, 0, &dummy),
                     PL_EINVAL);
        pay[0].count++;
    }
    for (int64_t i = 0; i < n; i++) free((void *)pay[i].data);
    free(pay);
    free(reads);
    return out;
}

static void *state_of(pl_loader *l, size_t *n) {
    CHECK_OK(pl_loader_get_state(l, NULL, 0, n));
    void *b = malloc(*n);
    CHECK_OK(pl_loader_get_state(l, b, *n, n));
    return b;
}

/* 1: packages carry no state blob; the test attaches them on demand (as the
 * Ray deployment does: pl_loader_position, pl_loader_attach_state). */
static int g_on_demand;

/* Whatever get_state / get_stats of an on-demand loader need: the blob of
 * the position's step. */
static void attach_if_missing(pl_loader *ext, void **blobs, const size_t *blen) {
    int64_t step = -1, mb = -1;
    int have = -1;
    CHECK_OK(pl_loader_position(ext, &step, &mb, &have));
    if (have) return;
    CHECK(g_on_demand);
    size_t n = 0;
    CHECK_EQ_I64(pl_loader_get_state(ext, NULL, 0, &n), PL_ESTATE);
    pl_loader_stats st = {.size = sizeof st};
    pl_source_summary sum[NSRC];
    CHECK_EQ_I64(pl_loader_get_stats(ext, &st, sum, NSRC), PL_ESTATE);
    CHECK(strstr(pl_loader_errmsg(ext), "attach") != NULL);
    if (step > 0) { /* a blob of another step's start, or mid-step, is not it */
        CHECK_OK(pl_loader_attach_state(ext, blobs[step - 1], blen[step - 1]));
        CHECK_OK(pl_loader_position(ext, NULL, NULL, &have));
        CHECK(!have);
    }
    CHECK_OK(pl_loader_attach_state(ext, blobs[step], blen[step]));
    CHECK_OK(pl_loader_position(ext, NULL, NULL, &have));
    CHECK(have);
}

/* Push whatever the external loader asks for (what a transport thread does). */
static void feed(pl_loader *ext, pl_source **src, pl_plan **plans, void **blobs,
                 const size_t *blen, int64_t steps, int64_t dp, int64_t *pushed) {
    int64_t want = -1;
    while (pl_loader_want_step(ext, 0, &want) == PL_OK) {
        CHECK_EQ_I64(want, *pushed);
        if (want == steps) {
            CHECK_OK(pl_loader_push_package(ext, blobs[want], blen[want]));
        } else {
            size_t n = 0;
            void *pkg = make_package(src, plans[want], dp, g_on_demand ? NULL : blobs[want],
                                     g_on_demand ? 0 : blen[want], &n);
            int64_t st = -1, d = -1;
            CHECK_OK(pl_package_inspect(pkg, n, &st, &d));
            CHECK(st == want && d == dp);
            CHECK_OK(pl_loader_push_package(ext, pkg, n));
            free(pkg);
        }
        (*pushed)++;
    }
}

/* A transport thread as the Ray client runs one: blocked in
 * pl_loader_want_step(-1), it pushes each step asked for (packages made
 * beforehand: the CHECK counters are not for threads; failures go to bad). */
typedef struct feeder {
    pl_loader *ext;
    void **pkgs;
    const size_t *lens;
    atomic_llong pushed;
    atomic_int bad;
} feeder;

static void *feeder_main(void *arg) {
    feeder *f = arg;
    int64_t want = -1;
    while (pl_loader_want_step(f->ext, -1, &want) == PL_OK) {
        if (pl_loader_push_package(f->ext, f->pkgs[want], f->lens[want]) != PL_OK)
            atomic_store(&f->bad, 1);
        atomic_fetch_add(&f->pushed, 1);
    }
    return NULL;
}

static void sleep_ms(long ms) {
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* The planner's first `steps` plans and the state blobs of steps 0..steps
 * (each step's start; the last is the state after train_steps). */
static void plan_steps(pl_planner *p, int64_t steps, pl_plan ***plans, void ***blobs,
                       size_t **blen) {
    *plans = calloc((size_t)steps + 1, sizeof **plans);
    *blobs = calloc((size_t)steps + 1, sizeof **blobs);
    *blen = calloc((size_t)steps + 1, sizeof **blen);
    for (int64_t s = 0; s <= steps; s++) {
        CHECK_OK(pl_planner_get_state(p, NULL, 0, &(*blen)[s]));
        (*blobs)[s] = malloc((*blen)[s]);
        CHECK_OK(pl_planner_get_state(p, (*blobs)[s], (*blen)[s], &(*blen)[s]));
        if (s < steps) CHECK_OK(pl_planner_next(p, &(*plans)[s]));
    }
}

static void free_steps(int64_t steps, pl_plan **plans, void **blobs, size_t *blen) {
    for (int64_t s = 0; s <= steps; s++) {
        pl_plan_free(plans[s]);
        free(blobs[s]);
    }
    free(plans);
    free(blobs);
    free(blen);
}

/* External loaders, one per DP rank's ranks, fed packages: same as embedded. */
static void test_packages_equal_embedded(corpus *c, const char *extra) {
    pl_config *cfg = corpus_config(c, extra, NULL);
    int64_t world = pl_config_world_size(cfg), dp = cfg->topology.dp;
    int64_t nmb = cfg->global_batch_size / (dp * cfg->micro_batch_size);
    int64_t steps = cfg->train_steps;
    pl_source *src[NSRC];
    for (int s = 0; s < NSRC; s++) CHECK_OK(pl__config_open_source(cfg, s, &src[s]));
    pl_planner *p = NULL;
    CHECK_OK(pl_planner_create(cfg, src, NSRC, &p));
    pl_plan **plans = NULL;
    void **blobs = NULL;
    size_t *blen = NULL;
    plan_steps(p, steps, &plans, &blobs, &blen); /* plans and state blobs */
    for (int64_t r = 0; r < world; r++) {
        pl_rank_info ri;
        CHECK_OK(pl_config_rank_info(cfg, r, &ri));
        pl_loader_options eo = {PL_LOADER_OPTIONS_VERSION, &r, 1, 2, 3, 0, 0, 0};
        pl_loader *emb = NULL, *ext = NULL;
        CHECK_OK(pl_loader_create(cfg, &eo, &emb));
        eo.external = 1;
        eo.unit = 1;
        CHECK_OK(pl_loader_create(cfg, &eo, &ext));
        CHECK_OK(pl_loader_set_state(ext, blobs[0], blen[0]));
        int64_t pushed = 0;
        for (int64_t k = 0; k <= steps * nmb; k++) {
            feed(ext, src, plans, blobs, blen, steps, ri.dp_rank, &pushed);
            const pl_batch *a = NULL, *b = NULL;
            int ra = pl_loader_next(emb, r, &a);
            int rb = pl_loader_next(ext, r, &b);
            CHECK_EQ_I64(ra, rb);
            if (ra == PL_DONE) break;
            CHECK(a && b && bhash(a) == bhash(b));
            if (k % 3 == 0) { /* states equal byte for byte at consumed positions */
                feed(ext, src, plans, blobs, blen, steps, ri.dp_rank, &pushed);
                attach_if_missing(ext, blobs, blen);
                size_t na = 0, nb = 0;
                void *sa = state_of(emb, &na), *sb = state_of(ext, &nb);
                CHECK(na == nb && memcmp(sa, sb, na) == 0);
                free(sa);
                free(sb);
            }
        }
        pl_loader_stats sa = {.size = sizeof sa}, sb = {.size = sizeof sb};
        pl_source_summary suma[NSRC], sumb[NSRC];
        attach_if_missing(ext, blobs, blen);
        CHECK_OK(pl_loader_get_stats(emb, &sa, suma, NSRC));
        CHECK_OK(pl_loader_get_stats(ext, &sb, sumb, NSRC));
        CHECK_EQ_I64(sa.steps, steps);
        CHECK_EQ_I64(sa.steps, sb.steps);
        CHECK_EQ_I64(sa.tokens, sb.tokens);
        CHECK_EQ_I64(sa.padding_tokens, sb.padding_tokens);
        CHECK(sa.max_over_mean == sb.max_over_mean);
        for (int64_t s = 0; s < sa.n_sources; s++) {
            CHECK_EQ_I64(sa.sources[s].tokens, sb.sources[s].tokens);
            CHECK_EQ_I64(sa.sources[s].documents, sb.sources[s].documents);
        }
        pl_loader_free(emb);
        pl_loader_free(ext);
    }
    /* A corrupt package is refused with a message; the loader goes on. */
    {
        int64_t r0 = 0;
        pl_loader_options eo = {PL_LOADER_OPTIONS_VERSION, &r0, 1, 1, 2, 1, 1, 0};
        pl_loader *ext = NULL;
        CHECK_OK(pl_loader_create(cfg, &eo, &ext));
        CHECK_OK(pl_loader_set_state(ext, blobs[0], blen[0]));
        int64_t want = -1;
        CHECK_OK(pl_loader_want_step(ext, 1000, &want));
        size_t n = 0;
        unsigned char *pkg = make_package(src, plans[0], 0, blobs[0], blen[0], &n);
        pkg[n / 2] ^= 0x40;
        CHECK_EQ_I64(pl_loader_push_package(ext, pkg, n), PL_EINVAL);
        CHECK(strstr(pl_loader_errmsg(ext), "package") != NULL);
        pkg[n / 2] ^= 0x40;
        CHECK_OK(pl_loader_push_package(ext, pkg, n));
        free(pkg);
        pl_loader_free(ext);
    }
    /* A consumer that stands still (a trainer between steps) gets its whole
     * window: the worker taking the last planned unit wakes the transport
     * thread blocked in want_step (it slept until the consumer moved, 1-3
     * steps short), and nothing past the window is asked for. */
    {
        int64_t r0 = 0;
        pl_rank_info ri;
        CHECK_OK(pl_config_rank_info(cfg, r0, &ri));
        /* a unit is a step; window: ceil(2 nmb / nmb) + 1 = 3 units */
        pl_loader_options eo = {PL_LOADER_OPTIONS_VERSION, &r0, 1, 1, (int)(2 * nmb), 1, nmb, 0};
        pl_loader *ext = NULL;
        CHECK_OK(pl_loader_create(cfg, &eo, &ext));
        CHECK_OK(pl_loader_set_state(ext, blobs[0], blen[0]));
        void **pkgs = calloc((size_t)steps + 1, sizeof *pkgs);
        size_t *lens = calloc((size_t)steps + 1, sizeof *lens);
        for (int64_t s = 0; s < steps; s++)
            pkgs[s] = make_package(src, plans[s], ri.dp_rank, NULL, 0, &lens[s]);
        pkgs[steps] = blobs[steps]; /* the step train_steps: its state */
        lens[steps] = blen[steps];
        feeder f = {ext, pkgs, lens, 0, 0};
        pthread_t th;
        CHECK(pthread_create(&th, NULL, feeder_main, &f) == 0);
        for (int64_t k = 0; k < nmb; k++) { /* step 0, then the consumer stands */
            const pl_batch *b = NULL;
            CHECK_OK(pl_loader_next(ext, r0, &b));
        }
        const long long want = 1 + 3; /* step 0 consumed, units 1..3 */
        for (int t = 0; t < 1000 && atomic_load(&f.pushed) < want; t++) sleep_ms(5);
        sleep_ms(100);
        CHECK_EQ_I64(atomic_load(&f.pushed), want);
        pl_loader_stop(ext); /* wakes the thread: PL_ECLOSED */
        CHECK(pthread_join(th, NULL) == 0);
        CHECK(atomic_load(&f.bad) == 0);
        for (int64_t s = 0; s < steps; s++) free(pkgs[s]);
        free(pkgs);
        free(lens);
        pl_loader_free(ext);
    }
    free_steps(steps, plans, blobs, blen);
    pl_planner_free(p);
    for (int s = 0; s < NSRC; s++) pl_source_free(src[s]);
    pl_config_free(cfg);
}

/* Packed copies of state blobs (pl_state_pack / pl_state_unpack). */
static void test_state_pack(corpus *c) {
    pl_config *cfg = corpus_config(c, "seq_length: 64\nglobal_batch_size: 8\n"
                                      "micro_batch_size: 2\ntrain_steps: 4", NULL);
    pl_source *src[NSRC];
    for (int s = 0; s < NSRC; s++) CHECK_OK(pl__config_open_source(cfg, s, &src[s]));
    pl_planner *p = NULL;
    CHECK_OK(pl_planner_create(cfg, src, NSRC, &p));
    for (int k = 0; k < 3; k++) {
        pl_plan *plan = NULL;
        CHECK_OK(pl_planner_next(p, &plan));
        pl_plan_free(plan);
    }
    size_t n = 0, bound = 0, zn = 0, back = 0;
    CHECK_OK(pl_planner_get_state(p, NULL, 0, &n));
    unsigned char *blob = malloc(n), *out = malloc(n);
    CHECK_OK(pl_planner_get_state(p, blob, n, &n));
    CHECK_OK(pl_state_pack(blob, n, NULL, 0, &bound));
    unsigned char *z = malloc(bound);
    CHECK_OK(pl_state_pack(blob, n, z, bound, &zn));
    CHECK(zn < n && memcmp(z, "PLSZ", 4) == 0);
    CHECK_OK(pl_state_unpack(z, zn, NULL, 0, &back));
    CHECK_EQ_I64((int64_t)back, (int64_t)n);
    CHECK_OK(pl_state_unpack(z, zn, out, n, &back));
    CHECK(back == n && memcmp(out, blob, n) == 0);
    /* Too small a buffer, truncated, damaged, another magic, not a blob. */
    CHECK_EQ_I64(pl_state_unpack(z, zn, out, n - 1, &back), PL_EINVAL);
    CHECK_EQ_I64(pl_state_unpack(z, zn - 3, out, n, &back), PL_ESTATE);
    CHECK_EQ_I64(pl_state_unpack(z, 8, out, n, &back), PL_ESTATE);
    z[zn / 2] ^= 0x10;
    CHECK_EQ_I64(pl_state_unpack(z, zn, out, n, &back), PL_ESTATE);
    z[zn / 2] ^= 0x10;
    z[0] = 'X';
    CHECK_EQ_I64(pl_state_unpack(z, zn, out, n, &back), PL_ESTATE);
    blob[n / 2] ^= 1; /* CRC no longer matches */
    CHECK_EQ_I64(pl_state_pack(blob, n, z, bound, &zn), PL_ESTATE);
    free(z);
    free(out);
    free(blob);
    pl_planner_free(p);
    for (int s = 0; s < NSRC; s++) pl_source_free(src[s]);
    pl_config_free(cfg);
}

static int64_t g_items;
static void count_release(void *item, void *ctx) {
    (void)ctx;
    free(item);
    g_items--;
}

/* Do every piece of work the pipeline has now (a driver in one thread): plan
 * with the real planner, "build" an item holding the micro-batch number. */
static void drive(pl_pipeline *pipe, pl_planner *p) {
    pl_work w;
    while (pl_pipeline_get_work(pipe, PL_WORK_PLAN | PL_WORK_BUILD, 0, &w) == PL_OK) {
        if (w.kind == PL_WORK_PLAN) {
            void *blob = NULL;
            size_t bl = 0;
            CHECK_OK(pl__state_encode(p, 0, &blob, &bl));
            pl_plan *pl = NULL;
            CHECK_OK(pl_planner_next(p, &pl));
            CHECK_OK(pl_pipeline_add_step(pipe, w.step, pl, blob, bl, NULL, NULL));
            free(blob);
        } else {
            int64_t *item = malloc(sizeof *item);
            *item = w.step * 2 + w.micro_batch;
            g_items++;
            int64_t tok[2] = {1, 1}, pad[2] = {0, 0};
            CHECK_OK(pl_pipeline_complete(pipe, &w, PL_OK, NULL, item, tok, pad));
        }
    }
}

/* Drive a pipeline by hand: ranks 0 and 1 (TP peers); rank 1 never consumes.
 * Memory stays bounded over 1,000 steps; rank 1 gets PL_ELAG alone. */
static void test_lag_policy(corpus *c) {
    pl_config *cfg = corpus_config(c, "seq_length: 32\nglobal_batch_size: 4\nmicro_batch_size: 2\n"
                                      "topology: {dp: 1, tp: 2}\nmax_lag_steps: 5", NULL);
    pl_source *src[NSRC];
    for (int s = 0; s < NSRC; s++) CHECK_OK(pl__config_open_source(cfg, s, &src[s]));
    pl_planner *p = NULL;
    CHECK_OK(pl_planner_create(cfg, src, NSRC, &p));
    pl_pipeline_options o = {PL_PIPELINE_OPTIONS_VERSION, NULL, 0, 1, 1, 2, 0,
                             count_release, NULL};
    pl_pipeline *pipe = NULL;
    CHECK_OK(pl_pipeline_create(cfg, &o, &pipe));
    size_t n = 0;
    CHECK_OK(pl_planner_get_state(p, NULL, 0, &n));
    void *b0 = malloc(n);
    CHECK_OK(pl_planner_get_state(p, b0, n, &n));
    CHECK_OK(pl_pipeline_reset(pipe, b0, n, NULL, 0));
    size_t peak = 0, first = 0;
    int64_t peak_items = 0;
    char err[512];
    int64_t late_k = -1;
    for (int64_t k = 0; k < 2000; k++) { /* nmb = 2: 1,000 steps */
      pl_pipeline_item it;
      for (;;) { /* one thread: drive, then consume without waiting */
        drive(pipe, p);
        int rc = pl_pipeline_next(pipe, 0, 1, 0, &it, err, sizeof err);
        if (rc == PL_ETIMEDOUT) continue;
        CHECK_OK(rc);
        break;
      }
        CHECK_EQ_I64(*(int64_t *)it.item, k);
        if (k == 6) { /* a late starter within the limit is served from its start */
            CHECK_OK(pl_pipeline_next(pipe, 1, 1, 1000, &it, err, sizeof err));
            CHECK_EQ_I64(*(int64_t *)it.item, 0);
            late_k = 1;
        }
        size_t sz = pl_pipeline_sizeof(pipe);
        if (k == 100) first = sz;
        if (sz > peak) peak = sz;
        if (g_items > peak_items) peak_items = g_items;
    }
    (void)late_k;
    /* Items: at most the ring (the lag window of 5 steps * 2 micro-batches,
       prefetch 2, and 2 slots). */
    CHECK(peak_items <= 5 * 2 + 2 + 2);
    CHECK(peak_items >= 5 * 2); /* the late starter did hold units back */
    CHECK(peak <= first + 4096);
    pl_pipeline_item it;
    CHECK_EQ_I64(pl_pipeline_next(pipe, 1, 1, 0, &it, err, sizeof err), PL_ELAG);
    CHECK(strstr(err, "rank 1") && strstr(err, "max_lag_steps=5"));
    /* rank 0 goes on */
    drive(pipe, p);
    CHECK_OK(pl_pipeline_next(pipe, 0, 1, 1000, &it, err, sizeof err));
    CHECK_EQ_I64(*(int64_t *)it.item, 2000);
    /* The state is rank 0's (rank 1 was dropped). */
    size_t sl = 0;
    CHECK_OK(pl_pipeline_get_state(pipe, 1000, NULL, 0, &sl, err, sizeof err));
    void *st = malloc(sl);
    CHECK_OK(pl_pipeline_get_state(pipe, 1000, st, sl, &sl, err, sizeof err));
    pl_state_info si;
    CHECK_OK(pl_state_inspect(st, sl, &si));
    CHECK_EQ_I64(si.step, 1000);
    CHECK_EQ_I64(si.micro_batch, 1);
    CHECK_EQ_I64(si.n_sources, NSRC);
    pl_state_source_info ss;
    CHECK_OK(pl_state_source(st, sl, 0, &ss));
    CHECK(ss.drawn_tokens > 0 && ss.name_len > 0);
    CHECK_EQ_I64(pl_state_source(st, sl, NSRC, &ss), PL_ERANGE);
    /* Retarget, and refuse a corrupt blob. */
    CHECK_OK(pl_state_retarget(st, sl, 0, 3, st, sl, &sl));
    CHECK_OK(pl_state_inspect(st, sl, &si));
    CHECK(si.micro_batch == 0 && si.dp == 3);
    ((unsigned char *)st)[sl / 2] ^= 1;
    CHECK_EQ_I64(pl_state_inspect(st, sl, &si), PL_ESTATE);
    CHECK_EQ_I64(pl_pipeline_reset(pipe, st, sl, err, sizeof err), PL_ESTATE);
    free(st);
    free(b0);
    pl_pipeline_free(pipe);
    CHECK_EQ_I64(g_items, 0); /* every item released exactly once */
    pl_planner_free(p);
    for (int s = 0; s < NSRC; s++) pl_source_free(src[s]);
    pl_config_free(cfg);
}

/* The embedded loader: a served rank that never consumes is dropped and the
 * other is not held back; memory (pool) stays bounded. */
static void test_loader_never_consumes(corpus *c) {
    pl_config *cfg = corpus_config(c, "seq_length: 32\nglobal_batch_size: 4\nmicro_batch_size: 1\n"
                                      "topology: {dp: 1, pp: 3}\nmax_lag_steps: 3\ntrain_steps: 1000", NULL);
    pl_loader *l = NULL;
    CHECK_OK(pl_loader_create(cfg, NULL, &l));
    /* ranks 0 and 2 (first and last stage) consume; 1 (middle) never does */
    int64_t k = 0;
    for (;; k++) {
        const pl_batch *a = NULL, *b = NULL;
        int ra = pl_loader_next(l, 0, &a);
        if (ra == PL_DONE) break;
        CHECK_OK(ra);
        CHECK_OK(pl_loader_next(l, 2, &b));
        CHECK(a->fields != b->fields);
    }
    CHECK_EQ_I64(k, 4000);
    const pl_batch *m = NULL;
    CHECK_EQ_I64(pl_loader_next(l, 1, &m), PL_ELAG);
    pl_loader_stats st = {.size = sizeof st};
    pl_source_summary sums[NSRC];
    CHECK_OK(pl_loader_get_stats(l, &st, sums, NSRC));
    CHECK_EQ_I64(st.steps, 1000);
    pl_loader_free(l);
    pl_config_free(cfg);
}

/* Planning ahead (pl__pipeline_plan_ahead, the embedded loader with more than
 * one worker): step s+1 is handed out for planning before step s's units are
 * built, never more than one step past the units being built, and the
 * consumed items are those of a pipeline without it. */
static void test_plan_ahead(corpus *c) {
    pl_config *cfg = corpus_config(c, "seq_length: 32\nglobal_batch_size: 4\nmicro_batch_size: 1\n"
                                      "topology: {dp: 1}\ntrain_steps: 40", NULL);
    for (int ahead = 0; ahead <= 1; ahead++) {
        pl_source *src[NSRC];
        for (int s = 0; s < NSRC; s++) CHECK_OK(pl__config_open_source(cfg, s, &src[s]));
        pl_planner *p = NULL;
        CHECK_OK(pl_planner_create(cfg, src, NSRC, &p));
        /* unit 2: two units per step of 4 micro-batches; prefetch 2 */
        pl_pipeline_options o = {PL_PIPELINE_OPTIONS_VERSION, NULL, 0, 1, 2, 2, 0,
                                 count_release, NULL};
        pl_pipeline *pipe = NULL;
        CHECK_OK(pl_pipeline_create(cfg, &o, &pipe));
        pl__pipeline_plan_ahead(pipe, ahead);
        size_t n = 0;
        CHECK_OK(pl_planner_get_state(p, NULL, 0, &n));
        void *b0 = malloc(n);
        CHECK_OK(pl_planner_get_state(p, b0, n, &n));
        CHECK_OK(pl_pipeline_reset(pipe, b0, n, NULL, 0));
        char err[512];
        int64_t planned = 0, k = 0;
        for (;;) {
            pl_work w;
            int rc = pl_pipeline_get_work(pipe, PL_WORK_PLAN | PL_WORK_BUILD, 0, &w);
            if (rc == PL_DONE || rc == PL_ETIMEDOUT) { /* nothing to do: consume */
                pl_pipeline_item it;
                rc = pl_pipeline_next(pipe, 0, 1, 0, &it, err, sizeof err);
                if (rc == PL_DONE) break;
                CHECK_OK(rc);
                CHECK_EQ_I64(*(int64_t *)it.item + it.index, k);
                k++;
                continue;
            }
            CHECK_OK(rc);
            if (w.kind == PL_WORK_PLAN) {
                CHECK_EQ_I64(w.step, planned);
                void *blob = NULL;
                size_t bl = 0;
                CHECK_OK(pl__state_encode(p, 0, &blob, &bl));
                pl_plan *pl = NULL;
                if (w.step < 40) CHECK_OK(pl_planner_next(p, &pl));
                CHECK_OK(pl_pipeline_add_step(pipe, w.step, pl, blob, bl, NULL, NULL));
                free(blob);
                planned++;
            } else {
                /* With planning ahead, a unit of step s is built only once step
                   s+1 is planned (or s is the last); without, never ahead. */
                if (ahead) CHECK(planned >= (w.step + 2 < 41 ? w.step + 2 : 41));
                else CHECK(planned <= w.step + 2);
                CHECK(planned <= w.step + 2 + ahead);
                int64_t *item = malloc(sizeof *item);
                *item = w.step * 4 + w.micro_batch;
                g_items++;
                int64_t tok[2] = {1, 1}, pad[2] = {0, 0};
                CHECK_OK(pl_pipeline_complete(pipe, &w, PL_OK, NULL, item, tok, pad));
            }
        }
        CHECK_EQ_I64(k, 160);
        CHECK_EQ_I64(planned, 41); /* steps 0..39 and the end state */
        pl_pipeline_free(pipe);
        free(b0);
        pl_planner_free(p);
        for (int s = 0; s < NSRC; s++) pl_source_free(src[s]);
    }
    pl_config_free(cfg);
}

/* Held wake-ups (pl__pipeline_defer_wakes): a driver thread that holds every
 * consumer wake-up it may (units far below the limit) must still let the
 * consumer through, in order, each time it runs out of work: the consumer's
 * waits are bounded (10 s) so a wake-up never sent fails here, not hangs. */
typedef struct held_ctx {
    pl_pipeline *pipe;
    pl_planner *planner;
    int failed; /* the driver's own failures (CHECK is the main thread's) */
} held_ctx;

static void *held_driver(void *arg) {
    held_ctx *h = arg;
    pl_work w;
    while (pl_pipeline_get_work(h->pipe, PL_WORK_PLAN | PL_WORK_BUILD, -1, &w) == PL_OK) {
        if (w.kind == PL_WORK_PLAN) {
            void *blob = NULL;
            size_t bl = 0;
            if (pl__state_encode(h->planner, 0, &blob, &bl)) h->failed++;
            pl_plan *pl = NULL;
            if (w.step < 40 && pl_planner_next(h->planner, &pl)) h->failed++;
            if (pl_pipeline_add_step(h->pipe, w.step, pl, blob, bl, NULL, NULL)) h->failed++;
            free(blob);
        } else {
            /* ~20 us of work (under the limit of a cheap unit): the consumer
               catches up and waits for nearly every unit */
            struct timespec t0, t1;
            clock_gettime(CLOCK_MONOTONIC, &t0);
            do clock_gettime(CLOCK_MONOTONIC, &t1);
            while ((t1.tv_sec - t0.tv_sec) * 1000000000L + (t1.tv_nsec - t0.tv_nsec) < 20000);
            int64_t *item = malloc(sizeof *item);
            *item = w.step * 16 + w.micro_batch;
            __atomic_add_fetch(&g_items, 1, __ATOMIC_RELAXED);
            int64_t tok[2] = {1, 1}, pad[2] = {0, 0};
            if (pl_pipeline_complete(h->pipe, &w, PL_OK, NULL, item, tok, pad)) h->failed++;
        }
    }
    return NULL;
}

static void held_release(void *item, void *ctx) {
    (void)ctx;
    free(item);
    __atomic_sub_fetch(&g_items, 1, __ATOMIC_RELAXED);
}

static void test_held_wakeups(corpus *c) {
    pl_config *cfg = corpus_config(c, "seq_length: 32\nglobal_batch_size: 16\nmicro_batch_size: 1\n"
                                      "topology: {dp: 1}\ntrain_steps: 40", NULL);
    for (int64_t defer = 0; defer <= 1000; defer += 1000) {
        for (int64_t prefetch = 1; prefetch <= 8; prefetch *= 8) {
            pl_source *src[NSRC];
            for (int s = 0; s < NSRC; s++) CHECK_OK(pl__config_open_source(cfg, s, &src[s]));
            pl_planner *p = NULL;
            CHECK_OK(pl_planner_create(cfg, src, NSRC, &p));
            /* unit 2: eight units per step of 16 micro-batches, so that the
               driver runs out of work between two plans */
            pl_pipeline_options o = {PL_PIPELINE_OPTIONS_VERSION, NULL, 0, prefetch, 2, 2, 0,
                                     held_release, NULL};
            pl_pipeline *pipe = NULL;
            CHECK_OK(pl_pipeline_create(cfg, &o, &pipe));
            pl__pipeline_defer_wakes(pipe, defer);
            size_t n = 0;
            CHECK_OK(pl_planner_get_state(p, NULL, 0, &n));
            void *b0 = malloc(n);
            CHECK_OK(pl_planner_get_state(p, b0, n, &n));
            CHECK_OK(pl_pipeline_reset(pipe, b0, n, NULL, 0));
            held_ctx h = {pipe, p, 0};
            pthread_t t;
            CHECK(pthread_create(&t, NULL, held_driver, &h) == 0);
            char err[512];
            int64_t k = 0;
            for (;;) {
                pl_pipeline_item it;
                int rc = pl_pipeline_next(pipe, 0, 1, 10000, &it, err, sizeof err);
                if (rc == PL_DONE) break;
                CHECK_OK(rc);
                if (rc) break;
                CHECK_EQ_I64(*(int64_t *)it.item + it.index, k);
                k++;
            }
            CHECK_EQ_I64(k, 640);
            pl_pipeline_close(pipe);
            pthread_join(t, NULL);
            CHECK_EQ_I64(h.failed, 0);
            pl_pipeline_free(pipe);
            CHECK_EQ_I64(__atomic_load_n(&g_items, __ATOMIC_RELAXED), 0);
            free(b0);
            pl_planner_free(p);
            for (int s = 0; s < NSRC; s++) pl_source_free(src[s]);
        }
    }
    pl_config_free(cfg);
}

/* A transport that moves steps in bursts (pl_loader_want_steps, as the Ray
 * Client runs it): granted steps come in order from the next one, up to
 * `ahead` past the step built next, and the next grant only once no more
 * than `low` stand ahead of it; batches, states and statistics are the
 * embedded loader's; bad arguments are refused. */
typedef struct burst_feeder {
    pl_loader *ext;
    void **pkgs;
    const size_t *lens;
    int64_t ahead, low;
    atomic_llong pushed, grants;
    atomic_int bad;
} burst_feeder;

static void *burst_feeder_main(void *arg) {
    burst_feeder *f = arg;
    int64_t first = -1, count = -1;
    while (pl_loader_want_steps(f->ext, -1, f->ahead, f->low, &first, &count) == PL_OK) {
        if (first != atomic_load(&f->pushed) || count < 1) atomic_store(&f->bad, 1);
        atomic_fetch_add(&f->grants, 1);
        for (int64_t s = first; s < first + count; s++) {
            if (pl_loader_push_package(f->ext, f->pkgs[s], f->lens[s]) != PL_OK)
                atomic_store(&f->bad, 1);
            atomic_fetch_add(&f->pushed, 1);
        }
    }
    return NULL;
}

static void test_want_steps_bursts(corpus *c) {
    const int64_t steps = 30;
    pl_config *cfg = corpus_config(c, "seq_length: 64\nglobal_batch_size: 8\nmicro_batch_size: 2\n"
                                      "topology: {dp: 2}\ntrain_steps: 30\nseed: 3", NULL);
    int64_t nmb = cfg->global_batch_size / (cfg->topology.dp * cfg->micro_batch_size);
    pl_source *src[NSRC];
    for (int s = 0; s < NSRC; s++) CHECK_OK(pl__config_open_source(cfg, s, &src[s]));
    pl_planner *p = NULL;
    CHECK_OK(pl_planner_create(cfg, src, NSRC, &p));
    pl_plan **plans = NULL;
    void **blobs = NULL;
    size_t *blen = NULL;
    plan_steps(p, steps, &plans, &blobs, &blen);
    int64_t r1 = 1; /* DP rank 1 */
    void **pkgs = calloc((size_t)steps + 1, sizeof *pkgs);
    size_t *lens = calloc((size_t)steps + 1, sizeof *lens);
    for (int64_t s = 0; s < steps; s++)
        pkgs[s] = make_package(src, plans[s], 1, NULL, 0, &lens[s]);
    pkgs[steps] = blobs[steps]; /* the step train_steps: its state */
    lens[steps] = blen[steps];

    /* Bad arguments; an embedded loader has no transport. */
    {
        pl_loader_options eo = {PL_LOADER_OPTIONS_VERSION, &r1, 1, 1, 2, 0, 0, 0};
        pl_loader *emb = NULL, *ext = NULL;
        CHECK_OK(pl_loader_create(cfg, &eo, &emb));
        int64_t first = -1, count = -1;
        CHECK_EQ_I64(pl_loader_want_steps(emb, 0, 4, 2, &first, &count), PL_EINVAL);
        eo.external = 1;
        CHECK_OK(pl_loader_create(cfg, &eo, &ext));
        CHECK_OK(pl_loader_set_state(ext, blobs[0], blen[0]));
        CHECK_EQ_I64(pl_loader_want_steps(ext, 0, 0, 0, &first, &count), PL_EINVAL);
        CHECK_EQ_I64(pl_loader_want_steps(ext, 0, 2, 3, &first, &count), PL_EINVAL);
        CHECK_EQ_I64(pl_loader_want_steps(ext, 0, 2, -1, &first, &count), PL_EINVAL);
        CHECK(strstr(pl_loader_errmsg(ext), "ahead") != NULL);
        CHECK_EQ_I64(first, -1);
        /* Stopped in the middle of a burst (one of its steps pushed), then
           standing at a state again: grants start over from that state. */
        CHECK_OK(pl_loader_want_steps(ext, 1000, 4, 2, &first, &count));
        CHECK(first == 0 && count >= 2);
        CHECK_OK(pl_loader_push_package(ext, pkgs[0], lens[0]));
        pl_loader_stop(ext);
        CHECK_EQ_I64(pl_loader_want_steps(ext, 0, 4, 2, &first, &count), PL_ECLOSED);
        CHECK_OK(pl_loader_set_state(ext, blobs[2], blen[2]));
        CHECK_OK(pl_loader_want_steps(ext, 1000, 4, 2, &first, &count));
        CHECK(first == 2 && count >= 1);
        for (int64_t s = first; s < first + count; s++)
            CHECK_OK(pl_loader_push_package(ext, pkgs[s], lens[s]));
        const pl_batch *b = NULL;
        CHECK_OK(pl_loader_next(ext, r1, &b));
        CHECK_EQ_I64(b->step, 2);
        pl_loader_free(emb);
        pl_loader_free(ext);
    }

    /* Same batches, states and statistics as the embedded loader, pushing
     * whatever is granted whenever the consumer moves. */
    {
        pl_loader_options eo = {PL_LOADER_OPTIONS_VERSION, &r1, 1, 2, 3, 0, 0, 0};
        pl_loader *emb = NULL, *ext = NULL;
        CHECK_OK(pl_loader_create(cfg, &eo, &emb));
        eo.external = 1;
        CHECK_OK(pl_loader_create(cfg, &eo, &ext));
        CHECK_OK(pl_loader_set_state(ext, blobs[0], blen[0]));
        int64_t pushed = 0, grants = 0, consumed = 0;
        for (int64_t k = 0; k <= steps * nmb; k++) {
            int64_t first = -1, count = -1;
            while (pl_loader_want_steps(ext, 0, 5, 2, &first, &count) == PL_OK) {
                CHECK_EQ_I64(first, pushed);
                CHECK(count >= 1 && first + count - 1 <= steps);
                /* never more than `ahead` past the step built next, which is
                   within the window (prefetch 3 micro-batches) of the consumer */
                CHECK(first + count - 1 <= consumed + 4 + 5);
                grants++;
                for (int64_t s = first; s < first + count; s++)
                    CHECK_OK(pl_loader_push_package(ext, pkgs[s], lens[s]));
                pushed += count;
            }
            const pl_batch *a = NULL, *b = NULL;
            int ra = pl_loader_next(emb, r1, &a);
            int rb = pl_loader_next(ext, r1, &b);
            CHECK_EQ_I64(ra, rb);
            if (ra == PL_DONE) break;
            CHECK(a && b && bhash(a) == bhash(b));
            consumed = a->step;
            if (k % 5 == 0) {
                attach_if_missing(ext, blobs, blen);
                size_t na = 0, nb = 0;
                void *sa = state_of(emb, &na), *sb = state_of(ext, &nb);
                CHECK(na == nb && memcmp(sa, sb, na) == 0);
                free(sa);
                free(sb);
            }
        }
        CHECK_EQ_I64(pushed, steps + 1);
        CHECK(grants < steps / 2); /* bursts, not a grant per step */
        pl_loader_stats sa = {.size = sizeof sa}, sb = {.size = sizeof sb};
        attach_if_missing(ext, blobs, blen);
        CHECK_OK(pl_loader_get_stats(emb, &sa, NULL, 0));
        CHECK_OK(pl_loader_get_stats(ext, &sb, NULL, 0));
        CHECK_EQ_I64(sa.steps, steps);
        CHECK_EQ_I64(sb.steps, steps);
        CHECK_EQ_I64(sa.tokens, sb.tokens);
        CHECK_EQ_I64(sa.padding_tokens, sb.padding_tokens);
        pl_loader_free(emb);
        pl_loader_free(ext);
    }

    /* A transport thread blocked in want_steps(-1, 6, 3): the grants follow
     * the hysteresis exactly.  A unit is a step, the window 3 units: with c
     * steps consumed the step built next is c + 3 once the worker is done;
     * a grant comes when no more than `low` steps stand pushed past it, and
     * reaches `ahead` past it. */
    {
        const int64_t ahead = 6, low = 3;
        pl_loader_options eo = {PL_LOADER_OPTIONS_VERSION, &r1, 1, 1, (int)(2 * nmb), 1, nmb, 0};
        pl_loader *ext = NULL;
        CHECK_OK(pl_loader_create(cfg, &eo, &ext));
        CHECK_OK(pl_loader_set_state(ext, blobs[0], blen[0]));
        burst_feeder f = {ext, pkgs, lens, ahead, low, 0, 0, 0};
        pthread_t th;
        CHECK(pthread_create(&th, NULL, burst_feeder_main, &f) == 0);
        int64_t expect_pushed = 0, expect_grants = 0;
        for (int64_t cons = 0; cons <= 20; cons++) {
            /* the model: grants while the built-next step is c + 3 (at c = 0
               the first grant is made while the worker stands at step 0) */
            int64_t ns = cons == 0 ? 0 : cons + 3;
            if (cons == 0) {
                expect_pushed = ns + ahead + 1;
                expect_grants = 1;
                if (expect_pushed - 3 <= low) { /* the worker built units 0..2 */
                    expect_pushed = 3 + ahead + 1;
                    expect_grants++;
                }
            } else if (expect_pushed - ns <= low) {
                expect_pushed = ns + ahead + 1;
                expect_grants++;
            }
            if (expect_pushed > steps + 1) expect_pushed = steps + 1;
            for (int t = 0; t < 1000 && atomic_load(&f.pushed) < expect_pushed; t++) sleep_ms(5);
            sleep_ms(50);
            CHECK_EQ_I64(atomic_load(&f.pushed), expect_pushed);
            CHECK_EQ_I64(atomic_load(&f.grants), expect_grants);
            for (int64_t k = 0; k < nmb; k++) { /* consume step `cons` */
                const pl_batch *b = NULL;
                CHECK_OK(pl_loader_next(ext, r1, &b));
                CHECK_EQ_I64(b->step, cons);
            }
        }
        pl_loader_stop(ext); /* wakes the thread: PL_ECLOSED */
        CHECK(pthread_join(th, NULL) == 0);
        CHECK(atomic_load(&f.bad) == 0);
        pl_loader_free(ext);
    }
    for (int64_t s = 0; s < steps; s++) free(pkgs[s]);
    free(pkgs);
    free(lens);
    free_steps(steps, plans, blobs, blen);
    pl_planner_free(p);
    for (int s = 0; s < NSRC; s++) pl_source_free(src[s]);
    pl_config_free(cfg);
}

int main(void) {
    corpus c;
    corpus_make(&c, 64);
    test_packages_equal_embedded(&c, "seq_length: 64\nglobal_batch_size: 8\nmicro_batch_size: 2\n"
                                     "topology: {dp: 2, cp: 2, tp: 2}\nbalance: greedy\n"
                                     "train_steps: 6\nseed: 5");
    test_packages_equal_embedded(&c, "seq_length: 64\nglobal_batch_size: 8\nmicro_batch_size: 1\n"
                                     "topology: {dp: 2, pp: 3}\ndtype: int32\ntrain_steps: 5\n"
                                     "seed: 9");
    g_on_demand = 1; /* packages without states, blobs attached when needed */
    test_packages_equal_embedded(&c, "seq_length: 64\nglobal_batch_size: 8\nmicro_batch_size: 2\n"
                                     "topology: {dp: 2, cp: 2, tp: 2}\nbalance: greedy\n"
                                     "train_steps: 6\nseed: 5");
    g_on_demand = 0;
    test_state_pack(&c);
    test_lag_policy(&c);
    test_loader_never_consumes(&c);
    test_plan_ahead(&c);
    test_held_wakeups(&c);
    g_on_demand = 1; /* its packages carry no state */
    test_want_steps_bursts(&c);
    g_on_demand = 0;
    corpus_free(&c);
    TEST_END();
}
