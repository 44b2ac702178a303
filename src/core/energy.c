/*
 * energy: RAPL package counters summed, with wraparound (energy.h).
 */
#include "core/energy.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define ENERGY_MAX_ZONES 16

struct energy_zone {
    char path[512];        /* .../energy_uj */
    unsigned long long max_uj, last_uj;
};

struct energy_meter {
    struct energy_zone z[ENERGY_MAX_ZONES];
    int n;
    double total_j;
};

static int read_ull(const char *path, unsigned long long *out)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return -1;
    int ok = fscanf(f, "%llu", out) == 1;
    fclose(f);
    return ok ? 0 : -1;
}

static int read_line(const char *path, char *buf, size_t cap)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return -1;
    if (!fgets(buf, (int)cap, f))
        buf[0] = 0;
    fclose(f);
    buf[strcspn(buf, "\n")] = 0;
    return 0;
}

struct energy_meter *energy_meter_create(const char *root, char *why)
{
    if (!root)
        root = getenv("WAFER_POWERCAP_ROOT");
    if (!root)
        root = "/sys/class/powercap";
    DIR *d = opendir(root);
    if (!d) {
        if (why)
            snprintf(why, 128, "%s: %s", root, strerror(errno));
        return NULL;
    }
    struct energy_meter *m = calloc(1, sizeof *m);
    if (!m) {
        closedir(d);
        return NULL;
    }
    int found = 0, unreadable = 0;
    struct dirent *e;
    while ((e = readdir(d)) && m->n < ENERGY_MAX_ZONES) {
        /* top-level zones only: intel-rapl:N, not intel-rapl:N:M */
        const char *colon = strchr(e->d_name, ':');
        if (strncmp(e->d_name, "intel-rapl:", 11) || !colon || strchr(colon + 1, ':'))
            continue;
        char p[512], name[64];
        snprintf(p, sizeof p, "%s/%s/name", root, e->d_name);
        if (read_line(p, name, sizeof name) == 0 && !strcmp(name, "psys"))
            continue; /* the platform domain overlaps the packages */
        found++;
        struct energy_zone *z = &m->z[m->n];
        snprintf(z->path, sizeof z->path, "%s/%s/energy_uj", root, e->d_name);
        snprintf(p, sizeof p, "%s/%s/max_energy_range_uj", root, e->d_name);
        if (read_ull(z->path, &z->last_uj)) {
            unreadable++;
            continue;
        }
        if (read_ull(p, &z->max_uj))
            z->max_uj = 0;
        m->n++;
    }
    closedir(d);
    if (!m->n) {
        if (why)
            snprintf(why, 128, "%s: %s", root,
                     !found ? "no RAPL package zone" : unreadable ? "RAPL energy_uj is not readable (root only?)"
                                                                  : "no usable RAPL zone");
        free(m);
        return NULL;
    }
    return m;
}

void energy_meter_destroy(struct energy_meter *m) { free(m); }

int energy_meter_zones(const struct energy_meter *m) { return m ? m->n : 0; }

double energy_meter_read(struct energy_meter *m)
{
    for (int i = 0; i < m->n; i++) {
        struct energy_zone *z = &m->z[i];
        unsigned long long v;
        if (read_ull(z->path, &v))
            continue;
        unsigned long long d = v >= z->last_uj ? v - z->last_uj : z->max_uj ? z->max_uj - z->last_uj + v : 0;
        z->last_uj = v;
        m->total_j += (double)d / 1e6;
    }
    return m->total_j;
}
