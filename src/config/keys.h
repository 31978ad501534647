/*
 * config/keys.h -- the one table of config keys and the one table of source
 * types (libuv's UV_ERRNO_MAP).  The YAML walk, pl_config_set, the defaults,
 * pl_config_get_int, "did you mean" suggestions, the public walk
 * (pl_config_key_info, pl_source_type_name), the CLI, the Python getters and
 * docs/reference/config.md all read these tables, so they cannot disagree.
 *
 * Adding a key: one row in PL_CONFIG_KEYS below.  A top-level scalar key
 * (plain or dotted, "balance_window", "cost.window") names its member of
 * struct pl_config with F(member) (add the member in config.h), and is then
 * parsed, range- or enum-checked, defaulted, settable with pl_config_set,
 * readable with pl_config_get_int (integer and enum kinds) and documented
 * with no other change (a dotted key is written as a mapping in YAML,
 * "cost: {window: 64}").  Cross-key checks go to validate.c; a key that
 * decides the batches goes into pl_config_fingerprint (config.c).  A key of
 * a source entry ("sources[].NAME") or of a tokenizer mapping is recognized,
 * suggested and documented from its row; its value is read in yaml.c.
 * Then run scripts/gen_config_table.py to refresh docs/reference/config.md.
 *
 * Adding a source type: a row in PL_SOURCE_TYPE_MAP (its value must be the
 * next pl_source_type code of polyload.h).
 */
#ifndef POLYLOAD_CONFIG_KEYS_H
#define POLYLOAD_CONFIG_KEYS_H

#include "common/common.h"

/*
 * PL_SOURCE_TYPE_MAP(X): X(code, name, raw_text, images, index, doc)
 *   code      the pl_source_type value (polyload.h)
 *   name      as written in a config's `type:`
 *   raw_text  1: raw text, tokenized online (needs a tokenizer)
 *   images    1: samples hold an image (pixel_values, the encoder's cost)
 *   index     what `polyload index` leaves for such a source
 *   doc       one line for the docs
 */
#define PL_SOURCE_TYPE_MAP(X)                                                     \
    X(PL_SOURCE_MEGATRON, "megatron", 0, 0, "its own .idx", \
      "megatron-core's indexed dataset (<prefix>.idx + <prefix>.bin); path is a "  \
      "prefix, a directory of prefixes or a glob")                                 \
    X(PL_SOURCE_LLMC, "llmc", 0, 0, ".plidx written or current", \
      "llm.c token shards (uint16 or uint32 tokens); a document starts at each "   \
      "eos_id (default 50256)")                                                    \
    X(PL_SOURCE_FLAT, "flat", 0, 0, ".plidx written or current", \
      "a raw uint16/uint32 token array (token_dtype); a document ends with each "  \
      "eos_id (default 0)")                                                        \
    X(PL_SOURCE_JSONL, "jsonl", 1, 0, "no index file (records are found at open)", \
      "JSON Lines (.gz, .zst too), one document per record's text_key, or "        \
      "instruction data; tokenized online")                                        \
    X(PL_SOURCE_TEXT, "text", 1, 0, "no index file (one document per file)", \
      "UTF-8 text files, one document per file; tokenized online")                 \
    X(PL_SOURCE_WEBDATASET, "webdataset", 0, 1, ".plwds written or current", \
      "WebDataset tar shards of images and captions (image, caption); a document " \
      "is an image's placeholder tokens, then its caption")                        \
    X(PL_SOURCE_PARQUET, "parquet", 1, 0,                                             \
      "no index file (the footer counts the rows)",                                \
      "Parquet files, one document per row of the string column text_key; "        \
      "tokenized online")

/*
 * PL_CONFIG_KEYS(X): X(name, kind, field, default, min, max, values, doc)
 *   name     the dotted key as written in YAML ("topology.dp"); a source
 *            entry's keys are "sources[].NAME", a tokenizer's "tokenizer.NAME"
 *            (also sources[].tokenizer.NAME)
 *   kind     how the value is read (PL__K_<kind>, keys.c):
 *              INT       an integer in [min, max]
 *              INT_NULL  an integer in [min, max], or null / -1 (none: -1)
 *              INT_AUTO  an integer in [min, max], or auto
 *              UINT      a non-negative 64-bit integer
 *              NUM       a finite number >= 0
 *              ENUM      one of `values`
 *              BOOL      true or false
 *              STR       a string
 *              SPLIT     train, valid, test parts such as 969,30,1
 *              PRESET    a cost preset (one of `values`; sets cost.a, b, c)
 *              SOURCE    a source type (PL_SOURCE_TYPE_MAP)
 *              LIST, MAP a list or mapping (its keys have rows of their own)
 *   field    F(member): where a top-level key is kept in struct pl_config;
 *            NOF for keys read by the YAML walk only (sources, tokenizers)
 *   default  as written in YAML, or NULL (unset; the doc says what that means)
 *   values   ENUM and PRESET: V("name", ...) (codes 0, 1, ...) or
 *            VC(("name", ...), (code, ...)); otherwise NOV
 *   doc      one line for docs/reference/config.md
 */
#define PL_CONFIG_KEYS(X)                                                          \
    X("seed", UINT, F(seed), "1234", 0, 0, NOV,                                   \
      "seed of every shuffle (0 .. 2^64-1)")                                       \
    X("seq_length", INT, F(seq_length), "8192", 1, INT32_MAX, NOV,                 \
      "tokens per row (a warning when left at its default)")                       \
    X("global_batch_size", INT, F(global_batch_size), "256", 1, INT32_MAX, NOV,    \
      "sequences per step over all data-parallel ranks; divisible by "             \
      "topology.dp * micro_batch_size")                                            \
    X("micro_batch_size", INT, F(micro_batch_size), "1", 1, INT32_MAX, NOV,        \
      "sequences per micro-batch")                                                 \
    X("train_steps", INT_NULL, F(train_steps), "null", 1, INT64_MAX, NOV,          \
      "steps of the run; null or -1: endless")                                     \
    X("dtype", ENUM, F(dtype), "int64", 0, 0,                                      \
      VC(("int64", "int32"), (PL_DTYPE_INT64, PL_DTYPE_INT32)),                    \
      "integer type of input_ids and labels")                                      \
    X("pad_id", INT, F(pad_id), "0", 0, INT64_MAX, NOV, "padding token")           \
    X("vocab_size", INT, F(vocab_size), NULL, 1, INT64_MAX, NOV,                   \
      "when given, a pad_id or eos_id outside the vocabulary is an error")         \
    X("long_documents", ENUM, F(long_documents), "split", 0, 0,                    \
      V("split", "truncate"),                                                      \
      "a document longer than seq_length: split over rows, or truncated")          \
    X("packing", ENUM, F(packing), "best_fit", 0, 0,                               \
      V("best_fit", "concat_chunk"), "how documents are packed into rows")         \
    X("balance", ENUM, F(balance), "none", 0, 0,                                   \
      V("none", "greedy", "karmarkar_karp", "variable_length"),                    \
      "how a step's sequences are arranged over data-parallel ranks by cost "      \
      "(variable_length: chunks dealt by cost to rows of max_tokens)")             \
    X("max_tokens", INT, F(max_tokens), "0", 0, (int64_t)1 << 24, NOV,           \
      "balance: variable_length: tokens of a micro-batch row, 0: 1.25 x "          \
      "micro_batch_size x seq_length (read back resolved)")                        \
    X("balance_window", INT, F(balance_window), "1", 1, 4096, NOV,                 \
      "steps planned together whose whole sequences are dealt across them by "     \
      "cost (1: each step alone; the mixture is exact over each window)")          \
    X("on_error", ENUM, F(on_error), "fail", 0, 0, V("fail", "skip"),              \
      "a bad record is an error (fail) or is skipped and counted (skip)")          \
    X("threads", INT_AUTO, F(threads), "auto", 1, 4096, NOV,                       \
      "worker threads; auto: the CPUs this process may use (affinity, cgroup "     \
      "quota) less one for the planner and consumer, at least 1")                  \
    X("prefetch", INT, F(prefetch), "4", 1, 4096, NOV,                             \
      "micro-batches prefetched per served rank")                                  \
    X("max_lag_steps", INT, F(max_lag_steps), "64", 1, (int64_t)1 << 20, NOV,      \
      "a served rank more than this many steps behind its group is dropped")       \
    X("sidecar_index", ENUM, F(sidecar_index), "write", 0, 0,                      \
      VC(("write", "read", "memory"),                                              \
         (PL_INDEX_WRITE, PL_INDEX_READ, PL_INDEX_MEMORY)),                        \
      "index sidecars (.plidx, .plwds, .pllen): written next to the data, only "   \
      "read, or kept in memory")                                                   \
    X("cost.preset", PRESET, F(cost.preset), "linear", 0, 0,                       \
      V("linear", "causal", "sliding_window", "llama-1b", "llama-7b"),             \
      "cost model of a sequence, a*tokens + b*sum(len^2) + c; sets a, b and c")    \
    X("cost.a", NUM, F(cost.a), NULL, 0, 0, NOV,                                   \
      "cost per token (overrides the preset's)")                                   \
    X("cost.b", NUM, F(cost.b), NULL, 0, 0, NOV,                                   \
      "cost per squared document length (overrides the preset's)")                 \
    X("cost.c", NUM, F(cost.c), NULL, 0, 0, NOV,                                   \
      "cost per sequence (overrides the preset's)")                                \
    X("cost.window", INT, F(cost.window), NULL, 1, INT64_MAX, NOV,                 \
      "attention window of cost.preset sliding_window (required there only)")      \
    X("cost.encoder.a", NUM, F(cost.enc_a), "0", 0, 0, NOV,                        \
      "image encoder cost per visual token")                                       \
    X("cost.encoder.b", NUM, F(cost.enc_b), "0", 0, 0, NOV,                        \
      "image encoder cost per squared visual-token count")                         \
    X("long_short.threshold", INT, F(long_short_threshold), "0", 0, INT64_MAX,     \
      NOV, "documents longer than this get a sequence of their own (0: off)")      \
    X("cache.dir", STR, F(cache_dir), NULL, 0, 0, NOV,                              \
      "node-local cache of remote (s3://, https://) sources; unset: "                \
      "$POLYLOAD_CACHE_DIR or ~/.cache/polyload")                                    \
    X("cache.max_bytes", INT, F(cache_max_bytes), NULL, 1, INT64_MAX, NOV,         \
      "bytes the node cache may hold (least recently used chunks evicted); "       \
      "unset: 16 GiB")                                                             \
    X("cache.chunk_bytes", INT, F(cache_chunk_bytes), NULL, 4096, 1073741824, NOV, \
      "bytes fetched per request into the node cache; unset: 1 MiB")              \
    X("topology.dp", INT_AUTO, F(topology.dp), "1", 1, INT32_MAX, NOV,             \
      "data-parallel size; auto: from the trainer's world size")                   \
    X("topology.pp", INT, F(topology.pp), "1", 1, INT32_MAX, NOV,                  \
      "pipeline-parallel size")                                                    \
    X("topology.cp", INT, F(topology.cp), "1", 1, INT32_MAX, NOV,                  \
      "context-parallel size (seq_length divisible by 2 * cp)")                    \
    X("topology.tp", INT, F(topology.tp), "1", 1, INT32_MAX, NOV,                  \
      "tensor-parallel size")                                                      \
    X("topology.order", STR, F(topology.order), "tp-cp-ep-dp-pp", 0, 0, NOV,       \
      "rank order, fastest-varying axis first (axes of size 1 may be left out)")   \
    X("split", SPLIT, F(split), NULL, 0, 0, NOV,                                   \
      "train, valid, test fractions of every source's documents (as Megatron's "   \
      "--split); unset: all train")                                                \
    X("tokenizer", MAP, NOF, NULL, 0, 0, NOV,                                      \
      "tokenizer of raw text sources that have none of their own")                 \
    X("tokenizer.type", ENUM, NOF, NULL, 0, 0,                                     \
      VC(("bytes", "hf", "sentencepiece", "tiktoken"),                             \
         (PL__TOK_BYTES, PL__TOK_HF, PL__TOK_SENTENCEPIECE, PL__TOK_TIKTOKEN)),    \
      "kind of tokenizer (required)")                                              \
    X("tokenizer.path", STR, NOF, NULL, 0, 0, NOV,                                 \
      "tokenizer file or directory (required except for bytes)")                   \
    X("tokenizer.add_eos", BOOL, NOF, "true", 0, 0, NOV,                           \
      "end each document with the tokenizer's end-of-text token")                  \
    X("tokenizer.threads", INT_AUTO, NOF, "auto", 1, 256, NOV,                     \
      "tokenizer threads of each source; auto: as threads")                        \
    X("tokenizer.backend", STR, NOF, "auto", 0, 0, NOV,                            \
      "type hf: the library that encodes: auto (fastokens where it gives the "     \
      "ids of tokenizers on a probe set, else tokenizers), fastokens, tokenizers") \
    X("tokenizer.pat_str", STR, NOF, NULL, 0, 0, NOV,                              \
      "tiktoken: the pre-tokenizer regex (or encoding)")                           \
    X("tokenizer.encoding", STR, NOF, NULL, 0, 0, NOV,                             \
      "tiktoken: a published encoding's name such as cl100k_base (or pat_str)")    \
    X("sources", LIST, NOF, NULL, 0, 0, NOV,                                       \
      "the training sources (required): mappings with the keys below")            \
    X("sources[].name", STR, NOF, NULL, 0, 0, NOV,                                 \
      "unique name of the source (required)")                                      \
    X("sources[].type", SOURCE, NOF, NULL, 0, 0, NOV,                              \
      "source type (required; see the source types)")                              \
    X("sources[].path", STR, NOF, NULL, 0, 0, NOV,                                 \
      "file, prefix, directory or glob (required; checked when the source opens)") \
    X("sources[].weight", NUM, NOF, "1", 0, 0, NOV,                                \
      "mixture weight (weights are normalized)")                                   \
    X("sources[].token_dtype", ENUM, NOF, "uint16", 0, 0,                          \
      VC(("uint16", "uint32"), (PL_DTYPE_UINT16, PL_DTYPE_UINT32)),                \
      "flat sources: width of a token")                                            \
    X("sources[].eos_id", INT, NOF, NULL, 0, INT64_MAX, NOV,                       \
      "llmc and flat sources: the end-of-document token (llmc 50256, flat 0)")     \
    X("sources[].max_epochs", INT, NOF, NULL, 1, INT32_MAX, NOV,                   \
      "draw from no more than this many epochs of the source (unset: no cap)")     \
    X("sources[].split", SPLIT, NOF, NULL, 0, 0, NOV,                              \
      "this source's train, valid, test fractions (overrides split)")              \
    X("sources[].image", MAP, NOF, NULL, 0, 0, NOV,                                \
      "webdataset sources: how images become tokens (required there)")            \
    X("sources[].caption", STR, NOF, "txt", 0, 0, NOV,                             \
      "webdataset sources: the caption, txt or json:FIELD")                        \
    X("sources[].index", ENUM, NOF, "file", 0, 0, VC(("file", "memory"), (0, -1)), \
      "index sidecar of this source: as sidecar_index (file), or in memory")       \
    X("sources[].text_key", STR, NOF, "text", 0, 0, NOV,                           \
      "jsonl and parquet sources: the field or column holding the text")          \
    X("sources[].prompt_key", STR, NOF, NULL, 0, 0, NOV,                           \
      "jsonl instruction data: the prompt field (not trained on)")                 \
    X("sources[].response_key", STR, NOF, NULL, 0, 0, NOV,                         \
      "jsonl instruction data: the response field (trained on)")                   \
    X("sources[].messages_key", STR, NOF, NULL, 0, 0, NOV,                         \
      "jsonl chat data: the field holding the list of messages")                   \
    X("sources[].chat_template", MAP, NOF, NULL, 0, 0, NOV,                        \
      "chat data: chatml, or {system, user, assistant} strings with {content}")    \
    X("sources[].tokenizer", MAP, NOF, NULL, 0, 0, NOV,                            \
      "raw text sources: the source's own tokenizer (keys as tokenizer)")          \
    X("sources[].lookahead", INT, NOF, NULL, 1, (int64_t)1 << 24, NOV,             \
      "raw text sources: documents tokenized ahead of the planner (unset: the "    \
      "default)")                                                                  \
    X("sources[].image.mode", ENUM, NOF, "fixed", 0, 0,                            \
      VC(("fixed", "native"), (PL_IMAGE_FIXED, PL_IMAGE_NATIVE)),                  \
      "fixed: resized to size x size; native: kept near its own size")             \
    X("sources[].image.size", INT, NOF, "336", 1, 16384, NOV,                      \
      "fixed mode: the side of the resized image in pixels")                       \
    X("sources[].image.patch_size", INT, NOF, "14", 1, 1024, NOV,                  \
      "side of a patch in pixels")                                                 \
    X("sources[].image.merge_size", INT, NOF, NULL, 1, 64, NOV,                    \
      "patches merged per side into one visual token (fixed 1, native 2)")         \
    X("sources[].image.min_pixels", INT, NOF, NULL, 1, (int64_t)1 << 30, NOV,      \
      "native mode: the fewest pixels an image is resized to")                     \
    X("sources[].image.max_pixels", INT, NOF, NULL, 1, (int64_t)1 << 30, NOV,      \
      "native mode: the most pixels an image is resized to (28*28*1280)")          \
    X("sources[].image.token_id", INT, NOF, NULL, 0, UINT32_MAX, NOV,              \
      "the image placeholder token (required)")                                    \
    X("sources[].image.limit_pixels", INT, NOF, NULL, 1, (int64_t)1 << 40, NOV,    \
      "images with more stored pixels are damaged records (decompression bombs)")  \
    X("sources[].image.caption_token_offset", INT, NOF, "0", 0,                    \
      UINT32_MAX - 255, NOV, "added to the caption's byte tokens")                 \
    X("sources[].image.verify", BOOL, NOF, "false", 0, 0, NOV,                     \
      "decode every image when the index is built and record the bad ones")        \
    X("valid_sources", LIST, NOF, NULL, 0, 0, NOV,                                 \
      "validation sources read whole, instead of the split's valid part (keys "   \
      "as sources, without split)")                                                \
    X("test_sources", LIST, NOF, NULL, 0, 0, NOV,                                  \
      "test sources read whole, instead of the split's test part")                 \
    X("schedule", MAP, NOF, NULL, 0, 0, NOV,                                       \
      "weights that change over steps; overrides the sources' weights")            \
    X("schedule.interpolation", ENUM, F(interpolation), "linear", 0, 0,            \
      V("linear", "step"), "between points: linear, or the last point's weights")  \
    X("schedule.points", LIST, NOF, NULL, 0, 0, NOV,                               \
      "the schedule's points, steps increasing (required)")                        \
    X("schedule.points[].step", INT, NOF, NULL, 0, INT64_MAX, NOV,                 \
      "step of the point (required)")                                              \
    X("schedule.points[].weights", MAP, NOF, NULL, 0, 0, NOV,                      \
      "source name: weight; a source left out has weight 0 there (required)")


/* ------------------------------------------------------------ the tables */

/* Kinds of value (the `kind` column). */
enum {
    PL__K_INT = 1, PL__K_INT_NULL, PL__K_INT_AUTO, PL__K_UINT, PL__K_NUM,
    PL__K_ENUM, PL__K_BOOL, PL__K_STR, PL__K_SPLIT, PL__K_PRESET, PL__K_SOURCE,
    PL__K_LIST, PL__K_MAP
};

/* One row of PL_CONFIG_KEYS. */
typedef struct pl__key {
    const char *name;
    int kind;            /* PL__K_* */
    size_t off, size;    /* the member of struct pl_config; size 0: none */
    const char *dflt;    /* as written in YAML, or NULL */
    int64_t min, max;    /* INT, INT_NULL, INT_AUTO */
    const char *const *values; /* ENUM, PRESET: NULL-terminated names */
    const int *codes;    /* ENUM: the code of each name; NULL: its position */
    const char *doc;
} pl__key;

extern const pl__key pl__keys[];
extern const int pl__n_keys;

/* The row of a dotted key ("topology.dp", "sources[].weight"), or NULL. */
const pl__key *pl__key_find(const char *name);

/*
 * The key under `prefix` ("" for the top level, "topology.", "sources[].")
 * closest to `name` (an edit or two away, or begun by it) into out: 1 when
 * there is one, else 0.  With settable != 0 the candidates are the keys
 * pl_config_set takes, by full dotted name.
 */
int pl__key_suggest(const char *prefix, const char *name, int settable,
                    char *out, size_t cap);
/* The values of key `name` (ENUM, PRESET, SOURCE) as "a, b, c". */
void pl__key_values(const char *name, char *out, size_t cap);
/* The keys directly under `prefix`, in table order, as "a, b, c". */
void pl__key_children(const char *prefix, char *out, size_t cap);

/* ------------------------------------------------------------ values */

/* A scalar value with where it came from.  line > 0: YAML line; 0: no line
 * (the origin is still named); < 0: from pl_config_set (no origin). */
typedef struct pl__sval {
    const char *s;
    int quoted; /* a quoted YAML scalar: a string, never a number */
    int line;
} pl__sval;

/* Readers of one value; each is PL_OK, or PL_ECONFIG with cfg's message
 * naming `key` (and the line).  YAML's null: pl__key_null. */
int pl__key_null(const pl__sval *v);
int pl__key_int(pl_config *cfg, const char *key, const pl__sval *v,
                int64_t min, int64_t max, int64_t *out);
int pl__key_u64(pl_config *cfg, const char *key, const pl__sval *v,
                uint64_t *out);
int pl__key_num(pl_config *cfg, const char *key, const pl__sval *v,
                double *out); /* finite, >= 0 */
/* One of row's values; *out its code. */
int pl__key_enum(pl_config *cfg, const char *key, const pl__sval *v,
                 const pl__key *row, int *out);
/* Integers of a row's range ("sources[].max_epochs"): as pl__key_int. */
int pl__key_row_int(pl_config *cfg, const pl__key *row, const char *key,
                    const pl__sval *v, int64_t *out);

/* Set top-level scalar `key` (a row with a field) from v: pl_config_set and
 * the YAML walk.  Unknown keys are errors with a suggestion.  No
 * cross-key validation (pl__config_validate). */
int pl__key_set(pl_config *cfg, const char *key, const pl__sval *v);
/* Every top-level key with a default set to it (a new config). */
int pl__key_defaults(pl_config *cfg);
/* An integer or enum key's value (pl_config_get_int); PL_EINVAL when key
 * is not one. */
int pl__key_get_int(const pl_config *cfg, const char *key, int64_t *out);
/* A thread count: 1..max, or auto (0: resolved where the threads start,
 * pl_cpus_available). */
int pl__key_threads(pl_config *cfg, const char *key, const pl__sval *v, int64_t max,
                    int64_t *out);

#endif
