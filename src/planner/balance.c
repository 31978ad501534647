/*
 * balance.c -- cost-aware arrangement of a step across DP ranks and
 * micro-batches (balance: greedy | karmarkar_karp | variable_length).
 *
 * The balancer returns an arrangement (the chunks' sequences and the slots
 * of the sequences); pack.c builds the plan from it once.  variable_length
 * is described at balance_vlen below: it deals chunks, not sequences,
 * so ranks carry unequal token counts.  What follows is greedy and
 * karmarkar_karp.
 *
 * Balancing changes where a step's member chunks go, never which chunks are
 * members (SPEC section 1): every DP rank keeps exactly global_batch_size/dp
 * sequences of at most seq_length tokens, and nothing is carried over.  Two
 * arrangements are built and the one with the smaller largest rank cost is
 * kept (ties: the first):
 *
 *  A. Pack-then-balance.  The dp-agnostic sequences are split into dp groups
 *     of equal count.  greedy: longest processing time first with a
 *     cardinality limit (Graham 1969); karmarkar_karp: the balanced largest
 *     differencing method (Karmarkar and Karp 1982; Michiels, Aarts, Korst,
 *     van Leeuwen and Spieksma, "Computer-assisted proof of performance ratios
 *     for the Differencing Method", 2012), which keeps equal cardinalities.
 *  B. Regroup-then-pack.  Chunks, most costly first, go to the DP rank with
 *     the least cost that has a sequence with room (best fit within the rank).
 *     If some chunk fits in no rank, B is dropped and A stands.  B is not
 *     tried when A is already within PL__GOOD_ENOUGH (0.1%) of the lower
 *     bound max(total cost / dp, costliest chunk), since no arrangement can
 *     gain more than that, and it is abandoned as soon as one of its ranks
 *     costs more than A's largest.  On a full step (best_fit leaves little
 *     room) regrouping rarely fits: measured on the benchmark settings of
 *     bench/balance it failed on nearly every step, while A alone came
 *     within 0.7% of the lower bound (bench/balance/RESULTS.md).
 *
 * Then, within each rank, its sequences are split into micro-batches of
 * micro_batch_size sequences by the same method, so that pipeline stages do
 * not wait on one costly micro-batch.
 *
 * Costs are those of cost.c.  The per-sequence constant c is the same on
 * every rank (equal sequence counts), so chunk-level balancing ignores it.
 */
#include "planner/planner.h"

#include <math.h>

/* Relative distance to the lower bound below which A is kept as is. */
#define PL__GOOD_ENOUGH 1e-3
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------ helpers */

typedef struct pl__ci {
    double w;
    int64_t i;
} pl__ci;

static int cmp_ci_desc(const void *a, const void *b) {
    const pl__ci *x = a, *y = b;
    if (x->w != y->w) return x->w > y->w ? -1 : 1;
    return x->i < y->i ? -1 : (x->i > y->i);
}

/* v[0..n) by decreasing weight, ties by increasing index (a total order:
 * the result does not depend on the algorithm).  Up to 32 items, as a
 * step of a few micro-batches has (32 sequences, groups of 4..8), an
 * insertion sort with the comparison inlined; qsort's call per comparison
 * was 5 % of such a step's planning. */
static void sort_ci_desc(pl__ci *v, int64_t n) {
    if (n > 32) {
        qsort(v, (size_t)n, sizeof *v, cmp_ci_desc);
        return;
    }
    for (int64_t j = 1; j < n; j++) {
        const pl__ci x = v[j];
        int64_t i = j;
        while (i > 0 && (v[i - 1].w < x.w || (v[i - 1].w == x.w && v[i - 1].i > x.i))) {
            v[i] = v[i - 1];
            i--;
        }
        v[i] = x;
    }
}

/* A binary min-heap of (key, id). */
typedef struct pl__heap {
    double *key;
    int64_t *id;
    int64_t n;
} pl__heap;

static int heap_less(const pl__heap *h, int64_t a, int64_t b) {
    if (h->key[a] != h->key[b]) return h->key[a] < h->key[b];
    return h->id[a] < h->id[b];
}

static void heap_swap(pl__heap *h, int64_t a, int64_t b) {
    double k = h->key[a];
    int64_t i = h->id[a];
    h->key[a] = h->key[b];
    h->id[a] = h->id[b];
    h->key[b] = k;
    h->id[b] = i;
}

static void heap_push(pl__heap *h, double key, int64_t id) {
    int64_t c = h->n++;
    h->key[c] = key;
    h->id[c] = id;
    while (c > 0) {
        int64_t p = (c - 1) / 2;
        if (!heap_less(h, c, p)) break;
        heap_swap(h, c, p);
        c = p;
    }
}

static void heap_pop(pl__heap *h, double *key, int64_t *id) {
    *key = h->key[0];
    *id = h->id[0];
    h->n--;
    h->key[0] = h->key[h->n];
    h->id[0] = h->id[h->n];
    int64_t c = 0;
    for (;;) {
        int64_t l = 2 * c + 1, r = l + 1, m = c;
        if (l < h->n && heap_less(h, l, m)) m = l;
        if (r < h->n && heap_less(h, r, m)) m = r;
        if (m == c) break;
        heap_swap(h, c, m);
        c = m;
    }
}

/* ------------------------------------------------ equal-count partition */

/*
 * Split items with weights w[0..n) into k groups of exactly n/k items
 * (k divides n), minimizing the largest group sum.  group[i] receives the
 * group of item i.  method: PL__BALANCE_GREEDY or PL__BALANCE_KK.
 */
static int partition_equal(const double *w, int64_t n, int64_t k,
                               int method, int64_t *group) {
    if (k <= 1) {
        for (int64_t i = 0; i < n; i++) group[i] = 0;
        return PL_OK;
    }
    const int64_t per = n / k;
    pl__ci *order = pl__calloc((size_t)n, sizeof *order);
    if (!order) return PL_ENOMEM;
    for (int64_t i = 0; i < n; i++) order[i] = (pl__ci){w[i], i};
    sort_ci_desc(order, n);
    int rc = PL_OK;
    if (method == PL__BALANCE_GREEDY || per == 1) {
        /* LPT: each item to the lightest group that is not full. */
        pl__heap h = {pl__calloc((size_t)k, sizeof(double)),
                      pl__calloc((size_t)k, sizeof(int64_t)), 0};
        int64_t *count = pl__calloc((size_t)k, sizeof *count);
        if (!h.key || !h.id || !count) {
            rc = PL_ENOMEM;
        } else {
            for (int64_t g = 0; g < k; g++) heap_push(&h, 0, g);
            for (int64_t j = 0; j < n; j++) {
                double s;
                int64_t g;
                heap_pop(&h, &s, &g);
                group[order[j].i] = g;
                if (++count[g] < per) heap_push(&h, s + order[j].w, g);
            }
        }
        free(h.key);
        free(h.id);
        free(count);
        free(order);
        return rc;
    }
    /*
     * Balanced largest differencing.  Partial solution j starts as k
     * singleton subsets from items order[j*k .. j*k+k).  Repeatedly the two
     * partials with the largest spread (max - min subset sum) are merged,
     * pairing the heaviest subsets of one with the lightest of the other.
     * Subsets are linked lists of items (next[]).
     */
    const int64_t m = per;
    double *sum = pl__calloc((size_t)(m * k), sizeof *sum);
    int64_t *head = pl__calloc((size_t)(m * k), sizeof *head);
    int64_t *tail = pl__calloc((size_t)(m * k), sizeof *tail);
    int64_t *next = pl__calloc((size_t)n, sizeof *next);
    pl__ci *tmp_a = pl__calloc((size_t)k, sizeof *tmp_a);
    pl__ci *tmp_b = pl__calloc((size_t)k, sizeof *tmp_b);
    double *nsum = pl__calloc((size_t)k, sizeof *nsum);
    int64_t *nhead = pl__calloc((size_t)k, sizeof *nhead);
    int64_t *ntail = pl__calloc((size_t)k, sizeof *ntail);
    pl__heap h = {pl__calloc((size_t)m, sizeof(double)),
                  pl__calloc((size_t)m, sizeof(int64_t)), 0};
    if (!sum || !head || !tail || !next || !tmp_a || !tmp_b || !nsum ||
        !nhead || !ntail || !h.key || !h.id) {
        rc = PL_ENOMEM;
        goto out;
    }
    for (int64_t j = 0; j < m; j++) {
        double mx = 0, mn = 0;
        for (int64_t t = 0; t < k; t++) {
            int64_t it = order[j * k + t].i;
            sum[j * k + t] = order[j * k + t].w;
            head[j * k + t] = tail[j * k + t] = it;
            next[it] = -1;
        }
        mx = sum[j * k];
        mn = sum[j * k + k - 1];
        heap_push(&h, -(mx - mn), j); /* min-heap on -spread */
    }
    while (h.n > 1) {
        double ka, kb;
        int64_t a, b;
        heap_pop(&h, &ka, &a);
        heap_pop(&h, &kb, &b);
        for (int64_t t = 0; t < k; t++) {
            tmp_a[t] = (pl__ci){sum[a * k + t], t};
            tmp_b[t] = (pl__ci){sum[b * k + t], t};
        }
        sort_ci_desc(tmp_a, k); /* heavy first */
        sort_ci_desc(tmp_b, k);
        for (int64_t t = 0; t < k; t++) {
            int64_t sa = a * k + tmp_a[t].i, sb = b * k + tmp_b[k - 1 - t].i;
            nsum[t] = sum[sa] + sum[sb];
            next[tail[sa]] = head[sb];
            nhead[t] = head[sa];
            ntail[t] = tail[sb];
        }
        double mx = nsum[0], mn = nsum[0];
        for (int64_t t = 0; t < k; t++) {
            sum[a * k + t] = nsum[t];
            head[a * k + t] = nhead[t];
            tail[a * k + t] = ntail[t];
            if (nsum[t] > mx) mx = nsum[t];
            if (nsum[t] < mn) mn = nsum[t];
        }
        heap_push(&h, -(mx - mn), a);
    }
    {
        double kr;
        int64_t r;
        heap_pop(&h, &kr, &r);
        for (int64_t t = 0; t < k; t++)
            for (int64_t it = head[r * k + t]; it >= 0; it = next[it]) group[it] = t;
    }
out:
    free(sum);
    free(head);
    free(tail);
    free(next);
    free(tmp_a);
    free(tmp_b);
    free(nsum);
    free(nhead);
    free(ntail);
    free(h.key);
    free(h.id);
    free(order);
    return rc;
}

/* ------------------------------------------------------------ costs */

/* Cost of every bin (sequence) under a bin assignment. */
static void bin_costs(const pl_planner *p, const pl_chunk *placed,
                          int64_t n, const int32_t *bin_of, int64_t G,
                          double *tok, double *attn, double *cost) {
    const pl_config *c = p->cfg;
    for (int64_t b = 0; b < G; b++) tok[b] = attn[b] = 0;
    for (int64_t i = 0; i < n; i++) {
        tok[bin_of[i]] += (double)placed[i].length;
        attn[bin_of[i]] += pl__chunk_cost(c, placed[i].length) - c->cost.c -
                           c->cost.a * (double)placed[i].length +
                           pl__chunk_encoder_cost(p, &placed[i]);
    }
    for (int64_t b = 0; b < G; b++) cost[b] = c->cost.a * tok[b] + attn[b] + c->cost.c;
}

/*
 * Given sequences already grouped by rank (rank_of[q]), order each rank's
 * sequences into micro-batches and write the arrangement.  Returns the
 * largest rank cost in *max_rank and the largest micro-batch cost in *max_mb.
 */
static int arrange(const pl_planner *p, int method, const double *cost,
                       const int64_t *rank_of, int64_t *arrangement,
                       double *max_rank, double *max_mb) {
    const pl_config *c = p->cfg;
    const int64_t G = c->global_batch_size, dp = c->topology.dp;
    const int64_t mbs = c->micro_batch_size, per = G / dp, nmb = per / mbs;
    int64_t *fill = pl__calloc((size_t)dp, sizeof *fill);
    int64_t *members = pl__calloc((size_t)G, sizeof *members);
    double *w = pl__calloc((size_t)per, sizeof *w);
    int64_t *grp = pl__calloc((size_t)per, sizeof *grp);
    int64_t *slot = pl__calloc((size_t)nmb, sizeof *slot);
    double *mbcost = pl__calloc((size_t)nmb, sizeof *mbcost);
    int rc = PL_OK;
    if (!fill || !members || !w || !grp || !slot || !mbcost) {
        rc = PL_ENOMEM;
        goto out;
    }
    for (int64_t q = 0; q < G; q++) {
        int64_t r = rank_of[q];
        members[r * per + fill[r]++] = q;
    }
    *max_rank = 0;
    *max_mb = 0;
    for (int64_t r = 0; r < dp; r++) {
        double rc_sum = 0;
        for (int64_t j = 0; j < per; j++) {
            w[j] = cost[members[r * per + j]];
            rc_sum += w[j];
        }
        if (rc_sum > *max_rank) *max_rank = rc_sum;
        if ((rc = partition_equal(w, per, nmb, method, grp))) goto out;
        for (int64_t g = 0; g < nmb; g++) {
            slot[g] = 0;
            mbcost[g] = 0;
        }
        for (int64_t j = 0; j < per; j++) {
            int64_t g = grp[j];
            arrangement[r * per + g * mbs + slot[g]++] = members[r * per + j];
            mbcost[g] += w[j];
        }
        for (int64_t g = 0; g < nmb; g++)
            if (mbcost[g] > *max_mb) *max_mb = mbcost[g];
    }
out:
    free(fill);
    free(members);
    free(w);
    free(grp);
    free(slot);
    free(mbcost);
    return rc;
}

/*
 * B: chunks, most costly first, to the least loaded rank with room (best fit
 * among the rank's sequences).  bin_of receives global bins r * per + j.
 * Returns 1 if every chunk found room, 0 if not, or a negative error.
 *
 * "The least loaded rank with room" is a query over ranks: a tournament
 * tree keeps, per subtree, the least load (ranks with no free space count as
 * infinitely loaded) and the most free space of any one sequence, and a
 * left-first search pruned by both finds the least loaded rank (lowest index
 * on ties) whose roomiest sequence holds the chunk.  A histogram of free
 * space per sequence tells at once when no sequence anywhere has room, so a
 * step whose packing is too tight for regrouping gives up after one look
 * instead of searching every rank.  The order of chunks comes from a
 * counting sort by length when the cost grows with length (a, b >= 0; the
 * same order as sorting by cost, ties by index).
 */
typedef struct pl__rtree {
    int64_t size;   /* leaves: a power of two >= dp */
    double *load;   /* [2 * size] least load in the subtree */
    int64_t *room;  /* [2 * size] most free space of one sequence */
} pl__rtree;

static void rtree_set(pl__rtree *t, int64_t r, double load, int64_t room) {
    int64_t i = t->size + r;
    t->load[i] = room > 0 ? load : HUGE_VAL;
    t->room[i] = room;
    for (i /= 2; i >= 1; i /= 2) {
        double l = t->load[2 * i], rr = t->load[2 * i + 1];
        t->load[i] = l <= rr ? l : rr;
        int64_t a = t->room[2 * i], b = t->room[2 * i + 1];
        t->room[i] = a >= b ? a : b;
    }
}

/* The least loaded leaf with room >= need under node i, into best and
 * best_load. */
static void rtree_find(const pl__rtree *t, int64_t i, int64_t need,
                           int64_t *best, double *best_load) {
    if (t->room[i] < need) return;
    if (*best >= 0 && !(t->load[i] < *best_load)) return;
    if (i >= t->size) {
        *best = i - t->size;
        *best_load = t->load[i];
        return;
    }
    rtree_find(t, 2 * i, need, best, best_load);
    rtree_find(t, 2 * i + 1, need, best, best_load);
}

/* Chunk order for B: decreasing cost, ties by index. */
static int regroup_order(const pl_planner *p, const pl_chunk *placed,
                             int64_t n, pl__ci *order) {
    const pl_config *c = p->cfg;
    const int64_t maxlen = p->max_chunk;
    /* (With an encoder term cost is not a function of length alone.) */
    int counting = c->cost.a >= 0 && c->cost.b >= 0 &&
                   (c->cost.a > 0 || c->cost.b > 0) && !pl__has_encoder_cost(p);
    for (int64_t i = 0; i < n && counting; i++)
        if (placed[i].length < 0 || placed[i].length > maxlen) counting = 0;
    if (!counting) {
        for (int64_t i = 0; i < n; i++)
            order[i] = (pl__ci){pl__chunk_cost(c, placed[i].length) - c->cost.c +
                                    pl__chunk_encoder_cost(p, &placed[i]),
                                i};
        sort_ci_desc(order, n);
        return PL_OK;
    }
    /* Cost strictly increases with length: a stable counting sort by
     * decreasing length is the same order. */
    int64_t *start = pl__calloc((size_t)maxlen + 2, sizeof *start);
    if (!start) return PL_ENOMEM;
    for (int64_t i = 0; i < n; i++) start[maxlen - placed[i].length + 1]++;
    for (int64_t v = 1; v <= maxlen + 1; v++) start[v] += start[v - 1];
    for (int64_t i = 0; i < n; i++) {
        int64_t at = start[maxlen - placed[i].length]++;
        order[at].i = i;
    }
    for (int64_t j = 0; j < n; j++)
        order[j].w = pl__chunk_cost(c, placed[order[j].i].length) - c->cost.c;
    free(start);
    return PL_OK;
}

static int b_regroup(const pl_planner *p, const pl_chunk *placed, int64_t n,
                       int64_t G, int64_t per, int64_t S, double cap,
                       int least_cost, int32_t *bin_of) {
    const pl_config *c = p->cfg;
    /* variable_length rows hold micro_batch_size sequences' tokens: long_short
       decides the packing (membership) but not the dealing. */
    const int64_t dp = G / per, thr = least_cost ? 0 : c->long_short_threshold;
    int64_t size = 1;
    while (size < dp) size *= 2;
    pl__ci *order = pl__calloc((size_t)(n ? n : 1), sizeof *order);
    int64_t *space = pl__calloc((size_t)G, sizeof *space);
    double *load = pl__calloc((size_t)dp, sizeof *load);
    int64_t *hist = pl__calloc((size_t)S + 1, sizeof *hist);
    double *bcost = least_cost ? pl__calloc((size_t)G, sizeof *bcost) : NULL;
    pl__rtree t = {size, pl__calloc((size_t)(2 * size), sizeof(double)),
                   pl__calloc((size_t)(2 * size), sizeof(int64_t))};
    int rc = 1;
    if (!order || !space || !load || !hist || !t.load || !t.room ||
        (least_cost && !bcost)) {
        rc = PL_ENOMEM;
        goto out;
    }
    if ((rc = regroup_order(p, placed, n, order))) goto out;
    rc = 1;
    for (int64_t b = 0; b < G; b++) space[b] = S;
    hist[S] = G;
    int64_t top = S; /* the most free space of any sequence */
    for (int64_t i = 0; i < 2 * size; i++) {
        t.load[i] = HUGE_VAL;
        t.room[i] = -1;
    }
    for (int64_t r = 0; r < dp; r++) rtree_set(&t, r, 0, S);
    for (int64_t j = 0; j < n; j++) {
        const pl_chunk *ch = &placed[order[j].i];
        int64_t len = pl__padded(p, ch->length);
        int is_long = thr > 0 && ch->length > thr;
        int64_t need = is_long ? S : len;
        while (top > 0 && hist[top] == 0) top--;
        if (top < need) { /* no sequence anywhere has room */
            rc = 0;
            break;
        }
        int64_t r = -1;
        double best_load = 0;
        rtree_find(&t, 1, need, &r, &best_load);
        if (r < 0) {
            rc = 0;
            break;
        }
        int64_t best = -1, room = 0;
        for (int64_t q = 0; q < per; q++) {
            int64_t sp = space[r * per + q];
            if (is_long ? sp == S : sp >= len) {
                if (best < 0 ||
                    (least_cost ? bcost[r * per + q] < bcost[r * per + best]
                                : sp < space[r * per + best]))
                    best = q;
            }
        }
        const int64_t found = r * per + best;
        if (least_cost) bcost[found] += order[j].w;
        hist[space[found]]--;
        space[found] = is_long ? 0 : space[found] - len;
        hist[space[found]]++;
        for (int64_t q = 0; q < per; q++)
            if (space[r * per + q] > room) room = space[r * per + q];
        load[r] += order[j].w;
        if (load[r] > cap) { /* B cannot beat A any more */
            rc = 0;
            break;
        }
        rtree_set(&t, r, load[r], room);
        bin_of[order[j].i] = (int32_t)found;
    }
out:
    free(order);
    free(space);
    free(load);
    free(hist);
    free(bcost);
    free(t.load);
    free(t.room);
    return rc;
}

/* The packed step's arrangement by balance greedy or karmarkar_karp: A or B
 * above.  bin_of is replaced by B's bins when B is kept. */
static int balance_packed(pl_planner *p, const pl_chunk *placed, int64_t n,
                              int32_t *bin_of, int64_t *arrangement) {
    const pl_config *c = p->cfg;
    const int64_t G = c->global_batch_size, dp = c->topology.dp, per = G / dp;
    /* variable_length falls back on karmarkar_karp's arrangement. */
    const int method = c->balance == PL__BALANCE_GREEDY ? PL__BALANCE_GREEDY : PL__BALANCE_KK;
    double *tok = pl__calloc((size_t)G, sizeof *tok);
    double *attn = pl__calloc((size_t)G, sizeof *attn);
    double *cost = pl__calloc((size_t)G, sizeof *cost);
    int64_t *rank_of = pl__calloc((size_t)G, sizeof *rank_of);
    int64_t *arr_b = pl__calloc((size_t)G, sizeof *arr_b);
    int32_t *bin_b = pl__calloc((size_t)(n ? n : 1), sizeof *bin_b);
    int rc = PL_OK;
    if (!tok || !attn || !cost || !rank_of || !arr_b || !bin_b) {
        rc = PL_ENOMEM;
        goto out;
    }
    /* A: pack-then-balance. */
    double max_a, mb_a, max_b = 0, mb_b = 0;
    bin_costs(p, placed, n, bin_of, G, tok, attn, cost);
    if ((rc = partition_equal(cost, G, dp, method, rank_of))) goto out;
    if ((rc = arrange(p, method, cost, rank_of, arrangement, &max_a, &mb_a)))
        goto out;
    /* The lower bound of pl_plan (pack.c computes the same). */
    double total = 0, worst = 0;
    for (int64_t q = 0; q < G; q++) total += cost[q];
    for (int64_t i = 0; i < n; i++) {
        double cc = pl__chunk_cost(c, placed[i].length) +
                    pl__chunk_encoder_cost(p, &placed[i]);
        if (cc > worst) worst = cc;
    }
    double lb = total / (double)dp > worst ? total / (double)dp : worst;
    /* B: regroup-then-pack, unless A is as good as it gets.  B's rank loads
     * leave out the per-sequence constant c (the same per - c on every rank),
     * so its cap is A's largest without it. */
    int ok = 0;
    if (max_a > lb * (1 + PL__GOOD_ENOUGH))
        ok = b_regroup(p, placed, n, G, per, c->seq_length,
                         max_a - (double)per * c->cost.c, 0, bin_b);
    if (ok < 0) {
        rc = ok;
        goto out;
    }
    if (ok) {
        bin_costs(p, placed, n, bin_b, G, tok, attn, cost);
        for (int64_t q = 0; q < G; q++) rank_of[q] = q / per;
        if ((rc = arrange(p, method, cost, rank_of, arr_b, &max_b, &mb_b))) goto out;
    }
    if (ok && (max_b < max_a || (max_b == max_a && mb_b < mb_a))) {
        memcpy(bin_of, bin_b, (size_t)n * sizeof *bin_of);
        memcpy(arrangement, arr_b, (size_t)G * sizeof *arrangement);
    }
out:
    free(tok);
    free(attn);
    free(cost);
    free(rank_of);
    free(arr_b);
    free(bin_b);
    return rc;
}

/*
 * balance: variable_length.  The step's chunks (the packing's, unchanged)
 * are dealt to dp * nmb micro-batch rows of max_tokens tokens, nmb per rank:
 * most costly first, to the least loaded rank that has a row with room, and
 * in it to the row of least cost with room (so that pipeline stages see even
 * micro-batches).  Ranks end with unequal token counts and near-equal costs.
 * The per-row constant c is the same on every rank (nmb rows each), so the
 * dealing ignores it.  When some chunk fits in no row (max_tokens close to
 * micro_batch_size * seq_length) the step falls back on karmarkar_karp's
 * arrangement of the packed sequences, micro_batch_size of them per row.
 */
static int balance_vlen(pl_planner *p, const pl_chunk *placed, int64_t n,
                            int32_t *bin_of, int64_t *arrangement) {
    const pl_config *c = p->cfg;
    const int64_t G = c->global_batch_size, dp = c->topology.dp;
    const int64_t mbs = c->micro_batch_size, nmb = G / (dp * mbs), R = dp * nmb;
    const int64_t M = pl__row_tokens(c);
    int32_t *row_of = pl__calloc((size_t)(n ? n : 1), sizeof *row_of);
    if (!row_of) return PL_ENOMEM;
    int ok = b_regroup(p, placed, n, R, nmb, M, HUGE_VAL, 1, row_of);
    if (ok < 0) {
        free(row_of);
        return ok;
    }
    if (ok) {
        memcpy(bin_of, row_of, (size_t)n * sizeof *bin_of);
    } else { /* karmarkar_karp's sequences, mbs to a row */
        int64_t *arr = pl__calloc((size_t)G, sizeof *arr);
        int32_t *row_of_seq = pl__calloc((size_t)G, sizeof *row_of_seq);
        int rc = arr && row_of_seq ? balance_packed(p, placed, n, bin_of, arr)
                                   : PL_ENOMEM;
        if (rc == PL_OK) {
            for (int64_t slot = 0; slot < G; slot++)
                row_of_seq[arr[slot]] = (int32_t)(slot / mbs);
            for (int64_t i = 0; i < n; i++) bin_of[i] = row_of_seq[bin_of[i]];
        }
        free(arr);
        free(row_of_seq);
        if (rc) {
            free(row_of);
            return rc;
        }
    }
    for (int64_t q = 0; q < R; q++) arrangement[q] = q;
    free(row_of);
    return PL_OK;
}

int pl__balance(pl_planner *p, const pl_chunk *placed, int64_t n,
                int32_t *bin_of, int64_t *arrangement) {
    if (p->cfg->balance == PL__BALANCE_VLEN)
        return balance_vlen(p, placed, n, bin_of, arrangement);
    return balance_packed(p, placed, n, bin_of, arrangement);
}
