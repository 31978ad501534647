/*
 * source/text/json_shim.cc -- JSON Lines records read by simdjson's DOM
 * parser (json_shim.h).  One parser per thread, kept for the thread's life:
 * its buffers grow to the largest record the thread has parsed and are
 * reused, up to PL__JSON_KEEP bytes.  Error codes only; no exception leaves
 * this file.
 */
#include "source/text/json_shim.h"

#include <simdjson.h>

#include <cstring>
#include <string_view>

namespace {
thread_local simdjson::dom::parser t_parser;
}

extern "C" int pl__json_fields(const char *buf, size_t len, size_t cap,
                               const char *const *keys, int nkeys, pl__jfield *out) {
    for (int k = 0; k < nkeys; k++) out[k] = pl__jfield{nullptr, 0, PL__JF_MISSING};
    /* A parser grown past PL__JSON_KEEP by a longer record starts afresh at
       the thread's next shorter one (it would hold about twice that record,
       its padded copy and its strings, for the thread's life). */
    if (t_parser.capacity() > PL__JSON_KEEP && len <= PL__JSON_KEEP)
        t_parser = simdjson::dom::parser();
    /* A NUL escape is left to Jansson, which reads one in a string value as
       simdjson does but refuses one in an object key (at any depth): the same
       record is then read, or refused, whichever parser is built. */
    if (std::string_view(buf, len).find("\\u0000") != std::string_view::npos) return -1;
    const bool copy = cap < len + simdjson::SIMDJSON_PADDING;
    simdjson::dom::element doc;
    if (t_parser.parse(buf, len, copy).get(doc) != simdjson::SUCCESS) return -1;
    simdjson::dom::object obj;
    if (doc.get_object().get(obj) != simdjson::SUCCESS) return 1;
    for (simdjson::dom::key_value_pair kv : obj) {
        for (int k = 0; k < nkeys; k++) {
            if (!keys[k] || kv.key != std::string_view(keys[k])) continue;
            std::string_view s;
            if (kv.value.get_string().get(s) == simdjson::SUCCESS)
                out[k] = pl__jfield{s.data(), s.size(), PL__JF_STRING};
            else
                out[k] = pl__jfield{nullptr, 0, PL__JF_OTHER};
        }
    }
    return 0;
}

extern "C" size_t pl__json_kept_bytes(void) { return t_parser.capacity(); }
