/*
 * slo_control: additive-increase, multiplicative-decrease on the batch limit against a latency target,
 * with a hold after each change, a hysteresis band, and a throughput check on increases; halving and
 * doubling of the prefill chunk when the ITL's tail, not its median, misses (slo_control.h).
 */
#include "server/slo_control.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

void slo_control_init(struct slo_control *c, const struct slo_params *p, int initial, double now)
{
    memset(c, 0, sizeof *c);
    c->p = *p;
    if (!(c->p.window_s > 0))
        c->p.window_s = 10;
    if (!(c->p.hysteresis > 0 && c->p.hysteresis < 1))
        c->p.hysteresis = 0.2;
    if (c->p.min_batch < 1)
        c->p.min_batch = 1;
    if (c->p.max_batch < c->p.min_batch)
        c->p.max_batch = c->p.min_batch;
    c->limit = initial < c->p.min_batch ? c->p.min_batch : initial > c->p.max_batch ? c->p.max_batch : initial;
    c->last_change = now;
    c->ceiling = c->p.max_batch;
    if (c->p.max_chunk > 0) {
        if (c->p.min_chunk < 1 || c->p.min_chunk > c->p.max_chunk)
            c->p.min_chunk = c->p.max_chunk < 16 ? c->p.max_chunk : 16;
        c->chunk = c->chunk_ceiling = c->p.max_chunk;
    } else {
        c->p.max_chunk = c->p.min_chunk = 0;
    }
}

static void set_chunk(struct slo_control *c, int v, double now, const char *why)
{
    c->chunk = v;
    c->last_change = now;
    c->last_was_increase = false;
    snprintf(c->reason, sizeof c->reason, "%s", why);
}

static int clamp(const struct slo_control *c, int v)
{
    return v < c->p.min_batch ? c->p.min_batch : v > c->p.max_batch ? c->p.max_batch : v;
}

static void set_limit(struct slo_control *c, int v, double now, bool increase, double tps, const char *why)
{
    c->limit = v;
    c->last_change = now;
    c->last_was_increase = increase;
    c->tps_before_increase = tps;
    c->decreased_from = 0;
    snprintf(c->reason, sizeof c->reason, "%s", why);
}

int slo_control_step(struct slo_control *c, const struct slo_input *in, double now)
{
    c->reason[0] = 0;
    if (now - c->last_change < c->p.window_s)
        return c->limit; /* the window still holds measures of the previous limit */
    if (now >= c->ceiling_until)
        c->ceiling = c->p.max_batch;
    if (now >= c->chunk_ceiling_until)
        c->chunk_ceiling = c->p.max_chunk;
    bool have_itl = c->p.itl_p95_ms > 0 && !isnan(in->itl_p95_ms);
    bool itl_over = have_itl && in->itl_p95_ms > c->p.itl_p95_ms;
    bool itl_room = c->p.itl_p95_ms <= 0 || (have_itl && in->itl_p95_ms < c->p.itl_p95_ms * (1 - c->p.hysteresis));
    bool ttft_over = c->p.ttft_p95_ms > 0 && !isnan(in->ttft_p95_ms) && in->ttft_p95_ms > c->p.ttft_p95_ms;
    bool demand = in->waiting > 0 && in->running >= c->limit;
    bool ttft_wait = ttft_over && in->waiting > 0;
    /* a missed TTFT target with requests waiting is a missed SLO too: it may grow while the ITL p95 is
     * within its target, not only under the band (the ITL side backs off if that overshoots) */
    bool ttft_room = ttft_wait && have_itl && in->itl_p95_ms <= c->p.itl_p95_ms;

    /* an increase that bought no throughput is undone, and capped for a while */
    if (c->last_was_increase && !isnan(in->output_tps) && !isnan(c->tps_before_increase) && !itl_over &&
        in->output_tps < c->tps_before_increase * 1.03 && demand) {
        int back = clamp(c, c->limit - (c->limit / 8 > 1 ? c->limit / 8 : 1));
        c->ceiling = back;
        c->ceiling_until = now + 6 * c->p.window_s;
        set_limit(c, back, now, false, NAN, "a larger batch did not raise throughput");
        return c->limit;
    }
    c->last_was_increase = false;
    /* a decrease that did not lower the ITL is undone, and the batch kept from going below for a while;
     * judged one window after the running batch has come down to the new limit (running sequences are not
     * preempted: until they finish, the window measures the old batch), or after six windows at most */
    if (c->decreased_from > 0 && now - c->last_change < 6 * c->p.window_s) {
        if (in->running > c->limit) {
            c->cut_effective = 0;
            return c->limit;
        }
        if (!(c->cut_effective > 0))
            c->cut_effective = now;
        if (now - c->cut_effective < c->p.window_s)
            return c->limit;
    }
    if (c->decreased_from > 0 && !isnan(in->itl_p95_ms) && !isnan(c->itl_before_decrease) &&
        in->itl_p95_ms > c->itl_before_decrease * 0.9) {
        int back = c->decreased_from;
        c->floor = back;
        c->floor_until = now + 6 * c->p.window_s;
        set_limit(c, back, now, false, NAN, "a smaller batch did not lower the ITL p95");
        return c->limit;
    }
    c->decreased_from = 0;
    if ((itl_over || (!itl_room && (demand || ttft_wait) && c->limit < c->ceiling)) && c->chunk > c->p.min_chunk && in->itl_p50_ms > 0 &&
        in->itl_p50_ms < c->p.itl_p95_ms * 0.5) {
        /* the tail, not the median, misses (or stands in the way of growth the load asks for): the steps
         * carrying prompt chunks are the slow ones */
        int v = c->chunk / 2 > c->p.min_chunk ? c->chunk / 2 : c->p.min_chunk;
        c->chunk_ceiling = v;
        c->chunk_ceiling_until = now + 6 * c->p.window_s;
        set_chunk(c, v, now, "ITL p95 above the target, p50 within: smaller prompt chunks");
        return c->limit;
    }
    bool chunk_room = c->chunk > 0 && c->chunk < c->chunk_ceiling;
    if (itl_room && have_itl && ttft_over && in->waiting > 0 && chunk_room) {
        int v = c->chunk * 2 < c->chunk_ceiling ? c->chunk * 2 : c->chunk_ceiling;
        set_chunk(c, v, now, "TTFT p95 above the target with requests waiting: larger prompt chunks");
        return c->limit;
    }
    if (itl_over) {
        int base = in->running > 0 && in->running < c->limit ? in->running : c->limit;
        /* far over the target, a bigger cut (the ITL grows about linearly with the batch): target / measured,
         * between 1/2 and 3/4 */
        double f = c->p.itl_p95_ms / in->itl_p95_ms;
        f = f < 0.5 ? 0.5 : f > 0.75 ? 0.75 : f;
        int v = clamp(c, (int)floor(base * f));
        if (v >= c->limit)
            v = clamp(c, c->limit - 1);
        if (now < c->floor_until && v < c->floor)
            v = c->floor;
        if (v < c->limit) {
            int from = c->limit;
            set_limit(c, v, now, false, NAN, "ITL p95 above the target");
            c->decreased_from = from;
            c->itl_before_decrease = in->itl_p95_ms;
            c->cut_effective = 0;
        }
        return c->limit;
    }
    if (((demand && itl_room && (have_itl || ttft_over)) || ttft_room) && c->limit < c->ceiling) {
        int step = c->limit / 8 > 1 ? c->limit / 8 : 1;
        int v = clamp(c, c->limit + step);
        if (v > c->ceiling)
            v = c->ceiling;
        if (v != c->limit) {
            set_limit(c, v, now, true, in->output_tps,
                      ttft_over ? "TTFT p95 above the target with requests waiting" : "ITL p95 has room, requests wait");
            return c->limit;
        }
    }
    if (itl_room && have_itl && chunk_room) {
        int v = c->chunk * 2 < c->chunk_ceiling ? c->chunk * 2 : c->chunk_ceiling;
        set_chunk(c, v, now, "ITL p95 has room: larger prompt chunks");
    }
    return c->limit;
}
