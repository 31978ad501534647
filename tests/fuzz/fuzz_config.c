/* libFuzzer target: the YAML config parser (pl_config_parse_string), the
 * accessors of a config it accepts (every settable key read with
 * pl_config_get and set back) and its evaluation configs (pl_config_split). */
#include "fuzz_common.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static int ready;
    fz_enter_tmpdir();
    if (!ready) {
        fz_write_corpus();
        ready = 1;
    }
    pl_config *cfg = NULL;
    if (pl_config_parse_string((const char *)data, size, "fuzz", &cfg) == PL_OK) {
        int64_t world = pl_config_world_size(cfg);
        pl_rank_info ri;
        pl_config_rank_info(cfg, 0, &ri);
        pl_config_rank_info(cfg, world - 1, &ri);
        pl_config_rank_info(cfg, world, &ri);
        /* Every settable key reads back and sets back (the key table); not
         * cost.preset, which resets a, b, c and window. */
        for (int64_t k = 0; k < pl_config_key_count(); k++) {
            pl_config_key_row row = {.size = sizeof row};
            char v[128];
            if (pl_config_key_info(k, &row) == PL_OK && row.settable &&
                strcmp(row.name, "cost.preset") &&
                pl_config_get(cfg, row.name, v, sizeof v) == PL_OK && strcmp(v, "null") &&
                pl_config_set(cfg, row.name, v) != PL_OK)
                __builtin_trap();
        }
        pl_config *copy = pl__config_clone(cfg);
        double w[64];
        if (cfg->n_sources <= 64) pl__config_weights(cfg, 3, w);
        pl_config_free(copy);
        /* The evaluation configs of its splits, and their copies. */
        for (int split = PL_SPLIT_VALID; split <= PL_SPLIT_TEST; split++) {
            pl_config *ev = NULL;
            if (pl_config_split(cfg, split, &ev) == PL_OK) {
                pl_config *c2 = pl__config_clone(ev);
                if (ev->n_sources <= 64) pl__config_weights(ev, 0, w);
                pl_config_free(c2);
            }
            pl_config_free(ev);
        }
    }
    pl_config_free(cfg);
    return 0;
}
