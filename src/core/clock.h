/*
 * clock: the one monotonic clock every layer times itself with (CLOCK_MONOTONIC: never jumps with the wall
 * clock, so differences are durations). Wall-clock time (log lines, "created" fields) is time(2)'s business,
 * not this file's.
 */
#ifndef WAFER_CORE_CLOCK_H
#define WAFER_CORE_CLOCK_H

#include <stdint.h>

/* Monotonic time in nanoseconds (arbitrary origin: compare two readings, never print one). */
int64_t clock_now_ns(void);

/* The same clock in seconds. */
double clock_now_s(void);

#endif
