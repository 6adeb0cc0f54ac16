#!/usr/bin/env bash
# The GPU measurements still open (see the issues' notes), in the order that spends the least device time.
# Run on the device machine from the repository root, with the carried wheels installed, output under $OUT:
#   python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
#   export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
#   bash benchmarks/gpu_pending.sh part1     (<= 10 min: GPU tests + prefix TTFT + 27B decode/prefill + profile)
#   bash benchmarks/gpu_pending.sh part2 | part2b | part2c   (27B long context with q4_0 / tq3 KV; dot sweep)
#   bash benchmarks/gpu_pending.sh part3     (<= 10 min: kernels and steps again, after kernel work)
# Never wait for a background job with `pgrep -f NAME` inside the same command: the shell's own command line
# contains NAME and the loop never ends (a 9-minute call was lost that way). Use `wait` on a PID.
set -u
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
M=/root/q35.gguf
[ -f "$M" ] || python3 -m dflash24.synth --preset qwen35-27b --out "$M" > /dev/null
case "${1:-part1}" in
part1)
  timeout 120 python3 -m pytest -m gpu -q tests/test_kvquant.py tests/test_attention.py tests/test_quant_kernels.py \
      tests/test_qwen35_gpu.py > "$OUT/gpu_tests.txt" 2>&1
  timeout 120 python3 benchmarks/bench_prefix.py "$M" --history 16384 --gpu-mem 24 > "$OUT/prefix.json" 2> "$OUT/prefix.err"
  timeout 150 python3 benchmarks/bench_qwen35.py "$M" --gpu-mem 24 --ctx 16384 --decode-tokens 64 > "$OUT/qwen35.json" 2> "$OUT/qwen35.err"
  timeout 90 python3 benchmarks/profile_steps.py "$M" --top 30 > "$OUT/profile.json" 2> "$OUT/profile.err"
  ;;
part1b)   # prefill chunk size (the large-M path reached 217 TFLOP/s at M=512 and ~580 at 4096 in the kernel sweep)
  timeout 150 python3 benchmarks/bench_qwen35.py "$M" --gpu-mem 24 --ctx 16384 --decode-tokens 16 \
      --prefill 4096,13000 --prefill-chunk 2048 > "$OUT/qwen35_chunk2048.json" 2> "$OUT/qwen35_chunk2048.err"
  ;;
part2)   # 27B long context in 23.42 GiB: q4_0 KV + Q8_0 drafter at 131K; tq3 KV + Q4_K drafter + host embedding at 262K
  timeout 290 python3 benchmarks/bench_long_context.py "$M" --kv q4_0 --ctx 131072 --draft-type Q8_0 \
      --decode-at 8192,32768,131000 > "$OUT/long_q4_0.json" 2> "$OUT/long_q4_0.err"
  ;;
part2b)
  timeout 560 python3 benchmarks/bench_long_context.py "$M" --kv tq3 --ctx 262144 --draft-type Q4_K --embed-on-host \
      > "$OUT/long_tq3.json" 2> "$OUT/long_tq3.err"
  ;;
part2c)  # small-M dot sweep + prefix TTFT with a third turn
  timeout 330 python3 benchmarks/tune_dot.py > "$OUT/tune_dot.jsonl" 2> "$OUT/tune_dot.err"
  timeout 200 python3 benchmarks/bench_prefix.py "$M" --history 16384 --gpu-mem 24 > "$OUT/prefix.json" 2> "$OUT/prefix.err"
  ;;
part3)   # kernels and speculative steps again, after kernel work
  timeout 200 python3 benchmarks/tune_gemv.py --min-ms 10 > "$OUT/tune_gemv.jsonl" 2>&1
  timeout 150 python3 benchmarks/bench_spec.py "$M" --gpu-mem 24 --ctx 4096 --iters 10 > "$OUT/spec.json" 2> "$OUT/spec.err"
  timeout 150 python3 benchmarks/bench_tree_budget.py "$M" > "$OUT/tree_budget.json" 2> "$OUT/tree_budget.err"
  ;;
*) echo "usage: $0 part1|part1b|part2|part2b|part2c|part3" >&2; exit 2 ;;
esac
