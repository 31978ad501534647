/*
 * imbalance.c -- the balancing figures (bench/balance/README.md).
 *
 * For each corpus (the real four-source demo corpus, the lognormal synthetic
 * source), seq_length, DP size and global batch (8*dp, 32*dp) it plans a few
 * steps and reports, per cost preset (llama-1b, llama-7b), the largest rank
 * cost ("simulated step time", in training FLOPs) and max / lower bound of:
 *
 *   none            best_fit packing, round-robin arrangement
 *   greedy          best_fit packing, balance: greedy
 *   karmarkar_karp  best_fit packing, balance: karmarkar_karp
 *   concat_chunk    Megatron's layout (concatenate and cut at seq_length,
 *                   attention masked per document), balance none
 *   fixed_count     the step's member chunks (same documents as none) in
 *                   micro-batches of a fixed number of documents, one per
 *                   row, dealt round-robin to ranks in a shuffled order; a
 *                   micro-batch costs the cost of its documents (padding
 *                   free)
 *
 * The lower bound is that of the best_fit plans: max(total cost / dp,
 * costliest chunk).  none, greedy, karmarkar_karp and fixed_count share the
 * step's membership (the balancer never changes it); concat_chunk draws its
 * own.  Every number is a sum over the planned steps (a ratio of sums).
 *
 *   imbalance [--corpus real|synthetic|both] [--steps N] [--out FILE.md]
 *             [--seq 4096,8192,...] [--dp 8,64,512] [--mult 8,32]
 *   imbalance --plan-time [--balance none|greedy|karmarkar_karp] [--steps N]
 *             [--sources N] [--weights cycle|distinct|equal] [--paired] [--tree]
 *
 * --plan-time: one thread, dp 512, global batch 4096 sequences of 16k
 * tokens on the synthetic source; times pl_planner_next (mixture drawing,
 * packing, balancing; document lengths come from the mapped index, which a
 * few untimed warm-up steps fault in) and prints the median and p90 of N
 * steps (default 100).  --sources N (default 1) splits the mixture over N
 * weighted sources (--weights: cycle, the default, is 1..5 in turn;
 * distinct gives source i the weight 1 + i/N; equal all 1; names
 * lognormal_0 .. N-1), all
 * over the synthetic file; they share one source handle, since only the
 * planner's cost per source is measured, and the figure per million tokens
 * is printed so runs with different N compare directly, with wall and
 * thread CPU time (the latter is steadier on a shared machine).  --paired
 * also opens the same setting with one source and plans one step of each in
 * turn, so the ratio per million tokens (N sources / 1 source, per step,
 * median and p10/p90) is taken on the same seconds of a noisy machine.
 * --tree: the kinetic tournament even for few weight classes (the draw
 * scans up to PL__TN_SCAN_MAX classes' lines otherwise), to compare the two.
 *
 * Compiled against the static library and the internals (planner/planner.h)
 * to open sources as the CLI does; see README.md for the gcc line.
 */
#include "planner/planner.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define NPRESET 2
static const char *const preset_names[NPRESET] = {"llama-1b", "llama-7b"};
static const double preset_a[NPRESET] = {6.0 * 1.2e9, 6.0 * 6.7e9};
static const double preset_b[NPRESET] = {6.0 * 16 * 2048, 6.0 * 32 * 4096};

static const char *synthetic_prefix = "data/synthetic/lognormal_text_document";

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void die(const char *what, const char *msg) {
    fprintf(stderr, "imbalance: %s: %s\n", what, msg);
    exit(1);
}

static int file_exists(const char *p) {
    FILE *f = fopen(p, "rb");
    if (f) fclose(f);
    return f != NULL;
}

/* ------------------------------------------------------------ planners */

typedef struct bench_planner {
    pl_config *cfg;
    pl_source **src;
    int64_t n;
    pl_planner *p;
} bench_planner;

static int64_t n_synthetic_sources = 1;
static const char *weights_kind = "cycle";

/* --weights: cycle (1..5 in turn: five classes of equal weight), distinct
 * (every source its own weight, 1 + i / N), equal (all 1). */
static double source_weight(int64_t i) {
    if (!strcmp(weights_kind, "distinct"))
        return 1.0 + (double)i / (double)n_synthetic_sources;
    if (!strcmp(weights_kind, "equal")) return 1.0;
    return (double)(1 + i % 5);
}

static double cpu_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static const char *corpus_yaml(int synthetic) {
    static char buf[2048];
    static char *many;
    if (synthetic && n_synthetic_sources > 1) {
        size_t cap = (size_t)n_synthetic_sources * 160 + 64, at = 0;
        free(many);
        many = malloc(cap);
        at += (size_t)snprintf(many + at, cap - at, "sources:\n");
        for (int64_t i = 0; i < n_synthetic_sources; i++)
            at += (size_t)snprintf(many + at, cap - at,
                                   "  - {name: lognormal_%" PRId64 ", type: megatron, "
                                   "path: %s, weight: %.17g}\n",
                                   i, synthetic_prefix, source_weight(i));
        return many;
    }
    if (synthetic)
        snprintf(buf, sizeof buf,
                 "sources:\n  - {name: lognormal, type: megatron, path: %s, "
                 "weight: 1.0}\n",
                 synthetic_prefix);
    else
        snprintf(buf, sizeof buf, "%s",
                 "sources:\n"
                 "  - {name: kernel_docs, type: megatron, path: "
                 "data/kernel_docs_text_document, weight: 0.4}\n"
                 "  - {name: python_src, type: megatron, path: "
                 "data/python_src_text_document, weight: 0.3}\n"
                 "  - {name: man_i18n, type: megatron, path: "
                 "data/man_i18n_text_document, weight: 0.2}\n"
                 "  - {name: fortunes, type: megatron, path: "
                 "data/fortunes_text_document, weight: 0.1}\n");
    return buf;
}

/* A planner for one setting.  packing/balance/preset as in SPEC 5. */
static void planner_open(bench_planner *b, int synthetic, int64_t seq,
                         int64_t dp, int64_t G, const char *packing,
                         const char *balance, const char *preset) {
    const char *srcs = corpus_yaml(synthetic);
    size_t ycap = strlen(srcs) + 256;
    char *yaml = malloc(ycap);
    snprintf(yaml, ycap,
             "seed: 1234\nseq_length: 4096\nglobal_batch_size: 8\n"
             "micro_batch_size: 1\nthreads: 1\n%s",
             srcs);
    int rc = pl_config_parse_string(yaml, strlen(yaml), "bench", &b->cfg);
    free(yaml);
    if (rc) die("config", pl_config_errmsg(b->cfg));
    char v[64];
    /* Set in an order that keeps the config valid at every step. */
    snprintf(v, sizeof v, "%" PRId64, seq);
    if ((rc = pl_config_set(b->cfg, "seq_length", v))) die("seq_length", pl_config_errmsg(b->cfg));
    snprintf(v, sizeof v, "%" PRId64, G);
    if ((rc = pl_config_set(b->cfg, "global_batch_size", v))) die("global_batch_size", pl_config_errmsg(b->cfg));
    snprintf(v, sizeof v, "%" PRId64, dp);
    if ((rc = pl_config_set(b->cfg, "topology.dp", v))) die("topology.dp", pl_config_errmsg(b->cfg));
    if ((rc = pl_config_set(b->cfg, "packing", packing))) die("packing", pl_config_errmsg(b->cfg));
    if ((rc = pl_config_set(b->cfg, "balance", balance))) die("balance", pl_config_errmsg(b->cfg));
    if ((rc = pl_config_set(b->cfg, "cost.preset", preset))) die("cost.preset", pl_config_errmsg(b->cfg));
    b->n = pl_config_num_sources(b->cfg);
    b->src = calloc((size_t)b->n, sizeof *b->src);
    for (int64_t i = 0; i < b->n; i++) {
        if (i > 0 && !strcmp(b->cfg->sources[i].path, b->cfg->sources[0].path)) {
            b->src[i] = b->src[0]; /* one handle per file */
            continue;
        }
        if ((rc = pl__config_open_source(b->cfg, i, &b->src[i])))
            die("source", pl_source_errmsg(b->src[i]));
    }
    if ((rc = pl_planner_create(b->cfg, b->src, b->n, &b->p)))
        die("planner", pl_planner_errmsg(b->p));
}

static pl_plan *planner_next(bench_planner *b) {
    pl_plan *p = NULL;
    int rc = pl_planner_next(b->p, &p);
    if (rc) die("plan", pl_planner_errmsg(b->p));
    return p;
}

static void planner_close(bench_planner *b) {
    pl_planner_free(b->p);
    for (int64_t i = 0; i < b->n; i++)
        if (i == 0 || b->src[i] != b->src[0]) pl_source_free(b->src[i]);
    free(b->src);
    pl_config_free(b->cfg);
}

/* ------------------------------------------------------------ costs */

static double chunk_cost(int k, int64_t len) {
    double l = (double)len;
    return preset_a[k] * l + preset_b[k] * l * l;
}

/* Largest rank cost of a plan under preset k; *lb the lower bound. */
static double plan_max(const pl_plan *p, int k, double *lb) {
    const int64_t per = p->n_sequences / p->dp;
    double total = 0, worst = 0, mx = 0;
    for (int64_t r = 0; r < p->dp; r++) {
        double rc = 0;
        for (int64_t j = 0; j < per; j++) {
            int64_t q = p->rank_sequences[r * per + j];
            for (int64_t c = p->seq_offsets[q]; c < p->seq_offsets[q + 1]; c++) {
                double cc = chunk_cost(k, p->chunks[c].length);
                rc += cc;
                if (cc > worst) worst = cc;
            }
        }
        total += rc;
        if (rc > mx) mx = rc;
    }
    if (lb) *lb = fmax(total / (double)p->dp, worst);
    return mx;
}

/* Fixed-count batching of the plan's member chunks: shuffled, then dealt
 * round-robin to ranks; a rank's cost is the sum of its documents' costs
 * (so the number per micro-batch does not change the rank cost).  Returns
 * the largest rank cost under preset k. */
static double fixed_count_max(const pl_plan *p, int k, uint64_t seed,
                              int64_t *docs_per_mb) {
    const int64_t n = p->n_chunks;
    int64_t *idx = malloc((size_t)n * sizeof *idx);
    double *rank = calloc((size_t)p->dp, sizeof *rank);
    for (int64_t i = 0; i < n; i++) idx[i] = i;
    uint64_t x = seed * 0x9E3779B97F4A7C15ULL + 1;
    for (int64_t i = n - 1; i > 0; i--) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        int64_t j = (int64_t)(x % (uint64_t)(i + 1));
        int64_t t = idx[i];
        idx[i] = idx[j];
        idx[j] = t;
    }
    for (int64_t i = 0; i < n; i++)
        rank[i % p->dp] += chunk_cost(k, p->chunks[idx[i]].length);
    double mx = 0;
    for (int64_t r = 0; r < p->dp; r++) mx = fmax(mx, rank[r]);
    *docs_per_mb = n / (p->dp * p->micro_batches_per_rank);
    free(idx);
    free(rank);
    return mx;
}

/* ------------------------------------------------------------ one setting */

enum { M_NONE, M_GREEDY, M_KK, M_CONCAT, M_FIXED, NMETHOD };
static const char *const method_names[NMETHOD] = {
    "none", "greedy", "karmarkar_karp", "concat_chunk", "fixed_count"};

typedef struct result {
    int synthetic;
    int64_t seq, dp, G;
    int preset;
    double max[NMETHOD]; /* sums over steps */
    double lb;           /* sum over steps, best_fit membership */
    double lb_concat;
    double plan_s[NMETHOD]; /* planning seconds per step */
    double chunks_per_step, docs_per_mb;
    double worst_share; /* costliest chunk / (total/dp), max over steps */
} result;

static void run_setting(int synthetic, int64_t seq, int64_t dp, int64_t G,
                        int steps, result out[NPRESET]) {
    for (int k = 0; k < NPRESET; k++) {
        memset(&out[k], 0, sizeof out[k]);
        out[k].synthetic = synthetic;
        out[k].seq = seq;
        out[k].dp = dp;
        out[k].G = G;
        out[k].preset = k;
    }
    /* none (and fixed_count from its membership), concat: cost-agnostic. */
    bench_planner b;
    planner_open(&b, synthetic, seq, dp, G, "best_fit", "none", "llama-1b");
    for (int s = 0; s < steps; s++) {
        double t0 = now_s();
        pl_plan *p = planner_next(&b);
        double dt = now_s() - t0;
        for (int k = 0; k < NPRESET; k++) {
            double lb;
            out[k].max[M_NONE] += plan_max(p, k, &lb);
            out[k].lb += lb;
            out[k].plan_s[M_NONE] += dt / steps;
            int64_t dpm = 0;
            out[k].max[M_FIXED] += fixed_count_max(p, k, (uint64_t)s + 1, &dpm);
            out[k].docs_per_mb += (double)dpm / steps;
            out[k].chunks_per_step += (double)p->n_chunks / steps;
            double worst = 0, total = 0;
            for (int64_t c = 0; c < p->n_chunks; c++) {
                double cc = chunk_cost(k, p->chunks[c].length);
                total += cc;
                worst = fmax(worst, cc);
            }
            out[k].worst_share = fmax(out[k].worst_share, worst / (total / (double)dp));
        }
        pl_plan_free(p);
    }
    planner_close(&b);
    planner_open(&b, synthetic, seq, dp, G, "concat_chunk", "none", "llama-1b");
    for (int s = 0; s < steps; s++) {
        double t0 = now_s();
        pl_plan *p = planner_next(&b);
        double dt = now_s() - t0;
        for (int k = 0; k < NPRESET; k++) {
            double lb;
            out[k].max[M_CONCAT] += plan_max(p, k, &lb);
            out[k].lb_concat += lb;
            out[k].plan_s[M_CONCAT] += dt / steps;
        }
        pl_plan_free(p);
    }
    planner_close(&b);
    /* The balancers, per preset. */
    for (int k = 0; k < NPRESET; k++)
        for (int m = M_GREEDY; m <= M_KK; m++) {
            planner_open(&b, synthetic, seq, dp, G, "best_fit", method_names[m],
                         preset_names[k]);
            for (int s = 0; s < steps; s++) {
                double t0 = now_s();
                pl_plan *p = planner_next(&b);
                out[k].plan_s[m] += (now_s() - t0) / steps;
                out[k].max[m] += plan_max(p, k, NULL);
                pl_plan_free(p);
            }
            planner_close(&b);
        }
}

/* ------------------------------------------------------------ report */

static void print_header(FILE *f) {
    fprintf(f,
            "| corpus | seq | dp | G | preset | none | greedy | KK | concat | fixed "
            "| best | step time (best) | vs none | vs concat | vs fixed | achieved "
            "| plan ms (KK) |\n"
            "|---|---:|---:|---:|---|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|\n");
}

static void print_row(FILE *f, const result *r, int steps) {
    int best = r->max[M_KK] <= r->max[M_GREEDY] ? M_KK : M_GREEDY;
    double bm = r->max[best];
    fprintf(f,
            "| %s | %" PRId64 "k | %" PRId64 " | %" PRId64 "·dp | %s | %.3f | %.4f | %.4f "
            "| %.3f | %.3f | %s | %.3g | %.2fx | %.2fx | %.2fx | %.1f%% | %.1f |\n",
            r->synthetic ? "synthetic" : "real", r->seq / 1024, r->dp,
            r->G / r->dp, preset_names[r->preset], r->max[M_NONE] / r->lb,
            r->max[M_GREEDY] / r->lb, r->max[M_KK] / r->lb,
            r->max[M_CONCAT] / r->lb, r->max[M_FIXED] / r->lb,
            best == M_KK ? "KK" : "greedy", bm / steps,
            r->max[M_NONE] / bm, r->max[M_CONCAT] / bm, r->max[M_FIXED] / bm,
            100.0 * r->lb / bm, 1e3 * r->plan_s[M_KK]);
}

static int64_t *parse_list(const char *s, int *n) {
    int64_t *v = calloc(32, sizeof *v);
    *n = 0;
    while (*s && *n < 32) {
        v[(*n)++] = strtoll(s, (char **)&s, 10);
        if (*s == ',') s++;
    }
    return v;
}

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static int plan_time(const char *balance, int steps, int paired, int tree) {
    if (!file_exists("data/synthetic/lognormal_text_document.idx"))
        die("plan-time", "run bench/balance/make_synthetic.py first");
    bench_planner b, one;
    planner_open(&b, 1, 16384, 512, 4096, "best_fit", balance, "llama-7b");
    if (tree) b.p->tn_scan_max = 0; /* the tournament whatever the classes */
    if (paired) { /* the same setting with one source, stepped in turn */
        int64_t n = n_synthetic_sources;
        n_synthetic_sources = 1;
        planner_open(&one, 1, 16384, 512, 4096, "best_fit", balance, "llama-7b");
        n_synthetic_sources = n;
    }
    for (int s = 0; s < 3; s++) { /* warm-up */
        pl_plan_free(planner_next(&b));
        if (paired) pl_plan_free(planner_next(&one));
    }
    double *t = calloc((size_t)steps, sizeof *t), lbr = 0;
    double *ct = calloc((size_t)steps, sizeof *ct);
    double *c1 = calloc((size_t)steps, sizeof *c1), *ratio = calloc((size_t)steps, sizeof *ratio);
    int64_t chunks = 0, tokens = 0, tokens1 = 0;
    for (int s = 0; s < steps; s++) {
        double t0 = now_s(), c0 = cpu_s();
        pl_plan *p = planner_next(&b);
        t[s] = now_s() - t0;
        ct[s] = cpu_s() - c0;
        double mx = 0;
        for (int64_t r = 0; r < p->dp; r++) mx = fmax(mx, p->rank_cost[r]);
        lbr += mx / p->lower_bound / steps;
        chunks += p->n_chunks;
        tokens += p->tokens;
        if (paired) {
            double d0 = cpu_s();
            pl_plan *q = planner_next(&one);
            c1[s] = cpu_s() - d0;
            tokens1 += q->tokens;
            ratio[s] = (ct[s] / (double)p->tokens) / (c1[s] / (double)q->tokens);
            pl_plan_free(q);
        }
        pl_plan_free(p);
    }
    qsort(t, (size_t)steps, sizeof *t, cmp_d);
    qsort(ct, (size_t)steps, sizeof *ct, cmp_d);
    double mtok = (double)tokens / steps / 1e6;
    printf("plan-time balance=%s dp=512 G=4096 seq=16384 synthetic sources=%" PRId64
           " weights=%s%s: median %.2f ms, p90 %.2f ms, min %.2f ms over %d steps; "
           "%.3f ms per million tokens (median); thread CPU median %.2f ms, "
           "%.3f ms per million tokens; %.0f chunks/step; mean max/lb %.4f\n",
           balance, n_synthetic_sources, weights_kind, tree ? " (tree)" : "",
           1e3 * t[steps / 2], 1e3 * t[steps * 9 / 10], 1e3 * t[0], steps,
           1e3 * t[steps / 2] / mtok, 1e3 * ct[steps / 2], 1e3 * ct[steps / 2] / mtok,
           (double)chunks / steps, lbr);
    if (paired) {
        qsort(c1, (size_t)steps, sizeof *c1, cmp_d);
        qsort(ratio, (size_t)steps, sizeof *ratio, cmp_d);
        double mtok1 = (double)tokens1 / steps / 1e6;
        printf("paired with 1 source, steps in turn: thread CPU median %.2f ms, %.3f ms per "
               "million tokens; per million tokens, %" PRId64 " sources / 1 source, per step: "
               "median %.3fx (p10 %.3fx, p90 %.3fx)\n",
               1e3 * c1[steps / 2], 1e3 * c1[steps / 2] / mtok1, n_synthetic_sources,
               ratio[steps / 2], ratio[steps / 10], ratio[steps * 9 / 10]);
        planner_close(&one);
    }
    free(t);
    free(ct);
    free(c1);
    free(ratio);
    planner_close(&b);
    return 0;
}

int main(int argc, char **argv) {
    const char *corpus = "both", *out = NULL, *balance = "karmarkar_karp";
    const char *seqs = "4096,8192,16384,32768", *dps = "8,64,512", *mults = "8,32";
    int steps = 3, ptime = 0, steps_set = 0, paired = 0, tree = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--plan-time")) ptime = 1;
        else if (!strcmp(a, "--paired")) paired = 1;
        else if (!strcmp(a, "--tree")) tree = 1;
        else if (!strcmp(a, "--corpus") && v) corpus = argv[++i];
        else if (!strcmp(a, "--steps") && v) steps = atoi(argv[++i]), steps_set = 1;
        else if (!strcmp(a, "--out") && v) out = argv[++i];
        else if (!strcmp(a, "--seq") && v) seqs = argv[++i];
        else if (!strcmp(a, "--dp") && v) dps = argv[++i];
        else if (!strcmp(a, "--mult") && v) mults = argv[++i];
        else if (!strcmp(a, "--balance") && v) balance = argv[++i];
        else if (!strcmp(a, "--sources") && v) n_synthetic_sources = atoll(argv[++i]);
        else if (!strcmp(a, "--weights") && v) weights_kind = argv[++i];
        else {
            fprintf(stderr, "usage: see the comment at the top of imbalance.c\n");
            return 2;
        }
    }
    if (ptime) return plan_time(balance, steps_set ? steps : 100, paired, tree);
    int nseq, ndp, nmult;
    int64_t *seq = parse_list(seqs, &nseq), *dp = parse_list(dps, &ndp),
            *mult = parse_list(mults, &nmult);
    int corp[2], ncorp = 0;
    if (strcmp(corpus, "synthetic") && file_exists("data/kernel_docs_text_document.idx"))
        corp[ncorp++] = 0;
    else if (strcmp(corpus, "synthetic"))
        fprintf(stderr, "imbalance: no real corpus (scripts/build_corpus.py); skipped\n");
    if (strcmp(corpus, "real")) {
        if (!file_exists("data/synthetic/lognormal_text_document.idx"))
            die("synthetic", "run bench/balance/make_synthetic.py first");
        corp[ncorp++] = 1;
    }
    FILE *f = out ? fopen(out, "w") : stdout;
    if (!f) die("out", "cannot open");
    fprintf(f,
            "# Balancing: imbalance and simulated step time\n\n"
            "Generated by `build-bal/imbalance --steps %d --out "
            "bench/balance/RESULTS.md` (bench/balance/README.md).\n\n",
            steps);
    fprintf(f,
            "Columns none..fixed: largest rank cost / lower bound, summed over %d steps "
            "(lower bound = max(total/dp, costliest chunk) of the best_fit step).  "
            "best: the better of greedy and KK; step time: its largest rank cost, "
            "training FLOPs per step (mean over the steps); vs X: speedup of best "
            "over baseline X (ratio of largest rank costs); achieved: fraction of "
            "the achievable speedup realized, (baseline max / best max) / (baseline "
            "max / lower bound) = lower bound / best max (the same for every "
            "baseline); plan ms: mean planning time per step with karmarkar_karp.\n\n",
            steps);
    print_header(f);
    double t_start = now_s();
    for (int c = 0; c < ncorp; c++)
        for (int i = 0; i < nseq; i++)
            for (int j = 0; j < ndp; j++)
                for (int m = 0; m < nmult; m++) {
                    result r[NPRESET];
                    double t0 = now_s();
                    run_setting(corp[c], seq[i], dp[j], mult[m] * dp[j], steps, r);
                    for (int k = 0; k < NPRESET; k++) print_row(f, &r[k], steps);
                    fflush(f);
                    fprintf(stderr,
                            "%s seq %" PRId64 " dp %" PRId64 " G %" PRId64
                            ": %.1f s (chunks/step %.0f, worst chunk/(total/dp) "
                            "%.3f/%.3f)\n",
                            corp[c] ? "synthetic" : "real", seq[i], dp[j],
                            mult[m] * dp[j], now_s() - t0, r[0].chunks_per_step,
                            r[0].worst_share, r[1].worst_share);
                }
    fprintf(stderr, "total %.1f s\n", now_s() - t_start);
    if (out) fclose(f);
    free(seq);
    free(dp);
    free(mult);
    return 0;
}
