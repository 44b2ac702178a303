/*
 * scalar_backend: the "scalar" backend (see backend.h and scalar_backend.c): a plain, single-threaded
 * reference forward pass, one token at a time, with the portable scalar kernels and KV blocks in host
 * memory. It proves the backend seam and is what the CPU backend is checked against.
 */
#ifndef WAFER_ENGINE_SCALAR_BACKEND_H
#define WAFER_ENGINE_SCALAR_BACKEND_H

struct backend_ops;

extern const struct backend_ops scalar_backend_ops;

#endif
