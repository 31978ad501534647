/*
 * image_resize.c -- decode + resize throughput of polyload's image path with
 * each resizer candidate: libswscale (bicubic, the default) and
 * stb_image_resize (Mitchell), on the photos of a webdataset source, single
 * thread, for both image modes.  Paired: the candidates alternate in each
 * repeat, and each repeat times every image of the source.
 *
 *   build-bench/bench_image_resize "data/vlm/shard-*.tar" [repeats]
 *
 * Prints JSON lines {"mode", "resizer", "repeat", "images", "cpu_seconds",
 * "images_per_cpu_s"}.  Links the static library for its internal switch
 * pl__image_resizer (0 swscale, 1 stb).
 */
#define _POSIX_C_SOURCE 200809L
#include <polyload/polyload.h>

#include <stdio.h>
#include <stdlib.h>
#include <time.h>

extern int pl__image_resizer;

/* CPU seconds of this (single-threaded) process: images per CPU-second is
 * images/s per core, whatever else runs on the machine. */
static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s SHARDS [repeats]\n", argv[0]);
        return 2;
    }
    int reps = argc > 2 ? atoi(argv[2]) : 5;
    static const char *names[2] = {"swscale", "stb"};
    for (int mode = 1; mode <= 2; mode++) {
        pl_image_options io = {0};
        io.mode = (pl_image_mode)mode;
        io.token_id = 1;
        pl_source_options o = {PL_SOURCE_OPTIONS_VERSION, PL_SOURCE_WEBDATASET, argv[1],
                               "bench", 0, -1, -1, &io};
        pl_source *s = NULL;
        if (pl_source_open(&o, &s)) {
            fprintf(stderr, "%s\n", pl_source_errmsg(s));
            return 1;
        }
        int64_t n = pl_source_num_documents(s);
        size_t cap = 0;
        for (int64_t i = 0; i < n; i++) {
            pl_image_info in;
            pl_source_image_info(s, i, &in);
            if (in.bytes > cap) cap = in.bytes;
        }
        uint8_t *buf = malloc(cap);
        for (int r = 0; r < reps; r++)
            for (int k = 0; k < 2; k++) {
                int which = (r + k) % 2; /* alternate which goes first */
                pl__image_resizer = which;
                double t0 = now();
                for (int64_t i = 0; i < n; i++)
                    if (pl_source_read_image(s, i, buf, cap, NULL)) {
                        fprintf(stderr, "%s\n", pl_source_errmsg(s));
                        return 1;
                    }
                double dt = now() - t0;
                printf("{\"mode\": \"%s\", \"resizer\": \"%s\", \"repeat\": %d, \"images\": "
                       "%lld, \"cpu_seconds\": %.4f, \"images_per_cpu_s\": %.1f}\n",
                       mode == 1 ? "fixed" : "native", names[which], r, (long long)n, dt,
                       (double)n / dt);
            }
        free(buf);
        pl_source_free(s);
    }
    return 0;
}
