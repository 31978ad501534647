/*
 * internal.h -- declarations shared by the modules of libpolyload.  Not
 * installed; nothing here is part of the public contract.  Internal non-static
 * symbols carry the pl__ prefix.
 */
#ifndef POLYLOAD_INTERNAL_H
#define POLYLOAD_INTERNAL_H

#include "polyload/polyload.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define PL__ERRMSG_CAP 512

/* A mutex for short critical sections that threads on other cores take at
 * a high rate (the pipeline's, the batch pool's): glibc's adaptive kind
 * spins a little before it sleeps in the kernel, so a contended lock held
 * for a few hundred nanoseconds costs no futex wait and wake-up.  0 or an
 * errno value, as pthread_mutex_init. */
static inline int pl__mutex_init_busy(pthread_mutex_t *mu) {
#if defined(PTHREAD_ADAPTIVE_MUTEX_INITIALIZER_NP)
    pthread_mutexattr_t a;
    if (pthread_mutexattr_init(&a)) return pthread_mutex_init(mu, NULL);
    pthread_mutexattr_settype(&a, PTHREAD_MUTEX_ADAPTIVE_NP);
    int rc = pthread_mutex_init(mu, &a);
    pthread_mutexattr_destroy(&a);
    return rc;
#else
    return pthread_mutex_init(mu, NULL);
#endif
}

/* Format into buf (always NUL-terminated, truncated if needed). */
void pl__fmt(char *buf, size_t cap, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
void pl__vfmt(char *buf, size_t cap, const char *fmt, va_list ap);

/* Record msg as the calling thread's last error (pl_last_errmsg). */
void pl__thread_err(const char *msg);

/* Allocation helpers that never abort: NULL on failure. */
void *pl__calloc(size_t n, size_t size);
void *pl__realloc_array(void *p, size_t n, size_t size);
char *pl__strdup(const char *s);

/* Read a whole file into a malloc'd buffer.  PL_OK, PL_ENOENT, PL_EIO (errno
 * in *err_no) or PL_ENOMEM. */
int pl__read_file(const char *path, void **data, size_t *len, int *err_no);

/* 64-bit hash of bytes with a seed (xxHash XXH3). */
uint64_t pl__hash64(const void *data, size_t len, uint64_t seed);
/* CRC-32 (zlib's, IEEE polynomial). */
uint32_t pl__crc32(uint32_t crc, const void *data, size_t len);

/*
 * An index of borrowed strings by content (names.c): O(1) lookups of source
 * names.  Init with the number of names it will hold; the strings must
 * outlive it.
 */
typedef struct pl__name_slot {
    const char *s; /* NULL: empty */
    size_t n;
    uint64_t hash;
    int64_t value;
} pl__name_slot;
typedef struct pl__names {
    pl__name_slot *slot;
    uint64_t mask, used;
} pl__names;
int pl__names_init(pl__names *x, int64_t n);
void pl__names_free(pl__names *x);
/* The value stored for (s, n), or -1. */
int64_t pl__names_get(const pl__names *x, const char *s, size_t n);
/* Store (s, n) -> value unless present: -1 when stored, the earlier value
 * when the name is already there, -2 when the index is full. */
int64_t pl__names_put(pl__names *x, const char *s, size_t n, int64_t value);

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
enum { PL__BALANCE_NONE = 0, PL__BALANCE_GREEDY = 1, PL__BALANCE_KK = 2 };
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
    int add_eos;    /* default 1 */
    int threads;    /* tokenizer threads of the source; default 1 */
    int line;
} pl__tok_cfg;
/* Deep copy (dst's strings are overwritten, not freed) and release. */
int pl__tok_cfg_dup(pl__tok_cfg *dst, const pl__tok_cfg *src);
void pl__tok_cfg_free(pl__tok_cfg *t);

/* SentencePiece (tokenizer_spm.cc; only with PL_WITH_SENTENCEPIECE). */
int pl__spm_create(const char *path, pl_tokenizer *out, char *err, size_t errcap);

/* Shared, releasable tokenizers (tokenizer_share.c).  pl__tokref_create: a
 * wrapper pl_tokenizer (owning its ctx) over the process's one loaded
 * tokenizer of (type, path, pat_str, encoding, factory, file identity),
 * built now with fn/spec_fn (both NULL: built in); the strings are copied.
 * pl__tokref_release: drop the wrapper's reference (rebuilt by its next
 * encode_batch) and trim the heap; 1 if one was held, 0 if not, -1 for a
 * tokenizer that is no wrapper.  pl__tokref_state: 1 loaded, 0 released, -1
 * no wrapper; *builds: references taken so far, *shared_by: wrappers
 * holding the same loaded tokenizer (0 when released). */
int pl__tokref_create(int type, const char *path, const char *pat_str,
                      const char *encoding, pl_tokenizer_factory fn,
                      pl_tokenizer_spec_factory spec_fn, void *ctx, pl_tokenizer *out,
                      char *err, size_t errcap);
int pl__tokref_release(pl_tokenizer *tok);
int pl__tokref_state(const pl_tokenizer *tok, int64_t *builds, int64_t *shared_by);
/* Run fn(arg) on thread key % n of the tokenize pool (pl_set_tokenize_threads)
 * and wait, or here when there is no pool (or on a pool thread).
 * pl__tokref_key: the key of a tokenizer (its file's), as build uses. */
void pl__tokpool_run(uint64_t key, void (*fn)(void *), void *arg);
uint64_t pl__tokref_key(const pl_tokenizer *tok);
/* Tokenizers built by the wrappers so far in this process. */
int64_t pl__tokenizers_loaded(void);
/* Give free heap pages back to the system (glibc malloc_trim(0)): now, or
 * at most every 100 ms (called after each tokenized batch). */
void pl__heap_trim(void);
void pl__heap_trim_soon(void);

/* Options few sources set (webdataset images, raw-text record keys, chat
 * templates, tokenizers), kept out of line: a plain source's config is then
 * ~100 bytes instead of ~350, and every process of a deployment (trainers'
 * clients, planner, loaders, constructors: ~20 at 8 ranks) holds every
 * source's.  pl__sx reads them (all-zero defaults when the source sets
 * none). */
typedef struct pl__source_ext {
    pl_image_options image; /* webdataset: image, caption (config keys) */
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
    struct {
        char preset[32];
        double a, b, c;
        int64_t window; /* sliding_window only; 0 otherwise */
        double enc_a, enc_b; /* encoder: a_e * N + b_e * N^2 per image */
    } cost;
    int64_t long_short_threshold; /* 0: off */
    int on_error;
    struct {
        int64_t dp, pp, cp, tp;
        char order[64];
        int dp_auto; /* topology.dp: auto, until pl_config_set_world_size */
    } topology;
    int64_t vocab_size; /* 0: unknown */
    int threads;
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

/* ------------------------------------------------------------ sources */
/* pl_source_open, with on_error: skip applied to damage found at open
 * (skip_damaged 1: a Megatron file's trailing records that point past its
 * .bin are left out and counted, pl_source_num_skipped). */
int pl__source_open(const pl_source_options *opts, int skip_damaged,
                    pl_source **out);
/*
 * Thread-safe variants of pl_source_document_length / pl_source_read that
 * write an error message into the caller's buffer instead of the handle.
 */
/* Undo pl_pipeline_close (the embedded loader stops and restarts its
 * workers around pl_loader_set_state). */
void pl__pipeline_reopen(pl_pipeline *p);
/* End the pipeline at `step` (an evaluation pass ran out of documents
 * there): as if train_steps were `step`, unless that is already earlier. */
void pl__pipeline_end_at(pl_pipeline *p, int64_t step);
/* Let drivers plan up to `steps` steps past the step of a group's next unit
 * (0, the default: only a step some group's window admits).  Plans are made
 * in step order by one planner either way, so no plan or batch changes; the
 * embedded loader with more than one worker sets 1 (one plans while the
 * others build). */
void pl__pipeline_plan_ahead(pl_pipeline *p, int64_t steps);
/* Plan `ahead` steps past the step of a group's next unit, and ask again only
 * once no more than `low` are (a transport that moves steps in bursts:
 * pl_loader_want_steps).  pl__pipeline_plan_ahead(p, n) is (n, n). */
void pl__pipeline_plan_window(pl_pipeline *p, int64_t ahead, int64_t low);
/* After a PL_WORK_PLAN for `step` (next_plan_step): grant the steps from it
 * up to `ahead` past the least step a group builds next (at least 1, at most
 * to total_steps), to be added in order by pl_pipeline_add_step without
 * asking again.  Returns how many; 0 when `step` is not the one asked for. */
int64_t pl__pipeline_grant(pl_pipeline *p, int64_t step, int64_t ahead);
/* Hold a consumer's wake-up for up to `units` cheap units (<= 1: off; see
 * "Held wake-ups" in pipeline.c).  Only for drivers that call
 * pl_pipeline_get_work again after each pl_pipeline_complete, as the
 * loader's worker threads do: a held wake-up goes out there. */
void pl__pipeline_defer_wakes(pl_pipeline *p, int64_t units);
/* Replace a source's message (config.c names the source's config key). */
void pl__source_set_err(pl_source *src, const char *msg);
/* Convert n tokens from src_dtype (unaligned source allowed) to int64 or
 * int32 (dst_dtype PL_DTYPE_INT64 or PL_DTYPE_INT32). */
void pl__tokens_convert(const void *src, pl_dtype src_dtype, void *dst,
                        pl_dtype dst_dtype, int64_t n);
int pl__source_length(pl_source *src, int64_t index, int64_t *length,
                      char *err, size_t errcap);
/* As pl_source_read, but an instruction source gives its prompt tokens in
 * the marked form (-1 - id) that the constructor turns into the mask. */
int pl__source_read(pl_source *src, int64_t index, int64_t offset,
                    int64_t count, void *out, pl_dtype out_dtype, char *err,
                    size_t errcap);
/*
 * pl__source_length without the check that the index file has not shrunk
 * (about 10-15 ns of a lookup that is a cache miss); for the planner, which
 * checks its sources' indexes once per step with pl__source_check_index
 * (PL_ETRUNC naming the file, or PL_EIO).
 */
int pl__source_length_unchecked(pl_source *src, int64_t index,
                                int64_t *length, char *err, size_t errcap);
int pl__source_check_index(pl_source *src, char *err, size_t errcap);
/* pl_source_image_info / pl_source_read_image with the error in err
 * (source_wds.c); PL_EINVAL for a source that is not a webdataset. */
int pl__wds_image_info(pl_source *src, int64_t index, pl_image_info *out, char *err,
                       size_t errcap);
int pl__wds_read_image(pl_source *src, int64_t index, uint8_t *out, size_t cap,
                       pl_image_info *info, char *err, size_t errcap);
/* Apply the defaults of pl_image_options (as a webdataset source does at
 * open) and check the ranges; PL_EINVAL with a message naming source `name`. */
int pl__wds_defaults(pl_image_options *o, char *err, size_t errcap, const char *name);
/* The geometry of an image resized to out_h x out_w under options o (with
 * defaults applied): mode, patch_dim, grid, patches, tokens, bytes and the
 * out size; width/height (as stored) are left as they are. */
void pl__image_geometry(const pl_image_options *o, int64_t out_h, int64_t out_w,
                        pl_image_info *out);

/* ------------------------------------------------------------ shuffle */
/* Keyed bijection on [0, n) (Feistel network with cycle walking). */
typedef struct pl__perm {
    uint64_t n;
    uint64_t half_bits; /* bits of each Feistel half */
    uint64_t mask;
    uint64_t keys[4];
} pl__perm;
void pl__perm_init(pl__perm *p, uint64_t n, uint64_t seed, const char *name,
                   uint64_t epoch);
uint64_t pl__perm_apply(const pl__perm *p, uint64_t i);

/* Ask the CPU to bring document `index`'s index entry (Megatron's length
 * and pointer, a .plidx end offset) into cache: the planner does so for a
 * source's next document when it starts one, so that the lookup a draw
 * waits for is a cache hit.  A hint only: no read, no error, any index. */
void pl__source_prefetch(const pl_source *src, int64_t index);

/* Raw text sources (source_text.c): sources whose lengths come from
 * tokenizing.  The planner tells such a source the position `pos` of its
 * epoch's order that it is about to ask for, so the source's threads can
 * tokenize what follows.  Position i of the order is document
 * lo + perm(i) of the source, or lo + i when perm is NULL (an evaluation
 * pass in index order); the order has perm->n (else n) positions (a split
 * of the source: lo and n are its range). */
int pl__source_is_lazy(const pl_source *src);
void pl__source_lookahead(pl_source *src, const pl__perm *perm, int64_t lo,
                          int64_t n, int64_t epoch, int64_t pos);

#endif
