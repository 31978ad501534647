/*
 * config/config.c -- the config object: messages and warnings, set and get,
 * copies (clone, share), the fingerprint, and release.
 *
 * A config is parsed from YAML (yaml.c) into struct pl_config (config.h);
 * every top-level scalar key is a row of the key table (keys.h), which
 * pl_config_set and pl_config_get_int read by name.  pl_config_set
 * re-validates (validate.c) and rolls the config back when validation
 * fails, so a config is always valid.
 *
 * Messages name the key as a dotted path ("topology.dp", "sources[1].path",
 * "schedule.points[2].step") and, when the value came from YAML, the origin
 * and line: "pretrain.yaml:7: unknown key 'seq_lenght' (did you mean
 * 'seq_length'?)".
 */
#include "config/config.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------ messages */

__attribute__((format(printf, 4, 5))) int
pl__cfg_err(pl_config *cfg, int code, int line, const char *fmt, ...) {
    char msg[PL__ERRMSG_CAP];
    va_list ap;
    va_start(ap, fmt);
    pl__vfmt(msg, sizeof msg, fmt, ap);
    va_end(ap);
    const char *origin = cfg->origin ? cfg->origin : "<config>";
    if (line > 0)
        pl__fmt(cfg->errmsg, sizeof cfg->errmsg, "%s:%d: %s", origin, line,
                msg);
    else if (line == 0)
        pl__fmt(cfg->errmsg, sizeof cfg->errmsg, "%s: %s", origin, msg);
    else
        pl__fmt(cfg->errmsg, sizeof cfg->errmsg, "%s", msg);
    return code;
}

/* Append a warning (formatted as pl__cfg_err formats messages).  PL_ENOMEM when
 * it cannot be stored. */
__attribute__((format(printf, 3, 4))) int
pl__cfg_warn(pl_config *cfg, int line, const char *fmt, ...) {
    char msg[PL__ERRMSG_CAP], full[PL__ERRMSG_CAP];
    va_list ap;
    va_start(ap, fmt);
    pl__vfmt(msg, sizeof msg, fmt, ap);
    va_end(ap);
    const char *origin = cfg->origin ? cfg->origin : "<config>";
    if (line > 0)
        pl__fmt(full, sizeof full, "%s:%d: %s", origin, line, msg);
    else
        pl__fmt(full, sizeof full, "%s: %s", origin, msg);
    char **grown = pl__realloc_array(cfg->warnings, (size_t)cfg->n_warnings + 1,
                                     sizeof *grown);
    if (!grown) return pl__cfg_err(cfg, PL_ENOMEM, 0, "out of memory");
    cfg->warnings = grown;
    grown[cfg->n_warnings] = pl__strdup(full);
    if (!grown[cfg->n_warnings])
        return pl__cfg_err(cfg, PL_ENOMEM, 0, "out of memory");
    cfg->n_warnings++;
    return PL_OK;
}

/* ------------------------------------------------------------ object */

/* A plain source (no out-of-line option) costs this much per process. */
_Static_assert(sizeof(pl__source_cfg) <= 13 * sizeof(int64_t), "pl__source_cfg grew");

const pl__source_ext pl__source_ext_none;

void pl__source_ext_free(pl__source_ext *x) {
    if (!x) return;
    free(x->text_key);
    free(x->prompt_key);
    free(x->response_key);
    free(x->messages_key);
    for (int q = 0; q < 3; q++) free(x->chat[q]);
    pl__tok_cfg_free(&x->tok);
    free(x);
}

int pl__source_ext_dup(const pl__source_ext *o, pl__source_ext **out) {
    *out = NULL;
    if (!o) return PL_OK;
    pl__source_ext *d = pl__malloc(sizeof *d);
    if (!d) return PL_ENOMEM;
    *d = *o;
    d->text_key = o->text_key ? pl__strdup(o->text_key) : NULL;
    d->prompt_key = o->prompt_key ? pl__strdup(o->prompt_key) : NULL;
    d->response_key = o->response_key ? pl__strdup(o->response_key) : NULL;
    d->messages_key = o->messages_key ? pl__strdup(o->messages_key) : NULL;
    int ok = 1;
    for (int q = 0; q < 3; q++) {
        d->chat[q] = o->chat[q] ? pl__strdup(o->chat[q]) : NULL;
        if (o->chat[q] && !d->chat[q]) ok = 0;
    }
    memset(&d->tok, 0, sizeof d->tok);
    int tok_rc = pl__tok_cfg_dup(&d->tok, &o->tok);
    if (!ok || tok_rc || (o->text_key && !d->text_key) || (o->prompt_key && !d->prompt_key) ||
        (o->response_key && !d->response_key) || (o->messages_key && !d->messages_key)) {
        pl__source_ext_free(d);
        return PL_ENOMEM;
    }
    *out = d;
    return PL_OK;
}

void pl_config_free(pl_config *cfg) {
    if (!cfg) return;
    if (cfg->frozen && __atomic_fetch_sub(&cfg->refs, 1, __ATOMIC_ACQ_REL) > 0)
        return; /* still held */
    for (int64_t i = 0; i < cfg->n_sources; i++) {
        free(cfg->sources[i].name);
        free(cfg->sources[i].path);
        pl__source_ext_free(cfg->sources[i].x);
    }
    pl__tok_cfg_free(&cfg->tok);
    free(cfg->sources);
    for (int part = 0; part < 2; part++) {
        for (int64_t i = 0; i < cfg->n_eval_sources[part]; i++) {
            free(cfg->eval_sources[part][i].name);
            free(cfg->eval_sources[part][i].path);
            pl__source_ext_free(cfg->eval_sources[part][i].x);
        }
        free(cfg->eval_sources[part]);
    }
    for (int64_t k = 0; k < cfg->n_points; k++) free(cfg->points[k].weights);
    free(cfg->points);
    for (int64_t k = 0; k < cfg->n_warnings; k++) free(cfg->warnings[k]);
    free(cfg->warnings);
    free(cfg->origin);
    free(cfg);
}

const char *pl_config_errmsg(const pl_config *cfg) {
    return cfg ? cfg->errmsg : "out of memory";
}

/* ------------------------------------------------------------ set / get */

static int config_set_impl(pl_config *cfg, const char *key, const char *value) {
    if (!cfg) return PL_EINVAL;
    if (!key || !value)
        return pl__cfg_err(cfg, PL_EINVAL, -1, "pl_config_set: NULL key or value");
    pl_config saved = *cfg;
    pl__sval v = {value, 0, -1};
    int rc;
    int64_t src = -1;
    double old_weight = 0;
    /* sources.NAME.weight changes one source's weight. */
    if (strncmp(key, "sources.", 8) == 0) {
        const char *name = key + 8;
        const char *dot = strrchr(name, '.');
        if (!dot || strcmp(dot, ".weight") != 0) {
            rc = pl__cfg_err(cfg, PL_ECONFIG, -1,
                         "unknown key '%s' (only sources.NAME.weight can be "
                         "set)",
                         key);
            goto fail;
        }
        for (int64_t i = 0; i < cfg->n_sources; i++) {
            size_t nl = strlen(cfg->sources[i].name);
            if (nl == (size_t)(dot - name) &&
                strncmp(cfg->sources[i].name, name, nl) == 0)
                src = i;
        }
        if (src < 0) {
            rc = pl__cfg_err(cfg, PL_ECONFIG, -1, "%s: unknown source '%.*s'", key,
                         (int)(dot - name), name);
            goto fail;
        }
        old_weight = cfg->sources[src].weight;
        rc = pl__key_num(cfg, key, &v, &cfg->sources[src].weight);
    } else {
        rc = pl__key_set(cfg, key, &v);
    }
    if (rc == PL_OK) {
        pl__vlines none = {-1, -1, -1, -1, -1};
        rc = pl__config_validate(cfg, &none);
    }
    if (rc == PL_OK) return PL_OK;
fail:;
    /* Roll back, keeping the message. */
    char msg[PL__ERRMSG_CAP];
    memcpy(msg, cfg->errmsg, sizeof msg);
    if (src >= 0) cfg->sources[src].weight = old_weight;
    *cfg = saved;
    memcpy(cfg->errmsg, msg, sizeof msg);
    return rc;
}

int pl_config_get_int(const pl_config *cfg, const char *key, int64_t *out) {
    if (!cfg || !key || !out) return PL_EINVAL;
    if (pl__key_get_int(cfg, key, out) == PL_OK) return PL_OK; /* the key table */
    /* Derived values, not keys of a config file. */
    int64_t n_img = 0;
    for (int64_t i = 0; i < cfg->n_sources; i++)
        n_img += cfg->sources[i].type == PL_SOURCE_WEBDATASET;
    struct {
        const char *k;
        int64_t v;
    } t[] = {
        {"topology.dp_auto", cfg->topology.dp_auto},
        {"num_warnings", cfg->n_warnings},
        {"num_sources", cfg->n_sources},
        {"world_size", pl_config_world_size(cfg)},
        {"micro_batches_per_rank",
         cfg->global_batch_size / (cfg->topology.dp * cfg->micro_batch_size)},
        {"image_sources", n_img},
    };
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++) {
        if (strcmp(key, t[i].k) == 0) {
            *out = t[i].v;
            return PL_OK;
        }
    }
    return PL_EINVAL;
}

int64_t pl_config_num_warnings(const pl_config *cfg) {
    return cfg ? cfg->n_warnings : 0;
}

const char *pl_config_warning(const pl_config *cfg, int64_t i) {
    if (!cfg || i < 0 || i >= cfg->n_warnings) return NULL;
    return cfg->warnings[i];
}

static int config_set_world_size_impl(pl_config *cfg, int64_t world_size) {
    if (!cfg) return PL_EINVAL;
    const int64_t pp = cfg->topology.pp, cp = cfg->topology.cp,
                  tp = cfg->topology.tp;
    if (world_size < 1)
        return pl__cfg_err(cfg, PL_EINVAL, -1,
                       "world size must be positive, got %" PRId64,
                       world_size);
    /* The config file and the line of `topology` (0: none written, the file only). */
    const int tl = cfg->topology.line;
    if (!cfg->topology.dp_auto) {
        int64_t mine = pl_config_world_size(cfg);
        if (mine == world_size) return PL_OK;
        return pl__cfg_err(cfg, PL_ECONFIG, tl,
                       "topology dp=%" PRId64 " pp=%" PRId64 " cp=%" PRId64
                       " tp=%" PRId64 " has world size %" PRId64
                       ", but the trainer's world size is %" PRId64
                       " (set topology.dp: auto to take dp from it)",
                       cfg->topology.dp, pp, cp, tp, mine, world_size);
    }
    if (world_size % (pp * cp * tp) != 0)
        return pl__cfg_err(cfg, PL_ECONFIG, tl,
                       "topology.dp: auto: the trainer's world size %" PRId64
                       " is not divisible by pp*cp*tp = %" PRId64 "*%" PRId64
                       "*%" PRId64,
                       world_size, pp, cp, tp);
    char value[32];
    pl__fmt(value, sizeof value, "%" PRId64, world_size / (pp * cp * tp));
    int rc = pl_config_set(cfg, "topology.dp", value);
    if (rc != PL_OK) {
        char msg[PL__ERRMSG_CAP];
        pl__fmt(msg, sizeof msg, "%s", cfg->errmsg);
        return pl__cfg_err(cfg, rc, -1,
                       "topology.dp: auto = %s (world size %" PRId64
                       "): %s",
                       value, world_size, msg);
    }
    return PL_OK;
}

int64_t pl_config_num_sources(const pl_config *cfg) {
    return cfg ? cfg->n_sources : 0;
}

const char *pl_config_source_name(const pl_config *cfg, int64_t i) {
    if (!cfg || i < 0 || i >= cfg->n_sources) return NULL;
    return cfg->sources[i].name;
}

const char *pl_config_source_path(const pl_config *cfg, int64_t i) {
    if (!cfg || i < 0 || i >= cfg->n_sources) return NULL;
    return cfg->sources[i].path;
}

/* ------------------------------------------------------------ clone */

pl_config *pl__config_share(const pl_config *cfg) {
    if (!cfg) return NULL;
    if (cfg->frozen) {
        __atomic_fetch_add(&((pl_config *)cfg)->refs, 1, __ATOMIC_RELAXED);
        return (pl_config *)cfg;
    }
    pl_config *c = pl__config_clone(cfg);
    if (c) c->frozen = 1;
    return c;
}

pl_config *pl__config_clone(const pl_config *cfg) {
    if (!cfg) return NULL;
    pl_config *c = pl__calloc(1, sizeof *c);
    if (!c) return NULL;
    *c = *cfg;
    c->frozen = 0;
    c->refs = 0;
    c->origin = NULL;
    c->sources = NULL;
    c->points = NULL;
    c->n_sources = 0;
    c->n_points = 0;
    c->warnings = NULL;
    c->n_warnings = 0;
    for (int part = 0; part < 2; part++) {
        c->eval_sources[part] = NULL;
        c->n_eval_sources[part] = 0;
    }
    for (int part = 0; part < 2; part++) {
        if (!cfg->n_eval_sources[part]) continue;
        c->eval_sources[part] =
            pl__calloc((size_t)cfg->n_eval_sources[part], sizeof(pl__source_cfg));
        if (!c->eval_sources[part]) goto fail;
        for (int64_t i = 0; i < cfg->n_eval_sources[part]; i++) {
            pl__source_cfg *d = &c->eval_sources[part][i];
            *d = cfg->eval_sources[part][i];
            d->name = pl__strdup(d->name);
            d->path = pl__strdup(d->path);
            const pl__source_cfg *o = &cfg->eval_sources[part][i];
            int dx_rc = pl__source_ext_dup(o->x, &d->x);
            c->n_eval_sources[part] = i + 1;
            if (!d->name || !d->path || dx_rc) goto fail;
        }
    }
    c->origin = pl__strdup(cfg->origin ? cfg->origin : "<string>");
    if (pl__tok_cfg_dup(&c->tok, &cfg->tok)) goto fail;
    c->sources = pl__calloc((size_t)cfg->n_sources, sizeof *c->sources);
    c->points = pl__calloc((size_t)cfg->n_points, sizeof *c->points);
    if (!c->origin || !c->sources || !c->points) goto fail;
    for (int64_t i = 0; i < cfg->n_sources; i++) {
        c->sources[i] = cfg->sources[i];
        const pl__source_cfg *o = &cfg->sources[i];
        c->sources[i].name = pl__strdup(o->name);
        c->sources[i].path = pl__strdup(o->path);
        int x_rc = pl__source_ext_dup(o->x, &c->sources[i].x);
        c->n_sources = i + 1;
        if (!c->sources[i].name || !c->sources[i].path || x_rc) goto fail;
    }
    for (int64_t k = 0; k < cfg->n_points; k++) {
        c->points[k].step = cfg->points[k].step;
        c->points[k].weights =
            pl__calloc((size_t)cfg->n_sources, sizeof(double));
        c->n_points = k + 1;
        if (!c->points[k].weights) goto fail;
        memcpy(c->points[k].weights, cfg->points[k].weights,
               (size_t)cfg->n_sources * sizeof(double));
    }
    if (cfg->n_warnings) {
        c->warnings = pl__calloc((size_t)cfg->n_warnings, sizeof *c->warnings);
        if (!c->warnings) goto fail;
        for (int64_t k = 0; k < cfg->n_warnings; k++) {
            c->warnings[k] = pl__strdup(cfg->warnings[k]);
            c->n_warnings = k + 1;
            if (!c->warnings[k]) goto fail;
        }
    }
    return c;
fail:
    pl_config_free(c);
    return NULL;
}

void pl_config_set_tokenizer_factory(pl_config *cfg, pl_tokenizer_factory fn,
                                     void *ctx) {
    if (!cfg) return;
    cfg->tok_factory = fn;
    cfg->tok_factory_spec = NULL;
    cfg->tok_factory_ctx = ctx;
}

void pl_config_set_tokenizer_factory_spec(pl_config *cfg, pl_tokenizer_spec_factory fn,
                                          void *ctx) {
    if (!cfg) return;
    cfg->tok_factory_spec = fn;
    cfg->tok_factory = NULL;
    cfg->tok_factory_ctx = ctx;
}

void pl_config_set_lengths_provider(pl_config *cfg, pl_lengths_fn fn, void *ctx) {
    if (!cfg) return;
    cfg->lengths_fn = fn;
    cfg->lengths_ctx = ctx;
}

uint64_t pl_config_fingerprint(const pl_config *c) {
    if (!c) return 0;
    /* Fields one by one (never the struct: its padding is not data). */
    int64_t ints[] = {(int64_t)c->seed, c->seq_length, c->global_batch_size,
                      c->micro_batch_size, c->train_steps, c->dtype, c->pad_id,
                      c->long_documents, c->packing, c->balance, c->cost.window,
                      c->long_short_threshold, c->on_error, c->topology.dp,
                      c->topology.pp, c->topology.cp, c->topology.tp,
                      c->n_sources, c->has_schedule, c->interpolation, c->n_points};
    uint64_t h = pl__hash64(ints, sizeof ints, 0x706c6366ULL);
    if (c->max_tokens != 0 || c->balance_window != 1) {
        /* Hashed only when set, so configs without them keep their fingerprint
           (and their saved states stay loadable). */
        int64_t vl[2] = {c->max_tokens, c->balance_window};
        h = pl__hash64(vl, sizeof vl, h);
    }
    double cost[3] = {c->cost.a, c->cost.b, c->cost.c};
    h = pl__hash64(cost, sizeof cost, h);
    if (c->cost.enc_a != 0 || c->cost.enc_b != 0) {
        double enc[2] = {c->cost.enc_a, c->cost.enc_b};
        h = pl__hash64(enc, sizeof enc, h);
    }
    h = pl__hash64(c->cost.preset, strlen(c->cost.preset), h);
    h = pl__hash64(c->topology.order, strlen(c->topology.order), h);
    for (int64_t i = 0; i < c->n_sources; i++) {
        const pl__source_cfg *sc = &c->sources[i];
        const pl__source_ext *sx = pl__sx(sc);
        int64_t si[4] = {sc->type, sc->token_dtype, sc->eos_id,
                         sc->max_epochs};
        h = pl__hash64(sc->name, strlen(sc->name) + 1, h);
        h = pl__hash64(sc->path, strlen(sc->path) + 1, h);
        h = pl__hash64(si, sizeof si, h);
        h = pl__hash64(&sc->weight, sizeof sc->weight, h);
        if (sc->type == PL_SOURCE_WEBDATASET) {
            const pl_image_options *io = &sx->image;
            int64_t ii[9] = {io->mode, io->size, io->patch_size, io->merge_size,
                             io->min_pixels, io->max_pixels, io->token_id,
                             io->limit_pixels, io->caption_token_offset};
            h = pl__hash64(ii, sizeof ii, h);
            h = pl__hash64(io->caption_key, strlen(io->caption_key), h);
            if (sx->verify_images) h = pl__hash64("verify", 6, h);
        } else if (pl__is_text_type(sc->type)) {
            int32_t ti[2] = {sx->tok.type, sx->tok.add_eos};
            h = pl__hash64(ti, sizeof ti, h);
            const char *tp = sx->tok.path ? sx->tok.path : "";
            const char *tk = sx->text_key ? sx->text_key : "text";
            h = pl__hash64(tp, strlen(tp) + 1, h);
            h = pl__hash64(tk, strlen(tk) + 1, h);
            if (sx->tok.pat_str)
                h = pl__hash64(sx->tok.pat_str, strlen(sx->tok.pat_str) + 1, h);
            if (sx->tok.encoding)
                h = pl__hash64(sx->tok.encoding, strlen(sx->tok.encoding) + 1, h);
            if (sx->messages_key) {
                h = pl__hash64(sx->messages_key, strlen(sx->messages_key) + 1, h);
                for (int q = 0; q < 3; q++)
                    if (sx->chat[q]) h = pl__hash64(sx->chat[q], strlen(sx->chat[q]) + 1, h);
            }
            if (sx->prompt_key && sx->response_key) {
                h = pl__hash64(sx->prompt_key, strlen(sx->prompt_key) + 1, h);
                h = pl__hash64(sx->response_key, strlen(sx->response_key) + 1, h);
            }
        }
    }
    for (int64_t k = 0; k < c->n_points; k++) {
        h = pl__hash64(&c->points[k].step, sizeof(int64_t), h);
        h = pl__hash64(c->points[k].weights, (size_t)c->n_sources * sizeof(double), h);
    }
    return h;
}

/* ------------------------------------------------ per-thread messages */

int pl_config_set(pl_config *cfg, const char *key, const char *value) {
    int rc = config_set_impl(cfg, key, value);
    if (rc < 0) pl__thread_err(pl_config_errmsg(cfg));
    return rc;
}

int pl_config_set_world_size(pl_config *cfg, int64_t world_size) {
    int rc = config_set_world_size_impl(cfg, world_size);
    if (rc < 0) pl__thread_err(pl_config_errmsg(cfg));
    return rc;
}
