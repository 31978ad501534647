/*
 * config/keys.c -- the key table (keys.h) and the readers of scalar values.
 *
 * PL_CONFIG_KEYS expands into pl__keys[], one row per key with its kind, its
 * member of struct pl_config (offset and size), default, range and values.
 * pl__key_set parses a top-level scalar by its row (the YAML walk and
 * pl_config_set share it, with its messages); pl__key_defaults gives a new
 * config every default by the same path, so a default is written once, as
 * YAML.  PL_SOURCE_TYPE_MAP expands into the source type names and the
 * public walk (pl_source_type_name, pl_source_type_info).
 *
 * Suggestions ("did you mean") take the candidate with the smallest edit
 * distance (Damerau-Levenshtein, optimal string alignment): at most 1 for
 * names of up to 5 characters, 2 beyond, and less than the name's length;
 * a name that begins a candidate (3 characters or more) counts as 1.
 */
#include "config/config.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------ the table */

#define PL__UNPAREN(...) __VA_ARGS__
#define F(m) offsetof(pl_config, m), sizeof(((pl_config *)0)->m)
#define NOF 0, 0
#define V(...) (const char *const[]){__VA_ARGS__, NULL}, NULL
#define VC(names, codes)                                                       \
    (const char *const[]){PL__UNPAREN names, NULL}, (const int[]){PL__UNPAREN codes}
#define NOV NULL, NULL
#define PL__ROW(name, kind, field, dflt, lo, hi, values, doc)                  \
    {name, PL__K_##kind, field, dflt, lo, hi, values, doc},

const pl__key pl__keys[] = {PL_CONFIG_KEYS(PL__ROW)};
const int pl__n_keys = (int)(sizeof pl__keys / sizeof pl__keys[0]);

#undef PL__ROW

static const char *const kind_names[] = {
    "?", "integer", "integer or null", "integer or auto", "unsigned integer", "number",
    "one of", "boolean", "string", "fractions", "one of", "source type",
    "list", "mapping"};

/* Cost presets (SPEC 5): a * tokens + b * sum(len^2) + c, in the order of
 * cost.preset's values.
 *
 * llama-1b: measured, seconds per micro-batch row on one NVIDIA H200 (torch
 * 2.11, bf16, causal varlen FlashAttention over cu_seqlens, forward +
 * backward), 16 Llama-3.2-1B-shaped layers plus the LM head (vocabulary
 * 128,256): per layer a = 6.93e-7 s/token, b = 4.866e-11 s/token^2,
 * c = 3.54e-4 s (least squares over 24 micro-batches of 8,192 and 32,768
 * tokens, R^2 0.999, worst row 3.8 % off); the head 3.504e-6 s/token +
 * 4.1e-4 s (measured at 8,192 and 32,768 tokens).  b/a = 5.3e-5, twice the
 * FLOP count's 2.7e-5: attention kernels run at a lower fraction of peak
 * than the GEMMs.  Source: the H200 measurements in
 * bench/balance/h200_llama-3.2-1b_layer_cost.json (bench/balance/README.md).
 * llama-7b: not measured; FLOPs (a = 6 * 6.7e9, b = 6 * 32 * 4096) with the
 * attention term scaled by the measured-over-FLOP ratio of the 1B shape on
 * the H200 (1.952), in FLOP units.  Both are starting points: measure your
 * own model (python -m polyload.calibrate, docs/guide/balancing.md). */
static const double preset_abc[][3] = {
    {1.0, 0.0, 0.0},                      /* linear */
    {0.0, 1.0, 0.0},                      /* causal */
    {0.0, 1.0, 0.0},                      /* sliding_window */
    {1.4592835e-5, 7.7854614e-10, 6.0745961e-3},  /* llama-1b, measured (below) */
    {6.0 * 6.7e9, 1.952 * 6.0 * 32 * 4096, 0.0},  /* llama-7b, FLOPs, scaled */
};

const pl__key *pl__key_find(const char *name) {
    for (int i = 0; i < pl__n_keys; i++)
        if (strcmp(pl__keys[i].name, name) == 0) return &pl__keys[i];
    return NULL;
}

/* Source types: the values of a SOURCE key. */
static const char *const stype_names[] = {
#define PL__NAME(code, name, raw, images, index, doc) name,
    PL_SOURCE_TYPE_MAP(PL__NAME)
#undef PL__NAME
    NULL};
static const int stype_codes[] = {
#define PL__CODE(code, name, raw, images, index, doc) code,
    PL_SOURCE_TYPE_MAP(PL__CODE)
#undef PL__CODE
};

/* The value names of row k (NULL-terminated, or NULL), and code of the j-th. */
static const char *const *names_of(const pl__key *k) {
    return k->kind == PL__K_SOURCE ? stype_names : k->values;
}
static int code_of(const pl__key *k, int j) {
    if (k->kind == PL__K_SOURCE) return stype_codes[j];
    return k->codes ? k->codes[j] : j;
}

/* "a, b, c" of row k's values into out. */
static void values_list(const pl__key *k, char *out, size_t cap) {
    size_t used = 0;
    const char *const *names = names_of(k);
    out[0] = '\0';
    for (int j = 0; names && names[j] && used < cap; j++) {
        int w = snprintf(out + used, cap - used, "%s%s", j ? ", " : "", names[j]);
        if (w < 0) break;
        used += (size_t)w;
    }
}

void pl__key_values(const char *name, char *out, size_t cap) {
    const pl__key *k = pl__key_find(name);
    if (k)
        values_list(k, out, cap);
    else if (cap)
        out[0] = '\0';
}

/* ------------------------------------------------------------ suggestions */

/* The part of row name `full` directly under `prefix` into out ("dp" of
 * "topology.dp" under "topology."; "sources" of "sources[].name" under "").
 * 0 when full is not under prefix. */
static int child_of(const char *full, const char *prefix, char *out, size_t cap) {
    size_t pl = strlen(prefix);
    if (strncmp(full, prefix, pl) != 0 || !full[pl]) return 0;
    const char *rest = full + pl;
    size_t n = strcspn(rest, ".[");
    if (n == 0 || n >= cap) return 0;
    memcpy(out, rest, n);
    out[n] = '\0';
    return 1;
}

/* Optimal string alignment distance, capped at 3 (enough to rank). */
static int edit_distance(const char *a, const char *b) {
    size_t n = strlen(a), m = strlen(b);
    if (n > 63 || m > 63) return 3;
    int d[64][64];
    for (size_t i = 0; i <= n; i++) d[i][0] = (int)i;
    for (size_t j = 0; j <= m; j++) d[0][j] = (int)j;
    for (size_t i = 1; i <= n; i++) {
        for (size_t j = 1; j <= m; j++) {
            int c = a[i - 1] == b[j - 1] ? 0 : 1;
            int v = d[i - 1][j] + 1;
            if (d[i][j - 1] + 1 < v) v = d[i][j - 1] + 1;
            if (d[i - 1][j - 1] + c < v) v = d[i - 1][j - 1] + c;
            if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] &&
                d[i - 2][j - 2] + 1 < v)
                v = d[i - 2][j - 2] + 1;
            d[i][j] = v;
        }
    }
    return d[n][m] < 3 ? d[n][m] : 3;
}

int pl__key_suggest(const char *prefix, const char *name, int settable,
                    char *out, size_t cap) {
    out[0] = '\0';
    const size_t len = strlen(name);
    const int limit = len <= 5 ? 1 : 2;
    int best = limit + 1;
    char best_name[128] = "", cand[128];
    for (int i = 0; i < pl__n_keys; i++) {
        const pl__key *k = &pl__keys[i];
        if (settable) {
            if (!k->size) continue;
            pl__fmt(cand, sizeof cand, "%s", k->name);
        } else if (!child_of(k->name, prefix, cand, sizeof cand)) {
            continue;
        }
        int d = edit_distance(name, cand);
        if (len >= 3 && strncmp(cand, name, len) == 0 && d > 1) d = 1;
        if (d < best && (size_t)d < len) {
            best = d;
            pl__fmt(best_name, sizeof best_name, "%s", cand);
        }
    }
    if (best > limit) return 0;
    pl__fmt(out, cap, "%s", best_name);
    return 1;
}

void pl__key_children(const char *prefix, char *out, size_t cap) {
    size_t used = 0;
    out[0] = '\0';
    char cand[128], before[128];
    for (int i = 0; i < pl__n_keys && used < cap; i++) {
        if (!child_of(pl__keys[i].name, prefix, cand, sizeof cand)) continue;
        int seen = 0; /* "image", then "image.mode" */
        for (int j = 0; j < i && !seen; j++)
            seen = child_of(pl__keys[j].name, prefix, before, sizeof before) &&
                   strcmp(before, cand) == 0;
        if (seen) continue;
        int w = snprintf(out + used, cap - used, "%s%s", used ? ", " : "", cand);
        if (w < 0) break;
        used += (size_t)w;
    }
}

/* ------------------------------------------------------------ values */

int pl__key_null(const pl__sval *v) {
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

int pl__key_int(pl_config *cfg, const char *key, const pl__sval *v,
                int64_t min, int64_t max, int64_t *out) {
    int64_t x = 0;
    if (v->quoted || !parse_i64(v->s, &x))
        return pl__cfg_err(cfg, PL_ECONFIG, v->line,
                           "%s: expected an integer, got '%s'", key, v->s);
    if (x < min || x > max) {
        if (min == 1 && x < 1)
            return pl__cfg_err(cfg, PL_ECONFIG, v->line,
                               "%s must be a positive integer, got %" PRId64, key,
                               x);
        if (min == 0 && x < 0)
            return pl__cfg_err(cfg, PL_ECONFIG, v->line,
                               "%s must not be negative, got %" PRId64, key, x);
        return pl__cfg_err(cfg, PL_ECONFIG, v->line,
                           "%s must be in [%" PRId64 ", %" PRId64 "], got %" PRId64,
                           key, min, max, x);
    }
    *out = x;
    return PL_OK;
}

int pl__key_u64(pl_config *cfg, const char *key, const pl__sval *v,
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
        return pl__cfg_err(cfg, PL_ECONFIG, v->line,
                           "%s: expected a non-negative integer, got '%s'", key,
                           v->s);
    *out = (uint64_t)x;
    return PL_OK;
}

int pl__key_num(pl_config *cfg, const char *key, const pl__sval *v,
                double *out) {
    char *end = NULL;
    errno = 0;
    double x = v->quoted || !v->s[0] ? NAN : strtod(v->s, &end);
    if (v->quoted || !v->s[0] || errno || !end || *end || !isfinite(x))
        return pl__cfg_err(cfg, PL_ECONFIG, v->line,
                           "%s: expected a number, got '%s'", key, v->s);
    if (x < 0)
        return pl__cfg_err(cfg, PL_ECONFIG, v->line,
                           "%s must not be negative, got %s", key, v->s);
    *out = x;
    return PL_OK;
}

int pl__key_enum(pl_config *cfg, const char *key, const pl__sval *v,
                 const pl__key *row, int *out) {
    const char *const *names = names_of(row);
    for (int j = 0; names && names[j]; j++) {
        if (strcmp(v->s, names[j]) == 0) {
            *out = code_of(row, j);
            return PL_OK;
        }
    }
    char list[256];
    values_list(row, list, sizeof list);
    return pl__cfg_err(cfg, PL_ECONFIG, v->line,
                       "%s: unknown value '%s' (expected one of: %s)", key, v->s,
                       list);
}

int pl__key_row_int(pl_config *cfg, const pl__key *row, const char *key,
                    const pl__sval *v, int64_t *out) {
    return pl__key_int(cfg, key, v, row->min, row->max, out);
}

/* ------------------------------------------------------------ set */

static void store_int(pl_config *cfg, const pl__key *k, int64_t x) {
    char *p = (char *)cfg + k->off;
    if (k->size == sizeof(int64_t)) {
        memcpy(p, &x, sizeof x);
    } else {
        int i = (int)x;
        memcpy(p, &i, sizeof i);
    }
}

static int64_t load_int(const pl_config *cfg, const pl__key *k) {
    const char *p = (const char *)cfg + k->off;
    if (k->size == sizeof(int64_t)) {
        int64_t x;
        memcpy(&x, p, sizeof x);
        return x;
    }
    int i;
    memcpy(&i, p, sizeof i);
    return i;
}

int pl__key_set(pl_config *cfg, const char *key, const pl__sval *v) {
    const pl__key *k = pl__key_find(key);
    if (!k || !k->size) {
        char near[128];
        if (pl__key_suggest("", key, 1, near, sizeof near))
            return pl__cfg_err(cfg, PL_ECONFIG, v->line,
                               "unknown key '%s' (did you mean '%s'?)", key, near);
        return pl__cfg_err(cfg, PL_ECONFIG, v->line, "unknown key '%s'", key);
    }
    if (k->kind == PL__K_INT_NULL && pl__key_null(v)) {
        store_int(cfg, k, -1);
        return PL_OK;
    }
    char *field = (char *)cfg + k->off;
    if (k->kind == PL__K_STR && !k->dflt && pl__key_null(v)) {
        field[0] = '\0'; /* a string without a default (cache.dir): null or "" unsets
                            it, and an unset one reads back as "" */
        return PL_OK;
    }
    if (pl__key_null(v))
        return pl__cfg_err(cfg, PL_ECONFIG, v->line, "%s: missing value", key);
    int64_t x = 0;
    int e = 0, rc;
    switch (k->kind) {
    case PL__K_INT_NULL:
        /* -1 is accepted as an explicit "none" (train_steps: endless). */
        if (strcmp(v->s, "-1") == 0) {
            store_int(cfg, k, -1);
            return PL_OK;
        }
        /* fall through */
    case PL__K_INT:
        rc = pl__key_int(cfg, key, v, k->min, k->max, &x);
        if (rc == PL_OK) store_int(cfg, k, x);
        return rc;
    case PL__K_INT_AUTO: {
        /* topology.dp: auto waits for the world size; a thread count's auto
           is 0, resolved where the threads start (pl_cpus_available). */
        const int dp = strcmp(k->name, "topology.dp") == 0;
        if (!dp) {
            rc = pl__key_threads(cfg, key, v, k->max, &x);
            if (rc == PL_OK) store_int(cfg, k, x);
            return rc;
        }
        if (!v->quoted && strcmp(v->s, "auto") == 0) {
            store_int(cfg, k, dp ? 1 : 0);
            if (dp) cfg->topology.dp_auto = 1;
            return PL_OK;
        }
        rc = pl__key_int(cfg, key, v, k->min, k->max, &x);
        if (rc != PL_OK) return rc;
        store_int(cfg, k, x);
        if (dp) cfg->topology.dp_auto = 0;
        return PL_OK;
    }
    case PL__K_UINT: {
        uint64_t u = 0;
        rc = pl__key_u64(cfg, key, v, &u);
        if (rc == PL_OK) memcpy(field, &u, sizeof u);
        return rc;
    }
    case PL__K_NUM: {
        double d = 0;
        rc = pl__key_num(cfg, key, v, &d);
        if (rc == PL_OK) memcpy(field, &d, sizeof d);
        return rc;
    }
    case PL__K_ENUM:
        rc = pl__key_enum(cfg, key, v, k, &e);
        if (rc == PL_OK) store_int(cfg, k, e);
        return rc;
    case PL__K_STR:
        if (strlen(v->s) >= k->size)
            return pl__cfg_err(cfg,
                               strncmp(key, "topology.", 9) == 0 ? PL_ETOPOLOGY
                                                                 : PL_ECONFIG,
                               v->line, "%s: too long: '%s'", key, v->s);
        pl__fmt(field, k->size, "%s", v->s);
        return PL_OK;
    case PL__K_SPLIT:
        cfg->has_split = 1;
        return pl__split_parse(cfg, key, v, cfg->split);
    case PL__K_PRESET:
        /* The preset sets a, b, c (explicit keys override them afterwards)
         * and clears window. */
        rc = pl__key_enum(cfg, key, v, k, &e);
        if (rc != PL_OK) return rc;
        pl__fmt(field, k->size, "%s", k->values[e]);
        cfg->cost.a = preset_abc[e][0];
        cfg->cost.b = preset_abc[e][1];
        cfg->cost.c = preset_abc[e][2];
        cfg->cost.window = 0;
        return PL_OK;
    default:
        return pl__cfg_err(cfg, PL_ECONFIG, v->line, "unknown key '%s'", key);
    }
}

int pl__key_defaults(pl_config *cfg) {
    for (int i = 0; i < pl__n_keys; i++) {
        const pl__key *k = &pl__keys[i];
        if (!k->size || !k->dflt) continue;
        pl__sval v = {k->dflt, 0, -1};
        int rc = pl__key_set(cfg, k->name, &v);
        if (rc != PL_OK) return rc;
    }
    return PL_OK;
}

static int is_int_kind(int kind) {
    return kind == PL__K_INT || kind == PL__K_INT_NULL || kind == PL__K_INT_AUTO ||
           kind == PL__K_UINT || kind == PL__K_ENUM;
}

int pl__key_threads(pl_config *cfg, const char *key, const pl__sval *v, int64_t max,
                    int64_t *out) {
    if (!v->quoted && strcmp(v->s, "auto") == 0) {
        *out = 0;
        return PL_OK;
    }
    const char *p = v->s;
    char *end = NULL;
    errno = 0;
    long long x = (!v->quoted && *p) ? strtoll(p, &end, 10) : 0;
    if (v->quoted || !*p || errno || !end || *end || x < 1 || x > max)
        return pl__cfg_err(cfg, PL_ECONFIG, v->line,
                           "%s: expected auto or a positive thread count (at most %" PRId64
                           "), got '%s'",
                           key, max, v->s);
    *out = (int64_t)x;
    return PL_OK;
}

int pl__key_get_int(const pl_config *cfg, const char *key, int64_t *out) {
    const pl__key *k = pl__key_find(key);
    if (!k || !k->size || !is_int_kind(k->kind)) return PL_EINVAL;
    if (cfg->balance == PL__BALANCE_VLEN && strcmp(key, "max_tokens") == 0) {
        *out = pl__vlen_max_tokens(cfg); /* auto (0) resolved */
        return PL_OK;
    }
    if (k->kind == PL__K_UINT) {
        uint64_t u;
        memcpy(&u, (const char *)cfg + k->off, sizeof u);
        *out = (int64_t)u;
    } else {
        *out = load_int(cfg, k);
    }
    return PL_OK;
}

/* ------------------------------------------------------------ public */

int pl_config_get(const pl_config *cfg, const char *key, char *buf, size_t cap) {
    if (!cfg || !key || !buf || !cap) return PL_EINVAL;
    const pl__key *k = pl__key_find(key);
    if (!k || !k->size) return PL_EINVAL;
    if (cfg->balance == PL__BALANCE_VLEN && strcmp(key, "max_tokens") == 0) {
        /* auto (0) resolved: the tokens of a row */
        int n = snprintf(buf, cap, "%lld", (long long)pl__vlen_max_tokens(cfg));
        return n < 0 || (size_t)n >= cap ? PL_ERANGE : PL_OK;
    }
    const char *field = (const char *)cfg + k->off;
    int64_t x = 0;
    int n;
    switch (k->kind) {
    case PL__K_UINT: {
        uint64_t u;
        memcpy(&u, field, sizeof u);
        n = snprintf(buf, cap, "%" PRIu64, u);
        break;
    }
    case PL__K_NUM: {
        double d;
        memcpy(&d, field, sizeof d);
        n = snprintf(buf, cap, "%.17g", d);
        break;
    }
    case PL__K_ENUM: {
        x = load_int(cfg, k);
        const char *name = NULL;
        for (int j = 0; k->values[j]; j++)
            if (code_of(k, j) == x) name = k->values[j];
        n = snprintf(buf, cap, "%s", name ? name : "?");
        break;
    }
    case PL__K_STR:
    case PL__K_PRESET: n = snprintf(buf, cap, "%s", field); break;
    case PL__K_SPLIT:
        n = cfg->has_split ? snprintf(buf, cap, "%.17g,%.17g,%.17g", cfg->split[0],
                                      cfg->split[1], cfg->split[2])
                           : snprintf(buf, cap, "null");
        break;
    default:
        x = load_int(cfg, k);
        /* An integer key whose range starts at 1 is unset at 0 (vocab_size,
         * cost.window); INT_NULL's none is -1 (train_steps: endless); a
         * thread count's auto is 0. */
        if (k->kind == PL__K_INT_AUTO && x == 0 && strcmp(k->name, "topology.dp"))
            n = snprintf(buf, cap, "auto");
        else if ((k->kind == PL__K_INT_NULL && x == -1) || (x == 0 && k->min >= 1))
            n = snprintf(buf, cap, "null");
        else if (k->kind == PL__K_INT_AUTO && cfg->topology.dp_auto)
            n = snprintf(buf, cap, "auto");
        else
            n = snprintf(buf, cap, "%" PRId64, x);
        break;
    }
    return n < 0 || (size_t)n >= cap ? PL_ERANGE : PL_OK;
}

int64_t pl_config_key_count(void) { return pl__n_keys; }

int pl_config_key_info(int64_t i, pl_config_key_row *out) {
    if (!out || out->size < sizeof *out) return PL_EINVAL;
    if (i < 0 || i >= pl__n_keys) return PL_ERANGE;
    const pl__key *k = &pl__keys[i];
    const size_t size = out->size;
    memset(out, 0, size);
    out->size = size;
    out->name = k->name;
    out->type = kind_names[k->kind];
    out->default_value = k->dflt;
    out->settable = k->size != 0;
    out->values = names_of(k);
    if (k->kind == PL__K_INT || k->kind == PL__K_INT_NULL || k->kind == PL__K_INT_AUTO) {
        out->min = k->min;
        out->max = k->max;
    }
    out->doc = k->doc;
    return PL_OK;
}

/* ------------------------------------------------------------ source types */

static const struct {
    pl_source_type type;
    const char *name;
    int raw_text;
    const char *index, *doc;
} stype_rows[] = {
#define PL__STYPE(code, name, raw, images, index, doc) {code, name, raw, index, doc},
    PL_SOURCE_TYPE_MAP(PL__STYPE)
#undef PL__STYPE
};
#define PL__N_STYPES ((int)(sizeof stype_rows / sizeof stype_rows[0]))

const char *pl_source_type_name(pl_source_type type) {
    for (int i = 0; i < PL__N_STYPES; i++)
        if (stype_rows[i].type == type) return stype_rows[i].name;
    return NULL;
}

pl_source_type pl_source_type_from_name(const char *name) {
    for (int i = 0; name && i < PL__N_STYPES; i++)
        if (strcmp(stype_rows[i].name, name) == 0) return stype_rows[i].type;
    return (pl_source_type)0;
}

int pl_source_type_info(pl_source_type type, pl_source_type_row *out) {
    if (!out || out->size < sizeof *out) return PL_EINVAL;
    for (int i = 0; i < PL__N_STYPES; i++) {
        if (stype_rows[i].type != type) continue;
        const size_t size = out->size;
        memset(out, 0, size);
        out->size = size;
        out->type = type;
        out->name = stype_rows[i].name;
        out->raw_text = stype_rows[i].raw_text;
        out->index = stype_rows[i].index;
        out->doc = stype_rows[i].doc;
        return PL_OK;
    }
    return PL_ERANGE;
}
