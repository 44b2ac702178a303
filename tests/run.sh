#!/usr/bin/env bash
# Runs every test wafer has and prints one closing line "N passed, N failed, N skipped".
#   unit:  each build/tests/test_* binary (cmocka; its counts are parsed from its output)
#   fuzz:  each build/fuzz/fuzz_* target replays its corpus in tests/fuzz/corpus/<name>/ (ASan+UBSan)
#   e2e:   pytest over tests/e2e (real binaries on loopback), skipped when WAFER_TEST_UNIT_ONLY=1; a pytest that
#          fails, is missing, is interrupted or runs no test counts as a failure
#   soak:  scripts/soak.py for TEST_SOAK_SECONDS (default 120; 0 skips it) on stories260K, after the e2e tests
#          and also skipped with WAFER_TEST_UNIT_ONLY=1; it counts as one test, failed when the soak fails, when
#          its runner breaks (no model, the server does not start, a Python error) or when it answered nothing
# Environment: BUILD (build dir), SHARED (the ../shared folder), PYTHON (/usr/bin/python3).
set -u
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
export WAFER_SHARED=${SHARED:-$(cd .. && pwd)/shared}
export WAFER_BIN=$PWD/$BUILD/wafer
PYTHON=${PYTHON:-/usr/bin/python3}
passed=0 failed=0 skipped=0
failures=()

for t in "$BUILD"/tests/test_*; do
    [ -x "$t" ] || continue
    name=$(basename "$t")
    log="$BUILD/tests/$name.log"
    "$t" >"$log" 2>&1
    rc=$?
    p=$(sed -n 's/^\[  PASSED  \] \([0-9]*\) test.*/\1/p' "$log" | tail -1)
    f=$(sed -n 's/^\[  FAILED  \] \([0-9]*\) test.*/\1/p' "$log" | tail -1)
    s=$(sed -n 's/^\[  SKIPPED \] \([0-9]*\) test.*/\1/p' "$log" | tail -1)
    p=${p:-0} f=${f:-0} s=${s:-0}
    if [ $rc -ne 0 ] && [ "$f" -eq 0 ]; then f=1; fi   # crashed before cmocka could count
    passed=$((passed + p)) failed=$((failed + f)) skipped=$((skipped + s))
    echo "unit  $name: $p passed, $f failed, $s skipped"
    if [ "$f" -ne 0 ]; then failures+=("$name"); cat "$log"; fi
    grep '^\[  SKIPPED \] ' "$log" | grep -v 'test(s)' | sed 's/^/      /'
done

if [ -z "${WAFER_TEST_UNIT_ONLY:-}" ]; then
    for fz in "$BUILD"/fuzz/fuzz_*; do
        [ -x "$fz" ] || continue
        name=$(basename "$fz")
        corpus="tests/fuzz/corpus/${name#fuzz_}"
        files=("$corpus"/*)
        if [ ! -e "${files[0]}" ]; then echo "fuzz  $name: no corpus in $corpus"; failed=$((failed + 1)); continue; fi
        if "$fz" "${files[@]}" >"$BUILD/fuzz/$name.log" 2>&1; then
            passed=$((passed + 1)); echo "fuzz  $name: replayed ${#files[@]} inputs under ASan+UBSan, ok"
        else
            failed=$((failed + 1)); failures+=("$name"); tail -40 "$BUILD/fuzz/$name.log"
        fi
    done

    if ls tests/e2e/test_*.py >/dev/null 2>&1; then
        log="$BUILD/e2e.log"
        mkdir -p "$BUILD"
        "$PYTHON" -m pytest -q -rs tests/e2e 2>&1 | tee "$log"
        rc=${PIPESTATUS[0]}
        p=$(tail -1 "$log" | grep -Eo '[0-9]+ passed' | grep -Eo '[0-9]+'); p=${p:-0}
        f=$(tail -1 "$log" | grep -Eo '[0-9]+ (failed|errors?)' | awk '{s+=$1} END {print s+0}')
        s=$(tail -1 "$log" | grep -Eo '[0-9]+ skipped' | grep -Eo '[0-9]+'); s=${s:-0}
        # pytest's exit status decides, not only its summary line: 1 failures (or no pytest at all: "No module
        # named pytest"), 2 interrupted, 3 internal error, 4 usage error, 5 no test collected, >128 a signal
        if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then
            case $rc in
                1) why="pytest failed without a failing test (is pytest installed for $PYTHON?)" ;;
                2) why="pytest was interrupted" ;;
                5) why="pytest ran no test" ;;
                *) why="pytest exited with status $rc" ;;
            esac
            echo "e2e: $why"
            f=1
        fi
        passed=$((passed + p)) failed=$((failed + f)) skipped=$((skipped + s))
        [ "$f" -ne 0 ] && failures+=("e2e")
    fi

    soak_s=${TEST_SOAK_SECONDS:-120}
    soak_model="$WAFER_SHARED/models/stories260K/stories260K.gguf"
    if [ "$soak_s" != 0 ] && [ ! -e "$soak_model" ]; then
        # as every test that reads ../shared: skipped, saying why, only where the folder is absent
        echo "soak  skipped: shared model $soak_model not found (set SHARED)"
        skipped=$((skipped + 1))
    elif [ "$soak_s" != 0 ]; then
        log="$BUILD/soak.log" json="$BUILD/soak.json"
        rm -f "$json"
        echo "soak  scripts/soak.py for $soak_s s on stories260K (log: $log)"
        "$PYTHON" scripts/soak.py --wafer "$WAFER_BIN" --model "$soak_model" \
            --seconds "$soak_s" --json "$json" >"$log" 2>&1
        rc=$?
        # the verdict line and the figures it wrote decide: a runner that broke writes none
        if [ $rc -eq 0 ] && "$PYTHON" -c 'import json, sys
r = json.load(open(sys.argv[1]))
sys.exit(0 if r["verdict"] == "pass" and r["requests"] > 0 and r["generated_ok"] > 0 else 1)' "$json" 2>/dev/null; then
            passed=$((passed + 1)); grep -A3 '^soak pass' "$log" | sed 's/^/      /'
        else
            failed=$((failed + 1)); failures+=("soak"); echo "soak: failed (exit status $rc)"; tail -60 "$log"
        fi
    fi
fi

[ ${#failures[@]} -gt 0 ] && echo "failing: ${failures[*]}"
echo "$passed passed, $failed failed, $skipped skipped"
[ "$failed" -eq 0 ] && [ "$passed" -gt 0 ]
