/*
 * backend: the registry of backends by name (backend.h). Adding a backend is one line here and one folder
 * beside cpu/ and scalar/; the engine, the scheduler and the server are unchanged.
 */
#include "engine/backend.h"

#include "engine/cpu/cpu_backend.h"
#include "engine/scalar/scalar_backend.h"

#include <stdio.h>
#include <string.h>

static const struct backend_ops *const backend_registry[] = {&cpu_backend_ops, &scalar_backend_ops};
#define BACKEND_COUNT (sizeof backend_registry / sizeof backend_registry[0])

const struct backend_ops *backend_find(const char *name)
{
    if (!name)
        return backend_registry[0];
    for (size_t i = 0; i < BACKEND_COUNT; i++)
        if (strcmp(backend_registry[i]->name, name) == 0)
            return backend_registry[i];
    return NULL;
}

const char *backend_names(char *buf, size_t cap)
{
    size_t n = 0;
    buf[0] = '\0';
    for (size_t i = 0; i < BACKEND_COUNT && n < cap; i++)
        n += (size_t)snprintf(buf + n, cap - n, "%s%s", i ? ", " : "", backend_registry[i]->name);
    return buf;
}
