/*
 * sysinfo: what machine a measurement was taken on, so every speed figure can name its CPU (the machines this
 * project runs on change from one session to the next, and only figures labelled with their CPU compare).
 * Read from /proc/cpuinfo (Linux); where it is unreadable the answers say "unknown CPU" and "".
 */
#ifndef WAFER_CORE_SYSINFO_H
#define WAFER_CORE_SYSINFO_H

#include <stddef.h>

/* The CPU's model name, its x86 family and model, and the core generation where the family and model name
 * one ("AMD EPYC (family 25 model 17, Zen 4)"): virtual machines often show a bare "AMD EPYC" for Zen 3, 4
 * and 5 alike. "unknown CPU" when /proc/cpuinfo has no model name; always NUL-terminated in buf. */
void sysinfo_cpu_name(char *buf, size_t n);

/* The label sysinfo_cpu_name writes, from its parts: name (the model name; NULL or "" gives "unknown CPU"),
 * vendor ("AuthenticAMD", "GenuineIntel", or NULL), family and model (-1 when unknown: no parentheses then).
 * Generations named: AMD family 23 "Zen/Zen 2", 25 "Zen 3" or "Zen 4" by model, 26 "Zen 5". */
void sysinfo_cpu_label(const char *name, const char *vendor, int family, int model, char *buf, size_t n);

/* The instruction-set flags that decide which kernels run, space-separated in a fixed order (e.g. "avx2 fma
 * f16c avx512f avx512bw avx512vl avx512_vnni avx512_bf16"), or "" when unknown; NUL-terminated in buf
 * (truncated to n - 1 bytes). Flags the kernel hides (a VM without AMX) are absent, as the kernels see it. */
void sysinfo_cpu_flags(char *buf, size_t n);

#endif
