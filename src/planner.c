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
 * Chunking.  A source keeps the document it is in the middle of; a document
 * longer than max_chunk yields several chunks in a row (long_documents:
 * split) or one (truncate).  Documents are taken from the source's keyed
 * permutation of its epoch (shuffle.c); a finished permutation starts the
 * next epoch with a new key.
 */
#include "planner_internal.h"

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

static void pl__planner_perm(pl_planner *p, int64_t i) {
    pl__perm_init(&p->perm[i], (uint64_t)p->num_docs[i], p->cfg->seed,
                  p->cfg->sources[i].name, (uint64_t)p->src[i].epoch);
}

int pl_planner_create(const pl_config *cfg, pl_source *const *sources,
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
    p->cfg = pl__config_clone(cfg);
    p->n_sources = n_sources;
    p->sources = sources;
    p->num_docs = pl__calloc((size_t)n_sources, sizeof *p->num_docs);
    p->src = pl__calloc((size_t)n_sources, sizeof *p->src);
    p->perm = pl__calloc((size_t)n_sources, sizeof *p->perm);
    p->weights = pl__calloc((size_t)n_sources, sizeof *p->weights);
    if (!p->cfg || !p->num_docs || !p->src || !p->perm || !p->weights) {
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
    for (int64_t i = 0; i < n_sources; i++) {
        p->num_docs[i] = pl_source_num_documents(sources[i]);
        p->src[i].cur_index = -1;
        pl__planner_perm(p, i);
        int used = c->has_schedule ? 0 : c->sources[i].weight > 0;
        for (int64_t k = 0; k < c->n_points && !used; k++)
            used = c->points[k].weights[i] > 0;
        if (used && p->num_docs[i] == 0) {
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
    free(p->perm);
    free(p->src);
    free(p->num_docs);
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
        int64_t idx = (int64_t)pl__perm_apply(&p->perm[i],
                                              (uint64_t)s->drawn_in_epoch);
        s->drawn_in_epoch++;
        s->since_yield++;
        if (sc->max_epochs > 0 && s->drawn_in_epoch >= p->num_docs[i] &&
            s->epoch + 1 >= sc->max_epochs) {
            s->epoch++;
            s->drawn_in_epoch = 0;
        }
        int64_t len = 0;
        char err[PL__ERRMSG_CAP];
        int rc = pl__source_length(p->sources[i], idx, &len, err, sizeof err);
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

/* A source with max_epochs that has completed them (and holds no partly
 * drawn document) is drawn no more; the others share its weight. */
static int pl__exhausted(const pl_planner *p, int64_t i) {
    int64_t cap = p->cfg->sources[i].max_epochs;
    const pl__src_state *s = &p->src[i];
    return cap > 0 && s->cur_index < 0 && s->epoch >= cap;
}

int pl__planner_draw(pl_planner *p, pl_chunk *out) {
    int64_t best = -1;
    double best_deficit = 0;
    int capped = 0;
again:
    best = -1;
    for (int64_t i = 0; i < p->n_sources; i++) {
        if (p->weights[i] <= 0) continue;
        if (pl__exhausted(p, i)) {
            capped = 1;
            continue;
        }
        double d = p->src[i].target_tokens - (double)p->src[i].drawn_tokens;
        if (best < 0 || d > best_deficit) {
            best = i;
            best_deficit = d;
        }
    }
    if (best < 0 && capped) {
        pl__fmt(p->errmsg, sizeof p->errmsg,
                "step %lld: every source with a positive weight has been read "
                "max_epochs times",
                (long long)p->step);
        return PL_ECONFIG;
    }
    if (best < 0) {
        pl__fmt(p->errmsg, sizeof p->errmsg,
                "every source weight is zero at step %lld", (long long)p->step);
        return PL_ECONFIG;
    }
    int rc = pl__next_document(p, best);
    if (rc == PL_DONE) goto again; /* spent its max_epochs: now exhausted */
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
    if (s->cur_offset >= s->cur_length ||
        p->cfg->long_documents == PL__LONGDOC_TRUNCATE) {
        out->flags = PL_CHUNK_DOC_END;
        s->cur_index = -1;
        s->cur_offset = s->cur_length = 0;
    }
    s->drawn_tokens += take;
    for (int64_t i = 0; i < p->n_sources; i++)
        p->src[i].target_tokens += p->weights[i] * (double)take;
    return PL_OK;
}

int pl_planner_next(pl_planner *p, pl_plan **out) {
    *out = NULL;
    if (p->failed) return p->failed;
    pl__config_weights(p->cfg, p->step, p->weights);
    int rc = pl__pack_step(p, out);
    if (rc) {
        p->failed = rc;
        return rc;
    }
    p->step++;
    return PL_OK;
}

int pl_planner_get_state(pl_planner *p, void *buf, size_t cap, size_t *len) {
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

int pl_planner_set_state(pl_planner *p, const void *buf, size_t len) {
    /* The planner stands at the start of the blob's step; a mid-step cursor
       is the loader's business. */
    int64_t mb = 0;
    return pl__state_decode(p, buf, len, INT64_MAX, 0, &mb);
}
