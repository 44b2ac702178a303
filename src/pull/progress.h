/*
 * progress: a download's progress on stderr. On a terminal one line redrawn in place (at most 10 times a
 * second): percent, bar, bytes, rate, ETA. Otherwise (logs, CI) plain lines, one per 10% or 10 seconds,
 * so a log file stays short and readable.
 */
#ifndef WAFER_PULL_PROGRESS_H
#define WAFER_PULL_PROGRESS_H

#include <stdbool.h>
#include <stdint.h>

struct progress {
    char label[96];     /* what is being done, e.g. the file name */
    int64_t total;      /* bytes expected; <= 0 unknown */
    int64_t first;      /* bytes already there when this run began (a resumed download) */
    int64_t done;
    double t0;          /* monotonic seconds at start */
    double t_last;      /* last redraw or line */
    int last_decile;    /* last 10% step printed (plain lines) */
    bool tty, quiet, drawn;
};

/* Starts a bar. quiet: prints nothing at all. first: bytes already done (they do not count in the rate). */
void progress_begin(struct progress *p, const char *label, int64_t total, int64_t first, bool quiet);
/* Records done bytes; redraws when it is time. */
void progress_update(struct progress *p, int64_t done);
/* Final state and a newline (on a terminal), or a last plain line. */
void progress_end(struct progress *p, const char *what);
/* Ends an in-place line before another message goes to stderr (so the message starts on its own line). */
void progress_break(struct progress *p);

/* "1.2 GiB"-style size into buf (16 bytes). */
const char *progress_bytes(int64_t n, char buf[16]);

#endif
