/*
 * bigmem tests: the mapping is exactly the size asked for, on a 2 MiB boundary, zeroed and writable to its
 * last byte; the slack bigmem_alloc maps for alignment is given back (no leak of address space: mappings
 * before and after are unchanged); a zero size is refused. Whether the kernel backs it with huge pages is
 * the kernel's business (THP settings), so that is reported, not asserted.
 */
#include "testutil.h"

#include "core/bigmem.h"

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Bytes mapped in this process, from /proc/self/maps (0 where it cannot be read). Read with read(2) into a
 * static buffer: stdio would allocate, and under ASan an allocation can map memory of its own. */
static size_t mapped_bytes(void)
{
    static char buf[1 << 20];
    int fd = open("/proc/self/maps", O_RDONLY);
    if (fd < 0)
        return 0;
    size_t len = 0;
    ssize_t got;
    while (len < sizeof buf - 1 && (got = read(fd, buf + len, sizeof buf - 1 - len)) > 0)
        len += (size_t)got;
    close(fd);
    if (len == sizeof buf - 1)
        return 0; /* truncated: no figure */
    buf[len] = 0;
    size_t total = 0;
    for (char *line = buf; *line; ) {
        char *end;
        unsigned long a = strtoul(line, &end, 16), b = *end == '-' ? strtoul(end + 1, NULL, 16) : a;
        total += b - a;
        char *nl = strchr(line, '\n');
        if (!nl)
            break;
        line = nl + 1;
    }
    return total;
}

static void test_alloc_aligned_zeroed(void **state)
{
    (void)state;
    const size_t sizes[] = {1, 4095, 4096, (2u << 20) - 1, (5u << 20) + 12345};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        size_t before = mapped_bytes();
        uint8_t *p = bigmem_alloc(sizes[i]);
        assert_non_null(p);
        assert_int_equal((uintptr_t)p % (2u << 20), 0);
        size_t during = mapped_bytes();
        /* only the size asked for (rounded to pages) stays mapped, not the alignment slack */
        if (before && during)
            assert_true(during - before <= (sizes[i] + 4095) / 4096 * 4096);
        for (size_t j = 0; j < sizes[i]; j += 4096)
            assert_int_equal(p[j], 0);
        assert_int_equal(p[sizes[i] - 1], 0);
        memset(p, 0xab, sizes[i]);
        bigmem_free(p, sizes[i]);
        if (before)
            assert_int_equal(mapped_bytes(), before);
    }
    bigmem_free(NULL, 123); /* ignored */
}

static void test_alloc_zero_refused(void **state)
{
    (void)state;
    errno = 0;
    assert_null(bigmem_alloc(0));
    assert_int_equal(errno, EINVAL);
    assert_null(bigmem_alloc(SIZE_MAX));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_alloc_aligned_zeroed),
        cmocka_unit_test(test_alloc_zero_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
