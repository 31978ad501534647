/* libFuzzer target: the PLPN plan blob (pl_plan_decode), then for every rank
 * and micro-batch pl_plan_reads and pl_constructor_build with payloads of
 * the right size, one payload too few, and a last payload one token short. */
#include "fuzz_common.h"

static void build_all(pl_constructor *k, const pl_config *cfg, const pl_plan *plan) {
    int64_t world = pl_config_world_size(cfg);
    for (int64_t r = 0; r < world + 1; r++) {
        pl_rank_info ri;
        int64_t dp_rank = pl_config_rank_info(cfg, r, &ri) == PL_OK ? ri.dp_rank : r;
        for (int64_t mb = 0; mb < plan->micro_batches_per_rank + 1 && mb < 64; mb++) {
            int64_t n = 0;
            if (pl_plan_reads(plan, dp_rank, mb, NULL, 0, &n) != PL_OK) continue;
            if (n > 4096) continue;
            pl_read *reads = calloc((size_t)n + 1, sizeof *reads);
            int64_t m = 0;
            if (pl_plan_reads(plan, dp_rank, mb, reads, n, &m) != PL_OK || m != n) abort();
            int64_t total = 0;
            for (int64_t j = 0; j < n; j++) total += reads[j].count;
            if (total <= (1 << 20)) {
                int64_t *tok = calloc((size_t)total + 1, sizeof *tok);
                const int64_t **pay = calloc((size_t)n + 1, sizeof *pay);
                int64_t *plen = calloc((size_t)n + 1, sizeof *plen);
                int64_t at = 0;
                for (int64_t j = 0; j < n; j++) {
                    for (int64_t t = 0; t < reads[j].count; t++) tok[at + t] = (int64_t)((uint64_t)reads[j].index + (uint64_t)t);
                    pay[j] = tok + at;
                    plen[j] = reads[j].count;
                    at += reads[j].count;
                }
                pl_batch *b = NULL;
                if (pl_constructor_build(k, plan, r, mb, pay, plen, n, &b) == PL_OK)
                    pl_batch_release(b);
                if (n > 0) {
                    b = NULL;
                    if (pl_constructor_build(k, plan, r, mb, pay, plen, n - 1, &b) == PL_OK)
                        abort(); /* too few payloads must be refused */
                    plen[n - 1]--;
                    if (pl_constructor_build(k, plan, r, mb, pay, plen, n, &b) == PL_OK)
                        abort(); /* a short payload must be refused */
                    if (pl_constructor_build(k, plan, r, mb, NULL, NULL, n, &b) == PL_OK)
                        abort();
                }
                free(plen);
                free(pay);
                free(tok);
            }
            free(reads);
        }
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static pl_config *cfg;
    static pl_constructor *k;
    fz_enter_tmpdir();
    if (!cfg) {
        fz_write_corpus();
        cfg = fz_config();
        if (pl_constructor_create(cfg, &k)) abort();
    }
    /* As given (length and CRC checks), then resealed (what lies behind). */
    uint8_t *sealed = fz_resealed(data, size);
    for (int pass = 0; pass < 2; pass++) {
        const uint8_t *in = pass ? sealed : data;
        if (!in) break;
        pl_plan *plan = NULL;
        if (pl_plan_decode(in, size, &plan) == PL_OK) {
            build_all(k, cfg, plan);
            size_t n = 0;
            if (pl_plan_encode(plan, NULL, 0, &n) != PL_OK || n != size) abort();
            pl_plan_free(plan);
        }
    }
    free(sealed);
    return 0;
}
