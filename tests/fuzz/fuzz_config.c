/* libFuzzer target: the YAML config parser (pl_config_parse_string) and the
 * accessors of a config it accepts. */
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
        pl_config *copy = pl__config_clone(cfg);
        double w[64];
        if (cfg->n_sources <= 64) pl__config_weights(cfg, 3, w);
        pl_config_free(copy);
    }
    pl_config_free(cfg);
    return 0;
}
