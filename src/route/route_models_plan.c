/*
 * route_models_plan: the eviction choice of the model manager, kept pure (no processes, no clock) so that
 * it is unit-tested on its own. Least recently used idle residents go first; a busy model (loading, or with
 * requests in flight or waiting) is never chosen, and when only busy models stand in the way nothing is
 * chosen at all: unloading an idle model that does not make room would only cost its next request a load.
 */
#include "route/route_models.h"

#include "core/err.h"

int route_models_plan_evict(const struct route_models_slot *s, int n, int want, int64_t budget, int max_loaded,
                            int *evict, int *n_evict)
{
    *n_evict = 0;
    if (budget > 0 && s[want].bytes > budget)
        return ERR_TOO_LARGE;
    int64_t used = 0;
    int count = 0;
    for (int i = 0; i < n; i++)
        if (i != want && s[i].resident) {
            used += s[i].bytes;
            count++;
        }
    int k = 0;
    for (;;) {
        bool fits = (budget <= 0 || used + s[want].bytes <= budget) && (max_loaded <= 0 || count + 1 <= max_loaded);
        if (fits) {
            *n_evict = k;
            return 0;
        }
        int pick = -1;
        for (int i = 0; i < n; i++) {
            if (i == want || !s[i].resident || s[i].busy)
                continue;
            bool taken = false;
            for (int j = 0; j < k; j++)
                taken |= evict[j] == i;
            if (!taken && (pick < 0 || s[i].last_used < s[pick].last_used))
                pick = i;
        }
        if (pick < 0)
            return ERR_UNAVAILABLE;
        evict[k++] = pick;
        used -= s[pick].bytes;
        count--;
    }
}
