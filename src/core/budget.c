/*
 * budget: a compare-and-swap loop, so concurrent takes never overshoot the limit together (two takes that
 * would each fit alone but not both: exactly one of them succeeds).
 */
#include "core/budget.h"

void budget_init(struct budget *b, int64_t limit)
{
    atomic_init(&b->used, 0);
    b->limit = limit;
}

bool budget_take(struct budget *b, int64_t n)
{
    if (n <= 0)
        return true;
    int64_t cur = atomic_load(&b->used);
    do {
        if (b->limit > 0 && (n > b->limit || cur > b->limit - n))
            return false;
    } while (!atomic_compare_exchange_weak(&b->used, &cur, cur + n));
    return true;
}

void budget_give(struct budget *b, int64_t n)
{
    if (n > 0)
        atomic_fetch_sub(&b->used, n);
}

int64_t budget_used(const struct budget *b) { return atomic_load(&((struct budget *)b)->used); }
