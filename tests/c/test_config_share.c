/* One config shared by its owner and the objects made from it
 * (pl_config_freeze, pl_config_unshare): a loader made from a frozen config
 * holds that config itself; unsharing while the loader holds it gives the
 * owner a private copy (the loader's config does not change), and unsharing
 * once no object holds it thaws it in place.  Under ASan: no leak. */
#include "corpus.h"

int main(void) {
    corpus c;
    corpus_make(&c, 64);
    pl_config *cfg = corpus_config(&c, "seq_length: 64\nglobal_batch_size: 4\n"
                                       "micro_batch_size: 2\nthreads: 2\n", NULL);

    /* Not frozen: unshare leaves it as it is. */
    pl_config *before = cfg;
    CHECK_OK(pl_config_unshare(&cfg));
    CHECK(cfg == before);

    /* Frozen: the loader holds cfg itself. */
    pl_config_freeze(cfg);
    pl_config_freeze(cfg); /* twice: a no-op */
    pl_loader *l = NULL;
    CHECK_OK(pl_loader_create(cfg, NULL, &l));
    CHECK(pl_loader_config(l) == cfg);

    /* Still held: the owner gets a copy; the loader's config is untouched. */
    pl_config *held = cfg;
    CHECK_OK(pl_config_unshare(&cfg));
    CHECK(cfg != held);
    CHECK(pl_loader_config(l) == held);
    CHECK_OK(pl_config_set(cfg, "threads", "3"));
    int64_t v = 0;
    CHECK_OK(pl_config_get_int(cfg, "threads", &v));
    CHECK_EQ_I64(v, 3);
    CHECK_OK(pl_config_get_int(pl_loader_config(l), "threads", &v));
    CHECK_EQ_I64(v, 2);
    CHECK_EQ_I64(pl_config_fingerprint(cfg), pl_config_fingerprint(held));
    const pl_batch *b = NULL;
    CHECK_OK(pl_loader_next(l, 0, &b));
    pl_loader_free(l); /* the last hold of `held`: freed here */

    /* Frozen, no holder left: thawed in place. */
    pl_config_freeze(cfg);
    CHECK_OK(pl_loader_create(cfg, NULL, &l));
    pl_loader_free(l);
    before = cfg;
    CHECK_OK(pl_config_unshare(&cfg));
    CHECK(cfg == before);
    CHECK_OK(pl_config_set(cfg, "threads", "1"));
    CHECK(pl_config_unshare(NULL) == PL_EINVAL);
    pl_config_free(cfg);
    corpus_free(&c);
    TEST_END();
}
