/*
 * source/text/text.c -- raw text sources (jsonl, text), tokenized online.
 *
 * Records.  Opening a file finds its records and parses none: a plain file
 * is mapped, scanned for newlines with memchr(3) and unmapped again (reads
 * go through pread(2) on the descriptor kept from open, so a file that
 * shrinks is PL_ETRUNC, never SIGBUS); a .gz or .zst file is decompressed
 * once (zlib, libzstd) into a malloc'd buffer while its records are found,
 * because neither stream can be entered in the middle without the decoder's
 * state.  Record r of a file is the byte span [spans[2r], spans[2r+1]),
 * without its newline (and a '\r' before it); lines of only blanks are not
 * records.  With write_index 1 the spans of a plain file are kept in a
 * sidecar "<file>.plrec" (see polyload.h) and mapped by later opens.
 *
 * Tokens.  The planner asks for document lengths in the order of the
 * source's shuffle and tells the source that order ahead
 * (pl__source_lookahead): the next `lookahead` documents are queued, and the
 * source's threads take them from the queue in batches (up to 64 documents
 * or 1 MiB of text), parse them (Jansson) and tokenize them with one
 * pl_tokenizer.encode_batch call.  Results live in a hash table by document
 * index, with an age list; a reader that finds its document queued takes
 * it over and tokenizes it itself, one that finds it being tokenized waits.
 * A document read up to its last token leaves the table (it has been used);
 * beyond cache_bytes the oldest finished documents leave it.  Entries being
 * waited on or still queued are never dropped.  Every path computes the same
 * tokens for a document, so timing changes only who does the work.
 *
 * Instruction data (prompt_key/response_key, or messages_key with a chat
 * template): a record is a list of texts (pl__segv), each marked trained on
 * or not, all encoded in the batch's one call and joined; the table keeps
 * the ids of texts not trained on as -1 - id (the marked form), which the
 * transport reads pass on for the constructor's mask and pl_source_read
 * turns back into ids.
 *
 * Length cache: a matching "<file>.pllen" answers the planner's length
 * queries without tokenizing; lengths learned by tokenizing are collected
 * (pl__len_learn, under the lock) and written by a tokenizer thread once
 * every document is known, and at free.  A cached length is checked against
 * the tokens when the document is tokenized.
 *
 * Parquet (type parquet, PL_WITH_PARQUET): the records of a file are the
 * rows of its string column text_key, numbered in row-group order from the
 * footer's row counts (opening reads the footer only: no sidecar is
 * needed).  A row group is decoded (parquet_shim.cc) when the first of its
 * documents is parsed, under pq_mu, and kept for its other documents; beyond
 * PL__PQ_CACHE_BYTES of decoded text the least recently used groups leave
 * memory (and are decoded again if asked).  A group that cannot be decoded
 * keeps its error: each of its rows is PL_ERECORD with it.
 *
 * Locking: one mutex per source guards the table, the queue, the lookahead
 * cursor and the learned lengths; parsing, tokenizing and writing sidecars
 * run outside it.
 */
#include "source/source.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>
#include <zlib.h>
#include <zstd.h>

#ifdef PL_WITH_PARQUET
#include "source/text/parquet_shim.h"
#endif

#define PL__REC_MAGIC "PLREC\0\0\0"
#define PL__REC_VERSION 1u
#define PL__REC_HEADER 48
#define PL__BATCH_DOCS 64
#define PL__BATCH_BYTES ((uint64_t)1 << 18)
/* Records between line-number checkpoints (a message counts at most this
 * many lines from the nearest one). */
#define PL__LINE_CK 4096
/* Decoded Parquet row groups kept per source (least recently used leave). */
#define PL__PQ_CACHE_BYTES ((int64_t)1 << 30)

/* A Parquet row group as decoded (NULL data: not in memory). */
typedef struct pl__pqgroup {
    char *data;
    uint64_t *off; /* [rows + 1] */
    uint8_t *valid; /* [rows]: 0 for a null */
    int64_t bytes;
    uint64_t last_use;
    int rc;    /* the decode's error (kept), or 0 */
    char *err;
} pl__pqgroup;

enum { PL__T_QUEUED = 1, PL__T_RUNNING = 2, PL__T_READY = 3 };

typedef struct pl__tentry {
    int64_t index;
    int state;
    int inq;     /* linked in the work queue */
    int waiters; /* threads waiting on it or copying from it */
    int rc;      /* READY: PL_OK or the record's error */
    char *err;   /* message of rc */
    int32_t *ids;
    int64_t len;
    size_t cost; /* bytes charged to the cache */
    struct pl__tentry *hnext;
    struct pl__tentry *older, *younger;
    struct pl__tentry *qnext;
} pl__tentry;

struct pl__text {
    pl_tokenizer tok;
    int have_tok;
    char *text_key;
    char *prompt_key, *response_key; /* instruction data: both set */
    char *messages_key;              /* chat instruction data */
    char *chat_pre[3], *chat_suf[3]; /* system, user, assistant: the template
                                        around {content} */
    int masked;                      /* instruction data: ids in marked form */
    int add_eos;
    int64_t eos_id;
    int64_t lookahead, max_record, cache_bytes;
    int nthreads, started, write_index;
    pthread_t *threads;
    pthread_mutex_t mu;
    pthread_cond_t work_cv, done_cv;
    int stop;
    pl__tentry **buckets;
    uint64_t nbuckets; /* power of two */
    int64_t n_entries;
    pl__tentry *oldest, *youngest;
    pl__tentry *qhead, *qtail;
    int64_t bytes;
    atomic_llong tokenized;
    atomic_llong tokenize_cpu_ns; /* thread CPU of pl__tokenize_here */
    /* lookahead cursor: the next position of the epoch's order to queue */
    int la_valid;
    int64_t la_epoch, la_next, la_last;
    int64_t la_draws; /* documents drawn since open: the window grows with it */
    pl__perm la_perm;
    int la_ordered;       /* index order (evaluation), la_perm unused */
    int64_t la_lo, la_n;  /* the order's range of documents (a split) */
    size_t spans_bytes;
    /* the length cache (<file>.pllen) */
    uint64_t lc_key;   /* 0: none */
    int lc_policy;     /* PL_INDEX_* */
    int64_t *learned;  /* [n_docs] lengths learned by tokenizing, -1 unknown
                          (PL_INDEX_WRITE only) */
    int64_t lc_known;  /* documents with a cached or learned length */
    int64_t lc_new;    /* learned and not in the sidecars yet */
    int lc_flush;      /* every length known: write the sidecars once */
    /* lengths-only (pl_source_options.lengths_fn) */
    pl_lengths_fn lengths_fn;
    void *lengths_ctx;
    int64_t lengths_source;
    pl_source *src; /* the owner */
    /* parquet: decoded row groups */
    pthread_mutex_t pq_mu;
    int64_t pq_bytes;
    uint64_t pq_clock;
};

/* ------------------------------------------------------------ UTF-8 */

/* Offset of the first byte that is not part of valid UTF-8 (RFC 3629: no
 * overlong forms, no surrogates, nothing above U+10FFFF), or n. */
static size_t pl__utf8_check(const uint8_t *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        uint8_t c = s[i];
        if (c < 0x80) {
            i++;
            continue;
        }
        size_t k;
        uint32_t cp;
        if (c >= 0xC2 && c <= 0xDF) k = 1, cp = c & 0x1F;
        else if (c >= 0xE0 && c <= 0xEF) k = 2, cp = c & 0x0F;
        else if (c >= 0xF0 && c <= 0xF4) k = 3, cp = c & 0x07;
        else return i;
        if (n - i <= k) return i;
        for (size_t j = 1; j <= k; j++) {
            if ((s[i + j] & 0xC0) != 0x80) return i;
            cp = (cp << 6) | (s[i + j] & 0x3F);
        }
        if ((k == 2 && (cp < 0x800 || (cp >= 0xD800 && cp <= 0xDFFF))) ||
            (k == 3 && (cp < 0x10000 || cp > 0x10FFFF)))
            return i;
        i += k + 1;
    }
    return n;
}

/* ------------------------------------------------------------ bytes */

static int pl__bytes_encode(void *ctx, int64_t n, const char *const *texts,
                            const size_t *lens, int32_t **ids,
                            int64_t *counts, char *err, size_t errcap) {
    (void)ctx;
    for (int64_t i = 0; i < n; i++) {
        ids[i] = NULL;
        counts[i] = (int64_t)lens[i];
        if (!lens[i]) continue;
        ids[i] = malloc(lens[i] * sizeof(int32_t));
        if (!ids[i]) {
            for (int64_t j = 0; j < i; j++) free(ids[j]);
            pl__fmt(err, errcap, "bytes tokenizer: out of memory");
            return PL_ENOMEM;
        }
        const uint8_t *s = (const uint8_t *)texts[i];
        for (size_t j = 0; j < lens[i]; j++) ids[i][j] = s[j];
    }
    return PL_OK;
}

void pl_tokenizer_bytes(pl_tokenizer *out) {
    if (!out) return;
    memset(out, 0, sizeof *out);
    out->version = PL_TOKENIZER_VERSION;
    out->encode_batch = pl__bytes_encode;
    out->eos_id = 256;
    out->vocab_size = 257;
    out->name = "bytes";
}

/* ------------------------------------------------------------ setup */

int pl__text_init(pl_source *src, const pl_source_options *opts, char *err,
                  size_t errcap) {
    const char *name = opts->name && opts->name[0] ? opts->name
                       : opts->path                ? opts->path
                                                   : "(unnamed)";
    pl__text *t = pl__calloc(1, sizeof *t);
    if (!t) {
        pl__fmt(err, errcap, "out of memory");
        return PL_ENOMEM;
    }
    src->text = t;
    t->src = src;
    pthread_mutex_init(&t->mu, NULL);
    pthread_cond_init(&t->work_cv, NULL);
    pthread_cond_init(&t->done_cv, NULL);
    pthread_mutex_init(&t->pq_mu, NULL);
    atomic_init(&t->tokenized, 0);
    atomic_init(&t->tokenize_cpu_ns, 0);
    int v2 = opts->version >= 2;
    if (v2 && opts->tokenizer) {
        t->tok = *opts->tokenizer;
        t->have_tok = 1;
    }
    if (v2 && opts->lengths_fn) {
        t->lengths_fn = opts->lengths_fn;
        t->lengths_ctx = opts->lengths_ctx;
        t->lengths_source = opts->lengths_source;
        if (!t->have_tok) {
            pl_tokenizer_bytes(&t->tok); /* never called: lengths come from fn */
            t->tok.name = "lengths";
        }
    }
    if ((!t->have_tok && !t->lengths_fn) || t->tok.version != PL_TOKENIZER_VERSION ||
        !t->tok.encode_batch) {
        pl__fmt(err, errcap,
                "source %s: a %s source needs a tokenizer (pl_tokenizer of "
                "version %d with encode_batch)",
                name, pl_source_type_name(opts->type), PL_TOKENIZER_VERSION);
        return PL_EINVAL;
    }
    t->text_key = pl__strdup(v2 && opts->text_key ? opts->text_key : "text");
    if (opts->version >= 3 && opts->prompt_key && opts->response_key) {
        if (opts->type != PL_SOURCE_JSONL) {
            pl__fmt(err, errcap,
                    "source %s: prompt_key and response_key apply only to jsonl "
                    "sources",
                    name);
            return PL_EINVAL;
        }
        t->prompt_key = pl__strdup(opts->prompt_key);
        t->response_key = pl__strdup(opts->response_key);
        if (!t->prompt_key || !t->response_key) {
            pl__fmt(err, errcap, "out of memory");
            return PL_ENOMEM;
        }
        t->masked = 1;
    } else if (opts->version >= 3 && opts->messages_key) {
        if (opts->type != PL_SOURCE_JSONL) {
            pl__fmt(err, errcap, "source %s: messages_key applies only to jsonl sources",
                    name);
            return PL_EINVAL;
        }
        t->messages_key = pl__strdup(opts->messages_key);
        if (!t->messages_key) {
            pl__fmt(err, errcap, "out of memory");
            return PL_ENOMEM;
        }
        for (int k = 0; k < 3; k++) {
            const char *tp = opts->chat_template[k];
            const char *at = tp ? strstr(tp, "{content}") : NULL;
            if (!at || strstr(at + 9, "{content}")) {
                pl__fmt(err, errcap,
                        "source %s: chat_template.%s must hold {content} once",
                        name, k == 0 ? "system" : k == 1 ? "user" : "assistant");
                return PL_EINVAL;
            }
            t->chat_pre[k] = pl__calloc((size_t)(at - tp) + 1, 1);
            t->chat_suf[k] = pl__strdup(at + 9);
            if (!t->chat_pre[k] || !t->chat_suf[k]) {
                pl__fmt(err, errcap, "out of memory");
                return PL_ENOMEM;
            }
            memcpy(t->chat_pre[k], tp, (size_t)(at - tp));
        }
        t->masked = 1;
    }
    t->add_eos = v2 ? opts->add_eos != 0 : 0;
    t->eos_id = opts->eos_id >= 0 ? opts->eos_id : t->tok.eos_id;
    t->nthreads = v2 && opts->tokenizer_threads > 0 ? opts->tokenizer_threads : 1;
    if (t->nthreads > 256) t->nthreads = 256;
    t->lookahead = v2 && opts->lookahead > 0 ? opts->lookahead : 512;
    t->max_record = v2 && opts->max_record_bytes > 0 ? opts->max_record_bytes
                                                     : (int64_t)100 << 20;
    t->cache_bytes = v2 && opts->cache_bytes > 0 ? opts->cache_bytes
                                                 : (int64_t)256 << 20;
    t->write_index = opts->write_index;
    if (opts->version >= 3 && opts->length_cache_key) {
        t->lc_key = opts->length_cache_key;
        t->lc_policy = opts->length_cache == 1 ? PL_INDEX_WRITE : opts->length_cache;
    }
    t->nbuckets = 1024;
    t->buckets = pl__calloc(t->nbuckets, sizeof *t->buckets);
    if (!t->text_key || !t->buckets) {
        pl__fmt(err, errcap, "out of memory");
        return PL_ENOMEM;
    }
    if (t->add_eos && t->eos_id < 0 && !t->lengths_fn) {
        pl__fmt(err, errcap,
                "source %s: add_eos is set but tokenizer %s has no "
                "end-of-document token (give eos_id)",
                name, t->tok.name ? t->tok.name : "");
        return PL_EINVAL;
    }
    return PL_OK;
}

/* ------------------------------------------------------------ records */

typedef struct pl__spanv {
    uint64_t *a;
    size_t n, cap; /* pairs */
    uint64_t *ck;  /* line (1-based) of record k * PL__LINE_CK, for messages */
    size_t nck, capck;
    uint64_t line; /* line of the scan's position */
} pl__spanv;

static int pl__ck_push(pl__spanv *v) {
    if (v->nck == v->capck) {
        size_t nc = v->capck ? v->capck * 2 : 16;
        uint64_t *na = pl__realloc_array(v->ck, nc, sizeof *na);
        if (!na) return PL_ENOMEM;
        v->ck = na;
        v->capck = nc;
    }
    v->ck[v->nck++] = v->line;
    return PL_OK;
}

static int pl__spanv_push(pl__spanv *v, uint64_t s, uint64_t e) {
    if (v->n == v->cap) {
        size_t nc = v->cap ? v->cap * 2 : 1024;
        uint64_t *na = pl__realloc_array(v->a, nc * 2, sizeof *na);
        if (!na) return PL_ENOMEM;
        v->a = na;
        v->cap = nc;
    }
    v->a[2 * v->n] = s;
    v->a[2 * v->n + 1] = e;
    v->n++;
    return PL_OK;
}

/* Records of d[0, n) from byte `from` on; *done is where the scan stopped
 * (complete lines only when `partial`: the last line without a newline is
 * left for later). */
static int pl__scan_lines(const uint8_t *d, size_t n, size_t from,
                          int partial, pl__spanv *v, size_t *done) {
    size_t pos = from;
    if (!v->line) v->line = 1;
    while (pos < n) {
        const uint8_t *nl = memchr(d + pos, '\n', n - pos);
        if (!nl && partial) break;
        size_t end = nl ? (size_t)(nl - d) : n;
        size_t e = end;
        if (e > pos && d[e - 1] == '\r') e--;
        size_t s = pos;
        while (s < e && (d[s] == ' ' || d[s] == '\t' || d[s] == '\r')) s++;
        if (s < e) {
            int rc = v->n % PL__LINE_CK == 0 ? pl__ck_push(v) : PL_OK;
            if (rc == PL_OK) rc = pl__spanv_push(v, pos, e);
            if (rc) return rc;
        }
        pos = end + 1;
        v->line++;
    }
    *done = pos < n ? pos : n;
    return PL_OK;
}

static int pl__has_suffix(const char *s, const char *suf) {
    size_t n = strlen(s), m = strlen(suf);
    return n >= m && strcmp(s + n - m, suf) == 0;
}

/* Decompress a whole .gz (every member) or .zst (every frame) into a malloc'd
 * buffer.  Damage: PL_ETRUNC / PL_ERECORD naming the compressed offset;
 * with keep_partial the bytes decoded before it are returned as well, with
 * *damaged set. */
static int pl__decompress(const char *path, int kind, const uint8_t *in,
                          size_t n, char **out, size_t *out_len,
                          int *damaged, char *err, size_t errcap) {
    static const uint8_t empty[1];
    if (!in) in = empty; /* an empty file is mapped as NULL */
    size_t cap = n * 4 + 4096, len = 0;
    char *buf = malloc(cap);
    *damaged = 0;
    if (!buf) goto oom;
    if (kind == 1) {
        z_stream z;
        memset(&z, 0, sizeof z);
        if (inflateInit2(&z, 15 + 32) != Z_OK) goto oom;
        size_t at = 0;
        int rc = Z_OK;
        while (1) {
            if (len == cap) {
                size_t nc = cap * 2;
                char *nb = realloc(buf, nc);
                if (!nb) {
                    inflateEnd(&z);
                    goto oom;
                }
                buf = nb;
                cap = nc;
            }
            size_t chunk_in = n - at > (1u << 30) ? (1u << 30) : n - at;
            size_t chunk_out = cap - len > (1u << 30) ? (1u << 30) : cap - len;
            z.next_in = (Bytef *)(in + at);
            z.avail_in = (uInt)chunk_in;
            z.next_out = (Bytef *)(buf + len);
            z.avail_out = (uInt)chunk_out;
            rc = inflate(&z, Z_NO_FLUSH);
            at += chunk_in - z.avail_in;
            len += chunk_out - z.avail_out;
            if (rc == Z_STREAM_END) {
                if (at >= n) break;
                /* another gzip member follows */
                if (inflateReset(&z) != Z_OK) break;
                continue;
            }
            if (rc == Z_BUF_ERROR && at >= n) {
                inflateEnd(&z);
                pl__fmt(err, errcap,
                        "%s: gzip stream truncated at compressed byte offset "
                        "%zu (%zu bytes decompressed)",
                        path, n, len);
                *damaged = PL_ETRUNC;
                goto damaged;
            }
            if (rc != Z_OK && rc != Z_BUF_ERROR) {
                inflateEnd(&z);
                pl__fmt(err, errcap,
                        "%s: corrupt gzip data at compressed byte offset %zu "
                        "(%s)",
                        path, at, z.msg ? z.msg : "inflate failed");
                *damaged = PL_ERECORD;
                goto damaged;
            }
        }
        inflateEnd(&z);
    } else {
        ZSTD_DStream *zs = ZSTD_createDStream();
        if (!zs) goto oom;
        ZSTD_inBuffer ib = {in, n, 0};
        size_t last = 0;
        while (ib.pos < ib.size) {
            if (len == cap) {
                size_t nc = cap * 2;
                char *nb = realloc(buf, nc);
                if (!nb) {
                    ZSTD_freeDStream(zs);
                    goto oom;
                }
                buf = nb;
                cap = nc;
            }
            ZSTD_outBuffer ob = {buf + len, cap - len, 0};
            last = ZSTD_decompressStream(zs, &ob, &ib);
            len += ob.pos;
            if (ZSTD_isError(last)) {
                pl__fmt(err, errcap,
                        "%s: corrupt zstd data at compressed byte offset %zu "
                        "(%s)",
                        path, ib.pos, ZSTD_getErrorName(last));
                ZSTD_freeDStream(zs);
                *damaged = PL_ERECORD;
                goto damaged;
            }
            if (ob.pos == 0 && ib.pos == ib.size) break;
        }
        /* Flush what the decoder still holds. */
        while (last != 0 && !ZSTD_isError(last)) {
            if (len == cap) {
                size_t nc = cap * 2;
                char *nb = realloc(buf, nc);
                if (!nb) {
                    ZSTD_freeDStream(zs);
                    goto oom;
                }
                buf = nb;
                cap = nc;
            }
            ZSTD_outBuffer ob = {buf + len, cap - len, 0};
            last = ZSTD_decompressStream(zs, &ob, &ib);
            if (ZSTD_isError(last)) break;
            len += ob.pos;
            if (ob.pos == 0) break;
        }
        ZSTD_freeDStream(zs);
        if (last != 0) {
            pl__fmt(err, errcap,
                    "%s: zstd stream truncated at compressed byte offset %zu "
                    "(%zu bytes decompressed)",
                    path, n, len);
            *damaged = PL_ETRUNC;
            goto damaged;
        }
    }
    *out = buf;
    *out_len = len;
    return PL_OK;
damaged:
    *out = buf;
    *out_len = len;
    return *damaged;
oom:
    free(buf);
    pl__fmt(err, errcap, "%s: out of memory decompressing %zu bytes", path, n);
    return PL_ENOMEM;
}

/* The .plrec sidecar of a plain file: read (PL_OK when valid) or write. */
static void pl__rec_path(const pl__sfile *f, char *p, size_t cap) {
    pl__fmt(p, cap, "%s.plrec", f->path);
}

static void pl__rec_header(uint8_t *h, const struct stat *st, uint64_t n) {
    memset(h, 0, PL__REC_HEADER);
    memcpy(h, PL__REC_MAGIC, 8);
    pl__st_u32(h + 8, PL__REC_VERSION);
    pl__st_u64(h + 16, (uint64_t)st->st_size);
    pl__st_u64(h + 24, (uint64_t)st->st_mtim.tv_sec * 1000000000ull +
                           (uint64_t)st->st_mtim.tv_nsec);
    pl__st_u64(h + 32, n);
    pl__st_u32(h + 44, pl__crc32(0, h, 44));
}

static int pl__rec_load(pl__sfile *f, const struct stat *st) {
    char p[4200];
    pl__rec_path(f, p, sizeof p);
    void *map;
    size_t len;
    struct stat rst;
    char e[64];
    if (pl__map_file(p, &map, &len, &rst, NULL, e, sizeof e)) return -1;
    if (len < PL__REC_HEADER) goto bad;
    const uint8_t *h = map;
    uint64_t n = pl__ld_u64(h + 32);
    uint8_t want[PL__REC_HEADER];
    pl__rec_header(want, st, n);
    if (memcmp(h, want, PL__REC_HEADER) != 0) goto bad;
    if (n > (len - PL__REC_HEADER) / 16 || PL__REC_HEADER + n * 16 != len)
        goto bad;
    const uint64_t *sp = (const uint64_t *)(h + PL__REC_HEADER);
    for (uint64_t i = 0; i < n; i++) /* O(n) but over the sidecar only */
        if (sp[2 * i] > sp[2 * i + 1] || sp[2 * i + 1] > (uint64_t)st->st_size ||
            (i && sp[2 * i] < sp[2 * i - 1]))
            goto bad;
    f->idx_map = map;
    f->idx_len = len;
    f->spans = sp;
    f->n_docs = (int64_t)n;
    f->index_in_memory = 1; /* nothing to watch: spans are re-checked per read */
    return 0;
bad:
    if (map) munmap(map, len);
    return -1;
}

static void pl__rec_write(const pl__sfile *f, const struct stat *st,
                          const uint64_t *spans, uint64_t n) {
    char p[4200], tmp[4300];
    pl__rec_path(f, p, sizeof p);
    pl__fmt(tmp, sizeof tmp, "%s.tmp.%ld", p, (long)getpid());
    int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0) return; /* a read-only directory: stay in memory */
    uint8_t h[PL__REC_HEADER];
    pl__rec_header(h, st, n);
    int ok = write(fd, h, sizeof h) == (ssize_t)sizeof h;
    size_t bytes = (size_t)n * 16, done = 0;
    while (ok && done < bytes) {
        ssize_t k = write(fd, (const uint8_t *)spans + done, bytes - done);
        if (k <= 0) ok = 0;
        else done += (size_t)k;
    }
    if (close(fd) != 0) ok = 0;
    if (!ok || rename(tmp, p) != 0) unlink(tmp);
}

/* ------------------------------------------------------------ length cache */

static const pl__sfile *pl__tlocate(const pl_source *src, int64_t index,
                                    int64_t *r);

#define PL__LEN_MAGIC "PLLEN\0\0\0"
#define PL__LEN_VERSION 1u
#define PL__LEN_HEADER 56

static void pl__len_header(uint8_t *h, const pl__sfile *f, uint64_t key,
                           uint32_t body_crc) {
    memset(h, 0, PL__LEN_HEADER);
    memcpy(h, PL__LEN_MAGIC, 8);
    pl__st_u32(h + 8, PL__LEN_VERSION);
    pl__st_u32(h + 12, body_crc);
    pl__st_u64(h + 16, f->st_size);
    pl__st_u64(h + 24, f->st_mtime_ns);
    pl__st_u64(h + 32, (uint64_t)f->n_docs);
    pl__st_u64(h + 40, key);
    pl__st_u32(h + 48, pl__crc32(0, h, 48));
}

/* Map f's <file>.pllen when it matches the file, its records and the key. */
static void pl__len_load(pl__text *t, pl__sfile *f) {
    if (!t->lc_key || t->lc_policy == PL_INDEX_MEMORY) return;
    char p[4200];
    pl__fmt(p, sizeof p, "%s.pllen", f->path);
    void *map = NULL;
    size_t len = 0;
    struct stat st;
    char e[64];
    if (pl__map_file(p, &map, &len, &st, NULL, e, sizeof e)) return;
    uint8_t want[PL__LEN_HEADER];
    const size_t body = (size_t)f->n_docs * 8;
    if (map && len == PL__LEN_HEADER + body)
        pl__len_header(want, f, t->lc_key,
                       pl__crc32(0, (const uint8_t *)map + PL__LEN_HEADER, body));
    if (len != PL__LEN_HEADER + body || !map ||
        memcmp(map, want, PL__LEN_HEADER) != 0) {
        if (map) munmap(map, len);
        return;
    }
    f->len_map = map;
    f->len_map_len = len;
    f->cached_len = (const int64_t *)((const uint8_t *)map + PL__LEN_HEADER);
}

/* Write the sidecars of every file with lengths not in them yet (no lock
 * held; `known` is a copy of the learned lengths). */
static void pl__len_write(pl_source *src, const int64_t *known) {
    for (int64_t i = 0; i < src->n_files; i++) {
        const pl__sfile *f = &src->files[i];
        if (!f->n_docs) continue;
        int news = 0;
        for (int64_t r = 0; r < f->n_docs && !news; r++)
            news = known[f->first_doc + r] >= 0 &&
                   (!f->cached_len || f->cached_len[r] < 0);
        if (!news) continue;
        int64_t *v = malloc((size_t)f->n_docs * sizeof *v);
        if (!v) return;
        for (int64_t r = 0; r < f->n_docs; r++) {
            int64_t k = known[f->first_doc + r];
            v[r] = k >= 0 ? k : f->cached_len ? f->cached_len[r] : -1;
            if (v[r] < 0) v[r] = -1;
        }
        char p[4200], tmp[4300];
        pl__fmt(p, sizeof p, "%s.pllen", f->path);
        pl__fmt(tmp, sizeof tmp, "%s.tmp.%ld.%p", p, (long)getpid(), (void *)v);
        int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
        if (fd >= 0) {
            uint8_t h[PL__LEN_HEADER];
            pl__len_header(h, f, src->text->lc_key,
                           pl__crc32(0, (const uint8_t *)v, (size_t)f->n_docs * 8));
            int ok = write(fd, h, sizeof h) == (ssize_t)sizeof h;
            size_t bytes = (size_t)f->n_docs * 8, done = 0;
            while (ok && done < bytes) {
                ssize_t k = write(fd, (const uint8_t *)v + done, bytes - done);
                if (k <= 0) ok = 0;
                else done += (size_t)k;
            }
            if (close(fd) != 0) ok = 0;
            if (!ok || rename(tmp, p) != 0) unlink(tmp);
        }
        free(v);
    }
}

/* With the lock held: a copy of what is known, when the sidecars are due
 * (force: at free), else NULL. */
static int64_t *pl__len_due(pl_source *src, int force) {
    pl__text *t = src->text;
    if (!t->learned || !t->lc_new || (!force && !t->lc_flush)) return NULL;
    t->lc_flush = 0;
    t->lc_new = 0;
    int64_t *copy = malloc((size_t)src->n_docs * sizeof *copy);
    if (copy) memcpy(copy, t->learned, (size_t)src->n_docs * sizeof *copy);
    return copy;
}

/* With the lock held: remember document index's length (PL_INDEX_WRITE);
 * len -2 for a bad record (settled, never cached). */
static void pl__len_learn(pl_source *src, int64_t index, int64_t len) {
    pl__text *t = src->text;
    if (!t->learned || t->learned[index] != -1) return;
    int64_t r;
    const pl__sfile *f = pl__tlocate(src, index, &r);
    if (f->cached_len && f->cached_len[r] >= 0) return;
    t->learned[index] = len;
    if (len >= 0) t->lc_new++;
    if (++t->lc_known == src->n_docs) t->lc_flush = 1;
}

/* A cached length of document index, or -1. */
static int64_t pl__len_cached(const pl_source *src, int64_t index) {
    if (!src->text->lc_key) return -1;
    int64_t r;
    const pl__sfile *f = pl__tlocate(src, index, &r);
    return f->cached_len ? f->cached_len[r] : -1;
}

/* ------------------------------------------------------------ parquet */

typedef struct pl__segv pl__segv;
static int pl__seg_push(pl__segv *v, char *text, size_t len, int owned, int train);

void pl__pq_file_free(pl__sfile *f) {
    for (int64_t g = 0; f->pq_dec && g < f->pq_groups; g++) {
        free(f->pq_dec[g].data);
        free(f->pq_dec[g].off);
        free(f->pq_dec[g].valid);
        free(f->pq_dec[g].err);
    }
    free(f->pq_dec);
    free(f->pq_first);
#ifdef PL_WITH_PARQUET
    if (f->pq) pl__pq_close(f->pq);
#endif
    f->pq = NULL;
    f->pq_dec = NULL;
    f->pq_first = NULL;
    f->pq_groups = 0;
}

/* Open a Parquet file's footer: its rows are the records. */
static int pl__pq_open_file(pl_source *src, pl__sfile *f, int skip_damaged, char *err,
                            size_t errcap) {
#ifndef PL_WITH_PARQUET
    (void)skip_damaged;
    pl__fmt(err, errcap,
            "source %s: %s: parquet support not built (the library was compiled "
            "without Apache Arrow's Parquet reader: install pyarrow, whose wheel ships "
            "it, and rebuild)",
            src->name, f->path);
    return PL_ECONFIG;
#else
    pl__text *t = src->text;
    struct stat st;
    if (stat(f->path, &st) == 0) {
        f->st_size = (uint64_t)st.st_size;
        f->st_mtime_ns = (uint64_t)st.st_mtim.tv_sec * 1000000000ull +
                         (uint64_t)st.st_mtim.tv_nsec;
    }
    int64_t ng = 0, *rows = NULL;
    pl__pqfile *h = NULL;
    int rc = pl__pq_open(f->path, t->text_key, &h, &ng, &rows, err, errcap);
    if (rc) {
        if (skip_damaged && (rc == PL_ERECORD || rc == PL_ETRUNC)) {
            f->n_docs = 0; /* the file is left out, counted as one record */
            f->skipped = 1;
            return PL_OK;
        }
        return rc;
    }
    f->pq = h;
    f->pq_groups = ng;
    f->pq_first = malloc((size_t)(ng + 1) * sizeof *f->pq_first);
    f->pq_dec = pl__calloc((size_t)(ng ? ng : 1), sizeof *f->pq_dec);
    if (!f->pq_first || !f->pq_dec) {
        free(rows);
        pl__fmt(err, errcap, "%s: out of memory", f->path);
        return PL_ENOMEM;
    }
    f->pq_first[0] = 0;
    for (int64_t g = 0; g < ng; g++) f->pq_first[g + 1] = f->pq_first[g] + rows[g];
    free(rows);
    f->n_docs = f->pq_first[ng];
    pl__len_load(t, f);
    return PL_OK;
#endif
}

#ifdef PL_WITH_PARQUET
/* With pq_mu held: drop the least recently used decoded groups (not keep)
 * while over the budget. */
static void pl__pq_evict(pl_source *src, const pl__pqgroup *keep) {
    pl__text *t = src->text;
    while (t->pq_bytes > PL__PQ_CACHE_BYTES) {
        pl__pqgroup *lru = NULL;
        for (int64_t i = 0; i < src->n_files; i++)
            for (int64_t g = 0; g < src->files[i].pq_groups; g++) {
                pl__pqgroup *G = &src->files[i].pq_dec[g];
                if (G->data && G != keep && (!lru || G->last_use < lru->last_use)) lru = G;
            }
        if (!lru) return;
        t->pq_bytes -= lru->bytes;
        free(lru->data);
        free(lru->off);
        free(lru->valid);
        lru->data = NULL;
        lru->off = NULL;
        lru->valid = NULL;
        lru->bytes = 0;
    }
}
#endif

/* The text of local row r of Parquet file f as one (trained) segment. */
static int pl__pq_record_text(pl_source *src, const pl__sfile *fc, int64_t r,
                              pl__segv *v, char *err, size_t errcap) {
#ifndef PL_WITH_PARQUET
    (void)src, (void)r, (void)v;
    pl__fmt(err, errcap, "%s: parquet support not built", fc->path);
    return PL_ECONFIG;
#else
    pl__text *t = src->text;
    pl__sfile *f = (pl__sfile *)fc; /* its decoded groups change, under pq_mu */
    int64_t lo = 0, hi = f->pq_groups; /* the group g: pq_first[g] <= r */
    while (hi - lo > 1) {
        int64_t mid = lo + (hi - lo) / 2;
        if (f->pq_first[mid] <= r) lo = mid;
        else hi = mid;
    }
    const int64_t g = lo, k = r - f->pq_first[g], rows = f->pq_first[g + 1] - f->pq_first[g];
    char where[200];
    pthread_mutex_lock(&t->pq_mu);
    pl__pqgroup *G = &f->pq_dec[g];
    if (!G->data && !G->rc) {
        char e[PL__ERRMSG_CAP];
        int rc = pl__pq_read_group(f->pq, g, rows, &G->data, &G->off, &G->valid, e, sizeof e);
        if (rc == PL_ENOMEM) {
            pthread_mutex_unlock(&t->pq_mu);
            pl__fmt(err, errcap, "%s", e);
            return rc;
        }
        if (rc) {
            G->rc = rc;
            G->err = pl__strdup(e);
        } else {
            G->bytes = (int64_t)(G->off[rows] + (uint64_t)rows * 9 + 8);
            t->pq_bytes += G->bytes;
        }
    }
    G->last_use = ++t->pq_clock;
    const uint64_t s = G->data ? G->off[k] : 0, e = G->data ? G->off[k + 1] : 0;
    const size_t n = (size_t)(e - s);
    if (G->rc || !G->valid[k] || (int64_t)n > t->max_record || n == 0) /* error paths */
        pl__fmt(where, sizeof where,
                "row %lld (row group %lld, row %lld of the group; column chunk at byte "
                "offset %lld)",
                (long long)r, (long long)g, (long long)k,
                (long long)pl__pq_chunk_offset(f->pq, g));
    if (G->rc) {
        int rc = G->rc;
        pl__fmt(err, errcap, "%s: %s: %s", f->path, where, G->err ? G->err : "cannot decode");
        pthread_mutex_unlock(&t->pq_mu);
        return rc;
    }
    int rc = PL_OK;
    size_t bad;
    char *copy = NULL;
    if (!G->valid[k])
        pl__fmt(err, errcap, "%s: %s: column '%s' is null", f->path, where, t->text_key), rc = PL_ERECORD;
    else if ((int64_t)n > t->max_record)
        pl__fmt(err, errcap, "%s: %s: %zu bytes, over the limit of %lld (max_record_bytes)",
                f->path, where, n, (long long)t->max_record), rc = PL_ERECORD;
    else if (n == 0)
        pl__fmt(err, errcap, "%s: %s: empty document (column '%s' is \"\")", f->path, where,
                t->text_key), rc = PL_ERECORD;
    else if ((bad = pl__utf8_check((const uint8_t *)G->data + s, n)) < n)
        pl__fmt(err, errcap,
                "%s: row %lld (row group %lld, row %lld of the group; column chunk at byte "
                "offset %lld): invalid UTF-8 at byte %zu of the value",
                f->path, (long long)r, (long long)g, (long long)k,
                (long long)pl__pq_chunk_offset(f->pq, g), bad),
            rc = PL_ERECORD;
    else if (!(copy = malloc(n)))
        pl__fmt(err, errcap, "%s: out of memory", f->path), rc = PL_ENOMEM;
    else
        memcpy(copy, G->data + s, n);
    pl__pq_evict(src, G);
    pthread_mutex_unlock(&t->pq_mu);
    if (rc) return rc;
    rc = pl__seg_push(v, copy, n, 1, 1);
    if (rc) pl__fmt(err, errcap, "%s: out of memory", f->path);
    return rc;
#endif
}

int pl__text_open_file(pl_source *src, pl__sfile *f, int skip_damaged,
                       char *err, size_t errcap) {
    pl__text *t = src->text;
    f->dtype = PL_DTYPE_INT32;
    f->width = 4;
    if (src->type == PL_SOURCE_PARQUET) return pl__pq_open_file(src, f, skip_damaged, err, errcap);
    f->compression = pl__has_suffix(f->path, ".gz")    ? 1
                     : pl__has_suffix(f->path, ".zst") ? 2
                     : pl__has_suffix(f->path, ".zstd") ? 2
                                                        : 0;
    void *map;
    size_t len;
    struct stat st;
    int fd = -1;
    int rc = pl__map_file(f->path, &map, &len, &st, f->compression ? NULL : &fd,
                          err, errcap);
    if (rc) return rc;
    f->st_size = (uint64_t)st.st_size;
    f->st_mtime_ns = (uint64_t)st.st_mtim.tv_sec * 1000000000ull +
                     (uint64_t)st.st_mtim.tv_nsec;
    pl__spanv v = {0};
    const uint8_t *data = map;
    size_t data_len = len;
    if (f->compression) {
        int damaged = 0;
        char *out = NULL;
        size_t out_len = 0;
        rc = pl__decompress(f->path, f->compression, map, len, &out, &out_len,
                            &damaged, err, errcap);
        if (map) munmap(map, len);
        map = NULL;
        if (rc == PL_ENOMEM) return rc;
        f->text = out;
        f->text_len = out_len;
        if (rc && !skip_damaged) return rc;
        data = (const uint8_t *)out;
        data_len = out_len;
        pl__fwatch_keep(&f->data_w, -1, &st);
        size_t done = 0;
        /* A damaged stream keeps its complete lines; the partial one is
           counted as skipped. */
        rc = pl__scan_lines(data, data_len, 0,
                            damaged && src->type == PL_SOURCE_JSONL, &v, &done);
        if (rc == PL_OK && damaged) {
            if (src->type == PL_SOURCE_TEXT || done < data_len) f->skipped = 1;
            if (src->type == PL_SOURCE_TEXT) v.n = 0;
        }
    } else {
        pl__fwatch_keep(&f->data_w, fd, &st);
        if (src->type == PL_SOURCE_TEXT) {
            rc = pl__spanv_push(&v, 0, len);
        } else if (t->write_index == 1 && pl__rec_load(f, &st) == 0) {
            if (map) munmap(map, len);
            pl__len_load(t, f);
            return PL_OK;
        } else {
            size_t done;
            rc = pl__scan_lines(data, data_len, 0, 0, &v, &done);
        }
        if (map) munmap(map, len);
    }
    if (src->type == PL_SOURCE_TEXT && f->compression && rc == PL_OK &&
        v.n == 0 && !f->skipped)
        rc = pl__spanv_push(&v, 0, data_len);
    if (rc) {
        free(v.a);
        free(v.ck);
        pl__fmt(err, errcap, "%s: out of memory listing records", f->path);
        return rc;
    }
    f->spans_owned = v.a;
    f->spans = v.a;
    f->line_ck = v.ck;
    f->n_docs = (int64_t)v.n;
    t->spans_bytes += v.n * 16;
    if (!f->compression && src->type == PL_SOURCE_JSONL && t->write_index == 1)
        pl__rec_write(f, &st, v.a, v.n);
    pl__len_load(t, f);
    return PL_OK;
}

/* ------------------------------------------------------------ one record */

/* Line (1-based) of byte `at` of file f: newlines before it are counted
 * (error path only). */
static int64_t pl__line_of(const pl_source *src, const pl__sfile *f,
                           uint64_t at) {
    int64_t line = 1;
    uint64_t from = 0;
    if (f->line_ck && f->n_docs > 0 && src->type == PL_SOURCE_JSONL) {
        /* The last record starting at or before `at`, then its checkpoint. */
        int64_t lo = 0, hi = f->n_docs;
        while (hi - lo > 1) {
            int64_t mid = lo + (hi - lo) / 2;
            if (f->spans[2 * mid] <= at) lo = mid;
            else hi = mid;
        }
        int64_t k = lo / PL__LINE_CK;
        from = f->spans[2 * (k * PL__LINE_CK)];
        if (from > at) from = 0;
        else line = (int64_t)f->line_ck[k];
    }
    if (f->text) {
        const char *p = f->text + from,
                   *end = f->text + (at < f->text_len ? at : f->text_len);
        while ((p = memchr(p, '\n', (size_t)(end - p))) != NULL) {
            line++;
            p++;
        }
        return line;
    }
    int fd, owned;
    char e[PL__ERRMSG_CAP];
    if (pl__source_data_fd(src, f, &fd, &owned, e, sizeof e)) return 0;
    char buf[65536];
    uint64_t pos = from;
    while (pos < at) {
        size_t want = at - pos < sizeof buf ? (size_t)(at - pos) : sizeof buf;
        ssize_t k = pread(fd, buf, want, (off_t)pos);
        if (k <= 0) break;
        for (ssize_t i = 0; i < k; i++) line += buf[i] == '\n';
        pos += (uint64_t)k;
    }
    if (owned) close(fd);
    return line;
}

/* Texts of a record, in order, with whether their tokens are trained on
 * (instruction data) and whether the text is malloc'd. */
struct pl__segv {
    char **text;
    size_t *len;
    unsigned char *owned, *train;
    int64_t n, cap;
};

static int pl__seg_push(pl__segv *v, char *text, size_t len, int owned, int train) {
    if (v->n == v->cap) {
        int64_t nc = v->cap ? 2 * v->cap : 16;
        char **a = pl__realloc_array(v->text, (size_t)nc, sizeof *a);
        if (a) v->text = a;
        size_t *l = a ? pl__realloc_array(v->len, (size_t)nc, sizeof *l) : NULL;
        if (l) v->len = l;
        unsigned char *o = l ? pl__realloc_array(v->owned, (size_t)nc, 1) : NULL;
        if (o) v->owned = o;
        unsigned char *tr = o ? pl__realloc_array(v->train, (size_t)nc, 1) : NULL;
        if (!tr) {
            if (owned) free(text);
            return PL_ENOMEM;
        }
        v->train = tr;
        v->cap = nc;
    }
    v->text[v->n] = text;
    v->len[v->n] = len;
    v->owned[v->n] = (unsigned char)owned;
    v->train[v->n] = (unsigned char)train;
    v->n++;
    return PL_OK;
}

static void pl__seg_pop_to(pl__segv *v, int64_t n) {
    while (v->n > n) {
        v->n--;
        if (v->owned[v->n]) free(v->text[v->n]);
    }
}

/* A malloc'd copy of a JSON string's bytes as a segment. */
static int pl__seg_json(pl__segv *v, const json_t *str, int train) {
    size_t m = json_string_length(str);
    char *d = malloc(m ? m : 1);
    if (!d) return PL_ENOMEM;
    memcpy(d, json_string_value(str), m);
    return pl__seg_push(v, d, m, 1, train);
}

/* The segments of a chat `messages` list rendered with the source's
 * template: per message the role's prefix and suffix around its content,
 * trained on for assistant messages (content and suffix).  A message that
 * is not {"role": system|user|assistant, "content": string} is refused in
 * why. */
static int pl__seg_messages(const pl__text *t, const json_t *list, pl__segv *v,
                            char *why, size_t cap) {
    static const char *const roles[3] = {"system", "user", "assistant"};
    size_t n = json_array_size(list);
    int trained = 0;
    for (size_t i = 0; i < n; i++) {
        const json_t *m = json_array_get(list, i);
        const json_t *role = json_is_object(m) ? json_object_get(m, "role") : NULL;
        const json_t *content = json_is_object(m) ? json_object_get(m, "content") : NULL;
        int k = -1;
        for (int j = 0; j < 3 && role && json_is_string(role); j++)
            if (strcmp(json_string_value(role), roles[j]) == 0) k = j;
        if (!json_is_object(m)) {
            pl__fmt(why, cap, "key '%s': message %zu is not an object", t->messages_key, i);
            return PL_ERECORD;
        }
        if (k < 0) {
            pl__fmt(why, cap,
                    "key '%s': message %zu: role %s%s%s is not system, user or assistant",
                    t->messages_key, i, role && json_is_string(role) ? "'" : "",
                    role && json_is_string(role) ? json_string_value(role) : "missing",
                    role && json_is_string(role) ? "'" : "");
            return PL_ERECORD;
        }
        if (!content || !json_is_string(content)) {
            pl__fmt(why, cap, "key '%s': message %zu: 'content' is %s", t->messages_key,
                    i, content ? "not a string" : "missing");
            return PL_ERECORD;
        }
        const int tr = k == 2;
        int rc = PL_OK;
        if (t->chat_pre[k][0])
            rc = pl__seg_push(v, t->chat_pre[k], strlen(t->chat_pre[k]), 0, 0);
        if (rc == PL_OK && json_string_length(content)) rc = pl__seg_json(v, content, tr);
        if (rc == PL_OK && t->chat_suf[k][0])
            rc = pl__seg_push(v, t->chat_suf[k], strlen(t->chat_suf[k]), 0, tr);
        if (rc) return rc;
        trained |= tr && json_string_length(content) > 0;
    }
    if (!trained) {
        pl__fmt(why, cap, "key '%s': no assistant message with content (nothing to "
                          "train on)",
                t->messages_key);
        return PL_ERECORD;
    }
    return PL_OK;
}

/* The texts of local record r of f, appended to v: one (trained) for
 * documents; prompt (not trained) and response for instruction data; the
 * rendered messages of a chat record.  Valid UTF-8.  On error nothing is
 * appended; PL_ERECORD etc. name the file, the line and the byte offset. */
static int pl__record_text(pl_source *src, const pl__sfile *f, int64_t r,
                           pl__segv *v, char *err, size_t errcap) {
    if (src->type == PL_SOURCE_PARQUET) return pl__pq_record_text(src, f, r, v, err, errcap);
    pl__text *t = src->text;
    uint64_t s = f->spans[2 * r], e = f->spans[2 * r + 1];
    const int parts = t->prompt_key ? 2 : 1;
    const int64_t n0 = v->n;
    const char *what = src->type == PL_SOURCE_JSONL ? "line" : "file";
    if (e < s || (!f->text && e > (uint64_t)INT64_MAX) ||
        (f->text && e > f->text_len)) {
        pl__fmt(err, errcap, "%s: record %lld: byte range [%llu, %llu) is "
                             "outside the file",
                f->path, (long long)r, (unsigned long long)s,
                (unsigned long long)e);
        return PL_EBOUNDS;
    }
    if ((int64_t)(e - s) > t->max_record) {
        pl__fmt(err, errcap,
                "%s: %s %lld (byte offset %llu): %llu bytes, over the limit of "
                "%lld (max_record_bytes)",
                f->path, what, (long long)pl__line_of(src, f, s),
                (unsigned long long)s, (unsigned long long)(e - s),
                (long long)t->max_record);
        return PL_ERECORD;
    }
    size_t n = (size_t)(e - s);
    char *raw;
    int raw_owned = 0, rc = PL_OK;
    if (f->text) {
        raw = f->text + s;
    } else {
        raw = malloc(n ? n : 1);
        if (!raw) {
            pl__fmt(err, errcap, "%s: out of memory reading %zu bytes", f->path, n);
            return PL_ENOMEM;
        }
        raw_owned = 1;
        int fd, fowned;
        rc = pl__source_data_fd(src, f, &fd, &fowned, err, errcap);
        if (rc) {
            free(raw);
            return rc;
        }
        size_t got = 0;
        while (got < n) {
            ssize_t k = pread(fd, raw + got, n - got, (off_t)(s + got));
            if (k <= 0) {
                int en = errno;
                if (fowned) close(fd);
                free(raw);
                pl__fmt(err, errcap,
                        "%s: read of %zu bytes at byte offset %llu failed: %s",
                        f->path, n, (unsigned long long)s,
                        k == 0 ? "file shrank since open" : strerror(en));
                return k == 0 ? PL_ETRUNC : PL_EIO;
            }
            got += (size_t)k;
        }
        if (fowned) close(fd);
    }
    if (src->type == PL_SOURCE_TEXT) {
        size_t bad = pl__utf8_check((const uint8_t *)raw, n);
        if (bad < n) {
            pl__fmt(err, errcap, "%s: invalid UTF-8 at byte offset %llu",
                    f->path, (unsigned long long)(s + bad));
            if (raw_owned) free(raw);
            return PL_ERECORD;
        }
        if (n == 0) {
            pl__fmt(err, errcap, "%s: empty document", f->path);
            if (raw_owned) free(raw);
            return PL_ERECORD;
        }
        rc = pl__seg_push(v, raw, n, raw_owned, 1);
        if (rc) pl__fmt(err, errcap, "%s: out of memory", f->path);
        return rc;
    }
    json_error_t je;
    json_t *obj = json_loadb(raw, n, JSON_DECODE_ANY | JSON_ALLOW_NUL, &je);
    char why[300];
    why[0] = '\0';
    if (!obj) {
        if (json_error_code(&je) == json_error_invalid_utf8) {
            /* The bad byte itself (jansson's position is where its parser
               stopped, not the byte). */
            size_t bad = pl__utf8_check((const uint8_t *)raw, n);
            uint64_t at = bad < n ? (uint64_t)bad : (uint64_t)(je.position > 0 ? je.position : 0);
            pl__fmt(why, sizeof why, "invalid UTF-8 at byte offset %llu",
                    (unsigned long long)(s + at));
        } else
            pl__fmt(why, sizeof why, "malformed JSON at column %d: %s",
                    je.column, je.text);
    } else if (!json_is_object(obj)) {
        pl__fmt(why, sizeof why, "expected a JSON object");
    } else if (t->messages_key) {
        json_t *list = json_object_get(obj, t->messages_key);
        if (!list)
            pl__fmt(why, sizeof why, "key '%s' is missing", t->messages_key);
        else if (!json_is_array(list) || json_array_size(list) == 0)
            pl__fmt(why, sizeof why, "key '%s' is not a non-empty list", t->messages_key);
        else
            rc = pl__seg_messages(t, list, v, why, sizeof why);
        if (rc == PL_ERECORD) rc = PL_OK; /* reported through why */
    } else {
        const char *keys[2] = {t->text_key, NULL};
        if (parts == 2) keys[0] = t->prompt_key, keys[1] = t->response_key;
        for (int k = 0; k < parts && !why[0] && rc == PL_OK; k++) {
            json_t *jv = json_object_get(obj, keys[k]);
            if (!jv)
                pl__fmt(why, sizeof why, "key '%s' is missing", keys[k]);
            else if (!json_is_string(jv))
                pl__fmt(why, sizeof why, "key '%s' is not a string", keys[k]);
            else if (json_string_length(jv) == 0 && !(parts == 2 && k == 0))
                pl__fmt(why, sizeof why, "empty %s (key '%s' is \"\")",
                        parts == 2 ? "response" : "document", keys[k]);
            else if (json_string_length(jv) > 0 || parts == 1)
                rc = pl__seg_json(v, jv, parts == 1 || k == 1);
        }
    }
    if (obj) json_decref(obj);
    if (raw_owned) free(raw);
    if (rc == PL_ENOMEM || why[0]) pl__seg_pop_to(v, n0);
    if (rc == PL_ENOMEM) {
        pl__fmt(err, errcap, "%s: out of memory", f->path);
        return rc;
    }
    if (why[0]) {
        pl__fmt(err, errcap, "%s: line %lld (byte offset %llu): %s", f->path,
                (long long)pl__line_of(src, f, s), (unsigned long long)s, why);
        return PL_ERECORD;
    }
    return PL_OK;
}

/* ------------------------------------------------------------ the table */

static uint64_t pl__hidx(const pl__text *t, int64_t index) {
    return ((uint64_t)index * 0x9E3779B97F4A7C15ull) >> 17 & (t->nbuckets - 1);
}

static pl__tentry *pl__find(const pl__text *t, int64_t index) {
    for (pl__tentry *e = t->buckets[pl__hidx(t, index)]; e; e = e->hnext)
        if (e->index == index) return e;
    return NULL;
}

static void pl__grow(pl__text *t) {
    uint64_t nb = t->nbuckets * 2;
    pl__tentry **b = pl__calloc(nb, sizeof *b);
    if (!b) return; /* longer chains, still correct */
    pl__tentry **old = t->buckets;
    uint64_t on = t->nbuckets;
    t->buckets = b;
    t->nbuckets = nb;
    for (uint64_t i = 0; i < on; i++) {
        pl__tentry *e = old[i];
        while (e) {
            pl__tentry *nx = e->hnext;
            uint64_t h = pl__hidx(t, e->index);
            e->hnext = b[h];
            b[h] = e;
            e = nx;
        }
    }
    free(old);
}

static pl__tentry *pl__insert(pl__text *t, int64_t index, int state) {
    pl__tentry *e = pl__calloc(1, sizeof *e);
    if (!e) return NULL;
    e->index = index;
    e->state = state;
    e->cost = sizeof *e;
    if ((uint64_t)t->n_entries >= t->nbuckets) pl__grow(t);
    uint64_t h = pl__hidx(t, index);
    e->hnext = t->buckets[h];
    t->buckets[h] = e;
    e->older = t->youngest;
    if (t->youngest) t->youngest->younger = e;
    else t->oldest = e;
    t->youngest = e;
    t->n_entries++;
    t->bytes += (int64_t)e->cost;
    return e;
}

static void pl__remove(pl__text *t, pl__tentry *e) {
    pl__tentry **pp = &t->buckets[pl__hidx(t, e->index)];
    while (*pp != e) pp = &(*pp)->hnext;
    *pp = e->hnext;
    if (e->older) e->older->younger = e->younger;
    else t->oldest = e->younger;
    if (e->younger) e->younger->older = e->older;
    else t->youngest = e->older;
    t->n_entries--;
    t->bytes -= (int64_t)e->cost;
    free(e->ids);
    free(e->err);
    free(e);
}

/* Drop the oldest finished entries beyond the budget. */
static void pl__evict(pl__text *t) {
    pl__tentry *e = t->oldest;
    while (t->bytes > t->cache_bytes && e) {
        pl__tentry *nx = e->younger;
        if (e->state == PL__T_READY && !e->inq && !e->waiters) pl__remove(t, e);
        e = nx;
    }
}

static void pl__finish(pl__text *t, pl__tentry *e, int rc, const char *msg,
                       int32_t *ids, int64_t len) {
    char m[PL__ERRMSG_CAP];
    if (rc == PL_OK && t->lc_key) {
        /* A cached length the tokenizer does not give would have planned
           chunks that are not there (or left tokens out): refuse the
           document, naming the sidecar. */
        int64_t r;
        const pl__sfile *f = pl__tlocate(t->src, e->index, &r);
        if (f->cached_len && f->cached_len[r] >= 0 && f->cached_len[r] != len) {
            pl__fmt(m, sizeof m,
                    "%s.pllen: record %lld: the length cache says %lld tokens, the "
                    "tokenizer gives %lld (a stale length cache: delete it)",
                    f->path, (long long)r, (long long)f->cached_len[r], (long long)len);
            free(ids);
            ids = NULL;
            len = 0;
            rc = PL_EDOCIDX;
            msg = m;
        }
    }
    e->rc = rc;
    e->ids = ids;
    e->len = len;
    if (rc) e->err = pl__strdup(msg);
    size_t add = (size_t)len * sizeof(int32_t) + (rc && msg ? strlen(msg) + 1 : 0);
    e->cost += add;
    t->bytes += (int64_t)add;
    e->state = PL__T_READY;
    pl__len_learn(t->src, e->index, rc == PL_OK ? len : -2);
    pthread_cond_broadcast(&t->done_cv);
    pl__evict(t);
}

/* ------------------------------------------------------------ tokenizing */

/* The file and local record of global document index. */
static const pl__sfile *pl__tlocate(const pl_source *src, int64_t index,
                                    int64_t *r) {
    int64_t lo = 0, hi = src->n_files;
    while (hi - lo > 1) {
        int64_t mid = lo + (hi - lo) / 2;
        if (src->files[mid].first_doc <= index) lo = mid;
        else hi = mid;
    }
    *r = index - src->files[lo].first_doc;
    return &src->files[lo];
}

typedef struct pl__tres {
    int rc;
    char err[PL__ERRMSG_CAP];
    int32_t *ids;
    int64_t len;
} pl__tres;

/* Lengths-only: ask lengths_fn for idx[0..n). */
static void pl__remote_lengths(pl_source *src, const int64_t *idx, int64_t n,
                               pl__tres *res) {
    pl__text *t = src->text;
    int64_t *lens = pl__calloc((size_t)n, sizeof *lens);
    char **msgs = pl__calloc((size_t)n, sizeof *msgs);
    char err[PL__ERRMSG_CAP];
    err[0] = '\0';
    int rc = !lens || !msgs ? PL_ENOMEM
                            : t->lengths_fn(t->lengths_ctx, t->lengths_source, n,
                                            idx, lens, msgs, err, sizeof err);
    for (int64_t i = 0; i < n; i++) {
        res[i].ids = NULL;
        res[i].len = 0;
        res[i].rc = rc ? rc : lens[i] < 0 ? (int)lens[i] : PL_OK;
        if (!rc && lens[i] >= 0) res[i].len = lens[i];
        if (rc)
            pl__fmt(res[i].err, sizeof res[i].err, "source %s: lengths of %lld "
                                                   "documents: %s",
                    src->name, (long long)n, err[0] ? err : pl_strerror(rc));
        else if (lens[i] < 0)
            pl__fmt(res[i].err, sizeof res[i].err, "%s",
                    msgs[i] ? msgs[i] : pl_strerror((int)lens[i]));
    }
    for (int64_t i = 0; msgs && i < n; i++) free(msgs[i]);
    free(msgs);
    free(lens);
}

/* Parse and tokenize documents idx[0..n) into res[0..n) (no lock held):
 * the texts of every document (pl__record_text) go to one encode_batch
 * call, and a document's ids are its texts' ids joined.  Instruction data
 * keeps the ids of texts not trained on as -1 - id (the marked form). */
static void pl__tokenize_here(pl_source *src, const int64_t *idx, int64_t n,
                              pl__tres *res) {
    pl__text *t = src->text;
    pl__segv v = {0};
    int64_t *first = pl__calloc((size_t)n + 1, sizeof *first); /* texts of doc i */
    int64_t *slot = pl__calloc((size_t)n, sizeof *slot);
    int32_t **ids = NULL;
    int64_t *counts = NULL;
    int64_t m = 0; /* documents to encode, their texts packed at the front */
    int oom = !first || !slot;
    for (int64_t i = 0; i < n && !oom; i++) {
        int64_t r;
        const pl__sfile *f = pl__tlocate(src, idx[i], &r);
        res[i].ids = NULL;
        res[i].len = 0;
        int64_t at = v.n;
        res[i].rc = pl__record_text(src, f, r, &v, res[i].err, sizeof res[i].err);
        if (res[i].rc == PL_OK) {
            first[m] = at;
            slot[m++] = i;
        }
    }
    if (!oom) {
        first[m] = v.n;
        ids = pl__calloc((size_t)(v.n ? v.n : 1), sizeof *ids);
        counts = pl__calloc((size_t)(v.n ? v.n : 1), sizeof *counts);
        oom = !ids || !counts;
    }
    if (oom) {
        for (int64_t i = 0; i < n; i++) {
            res[i].rc = PL_ENOMEM;
            res[i].ids = NULL;
            res[i].len = 0;
            pl__fmt(res[i].err, sizeof res[i].err, "source %s: out of memory",
                    src->name);
        }
        goto out;
    }
    int rc = v.n ? t->tok.encode_batch(t->tok.ctx, v.n, (const char *const *)v.text,
                                       v.len, ids, counts, res[slot[0]].err,
                                       sizeof res[slot[0]].err)
                 : PL_OK;
    if (rc && m > 1) {
        /* Find which document the tokenizer refused: one at a time. */
        for (int64_t j = 0; j < m; j++) {
            pl__tres *q = &res[slot[j]];
            int64_t a = first[j], k = first[j + 1] - a;
            q->rc = k ? t->tok.encode_batch(t->tok.ctx, k, (const char *const *)&v.text[a],
                                            &v.len[a], &ids[a], &counts[a], q->err,
                                            sizeof q->err)
                      : PL_OK;
            if (q->rc)
                for (int64_t x = a; x < a + k; x++) ids[x] = NULL, counts[x] = 0;
        }
    } else if (rc) {
        res[slot[0]].rc = rc;
        for (int64_t x = 0; x < v.n; x++) ids[x] = NULL, counts[x] = 0;
    }
    for (int64_t j = 0; j < m; j++) {
        pl__tres *q = &res[slot[j]];
        int64_t r;
        const pl__sfile *f = pl__tlocate(src, idx[slot[j]], &r);
        const int64_t a = first[j], b = first[j + 1];
        if (q->rc) {
            char tmp[PL__ERRMSG_CAP];
            pl__fmt(tmp, sizeof tmp, "%s: record %lld: tokenizer %s: %s", f->path,
                    (long long)r, t->tok.name ? t->tok.name : "", q->err);
            memcpy(q->err, tmp, sizeof tmp);
            continue;
        }
        int64_t c = 0, trained = 0;
        for (int64_t x = a; x < b; x++) c += counts[x];
        int32_t *w = malloc((size_t)(c + 1) * sizeof *w);
        if (!w) {
            q->rc = PL_ENOMEM;
            pl__fmt(q->err, sizeof q->err, "out of memory");
            continue;
        }
        c = 0;
        int last_train = 1;
        for (int64_t x = a; x < b; x++) {
            for (int64_t k = 0; k < counts[x] && !q->rc; k++) {
                int32_t id = ids[x][k];
                if (id < 0 || (t->tok.vocab_size > 0 && id >= t->tok.vocab_size)) {
                    q->rc = PL_ERECORD;
                    pl__fmt(q->err, sizeof q->err,
                            "%s: record %lld: tokenizer %s gave id %d outside its "
                            "vocabulary of %lld",
                            f->path, (long long)r, t->tok.name ? t->tok.name : "",
                            (int)id, (long long)t->tok.vocab_size);
                }
                w[c++] = v.train[x] || !t->masked ? id : -1 - id;
            }
            if (counts[x]) last_train = v.train[x];
            if (v.train[x]) trained += counts[x];
        }
        if (!q->rc && t->add_eos) /* the eos is trained where the text before it is */
            w[c++] = last_train || !t->masked ? (int32_t)t->eos_id : -1 - (int32_t)t->eos_id;
        if (!q->rc && t->masked && trained == 0) {
            q->rc = PL_ERECORD;
            pl__fmt(q->err, sizeof q->err,
                    "%s: line %lld (byte offset %llu): the tokenizer gives no "
                    "tokens to train on (the %s is empty once tokenized)",
                    f->path, (long long)pl__line_of(src, f, f->spans[2 * r]),
                    (unsigned long long)f->spans[2 * r],
                    t->prompt_key ? "response" : "assistant content");
        }
        if (!q->rc && c == 0 && src->type == PL_SOURCE_PARQUET) {
            q->rc = PL_ERECORD;
            pl__fmt(q->err, sizeof q->err,
                    "%s: row %lld: the tokenizer gives no tokens (empty document)",
                    f->path, (long long)r);
        } else if (!q->rc && c == 0) {
            q->rc = PL_ERECORD;
            pl__fmt(q->err, sizeof q->err,
                    "%s: %s %lld (byte offset %llu): the tokenizer gives no "
                    "tokens (empty document)",
                    f->path, src->type == PL_SOURCE_JSONL ? "line" : "file",
                    (long long)pl__line_of(src, f, f->spans[2 * r]),
                    (unsigned long long)f->spans[2 * r]);
        }
        if (q->rc) {
            free(w);
            continue;
        }
        q->ids = w;
        q->len = c;
    }
    atomic_fetch_add(&t->tokenized, (long long)n);
out:
    for (int64_t x = 0; ids && x < v.n; x++) free(ids[x]);
    pl__seg_pop_to(&v, 0);
    free(v.text);
    free(v.len);
    free(v.owned);
    free(v.train);
    free(first);
    free(slot);
    free(ids);
    free(counts);
    pl__heap_trim_soon(); /* what the tokenizer freed goes back (at most 10/s) */
}

typedef struct {
    pl_source *src;
    const int64_t *idx;
    int64_t n;
    pl__tres *res;
} pl__tokjob_args;

/* CPU time of the calling thread in nanoseconds (0 where the clock is
 * missing). */
static int64_t pl__thread_cpu_ns(void) {
    struct timespec ts;
    if (clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts) != 0) return 0;
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static void pl__tokenize_job(void *arg) {
    pl__tokjob_args *a = arg;
    int64_t c0 = pl__thread_cpu_ns();
    pl__tokenize_here(a->src, a->idx, a->n, a->res);
    int64_t c1 = pl__thread_cpu_ns();
    if (c1 > c0) atomic_fetch_add(&a->src->text->tokenize_cpu_ns, (long long)(c1 - c0));
}

/* pl__tokenize_here on the process's tokenize pool where it has one
 * (pl_set_tokenize_threads: on the thread of the source's tokenizer file),
 * else on this thread; lengths-only sources ask their lengths function. */
static void pl__tokenize(pl_source *src, const int64_t *idx, int64_t n,
                         pl__tres *res) {
    if (src->text->lengths_fn) {
        pl__remote_lengths(src, idx, n, res);
        return;
    }
    pl__tokjob_args a = {src, idx, n, res};
    pl__tokpool_run(pl__tokref_key(&src->text->tok), pl__tokenize_job, &a);
}

static void *pl__worker(void *arg) {
    pl_source *src = arg;
    pl__text *t = src->text;
    pl__tentry *batch[PL__BATCH_DOCS];
    int64_t idx[PL__BATCH_DOCS];
    pl__tres *res = malloc(PL__BATCH_DOCS * sizeof *res);
    pthread_mutex_lock(&t->mu);
    while (res) {
        while (!t->stop && !t->qhead) pthread_cond_wait(&t->work_cv, &t->mu);
        if (t->stop) break;
        int64_t n = 0;
        uint64_t bytes = 0;
        while (t->qhead && n < PL__BATCH_DOCS && bytes < PL__BATCH_BYTES) {
            pl__tentry *e = t->qhead;
            t->qhead = e->qnext;
            if (!t->qhead) t->qtail = NULL;
            e->inq = 0;
            e->qnext = NULL;
            if (e->state != PL__T_QUEUED) continue; /* a reader took it */
            e->state = PL__T_RUNNING;
            int64_t r;
            const pl__sfile *f = pl__tlocate(src, e->index, &r);
            bytes += f->spans ? f->spans[2 * r + 1] - f->spans[2 * r] : 4096;
            batch[n] = e;
            idx[n++] = e->index;
        }
        if (!n) continue;
        pthread_mutex_unlock(&t->mu);
        pl__tokenize(src, idx, n, res);
        pthread_mutex_lock(&t->mu);
        for (int64_t i = 0; i < n; i++)
            pl__finish(t, batch[i], res[i].rc, res[i].err, res[i].ids, res[i].len);
        int64_t *due = pl__len_due(src, 0);
        if (due) {
            pthread_mutex_unlock(&t->mu);
            pl__len_write(src, due);
            free(due);
            pthread_mutex_lock(&t->mu);
        }
    }
    pthread_mutex_unlock(&t->mu);
    free(res);
    return NULL;
}

int pl__text_start(pl_source *src, char *err, size_t errcap) {
    pl__text *t = src->text;
    if (t->lc_key && t->lc_policy == PL_INDEX_WRITE && src->n_docs > 0) {
        t->learned = malloc((size_t)src->n_docs * sizeof *t->learned);
        if (!t->learned) {
            pl__fmt(err, errcap, "out of memory");
            return PL_ENOMEM;
        }
        for (int64_t i = 0; i < src->n_files; i++) {
            const pl__sfile *f = &src->files[i];
            for (int64_t r = 0; r < f->n_docs; r++) {
                t->learned[f->first_doc + r] = -1;
                t->lc_known += f->cached_len && f->cached_len[r] >= 0;
            }
        }
    }
    t->threads = pl__calloc((size_t)t->nthreads, sizeof *t->threads);
    if (!t->threads) {
        pl__fmt(err, errcap, "out of memory");
        return PL_ENOMEM;
    }
    for (int i = 0; i < t->nthreads; i++) {
        if (pthread_create(&t->threads[i], NULL, pl__worker, src) != 0) {
            pl__fmt(err, errcap, "source %s: cannot start tokenizer thread",
                    src->name);
            return PL_ENOMEM;
        }
        t->started = i + 1;
    }
    return PL_OK;
}

void pl__text_free(pl_source *src) {
    pl__text *t = src->text;
    if (!t) return;
    pthread_mutex_lock(&t->mu);
    t->stop = 1;
    pthread_cond_broadcast(&t->work_cv);
    pthread_mutex_unlock(&t->mu);
    for (int i = 0; i < t->started; i++) pthread_join(t->threads[i], NULL);
    free(t->threads);
    int64_t *due = pl__len_due(src, 1);
    if (due) pl__len_write(src, due);
    free(due);
    free(t->learned);
    while (t->oldest) pl__remove(t, t->oldest);
    free(t->buckets);
    if (t->have_tok && t->tok.destroy) t->tok.destroy(t->tok.ctx);
    free(t->text_key);
    free(t->prompt_key);
    free(t->response_key);
    free(t->messages_key);
    for (int k = 0; k < 3; k++) free(t->chat_pre[k]), free(t->chat_suf[k]);
    pthread_mutex_destroy(&t->mu);
    pthread_mutex_destroy(&t->pq_mu);
    pthread_cond_destroy(&t->work_cv);
    pthread_cond_destroy(&t->done_cv);
    free(t);
    src->text = NULL;
}

size_t pl__text_sizeof(const pl_source *src) {
    pl__text *t = src->text;
    if (!t) return 0;
    size_t n = sizeof *t + t->spans_bytes + t->nbuckets * sizeof(void *);
    pthread_mutex_lock(&((pl__text *)t)->mu);
    n += (size_t)t->bytes;
    if (t->learned) n += (size_t)src->n_docs * sizeof *t->learned;
    pthread_mutex_unlock(&((pl__text *)t)->mu);
    pthread_mutex_lock(&((pl__text *)t)->pq_mu);
    n += (size_t)t->pq_bytes;
    pthread_mutex_unlock(&((pl__text *)t)->pq_mu);
    for (int64_t i = 0; i < src->n_files; i++) n += src->files[i].text_len;
    return n;
}

/* With the lock held: the entry of `index`, finished (tokenized by this
 * thread if nobody else is at it), with waiters raised (the caller lowers
 * it).  NULL when out of memory. */
static pl__tentry *pl__acquire(pl_source *src, int64_t index) {
    pl__text *t = src->text;
    pl__tentry *e = pl__find(t, index);
    if (!e) {
        e = pl__insert(t, index, PL__T_RUNNING);
        if (!e) return NULL;
    } else if (e->state == PL__T_QUEUED && !t->started) {
        e->state = PL__T_RUNNING; /* taken over; the worker skips it */
    } else {
        /* Queued ones are left to the tokenizer threads, which take the queue in
           the planner's order: the one asked for is at its head.  Tokenizing it
           here instead would cost more than the wait (tokenizers' BPE cache is
           per thread, so a second thread repeats merges the first had cached). */
        e->waiters++;
        while (e->state != PL__T_READY) pthread_cond_wait(&t->done_cv, &t->mu);
        return e;
    }
    e->waiters++;
    pthread_mutex_unlock(&t->mu);
    pl__tres *res = malloc(sizeof *res);
    if (res) pl__tokenize(src, &index, 1, res);
    pthread_mutex_lock(&t->mu);
    if (!res) pl__finish(t, e, PL_ENOMEM, "out of memory", NULL, 0);
    else pl__finish(t, e, res->rc, res->err, res->ids, res->len);
    free(res);
    return e;
}

int pl__text_length(pl_source *src, const pl__sfile *f, int64_t r,
                    int64_t *length, char *err, size_t errcap) {
    pl__text *t = src->text;
    if (f->cached_len && f->cached_len[r] >= 0) {
        *length = f->cached_len[r];
        return PL_OK;
    }
    pthread_mutex_lock(&t->mu);
    pl__tentry *e = pl__acquire(src, f->first_doc + r);
    int rc;
    if (!e) {
        rc = PL_ENOMEM;
        pl__fmt(err, errcap, "source %s: out of memory", src->name);
    } else {
        rc = e->rc;
        *length = rc ? 0 : e->len;
        if (rc) pl__fmt(err, errcap, "%s", e->err ? e->err : "error");
        e->waiters--;
    }
    pthread_mutex_unlock(&t->mu);
    return rc;
}

int pl__text_read(pl_source *src, int64_t index, int64_t offset,
                  int64_t count, void *out, pl_dtype out_dtype, int marked,
                  char *err, size_t errcap) {
    pl__text *t = src->text;
    if (index < 0 || index >= src->n_docs) {
        pl__fmt(err, errcap, "source %s: document index %lld out of range [0, %lld)",
                src->name, (long long)index, (long long)src->n_docs);
        return PL_ERANGE;
    }
    if (t->lengths_fn) {
        pl__fmt(err, errcap, "source %s holds lengths only (the tokens are read "
                             "from its source loaders)",
                src->name);
        return PL_EINVAL;
    }
    pthread_mutex_lock(&t->mu);
    pl__tentry *e = pl__acquire(src, index);
    int rc = PL_OK;
    if (!e) {
        pthread_mutex_unlock(&t->mu);
        pl__fmt(err, errcap, "source %s: out of memory", src->name);
        return PL_ENOMEM;
    }
    e->waiters--;
    if (e->rc) {
        rc = e->rc;
        pl__fmt(err, errcap, "%s", e->err ? e->err : "error");
    } else if (offset < 0 || count < 0 || offset > e->len ||
               count > e->len - offset) {
        pl__fmt(err, errcap,
                "source %s: document %lld: tokens [%lld, %lld + %lld) are "
                "outside the document's %lld tokens",
                src->name, (long long)index, (long long)offset,
                (long long)offset, (long long)count, (long long)e->len);
        rc = PL_ERANGE;
    } else {
        pl__tokens_convert(e->ids + offset, PL_DTYPE_INT32, out, out_dtype, count);
        /* Instruction data keeps the marked form (untrained tokens as
           -1 - id); plain reads give the ids. */
        for (int64_t k = 0; t->masked && !marked && k < count; k++) {
            if (out_dtype == PL_DTYPE_INT64) {
                int64_t *o = out;
                if (o[k] < 0) o[k] = -1 - o[k];
            } else {
                int32_t *o = out;
                if (o[k] < 0) o[k] = -1 - o[k];
            }
        }
        /* Read up to its last token: the document has been used. */
        if (offset + count == e->len && count > 0 && !e->waiters && !e->inq)
            pl__remove(t, e);
    }
    pthread_mutex_unlock(&t->mu);
    return rc;
}

int pl_source_release_tokenizer(pl_source *src) {
    if (!src) return PL_EINVAL;
    pl__text *t = src->text;
    if (!t || !t->have_tok) return PL_OK;
    return pl__tokref_release(&t->tok) < 0 ? PL_EINVAL : PL_OK;
}

int pl_source_tokenizer_state(const pl_source *src, int64_t *loads, int64_t *shared_by) {
    if (loads) *loads = 0;
    if (shared_by) *shared_by = 0;
    if (!src || !src->text || !src->text->have_tok) return -1;
    return pl__tokref_state(&src->text->tok, loads, shared_by);
}

/* ------------------------------------------------------------ lookahead */

int pl__source_is_lazy(const pl_source *src) {
    return src && src->text && src->text->started;
}

void pl__source_lookahead(pl_source *src, const pl__perm *perm, int64_t lo,
                          int64_t n, int64_t epoch, int64_t pos) {
    pl__text *t = src->text;
    if (!t || !t->started) return;
    pthread_mutex_lock(&t->mu);
    if (!t->la_valid || t->la_epoch != epoch || pos < t->la_last ||
        t->la_lo != lo || t->la_ordered != (perm == NULL)) {
        t->la_ordered = perm == NULL;
        if (perm) t->la_perm = *perm;
        t->la_lo = lo;
        t->la_n = perm ? (int64_t)perm->n : n;
        if (t->la_lo < 0 || t->la_lo > src->n_docs) t->la_lo = 0, t->la_n = 0;
        if (t->la_n > src->n_docs - t->la_lo) t->la_n = src->n_docs - t->la_lo;
        t->la_epoch = epoch;
        t->la_next = pos;
        t->la_valid = 1;
    }
    t->la_last = pos;
    if (t->la_next < pos) t->la_next = pos;
    /* The window opens gradually (16 documents, then two more per document
       drawn), so the first steps wait for their own documents, not for a
       whole window of every source. */
    int64_t window = 16 + 2 * t->la_draws++;
    if (window > t->lookahead) window = t->lookahead;
    if (t->la_next - pos <= window / 2) {
        int64_t end = pos + window;
        if (end > t->la_n) end = t->la_n;
        int queued = 0;
        for (; t->la_next < end; t->la_next++) {
            int64_t idx = t->la_lo + (t->la_ordered ? t->la_next
                                                    : (int64_t)pl__perm_apply(
                                                          &t->la_perm,
                                                          (uint64_t)t->la_next));
            if (pl__find(t, idx)) continue;
            pl__tentry *e = pl__insert(t, idx, PL__T_QUEUED);
            if (!e) break;
            e->inq = 1;
            if (t->qtail) t->qtail->qnext = e;
            else t->qhead = e;
            t->qtail = e;
            queued = 1;
        }
        if (queued) pthread_cond_broadcast(&t->work_cv);
    }
    pthread_mutex_unlock(&t->mu);
}

int64_t pl_source_num_tokenized(const pl_source *src) {
    return src && src->text ? (int64_t)atomic_load(&src->text->tokenized) : 0;
}

int64_t pl_source_tokenize_cpu_ns(const pl_source *src) {
    return src && src->text ? (int64_t)atomic_load(&src->text->tokenize_cpu_ns) : 0;
}

/* ------------------------------------------------------------ many lengths */

int pl_source_lengths(pl_source *src, const int64_t *index, int64_t n,
                      int64_t *lengths) {
    if (!src || n < 0 || (n > 0 && (!index || !lengths))) return PL_EINVAL;
    char err[PL__ERRMSG_CAP];
    for (int64_t i = 0; i < n; i++)
        if (index[i] < 0 || index[i] >= src->n_docs) {
            pl__fmt(err, sizeof err,
                    "source %s: document index %lld out of range [0, %lld)",
                    src->name, (long long)index[i], (long long)src->n_docs);
            pl__source_set_err(src, err);
            return PL_ERANGE;
        }
    pl__text *t = src->text;
    if (!t) {
        for (int64_t i = 0; i < n; i++) {
            int64_t len = 0;
            int rc = pl__source_length(src, index[i], &len, err, sizeof err);
            if (rc == PL_ENOMEM) return rc;
            lengths[i] = rc ? rc : len;
        }
        return PL_OK;
    }
    /* Claim the documents nobody holds or is at (queued ones are taken over),
       tokenize them in batches here, then collect every answer. */
    pl__tentry **mine = pl__calloc((size_t)(n ? n : 1), sizeof *mine);
    int64_t *idx = pl__calloc((size_t)(n ? n : 1), sizeof *idx);
    pl__tres *res = malloc(PL__BATCH_DOCS * sizeof *res);
    if (!mine || !idx || !res) {
        free(mine);
        free(idx);
        free(res);
        return PL_ENOMEM;
    }
    int64_t m = 0;
    int rc = PL_OK;
    pthread_mutex_lock(&t->mu);
    for (int64_t i = 0; i < n; i++) {
        if (pl__len_cached(src, index[i]) >= 0) continue;
        pl__tentry *e = pl__find(t, index[i]);
        if (!e) {
            e = pl__insert(t, index[i], PL__T_RUNNING);
            if (!e) {
                rc = PL_ENOMEM;
                break;
            }
        } else if (e->state == PL__T_QUEUED) {
            e->state = PL__T_RUNNING;
        } else {
            continue;
        }
        e->waiters++;
        mine[m] = e;
        idx[m++] = index[i];
    }
    pthread_mutex_unlock(&t->mu);
    for (int64_t b = 0; b < m; b += PL__BATCH_DOCS) {
        int64_t k = m - b < PL__BATCH_DOCS ? m - b : PL__BATCH_DOCS;
        pl__tokenize(src, idx + b, k, res);
        pthread_mutex_lock(&t->mu);
        for (int64_t j = 0; j < k; j++) {
            pl__finish(t, mine[b + j], res[j].rc, res[j].err, res[j].ids, res[j].len);
            mine[b + j]->waiters--;
        }
        pthread_mutex_unlock(&t->mu);
    }
    pthread_mutex_lock(&t->mu);
    for (int64_t i = 0; i < n && rc == PL_OK; i++) {
        int64_t cl = pl__len_cached(src, index[i]);
        if (cl >= 0) {
            lengths[i] = cl;
            continue;
        }
        pl__tentry *e = pl__find(t, index[i]);
        if (!e) { /* dropped already (the cache is small): once more */
            e = pl__acquire(src, index[i]);
            if (!e) {
                rc = PL_ENOMEM;
                break;
            }
        } else {
            e->waiters++;
            while (e->state != PL__T_READY) pthread_cond_wait(&t->done_cv, &t->mu);
        }
        lengths[i] = e->rc ? e->rc : e->len;
        e->waiters--;
    }
    pthread_mutex_unlock(&t->mu);
    free(mine);
    free(idx);
    free(res);
    return rc;
}
