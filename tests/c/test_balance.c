/*
 * Balancing (balance: greedy | karmarkar_karp | variable_length):
 *  - never changes a step's membership, drops or duplicates a chunk;
 *  - every DP rank gets exactly global_batch_size/dp sequences, each of at
 *    most seq_length tokens (variable_length: global_batch_size /
 *    (dp * micro_batch_size) rows of at most max_tokens); rank_cost matches
 *    the sequences' costs;
 *  - the reported lower bound is never above the achieved maximum;
 *  - over many steps the largest rank cost is below round-robin's;
 *  - long_short: documents above the threshold sit alone in a sequence.
 */
#include "corpus.h"
#include "planner/planner.h"

#define STEPS 25

typedef struct run {
    uint64_t membership[STEPS];
    double max_cost[STEPS];
} run;

static void plan_run(corpus *c, const char *extra, run *out, int check_long) {
    pl_config *cfg = corpus_config(c, extra, NULL);
    pl_source *src[NSRC];
    for (int s = 0; s < NSRC; s++) CHECK_OK(pl__config_open_source(cfg, s, &src[s]));
    pl_planner *p = NULL;
    CHECK_OK(pl_planner_create(cfg, src, NSRC, &p));
    const int64_t dp = cfg->topology.dp;
    for (int step = 0; step < STEPS; step++) {
        pl_plan *pl = NULL;
        CHECK_OK(pl_planner_next(p, &pl));
        if (!pl) break;
        const int64_t G = pl->n_sequences, S = pl->seq_length;
        CHECK_EQ_I64(G, pl->dp * pl->micro_batches_per_rank * pl->micro_batch_size);
        uint64_t h = 0;
        for (int64_t j = 0; j < pl->n_chunks; j++)
            h += pl__hash64(&pl->chunks[j], sizeof(pl_chunk), 7);
        out->membership[step] = h;
        unsigned char *seen = calloc((size_t)G, 1);
        double mx = 0;
        for (int64_t r = 0; r < dp; r++) {
            double sum = 0;
            for (int64_t j = 0; j < G / dp; j++) {
                int64_t q = pl->rank_sequences[r * (G / dp) + j];
                CHECK(q >= 0 && q < G);
                if (q < 0 || q >= G) continue;
                CHECK(!seen[q]);
                seen[q] = 1;
                sum += pl->seq_cost[q];
                CHECK(pl->seq_tokens[q] <= S);
                double want = pl__sequence_cost(cfg, pl->chunks + pl->seq_offsets[q],
                                                pl->seq_offsets[q + 1] - pl->seq_offsets[q]);
                CHECK(want == pl->seq_cost[q]);
            }
            CHECK(sum <= pl->rank_cost[r] * (1 + 1e-12) && sum >= pl->rank_cost[r] * (1 - 1e-12));
            if (sum > mx) mx = sum;
        }
        free(seen);
        CHECK(pl->lower_bound <= mx * (1 + 1e-12));
        out->max_cost[step] = mx;
        if (check_long) {
            for (int64_t q = 0; q < G; q++)
                for (int64_t j = pl->seq_offsets[q]; j < pl->seq_offsets[q + 1]; j++)
                    if (pl->chunks[j].length > cfg->long_short_threshold)
                        CHECK_EQ_I64(pl->seq_offsets[q + 1] - pl->seq_offsets[q], 1);
        }
        pl_plan_free(pl);
    }
    pl_planner_free(p);
    for (int s = 0; s < NSRC; s++) pl_source_free(src[s]);
    pl_config_free(cfg);
}


/* The loader under `extra` over steps [0, steps): per step, an
 * order-free hash of its segments (first token, length) over all DP ranks,
 * its tokens and loss tokens; a mid-step state is saved at (1, 1) and a
 * second loader resumed from it must give the same batches after it. */
#define LSTEPS 3
typedef struct lrun {
    uint64_t seg[LSTEPS];
    int64_t tokens[LSTEPS], loss[LSTEPS], rank_tokens[LSTEPS][8];
    int64_t rank_loss[LSTEPS][8], said_step[LSTEPS], said_rank[LSTEPS][8];
    int64_t rows, cols;
} lrun;

static uint64_t batch_digest(const pl_batch *b) {
    size_t n = (size_t)(b->rows * b->cols);
    uint64_t h = pl__hash64(b->input_ids, n * 8, 1);
    h = pl__hash64(b->loss_mask, n * sizeof(float), h);
    return pl__hash64(b->cu_seqlens, (size_t)b->n_cu_seqlens * 4, h);
}

static void loader_run(corpus *c, const char *extra, lrun *o) {
    pl_config *cfg = corpus_config(c, extra, NULL);
    const int64_t dp = cfg->topology.dp;
    const int64_t nmb = cfg->global_batch_size / (dp * cfg->micro_batch_size);
    pl_loader *l = NULL, *l2 = NULL;
    CHECK_OK(pl_loader_create(cfg, NULL, &l));
    memset(o, 0, sizeof *o);
    void *st = NULL;
    size_t stlen = 0;
    uint64_t after[64];
    int na = 0;
    for (int64_t step = 0; step < LSTEPS; step++)
        for (int64_t mb = 0; mb < nmb; mb++) {
            if (step == 1 && mb == 1) {
                CHECK_OK(pl_loader_get_state(l, NULL, 0, &stlen));
                st = malloc(stlen);
                CHECK_OK(pl_loader_get_state(l, st, stlen, &stlen));
            }
            for (int64_t r = 0; r < dp; r++) {
                const pl_batch *b = NULL;
                CHECK_OK(pl_loader_next(l, r, &b));
                if (!b) return;
                o->rows = b->rows;
                o->cols = b->cols;
                const int64_t *ids = b->input_ids;
                for (int64_t k = 0; k + 1 < b->n_cu_seqlens; k++) {
                    if (b->segment_sources[k] < 0) continue;
                    int64_t at = b->cu_seqlens[k], len = b->cu_seqlens[k + 1] - at;
                    int64_t key[2] = {ids[at], len};
                    o->seg[step] += pl__hash64(key, sizeof key, 3);
                }
                for (int64_t t = 0; t < b->rows * b->cols; t++) {
                    o->loss[step] += b->loss_mask[t] != 0;
                    if (r < 8) o->rank_loss[step][r] += b->loss_mask[t] != 0;
                }
                o->said_step[step] = b->step_loss_tokens;
                if (r < 8) o->said_rank[step][r] = b->rank_loss_tokens;
                o->tokens[step] += b->tokens;
                if (r < 8) o->rank_tokens[step][r] += b->tokens;
                if ((step > 1 || (step == 1 && mb >= 1)) && na < 64)
                    after[na++] = batch_digest(b);
            }
        }
    for (int64_t step = 0; step < LSTEPS; step++) { /* the batches' counts */
        CHECK_EQ_I64(o->said_step[step], o->loss[step]);
        for (int64_t r = 0; r < dp && r < 8; r++)
            CHECK_EQ_I64(o->said_rank[step][r], o->rank_loss[step][r]);
    }
    CHECK_OK(pl_loader_create(cfg, NULL, &l2));
    CHECK_OK(pl_loader_set_state(l2, st, stlen));
    for (int i = 0; i < na; i++) {
        const pl_batch *b = NULL;
        CHECK_OK(pl_loader_next(l2, i % dp, &b));
        if (b) CHECK(batch_digest(b) == after[i]);
    }
    free(st);
    pl_loader_free(l);
    pl_loader_free(l2);
    pl_config_free(cfg);
}

/* An order-free hash of a plan's chunks (its membership), and a hash of
 * the whole plan (chunks in order and the arrangement). */
static uint64_t members_hash(const pl_plan *pl) {
    uint64_t h = 0;
    for (int64_t j = 0; j < pl->n_chunks; j++) h += pl__hash64(&pl->chunks[j], sizeof(pl_chunk), 7);
    return h;
}
static uint64_t plan_hash(const pl_plan *pl) {
    uint64_t h = pl__hash64(pl->chunks, (size_t)pl->n_chunks * sizeof(pl_chunk), 1);
    h = pl__hash64(pl->seq_offsets, (size_t)(pl->n_sequences + 1) * 8, h);
    return pl__hash64(pl->rank_sequences, (size_t)pl->n_sequences * 8, h);
}

/* balance_window: membership exact over each window, the sum of step costs
 * lower, every step's state resumes to the same plan (any dp for the
 * membership), a mixture change inside a window refused. */
#define WSTEPS 8
static void window_checks(corpus *c) {
    const char *base = "seq_length: 256\nglobal_batch_size: 8\nmicro_batch_size: 1\n"
                       "topology: {dp: 8}\ncost: {preset: causal, a: 64}\n";
    char e1[512], e4[512], e4dp[512];
    snprintf(e1, sizeof e1, "%sbalance: karmarkar_karp\n", base);
    snprintf(e4, sizeof e4, "%sbalance: karmarkar_karp\nbalance_window: 4\n", base);
    snprintf(e4dp, sizeof e4dp,
             "seq_length: 256\nglobal_batch_size: 8\nmicro_batch_size: 1\n"
             "topology: {dp: 2}\ncost: {preset: causal, a: 64}\n"
             "balance: karmarkar_karp\nbalance_window: 4\n");
    pl_config *cfg1 = corpus_config(c, e1, NULL), *cfg4 = corpus_config(c, e4, NULL);
    pl_config *cfg4dp = corpus_config(c, e4dp, NULL);
    pl_source *src[NSRC];
    for (int s = 0; s < NSRC; s++) CHECK_OK(pl__config_open_source(cfg1, s, &src[s]));
    pl_planner *p1 = NULL, *p4 = NULL;
    CHECK_OK(pl_planner_create(cfg1, src, NSRC, &p1));
    CHECK_OK(pl_planner_create(cfg4, src, NSRC, &p4));
    uint64_t m1[WSTEPS], m4[WSTEPS], h4[WSTEPS];
    double sum1 = 0, sum4 = 0;
    void *blob[WSTEPS];
    size_t blen[WSTEPS];
    for (int s = 0; s < WSTEPS; s++) {
        pl_plan *a = NULL, *b = NULL;
        CHECK_OK(pl_planner_get_state(p4, NULL, 0, &blen[s]));
        blob[s] = malloc(blen[s]);
        CHECK_OK(pl_planner_get_state(p4, blob[s], blen[s], &blen[s]));
        pl_state_info si;
        CHECK_OK(pl_state_inspect(blob[s], blen[s], &si));
        CHECK_EQ_I64(si.step, s);
        CHECK_EQ_I64(si.version, s % 4 ? 4 : 3);
        CHECK_OK(pl_planner_next(p1, &a));
        CHECK_OK(pl_planner_next(p4, &b));
        CHECK_EQ_I64(b->step, s);
        CHECK_EQ_I64(b->n_sequences, 8);
        m1[s] = members_hash(a);
        m4[s] = members_hash(b);
        h4[s] = plan_hash(b);
        double x1 = 0, x4 = 0;
        for (int r = 0; r < 8; r++) {
            if (a->rank_cost[r] > x1) x1 = a->rank_cost[r];
            if (b->rank_cost[r] > x4) x4 = b->rank_cost[r];
        }
        sum1 += x1;
        sum4 += x4;
        pl_plan_free(a);
        pl_plan_free(b);
    }
    int differs = 0;
    for (int w = 0; w < WSTEPS / 4; w++) {
        uint64_t s1 = 0, s4 = 0;
        for (int s = 4 * w; s < 4 * w + 4; s++) {
            s1 += m1[s];
            s4 += m4[s];
            differs |= m1[s] != m4[s];
        }
        CHECK(s1 == s4); /* the window holds the same chunks */
    }
    CHECK(differs);      /* but its steps do not */
    fprintf(stderr, "window 4, 1 sequence per rank: sum of step costs %.4g -> %.4g\n", sum1, sum4);
    CHECK(sum4 < sum1);
    /* Resume at every step, inside windows too: the same plan; another dp
       keeps the step's membership. */
    for (int s = 0; s < WSTEPS; s++) {
        pl_planner *q = NULL, *qd = NULL;
        CHECK_OK(pl_planner_create(cfg4, src, NSRC, &q));
        CHECK_OK(pl_planner_set_state(q, blob[s], blen[s]));
        CHECK_OK(pl_planner_create(cfg4dp, src, NSRC, &qd));
        CHECK_OK(pl_planner_set_state(qd, blob[s], blen[s]));
        for (int t = s; t < WSTEPS; t++) {
            pl_plan *x = NULL, *y = NULL;
            CHECK_OK(pl_planner_next(q, &x));
            CHECK_OK(pl_planner_next(qd, &y));
            CHECK_EQ_I64(x->step, t);
            CHECK(plan_hash(x) == h4[t]);
            CHECK(members_hash(y) == m4[t]);
            /* a state taken now, loaded again, plans the next step the same */
            pl_plan_free(x);
            pl_plan_free(y);
        }
        pl_planner_free(q);
        pl_planner_free(qd);
    }
    /* Inside a window: another mixture or window is refused, with a message. */
    {
        const char *w2[NSRC] = {"0.2", "0.3", "0.5"};
        pl_config *mix = corpus_config(c, e4, w2);
        pl_planner *q = NULL;
        CHECK_OK(pl_planner_create(mix, src, NSRC, &q));
        CHECK_EQ_I64(pl_planner_set_state(q, blob[1], blen[1]), PL_ESTATE);
        CHECK(strstr(pl_planner_errmsg(q), "window boundary") != NULL);
        CHECK_OK(pl_planner_set_state(q, blob[4], blen[4])); /* a boundary: fine */
        pl_planner_free(q);
        pl_config_free(mix);
        CHECK_OK(pl_planner_create(cfg1, src, NSRC, &q));
        CHECK_EQ_I64(pl_planner_set_state(q, blob[2], blen[2]), PL_ESTATE);
        pl_planner_free(q);
    }
    for (int s = 0; s < WSTEPS; s++) free(blob[s]);
    pl_planner_free(p1);
    pl_planner_free(p4);
    for (int s = 0; s < NSRC; s++) pl_source_free(src[s]);
    pl_config_free(cfg1);
    pl_config_free(cfg4);
    pl_config_free(cfg4dp);
}

int main(void) {
    corpus c;
    corpus_make(&c, 256);
    const char *base = "seq_length: 256\nglobal_batch_size: 32\nmicro_batch_size: 2\n"
                       "topology: {dp: 4}\ncost: {preset: causal, a: 64}\n";
    enum { NM = 4 };
    const char *modes[NM] = {"none", "greedy", "karmarkar_karp", "variable_length"};
    run runs[NM];
    for (int m = 0; m < NM; m++) {
        char extra[512];
        snprintf(extra, sizeof extra, "%sbalance: %s\n", base, modes[m]);
        plan_run(&c, extra, &runs[m], 0);
    }
    double tot[NM] = {0, 0, 0, 0};
    for (int step = 0; step < STEPS; step++)
        for (int m = 0; m < NM; m++) {
            CHECK(runs[m].membership[step] == runs[0].membership[step]);
            tot[m] += runs[m].max_cost[step];
        }
    fprintf(stderr, "sum of max rank cost: none %.4g greedy %.4g kk %.4g vlen %.4g\n",
            tot[0], tot[1], tot[2], tot[3]);
    CHECK(tot[1] < tot[0]);
    CHECK(tot[2] < tot[0]);
    CHECK(tot[3] < tot[2]);
    /* long_short with each balancer */
    for (int m = 0; m < NM; m++) {
        char extra[512];
        snprintf(extra, sizeof extra, "%sbalance: %s\nlong_short: {threshold: 200}\n", base, modes[m]);
        run r;
        plan_run(&c, extra, &r, m < 3);
    }
    /* dp = 1 and dp = global_batch_size (one sequence per rank) */
    run r1;
    plan_run(&c, "seq_length: 256\nglobal_batch_size: 8\nmicro_batch_size: 1\n"
                 "topology: {dp: 8}\nbalance: karmarkar_karp\ncost: {preset: causal}\n", &r1, 0);
    plan_run(&c, "seq_length: 256\nglobal_batch_size: 8\nmicro_batch_size: 4\n"
                 "topology: {dp: 1}\nbalance: greedy\n", &r1, 0);
    /* The loader: variable_length serves the same segments and loss tokens
       as none, in rows of max_tokens, with unequal tokens per rank; a
       mid-step resume gives the same batches. */
    {
        lrun a, b;
        const char *lb = "seq_length: 256\nglobal_batch_size: 16\nmicro_batch_size: 2\n"
                         "topology: {dp: 4}\ncost: {preset: causal, a: 64}\n";
        char e1[512], e2[512];
        snprintf(e1, sizeof e1, "%sbalance: none\n", lb);
        snprintf(e2, sizeof e2, "%sbalance: variable_length\nmax_tokens: 600\n", lb);
        loader_run(&c, e1, &a);
        loader_run(&c, e2, &b);
        CHECK_EQ_I64(a.rows, 2);
        CHECK_EQ_I64(a.cols, 256);
        CHECK_EQ_I64(b.rows, 1);
        CHECK_EQ_I64(b.cols, 600);
        int unequal = 0;
        for (int s = 0; s < LSTEPS; s++) {
            CHECK(a.seg[s] == b.seg[s]);
            CHECK_EQ_I64(a.tokens[s], b.tokens[s]);
            CHECK_EQ_I64(a.loss[s], b.loss[s]);
            for (int r = 1; r < 4; r++) unequal |= b.rank_tokens[s][r] != b.rank_tokens[s][0];
        }
        CHECK(unequal);
        /* a max_tokens below micro_batch_size * seq_length is refused */
        pl_config *bad = NULL;
        const char *y = "seq_length: 256\nmicro_batch_size: 2\nglobal_batch_size: 8\n"
                        "balance: variable_length\nmax_tokens: 500\n"
                        "sources: [{name: a, type: megatron, path: x, weight: 1}]\n";
        CHECK(pl_config_parse_string(y, strlen(y), "t", &bad) == PL_ECONFIG);
        CHECK(strstr(pl_config_errmsg(bad), "max_tokens 500") != NULL);
        pl_config_free(bad);
        /* a window of more than 2^31 - 1 sequences is refused (window.c numbers
           them in 32 bits); one step fewer is taken */
        const char *yw = "seq_length: 256\nglobal_batch_size: 16777216\n"
                         "balance: karmarkar_karp\nbalance_window: 128\n"
                         "sources: [{name: a, type: megatron, path: x, weight: 1}]\n";
        CHECK(pl_config_parse_string(yw, strlen(yw), "t", &bad) == PL_ECONFIG);
        CHECK(strstr(pl_config_errmsg(bad), "balance_window 128 x global_batch_size "
                                            "16777216") != NULL);
        pl_config_free(bad);
        const char *yok = "seq_length: 256\nglobal_batch_size: 16777216\n"
                          "balance: karmarkar_karp\nbalance_window: 127\n"
                          "sources: [{name: a, type: megatron, path: x, weight: 1}]\n";
        bad = NULL;
        CHECK(pl_config_parse_string(yok, strlen(yok), "t", &bad) == PL_OK);
        pl_config_free(bad);
    }
    window_checks(&c);
    /* The loader with a window (its mid-step state at step 1 lies inside the
       first window): the same segments over the window as without. */
    {
        lrun a, b;
        const char *lb = "seq_length: 256\nglobal_batch_size: 8\nmicro_batch_size: 2\n"
                         "topology: {dp: 2}\ncost: {preset: causal, a: 64}\n"
                         "balance: variable_length\n";
        char e2[512];
        snprintf(e2, sizeof e2, "%sbalance_window: 3\n", lb);
        loader_run(&c, lb, &a);
        loader_run(&c, e2, &b);
        CHECK(a.seg[0] + a.seg[1] + a.seg[2] == b.seg[0] + b.seg[1] + b.seg[2]);
        CHECK_EQ_I64(a.loss[0] + a.loss[1] + a.loss[2], b.loss[0] + b.loss[1] + b.loss[2]);
    }
    corpus_free(&c);
    TEST_END();
}
