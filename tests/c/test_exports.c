/* The shared library exports exactly the functions that the two public
 * headers declare: `nm -D --defined-only` of libpolyload.so against every
 * PL_API declaration of polyload.h and polyload_experimental.h, both ways.
 * A symbol exported but not declared (an internal one that lost `static` or
 * its pl__ prefix, a C++ shim's inline function) or declared but not
 * exported (not defined, or hidden) fails with its name. */
#include "polyload/polyload.h"
#include "testutil.h"

#include <ctype.h>

#define MAX_NAMES 1024

typedef struct names {
    char *v[MAX_NAMES];
    int n;
} names;

static void names_add(names *s, const char *name, size_t len) {
    for (int i = 0; i < s->n; i++)
        if (strlen(s->v[i]) == len && !strncmp(s->v[i], name, len)) return;
    CHECK(s->n < MAX_NAMES);
    if (s->n >= MAX_NAMES) return;
    char *c = malloc(len + 1);
    memcpy(c, name, len);
    c[len] = '\0';
    s->v[s->n++] = c;
}

static int names_has(const names *s, const char *name) {
    for (int i = 0; i < s->n; i++)
        if (!strcmp(s->v[i], name)) return 1;
    return 0;
}

static void names_free(names *s) {
    for (int i = 0; i < s->n; i++) free(s->v[i]);
    s->n = 0;
}

/* Text of a file with its comments blanked out (so that a PL_API quoted in a
 * comment is not a declaration). */
static char *read_code(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *s = malloc((size_t)n + 1);
    size_t got = fread(s, 1, (size_t)n, f);
    fclose(f);
    s[got] = '\0';
    for (size_t i = 0; i < got; i++) {
        if (s[i] == '/' && s[i + 1] == '*') {
            size_t j = i;
            while (j < got && !(s[j] == '*' && s[j + 1] == '/')) s[j++] = ' ';
            if (j < got) s[j] = s[j + 1] = ' ';
            i = j + 1;
        } else if (s[i] == '/' && s[i + 1] == '/') {
            while (i < got && s[i] != '\n') s[i++] = ' ';
        }
    }
    return s;
}

/* Every `PL_API <type> name(` of a header; `#define PL_API` lines skipped. */
static int header_decls(const char *path, names *out) {
    char *s = read_code(path);
    if (!s) return -1;
    for (char *p = strstr(s, "PL_API"); p; p = strstr(p + 6, "PL_API")) {
        int is_ident = (p > s && (isalnum((unsigned char)p[-1]) || p[-1] == '_')) ||
                       isalnum((unsigned char)p[6]) || p[6] == '_';
        if (is_ident) continue;
        const char *line = p;
        while (line > s && line[-1] != '\n') line--;
        while (*line == ' ' || *line == '\t') line++;
        if (*line == '#') continue; /* the macro's own definition */
        char *paren = strchr(p, '(');
        char *semi = strchr(p, ';');
        CHECK(paren && (!semi || paren < semi));
        if (!paren || (semi && semi < paren)) continue;
        char *e = paren;
        while (e > p && isspace((unsigned char)e[-1])) e--;
        char *b = e;
        while (b > p && (isalnum((unsigned char)b[-1]) || b[-1] == '_')) b--;
        CHECK(e > b);
        names_add(out, b, (size_t)(e - b));
    }
    free(s);
    return 0;
}

/* The dynamic symbols the library defines (any type: functions, data, weak). */
static int library_exports(const char *lib, names *out) {
    char cmd[4200];
    snprintf(cmd, sizeof cmd, "nm -D --defined-only '%s'", lib);
    FILE *f = popen(cmd, "r");
    if (!f) return -1;
    char line[4096];
    while (fgets(line, sizeof line, f)) {
        /* "<address> <type> <name>", or "<type> <name>" for absolute ones. */
        char *name = strrchr(line, ' ');
        if (!name) continue;
        name++;
        size_t len = strcspn(name, "\r\n");
        if (len) names_add(out, name, len);
    }
    return pclose(f) == 0 ? 0 : -1;
}

int main(void) {
    names declared = {0}, exported = {0};
    char path[4096];
    snprintf(path, sizeof path, "%s/polyload/polyload.h", PL_INCLUDE_DIR);
    CHECK_OK(header_decls(path, &declared));
    int stable = declared.n;
    snprintf(path, sizeof path, "%s/polyload/polyload_experimental.h", PL_INCLUDE_DIR);
    CHECK_OK(header_decls(path, &declared));
    fprintf(stderr, "declared: %d in polyload.h, %d in polyload_experimental.h\n", stable,
            declared.n - stable);
    /* The parse finds what a reader sees: both headers declare functions. */
    CHECK(stable > 40);
    CHECK(declared.n - stable > 40);
    CHECK(names_has(&declared, "pl_loader_next"));
    CHECK(names_has(&declared, "pl_package_encode_v2"));

    int rc = library_exports(PL_SHARED_LIB_PATH, &exported);
    CHECK(rc == 0);
    if (rc) fprintf(stderr, "nm -D --defined-only %s failed\n", PL_SHARED_LIB_PATH);
    fprintf(stderr, "exported by %s: %d\n", PL_SHARED_LIB_PATH, exported.n);

    int extra = 0, missing = 0;
    for (int i = 0; i < exported.n; i++)
        if (!names_has(&declared, exported.v[i])) {
            fprintf(stderr, "exported but declared in neither header: %s\n", exported.v[i]);
            extra++;
        }
    for (int i = 0; i < declared.n; i++)
        if (!names_has(&exported, declared.v[i])) {
            fprintf(stderr, "declared but not exported: %s\n", declared.v[i]);
            missing++;
        }
    CHECK_EQ_I64(extra, 0);
    CHECK_EQ_I64(missing, 0);
    CHECK_EQ_I64(exported.n, declared.n);
    names_free(&declared);
    names_free(&exported);
    TEST_END();
}
