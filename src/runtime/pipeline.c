/*
 * pipeline.c -- the step ledger that both deployments drive
 * (docs/internals/design.md, "One pipeline, many transports"; the contract is
 * in polyload.h).
 *
 * Positions are micro-batch numbers k = step * nmb + micro_batch.  Work is
 * cut into units of `unit` micro-batches that never cross a step: unit u is
 * micro-batches [k0(u), k0(u) + n(u)) with u = step * ups + j.  Each group
 * has a fixed ring of `cap` unit slots, holding units [lo_u, next_u): lo_u is
 * the oldest unit some rank of the group still needs, next_u the next one
 * to hand to a driver.  A driver may build unit u of a group when
 *   u < (unit of the least attached cursor) + depth_u,  or u <= demand_u
 * (a rank waits for it), and u - lo_u < cap.  depth_u counts the unit being
 * consumed plus ceil(prefetch / unit) units ahead of it, so the next unit is
 * built while the current one is consumed even when a unit is the whole
 * prefetch.  Consumers wake drivers only when that admission can have changed
 * (the least attached cursor entered another unit, or a unit was released),
 * not per micro-batch.  The lag policy bounds lo_u:
 * a rank more than lag_k micro-batches behind the group's lead is dropped,
 * so cap = depth_u + lag_u + 2 slots always suffice and nothing grows.
 *
 * Step entries (plan, blob of the step's start, aux) live from the step the
 * pipeline stands at until no group needs their units and the consumed
 * position has passed them.  The consumed position is the least cursor of
 * the ranks not dropped; its blob is the entry's, re-targeted to the
 * micro-batch (pl_state_retarget).  Statistics follow the embedded loader:
 * tokens of a micro-batch count once every rank of its group took it;
 * imbalance is folded when the position passes a step.
 *
 * One mutex guards everything; drivers wait on work_cv, consumers and
 * get_state on ready_cv.  Item release callbacks run with the mutex held.
 *
 * Held wake-ups (pl__pipeline_defer_wakes).  A consumer faster than the
 * drivers waits for nearly every unit, and each wake-up costs the waker a
 * futex call and the sleeper a context switch (tens of microseconds on a
 * virtual machine, where waking an idle CPU is an interrupt through the
 * hypervisor: more than building a small unit).  With deferral on, a driver
 * that finishes a unit a consumer waits for holds the wake-up while units
 * are cheap: it goes out once defer_units units are finished since it was
 * held (the held one included), when a unit finishes or is handed out
 * PL__DEFER_MAX_US or more after it was first held, at once for a unit that
 * took PL__DEFER_UNIT_US or more to build, and whenever a driver is about
 * to wait, plan or leave get_work without a unit.  So a waiting consumer
 * finds several units ready and a held wake-up never outlives the drivers'
 * work; the longest hold is PL__DEFER_MAX_US plus the build of one unit
 * handed out just before that (a unit that turns out slow is only seen as
 * such when it finishes).  Errors and state or statistics waiters are
 * woken at once.
 */
#include "runtime/runtime.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum { PL__U_EMPTY = 0, PL__U_BUILDING, PL__U_READY, PL__U_ERROR };

typedef struct pl__uslot {
    int64_t u;         /* unit number held, -1 if none */
    int state;
    int rc;
    int64_t pins;      /* ranks holding its item between two next calls */
    void *item;
    char *msg;
    double t_given;    /* when a driver took it (us, CLOCK_MONOTONIC) */
    int64_t *tokens;   /* [unit] statistics per micro-batch */
    int64_t *padding;
} pl__uslot;

typedef struct pl__pgroup {
    int64_t dp, cp;
    int64_t first_member, n_members;
    int64_t next_u, lo_u, demand_u;
    int64_t lead_k;    /* largest cursor of its ranks */
    int64_t counted_k; /* micro-batches below it are in the statistics */
    pl__uslot *slots;  /* [cap] */
} pl__pgroup;

typedef struct pl__prank {
    pl_rank_info info;
    int64_t group;
    int64_t cursor;
    int64_t pin;       /* unit pinned, -1 */
    int64_t wait_u;    /* unit its consumer waits for in next, -1 */
    int attached, lagged;
    int failed_reported; /* this rank was given a failed unit's status */
} pl__prank;

typedef struct pl__pentry {
    int64_t step;
    pl_plan *plan;
    void *blob;
    size_t blob_len;
    void *aux;
    void (*aux_free)(void *);
    int rc;
    char *msg;
} pl__pentry;

struct pl_pipeline {
    char errmsg[PL__ERRMSG_CAP];
    pl_config *cfg;
    int64_t nmb, unit, ups, total_steps, total_k;
    int64_t depth_u, lag_k, cap;
    int group_by_cp;
    pl_item_release_fn release;
    void *release_ctx;
    void (*retain)(void *item, int64_t index, void *ctx);

    pthread_mutex_t mu;
    pthread_cond_t work_cv, ready_cv;
    int64_t work_cv_n, ready_cv_n; /* waiters */
    int pend_work_cv, pend_ready_cv; /* broadcasts due at the next unlock */
    int64_t ready_other_n; /* waiters on ready_cv for a state or statistics */
    int sync_inited;
    int closed, failed, failed_reported;
    char fail_msg[PL__ERRMSG_CAP];
    uint64_t generation;

    pl__prank *ranks; /* sorted by rank */
    int64_t n_ranks;
    int64_t *members; /* indices into ranks, grouped */
    pl__pgroup *groups;
    int64_t n_groups;

    pl__pentry **entries; /* steps [first_step, first_step + n_entries) */
    int64_t n_entries, cap_entries, first_step;
    int64_t next_plan_step; /* next step to add */
    int64_t asked;          /* steps granted from next_plan_step (a PL_WORK_PLAN
                               for it is out; pl__pipeline_grant: more than one) */
    int64_t plan_ahead;     /* steps planned past the step of a group's next unit */
    int64_t plan_low;       /* ... asked for again once no more than this many are
                               (<= plan_ahead; pl__pipeline_plan_window) */
    int64_t defer_units;    /* held consumer wake-ups go out after this many units */
    int64_t held;           /* units finished since a wake-up was held; 0: none */
    double held_since;      /* when it was first held (us) */

    void *base_blob; /* state of base_step's start */
    size_t base_len;
    int64_t base_step, start_k;
    /* A blob given by pl_pipeline_attach_state for a step without an entry
       yet (the position stands at a step whose package has not arrived). */
    void *loose_blob;
    size_t loose_len;
    int64_t loose_step;

    int64_t folded_step; /* steps below it are folded in the imbalance */
    int64_t st_micro_batches, st_tokens, st_padding, st_folded;
    double st_mom_sum, st_molb_sum;
};

/* A unit that took this long to build wakes its consumer at once, and a
 * wake-up is held no longer than PL__DEFER_MAX_US (header comment). */
#define PL__DEFER_UNIT_US 200.0
#define PL__DEFER_MAX_US 500.0

/* ------------------------------------------------------------- helpers */

static double now_us(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e6 + (double)t.tv_nsec / 1e3;
}

static void set_msg(char *err, size_t cap, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void set_msg(char *err, size_t cap, const char *fmt, ...) {
    if (!err || !cap) return;
    va_list ap;
    va_start(ap, fmt);
    pl__vfmt(err, cap, fmt, ap);
    va_end(ap);
}

static int64_t unit_of(const pl_pipeline *p, int64_t k) {
    return (k / p->nmb) * p->ups + (k % p->nmb) / p->unit;
}
static int64_t unit_k0(const pl_pipeline *p, int64_t u) {
    return (u / p->ups) * p->nmb + (u % p->ups) * p->unit;
}
static int64_t unit_n(const pl_pipeline *p, int64_t u) {
    int64_t first = (u % p->ups) * p->unit;
    return p->nmb - first < p->unit ? p->nmb - first : p->unit;
}
static pl__uslot *slot(pl_pipeline *p, pl__pgroup *g, int64_t u) {
    return &g->slots[u % p->cap];
}
static pl__pentry *entry_of(pl_pipeline *p, int64_t step) {
    int64_t i = step - p->first_step;
    return i >= 0 && i < p->n_entries ? p->entries[i] : NULL;
}

/* Condition variables that count their waiters, so that a wake-up costs no
 * system call when nobody waits (the common case once the rings are full).
 * A wake-up is only noted under the mutex and sent by pipe_unlock once the
 * mutex is free (or before the caller itself waits): a thread woken while
 * the waker still held the mutex would run only to block on it again, two
 * more context switches per hand-off.  Waiters re-check their conditions
 * under the mutex, so a broadcast after the unlock loses nothing. */
#define wake_cv(cv) wake_waiters(&p->cv##_n, &p->pend_##cv)
#define wait_cv(cv, mu, dl) wait_until(p, &p->cv, (mu), (dl), &p->cv##_n)
static void wake_waiters(const int64_t *waiters, int *pending) {
    if (*waiters > 0) *pending = 1;
}

static void pipe_unlock(pl_pipeline *p) {
    int w = p->pend_work_cv, r = p->pend_ready_cv;
    p->pend_work_cv = p->pend_ready_cv = 0;
    pthread_mutex_unlock(&p->mu);
    if (w) pthread_cond_broadcast(&p->work_cv);
    if (r) pthread_cond_broadcast(&p->ready_cv);
}

/* Wait with an absolute deadline (NULL: none); PL_ETIMEDOUT when it passed.
 * The wake-ups noted so far go out first (they cannot wait for an unlock). */
static int wait_until(pl_pipeline *p, pthread_cond_t *cv, pthread_mutex_t *mu,
                     const struct timespec *deadline, int64_t *waiters) {
    if (p->pend_work_cv) pthread_cond_broadcast(&p->work_cv);
    if (p->pend_ready_cv) pthread_cond_broadcast(&p->ready_cv);
    p->pend_work_cv = p->pend_ready_cv = 0;
    int rc = PL_OK;
    (*waiters)++;
    if (!deadline)
        pthread_cond_wait(cv, mu);
    else if (pthread_cond_timedwait(cv, mu, deadline) == ETIMEDOUT)
        rc = PL_ETIMEDOUT;
    (*waiters)--;
    return rc;
}

/* Deadline for timeout_ms (< 0: none, *use = 0). */
static void deadline_from(int64_t timeout_ms, struct timespec *ts, int *use) {
    *use = timeout_ms >= 0;
    if (!*use) return;
    clock_gettime(CLOCK_REALTIME, ts);
    ts->tv_sec += (time_t)(timeout_ms / 1000);
    ts->tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
    if (ts->tv_nsec >= 1000000000L) {
        ts->tv_sec++;
        ts->tv_nsec -= 1000000000L;
    }
}
static int deadline_passed(const struct timespec *ts) {
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    return now.tv_sec > ts->tv_sec ||
           (now.tv_sec == ts->tv_sec && now.tv_nsec >= ts->tv_nsec);
}

static void slot_clear(pl_pipeline *p, pl__uslot *s) {
    if (s->item && p->release) p->release(s->item, p->release_ctx);
    free(s->msg);
    int64_t *t = s->tokens, *pd = s->padding;
    memset(s, 0, sizeof *s);
    s->tokens = t;
    s->padding = pd;
    s->u = -1;
}

static void entry_free(pl__pentry *e) {
    if (!e) return;
    pl_plan_free(e->plan);
    free(e->blob);
    if (e->aux && e->aux_free) e->aux_free(e->aux);
    free(e->msg);
    free(e);
}

/* Least cursor of the group's ranks that were not dropped (and, with
 * attached_only, that asked for a batch); -1 if none. */
static int64_t group_min(const pl_pipeline *p, const pl__pgroup *g,
                             int attached_only) {
    int64_t m = -1;
    for (int64_t j = 0; j < g->n_members; j++) {
        const pl__prank *r = &p->ranks[p->members[g->first_member + j]];
        if (r->lagged || (attached_only && !r->attached)) continue;
        if (m < 0 || r->cursor < m) m = r->cursor;
    }
    return m;
}

/* Does a consumer of group g wait for unit u? */
static int group_waits(const pl_pipeline *p, const pl__pgroup *g, int64_t u) {
    for (int64_t j = 0; j < g->n_members; j++)
        if (p->ranks[p->members[g->first_member + j]].wait_u == u) return 1;
    return 0;
}

/* Consumed position: least cursor of every rank not dropped. */
static int64_t consumed_position(const pl_pipeline *p) {
    int64_t m = -1;
    for (int64_t i = 0; i < p->n_ranks; i++)
        if (!p->ranks[i].lagged && (m < 0 || p->ranks[i].cursor < m))
            m = p->ranks[i].cursor;
    return m < 0 ? p->start_k : m;
}

/* The unit the group's window admits next (ignoring whether its step is
 * planned and train_steps): whether unit next_u may be built. */
static int window_admits(const pl_pipeline *p, const pl__pgroup *g) {
    int64_t u = g->next_u;
    if (u - g->lo_u >= p->cap) return 0;
    int64_t a = group_min(p, g, 1);
    if (a < 0) a = group_min(p, g, 0);
    if (a < 0) return 0; /* every rank dropped */
    return u < unit_of(p, a) + p->depth_u || u <= g->demand_u;
}

static int units_done(const pl_pipeline *p, const pl__pgroup *g) {
    return p->total_steps >= 0 && g->next_u / p->ups >= p->total_steps;
}

/* Fold the imbalance of steps the position passed. */
static void fold(pl_pipeline *p) {
    int64_t pos_step = consumed_position(p) / p->nmb;
    while (p->folded_step < pos_step) {
        pl__pentry *e = entry_of(p, p->folded_step);
        if (!e) break;
        if (e->plan) {
            const pl_plan *pl = e->plan;
            double mx = 0, sum = 0;
            for (int64_t r = 0; r < pl->dp; r++) {
                sum += pl->rank_cost[r];
                if (pl->rank_cost[r] > mx) mx = pl->rank_cost[r];
            }
            if (sum > 0) p->st_mom_sum += mx / (sum / (double)pl->dp);
            if (pl->lower_bound > 0) p->st_molb_sum += mx / pl->lower_bound;
            p->st_folded++;
        }
        p->folded_step++;
    }
}

/* Retire entries no group and no position needs. */
static void retire_entries(pl_pipeline *p) {
    int64_t keep = consumed_position(p) / p->nmb;
    for (int64_t g = 0; g < p->n_groups; g++) {
        int64_t s = p->groups[g].lo_u / p->ups;
        if (s < keep) keep = s;
    }
    if (p->folded_step < keep) keep = p->folded_step;
    int64_t drop = 0;
    while (drop < p->n_entries && p->entries[drop]->step < keep) {
        entry_free(p->entries[drop]);
        drop++;
    }
    if (drop) {
        memmove(p->entries, p->entries + drop,
                (size_t)(p->n_entries - drop) * sizeof *p->entries);
        p->n_entries -= drop;
        p->first_step += drop;
    }
}

/* After a cursor of group g moved (or a rank was dropped): count statistics,
 * release units, retire entries, wake drivers. */
static void advance(pl_pipeline *p, pl__pgroup *g) {
    int64_t m = group_min(p, g, 0);
    if (m < 0) m = g->lead_k;
    for (int64_t k = g->counted_k; k < m; k++) {
        int64_t u = unit_of(p, k);
        pl__uslot *s = slot(p, g, u);
        if (s->u == u && s->state == PL__U_READY) {
            int64_t i = k - unit_k0(p, u);
            p->st_tokens += s->tokens[i];
            p->st_padding += s->padding[i];
        }
    }
    if (m > g->counted_k) g->counted_k = m;
    int64_t lo0 = g->lo_u;
    while (g->lo_u < g->next_u) {
        int64_t u = g->lo_u;
        pl__uslot *s = slot(p, g, u);
        if (s->u == u && (s->state == PL__U_BUILDING || s->pins > 0)) break;
        if (unit_k0(p, u) + unit_n(p, u) > m) break;
        if (s->u == u) slot_clear(p, s);
        g->lo_u++;
    }
    if (g->lo_u != lo0) wake_cv(work_cv);
    fold(p);
    retire_entries(p);
}

/* Drop the ranks of g that are more than lag_k behind its lead. */
static void apply_lag(pl_pipeline *p, pl__pgroup *g) {
    for (int64_t j = 0; j < g->n_members; j++) {
        pl__prank *r = &p->ranks[p->members[g->first_member + j]];
        if (r->lagged || g->lead_k - r->cursor <= p->lag_k) continue;
        r->lagged = 1;
        if (r->pin >= 0) {
            pl__uslot *s = slot(p, g, r->pin);
            if (s->u == r->pin) s->pins--;
            r->pin = -1;
        }
        wake_cv(ready_cv); /* it may be waiting */
    }
}

/* ------------------------------------------------------------ lifecycle */

static int cmp_rank(const void *a, const void *b) {
    int64_t x = ((const pl__prank *)a)->info.rank, y = ((const pl__prank *)b)->info.rank;
    return (x > y) - (x < y);
}

typedef struct pl__pkey {
    int64_t dp, cp, idx;
} pl__pkey;
static int cmp_key(const void *a, const void *b) {
    const pl__pkey *x = a, *y = b;
    if (x->dp != y->dp) return x->dp < y->dp ? -1 : 1;
    if (x->cp != y->cp) return x->cp < y->cp ? -1 : 1;
    return (x->idx > y->idx) - (x->idx < y->idx);
}

static int pfail(pl_pipeline *p, int rc, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int pfail(pl_pipeline *p, int rc, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    pl__vfmt(p->errmsg, sizeof p->errmsg, fmt, ap);
    va_end(ap);
    pl__thread_err(p->errmsg);
    return rc;
}

int pl_pipeline_create(const pl_config *cfg, const pl_pipeline_options *o,
                       pl_pipeline **out) {
    *out = NULL;
    pl_pipeline *p = pl__calloc(1, sizeof *p);
    if (!p) return PL_ENOMEM;
    *out = p;
    if (!cfg) return pfail(p, PL_EINVAL, "pipeline: config is NULL");
    if (o && o->version != PL_PIPELINE_OPTIONS_VERSION)
        return pfail(p, PL_EINVAL, "pipeline: options version %d, expected %d",
                         o->version, PL_PIPELINE_OPTIONS_VERSION);
    p->cfg = pl__config_share(cfg);
    if (!p->cfg) return pfail(p, PL_ENOMEM, "pipeline: out of memory");
    const pl_config *c = p->cfg;
    p->nmb = c->global_batch_size / (c->topology.dp * c->micro_batch_size);
    p->unit = o && o->unit > 0 ? o->unit : 1;
    if (p->unit > p->nmb) p->unit = p->nmb;
    p->ups = (p->nmb + p->unit - 1) / p->unit;
    p->total_steps = c->train_steps;
    p->total_k = c->train_steps >= 0 ? c->train_steps * p->nmb : -1;
    int64_t prefetch = o && o->prefetch > 0 ? o->prefetch : c->prefetch;
    if (prefetch < 1) prefetch = 1;
    p->depth_u = (prefetch + p->unit - 1) / p->unit + 1;
    int64_t lag_steps = o && o->max_lag_steps > 0 ? o->max_lag_steps : c->max_lag_steps;
    if (lag_steps < 1) lag_steps = 1;
    p->lag_k = lag_steps * p->nmb;
    p->cap = p->depth_u + lag_steps * p->ups + 2;
    p->group_by_cp = o ? o->group_by_cp : 1;
    p->release = o ? o->release : NULL;
    p->release_ctx = o ? o->release_ctx : NULL;
    p->retain = o ? o->retain : NULL;
    if (prefetch > ((int64_t)1 << 20) || lag_steps > ((int64_t)1 << 20) ||
        p->cap > ((int64_t)1 << 24))
        return pfail(p, PL_EINVAL,
                         "pipeline: prefetch %lld or max_lag_steps %lld above the limit 2^20",
                         (long long)prefetch, (long long)lag_steps);
    if (pl__mutex_init_busy(&p->mu))
        return pfail(p, PL_ENOMEM, "pipeline: cannot create mutex");
    if (pthread_cond_init(&p->work_cv, NULL)) {
        pthread_mutex_destroy(&p->mu);
        return pfail(p, PL_ENOMEM, "pipeline: cannot create condition variable");
    }
    if (pthread_cond_init(&p->ready_cv, NULL)) {
        pthread_cond_destroy(&p->work_cv);
        pthread_mutex_destroy(&p->mu);
        return pfail(p, PL_ENOMEM, "pipeline: cannot create condition variable");
    }
    p->sync_inited = 1;

    int64_t world = pl_config_world_size(c);
    p->n_ranks = o && o->ranks ? o->n_ranks : world;
    if (p->n_ranks <= 0) return pfail(p, PL_EINVAL, "pipeline: no ranks to serve");
    p->ranks = pl__calloc((size_t)p->n_ranks, sizeof *p->ranks);
    p->groups = pl__calloc((size_t)p->n_ranks, sizeof *p->groups);
    p->members = pl__calloc((size_t)p->n_ranks, sizeof *p->members);
    pl__pkey *keys = pl__calloc((size_t)p->n_ranks, sizeof *keys);
    if (!p->ranks || !p->groups || !p->members || !keys) {
        free(keys);
        return pfail(p, PL_ENOMEM, "pipeline: out of memory");
    }
    for (int64_t i = 0; i < p->n_ranks; i++) {
        int64_t rank = o && o->ranks ? o->ranks[i] : i;
        int rc = pl_config_rank_info(c, rank, &p->ranks[i].info);
        if (rc) {
            free(keys);
            return pfail(p, rc, "pipeline: rank %lld out of range [0, %lld) of topology "
                             "dp=%lld pp=%lld cp=%lld tp=%lld",
                             (long long)rank, (long long)world, (long long)c->topology.dp,
                             (long long)c->topology.pp, (long long)c->topology.cp,
                             (long long)c->topology.tp);
        }
        p->ranks[i].pin = -1;
        p->ranks[i].wait_u = -1;
    }
    qsort(p->ranks, (size_t)p->n_ranks, sizeof *p->ranks, cmp_rank);
    for (int64_t i = 1; i < p->n_ranks; i++)
        if (p->ranks[i].info.rank == p->ranks[i - 1].info.rank) {
            free(keys);
            return pfail(p, PL_EINVAL, "pipeline: rank %lld given twice",
                             (long long)p->ranks[i].info.rank);
        }
    for (int64_t i = 0; i < p->n_ranks; i++)
        keys[i] = (pl__pkey){p->ranks[i].info.dp_rank,
                             p->group_by_cp ? p->ranks[i].info.cp_rank : 0, i};
    qsort(keys, (size_t)p->n_ranks, sizeof *keys, cmp_key);
    for (int64_t j = 0; j < p->n_ranks; j++) {
        p->members[j] = keys[j].idx;
        pl__pgroup *last = p->n_groups ? &p->groups[p->n_groups - 1] : NULL;
        if (!last || last->dp != keys[j].dp || last->cp != keys[j].cp) {
            last = &p->groups[p->n_groups++];
            last->dp = keys[j].dp;
            last->cp = keys[j].cp;
            last->first_member = j;
            last->slots = pl__calloc((size_t)p->cap, sizeof *last->slots);
            if (!last->slots) {
                free(keys);
                return pfail(p, PL_ENOMEM, "pipeline: out of memory");
            }
            for (int64_t t = 0; t < p->cap; t++) {
                last->slots[t].u = -1;
                last->slots[t].tokens = pl__calloc((size_t)p->unit, 8);
                last->slots[t].padding = pl__calloc((size_t)p->unit, 8);
                if (!last->slots[t].tokens || !last->slots[t].padding) {
                    free(keys);
                    return pfail(p, PL_ENOMEM, "pipeline: out of memory");
                }
            }
        }
        last->n_members++;
        p->ranks[keys[j].idx].group = p->n_groups - 1;
    }
    free(keys);
    p->base_step = -1;
    p->loose_step = -1;
    return PL_OK;
}

static void clear(pl_pipeline *p) {
    for (int64_t g = 0; g < p->n_groups; g++)
        for (int64_t t = 0; p->groups[g].slots && t < p->cap; t++)
            slot_clear(p, &p->groups[g].slots[t]);
    for (int64_t i = 0; i < p->n_entries; i++) entry_free(p->entries[i]);
    p->n_entries = 0;
}

void pl_pipeline_free(pl_pipeline *p) {
    if (!p) return;
    clear(p);
    for (int64_t g = 0; g < p->n_groups; g++) {
        for (int64_t t = 0; p->groups[g].slots && t < p->cap; t++) {
            free(p->groups[g].slots[t].tokens);
            free(p->groups[g].slots[t].padding);
        }
        free(p->groups[g].slots);
    }
    free(p->groups);
    free(p->ranks);
    free(p->members);
    free(p->entries);
    free(p->base_blob);
    free(p->loose_blob);
    pl_config_free(p->cfg);
    if (p->sync_inited) {
        pthread_cond_destroy(&p->work_cv);
        pthread_cond_destroy(&p->ready_cv);
        pthread_mutex_destroy(&p->mu);
    }
    free(p);
}

const char *pl_pipeline_errmsg(const pl_pipeline *p) {
    return p ? p->errmsg : "out of memory";
}

static int pipeline_reset_impl(pl_pipeline *p, const void *blob, size_t len, char *err,
                      size_t errcap) {
    pl_state_info si;
    int rc = pl_state_inspect(blob, len, &si);
    if (rc) {
        set_msg(err, errcap, "pipeline: the state blob is corrupt or of another version");
        return PL_ESTATE;
    }
    if (si.micro_batch >= p->nmb) {
        set_msg(err, errcap, "state: micro-batch cursor %lld out of range [0, %lld)",
                (long long)si.micro_batch, (long long)p->nmb);
        return PL_ESTATE;
    }
    void *copy = pl__malloc(len);
    if (!copy) {
        set_msg(err, errcap, "pipeline: out of memory");
        return PL_ENOMEM;
    }
    memcpy(copy, blob, len);
    pthread_mutex_lock(&p->mu);
    clear(p);
    free(p->base_blob);
    free(p->loose_blob);
    p->loose_blob = NULL;
    p->loose_len = 0;
    p->loose_step = -1;
    p->base_blob = copy;
    p->base_len = len;
    p->base_step = si.step;
    int64_t k = si.step * p->nmb + si.micro_batch;
    p->start_k = k;
    for (int64_t i = 0; i < p->n_ranks; i++) {
        pl__prank *r = &p->ranks[i];
        r->cursor = k;
        r->pin = -1;
        r->attached = r->lagged = 0;
        r->failed_reported = 0;
    }
    int64_t u = unit_of(p, k);
    for (int64_t g = 0; g < p->n_groups; g++) {
        pl__pgroup *gr = &p->groups[g];
        gr->next_u = gr->lo_u = u;
        gr->demand_u = -1;
        gr->lead_k = gr->counted_k = k;
    }
    p->first_step = p->next_plan_step = si.step;
    p->asked = 0;
    p->failed = p->failed_reported = 0;
    p->closed = 0;
    p->fail_msg[0] = '\0';
    p->generation++;
    p->folded_step = si.step;
    p->st_micro_batches = p->st_tokens = p->st_padding = p->st_folded = 0;
    p->st_mom_sum = p->st_molb_sum = 0;
    wake_cv(work_cv);
    wake_cv(ready_cv);
    pipe_unlock(p);
    return PL_OK;
}

void pl_pipeline_close(pl_pipeline *p) {
    if (!p) return;
    pthread_mutex_lock(&p->mu);
    p->closed = 1;
    p->held = 0; /* everybody is woken */
    wake_cv(work_cv);
    wake_cv(ready_cv);
    pipe_unlock(p);
}

uint64_t pl_pipeline_generation(pl_pipeline *p) {
    pthread_mutex_lock(&p->mu);
    uint64_t g = p->generation;
    pipe_unlock(p);
    return g;
}

void pl__pipeline_reopen(pl_pipeline *p) {
    pthread_mutex_lock(&p->mu);
    p->closed = 0;
    pipe_unlock(p);
}

void pl__pipeline_end_at(pl_pipeline *p, int64_t step) {
    pthread_mutex_lock(&p->mu);
    if (p->total_steps < 0 || step < p->total_steps) {
        p->total_steps = step;
        p->total_k = step * p->nmb;
        wake_cv(work_cv);
        wake_cv(ready_cv);
    }
    pipe_unlock(p);
}

size_t pl_pipeline_sizeof(const pl_pipeline *p) {
    if (!p) return 0;
    size_t n = sizeof *p + (size_t)p->n_ranks * (sizeof(pl__prank) + 8) +
               (size_t)p->n_groups * (sizeof(pl__pgroup) +
                                      (size_t)p->cap * (sizeof(pl__uslot) +
                                                        16 * (size_t)p->unit)) +
               p->base_len + p->loose_len + (size_t)p->cap_entries * sizeof(void *);
    for (int64_t i = 0; i < p->n_entries; i++) n += sizeof(pl__pentry) + p->entries[i]->blob_len;
    return n;
}

/* --------------------------------------------------------------- driver */

/* A group that may build a unit whose step is added; -1 if none. */
static int64_t pick(pl_pipeline *p) {
    int64_t best = -1;
    for (int64_t g = 0; g < p->n_groups; g++) {
        pl__pgroup *gr = &p->groups[g];
        if (units_done(p, gr) || !window_admits(p, gr)) continue;
        if (gr->next_u / p->ups >= p->next_plan_step) continue;
        if (best < 0 || gr->next_u < p->groups[best].next_u) best = g;
    }
    return best;
}

/* Whether a step must be added before some group can go on, or (plan_ahead)
 * is within plan_low steps of the step of a group's next unit: then a
 * driver plans step s+1 while the others build step s, instead of every
 * driver waiting for the plan once the window admits s+1; and a transport
 * that pushes steps in bursts (plan_low < plan_ahead, pl__pipeline_grant)
 * is woken once per burst, not per step. */
static int needs_plan(pl_pipeline *p) {
    if (p->asked) return 0;
    if (p->total_steps >= 0 && p->next_plan_step > p->total_steps) return 0;
    for (int64_t g = 0; g < p->n_groups; g++) {
        pl__pgroup *gr = &p->groups[g];
        int64_t ns = gr->next_u / p->ups;
        if (ns >= p->next_plan_step && window_admits(p, gr)) return 1;
        if (p->plan_ahead > 0 && ns + p->plan_low >= p->next_plan_step &&
            group_min(p, gr, 0) >= 0)
            return 1;
    }
    return 0;
}

/* A held consumer wake-up goes out. mu held. */
static void release_held(pl_pipeline *p) {
    if (p->held) {
        p->held = 0;
        wake_cv(ready_cv);
    }
}

void pl__pipeline_defer_wakes(pl_pipeline *p, int64_t units) {
    pthread_mutex_lock(&p->mu);
    p->defer_units = units > 1 ? units : 0;
    release_held(p);
    pipe_unlock(p);
}

void pl__pipeline_plan_ahead(pl_pipeline *p, int64_t steps) {
    pl__pipeline_plan_window(p, steps, steps);
}

/* Steps planned ahead are bounded far below int64 overflow of `ns + ahead`. */
#define PL__AHEAD_MAX ((int64_t)1 << 40)

void pl__pipeline_plan_window(pl_pipeline *p, int64_t ahead, int64_t low) {
    pthread_mutex_lock(&p->mu);
    ahead = ahead > 0 ? (ahead < PL__AHEAD_MAX ? ahead : PL__AHEAD_MAX) : 0;
    low = low < 0 ? 0 : low > ahead ? ahead : low;
    if (p->plan_ahead != ahead || p->plan_low != low) {
        p->plan_ahead = ahead;
        p->plan_low = low;
        wake_cv(work_cv);
    }
    pipe_unlock(p);
}

int64_t pl__pipeline_grant(pl_pipeline *p, int64_t step, int64_t ahead) {
    pthread_mutex_lock(&p->mu);
    int64_t n = 0;
    if (ahead > PL__AHEAD_MAX) ahead = PL__AHEAD_MAX;
    /* Granted even when closed meanwhile: the step was handed out, and the
       transport pushes it (add_step takes it) or is stopped; refusing would
       leave `asked` set and a reopened pipeline waiting for a push. */
    if (p->asked == 1 && step == p->next_plan_step) {
        /* the least step a group builds next, over the groups needs_plan
           looks at (not done, some rank not dropped) */
        int64_t ns = -1;
        for (int64_t g = 0; g < p->n_groups; g++) {
            pl__pgroup *gr = &p->groups[g];
            if (units_done(p, gr) || group_min(p, gr, 0) < 0) continue;
            int64_t s = gr->next_u / p->ups;
            if (ns < 0 || s < ns) ns = s;
        }
        n = ns < 0 ? 1 : ns + (ahead > 0 ? ahead : 0) - step + 1;
        if (n < 1) n = 1;
        if (p->total_steps >= 0 && n > p->total_steps - step + 1)
            n = p->total_steps - step + 1;
        if (n < 1) n = 1;
        p->asked = n;
    }
    pipe_unlock(p);
    return n;
}

static int all_built(pl_pipeline *p) {
    if (p->total_steps < 0) return 0;
    for (int64_t g = 0; g < p->n_groups; g++)
        if (!units_done(p, &p->groups[g])) return 0;
    return 1;
}

int pl_pipeline_get_work(pl_pipeline *p, unsigned kinds, int64_t timeout_ms,
                         pl_work *w) {
    memset(w, 0, sizeof *w);
    struct timespec ts;
    int use;
    deadline_from(timeout_ms, &ts, &use);
    pthread_mutex_lock(&p->mu);
    int rc = PL_OK;
    for (;;) {
        if (p->closed || p->failed) {
            rc = PL_ECLOSED;
            break;
        }
        /* Planning ahead goes first: the planner is serial, so the step after
           the one being built is planned while the other drivers build. */
        if ((kinds & PL_WORK_PLAN) && p->plan_ahead > 0 && needs_plan(p)) {
            release_held(p);
            p->asked = 1;
            w->kind = PL_WORK_PLAN;
            w->step = p->next_plan_step;
            w->generation = p->generation;
            break;
        }
        if (kinds & PL_WORK_BUILD) {
            int64_t g = pick(p);
            if (g >= 0) {
                pl__pgroup *gr = &p->groups[g];
                int64_t u = gr->next_u++;
                pl__uslot *s = slot(p, gr, u);
                slot_clear(p, s);
                s->u = u;
                pl__pentry *e = entry_of(p, u / p->ups);
                if (!e || e->rc || !e->plan) {
                    s->state = PL__U_ERROR;
                    s->rc = e && e->rc ? e->rc : PL_ESTATE;
                    s->msg = pl__strdup(e && e->msg ? e->msg
                                        : e && e->rc ? pl_strerror(e->rc)
                                                     : "pipeline: no plan for this step");
                    wake_cv(ready_cv);
                    continue;
                }
                s->state = PL__U_BUILDING;
                if (p->defer_units) {
                    s->t_given = now_us();
                    /* a wake-up held too long goes out before another unit */
                    if (p->held && s->t_given - p->held_since >= PL__DEFER_MAX_US)
                        release_held(p);
                }
                w->kind = PL_WORK_BUILD;
                w->step = u / p->ups;
                w->unit = u;
                w->group = g;
                w->dp_rank = gr->dp;
                w->cp_rank = gr->cp;
                w->micro_batch = unit_k0(p, u) - w->step * p->nmb;
                w->n_micro_batches = unit_n(p, u);
                w->plan = e->plan;
                w->aux = e->aux;
                w->blob = e->blob;
                w->blob_len = e->blob_len;
                w->generation = p->generation;
                /* Taking the last planned unit can be what makes the next step
                   wanted: wake a thread that only plans (an external loader's
                   pl_loader_want_step), which nothing else would wake while
                   the consumers stand still (a lost wake-up: a trainer's
                   client stopped 1-3 steps short of its prefetch window). */
                if (needs_plan(p)) wake_cv(work_cv);
                break;
            }
        }
        if ((kinds & PL_WORK_PLAN) && needs_plan(p)) {
            release_held(p);
            p->asked = 1;
            w->kind = PL_WORK_PLAN;
            w->step = p->next_plan_step;
            w->generation = p->generation;
            break;
        }
        int done_build = all_built(p);
        int done_plan = p->total_steps >= 0 && p->next_plan_step > p->total_steps;
        if ((!(kinds & PL_WORK_BUILD) || done_build) &&
            (!(kinds & PL_WORK_PLAN) || done_plan)) {
            rc = PL_DONE;
            break;
        }
        if (use && (timeout_ms == 0 || deadline_passed(&ts))) {
            rc = PL_ETIMEDOUT;
            break;
        }
        release_held(p); /* this driver has nothing to build: nothing to wait for */
        wait_cv(work_cv, &p->mu, use ? &ts : NULL);
    }
    if (rc != PL_OK) release_held(p);
    pipe_unlock(p);
    return rc;
}

/* A step that cannot be stored fails the pipeline (nobody would ask again). */
static void fail_oom(pl_pipeline *p, int64_t step) {
    pthread_mutex_lock(&p->mu);
    if (p->asked && step == p->next_plan_step && !p->failed) {
        p->failed = PL_ENOMEM;
        pl__fmt(p->fail_msg, sizeof p->fail_msg,
                "pipeline: out of memory adding step %lld", (long long)step);
        wake_cv(work_cv);
        wake_cv(ready_cv);
    }
    pipe_unlock(p);
}

static int add_step(pl_pipeline *p, int64_t step, pl_plan *plan, const void *blob,
                   size_t blob_len, void *aux, void (*aux_free)(void *), int status,
                   const char *message) {
    pl__pentry *e = pl__calloc(1, sizeof *e);
    void *b = blob_len ? pl__malloc(blob_len) : NULL;
    if (!e || (blob_len && !b)) {
        free(e);
        free(b);
        pl_plan_free(plan);
        if (aux && aux_free) aux_free(aux);
        fail_oom(p, step);
        return PL_ENOMEM;
    }
    if (b) memcpy(b, blob, blob_len);
    e->step = step;
    e->plan = plan;
    e->blob = b;
    e->blob_len = blob_len;
    e->aux = aux;
    e->aux_free = aux_free;
    e->rc = status;
    e->msg = message ? pl__strdup(message) : NULL;
    pthread_mutex_lock(&p->mu);
    if (!p->asked || step != p->next_plan_step) {
        pipe_unlock(p);
        entry_free(e);
        return PL_EINVAL;
    }
    if (p->n_entries == p->cap_entries) {
        int64_t nc = p->cap_entries ? p->cap_entries * 2 : 8;
        pl__pentry **v = pl__realloc_array(p->entries, (size_t)nc, sizeof *v);
        if (!v) {
            pipe_unlock(p);
            entry_free(e);
            fail_oom(p, step);
            return PL_ENOMEM;
        }
        p->entries = v;
        p->cap_entries = nc;
    }
    if (p->n_entries == 0) p->first_step = step;
    p->entries[p->n_entries++] = e;
    p->next_plan_step++;
    p->asked--;
    wake_cv(work_cv);
    /* Consumers wait for units, not steps: a new step concerns the state and
       statistics calls that wait for its blob, and a failed one everybody. */
    if (status != PL_OK || p->ready_other_n > 0) wake_cv(ready_cv);
    pipe_unlock(p);
    return PL_OK;
}

int pl_pipeline_add_step(pl_pipeline *p, int64_t step, pl_plan *plan,
                         const void *blob, size_t blob_len, void *aux,
                         void (*aux_free)(void *)) {
    if (!blob && blob_len) {
        pl_plan_free(plan);
        if (aux && aux_free) aux_free(aux);
        return PL_EINVAL;
    }
    if (plan && plan->step != step) {
        pl_plan_free(plan);
        if (aux && aux_free) aux_free(aux);
        return PL_EINVAL;
    }
    return add_step(p, step, plan, blob, blob_len, aux, aux_free, PL_OK, NULL);
}

int pl_pipeline_fail_step(pl_pipeline *p, int64_t step, int status,
                          const char *message) {
    return add_step(p, step, NULL, NULL, 0, NULL, NULL, status ? status : PL_EIO,
                   message ? message : "step failed");
}

int pl_pipeline_complete(pl_pipeline *p, const pl_work *w, int status,
                         const char *message, void *item, const int64_t *tokens,
                         const int64_t *padding) {
    pthread_mutex_lock(&p->mu);
    pl__uslot *s = NULL;
    if (w->kind == PL_WORK_BUILD && w->generation == p->generation && w->group >= 0 &&
        w->group < p->n_groups) {
        s = slot(p, &p->groups[w->group], w->unit);
        if (s->u != w->unit || s->state != PL__U_BUILDING) s = NULL;
    }
    if (!s) { /* reset meanwhile: drop it */
        if (item && p->release) p->release(item, p->release_ctx);
        pipe_unlock(p);
        return PL_ECLOSED;
    }
    if (status == PL_OK) {
        s->state = PL__U_READY;
        s->item = item;
        for (int64_t i = 0; i < w->n_micro_batches; i++) {
            s->tokens[i] = tokens ? tokens[i] : 0;
            s->padding[i] = padding ? padding[i] : 0;
        }
    } else {
        if (item && p->release) p->release(item, p->release_ctx);
        s->state = PL__U_ERROR;
        s->rc = status;
        s->msg = pl__strdup(message ? message : pl_strerror(status));
    }
    /* A ready unit wakes only a consumer waiting for it (or a state or
       statistics call); an error wakes every waiter.  With deferral, a cheap
       unit's wake-up may be held (header comment). */
    if (status != PL_OK || p->ready_other_n > 0) {
        p->held = 0;
        wake_cv(ready_cv);
    } else if (p->held || group_waits(p, &p->groups[w->group], w->unit)) {
        double now = p->defer_units ? now_us() : 0;
        if (p->defer_units && now - s->t_given < PL__DEFER_UNIT_US &&
            (!p->held || now - p->held_since < PL__DEFER_MAX_US) &&
            p->held + 1 < p->defer_units) {
            if (!p->held++) p->held_since = now;
        } else {
            p->held = 0;
            wake_cv(ready_cv);
        }
    }
    pipe_unlock(p);
    return PL_OK;
}

/* ------------------------------------------------------------- consumer */

static pl__prank *find_rank(pl_pipeline *p, int64_t rank) {
    int64_t lo = 0, hi = p->n_ranks;
    while (lo < hi) {
        int64_t mid = lo + (hi - lo) / 2;
        if (p->ranks[mid].info.rank < rank) lo = mid + 1;
        else hi = mid;
    }
    return lo < p->n_ranks && p->ranks[lo].info.rank == rank ? &p->ranks[lo] : NULL;
}

/* The failure, once with its status, then PL_ECLOSED. mu held. */
static int report_failure(pl_pipeline *p, char *err, size_t errcap) {
    set_msg(err, errcap, "%s", p->fail_msg);
    int rc = p->failed_reported ? PL_ECLOSED : p->failed;
    p->failed_reported = 1;
    return rc;
}

static int pipeline_next_impl(pl_pipeline *p, int64_t rank, int64_t max_count,
                     int64_t timeout_ms, pl_pipeline_item *out, char *err,
                     size_t errcap) {
    memset(out, 0, sizeof *out);
    if (max_count < 1) max_count = 1;
    pl__prank *r = find_rank(p, rank);
    if (!r) {
        set_msg(err, errcap, "pipeline: rank %lld is not served here", (long long)rank);
        return PL_ERANGE;
    }
    struct timespec ts;
    int use;
    deadline_from(timeout_ms, &ts, &use);
    pthread_mutex_lock(&p->mu);
    pl__pgroup *g = &p->groups[r->group];
    if (r->pin >= 0) {
        pl__uslot *s = slot(p, g, r->pin);
        if (s->u == r->pin) s->pins--;
        r->pin = -1;
        advance(p, g);
    }
    int rc = PL_OK;
    int64_t k = r->cursor;
    if (!r->attached) {
        r->attached = 1;
        wake_cv(work_cv);
    }
    int64_t u = unit_of(p, k);
    pl__uslot *s = slot(p, g, u);
    for (;;) {
        /* A failed unit: its status to each rank that reaches it (once; then
           PL_ECLOSED), so TP/PP/CP peers sharing it all get it at the same
           micro-batch, as from a loader of their own.  The pipeline has then
           failed: drivers stop, and a rank whose next unit is not built gets
           the failure (below).  A unit built before the failure is still
           served first. */
        if (s->u == u && s->state == PL__U_ERROR && !r->lagged) {
            if (!p->failed) {
                p->failed = s->rc;
                pl__fmt(p->fail_msg, sizeof p->fail_msg, "%s",
                        s->msg ? s->msg : pl_strerror(s->rc)); /* copy failed: ENOMEM */
                wake_cv(ready_cv);
                wake_cv(work_cv);
            }
            set_msg(err, errcap, "%s", s->msg ? s->msg : pl_strerror(s->rc));
            rc = r->failed_reported ? PL_ECLOSED : s->rc;
            r->failed_reported = 1;
            p->failed_reported = 1;
            goto out;
        }
        if (p->failed && !(s->u == u && s->state == PL__U_READY)) {
            rc = report_failure(p, err, errcap);
            goto out;
        }
        if (r->lagged) {
            set_msg(err, errcap,
                    "rank %lld (DP rank %lld) stands at step %lld, micro-batch %lld, more "
                    "than max_lag_steps=%lld steps behind the most advanced rank of its "
                    "group (step %lld); its batches were dropped so that the others do "
                    "not wait. Start the ranks together, or raise max_lag_steps",
                    (long long)rank, (long long)r->info.dp_rank, (long long)(k / p->nmb),
                    (long long)(k % p->nmb), (long long)(p->lag_k / p->nmb),
                    (long long)(g->lead_k / p->nmb));
            rc = PL_ELAG;
            goto out;
        }
        if (p->total_k >= 0 && k >= p->total_k) {
            rc = PL_DONE;
            goto out;
        }
        if (p->closed) {
            set_msg(err, errcap, "pipeline: closed");
            rc = PL_ECLOSED;
            goto out;
        }
        if (u > g->demand_u) {
            g->demand_u = u;
            wake_cv(work_cv);
        }
        if (s->u == u && s->state == PL__U_READY) break;
        if (use && (timeout_ms == 0 || deadline_passed(&ts))) {
            set_msg(err, errcap,
                    "pipeline: rank %lld waited %lld ms for step %lld, micro-batch %lld",
                    (long long)rank, (long long)timeout_ms, (long long)(k / p->nmb),
                    (long long)(k % p->nmb));
            rc = PL_ETIMEDOUT;
            goto out;
        }
        r->wait_u = u;
        wait_cv(ready_cv, &p->mu, use ? &ts : NULL);
        r->wait_u = -1;
    }
    int64_t k0 = unit_k0(p, u), n = unit_n(p, u);
    int64_t take = k0 + n - k < max_count ? k0 + n - k : max_count;
    out->item = s->item;
    out->step = k / p->nmb;
    out->micro_batch = k % p->nmb;
    out->count = take;
    out->index = k - k0;
    out->group = r->group;
    out->fields = r->info.fields;
    if (p->retain) p->retain(s->item, out->index, p->release_ctx);
    s->pins++;
    r->pin = u;
    int64_t a0 = group_min(p, g, 1);
    r->cursor = k + take;
    /* The group's window moves when its least attached cursor enters another
       unit (released units wake drivers in advance). */
    if (unit_of(p, group_min(p, g, 1)) != unit_of(p, a0 < 0 ? 0 : a0))
        wake_cv(work_cv);
    p->st_micro_batches += take;
    if (r->cursor > g->lead_k) {
        g->lead_k = r->cursor;
        apply_lag(p, g);
    }
    advance(p, g);
out:
    pipe_unlock(p);
    return rc;
}

/* ---------------------------------------------------- state, statistics */

/* The blob of `step`'s start (entry or base); NULL if not there. mu held. */
static const void *blob_of(pl_pipeline *p, int64_t step, size_t *len) {
    pl__pentry *e = entry_of(p, step);
    if (e && e->blob) {
        *len = e->blob_len;
        return e->blob;
    }
    if (step == p->base_step && p->base_blob) {
        *len = p->base_len;
        return p->base_blob;
    }
    if (step == p->loose_step && p->loose_blob) {
        *len = p->loose_len;
        return p->loose_blob;
    }
    return NULL;
}

int pl_pipeline_position(pl_pipeline *p, int64_t *step, int64_t *micro_batch,
                         int *have_blob) {
    pthread_mutex_lock(&p->mu);
    int64_t k = consumed_position(p);
    size_t n = 0;
    int have = p->base_step >= 0 && blob_of(p, k / p->nmb, &n) != NULL;
    pipe_unlock(p);
    if (step) *step = k / p->nmb;
    if (micro_batch) *micro_batch = k % p->nmb;
    if (have_blob) *have_blob = have;
    return PL_OK;
}

int pl_pipeline_attach_state(pl_pipeline *p, const void *blob, size_t len, char *err,
                             size_t errcap) {
    pl_state_info si;
    if (!blob || pl_state_inspect(blob, len, &si) != PL_OK) {
        set_msg(err, errcap, "pipeline: the state blob is corrupt or of another version");
        return PL_ESTATE;
    }
    if (si.micro_batch != 0 || si.step < 0 || si.dp != p->cfg->topology.dp) {
        set_msg(err, errcap,
                "pipeline: attach_state takes the blob of a step's start for dp %lld "
                "(got step %lld, micro-batch %lld, dp %lld)",
                (long long)p->cfg->topology.dp, (long long)si.step,
                (long long)si.micro_batch, (long long)si.dp);
        return PL_ESTATE;
    }
    void *copy = pl__malloc(len);
    if (!copy) {
        set_msg(err, errcap, "pipeline: out of memory");
        return PL_ENOMEM;
    }
    memcpy(copy, blob, len);
    pthread_mutex_lock(&p->mu);
    size_t n = 0;
    if (blob_of(p, si.step, &n)) { /* already held: keep it */
        pipe_unlock(p);
        free(copy);
        return PL_OK;
    }
    pl__pentry *e = entry_of(p, si.step);
    if (e) {
        e->blob = copy;
        e->blob_len = len;
    } else {
        free(p->loose_blob);
        p->loose_blob = copy;
        p->loose_len = len;
        p->loose_step = si.step;
    }
    wake_cv(ready_cv);
    pipe_unlock(p);
    return PL_OK;
}

static int pipeline_get_state_impl(pl_pipeline *p, int64_t timeout_ms, void *buf,
                          size_t cap, size_t *len, char *err, size_t errcap) {
    struct timespec ts;
    int use;
    deadline_from(timeout_ms, &ts, &use);
    pthread_mutex_lock(&p->mu);
    int rc = PL_OK;
    const void *blob = NULL;
    size_t n = 0;
    int64_t k = 0;
    for (;;) {
        k = consumed_position(p);
        blob = blob_of(p, k / p->nmb, &n);
        if (blob) break;
        pl__pentry *e = entry_of(p, k / p->nmb);
        if (e || p->failed || p->closed || p->base_step < 0) {
            set_msg(err, errcap, "pipeline: no state for step %lld (%s)",
                    (long long)(k / p->nmb),
                    p->base_step < 0 ? "never reset"
                    : e && e->msg ? e->msg
                    : e && e->rc == PL_OK ? "added without its blob: pl_pipeline_attach_state"
                    : "the step failed or the pipeline closed");
            rc = PL_ESTATE;
            break;
        }
        if (use && (timeout_ms == 0 || deadline_passed(&ts))) {
            set_msg(err, errcap, "pipeline: the state of step %lld is not there yet",
                    (long long)(k / p->nmb));
            rc = PL_ETIMEDOUT;
            break;
        }
        p->ready_other_n++;
        wait_cv(ready_cv, &p->mu, use ? &ts : NULL);
        p->ready_other_n--;
    }
    if (!rc) {
        *len = n;
        if (buf) {
            if (cap < n) {
                set_msg(err, errcap, "state buffer too small: %zu bytes, need %zu", cap, n);
                rc = PL_EINVAL;
            } else {
                rc = pl_state_retarget(blob, n, k % p->nmb, p->cfg->topology.dp, buf, cap,
                                       len);
                if (rc) set_msg(err, errcap, "pipeline: corrupt state blob");
            }
        }
    }
    pipe_unlock(p);
    return rc;
}

static int name_is(const pl_state_source_info *si, const char *name) {
    return strlen(name) == si->name_len && memcmp(si->name, name, si->name_len) == 0;
}

int pl_pipeline_get_stats(pl_pipeline *p, int64_t timeout_ms, pl_loader_stats *stats,
                          pl_source_summary *sources, int64_t cap) {
    if (!stats || stats->size < offsetof(pl_loader_stats, data_wait_s) ||
        (!sources && cap > 0)) {
        pl__thread_err("pipeline: pl_pipeline_get_stats needs stats->size = "
                       "sizeof(pl_loader_stats) and a sources array of cap entries");
        return PL_EINVAL;
    }
    /* Filled whole, then copied up to the caller's size (a newer caller's
       fields beyond this library's struct stay as they were). */
    pl_loader_stats whole, *out = &whole;
    memset(out, 0, sizeof *out);
    out->size = sizeof *out;
    struct timespec ts;
    int use;
    deadline_from(timeout_ms, &ts, &use);
    pthread_mutex_lock(&p->mu);
    int64_t k = consumed_position(p);
    int64_t step = k / p->nmb;
    size_t blen = 0;
    const void *blob = NULL;
    /* The per-source counters are those of the blob of the position's step
       (the planner's counters when the step began): wait for it. */
    for (;;) {
        k = consumed_position(p);
        step = k / p->nmb;
        blob = blob_of(p, step, &blen);
        if (blob || p->failed || p->closed || p->base_step < 0) break;
        pl__pentry *e = entry_of(p, step);
        if (e && e->rc == PL_OK && !p->failed) { /* added without its blob */
            pipe_unlock(p);
            return PL_ESTATE;
        }
        if (e) break;
        if (use && (timeout_ms == 0 || deadline_passed(&ts))) {
            pipe_unlock(p);
            return PL_ETIMEDOUT;
        }
        p->ready_other_n++;
        wait_cv(ready_cv, &p->mu, use ? &ts : NULL);
        p->ready_other_n--;
    }
    out->steps = step - p->start_k / p->nmb;
    if (out->steps < 0) out->steps = 0;
    out->micro_batches = p->st_micro_batches;
    out->tokens = p->st_tokens;
    out->padding_tokens = p->st_padding;
    if (p->st_folded > 0) {
        out->max_over_mean = p->st_mom_sum / (double)p->st_folded;
        out->max_over_lower_bound = p->st_molb_sum / (double)p->st_folded;
    }
    const pl_config *c = p->cfg;
    int64_t ns = c->n_sources < cap ? c->n_sources : cap;
    if (ns < 0) ns = 0;
    pl_state_info info;
    int have = blob && pl_state_inspect(blob, blen, &info) == PL_OK;
    double drawn_all = 0, target_all = 0;
    for (int64_t i = 0; i < ns; i++) {
        pl_source_summary *m = &sources[i];
        memset(m, 0, sizeof *m);
        m->name = c->sources[i].name;
    }
    /* Counters by name; records are usually in config order. */
    double *target = pl__calloc(ns ? (size_t)ns : 1, sizeof *target);
    for (int64_t j = 0; have && target && j < info.n_sources; j++) {
        pl_state_source_info si;
        if (pl_state_source(blob, blen, j, &si)) break;
        int64_t i = j < ns && name_is(&si, c->sources[j].name) ? j : -1;
        for (int64_t t = 0; i < 0 && t < ns; t++)
            if (name_is(&si, c->sources[t].name)) i = t;
        drawn_all += (double)si.drawn_tokens;
        target_all += si.target_tokens;
        if (i < 0) continue;
        pl_source_summary *m = &sources[i];
        m->documents = si.documents;
        m->tokens = si.drawn_tokens;
        m->epochs_completed = si.epoch;
        m->skipped = si.skipped;
        target[i] = si.target_tokens;
        out->skipped += si.skipped;
    }
    for (int64_t i = 0; i < ns; i++) {
        pl_source_summary *m = &sources[i];
        m->realized_fraction = drawn_all > 0 ? (double)m->tokens / drawn_all : 0;
        m->scheduled_fraction = target && target_all > 0 ? target[i] / target_all : 0;
    }
    free(target);
    out->n_sources = ns;
    out->sources = sources;
    pipe_unlock(p);
    size_t given = stats->size; /* an older caller's struct ends before the newer fields */
    memcpy(stats, out, given < sizeof *out ? given : sizeof *out);
    stats->size = given;
    return PL_OK;
}

/* ------------------------------------------------ per-thread messages */

int pl_pipeline_reset(pl_pipeline *p, const void *blob, size_t len, char *err,
                      size_t errcap) {
    char local[PL__ERRMSG_CAP];
    if (!err || errcap == 0) {
        err = local;
        errcap = sizeof local;
    }
    err[0] = '\0';
    int rc = pipeline_reset_impl(p, blob, len, err, errcap);
    if (rc < 0) pl__thread_err(err);
    return rc;
}

int pl_pipeline_next(pl_pipeline *p, int64_t rank, int64_t max_count,
                     int64_t timeout_ms, pl_pipeline_item *out, char *err,
                     size_t errcap) {
    char local[PL__ERRMSG_CAP];
    if (!err || errcap == 0) {
        err = local;
        errcap = sizeof local;
    }
    err[0] = '\0';
    int rc = pipeline_next_impl(p, rank, max_count, timeout_ms, out, err, errcap);
    if (rc < 0) pl__thread_err(err);
    return rc;
}

int pl_pipeline_get_state(pl_pipeline *p, int64_t timeout_ms, void *buf,
                          size_t cap, size_t *len, char *err, size_t errcap) {
    char local[PL__ERRMSG_CAP];
    if (!err || errcap == 0) {
        err = local;
        errcap = sizeof local;
    }
    err[0] = '\0';
    int rc = pipeline_get_state_impl(p, timeout_ms, buf, cap, len, err, errcap);
    if (rc < 0) pl__thread_err(err);
    return rc;
}
