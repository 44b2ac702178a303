/*
 * budget: a byte budget shared by threads, for memory the server holds on behalf of requests (bodies being
 * read, answers being built). A request takes its bytes before the memory is allocated and gives them back
 * when it is freed; a take that would pass the limit fails and changes nothing, so the caller can refuse the
 * request (503 with Retry-After) instead of growing without bound. Lock-free: one atomic counter.
 */
#ifndef WAFER_CORE_BUDGET_H
#define WAFER_CORE_BUDGET_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

struct budget {
    _Atomic int64_t used;
    int64_t limit; /* bytes; <= 0: no limit (takes always succeed, and are still counted) */
};

/* limit in bytes (<= 0: none). */
void budget_init(struct budget *b, int64_t limit);

/* Takes n bytes (n >= 0) if used + n stays within the limit; true when taken. Any thread. */
bool budget_take(struct budget *b, int64_t n);

/* Gives back n bytes taken earlier. Any thread. */
void budget_give(struct budget *b, int64_t n);

/* Bytes taken now. */
int64_t budget_used(const struct budget *b);

#endif
