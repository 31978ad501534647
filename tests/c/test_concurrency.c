/*
 * Concurrency of the embedded loader, as its header promises: pl_loader_next
 * for different ranks, pl_loader_get_state and pl_loader_get_stats called at
 * once from different threads (`make test-tsan` runs this under
 * ThreadSanitizer).
 *  - two consumer threads (one per DP rank) take every micro-batch while two
 *    observer threads read the state and the statistics in a loop;
 *  - the batches equal a run without observers, hash for hash;
 *  - every state blob read meanwhile is valid, its position never goes
 *    backwards, and resuming from it gives the uninterrupted run's batches;
 *  - the statistics never go backwards and end at the consumed totals;
 *  - concurrent failing calls each read their own message (pl_last_errmsg).
 */
#include "corpus.h"
#include "planner/planner.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>

#define STEPS 60
#define NMB 2 /* global 8 / (dp 2 * micro 2) */
#define DP 2

static const char *BASE = "seq_length: 64\nglobal_batch_size: 8\nmicro_batch_size: 2\n"
                          "topology: {dp: 2}\nseed: 5\nthreads: 2\nprefetch: 2\n";

static uint64_t batch_hash(const pl_batch *b) {
    size_t n = (size_t)(b->rows * b->cols), es = pl_dtype_size(b->dtype);
    uint64_t h = pl__hash64(b->input_ids, n * es, (uint64_t)b->step);
    h = pl__hash64(b->labels, n * es, h);
    h = pl__hash64(b->loss_mask, n * sizeof(float), h);
    h = pl__hash64(b->position_ids, n * sizeof(int64_t), h);
    return pl__hash64(b->cu_seqlens, (size_t)b->n_cu_seqlens * sizeof(int32_t), h);
}

/* Meeting points, so that every run overlaps: consumers start after each
 * observer has read once, and wait halfway until a mid-run state is seen. */
typedef struct {
    atomic_int observers_ready;
    atomic_int mid_seen;
    int active;
} meeting;

static void wait_for(atomic_int *v, int want) {
    for (long i = 0; atomic_load(v) < want && i < 20000000L; i++) sched_yield();
}

typedef struct {
    pl_loader *l;
    int64_t rank;
    int64_t from; /* first micro-batch index (step * NMB + mb) */
    uint64_t *h;  /* [STEPS * NMB] */
    int failed;
    meeting *m;
} consumer;

static void *consume(void *arg) {
    consumer *c = arg;
    if (c->m->active) wait_for(&c->m->observers_ready, 2);
    for (int64_t k = c->from; k < STEPS * NMB; k++) {
        if (c->m->active && k == STEPS * NMB / 2) wait_for(&c->m->mid_seen, 1);
        const pl_batch *b = NULL;
        int rc = pl_loader_next(c->l, c->rank, &b);
        if (rc != PL_OK || b->step * NMB + b->micro_batch != k) {
            c->failed = 1;
            return NULL;
        }
        c->h[k] = batch_hash(b);
    }
    const pl_batch *b = NULL;
    if (pl_loader_next(c->l, c->rank, &b) != PL_DONE) c->failed = 1;
    return NULL;
}

typedef struct {
    pl_loader *l;
    atomic_int *stop;
    meeting *m;
    int64_t reads;
    int bad;
    int64_t last_pos;     /* step * NMB + micro_batch of the last blob */
    unsigned char *mid;   /* a copy of one blob taken mid-run */
    size_t mid_len;
    int64_t last_mb, last_tokens;
} observer;

static void *observe_state(void *arg) {
    observer *o = arg;
    unsigned char buf[8192];
    o->last_pos = 0;
    while (!atomic_load(o->stop)) {
        size_t len = 0;
        if (pl_loader_get_state(o->l, buf, sizeof buf, &len) != PL_OK || len > sizeof buf) {
            o->bad++;
            continue;
        }
        pl_state_info si;
        if (pl_state_inspect(buf, len, &si) != PL_OK) {
            o->bad++;
            continue;
        }
        int64_t pos = si.step * NMB + si.micro_batch;
        if (pos < o->last_pos) o->bad++;
        o->last_pos = pos;
        if (!o->mid && pos >= STEPS * NMB / 3) {
            o->mid = malloc(len);
            memcpy(o->mid, buf, len);
            o->mid_len = len;
            atomic_store(&o->m->mid_seen, 1);
        }
        if (o->reads++ == 0) atomic_fetch_add(&o->m->observers_ready, 1);
    }
    return NULL;
}

static void *observe_stats(void *arg) {
    observer *o = arg;
    o->last_mb = o->last_tokens = 0;
    pl_source_summary sums[NSRC];
    while (!atomic_load(o->stop)) {
        pl_loader_stats st;
        memset(&st, 0, sizeof st);
        st.size = sizeof st;
        if (pl_loader_get_stats(o->l, &st, sums, NSRC) != PL_OK) {
            o->bad++;
            continue;
        }
        if (st.micro_batches < o->last_mb || st.tokens < o->last_tokens) o->bad++;
        int64_t drawn = 0;
        for (int64_t s = 0; s < st.n_sources; s++) {
            if (!st.sources[s].name || st.sources[s].tokens < 0) o->bad++;
            drawn += st.sources[s].tokens;
        }
        if (drawn < 0) o->bad++;
        o->last_mb = st.micro_batches;
        o->last_tokens = st.tokens;
        if (o->reads++ == 0) atomic_fetch_add(&o->m->observers_ready, 1);
    }
    return NULL;
}

static pl_loader *make(pl_config *cfg) {
    pl_loader *l = NULL;
    int rc = pl_loader_create(cfg, NULL, &l);
    if (rc) fprintf(stderr, "loader: %s\n", pl_loader_errmsg(l));
    CHECK_OK(rc);
    return l;
}

/* Consume everything with one thread per DP rank; observers optional. */
static void run(pl_config *cfg, const void *blob, size_t blob_len, int64_t from,
                uint64_t h[DP][STEPS * NMB], int with_observers, observer *os,
                observer *ost) {
    pl_loader *l = make(cfg);
    if (blob) CHECK_OK(pl_loader_set_state(l, blob, blob_len));
    atomic_int stop = 0;
    pthread_t obs[2];
    meeting m = {0, 0, with_observers};
    if (with_observers) {
        os->l = ost->l = l;
        os->stop = ost->stop = &stop;
        os->m = ost->m = &m;
        pthread_create(&obs[0], NULL, observe_state, os);
        pthread_create(&obs[1], NULL, observe_stats, ost);
    }
    consumer c[DP];
    pthread_t th[DP];
    for (int r = 0; r < DP; r++) {
        c[r] = (consumer){l, r, from, h[r], 0, &m};
        pthread_create(&th[r], NULL, consume, &c[r]);
    }
    for (int r = 0; r < DP; r++) {
        pthread_join(th[r], NULL);
        CHECK(!c[r].failed);
    }
    if (with_observers) {
        atomic_store(&stop, 1);
        pthread_join(obs[0], NULL);
        pthread_join(obs[1], NULL);
        pl_loader_stats st;
        pl_source_summary sums[NSRC];
        memset(&st, 0, sizeof st);
        st.size = sizeof st;
        CHECK_OK(pl_loader_get_stats(l, &st, sums, NSRC));
        CHECK_EQ_I64(st.steps, STEPS);
        CHECK_EQ_I64(st.micro_batches, DP * STEPS * NMB);
        CHECK(ost->last_mb <= st.micro_batches);
    }
    pl_loader_free(l);
}

static void test_state_and_stats_during_next(corpus *c) {
    char extra[256];
    snprintf(extra, sizeof extra, "%strain_steps: %d\n", BASE, STEPS);
    pl_config *cfg = corpus_config(c, extra, NULL);
    static uint64_t ref[DP][STEPS * NMB], got[DP][STEPS * NMB], res[DP][STEPS * NMB];
    observer os, ost;
    memset(&os, 0, sizeof os);
    memset(&ost, 0, sizeof ost);
    run(cfg, NULL, 0, 0, ref, 0, NULL, NULL);
    run(cfg, NULL, 0, 0, got, 1, &os, &ost);
    CHECK(memcmp(ref, got, sizeof ref) == 0);
    CHECK_EQ_I64(os.bad, 0);
    CHECK_EQ_I64(ost.bad, 0);
    CHECK(os.reads > 0 && ost.reads > 0);
    CHECK(os.mid != NULL);
    /* Resume from a blob read while the consumers ran. */
    if (os.mid) {
        pl_state_info si;
        CHECK_OK(pl_state_inspect(os.mid, os.mid_len, &si));
        int64_t from = si.step * NMB + si.micro_batch;
        memset(res, 0, sizeof res);
        run(cfg, os.mid, os.mid_len, from, res, 0, NULL, NULL);
        for (int r = 0; r < DP; r++)
            CHECK(memcmp(ref[r] + from, res[r] + from,
                         (size_t)(STEPS * NMB - from) * sizeof(uint64_t)) == 0);
        free(os.mid);
    }
    pl_config_free(cfg);
}

/* Failing calls on a shared loader from several threads: each thread reads
 * its own message (pl_last_errmsg), never another thread's. */
typedef struct {
    pl_loader *l;
    int64_t rank;
    int ok;
} bad_caller;

static void *call_bad_rank(void *arg) {
    bad_caller *b = arg;
    char want[64];
    snprintf(want, sizeof want, "rank %lld is not served", (long long)b->rank);
    b->ok = 1;
    for (int i = 0; i < 200; i++) {
        const pl_batch *batch = NULL;
        if (pl_loader_next(b->l, b->rank, &batch) != PL_ERANGE ||
            !strstr(pl_last_errmsg(), want))
            b->ok = 0;
    }
    return NULL;
}

static void test_per_call_errors(corpus *c) {
    pl_config *cfg = corpus_config(c, BASE, NULL);
    const int64_t ranks[] = {0};
    pl_loader_options o = {PL_LOADER_OPTIONS_VERSION, ranks, 1, 1, 2, 0, 0, 0};
    pl_loader *l = NULL;
    CHECK_OK(pl_loader_create(cfg, &o, &l));
    bad_caller b[3] = {{l, 1, 0}, {l, 7, 0}, {l, 99, 0}};
    pthread_t th[3];
    for (int i = 0; i < 3; i++) pthread_create(&th[i], NULL, call_bad_rank, &b[i]);
    for (int i = 0; i < 3; i++) {
        pthread_join(th[i], NULL);
        CHECK(b[i].ok);
    }
    pl_loader_free(l);
    pl_config_free(cfg);
}

int main(void) {
    corpus c;
    corpus_make(&c, 64);
    test_state_and_stats_during_next(&c);
    test_per_call_errors(&c);
    corpus_free(&c);
    TEST_END();
}
