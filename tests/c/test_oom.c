/*
 * Out of memory, as SQLite's test_malloc.c tests it: a representative run
 * (parse a config, open its sources and read from them, create a loader,
 * take the batches of a few steps on every rank, save the state, load it
 * back, take more batches, free everything) is repeated with the n-th
 * allocation of the library failing, for every n from 1 until a run makes
 * fewer than n allocations (past the count of the run without failures).  Allocations go through the library's one hook
 * (pl__set_alloc_hooks), here one that counts them.
 *
 * The sources are a Megatron dataset, an llm.c shard, a flat file and a
 * JSONL file tokenized online by the byte tokenizer.  The embedded run goes
 * twice: with the default arrangement, and with balance: variable_length
 * over a balance_window of 2 steps (the state is then saved inside a
 * window).
 *
 * Each run must end in a clean error: a known negative status with a
 * message, from the call that met the failure, never a crash; every batch a
 * run returns before it stops must be the batch of the run without failures
 * (nothing swallowed silently); and nothing may leak (LeakSanitizer, under
 * `make test-asan`).  A second pass fails every allocation from the n-th on
 * (cleanup paths that allocate meet failures too).
 */
#include "common/common.h"
#include "fixtures.h"
#include "testutil.h"

#include <stdatomic.h>

/* ------------------------------------------------------------- the hook */

static atomic_long counter;      /* allocations so far in this run */
static long fail_at;             /* 0: none fails */
static int persistent;           /* 1: every allocation from fail_at on fails */
static atomic_int injected;      /* a failure was handed out */

static int should_fail(void) {
    long k = atomic_fetch_add(&counter, 1) + 1;
    if (fail_at && (k == fail_at || (persistent && k > fail_at))) {
        atomic_store(&injected, 1);
        return 1;
    }
    return 0;
}
static void *t_malloc(size_t n) { return should_fail() ? NULL : malloc(n); }
static void *t_calloc(size_t n, size_t s) { return should_fail() ? NULL : calloc(n, s); }
static void *t_realloc(void *p, size_t n) { return should_fail() ? NULL : realloc(p, n); }
static const pl__alloc_hooks counting = {t_malloc, t_calloc, t_realloc};

/* ------------------------------------------------------------- the run */

#define MAX_BATCHES 64

typedef struct run_result {
    int rc;              /* PL_OK, or the first error */
    char where[64];      /* the call that returned it */
    char msg[PL_ERRMSG_MAX];
    int n_batches;       /* batches returned before the error */
    uint64_t hash[MAX_BATCHES];
    long allocations;
} run_result;

static uint64_t batch_hash(const pl_batch *b) {
    size_t es = pl_dtype_size(b->dtype);
    size_t n = (size_t)(b->rows * b->cols);
    uint64_t h = pl__hash64(b->input_ids, n * es, (uint64_t)b->step);
    h = pl__hash64(b->labels, n * es, h);
    h = pl__hash64(b->loss_mask, n * sizeof(float), h);
    h = pl__hash64(b->position_ids, n * sizeof(int64_t), h);
    h = pl__hash64(b->cu_seqlens, (size_t)b->n_cu_seqlens * sizeof(int32_t), h);
    return pl__hash64(&b->micro_batch, sizeof b->micro_batch, h);
}

static char yaml[4096];

static int fail(run_result *r, int rc, const char *where, const char *msg) {
    r->rc = rc;
    snprintf(r->where, sizeof r->where, "%s", where);
    snprintf(r->msg, sizeof r->msg, "%s", msg ? msg : "");
    return rc;
}

/* Take the next micro-batch of every rank, `rounds` times. */
static int take(pl_loader *l, int64_t world, int rounds, run_result *r) {
    for (int k = 0; k < rounds; k++)
        for (int64_t rank = 0; rank < world; rank++) {
            const pl_batch *b = NULL;
            int rc = pl_loader_next(l, rank, &b);
            if (rc != PL_OK) return fail(r, rc, "pl_loader_next", pl_last_errmsg());
            if (r->n_batches < MAX_BATCHES) r->hash[r->n_batches++] = batch_hash(b);
        }
    return PL_OK;
}

static int run_body(run_result *r) {
    pl_config *cfg = NULL;
    pl_loader *l = NULL;
    pl_source *src = NULL;
    void *state = NULL;
    int rc = pl_config_parse_string(yaml, strlen(yaml), "oom.yaml", &cfg);
    if (rc) {
        fail(r, rc, "pl_config_parse_string", cfg ? pl_config_errmsg(cfg) : pl_last_errmsg());
        goto out;
    }
    /* Every source opened alone, read, its statistics taken. */
    for (int64_t i = 0; i < pl_config_num_sources(cfg); i++) {
        rc = pl_config_open_source(cfg, i, &src);
        if (rc) {
            fail(r, rc, "pl_config_open_source", src ? pl_source_errmsg(src) : pl_last_errmsg());
            goto out;
        }
        int64_t len = 0, toks[4];
        rc = pl_source_document_length(src, 1, &len);
        if (!rc) rc = pl_source_read(src, 1, 0, len < 4 ? len : 4, toks, PL_DTYPE_INT64);
        pl_source_stats st = {.size = sizeof st};
        if (!rc) rc = pl_source_get_stats(src, &st);
        if (rc) {
            fail(r, rc, "pl_source_read", pl_last_errmsg());
            goto out;
        }
        pl_source_free(src);
        src = NULL;
    }
    rc = pl_loader_create(cfg, NULL, &l);
    if (rc) {
        fail(r, rc, "pl_loader_create", l ? pl_loader_errmsg(l) : pl_last_errmsg());
        goto out;
    }
    int64_t world = pl_config_world_size(cfg);
    if ((rc = take(l, world, 3, r))) goto out;
    /* Save the state, take more, load it back, take the same again. */
    size_t len = 0;
    rc = pl_loader_get_state(l, NULL, 0, &len);
    if (!rc) {
        state = malloc(len);
        rc = pl_loader_get_state(l, state, len, &len);
    }
    pl_state_info info;
    if (!rc) rc = pl_state_inspect(state, len, &info);
    if (rc) {
        fail(r, rc, "pl_loader_get_state", pl_last_errmsg());
        goto out;
    }
    if ((rc = take(l, world, 2, r))) goto out;
    rc = pl_loader_set_state(l, state, len);
    if (rc) {
        fail(r, rc, "pl_loader_set_state", pl_last_errmsg());
        goto out;
    }
    if ((rc = take(l, world, 4, r))) goto out;
    pl_loader_stats stats = {.size = sizeof stats};
    pl_source_summary sums[4];
    rc = pl_loader_get_stats(l, &stats, sums, 4);
    if (rc) fail(r, rc, "pl_loader_get_stats", pl_last_errmsg());
out:
    free(state);
    pl_source_free(src);
    pl_loader_free(l);
    pl_config_free(cfg);
    return r->rc;
}

/* The same data through the roles one by one, as a distributed deployment
 * moves it: a planner; each plan encoded and decoded; the step's reads of DP
 * rank 0 answered by a source-loader reply and shipped in a package to an
 * external loader serving rank 0; the first micro-batch also built by a
 * data constructor from int64 payloads. */
#define ROLE_STEPS 3
#define NSRC_MAX 8

static const char *msg_or_last(const char *m) { return m && m[0] ? m : pl_last_errmsg(); }

static int run_roles(run_result *r) {
    pl_config *cfg = NULL;
    pl_source *src[NSRC_MAX] = {0};
    int64_t ns = 0;
    pl_planner *pn = NULL;
    pl_loader *ext = NULL;
    pl_constructor *ct = NULL;
    pl_plan *plan = NULL, *plan2 = NULL;
    void *blob = NULL, *pbuf = NULL, *reply = NULL, *pkg = NULL;
    pl_read *reads = NULL;
    pl_payload *rows = NULL;
    int64_t *tok = NULL, *plens = NULL;
    const int64_t **pays = NULL;
    int rc = pl_config_parse_string(yaml, strlen(yaml), "oom.yaml", &cfg);
    if (rc) {
        fail(r, rc, "pl_config_parse_string", cfg ? pl_config_errmsg(cfg) : pl_last_errmsg());
        goto out;
    }
    ns = pl_config_num_sources(cfg);
    CHECK(ns <= NSRC_MAX);
    for (int64_t i = 0; i < ns; i++)
        if ((rc = pl_config_open_source(cfg, i, &src[i]))) {
            fail(r, rc, "pl_config_open_source",
                 src[i] ? pl_source_errmsg(src[i]) : pl_last_errmsg());
            goto out;
        }
    if ((rc = pl_planner_create(cfg, src, ns, &pn))) {
        fail(r, rc, "pl_planner_create", pn ? pl_planner_errmsg(pn) : pl_last_errmsg());
        goto out;
    }
    int64_t rank0 = 0;
    pl_loader_options eo = {PL_LOADER_OPTIONS_VERSION, &rank0, 1, 2, 2, 1, 1, 0};
    if ((rc = pl_loader_create(cfg, &eo, &ext))) {
        fail(r, rc, "pl_loader_create", ext ? pl_loader_errmsg(ext) : pl_last_errmsg());
        goto out;
    }
    if ((rc = pl_constructor_create(cfg, &ct))) {
        fail(r, rc, "pl_constructor_create", ct ? pl_constructor_errmsg(ct) : pl_last_errmsg());
        goto out;
    }
    int64_t nmb = 0;
    pl_config_get_int(cfg, "micro_batches_per_rank", &nmb);
    for (int64_t step = 0; step < ROLE_STEPS; step++) {
        size_t blen = 0, plen = 0, rlen = 0, klen = 0;
        rc = pl_planner_get_state(pn, NULL, 0, &blen);
        if (!rc && !(blob = malloc(blen))) rc = PL_ENOMEM;
        if (!rc) rc = pl_planner_get_state(pn, blob, blen, &blen);
        if (!rc && step == 0) rc = pl_loader_set_state(ext, blob, blen);
        if (rc) {
            fail(r, rc, "pl_planner_get_state", msg_or_last(pl_planner_errmsg(pn)));
            goto out;
        }
        if ((rc = pl_planner_next(pn, &plan))) {
            fail(r, rc, "pl_planner_next", msg_or_last(pl_planner_errmsg(pn)));
            goto out;
        }
        rc = pl_plan_encode(plan, NULL, 0, &plen);
        if (!rc && !(pbuf = malloc(plen))) rc = PL_ENOMEM;
        if (!rc) rc = pl_plan_encode(plan, pbuf, plen, &plen);
        if (!rc) rc = pl_plan_decode(pbuf, plen, &plan2);
        if (rc) {
            fail(r, rc, "pl_plan_encode", pl_last_errmsg());
            goto out;
        }
        int64_t n = 0, nrows = 0, nimg = 0;
        rc = pl_plan_step_reads(plan2, 0, NULL, 0, &n);
        if (!rc && !(reads = calloc((size_t)n + 1, sizeof *reads))) rc = PL_ENOMEM;
        if (!rc) rc = pl_plan_step_reads(plan2, 0, reads, n, &n);
        if (!rc) rc = pl_reply_encode(src, ns, reads, n, NULL, 0, &rlen);
        if (!rc && !(reply = malloc(rlen))) rc = PL_ENOMEM;
        if (!rc) rc = pl_reply_encode(src, ns, reads, n, reply, rlen, &rlen);
        if (!rc && !(rows = calloc((size_t)n + 1, sizeof *rows))) rc = PL_ENOMEM;
        if (!rc) rc = pl_reply_decode(reply, rlen, rows, n, NULL, 0, &nrows, &nimg);
        if (!rc) rc = pl_package_encode(plan2, 0, blob, blen, rows, nrows, NULL, 0, &klen);
        if (!rc && !(pkg = malloc(klen))) rc = PL_ENOMEM;
        if (!rc) rc = pl_package_encode(plan2, 0, blob, blen, rows, nrows, pkg, klen, &klen);
        if (rc) {
            fail(r, rc, "pl_reply_encode", pl_last_errmsg());
            goto out;
        }
        int64_t want = -1;
        rc = pl_loader_want_step(ext, 10000, &want);
        if (!rc) CHECK_EQ_I64(want, step);
        if (!rc) rc = pl_loader_push_package(ext, pkg, klen);
        if (rc) {
            fail(r, rc, "pl_loader_push_package", pl_last_errmsg());
            goto out;
        }
        for (int64_t k = 0; k < nmb; k++) {
            const pl_batch *b = NULL;
            if ((rc = pl_loader_next(ext, 0, &b))) {
                fail(r, rc, "pl_loader_next", pl_last_errmsg());
                goto out;
            }
            if (r->n_batches < MAX_BATCHES) r->hash[r->n_batches++] = batch_hash(b);
        }
        if (step == 0) { /* micro-batch 0 of rank 0 by a constructor */
            int64_t m = 0, total = 0;
            free(reads);
            reads = NULL;
            rc = pl_plan_reads(plan2, 0, 0, NULL, 0, &m);
            if (!rc && !(reads = calloc((size_t)m + 1, sizeof *reads))) rc = PL_ENOMEM;
            if (!rc) rc = pl_plan_reads(plan2, 0, 0, reads, m, &m);
            for (int64_t j = 0; !rc && j < m; j++) total += reads[j].count;
            if (!rc && !(tok = malloc((size_t)(total + 1) * sizeof *tok))) rc = PL_ENOMEM;
            if (!rc && !(pays = calloc((size_t)m + 1, sizeof *pays))) rc = PL_ENOMEM;
            if (!rc && !(plens = calloc((size_t)m + 1, sizeof *plens))) rc = PL_ENOMEM;
            for (int64_t j = 0, at = 0; !rc && j < m; j++) {
                rc = pl_source_read_many(src[reads[j].source], &reads[j], 1, tok + at);
                pays[j] = tok + at;
                plens[j] = reads[j].count;
                at += reads[j].count;
            }
            pl_batch *b = NULL;
            if (!rc) rc = pl_constructor_build(ct, plan2, 0, 0, pays, plens, m, &b);
            if (rc) {
                fail(r, rc, "pl_constructor_build", msg_or_last(pl_constructor_errmsg(ct)));
                goto out;
            }
            if (r->n_batches < MAX_BATCHES) r->hash[r->n_batches++] = batch_hash(b);
            pl_batch_release(b);
            free(tok);
            free(pays);
            free(plens);
            tok = NULL;
            pays = NULL;
            plens = NULL;
        }
        pl_plan_free(plan);
        pl_plan_free(plan2);
        plan = plan2 = NULL;
        free(blob);
        free(pbuf);
        free(reads);
        free(reply);
        free(rows);
        free(pkg);
        blob = pbuf = reply = pkg = NULL;
        reads = NULL;
        rows = NULL;
    }
out:
    pl_plan_free(plan);
    pl_plan_free(plan2);
    free(blob);
    free(pbuf);
    free(reads);
    free(reply);
    free(rows);
    free(pkg);
    free(tok);
    free(pays);
    free(plens);
    if (ext) pl_loader_stop(ext);
    pl_loader_free(ext);
    pl_constructor_free(ct);
    pl_planner_free(pn);
    for (int64_t i = 0; i < ns && i < NSRC_MAX; i++) pl_source_free(src[i]);
    pl_config_free(cfg);
    return r->rc;
}

static int (*run_fn)(run_result *r) = run_body;

static void run(long n, int persist, run_result *r) {
    memset(r, 0, sizeof *r);
    atomic_store(&counter, 0);
    atomic_store(&injected, 0);
    fail_at = n;
    persistent = persist;
    pl__set_alloc_hooks(&counting);
    run_fn(r);
    pl__set_alloc_hooks(NULL);
    r->allocations = atomic_load(&counter);
}

/* ------------------------------------------------------------- checks */

static const char *const where_names[] = {
    "pl_config_parse_string", "pl_config_open_source", "pl_source_read",
    "pl_loader_create", "pl_loader_next", "pl_loader_get_state",
    "pl_loader_set_state", "pl_loader_get_stats", "pl_planner_create",
    "pl_constructor_create", "pl_planner_get_state", "pl_planner_next",
    "pl_plan_encode", "pl_reply_encode", "pl_loader_push_package",
    "pl_constructor_build"};
#define N_WHERE (int)(sizeof where_names / sizeof *where_names)

static long sweep(const run_result *ref, int persist, long *codes, long *at) {
    long n;
    for (n = 1;; n++) {
        run_result r;
        run(n, persist, &r);
        int hit = atomic_load(&injected);
        if (!hit) {
            /* The run made fewer than n allocations: it must be the clean
             * run.  Threads make the count vary a little from run to run:
             * the sweep goes on past the clean run's count. */
            CHECK_OK(r.rc);
            CHECK_EQ_I64(r.n_batches, ref->n_batches);
            if (n > ref->allocations) break;
            continue;
        }
        if (r.rc != PL_OK) {
            int known = strcmp(pl_err_name(r.rc), "UNKNOWN") != 0 && r.rc < 0;
            CHECK(known);
            CHECK(r.msg[0] != '\0');
            if (!known || !r.msg[0])
                fprintf(stderr, "n=%ld%s: %s returned %d (%s) \"%s\"\n", n,
                        persist ? "+" : "", r.where, r.rc, pl_err_name(r.rc), r.msg);
            if (r.rc == PL_ENOMEM) codes[0]++;
            else {
                codes[1]++;
                if (codes[1] <= 50)
                    fprintf(stderr, "n=%ld%s: %s: %s (%s)\n", n, persist ? "+" : "",
                            r.where, pl_err_name(r.rc), r.msg);
            }
            for (int w = 0; w < N_WHERE; w++)
                if (!strcmp(r.where, where_names[w])) at[w]++;
        } else {
            codes[2]++; /* the failure was absorbed (e.g. retried) */
        }
        /* What was returned before the error is what the clean run returns. */
        CHECK(r.n_batches <= ref->n_batches);
        int same = 1;
        for (int i = 0; i < r.n_batches && i < ref->n_batches; i++)
            if (r.hash[i] != ref->hash[i]) same = 0;
        CHECK(same);
        if (!same) fprintf(stderr, "n=%ld: a batch differs from the clean run's\n", n);
        if (r.rc == PL_OK) CHECK_EQ_I64(r.n_batches, ref->n_batches);
        if (n > 1000000) {
            CHECK(!"the sweep does not end");
            break;
        }
    }
    return n;
}

int main(void) {
    const char *dir = pl_test_tmpdir();
    char path[512];
    /* A Megatron dataset, an llm.c shard, a flat file: documents of 3..40
     * tokens, some longer than seq_length. */
    int64_t lens[24];
    for (int i = 0; i < 24; i++) lens[i] = 3 + (i * 7) % 38;
    snprintf(path, sizeof path, "%s/m", dir);
    CHECK(plf_write_megatron(path, PL_DTYPE_INT32, 24, lens, 1000) == 0);
    int64_t toks[400];
    for (int i = 0; i < 400; i++) toks[i] = i % 17 == 0 ? 50256 : 1 + i % 5000;
    snprintf(path, sizeof path, "%s/s.bin", dir);
    CHECK(plf_write_llmc(path, 0, toks, 400) == 0);
    for (int i = 0; i < 400; i++) toks[i] = i % 13 == 12 ? 0 : 1 + i % 3000;
    snprintf(path, sizeof path, "%s/f.bin", dir);
    CHECK(plf_write_flat(path, PL_DTYPE_UINT16, toks, 400) == 0);
    /* Raw text, tokenized online by the built-in byte tokenizer. */
    char text[8192];
    size_t tl = 0;
    for (int i = 0; i < 40; i++)
        tl += (size_t)snprintf(text + tl, sizeof text - tl,
                               "{\"text\": \"document %d: %.*s\"}\n", i, 5 + (i * 11) % 60,
                               "the quick brown fox jumps over the lazy dog, again and again");
    snprintf(path, sizeof path, "%s/t.jsonl", dir);
    CHECK(pl_test_write_file(path, text, tl) == 0);
    char base[3072];
    snprintf(base, sizeof base,
             "seq_length: 32\nglobal_batch_size: 8\nmicro_batch_size: 2\n"
             "train_steps: 20\nseed: 7\nthreads: 2\nprefetch: 2\n"
             "topology: {dp: 2}\nsidecar_index: memory\n"
             "sources:\n"
             "  - {name: m, type: megatron, path: %s/m, weight: 0.5}\n"
             "  - {name: s, type: llmc, path: %s/s.bin, weight: 0.3}\n"
             "  - {name: f, type: flat, path: %s/f.bin, weight: 0.1}\n"
             "  - {name: t, type: jsonl, path: %s/t.jsonl, weight: 0.1, lookahead: 8,\n"
             "     tokenizer: {type: bytes, threads: 1}}\n",
             dir, dir, dir, dir);

    for (int variant = 0; variant < 3; variant++) {
    const int roles = variant == 1, balanced = variant == 2;
    run_fn = roles ? run_roles : run_body;
    snprintf(yaml, sizeof yaml, "%s%s", base,
             balanced ? "balance: variable_length\nbalance_window: 2\n"
                        "cost: {preset: causal}\n" : "");
    run_result ref;
    run(0, 0, &ref);
    CHECK_OK(ref.rc);
    if (ref.rc) fprintf(stderr, "clean run: %s: %s\n", ref.where, ref.msg);
    /* Embedded: 9 rounds of 2 ranks.  Roles: 2 micro-batches of rank 0 per
     * step, and one from the constructor. */
    CHECK_EQ_I64(ref.n_batches, roles ? ROLE_STEPS * 2 + 1 : 9 * 2);
    fprintf(stderr, "%s, clean run: %ld allocations, %d batches\n",
            roles ? "roles one by one"
                  : balanced ? "embedded loader, variable_length, window 2" : "embedded loader",
            ref.allocations, ref.n_batches);

    for (int persist = 0; persist < 2; persist++) {
        long codes[3] = {0, 0, 0}, at[N_WHERE] = {0};
        long n = sweep(&ref, persist, codes, at);
        fprintf(stderr,
                "%s: %ld runs: %ld PL_ENOMEM, %ld other errors, %ld absorbed; by call:",
                persist ? "every allocation from the n-th on fails" : "the n-th allocation fails",
                n, codes[0], codes[1], codes[2]);
        for (int w = 0; w < N_WHERE; w++)
            if (at[w]) fprintf(stderr, " %s %ld", where_names[w], at[w]);
        fprintf(stderr, "\n");
        CHECK(n > 50);
    }
    }
    TEST_END();
}
