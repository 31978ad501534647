/*
 * test_topology.c -- global rank -> (dp, pp, cp, tp) and the fields of each
 * pipeline role (SPEC section 2), against tables computed by hand from
 * Megatron's RankGenerator rule (leftmost axis of `order` varies fastest).
 */
#include "config/config.h"
#include "testutil.h"

static char g_dir[256];

static pl_config *make(const char *topology) {
    char y[1024];
    snprintf(y, sizeof y,
             "global_batch_size: 12\nseq_length: 64\ntopology: %s\n"
             "sources:\n  - {name: web, type: megatron, path: %s/web}\n",
             topology, g_dir);
    pl_config *cfg = NULL;
    int rc = pl_config_parse_string(y, strlen(y), "topo.yaml", &cfg);
    if (rc != PL_OK) {
        fprintf(stderr, "parse failed: %s\n", pl_config_errmsg(cfg));
        pl_config_free(cfg);
        return NULL;
    }
    return cfg;
}

#define FIRST                                                                \
    (PL_FIELD_INPUT_IDS | PL_FIELD_POSITION_IDS | PL_FIELD_CU_SEQLENS |      \
     PL_FIELD_MAX_SEQLEN)
#define LAST                                                                 \
    (PL_FIELD_LABELS | PL_FIELD_LOSS_MASK | PL_FIELD_CU_SEQLENS |            \
     PL_FIELD_MAX_SEQLEN)
#define MIDDLE (PL_FIELD_CU_SEQLENS | PL_FIELD_MAX_SEQLEN)

/* {rank, dp, pp, cp, tp} */
static void check_table(pl_config *cfg, const int64_t (*t)[5], int n) {
    CHECK_EQ_I64(pl_config_world_size(cfg), n);
    for (int i = 0; i < n; i++) {
        pl_rank_info info;
        memset(&info, 0xff, sizeof info);
        CHECK_OK(pl_config_rank_info(cfg, t[i][0], &info));
        CHECK_EQ_I64(info.rank, t[i][0]);
        CHECK_EQ_I64(info.dp_rank, t[i][1]);
        CHECK_EQ_I64(info.pp_rank, t[i][2]);
        CHECK_EQ_I64(info.cp_rank, t[i][3]);
        CHECK_EQ_I64(info.tp_rank, t[i][4]);
    }
}

static void test_megatron_order(void) {
    /* tp-cp-ep-dp-pp, dp=pp=cp=tp=2: tp fastest, then cp, dp, pp. */
    static const int64_t t[16][5] = {
        {0, 0, 0, 0, 0},  {1, 0, 0, 0, 1},  {2, 0, 0, 1, 0},
        {3, 0, 0, 1, 1},  {4, 1, 0, 0, 0},  {5, 1, 0, 0, 1},
        {6, 1, 0, 1, 0},  {7, 1, 0, 1, 1},  {8, 0, 1, 0, 0},
        {9, 0, 1, 0, 1},  {10, 0, 1, 1, 0}, {11, 0, 1, 1, 1},
        {12, 1, 1, 0, 0}, {13, 1, 1, 0, 1}, {14, 1, 1, 1, 0},
        {15, 1, 1, 1, 1},
    };
    pl_config *cfg = make("{dp: 2, pp: 2, cp: 2, tp: 2, order: tp-cp-ep-dp-pp}");
    CHECK(cfg != NULL);
    if (!cfg) return;
    check_table(cfg, t, 16);
    /* pp = 2: stage 0 is first, stage 1 last. */
    pl_rank_info info;
    CHECK_OK(pl_config_rank_info(cfg, 5, &info));
    CHECK_EQ_I64(info.fields, FIRST);
    CHECK_OK(pl_config_rank_info(cfg, 13, &info));
    CHECK_EQ_I64(info.fields, LAST);
    /* Out of range. */
    CHECK(pl_config_rank_info(cfg, 16, &info) == PL_ERANGE);
    CHECK(pl_config_rank_info(cfg, -1, &info) == PL_ERANGE);
    CHECK(pl_config_rank_info(cfg, 0, NULL) == PL_EINVAL);
    CHECK(pl_config_rank_info(NULL, 0, &info) == PL_EINVAL);
    CHECK_EQ_I64(pl_config_world_size(NULL), 0);
    pl_config_free(cfg);

    /* The default order is the same. */
    cfg = make("{dp: 2, pp: 2, cp: 2, tp: 2}");
    CHECK(cfg != NULL);
    if (cfg) check_table(cfg, t, 16);
    pl_config_free(cfg);
}

static void test_other_order(void) {
    /* dp-tp-pp-cp with dp=3, tp=2, pp=2, cp=1: dp fastest, then tp, pp. */
    static const int64_t t[12][5] = {
        {0, 0, 0, 0, 0},  {1, 1, 0, 0, 0}, {2, 2, 0, 0, 0},  {3, 0, 0, 0, 1},
        {4, 1, 0, 0, 1},  {5, 2, 0, 0, 1}, {6, 0, 1, 0, 0},  {7, 1, 1, 0, 0},
        {8, 2, 1, 0, 0},  {9, 0, 1, 0, 1}, {10, 1, 1, 0, 1}, {11, 2, 1, 0, 1},
    };
    pl_config *cfg = make("{dp: 3, pp: 2, cp: 1, tp: 2, order: dp-tp-pp-cp}");
    CHECK(cfg != NULL);
    if (!cfg) return;
    check_table(cfg, t, 12);
    pl_config_free(cfg);

    /* ep anywhere has size 1: pp-ep-dp-cp-tp, pp fastest. */
    static const int64_t u[8][5] = {
        {0, 0, 0, 0, 0}, {1, 0, 1, 0, 0}, {2, 1, 0, 0, 0}, {3, 1, 1, 0, 0},
        {4, 0, 0, 0, 1}, {5, 0, 1, 0, 1}, {6, 1, 0, 0, 1}, {7, 1, 1, 0, 1},
    };
    cfg = make("{dp: 2, pp: 2, cp: 1, tp: 2, order: pp-ep-dp-cp-tp}");
    CHECK(cfg != NULL);
    if (!cfg) return;
    check_table(cfg, u, 8);
    pl_config_free(cfg);
}

static void test_fields(void) {
    pl_config *cfg = make("{dp: 1, pp: 1, tp: 4}");
    pl_rank_info info;
    for (int64_t r = 0; r < 4; r++) {
        CHECK_OK(pl_config_rank_info(cfg, r, &info));
        CHECK_EQ_I64(info.fields, PL_FIELD_ALL);
        CHECK_EQ_I64(info.tp_rank, r);
        CHECK_EQ_I64(info.dp_rank, 0);
    }
    pl_config_free(cfg);

    /* pp = 4, order tp-cp-ep-dp-pp, tp = 1: rank == pp stage. */
    cfg = make("{dp: 1, pp: 4}");
    const uint32_t want[4] = {FIRST, MIDDLE, MIDDLE, LAST};
    for (int64_t r = 0; r < 4; r++) {
        CHECK_OK(pl_config_rank_info(cfg, r, &info));
        CHECK_EQ_I64(info.pp_rank, r);
        CHECK_EQ_I64(info.fields, want[r]);
    }
    pl_config_free(cfg);
}

static void test_order_errors(void) {
    char err[256];
    int axes[5], n = 0;
    CHECK_OK(pl__topology_parse_order("tp-cp-ep-dp-pp", axes, &n, err,
                                      sizeof err));
    CHECK_EQ_I64(n, 5);
    CHECK_EQ_I64(axes[0], PL__AXIS_TP);
    CHECK_EQ_I64(axes[4], PL__AXIS_PP);
    CHECK_OK(pl__topology_parse_order("pp-dp-cp-tp", axes, &n, err,
                                      sizeof err));
    CHECK_EQ_I64(n, 4);
    CHECK(pl__topology_parse_order("tp-cp-ep-dp-pp-ep", NULL, NULL, err,
                                   sizeof err) == PL_ETOPOLOGY);
    CHECK(strstr(err, "'ep' repeated") != NULL);
    CHECK(pl__topology_parse_order("tp-cp-dp-zz", NULL, NULL, err,
                                   sizeof err) == PL_ETOPOLOGY);
    CHECK(strstr(err, "unknown axis 'zz'") != NULL);
    CHECK(pl__topology_parse_order("TP-cp-dp-pp", NULL, NULL, err,
                                   sizeof err) == PL_ETOPOLOGY);
    /* Leaving out an axis is the config's business (allowed at size 1). */
    CHECK_OK(pl__topology_parse_order("tp-dp-pp", axes, &n, err, sizeof err));
    CHECK_EQ_I64(n, 3);
    CHECK(pl__topology_parse_order("", NULL, NULL, err, sizeof err) ==
          PL_ETOPOLOGY);
    CHECK(pl__topology_parse_order(NULL, NULL, NULL, err, sizeof err) ==
          PL_ETOPOLOGY);
    CHECK(pl__topology_parse_order("tp-cp-dp-pp-", NULL, NULL, err,
                                   sizeof err) == PL_ETOPOLOGY);

    /* Through a config: parse errors are PL_ETOPOLOGY. */
    char y[512];
    snprintf(y, sizeof y,
             "topology: {pp: 2, order: tp-cp-ep-dp}\n"
             "sources:\n  - {name: web, type: megatron, path: %s/web}\n",
             g_dir);
    pl_config *cfg = NULL;
    CHECK(pl_config_parse_string(y, strlen(y), "t.yaml", &cfg) ==
          PL_ETOPOLOGY);
    CHECK(strstr(pl_config_errmsg(cfg), "t.yaml:1:") != NULL);
    CHECK(strstr(pl_config_errmsg(cfg), "'pp' missing, but topology.pp is 2") != NULL);
    pl_config_free(cfg);

    /* Size-1 axes left out of the order: ranks decompose over the others,
     * as Megatron's RankGenerator (which appends the missing axes). */
    cfg = make("{dp: 2, tp: 3, order: dp-tp}");
    for (int64_t r = 0; r < 6; r++) {
        pl_rank_info ri;
        CHECK_OK(pl_config_rank_info(cfg, r, &ri));
        CHECK_EQ_I64(ri.dp_rank, r % 2);
        CHECK_EQ_I64(ri.tp_rank, r / 2);
        CHECK_EQ_I64(ri.cp_rank, 0);
        CHECK_EQ_I64(ri.pp_rank, 0);
    }
    pl_config_free(cfg);

    /* A config whose order was corrupted behind its back. */
    cfg = make("{dp: 2}");
    snprintf(cfg->topology.order, sizeof cfg->topology.order, "tp-xx");
    pl_rank_info info;
    CHECK(pl_config_rank_info(cfg, 0, &info) == PL_ETOPOLOGY);
    pl_config_free(cfg);
}

int main(void) {
    snprintf(g_dir, sizeof g_dir, "%s", pl_test_tmpdir());
    char p[512];
    snprintf(p, sizeof p, "%s/web.idx", g_dir);
    if (pl_test_write_file(p, "", 0) != 0) return 2;
    test_megatron_order();
    test_other_order();
    test_fields();
    test_order_errors();
    TEST_END();
}
