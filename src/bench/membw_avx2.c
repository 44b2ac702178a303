/*
 * membw_avx2: the probe's read loop with 256-bit loads (compiled with -mavx2; called only when the CPU has
 * AVX2). Four independent XOR chains keep loads in flight; XOR is lane-wise, so folding the lanes at the
 * end gives the same checksum as the scalar loop's XOR of 64-bit words.
 */
#include "bench/membw.h"

#include <immintrin.h>

uint64_t membw_read_avx2(const void *p, size_t n)
{
    const __m256i *v = p;
    __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
    for (size_t i = 0; i < n / 32; i += 4) {
        a0 = _mm256_xor_si256(a0, _mm256_load_si256(v + i));
        a1 = _mm256_xor_si256(a1, _mm256_load_si256(v + i + 1));
        a2 = _mm256_xor_si256(a2, _mm256_load_si256(v + i + 2));
        a3 = _mm256_xor_si256(a3, _mm256_load_si256(v + i + 3));
    }
    __m256i a = _mm256_xor_si256(_mm256_xor_si256(a0, a1), _mm256_xor_si256(a2, a3));
    __m128i h = _mm_xor_si128(_mm256_castsi256_si128(a), _mm256_extracti128_si256(a, 1));
    return (uint64_t)_mm_cvtsi128_si64(h) ^ (uint64_t)_mm_extract_epi64(h, 1);
}
