/*
 * polyload.h -- the one public header of libpolyload.
 *
 * polyload is a data loader for training large models on many data sources at
 * once.  It reads tokenized documents from sources (Megatron indexed datasets,
 * llm.c shards, flat token files), mixes them by a schedule of weights, shuffles
 * each source with a keyed bijection, packs documents into sequences and builds
 * micro-batches in the THD ("packed") layout with cu_seqlens.
 *
 * This is the stable API of a trainer: errors, dtypes, config, sources, the
 * embedded loader, batches and state blobs.  Its declarations change only by
 * the rules below (new codes and fields appended, a changed meaning gets a
 * _v2).  The roles taken one by one (planner, data constructor, pipeline),
 * the wire messages between them and what the Ray deployment and the tools
 * use besides are declared in polyload_experimental.h, which may change
 * between versions.  Nothing else is exported.
 * Definitions (document, chunk, step membership, arrangement, mixture, state)
 * follow docs/reference/spec.md; the section numbers below refer to it.
 *
 * Conventions (as zstd, SQLite and libuv):
 *   - Functions return int: 0 (PL_OK) on success, PL_DONE (a positive, non-error
 *     status) at the end of data, a negative PL_E* code on error.  Results go
 *     through out-parameters.
 *   - Handles are opaque, created by pl_<noun>_create/open/parse and released by
 *     pl_<noun>_free; free(NULL) is a no-op.  Creation functions set *out to a
 *     handle even when they fail (unless memory ran out), so that
 *     pl_<noun>_errmsg(*out) can tell the whole story; the caller frees it.
 *   - Error messages: every failed call also leaves its message in a
 *     thread-local buffer, pl_last_errmsg(), so threads that share a handle
 *     (a loader, a source) each read the story of their own call.  The
 *     per-handle pl_<noun>_errmsg holds the last message of any thread.
 *   - Structs the library fills (statistics) start with a `size` field set
 *     by the caller to sizeof the struct it was compiled with; option
 *     structs start with a `version`.  Fields are only appended, so an older
 *     caller keeps working with a newer library.
 *   - Batches: a `const pl_batch *` is borrowed (valid as the function that
 *     returned it says); a `pl_batch *` is an owned reference, given back
 *     with pl_batch_release.  Plans (pl_plan, polyload_experimental.h) are
 *     read-only views made by the library (pl_planner_next, pl_plan_decode)
 *     and owned by the caller (pl_plan_free).
 *   - The library never prints, exits or aborts.  It is C11 and uses POSIX
 *     threads, mmap and pread.
 *   - Counts and offsets are int64_t; tokens are counted in tokens, memory in
 *     bytes.
 */
#ifndef POLYLOAD_H
#define POLYLOAD_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------- export */
#if defined(PL_STATIC_DEFINE)
#define PL_API
#elif defined(_WIN32)
#define PL_API __declspec(dllexport)
#else
#define PL_API __attribute__((visibility("default")))
#endif

/* --------------------------------------------------------------- version */
#define PL_VERSION_MAJOR 0
#define PL_VERSION_MINOR 1
#define PL_VERSION_PATCH 0
#define PL_VERSION_NUMBER \
    (PL_VERSION_MAJOR * 10000 + PL_VERSION_MINOR * 100 + PL_VERSION_PATCH)

/* The library's version number, to check against PL_VERSION_NUMBER of the
 * header a program was compiled with. */
PL_API int pl_version_number(void);
/* The library's version as "MAJOR.MINOR.PATCH"; static storage. */
PL_API const char *pl_version_string(void);

/* ---------------------------------------------------------------- status */
/*
 * X(name, value, description).  Values are never renumbered; new codes are
 * appended.  PL_OK and PL_DONE are not errors.
 */
#define PL_STATUS_MAP(X)                                                       \
    X(OK, 0, "success")                                                        \
    X(DONE, 1, "end of data")                                                  \
    X(EINVAL, -1, "invalid argument")                                          \
    X(ENOMEM, -2, "out of memory")                                             \
    X(EIO, -3, "input/output error")                                           \
    X(ENOENT, -4, "no such file")                                              \
    X(ECONFIG, -5, "invalid configuration")                                    \
    X(ESTATE, -6, "state does not match the configuration or is corrupt")      \
    X(EMAGIC, -7, "bad magic number")                                          \
    X(EVERSION, -8, "unsupported format version")                              \
    X(EDTYPE, -9, "unknown dtype code")                                        \
    X(ECOUNT, -10, "counts in a header do not add up to the file size")        \
    X(EBOUNDS, -11, "pointer or length past the end of the data file")         \
    X(ETRUNC, -12, "truncated file")                                           \
    X(EDOCIDX, -13, "document index does not end at the sequence count")       \
    X(ERANGE, -14, "index or rank out of range")                               \
    X(ETOPOLOGY, -15, "invalid topology")                                      \
    X(ERECORD, -16, "malformed record")                                        \
    X(ECLOSED, -17, "handle is closed or failed earlier")                     \
    X(ETIMEDOUT, -18, "a wait passed its deadline")                            \
    X(ELAG, -19, "rank fell further behind its group than the lag limit")      \
    X(EIMAGE, -20, "image cannot be decoded, or is larger than the limit")

typedef enum pl_status {
#define PL__STATUS_ENUM(name, value, desc) PL_##name = value,
    PL_STATUS_MAP(PL__STATUS_ENUM)
#undef PL__STATUS_ENUM
} pl_status;

/* The longest message the library writes, in bytes with its NUL: a buffer of
 * PL_ERRMSG_MAX bytes holds any of them whole (err/errcap arguments,
 * pl_last_errmsg, the handles' errmsg). */
#define PL_ERRMSG_MAX 512

/* The message of the calling thread's most recent failed call into the
 * library ("" when none), naming file, record and offset where there are
 * any.  Thread-local storage: valid until that thread's next failed call;
 * never NULL. */
PL_API const char *pl_last_errmsg(void);

/* A static description of a status code ("bad magic number"). Never NULL. */
PL_API const char *pl_strerror(int status);
/* The status code's name without prefix ("EMAGIC"). Never NULL. */
PL_API const char *pl_err_name(int status);

/* ---------------------------------------------------------------- dtypes */
/*
 * Token dtypes.  The values 1..8 are megatron-core's DType codes as stored in
 * the .idx header (megatron/core/datasets/indexed_dataset.py), so a code read
 * from a file is a pl_dtype.
 */
typedef enum pl_dtype {
    PL_DTYPE_UINT8 = 1,
    PL_DTYPE_INT8 = 2,
    PL_DTYPE_INT16 = 3,
    PL_DTYPE_INT32 = 4,
    PL_DTYPE_INT64 = 5,
    PL_DTYPE_FLOAT64 = 6,
    PL_DTYPE_FLOAT32 = 7,
    PL_DTYPE_UINT16 = 8,
    PL_DTYPE_UINT32 = 9 /* not a Megatron code: llm.c v2 shards, flat files */
} pl_dtype;

/* Size in bytes of one element of a dtype; 0 for an unknown code. */
PL_API size_t pl_dtype_size(int dtype);
/* Lower-case numpy name ("uint16"); "unknown" for an unknown code. */
PL_API const char *pl_dtype_name(int dtype);

/* =============================================================== sources */
/*
 * A source is one dataset made of one or more files, read through mmap.
 * Documents of a multi-file source are numbered across its files in sorted
 * path order.  Opening reads headers and maps indices; it does not read whole
 * files and allocates no per-document arrays.
 *
 * Types (SPEC section 5):
 *   PL_SOURCE_MEGATRON  <prefix>.idx + <prefix>.bin, megatron-core's
 *                       MMapIndexedDataset format version 1 ("MMIDIDX\0\0",
 *                       u64 version, u8 dtype code, u64 sequence count,
 *                       u64 document-index count, i32 lengths[], i64
 *                       pointers[], i64 document_indices[]).  A document is one
 *                       sequence, as GPTDataset treats it.  path is a prefix,
 *                       a directory (every *.idx in it) or a glob of prefixes.
 *   PL_SOURCE_LLMC      llm.c token shards: 256 x int32 header (magic 20240520
 *                       with uint16 tokens, or 20240801 with uint32 tokens;
 *                       version 1; token count), then the tokens.  llm.c puts
 *                       the end-of-text token (eos_id, default 50256) *before*
 *                       each document, so a document starts at each eos_id.
 *   PL_SOURCE_FLAT      a raw uint16/uint32 token array (OLMo/Dolma style);
 *                       a document ends with (and includes) each eos_id.
 *   PL_SOURCE_WEBDATASET  WebDataset tar shards (see "image-text sources"
 *                       below): a document is one sample, an image and its
 *                       caption, as tokens: the image placeholder token
 *                       repeated for the image's visual-token count, then
 *                       the caption's tokens (then eos_id if given).
 *
 * llmc and flat files get a sidecar document index "<file>.plidx" (magic
 * "PLIDX\0\0\0", version, the file's size and mtime, eos_id, document count,
 * u64 document end offsets in tokens).  Opening maps a sidecar that matches
 * its data file; one that is missing or stale is built in anonymous memory
 * and, by policy (pl_source_options.write_index), written next to the file
 * by one writer (see PL_INDEX_*).
 *
 * Thread safety: after open, every function that takes a const pl_source* or
 * reads documents is safe to call from many threads at once.  errmsg reports
 * the last error of any thread; pl_last_errmsg that of the calling thread.
 */
typedef struct pl_source pl_source;

typedef enum pl_source_type {
    PL_SOURCE_MEGATRON = 1,
    PL_SOURCE_LLMC = 2,
    PL_SOURCE_FLAT = 3,
    PL_SOURCE_JSONL = 4, /* raw text, tokenized online: see "raw text" below */
    PL_SOURCE_TEXT = 5,
    PL_SOURCE_WEBDATASET = 6, /* image-text: see below */
    PL_SOURCE_PARQUET = 7     /* raw text in a Parquet string column: "raw text" */
} pl_source_type;

typedef struct pl_tokenizer pl_tokenizer; /* defined under "raw text" below */
/* Lengths of raw text documents computed elsewhere (see "raw text" below). */
typedef int (*pl_lengths_fn)(void *ctx, int64_t source, int64_t n,
                             const int64_t *index, int64_t *lengths,
                             char **messages, char *err, size_t errcap);

/*
 * Image-text sources (PL_SOURCE_WEBDATASET).  path: a shard, a directory of
 * *.tar, a glob, and brace patterns ("shard-{000000..000099}.tar", zero
 * padding kept; "{a,b}"), expanded before globbing.  A sample is a run of
 * consecutive tar members sharing a key (the name up to the first '.' of its
 * last path component, as webdataset groups them); its image is the member
 * with extension jpg/jpeg/png/webp, its caption the member `caption_key`
 * names: "txt" (UTF-8 text) or "json:FIELD" (a JSON object's string field,
 * tokenized, or array of token ids, taken as they are).  Other members are
 * ignored.
 *
 * Captions are tokenized when the index is built, by the tokenizer of this
 * module: each UTF-8 byte b becomes token caption_token_offset + b (ByT5's
 * byte tokens).  A caption stored as token ids ("json:FIELD" holding an
 * array) needs no tokenizer: that is the path for a model's own tokenizer.
 *
 * Index: "<shard>.plwds" (magic "PLWDS\0\0\0", version 1, the shard's size
 * and mtime, a hash of the options that shape it, counts, CRC-32; then one
 * 48-byte record per sample: offsets of the image's tar header and data, its
 * size, width and height read from its header (no pixel decoded), format,
 * caption token count and first token; then the caption tokens as u32),
 * written next to the shard once (write_index 1) or kept in memory only
 * (write_index -1, or a read-only directory).
 *
 * Visual tokens of a sample, from the index alone:
 *   fixed   (size/patch_size)^2 / merge_size^2 (LLaVA-1.5: 336/14 -> 576)
 *   native  the Qwen2-VL grid: (rh/p) * (rw/p) / merge^2 with (rh, rw) =
 *           smart_resize(h, w, p * merge, min_pixels, max_pixels)
 */
typedef enum pl_image_mode {
    PL_IMAGE_FIXED = 1,  /* pixel_values [n_images, 3, size, size] uint8 */
    PL_IMAGE_NATIVE = 2  /* patches [total_patches, 3*p*p] + image_grid_thw */
} pl_image_mode;

typedef struct pl_image_options {
    pl_image_mode mode;        /* 0: PL_IMAGE_FIXED */
    int64_t size;              /* fixed: side in pixels (0: 336) */
    int64_t patch_size;        /* 0: 14 */
    int64_t merge_size;        /* 0: 1 (fixed), 2 (native) */
    int64_t min_pixels;        /* native; 0: 56*56 (Qwen2-VL's default) */
    int64_t max_pixels;        /* native; 0: 28*28*1280 */
    int64_t token_id;          /* the image placeholder token; required (>= 0) */
    int64_t limit_pixels;      /* refuse images whose header promises more
                                  pixels (0: 1 << 27, 128 Mpx); PL_EIMAGE */
    int64_t caption_token_offset; /* byte tokens: offset + byte (0: 0) */
    char caption_key[64];      /* "" means "txt" */
} pl_image_options;

typedef struct pl_source_options {
    int version;          /* set to PL_SOURCE_OPTIONS_VERSION */
    pl_source_type type;  /* required */
    const char *path;     /* required; see the types above */
    const char *name;     /* optional; used in messages. Default: path */
    pl_dtype token_dtype; /* flat only: PL_DTYPE_UINT16 (default) or UINT32 */
    int64_t eos_id;       /* llmc/flat; -1 = default (llmc 50256, flat 0) */
    int write_index;      /* llmc/flat: a PL_INDEX_* policy (1 is read as
                             PL_INDEX_WRITE; webdataset: PL_INDEX_MEMORY keeps
                             the .plwds index in memory; jsonl/text: 1
                             writes the .plrec record sidecar, 0 and -1 keep
                             record offsets in memory only) */
    /* Version 2: */
    const pl_image_options *image; /* webdataset: required; copied at open */
    /* jsonl/text (ignored by the other types): */
    const char *text_key;       /* jsonl: the document's key; NULL = "text" */
    const pl_tokenizer *tokenizer; /* required for jsonl/text; copied, and its
                                      ctx owned by the source from then on
                                      (destroyed by pl_source_free, or on a
                                      failed open) */
    int add_eos;                /* 1: append eos_id to every document */
    int tokenizer_threads;      /* lookahead threads; 0 = 1 */
    int64_t lookahead;          /* documents tokenized ahead; 0 = 512 */
    int64_t max_record_bytes;   /* longer records are PL_ERECORD; 0 = 100 MiB */
    int64_t cache_bytes;        /* tokens kept for readers; 0 = 256 MiB */
    pl_lengths_fn lengths_fn;   /* non-NULL: a lengths-only source (below);
                                   tokenizer is then not used */
    void *lengths_ctx;
    int64_t lengths_source;     /* passed to lengths_fn as `source` */
    /* Version 3: instruction data (jsonl; see "instruction data" below). */
    const char *prompt_key;     /* both non-NULL: each record is a prompt and */
    const char *response_key;   /* a response (text_key is then not used) */
    const char *messages_key;   /* non-NULL (and no prompt_key): a chat list */
    const char *chat_template[3]; /* system, user, assistant: each holds
                                     "{content}" once (messages_key) */
    /* jsonl/text: the length cache (see "length cache" below). */
    uint64_t length_cache_key;  /* fingerprint of what decides the lengths;
                                   0: no length cache */
    int length_cache;           /* a PL_INDEX_* policy for <file>.pllen */
    /* version >= 4.  webdataset: 1 decodes every image in full when the
     * index is built (config key image.verify), so a corrupt or truncated
     * body is found then (PL_EIMAGE naming shard, member and offset; left
     * out and counted under skip_damaged) instead of when a batch needs it.
     * About one decode per image, once per index. */
    int verify_images;
    /* Version 5: the node-local cache of remote paths (s3://, https://;
     * every type).  NULL / 0: $POLYLOAD_CACHE_DIR or ~/.cache/polyload,
     * 16 GiB, 1 MiB chunks. */
    const char *cache_dir;
    int64_t cache_max_bytes;
    int64_t cache_chunk_bytes;
} pl_source_options;

/*
 * Sidecar policies (llmc and flat sources; config key `sidecar_index`):
 *   PL_INDEX_WRITE   map a matching .plidx; a missing or stale one is built
 *                    and written by one process at a time: it holds
 *                    flock(LOCK_EX) on the data file while it scans, writes
 *                    a temporary file and renames it into place; processes
 *                    that wait on the lock map the new sidecar instead of
 *                    scanning.  The default.
 *   PL_INDEX_READ    map a matching .plidx, never write one (without one the
 *                    index is built in memory); `polyload inspect` opens so.
 *   PL_INDEX_MEMORY  never read or write a sidecar; the index lives in
 *                    anonymous memory of this process.
 * `polyload index CONFIG` writes the sidecars of a config's sources as an
 * explicit preparation step.  A read-only directory keeps the index in memory
 * under any policy.
 */
enum {
    PL_INDEX_WRITE = 0,
    PL_INDEX_READ = 2,
    PL_INDEX_MEMORY = -1
};
#define PL_SOURCE_OPTIONS_VERSION 5

/*
 * Open a source.  On success returns PL_OK.  On error returns PL_ENOENT (no
 * file matched), PL_EIO, or a format error (PL_EMAGIC, PL_EVERSION,
 * PL_EDTYPE, PL_ECOUNT, PL_ETRUNC, PL_EDOCIDX, PL_EBOUNDS) and *out still holds
 * a handle whose pl_source_errmsg names the file, the field and the byte
 * offset.  The caller frees *out in both cases.
 */
PL_API int pl_source_open(const pl_source_options *opts, pl_source **out);
PL_API void pl_source_free(pl_source *src);

/* The last error message of this handle; "" when none. Valid until the next
 * call on the handle.  Where several threads use one handle, another thread's
 * failure may rewrite it while it is read: a thread reads its own message
 * with pl_last_errmsg() (lengths_fn callbacks, which run on the source's
 * threads, among them). */
PL_API const char *pl_source_errmsg(const pl_source *src);
PL_API const char *pl_source_name(const pl_source *src);
PL_API pl_source_type pl_source_get_type(const pl_source *src);
PL_API pl_dtype pl_source_token_dtype(const pl_source *src);
PL_API int64_t pl_source_num_documents(const pl_source *src);
PL_API int64_t pl_source_num_files(const pl_source *src);
/* Records left out at open: with on_error: skip (sources opened through a
 * config), a Megatron file whose trailing records point past the end of its
 * .bin (a truncated .bin) opens without them instead of failing with
 * PL_ETRUNC; they are not documents of the source (num_documents excludes
 * them) and are counted here.  0 for pl_source_open, which refuses such
 * files. */
PL_API int64_t pl_source_num_skipped(const pl_source *src);
/* The CPUs this process may run on: the CPUs of its affinity mask
 * (sched_getaffinity), capped by its cgroup's CPU quota (cgroup v2
 * `cpu.max`, or v1 `cpu.cfs_quota_us`, of its cgroup and the ones above it,
 * rounded up to whole CPUs), at least 1.  Not the machine's count: a
 * container, a `taskset` or a Slurm step gets its own.  `threads: auto`
 * (the default) runs this many builder threads less one for the planner and
 * the consumer (at least 1).  Read anew on each call.  Thread-safe. */
PL_API int pl_cpus_available(void);
/* Heap bytes held by the handle, excluding mapped file pages. */
PL_API size_t pl_source_sizeof(const pl_source *src);

/*
 * Length in tokens of document `index` (0 <= index < num_documents).
 * Validates that the document lies inside its data file: PL_EBOUNDS names the
 * file, the record and the byte offset.  PL_ERANGE for a bad index.
 */
PL_API int pl_source_document_length(pl_source *src, int64_t index,
                                     int64_t *length);

/*
 * Copy tokens [offset, offset + count) of document `index` into `out`, which
 * has room for `count` elements of `out_dtype` (PL_DTYPE_INT64 or
 * PL_DTYPE_INT32).  Float token files are truncated toward zero.
 * Errors: PL_ERANGE (index, or range past the document), PL_EBOUNDS, PL_EINVAL,
 * PL_ETRUNC (the data file or its index shrank since open: checked with
 * fstat, a size seen within the last 10 ms is trusted) and PL_EIO (beyond
 * the descriptor budget, the file was replaced since open), naming the file
 * and offset.  pl_source_document_length and pl_source_get_stats check the
 * index file the same way.
 *
 * Descriptors: a source keeps one descriptor per data file (.bin, llm.c
 * shard, flat file) and one per index file (.idx, .plidx) from open to
 * pl_source_free, so files replaced by rename(2) during a run are still
 * read from the files that were opened.
 * All sources of a process together keep at most half of RLIMIT_NOFILE's
 * soft limit (as read at the first open); beyond that a data file is
 * reopened by path per read and refused if it is not the opened file.
 */
PL_API int pl_source_read(pl_source *src, int64_t index, int64_t offset,
                          int64_t count, void *out, pl_dtype out_dtype);

/* Whole-source statistics, as `polyload inspect` prints them.  Scans every
 * document length (reads the index, not the tokens).  Set out->size to
 * sizeof(pl_source_stats) (PL_EINVAL for a size smaller than the first
 * version's); fields beyond it are not written. */
typedef struct pl_source_stats {
    size_t size;
    int64_t files;
    int64_t documents;
    int64_t tokens;
    int64_t length_p50, length_p90, length_p99, length_max;
} pl_source_stats;
PL_API int pl_source_get_stats(pl_source *src, pl_source_stats *out);

/*
 * The image of sample `index` of a webdataset source, from the index only
 * (no decode): the stored width and height; the size it is resized to
 * (fixed: size x size; native: smart_resize's); grid_t/h/w in patches
 * (grid_t 1); patches = grid_t*grid_h*grid_w; tokens = patches / merge^2,
 * the image's visual tokens in the document; bytes = the size of its pixel
 * output (pl_source_read_image).  PL_EINVAL for a source of another type,
 * PL_ERANGE for a bad index.  Thread-safe.
 */
typedef struct pl_image_info {
    int64_t width, height;          /* as stored */
    int64_t out_width, out_height;  /* after resizing */
    int64_t grid_t, grid_h, grid_w; /* in patches (image_grid_thw) */
    int64_t patches;
    int64_t tokens;
    int64_t patch_dim;              /* 3 * patch_size^2 */
    size_t bytes;
    pl_image_mode mode;
} pl_image_info;
PL_API int pl_source_image_info(pl_source *src, int64_t index,
                                pl_image_info *out);

/*
 * Decode and resize the image of sample `index` into out (cap bytes, at
 * least info.bytes): fixed mode [3, size, size] uint8 (CHW, RGB; the shorter
 * side resized to size with bicubic filtering, the centre cropped, as CLIP's
 * processor does); native mode [patches, 3*p*p] uint8 in Qwen2-VL's patch
 * order (transformers' Qwen2VLImageProcessor.patchify without the temporal
 * repeat: each row is [channel, y, x] of one patch; rows grouped by
 * merge_size x merge_size blocks).  Normalization is left to the trainer.
 * Errors: PL_EIMAGE (corrupt, truncated or too large image), PL_ETRUNC /
 * PL_EIO (the shard changed), with a message naming shard, member and byte
 * offset.  Thread-safe (decoder state is per call).
 */
PL_API int pl_source_read_image(pl_source *src, int64_t index, void *out,
                                size_t cap, pl_image_info *info);
/* Images of a webdataset source opened with on_error: skip that failed to
 * decode (PL_EIMAGE: a corrupt or truncated body) when a batch was built and
 * were replaced by a blank (all-zero) image of the same size, their sample
 * kept with loss_mask 0 on all its tokens.  The replacement depends only on
 * the bytes of the shard, so batches stay the same run to run; this counter
 * counts decodes (a prefetched batch too).  0 for other sources. */
PL_API int64_t pl_source_num_images_replaced(const pl_source *src);

/* Width and height of an image from its header bytes (no decode); format
 * is guessed from the signature (JPEG, PNG, WebP).  PL_EIMAGE for anything
 * else, PL_ETRUNC when len is too short for the header.  The fuzz target of
 * the image headers.  err/errcap may be NULL/0. */
PL_API int pl_image_probe(const void *data, size_t len, int64_t *width,
                          int64_t *height, char *err, size_t errcap);

/* Qwen2-VL's smart_resize (transformers' image_processing_qwen2_vl.py): the
 * size (*out_h, *out_w), both multiples of factor (patch_size * merge_size),
 * with area in [min_pixels, max_pixels] and the aspect ratio of (h, w) kept
 * as closely as possible (round half to even, as Python's round).
 * PL_EIMAGE for an aspect ratio above 200, PL_EINVAL for sizes <= 0. */
PL_API int pl_image_smart_resize(int64_t h, int64_t w, int64_t factor,
                                 int64_t min_pixels, int64_t max_pixels,
                                 int64_t *out_h, int64_t *out_w);
/* ============================================================== raw text */
/*
 * Raw text sources, tokenized online (PL_SOURCE_JSONL, PL_SOURCE_TEXT).
 *
 *   PL_SOURCE_JSONL  one JSON object per line (RFC 8259, parsed by Jansson);
 *                    the document is the string under text_key.  Files are
 *                    plain, gzip (".gz", zlib) or Zstandard (".zst", libzstd).
 *                    Lines holding only whitespace are not records.
 *   PL_SOURCE_TEXT   one document per file, UTF-8.
 *   PL_SOURCE_PARQUET  one document per row of the string column text_key
 *                    (a top-level BYTE_ARRAY column of logical type String)
 *                    of each Parquet file, read by Apache Arrow's C++ Parquet
 *                    library where the library was built with it (CMake takes
 *                    libarrow/libparquet from the pyarrow wheel); else
 *                    PL_ECONFIG "parquet support not built".  Opening reads
 *                    the footers only: the row groups' row counts number the
 *                    records (no sidecar).  A row group is decoded when one of
 *                    its rows is first parsed and kept for the others (at most
 *                    1 GiB of decoded text per source, least recently used
 *                    dropped).  A file that is not Parquet, truncated (no
 *                    footer: PL_ETRUNC), with a corrupt footer or without the
 *                    column (or a non-string one) is PL_ERECORD at open naming
 *                    it; with skip_damaged (on_error: skip) it is left out and
 *                    counted as one in pl_source_num_skipped.  A row group that
 *                    cannot be decoded, a null, "" or invalid UTF-8 are
 *                    PL_ERECORD for that row, naming the file, the row, its row
 *                    group and the column chunk's byte offset.
 *
 * Document i is record i of the source's files in sorted path order, as for
 * the token formats.  Opening finds the records and tokenizes nothing: a
 * plain file is scanned for newlines with memchr (about 1 s per 10 GB when
 * cached), a compressed file is decompressed once into anonymous memory
 * while its records are found (it then costs its decompressed size in
 * memory; random access into a gzip or zstd stream needs the decoder's
 * state).  With write_index 1 the record offsets of a plain file are kept in
 * a sidecar "<file>.plrec" (magic "PLREC\0\0\0", version 1, the file's size
 * and mtime, record count, u64 [start, end) byte pairs), written once and
 * mapped by later opens; a stale or damaged sidecar is ignored and rebuilt.
 * The default writes nothing next to the data.
 *
 * Lengths are not stored, so the source tokenizes: the planner tells it the
 * order in which it will ask (the source's shuffle), and tokenizer_threads
 * threads tokenize the next `lookahead` documents of that order in batches
 * of at most 64 documents or 256 KiB (pl_tokenizer.encode_batch; the window
 * opens gradually, 16 documents and two more per document drawn, so the
 * first step waits only for its own), keeping their tokens until they are read
 * (pl_source_read, pl_source_read_many, pl_source_read_raw; at most
 * cache_bytes of them, oldest dropped first).  A document is tokenized once
 * unless it was dropped before being read (counted by
 * pl_source_num_tokenized).  Lengths and tokens are those of the tokenizer,
 * so plans stay a pure function of (config, seed, step): thread counts and
 * timing change when, never what.  A document's tokens are the tokenizer's
 * ids, plus eos_id when add_eos is set; the token dtype is int32.
 *
 * Bad records: a line that is not a JSON object, a missing or non-string
 * text_key, invalid UTF-8, an empty document, a record over
 * max_record_bytes are PL_ERECORD from pl_source_document_length (and the
 * reads) with a message naming the file, the line and its byte offset.  With
 * on_error: skip the planner skips such a document and counts it, the same
 * on every rank.  A truncated or corrupt .gz/.zst is PL_ETRUNC / PL_ERECORD
 * at open naming the file and the compressed byte offset; with on_error:
 * skip (sources opened through a config) the complete records before the
 * damage are kept and the partial one is counted by pl_source_num_skipped.
 *
 * Instruction data (SFT): a jsonl source with prompt_key and response_key
 * (config keys of the same names) reads two strings from each record.  They
 * are tokenized separately (as NeMo's GPTSFTDataset does: no BPE merge
 * crosses the boundary) and the document is prompt ids, response ids, then
 * eos_id when add_eos is set.  The batch gives loss only on the response:
 * labels[t] is -100 and loss_mask[t] 0 where the token at t + 1 (the label)
 * is a prompt token, so the last prompt position predicts the first response
 * token, and the response's eos is predicted as well.  The prompt may be ""
 * (an empty string), the response may not; a missing or non-string key is
 * PL_ERECORD naming the key, the file, the line and its byte offset.  The
 * document packs, splits and truncates like any other.
 * Chat data: with messages_key instead, the record's list of
 * {"role": "system" | "user" | "assistant", "content": string} messages is
 * rendered with chat_template (one string per role, "{content}" marking
 * where the content goes, e.g. ChatML's "<|im_start|>user\n{content}<|im_end|>\n"):
 * each template piece and each content is tokenized on its own, and the
 * tokens trained on are an assistant message's content and the template
 * text after it (its end-of-turn marker), as TRL's assistant_only_loss
 * does; the eos is trained when the last message is an assistant's.  A
 * record with no assistant content, a message of another role or without
 * string content is PL_ERECORD naming the message.
 * pl_source_read gives the plain ids; pl_source_read_many and
 * pl_source_read_raw, the forms that travel to a data constructor, give a
 * token not trained on as -1 - id (negative), which pl_constructor_build
 * and packages turn back into the id and the mask; no id of a tokenizer is
 * negative, so the form is unambiguous.
 *
 * Length cache: with length_cache_key non-zero, the tokenized lengths of a
 * plain or compressed jsonl/text file are kept in a sidecar
 * "<file>.pllen" (a 56-byte header: magic "PLLEN\0\0\0", u32 version 1,
 * u32 CRC-32 of the lengths, u64 size and mtime (ns) of the data file,
 * u64 record count, u64 key, u32 CRC-32 of the first 48 bytes; then one
 * int64 per record, -1 where the length is not known).  A sidecar whose
 * header does not match the file, its record count, the key or its lengths
 * is ignored.  A document whose tokens turn out to differ in number from its
 * cached length is PL_EDOCIDX at its read, naming the sidecar (never a
 * silently shortened document).
 * Opening maps a matching one; the planner's length queries
 * (pl_source_document_length, pl_source_lengths, the lookahead's waits) are
 * then answered from it without tokenizing, and the lookahead still
 * tokenizes ahead for the reads.  Lengths learned by tokenizing are written
 * (a temporary file renamed into place, merged with what the sidecar held)
 * when every document of the source is known and at pl_source_free, under
 * length_cache = PL_INDEX_WRITE; PL_INDEX_READ only maps; PL_INDEX_MEMORY
 * neither.  A read-only directory keeps them in memory.  Bad records are
 * never cached (their message needs the record).  The key must change with
 * anything that changes a length: through a config it hashes the tokenizer
 * type, the bytes of its file, add_eos, eos_id, text_key / prompt_key /
 * response_key (config key `index` of the source, else `sidecar_index`, is
 * the policy).  The cache is a shortcut only: lengths are the tokenizer's
 * either way.
 */

/*
 * A tokenizer, as a table of functions (grow-only, versioned).  The library
 * calls encode_batch from the source's tokenizer threads, several at once
 * when tokenizer_threads > 1, so it must be thread-safe; the Python package
 * plugs in Hugging Face `tokenizers` this way (holding the GIL only around
 * the call), C and C++ libraries plug in natively.
 *
 * encode_batch: tokenize n texts; texts[i] is lens[i] bytes of valid UTF-8
 * (not NUL-terminated), borrowed for the call.  It sets ids[i] to a
 * malloc(3)'d array of counts[i] token ids (the library frees it with
 * free(3); NULL is allowed when counts[i] is 0) and returns 0, or a negative
 * PL_E* code with a message in err (then no ids[i] is kept: the callee frees
 * what it allocated).  Special tokens of the tokenizer are not added (as
 * Hugging Face's add_special_tokens=False); add_eos is the source's job.
 * destroy: release ctx (may be NULL); called once, by pl_source_free.
 */
typedef struct pl_tokenizer {
    int version; /* PL_TOKENIZER_VERSION */
    void *ctx;
    int (*encode_batch)(void *ctx, int64_t n, const char *const *texts,
                        const size_t *lens, int32_t **ids, int64_t *counts,
                        char *err, size_t errcap);
    void (*destroy)(void *ctx);
    int64_t eos_id;     /* end-of-document id, -1 when it has none */
    int64_t vocab_size; /* 0 when unknown */
    const char *name;   /* for messages, e.g. "hf:tokenizer.json"; borrowed
                           for the life of ctx */
} pl_tokenizer;
#define PL_TOKENIZER_VERSION 1

/*
 * The built-in byte tokenizer: every byte of the UTF-8 text is one token
 * (0..255), eos_id 256, vocab_size 257.  It needs no file; config
 * `tokenizer: {type: bytes}`.  Thread-safe.
 */
PL_API void pl_tokenizer_bytes(pl_tokenizer *out);

/*
 * `tokenizer: {type: sentencepiece, path: MODEL}` is built in where the
 * library was compiled with libsentencepiece (CMake finds it; the C++ shim
 * src/source/tokenizer/spm.cc): SentencePieceProcessor::Encode, eos_id and vocab
 * size from the model.
 *
 * What the config's `tokenizer` settings turn into a pl_tokenizer for types
 * the library does not build in ("hf", "tiktoken", "sentencepiece" without
 * libsentencepiece): the
 * host (the Python package, or a C program linking a tokenizer library)
 * registers a factory on the config (copied into loaders made from it).
 * It fills *out and returns 0, or a negative PL_E* code with a message.
 * Sources opened through configs share loaded tokenizers: the factory is
 * called once per distinct (type, path, pat_str, encoding, backend, factory,
 * ctx, file identity) in a process while a source holds it, and the tokenizer
 * it made is called from the threads of every source naming that file (it
 * is thread-safe already); the last source to let go destroys it.
 */
typedef struct pl_config pl_config; /* see "config" below */
typedef int (*pl_tokenizer_factory)(void *ctx, const char *type,
                                    const char *path, pl_tokenizer *out,
                                    char *err, size_t errcap);
PL_API void pl_config_set_tokenizer_factory(pl_config *cfg,
                                            pl_tokenizer_factory fn,
                                            void *ctx);

/*
 * The same with every setting of the `tokenizer` mapping: type ("hf",
 * "tiktoken", "sentencepiece"), path, and for tiktoken pat_str (the
 * pre-tokenizer regex) or encoding (a published encoding's name, whose
 * pattern and special tokens apply); NULL where not given.  The strings are
 * borrowed for the call.  Setting one kind of factory clears the other.
 */
typedef struct pl_tokenizer_spec {
    int version; /* PL_TOKENIZER_SPEC_VERSION */
    const char *type;
    const char *path;
    const char *pat_str;
    const char *encoding;
    /* version 2: the library that encodes the file (config `backend`), or
     * NULL for the host's choice ("auto"). */
    const char *backend;
} pl_tokenizer_spec;
#define PL_TOKENIZER_SPEC_VERSION 2
typedef int (*pl_tokenizer_spec_factory)(void *ctx, const pl_tokenizer_spec *spec,
                                         pl_tokenizer *out, char *err, size_t errcap);
PL_API void pl_config_set_tokenizer_factory_spec(pl_config *cfg,
                                                 pl_tokenizer_spec_factory fn,
                                                 void *ctx);

/*
 * Lengths of many documents at once: lengths[i] is the length of document
 * index[i], or a negative PL_E* code when that document is bad (its message:
 * pl_source_document_length of it).  A raw text source tokenizes the ones it
 * does not hold in batches on the calling thread and keeps their tokens for
 * the reads, as the lookahead does.  Returns 0, or an error that is not one
 * document's (PL_EINVAL, PL_ERANGE for an index out of range, PL_ENOMEM).
 */
PL_API int pl_source_lengths(pl_source *src, const int64_t *index, int64_t n,
                             int64_t *lengths);

/* Documents tokenized so far (lookahead and reads together); equal to the
 * documents used when none was tokenized twice.  0 for token sources. */
PL_API int64_t pl_source_num_tokenized(const pl_source *src);

/* ================================================================ config */
/*
 * A parsed configuration (SPEC section 5).  Unknown keys, wrong types, values
 * out of range, weights summing to zero, a global_batch_size not divisible by
 * dp * micro_batch_size, and a pad_id or eos_id outside the vocabulary (when
 * the optional key vocab_size gives it) are PL_ECONFIG errors whose message
 * names the key (and the line of the YAML file).  Parsing touches no file:
 * source paths are expanded and checked when a source opens
 * (pl_config_open_source: PL_ECONFIG naming the source, its path and line,
 * when the path matches nothing).  Relative source paths are taken relative
 * to the current directory of the process that opens them.
 * Limits of the implementation, also PL_ECONFIG: YAML text above 64 MiB or
 * nested deeper than 32 mappings/lists (refused before libyaml builds the
 * document); seq_length, global_batch_size and the world size above 2^24;
 * train_steps above 2^40, or train_steps * global_batch_size /
 * micro_batch_size above 2^50 (micro-batch counters never overflow).
 *
 * topology.order may leave out axes of size 1 (as Megatron's RankGenerator
 * fills them in); leaving out an axis of size > 1 is PL_ETOPOLOGY.
 * topology.dp may be `auto`: dp is then 1 until pl_config_set_world_size
 * sets it from the trainer's world size.
 *
 * A pl_config is immutable after parsing except through pl_config_set; it may
 * be shared by several loaders (read-only) from many threads.
 */
typedef struct pl_config pl_config;

/* Parse a YAML file (libyaml).  *out is set even on failure (see above). */
PL_API int pl_config_parse_file(const char *path, pl_config **out);
/* Parse YAML text of `len` bytes.  `origin` names it in messages (may be NULL). */
PL_API int pl_config_parse_string(const char *yaml, size_t len,
                                  const char *origin, pl_config **out);
PL_API void pl_config_free(pl_config *cfg);
PL_API const char *pl_config_errmsg(const pl_config *cfg);

/*
 * Override one top-level scalar key with a value written as in YAML, e.g.
 * ("threads", "4"), ("train_steps", "10"), ("topology.dp", "2"),
 * ("balance", "greedy").  Re-validates; PL_ECONFIG on a bad key or value.
 */
PL_API int pl_config_set(pl_config *cfg, const char *key, const char *value);

/* Read a scalar key as an integer (e.g. "seq_length", "topology.dp"; enum
 * keys such as "packing" give their code; "vocab_size" is 0 when not set).
 * Derived keys: "world_size", "num_sources", "micro_batches_per_rank",
 * "num_warnings", "topology.dp_auto" (1 while dp: auto waits for
 * pl_config_set_world_size), "image_sources" (webdataset sources: their
 * images travel in pl_reply_encode replies in a deployment).  PL_EINVAL for
 * an unknown key. */
PL_API int pl_config_get_int(const pl_config *cfg, const char *key,
                             int64_t *out);
/* A 64-bit hash of every setting that decides the batches (all keys except
 * threads, prefetch, max_lag_steps, sidecar_index and vocab_size, which
 * only checks pad_id), so that
 * processes can check they share a config. */
PL_API uint64_t pl_config_fingerprint(const pl_config *cfg);
/* Open source i of the config (type, path, token_dtype, eos_id as the config
 * gives them), as pl_source_open: *out is set even on failure.  PL_ERANGE
 * for a bad i. */
PL_API int pl_config_open_source(const pl_config *cfg, int64_t i,
                                 pl_source **out);
/*
 * Warnings: what the parse accepted but may not be what was meant, one full
 * sentence each with origin and line ("mix.yaml:9: weights of sources sum to
 * 1.5, not 1: they are normalized to web 0.6667, code 0.3333").  Reported:
 * source weights (or a schedule point's weights) that do not sum to 1, a
 * schedule point that leaves sources out (their weight there is 0), source
 * weights that a schedule overrides, seq_length left at its default.  The
 * library never prints them; the CLI prints them to stderr and the Python
 * package issues them as warnings.  They belong to the parse: pl_config_set
 * neither adds nor clears them.  pl_config_warning returns NULL for i outside
 * [0, pl_config_num_warnings); the string lives as long as cfg.
 */
PL_API int64_t pl_config_num_warnings(const pl_config *cfg);
PL_API const char *pl_config_warning(const pl_config *cfg, int64_t i);

/*
 * Fit the topology to the trainer's world size (torch.distributed's, or
 * $WORLD_SIZE).  With topology.dp: auto, sets dp = world_size / (pp*cp*tp)
 * (PL_ECONFIG when it does not divide, or when global_batch_size is then not
 * divisible by dp * micro_batch_size; the config is left unchanged).
 * Otherwise checks that dp*pp*cp*tp equals world_size: PL_ECONFIG naming both
 * numbers if not.  PL_EINVAL for world_size < 1.  Not thread-safe (it may
 * change cfg, as pl_config_set).
 */
PL_API int pl_config_set_world_size(pl_config *cfg, int64_t world_size);

/*
 * Validation and test data.  `split: 969,30,1` (top level, or per source to
 * override it) cuts each source's documents into train, valid and test
 * ranges, in index order, as megatron-core's --split does: the fractions are
 * normalized and document ranges are [round(lo * n), round(hi * n)) of the
 * cumulative fractions (round half to even).  Training reads only the train
 * range (the state blob's document count is that range's).  `valid_sources:`
 * and `test_sources:` (lists like `sources`, without `split`) replace the
 * split for their part, read whole (megatron-core's blend_per_split).
 *
 * pl_config_split makes *out, a new config for one evaluation pass over
 * PL_SPLIT_VALID or PL_SPLIT_TEST: the split's sources (those with a positive
 * weight, or under a schedule a positive weight at some point), each
 * document of the split read once, in index order within a source, mixed by
 * the same largest-deficit rule and packed by the config's packing into
 * steps of global_batch_size sequences; the last step may hold empty
 * (all-padding) rows, and the pass ends there (pl_loader_next returns
 * PL_DONE).  train_steps of *out is unset (-1, the whole pass); set it with
 * pl_config_set to stop after N steps.  A loader created from *out is
 * independent of any training loader: the pass is the same on every rank and
 * every time, whatever the training position.  Returns PL_OK, PL_EINVAL (bad
 * arguments, or cfg is itself a split's), PL_ENOMEM, or PL_ECONFIG when cfg
 * has no data for that split (*out then holds the message; free it).  The
 * caller frees *out with pl_config_free.
 */
typedef enum pl_split {
    PL_SPLIT_TRAIN = 0,
    PL_SPLIT_VALID = 1,
    PL_SPLIT_TEST = 2
} pl_split;
PL_API int pl_config_split(const pl_config *cfg, int split, pl_config **out);

/* Number of sources, and the name/path/type of source i. */
PL_API int64_t pl_config_num_sources(const pl_config *cfg);
PL_API const char *pl_config_source_name(const pl_config *cfg, int64_t i);
PL_API const char *pl_config_source_path(const pl_config *cfg, int64_t i);
/* The (normalized) weight of source i at `step` from weights or schedule. */
PL_API double pl_config_source_weight(const pl_config *cfg, int64_t i,
                                      int64_t step);

/*
 * The config keys, one table (docs/reference/config.md is generated from
 * it).  pl_config_key_info fills *row for key i of [0, pl_config_key_count());
 * set row->size = sizeof *row first (fields may be added at the end).
 * Returns PL_OK, PL_ERANGE for i out of range, PL_EINVAL for a NULL row or a
 * size too small.  The strings are static.  Thread-safe.
 */
typedef struct pl_config_key_row {
    size_t size;               /* set by the caller: sizeof(pl_config_key_row) */
    const char *name;          /* dotted: "topology.dp"; a source entry's keys
                                  "sources[].weight", a tokenizer's
                                  "tokenizer.type" */
    const char *type;          /* "integer", "integer or null", "integer or
                                  auto", "unsigned integer", "number", "one
                                  of", "boolean", "string", "fractions",
                                  "source type", "list" or "mapping" */
    const char *default_value; /* as written in YAML; NULL: unset */
    int64_t min, max;          /* integer keys: the inclusive range; else 0 */
    const char *const *values; /* "one of", "source type": the names,
                                  NULL-terminated; else NULL */
    int settable;              /* 1: pl_config_set and pl_config_get take it */
    const char *doc;           /* one line */
} pl_config_key_row;
PL_API int64_t pl_config_key_count(void);
PL_API int pl_config_key_info(int64_t i, pl_config_key_row *row);
/*
 * The value of a settable key as YAML writes it ("8192", "best_fit",
 * "0.5", "auto", or "null" while unset) into buf[cap], NUL-terminated;
 * pl_config_set(cfg, key, buf) sets the same value back (not "null", which
 * only train_steps takes; cost.preset also resets a, b and c).  PL_EINVAL
 * for an unknown or not settable key, PL_ERANGE when cap is too small.
 * Thread-safe on a config that is not being set.
 */
PL_API int pl_config_get(const pl_config *cfg, const char *key, char *buf,
                         size_t cap);

/*
 * Source types by name, as a config's `type:` writes them ("megatron",
 * "llmc", "flat", "jsonl", "text", "webdataset", "parquet").
 * pl_source_type_name returns NULL and pl_source_type_from_name 0 for an
 * unknown one.  pl_source_type_info describes a type (set row->size first):
 * PL_ERANGE for an unknown type (types are 1, 2, ... without gaps).
 * Thread-safe; the strings are static.
 */
typedef struct pl_source_type_row {
    size_t size;         /* set by the caller: sizeof(pl_source_type_row) */
    pl_source_type type;
    const char *name;
    int raw_text;        /* 1: raw text, tokenized online (needs a tokenizer) */
    const char *index;   /* what `polyload index` leaves for such a source */
    const char *doc;     /* one line */
} pl_source_type_row;
PL_API const char *pl_source_type_name(pl_source_type type);
PL_API pl_source_type pl_source_type_from_name(const char *name);
PL_API int pl_source_type_info(pl_source_type type, pl_source_type_row *row);

/* ============================================================== topology */
/*
 * A rank's place in a DP x PP x CP x TP topology (SPEC section 2).  Ranks are
 * numbered as Megatron's RankGenerator numbers them for `order` (leftmost
 * letter varies fastest).  `fields` is the set of batch fields the rank
 * receives (PL_FIELD_* bits).
 */
enum {
    PL_FIELD_INPUT_IDS = 1u << 0,
    PL_FIELD_LABELS = 1u << 1,
    PL_FIELD_LOSS_MASK = 1u << 2,
    PL_FIELD_POSITION_IDS = 1u << 3,
    PL_FIELD_CU_SEQLENS = 1u << 4,
    PL_FIELD_MAX_SEQLEN = 1u << 5,
    PL_FIELD_ALL = 0x3f
};

typedef struct pl_rank_info {
    int64_t rank;
    int64_t dp_rank, pp_rank, cp_rank, tp_rank;
    uint32_t fields;
} pl_rank_info;

/* World size and the role of global rank `rank` under cfg's topology. */
PL_API int64_t pl_config_world_size(const pl_config *cfg);
PL_API int pl_config_rank_info(const pl_config *cfg, int64_t rank,
                               pl_rank_info *out);

/* =============================================================== batches */
/*
 * One micro-batch in the layout of SPEC section 3, for one DP rank.
 * Arrays are C-contiguous.  Fields the rank does not receive (see
 * pl_rank_info.fields) are NULL.
 *
 *   input_ids     [rows, cols] int64 (int32 if config dtype: int32)
 *   labels        [rows, cols] same dtype; -100 where loss_mask is 0
 *   loss_mask     [rows, cols] float32
 *   position_ids  [rows, cols] int64; restart at 0 at each segment
 *   cu_seqlens    [n_cu_seqlens] int32, n_cu_seqlens = segments + 1, over the
 *                 flattened rows*cols tokens; a row's trailing padding is a
 *                 segment of its own.  Under CP (cols = seq_length / cp) they
 *                 are offsets over this CP rank's own tokens, i.e. the global
 *                 padded offsets divided by cp: Transformer Engine's THD
 *                 attention (cu_seqlens_q_padded) wants cp times these
 *   max_seqlen    the longest segment (of this CP rank's tokens; cp times it
 *                 globally)
 *
 * A batch returned by pl_loader_next is borrowed (`const pl_batch *`): it
 * stays valid until the next pl_loader_next for the same rank, or
 * pl_loader_free, and its memory may be shared with the other served ranks
 * of its (DP, CP) group: never write to it.  To keep it longer take an owned
 * reference with pl_batch_retain and give it back with pl_batch_release
 * (thread-safe reference counting; the memory returns to the loader's pool
 * at the last release, even after pl_loader_free).  pl_constructor_build
 * returns an owned reference (`pl_batch *`).
 */
typedef struct pl_batch {
    int64_t step;
    int64_t micro_batch;  /* 0 .. micro_batches_per_rank-1 */
    int64_t dp_rank;
    int64_t rows;         /* micro_batch_size */
    int64_t cols;         /* seq_length / cp */
    pl_dtype dtype;       /* of input_ids and labels */
    uint32_t fields;      /* PL_FIELD_* present */
    void *input_ids;
    void *labels;
    float *loss_mask;
    int64_t *position_ids;
    int32_t *cu_seqlens;
    int64_t n_cu_seqlens;
    int64_t max_seqlen;
    int64_t tokens;       /* non-padding tokens */
    int64_t n_chunks;     /* chunks (segments that are not padding) */
    /* Where each segment of cu_seqlens comes from: [n_cu_seqlens - 1] int32,
       the config index of the source of segment k (pl_config_source_name),
       -1 for a row's trailing padding; NULL when cu_seqlens is.  With `step`
       and `micro_batch` it lets a trainer log loss per source. */
    int32_t *segment_sources;
    /* Images of webdataset sources (present with input_ids; else 0/NULL).
     * image_mode PL_IMAGE_FIXED: pixel_values [n_images, 3, H, W] uint8;
     * PL_IMAGE_NATIVE: pixel_values [n_patches, patch_dim] uint8.  One
     * micro-batch holds images of one mode (the config checks it).
     * image_grid_thw [n_images, 3] int64 (t, h, w in patches; fixed: 1,
     * H/p, W/p).  image_positions [n_images, 2] int64: the flattened offset
     * in input_ids ([rows*cols]) of the image's first placeholder token and
     * the count of them (its visual tokens). */
    int32_t image_mode;
    int32_t image_reserved;
    int64_t n_images;
    int64_t n_patches;    /* native: rows of pixel_values; fixed: 0 */
    int64_t image_height, image_width, patch_dim;
    uint8_t *pixel_values;
    int64_t *image_grid_thw;
    int64_t *image_positions;
    int64_t visual_tokens; /* sum of image_positions[:, 1] */
    /* Loss tokens (loss_mask 1) of the whole step, over every DP rank and
     * micro-batch, and of this DP rank's micro-batches of the step (all CP
     * ranks together); the same in every micro-batch of the step.  The
     * per-token mean loss of the step, exact when ranks carry unequal
     * tokens (balance: variable_length), is the sum over the step's
     * micro-batches (not divided by their number) of each one's summed
     * token loss divided by step_loss_tokens; where the gradients are then
     * averaged over the DP ranks (DDP), multiply each term by the DP size.
     * Both are -1 when the step holds a chunk whose mask depends on its
     * tokens (instruction data, images): count loss_mask over the step's
     * micro-batches and all-reduce it instead. */
    int64_t step_loss_tokens;
    int64_t rank_loss_tokens;
} pl_batch;

/* A new owned reference to `batch` (the same pointer, for
 * pl_batch_release); NULL for NULL. */
PL_API pl_batch *pl_batch_retain(const pl_batch *batch);
/* Give back an owned reference; NULL is a no-op. */
PL_API void pl_batch_release(pl_batch *batch);

/* =========================================================== state blobs */
/*
 * Read-only accessors of a state blob (SPEC section 4; pl_loader_get_state,
 * pl_pipeline_get_state, pl_planner_get_state), so that callers never parse
 * its bytes.  Each checks magic, version, length and CRC-32 first:
 * PL_ESTATE for a corrupt blob, PL_EVERSION for a blob of another format
 * version (versions 1 to 4 are read; this library writes 3, and 4 inside a
 * balance_window window).  Thread-safe; they allocate nothing.
 */
typedef struct pl_state_info {
    uint32_t version;          /* format version of the blob (1 to 4) */
    uint64_t seed;
    int64_t step;              /* the step the position is in */
    int64_t micro_batch;       /* micro-batch cursor within that step */
    int64_t dp;                /* DP size the blob was saved with */
    int64_t seq_length, global_batch_size, micro_batch_size, cp;
    int64_t n_sources;         /* source records (see pl_state_source) */
    int64_t carried_chunks;    /* chunks carried into `step` */
} pl_state_info;
PL_API int pl_state_inspect(const void *blob, size_t len, pl_state_info *out);

/* Counters of source record i (0 .. n_sources-1, in the blob's order, which
 * is the config's order of the run that saved it).  name and path point
 * into the blob (not NUL-terminated; valid while the blob is).  PL_ERANGE
 * for a bad i. */
typedef struct pl_state_source_info {
    const char *name;
    size_t name_len;
    const char *path;
    size_t path_len;
    int64_t num_documents;     /* documents of the source when saved */
    int64_t epoch;             /* epochs completed */
    int64_t drawn_in_epoch;    /* documents taken in the current epoch */
    int64_t current_document;  /* document being chunked, -1 if none */
    int64_t current_offset;    /* its tokens already drawn */
    int64_t current_length;
    int64_t drawn_tokens;      /* tokens drawn, all epochs */
    double target_tokens;      /* the mixture's target for drawn_tokens (a
                                  version-3 blob holds it exactly, a multiple
                                  of 2^-48 token; this is within one unit in
                                  the last place of it) */
    int64_t documents;         /* documents started, all epochs */
    int64_t skipped;           /* bad documents skipped (on_error: skip) */
} pl_state_source_info;
PL_API int pl_state_source(const void *blob, size_t len, int64_t i,
                           pl_state_source_info *out);

/* ================================================================ loader */
/*
 * The embedded loader: sources, planner and data constructor in one process,
 * with worker threads and a bounded prefetch queue per served rank
 * (docs/internals/design.md, "Roles").  Batches are a pure function of
 * (config, seed, step, rank): thread count and prefetch depth never change
 * them.
 *
 * Thread safety: pl_loader_next (for different ranks), pl_loader_get_state,
 * pl_loader_get_stats, pl_loader_want_step, pl_loader_push_package,
 * pl_loader_fail_step and pl_loader_stop may be called concurrently; calls
 * of pl_loader_next for the same rank must not overlap, nor may
 * pl_loader_set_state and pl_loader_free overlap any other call.  The
 * message of a failed call is in pl_last_errmsg() of the calling thread;
 * pl_loader_errmsg holds the last one of any thread (read it only when no
 * other call can fail meanwhile).
 */
typedef struct pl_loader pl_loader;

typedef struct pl_loader_options {
    int version;           /* PL_LOADER_OPTIONS_VERSION (1 is still read:
                              the fields after `prefetch` are then 0) */
    const int64_t *ranks;  /* global ranks served; NULL = all */
    int64_t n_ranks;
    int threads;           /* worker threads; 0 = config's `threads` */
    int prefetch;          /* micro-batches per rank; 0 = config's */
    /* version 2: */
    int external;          /* 1: no sources and no planner in this process;
                              steps arrive as packages (pl_loader_push_package)
                              from a data constructor elsewhere (the trainer
                              side of a distributed deployment; its calls are
                              in polyload_experimental.h) */
    int64_t unit;          /* micro-batches a worker builds per hand-off
                              (within one step); 0 = automatic */
    int64_t max_lag_steps; /* lag policy (pl_pipeline_options); 0 = config's */
} pl_loader_options;
#define PL_LOADER_OPTIONS_VERSION 2

/*
 * Create a loader from a config (copied; cfg may be freed afterwards).
 * opts may be NULL.  Opens every source; format errors are reported here.
 * *out is set even on failure (see the conventions above).
 */
PL_API int pl_loader_create(const pl_config *cfg,
                            const pl_loader_options *opts, pl_loader **out);
PL_API void pl_loader_free(pl_loader *loader);
PL_API const char *pl_loader_errmsg(const pl_loader *loader);

/*
 * The next micro-batch for global rank `rank` (one of the served ranks;
 * PL_ERANGE otherwise).  Blocks until it is built.  Returns PL_OK, PL_DONE
 * after train_steps, or an error: a rank whose next micro-batch failed (its
 * worker's build, or the planner's step) gets its code and message once (TP,
 * PP and CP peers that share the batch each get it at the same micro-batch,
 * as from a loader of their own); the loader has then failed: batches built
 * before the failure are still returned, other calls (other ranks' waiting
 * calls too) return PL_ECLOSED until a successful pl_loader_set_state.
 * With on_error: skip, a bad document is skipped and
 * counted instead.  A rank may run ahead of the other ranks of its DP group
 * (e.g. one thread serving TP peers in turn): the batches the lagging ranks
 * have not taken are kept, up to the lag policy (pl_pipeline): a rank more
 * than max_lag_steps steps behind the most advanced rank of its group (a
 * rank that never asks stands at its start) is dropped, so memory stays
 * bounded and nothing blocks; its own later calls return PL_ELAG.  The
 * state (pl_loader_get_state) is then that of the ranks not dropped.
 */
PL_API int pl_loader_next(pl_loader *loader, int64_t rank,
                          const pl_batch **out);

/*
 * The loader's state (SPEC section 4): the position after the batches
 * consumed so far (not the prefetched ones).  Writes at most `cap` bytes
 * to buf; *len receives the size (call with buf NULL to learn it).  When the
 * served ranks stand at different positions, the state is that of the
 * least advanced one.
 */
PL_API int pl_loader_get_state(pl_loader *loader, void *buf, size_t cap,
                               size_t *len);
/*
 * Continue from a state.  Drops prefetched batches.  PL_ESTATE when the blob
 * is corrupt or a fingerprint field (seq_length, global_batch_size,
 * micro_batch_size, packing, long_documents, seed, topology.cp, a source's
 * path or document count) differs, or a source of the blob is missing; the
 * message names the field.  Weights, schedule, dp, threads and prefetch may
 * differ, and sources may be added (dp only at a step boundary).  A
 * mid-step state with another mixture (weights, schedule or sources)
 * finishes its step as it was planned, from the weights the state records,
 * and the new mixture applies from the next step; a version-1 blob (which
 * does not record them) is PL_ESTATE there, and so is a mid-step state with
 * another balance, long_short, cost (with balancing) or max_epochs, or with
 * its sources in another order and other weights.  On error the
 * loader continues from where it was; on success a failed loader works again.
 */
PL_API int pl_loader_set_state(pl_loader *loader, const void *buf,
                               size_t len);

/* Summary of what was consumed so far (`polyload run --json`). */
typedef struct pl_source_summary {
    const char *name;
    int64_t documents;         /* documents started (first chunk drawn) */
    int64_t tokens;            /* tokens drawn */
    int64_t epochs_completed;
    int64_t skipped;           /* bad documents skipped (on_error: skip) */
    double realized_fraction;  /* drawn tokens / all drawn tokens */
    double scheduled_fraction; /* target tokens / all target tokens */
} pl_source_summary;

typedef struct pl_loader_stats {
    size_t size;            /* set by the caller: sizeof(pl_loader_stats) */
    int64_t steps;          /* complete steps consumed by every served rank */
    int64_t micro_batches;  /* pl_loader_next calls that returned a batch */
    int64_t tokens;         /* non-padding tokens of the batches taken by all
                               ranks of their group, counted once per (DP,
                               CP) group: TP/PP peers do not multiply it */
    int64_t padding_tokens; /* padding tokens, counted alike */
    int64_t skipped;
    double max_over_mean;   /* largest / mean DP-rank cost of a step, averaged
                               over the steps consumed so far (0: none yet) */
    double max_over_lower_bound; /* largest rank cost / the step's lower
                               bound (pl_plan.lower_bound), averaged alike */
    int64_t n_sources;      /* entries filled in `sources` */
    const pl_source_summary *sources; /* the caller's array (see below) */
    /* Filled when out->size covers them: */
    double data_wait_s;      /* seconds pl_loader_next calls spent blocked
                                waiting for a batch, all ranks together, the
                                first call of each rank (the pipeline filling
                                at start-up) left out */
    int64_t images_replaced; /* pl_source_num_images_replaced over the
                                loader's sources */
} pl_loader_stats;
/*
 * Statistics of what was consumed so far.  out->size must be set (PL_EINVAL
 * otherwise; a size that ends before data_wait_s, as a program built against
 * an older header passes, gets the fields it has); `sources` is caller
 * owned with room for cap entries (the
 * config's number of sources; fewer: only the first cap are filled;
 * NULL with cap 0: none); names are borrowed from the loader's config.
 * Safe to call from many threads at once, and concurrently with
 * pl_loader_next: each caller gets its own copy.
 */
PL_API int pl_loader_get_stats(pl_loader *loader, pl_loader_stats *out,
                               pl_source_summary *sources, int64_t cap);

/* The config the loader was created with (borrowed). */
PL_API const pl_config *pl_loader_config(const pl_loader *loader);

#ifdef __cplusplus
}
#endif
#endif /* POLYLOAD_H */
