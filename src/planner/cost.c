/*
 * cost.c -- the cost model of SPEC section 5: the estimated compute of a
 * sequence from metadata only,
 *     cost = a * tokens + b * sum over its chunks of attn(len) + c,
 * where attn(len) = len^2 for causal attention within a document and
 * len * min(len, window) for sliding-window attention.  The presets belong
 * to the key table (config/keys.c).  pl_cost_fit fits a, b, c to measured step times by ordinary
 * least squares (the calibrate command): the columns are scaled to unit
 * largest magnitude, the 3x3 normal equations are formed and solved in long
 * double by Gaussian elimination with partial pivoting, and a pivot below a
 * relative tolerance means the columns are linearly dependent (PL_EINVAL).
 */
#include "planner/planner.h"

#include <math.h>

static inline double attn_term(const pl_config *cfg, int64_t len) {
    double l = (double)len;
    if (cfg->cost.window > 0 && len > cfg->cost.window)
        return l * (double)cfg->cost.window;
    return l * l;
}

double pl__chunk_cost(const pl_config *cfg, int64_t len) {
    return cfg->cost.a * (double)len + cfg->cost.b * attn_term(cfg, len) +
           cfg->cost.c;
}

double pl__sequence_cost(const pl_config *cfg, const pl_chunk *c, int64_t n) {
    double tokens = 0, attn = 0;
    for (int64_t i = 0; i < n; i++) {
        tokens += (double)c[i].length;
        attn += attn_term(cfg, c[i].length);
    }
    return cfg->cost.a * tokens + cfg->cost.b * attn + cfg->cost.c;
}

int pl__has_encoder_cost(const pl_planner *p) {
    const pl_config *c = p->cfg;
    if (c->cost.enc_a == 0 && c->cost.enc_b == 0) return 0;
    for (int64_t i = 0; i < c->n_sources; i++)
        if (c->sources[i].type == PL_SOURCE_WEBDATASET) return 1;
    return 0;
}

/*
 * Encoder term of the hybrid cost (docs/internals/design.md, "Cost and
 * balancing"): a_e * N + b_e * N^2 for the image of a chunk that holds its
 * sample's placeholder run (offset 0), N its patches (the encoder's
 * sequence, before merging).  N comes from the source's index
 * (pl__source_image_info): no pixel is read.
 */
double pl__chunk_encoder_cost(const pl_planner *p, const pl_chunk *ch) {
    const pl_config *c = p->cfg;
    if ((c->cost.enc_a == 0 && c->cost.enc_b == 0) || ch->offset != 0 ||
        c->sources[ch->source].type != PL_SOURCE_WEBDATASET)
        return 0;
    pl_image_info in;
    char err[PL__ERRMSG_CAP];
    if (pl__source_image_info(p->sources[ch->source], ch->index, &in, err, sizeof err))
        return 0; /* the length lookup reported it when the chunk was drawn */
    const double N = (double)in.patches;
    return c->cost.enc_a * N + c->cost.enc_b * N * N;
}

double pl_cost_sequence(const pl_config *cfg, const int64_t *doc_lengths,
                        int64_t n) {
    if (!cfg || n < 0 || (n > 0 && !doc_lengths)) return NAN;
    double tokens = 0, attn = 0;
    for (int64_t i = 0; i < n; i++) {
        tokens += (double)doc_lengths[i];
        attn += attn_term(cfg, doc_lengths[i]);
    }
    return cfg->cost.a * tokens + cfg->cost.b * attn + cfg->cost.c;
}

int pl_cost_fit(const double *tokens, const double *sum_sq, const double *time,
                int64_t n, double *a, double *b, double *c, double *r2) {
    if (!tokens || !sum_sq || !time || n < 3) return PL_EINVAL;
    /* Column scales: the largest magnitude of each column (1 if all zero). */
    long double scale[3] = {0, 0, 1};
    for (int64_t i = 0; i < n; i++) {
        if (!isfinite(tokens[i]) || !isfinite(sum_sq[i]) || !isfinite(time[i]))
            return PL_EINVAL;
        long double x0 = fabsl((long double)tokens[i]);
        long double x1 = fabsl((long double)sum_sq[i]);
        if (x0 > scale[0]) scale[0] = x0;
        if (x1 > scale[1]) scale[1] = x1;
    }
    if (scale[0] == 0 || scale[1] == 0) return PL_EINVAL; /* a zero column */
    /* Normal equations M x = v over the scaled columns, augmented: m[r][3]. */
    long double m[3][4] = {{0}};
    for (int64_t i = 0; i < n; i++) {
        long double x[3] = {(long double)tokens[i] / scale[0],
                            (long double)sum_sq[i] / scale[1], 1.0L};
        for (int r = 0; r < 3; r++) {
            for (int k = 0; k < 3; k++) m[r][k] += x[r] * x[k];
            m[r][3] += x[r] * (long double)time[i];
        }
    }
    long double maxdiag = 0;
    for (int r = 0; r < 3; r++)
        if (m[r][r] > maxdiag) maxdiag = m[r][r];
    const long double tol = 1e-13L * maxdiag;
    for (int col = 0; col < 3; col++) {
        int piv = col;
        for (int r = col + 1; r < 3; r++)
            if (fabsl(m[r][col]) > fabsl(m[piv][col])) piv = r;
        if (!(fabsl(m[piv][col]) > tol)) return PL_EINVAL; /* singular */
        if (piv != col)
            for (int k = 0; k < 4; k++) {
                long double t = m[col][k];
                m[col][k] = m[piv][k];
                m[piv][k] = t;
            }
        for (int r = col + 1; r < 3; r++) {
            long double f = m[r][col] / m[col][col];
            for (int k = col; k < 4; k++) m[r][k] -= f * m[col][k];
        }
    }
    long double x[3];
    for (int r = 2; r >= 0; r--) {
        long double s = m[r][3];
        for (int k = r + 1; k < 3; k++) s -= m[r][k] * x[k];
        x[r] = s / m[r][r];
    }
    const long double fa = x[0] / scale[0], fb = x[1] / scale[1], fc = x[2];
    /* Coefficient of determination. */
    long double mean = 0, ss_tot = 0, ss_res = 0;
    for (int64_t i = 0; i < n; i++) mean += (long double)time[i];
    mean /= (long double)n;
    for (int64_t i = 0; i < n; i++) {
        long double t = (long double)time[i];
        long double e = t - (fa * (long double)tokens[i] +
                             fb * (long double)sum_sq[i] + fc);
        ss_tot += (t - mean) * (t - mean);
        ss_res += e * e;
    }
    double fit_r2;
    if (ss_tot > 0)
        fit_r2 = (double)(1.0L - ss_res / ss_tot);
    else /* every time equal: exact if the residual vanishes */
        fit_r2 = ss_res <= 1e-24L * (mean * mean + 1.0L) ? 1.0 : 0.0;
    if (!isfinite((double)fa) || !isfinite((double)fb) || !isfinite((double)fc))
        return PL_EINVAL;
    if (a) *a = (double)fa;
    if (b) *b = (double)fb;
    if (c) *c = (double)fc;
    if (r2) *r2 = fit_r2;
    return PL_OK;
}
