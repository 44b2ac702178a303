/*
 * slo_control: the batch size driven by a latency SLO. Bigger batches give more tokens per second and
 * slower tokens per sequence; this controller looks for the largest number of sequences running together
 * that keeps the inter-token latency (and, optionally, the time to first token) within its target, from
 * what was measured over a sliding window, and hands it to the scheduler (scheduler_set_max_running).
 *
 * Policy, once per step (the caller steps it every second or so with the window's measures):
 *   - after a change, hold for one window, so the measures reflect the new limit;
 *   - ITL p95 above target: decrease multiplicatively, to 3/4 of the running batch (at least one less);
 *   - ITL p95 below (1 - hysteresis) of the target and requests waiting at the limit: increase by one
 *     eighth (at least one); the TTFT target, when set, only asks for more room when it is missed while
 *     requests wait (queueing is what a bigger batch cures);
 *   - after an increase, if output tokens per second did not grow by at least 3%, the batch has stopped
 *     paying: go back and cap increases there for six windows;
 *   - in between (the hysteresis band), or without ITL samples: keep.
 * Pure: no clock, no threads; unit-tested step by step.
 */
#ifndef WAFER_SERVER_SLO_CONTROL_H
#define WAFER_SERVER_SLO_CONTROL_H

#include <stdbool.h>

struct slo_params {
    double itl_p95_ms;  /* target; <= 0: none (then only the TTFT target steers) */
    double ttft_p95_ms; /* target; <= 0: none */
    double window_s;    /* measures' window and hold after a change (default 10) */
    double hysteresis;  /* fraction under the target before growing (default 0.2) */
    int min_batch, max_batch;
};

/* What was measured over the last window (NaN: no samples). */
struct slo_input {
    double itl_p95_ms, ttft_p95_ms, output_tps;
    int running, waiting;
};

struct slo_control {
    struct slo_params p;
    int limit;
    double last_change; /* seconds (caller's clock) */
    bool last_was_increase;
    double tps_before_increase;
    int ceiling;         /* increases capped here until ceiling_until */
    double ceiling_until;
    char reason[96];     /* why the last change was made, for the log */
};

void slo_control_init(struct slo_control *c, const struct slo_params *p, int initial, double now);
/* One decision at time now (seconds). Returns the new limit (== c->limit); c->reason says why when it
 * changed. */
int slo_control_step(struct slo_control *c, const struct slo_input *in, double now);

#endif
