/*
 * flags: command-line number parsing shared by every command-line front end (the cli subcommands, wafer bench),
 * so each reports a bad number the same way ("wafer run: --max-tokens: expected an integer in [0, 1000000],
 * got 'abc'") and exits 2. In core so that the layers below cli parse their own flags without including it.
 */
#ifndef WAFER_CORE_FLAGS_H
#define WAFER_CORE_FLAGS_H

#include <stdbool.h>
#include <stdint.h>

/* Parse helpers: return 0, or print "wafer <cmd>: <flag>: ..." to stderr and return 2 (a usage error). */
int flags_parse_int(const char *cmd, const char *flag, const char *s, long min, long max, long *out);
int flags_parse_float(const char *cmd, const char *flag, const char *s, double min, double max, double *out);
int flags_parse_u64(const char *cmd, const char *flag, const char *s, uint64_t *out);
/* Sizes such as "512M", "2G", "1048576" (bytes). */
int flags_parse_size(const char *cmd, const char *flag, const char *s, uint64_t *out);

/* A size in bytes as configuration files write it: a number (fractions allowed) and an optional unit, B, K/KiB,
 * M/MiB, G/GiB, T/TiB (powers of 1024) or KB, MB, GB, TB (powers of 1000), case-insensitive, a space allowed
 * before it ("64MiB", "1.5 GB", "4096"). 0, or ERR_INVALID_ARG (nothing printed: the caller names the key). */
int flags_bytes_parse(const char *s, int64_t *out);

#endif
