/*
 * share.c -- one config shared by a binding's config object and the objects
 * made from it (pl_config_freeze, pl_config_unshare; polyload_experimental.h).
 * The holder count lives in the config (config.h: frozen, refs);
 * pl__config_share adds a holder, pl_config_free drops one.
 */
#include "config.h"

void pl_config_freeze(pl_config *cfg) {
    if (!cfg || cfg->frozen) return;
    cfg->refs = 0; /* the caller is its only holder so far */
    cfg->frozen = 1;
}

int pl_config_unshare(pl_config **cfgp) {
    if (!cfgp || !*cfgp) return PL_EINVAL;
    pl_config *c = *cfgp;
    if (!c->frozen) return PL_OK;
    /* Holders only ever leave meanwhile: 0 stays 0. */
    if (__atomic_load_n(&c->refs, __ATOMIC_ACQUIRE) == 0) {
        c->frozen = 0;
        return PL_OK;
    }
    pl_config *copy = pl__config_clone(c);
    if (!copy) return PL_ENOMEM;
    pl_config_free(c); /* the caller's hold */
    *cfgp = copy;
    return PL_OK;
}
