/*
 * slo_control: the batch size driven by a latency SLO. Bigger batches give more tokens per second and
 * slower tokens per sequence; this controller looks for the largest number of sequences running together
 * that keeps the inter-token latency (and, optionally, the time to first token) within its target, from
 * what was measured over a sliding window, and hands it to the scheduler (scheduler_set_max_running).
 *
 * Policy, once per step (the caller steps it every second or so with the window's measures):
 *   - after a change, hold for one window, so the measures reflect the new limit;
 *   - ITL p95 above target: decrease multiplicatively, to target/measured of the running batch, between
 *     1/2 and 3/4 (at least one less);
 *   - ITL p95 below (1 - hysteresis) of the target and requests waiting at the limit: increase by one
 *     eighth (at least one); the TTFT target, when set, only asks for more room when it is missed while
 *     requests wait (queueing is what a bigger batch cures), and then the ITL p95 need only be within its
 *     target (a missed TTFT is a missed SLO too; should the ITL overshoot, it backs off);
 *   - after an increase, if output tokens per second did not grow by at least 3%, the batch has stopped
 *     paying: go back and cap increases there for six windows;
 *   - after a decrease, if the ITL p95 did not fall by at least 10%, the latency is not the batch's (another
 *     process takes the CPU, the tail is prompt chunks): go back and keep the batch from going below that
 *     for six windows (a smaller batch would only cost throughput and queueing);
 *   - in between (the hysteresis band), or without ITL samples: keep.
 * The prefill chunk (prompt tokens a step may carry, when max_chunk is set): a step that carries a prompt
 * chunk is longer than a decode step, so a large chunk shows as a tail on the ITL while the median stays
 * low. So:
 *   - ITL p95 above target, or without room while the load asks for more (requests waiting at the limit,
 *     or a missed TTFT), while the ITL p50 is under half the target (the steady decode fits with room to
 *     spare; the spikes do not; a median nearer the target says the batch itself is too large):
 *     halve the chunk (down to min_chunk) before touching the batch, and cap its growth for six windows;
 *   - ITL p95 with room: a missed TTFT target while requests wait first doubles the chunk (prompts go
 *     through faster); otherwise the batch grows first when requests wait, and the chunk climbs back to
 *     max_chunk when nothing else asks for room (larger chunks make prefill cheaper per token).
 * One change per step, each followed by the hold.
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
    int min_chunk, max_chunk; /* prefill chunk range; max_chunk <= 0: the chunk is not adapted */
};

/* What was measured over the last window (NaN: no samples). */
struct slo_input {
    double itl_p95_ms, ttft_p95_ms, output_tps;
    double itl_p50_ms; /* <= 0 or NaN: unknown (then the chunk is never blamed for the tail) */
    int running, waiting;
};

struct slo_control {
    struct slo_params p;
    int limit;
    double last_change; /* seconds (caller's clock) */
    bool last_was_increase;
    double tps_before_increase;
    int decreased_from;      /* the limit before the last decrease (0: the last change was not one) */
    double itl_before_decrease;
    double cut_effective;    /* when the running batch first fitted under the cut limit (0: not yet) */
    int floor;               /* decreases stop here until floor_until */
    double floor_until;
    int ceiling;         /* increases capped here until ceiling_until */
    double ceiling_until;
    int chunk;               /* prefill chunk now (0 when not adapted) */
    int chunk_ceiling;       /* chunk increases capped here until chunk_ceiling_until */
    double chunk_ceiling_until;
    char reason[96];     /* why the last change was made, for the log */
};

void slo_control_init(struct slo_control *c, const struct slo_params *p, int initial, double now);
/* One decision at time now (seconds). Returns the new limit (== c->limit); c->chunk is the prefill chunk
 * to use; c->reason says why when either changed. */
int slo_control_step(struct slo_control *c, const struct slo_input *in, double now);

#endif
