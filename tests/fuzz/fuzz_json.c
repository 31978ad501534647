/* libFuzzer target, differential: a JSON Lines record read by simdjson
 * (source/text/json_shim.cc) and by Jansson (the reader of records simdjson
 * refuses, and of every record where simdjson is not built).  The input is
 * the record.  Where simdjson reads an object, Jansson must read it too, and
 * the string values of the keys "text", "prompt" and "response" must be the
 * same bytes (key present, type, value); where simdjson reads a non-object,
 * Jansson must as well.  A record only Jansson reads is allowed (it is then
 * read by Jansson; the shim leaves every record with a \u0000 escape to it).
 * Any other difference aborts. */
#include "fuzz_common.h"

#include <jansson.h>

#ifdef PL_WITH_SIMDJSON
#include "source/text/json_shim.h"
#endif

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
#ifdef PL_WITH_SIMDJSON
    static const char *const keys[3] = {"text", "prompt", "response"};
    /* Half the inputs parsed in place (padded), half copied. */
    int padded = size > 0 && (data[0] & 1);
    char *b = malloc(size + PL__JSON_PADDING);
    if (!b) return 0;
    memcpy(b, data, size);
    memset(b + size, 0, PL__JSON_PADDING);
    pl__jfield f[3];
    int got = pl__json_fields(b, size, padded ? size + PL__JSON_PADDING : size, keys, 3, f);
    json_error_t je;
    json_t *o = json_loadb(b, size, JSON_DECODE_ANY | JSON_ALLOW_NUL | JSON_DECODE_INT_AS_REAL,
                           &je);
    if (got == 1 && (!o || json_is_object(o))) abort();
    if (got == 0) {
        if (!o || !json_is_object(o)) abort();
        for (int k = 0; k < 3; k++) {
            json_t *v = json_object_get(o, keys[k]);
            if ((f[k].kind == PL__JF_MISSING) != (v == NULL)) abort();
            if (!v) continue;
            if ((f[k].kind == PL__JF_STRING) != (json_is_string(v) != 0)) abort();
            if (f[k].kind == PL__JF_STRING &&
                (json_string_length(v) != f[k].len ||
                 memcmp(json_string_value(v), f[k].s, f[k].len) != 0))
                abort();
        }
    }
    if (o) json_decref(o);
    free(b);
#else
    (void)data;
    (void)size;
#endif
    return 0;
}
