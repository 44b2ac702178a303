/*
 * sd_notify: systemd's service notification protocol, spoken directly (no libsystemd): one datagram
 * "KEY=value\n..." to the AF_UNIX socket named by $NOTIFY_SOCKET ('@' first: the abstract namespace).
 * With Type=notify, `wafer serve` sends READY=1 once the model is loaded and the port listens, STOPPING=1
 * when it starts to drain, and WATCHDOG=1 at half of $WATCHDOG_USEC while its I/O loop turns, so a hung
 * server is killed and restarted by systemd (Restart=on-failure). Outside systemd every call is a no-op.
 */
#ifndef WAFER_SERVER_SD_NOTIFY_H
#define WAFER_SERVER_SD_NOTIFY_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

/* Sends msg (e.g. "READY=1\nSTATUS=serving x") to $NOTIFY_SOCKET. 0 when sent or when the variable is
 * unset; a negative ERR_* code when the socket cannot be reached (callers log it and carry on). */
int sd_notify_send(const char *msg);

/* The watchdog: pinged from the server's wait loop, but only while the I/O thread proves it is alive by
 * answering a wake (sd_watchdog_beat from its on_wake hook), so a stuck event loop stops the pings. */
struct sd_watchdog {
    int64_t interval_ns;     /* half of WATCHDOG_USEC; 0: no watchdog asked for */
    int64_t next_ns;         /* when the next ping is due (monotonic) */
    int64_t asked_ns;        /* when the I/O thread was last asked to beat */
    _Atomic int64_t beat_ns; /* when it last beat */
};

/* Reads $WATCHDOG_USEC (and $WATCHDOG_PID, which must be this process when set). Off when absent. */
void sd_watchdog_init(struct sd_watchdog *w);
/* Called by the I/O thread (any thread) when it handles a wake. */
void sd_watchdog_beat(struct sd_watchdog *w);
/* Called often (every 50 ms) by the wait loop: sends WATCHDOG=1 when due and the I/O thread beat since the
 * last ask. Returns true when the caller should wake the I/O thread (ask for the next beat). */
bool sd_watchdog_tick(struct sd_watchdog *w);

#endif
