"""scripts/check_layers.py (make check-layers): passes on the real tree, and fails with a precise message on small
trees built to break one rule each: an include that goes up, one that goes sideways, one from gguf/ into cpu/, a
folder that is no known layer, objects that call each other in a circle (two files and three), and a call that
goes up through a hand-written declaration (no include to catch)."""
import os
import shutil
import subprocess
import sys

import pytest

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
SCRIPT = os.path.join(REPO, "scripts", "check_layers.py")
WAFER_BIN = os.environ.get("WAFER_BIN") or os.path.join(REPO, "build", "wafer")
CC = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")


def run(root, *args):
    p = subprocess.run([sys.executable, SCRIPT, "--root", str(root), *args], capture_output=True, text=True,
                       timeout=120)
    return p.returncode, p.stdout + p.stderr


def write(root, rel, text):
    path = os.path.join(str(root), rel)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(text)


def build(root):
    """Compiles every src/**/*.c of root into root/obj/src/**/*.o, as the Makefile lays objects out."""
    for d, _, files in os.walk(os.path.join(str(root), "src")):
        for f in files:
            if f.endswith(".c"):
                src = os.path.join(d, f)
                rel = os.path.relpath(src, str(root))
                obj = os.path.join(str(root), "obj", rel[:-2] + ".o")
                os.makedirs(os.path.dirname(obj), exist_ok=True)
                subprocess.run([CC, "-c", "-I", os.path.join(str(root), "src"), src, "-o", obj], check=True)
    return os.path.join(str(root), "obj")


def good_tree(root):
    """A small tree that keeps every rule: core <- engine <- server <- cli, one call each way down."""
    write(root, "src/core/util.h", "int core_util(int x);\n")
    write(root, "src/core/util.c", '#include "core/util.h"\nint core_util(int x) { return x + 1; }\n')
    write(root, "src/engine/eng.h", '#include "core/util.h"\nint engine_run(int x);\n')
    write(root, "src/engine/eng.c", '#include "engine/eng.h"\nint engine_run(int x) { return core_util(x); }\n')
    write(root, "src/engine/gguf/fmt.h", "int gguf_fmt(void);\n")
    write(root, "src/engine/gguf/fmt.c", '#include "engine/gguf/fmt.h"\n#include "core/util.h"\n'
                                         "int gguf_fmt(void) { return core_util(1); }\n")
    write(root, "src/engine/cpu/k.h", "int cpu_k(void);\n")
    write(root, "src/engine/cpu/k.c", '#include "engine/cpu/k.h"\n#include "engine/gguf/fmt.h"\n'
                                      "int cpu_k(void) { return gguf_fmt(); }\n")
    write(root, "src/server/srv.h", "int server_run(void);\n")
    write(root, "src/server/srv.c", '#include "server/srv.h"\n#include "engine/eng.h"\n'
                                    "int server_run(void) { return engine_run(2); }\n")
    write(root, "src/cli/main.c", '#include "server/srv.h"\nint main(void) { return server_run(); }\n')


def test_real_tree_passes():
    obj = os.path.join(os.path.dirname(WAFER_BIN), "obj")
    if not os.path.isdir(obj):
        pytest.skip(f"{obj} not built (run make)")
    rc, out = run(REPO, "--obj", obj)
    assert rc == 0, out
    assert "check_layers: ok" in out


@pytest.mark.skipif(CC is None, reason="no C compiler")
def test_good_small_tree_passes(tmp_path):
    good_tree(tmp_path)
    rc, out = run(tmp_path, "--obj", build(tmp_path))
    assert rc == 0, out


def test_include_up_fails(tmp_path):
    good_tree(tmp_path)
    write(tmp_path, "src/engine/bad.c", '#include "engine/eng.h"\n\n#include "server/srv.h"\nint engine_bad;\n')
    rc, out = run(tmp_path, "--no-objects")
    assert rc == 1, out
    assert 'src/engine/bad.c:3: #include "server/srv.h" goes up: engine (layer 1) may not use server (layer 3)' in out


def test_include_sideways_fails(tmp_path):
    good_tree(tmp_path)
    write(tmp_path, "src/bench/b.h", "int bench_b(void);\n")
    write(tmp_path, "src/server/side.c", '#include "bench/b.h"\n')
    rc, out = run(tmp_path, "--no-objects")
    assert rc == 1, out
    assert 'src/server/side.c:1: #include "bench/b.h" goes sideways: server and bench are siblings' in out


def test_include_from_gguf_into_cpu_fails(tmp_path):
    good_tree(tmp_path)
    write(tmp_path, "src/engine/gguf/w.c", '#include "engine/gguf/fmt.h"\n#include "engine/cpu/k.h"\n')
    write(tmp_path, "src/engine/tokenizer/t.c", '#include "engine/scheduler.h"\n')
    write(tmp_path, "src/engine/scheduler.h", "int sched(void);\n")
    rc, out = run(tmp_path, "--no-objects")
    assert rc == 1, out
    assert 'src/engine/gguf/w.c:2: #include "engine/cpu/k.h" engine/gguf/ may not use engine/cpu/' in out
    assert 'src/engine/tokenizer/t.c:1: #include "engine/scheduler.h" engine/tokenizer/ may not use ' \
           'engine/scheduler' in out


def test_unknown_layer_fails(tmp_path):
    good_tree(tmp_path)
    write(tmp_path, "src/extras/x.c", "int extras_x;\n")
    rc, out = run(tmp_path, "--no-objects")
    assert rc == 1, out
    assert "src/extras/x.c: src/extras/ is not a known layer" in out


@pytest.mark.skipif(CC is None, reason="no C compiler")
def test_call_cycle_of_two_fails(tmp_path):
    good_tree(tmp_path)
    # the dispatcher-in-a-kernel-file shape: each file calls the other
    write(tmp_path, "src/engine/cpu/pick.c", "int kern_b(void);\nint kern_pick(void) { return kern_b(); }\n"
                                             "int kern_a(void) { return 1; }\n")
    write(tmp_path, "src/engine/cpu/kb.c", "int kern_a(void);\nint kern_b(void) { return kern_a(); }\n")
    rc, out = run(tmp_path, "--obj", build(tmp_path))
    assert rc == 1, out
    assert ("call cycle: src/engine/cpu/kb.c [kern_a] -> src/engine/cpu/pick.c [kern_b] -> src/engine/cpu/kb.c"
            in out), out


@pytest.mark.skipif(CC is None, reason="no C compiler")
def test_call_cycle_of_three_fails(tmp_path):
    good_tree(tmp_path)
    write(tmp_path, "src/server/a.c", "int fn_b(void);\nint fn_a(void) { return fn_b(); }\n")
    write(tmp_path, "src/server/b.c", "int fn_c(void);\nint fn_b(void) { return fn_c(); }\n")
    write(tmp_path, "src/server/c.c", "int fn_a(void);\nint fn_c(void) { return fn_a(); }\n")
    rc, out = run(tmp_path, "--obj", build(tmp_path))
    assert rc == 1, out
    assert ("call cycle: src/server/a.c [fn_b] -> src/server/b.c [fn_c] -> src/server/c.c [fn_a] -> src/server/a.c"
            in out), out


@pytest.mark.skipif(CC is None, reason="no C compiler")
def test_call_up_without_include_fails(tmp_path):
    good_tree(tmp_path)
    # no include to catch: the engine declares a server function by hand and calls it
    write(tmp_path, "src/engine/sneak.c", "int server_run(void);\nint engine_sneak(void) { return server_run(); }\n")
    rc, out = run(tmp_path, "--obj", build(tmp_path))
    assert rc == 1, out
    assert "src/engine/sneak.c: calls src/server/srv.c (server_run): goes up: engine (layer 1) may not use server" in out


@pytest.mark.skipif(CC is None, reason="no C compiler")
def test_stale_object_is_ignored(tmp_path):
    good_tree(tmp_path)
    write(tmp_path, "src/engine/old.c", "int server_run(void);\nint engine_old(void) { return server_run(); }\n")
    obj = build(tmp_path)
    os.remove(os.path.join(str(tmp_path), "src/engine/old.c"))  # renamed away; its object lingers in obj/
    rc, out = run(tmp_path, "--obj", obj)
    assert rc == 0, out


def test_include_into_a_backend_fails(tmp_path):
    """Only the registry (engine/backend.c) reaches a backend: the scheduler or the server including a CPU
    backend header would tie them to one backend."""
    good_tree(tmp_path)
    write(tmp_path, "src/engine/scheduler.c", '#include "engine/eng.h"\n#include "engine/cpu/k.h"\n')
    write(tmp_path, "src/server/fast.c", '#include "engine/scalar/s.h"\n')
    write(tmp_path, "src/engine/scalar/s.h", "int scalar_s(void);\n")
    write(tmp_path, "src/engine/backend.c", '#include "engine/cpu/k.h"\n#include "engine/scalar/s.h"\n')
    rc, out = run(tmp_path, "--no-objects")
    assert rc == 1, out
    assert 'src/engine/scheduler.c:2: #include "engine/cpu/k.h" reaches into a backend (engine/cpu/)' in out
    assert 'src/server/fast.c:1: #include "engine/scalar/s.h" reaches into a backend (engine/scalar/)' in out
    assert "src/engine/backend.c:" not in out


def test_jobs_below_server(tmp_path):
    """The server runs batch jobs: server may include jobs/, jobs/ never includes server/."""
    good_tree(tmp_path)
    write(tmp_path, "src/jobs/j.h", "int jobs_j(void);\n")
    write(tmp_path, "src/server/uses_jobs.c", '#include "jobs/j.h"\n')
    rc, out = run(tmp_path, "--no-objects")
    assert rc == 0, out
    write(tmp_path, "src/jobs/bad.c", '#include "server/srv.h"\n')
    rc, out = run(tmp_path, "--no-objects")
    assert rc == 1, out
    assert 'src/jobs/bad.c:1: #include "server/srv.h" goes up: jobs (layer 2) may not use server (layer 3)' in out
