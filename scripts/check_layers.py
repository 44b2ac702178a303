#!/usr/bin/python3
"""check_layers: wafer's layering rules, checked on the sources and on the built objects.

    core < engine < jobs < {server, route, pull, client, bench} < cli

1. Includes. A file in src/ may include a header of its own layer or of a lower one, never one of a higher
   layer ("up") nor one of a sibling ("sideways": server, route, pull, client and bench never include each
   other; the server runs batch jobs, so it sits above jobs/, which never includes it).
   Inside the engine, gguf/ (the file format) and tokenizer/ sit below the rest: they include neither cpu/
   (one backend's kernels) nor the scheduler. The backends (engine/cpu/, engine/scalar/) are private: only
   the registry (engine/backend.c) reaches them, with the exceptions BACKEND_USERS names.
2. Calls, from `nm` of the objects of the build (build/obj/src/**/*.o): an object may use a symbol defined in
   another object only where it could include that object's header (the include rules above, so a hand-written
   extern does not slip past them), and no objects may use each other in a cycle (A uses B and B uses A, or a
   longer ring): a cycle means two files are one module in disguise, or a dispatcher lives in a kernel file.

Usage: check_layers.py [--root DIR] [--obj DIR] [--no-objects]
  --root DIR     the tree whose src/ is checked (default: this script's repository)
  --obj DIR      the folder holding the objects of src/ (default: ROOT/build/obj); objects whose source is
                 gone (stale after a rename) are skipped
  --no-objects   check the includes only
Prints one line per violation (file:line for includes; the files and the symbols for calls) and exits 1 when
there is any, 0 when none. Standard library only; runs under /usr/bin/python3.
"""
import argparse
import os
import re
import subprocess
import sys

# Layer of each top-level folder of src/: a higher number may use a lower one; equal numbers are siblings
# (they may not use each other) unless it is the same folder.
LAYERS = {
    "core": 0,
    "engine": 1,
    "jobs": 2,
    "server": 3,
    "route": 3,
    "pull": 3,
    "client": 3,
    "bench": 3,
    "cli": 4,
}

# Finer rules inside a layer: (prefix of the including file, prefix of the included file, why).
FORBIDDEN = [
    ("src/engine/gguf/", "src/engine/cpu/", "the file format may not depend on a backend's kernels"),
    ("src/engine/gguf/", "src/engine/scheduler", "the file format may not depend on the scheduler"),
    ("src/engine/tokenizer/", "src/engine/cpu/", "the tokenizer may not depend on a backend's kernels"),
    ("src/engine/tokenizer/", "src/engine/scheduler", "the tokenizer may not depend on the scheduler"),
]

# The backends (src/engine/cpu/, src/engine/scalar/) are reached only through engine.h and the registry in
# backend.c, so adding a backend changes neither the scheduler nor the server. The few exceptions, and why:
BACKEND_DIRS = ("src/engine/cpu/", "src/engine/scalar/")
BACKEND_USERS = {
    "src/engine/backend.c": "the registry lists every backend",
    "src/bench/membw.c": "the bandwidth probe uses the CPU's own vector loads and thread pool",
    "src/bench/gemv_stream.c": "`bench --stream` measures the CPU backend's own decode kernels against membw's read",
    "src/bench/bench_tune.c": "`bench --tune` measures the CPU backend's decode prefetch rules, writes its tune file",
}
# the scalar reference backend computes with the CPU backend's portable reference kernels (same numerics)
BACKEND_SHARED = (("src/engine/scalar/", "src/engine/cpu/kernels"), ("src/engine/scalar/", "src/engine/cpu/attn"))

INCLUDE_RE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')
# nm -P: "name type [value size]"; these types are definitions a linker can resolve another object against
DEFINED_TYPES = set("TDBRCGSVWi")


def layer_of(rel):
    """(folder, rank) of a path relative to the root (src/<folder>/...), or (None, None) outside src/."""
    parts = rel.split("/")
    if len(parts) < 3 or parts[0] != "src":
        return None, None
    return parts[1], LAYERS.get(parts[1])


def why_not(src_rel, dst_rel):
    """None when src_rel may use dst_rel, else the reason."""
    sf, sr = layer_of(src_rel)
    df, dr = layer_of(dst_rel)
    if sf is None or df is None:
        return None
    if sr is None:
        return f"src/{sf}/ is not a known layer (add it to LAYERS in scripts/check_layers.py)"
    if dr is None:
        return f"src/{df}/ is not a known layer (add it to LAYERS in scripts/check_layers.py)"
    if sf != df:
        if dr > sr:
            return f"goes up: {sf} (layer {sr}) may not use {df} (layer {dr})"
        if dr == sr:
            return f"goes sideways: {sf} and {df} are siblings and may not use each other"
    for a, b, reason in FORBIDDEN:
        if src_rel.startswith(a) and dst_rel.startswith(b):
            return f"{a[4:]} may not use {b[4:]}: {reason}"
    dst_backend = next((d for d in BACKEND_DIRS if dst_rel.startswith(d)), None)
    if dst_backend and not src_rel.startswith(dst_backend) and src_rel not in BACKEND_USERS and \
            not any(src_rel.startswith(a) and dst_rel.startswith(b) for a, b in BACKEND_SHARED):
        return (f"reaches into a backend ({dst_backend[4:]}): use engine.h (the engine picks backends through "
                "the registry in src/engine/backend.c)")
    return None


def source_files(root):
    out = []
    for d, dirs, files in os.walk(os.path.join(root, "src")):
        dirs.sort()
        for f in sorted(files):
            if f.endswith((".c", ".h")):
                out.append(os.path.relpath(os.path.join(d, f), root).replace(os.sep, "/"))
    return out


def check_includes(root):
    problems = []
    for rel in source_files(root):
        folder, rank = layer_of(rel)
        if folder is not None and rank is None:
            problems.append(f"{rel}: src/{folder}/ is not a known layer (add it to LAYERS in scripts/check_layers.py)")
            continue
        with open(os.path.join(root, rel), encoding="utf-8", errors="replace") as f:
            for lineno, line in enumerate(f, 1):
                m = INCLUDE_RE.match(line)
                if not m:
                    continue
                inc = m.group(1)
                # -Isrc: "engine/x.h" is src/engine/x.h; a bare name is next to the including file
                cand = os.path.normpath(os.path.join("src", inc)).replace(os.sep, "/")
                if inc.startswith("wafer/") and os.path.exists(os.path.join(root, "include", inc)):
                    # include/wafer/*.h: the C client library's public header, part of the client layer
                    cand = "src/client/" + inc[len("wafer/"):]
                elif not os.path.exists(os.path.join(root, cand)):
                    near = os.path.normpath(os.path.join(os.path.dirname(rel), inc)).replace(os.sep, "/")
                    if os.path.exists(os.path.join(root, near)):
                        cand = near
                reason = why_not(rel, cand)
                if reason:
                    problems.append(f"{rel}:{lineno}: #include \"{inc}\" {reason}")
    return problems


def read_objects(root, obj_dir):
    """{source rel path: (defined symbols, undefined symbols)} for every object whose source exists."""
    paths = {}  # object path -> source rel path
    for d, dirs, files in os.walk(obj_dir):
        dirs.sort()
        for f in sorted(files):
            if not f.endswith(".o"):
                continue
            path = os.path.join(d, f)
            rel = os.path.relpath(path, obj_dir).replace(os.sep, "/")
            if not rel.startswith("src/"):
                continue
            src = rel[:-2] + ".c"
            if not os.path.exists(os.path.join(root, src)):
                continue  # stale object of a renamed or deleted source
            paths[path] = src
    objs = {src: (set(), set()) for src in paths.values()}
    if not paths:
        return objs
    # one nm for all of them (one per object took most of the check's time); -A names each line's object
    try:
        out = subprocess.run(["nm", "-P", "-A", *paths], check=True, capture_output=True, text=True).stdout
    except (OSError, subprocess.CalledProcessError) as e:
        sys.exit(f"check_layers: cannot run nm on the objects of {obj_dir}: {e}")
    for line in out.splitlines():
        # "path: name type [value size]"
        head, sep, rest = line.partition(": ")
        p = rest.split()
        if not sep or head not in paths or len(p) < 2:
            continue
        defined, undefined = objs[paths[head]]
        name, typ = p[0], p[1]
        if typ in ("U", "w", "v"):
            undefined.add(name)
        elif typ in DEFINED_TYPES:
            defined.add(name)
    return objs


def uses_graph(objs):
    """{a: {b: [symbols a uses that b defines]}} over distinct objects."""
    definer = {}
    for src, (defined, _) in objs.items():
        for s in defined:
            definer.setdefault(s, []).append(src)
    graph = {src: {} for src in objs}
    for src, (_, undefined) in objs.items():
        for s in sorted(undefined):
            for d in definer.get(s, []):
                if d != src:
                    graph[src].setdefault(d, []).append(s)
    return graph


def strongly_connected(graph):
    """Tarjan's algorithm, iterative; returns the components with more than one node."""
    index, low, on_stack, stack, comps = {}, {}, set(), [], []
    counter = 0
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            v, it = work[-1]
            advanced = False
            for w in it:
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                    advanced = True
                    break
                if w in on_stack:
                    low[v] = min(low[v], index[w])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    comps.append(sorted(comp))
    return comps


def shortest_cycle(graph, comp):
    """A shortest cycle through the first node of comp, staying inside comp (breadth-first)."""
    members = set(comp)
    start = comp[0]
    prev = {start: None}
    queue = [start]
    while queue:
        nxt = []
        for v in queue:
            for w in sorted(graph[v]):
                if w not in members:
                    continue
                if w == start:
                    path = [v]
                    while prev[path[-1]] is not None:
                        path.append(prev[path[-1]])
                    return list(reversed(path)) + [start]
                if w not in prev:
                    prev[w] = v
                    nxt.append(w)
        queue = nxt
    return [start, start]


def fmt_syms(syms, limit=4):
    s = ", ".join(syms[:limit])
    return s + (f", ... ({len(syms)} symbols)" if len(syms) > limit else "")


def check_objects(root, obj_dir):
    objs = read_objects(root, obj_dir)
    if not objs:
        return [f"{obj_dir}: no objects of src/ found (build first: make)"]
    graph = uses_graph(objs)
    problems = []
    for a in sorted(graph):
        for b, syms in sorted(graph[a].items()):
            reason = why_not(a, b)
            if reason:
                problems.append(f"{a}: calls {b} ({fmt_syms(syms)}): {reason}")
    for comp in strongly_connected(graph):
        cyc = shortest_cycle(graph, comp)
        hops = " -> ".join(f"{cyc[i]} [{fmt_syms(graph[cyc[i]][cyc[i + 1]])}]" for i in range(len(cyc) - 1))
        extra = f" (the cycle is part of a knot of {len(comp)} files: {', '.join(comp)})" if len(comp) > len(cyc) - 1 else ""
        problems.append(f"call cycle: {hops} -> {cyc[-1]}{extra}")
    return problems


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--root", default=os.path.abspath(os.path.join(os.path.dirname(__file__), "..")))
    ap.add_argument("--obj", default=None)
    ap.add_argument("--no-objects", action="store_true")
    a = ap.parse_args()
    root = os.path.abspath(a.root)
    if not os.path.isdir(os.path.join(root, "src")):
        sys.exit(f"check_layers: {root} has no src/ folder")
    problems = check_includes(root)
    n_files = len(source_files(root))
    if not a.no_objects:
        problems += check_objects(root, a.obj or os.path.join(root, "build", "obj"))
    for p in problems:
        print(p)
    if problems:
        print(f"check_layers: {len(problems)} violation(s) of the layers core < engine < jobs < "
              "{server, route, pull, client, bench} < cli (see scripts/check_layers.py)", file=sys.stderr)
        return 1
    print(f"check_layers: ok ({n_files} files{'' if a.no_objects else ', their objects'})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
