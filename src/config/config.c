/*
 * config.c -- the YAML configuration of SPEC section 5.
 *
 * The file is loaded with libyaml's document API and walked once into a
 * struct pl_config (config.h).  Every scalar key, nested ones included
 * ("topology.dp", "cost.preset"), goes through one function, set_scalar, so
 * that the YAML walk and pl_config_set share their parsing, defaults and
 * messages.  Checks that involve several keys (divisibility, weights summing
 * to zero, the cost preset's window, the topology order) live in validate(),
 * which runs after a parse and after every pl_config_set; pl_config_set rolls
 * the config back when validation fails, so a config is always valid.
 *
 * Messages name the key as a dotted path ("topology.dp", "sources[1].path",
 * "schedule.points[2].step") and, when the value came from YAML, the origin
 * and line: "pretrain.yaml:7: unknown key 'seq_lenght'".  Problems with
 * topology.order are PL_ETOPOLOGY; everything else is PL_ECONFIG.
 *
 * Warnings (pl_config_warning) record what a parse accepted but a user may
 * not have meant: weights that do not sum to 1 (they are normalized), a
 * schedule point that leaves a source out (its weight there is 0), source
 * weights that a schedule overrides, seq_length left at its default.  They
 * are collected while walking the YAML, with the line, and belong to the
 * parse: pl_config_set neither adds nor clears them.
 *
 * Cost presets set a, b and c; explicit a, b or c keys override them,
 * whatever their position in the YAML mapping.  pl_config_set("cost.preset")
 * resets a, b, c (and window) to the preset's values.
 *
 * Parsing touches no file: source paths are checked when a source opens
 * (source/open.c), where a path that matches nothing is a config error
 * naming the config file and line, not a data error.
 */
#include "config/config.h"

#include <errno.h>
#include <glob.h>
#include <inttypes.h>
#include <math.h>
#ifdef __GLIBC__
#include <malloc.h>
#endif
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <yaml.h>

/* A scalar value with where it came from.  line > 0: YAML line; 0: no line
 * (the origin is still named); < 0: from pl_config_set (no origin). */
typedef struct sval {
    const char *s;
    int quoted; /* a quoted YAML scalar: a string, never a number */
    int line;
} sval;

/* Lines of keys that cross-key validation reports (0 when absent). */
typedef struct vlines {
    int seq_length, global_batch_size, order, cost, sources;
} vlines;

/* ------------------------------------------------------------ messages */

__attribute__((format(printf, 4, 5))) static int
cfg_err(pl_config *cfg, int code, int line, const char *fmt, ...) {
    char msg[PL__ERRMSG_CAP];
    va_list ap;
    va_start(ap, fmt);
    pl__vfmt(msg, sizeof msg, fmt, ap);
    va_end(ap);
    const char *origin = cfg->origin ? cfg->origin : "<config>";
    if (line > 0)
        pl__fmt(cfg->errmsg, sizeof cfg->errmsg, "%s:%d: %s", origin, line,
                msg);
    else if (line == 0)
        pl__fmt(cfg->errmsg, sizeof cfg->errmsg, "%s: %s", origin, msg);
    else
        pl__fmt(cfg->errmsg, sizeof cfg->errmsg, "%s", msg);
    return code;
}

/* Append a warning (formatted as cfg_err formats messages).  PL_ENOMEM when
 * it cannot be stored. */
__attribute__((format(printf, 3, 4))) static int
cfg_warn(pl_config *cfg, int line, const char *fmt, ...) {
    char msg[PL__ERRMSG_CAP], full[PL__ERRMSG_CAP];
    va_list ap;
    va_start(ap, fmt);
    pl__vfmt(msg, sizeof msg, fmt, ap);
    va_end(ap);
    const char *origin = cfg->origin ? cfg->origin : "<config>";
    if (line > 0)
        pl__fmt(full, sizeof full, "%s:%d: %s", origin, line, msg);
    else
        pl__fmt(full, sizeof full, "%s: %s", origin, msg);
    char **grown = pl__realloc_array(cfg->warnings, (size_t)cfg->n_warnings + 1,
                                     sizeof *grown);
    if (!grown) return cfg_err(cfg, PL_ENOMEM, 0, "out of memory");
    cfg->warnings = grown;
    grown[cfg->n_warnings] = pl__strdup(full);
    if (!grown[cfg->n_warnings])
        return cfg_err(cfg, PL_ENOMEM, 0, "out of memory");
    cfg->n_warnings++;
    return PL_OK;
}

/* ------------------------------------------------------------ scalars */

static int is_null(const sval *v) {
    if (v->quoted) return 0;
    return v->s[0] == '\0' || strcmp(v->s, "~") == 0 ||
           strcmp(v->s, "null") == 0 || strcmp(v->s, "Null") == 0 ||
           strcmp(v->s, "NULL") == 0;
}

/* Parse a decimal integer that fills the whole string. */
static int parse_i64(const char *s, int64_t *out) {
    const char *p = s;
    if (*p == '+' || *p == '-') p++;
    if (*p < '0' || *p > '9') return 0;
    for (const char *q = p; *q; q++)
        if (*q < '0' || *q > '9') return 0;
    errno = 0;
    char *end = NULL;
    long long v = strtoll(s, &end, 10);
    if (errno || !end || *end) return 0;
    *out = (int64_t)v;
    return 1;
}

static int get_int(pl_config *cfg, const char *key, const sval *v,
                   int64_t min, int64_t max, int64_t *out) {
    int64_t x = 0;
    if (v->quoted || !parse_i64(v->s, &x))
        return cfg_err(cfg, PL_ECONFIG, v->line,
                       "%s: expected an integer, got '%s'", key, v->s);
    if (x < min || x > max) {
        if (min == 1 && x < 1)
            return cfg_err(cfg, PL_ECONFIG, v->line,
                           "%s must be a positive integer, got %" PRId64, key,
                           x);
        if (min == 0 && x < 0)
            return cfg_err(cfg, PL_ECONFIG, v->line,
                           "%s must not be negative, got %" PRId64, key, x);
        return cfg_err(cfg, PL_ECONFIG, v->line,
                       "%s must be in [%" PRId64 ", %" PRId64 "], got %" PRId64,
                       key, min, max, x);
    }
    *out = x;
    return PL_OK;
}

static int get_u64(pl_config *cfg, const char *key, const sval *v,
                   uint64_t *out) {
    const char *p = v->s;
    if (*p == '+') p++;
    int ok = !v->quoted && *p >= '0' && *p <= '9';
    for (const char *q = p; ok && *q; q++)
        if (*q < '0' || *q > '9') ok = 0;
    unsigned long long x = 0;
    if (ok) {
        errno = 0;
        char *end = NULL;
        x = strtoull(p, &end, 10);
        if (errno || !end || *end) ok = 0;
    }
    if (!ok)
        return cfg_err(cfg, PL_ECONFIG, v->line,
                       "%s: expected a non-negative integer, got '%s'", key,
                       v->s);
    *out = (uint64_t)x;
    return PL_OK;
}

/* A finite number >= 0. */
static int get_num(pl_config *cfg, const char *key, const sval *v,
                   double *out) {
    char *end = NULL;
    errno = 0;
    double x = v->quoted || !v->s[0] ? NAN : strtod(v->s, &end);
    if (v->quoted || !v->s[0] || errno || !end || *end || !isfinite(x))
        return cfg_err(cfg, PL_ECONFIG, v->line,
                       "%s: expected a number, got '%s'", key, v->s);
    if (x < 0)
        return cfg_err(cfg, PL_ECONFIG, v->line,
                       "%s must not be negative, got %s", key, v->s);
    *out = x;
    return PL_OK;
}

/* One of `names`; *out receives the matching entry of `values`. */
static int get_enum(pl_config *cfg, const char *key, const sval *v,
                    const char *const *names, const int *values, int n,
                    int *out) {
    for (int i = 0; i < n; i++) {
        if (strcmp(v->s, names[i]) == 0) {
            *out = values[i];
            return PL_OK;
        }
    }
    char list[256] = "";
    size_t used = 0;
    for (int i = 0; i < n && used < sizeof list; i++) {
        int w = snprintf(list + used, sizeof list - used, "%s%s",
                         i ? ", " : "", names[i]);
        if (w < 0) break;
        used += (size_t)w;
    }
    return cfg_err(cfg, PL_ECONFIG, v->line,
                   "%s: unknown value '%s' (expected one of: %s)", key, v->s,
                   list);
}

#define NELEM(a) ((int)(sizeof(a) / sizeof((a)[0])))

static const char *const longdoc_names[] = {"split", "truncate"};
static const int longdoc_values[] = {PL__LONGDOC_SPLIT, PL__LONGDOC_TRUNCATE};
static const char *const packing_names[] = {"best_fit", "concat_chunk"};
static const int packing_values[] = {PL__PACK_BEST_FIT,
                                     PL__PACK_CONCAT_CHUNK};
static const char *const balance_names[] = {"none", "greedy",
                                            "karmarkar_karp"};
static const int balance_values[] = {PL__BALANCE_NONE, PL__BALANCE_GREEDY,
                                     PL__BALANCE_KK};
static const char *const sidecar_names[] = {"write", "read", "memory"};
static const int sidecar_values[] = {PL_INDEX_WRITE, PL_INDEX_READ, PL_INDEX_MEMORY};
static const char *const onerr_names[] = {"fail", "skip"};
static const int onerr_values[] = {PL__ONERR_FAIL, PL__ONERR_SKIP};
static const char *const interp_names[] = {"linear", "step"};
static const int interp_values[] = {PL__INTERP_LINEAR, PL__INTERP_STEP};
static const char *const dtype_names[] = {"int64", "int32"};
static const int dtype_values[] = {PL_DTYPE_INT64, PL_DTYPE_INT32};
static const char *const stype_names[] = {"megatron", "llmc", "flat", "jsonl",
                                          "text", "webdataset", "parquet"};
static const int stype_values[] = {PL_SOURCE_MEGATRON, PL_SOURCE_LLMC,
                                   PL_SOURCE_FLAT, PL_SOURCE_JSONL,
                                   PL_SOURCE_TEXT, PL_SOURCE_WEBDATASET,
                                   PL_SOURCE_PARQUET};
static const char *const imode_names[] = {"fixed", "native"};
static const int imode_values[] = {PL_IMAGE_FIXED, PL_IMAGE_NATIVE};
static const char *const index_names[] = {"file", "memory"};
static const int index_values[] = {0, -1};
static const char *const toktype_names[] = {"bytes", "hf", "sentencepiece",
                                            "tiktoken"};
static const int toktype_values[] = {PL__TOK_BYTES, PL__TOK_HF,
                                     PL__TOK_SENTENCEPIECE, PL__TOK_TIKTOKEN};
static const char *const tdtype_names[] = {"uint16", "uint32"};
static const int tdtype_values[] = {PL_DTYPE_UINT16, PL_DTYPE_UINT32};

/* Cost presets (SPEC 5): a * tokens + b * sum(len^2) + c. */
typedef struct preset {
    const char *name;
    double a, b, c;
} preset;
static const preset presets[] = {
    {"linear", 1.0, 0.0, 0.0},
    {"causal", 0.0, 1.0, 0.0},
    {"sliding_window", 0.0, 1.0, 0.0},
    {"llama-1b", 6.0 * 1.2e9, 6.0 * 16 * 2048, 0.0},
    {"llama-7b", 6.0 * 6.7e9, 6.0 * 32 * 4096, 0.0},
};

static int set_preset(pl_config *cfg, const sval *v) {
    for (int i = 0; i < NELEM(presets); i++) {
        if (strcmp(v->s, presets[i].name) == 0) {
            pl__fmt(cfg->cost.preset, sizeof cfg->cost.preset, "%s",
                    presets[i].name);
            cfg->cost.a = presets[i].a;
            cfg->cost.b = presets[i].b;
            cfg->cost.c = presets[i].c;
            cfg->cost.window = 0;
            return PL_OK;
        }
    }
    return cfg_err(cfg, PL_ECONFIG, v->line,
                   "cost.preset: unknown value '%s' (expected one of: linear, "
                   "causal, sliding_window, llama-1b, llama-7b)",
                   v->s);
}

#define ENUM_ARGS(prefix) prefix##_names, prefix##_values, NELEM(prefix##_names)

static int is_known_key(const char *key) {
    static const char *const known[] = {
        "seed", "seq_length", "global_batch_size", "micro_batch_size",
        "train_steps", "dtype", "pad_id", "long_documents", "packing",
        "balance", "on_error", "threads", "prefetch", "max_lag_steps", "sidecar_index",
        "cost.preset",
        "cost.a", "cost.b", "cost.c", "cost.window", "long_short.threshold",
        "cost.encoder.a", "cost.encoder.b",
        "topology.dp", "topology.pp", "topology.cp", "topology.tp",
        "topology.order", "vocab_size", "split",
        "cache.dir", "cache.max_bytes", "cache.chunk_bytes"};
    for (int i = 0; i < NELEM(known); i++)
        if (strcmp(key, known[i]) == 0) return 1;
    return 0;
}

/*
 * Set one scalar key (dotted for nested mappings).  Unknown keys are errors.
 * A null value is accepted only by train_steps (endless).
 */
/*
 * "969,30,1" (Megatron's --split): up to three non-negative numbers, any
 * separators, normalized to fractions of train, valid, test (missing ones 0),
 * as megatron-core's parse_and_normalize_split.
 */
static int parse_split(pl_config *cfg, const char *key, const sval *v,
                       double *out) {
    double x[3] = {0, 0, 0};
    int n = 0;
    const char *q = v->s;
    while (*q) {
        if (!((*q >= '0' && *q <= '9') || *q == '.')) {
            if (*q == '-')
                return cfg_err(cfg, PL_ECONFIG, v->line,
                               "%s: '%s' has a negative part", key, v->s);
            q++;
            continue;
        }
        char *end = NULL;
        double d = strtod(q, &end);
        if (end == q || !isfinite(d))
            return cfg_err(cfg, PL_ECONFIG, v->line,
                           "%s: '%s' is not a list of numbers such as 969,30,1",
                           key, v->s);
        if (n == 3)
            return cfg_err(cfg, PL_ECONFIG, v->line,
                           "%s: '%s' has more than three parts (train, valid, "
                           "test)",
                           key, v->s);
        x[n++] = d;
        q = end;
    }
    double sum = x[0] + x[1] + x[2];
    if (n == 0 || !(sum > 0))
        return cfg_err(cfg, PL_ECONFIG, v->line,
                       "%s: '%s' needs a positive part, such as 969,30,1", key,
                       v->s);
    for (int k = 0; k < 3; k++) out[k] = x[k] / sum;
    return PL_OK;
}

static int set_scalar(pl_config *cfg, const char *key, const sval *v) {
    int64_t x = 0;
    int e = 0;
    int rc;
    if (strcmp(key, "train_steps") == 0 && is_null(v)) {
        cfg->train_steps = -1;
        return PL_OK;
    }
    if (!is_known_key(key))
        return cfg_err(cfg, PL_ECONFIG, v->line, "unknown key '%s'", key);
    if (is_null(v))
        return cfg_err(cfg, PL_ECONFIG, v->line, "%s: missing value", key);

    if (strcmp(key, "split") == 0) {
        cfg->has_split = 1;
        return parse_split(cfg, key, v, cfg->split);
    }
    if (strcmp(key, "seed") == 0) return get_u64(cfg, key, v, &cfg->seed);
    if (strcmp(key, "seq_length") == 0)
        return get_int(cfg, key, v, 1, INT32_MAX, &cfg->seq_length);
    if (strcmp(key, "global_batch_size") == 0)
        return get_int(cfg, key, v, 1, INT32_MAX, &cfg->global_batch_size);
    if (strcmp(key, "micro_batch_size") == 0)
        return get_int(cfg, key, v, 1, INT32_MAX, &cfg->micro_batch_size);
    if (strcmp(key, "train_steps") == 0) {
        /* -1 is accepted as an explicit "endless". */
        if (v->s[0] == '-' && strcmp(v->s, "-1") == 0) {
            cfg->train_steps = -1;
            return PL_OK;
        }
        return get_int(cfg, key, v, 1, INT64_MAX, &cfg->train_steps);
    }
    if (strcmp(key, "dtype") == 0) {
        rc = get_enum(cfg, key, v, ENUM_ARGS(dtype), &e);
        if (rc == PL_OK) cfg->dtype = (pl_dtype)e;
        return rc;
    }
    if (strcmp(key, "pad_id") == 0)
        return get_int(cfg, key, v, 0, INT64_MAX, &cfg->pad_id);
    if (strcmp(key, "vocab_size") == 0)
        return get_int(cfg, key, v, 1, INT64_MAX, &cfg->vocab_size);
    if (strcmp(key, "long_documents") == 0)
        return get_enum(cfg, key, v, ENUM_ARGS(longdoc),
                        &cfg->long_documents);
    if (strcmp(key, "packing") == 0)
        return get_enum(cfg, key, v, ENUM_ARGS(packing), &cfg->packing);
    if (strcmp(key, "balance") == 0)
        return get_enum(cfg, key, v, ENUM_ARGS(balance), &cfg->balance);
    if (strcmp(key, "on_error") == 0)
        return get_enum(cfg, key, v, ENUM_ARGS(onerr), &cfg->on_error);
    if (strcmp(key, "threads") == 0 || strcmp(key, "prefetch") == 0) {
        rc = get_int(cfg, key, v, 1, 4096, &x);
        if (rc != PL_OK) return rc;
        if (key[0] == 't')
            cfg->threads = (int)x;
        else
            cfg->prefetch = (int)x;
        return PL_OK;
    }
    if (strcmp(key, "max_lag_steps") == 0)
        return get_int(cfg, key, v, 1, (int64_t)1 << 20, &cfg->max_lag_steps);
    if (strcmp(key, "sidecar_index") == 0)
        return get_enum(cfg, key, v, ENUM_ARGS(sidecar), &cfg->sidecar_index);
    if (strcmp(key, "cost.preset") == 0) return set_preset(cfg, v);
    if (strcmp(key, "cost.a") == 0) return get_num(cfg, key, v, &cfg->cost.a);
    if (strcmp(key, "cost.b") == 0) return get_num(cfg, key, v, &cfg->cost.b);
    if (strcmp(key, "cost.c") == 0) return get_num(cfg, key, v, &cfg->cost.c);
    if (strcmp(key, "cost.encoder.a") == 0)
        return get_num(cfg, key, v, &cfg->cost.enc_a);
    if (strcmp(key, "cost.encoder.b") == 0)
        return get_num(cfg, key, v, &cfg->cost.enc_b);
    if (strcmp(key, "cost.window") == 0)
        return get_int(cfg, key, v, 1, INT64_MAX, &cfg->cost.window);
    if (strcmp(key, "long_short.threshold") == 0)
        return get_int(cfg, key, v, 0, INT64_MAX, &cfg->long_short_threshold);
    if (strcmp(key, "cache.max_bytes") == 0)
        return get_int(cfg, key, v, 1, INT64_MAX, &cfg->cache_max_bytes);
    if (strcmp(key, "cache.chunk_bytes") == 0)
        return get_int(cfg, key, v, 4096, (int64_t)1 << 30, &cfg->cache_chunk_bytes);
    if (strcmp(key, "cache.dir") == 0) {
        if (strlen(v->s) >= sizeof cfg->cache_dir)
            return cfg_err(cfg, PL_ECONFIG, v->line, "cache.dir: too long: '%s'", v->s);
        pl__fmt(cfg->cache_dir, sizeof cfg->cache_dir, "%s", v->s);
        return PL_OK;
    }
    if (strcmp(key, "topology.order") == 0) {
        if (strlen(v->s) >= sizeof cfg->topology.order)
            return cfg_err(cfg, PL_ETOPOLOGY, v->line,
                           "topology.order: too long: '%s'", v->s);
        pl__fmt(cfg->topology.order, sizeof cfg->topology.order, "%s", v->s);
        return PL_OK;
    }
    /* topology.dp (or auto: from the world size), .pp, .cp, .tp */
    if (strcmp(key, "topology.dp") == 0 && !v->quoted &&
        strcmp(v->s, "auto") == 0) {
        cfg->topology.dp = 1;
        cfg->topology.dp_auto = 1;
        return PL_OK;
    }
    rc = get_int(cfg, key, v, 1, INT32_MAX, &x);
    if (rc != PL_OK) return rc;
    switch (key[9]) {
    case 'd': cfg->topology.dp = x; cfg->topology.dp_auto = 0; break;
    case 'p': cfg->topology.pp = x; break;
    case 'c': cfg->topology.cp = x; break;
    default: cfg->topology.tp = x; break;
    }
    return PL_OK;
}

/* ------------------------------------------------------------ validation */

static double source_weight_sum(const pl_config *cfg) {
    double s = 0;
    for (int64_t i = 0; i < cfg->n_sources; i++) s += cfg->sources[i].weight;
    return s;
}

static int validate(pl_config *cfg, const vlines *ln) {
    char err[PL__ERRMSG_CAP];
    int order_axes[5], n_axes = 0;
    if (pl__topology_parse_order(cfg->topology.order, order_axes, &n_axes, err,
                                 sizeof err) != PL_OK)
        return cfg_err(cfg, PL_ETOPOLOGY, ln->order, "%s", err);
    {
        /* An axis may be left out of the order only if its size is 1. */
        static const char *const names[5] = {"tp", "cp", "ep", "dp", "pp"};
        const int64_t sizes[5] = {cfg->topology.tp, cfg->topology.cp, 1,
                                  cfg->topology.dp, cfg->topology.pp};
        int seen[5] = {0, 0, 0, 0, 0};
        for (int k = 0; k < n_axes; k++) seen[order_axes[k]] = 1;
        for (int a = 0; a < 5; a++)
            if (!seen[a] && sizes[a] != 1)
                return cfg_err(cfg, PL_ETOPOLOGY, ln->order,
                               "topology.order '%s': axis '%s' missing, but "
                               "topology.%s is %" PRId64
                               " (only axes of size 1 may be left out)",
                               cfg->topology.order, names[a], names[a],
                               sizes[a]);
    }
    int64_t per = cfg->topology.dp * cfg->micro_batch_size;
    if (cfg->global_batch_size % per != 0)
        return cfg_err(cfg, PL_ECONFIG, ln->global_batch_size,
                       "global_batch_size %" PRId64
                       " is not divisible by topology.dp * micro_batch_size "
                       "= %" PRId64 " * %" PRId64,
                       cfg->global_batch_size, cfg->topology.dp,
                       cfg->micro_batch_size);
    if (cfg->topology.cp > 1 && cfg->seq_length % (2 * cfg->topology.cp) != 0)
        return cfg_err(cfg, PL_ECONFIG, ln->seq_length,
                       "seq_length %" PRId64
                       " is not divisible by 2 * topology.cp = %" PRId64,
                       cfg->seq_length, 2 * cfg->topology.cp);
    int sliding = strcmp(cfg->cost.preset, "sliding_window") == 0;
    if (sliding && cfg->cost.window <= 0)
        return cfg_err(cfg, PL_ECONFIG, ln->cost,
                       "cost.window is required with cost.preset "
                       "sliding_window");
    if (!sliding && cfg->cost.window != 0)
        return cfg_err(cfg, PL_ECONFIG, ln->cost,
                       "cost.window applies only to cost.preset "
                       "sliding_window (preset is %s)",
                       cfg->cost.preset);
    if (cfg->dtype == PL_DTYPE_INT32 && cfg->pad_id > INT32_MAX)
        return cfg_err(cfg, PL_ECONFIG, 0,
                       "pad_id %" PRId64 " does not fit dtype int32",
                       cfg->pad_id);
    if (cfg->vocab_size > 0 && cfg->pad_id >= cfg->vocab_size)
        return cfg_err(cfg, PL_ECONFIG, 0,
                       "pad_id %" PRId64 " is outside the vocabulary "
                       "(vocab_size %" PRId64 ")",
                       cfg->pad_id, cfg->vocab_size);
    for (int64_t i = 0; cfg->vocab_size > 0 && i < cfg->n_sources; i++)
        if (cfg->sources[i].eos_id >= cfg->vocab_size)
            return cfg_err(cfg, PL_ECONFIG, ln->sources,
                           "sources[%" PRId64 "] '%s': eos_id %" PRId64
                           " is outside the vocabulary (vocab_size %" PRId64
                           ")",
                           i, cfg->sources[i].name, cfg->sources[i].eos_id,
                           cfg->vocab_size);
    if (cfg->n_sources < 1)
        return cfg_err(cfg, PL_ECONFIG, ln->sources,
                       "sources: at least one source is required");
    if (!cfg->has_schedule && !(source_weight_sum(cfg) > 0))
        return cfg_err(cfg, PL_ECONFIG, ln->sources,
                       "weights of sources sum to zero");
    if (!isfinite(source_weight_sum(cfg)))
        return cfg_err(cfg, PL_ECONFIG, ln->sources,
                       "weights of sources sum to infinity");
    /* Limits of the implementation, so that sizes never overflow. */
    const int64_t lim = PL__MAX_SEQ_LENGTH;
    if (cfg->seq_length > lim)
        return cfg_err(cfg, PL_ECONFIG, ln->seq_length,
                       "seq_length %" PRId64 " is above the limit %" PRId64,
                       cfg->seq_length, lim);
    if (cfg->global_batch_size > lim)
        return cfg_err(cfg, PL_ECONFIG, ln->global_batch_size,
                       "global_batch_size %" PRId64 " is above the limit %" PRId64,
                       cfg->global_batch_size, lim);
    if (cfg->micro_batch_size * cfg->seq_length > INT32_MAX)
        return cfg_err(cfg, PL_ECONFIG, ln->seq_length,
                       "micro_batch_size * seq_length = %" PRId64
                       " does not fit cu_seqlens (int32)",
                       cfg->micro_batch_size * cfg->seq_length);
    int64_t world = 1;
    const int64_t axes[4] = {cfg->topology.dp, cfg->topology.pp,
                             cfg->topology.cp, cfg->topology.tp};
    for (int a = 0; a < 4; a++) {
        world *= axes[a];
        if (world > lim)
            return cfg_err(cfg, PL_ETOPOLOGY, ln->order,
                           "topology: world size dp*pp*cp*tp is above the "
                           "limit %" PRId64, lim);
    }
    if (cfg->train_steps > ((int64_t)1 << 40))
        return cfg_err(cfg, PL_ECONFIG, 0,
                       "train_steps %" PRId64 " is above the limit 2^40 "
                       "(leave it out for an endless run)",
                       cfg->train_steps);
    /* Micro-batch cursors are step * micro-batches per rank; bound them for
       any dp (dp = 1 has the most micro-batches per rank). */
    const int64_t mb_per_step = cfg->global_batch_size / cfg->micro_batch_size;
    if (cfg->train_steps > PL__MAX_MICRO_BATCHES / mb_per_step)
        return cfg_err(cfg, PL_ECONFIG, 0,
                       "train_steps %" PRId64 " * %" PRId64
                       " micro-batches per step (global_batch_size / "
                       "micro_batch_size) is above the limit 2^50",
                       cfg->train_steps, mb_per_step);
    const pl__source_cfg *first_img = NULL;
    for (int64_t i = 0; i < cfg->n_sources; i++) {
        const pl__source_cfg *sc = &cfg->sources[i];
        if (sc->type != PL_SOURCE_WEBDATASET) continue;
        if (cfg->topology.cp > 1)
            return cfg_err(cfg, PL_ECONFIG, ln->sources,
                           "sources[%" PRId64 "] '%s': webdataset sources need "
                           "topology.cp 1 (images are not sliced for context parallelism)",
                           i, sc->name);
        const pl_image_options *io = &pl__sx(sc)->image;
        if (first_img && (pl__sx(first_img)->image.mode != io->mode ||
                          pl__sx(first_img)->image.size != io->size ||
                          pl__sx(first_img)->image.patch_size != io->patch_size))
            return cfg_err(cfg, PL_ECONFIG, ln->sources,
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
            return cfg_err(cfg, PL_ECONFIG, ln->sources,
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
            return cfg_err(cfg, PL_ECONFIG, ln->sources,
                           "sources[%" PRId64 "] '%s': eos_id %" PRId64
                           " does not fit its tokens (at most %" PRId64 ")",
                           i, sc->name, sc->eos_id, max_tok);
    }
    return PL_OK;
}

/* ------------------------------------------------------------ defaults */

static pl_config *config_new(const char *origin) {
    pl_config *cfg = calloc(1, sizeof *cfg);
    if (!cfg) return NULL;
    cfg->origin = pl__strdup(origin ? origin : "<string>");
    if (!cfg->origin) {
        free(cfg);
        return NULL;
    }
    cfg->seed = 1234;
    cfg->seq_length = 8192;
    cfg->global_batch_size = 256;
    cfg->micro_batch_size = 1;
    cfg->train_steps = -1;
    cfg->dtype = PL_DTYPE_INT64;
    cfg->pad_id = 0;
    cfg->long_documents = PL__LONGDOC_SPLIT;
    cfg->packing = PL__PACK_BEST_FIT;
    cfg->balance = PL__BALANCE_NONE;
    pl__fmt(cfg->cost.preset, sizeof cfg->cost.preset, "linear");
    cfg->cost.a = 1.0;
    cfg->cost.b = 0.0;
    cfg->cost.c = 0.0;
    cfg->cost.window = 0;
    cfg->long_short_threshold = 0;
    cfg->on_error = PL__ONERR_FAIL;
    cfg->topology.dp = cfg->topology.pp = 1;
    cfg->topology.cp = cfg->topology.tp = 1;
    pl__fmt(cfg->topology.order, sizeof cfg->topology.order,
            "tp-cp-ep-dp-pp");
    cfg->threads = 2;
    cfg->prefetch = 4;
    cfg->max_lag_steps = 64;
    cfg->interpolation = PL__INTERP_LINEAR;
    return cfg;
}

/* A plain source (no out-of-line option) costs this much per process. */
_Static_assert(sizeof(pl__source_cfg) <= 13 * sizeof(int64_t), "pl__source_cfg grew");

const pl__source_ext pl__source_ext_none;

void pl__source_ext_free(pl__source_ext *x) {
    if (!x) return;
    free(x->text_key);
    free(x->prompt_key);
    free(x->response_key);
    free(x->messages_key);
    for (int q = 0; q < 3; q++) free(x->chat[q]);
    pl__tok_cfg_free(&x->tok);
    free(x);
}

int pl__source_ext_dup(const pl__source_ext *o, pl__source_ext **out) {
    *out = NULL;
    if (!o) return PL_OK;
    pl__source_ext *d = malloc(sizeof *d);
    if (!d) return PL_ENOMEM;
    *d = *o;
    d->text_key = o->text_key ? pl__strdup(o->text_key) : NULL;
    d->prompt_key = o->prompt_key ? pl__strdup(o->prompt_key) : NULL;
    d->response_key = o->response_key ? pl__strdup(o->response_key) : NULL;
    d->messages_key = o->messages_key ? pl__strdup(o->messages_key) : NULL;
    int ok = 1;
    for (int q = 0; q < 3; q++) {
        d->chat[q] = o->chat[q] ? pl__strdup(o->chat[q]) : NULL;
        if (o->chat[q] && !d->chat[q]) ok = 0;
    }
    memset(&d->tok, 0, sizeof d->tok);
    int tok_rc = pl__tok_cfg_dup(&d->tok, &o->tok);
    if (!ok || tok_rc || (o->text_key && !d->text_key) || (o->prompt_key && !d->prompt_key) ||
        (o->response_key && !d->response_key) || (o->messages_key && !d->messages_key)) {
        pl__source_ext_free(d);
        return PL_ENOMEM;
    }
    *out = d;
    return PL_OK;
}

void pl_config_free(pl_config *cfg) {
    if (!cfg) return;
    if (cfg->frozen && __atomic_fetch_sub(&cfg->refs, 1, __ATOMIC_ACQ_REL) > 0)
        return; /* still held */
    for (int64_t i = 0; i < cfg->n_sources; i++) {
        free(cfg->sources[i].name);
        free(cfg->sources[i].path);
        pl__source_ext_free(cfg->sources[i].x);
    }
    pl__tok_cfg_free(&cfg->tok);
    free(cfg->sources);
    for (int part = 0; part < 2; part++) {
        for (int64_t i = 0; i < cfg->n_eval_sources[part]; i++) {
            free(cfg->eval_sources[part][i].name);
            free(cfg->eval_sources[part][i].path);
            pl__source_ext_free(cfg->eval_sources[part][i].x);
        }
        free(cfg->eval_sources[part]);
    }
    for (int64_t k = 0; k < cfg->n_points; k++) free(cfg->points[k].weights);
    free(cfg->points);
    for (int64_t k = 0; k < cfg->n_warnings; k++) free(cfg->warnings[k]);
    free(cfg->warnings);
    free(cfg->origin);
    free(cfg);
}

const char *pl_config_errmsg(const pl_config *cfg) {
    return cfg ? cfg->errmsg : "out of memory";
}

/* ------------------------------------------------------------ YAML walk */

typedef struct walk {
    pl_config *cfg;
    yaml_document_t *doc;
    vlines ln;
    int weight_line;   /* line of the first explicit sources[i].weight */
    int64_t weight_of; /* ... and its source */
    pl__names names; /* source names -> index (walk_sources) */
} walk;

static int line_of(const yaml_node_t *n) {
    return (int)n->start_mark.line + 1;
}

static yaml_node_t *node(walk *w, int id) {
    return yaml_document_get_node(w->doc, id);
}

static const char *type_name(const yaml_node_t *n) {
    switch (n->type) {
    case YAML_SCALAR_NODE: return "a scalar";
    case YAML_SEQUENCE_NODE: return "a list";
    case YAML_MAPPING_NODE: return "a mapping";
    default: return "nothing";
    }
}

static sval scalar_of(const yaml_node_t *n) {
    sval v;
    v.s = (const char *)n->data.scalar.value;
    v.quoted = n->data.scalar.style != YAML_PLAIN_SCALAR_STYLE &&
               n->data.scalar.style != YAML_ANY_SCALAR_STYLE;
    v.line = line_of(n);
    return v;
}

/* Check that `n` is a mapping whose keys are distinct scalars. */
static int cmp_key(const void *a, const void *b) {
    const yaml_node_t *x = *(yaml_node_t *const *)a, *y = *(yaml_node_t *const *)b;
    int c = strcmp((const char *)x->data.scalar.value,
                   (const char *)y->data.scalar.value);
    if (c) return c;
    /* equal keys: the later one (by line) second, to report it */
    return (x->start_mark.index > y->start_mark.index) -
           (x->start_mark.index < y->start_mark.index);
}

static int check_mapping(walk *w, yaml_node_t *n, const char *what) {
    if (n->type != YAML_MAPPING_NODE)
        return cfg_err(w->cfg, PL_ECONFIG, line_of(n),
                       "%s: expected a mapping, got %s", what, type_name(n));
    yaml_node_pair_t *b = n->data.mapping.pairs.start;
    yaml_node_pair_t *e = n->data.mapping.pairs.top;
    size_t count = (size_t)(e - b);
    yaml_node_t **keys = pl__calloc(count ? count : 1, sizeof *keys);
    if (!keys) return cfg_err(w->cfg, PL_ENOMEM, line_of(n), "out of memory");
    for (size_t i = 0; i < count; i++) {
        yaml_node_t *k = node(w, b[i].key);
        if (!k || k->type != YAML_SCALAR_NODE) {
            free(keys);
            return cfg_err(w->cfg, PL_ECONFIG, k ? line_of(k) : 0,
                           "%s: keys must be scalars", what);
        }
        keys[i] = k;
    }
    /* Duplicates: sort the keys, compare neighbours (n log n). */
    if (count > 1) qsort(keys, count, sizeof *keys, cmp_key);
    for (size_t i = 1; i < count; i++) {
        if (strcmp((const char *)keys[i]->data.scalar.value,
                   (const char *)keys[i - 1]->data.scalar.value) == 0) {
            int line = line_of(keys[i]);
            char key[128];
            pl__fmt(key, sizeof key, "%s", (const char *)keys[i]->data.scalar.value);
            free(keys);
            return cfg_err(w->cfg, PL_ECONFIG, line, "%s: duplicate key '%s'",
                           what, key);
        }
    }
    free(keys);
    return PL_OK;
}

static const char *key_str(walk *w, const yaml_node_pair_t *p) {
    return (const char *)node(w, p->key)->data.scalar.value;
}

/* Set the scalar `value` node under dotted key `key` (whose key node is on
 * line `key_line`). */
static int set_node(walk *w, const char *key, int key_line,
                    yaml_node_t *value) {
    if (!is_known_key(key))
        return cfg_err(w->cfg, PL_ECONFIG, key_line, "unknown key '%s'", key);
    if (value->type != YAML_SCALAR_NODE)
        return cfg_err(w->cfg, PL_ECONFIG, line_of(value),
                       "%s: expected a scalar, got %s", key,
                       type_name(value));
    sval v = scalar_of(value);
    return set_scalar(w->cfg, key, &v);
}

/* topology, cost, long_short, cache: a mapping of scalars. */
static int walk_submap(walk *w, const char *name, yaml_node_t *map) {
    int rc = check_mapping(w, map, name);
    if (rc != PL_OK) return rc;
    char key[128];
    yaml_node_pair_t *b = map->data.mapping.pairs.start;
    yaml_node_pair_t *e = map->data.mapping.pairs.top;
    /* cost.preset first, so that a, b, c override it in any order. */
    for (int pass = 0; pass < 2; pass++) {
        for (yaml_node_pair_t *p = b; p < e; p++) {
            const char *k = key_str(w, p);
            int is_preset = strcmp(name, "cost") == 0 &&
                            strcmp(k, "preset") == 0;
            if (is_preset != (pass == 0)) continue;
            pl__fmt(key, sizeof key, "%s.%s", name, k);
            if (strcmp(key, "topology.order") == 0)
                w->ln.order = line_of(node(w, p->key));
            if (strncmp(key, "cost.", 5) == 0 && !w->ln.cost)
                w->ln.cost = line_of(node(w, p->key));
            yaml_node_t *vn = node(w, p->value);
            if (strcmp(key, "cost.encoder") == 0 && vn->type == YAML_MAPPING_NODE) {
                /* cost.encoder: {a, b}, the image encoder's term */
                if ((rc = check_mapping(w, vn, key)) != PL_OK) return rc;
                char sub[160];
                for (yaml_node_pair_t *q = vn->data.mapping.pairs.start;
                     q < vn->data.mapping.pairs.top; q++) {
                    pl__fmt(sub, sizeof sub, "%s.%s", key, key_str(w, q));
                    rc = set_node(w, sub, line_of(node(w, q->key)), node(w, q->value));
                    if (rc != PL_OK) return rc;
                }
                continue;
            }
            rc = set_node(w, key, line_of(node(w, p->key)), vn);
            if (rc != PL_OK) return rc;
        }
    }
    if (strcmp(name, "cost") == 0 && !w->ln.cost) w->ln.cost = line_of(map);
    return PL_OK;
}

/* sources[i].image: {mode, size, patch_size, merge_size, min_pixels,
 * max_pixels, token_id, limit_pixels, caption_token_offset}. */
static int walk_image(walk *w, const char *what, yaml_node_t *map,
                      pl_image_options *o) {
    pl_config *cfg = w->cfg;
    int rc = check_mapping(w, map, what);
    if (rc != PL_OK) return rc;
    char key[160];
    int has_token = 0;
    o->token_id = -1;
    for (yaml_node_pair_t *p = map->data.mapping.pairs.start;
         p < map->data.mapping.pairs.top; p++) {
        const char *k = key_str(w, p);
        yaml_node_t *vn = node(w, p->value);
        pl__fmt(key, sizeof key, "%s.%s", what, k);
        if (vn->type != YAML_SCALAR_NODE)
            return cfg_err(cfg, PL_ECONFIG, line_of(vn), "%s: expected a scalar, got %s",
                           key, type_name(vn));
        sval v = scalar_of(vn);
        int en = 0;
        if (strcmp(k, "mode") == 0) {
            if ((rc = get_enum(cfg, key, &v, ENUM_ARGS(imode), &en))) return rc;
            o->mode = (pl_image_mode)en;
            continue;
        }
        static const char *const names[] = {"size", "patch_size", "merge_size",
                                            "min_pixels", "max_pixels", "token_id",
                                            "limit_pixels", "caption_token_offset"};
        int64_t *dst[] = {&o->size, &o->patch_size, &o->merge_size, &o->min_pixels,
                          &o->max_pixels, &o->token_id, &o->limit_pixels,
                          &o->caption_token_offset};
        int64_t lo[] = {1, 1, 1, 1, 1, 0, 1, 0};
        int64_t hi[] = {16384, 1024, 64, (int64_t)1 << 30, (int64_t)1 << 30,
                        UINT32_MAX, (int64_t)1 << 40, UINT32_MAX - 255};
        int j = 0;
        while (j < NELEM(names) && strcmp(k, names[j])) j++;
        if (j == NELEM(names))
            return cfg_err(cfg, PL_ECONFIG, line_of(node(w, p->key)),
                           "unknown key '%s' (expected mode, size, patch_size, "
                           "merge_size, min_pixels, max_pixels, token_id, "
                           "limit_pixels, caption_token_offset)",
                           key);
        if ((rc = get_int(cfg, key, &v, lo[j], hi[j], dst[j]))) return rc;
        has_token |= j == 5;
    }
    if (!has_token)
        return cfg_err(cfg, PL_ECONFIG, line_of(map),
                       "%s: token_id (the image placeholder token) is required", what);
    const int64_t f = (o->patch_size ? o->patch_size : 14) *
                      (o->merge_size ? o->merge_size : (o->mode == PL_IMAGE_NATIVE ? 2 : 1));
    if (o->mode != PL_IMAGE_NATIVE && (o->size ? o->size : 336) % f)
        return cfg_err(cfg, PL_ECONFIG, line_of(map),
                       "%s.size %lld is not a multiple of patch_size * merge_size = %lld",
                       what, (long long)(o->size ? o->size : 336), (long long)f);
    if (o->min_pixels && o->max_pixels && o->min_pixels > o->max_pixels)
        return cfg_err(cfg, PL_ECONFIG, line_of(map), "%s: min_pixels > max_pixels",
                       what);
    return PL_OK;
}

/* A `tokenizer:` mapping: {type, path, add_eos, threads}. */
/* chat_template: "chatml", or {system, user, assistant} strings, each with
 * {content} once (checked when the source opens). */
static int walk_chat(walk *w, const char *key, yaml_node_t *vn, char **chat) {
    pl_config *cfg = w->cfg;
    static const char *const roles[3] = {"system", "user", "assistant"};
    for (int k = 0; k < 3; k++) free(chat[k]), chat[k] = NULL;
    if (vn->type == YAML_SCALAR_NODE) {
        sval v = scalar_of(vn);
        if (strcmp(v.s, "chatml") != 0)
            return cfg_err(cfg, PL_ECONFIG, v.line,
                           "%s: unknown value '%s' (expected chatml, or a mapping of "
                           "system, user and assistant)",
                           key, v.s);
        for (int k = 0; k < 3; k++) {
            char b[96];
            pl__fmt(b, sizeof b, "<|im_start|>%s\n{content}<|im_end|>\n", roles[k]);
            if (!(chat[k] = pl__strdup(b))) return cfg_err(cfg, PL_ENOMEM, 0, "out of memory");
        }
        return PL_OK;
    }
    int rc = check_mapping(w, vn, key);
    if (rc != PL_OK) return rc;
    for (yaml_node_pair_t *p = vn->data.mapping.pairs.start;
         p < vn->data.mapping.pairs.top; p++) {
        const char *k = key_str(w, p);
        yaml_node_t *xn = node(w, p->value);
        char full[200];
        pl__fmt(full, sizeof full, "%s.%s", key, k);
        int r = strcmp(k, "system") == 0 ? 0 : strcmp(k, "user") == 0 ? 1
                : strcmp(k, "assistant") == 0 ? 2 : -1;
        if (r < 0)
            return cfg_err(cfg, PL_ECONFIG, line_of(node(w, p->key)),
                           "unknown key '%s' (expected system, user, assistant)", full);
        if (xn->type != YAML_SCALAR_NODE)
            return cfg_err(cfg, PL_ECONFIG, line_of(xn), "%s: expected a string", full);
        sval v = scalar_of(xn);
        const char *at = strstr(v.s, "{content}");
        if (!at || strstr(at + 9, "{content}"))
            return cfg_err(cfg, PL_ECONFIG, v.line, "%s must hold {content} once", full);
        free(chat[r]);
        if (!(chat[r] = pl__strdup(v.s))) return cfg_err(cfg, PL_ENOMEM, 0, "out of memory");
    }
    for (int k = 0; k < 3; k++)
        if (!chat[k])
            return cfg_err(cfg, PL_ECONFIG, line_of(vn), "%s: missing key '%s'", key,
                           roles[k]);
    return PL_OK;
}

static int walk_tokenizer(walk *w, const char *what, yaml_node_t *map,
                          pl__tok_cfg *t) {
    pl_config *cfg = w->cfg;
    char key[160];
    pl__fmt(key, sizeof key, "%s.tokenizer", what[0] ? what : "");
    const char *base = what[0] ? key : "tokenizer";
    int rc = check_mapping(w, map, base);
    if (rc != PL_OK) return rc;
    pl__tok_cfg_free(t);
    memset(t, 0, sizeof *t);
    t->set = 1;
    t->add_eos = 1;
    t->threads = 1;
    t->line = line_of(map);
    int has_type = 0;
    for (yaml_node_pair_t *p = map->data.mapping.pairs.start;
         p < map->data.mapping.pairs.top; p++) {
        const char *k = key_str(w, p);
        yaml_node_t *vn = node(w, p->value);
        char full[200];
        pl__fmt(full, sizeof full, "%s.%s", base, k);
        if (strcmp(k, "type") && strcmp(k, "path") && strcmp(k, "add_eos") &&
            strcmp(k, "threads") && strcmp(k, "pat_str") && strcmp(k, "encoding"))
            return cfg_err(cfg, PL_ECONFIG, line_of(node(w, p->key)),
                           "unknown key '%s' (expected type, path, add_eos, "
                           "threads, and for tiktoken pat_str or encoding)",
                           full);
        if (vn->type != YAML_SCALAR_NODE)
            return cfg_err(cfg, PL_ECONFIG, line_of(vn),
                           "%s: expected a scalar, got %s", full, type_name(vn));
        sval v = scalar_of(vn);
        if (is_null(&v))
            return cfg_err(cfg, PL_ECONFIG, v.line, "%s: missing value", full);
        if (strcmp(k, "type") == 0) {
            rc = get_enum(cfg, full, &v, ENUM_ARGS(toktype), &t->type);
            has_type = 1;
        } else if (strcmp(k, "path") == 0 || strcmp(k, "pat_str") == 0 ||
                   strcmp(k, "encoding") == 0) {
            char **dst = strcmp(k, "path") == 0      ? &t->path
                         : strcmp(k, "pat_str") == 0 ? &t->pat_str
                                                     : &t->encoding;
            free(*dst);
            *dst = pl__strdup(v.s);
            if (!*dst) return cfg_err(cfg, PL_ENOMEM, 0, "out of memory");
        } else if (strcmp(k, "add_eos") == 0) {
            if (strcmp(v.s, "true") == 0 || strcmp(v.s, "1") == 0)
                t->add_eos = 1;
            else if (strcmp(v.s, "false") == 0 || strcmp(v.s, "0") == 0)
                t->add_eos = 0;
            else
                return cfg_err(cfg, PL_ECONFIG, v.line,
                               "%s: expected true or false, got '%s'", full, v.s);
        } else {
            int64_t th = 1;
            rc = get_int(cfg, full, &v, 1, 256, &th);
            t->threads = (int)th;
        }
        if (rc != PL_OK) return rc;
    }
    if (!has_type)
        return cfg_err(cfg, PL_ECONFIG, t->line,
                       "%s: missing key 'type' (bytes, hf, sentencepiece or "
                       "tiktoken)",
                       base);
    if (t->type != PL__TOK_BYTES && (!t->path || !t->path[0]))
        return cfg_err(cfg, PL_ECONFIG, t->line, "%s: missing key 'path'", base);
    if (t->type != PL__TOK_TIKTOKEN && (t->pat_str || t->encoding))
        return cfg_err(cfg, PL_ECONFIG, t->line,
                       "%s: %s applies only to type tiktoken", base,
                       t->pat_str ? "pat_str" : "encoding");
    if (t->type == PL__TOK_TIKTOKEN && !t->pat_str == !t->encoding)
        return cfg_err(cfg, PL_ECONFIG, t->line,
                       "%s: a tiktoken tokenizer needs %s: 'encoding' (a published "
                       "encoding's name, e.g. r50k_base, cl100k_base or o200k_base: its "
                       "pattern and special tokens) or 'pat_str' (the pre-tokenizer "
                       "regex)",
                       base, t->pat_str ? "one of them, not both" : "one of");
    return PL_OK;
}

int pl__tok_cfg_dup(pl__tok_cfg *dst, const pl__tok_cfg *src) {
    *dst = *src;
    dst->path = src->path ? pl__strdup(src->path) : NULL;
    dst->pat_str = src->pat_str ? pl__strdup(src->pat_str) : NULL;
    dst->encoding = src->encoding ? pl__strdup(src->encoding) : NULL;
    return (src->path && !dst->path) || (src->pat_str && !dst->pat_str) ||
                   (src->encoding && !dst->encoding)
               ? PL_ENOMEM
               : PL_OK;
}

void pl__tok_cfg_free(pl__tok_cfg *t) {
    free(t->path);
    free(t->pat_str);
    free(t->encoding);
    t->path = t->pat_str = t->encoding = NULL;
}

static int walk_source(walk *w, const char *list, int64_t i, yaml_node_t *map,
                       pl__source_cfg *s, pl__names *names) {
    pl_config *cfg = w->cfg;
    char what[64];
    char key[96];
    const int main_list = strcmp(list, "sources") == 0;
    pl__fmt(what, sizeof what, "%s[%" PRId64 "]", list, i);
    int rc = check_mapping(w, map, what);
    if (rc != PL_OK) return rc;
    s->type = (pl_source_type)0;
    s->eos_id = -1;
    s->weight = 1.0;
    s->token_dtype = (pl_dtype)0;
    /* The options kept out of line: parsed into x, dropped at the end when the
     * source sets none (on an error the config's free releases them). */
    pl__source_ext *x = s->x ? s->x : pl__calloc(1, sizeof *x);
    if (!x) return cfg_err(cfg, PL_ENOMEM, 0, "out of memory");
    s->x = x;
    int line_tdtype = 0, line_eos = 0, line_path = 0, has_type = 0, line_image = 0;
    int line_text = 0, line_key = 0; /* keys of jsonl/text sources */
    int line_tkey = 0, line_sft = 0, line_msg = 0, line_chat = 0;
    yaml_node_pair_t *b = map->data.mapping.pairs.start;
    yaml_node_pair_t *e = map->data.mapping.pairs.top;
    for (yaml_node_pair_t *p = b; p < e; p++) {
        const char *k = key_str(w, p);
        yaml_node_t *vn = node(w, p->value);
        pl__fmt(key, sizeof key, "%s.%s", what, k);
        if (strcmp(k, "name") && strcmp(k, "type") && strcmp(k, "path") &&
            strcmp(k, "weight") && strcmp(k, "token_dtype") &&
            strcmp(k, "eos_id") && strcmp(k, "max_epochs") && strcmp(k, "image") &&
            strcmp(k, "caption") && strcmp(k, "index") && strcmp(k, "split") &&
            strcmp(k, "text_key") && strcmp(k, "tokenizer") && strcmp(k, "lookahead") &&
            strcmp(k, "prompt_key") && strcmp(k, "response_key") &&
            strcmp(k, "messages_key") && strcmp(k, "chat_template"))
            return cfg_err(cfg, PL_ECONFIG, line_of(node(w, p->key)),
                           "unknown key '%s' (expected name, type, path, "
                           "weight, token_dtype, eos_id, max_epochs, split, image, "
                           "caption, index, text_key, prompt_key, response_key, "
                           "messages_key, chat_template, tokenizer, lookahead)",
                           key);
        if (strcmp(k, "image") == 0) {
            rc = walk_image(w, key, vn, &x->image);
            if (rc != PL_OK) return rc;
            line_image = line_of(vn);
            continue;
        } else if (strcmp(k, "tokenizer") == 0) {
            rc = walk_tokenizer(w, what, vn, &x->tok);
            if (rc != PL_OK) return rc;
            line_text = line_of(node(w, p->key));
            continue;
        } else if (strcmp(k, "chat_template") == 0) {
            rc = walk_chat(w, key, vn, x->chat);
            if (rc != PL_OK) return rc;
            line_text = line_key = line_chat = line_of(node(w, p->key));
            continue;
        }
        if (vn->type != YAML_SCALAR_NODE)
            return cfg_err(cfg, PL_ECONFIG, line_of(vn),
                           "%s: expected a scalar, got %s", key,
                           type_name(vn));
        sval v = scalar_of(vn);
        if (is_null(&v))
            return cfg_err(cfg, PL_ECONFIG, v.line, "%s: missing value", key);
        int en = 0;
        if (strcmp(k, "name") == 0) {
            free(s->name);
            s->name = pl__strdup(v.s);
            if (!s->name) return cfg_err(cfg, PL_ENOMEM, 0, "out of memory");
        } else if (strcmp(k, "path") == 0) {
            free(s->path);
            s->path = pl__strdup(v.s);
            if (!s->path) return cfg_err(cfg, PL_ENOMEM, 0, "out of memory");
            line_path = v.line;
        } else if (strcmp(k, "type") == 0) {
            rc = get_enum(cfg, key, &v, ENUM_ARGS(stype), &en);
            if (rc != PL_OK) return rc;
            s->type = (pl_source_type)en;
            has_type = 1;
        } else if (strcmp(k, "token_dtype") == 0) {
            rc = get_enum(cfg, key, &v, ENUM_ARGS(tdtype), &en);
            if (rc != PL_OK) return rc;
            s->token_dtype = (pl_dtype)en;
            line_tdtype = v.line;
        } else if (strcmp(k, "eos_id") == 0) {
            rc = get_int(cfg, key, &v, 0, INT64_MAX, &s->eos_id);
            if (rc != PL_OK) return rc;
            line_eos = v.line;
        } else if (strcmp(k, "max_epochs") == 0) {
            rc = get_int(cfg, key, &v, 1, INT32_MAX, &s->max_epochs);
            if (rc != PL_OK) return rc;
        } else if (strcmp(k, "split") == 0) {
            if (!main_list)
                return cfg_err(cfg, PL_ECONFIG, v.line,
                               "%s: %s are read whole; split applies to "
                               "sources",
                               key, list);
            rc = parse_split(cfg, key, &v, s->split);
            if (rc != PL_OK) return rc;
            s->has_split = 1;
        } else if (strcmp(k, "caption") == 0) {
            if (strlen(v.s) >= sizeof x->image.caption_key ||
                (strcmp(v.s, "txt") && (strncmp(v.s, "json:", 5) || !v.s[5])))
                return cfg_err(cfg, PL_ECONFIG, v.line,
                               "%s: expected txt or json:FIELD, got '%s'", key, v.s);
            pl__fmt(x->image.caption_key, sizeof x->image.caption_key, "%s", v.s);
            line_image = line_image ? line_image : v.line;
        } else if (strcmp(k, "index") == 0) {
            rc = get_enum(cfg, key, &v, ENUM_ARGS(index), &s->write_index);
            if (rc != PL_OK) return rc;
        } else if (strcmp(k, "text_key") == 0) {
            if (!v.s[0])
                return cfg_err(cfg, PL_ECONFIG, v.line, "%s is empty", key);
            free(x->text_key);
            x->text_key = pl__strdup(v.s);
            if (!x->text_key) return cfg_err(cfg, PL_ENOMEM, 0, "out of memory");
            line_text = v.line;
            line_key = v.line;
            line_tkey = v.line;
        } else if (strcmp(k, "messages_key") == 0) {
            if (!v.s[0])
                return cfg_err(cfg, PL_ECONFIG, v.line, "%s is empty", key);
            free(x->messages_key);
            x->messages_key = pl__strdup(v.s);
            if (!x->messages_key) return cfg_err(cfg, PL_ENOMEM, 0, "out of memory");
            line_text = line_key = line_msg = v.line;
        } else if (strcmp(k, "prompt_key") == 0 || strcmp(k, "response_key") == 0) {
            if (!v.s[0])
                return cfg_err(cfg, PL_ECONFIG, v.line, "%s is empty", key);
            char **dst = k[0] == 'p' ? &x->prompt_key : &x->response_key;
            free(*dst);
            *dst = pl__strdup(v.s);
            if (!*dst) return cfg_err(cfg, PL_ENOMEM, 0, "out of memory");
            line_text = v.line;
            line_key = v.line;
            line_sft = v.line;
        } else if (strcmp(k, "lookahead") == 0) {
            rc = get_int(cfg, key, &v, 1, (int64_t)1 << 24, &x->lookahead);
            if (rc != PL_OK) return rc;
            line_text = v.line;
        } else {
            rc = get_num(cfg, key, &v, &s->weight);
            if (rc != PL_OK) return rc;
            if (main_list && !w->weight_line) {
                w->weight_line = v.line;
                w->weight_of = i;
            }
        }
    }
    const int line = line_of(map);
    if (!s->name)
        return cfg_err(cfg, PL_ECONFIG, line, "%s: missing key 'name'", what);
    if (!s->name[0])
        return cfg_err(cfg, PL_ECONFIG, line, "%s.name is empty", what);
    if (!has_type)
        return cfg_err(cfg, PL_ECONFIG, line,
                       "%s (%s): missing key 'type' (megatron, llmc, flat, jsonl or text)",
                       what, s->name);
    if (!s->path)
        return cfg_err(cfg, PL_ECONFIG, line, "%s (%s): missing key 'path'",
                       what, s->name);
    /* Duplicates through the name index: O(1) per source, not a scan. */
    if (pl__names_put(names, s->name, strlen(s->name), i) != -1)
        return cfg_err(cfg, PL_ECONFIG, line,
                       "%s: duplicate source name '%s'", what, s->name);
    if (s->token_dtype && s->type != PL_SOURCE_FLAT)
        return cfg_err(cfg, PL_ECONFIG, line_tdtype,
                       "%s.token_dtype applies only to flat sources "
                       "(source '%s' is %s)",
                       what, s->name, stype_names[s->type - 1]);
    if (s->type == PL_SOURCE_FLAT && !s->token_dtype)
        s->token_dtype = PL_DTYPE_UINT16;
    int is_text = pl__is_text_type(s->type);
    if (line_text && !is_text)
        return cfg_err(cfg, PL_ECONFIG, line_text,
                       "%s: text_key, tokenizer and lookahead apply only to "
                       "jsonl, text and parquet sources (source '%s' is %s)",
                       what, s->name, stype_names[s->type - 1]);
    if (line_key && s->type != PL_SOURCE_JSONL &&
        !(s->type == PL_SOURCE_PARQUET && line_key == line_tkey && !line_sft &&
          !line_msg && !line_chat))
        return cfg_err(cfg, PL_ECONFIG, line_key,
                       "%s.%s applies only to jsonl sources (source '%s' "
                       "is %s)",
                       what,
                       line_sft ? "prompt_key/response_key"
                       : line_msg || line_chat ? "messages_key/chat_template"
                                               : "text_key",
                       s->name, stype_names[s->type - 1]);
    if ((line_msg || line_chat) && (line_sft || line_tkey))
        return cfg_err(cfg, PL_ECONFIG, line_msg ? line_msg : line_chat,
                       "%s (%s): messages_key is used instead of text_key, prompt_key "
                       "and response_key (give one kind)",
                       what, s->name);
    if (line_msg && !x->chat[0])
        return cfg_err(cfg, PL_ECONFIG, line_msg,
                       "%s (%s): messages_key needs chat_template (chatml, or "
                       "{system, user, assistant} strings with {content})",
                       what, s->name);
    if (line_chat && !x->messages_key)
        return cfg_err(cfg, PL_ECONFIG, line_chat,
                       "%s (%s): chat_template needs messages_key", what, s->name);
    if (line_sft && (!x->prompt_key || !x->response_key))
        return cfg_err(cfg, PL_ECONFIG, line_sft,
                       "%s (%s): instruction data needs both prompt_key and "
                       "response_key",
                       what, s->name);
    if (line_sft && line_tkey)
        return cfg_err(cfg, PL_ECONFIG, line_tkey,
                       "%s (%s): text_key is not used with prompt_key and "
                       "response_key (give one or the other)",
                       what, s->name);
    if (line_eos && s->type == PL_SOURCE_MEGATRON)
        return cfg_err(cfg, PL_ECONFIG, line_eos,
                       "%s.eos_id applies only to llmc and flat sources "
                       "(source '%s' is megatron)",
                       what, s->name);
    if (s->type == PL_SOURCE_WEBDATASET && !line_image)
        return cfg_err(cfg, PL_ECONFIG, line,
                       "%s (%s): a webdataset source needs 'image' (with token_id)",
                       what, s->name);
    if (s->type != PL_SOURCE_WEBDATASET && line_image)
        return cfg_err(cfg, PL_ECONFIG, line_image,
                       "%s: image and caption apply only to webdataset sources "
                       "(source '%s' is %s)",
                       what, s->name, stype_names[s->type - 1]);
    s->path_line = line_path; /* paths are checked when the source opens */
    if (memcmp(x, &pl__source_ext_none, sizeof *x) == 0) {
        free(x); /* every option at its default: nothing out of line */
        s->x = NULL;
    }
    return PL_OK;
}

/* sources, valid_sources or test_sources: a list of source mappings into
 * *arr (*n counts those allocated, so that a failure frees them). */
static int walk_source_list(walk *w, const char *list, yaml_node_t *seq,
                            pl__source_cfg **arr, int64_t *count,
                            pl__names *names) {
    pl_config *cfg = w->cfg;
    if (seq->type != YAML_SEQUENCE_NODE)
        return cfg_err(cfg, PL_ECONFIG, line_of(seq),
                       "%s: expected a list, got %s", list, type_name(seq));
    yaml_node_item_t *b = seq->data.sequence.items.start;
    yaml_node_item_t *e = seq->data.sequence.items.top;
    size_t n = (size_t)(e - b);
    if (n == 0)
        return cfg_err(cfg, PL_ECONFIG, line_of(seq),
                       "%s: at least one source is required", list);
    *arr = pl__calloc(n, sizeof **arr);
    if (!*arr || pl__names_init(names, (int64_t)n) != PL_OK)
        return cfg_err(cfg, PL_ENOMEM, 0, "out of memory");
    for (size_t i = 0; i < n; i++) {
        *count = (int64_t)i + 1;
        int rc = walk_source(w, list, (int64_t)i, node(w, b[i]), &(*arr)[i],
                             names);
        if (rc != PL_OK) return rc;
    }
    return PL_OK;
}

static int walk_sources(walk *w, yaml_node_t *seq) {
    return walk_source_list(w, "sources", seq, &w->cfg->sources,
                            &w->cfg->n_sources, &w->names);
}

/* valid_sources (part 0) or test_sources (part 1). */
static int walk_eval_sources(walk *w, int part, yaml_node_t *seq) {
    pl__names names = {0};
    int rc = walk_source_list(w, part ? "test_sources" : "valid_sources", seq,
                              &w->cfg->eval_sources[part],
                              &w->cfg->n_eval_sources[part], &names);
    pl__names_free(&names);
    if (rc != PL_OK) return rc;
    for (int64_t i = 0; i < w->cfg->n_eval_sources[part]; i++) {
        const pl__source_cfg *s = &w->cfg->eval_sources[part][i];
        if (!(s->weight >= 0) || !isfinite(s->weight))
            return cfg_err(w->cfg, PL_ECONFIG, s->path_line,
                           "%s[%" PRId64 "].weight must be finite and >= 0",
                           part ? "test_sources" : "valid_sources", i);
    }
    return PL_OK;
}

static int64_t source_index(const walk *w, const char *name) {
    return pl__names_get(&w->names, name, strlen(name));
}

/* Warnings of schedule point k: sources it leaves out (weight 0 there) and
 * weights that do not sum to 1 (normalized). */
static int point_warnings(walk *w, int64_t k, yaml_node_t *wmap, double sum,
                          int line) {
    pl_config *cfg = w->cfg;
    const pl__sched_point *pt = &cfg->points[k];
    unsigned char *named = pl__calloc((size_t)cfg->n_sources, 1);
    if (!named) return cfg_err(cfg, PL_ENOMEM, 0, "out of memory");
    for (yaml_node_pair_t *q = wmap->data.mapping.pairs.start;
         q < wmap->data.mapping.pairs.top; q++)
        named[source_index(w, key_str(w, q))] = 1; /* names were checked */
    char list[256] = "";
    size_t used = 0;
    int64_t omitted = 0;
    for (int64_t i = 0; i < cfg->n_sources; i++) {
        if (named[i]) continue;
        if (omitted < 8 && used < sizeof list) {
            int n = snprintf(list + used, sizeof list - used, "%s'%s'",
                             omitted ? ", " : "", cfg->sources[i].name);
            if (n > 0) used += (size_t)n;
        }
        omitted++;
    }
    free(named);
    int rc = PL_OK;
    if (omitted)
        rc = cfg_warn(cfg, line,
                      "schedule.points[%" PRId64 "] (step %" PRId64
                      ") omits source%s %s%s: %s weight is 0 there",
                      k, pt->step, omitted > 1 ? "s" : "", list,
                      omitted > 8 ? ", ..." : "", omitted > 1 ? "their" : "its");
    if (rc == PL_OK && fabs(sum - 1.0) > 1e-6)
        rc = cfg_warn(cfg, line,
                      "schedule.points[%" PRId64 "].weights sum to %g, not 1: "
                      "they are normalized (divided by %g)",
                      k, sum, sum);
    return rc;
}

/* Warnings of the whole config, after validation (see the file comment). */
static int config_warnings(walk *w) {
    pl_config *cfg = w->cfg;
    int rc = PL_OK;
    if (!w->ln.seq_length)
        rc = cfg_warn(cfg, 0,
                      "seq_length is not set: using the default %" PRId64,
                      cfg->seq_length);
    if (rc == PL_OK && cfg->has_schedule && w->weight_line)
        rc = cfg_warn(cfg, w->weight_line,
                      "sources[%" PRId64 "].weight ('%s') is ignored: the "
                      "schedule sets every weight",
                      w->weight_of, cfg->sources[w->weight_of].name);
    double sum = source_weight_sum(cfg);
    if (rc == PL_OK && !cfg->has_schedule && fabs(sum - 1.0) > 1e-6) {
        char list[256] = "";
        size_t used = 0;
        for (int64_t i = 0; i < cfg->n_sources && i < 8 && used < sizeof list;
             i++) {
            int n = snprintf(list + used, sizeof list - used, "%s%s %.4g",
                             i ? ", " : "", cfg->sources[i].name,
                             cfg->sources[i].weight / sum);
            if (n > 0) used += (size_t)n;
        }
        rc = cfg_warn(cfg, w->ln.sources,
                      "weights of sources sum to %g, not 1: they are "
                      "normalized to %s%s",
                      sum, list, cfg->n_sources > 8 ? ", ..." : "");
    }
    return rc;
}

static int walk_point(walk *w, int64_t k, yaml_node_t *map) {
    pl_config *cfg = w->cfg;
    char what[64];
    char key[160];
    pl__fmt(what, sizeof what, "schedule.points[%" PRId64 "]", k);
    int rc = check_mapping(w, map, what);
    if (rc != PL_OK) return rc;
    pl__sched_point *pt = &cfg->points[k];
    pt->weights = pl__calloc((size_t)cfg->n_sources, sizeof(double));
    if (!pt->weights) return cfg_err(cfg, PL_ENOMEM, 0, "out of memory");
    int has_step = 0, has_weights = 0, line_step = line_of(map);
    int line_weights = line_of(map);
    yaml_node_t *wmap = NULL;
    yaml_node_pair_t *b = map->data.mapping.pairs.start;
    yaml_node_pair_t *e = map->data.mapping.pairs.top;
    for (yaml_node_pair_t *p = b; p < e; p++) {
        const char *kk = key_str(w, p);
        yaml_node_t *vn = node(w, p->value);
        pl__fmt(key, sizeof key, "%s.%s", what, kk);
        if (strcmp(kk, "step") == 0) {
            if (vn->type != YAML_SCALAR_NODE)
                return cfg_err(cfg, PL_ECONFIG, line_of(vn),
                               "%s: expected an integer, got %s", key,
                               type_name(vn));
            sval v = scalar_of(vn);
            rc = get_int(cfg, key, &v, 0, INT64_MAX, &pt->step);
            if (rc != PL_OK) return rc;
            has_step = 1;
            line_step = v.line;
        } else if (strcmp(kk, "weights") == 0) {
            rc = check_mapping(w, vn, key);
            if (rc != PL_OK) return rc;
            line_weights = line_of(vn);
            wmap = vn;
            for (yaml_node_pair_t *q = vn->data.mapping.pairs.start;
                 q < vn->data.mapping.pairs.top; q++) {
                const char *sname = key_str(w, q);
                int64_t si = source_index(w, sname);
                if (si < 0)
                    return cfg_err(cfg, PL_ECONFIG, line_of(node(w, q->key)),
                                   "%s: unknown source '%s'", key, sname);
                yaml_node_t *wn = node(w, q->value);
                char wkey[256];
                pl__fmt(wkey, sizeof wkey, "%s.%s", key, sname);
                if (wn->type != YAML_SCALAR_NODE)
                    return cfg_err(cfg, PL_ECONFIG, line_of(wn),
                                   "%s: expected a number, got %s", wkey,
                                   type_name(wn));
                sval v = scalar_of(wn);
                rc = get_num(cfg, wkey, &v, &pt->weights[si]);
                if (rc != PL_OK) return rc;
            }
            has_weights = 1;
        } else {
            return cfg_err(cfg, PL_ECONFIG, line_of(node(w, p->key)),
                           "unknown key '%s' (expected step, weights)", key);
        }
    }
    if (!has_step)
        return cfg_err(cfg, PL_ECONFIG, line_of(map),
                       "%s: missing key 'step'", what);
    if (!has_weights)
        return cfg_err(cfg, PL_ECONFIG, line_of(map),
                       "%s: missing key 'weights'", what);
    if (k > 0 && pt->step <= cfg->points[k - 1].step)
        return cfg_err(cfg, PL_ECONFIG, line_step,
                       "%s.step: steps must increase (%" PRId64
                       " after %" PRId64 ")",
                       what, pt->step, cfg->points[k - 1].step);
    double sum = 0;
    for (int64_t i = 0; i < cfg->n_sources; i++) sum += pt->weights[i];
    if (!(sum > 0))
        return cfg_err(cfg, PL_ECONFIG, line_weights,
                       "%s.weights sum to zero", what);
    if (!isfinite(sum))
        return cfg_err(cfg, PL_ECONFIG, line_weights,
                       "%s.weights sum to infinity", what);
    return point_warnings(w, k, wmap, sum, line_weights);
}

static int walk_schedule(walk *w, yaml_node_t *map) {
    pl_config *cfg = w->cfg;
    int rc = check_mapping(w, map, "schedule");
    if (rc != PL_OK) return rc;
    yaml_node_t *points = NULL;
    for (yaml_node_pair_t *p = map->data.mapping.pairs.start;
         p < map->data.mapping.pairs.top; p++) {
        const char *k = key_str(w, p);
        yaml_node_t *vn = node(w, p->value);
        if (strcmp(k, "interpolation") == 0) {
            if (vn->type != YAML_SCALAR_NODE)
                return cfg_err(cfg, PL_ECONFIG, line_of(vn),
                               "schedule.interpolation: expected a scalar, "
                               "got %s",
                               type_name(vn));
            sval v = scalar_of(vn);
            rc = get_enum(cfg, "schedule.interpolation", &v,
                          ENUM_ARGS(interp), &cfg->interpolation);
            if (rc != PL_OK) return rc;
        } else if (strcmp(k, "points") == 0) {
            points = vn;
        } else {
            return cfg_err(cfg, PL_ECONFIG, line_of(node(w, p->key)),
                           "unknown key 'schedule.%s' (expected "
                           "interpolation, points)",
                           k);
        }
    }
    if (!points)
        return cfg_err(cfg, PL_ECONFIG, line_of(map),
                       "schedule: missing key 'points'");
    if (points->type != YAML_SEQUENCE_NODE ||
        points->data.sequence.items.top == points->data.sequence.items.start)
        return cfg_err(cfg, PL_ECONFIG, line_of(points),
                       "schedule.points: expected a non-empty list");
    yaml_node_item_t *b = points->data.sequence.items.start;
    size_t n = (size_t)(points->data.sequence.items.top - b);
    cfg->points = pl__calloc(n, sizeof *cfg->points);
    if (!cfg->points) return cfg_err(cfg, PL_ENOMEM, 0, "out of memory");
    cfg->has_schedule = 1;
    for (size_t k = 0; k < n; k++) {
        cfg->n_points = (int64_t)k + 1;
        rc = walk_point(w, (int64_t)k, node(w, b[k]));
        if (rc != PL_OK) return rc;
    }
    return PL_OK;
}

static int walk_root(walk *w) {
    pl_config *cfg = w->cfg;
    yaml_node_t *root = yaml_document_get_root_node(w->doc);
    if (!root)
        return cfg_err(cfg, PL_ECONFIG, 0,
                       "empty configuration (missing key 'sources')");
    int rc = check_mapping(w, root, "configuration");
    if (rc != PL_OK) return rc;
    yaml_node_t *sources = NULL, *schedule = NULL, *eval_lists[2] = {NULL, NULL};
    for (yaml_node_pair_t *p = root->data.mapping.pairs.start;
         p < root->data.mapping.pairs.top; p++) {
        const char *k = key_str(w, p);
        yaml_node_t *vn = node(w, p->value);
        if (strcmp(k, "sources") == 0) {
            sources = vn;
            w->ln.sources = line_of(node(w, p->key));
        } else if (strcmp(k, "schedule") == 0) {
            schedule = vn;
        } else if (strcmp(k, "valid_sources") == 0 ||
                   strcmp(k, "test_sources") == 0) {
            eval_lists[k[0] == 't'] = vn;
        } else if (strcmp(k, "tokenizer") == 0) {
            rc = walk_tokenizer(w, "", vn, &cfg->tok);
            if (rc != PL_OK) return rc;
        } else if (strcmp(k, "topology") == 0 || strcmp(k, "cost") == 0 ||
                   strcmp(k, "long_short") == 0 || strcmp(k, "cache") == 0) {
            rc = walk_submap(w, k, vn);
            if (rc != PL_OK) return rc;
        } else {
            if (strcmp(k, "seq_length") == 0)
                w->ln.seq_length = line_of(node(w, p->key));
            if (strcmp(k, "global_batch_size") == 0)
                w->ln.global_batch_size = line_of(node(w, p->key));
            rc = set_node(w, k, line_of(node(w, p->key)), vn);
            if (rc != PL_OK) return rc;
        }
    }
    if (!sources)
        return cfg_err(cfg, PL_ECONFIG, 0, "missing key 'sources'");
    rc = walk_sources(w, sources);
    if (rc != PL_OK) return rc;
    for (int part = 0; part < 2; part++)
        if (eval_lists[part]) {
            rc = walk_eval_sources(w, part, eval_lists[part]);
            if (rc != PL_OK) return rc;
        }
    /* Text sources without a tokenizer of their own take the top level's. */
    for (int64_t i = 0; i < cfg->n_sources; i++) {
        pl__source_cfg *sc = &cfg->sources[i];
        if (!pl__is_text_type(sc->type)) continue;
        if (!pl__sx(sc)->tok.set && cfg->tok.set) {
            if (!sc->x && !(sc->x = pl__calloc(1, sizeof *sc->x)))
                return cfg_err(cfg, PL_ENOMEM, 0, "out of memory");
            if (pl__tok_cfg_dup(&sc->x->tok, &cfg->tok))
                return cfg_err(cfg, PL_ENOMEM, 0, "out of memory");
        }
        if (!pl__sx(sc)->tok.set)
            return cfg_err(cfg, PL_ECONFIG, w->ln.sources,
                           "sources[%" PRId64 "] (%s): a %s source needs a "
                           "tokenizer (its own 'tokenizer' or a top-level one)",
                           i, sc->name, stype_names[sc->type - 1]);
    }
    if (schedule) {
        rc = walk_schedule(w, schedule);
        if (rc != PL_OK) return rc;
    }
    rc = validate(cfg, &w->ln);
    if (rc != PL_OK) return rc;
    return config_warnings(w);
}

/*
 * Limits on the YAML text, checked before libyaml builds a document: a config
 * is never this large or deep, and libyaml's time grows faster than linearly
 * with nesting (100k nested mappings take a minute).
 */
#define PL__CONFIG_MAX_BYTES ((size_t)64 << 20)
#define PL__CONFIG_MAX_DEPTH 32

/* A pass over libyaml's events that refuses nesting deeper than the limit.
 * Syntax errors are left to the loader, which reports them. */
static int check_depth(pl_config *cfg, const char *yaml, size_t len) {
    yaml_parser_t parser;
    if (!yaml_parser_initialize(&parser))
        return cfg_err(cfg, PL_ENOMEM, 0, "out of memory (libyaml)");
    yaml_parser_set_input_string(&parser, (const unsigned char *)yaml, len);
    int rc = PL_OK, depth = 0;
    for (;;) {
        yaml_event_t ev;
        if (!yaml_parser_parse(&parser, &ev)) break;
        yaml_event_type_t t = ev.type;
        int line = (int)ev.start_mark.line + 1;
        yaml_event_delete(&ev);
        if (t == YAML_SEQUENCE_START_EVENT || t == YAML_MAPPING_START_EVENT) {
            if (++depth > PL__CONFIG_MAX_DEPTH) {
                rc = cfg_err(cfg, PL_ECONFIG, line,
                             "YAML nesting deeper than the limit of %d "
                             "mappings and lists",
                             PL__CONFIG_MAX_DEPTH);
                break;
            }
        } else if (t == YAML_SEQUENCE_END_EVENT || t == YAML_MAPPING_END_EVENT) {
            depth--;
        } else if (t == YAML_STREAM_END_EVENT) {
            break;
        }
    }
    yaml_parser_delete(&parser);
    return rc;
}

static int pl__config_parse_string_impl(const char *yaml, size_t len, const char *origin,
                           pl_config **out) {
    if (!out) return PL_EINVAL;
    *out = NULL;
    pl_config *cfg = config_new(origin);
    if (!cfg) return PL_ENOMEM;
    *out = cfg;
    if (!yaml) return cfg_err(cfg, PL_EINVAL, 0, "no YAML text");
    if (len > PL__CONFIG_MAX_BYTES)
        return cfg_err(cfg, PL_ECONFIG, 0,
                       "configuration of %zu bytes is above the limit of %zu "
                       "bytes",
                       len, PL__CONFIG_MAX_BYTES);
    int drc = check_depth(cfg, yaml, len);
    if (drc != PL_OK) return drc;

    yaml_parser_t parser;
    yaml_document_t doc;
    if (!yaml_parser_initialize(&parser))
        return cfg_err(cfg, PL_ENOMEM, 0, "out of memory (libyaml)");
    yaml_parser_set_input_string(&parser, (const unsigned char *)yaml, len);
    if (!yaml_parser_load(&parser, &doc)) {
        int rc = cfg_err(cfg, PL_ECONFIG, (int)parser.problem_mark.line + 1,
                         "YAML syntax error: %s%s%s",
                         parser.problem ? parser.problem : "unknown problem",
                         parser.context ? " " : "",
                         parser.context ? parser.context : "");
        if (parser.error == YAML_MEMORY_ERROR)
            rc = cfg_err(cfg, PL_ENOMEM, 0, "out of memory (libyaml)");
        yaml_parser_delete(&parser);
        return rc;
    }
    walk w;
    memset(&w, 0, sizeof w);
    w.cfg = cfg;
    w.doc = &doc;
    int rc = walk_root(&w);
    pl__names_free(&w.names);
    yaml_document_delete(&doc);
    if (rc == PL_OK) { /* one document per config: a second is a mistake */
        yaml_document_t more;
        if (!yaml_parser_load(&parser, &more)) {
            rc = cfg_err(cfg, PL_ECONFIG, (int)parser.problem_mark.line + 1,
                         "YAML syntax error after the first document: %s",
                         parser.problem ? parser.problem : "unknown problem");
        } else {
            if (yaml_document_get_root_node(&more))
                rc = cfg_err(cfg, PL_ECONFIG, (int)more.start_mark.line + 1,
                             "a second YAML document ('---'): a config is one "
                             "document");
            yaml_document_delete(&more);
        }
    }
    yaml_parser_delete(&parser);
#ifdef __GLIBC__
    /* libyaml's document (a node, its strings and pair arrays per key: ~2 KB
     * per source of a long source list) is freed by now, but glibc keeps the
     * freed pages resident, and a process that only parses the config (a
     * trainer's client) kept ~600 KB per 270 sources that way: give the free
     * pages back (after every parse, whatever its size, so that a process's
     * memory does not depend on whether its config crossed a threshold). */
    malloc_trim(0);
#endif
    return rc;
}

static int pl__config_parse_file_impl(const char *path, pl_config **out) {
    if (!out) return PL_EINVAL;
    *out = NULL;
    if (!path) return PL_EINVAL;
    /* A file above the size limit is refused before it is read. */
    struct stat st;
    if (stat(path, &st) == 0 && S_ISREG(st.st_mode) &&
        (uint64_t)st.st_size > (uint64_t)PL__CONFIG_MAX_BYTES) {
        pl_config *cfg = config_new(path);
        if (!cfg) return PL_ENOMEM;
        *out = cfg;
        return cfg_err(cfg, PL_ECONFIG, 0,
                       "configuration of %lld bytes is above the limit of %zu "
                       "bytes",
                       (long long)st.st_size, PL__CONFIG_MAX_BYTES);
    }
    void *buf = NULL;
    size_t n = 0;
    int e = 0;
    int rc = pl__read_file(path, &buf, &n, &e);
    if (rc) {
        pl_config *cfg = config_new(path);
        if (!cfg) return PL_ENOMEM;
        *out = cfg;
        if (rc == PL_ENOMEM) return cfg_err(cfg, PL_ENOMEM, -1, "out of memory");
        return cfg_err(cfg, rc, -1, "cannot %s config '%s': %s",
                       rc == PL_ENOENT ? "open" : "read", path, strerror(e));
    }
    rc = pl_config_parse_string(buf, n, path, out);
    free(buf);
    return rc;
}

/* ------------------------------------------------------------ set / get */

static int pl__config_set_impl(pl_config *cfg, const char *key, const char *value) {
    if (!cfg) return PL_EINVAL;
    if (!key || !value)
        return cfg_err(cfg, PL_EINVAL, -1, "pl_config_set: NULL key or value");
    pl_config saved = *cfg;
    sval v = {value, 0, -1};
    int rc;
    int64_t src = -1;
    double old_weight = 0;
    /* sources.NAME.weight changes one source's weight. */
    if (strncmp(key, "sources.", 8) == 0) {
        const char *name = key + 8;
        const char *dot = strrchr(name, '.');
        if (!dot || strcmp(dot, ".weight") != 0) {
            rc = cfg_err(cfg, PL_ECONFIG, -1,
                         "unknown key '%s' (only sources.NAME.weight can be "
                         "set)",
                         key);
            goto fail;
        }
        for (int64_t i = 0; i < cfg->n_sources; i++) {
            size_t nl = strlen(cfg->sources[i].name);
            if (nl == (size_t)(dot - name) &&
                strncmp(cfg->sources[i].name, name, nl) == 0)
                src = i;
        }
        if (src < 0) {
            rc = cfg_err(cfg, PL_ECONFIG, -1, "%s: unknown source '%.*s'", key,
                         (int)(dot - name), name);
            goto fail;
        }
        old_weight = cfg->sources[src].weight;
        rc = get_num(cfg, key, &v, &cfg->sources[src].weight);
    } else if (strcmp(key, "schedule.interpolation") == 0) {
        rc = get_enum(cfg, key, &v, ENUM_ARGS(interp), &cfg->interpolation);
    } else {
        rc = set_scalar(cfg, key, &v);
    }
    if (rc == PL_OK) {
        vlines none = {-1, -1, -1, -1, -1};
        rc = validate(cfg, &none);
    }
    if (rc == PL_OK) return PL_OK;
fail:;
    /* Roll back, keeping the message. */
    char msg[PL__ERRMSG_CAP];
    memcpy(msg, cfg->errmsg, sizeof msg);
    if (src >= 0) cfg->sources[src].weight = old_weight;
    *cfg = saved;
    memcpy(cfg->errmsg, msg, sizeof msg);
    return rc;
}

int pl_config_get_int(const pl_config *cfg, const char *key, int64_t *out) {
    if (!cfg || !key || !out) return PL_EINVAL;
    int64_t n_img = 0;
    for (int64_t i = 0; i < cfg->n_sources; i++)
        n_img += cfg->sources[i].type == PL_SOURCE_WEBDATASET;
    struct {
        const char *k;
        int64_t v;
    } t[] = {
        {"seed", (int64_t)cfg->seed},
        {"seq_length", cfg->seq_length},
        {"global_batch_size", cfg->global_batch_size},
        {"micro_batch_size", cfg->micro_batch_size},
        {"train_steps", cfg->train_steps},
        {"dtype", cfg->dtype},
        {"pad_id", cfg->pad_id},
        {"long_documents", cfg->long_documents},
        {"packing", cfg->packing},
        {"balance", cfg->balance},
        {"on_error", cfg->on_error},
        {"threads", cfg->threads},
        {"prefetch", cfg->prefetch},
        {"max_lag_steps", cfg->max_lag_steps},
        {"sidecar_index", cfg->sidecar_index},
        {"cost.window", cfg->cost.window},
        {"long_short.threshold", cfg->long_short_threshold},
        {"topology.dp", cfg->topology.dp},
        {"topology.pp", cfg->topology.pp},
        {"topology.cp", cfg->topology.cp},
        {"topology.tp", cfg->topology.tp},
        {"topology.dp_auto", cfg->topology.dp_auto},
        {"vocab_size", cfg->vocab_size},
        {"num_warnings", cfg->n_warnings},
        {"schedule.interpolation", cfg->interpolation},
        {"num_sources", cfg->n_sources},
        {"world_size", pl_config_world_size(cfg)},
        {"micro_batches_per_rank",
         cfg->global_batch_size / (cfg->topology.dp * cfg->micro_batch_size)},
        {"image_sources", n_img},
    };
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++) {
        if (strcmp(key, t[i].k) == 0) {
            *out = t[i].v;
            return PL_OK;
        }
    }
    return PL_EINVAL;
}

int64_t pl_config_num_warnings(const pl_config *cfg) {
    return cfg ? cfg->n_warnings : 0;
}

const char *pl_config_warning(const pl_config *cfg, int64_t i) {
    if (!cfg || i < 0 || i >= cfg->n_warnings) return NULL;
    return cfg->warnings[i];
}

static int pl__config_set_world_size_impl(pl_config *cfg, int64_t world_size) {
    if (!cfg) return PL_EINVAL;
    const int64_t pp = cfg->topology.pp, cp = cfg->topology.cp,
                  tp = cfg->topology.tp;
    if (world_size < 1)
        return cfg_err(cfg, PL_EINVAL, -1,
                       "world size must be positive, got %" PRId64,
                       world_size);
    if (!cfg->topology.dp_auto) {
        int64_t mine = pl_config_world_size(cfg);
        if (mine == world_size) return PL_OK;
        return cfg_err(cfg, PL_ECONFIG, -1,
                       "topology dp=%" PRId64 " pp=%" PRId64 " cp=%" PRId64
                       " tp=%" PRId64 " has world size %" PRId64
                       ", but the trainer's world size is %" PRId64
                       " (set topology.dp: auto to take dp from it)",
                       cfg->topology.dp, pp, cp, tp, mine, world_size);
    }
    if (world_size % (pp * cp * tp) != 0)
        return cfg_err(cfg, PL_ECONFIG, -1,
                       "topology.dp: auto: the trainer's world size %" PRId64
                       " is not divisible by pp*cp*tp = %" PRId64 "*%" PRId64
                       "*%" PRId64,
                       world_size, pp, cp, tp);
    char value[32];
    pl__fmt(value, sizeof value, "%" PRId64, world_size / (pp * cp * tp));
    int rc = pl_config_set(cfg, "topology.dp", value);
    if (rc != PL_OK) {
        char msg[PL__ERRMSG_CAP];
        pl__fmt(msg, sizeof msg, "%s", cfg->errmsg);
        return cfg_err(cfg, rc, -1,
                       "topology.dp: auto = %s (world size %" PRId64
                       "): %s",
                       value, world_size, msg);
    }
    return PL_OK;
}

int64_t pl_config_num_sources(const pl_config *cfg) {
    return cfg ? cfg->n_sources : 0;
}

const char *pl_config_source_name(const pl_config *cfg, int64_t i) {
    if (!cfg || i < 0 || i >= cfg->n_sources) return NULL;
    return cfg->sources[i].name;
}

const char *pl_config_source_path(const pl_config *cfg, int64_t i) {
    if (!cfg || i < 0 || i >= cfg->n_sources) return NULL;
    return cfg->sources[i].path;
}

/* ------------------------------------------------------------ weights */

static double point_sum(const pl_config *cfg, int64_t k) {
    double s = 0;
    for (int64_t i = 0; i < cfg->n_sources; i++) s += cfg->points[k].weights[i];
    return s;
}

void pl__config_weights(const pl_config *cfg, int64_t step, double *w) {
    const int64_t n = cfg->n_sources;
    if (!cfg->has_schedule || cfg->n_points == 0) {
        double s = source_weight_sum(cfg);
        for (int64_t i = 0; i < n; i++)
            w[i] = s > 0 ? cfg->sources[i].weight / s : 0.0;
        return;
    }
    /* k: the last point with step <= `step` (0 before the first). */
    int64_t k = 0;
    while (k + 1 < cfg->n_points && cfg->points[k + 1].step <= step) k++;
    const pl__sched_point *p0 = &cfg->points[k];
    double s0 = point_sum(cfg, k);
    int interp = cfg->interpolation == PL__INTERP_LINEAR &&
                 k + 1 < cfg->n_points && step > p0->step;
    if (!interp) {
        for (int64_t i = 0; i < n; i++) w[i] = p0->weights[i] / s0;
        return;
    }
    const pl__sched_point *p1 = &cfg->points[k + 1];
    double s1 = point_sum(cfg, k + 1);
    double t = (double)(step - p0->step) / (double)(p1->step - p0->step);
    double total = 0;
    for (int64_t i = 0; i < n; i++) {
        w[i] = (1.0 - t) * (p0->weights[i] / s0) + t * (p1->weights[i] / s1);
        total += w[i];
    }
    for (int64_t i = 0; i < n; i++) w[i] /= total;
}

double pl_config_source_weight(const pl_config *cfg, int64_t i, int64_t step) {
    if (!cfg || i < 0 || i >= cfg->n_sources) return 0.0;
    double small[16];
    double *w = small;
    if (cfg->n_sources > 16) {
        w = malloc((size_t)cfg->n_sources * sizeof *w);
        if (!w) return 0.0;
    }
    pl__config_weights(cfg, step, w);
    double r = w[i];
    if (w != small) free(w);
    return r;
}

/* ------------------------------------------------------------ clone */

pl_config *pl__config_share(const pl_config *cfg) {
    if (!cfg) return NULL;
    if (cfg->frozen) {
        __atomic_fetch_add(&((pl_config *)cfg)->refs, 1, __ATOMIC_RELAXED);
        return (pl_config *)cfg;
    }
    pl_config *c = pl__config_clone(cfg);
    if (c) c->frozen = 1;
    return c;
}

pl_config *pl__config_clone(const pl_config *cfg) {
    if (!cfg) return NULL;
    pl_config *c = calloc(1, sizeof *c);
    if (!c) return NULL;
    *c = *cfg;
    c->frozen = 0;
    c->refs = 0;
    c->origin = NULL;
    c->sources = NULL;
    c->points = NULL;
    c->n_sources = 0;
    c->n_points = 0;
    c->warnings = NULL;
    c->n_warnings = 0;
    for (int part = 0; part < 2; part++) {
        c->eval_sources[part] = NULL;
        c->n_eval_sources[part] = 0;
    }
    for (int part = 0; part < 2; part++) {
        if (!cfg->n_eval_sources[part]) continue;
        c->eval_sources[part] =
            pl__calloc((size_t)cfg->n_eval_sources[part], sizeof(pl__source_cfg));
        if (!c->eval_sources[part]) goto fail;
        for (int64_t i = 0; i < cfg->n_eval_sources[part]; i++) {
            pl__source_cfg *d = &c->eval_sources[part][i];
            *d = cfg->eval_sources[part][i];
            d->name = pl__strdup(d->name);
            d->path = pl__strdup(d->path);
            const pl__source_cfg *o = &cfg->eval_sources[part][i];
            int dx_rc = pl__source_ext_dup(o->x, &d->x);
            c->n_eval_sources[part] = i + 1;
            if (!d->name || !d->path || dx_rc) goto fail;
        }
    }
    c->origin = pl__strdup(cfg->origin ? cfg->origin : "<string>");
    if (pl__tok_cfg_dup(&c->tok, &cfg->tok)) goto fail;
    c->sources = pl__calloc((size_t)cfg->n_sources, sizeof *c->sources);
    c->points = pl__calloc((size_t)cfg->n_points, sizeof *c->points);
    if (!c->origin || !c->sources || !c->points) goto fail;
    for (int64_t i = 0; i < cfg->n_sources; i++) {
        c->sources[i] = cfg->sources[i];
        const pl__source_cfg *o = &cfg->sources[i];
        c->sources[i].name = pl__strdup(o->name);
        c->sources[i].path = pl__strdup(o->path);
        int x_rc = pl__source_ext_dup(o->x, &c->sources[i].x);
        c->n_sources = i + 1;
        if (!c->sources[i].name || !c->sources[i].path || x_rc) goto fail;
    }
    for (int64_t k = 0; k < cfg->n_points; k++) {
        c->points[k].step = cfg->points[k].step;
        c->points[k].weights =
            pl__calloc((size_t)cfg->n_sources, sizeof(double));
        c->n_points = k + 1;
        if (!c->points[k].weights) goto fail;
        memcpy(c->points[k].weights, cfg->points[k].weights,
               (size_t)cfg->n_sources * sizeof(double));
    }
    if (cfg->n_warnings) {
        c->warnings = pl__calloc((size_t)cfg->n_warnings, sizeof *c->warnings);
        if (!c->warnings) goto fail;
        for (int64_t k = 0; k < cfg->n_warnings; k++) {
            c->warnings[k] = pl__strdup(cfg->warnings[k]);
            c->n_warnings = k + 1;
            if (!c->warnings[k]) goto fail;
        }
    }
    return c;
fail:
    pl_config_free(c);
    return NULL;
}

void pl_config_set_tokenizer_factory(pl_config *cfg, pl_tokenizer_factory fn,
                                     void *ctx) {
    if (!cfg) return;
    cfg->tok_factory = fn;
    cfg->tok_factory_spec = NULL;
    cfg->tok_factory_ctx = ctx;
}

void pl_config_set_tokenizer_factory_spec(pl_config *cfg, pl_tokenizer_spec_factory fn,
                                          void *ctx) {
    if (!cfg) return;
    cfg->tok_factory_spec = fn;
    cfg->tok_factory = NULL;
    cfg->tok_factory_ctx = ctx;
}

void pl_config_set_lengths_provider(pl_config *cfg, pl_lengths_fn fn, void *ctx) {
    if (!cfg) return;
    cfg->lengths_fn = fn;
    cfg->lengths_ctx = ctx;
}

uint64_t pl_config_fingerprint(const pl_config *c) {
    if (!c) return 0;
    /* Fields one by one (never the struct: its padding is not data). */
    int64_t ints[] = {(int64_t)c->seed, c->seq_length, c->global_batch_size,
                      c->micro_batch_size, c->train_steps, c->dtype, c->pad_id,
                      c->long_documents, c->packing, c->balance, c->cost.window,
                      c->long_short_threshold, c->on_error, c->topology.dp,
                      c->topology.pp, c->topology.cp, c->topology.tp,
                      c->n_sources, c->has_schedule, c->interpolation, c->n_points};
    uint64_t h = pl__hash64(ints, sizeof ints, 0x706c6366ULL);
    double cost[3] = {c->cost.a, c->cost.b, c->cost.c};
    h = pl__hash64(cost, sizeof cost, h);
    if (c->cost.enc_a != 0 || c->cost.enc_b != 0) {
        double enc[2] = {c->cost.enc_a, c->cost.enc_b};
        h = pl__hash64(enc, sizeof enc, h);
    }
    h = pl__hash64(c->cost.preset, strlen(c->cost.preset), h);
    h = pl__hash64(c->topology.order, strlen(c->topology.order), h);
    for (int64_t i = 0; i < c->n_sources; i++) {
        const pl__source_cfg *sc = &c->sources[i];
        const pl__source_ext *sx = pl__sx(sc);
        int64_t si[4] = {sc->type, sc->token_dtype, sc->eos_id,
                         sc->max_epochs};
        h = pl__hash64(sc->name, strlen(sc->name) + 1, h);
        h = pl__hash64(sc->path, strlen(sc->path) + 1, h);
        h = pl__hash64(si, sizeof si, h);
        h = pl__hash64(&sc->weight, sizeof sc->weight, h);
        if (sc->type == PL_SOURCE_WEBDATASET) {
            const pl_image_options *io = &sx->image;
            int64_t ii[9] = {io->mode, io->size, io->patch_size, io->merge_size,
                             io->min_pixels, io->max_pixels, io->token_id,
                             io->limit_pixels, io->caption_token_offset};
            h = pl__hash64(ii, sizeof ii, h);
            h = pl__hash64(io->caption_key, strlen(io->caption_key), h);
        } else if (pl__is_text_type(sc->type)) {
            int32_t ti[2] = {sx->tok.type, sx->tok.add_eos};
            h = pl__hash64(ti, sizeof ti, h);
            const char *tp = sx->tok.path ? sx->tok.path : "";
            const char *tk = sx->text_key ? sx->text_key : "text";
            h = pl__hash64(tp, strlen(tp) + 1, h);
            h = pl__hash64(tk, strlen(tk) + 1, h);
            if (sx->tok.pat_str)
                h = pl__hash64(sx->tok.pat_str, strlen(sx->tok.pat_str) + 1, h);
            if (sx->tok.encoding)
                h = pl__hash64(sx->tok.encoding, strlen(sx->tok.encoding) + 1, h);
            if (sx->messages_key) {
                h = pl__hash64(sx->messages_key, strlen(sx->messages_key) + 1, h);
                for (int q = 0; q < 3; q++)
                    if (sx->chat[q]) h = pl__hash64(sx->chat[q], strlen(sx->chat[q]) + 1, h);
            }
            if (sx->prompt_key && sx->response_key) {
                h = pl__hash64(sx->prompt_key, strlen(sx->prompt_key) + 1, h);
                h = pl__hash64(sx->response_key, strlen(sx->response_key) + 1, h);
            }
        }
    }
    for (int64_t k = 0; k < c->n_points; k++) {
        h = pl__hash64(&c->points[k].step, sizeof(int64_t), h);
        h = pl__hash64(c->points[k].weights, (size_t)c->n_sources * sizeof(double), h);
    }
    return h;
}

/* ------------------------------------------------------------ splits */

void pl__split_range(const double *split, int part, int64_t n, int64_t *lo,
                     int64_t *hi) {
    /* megatron-core: bookends [0, a, a+b, a+b+c]; beg = round(lo * n),
       end = round(hi * n) with Python's round (half to even). */
    double cum[4];
    cum[0] = 0;
    for (int k = 0; k < 3; k++) cum[k + 1] = cum[k] + split[k];
    double dn = (double)n;
    int64_t a = (int64_t)nearbyint(cum[part] * dn);
    int64_t b = (int64_t)nearbyint(cum[part + 1] * dn);
    if (a < 0) a = 0;
    if (b > n) b = n;
    if (b < a) b = a;
    *lo = a;
    *hi = b;
}

const double *pl__source_split(const pl_config *cfg, int64_t i) {
    static const double all_train[3] = {1, 0, 0};
    if (cfg->sources[i].has_split) return cfg->sources[i].split;
    if (cfg->has_split) return cfg->split;
    return all_train;
}

int pl_config_split(const pl_config *cfg, int split, pl_config **out) {
    if (!out) return PL_EINVAL;
    *out = NULL;
    if (!cfg || (split != PL_SPLIT_VALID && split != PL_SPLIT_TEST) || cfg->eval)
        return PL_EINVAL;
    const int part = split, e = split - 1;
    const char *what = split == PL_SPLIT_VALID ? "validation" : "test";
    pl_config *c = pl__config_clone(cfg);
    if (!c) return PL_ENOMEM;
    *out = c;
    for (int64_t k = 0; k < c->n_warnings; k++) free(c->warnings[k]);
    free(c->warnings);
    c->warnings = NULL;
    c->n_warnings = 0;
    /* The pass's weights: a source's weight, or under a schedule its largest
       weight at any point (every source the schedule uses is evaluated). */
    int64_t n = c->n_sources;
    double *w = pl__calloc((size_t)(n ? n : 1), sizeof *w);
    if (!w) return cfg_err(c, PL_ENOMEM, 0, "out of memory");
    for (int64_t i = 0; i < n; i++) {
        w[i] = c->has_schedule ? 0 : c->sources[i].weight;
        for (int64_t k = 0; k < c->n_points; k++)
            if (c->points[k].weights[i] > w[i]) w[i] = c->points[k].weights[i];
    }
    for (int64_t k = 0; k < c->n_points; k++) free(c->points[k].weights);
    free(c->points);
    c->points = NULL;
    c->n_points = 0;
    c->has_schedule = 0;
    if (c->n_eval_sources[e]) { /* blend_per_split: these sources, whole */
        for (int64_t i = 0; i < c->n_sources; i++) {
            free(c->sources[i].name);
            free(c->sources[i].path);
            pl__source_ext_free(c->sources[i].x);
        }
        free(c->sources);
        c->sources = c->eval_sources[e];
        c->n_sources = c->n_eval_sources[e];
        c->eval_sources[e] = NULL;
        c->n_eval_sources[e] = 0;
        for (int64_t i = 0; i < c->n_sources; i++) {
            pl__source_cfg *s = &c->sources[i];
            s->split[0] = s->split[1] = s->split[2] = 0;
            s->split[part] = 1;
            s->has_split = 1;
        }
    } else {
        int any = 0;
        for (int64_t i = 0; i < n; i++) {
            pl__source_cfg *s = &c->sources[i];
            const double *f = pl__source_split(c, i);
            double frac = f[part];
            memcpy(s->split, f, sizeof s->split);
            s->has_split = 1;
            s->weight = frac > 0 ? w[i] : 0;
            any |= s->weight > 0;
        }
        if (!any) {
            free(w);
            return cfg_err(c, PL_ECONFIG, 0,
                           "the config has no %s data: give `split` (such as "
                           "969,30,1, as Megatron's --split) or %s",
                           what, split == PL_SPLIT_VALID ? "valid_sources" : "test_sources");
        }
    }
    free(w);
    for (int part2 = 0; part2 < 2; part2++) { /* the other list is not needed */
        for (int64_t i = 0; i < c->n_eval_sources[part2]; i++) {
            free(c->eval_sources[part2][i].name);
            free(c->eval_sources[part2][i].path);
        }
        free(c->eval_sources[part2]);
        c->eval_sources[part2] = NULL;
        c->n_eval_sources[part2] = 0;
    }
    for (int64_t i = 0; i < c->n_sources; i++) c->sources[i].max_epochs = 1;
    c->split_part = part;
    c->eval = 1;
    c->train_steps = -1;
    c->errmsg[0] = '\0';
    return PL_OK;
}

/* ------------------------------------------------ per-thread messages */

int pl_config_parse_string(const char *yaml, size_t len, const char *origin,
                           pl_config **out) {
    int rc = pl__config_parse_string_impl(yaml, len, origin, out);
    if (rc < 0) pl__thread_err(*out ? pl_config_errmsg(*out) : "config: out of memory");
    return rc;
}

int pl_config_parse_file(const char *path, pl_config **out) {
    int rc = pl__config_parse_file_impl(path, out);
    if (rc < 0) pl__thread_err(*out ? pl_config_errmsg(*out) : "config: out of memory");
    return rc;
}

int pl_config_set(pl_config *cfg, const char *key, const char *value) {
    int rc = pl__config_set_impl(cfg, key, value);
    if (rc < 0) pl__thread_err(pl_config_errmsg(cfg));
    return rc;
}

int pl_config_set_world_size(pl_config *cfg, int64_t world_size) {
    int rc = pl__config_set_world_size_impl(cfg, world_size);
    if (rc < 0) pl__thread_err(pl_config_errmsg(cfg));
    return rc;
}
