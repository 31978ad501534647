/*
 * remote_tool -- drives src/source/remote/ from the command line for
 * tests/python/test_remote.py, which starts the S3-compatible server and the
 * fault-injecting proxy.  Prints what it read to stdout and the request
 * counters as JSON on the last line of stderr; exits 1 with the library's
 * message on error.
 *
 *   remote_tool head URL                 size and ETag
 *   remote_tool get URL [--wait FILE] OFF:LEN...
 *                                        the ranges' bytes, read concurrently
 *                                        (after FILE exists, with --wait)
 *   remote_tool timed PART URL...        every byte of the objects in PART-byte
 *                                        ranges, the objects read at once (one
 *                                        thread each, its ranges at once); prints
 *                                        {"bytes", "seconds"} of the reads (the
 *                                        opening HEADs before the clock starts)
 *   remote_tool list PREFIX              one URL a line
 *   remote_tool listx PREFIX             URL, size and ETag a line, as the
 *                                        listing gives them
 *   remote_tool cached DIR MAX CHUNK URL OFF:LEN...
 *                                        the ranges through the cache (ensure,
 *                                        then pread of the cache file)
 *   remote_tool listed DIR MAX CHUNK PREFIX [--wait FILE] URL OFF:LEN...
 *                                        the same, URL opened with the size and
 *                                        ETag of a listing of PREFIX (made
 *                                        before FILE exists, with --wait)
 */
#include "source/remote/remote.h"

#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <time.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void stats(void) {
    pl__rstats s;
    pl__remote_stats(&s);
    fprintf(stderr, "{\"requests\": %lld, \"bytes\": %lld, \"retries\": %lld, \"heads\": %lld, \"lists\": %lld}\n",
            (long long)s.requests, (long long)s.bytes, (long long)s.retries,
            (long long)s.heads, (long long)s.lists);
}

static int fail(const char *msg) {
    fprintf(stderr, "error: %s\n", msg);
    stats();
    return 1;
}

static int parse_range(const char *s, int64_t *off, int64_t *len) {
    char *end;
    *off = strtoll(s, &end, 10);
    if (*end != ':') return -1;
    *len = strtoll(end + 1, &end, 10);
    return *end ? -1 : 0;
}

typedef struct timed_obj {
    pl__robj *o;
    pl__rrange *r;
    int n, rc;
    char err[512];
} timed_obj;

static void *timed_read(void *arg) {
    timed_obj *t = arg;
    t->rc = pl__robj_read_many(t->o, t->r, t->n, t->err, sizeof t->err);
    return NULL;
}

/* remote_tool timed PART URL...: see the opening comment. */
static int timed(int argc, char **argv) {
    int64_t part = atoll(argv[2]);
    int n = argc - 3;
    if (part <= 0 || n <= 0) return fail("usage: timed PART URL...");
    timed_obj *t = calloc((size_t)n, sizeof *t);
    pthread_t *th = calloc((size_t)n, sizeof *th);
    char err[512];
    int64_t total = 0;
    for (int i = 0; i < n; i++) {
        if (pl__robj_open(argv[3 + i], &t[i].o, err, sizeof err)) return fail(err);
        int64_t size = pl__robj_size(t[i].o);
        t[i].n = (int)((size + part - 1) / part);
        t[i].r = calloc((size_t)t[i].n + 1, sizeof *t[i].r);
        for (int k = 0; k < t[i].n; k++) {
            int64_t off = k * part, len = size - off < part ? size - off : part;
            t[i].r[k] = (pl__rrange){off, (size_t)len, malloc((size_t)len)};
        }
        total += size;
    }
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    for (int i = 0; i < n; i++) pthread_create(&th[i], NULL, timed_read, &t[i]);
    for (int i = 0; i < n; i++) pthread_join(th[i], NULL);
    clock_gettime(CLOCK_MONOTONIC, &b);
    for (int i = 0; i < n; i++)
        if (t[i].rc) return fail(t[i].err);
    printf("{\"bytes\": %lld, \"seconds\": %.6f}\n", (long long)total,
           (double)(b.tv_sec - a.tv_sec) + (double)(b.tv_nsec - a.tv_nsec) / 1e9);
    for (int i = 0; i < n; i++) {
        for (int k = 0; k < t[i].n; k++) free(t[i].r[k].dst);
        free(t[i].r);
        pl__robj_free(t[i].o);
    }
    free(t);
    free(th);
    return 0;
}

int main(int argc, char **argv) {
    char err[1024] = "";
    if (argc < 3) return fail("usage: remote_tool head|get|list|cached ...");
    const char *cmd = argv[1];
    if (strcmp(cmd, "timed") == 0) {
        int rc = timed(argc, argv);
        stats();
        return rc;
    }
    if (strcmp(cmd, "head") == 0) {
        pl__robj *o;
        if (pl__robj_open(argv[2], &o, err, sizeof err)) return fail(err);
        printf("%lld %s\n", (long long)pl__robj_size(o), pl__robj_etag(o));
        pl__robj_free(o);
    } else if (strcmp(cmd, "get") == 0) {
        pl__robj *o;
        if (pl__robj_open(argv[2], &o, err, sizeof err)) return fail(err);
        int first = 3;
        if (argc > 4 && strcmp(argv[3], "--wait") == 0) {
            fprintf(stderr, "opened\n");
            while (access(argv[4], F_OK) != 0) usleep(10000);
            first = 5;
        }
        int n = argc - first;
        pl__rrange *r = calloc((size_t)n + 1, sizeof *r);
        for (int i = 0; i < n; i++) {
            int64_t off, len;
            if (parse_range(argv[first + i], &off, &len)) return fail("bad range");
            r[i] = (pl__rrange){off, (size_t)len, malloc((size_t)len + 1)};
        }
        if (pl__robj_read_many(o, r, n, err, sizeof err)) {
            for (int i = 0; i < n; i++) free(r[i].dst);
            free(r);
            pl__robj_free(o);
            return fail(err);
        }
        for (int i = 0; i < n; i++) {
            fwrite(r[i].dst, 1, r[i].len, stdout);
            free(r[i].dst);
        }
        free(r);
        pl__robj_free(o);
    } else if (strcmp(cmd, "list") == 0) {
        char **urls;
        int64_t n;
        if (pl__remote_list(argv[2], &urls, &n, err, sizeof err)) return fail(err);
        for (int64_t i = 0; i < n; i++) printf("%s\n", urls[i]), free(urls[i]);
        free(urls);
    } else if (strcmp(cmd, "listx") == 0) {
        pl__rlisting *l;
        if (pl__remote_list_entries(argv[2], &l, err, sizeof err)) return fail(err);
        for (int64_t i = 0; i < l->n; i++)
            printf("%s %lld %s\n", l->v[i].url, (long long)l->v[i].size,
                   l->v[i].etag ? l->v[i].etag : "-");
        pl__rlisting_free(l);
    } else if ((strcmp(cmd, "cached") == 0 && argc >= 6) ||
               (strcmp(cmd, "listed") == 0 && argc >= 7)) {
        pl__rcache_conf c = {argv[2], strtoll(argv[3], NULL, 10), strtoll(argv[4], NULL, 10),
                             NULL};
        int at = 5;
        pl__rlisting *l = NULL;
        if (strcmp(cmd, "listed") == 0) {
            if (pl__remote_list_entries(argv[at++], &l, err, sizeof err)) return fail(err);
            c.listed = l;
            if (argc > at + 1 && strcmp(argv[at], "--wait") == 0) {
                fprintf(stderr, "listed\n");
                fflush(stderr);
                while (access(argv[at + 1], F_OK) != 0) usleep(10000);
                at += 2;
            }
        }
        pl__rfile *f;
        if (pl__rfile_open(argv[at], &c, 0, &f, err, sizeof err)) {
            pl__rlisting_free(l);
            return fail(err);
        }
        int first = at + 1, n = argc - first;
        int64_t *off = calloc((size_t)n + 1, sizeof *off), *len = calloc((size_t)n + 1, sizeof *len);
        for (int i = 0; i < n; i++)
            if (parse_range(argv[first + i], &off[i], &len[i])) return fail("bad range");
        if (pl__rfile_ensure_many(f, off, len, n, err, sizeof err)) {
            free(off);
            free(len);
            pl__rfile_free(f);
            pl__rlisting_free(l);
            return fail(err);
        }
        int fd = open(pl__rfile_path(f), O_RDONLY);
        for (int i = 0; i < n; i++) {
            char *b = malloc((size_t)len[i] + 1);
            if (pread(fd, b, (size_t)len[i], off[i]) != len[i]) return fail("short pread");
            fwrite(b, 1, (size_t)len[i], stdout);
            free(b);
        }
        close(fd);
        free(off);
        free(len);
        pl__rfile_free(f);
        pl__rlisting_free(l);
    } else {
        return fail("unknown command");
    }
    stats();
    return 0;
}
