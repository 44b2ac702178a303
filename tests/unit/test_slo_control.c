/* Tests for the SLO batch controller, step by step on a simulated server whose ITL p95 grows with the batch
 * (0.5 ms + 0.25 ms per running sequence) and whose throughput grows with it up to a cap: the limit settles at the largest
 * batch that meets the target, holds inside the hysteresis band, backs off when the target is missed, waits
 * a window after each change, and gives back an increase that bought no throughput. */
#include "testutil.h"

#include "server/slo_control.h"

#include <math.h>
#include <string.h>
#include <stdio.h>

/* The simulated server under a load that always has requests waiting. */
static struct slo_input sim(int limit, double tps_cap)
{
    struct slo_input in = {.itl_p95_ms = 0.5 + 0.25 * limit, .ttft_p95_ms = NAN, .running = limit, .waiting = 10};
    double tps = 300.0 * limit; /* grows with the batch until the machine's cap */
    in.output_tps = tps < tps_cap ? tps : tps_cap;
    return in;
}

static void test_converges(void **state)
{
    (void)state;
    struct slo_control c;
    struct slo_params p = {.itl_p95_ms = 4.0, .window_s = 10, .min_batch = 1, .max_batch = 64};
    slo_control_init(&c, &p, 32, 0);
    assert_int_equal(c.limit, 32);
    double t = 0;
    /* 32 sequences: ITL 8.5 ms, over twice the 4 ms target: the cut is the largest, to 1/2 (16); nearer the
     * target, to target / measured, at most 3/4 */
    t += 10;
    struct slo_input in = sim(c.limit, 1e9);
    assert_int_equal(slo_control_step(&c, &in, t), 16);
    /* within the hold window nothing changes, even if the measure is still over */
    in = sim(c.limit, 1e9);
    assert_int_equal(slo_control_step(&c, &in, t + 5), 16);
    for (int i = 0; i < 40; i++) {
        t += 10;
        in = sim(c.limit, 1e9);
        slo_control_step(&c, &in, t);
    }
    /* the largest batch meeting 4 ms is 14 (0.5 + 3.5); the band (20% under: < 3.2 ms) stops growth at
     * 10 (3.0 ms) or above, so it settles between */
    assert_true(c.limit <= 14);
    assert_true(c.limit >= 10);
    int settled = c.limit;
    for (int i = 0; i < 20; i++) {
        t += 10;
        in = sim(c.limit, 1e9);
        slo_control_step(&c, &in, t);
    }
    assert_int_equal(c.limit, settled); /* stable: no oscillation */
    in = sim(c.limit, 1e9);
    assert_true(in.itl_p95_ms <= 4.0);
}

static void test_grows_when_room(void **state)
{
    (void)state;
    struct slo_control c;
    struct slo_params p = {.itl_p95_ms = 50, .window_s = 5, .min_batch = 1, .max_batch = 16};
    slo_control_init(&c, &p, 2, 0);
    double t = 0;
    for (int i = 0; i < 30; i++) {
        t += 5;
        struct slo_input in = sim(c.limit, 1e9);
        slo_control_step(&c, &in, t);
    }
    assert_int_equal(c.limit, 16); /* far under target: up to the cap */
    /* no demand (nobody waits): no growth from a low limit */
    slo_control_init(&c, &p, 2, 0);
    struct slo_input idle = sim(2, 1e9);
    idle.waiting = 0;
    assert_int_equal(slo_control_step(&c, &idle, 100), 2);
    /* no ITL samples: keep */
    struct slo_input none = sim(2, 1e9);
    none.itl_p95_ms = NAN;
    assert_int_equal(slo_control_step(&c, &none, 200), 2);
}

static void test_throughput_plateau(void **state)
{
    (void)state;
    struct slo_control c;
    struct slo_params p = {.itl_p95_ms = 100, .window_s = 10, .min_batch = 1, .max_batch = 64};
    slo_control_init(&c, &p, 8, 0);
    /* throughput saturates at what 8 sequences give: growing to 9 buys nothing and is undone */
    double cap = sim(8, 1e9).output_tps;
    struct slo_input in = sim(8, cap);
    assert_int_equal(slo_control_step(&c, &in, 10), 9);
    in = sim(9, cap);
    assert_int_equal(slo_control_step(&c, &in, 20), 8);
    assert_non_null(strstr(c.reason, "throughput"));
    /* and stays capped there for a while */
    for (double t = 30; t < 70; t += 10) {
        in = sim(c.limit, cap);
        assert_int_equal(slo_control_step(&c, &in, t), 8);
    }
}

static void test_ttft_target(void **state)
{
    (void)state;
    struct slo_control c;
    struct slo_params p = {.ttft_p95_ms = 200, .window_s = 1, .min_batch = 1, .max_batch = 8};
    slo_control_init(&c, &p, 2, 0);
    struct slo_input in = {.itl_p95_ms = NAN, .ttft_p95_ms = 900, .output_tps = 100, .running = 2, .waiting = 5};
    assert_int_equal(slo_control_step(&c, &in, 1), 3); /* queueing: more room */
    in.ttft_p95_ms = 100;
    in.running = 3;
    in.output_tps = 200;
    assert_int_equal(slo_control_step(&c, &in, 2), 3); /* met: keep */
    /* with an ITL target too: a missed TTFT grows the batch while the ITL p95 is within its target, even
     * inside the band (3.5 of 4 ms); not once the ITL is over */
    struct slo_params p2 = {.itl_p95_ms = 4, .ttft_p95_ms = 200, .window_s = 1, .min_batch = 1, .max_batch = 8};
    slo_control_init(&c, &p2, 4, 0);
    in = (struct slo_input){.itl_p95_ms = 3.5, .itl_p50_ms = 3, .ttft_p95_ms = 900, .output_tps = 100, .running = 4,
                            .waiting = 5};
    assert_int_equal(slo_control_step(&c, &in, 1), 5);
    in.ttft_p95_ms = 150; /* TTFT met, ITL in the band: keep */
    in.running = 5;
    in.output_tps = 200;
    assert_int_equal(slo_control_step(&c, &in, 2), 5);
    in.ttft_p95_ms = 900;
    in.itl_p95_ms = 4.2; /* over: back off (to 3/4) */
    assert_int_equal(slo_control_step(&c, &in, 3), 3);
}

/* A server whose decode steps fit the target (p50 = 0.5 + 0.15 ms per running sequence) but whose steps
 * carrying a prompt chunk add `per_token` ms per chunk token to the tail (p95). */
static struct slo_input sim_chunk(const struct slo_control *c, double per_token, double ttft)
{
    struct slo_input in = {.itl_p50_ms = 0.5 + 0.15 * c->limit, .ttft_p95_ms = ttft, .running = c->limit,
                           .waiting = 10, .output_tps = 300.0 * c->limit};
    in.itl_p95_ms = in.itl_p50_ms + per_token * c->chunk;
    return in;
}

static void test_prefill_chunk(void **state)
{
    (void)state;
    struct slo_control c;
    struct slo_params p = {.itl_p95_ms = 4.0, .window_s = 10, .min_batch = 1, .max_batch = 8, .max_chunk = 256};
    slo_control_init(&c, &p, 8, 0);
    assert_int_equal(c.chunk, 256);
    assert_int_equal(c.p.min_chunk, 16);
    /* p50 1.7 ms fits, p95 1.7 + 6.4 does not: the chunk halves, the batch stays */
    struct slo_input in = sim_chunk(&c, 0.025, NAN);
    assert_int_equal(slo_control_step(&c, &in, 10), 8);
    assert_int_equal(c.chunk, 128);
    assert_non_null(strstr(c.reason, "smaller prompt chunks"));
    in = sim_chunk(&c, 0.025, NAN);
    assert_int_equal(slo_control_step(&c, &in, 15), 8); /* hold */
    assert_int_equal(c.chunk, 128);
    in = sim_chunk(&c, 0.025, NAN); /* 1.7 + 3.2 > 4 */
    slo_control_step(&c, &in, 20);
    assert_int_equal(c.chunk, 64); /* 1.7 + 1.6 = 3.3: met, inside the band */
    for (double t = 30; t < 200; t += 10) {
        in = sim_chunk(&c, 0.025, NAN);
        assert_int_equal(slo_control_step(&c, &in, t), 8);
        assert_int_equal(c.chunk, 64); /* stable, also after the cap expired (no room to grow) */
    }
    /* below the top of its range, with requests waiting, the tail that stands in the way of growth is cut
     * too (p95 3.3 in the band, no room; the median has room): 32, then the batch may grow */
    struct slo_params p16 = p;
    p16.max_batch = 16;
    slo_control_init(&c, &p16, 8, 0);
    c.chunk = c.chunk_ceiling = 64;
    in = sim_chunk(&c, 0.025, NAN);
    assert_int_equal(slo_control_step(&c, &in, 10), 8);
    assert_int_equal(c.chunk, 32);
    in = sim_chunk(&c, 0.025, NAN); /* 1.7 + 0.8 = 2.5: room */
    assert_int_equal(slo_control_step(&c, &in, 20), 9);
    /* the median itself misses: the batch goes down, not the chunk */
    struct slo_control d;
    slo_control_init(&d, &p, 8, 0);
    in = (struct slo_input){.itl_p50_ms = 3.9, .itl_p95_ms = 5, .ttft_p95_ms = NAN, .running = 8, .waiting = 4,
                            .output_tps = 100};
    assert_int_equal(slo_control_step(&d, &in, 10), 6);
    assert_int_equal(d.chunk, 256);
    /* cheap chunks and a missed TTFT with requests waiting: the chunk doubles back before the batch grows */
    struct slo_params pt = p;
    pt.ttft_p95_ms = 1000;
    slo_control_init(&d, &pt, 4, 0);
    in = sim_chunk(&d, 0.012, NAN);
    slo_control_step(&d, &in, 10);
    assert_int_equal(d.chunk, 128); /* 1.1 + 3.07 > 4 */
    for (double t = 20; t < 70; t += 10) { /* capped for six windows */
        in = sim_chunk(&d, 0.001, 5000);
        slo_control_step(&d, &in, t);
        assert_true(d.chunk == 128);
    }
    in = sim_chunk(&d, 0.001, 5000);
    int limit = d.limit;
    slo_control_step(&d, &in, 70);
    assert_int_equal(d.chunk, 256);
    assert_int_equal(d.limit, limit);
    assert_non_null(strstr(d.reason, "TTFT"));
    /* without max_chunk the chunk is left alone */
    struct slo_params q = p;
    q.max_chunk = 0;
    slo_control_init(&d, &q, 8, 0);
    in = sim_chunk(&d, 0.025, NAN);
    in.itl_p95_ms = 10;
    assert_int_equal(slo_control_step(&d, &in, 10), 4);
    assert_int_equal(d.chunk, 0);
}

/* The ITL is not the batch's (another process takes the CPU): a cut that does not lower it is undone, and
 * the batch is kept from going below for six windows; a cut that does lower it stays. */
static void test_decrease_that_does_not_help(void **state)
{
    (void)state;
    struct slo_control c;
    struct slo_params p = {.itl_p95_ms = 4.0, .window_s = 10, .min_batch = 1, .max_batch = 32};
    slo_control_init(&c, &p, 32, 0);
    struct slo_input in = {.itl_p95_ms = 10, .ttft_p95_ms = NAN, .output_tps = 1000, .running = 32, .waiting = 5};
    assert_int_equal(slo_control_step(&c, &in, 10), 16);
    /* the 32 running sequences finish first: no judgement while more than 16 run, nor in the window after */
    assert_int_equal(slo_control_step(&c, &in, 20), 16);
    in.running = 16;
    in.itl_p95_ms = 9.5; /* not 10% lower */
    assert_int_equal(slo_control_step(&c, &in, 25), 16);
    assert_int_equal(slo_control_step(&c, &in, 35), 32);
    assert_non_null(strstr(c.reason, "did not lower"));
    in.running = 32;
    for (double t = 45; t < 95; t += 10)
        assert_int_equal(slo_control_step(&c, &in, t), 32); /* held at the floor */
    assert_int_equal(slo_control_step(&c, &in, 95), 16);    /* then it tries again */
    in.running = 16;
    in.itl_p95_ms = 5; /* this time it helped: keep cutting */
    assert_int_equal(slo_control_step(&c, &in, 105), 16);
    assert_int_equal(slo_control_step(&c, &in, 115), 12);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_converges),
        cmocka_unit_test(test_grows_when_room),
        cmocka_unit_test(test_throughput_plateau),
        cmocka_unit_test(test_ttft_target),
        cmocka_unit_test(test_prefill_chunk),
        cmocka_unit_test(test_decrease_that_does_not_help),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
