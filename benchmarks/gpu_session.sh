#!/usr/bin/env bash
# The one prepared device run (issue 24, point 3): run from the repository root on a machine
# with CUDA; JSON lines and logs go to ${OUT:-benchmarks/results/gpu_session}. Each stage has
# its own time limit and a failed stage does not stop the next. ~20.5 minutes at most (3 of them the
# recording stage, 3 the host-bound proxy; with a 15-minute device budget the last stages may not
# run), ~6 as measured on an H200 (before the materialised eigs and recording parts).
set -u
out=${OUT:-benchmarks/results/gpu_session}
mkdir -p "$out"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
py=${PYTHON:-python3}
stage() {  # stage NAME SECONDS ARGS...: one gpu.py run, its rc and time in stages.txt
    local name=$1 limit=$2; shift 2
    local t0=$SECONDS
    timeout "$limit" "$py" benchmarks/gpu.py "$@" --out "$out/gpu.jsonl" >"$out/$name.log" 2>&1
    echo "$name rc=$? seconds=$((SECONDS - t0))" | tee -a "$out/stages.txt"
    tail -3 "$out/$name.log"
}
{ nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv
  "$py" -c "import torch, transformers; print('torch', torch.__version__, 'transformers',
transformers.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name())"
} >"$out/env.txt" 2>&1
cat "$out/env.txt"
# the CUDA-only tests (graph replays against direct application and the dense oracle)
t0=$SECONDS
timeout 90 "$py" -m pytest -q -p no:cacheprovider tests/test_cuda_graphs.py >"$out/pytest.log" 2>&1
echo "pytest rc=$? seconds=$((SECONDS - t0))" | tee -a "$out/stages.txt"
tail -3 "$out/pytest.log"
# oracles on the device (matrix-free vs its exact path, device vs CPU), then the small form
stage check 110 --check --layers 2 --d-model 1024 --tokens 128 --vocab 1000 \
    --dtype float32 --threads 8
# Llama-3-8B shape, bf16, 512 tokens: the jacobian section (layer groups) with its peak memory
# (peak_gib; issue 37 goals: <= 30 s, <= 40 GiB); recording overhead is the recording stage's
stage llama8b_jacobian 270 --skip-power --skip-record --progress
# the host-bound proxy (issue 37) on the device: ops, host syncs, forward-equivalents a layer,
# matrix-free against the dense path (d=128 x 8 layers; d=1024 x 4 if time allows)
t0=$SECONDS
timeout 100 "$py" benchmarks/host_bound.py --device cuda --quick --check --rounds 3 \
    --out "$out/host_bound.jsonl" >"$out/host_bound.log" 2>&1
timeout 100 "$py" benchmarks/host_bound.py --device cuda --proxies d1024x4 --check --rounds 2 \
    --out "$out/host_bound.jsonl" >>"$out/host_bound.log" 2>&1
echo "host_bound rc=$? seconds=$((SECONDS - t0))" | tee -a "$out/stages.txt"
tail -2 "$out/host_bound.log"
# where a layer's jacobian time goes (eigs, svds, Hutchinson), with a profile of one layer
t0=$SECONDS
timeout 130 "$py" benchmarks/jacobian_parts.py --layers 3 --profile --materialize --out "$out/parts.jsonl" \
    >"$out/parts.log" 2>&1
echo "parts rc=$? seconds=$((SECONDS - t0))" | tee -a "$out/stages.txt"
# recording cost (issue 38): plain vs recorded forward, Llama-3-8B shape bf16 512 tokens, and
# the CPU proxy's shape on the device
t0=$SECONDS
timeout 150 "$py" benchmarks/recording_cost.py --model llama8b --device cuda --rounds 9 \
    --calls 10 --json "$out/recording_llama8b.json" >"$out/recording.log" 2>&1
timeout 45 "$py" benchmarks/recording_cost.py --model proxy --device cuda --rounds 11 \
    --json "$out/recording_proxy.json" >>"$out/recording.log" 2>&1
echo "recording rc=$? seconds=$((SECONDS - t0))" | tee -a "$out/stages.txt"
tail -2 "$out/recording.log"
# the same model's power view (matrix-free top-8 of F at d = 4096)
stage llama8b_power 150 --skip-record --skip-jacobian --progress
# the bottleneck section's proxy on the device (issue 37, item 5): seconds a block application
# of the chain takes on a GPU, against the launch model's projection in the guide
t0=$SECONDS
timeout 90 "$py" benchmarks/bottleneck_budget.py --device cuda --depths 2 3 \
    --out "$out/bottleneck_budget.jsonl" >"$out/bottleneck.log" 2>&1
echo "bottleneck rc=$? seconds=$((SECONDS - t0))" | tee -a "$out/stages.txt"
tail -1 "$out/bottleneck.log"
