/*
 * source/wds.c -- WebDataset image-text sources (PL_SOURCE_WEBDATASET).
 *
 * Opening a shard reads its tar headers with pread(2) (POSIX ustar, with GNU
 * long names 'L' and pax 'x' path/size records; checksums verified), groups
 * consecutive members by key as webdataset does (the member name up to the
 * first '.' of its last path component), and for each sample reads only the
 * image's header (image.c: width and height, no decode) and the caption,
 * which it tokenizes (byte tokens, or token ids stored in a JSON field).
 * The result is the shard's index: 48-byte records plus the caption tokens,
 * held in a "<shard>.plwds" sidecar (written once, atomically, then mapped
 * and watched like a .plidx) or in anonymous memory.  A sidecar is reused
 * while the shard's size and mtime and the hash of the options that shape
 * the index (caption key, token offset, pixel limit, skip policy) match, and
 * its CRC-32 is right; otherwise it is rebuilt.
 *
 * A document is a sample as tokens: token_id repeated for the image's visual
 * tokens, then the caption, then eos_id when one is set.  Its length is
 * computed from the record (visual tokens depend on the mode: see
 * polyload.h), so the planner needs nothing but the index.  Pixels are read
 * with pread from the shard's descriptor (kept from open) and decoded per
 * call (pl_source_read_image).
 *
 * Bad samples: an image member whose header is not an image of its
 * extension, a truncated header, dimensions above limit_pixels, a sample
 * without caption or without image, a sample with a second image or caption
 * member (webdataset refuses a repeated extension), a member whose key held
 * a dot (img.0002.jpg: key img, extension 0002.jpg, neither an image nor the
 * caption) in a sample left without image or caption.  With on_error: fail the open fails
 * with a message naming shard, member and byte offset; with skip (the
 * config's on_error: skip) the sample is left out and counted
 * (pl_source_num_skipped).  A damaged tar (bad checksum, size field, a
 * member past the end of the file) always fails: the reader cannot know
 * where the next member starts.
 */
#include "source/image.h"
#include "source/source.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <glob.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#define PL__WDS_MAGIC "PLWDS\0\0\0"
#define PL__WDS_VERSION 1u
#define PL__WDS_HEADER 64
#define PL__WDS_REC 48
#define PL__WDS_PROBE 65536
/* Bytes of a remote shard made present at once while its headers are read. */
#define PL__WDS_WINDOW ((int64_t)16 << 20)
/* Caption members and JSON objects larger than this are refused. */
#define PL__WDS_MAX_CAPTION ((int64_t)1 << 24)

/* ------------------------------------------------------------ options */

/* The source's state (src->state). */
typedef struct pl__wds {
    pl_image_options o;
    int skip;   /* on_error: skip */
    int verify; /* decode every image when the index is built */
    atomic_llong replaced; /* images replaced by blank ones at decode time */
} pl__wds;

/* A shard: the common record (the index is idx_map: records, then caption
 * tokens), its descriptor and its caption token count. */
typedef struct pl__wfile {
    pl__sfile base;
    int fd1;          /* the shard's descriptor + 1 */
    int64_t n_tokens; /* caption tokens in the index */
} pl__wfile;

int pl__wds_defaults(pl_image_options *o, char *err, size_t errcap, const char *name) {
    if (!o->mode) o->mode = PL_IMAGE_FIXED;
    if (o->mode != PL_IMAGE_FIXED && o->mode != PL_IMAGE_NATIVE) {
        pl__fmt(err, errcap, "source %s: image mode %d is not fixed or native", name,
                (int)o->mode);
        return PL_EINVAL;
    }
    if (!o->size) o->size = 336;
    if (!o->patch_size) o->patch_size = 14;
    if (!o->merge_size) o->merge_size = o->mode == PL_IMAGE_NATIVE ? 2 : 1;
    if (!o->min_pixels) o->min_pixels = 56 * 56;
    if (!o->max_pixels) o->max_pixels = 28 * 28 * 1280;
    if (!o->limit_pixels) o->limit_pixels = (int64_t)1 << 27;
    if (!o->caption_key[0]) memcpy(o->caption_key, "txt", 4);
    o->caption_key[sizeof o->caption_key - 1] = '\0';
    const int64_t f = o->patch_size * o->merge_size;
    if (o->patch_size < 1 || o->patch_size > 1024 || o->merge_size < 1 ||
        o->merge_size > 64 || o->size < 1 || o->size > 16384 || o->min_pixels < 1 ||
        o->max_pixels < o->min_pixels || o->max_pixels > ((int64_t)1 << 30) ||
        o->limit_pixels < 1 || o->token_id < 0 || o->caption_token_offset < 0 ||
        o->caption_token_offset > UINT32_MAX - 255 ||
        (o->mode == PL_IMAGE_FIXED && o->size % f)) {
        pl__fmt(err, errcap,
                "source %s: image options out of range (size %lld must be a multiple "
                "of patch_size %lld * merge_size %lld; token_id %lld must be set)",
                name, (long long)o->size, (long long)o->patch_size,
                (long long)o->merge_size, (long long)o->token_id);
        return PL_EINVAL;
    }
    if (strcmp(o->caption_key, "txt") && strncmp(o->caption_key, "json:", 5)) {
        pl__fmt(err, errcap, "source %s: caption key '%s' is not txt or json:FIELD",
                name, o->caption_key);
        return PL_EINVAL;
    }
    return PL_OK;
}

static uint64_t wds_opthash(const pl__wds *w) {
    int64_t v[4] = {w->o.caption_token_offset, w->o.limit_pixels, w->skip, 1};
    /* verify joins the hash only when set: sidecars built without it stay valid */
    uint64_t h = pl__hash64(v, (w->verify ? 4 : 3) * sizeof v[0], 0x706c776473ULL);
    return pl__hash64(w->o.caption_key, strlen(w->o.caption_key), h);
}

/* ------------------------------------------------------------ paths */

#define PL__MAX_BRACE 1000000

/*
 * Expand the first brace group of pat (numeric range {a..b}, zero padding
 * of the longer bound kept, or a list {x,y,z}) recursively into out.
 */
static int s_brace(const char *pat, pl__paths *out, size_t *budget) {
    const char *lb = strchr(pat, '{');
    const char *rb = lb ? strchr(lb, '}') : NULL;
    if (!lb || !rb) {
        if (*budget == 0) return PL_ECONFIG;
        (*budget)--;
        return pl__paths_add(out, pat, strlen(pat));
    }
    size_t pre = (size_t)(lb - pat), inner = (size_t)(rb - lb - 1);
    char body[256];
    if (inner >= sizeof body) return PL_ECONFIG;
    memcpy(body, lb + 1, inner);
    body[inner] = '\0';
    const char *rest = rb + 1;
    size_t cap = strlen(pat) + 64;
    char *buf = pl__malloc(cap + 256);
    if (!buf) return PL_ENOMEM;
    int rc = PL_OK;
    char *dots = strstr(body, "..");
    long long a, b;
    char *e1, *e2;
    if (dots && (a = strtoll(body, &e1, 10), e1 == dots) &&
        (b = strtoll(dots + 2, &e2, 10), *e2 == '\0' && e2 != dots + 2)) {
        int width = (int)(dots - body) > (int)strlen(dots + 2) ? (int)(dots - body)
                                                               : (int)strlen(dots + 2);
        if (body[0] != '0' && dots[2] != '0') width = 0;
        long long step = a <= b ? 1 : -1;
        for (long long k = a; rc == PL_OK; k += step) {
            int n = snprintf(buf, cap + 256, "%.*s%0*lld%s", (int)pre, pat, width, k, rest);
            rc = n < 0 || (size_t)n >= cap + 256 ? PL_ECONFIG : s_brace(buf, out, budget);
            if (k == b) break;
        }
    } else {
        const char *s = body;
        for (;;) {
            const char *c = strchr(s, ',');
            size_t len = c ? (size_t)(c - s) : strlen(s);
            int n = snprintf(buf, cap + 256, "%.*s%.*s%s", (int)pre, pat, (int)len, s, rest);
            rc = n < 0 || (size_t)n >= cap + 256 ? PL_ECONFIG : s_brace(buf, out, budget);
            if (rc || !c) break;
            s = c + 1;
        }
    }
    free(buf);
    return rc;
}

static int s_ends(const char *s, const char *suf) {
    size_t n = strlen(s), m = strlen(suf);
    return n >= m && strcmp(s + n - m, suf) == 0;
}

static int is_shard(const char *p) {
    struct stat st;
    return !s_ends(p, ".plwds") && !strstr(p, ".plwds.tmp.") && stat(p, &st) == 0 &&
           S_ISREG(st.st_mode);
}

static int cmp(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* The shards of remote pattern p (one name of a brace expansion when braced):
 * a name from braces is taken as one object (its HEAD at open says whether
 * it exists: a range of a thousand shards costs no listing each), a glob's
 * matches and a directory's .tar objects from a listing of the bucket. */
static int remote_shards(const char *p, int braced, pl__paths *files, char *err,
                         size_t errcap) {
    size_t n = strlen(p);
    const int glob = strpbrk(p, "*?[") != NULL;
    if (braced && !glob && n && p[n - 1] != '/') return pl__paths_add(files, p, n);
    char **urls;
    int64_t nu;
    int rc = pl__remote_expand(p, 0, &urls, &nu, err, errcap);
    if (rc) return rc;
    const int dir = !glob && !(nu == 1 && strcmp(urls[0], p) == 0);
    for (int64_t i = 0; i < nu; i++) {
        if (rc == PL_OK && (!dir || s_ends(urls[i], ".tar")))
            rc = pl__paths_add(files, urls[i], strlen(urls[i]));
        free(urls[i]);
    }
    free(urls);
    return rc;
}

/* Shards of `path`, sorted and unique. */
static int wds_expand(const char *path, pl__paths *files, char *err, size_t errcap) {
    pl__paths pats = {0};
    size_t budget = PL__MAX_BRACE;
    int rc = s_brace(path, &pats, &budget);
    if (rc) {
        pl__paths_free(&pats);
        pl__fmt(err, errcap, "%s: %s", path,
                rc == PL_ENOMEM ? "out of memory expanding braces"
                                : "brace pattern too long or expands to over 1e6 names");
        return rc;
    }
    for (int64_t i = 0; i < pats.n && rc == PL_OK; i++) {
        const char *p = pats.v[i];
        struct stat st;
        if (pl__remote_is_url(p)) {
            rc = remote_shards(p, strchr(path, '{') != NULL, files, err, errcap);
        } else if (strpbrk(p, "*?[")) {
            glob_t g;
            memset(&g, 0, sizeof g);
            if (glob(p, 0, NULL, &g) == 0)
                for (size_t k = 0; k < g.gl_pathc && rc == PL_OK; k++)
                    if (is_shard(g.gl_pathv[k]))
                        rc = pl__paths_add(files, g.gl_pathv[k], strlen(g.gl_pathv[k]));
            globfree(&g);
        } else if (stat(p, &st) == 0 && S_ISDIR(st.st_mode)) {
            DIR *d = opendir(p);
            struct dirent *de;
            char full[4096];
            while (d && rc == PL_OK && (de = readdir(d)) != NULL) {
                if (!s_ends(de->d_name, ".tar")) continue;
                pl__fmt(full, sizeof full, "%s/%s", p, de->d_name);
                if (is_shard(full)) rc = pl__paths_add(files, full, strlen(full));
            }
            if (d) closedir(d);
        } else if (stat(p, &st) == 0) {
            rc = pl__paths_add(files, p, strlen(p));
        } else {
            pl__fmt(err, errcap, "%s: no such shard (from the pattern %s)", p, path);
            rc = PL_ENOENT;
        }
    }
    pl__paths_free(&pats);
    if (rc == PL_ENOMEM) pl__fmt(err, errcap, "%s: out of memory", path);
    if (rc) return rc;
    if (files->n == 0) {
        pl__fmt(err, errcap, "%s: no shard matches", path);
        return PL_ENOENT;
    }
    qsort(files->v, (size_t)files->n, sizeof *files->v, cmp);
    int64_t k = 1;
    for (int64_t i = 1; i < files->n; i++) {
        if (strcmp(files->v[i], files->v[k - 1]) == 0)
            free(files->v[i]);
        else
            files->v[k++] = files->v[i];
    }
    files->n = k;
    return PL_OK;
}

/* ------------------------------------------------------------ reading */

/* Read len bytes at off exactly.  PL_ETRUNC on a short read, PL_EIO. */
static int pread_local(int fd, void *buf, size_t len, int64_t off, const char *path,
                       char *err, size_t errcap) {
    size_t got = 0;
    while (got < len) {
        ssize_t k = pread(fd, (uint8_t *)buf + got, len - got, (off_t)(off + (int64_t)got));
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) {
            int e = errno;
            pl__fmt(err, errcap, "%s: read of %zu bytes at offset %lld: %s", path, len,
                    (long long)off, k == 0 ? "past the end of the file" : strerror(e));
            return k == 0 ? PL_ETRUNC : PL_EIO;
        }
        got += (size_t)k;
    }
    return PL_OK;
}

/* pread_local, or for a remote shard (rf) from its cache file (fd): the bytes
 * made present first and read again if they were evicted meanwhile
 * (pl__source_still); a failed fetch names the shard, the offset and the
 * cache's reason. */
static int pread_all(pl__rfile *rf, int fd, void *buf, size_t len, int64_t off,
                         const char *path, char *err, size_t errcap) {
    if (!rf || !len) return pread_local(fd, buf, len, off, path, err, errcap);
    for (int attempt = 0; attempt < PL__REMOTE_REREADS; attempt++) {
        char e[PL__ERRMSG_CAP];
        int rc = pl__rfile_ensure(rf, off, (int64_t)len, e, sizeof e);
        if (rc) {
            pl__fmt(err, errcap, "%s: read of %zu bytes at offset %lld: %s", path, len,
                    (long long)off, pl__remote_reason(e, path));
            return rc;
        }
        if ((rc = pread_local(fd, buf, len, off, path, err, errcap))) return rc;
        if (pl__rfile_present(rf, off, (int64_t)len)) return PL_OK;
    }
    pl__fmt(err, errcap,
            "%s: read of %zu bytes at offset %lld: evicted from the node cache while "
            "being read, %d times (cache.max_bytes is too small for the reads in flight)",
            path, len, (long long)off, PL__REMOTE_REREADS);
    return PL_EIO;
}

/* ------------------------------------------------------------ tar */

/* An octal (or GNU base-256) numeric field; -1 when malformed. */
static int64_t tar_num(const uint8_t *p, size_t n) {
    if (p[0] & 0x80) { /* base-256, big-endian, positive only */
        if (p[0] != 0x80) return -1;
        uint64_t v = 0;
        for (size_t i = 1; i < n; i++) {
            if (v >> 55) return -1;
            v = v << 8 | p[i];
        }
        return v > (uint64_t)INT64_MAX ? -1 : (int64_t)v;
    }
    size_t i = 0;
    while (i < n && p[i] == ' ') i++;
    int64_t v = 0;
    int digits = 0;
    for (; i < n && p[i] >= '0' && p[i] <= '7'; i++, digits++) {
        if (v >> 60) return -1;
        v = v * 8 + (p[i] - '0');
    }
    for (; i < n; i++)
        if (p[i] != ' ' && p[i] != '\0') return -1;
    return digits ? v : -1;
}

typedef struct pl__member {
    char name[4096];
    int64_t hdr_off, data_off, size;
} pl__member;

/* The builder's working state. */
typedef struct pl__wb {
    const char *path;
    int fd;
    pl__rfile *rf; /* a remote shard's object in the node cache, or NULL */
    int64_t file_size;
    const pl__wds *w;
    uint8_t *rec;
    size_t nrec, reccap;
    uint32_t *tok;
    size_t ntok, tokcap;
    int64_t skipped;
    uint8_t *buf;
    size_t bufcap;
    char *err;
    size_t errcap;
} pl__wb;

static int wb_buf(pl__wb *b, size_t n) {
    if (n <= b->bufcap) return PL_OK;
    uint8_t *nb = pl__realloc_array(b->buf, n, 1);
    if (!nb) {
        pl__fmt(b->err, b->errcap, "%s: out of memory for %zu bytes", b->path, n);
        return PL_ENOMEM;
    }
    b->buf = nb;
    b->bufcap = n;
    return PL_OK;
}

/*
 * The next regular-file member at *off (which moves past it).  PL_DONE at
 * the end of the archive; PL_ERECORD for a damaged header.
 */
static int tar_next(pl__wb *b, int64_t *off, pl__member *m) {
    char longname[4096];
    longname[0] = '\0';
    int64_t pax_size = -1;
    for (;;) {
        uint8_t h[512];
        if (*off + 512 > b->file_size) {
            if (*off == b->file_size) return PL_DONE; /* no end blocks: tolerated */
            pl__fmt(b->err, b->errcap,
                    "%s: tar header at offset %lld is cut by the end of the file "
                    "(%lld bytes)",
                    b->path, (long long)*off, (long long)b->file_size);
            return PL_ETRUNC;
        }
        int rc = PL_OK;
        if (b->rf && !pl__rfile_present(b->rf, *off, 512)) {
            /* A remote shard: the members ahead in one request, not a
               request per header. */
            int64_t w = b->file_size - *off < PL__WDS_WINDOW ? b->file_size - *off
                                                             : PL__WDS_WINDOW;
            char e[PL__ERRMSG_CAP];
            if ((rc = pl__rfile_ensure(b->rf, *off, w, e, sizeof e))) {
                pl__fmt(b->err, b->errcap, "%s: tar header at offset %lld: %s", b->path,
                        (long long)*off, pl__remote_reason(e, b->path));
                return rc;
            }
        }
        rc = pread_all(b->rf, b->fd, h, 512, *off, b->path, b->err, b->errcap);
        if (rc) return rc;
        int zero = 1;
        for (int i = 0; i < 512 && zero; i++) zero = h[i] == 0;
        if (zero) return PL_DONE;
        int64_t stored = tar_num(h + 148, 8);
        uint64_t sum = 0;
        int64_t ssum = 0;
        for (int i = 0; i < 512; i++) {
            uint8_t c = i >= 148 && i < 156 ? ' ' : h[i];
            sum += c;
            ssum += (int8_t)c;
        }
        if (stored < 0 || ((uint64_t)stored != sum && stored != ssum)) {
            pl__fmt(b->err, b->errcap,
                    "%s: tar header at offset %lld: checksum field %lld does not match "
                    "the header's %llu",
                    b->path, (long long)*off, (long long)stored, (unsigned long long)sum);
            return PL_ERECORD;
        }
        int64_t size = tar_num(h + 124, 12);
        if (pax_size >= 0) size = pax_size;
        if (size < 0) {
            pl__fmt(b->err, b->errcap, "%s: tar header at offset %lld: bad size field",
                    b->path, (long long)*off);
            return PL_ERECORD;
        }
        int64_t data = *off + 512;
        if (size > b->file_size - data) {
            pl__fmt(b->err, b->errcap,
                    "%s: tar member at offset %lld: size %lld runs past the end of the "
                    "file (%lld bytes)",
                    b->path, (long long)*off, (long long)size, (long long)b->file_size);
            return PL_ETRUNC;
        }
        int64_t next = data + (size + 511) / 512 * 512;
        char type = (char)h[156];
        if (type == 'L' || type == 'x') {
            if (size > (int64_t)sizeof longname * 4) {
                pl__fmt(b->err, b->errcap,
                        "%s: tar %s header at offset %lld holds %lld bytes", b->path,
                        type == 'L' ? "long-name" : "pax", (long long)*off,
                        (long long)size);
                return PL_ERECORD;
            }
            if ((rc = wb_buf(b, (size_t)size + 1))) return rc;
            if ((rc = pread_all(b->rf, b->fd, b->buf, (size_t)size, data, b->path, b->err,
                                    b->errcap)))
                return rc;
            b->buf[size] = '\0';
            if (type == 'L') {
                pl__fmt(longname, sizeof longname, "%s", (char *)b->buf);
            } else {
                /* Records "LEN key=value\n". */
                size_t at = 0;
                while (at < (size_t)size) {
                    char *sp;
                    long len = strtol((char *)b->buf + at, &sp, 10);
                    if (len <= 0 || (size_t)len > (size_t)size - at || *sp != ' ') {
                        pl__fmt(b->err, b->errcap,
                                "%s: pax header at offset %lld: bad record at byte %zu",
                                b->path, (long long)*off, at);
                        return PL_ERECORD;
                    }
                    char *kv = sp + 1, *end = (char *)b->buf + at + len - 1;
                    if (!strncmp(kv, "path=", 5) && end > kv + 5)
                        pl__fmt(longname, sizeof longname, "%.*s", (int)(end - kv - 5),
                                kv + 5);
                    else if (!strncmp(kv, "size=", 5))
                        pax_size = strtoll(kv + 5, NULL, 10);
                    at += (size_t)len;
                }
            }
            *off = next;
            continue;
        }
        *off = next;
        if (type != '0' && type != '\0' && type != '7') {
            longname[0] = '\0';
            pax_size = -1;
            continue; /* directories, links, global pax headers */
        }
        m->hdr_off = data - 512;
        m->data_off = data;
        m->size = size;
        if (longname[0]) {
            pl__fmt(m->name, sizeof m->name, "%s", longname);
        } else {
            char nm[101], pre[156];
            memcpy(nm, h, 100);
            nm[100] = '\0';
            memcpy(pre, h + 345, 155);
            pre[155] = '\0';
            if (!memcmp(h + 257, "ustar", 5) && pre[0])
                pl__fmt(m->name, sizeof m->name, "%s/%s", pre, nm);
            else
                pl__fmt(m->name, sizeof m->name, "%s", nm);
        }
        return PL_OK;
    }
}

/* Key and extension of a member name (webdataset's base_plus_ext). */
static void split_key(const char *name, size_t *keylen, const char **ext) {
    const char *base = strrchr(name, '/');
    base = base ? base + 1 : name;
    const char *dot = strchr(base, '.');
    if (!dot) {
        *keylen = strlen(name);
        *ext = name + *keylen;
    } else {
        *keylen = (size_t)(dot - name);
        *ext = dot + 1;
    }
}

/* ------------------------------------------------------------ samples */

typedef struct pl__sample {
    char key[4096];
    size_t keylen;
    int has_image, has_caption, fmt;
    int has_repeat, has_dotted; /* a second image or caption; see s_dotted */
    pl__member image, caption;
    pl__member repeat, dotted, *first; /* first: the member repeat repeats */
    int64_t first_off; /* header of the sample's first member */
} pl__sample;

static int push_tokens(pl__wb *b, const uint32_t *t, size_t n) {
    if (b->ntok + n > b->tokcap) {
        size_t nc = b->tokcap ? b->tokcap : 4096;
        while (nc < b->ntok + n) nc *= 2;
        uint32_t *nt = pl__realloc_array(b->tok, nc, sizeof *nt);
        if (!nt) return PL_ENOMEM;
        b->tok = nt;
        b->tokcap = nc;
    }
    memcpy(b->tok + b->ntok, t, n * sizeof *t);
    b->ntok += n;
    return PL_OK;
}

/* Byte tokens of UTF-8 text: the seam where a text tokenizer plugs in. */
static int tokenize_bytes(pl__wb *b, const uint8_t *s, size_t n) {
    uint32_t chunk[256];
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        chunk[k++] = (uint32_t)b->w->o.caption_token_offset + s[i];
        if (k == 256 || i + 1 == n) {
            if (push_tokens(b, chunk, k)) return PL_ENOMEM;
            k = 0;
        }
    }
    return PL_OK;
}

/* A bad sample: an error (fail) or counted (skip).  PL_OK means skipped. */
static int s_bad(pl__wb *b, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int s_bad(pl__wb *b, int code, const char *fmt, ...) {
    if (b->w->skip) {
        b->skipped++;
        return PL_OK;
    }
    va_list ap;
    va_start(ap, fmt);
    pl__vfmt(b->err, b->errcap, fmt, ap);
    va_end(ap);
    return code;
}

static int s_caption(pl__wb *b, const pl__sample *s, size_t *ntok, int *bad) {
    const pl__member *m = &s->caption;
    *bad = 0;
    if (m->size > PL__WDS_MAX_CAPTION) {
        *bad = 1;
        return s_bad(b, PL_ERECORD, "%s: member %s at offset %lld: caption of %lld bytes",
                       b->path, m->name, (long long)m->hdr_off, (long long)m->size);
    }
    int rc = wb_buf(b, (size_t)m->size + 1);
    if (rc) return rc;
    if ((rc = pread_all(b->rf, b->fd, b->buf, (size_t)m->size, m->data_off, b->path,
                        b->err, b->errcap)))
        return rc;
    b->buf[m->size] = '\0';
    size_t before = b->ntok;
    const char *key = b->w->o.caption_key;
    if (!strcmp(key, "txt")) {
        rc = tokenize_bytes(b, b->buf, (size_t)m->size);
    } else {
        json_error_t je;
        json_t *root = json_loadb((const char *)b->buf, (size_t)m->size, 0, &je);
        json_t *v = root && json_is_object(root) ? json_object_get(root, key + 5) : NULL;
        if (!root || !v || !(json_is_string(v) || json_is_array(v))) {
            *bad = 1;
            rc = s_bad(b, PL_ERECORD,
                         "%s: member %s at offset %lld: %s%s", b->path, m->name,
                         (long long)m->hdr_off,
                         !root ? "invalid JSON: " : "no caption field ",
                         !root ? je.text : key + 5);
            json_decref(root);
            return rc;
        }
        if (json_is_string(v)) {
            rc = tokenize_bytes(b, (const uint8_t *)json_string_value(v),
                                    json_string_length(v));
        } else {
            size_t i;
            json_t *x;
            json_array_foreach(v, i, x) {
                json_int_t t = json_is_integer(x) ? json_integer_value(x) : -1;
                if (t < 0 || t > (json_int_t)UINT32_MAX) {
                    *bad = 1;
                    b->ntok = before;
                    rc = s_bad(b, PL_ERECORD,
                                 "%s: member %s at offset %lld: %s[%zu] is not a token id",
                                 b->path, m->name, (long long)m->hdr_off, key + 5, i);
                    json_decref(root);
                    return rc;
                }
                uint32_t u = (uint32_t)t;
                if ((rc = push_tokens(b, &u, 1))) break;
            }
        }
        json_decref(root);
    }
    if (rc) {
        pl__fmt(b->err, b->errcap, "%s: out of memory", b->path);
        return rc;
    }
    *ntok = b->ntok - before;
    return PL_OK;
}

/* An extension that holds a dot and ends in an image extension or the
 * caption's: the member's key was meant to hold a dot (img.0002.jpg gives
 * key img, extension 0002.jpg under webdataset's rule). */
static int s_dotted(const char *ext, const char *cext) {
    const char *last = strrchr(ext, '.');
    if (!last) return 0;
    last++;
    return pl__image_ext_format(last, strlen(last)) || !strcmp(last, cext);
}

/* Decode image member im in full (image.verify): PL_EIMAGE with the
 * decoder's message in b->err for a corrupt or truncated body. */
static int verify_image(pl__wb *b, int fmt, const pl__member *im) {
    int rc = wb_buf(b, (size_t)im->size);
    if (rc) return rc;
    if ((rc = pread_all(b->rf, b->fd, b->buf, (size_t)im->size, im->data_off, b->path,
                        b->err, b->errcap)))
        return rc;
    uint8_t px[3 * 14 * 14];
    uint8_t *tmp = NULL;
    size_t tmpcap = 0;
    rc = pl__image_decode_resize(fmt, b->buf, (size_t)im->size, 14, 14, 1,
                                 b->w->o.limit_pixels, px, &tmp, &tmpcap, b->err, b->errcap);
    free(tmp);
    return rc;
}

/* Close a sample: probe the image, tokenize the caption, append a record. */
static int finish(pl__wb *b, pl__sample *s) {
    if (!s->keylen) return PL_OK;
    if (s->has_repeat)
        return s_bad(b, PL_ERECORD,
                       "%s: sample %s: member %s at offset %lld repeats the %s of member "
                       "%s at offset %lld (a sample holds one image and one caption)",
                       b->path, s->key, s->repeat.name, (long long)s->repeat.hdr_off,
                       s->first == &s->image ? "image" : "caption", s->first->name,
                       (long long)s->first->hdr_off);
    if ((!s->has_image || !s->has_caption) && s->has_dotted) {
        size_t kl;
        const char *ext;
        split_key(s->dotted.name, &kl, &ext);
        return s_bad(b, PL_ERECORD,
                       "%s: member %s at offset %lld: key '%s', extension '%s' (the key "
                       "ends at the first dot of the file name, as in webdataset), so it "
                       "is neither the image nor the caption of its sample; keys must "
                       "not contain dots",
                       b->path, s->dotted.name, (long long)s->dotted.hdr_off, s->key, ext);
    }
    if (!s->has_image && !s->has_caption) return PL_OK; /* nothing of ours */
    if (!s->has_image)
        return s_bad(b, PL_ERECORD, "%s: sample %s (member %s at offset %lld): no image",
                       b->path, s->key, s->caption.name, (long long)s->caption.hdr_off);
    if (!s->has_caption)
        return s_bad(b, PL_ERECORD,
                       "%s: sample %s (member %s at offset %lld): no caption (%s)",
                       b->path, s->key, s->image.name, (long long)s->image.hdr_off,
                       b->w->o.caption_key);
    const pl__member *im = &s->image;
    size_t want = im->size < PL__WDS_PROBE ? (size_t)im->size : PL__WDS_PROBE;
    int rc = wb_buf(b, want);
    if (rc) return rc;
    if ((rc = pread_all(b->rf, b->fd, b->buf, want, im->data_off, b->path, b->err,
                        b->errcap)))
        return rc;
    uint32_t w = 0, h = 0;
    char perr[256];
    perr[0] = '\0';
    rc = pl__image_probe(s->fmt, b->buf, want, &w, &h, perr, sizeof perr);
    if (rc == PL_ETRUNC && want < (size_t)im->size) {
        if ((rc = wb_buf(b, (size_t)im->size))) return rc;
        if ((rc = pread_all(b->rf, b->fd, b->buf, (size_t)im->size, im->data_off, b->path,
                                b->err, b->errcap)))
            return rc;
        rc = pl__image_probe(s->fmt, b->buf, (size_t)im->size, &w, &h, perr, sizeof perr);
    }
    if (rc == PL_ETRUNC)
        return s_bad(b, PL_EIMAGE,
                       "%s: member %s at offset %lld: image header truncated (%lld bytes)",
                       b->path, im->name, (long long)im->hdr_off, (long long)im->size);
    if (rc)
        return s_bad(b, PL_EIMAGE, "%s: member %s at offset %lld: %s", b->path, im->name,
                       (long long)im->hdr_off, perr);
    if ((int64_t)w * h > b->w->o.limit_pixels)
        return s_bad(b, PL_EIMAGE,
                       "%s: member %s at offset %lld: image of %ux%u pixels exceeds "
                       "limit_pixels %lld",
                       b->path, im->name, (long long)im->hdr_off, w, h,
                       (long long)b->w->o.limit_pixels);
    if (b->w->verify && (rc = verify_image(b, s->fmt, im)) != PL_OK)
        return rc == PL_EIMAGE ? s_bad(b, PL_EIMAGE, "%s: member %s at offset %lld: %s "
                                         "(image verification)", b->path, im->name,
                                         (long long)im->hdr_off, b->err)
                               : rc;
    size_t first = b->ntok, ntok = 0;
    int bad = 0;
    if ((rc = s_caption(b, s, &ntok, &bad)) || bad) return rc;
    if (ntok > UINT32_MAX) {
        b->ntok = first;
        return s_bad(b, PL_ERECORD, "%s: sample %s: caption of %zu tokens", b->path,
                       s->key, ntok);
    }
    if (b->nrec == b->reccap) {
        size_t nc = b->reccap ? 2 * b->reccap : 256;
        uint8_t *nr = pl__realloc_array(b->rec, nc, PL__WDS_REC);
        if (!nr) {
            pl__fmt(b->err, b->errcap, "%s: out of memory", b->path);
            return PL_ENOMEM;
        }
        b->rec = nr;
        b->reccap = nc;
    }
    uint8_t *r = b->rec + b->nrec++ * PL__WDS_REC;
    pl__st_u64(r, (uint64_t)im->hdr_off);
    pl__st_u64(r + 8, (uint64_t)im->data_off);
    pl__st_u64(r + 16, (uint64_t)im->size);
    pl__st_u32(r + 24, w);
    pl__st_u32(r + 28, h);
    pl__st_u32(r + 32, (uint32_t)s->fmt);
    pl__st_u32(r + 36, (uint32_t)ntok);
    pl__st_u64(r + 40, (uint64_t)first);
    return PL_OK;
}

static int wds_scan(pl__wb *b) {
    int64_t off = 0;
    pl__sample *s = pl__calloc(1, sizeof *s);
    pl__member *m = pl__calloc(1, sizeof *m);
    if (!s || !m) {
        free(s);
        free(m);
        pl__fmt(b->err, b->errcap, "%s: out of memory", b->path);
        return PL_ENOMEM;
    }
    int rc;
    const char *ckey = b->w->o.caption_key;
    const char *cext = !strcmp(ckey, "txt") ? "txt" : "json";
    for (;;) {
        rc = tar_next(b, &off, m);
        if (rc) break;
        size_t kl;
        const char *ext;
        split_key(m->name, &kl, &ext);
        if (!s->keylen || kl != s->keylen || memcmp(m->name, s->key, kl)) {
            if ((rc = finish(b, s))) break;
            memset(s, 0, offsetof(pl__sample, image));
            memcpy(s->key, m->name, kl);
            s->key[kl] = '\0';
            s->keylen = kl ? kl : 1;
            s->first_off = m->hdr_off;
        }
        int fmt = pl__image_ext_format(ext, strlen(ext));
        int cap = !strcmp(ext, cext);
        if (fmt && !s->has_image) {
            s->has_image = 1;
            s->fmt = fmt;
            s->image = *m;
        } else if (cap && !s->has_caption) {
            s->has_caption = 1;
            s->caption = *m;
        } else if ((fmt || cap) && !s->has_repeat) {
            s->has_repeat = 1; /* webdataset refuses a repeated extension too */
            s->repeat = *m;
            s->first = fmt ? &s->image : &s->caption;
        } else if (!s->has_dotted && s_dotted(ext, cext)) {
            s->has_dotted = 1;
            s->dotted = *m;
        }
    }
    if (rc == PL_DONE) rc = finish(b, s);
    free(s);
    free(m);
    return rc;
}

/* ------------------------------------------------------------ sidecar */

static void wds_header(uint8_t *h, const struct stat *st, uint64_t opthash,
                           uint64_t nrec, uint64_t ntok, int64_t skipped) {
    memset(h, 0, PL__WDS_HEADER);
    memcpy(h, PL__WDS_MAGIC, 8);
    pl__st_u32(h + 8, PL__WDS_VERSION);
    pl__st_u32(h + 12, PL__WDS_REC);
    pl__st_u64(h + 16, (uint64_t)st->st_size);
    pl__st_u64(h + 24, (uint64_t)((int64_t)st->st_mtim.tv_sec * 1000000000LL +
                                  st->st_mtim.tv_nsec));
    pl__st_u64(h + 32, opthash);
    pl__st_u64(h + 40, nrec);
    pl__st_u64(h + 48, ntok);
    pl__st_u32(h + 56, (uint32_t)skipped);
}

static uint32_t wds_crc(const uint8_t *m, size_t len) {
    uint32_t c = pl__crc32(0, m, 60);
    return pl__crc32(c, m + PL__WDS_HEADER, len - PL__WDS_HEADER);
}

/* Does the mapped sidecar m[0, len) fit the shard and options?  Then fill f. */
static int wds_valid(const uint8_t *m, size_t len, const struct stat *st,
                         uint64_t opthash) {
    if (len < PL__WDS_HEADER || memcmp(m, PL__WDS_MAGIC, 8) ||
        pl__ld_u32(m + 8) != PL__WDS_VERSION || pl__ld_u32(m + 12) != PL__WDS_REC)
        return 0;
    uint8_t h[PL__WDS_HEADER];
    uint64_t nrec = pl__ld_u64(m + 40), ntok = pl__ld_u64(m + 48);
    if (nrec > len / PL__WDS_REC || ntok > len / 4 ||
        PL__WDS_HEADER + nrec * PL__WDS_REC + ntok * 4 != len)
        return 0;
    wds_header(h, st, opthash, nrec, ntok, pl__ld_u32(m + 56));
    if (memcmp(h, m, 60)) return 0;
    if (wds_crc(m, len) != pl__ld_u32(m + 60)) return 0;
    /* Records must point inside the shard and the token array, so that no
     * later read goes astray even for a sidecar written by someone else. */
    for (uint64_t i = 0; i < nrec; i++) {
        const uint8_t *r = m + PL__WDS_HEADER + i * PL__WDS_REC;
        uint64_t at = pl__ld_u64(r + 8), size = pl__ld_u64(r + 16);
        uint64_t first = pl__ld_u64(r + 40), ncap = pl__ld_u32(r + 36);
        uint32_t fmt = pl__ld_u32(r + 32);
        if (at > (uint64_t)st->st_size || size > (uint64_t)st->st_size - at ||
            pl__ld_u64(r) + 512 != at || first > ntok || ncap > ntok - first ||
            fmt < PL__IMG_JPEG || fmt > PL__IMG_WEBP || !pl__ld_u32(r + 24) ||
            !pl__ld_u32(r + 28))
            return 0;
    }
    return 1;
}

static int write_all(int fd, const void *p, size_t n) {
    const uint8_t *q = p;
    while (n) {
        ssize_t k = write(fd, q, n);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) return -1;
        q += k;
        n -= (size_t)k;
    }
    return 0;
}

/* ------------------------------------------------------------ open */

/* Records and tokens of file f (valid after wds_open_file). */
static inline const uint8_t *s_rec(const pl__sfile *f, int64_t r) {
    return (const uint8_t *)f->idx_map + PL__WDS_HEADER + (size_t)r * PL__WDS_REC;
}

static int wds_open_file(pl_source *src, pl__sfile *f, int skip_damaged, char *err,
                             size_t errcap) {
    (void)skip_damaged; /* in the options (pl__wds.skip) */
    pl__wfile *wf = (pl__wfile *)f;
    const pl__wds *w = src->state;
    /* A remote shard (s3://, https://): its object through the node cache,
       whose file is read here (every read making its bytes present first);
       its index is built at open and kept in memory (no sidecar is written
       into a bucket). */
    const int remote = pl__remote_is_url(f->path);
    int rc0 = remote ? pl__rfile_open(f->path, f->rconf, 0, &f->rdata, err, errcap)
                     : PL_OK;
    if (rc0) return rc0;
    const char *local = remote ? pl__rfile_path(f->rdata) : f->path;
    int fd = open(local, O_RDONLY | O_CLOEXEC);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0) {
        int e = errno;
        if (fd >= 0) close(fd);
        pl__fmt(err, errcap, "%s: cannot open%s%s: %s", f->path,
                remote ? " its cache file " : "", remote ? local : "", strerror(e));
        return e == ENOENT && !remote ? PL_ENOENT : PL_EIO;
    }
    wf->fd1 = fd + 1;
    f->dtype = PL_DTYPE_UINT32;
    f->width = 4;
    uint64_t oh = wds_opthash(w);
    char ipath[4200];
    pl__fmt(ipath, sizeof ipath, "%s.plwds", f->path);
    if (src->write_index != -1 && !remote) {
        void *m;
        size_t len;
        struct stat ist;
        int ifd;
        char e2[64];
        if (pl__map_file(ipath, &m, &len, &ist, &ifd, e2, sizeof e2) == PL_OK) {
            if (m && wds_valid(m, len, &st, oh)) {
                f->idx_map = m;
                f->idx_len = len;
                pl__fwatch_keep(&f->idx_w, ifd, &ist);
                f->n_docs = (int64_t)pl__ld_u64((uint8_t *)m + 40);
                wf->n_tokens = (int64_t)pl__ld_u64((uint8_t *)m + 48);
                f->skipped = pl__ld_u32((uint8_t *)m + 56);
                return PL_OK;
            }
            if (m) munmap(m, len);
            close(ifd);
        }
    }
    pl__wb b = {.path = f->path, .fd = fd, .rf = f->rdata, .file_size = st.st_size, .w = w,
                .err = err, .errcap = errcap};
    int rc = wds_scan(&b);
    free(b.buf);
    if (rc) {
        free(b.rec);
        free(b.tok);
        return rc;
    }
    uint8_t h[PL__WDS_HEADER];
    wds_header(h, &st, oh, b.nrec, b.ntok, b.skipped);
    size_t len = PL__WDS_HEADER + b.nrec * PL__WDS_REC + b.ntok * 4;
    uint8_t *mem = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                        -1, 0);
    if (mem == MAP_FAILED) {
        free(b.rec);
        free(b.tok);
        pl__fmt(err, errcap, "%s: out of memory for its index (%zu bytes)", f->path, len);
        return PL_ENOMEM;
    }
    memcpy(mem, h, PL__WDS_HEADER);
    if (b.nrec) memcpy(mem + PL__WDS_HEADER, b.rec, b.nrec * PL__WDS_REC);
    if (b.ntok) memcpy(mem + PL__WDS_HEADER + b.nrec * PL__WDS_REC, b.tok, b.ntok * 4);
    pl__st_u32(mem + 60, wds_crc(mem, len));
    free(b.rec);
    free(b.tok);
    mprotect(mem, len, PROT_READ);
    f->idx_map = mem;
    f->idx_len = len;
    f->idx_anon = 1;
    f->index_in_memory = 1;
    f->n_docs = (int64_t)b.nrec;
    wf->n_tokens = (int64_t)b.ntok;
    f->skipped = b.skipped;
    if (src->write_index != -1 && !remote) {
        /* Atomic: temporary file + rename; a read-only directory keeps the
         * index in memory. */
        char tmp[4300];
        pl__fmt(tmp, sizeof tmp, "%s.tmp.XXXXXX", ipath);
        int tfd = mkstemp(tmp);
        if (tfd >= 0) {
            int bad = fchmod(tfd, 0644) != 0 || write_all(tfd, mem, len) != 0;
            bad |= close(tfd) != 0;
            if (!bad) bad = rename(tmp, ipath) != 0;
            if (bad) unlink(tmp);
        }
    }
    return PL_OK;
}

static int wds_init(pl_source *src, const pl_source_options *opts, int skip_damaged,
                        char *err, size_t cap) {
    if (opts->version < 2 || !opts->image) {
        pl__fmt(err, cap, "source %s: a webdataset source needs image options", src->name);
        return PL_EINVAL;
    }
    pl__wds *w = pl__calloc(1, sizeof *w);
    if (!w) {
        pl__fmt(err, cap, "out of memory");
        return PL_ENOMEM;
    }
    src->state = w;
    w->o = *opts->image;
    w->skip = skip_damaged;
    w->verify = opts->version >= 4 && opts->verify_images;
    int rc = pl__wds_defaults(&w->o, err, cap, src->name);
    if (rc) return rc;
    src->eos_id = opts->eos_id; /* -1: none appended */
    if (src->eos_id < -1) {
        pl__fmt(err, cap, "source %s: eos_id %lld is negative", src->name,
                (long long)opts->eos_id);
        return PL_EINVAL;
    }
    src->write_index = opts->write_index == -1 ? -1 : 1;
    src->dtype = PL_DTYPE_UINT32;
    return PL_OK;
}

static int wds_expand_op(const pl_source *src, const char *path, pl__paths *out,
                             char *err, size_t errcap) {
    (void)src;
    return wds_expand(path, out, err, errcap);
}

static void wds_close_file(pl_source *src, pl__sfile *f) {
    (void)src;
    pl__wfile *wf = (pl__wfile *)f;
    if (wf->fd1 > 0) close(wf->fd1 - 1);
    wf->fd1 = 0;
}

static void wds_free(pl_source *src) {
    free(src->state);
    src->state = NULL;
}

/* ------------------------------------------------------------ documents */

static int s_info(const pl__wds *w, const uint8_t *r, pl_image_info *out, char *err,
                    size_t errcap) {
    const pl_image_options *o = &w->o;
    memset(out, 0, sizeof *out);
    out->width = pl__ld_u32(r + 24);
    out->height = pl__ld_u32(r + 28);
    int64_t oh = o->size, ow = o->size;
    if (o->mode != PL_IMAGE_FIXED) {
        int rc = pl__smart_resize(out->height, out->width, o->patch_size * o->merge_size,
                                  o->min_pixels, o->max_pixels, &oh, &ow, err, errcap);
        if (rc) return rc;
    }
    pl__image_geometry(o, oh, ow, out);
    return PL_OK;
}

void pl__image_geometry(const pl_image_options *o, int64_t out_h, int64_t out_w,
                        pl_image_info *out) {
    out->mode = o->mode;
    out->patch_dim = 3 * o->patch_size * o->patch_size;
    out->grid_t = 1;
    out->out_height = out_h;
    out->out_width = out_w;
    out->grid_h = out_h / o->patch_size;
    out->grid_w = out_w / o->patch_size;
    out->patches = out->grid_h * out->grid_w;
    out->tokens = out->patches / (o->merge_size * o->merge_size);
    out->bytes = (size_t)out->patches * (size_t)out->patch_dim;
}

/* Local sample r: its length in tokens (visual tokens + caption + eos). */
static int wds_doc_length(const pl_source *src, const pl__sfile *f, int64_t r,
                              int64_t *length, char *err, size_t errcap) {
    pl_image_info in;
    const uint8_t *rec = s_rec(f, r);
    int rc = s_info(src->state, rec, &in, err, errcap);
    if (rc) {
        char m[PL__ERRMSG_CAP];
        pl__fmt(m, sizeof m, "%s: sample %lld (image at offset %lld): %s", f->path,
                (long long)r, (long long)pl__ld_u64(rec), err);
        pl__fmt(err, errcap, "%s", m);
        return rc;
    }
    *length = in.tokens + (int64_t)pl__ld_u32(rec + 36) + (src->eos_id >= 0 ? 1 : 0);
    return PL_OK;
}

static int wds_doc(const pl_source *src, const pl__sfile *f, int64_t r,
                       const uint8_t **tokens, int64_t *length, char *err,
                       size_t errcap) {
    *tokens = NULL;
    return wds_doc_length(src, f, r, length, err, errcap);
}

/* Tokens [offset, offset + count) of sample index (local r in f) as dt
 * (INT64, INT32 or UINT32). */
static int wds_read(pl_source *src, const pl__sfile *f, int64_t index, int64_t offset,
                        int64_t count, void *out, pl_dtype dt, int marked, char *err,
                        size_t errcap) {
    (void)marked;
    const int64_t r = index - f->first_doc;
    const pl__wds *w = src->state;
    int64_t len;
    int rc = wds_doc_length(src, f, r, &len, err, errcap);
    if (rc) return rc;
    if (offset < 0 || count < 0 || offset > len || count > len - offset) {
        pl__fmt(err, errcap,
                "source %s: sample %lld: tokens [%lld, %lld + %lld) are outside its %lld",
                src->name, (long long)(f->first_doc + r), (long long)offset,
                (long long)offset, (long long)count, (long long)len);
        return PL_ERANGE;
    }
    const uint8_t *rec = s_rec(f, r);
    const int64_t ncap = pl__ld_u32(rec + 36);
    const int64_t nvis = len - ncap - (src->eos_id >= 0 ? 1 : 0);
    const uint8_t *tok = (const uint8_t *)f->idx_map + PL__WDS_HEADER +
                         (size_t)f->n_docs * PL__WDS_REC + pl__ld_u64(rec + 40) * 4;
    const int64_t img = w->o.token_id;
    for (int64_t i = 0; i < count; i++) {
        int64_t p = offset + i, t;
        if (p < nvis)
            t = img;
        else if (p < nvis + ncap)
            t = pl__ld_u32(tok + (size_t)(p - nvis) * 4);
        else
            t = src->eos_id;
        /* out may be unaligned (stored-width reads of several sources back to back). */
        if (dt == PL_DTYPE_INT64) {
            memcpy((uint8_t *)out + (size_t)i * 8, &t, 8);
        } else if (dt == PL_DTYPE_INT32) {
            int32_t v = (int32_t)t;
            memcpy((uint8_t *)out + (size_t)i * 4, &v, 4);
        } else {
            uint32_t v = (uint32_t)t;
            memcpy((uint8_t *)out + (size_t)i * 4, &v, 4);
        }
    }
    return PL_OK;
}

/* ------------------------------------------------------------ images */

/* ops->data_range: sample r's image member. */
static int wds_data_range(const pl_source *src, const pl__sfile *f, int64_t r,
                          int64_t *offset, int64_t *len) {
    (void)src;
    if (r < 0 || r >= f->n_docs) return -1;
    const uint8_t *rec = s_rec(f, r);
    *offset = (int64_t)pl__ld_u64(rec + 8);
    *len = (int64_t)pl__ld_u64(rec + 16);
    return 0;
}

static int wds_image_info(pl_source *src, const pl__sfile *f, int64_t r,
                              pl_image_info *out, char *err, size_t errcap) {
    return s_info(src->state, s_rec(f, r), out, err, errcap);
}

static int wds_read_image(pl_source *src, const pl__sfile *f, int64_t r, int64_t index,
                              uint8_t *out, size_t cap, pl_image_info *info, char *err,
                              size_t errcap) {
    const pl__wds *w = src->state;
    const int fd = ((const pl__wfile *)f)->fd1 - 1;
    const uint8_t *rec = s_rec(f, r);
    pl_image_info in;
    int rc;
    if ((rc = s_info(w, rec, &in, err, errcap))) return rc;
    if (info) *info = in;
    if (!out || cap < in.bytes) {
        pl__fmt(err, errcap, "pl_source_read_image: %zu bytes given, the image needs %zu",
                cap, in.bytes);
        return PL_EINVAL;
    }
    const int64_t hdr = (int64_t)pl__ld_u64(rec), at = (int64_t)pl__ld_u64(rec + 8);
    const int64_t size = (int64_t)pl__ld_u64(rec + 16);
    pl__imgtls *b = pl__image_tls();
    if (b && (size_t)size > b->datacap) {
        uint8_t *nd = pl__realloc_array(b->data, (size_t)size, 1);
        if (nd) {
            b->data = nd;
            b->datacap = (size_t)size;
        }
    }
    if (!b || (size_t)size > b->datacap) {
        pl__fmt(err, errcap, "%s: out of memory for an image of %lld bytes", f->path,
                (long long)size);
        return PL_ENOMEM;
    }
    rc = pread_all(f->rdata, fd, b->data, (size_t)size, at, f->path, err, errcap);
    if (rc == PL_OK) {
        char derr[400];
        /* Fixed mode resizes straight into out (CHW); native mode into the
         * thread's buffer, then into patches. */
        const int fixed = in.mode == PL_IMAGE_FIXED;
        const size_t planes = (size_t)(in.out_width * in.out_height * 3);
        if (!fixed && planes > b->rgbcap) {
            uint8_t *nr = pl__realloc_array(b->rgb, planes, 1);
            if (nr) {
                b->rgb = nr;
                b->rgbcap = planes;
            }
        }
        if (!fixed && planes > b->rgbcap) {
            pl__fmt(derr, sizeof derr, "out of memory for %zu bytes", planes);
            rc = PL_ENOMEM;
        } else {
            rc = pl__image_decode_resize((int)pl__ld_u32(rec + 32), b->data, (size_t)size,
                                         in.out_width, in.out_height, fixed,
                                         w->o.limit_pixels, fixed ? out : b->rgb,
                                         &b->tmp, &b->tmpcap, derr, sizeof derr);
        }
        if (rc) {
            char name[101];
            uint8_t h[100];
            if (pread_all(f->rdata, fd, h, 100, hdr, f->path, err, errcap) == PL_OK) {
                memcpy(name, h, 100);
                name[100] = '\0';
            } else {
                name[0] = '\0';
            }
            pl__fmt(err, errcap, "%s: member %s at offset %lld (sample %lld): %s",
                    f->path, name, (long long)hdr, (long long)index, derr);
        }
    }
    if (rc == PL_OK && in.mode == PL_IMAGE_NATIVE)
        pl__image_patchify(b->rgb, in.out_height, in.out_width, w->o.patch_size,
                           w->o.merge_size, out);
    /* Keep what a usual photo needs; give back what an outlier grew. */
    const size_t keep = (size_t)64 << 20;
    if (b->datacap > keep || b->tmpcap > keep || b->rgbcap > keep) {
        free(b->data);
        free(b->tmp);
        free(b->rgb);
        b->data = b->tmp = b->rgb = NULL;
        b->datacap = b->tmpcap = b->rgbcap = 0;
    }
    return rc;
}

int pl__source_read_image_or_blank(pl_source *src, int64_t index, uint8_t *out, size_t cap,
                                   int *replaced, char *err, size_t errcap) {
    *replaced = 0;
    pl_image_info in;
    memset(&in, 0, sizeof in);
    int rc = pl__source_read_image(src, index, out, cap, &in, err, errcap);
    if (rc != PL_EIMAGE || src->ops != &pl__webdataset_ops) return rc;
    pl__wds *w = src->state;
    if (!w->skip || !out || in.bytes == 0 || cap < in.bytes) return rc;
    memset(out, 0, in.bytes);
    atomic_fetch_add(&w->replaced, 1);
    *replaced = 1;
    return PL_OK;
}

int64_t pl_source_num_images_replaced(const pl_source *src) {
    if (!src || src->ops != &pl__webdataset_ops || !src->state) return 0;
    return (int64_t)atomic_load(&((pl__wds *)src->state)->replaced);
}

int pl_image_probe(const void *data, size_t len, int64_t *width, int64_t *height,
                   char *err, size_t errcap) {
    const uint8_t *d = data;
    char e[256];
    if (!err) {
        err = e;
        errcap = sizeof e;
    }
    if (!data && len) return PL_EINVAL;
    int fmt = 0;
    if (len >= 2 && d[0] == 0xFF && d[1] == 0xD8)
        fmt = PL__IMG_JPEG;
    else if (len >= 4 && d[0] == 0x89 && !memcmp(d + 1, "PNG", 3))
        fmt = PL__IMG_PNG;
    else if (len >= 12 && !memcmp(d, "RIFF", 4) && !memcmp(d + 8, "WEBP", 4))
        fmt = PL__IMG_WEBP;
    if (!fmt) {
        pl__fmt(err, errcap, "not a JPEG, PNG or WebP image (signature at offset 0)");
        return len < 12 ? PL_ETRUNC : PL_EIMAGE;
    }
    uint32_t w = 0, h = 0;
    int rc = pl__image_probe(fmt, d, len, &w, &h, err, errcap);
    if (rc == PL_OK) {
        if (width) *width = w;
        if (height) *height = h;
    }
    return rc;
}

const pl__source_ops pl__webdataset_ops = {
    .version = PL__SOURCE_OPS_VERSION,
    .type = PL_SOURCE_WEBDATASET,
    .name = "webdataset",
    .file_size = sizeof(pl__wfile),
    .data_suffix = "",
    .index_suffix = ".plwds",
    .unit = "sample",
    .init = wds_init,
    .expand = wds_expand_op,
    .open_file = wds_open_file,
    .close_file = wds_close_file,
    .free = wds_free,
    .doc = wds_doc,
    .read = wds_read,
    .image_info = wds_image_info,
    .read_image = wds_read_image,
    .data_range = wds_data_range,
};

int pl_image_smart_resize(int64_t h, int64_t w, int64_t factor, int64_t min_pixels,
                          int64_t max_pixels, int64_t *out_h, int64_t *out_w) {
    char err[128];
    if (!out_h || !out_w) return PL_EINVAL;
    return pl__smart_resize(h, w, factor, min_pixels, max_pixels, out_h, out_w, err,
                            sizeof err);
}
