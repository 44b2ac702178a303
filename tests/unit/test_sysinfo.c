/*
 * test_sysinfo: the CPU label every benchmark figure carries (core/sysinfo.h): the family, model and AMD
 * generation that tell Zen 3, 4 and 5 apart where a VM shows a bare "AMD EPYC", and the live machine's label.
 */
#include "core/sysinfo.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

static void check(const char *name, const char *vendor, int family, int model, const char *want)
{
    char buf[128];
    sysinfo_cpu_label(name, vendor, family, model, buf, sizeof buf);
    assert_string_equal(buf, want);
}

static void test_label(void **state)
{
    (void)state;
    check("AMD EPYC", "AuthenticAMD", 25, 17, "AMD EPYC (family 25 model 17, Zen 4)");
    check("AMD EPYC", "AuthenticAMD", 25, 1, "AMD EPYC (family 25 model 1, Zen 3)");
    check("AMD EPYC", "AuthenticAMD", 25, 0x61, "AMD EPYC (family 25 model 97, Zen 4)");
    check("AMD EPYC", "AuthenticAMD", 25, 0xa0, "AMD EPYC (family 25 model 160, Zen 4)");
    check("AMD EPYC", "AuthenticAMD", 26, 2, "AMD EPYC (family 26 model 2, Zen 5)");
    check("AMD EPYC 7B12", "AuthenticAMD", 23, 49, "AMD EPYC 7B12 (family 23 model 49, Zen/Zen 2)");
    check("AMD Opteron", "AuthenticAMD", 21, 2, "AMD Opteron (family 21 model 2)");
    /* Intel's family 6 says nothing about the generation here: no name guessed */
    check("Intel(R) Xeon(R) Platinum 8488C", "GenuineIntel", 6, 143,
          "Intel(R) Xeon(R) Platinum 8488C (family 6 model 143)");
    /* the generation is AMD's numbering only */
    check("Some CPU", "GenuineIntel", 25, 17, "Some CPU (family 25 model 17)");
    check("Some CPU", NULL, 26, 2, "Some CPU (family 26 model 2)");
    /* unknown parts */
    check("AMD EPYC", "AuthenticAMD", -1, 17, "AMD EPYC");
    check("", "AuthenticAMD", 25, 17, "unknown CPU");
    check(NULL, NULL, -1, -1, "unknown CPU");
}

static void test_truncation(void **state)
{
    (void)state;
    char buf[12];
    memset(buf, 'x', sizeof buf);
    sysinfo_cpu_label("AMD EPYC", "AuthenticAMD", 25, 17, buf, sizeof buf);
    assert_string_equal(buf, "AMD EPYC (f");
    char one[1] = {'x'};
    sysinfo_cpu_label("AMD EPYC", "AuthenticAMD", 25, 17, one, sizeof one);
    assert_int_equal(one[0], 0);
    sysinfo_cpu_label("AMD EPYC", "AuthenticAMD", 25, 17, one, 0); /* n 0: nothing written */
    assert_int_equal(one[0], 0);
}

/* This machine: a label that is not empty and, where /proc/cpuinfo says the family, carries it. */
static void test_this_machine(void **state)
{
    (void)state;
    char buf[256];
    sysinfo_cpu_name(buf, sizeof buf);
    assert_true(buf[0] != 0);
    char flags[256];
    sysinfo_cpu_flags(flags, sizeof flags);
    if (strstr(flags, "avx2")) { /* an x86 Linux: /proc/cpuinfo has the family and model, both numbers (a
                                  * "model" read off the "model name" line would give none) */
        const char *p = strstr(buf, "(family ");
        assert_non_null(p);
        int family = -1, model = -1;
        assert_int_equal(sscanf(p, "(family %d model %d", &family, &model), 2);
        assert_true(family > 0 && model >= 0);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_label),
        cmocka_unit_test(test_truncation),
        cmocka_unit_test(test_this_machine),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
