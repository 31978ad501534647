/*
 * common.h -- what every module of libpolyload shares: messages, the
 * allocation helpers, hashing, the name index and the shuffle.  Not
 * installed; nothing here is part of the public contract.  Internal non-static
 * symbols carry the pl__ prefix.  The bottom of the tree (src/README.md).
 */
#ifndef POLYLOAD_COMMON_H
#define POLYLOAD_COMMON_H

#include "polyload/polyload.h"
#include "polyload/polyload_experimental.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define PL__ERRMSG_CAP PL_ERRMSG_MAX

/* A mutex for short critical sections that threads on other cores take at
 * a high rate (the pipeline's, the batch pool's): glibc's adaptive kind
 * spins a little before it sleeps in the kernel, so a contended lock held
 * for a few hundred nanoseconds costs no futex wait and wake-up.  0 or an
 * errno value, as pthread_mutex_init. */
static inline int pl__mutex_init_busy(pthread_mutex_t *mu) {
#if defined(PTHREAD_ADAPTIVE_MUTEX_INITIALIZER_NP)
    pthread_mutexattr_t a;
    if (pthread_mutexattr_init(&a)) return pthread_mutex_init(mu, NULL);
    pthread_mutexattr_settype(&a, PTHREAD_MUTEX_ADAPTIVE_NP);
    int rc = pthread_mutex_init(mu, &a);
    pthread_mutexattr_destroy(&a);
    return rc;
#else
    return pthread_mutex_init(mu, NULL);
#endif
}

/* Format into buf (always NUL-terminated, truncated if needed). */
void pl__fmt(char *buf, size_t cap, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
void pl__vfmt(char *buf, size_t cap, const char *fmt, va_list ap);

/* Record msg as the calling thread's last error (pl_last_errmsg). */
void pl__thread_err(const char *msg);

/*
 * Allocation (alloc.c): every allocation of the library goes through these,
 * which never abort (NULL on failure) and call one set of hooks, libc's
 * unless a test installed others (pl__set_alloc_hooks).  A size of 0
 * allocates 1 byte, so NULL always means failure.  Memory is released with
 * free(), or pl__free.
 */
typedef struct pl__alloc_hooks {
    void *(*malloc_fn)(size_t n);
    void *(*calloc_fn)(size_t n, size_t size);
    void *(*realloc_fn)(void *p, size_t n);
} pl__alloc_hooks;
/* Install hooks that wrap libc's allocator (they must hand out memory that
 * free() releases), e.g. to count allocations and fail the n-th one
 * (tests/c/test_oom.c); NULL, or a set with a NULL member, puts libc's back.
 * For tests: call it while no other call into the library runs. */
void pl__set_alloc_hooks(const pl__alloc_hooks *h);
void *pl__malloc(size_t n);
void *pl__calloc(size_t n, size_t size);
void *pl__realloc(void *p, size_t n);
/* n * size bytes, NULL when the product overflows. */
void *pl__realloc_array(void *p, size_t n, size_t size);
char *pl__strdup(const char *s);
/* At most n bytes of s, NUL-terminated. */
char *pl__strndup(const char *s, size_t n);
void pl__free(void *p);

/* Read a whole file into a malloc'd buffer.  PL_OK, PL_ENOENT, PL_EIO (errno
 * in *err_no) or PL_ENOMEM. */
int pl__read_file(const char *path, void **data, size_t *len, int *err_no);

/* CPUs and `threads: auto` (common/cpus.c).  pl__cpu_max_parse: the CPUs
 * of a cgroup v2 `cpu.max` line ("QUOTA PERIOD": ceil(QUOTA / PERIOD), at
 * least 1; "max PERIOD" or unreadable: 0, no quota).  pl__cpus_from: the
 * CPUs of an affinity mask of `affinity` CPUs under a quota of quota_cpus
 * (0: none), at least 1.  pl__threads_auto: cpus less `reserve` (the
 * threads that need a CPU of their own), at least 1. */
int pl__cpu_max_parse(const char *line);
int pl__cpus_from(int affinity, int quota_cpus);
int pl__threads_auto(int cpus, int reserve);
/* Lower the calling thread's priority (Linux nice PL__YIELD_NICE): a thread
 * past the CPUs then runs on what the others leave idle. */
#define PL__YIELD_NICE 10
void pl__thread_yield_priority(void);

/* 64-bit hash of bytes with a seed (xxHash XXH3). */
uint64_t pl__hash64(const void *data, size_t len, uint64_t seed);
/* CRC-32 (zlib's, IEEE polynomial). */
uint32_t pl__crc32(uint32_t crc, const void *data, size_t len);

/*
 * An index of borrowed strings by content (names.c): O(1) lookups of source
 * names.  Init with the number of names it will hold; the strings must
 * outlive it.
 */
typedef struct pl__name_slot {
    const char *s; /* NULL: empty */
    size_t n;
    uint64_t hash;
    int64_t value;
} pl__name_slot;
typedef struct pl__names {
    pl__name_slot *slot;
    uint64_t mask, used;
} pl__names;
int pl__names_init(pl__names *x, int64_t n);
void pl__names_free(pl__names *x);
/* The value stored for (s, n), or -1. */
int64_t pl__names_get(const pl__names *x, const char *s, size_t n);
/* Store (s, n) -> value unless present: -1 when stored, the earlier value
 * when the name is already there, -2 when the index is full. */
int64_t pl__names_put(pl__names *x, const char *s, size_t n, int64_t value);

/* ------------------------------------------------------------ shuffle */
/* Keyed bijection on [0, n) (Feistel network with cycle walking). */
typedef struct pl__perm {
    uint64_t n;
    uint64_t half_bits; /* bits of each Feistel half */
    uint64_t mask;
    uint64_t keys[4];
} pl__perm;
void pl__perm_init(pl__perm *p, uint64_t n, uint64_t seed, const char *name,
                   uint64_t epoch);
uint64_t pl__perm_apply(const pl__perm *p, uint64_t i);

#endif
