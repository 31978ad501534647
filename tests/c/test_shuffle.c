/* Shuffle: the keyed Feistel bijection is a permutation of [0, n) for many n
 * (0, 1, primes, powers of two and their neighbours), depends on seed, name
 * and epoch, and is reproducible. */
#include "config/config.h"
#include "testutil.h"

static int is_perm(uint64_t n, uint64_t seed, const char *name, uint64_t epoch) {
    pl__perm p;
    pl__perm_init(&p, n, seed, name, epoch);
    unsigned char *seen = calloc(n ? n : 1, 1);
    int ok = 1;
    for (uint64_t i = 0; i < n; i++) {
        uint64_t v = pl__perm_apply(&p, i);
        if (v >= n || seen[v]) {
            ok = 0;
            break;
        }
        seen[v] = 1;
    }
    free(seen);
    return ok;
}

int main(void) {
    const uint64_t ns[] = {0, 1, 2, 3, 4, 5, 7, 8, 9, 13, 31, 64, 97, 127, 128,
                           1000, 1021, 4093, 4096, 65521, 65536, 65537, 100003,
                           1000003};
    for (size_t j = 0; j < sizeof ns / sizeof ns[0]; j++) {
        CHECK(is_perm(ns[j], 1234, "web", 0));
        CHECK(is_perm(ns[j], 7, "code", 3));
    }
    for (uint64_t n = 0; n < 300; n++) CHECK(is_perm(n, n * 31 + 1, "s", n % 5));

    /* Reproducible; different for another epoch, seed or name. */
    pl__perm a, b, c, d, e;
    pl__perm_init(&a, 1000, 1234, "web", 0);
    pl__perm_init(&b, 1000, 1234, "web", 0);
    pl__perm_init(&c, 1000, 1234, "web", 1);
    pl__perm_init(&d, 1000, 1235, "web", 0);
    pl__perm_init(&e, 1000, 1234, "code", 0);
    int same_b = 1, diff_c = 0, diff_d = 0, diff_e = 0, fixed = 0;
    for (uint64_t i = 0; i < 1000; i++) {
        uint64_t v = pl__perm_apply(&a, i);
        same_b &= v == pl__perm_apply(&b, i);
        diff_c += v != pl__perm_apply(&c, i);
        diff_d += v != pl__perm_apply(&d, i);
        diff_e += v != pl__perm_apply(&e, i);
        fixed += v == i;
    }
    CHECK(same_b);
    CHECK(diff_c > 900);
    CHECK(diff_d > 900);
    CHECK(diff_e > 900);
    CHECK(fixed < 20); /* a shuffle, not the identity */

    /* Rough uniformity: position of element 0 over many keys. */
    int64_t hist[10] = {0};
    for (uint64_t s = 0; s < 5000; s++) {
        pl__perm p;
        pl__perm_init(&p, 10, s, "u", 0);
        hist[pl__perm_apply(&p, 0)]++;
    }
    for (int i = 0; i < 10; i++) CHECK(hist[i] > 350 && hist[i] < 650);
    TEST_END();
}
