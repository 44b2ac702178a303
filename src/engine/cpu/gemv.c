/*
 * gemv: the choice among the gemv kernel sets (gemv.h) for the running CPU. It lives apart from the kernel
 * files so that they only define kernels and never call each other to be chosen.
 */
#include "engine/cpu/gemv.h"

const struct gemv_ops *gemv_ops_best(enum dtype t)
{
    const struct gemv_ops *g = gemv_ops_avx512q(t);
    if (!g)
        g = gemv_ops_avx512k(t);
    if (!g)
        g = gemv_ops_avx2_vnni(t);
    return g ? g : gemv_ops_avx2(t);
}
