/*
 * config.h -- the config object (config.c), its key table (keys.h, keys.c),
 * the YAML walk (yaml.c), validation and defaults (validate.c), the
 * mixture's weights over steps (schedule.c), train/valid/test splits
 * (split.c) and the topology order (topology.c).  Depends on common/ only.
 */
#ifndef POLYLOAD_CONFIG_H
#define POLYLOAD_CONFIG_H

#include "common/common.h"
#include "config/keys.h"

/* ------------------------------------------------------------ config */
/* The most micro-batches a run may count (per rank, at any dp): steps times
 * micro-batches per step stay far from overflow (config and state check). */
#define PL__MAX_MICRO_BATCHES ((int64_t)1 << 50)
/* The config's limit on seq_length, global_batch_size and the world size;
 * decoded plans are held to it too, so their sums cannot overflow. */
#define PL__MAX_SEQ_LENGTH ((int64_t)1 << 24)
/* No document offset in tokens is larger (offset + length stays an int64). */
#define PL__MAX_TOKEN_OFFSET ((int64_t)1 << 62)

enum { PL__LONGDOC_SPLIT = 0, PL__LONGDOC_TRUNCATE = 1 };
enum { PL__PACK_BEST_FIT = 0, PL__PACK_CONCAT_CHUNK = 1 };
enum { PL__BALANCE_NONE = 0, PL__BALANCE_GREEDY = 1, PL__BALANCE_KK = 2,
       PL__BALANCE_VLEN = 3 };
enum { PL__ONERR_FAIL = 0, PL__ONERR_SKIP = 1 };
enum { PL__INTERP_LINEAR = 0, PL__INTERP_STEP = 1 };

/* A `tokenizer:` mapping (per source or top level). */
enum { PL__TOK_BYTES = 1, PL__TOK_HF, PL__TOK_SENTENCEPIECE, PL__TOK_TIKTOKEN };
typedef struct pl__tok_cfg {
    int set;        /* 0: not given */
    int type;       /* PL__TOK_* */
    char *path;     /* malloc'd; NULL for bytes */
    char *pat_str;  /* tiktoken: the pre-tokenizer regex, or NULL (malloc'd) */
    char *encoding; /* tiktoken: a published encoding's name, or NULL (malloc'd) */
    char *backend;  /* hf: the library that encodes (`backend`), NULL: auto (malloc'd) */
    int add_eos;    /* default 1 */
    int threads;    /* tokenizer threads of the source; 0: auto (default) */
    int line;
} pl__tok_cfg;
/* Deep copy (dst's strings are overwritten, not freed) and release. */
int pl__tok_cfg_dup(pl__tok_cfg *dst, const pl__tok_cfg *src);
void pl__tok_cfg_free(pl__tok_cfg *t);

/* Options few sources set (webdataset images, raw-text record keys, chat
 * templates, tokenizers), kept out of line: a plain source's config is then
 * ~100 bytes instead of ~350, and every process of a deployment (trainers'
 * clients, planner, loaders, constructors: ~20 at 8 ranks) holds every
 * source's.  pl__sx reads them (all-zero defaults when the source sets
 * none). */
typedef struct pl__source_ext {
    pl_image_options image; /* webdataset: image, caption (config keys) */
    int verify_images;      /* webdataset: image.verify */
    /* jsonl/text */
    char *text_key;       /* malloc'd; NULL = "text" */
    char *prompt_key;     /* malloc'd; instruction data when set (with */
    char *response_key;   /* response_key), else NULL */
    char *messages_key;   /* malloc'd; chat instruction data when set */
    char *chat[3];        /* malloc'd chat_template: system, user, assistant */
    int64_t lookahead;    /* 0 = default */
    pl__tok_cfg tok;      /* own, or the top level's */
} pl__source_ext;

typedef struct pl__source_cfg { /* 104 bytes */
    char *name;
    char *path;           /* as written in the config */
    int64_t eos_id;       /* -1: type default */
    double weight;        /* raw weight (not normalized) */
    int64_t max_epochs;   /* 0: no cap; else drawn from no more than N epochs */
    double split[3];      /* train, valid, test fractions (normalized) */
    pl__source_ext *x;    /* malloc'd, or NULL: every option at its default */
    pl_source_type type;
    pl_dtype token_dtype; /* flat: UINT16 default */
    int path_line;        /* line of `path` in the config (0: unknown) */
    int has_split;        /* split set on this source */
    int write_index;      /* 0 default, -1: `index: memory` */
} pl__source_cfg;

extern const pl__source_ext pl__source_ext_none; /* all zero */
static inline const pl__source_ext *pl__sx(const pl__source_cfg *s) {
    return s->x ? s->x : &pl__source_ext_none;
}
/* Deep copy (*out NULL for NULL) and release. */
int pl__source_ext_dup(const pl__source_ext *src, pl__source_ext **out);
void pl__source_ext_free(pl__source_ext *x);

typedef struct pl__sched_point {
    int64_t step;
    double *weights; /* [n_sources], raw; a source absent from the point is 0 */
} pl__sched_point;

struct pl_config {
    char errmsg[PL__ERRMSG_CAP];
    char *origin; /* file path or "<string>" */
    uint64_t seed;
    int64_t seq_length;
    int64_t global_batch_size;
    int64_t micro_batch_size;
    int64_t train_steps; /* -1: endless */
    pl_dtype dtype;      /* PL_DTYPE_INT64 or PL_DTYPE_INT32 */
    int64_t pad_id;
    int long_documents;
    int packing;
    int balance;
    int64_t max_tokens;     /* balance: variable_length: tokens of a row; 0: auto */
    int64_t balance_window; /* steps planned together (1: each step alone) */
    struct {
        char preset[32];
        double a, b, c;
        int64_t window; /* sliding_window only; 0 otherwise */
        double enc_a, enc_b; /* encoder: a_e * N + b_e * N^2 per image */
    } cost;
    int64_t long_short_threshold; /* 0: off */
    /* cache: {dir, max_bytes, chunk_bytes}: the node-local cache of remote
     * sources (docs/guide/object-storage.md); never decides a batch. */
    char cache_dir[1024];          /* "": the default */
    int64_t cache_max_bytes;       /* 0: the default */
    int64_t cache_chunk_bytes;     /* 0: the default */
    int on_error;
    struct {
        int64_t dp, pp, cp, tp;
        char order[64];
        int dp_auto; /* topology.dp: auto, until pl_config_set_world_size */
        int line;    /* of the `topology` key (0: not written) */
    } topology;
    int64_t vocab_size; /* 0: unknown */
    int threads;        /* builder threads; 0: auto (default) */
    int prefetch;
    int64_t max_lag_steps; /* lag policy of the pipeline */
    int sidecar_index;     /* PL_INDEX_* policy of llmc/flat sources */
    int64_t n_sources;
    pl__source_cfg *sources;
    int has_schedule;
    int interpolation;
    int64_t n_points;
    pl__sched_point *points; /* sorted by step */
    int64_t n_warnings;
    char **warnings; /* [n_warnings], from the parse (pl_config_warning) */
    /* Validation and test data (pl_config_split).  split: the fractions of
       every source's documents (Megatron's --split), overridden per source;
       valid_sources / test_sources replace them for that split
       (Megatron's blend_per_split). */
    double split[3];
    int has_split;
    int64_t n_eval_sources[2];       /* [0] valid, [1] test */
    pl__source_cfg *eval_sources[2];
    int split_part; /* the part this config reads: 0 train, 1 valid, 2 test */
    int eval;       /* an evaluation pass: documents in index order, once */
    pl__tok_cfg tok; /* top-level `tokenizer` */
    pl_tokenizer_factory tok_factory;
    pl_tokenizer_spec_factory tok_factory_spec; /* wins over tok_factory */
    void *tok_factory_ctx;
    pl_lengths_fn lengths_fn; /* raw text sources: lengths from elsewhere */
    void *lengths_ctx;
    /* A frozen copy (pl__config_share): never changed, held by the objects
       that share it; refs counts the holders beyond the first, and
       pl_config_free only frees it when none is left (GCC/Clang __atomic
       builtins: this header is also C++'s). */
    int frozen;
    long refs;
};

/* Documents [*lo, *hi) of a source of n documents in part `part` of the
 * normalized fractions split[3], as megatron-core's
 * BlendedMegatronDatasetBuilder cuts them (bookends of the cumulative
 * fractions, rounded half to even). */
void pl__split_range(const double *split, int part, int64_t n, int64_t *lo,
                     int64_t *hi);
/* The fractions source i of cfg is split by (its own, the config's, or all
 * train). */
const double *pl__source_split(const pl_config *cfg, int64_t i);

/* Deep copy of a config (NULL on allocation failure). */
pl_config *pl__config_clone(const pl_config *cfg);
/* A read-only copy for an object that keeps the config (loader, pipeline,
 * planner, constructor): a frozen config is shared (one more holder), any
 * other is cloned into a new frozen one.  So a loader and the pipeline and
 * planner it creates hold one copy, not three (a config holds ~450 bytes per
 * source).  Freed with pl_config_free by every holder.  NULL: no memory. */
pl_config *pl__config_share(const pl_config *cfg);
/* Normalized weights of every source at `step` into w[n_sources]. */
void pl__config_weights(const pl_config *cfg, int64_t step, double *w);
/* Open source i of cfg (options from the config). *out as pl_source_open. */
int pl__config_open_source(const pl_config *cfg, int64_t i, pl_source **out);

/* Raw text sources: lengths come from tokenizing (raw_text in
 * PL_SOURCE_TYPE_MAP: jsonl, text, parquet). */
static inline int pl__is_text_type(pl_source_type t) {
    switch (t) {
#define PL__RAW(code, name, raw, images, index, doc) \
    case code: return raw;
        PL_SOURCE_TYPE_MAP(PL__RAW)
#undef PL__RAW
    }
    return 0;
}

/* Sources whose samples hold an image (webdataset): pixel_values, the
 * encoder's cost, image replies. */
static inline int pl__type_has_images(pl_source_type t) {
    switch (t) {
#define PL__IMG(code, name, raw, images, index, doc) \
    case code: return images;
        PL_SOURCE_TYPE_MAP(PL__IMG)
#undef PL__IMG
    }
    return 0;
}

/* ------------------------------------------------------------ shared by config/ */
/* Set cfg's message ("origin:line: ..." for line > 0, "origin: ..." for 0,
 * the bare message for line < 0) and return code. */
__attribute__((format(printf, 4, 5))) int
pl__cfg_err(pl_config *cfg, int code, int line, const char *fmt, ...);
/* Append a warning (formatted as pl__cfg_err's messages); PL_ENOMEM when it
 * cannot be stored. */
__attribute__((format(printf, 3, 4))) int
pl__cfg_warn(pl_config *cfg, int line, const char *fmt, ...);

/* Lines of keys that cross-key validation reports (0 when absent, -1 from
 * pl_config_set). */
typedef struct pl__vlines {
    int seq_length, global_batch_size, order, cost, sources;
} pl__vlines;
/* A new config with every default (NULL: no memory); origin NULL: "<string>". */
pl_config *pl__config_new(const char *origin);
/* The checks that involve several keys, after a parse and every
 * pl_config_set (validate.c). */
int pl__config_validate(pl_config *cfg, const pl__vlines *ln);
/* The sum of the sources' raw weights. */
double pl__source_weight_sum(const pl_config *cfg);
/* "969,30,1" into out[3], normalized fractions of train, valid, test. */
int pl__split_parse(pl_config *cfg, const char *key, const pl__sval *v,
                    double *out);

/* ------------------------------------------------------------ topology */
/*
 * Parse a topology order such as "tp-cp-ep-dp-pp" into axes[0..*n_axes)
 * (PL__AXIS_*; room for 5), leftmost first, i.e. fastest-varying first.
 * Each axis appears at most once; an axis left out has index 0 (the config
 * check requires its size to be 1).  PL_ETOPOLOGY with a message in err for
 * an unknown or repeated axis.
 */
enum { PL__AXIS_TP = 0, PL__AXIS_CP, PL__AXIS_EP, PL__AXIS_DP, PL__AXIS_PP };
int pl__topology_parse_order(const char *order, int *axes, int *n_axes,
                             char *err, size_t errcap);

/* The rows of a micro-batch and their length in tokens: micro_batch_size
 * rows of seq_length tokens, or under balance: variable_length one packed
 * row of max_tokens tokens. */
static inline int64_t pl__mb_rows(const pl_config *c) {
    return c->balance == PL__BALANCE_VLEN ? 1 : c->micro_batch_size;
}
static inline int64_t pl__vlen_max_tokens(const pl_config *c) {
    if (c->max_tokens > 0) return c->max_tokens;
    /* auto: a quarter more than micro_batch_size sequences, CP-aligned */
    int64_t t = c->micro_batch_size * c->seq_length, al = 2 * c->topology.cp;
    t += t / 4;
    return c->topology.cp > 1 ? (t + al - 1) / al * al : t;
}
static inline int64_t pl__row_tokens(const pl_config *c) {
    return c->balance == PL__BALANCE_VLEN ? pl__vlen_max_tokens(c) : c->seq_length;
}

#endif
