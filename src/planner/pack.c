/*
 * pack.c -- step membership and packing (SPEC section 1).
 *
 * best_fit: the chunks carried into the step are placed first (so no chunk
 * waits more than a step or two), then chunks are drawn until they fill the
 * step's capacity (global_batch_size * seq_length tokens), placed best-fit
 * decreasing (Johnson, "Near-optimal bin packing algorithms", 1973), and the
 * remaining gaps are offered to further drawn chunks, placed best-fit as they
 * come, until a few in a row do not fit.  Chunks that fit nowhere carry over
 * to the next step.  The packing sees global_batch_size bins and never dp,
 * so membership does not depend on dp.
 *
 * Best fit needs "the bin with the least free space >= L".  Bins are kept in
 * buckets by free space, and a 64-ary bit tree over free-space values finds
 * the first non-empty bucket >= L in a few word operations.
 *
 * concat_chunk: Megatron GPTDataset's layout (megatron/core/datasets/
 * gpt_dataset.py and helpers.cpp build_sample_idx): whole documents, end
 * token included, follow each other in draw order (the planner continues a
 * partly drawn document before drawing another) and the stream is cut into
 * sequences of exactly seq_length tokens; a sequence's last token is labelled
 * with the stream's next token when it is inside a document, so sequence q
 * covers stream tokens [q * S, q * S + S] as GPTDataset's windows of
 * seq_length + 1 tokens that share one token.  Pieces of one document that
 * meet in a sequence are one chunk (one segment of cu_seqlens).
 *
 * Arrangement: round-robin, sequence q to DP rank q % dp.  Cost-aware
 * balancing takes its place when `balance` is not none (its own module).
 */
#include "planner/planner.h"

#include <stdlib.h>
#include <string.h>

/* Levels of the free-space bitmap: 64^5 > PL__MAX_SEQ_LENGTH + 1 values. */
#define PL__PACK_LEVELS 5
_Static_assert(PL__MAX_SEQ_LENGTH + 1 <= (INT64_C(1) << (6 * PL__PACK_LEVELS)),
               "the free-space bitmap covers every seq_length");

typedef struct pl__pack {
    int64_t bins, space;  /* bins and their capacity the scratch was made for */
    int64_t long_threshold; /* long_short.threshold, 0: off */
    int64_t last_used;      /* space taken by the last best-fit placement */
    int64_t *free_space;  /* [bins] */
    int32_t *head;        /* [space + 1] first bin with that free space */
    int32_t *next, *prev; /* [bins] bucket links */
    int levels;
    uint64_t *bits[PL__PACK_LEVELS]; /* bits[0]: leaves over free-space values */
    int64_t nwords[PL__PACK_LEVELS];
    int32_t *bin_of;      /* [n placed] */
    pl__chunks placed;
    pl__chunks drawn;
    pl__chunks newcarry;
    struct pl__sort_key *order; /* sort scratch */
    struct pl__sort_key *order_tmp; /* the radix sort's other half [tmp_cap] */
    int64_t *count;             /* counting-sort scratch [space + 2] */
    int64_t *rcount;            /* radix-sort scratch [2^PL__RADIX_MAX_BITS] */
    int64_t tmp_cap;
    int64_t order_cap, bin_of_cap;
} pl__pack;

void pl__pack_free(void *v) {
    pl__pack *k = v;
    if (!k) return;
    free(k->free_space);
    free(k->head);
    free(k->next);
    free(k->prev);
    for (int i = 0; i < PL__PACK_LEVELS; i++) free(k->bits[i]);
    free(k->bin_of);
    free(k->order);
    free(k->order_tmp);
    free(k->count);
    free(k->rcount);
    pl__chunks_free(&k->placed);
    pl__chunks_free(&k->drawn);
    pl__chunks_free(&k->newcarry);
    free(k);
}

static int pack_alloc_into(pl__pack *k, int64_t bins, int64_t space);

/* Scratch for `bins` sequences of `space` tokens; on failure p->pack is
 * NULL, so a later call starts over. */
static int pack_alloc(pl_planner *p, int64_t bins, int64_t space) {
    pl__pack *k = p->pack;
    if (k && k->bins == bins && k->space == space) return PL_OK;
    pl__pack_free(k);
    p->pack = NULL;
    k = pl__calloc(1, sizeof *k);
    if (!k) return PL_ENOMEM;
    int rc = pack_alloc_into(k, bins, space);
    if (rc) {
        pl__pack_free(k);
        return rc;
    }
    p->pack = k;
    return PL_OK;
}

static int pack_alloc_into(pl__pack *k, int64_t bins, int64_t space) {
    k->bins = bins;
    k->space = space;
    k->free_space = pl__calloc((size_t)bins, sizeof(int64_t));
    k->head = pl__calloc((size_t)space + 1, sizeof(int32_t));
    k->next = pl__calloc((size_t)bins, sizeof(int32_t));
    k->prev = pl__calloc((size_t)bins, sizeof(int32_t));
    if (!k->free_space || !k->head || !k->next || !k->prev) return PL_ENOMEM;
    int64_t n = space + 1;
    k->levels = 0;
    do {
        int64_t w = (n + 63) / 64;
        if (k->levels == PL__PACK_LEVELS) return PL_EINVAL; /* seq_length > 2^24 */
        k->nwords[k->levels] = w;
        k->bits[k->levels] = pl__calloc((size_t)w, sizeof(uint64_t));
        if (!k->bits[k->levels]) return PL_ENOMEM;
        k->levels++;
        n = w;
    } while (n > 1);
    return PL_OK;
}

static void bit_set(pl__pack *k, int64_t v) {
    for (int l = 0; l < k->levels; l++) {
        uint64_t *w = &k->bits[l][v >> 6];
        int was = *w != 0;
        *w |= 1ULL << (v & 63);
        if (was) return;
        v >>= 6;
    }
}

static void bit_clear(pl__pack *k, int64_t v) {
    for (int l = 0; l < k->levels; l++) {
        uint64_t *w = &k->bits[l][v >> 6];
        *w &= ~(1ULL << (v & 63));
        if (*w) return;
        v >>= 6;
    }
}

/* Smallest set value >= v, or -1. */
static int64_t bit_next(const pl__pack *k, int64_t v) {
    int l = 0;
    for (;;) {
        if ((v >> 6) >= k->nwords[l]) return -1;
        uint64_t w = k->bits[l][v >> 6] & (~0ULL << (v & 63));
        if (w) {
            v = (v & ~63LL) | __builtin_ctzll(w);
            break;
        }
        /* nothing left in this word: go up to the next word */
        v = (v >> 6) + 1;
        l++;
        if (l == k->levels) return -1;
    }
    while (l > 0) { /* descend to the leaves */
        l--;
        uint64_t w = k->bits[l][v];
        v = (v << 6) | __builtin_ctzll(w);
    }
    return v;
}

static void bucket_insert(pl__pack *k, int32_t b, int64_t space) {
    k->free_space[b] = space;
    k->prev[b] = -1;
    k->next[b] = k->head[space];
    if (k->head[space] >= 0) k->prev[k->head[space]] = b;
    else bit_set(k, space);
    k->head[space] = b;
}

static void bucket_remove(pl__pack *k, int32_t b) {
    int64_t space = k->free_space[b];
    if (k->prev[b] >= 0) k->next[k->prev[b]] = k->next[b];
    else k->head[space] = k->next[b];
    if (k->next[b] >= 0) k->prev[k->next[b]] = k->prev[b];
    if (k->head[space] < 0) bit_clear(k, space);
}

static int place_at(pl__pack *k, int32_t b, const pl_chunk *c);

/* Place chunk c (padded length len) best-fit; 1 if placed, 0 if not. */
static int best_fit_place(pl__pack *k, const pl_chunk *c, int64_t len, int *err) {
    /* long_short: a long document takes an empty sequence for itself. */
    int is_long = k->long_threshold > 0 && c->length > k->long_threshold;
    int64_t s = is_long ? (k->head[k->space] >= 0 ? k->space : -1)
                        : bit_next(k, len);
    if (s < 0) return 0;
    int32_t b = k->head[s];
    bucket_remove(k, b);
    bucket_insert(k, b, is_long ? 0 : s - len);
    if (place_at(k, b, c)) {
        *err = PL_ENOMEM;
        return 0;
    }
    k->last_used = s - (is_long ? 0 : s - len); /* space this placement took */
    return 1;
}

typedef struct pl__sort_key {
    int64_t len, idx;
} pl__sort_key;

/* The two radix passes take half the bits of a key 0..seq_length each; they
 * are used only while the larger half has at most this many bits (a scratch
 * of 2^12 counts: keys below 2^24), the one counting pass beyond. */
#define PL__RADIX_MAX_BITS 12

/* Sort indices of c[0..n) by decreasing padded length into k->order: a
 * stable sort on the key space - length (0..space): decreasing padded
 * length, ties in draw order (a total order).  Two kinds of stable counting sort,
 * whichever touches fewer entries: one pass over space + 1 counts (many
 * chunks: a step of dp 512 x 4096 x 16k draws ~67,000), or two passes of
 * half the key's bits each, least significant first (few chunks: a step of
 * 2 x 2048 micro-batches draws ~100-200, where the one pass's 2,049 counts
 * were 10 % of planning; qsort before that, 5-7 % of the loader's CPU). */
static int sort_desc(pl__pack *k, const pl_planner *p, const pl_chunk *c,
                         int64_t n) {
    if (n > k->order_cap) {
        pl__sort_key *v = pl__realloc_array(k->order, (size_t)n, sizeof *v);
        if (!v) return PL_ENOMEM;
        k->order = v;
        k->order_cap = n;
    }
    const int64_t S = k->space;
    int bits = 1;
    while (bits < 62 && (INT64_C(1) << bits) <= S) bits++; /* keys 0..S */
    const int lo = bits / 2, hi = bits - lo;
    if (hi <= PL__RADIX_MAX_BITS &&
        2 * (2 * n + (INT64_C(1) << hi)) < S + 2 * n) {
        /* scratch of its own (heap: 32 KiB of counts would be a large frame
           on a loader thread's stack), made on first use */
        if (n > k->tmp_cap) {
            pl__sort_key *t = pl__realloc_array(k->order_tmp, (size_t)n, sizeof *t);
            if (!t) return PL_ENOMEM;
            k->order_tmp = t;
            k->tmp_cap = n;
        }
        if (!k->rcount) {
            k->rcount = pl__calloc((size_t)1 << PL__RADIX_MAX_BITS, sizeof *k->rcount);
            if (!k->rcount) return PL_ENOMEM;
        }
        int64_t *cnt = k->rcount;
        pl__sort_key *a = k->order_tmp, *b = k->order;
        const int64_t lmask = (INT64_C(1) << lo) - 1;
        /* pass 1, low digit: input (draw order) into a */
        memset(cnt, 0, sizeof(int64_t) << lo);
        for (int64_t i = 0; i < n; i++) {
            int64_t len = pl__padded(p, c[i].length);
            b[i].len = len; /* keys staged in b, read back below */
            b[i].idx = i;
            cnt[(S - len) & lmask]++;
        }
        for (int64_t v = 0, at = 0; v <= lmask; v++) {
            int64_t m = cnt[v];
            cnt[v] = at;
            at += m;
        }
        for (int64_t i = 0; i < n; i++) a[cnt[(S - b[i].len) & lmask]++] = b[i];
        /* pass 2, high digit: a into k->order */
        memset(cnt, 0, sizeof(int64_t) << hi);
        for (int64_t i = 0; i < n; i++) cnt[(S - a[i].len) >> lo]++;
        for (int64_t v = 0, at = 0; v < (INT64_C(1) << hi); v++) {
            int64_t m = cnt[v];
            cnt[v] = at;
            at += m;
        }
        for (int64_t i = 0; i < n; i++) b[cnt[(S - a[i].len) >> lo]++] = a[i];
        return PL_OK;
    }
    /* One pass over the lengths (at most seq_length). */
    if (!k->count) {
        k->count = pl__calloc((size_t)S + 2, sizeof *k->count);
        if (!k->count) return PL_ENOMEM;
    }
    memset(k->count, 0, ((size_t)S + 2) * sizeof *k->count);
    for (int64_t i = 0; i < n; i++) k->count[S - pl__padded(p, c[i].length) + 1]++;
    for (int64_t v = 1; v <= S + 1; v++) k->count[v] += k->count[v - 1];
    for (int64_t i = 0; i < n; i++) {
        int64_t len = pl__padded(p, c[i].length);
        pl__sort_key *o = &k->order[k->count[S - len]++];
        o->len = len;
        o->idx = i;
    }
    return PL_OK;
}

#define PL__FILL_MISSES 4

static int pack_best_fit(pl_planner *p, pl__pack *k) {
    const int64_t G = p->cfg->global_batch_size, S = p->cfg->seq_length;
    int err = 0, rc;
    for (int64_t s = 0; s <= S; s++) k->head[s] = -1;
    for (int l = 0; l < k->levels; l++)
        memset(k->bits[l], 0, (size_t)k->nwords[l] * sizeof(uint64_t));
    for (int64_t b = G - 1; b >= 0; b--) bucket_insert(k, (int32_t)b, S);
    int64_t free_total = G * S;

    /* 1. Carried-in chunks first, longest first. */
    if ((rc = sort_desc(k, p, p->carry.v, p->carry.n))) return rc;
    for (int64_t j = 0; j < p->carry.n; j++) {
        const pl_chunk *c = &p->carry.v[k->order[j].idx];
        int64_t len = pl__padded(p, c->length);
        if (best_fit_place(k, c, len, &err)) free_total -= k->last_used;
        else if (err || (err = pl__chunks_push(&k->newcarry, c))) return err;
    }
    /* 2. Draw until the capacity is covered; best-fit decreasing.  An
       evaluation pass may run out of documents (PL_DONE): the step then
       holds what there is. */
    int64_t want = free_total;
    int spent = 0;
    while (want > 0) {
        pl_chunk c;
        if ((rc = pl__planner_draw(p, &c)) == PL_DONE) {
            spent = 1;
            break;
        }
        if (rc) return rc;
        if ((rc = pl__chunks_push(&k->drawn, &c))) return rc;
        want -= pl__padded(p, c.length);
    }
    if ((rc = sort_desc(k, p, k->drawn.v, k->drawn.n))) return rc;
    for (int64_t j = 0; j < k->drawn.n; j++) {
        const pl_chunk *c = &k->drawn.v[k->order[j].idx];
        int64_t len = pl__padded(p, c->length);
        if (best_fit_place(k, c, len, &err)) free_total -= k->last_used;
        else if (err || (err = pl__chunks_push(&k->newcarry, c))) return err;
    }
    /* 3. Offer the gaps to more chunks until a few in a row do not fit. */
    int misses = 0;
    while (!spent && free_total > 0 && misses < PL__FILL_MISSES) {
        pl_chunk c;
        if ((rc = pl__planner_draw(p, &c)) == PL_DONE) break;
        if (rc) return rc;
        int64_t len = pl__padded(p, c.length);
        if (best_fit_place(k, &c, len, &err)) {
            free_total -= k->last_used;
            misses = 0;
        } else {
            if (err || (err = pl__chunks_push(&k->newcarry, &c))) return err;
            misses++;
        }
    }
    return PL_OK;
}

static int place_at(pl__pack *k, int32_t b, const pl_chunk *c) {
    if (k->placed.n == k->bin_of_cap) {
        int64_t nc = k->bin_of_cap ? k->bin_of_cap * 2 : 1024;
        int32_t *v = pl__realloc_array(k->bin_of, (size_t)nc, sizeof *v);
        if (!v) return PL_ENOMEM;
        k->bin_of = v;
        k->bin_of_cap = nc;
    }
    k->bin_of[k->placed.n] = b;
    return pl__chunks_push(&k->placed, c);
}

static int pack_concat(pl_planner *p, pl__pack *k) {
    const int64_t G = p->cfg->global_batch_size, S = p->cfg->seq_length;
    int rc;
    int64_t ci = 0; /* next carried chunk */
    int have = 0;
    pl_chunk pend = {0};
    for (int64_t b = 0; b < G; b++) {
        int64_t space = S;
        while (space > 0) {
            if (!have) {
                if (ci < p->carry.n) pend = p->carry.v[ci++];
                else if ((rc = pl__planner_draw(p, &pend)) == PL_DONE)
                    goto spent; /* an evaluation pass ran out: rows stay short */
                else if (rc) return rc;
                have = 1;
            }
            pl_chunk piece = pend;
            if (piece.length > space) { /* split at the sequence boundary */
                piece.length = space;
                piece.flags = 0;
            }
            pl_chunk *last = k->placed.n ? &k->placed.v[k->placed.n - 1] : NULL;
            if (last && k->bin_of[k->placed.n - 1] == (int32_t)b &&
                last->source == piece.source && last->index == piece.index &&
                last->offset + last->length == piece.offset) {
                last->length += piece.length; /* the same document goes on */
                last->flags = piece.flags;
            } else if ((rc = place_at(k, (int32_t)b, &piece))) {
                return rc;
            }
            pend.offset += piece.length;
            pend.length -= piece.length;
            space -= piece.length;
            if (pend.length == 0) have = 0;
        }
    }
spent:
    if (have && (rc = pl__chunks_push(&k->newcarry, &pend))) return rc;
    for (; ci < p->carry.n; ci++)
        if ((rc = pl__chunks_push(&k->newcarry, &p->carry.v[ci]))) return rc;
    return PL_OK;
}

void pl_plan_free(pl_plan *plan) {
    if (!plan) return;
    pl__plan_impl *m = (pl__plan_impl *)plan;
    free(m->chunks);
    free(m->seq_offsets);
    free(m->seq_tokens);
    free(m->rank_sequences);
    free(m->seq_cost);
    free(m->rank_cost);
    free(m->rank_enc_cost);
    free(m);
}

int pl__make_plan(pl_planner *p, const pl_chunk *placed, int64_t n,
                  const int32_t *bin_of, const int64_t *arrangement,
                  pl_plan **out) {
    const pl_config *c = p->cfg;
    const int64_t dp = c->topology.dp;
    const int64_t nmb = c->global_batch_size / (dp * c->micro_batch_size);
    const int64_t mbs = pl__mb_rows(c), G = dp * nmb * mbs; /* sequences */
    pl__plan_impl *m = pl__calloc(1, sizeof *m);
    if (!m) return PL_ENOMEM;
    m->chunks = pl__calloc((size_t)n, sizeof *m->chunks);
    m->seq_offsets = pl__calloc((size_t)G + 1, sizeof(int64_t));
    m->seq_tokens = pl__calloc((size_t)G, sizeof(int64_t));
    m->rank_sequences = pl__calloc((size_t)G, sizeof(int64_t));
    m->seq_cost = pl__calloc((size_t)G, sizeof(double));
    m->rank_cost = pl__calloc((size_t)dp, sizeof(double));
    if (!m->chunks || !m->seq_offsets || !m->seq_tokens || !m->rank_sequences ||
        !m->seq_cost || !m->rank_cost) {
        pl_plan_free(&m->pub);
        return PL_ENOMEM;
    }
    /* Counting sort by bin, keeping placement order within a bin. */
    for (int64_t i = 0; i < n; i++) m->seq_offsets[bin_of[i] + 1]++;
    for (int64_t b = 0; b < G; b++) m->seq_offsets[b + 1] += m->seq_offsets[b];
    int64_t *fill = m->seq_tokens; /* reuse as cursor, reset below */
    for (int64_t b = 0; b < G; b++) fill[b] = m->seq_offsets[b];
    for (int64_t i = 0; i < n; i++) m->chunks[fill[bin_of[i]]++] = placed[i];
    double total = 0, worst_chunk = 0;
    int64_t tokens = 0;
    const int enc = pl__has_encoder_cost(p);
    double *seq_enc = NULL;
    if (enc) {
        m->rank_enc_cost = pl__calloc((size_t)dp, sizeof(double));
        seq_enc = pl__calloc((size_t)G, sizeof(double));
        if (!m->rank_enc_cost || !seq_enc) {
            free(seq_enc);
            pl_plan_free(&m->pub);
            return PL_ENOMEM;
        }
    }
    for (int64_t b = 0; b < G; b++) {
        const pl_chunk *cs = m->chunks + m->seq_offsets[b];
        int64_t nc = m->seq_offsets[b + 1] - m->seq_offsets[b], t = 0;
        for (int64_t j = 0; j < nc; j++) {
            t += pl__padded(p, cs[j].length);
            tokens += cs[j].length;
            double ec = enc ? pl__chunk_encoder_cost(p, &cs[j]) : 0;
            double cc = pl__chunk_cost(c, cs[j].length) + ec;
            if (enc) seq_enc[b] += ec;
            if (cc > worst_chunk) worst_chunk = cc;
        }
        m->seq_tokens[b] = t;
        m->seq_cost[b] = pl__sequence_cost(c, cs, nc) + (enc ? seq_enc[b] : 0);
        total += m->seq_cost[b];
    }
    /* The arrangement: given by the balancer, or round-robin. */
    for (int64_t r = 0; r < dp; r++)
        for (int64_t pos = 0; pos < nmb * mbs; pos++) {
            int64_t slot = r * nmb * mbs + pos;
            int64_t q = arrangement ? arrangement[slot] : pos * dp + r;
            m->rank_sequences[slot] = q;
            m->rank_cost[r] += m->seq_cost[q];
            if (enc) m->rank_enc_cost[r] += seq_enc[q];
        }
    free(seq_enc);
    pl_plan *pub = &m->pub;
    pub->step = p->step;
    pub->dp = dp;
    pub->global_batch_size = c->global_batch_size;
    pub->micro_batch_size = mbs;
    pub->micro_batches_per_rank = nmb;
    pub->seq_length = pl__row_tokens(c);
    pub->n_sequences = G;
    pub->n_chunks = n;
    pub->chunks = m->chunks;
    pub->seq_offsets = m->seq_offsets;
    pub->seq_tokens = m->seq_tokens;
    pub->seq_cost = m->seq_cost;
    pub->rank_sequences = m->rank_sequences;
    pub->rank_cost = m->rank_cost;
    pub->rank_encoder_cost = m->rank_enc_cost;
    pub->tokens = tokens;
    double lb = total / (double)dp;
    pub->lower_bound = lb > worst_chunk ? lb : worst_chunk;
    *out = pub;
    return PL_OK;
}

/* Pack one step into k->placed / k->bin_of; the chunks that fit nowhere
 * become the carry.  PL_DONE when an evaluation pass has nothing left. */
static int pack_collect(pl_planner *p) {
    int rc = pack_alloc(p, p->cfg->global_batch_size, p->cfg->seq_length);
    if (rc) {
        pl__fmt(p->errmsg, sizeof p->errmsg, "packing: out of memory");
        return rc;
    }
    pl__pack *k = p->pack;
    k->placed.n = k->drawn.n = k->newcarry.n = 0;
    k->long_threshold = p->cfg->long_short_threshold;
    if (p->cfg->packing == PL__PACK_CONCAT_CHUNK) rc = pack_concat(p, k);
    else rc = pack_best_fit(p, k);
    if (rc == PL_ENOMEM) pl__fmt(p->errmsg, sizeof p->errmsg, "packing: out of memory");
    if (rc) return rc;
    if (k->placed.n == 0 && p->cfg->eval) return PL_DONE; /* the pass is over */
    /* The chunks that fit nowhere are the next step's carry. */
    pl__chunks tmp = p->carry;
    p->carry = k->newcarry;
    k->newcarry = tmp;
    k->newcarry.n = 0;
    return PL_OK;
}

int pl__pack_plan(pl_planner *p, const pl_chunk *placed, int64_t n,
                  int32_t *bin_of, pl_plan **out) {
    int rc;
    if (p->cfg->balance == PL__BALANCE_NONE) {
        rc = pl__make_plan(p, placed, n, bin_of, NULL, out);
    } else {
        const pl_config *c = p->cfg;
        const int64_t nseq = c->global_batch_size / c->micro_batch_size * pl__mb_rows(c);
        int64_t *arr = pl__calloc((size_t)nseq, sizeof *arr);
        rc = arr ? pl__balance(p, placed, n, bin_of, arr) : PL_ENOMEM;
        if (rc == PL_OK) rc = pl__make_plan(p, placed, n, bin_of, arr, out);
        free(arr);
    }
    if (rc == PL_ENOMEM) pl__fmt(p->errmsg, sizeof p->errmsg, "planning: out of memory");
    return rc;
}

int pl__pack_step(pl_planner *p, pl_plan **out) {
    int rc = pack_collect(p);
    if (rc) return rc;
    pl__pack *k = p->pack;
    return pl__pack_plan(p, k->placed.v, k->placed.n, k->bin_of, out);
}

int pl__pack_window_step(pl_planner *p, pl__chunks *into, pl__bins *bins) {
    int rc = pack_collect(p);
    if (rc) return rc;
    pl__pack *k = p->pack;
    for (int64_t i = 0; i < k->placed.n; i++) {
        if ((rc = pl__chunks_push(into, &k->placed.v[i]))) return rc;
        if ((rc = pl__bins_push(bins, k->bin_of[i]))) return rc;
    }
    return PL_OK;
}
