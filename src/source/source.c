/*
 * source.c -- the pl_source handle: what every source type shares.
 *
 * Opening expands the configured path into a sorted list of files (a single
 * file or Megatron prefix, every matching file of a directory, or the matches
 * of a glob(3) pattern; sorted by strcmp so the order does not depend on the
 * locale), opens each through its format's method table (source.h) and
 * numbers documents across files: file i holds global documents
 * [first_doc, first_doc + n_docs).  Everything a format does is reached
 * through that table; nothing here tests a source's type.  A
 * lookup is a binary search over that small per-file table, so the heap cost
 * is one record and one path per file and nothing per document.
 *
 * Reads are lock-free: after open the handle is immutable, and
 * pl__source_length / pl__source_read only read mapped memory and write
 * errors into the caller's buffer.  The public wrappers copy an error into
 * the handle's message under a mutex.  pl_source_read converts tokens with
 * one straight loop per (file dtype, output dtype) pair, picked once per call
 * from a table, so the per-token work has no branch on the dtype.
 *
 * Data files are read through what was opened, never reopened by path: the
 * descriptor of each data file (a Megatron .bin, an llm.c shard, a flat
 * file) is kept from open time, so a file replaced by rename(2) during a run
 * is still read from the file that was mapped and indexed.  A file that
 * shrinks after open would make a read through the mapping raise SIGBUS:
 * pl__source_read checks the file size with fstat(2) on that descriptor
 * and returns PL_ETRUNC naming the file and offset, and pl_source_read_many
 * reads with pread(2), where a short read is PL_ETRUNC.  A system call per
 * read would cost more than the read (about 300 ns against 40 ns for 256
 * tokens; it halves the loader's tokens/s;
 * docs/internals/decisions/0003-file-size-trusted-for-10-ms.md), so a size
 * seen by fstat serves the reads of the next 10 ms (CLOCK_MONOTONIC_COARSE, a
 * few ns): a file that shrinks is reported from then on.  A read in the
 * 10 ms after the truncation faults: the copy out of the mapping runs under
 * a guard (source/guard.h) whose SIGBUS handler returns it as PL_ETRUNC.
 * Index files (.idx, .plidx) are watched the same way: every document lookup
 * checks that the index is still as long as it was mapped (PL_ETRUNC
 * otherwise), and reads it under the guard.
 *
 * Descriptor budget: one per data file and one per index file (not for an
 * in-memory index), for the life of the handle, while the process holds
 * fewer than half of its RLIMIT_NOFILE soft limit in such descriptors (all
 * sources together).  Beyond that a file is reopened by path for each check
 * or read and refused with PL_EIO if it is not the file that was opened
 * (device and inode differ).
 */
#include "source/source.h"
#include "source/guard.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <glob.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

/* ------------------------------------------------------------ mapping */

int pl__map_file(const char *path, void **map, size_t *len, struct stat *st,
                 int *fd_out, char *err, size_t errcap) {
    *map = NULL;
    *len = 0;
    if (fd_out) *fd_out = -1;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        int e = errno;
        pl__fmt(err, errcap, "%s: cannot open: %s", path, strerror(e));
        return e == ENOENT || e == ENOTDIR ? PL_ENOENT : PL_EIO;
    }
    if (fstat(fd, st) != 0) {
        int e = errno;
        close(fd);
        pl__fmt(err, errcap, "%s: cannot stat: %s", path, strerror(e));
        return PL_EIO;
    }
    if (!S_ISREG(st->st_mode)) {
        close(fd);
        pl__fmt(err, errcap, "%s: not a regular file", path);
        return PL_EIO;
    }
    if (st->st_size > 0) {
        void *m = mmap(NULL, (size_t)st->st_size, PROT_READ, MAP_SHARED, fd, 0);
        if (m == MAP_FAILED) {
            int e = errno;
            close(fd);
            pl__fmt(err, errcap, "%s: cannot map %lld bytes: %s", path,
                    (long long)st->st_size, strerror(e));
            return e == ENOMEM ? PL_ENOMEM : PL_EIO;
        }
        *map = m;
        *len = (size_t)st->st_size;
    }
    if (fd_out)
        *fd_out = fd;
    else
        close(fd);
    return PL_OK;
}

int pl__map_any(pl__sfile *f, const char *path, int index, void **map, size_t *len,
                struct stat *st, int *fd_out, char *err, size_t errcap) {
    if (!pl__remote_is_url(path))
        return pl__map_file(path, map, len, st, fd_out, err, errcap);
    pl__rfile *r;
    int rc = pl__rfile_open(path, f->rconf, index, &r, err, errcap);
    if (rc) return rc;
    if (index)
        f->ridx = r;
    else
        f->rdata = r;
    return pl__map_file(pl__rfile_path(r), map, len, st, fd_out, err, errcap);
}

int pl__source_evicted_err(const pl__sfile *f, int64_t offset, int64_t len, char *err,
                           size_t errcap) {
    pl__fmt(err, errcap,
            "%s: bytes [%lld, %lld) were evicted from the node cache while being read, "
            "%d times: cache.max_bytes is too small for the reads in flight",
            f->path, (long long)offset, (long long)(offset + len), PL__REMOTE_REREADS);
    return PL_EIO;
}

/* ------------------------------------------------------------ descriptors */

/* How long a size seen by fstat(2) is trusted (ns; -D to measure). */
#ifndef PL__FWATCH_TRUST_NS
#define PL__FWATCH_TRUST_NS 10000000LL
#endif

static atomic_long fds_kept;  /* descriptors kept (data and index files) */
static atomic_long fds_limit; /* 0: not computed yet */

static long fd_budget(void) {
    long lim = atomic_load(&fds_limit);
    if (lim) return lim;
    struct rlimit rl;
    lim = 512;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0)
        lim = rl.rlim_cur == RLIM_INFINITY || rl.rlim_cur > (rlim_t)1 << 21
                  ? (long)1 << 20
                  : (long)(rl.rlim_cur / 2);
    atomic_store(&fds_limit, lim);
    return lim;
}

/* Take one descriptor from the budget; 0 when none is left. */
static int fd_take(void) {
    if (atomic_fetch_add(&fds_kept, 1) < fd_budget()) return 1;
    atomic_fetch_sub(&fds_kept, 1);
    return 0;
}

void pl__fwatch_keep(pl__fwatch *w, int fd, const struct stat *st) {
    w->dev = st->st_dev;
    w->ino = st->st_ino;
    atomic_store(&w->fd1, 0);
    if (fd < 0) return;
    if (fd_take())
        atomic_store(&w->fd1, fd + 1);
    else
        close(fd);
}

static void fwatch_release(pl__fwatch *w) {
    int k = atomic_exchange(&w->fd1, 0);
    if (k > 0) {
        close(k - 1);
        atomic_fetch_sub(&fds_kept, 1);
    }
}

/* The path of f's data file (idx 0) or index file (idx 1). */
static void file_path(const pl_source *src, const pl__sfile *f, int idx,
                          char *path, size_t cap) {
    pl__fmt(path, cap, "%s%s", f->path,
            idx ? src->ops->index_suffix : src->ops->data_suffix);
}

static void data_path(const pl_source *src, const pl__sfile *f, char *path,
                          size_t cap) {
    file_path(src, f, 0, path, cap);
}

/*
 * A descriptor of a watched file: the kept one (*owned 0), or, beyond the
 * budget, the path opened now and checked to be the file that was mapped
 * (*owned 1: the caller closes it).  PL_EIO with a message otherwise.
 */
static int fwatch_fd(pl__fwatch *w, const char *path, int *fd, int *owned,
                         char *err, size_t errcap) {
    int k = atomic_load(&w->fd1);
    *owned = 0;
    if (k > 0) {
        *fd = k - 1;
        return PL_OK;
    }
    int d = open(path, O_RDONLY | O_CLOEXEC);
    struct stat st;
    if (d < 0 || fstat(d, &st) != 0) {
        int e = errno;
        if (d >= 0) close(d);
        pl__fmt(err, errcap, "%s: cannot reopen (descriptor budget of %ld "
                             "spent): %s",
                path, fd_budget(), strerror(e));
        return PL_EIO;
    }
    if (st.st_dev != w->dev || st.st_ino != w->ino) {
        close(d);
        pl__fmt(err, errcap,
                "%s: replaced since the source was opened (descriptor budget "
                "of %ld spent, so it is reopened by path)",
                path, fd_budget());
        return PL_EIO;
    }
    *fd = d;
    *owned = 1;
    return PL_OK;
}

/* The data file's descriptor (see fwatch_fd). */
static int data_fd(const pl_source *src, const pl__sfile *f, int *fd,
                       int *owned, char *err, size_t errcap) {
    /* The kept descriptor needs no path: formatting it per read cost more
       than a small read (snprintf, ~5 % of a source loader's CPU). */
    int k = atomic_load(&f->data_w.fd1);
    if (k > 0) {
        *fd = k - 1;
        *owned = 0;
        return PL_OK;
    }
    char path[4096];
    /* A remote file's descriptor is its cache file's. */
    if (f->rdata) pl__fmt(path, sizeof path, "%s", pl__rfile_path(f->rdata));
    else data_path(src, f, path, sizeof path);
    /* The file record is immutable but for its atomics: cast away const. */
    return fwatch_fd((pl__fwatch *)&f->data_w, path, fd, owned, err, errcap);
}

int pl__source_data_fd(const pl_source *src, const pl__sfile *f, int *fd,
                       int *owned, char *err, size_t errcap) {
    return data_fd(src, f, fd, owned, err, errcap);
}

/*
 * Is the watched file (idx: f's index, else its data file) still at least
 * `end` bytes long?  A size seen by fstat(2) in the last 10 ms is trusted.
 * PL_OK, or PL_ETRUNC / PL_EIO with a message naming the file; what needed
 * the bytes is described by `what` (a printf format with one %lld, `arg`).
 */
static long long coarse_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
    return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* The slow path of fwatch_check: fstat, and the message. */
__attribute__((noinline)) static int
pl__fwatch_stat(const pl_source *src, const pl__sfile *f, int idx, int64_t end,
                const char *what, long long arg, long long now, char *err,
                size_t errcap) {
    pl__fwatch *w = (pl__fwatch *)(idx ? &f->idx_w : &f->data_w);
    char path[4096];
    file_path(src, f, idx, path, sizeof path);
    int fd, owned, rc;
    if ((rc = fwatch_fd(w, path, &fd, &owned, err, errcap))) return rc;
    struct stat st;
    int frc = fstat(fd, &st), e = errno;
    if (owned) close(fd);
    if (frc == 0) {
        atomic_store(&w->seen_size, (long long)st.st_size);
        atomic_store(&w->seen_until, now + PL__FWATCH_TRUST_NS);
    }
    if (frc == 0 && (int64_t)st.st_size >= end) return PL_OK;
    if (frc != 0) {
        pl__fmt(err, errcap, "%s: cannot stat: %s", path, strerror(e));
        return PL_EIO;
    }
    char need[160];
    pl__fmt(need, sizeof need, what, arg);
    pl__fmt(err, errcap,
            "%s: truncated to %lld bytes since open; %s needs bytes up to %lld",
            path, (long long)st.st_size, need, (long long)end);
    return PL_ETRUNC;
}

static inline int fwatch_check(const pl_source *src, const pl__sfile *f,
                                   int idx, int64_t end, const char *what,
                                   long long arg, char *err, size_t errcap) {
    const pl__fwatch *w = idx ? &f->idx_w : &f->data_w;
    long long now = coarse_now();
    if (end <= atomic_load(&((pl__fwatch *)w)->seen_size) &&
        now < atomic_load(&((pl__fwatch *)w)->seen_until))
        return PL_OK;
    return pl__fwatch_stat(src, f, idx, end, what, arg, now, err, errcap);
}

/* A guarded read of f's data file (idx 0) or index (idx 1) faulted: the
 * file shrank under it.  PL_ETRUNC with the message pl__fwatch_stat writes
 * (or, if the file has grown back since, one saying what happened). */
__attribute__((noinline)) static int
pl__fault_err(const pl_source *src, const pl__sfile *f, int idx, int64_t end,
              const char *what, long long arg, char *err, size_t errcap) {
    int rc = pl__fwatch_stat(src, f, idx, end, what, arg, coarse_now(), err, errcap);
    if (rc != PL_OK) return rc == PL_EIO ? PL_ETRUNC : rc;
    char path[4096], need[160];
    file_path(src, f, idx, path, sizeof path);
    pl__fmt(need, sizeof need, what, arg);
    pl__fmt(err, errcap, "%s: truncated during a read (the mapping faulted); %s needs "
                         "bytes up to %lld",
            path, need, (long long)end);
    return PL_ETRUNC;
}

/* Release a file: the format's own state, then the watched descriptors and
 * the common mappings (not its path). */
static void file_close(pl_source *src, pl__sfile *f) {
    if (src->ops->close_file) src->ops->close_file(src, f);
    fwatch_release(&f->data_w);
    fwatch_release(&f->idx_w);
    if (f->data_map) munmap(f->data_map, f->data_len);
    if (f->idx_map) munmap(f->idx_map, f->idx_map_len ? f->idx_map_len : f->idx_len);
    f->data_map = NULL;
    f->idx_map = NULL;
    f->idx_anon = 0;
    f->data_len = f->idx_len = f->idx_map_len = 0;
    pl__rfile_free(f->rdata);
    pl__rfile_free(f->ridx);
    f->rdata = f->ridx = NULL;
}

/* ------------------------------------------------------------ paths */

int pl__paths_add(pl__paths *p, const char *s, size_t len) {
    if (p->n == p->cap) {
        int64_t ncap = p->cap ? p->cap * 2 : 8;
        char **nv = pl__realloc_array(p->v, (size_t)ncap, sizeof *nv);
        if (!nv) return PL_ENOMEM;
        p->v = nv;
        p->cap = ncap;
    }
    char *d = pl__malloc(len + 1);
    if (!d) return PL_ENOMEM;
    memcpy(d, s, len);
    d[len] = '\0';
    p->v[p->n++] = d;
    return PL_OK;
}

void pl__paths_free(pl__paths *p) {
    for (int64_t i = 0; i < p->n; i++) free(p->v[i]);
    free(p->v);
    p->v = NULL;
    p->n = p->cap = 0;
    pl__rlisting_free(p->listed);
    p->listed = NULL;
}

static int cmp_str(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static void paths_sort_unique(pl__paths *p) {
    if (p->n == 0) return;
    qsort(p->v, (size_t)p->n, sizeof *p->v, cmp_str);
    int64_t k = 1;
    for (int64_t i = 1; i < p->n; i++) {
        if (strcmp(p->v[i], p->v[k - 1]) == 0)
            free(p->v[i]);
        else
            p->v[k++] = p->v[i];
    }
    p->n = k;
}

static int ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && strcmp(s + n - m, suffix) == 0;
}

/* PATH.idx is a file. */
static int prefix_exists(const char *path) {
    char idx[4096];
    pl__fmt(idx, sizeof idx, "%s.idx", path);
    struct stat st;
    return stat(idx, &st) == 0 && S_ISREG(st.st_mode);
}

static int is_dir(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

static int is_file(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

/* Our own sidecars and their temporaries are never data files. */
static int is_sidecar(const char *path) {
    static const char *const ext[] = {".plidx", ".plrec", ".pllen", ".plwds"};
    char tmp[16];
    for (size_t i = 0; i < sizeof ext / sizeof ext[0]; i++) {
        snprintf(tmp, sizeof tmp, "%s.tmp.", ext[i]);
        if (ends_with(path, ext[i]) || strstr(path, tmp)) return 1;
    }
    return 0;
}

/* Add a match of a Megatron pattern or directory: "x.idx" or "x.bin" -> "x". */
static int add_megatron_match(pl__paths *p, const char *m) {
    if (ends_with(m, ".idx") || ends_with(m, ".bin"))
        return pl__paths_add(p, m, strlen(m) - 4);
    return PL_OK;
}

static int glob_into(pl__paths *p, const char *pattern, int megatron) {
    glob_t g;
    memset(&g, 0, sizeof g);
    int grc = glob(pattern, 0, NULL, &g);
    int rc = PL_OK;
    if (grc == GLOB_NOSPACE) rc = PL_ENOMEM;
    for (size_t i = 0; grc == 0 && rc == PL_OK && i < g.gl_pathc; i++) {
        const char *m = g.gl_pathv[i];
        if (megatron)
            rc = add_megatron_match(p, m);
        else if (!is_sidecar(m) && is_file(m))
            rc = pl__paths_add(p, m, strlen(m));
    }
    globfree(&g);
    return rc;
}

static int list_dir(pl__paths *p, const char *dir, int megatron,
                        char *err, size_t errcap) {
    DIR *d = opendir(dir);
    if (!d) {
        int e = errno;
        pl__fmt(err, errcap, "%s: cannot open directory: %s", dir,
                strerror(e));
        return e == ENOENT ? PL_ENOENT : PL_EIO;
    }
    int rc = PL_OK;
    char full[4096];
    size_t dl = strlen(dir);
    const char *sep = dl > 0 && dir[dl - 1] == '/' ? "" : "/";
    struct dirent *de;
    while (rc == PL_OK && (de = readdir(d)) != NULL) {
        if (de->d_name[0] == '.') continue;
        pl__fmt(full, sizeof full, "%s%s%s", dir, sep, de->d_name);
        if (megatron) {
            if (ends_with(full, ".idx") && is_file(full))
                rc = add_megatron_match(p, full);
        } else if (!is_sidecar(full) && is_file(full)) {
            rc = pl__paths_add(p, full, strlen(full));
        }
    }
    closedir(d);
    return rc;
}

/* A remote path's objects (source/remote/). */
static int expand_remote(const char *path, int megatron, pl__paths *p, char *err,
                         size_t errcap) {
    char **urls;
    int64_t n;
    pl__rlisting *listed = NULL;
    int rc = pl__remote_expand_listed(path, megatron, &urls, &n, &listed, err, errcap);
    if (rc) return rc;
    pl__rlisting_free(p->listed);
    p->listed = listed; /* opens the objects without a HEAD each */
    for (int64_t i = 0; i < n; i++) {
        if (rc == PL_OK) rc = pl__paths_add(p, urls[i], strlen(urls[i]));
        free(urls[i]);
    }
    free(urls);
    if (rc) pl__fmt(err, errcap, "%s: out of memory expanding", path);
    return rc;
}

/* Expand opts->path into the sorted list of files (Megatron: prefixes). */
int pl__expand_paths(const char *path, int megatron, pl__paths *p, char *err,
                     size_t errcap) {
    if (pl__remote_is_url(path)) {
        int rrc = expand_remote(path, megatron, p, err, errcap);
        if (rrc == PL_OK) paths_sort_unique(p);
        return rrc;
    }
    int rc;
    if (strpbrk(path, "*?[")) {
        if (megatron) {
            char pat[4096];
            pl__fmt(pat, sizeof pat, "%s.idx", path);
            rc = glob_into(p, pat, 1);
            if (rc == PL_OK) rc = glob_into(p, path, 1);
        } else {
            rc = glob_into(p, path, 0);
        }
        if (rc) {
            pl__fmt(err, errcap, "%s: out of memory expanding the pattern",
                    path);
            return rc;
        }
        if (p->n == 0) {
            pl__fmt(err, errcap, "%s: no file matches the pattern", path);
            return PL_ENOENT;
        }
    } else if (is_dir(path) && !(megatron && prefix_exists(path))) {
        /* A Megatron prefix wins over a directory of the same name
           (megatron-core's GPTDataset keeps its index cache in PREFIX/cache). */
        rc = list_dir(p, path, megatron, err, errcap);
        if (rc) return rc;
        if (p->n == 0) {
            pl__fmt(err, errcap, "%s: the directory holds no %s", path,
                    megatron ? ".idx files" : "data files");
            return PL_ENOENT;
        }
    } else {
        size_t n = strlen(path);
        if (megatron && (ends_with(path, ".idx") ||
                         ends_with(path, ".bin")) &&
            is_file(path))
            n -= 4; /* a file of the pair was named instead of the prefix */
        rc = pl__paths_add(p, path, n);
        if (rc) {
            pl__fmt(err, errcap, "out of memory");
            return rc;
        }
    }
    paths_sort_unique(p);
    return PL_OK;
}

/* ------------------------------------------------------------ handle */

static void set_err(pl_source *src, const char *msg);
void pl__source_set_err(pl_source *src, const char *msg) { set_err(src, msg); }
static void set_err(pl_source *src, const char *msg) {
    pl__thread_err(msg);
    pthread_mutex_lock(&src->mu);
    pl__fmt(src->errmsg, sizeof src->errmsg, "%s", msg);
    pthread_mutex_unlock(&src->mu);
}

static void release_files(pl_source *src) {
    pl__rprefetch_free(src->prefetch); /* before the files it fetches into */
    src->prefetch = NULL;
    for (int64_t i = 0; i < src->n_files; i++) {
        pl__sfile *f = pl__src_file(src, i);
        file_close(src, f);
        free(f->path);
    }
    free(src->filev);
    src->filev = NULL;
    src->n_files = 0;
    src->n_docs = 0;
}

/* The format of a type, from PL__SOURCE_FORMATS; NULL for an unknown one. */
static const pl__source_ops *format_of(pl_source_type type) {
#define PL__FORMAT_REF(n) &pl__##n##_ops,
    static const pl__source_ops *const formats[] = {PL__SOURCE_FORMATS(PL__FORMAT_REF)};
#undef PL__FORMAT_REF
    for (size_t i = 0; i < sizeof formats / sizeof formats[0]; i++)
        if (formats[i]->type == type && formats[i]->version >= 1) return formats[i];
    return NULL;
}

int pl__source_init_common(pl_source *src, const pl_source_options *opts,
                           int64_t default_eos, int check_eos, char *err,
                           size_t errcap) {
    src->eos_id = opts->eos_id;
    if (src->eos_id == -1) src->eos_id = default_eos;
    if (src->eos_id < 0 && check_eos) {
        pl__fmt(err, errcap, "source %s: eos_id %lld is negative", src->name,
                (long long)opts->eos_id);
        return PL_EINVAL;
    }
    src->write_index = opts->write_index == 1 ? PL_INDEX_WRITE : opts->write_index;
    if (src->write_index != PL_INDEX_WRITE && src->write_index != PL_INDEX_READ &&
        src->write_index != PL_INDEX_MEMORY) {
        pl__fmt(err, errcap, "source %s: write_index %d is not a PL_INDEX_* policy",
                src->name, opts->write_index);
        return PL_EINVAL;
    }
    return PL_OK;
}

/* Open the files of a remote token source with up to 64 threads
 * ($POLYLOAD_REMOTE_OPEN_THREADS, 1 to 256): a file's open is a request or
 * two (a Megatron .idx fetched; the sizes and ETags come from the listing),
 * so a source of many small objects opens in the time of n / 64 round trips.
 * The error of the first file (in order) that fails is the source's. */
#define PL__OPEN_THREADS_MAX 256
static int open_threads(void) {
    const char *v = getenv("POLYLOAD_REMOTE_OPEN_THREADS");
    long x = v && *v ? strtol(v, NULL, 10) : 64;
    return x < 1 ? 1 : x > PL__OPEN_THREADS_MAX ? PL__OPEN_THREADS_MAX : (int)x;
}
typedef struct open_job {
    pl_source *src;
    int skip_damaged;
    atomic_llong next;
    pthread_mutex_t mu;
    int64_t failed; /* lowest failing file, or n_files */
    int rc;
    char err[PL__ERRMSG_CAP];
} open_job;

static void *open_worker(void *arg) {
    open_job *j = arg;
    char err[PL__ERRMSG_CAP];
    for (;;) {
        int64_t i = atomic_fetch_add(&j->next, 1);
        if (i >= j->src->n_files) break;
        pthread_mutex_lock(&j->mu);
        int stop = i > j->failed;
        pthread_mutex_unlock(&j->mu);
        if (stop) break;
        pl__sfile *f = pl__src_file(j->src, i);
        int rc = j->src->ops->open_file(j->src, f, j->skip_damaged, err, sizeof err);
        if (rc) {
            pthread_mutex_lock(&j->mu);
            if (i < j->failed) {
                j->failed = i;
                j->rc = rc;
                pl__fmt(j->err, sizeof j->err, "%s", err);
            }
            pthread_mutex_unlock(&j->mu);
        }
    }
    return NULL;
}

static int open_remote_parallel(pl_source *src, int skip_damaged, char *err, size_t cap) {
    open_job j;
    memset(&j, 0, sizeof j);
    j.src = src;
    j.skip_damaged = skip_damaged;
    j.failed = src->n_files;
    atomic_init(&j.next, 0);
    if (pthread_mutex_init(&j.mu, NULL) != 0) {
        pl__fmt(err, cap, "out of memory");
        return PL_ENOMEM;
    }
    pthread_t th[PL__OPEN_THREADS_MAX];
    int nt = open_threads();
    if (src->n_files < nt) nt = (int)src->n_files;
    int started = 0;
    for (int t = 0; t < nt; t++)
        if (pthread_create(&th[t], NULL, open_worker, &j) == 0) started++;
    if (!started) open_worker(&j); /* no thread: this one opens them all */
    for (int t = 0; t < started; t++) pthread_join(th[t], NULL);
    pthread_mutex_destroy(&j.mu);
    if (j.failed < src->n_files) {
        pl__fmt(err, cap, "%s", j.err);
        return j.rc;
    }
    return PL_OK;
}

/* Remote paths: the source's cache settings (options version >= 5) and its
 * prefetcher, given to every file. */
static int remote_setup(pl_source *src, const pl_source_options *opts, char *err,
                        size_t cap) {
    int v5 = opts->version >= 5;
    if (v5 && opts->cache_dir && !(src->cache_dir = pl__strdup(opts->cache_dir))) {
        pl__fmt(err, cap, "out of memory");
        return PL_ENOMEM;
    }
    src->rconf.dir = src->cache_dir;
    src->rconf.listed = src->listed;
    src->rconf.max_bytes = v5 ? opts->cache_max_bytes : 0;
    src->rconf.chunk = v5 ? opts->cache_chunk_bytes : 0;
    if (!src->rconf.chunk) src->rconf.chunk = (int64_t)1 << 20;
    int rc = pl__rprefetch_create(0, &src->prefetch);
    if (rc) {
        pl__fmt(err, cap, "out of memory");
        return rc;
    }
    for (int64_t i = 0; i < src->n_files; i++) pl__src_file(src, i)->rconf = &src->rconf;
    return PL_OK;
}

int pl_source_open(const pl_source_options *opts, pl_source **out) {
    return pl__source_open(opts, 0, out);
}

static int source_open_impl(const pl_source_options *opts, int skip_damaged,
                                pl_source **out);
int pl__source_open(const pl_source_options *opts, int skip_damaged, pl_source **out) {
    int rc = source_open_impl(opts, skip_damaged, out);
    if (rc < 0) pl__thread_err(out && *out ? (*out)->errmsg : "source: out of memory");
    return rc;
}

static int source_open_impl(const pl_source_options *opts, int skip_damaged,
                                pl_source **out) {
    if (!out) return PL_EINVAL;
    *out = NULL;
    pl_source *src = pl__calloc(1, sizeof *src);
    if (!src) return PL_ENOMEM;
    if (pthread_mutex_init(&src->mu, NULL) != 0) {
        free(src);
        return PL_ENOMEM;
    }
    *out = src;
    char *err = src->errmsg;
    size_t cap = sizeof src->errmsg;
    /* Reads through a mapping of a file that shrinks fault: the handler
       turns such a fault into PL_ETRUNC (source/guard.h). */
    (void)pl__guard_install();

    if (!opts || opts->version < 1 || opts->version > PL_SOURCE_OPTIONS_VERSION) {
        pl__fmt(err, cap, "source options missing or of version %d, "
                          "expected 1 to %d",
                opts ? opts->version : 0, PL_SOURCE_OPTIONS_VERSION);
        return PL_EINVAL;
    }
    const pl__source_ops *ops = format_of(opts->type);
    src->ops = ops;
    /* A text source owns its tokenizer from here on, even on failure. */
    int rc = ops && ops->setup ? ops->setup(src, opts, err, cap) : PL_OK;
    if (rc) return rc;
    if (!opts->path || !opts->path[0]) {
        pl__fmt(err, cap, "source %s: no path given",
                opts->name ? opts->name : "(unnamed)");
        return PL_EINVAL;
    }
    src->name = pl__strdup(opts->name && opts->name[0] ? opts->name
                                                        : opts->path);
    if (!src->name) {
        pl__fmt(err, cap, "out of memory");
        return PL_ENOMEM;
    }
    src->type = opts->type;
    if (!ops) {
        pl__fmt(err, cap, "source %s: unknown source type %d", src->name,
                (int)opts->type);
        return PL_EINVAL;
    }
    if ((rc = ops->init(src, opts, skip_damaged, err, cap))) return rc;

    pl__paths paths = {0};
    rc = ops->expand ? ops->expand(src, opts->path, &paths, err, cap)
                     : pl__expand_paths(opts->path, 0, &paths, err, cap);
    if (rc) {
        pl__paths_free(&paths);
        return rc;
    }
    src->file_size = ops->file_size;
    src->filev = pl__calloc((size_t)paths.n, ops->file_size);
    if (!src->filev) {
        pl__paths_free(&paths);
        pl__fmt(err, cap, "out of memory");
        return PL_ENOMEM;
    }
    src->n_files = paths.n;
    for (int64_t i = 0; i < paths.n; i++) pl__src_file(src, i)->path = paths.v[i];
    free(paths.v); /* the strings now belong to the files */
    src->listed = paths.listed;
    if (pl__remote_is_url(opts->path) && (rc = remote_setup(src, opts, err, cap))) {
        release_files(src);
        return rc;
    }

    /* Remote files open in parallel (a HEAD each only for objects no listing
       described; a Megatron .idx fetched, a JSONL object scanned, a Parquet
       footer read): a source of many objects starts in the time of a few
       requests. */
    int remote_done = 0;
    if (src->prefetch && src->n_files > 1) {
        rc = open_remote_parallel(src, skip_damaged, err, cap);
        if (rc) {
            release_files(src);
            return rc;
        }
        remote_done = 1;
    }
    for (int64_t i = 0; i < src->n_files; i++) {
        pl__sfile *f = pl__src_file(src, i);
        rc = remote_done ? PL_OK : ops->open_file(src, f, skip_damaged, err, cap);
        if (rc) {
            release_files(src);
            return rc;
        }
        f->first_doc = src->n_docs;
        src->n_docs += f->n_docs;
        src->skipped += f->skipped;
    }
    src->dtype = pl__src_file(src, 0)->dtype;
    if (ops->start) return ops->start(src, err, cap);
    return PL_OK;
}

void pl_source_free(pl_source *src) {
    if (!src) return;
    /* The format's state first: raw text joins its threads (and writes its
     * length caches) while the files are still there. */
    if (src->ops && src->ops->free) src->ops->free(src);
    release_files(src);
    pl__rlisting_free(src->listed);
    free(src->cache_dir);
    free(src->name);
    pthread_mutex_destroy(&src->mu);
    free(src);
}

const char *pl_source_errmsg(const pl_source *src) {
    return src ? src->errmsg : "no source (NULL handle)";
}

const char *pl_source_name(const pl_source *src) {
    return src && src->name ? src->name : "";
}

pl_source_type pl_source_get_type(const pl_source *src) {
    return src ? src->type : (pl_source_type)0;
}

pl_dtype pl_source_token_dtype(const pl_source *src) {
    return src ? src->dtype : (pl_dtype)0;
}

int64_t pl_source_num_documents(const pl_source *src) {
    return src ? src->n_docs : 0;
}

int64_t pl_source_num_files(const pl_source *src) {
    return src ? src->n_files : 0;
}

int64_t pl_source_num_skipped(const pl_source *src) {
    return src ? src->skipped : 0;
}

/* madvise(MADV_DONTNEED) over a file mapping's whole pages: the mapping
 * stays, its pages leave this process and fault back in from the page cache
 * (or the file) on the next touch. */
int pl__release_map(pl_source *src, const char *path, void *map, size_t len) {
    if (!map || !len) return PL_OK;
    if (madvise(map, len, MADV_DONTNEED) == 0) return PL_OK;
    char msg[PL__ERRMSG_CAP];
    pl__fmt(msg, sizeof msg, "%s: madvise(MADV_DONTNEED) failed: %s",
            path ? path : "?", strerror(errno));
    set_err(src, msg);
    return PL_EIO;
}

int pl_source_release_pages(pl_source *src) {
    if (!src) return PL_EINVAL;
    for (int64_t i = 0; i < src->n_files; i++) {
        pl__sfile *f = pl__src_file(src, i);
        int rc = pl__release_map(src, f->path, f->data_map, f->data_len);
        if (!rc && !f->idx_anon)
            rc = pl__release_map(src, f->path, f->idx_map,
                                 f->idx_map_len ? f->idx_map_len : f->idx_len);
        if (!rc && src->ops->release_pages) rc = src->ops->release_pages(src, f);
        if (rc) return rc;
    }
    return PL_OK;
}

size_t pl_source_sizeof(const pl_source *src) {
    if (!src) return 0;
    size_t n = sizeof *src + (src->name ? strlen(src->name) + 1 : 0);
    n += (size_t)src->n_files * src->file_size;
    for (int64_t i = 0; i < src->n_files; i++)
        n += strlen(pl__src_file(src, i)->path) + 1;
    return n + (src->ops && src->ops->size_of ? src->ops->size_of(src) : 0);
}

/* ------------------------------------------------------------ lookup */

/* The file holding global document `index` (0 <= index < n_docs): the last
 * file whose first_doc <= index (empty files share first_doc with the next
 * one, so the last is the one that holds it). */
static const pl__sfile *locate(const pl_source *src, int64_t index) {
    int64_t lo = 0, hi = src->n_files; /* answer in [lo, hi) */
    while (hi - lo > 1) {
        int64_t mid = lo + (hi - lo) / 2;
        if (pl__src_file(src, mid)->first_doc <= index)
            lo = mid;
        else
            hi = mid;
    }
    return pl__src_file(src, lo);
}

const pl__sfile *pl__source_locate(const pl_source *src, int64_t index, int64_t *r) {
    const pl__sfile *f = locate(src, index);
    *r = index - f->first_doc;
    return f;
}

static inline int file_doc(const pl_source *src, const pl__sfile *f, int64_t r,
                               const uint8_t **tokens, int64_t *length, char *err,
                               size_t errcap) {
    return src->ops->doc(src, f, r, tokens, length, err, errcap);
}

/* Is document index in range?  PL_ERANGE with a message otherwise. */
static inline int in_range(const pl_source *src, int64_t index, char *err,
                               size_t errcap) {
    if (index >= 0 && index < src->n_docs) return PL_OK;
    pl__fmt(err, errcap, "source %s: document index %lld out of range [0, %lld)",
            src->name ? src->name : "", (long long)index, (long long)src->n_docs);
    return PL_ERANGE;
}

/* The file of document index, its index checked not to have shrunk when
 * check_index (it is read through its mapping). */
static int find_file(const pl_source *src, int64_t index, int check_index,
                         const pl__sfile **file, char *err, size_t errcap) {
    int rc = in_range(src, index, err, errcap);
    if (rc) return rc;
    const pl__sfile *f = locate(src, index);
    *file = f;
    if (check_index && f->idx_map && !f->index_in_memory)
        return fwatch_check(src, f, 1, (int64_t)f->idx_len,
                                "the index lookup of document %lld",
                                (long long)index, err, errcap);
    return PL_OK;
}

static int doc_ex(const pl_source *src, int64_t index, int check_index,
                      const pl__sfile **file, const uint8_t **tokens,
                      int64_t *length, char *err, size_t errcap) {
    int rc = find_file(src, index, check_index, file, err, errcap);
    if (rc) return rc;
    const pl__sfile *f = *file;
    if (!f->idx_map || f->index_in_memory || !(src->ops->flags & PL__SRC_GUARD_INDEX))
        return file_doc(src, f, index - f->first_doc, tokens, length, err, errcap);
    /* The lookup reads the index through its mapping: guarded, so an index
       that shrank under it is PL_ETRUNC (source/guard.h). */
    pl__guard g;
    pl__guard_enter(&g, f->idx_map, f->idx_map_len ? f->idx_map_len : f->idx_len);
    if (sigsetjmp(g.jb, 0)) {
        pl__guard_leave(&g);
        pl__guard_recover();
        return pl__fault_err(src, f, 1, (int64_t)f->idx_len,
                             "the index lookup of document %lld", (long long)index, err,
                             errcap);
    }
    rc = file_doc(src, f, index - f->first_doc, tokens, length, err, errcap);
    pl__guard_leave(&g);
    return rc;
}

static int s_doc(const pl_source *src, int64_t index,
                   const pl__sfile **file, const uint8_t **tokens,
                   int64_t *length, char *err, size_t errcap) {
    return doc_ex(src, index, 1, file, tokens, length, err, errcap);
}

void pl__source_prefetch(const pl_source *src, int64_t index) {
    if (!src || index < 0 || index >= src->n_docs || !src->ops->prefetch) return;
    const pl__sfile *f = locate(src, index);
    src->ops->prefetch(f, index - f->first_doc);
}

/* ops->data_range of global document index in file f: 0 with a non-empty
 * range, or -1. */
static int data_range(const pl_source *src, const pl__sfile *f, int64_t index,
                      int64_t *at, int64_t *n) {
    if (src->ops->version < 2 || !src->ops->data_range ||
        src->ops->data_range(src, f, index - f->first_doc, at, n) != 0)
        return -1;
    return *n > 0 ? 0 : -1;
}

void pl__source_fetch_ahead(pl_source *src, int64_t index, int64_t offset,
                            int64_t count) {
    /* A raw text source posts its records from its lookahead instead (a
       length lookup here could tokenize). */
    if (!src || !src->prefetch || index < 0 || index >= src->n_docs ||
        (src->ops->flags & PL__SRC_LAZY))
        return;
    const pl__sfile *f;
    const uint8_t *tok;
    int64_t len;
    char err[PL__ERRMSG_CAP];
    if (s_doc(src, index, &f, &tok, &len, err, sizeof err) || !f->rdata) return;
    int64_t at, n;
    if (!tok) { /* the bytes of a document read apart from its tokens (an image) */
        if (data_range(src, f, index, &at, &n) == 0 && !pl__rfile_present(f->rdata, at, n))
            pl__rprefetch_post(src->prefetch, f->rdata, at, n);
        return;
    }
    if (offset < 0 || offset > len) return;
    if (count > len - offset) count = len - offset;
    at = (int64_t)(tok - (const uint8_t *)f->data_map) + offset * (int64_t)f->width;
    if (pl__rfile_present(f->rdata, at, count * (int64_t)f->width)) return;
    pl__rprefetch_post(src->prefetch, f->rdata, at, count * (int64_t)f->width);
}

int pl__source_length_unchecked(pl_source *src, int64_t index,
                                int64_t *length, char *err, size_t errcap) {
    const pl__sfile *f;
    const uint8_t *tok;
    return doc_ex(src, index, 0, &f, &tok, length, err, errcap);
}

int pl__source_length(pl_source *src, int64_t index, int64_t *length,
                      char *err, size_t errcap) {
    if (!src || !length) {
        pl__fmt(err, errcap, "pl_source_document_length: NULL argument");
        return PL_EINVAL;
    }
    const pl__sfile *f;
    const uint8_t *tok;
    return s_doc(src, index, &f, &tok, length, err, errcap);
}

/* ------------------------------------------------------------ conversion */

typedef void (*pl__conv_fn)(const uint8_t *src, void *dst, int64_t n);

/* Float tokens are truncated toward zero; values no int64 can hold (and NaN)
 * become 0 instead of undefined behaviour. */
static inline int64_t f2i(double x) {
    return x > -9.2e18 && x < 9.2e18 ? (int64_t)x : 0;
}

/* Both sides may be unaligned: stored-width reads of several sources lie back
 * to back in one buffer (pl_source_read_raw, pl_reply_encode). */
#define PL__CONV(NAME, ST, OT, EXPR)                                      \
    static void NAME(const uint8_t *s, void *dst, int64_t n) {           \
        uint8_t *d = dst;                                                \
        for (int64_t i = 0; i < n; i++) {                                \
            ST v;                                                        \
            memcpy(&v, s + (size_t)i * sizeof(ST), sizeof(ST));          \
            OT o = (OT)(EXPR);                                           \
            memcpy(d + (size_t)i * sizeof(OT), &o, sizeof(OT));          \
        }                                                                \
    }
#define PL__CONV_PAIR(TAG, ST, EXPR)                                      \
    PL__CONV(pl__conv_##TAG##_i64, ST, int64_t, EXPR)                    \
    PL__CONV(pl__conv_##TAG##_i32, ST, int32_t, EXPR)
PL__CONV_PAIR(u8, uint8_t, v)
PL__CONV_PAIR(i8, int8_t, v)
PL__CONV_PAIR(i16, int16_t, v)
PL__CONV_PAIR(i32, int32_t, v)
PL__CONV_PAIR(i64, int64_t, v)
PL__CONV_PAIR(f64, double, f2i(v))
PL__CONV_PAIR(f32, float, f2i((double)v))
PL__CONV_PAIR(u16, uint16_t, v)
PL__CONV_PAIR(u32, uint32_t, v)
#undef PL__CONV_PAIR
#undef PL__CONV

/* Indexed by pl_dtype, then [0] int64 output, [1] int32 output. */
static const pl__conv_fn pl__conv_table[10][2] = {
    [PL_DTYPE_UINT8] = {pl__conv_u8_i64, pl__conv_u8_i32},
    [PL_DTYPE_INT8] = {pl__conv_i8_i64, pl__conv_i8_i32},
    [PL_DTYPE_INT16] = {pl__conv_i16_i64, pl__conv_i16_i32},
    [PL_DTYPE_INT32] = {pl__conv_i32_i64, pl__conv_i32_i32},
    [PL_DTYPE_INT64] = {pl__conv_i64_i64, pl__conv_i64_i32},
    [PL_DTYPE_FLOAT64] = {pl__conv_f64_i64, pl__conv_f64_i32},
    [PL_DTYPE_FLOAT32] = {pl__conv_f32_i64, pl__conv_f32_i32},
    [PL_DTYPE_UINT16] = {pl__conv_u16_i64, pl__conv_u16_i32},
    [PL_DTYPE_UINT32] = {pl__conv_u32_i64, pl__conv_u32_i32},
};

static int source_read_impl(pl_source *src, int64_t index, int64_t offset,
                                int64_t count, void *out, pl_dtype out_dtype,
                                int marked, char *err, size_t errcap);
int pl__source_read(pl_source *src, int64_t index, int64_t offset,
                    int64_t count, void *out, pl_dtype out_dtype, char *err,
                    size_t errcap) {
    return source_read_impl(src, index, offset, count, out, out_dtype, 1, err,
                                errcap);
}

static int source_read_impl(pl_source *src, int64_t index, int64_t offset,
                                int64_t count, void *out, pl_dtype out_dtype,
                                int marked, char *err, size_t errcap) {
    if (!src || (!out && count > 0)) {
        pl__fmt(err, errcap, "pl_source_read: NULL argument");
        return PL_EINVAL;
    }
    if (out_dtype != PL_DTYPE_INT64 && out_dtype != PL_DTYPE_INT32) {
        pl__fmt(err, errcap,
                "pl_source_read: output dtype %s is not int64 or int32",
                pl_dtype_name(out_dtype));
        return PL_EINVAL;
    }
    const pl__source_ops *ops = src->ops;
    /* Lengths that come from tokenizing: the read tokenizes (once). */
    if (ops->flags & PL__SRC_LAZY)
        return ops->read(src, NULL, index, offset, count, out, out_dtype, marked, err,
                         errcap);
    const pl__sfile *f;
    const uint8_t *tok;
    int64_t len;
    int rc = s_doc(src, index, &f, &tok, &len, err, errcap);
    if (rc) return rc;
    if (ops->read)
        return ops->read(src, f, index, offset, count, out, out_dtype, marked, err,
                         errcap);
    if (offset < 0 || count < 0 || offset > len || count > len - offset) {
        pl__fmt(err, errcap,
                "source %s: document %lld: tokens [%lld, %lld + %lld) are "
                "outside the document's %lld tokens",
                src->name, (long long)index, (long long)offset,
                (long long)offset, (long long)count, (long long)len);
        return PL_ERANGE;
    }
    if (count == 0) return PL_OK;
    /* The file must still hold the range: reading a page past its end
       through the mapping would raise SIGBUS. */
    int64_t at = (int64_t)(tok - (const uint8_t *)f->data_map) +
                 offset * (int64_t)f->width;
    int64_t end = at + count * (int64_t)f->width;
    if ((rc = fwatch_check(src, f, 0, end, "document %lld", (long long)index,
                               err, errcap)))
        return rc;
    pl__conv_fn fn = pl__conv_table[f->dtype][out_dtype == PL_DTYPE_INT32];
    /* A remote file's range is made present, copied, and checked still
       present after the copy (a chunk evicted meanwhile reads as a hole):
       else copied again (pl__source_still). */
    for (int attempt = 0;; attempt++) {
        if ((rc = pl__source_ensure(f, at, end - at, err, errcap))) return rc;
        /* The size seen above may be up to 10 ms old: the copy runs guarded,
           so a file truncated since faults into PL_ETRUNC (source/guard.h). */
        pl__guard g;
        pl__guard_enter(&g, f->data_map, f->data_len);
        if (sigsetjmp(g.jb, 0)) {
            pl__guard_leave(&g);
            pl__guard_recover();
            return pl__fault_err(src, f, 0, end, "document %lld", (long long)index, err,
                                 errcap);
        }
        fn(tok + (size_t)offset * f->width, out, count);
        pl__guard_leave(&g);
        if (pl__source_still(f, at, end - at)) return PL_OK;
        if (attempt + 1 == PL__REMOTE_REREADS)
            return pl__source_evicted_err(f, at, end - at, err, errcap);
    }
}

int pl_source_document_length(pl_source *src, int64_t index,
                              int64_t *length) {
    char err[PL__ERRMSG_CAP];
    int rc = pl__source_length(src, index, length, err, sizeof err);
    if (rc && src) set_err(src, err);
    return rc;
}

int pl_source_read(pl_source *src, int64_t index, int64_t offset,
                   int64_t count, void *out, pl_dtype out_dtype) {
    char err[PL__ERRMSG_CAP];
    int rc = source_read_impl(src, index, offset, count, out, out_dtype, 0, err,
                                  sizeof err);
    if (rc && src) set_err(src, err);
    return rc;
}

/* ------------------------------------------------------------ stats */

/* The index of f, read through its mapping, has not shrunk since open. */
static int index_intact(const pl_source *src, const pl__sfile *f, char *err,
                            size_t errcap) {
    if (!f->idx_map || f->index_in_memory) return PL_OK;
    return fwatch_check(src, f, 1, (int64_t)f->idx_len, "a scan of %lld documents",
                            (long long)f->n_docs, err, errcap);
}

int pl__source_check_index(pl_source *src, char *err, size_t errcap) {
    for (int64_t i = 0; i < src->n_files; i++) {
        int rc = index_intact(src, pl__src_file(src, i), err, errcap);
        if (rc) return rc;
    }
    return PL_OK;
}

#define PL__HIST_BITS 16

/* The k-th smallest (1-based) document length, by narrowing a histogram:
 * each pass over the lengths keeps PL__HIST_BITS more bits of the answer.
 * Every length lies in [0, 2^bits). */
static int kth_length(const pl_source *src, int64_t k, int bits,
                          uint64_t *hist, int64_t *value, char *err,
                          size_t errcap) {
    uint64_t lo = 0;
    uint64_t rank = (uint64_t)k;
    while (bits > 0) {
        int shift = bits > PL__HIST_BITS ? bits - PL__HIST_BITS : 0;
        uint64_t span = bits >= 64 ? UINT64_MAX : ((uint64_t)1 << bits) - 1;
        size_t nb = (size_t)(span >> shift) + 1;
        memset(hist, 0, nb * sizeof *hist);
        for (int64_t i = 0; i < src->n_files; i++) {
            const pl__sfile *f = pl__src_file(src, i);
            int irc = index_intact(src, f, err, errcap);
            if (irc) return irc;
            for (int64_t r = 0; r < f->n_docs; r++) {
                const uint8_t *tok;
                int64_t len;
                int rc = file_doc(src, f, r, &tok, &len, err, errcap);
                if (rc) return rc;
                uint64_t v = (uint64_t)len;
                if (v >= lo && v - lo <= span) hist[(v - lo) >> shift]++;
            }
        }
        size_t b = 0;
        uint64_t cum = 0;
        while (b + 1 < nb && cum + hist[b] < rank) cum += hist[b++];
        rank -= cum;
        lo += (uint64_t)b << shift;
        bits = shift;
    }
    *value = (int64_t)lo;
    return PL_OK;
}

int pl_source_get_stats(pl_source *src, pl_source_stats *out) {
    if (!src || !out) return PL_EINVAL;
    if (out->size < sizeof *out) {
        set_err(src, "pl_source_get_stats: out->size must be sizeof(pl_source_stats)");
        return PL_EINVAL;
    }
    char err[PL__ERRMSG_CAP];
    memset(out, 0, sizeof *out);
    out->size = sizeof *out;
    out->files = src->n_files;
    out->documents = src->n_docs;
    int64_t maxlen = 0, total = 0;
    for (int64_t i = 0; i < src->n_files; i++) {
        const pl__sfile *f = pl__src_file(src, i);
        int irc = index_intact(src, f, err, sizeof err);
        if (irc) {
            set_err(src, err);
            return irc;
        }
        for (int64_t r = 0; r < f->n_docs; r++) {
            const uint8_t *tok;
            int64_t len;
            int rc = file_doc(src, f, r, &tok, &len, err, sizeof err);
            if (rc) {
                set_err(src, err);
                return rc;
            }
            total += len;
            if (len > maxlen) maxlen = len;
        }
    }
    out->tokens = total;
    out->length_max = maxlen;
    if (src->n_docs == 0) return PL_OK;

    int bits = 0;
    while (bits < 63 && ((uint64_t)maxlen >> bits) != 0) bits++;
    uint64_t *hist = pl__calloc((size_t)1 << PL__HIST_BITS, sizeof *hist);
    if (!hist) {
        set_err(src, "pl_source_get_stats: out of memory");
        return PL_ENOMEM;
    }
    /* Nearest-rank percentiles: the ceil(p * n / 100)-th smallest length. */
    static const int pct[3] = {50, 90, 99};
    int64_t *dst[3] = {&out->length_p50, &out->length_p90, &out->length_p99};
    int rc = PL_OK;
    for (int j = 0; j < 3 && rc == PL_OK; j++) {
        int64_t n = src->n_docs;
        int64_t k = n / 100 * pct[j] + ((n % 100) * pct[j] + 99) / 100;
        if (k < 1) k = 1;
        if (k > n) k = n;
        rc = kth_length(src, k, bits, hist, dst[j], err, sizeof err);
    }
    free(hist);
    if (rc) set_err(src, err);
    return rc;
}

/*
 * pl_source_read_many reads with pread(2) instead of through the mapping:
 * it serves source-loader processes that read a few documents from each of
 * many sources, and a mapping would leave the pages around every read
 * (fault-around) mapped, and counted, in that process.  Bounds are checked
 * on the mapped index exactly as for pl_source_read.  It reads through the
 * descriptor kept from open time, never a reopened path (see above).
 */
typedef struct pl__preader {
    const pl__sfile *file; /* whose data file fd is at hand */
    int fd, owned;         /* owned: opened for this call, closed after */
    uint8_t *buf;
    size_t cap;
} pl__preader;

static int pread_range(const pl_source *src, pl__preader *r,
                           const pl__sfile *f, const uint8_t *tok,
                           int64_t offset, int64_t count, void *out, int raw,
                           char *err, size_t errcap) {
    char path[4096];
    if (r->file != f) {
        if (r->owned) close(r->fd);
        r->file = NULL;
        r->fd = -1;
        r->owned = 0;
        int rc = data_fd(src, f, &r->fd, &r->owned, err, errcap);
        if (rc) return rc;
        r->file = f;
    }
    if (raw && f->dtype != src->dtype) {
        data_path(src, f, path, sizeof path);
        pl__fmt(err, errcap,
                "%s: token dtype %s differs from the source's %s (files of one "
                "source read at stored width must share it)",
                path, pl_dtype_name(f->dtype), pl_dtype_name(src->dtype));
        return PL_EDTYPE;
    }
    size_t bytes = (size_t)count * f->width;
    if (!raw && bytes > r->cap) {
        uint8_t *nb = pl__realloc_array(r->buf, bytes, 1);
        if (!nb) {
            pl__fmt(err, errcap, "pl_source_read_many: out of memory");
            return PL_ENOMEM;
        }
        r->buf = nb;
        r->cap = bytes;
    }
    uint8_t *dst = raw ? out : r->buf;
    off_t at = (off_t)((tok - (const uint8_t *)f->data_map) + offset * (int64_t)f->width);
    for (int attempt = 0;; attempt++) {
        int erc = pl__source_ensure(f, (int64_t)at, (int64_t)bytes, err, errcap);
        if (erc) return erc;
        size_t got = 0;
        while (got < bytes) {
            ssize_t k = pread(r->fd, dst + got, bytes - got, at + (off_t)got);
            if (k <= 0) {
                int e = errno;
                data_path(src, f, path, sizeof path);
                pl__fmt(err, errcap, "%s: read of %zu bytes at offset %lld failed: %s",
                        path, bytes, (long long)at,
                        k == 0 ? "file shrank since open" : strerror(e));
                return k == 0 ? PL_ETRUNC : PL_EIO;
            }
            got += (size_t)k;
        }
        /* Checked after the read, as the mapped path is. */
        if (pl__source_still(f, (int64_t)at, (int64_t)bytes)) break;
        if (attempt + 1 == PL__REMOTE_REREADS)
            return pl__source_evicted_err(f, (int64_t)at, (int64_t)bytes, err, errcap);
    }
    if (!raw) pl__conv_table[f->dtype][0](r->buf, out, count);
    return PL_OK;
}

void pl__tokens_convert(const void *src, pl_dtype src_dtype, void *dst,
                        pl_dtype dst_dtype, int64_t n) {
    pl__conv_table[src_dtype][dst_dtype == PL_DTYPE_INT32](src, dst, n);
}

/* Remote files: make every range of reads present at once (up to the
 * policy's concurrency in flight) before they are read one by one.  Errors
 * of lookups are left to the reads. */
typedef struct rrange {
    pl__rfile *f;
    int64_t at, len;
} rrange;

static int rrange_cmp(const void *a, const void *b) {
    const rrange *x = a, *y = b;
    if (x->f != y->f) return (uintptr_t)x->f < (uintptr_t)y->f ? -1 : 1;
    return x->at < y->at ? -1 : x->at > y->at;
}

static int ensure_reads(pl_source *src, const pl_read *reads, int64_t n, int32_t only,
                        char *err, size_t errcap) {
    if (!src->prefetch || n <= 0 || (src->ops->flags & PL__SRC_LAZY)) return PL_OK;
    rrange *v = pl__calloc((size_t)n, sizeof *v);
    int64_t *off = pl__calloc((size_t)n, sizeof *off), *len = pl__calloc((size_t)n, sizeof *len);
    int rc = PL_OK;
    if (!v || !off || !len) {
        free(v);
        free(off);
        free(len);
        return PL_OK; /* the reads fetch for themselves */
    }
    int64_t m = 0;
    for (int64_t i = 0; i < n; i++) {
        const pl__sfile *f;
        const uint8_t *tok;
        int64_t dl;
        if (only >= 0 && reads[i].source != only) continue;
        if (s_doc(src, reads[i].index, &f, &tok, &dl, err, errcap) || !f->rdata) continue;
        int64_t at, dn;
        if (!tok) { /* bytes read apart from the tokens (an image) */
            if (data_range(src, f, reads[i].index, &at, &dn) == 0)
                v[m++] = (rrange){f->rdata, at, dn};
            continue;
        }
        int64_t o = reads[i].offset, c = reads[i].count;
        if (o < 0 || c <= 0 || o > dl || c > dl - o) continue;
        v[m++] = (rrange){f->rdata,
                          (int64_t)(tok - (const uint8_t *)f->data_map) + o * (int64_t)f->width,
                          c * (int64_t)f->width};
    }
    qsort(v, (size_t)m, sizeof *v, rrange_cmp);
    for (int64_t i = 0; i < m && rc == PL_OK;) {
        int64_t j = i;
        for (; j < m && v[j].f == v[i].f && j - i < INT32_MAX; j++) {
            off[j - i] = v[j].at;
            len[j - i] = v[j].len;
        }
        rc = pl__rfile_ensure_many(v[i].f, off, len, (int)(j - i), err, errcap);
        i = j;
    }
    free(v);
    free(off);
    free(len);
    return rc;
}

void pl__source_ensure_reads(pl_source *src, const pl_read *reads, int64_t n,
                             int32_t only) {
    char err[PL__ERRMSG_CAP];
    if (src) (void)ensure_reads(src, reads, n, only, err, sizeof err);
}

/* pl_source_read_many (raw 0: int64 tokens) and pl_source_read_raw (raw 1:
 * stored width, at most cap bytes). */
static int read_ranges(pl_source *src, const pl_read *reads, int64_t n,
                           void *out, size_t cap, int raw) {
    if (!src || (n > 0 && (!reads || !out)) || n < 0) return PL_EINVAL;
    char err[PL__ERRMSG_CAP];
    size_t es = raw ? pl_dtype_size(src->dtype) : sizeof(int64_t);
    if (raw) {
        size_t need = 0;
        for (int64_t i = 0; i < n; i++) {
            if (reads[i].count < 0) return PL_EINVAL;
            need += (size_t)reads[i].count * es;
        }
        if (need > cap) {
            pl__fmt(err, sizeof err,
                    "pl_source_read_raw: the reads need %zu bytes, the buffer holds %zu",
                    need, cap);
            set_err(src, err);
            return PL_EINVAL;
        }
    }
    pl__preader r = {NULL, -1, 0, NULL, 0};
    int rc = ensure_reads(src, reads, n, -1, err, sizeof err);
    for (int64_t i = 0; i < n && rc == PL_OK; i++) {
        const pl__sfile *f;
        const uint8_t *tok;
        int64_t len, off = reads[i].offset, count = reads[i].count;
        if (src->ops->flags & PL__SRC_LAZY) {
            rc = src->ops->read(src, NULL, reads[i].index, off, count, out,
                                raw ? src->dtype : PL_DTYPE_INT64, 1, err, sizeof err);
            if (rc) break;
            out = (uint8_t *)out + (size_t)count * es;
            continue;
        }
        rc = s_doc(src, reads[i].index, &f, &tok, &len, err, sizeof err);
        if (rc) break;
        if (off < 0 || count < 0 || off > len || count > len - off) {
            pl__fmt(err, sizeof err,
                    "source %s: document %lld: tokens [%lld, %lld + %lld) are "
                    "outside the document's %lld tokens",
                    src->name, (long long)reads[i].index, (long long)off,
                    (long long)off, (long long)count, (long long)len);
            rc = PL_ERANGE;
            break;
        }
        if (count > 0 && src->ops->read)
            rc = src->ops->read(src, f, reads[i].index, off, count, out,
                                raw ? src->dtype : PL_DTYPE_INT64, 1, err, sizeof err);
        else if (count > 0)
            rc = pread_range(src, &r, f, tok, off, count, out, raw, err, sizeof err);
        out = (uint8_t *)out + (size_t)count * es;
    }
    if (r.owned) close(r.fd);
    free(r.buf);
    if (rc) set_err(src, err);
    return rc;
}

int pl_source_read_many(pl_source *src, const pl_read *reads, int64_t n,
                        int64_t *out) {
    return read_ranges(src, reads, n, out, 0, 0);
}

int pl_source_read_raw(pl_source *src, const pl_read *reads, int64_t n,
                       void *out, size_t cap) {
    return read_ranges(src, reads, n, out, cap, 1);
}

/* ------------------------------------------------------------ per format */

/* The file and local sample of an image source's sample index. */
static int image_locate(pl_source *src, int64_t index, const pl__sfile **file,
                            int64_t *r, char *err, size_t errcap) {
    if (!src || !src->ops || !src->ops->image_info) {
        pl__fmt(err, errcap, "not a webdataset source");
        return PL_EINVAL;
    }
    if (index < 0 || index >= src->n_docs) {
        pl__fmt(err, errcap, "source %s: sample %lld out of range [0, %lld)", src->name,
                (long long)index, (long long)src->n_docs);
        return PL_ERANGE;
    }
    *file = pl__source_locate(src, index, r);
    return PL_OK;
}

int pl__source_image_info(pl_source *src, int64_t index, pl_image_info *out, char *err,
                          size_t errcap) {
    const pl__sfile *f;
    int64_t r;
    int rc = image_locate(src, index, &f, &r, err, errcap);
    if (rc) return rc;
    return src->ops->image_info(src, f, r, out, err, errcap);
}

int pl__source_read_image(pl_source *src, int64_t index, uint8_t *out, size_t cap,
                          pl_image_info *info, char *err, size_t errcap) {
    const pl__sfile *f;
    int64_t r;
    int rc = image_locate(src, index, &f, &r, err, errcap);
    if (rc) return rc;
    return src->ops->read_image(src, f, r, index, out, cap, info, err, errcap);
}

int pl_source_image_info(pl_source *src, int64_t index, pl_image_info *out) {
    char err[PL__ERRMSG_CAP];
    if (!out) return PL_EINVAL;
    int rc = pl__source_image_info(src, index, out, err, sizeof err);
    if (rc && src) set_err(src, err);
    return rc;
}

int pl_source_read_image(pl_source *src, int64_t index, void *out, size_t cap,
                         pl_image_info *info) {
    char err[PL__ERRMSG_CAP];
    int rc = pl__source_read_image(src, index, out, cap, info, err, sizeof err);
    if (rc && src) set_err(src, err);
    return rc;
}

int pl_source_lengths(pl_source *src, const int64_t *index, int64_t n,
                      int64_t *lengths) {
    if (!src || n < 0 || (n > 0 && (!index || !lengths))) return PL_EINVAL;
    char err[PL__ERRMSG_CAP];
    for (int64_t i = 0; i < n; i++)
        if (in_range(src, index[i], err, sizeof err)) {
            set_err(src, err);
            return PL_ERANGE;
        }
    if (src->ops->lengths) return src->ops->lengths(src, index, n, lengths);
    for (int64_t i = 0; i < n; i++) {
        int64_t len = 0;
        int rc = pl__source_length(src, index[i], &len, err, sizeof err);
        if (rc == PL_ENOMEM) return rc;
        lengths[i] = rc ? rc : len;
    }
    return PL_OK;
}

int pl__source_is_lazy(const pl_source *src) {
    return src && src->ops && (src->ops->flags & PL__SRC_LAZY);
}

void pl__source_lookahead(pl_source *src, const pl__perm *perm, int64_t lo,
                          int64_t n, int64_t epoch, int64_t pos) {
    if (src->ops->lookahead) src->ops->lookahead(src, perm, lo, n, epoch, pos);
}

static pl__format_stats stats_of(const pl_source *src) {
    pl__format_stats st = {0, 0};
    if (src && src->ops && src->ops->stats) src->ops->stats(src, &st);
    return st;
}

int64_t pl_source_num_tokenized(const pl_source *src) {
    return stats_of(src).tokenized;
}

int64_t pl_source_tokenize_cpu_ns(const pl_source *src) {
    return stats_of(src).tokenize_cpu_ns;
}

int pl_source_release_tokenizer(pl_source *src) {
    if (!src) return PL_EINVAL;
    if (!src->ops || !src->ops->release_tokenizer) return PL_OK;
    return src->ops->release_tokenizer(src);
}

int pl_source_tokenizer_state(const pl_source *src, int64_t *loads, int64_t *shared_by) {
    if (loads) *loads = 0;
    if (shared_by) *shared_by = 0;
    if (!src || !src->ops || !src->ops->tokenizer_state) return -1;
    return src->ops->tokenizer_state(src, loads, shared_by);
}
