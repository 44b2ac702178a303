/*
 * cpu_tune: reading, checking and writing the tune file (cpu_tune.h). Loading is all or nothing: a file that
 * names a type or rule this build does not know, or a rule the type's kernels do not implement here, sets
 * nothing, so a process never runs half of a measurement. The source string is written once before the rules
 * are published and only read afterwards (cpu_tune_load_once runs before any kernel, under a pthread_once).
 */
#include "engine/cpu/cpu_tune.h"

#include "core/err.h"
#include "core/fsutil.h"
#include "core/log.h"
#include "core/sysinfo.h"
#include "core/version.h"
#include "engine/cpu/cpu_features.h"

#include <errno.h>
#include <jansson.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static char cpu_tune_src[600] = "built-in rules";

bool cpu_tune_path(char *buf, size_t n)
{
    const char *e = getenv("WAFER_TUNE_FILE"), *x = getenv("XDG_CACHE_HOME"), *h = getenv("HOME");
    int w;
    if (e)
        w = snprintf(buf, n, "%s", e);
    else if (x && *x)
        w = snprintf(buf, n, "%s/wafer/tune.json", x);
    else if (h && *h)
        w = snprintf(buf, n, "%s/.cache/wafer/tune.json", h);
    else
        w = snprintf(buf, n, "%s", "");
    if (w < 0 || (size_t)w >= n) {
        if (n)
            buf[0] = '\0';
        return false;
    }
    return buf[0] != '\0';
}

const char *cpu_tune_isa(void)
{
    if (gemv_cpu_has_avx512())
        return "avx512";
    return kernel_cpu_has_avx_vnni() ? "avx-vnni" : kernel_cpu_has_avx2() ? "avx2" : "scalar";
}

int cpu_tune_apply_file(const char *path, char *msg)
{
    json_error_t je;
    if (access(path, F_OK) != 0) {
        err_set(msg, 0, "no tune file at %s", path);
        return 0;
    }
    if (access(path, R_OK) != 0)
        return err_set(msg, ERR_IO, "cannot read the tune file %s: %s", path, strerror(errno));
    json_t *j = json_load_file(path, 0, &je);
    if (!j)
        return err_set(msg, ERR_FORMAT, "tune file %s is not JSON: %s (line %d); run `wafer bench --tune` again",
                       path, je.text, je.line);
    int rc = ERR_FORMAT, rules[DTYPE_COUNT];
    for (int t = 0; t < DTYPE_COUNT; t++)
        rules[t] = -1;
    char cpu[256];
    sysinfo_cpu_name(cpu, sizeof cpu);
    json_t *ver = json_object_get(j, "version"), *jc = json_object_get(j, "cpu"), *ji = json_object_get(j, "isa");
    json_t *dp = json_object_get(j, "decode_prefetch");
    if (!json_is_integer(ver) || json_integer_value(ver) != CPU_TUNE_VERSION || !json_is_string(jc) ||
        !json_is_string(ji) || !json_is_object(dp)) {
        err_set(msg, ERR_FORMAT, "tune file %s: not a version %d tune file (it needs \"version\", \"cpu\", \"isa\" and "
                                 "\"decode_prefetch\"); run `wafer bench --tune` again", path, CPU_TUNE_VERSION);
        goto out;
    }
    if (strcmp(json_string_value(jc), cpu) || strcmp(json_string_value(ji), cpu_tune_isa())) {
        err_set(msg, 0, "tune file %s was measured on %s with %s kernels; this is %s with %s kernels: built-in rules "
                        "(`wafer bench --tune` measures this CPU)",
                path, json_string_value(jc), json_string_value(ji), cpu, cpu_tune_isa());
        rc = 0;
        goto out;
    }
    const char *key;
    json_t *v;
    json_object_foreach(dp, key, v) {
        enum dtype t;
        bool type_ok = dtype_from_name(key, &t) == 0;
        int r = json_is_string(v) ? cpu_prefetch_parse(json_string_value(v)) : -1;
        if (!type_ok || r < 0 || !cpu_decode_prefetch_valid(t, r)) {
            enum cpu_prefetch c[CPU_PREFETCH_COUNT];
            int k = type_ok ? cpu_decode_prefetch_candidates(t, c) : 0;
            char have[64] = "none";
            for (int i = 0, at = 0; i < k && at < (int)sizeof have; i++)
                at += snprintf(have + at, sizeof have - (size_t)at, "%s%s", i ? ", " : "", cpu_prefetch_name(c[i]));
            err_set(msg, ERR_FORMAT, "tune file %s: \"%s\" is not a decode rule this build has for %s here (it has: "
                                     "%s); run `wafer bench --tune` again",
                    path, json_is_string(v) ? json_string_value(v) : "(not a string)", key, have);
            goto out;
        }
        rules[t] = r;
    }
    snprintf(cpu_tune_src, sizeof cpu_tune_src, "tune file %s", path);
    for (int t = 0; t < DTYPE_COUNT; t++)
        if (rules[t] >= 0)
            cpu_decode_prefetch_set((enum dtype)t, rules[t]);
    err_set(msg, 0, "decode prefetch rules from tune file %s", path);
    rc = 1;
out:
    json_decref(j);
    return rc;
}

static pthread_once_t cpu_tune_once = PTHREAD_ONCE_INIT;
static atomic_bool cpu_tune_no_hint;

void cpu_tune_hint_off(void)
{
    atomic_store(&cpu_tune_no_hint, true);
}

static void cpu_tune_load(void)
{
    char path[512], msg[ERR_MSG_MAX];
    int rc = cpu_tune_path(path, sizeof path) ? cpu_tune_apply_file(path, msg) : 0;
    if (rc != 1 && !cpu_decode_prefetch_measured() && kernel_cpu_has_avx2() && !atomic_load(&cpu_tune_no_hint)) {
        char cpu[256];
        sysinfo_cpu_name(cpu, sizeof cpu);
        log_write(LOG_INFO, "decode prefetch: generic rules on %s, which the project has not measured; `wafer bench "
                            "--tune` measures this CPU's (under a minute, once) for every later run", cpu);
    }
    if (!path[0])
        return;
    if (rc == 1) {
        char d[256];
        cpu_tune_describe(d, sizeof d);
        log_write(LOG_INFO, "%s: %s", msg, d);
    } else if (rc < 0 || strncmp(msg, "no tune file", 12) != 0 || getenv("WAFER_TUNE_FILE")) {
        log_write(LOG_WARN, "%s", msg); /* a missing file is news only where WAFER_TUNE_FILE named it */
    }
}

void cpu_tune_load_once(void)
{
    pthread_once(&cpu_tune_once, cpu_tune_load);
}

const char *cpu_tune_source(void)
{
    static char with_env[sizeof cpu_tune_src + 80];
    if (!cpu_decode_prefetch_env())
        return cpu_tune_src;
    snprintf(with_env, sizeof with_env, "WAFER_GEMV_PREFETCH / WAFER_PREFETCH_NTA in the environment over the %s",
             cpu_tune_src);
    return with_env;
}

void cpu_tune_describe(char *buf, size_t n)
{
    size_t at = 0;
    if (n)
        buf[0] = '\0';
    for (int i = 0; i < CPU_PREFETCH_N_TYPES && at < n; i++) {
        int w = snprintf(buf + at, n - at, "%s%s %s", i ? ", " : "", dtype_name(cpu_decode_prefetch_types[i]),
                         cpu_prefetch_name(cpu_decode_prefetch(cpu_decode_prefetch_types[i])));
        if (w < 0)
            break;
        at += (size_t)w;
    }
}

int cpu_tune_write(const char *path, const int rules[DTYPE_COUNT], int threads, const char *figures, char *err)
{
    int rc = ERR_IO;
    char cpu[256], when[32], tmp[600];
    json_t *j = json_object(), *dp = json_object(), *fig = NULL;
    if (!j || !dp) {
        rc = err_set(err, ERR_IO, "tune file: out of memory");
        goto out;
    }
    if (figures && !(fig = json_loads(figures, 0, NULL))) {
        rc = err_set(err, ERR_INVALID_ARG, "tune file: the figures are not JSON");
        goto out;
    }
    sysinfo_cpu_name(cpu, sizeof cpu);
    time_t now = time(NULL);
    struct tm tm;
    gmtime_r(&now, &tm);
    strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", &tm);
    for (int i = 0; i < CPU_PREFETCH_N_TYPES; i++) {
        enum dtype t = cpu_decode_prefetch_types[i];
        if (rules[t] >= 0)
            json_object_set_new(dp, dtype_name(t), json_string(cpu_prefetch_name(rules[t])));
    }
    json_object_set_new(j, "version", json_integer(CPU_TUNE_VERSION));
    json_object_set_new(j, "cpu", json_string(cpu));
    json_object_set_new(j, "isa", json_string(cpu_tune_isa()));
    json_object_set_new(j, "threads", json_integer(threads));
    json_object_set_new(j, "wafer", json_string(version_get()));
    json_object_set_new(j, "measured_at", json_string(when));
    json_object_set(j, "decode_prefetch", dp);
    if (fig)
        json_object_set(j, "figures", fig);
    if ((rc = fs_mkdirs_for(path, 0755, err)))
        goto out;
    if (snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid()) >= (int)sizeof tmp) {
        rc = err_set(err, ERR_INVALID_ARG, "tune file path too long: %s", path);
        goto out;
    }
    if (json_dump_file(j, tmp, JSON_INDENT(2) | JSON_PRESERVE_ORDER) != 0) {
        rc = err_set(err, ERR_IO, "cannot write the tune file %s: %s", tmp, strerror(errno));
        unlink(tmp);
        goto out;
    }
    if (rename(tmp, path) != 0) {
        rc = err_set(err, ERR_IO, "cannot move the tune file into place at %s: %s", path, strerror(errno));
        unlink(tmp);
        goto out;
    }
    rc = 0;
out:
    json_decref(fig);
    json_decref(dp);
    json_decref(j);
    return rc;
}
