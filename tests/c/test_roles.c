/*
 * The roles one by one (the path of a multi-process deployment): a planner's
 * plans, encoded and decoded, read by pl_plan_reads + pl_source_read_many and
 * built by pl_constructor_build, give exactly the loader's batches for every
 * rank; corrupt plan bytes and missing payloads are errors.
 */
#include "corpus.h"
#include "planner/planner.h"

static int same_batch(const pl_batch *a, const pl_batch *b) {
    if (a->rows != b->rows || a->cols != b->cols || a->fields != b->fields ||
        a->n_cu_seqlens != b->n_cu_seqlens || a->max_seqlen != b->max_seqlen ||
        a->tokens != b->tokens || a->step != b->step || a->micro_batch != b->micro_batch ||
        a->step_loss_tokens != b->step_loss_tokens || a->rank_loss_tokens != b->rank_loss_tokens)
        return 0;
    size_t n = (size_t)(a->rows * a->cols), es = pl_dtype_size(a->dtype);
    if ((a->input_ids == NULL) != (b->input_ids == NULL)) return 0;
    if (a->input_ids && memcmp(a->input_ids, b->input_ids, n * es)) return 0;
    if (a->labels && memcmp(a->labels, b->labels, n * es)) return 0;
    if (a->loss_mask && memcmp(a->loss_mask, b->loss_mask, n * sizeof(float))) return 0;
    if (a->position_ids && memcmp(a->position_ids, b->position_ids, n * 8)) return 0;
    return memcmp(a->cu_seqlens, b->cu_seqlens, (size_t)a->n_cu_seqlens * 4) == 0;
}

int main(void) {
    corpus c;
    corpus_make(&c, 64);
    const char *cfgs[3] = {
        "seq_length: 64\nglobal_batch_size: 8\nmicro_batch_size: 2\ntopology: {dp: 2, cp: 2}\nbalance: greedy\nseed: 2",
        "seq_length: 64\nglobal_batch_size: 8\nmicro_batch_size: 1\ntopology: {dp: 4, pp: 2}\ndtype: int32\nseed: 8",
        "seq_length: 64\nglobal_batch_size: 8\nmicro_batch_size: 2\ntopology: {dp: 2, cp: 2}\n"
        "balance: variable_length\nbalance_window: 2\ncost: {preset: causal, a: 64}\nseed: 3"};
    for (int ci = 0; ci < 3; ci++) {
        pl_config *cfg = corpus_config(&c, cfgs[ci], NULL);
        int64_t world = pl_config_world_size(cfg);
        pl_loader *l = NULL;
        CHECK_OK(pl_loader_create(cfg, NULL, &l));
        pl_source *src[NSRC];
        for (int s = 0; s < NSRC; s++) CHECK_OK(pl__config_open_source(cfg, s, &src[s]));
        pl_planner *p = NULL;
        CHECK_OK(pl_planner_create(cfg, src, NSRC, &p));
        pl_constructor *k = NULL;
        CHECK_OK(pl_constructor_create(cfg, &k));
        int all_same = 1;
        for (int step = 0; step < 8; step++) {
            pl_plan *pl0 = NULL, *pl = NULL;
            CHECK_OK(pl_planner_next(p, &pl0));
            size_t n = 0;
            CHECK_OK(pl_plan_encode(pl0, NULL, 0, &n));
            unsigned char *bytes = malloc(n);
            CHECK_OK(pl_plan_encode(pl0, bytes, n, &n));
            CHECK_OK(pl_plan_decode(bytes, n, &pl));
            /* A flipped byte is refused. */
            bytes[n / 3] ^= 1;
            pl_plan *bad = NULL;
            CHECK_EQ_I64(pl_plan_decode(bytes, n, &bad), PL_EINVAL);
            CHECK(bad == NULL);
            free(bytes);
            for (int64_t mb = 0; mb < pl->micro_batches_per_rank; mb++)
                for (int64_t r = 0; r < world; r++) {
                    pl_rank_info ri;
                    CHECK_OK(pl_config_rank_info(cfg, r, &ri));
                    int64_t nr = 0;
                    CHECK_OK(pl_plan_reads(pl, ri.dp_rank, mb, NULL, 0, &nr));
                    pl_read *reads = calloc((size_t)nr, sizeof *reads);
                    CHECK_OK(pl_plan_reads(pl, ri.dp_rank, mb, reads, nr, &nr));
                    const int64_t **payloads = calloc((size_t)nr, sizeof *payloads);
                    int64_t *plen = calloc((size_t)nr + 1, sizeof *plen);
                    int64_t total = 0;
                    for (int64_t j = 0; j < nr; j++) total += reads[j].count;
                    int64_t *tokens = calloc((size_t)total + 1, sizeof *tokens);
                    /* One source loader per source: group reads by source. */
                    int64_t at = 0;
                    for (int64_t j = 0; j < nr; j++) {
                        CHECK_OK(pl_source_read_many(src[reads[j].source], &reads[j], 1, tokens + at));
                        payloads[j] = tokens + at;
                        plen[j] = reads[j].count;
                        at += reads[j].count;
                    }
                    pl_batch *built = NULL;
                    const pl_batch *ref = NULL;
                    CHECK_OK(pl_constructor_build(k, pl, r, mb, payloads, plen, nr, &built));
                    CHECK_OK(pl_loader_next(l, r, &ref));
                    if (built && ref && !same_batch(built, ref)) all_same = 0;
                    if (nr > 0) {
                        pl_batch *x = NULL;
                        CHECK_EQ_I64(pl_constructor_build(k, pl, r, mb, payloads, plen, nr - 1, &x), PL_EINVAL);
                        CHECK(strstr(pl_constructor_errmsg(k), "payloads") != NULL);
                        /* A payload shorter than its read is refused. */
                        plen[nr - 1]--;
                        CHECK_EQ_I64(pl_constructor_build(k, pl, r, mb, payloads, plen, nr, &x), PL_EINVAL);
                        CHECK(strstr(pl_constructor_errmsg(k), "needs") != NULL);
                        plen[nr - 1]++;
                    }
                    pl_batch_release(built);
                    free(tokens);
                    free(plen);
                    free(payloads);
                    free(reads);
                }
            pl_batch *x = NULL;
            CHECK_EQ_I64(pl_constructor_build(k, pl, world, 0, NULL, NULL, 0, &x), PL_ERANGE);
            pl_plan_free(pl0);
            pl_plan_free(pl);
        }
        CHECK(all_same);
        pl_constructor_free(k);
        pl_planner_free(p);
        for (int s = 0; s < NSRC; s++) pl_source_free(src[s]);
        pl_loader_free(l);
        pl_config_free(cfg);
    }
    /* read_many concatenates ranges. */
    {
        pl_config *cfg = corpus_config(&c, "seq_length: 64\nglobal_batch_size: 4", NULL);
        pl_source *s0 = NULL;
        CHECK_OK(pl__config_open_source(cfg, 0, &s0));
        pl_read rd[2] = {{0, 0, 3, 1, 2}, {0, 0, 5, 0, 3}};
        int64_t out[5];
        CHECK_OK(pl_source_read_many(s0, rd, 2, out));
        CHECK_EQ_I64(out[0], corpus_token(&c, 0, 3, 1));
        CHECK_EQ_I64(out[1], corpus_token(&c, 0, 3, 2));
        CHECK_EQ_I64(out[2], corpus_token(&c, 0, 5, 0));
        CHECK_EQ_I64(out[4], corpus_token(&c, 0, 5, 2));
        pl_read far = {0, 0, 3, c.len[0][3], 1};
        CHECK_EQ_I64(pl_source_read_many(s0, &far, 1, out), PL_ERANGE);
        pl_source_free(s0);
        pl_config_free(cfg);
    }
    corpus_free(&c);
    TEST_END();
}
