/*
 * batch: a growable-once array of batch tokens (capacity fixed at init so the engine's scratch, sized for
 * the largest batch, can never be overrun).
 */
#include "engine/batch.h"

#include "core/err.h"

#include <stdlib.h>

int batch_init(struct batch *b, int cap)
{
    b->tok = calloc((size_t)(cap > 0 ? cap : 1), sizeof *b->tok);
    b->n = 0;
    b->cap = b->tok ? cap : 0;
    return b->tok ? 0 : ERR_NOMEM;
}

void batch_deinit(struct batch *b)
{
    free(b->tok);
    b->tok = NULL;
    b->n = b->cap = 0;
}

int batch_add(struct batch *b, int32_t token, int32_t pos, int32_t seq, bool logits)
{
    if (b->n >= b->cap)
        return ERR_NO_SPACE;
    b->tok[b->n++] = (struct batch_token){token, pos, seq, logits};
    return 0;
}
