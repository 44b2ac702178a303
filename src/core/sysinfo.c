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
        if (strncmp(line, key, klen))
            continue;
        char *p = line + klen; /* the key, then only blanks before the colon ("model" is not "model name") */
        p += strspn(p, " \t");
        if (*p != ':')
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

/* AMD's core generation from the family and model (AMD's own model ranges), or NULL. */
static const char *sysinfo_amd_generation(int family, int model)
{
    switch (family) {
    case 0x17:
        return "Zen/Zen 2";
    case 0x19: /* Zen 4: Raphael 0x60-0x6f, Phoenix 0x70-0x7f, Genoa 0x10-0x1f, Bergamo / Siena 0xa0-0xaf */
        if ((model >= 0x10 && model <= 0x1f) || (model >= 0x60 && model <= 0x7f) || (model >= 0xa0 && model <= 0xaf))
            return "Zen 4";
        return "Zen 3";
    case 0x1a:
        return "Zen 5";
    default:
        return NULL;
    }
}

void sysinfo_cpu_label(const char *name, const char *vendor, int family, int model, char *buf, size_t n)
{
    if (n == 0)
        return;
    if (!name || !name[0]) {
        snprintf(buf, n, "unknown CPU");
        return;
    }
    if (family < 0 || model < 0) {
        snprintf(buf, n, "%s", name);
        return;
    }
    const char *gen = vendor && !strcmp(vendor, "AuthenticAMD") ? sysinfo_amd_generation(family, model) : NULL;
    snprintf(buf, n, "%s (family %d model %d%s%s)", name, family, model, gen ? ", " : "", gen ? gen : "");
}

/* The integer value of a /proc/cpuinfo field, or -1. */
static int sysinfo_cpuinfo_int(const char *key)
{
    char v[32];
    if (sysinfo_cpuinfo_field(key, v, sizeof v))
        return -1;
    char *end;
    long x = strtol(v, &end, 10);
    return end == v || x < 0 || x > 1 << 20 ? -1 : (int)x;
}

void sysinfo_cpu_name(char *buf, size_t n)
{
    char name[256], vendor[64];
    if (sysinfo_cpuinfo_field("model name", name, sizeof name))
        name[0] = 0;
    if (sysinfo_cpuinfo_field("vendor_id", vendor, sizeof vendor))
        vendor[0] = 0;
    sysinfo_cpu_label(name, vendor, sysinfo_cpuinfo_int("cpu family"), sysinfo_cpuinfo_int("model"), buf, n);
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
