/*
 * source/text/lencache.c -- the length cache: a "<file>.pllen" sidecar of
 * every record's length in tokens under a key of what decides them (the
 * tokenizer, its options, the record keys), so that planning needs no
 * tokenizing.  Lengths learned by tokenizing are collected under the lock
 * and written by a tokenizer thread once every document is known, and at
 * free.
 */
#include "source/text/text.h"

#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define PL__LEN_MAGIC "PLLEN\0\0\0"
#define PL__LEN_VERSION 1u
#define PL__LEN_HEADER 56

static void len_header(uint8_t *h, const pl__tfile *f, uint64_t key,
                           uint32_t body_crc) {
    memset(h, 0, PL__LEN_HEADER);
    memcpy(h, PL__LEN_MAGIC, 8);
    pl__st_u32(h + 8, PL__LEN_VERSION);
    pl__st_u32(h + 12, body_crc);
    pl__st_u64(h + 16, f->st_size);
    pl__st_u64(h + 24, f->st_mtime_ns);
    pl__st_u64(h + 32, (uint64_t)f->base.n_docs);
    pl__st_u64(h + 40, key);
    pl__st_u32(h + 48, pl__crc32(0, h, 48));
}

/* Map f's <file>.pllen when it matches the file, its records and the key. */
void pl__len_load(pl__text *t, pl__tfile *f) {
    /* A remote object has no sidecar (nothing is written into a bucket). */
    if (!t->lc_key || t->lc_policy == PL_INDEX_MEMORY || f->base.rdata) return;
    char p[4200];
    pl__fmt(p, sizeof p, "%s.pllen", f->base.path);
    void *map = NULL;
    size_t len = 0;
    struct stat st;
    char e[64];
    if (pl__map_file(p, &map, &len, &st, NULL, e, sizeof e)) return;
    uint8_t want[PL__LEN_HEADER];
    const size_t body = (size_t)f->base.n_docs * 8;
    if (map && len == PL__LEN_HEADER + body)
        len_header(want, f, t->lc_key,
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
void pl__len_write(pl_source *src, const int64_t *known) {
    for (int64_t i = 0; i < src->n_files; i++) {
        const pl__tfile *f = pl__text_file(src, i);
        if (!f->base.n_docs || f->base.rdata) continue;
        int news = 0;
        for (int64_t r = 0; r < f->base.n_docs && !news; r++)
            news = known[f->base.first_doc + r] >= 0 &&
                   (!f->cached_len || f->cached_len[r] < 0);
        if (!news) continue;
        int64_t *v = pl__malloc((size_t)f->base.n_docs * sizeof *v);
        if (!v) return;
        for (int64_t r = 0; r < f->base.n_docs; r++) {
            int64_t k = known[f->base.first_doc + r];
            v[r] = k >= 0 ? k : f->cached_len ? f->cached_len[r] : -1;
            if (v[r] < 0) v[r] = -1;
        }
        char p[4200], tmp[4300];
        pl__fmt(p, sizeof p, "%s.pllen", f->base.path);
        pl__fmt(tmp, sizeof tmp, "%s.tmp.%ld.%p", p, (long)getpid(), (void *)v);
        int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
        if (fd >= 0) {
            uint8_t h[PL__LEN_HEADER];
            len_header(h, f, pl__text_of(src)->lc_key,
                           pl__crc32(0, (const uint8_t *)v, (size_t)f->base.n_docs * 8));
            int ok = write(fd, h, sizeof h) == (ssize_t)sizeof h;
            size_t bytes = (size_t)f->base.n_docs * 8, done = 0;
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
int64_t *pl__len_due(pl_source *src, int force) {
    pl__text *t = pl__text_of(src);
    if (!t->learned || !t->lc_new || (!force && !t->lc_flush)) return NULL;
    t->lc_flush = 0;
    t->lc_new = 0;
    int64_t *copy = pl__malloc((size_t)src->n_docs * sizeof *copy);
    if (copy) memcpy(copy, t->learned, (size_t)src->n_docs * sizeof *copy);
    return copy;
}

/* With the lock held: remember document index's length (PL_INDEX_WRITE);
 * len -2 for a bad record (settled, never cached). */
void pl__len_learn(pl_source *src, int64_t index, int64_t len) {
    pl__text *t = pl__text_of(src);
    if (!t->learned || t->learned[index] != -1) return;
    int64_t r;
    const pl__tfile *f = pl__text_locate(src, index, &r);
    if (f->cached_len && f->cached_len[r] >= 0) return;
    t->learned[index] = len;
    if (len >= 0) t->lc_new++;
    if (++t->lc_known == src->n_docs) t->lc_flush = 1;
}

/* A cached length of document index, or -1. */
int64_t pl__len_cached(const pl_source *src, int64_t index) {
    if (!pl__text_of(src)->lc_key) return -1;
    int64_t r;
    const pl__tfile *f = pl__text_locate(src, index, &r);
    return f->cached_len ? f->cached_len[r] : -1;
}

