/* libFuzzer target: one ListObjectsV2 reply page (the server's bytes) parsed
 * by pl__remote_list_page (source/remote/remote.c), as a listing of bucket
 * "b" reads it.  Every entry must be an s3://b/ URL with a size of -1 or
 * more; a continuation token is only given back when the page says
 * IsTruncated true.  Also the empty reply (NULL body). */
#include "fuzz_common.h"

#include "source/remote/remote.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *body = malloc(size + 1);
    if (!body) return 0;
    memcpy(body, data, size);
    body[size] = 0;
    pl__rlisting l = {0};
    int64_t cap = 0;
    char *next = NULL;
    int rc = pl__remote_list_page(size ? body : NULL, "b", &l, &cap, &next);
    if (rc != PL_OK && rc != PL_ENOMEM) abort();
    for (int64_t i = 0; i < l.n; i++) {
        if (strncmp(l.v[i].url, "s3://b/", 7) != 0 || l.v[i].size < -1) abort();
        free(l.v[i].url);
        free(l.v[i].etag);
    }
    if (next && !strstr(body, "<IsTruncated>true</IsTruncated>")) abort();
    free(next);
    free(l.v);
    free(body);
    return 0;
}
