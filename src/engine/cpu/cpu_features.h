/*
 * cpu_features: which instruction sets the running CPU (and OS) supports and the environment allows, asked
 * by every kernel file before it hands out its kernels and by the pickers (kernel_ops_get, gemv_ops_best).
 * Compiled without SIMD flags and apart from every kernel file, so asking never runs an instruction the CPU
 * may lack, and no kernel file has to call another to know. cpuid runs once per feature (in a virtual machine
 * it traps to the hypervisor); the environment switches are read as each function documents.
 */
#ifndef WAFER_ENGINE_CPU_FEATURES_H
#define WAFER_ENGINE_CPU_FEATURES_H

#include "engine/dtype.h"

#include <stdbool.h>

/* true when the CPU has AVX2, FMA and F16C. WAFER_NO_SIMD=1 in the environment forces false (read at every
 * call, so tests can toggle it). */
bool kernel_cpu_has_avx2(void);

/* true when the CPU and OS support AVX512F, DQ, BW, VL and AVX512-VNNI besides AVX2+FMA+F16C, and neither
 * WAFER_NO_SIMD nor WAFER_NO_AVX512 is set (WAFER_NO_AVX512=1 measures or tests the narrower paths). */
bool gemv_cpu_has_avx512(void);

/* true when the CPU has AVX-VNNI (the VEX-encoded 256-bit vpdpbusd: Intel since Alder Lake and Sapphire Rapids,
 * AMD since Zen 5) besides AVX2+FMA+F16C, and neither WAFER_NO_SIMD nor WAFER_NO_VNNI is set (WAFER_NO_VNNI=1
 * with WAFER_NO_AVX512=1 gives Zen 3's kernels on such a CPU). Read once. The 256-bit kernels use it where
 * AVX-512 is not used (gemv_avx2.c: Intel's client CPUs and E-core Xeons have AVX-VNNI and no AVX-512). */
bool kernel_cpu_has_avx_vnni(void);

/* true on an AMD CPU (cpuid vendor "AuthenticAMD"): for the few kernel shapes measured to differ by vendor. */
bool cpu_is_amd(void);

/* The x86 display family (cpuid leaf 1: base family, plus the extended family when the base is 15): AMD 0x19
 * is Zen 3 and Zen 4, 0x1a Zen 5; Intel's recent cores are 6. 0 when cpuid has no leaf 1. */
unsigned cpu_family(void);

/* How a decode gemv (one activation row: the R16 gemv16 of Q4_0, Q8_0, Q4_K, Q6_K, and the F16 gemv) reads
 * its weights: what it asks for ahead of its stream, and for F16 in what order. Only the speed differs: the
 * sums are the same bits under every rule.
 *   EVERY   every line, into L2 (prefetcht1), at the distance the kernel file gives; F16: 4 sequential
 *           streams a call (gemv_avx2.c), every line of each into L1 (prefetcht0) 1 KiB ahead.
 *   NTA     every line with prefetchnta (the AVX-512 gemv16; F16's 4 streams; AVX2's gemv16 run EVERY).
 *   SPARSE  one line per 576 bytes (a pair of Q4_0 / Q8_0 blocks), further ahead; the AVX-512 Q4_K gemv16
 *           none (the hardware prefetcher alone); not F16.
 *   ROWS    F16 only: tiles of 4 adjacent rows, the hardware prefetcher alone.
 *   NONE    F16 only: the 4 streams, the hardware prefetcher alone.
 *   SPREAD  the K-quant gemv16 (Q4_K, Q6_K) only: every line, one beside each load of the block's kernel, as
 *           their gemm asks (the others ask for a block's lines together at its start); AVX-512 into L1
 *           (prefetcht0), AVX2 into L2 (prefetcht1).
 *   TWIN    the Q4_0 / Q8_0 gemv16 and the AVX-512 Q4_K one only: two groups of 16 rows read side by side
 *           (Q4_0 / Q8_0: AVX-512 a pair of blocks of each in turn, AVX2 a block, with EVERY's prefetches;
 *           Q4_K: a quarter block, 512 bytes, of each in turn, with SPREAD's; the groups half a call's rows
 *           apart), in decode claims of 2 MiB instead of 256 KiB (cpu_backend.c) so that the two are far apart:
 *           two streams for the memory to serve at once.
 * The built-in rules, as measured per CPU family (the figures are in the kernel files):
 *   AMD family 0x19 with AVX-512 (Zen 4): SPARSE, where every line cost more than it won: Q4_0 / Q8_0 one line
 *     per pair of blocks far ahead, Q6_K one per 576 bytes, Q4_K none (gemv_avx512q.c, gemv_avx512k.c); with
 *     WAFER_NO_AVX512 (the AVX2 kernels, measured there) one line per 576 bytes (gemv_avx2.c). F16: NONE (its
 *     4 streams, no prefetch).
 *   AMD family 0x19 without AVX-512 (Zen 3; the EPYC family 25 model 1 of stop 51): Q4_0 and Q8_0 TWIN, Q4_K and Q6_K
 *     SPREAD (Q4_K EVERY until stop 52's lone-column kernel, with which spread read 1.06x and 1.10x of every in two
 *     `wafer bench --tune` runs), F16 NONE. Zen 4's SPARSE was the worst rule there (`wafer bench --tune -t 2`, 3 runs,
 *     GB/s sparse / every / twin or spread, plain read 32-37): Q4_0 22.7-25.0 / 29.5-32.9 / 32.8-36.5, Q8_0 25.1-26.0 /
 *     29.7-31.1 / 32.6-33.5, Q4_K 22.3-22.9 / 27.0-27.8 / 25.4-25.6, Q6_K 15.4-16.2 / 25.0-27.6 / 29.5-31.0; F16 none
 *     36.1-43.7, every 0.96-1.01 of it. 1B decode, 2 threads, alternated: Q4_0 36.4-37.2 -> 54.0-74.4 tokens/s, Q8_0
 *     25.0-25.1 -> 35.0-35.1, Q4_K_M 28.6-29.5 -> 38.6-41.1.
 *   AMD family 0x1a (Zen 5), AVX-512: NTA, and Q8_0 SPARSE (one line per pair of blocks far ahead read 1.01-1.16
 *     of a plain read against 0.80-1.00 with every line, 2 threads; 1B Q8_0 decoded 1.37-1.50x faster). What
 *     NTA gains there, one core reading from memory (`wafer bench --stream TYPE -t 1`, alternated, kernels /
 *     plain read; one core's read is bound by its own misses in flight, so one thread shows what two see when
 *     the memory is fast): Q4_0 0.96-0.97 against 0.91-0.92, Q4_K 0.92-0.95 against 0.81-0.87, Q6_K 0.92
 *     against 0.84, F16 0.95-0.96 against 0.91 with none. With AVX2 alone: EVERY, F16 NTA.
 *   Other AMD families: EVERY, F16 NONE.
 *   Intel and the rest: EVERY, and Q4_0 TWIN, Q4_K and Q6_K SPREAD (AVX-512 and AVX2 alike). Measured on an
 *     Intel Xeon family 6 model 207 (Emerald Rapids; `wafer bench --tune`, 2 threads, stop 43): the quantized
 *     types read fastest with every line asked for (NTA 0.45-0.70, SPARSE 0.71-0.99 of EVERY), Q4_K spread
 *     over its kernel (gemv_avx512k.c: 1B Q4_K_M decode 1.05x), and F16 with its streams prefetched into L1
 *     (gemv_avx2.c: 1.17-1.28x ROWS, the rule before, and 1B F16 decode 11.1 -> 14.1-14.95 tokens/s). Stop
 *     44: Q4_0 two groups side by side
 *     (TWIN: `--tune` 1.03-1.05x EVERY; 1B Q4_0 decode faster in 7 of 8 pairs, median +1.5%, and in 9 of 11
 *     pairs of an earlier build, median +1.9%); Q8_0 TWIN 1.03-1.04x in `--tune`, in decode unclear (4 of 5
 *     pairs ahead while the bandwidth moved between 22 and 30 GB/s) and above the probe either way, so not
 *     built in; Q6_K spread 1.02-1.03x EVERY, too little to move a decode (1B Q4_K_M level): candidates.
 *     Stop 45: Q4_K TWIN (two groups side by side, a quarter block of each in turn) read faster than SPREAD
 *     in `--stream` and `--tune`, but decode could not tell them apart (gemv_avx512k.c AK16_GEMV): a candidate.
 *     Stop 48, the AVX2 kernels there (WAFER_NO_AVX512=1, with and without AVX-VNNI; gemv_avx2.c): Q4_0 TWIN
 *     (1B Q4_0 decode +2.5-6.6%, to 86-92% of the probes beside), Q4_K and Q6_K SPREAD (`--stream`, kernels /
 *     plain read: Q6_K 0.82-0.85 -> 0.90-0.94, Q4_K 0.91 -> 0.93-0.99; 1B Q4_K_M decode +3-8%); Q8_0 TWIN
 *     level (1.00 in `--tune`, decode 1% either way), the K-quants' TWIN a block of each in turn 0.94-0.98.
 *     And the AVX-512 Q6_K SPREAD after all: 1B Q4_K_M decode faster in 6 of 6 pairs (43.0-45.1 -> 43.6-46.4
 *     tokens/s, 87-89% -> 88-92% of the probes beside; `--stream q6_k` 0.96-0.98 -> 0.98-0.99).
 * A CPU the project has not measured gets what `wafer bench --tune` measures on it instead (cpu_tune.h): a
 * tuned rule per type, set by cpu_decode_prefetch_set, overrides the built-in one. */
enum cpu_prefetch {
    CPU_PREFETCH_EVERY,
    CPU_PREFETCH_NTA,
    CPU_PREFETCH_SPARSE,
    CPU_PREFETCH_ROWS,
    CPU_PREFETCH_NONE,
    CPU_PREFETCH_SPREAD,
    CPU_PREFETCH_TWIN,
    CPU_PREFETCH_COUNT
};

/* The weight types whose decode gemv takes a rule, in the order tune files and descriptions list them. */
#define CPU_PREFETCH_N_TYPES 5
extern const enum dtype cpu_decode_prefetch_types[CPU_PREFETCH_N_TYPES];

/* "every", "nta", "sparse", "rows", "none", "spread", "twin"; "?" out of range. */
const char *cpu_prefetch_name(int rule);

/* The rule named s (as cpu_prefetch_name writes it), or -1. */
int cpu_prefetch_parse(const char *s);

/* The rule type t's decode gemv uses now, under the instruction set the kernels run (gemv_cpu_has_avx512):
 * the environment's WAFER_GEMV_PREFETCH=sparse|every and WAFER_PREFETCH_NTA=1|0 (read at the first call and
 * cached; to measure a choice on another CPU) over the tuned rule over the built-in one. Cheap enough to ask
 * per kernel call. EVERY for a type without such a gemv. */
enum cpu_prefetch cpu_decode_prefetch(enum dtype t);

/* true when WAFER_GEMV_PREFETCH or WAFER_PREFETCH_NTA in the environment decides the rules (as read at the
 * first call of cpu_decode_prefetch or this), so that tuned rules may not be what runs. */
bool cpu_decode_prefetch_env(void);

/* The built-in rule for type t on this CPU and instruction set (above), ignoring tuning and environment. */
enum cpu_prefetch cpu_decode_prefetch_builtin(enum dtype t);

/* The rules type t's decode gemv implements under the instruction set the kernels run, built-in first, into
 * out; returns how many (0 for a type without such a gemv). Each is a different way to read: no two run the
 * same code. */
int cpu_decode_prefetch_candidates(enum dtype t, enum cpu_prefetch out[CPU_PREFETCH_COUNT]);

/* Whether rule is one of cpu_decode_prefetch_candidates(t). */
bool cpu_decode_prefetch_valid(enum dtype t, int rule);

/* Sets the tuned rule for type t (rule one of cpu_decode_prefetch_candidates(t)), or clears it (rule < 0):
 * the built-in rule again. Takes effect at the next kernel call, on every thread (an atomic per type). */
void cpu_decode_prefetch_set(enum dtype t, int rule);

/* The tuned rule for type t, or -1 where none is set. */
int cpu_decode_prefetch_tuned(enum dtype t);

/* Whether this CPU has built-in rules of its own (AMD families 0x19 (Zen 3 and Zen 4, each its own) and 0x1a,
 * Intel family 6 model 207, where they were measured); on any other CPU the rules are the generic ones until a
 * tune file replaces them. */
bool cpu_decode_prefetch_measured(void);

/* true on AMD families 0x19 and 0x1a (with AVX-512: Zen 4 and Zen 5) and Intel family 6 model 207, where the
 * AVX-512 F16 gemm converts whole weight rows at a time instead of chunks of 512 elements (gemv_avx512k.c has the
 * figures).
 * WAFER_F16_GEMM=whole or =chunks overrides the CPU's rule (read at every call: tests run both on every CPU;
 * the sums are the same bits either way). */
bool cpu_f16_gemm_whole_rows(void);

/* The L1 data cache's bytes a core (sysconf; 32 KiB where the system does not say), asked once. */
size_t cpu_l1d_bytes(void);

/* true where the 256-bit F16 gemm (gemv_avx2.c, GH_WB_TILES) may read a panel's rows converted to F32 once: an L1
 * of at least 48 KiB (the Intel Xeon's), which holds a tile's 3 converted rows and 4 activation rows; not on a
 * Zen 3 (32 KiB). WAFER_F16_F32_PANELS=1 or =0 overrides (read at every call: tests run both on every CPU; the
 * sums are the same bits either way). */
bool cpu_f16_gemm_f32_panels(void);

/* true where the AVX-512 K-quant kernels' spread prefetch (one line beside each load: the decode gemv's SPREAD and
 * TWIN rules, and the gemm's next group where one tile of columns reads each group, as in batched decode of up to
 * 8 sequences; prefill keeps L1) asks for its lines into L2 (prefetcht1), false into L1 (prefetcht0): L2 on Intel
 * (the Xeon family 6 model 207, stop 49), L1 on AMD (the Zen 5, stop 33); gemv_avx512k.c has the figures.
 * WAFER_SPREAD_HINT=l2 or =l1 overrides it (read at every call, as WAFER_F16_GEMM; the sums are the same bits). */
bool cpu_kquant_spread_l2(void);

#endif
