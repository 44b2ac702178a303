/*
 * fsutil: fs_mkdirs makes every missing folder and leaves existing ones; it names the folder it could not
 * make (a file in the way) and refuses a path too long to hold rather than cutting it; fs_mkdirs_for makes
 * the folder of a file path and does nothing for a bare name.
 */
#include "testutil.h"

#include "core/err.h"
#include "core/fsutil.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static bool is_dir(const char *p)
{
    struct stat st;
    return stat(p, &st) == 0 && S_ISDIR(st.st_mode);
}

static void test_mkdirs(void **state)
{
    (void)state;
    char root[512], p[600], err[ERR_MSG_MAX];
    snprintf(root, sizeof root, "%s", test_tmp_path("fsutil")); /* not made yet: fs_mkdirs makes it */
    snprintf(p, sizeof p, "%s/a/b/c", root);
    assert_int_equal(fs_mkdirs(p, 0755, err), 0);
    assert_true(is_dir(p));
    assert_int_equal(fs_mkdirs(p, 0755, err), 0); /* all there: nothing to do */
    snprintf(p, sizeof p, "%s/d/e/file.json", root);
    mode_t um = umask(022);
    assert_int_equal(fs_mkdirs_for(p, 0700, err), 0);
    umask(um);
    snprintf(p, sizeof p, "%s/d/e", root);
    assert_true(is_dir(p));
    struct stat st;
    assert_int_equal(stat(p, &st), 0);
    assert_int_equal(st.st_mode & 0777, 0700); /* the mode asked for */
    assert_int_equal(fs_mkdirs_for("file.json", 0755, err), 0); /* no folder in the path */
    /* a file where a folder should be: the folder that failed is named */
    snprintf(p, sizeof p, "%s/f", root);
    FILE *f = fopen(p, "w");
    assert_non_null(f);
    fclose(f);
    snprintf(p, sizeof p, "%s/f/g", root);
    assert_int_equal(fs_mkdirs(p, 0755, err), ERR_IO);
    assert_non_null(strstr(err, "cannot create the folder"));
    assert_non_null(strstr(err, "/f/g"));
    /* longer than PATH_MAX: refused, nothing made */
    char *longp = malloc(PATH_MAX + 32);
    assert_non_null(longp);
    memset(longp, 'x', PATH_MAX + 31);
    longp[0] = '/';
    longp[PATH_MAX + 31] = '\0';
    assert_int_equal(fs_mkdirs(longp, 0755, err), ERR_IO);
    assert_non_null(strstr(err, "longer than"));
    assert_int_equal(fs_mkdirs_for(longp, 0755, err), ERR_IO);
    free(longp);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_mkdirs),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
