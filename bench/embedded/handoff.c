/*
 * Hand-off: the embedded loader's tokens/s against the limit of the machine
 * for the same work.
 *
 * Build (after cmake --build build-bench; it uses the internal builder):
 *   gcc -O2 -std=c11 -Iinclude -Isrc bench/embedded/handoff.c build-bench/libpolyload.a \
 *       -lyaml -lxxhash -ljansson -lzstd -lz \
 *       $(pkg-config --libs libjpeg spng libwebp libswscale stb) \
 *       -lsentencepiece -lstdc++ -lpthread -lm -o build-bench/bench_handoff
 * Run:
 *   build-bench/bench_handoff CONFIG SECONDS THREADS...      (see bench/embedded/handoff.py)
 *
 * limit: 2 threads (--limit-threads N) build micro-batches of
 *   pre-computed plans (the planner's, made before the clock starts) with the
 *   loader's own builder (pl__construct: the SPEC section 3 fields from the
 *   uint16 tokens of the mapped .bin) into one buffer per thread, reused,
 *   with no synchronization between them and no hand-off: no planning, no
 *   pool traffic, no queue.  What 2 cores can do at most for this output.
 *   --limit-buffers N: each thread writes N buffers in turn (default 1, one
 *   buffer kept hot in the cache; the loader's pool cycles through several,
 *   so N = the loader's buffers in flight writes cold memory as it does).
 *   The 64 plans are made on the main thread before the clock, timed by its
 *   CPU clock: plan_cpu_ns_per_token is the planner's CPU per non-padding
 *   token, and limit_with_planning_tokens_per_s what the limit's threads
 *   would move if they also planned (the same CPU per second, each token
 *   costing its build plus its planning): the work of the loader without
 *   its hand-off, so loader / limit_with_planning is what the hand-off and
 *   its cache effects leave.
 * loader: pl_loader_create with `threads` = each of THREADS, serving every
 *   rank; one consumer takes every rank's micro-batches in step order (as
 *   `polyload run`), after a 1 s warm-up, for SECONDS; tokens/s from
 *   pl_loader_get_stats's non-padding token counter, and the process's
 *   voluntary and involuntary context switches per micro-batch (getrusage).
 * Prints one JSON line per measurement.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <pthread.h>
#include <stdatomic.h>
#include <sys/resource.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "polyload/polyload.h"
#include "polyload/polyload_experimental.h"
#include "build/build.h"

static double cpu_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Context switches of the process so far: voluntary (a thread slept: a
 * hand-off that waited) and involuntary (preempted, e.g. by other load). */
static void csw_now(long *vol, long *invol) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    *vol = ru.ru_nvcsw;
    *invol = ru.ru_nivcsw;
}

static double thread_cpu_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

typedef struct {
    const pl_config *cfg;
    pl_dtype dtype;
    pl_plan **plans;
    int64_t n_plans, dp, nmb, rows, cols;
    pl_source **src;
    int tid, nthreads, nbufs;
    double seconds;
    pthread_barrier_t *go;
    int64_t tokens, micro_batches;
} limit_arg;

static void *limit_worker(void *p) {
    limit_arg *a = p;
    /* The loader's own builder (pl__construct) and buffer, without the
       pipeline: one buffer per thread, reused. */
    char err[512];
    pl__build_ctx x;
    memset(&x, 0, sizeof x);
    x.sources = a->src;
    pl__build_ctx_init(&x, a->cfg, pl__read_from_sources, err, sizeof err);
    pl__pool *pool = NULL;
    pl__batchbuf *bufs[64];
    pl__pool_create(a->rows, a->cols, a->cols, a->dtype, &pool);
    for (int i = 0; i < a->nbufs; i++) pl__pool_get(pool, &bufs[i]);
    int64_t tokens = 0, mbs = 0;
    pthread_barrier_wait(a->go);
    double t0 = now_s();
    int64_t k = a->tid, total = a->n_plans * a->dp * a->nmb;
    while (now_s() - t0 < a->seconds) {
        for (int it = 0; it < 16; it++, k += a->nthreads) {
            int64_t kk = k % total;
            const pl_plan *pl = a->plans[kk / (a->dp * a->nmb)];
            int64_t r = kk / a->nmb % a->dp, mb = kk % a->nmb;
            pl__batchbuf *buf = bufs[mbs % a->nbufs];
            if (pl__construct(&x, pl, r, mb, buf)) {
                fprintf(stderr, "build: %s\n", err);
                exit(1);
            }
            tokens += buf->b.tokens;
            mbs++;
        }
    }
    a->tokens = tokens;
    a->micro_batches = mbs;
    for (int i = 0; i < a->nbufs; i++) pl__buf_release(bufs[i]);
    pl__pool_release_owner(pool);
    free(x.seg);
    return NULL;
}

static int run_limit(const pl_config *cfg, double seconds, int nthreads, int nbufs) {
    int64_t ns = pl_config_num_sources(cfg), dp = 0, nmb = 0, rows = 0, cols = 0;
    pl_config_get_int(cfg, "topology.dp", &dp);
    pl_config_get_int(cfg, "micro_batches_per_rank", &nmb);
    pl_config_get_int(cfg, "micro_batch_size", &rows);
    pl_config_get_int(cfg, "seq_length", &cols);
    int64_t dcode = 0;
    pl_config_get_int(cfg, "dtype", &dcode);
    pl_dtype dtype = (pl_dtype)dcode;
    pl_source **src = calloc((size_t)ns, sizeof *src);
    for (int64_t i = 0; i < ns; i++)
        if (pl_config_open_source(cfg, i, &src[i])) {
            fprintf(stderr, "%s\n", pl_last_errmsg());
            return 1;
        }
    pl_planner *p = NULL;
    if (pl_planner_create(cfg, src, ns, &p)) {
        fprintf(stderr, "%s\n", pl_last_errmsg());
        return 1;
    }
    /* 64 steps: the tokens they read (8-33 M) are not one step's cache lines. */
    int64_t n_plans = 64, plan_tokens = 0;
    pl_plan **plans = calloc((size_t)n_plans, sizeof *plans);
    for (int64_t i = 0; i < 8; i++) { /* warm-up: fault the indexes in */
        pl_plan *w = NULL;
        if (pl_planner_next(p, &w)) return 1;
        pl_plan_free(w);
    }
    double pc0 = thread_cpu_now();
    for (int64_t i = 0; i < n_plans; i++) {
        if (pl_planner_next(p, &plans[i])) return 1;
        plan_tokens += plans[i]->tokens;
    }
    double plan_ns = (thread_cpu_now() - pc0) * 1e9 / (double)(plan_tokens ? plan_tokens : 1);
    pthread_barrier_t go;
    pthread_barrier_init(&go, NULL, (unsigned)nthreads + 1);
    limit_arg *a = calloc((size_t)nthreads, sizeof *a);
    pthread_t *th = calloc((size_t)nthreads, sizeof *th);
    for (int t = 0; t < nthreads; t++) {
        a[t] = (limit_arg){cfg, dtype, plans, n_plans, dp, nmb, rows, cols,
                           src, t,     nthreads, nbufs, seconds, &go, 0, 0};
        pthread_create(&th[t], NULL, limit_worker, &a[t]);
    }
    pthread_barrier_wait(&go);
    double t0 = now_s(), c0 = cpu_now();
    int64_t tokens = 0, mbs = 0;
    for (int t = 0; t < nthreads; t++) {
        pthread_join(th[t], NULL);
        tokens += a[t].tokens;
        mbs += a[t].micro_batches;
    }
    double dt = now_s() - t0, cpu = cpu_now() - c0;
    /* build CPU per token plus planning CPU per token, at the limit's CPU/s */
    double build_ns = cpu * 1e9 / (double)(tokens ? tokens : 1);
    double with_plan = (cpu / dt) / ((build_ns + plan_ns) * 1e-9);
    printf("{\"what\": \"limit\", \"threads\": %d, \"buffers\": %d, \"rows\": %lld, \"cols\": %lld, "
           "\"tokens_per_s\": %.4g, \"tokens_per_cpu_s\": %.4g, \"micro_batches\": %lld, "
           "\"seconds\": %.3f, \"cpu_s\": %.3f, \"plan_cpu_ns_per_token\": %.4g, "
           "\"limit_with_planning_tokens_per_s\": %.4g}\n",
           nthreads, nbufs, (long long)rows, (long long)cols, (double)tokens / dt,
           (double)tokens / cpu, (long long)mbs, dt, cpu, plan_ns, with_plan);
    for (int64_t i = 0; i < n_plans; i++) pl_plan_free(plans[i]);
    free(plans);
    pl_planner_free(p);
    for (int64_t i = 0; i < ns; i++) pl_source_free(src[i]);
    free(src);
    free(a);
    free(th);
    pthread_barrier_destroy(&go);
    return 0;
}

static int run_loader(const pl_config *cfg, double seconds, int threads, int64_t unit) {
    pl_loader_options o = {PL_LOADER_OPTIONS_VERSION, NULL, 0, threads, 0, 0, unit, 0};
    pl_loader *l = NULL;
    if (pl_loader_create(cfg, &o, &l)) {
        fprintf(stderr, "%s\n", pl_last_errmsg());
        return 1;
    }
    int64_t world = pl_config_world_size(cfg), rows = 0, cols = 0;
    pl_config_get_int(cfg, "micro_batch_size", &rows);
    pl_config_get_int(cfg, "seq_length", &cols);
    pl_loader_stats st = {.size = sizeof st};
    double t0 = now_s(), tm = 0, cm = 0;
    int64_t k0 = 0, m0 = 0;
    long v0 = 0, i0 = 0, v1 = 0, i1 = 0;
    for (int phase = 0; phase < 2; phase++) {
        double until = now_s() + (phase ? seconds : 1.0);
        while (now_s() < until) {
            for (int i = 0; i < 8; i++)
                for (int64_t r = 0; r < world; r++) {
                    const pl_batch *b = NULL;
                    if (pl_loader_next(l, r, &b) != PL_OK) {
                        fprintf(stderr, "%s\n", pl_last_errmsg());
                        return 1;
                    }
                }
        }
        pl_loader_get_stats(l, &st, NULL, 0);
        if (phase == 0) {
            k0 = st.tokens;
            m0 = st.micro_batches;
            tm = now_s();
            cm = cpu_now();
            csw_now(&v0, &i0);
        }
    }
    double dt = now_s() - tm, cpu = cpu_now() - cm;
    csw_now(&v1, &i1);
    double mbs = (double)(st.micro_batches - m0);
    (void)t0;
    printf("{\"what\": \"loader\", \"threads\": %d, \"unit\": %lld, \"rows\": %lld, "
           "\"cols\": %lld, \"tokens_per_s\": %.4g, \"tokens_per_cpu_s\": %.4g, "
           "\"seconds\": %.3f, \"cpu_s\": %.3f, \"voluntary_csw_per_mb\": %.3f, "
           "\"involuntary_csw_per_mb\": %.3f}\n",
           threads, (long long)unit, (long long)rows, (long long)cols,
           (double)(st.tokens - k0) / dt, (double)(st.tokens - k0) / cpu, dt, cpu,
           (double)(v1 - v0) / (mbs > 0 ? mbs : 1), (double)(i1 - i0) / (mbs > 0 ? mbs : 1));
    pl_loader_free(l);
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 4) {
        fprintf(stderr,
                "usage: %s CONFIG SECONDS THREADS... [--unit N] [--no-limit] "
                "[--limit-threads N] [--limit-buffers N]\n", argv[0]);
        return 2;
    }
    pl_config *cfg = NULL;
    if (pl_config_parse_file(argv[1], &cfg)) {
        fprintf(stderr, "%s\n", pl_last_errmsg());
        return 2;
    }
    double seconds = atof(argv[2]);
    int64_t unit = 0;
    int limit = 1, limit_threads = 2, limit_buffers = 1;
    int th[16], nt = 0;
    for (int i = 3; i < argc; i++) {
        if (strcmp(argv[i], "--unit") == 0 && i + 1 < argc) unit = atoll(argv[++i]);
        else if (strcmp(argv[i], "--no-limit") == 0) limit = 0;
        else if (strcmp(argv[i], "--limit-threads") == 0 && i + 1 < argc)
            limit_threads = atoi(argv[++i]);
        else if (strcmp(argv[i], "--limit-buffers") == 0 && i + 1 < argc) {
            limit_buffers = atoi(argv[++i]);
            if (limit_buffers < 1) limit_buffers = 1;
            if (limit_buffers > 64) limit_buffers = 64;
        }
        else if (nt < 16) th[nt++] = atoi(argv[i]);
    }
    int rc = 0;
    if (limit) rc |= run_limit(cfg, seconds, limit_threads, limit_buffers);
    for (int i = 0; i < nt && !rc; i++) rc |= run_loader(cfg, seconds, th[i], unit);
    pl_config_free(cfg);
    return rc;
}
