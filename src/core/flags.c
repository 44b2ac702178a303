/*
 * flags: strict number parsing for command-line flags (whole string must parse, range checked), and the one
 * parser of byte sizes written in configuration files (serve, route, models: "64MiB", "1.5 GB").
 */
#include "core/flags.h"
#include "core/err.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <strings.h>

int flags_parse_int(const char *cmd, const char *flag, const char *s, long min, long max, long *out)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < min || v > max) {
        fprintf(stderr, "wafer %s: %s: expected an integer in [%ld, %ld], got '%s'\n", cmd, flag, min, max, s);
        return 2;
    }
    *out = v;
    return 0;
}

int flags_parse_float(const char *cmd, const char *flag, const char *s, double min, double max, double *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || !isfinite(v) || v < min || v > max) {
        fprintf(stderr, "wafer %s: %s: expected a number in [%g, %g], got '%s'\n", cmd, flag, min, max, s);
        return 2;
    }
    *out = v;
    return 0;
}

int flags_parse_u64(const char *cmd, const char *flag, const char *s, uint64_t *out)
{
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || end == s || *end || *s == '-') {
        fprintf(stderr, "wafer %s: %s: expected a non-negative integer, got '%s'\n", cmd, flag, s);
        return 2;
    }
    *out = v;
    return 0;
}

int flags_parse_size(const char *cmd, const char *flag, const char *s, uint64_t *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    double mul = 1;
    if (*end == 'k' || *end == 'K')
        mul = 1024.0, end++;
    else if (*end == 'm' || *end == 'M')
        mul = 1048576.0, end++;
    else if (*end == 'g' || *end == 'G')
        mul = 1073741824.0, end++;
    if (*end == 'i' && mul > 1)
        end++;
    if ((*end == 'B' || *end == 'b') && (mul > 1 || end[1] == 0))
        end++;
    if (errno || end == s || *end || !(v >= 0) || v * mul > 1e18) {
        fprintf(stderr, "wafer %s: %s: expected a size such as 512M or 2G, got '%s'\n", cmd, flag, s);
        return 2;
    }
    *out = (uint64_t)(v * mul);
    return 0;
}

int flags_bytes_parse(const char *s, int64_t *out)
{
    if (!s || !*s)
        return ERR_INVALID_ARG;
    errno = 0;
    char *end;
    double v = strtod(s, &end);
    if (end == s || errno || !isfinite(v) || v < 0)
        return ERR_INVALID_ARG;
    while (*end == ' ')
        end++;
    static const struct {
        const char *suffix;
        double mul;
    } units[] = {{"", 1},           {"B", 1},         {"K", 1024},        {"KB", 1e3},
                 {"KiB", 1024},     {"M", 1 << 20},   {"MB", 1e6},        {"MiB", 1 << 20},
                 {"G", 1 << 30},    {"GB", 1e9},      {"GiB", 1 << 30},   {"T", 1099511627776.0},
                 {"TB", 1e12},      {"TiB", 1099511627776.0}};
    for (size_t i = 0; i < sizeof units / sizeof units[0]; i++) {
        if (!strcasecmp(end, units[i].suffix)) {
            double b = v * units[i].mul;
            if (b > 9.0e18)
                return ERR_INVALID_ARG;
            *out = (int64_t)b;
            return 0;
        }
    }
    return ERR_INVALID_ARG;
}
