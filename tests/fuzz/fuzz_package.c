/* libFuzzer target: the PLPK package (pl_package_inspect, then
 * pl_loader_push_package into an external loader of the package's DP rank,
 * standing at the package's own state blob, and every micro-batch of it). */
#include "fuzz_common.h"

/* A copy with the u64 length (offset 8) and the XXH3-64 tail resealed. */
static uint8_t *resealed_package(const uint8_t *data, size_t size) {
    if (size < 72) return NULL;
    uint8_t *b = malloc(size);
    memcpy(b, data, size);
    uint64_t n = size;
    memcpy(b + 8, &n, 8);
    uint64_t h = pl__hash64(b, size - 8, 0);
    memcpy(b + size - 8, &h, 8);
    return b;
}

static void push_and_drain(pl_config *cfg, const uint8_t *pkg, size_t size) {
    int64_t step = -1, dp = -1;
    if (pl_package_inspect(pkg, size, &step, &dp) != PL_OK) return;
    /* The package's state blob: after the 64-byte header, length at 40. */
    uint64_t sl = 0;
    memcpy(&sl, pkg + 40, 8);
    if (sl > size - 72) return;
    int64_t ranks[4], nr = 0, world = pl_config_world_size(cfg);
    for (int64_t r = 0; r < world && nr < 4; r++) {
        pl_rank_info ri;
        if (pl_config_rank_info(cfg, r, &ri) == PL_OK && ri.dp_rank == dp) ranks[nr++] = r;
    }
    if (nr == 0) return;
    pl_loader_options o = {PL_LOADER_OPTIONS_VERSION, ranks, nr, 1, 2, 1, 1, 0};
    pl_loader *l = NULL;
    if (pl_loader_create(cfg, &o, &l) != PL_OK) abort();
    if (pl_loader_set_state(l, pkg + 64, (size_t)sl) == PL_OK) {
        int64_t want = -1;
        if (pl_loader_want_step(l, 1000, &want) == PL_OK && want == step &&
            pl_loader_push_package(l, pkg, size) == PL_OK) {
            for (int64_t k = 0; k < 64; k++) {
                int done = 0;
                for (int64_t j = 0; j < nr; j++) {
                    const pl_batch *b = NULL;
                    /* The next step is never pushed: stop at the end of this one. */
                    int64_t w2 = -1;
                    int rc = pl_loader_want_step(l, 0, &w2);
                    if (rc == PL_OK) pl_loader_fail_step(l, w2, PL_EIO, "fuzz: no more");
                    rc = pl_loader_next(l, ranks[j], &b);
                    if (rc != PL_OK) done = 1;
                }
                if (done) break;
            }
        }
    }
    pl_loader_free(l);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static pl_config *cfg;
    fz_enter_tmpdir();
    if (!cfg) {
        fz_write_corpus();
        cfg = fz_config();
    }
    uint8_t *sealed = resealed_package(data, size);
    push_and_drain(cfg, data, size);
    if (sealed) push_and_drain(cfg, sealed, size);
    free(sealed);
    return 0;
}
