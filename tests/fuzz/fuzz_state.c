/* libFuzzer target: the PLST state blob, loaded into a planner over the
 * fixed corpus (with the loader's micro-batch count and dp, and as
 * pl_planner_set_state), then planning two steps from it; the input as a
 * packed copy (pl_state_unpack), and pack/unpack of every valid blob. */
#include "fuzz_common.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static pl_config *cfg;
    static pl_source *src[3];
    static pl_planner *p;
    fz_enter_tmpdir();
    if (!cfg) {
        fz_write_corpus();
        cfg = fz_config();
        for (int s = 0; s < 3; s++)
            if (pl__config_open_source(cfg, s, &src[s])) abort();
        if (pl_planner_create(cfg, src, 3, &p)) abort();
    }
    const int64_t dp = cfg->topology.dp;
    const int64_t nmb = cfg->global_batch_size / (dp * cfg->micro_batch_size);
    /* As given (length and CRC checks), then resealed (what lies behind). */
    uint8_t *sealed = fz_resealed(data, size);
    for (int pass = 0; pass < 2; pass++) {
        const uint8_t *in = pass ? sealed : data;
        if (!in) break;
        int64_t mb = 0;
        int rc = pl__state_decode(p, in, size, nmb, dp, &mb);
        if (rc == PL_OK && (mb < 0 || mb >= nmb)) abort();
        if (rc == PL_OK) rc = pl_planner_set_state(p, in, size);
        if (rc == PL_OK) {
            for (int k = 0; k < 2; k++) {
                pl_plan *plan = NULL;
                if (pl_planner_next(p, &plan) == PL_OK) pl_plan_free(plan);
            }
            size_t n = 0;
            pl_planner_get_state(p, NULL, 0, &n);
        }
    }
    free(sealed);
    /* As a packed copy ("PLSZ"): whatever unpacks is a valid blob. */
    size_t un = 0;
    if (pl_state_unpack(data, size, NULL, 0, &un) == PL_OK && un <= ((size_t)1 << 24)) {
        uint8_t *buf = malloc(un ? un : 1);
        pl_state_info si;
        if (buf && pl_state_unpack(data, size, buf, un, &un) == PL_OK &&
            pl_state_inspect(buf, un, &si) != PL_OK)
            abort();
        free(buf);
    }
    /* A valid blob packs and unpacks to itself. */
    pl_state_info si;
    if (pl_state_inspect(data, size, &si) == PL_OK) {
        size_t bound = 0, n = 0, back = 0;
        if (pl_state_pack(data, size, NULL, 0, &bound)) abort();
        uint8_t *z = malloc(bound), *out = malloc(size);
        if (!z || !out || pl_state_pack(data, size, z, bound, &n) ||
            pl_state_unpack(z, n, out, size, &back) || back != size ||
            memcmp(out, data, size) != 0)
            abort();
        free(z);
        free(out);
    }
    return 0;
}
