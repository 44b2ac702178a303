/*
 * cpu_features: which instruction sets the running CPU (and OS) supports and the environment allows, asked
 * by every kernel file before it hands out its kernels and by the pickers (kernel_ops_get, gemv_ops_best).
 * Compiled without SIMD flags and apart from every kernel file, so asking never runs an instruction the CPU
 * may lack, and no kernel file has to call another to know. cpuid runs once per feature (in a virtual machine
 * it traps to the hypervisor); the environment switches are read as each function documents.
 */
#ifndef WAFER_ENGINE_CPU_FEATURES_H
#define WAFER_ENGINE_CPU_FEATURES_H

#include <stdbool.h>

/* true when the CPU has AVX2, FMA and F16C. WAFER_NO_SIMD=1 in the environment forces false (read at every
 * call, so tests can toggle it). */
bool kernel_cpu_has_avx2(void);

/* true when the CPU and OS support AVX512F, DQ, BW, VL and AVX512-VNNI besides AVX2+FMA+F16C, and neither
 * WAFER_NO_SIMD nor WAFER_NO_AVX512 is set (WAFER_NO_AVX512=1 measures or tests the narrower paths). */
bool gemv_cpu_has_avx512(void);

/* true on an AMD CPU (cpuid vendor "AuthenticAMD"): for the few kernel shapes measured to differ by vendor. */
bool cpu_is_amd(void);

/* The x86 display family (cpuid leaf 1: base family, plus the extended family when the base is 15): AMD 0x19
 * is Zen 3 and Zen 4, 0x1a Zen 5; Intel's recent cores are 6. 0 when cpuid has no leaf 1. */
unsigned cpu_family(void);

/* true on AMD family 0x19 (Zen 3 / Zen 4), where the decode gemv16 prefetch sparsely or not at all instead of
 * every line, which cost more than it won there: with AVX-512 (Zen 4) Q4_0 / Q8_0 one line per pair of blocks
 * far ahead, Q6_K one per 576 bytes, Q4_K none (gemv_avx512q.c, gemv_avx512k.c); with AVX2 alone (Zen 3's
 * kernels, measured on a Zen 4) one line per 576 bytes (gemv_avx2.c). WAFER_GEMV_PREFETCH=sparse or =every
 * in the environment overrides the CPU's rule (to measure the choice on another CPU); read at the first call
 * and cached, as is the CPU's answer, so it is cheap to call per product. Either way the sums are the same. */
bool cpu_gemv16_sparse_prefetch(void);

/* The AVX-512 Q8_0 decode gemv16's rule (gemv_avx512q.c): sparse as cpu_gemv16_sparse_prefetch says, and on
 * AMD family 0x1a (Zen 5) too, where one line per pair of blocks far ahead read 1.01-1.16 of a plain read
 * against 0.80-1.00 with every line (2 threads), and 1B Q8_0 decoded 1.37-1.50x faster. Same override and
 * caching as cpu_gemv16_sparse_prefetch. */
bool cpu_q8_0_gemv16_sparse_prefetch(void);

/* true on AMD family 0x1a (Zen 5), where the decode gemv's prefetches that ask for every line (AVX-512 Q4_0,
 * Q4_K, Q6_K, where the others use T1, into L2) and the F16 gemv's streams (which ask for none elsewhere) use
 * the non-temporal hint (prefetchnta), at the distances the kernel files give. What it gains there, one core
 * reading from memory (`wafer bench --stream TYPE -t 1`, alternated, kernels / plain read; one core's read is
 * bound by its own misses in flight, 41-43 GB/s on that VM in every minute, so one thread shows what two see
 * when the memory is fast): Q4_0 0.96-0.97 against 0.91-0.92, Q4_K 0.92-0.95 against 0.81-0.87, Q6_K 0.92
 * against 0.84, F16 0.95-0.96 against 0.91 with none. Not the gemm's prefetch of its next group (gemv_avx512k.c,
 * ak16_tile, says why). WAFER_PREFETCH_NTA=1 or =0 overrides the CPU's rule; read at the first call and
 * cached, as is the CPU's answer. The sums are the same either way. */
bool cpu_prefetch_nta(void);

/* true on AMD families 0x19 and 0x1a (with AVX-512: Zen 4 and Zen 5), where the AVX-512 F16 gemm converts
 * whole weight rows at a time instead of chunks of 512 elements (gemv_avx512k.c has the figures).
 * WAFER_F16_GEMM=whole or =chunks overrides the CPU's rule (read at every call: tests run both on every CPU;
 * the sums are the same bits either way). */
bool cpu_f16_gemm_whole_rows(void);

#endif
