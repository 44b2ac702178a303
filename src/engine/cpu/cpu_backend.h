/*
 * cpu_backend: the "cpu" backend (see backend.h and cpu_backend.c): the forward pass on this machine's
 * CPUs with the best kernels it has (AVX-512, AVX2, or the portable scalar ones when
 * engine_params.force_scalar), a thread pool, and KV blocks in host memory.
 */
#ifndef WAFER_ENGINE_CPU_BACKEND_H
#define WAFER_ENGINE_CPU_BACKEND_H

struct backend_ops;

extern const struct backend_ops cpu_backend_ops;

#endif
