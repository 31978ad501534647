/*
 * Heap memory per open source, excluding mapped file pages.
 *
 * Build (after cmake --build build-bench):
 *   gcc -O2 -std=c11 -Iinclude bench/embedded/memory.c build-bench/libpolyload.a \
 *       -lyaml -lxxhash -ljansson -lzstd -lz -lpthread -lm -o build-bench/bench_memory
 * Run (after bench/embedded/startup.py has written bench/out/startup/):
 *   build-bench/bench_memory bench/out/startup/files 2000 \
 *       bench/out/startup/single_file.yaml bench/out/startup/many_sources.yaml \
 *       bench/out/startup/one_source.yaml
 *
 * Heap = glibc mallinfo2() uordblks + hblkhd (bytes in use from the heap and
 * from malloc's own mmaps), with M_ARENA_MAX = 1 so that every thread
 * allocates from the arena mallinfo2 reports.  Mapped .bin/.idx pages are not
 * heap and are not counted.  Reported:
 *   1. pl_source_open of 1 and of N Megatron prefixes, each its own source:
 *      heap delta per source and pl_source_sizeof per source;
 *   2. one source over the directory of N prefixes (N files in one source);
 *   3. pl_loader_create with a 1-source config (one file, f0000) and with
 *      the N-source config (then the 1-source directory config) (the whole embedded loader: planner state, batch pools,
 *      threads), after one step consumed and 0.3 s for the prefetch queues
 *      to fill: heap delta, and the marginal heap per extra source
 *      ((many - one) / (N - 1); both configs share the topology, so the
 *      batch pools cancel).
 * Also the open file descriptors and mappings each case leaves behind.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dirent.h>
#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "polyload/polyload.h"

static size_t heap_now(void) {
    struct mallinfo2 mi = mallinfo2();
    return mi.uordblks + mi.hblkhd;
}

static long count_lines(const char *path) {
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    long n = 0;
    int c;
    while ((c = fgetc(f)) != EOF) n += c == '\n';
    fclose(f);
    return n;
}

static long count_fds(void) {
    DIR *d = opendir("/proc/self/fd");
    if (!d) return -1;
    long n = 0;
    struct dirent *e;
    while ((e = readdir(d))) n += e->d_name[0] != '.';
    closedir(d);
    return n - 1; /* the DIR itself */
}

static int cmp(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Sorted prefixes (path without .idx) of the *.idx files in dir. */
static char **list_prefixes(const char *dir, long *n) {
    DIR *d = opendir(dir);
    if (!d) return NULL;
    size_t cap = 64, k = 0;
    char **v = malloc(cap * sizeof *v);
    struct dirent *e;
    while ((e = readdir(d))) {
        size_t len = strlen(e->d_name);
        if (len < 5 || strcmp(e->d_name + len - 4, ".idx") != 0) continue;
        if (k == cap) v = realloc(v, (cap *= 2) * sizeof *v);
        char *p = malloc(strlen(dir) + len + 2);
        sprintf(p, "%s/%.*s", dir, (int)(len - 4), e->d_name);
        v[k++] = p;
    }
    closedir(d);
    qsort(v, k, sizeof *v, cmp);
    *n = (long)k;
    return v;
}

static int open_many(char **prefixes, long n) {
    pl_source **s = malloc((size_t)n * sizeof *s);
    long maps0 = count_lines("/proc/self/maps"), fds0 = count_fds();
    size_t h0 = heap_now();
    size_t sz = 0;
    for (long i = 0; i < n; i++) {
        pl_source_options o = {0};
        o.version = PL_SOURCE_OPTIONS_VERSION;
        o.type = PL_SOURCE_MEGATRON;
        o.path = prefixes[i];
        if (pl_source_open(&o, &s[i]) != PL_OK) {
            fprintf(stderr, "open %s: %s\n", prefixes[i], pl_source_errmsg(s[i]));
            return 1;
        }
    }
    size_t h1 = heap_now();
    for (long i = 0; i < n; i++) sz += pl_source_sizeof(s[i]);
    long maps1 = count_lines("/proc/self/maps"), fds1 = count_fds();
    printf("{\"case\": \"separate_sources\", \"sources\": %ld, "
           "\"heap_delta_bytes\": %zu, \"heap_per_source_bytes\": %.1f, "
           "\"sizeof_per_source_bytes\": %.1f, \"mappings_per_source\": %.2f, "
           "\"fds_per_source\": %.2f}\n",
           n, h1 - h0, (double)(h1 - h0) / (double)n, (double)sz / (double)n,
           (double)(maps1 - maps0) / (double)n, (double)(fds1 - fds0) / (double)n);
    for (long i = 0; i < n; i++) pl_source_free(s[i]);
    free(s);
    return 0;
}

static int open_dir(const char *dir, long nfiles) {
    size_t h0 = heap_now();
    long maps0 = count_lines("/proc/self/maps");
    pl_source_options o = {0};
    o.version = PL_SOURCE_OPTIONS_VERSION;
    o.type = PL_SOURCE_MEGATRON;
    o.path = dir;
    pl_source *s = NULL;
    if (pl_source_open(&o, &s) != PL_OK) {
        fprintf(stderr, "open %s: %s\n", dir, pl_source_errmsg(s));
        return 1;
    }
    size_t h1 = heap_now();
    long maps1 = count_lines("/proc/self/maps");
    printf("{\"case\": \"one_source_directory\", \"files\": %lld, "
           "\"heap_delta_bytes\": %zu, \"heap_per_file_bytes\": %.1f, "
           "\"sizeof_bytes\": %zu, \"mappings\": %ld}\n",
           (long long)pl_source_num_files(s), h1 - h0,
           (double)(h1 - h0) / (double)nfiles, pl_source_sizeof(s),
           maps1 - maps0);
    pl_source_free(s);
    return 0;
}

static long long loader_heap(const char *cfgpath, long *nsrc) {
    pl_config *cfg = NULL;
    if (pl_config_parse_file(cfgpath, &cfg) != PL_OK) {
        fprintf(stderr, "%s: %s\n", cfgpath, pl_config_errmsg(cfg));
        return -1;
    }
    *nsrc = (long)pl_config_num_sources(cfg);
    size_t h0 = heap_now();
    pl_loader *l = NULL;
    if (pl_loader_create(cfg, NULL, &l) != PL_OK) {
        fprintf(stderr, "%s: %s\n", cfgpath, pl_loader_errmsg(l));
        return -1;
    }
    /* consume one whole step for every rank, then let the workers fill the
       prefetch queues, so that batch pools are at their steady size */
    int64_t mbpr = 0;
    pl_config_get_int(cfg, "micro_batches_per_rank", &mbpr);
    const int64_t world = pl_config_world_size(cfg);
    for (int64_t mb = 0; mb < (mbpr > 0 ? mbpr : 1); mb++)
        for (int64_t r = 0; r < world; r++) {
            const pl_batch *b = NULL;
            if (pl_loader_next(l, r, &b) != PL_OK) {
                fprintf(stderr, "%s: %s\n", cfgpath, pl_loader_errmsg(l));
                return -1;
            }
        }
    struct timespec ts = {0, 300 * 1000 * 1000};
    nanosleep(&ts, NULL);
    size_t h1 = heap_now();
    printf("{\"case\": \"loader\", \"config\": \"%s\", \"sources\": %ld, "
           "\"heap_delta_bytes\": %zu}\n", cfgpath, *nsrc, h1 - h0);
    pl_loader_free(l);
    pl_config_free(cfg);
    return (long long)(h1 - h0);
}

int main(int argc, char **argv) {
    mallopt(M_ARENA_MAX, 1);
    if (argc < 3) {
        fprintf(stderr, "usage: %s DIR N [BASE.yaml MANY_SOURCES.yaml [MORE.yaml...]]\n",
                argv[0]);
        return 2;
    }
    long n = 0, want = atol(argv[2]);
    char **p = list_prefixes(argv[1], &n);
    if (!p || n < want) {
        fprintf(stderr, "%s: found %ld prefixes, want %ld\n", argv[1], n, want);
        return 1;
    }
    if (open_many(p, 1) || open_many(p, want) || open_dir(argv[1], n)) return 1;
    if (argc >= 5) {
        long n1 = 0, n2 = 0;
        long long a = loader_heap(argv[3], &n1), b = loader_heap(argv[4], &n2);
        if (a < 0 || b < 0) return 1;
        if (n2 > n1)
            printf("{\"case\": \"loader_marginal\", \"heap_per_extra_source_bytes\": "
                   "%.1f}\n", (double)(b - a) / (double)(n2 - n1));
        for (int i = 5; i < argc; i++) { /* more configs, reported only */
            long k = 0;
            if (loader_heap(argv[i], &k) < 0) return 1;
        }
    }
    for (long i = 0; i < n; i++) free(p[i]);
    free(p);
    return 0;
}
