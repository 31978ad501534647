/*
 * config/split.c -- validation and test data: `split` fractions (as
 * megatron-core's --split), the document range of each part, and
 * pl_config_split, the config of one evaluation pass (valid_sources and
 * test_sources as megatron-core's blend_per_split).
 */
#include "config/config.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/*
 * "969,30,1" (Megatron's --split): up to three non-negative numbers, any
 * separators, normalized to fractions of train, valid, test (missing ones 0),
 * as megatron-core's parse_and_normalize_split.
 */
int pl__split_parse(pl_config *cfg, const char *key, const pl__sval *v,
                       double *out) {
    double x[3] = {0, 0, 0};
    int n = 0;
    const char *q = v->s;
    while (*q) {
        if (!((*q >= '0' && *q <= '9') || *q == '.')) {
            if (*q == '-')
                return pl__cfg_err(cfg, PL_ECONFIG, v->line,
                               "%s: '%s' has a negative part", key, v->s);
            q++;
            continue;
        }
        char *end = NULL;
        double d = strtod(q, &end);
        if (end == q || !isfinite(d))
            return pl__cfg_err(cfg, PL_ECONFIG, v->line,
                           "%s: '%s' is not a list of numbers such as 969,30,1",
                           key, v->s);
        if (n == 3)
            return pl__cfg_err(cfg, PL_ECONFIG, v->line,
                           "%s: '%s' has more than three parts (train, valid, "
                           "test)",
                           key, v->s);
        x[n++] = d;
        q = end;
    }
    double sum = x[0] + x[1] + x[2];
    if (n == 0 || !(sum > 0))
        return pl__cfg_err(cfg, PL_ECONFIG, v->line,
                           "%s: '%s' needs a positive part, such as 969,30,1", key,
                           v->s);
    for (int k = 0; k < 3; k++) out[k] = x[k] / sum;
    return PL_OK;
}

void pl__split_range(const double *split, int part, int64_t n, int64_t *lo,
                     int64_t *hi) {
    /* megatron-core: bookends [0, a, a+b, a+b+c]; beg = round(lo * n),
       end = round(hi * n) with Python's round (half to even). */
    double cum[4];
    cum[0] = 0;
    for (int k = 0; k < 3; k++) cum[k + 1] = cum[k] + split[k];
    double dn = (double)n;
    int64_t a = (int64_t)nearbyint(cum[part] * dn);
    int64_t b = (int64_t)nearbyint(cum[part + 1] * dn);
    if (a < 0) a = 0;
    if (b > n) b = n;
    if (b < a) b = a;
    *lo = a;
    *hi = b;
}

const double *pl__source_split(const pl_config *cfg, int64_t i) {
    static const double all_train[3] = {1, 0, 0};
    if (cfg->sources[i].has_split) return cfg->sources[i].split;
    if (cfg->has_split) return cfg->split;
    return all_train;
}

int pl_config_split(const pl_config *cfg, int split, pl_config **out) {
    if (!out) return PL_EINVAL;
    *out = NULL;
    if (!cfg || (split != PL_SPLIT_VALID && split != PL_SPLIT_TEST) || cfg->eval)
        return PL_EINVAL;
    const int part = split, e = split - 1;
    const char *what = split == PL_SPLIT_VALID ? "validation" : "test";
    pl_config *c = pl__config_clone(cfg);
    if (!c) return PL_ENOMEM;
    *out = c;
    for (int64_t k = 0; k < c->n_warnings; k++) free(c->warnings[k]);
    free(c->warnings);
    c->warnings = NULL;
    c->n_warnings = 0;
    /* The pass's weights: a source's weight, or under a schedule its largest
       weight at any point (every source the schedule uses is evaluated). */
    int64_t n = c->n_sources;
    double *w = pl__calloc((size_t)(n ? n : 1), sizeof *w);
    if (!w) return pl__cfg_err(c, PL_ENOMEM, 0, "out of memory");
    for (int64_t i = 0; i < n; i++) {
        w[i] = c->has_schedule ? 0 : c->sources[i].weight;
        for (int64_t k = 0; k < c->n_points; k++)
            if (c->points[k].weights[i] > w[i]) w[i] = c->points[k].weights[i];
    }
    for (int64_t k = 0; k < c->n_points; k++) free(c->points[k].weights);
    free(c->points);
    c->points = NULL;
    c->n_points = 0;
    c->has_schedule = 0;
    if (c->n_eval_sources[e]) { /* blend_per_split: these sources, whole */
        for (int64_t i = 0; i < c->n_sources; i++) {
            free(c->sources[i].name);
            free(c->sources[i].path);
            pl__source_ext_free(c->sources[i].x);
        }
        free(c->sources);
        c->sources = c->eval_sources[e];
        c->n_sources = c->n_eval_sources[e];
        c->eval_sources[e] = NULL;
        c->n_eval_sources[e] = 0;
        for (int64_t i = 0; i < c->n_sources; i++) {
            pl__source_cfg *s = &c->sources[i];
            s->split[0] = s->split[1] = s->split[2] = 0;
            s->split[part] = 1;
            s->has_split = 1;
        }
    } else {
        int any = 0;
        for (int64_t i = 0; i < n; i++) {
            pl__source_cfg *s = &c->sources[i];
            const double *f = pl__source_split(c, i);
            double frac = f[part];
            memcpy(s->split, f, sizeof s->split);
            s->has_split = 1;
            s->weight = frac > 0 ? w[i] : 0;
            any |= s->weight > 0;
        }
        if (!any) {
            free(w);
            return pl__cfg_err(c, PL_ECONFIG, 0,
                           "the config has no %s data: give `split` (such as "
                           "969,30,1, as Megatron's --split) or %s",
                           what, split == PL_SPLIT_VALID ? "valid_sources" : "test_sources");
        }
    }
    free(w);
    for (int part2 = 0; part2 < 2; part2++) { /* the other list is not needed */
        for (int64_t i = 0; i < c->n_eval_sources[part2]; i++) {
            free(c->eval_sources[part2][i].name);
            free(c->eval_sources[part2][i].path);
        }
        free(c->eval_sources[part2]);
        c->eval_sources[part2] = NULL;
        c->n_eval_sources[part2] = 0;
    }
    for (int64_t i = 0; i < c->n_sources; i++) c->sources[i].max_epochs = 1;
    c->split_part = part;
    c->eval = 1;
    c->train_steps = -1;
    c->errmsg[0] = '\0';
    return PL_OK;
}
