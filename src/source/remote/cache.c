/*
 * cache.c -- the node-local cache of remote objects.
 *
 * Layout under the cache directory:
 *   lock                 flock(2)ed by whoever changes what the cache holds;
 *                        its first 24 bytes count the bytes present (usage_get)
 *   o/<h>.data           the object's bytes: a sparse file as long as the object
 *   o/<h>.tab            its chunk table: a 64-byte header (magic, size, chunk
 *                        bytes, chunk count, keep flag), then per chunk the
 *                        u32 time (s) it was last used, 0 when absent
 * where <h> hashes the URL, the ETag and the chunk size, so a replaced object
 * is a new entry and never mixes with the old one (nor does an entry of
 * another chunk size).  The formats map or read o/<h>.data like
 * any local file; pl__rfile_ensure makes the chunks a read needs present
 * first.  Several processes share the directory: fetched bytes are written
 * and marked present under the lock (a chunk two processes fetched at once is
 * written once), and the table is mapped MAP_SHARED, so a chunk one process
 * fetched costs the others no request; everything survives restarts.
 *
 * Bounded: when the bytes present pass max_bytes, the least recently used
 * chunks of objects not kept (index files are kept) are evicted, their
 * table entry cleared, then their pages freed with fallocate(PUNCH_HOLE), down
 * to 90 % of the bound (the tables are scanned only when the count in the
 * lock file says the bound may be passed).  A chunk used in the last 10 seconds ($POLYLOAD_CACHE_GRACE_S) is
 * not evicted, so that a read that ensured it and is copying from the mapping
 * does not see the hole: while every chunk is that fresh the cache may pass
 * its bound.  The eviction scan recounts the bytes present from the tables,
 * so a process killed mid-update leaves no drift.  The cache never decides a
 * byte: an absent chunk is fetched, a present one was written from the same
 * object version.
 */
#include "source/remote/remote.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define PL__RCACHE_MAGIC "PLCACHE1"
#define PL__RCACHE_HEADER 64
/* Seconds a used chunk is safe from eviction ($POLYLOAD_CACHE_GRACE_S). */
static uint32_t grace_s(void) {
    const char *g = getenv("POLYLOAD_CACHE_GRACE_S");
    long long x = g && *g ? strtoll(g, NULL, 10) : 10;
    return x < 0 ? 10u : (uint32_t)x;
}
/* Bytes fetched per batch of an ensure (bounded memory). */
#define PL__RCACHE_BATCH ((int64_t)64 << 20)
/* Bytes of one request at most (large runs are split for concurrency). */
#define PL__RCACHE_REQ ((int64_t)8 << 20)

struct pl__rfile {
    pl__robj *obj;
    pthread_mutex_t mu; /* guards inflight */
    pthread_cond_t cv;  /* a fetch finished */
    uint8_t *inflight;  /* [n_chunks]: fetches of the chunk under way here */
    char *dir;
    char *data_path, *tab_path, *lock_path;
    int data_fd;
    uint32_t *tab; /* mapped table; entries at tab + PL__RCACHE_HEADER / 4 */
    size_t tab_len;
    int64_t size, chunk, n_chunks;
    int64_t max_bytes;
    int keep;
};

const char *pl__rfile_path(const pl__rfile *f) { return f->data_path; }
const pl__robj *pl__rfile_obj(const pl__rfile *f) { return f->obj; }
int64_t pl__rfile_size(const pl__rfile *f) { return f->size; }

static uint32_t *tab_entries(const pl__rfile *f) {
    return f->tab + PL__RCACHE_HEADER / 4;
}

static uint32_t now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME_COARSE, &ts); /* a few ns: called per read */
    return (uint32_t)ts.tv_sec;
}

static int cmp_i64(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return x < y ? -1 : x > y;
}

static int mkdirs(const char *path) {
    char tmp[4096];
    pl__fmt(tmp, sizeof tmp, "%s", path);
    for (char *p = tmp + 1; *p; p++)
        if (*p == '/') {
            *p = 0;
            if (mkdir(tmp, 0777) != 0 && errno != EEXIST) return -1;
            *p = '/';
        }
    return mkdir(tmp, 0777) != 0 && errno != EEXIST ? -1 : 0;
}

static int lock(const pl__rfile *f, char *err, size_t errcap) {
    int fd = open(f->lock_path, O_RDWR | O_CREAT | O_CLOEXEC, 0666);
    if (fd < 0 || flock(fd, LOCK_EX) != 0) {
        int e = errno;
        if (fd >= 0) close(fd);
        pl__fmt(err, errcap, "cache %s: cannot lock: %s", f->dir, strerror(e));
        return -1;
    }
    return fd;
}

static void unlock(int fd) {
    flock(fd, LOCK_UN);
    close(fd);
}

static int64_t chunk_bytes(int64_t size, int64_t chunk, int64_t c) {
    int64_t end = (c + 1) * chunk;
    return (end > size ? size : end) - c * chunk;
}

/* ------------------------------------------------------------ eviction */

typedef struct pl__victim {
    uint32_t used;
    int64_t c;
    int obj; /* index into the scanned table list */
} pl__victim;

typedef struct pl__scanned {
    char *data_path;
    uint32_t *tab;
    size_t tab_len;
    int64_t size, chunk;
} pl__scanned;

static int victim_cmp(const void *a, const void *b) {
    const pl__victim *x = a, *y = b;
    return x->used < y->used ? -1 : x->used > y->used;
}

/* Under the lock: bytes present over every table; evict down to target
 * when they pass max.  Best effort (a table that cannot be read is left).
 * The bytes present after it, or -1 when the directory cannot be read. */
static int64_t evict(const pl__rfile *self, int64_t incoming) {
    char odir[4096];
    pl__fmt(odir, sizeof odir, "%s/o", self->dir);
    DIR *d = opendir(odir);
    if (!d) return -1;
    pl__scanned *sc = NULL;
    int nsc = 0, capsc = 0;
    pl__victim *v = NULL;
    int64_t nv = 0, capv = 0, present = 0;
    uint32_t now = now_s(), grace = grace_s();
    struct dirent *de;
    while ((de = readdir(d))) {
        size_t nl = strlen(de->d_name);
        if (nl < 5 || strcmp(de->d_name + nl - 4, ".tab") != 0) continue;
        char tp[4096], dp[4096];
        pl__fmt(tp, sizeof tp, "%s/%s", odir, de->d_name);
        pl__fmt(dp, sizeof dp, "%s/%.*s.data", odir, (int)(nl - 4), de->d_name);
        int fd = open(tp, O_RDWR | O_CLOEXEC);
        if (fd < 0) continue;
        struct stat st;
        if (fstat(fd, &st) != 0 || st.st_size < PL__RCACHE_HEADER) {
            close(fd);
            continue;
        }
        uint32_t *t = mmap(NULL, (size_t)st.st_size, PROT_READ | PROT_WRITE, MAP_SHARED,
                           fd, 0);
        close(fd);
        if (t == MAP_FAILED) continue;
        const uint8_t *h = (const uint8_t *)t;
        int64_t size, chunk, n;
        uint32_t keep;
        memcpy(&size, h + 8, 8);
        memcpy(&chunk, h + 16, 8);
        memcpy(&n, h + 24, 8);
        memcpy(&keep, h + 32, 4);
        /* A table another process left damaged is skipped, never read past its end:
           n is checked against the file's size before n * 4 is formed. */
        if (memcmp(h, PL__RCACHE_MAGIC, 8) != 0 || chunk <= 0 || size < 0 || n < 0 ||
            n > (int64_t)(((size_t)st.st_size - PL__RCACHE_HEADER) / 4)) {
            munmap(t, (size_t)st.st_size);
            continue;
        }
        if (nsc == capsc) {
            int nc = capsc ? capsc * 2 : 16;
            pl__scanned *ns = pl__realloc_array(sc, (size_t)nc, sizeof *sc);
            if (!ns) {
                munmap(t, (size_t)st.st_size);
                break;
            }
            sc = ns;
            capsc = nc;
        }
        sc[nsc] = (pl__scanned){pl__strdup(dp), t, (size_t)st.st_size, size, chunk};
        uint32_t *e = t + PL__RCACHE_HEADER / 4;
        for (int64_t c = 0; c < n; c++) {
            uint32_t u = __atomic_load_n(&e[c], __ATOMIC_ACQUIRE);
            if (!u) continue;
            present += chunk_bytes(size, chunk, c);
            /* Ages are differences of u32 seconds: a use after now (a reader's
               touch since this scan read the clock, or a clock a little ahead)
               is within the grace too, not the oldest of all. */
            if (keep || now - u < grace || u - now < grace) continue;
            if (nv == capv) {
                int64_t nc = capv ? capv * 2 : 1024;
                pl__victim *nvv = pl__realloc_array(v, (size_t)nc, sizeof *v);
                if (!nvv) continue;
                v = nvv;
                capv = nc;
            }
            v[nv++] = (pl__victim){u, c, nsc};
        }
        nsc++;
    }
    closedir(d);
    if (present + incoming > self->max_bytes && nv) {
        qsort(v, (size_t)nv, sizeof *v, victim_cmp);
        int64_t target = self->max_bytes / 10 * 9 - incoming;
        for (int64_t i = 0; i < nv && present > target; i++) {
            pl__scanned *s = &sc[v[i].obj];
            uint32_t *e = s->tab + PL__RCACHE_HEADER / 4;
            __atomic_store_n(&e[v[i].c], 0, __ATOMIC_RELEASE);
            int64_t b = chunk_bytes(s->size, s->chunk, v[i].c);
            int fd = s->data_path ? open(s->data_path, O_RDWR | O_CLOEXEC) : -1;
            if (fd >= 0) {
                fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
                          (off_t)(v[i].c * s->chunk), (off_t)b);
                close(fd);
            }
            present -= b;
        }
    }
    for (int i = 0; i < nsc; i++) {
        munmap(sc[i].tab, sc[i].tab_len);
        free(sc[i].data_path);
    }
    free(sc);
    free(v);
    return present;
}

/*
 * The bytes present, as last counted, in the first 24 bytes of DIR/lock
 * ("PLUSAGE1", an int64, then the time of the last scan in seconds), read and
 * written under the lock: a fetch scans every table (evict) only when the
 * count says the bound may be passed, when there is no count, or when the
 * last scan is a minute old, instead of at every fetch (a scan costs an open
 * and a map per object in the cache).  The count errs high: fetched bytes are
 * added before they are written (a process killed in between leaves it high),
 * a table started afresh leaves its old chunks counted, and every scan sets
 * it to what the tables say; high only brings the next scan sooner.  A count
 * left low (a damaged lock file, a writer that keeps none) is set right by
 * the scan of the minute.
 */
#define PL__RCACHE_USAGE_MAGIC "PLUSAGE1"
#define PL__RCACHE_RESCAN_S 60

static int usage_get(int lk, int64_t *used, int64_t *scanned) {
    uint8_t b[24];
    if (pread(lk, b, sizeof b, 0) != (ssize_t)sizeof b ||
        memcmp(b, PL__RCACHE_USAGE_MAGIC, 8) != 0)
        return -1;
    memcpy(used, b + 8, 8);
    memcpy(scanned, b + 16, 8);
    return *used < 0 ? -1 : 0;
}

static void usage_set(int lk, int64_t used, int64_t scanned) {
    uint8_t b[24];
    memcpy(b, PL__RCACHE_USAGE_MAGIC, 8);
    if (used < 0) used = 0;
    memcpy(b + 8, &used, 8);
    memcpy(b + 16, &scanned, 8);
    if (pwrite(lk, b, sizeof b, 0) != (ssize_t)sizeof b) {
        /* Best effort: a count not written is rebuilt by the next scan. */
    }
}

/* ------------------------------------------------------------ open */

static void rcache_resolve(const pl__rcache_conf *conf, char *dir, size_t cap,
                               int64_t *max_bytes, int64_t *chunk) {
    const char *d = conf && conf->dir && *conf->dir ? conf->dir : getenv("POLYLOAD_CACHE_DIR");
    if (d && *d) {
        pl__fmt(dir, cap, "%s", d);
    } else {
        const char *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
        if (xdg && *xdg)
            pl__fmt(dir, cap, "%s/polyload", xdg);
        else
            pl__fmt(dir, cap, "%s/.cache/polyload", home && *home ? home : "/tmp");
    }
    *max_bytes = conf && conf->max_bytes > 0 ? conf->max_bytes : 0;
    if (!*max_bytes) {
        const char *m = getenv("POLYLOAD_CACHE_MAX_BYTES");
        long long x = m && *m ? strtoll(m, NULL, 10) : 0;
        *max_bytes = x > 0 ? (int64_t)x : (int64_t)16 << 30;
    }
    *chunk = conf && conf->chunk > 0 ? conf->chunk : (int64_t)4 << 20;
}

/* The listing's size and ETag stand for a HEAD ($POLYLOAD_REMOTE_LIST_ETAG=0:
 * they do not, for a store whose listing and HEAD disagree). */
static int list_etag_trusted(void) {
    const char *v = getenv("POLYLOAD_REMOTE_LIST_ETAG");
    return !(v && strcmp(v, "0") == 0);
}

void pl__rfile_free(pl__rfile *f) {
    if (!f) return;
    if (f->tab) munmap(f->tab, f->tab_len);
    if (f->inflight) {
        pthread_mutex_destroy(&f->mu);
        pthread_cond_destroy(&f->cv);
        free(f->inflight);
    }
    if (f->data_fd >= 0) close(f->data_fd);
    pl__robj_free(f->obj);
    free(f->dir);
    free(f->data_path);
    free(f->tab_path);
    free(f->lock_path);
    free(f);
}

/* Under the lock: open or create the data file and the table. */
static int rfile_files(pl__rfile *f, char *err, size_t errcap) {
    const char *url = pl__robj_url(f->obj);
    f->data_fd = open(f->data_path, O_RDWR | O_CREAT | O_CLOEXEC, 0666);
    int tfd = f->data_fd >= 0 ? open(f->tab_path, O_RDWR | O_CREAT | O_CLOEXEC, 0666) : -1;
    if (tfd < 0) {
        pl__fmt(err, errcap, "%s: cache file %s: %s", url,
                f->data_fd < 0 ? f->data_path : f->tab_path, strerror(errno));
        return PL_EIO;
    }
    f->tab_len = PL__RCACHE_HEADER + (size_t)f->n_chunks * 4;
    struct stat st;
    uint8_t h[PL__RCACHE_HEADER];
    int fresh = 1;
    if (fstat(tfd, &st) == 0 && (size_t)st.st_size == f->tab_len &&
        pread(tfd, h, sizeof h, 0) == (ssize_t)sizeof h && memcmp(h, PL__RCACHE_MAGIC, 8) == 0) {
        int64_t size, chunk;
        memcpy(&size, h + 8, 8);
        memcpy(&chunk, h + 16, 8);
        fresh = size != f->size || chunk != f->chunk;
    }
    int rc = PL_OK;
    if (fresh) {
        memset(h, 0, sizeof h);
        memcpy(h, PL__RCACHE_MAGIC, 8);
        memcpy(h + 8, &f->size, 8);
        memcpy(h + 16, &f->chunk, 8);
        memcpy(h + 24, &f->n_chunks, 8);
        uint32_t keep = (uint32_t)f->keep;
        memcpy(h + 32, &keep, 4);
        if (ftruncate(tfd, 0) != 0 || ftruncate(tfd, (off_t)f->tab_len) != 0 ||
            pwrite(tfd, h, sizeof h, 0) != (ssize_t)sizeof h ||
            ftruncate(f->data_fd, 0) != 0 || ftruncate(f->data_fd, (off_t)f->size) != 0) {
            pl__fmt(err, errcap, "%s: cannot create cache files under %s: %s", url, f->dir,
                    strerror(errno));
            rc = PL_EIO;
        }
    } else if (f->keep) {
        uint32_t keep = 1;
        if (pwrite(tfd, &keep, 4, 32) != 4) rc = PL_EIO;
    }
    if (rc == PL_OK) {
        void *m = mmap(NULL, f->tab_len, PROT_READ | PROT_WRITE, MAP_SHARED, tfd, 0);
        if (m == MAP_FAILED) {
            pl__fmt(err, errcap, "%s: cannot map cache table %s: %s", url, f->tab_path,
                    strerror(errno));
            rc = PL_EIO;
        } else {
            f->tab = m;
        }
    }
    close(tfd);
    return rc;
}

/* Without the lock: the data file and a table the cache already holds for
 * this object version (its header as rfile_files writes it, and kept when
 * keep is asked), mapped; 1 when so, else 0 and nothing open.  A warm start
 * opens each object this way: no lock taken, no directory made.  Tables are
 * only ever created whole under the lock (rfile_files), so a header that
 * reads right is a table in use. */
static int rfile_files_held(pl__rfile *f) {
    int tfd = open(f->tab_path, O_RDWR | O_CLOEXEC);
    if (tfd < 0) return 0;
    size_t tab_len = PL__RCACHE_HEADER + (size_t)f->n_chunks * 4;
    struct stat st;
    uint8_t h[PL__RCACHE_HEADER];
    int64_t size, chunk, n;
    uint32_t keep;
    int ok = fstat(tfd, &st) == 0 && (size_t)st.st_size == tab_len &&
             pread(tfd, h, sizeof h, 0) == (ssize_t)sizeof h &&
             memcmp(h, PL__RCACHE_MAGIC, 8) == 0;
    if (ok) {
        memcpy(&size, h + 8, 8);
        memcpy(&chunk, h + 16, 8);
        memcpy(&n, h + 24, 8);
        memcpy(&keep, h + 32, 4);
        ok = size == f->size && chunk == f->chunk && n == f->n_chunks && (keep || !f->keep);
    }
    if (ok) {
        f->data_fd = open(f->data_path, O_RDWR | O_CLOEXEC);
        ok = f->data_fd >= 0 && fstat(f->data_fd, &st) == 0 && st.st_size == f->size;
    }
    if (ok) {
        void *m = mmap(NULL, tab_len, PROT_READ | PROT_WRITE, MAP_SHARED, tfd, 0);
        ok = m != MAP_FAILED;
        if (ok) {
            f->tab = m;
            f->tab_len = tab_len;
        }
    }
    close(tfd);
    if (!ok && f->data_fd >= 0) {
        close(f->data_fd);
        f->data_fd = -1;
    }
    return ok;
}

int pl__rfile_open(const char *url, const pl__rcache_conf *conf, int keep,
                   pl__rfile **out, char *err, size_t errcap) {
    *out = NULL;
    pl__rfile *f = pl__calloc(1, sizeof *f);
    if (!f) {
        pl__fmt(err, errcap, "%s: out of memory", url);
        return PL_ENOMEM;
    }
    f->data_fd = -1;
    f->keep = keep;
    const pl__rentry *le = conf ? pl__rlisting_find(conf->listed, url) : NULL;
    int rc;
    if (le && le->size >= 0 && le->etag && *le->etag && list_etag_trusted())
        rc = pl__robj_open_known(url, le->size, le->etag, &f->obj, err, errcap);
    else
        rc = pl__robj_open(url, &f->obj, err, errcap);
    if (rc) {
        free(f);
        return rc;
    }
    char dir[4096];
    rcache_resolve(conf, dir, sizeof dir, &f->max_bytes, &f->chunk);
    f->size = pl__robj_size(f->obj);
    f->n_chunks = (f->size + f->chunk - 1) / f->chunk;
    f->inflight = pl__calloc((size_t)f->n_chunks + 1, 1);
    if (!f->inflight) {
        pl__robj_free(f->obj);
        free(f);
        pl__fmt(err, errcap, "%s: out of memory", url);
        return PL_ENOMEM;
    }
    pthread_mutex_init(&f->mu, NULL);
    pthread_cond_init(&f->cv, NULL);
    /* The chunk size is part of the entry: an entry is laid out in one chunk size
       only, and one opened with another would be reset (emptied) under the
       mappings of those reading it. */
    char key[8192];
    pl__fmt(key, sizeof key, "%s\n%s\n%lld", url, pl__robj_etag(f->obj),
            (long long)f->chunk);
    uint64_t h = pl__hash64(key, strlen(key), 0x706c636163686531ULL);
    char p[4200];
    size_t dl = strlen(dir) + 64;
    f->dir = pl__strdup(dir);
    f->data_path = pl__calloc(1, dl);
    f->tab_path = pl__calloc(1, dl);
    f->lock_path = pl__calloc(1, dl);
    if (!f->dir || !f->data_path || !f->tab_path || !f->lock_path) {
        pl__rfile_free(f);
        pl__fmt(err, errcap, "%s: out of memory", url);
        return PL_ENOMEM;
    }
    pl__fmt(f->data_path, dl, "%s/o/%016llx.data", dir, (unsigned long long)h);
    pl__fmt(f->tab_path, dl, "%s/o/%016llx.tab", dir, (unsigned long long)h);
    pl__fmt(f->lock_path, dl, "%s/lock", dir);
    pl__fmt(p, sizeof p, "%s/o", dir);
    if (!rfile_files_held(f)) {
        if (mkdirs(p) != 0) {
            pl__fmt(err, errcap, "%s: cannot create the cache directory %s: %s", url, p,
                    strerror(errno));
            pl__rfile_free(f);
            return PL_EIO;
        }
        int lk = lock(f, err, errcap);
        if (lk < 0) {
            pl__rfile_free(f);
            return PL_EIO;
        }
        rc = rfile_files(f, err, errcap);
        unlock(lk);
    }
    if (rc == PL_OK && keep && f->size > 0) rc = pl__rfile_ensure(f, 0, f->size, err, errcap);
    if (rc) {
        pl__rfile_free(f);
        return rc;
    }
    *out = f;
    return PL_OK;
}

/* ------------------------------------------------------------ ensure */

/* A run of absent chunks [c0, c1) fetched into buf. */
typedef struct pl__run {
    int64_t c0, c1;
    unsigned char *buf;
} pl__run;

/* Fetch runs[0..n) (concurrently), then write them and mark them present
 * under the lock, evicting if needed. */
static int fetch_runs(pl__rfile *f, pl__run *runs, int n, char *err, size_t errcap) {
    pl__rrange *rr = pl__calloc((size_t)n, sizeof *rr);
    if (!rr) return PL_ENOMEM;
    int rc = PL_OK;
    int64_t total = 0;
    for (int i = 0; i < n && rc == PL_OK; i++) {
        int64_t off = runs[i].c0 * f->chunk;
        int64_t end = runs[i].c1 * f->chunk;
        if (end > f->size) end = f->size;
        runs[i].buf = pl__calloc(1, (size_t)(end - off));
        if (!runs[i].buf) {
            pl__fmt(err, errcap, "%s: out of memory for %lld bytes", pl__robj_url(f->obj),
                    (long long)(end - off));
            rc = PL_ENOMEM;
            break;
        }
        rr[i] = (pl__rrange){off, (size_t)(end - off), runs[i].buf};
        total += end - off;
    }
    if (rc == PL_OK) rc = pl__robj_read_many(f->obj, rr, n, err, errcap);
    if (rc == PL_OK) {
        int lk = lock(f, err, errcap);
        if (lk < 0) {
            rc = PL_EIO;
        } else {
            int64_t used, scanned, skipped = 0, now_t = (int64_t)now_s();
            if (usage_get(lk, &used, &scanned) != 0 || used + total > f->max_bytes ||
                now_t - scanned >= PL__RCACHE_RESCAN_S || now_t < scanned) {
                used = evict(f, total);
                scanned = now_t;
            }
            if (used >= 0) usage_set(lk, used + total, scanned);
            uint32_t *e = tab_entries(f), now = now_s();
            for (int i = 0; i < n && rc == PL_OK; i++)
                for (int64_t c = runs[i].c0; c < runs[i].c1; c++) {
                    if (__atomic_load_n(&e[c], __ATOMIC_ACQUIRE)) {
                        skipped += chunk_bytes(f->size, f->chunk, c);
                        continue;
                    }
                    int64_t b = chunk_bytes(f->size, f->chunk, c);
                    const unsigned char *src = runs[i].buf + (c - runs[i].c0) * f->chunk;
                    int64_t w = 0;
                    while (w < b) {
                        ssize_t k = pwrite(f->data_fd, src + w, (size_t)(b - w),
                                           (off_t)(c * f->chunk + w));
                        if (k <= 0) {
                            if (k < 0 && errno == EINTR) continue;
                            pl__fmt(err, errcap, "%s: cannot write cache file %s: %s",
                                    pl__robj_url(f->obj), f->data_path,
                                    k < 0 ? strerror(errno) : "no progress");
                            rc = PL_EIO;
                            break;
                        }
                        w += k;
                    }
                    if (rc == PL_OK) __atomic_store_n(&e[c], now, __ATOMIC_RELEASE);
                }
            /* Chunks another process wrote meanwhile were counted by it. */
            if (used >= 0 && rc == PL_OK && skipped)
                usage_set(lk, used + total - skipped, scanned);
            unlock(lk);
        }
    }
    for (int i = 0; i < n; i++) {
        free(runs[i].buf);
        runs[i].buf = NULL;
    }
    free(rr);
    return rc;
}

/* The absent chunks of the ranges (sorted, unique) into *need; present
 * ones are touched.  PL_ERANGE for a range past the object's end. */
static int absent(pl__rfile *f, const int64_t *offset, const int64_t *len, int n,
                      int64_t **need_out, int64_t *nn_out, char *err, size_t errcap) {
    uint32_t *e = tab_entries(f), now = now_s();
    int64_t *need = NULL;
    int64_t nn = 0, capn = 0;
    *need_out = NULL;
    *nn_out = 0;
    for (int i = 0; i < n; i++) {
        if (len[i] <= 0) continue;
        if (offset[i] < 0 || offset[i] + len[i] > f->size) {
            pl__fmt(err, errcap, "%s: bytes [%lld, %lld) past its end (%lld bytes)",
                    pl__robj_url(f->obj), (long long)offset[i],
                    (long long)(offset[i] + len[i]), (long long)f->size);
            free(need);
            return PL_ERANGE;
        }
        int64_t c0 = offset[i] / f->chunk, c1 = (offset[i] + len[i] - 1) / f->chunk + 1;
        for (int64_t c = c0; c < c1; c++) {
            uint32_t u = __atomic_load_n(&e[c], __ATOMIC_ACQUIRE);
            if (u) {
                /* Touch (at most once a second: the table is shared). */
                if (u != now) __atomic_store_n(&e[c], now, __ATOMIC_RELEASE);
                continue;
            }
            if (nn == capn) {
                int64_t nc = capn ? capn * 2 : 64;
                int64_t *nv = pl__realloc_array(need, (size_t)nc, sizeof *need);
                if (!nv) {
                    free(need);
                    pl__fmt(err, errcap, "%s: out of memory", pl__robj_url(f->obj));
                    return PL_ENOMEM;
                }
                need = nv;
                capn = nc;
            }
            need[nn++] = c;
        }
    }
    if (nn > 1) {
        qsort(need, (size_t)nn, sizeof *need, cmp_i64);
        int64_t k = 1;
        for (int64_t i = 1; i < nn; i++)
            if (need[i] != need[k - 1]) need[k++] = need[i];
        nn = k;
    }
    *need_out = need;
    *nn_out = nn;
    return PL_OK;
}

/* Fetch the chunks need[0..nn) (sorted), adjacent ones in one request. */
static int fetch_chunks(pl__rfile *f, const int64_t *need, int64_t nn, char *err,
                            size_t errcap) {
    int64_t per_req = PL__RCACHE_REQ / f->chunk > 0 ? PL__RCACHE_REQ / f->chunk : 1;
    int64_t per_batch = PL__RCACHE_BATCH / f->chunk > 0 ? PL__RCACHE_BATCH / f->chunk : 1;
    pl__run runs[64];
    int nr = 0, rc = PL_OK;
    int64_t in_batch = 0;
    for (int64_t i = 0; i < nn && rc == PL_OK;) {
        int64_t c0 = need[i], c1 = c0 + 1;
        i++;
        while (i < nn && need[i] == c1 && c1 - c0 < per_req) {
            c1++;
            i++;
        }
        runs[nr++] = (pl__run){c0, c1, NULL};
        in_batch += c1 - c0;
        if (nr == (int)(sizeof runs / sizeof runs[0]) || in_batch >= per_batch || i >= nn) {
            rc = fetch_runs(f, runs, nr, err, errcap);
            nr = 0;
            in_batch = 0;
        }
    }
    return rc;
}

/*
 * Threads of one process never fetch a chunk twice: a chunk another thread
 * is fetching (f->inflight) is waited for, then looked at again (fetched
 * here if that fetch failed).  Ensure returns only after a look that finds
 * every chunk present, and that look touches them: a chunk of the range
 * that a slow fetch (retries) let age past the grace and evicted meanwhile
 * is fetched again, and none is left older than the grace on return.
 */
#define PL__ENSURE_ROUNDS 8
int pl__rfile_ensure_many(pl__rfile *f, const int64_t *offset, const int64_t *len, int n,
                          char *err, size_t errcap) {
    for (int round = 0;; round++) {
        int64_t *need, nn;
        int rc = absent(f, offset, len, n, &need, &nn, err, errcap);
        if (rc || !nn) return rc;
        if (round >= PL__ENSURE_ROUNDS) {
            pl__fmt(err, errcap,
                    "%s: bytes at offset %lld (chunk %lld) were evicted again before they "
                    "could be read, %d times: the cache (cache.max_bytes %lld) is too "
                    "small for the reads in flight",
                    pl__robj_url(f->obj), (long long)(need[0] * f->chunk),
                    (long long)need[0], PL__ENSURE_ROUNDS, (long long)f->max_bytes);
            free(need);
            return PL_EIO;
        }
        /* Claim what nobody fetches; the rest is waited for. */
        int64_t *mine = pl__calloc((size_t)nn, sizeof *mine);
        if (!mine) {
            free(need);
            pl__fmt(err, errcap, "%s: out of memory", pl__robj_url(f->obj));
            return PL_ENOMEM;
        }
        int64_t nm = 0, nw = 0;
        pthread_mutex_lock(&f->mu);
        for (int64_t i = 0; i < nn; i++) {
            if (f->inflight[need[i]] || round >= 3) {
                /* After three rounds fetch regardless (never wait forever). */
                if (round < 3) {
                    need[nw++] = need[i];
                    continue;
                }
            }
            f->inflight[need[i]]++;
            mine[nm++] = need[i];
        }
        pthread_mutex_unlock(&f->mu);
        rc = nm ? fetch_chunks(f, mine, nm, err, errcap) : PL_OK;
        pthread_mutex_lock(&f->mu);
        for (int64_t i = 0; i < nm; i++) f->inflight[mine[i]]--;
        if (nm) pthread_cond_broadcast(&f->cv);
        for (int64_t i = 0; i < nw && rc == PL_OK; i++)
            while (f->inflight[need[i]]) pthread_cond_wait(&f->cv, &f->mu);
        pthread_mutex_unlock(&f->mu);
        free(mine);
        free(need);
        if (rc) return rc;
    }
}

int pl__rfile_present(const pl__rfile *f, int64_t offset, int64_t len) {
    if (len <= 0) return 1;
    if (offset < 0 || offset + len > f->size) return 0;
    /* Also the check after a read (pl__source_still): the bytes read before
       it are ordered before the table loads below (a weakly ordered CPU may
       otherwise load the entry first and the punched page after). */
#ifndef __SANITIZE_THREAD__ /* GCC's TSan does not model fences (-Wtsan) */
    __atomic_thread_fence(__ATOMIC_ACQUIRE);
#endif
    const uint32_t *e = tab_entries(f);
    for (int64_t c = offset / f->chunk, c1 = (offset + len - 1) / f->chunk; c <= c1; c++)
        if (!__atomic_load_n(&e[c], __ATOMIC_ACQUIRE)) return 0;
    return 1;
}

int pl__rfile_ensure(pl__rfile *f, int64_t offset, int64_t len, char *err,
                     size_t errcap) {
    return pl__rfile_ensure_many(f, &offset, &len, 1, err, errcap);
}
