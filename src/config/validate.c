/*
 * config/validate.c -- the checks that involve several keys, and the
 * defaults of a new config.
 *
 * One key's type, range and values are checked as it is read (keys.c);
 * what involves several keys (divisibility, weights summing to zero, the
 * cost preset's window, the topology order, images that must fit a
 * sequence) is checked here, after a parse and after every pl_config_set;
 * pl_config_set rolls the config back when validation fails, so a config is
 * always valid.  Problems with topology.order are PL_ETOPOLOGY; everything
 * else is PL_ECONFIG.
 */
#include "config/config.h"

#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------ validation */

int pl__config_validate(pl_config *cfg, const pl__vlines *ln) {
    char err[PL__ERRMSG_CAP];
    int order_axes[5], n_axes = 0;
    if (pl__topology_parse_order(cfg->topology.order, order_axes, &n_axes, err,
                                 sizeof err) != PL_OK)
        return pl__cfg_err(cfg, PL_ETOPOLOGY, ln->order, "%s", err);
    {
        /* An axis may be left out of the order only if its size is 1. */
        static const char *const names[5] = {"tp", "cp", "ep", "dp", "pp"};
        const int64_t sizes[5] = {cfg->topology.tp, cfg->topology.cp, 1,
                                  cfg->topology.dp, cfg->topology.pp};
        int seen[5] = {0, 0, 0, 0, 0};
        for (int k = 0; k < n_axes; k++) seen[order_axes[k]] = 1;
        for (int a = 0; a < 5; a++)
            if (!seen[a] && sizes[a] != 1)
                return pl__cfg_err(cfg, PL_ETOPOLOGY, ln->order,
                               "topology.order '%s': axis '%s' missing, but "
                               "topology.%s is %" PRId64
                               " (only axes of size 1 may be left out)",
                               cfg->topology.order, names[a], names[a],
                               sizes[a]);
    }
    int64_t per = cfg->topology.dp * cfg->micro_batch_size;
    if (cfg->global_batch_size % per != 0)
        return pl__cfg_err(cfg, PL_ECONFIG, ln->global_batch_size,
                       "global_batch_size %" PRId64
                       " is not divisible by topology.dp * micro_batch_size "
                       "= %" PRId64 " * %" PRId64,
                       cfg->global_batch_size, cfg->topology.dp,
                       cfg->micro_batch_size);
    if (cfg->topology.cp > 1 && cfg->seq_length % (2 * cfg->topology.cp) != 0)
        return pl__cfg_err(cfg, PL_ECONFIG, ln->seq_length,
                       "seq_length %" PRId64
                       " is not divisible by 2 * topology.cp = %" PRId64,
                       cfg->seq_length, 2 * cfg->topology.cp);
    if (cfg->balance != PL__BALANCE_VLEN && cfg->max_tokens != 0)
        return pl__cfg_err(cfg, PL_ECONFIG, 0,
                           "max_tokens applies only to balance: variable_length");
    if (cfg->balance == PL__BALANCE_VLEN) {
        const int64_t m = pl__vlen_max_tokens(cfg);
        const int64_t need = cfg->micro_batch_size * cfg->seq_length;
        if (m < need)
            return pl__cfg_err(cfg, PL_ECONFIG, 0,
                               "max_tokens %" PRId64 " is below micro_batch_size * "
                               "seq_length = %" PRId64
                               " (a micro-batch row must hold what it replaces)",
                               m, need);
        if (m > PL__MAX_SEQ_LENGTH || m > INT32_MAX)
            return pl__cfg_err(cfg, PL_ECONFIG, 0,
                               "max_tokens %" PRId64 " is above the limit %" PRId64,
                               m, PL__MAX_SEQ_LENGTH);
        if (cfg->topology.cp > 1 && m % (2 * cfg->topology.cp) != 0)
            return pl__cfg_err(cfg, PL_ECONFIG, 0,
                               "max_tokens %" PRId64
                               " is not divisible by 2 * topology.cp = %" PRId64,
                               m, 2 * cfg->topology.cp);
    }
    /* window.c numbers a window's sequences in 32 bits. */
    if (cfg->balance_window > 1 &&
        cfg->global_batch_size > INT32_MAX / cfg->balance_window)
        return pl__cfg_err(cfg, PL_ECONFIG, ln->global_batch_size,
                           "balance_window %" PRId64 " x global_batch_size %" PRId64
                           " sequences per window is above the limit %" PRId64,
                           cfg->balance_window, cfg->global_batch_size,
                           (int64_t)INT32_MAX);
    int sliding = strcmp(cfg->cost.preset, "sliding_window") == 0;
    if (sliding && cfg->cost.window <= 0)
        return pl__cfg_err(cfg, PL_ECONFIG, ln->cost,
                       "cost.window is required with cost.preset "
                       "sliding_window");
    if (!sliding && cfg->cost.window != 0)
        return pl__cfg_err(cfg, PL_ECONFIG, ln->cost,
                       "cost.window applies only to cost.preset "
                       "sliding_window (preset is %s)",
                       cfg->cost.preset);
    if (cfg->dtype == PL_DTYPE_INT32 && cfg->pad_id > INT32_MAX)
        return pl__cfg_err(cfg, PL_ECONFIG, 0,
                       "pad_id %" PRId64 " does not fit dtype int32",
                       cfg->pad_id);
    if (cfg->vocab_size > 0 && cfg->pad_id >= cfg->vocab_size)
        return pl__cfg_err(cfg, PL_ECONFIG, 0,
                       "pad_id %" PRId64 " is outside the vocabulary "
                       "(vocab_size %" PRId64 ")",
                       cfg->pad_id, cfg->vocab_size);
    for (int64_t i = 0; cfg->vocab_size > 0 && i < cfg->n_sources; i++)
        if (cfg->sources[i].eos_id >= cfg->vocab_size)
            return pl__cfg_err(cfg, PL_ECONFIG, ln->sources,
                           "sources[%" PRId64 "] '%s': eos_id %" PRId64
                           " is outside the vocabulary (vocab_size %" PRId64
                           ")",
                           i, cfg->sources[i].name, cfg->sources[i].eos_id,
                           cfg->vocab_size);
    if (cfg->n_sources < 1)
        return pl__cfg_err(cfg, PL_ECONFIG, ln->sources,
                       "sources: at least one source is required");
    if (!cfg->has_schedule && !(pl__source_weight_sum(cfg) > 0))
        return pl__cfg_err(cfg, PL_ECONFIG, ln->sources,
                       "weights of sources sum to zero");
    if (!isfinite(pl__source_weight_sum(cfg)))
        return pl__cfg_err(cfg, PL_ECONFIG, ln->sources,
                       "weights of sources sum to infinity");
    /* Limits of the implementation, so that sizes never overflow. */
    const int64_t lim = PL__MAX_SEQ_LENGTH;
    if (cfg->seq_length > lim)
        return pl__cfg_err(cfg, PL_ECONFIG, ln->seq_length,
                       "seq_length %" PRId64 " is above the limit %" PRId64,
                       cfg->seq_length, lim);
    if (cfg->global_batch_size > lim)
        return pl__cfg_err(cfg, PL_ECONFIG, ln->global_batch_size,
                       "global_batch_size %" PRId64 " is above the limit %" PRId64,
                       cfg->global_batch_size, lim);
    if (cfg->micro_batch_size * cfg->seq_length > INT32_MAX)
        return pl__cfg_err(cfg, PL_ECONFIG, ln->seq_length,
                       "micro_batch_size * seq_length = %" PRId64
                       " does not fit cu_seqlens (int32)",
                       cfg->micro_batch_size * cfg->seq_length);
    int64_t world = 1;
    const int64_t axes[4] = {cfg->topology.dp, cfg->topology.pp,
                             cfg->topology.cp, cfg->topology.tp};
    for (int a = 0; a < 4; a++) {
        world *= axes[a];
        if (world > lim)
            return pl__cfg_err(cfg, PL_ETOPOLOGY, ln->order,
                           "topology: world size dp*pp*cp*tp is above the "
                           "limit %" PRId64, lim);
    }
    if (cfg->train_steps > ((int64_t)1 << 40))
        return pl__cfg_err(cfg, PL_ECONFIG, 0,
                       "train_steps %" PRId64 " is above the limit 2^40 "
                       "(leave it out for an endless run)",
                       cfg->train_steps);
    /* Micro-batch cursors are step * micro-batches per rank; bound them for
       any dp (dp = 1 has the most micro-batches per rank). */
    const int64_t mb_per_step = cfg->global_batch_size / cfg->micro_batch_size;
    if (cfg->train_steps > PL__MAX_MICRO_BATCHES / mb_per_step)
        return pl__cfg_err(cfg, PL_ECONFIG, 0,
                       "train_steps %" PRId64 " * %" PRId64
                       " micro-batches per step (global_batch_size / "
                       "micro_batch_size) is above the limit 2^50",
                       cfg->train_steps, mb_per_step);
    const pl__source_cfg *first_img = NULL;
    for (int64_t i = 0; i < cfg->n_sources; i++) {
        const pl__source_cfg *sc = &cfg->sources[i];
        if (sc->type != PL_SOURCE_WEBDATASET) continue;
        if (cfg->topology.cp > 1)
            return pl__cfg_err(cfg, PL_ECONFIG, ln->sources,
                           "sources[%" PRId64 "] '%s': webdataset sources need "
                           "topology.cp 1 (images are not sliced for context parallelism)",
                           i, sc->name);
        const pl_image_options *io = &pl__sx(sc)->image;
        if (first_img && (pl__sx(first_img)->image.mode != io->mode ||
                          pl__sx(first_img)->image.size != io->size ||
                          pl__sx(first_img)->image.patch_size != io->patch_size))
            return pl__cfg_err(cfg, PL_ECONFIG, ln->sources,
                           "sources[%" PRId64 "] '%s': image mode, size and patch_size "
                           "must match those of '%s' (one pixel_values layout per batch)",
                           i, sc->name, first_img->name);
        if (!first_img) first_img = sc;
        /* The most visual tokens an image can take must fit a sequence, or its
         * placeholder run would be cut (build/images.c refuses that). */
        const int64_t p = io->patch_size ? io->patch_size : 14;
        const int64_t m = io->merge_size ? io->merge_size
                                         : (io->mode == PL_IMAGE_NATIVE ? 2 : 1);
        int64_t most;
        if (io->mode == PL_IMAGE_NATIVE) {
            const int64_t mx = io->max_pixels ? io->max_pixels : 28 * 28 * 1280;
            most = mx / (p * p * m * m);
            if (most < 1) most = 1;
        } else {
            const int64_t side = (io->size ? io->size : 336) / p;
            most = side * side / (m * m);
        }
        if (most >= cfg->seq_length)
            return pl__cfg_err(cfg, PL_ECONFIG, ln->sources,
                           "sources[%" PRId64 "] '%s': an image may take %" PRId64
                           " visual tokens, not fewer than seq_length %" PRId64
                           " (lower image.max_pixels or size, or raise seq_length)",
                           i, sc->name, most, cfg->seq_length);
    }
    for (int64_t i = 0; i < cfg->n_sources; i++) {
        const pl__source_cfg *sc = &cfg->sources[i];
        int64_t max_tok = sc->type == PL_SOURCE_FLAT &&
                                  sc->token_dtype != PL_DTYPE_UINT32
                              ? 65535
                              : (int64_t)UINT32_MAX;
        if (sc->type != PL_SOURCE_MEGATRON && sc->eos_id > max_tok)
            return pl__cfg_err(cfg, PL_ECONFIG, ln->sources,
                           "sources[%" PRId64 "] '%s': eos_id %" PRId64
                           " does not fit its tokens (at most %" PRId64 ")",
                           i, sc->name, sc->eos_id, max_tok);
    }
    return PL_OK;
}

/* ------------------------------------------------------------ defaults */

pl_config *pl__config_new(const char *origin) {
    pl_config *cfg = pl__calloc(1, sizeof *cfg);
    if (!cfg) return NULL;
    cfg->origin = pl__strdup(origin ? origin : "<string>");
    if (!cfg->origin) {
        free(cfg);
        return NULL;
    }
    /* Every default is a row of the key table, set as YAML would set it. */
    if (pl__key_defaults(cfg) != PL_OK) {
        free(cfg->origin);
        free(cfg);
        return NULL;
    }
    return cfg;
}
