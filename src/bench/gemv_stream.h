/*
 * gemv_stream: how close the decode kernels come to a plain read of the same bytes (`wafer bench --stream`).
 *
 * Decode reads every weight once per token, so its ceiling is the machine's read bandwidth; `wafer bench`
 * compares a model's generation with the membw probe, but that mixes the kernels with everything else a
 * token does. This measures the kernels alone, the way decode runs them: the matrices of a llama model's
 * layers (by default the 1B shapes of docs/performance.md: dim 2048, FFN 8192, KV 512, 16 layers) in the
 * layout and kernel the engine picks for the type (gemv_ops_best; R16 groups where it has them), one
 * activation row, the engine's thread pool, each thread one contiguous share of each matrix and a barrier
 * after each. Passes of the kernel alternate with passes of a plain read (membw_read) of the same bytes
 * split the same way, so both see the same minute of a machine whose bandwidth moves; the figure that
 * counts is the median over adjacent pairs of read time / kernel time.
 *
 * With a batch of B columns it runs the gemm batched decode runs instead (B sequences, one token each): the
 * weights still come from memory once per pass, but each byte now feeds B columns' arithmetic, so the
 * question becomes whether the arithmetic hides the read (kernels / read near the arithmetic's own limit)
 * or adds to it. A third kind of pass answers it: the same arithmetic on weights that stay in each core's L2
 * (cache_gmacs), so kernel_gmacs / cache_gmacs is what memory costs the kernels (on the Zen 5, 8 columns of
 * Q4_K / Q6_K lost 24-42% to it, Q4_0 4-24%; docs/performance.md, stop 41).
 */
#ifndef WAFER_BENCH_GEMV_STREAM_H
#define WAFER_BENCH_GEMV_STREAM_H

#include "engine/dtype.h"

#include <stddef.h>

/* The most decode prefetch rules one run measures: every rule a type's kernels have (cpu_features.h: Q4_K has 5
 * with AVX-512, F16 4). */
#define GEMV_STREAM_MAX_RULES 5

struct gemv_stream_opts {
    enum dtype type;       /* weight type: F16, Q8_0, Q4_0, Q4_K or Q6_K (one with a gemv kernel here) */
    int n_threads;         /* <= 0: one per CPU */
    int passes;            /* passes of each of the two, alternated (<= 0: 20; at most 10000) */
    int dim, ffn, kv_dim;  /* model shapes: positive multiples of 256 (the defaults: the 1B model's) */
    int layers;            /* 1-1024 (default 16) */
    int batch;             /* activation columns: 1 (default) the decode gemv; 2-64 the gemm that batched
                            * decode runs (B sequences, one token each), on B different columns */
    /* With n_rules > 0 (batch 1 only): instead of the kernel and from-cache passes, one kernel pass under each
     * of these decode prefetch rules (cpu_features.h: cpu_decode_prefetch_candidates of the type), in this
     * order after each read pass, the rule set for the type before each (cpu_decode_prefetch_set) and the type's
     * tuned rule put back at the end: `wafer bench --tune`. The environment's overrides must be unset. */
    int n_rules;
    int rules[GEMV_STREAM_MAX_RULES];
};

struct gemv_stream_result {
    size_t bytes;          /* weight bytes per pass */
    int passes, threads;
    const char *layout;    /* "R16" or "rows" */
    double read_gbs;       /* median over the plain-read passes, GB/s */
    double kernel_gbs;     /* median over the kernel passes */
    double share;          /* median over adjacent (read, kernel) pairs of read time / kernel time */
    double share_lo, share_hi; /* lowest and highest pair */
    double kernel_gmacs;   /* multiply-adds per second of the kernel passes (median), in billions */
    double macs;           /* multiply-adds a kernel pass does (every matrix, every column) */
    /* The same arithmetic with the weights in cache: passes that run the kernel over as many rows of each
     * shape as the kernel passes, taken again and again from a slice of cache_kib KiB per thread and shape
     * that stays in L2 (medians). Against kernel_gmacs it says what reading from memory costs the kernels
     * beyond their arithmetic: with B columns the question is whether the arithmetic hides the read. */
    double cache_gbs;      /* weight bytes the kernels went through per second (what they would read) */
    double cache_gmacs;
    double cache_macs;     /* multiply-adds the last from-cache pass's kernel calls did: macs when all ran */
    int cache_kib;
    /* With rules (gemv_stream_opts n_rules), per rule i in that order: the median GB/s of its passes, and the
     * median over the rounds of the first rule's pass time / rule i's (above 1: rule i read faster than the
     * first in the same minutes); kernel_gbs and share are then the first rule's. */
    double rule_gbs[GEMV_STREAM_MAX_RULES];
    double rule_vs_first[GEMV_STREAM_MAX_RULES];
    /* batch 1 without rules: the decode prefetch rule the kernel passes ran under ("nta", ...; cpu_features.h)
     * and where it came from ("built-in rules", "tune file PATH"); "" otherwise */
    char decode_prefetch[16];
    char decode_prefetch_source[640];
};

/* Fills o with the defaults for type t. */
void gemv_stream_opts_default(struct gemv_stream_opts *o, enum dtype t);

/* Runs the measurement. 0, or ERR_UNSUPPORTED (no decode kernel for the type on this CPU), ERR_INVALID_ARG
 * (bad shapes or counts) or ERR_NOMEM, with a message in err. Needs the weights of every layer in memory
 * (about 600 MB for the 1B Q4_0 shapes). */
int gemv_stream_run(const struct gemv_stream_opts *o, struct gemv_stream_result *out, char *err);

#endif
