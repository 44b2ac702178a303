/*
 * gemv_avx512k: AVX-512 kernels for F16 weights x F16 activations, Q4_K and Q6_K weights x Q8_K activations (see gemv.h): decode gemv and
 * prefill / batched-decode gemm, bit-identical to kernel_ops vec_dot on AVX2.
 * Handed out only when gemv_cpu_has_avx512() says the CPU has AVX-512 (with VNNI). Not written yet: no types.
 */
#include "engine/gemv.h"

#include <stddef.h>

const struct gemv_ops *gemv_ops_avx512k(enum dtype t)
{
    (void)t;
    return NULL;
}
