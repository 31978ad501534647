/*
 * topology.c -- global ranks and their roles (SPEC section 2).
 *
 * A global rank is decomposed as Megatron-core's RankGenerator does: the
 * `order` string (e.g. "tp-cp-ep-dp-pp") lists the parallel axes, leftmost
 * varying fastest, so rank = tp + tp_size * (cp + cp_size * (dp + dp_size *
 * pp)) for that order.  Expert parallelism does not change which data a rank
 * receives, so `ep` may appear in the order but counts as size 1.  Nothing is
 * cached: the order is parsed on each call, which costs a few comparisons.
 *
 * Problems with `order` (unknown axis, repeats, a missing axis whose size is
 * not 1) are reported as PL_ETOPOLOGY, both here and when a config is parsed,
 * so that a caller can tell a malformed topology from other configuration
 * errors.  An axis of size 1 may be left out of `order`: Megatron's
 * RankGenerator appends it, and a size-1 axis never changes the
 * decomposition, so its index is simply 0.
 */
#include "config/config.h"

#include <string.h>

static const char *const axis_names[5] = {"tp", "cp", "ep", "dp", "pp"};

int pl__topology_parse_order(const char *order, int *axes, int *n_axes,
                             char *err, size_t errcap) {
    int seen[5] = {0, 0, 0, 0, 0};
    int n = 0;
    if (n_axes) *n_axes = 0;
    if (!order || !order[0]) {
        pl__fmt(err, errcap, "topology.order is empty (expected e.g. "
                             "'tp-cp-ep-dp-pp')");
        return PL_ETOPOLOGY;
    }
    const char *p = order;
    for (;;) {
        const char *end = strchr(p, '-');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        int axis = -1;
        for (int a = 0; a < 5; a++) {
            if (len == 2 && memcmp(p, axis_names[a], 2) == 0) axis = a;
        }
        if (axis < 0) {
            pl__fmt(err, errcap,
                    "topology.order '%s': unknown axis '%.*s' (expected tp, "
                    "cp, ep, dp, pp separated by '-')",
                    order, (int)(len > 32 ? 32 : len), p);
            return PL_ETOPOLOGY;
        }
        if (seen[axis]) {
            pl__fmt(err, errcap, "topology.order '%s': axis '%s' repeated",
                    order, axis_names[axis]);
            return PL_ETOPOLOGY;
        }
        seen[axis] = 1;
        if (axes) axes[n] = axis;
        n++;
        if (!end) break;
        p = end + 1;
    }
    if (n_axes) *n_axes = n;
    return PL_OK;
}

int64_t pl_config_world_size(const pl_config *cfg) {
    if (!cfg) return 0;
    return cfg->topology.dp * cfg->topology.pp * cfg->topology.cp *
           cfg->topology.tp;
}

int pl_config_rank_info(const pl_config *cfg, int64_t rank,
                        pl_rank_info *out) {
    if (!cfg || !out) return PL_EINVAL;
    int axes[5];
    int n = 0;
    char err[PL__ERRMSG_CAP];
    int rc = pl__topology_parse_order(cfg->topology.order, axes, &n, err,
                                      sizeof err);
    if (rc != PL_OK) return rc;
    int64_t world = pl_config_world_size(cfg);
    if (rank < 0 || rank >= world) return PL_ERANGE;

    int64_t idx[5] = {0, 0, 0, 0, 0};
    int64_t rest = rank;
    for (int k = 0; k < n; k++) {
        int64_t size = 1;
        switch (axes[k]) {
        case PL__AXIS_TP: size = cfg->topology.tp; break;
        case PL__AXIS_CP: size = cfg->topology.cp; break;
        case PL__AXIS_DP: size = cfg->topology.dp; break;
        case PL__AXIS_PP: size = cfg->topology.pp; break;
        default: size = 1; break; /* ep: no effect on data */
        }
        idx[axes[k]] = rest % size;
        rest /= size;
    }
    memset(out, 0, sizeof *out);
    out->rank = rank;
    out->tp_rank = idx[PL__AXIS_TP];
    out->cp_rank = idx[PL__AXIS_CP];
    out->dp_rank = idx[PL__AXIS_DP];
    out->pp_rank = idx[PL__AXIS_PP];

    const uint32_t common = PL_FIELD_CU_SEQLENS | PL_FIELD_MAX_SEQLEN;
    if (cfg->topology.pp == 1) {
        out->fields = PL_FIELD_ALL;
    } else if (out->pp_rank == 0) {
        out->fields = common | PL_FIELD_INPUT_IDS | PL_FIELD_POSITION_IDS;
    } else if (out->pp_rank == cfg->topology.pp - 1) {
        out->fields = common | PL_FIELD_LABELS | PL_FIELD_LOSS_MASK;
    } else {
        out->fields = common;
    }
    return PL_OK;
}
