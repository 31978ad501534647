/*
 * cpus.c -- how many CPUs this process may use, and the thread counts of
 * `threads: auto`.
 *
 * The machine's count (sysconf(_SC_NPROCESSORS_ONLN)) is the wrong number in
 * a container, a Slurm job step or a Ray worker pinned by taskset: what the
 * process may run on is its affinity mask (sched_getaffinity), further
 * capped by a cgroup v2 CPU quota (`cpu.max`: "QUOTA PERIOD" or "max
 * PERIOD", in the process's cgroup and every cgroup above it; the tightest
 * counts, rounded up to whole CPUs).  The parsing and the arithmetic are
 * pure functions of their inputs (pl__cpu_max_parse, pl__cpus_from) so the
 * tests give them masks and quotas; pl_cpus_available reads /proc and /sys.
 */
#include "common/common.h"

#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

/* The CPUs of a cgroup v2 `cpu.max` line: ceil(quota / period), or 0 for no
 * quota ("max ...") or a line that cannot be read. */
int pl__cpu_max_parse(const char *line) {
    if (!line) return 0;
    while (*line == ' ' || *line == '\t') line++;
    if (strncmp(line, "max", 3) == 0) return 0;
    char *end;
    long long quota = strtoll(line, &end, 10);
    if (end == line || quota <= 0) return 0;
    const char *p = end;
    long long period = 100000;
    if (*p == ' ' || *p == '\t') {
        long long v = strtoll(p, &end, 10);
        if (end != p && v > 0) period = v;
    }
    long long n = (quota + period - 1) / period;
    return n < 1 ? 1 : n > 1 << 20 ? 1 << 20 : (int)n;
}

/* CPUs from the affinity count and the tightest quota (0: none), at least 1. */
int pl__cpus_from(int affinity, int quota_cpus) {
    int n = affinity > 0 ? affinity : 1;
    if (quota_cpus > 0 && quota_cpus < n) n = quota_cpus;
    return n;
}

int pl__threads_auto(int cpus, int reserve) {
    int n = cpus - reserve;
    return n < 1 ? 1 : n;
}

/* The tightest quota, as CPUs, of the cgroups from rel (a path under base)
 * up to base: file "cpu.max" (v2, one line) or "cpu.cfs_quota_us" with
 * "cpu.cfs_period_us" (v1).  0 where none is set. */
static int quota_up(const char *base, char *rel, int v1) {
    int best = 0;
    for (;;) {
        char file[4400], buf[128];
        int c = 0;
        snprintf(file, sizeof file, "%s%s/%s", base, rel, v1 ? "cpu.cfs_quota_us" : "cpu.max");
        FILE *q = fopen(file, "r");
        if (q) {
            if (fgets(buf, sizeof buf, q)) {
                if (v1) {
                    char line[160];
                    long long quota = strtoll(buf, NULL, 10), period = 100000;
                    snprintf(file, sizeof file, "%s%s/cpu.cfs_period_us", base, rel);
                    FILE *pf = fopen(file, "r");
                    if (pf) {
                        if (fgets(buf, sizeof buf, pf)) period = strtoll(buf, NULL, 10);
                        fclose(pf);
                    }
                    if (quota > 0 && period > 0) {
                        snprintf(line, sizeof line, "%lld %lld", quota, period);
                        c = pl__cpu_max_parse(line);
                    }
                } else {
                    c = pl__cpu_max_parse(buf);
                }
            }
            fclose(q);
        }
        if (c > 0 && (best == 0 || c < best)) best = c;
        char *slash = strrchr(rel, '/');
        if (!slash) break;
        *slash = '\0';
    }
    return best;
}

/* The tightest CPU quota of this process's cgroups (v2, else v1), as CPUs;
 * 0 where there is none. */
static int cgroup_quota_cpus(void) {
    FILE *f = fopen("/proc/self/cgroup", "r");
    if (!f) return 0;
    char line[4096], v2[4096] = "", v1[4096] = "";
    int have2 = 0, have1 = 0;
    while (fgets(line, sizeof line, f)) {
        line[strcspn(line, "\n")] = '\0';
        char *c1 = strchr(line, ':'), *c2 = c1 ? strchr(c1 + 1, ':') : NULL;
        if (!c1 || !c2) continue;
        *c2 = '\0';
        const char *ctrl = c1 + 1, *rel = c2 + 1;
        if (strcmp(ctrl, "") == 0 && strncmp(line, "0", 1) == 0) {
            snprintf(v2, sizeof v2, "%s", strcmp(rel, "/") == 0 ? "" : rel);
            have2 = 1;
        } else if (strcmp(ctrl, "cpu") == 0 || strcmp(ctrl, "cpu,cpuacct") == 0 ||
                   strcmp(ctrl, "cpuacct,cpu") == 0) {
            snprintf(v1, sizeof v1, "%s", strcmp(rel, "/") == 0 ? "" : rel);
            have1 = 1;
        }
    }
    fclose(f);
    int q = 0;
    if (have2) q = quota_up("/sys/fs/cgroup", v2, 0);
    if (!q && have1) {
        q = quota_up("/sys/fs/cgroup/cpu", v1, 1);
        if (!q) q = quota_up("/sys/fs/cgroup/cpu,cpuacct", v1, 1);
    }
    return q;
}

PL_API int pl_cpus_available(void) {
    int aff = 0;
#ifdef CPU_COUNT
    cpu_set_t set;
    CPU_ZERO(&set);
    if (sched_getaffinity(0, sizeof set, &set) == 0) aff = CPU_COUNT(&set);
#endif
    if (aff <= 0) {
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        aff = n > 0 ? (int)n : 1;
    }
    return pl__cpus_from(aff, cgroup_quota_cpus());
}

/* Linux keeps a nice value per thread: PRIO_PROCESS with the thread's id sets
 * the calling thread's only.  Raising it needs no privilege; failure leaves
 * the thread as it was. */
void pl__thread_yield_priority(void) {
#if defined(__linux__) && defined(SYS_gettid)
    const id_t tid = (id_t)syscall(SYS_gettid);
    const int now = getpriority(PRIO_PROCESS, tid);
    if (now < PL__YIELD_NICE) (void)setpriority(PRIO_PROCESS, tid, PL__YIELD_NICE);
#endif
}
