/*
 * route_policy: the router's pure decisions, kept apart so they are unit-tested on their own: the hash,
 * the weighted split (sticky by consistent hashing, or an exact smooth weighted round robin), full-jitter
 * exponential backoff and the growing ejection cooldown.
 */
#ifndef WAFER_ROUTE_ROUTE_POLICY_H
#define WAFER_ROUTE_ROUTE_POLICY_H

#include <stddef.h>
#include <stdint.h>

/* 64-bit hash of data (FNV-1a, then a splitmix64 finalizer so nearby inputs spread), seeded. */
uint64_t route_hash64(const void *data, size_t len, uint64_t seed);

/* Sticky split: weighted rendezvous hashing. Pool i wins for key with probability weights[i] / sum, the
 * same key always gets the same pool for the same weights, and changing one pool's weight only moves keys
 * to or from that pool (a user in the canary stays there while the canary grows). names identify the pools
 * (their hash seeds). Returns the index, or -1 when every weight is 0. */
int route_pick_sticky(const char *key, size_t key_len, const char *const *names, const double *weights, int n);

/* Non-sticky split: smooth weighted round robin (nginx's upstream algorithm): over any sum(weights)
 * consecutive picks each pool gets exactly its share, interleaved. current[n] is the caller's state (start
 * at 0). Weights are used to 1/1000. Returns the index, or -1 when every weight is 0. */
int route_pick_swrr(int64_t *current, const double *weights, int n);

/* A uniform 64-bit random number from *state (splitmix64; any seed). */
uint64_t route_rand(uint64_t *state);

/* Full-jitter backoff before retry number attempt (0 for the first retry): uniform in
 * [0, min(cap_ms, base_ms * 2^attempt)]. */
int64_t route_backoff_ms(int attempt, int base_ms, int cap_ms, uint64_t *rng);

/* Ejection cooldown for the n-th consecutive ejection (n >= 1): base * 2^(n-1), at most max. */
int64_t route_cooldown_ms(int n, double base_s, double max_s);

#endif
