/*
 * cli_common: flag parsing helpers shared by the subcommands, so every command reports a bad number the same
 * way ("--max-tokens: expected an integer >= 0, got 'abc'") and exits 2.
 */
#ifndef WAFER_CLI_COMMON_H
#define WAFER_CLI_COMMON_H

#include <stdbool.h>
#include <stdint.h>

/* Parse helpers: return 0, or print "wafer <cmd>: <flag>: ..." to stderr and return 2 (a usage error). */
int cli_parse_int(const char *cmd, const char *flag, const char *s, long min, long max, long *out);
int cli_parse_float(const char *cmd, const char *flag, const char *s, double min, double max, double *out);
int cli_parse_u64(const char *cmd, const char *flag, const char *s, uint64_t *out);
/* Sizes such as "512M", "2G", "1048576" (bytes). */
int cli_parse_size(const char *cmd, const char *flag, const char *s, uint64_t *out);

#endif
