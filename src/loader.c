/*
 * loader.c -- the embedded loader (DESIGN.md, "Roles"): sources, planner and
 * data constructor in one process, wired with worker threads.
 *
 * Work is numbered by k = step * micro_batches_per_rank + micro_batch.  A
 * "group" is a (DP rank, CP rank) pair: its batch is built once and shared by
 * every served rank of the group (TP peers and PP stages get views of the same
 * memory, with the fields their role does not need hidden).  Each group has a
 * ring of `prefetch` slots; a worker may build k for a group when
 * k < (least k not yet consumed by all of the group's ranks) + prefetch, and
 * always takes the group that is furthest behind, so groups advance together.
 *
 * Plans come from one planner, run by whichever worker first needs a step
 * that is not planned yet; the others wait for it.  Each step keeps the state
 * blob of its start, so pl_loader_get_state can return the position of the
 * consumed batches, not of the prefetched ones.  Since a batch is a pure
 * function of its plan, and plans are made in step order by one planner,
 * neither the thread count nor the prefetch depth changes any batch.
 *
 * Errors of a worker are stored in the slot of the batch it was building and
 * returned by the pl_loader_next that asks for that batch; the loader then
 * fails and every later call returns PL_ECLOSED.
 */
#include "constructor.h"
#include "planner_internal.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

enum { PL__SLOT_EMPTY = 0, PL__SLOT_BUILDING, PL__SLOT_READY, PL__SLOT_ERROR };

typedef struct pl__slot {
    int64_t k;
    int state;
    int rc;
    pl__batchbuf *buf;
    char *msg; /* on error */
} pl__slot;

typedef struct pl__group {
    int64_t dp, cp;
    int64_t next_k;     /* next k to hand to a worker */
    int64_t first_member, n_members; /* its ranks: members[first ..] */
    int64_t at_min;     /* how many of them stand at min_cursor */
    int64_t min_cursor; /* least k not consumed by every rank of the group */
    pl__slot *slots;    /* [slot_cap], k at slots[k % slot_cap] */
    int64_t slot_cap;   /* >= depth; grows when a rank runs ahead of a peer */
    int64_t demand_k;   /* the largest k a consumer of the group waits for */
} pl__group;

typedef struct pl__served {
    pl_rank_info info;
    int64_t group;
    int64_t cursor; /* next k to return */
    pl_batch *current;
} pl__served;

typedef struct pl__entry {
    int64_t step;
    pl_plan *plan;          /* NULL when planning failed */
    void *blob;             /* state at the step's start */
    size_t blob_len;
    pl__src_state *src;     /* counters at the step's start */
    int rc;
    char msg[PL__ERRMSG_CAP];
} pl__entry;

typedef struct pl__worker {
    pl_loader *loader;
    pthread_t thread;
    int started;
    pl__build_ctx ctx;
    char err[PL__ERRMSG_CAP];
} pl__worker;

struct pl_loader {
    char errmsg[PL__ERRMSG_CAP];
    pl_config *cfg;
    pl_source **sources;
    int64_t n_sources;
    pl_planner *planner;
    pl__pool *pool;
    int64_t nmb;      /* micro-batches per rank per step */
    int64_t total_k;  /* train_steps * nmb, or -1 */
    int64_t depth;    /* prefetch */
    int n_threads;

    pthread_mutex_t mu;
    pthread_cond_t work_cv;  /* workers: a slot freed, or stop */
    pthread_cond_t ready_cv; /* consumers: a slot filled; workers: planned */
    int stopping, running, planning;
    int failed_reported; /* the failure was returned to a caller once */
    int sync_inited;     /* mu, work_cv and ready_cv exist */
    int64_t work_waiters, ready_waiters; /* threads blocked on each */
    int failed;

    pl__served *served;  /* sorted by rank */
    int64_t n_served;
    int64_t *members;    /* indices into served, grouped by group */
    pl__group *groups;
    int64_t n_groups;

    pl__entry **entries; /* steps [first_step, planned_steps) */
    int64_t n_entries, cap_entries;
    int64_t first_step;     /* step of entries[0] */
    int64_t planned_steps;  /* next step the planner will plan */
    int64_t start_k;        /* position at creation / set_state */

    pl__worker *workers;

    /* statistics */
    int64_t st_micro_batches, st_tokens, st_padding;
    double st_mom_sum, st_molb_sum;
    int64_t st_steps_folded;
    pl_source_summary *summary;
};

/* Condition waits that count their waiters, so that a wake-up costs no
 * system call when nobody waits (the common case once the queues are full). */
static void pl__wait(pthread_cond_t *cv, pthread_mutex_t *mu, int64_t *waiters) {
    (*waiters)++;
    pthread_cond_wait(cv, mu);
    (*waiters)--;
}

static void pl__wake(pthread_cond_t *cv, int64_t waiters) {
    if (waiters > 0) pthread_cond_broadcast(cv);
}

static int pl__fail(pl_loader *l, int rc, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int pl__fail(pl_loader *l, int rc, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    pl__vfmt(l->errmsg, sizeof l->errmsg, fmt, ap);
    va_end(ap);
    return rc;
}

static void pl__entry_free(pl__entry *e) {
    if (!e) return;
    pl_plan_free(e->plan);
    free(e->blob);
    free(e->src);
    free(e);
}

/* Make plan entries up to and including `step`.  Called with mu held and
 * planning == 0; drops mu while the planner works. */
static void pl__plan_until(pl_loader *l, int64_t step) {
    l->planning = 1;
    while (l->planned_steps <= step) {
        pthread_mutex_unlock(&l->mu);
        pl__entry *e = pl__calloc(1, sizeof *e);
        int rc = PL_ENOMEM;
        if (e) {
            e->step = l->planner->step;
            e->src = pl__calloc((size_t)l->n_sources, sizeof *e->src);
            rc = e->src ? pl__state_encode(l->planner, 0, &e->blob, &e->blob_len)
                        : PL_ENOMEM;
            if (!rc) {
                memcpy(e->src, l->planner->src,
                       (size_t)l->n_sources * sizeof *e->src);
                rc = pl_planner_next(l->planner, &e->plan);
                if (rc) pl__fmt(e->msg, sizeof e->msg, "%s",
                                pl_planner_errmsg(l->planner));
            } else {
                pl__fmt(e->msg, sizeof e->msg, "planner: out of memory");
            }
            e->rc = rc;
        }
        pthread_mutex_lock(&l->mu);
        if (!e) { /* nowhere to put the failure: fail the loader */
            l->failed = PL_ENOMEM;
            pl__fmt(l->errmsg, sizeof l->errmsg, "loader: out of memory");
            pl__wake(&l->ready_cv, l->ready_waiters);
            break;
        }
        if (l->n_entries == l->cap_entries) {
            int64_t nc = l->cap_entries ? l->cap_entries * 2 : 8;
            pl__entry **v = pl__realloc_array(l->entries, (size_t)nc, sizeof *v);
            if (!v) {
                pl__entry_free(e);
                l->failed = PL_ENOMEM;
                pl__fmt(l->errmsg, sizeof l->errmsg, "loader: out of memory");
                pl__wake(&l->ready_cv, l->ready_waiters);
                break;
            }
            l->entries = v;
            l->cap_entries = nc;
        }
        if (l->n_entries == 0) l->first_step = e->step;
        l->entries[l->n_entries++] = e;
        l->planned_steps++;
    }
    l->planning = 0;
    pl__wake(&l->ready_cv, l->ready_waiters);
}

static pl__entry *pl__entry_at(pl_loader *l, int64_t step) {
    int64_t i = step - l->first_step;
    if (i < 0 || i >= l->n_entries) return NULL;
    return l->entries[i];
}

static pl__slot *pl__slot_at(pl__group *gr, int64_t k) {
    return &gr->slots[k % gr->slot_cap];
}

/* Make room for k in the group's ring (a rank that runs more than `prefetch`
 * micro-batches ahead of a peer of its group keeps the batches the peer has
 * not taken yet).  mu held.  PL_OK or PL_ENOMEM. */
static int pl__slots_fit(pl__group *gr, int64_t k) {
    if (k - gr->min_cursor < gr->slot_cap) return PL_OK;
    int64_t cap = gr->slot_cap * 2;
    while (k - gr->min_cursor >= cap) cap *= 2;
    pl__slot *ns = pl__calloc((size_t)cap, sizeof *ns);
    if (!ns) return PL_ENOMEM;
    for (int64_t j = 0; j < cap; j++) ns[j].k = -1;
    for (int64_t j = 0; j < gr->slot_cap; j++) {
        pl__slot *o = &gr->slots[j];
        if (o->k >= gr->min_cursor) ns[o->k % cap] = *o;
    }
    free(gr->slots);
    gr->slots = ns;
    gr->slot_cap = cap;
    return PL_OK;
}

/* Pick the group furthest behind that may build; -1 if none. mu held. */
static int64_t pl__pick_group(pl_loader *l) {
    int64_t best = -1;
    for (int64_t g = 0; g < l->n_groups; g++) {
        pl__group *gr = &l->groups[g];
        if (gr->next_k >= gr->min_cursor + l->depth && gr->next_k > gr->demand_k)
            continue;
        if (l->total_k >= 0 && gr->next_k >= l->total_k) continue;
        if (best < 0 || gr->next_k < l->groups[best].next_k) best = g;
    }
    return best;
}

static void *pl__worker_main(void *arg) {
    pl__worker *w = arg;
    pl_loader *l = w->loader;
    pthread_mutex_lock(&l->mu);
    while (!l->stopping) {
        int64_t g = l->failed ? -1 : pl__pick_group(l);
        if (g < 0) {
            pl__wait(&l->work_cv, &l->mu, &l->work_waiters);
            continue;
        }
        pl__group *gr = &l->groups[g];
        int64_t k = gr->next_k;
        if (pl__slots_fit(gr, k)) {
            l->failed = PL_ENOMEM;
            pl__fmt(l->errmsg, sizeof l->errmsg, "loader: out of memory");
            pl__wake(&l->ready_cv, l->ready_waiters);
            continue;
        }
        gr->next_k++;
        pl__slot *slot = pl__slot_at(gr, k);
        slot->k = k;
        slot->state = PL__SLOT_BUILDING;
        int64_t step = k / l->nmb;
        while (l->planned_steps <= step && !l->stopping && !l->failed) {
            if (l->planning) pl__wait(&l->ready_cv, &l->mu, &l->ready_waiters);
            else pl__plan_until(l, step);
        }
        slot = pl__slot_at(gr, k); /* the ring may have grown meanwhile */
        pl__entry *e = pl__entry_at(l, step);
        if (!e) { /* stopping or failed */
            slot->state = PL__SLOT_ERROR;
            slot->rc = l->failed ? l->failed : PL_ECLOSED;
            free(slot->msg);
            slot->msg = pl__strdup(l->failed ? l->errmsg : "loader stopped");
            pl__wake(&l->ready_cv, l->ready_waiters);
            continue;
        }
        int rc = e->rc;
        pl__batchbuf *buf = NULL;
        if (!rc) {
            /* Entries are retired only after every rank consumed their step,
               and this slot's k is not consumed yet: e stays valid. */
            pthread_mutex_unlock(&l->mu);
            w->err[0] = '\0';
            rc = pl__pool_get(l->pool, &buf);
            if (rc) {
                pl__fmt(w->err, sizeof w->err, "loader: out of memory");
            } else {
                w->ctx.cp_rank = gr->cp;
                rc = pl__construct(&w->ctx, e->plan, gr->dp, k % l->nmb, buf);
                if (rc) {
                    pl__buf_release(buf);
                    buf = NULL;
                }
            }
            pthread_mutex_lock(&l->mu);
            slot = pl__slot_at(gr, k);
        }
        if (rc) {
            slot->state = PL__SLOT_ERROR;
            slot->rc = rc;
            free(slot->msg);
            slot->msg = pl__strdup(e->rc ? e->msg : w->err);
        } else {
            slot->buf = buf;
            slot->state = PL__SLOT_READY;
        }
        pl__wake(&l->ready_cv, l->ready_waiters);
    }
    pthread_mutex_unlock(&l->mu);
    return NULL;
}

static void pl__stop_workers(pl_loader *l) {
    pthread_mutex_lock(&l->mu);
    l->stopping = 1;
    pl__wake(&l->work_cv, l->work_waiters);
    pl__wake(&l->ready_cv, l->ready_waiters);
    pthread_mutex_unlock(&l->mu);
    for (int i = 0; i < l->n_threads; i++) {
        if (l->workers[i].started) pthread_join(l->workers[i].thread, NULL);
        l->workers[i].started = 0;
    }
    l->stopping = 0;
    l->running = 0;
}

/* Called with mu held (by pl_loader_next). */
static int pl__start_workers(pl_loader *l) {
    for (int i = 0; i < l->n_threads; i++) {
        if (pthread_create(&l->workers[i].thread, NULL, pl__worker_main,
                           &l->workers[i]) != 0) {
            /* Stop the ones that started; they need mu to see `stopping`. */
            l->stopping = 1;
            pthread_cond_broadcast(&l->work_cv);
            pthread_cond_broadcast(&l->ready_cv);
            pthread_mutex_unlock(&l->mu);
            for (int j = 0; j < i; j++) {
                pthread_join(l->workers[j].thread, NULL);
                l->workers[j].started = 0;
            }
            pthread_mutex_lock(&l->mu);
            l->stopping = 0;
            return pl__fail(l, PL_ENOMEM, "loader: cannot start worker thread");
        }
        l->workers[i].started = 1;
    }
    l->running = 1;
    return PL_OK;
}

/* Fold the statistics of a retired step. */
static void pl__fold_entry(pl_loader *l, const pl__entry *e) {
    if (!e->plan) return;
    const pl_plan *p = e->plan;
    double mx = 0, sum = 0;
    for (int64_t r = 0; r < p->dp; r++) {
        sum += p->rank_cost[r];
        if (p->rank_cost[r] > mx) mx = p->rank_cost[r];
    }
    if (sum > 0) l->st_mom_sum += mx / (sum / (double)p->dp);
    if (p->lower_bound > 0) l->st_molb_sum += mx / p->lower_bound;
    l->st_steps_folded++;
}

/* Least k not consumed by every served rank (each group keeps the least
 * of its ranks). */
static int64_t pl__min_cursor(const pl_loader *l) {
    int64_t m = INT64_MAX;
    for (int64_t g = 0; g < l->n_groups; g++)
        if (l->groups[g].min_cursor < m) m = l->groups[g].min_cursor;
    return l->n_groups ? m : 0;
}

static int pl__cmp_rank(const void *a, const void *b) {
    int64_t x = ((const pl__served *)a)->info.rank, y = ((const pl__served *)b)->info.rank;
    return (x > y) - (x < y);
}

typedef struct pl__gkey {
    int64_t dp, cp, idx;
} pl__gkey;

/* By (dp, cp), then served index (= rank order). */
static int pl__cmp_group(const void *a, const void *b) {
    const pl__gkey *x = a, *y = b;
    if (x->dp != y->dp) return x->dp < y->dp ? -1 : 1;
    if (x->cp != y->cp) return x->cp < y->cp ? -1 : 1;
    return (x->idx > y->idx) - (x->idx < y->idx);
}

/* Drop pipeline contents: slots, entries. Workers must be stopped. */
static void pl__clear_pipeline(pl_loader *l) {
    for (int64_t g = 0; g < l->n_groups; g++)
        for (int64_t j = 0; j < l->groups[g].slot_cap; j++) {
            pl__slot *s = &l->groups[g].slots[j];
            pl__buf_release(s->buf);
            free(s->msg);
            memset(s, 0, sizeof *s);
            s->k = -1;
        }
    for (int64_t i = 0; i < l->n_entries; i++) pl__entry_free(l->entries[i]);
    l->n_entries = 0;
}

/* Set every served rank's cursor to k and the pipeline to start there. */
static void pl__reset_position(pl_loader *l, int64_t k) {
    for (int64_t i = 0; i < l->n_served; i++) {
        l->served[i].cursor = k;
    }
    for (int64_t g = 0; g < l->n_groups; g++) {
        l->groups[g].next_k = k;
        l->groups[g].min_cursor = k;
        l->groups[g].at_min = l->groups[g].n_members;
        l->groups[g].demand_k = -1;
    }
    l->planned_steps = l->planner->step;
    l->first_step = l->planner->step;
    l->start_k = k;
}

int pl_loader_create(const pl_config *cfg, const pl_loader_options *opts,
                     pl_loader **out) {
    *out = NULL;
    pl_loader *l = pl__calloc(1, sizeof *l);
    if (!l) return PL_ENOMEM;
    *out = l;
    if (!cfg) return pl__fail(l, PL_EINVAL, "loader: config is NULL");
    if (opts && opts->version != PL_LOADER_OPTIONS_VERSION)
        return pl__fail(l, PL_EINVAL, "loader: options version %d, expected %d",
                        opts->version, PL_LOADER_OPTIONS_VERSION);
    if (pthread_mutex_init(&l->mu, NULL))
        return pl__fail(l, PL_ENOMEM, "loader: cannot create mutex");
    if (pthread_cond_init(&l->work_cv, NULL)) {
        pthread_mutex_destroy(&l->mu);
        return pl__fail(l, PL_ENOMEM, "loader: cannot create condition variable");
    }
    if (pthread_cond_init(&l->ready_cv, NULL)) {
        pthread_cond_destroy(&l->work_cv);
        pthread_mutex_destroy(&l->mu);
        return pl__fail(l, PL_ENOMEM, "loader: cannot create condition variable");
    }
    l->sync_inited = 1;
    l->cfg = pl__config_clone(cfg);
    if (!l->cfg) return pl__fail(l, PL_ENOMEM, "loader: out of memory");
    const pl_config *c = l->cfg;
    l->n_threads = opts && opts->threads > 0 ? opts->threads : c->threads;
    if (l->n_threads < 1) l->n_threads = 1;
    l->depth = opts && opts->prefetch > 0 ? opts->prefetch : c->prefetch;
    if (l->depth < 1) l->depth = 1;
    l->nmb = c->global_batch_size / (c->topology.dp * c->micro_batch_size);
    l->total_k = c->train_steps >= 0 ? c->train_steps * l->nmb : -1;

    /* Sources. */
    l->n_sources = c->n_sources;
    l->sources = pl__calloc((size_t)c->n_sources, sizeof *l->sources);
    l->summary = pl__calloc((size_t)c->n_sources, sizeof *l->summary);
    if (!l->sources || !l->summary)
        return pl__fail(l, PL_ENOMEM, "loader: out of memory");
    for (int64_t i = 0; i < c->n_sources; i++) {
        int rc = pl__config_open_source(c, i, &l->sources[i]);
        if (rc) {
            return pl__fail(l, rc, "source '%s': %s", c->sources[i].name,
                            l->sources[i] ? pl_source_errmsg(l->sources[i])
                                          : "out of memory");
        }
    }
    int rc = pl_planner_create(c, l->sources, l->n_sources, &l->planner);
    if (rc) return pl__fail(l, rc, "%s", pl_planner_errmsg(l->planner));

    /* Served ranks and their groups. */
    int64_t world = pl_config_world_size(c);
    l->n_served = opts && opts->ranks ? opts->n_ranks : world;
    if (l->n_served <= 0)
        return pl__fail(l, PL_EINVAL, "loader: no ranks to serve");
    l->served = pl__calloc((size_t)l->n_served, sizeof *l->served);
    l->groups = pl__calloc((size_t)l->n_served, sizeof *l->groups);
    if (!l->served || !l->groups)
        return pl__fail(l, PL_ENOMEM, "loader: out of memory");
    for (int64_t i = 0; i < l->n_served; i++) {
        int64_t rank = opts && opts->ranks ? opts->ranks[i] : i;
        rc = pl_config_rank_info(c, rank, &l->served[i].info);
        if (rc)
            return pl__fail(l, rc, "loader: rank %lld out of range [0, %lld)",
                            (long long)rank, (long long)world);
    }
    /* Served ranks sorted by rank (looked up by binary search), and groups
       numbered in (dp, cp) order; n log n, for loaders that serve a whole
       large topology. */
    qsort(l->served, (size_t)l->n_served, sizeof *l->served, pl__cmp_rank);
    for (int64_t i = 1; i < l->n_served; i++)
        if (l->served[i].info.rank == l->served[i - 1].info.rank)
            return pl__fail(l, PL_EINVAL, "loader: rank %lld given twice",
                            (long long)l->served[i].info.rank);
    l->members = pl__calloc((size_t)l->n_served, sizeof *l->members);
    if (!l->members) return pl__fail(l, PL_ENOMEM, "loader: out of memory");
    pl__gkey *keys = pl__calloc((size_t)l->n_served, sizeof *keys);
    if (!keys) return pl__fail(l, PL_ENOMEM, "loader: out of memory");
    for (int64_t i = 0; i < l->n_served; i++)
        keys[i] = (pl__gkey){l->served[i].info.dp_rank, l->served[i].info.cp_rank, i};
    qsort(keys, (size_t)l->n_served, sizeof *keys, pl__cmp_group);
    for (int64_t i = 0; i < l->n_served; i++) l->members[i] = keys[i].idx;
    free(keys);
    for (int64_t j = 0; j < l->n_served; j++) {
        const pl_rank_info *ri = &l->served[l->members[j]].info;
        pl__group *last = l->n_groups ? &l->groups[l->n_groups - 1] : NULL;
        if (!last || last->dp != ri->dp_rank || last->cp != ri->cp_rank) {
            pl__group *g = &l->groups[l->n_groups++];
            g->dp = ri->dp_rank;
            g->cp = ri->cp_rank;
            g->first_member = j;
            g->slots = pl__calloc((size_t)l->depth, sizeof(pl__slot));
            g->slot_cap = l->depth;
            if (!g->slots) return pl__fail(l, PL_ENOMEM, "loader: out of memory");
            for (int64_t t = 0; t < l->depth; t++) g->slots[t].k = -1;
            last = g;
        }
        last->n_members++;
        l->served[l->members[j]].group = l->n_groups - 1;
    }

    /* Batch memory and workers. */
    int64_t cp = c->topology.cp;
    rc = pl__pool_create(c->micro_batch_size, c->seq_length / cp, c->seq_length,
                         c->dtype, &l->pool);
    if (rc) return pl__fail(l, rc, "loader: out of memory");
    l->workers = pl__calloc((size_t)l->n_threads, sizeof *l->workers);
    if (!l->workers) return pl__fail(l, PL_ENOMEM, "loader: out of memory");
    for (int i = 0; i < l->n_threads; i++) {
        pl__worker *w = &l->workers[i];
        w->loader = l;
        w->ctx.sources = l->sources;
        if (pl__build_ctx_init(&w->ctx, c, pl__read_from_sources, w->err,
                               sizeof w->err))
            return pl__fail(l, PL_ENOMEM, "loader: out of memory");
    }
    pl__reset_position(l, 0);
    return PL_OK;
}

void pl_loader_free(pl_loader *l) {
    if (!l) return;
    if (l->running) pl__stop_workers(l);
    if (l->groups) pl__clear_pipeline(l);
    for (int64_t i = 0; l->served && i < l->n_served; i++)
        pl_batch_release(l->served[i].current);
    for (int64_t g = 0; g < l->n_groups; g++) free(l->groups[g].slots);
    free(l->groups);
    free(l->served);
    free(l->members);
    free(l->entries);
    for (int i = 0; l->workers && i < l->n_threads; i++) free(l->workers[i].ctx.seg);
    free(l->workers);
    pl__pool_release_owner(l->pool);
    pl_planner_free(l->planner);
    for (int64_t i = 0; l->sources && i < l->n_sources; i++)
        pl_source_free(l->sources[i]);
    free(l->sources);
    free(l->summary);
    pl_config_free(l->cfg);
    if (l->sync_inited) {
        pthread_cond_destroy(&l->work_cv);
        pthread_cond_destroy(&l->ready_cv);
        pthread_mutex_destroy(&l->mu);
    }
    free(l);
}

const char *pl_loader_errmsg(const pl_loader *l) {
    return l ? l->errmsg : "out of memory";
}

const pl_config *pl_loader_config(const pl_loader *l) { return l->cfg; }

static pl__served *pl__find_served(pl_loader *l, int64_t rank) {
    int64_t lo = 0, hi = l->n_served;
    while (lo < hi) {
        int64_t mid = lo + (hi - lo) / 2;
        if (l->served[mid].info.rank < rank) lo = mid + 1;
        else hi = mid;
    }
    return lo < l->n_served && l->served[lo].info.rank == rank ? &l->served[lo]
                                                               : NULL;
}

/* After rank s consumed a batch: advance its group's min cursor, free slots,
 * retire fully consumed steps. mu held. */
static void pl__advance(pl_loader *l, pl__served *s) {
    pl__group *gr = &l->groups[s->group];
    /* s's cursor moved from c-1 to c.  The group's least cursor moves only
       when the last rank standing at it leaves: amortized O(1) per call. */
    int64_t m = gr->min_cursor;
    if (s->cursor - 1 == gr->min_cursor && --gr->at_min == 0) {
        m = INT64_MAX;
        for (int64_t j = 0; j < gr->n_members; j++) {
            int64_t c = l->served[l->members[gr->first_member + j]].cursor;
            if (c < m) {
                m = c;
                gr->at_min = 0;
            }
            if (c == m) gr->at_min++;
        }
    }
    for (int64_t k = gr->min_cursor; k < m; k++) {
        pl__slot *slot = pl__slot_at(gr, k);
        if (slot->k == k && slot->buf) {
            l->st_tokens += slot->buf->b.tokens;
            l->st_padding += slot->buf->b.rows * slot->buf->b.cols - slot->buf->b.tokens;
            pl__buf_release(slot->buf);
            slot->buf = NULL;
            slot->state = PL__SLOT_EMPTY;
        }
    }
    if (m > gr->min_cursor) {
        gr->min_cursor = m;
        pl__wake(&l->work_cv, l->work_waiters);
    }
    int64_t done_step = pl__min_cursor(l) / l->nmb;
    int64_t drop = 0;
    while (drop < l->n_entries && l->entries[drop]->step < done_step) {
        pl__fold_entry(l, l->entries[drop]);
        pl__entry_free(l->entries[drop]);
        drop++;
    }
    if (drop) {
        memmove(l->entries, l->entries + drop,
                (size_t)(l->n_entries - drop) * sizeof *l->entries);
        l->n_entries -= drop;
        l->first_step += drop;
    }
}

int pl_loader_next(pl_loader *l, int64_t rank, pl_batch **out) {
    *out = NULL;
    pl__served *s = pl__find_served(l, rank);
    if (!s) {
        pthread_mutex_lock(&l->mu);
        int rc = pl__fail(l, PL_ERANGE, "loader: rank %lld is not served by this loader",
                          (long long)rank);
        pthread_mutex_unlock(&l->mu);
        return rc;
    }
    pl_batch *prev = s->current;
    s->current = NULL;
    pl_batch_release(prev);
    pthread_mutex_lock(&l->mu);
    int64_t k = s->cursor;
    if (!l->failed && l->total_k >= 0 && k >= l->total_k) {
        pthread_mutex_unlock(&l->mu);
        return PL_DONE;
    }
    if (!l->failed && !l->running) {
        int rc = pl__start_workers(l);
        if (rc) {
            pthread_mutex_unlock(&l->mu);
            return rc;
        }
    }
    pl__group *gr = &l->groups[s->group];
    if (k > gr->demand_k) { /* a k beyond the prefetch window is still built */
        gr->demand_k = k;
        pl__wake(&l->work_cv, l->work_waiters);
    }
    pl__slot *slot = pl__slot_at(gr, k);
    while (!l->failed && !(slot->k == k && slot->state >= PL__SLOT_READY)) {
        pl__wait(&l->ready_cv, &l->mu, &l->ready_waiters);
        slot = pl__slot_at(gr, k); /* the ring may have grown */
    }
    if (!l->failed && slot->state == PL__SLOT_ERROR) {
        pl__fmt(l->errmsg, sizeof l->errmsg, "%s", slot->msg ? slot->msg : "");
        l->failed = slot->rc;
        /* wake every waiter: no batch comes after a failure */
        pl__wake(&l->work_cv, l->work_waiters);
        pl__wake(&l->ready_cv, l->ready_waiters);
    }
    if (l->failed) {
        /* The first caller to see the failure gets its code and message;
           later calls get PL_ECLOSED (the message stays). */
        int rc = l->failed_reported ? PL_ECLOSED : l->failed;
        l->failed_reported = 1;
        pthread_mutex_unlock(&l->mu);
        return rc;
    }
    int rc = pl__view_create(slot->buf, s->info.fields, out);
    if (rc) {
        pl__fmt(l->errmsg, sizeof l->errmsg, "loader: out of memory");
        pthread_mutex_unlock(&l->mu);
        return rc;
    }
    s->current = *out;
    s->cursor++;
    l->st_micro_batches++;
    pl__advance(l, s);
    pthread_mutex_unlock(&l->mu);
    return PL_OK;
}

/* Patch the micro-batch cursor of a blob and re-seal its CRC. */
static void pl__blob_set_cursor(void *blob, size_t len, int64_t mb, int64_t dp) {
    unsigned char *b = blob;
    memcpy(b + 32, &mb, 8);
    memcpy(b + 40, &dp, 8);
    uint32_t crc = pl__crc32(0, b, len - 4);
    memcpy(b + len - 4, &crc, 4);
}

int pl_loader_get_state(pl_loader *l, void *buf, size_t cap, size_t *len) {
    pthread_mutex_lock(&l->mu);
    while (l->planning) pl__wait(&l->ready_cv, &l->mu, &l->ready_waiters);
    int64_t k = pl__min_cursor(l);
    int64_t step = k / l->nmb, mb = k % l->nmb;
    void *blob = NULL;
    size_t n = 0;
    int rc = PL_OK;
    pl__entry *e = pl__entry_at(l, step);
    if (e && e->blob) {
        blob = malloc(e->blob_len);
        if (blob) memcpy(blob, e->blob, e->blob_len);
        n = e->blob_len;
        if (!blob) rc = PL_ENOMEM;
    } else if (l->planner->step == step) {
        rc = pl__state_encode(l->planner, 0, &blob, &n);
    } else {
        rc = PL_ESTATE;
        pl__fmt(l->errmsg, sizeof l->errmsg,
                "loader: no state for step %lld (planner failed earlier)",
                (long long)step);
    }
    pthread_mutex_unlock(&l->mu);
    if (rc) {
        free(blob);
        if (rc == PL_ENOMEM) pl__fmt(l->errmsg, sizeof l->errmsg, "loader: out of memory");
        return rc;
    }
    pl__blob_set_cursor(blob, n, mb, l->cfg->topology.dp);
    *len = n;
    if (buf) {
        if (cap < n) {
            free(blob);
            return pl__fail(l, PL_EINVAL, "state buffer too small: %zu bytes, need %zu",
                            cap, n);
        }
        memcpy(buf, blob, n);
    }
    free(blob);
    return PL_OK;
}

int pl_loader_set_state(pl_loader *l, const void *buf, size_t len) {
    /* Keep the current position, to return to it if the blob is refused. */
    size_t cur_len = 0;
    void *cur = NULL;
    int rc = pl_loader_get_state(l, NULL, 0, &cur_len);
    if (!rc && !(cur = malloc(cur_len))) rc = PL_ENOMEM;
    if (!rc) rc = pl_loader_get_state(l, cur, cur_len, &cur_len);
    if (rc) {
        free(cur);
        return pl__fail(l, rc, "loader: cannot save the current position: %s",
                        pl_strerror(rc));
    }
    if (l->running) pl__stop_workers(l);
    pl__clear_pipeline(l);
    int64_t mb = 0;
    rc = pl__state_decode(l->planner, buf, len, l->nmb, l->cfg->topology.dp, &mb);
    if (rc) { /* continue from where the loader was */
        pl__fmt(l->errmsg, sizeof l->errmsg, "%s", pl_planner_errmsg(l->planner));
        int64_t cur_mb = 0;
        if (pl__state_decode(l->planner, cur, cur_len, l->nmb, 0, &cur_mb) == PL_OK)
            pl__reset_position(l, l->planner->step * l->nmb + cur_mb);
        free(cur);
        return rc;
    }
    free(cur);
    l->failed = 0;
    l->failed_reported = 0;
    pl__reset_position(l, l->planner->step * l->nmb + mb);
    l->st_micro_batches = l->st_tokens = l->st_padding = 0;
    l->st_mom_sum = l->st_molb_sum = 0;
    l->st_steps_folded = 0;
    return PL_OK;
}

int pl_loader_get_stats(pl_loader *l, pl_loader_stats *out) {
    memset(out, 0, sizeof *out);
    pthread_mutex_lock(&l->mu);
    while (l->planning) pl__wait(&l->ready_cv, &l->mu, &l->ready_waiters);
    int64_t k = pl__min_cursor(l);
    int64_t step = k / l->nmb;
    out->steps = step - l->start_k / l->nmb;
    if (out->steps < 0) out->steps = 0;
    out->micro_batches = l->st_micro_batches;
    out->tokens = l->st_tokens;
    out->padding_tokens = l->st_padding;
    /* include consumed-but-not-yet-folded slots: none, tokens are folded when
       every rank of a group consumed them */
    if (l->st_steps_folded > 0) {
        out->max_over_mean = l->st_mom_sum / (double)l->st_steps_folded;
        out->max_over_lower_bound = l->st_molb_sum / (double)l->st_steps_folded;
    }
    const pl__src_state *src;
    pl__entry *e = pl__entry_at(l, step);
    if (e) src = e->src;
    else src = l->planner->src; /* the planner stands at `step` */
    double drawn_all = 0, target_all = 0;
    for (int64_t i = 0; i < l->n_sources; i++) {
        drawn_all += (double)src[i].drawn_tokens;
        target_all += src[i].target_tokens;
    }
    for (int64_t i = 0; i < l->n_sources; i++) {
        pl_source_summary *m = &l->summary[i];
        m->name = l->cfg->sources[i].name;
        m->documents = src[i].documents;
        m->tokens = src[i].drawn_tokens;
        m->epochs_completed = src[i].epoch;
        m->skipped = src[i].skipped;
        out->skipped += src[i].skipped;
        m->realized_fraction = drawn_all > 0 ? (double)src[i].drawn_tokens / drawn_all : 0;
        m->scheduled_fraction = target_all > 0 ? src[i].target_tokens / target_all : 0;
    }
    out->n_sources = l->n_sources;
    out->sources = l->summary;
    pthread_mutex_unlock(&l->mu);
    return PL_OK;
}
