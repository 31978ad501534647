/*
 * The cost model (SPEC section 5) and its calibration:
 *  - pl_cost_fit recovers a, b, c exactly from noiseless rows (r2 == 1),
 *    gives r2 < 1 with noise, and rejects n < 3, dependent columns and
 *    non-finite values with PL_EINVAL;
 *  - pl_cost_sequence gives a * tokens + b * sum attn(len) + c for every
 *    preset (causal, sliding_window with its window, llama-1b, llama-7b) and
 *    for explicit a, b, c overrides, and agrees with the planner's
 *    pl__sequence_cost.
 */
#include "planner/planner.h"
#include "testutil.h"

#include <math.h>
#include <sys/wait.h>

static int close_rel(double x, double want, double tol) {
    return fabs(x - want) <= tol * (fabs(want) > 1e-300 ? fabs(want) : 1.0);
}

/* A deterministic pseudo-random stream in [0, 1). */
static double unif(uint64_t *s) {
    *s = *s * 6364136223846793005ULL + 1442695040888963407ULL;
    return (double)(*s >> 11) / 9007199254740992.0;
}

static void test_fit(void) {
    enum { N = 200 };
    double tok[N], sq[N], t[N], noisy[N];
    uint64_t s = 42;
    const double A = 3.5e-6, B = 2.25e-9, C = 0.0125;
    for (int i = 0; i < N; i++) {
        /* Packed micro-batches: 1..16 documents of 16..2048 tokens. */
        int docs = 1 + (int)(unif(&s) * 16);
        tok[i] = sq[i] = 0;
        for (int d = 0; d < docs; d++) {
            double l = 16 + floor(unif(&s) * 2033);
            tok[i] += l;
            sq[i] += l * l;
        }
        t[i] = A * tok[i] + B * sq[i] + C;
        noisy[i] = t[i] * (1 + 0.05 * (unif(&s) - 0.5));
    }
    double a = 0, b = 0, c = 0, r2 = 0;
    CHECK_OK(pl_cost_fit(tok, sq, t, N, &a, &b, &c, &r2));
    CHECK(close_rel(a, A, 1e-9));
    CHECK(close_rel(b, B, 1e-9));
    CHECK(close_rel(c, C, 1e-8));
    CHECK(close_rel(r2, 1.0, 1e-12));
    /* Exactly three rows determine the fit. */
    CHECK_OK(pl_cost_fit(tok, sq, t, 3, &a, &b, &c, &r2));
    CHECK(close_rel(a, A, 1e-7) && close_rel(b, B, 1e-7) && close_rel(c, C, 1e-6));
    /* Outputs may be NULL. */
    CHECK_OK(pl_cost_fit(tok, sq, t, N, NULL, NULL, NULL, &r2));
    /* Noise: r2 below 1 but the fit stays close. */
    CHECK_OK(pl_cost_fit(tok, sq, noisy, N, &a, &b, &c, &r2));
    fprintf(stderr, "noisy fit: a %.4g b %.4g c %.4g r2 %.6f\n", a, b, c, r2);
    CHECK(r2 < 1.0 && r2 > 0.9);
    CHECK(close_rel(a, A, 0.2) && close_rel(b, B, 0.2));
    /* Large magnitudes (llama-7b-sized coefficients, seconds ~ 1e13). */
    double big[N];
    for (int i = 0; i < N; i++) big[i] = 4.02e10 * tok[i] + 786432.0 * sq[i] + 1e6;
    CHECK_OK(pl_cost_fit(tok, sq, big, N, &a, &b, &c, &r2));
    CHECK(close_rel(a, 4.02e10, 1e-9) && close_rel(b, 786432.0, 1e-9));
    CHECK(close_rel(c, 1e6, 1e-3));

    /* EINVAL: too few rows, NULL inputs, dependent columns, non-finite. */
    double sentinel = -7;
    CHECK(pl_cost_fit(tok, sq, t, 2, &sentinel, NULL, NULL, NULL) == PL_EINVAL);
    CHECK(sentinel == -7);
    CHECK(pl_cost_fit(tok, sq, t, 0, NULL, NULL, NULL, NULL) == PL_EINVAL);
    CHECK(pl_cost_fit(NULL, sq, t, N, NULL, NULL, NULL, NULL) == PL_EINVAL);
    CHECK(pl_cost_fit(tok, NULL, t, N, NULL, NULL, NULL, NULL) == PL_EINVAL);
    CHECK(pl_cost_fit(tok, sq, NULL, N, NULL, NULL, NULL, NULL) == PL_EINVAL);
    double prop[N], same[N], zero[N];
    for (int i = 0; i < N; i++) {
        prop[i] = 512.0 * tok[i]; /* one document of 512 tokens per row */
        same[i] = 1000;          /* constant tokens: collinear with c */
        zero[i] = 0;
    }
    CHECK(pl_cost_fit(tok, prop, t, N, &a, &b, &c, &r2) == PL_EINVAL);
    CHECK(pl_cost_fit(same, sq, t, N, &a, &b, &c, &r2) == PL_EINVAL);
    CHECK(pl_cost_fit(tok, zero, t, N, &a, &b, &c, &r2) == PL_EINVAL);
    double bad[3] = {1, NAN, 3}, ok3[3] = {1, 4, 9}, t3[3] = {1, 2, 4};
    CHECK(pl_cost_fit(bad, ok3, t3, 3, &a, &b, &c, &r2) == PL_EINVAL);
    double inf3[3] = {1, 2, INFINITY}, tk3[3] = {1, 2, 5}, sq3[3] = {1, 4, 25};
    CHECK(pl_cost_fit(tk3, sq3, inf3, 3, &a, &b, &c, &r2) == PL_EINVAL);
    /* Equal times that the model fits exactly (a = b = 0): r2 is 1. */
    double flat[N];
    for (int i = 0; i < N; i++) flat[i] = 2.5;
    CHECK_OK(pl_cost_fit(tok, sq, flat, N, &a, &b, &c, &r2));
    CHECK(fabs(a) < 1e-12 && fabs(b) < 1e-15 && close_rel(c, 2.5, 1e-9));
    CHECK(r2 == 1.0);
}

static pl_config *parse(const char *yaml) {
    pl_config *cfg = NULL;
    int rc = pl_config_parse_string(yaml, strlen(yaml), "test", &cfg);
    if (rc) fprintf(stderr, "config: %s\n", pl_config_errmsg(cfg));
    CHECK_OK(rc);
    return cfg;
}

static void test_presets(void) {
    const char *base = "seq_length: 8192\nglobal_batch_size: 8\nmicro_batch_size: 1\n"
                       "sources:\n  - {name: s, type: flat, path: /dev/null, weight: 1}\n";
    const int64_t docs[4] = {100, 3000, 8000, 1};
    const double tokens = 11101;
    const double sq = 100.0 * 100 + 3000.0 * 3000 + 8000.0 * 8000 + 1;
    struct {
        const char *cost;
        double want;
    } cases[] = {
        {"cost: {preset: linear}", tokens},
        {"cost: {preset: causal}", sq},
        /* window 2048: 100^2 + 3000*2048 + 8000*2048 + 1 */
        {"cost: {preset: sliding_window, window: 2048}",
         100.0 * 100 + 3000.0 * 2048 + 8000.0 * 2048 + 1},
        {"cost: {preset: llama-1b}",
         1.4592835e-5 * tokens + 7.7854614e-10 * sq + 6.0745961e-3},
        {"cost: {preset: llama-7b}", 6 * 6.7e9 * tokens + 1.952 * 6.0 * 32 * 4096 * sq},
        {"cost: {preset: llama-7b, c: 5e9}",
         6 * 6.7e9 * tokens + 1.952 * 6.0 * 32 * 4096 * sq + 5e9},
        {"cost: {a: 2, b: 0.5, c: 7}", 2 * tokens + 0.5 * sq + 7},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        char yaml[1024];
        snprintf(yaml, sizeof yaml, "%s%s\n", base, cases[k].cost);
        pl_config *cfg = parse(yaml);
        if (!cfg) continue;
        double got = pl_cost_sequence(cfg, docs, 4);
        if (!close_rel(got, cases[k].want, 1e-12))
            fprintf(stderr, "%s: got %.17g want %.17g\n", cases[k].cost, got,
                    cases[k].want);
        CHECK(close_rel(got, cases[k].want, 1e-12));
        /* The planner's cost of the same chunks agrees. */
        pl_chunk ch[4];
        memset(ch, 0, sizeof ch);
        for (int i = 0; i < 4; i++) ch[i].length = docs[i];
        CHECK(pl__sequence_cost(cfg, ch, 4) == got);
        /* An empty sequence costs c; bad arguments give NaN. */
        CHECK(pl_cost_sequence(cfg, NULL, 0) == cfg->cost.c);
        CHECK(isnan(pl_cost_sequence(cfg, NULL, 2)));
        CHECK(isnan(pl_cost_sequence(cfg, docs, -1)));
        pl_config_free(cfg);
    }
    CHECK(isnan(pl_cost_sequence(NULL, docs, 4)));
    /* pl_config_set("cost.preset") switches the model. */
    char yaml[1024];
    snprintf(yaml, sizeof yaml, "%scost: {preset: causal}\n", base);
    pl_config *cfg = parse(yaml);
    if (cfg) {
        CHECK_OK(pl_config_set(cfg, "cost.preset", "llama-1b"));
        CHECK(close_rel(pl_cost_sequence(cfg, docs, 4),
                        1.4592835e-5 * tokens + 7.7854614e-10 * sq + 6.0745961e-3,
                        1e-12));
        pl_config_free(cfg);
    }
}

/* Run the CLI with `args`; returns its exit status, stdout into out. */
static int run_cli(const char *args, char *out, size_t cap) {
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "%s %s 2>/dev/null", PL_CLI_PATH, args);
    FILE *p = popen(cmd, "r");
    if (!p) return -1;
    size_t n = fread(out, 1, cap - 1, p);
    out[n] = '\0';
    int st = pclose(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static void test_calibrate_cli(void) {
    if (!PL_CLI_PATH[0]) return; /* built without the CLI */
    const char *dir = pl_test_tmpdir();
    char good[512], bad[512], few[512], args[1200], out[4096];
    snprintf(good, sizeof good, "%s/rows.csv", dir);
    snprintf(bad, sizeof bad, "%s/bad.csv", dir);
    snprintf(few, sizeof few, "%s/few.csv", dir);
    /* time = 2*tokens + 0.5*sum_sq + 3 */
    const char *g = "tokens,sum_sq,step_time\n# measured\n"
                    "10,100,73\n20,200,143\n 30 , 500 , 313\r\n\n40,1600,883\n";
    const char *b = "tokens,sum_sq,step_time\n10,100,253\n20,x,143\n";
    const char *f = "10,100,253\n20,200,143\n";
    CHECK_OK(pl_test_write_file(good, g, strlen(g)));
    CHECK_OK(pl_test_write_file(bad, b, strlen(b)));
    CHECK_OK(pl_test_write_file(few, f, strlen(f)));
    snprintf(args, sizeof args, "calibrate %s --json", good);
    CHECK_EQ_I64(run_cli(args, out, sizeof out), 0);
    double a = 0, bb = 0, c = 0, r2 = 0;
    long long rows = 0;
    CHECK(sscanf(out, "{\"a\": %lf, \"b\": %lf, \"c\": %lf, \"r2\": %lf, \"rows\": %lld}",
                 &a, &bb, &c, &r2, &rows) == 5);
    CHECK(close_rel(a, 2, 1e-9) && close_rel(bb, 0.5, 1e-9) && close_rel(c, 3, 1e-9));
    CHECK(close_rel(r2, 1, 1e-12));
    CHECK_EQ_I64(rows, 4);
    snprintf(args, sizeof args, "calibrate %s", bad);
    CHECK_EQ_I64(run_cli(args, out, sizeof out), 2);
    char cmd[1400];
    snprintf(cmd, sizeof cmd, "%s calibrate %s 2>&1 | grep -q 'bad.csv:3: malformed'",
             PL_CLI_PATH, bad);
    CHECK(system(cmd) == 0);
    snprintf(args, sizeof args, "calibrate %s", few);
    CHECK_EQ_I64(run_cli(args, out, sizeof out), 1);
    snprintf(args, sizeof args, "calibrate %s/missing.csv", dir);
    CHECK_EQ_I64(run_cli(args, out, sizeof out), 1);
    CHECK_EQ_I64(run_cli("calibrate", out, sizeof out), 2);
    CHECK_EQ_I64(run_cli("calibrate x.csv --steps 3", out, sizeof out), 2);
    unlink(good);
    unlink(bad);
    unlink(few);
    rmdir(dir);
}

int main(void) {
    test_fit();
    test_presets();
    test_calibrate_cli();
    TEST_END();
}
