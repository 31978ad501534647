/*
 * corpus.h -- a small multi-source corpus for planner and loader tests.
 * Every source is a Megatron int32 dataset whose token k is
 * SOURCE_BASE * (source + 1) + k, so any token names its source and position.
 */
#ifndef PL_CORPUS_H
#define PL_CORPUS_H

#include "fixtures.h"
#include "testutil.h"

#define SOURCE_BASE 100000000LL
#define NSRC 3

typedef struct corpus {
    char dir[256];
    int64_t n[NSRC];
    int64_t *len[NSRC];
    int64_t *start[NSRC]; /* token offset of each document in its file */
} corpus;

/* Lengths: a mix of short documents and some longer than seq_length. */
static inline void corpus_make(corpus *c, int64_t seq_length) {
    snprintf(c->dir, sizeof c->dir, "%s", pl_test_tmpdir());
    const int64_t ns[NSRC] = {97, 61, 150};
    uint64_t x = 88172645463325252ULL;
    for (int s = 0; s < NSRC; s++) {
        c->n[s] = ns[s];
        c->len[s] = calloc((size_t)ns[s], sizeof(int64_t));
        c->start[s] = calloc((size_t)ns[s] + 1, sizeof(int64_t));
        for (int64_t i = 0; i < ns[s]; i++) {
            x ^= x << 13; x ^= x >> 7; x ^= x << 17;
            int64_t L = 1 + (int64_t)(x % (uint64_t)(seq_length / 2));
            if (x % 13 == 0) L = seq_length + (int64_t)(x % (uint64_t)(3 * seq_length));
            if (s == 1) L = 1 + L / 4; /* a source of short documents */
            c->len[s][i] = L;
            c->start[s][i + 1] = c->start[s][i] + L;
        }
        char prefix[512];
        snprintf(prefix, sizeof prefix, "%s/src%d", c->dir, s);
        if (plf_write_megatron(prefix, PL_DTYPE_INT32, ns[s], c->len[s],
                               SOURCE_BASE * (s + 1)) != 0) {
            fprintf(stderr, "cannot write fixture %s\n", prefix);
            exit(2);
        }
    }
}

static inline int64_t corpus_token(const corpus *c, int s, int64_t index,
                                   int64_t offset) {
    return SOURCE_BASE * (s + 1) + c->start[s][index] + offset;
}

/* A config over the corpus; extra is appended to the top level. */
static inline pl_config *corpus_config(const corpus *c, const char *extra,
                                       const char *weights[NSRC]) {
    char y[4096];
    int n = snprintf(y, sizeof y, "%s\nsources:\n", extra);
    for (int s = 0; s < NSRC; s++)
        n += snprintf(y + n, sizeof y - (size_t)n,
                      "  - {name: s%d, type: megatron, path: %s/src%d, weight: %s}\n",
                      s, c->dir, s, weights ? weights[s] : (s == 0 ? "0.5" : s == 1 ? "0.3" : "0.2"));
    pl_config *cfg = NULL;
    int rc = pl_config_parse_string(y, strlen(y), "test", &cfg);
    if (rc) {
        fprintf(stderr, "config error: %s\n%s\n", pl_config_errmsg(cfg), y);
        exit(2);
    }
    return cfg;
}

static inline void corpus_free(corpus *c) {
    for (int s = 0; s < NSRC; s++) {
        free(c->len[s]);
        free(c->start[s]);
    }
}

#endif
