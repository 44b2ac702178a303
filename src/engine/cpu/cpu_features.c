/*
 * cpu_features: cpuid (leaf 1 for F16C, leaf 7 for AVX2/AVX512) and xgetbv (the OS saves the wider
 * register state), each asked once.
 */
#include "engine/cpu/cpu_features.h"

#include <cpuid.h>
#include <stdlib.h>
#include <string.h>

bool kernel_cpu_has_avx2(void)
{
    const char *e = getenv("WAFER_NO_SIMD");
    if (e && *e && strcmp(e, "0") != 0)
        return false;
    /* cpuid once: in a virtual machine it traps to the hypervisor (microseconds), and kernels are looked up on
     * hot paths (attention per call). The environment is read every time so tests can toggle it. */
    static int has = -1;
    if (has < 0) {
        __builtin_cpu_init();
        unsigned a, b, c, d;
        /* avx2/fma also cover the OS saving ymm state; F16C by cpuid (leaf 1, ecx bit 29): clang's
         * __builtin_cpu_supports does not know "f16c" */
        has = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __get_cpuid(1, &a, &b, &c, &d) &&
              (c & (1u << 29));
    }
    return has;
}

bool gemv_cpu_has_avx512(void)
{
    static int has = -1;
    if (has < 0) {
        unsigned a = 0, b = 0, c = 0, d = 0;
        const char *off = getenv("WAFER_NO_AVX512");
        has = 0;
        if (kernel_cpu_has_avx2() && !(off && *off && strcmp(off, "0") != 0) && __get_cpuid_count(7, 0, &a, &b, &c, &d)) {
            bool cpu = ((b >> 16) & 1) && ((b >> 17) & 1) && ((b >> 30) & 1) && ((b >> 31) & 1) && ((c >> 11) & 1);
            /* the OS must save the opmask and zmm state (XCR0 bits 5-7) besides ymm (bits 1-2) */
            unsigned lo = 0, hi = 0;
            if (cpu) {
                __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
                has = (lo & 0xe6) == 0xe6;
            }
        }
    }
    return has;
}

bool cpu_is_amd(void)
{
    static int is = -1;
    if (is < 0) {
        unsigned a = 0, b = 0, c = 0, d = 0;
        /* leaf 0: the vendor string in ebx, edx, ecx ("Auth" "enti" "cAMD") */
        is = __get_cpuid(0, &a, &b, &c, &d) && b == 0x68747541u && d == 0x69746e65u && c == 0x444d4163u;
    }
    return is;
}

unsigned cpu_family(void)
{
    static int fam = -1;
    if (fam < 0) {
        unsigned a = 0, b = 0, c = 0, d = 0;
        fam = 0;
        if (__get_cpuid(1, &a, &b, &c, &d)) {
            fam = (int)((a >> 8) & 0xf);
            if (fam == 0xf)
                fam += (int)((a >> 20) & 0xff);
        }
    }
    return (unsigned)fam;
}

/* AMD family 0x19 (Zen 3, Zen 4): where most per-CPU decisions below were measured (on a Zen 4); 0x1a is Zen 5. */
static bool cpu_is_amd_family_19(void) { return cpu_is_amd() && cpu_family() == 0x19; }
static bool cpu_is_amd_family_19_or_1a(void)
{
    return cpu_is_amd() && (cpu_family() == 0x19 || cpu_family() == 0x1a);
}

/* 1 when the environment variable name is `yes`, 0 when it is `no`, -1 otherwise (unset, empty or anything
 * else: the CPU's rule decides). */
static int cpu_env_choice(const char *name, const char *yes, const char *no)
{
    const char *e = getenv(name);
    if (!e)
        return -1;
    return strcmp(e, yes) == 0 ? 1 : strcmp(e, no) == 0 ? 0 : -1;
}

/* A gemv16 prefetch rule: WAFER_GEMV_PREFETCH when set, else the CPU's, asked once into *cached (-1 before). */
static bool cpu_prefetch_rule(int *cached, bool (*cpu_rule)(void))
{
    if (*cached < 0) {
        int e = cpu_env_choice("WAFER_GEMV_PREFETCH", "sparse", "every");
        *cached = e >= 0 ? e : cpu_rule();
    }
    return *cached;
}

bool cpu_gemv16_sparse_prefetch(void)
{
    static int sparse = -1;
    return cpu_prefetch_rule(&sparse, cpu_is_amd_family_19);
}

bool cpu_q8_0_gemv16_sparse_prefetch(void)
{
    static int sparse = -1;
    return cpu_prefetch_rule(&sparse, cpu_is_amd_family_19_or_1a);
}

static bool cpu_is_amd_family_1a(void) { return cpu_is_amd() && cpu_family() == 0x1a; }

bool cpu_prefetch_nta(void)
{
    static int nta = -1;
    if (nta < 0) {
        int e = cpu_env_choice("WAFER_PREFETCH_NTA", "1", "0");
        nta = e >= 0 ? e : cpu_is_amd_family_1a();
    }
    return nta;
}

bool cpu_f16_gemm_whole_rows(void)
{
    int e = cpu_env_choice("WAFER_F16_GEMM", "whole", "chunks");
    return e >= 0 ? e : cpu_is_amd_family_19_or_1a();
}
