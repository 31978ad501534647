/*
 * Balancing (balance: greedy | karmarkar_karp):
 *  - never changes a step's membership, drops or duplicates a chunk;
 *  - every DP rank gets exactly global_batch_size/dp sequences, each of at
 *    most seq_length tokens; rank_cost matches the sequences' costs;
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
    const int64_t G = cfg->global_batch_size, S = cfg->seq_length, dp = cfg->topology.dp;
    for (int step = 0; step < STEPS; step++) {
        pl_plan *pl = NULL;
        CHECK_OK(pl_planner_next(p, &pl));
        if (!pl) break;
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

int main(void) {
    corpus c;
    corpus_make(&c, 256);
    const char *base = "seq_length: 256\nglobal_batch_size: 32\nmicro_batch_size: 2\n"
                       "topology: {dp: 4}\ncost: {preset: causal, a: 64}\n";
    const char *modes[3] = {"none", "greedy", "karmarkar_karp"};
    run runs[3];
    for (int m = 0; m < 3; m++) {
        char extra[512];
        snprintf(extra, sizeof extra, "%sbalance: %s\n", base, modes[m]);
        plan_run(&c, extra, &runs[m], 0);
    }
    double tot[3] = {0, 0, 0};
    for (int step = 0; step < STEPS; step++)
        for (int m = 0; m < 3; m++) {
            CHECK(runs[m].membership[step] == runs[0].membership[step]);
            tot[m] += runs[m].max_cost[step];
        }
    fprintf(stderr, "sum of max rank cost: none %.4g greedy %.4g kk %.4g\n", tot[0], tot[1], tot[2]);
    CHECK(tot[1] < tot[0]);
    CHECK(tot[2] < tot[0]);
    /* long_short with each balancer */
    for (int m = 0; m < 3; m++) {
        char extra[512];
        snprintf(extra, sizeof extra, "%sbalance: %s\nlong_short: {threshold: 200}\n", base, modes[m]);
        run r;
        plan_run(&c, extra, &r, 1);
    }
    /* dp = 1 and dp = global_batch_size (one sequence per rank) */
    run r1;
    plan_run(&c, "seq_length: 256\nglobal_batch_size: 8\nmicro_batch_size: 1\n"
                 "topology: {dp: 8}\nbalance: karmarkar_karp\ncost: {preset: causal}\n", &r1, 0);
    plan_run(&c, "seq_length: 256\nglobal_batch_size: 8\nmicro_batch_size: 4\n"
                 "topology: {dp: 1}\nbalance: greedy\n", &r1, 0);
    corpus_free(&c);
    TEST_END();
}
