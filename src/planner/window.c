/*
 * window.c -- cross-step smoothing (balance_window: W > 1).
 *
 * At the first step of a window the planner packs W steps one after the
 * other, exactly as it would without the window (the same mixture draws,
 * chunks and carry), then deals their W * global_batch_size sequences
 * again across the W steps: sequences sorted by cost (most costly first,
 * ties by packing order) are cut into W groups of global_batch_size, so
 * that each step holds sequences of similar cost and its DP ranks carry
 * similar cost under any arrangement.  The groups go to the window's steps
 * in a keyed pseudo-random order (seed, window start), so that the costliest
 * group is not always first.  Each step is then balanced as usual (balance).
 *
 * A step's membership is therefore exact over the window, not per step: the
 * window's tokens follow the mixture, a step's may not.  The dealing
 * depends on the sequences' costs only, never on dp, so an elastic resume
 * (another dp) keeps the same steps.  Memory: the window's chunks.
 *
 * State: a blob taken inside a window (after its first step) records the
 * counters and carry of the window's start, its step and the window's start
 * (state version 4); loading it packs the window again and serves its step.
 */
#include "planner/planner.h"

#include <stdlib.h>
#include <string.h>

int pl__bins_push(pl__bins *b, int32_t v) {
    if (b->n == b->cap) {
        int64_t nc = b->cap ? 2 * b->cap : 1024;
        int32_t *x = pl__realloc_array(b->v, (size_t)nc, sizeof *x);
        if (!x) return PL_ENOMEM;
        b->v = x;
        b->cap = nc;
    }
    b->v[b->n++] = v;
    return PL_OK;
}

void pl__window_free(pl_planner *p) {
    pl__chunks_free(&p->win_chunks);
    pl__chunks_free(&p->win_carry);
    free(p->win_bins.v);
    free(p->win_src);
    free(p->win_order);
    free(p->win_off);
    free(p->win_scratch_bins);
    free(p->win_scratch);
    memset(&p->win_bins, 0, sizeof p->win_bins);
    p->win_src = NULL;
    p->win_order = p->win_off = NULL;
    p->win_scratch_bins = NULL;
    p->win_scratch = NULL;
    p->win_start = -1;
    p->win_steps = 0;
}

typedef struct pl__qc {
    double w;
    int64_t q;
} pl__qc;

static int cmp_qc(const void *a, const void *b) {
    const pl__qc *x = a, *y = b;
    if (x->w != y->w) return x->w > y->w ? -1 : 1;
    return x->q < y->q ? -1 : (x->q > y->q);
}

/* Pack the window that starts at p->step and deal its sequences. */
static int window_fill(pl_planner *p) {
    const pl_config *c = p->cfg;
    const int64_t W = c->balance_window, G = c->global_batch_size, ws = p->step;
    int rc = PL_OK;
    p->win_chunks.n = 0;
    p->win_bins.n = 0;
    p->win_carry.n = 0;
    if (!p->win_src) {
        p->win_src = pl__calloc((size_t)(p->n_sources ? p->n_sources : 1), sizeof *p->win_src);
        p->win_off = pl__calloc((size_t)W + 1, sizeof *p->win_off);
        if (!p->win_src || !p->win_off) return PL_ENOMEM;
    }
    memcpy(p->win_src, p->src, (size_t)p->n_sources * sizeof *p->src);
    for (int64_t j = 0; j < p->carry.n; j++)
        if ((rc = pl__chunks_push(&p->win_carry, &p->carry.v[j]))) return rc;
    for (int64_t j = 0; j < W; j++) {
        int64_t before = p->win_chunks.n;
        p->step = ws + j;
        if ((rc = pl__planner_step_weights(p))) break;
        pl__planner_draw_begin(p);
        rc = pl__pack_window_step(p, &p->win_chunks, &p->win_bins);
        pl__planner_draw_end(p);
        if (rc) break;
        pl__planner_step_done(p);
        for (int64_t i = before; i < p->win_chunks.n; i++)
            if (p->win_bins.v[i] < 0 || p->win_bins.v[i] >= G) rc = PL_EINVAL;
        if (rc) break;
        p->win_off[j] = before; /* temporarily: where packing j starts */
    }
    p->step = ws;
    if (rc) return rc;
    const int64_t n = p->win_chunks.n, nq = W * G;
    /* Sequence costs (q = j * G + bin). */
    pl__qc *qc = pl__calloc((size_t)nq, sizeof *qc);
    int64_t *newkey = pl__calloc((size_t)nq, sizeof *newkey);
    int64_t *order = pl__realloc_array(p->win_order, (size_t)(n ? n : 1), sizeof *order);
    int64_t *cnt = pl__calloc((size_t)nq + 1, sizeof *cnt);
    if (order) p->win_order = order;
    if (!qc || !newkey || !order || !cnt) {
        free(qc);
        free(newkey);
        free(cnt);
        return PL_ENOMEM;
    }
    for (int64_t q = 0; q < nq; q++) qc[q] = (pl__qc){c->cost.c, q};
    for (int64_t j = 0, i = 0; j < W; j++) {
        int64_t end = j + 1 < W ? p->win_off[j + 1] : n;
        for (; i < end; i++) {
            const pl_chunk *ch = &p->win_chunks.v[i];
            int64_t q = j * G + p->win_bins.v[i];
            p->win_bins.v[i] = (int32_t)q; /* now the window's sequence */
            qc[q].w += pl__chunk_cost(c, ch->length) - c->cost.c +
                       pl__chunk_encoder_cost(p, ch);
        }
    }
    qsort(qc, (size_t)nq, sizeof *qc, cmp_qc);
    /* Group g (sorted positions g*G .. g*G+G) to step perm(g) of the window. */
    pl__perm perm;
    pl__perm_init(&perm, (uint64_t)W, c->seed, "balance_window", (uint64_t)ws);
    for (int64_t pos = 0; pos < nq; pos++) {
        int64_t g = pos / G, step_j = (int64_t)pl__perm_apply(&perm, (uint64_t)g);
        newkey[qc[pos].q] = step_j * G + pos % G;
    }
    /* Chunks by (step, new sequence), stable: a counting sort. */
    for (int64_t i = 0; i < n; i++) cnt[newkey[p->win_bins.v[i]] + 1]++;
    for (int64_t k = 0; k < nq; k++) cnt[k + 1] += cnt[k];
    for (int64_t j = 0; j <= W; j++) p->win_off[j] = cnt[j * G];
    for (int64_t i = 0; i < n; i++) {
        int64_t key = newkey[p->win_bins.v[i]];
        order[cnt[key]++] = i;
        p->win_bins.v[i] = (int32_t)(key % G); /* the sequence within its step */
    }
    free(qc);
    free(newkey);
    free(cnt);
    p->win_start = ws;
    p->win_steps = W;
    return PL_OK;
}

int pl__window_next(pl_planner *p, pl_plan **out) {
    int rc;
    if (p->win_start < 0 || p->step < p->win_start ||
        p->step >= p->win_start + p->win_steps) {
        if ((rc = window_fill(p))) {
            if (rc == PL_ENOMEM) pl__fmt(p->errmsg, sizeof p->errmsg, "planning: out of memory");
            return rc;
        }
    }
    if (p->win_skip_to > p->step) { /* resumed inside the window */
        p->step = p->win_skip_to;
        p->win_skip_to = -1;
    }
    const int64_t j = p->step - p->win_start;
    const int64_t lo = p->win_off[j], hi = p->win_off[j + 1], n = hi - lo;
    pl_chunk *placed = pl__realloc_array(p->win_scratch, (size_t)(n ? n : 1), sizeof *placed);
    if (placed) p->win_scratch = placed;
    int32_t *bins = pl__realloc_array(p->win_scratch_bins, (size_t)(n ? n : 1), sizeof *bins);
    if (bins) p->win_scratch_bins = bins;
    if (!placed || !bins) {
        pl__fmt(p->errmsg, sizeof p->errmsg, "planning: out of memory");
        return PL_ENOMEM;
    }
    for (int64_t k = 0; k < n; k++) {
        int64_t i = p->win_order[lo + k];
        placed[k] = p->win_chunks.v[i];
        bins[k] = p->win_bins.v[i];
    }
    return pl__pack_plan(p, placed, n, bins, out);
}
