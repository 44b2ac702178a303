/*
 * log: leveled, timestamped lines on stderr. The level comes from log_level_set() or the WAFER_LOG
 * environment variable (error, warn, info, debug). Thread-safe: each line is one write(2).
 */
#ifndef WAFER_CORE_LOG_H
#define WAFER_CORE_LOG_H

enum log_level { LOG_ERROR = 0, LOG_WARN = 1, LOG_INFO = 2, LOG_DEBUG = 3 };

/* Any thread (the level is an atomic: SIGHUP changes it while other threads log). */
void log_level_set(enum log_level level);
enum log_level log_level_get(void);
/* "error", "warn", "info" or "debug" -> *out; 0, or ERR_INVALID_ARG for any other name. */
int log_level_from_name(const char *name, enum log_level *out);
void log_write(enum log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#define log_error(...) log_write(LOG_ERROR, __VA_ARGS__)
#define log_warn(...) log_write(LOG_WARN, __VA_ARGS__)
#define log_info(...) log_write(LOG_INFO, __VA_ARGS__)
#define log_debug(...) log_write(LOG_DEBUG, __VA_ARGS__)

/* Aborts with file:line on a programmer error (never on bad input). */
#define ASSERT(cond)                                                                                       \
    do {                                                                                                   \
        if (!(cond))                                                                                       \
            log_assert_fail(#cond, __FILE__, __LINE__);                                                    \
    } while (0)
void log_assert_fail(const char *expr, const char *file, int line) __attribute__((noreturn));

#endif
