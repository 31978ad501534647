/*
 * state.c -- the state blob of SPEC section 4.
 *
 * Layout (little-endian), version 3:
 *   "PLST", u32 version, u64 total length,
 *   u64 seed, i64 next step, i64 micro-batch cursor, i64 dp,
 *   fingerprint: i64 seq_length, i64 global_batch_size, i64 micro_batch_size,
 *                i32 packing, i32 long_documents, i64 cp,
 *   u64 mixture hash (weights and schedule the targets were accumulated
 *     under; a change restarts the targets),
 *   u32 sources, then per source: u32 + name, u32 + path, i64 documents in
 *     the source, i64 epoch, drawn_in_epoch, cur_index, cur_offset,
 *     cur_length, drawn_tokens, target tokens as i64 whole tokens and
 *     u64 fraction in units of 2^-64 (the exact fixed-point target of
 *     planner.c, a multiple of 2^-48), i64 documents started,
 *     since_yield, skipped, f64 weight of the source in the blob's step
 *     (the weights that step is planned with: with the next two, what its
 *     plan depends on besides the counters),
 *   u32 carried chunks, then per chunk: i32 source (index in this blob's
 *     source list), i32 flags, i64 index, offset, length,
 *   u32 flags (bit 0: the step was begun under the recorded weights with
 *     another mixture than the one after it, see "Weights at resume"),
 *   u64 arrangement hash (pl__arrangement_hash: balance, long_short, cost,
 *     max_epochs; they may change only at a step boundary),
 *   version 4 only: i64 window start (balance_window: the blob's step lies
 *     inside a window that began at this earlier step; the counters and
 *     the carry are those of the window's start, see window.c),
 *   u32 CRC-32 of everything before it.
 * Version 4 is written only inside a window; every other blob is version 3.
 * Version 2 is the same with the target as one f64 (the targets of the
 * floating-point draw before 2026-12-02); it loads with each target
 * converted to the nearest multiple of 2^-48 token at or below it, at a
 * step boundary only: a step begun under the old rule may hold other chunks
 * when planned again by the exact one (see the refusal below).
 * Version 1 is version 2 without the per-source weight, the flags and the
 * arrangement hash; it still loads, except where those are needed (below).
 * Sources are matched by name, so the order of sources in the config may
 * change and sources may be added; a source may not disappear, change its
 * path or its number of documents.
 *
 * Weights at resume.  A blob is the planner's state at its step's start
 * plus the consumed micro-batch cursor; resuming plans the step again and
 * skips the cursor's micro-batches.  With the config's mixture (hash)
 * unchanged that plan is the first one.  With another mixture:
 *  - at a step boundary (cursor 0, flag clear) the targets restart at the
 *    drawn tokens and the step is planned with the new weights;
 *  - in the middle of a step (cursor > 0), or flag set, the step is planned
 *    with the recorded weights and the recorded targets -- exactly its first
 *    plan, so the rest of the step is what it would have been, nothing lost
 *    or repeated -- and the targets restart after it: the new weights apply
 *    from the next step.  A state taken before that step ends records the
 *    old weights and mixture hash again, with the flag set (the Ray planner
 *    keeps the states of step starts with cursor 0).
 * A version-1 blob in the middle of a step with another mixture is refused
 * (it does not record the weights its step was planned with).  In the
 * middle of a step, other arrangement settings (balance, long_short, cost,
 * max_epochs) are refused, as another dp is: the step's plan depends on
 * them and they are not recorded; so is another order of the state's
 * sources with another mixture (draw ties go to the lower index).
 */
#include "planner/planner.h"

#include <stdlib.h>
#include <string.h>

#include <zlib.h>

#define PL__STATE_VERSION 4u
#define PL__STATE_PINNED 1u /* flags bit 0 */

typedef struct pl__wbuf {
    unsigned char *p;
    size_t n, cap;
    int oom;
} pl__wbuf;

static void put(pl__wbuf *w, const void *v, size_t n) {
    if (w->oom) return;
    if (w->n + n > w->cap) {
        size_t nc = w->cap ? w->cap * 2 : 256;
        while (nc < w->n + n) nc *= 2;
        unsigned char *q = pl__realloc(w->p, nc);
        if (!q) {
            w->oom = 1;
            return;
        }
        w->p = q;
        w->cap = nc;
    }
    memcpy(w->p + w->n, v, n);
    w->n += n;
}
static void put_u32(pl__wbuf *w, uint32_t v) { put(w, &v, 4); }
static void put_i32(pl__wbuf *w, int32_t v) { put(w, &v, 4); }
static void put_i64(pl__wbuf *w, int64_t v) { put(w, &v, 8); }
static void put_u64(pl__wbuf *w, uint64_t v) { put(w, &v, 8); }
static void put_f64(pl__wbuf *w, double v) { put(w, &v, 8); }
static void put_str(pl__wbuf *w, const char *s) {
    size_t n = strlen(s);
    put_u32(w, (uint32_t)n);
    put(w, s, n);
}

int pl__state_encode(const pl_planner *p, int64_t mb_cursor, void **buf,
                     size_t *len) {
    const pl_config *c = p->cfg;
    pl__wbuf w = {0};
    /* Inside a window (window.c): the counters and carry of its start. */
    int64_t step = p->step, ws = p->step;
    const pl__src_state *src = p->src;
    const pl__chunks *carry = &p->carry;
    if (p->win_skip_to > p->step) { /* loaded inside a window, not yet planned */
        step = p->win_skip_to;
    } else if (p->win_start >= 0 && p->win_start < p->step &&
               p->step < p->win_start + p->win_steps) {
        ws = p->win_start;
        src = p->win_src;
        carry = &p->win_carry;
    }
    /* The weights p->step is planned with (pl__planner_next_impl). */
    const int pinned = p->pin_step == step && ws == step;
    double *wts = pl__calloc((size_t)(p->n_sources > 0 ? p->n_sources : 1), sizeof *wts);
    if (!wts) return PL_ENOMEM;
    if (pinned)
        memcpy(wts, p->pin_w, (size_t)p->n_sources * sizeof *wts);
    else
        pl__config_weights(c, step, wts);
    put(&w, "PLST", 4);
    put_u32(&w, ws < step ? 4u : 3u);
    put_u64(&w, 0); /* length, patched below */
    put_u64(&w, c->seed);
    put_i64(&w, step);
    put_i64(&w, mb_cursor);
    put_i64(&w, c->topology.dp);
    put_i64(&w, c->seq_length);
    put_i64(&w, c->global_batch_size);
    put_i64(&w, c->micro_batch_size);
    put_i32(&w, c->packing);
    put_i32(&w, c->long_documents);
    put_i64(&w, c->topology.cp);
    put_u64(&w, pinned ? p->pin_hash : p->mixture_hash);
    put_u32(&w, (uint32_t)p->n_sources);
    for (int64_t i = 0; i < p->n_sources; i++) {
        const pl__src_state *s = &src[i];
        put_str(&w, c->sources[i].name);
        put_str(&w, c->sources[i].path);
        put_i64(&w, p->num_docs[i]);
        put_i64(&w, s->epoch);
        put_i64(&w, s->drawn_in_epoch);
        put_i64(&w, s->cur_index);
        put_i64(&w, s->cur_offset);
        put_i64(&w, s->cur_length);
        put_i64(&w, s->drawn_tokens);
        put_i64(&w, (int64_t)(s->target >> PL__TBITS));
        put_u64(&w, (uint64_t)(s->target & (PL__WONE - 1)) << (64 - PL__TBITS));
        put_i64(&w, s->documents);
        put_i64(&w, s->since_yield);
        put_i64(&w, s->skipped);
        put_f64(&w, wts[i]);
    }
    free(wts);
    put_u32(&w, (uint32_t)carry->n);
    for (int64_t j = 0; j < carry->n; j++) {
        const pl_chunk *ch = &carry->v[j];
        put_i32(&w, ch->source);
        put_i32(&w, ch->flags);
        put_i64(&w, ch->index);
        put_i64(&w, ch->offset);
        put_i64(&w, ch->length);
    }
    put_u32(&w, pinned ? PL__STATE_PINNED : 0u);
    put_u64(&w, p->arrangement_hash);
    if (ws < step) put_i64(&w, ws);
    uint64_t total = (uint64_t)w.n + 4;
    if (!w.oom) memcpy(w.p + 8, &total, 8);
    if (!w.oom) put_u32(&w, pl__crc32(0, w.p, w.n));
    if (w.oom) {
        free(w.p);
        return PL_ENOMEM;
    }
    *buf = w.p;
    *len = w.n;
    return PL_OK;
}

typedef struct pl__rbuf {
    const unsigned char *p;
    size_t n, off;
    int bad;
} pl__rbuf;

static void get(pl__rbuf *r, void *v, size_t n) {
    if (r->bad || r->off + n > r->n) {
        r->bad = 1;
        memset(v, 0, n);
        return;
    }
    memcpy(v, r->p + r->off, n);
    r->off += n;
}
static uint32_t get_u32(pl__rbuf *r) { uint32_t v; get(r, &v, 4); return v; }
static int32_t get_i32(pl__rbuf *r) { int32_t v; get(r, &v, 4); return v; }
static int64_t get_i64(pl__rbuf *r) { int64_t v; get(r, &v, 8); return v; }
static uint64_t get_u64(pl__rbuf *r) { uint64_t v; get(r, &v, 8); return v; }
static double get_f64(pl__rbuf *r) { double v; get(r, &v, 8); return v; }
/* A length-prefixed string, borrowed from the blob (not NUL-terminated). */
static const char *get_str(pl__rbuf *r, uint32_t *n) {
    *n = get_u32(r);
    if (r->bad || r->off + *n > r->n) {
        r->bad = 1;
        return "";
    }
    const char *s = (const char *)r->p + r->off;
    r->off += *n;
    return s;
}

static int streq(const char *a, uint32_t na, const char *b) {
    return strlen(b) == na && memcmp(a, b, na) == 0;
}

#define PL__FP_CHECK(field, have_expr, want)                                   \
    do {                                                                       \
        int64_t have_ = (int64_t)(have_expr), want_ = (int64_t)(want);         \
        if (have_ != want_) {                                                  \
            pl__fmt(p->errmsg, sizeof p->errmsg,                               \
                    "state: fingerprint field '%s' differs (state %lld, "      \
                    "config %lld)",                                            \
                    field, (long long)have_, (long long)want_);                \
            rc = PL_ESTATE;                                                    \
            goto out;                                                          \
        }                                                                      \
    } while (0)

/* Counters of a state larger than this are not from a real run. */
#define PL__STATE_MAX ((int64_t)1 << 50)

int pl__state_decode(pl_planner *p, const void *buf, size_t len, int64_t nmb,
                     int64_t dp, int64_t *mb_cursor) {
    const pl_config *c = p->cfg;
    pl__rbuf r = {buf, len, 0, 0};
    int rc = PL_OK;
    pl__src_state *src = NULL;
    int64_t *map = NULL, *seen = NULL;
    double *pin_w = NULL;
    pl__names by_name = {0};
    pl__chunks carry = {0};
    char magic[4];
    if (!buf || len < 24) {
        pl__fmt(p->errmsg, sizeof p->errmsg,
                "state: blob of %zu bytes is too short", len);
        return PL_ESTATE;
    }
    get(&r, magic, 4);
    if (memcmp(magic, "PLST", 4) != 0) {
        pl__fmt(p->errmsg, sizeof p->errmsg,
                "state: bad magic at offset 0, expected PLST");
        return PL_ESTATE;
    }
    uint32_t version = get_u32(&r);
    if (version < 1 || version > PL__STATE_VERSION) {
        pl__fmt(p->errmsg, sizeof p->errmsg,
                "state: unsupported version %u at offset 4 (this library "
                "reads versions 1 to %u)",
                version, PL__STATE_VERSION);
        return PL_ESTATE;
    }
    uint64_t total = get_u64(&r);
    if (total != len) {
        pl__fmt(p->errmsg, sizeof p->errmsg,
                "state: length field says %llu bytes, blob has %zu",
                (unsigned long long)total, len);
        return PL_ESTATE;
    }
    uint32_t crc;
    memcpy(&crc, (const unsigned char *)buf + len - 4, 4);
    if (crc != pl__crc32(0, buf, len - 4)) {
        pl__fmt(p->errmsg, sizeof p->errmsg,
                "state: CRC-32 mismatch at offset %zu (corrupt blob)", len - 4);
        return PL_ESTATE;
    }
    r.n = len - 4;
    uint64_t seed = get_u64(&r);
    int64_t step = get_i64(&r);
    int64_t mb = get_i64(&r);
    int64_t state_dp = get_i64(&r);
    PL__FP_CHECK("seed", seed, c->seed);
    PL__FP_CHECK("seq_length", get_i64(&r), c->seq_length);
    PL__FP_CHECK("global_batch_size", get_i64(&r), c->global_batch_size);
    PL__FP_CHECK("micro_batch_size", get_i64(&r), c->micro_batch_size);
    {   /* enum fields: name the values */
        static const char *const packing[] = {"best_fit", "concat_chunk"};
        static const char *const longdoc[] = {"split", "truncate"};
        int32_t have[2];
        have[0] = get_i32(&r); /* in this order: two separate reads */
        have[1] = get_i32(&r);
        const int want[2] = {c->packing, c->long_documents};
        const char *const *names[2] = {packing, longdoc};
        const char *field[2] = {"packing", "long_documents"};
        for (int f = 0; f < 2; f++) {
            if (have[f] == want[f]) continue;
            pl__fmt(p->errmsg, sizeof p->errmsg,
                    "state: fingerprint field '%s' differs (state %s, config %s)",
                    field[f], have[f] == 0 || have[f] == 1 ? names[f][have[f]] : "?",
                    names[f][want[f]]);
            rc = PL_ESTATE;
            goto out;
        }
    }
    PL__FP_CHECK("topology.cp", get_i64(&r), c->topology.cp);
    if (step < 0 || step > PL__STATE_MAX || state_dp <= 0) goto corrupt;
    /* step * micro-batches per rank must not overflow, for any dp. */
    if (step > PL__MAX_MICRO_BATCHES / (c->global_batch_size / c->micro_batch_size)) {
        pl__fmt(p->errmsg, sizeof p->errmsg,
                "state: step %lld times %lld micro-batches per step is above "
                "the limit 2^50",
                (long long)step,
                (long long)(c->global_batch_size / c->micro_batch_size));
        rc = PL_ESTATE;
        goto out;
    }
    if (mb != 0 && dp > 0 && state_dp != dp) {
        pl__fmt(p->errmsg, sizeof p->errmsg,
                "state: saved in the middle of step %lld with dp=%lld; dp may "
                "change only at a step boundary (config dp=%lld)",
                (long long)step, (long long)state_dp, (long long)dp);
        rc = PL_ESTATE;
        goto out;
    }
    if (mb < 0 || mb >= nmb) {
        pl__fmt(p->errmsg, sizeof p->errmsg,
                "state: micro-batch cursor %lld out of range [0, %lld)",
                (long long)mb, (long long)nmb);
        rc = PL_ESTATE;
        goto out;
    }
    uint64_t mix = get_u64(&r);
    uint32_t ns = get_u32(&r);
    if (r.bad || ns > r.n) goto corrupt;
    src = pl__calloc((size_t)p->n_sources, sizeof *src);
    map = pl__calloc(ns ? ns : 1, sizeof *map);
    seen = pl__calloc((size_t)p->n_sources, sizeof *seen);
    pin_w = pl__calloc((size_t)(p->n_sources > 0 ? p->n_sources : 1), sizeof *pin_w);
    if (!src || !map || !seen || !pin_w || pl__names_init(&by_name, p->n_sources)) {
        pl__fmt(p->errmsg, sizeof p->errmsg, "state: out of memory loading a state blob");
        rc = PL_ENOMEM;
        goto out;
    }
    /* Config names by content: matching the blob's sources is O(1) each. */
    for (int64_t i = 0; i < p->n_sources; i++)
        pl__names_put(&by_name, c->sources[i].name, strlen(c->sources[i].name), i);
    for (int64_t i = 0; i < p->n_sources; i++) src[i].cur_index = -1;
    for (uint32_t j = 0; j < ns; j++) {
        uint32_t nl, np;
        const char *name = get_str(&r, &nl);
        const char *path = get_str(&r, &np);
        if (r.bad) goto corrupt;
        int64_t i = pl__names_get(&by_name, name, nl);
        if (i < 0) {
            pl__fmt(p->errmsg, sizeof p->errmsg,
                    "state: source '%.*s' of the state is not in the config",
                    (int)nl, name);
            rc = PL_ESTATE;
            goto out;
        }
        if (!streq(path, np, c->sources[i].path)) {
            pl__fmt(p->errmsg, sizeof p->errmsg,
                    "state: fingerprint field 'sources.%s.path' differs "
                    "(state '%.*s', config '%s')",
                    c->sources[i].name, (int)np, path, c->sources[i].path);
            rc = PL_ESTATE;
            goto out;
        }
        if (seen[i]++) goto corrupt; /* a source named twice */
        map[j] = i;
        int64_t nd = get_i64(&r);
        if (!r.bad && nd != p->num_docs[i]) {
            pl__fmt(p->errmsg, sizeof p->errmsg,
                    "state: source '%s' had %lld documents, now %lld",
                    c->sources[i].name, (long long)nd,
                    (long long)p->num_docs[i]);
            rc = PL_ESTATE;
            goto out;
        }
        pl__src_state *s = &src[i];
        s->epoch = get_i64(&r);
        s->drawn_in_epoch = get_i64(&r);
        s->cur_index = get_i64(&r);
        s->cur_offset = get_i64(&r);
        s->cur_length = get_i64(&r);
        s->drawn_tokens = get_i64(&r);
        int bad_target = 0;
        if (version >= 3) {
            int64_t whole = get_i64(&r);
            uint64_t frac = get_u64(&r);
            bad_target = whole < 0 || whole > PL__STATE_MAX ||
                         (whole == PL__STATE_MAX && frac != 0) || /* as v2 */
                         (frac & ((UINT64_C(1) << (64 - PL__TBITS)) - 1)) != 0;
            if (!bad_target)
                s->target = ((pl__i128)whole << PL__TBITS) |
                            (pl__i128)(frac >> (64 - PL__TBITS));
        } else { /* a double target: at or below it, exactly */
            double t = get_f64(&r);
            bad_target = !(t >= 0 && t <= (double)PL__STATE_MAX);
            if (!bad_target) s->target = (pl__i128)(t * (double)PL__WONE);
        }
        s->documents = get_i64(&r);
        s->since_yield = get_i64(&r);
        s->skipped = get_i64(&r);
        if (version >= 2) { /* its weight in the blob's step (0 <= w <= 1) */
            pin_w[i] = get_f64(&r);
            if (!(pin_w[i] >= 0 && pin_w[i] <= 1)) goto corrupt;
        }
        if (s->epoch < 0 || s->epoch > PL__STATE_MAX || s->drawn_in_epoch < 0 ||
            s->drawn_in_epoch > nd || s->cur_index < -1 || s->cur_index >= nd ||
            (s->cur_index >= 0 &&
             (s->cur_length <= 0 || s->cur_offset <= 0 ||
              s->cur_offset >= s->cur_length)) ||
            (s->cur_index < 0 && (s->cur_offset != 0 || s->cur_length != 0)) ||
            s->drawn_tokens < 0 || s->drawn_tokens > PL__STATE_MAX ||
            bad_target ||
            s->documents < 0 || s->documents > PL__STATE_MAX ||
            s->since_yield < 0 || s->since_yield > nd + 1 || s->skipped < 0 ||
            s->skipped > PL__STATE_MAX)
            goto corrupt;
        if (s->cur_index >= 0) { /* the current document must be this one */
            int64_t dlen = 0;
            char err[PL__ERRMSG_CAP];
            int lrc = pl__source_length(p->sources[i], s->cur_index, &dlen, err,
                                        sizeof err);
            if (lrc != PL_OK) {
                pl__fmt(p->errmsg, sizeof p->errmsg,
                        "state: source '%s': current document %lld cannot be "
                        "checked: %s",
                        c->sources[i].name, (long long)s->cur_index, err);
                /* Out of memory says nothing about the state. */
                rc = lrc == PL_ENOMEM ? PL_ENOMEM : PL_ESTATE;
                goto out;
            }
            if (dlen != s->cur_length) {
                pl__fmt(p->errmsg, sizeof p->errmsg,
                        "state: source '%s': current document %lld has "
                        "length %lld in the state, %lld in the source",
                        c->sources[i].name, (long long)s->cur_index,
                        (long long)s->cur_length, (long long)dlen);
                rc = PL_ESTATE;
                goto out;
            }
        }
    }
    uint32_t nc = get_u32(&r);
    if (r.bad || nc > r.n) goto corrupt;
    for (uint32_t j = 0; j < nc; j++) {
        pl_chunk ch;
        int32_t si = get_i32(&r);
        ch.flags = get_i32(&r);
        ch.index = get_i64(&r);
        ch.offset = get_i64(&r);
        ch.length = get_i64(&r);
        if (r.bad || si < 0 || (uint32_t)si >= ns || ch.length <= 0 ||
            ch.length > p->max_chunk)
            goto corrupt;
        ch.source = (int32_t)map[si];
        if (ch.index < p->doc_lo[ch.source] ||
            ch.index >= p->doc_lo[ch.source] + p->num_docs[ch.source] || ch.offset < 0)
            goto corrupt;
        {   /* the chunk must lie inside its document */
            int64_t dlen = 0;
            char err[PL__ERRMSG_CAP];
            if (pl__source_length(p->sources[ch.source], ch.index, &dlen, err,
                                  sizeof err) != PL_OK ||
                ch.offset > dlen || ch.length > dlen - ch.offset)
                goto corrupt;
        }
        if ((rc = pl__chunks_push(&carry, &ch))) {
            pl__fmt(p->errmsg, sizeof p->errmsg, "state: out of memory loading a state blob");
            goto out;
        }
    }
    uint32_t flags = version >= 2 ? get_u32(&r) : 0;
    uint64_t arr = version >= 2 ? get_u64(&r) : p->arrangement_hash;
    int64_t ws = version >= 4 ? get_i64(&r) : step;
    if (r.bad || r.off != r.n || (flags & ~PL__STATE_PINNED) || ws < 0 || ws > step)
        goto corrupt;
    if (ws < step && (c->balance_window <= 1 || step - ws >= c->balance_window ||
                      arr != p->arrangement_hash || mix != p->mixture_hash ||
                      (flags & PL__STATE_PINNED))) {
        /* The window's steps would hold other sequences than the ones its
           first steps were served from. */
        pl__fmt(p->errmsg, sizeof p->errmsg,
                "state: saved at step %lld inside a balance_window window that "
                "began at step %lld; balance_window, the mixture and the "
                "arrangement settings may change only at a window boundary "
                "(resume with the saving config up to step %lld)",
                (long long)step, (long long)ws,
                (long long)(ws + (c->balance_window > 1 ? c->balance_window : 1)));
        rc = PL_ESTATE;
        goto out;
    }
    if (mb != 0 && arr != p->arrangement_hash) {
        /* The step's plan (which sequence, micro-batch and rank a chunk lands
           in, or which chunks it holds) would differ from the one the cursor
           counts into. */
        pl__fmt(p->errmsg, sizeof p->errmsg,
                "state: saved in the middle of step %lld (micro-batch %lld); "
                "balance, long_short, cost and max_epochs may change only at a "
                "step boundary",
                (long long)step, (long long)mb);
        rc = PL_ESTATE;
        goto out;
    }
    /* Another mixture: in the middle of a step (or a step begun so), the
       step is planned as it first was, from the recorded weights (see
       "Weights at resume" above); at a step boundary the targets restart. */
    const int changed = mix != p->mixture_hash;
    const int pin = changed && (mb != 0 || (flags & PL__STATE_PINNED));
    for (uint32_t j = 1; pin && j < ns; j++)
        if (map[j] < map[j - 1]) {
            pl__fmt(p->errmsg, sizeof p->errmsg,
                    "state: saved in the middle of step %lld (micro-batch %lld); "
                    "with other weights the order of the state's sources may change "
                    "only at a step boundary ('%s' now comes before '%s')",
                    (long long)step, (long long)mb, c->sources[map[j]].name,
                    c->sources[map[j - 1]].name);
            rc = PL_ESTATE;
            goto out;
        }
    if (pin && version < 2) {
        /* Planning the step with the new weights while the cursor skips
           into it would lose and repeat chunks. */
        pl__fmt(p->errmsg, sizeof p->errmsg,
                "state: a version-1 state saved in the middle of step %lld "
                "(micro-batch %lld) does not record the weights that step was "
                "planned with; with other weights, schedule or sources it "
                "loads only at a step boundary (resume it with its own config "
                "up to step %lld, then change them)",
                (long long)step, (long long)mb, (long long)step + 1);
        rc = PL_ESTATE;
        goto out;
    }
    if (version < 3 && (mb != 0 || (flags & PL__STATE_PINNED))) {
        /* Its step was planned with the floating-point targets of before
           version 3; planned again by the exact rule it may hold other
           chunks (near-ties break otherwise), and the cursor would skip
           into a different step: chunks lost and repeated. */
        pl__fmt(p->errmsg, sizeof p->errmsg,
                "state: a version-%u state saved in the middle of step %lld "
                "(micro-batch %lld) was planned with the floating-point mixture "
                "targets of state versions 1 and 2; this library plans by exact "
                "targets (version 3) and loads older states only at a step "
                "boundary (finish step %lld with the library that wrote it)",
                version, (long long)step, (long long)mb, (long long)step);
        rc = PL_ESTATE;
        goto out;
    }
    /* Commit. */
    memcpy(p->src, src, (size_t)p->n_sources * sizeof *src);
    pl__chunks_free(&p->carry);
    p->carry = carry;
    carry.v = NULL;
    p->step = ws;
    p->win_skip_to = ws < step ? step : -1; /* window.c */
    p->win_start = -1;
    p->failed = 0;
    *mb_cursor = mb;
    p->pin_step = -1;
    if (pin) { /* this step as first planned; targets restart after it */
        memcpy(p->pin_w, pin_w, (size_t)p->n_sources * sizeof *pin_w);
        p->pin_hash = mix;
        p->pin_step = step;
    } else if (changed) { /* targets restart from the resume step */
        for (int64_t i = 0; i < p->n_sources; i++)
            p->src[i].target = (pl__i128)p->src[i].drawn_tokens << PL__TBITS;
    }
    for (int64_t i = 0; i < p->n_sources; i++) {
        p->ahead[i].at = -1; /* the look-ahead cache of planner.c */
        pl__perm_init(&p->perm[i], (uint64_t)p->num_docs[i], c->seed,
                      c->sources[i].name, (uint64_t)p->src[i].epoch);
    }
    goto out;
corrupt:
    pl__fmt(p->errmsg, sizeof p->errmsg,
            "state: malformed blob near offset %zu", r.off);
    rc = PL_ESTATE;
out:
    free(src);
    free(map);
    free(seen);
    free(pin_w);
    pl__names_free(&by_name);
    pl__chunks_free(&carry);
    return rc;
}

/* ------------------------------------------------------------ accessors */
/*
 * The public accessors (pl_state_inspect, pl_state_source, pl_state_retarget)
 * read a blob without a planner: what deployments and tools need (position,
 * per-source counters) without knowing the layout above.  They check magic,
 * version, length and CRC, then walk the source records.
 */

/* The 8-byte fields of a source record after its name and path. */
static int state_fields(uint32_t version) {
    return version >= 3 ? 13 : version == 2 ? 12 : 11;
}

/* Check the envelope; on success r is positioned after the length field and
 * r->n excludes the CRC. */
static int state_open(const void *buf, size_t len, pl__rbuf *r,
                          uint32_t *version) {
    if (!buf || len < 24 + 4) return PL_ESTATE;
    *r = (pl__rbuf){buf, len, 0, 0};
    char magic[4];
    get(r, magic, 4);
    if (memcmp(magic, "PLST", 4) != 0) return PL_ESTATE;
    *version = get_u32(r);
    if (*version < 1 || *version > PL__STATE_VERSION) return PL_EVERSION;
    if (get_u64(r) != len) return PL_ESTATE;
    uint32_t crc;
    memcpy(&crc, (const unsigned char *)buf + len - 4, 4);
    if (crc != pl__crc32(0, buf, len - 4)) return PL_ESTATE;
    r->n = len - 4;
    return PL_OK;
}

int pl_state_inspect(const void *buf, size_t len, pl_state_info *out) {
    if (!out) return PL_EINVAL;
    pl__rbuf r;
    uint32_t version;
    int rc = state_open(buf, len, &r, &version);
    if (rc) return rc;
    pl_state_info s;
    memset(&s, 0, sizeof s);
    s.version = version;
    s.seed = get_u64(&r);
    s.step = get_i64(&r);
    s.micro_batch = get_i64(&r);
    s.dp = get_i64(&r);
    s.seq_length = get_i64(&r);
    s.global_batch_size = get_i64(&r);
    s.micro_batch_size = get_i64(&r);
    (void)get_i32(&r);
    (void)get_i32(&r);
    s.cp = get_i64(&r);
    (void)get_u64(&r);
    uint32_t ns = get_u32(&r);
    if (r.bad || s.step < 0 || s.step > PL__STATE_MAX || s.micro_batch < 0 ||
        s.dp <= 0 || ns > r.n)
        return PL_ESTATE;
    s.n_sources = ns;
    for (uint32_t j = 0; j < ns && !r.bad; j++) {
        uint32_t n;
        (void)get_str(&r, &n);
        (void)get_str(&r, &n);
        r.off += 8 * (size_t)state_fields(version);
        if (r.off > r.n) r.bad = 1;
    }
    uint32_t nc = get_u32(&r);
    if (r.bad ||
        (uint64_t)nc * 32 + (version >= 2 ? 12 : 0) + (version >= 4 ? 8 : 0) != r.n - r.off)
        return PL_ESTATE;
    s.carried_chunks = nc;
    *out = s;
    return PL_OK;
}

int pl_state_source(const void *buf, size_t len, int64_t i,
                    pl_state_source_info *out) {
    if (!out) return PL_EINVAL;
    pl__rbuf r;
    uint32_t version;
    int rc = state_open(buf, len, &r, &version);
    if (rc) return rc;
    r.off = 96;
    uint32_t ns = get_u32(&r);
    if (r.bad) return PL_ESTATE;
    if (i < 0 || i >= (int64_t)ns) return PL_ERANGE;
    for (uint32_t j = 0; j <= (uint32_t)i; j++) {
        uint32_t nl, np;
        const char *name = get_str(&r, &nl);
        const char *path = get_str(&r, &np);
        int64_t v[13];
        const int nf = state_fields(version), x = version >= 3;
        for (int t = 0; t < nf; t++) v[t] = get_i64(&r);
        if (r.bad) return PL_ESTATE;
        if (j == (uint32_t)i) {
            pl_state_source_info s;
            memset(&s, 0, sizeof s);
            s.name = name;
            s.name_len = nl;
            s.path = path;
            s.path_len = np;
            s.num_documents = v[0];
            s.epoch = v[1];
            s.drawn_in_epoch = v[2];
            s.current_document = v[3];
            s.current_offset = v[4];
            s.current_length = v[5];
            s.drawn_tokens = v[6];
            if (x) /* whole tokens and a fraction in units of 2^-64 */
                s.target_tokens = (double)v[7] + (double)(uint64_t)v[8] * 0x1p-64;
            else
                memcpy(&s.target_tokens, &v[7], 8);
            s.documents = v[8 + x];
            s.skipped = v[10 + x];
            *out = s;
        }
    }
    return PL_OK;
}

int pl_state_retarget(const void *buf, size_t len, int64_t micro_batch,
                      int64_t dp, void *out, size_t cap, size_t *out_len) {
    pl_state_info s;
    int rc = pl_state_inspect(buf, len, &s);
    if (rc) return rc;
    if (out_len) *out_len = len;
    if (micro_batch < 0 || dp <= 0) return PL_EINVAL;
    if (!out) return PL_OK;
    if (cap < len) return PL_EINVAL;
    unsigned char *b = out;
    if (b != buf) memmove(b, buf, len);
    memcpy(b + 32, &micro_batch, 8);
    memcpy(b + 40, &dp, 8);
    uint32_t crc = pl__crc32(0, b, len - 4);
    memcpy(b + len - 4, &crc, 4);
    return PL_OK;
}

/* ------------------------------------------------------- packed copies */

#define PL__PACK_HEADER 12 /* "PLSZ", u64 blob length */
/* No state blob is this large (2^32 sources would not fit a config). */
#define PL__PACK_MAX ((uint64_t)1 << 36)

int pl_state_pack(const void *blob, size_t len, void *buf, size_t cap, size_t *out_len) {
    pl_state_info si;
    int rc = pl_state_inspect(blob, len, &si);
    if (rc) return rc;
    uLong bound = compressBound((uLong)len);
    if (!out_len) return PL_EINVAL;
    if (!buf) {
        *out_len = PL__PACK_HEADER + (size_t)bound;
        return PL_OK;
    }
    if (cap < PL__PACK_HEADER) return PL_EINVAL;
    unsigned char *w = buf;
    uint64_t n64 = len;
    memcpy(w, "PLSZ", 4);
    memcpy(w + 4, &n64, 8);
    uLongf zlen = (uLongf)(cap - PL__PACK_HEADER);
    int zr = compress2(w + PL__PACK_HEADER, &zlen, blob, (uLong)len, 1);
    if (zr == Z_BUF_ERROR) return PL_EINVAL; /* cap too small */
    if (zr != Z_OK) return PL_ENOMEM;
    *out_len = PL__PACK_HEADER + (size_t)zlen;
    return PL_OK;
}

int pl_state_unpack(const void *packed, size_t len, void *buf, size_t cap, size_t *out_len) {
    const unsigned char *b = packed;
    uint64_t n64 = 0;
    if (!out_len || !b || len < PL__PACK_HEADER || memcmp(b, "PLSZ", 4) != 0)
        return out_len ? PL_ESTATE : PL_EINVAL;
    memcpy(&n64, b + 4, 8);
    if (n64 < 16 || n64 > PL__PACK_MAX) return PL_ESTATE;
    if (!buf) {
        *out_len = (size_t)n64;
        return PL_OK;
    }
    if (cap < n64) return PL_EINVAL;
    uLongf got = (uLongf)n64;
    int zr = uncompress(buf, &got, b + PL__PACK_HEADER, (uLong)(len - PL__PACK_HEADER));
    if (zr != Z_OK || got != n64) return zr == Z_MEM_ERROR ? PL_ENOMEM : PL_ESTATE;
    pl_state_info si;
    if (pl_state_inspect(buf, (size_t)got, &si) != PL_OK) return PL_ESTATE;
    *out_len = (size_t)got;
    return PL_OK;
}
