/*
 * config/schedule.c -- the mixture's weights at a step: the sources'
 * weights, or a schedule's points (schedule.points, read in yaml.c)
 * interpolated linearly between points or held from the last one
 * (schedule.interpolation: step).  Weights are normalized here; a config
 * keeps them raw.
 */
#include "config/config.h"

#include <stdlib.h>

double pl__source_weight_sum(const pl_config *cfg) {
    double s = 0;
    for (int64_t i = 0; i < cfg->n_sources; i++) s += cfg->sources[i].weight;
    return s;
}


static double point_sum(const pl_config *cfg, int64_t k) {
    double s = 0;
    for (int64_t i = 0; i < cfg->n_sources; i++) s += cfg->points[k].weights[i];
    return s;
}

void pl__config_weights(const pl_config *cfg, int64_t step, double *w) {
    const int64_t n = cfg->n_sources;
    if (!cfg->has_schedule || cfg->n_points == 0) {
        double s = pl__source_weight_sum(cfg);
        for (int64_t i = 0; i < n; i++)
            w[i] = s > 0 ? cfg->sources[i].weight / s : 0.0;
        return;
    }
    /* k: the last point with step <= `step` (0 before the first). */
    int64_t k = 0;
    while (k + 1 < cfg->n_points && cfg->points[k + 1].step <= step) k++;
    const pl__sched_point *p0 = &cfg->points[k];
    double s0 = point_sum(cfg, k);
    int interp = cfg->interpolation == PL__INTERP_LINEAR &&
                 k + 1 < cfg->n_points && step > p0->step;
    if (!interp) {
        for (int64_t i = 0; i < n; i++) w[i] = p0->weights[i] / s0;
        return;
    }
    const pl__sched_point *p1 = &cfg->points[k + 1];
    double s1 = point_sum(cfg, k + 1);
    double t = (double)(step - p0->step) / (double)(p1->step - p0->step);
    double total = 0;
    for (int64_t i = 0; i < n; i++) {
        w[i] = (1.0 - t) * (p0->weights[i] / s0) + t * (p1->weights[i] / s1);
        total += w[i];
    }
    for (int64_t i = 0; i < n; i++) w[i] /= total;
}

double pl_config_source_weight(const pl_config *cfg, int64_t i, int64_t step) {
    if (!cfg || i < 0 || i >= cfg->n_sources) return 0.0;
    double small[16];
    double *w = small;
    if (cfg->n_sources > 16) {
        w = pl__malloc((size_t)cfg->n_sources * sizeof *w);
        if (!w) return 0.0;
    }
    pl__config_weights(cfg, step, w);
    double r = w[i];
    if (w != small) free(w);
    return r;
}
