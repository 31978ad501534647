/*
 * One ListObjectsV2 reply page read by pl__remote_list_page: keys with XML
 * entities decoded into s3://bucket/key URLs, sizes and ETags (absent: -1,
 * NULL), the continuation token only when the page is truncated and gives a
 * non-empty one, an empty reply (no buffer) as no entries.  (The server side
 * of listings is tested against moto in tests/python/test_remote.py.)
 */
#include "source/remote/remote.h"
#include "testutil.h"

static void free_listing(pl__rlisting *l) {
    for (int64_t i = 0; i < l->n; i++) {
        free(l->v[i].url);
        free(l->v[i].etag);
    }
    free(l->v);
    memset(l, 0, sizeof *l);
}

static void test_page(void) {
    const char *page =
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<ListBucketResult><Name>b</Name>"
        "<IsTruncated>true</IsTruncated><NextContinuationToken>abc==</NextContinuationToken>"
        "<Contents><Key>d/a &amp; b&lt;1&gt;.bin</Key><ETag>&quot;9e10&quot;</ETag>"
        "<Size>3145851</Size></Contents>"
        "<Contents><Key>d/sub/c.bin</Key><Size>x</Size></Contents>"
        "<Contents><Size>7</Size></Contents></ListBucketResult>";
    pl__rlisting l = {0};
    int64_t cap = 0;
    char *next = NULL;
    CHECK_OK(pl__remote_list_page(page, "bk", &l, &cap, &next));
    CHECK_EQ_I64(l.n, 2); /* the entry without a key is left out */
    CHECK(strcmp(l.v[0].url, "s3://bk/d/a & b<1>.bin") == 0);
    CHECK_EQ_I64(l.v[0].size, 3145851);
    CHECK(l.v[0].etag && strcmp(l.v[0].etag, "\"9e10\"") == 0);
    CHECK(strcmp(l.v[1].url, "s3://bk/d/sub/c.bin") == 0);
    CHECK_EQ_I64(l.v[1].size, -1); /* not a number: unknown, opened with a HEAD */
    CHECK(l.v[1].etag == NULL);
    CHECK(next && strcmp(next, "abc==") == 0);
    free(next);
    /* A second page appends. */
    CHECK_OK(pl__remote_list_page("<Contents><Key>z</Key><Size>0</Size></Contents>"
                                  "<IsTruncated>false</IsTruncated>",
                                  "bk", &l, &cap, &next));
    CHECK_EQ_I64(l.n, 3);
    CHECK(next == NULL);
    free_listing(&l);
    cap = 0;
    /* Truncated with an empty token: no next page (it would repeat the first). */
    CHECK_OK(pl__remote_list_page("<IsTruncated>true</IsTruncated>"
                                  "<NextContinuationToken></NextContinuationToken>",
                                  "bk", &l, &cap, &next));
    CHECK(next == NULL && l.n == 0);
    /* An empty reply, and bytes that are not XML. */
    CHECK_OK(pl__remote_list_page(NULL, "bk", &l, &cap, &next));
    CHECK(next == NULL && l.n == 0);
    CHECK_OK(pl__remote_list_page("<Contents><Key>unclosed", "bk", &l, &cap, &next));
    CHECK(next == NULL && l.n == 0);
    free_listing(&l);
}

int main(void) {
    test_page();
    TEST_END();
}
