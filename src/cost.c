/*
 * cost.c -- the cost model of SPEC section 5: the estimated compute of a
 * sequence from metadata only,
 *     cost = a * tokens + b * sum over its chunks of attn(len) + c,
 * where attn(len) = len^2 for causal attention within a document and
 * len * min(len, window) for sliding-window attention.  The presets and the
 * fitting of a, b, c belong to config.c and the calibrate command.
 */
#include "planner_internal.h"

static inline double pl__attn(const pl_config *cfg, int64_t len) {
    double l = (double)len;
    if (cfg->cost.window > 0 && len > cfg->cost.window)
        return l * (double)cfg->cost.window;
    return l * l;
}

double pl__chunk_cost(const pl_config *cfg, int64_t len) {
    return cfg->cost.a * (double)len + cfg->cost.b * pl__attn(cfg, len) +
           cfg->cost.c;
}

double pl__sequence_cost(const pl_config *cfg, const pl_chunk *c, int64_t n) {
    double tokens = 0, attn = 0;
    for (int64_t i = 0; i < n; i++) {
        tokens += (double)c[i].length;
        attn += pl__attn(cfg, c[i].length);
    }
    return cfg->cost.a * tokens + cfg->cost.b * attn + cfg->cost.c;
}
