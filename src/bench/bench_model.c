/*
 * bench_model: placeholder until the engine benchmark lands; it keeps `wafer bench` dispatch working and
 * points users at what exists today.
 */
#include "bench/bench_model.h"

#include <stdio.h>

int bench_model_main(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    fprintf(stderr, "wafer bench --model: the engine benchmark is not built yet; use wafer bench serve\n");
    return 2;
}
