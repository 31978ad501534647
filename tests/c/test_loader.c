/*
 * Embedded loader: batches, determinism and resume.
 *  - every micro-batch equals a reference built from the planner's plan and
 *    the fixture's token formula (token value == source base + position):
 *    input_ids, labels (next token within the document, -100 at its end and
 *    on padding), loss_mask, position_ids, cu_seqlens, max_seqlen, the source
 *    of every segment;
 *  - threads and prefetch never change the batches;
 *  - resume from any consumed position (mid-step too, with prefetched but
 *    unconsumed batches, and from a resumed run) equals the uninterrupted run;
 *  - changing weights at resume repeats and skips no document in its epoch;
 *  - changing weights, the schedule or the sources at a mid-step resume
 *    finishes the step as first planned and applies them from the next step
 *    (every batch equals a run changed at that step boundary); version-1
 *    blobs still load, and refuse only that case;
 *  - a changed fingerprint field and a corrupt blob are PL_ESTATE;
 *  - dp may change at a step boundary and keeps step membership;
 *  - a retained batch keeps its contents across many later steps;
 *  - train_steps ends iteration with PL_DONE; errors name the file.
 */
#include "corpus.h"
#include "planner/planner.h"

static const char *BASE = "seq_length: 64\nglobal_batch_size: 8\nmicro_batch_size: 2\n"
                          "topology: {dp: 2}\nseed: 11\n";

static uint64_t batch_hash(const pl_batch *b) {
    size_t n = (size_t)(b->rows * b->cols), es = pl_dtype_size(b->dtype);
    uint64_t h = pl__hash64(b->input_ids, n * es, (uint64_t)b->step);
    h = pl__hash64(b->labels, n * es, h);
    h = pl__hash64(b->loss_mask, n * sizeof(float), h);
    h = pl__hash64(b->position_ids, n * sizeof(int64_t), h);
    h = pl__hash64(b->cu_seqlens, (size_t)b->n_cu_seqlens * sizeof(int32_t), h);
    return pl__hash64(&b->max_seqlen, sizeof b->max_seqlen, h);
}

static pl_loader *make_loader(pl_config *cfg, int threads, int prefetch,
                              const int64_t *ranks, int64_t nranks) {
    pl_loader_options o = {PL_LOADER_OPTIONS_VERSION, ranks, nranks, threads, prefetch};
    pl_loader *l = NULL;
    int rc = pl_loader_create(cfg, &o, &l);
    if (rc) fprintf(stderr, "loader: %s\n", pl_loader_errmsg(l));
    CHECK_OK(rc);
    return l;
}

/* Consume steps [0, steps) for all dp ranks, hashing each micro-batch into
 * h[(step * dp + r) * nmb + mb]. */
static void run_hashes(pl_loader *l, int64_t from_k, int64_t to_k, int64_t dp,
                       int64_t nmb, uint64_t *h) {
    for (int64_t k = from_k; k < to_k; k++) {
        int64_t step = k / nmb, mb = k % nmb;
        for (int64_t r = 0; r < dp; r++) {
            const pl_batch *b = NULL;
            int rc = pl_loader_next(l, r, &b);
            if (rc) {
                fprintf(stderr, "next: %s\n", pl_loader_errmsg(l));
                CHECK_OK(rc);
                return;
            }
            CHECK_EQ_I64(b->step, step);
            CHECK_EQ_I64(b->micro_batch, mb);
            h[(step * dp + r) * nmb + mb] = batch_hash(b);
        }
    }
}

/* Reference check of one batch against its plan. */
static void check_batch(const corpus *c, const pl_plan *pl, const pl_batch *b,
                        int64_t r, int64_t mb) {
    const int64_t S = pl->seq_length;
    const int64_t *ids = b->input_ids, *lab = b->labels;
    int64_t cu = 0, max_seg = 0;
    CHECK_EQ_I64(b->cu_seqlens[0], 0);
    int64_t tokens = 0;
    for (int64_t row = 0; row < b->rows; row++) {
        int64_t q = pl->rank_sequences[(r * pl->micro_batches_per_rank + mb) * b->rows + row];
        int64_t p = row * S;
        for (int64_t j = pl->seq_offsets[q]; j < pl->seq_offsets[q + 1]; j++) {
            const pl_chunk *ch = &pl->chunks[j];
            int s = ch->source;
            for (int64_t t = 0; t < ch->length; t++) {
                int64_t want = corpus_token(c, s, ch->index, ch->offset + t);
                if (ids[p + t] != want) {
                    CHECK_EQ_I64(ids[p + t], want);
                    return;
                }
                int last = t == ch->length - 1;
                int doc_end = ch->offset + ch->length == c->len[s][ch->index];
                int64_t want_label = last && doc_end ? -100 : want + 1;
                CHECK_EQ_I64(lab[p + t], want_label);
                CHECK(b->loss_mask[p + t] == (want_label == -100 ? 0.0f : 1.0f));
                CHECK_EQ_I64(b->position_ids[p + t], t);
            }
            CHECK_EQ_I64(b->segment_sources[cu], s); /* where the segment comes from */
            CHECK_EQ_I64(b->cu_seqlens[++cu], p + ch->length);
            if (ch->length > max_seg) max_seg = ch->length;
            p += ch->length;
            tokens += ch->length;
        }
        if (p < (row + 1) * S) { /* padding segment */
            for (int64_t t = p; t < (row + 1) * S; t++) {
                CHECK_EQ_I64(ids[t], 0);
                CHECK_EQ_I64(lab[t], -100);
                CHECK(b->loss_mask[t] == 0.0f);
            }
            CHECK_EQ_I64(b->segment_sources[cu], -1);
            CHECK_EQ_I64(b->cu_seqlens[++cu], (row + 1) * S);
            if ((row + 1) * S - p > max_seg) max_seg = (row + 1) * S - p;
        }
    }
    CHECK_EQ_I64(b->n_cu_seqlens, cu + 1);
    CHECK_EQ_I64(b->max_seqlen, max_seg);
    CHECK_EQ_I64(b->tokens, tokens);
}

static void test_reference(corpus *c) {
    pl_config *cfg = corpus_config(c, BASE, NULL);
    pl_loader *l = make_loader(cfg, 2, 3, NULL, 0);
    pl_source *src[NSRC];
    for (int s = 0; s < NSRC; s++) CHECK_OK(pl__config_open_source(cfg, s, &src[s]));
    pl_planner *p = NULL;
    CHECK_OK(pl_planner_create(cfg, src, NSRC, &p));
    for (int step = 0; step < 12; step++) {
        pl_plan *pl = NULL;
        CHECK_OK(pl_planner_next(p, &pl));
        for (int64_t mb = 0; mb < pl->micro_batches_per_rank; mb++)
            for (int64_t r = 0; r < 2; r++) {
                const pl_batch *b = NULL;
                CHECK_OK(pl_loader_next(l, r, &b));
                CHECK_EQ_I64(b->dp_rank, r);
                CHECK_EQ_I64(b->rows, 2);
                CHECK_EQ_I64(b->cols, 64);
                CHECK(b->fields == PL_FIELD_ALL);
                check_batch(c, pl, b, r, mb);
            }
        pl_plan_free(pl);
    }
    pl_planner_free(p);
    for (int s = 0; s < NSRC; s++) pl_source_free(src[s]);
    pl_loader_free(l);
    pl_config_free(cfg);
}

static void test_threads_invariance(corpus *c) {
    pl_config *cfg = corpus_config(c, BASE, NULL);
    const int64_t steps = 15, dp = 2, nmb = 2;
    uint64_t ref[15 * 2 * 2], h[15 * 2 * 2];
    pl_loader *l = make_loader(cfg, 1, 1, NULL, 0);
    run_hashes(l, 0, steps * nmb, dp, nmb, ref);
    pl_loader_free(l);
    const int th[3] = {2, 3, 4}, pf[3] = {2, 7, 16};
    for (int i = 0; i < 3; i++) {
        memset(h, 0, sizeof h);
        l = make_loader(cfg, th[i], pf[i], NULL, 0);
        run_hashes(l, 0, steps * nmb, dp, nmb, h);
        pl_loader_free(l);
        CHECK(memcmp(h, ref, sizeof h) == 0);
    }
    /* A loader serving only rank 1 gives rank 1 the same batches. */
    int64_t one = 1;
    l = make_loader(cfg, 2, 4, &one, 1);
    for (int64_t k = 0; k < steps * nmb; k++) {
        const pl_batch *b = NULL;
        CHECK_OK(pl_loader_next(l, 1, &b));
        CHECK(batch_hash(b) == ref[((k / nmb) * dp + 1) * nmb + k % nmb]);
    }
    const pl_batch *b = NULL;
    CHECK_EQ_I64(pl_loader_next(l, 0, &b), PL_ERANGE);
    pl_loader_free(l);
    pl_config_free(cfg);
}

/* The loader, its pipeline and planner share one frozen copy of the config:
 * changing or freeing the caller's config does not reach a running loader; a
 * loader made from another loader's config (the shared copy) gives the same
 * batches and outlives the first. */
static void test_shared_config(corpus *c) {
    pl_config *cfg = corpus_config(c, BASE, NULL);
    const int64_t steps = 6, dp = 2, nmb = 2;
    uint64_t ref[6 * 2 * 2], h[6 * 2 * 2], other[6 * 2 * 2];
    pl_loader *l = make_loader(cfg, 2, 2, NULL, 0);
    run_hashes(l, 0, steps * nmb, dp, nmb, ref);
    pl_loader_free(l);

    l = make_loader(cfg, 2, 2, NULL, 0);
    CHECK_OK(pl_config_set(cfg, "seed", "12")); /* the caller's copy only */
    int64_t seed = 0;
    CHECK_OK(pl_config_get_int(pl_loader_config(l), "seed", &seed));
    CHECK_EQ_I64(seed, 11);
    pl_loader *l2 = make_loader((pl_config *)pl_loader_config(l), 1, 1, NULL, 0);
    pl_config_free(cfg); /* the loaders keep theirs */
    run_hashes(l, 0, steps * nmb, dp, nmb, h);
    CHECK(memcmp(h, ref, sizeof h) == 0);
    pl_loader_free(l); /* l2 still holds the shared copy */
    memset(h, 0, sizeof h);
    run_hashes(l2, 0, steps * nmb, dp, nmb, h);
    CHECK(memcmp(h, ref, sizeof h) == 0);
    CHECK_OK(pl_config_get_int(pl_loader_config(l2), "seed", &seed));
    CHECK_EQ_I64(seed, 11);
    pl_loader_free(l2);

    /* the changed seed gives other batches (the check above can fail) */
    cfg = corpus_config(c, BASE, NULL);
    CHECK_OK(pl_config_set(cfg, "seed", "12"));
    l = make_loader(cfg, 2, 2, NULL, 0);
    run_hashes(l, 0, steps * nmb, dp, nmb, other);
    CHECK(memcmp(other, ref, sizeof ref) != 0);
    pl_loader_free(l);
    pl_config_free(cfg);
}

static void test_resume(corpus *c) {
    pl_config *cfg = corpus_config(c, BASE, NULL);
    const int64_t steps = 16, dp = 2, nmb = 2, K = steps * nmb;
    uint64_t ref[16 * 2 * 2];
    pl_loader *l = make_loader(cfg, 2, 4, NULL, 0);
    run_hashes(l, 0, K, dp, nmb, ref);
    pl_loader_free(l);
    /* Cut at many positions, including mid-step ones. */
    for (int64_t cut = 0; cut <= K; cut += 3) {
        uint64_t h[16 * 2 * 2];
        memset(h, 0, sizeof h);
        l = make_loader(cfg, 3, 5, NULL, 0);
        run_hashes(l, 0, cut, dp, nmb, h);
        size_t n = 0;
        CHECK_OK(pl_loader_get_state(l, NULL, 0, &n));
        void *blob = malloc(n);
        CHECK_OK(pl_loader_get_state(l, blob, n, &n));
        pl_loader_free(l);
        /* Resume in a fresh loader; then cut once more and resume again. */
        l = make_loader(cfg, 1, 2, NULL, 0);
        CHECK_OK(pl_loader_set_state(l, blob, n));
        int64_t mid = cut + (K - cut) / 2;
        run_hashes(l, cut, mid, dp, nmb, h);
        size_t n2 = 0;
        CHECK_OK(pl_loader_get_state(l, NULL, 0, &n2));
        void *blob2 = malloc(n2);
        CHECK_OK(pl_loader_get_state(l, blob2, n2, &n2));
        pl_loader_free(l);
        l = make_loader(cfg, 2, 3, NULL, 0);
        CHECK_OK(pl_loader_set_state(l, blob2, n2));
        run_hashes(l, mid, K, dp, nmb, h);
        pl_loader_free(l);
        CHECK(memcmp(h, ref, sizeof h) == 0);
        free(blob);
        free(blob2);
    }
    /* set_state on a running loader, going backwards. */
    l = make_loader(cfg, 2, 4, NULL, 0);
    uint64_t h[16 * 2 * 2];
    run_hashes(l, 0, 10, dp, nmb, h);
    size_t n = 0;
    CHECK_OK(pl_loader_get_state(l, NULL, 0, &n));
    void *blob = malloc(n);
    CHECK_OK(pl_loader_get_state(l, blob, n, &n));
    run_hashes(l, 10, 20, dp, nmb, h);
    CHECK_OK(pl_loader_set_state(l, blob, n));
    memset(h, 0, sizeof h);
    run_hashes(l, 10, K, dp, nmb, h);
    CHECK(memcmp(h + 10 * dp, ref + 10 * dp, (size_t)(K - 10) * (size_t)dp * sizeof *h) == 0);
    pl_loader_free(l);
    free(blob);
    pl_config_free(cfg);
}

/* Get the state blob after consuming k micro-batches of every rank. */
static void *state_after(pl_config *cfg, int64_t k, int64_t dp, size_t *n) {
    pl_loader *l = make_loader(cfg, 2, 4, NULL, 0);
    uint64_t *h = calloc((size_t)(k + 2) * (size_t)dp * 4, sizeof *h);
    run_hashes(l, 0, k, dp, 2, h);
    free(h);
    CHECK_OK(pl_loader_get_state(l, NULL, 0, n));
    void *blob = malloc(*n);
    CHECK_OK(pl_loader_get_state(l, blob, *n, n));
    pl_loader_free(l);
    return blob;
}

static void test_fingerprint(corpus *c) {
    pl_config *cfg = corpus_config(c, BASE, NULL);
    size_t n = 0;
    void *blob = state_after(cfg, 5, 2, &n);
    struct {
        const char *key, *value, *field;
    } cases[] = {{"seq_length", "32", "seq_length"},
                 {"global_batch_size", "16", "global_batch_size"},
                 {"micro_batch_size", "1", "micro_batch_size"},
                 {"packing", "concat_chunk", "packing"},
                 {"long_documents", "truncate", "long_documents"},
                 {"seed", "12", "seed"}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        pl_config *c2 = pl__config_clone(cfg);
        CHECK_OK(pl_config_set(c2, cases[i].key, cases[i].value));
        pl_loader *l = make_loader(c2, 1, 1, NULL, 0);
        CHECK_EQ_I64(pl_loader_set_state(l, blob, n), PL_ESTATE);
        CHECK(strstr(pl_loader_errmsg(l), cases[i].field) != NULL);
        pl_loader_free(l);
        pl_config_free(c2);
    }
    /* A changed source path is refused, naming the source. */
    {
        char y[2048];
        snprintf(y, sizeof y, "%s\nsources:\n"
                 "  - {name: s0, type: megatron, path: %s/src1, weight: 0.5}\n"
                 "  - {name: s1, type: megatron, path: %s/src1, weight: 0.3}\n"
                 "  - {name: s2, type: megatron, path: %s/src2, weight: 0.2}\n",
                 BASE, c->dir, c->dir, c->dir);
        pl_config *c2 = NULL;
        CHECK_OK(pl_config_parse_string(y, strlen(y), "t", &c2));
        pl_loader *l = make_loader(c2, 1, 1, NULL, 0);
        CHECK_EQ_I64(pl_loader_set_state(l, blob, n), PL_ESTATE);
        CHECK(strstr(pl_loader_errmsg(l), "s0") != NULL);
        pl_loader_free(l);
        pl_config_free(c2);
    }
    /* Corrupt blobs: a flipped byte (CRC), truncation, bad magic. */
    pl_loader *l = make_loader(cfg, 1, 1, NULL, 0);
    unsigned char *bad = malloc(n);
    memcpy(bad, blob, n);
    bad[n / 2] ^= 0x40;
    CHECK_EQ_I64(pl_loader_set_state(l, bad, n), PL_ESTATE);
    CHECK(strstr(pl_loader_errmsg(l), "CRC") != NULL);
    CHECK_EQ_I64(pl_loader_set_state(l, blob, n - 7), PL_ESTATE);
    memcpy(bad, blob, n);
    bad[0] = 'X';
    CHECK_EQ_I64(pl_loader_set_state(l, bad, n), PL_ESTATE);
    CHECK(strstr(pl_loader_errmsg(l), "magic") != NULL);
    /* A forged blob with a correct CRC but a negative step is refused. */
    {
        memcpy(bad, blob, n);
        int64_t neg = -1;
        memcpy(bad + 24, &neg, 8);
        uint32_t crc = pl__crc32(0, bad, n - 4);
        memcpy(bad + n - 4, &crc, 4);
        pl_loader *l2 = make_loader(cfg, 1, 1, NULL, 0);
        CHECK_EQ_I64(pl_loader_set_state(l2, bad, n), PL_ESTATE);
        CHECK(strstr(pl_loader_errmsg(l2), "malformed") != NULL);
        pl_loader_free(l2);
    }
    /* A refused blob leaves a running loader where it was. */
    {
        pl_loader *l2 = make_loader(cfg, 2, 3, NULL, 0);
        uint64_t hh[64];
        run_hashes(l2, 0, 3, 2, 2, hh); /* consumed k = 0, 1, 2 */
        memcpy(bad, blob, n);
        bad[0] = 'X';
        CHECK_EQ_I64(pl_loader_set_state(l2, bad, n), PL_ESTATE);
        const pl_batch *b2 = NULL;
        CHECK_OK(pl_loader_next(l2, 0, &b2));
        CHECK_EQ_I64(b2->step, 1);
        CHECK_EQ_I64(b2->micro_batch, 1);
        pl_loader_free(l2);
    }
    /* After failed set_state calls the loader still works from where it was. */
    CHECK_OK(pl_loader_set_state(l, blob, n));
    const pl_batch *b = NULL;
    CHECK_OK(pl_loader_next(l, 0, &b));
    CHECK_EQ_I64(b->step, 2);
    CHECK_EQ_I64(b->micro_batch, 1);
    free(bad);
    pl_loader_free(l);
    /* dp may change at a step boundary but not mid-step. */
    pl_config *c4 = pl__config_clone(cfg);
    CHECK_OK(pl_config_set(c4, "topology.dp", "4"));
    CHECK_OK(pl_config_set(c4, "micro_batch_size", "2")); /* 8 / (4*2) = 1 */
    l = make_loader(c4, 1, 1, NULL, 0);
    CHECK_EQ_I64(pl_loader_set_state(l, blob, n), PL_ESTATE); /* mid-step */
    CHECK(strstr(pl_loader_errmsg(l), "dp") != NULL);
    size_t n8 = 0;
    void *blob8 = state_after(cfg, 8, 2, &n8); /* step 4 boundary */
    CHECK_OK(pl_loader_set_state(l, blob8, n8));
    pl_loader_free(l);
    free(blob8);
    pl_config_free(c4);
    free(blob);
    pl_config_free(cfg);
}

/* Elastic: a state saved at dp=2 loaded at dp=1 keeps each step's member
 * chunks (the multiset of tokens per step). */
static void test_elastic(corpus *c) {
    pl_config *c2 = corpus_config(c, BASE, NULL);
    pl_config *c1 = pl__config_clone(c2);
    CHECK_OK(pl_config_set(c1, "topology.dp", "1"));
    size_t n = 0;
    void *blob = state_after(c2, 6, 2, &n); /* after step 2 */
    /* Sum of tokens per step over all ranks: dp=2 run vs dp=1 resumed. */
    pl_loader *a = make_loader(c2, 2, 2, NULL, 0);
    CHECK_OK(pl_loader_set_state(a, blob, n));
    pl_loader *b = make_loader(c1, 2, 2, NULL, 0);
    CHECK_OK(pl_loader_set_state(b, blob, n));
    for (int step = 3; step < 8; step++) {
        uint64_t sa = 0, sb = 0;
        for (int mb = 0; mb < 2; mb++)
            for (int r = 0; r < 2; r++) {
                const pl_batch *x = NULL;
                CHECK_OK(pl_loader_next(a, r, &x));
                CHECK_EQ_I64(x->step, step);
                const int64_t *ids = x->input_ids;
                for (int64_t t = 0; t < x->rows * x->cols; t++)
                    if (x->loss_mask[t] != 0 || x->labels != NULL) sa += (uint64_t)ids[t] * 2654435761u;
            }
        for (int mb = 0; mb < 4; mb++) {
            const pl_batch *x = NULL;
            CHECK_OK(pl_loader_next(b, 0, &x));
            CHECK_EQ_I64(x->step, step);
            const int64_t *ids = x->input_ids;
            for (int64_t t = 0; t < x->rows * x->cols; t++)
                if (x->loss_mask[t] != 0 || x->labels != NULL) sb += (uint64_t)ids[t] * 2654435761u;
        }
        CHECK(sa == sb);
    }
    pl_loader_free(a);
    pl_loader_free(b);
    free(blob);
    pl_config_free(c1);
    pl_config_free(c2);
}

/* Weights change at resume: within an epoch no document starts twice and,
 * over a full epoch, none is skipped. */
static void test_weights_change(corpus *c) {
    const char *wa[NSRC] = {"0.7", "0.2", "0.1"};
    const char *wb[NSRC] = {"0.1", "0.2", "0.7"};
    pl_config *ca = corpus_config(c, "seq_length: 64\nglobal_batch_size: 4\nmicro_batch_size: 1\nseed: 3", wa);
    pl_config *cb = corpus_config(c, "seq_length: 64\nglobal_batch_size: 4\nmicro_batch_size: 1\nseed: 3", wb);
    /* Record (source, index, offset) of every chunk via the plans the two
       loaders' planners make: run A 10 steps, resume B from A's state. */
    pl_loader *a = make_loader(ca, 1, 1, NULL, 0);
    for (int k = 0; k < 40; k++) {
        const pl_batch *x = NULL;
        CHECK_OK(pl_loader_next(a, 0, &x));
    }
    size_t n = 0;
    CHECK_OK(pl_loader_get_state(a, NULL, 0, &n));
    void *blob = malloc(n);
    CHECK_OK(pl_loader_get_state(a, blob, n, &n));
    pl_loader_free(a);
    /* Replay with planners: A's first 10 steps, then B from the blob. */
    pl_source *src[NSRC];
    for (int s = 0; s < NSRC; s++) CHECK_OK(pl__config_open_source(ca, s, &src[s]));
    int64_t *tok[NSRC];
    for (int s = 0; s < NSRC; s++) tok[s] = calloc((size_t)c->n[s], sizeof(int64_t));
    pl_planner *pa = NULL, *pb = NULL;
    CHECK_OK(pl_planner_create(ca, src, NSRC, &pa));
    for (int step = 0; step < 10; step++) {
        pl_plan *pl = NULL;
        CHECK_OK(pl_planner_next(pa, &pl));
        for (int64_t j = 0; j < pl->n_chunks; j++)
            tok[pl->chunks[j].source][pl->chunks[j].index] += pl->chunks[j].length;
        pl_plan_free(pl);
    }
    CHECK_OK(pl_planner_create(cb, src, NSRC, &pb));
    CHECK_OK(pl_planner_set_state(pb, blob, n));
    CHECK_EQ_I64(pb->step, 10);
    /* Targets restarted: deficits are zero at the resume step. */
    for (int s = 0; s < NSRC; s++)
        CHECK(pb->src[s].target == (pl__i128)pb->src[s].drawn_tokens << PL__TBITS);
    /* The chunks A carried into step 10 are placed by B's plans. */
    int over = 0;
    for (int step = 10; step < 400 && pb->src[2].epoch == 0; step++) {
        pl_plan *pl = NULL;
        CHECK_OK(pl_planner_next(pb, &pl));
        for (int64_t j = 0; j < pl->n_chunks; j++) {
            const pl_chunk *ch = &pl->chunks[j];
            if (pb->src[ch->source].epoch == 0 || ch->source != 2)
                tok[ch->source][ch->index] += ch->length;
        }
        pl_plan_free(pl);
    }
    /* Source 2 finished its first epoch under mixed weights: every document
       exactly once (chunks of epoch 1 were excluded above; a chunk drawn in
       epoch 1 has epoch > 0 when this step ends, so count by tokens). */
    CHECK(pb->src[2].epoch >= 1);
    for (int64_t i = 0; i < c->n[2]; i++)
        if (tok[2][i] > c->len[2][i]) {
            over++;
            fprintf(stderr, "doc %lld: %lld tokens of %lld\n", (long long)i,
                    (long long)tok[2][i], (long long)c->len[2][i]);
        }
    CHECK_EQ_I64(over, 0);
    /* Source 0 (still in epoch 0 or 1): no document beyond its epochs. */
    for (int64_t i = 0; i < c->n[0]; i++)
        CHECK(tok[0][i] <= (pb->src[0].epoch + 1) * c->len[0][i]);
    pl_planner_free(pa);
    pl_planner_free(pb);
    for (int s = 0; s < NSRC; s++) {
        pl_source_free(src[s]);
        free(tok[s]);
    }
    free(blob);
    pl_config_free(ca);
    pl_config_free(cb);
}

/* A config of the corpus's sources 0 .. n-1 (n < NSRC: a source added later). */
static pl_config *config_n(const corpus *c, const char *extra, int n, const char *w[NSRC]) {
    char y[4096];
    int at = snprintf(y, sizeof y, "%s\nsources:\n", extra);
    for (int s = 0; s < n; s++)
        at += snprintf(y + at, sizeof y - (size_t)at,
                       "  - {name: s%d, type: megatron, path: %s/src%d, weight: %s}\n", s,
                       c->dir, s, w[s]);
    pl_config *cfg = NULL;
    CHECK_OK(pl_config_parse_string(y, strlen(y), "test", &cfg));
    return cfg;
}

static void *loader_blob(pl_loader *l, size_t *n) {
    CHECK_OK(pl_loader_get_state(l, NULL, 0, n));
    void *blob = malloc(*n);
    CHECK_OK(pl_loader_get_state(l, blob, *n, n));
    return blob;
}

static uint64_t plan_hash(const pl_plan *p) {
    uint64_t h = pl__hash64(p->chunks, (size_t)p->n_chunks * sizeof *p->chunks, 5);
    h = pl__hash64(p->seq_offsets, (size_t)(p->n_sequences + 1) * 8, h);
    return pl__hash64(p->rank_sequences, (size_t)p->n_sequences * 8, h);
}

/* The plan of the blob's step by a planner of cfg loaded from the blob, and
 * (out, if not NULL) that planner's state before planning it (cursor 0). */
static uint64_t planner_step_hash(pl_config *cfg, const void *blob, size_t n, void **out,
                                  size_t *nout) {
    int64_t ns = pl_config_num_sources(cfg);
    pl_source *src[NSRC];
    for (int64_t s = 0; s < ns; s++) CHECK_OK(pl__config_open_source(cfg, s, &src[s]));
    pl_planner *p = NULL;
    CHECK_OK(pl_planner_create(cfg, src, ns, &p));
    CHECK_OK(pl_planner_set_state(p, blob, n));
    if (out) {
        CHECK_OK(pl_planner_get_state(p, NULL, 0, nout));
        *out = malloc(*nout);
        CHECK_OK(pl_planner_get_state(p, *out, *nout, nout));
    }
    pl_plan *pl = NULL;
    CHECK_OK(pl_planner_next(p, &pl));
    uint64_t h = plan_hash(pl);
    pl_plan_free(pl);
    pl_planner_free(p);
    for (int64_t s = 0; s < ns; s++) pl_source_free(src[s]);
    return h;
}

/*
 * Config a until micro-batch `cut` of step s (0 < cut < nmb), state, resume
 * with config b.  The batches must be those of a run with a through step s
 * and b from step s+1 (a step-boundary resume), and differ from a run with a
 * throughout after step s; a second cut inside step s (a state taken while
 * the step is still planned with a's weights) gives the same; the final
 * states are the same bytes.
 */
static void mid_step_case(pl_config *ca, pl_config *cb, int64_t s, int64_t cut,
                          const char *what) {
    const int64_t dp = 2, T = 12;
    int64_t nmb = 0;
    CHECK_OK(pl_config_get_int(ca, "micro_batches_per_rank", &nmb));
    CHECK(cut > 0 && cut + 1 < nmb);
    const int64_t K = T * nmb, at = s * nmb + cut;
    size_t hn = (size_t)(K * dp);
    uint64_t *ref = calloc(hn, 8), *only_a = calloc(hn, 8), *h = calloc(hn, 8);
    /* a throughout */
    pl_loader *l = make_loader(ca, 2, 3, NULL, 0);
    run_hashes(l, 0, K, dp, nmb, only_a);
    pl_loader_free(l);
    /* reference: a through step s, b from the boundary of step s+1 */
    l = make_loader(ca, 2, 3, NULL, 0);
    run_hashes(l, 0, (s + 1) * nmb, dp, nmb, ref);
    size_t ne = 0;
    void *edge = loader_blob(l, &ne);
    pl_loader_free(l);
    l = make_loader(cb, 2, 3, NULL, 0);
    CHECK_OK(pl_loader_set_state(l, edge, ne));
    run_hashes(l, (s + 1) * nmb, K, dp, nmb, ref);
    size_t nr = 0;
    void *ref_end = loader_blob(l, &nr);
    pl_loader_free(l);
    /* the same data (a's weights) up to the boundary, other data after it:
       the comparison below can fail */
    CHECK(memcmp(ref, only_a, (size_t)((s + 1) * nmb * dp) * 8) == 0);
    int64_t differ = 0;
    for (size_t i = (size_t)((s + 1) * nmb * dp); i < hn; i++) differ += ref[i] != only_a[i];
    CHECK(differ > 0);
    /* mid-step: a until `at`, b from there, with a second cut inside step s */
    l = make_loader(ca, 2, 3, NULL, 0);
    run_hashes(l, 0, at, dp, nmb, h);
    size_t nm = 0;
    void *mid = loader_blob(l, &nm);
    pl_loader_free(l);
    l = make_loader(cb, 1, 2, NULL, 0);
    int rc = pl_loader_set_state(l, mid, nm);
    if (rc) fprintf(stderr, "%s: %s\n", what, pl_loader_errmsg(l));
    CHECK_OK(rc);
    run_hashes(l, at, at + 1, dp, nmb, h);
    size_t nm2 = 0;
    void *mid2 = loader_blob(l, &nm2);
    pl_loader_free(l);
    l = make_loader(cb, 2, 4, NULL, 0);
    CHECK_OK(pl_loader_set_state(l, mid2, nm2));
    run_hashes(l, at + 1, K, dp, nmb, h);
    size_t nf = 0;
    void *end = loader_blob(l, &nf);
    pl_loader_free(l);
    int64_t bad = 0;
    for (size_t i = 0; i < hn; i++) bad += h[i] != ref[i];
    if (bad) fprintf(stderr, "%s: %lld of %zu batches differ\n", what, (long long)bad, hn);
    CHECK_EQ_I64(bad, 0);
    CHECK(nf == nr && memcmp(end, ref_end, nr) == 0);
    /* The planner alone (the Ray deployment's planner keeps the states of
       step starts, cursor 0): loaded from the mid-step state with b, it
       plans step s as a did, and so does a planner loaded from its state,
       which says the step was begun under a's weights. */
    {
        void *z = NULL;
        size_t nz = 0;
        uint64_t want = planner_step_hash(ca, mid, nm, NULL, NULL);
        CHECK(planner_step_hash(cb, mid, nm, &z, &nz) == want);
        pl_state_info zi;
        CHECK_OK(pl_state_inspect(z, nz, &zi));
        CHECK_EQ_I64(zi.step, s);
        CHECK_EQ_I64(zi.micro_batch, 0);
        CHECK(planner_step_hash(cb, z, nz, NULL, NULL) == want);
        /* the same at the boundary: step s with b's weights, another plan */
        void *e0 = NULL;
        size_t ne0 = 0;
        (void)planner_step_hash(ca, mid, nm, &e0, &ne0);
        CHECK(planner_step_hash(cb, e0, ne0, NULL, NULL) != want);
        free(z);
        free(e0);
    }
    /* A mid-step state into another dp stays refused, weights changed or not. */
    pl_config *c4 = pl__config_clone(cb);
    CHECK_OK(pl_config_set(c4, "topology.dp", "4")); /* 2 micro-batches a rank */
    l = make_loader(c4, 1, 1, NULL, 0);
    CHECK_EQ_I64(pl_loader_set_state(l, mid, nm), PL_ESTATE);
    CHECK(strstr(pl_loader_errmsg(l), "dp") != NULL);
    pl_loader_free(l);
    pl_config_free(c4);
    free(ref);
    free(only_a);
    free(h);
    free(edge);
    free(ref_end);
    free(mid);
    free(mid2);
    free(end);
}

/* An older blob of the same state (the layout of src/planner/state.c): version 2
 * has the target as one double; version 1 also lacks the per-source step
 * weight, the flags word and the arrangement hash. */
static void *to_old(const unsigned char *b, size_t n, size_t *n1, uint32_t version) {
    unsigned char *o = malloc(n);
    size_t at = 96, w = 0;
    uint32_t ns;
    memcpy(&ns, b + at, 4);
    memcpy(o, b, at + 4);
    w = at + 4;
    at += 4;
    for (uint32_t j = 0; j < ns; j++) {
        uint32_t k;
        size_t from = at;
        memcpy(&k, b + at, 4);
        at += 4 + k;
        memcpy(&k, b + at, 4);
        at += 4 + k + 7 * 8; /* names, documents, 6 counters */
        memcpy(o + w, b + from, at - from);
        w += at - from;
        int64_t whole;
        uint64_t frac;
        memcpy(&whole, b + at, 8);
        memcpy(&frac, b + at + 8, 8);
        double t = (double)whole + (double)frac * 0x1p-64;
        memcpy(o + w, &t, 8);
        w += 8;
        at += 16;
        /* documents, since_yield, skipped (and in version 2 the weight) */
        size_t keep = version >= 2 ? 4 * 8 : 3 * 8;
        memcpy(o + w, b + at, keep);
        w += keep;
        at += 4 * 8;
    }
    /* carried chunks (and in version 2 the flags and hash), before the CRC */
    size_t rest = n - 4 - (version >= 2 ? 0 : 12) - at;
    memcpy(o + w, b + at, rest);
    w += rest;
    memcpy(o + 4, &version, 4);
    uint64_t total = w + 4;
    memcpy(o + 8, &total, 8);
    uint32_t crc = pl__crc32(0, o, w);
    memcpy(o + w, &crc, 4);
    *n1 = w + 4;
    return o;
}

static void *to_v1(const unsigned char *b, size_t n, size_t *n1) {
    return to_old(b, n, n1, 1);
}

static void test_weights_change_mid_step(corpus *c) {
    const char *x = "seq_length: 64\nglobal_batch_size: 16\nmicro_batch_size: 2\n"
                    "topology: {dp: 2}\nseed: 11\n"; /* 4 micro-batches per rank */
    const char *wa[NSRC] = {"0.6", "0.3", "0.1"}, *wb[NSRC] = {"0.1", "0.2", "0.7"};
    pl_config *ca = corpus_config(c, x, wa), *cb = corpus_config(c, x, wb);
    mid_step_case(ca, cb, 3, 1, "weights");
    mid_step_case(ca, cb, 5, 2, "weights, later cut");
    /* A schedule changed at resume (linear, then step interpolation). */
    char ya[1024], yb[1024];
    snprintf(ya, sizeof ya, "%sschedule:\n  points:\n"
             "    - {step: 0, weights: {s0: 0.8, s1: 0.2}}\n"
             "    - {step: 10, weights: {s1: 0.5, s2: 0.5}}\n", x);
    snprintf(yb, sizeof yb, "%sschedule:\n  interpolation: step\n  points:\n"
             "    - {step: 0, weights: {s0: 0.8, s1: 0.2}}\n"
             "    - {step: 5, weights: {s2: 1}}\n", x);
    pl_config *sa = corpus_config(c, ya, NULL), *sb = corpus_config(c, yb, NULL);
    mid_step_case(sa, sb, 4, 2, "schedule");
    /* Weights into a schedule whose points change at the interrupted step
       and the one after it. */
    snprintf(yb, sizeof yb, "%sschedule:\n  interpolation: step\n  points:\n"
             "    - {step: 0, weights: {s0: 1}}\n"
             "    - {step: 4, weights: {s1: 1}}\n"
             "    - {step: 5, weights: {s2: 1}}\n", x);
    pl_config *sc = corpus_config(c, yb, NULL);
    mid_step_case(ca, sc, 4, 1, "weights into a schedule");
    /* A source added at resume (it gets no share of the interrupted step). */
    const char *w2[NSRC] = {"0.7", "0.3", "0"};
    pl_config *c2 = config_n(c, x, 2, w2);
    mid_step_case(c2, cb, 3, 2, "source added");
    /* A source removed: refused, naming it (mid-step and at a boundary). */
    {
        size_t n = 0;
        pl_loader *l = make_loader(cb, 1, 1, NULL, 0);
        uint64_t hh[64];
        run_hashes(l, 0, 5, 2, 4, hh);
        void *blob = loader_blob(l, &n);
        pl_loader_free(l);
        pl_loader *l2 = make_loader(c2, 1, 1, NULL, 0);
        CHECK_EQ_I64(pl_loader_set_state(l2, blob, n), PL_ESTATE);
        CHECK(strstr(pl_loader_errmsg(l2), "'s2'") != NULL);
        pl_loader_free(l2);
        free(blob);
    }
    /* Version-1 and -2 blobs (floating-point targets): they load at a step
       boundary; in the middle of a step they are refused, saying why. */
    {
        const int64_t nmb = 4, dp = 2, K = 10 * nmb;
        uint64_t ref[10 * 2 * 4], h[10 * 2 * 4];
        pl_loader *l = make_loader(ca, 2, 3, NULL, 0);
        run_hashes(l, 0, K, dp, nmb, ref);
        pl_loader_free(l);
        l = make_loader(ca, 2, 3, NULL, 0);
        run_hashes(l, 0, 13, dp, nmb, h); /* step 3, micro-batch 1 */
        size_t n = 0, n1 = 0;
        unsigned char *b = loader_blob(l, &n);
        pl_loader_free(l);
        unsigned char *v1 = to_v1(b, n, &n1);
        pl_state_info si;
        CHECK_OK(pl_state_inspect(v1, n1, &si));
        CHECK_EQ_I64(si.version, 1);
        CHECK_EQ_I64(si.step, 3);
        CHECK_EQ_I64(si.micro_batch, 1);
        pl_state_source_info ss, s2;
        CHECK_OK(pl_state_source(v1, n1, 2, &ss));
        CHECK_OK(pl_state_source(b, n, 2, &s2));
        CHECK_EQ_I64(ss.drawn_tokens, s2.drawn_tokens);
        CHECK_EQ_I64(ss.skipped, s2.skipped);
        CHECK(ss.name_len == 2 && memcmp(ss.name, "s2", 2) == 0);
        /* Planned with floating-point targets: refused in the middle of a
           step (planned again by the exact rule it may hold other chunks),
           with its own weights as with other ones, in versions 1 and 2. */
        l = make_loader(ca, 1, 2, NULL, 0);
        CHECK_EQ_I64(pl_loader_set_state(l, v1, n1), PL_ESTATE);
        CHECK(strstr(pl_loader_errmsg(l), "floating-point") != NULL);
        CHECK(strstr(pl_loader_errmsg(l), "step boundary") != NULL);
        pl_loader_free(l);
        {
            size_t n2 = 0;
            unsigned char *v2 = to_old(b, n, &n2, 2);
            CHECK_OK(pl_state_inspect(v2, n2, &si));
            CHECK_EQ_I64(si.version, 2);
            CHECK_EQ_I64(si.micro_batch, 1);
            pl_state_source_info t2;
            CHECK_OK(pl_state_source(v2, n2, 2, &t2));
            CHECK_EQ_I64(t2.drawn_tokens, s2.drawn_tokens);
            CHECK(t2.target_tokens == s2.target_tokens);
            CHECK(t2.target_tokens > 0);
            l = make_loader(ca, 1, 2, NULL, 0);
            CHECK_EQ_I64(pl_loader_set_state(l, v2, n2), PL_ESTATE);
            CHECK(strstr(pl_loader_errmsg(l), "version-2") != NULL);
            pl_loader_free(l);
            free(v2);
        }
        (void)ref;
        (void)h;
        l = make_loader(cb, 1, 2, NULL, 0);
        CHECK_EQ_I64(pl_loader_set_state(l, v1, n1), PL_ESTATE);
        CHECK(strstr(pl_loader_errmsg(l), "version-1") != NULL);
        pl_loader_free(l);
        free(b);
        free(v1);
        /* at a step boundary, a version-1 blob takes other weights */
        l = make_loader(ca, 2, 3, NULL, 0);
        run_hashes(l, 0, 16, dp, nmb, h);
        b = loader_blob(l, &n);
        pl_loader_free(l);
        for (uint32_t ver = 1; ver <= 2; ver++) {
            v1 = to_old(b, n, &n1, ver);
            l = make_loader(cb, 1, 2, NULL, 0);
            CHECK_OK(pl_loader_set_state(l, v1, n1));
            pl_loader *l2 = make_loader(cb, 1, 2, NULL, 0);
            CHECK_OK(pl_loader_set_state(l2, b, n));
            for (int k = 0; k < 8; k++) {
                const pl_batch *p1 = NULL, *p2 = NULL;
                CHECK_OK(pl_loader_next(l, k % 2, &p1));
                CHECK_OK(pl_loader_next(l2, k % 2, &p2));
                CHECK(batch_hash(p1) == batch_hash(p2));
            }
            pl_loader_free(l);
            pl_loader_free(l2);
            free(v1);
        }
        free(b);
    }
    /* In the middle of a step, other arrangement settings are refused (the
       step's plan depends on them); at a step boundary they load. */
    {
        uint64_t hh[128];
        pl_loader *l = make_loader(ca, 2, 3, NULL, 0);
        run_hashes(l, 0, 13, 2, 4, hh);
        size_t nm = 0, ne = 0;
        void *mid = loader_blob(l, &nm);
        run_hashes(l, 13, 16, 2, 4, hh);
        void *edge = loader_blob(l, &ne);
        pl_loader_free(l);
        const char *kv[][2] = {{"balance", "karmarkar_karp"}, {"long_short.threshold", "20"}};
        for (int i = 0; i < 2; i++) {
            pl_config *cx = pl__config_clone(ca);
            CHECK_OK(pl_config_set(cx, kv[i][0], kv[i][1]));
            l = make_loader(cx, 1, 1, NULL, 0);
            CHECK_EQ_I64(pl_loader_set_state(l, mid, nm), PL_ESTATE);
            CHECK(strstr(pl_loader_errmsg(l), "balance, long_short") != NULL);
            CHECK_OK(pl_loader_set_state(l, edge, ne));
            const pl_batch *x = NULL;
            CHECK_OK(pl_loader_next(l, 0, &x));
            CHECK_EQ_I64(x->step, 4);
            pl_loader_free(l);
            pl_config_free(cx);
        }
        /* the sources in another order with other weights: refused mid-step */
        pl_config *rev = NULL;
        {
            char z[4096];
            int at = snprintf(z, sizeof z, "%s\nsources:\n", x);
            for (int s = NSRC - 1; s >= 0; s--)
                at += snprintf(z + at, sizeof z - (size_t)at,
                               "  - {name: s%d, type: megatron, path: %s/src%d, weight: %s}\n",
                               s, c->dir, s, wb[s]);
            CHECK_OK(pl_config_parse_string(z, strlen(z), "test", &rev));
        }
        l = make_loader(rev, 1, 1, NULL, 0);
        CHECK_EQ_I64(pl_loader_set_state(l, mid, nm), PL_ESTATE);
        CHECK(strstr(pl_loader_errmsg(l), "order") != NULL);
        CHECK_OK(pl_loader_set_state(l, edge, ne));
        pl_loader_free(l);
        pl_config_free(rev);
        free(mid);
        free(edge);
    }
    /* A forged flags word (an unknown bit) is a malformed blob. */
    {
        size_t n = 0;
        pl_loader *l = make_loader(ca, 1, 1, NULL, 0);
        uint64_t hh[64];
        run_hashes(l, 0, 5, 2, 4, hh);
        unsigned char *b = loader_blob(l, &n);
        uint32_t f = 2;
        memcpy(b + n - 16, &f, 4);
        uint32_t crc = pl__crc32(0, b, n - 4);
        memcpy(b + n - 4, &crc, 4);
        CHECK_EQ_I64(pl_loader_set_state(l, b, n), PL_ESTATE);
        CHECK(strstr(pl_loader_errmsg(l), "malformed") != NULL);
        pl_loader_free(l);
        free(b);
    }
    pl_config_free(ca);
    pl_config_free(cb);
    pl_config_free(sa);
    pl_config_free(sb);
    pl_config_free(sc);
    pl_config_free(c2);
}

static void test_retain_and_done(corpus *c) {
    pl_config *cfg = corpus_config(c, BASE, NULL);
    CHECK_OK(pl_config_set(cfg, "train_steps", "30"));
    pl_loader *l = make_loader(cfg, 2, 4, NULL, 0);
    const pl_batch *borrowed = NULL;
    CHECK_OK(pl_loader_next(l, 0, &borrowed));
    pl_batch *keep = pl_batch_retain(borrowed);
    CHECK(keep == borrowed);
    size_t bytes = (size_t)(keep->rows * keep->cols) * sizeof(int64_t);
    int64_t *copy = malloc(bytes);
    memcpy(copy, keep->input_ids, bytes);
    uint64_t h0 = batch_hash(keep);
    int64_t got = 1;
    for (;;) {
        int64_t r = got % 2;
        const pl_batch *b = NULL;
        int rc = pl_loader_next(l, r, &b);
        if (rc == PL_DONE) break;
        CHECK_OK(rc);
        if (rc) break;
        got++;
    }
    CHECK_EQ_I64(got, 30 * 2 * 2);
    CHECK(memcmp(copy, keep->input_ids, bytes) == 0);
    CHECK(batch_hash(keep) == h0);
    pl_loader_stats st = {.size = sizeof st};
    pl_source_summary sums[NSRC];
    CHECK_OK(pl_loader_get_stats(l, &st, sums, NSRC));
    CHECK_EQ_I64(st.steps, 30);
    CHECK_EQ_I64(st.micro_batches, 120);
    CHECK_EQ_I64(st.tokens + st.padding_tokens, 120 * 2 * 64);
    int64_t drawn = 0;
    for (int64_t s = 0; s < st.n_sources; s++) drawn += st.sources[s].tokens;
    CHECK(st.tokens <= drawn);
    pl_loader_free(l);
    /* The retained batch outlives its loader. */
    CHECK(memcmp(copy, keep->input_ids, bytes) == 0);
    pl_batch_release(keep);
    free(copy);
    pl_config_free(cfg);
}

/* int32 output, topology fields: middle PP stage gets cu_seqlens only, CP
 * ranks' slices reassemble the full rows. */
static void test_dtype_and_topology(corpus *c) {
    pl_config *full = corpus_config(c, "seq_length: 64\nglobal_batch_size: 4\nmicro_batch_size: 1\n"
                                       "dtype: int32\ntopology: {dp: 1}", NULL);
    pl_config *cfg = corpus_config(c, "seq_length: 64\nglobal_batch_size: 4\nmicro_batch_size: 1\n"
                                      "dtype: int32\ntopology: {dp: 1, pp: 3, cp: 2}", NULL);
    pl_loader *l = make_loader(cfg, 2, 2, NULL, 0);
    pl_rank_info ri[6];
    for (int64_t r = 0; r < 6; r++) CHECK_OK(pl_config_rank_info(cfg, r, &ri[r]));
    for (int k = 0; k < 8; k++) {
        const pl_batch *bs[6];
        for (int64_t r = 0; r < 6; r++) {
            CHECK_OK(pl_loader_next(l, r, &bs[r]));
            CHECK_EQ_I64(bs[r]->cols, 32);
            CHECK(bs[r]->dtype == PL_DTYPE_INT32);
            CHECK(bs[r]->fields == ri[r].fields);
            CHECK((bs[r]->input_ids != NULL) == ((ri[r].fields & PL_FIELD_INPUT_IDS) != 0));
            CHECK((bs[r]->labels != NULL) == ((ri[r].fields & PL_FIELD_LABELS) != 0));
            CHECK(bs[r]->cu_seqlens != NULL);
        }
        for (int64_t r = 0; r < 6; r++)
            if (ri[r].pp_rank == 1) CHECK(bs[r]->input_ids == NULL && bs[r]->labels == NULL);
        /* The two CP ranks' token totals add up to the batch's tokens. */
        int64_t cp0 = -1, cp1 = -1;
        for (int64_t r = 0; r < 6; r++)
            if (ri[r].pp_rank == 0) {
                if (ri[r].cp_rank == 0) cp0 = r; else cp1 = r;
            }
        CHECK(cp0 >= 0 && cp1 >= 0);
        if (cp0 >= 0 && cp1 >= 0) {
            /* Each segment of length 2P splits into 4 pieces of P/2: rank 0
               holds pieces 0 and 3, rank 1 pieces 1 and 2; position_ids
               tell each token's place within its segment. */
            const int32_t *cu0 = bs[cp0]->cu_seqlens, *cu1 = bs[cp1]->cu_seqlens;
            CHECK_EQ_I64(bs[cp0]->n_cu_seqlens, bs[cp1]->n_cu_seqlens);
            for (int64_t sgi = 0; sgi + 1 < bs[cp0]->n_cu_seqlens; sgi++) {
                int64_t len = cu0[sgi + 1] - cu0[sgi];
                CHECK_EQ_I64(len, cu1[sgi + 1] - cu1[sgi]);
                int64_t piece = len / 2;
                const int64_t *p0 = bs[cp0]->position_ids + cu0[sgi];
                const int64_t *p1 = bs[cp1]->position_ids + cu1[sgi];
                for (int64_t t = 0; t < piece; t++) {
                    CHECK_EQ_I64(p0[t], t);
                    CHECK_EQ_I64(p1[t], piece + t);
                    CHECK_EQ_I64(p1[piece + t], 2 * piece + t);
                    CHECK_EQ_I64(p0[piece + t], 3 * piece + t);
                }
            }
        }
    }
    pl_loader_free(l);
    pl_config_free(cfg);
    pl_config_free(full);
}

/* A document whose pointer runs past the .bin: fail names the file; skip
 * skips and counts it. */
static void test_bad_document(void) {
    const char *dir = pl_test_tmpdir();
    char prefix[512], path[600], y[2048];
    snprintf(prefix, sizeof prefix, "%s/bad", dir);
    int64_t lens[20];
    for (int i = 0; i < 20; i++) lens[i] = 10 + i;
    CHECK(plf_write_megatron(prefix, PL_DTYPE_INT32, 20, lens, 0) == 0);
    /* Corrupt the pointer of document 7 in the .idx. */
    snprintf(path, sizeof path, "%s.idx", prefix);
    FILE *f = fopen(path, "r+b");
    CHECK(f != NULL);
    if (!f) return;
    int64_t big = 1LL << 40;
    long off = 9 + 8 + 1 + 8 + 8 + 20 * 4 + 7 * 8;
    fseek(f, off, SEEK_SET);
    fwrite(&big, 8, 1, f);
    fclose(f);
    for (int skip = 0; skip < 2; skip++) {
        snprintf(y, sizeof y, "seq_length: 32\nglobal_batch_size: 4\non_error: %s\n"
                 "sources:\n  - {name: bad, type: megatron, path: %s, weight: 1}\n",
                 skip ? "skip" : "fail", prefix);
        pl_config *cfg = NULL;
        CHECK_OK(pl_config_parse_string(y, strlen(y), "t", &cfg));
        pl_loader *l = make_loader(cfg, 2, 2, NULL, 0);
        int rc = 0, n = 0;
        for (; n < 40 && rc == 0; n++) {
            const pl_batch *b = NULL;
            rc = pl_loader_next(l, 0, &b);
        }
        if (skip) {
            CHECK_OK(rc);
            pl_loader_stats st = {.size = sizeof st};
            pl_source_summary sums[NSRC];
            CHECK_OK(pl_loader_get_stats(l, &st, sums, NSRC));
            CHECK(st.skipped >= 1);
            CHECK(st.sources[0].skipped >= 1);
        } else {
            CHECK_EQ_I64(rc, PL_EBOUNDS);
            CHECK(strstr(pl_loader_errmsg(l), "bad.idx") != NULL ||
                  strstr(pl_loader_errmsg(l), "bad.bin") != NULL);
            const pl_batch *b = NULL;
            CHECK_EQ_I64(pl_loader_next(l, 0, &b), PL_ECLOSED);
        }
        pl_loader_free(l);
        pl_config_free(cfg);
    }
    /* TP peers served by one loader (as a Ray constructor serves a group):
     * each gets the failure at the same micro-batch as a loader of its own,
     * after the same batches, then PL_ECLOSED; before, the peer that came
     * second got PL_ECLOSED at once and lost the batches before it. */
    pl_config *cfg = NULL;
    int64_t alone[2] = {0, 0};
    for (int seed = 1; seed <= 20; seed++) { /* one where the bad one is not first */
        snprintf(y, sizeof y, "seed: %d\nseq_length: 32\nglobal_batch_size: 4\n"
                 "micro_batch_size: 1\ntopology: {tp: 2}\nsources:\n  - {name: bad, "
                 "type: megatron, path: %s, weight: 1}\n", seed, prefix);
        pl_config_free(cfg);
        cfg = NULL;
        CHECK_OK(pl_config_parse_string(y, strlen(y), "t", &cfg));
        for (int64_t r = 0; r < 2; r++) { /* a loader per rank */
            pl_loader *l = make_loader(cfg, 2, 2, &r, 1);
            const pl_batch *b = NULL;
            int64_t n = 0;
            while (n < 200 && pl_loader_next(l, r, &b) == PL_OK) n++;
            CHECK_EQ_I64(pl_loader_next(l, r, &b), PL_ECLOSED);
            alone[r] = n;
            pl_loader_free(l);
        }
        if (alone[0] >= 3) break;
    }
    CHECK(alone[0] >= 3 && alone[0] < 200);
    CHECK_EQ_I64(alone[0], alone[1]);
    int64_t both[2] = {0, 1};
    pl_loader *l = make_loader(cfg, 2, 2, both, 2);
    for (int64_t r = 0; r < 2; r++) { /* rank 0 to its failure, then rank 1 */
        const pl_batch *b = NULL;
        int64_t n = 0;
        int rc;
        while ((rc = pl_loader_next(l, r, &b)) == PL_OK) n++;
        CHECK_EQ_I64(rc, PL_EBOUNDS);
        CHECK_EQ_I64(n, alone[r]);
        CHECK(strstr(pl_loader_errmsg(l), "bad.idx") != NULL);
    }
    const pl_batch *b = NULL;
    CHECK_EQ_I64(pl_loader_next(l, 0, &b), PL_ECLOSED);
    CHECK_EQ_I64(pl_loader_next(l, 1, &b), PL_ECLOSED);
    pl_loader_free(l);
    pl_config_free(cfg);
}

/* A 2x2x2x2 (dp, pp, cp, tp) topology served by one loader: every rank gets
 * exactly the fields of its role; TP peers and PP stages share the batch;
 * the CP ranks' slices reassemble each sequence of the plan exactly. */
static void test_4d(corpus *c) {
    pl_config *cfg = corpus_config(c, "seq_length: 64\nglobal_batch_size: 8\nmicro_batch_size: 2\n"
                                      "topology: {dp: 2, pp: 2, cp: 2, tp: 2}\nseed: 4", NULL);
    CHECK_EQ_I64(pl_config_world_size(cfg), 16);
    pl_loader *l = make_loader(cfg, 2, 2, NULL, 0);
    pl_source *src[NSRC];
    for (int s = 0; s < NSRC; s++) CHECK_OK(pl__config_open_source(cfg, s, &src[s]));
    pl_planner *p = NULL;
    CHECK_OK(pl_planner_create(cfg, src, NSRC, &p));
    pl_rank_info ri[16];
    for (int64_t r = 0; r < 16; r++) CHECK_OK(pl_config_rank_info(cfg, r, &ri[r]));
    const int64_t S = 64, cols = 32;
    for (int step = 0; step < 6; step++) {
        pl_plan *pl = NULL;
        CHECK_OK(pl_planner_next(p, &pl));
        for (int64_t mb = 0; mb < 2; mb++) {
            const pl_batch *b[16];
            for (int64_t r = 0; r < 16; r++) {
                CHECK_OK(pl_loader_next(l, r, &b[r]));
                uint32_t want = PL_FIELD_CU_SEQLENS | PL_FIELD_MAX_SEQLEN;
                if (ri[r].pp_rank == 0) want |= PL_FIELD_INPUT_IDS | PL_FIELD_POSITION_IDS;
                if (ri[r].pp_rank == 1) want |= PL_FIELD_LABELS | PL_FIELD_LOSS_MASK;
                CHECK(b[r]->fields == want);
                CHECK((b[r]->input_ids != NULL) == ((want & PL_FIELD_INPUT_IDS) != 0));
                CHECK((b[r]->position_ids != NULL) == ((want & PL_FIELD_POSITION_IDS) != 0));
                CHECK((b[r]->labels != NULL) == ((want & PL_FIELD_LABELS) != 0));
                CHECK((b[r]->loss_mask != NULL) == ((want & PL_FIELD_LOSS_MASK) != 0));
                CHECK_EQ_I64(b[r]->dp_rank, ri[r].dp_rank);
                CHECK_EQ_I64(b[r]->cols, cols);
            }
            /* Reassemble each DP rank's rows from its two CP ranks (PP stage 0
               for input_ids, stage 1 for labels), TP rank 0. */
            for (int64_t d = 0; d < 2; d++) {
                int64_t in[2] = {-1, -1}, out[2] = {-1, -1};
                for (int64_t r = 0; r < 16; r++) {
                    if (ri[r].dp_rank != d || ri[r].tp_rank != 0) continue;
                    if (ri[r].pp_rank == 0) in[ri[r].cp_rank] = r;
                    else out[ri[r].cp_rank] = r;
                }
                const int64_t *i0 = b[in[0]]->input_ids, *i1 = b[in[1]]->input_ids;
                const int64_t *l0 = b[out[0]]->labels, *l1 = b[out[1]]->labels;
                const int32_t *cu = b[in[0]]->cu_seqlens;
                int64_t seg = 0, ok = 1;
                for (int64_t row = 0; row < 2; row++) {
                    int64_t q = pl->rank_sequences[(d * pl->micro_batches_per_rank + mb) * 2 + row];
                    /* The full row of the plan: chunks padded to 4, then pad. */
                    int64_t full[64], flab[64], fp = 0;
                    for (int64_t j = pl->seq_offsets[q]; j < pl->seq_offsets[q + 1]; j++) {
                        const pl_chunk *ch = &pl->chunks[j];
                        int64_t P = (ch->length + 3) / 4 * 4;
                        for (int64_t t = 0; t < P; t++) {
                            int real = t < ch->length;
                            full[fp + t] = real ? corpus_token(c, ch->source, ch->index, ch->offset + t) : 0;
                            int end = t == ch->length - 1 && (ch->flags & PL_CHUNK_DOC_END);
                            flab[fp + t] = real && !end ? corpus_token(c, ch->source, ch->index, ch->offset + t + 1) : -100;
                        }
                        fp += P;
                    }
                    for (; fp < S; fp++) {
                        full[fp] = 0;
                        flab[fp] = -100;
                    }
                    /* Walk this row's segments on the CP side. */
                    int64_t rebuilt[64], rlab[64], pos = 0;
                    while (pos < S) {
                        int64_t lo = cu[seg] - row * cols, len = cu[seg + 1] - cu[seg];
                        int64_t qq = len / 2; /* a quarter of the full segment */
                        for (int64_t t = 0; t < qq; t++) {
                            rebuilt[pos + t] = i0[row * cols + lo + t];
                            rebuilt[pos + qq + t] = i1[row * cols + lo + t];
                            rebuilt[pos + 2 * qq + t] = i1[row * cols + lo + qq + t];
                            rebuilt[pos + 3 * qq + t] = i0[row * cols + lo + qq + t];
                            rlab[pos + t] = l0[row * cols + lo + t];
                            rlab[pos + qq + t] = l1[row * cols + lo + t];
                            rlab[pos + 2 * qq + t] = l1[row * cols + lo + qq + t];
                            rlab[pos + 3 * qq + t] = l0[row * cols + lo + qq + t];
                        }
                        pos += 4 * qq;
                        seg++;
                        if (len == 0) break;
                    }
                    if (pos != S || memcmp(rebuilt, full, sizeof full) || memcmp(rlab, flab, sizeof flab))
                        ok = 0;
                }
                CHECK(ok);
                /* TP peers: the same memory. */
                for (int64_t r = 0; r < 16; r++)
                    for (int64_t r2 = 0; r2 < 16; r2++)
                        if (ri[r].dp_rank == ri[r2].dp_rank && ri[r].cp_rank == ri[r2].cp_rank &&
                            ri[r].pp_rank == ri[r2].pp_rank)
                            CHECK(b[r]->cu_seqlens == b[r2]->cu_seqlens);
            }
        }
        pl_plan_free(pl);
    }
    pl_planner_free(p);
    for (int s = 0; s < NSRC; s++) pl_source_free(src[s]);
    pl_loader_free(l);
    pl_config_free(cfg);
}

/* One thread serving two TP peers may run one far ahead of the other: the
 * lagging rank's batches are kept (the ring grows), nothing blocks, and both
 * ranks get the same batches. */
static void test_run_ahead(corpus *c) {
    pl_config *cfg = corpus_config(c, "seq_length: 64\nglobal_batch_size: 4\nmicro_batch_size: 1\n"
                                      "topology: {dp: 1, tp: 2}\nprefetch: 2\nthreads: 2", NULL);
    pl_loader *l = make_loader(cfg, 2, 2, NULL, 0);
    uint64_t h0[40];
    for (int k = 0; k < 40; k++) {
        const pl_batch *b = NULL;
        CHECK_OK(pl_loader_next(l, 0, &b));
        h0[k] = b ? batch_hash(b) : 0;
    }
    for (int k = 0; k < 40; k++) {
        const pl_batch *b = NULL;
        CHECK_OK(pl_loader_next(l, 1, &b));
        CHECK(b && batch_hash(b) == h0[k]);
    }
    /* The position is the lagging rank's: both at 40 now. */
    size_t n = 0;
    CHECK_OK(pl_loader_get_state(l, NULL, 0, &n));
    pl_loader_free(l);
    pl_config_free(cfg);
}

int main(void) {
    corpus c;
    corpus_make(&c, 64);
    test_reference(&c);
    test_threads_invariance(&c);
    test_shared_config(&c);
    test_resume(&c);
    test_fingerprint(&c);
    test_elastic(&c);
    test_weights_change(&c);
    test_weights_change_mid_step(&c);
    test_retain_and_done(&c);
    test_dtype_and_topology(&c);
    test_bad_document();
    test_4d(&c);
    test_run_ahead(&c);
    corpus_free(&c);
    TEST_END();
}
