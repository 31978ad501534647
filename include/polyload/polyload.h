/*
 * polyload.h -- the one public header of libpolyload.
 *
 * polyload is a data loader for training large models on many data sources at
 * once.  It reads tokenized documents from sources (Megatron indexed datasets,
 * llm.c shards, flat token files), mixes them by a schedule of weights, shuffles
 * each source with a keyed bijection, packs documents into sequences and builds
 * micro-batches in the THD ("packed") layout with cu_seqlens.
 *
 * Everything a user may call is declared here; everything else may change.
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
 *     with pl_batch_release.  Plans (pl_plan) are read-only views made by
 *     the library (pl_planner_next, pl_plan_decode) and owned by the caller
 *     (pl_plan_free).
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
 * array) needs no tokenizer: that is the path for a model's own tokenizer
 * until online text tokenization (issue 10) plugs in here.
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
    /* Version 4: the node-local cache of remote paths (s3://, https://;
     * megatron, llmc, flat).  NULL / 0: $POLYLOAD_CACHE_DIR or
     * ~/.cache/polyload, 16 GiB, 1 MiB chunks. */
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
#define PL_SOURCE_OPTIONS_VERSION 4

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
 * Ray source loader actor sets it to its CPUs, at least 2): a tokenizer used
 * from one thread keeps a smaller heap than from several
 * (docs/internals/decisions/0005-one-tokenizer-thread-per-file.md).  The
 * threads live as long as the process; a smaller count leaves the others
 * idle.  PL_OK; PL_EINVAL for a count outside 0..256; PL_ENOMEM when a thread
 * cannot start.  Thread-safe. */
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
 * called once per distinct (type, path, pat_str, encoding, factory, ctx,
 * file identity) in a process while a source holds it, and the tokenizer
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
} pl_tokenizer_spec;
#define PL_TOKENIZER_SPEC_VERSION 1
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

/* Documents tokenized so far (lookahead and reads together); equal to the
 * documents used when none was tokenized twice.  0 for token sources. */
PL_API int64_t pl_source_num_tokenized(const pl_source *src);

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
 * version (versions 1 to 3 are read; this library writes 3).  Thread-safe; they allocate nothing.
 */
typedef struct pl_state_info {
    uint32_t version;          /* format version of the blob (1 to 3) */
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
                              side of a distributed deployment) */
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
 * calls too) return PL_ECLOSED until a successful pl_loader_set_state.  With on_error: skip, a bad document is skipped and
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
} pl_loader_stats;
/*
 * Statistics of what was consumed so far.  out->size must be set (PL_EINVAL
 * otherwise); `sources` is caller owned with room for cap entries (the
 * config's number of sources; fewer: only the first cap are filled;
 * NULL with cap 0: none); names are borrowed from the loader's config.
 * Safe to call from many threads at once, and concurrently with
 * pl_loader_next: each caller gets its own copy.
 */
PL_API int pl_loader_get_stats(pl_loader *loader, pl_loader_stats *out,
                               pl_source_summary *sources, int64_t cap);

/* The config the loader was created with (borrowed). */
PL_API const pl_config *pl_loader_config(const pl_loader *loader);

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
 * pl_loader_reset makes an external loader (or an embedded one, as
 * pl_loader_set_state) stand at a state blob's position.
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

/* =============================================================== pipeline */
/*
 * The step ledger both deployments drive (docs/internals/design.md, "One
 * pipeline, many transports").  It owns what is not transport:
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
typedef struct pl_payload_image {
    int64_t read;          /* index of its read in the payload list */
    int64_t tokens;        /* N: the image's placeholder tokens */
    int64_t height, width; /* after resizing, in pixels */
    int32_t status;        /* PL_OK or a PL_E* code */
    int32_t reserved;      /* 0 */
    const void *data;
    size_t bytes;
} pl_payload_image;

/*
 * pl_package_encode with images: images[0, n_images) in increasing `read`
 * order, at most one per read.  Without images (n_images 0) the package is
 * the one pl_package_encode makes.  Package layout after the tokens: per
 * image { i64 read, i64 tokens, i64 height, i64 width, i32 status, i32 0,
 * u64 bytes }, then their data back to back.  The receiving loader checks
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
 * x { i64 row, i64 tokens, i64 height, i64 width, i32 status, i32 0, u64
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

#ifdef __cplusplus
}
#endif
#endif /* POLYLOAD_H */
