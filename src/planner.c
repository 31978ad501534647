/*
 * planner.c -- the planner role (DESIGN.md): the mixture, the per-source
 * shuffles and consumption counters, chunking, and the sequence of plans.
 * It sees document lengths only, never payloads.
 *
 * Mixture (SPEC section 1).  Weights are fractions of tokens.  For every
 * source the planner keeps the tokens drawn and a target: each drawn chunk of
 * L tokens raises source k's target by w_k(step) * L.  The next chunk comes
 * from the source with the largest deficit (target - drawn), ties to the
 * lowest index.  Drawing whole chunks (not documents) keeps |drawn - target|
 * within about one chunk at every step boundary.
 *
 * The draw.  Each draw raises every target by its own rounded product
 * w_k * L, in double precision, and those values are the state (SPEC
 * section 4) and break near-ties, so the plans are a function of that exact
 * sequence of floating-point operations: a closed form w_k * T would round
 * differently and change plans.  What stays exact and cheap: sources of
 * equal weight and equal target (bit for bit) at a step's start get the same
 * rounded increments at every draw, so their targets stay equal through the
 * step.  The draw groups them into classes (a hash on the two doubles); a
 * class keeps one target, and among its members the largest deficit is the
 * fewest drawn tokens (then the lowest index): a binary heap per class.  A
 * draw then costs O(log members) plus one vectorized pass over the classes
 * (adding the previous draw's increments, t = t + w * L as before, and
 * finding the largest class deficit; ties across classes go to the lowest
 * top index).  The usual mixtures (equal weights, a few weight levels over
 * many sources) have a handful of classes; where every source is a class
 * of its own (every source its own weight, or a resume that restarts each
 * target at its drawn tokens) the draw is the linear one below, O(sources):
 * one pass that adds the previous draw's increments and keeps each lane's
 * largest deficit and its first index (AVX-512F, four independent 8-lane
 * sets), or, without AVX-512, that pass and a second for the first index
 * (AVX or SSE2).  The exact operations per source
 * are those of the two-scan loop this replaced, so plans and states are bit
 * for bit the same (tests/c/test_planner_draw.c: golden hashes, the two-scan
 * draw side by side, and whole runs against the linear draw kept below).
 * The linear draw (act_* arrays, zero-weight sources left out and applied
 * once at the end) also serves where classes would not be exact: weights or
 * targets that are not finite, or targets or drawn tokens at or above 2^49
 * (where t - d could round two drawn counts to one deficit).
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
#include "planner_internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define PL__DRAW_AVX 1
#endif

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

static void pl__planner_perm(pl_planner *p, int64_t i) {
    pl__perm_init(&p->perm[i], (uint64_t)p->num_docs[i], p->cfg->seed,
                  p->cfg->sources[i].name, (uint64_t)p->src[i].epoch);
}

static int pl__planner_create_impl(const pl_config *cfg, pl_source *const *sources,
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
    p->act = pl__calloc((size_t)n_sources, sizeof *p->act);
    p->act_w = pl__calloc((size_t)n_sources, sizeof *p->act_w);
    p->act_t = pl__calloc((size_t)n_sources, sizeof *p->act_t);
    p->act_d = pl__calloc((size_t)n_sources, sizeof *p->act_d);
    p->doc_lo = pl__calloc((size_t)n_sources, sizeof *p->doc_lo);
    size_t ns = (size_t)(n_sources > 0 ? n_sources : 1);
    p->cls_w = pl__calloc(ns, sizeof *p->cls_w);
    p->cls_t = pl__calloc(ns, sizeof *p->cls_t);
    p->cls_d = pl__calloc(ns, sizeof *p->cls_d);
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
        !p->act || !p->act_w || !p->act_t || !p->act_d || !p->doc_lo ||
        !p->cls_w || !p->cls_t || !p->cls_d || !p->cls_off || !p->cls_size ||
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
        /* Records left out at open count as skipped (on_error: skip). */
        p->src[i].skipped = pl_source_num_skipped(sources[i]);
        pl__planner_perm(p, i);
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
    pl__chunks_free(&p->carry);
    pl__chunks_free(&p->items);
    free(p->weights);
    free(p->pin_w);
    free(p->act);
    free(p->act_w);
    free(p->act_t);
    free(p->act_d);
    free(p->cls_w);
    free(p->cls_t);
    free(p->cls_d);
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

/* Move source i to its next usable document.  PL_OK, PL_DONE when the
 * source has been read max_epochs times, or an error.  A capped source counts
 * its last epoch as completed as soon as its last document is drawn, so that
 * epochs_completed says so and pl__exhausted needs no lookahead. */
static int pl__next_document(pl_planner *p, int64_t i) {
    pl__src_state *s = &p->src[i];
    const pl__source_cfg *sc = &p->cfg->sources[i];
    while (s->cur_index < 0) {
        if (sc->max_epochs > 0 && s->epoch >= sc->max_epochs) return PL_DONE;
        if (s->drawn_in_epoch >= p->num_docs[i]) {
            s->epoch++;
            s->drawn_in_epoch = 0;
            pl__planner_perm(p, i);
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
        /* An evaluation pass reads its documents in index order. */
        int64_t idx = p->doc_lo[i] +
                      (p->cfg->eval ? s->drawn_in_epoch
                                    : (int64_t)pl__perm_apply(&p->perm[i],
                                                              (uint64_t)s->drawn_in_epoch));
        s->drawn_in_epoch++;
        s->since_yield++;
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


/* ------------------------------------------------------------ classes */

static int pl__exhausted(const pl_planner *p, int64_t i);

/* Heap order within a class: fewer drawn tokens first (the larger deficit,
 * the targets being equal), then the lower index. */
static inline int pl__hless(pl__hent a, pl__hent b) {
    return a.d < b.d || (a.d == b.d && a.i < b.i);
}

static inline void pl__hset(pl_planner *p, int64_t q, pl__hent e) {
    p->heap[q] = e;
    p->hpos[e.i] = q;
}

/* The heaps are 4-ary: a node's four children (16 bytes each) share one
 * cache line, and a sift crosses half the levels of a binary heap. */
#define PL__HARITY 4

/* Move the source at position q (absolute) of class c's heap down. */
static void pl__hdown(pl_planner *p, int64_t c, int64_t q) {
    const int64_t off = p->cls_off[c], hs = p->cls_hs[c];
    pl__hent *h = p->heap + off, x = h[q - off];
    int64_t r = q - off;
    for (;;) {
        int64_t l = PL__HARITY * r + 1, m = l;
        if (l >= hs) break;
        int64_t end = l + PL__HARITY < hs ? l + PL__HARITY : hs;
        for (int64_t j = l + 1; j < end; j++)
            if (pl__hless(h[j], h[m])) m = j;
        if (!pl__hless(h[m], x)) break;
        pl__hset(p, off + r, h[m]);
        r = m;
    }
    pl__hset(p, off + r, x);
}

/* Restore the heap of class c around position q (absolute). */
static void pl__hfix(pl_planner *p, int64_t c, int64_t q) {
    const int64_t off = p->cls_off[c];
    pl__hent *h = p->heap + off, x = h[q - off];
    int64_t r = q - off;
    while (r > 0) { /* up */
        int64_t up = (r - 1) / PL__HARITY;
        if (!pl__hless(x, h[up])) break;
        pl__hset(p, off + r, h[up]);
        r = up;
    }
    pl__hset(p, off + r, x);
    pl__hdown(p, c, off + r);
}

static void pl__cls_top(pl_planner *p, int64_t c) {
    p->cls_d[c] = p->cls_hs[c] > 0 ? (double)p->heap[p->cls_off[c]].d : INFINITY;
}

/* Take source i out of its class's heap (it stays a member: its target
 * still rises with the class's). */
static void pl__cls_remove(pl_planner *p, int64_t i) {
    int64_t c = p->cls_of[i], q = p->hpos[i];
    int64_t last = p->cls_off[c] + p->cls_hs[c] - 1;
    if (q > last) return; /* already out */
    pl__hent y = p->heap[last], me = p->heap[q];
    pl__hset(p, last, me);
    p->cls_hs[c]--;
    if (q < last) {
        pl__hset(p, q, y);
        pl__hfix(p, c, q);
    }
    pl__cls_top(p, c);
}

static uint64_t pl__cls_key(double w, double t) {
    uint64_t a, b;
    memcpy(&a, &w, 8);
    memcpy(&b, &t, 8);
    uint64_t h = a * 0x9E3779B97F4A7C15ULL ^ (b + 0x632BE59BD9B4E019ULL + (a << 6) + (a >> 2));
    h ^= h >> 29;
    h *= 0xBF58476D1CE4E5B9ULL;
    return h ^ (h >> 32);
}

/* Group the act[] sources into classes of equal (weight, target), in the
 * order of their lowest member; -1 where the class path does not apply. */
static int pl__cls_build(pl_planner *p) {
    const double lim = 0x1p49;
    for (int64_t k = 0; k < p->n_act; k++)
        if (!(fabs(p->act_t[k]) < lim) || !(p->act_d[k] < lim)) return -1;
    const int64_t cap = p->cls_hash_cap, mask = cap - 1;
    for (int64_t h = 0; h < cap; h++) p->cls_hash[h] = -1;
    int64_t g = 0;
    for (int64_t k = 0; k < p->n_act; k++) {
        double w = p->act_w[k], t = p->act_t[k];
        int64_t h = (int64_t)(pl__cls_key(w, t) & (uint64_t)mask), c;
        for (;;) {
            c = p->cls_hash[h];
            if (c < 0) {
                c = p->cls_hash[h] = g++;
                p->cls_w[c] = w;
                p->cls_t[c] = t;
                p->cls_size[c] = 0;
                break;
            }
            if (!memcmp(&p->cls_w[c], &w, 8) && !memcmp(&p->cls_t[c], &t, 8)) break;
            h = (h + 1) & mask;
        }
        p->cls_of[p->act[k]] = c;
        p->cls_size[c]++;
    }
    p->n_cls = g;
    p->cls_multi = g < p->n_act;
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
        if (p->has_caps && pl__exhausted(p, i)) continue;
        pl__hset(p, p->cls_off[c] + p->cls_hs[c]++,
                 (pl__hent){p->src[i].drawn_tokens, i});
    }
    if (p->has_caps) {
        int64_t *out = p->cls_hash; /* free again: a count per class */
        for (int64_t c = 0; c < g; c++) out[c] = 0;
        for (int64_t k = 0; k < p->n_act; k++) {
            int64_t i = p->act[k], c = p->cls_of[i];
            if (pl__exhausted(p, i))
                pl__hset(p, p->cls_off[c] + p->cls_hs[c] + out[c]++,
                         (pl__hent){p->src[i].drawn_tokens, i});
        }
    }
    for (int64_t c = 0; c < g; c++) {
        if (p->cls_hs[c] > 1)
            for (int64_t r = (p->cls_hs[c] - 2) / PL__HARITY; r >= 0; r--)
                pl__hdown(p, c, p->cls_off[c] + r);
        pl__cls_top(p, c);
    }
    return 0;
}

void pl__planner_draw_begin(pl_planner *p) {
    int64_t k = 0;
    int exotic = 0;
    for (int64_t i = 0; i < p->n_sources; i++) {
        double w = p->weights[i];
        if (w <= 0) continue; /* as the two-scan loop skipped them */
        p->act[k] = i;
        p->act_w[k] = w;
        p->act_t[k] = p->src[i].target_tokens;
        p->act_d[k] = (double)p->src[i].drawn_tokens;
        exotic |= !isfinite(w) || !isfinite(p->act_t[k]);
        k++;
    }
    p->n_act = k;
    p->pending = 0;
    p->drew = 0;
    p->exotic = exotic;
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
    /* Classes where some are shared; one source per class is the linear
       draw itself (with less bookkeeping). */
    p->use_cls = !exotic && !p->draw_linear && pl__cls_build(p) == 0 && p->cls_multi;
}

/* Add the pending draw's increments to every target (t = t + w * L). */
static void pl__draw_flush_all(pl_planner *p, double take) {
    for (int64_t k = 0; k < p->n_act; k++) {
        double inc = p->act_w[k] * take;
        p->act_t[k] = p->act_t[k] + inc;
    }
}

void pl__planner_draw_end(pl_planner *p) {
    if (p->use_cls) {
        double take = (double)p->pending;
        for (int64_t c = 0; c < p->n_cls && p->pending > 0; c++) {
            double inc = p->cls_w[c] * take;
            p->cls_t[c] = p->cls_t[c] + inc;
        }
        /* Every member holds its class's target (written back below). */
        for (int64_t k = 0; k < p->n_act; k++)
            p->act_t[k] = p->cls_t[p->cls_of[p->act[k]]];
        p->pending = 0;
    } else if (p->pending > 0)
        pl__draw_flush_all(p, (double)p->pending);
    if (p->drew) {
        /* The sources left out (weight 0) got t + 0 * L at every draw:
           once is the same (it only turns -0 into +0). */
        int64_t k = 0;
        for (int64_t i = 0; i < p->n_sources; i++) {
            if (k < p->n_act && p->act[k] == i) {
                k++;
                continue;
            }
            p->src[i].target_tokens += p->weights[i] * 1.0;
        }
    }
    for (int64_t k = 0; k < p->n_act; k++)
        p->src[p->act[k]].target_tokens = p->act_t[k];
    p->pending = 0;
}

/*
 * Add take's increments to the targets (take 0: none) and return the first
 * k of the largest t[k] - d[k] (strict >, so ties go to the lowest index).
 * Finite values only: the max is exact, the second pass finds its first
 * occurrence by the same subtraction.
 */
static int64_t pl__draw_argmax(double *t, const double *w, const double *d,
                               int64_t n, double take) {
    double m;
    int64_t k = 0;
#if defined(__SSE2__)
    __m128d vm = _mm_set1_pd(-INFINITY), vl = _mm_set1_pd(take);
    if (take > 0) {
        for (; k + 2 <= n; k += 2) {
            __m128d vt = _mm_loadu_pd(t + k);
            vt = _mm_add_pd(vt, _mm_mul_pd(_mm_loadu_pd(w + k), vl));
            _mm_storeu_pd(t + k, vt);
            vm = _mm_max_pd(_mm_sub_pd(vt, _mm_loadu_pd(d + k)), vm);
        }
    } else {
        for (; k + 2 <= n; k += 2)
            vm = _mm_max_pd(_mm_sub_pd(_mm_loadu_pd(t + k), _mm_loadu_pd(d + k)), vm);
    }
    double lanes[2];
    _mm_storeu_pd(lanes, vm);
    m = lanes[0] > lanes[1] ? lanes[0] : lanes[1];
#else
    m = -INFINITY;
#endif
    for (; k < n; k++) {
        if (take > 0) {
            double inc = w[k] * take;
            t[k] = t[k] + inc;
        }
        double x = t[k] - d[k];
        if (x > m) m = x;
    }
    for (k = 0; k < n; k++)
        if (t[k] - d[k] == m) return k;
    return 0; /* not reached with finite values */
}

#if PL__DRAW_AVX
/* pl__draw_argmax with 4 lanes (AVX, no FMA: the same roundings), picked at
 * run time where the CPU has it. */
__attribute__((target("avx"))) static int64_t
pl__draw_argmax_avx(double *t, const double *w, const double *d, int64_t n,
                    double take) {
    int64_t k = 0;
    __m256d vm = _mm256_set1_pd(-INFINITY), vl = _mm256_set1_pd(take);
    if (take > 0) {
        for (; k + 4 <= n; k += 4) {
            __m256d vt = _mm256_loadu_pd(t + k);
            vt = _mm256_add_pd(vt, _mm256_mul_pd(_mm256_loadu_pd(w + k), vl));
            _mm256_storeu_pd(t + k, vt);
            vm = _mm256_max_pd(_mm256_sub_pd(vt, _mm256_loadu_pd(d + k)), vm);
        }
    } else {
        for (; k + 4 <= n; k += 4)
            vm = _mm256_max_pd(
                _mm256_sub_pd(_mm256_loadu_pd(t + k), _mm256_loadu_pd(d + k)), vm);
    }
    double lanes[4], m = -INFINITY;
    _mm256_storeu_pd(lanes, vm);
    for (int j = 0; j < 4; j++)
        if (lanes[j] > m) m = lanes[j];
    for (; k < n; k++) {
        if (take > 0) {
            double inc = w[k] * take;
            t[k] = t[k] + inc;
        }
        double x = t[k] - d[k];
        if (x > m) m = x;
    }
    __m256d vmax = _mm256_set1_pd(m);
    for (k = 0; k + 4 <= n; k += 4) {
        __m256d x = _mm256_sub_pd(_mm256_loadu_pd(t + k), _mm256_loadu_pd(d + k));
        int mask = _mm256_movemask_pd(_mm256_cmp_pd(x, vmax, _CMP_EQ_OQ));
        if (mask) return k + __builtin_ctz((unsigned)mask);
    }
    for (; k < n; k++)
        if (t[k] - d[k] == m) return k;
    return 0;
}

/* pl__draw_argmax in one pass of 8 lanes (AVX-512F, no FMA: the same
 * roundings): each lane keeps its largest deficit and the index of its first
 * occurrence (strict >), then the lanes' maxima meet, ties to the lowest
 * index; the same k as the two passes. */
__attribute__((target("avx512f"))) static int64_t
pl__draw_argmax_avx512(double *t, const double *w, const double *d, int64_t n,
                       double take) {
    enum { L = 4 }; /* independent lane sets of 8, so the keep chains overlap */
    int64_t k = 0;
    const __m512d vl = _mm512_set1_pd(take);
    __m512d vm[L];
    __m512i vi[L], vk[L];
    for (int j = 0; j < L; j++) {
        vm[j] = _mm512_set1_pd(-INFINITY);
        vi[j] = _mm512_set1_epi64(0);
        vk[j] = _mm512_add_epi64(_mm512_set_epi64(7, 6, 5, 4, 3, 2, 1, 0),
                                 _mm512_set1_epi64(8 * j));
    }
    const __m512i vstep = _mm512_set1_epi64(8 * L);
    const int add = take > 0;
    for (; k + 8 * L <= n; k += 8 * L) {
        for (int j = 0; j < L; j++) {
            __m512d tv = _mm512_loadu_pd(t + k + 8 * j);
            if (add) {
                tv = _mm512_add_pd(tv, _mm512_mul_pd(_mm512_loadu_pd(w + k + 8 * j), vl));
                _mm512_storeu_pd(t + k + 8 * j, tv);
            }
            __m512d x = _mm512_sub_pd(tv, _mm512_loadu_pd(d + k + 8 * j));
            __mmask8 g = _mm512_cmp_pd_mask(x, vm[j], _CMP_GT_OQ);
            vm[j] = _mm512_mask_mov_pd(vm[j], g, x);
            vi[j] = _mm512_mask_mov_epi64(vi[j], g, vk[j]);
            vk[j] = _mm512_add_epi64(vk[j], vstep);
        }
    }
    double lanes[8 * L], m = -INFINITY;
    int64_t idx[8 * L], best = -1;
    for (int j = 0; j < L; j++) {
        _mm512_storeu_pd(lanes + 8 * j, vm[j]);
        _mm512_storeu_si512((void *)(idx + 8 * j), vi[j]);
    }
    for (int j = 0; j < 8 * L && k > 0; j++)
        if (lanes[j] > m || (lanes[j] == m && best >= 0 && idx[j] < best)) {
            m = lanes[j];
            best = idx[j];
        }
    for (; k < n; k++) { /* the tail comes after every lane's index */
        if (add) {
            double inc = w[k] * take;
            t[k] = t[k] + inc;
        }
        double x = t[k] - d[k];
        if (best < 0 || x > m) {
            m = x;
            best = k;
        }
    }
    return best < 0 ? 0 : best;
}

static int pl__draw_isa_cap = 2; /* tests lower it (pl__planner_draw_isa) */

static int pl__have_avx(void) {
    static int have = -1; /* benign race: every thread computes the same */
    if (have < 0) {
        __builtin_cpu_init();
        have = __builtin_cpu_supports("avx512f") ? 2 : __builtin_cpu_supports("avx") ? 1 : 0;
    }
    return have < pl__draw_isa_cap ? have : pl__draw_isa_cap;
}

/* The vectorized argmax this CPU runs best (n >= 8). */
static int64_t pl__draw_argmax_wide(double *t, const double *w, const double *d,
                                    int64_t n, double take) {
    return pl__have_avx() == 2 ? pl__draw_argmax_avx512(t, w, d, n, take)
                               : pl__draw_argmax_avx(t, w, d, n, take);
}
#endif

int pl__planner_draw_isa(int cap) {
#if PL__DRAW_AVX
    int old = pl__draw_isa_cap;
    pl__draw_isa_cap = cap;
    return old;
#else
    (void)cap;
    return 0;
#endif
}

/* The two-scan rule itself, for weights or targets that are not finite. */
static int64_t pl__draw_argmax_exotic(double *t, const double *w,
                                      const double *d, int64_t n,
                                      double take) {
    int64_t best = -1;
    double best_deficit = 0;
    for (int64_t k = 0; k < n; k++) {
        if (take > 0) t[k] += w[k] * take;
        double x = t[k] - d[k];
        if (best < 0 || x > best_deficit) {
            best = k;
            best_deficit = x;
        }
    }
    return best;
}

/* A source with max_epochs that has completed them (and holds no partly
 * drawn document) is drawn no more; the others share its weight. */
static int pl__exhausted(const pl_planner *p, int64_t i) {
    int64_t cap = p->cfg->sources[i].max_epochs;
    const pl__src_state *s = &p->src[i];
    return cap > 0 && s->cur_index < 0 && s->epoch >= cap;
}

/* The two-scan rule over the sources not exhausted (configs with
 * max_epochs); -1 when every one is. */
static int64_t pl__draw_argmax_capped(pl_planner *p, double take) {
    int64_t best = -1;
    double best_deficit = 0;
    for (int64_t k = 0; k < p->n_act; k++) {
        if (take > 0) p->act_t[k] += p->act_w[k] * take;
        if (pl__exhausted(p, p->act[k])) continue;
        double x = p->act_t[k] - p->act_d[k];
        if (best < 0 || x > best_deficit) {
            best = k;
            best_deficit = x;
        }
    }
    return best;
}

/* The argmax over classes: the largest class deficit t - d (d the drawn
 * tokens of the class's top member), ties to the lowest source index (the
 * top member's); -1 when every heap is empty (max_epochs). */
static int64_t pl__cls_argmax(pl_planner *p, double take) {
    int64_t k, n = p->n_cls;
    double *t = p->cls_t, *w = p->cls_w, *d = p->cls_d;
#if PL__DRAW_AVX
    if (n >= 8 && pl__have_avx())
        k = pl__draw_argmax_wide(t, w, d, n, take);
    else
#endif
        k = pl__draw_argmax(t, w, d, n, take);
    double m = t[k] - d[k];
    if (m == -INFINITY) return -1; /* empty classes only */
    if (p->cls_multi) {
        int64_t top = p->heap[p->cls_off[k]].i;
        for (int64_t j = k + 1; j < n; j++)
            if (t[j] - d[j] == m && p->heap[p->cls_off[j]].i < top) {
                k = j;
                top = p->heap[p->cls_off[j]].i;
            }
    }
    return k;
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
    double take_prev = (double)p->pending;
    int64_t k, best;
again:
    if (p->use_cls) {
        k = pl__cls_argmax(p, take_prev);
    } else if (p->has_caps) {
        k = pl__draw_argmax_capped(p, take_prev);
    } else if (p->exotic)
        k = pl__draw_argmax_exotic(p->act_t, p->act_w, p->act_d, p->n_act, take_prev);
#if PL__DRAW_AVX
    else if (p->n_act >= 8 && pl__have_avx())
        k = pl__draw_argmax_wide(p->act_t, p->act_w, p->act_d, p->n_act, take_prev);
#endif
    else
        k = pl__draw_argmax(p->act_t, p->act_w, p->act_d, p->n_act, take_prev);
    p->pending = 0;
    take_prev = 0;
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
    int rc = pl__next_document(p, best);
    if (rc == PL_DONE) { /* spent its max_epochs: now exhausted */
        if (p->use_cls) pl__cls_remove(p, best);
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
    if (p->use_cls) {
        int64_t c = p->cls_of[best];
        p->open_src = open ? best : -1;
        p->heap[p->hpos[best]].d = s->drawn_tokens;
        pl__hdown(p, c, p->hpos[best]); /* more drawn: down its heap */
        if (p->has_caps && pl__exhausted(p, best))
            pl__cls_remove(p, best);
        else
            pl__cls_top(p, c);
    } else {
        p->open_act = open ? k : -1;
        p->act_d[k] = (double)s->drawn_tokens;
    }
    p->pending = take; /* every target rises by w * take: next draw or end */
    p->drew = 1;
    return PL_OK;
}

static int pl__planner_next_impl(pl_planner *p, pl_plan **out) {
    *out = NULL;
    if (p->failed) return p->failed;
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
            return p->failed = rc;
        }
    }
    if (p->cfg->eval) /* sources without documents in the split: none */
        for (int64_t i = 0; i < p->n_sources; i++)
            if (p->num_docs[i] == 0) p->weights[i] = 0;
    pl__planner_draw_begin(p);
    int rc = pl__pack_step(p, out);
    pl__planner_draw_end(p);
    if (rc) {
        p->failed = rc;
        return rc;
    }
    if (pinned) { /* the new weights apply from the next step: targets restart */
        for (int64_t i = 0; i < p->n_sources; i++)
            p->src[i].target_tokens = (double)p->src[i].drawn_tokens;
        p->pin_step = -1;
    }
    p->step++;
    return PL_OK;
}

static int pl__planner_get_state_impl(pl_planner *p, void *buf, size_t cap, size_t *len) {
    void *blob = NULL;
    size_t n = 0;
    int rc = pl__state_encode(p, 0, &blob, &n);
    if (rc) return rc;
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

static int pl__planner_set_state_impl(pl_planner *p, const void *buf, size_t len) {
    /* The planner stands at the start of the blob's step; a mid-step cursor
       is the loader's business. */
    int64_t mb = 0;
    return pl__state_decode(p, buf, len, INT64_MAX, 0, &mb);
}

/* ------------------------------------------------ per-thread messages */

int pl_planner_create(const pl_config *cfg, pl_source *const *sources, int64_t n_sources,
                      pl_planner **out) {
    int rc = pl__planner_create_impl(cfg, sources, n_sources, out);
    if (rc < 0) pl__thread_err(*out ? pl_planner_errmsg(*out) : "planner: out of memory");
    return rc;
}

int pl_planner_next(pl_planner *p, pl_plan **out) {
    int rc = pl__planner_next_impl(p, out);
    if (rc < 0) pl__thread_err(pl_planner_errmsg(p));
    return rc;
}

int pl_planner_get_state(pl_planner *p, void *buf, size_t cap, size_t *len) {
    int rc = pl__planner_get_state_impl(p, buf, cap, len);
    if (rc < 0) pl__thread_err(pl_planner_errmsg(p));
    return rc;
}

int pl_planner_set_state(pl_planner *p, const void *buf, size_t len) {
    int rc = pl__planner_set_state_impl(p, buf, len);
    if (rc < 0) pl__thread_err(pl_planner_errmsg(p));
    return rc;
}
