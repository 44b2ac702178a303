/*
 * flags: strict number parsing for command-line flags (whole string must parse, range checked).
 */
#include "core/flags.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

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
