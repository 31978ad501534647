/*
 * remote.c -- the object storage client: objects opened by URL, ranged
 * reads, listings, on libcurl (easy handles for single requests, the multi
 * interface for many ranges at once).
 *
 * URLs: s3://bucket/key and https://host/path (http:// too, for local
 * servers).  An s3:// object is requested path-style at the endpoint
 * ($AWS_ENDPOINT_URL_S3, $AWS_ENDPOINT_URL, or endpoint_url of the profile in
 * the shared config file; S3-compatible stores and GCS's interoperability
 * API are reached this way), or virtual-hosted at
 * https://bucket.s3.REGION.amazonaws.com without one.  Requests are signed
 * with libcurl's AWS SigV4 (CURLOPT_AWS_SIGV4, "aws:amz:REGION:s3") from
 * $AWS_ACCESS_KEY_ID / $AWS_SECRET_ACCESS_KEY / $AWS_SESSION_TOKEN, else the
 * profile ($AWS_PROFILE, else "default") of the shared credentials file
 * ($AWS_SHARED_CREDENTIALS_FILE, else ~/.aws/credentials); the region is
 * $AWS_REGION, $AWS_DEFAULT_REGION, the profile's region, else us-east-1.
 * Without credentials requests go unsigned (public buckets).  https://
 * objects are never signed.  No message carries a credential: errors name
 * the object by the URL the user wrote.
 *
 * Every request has a deadline (CURLOPT_TIMEOUT_MS, $POLYLOAD_REMOTE_DEADLINE_MS,
 * 30 s) and is retried ($POLYLOAD_REMOTE_ATTEMPTS, 8 attempts) on 429, 5xx,
 * transport errors (refused, reset, cut mid-body, timed out) and bodies
 * shorter than the range, after a wait drawn uniformly from [0, b) with b
 * doubling from $POLYLOAD_REMOTE_BACKOFF_MS (100 ms) up to 5 s (full jitter,
 * as AWS's SDKs).  4xx other than 429 is final.  Ranged GETs carry the ETag
 * seen at open in If-Match, and the ETag of every reply is compared to it:
 * an object replaced during a run is an error, never read mixed.
 */
#include "source/remote/remote.h"

#include <curl/curl.h>

#include <ctype.h>
#include <errno.h>
#include <fnmatch.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#define PL__URL_CAP 4096

/* ------------------------------------------------------------ counters */

static atomic_llong stat_requests, stat_bytes, stat_retries, stat_heads,
    stat_lists;

void pl__remote_stats(pl__rstats *out) {
    out->requests = atomic_load(&stat_requests);
    out->bytes = atomic_load(&stat_bytes);
    out->retries = atomic_load(&stat_retries);
    out->heads = atomic_load(&stat_heads);
    out->lists = atomic_load(&stat_lists);
}

/* ------------------------------------------------------------ settings */

int pl__remote_is_url(const char *path) {
    return path && (strncmp(path, "s3://", 5) == 0 || strncmp(path, "https://", 8) == 0 ||
                    strncmp(path, "http://", 7) == 0);
}

static int64_t env_i64(const char *name, int64_t dflt, int64_t lo) {
    const char *v = getenv(name);
    if (!v || !*v) return dflt;
    char *end;
    long long x = strtoll(v, &end, 10);
    return *end || x < lo ? dflt : (int64_t)x;
}

void pl__rpolicy_default(pl__rpolicy *p) {
    p->max_attempts = (int)env_i64("POLYLOAD_REMOTE_ATTEMPTS", 8, 1);
    p->deadline_ms = env_i64("POLYLOAD_REMOTE_DEADLINE_MS", 30000, 1);
    p->backoff_ms = env_i64("POLYLOAD_REMOTE_BACKOFF_MS", 100, 0);
    p->backoff_max_ms = 5000;
    p->concurrency = (int)env_i64("POLYLOAD_REMOTE_CONCURRENCY", 16, 1);
}

/* Credentials, region and endpoint, read when an object opens. */
typedef struct pl__rcred {
    char key[256], secret[256], token[2048];
    char region[64];
    char endpoint[1024];
} pl__rcred;

/* Value of `name` in section `section` of an INI file (the AWS shared
 * files); 1 if found. */
static int ini_get(const char *path, const char *section, const char *name,
                       char *out, size_t cap) {
    FILE *fp = fopen(path, "r");
    if (!fp) return 0;
    char line[4096];
    int in = 0, found = 0;
    while (!found && fgets(line, sizeof line, fp)) {
        char *s = line;
        while (isspace((unsigned char)*s)) s++;
        size_t n = strlen(s);
        while (n && isspace((unsigned char)s[n - 1])) s[--n] = 0;
        if (!*s || *s == '#' || *s == ';') continue;
        if (*s == '[') {
            char *e = strchr(s, ']');
            if (!e) continue;
            *e = 0;
            char *sec = s + 1;
            while (isspace((unsigned char)*sec)) sec++;
            size_t m = strlen(sec);
            while (m && isspace((unsigned char)sec[m - 1])) sec[--m] = 0;
            in = strcmp(sec, section) == 0;
            continue;
        }
        if (!in) continue;
        char *eq = strchr(s, '=');
        if (!eq) continue;
        char *k = s, *ke = eq;
        while (ke > k && isspace((unsigned char)ke[-1])) ke--;
        *ke = 0;
        char *v = eq + 1;
        while (isspace((unsigned char)*v)) v++;
        if (strcmp(k, name) == 0) {
            pl__fmt(out, cap, "%s", v);
            found = 1;
        }
    }
    fclose(fp);
    return found;
}

static void env_copy(const char *name, char *out, size_t cap) {
    const char *v = getenv(name);
    if (v && *v && !*out) pl__fmt(out, cap, "%s", v);
}

static void rcred_load(pl__rcred *c) {
    memset(c, 0, sizeof *c);
    const char *profile = getenv("AWS_PROFILE");
    if (!profile || !*profile) profile = "default";
    const char *home = getenv("HOME");
    char cred_path[1024] = "", conf_path[1024] = "";
    const char *cp = getenv("AWS_SHARED_CREDENTIALS_FILE");
    if (cp && *cp)
        pl__fmt(cred_path, sizeof cred_path, "%s", cp);
    else if (home)
        pl__fmt(cred_path, sizeof cred_path, "%s/.aws/credentials", home);
    cp = getenv("AWS_CONFIG_FILE");
    if (cp && *cp)
        pl__fmt(conf_path, sizeof conf_path, "%s", cp);
    else if (home)
        pl__fmt(conf_path, sizeof conf_path, "%s/.aws/config", home);
    char conf_sec[300];
    if (strcmp(profile, "default") == 0)
        pl__fmt(conf_sec, sizeof conf_sec, "default");
    else
        pl__fmt(conf_sec, sizeof conf_sec, "profile %s", profile);

    env_copy("AWS_ACCESS_KEY_ID", c->key, sizeof c->key);
    if (*c->key) {
        env_copy("AWS_SECRET_ACCESS_KEY", c->secret, sizeof c->secret);
        env_copy("AWS_SESSION_TOKEN", c->token, sizeof c->token);
    } else if (*cred_path &&
               ini_get(cred_path, profile, "aws_access_key_id", c->key,
                           sizeof c->key)) {
        ini_get(cred_path, profile, "aws_secret_access_key", c->secret,
                    sizeof c->secret);
        ini_get(cred_path, profile, "aws_session_token", c->token,
                    sizeof c->token);
    }
    env_copy("AWS_REGION", c->region, sizeof c->region);
    env_copy("AWS_DEFAULT_REGION", c->region, sizeof c->region);
    if (!*c->region && *conf_path)
        ini_get(conf_path, conf_sec, "region", c->region, sizeof c->region);
    if (!*c->region) pl__fmt(c->region, sizeof c->region, "us-east-1");
    env_copy("AWS_ENDPOINT_URL_S3", c->endpoint, sizeof c->endpoint);
    env_copy("AWS_ENDPOINT_URL", c->endpoint, sizeof c->endpoint);
    if (!*c->endpoint && *conf_path)
        ini_get(conf_path, conf_sec, "endpoint_url", c->endpoint,
                    sizeof c->endpoint);
    size_t n = strlen(c->endpoint);
    while (n && c->endpoint[n - 1] == '/') c->endpoint[--n] = 0;
}

/* ------------------------------------------------------------ curl */

static pthread_once_t curl_once = PTHREAD_ONCE_INIT;
static CURLcode curl_init_rc;
/* One connection cache, DNS cache and TLS session cache for every request of
 * the process (CURLSH), so that requests reuse connections instead of
 * opening (and for https, negotiating) one each. */
static CURLSH *curl_share;
static pthread_mutex_t share_mu[CURL_LOCK_DATA_LAST];

static void share_lock(CURL *h, curl_lock_data d, curl_lock_access a, void *u) {
    (void)h, (void)a, (void)u;
    pthread_mutex_lock(&share_mu[d]);
}

static void share_unlock(CURL *h, curl_lock_data d, void *u) {
    (void)h, (void)u;
    pthread_mutex_unlock(&share_mu[d]);
}

static void curl_init(void) {
    curl_init_rc = curl_global_init(CURL_GLOBAL_DEFAULT);
    if (curl_init_rc != CURLE_OK) return;
    for (int i = 0; i < CURL_LOCK_DATA_LAST; i++) pthread_mutex_init(&share_mu[i], NULL);
    curl_share = curl_share_init();
    if (!curl_share) return; /* requests then open their own connections */
    curl_share_setopt(curl_share, CURLSHOPT_LOCKFUNC, share_lock);
    curl_share_setopt(curl_share, CURLSHOPT_UNLOCKFUNC, share_unlock);
    curl_share_setopt(curl_share, CURLSHOPT_SHARE, CURL_LOCK_DATA_CONNECT);
    curl_share_setopt(curl_share, CURLSHOPT_SHARE, CURL_LOCK_DATA_DNS);
    curl_share_setopt(curl_share, CURLSHOPT_SHARE, CURL_LOCK_DATA_SSL_SESSION);
}

static int curl_ready(char *err, size_t errcap) {
    pthread_once(&curl_once, curl_init);
    if (curl_init_rc != CURLE_OK) {
        pl__fmt(err, errcap, "libcurl: cannot initialize: %s",
                curl_easy_strerror(curl_init_rc));
        return PL_EIO;
    }
    return PL_OK;
}

/* Percent-encode a key for a path (RFC 3986 unreserved and '/' kept, as
 * SigV4's canonical URI for S3). */
static int url_encode(const char *s, int keep_slash, char *out, size_t cap) {
    static const char hex[] = "0123456789ABCDEF";
    size_t j = 0;
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        int plain = isalnum(*p) || *p == '-' || *p == '_' || *p == '.' || *p == '~' ||
                    (keep_slash && *p == '/');
        if (j + 4 > cap) return -1;
        if (plain) {
            out[j++] = (char)*p;
        } else {
            out[j++] = '%';
            out[j++] = hex[*p >> 4];
            out[j++] = hex[*p & 15];
        }
    }
    out[j] = 0;
    return 0;
}

struct pl__robj {
    char *url;            /* as the user wrote it: names the object in messages */
    char req_url[PL__URL_CAP];
    int s3;               /* signed with the credentials below */
    pl__rcred cred;
    int64_t size;
    char etag[256];
    pl__rpolicy policy;
};

const char *pl__robj_url(const pl__robj *o) { return o->url; }
int64_t pl__robj_size(const pl__robj *o) { return o->size; }
const char *pl__robj_etag(const pl__robj *o) { return o->etag; }

/* Split s3://bucket/key; 0 on success. */
static int s3_split(const char *url, char *bucket, size_t bcap, const char **key) {
    const char *b = url + 5, *slash = strchr(b, '/');
    size_t bl = slash ? (size_t)(slash - b) : strlen(b);
    if (bl == 0 || bl >= bcap) return -1;
    memcpy(bucket, b, bl);
    bucket[bl] = 0;
    *key = slash ? slash + 1 : "";
    return 0;
}

/* The request URL of an s3 bucket and (encoded) path with a query. */
static int s3_req_url(const pl__rcred *c, const char *bucket, const char *key,
                          const char *query, char *out, size_t cap) {
    char enc[PL__URL_CAP];
    if (url_encode(key, 1, enc, sizeof enc)) return -1;
    if (*c->endpoint)
        pl__fmt(out, cap, "%s/%s/%s%s", c->endpoint, bucket, enc, query);
    else
        pl__fmt(out, cap, "https://%s.s3.%s.amazonaws.com/%s%s", bucket, c->region,
                enc, query);
    return strlen(out) + 1 >= cap ? -1 : 0;
}

/* One transfer's state: its easy handle, headers, what it writes where. */
typedef struct pl__xfer {
    CURL *h;
    struct curl_slist *hdr;
    char etag[256];
    char status_line[128];
    /* Body: into dst (cap bytes) or into a growable buffer (grow). */
    unsigned char *dst;
    size_t cap, got;
    int grow, overflow;
    char errbuf[CURL_ERROR_SIZE];
} pl__xfer;

static size_t on_body(char *p, size_t sz, size_t nm, void *ud) {
    pl__xfer *x = ud;
    size_t n = sz * nm;
    if (x->grow) {
        if (x->got + n + 1 > x->cap) {
            size_t nc = x->cap ? x->cap * 2 : 65536;
            while (nc < x->got + n + 1) nc *= 2;
            unsigned char *b = pl__realloc_array(x->dst, nc, 1);
            if (!b) return 0;
            x->dst = b;
            x->cap = nc;
        }
    } else if (x->got + n > x->cap) {
        /* More than the range asked for (a server that ignored Range). */
        x->overflow = 1;
        return 0;
    }
    memcpy(x->dst + x->got, p, n);
    x->got += n;
    if (x->grow) x->dst[x->got] = 0;
    return n;
}

static size_t on_header(char *p, size_t sz, size_t nm, void *ud) {
    pl__xfer *x = ud;
    size_t n = sz * nm;
    if (n > 5 && strncasecmp(p, "etag:", 5) == 0) {
        const char *v = p + 5;
        size_t m = n - 5;
        while (m && (*v == ' ' || *v == '\t')) v++, m--;
        while (m && (v[m - 1] == '\r' || v[m - 1] == '\n' || v[m - 1] == ' ')) m--;
        if (m >= sizeof x->etag) m = sizeof x->etag - 1;
        memcpy(x->etag, v, m);
        x->etag[m] = 0;
    } else if (n > 5 && strncmp(p, "HTTP/", 5) == 0) {
        size_t m = n;
        while (m && (p[m - 1] == '\r' || p[m - 1] == '\n')) m--;
        if (m >= sizeof x->status_line) m = sizeof x->status_line - 1;
        memcpy(x->status_line, p, m);
        x->status_line[m] = 0;
        x->etag[0] = 0; /* a new response (after a redirect or 100) */
    }
    return n;
}

static void xfer_reset(pl__xfer *x) {
    if (x->h) curl_easy_cleanup(x->h);
    curl_slist_free_all(x->hdr);
    if (x->grow) free(x->dst);
    memset(x, 0, sizeof *x);
}

/* Set up x for method (HEAD, GET) on url with range [off, off+len) (len 0:
 * none).  if_match: ETag to require, or NULL. */
static int xfer_setup(pl__xfer *x, const pl__robj *o, const char *url, int head,
                          int64_t off, size_t len, const char *if_match) {
    x->h = curl_easy_init();
    if (!x->h) return PL_ENOMEM;
    CURL *h = x->h;
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(h, CURLOPT_FOLLOWLOCATION, o->s3 ? 0L : 1L);
    curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, (long)o->policy.deadline_ms);
    curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS,
                     (long)(o->policy.deadline_ms < 10000 ? o->policy.deadline_ms : 10000));
    curl_easy_setopt(h, CURLOPT_ERRORBUFFER, x->errbuf);
    curl_easy_setopt(h, CURLOPT_HEADERFUNCTION, on_header);
    curl_easy_setopt(h, CURLOPT_HEADERDATA, x);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, x);
    curl_easy_setopt(h, CURLOPT_TCP_KEEPALIVE, 1L);
    if (curl_share) curl_easy_setopt(h, CURLOPT_SHARE, curl_share);
    if (head) curl_easy_setopt(h, CURLOPT_NOBODY, 1L);
    struct curl_slist *l = NULL, *t;
    char line[600];
    if (len) {
        pl__fmt(line, sizeof line, "Range: bytes=%lld-%lld", (long long)off,
                (long long)(off + (int64_t)len - 1));
        if (!(t = curl_slist_append(l, line))) goto nomem;
        l = t;
    }
    if (if_match && *if_match) {
        pl__fmt(line, sizeof line, "If-Match: %s", if_match);
        if (!(t = curl_slist_append(l, line))) goto nomem;
        l = t;
    }
    if (o->s3 && *o->cred.key) {
        char sig[128];
        pl__fmt(sig, sizeof sig, "aws:amz:%s:s3", o->cred.region);
        curl_easy_setopt(h, CURLOPT_AWS_SIGV4, sig);
        curl_easy_setopt(h, CURLOPT_USERNAME, o->cred.key);
        curl_easy_setopt(h, CURLOPT_PASSWORD, o->cred.secret);
        if (!(t = curl_slist_append(l, "x-amz-content-sha256: UNSIGNED-PAYLOAD"))) goto nomem;
        l = t;
        if (*o->cred.token) {
            char tok[2200];
            pl__fmt(tok, sizeof tok, "x-amz-security-token: %s", o->cred.token);
            if (!(t = curl_slist_append(l, tok))) goto nomem;
            l = t;
        }
    }
    x->hdr = l;
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, l);
    return PL_OK;
nomem:
    curl_slist_free_all(l);
    return PL_ENOMEM;
}

/* Outcome of a finished transfer: 0 done, 1 retry, negative final error
 * (message in why). */
static int xfer_judge(pl__xfer *x, CURLcode cc, const pl__robj *o, int head,
                          size_t want, char *why, size_t whycap, long *status) {
    long st = 0;
    curl_easy_getinfo(x->h, CURLINFO_RESPONSE_CODE, &st);
    *status = st;
    if (cc != CURLE_OK && !(cc == CURLE_WRITE_ERROR && x->overflow)) {
        pl__fmt(why, whycap, "%s (%s)", curl_easy_strerror(cc),
                x->errbuf[0] ? x->errbuf : "no detail");
        /* A body cut short, refused, reset, timed out: worth another try. */
        return 1;
    }
    if (st == 429 || st >= 500) {
        pl__fmt(why, whycap, "HTTP %ld", st);
        return 1;
    }
    if (st == 404) {
        pl__fmt(why, whycap, "HTTP 404: no such object");
        return PL_ENOENT;
    }
    if (st == 412) {
        pl__fmt(why, whycap, "replaced since it was opened (HTTP 412: ETag %s no longer matches)",
                o->etag);
        return PL_EIO;
    }
    if (st < 200 || st >= 300) {
        pl__fmt(why, whycap, "HTTP %ld", st);
        return PL_EIO;
    }
    if (!head && *o->etag && *x->etag && strcmp(x->etag, o->etag) != 0) {
        pl__fmt(why, whycap, "replaced since it was opened (ETag %s, opened as %s)",
                x->etag, o->etag);
        return PL_EIO;
    }
    if (x->overflow || (want && st != 206 && x->got != want) || (want && st == 200 && o->size != (int64_t)want)) {
        pl__fmt(why, whycap, "HTTP %ld: the server did not honour the range", st);
        return PL_EIO;
    }
    if (want && x->got < want) {
        pl__fmt(why, whycap, "HTTP %ld: body cut short (%zu of %zu bytes)", st, x->got,
                want);
        return 1;
    }
    return 0;
}

static long long now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Full jitter: uniform in [0, min(cap, base * 2^attempt)). */
static int64_t backoff(const pl__rpolicy *p, int attempt, unsigned *seed) {
    int64_t b = p->backoff_ms;
    for (int i = 0; i < attempt && b < p->backoff_max_ms; i++) b *= 2;
    if (b > p->backoff_max_ms) b = p->backoff_max_ms;
    if (b <= 0) return 0;
    return (int64_t)(rand_r(seed) % (unsigned)b);
}

static void sleep_ms(int64_t ms) {
    if (ms <= 0) return;
    struct timespec ts = {(time_t)(ms / 1000), (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

/* One request with retries (blocking): HEAD (head 1), or GET of a range
 * (len > 0) into dst, or GET of everything into a grown buffer (*body). */
static int request(const pl__robj *o, const char *url, int head, int64_t off,
                       size_t len, void *dst, unsigned char **body, size_t *body_len,
                       const char *if_match, pl__xfer *keep, char *err, size_t errcap) {
    unsigned seed = (unsigned)now_ms() ^ (unsigned)(uintptr_t)&seed;
    char why[512] = "";
    long status = 0;
    int attempt;
    for (attempt = 0; attempt < o->policy.max_attempts; attempt++) {
        if (attempt) {
            atomic_fetch_add(&stat_retries, 1);
            sleep_ms(backoff(&o->policy, attempt - 1, &seed));
        }
        pl__xfer x;
        memset(&x, 0, sizeof x);
        int rc = xfer_setup(&x, o, url, head, off, len, if_match);
        if (rc) {
            xfer_reset(&x);
            pl__fmt(err, errcap, "%s: out of memory for a request", o->url);
            return rc;
        }
        if (body) {
            x.grow = 1;
        } else {
            x.dst = dst;
            x.cap = len;
        }
        atomic_fetch_add(&stat_requests, 1);
        CURLcode cc = curl_easy_perform(x.h);
        atomic_fetch_add(&stat_bytes, (long long)x.got);
        int j = xfer_judge(&x, cc, o, head, body ? 0 : len, why, sizeof why, &status);
        if (j == 0) {
            if (body) {
                *body = x.dst;
                *body_len = x.got;
                x.dst = NULL;
            }
            if (keep) {
                *keep = x;
                x.h = NULL;
                x.hdr = NULL;
            }
            xfer_reset(&x);
            return PL_OK;
        }
        xfer_reset(&x);
        if (j < 0) {
            if (len)
                pl__fmt(err, errcap, "%s: bytes [%lld, %lld): %s", o->url, (long long)off,
                        (long long)(off + (int64_t)len), why);
            else
                pl__fmt(err, errcap, "%s: %s", o->url, why);
            return j;
        }
    }
    if (len)
        pl__fmt(err, errcap, "%s: bytes [%lld, %lld): failed after %d attempts; last: %s",
                o->url, (long long)off, (long long)(off + (int64_t)len), attempt, why);
    else
        pl__fmt(err, errcap, "%s: failed after %d attempts; last: %s", o->url, attempt,
                why);
    return PL_EIO;
}

/* ------------------------------------------------------------ objects */

static int robj_new(const char *url, pl__robj **out, char *err, size_t errcap) {
    *out = NULL;
    int rc = curl_ready(err, errcap);
    if (rc) return rc;
    pl__robj *o = pl__calloc(1, sizeof *o);
    if (!o || !(o->url = pl__strdup(url))) {
        free(o);
        pl__fmt(err, errcap, "%s: out of memory", url);
        return PL_ENOMEM;
    }
    pl__rpolicy_default(&o->policy);
    if (strncmp(url, "s3://", 5) == 0) {
        o->s3 = 1;
        rcred_load(&o->cred);
    } else {
        pl__fmt(o->req_url, sizeof o->req_url, "%s", url);
    }
    *out = o;
    return PL_OK;
}

/* A new object of url with its request URL (s3:// path-style or virtual
 * hosted); nothing requested. */
static int robj_addressed(const char *url, pl__robj **out, char *err, size_t errcap) {
    pl__robj *o;
    int rc = robj_new(url, &o, err, errcap);
    if (rc) return rc;
    if (o->s3) {
        char bucket[256];
        const char *key;
        if (s3_split(url, bucket, sizeof bucket, &key) || !*key ||
            s3_req_url(&o->cred, bucket, key, "", o->req_url, sizeof o->req_url)) {
            pl__fmt(err, errcap, "%s: not an s3://bucket/key URL", url);
            pl__robj_free(o);
            return PL_EINVAL;
        }
    }
    *out = o;
    return PL_OK;
}

int pl__robj_open(const char *url, pl__robj **out, char *err, size_t errcap) {
    pl__robj *o;
    int rc = robj_addressed(url, &o, err, errcap);
    if (rc) return rc;
    pl__xfer x;
    memset(&x, 0, sizeof x);
    atomic_fetch_add(&stat_heads, 1);
    rc = request(o, o->req_url, 1, 0, 0, NULL, NULL, NULL, NULL, &x, err, errcap);
    if (rc) {
        pl__robj_free(o);
        return rc;
    }
    curl_off_t cl = -1;
    curl_easy_getinfo(x.h, CURLINFO_CONTENT_LENGTH_DOWNLOAD_T, &cl);
    pl__fmt(o->etag, sizeof o->etag, "%s", x.etag);
    xfer_reset(&x);
    if (cl < 0) {
        pl__fmt(err, errcap, "%s: the server gave no Content-Length", url);
        pl__robj_free(o);
        return PL_EIO;
    }
    o->size = (int64_t)cl;
    *out = o;
    return PL_OK;
}

int pl__robj_open_known(const char *url, int64_t size, const char *etag, pl__robj **out,
                        char *err, size_t errcap) {
    if (size < 0 || !etag || !*etag || strlen(etag) >= sizeof((pl__robj *)0)->etag) {
        pl__fmt(err, errcap, "%s: no size or ETag known", url);
        return PL_EINVAL;
    }
    pl__robj *o;
    int rc = robj_addressed(url, &o, err, errcap);
    if (rc) return rc;
    o->size = size;
    pl__fmt(o->etag, sizeof o->etag, "%s", etag);
    *out = o;
    return PL_OK;
}

void pl__robj_free(pl__robj *o) {
    if (!o) return;
    free(o->url);
    /* The credentials leave no copy behind. */
    memset(&o->cred, 0, sizeof o->cred);
    free(o);
}

int pl__robj_read(const pl__robj *o, int64_t offset, size_t len, void *dst, char *err,
                  size_t errcap) {
    pl__rrange r = {offset, len, dst};
    return pl__robj_read_many(o, &r, 1, err, errcap);
}

/* One range's transfer in a read_many. */
typedef struct pl__slot {
    pl__xfer x;
    int idx;        /* range, or -1: free */
} pl__slot;

int pl__robj_read_many(const pl__robj *o, const pl__rrange *r, int n, char *err,
                       size_t errcap) {
    for (int i = 0; i < n; i++)
        if (r[i].offset < 0 || (int64_t)r[i].len > o->size - r[i].offset) {
            pl__fmt(err, errcap, "%s: bytes [%lld, %lld) past its end (%lld bytes)",
                    o->url, (long long)r[i].offset,
                    (long long)(r[i].offset + (int64_t)r[i].len), (long long)o->size);
            return PL_ERANGE;
        }
    if (n == 1 || o->policy.concurrency <= 1) {
        for (int i = 0; i < n; i++) {
            if (!r[i].len) continue;
            int rc = request(o, o->req_url, 0, r[i].offset, r[i].len, r[i].dst, NULL,
                                 NULL, o->etag, NULL, err, errcap);
            if (rc) return rc;
        }
        return PL_OK;
    }
    int conc = o->policy.concurrency < n ? o->policy.concurrency : n;
    CURLM *m = curl_multi_init();
    pl__slot *slot = pl__calloc((size_t)conc, sizeof *slot);
    int *attempts = pl__calloc((size_t)n, sizeof *attempts);
    long long *not_before = pl__calloc((size_t)n, sizeof *not_before);
    if (!m || !slot || !attempts || !not_before) {
        if (m) curl_multi_cleanup(m);
        free(slot);
        free(attempts);
        free(not_before);
        pl__fmt(err, errcap, "%s: out of memory for %d reads", o->url, n);
        return PL_ENOMEM;
    }
    for (int s = 0; s < conc; s++) slot[s].idx = -1;
    unsigned seed = (unsigned)now_ms() ^ (unsigned)(uintptr_t)slot;
    /* Ranges not yet finished: a queue by index (retries go back in). */
    int *queue = pl__calloc((size_t)n, sizeof *queue);
    int qhead = 0, qn = 0, done = 0, rc = PL_OK;
    if (!queue) {
        rc = PL_ENOMEM;
        pl__fmt(err, errcap, "%s: out of memory for %d reads", o->url, n);
        goto out;
    }
    for (int i = 0; i < n; i++) {
        if (r[i].len)
            queue[(qhead + qn++) % n] = i;
        else
            done++;
    }
    while (done < n && rc == PL_OK) {
        /* Start what may start. */
        long long now = now_ms(), wake = -1;
        for (int s = 0; s < conc && qn; s++) {
            if (slot[s].idx >= 0) continue;
            /* The first queued range whose backoff has passed. */
            int pick = -1;
            for (int k = 0; k < qn; k++) {
                int i = queue[(qhead + k) % n];
                if (not_before[i] <= now) {
                    pick = k;
                    break;
                }
                if (wake < 0 || not_before[i] < wake) wake = not_before[i];
            }
            if (pick < 0) break;
            int i = queue[(qhead + pick) % n];
            /* Remove position pick from the queue (swap with the head). */
            queue[(qhead + pick) % n] = queue[qhead];
            qhead = (qhead + 1) % n;
            qn--;
            pl__slot *sl = &slot[s];
            memset(&sl->x, 0, sizeof sl->x);
            if (xfer_setup(&sl->x, o, o->req_url, 0, r[i].offset, r[i].len, o->etag)) {
                xfer_reset(&sl->x);
                rc = PL_ENOMEM;
                pl__fmt(err, errcap, "%s: out of memory for a request", o->url);
                break;
            }
            sl->x.dst = r[i].dst;
            sl->x.cap = r[i].len;
            sl->idx = i;
            curl_easy_setopt(sl->x.h, CURLOPT_PRIVATE, (void *)sl);
            curl_multi_add_handle(m, sl->x.h);
            atomic_fetch_add(&stat_requests, 1);
        }
        if (rc) break;
        int running = 0;
        curl_multi_perform(m, &running);
        CURLMsg *msg;
        int left;
        while ((msg = curl_multi_info_read(m, &left))) {
            if (msg->msg != CURLMSG_DONE) continue;
            pl__slot *sl = NULL;
            curl_easy_getinfo(msg->easy_handle, CURLINFO_PRIVATE, (char **)&sl);
            CURLcode cc = msg->data.result;
            int i = sl->idx;
            char why[512];
            long status;
            atomic_fetch_add(&stat_bytes, (long long)sl->x.got);
            int j = xfer_judge(&sl->x, cc, o, 0, r[i].len, why, sizeof why, &status);
            curl_multi_remove_handle(m, sl->x.h);
            xfer_reset(&sl->x);
            sl->idx = -1;
            if (j == 0) {
                done++;
            } else if (j == 1 && ++attempts[i] < o->policy.max_attempts) {
                atomic_fetch_add(&stat_retries, 1);
                not_before[i] = now_ms() + backoff(&o->policy, attempts[i] - 1, &seed);
                queue[(qhead + qn++) % n] = i;
            } else if (rc == PL_OK) {
                if (j == 1)
                    pl__fmt(err, errcap,
                            "%s: bytes [%lld, %lld): failed after %d attempts; last: %s",
                            o->url, (long long)r[i].offset,
                            (long long)(r[i].offset + (int64_t)r[i].len), attempts[i], why);
                else
                    pl__fmt(err, errcap, "%s: bytes [%lld, %lld): %s", o->url,
                            (long long)r[i].offset,
                            (long long)(r[i].offset + (int64_t)r[i].len), why);
                rc = j == 1 ? PL_EIO : j;
            }
        }
        if (rc || done >= n) break;
        int busy = 0;
        for (int s = 0; s < conc; s++) busy += slot[s].idx >= 0;
        long wait = 100;
        if (!busy && wake >= 0) {
            long long d = wake - now_ms();
            wait = d < 1 ? 1 : (long)d;
        }
        curl_multi_poll(m, NULL, 0, (int)wait, NULL);
    }
out:
    for (int s = 0; s < conc; s++)
        if (slot[s].idx >= 0 || slot[s].x.h) {
            if (slot[s].x.h) curl_multi_remove_handle(m, slot[s].x.h);
            xfer_reset(&slot[s].x);
        }
    curl_multi_cleanup(m);
    free(slot);
    free(attempts);
    free(not_before);
    free(queue);
    return rc;
}

/* ------------------------------------------------------------ listing */

/* The text of the next <tag>...</tag> at or after *p (XML entities of
 * S3's replies decoded), advancing *p; NULL when none. */
static char *xml_next(const char **p, const char *tag) {
    char open[64], close[64];
    pl__fmt(open, sizeof open, "<%s>", tag);
    pl__fmt(close, sizeof close, "</%s>", tag);
    const char *a = strstr(*p, open);
    if (!a) return NULL;
    a += strlen(open);
    const char *b = strstr(a, close);
    if (!b) return NULL;
    *p = b + strlen(close);
    char *out = pl__calloc(1, (size_t)(b - a) + 1);
    if (!out) return NULL;
    size_t j = 0;
    for (const char *s = a; s < b;) {
        static const struct {
            const char *e;
            char c;
        } ent[] = {{"&amp;", '&'}, {"&lt;", '<'}, {"&gt;", '>'}, {"&quot;", '"'}, {"&apos;", '\''}};
        int hit = 0;
        if (*s == '&') {
            for (size_t k = 0; k < sizeof ent / sizeof ent[0]; k++) {
                size_t el = strlen(ent[k].e);
                if ((size_t)(b - s) >= el && strncmp(s, ent[k].e, el) == 0) {
                    out[j++] = ent[k].c;
                    s += el;
                    hit = 1;
                    break;
                }
            }
        }
        if (!hit) out[j++] = *s++;
    }
    out[j] = 0;
    return out;
}

void pl__rlisting_free(pl__rlisting *l) {
    if (!l) return;
    for (int64_t i = 0; i < l->n; i++) {
        free(l->v[i].url);
        free(l->v[i].etag);
    }
    free(l->v);
    free(l);
}

static int rentry_cmp(const void *a, const void *b) {
    return strcmp(((const pl__rentry *)a)->url, ((const pl__rentry *)b)->url);
}

const pl__rentry *pl__rlisting_find(const pl__rlisting *l, const char *url) {
    if (!l || !l->n) return NULL;
    pl__rentry key = {(char *)url, 0, NULL};
    return bsearch(&key, l->v, (size_t)l->n, sizeof *l->v, rentry_cmp);
}

/* One <Contents> of a listing page as an entry (size -1, etag NULL when the
 * store left them out).  PL_ENOMEM; 1 when it names no key. */
static int rentry_parse(const char *contents, const char *bucket, pl__rentry *e) {
    const char *p = contents;
    char *key = xml_next(&p, "Key");
    if (!key) return 1;
    size_t ul = strlen(bucket) + strlen(key) + 7;
    e->url = pl__calloc(1, ul);
    if (!e->url) {
        free(key);
        return PL_ENOMEM;
    }
    pl__fmt(e->url, ul, "s3://%s/%s", bucket, key);
    free(key);
    e->size = -1;
    p = contents;
    char *size = xml_next(&p, "Size");
    if (size) {
        char *end;
        long long x = strtoll(size, &end, 10);
        if (*size && !*end && x >= 0) e->size = (int64_t)x;
        free(size);
    }
    p = contents;
    e->etag = xml_next(&p, "ETag"); /* entities decoded: "abc", as a HEAD gives it */
    return PL_OK;
}

int pl__remote_list_page(const char *body, const char *bucket, pl__rlisting *l,
                         int64_t *cap, char **next) {
    *next = NULL;
    const char *p = body ? body : ""; /* an empty reply has no buffer */
    char *contents;
    int rc = PL_OK;
    while (rc == PL_OK && (contents = xml_next(&p, "Contents"))) {
        if (l->n == *cap) {
            int64_t nc = *cap ? *cap * 2 : 64;
            pl__rentry *nv = pl__realloc_array(l->v, (size_t)nc, sizeof *l->v);
            if (!nv) {
                free(contents);
                return PL_ENOMEM;
            }
            l->v = nv;
            *cap = nc;
        }
        pl__rentry e = {NULL, -1, NULL};
        int k = rentry_parse(contents, bucket, &e);
        free(contents);
        if (k == PL_OK)
            l->v[l->n++] = e;
        else if (k < 0)
            rc = k;
    }
    if (rc) return rc;
    p = body ? body : "";
    char *trunc = xml_next(&p, "IsTruncated");
    p = body ? body : "";
    char *token = xml_next(&p, "NextContinuationToken");
    if (trunc && strcmp(trunc, "true") == 0 && token && token[0]) *next = token;
    else free(token);
    free(trunc);
    return PL_OK;
}

int pl__remote_list_entries(const char *prefix_url, pl__rlisting **out, char *err,
                            size_t errcap) {
    *out = NULL;
    if (strncmp(prefix_url, "s3://", 5) != 0) {
        pl__fmt(err, errcap, "%s: only s3:// prefixes can be listed", prefix_url);
        return PL_EINVAL;
    }
    pl__robj *o;
    int rc = robj_new(prefix_url, &o, err, errcap);
    if (rc) return rc;
    char bucket[256];
    const char *prefix;
    if (s3_split(prefix_url, bucket, sizeof bucket, &prefix)) {
        pl__fmt(err, errcap, "%s: not an s3://bucket/prefix URL", prefix_url);
        pl__robj_free(o);
        return PL_EINVAL;
    }
    pl__rlisting *l = pl__calloc(1, sizeof *l);
    if (!l) {
        pl__robj_free(o);
        pl__fmt(err, errcap, "%s: out of memory listing", prefix_url);
        return PL_ENOMEM;
    }
    int64_t cap = 0;
    char *token = NULL;
    rc = PL_OK;
    for (;;) {
        char q[PL__URL_CAP], encp[PL__URL_CAP], enct[2048] = "";
        if (url_encode(prefix, 0, encp, sizeof encp) ||
            (token && url_encode(token, 0, enct, sizeof enct))) {
            pl__fmt(err, errcap, "%s: prefix too long", prefix_url);
            rc = PL_EINVAL;
            break;
        }
        /* A listing's query orders its keys as SigV4's canonical query does
           (alphabetical: continuation-token, list-type, prefix). */
        if (token)
            pl__fmt(q, sizeof q, "?continuation-token=%s&list-type=2&prefix=%s", enct, encp);
        else
            pl__fmt(q, sizeof q, "?list-type=2&prefix=%s", encp);
        char url[PL__URL_CAP];
        if (s3_req_url(&o->cred, bucket, "", q, url, sizeof url)) {
            pl__fmt(err, errcap, "%s: prefix too long", prefix_url);
            rc = PL_EINVAL;
            break;
        }
        unsigned char *body = NULL;
        size_t blen = 0;
        atomic_fetch_add(&stat_lists, 1);
        rc = request(o, url, 0, 0, 0, NULL, &body, &blen, NULL, NULL, err, errcap);
        if (rc) break;
        char *next = NULL;
        rc = pl__remote_list_page((const char *)body, bucket, l, &cap, &next);
        free(body);
        int more = next != NULL;
        int stuck = next && token && strcmp(next, token) == 0;
        free(token);
        token = next;
        if (rc) {
            pl__fmt(err, errcap, "%s: out of memory listing", prefix_url);
            break;
        }
        if (stuck) {
            /* A store that answers a continuation token with the same token
               would be listed forever. */
            pl__fmt(err, errcap, "%s: the listing did not advance (the store gave the "
                                 "same continuation token twice)", prefix_url);
            rc = PL_EIO;
            break;
        }
        if (!more) break;
    }
    free(token);
    pl__robj_free(o);
    if (rc) {
        pl__rlisting_free(l);
        return rc;
    }
    /* Byte order, as S3 gives it (and as pl__rlisting_find needs). */
    if (l->n > 1) qsort(l->v, (size_t)l->n, sizeof *l->v, rentry_cmp);
    *out = l;
    return PL_OK;
}

int pl__remote_list(const char *prefix_url, char ***urls, int64_t *n, char *err,
                    size_t errcap) {
    *urls = NULL;
    *n = 0;
    pl__rlisting *l;
    int rc = pl__remote_list_entries(prefix_url, &l, err, errcap);
    if (rc) return rc;
    char **v = l->n ? pl__calloc((size_t)l->n, sizeof *v) : NULL;
    if (l->n && !v) {
        pl__rlisting_free(l);
        pl__fmt(err, errcap, "%s: out of memory listing", prefix_url);
        return PL_ENOMEM;
    }
    for (int64_t i = 0; i < l->n; i++) {
        v[i] = l->v[i].url; /* moved */
        l->v[i].url = NULL;
    }
    *n = l->n;
    *urls = v;
    pl__rlisting_free(l);
    return PL_OK;
}

/* ------------------------------------------------------------ expansion */

static int ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && strcmp(s + n - m, suffix) == 0;
}

/* polyload's own sidecars are never data files (as source.c's). */
static int is_sidecar(const char *u) {
    static const char *const ext[] = {".plidx", ".plrec", ".pllen", ".plwds"};
    for (size_t i = 0; i < sizeof ext / sizeof ext[0]; i++) {
        char tmp[16];
        snprintf(tmp, sizeof tmp, "%s.tmp.", ext[i]);
        if (ends_with(u, ext[i]) || strstr(u, tmp)) return 1;
    }
    return 0;
}

static int push(char ***v, int64_t *n, int64_t *cap, const char *s, size_t len) {
    if (*n == *cap) {
        int64_t nc = *cap ? *cap * 2 : 16;
        char **nv = pl__realloc_array(*v, (size_t)nc, sizeof **v);
        if (!nv) return PL_ENOMEM;
        *v = nv;
        *cap = nc;
    }
    char *c = pl__calloc(1, len + 1);
    if (!c) return PL_ENOMEM;
    memcpy(c, s, len);
    c[len] = 0;
    (*v)[(*n)++] = c;
    return PL_OK;
}

int pl__remote_expand(const char *path, int megatron, char ***out, int64_t *nout,
                      char *err, size_t errcap) {
    return pl__remote_expand_listed(path, megatron, out, nout, NULL, err, errcap);
}

int pl__remote_expand_listed(const char *path, int megatron, char ***out, int64_t *nout,
                             pl__rlisting **listed, char *err, size_t errcap) {
    *out = NULL;
    *nout = 0;
    if (listed) *listed = NULL;
    char **v = NULL;
    int64_t n = 0, cap = 0;
    int rc = PL_OK;
    size_t pl = strlen(path);
    const char *glob_at = strpbrk(path, "*?[");
    if (strncmp(path, "s3://", 5) != 0) {
        /* https:// names one object (no listing over HTTP). */
        if (glob_at || (pl && path[pl - 1] == '/')) {
            pl__fmt(err, errcap, "%s: only s3:// paths can be globs or directories", path);
            return PL_EINVAL;
        }
        size_t k = megatron && (ends_with(path, ".idx") || ends_with(path, ".bin"))
                       ? pl - 4 : pl;
        rc = push(&v, &n, &cap, path, k);
        goto done;
    }
    /* What to list: up to the last '/' before a glob character, or the path
       itself (a file, a Megatron prefix or a directory). */
    char prefix[PL__URL_CAP];
    if (glob_at) {
        const char *slash = glob_at;
        while (slash > path + 5 && slash[-1] != '/') slash--;
        pl__fmt(prefix, sizeof prefix, "%.*s", (int)(slash - path), path);
    } else {
        pl__fmt(prefix, sizeof prefix, "%s", path);
    }
    pl__rlisting *lst;
    rc = pl__remote_list_entries(prefix, &lst, err, errcap);
    if (rc) return rc;
    int64_t na = lst->n;
    int dir = !glob_at && pl && path[pl - 1] == '/';
    if (!glob_at && !dir) {
        /* The object itself, the Megatron pair, or else a directory. */
        char idx[PL__URL_CAP];
        pl__fmt(idx, sizeof idx, "%s.idx", path);
        int exact = 0, pair = 0;
        exact = pl__rlisting_find(lst, path) != NULL;
        pair = pl__rlisting_find(lst, idx) != NULL;
        if (megatron && (pair || ((ends_with(path, ".idx") || ends_with(path, ".bin")) && exact))) {
            rc = push(&v, &n, &cap, path, pair ? pl : pl - 4);
        } else if (!megatron && exact) {
            rc = push(&v, &n, &cap, path, pl);
        } else {
            dir = 1;
        }
    }
    for (int64_t i = 0; rc == PL_OK && i < na; i++) {
        const char *u = lst->v[i].url;
        size_t ul = strlen(u);
        if (dir) {
            size_t base = strlen(prefix) + (prefix[strlen(prefix) - 1] == '/' ? 0 : 1);
            if (ul <= base || strncmp(u, prefix, strlen(prefix)) != 0 ||
                (base > strlen(prefix) && u[strlen(prefix)] != '/') || strchr(u + base, '/'))
                continue; /* not a direct child */
            if (megatron) {
                if (ends_with(u, ".idx")) rc = push(&v, &n, &cap, u, ul - 4);
            } else if (!is_sidecar(u)) {
                rc = push(&v, &n, &cap, u, ul);
            }
        } else if (glob_at) {
            if (megatron) {
                char pat[PL__URL_CAP];
                pl__fmt(pat, sizeof pat, "%s.idx", path);
                if ((fnmatch(pat, u, FNM_PATHNAME) == 0) ||
                    (fnmatch(path, u, FNM_PATHNAME) == 0 &&
                     (ends_with(u, ".idx") || ends_with(u, ".bin"))))
                    rc = push(&v, &n, &cap, u, ul - 4);
            } else if (fnmatch(path, u, FNM_PATHNAME) == 0 && !is_sidecar(u)) {
                rc = push(&v, &n, &cap, u, ul);
            }
        }
    }
    if (rc == PL_OK && listed)
        *listed = lst; /* the sizes and ETags, for opening without a HEAD each */
    else
        pl__rlisting_free(lst);
    if (rc == PL_OK && n == 0) {
        pl__fmt(err, errcap, glob_at ? "%s: no object matches the pattern"
                                     : "%s: no such object, and no objects under it",
                path);
        rc = PL_ENOENT;
    }
done:
    if (rc) {
        if (listed) {
            pl__rlisting_free(*listed);
            *listed = NULL;
        }
        if (rc == PL_ENOMEM) pl__fmt(err, errcap, "%s: out of memory expanding", path);
        for (int64_t i = 0; i < n; i++) free(v[i]);
        free(v);
        return rc;
    }
    *out = v;
    *nout = n;
    return PL_OK;
}
