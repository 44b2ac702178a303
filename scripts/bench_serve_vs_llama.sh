#!/usr/bin/env bash
# Serving benchmark, wafer serve vs llama-server, one after the other on the same machine, model file,
# thread count, number of parallel sequences and KV size, driven by the same load tester (wafer bench serve):
# 64-token prompts, 64 generated tokens, streaming, concurrency 1, 4 and 8 (the setting of ../shared/anchors.md).
#
# usage: scripts/bench_serve_vs_llama.sh MODEL.gguf LLAMA_SERVER_BIN [OUT_DIR]
#   env: THREADS (2), PARALLEL (8), CTX_PER_SEQ (512), PROMPTS_PER_LEVEL (16), CONCURRENCY (1,4,8)
# Writes OUT_DIR/{wafer,llama}.json and .html and prints `wafer bench compare llama.json wafer.json`.
# llama-server is not built by this script: point it at a build you made beside the project.
set -euo pipefail
model=${1:?usage: $0 MODEL.gguf LLAMA_SERVER_BIN [OUT_DIR]}
llama=${2:?usage: $0 MODEL.gguf LLAMA_SERVER_BIN [OUT_DIR]}
out=${3:-build/bench-serve}
threads=${THREADS:-2}
par=${PARALLEL:-8}
ctx=${CTX_PER_SEQ:-512}
n=${PROMPTS_PER_LEVEL:-16}
conc=${CONCURRENCY:-1,4,8}
wafer=${WAFER_BIN:-build/wafer}
port=${PORT:-18090}
mkdir -p "$out"

wait_ready() { # port path (llama-server's /health and wafer's /ready answer 503 until the model is loaded)
    local port=$1 path=$2
    for _ in $(seq 1 600); do
        curl -sf "http://127.0.0.1:$port$path" >/dev/null 2>&1 && return 0
        sleep 0.2
    done
    echo "server on port $port did not come up" >&2
    return 1
}

drive() { # port label json html
    local port=$1
    shift
    "$wafer" bench serve --url "http://127.0.0.1:$port" --endpoint completions --concurrency "$conc" \
        --num-prompts "$n" --input-len 64 --output-len 64 --ignore-eos --seed 1 --no-progress \
        --label "$1" --json "$2" --html "$3"
}

# the same KV: par sequences of ctx positions, F16 keys and values
echo "== llama-server: -t $threads -np $par -c $((par * ctx)) -cb"
"$llama" -m "$model" -t "$threads" -np "$par" -c $((par * ctx)) -cb --port "$port" --host 127.0.0.1 \
    >"$out/llama-server.log" 2>&1 &
pid=$!
trap 'kill $pid 2>/dev/null || true' EXIT
wait_ready "$port" /health
drive "$port" llama-server "$out/llama.json" "$out/llama.html"
kill "$pid"; wait "$pid" 2>/dev/null || true
port=$((port + 1)) # a port of its own: never measure a server that is still shutting down

echo "== wafer serve: --threads $threads --max-batch-size $par --ctx-size $ctx"
"$wafer" serve --model "$model" --threads "$threads" --max-batch-size "$par" --ctx-size "$ctx" --port "$port" \
    >"$out/wafer-serve.log" 2>&1 &
pid=$!
wait_ready "$port" /ready
drive "$port" wafer "$out/wafer.json" "$out/wafer.html"
kill "$pid"; wait "$pid" 2>/dev/null || true
trap - EXIT

"$wafer" bench compare "$out/llama.json" "$out/wafer.json"
