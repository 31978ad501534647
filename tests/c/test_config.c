/*
 * test_config.c -- the YAML config (SPEC section 5): defaults, presets,
 * schedules, pl_config_set, clone, and one test per error, checking both the
 * status code and that the message names the key and the line.
 */
#include "config/config.h"
#include "testutil.h"

#include <math.h>
#include <sys/stat.h>

static char g_dir[256];

/* Expand "$D" in `tmpl` to the fixture directory. */
static char *expand(const char *tmpl) {
    static char buf[8192];
    size_t o = 0;
    for (const char *p = tmpl; *p && o + 300 < sizeof buf; p++) {
        if (p[0] == '$' && p[1] == 'D') {
            o += (size_t)snprintf(buf + o, sizeof buf - o, "%s", g_dir);
            p++;
        } else {
            buf[o++] = *p;
        }
    }
    buf[o] = '\0';
    return buf;
}

static int parse(const char *tmpl, pl_config **out) {
    const char *y = expand(tmpl);
    return pl_config_parse_string(y, strlen(y), "test.yaml", out);
}

/* Parse and expect status `code` with a message containing s1 (and s2). */
static void expect_err_at(int src_line, const char *tmpl, int code,
                          const char *s1, const char *s2) {
    pl_config *cfg = NULL;
    int rc = parse(tmpl, &cfg);
    const char *msg = pl_config_errmsg(cfg);
    pl_test_checks++;
    if (rc != code || !cfg || (s1 && !strstr(msg, s1)) ||
        (s2 && !strstr(msg, s2))) {
        fprintf(stderr,
                "%s:%d: expected %s with '%s' '%s', got %s: %s\n", __FILE__,
                src_line, pl_err_name(code), s1 ? s1 : "", s2 ? s2 : "",
                pl_err_name(rc), msg);
        pl_test_failures++;
    }
    pl_config_free(cfg);
}
#define EXPECT_ERR(y, code, s1, s2) expect_err_at(__LINE__, y, code, s1, s2)

/* Parsing touches no file: the config parses, and opening source 0 fails
 * with `code` and a message containing s1 and s2. */
static void expect_open_err_at(int src_line, const char *tmpl, int code,
                               const char *s1, const char *s2) {
    pl_config *cfg = NULL;
    int prc = parse(tmpl, &cfg);
    pl_source *src = NULL;
    int rc = prc ? prc : pl_config_open_source(cfg, 0, &src);
    const char *msg = prc ? pl_config_errmsg(cfg) : src ? pl_source_errmsg(src) : "";
    pl_test_checks++;
    if (prc || rc != code || (s1 && !strstr(msg, s1)) || (s2 && !strstr(msg, s2))) {
        fprintf(stderr, "%s:%d: expected open to give %s with '%s' '%s', got %s (parse %s): %s\n",
                __FILE__, src_line, pl_err_name(code), s1 ? s1 : "", s2 ? s2 : "",
                pl_err_name(rc), pl_err_name(prc), msg);
        pl_test_failures++;
    }
    pl_source_free(src);
    pl_config_free(cfg);
}
#define EXPECT_OPEN_ERR(y, code, s1, s2) expect_open_err_at(__LINE__, y, code, s1, s2)

#define SRC1 "sources:\n  - {name: web, type: megatron, path: $D/web}\n"

static void test_defaults(void) {
    pl_config *cfg = NULL;
    CHECK_OK(parse(SRC1, &cfg));
    CHECK(cfg != NULL);
    CHECK_EQ_I64(cfg->seed, 1234);
    CHECK_EQ_I64(cfg->seq_length, 8192);
    CHECK_EQ_I64(cfg->global_batch_size, 256);
    CHECK_EQ_I64(cfg->micro_batch_size, 1);
    CHECK_EQ_I64(cfg->train_steps, -1);
    CHECK_EQ_I64(cfg->dtype, PL_DTYPE_INT64);
    CHECK_EQ_I64(cfg->pad_id, 0);
    CHECK_EQ_I64(cfg->long_documents, PL__LONGDOC_SPLIT);
    CHECK_EQ_I64(cfg->packing, PL__PACK_BEST_FIT);
    CHECK_EQ_I64(cfg->balance, PL__BALANCE_NONE);
    CHECK(strcmp(cfg->cost.preset, "linear") == 0);
    CHECK(cfg->cost.a == 1.0 && cfg->cost.b == 0.0 && cfg->cost.c == 0.0);
    CHECK_EQ_I64(cfg->cost.window, 0);
    CHECK_EQ_I64(cfg->long_short_threshold, 0);
    CHECK_EQ_I64(cfg->on_error, PL__ONERR_FAIL);
    CHECK_EQ_I64(cfg->topology.dp, 1);
    CHECK_EQ_I64(cfg->topology.pp, 1);
    CHECK_EQ_I64(cfg->topology.cp, 1);
    CHECK_EQ_I64(cfg->topology.tp, 1);
    CHECK(strcmp(cfg->topology.order, "tp-cp-ep-dp-pp") == 0);
    CHECK_EQ_I64(cfg->threads, 0); /* auto */
    CHECK_EQ_I64(cfg->prefetch, 4);
    CHECK_EQ_I64(cfg->has_schedule, 0);
    CHECK_EQ_I64(pl_config_num_sources(cfg), 1);
    CHECK(strcmp(pl_config_source_name(cfg, 0), "web") == 0);
    CHECK(strcmp(pl_config_source_path(cfg, 0), expand("$D/web")) == 0);
    CHECK(pl_config_source_name(cfg, 1) == NULL);
    CHECK(pl_config_source_weight(cfg, 0, 0) == 1.0);
    CHECK_EQ_I64(cfg->sources[0].type, PL_SOURCE_MEGATRON);
    CHECK_EQ_I64(cfg->sources[0].eos_id, -1);
    CHECK_EQ_I64(pl_config_world_size(cfg), 1);
    int64_t v = 0;
    CHECK_OK(pl_config_get_int(cfg, "seq_length", &v));
    CHECK_EQ_I64(v, 8192);
    CHECK_OK(pl_config_get_int(cfg, "micro_batches_per_rank", &v));
    CHECK_EQ_I64(v, 256);
    CHECK(pl_config_get_int(cfg, "nope", &v) == PL_EINVAL);
    CHECK(strcmp(pl_config_errmsg(cfg), "") == 0);
    pl_config_free(cfg);
    pl_config_free(NULL);
}

static const char *full_yaml =
    "seed: 7\n"
    "seq_length: 4096\n"
    "global_batch_size: 64\n"
    "micro_batch_size: 2\n"
    "train_steps: 1000\n"
    "dtype: int32\n"
    "pad_id: 3\n"
    "long_documents: truncate\n"
    "packing: concat_chunk\n"
    "balance: karmarkar_karp\n"
    "cost: {preset: llama-7b, c: 5}\n"
    "long_short: {threshold: 2048}\n"
    "on_error: skip\n"
    "topology: {dp: 8, pp: 2, cp: 2, tp: 4, order: tp-cp-ep-dp-pp}\n"
    "threads: 3\n"
    "prefetch: 6\n"
    "sources:\n"
    "  - {name: web, type: megatron, path: $D/web, weight: 0.6}\n"
    "  - {name: code, type: llmc, path: \"$D/code_*.bin\", weight: 0.4}\n"
    "  - {name: logs, type: flat, path: $D/logs.bin, token_dtype: uint32, "
    "eos_id: 2, weight: 0.0}\n";

static void test_full(void) {
    pl_config *cfg = NULL;
    CHECK_OK(parse(full_yaml, &cfg));
    if (!cfg || cfg->errmsg[0]) fprintf(stderr, "%s\n", pl_config_errmsg(cfg));
    CHECK_EQ_I64(cfg->seed, 7);
    CHECK_EQ_I64(cfg->seq_length, 4096);
    CHECK_EQ_I64(cfg->global_batch_size, 64);
    CHECK_EQ_I64(cfg->micro_batch_size, 2);
    CHECK_EQ_I64(cfg->train_steps, 1000);
    CHECK_EQ_I64(cfg->dtype, PL_DTYPE_INT32);
    CHECK_EQ_I64(cfg->pad_id, 3);
    CHECK_EQ_I64(cfg->long_documents, PL__LONGDOC_TRUNCATE);
    CHECK_EQ_I64(cfg->packing, PL__PACK_CONCAT_CHUNK);
    CHECK_EQ_I64(cfg->balance, PL__BALANCE_KK);
    CHECK(cfg->cost.a == 6 * 6.7e9 && cfg->cost.b == 1.952 * 6.0 * 32 * 4096);
    CHECK(cfg->cost.c == 5.0);
    CHECK_EQ_I64(cfg->long_short_threshold, 2048);
    CHECK_EQ_I64(cfg->on_error, PL__ONERR_SKIP);
    CHECK_EQ_I64(cfg->topology.dp, 8);
    CHECK_EQ_I64(cfg->topology.pp, 2);
    CHECK_EQ_I64(cfg->topology.cp, 2);
    CHECK_EQ_I64(cfg->topology.tp, 4);
    CHECK_EQ_I64(pl_config_world_size(cfg), 128);
    CHECK_EQ_I64(cfg->threads, 3);
    CHECK_EQ_I64(cfg->prefetch, 6);
    CHECK_EQ_I64(cfg->n_sources, 3);
    CHECK_EQ_I64(cfg->sources[1].type, PL_SOURCE_LLMC);
    CHECK_EQ_I64(cfg->sources[1].token_dtype, 0);
    CHECK_EQ_I64(cfg->sources[2].type, PL_SOURCE_FLAT);
    CHECK_EQ_I64(cfg->sources[2].token_dtype, PL_DTYPE_UINT32);
    CHECK_EQ_I64(cfg->sources[2].eos_id, 2);
    CHECK(fabs(pl_config_source_weight(cfg, 0, 5) - 0.6) < 1e-12);
    CHECK(fabs(pl_config_source_weight(cfg, 1, 5) - 0.4) < 1e-12);
    CHECK(pl_config_source_weight(cfg, 2, 5) == 0.0);
    int64_t v = 0;
    CHECK_OK(pl_config_get_int(cfg, "micro_batches_per_rank", &v));
    CHECK_EQ_I64(v, 4);
    CHECK_OK(pl_config_get_int(cfg, "topology.tp", &v));
    CHECK_EQ_I64(v, 4);

    /* Clone: deep and equal. */
    pl_config *c = pl__config_clone(cfg);
    CHECK(c != NULL);
    CHECK(c->sources != cfg->sources);
    CHECK(strcmp(c->sources[1].path, cfg->sources[1].path) == 0);
    CHECK(c->sources[1].path != cfg->sources[1].path);
    CHECK_EQ_I64(c->topology.tp, 4);
    CHECK(c->cost.c == 5.0);
    CHECK(strcmp(c->origin, "test.yaml") == 0);
    pl_config_free(cfg);
    CHECK(strcmp(c->sources[2].name, "logs") == 0);
    CHECK_OK(pl_config_set(c, "threads", "9"));
    CHECK_EQ_I64(c->threads, 9);
    CHECK_OK(pl_config_set(c, "threads", "auto"));
    CHECK_EQ_I64(c->threads, 0);
    CHECK(pl_config_set(c, "threads", "0") == PL_ECONFIG);
    CHECK(strstr(pl_config_errmsg(c), "auto") != NULL);
    pl_config_free(c);
}

static void check_preset(const char *yaml, double a, double b, double c,
                         int64_t window) {
    pl_config *cfg = NULL;
    CHECK_OK(parse(yaml, &cfg));
    CHECK(cfg->cost.a == a);
    CHECK(cfg->cost.b == b);
    CHECK(cfg->cost.c == c);
    CHECK_EQ_I64(cfg->cost.window, window);
    pl_config_free(cfg);
}

static void test_presets(void) {
    check_preset("cost: {preset: linear}\n" SRC1, 1, 0, 0, 0);
    check_preset("cost: {preset: causal}\n" SRC1, 0, 1, 0, 0);
    check_preset("cost: {preset: sliding_window, window: 512}\n" SRC1, 0, 1, 0,
                 512);
    /* llama-1b: measured on an H200 (seconds); llama-7b: FLOPs, attention
       scaled by the 1B shape's measured ratio. */
    check_preset("cost: {preset: llama-1b}\n" SRC1, 1.4592835e-5, 7.7854614e-10,
                 6.0745961e-3, 0);
    check_preset("cost: {preset: llama-7b}\n" SRC1, 4.02e10, 1.952 * 786432, 0, 0);
    /* Explicit coefficients override the preset wherever they appear. */
    check_preset("cost: {a: 2, preset: llama-1b, b: 3.5, c: 1e3}\n" SRC1, 2,
                 3.5, 1000, 0);
    check_preset("cost: {b: 0.25}\n" SRC1, 1, 0.25, 0, 0);
}

static const char *sched_yaml =
    "sources:\n"
    "  - {name: web, type: megatron, path: $D/web}\n"
    "  - {name: code, type: llmc, path: $D/code_0.bin}\n"
    "schedule:\n"
    "  interpolation: %s\n"
    "  points:\n"
    "    - {step: 100, weights: {web: 0.8, code: 0.2}}\n"
    "    - {step: 200, weights: {web: 1, code: 1}}\n"
    "    - {step: 400, weights: {code: 3}}\n";

#define NEAR(x, y) (fabs((x) - (y)) < 1e-12)

static void test_schedule(void) {
    char y[2048];
    pl_config *cfg = NULL;
    double w[2];

    snprintf(y, sizeof y, sched_yaml, "linear");
    CHECK_OK(parse(y, &cfg));
    CHECK_EQ_I64(cfg->has_schedule, 1);
    CHECK_EQ_I64(cfg->n_points, 3);
    pl__config_weights(cfg, 0, w); /* before the first point: constant */
    CHECK(NEAR(w[0], 0.8) && NEAR(w[1], 0.2));
    pl__config_weights(cfg, 100, w);
    CHECK(NEAR(w[0], 0.8) && NEAR(w[1], 0.2));
    pl__config_weights(cfg, 150, w); /* halfway from 0.8 to 0.5 */
    CHECK(NEAR(w[0], 0.65) && NEAR(w[1], 0.35));
    pl__config_weights(cfg, 200, w);
    CHECK(NEAR(w[0], 0.5) && NEAR(w[1], 0.5));
    pl__config_weights(cfg, 250, w); /* a quarter from 0.5 to 0 */
    CHECK(NEAR(w[0], 0.375) && NEAR(w[1], 0.625));
    pl__config_weights(cfg, 400, w);
    CHECK(NEAR(w[0], 0.0) && NEAR(w[1], 1.0));
    pl__config_weights(cfg, 100000, w); /* after the last: constant */
    CHECK(NEAR(w[0], 0.0) && NEAR(w[1], 1.0));
    CHECK(NEAR(pl_config_source_weight(cfg, 0, 150), 0.65));
    CHECK(NEAR(pl_config_source_weight(cfg, 1, 150), 0.35));
    /* Switch to step interpolation through pl_config_set. */
    CHECK_OK(pl_config_set(cfg, "schedule.interpolation", "step"));
    pl__config_weights(cfg, 150, w);
    CHECK(NEAR(w[0], 0.8) && NEAR(w[1], 0.2));
    pl_config_free(cfg);

    snprintf(y, sizeof y, sched_yaml, "step");
    CHECK_OK(parse(y, &cfg));
    CHECK_EQ_I64(cfg->interpolation, PL__INTERP_STEP);
    pl__config_weights(cfg, 50, w);
    CHECK(NEAR(w[0], 0.8) && NEAR(w[1], 0.2));
    pl__config_weights(cfg, 199, w);
    CHECK(NEAR(w[0], 0.8) && NEAR(w[1], 0.2));
    pl__config_weights(cfg, 200, w);
    CHECK(NEAR(w[0], 0.5) && NEAR(w[1], 0.5));
    pl__config_weights(cfg, 399, w);
    CHECK(NEAR(w[0], 0.5) && NEAR(w[1], 0.5));
    pl__config_weights(cfg, 401, w);
    CHECK(NEAR(w[0], 0.0) && NEAR(w[1], 1.0));
    /* Clone copies the points. */
    pl_config *c = pl__config_clone(cfg);
    pl_config_free(cfg);
    pl__config_weights(c, 250, w);
    CHECK(NEAR(w[0], 0.5) && NEAR(w[1], 0.5));
    pl_config_free(c);

    /* Source weights are ignored when a schedule exists, even if zero. */
    CHECK_OK(parse("sources:\n"
                   "  - {name: web, type: megatron, path: $D/web, weight: 0}\n"
                   "schedule:\n"
                   "  points: [{step: 0, weights: {web: 2}}]\n",
                   &cfg));
    CHECK(NEAR(pl_config_source_weight(cfg, 0, 10), 1.0));
    pl_config_free(cfg);
}

static void test_set(void) {
    pl_config *cfg = NULL;
    CHECK_OK(parse("global_batch_size: 8\n" SRC1, &cfg));
    CHECK_OK(pl_config_set(cfg, "topology.dp", "2"));
    CHECK_EQ_I64(cfg->topology.dp, 2);
    CHECK_OK(pl_config_set(cfg, "train_steps", "10"));
    CHECK_EQ_I64(cfg->train_steps, 10);
    CHECK_OK(pl_config_set(cfg, "train_steps", "null"));
    CHECK_EQ_I64(cfg->train_steps, -1);
    CHECK_OK(pl_config_set(cfg, "balance", "greedy"));
    CHECK_EQ_I64(cfg->balance, PL__BALANCE_GREEDY);
    CHECK_OK(pl_config_set(cfg, "cost.preset", "causal"));
    CHECK(cfg->cost.a == 0 && cfg->cost.b == 1);
    CHECK_OK(pl_config_set(cfg, "cost.a", "0.5"));
    CHECK(cfg->cost.a == 0.5);
    CHECK_OK(pl_config_set(cfg, "topology.order", "tp-dp-cp-pp"));
    CHECK_OK(pl_config_set(cfg, "sources.web.weight", "3"));
    CHECK(cfg->sources[0].weight == 3.0);
    int64_t v = 0;
    CHECK_OK(pl_config_get_int(cfg, "topology.dp", &v));
    CHECK_EQ_I64(v, 2);

    /* Errors roll back and name the key. */
    CHECK(pl_config_set(cfg, "topology.dp", "3") == PL_ECONFIG);
    CHECK(strstr(pl_config_errmsg(cfg), "global_batch_size") != NULL);
    CHECK_EQ_I64(cfg->topology.dp, 2);
    CHECK(pl_config_set(cfg, "topology.dp", "0") == PL_ECONFIG);
    CHECK(strstr(pl_config_errmsg(cfg), "topology.dp") != NULL);
    CHECK_EQ_I64(cfg->topology.dp, 2);
    CHECK(pl_config_set(cfg, "threads", "x") == PL_ECONFIG);
    CHECK(strstr(pl_config_errmsg(cfg), "threads") != NULL);
    CHECK(pl_config_set(cfg, "seq_lenght", "1") == PL_ECONFIG);
    CHECK(strstr(pl_config_errmsg(cfg), "unknown key 'seq_lenght'") != NULL);
    CHECK(pl_config_set(cfg, "packing", "tight") == PL_ECONFIG);
    CHECK_EQ_I64(cfg->packing, PL__PACK_BEST_FIT);
    CHECK(pl_config_set(cfg, "topology.order", "tp-cp-pp") == PL_ETOPOLOGY);
    CHECK(strstr(pl_config_errmsg(cfg), "axis 'dp' missing, but topology.dp is 2") != NULL);
    CHECK(strcmp(cfg->topology.order, "tp-dp-cp-pp") == 0);
    /* Axes of size 1 may be left out (Megatron's RankGenerator adds them). */
    CHECK_OK(pl_config_set(cfg, "topology.order", "tp-dp"));
    CHECK_OK(pl_config_set(cfg, "topology.order", "tp-dp-cp-pp"));
    CHECK(pl_config_set(cfg, "sources.web.weight", "0") == PL_ECONFIG);
    CHECK(strstr(pl_config_errmsg(cfg), "sum to zero") != NULL);
    CHECK(cfg->sources[0].weight == 3.0);
    CHECK(pl_config_set(cfg, "sources.nope.weight", "1") == PL_ECONFIG);
    CHECK(strstr(pl_config_errmsg(cfg), "unknown source 'nope'") != NULL);
    CHECK(pl_config_set(cfg, "cost.preset", "sliding_window") == PL_ECONFIG);
    CHECK(strstr(pl_config_errmsg(cfg), "cost.window") != NULL);
    CHECK(cfg->cost.a == 0.5);
    CHECK(pl_config_set(cfg, "cost.window", "64") == PL_ECONFIG);
    CHECK(pl_config_set(cfg, NULL, "1") == PL_EINVAL);
    CHECK(pl_config_set(NULL, "threads", "1") == PL_EINVAL);
    pl_config_free(cfg);
}

static void test_errors(void) {
    /* Unknown keys at every level, with the line. */
    EXPECT_ERR("seed: 1\nseq_lenght: 5\n" SRC1, PL_ECONFIG,
               "test.yaml:2: unknown key 'seq_lenght'", NULL);
    EXPECT_ERR("topology:\n  dp: 1\n  dpp: 2\n" SRC1, PL_ECONFIG,
               "test.yaml:3: unknown key 'topology.dpp'", NULL);
    EXPECT_ERR("cost: {preset: linear, d: 1}\n" SRC1, PL_ECONFIG,
               "test.yaml:1: unknown key 'cost.d'", NULL);
    EXPECT_ERR("long_short: {thresh: 1}\n" SRC1, PL_ECONFIG,
               "unknown key 'long_short.thresh'", NULL);
    EXPECT_ERR("sources:\n"
               "  - {name: web, type: megatron, path: $D/web}\n"
               "  - {name: x, type: megatron, path: $D/web, wieght: 1}\n",
               PL_ECONFIG, "test.yaml:3: unknown key 'sources[1].wieght'",
               NULL);
    EXPECT_ERR(SRC1 "schedule:\n  interp: step\n  points: []\n", PL_ECONFIG,
               "test.yaml:4: unknown key 'schedule.interp'", NULL);
    EXPECT_ERR(SRC1 "schedule:\n  points:\n    - {step: 0, weight: {web: 1}}\n",
               PL_ECONFIG, "test.yaml:5: unknown key 'schedule.points[0].weight'",
               NULL);
    EXPECT_ERR("foo: {a: 1}\n" SRC1, PL_ECONFIG, "test.yaml:1: unknown key 'foo'",
               NULL);
    EXPECT_ERR("seed: 1\nseed: 2\n" SRC1, PL_ECONFIG, "test.yaml:2:",
               "duplicate key 'seed'");

    /* Wrong types, non-integers, out of range. */
    EXPECT_ERR("seq_length: abc\n" SRC1, PL_ECONFIG, "test.yaml:1: seq_length",
               "expected an integer");
    EXPECT_ERR("seq_length: 8192.0\n" SRC1, PL_ECONFIG, "seq_length",
               "expected an integer, got '8192.0'");
    EXPECT_ERR("seq_length: \"8192\"\n" SRC1, PL_ECONFIG, "seq_length",
               "expected an integer");
    EXPECT_ERR("seq_length: [1, 2]\n" SRC1, PL_ECONFIG, "test.yaml:1: seq_length",
               "expected a scalar, got a list");
    EXPECT_ERR("seq_length:\n" SRC1, PL_ECONFIG, "seq_length", "missing value");
    EXPECT_ERR("topology: 4\n" SRC1, PL_ECONFIG, "topology",
               "expected a mapping");
    EXPECT_ERR("micro_batch_size: -1\n" SRC1, PL_ECONFIG,
               "test.yaml:1: micro_batch_size must be a positive integer", NULL);
    EXPECT_ERR("global_batch_size: 0\n" SRC1, PL_ECONFIG,
               "global_batch_size must be a positive integer", NULL);
    EXPECT_ERR("topology: {tp: 0}\n" SRC1, PL_ECONFIG, "topology.tp",
               "positive");
    EXPECT_ERR("threads: 0\n" SRC1, PL_ECONFIG, "threads", "positive");
    EXPECT_ERR("prefetch: two\n" SRC1, PL_ECONFIG, "prefetch",
               "expected an integer");
    EXPECT_ERR("pad_id: -5\n" SRC1, PL_ECONFIG, "pad_id", "negative");
    EXPECT_ERR("seed: -1\n" SRC1, PL_ECONFIG, "seed", "non-negative integer");
    EXPECT_ERR("train_steps: 0\n" SRC1, PL_ECONFIG, "train_steps", "positive");
    EXPECT_ERR("long_short: {threshold: -1}\n" SRC1, PL_ECONFIG,
               "long_short.threshold", "negative");
    EXPECT_ERR("cost: {a: -1}\n" SRC1, PL_ECONFIG, "cost.a", "negative");
    EXPECT_ERR("cost: {b: x}\n" SRC1, PL_ECONFIG, "cost.b",
               "expected a number");
    EXPECT_ERR("sources:\n  - {name: web, type: megatron, path: $D/web, "
               "weight: -0.5}\n",
               PL_ECONFIG, "test.yaml:2: sources[0].weight", "negative");
    EXPECT_ERR("sources:\n  - {name: web, type: megatron, path: $D/web, "
               "weight: heavy}\n",
               PL_ECONFIG, "sources[0].weight", "expected a number");
    EXPECT_ERR("sources:\n  - {name: l, type: flat, path: $D/logs.bin, "
               "eos_id: -2}\n",
               PL_ECONFIG, "sources[0].eos_id", "negative");
    EXPECT_ERR("sources: {web: 1}\n", PL_ECONFIG, "sources", "expected a list");
    EXPECT_ERR("sources: []\n", PL_ECONFIG, "sources", "at least one");
    EXPECT_ERR("sources:\n  - web\n", PL_ECONFIG, "sources[0]",
               "expected a mapping");
    EXPECT_ERR("sources:\n  - {type: megatron, path: $D/web}\n", PL_ECONFIG,
               "sources[0]", "missing key 'name'");
    EXPECT_ERR("sources:\n  - {name: web, path: $D/web}\n", PL_ECONFIG,
               "sources[0]", "missing key 'type'");
    EXPECT_ERR("sources:\n  - {name: web, type: megatron}\n", PL_ECONFIG,
               "sources[0]", "missing key 'path'");
    EXPECT_ERR("sources:\n  - {name: web, type: megatron, path: $D/web, "
               "token_dtype: uint16}\n",
               PL_ECONFIG, "token_dtype applies only to flat", NULL);
    EXPECT_ERR("sources:\n  - {name: web, type: megatron, path: $D/web, "
               "eos_id: 0}\n",
               PL_ECONFIG, "eos_id applies only", NULL);
    EXPECT_ERR("[1, 2]\n", PL_ECONFIG, "configuration", "expected a mapping");

    EXPECT_ERR(SRC1 "---\nseed: 2\n", PL_ECONFIG, "second YAML document", NULL);

    /* Limits of the implementation: config errors, not overflows. */
    EXPECT_ERR("seq_length: 33554432\n" SRC1, PL_ECONFIG,
               "seq_length 33554432 is above the limit", NULL);
    EXPECT_ERR("global_batch_size: 33554432\n" SRC1, PL_ECONFIG,
               "global_batch_size 33554432 is above the limit", NULL);
    EXPECT_ERR("seq_length: 16777216\nmicro_batch_size: 256\nglobal_batch_size: 256\n" SRC1,
               PL_ECONFIG, "does not fit cu_seqlens", NULL);
    EXPECT_ERR("topology: {dp: 65536, pp: 65536, tp: 65536}\nglobal_batch_size: 65536\n" SRC1,
               PL_ETOPOLOGY, "world size", NULL);
    EXPECT_ERR("train_steps: 9223372036854775807\n" SRC1, PL_ECONFIG,
               "train_steps", "limit");
    EXPECT_ERR("sources:\n  - {name: a, type: megatron, path: $D/web, weight: 1e308}\n"
               "  - {name: b, type: megatron, path: $D/web, weight: 1e308}\n",
               PL_ECONFIG, "sum to infinity", NULL);
    EXPECT_ERR("sources:\n  - {name: f, type: flat, path: $D/web.idx, eos_id: 70000}\n",
               PL_ECONFIG, "eos_id 70000 does not fit", NULL);

    /* Unknown enum values. */
    EXPECT_ERR("packing: tight\n" SRC1, PL_ECONFIG,
               "test.yaml:1: packing: unknown value 'tight'", "best_fit");
    EXPECT_ERR("balance: perfect\n" SRC1, PL_ECONFIG,
               "balance: unknown value 'perfect'", "karmarkar_karp");
    EXPECT_ERR("dtype: int16\n" SRC1, PL_ECONFIG,
               "dtype: unknown value 'int16'", NULL);
    EXPECT_ERR("long_documents: drop\n" SRC1, PL_ECONFIG,
               "long_documents: unknown value 'drop'", NULL);
    EXPECT_ERR("on_error: ignore\n" SRC1, PL_ECONFIG,
               "on_error: unknown value 'ignore'", NULL);
    EXPECT_ERR("cost:\n  preset: llama-70b\n" SRC1, PL_ECONFIG,
               "test.yaml:2: cost.preset: unknown value 'llama-70b'", NULL);
    EXPECT_ERR(SRC1 "schedule:\n  interpolation: cubic\n  points: "
                    "[{step: 0, weights: {web: 1}}]\n",
               PL_ECONFIG, "test.yaml:4: schedule.interpolation: unknown value",
               "cubic");
    EXPECT_ERR("sources:\n  - {name: web, type: orc, path: $D/web}\n",
               PL_ECONFIG, "test.yaml:2: sources[0].type: unknown value "
                           "'orc'",
               NULL);
    EXPECT_ERR("sources:\n  - {name: web, type: parquet, path: $D/web}\n",
               PL_ECONFIG, "sources[0] (web): a parquet source needs a tokenizer", NULL);
    EXPECT_ERR("sources:\n  - {name: l, type: flat, path: $D/logs.bin, "
               "token_dtype: int8}\n",
               PL_ECONFIG, "sources[0].token_dtype: unknown value 'int8'",
               NULL);

    /* Sources and schedule. */
    EXPECT_ERR("sources:\n"
               "  - {name: web, type: megatron, path: $D/web}\n"
               "  - {name: web, type: flat, path: $D/logs.bin}\n",
               PL_ECONFIG, "test.yaml:3:", "duplicate source name 'web'");
    EXPECT_ERR(SRC1 "schedule:\n  points:\n"
                    "    - {step: 0, weights: {web: 1, wiki: 1}}\n",
               PL_ECONFIG, "test.yaml:5:", "unknown source 'wiki'");
    EXPECT_ERR(SRC1 "schedule:\n  points:\n"
                    "    - {step: 10, weights: {web: 1}}\n"
                    "    - {step: 10, weights: {web: 2}}\n",
               PL_ECONFIG, "test.yaml:6: schedule.points[1].step",
               "must increase");
    EXPECT_ERR(SRC1 "schedule:\n  points:\n"
                    "    - {step: 10, weights: {web: 1}}\n"
                    "    - {step: 5, weights: {web: 2}}\n",
               PL_ECONFIG, "must increase (5 after 10)", NULL);
    EXPECT_ERR(SRC1 "schedule:\n  points:\n"
                    "    - {step: 0, weights: {web: 1}}\n"
                    "    - {step: 5, weights: {web: 0}}\n",
               PL_ECONFIG, "test.yaml:6: schedule.points[1].weights sum to "
                           "zero",
               NULL);
    EXPECT_ERR(SRC1 "schedule:\n  interpolation: step\n", PL_ECONFIG,
               "missing key 'points'", NULL);
    EXPECT_ERR(SRC1 "schedule:\n  points:\n    - {weights: {web: 1}}\n",
               PL_ECONFIG, "schedule.points[0]", "missing key 'step'");
    EXPECT_ERR(SRC1 "schedule:\n  points:\n    - {step: x, weights: {web: 1}}\n",
               PL_ECONFIG, "schedule.points[0].step", "expected an integer");
    EXPECT_ERR("sources:\n"
               "  - {name: web, type: megatron, path: $D/web, weight: 0}\n"
               "  - {name: l, type: flat, path: $D/logs.bin, weight: 0.0}\n",
               PL_ECONFIG, "weights of sources sum to zero", NULL);

    /* Missing paths, naming the source and the path, when the source opens
       (parsing touches no file). */
    EXPECT_OPEN_ERR("sources:\n  - {name: web, type: megatron, path: $D/nothere}\n",
                    PL_ECONFIG, "test.yaml:2: source 'web': path '", "nothere");
    EXPECT_OPEN_ERR("sources:\n  - {name: c, type: llmc, path: \"$D/zz_*.bin\"}\n",
                    PL_ECONFIG, "source 'c': path '", "zz_*.bin' not found");
    EXPECT_OPEN_ERR("sources:\n  - {name: l, type: flat, path: $D/web}\n",
                    PL_ECONFIG, "source 'l'", "not found");

    /* Cross-key checks. */
    EXPECT_ERR("global_batch_size: 10\nmicro_batch_size: 2\n"
               "topology: {dp: 3}\n" SRC1,
               PL_ECONFIG, "test.yaml:1: global_batch_size 10 is not divisible",
               "3 * 2");
    EXPECT_ERR("seq_length: 100\ntopology: {cp: 4}\n" SRC1, PL_ECONFIG,
               "test.yaml:1: seq_length 100 is not divisible by 2 * "
               "topology.cp = 8",
               NULL);
    EXPECT_ERR("cost: {preset: sliding_window}\n" SRC1, PL_ECONFIG,
               "cost.window is required", NULL);
    EXPECT_ERR("cost: {preset: causal, window: 8}\n" SRC1, PL_ECONFIG,
               "cost.window applies only", NULL);
    EXPECT_ERR("seed: 1\n", PL_ECONFIG, "missing key 'sources'", NULL);
    EXPECT_ERR("", PL_ECONFIG, "missing key 'sources'", NULL);

    /* Topology order problems are PL_ETOPOLOGY. */
    EXPECT_ERR("topology:\n  order: tp-cp-xx-dp-pp\n" SRC1, PL_ETOPOLOGY,
               "test.yaml:2:", "unknown axis 'xx'");
    EXPECT_ERR("topology: {order: tp-cp-dp-pp-tp}\n" SRC1, PL_ETOPOLOGY,
               "axis 'tp' repeated", NULL);
    EXPECT_ERR("topology: {pp: 2, order: tp-cp-dp}\n" SRC1, PL_ETOPOLOGY,
               "axis 'pp' missing, but topology.pp is 2",
               "only axes of size 1 may be left out");
    EXPECT_ERR("topology: {order: tp--cp-dp-pp}\n" SRC1, PL_ETOPOLOGY,
               "unknown axis ''", NULL);

    /* YAML syntax errors, with the line. */
    EXPECT_ERR("seed: 1\nsources:\n  - {name: web, type: megatron\n",
               PL_ECONFIG, "test.yaml:4: YAML syntax error", NULL);
    EXPECT_ERR("seed: 1\n  bad: indent\n", PL_ECONFIG,
               "test.yaml:2: YAML syntax error", NULL);
}

static void test_file(void) {
    char path[512];
    snprintf(path, sizeof path, "%s/pretrain.yaml", g_dir);
    const char *y = expand("seed: 3\nseq_lenght: 5\n" SRC1);
    CHECK(pl_test_write_file(path, y, strlen(y)) == 0);
    pl_config *cfg = NULL;
    CHECK(pl_config_parse_file(path, &cfg) == PL_ECONFIG);
    char want[600];
    snprintf(want, sizeof want, "%s:2: unknown key 'seq_lenght'", path);
    CHECK(strstr(pl_config_errmsg(cfg), want) != NULL);
    pl_config_free(cfg);

    y = expand("seed: 3\n" SRC1);
    CHECK(pl_test_write_file(path, y, strlen(y)) == 0);
    CHECK_OK(pl_config_parse_file(path, &cfg));
    CHECK_EQ_I64(cfg->seed, 3);
    pl_config_free(cfg);

    snprintf(path, sizeof path, "%s/missing.yaml", g_dir);
    CHECK(pl_config_parse_file(path, &cfg) == PL_ENOENT);
    CHECK(strstr(pl_config_errmsg(cfg), "missing.yaml") != NULL);
    pl_config_free(cfg);

    /* A megatron directory or glob of prefixes is accepted. */
    CHECK_OK(parse("sources:\n  - {name: d, type: megatron, path: $D}\n"
                   "  - {name: g, type: megatron, path: \"$D/w*\"}\n",
                   &cfg));
    pl_config_free(cfg);
}

/* Index of the first warning containing `needle`, or -1. */
static int64_t find_warning(const pl_config *cfg, const char *needle) {
    for (int64_t i = 0; i < pl_config_num_warnings(cfg); i++)
        if (strstr(pl_config_warning(cfg, i), needle)) return i;
    return -1;
}

static void test_warnings(void) {
    pl_config *cfg = NULL;
    /* Defaults that decide the batches are reported; a clean config has none. */
    CHECK_OK(parse(SRC1, &cfg));
    CHECK_EQ_I64(pl_config_num_warnings(cfg), 1);
    CHECK(find_warning(cfg, "test.yaml: seq_length is not set: using the default 8192") == 0);
    CHECK(pl_config_warning(cfg, 1) == NULL);
    CHECK(pl_config_warning(cfg, -1) == NULL);
    int64_t v = 0;
    CHECK_OK(pl_config_get_int(cfg, "num_warnings", &v));
    CHECK_EQ_I64(v, 1);
    pl_config_free(cfg);
    CHECK_OK(parse("seq_length: 64\n" SRC1, &cfg));
    CHECK_EQ_I64(pl_config_num_warnings(cfg), 0);
    pl_config_free(cfg);

    /* Weights not summing to 1 are normalized, and the warning says to what. */
    CHECK_OK(parse("seq_length: 64\nsources:\n"
                   "  - {name: web, type: megatron, path: $D/web, weight: 3}\n"
                   "  - {name: code, type: llmc, path: $D/code_*.bin, weight: 1}\n",
                   &cfg));
    CHECK_EQ_I64(pl_config_num_warnings(cfg), 1);
    CHECK(find_warning(cfg, "test.yaml:2: weights of sources sum to 4, not 1: "
                            "they are normalized to web 0.75, code 0.25") == 0);
    CHECK(fabs(pl_config_source_weight(cfg, 0, 0) - 0.75) < 1e-12);
    /* A clone (what a loader keeps) has the same warnings. */
    pl_config *c2 = pl__config_clone(cfg);
    CHECK(c2 != NULL);
    CHECK_EQ_I64(pl_config_num_warnings(c2), 1);
    CHECK(strcmp(pl_config_warning(c2, 0), pl_config_warning(cfg, 0)) == 0);
    pl_config_free(c2);
    /* pl_config_set neither adds nor clears them. */
    CHECK_OK(pl_config_set(cfg, "sources.web.weight", "5"));
    CHECK_EQ_I64(pl_config_num_warnings(cfg), 1);
    pl_config_free(cfg);

    /* A schedule: points that omit sources, that do not sum to 1, and source
     * weights it overrides. */
    CHECK_OK(parse("seq_length: 64\nsources:\n"
                   "  - {name: web, type: megatron, path: $D/web, weight: 0.5}\n"
                   "  - {name: code, type: llmc, path: $D/code_*.bin}\n"
                   "  - {name: logs, type: flat, path: $D/logs.bin}\n"
                   "schedule:\n  points:\n"
                   "    - {step: 0, weights: {web: 0.8, code: 0.2}}\n"
                   "    - {step: 10, weights: {web: 1, code: 1, logs: 2}}\n",
                   &cfg));
    CHECK_EQ_I64(pl_config_num_warnings(cfg), 3);
    CHECK(find_warning(cfg, "test.yaml:8: schedule.points[0] (step 0) omits "
                            "source 'logs': its weight is 0 there") >= 0);
    CHECK(find_warning(cfg, "test.yaml:9: schedule.points[1].weights sum to 4, "
                            "not 1: they are normalized") >= 0);
    CHECK(find_warning(cfg, "test.yaml:3: sources[0].weight ('web') is ignored: "
                            "the schedule sets every weight") >= 0);
    CHECK(pl_config_source_weight(cfg, 2, 0) == 0.0);
    CHECK(fabs(pl_config_source_weight(cfg, 2, 10) - 0.5) < 1e-12);
    pl_config_free(cfg);
}

static void test_vocab_and_world(void) {
    pl_config *cfg = NULL;
    /* pad_id and eos_id outside a known vocabulary are errors. */
    EXPECT_ERR("seq_length: 64\nvocab_size: 100\npad_id: 100\n" SRC1, PL_ECONFIG,
               "pad_id 100 is outside the vocabulary (vocab_size 100)", NULL);
    EXPECT_ERR("seq_length: 64\nvocab_size: 1000\nsources:\n"
               "  - {name: logs, type: flat, path: $D/logs.bin, eos_id: 5000}\n",
               PL_ECONFIG, "eos_id 5000 is outside the vocabulary (vocab_size 1000)",
               "'logs'");
    EXPECT_ERR("seq_length: 64\nvocab_size: 0\n" SRC1, PL_ECONFIG, "vocab_size", NULL);
    CHECK_OK(parse("seq_length: 64\nvocab_size: 100\npad_id: 99\n" SRC1, &cfg));
    int64_t v = 0;
    CHECK_OK(pl_config_get_int(cfg, "vocab_size", &v));
    CHECK_EQ_I64(v, 100);
    CHECK(pl_config_set(cfg, "pad_id", "100") == PL_ECONFIG);
    CHECK_EQ_I64(cfg->pad_id, 99);
    pl_config_free(cfg);

    /* A fixed topology must match the trainer's world size. */
    CHECK_OK(parse("seq_length: 64\nglobal_batch_size: 16\n"
                   "topology: {dp: 2, tp: 2}\n" SRC1, &cfg));
    CHECK_OK(pl_config_set_world_size(cfg, 4));
    CHECK(pl_config_set_world_size(cfg, 8) == PL_ECONFIG);
    CHECK(strstr(pl_config_errmsg(cfg), "topology dp=2 pp=1 cp=1 tp=2 has world "
                                        "size 4, but the trainer's world size is 8") != NULL);
    CHECK(pl_config_set_world_size(cfg, 0) == PL_EINVAL);
    CHECK_EQ_I64(cfg->topology.dp, 2);
    pl_config_free(cfg);

    /* dp: auto takes dp from the world size and the other axes. */
    CHECK_OK(parse("seq_length: 64\nglobal_batch_size: 24\nmicro_batch_size: 2\n"
                   "topology: {dp: auto, tp: 2, cp: 2}\n" SRC1, &cfg));
    CHECK_OK(pl_config_get_int(cfg, "topology.dp_auto", &v));
    CHECK_EQ_I64(v, 1);
    CHECK_EQ_I64(pl_config_world_size(cfg), 4); /* dp is 1 until resolved */
    CHECK(pl_config_set_world_size(cfg, 6) == PL_ECONFIG);
    CHECK(strstr(pl_config_errmsg(cfg), "world size 6 is not divisible by "
                                        "pp*cp*tp = 1*2*2") != NULL);
    /* dp 4: 24 % (4 * 2) == 0 */
    uint64_t before = pl_config_fingerprint(cfg);
    CHECK_OK(pl_config_set_world_size(cfg, 16));
    CHECK_EQ_I64(cfg->topology.dp, 4);
    CHECK_EQ_I64(pl_config_world_size(cfg), 16);
    CHECK(pl_config_fingerprint(cfg) != before);
    pl_config_free(cfg);
    CHECK_OK(parse("seq_length: 64\nglobal_batch_size: 24\nmicro_batch_size: 2\n"
                   "topology: {dp: auto}\n" SRC1, &cfg));
    /* dp 5 does not divide global_batch_size: the config stays as it was. */
    CHECK(pl_config_set_world_size(cfg, 5) == PL_ECONFIG);
    CHECK(strstr(pl_config_errmsg(cfg), "topology.dp: auto = 5 (world size 5)") != NULL);
    CHECK(strstr(pl_config_errmsg(cfg), "not divisible") != NULL);
    CHECK_EQ_I64(cfg->topology.dp, 1);
    CHECK_OK(pl_config_get_int(cfg, "topology.dp_auto", &v));
    CHECK_EQ_I64(v, 1);
    CHECK_OK(pl_config_set_world_size(cfg, 3));
    CHECK_EQ_I64(cfg->topology.dp, 3);
    pl_config_free(cfg);
    /* "auto" also through pl_config_set; a quoted "auto" is a string. */
    CHECK_OK(parse("seq_length: 64\n" SRC1, &cfg));
    CHECK_OK(pl_config_set(cfg, "topology.dp", "auto"));
    CHECK_EQ_I64(cfg->topology.dp_auto, 1);
    pl_config_free(cfg);
    EXPECT_ERR("seq_length: 64\ntopology: {dp: 'auto'}\n" SRC1, PL_ECONFIG,
               "topology.dp: expected an integer", NULL);
}

/* The key table: every row described, every settable key's default read
 * back as written and set back to the same config, values and ranges as
 * the parser applies them. */
static void test_key_table(void) {
    const int64_t n = pl_config_key_count();
    CHECK(n > 40);
    pl_config *cfg = NULL;
    CHECK_OK(parse(SRC1, &cfg));
    int64_t settable = 0;
    for (int64_t i = 0; i < n; i++) {
        pl_config_key_row k;
        memset(&k, 0, sizeof k);
        k.size = sizeof k;
        CHECK_OK(pl_config_key_info(i, &k));
        CHECK(k.name && k.name[0] && k.type && k.doc && k.doc[0]);
        for (int64_t j = 0; j < i; j++) { /* names are unique */
            pl_config_key_row o;
            memset(&o, 0, sizeof o);
            o.size = sizeof o;
            CHECK_OK(pl_config_key_info(j, &o));
            CHECK(strcmp(o.name, k.name) != 0);
        }
        if (!k.settable) {
            char buf[64];
            CHECK(pl_config_get(cfg, k.name, buf, sizeof buf) == PL_EINVAL);
            continue;
        }
        settable++;
        char got[128];
        CHECK_OK(pl_config_get(cfg, k.name, got, sizeof got));
        if (k.default_value && strcmp(k.type, "number") != 0)
            CHECK(strcmp(got, k.default_value) == 0);
        /* What get writes, set takes, and the config stays the same. */
        uint64_t fp = pl_config_fingerprint(cfg);
        if (strcmp(got, "null") != 0 || strcmp(k.type, "integer or null") == 0) {
            if (pl_config_set(cfg, k.name, got) != PL_OK)
                fprintf(stderr, "set %s %s: %s\n", k.name, got, pl_config_errmsg(cfg));
            CHECK(pl_config_set(cfg, k.name, got) == PL_OK);
        }
        CHECK(pl_config_fingerprint(cfg) == fp);
        /* A value outside an integer range, or not among the values, fails. */
        if (strcmp(k.type, "integer") == 0 && k.max < INT64_MAX) {
            char big[32];
            snprintf(big, sizeof big, "%lld", (long long)k.max + 1);
            CHECK(pl_config_set(cfg, k.name, big) == PL_ECONFIG);
            CHECK(strstr(pl_config_errmsg(cfg), k.name) != NULL);
        }
        if (k.values) {
            CHECK(pl_config_set(cfg, k.name, "no_such_value") == PL_ECONFIG);
            CHECK(strstr(pl_config_errmsg(cfg), "expected one of: ") != NULL);
            CHECK(strstr(pl_config_errmsg(cfg), k.values[0]) != NULL);
        }
    }
    CHECK(settable >= 30);
    int64_t v = 0;
    CHECK_OK(pl_config_get_int(cfg, "threads", &v));
    CHECK_EQ_I64(v, 0); /* auto */
    CHECK_OK(pl_config_get_int(cfg, "sidecar_index", &v));
    CHECK_EQ_I64(v, PL_INDEX_WRITE);
    CHECK_OK(pl_config_get_int(cfg, "dtype", &v));
    CHECK_EQ_I64(v, PL_DTYPE_INT64);
    CHECK(pl_config_get_int(cfg, "cost.a", &v) == PL_EINVAL);
    CHECK(pl_config_get_int(cfg, "sources", &v) == PL_EINVAL);
    char small[4];
    CHECK(pl_config_get(cfg, "topology.order", small, sizeof small) == PL_ERANGE);
    CHECK_OK(pl_config_set(cfg, "topology.dp", "auto"));
    char got[32];
    CHECK_OK(pl_config_get(cfg, "topology.dp", got, sizeof got));
    CHECK(strcmp(got, "auto") == 0);
    CHECK_OK(pl_config_set(cfg, "split", "98,1,1"));
    CHECK_OK(pl_config_get(cfg, "split", got, sizeof got));
    CHECK(strncmp(got, "0.97999", 7) == 0);
    pl_config_free(cfg);
    pl_config_key_row k;
    memset(&k, 0, sizeof k);
    k.size = sizeof k;
    CHECK(pl_config_key_info(n, &k) == PL_ERANGE);
    CHECK(pl_config_key_info(-1, &k) == PL_ERANGE);
    k.size = 1;
    CHECK(pl_config_key_info(0, &k) == PL_EINVAL);

    /* Source types: names both ways, raw text as the sources treat it. */
    int types = 0;
    for (int t = 1; t < 64; t++) {
        pl_source_type_row r;
        memset(&r, 0, sizeof r);
        r.size = sizeof r;
        if (pl_source_type_info((pl_source_type)t, &r) != PL_OK) break;
        types++;
        CHECK(strcmp(pl_source_type_name((pl_source_type)t), r.name) == 0);
        CHECK(pl_source_type_from_name(r.name) == (pl_source_type)t);
        CHECK(r.raw_text == pl__is_text_type((pl_source_type)t));
        CHECK(r.index && r.doc);
    }
    CHECK_EQ_I64(types, PL_SOURCE_PARQUET);
    CHECK(pl_source_type_name((pl_source_type)0) == NULL);
    CHECK(pl_source_type_from_name("jsonlines") == (pl_source_type)0);
    CHECK(pl_source_type_from_name(NULL) == (pl_source_type)0);
}

/* Unknown keys name the closest known one beside them. */
static void test_did_you_mean(void) {
    EXPECT_ERR("seq_lenght: 64\n" SRC1, PL_ECONFIG,
               "test.yaml:1: unknown key 'seq_lenght' (did you mean 'seq_length'?)", NULL);
    EXPECT_ERR("sorces:\n  - {name: web, type: megatron, path: $D/web}\n", PL_ECONFIG,
               "unknown key 'sorces' (did you mean 'sources'?)", NULL);
    EXPECT_ERR("topolgy: {dp: 1}\n" SRC1, PL_ECONFIG,
               "unknown key 'topolgy' (did you mean 'topology'?)", NULL);
    EXPECT_ERR("topology: {dpp: 1}\n" SRC1, PL_ECONFIG,
               "unknown key 'topology.dpp' (did you mean 'topology.dp'?)", NULL);
    EXPECT_ERR("long_short: {thresh: 1}\n" SRC1, PL_ECONFIG,
               "(did you mean 'long_short.threshold'?)", NULL);
    EXPECT_ERR("sources:\n  - {name: web, type: megatron, path: $D/web, wieght: 1}\n",
               PL_ECONFIG,
               "unknown key 'sources[0].wieght' (did you mean 'sources[0].weight'? "
               "expected name, type, path, weight, token_dtype, eos_id, max_epochs, "
               "split, image, caption, index, text_key, prompt_key, response_key, "
               "messages_key, chat_template, tokenizer, lookahead)",
               NULL);
    EXPECT_ERR(SRC1 "schedule:\n  points:\n    - {step: 0, weight: {web: 1}}\n",
               PL_ECONFIG, "(did you mean 'schedule.points[0].weights'? expected step, "
               "weights)", NULL);
    EXPECT_ERR("tokenizer: {tpye: bytes}\n" SRC1, PL_ECONFIG,
               "unknown key 'tokenizer.tpye' (did you mean 'tokenizer.type'? expected type",
               NULL);
    /* Nothing close: no suggestion. */
    pl_config *cfg = NULL;
    CHECK(parse("foo: 1\n" SRC1, &cfg) == PL_ECONFIG);
    CHECK(strstr(pl_config_errmsg(cfg), "did you mean") == NULL);
    pl_config_free(cfg);
    CHECK_OK(parse(SRC1, &cfg));
    CHECK(pl_config_set(cfg, "max_lag_step", "3") == PL_ECONFIG);
    CHECK(strcmp(pl_config_errmsg(cfg),
                 "unknown key 'max_lag_step' (did you mean 'max_lag_steps'?)") == 0);
    CHECK(pl_config_set(cfg, "cost.windw", "3") == PL_ECONFIG);
    CHECK(strstr(pl_config_errmsg(cfg), "(did you mean 'cost.window'?)") != NULL);
    pl_config_free(cfg);
    /* A missing type lists every source type. */
    EXPECT_ERR("sources:\n  - {name: web, path: $D/web}\n", PL_ECONFIG,
               "missing key 'type' (megatron, llmc, flat, jsonl, text, webdataset, "
               "parquet)", NULL);
}

int main(void) {
    snprintf(g_dir, sizeof g_dir, "%s", pl_test_tmpdir());
    char p[512];
    const char *files[] = {"web.idx", "web.bin", "code_0.bin", "code_1.bin",
                           "logs.bin"};
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        snprintf(p, sizeof p, "%s/%s", g_dir, files[i]);
        if (pl_test_write_file(p, "", 0) != 0) {
            perror(p);
            return 2;
        }
    }
    test_defaults();
    test_full();
    test_presets();
    test_schedule();
    test_set();
    test_errors();
    test_file();
    test_warnings();
    test_vocab_and_world();
    test_key_table();
    test_did_you_mean();
    TEST_END();
}
