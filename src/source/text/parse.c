/*
 * source/text/parse.c -- one record: its bytes read (pread on the kept
 * descriptor, or from the decompressed text), checked (UTF-8, size), and
 * parsed into the texts to tokenize (pl__segv): a document's text, an
 * instruction record's prompt and response, a chat record's messages
 * rendered with the source's template.  Messages name the file, the line
 * and the byte offset.  A remote object's record is made present in the
 * node cache before it is read.
 */
#include "source/text/text.h"
#ifdef PL_WITH_SIMDJSON
#include "source/text/json_shim.h"
#endif

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Line (1-based) of byte `at` of file f: newlines before it are counted
 * (error path only). */
int64_t pl__text_line_of(const pl_source *src, const pl__tfile *f, uint64_t at) {
    int64_t line = 1;
    uint64_t from = 0;
    if (f->line_ck && f->base.n_docs > 0 && (src->ops->flags & PL__SRC_LINES)) {
        /* The last record starting at or before `at`, then its checkpoint. */
        int64_t lo = 0, hi = f->base.n_docs;
        while (hi - lo > 1) {
            int64_t mid = lo + (hi - lo) / 2;
            if (f->spans[2 * mid] <= at) lo = mid;
            else hi = mid;
        }
        int64_t k = lo / PL__LINE_CK;
        from = f->spans[2 * (k * PL__LINE_CK)];
        if (from > at) from = 0;
        else line = (int64_t)f->line_ck[k];
    }
    if (f->text) {
        const char *p = f->text + from,
                   *end = f->text + (at < f->text_len ? at : f->text_len);
        while ((p = memchr(p, '\n', (size_t)(end - p))) != NULL) {
            line++;
            p++;
        }
        return line;
    }
    int fd, owned;
    char e[PL__ERRMSG_CAP];
    if (f->base.rdata && at > from &&
        pl__source_ensure(&f->base, (int64_t)from, (int64_t)(at - from), e, sizeof e))
        return 0; /* a remote object that cannot be read now: no line number */
    if (pl__source_data_fd(src, &f->base, &fd, &owned, e, sizeof e)) return 0;
    char buf[65536];
    uint64_t pos = from;
    while (pos < at) {
        size_t want = at - pos < sizeof buf ? (size_t)(at - pos) : sizeof buf;
        ssize_t k = pread(fd, buf, want, (off_t)pos);
        if (k <= 0) break;
        for (ssize_t i = 0; i < k; i++) line += buf[i] == '\n';
        pos += (uint64_t)k;
    }
    if (owned) close(fd);
    return line;
}

/* A failed fetch of record r of remote file f (bytes [s, s + n)): the cache's
 * message in err, prefixed with the object, the record and its offset. */
static void remote_err(const pl__tfile *f, int64_t r, uint64_t s, size_t n, char *err,
                       size_t errcap) {
    char inner[PL__ERRMSG_CAP];
    pl__fmt(inner, sizeof inner, "%s", pl__remote_reason(err, f->base.path));
    pl__fmt(err, errcap, "%s: record %lld (byte offset %llu, %zu bytes): %s", f->base.path,
            (long long)r, (unsigned long long)s, n, inner);
}

int pl__seg_push(pl__segv *v, char *text, size_t len, int owned, int train) {
    if (v->n == v->cap) {
        int64_t nc = v->cap ? 2 * v->cap : 16;
        char **a = pl__realloc_array(v->text, (size_t)nc, sizeof *a);
        if (a) v->text = a;
        size_t *l = a ? pl__realloc_array(v->len, (size_t)nc, sizeof *l) : NULL;
        if (l) v->len = l;
        unsigned char *o = l ? pl__realloc_array(v->owned, (size_t)nc, 1) : NULL;
        if (o) v->owned = o;
        unsigned char *tr = o ? pl__realloc_array(v->train, (size_t)nc, 1) : NULL;
        if (!tr) {
            if (owned) free(text);
            return PL_ENOMEM;
        }
        v->train = tr;
        v->cap = nc;
    }
    v->text[v->n] = text;
    v->len[v->n] = len;
    v->owned[v->n] = (unsigned char)owned;
    v->train[v->n] = (unsigned char)train;
    v->n++;
    return PL_OK;
}

void pl__seg_pop_to(pl__segv *v, int64_t n) {
    while (v->n > n) {
        v->n--;
        if (v->owned[v->n]) free(v->text[v->n]);
    }
}

/* A malloc'd copy of a JSON string's bytes as a segment. */
static int seg_json(pl__segv *v, const json_t *str, int train) {
    size_t m = json_string_length(str);
    char *d = pl__malloc(m);
    if (!d) return PL_ENOMEM;
    memcpy(d, json_string_value(str), m);
    return pl__seg_push(v, d, m, 1, train);
}

/* The segments of a chat `messages` list rendered with the source's
 * template: per message the role's prefix and suffix around its content,
 * trained on for assistant messages (content and suffix).  A message that
 * is not {"role": system|user|assistant, "content": string} is refused in
 * why. */
static int seg_messages(const pl__text *t, const json_t *list, pl__segv *v,
                            char *why, size_t cap) {
    static const char *const roles[3] = {"system", "user", "assistant"};
    size_t n = json_array_size(list);
    int trained = 0;
    for (size_t i = 0; i < n; i++) {
        const json_t *m = json_array_get(list, i);
        const json_t *role = json_is_object(m) ? json_object_get(m, "role") : NULL;
        const json_t *content = json_is_object(m) ? json_object_get(m, "content") : NULL;
        int k = -1;
        for (int j = 0; j < 3 && role && json_is_string(role); j++)
            if (strcmp(json_string_value(role), roles[j]) == 0) k = j;
        if (!json_is_object(m)) {
            pl__fmt(why, cap, "key '%s': message %zu is not an object", t->messages_key, i);
            return PL_ERECORD;
        }
        if (k < 0) {
            pl__fmt(why, cap,
                    "key '%s': message %zu: role %s%s%s is not system, user or assistant",
                    t->messages_key, i, role && json_is_string(role) ? "'" : "",
                    role && json_is_string(role) ? json_string_value(role) : "missing",
                    role && json_is_string(role) ? "'" : "");
            return PL_ERECORD;
        }
        if (!content || !json_is_string(content)) {
            pl__fmt(why, cap, "key '%s': message %zu: 'content' is %s", t->messages_key,
                    i, content ? "not a string" : "missing");
            return PL_ERECORD;
        }
        const int tr = k == 2;
        int rc = PL_OK;
        if (t->chat_pre[k][0])
            rc = pl__seg_push(v, t->chat_pre[k], strlen(t->chat_pre[k]), 0, 0);
        if (rc == PL_OK && json_string_length(content)) rc = seg_json(v, content, tr);
        if (rc == PL_OK && t->chat_suf[k][0])
            rc = pl__seg_push(v, t->chat_suf[k], strlen(t->chat_suf[k]), 0, tr);
        if (rc) return rc;
        trained |= tr && json_string_length(content) > 0;
    }
    if (!trained) {
        pl__fmt(why, cap, "key '%s': no assistant message with content (nothing to "
                          "train on)",
                t->messages_key);
        return PL_ERECORD;
    }
    return PL_OK;
}

/* The end of a JSON record's parse: on out of memory or a reason in why,
 * the texts appended since n0 are dropped and err names the file, the line
 * and the byte offset s. */
static int record_done(const pl_source *src, const pl__tfile *f, uint64_t s,
                       pl__segv *v, int64_t n0, int rc, const char *why, char *err,
                       size_t errcap) {
    if (rc == PL_ENOMEM || why[0]) pl__seg_pop_to(v, n0);
    if (rc == PL_ENOMEM) {
        pl__fmt(err, errcap, "%s: out of memory", f->base.path);
        return rc;
    }
    if (why[0]) {
        pl__fmt(err, errcap, "%s: line %lld (byte offset %llu): %s", f->base.path,
                (long long)pl__text_line_of(src, f, s), (unsigned long long)s, why);
        return PL_ERECORD;
    }
    return PL_OK;
}

#ifdef PL_WITH_SIMDJSON
/* A malloc'd copy of a field's bytes as a segment. */
static int seg_field(pl__segv *v, const pl__jfield *fl, int train) {
    char *d = pl__malloc(fl->len ? fl->len : 1);
    if (!d) return PL_ENOMEM;
    memcpy(d, fl->s, fl->len);
    return pl__seg_push(v, d, fl->len, 1, train);
}

/* The text fields of a document or instruction record read by simdjson
 * (json_shim.h): 1 when it answered (texts appended, or a reason in why, or
 * *rc PL_ENOMEM), 0 when the record is to be parsed by Jansson for its
 * message.  The same texts and reasons as the Jansson path below. */
static int fields_simdjson(const pl__text *t, const char *raw, size_t n, size_t cap,
                           pl__segv *v, char *why, size_t whycap, int *rc) {
    const int parts = t->prompt_key ? 2 : 1;
    const char *keys[2] = {t->text_key, NULL};
    if (parts == 2) keys[0] = t->prompt_key, keys[1] = t->response_key;
    pl__jfield fl[2];
    int got = pl__json_fields(raw, n, cap, keys, parts, fl);
    if (got < 0) return 0;
    if (got == 1) {
        pl__fmt(why, whycap, "expected a JSON object");
        return 1;
    }
    /* An escaped lone surrogate (\ud800) is not text, and its UTF-8-like
       form starts with byte 0xED (simdjson checked the raw bytes, not what
       escapes decode to): a text with that byte is checked. */
    for (int k = 0; k < parts; k++)
        if (fl[k].kind == PL__JF_STRING && memchr(fl[k].s, 0xED, fl[k].len) &&
            pl__utf8_check((const uint8_t *)fl[k].s, fl[k].len) < fl[k].len)
            return 0;
    for (int k = 0; k < parts && !why[0] && *rc == PL_OK; k++) {
        if (fl[k].kind == PL__JF_MISSING)
            pl__fmt(why, whycap, "key '%s' is missing", keys[k]);
        else if (fl[k].kind != PL__JF_STRING)
            pl__fmt(why, whycap, "key '%s' is not a string", keys[k]);
        else if (fl[k].len == 0 && !(parts == 2 && k == 0))
            pl__fmt(why, whycap, "empty %s (key '%s' is \"\")",
                    parts == 2 ? "response" : "document", keys[k]);
        else if (fl[k].len > 0 || parts == 1)
            *rc = seg_field(v, &fl[k], parts == 1 || k == 1);
    }
    return 1;
}
#endif

/* The texts of local record r of f, appended to v: one (trained) for
 * documents; prompt (not trained) and response for instruction data; the
 * rendered messages of a chat record.  Valid UTF-8.  On error nothing is
 * appended; PL_ERECORD etc. name the file, the line and the byte offset. */
int pl__text_record(pl_source *src, const pl__sfile *bf, int64_t r, pl__segv *v,
                    char *err, size_t errcap) {
    const pl__tfile *f = (const pl__tfile *)bf;
    const int json = (src->ops->flags & PL__SRC_JSON) != 0;
    pl__text *t = pl__text_of(src);
    uint64_t s = f->spans[2 * r], e = f->spans[2 * r + 1];
    const int parts = t->prompt_key ? 2 : 1;
    const int64_t n0 = v->n;
    const char *what = src->ops->unit;
    if (e < s || (!f->text && e > (uint64_t)INT64_MAX) ||
        (f->text && e > f->text_len)) {
        pl__fmt(err, errcap, "%s: record %lld: byte range [%llu, %llu) is "
                             "outside the file",
                f->base.path, (long long)r, (unsigned long long)s,
                (unsigned long long)e);
        return PL_EBOUNDS;
    }
    if ((int64_t)(e - s) > t->max_record) {
        pl__fmt(err, errcap,
                "%s: %s %lld (byte offset %llu): %llu bytes, over the limit of "
                "%lld (max_record_bytes)",
                f->base.path, what, (long long)pl__text_line_of(src, f, s),
                (unsigned long long)s, (unsigned long long)(e - s),
                (long long)t->max_record);
        return PL_ERECORD;
    }
    size_t n = (size_t)(e - s);
    char *raw;
    int raw_owned = 0, rc = PL_OK;
    if (f->text) {
        raw = f->text + s;
    } else {
        raw = pl__malloc(n + PL__RAW_PAD);
        if (!raw) {
            pl__fmt(err, errcap, "%s: out of memory reading %zu bytes", f->base.path, n);
            return PL_ENOMEM;
        }
        raw_owned = 1;
        memset(raw + n, 0, PL__RAW_PAD); /* read by simdjson: defined bytes */
        int fd, fowned;
        for (int attempt = 0;; attempt++) {
            /* A remote object: the record's bytes present in the cache file first
               (fetched again if they were evicted since the scan at open). */
            if (f->base.rdata && (rc = pl__source_ensure(&f->base, (int64_t)s, (int64_t)n,
                                                         err, errcap))) {
                free(raw);
                remote_err(f, r, s, n, err, errcap);
                return rc;
            }
            rc = pl__source_data_fd(src, &f->base, &fd, &fowned, err, errcap);
            if (rc) {
                free(raw);
                return rc;
            }
            size_t got = 0;
            while (got < n) {
                ssize_t k = pread(fd, raw + got, n - got, (off_t)(s + got));
                if (k <= 0) {
                    int en = errno;
                    if (fowned) close(fd);
                    free(raw);
                    pl__fmt(err, errcap,
                            "%s: read of %zu bytes at byte offset %llu failed: %s",
                            f->base.path, n, (unsigned long long)s,
                            k == 0 ? "file shrank since open" : strerror(en));
                    return k == 0 ? PL_ETRUNC : PL_EIO;
                }
                got += (size_t)k;
            }
            if (fowned) close(fd);
            if (pl__source_still(&f->base, (int64_t)s, (int64_t)n)) break;
            if (attempt + 1 == PL__REMOTE_REREADS) {
                free(raw);
                rc = pl__source_evicted_err(&f->base, (int64_t)s, (int64_t)n, err, errcap);
                remote_err(f, r, s, n, err, errcap);
                return rc;
            }
        }
    }
    if (!json) {
        size_t bad = pl__utf8_check((const uint8_t *)raw, n);
        if (bad < n) {
            pl__fmt(err, errcap, "%s: invalid UTF-8 at byte offset %llu",
                    f->base.path, (unsigned long long)(s + bad));
            if (raw_owned) free(raw);
            return PL_ERECORD;
        }
        if (n == 0) {
            pl__fmt(err, errcap, "%s: empty document", f->base.path);
            if (raw_owned) free(raw);
            return PL_ERECORD;
        }
        rc = pl__seg_push(v, raw, n, raw_owned, 1);
        if (rc) pl__fmt(err, errcap, "%s: out of memory", f->base.path);
        return rc;
    }
    char why[300];
    why[0] = '\0';
#ifdef PL_WITH_SIMDJSON
    if (!t->messages_key) {
        size_t cap = f->text ? (size_t)(f->text_len - s) : n + PL__RAW_PAD;
        int fast = fields_simdjson(t, raw, n, cap, v, why, sizeof why, &rc);
        if (fast) {
            if (raw_owned) free(raw);
            return record_done(src, f, s, v, n0, rc, why, err, errcap);
        }
    }
#endif
    json_error_t je;
    /* Integers as reals: JSON has no size limit on them, and no record is
       refused for an id beyond int64 (the key read is a string). */
    json_t *obj = json_loadb(raw, n, JSON_DECODE_ANY | JSON_ALLOW_NUL |
                                         JSON_DECODE_INT_AS_REAL, &je);
    if (!obj) {
        if (json_error_code(&je) == json_error_invalid_utf8) {
            /* The bad byte itself (jansson's position is where its parser
               stopped, not the byte). */
            size_t bad = pl__utf8_check((const uint8_t *)raw, n);
            uint64_t at = bad < n ? (uint64_t)bad : (uint64_t)(je.position > 0 ? je.position : 0);
            pl__fmt(why, sizeof why, "invalid UTF-8 at byte offset %llu",
                    (unsigned long long)(s + at));
        } else
            pl__fmt(why, sizeof why, "malformed JSON at column %d: %s",
                    je.column, je.text);
    } else if (!json_is_object(obj)) {
        pl__fmt(why, sizeof why, "expected a JSON object");
    } else if (t->messages_key) {
        json_t *list = json_object_get(obj, t->messages_key);
        if (!list)
            pl__fmt(why, sizeof why, "key '%s' is missing", t->messages_key);
        else if (!json_is_array(list) || json_array_size(list) == 0)
            pl__fmt(why, sizeof why, "key '%s' is not a non-empty list", t->messages_key);
        else
            rc = seg_messages(t, list, v, why, sizeof why);
        if (rc == PL_ERECORD) rc = PL_OK; /* reported through why */
    } else {
        const char *keys[2] = {t->text_key, NULL};
        if (parts == 2) keys[0] = t->prompt_key, keys[1] = t->response_key;
        for (int k = 0; k < parts && !why[0] && rc == PL_OK; k++) {
            json_t *jv = json_object_get(obj, keys[k]);
            if (!jv)
                pl__fmt(why, sizeof why, "key '%s' is missing", keys[k]);
            else if (!json_is_string(jv))
                pl__fmt(why, sizeof why, "key '%s' is not a string", keys[k]);
            else if (json_string_length(jv) == 0 && !(parts == 2 && k == 0))
                pl__fmt(why, sizeof why, "empty %s (key '%s' is \"\")",
                        parts == 2 ? "response" : "document", keys[k]);
            else if (json_string_length(jv) > 0 || parts == 1)
                rc = seg_json(v, jv, parts == 1 || k == 1);
        }
    }
    if (obj) json_decref(obj);
    if (raw_owned) free(raw);
    return record_done(src, f, s, v, n0, rc, why, err, errcap);
}


void pl__text_where(const pl_source *src, const pl__tfile *f, int64_t r, char *buf,
                    size_t cap) {
    if (f->spans)
        pl__fmt(buf, cap, "%s %lld (byte offset %llu)", src->ops->unit,
                (long long)pl__text_line_of(src, f, f->spans[2 * r]),
                (unsigned long long)f->spans[2 * r]);
    else
        pl__fmt(buf, cap, "%s %lld", src->ops->unit, (long long)r);
}
