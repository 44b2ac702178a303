/* Tests for the RAPL energy meter on a fake powercap tree: package zones summed, subzones and psys left
 * out, a counter wrapping at max_energy_range_uj counted across the wrap, and no meter (with the reason)
 * where there is no zone or it is unreadable. */
#include "testutil.h"

#include "core/energy.h"

#include <math.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static void put(const char *root, const char *zone, const char *file, const char *text)
{
    char p[512];
    snprintf(p, sizeof p, "%s/%s/%s", root, zone, file);
    test_write_file(p, text);
}

static void test_rapl(void **state)
{
    (void)state;
    const char *root = test_tmp_path("powercap");
    mkdir(root, 0755);
    put(root, "intel-rapl:0", "name", "package-0\n");
    put(root, "intel-rapl:0", "energy_uj", "1000000\n");
    put(root, "intel-rapl:0", "max_energy_range_uj", "5000000\n");
    put(root, "intel-rapl:1", "name", "package-1\n");
    put(root, "intel-rapl:1", "energy_uj", "0\n");
    put(root, "intel-rapl:1", "max_energy_range_uj", "5000000\n");
    put(root, "intel-rapl:0:0", "name", "core\n"); /* a part of package 0: not counted twice */
    put(root, "intel-rapl:0:0", "energy_uj", "777\n");
    put(root, "intel-rapl:2", "name", "psys\n");   /* overlaps the packages */
    put(root, "intel-rapl:2", "energy_uj", "123\n");
    char why[128] = "";
    struct energy_meter *m = energy_meter_create(root, why);
    assert_non_null(m);
    assert_int_equal(energy_meter_zones(m), 2);
    assert_true(energy_meter_read(m) == 0);
    put(root, "intel-rapl:0", "energy_uj", "3000000\n"); /* +2 J */
    put(root, "intel-rapl:1", "energy_uj", "500000\n");  /* +0.5 J */
    assert_true(fabs(energy_meter_read(m) - 2.5) < 1e-9);
    put(root, "intel-rapl:0", "energy_uj", "1000000\n"); /* wrapped: 3 -> 5 (max) -> 1: +3 J */
    assert_true(fabs(energy_meter_read(m) - 5.5) < 1e-9);
    energy_meter_destroy(m);

    const char *empty = test_tmp_path("nopowercap");
    mkdir(empty, 0755);
    assert_null(energy_meter_create(empty, why));
    assert_non_null(strstr(why, "no RAPL package zone"));
    assert_null(energy_meter_create("/nonexistent/powercap", why));
    assert_non_null(strstr(why, "/nonexistent/powercap"));
    if (geteuid() != 0) { /* root reads anything */
        const char *locked = test_tmp_path("lockedpowercap");
        mkdir(locked, 0755);
        put(locked, "intel-rapl:0", "energy_uj", "1\n");
        char p[512];
        snprintf(p, sizeof p, "%s/intel-rapl:0/energy_uj", locked);
        chmod(p, 0);
        assert_null(energy_meter_create(locked, why));
        assert_non_null(strstr(why, "not readable"));
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_rapl)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
