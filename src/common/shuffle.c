/*
 * shuffle.c -- per-source, per-epoch shuffles as keyed bijections on [0, n)
 * with O(1) memory (SPEC section 1): no permutation arrays are ever built.
 *
 * The bijection is a balanced Feistel network on 2*h bits, where 2^(2h) is the
 * smallest power of four >= n, with "cycle walking" (Black and Rogaway,
 * "Ciphers with Arbitrary Finite Domains", CT-RSA 2002): the network is
 * applied again until the value falls inside [0, n).  Because the network is
 * a permutation of [0, 4^h) and 4^h < 4n, a lookup takes fewer than four
 * network evaluations on average.  Four rounds; each round key is derived
 * from (seed, source name, epoch) with xxHash, so the shuffle of one source
 * does not change when other sources are added.
 */
#include "common/common.h"

#include <string.h>

/* The 64-bit finalizer of MurmurHash3 (Appleby), used as the round function. */
static inline uint64_t mix64(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ULL;
    x ^= x >> 33;
    return x;
}

void pl__perm_init(pl__perm *p, uint64_t n, uint64_t seed, const char *name,
                   uint64_t epoch) {
    memset(p, 0, sizeof *p);
    p->n = n;
    uint64_t bits = 0;
    while (bits < 64 && (1ULL << bits) < n) bits++;
    if (bits < 2) bits = 2;
    if (bits & 1) bits++;
    p->half_bits = bits / 2;
    p->mask = (1ULL << p->half_bits) - 1;
    uint64_t base = pl__hash64(name, strlen(name), seed);
    for (int r = 0; r < 4; r++) {
        uint64_t words[2] = {epoch, (uint64_t)r};
        p->keys[r] = pl__hash64(words, sizeof words, base);
    }
}

static inline uint64_t feistel(const pl__perm *p, uint64_t x) {
    uint64_t h = p->half_bits, m = p->mask;
    uint64_t l = (x >> h) & m, r = x & m;
    for (int i = 0; i < 4; i++) {
        uint64_t nl = r;
        r = l ^ (mix64(r ^ p->keys[i]) & m);
        l = nl;
    }
    return (l << h) | r;
}

uint64_t pl__perm_apply(const pl__perm *p, uint64_t i) {
    if (p->n <= 1) return i;
    uint64_t x = feistel(p, i);
    while (x >= p->n) x = feistel(p, x);
    return x;
}
