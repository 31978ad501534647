/*
 * polyload_experimental.h -- the experimental tier of libpolyload.
 *
 * EXPERIMENTAL: what this header declares may change between versions,
 * without the _v2 and appended-fields rules of polyload.h (as zstd's
 * ZSTD_STATIC_LINKING_ONLY section).  A program that uses it should be
 * built against the same version of the library it runs with.
 *
 * polyload.h is the stable API of a trainer: errors, dtypes, config,
 * sources, the embedded loader, batches and state blobs.  This header holds
 * the roles of the loader taken one by one and the bytes that travel
 * between them, for deployments that place the roles in different
 * processes (the Ray deployment of polyload.ray) and for tools (the CLI's
 * `plan` and `calibrate`, benchmarks, tests):
 *   - plans, the planner and the cost model;
 *   - the data constructor, the reads it asks for and the wire messages:
 *     plans (pl_plan_encode), packages (pl_package_encode_v2), source
 *     loaders' replies (pl_reply_encode_timed);
 *   - the pipeline, the step ledger both deployments drive;
 *   - the trainer side of a distributed deployment (an external loader fed
 *     with packages);
 *   - what a process that hosts sources for others needs (releasing pages
 *     and tokenizers, a shared tokenize pool, lengths-only sources, the
 *     tokenizing CPU per source), one config shared by a binding and the
 *     objects made from it, and the state blob utilities of the Ray planner
 *     (pl_state_retarget, pl_state_pack).
 *
 * The conventions of polyload.h (status codes, handles, messages,
 * ownership) apply here too; "SPEC section N" refers to
 * docs/reference/spec.md.  The public .so exports the symbols of both
 * headers and nothing else.
 */
#ifndef POLYLOAD_EXPERIMENTAL_H
#define POLYLOAD_EXPERIMENTAL_H

#include "polyload.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ================================================================= plans */
/*
 * A chunk: a contiguous piece of a document, in tokens (SPEC section 1).
 * `source` is the index of the source in the config.
 */
typedef struct pl_chunk {
    int32_t source;
    int32_t flags; /* PL_CHUNK_DOC_END when the chunk reaches its document's
                      end (a long_documents: truncate chunk that cuts its
                      document short does not: its last token is labelled with
                      the document's next token, which pl_plan_reads reads) */
    int64_t index;
    int64_t offset;
    int64_t length;
} pl_chunk;
#define PL_CHUNK_DOC_END 1

/*
 * The plan of one step: its member chunks arranged into global_batch_size
 * sequences, and the sequences assigned to DP ranks and micro-batches.
 * Plans are made by the library (pl_planner_next, pl_plan_decode) and are
 * read-only to callers (the arrays are const): every function that reads
 * one takes a `const pl_plan *`; pl_plan_free and pl_pipeline_add_step
 * (which takes ownership) take a `pl_plan *`.  A plan built by hand in C
 * (tests, tools) is checked by pl_plan_reads and pl_constructor_build before
 * use.
 * Sequence q holds chunks[seq_offsets[q] .. seq_offsets[q+1]).  The sequence
 * in row `row` of micro-batch `mb` of DP rank `r` is
 *   rank_sequences[(r * micro_batches_per_rank + mb) * micro_batch_size + row].
 * All arrays are owned by the plan.
 *
 * Packing (config `packing`).  best_fit: chunks placed best-fit decreasing,
 * rows end with padding.  concat_chunk: megatron-core GPTDataset's layout
 * (gpt_dataset.py, helpers.cpp build_sample_idx): whole documents follow each
 * other in draw order and sequence q of the stream holds its tokens
 * [q * seq_length, (q + 1) * seq_length), the last one labelled with token
 * (q + 1) * seq_length when a document goes on there (windows of
 * seq_length + 1 tokens sharing one); pieces of one document that meet in a
 * sequence are one chunk.  An evaluation pass (pl_config_split) may end with
 * sequences that hold fewer tokens, or none.
 */
typedef struct pl_plan {
    int64_t step;
    int64_t dp;
    int64_t global_batch_size;
    int64_t micro_batch_size;
    int64_t micro_batches_per_rank;
    int64_t seq_length;
    int64_t n_sequences;         /* == global_batch_size */
    int64_t n_chunks;
    const pl_chunk *chunks;      /* [n_chunks] */
    const int64_t *seq_offsets;  /* [n_sequences + 1] */
    const int64_t *seq_tokens;   /* [n_sequences] tokens incl. CP padding */
    const double *seq_cost;      /* [n_sequences], cost model of SPEC 5 */
    const int64_t *rank_sequences; /* [n_sequences], see above */
    const double *rank_cost;     /* [dp] */
    int64_t tokens;              /* non-padding tokens of the step */
    double lower_bound;          /* max(total cost / dp, costliest chunk) */
    /* The image encoder's part of rank_cost (cost.encoder: a_e * N + b_e *
     * N^2 per image of N patches), so the backbone's is rank_cost minus it;
     * NULL when no encoder term is configured, or for a decoded plan. */
    const double *rank_encoder_cost; /* [dp] */
} pl_plan;

/* ================================================================ planner */
/*
 * The planner alone: emits plans from metadata (document lengths), never
 * reading payloads.  Used by `polyload plan` and by deployments that place
 * the roles in different processes.  Sources are borrowed and must outlive
 * the planner.  Not thread-safe.
 */
typedef struct pl_planner pl_planner;

PL_API int pl_planner_create(const pl_config *cfg, pl_source *const *sources,
                             int64_t n_sources, pl_planner **out);
PL_API void pl_planner_free(pl_planner *planner);
PL_API const char *pl_planner_errmsg(const pl_planner *planner);
/*
 * Plan the next step (train_steps does not apply: the planner never returns
 * PL_DONE).  The plan is owned by the caller: pl_plan_free.  Errors: a
 * source error (PL_EBOUNDS, ... naming file and offset; with on_error: skip
 * bad documents are skipped instead), PL_ECONFIG (every weight zero at this
 * step), PL_ENOMEM.  A failure is sticky until pl_planner_set_state.
 */
PL_API int pl_planner_next(pl_planner *planner, pl_plan **out);
PL_API void pl_plan_free(pl_plan *plan);
/* State blob at the current step boundary (micro-batch cursor 0); the
 * cap/len convention of pl_loader_get_state.  Of a step begun under another
 * mixture (pl_planner_set_state of a mid-step state with other weights) it
 * records the weights that step is planned with, so loading it plans the
 * same step again. */
PL_API int pl_planner_get_state(pl_planner *planner, void *buf, size_t cap,
                                size_t *len);
/* Continue from a state blob (pl_loader_get_state's or
 * pl_planner_get_state's): the planner stands at the start of the blob's
 * step; a mid-step micro-batch cursor is the loader's business and is
 * ignored here.  PL_ESTATE as pl_loader_set_state; on error nothing changes. */
PL_API int pl_planner_set_state(pl_planner *planner, const void *buf,
                                size_t len);

/* ============================================================ cost model */
/*
 * The cost model of SPEC section 5: the estimated compute of one sequence,
 *     cost = a * tokens + b * sum over its documents of attn(len) + c,
 * with attn(len) = len^2 (causal attention within a document) or
 * len * min(len, window) (cost.preset sliding_window).  The planner balances
 * DP ranks and micro-batches by this cost; pl_plan.seq_cost holds it.
 */

/*
 * The cost under cfg's cost model (preset, a, b, c, window) of one sequence
 * that packs n documents of the given lengths (in tokens).  doc_lengths may
 * be NULL when n is 0 (the cost is then c).  Returns NaN when cfg is NULL,
 * n < 0, or doc_lengths is NULL with n > 0.  Thread-safe.
 */
PL_API double pl_cost_sequence(const pl_config *cfg, const int64_t *doc_lengths,
                               int64_t n);

/*
 * Fit a, b, c by ordinary least squares to n measured rows
 *     time[i] ~= a * tokens[i] + b * sum_sq[i] + c
 * (tokens of a micro-batch, sum of its squared document lengths, measured
 * step time), as `polyload calibrate` does.  The 3x3 normal equations are
 * solved in long double after scaling each column to unit size, with partial
 * pivoting.  *r2 receives the coefficient of determination
 * 1 - SS_res / SS_tot (1 when every time is equal and fitted exactly).
 * Any of a, b, c, r2 may be NULL.  Returns PL_OK, or PL_EINVAL when an
 * input pointer is NULL, n < 3, a value is not finite, or the columns are
 * linearly dependent (e.g. sum_sq a multiple of tokens), leaving the outputs
 * untouched.  Thread-safe.
 */
PL_API int pl_cost_fit(const double *tokens, const double *sum_sq,
                       const double *time, int64_t n, double *a, double *b,
                       double *c, double *r2);

/* ======================================================== distributed use */
/*
 * The roles of the embedded loader, one by one, for deployments that put
 * them in different processes (the Ray deployment of polyload.ray): a
 * planner emits plans, plans travel as bytes (pl_plan_encode/decode), a data
 * constructor asks source loaders for the token ranges a micro-batch needs
 * (pl_plan_reads, pl_source_read_many) and builds the micro-batch from them
 * (pl_constructor_build).  The batches are bit for bit those of pl_loader.
 */

/* A token range of one document: what a constructor asks a source for. */
typedef struct pl_read {
    int32_t source;   /* index of the source in the config */
    int32_t reserved; /* 0 */
    int64_t index;    /* document */
    int64_t offset;   /* first token */
    int64_t count;    /* tokens: the chunk's length, plus one (the label of
                         its last token) unless the chunk ends its document */
} pl_read;

/*
 * The reads micro-batch `micro_batch` of DP rank `dp_rank` needs, in the
 * order pl_constructor_build consumes their payloads: rows in order, chunks
 * of a row in order.  Writes min(*n, cap) entries to out (out may be NULL to
 * learn *n).  PL_ERANGE for a bad rank or micro-batch; PL_EINVAL when cap is
 * too small (then *n tells the size needed).
 */
PL_API int pl_plan_reads(const pl_plan *plan, int64_t dp_rank,
                         int64_t micro_batch, pl_read *out, int64_t cap,
                         int64_t *n);

/*
 * Read many ranges of this source into `out` as int64 tokens, back to back
 * (out holds the sum of reads[i].count).  reads[i].source is ignored.
 * Unlike pl_source_read it reads the data file with pread(2), not through
 * the mapping, so a long-lived source-loader process that reads a few
 * documents from each of many sources keeps no file pages mapped.
 * Thread-safe like pl_source_read; errors as pl_source_read, plus PL_EIO
 * and PL_ETRUNC (the data file shrank) naming the file and offset.  It reads
 * through the descriptor kept from open time, never a path opened anew.
 */
PL_API int pl_source_read_many(pl_source *src, const pl_read *reads, int64_t n,
                               int64_t *out);

/*
 * Serialize a plan: a versioned blob (magic "PLPN", version, length, the
 * plan's fields and arrays, CRC-32).  Writes at most cap bytes to buf; *len
 * receives the size (buf may be NULL to learn it).
 */
PL_API int pl_plan_encode(const pl_plan *plan, void *buf, size_t cap,
                          size_t *len);
/* Rebuild a plan from pl_plan_encode's bytes; PL_EINVAL if they are corrupt.
 * The caller frees *out with pl_plan_free. */
PL_API int pl_plan_decode(const void *buf, size_t len, pl_plan **out);

/*
 * The data constructor alone: builds micro-batches from plans and payloads.
 * Not thread-safe (one per thread); batches outlive it (reference counted).
 */
typedef struct pl_constructor pl_constructor;
PL_API int pl_constructor_create(const pl_config *cfg, pl_constructor **out);
PL_API void pl_constructor_free(pl_constructor *ctor);
PL_API const char *pl_constructor_errmsg(const pl_constructor *ctor);
/*
 * Build micro-batch `micro_batch` of the plan for global rank `rank` (its DP
 * rank, CP slice and fields follow from the config's topology).  payloads[j]
 * holds payload_lengths[j] int64 tokens, which must be at least
 * reads[j].count of the j-th read of pl_plan_reads for the rank's DP rank.
 * The plan is checked before use (sources, lengths, sequences that fit
 * seq_length), so bytes from another process cannot make the build write
 * or read out of bounds.  *out is owned by the caller: pl_batch_release.
 * Errors: PL_ERANGE (rank, micro-batch), PL_EINVAL (too few or too short
 * payloads, a plan made for another config), PL_ENOMEM.
 */
PL_API int pl_constructor_build(pl_constructor *ctor, const pl_plan *plan,
                                int64_t rank, int64_t micro_batch,
                                const int64_t *const *payloads,
                                const int64_t *payload_lengths,
                                int64_t n_payloads, pl_batch **out);

/*
 * All reads of DP rank `dp_rank` for the whole step: pl_plan_reads of
 * micro-batches 0, 1, ... back to back (same cap/n convention).
 */
PL_API int pl_plan_step_reads(const pl_plan *plan, int64_t dp_rank,
                              pl_read *out, int64_t cap, int64_t *n);

/*
 * Read ranges of this source at its stored width (pl_source_token_dtype:
 * 1, 2, 4 or 8 bytes a token) into out, back to back; cap is out's size in
 * bytes (PL_EINVAL when the reads need more).  Reads with pread(2) as
 * pl_source_read_many; errors alike.  This is the compact form a source
 * loader ships to a data constructor.
 */
PL_API int pl_source_read_raw(pl_source *src, const pl_read *reads, int64_t n,
                              void *out, size_t cap);

/* Tokens of one read at the width of `dtype` (a pl_dtype of a token file). */
typedef struct pl_payload {
    const void *data;
    int32_t dtype;
    int32_t reserved; /* 0 */
    int64_t count;    /* tokens */
} pl_payload;

/*
 * A package: what a data constructor ships to the trainer ranks of one DP
 * rank for one step, and what pl_loader_push_package expands into the
 * micro-batches of SPEC section 3 at the receiver.  Versioned bytes (magic
 * "PLPK", version, length, step, DP rank, the state blob of the step's
 * start, the plan restricted to the DP rank's sequences (PLPN), the read
 * table (dtype and count per read) and the tokens of every read of
 * pl_plan_step_reads at their stored width, an XXH3-64 checksum).  payloads
 * hold the reads of pl_plan_step_reads(plan, dp_rank) in that order, each
 * at least its read's count long (only count tokens are stored).  cap/len
 * convention of pl_plan_encode.  PL_EINVAL for a bad payload list.
 */
PL_API int pl_package_encode(const pl_plan *plan, int64_t dp_rank,
                             const void *state, size_t state_len,
                             const pl_payload *payloads, int64_t n_payloads,
                             void *buf, size_t cap, size_t *len);
/*
 * The pixels of one image of a read (image-text sources), as a source loader
 * ships them to a data constructor (pl_reply_encode) and a constructor to
 * its trainer ranks (pl_package_encode_v2).  An image belongs to a read of a
 * webdataset sample that holds part of the sample's placeholder run (the
 * first `tokens` positions of its document; polyload.h "image-text
 * sources").  status PL_OK: data holds bytes = 3 * height * width pixel
 * bytes in pl_source_read_image's layout (fixed: [3, height, width]; native:
 * Qwen2-VL patches), or is NULL with bytes 0 when the read cuts the run (the
 * receiver reports that as the embedded loader does).  Any other status: the
 * PL_E* code of decoding the image, and data holds its message (bytes long,
 * not NUL-terminated), reported by the micro-batch that needs the image, so
 * a bad image fails the same micro-batch as in the embedded loader.
 */
#define PL_IMAGE_BLANK 1
typedef struct pl_payload_image {
    int64_t read;          /* index of its read in the payload list */
    int64_t tokens;        /* N: the image's placeholder tokens */
    int64_t height, width; /* after resizing, in pixels */
    int32_t status;        /* PL_OK or a PL_E* code */
    int32_t reserved;      /* 0, or PL_IMAGE_BLANK: the image did not decode and
                              data holds zeros in its place (on_error: skip);
                              its sample is kept with loss_mask 0 */
    const void *data;
    size_t bytes;
} pl_payload_image;

/*
 * pl_package_encode with images: images[0, n_images) in increasing `read`
 * order, at most one per read.  Without images (n_images 0) the package is
 * the one pl_package_encode makes.  Package layout after the tokens: per
 * image { i64 read, i64 tokens, i64 height, i64 width, i32 status, i32
 * flags (0 or PL_IMAGE_BLANK), u64 bytes }, then their data back to back.
 * The receiving loader checks
 * every record against its config (the source's image options) before a
 * byte is copied.  PL_EINVAL for a bad image list.
 */
PL_API int pl_package_encode_v2(const pl_plan *plan, int64_t dp_rank,
                                const void *state, size_t state_len,
                                const pl_payload *payloads, int64_t n_payloads,
                                const pl_payload_image *images,
                                int64_t n_images, void *buf, size_t cap,
                                size_t *len);

/*
 * A source loader's reply to reads of several sources, images included: what
 * a source-loader process of a distributed deployment returns when some
 * source is a webdataset (token-only deployments ship pl_source_read_raw's
 * bytes).  sources[reads[i].source] must be open (n_sources entries; NULL
 * for sources not held).  For every read of a webdataset sample that holds
 * part of its placeholder run (offset < N) the image is decoded and resized
 * here (pl_source_read_image) when the read holds the whole run (offset 0,
 * count >= N); a decoding error is stored in the reply as its image's status
 * and message (see pl_payload_image), not returned.
 *
 * Layout (little-endian): "PLRR", u32 version 1, u64 total length, i64
 * n_rows, i64 n_images; n_rows x { i32 dtype, i32 0, i64 count }; n_images
 * x { i64 row, i64 tokens, i64 height, i64 width, i32 status, i32 flags, u64
 * offset, u64 bytes } (offset into the pixel area, each image's slot being
 * 3 * height * width bytes); the tokens of every row back to back at their
 * source's stored width; the pixel area; u64 XXH3-64 of everything before.
 *
 * buf NULL (or cap too small: PL_EINVAL) gives *len alone, from the indexes
 * (no pixel decoded).  Errors: PL_EINVAL (bad arguments, a source not held),
 * and those of pl_source_read_raw / pl_source_image_info, with the message in
 * pl_last_errmsg() of the calling thread.  Thread-safe (sources are).
 */
PL_API int pl_reply_encode(pl_source *const *sources, int64_t n_sources,
                           const pl_read *reads, int64_t n, void *buf,
                           size_t cap, size_t *len);

/*
 * pl_reply_encode, and the time it spends on each source: source_ns, when
 * not NULL, holds n_sources counters (int64 nanoseconds, CLOCK_MONOTONIC of
 * the calling thread's work, so CPU time while nothing blocks) to which the
 * call adds the time of each source's token reads and image decodes: how a
 * process that hosts several sources splits its CPU over them (the Ray
 * deployment's source loaders, whose cost per source sizes the pools).  The
 * clock is read where consecutive reads change source and around each
 * image, not per row.  The sizing call (buf NULL) adds nothing; on an error
 * the counters hold what was done before it.  Otherwise as pl_reply_encode.
 */
PL_API int pl_reply_encode_timed(pl_source *const *sources, int64_t n_sources,
                                 const pl_read *reads, int64_t n, void *buf,
                                 size_t cap, size_t *len, int64_t *source_ns);

/*
 * Check a reply (magic, version, length, checksum, every table entry inside
 * the buffer) and point rows[i] and images[k] into buf (borrowed: valid
 * while buf is).  Writes at most rows_cap / images_cap entries; *n_rows and
 * *n_images receive the counts (rows/images may be NULL to learn them).
 * images[k].read is the row it belongs to.  PL_EINVAL when corrupt,
 * PL_EVERSION for another version.
 */
PL_API int pl_reply_decode(const void *buf, size_t len, pl_payload *rows,
                           int64_t rows_cap, pl_payload_image *images,
                           int64_t images_cap, int64_t *n_rows,
                           int64_t *n_images);

/* Step and DP rank of a package (checks magic, version, length, checksum). */
PL_API int pl_package_inspect(const void *buf, size_t len, int64_t *step,
                              int64_t *dp_rank);

/* =============================================================== pipeline */
/*
 * The step ledger both deployments drive (docs/internals/design.md, "One
 * pipeline, many transports").
 * It owns what is not transport:
 *
 *  - the ordered step entries: for each step its plan (owned), the state
 *    blob of its start and, for the ranks' statistics, its costs;
 *  - the served ranks, grouped: a group is a (DP rank, CP rank) pair when
 *    group_by_cp is 1 (one build per CP slice, shared by its TP and PP
 *    peers), or a DP rank when 0 (one unit per DP rank, e.g. a package that
 *    every CP/TP/PP peer of the DP rank receives);
 *  - per group a ring of work units: `unit` micro-batches of one step, built
 *    once by a driver and handed to every rank of the group;
 *  - back-pressure: a group builds the unit its slowest attached rank (one
 *    that has asked for a batch) is in and at most ceil(prefetch / unit)
 *    units beyond it, so the next unit is built while one is consumed;
 *    consumers wake drivers only when that window moves by a unit, not per
 *    micro-batch;
 *  - the lag policy, the same in every deployment: a rank that falls more
 *    than max_lag_steps steps behind the most advanced rank of its group
 *    (a rank that never asks stands at its start) is dropped from the
 *    group; the group's memory stays bounded and its peers never wait for
 *    it; if it asks later it gets PL_ELAG, alone;
 *  - the consumed cursor (least position of the ranks not dropped) and its
 *    state blob (pl_pipeline_get_state), and the statistics of
 *    `polyload run --json` (pl_pipeline_get_stats).
 *
 * A driver (the embedded loader's worker threads, or a Ray actor) asks for
 * work with pl_pipeline_get_work: PL_WORK_PLAN (supply step `step`:
 * pl_pipeline_add_step) or PL_WORK_BUILD (build a unit, then
 * pl_pipeline_complete).  Consumers take units with pl_pipeline_next.
 * Every wait takes a deadline in milliseconds (< 0: none; 0: do not wait)
 * and returns PL_ETIMEDOUT when it passes.
 *
 * Thread safety: every function may be called from any thread, concurrently,
 * except pl_pipeline_reset and pl_pipeline_free (no other call may overlap
 * them) and calls of pl_pipeline_next for the same rank.  Errors are
 * returned per call; a message goes to the caller's buffer (err, errcap;
 * err may be NULL), never to a shared one.
 */
typedef struct pl_pipeline pl_pipeline;

/* Frees a unit's item (called once per completed item, outside the
 * pipeline's lock, from the thread that released it). */
typedef void (*pl_item_release_fn)(void *item, void *ctx);

typedef struct pl_pipeline_options {
    int version;            /* PL_PIPELINE_OPTIONS_VERSION */
    const int64_t *ranks;   /* global ranks served; NULL = all */
    int64_t n_ranks;
    int group_by_cp;        /* see above */
    int64_t unit;           /* micro-batches per unit, 1 .. micro-batches per
                               rank (larger: the whole step); 0 = 1 */
    int64_t prefetch;       /* micro-batches per group; 0 = config's */
    int64_t max_lag_steps;  /* 0 = config's `max_lag_steps` */
    pl_item_release_fn release; /* NULL: items are not freed */
    void *release_ctx;
    /* Called under the pipeline's lock by pl_pipeline_next for the item and
     * index it returns, so that the consumer holds its own reference (the
     * pipeline may release the unit as soon as it unlocks, e.g. when the lag
     * policy drops the rank); NULL: the item is borrowed as documented. */
    void (*retain)(void *item, int64_t index, void *ctx);
} pl_pipeline_options;
#define PL_PIPELINE_OPTIONS_VERSION 1

/* Create a pipeline for cfg (copied); it touches no file.  It stands at step
 * 0 until pl_pipeline_reset.  *out is set even on failure (NULL-safe free).
 * PL_ERANGE for a rank outside the topology, PL_EINVAL for bad options. */
PL_API int pl_pipeline_create(const pl_config *cfg,
                              const pl_pipeline_options *opts,
                              pl_pipeline **out);
PL_API void pl_pipeline_free(pl_pipeline *p);
/* The message of a failed create (per handle; only create writes it). */
PL_API const char *pl_pipeline_errmsg(const pl_pipeline *p);

/* Drop every entry, unit and failure and stand at the position of `blob`
 * (a state blob for this config; the blob of its step's start is kept for
 * pl_pipeline_get_state).  Statistics restart.  PL_ESTATE when the blob is
 * corrupt, or its cursor is outside the step; on error nothing changes. */
PL_API int pl_pipeline_reset(pl_pipeline *p, const void *blob, size_t len,
                             char *err, size_t errcap);

enum { PL_WORK_PLAN = 1, PL_WORK_BUILD = 2 };
typedef struct pl_work {
    int kind;                /* PL_WORK_PLAN or PL_WORK_BUILD */
    int64_t step;
    /* PL_WORK_BUILD: */
    int64_t unit;            /* the unit's number (give it back to complete) */
    int64_t group;
    int64_t dp_rank, cp_rank;
    int64_t micro_batch;     /* first micro-batch of the unit */
    int64_t n_micro_batches;
    const pl_plan *plan;     /* borrowed until pl_pipeline_complete */
    void *aux;               /* the step's aux (pl_pipeline_add_step) */
    const void *blob;        /* the step's state blob, borrowed as plan */
    size_t blob_len;
    uint64_t generation;     /* pl_pipeline_reset count when handed out: a
                                unit completed after a reset is dropped */
} pl_work;

/*
 * Work for a driver, of the kinds in `kinds` (PL_WORK_* bits): the group
 * furthest behind that may build gets its next unit; a step is asked for
 * (once) when a group may build a unit of a step not yet added.  Returns
 * PL_OK, PL_DONE (no work will come: every step up to train_steps is built
 * or, for kinds == PL_WORK_PLAN, added), PL_ETIMEDOUT, PL_ECLOSED (closed or
 * failed).  A unit of a step that failed is not handed out: it fails.
 */
PL_API int pl_pipeline_get_work(pl_pipeline *p, unsigned kinds,
                                int64_t timeout_ms, pl_work *work);

/*
 * Supply the step asked for by a PL_WORK_PLAN: its plan (ownership passes
 * to the pipeline, even on error; NULL for the step train_steps, which only
 * carries the final state), the state blob of its start (copied), and an aux
 * pointer handed to the builders of its units (freed with aux_free, may be
 * NULL, when the step retires).  PL_EINVAL when `step` was not asked for.
 * pl_pipeline_fail_step instead marks the step failed with status and
 * message (the planner's or the transport's error): the ranks that reach it
 * get them.
 */
PL_API int pl_pipeline_add_step(pl_pipeline *p, int64_t step, pl_plan *plan,
                                const void *blob, size_t blob_len, void *aux,
                                void (*aux_free)(void *));
PL_API int pl_pipeline_fail_step(pl_pipeline *p, int64_t step, int status,
                                 const char *message);

/*
 * Finish a PL_WORK_BUILD unit.  status PL_OK: `item` (owned by the pipeline
 * from now, freed with options.release) and, for the statistics, tokens[i]
 * and padding[i] of its n_micro_batches micro-batches.  Else the unit
 * failed with `message`; the rank that reaches it gets the error.
 */
PL_API int pl_pipeline_complete(pl_pipeline *p, const pl_work *work, int status,
                                const char *message, void *item,
                                const int64_t *tokens, const int64_t *padding);

typedef struct pl_pipeline_item {
    void *item;              /* the unit's item: borrowed until the next
                                pl_pipeline_next for this rank, or reset */
    int64_t step;
    int64_t micro_batch;     /* first micro-batch taken */
    int64_t count;           /* micro-batches taken (the cursor moved by it) */
    int64_t index;           /* micro_batch - the unit's first micro-batch */
    int64_t group;
    uint32_t fields;         /* PL_FIELD_* the rank receives */
} pl_pipeline_item;

/*
 * The unit holding rank `rank`'s next micro-batch: blocks until it is built.
 * Takes up to max_count (>= 1) micro-batches of that unit and moves the
 * rank's cursor by out->count.  PL_OK, PL_DONE after train_steps,
 * PL_ETIMEDOUT, PL_ERANGE (rank not served), PL_ELAG (dropped by the lag
 * policy; the message names the rank, its position, the group's lead and
 * the limit), or the error of the unit or of its step: each rank whose
 * cursor reaches a failed unit gets its status and message once (TP, PP and
 * CP peers sharing the unit all get it at the same micro-batch), its later
 * calls PL_ECLOSED; the pipeline has then failed: units built before the
 * failure are still served, and a rank whose next unit is not built gets
 * PL_ECLOSED (with the same message; the status itself if no rank got it
 * yet), until pl_pipeline_reset.
 */
PL_API int pl_pipeline_next(pl_pipeline *p, int64_t rank, int64_t max_count,
                            int64_t timeout_ms, pl_pipeline_item *out,
                            char *err, size_t errcap);

/* The state after the micro-batches consumed so far by the served ranks that
 * were not dropped (the least advanced of them), as pl_loader_get_state
 * (cap/len convention).  PL_ETIMEDOUT when timeout passes before the blob of
 * that step is added. */
PL_API int pl_pipeline_get_state(pl_pipeline *p, int64_t timeout_ms, void *buf,
                                 size_t cap, size_t *len, char *err,
                                 size_t errcap);

/*
 * States shipped on demand.  A transport may add steps without their blobs
 * (blob NULL in pl_pipeline_add_step, a package encoded without a state):
 * the blob of a step's start then comes only when pl_pipeline_get_state or
 * pl_pipeline_get_stats need it.  pl_pipeline_position gives the consumed
 * position (step, micro-batch within it) and whether the blob of that step's
 * start is held; pl_pipeline_attach_state gives the pipeline that blob (the
 * planner's pl_planner_get_state at the step's start, micro-batch cursor 0;
 * the step is read from the blob): kept with the step's entry, or until the
 * entry arrives; a blob already held is kept and the new one dropped.
 * PL_ESTATE for a corrupt blob, one not at a step's start, or of another dp.
 * Without the blob, get_state and get_stats return PL_ESTATE at once.
 */
PL_API int pl_pipeline_position(pl_pipeline *p, int64_t *step,
                                int64_t *micro_batch, int *have_blob);
PL_API int pl_pipeline_attach_state(pl_pipeline *p, const void *blob,
                                    size_t len, char *err, size_t errcap);

/* As pl_loader_get_stats.  stats->sources points into `sources`, caller
 * owned, with room for cap entries (the config's number of sources; fewer:
 * only the first cap are filled); names are borrowed from the pipeline's
 * config.  The per-source counters are those of the state blob of the
 * consumed position's step: waits (timeout_ms) until that step is added;
 * PL_ETIMEDOUT. */
PL_API int pl_pipeline_get_stats(pl_pipeline *p, int64_t timeout_ms,
                                 pl_loader_stats *stats,
                                 pl_source_summary *sources, int64_t cap);

/* Stop: every wait returns PL_ECLOSED. */
PL_API void pl_pipeline_close(pl_pipeline *p);
/* How many times the pipeline was reset (pl_work.generation of work handed
 * out since the last reset). */
PL_API uint64_t pl_pipeline_generation(pl_pipeline *p);
/* Memory held by the pipeline (entries, rings), in bytes, items excluded. */
PL_API size_t pl_pipeline_sizeof(const pl_pipeline *p);

/* ======================================================= external loader */
/*
 * The trainer side of a distributed deployment (options.external = 1): the
 * loader holds no source and no planner; a transport thread asks which step
 * to fetch next (pl_loader_want_step), fetches that step's package for the
 * loader's DP rank from its data constructor (pl_package_encode there) and
 * hands it over (pl_loader_push_package).  Everything else (workers,
 * prefetch, pl_loader_next, state, statistics, lag policy) is the embedded
 * loader's, so both deployments give the same batches, states and stats.
 * An external loader serves ranks of one DP rank only.
 *
 * pl_loader_want_step blocks until the loader needs a step (its prefetch
 * window has room), at most timeout_ms (< 0: no limit): PL_OK and *step,
 * PL_DONE when every step up to train_steps has been pushed, PL_ETIMEDOUT,
 * PL_ECLOSED after a failure.  Each step is returned once; push it before
 * asking for the next.  Thread-safe against pl_loader_next.
 *
 * pl_loader_push_package copies the package (pl_package_encode of a step for
 * this loader's DP rank, with the state blob of the step's start or without
 * it: see pl_loader_attach_state).
 * PL_EINVAL when it is corrupt, for another step, rank or config.
 * pl_loader_fail_step makes `step` fail with `status` and `message` (a
 * transport error): the rank that reaches it gets them from pl_loader_next.
 *
 * pl_loader_set_state makes an external loader, as an embedded one, stand
 * at a state blob's position.
 */
PL_API int pl_loader_want_step(pl_loader *loader, int64_t timeout_ms,
                               int64_t *step);
/*
 * pl_loader_want_steps is pl_loader_want_step for a transport that moves
 * several steps per wake-up (the Ray Client): it blocks as pl_loader_want_step
 * does, then returns in *first and *count the steps to push now, in order,
 * with pl_loader_push_package (or pl_loader_fail_step), without asking again:
 * from the next step up to `ahead` steps past the step the loader builds next
 * (at least one, none past train_steps; "the step built next" is the least
 * such step over the loader's groups).  Every granted step must be pushed
 * (or failed, pl_loader_fail_step) before the next call, which otherwise
 * waits (until pl_loader_stop or pl_loader_set_state).  The next call
 * returns once the steps pushed past the step built next fall to `low` or
 * fewer, so the transport wakes once per burst instead of once per step.
 * Pushed steps are held compact (packages) until built; batches do not
 * depend on ahead or low.  1 <= ahead and 0 <= low <= ahead, else
 * PL_EINVAL (ahead above 2^40 counts as 2^40).  PL_ECLOSED after
 * pl_loader_stop or a failure, or when the loader was reset meanwhile.  Not
 * to be mixed with pl_loader_want_step on one loader.  Thread-safe against
 * pl_loader_next.
 */
PL_API int pl_loader_want_steps(pl_loader *loader, int64_t timeout_ms,
                                int64_t ahead, int64_t low, int64_t *first,
                                int64_t *count);
PL_API int pl_loader_push_package(pl_loader *loader, const void *package,
                                  size_t len);
PL_API int pl_loader_fail_step(pl_loader *loader, int64_t step, int status,
                               const char *message);
/*
 * Packages without their state (pl_package_encode with state NULL, as the
 * Ray deployment ships them): pl_loader_position tells the consumed
 * position's step and micro-batch and whether the loader holds the blob of
 * that step's start; pl_loader_attach_state hands it over
 * (pl_pipeline_attach_state).  Until then pl_loader_get_state and
 * pl_loader_get_stats return PL_ESTATE.  Thread-safe.
 */
PL_API int pl_loader_position(pl_loader *loader, int64_t *step,
                              int64_t *micro_batch, int *have_blob);
PL_API int pl_loader_attach_state(pl_loader *loader, const void *blob,
                                  size_t len);
/* Wake every waiting call (pl_loader_next, pl_loader_want_step, ...) with
 * PL_ECLOSED, and make new ones return it, until pl_loader_set_state: how a
 * transport thread is stopped before pl_loader_set_state or _free. */
PL_API void pl_loader_stop(pl_loader *loader);

/* ======================================================= hosting sources */
/* Give back this process's resident pages of the source's read-only file
 * mappings (Megatron .idx and .bin, llmc/flat shards and .plidx sidecars,
 * the .plwds index, .plrec and .pllen sidecars) with
 * madvise(MADV_DONTNEED).  The mappings stay valid: a later read or lengths
 * call faults the pages it touches back in from the page cache (or the
 * file), with the same bytes.  Heap memory and in-memory indexes (anonymous
 * memory) are kept.  Meant for a source opened ahead of need (a standby
 * replica that serves no read until it takes over) or after a pass over
 * its index.  Safe to call while other threads read the source.  PL_OK;
 * PL_EINVAL for NULL; PL_EIO when madvise fails (message names the file). */
PL_API int pl_source_release_pages(pl_source *src);
/* Unload the tokenizer of a raw text source opened through a config (a
 * standby replica holds none until it takes over): its reference to the
 * process's loaded tokenizer is dropped (the tokenizer is destroyed when no
 * other source of the process holds the same file) and free heap pages go
 * back to the system (malloc_trim).  The next tokenization loads it again
 * from the same file, in the thread that tokenizes (a Hugging Face
 * tokenizer.json of 2 MB: tens of ms), and checks first that the file is
 * the one loaded at open (size, mtime, inode): a changed file is
 * PL_ECONFIG for the documents being tokenized, never other tokens.  Waits
 * for tokenizations in flight.  PL_OK (also for sources without a
 * tokenizer, and when already released); PL_EINVAL for NULL or a tokenizer
 * given to pl_source_open directly (it cannot be built again). */
PL_API int pl_source_release_tokenizer(pl_source *src);
/* Tokenize the raw text of every source of this process on `threads`
 * (1..256) shared threads, or (0, the default) on the threads that need the
 * tokens: the sources' tokenizer_threads and the callers of
 * pl_source_lengths / pl_source_read.  With a pool those threads hand each
 * batch (parse, encode_batch, building the kept ids), and the loading of
 * tokenizers, to the pool thread of the source's tokenizer file (always the
 * same one: the hash of the path picks it) and wait.  Tokens are the same
 * either way.  Meant for a process that hosts many sources for others (a
 * Ray source loader actor sets it to the CPUs it requested, at least 1): a tokenizer used
 * from one thread keeps a smaller heap than from several
 * (docs/internals/decisions/0005-one-tokenizer-thread-per-file.md).  The
 * threads live as long as the process; a smaller count
 * leaves the others idle.  PL_OK; PL_EINVAL for a count outside 0..256;
 * PL_ENOMEM when a thread cannot start.  Thread-safe. */
PL_API int pl_set_tokenize_threads(int threads);
/* The count last set (0: no limit). */
PL_API int pl_tokenize_threads(void);
/* The tokenizer of a raw text source opened through a config: 1 loaded, 0
 * released, -1 none (not a raw text source, or a tokenizer given to
 * pl_source_open).  *loads (may be NULL): loads asked so far (1 at open,
 * plus one per load after a release); *shared_by (may be NULL): sources of
 * the process using the same loaded tokenizer (same tokenizer settings and
 * file), 0 when released.  Thread-safe. */
PL_API int pl_source_tokenizer_state(const pl_source *src, int64_t *loads,
                                     int64_t *shared_by);

/*
 * Lengths-only sources: where the planner runs in another process than the
 * source loaders (the Ray deployment), a raw text source can be opened with
 * pl_source_options.lengths_fn instead of a tokenizer.  The lookahead then
 * asks lengths_fn for the lengths of the documents it would tokenize, a
 * batch at a time, from the source's threads: lengths_fn fills lengths[i]
 * (a length, or a negative PL_E* code for a bad document, with an optional
 * malloc'd message in messages[i] that the library frees) and returns 0, or
 * a negative code with a message in err for the whole call.  Such a source
 * reads no tokens (pl_source_read*: PL_EINVAL).  Through a config:
 * pl_config_set_lengths_provider, called with the source's config index.
 */
PL_API void pl_config_set_lengths_provider(pl_config *cfg, pl_lengths_fn fn,
                                           void *ctx);

/* CPU time, in nanoseconds, that the threads tokenizing this source's
 * documents spent on them so far: reading each record's text, parsing it
 * (JSON), the tokenizer's encode_batch and building the kept ids, measured
 * per batch with CLOCK_THREAD_CPUTIME_ID on the thread that does the batch
 * (a tokenize pool thread, a tokenizer thread or a reader that took a queued
 * document over).  Work a tokenizer hands to threads of its own (Hugging
 * Face tokenizers with TOKENIZERS_PARALLELISM on) is not counted.  Grows
 * monotonically; thread-safe (an atomic counter).  0 for token sources and
 * for lengths-provider sources.  The cost model's tokenizing CPU per source
 * (the Ray source loaders' profile "tokenize_cpu_s"). */
PL_API int64_t pl_source_tokenize_cpu_ns(const pl_source *src);

/* ============================================================== bindings */
/*
 * One config shared by a binding's config object and the objects made from
 * it.  pl_loader_create, pl_planner_create, pl_pipeline_create and
 * pl_constructor_create copy their config; after pl_config_freeze(cfg) they
 * hold cfg itself instead (one more reference each, dropped by their free),
 * so a config of many sources is kept once.  A frozen config must not be
 * changed (pl_config_set, pl_config_set_world_size, the factory setters):
 * pl_config_unshare first.  The owner still frees cfg with pl_config_free;
 * it is freed when its last holder lets go.  Freezing twice is a no-op.
 *
 * pl_config_unshare makes *cfg writable again, copy on write: a frozen
 * config that no object holds any more is thawed in place; one still held
 * is replaced by a private deep copy and the caller's hold of it given up
 * (pl_config_free).  A config that is not frozen is left as it is.  PL_OK,
 * or PL_ENOMEM with *cfg unchanged.
 *
 * Neither may overlap another call that changes cfg or creates an object
 * from it; holders may free theirs meanwhile (the count is atomic).
 */
PL_API void pl_config_freeze(pl_config *cfg);
PL_API int pl_config_unshare(pl_config **cfg);

/* ======================================================= state utilities */
/* The same blob with another micro-batch cursor and dp (CRC resealed): the
 * position `micro_batch` micro-batches into the blob's step.  Writes len
 * bytes to out (cap >= len; out may be blob itself); *out_len receives len
 * (out may be NULL to learn it).  The cursor is not range-checked here
 * (pl_loader_set_state does that against a config); PL_EINVAL for a
 * negative cursor or dp <= 0. */
PL_API int pl_state_retarget(const void *blob, size_t len, int64_t micro_batch,
                             int64_t dp, void *out, size_t cap, size_t *out_len);

/*
 * A compact copy of a state blob, for keeping the blobs of many steps (the
 * Ray planner keeps one per step that a rank may still stand at): "PLSZ",
 * u64 length of the blob, then the blob as one zlib stream (RFC 1950,
 * level 1; source names and paths and unchanged counters compress about
 * 10-20x).  pl_state_pack checks the blob first (PL_ESTATE, PL_EVERSION);
 * pl_state_unpack refuses a corrupt or truncated copy or one that does not
 * unpack to a valid blob (PL_ESTATE).  Both follow the cap/len convention
 * (buf NULL: *out_len receives the size needed; pl_state_pack's is an upper
 * bound, the written size comes with buf).  Thread-safe.
 */
PL_API int pl_state_pack(const void *blob, size_t len, void *buf, size_t cap,
                         size_t *out_len);
PL_API int pl_state_unpack(const void *packed, size_t len, void *buf,
                           size_t cap, size_t *out_len);

#ifdef __cplusplus
}
#endif
#endif /* POLYLOAD_EXPERIMENTAL_H */
