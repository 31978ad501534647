/*
 * alloc.c -- the one allocation hook of libpolyload.  Every allocation of the
 * library (not those that libyaml, Jansson, zlib, zstd or the C++ shims make
 * for themselves) goes through pl__malloc, pl__calloc, pl__realloc and the
 * helpers built on them, which call the installed hooks: libc's by default,
 * or a test's that counts allocations and fails the n-th one, as SQLite's
 * test_malloc.c does (tests/c/test_oom.c).  Memory is released with free()
 * (pl__free): a hook hands out libc memory, wrapping libc's allocator.
 */
#include "common/common.h"

#include <stdlib.h>
#include <string.h>

static void *libc_malloc(size_t n) { return malloc(n); }
static void *libc_calloc(size_t n, size_t size) { return calloc(n, size); }
static void *libc_realloc(void *p, size_t n) { return realloc(p, n); }

static const pl__alloc_hooks libc_hooks = {libc_malloc, libc_calloc, libc_realloc};
static pl__alloc_hooks installed;
/* The hooks in use: &libc_hooks or &installed.  Read on every allocation,
 * possibly by the library's threads, so an atomic pointer. */
static const pl__alloc_hooks *hooks = &libc_hooks;

void pl__set_alloc_hooks(const pl__alloc_hooks *h) {
    if (h && h->malloc_fn && h->calloc_fn && h->realloc_fn) {
        installed = *h;
        __atomic_store_n(&hooks, &installed, __ATOMIC_RELEASE);
    } else {
        __atomic_store_n(&hooks, &libc_hooks, __ATOMIC_RELEASE);
    }
}

static const pl__alloc_hooks *current(void) {
    return __atomic_load_n(&hooks, __ATOMIC_ACQUIRE);
}

void *pl__malloc(size_t n) { return current()->malloc_fn(n ? n : 1); }

void *pl__calloc(size_t n, size_t size) {
    if (n == 0 || size == 0) return current()->calloc_fn(1, 1);
    return current()->calloc_fn(n, size);
}

void *pl__realloc(void *p, size_t n) { return current()->realloc_fn(p, n ? n : 1); }

void *pl__realloc_array(void *p, size_t n, size_t size) {
    if (size != 0 && n > SIZE_MAX / size) return NULL;
    return pl__realloc(p, (n != 0 && size != 0) ? n * size : 1);
}

char *pl__strdup(const char *s) {
    if (!s) return NULL;
    size_t n = strlen(s) + 1;
    char *d = pl__malloc(n);
    if (d) memcpy(d, s, n);
    return d;
}

char *pl__strndup(const char *s, size_t n) {
    if (!s) return NULL;
    size_t len = strnlen(s, n);
    char *d = pl__malloc(len + 1);
    if (!d) return NULL;
    memcpy(d, s, len);
    d[len] = '\0';
    return d;
}

void pl__free(void *p) { free(p); }
