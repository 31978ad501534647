/*
 * names.c -- an index of strings by content, so that matching source names
 * (config parsing, state decoding) costs O(1) per name instead of a scan of
 * every source.  Open addressing with linear probing over a power-of-two
 * table at most half full; the strings are borrowed, not copied.
 */
#include "common/common.h"

#include <stdlib.h>
#include <string.h>

int pl__names_init(pl__names *x, int64_t n) {
    memset(x, 0, sizeof *x);
    uint64_t cap = 16;
    while (cap < 2 * (uint64_t)(n > 0 ? n : 1)) cap *= 2;
    x->slot = pl__calloc((size_t)cap, sizeof *x->slot);
    if (!x->slot) return PL_ENOMEM;
    x->mask = cap - 1;
    return PL_OK;
}

void pl__names_free(pl__names *x) {
    free(x->slot);
    memset(x, 0, sizeof *x);
}

/* The slot of (s, n): an equal entry's, or the empty one where it goes. */
static pl__name_slot *names_find(const pl__names *x, const char *s,
                                     size_t n) {
    uint64_t h = pl__hash64(s, n, 0x6e616d6573ULL), i = h & x->mask;
    for (;;) {
        pl__name_slot *e = &x->slot[i];
        if (!e->s || (e->hash == h && e->n == n && memcmp(e->s, s, n) == 0)) {
            e->hash = h;
            return e;
        }
        i = (i + 1) & x->mask;
    }
}

int64_t pl__names_get(const pl__names *x, const char *s, size_t n) {
    if (!x->slot) return -1;
    const pl__name_slot *e = names_find(x, s, n);
    return e->s ? e->value : -1;
}

int64_t pl__names_put(pl__names *x, const char *s, size_t n, int64_t value) {
    if (x->used + 1 > (x->mask + 1) / 2) return -2; /* beyond the capacity */
    pl__name_slot *e = names_find(x, s, n);
    if (e->s) return e->value;
    e->s = s;
    e->n = n;
    e->value = value;
    x->used++;
    return -1;
}
