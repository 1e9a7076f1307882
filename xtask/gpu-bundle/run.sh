#!/usr/bin/env bash
# The GPU check bundle's script (`cargo xtask gpu-bundle` puts it beside the
# stripped `suffuse` and `gpu_check` binaries). It runs on a lent GPU
# machine that has no Rust toolchain, in at most about six minutes:
#
#   1. finds NVRTC (CUDA 13 images keep libnvrtc.so.13 where cudarc does not
#      look) and says where it looked;
#   2. probes the device and runs the start-up self-test;
#   3. the whole conformance harness on the device, kernels from NVRTC and
#      from the checked-in PTX;
#   4. the device against the CPU emulator of the same kernels (and the CPU
#      backend) on 2^20 random evaluations;
#   5. the benchmarks: DCF at n = 50 with keys resident (1-bit and 64-bit
#      payloads), key generation GPU against all CPU cores, a q/k/v product
#      with RoPE in its weights (turned_matmul, SmolLM2's shape), CPU
#      scaling 2 -> 16 threads;
#   6. `suffuse embed` at MiniLM's and BERT-base's shapes at 128 tokens
#      (generated weights: checkpoints do not fit the carry), --backend cuda
#      against cpu: bit-exact against the reference, equal to each other,
#      timed, with peak device memory.
#
# Everything lands in $OUT (default: ./out): summary.json (every step's JSON
# and exit status) and log.txt. Each step has its own time limit, and steps
# are skipped once the overall budget is spent, so a hang costs one step.
#
# For a dry run without a GPU: GPU_CHECK_FLAGS=--emulated runs steps 4 and 5
# on the CPU emulator, and EMBED_MODELS narrows step 6.
set -u -o pipefail

here=$(cd "$(dirname "$0")" && pwd)
out=${OUT:-$here/out}
mkdir -p "$out"
work=$(mktemp -d /tmp/suffuse-gpu-bundle.XXXXXX)
log="$out/log.txt"
: >"$log"
t0=$(date +%s)
budget=${BUDGET_S:-330}

say() { echo "[$(($(date +%s) - t0)) s] $*" | tee -a "$log" >&2; }

# A step: name, time limit, command; stdout to $work/NAME.json, stderr to
# the log, exit status to $work/NAME.rc.
step() {
    local name=$1 limit=$2
    shift 2
    local left=$((budget - ($(date +%s) - t0)))
    if [ "$left" -le 10 ]; then
        say "skip $name: the budget is spent"
        echo skipped >"$work/$name.rc"
        return
    fi
    [ "$limit" -gt "$left" ] && limit=$left
    say "run $name (limit ${limit} s): $*"
    local s=$(date +%s)
    timeout --kill-after=5 "$limit" "$@" >"$work/$name.json" 2>>"$log"
    local rc=$?
    echo "$rc" >"$work/$name.rc"
    say "done $name: exit $rc after $(($(date +%s) - s)) s"
}

# 1. NVRTC.
searched=()
found=""
candidates() {
    [ -n "${CUDA_HOME:-}" ] && echo "$CUDA_HOME/lib64"
    echo /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib
    ls -d /usr/local/cuda-*/lib64 /usr/local/cuda-*/targets/x86_64-linux/lib 2>/dev/null
    python3 - 2>/dev/null <<'PY'
import glob, os, site
for base in site.getsitepackages() + [site.getusersitepackages()]:
    for d in glob.glob(os.path.join(base, "nvidia", "**", "lib"), recursive=True):
        print(d)
PY
    echo /usr/lib/x86_64-linux-gnu /usr/lib64
}
for dir in $(candidates); do
    searched+=("$dir")
    for f in "$dir"/libnvrtc.so.13 "$dir"/libnvrtc.so.12 "$dir"/libnvrtc.so; do
        if [ -e "$f" ]; then found=$f; break 2; fi
    done
done
if [ -z "$found" ]; then
    found=$(ldconfig -p 2>/dev/null | awk '/libnvrtc\.so/ && !/builtins/ {print $NF; exit}')
    searched+=("ldconfig -p")
fi
if [ -n "$found" ]; then
    mkdir -p "$work/nvrtc"
    ln -sf "$found" "$work/nvrtc/libnvrtc.so"
    export LD_LIBRARY_PATH="$work/nvrtc:$(dirname "$found")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    say "NVRTC: $found"
else
    say "NVRTC: not found; the kernels come from the checked-in PTX"
fi
printf '%s\n' "${searched[@]}" >"$work/nvrtc-searched.txt"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader \
    >"$work/nvidia-smi.txt" 2>>"$log"
nproc >"$work/nproc.txt"

export SUFFUSE_CACHE_DIR="$work/cache"
export RAYON_NUM_THREADS=$(nproc)
g="$here/gpu_check"
s="$here/suffuse"

# 2-5.
step probe 60 "$g" probe
step conformance-nvrtc 120 "$g" conformance nvrtc
step conformance-ptx 120 "$g" conformance ptx
flags=${GPU_CHECK_FLAGS:-}
step emu-vs-device 90 "$g" $flags emu-vs-device 1048576
step bench 120 "$g" $flags bench

# 6. Embeddings: the same text on both backends, each checked against the
# fixed-point reference by `embed` itself; then the two outputs compared.
text="Private inference keeps the prompt away from both servers, which only ever see secret shares of it. The two outputs must agree."
for model in ${EMBED_MODELS:-generated-minilm generated-bert-base}; do
    for backend in cuda cpu; do
        name="embed-$model-$backend"
        step "$name" 150 "$s" --backend "$backend" embed --model "$model" --max-tokens 128 \
            --report-json "$work/$name.report.json" "$text"
    done
    if [ -s "$work/embed-$model-cuda.json" ] && cmp -s "$work/embed-$model-cuda.json" "$work/embed-$model-cpu.json"; then
        echo true >"$work/embed-$model-equal.txt"
    else
        echo false >"$work/embed-$model-equal.txt"
    fi
done

# One JSON file with everything.
python3 - "$work" "$out/summary.json" <<'PY' || cp -r "$work" "$out/raw" 2>/dev/null
import json, os, sys
work, dest = sys.argv[1], sys.argv[2]
summary = {}
for name in sorted(os.listdir(work)):
    path = os.path.join(work, name)
    if not os.path.isfile(path):
        continue
    text = open(path, errors="replace").read().strip()
    key = name
    try:
        value = json.loads(text)
    except ValueError:
        lines = [l for l in text.splitlines() if l.strip()]
        value = lines if len(lines) != 1 else lines[0]
        try:
            value = [json.loads(l) for l in lines] if lines and name.endswith(".json") else value
        except ValueError:
            pass
    summary[key] = value
json.dump(summary, open(dest, "w"), indent=1, sort_keys=True)
PY
say "finished in $(($(date +%s) - t0)) s; results in $out"
rm -rf "$work"
