/*
 * cpu_features: cpuid (leaf 1 for F16C, leaf 7 for AVX2/AVX512/AVX-VNNI) and xgetbv (the OS saves the wider
 * register state), each asked once.
 */
#include "engine/cpu/cpu_features.h"

#include <cpuid.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

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

bool kernel_cpu_has_avx_vnni(void)
{
    static int has = -1;
    if (has < 0) {
        unsigned a = 0, b = 0, c = 0, d = 0;
        const char *off = getenv("WAFER_NO_VNNI");
        /* leaf 7 subleaf 1: eax bit 4; the ymm state is the one AVX2 already needs */
        has = !(off && *off && strcmp(off, "0") != 0) && __get_cpuid_count(7, 1, &a, &b, &c, &d) && ((a >> 4) & 1);
    }
    return has && kernel_cpu_has_avx2(); /* WAFER_NO_SIMD, read every call as there */
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

/* cpuid leaf 1's eax (stepping, model, family and their extensions), asked once; 0 when there is no leaf 1. */
static unsigned cpu_signature(void)
{
    static _Atomic long long sig = -1;
    long long v = atomic_load_explicit(&sig, memory_order_relaxed);
    if (v < 0) {
        unsigned a = 0, b = 0, c = 0, d = 0;
        v = __get_cpuid(1, &a, &b, &c, &d) ? (long long)a : 0;
        atomic_store_explicit(&sig, v, memory_order_relaxed);
    }
    return (unsigned)v;
}

unsigned cpu_family(void)
{
    unsigned a = cpu_signature(), fam = (a >> 8) & 0xf;
    return fam == 0xf ? fam + ((a >> 20) & 0xff) : fam;
}

/* AMD family 0x19 (Zen 3, Zen 4) or 0x1a (Zen 5). */
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

static const char *const cpu_prefetch_names[CPU_PREFETCH_COUNT] = {"every", "nta",    "sparse", "rows",
                                                                            "none",  "spread", "twin"};

const char *cpu_prefetch_name(int rule)
{
    return rule >= 0 && rule < CPU_PREFETCH_COUNT ? cpu_prefetch_names[rule] : "?";
}

int cpu_prefetch_parse(const char *s)
{
    for (int r = 0; s && r < CPU_PREFETCH_COUNT; r++)
        if (!strcmp(s, cpu_prefetch_names[r]))
            return r;
    return -1;
}

const enum dtype cpu_decode_prefetch_types[CPU_PREFETCH_N_TYPES] = {DTYPE_Q4_0, DTYPE_Q8_0, DTYPE_Q4_K, DTYPE_Q6_K,
                                                                   DTYPE_F16};

static bool cpu_prefetch_type(enum dtype t)
{
    for (int i = 0; i < CPU_PREFETCH_N_TYPES; i++)
        if (cpu_decode_prefetch_types[i] == t)
            return true;
    return false;
}

/* The x86 display model (cpuid leaf 1: base model, plus the extended model above it on families 6 and 15). */
static unsigned cpu_model(void)
{
    unsigned a = cpu_signature(), model = (a >> 4) & 0xf;
    return cpu_family() == 6 || cpu_family() >= 0xf ? model | ((a >> 12) & 0xf0) : model;
}

/* AMD family 0x19 without AVX-512 in cpuid (whatever WAFER_NO_AVX512 says): Zen 3. Every Zen 4 has AVX-512 F,
 * no Zen 3 has it, so this tells them apart without a table of model numbers; a Zen 4 running the AVX2 kernels
 * (WAFER_NO_AVX512=1) keeps the Zen 4's rules, which were measured there. */
static bool cpu_is_zen3(void)
{
    static int is = -1;
    if (is < 0) {
        unsigned a = 0, b = 0, c = 0, d = 0;
        is = cpu_is_amd() && cpu_family() == 0x19 && !(__get_cpuid_count(7, 0, &a, &b, &c, &d) && ((b >> 16) & 1));
    }
    return is;
}

/* Intel family 6 model 207 (Emerald Rapids), the Xeon of stop 43. */
static bool cpu_is_intel_207(void)
{
    return !cpu_is_amd() && cpu_family() == 6 && cpu_model() == 207;
}

bool cpu_decode_prefetch_measured(void)
{
    return cpu_is_amd_family_19_or_1a() || cpu_is_intel_207();
}

enum cpu_prefetch cpu_decode_prefetch_builtin(enum dtype t)
{
    if (!cpu_prefetch_type(t))
        return CPU_PREFETCH_EVERY;
    if (!cpu_is_amd()) {
        if (t == DTYPE_Q4_K || t == DTYPE_Q6_K)
            return CPU_PREFETCH_SPREAD;
        return t == DTYPE_Q4_0 ? CPU_PREFETCH_TWIN : CPU_PREFETCH_EVERY;
    }
    if (cpu_is_zen3()) {
        if (t == DTYPE_Q4_0 || t == DTYPE_Q8_0)
            return CPU_PREFETCH_TWIN;
        return t == DTYPE_Q6_K || t == DTYPE_Q4_K ? CPU_PREFETCH_SPREAD : CPU_PREFETCH_NONE;
    }
    if (cpu_family() == 0x19)
        return t == DTYPE_F16 ? CPU_PREFETCH_NONE : CPU_PREFETCH_SPARSE;
    if (cpu_family() == 0x1a) {
        if (t == DTYPE_F16)
            return CPU_PREFETCH_NTA;
        if (!gemv_cpu_has_avx512())
            return CPU_PREFETCH_EVERY;
        return t == DTYPE_Q8_0 ? CPU_PREFETCH_SPARSE : CPU_PREFETCH_NTA;
    }
    return t == DTYPE_F16 ? CPU_PREFETCH_NONE : CPU_PREFETCH_EVERY;
}

int cpu_decode_prefetch_candidates(enum dtype t, enum cpu_prefetch out[CPU_PREFETCH_COUNT])
{
    if (!cpu_prefetch_type(t) || !kernel_cpu_has_avx2())
        return 0;
    enum cpu_prefetch all[CPU_PREFETCH_COUNT];
    int n = 0;
    if (t == DTYPE_F16) /* 4 streams prefetched into L1, with NTA or not at all, or 4 adjacent rows a tile */
        all[n++] = CPU_PREFETCH_EVERY, all[n++] = CPU_PREFETCH_NTA, all[n++] = CPU_PREFETCH_ROWS,
        all[n++] = CPU_PREFETCH_NONE;
    else if (gemv_cpu_has_avx512()) {
        all[n++] = CPU_PREFETCH_EVERY, all[n++] = CPU_PREFETCH_NTA, all[n++] = CPU_PREFETCH_SPARSE;
        if (t == DTYPE_Q4_K || t == DTYPE_Q6_K)
            all[n++] = CPU_PREFETCH_SPREAD;
        if (t != DTYPE_Q6_K)
            all[n++] = CPU_PREFETCH_TWIN;
    }
    else { /* AVX2's gemv16: no NTA; Q4_0 / Q8_0 two groups side by side, the K-quants spread */
        all[n++] = CPU_PREFETCH_EVERY, all[n++] = CPU_PREFETCH_SPARSE;
        all[n++] = t == DTYPE_Q4_0 || t == DTYPE_Q8_0 ? CPU_PREFETCH_TWIN : CPU_PREFETCH_SPREAD;
    }
    enum cpu_prefetch b = cpu_decode_prefetch_builtin(t);
    int k = 0;
    out[k++] = b;
    for (int i = 0; i < n; i++)
        if (all[i] != b)
            out[k++] = all[i];
    return k;
}

bool cpu_decode_prefetch_valid(enum dtype t, int rule)
{
    enum cpu_prefetch c[CPU_PREFETCH_COUNT];
    int k = cpu_decode_prefetch_candidates(t, c);
    for (int i = 0; i < k; i++)
        if ((int)c[i] == rule)
            return true;
    return false;
}

/* tuned rule + 1 per type (0: none), so that the zeroed array means none */
static _Atomic int cpu_tuned[DTYPE_COUNT];

void cpu_decode_prefetch_set(enum dtype t, int rule)
{
    if ((int)t < 0 || t >= DTYPE_COUNT)
        return;
    atomic_store_explicit(&cpu_tuned[t], rule >= 0 && rule < CPU_PREFETCH_COUNT ? rule + 1 : 0, memory_order_relaxed);
}

int cpu_decode_prefetch_tuned(enum dtype t)
{
    if ((int)t < 0 || t >= DTYPE_COUNT)
        return -1;
    return atomic_load_explicit(&cpu_tuned[t], memory_order_relaxed) - 1;
}

/* the environment's overrides, read once: getenv walks the whole environment, and cpu_decode_prefetch is asked
 * per kernel call (-2 before the first read, then cpu_env_choice's answer) */
static int cpu_env_sparse = -2, cpu_env_nta = -2;

static void cpu_env_read(void)
{
    if (cpu_env_sparse == -2) {
        cpu_env_nta = cpu_env_choice("WAFER_PREFETCH_NTA", "1", "0");
        cpu_env_sparse = cpu_env_choice("WAFER_GEMV_PREFETCH", "sparse", "every");
    }
}

bool cpu_decode_prefetch_env(void)
{
    cpu_env_read();
    return cpu_env_sparse >= 0 || cpu_env_nta >= 0;
}

enum cpu_prefetch cpu_decode_prefetch(enum dtype t)
{
    if (!cpu_prefetch_type(t))
        return CPU_PREFETCH_EVERY;
    cpu_env_read();
    int env_sparse = cpu_env_sparse, env_nta = cpu_env_nta, tuned = cpu_decode_prefetch_tuned(t);
    enum cpu_prefetch r = tuned >= 0 ? (enum cpu_prefetch)tuned : cpu_decode_prefetch_builtin(t);
    /* WAFER_GEMV_PREFETCH: sparse or not; where not, NTA as this CPU family's rule for the stream prefetch
     * says (Zen 5), unless WAFER_PREFETCH_NTA says otherwise */
    if (env_sparse == 1 && t != DTYPE_F16)
        return CPU_PREFETCH_SPARSE;
    if (env_sparse == 0 && r == CPU_PREFETCH_SPARSE)
        r = cpu_is_amd() && cpu_family() == 0x1a && gemv_cpu_has_avx512() ? CPU_PREFETCH_NTA : CPU_PREFETCH_EVERY;
    /* F16's streams without NTA are its NONE, as before its EVERY prefetched (stop 43) */
    if (env_nta == 1 &&
        (r == CPU_PREFETCH_EVERY || r == CPU_PREFETCH_SPREAD || r == CPU_PREFETCH_TWIN ||
         (t == DTYPE_F16 && r == CPU_PREFETCH_NONE)))
        r = CPU_PREFETCH_NTA;
    if (env_nta == 0 && r == CPU_PREFETCH_NTA)
        r = t == DTYPE_F16 ? CPU_PREFETCH_NONE : CPU_PREFETCH_EVERY;
    return r;
}

bool cpu_f16_gemm_whole_rows(void)
{
    int e = cpu_env_choice("WAFER_F16_GEMM", "whole", "chunks");
    return e >= 0 ? e : cpu_is_amd_family_19_or_1a() || cpu_is_intel_207();
}

size_t cpu_l1d_bytes(void)
{
    static _Atomic long l1 = -1;
    long v = atomic_load_explicit(&l1, memory_order_relaxed);
    if (v < 0) {
        v = sysconf(_SC_LEVEL1_DCACHE_SIZE);
        if (v <= 0)
            v = 32 << 10;
        atomic_store_explicit(&l1, v, memory_order_relaxed);
    }
    return (size_t)v;
}

bool cpu_f16_gemm_f32_panels(void)
{
    int e = cpu_env_choice("WAFER_F16_F32_PANELS", "1", "0");
    return e >= 0 ? e : cpu_l1d_bytes() >= (48 << 10);
}

bool cpu_kquant_spread_l2(void)
{
    int e = cpu_env_choice("WAFER_SPREAD_HINT", "l2", "l1");
    return e >= 0 ? e : !cpu_is_amd();
}
