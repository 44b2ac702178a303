/*
 * membw: how fast this machine reads memory, the ceiling of decode speed (every generated token reads every
 * weight once). A STREAM-style probe: the engine's thread pool reads a buffer far larger than the caches,
 * each thread its own contiguous share (front to back, and as 4 runs side by side: each pass counts the
 * faster), with wide loads and nothing written, several passes; the result is bytes read per second. Beside
 * it, how long a cache line takes between two cores (membw_round_trip_ns), which on CPUs built of chiplets
 * says whether two threads share one's link to memory.
 */
#ifndef WAFER_BENCH_MEMBW_H
#define WAFER_BENCH_MEMBW_H

#include <stddef.h>
#include <stdint.h>

struct membw_result {
    double median_gbs; /* median over passes, GB/s (1e9 bytes per second) */
    double best_gbs;   /* fastest pass */
    double worst_gbs;  /* slowest pass */
    int passes;
    int threads;
    size_t bytes;      /* buffer size read per pass */
};

/* Reads a fresh buffer of `bytes` (rounded up to 4 KiB; 0 means 1 GiB) `passes` times (0 means 5) with
 * n_threads threads (<= 0: one per CPU). The buffer is written first, page by page by the thread that
 * later reads it, so every page is really backed (an untouched page would read the shared zero page).
 * 0, or ERR_NOMEM / ERR_INVALID_ARG with a message. membw_probe_create + membw_probe_run + destroy. */
int membw_measure(size_t bytes, int passes, int n_threads, struct membw_result *out, char *err);

/* A probe kept for measuring again and again (`wafer bench` probes beside each decode repetition): the buffer
 * and thread pool of membw_measure, written and warmed once. Its workers sleep between runs (threadpool.h), so
 * an idle probe takes no CPU. create: NULL with err set on failure; the caller frees with
 * membw_probe_destroy (NULL is a no-op). run: as membw_measure, on the same buffer each time. */
struct membw_probe;
struct membw_probe *membw_probe_create(size_t bytes, int n_threads, char *err);
int membw_probe_run(struct membw_probe *p, int passes, struct membw_result *out, char *err);
void membw_probe_destroy(struct membw_probe *p);

/* How long a cache line takes to go from one core to another and back: two threads, pinned to the first two
 * CPUs this process may run on, hand one line back and forth; the median over 5 runs of `rounds` round trips
 * (0: 20,000), in ns, into *ns. Every barrier of the engine's passes and every row one thread writes and
 * another reads pays it. On an AMD EPYC it says whether the two CPUs share a CCD, and with it the CCD's link
 * to memory: on the Zen 5 VM of docs/performance.md (stop 40) 80-130 ns on one CCD (two threads read 50-55
 * GB/s), 350-460 ns across two (80-87 GB/s). 0, or ERR_INVALID_ARG when fewer than two CPUs are allowed, or
 * ERR_INTERNAL when a thread cannot be started or pinned, with a message. */
int membw_round_trip_ns(int rounds, double *ns, char *err);

/* Reads n bytes (multiple of 128, 32-byte aligned) and returns a checksum of them, so the compiler cannot
 * drop the loads. The scalar and AVX2 versions return the same value for the same bytes (the test checks). */
uint64_t membw_read_scalar(const void *p, size_t n);
uint64_t membw_read_avx2(const void *p, size_t n);
/* The version picked for this CPU (AVX2 when kernel_cpu_has_avx2()). */
uint64_t membw_read(const void *p, size_t n);
/* membw_read of n bytes (multiple of 128, 32-byte aligned) cut into `streams` runs read side by side (1 KiB of
 * each in turn; what is left after whole KiBs is read at the end): every byte once, so the same checksum. */
uint64_t membw_read_streams(const void *p, size_t n, int streams);
/* The loads membw_read uses, for reports: "AVX2" or "scalar". */
const char *membw_loads_name(void);

#endif
