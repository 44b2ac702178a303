/*
 * bench_model: `wafer bench --model M ...`, the engine benchmark (prompt processing and generation speed of a
 * GGUF model, in the manner of llama-bench). `wafer bench serve` / `wafer bench compare` live in serve_*.c.
 */
#ifndef WAFER_BENCH_BENCH_MODEL_H
#define WAFER_BENCH_BENCH_MODEL_H

/* argv[0] is "bench". Returns the process exit status. */
int bench_model_main(int argc, char **argv);

#endif
