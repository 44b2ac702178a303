/*
 * sysinfo: the CPU model name and its kernel-relevant flags from /proc/cpuinfo (see sysinfo.h). The first
 * processor's entry stands for the machine: every core of the machines we run on is alike.
 */
#include "core/sysinfo.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Copies the value of the first "key : value" line of /proc/cpuinfo into buf; 0 on success, -1 if absent. */
static int sysinfo_cpuinfo_field(const char *key, char *buf, size_t n)
{
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f)
        return -1;
    size_t klen = strlen(key), cap = 0;
    char *line = NULL;
    int rc = -1;
    while (getline(&line, &cap, f) > 0) {
        if (strncmp(line, key, klen) || (line[klen] != ' ' && line[klen] != '\t' && line[klen] != ':'))
            continue;
        char *p = strchr(line, ':');
        if (!p)
            continue;
        p += 1 + (p[1] == ' ');
        p[strcspn(p, "\n")] = 0;
        snprintf(buf, n, "%s", p);
        rc = 0;
        break;
    }
    free(line);
    fclose(f);
    return rc;
}

void sysinfo_cpu_name(char *buf, size_t n)
{
    if (n == 0)
        return;
    if (sysinfo_cpuinfo_field("model name", buf, n) || !buf[0])
        snprintf(buf, n, "unknown CPU");
}

void sysinfo_cpu_flags(char *buf, size_t n)
{
    static const char *const wanted[] = {"avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_vnni",
                                         "avx_vnni", "avx512_bf16", "amx_tile", "amx_int8", "amx_bf16"};
    if (n == 0)
        return;
    buf[0] = 0;
    size_t cap = 1 << 14;
    char *all = malloc(cap);
    if (!all)
        return;
    if (sysinfo_cpuinfo_field("flags", all, cap)) {
        free(all);
        return;
    }
    size_t used = 0;
    for (size_t i = 0; i < sizeof wanted / sizeof *wanted; i++) {
        /* whole-word match in the space-separated list */
        size_t wl = strlen(wanted[i]);
        bool found = false;
        for (const char *p = all; (p = strstr(p, wanted[i])) != NULL; p += wl)
            if ((p == all || p[-1] == ' ') && (p[wl] == ' ' || p[wl] == 0)) {
                found = true;
                break;
            }
        if (!found)
            continue;
        int w = snprintf(buf + used, n - used, "%s%s", used ? " " : "", wanted[i]);
        if (w < 0 || (size_t)w >= n - used)
            break;
        used += (size_t)w;
    }
    free(all);
}
