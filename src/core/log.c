/*
 * log: one formatted line per call, written with a single write(2) so lines from the I/O, engine and
 * worker threads never interleave mid-line.
 */
#include "core/log.h"

#include "core/err.h"

#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static _Atomic int log_level_cur = -1;

int log_level_from_name(const char *name, enum log_level *out)
{
    static const char *const names[] = {"error", "warn", "info", "debug"};
    for (int i = 0; name && i < 4; i++)
        if (!strcmp(name, names[i])) {
            *out = (enum log_level)i;
            return 0;
        }
    return ERR_INVALID_ARG;
}

static enum log_level log_level_from_env(void)
{
    enum log_level l = LOG_INFO;
    const char *s = getenv("WAFER_LOG");
    if (s)
        log_level_from_name(s, &l); /* an unknown name keeps info */
    return l;
}

void log_level_set(enum log_level level) { atomic_store(&log_level_cur, (int)level); }

enum log_level log_level_get(void)
{
    int l = atomic_load(&log_level_cur);
    if (l < 0) {
        l = (int)log_level_from_env();
        atomic_store(&log_level_cur, l);
    }
    return (enum log_level)l;
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
