/*
 * loader.c -- the embedded loader (docs/internals/design.md, "Roles"): worker
 * threads around the pipeline (pipeline.c), which owns the step ledger,
 * back-pressure, the lag policy, the consumed position, its state and the
 * statistics.
 *
 * A worker asks the pipeline for work: PL_WORK_PLAN (run the planner for the
 * next step and add its plan and the state blob of its start) or
 * PL_WORK_BUILD (build the micro-batches of one unit of a (DP, CP) group into
 * pool buffers, shared by every TP/PP peer of the group as views).  Since a
 * batch is a pure function of its plan and plans are made in step order by
 * one planner, neither the thread count, the unit size nor the prefetch depth
 * changes any batch.
 *
 * External mode (the trainer side of a distributed deployment): no sources,
 * no planner; a transport thread asks which step to fetch
 * (pl_loader_want_step) and pushes its package; the workers build from the
 * package's payloads.  Everything else is the same code.
 */
#include "runtime/runtime.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* A consumer's wake-up is held for up to this many cheap units (pipeline.c,
 * "Held wake-ups"): on a 2-core machine, 2 x 2048 and 8 x 8192 with 2
 * threads, 8 beat 4 and matched 16
 * (docs/internals/decisions/0001-held-wakeups.md). */
#define PL__LOADER_DEFER_UNITS 8

/* A unit's item: its micro-batches. */
typedef struct pl__unit_item {
    int64_t n;
    pl__batchbuf *b[];
} pl__unit_item;

static void unit_item_retain(void *item, int64_t index, void *ctx) {
    (void)ctx;
    pl__buf_retain(((pl__unit_item *)item)->b[index]);
}

static void unit_item_release(void *item, void *ctx) {
    (void)ctx;
    pl__unit_item *it = item;
    for (int64_t i = 0; i < it->n; i++) pl__buf_release(it->b[i]);
    free(it);
}

typedef struct pl__worker {
    pl_loader *loader;
    pthread_t thread;
    int started;
    pl__build_ctx ctx;
    char err[PL__ERRMSG_CAP];
    int64_t *tokens, *padding; /* [unit] */
} pl__worker;

typedef struct pl__lrank {
    int64_t rank;
    pl_batch *current; /* the borrowed batch last returned for this rank */
    int asked;         /* pl_loader_next was called for it (its wait counts) */
} pl__lrank;

struct pl_loader {
    char errmsg[PL__ERRMSG_CAP];
    pthread_mutex_t err_mu; /* errmsg, written by concurrent next calls */
    pthread_mutex_t run_mu; /* starting and stopping workers */
    int sync_inited;
    pl_config *cfg;
    int external;
    int64_t ext_dp;
    pl_source **sources;
    int64_t n_sources;
    atomic_llong wait_ns; /* pl_loader_next blocked, first call per rank left out */
    pl_planner *planner;
    pl_pipeline *pipe;
    pl__pool *pool;
    int64_t nmb, unit;
    int n_threads;
    int n_fair; /* workers at normal priority: the CPUs less one */
    int running;
    pl__worker *workers;
    pl__lrank *ranks; /* sorted */
    int64_t n_ranks;
};

static int fail(pl_loader *l, int rc, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int fail(pl_loader *l, int rc, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    char msg[PL__ERRMSG_CAP];
    pl__vfmt(msg, sizeof msg, fmt, ap);
    va_end(ap);
    pl__thread_err(msg);
    if (l->sync_inited) pthread_mutex_lock(&l->err_mu);
    memcpy(l->errmsg, msg, sizeof msg);
    if (l->sync_inited) pthread_mutex_unlock(&l->err_mu);
    return rc;
}

/* ---------------------------------------------------------------- work */

/* Payload j of the micro-batch: tokens at their stored width (packages). */
static int read_typed(pl__build_ctx *x, int64_t ordinal, const pl_chunk *c,
                          void *ids, void *next, pl_dtype dt) {
    if (ordinal >= x->n_typed) {
        pl__fmt(x->err, x->errcap, "package: chunk %lld has no payload",
                (long long)ordinal);
        return PL_EINVAL;
    }
    const pl_payload *pl = &x->typed[ordinal];
    const int64_t L = c->length, need = L + (next ? 1 : 0);
    if (pl->count < need) {
        pl__fmt(x->err, x->errcap,
                "package: payload %lld holds %lld tokens, its read needs %lld",
                (long long)ordinal, (long long)pl->count, (long long)need);
        return PL_EINVAL;
    }
    pl__tokens_convert(pl->data, (pl_dtype)pl->dtype, ids, dt, L);
    if (next)
        pl__tokens_convert((const unsigned char *)pl->data +
                               (size_t)L * pl_dtype_size((pl_dtype)pl->dtype),
                           (pl_dtype)pl->dtype, next, dt, 1);
    return PL_OK;
}

static void do_plan(pl_loader *l, pl__worker *w, const pl_work *wk) {
    void *blob = NULL;
    size_t len = 0;
    int rc = pl__state_encode(l->planner, 0, &blob, &len);
    if (rc) {
        pl_pipeline_fail_step(l->pipe, wk->step, rc, "planner: out of memory");
        return;
    }
    pl_plan *plan = NULL;
    if (l->cfg->train_steps < 0 || wk->step < l->cfg->train_steps) {
        rc = pl_planner_next(l->planner, &plan);
        if (rc == PL_DONE) { /* an evaluation pass ended: step is its end */
            pl__pipeline_end_at(l->pipe, wk->step);
            plan = NULL;
        } else if (rc) {
            pl__fmt(w->err, sizeof w->err, "%s", pl_planner_errmsg(l->planner));
            free(blob);
            pl_pipeline_fail_step(l->pipe, wk->step, rc, w->err);
            return;
        }
    }
    /* Remote sources: the step's reads are requested now, ahead of the
       builds (a no-op for local files). */
    for (int64_t j = 0; plan && j < plan->n_chunks; j++) {
        const pl_chunk *ch = &plan->chunks[j];
        if (ch->source >= 0 && ch->source < l->n_sources)
            pl__source_fetch_ahead(l->sources[ch->source], ch->index, ch->offset,
                                   ch->length + 1);
    }
    pl_pipeline_add_step(l->pipe, wk->step, plan, blob, len, NULL, NULL);
    free(blob);
}

static void do_build(pl_loader *l, pl__worker *w, const pl_work *wk) {
    int64_t n = wk->n_micro_batches;
    pl__unit_item *it = pl__malloc(sizeof *it + (size_t)n * sizeof(pl__batchbuf *));
    int rc = it ? PL_OK : PL_ENOMEM;
    w->err[0] = '\0';
    if (!rc) it->n = 0;
    const pl__package *pkg = wk->aux;
    for (int64_t i = 0; !rc && i < n; i++) {
        int64_t mb = wk->micro_batch + i;
        pl__batchbuf *buf = NULL;
        rc = pl__pool_get(l->pool, &buf);
        if (rc) {
            pl__fmt(w->err, sizeof w->err, "loader: out of memory");
            break;
        }
        w->ctx.cp_rank = wk->cp_rank;
        if (pkg) {
            w->ctx.typed = pkg->reads + pkg->mb_first[mb];
            w->ctx.n_typed = pkg->mb_first[mb + 1] - pkg->mb_first[mb];
            w->ctx.images = pkg->images;
            w->ctx.image_of = pkg->image_of + pkg->mb_first[mb];
            w->ctx.step_loss = pkg->step_loss;
            w->ctx.n_step_loss = pkg->n_step_loss;
        }
        rc = pl__construct(&w->ctx, wk->plan, wk->dp_rank, mb, buf);
        if (rc) {
            pl__buf_release(buf);
            break;
        }
        it->b[it->n++] = buf;
        w->tokens[i] = buf->b.tokens;
        w->padding[i] = buf->b.rows * buf->b.cols - buf->b.tokens;
    }
    if (rc) {
        if (it) unit_item_release(it, NULL);
        if (!w->err[0]) pl__fmt(w->err, sizeof w->err, "loader: %s", pl_strerror(rc));
        pl_pipeline_complete(l->pipe, wk, rc, w->err, NULL, NULL, NULL);
        return;
    }
    pl_pipeline_complete(l->pipe, wk, PL_OK, NULL, it, w->tokens, w->padding);
}

static void *worker_main(void *arg) {
    pl__worker *w = arg;
    pl_loader *l = w->loader;
    if (w - l->workers >= l->n_fair) pl__thread_yield_priority();
    unsigned kinds = l->external ? PL_WORK_BUILD : PL_WORK_BUILD | PL_WORK_PLAN;
    for (;;) {
        pl_work wk;
        int rc = pl_pipeline_get_work(l->pipe, kinds, -1, &wk);
        if (rc) break; /* PL_DONE or PL_ECLOSED */
        if (wk.kind == PL_WORK_PLAN) do_plan(l, w, &wk);
        else do_build(l, w, &wk);
    }
    return NULL;
}

/* run_mu held. */
static void stop_workers(pl_loader *l) {
    if (!l->running) return;
    pl_pipeline_close(l->pipe);
    for (int i = 0; i < l->n_threads; i++) {
        if (l->workers[i].started) pthread_join(l->workers[i].thread, NULL);
        l->workers[i].started = 0;
    }
    l->running = 0;
}

/* run_mu held. */
static int start_workers(pl_loader *l) {
    if (l->running) return PL_OK;
    for (int i = 0; i < l->n_threads; i++) {
        if (pthread_create(&l->workers[i].thread, NULL, worker_main, &l->workers[i])) {
            l->running = 1;
            stop_workers(l);
            pl__pipeline_reopen(l->pipe);
            return fail(l, PL_ENOMEM, "loader: cannot start worker thread");
        }
        l->workers[i].started = 1;
    }
    l->running = 1;
    return PL_OK;
}

/* ------------------------------------------------------------ lifecycle */

static int cmp_i64(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

int pl_loader_create(const pl_config *cfg, const pl_loader_options *opts,
                     pl_loader **out) {
    *out = NULL;
    pl_loader *l = pl__calloc(1, sizeof *l);
    if (!l) return PL_ENOMEM;
    *out = l;
    if (!cfg) return fail(l, PL_EINVAL, "loader: config is NULL");
    if (opts && opts->version != PL_LOADER_OPTIONS_VERSION && opts->version != 1)
        return fail(l, PL_EINVAL, "loader: options version %d, expected %d",
                        opts->version, PL_LOADER_OPTIONS_VERSION);
    pl_loader_options o;
    memset(&o, 0, sizeof o);
    if (opts && opts->version == 1)
        memcpy(&o, opts, offsetof(pl_loader_options, external));
    else if (opts)
        o = *opts;
    if (pthread_mutex_init(&l->err_mu, NULL))
        return fail(l, PL_ENOMEM, "loader: cannot create mutex");
    if (pthread_mutex_init(&l->run_mu, NULL)) {
        pthread_mutex_destroy(&l->err_mu);
        return fail(l, PL_ENOMEM, "loader: cannot create mutex");
    }
    l->sync_inited = 1;
    l->cfg = pl__config_share(cfg);
    if (!l->cfg) return fail(l, PL_ENOMEM, "loader: out of memory");
    const pl_config *c = l->cfg;
    l->external = o.external != 0;
    /* `threads: auto`: the CPUs this process may use, less one for the
     * consumer (the training loop's next_batch) and the planning that the
     * workers take turns at.  A larger count is run, its workers past that
     * number at a lower priority (pl__worker_main), so they use CPU the
     * planner and the consumer leave idle and never take it from them. */
    l->n_fair = pl__threads_auto(pl_cpus_available(), 1);
    l->n_threads = o.threads > 0 ? o.threads : c->threads > 0 ? c->threads : l->n_fair;
    if (l->n_threads < 1) l->n_threads = 1;
    l->nmb = c->global_batch_size / (c->topology.dp * c->micro_batch_size);
    /* Hand off about 64k tokens (at least one micro-batch) at a time. */
    int64_t per = pl__mb_rows(c) * pl__row_tokens(c);
    l->unit = o.unit > 0 ? o.unit : (65536 + per - 1) / per;
    if (l->unit > l->nmb) l->unit = l->nmb;

    /* Served ranks. */
    int64_t world = pl_config_world_size(c);
    l->n_ranks = o.ranks ? o.n_ranks : world;
    if (l->n_ranks <= 0) return fail(l, PL_EINVAL, "loader: no ranks to serve");
    l->ranks = pl__calloc((size_t)l->n_ranks, sizeof *l->ranks);
    if (!l->ranks) return fail(l, PL_ENOMEM, "loader: out of memory");
    for (int64_t i = 0; i < l->n_ranks; i++) l->ranks[i].rank = o.ranks ? o.ranks[i] : i;
    qsort(l->ranks, (size_t)l->n_ranks, sizeof *l->ranks, cmp_i64);

    pl_pipeline_options po;
    memset(&po, 0, sizeof po);
    po.version = PL_PIPELINE_OPTIONS_VERSION;
    po.n_ranks = l->n_ranks;
    po.group_by_cp = 1;
    po.unit = l->unit;
    po.prefetch = o.prefetch > 0 ? o.prefetch : c->prefetch;
    if (po.prefetch < l->unit) po.prefetch = l->unit;
    po.max_lag_steps = o.max_lag_steps;
    po.release = unit_item_release;
    po.retain = unit_item_retain;
    /* pl__lrank is {rank, current}: ranks are not contiguous int64s. */
    int64_t *rk = pl__calloc((size_t)l->n_ranks, sizeof *rk);
    if (!rk) return fail(l, PL_ENOMEM, "loader: out of memory");
    for (int64_t i = 0; i < l->n_ranks; i++) rk[i] = l->ranks[i].rank;
    po.ranks = rk;
    int rc = pl_pipeline_create(c, &po, &l->pipe);
    free(rk);
    if (rc) {
        if (rc == PL_ERANGE)
            return fail(l, rc, "loader: %s", pl_pipeline_errmsg(l->pipe));
        return fail(l, rc, "%s", pl_pipeline_errmsg(l->pipe));
    }
    /* More than one worker: one plans the next step while the others build. */
    if (!l->external && l->n_threads > 1) pl__pipeline_plan_ahead(l->pipe, 1);
    /* Its workers come back to pl_pipeline_get_work after every unit. */
    pl__pipeline_defer_wakes(l->pipe, PL__LOADER_DEFER_UNITS);
    if (l->external) {
        pl_rank_info ri;
        l->ext_dp = -1;
        for (int64_t i = 0; i < l->n_ranks; i++) {
            pl_config_rank_info(c, l->ranks[i].rank, &ri);
            if (l->ext_dp >= 0 && ri.dp_rank != l->ext_dp)
                return fail(l, PL_EINVAL,
                                "loader: an external loader serves the ranks of one DP "
                                "rank (ranks of DP %lld and %lld given)",
                                (long long)l->ext_dp, (long long)ri.dp_rank);
            l->ext_dp = ri.dp_rank;
        }
    } else {
        l->n_sources = c->n_sources;
        l->sources = pl__calloc((size_t)c->n_sources, sizeof *l->sources);
        if (!l->sources) return fail(l, PL_ENOMEM, "loader: out of memory");
        for (int64_t i = 0; i < c->n_sources; i++) {
            rc = pl__config_open_source(c, i, &l->sources[i]);
            if (rc)
                return fail(l, rc, "source '%s': %s", c->sources[i].name,
                                l->sources[i] ? pl_source_errmsg(l->sources[i])
                                              : "out of memory");
        }
        rc = pl_planner_create(c, l->sources, l->n_sources, &l->planner);
        if (rc) return fail(l, rc, "%s", pl_planner_errmsg(l->planner));
    }

    int64_t cp = c->topology.cp;
    rc = pl__pool_create(pl__mb_rows(c), pl__row_tokens(c) / cp, pl__row_tokens(c), c->dtype,
                         &l->pool);
    if (rc) return fail(l, rc, "loader: out of memory");
    l->workers = pl__calloc((size_t)l->n_threads, sizeof *l->workers);
    if (!l->workers) return fail(l, PL_ENOMEM, "loader: out of memory");
    for (int i = 0; i < l->n_threads; i++) {
        pl__worker *w = &l->workers[i];
        w->loader = l;
        w->ctx.sources = l->sources;
        w->tokens = pl__calloc((size_t)l->unit, sizeof *w->tokens);
        w->padding = pl__calloc((size_t)l->unit, sizeof *w->padding);
        if (!w->tokens || !w->padding ||
            pl__build_ctx_init(&w->ctx, c, l->external ? read_typed : pl__read_from_sources,
                               w->err, sizeof w->err))
            return fail(l, PL_ENOMEM, "loader: out of memory");
    }
    /* Stand at step 0 (external: until pl_loader_set_state). */
    if (!l->external) {
        void *blob = NULL;
        size_t len = 0;
        rc = pl__state_encode(l->planner, 0, &blob, &len);
        if (!rc) rc = pl_pipeline_reset(l->pipe, blob, len, NULL, 0);
        free(blob);
        if (rc) return fail(l, rc, "loader: out of memory");
    }
    return PL_OK;
}

void pl_loader_free(pl_loader *l) {
    if (!l) return;
    if (l->sync_inited) {
        pthread_mutex_lock(&l->run_mu);
        if (l->pipe) stop_workers(l);
        pthread_mutex_unlock(&l->run_mu);
    }
    for (int64_t i = 0; l->ranks && i < l->n_ranks; i++) pl_batch_release(l->ranks[i].current);
    pl_pipeline_free(l->pipe);
    for (int i = 0; l->workers && i < l->n_threads; i++) {
        free(l->workers[i].ctx.seg);
        free(l->workers[i].tokens);
        free(l->workers[i].padding);
    }
    free(l->workers);
    pl__pool_release_owner(l->pool);
    pl_planner_free(l->planner);
    for (int64_t i = 0; l->sources && i < l->n_sources; i++) pl_source_free(l->sources[i]);
    free(l->sources);
    free(l->ranks);
    pl_config_free(l->cfg);
    if (l->sync_inited) {
        pthread_mutex_destroy(&l->err_mu);
        pthread_mutex_destroy(&l->run_mu);
    }
    free(l);
}

const char *pl_loader_errmsg(const pl_loader *l) { return l ? l->errmsg : "out of memory"; }

const pl_config *pl_loader_config(const pl_loader *l) { return l->cfg; }

static pl__lrank *find_rank(pl_loader *l, int64_t rank) {
    int64_t lo = 0, hi = l->n_ranks;
    while (lo < hi) {
        int64_t mid = lo + (hi - lo) / 2;
        if (l->ranks[mid].rank < rank) lo = mid + 1;
        else hi = mid;
    }
    return lo < l->n_ranks && l->ranks[lo].rank == rank ? &l->ranks[lo] : NULL;
}

/* ------------------------------------------------------------- consumer */

int pl_loader_next(pl_loader *l, int64_t rank, const pl_batch **out) {
    *out = NULL;
    pl__lrank *r = find_rank(l, rank);
    if (!r)
        return fail(l, PL_ERANGE, "loader: rank %lld is not served by this loader",
                        (long long)rank);
    pl_batch *prev = r->current;
    r->current = NULL;
    pl_batch_release(prev);
    pthread_mutex_lock(&l->run_mu);
    int rc = start_workers(l);
    pthread_mutex_unlock(&l->run_mu);
    if (rc) return rc;
    char err[PL__ERRMSG_CAP];
    err[0] = '\0';
    pl_pipeline_item it;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    rc = pl_pipeline_next(l->pipe, rank, 1, -1, &it, err, sizeof err);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    if (r->asked)
        atomic_fetch_add(&l->wait_ns, (long long)(t1.tv_sec - t0.tv_sec) * 1000000000LL +
                                          (t1.tv_nsec - t0.tv_nsec));
    r->asked = 1;
    if (rc == PL_DONE) return rc;
    if (rc) return fail(l, rc, "%s", err);
    pl__unit_item *item = it.item; /* its buffer it.index is retained for us */
    pl__batchbuf *buf = item->b[it.index];
    pl_batch *view = NULL;
    rc = pl__view_create(buf, it.fields, &view);
    pl__buf_release(buf); /* the view holds its own reference */
    if (rc) return fail(l, rc, "loader: out of memory");
    r->current = view;
    *out = view;
    return PL_OK;
}

int pl_loader_get_state(pl_loader *l, void *buf, size_t cap, size_t *len) {
    char err[PL__ERRMSG_CAP];
    int rc = pl_pipeline_get_state(l->pipe, -1, buf, cap, len, err, sizeof err);
    if (rc) return fail(l, rc, "%s", err);
    return PL_OK;
}

int pl_loader_set_state(pl_loader *l, const void *buf, size_t len) {
    char err[PL__ERRMSG_CAP];
    pthread_mutex_lock(&l->run_mu);
    stop_workers(l);
    int rc = PL_OK;
    if (!l->external) {
        int64_t mb = 0;
        rc = pl__state_decode(l->planner, buf, len, l->nmb, l->cfg->topology.dp, &mb);
        if (rc) { /* nothing changed: continue from where the loader was */
            fail(l, rc, "%s", pl_planner_errmsg(l->planner));
            pl__pipeline_reopen(l->pipe);
            pthread_mutex_unlock(&l->run_mu);
            return rc;
        }
    }
    rc = pl_pipeline_reset(l->pipe, buf, len, err, sizeof err);
    if (rc) fail(l, rc, "%s", err);
    if (rc) pl__pipeline_reopen(l->pipe);
    for (int64_t i = 0; i < l->n_ranks; i++) {
        pl_batch_release(l->ranks[i].current);
        l->ranks[i].current = NULL;
    }
    pthread_mutex_unlock(&l->run_mu);
    return rc;
}

int pl_loader_get_stats(pl_loader *l, pl_loader_stats *out, pl_source_summary *sources,
                        int64_t cap) {
    if (!out || out->size < offsetof(pl_loader_stats, data_wait_s) || (!sources && cap > 0))
        return fail(l, PL_EINVAL,
                        "loader: pl_loader_get_stats needs out->size = sizeof(pl_loader_stats) "
                        "and a sources array of cap entries");
    int rc = pl_pipeline_get_stats(l->pipe, -1, out, sources, cap);
    if (rc == PL_ESTATE) {
        int64_t step = 0;
        pl_pipeline_position(l->pipe, &step, NULL, NULL);
        return fail(l, rc, "loader: the state blob of step %lld is not held "
                        "(its package came without it: pl_loader_attach_state)",
                        (long long)step);
    }
    if (rc) return fail(l, rc, "loader: statistics: %s", pl_strerror(rc));
    if (out->size >= sizeof(pl_loader_stats)) {
        out->data_wait_s = (double)atomic_load(&l->wait_ns) / 1e9;
        out->images_replaced = 0;
        for (int64_t i = 0; l->sources && i < l->n_sources; i++)
            out->images_replaced += pl_source_num_images_replaced(l->sources[i]);
    }
    return PL_OK;
}

/* ------------------------------------------------------------- external */

int pl_loader_position(pl_loader *l, int64_t *step, int64_t *micro_batch,
                       int *have_blob) {
    return pl_pipeline_position(l->pipe, step, micro_batch, have_blob);
}

int pl_loader_attach_state(pl_loader *l, const void *blob, size_t len) {
    char err[PL__ERRMSG_CAP];
    int rc = pl_pipeline_attach_state(l->pipe, blob, len, err, sizeof err);
    if (rc) return fail(l, rc, "%s", err);
    return PL_OK;
}

int pl_loader_want_step(pl_loader *l, int64_t timeout_ms, int64_t *step) {
    if (!l->external)
        return fail(l, PL_EINVAL, "loader: pl_loader_want_step needs an external loader");
    pthread_mutex_lock(&l->run_mu);
    int rc = start_workers(l);
    pthread_mutex_unlock(&l->run_mu);
    if (rc) return rc;
    pl_work w;
    rc = pl_pipeline_get_work(l->pipe, PL_WORK_PLAN, timeout_ms, &w);
    if (rc == PL_OK) *step = w.step;
    return rc;
}

int pl_loader_want_steps(pl_loader *l, int64_t timeout_ms, int64_t ahead,
                         int64_t low, int64_t *first, int64_t *count) {
    if (!l->external)
        return fail(l, PL_EINVAL, "loader: pl_loader_want_steps needs an external loader");
    if (ahead < 1 || low < 0 || low > ahead)
        return fail(l, PL_EINVAL,
                        "loader: pl_loader_want_steps needs 1 <= ahead and 0 <= low <= "
                        "ahead (ahead %lld, low %lld)",
                        (long long)ahead, (long long)low);
    pthread_mutex_lock(&l->run_mu);
    int rc = start_workers(l);
    pthread_mutex_unlock(&l->run_mu);
    if (rc) return rc;
    pl__pipeline_plan_window(l->pipe, ahead, low);
    pl_work w;
    rc = pl_pipeline_get_work(l->pipe, PL_WORK_PLAN, timeout_ms, &w);
    if (rc != PL_OK) return rc;
    int64_t n = pl__pipeline_grant(l->pipe, w.step, ahead);
    if (n < 1) /* reset meanwhile (pl_loader_set_state from another thread) */
        return fail(l, PL_ECLOSED,
                        "loader: pl_loader_want_steps: the loader was reset meanwhile");
    *first = w.step;
    *count = n;
    return PL_OK;
}

static void package_free_cb(void *k) { pl__package_free(k); }

int pl_loader_push_package(pl_loader *l, const void *package, size_t len) {
    if (!l->external)
        return fail(l, PL_EINVAL, "loader: pl_loader_push_package needs an external loader");
    char err[PL__ERRMSG_CAP];
    if (package && len >= 4 && memcmp(package, "PLST", 4) == 0) {
        /* The step train_steps: its state only. */
        pl_state_info si;
        if (pl_state_inspect(package, len, &si) || si.step != l->cfg->train_steps)
            return fail(l, PL_EINVAL,
                            "loader: a state blob is pushed only for step train_steps");
        int rc = pl_pipeline_add_step(l->pipe, si.step, NULL, package, len, NULL, NULL);
        if (rc) return fail(l, rc, "loader: step %lld was not asked for", (long long)si.step);
        return PL_OK;
    }
    pl__package *k = NULL;
    int rc = pl__package_decode(package, len, &k, err, sizeof err);
    if (rc) return fail(l, rc, "loader: %s", err);
    if (k->dp_rank != l->ext_dp || k->plan->dp != l->cfg->topology.dp ||
        k->plan->seq_length != pl__row_tokens(l->cfg) ||
        k->plan->micro_batch_size != pl__mb_rows(l->cfg) ||
        k->plan->micro_batches_per_rank != l->nmb) {
        int64_t dp = k->dp_rank;
        pl__package_free(k);
        return fail(l, PL_EINVAL,
                        "loader: package for DP rank %lld / another config (this loader "
                        "serves DP rank %lld)",
                        (long long)dp, (long long)l->ext_dp);
    }
    for (int64_t j = 0; j < k->plan->n_chunks; j++)
        if (k->plan->chunks[j].source < 0 || k->plan->chunks[j].source >= l->cfg->n_sources) {
            pl__package_free(k);
            return fail(l, PL_EINVAL, "loader: package names an unknown source");
        }
    for (int64_t q = 0; q < k->plan->n_sequences; q++) { /* fits with CP padding */
        int64_t t = 0, al = l->workers[0].ctx.align;
        for (int64_t j = k->plan->seq_offsets[q]; j < k->plan->seq_offsets[q + 1]; j++)
            t += (k->plan->chunks[j].length + al - 1) / al * al;
        if (t > pl__row_tokens(l->cfg)) {
            pl__package_free(k);
            return fail(l, PL_EINVAL, "loader: package sequence %lld holds %lld tokens, "
                            "more than seq_length", (long long)q, (long long)t);
        }
    }
    pl_plan *plan = k->plan;
    k->plan = NULL;
    int64_t step = k->step;
    rc = pl_pipeline_add_step(l->pipe, step, plan, k->state, k->state_len, k,
                              package_free_cb);
    if (rc) return fail(l, rc, "loader: step %lld was not asked for", (long long)step);
    return PL_OK;
}

int pl_loader_fail_step(pl_loader *l, int64_t step, int status, const char *message) {
    int rc = pl_pipeline_fail_step(l->pipe, step, status, message);
    if (rc) return fail(l, rc, "loader: step %lld was not asked for", (long long)step);
    return PL_OK;
}

void pl_loader_stop(pl_loader *l) {
    if (l && l->pipe) pl_pipeline_close(l->pipe);
}
