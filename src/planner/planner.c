/*
 * planner.c -- the planner role (docs/internals/design.md, "Roles"): the
 * mixture, the per-source shuffles and consumption counters, chunking, and
 * the sequence of plans.  It sees document lengths only, never payloads.
 *
 * Mixture (SPEC section 1).  Weights are fractions of tokens.  For every
 * source the planner keeps the tokens drawn and a target: each drawn chunk of
 * L tokens raises source k's target by w_k(step) * L.  The next chunk comes
 * from the source with the largest deficit (target - drawn), ties to the
 * lowest index.  Drawing whole chunks (not documents) keeps |drawn - target|
 * within about one chunk at every step boundary.
 *
 * The draw.  Targets and weights are exact fixed point: a weight is the
 * nearest multiple of 2^-48 to the normalized weight (at least 2^-48 for a
 * positive one), a target a multiple of 2^-48 token in a 128-bit integer, so
 * every target after g more tokens is target + w * g without rounding, and
 * the state records it exactly (SPEC section 4).  Sources of equal weight
 * and equal target at a step's start stay equal through the step: the draw
 * groups them into classes (a hash on the two), and among a class's members
 * the largest deficit is the fewest drawn tokens (then the lowest index): a
 * 4-ary heap per class.  The classes' deficits are lines in g, the tokens
 * drawn in the step, and a kinetic tournament over the classes (below)
 * keeps the largest: a draw costs O(log members + log classes) plus the
 * certificates that come due, whatever the weights.  A plain pass over the
 * sources (draw_linear, tests) is the reference it must match
 * (tests/c/test_planner_draw.c).  Before 2026-12-02 the targets were doubles
 * that each draw raised by its own rounded w * L; a state blob of version 2
 * or 1 loads with its targets converted (exactly, to 2^-48 token), and
 * continues by the exact rule.
 *
 * Chunking.  A source keeps the document it is in the middle of; a document
 * longer than max_chunk yields several chunks in a row (long_documents:
 * split) or one (truncate; that chunk keeps the label of its last token, so
 * it does not carry PL_CHUNK_DOC_END).  Under packing: concat_chunk a partly
 * drawn document is continued before anything else is drawn, so documents
 * follow each other whole.  Documents are taken from the source's keyed
 * permutation of its epoch (shuffle.c); a finished permutation starts the
 * next epoch with a new key.
 */
#include "planner/planner.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

int pl__chunks_push(pl__chunks *c, const pl_chunk *ch) {
    if (c->n == c->cap) {
        int64_t nc = c->cap ? c->cap * 2 : 64;
        pl_chunk *v = pl__realloc_array(c->v, (size_t)nc, sizeof *v);
        if (!v) return PL_ENOMEM;
        c->v = v;
        c->cap = nc;
    }
    c->v[c->n++] = *ch;
    return PL_OK;
}

void pl__chunks_free(pl__chunks *c) {
    free(c->v);
    c->v = NULL;
    c->n = c->cap = 0;
}

uint64_t pl__mixture_hash(const pl_config *cfg) {
    uint64_t h = pl__hash64("mixture", 7, (uint64_t)cfg->n_sources);
    for (int64_t i = 0; i < cfg->n_sources; i++) {
        const pl__source_cfg *s = &cfg->sources[i];
        h = pl__hash64(s->name, strlen(s->name), h);
        h = pl__hash64(&s->weight, sizeof s->weight, h);
    }
    int64_t hdr[3] = {cfg->has_schedule, cfg->interpolation, cfg->n_points};
    h = pl__hash64(hdr, sizeof hdr, h);
    for (int64_t k = 0; k < cfg->n_points; k++) {
        h = pl__hash64(&cfg->points[k].step, sizeof(int64_t), h);
        h = pl__hash64(cfg->points[k].weights,
                       (size_t)cfg->n_sources * sizeof(double), h);
    }
    return h;
}

uint64_t pl__arrangement_hash(const pl_config *cfg) {
    uint64_t h = pl__hash64("arrangement", 11, (uint64_t)cfg->balance);
    h = pl__hash64(&cfg->long_short_threshold, sizeof cfg->long_short_threshold, h);
    if (cfg->balance == PL__BALANCE_VLEN) {
        const int64_t m = pl__row_tokens(cfg);
        h = pl__hash64(&m, sizeof m, h);
    }
    if (cfg->balance_window > 1) /* the steps' membership within a window */
        h = pl__hash64(&cfg->balance_window, sizeof cfg->balance_window, h);
    if (cfg->balance != PL__BALANCE_NONE) { /* the cost model only arranges then */
        const double cost[6] = {cfg->cost.a,     cfg->cost.b,     cfg->cost.c,
                                (double)cfg->cost.window, cfg->cost.enc_a, cfg->cost.enc_b};
        h = pl__hash64(cost, sizeof cost, h);
    }
    uint64_t caps = 0; /* by name, in any order: a sum */
    for (int64_t i = 0; i < cfg->n_sources; i++) {
        const pl__source_cfg *s = &cfg->sources[i];
        if (s->max_epochs > 0)
            caps += pl__hash64(s->name, strlen(s->name), (uint64_t)s->max_epochs);
    }
    return pl__hash64(&caps, sizeof caps, h);
}

/* Up to this many classes the draw scans their lines instead of keeping the
 * tournament: a few exact comparisons cost less than a path's certificates
 * (mixtures of a few weights: with 4 classes the tree was 17 % of a step's
 * planning, the scan 4 %;
 * docs/internals/decisions/0002-exact-targets-and-a-kinetic-tournament.md). */
#define PL__TN_SCAN_MAX 8

static void planner_perm(pl_planner *p, int64_t i) {
    pl__perm_init(&p->perm[i], (uint64_t)p->num_docs[i], p->cfg->seed,
                  p->cfg->sources[i].name, (uint64_t)p->src[i].epoch);
}

static int planner_create_impl(const pl_config *cfg, pl_source *const *sources,
                      int64_t n_sources, pl_planner **out) {
    *out = NULL;
    pl_planner *p = pl__calloc(1, sizeof *p);
    if (!p) return PL_ENOMEM;
    *out = p;
    if (!cfg || !sources || n_sources != cfg->n_sources) {
        pl__fmt(p->errmsg, sizeof p->errmsg,
                "planner: expected %lld sources", cfg ? (long long)cfg->n_sources : 0LL);
        return p->failed = PL_EINVAL;
    }
    p->cfg = pl__config_share(cfg);
    p->n_sources = n_sources;
    p->sources = sources;
    p->num_docs = pl__calloc((size_t)n_sources, sizeof *p->num_docs);
    p->src = pl__calloc((size_t)n_sources, sizeof *p->src);
    p->perm = pl__calloc((size_t)n_sources, sizeof *p->perm);
    p->weights = pl__calloc((size_t)n_sources, sizeof *p->weights);
    p->pin_w = pl__calloc((size_t)(n_sources > 0 ? n_sources : 1), sizeof *p->pin_w);
    p->pin_step = -1;
    p->win_start = p->win_skip_to = -1;
    p->act = pl__calloc((size_t)n_sources, sizeof *p->act);
    p->act_w = pl__calloc((size_t)n_sources, sizeof *p->act_w);
    p->doc_lo = pl__calloc((size_t)n_sources, sizeof *p->doc_lo);
    size_t ns = (size_t)(n_sources > 0 ? n_sources : 1);
    p->cls_w = pl__calloc(ns, sizeof *p->cls_w);
    p->cls_t = pl__calloc(ns, sizeof *p->cls_t);
    size_t tm = 1;
    while (tm < ns) tm *= 2;
    p->tn_node = pl__calloc(2 * tm, sizeof *p->tn_node);
    p->tn_line = pl__calloc(ns, sizeof *p->tn_line);
    p->tn_scan_max = PL__TN_SCAN_MAX;
    p->ahead = pl__calloc(ns, sizeof *p->ahead);
    p->cls_off = pl__calloc(ns, sizeof *p->cls_off);
    p->cls_size = pl__calloc(ns, sizeof *p->cls_size);
    p->cls_hs = pl__calloc(ns, sizeof *p->cls_hs);
    p->cls_of = pl__calloc(ns, sizeof *p->cls_of);
    p->heap = pl__calloc(ns, sizeof *p->heap);
    p->hpos = pl__calloc(ns, sizeof *p->hpos);
    p->cls_hash_cap = 16;
    while (p->cls_hash_cap < 2 * (int64_t)ns) p->cls_hash_cap *= 2;
    p->cls_hash = pl__calloc((size_t)p->cls_hash_cap, sizeof *p->cls_hash);
    if (!p->cfg || !p->num_docs || !p->src || !p->perm || !p->weights || !p->pin_w ||
        !p->act || !p->act_w || !p->doc_lo || !p->tn_node || !p->tn_line ||
        !p->ahead || !p->cls_w || !p->cls_t || !p->cls_off || !p->cls_size ||
        !p->cls_hs || !p->cls_of || !p->heap || !p->hpos || !p->cls_hash) {
        pl__fmt(p->errmsg, sizeof p->errmsg, "planner: out of memory");
        return p->failed = PL_ENOMEM;
    }
    const pl_config *c = p->cfg;
    p->align = c->topology.cp > 1 ? 2 * c->topology.cp : 1;
    p->max_chunk = c->seq_length / p->align * p->align;
    if (c->packing == PL__PACK_CONCAT_CHUNK && c->topology.cp > 1) {
        pl__fmt(p->errmsg, sizeof p->errmsg,
                "packing: concat_chunk does not support topology.cp > 1");
        return p->failed = PL_ECONFIG;
    }
    p->mixture_hash = pl__mixture_hash(c);
    p->arrangement_hash = pl__arrangement_hash(c);
    for (int64_t i = 0; i < n_sources; i++) {
        int64_t lo = 0, hi = pl_source_num_documents(sources[i]);
        pl__split_range(pl__source_split(c, i), c->split_part, hi, &lo, &hi);
        p->doc_lo[i] = lo;
        p->num_docs[i] = hi - lo;
        p->src[i].cur_index = -1;
        p->ahead[i].at = -1;
        /* Records left out at open count as skipped (on_error: skip). */
        p->src[i].skipped = pl_source_num_skipped(sources[i]);
        planner_perm(p, i);
        int used = c->has_schedule ? 0 : c->sources[i].weight > 0;
        for (int64_t k = 0; k < c->n_points && !used; k++)
            used = c->points[k].weights[i] > 0;
        if (used && p->num_docs[i] == 0 && !c->eval) {
            int64_t all = pl_source_num_documents(sources[i]);
            if (all > 0)
                pl__fmt(p->errmsg, sizeof p->errmsg,
                        "source '%s' (%s): its train split holds none of its "
                        "%lld documents, but it has a positive weight",
                        c->sources[i].name, c->sources[i].path, (long long)all);
            else
                pl__fmt(p->errmsg, sizeof p->errmsg,
                        "source '%s' (%s) has no documents but a positive weight",
                        c->sources[i].name, c->sources[i].path);
            return p->failed = PL_ECONFIG;
        }
    }
    return PL_OK;
}

void pl_planner_free(pl_planner *p) {
    if (!p) return;
    pl__pack_free(p->pack);
    pl__window_free(p);
    pl__chunks_free(&p->carry);
    pl__chunks_free(&p->items);
    free(p->weights);
    free(p->pin_w);
    free(p->act);
    free(p->act_w);
    free(p->cls_w);
    free(p->cls_t);
    free(p->tn_node);
    free(p->tn_line);
    free(p->ahead);
    free(p->cls_off);
    free(p->cls_size);
    free(p->cls_hs);
    free(p->cls_of);
    free(p->heap);
    free(p->hpos);
    free(p->cls_hash);
    free(p->perm);
    free(p->src);
    free(p->num_docs);
    free(p->doc_lo);
    pl_config_free(p->cfg);
    free(p);
}

const char *pl_planner_errmsg(const pl_planner *p) {
    return p ? p->errmsg : "out of memory";
}

/* The document at position pos of source i's order in its current epoch
 * (an evaluation pass reads its documents in index order). */
static inline int64_t planner_doc_at(const pl_planner *p, int64_t i, int64_t pos) {
    return p->doc_lo[i] + (p->cfg->eval ? pos
                                        : (int64_t)pl__perm_apply(&p->perm[i], (uint64_t)pos));
}

/* Move source i to its next usable document.  PL_OK, PL_DONE when the
 * source has been read max_epochs times, or an error.  A capped source counts
 * its last epoch as completed as soon as its last document is drawn, so that
 * epochs_completed says so and source_exhausted needs no lookahead. */
static int next_document(pl_planner *p, int64_t i) {
    pl__src_state *s = &p->src[i];
    const pl__source_cfg *sc = &p->cfg->sources[i];
    while (s->cur_index < 0) {
        if (sc->max_epochs > 0 && s->epoch >= sc->max_epochs) return PL_DONE;
        if (s->drawn_in_epoch >= p->num_docs[i]) {
            s->epoch++;
            s->drawn_in_epoch = 0;
            planner_perm(p, i);
        }
        if (s->since_yield > p->num_docs[i]) {
            pl__fmt(p->errmsg, sizeof p->errmsg,
                    "source '%s' (%s): no readable non-empty document in a "
                    "whole epoch (%lld skipped)",
                    sc->name, sc->path, (long long)s->skipped);
            return PL_ERECORD;
        }
        /* A raw text source tokenizes ahead in this order (no-op else). */
        pl__source_lookahead(p->sources[i], p->cfg->eval ? NULL : &p->perm[i],
                             p->doc_lo[i], p->num_docs[i], s->epoch,
                             s->drawn_in_epoch);
        pl__ahead *ah = &p->ahead[i];
        int64_t idx = ah->at == s->drawn_in_epoch && ah->epoch == s->epoch
                          ? ah->doc
                          : planner_doc_at(p, i, s->drawn_in_epoch);
        s->drawn_in_epoch++;
        s->since_yield++;
        /* The next document of this epoch: its index entry is in cache by
           the time this source is drawn again. */
        ah->at = -1;
        if (s->drawn_in_epoch < p->num_docs[i]) {
            ah->doc = planner_doc_at(p, i, s->drawn_in_epoch);
            ah->at = s->drawn_in_epoch;
            ah->epoch = s->epoch;
            pl__source_prefetch(p->sources[i], ah->doc);
        }
        if (sc->max_epochs > 0 && s->drawn_in_epoch >= p->num_docs[i] &&
            s->epoch + 1 >= sc->max_epochs) {
            s->epoch++;
            s->drawn_in_epoch = 0;
        }
        int64_t len = 0;
        char err[PL__ERRMSG_CAP];
        int rc = pl__source_length_unchecked(p->sources[i], idx, &len, err,
                                             sizeof err);
        if (rc < 0) {
            if (p->cfg->on_error == PL__ONERR_SKIP && rc != PL_ENOMEM) {
                s->skipped++;
                continue;
            }
            pl__fmt(p->errmsg, sizeof p->errmsg, "source '%s': %s", sc->name,
                    err);
            return rc;
        }
        if (len <= 0) continue; /* an empty document holds nothing to draw */
        s->cur_index = idx;
        s->cur_offset = 0;
        s->cur_length = len;
        s->documents++;
        s->since_yield = 0;
    }
    return PL_OK;
}


/* ------------------------------------------------------------ weights */

/* A normalized weight (0 <= w <= 1) in units of 2^-48: the nearest, and at
 * least 1 for a positive weight, so that it is still drawn. */
static int64_t weight_fixed(double w) {
    if (!(w > 0)) return 0; /* NaN too */
    if (!(w < 1)) return PL__WONE;
    int64_t x = (int64_t)llround(w * (double)PL__WONE); /* w * 2^48 is exact */
    return x > 0 ? x : 1;
}

/* ------------------------------------------------------------ classes */

static int source_exhausted(const pl_planner *p, int64_t i);

/* Heap order within a class: fewer drawn tokens first (the larger deficit,
 * the targets being equal), then the lower index. */
static inline int hless(pl__hent a, pl__hent b) {
    return a.d < b.d || (a.d == b.d && a.i < b.i);
}

static inline void hset(pl_planner *p, int64_t q, pl__hent e) {
    p->heap[q] = e;
    p->hpos[e.i] = q;
}

/* The heaps are 4-ary: a node's four children (16 bytes each) share one
 * cache line, and a sift crosses half the levels of a binary heap. */
#define PL__HARITY 4

/* Move the source at position q (absolute) of class c's heap down. */
static void hdown(pl_planner *p, int64_t c, int64_t q) {
    const int64_t off = p->cls_off[c], hs = p->cls_hs[c];
    pl__hent *h = p->heap + off, x = h[q - off];
    int64_t r = q - off;
    for (;;) {
        int64_t l = PL__HARITY * r + 1, m = l;
        if (l >= hs) break;
        int64_t end = l + PL__HARITY < hs ? l + PL__HARITY : hs;
        for (int64_t j = l + 1; j < end; j++)
            if (hless(h[j], h[m])) m = j;
        if (!hless(h[m], x)) break;
        hset(p, off + r, h[m]);
        r = m;
    }
    hset(p, off + r, x);
}

/* Restore the heap of class c around position q (absolute). */
static void hfix(pl_planner *p, int64_t c, int64_t q) {
    const int64_t off = p->cls_off[c];
    pl__hent *h = p->heap + off, x = h[q - off];
    int64_t r = q - off;
    while (r > 0) { /* up */
        int64_t up = (r - 1) / PL__HARITY;
        if (!hless(x, h[up])) break;
        hset(p, off + r, h[up]);
        r = up;
    }
    hset(p, off + r, x);
    hdown(p, c, off + r);
}

/* ------------------------------------------------------------ tournament */
/*
 * A kinetic tournament (Basch, Guibas and Hershberger, "Data structures for
 * mobile data", SODA 1997; the kinetic heap of the same authors): the
 * deficit of class c after g tokens of the step is the line
 * tn_line[c].b + tn_line[c].w * g, exact in 128 bits.  Each internal node keeps the
 * winner of its two children at the current g (larger deficit, ties to the
 * lower member index) and the g at which the loser, if its line is steeper,
 * could overtake: a certificate.  A draw lowers one line (the drawn class's
 * member took tokens) and raises g; the nodes on that class's path are
 * recomputed, and so is every node whose certificate has come due.  The
 * certificate is a lower bound computed in doubles (safe: a node recomputed
 * early keeps its winner and gets a later certificate); winners are always
 * decided by exact comparisons, so the result is the exact argmax.  With
 * at most PL__TN_SCAN_MAX classes (tn_scan) the tree is not kept: the leaves
 * hold the lines and the draw scans them (tn_scan_argmax).
 */
#define PL__NEVER INT64_MAX

/* x >= 0 (below 2^103) as a double, within a relative 2^-52: two exact
 * conversions, no branch. */
static inline double gap_double(pl__i128 x) {
    return (double)(int64_t)(x >> 40) * 0x1p40 +
           (double)(int64_t)(x & (((pl__i128)1 << 40) - 1));
}

/* The certificate of a node at g whose winner leads its loser by gap >= 0
 * and whose loser gains dw per token: the loser cannot win before gap / dw
 * more tokens (a lower bound: the doubles are within a relative 2^-51, less
 * a margin of 2^-40 and one token; at least one token on).  PL__NEVER when
 * dw <= 0.  Free of branches: it is computed on every level of a path. */
static inline int64_t tn_due(pl__i128 gap, int64_t dw, int64_t g) {
    const int64_t dws = dw > 0 ? dw : 1;
    double t = gap_double(gap) / (double)dws * (1 - 0x1p-40) - 1;
    t = t < 0x1p61 ? t : 0x1p61; /* minsd; integers from here */
    int64_t ti = (int64_t)t;
    ti = ti < 1 ? 1 : ti;
    const int64_t when = ti >= ((int64_t)1 << 61) ? PL__NEVER : g + ti;
    return dw > 0 ? when : PL__NEVER;
}

/* Recompute internal node v at g from its children's winners.  Written to
 * compile to conditional moves: which child wins is a coin toss to the
 * branch predictor. */
static inline void tn_pull(pl_planner *p, int64_t v, int64_t g) {
    pl__tnode *n = p->tn_node, *kid = n + 2 * v;
    const int32_t a = kid[0].win, b = kid[1].win;
    int64_t due = PL__NEVER;
    int32_t w = a < 0 ? b : a;
    if (a >= 0 && b >= 0) {
        const pl__tline *la = &p->tn_line[a], *lb = &p->tn_line[b];
        const int64_t wa = la->w, wb = lb->w;
        pl__i128 diff = (la->b + (pl__i128)wa * g) - (lb->b + (pl__i128)wb * g);
        const int a_wins = diff > 0 || (diff == 0 && la->key < lb->key);
        w = a_wins ? a : b;
        pl__i128 gap = a_wins ? diff : -diff;
        due = tn_due(gap, a_wins ? wb - wa : wa - wb, g);
    }
    n[v].win = w;
    int64_t m = kid[0].min < kid[1].min ? kid[0].min : kid[1].min;
    n[v].min = due < m ? due : m;
}

/* Bring the subtree of v up to date at g (its certificates come due). */
static void tn_fix(pl_planner *p, int64_t v, int64_t g) {
    if (v >= p->tn_m) return;
    if (p->tn_node[2 * v].min <= g) tn_fix(p, 2 * v, g);
    if (p->tn_node[2 * v + 1].min <= g) tn_fix(p, 2 * v + 1, g);
    tn_pull(p, v, g);
}

/* Class c's leaf from its heap: its line, or empty. */
static inline void tn_leaf(pl_planner *p, int64_t c) {
    pl__tnode *leaf = &p->tn_node[p->tn_m + c];
    leaf->min = PL__NEVER;
    if (c < p->n_cls && p->cls_hs[c] > 0) {
        pl__hent top = p->heap[p->cls_off[c]];
        pl__tline *l = &p->tn_line[c];
        l->b = p->cls_t[c] - ((pl__i128)top.d << PL__TBITS);
        l->w = p->cls_w[c];
        l->key = top.i;
        leaf->win = (int32_t)c;
    } else {
        leaf->win = -1;
    }
}

/* Class c's line changed (its top member, its drawn tokens, or it emptied):
 * set its leaf and (with the tree; a scan reads the leaves' lines only)
 * recompute its path at g, fixing what came due beside it.
 * The path's winner (champion) stays in registers from level to level and
 * the siblings' lines do not depend on it, so the levels' comparisons and
 * certificate divisions overlap instead of forming one chain through
 * memory. */
static void tn_update(pl_planner *p, int64_t c, int64_t g) {
    tn_leaf(p, c);
    if (p->tn_scan) return; /* the draw scans the lines */
    pl__tnode *n = p->tn_node;
    int64_t v = p->tn_m + c;
    int32_t cw = n[v].win;
    pl__i128 cd = 0;
    int64_t cwt = 0, ckey = 0, cmin = PL__NEVER;
    if (cw >= 0) {
        const pl__tline *l = &p->tn_line[cw];
        cd = l->b + (pl__i128)l->w * g;
        cwt = l->w;
        ckey = l->key;
    }
    for (; v > 1; v >>= 1) {
        const int64_t sib = v ^ 1;
        if (n[sib].min <= g) tn_fix(p, sib, g);
        const int32_t sw = n[sib].win;
        int64_t due = PL__NEVER;
        if (sw >= 0) {
            const pl__tline *ls = &p->tn_line[sw];
            const int64_t sw_w = ls->w, skey = ls->key;
            const pl__i128 sd = ls->b + (pl__i128)sw_w * g;
            if (cw < 0) {
                cw = sw, cd = sd, cwt = sw_w, ckey = skey;
            } else {
                /* Branch-free: keep the champion (mask of ones) or take
                   the sibling's line. */
                const pl__i128 diff = cd - sd;
                const int64_t dh = (int64_t)(diff >> 64);
                const uint64_t dl = (uint64_t)diff;
                const int64_t keep = (int64_t)((dh > 0) | ((dh == 0) & (dl != 0)) |
                                               ((dh == 0) & (dl == 0) & (ckey < skey)));
                const int64_t mask = -keep;
                const pl__i128 m128 = (pl__i128)mask; /* sign-extended */
                const pl__i128 gap = (diff ^ ~m128) + (1 - keep); /* |diff| */
                due = tn_due(gap, ((sw_w - cwt) & mask) | ((cwt - sw_w) & ~mask), g);
                cw = (int32_t)((cw & (int32_t)mask) | (sw & ~(int32_t)mask));
                cd = (cd & m128) | (sd & ~m128);
                cwt = (cwt & mask) | (sw_w & ~mask);
                ckey = (ckey & mask) | (skey & ~mask);
            }
        }
        const int64_t sm = n[sib].min;
        cmin = sm < cmin ? sm : cmin;
        cmin = due < cmin ? due : cmin;
        n[v >> 1].win = cw;
        n[v >> 1].min = cmin;
    }
}

static void tn_build(pl_planner *p) {
    int64_t m = 1;
    while (m < p->n_cls) m *= 2;
    p->tn_m = m;
    p->tn_scan = p->n_cls <= p->tn_scan_max;
    for (int64_t c = 0; c < m; c++) tn_leaf(p, c);
    if (!p->tn_scan)
        for (int64_t v = m - 1; v >= 1; v--) tn_pull(p, v, 0);
}

/* Few classes: the largest deficit at g by a scan, with the tournament's
 * rule (the larger deficit; ties to the lower member index); -1 when every
 * class is empty. */
static int64_t tn_scan_argmax(const pl_planner *p, int64_t g) {
    const pl__tnode *leaf = p->tn_node + p->tn_m;
    int64_t best = -1, bkey = 0;
    pl__i128 bd = 0;
    for (int64_t c = 0; c < p->n_cls; c++) {
        if (leaf[c].win < 0) continue;
        const pl__tline *l = &p->tn_line[c];
        const pl__i128 d = l->b + (pl__i128)l->w * g;
        if (best < 0 || d > bd || (d == bd && l->key < bkey)) {
            best = c;
            bd = d;
            bkey = l->key;
        }
    }
    return best;
}

/* The class with the largest deficit at p->g, -1 when every heap is empty. */
static int64_t tn_argmax(pl_planner *p) {
    if (p->tn_scan) return tn_scan_argmax(p, p->g);
    if (p->tn_m > 1 && p->tn_node[1].min <= p->g) tn_fix(p, 1, p->g);
    return p->tn_node[1].win;
}

/* Take source i out of its class's heap (it stays a member: its target
 * still rises with the class's). */
static void cls_remove(pl_planner *p, int64_t i) {
    int64_t c = p->cls_of[i], q = p->hpos[i];
    int64_t last = p->cls_off[c] + p->cls_hs[c] - 1;
    if (q > last) return; /* already out */
    pl__hent y = p->heap[last], me = p->heap[q];
    hset(p, last, me);
    p->cls_hs[c]--;
    if (q < last) {
        hset(p, q, y);
        hfix(p, c, q);
    }
}

static uint64_t cls_key(int64_t w, pl__i128 t) {
    uint64_t a = (uint64_t)w, b = (uint64_t)t, c = (uint64_t)(t >> 64);
    uint64_t h = a * 0x9E3779B97F4A7C15ULL ^ (b + 0x632BE59BD9B4E019ULL + (a << 6) + (a >> 2));
    h ^= c * 0xC2B2AE3D27D4EB4FULL;
    h ^= h >> 29;
    h *= 0xBF58476D1CE4E5B9ULL;
    return h ^ (h >> 32);
}

/* Group the act[] sources into classes of equal (weight, target), in the
 * order of their lowest member, with their heaps and the tournament. */
static void cls_build(pl_planner *p) {
    const int64_t cap = p->cls_hash_cap, mask = cap - 1;
    for (int64_t h = 0; h < cap; h++) p->cls_hash[h] = -1;
    int64_t g = 0;
    for (int64_t k = 0; k < p->n_act; k++) {
        int64_t w = p->act_w[k];
        pl__i128 t = p->src[p->act[k]].target;
        int64_t h = (int64_t)(cls_key(w, t) & (uint64_t)mask), c;
        for (;;) {
            c = p->cls_hash[h];
            if (c < 0) {
                c = p->cls_hash[h] = g++;
                p->cls_w[c] = w;
                p->cls_t[c] = t;
                p->cls_size[c] = 0;
                break;
            }
            if (p->cls_w[c] == w && p->cls_t[c] == t) break;
            h = (h + 1) & mask;
        }
        p->cls_of[p->act[k]] = c;
        p->cls_size[c]++;
    }
    p->n_cls = g;
    int64_t at = 0;
    for (int64_t c = 0; c < g; c++) {
        p->cls_off[c] = at;
        p->cls_hs[c] = 0;
        at += p->cls_size[c];
    }
    /* Members in index order; the exhausted ones (max_epochs) after the
     * heap part. */
    for (int64_t k = 0; k < p->n_act; k++) {
        int64_t i = p->act[k], c = p->cls_of[i];
        if (p->has_caps && source_exhausted(p, i)) continue;
        hset(p, p->cls_off[c] + p->cls_hs[c]++,
                 (pl__hent){p->src[i].drawn_tokens, i});
    }
    if (p->has_caps) {
        int64_t *out = p->cls_hash; /* free again: a count per class */
        for (int64_t c = 0; c < g; c++) out[c] = 0;
        for (int64_t k = 0; k < p->n_act; k++) {
            int64_t i = p->act[k], c = p->cls_of[i];
            if (source_exhausted(p, i))
                hset(p, p->cls_off[c] + p->cls_hs[c] + out[c]++,
                         (pl__hent){p->src[i].drawn_tokens, i});
        }
    }
    for (int64_t c = 0; c < g; c++)
        if (p->cls_hs[c] > 1)
            for (int64_t r = (p->cls_hs[c] - 2) / PL__HARITY; r >= 0; r--)
                hdown(p, c, p->cls_off[c] + r);
    tn_build(p);
}

void pl__planner_draw_begin(pl_planner *p) {
    int64_t k = 0;
    for (int64_t i = 0; i < p->n_sources; i++) {
        int64_t w = weight_fixed(p->weights[i]);
        if (w == 0) continue; /* never drawn; its target stays */
        p->act[k] = i;
        p->act_w[k] = w;
        k++;
    }
    p->n_act = k;
    p->g = 0;
    p->has_caps = 0;
    for (int64_t i = 0; i < p->n_sources; i++)
        if (p->cfg->sources[i].max_epochs > 0) p->has_caps = 1;
    /* concat_chunk continues a partly drawn document first (at most one
       source holds one, see pl__planner_draw). */
    p->open_act = -1;
    if (p->cfg->packing == PL__PACK_CONCAT_CHUNK)
        for (int64_t j = 0; j < p->n_act; j++)
            if (p->src[p->act[j]].cur_index >= 0) {
                p->open_act = j;
                break;
            }
    p->open_src = p->open_act >= 0 ? p->act[p->open_act] : -1;
    /* One source: the plain draw is the rule at no cost. */
    p->use_cls = !p->draw_linear && p->n_act > 1;
    if (p->use_cls) cls_build(p);
}

void pl__planner_draw_end(pl_planner *p) {
    /* Every target rose by its weight times the step's drawn tokens. */
    for (int64_t k = 0; k < p->n_act && p->g > 0; k++)
        p->src[p->act[k]].target += (pl__i128)p->act_w[k] * p->g;
    p->g = 0;
}

/* The reference: the first k of the largest deficit over the sources not
 * exhausted, O(sources); -1 when every one is. */
static int64_t pick_linear(pl_planner *p) {
    int64_t best = -1;
    pl__i128 best_deficit = 0;
    for (int64_t k = 0; k < p->n_act; k++) {
        const pl__src_state *s = &p->src[p->act[k]];
        if (p->has_caps && source_exhausted(p, p->act[k])) continue;
        pl__i128 x = s->target + (pl__i128)p->act_w[k] * p->g -
                     ((pl__i128)s->drawn_tokens << PL__TBITS);
        if (best < 0 || x > best_deficit) {
            best = k;
            best_deficit = x;
        }
    }
    return best;
}

/* A source with max_epochs that has completed them (and holds no partly
 * drawn document) is drawn no more; the others share its weight. */
static int source_exhausted(const pl_planner *p, int64_t i) {
    int64_t cap = p->cfg->sources[i].max_epochs;
    const pl__src_state *s = &p->src[i];
    return cap > 0 && s->cur_index < 0 && s->epoch >= cap;
}

int pl__planner_draw(pl_planner *p, pl_chunk *out) {
    if (p->cfg->eval && (p->n_act == 0 || p->spent)) {
        p->spent = 1;
        return PL_DONE; /* the pass has read every document */
    }
    if (p->n_act == 0) {
        pl__fmt(p->errmsg, sizeof p->errmsg,
                "every source weight is zero at step %lld", (long long)p->step);
        return PL_ECONFIG;
    }
    int64_t k, best;
again:
    k = p->use_cls ? tn_argmax(p) : pick_linear(p);
    if (k < 0 && p->cfg->eval) {
        p->spent = 1;
        return PL_DONE;
    }
    if (k < 0) {
        pl__fmt(p->errmsg, sizeof p->errmsg,
                "step %lld: every source with a positive weight has been read "
                "max_epochs times",
                (long long)p->step);
        return PL_ECONFIG;
    }
    /* concat_chunk lays documents end to end, as Megatron's GPTDataset: a
       document that is partly drawn is continued before any other source is
       drawn (the targets still rose above), so the stream never interleaves
       two documents. */
    if (p->use_cls) {
        best = p->open_src >= 0 ? p->open_src : p->heap[p->cls_off[k]].i;
    } else {
        if (p->open_act >= 0) k = p->open_act;
        best = p->act[k];
    }
    int rc = next_document(p, best);
    if (rc == PL_DONE) { /* spent its max_epochs: now exhausted */
        if (p->use_cls) {
            cls_remove(p, best);
            tn_update(p, p->cls_of[best], p->g);
        }
        goto again;
    }
    if (rc) return rc;
    pl__src_state *s = &p->src[best];
    int64_t take = s->cur_length - s->cur_offset;
    if (take > p->max_chunk) take = p->max_chunk;
    out->source = (int32_t)best;
    out->index = s->cur_index;
    out->offset = s->cur_offset;
    out->length = take;
    out->flags = 0;
    s->cur_offset += take;
    /* A truncated chunk does not end its document: it keeps the label of
       its last token (the document's next token); the rest is dropped. */
    if (s->cur_offset >= s->cur_length) out->flags = PL_CHUNK_DOC_END;
    int open = 0;
    if (s->cur_offset >= s->cur_length ||
        p->cfg->long_documents == PL__LONGDOC_TRUNCATE) {
        s->cur_index = -1;
        s->cur_offset = s->cur_length = 0;
    } else if (p->cfg->packing == PL__PACK_CONCAT_CHUNK) {
        open = 1;
    }
    s->drawn_tokens += take;
    p->g += take; /* every target rises by w * take */
    if (p->use_cls) {
        int64_t c = p->cls_of[best];
        p->open_src = open ? best : -1;
        p->heap[p->hpos[best]].d = s->drawn_tokens;
        if (p->cls_hs[c] > 1)
            hdown(p, c, p->hpos[best]); /* more drawn: down its heap */
        if (p->has_caps && source_exhausted(p, best)) cls_remove(p, best);
        tn_update(p, c, p->g);
    } else {
        p->open_act = open ? k : -1;
    }

    return PL_OK;
}

/* The weights of p->step into p->weights, and the checks of the sources it
 * draws from (once per step). */
int pl__planner_step_weights(pl_planner *p) {
    const int pinned = p->pin_step == p->step;
    if (pinned) /* resumed in this step's middle: the weights it began with */
        memcpy(p->weights, p->pin_w, (size_t)p->n_sources * sizeof *p->weights);
    else
        pl__config_weights(p->cfg, p->step, p->weights);
    /* The indexes the draws read through their mappings must not have
       shrunk (once per step; the lookups themselves are not checked). */
    for (int64_t i = 0; i < p->n_sources; i++) {
        if (!(p->weights[i] > 0)) continue;
        char err[PL__ERRMSG_CAP];
        int rc = pl__source_check_index(p->sources[i], err, sizeof err);
        if (rc) {
            pl__fmt(p->errmsg, sizeof p->errmsg, "source '%s': %s",
                    p->cfg->sources[i].name, err);
            return rc;
        }
    }
    if (p->cfg->eval) /* sources without documents in the split: none */
        for (int64_t i = 0; i < p->n_sources; i++)
            if (p->num_docs[i] == 0) p->weights[i] = 0;
    return PL_OK;
}

/* After p->step's draws: a pinned step's new weights apply from the next. */
void pl__planner_step_done(pl_planner *p) {
    if (p->pin_step == p->step) { /* targets restart */
        for (int64_t i = 0; i < p->n_sources; i++)
            p->src[i].target = (pl__i128)p->src[i].drawn_tokens << PL__TBITS;
        p->pin_step = -1;
    }
}

static int planner_next_impl(pl_planner *p, pl_plan **out) {
    *out = NULL;
    if (p->failed) return p->failed;
    int rc;
    if (p->cfg->balance_window > 1 && !p->cfg->eval) { /* window.c */
        rc = pl__window_next(p, out);
        if (rc) return p->failed = rc;
        p->step++;
        return PL_OK;
    }
    if ((rc = pl__planner_step_weights(p))) return p->failed = rc;
    pl__planner_draw_begin(p);
    rc = pl__pack_step(p, out);
    pl__planner_draw_end(p);
    if (rc) {
        p->failed = rc;
        return rc;
    }
    pl__planner_step_done(p);
    p->step++;
    return PL_OK;
}

static int planner_get_state_impl(pl_planner *p, void *buf, size_t cap, size_t *len) {
    void *blob = NULL;
    size_t n = 0;
    int rc = pl__state_encode(p, 0, &blob, &n);
    if (rc) {
        pl__fmt(p->errmsg, sizeof p->errmsg, "planner: out of memory encoding the state");
        return rc;
    }
    *len = n;
    if (buf) {
        if (cap < n) {
            free(blob);
            pl__fmt(p->errmsg, sizeof p->errmsg,
                    "state buffer too small: %zu bytes, need %zu", cap, n);
            return PL_EINVAL;
        }
        memcpy(buf, blob, n);
    }
    free(blob);
    return PL_OK;
}

static int planner_set_state_impl(pl_planner *p, const void *buf, size_t len) {
    /* The planner stands at the start of the blob's step; a mid-step cursor
       is the loader's business. */
    int64_t mb = 0;
    return pl__state_decode(p, buf, len, INT64_MAX, 0, &mb);
}

/* ------------------------------------------------ per-thread messages */

int pl_planner_create(const pl_config *cfg, pl_source *const *sources, int64_t n_sources,
                      pl_planner **out) {
    int rc = planner_create_impl(cfg, sources, n_sources, out);
    if (rc < 0) pl__thread_err(*out ? pl_planner_errmsg(*out) : "planner: out of memory");
    return rc;
}

int pl_planner_next(pl_planner *p, pl_plan **out) {
    int rc = planner_next_impl(p, out);
    if (rc < 0) pl__thread_err(pl_planner_errmsg(p));
    return rc;
}

int pl_planner_get_state(pl_planner *p, void *buf, size_t cap, size_t *len) {
    int rc = planner_get_state_impl(p, buf, cap, len);
    if (rc < 0) pl__thread_err(pl_planner_errmsg(p));
    return rc;
}

int pl_planner_set_state(pl_planner *p, const void *buf, size_t len) {
    int rc = planner_set_state_impl(p, buf, len);
    if (rc < 0) pl__thread_err(pl_planner_errmsg(p));
    return rc;
}
