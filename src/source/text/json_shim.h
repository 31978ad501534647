/*
 * json_shim.h -- the C interface of src/source/text/json_shim.cc: a JSON
 * Lines record's top-level string fields read by simdjson (its DOM parser,
 * which validates the whole record and its UTF-8), built with
 * PL_WITH_SIMDJSON.  Not installed.
 *
 * Only the common case is answered here: a record that parses.  A record
 * simdjson refuses is parsed again with Jansson (parse.c) for its message,
 * so messages do not depend on which parser read the record.
 */
#ifndef POLYLOAD_JSON_SHIM_H
#define POLYLOAD_JSON_SHIM_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Bytes that must be readable past a record's end for parsing in place. */
#define PL__JSON_PADDING 64
/* The record length up to which a thread's parser keeps its buffers between
 * records; one grown past it is freed at the thread's next shorter record. */
#define PL__JSON_KEEP ((size_t)4 << 20)

/* A field of the record: absent, a string (s, len: the unescaped bytes,
 * valid until the calling thread's next pl__json_fields), or another type. */
enum { PL__JF_MISSING = 0, PL__JF_STRING = 1, PL__JF_OTHER = 2 };
typedef struct pl__jfield {
    const char *s;
    size_t len;
    int kind;
} pl__jfield;

/*
 * Parse buf[0, len) as one JSON text.  cap is how many bytes of buf may be
 * read (len + PL__JSON_PADDING or more parses in place; less copies the
 * record into the thread's padded buffer).  Returns 0 with out[k] set for
 * keys[k] (of an object; a key given twice: the last, as Jansson reads it),
 * 1 when the text is valid JSON but not an object, -1 when simdjson refuses
 * it (malformed, invalid UTF-8, too deep, out of memory) or when it holds a
 * \u0000 escape (Jansson refuses one in a key): the caller parses it again
 * with Jansson, for the message or the fields.  Never throws.  Thread-safe
 * (one parser per thread).
 */
int pl__json_fields(const char *buf, size_t len, size_t cap, const char *const *keys,
                    int nkeys, pl__jfield *out);
/* The record capacity the calling thread's parser holds buffers for. */
size_t pl__json_kept_bytes(void);

#ifdef __cplusplus
}
#endif

#endif
