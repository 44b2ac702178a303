/*
 * sysinfo: what machine a measurement was taken on, so every speed figure can name its CPU (the machines this
 * project runs on change from one session to the next, and only figures labelled with their CPU compare).
 * Read from /proc/cpuinfo (Linux); where it is unreadable the answers say "unknown CPU" and "".
 */
#ifndef WAFER_CORE_SYSINFO_H
#define WAFER_CORE_SYSINFO_H

#include <stddef.h>

/* The CPU's model name ("AMD EPYC 9454 48-Core Processor"), or "unknown CPU"; always NUL-terminated in buf. */
void sysinfo_cpu_name(char *buf, size_t n);

/* The instruction-set flags that decide which kernels run, space-separated in a fixed order (e.g. "avx2 fma
 * f16c avx512f avx512bw avx512vl avx512_vnni avx512_bf16"), or "" when unknown; NUL-terminated in buf
 * (truncated to n - 1 bytes). Flags the kernel hides (a VM without AMX) are absent, as the kernels see it. */
void sysinfo_cpu_flags(char *buf, size_t n);

#endif
