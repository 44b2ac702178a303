/*
 * cpu_tune: the tune file, which carries the decode prefetch rules `wafer bench --tune` measured on one CPU to
 * every later wafer process on the same CPU.
 *
 * Why: how a decode gemv should ask for its weights differs by CPU far more than anything else in the kernels
 * (cpu_features.h: every line, prefetchnta, or sparse; on a Zen 4 every line cost Q4_0 decode 1.2-1.35x, on a
 * Zen 5 sparse cost Q4_K and Q6_K up to 2x), and the built-in rules cover only the CPU families the project
 * has measured. On any other CPU (an Intel Xeon since the R16 kernels, a Zen 3, whatever comes next) decode
 * would run a guess; a tune file measured there replaces the guess with the rule that read fastest there.
 *
 * The file is JSON, written whole (a temporary file renamed into place), one per user by default:
 *   {"version": 1, "cpu": "<sysinfo_cpu_name>", "isa": "avx512" | "avx-vnni" | "avx2", "threads": N,
 *    "wafer": "<version>",
 *    "measured_at": "<UTC ISO 8601>", "decode_prefetch": {"q4_0": "nta", ...}, "figures": {...}}
 * A process applies it only when "cpu" and "isa" are its own (a virtual machine that moved to another host
 * CPU, or WAFER_NO_AVX512, keeps the built-in rules and says why). The rules never change a result: every
 * rule gives the same bits.
 */
#ifndef WAFER_ENGINE_CPU_TUNE_H
#define WAFER_ENGINE_CPU_TUNE_H

#include "engine/dtype.h"

#include <stdbool.h>
#include <stddef.h>

/* 2 since stop 43: F16's "every" prefetches its streams ("none" is what version 1's "every" ran). */
#define CPU_TUNE_VERSION 2

/* The tune file's path: $WAFER_TUNE_FILE when set (set but empty: no tune file at all), else
 * $XDG_CACHE_HOME/wafer/tune.json, else $HOME/.cache/wafer/tune.json. false (buf "") when there is none. */
bool cpu_tune_path(char *buf, size_t n);

/* The instruction set the kernels run, as the tune file names it: "avx512", "avx-vnni" (AVX2 with AVX-VNNI's
 * Q4_0 / Q8_0 kernels), "avx2" or "scalar". */
const char *cpu_tune_isa(void);

/* Reads the tune file at path and, when it was measured on this CPU and instruction set, sets its rules
 * (cpu_decode_prefetch_set) and records path as the rules' source. 1 applied; 0 not applied (no such file,
 * or another CPU or instruction set: why in msg, ERR_MSG_MAX bytes); ERR_IO or ERR_FORMAT when it cannot be
 * read or is not a tune file of this version (why in msg; nothing set). */
int cpu_tune_apply_file(const char *path, char *msg);

/* Once per process, and at no cost after: cpu_tune_apply_file on cpu_tune_path(), logging one line when it
 * applied the file, a warning when the file was there but not applied (or WAFER_TUNE_FILE named a missing
 * one), and on a CPU without built-in rules (cpu_decode_prefetch_measured) and no tune file, that `wafer bench
 * --tune` would measure them. The CPU backend calls it at create,
 * and `wafer bench --stream` before it measures. */
void cpu_tune_load_once(void);

/* Before cpu_tune_load_once's first call: no hint that `wafer bench --tune` would measure the rules (the tuner
 * calls it: it is that measurement). */
void cpu_tune_hint_off(void);

/* "tune file PATH" when a tune file's rules are in force, else "built-in rules"; prefixed with what the
 * environment overrides when it does (cpu_decode_prefetch_env). Valid until the next call. */
const char *cpu_tune_source(void);

/* The rules in force for the types with a decode rule, as "q4_0 nta, q8_0 sparse, q4_k nta, q6_k nta, f16 nta"
 * (NUL-terminated in buf). */
void cpu_tune_describe(char *buf, size_t n);

/* Writes a tune file for this CPU and instruction set to path (its folder made if missing), atomically:
 * rules[t] for each type t with a rule (>= 0; -1: not written), measured with `threads` threads; figures: a
 * JSON object text stored as "figures" (NULL: none). 0, or ERR_IO / ERR_INVALID_ARG with a message in err
 * (ERR_MSG_MAX bytes). */
int cpu_tune_write(const char *path, const int rules[DTYPE_COUNT], int threads, const char *figures, char *err);

#endif
