/*
 * route_policy: hashing, splits and backoff (see route_policy.h).
 *
 * Sticky split by weighted rendezvous hashing: each pool draws u = hash(key, pool) in (0, 1) and scores
 * -ln(u) / weight (an exponential variable with rate = weight); the smallest score wins. The minimum of
 * independent exponentials is pool i with probability w_i / sum(w), and since each pool's score depends
 * only on the key, its own name and its own weight, a weight change moves only the keys whose winner
 * changes to or from that pool: consistent hashing with weights, no ring to rebuild.
 */
#include "route/route_policy.h"

#include <math.h>

static uint64_t mix64(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

uint64_t route_hash64(const void *data, size_t len, uint64_t seed)
{
    const unsigned char *p = data;
    uint64_t h = 0xcbf29ce484222325ULL ^ mix64(seed + 0x9e3779b97f4a7c15ULL);
    for (size_t i = 0; i < len; i++) {
        h ^= p[i];
        h *= 0x100000001b3ULL;
    }
    return mix64(h ^ len);
}

int route_pick_sticky(const char *key, size_t key_len, const char *const *names, const double *weights, int n)
{
    int best = -1;
    double best_score = 0;
    uint64_t kh = route_hash64(key, key_len, 0);
    for (int i = 0; i < n; i++) {
        if (!(weights[i] > 0))
            continue;
        size_t nl = 0;
        while (names[i][nl])
            nl++;
        uint64_t h = route_hash64(names[i], nl, kh);
        /* 53 random bits into (0, 1): never 0, so the log is finite */
        double u = ((double)(h >> 11) + 0.5) / 9007199254740992.0;
        double score = -log(u) / weights[i];
        if (best < 0 || score < best_score) {
            best = i;
            best_score = score;
        }
    }
    return best;
}

int route_pick_swrr(int64_t *current, const double *weights, int n)
{
    int64_t total = 0;
    int best = -1;
    for (int i = 0; i < n; i++) {
        int64_t w = weights[i] > 0 ? (int64_t)llround(weights[i] * 1000.0) : 0;
        if (w <= 0)
            continue;
        current[i] += w;
        total += w;
        if (best < 0 || current[i] > current[best])
            best = i;
    }
    if (best >= 0)
        current[best] -= total;
    return best;
}

uint64_t route_rand(uint64_t *state)
{
    *state += 0x9e3779b97f4a7c15ULL;
    return mix64(*state);
}

int64_t route_backoff_ms(int attempt, int base_ms, int cap_ms, uint64_t *rng)
{
    if (attempt < 0)
        attempt = 0;
    double ceiling = (double)base_ms * ldexp(1.0, attempt > 60 ? 60 : attempt);
    if (ceiling > cap_ms)
        ceiling = cap_ms;
    if (ceiling <= 0)
        return 0;
    double u = (double)(route_rand(rng) >> 11) / 9007199254740992.0; /* [0, 1) */
    return (int64_t)(u * (ceiling + 1.0)); /* integer ms in [0, ceiling] */
}

int64_t route_cooldown_ms(int n, double base_s, double max_s)
{
    if (n < 1)
        n = 1;
    double s = base_s * ldexp(1.0, n - 1 > 40 ? 40 : n - 1);
    if (s > max_s)
        s = max_s;
    return (int64_t)(s * 1000.0);
}
