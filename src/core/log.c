/*
 * log: one formatted line per call, written with a single write(2) so lines from the I/O, engine and
 * worker threads never interleave mid-line.
 */
#include "core/log.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static int log_level_cur = -1;

static enum log_level log_level_from_env(void)
{
    const char *s = getenv("WAFER_LOG");
    if (!s)
        return LOG_INFO;
    if (!strcmp(s, "error"))
        return LOG_ERROR;
    if (!strcmp(s, "warn"))
        return LOG_WARN;
    if (!strcmp(s, "debug"))
        return LOG_DEBUG;
    return LOG_INFO;
}

void log_level_set(enum log_level level) { log_level_cur = (int)level; }

enum log_level log_level_get(void)
{
    if (log_level_cur < 0)
        log_level_cur = (int)log_level_from_env();
    return (enum log_level)log_level_cur;
}

void log_write(enum log_level level, const char *fmt, ...)
{
    static const char *names[] = {"error", "warn", "info", "debug"};
    if ((int)level > (int)log_level_get())
        return;
    char line[4096];
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    struct tm tm;
    gmtime_r(&ts.tv_sec, &tm);
    int n = snprintf(line, sizeof line, "%02d:%02d:%02d.%03ld %-5s ", tm.tm_hour, tm.tm_min, tm.tm_sec,
                     ts.tv_nsec / 1000000, names[level]);
    va_list ap;
    va_start(ap, fmt);
    int m = vsnprintf(line + n, sizeof line - (size_t)n - 1, fmt, ap);
    va_end(ap);
    size_t len = (size_t)n + (m < 0 ? 0 : (size_t)m);
    if (len > sizeof line - 2)
        len = sizeof line - 2;
    line[len++] = '\n';
    ssize_t w = write(STDERR_FILENO, line, len);
    (void)w;
}

void log_assert_fail(const char *expr, const char *file, int line)
{
    log_write(LOG_ERROR, "assertion failed: %s (%s:%d)", expr, file, line);
    abort();
}
