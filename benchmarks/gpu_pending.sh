#!/usr/bin/env bash
# The GPU measurements still open (see the issues' notes), in the order that spends the least device time.
# Run on the device machine from the repository root, with the carried wheels installed, output under $OUT:
#   python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
#   export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
# Ran on an H200 on 2026-12-06 (BENCHMARKS.md, "Session of 2026-12-06 02:46 UTC"): part129, part130, part135,
#   part133, the ffn_down two-ahead sweep of part131a, the Gluon 8-warp / L1 variants (not shipped, removed).
# Ran on H100s on 2026-12-06 (BENCHMARKS.md, "Session of 2026-12-06 05:14 UTC"): part137, part138, part138b,
#   part139, part139b, part140, part140b; (session of 07:29 UTC) part141, part141b, part142, part142b, part143,
#   part144 (part145 ran out of time); (session of 09:34 UTC) part146 (= part129 on an H100), part147, part148,
#   part149; (session of 11:50 UTC) part150 (via part152), part153 and the ab_steps / bench_spec calls after it
#   (BENCHMARKS.md); (session of 14:35 UTC) part154 (via part155), part156, the bench_prefill --host-profile call
#   after it, part157; (session of 16:49 UTC) part159 (twice, via part160), part158, part161 (twice; the first at
#   the tiles' first form), bench_spec; (session of 19:07 UTC) part164 (every GPU test), bench_prefill_attention
#   (BENCHMARKS.md); (session of 21:44 UTC) part166 (= part165), part169 (= part167), part170, part171; (session of
#   2026-12-07 00:17 UTC) part174 (via part160), part172, part175, part176, part175 (KV=tq3 CTXS=131072).
#   (session of 2026-12-07 01:45 UTC) part178, part179 (KV=q8_0), the bench_attention sweeps after it.
#   (session of 2026-12-07 04:07 UTC) none: of nineteen calls one got a machine, taken back before it answered.
#   (session of 2026-12-07 06:48 UTC) part183 (= part181 on an H100), the GPU tests of its files, a split sweep.
#   (session of 2026-12-07 09:22 UTC) part184 (its H100 half: part179 with KV=q4_0), part177, every GPU test,
#   part185 (part160's figures on the H100).
#   (session of 2026-12-07 09:22, 10:58-11:03) part187 (the 128-row tiles swept), the verify steps at 4K / 32K / 131K.
#   (session of 2026-12-07 12:05 UTC) part189 (= part188 for a short budget: LONG_STEP_TILES' GPU tests pass), the
#   quantized steps at 4K / 32K / 131K, a 4K / 8K sweep of q4_0 / q8_0 chain steps.
#   (session of 2026-12-07 15:01 UTC) part191 (q4_0's q / output rearranged in registers: its 4K chain step 94.5 ->
#   27.6 us), part192 (its H100 half: the tree tiles by kv type; the shipped ones stay), part193 (q4_0's prefill
#   decode without spills: 8-11 % faster chunks), part194 (its H100 half: the tree tiles at 4K / 8K / 16K).
#   (session of 2026-12-07 17:20 UTC) none: of twenty-one calls none got a machine.
#   (session of 2026-12-07 20:12 UTC) part199 (H100, 22:14: the drafter's rings), after eight calls without one.
#   (session of 2026-12-07 23:18 UTC) part202 (H100, 2026-12-08 00:37, at 681daac: the Gluon decode's A/B and #3 /
#   #4's steps with the winner), after twenty-two calls without one; its losing policies (fixup) are removed since.
#   Next: part200 (on an H200 part160, the goals' figures; elsewhere part197, ~2 min: tq3's rotations as one launch
#   each, before / after); with under 630 s of device time left part201 (#2's table on an H200, else part197);
#   part184's H100 half (the 27B after a 131K q4_0 prompt), then the 131K q4_0 tree run's peak with the rings;
#   part204 (~1 min: Q4_K's 64-row tiles with the subnormal decode, uncapped / capped at 168 registers).
#   On an H100 / H200 first of all: part205 (~7 min: the verify matmul on Hopper's warpgroup MMA, written 2026-12-08
#   without a GPU: its GPU tests, then the 27B's steps against mma.sync), then part206 (~6 min: its tiles, the tree
#   budgets).
#   bash benchmarks/gpu_pending.sh part1    (<= 10 min: GPU tests, the engine in every mode on the GPU)
#   bash benchmarks/gpu_pending.sh part1b   (spec steps, steady decode at 8K / 32K for q4_0 / tq3)
#   bash benchmarks/gpu_pending.sh part2    (<= 10 min: AR decode after a 131K q4_0 prompt; writes the Q4_K drafter)
#   bash benchmarks/gpu_pending.sh part2b   (<= 10 min, right after part2 on the same warm machine: 262K with tq3)
#   bash benchmarks/gpu_pending.sh part2x   (131K q4_0 AR without a drafter: where the allocator's 1.8 GiB gap opens)
#   bash benchmarks/gpu_pending.sh part262  (part2b's run detached (setsid): it may outlive the call; part262wait collects)
#   bash benchmarks/gpu_pending.sh part3    (kernel sweeps: small-M dot incl. W_AS_A, GEMV, tree budgets)
#   bash benchmarks/gpu_pending.sh part4    (drafter training for the 0.5B: see benchmarks/prepare_transfer.sh)
#   bash benchmarks/gpu_pending.sh part4t   (the same on the target's own answers, generated 64 prompts at a time)
#   bash benchmarks/gpu_pending.sh part4b   (its acceptance and speed: AR vs chain vs tree)
#   bash benchmarks/gpu_pending.sh part4q   (the same drafter as Q8_0 / Q6_K / Q4_K: agreement and acceptance)
#   bash benchmarks/gpu_pending.sh part5    (DFLASH24_BATCH_INVARIANT=1: decode == verify bits on the GPU? its cost)
#   bash benchmarks/gpu_pending.sh part5b   (the same mode: prefix-cache identity on the 27B, bits on the real 0.5B)
#   bash benchmarks/gpu_pending.sh part7    (the 0.5B's drafter on its own greedy answers, MINUTES on the clock
#                                            schedule; everything to bring home in 15 MB pieces of home.tgz)
#   bash benchmarks/gpu_pending.sh part21   (the block scales as int32 words: GPU tests, GEMV / dot times per mode)
#   bash benchmarks/gpu_pending.sh part22   (Q6_K's scale words + W_AS_A: GPU tests, variants timed, 27B steps, profile)
#   bash benchmarks/gpu_pending.sh part26   (each row's words of a step as one coalesced run: tests, timed, 27B steps)
#   bash benchmarks/gpu_pending.sh part27   (27B steps: shipped / GEMV word runs for Q4_K + Q6_K / Q4_K dot at 6 waves)
#   bash benchmarks/gpu_pending.sh part28   (the dot kernel's tile x waves x orientation per K type at M = 16 / 23)
#   bash benchmarks/gpu_pending.sh part29   (DFLASH24_PDL=1: GPU tests with it, the 27B steps without / with it)
#   bash benchmarks/gpu_pending.sh part30   (the dot kernel's PAIRS decode for Q4_K: GPU tests, timed, 27B steps)
#   bash benchmarks/gpu_pending.sh part31   (the PAIRS decode for Q6_K and Q5_K: GPU tests, timed at 27B shapes)
#   bash benchmarks/gpu_pending.sh part32   (the 27B steps without / with PAIRS for Q6_K)
#   bash benchmarks/gpu_pending.sh part33   (the dot kernel's tile / warps / waves for Q4_K with PAIRS, M = 16 / 23)
#   bash benchmarks/gpu_pending.sh part34   (PAIRS 3, the decode's mask and or as one lop3: tests, timed, 27B steps)
#   bash benchmarks/gpu_pending.sh part35   (the GEMV as a plain loop hidden by occupancy: configs, the 27B decode step)
#   bash benchmarks/gpu_pending.sh part36   (around part35's winners, every packed type; the 27B decode step as shipped)
#   bash benchmarks/gpu_pending.sh part37   (the 27B steps as shipped)
#   bash benchmarks/gpu_pending.sh part38   (the GEMV's 2-row tile as two one-row tiles sharing x: tests, timed, 27B step)
#   bash benchmarks/gpu_pending.sh part39   (the decode norms / silu_mul making the GEMVs' int8 x: tests, 27B step on / off)
#   bash benchmarks/gpu_pending.sh part40   (the per-kernel profile of the 27B steps as shipped)
#   bash benchmarks/gpu_pending.sh part41   (issue #2's GEMV / M = 16 numbers as shipped; the dot tile with 2-4 stages)
#   bash benchmarks/gpu_pending.sh part42   (the dot kernel as GEMV-like small programs: 1-2 warps, no cp.async ring)
#   bash benchmarks/gpu_pending.sh part43   (the dot kernel with x in pair order (XPERM): GPU tests, timed, 27B steps)
#   bash benchmarks/gpu_pending.sh part44   (Q4_K's dot tile with / without x in pair order, six 27B shapes, M = 16 / 23)
#   bash benchmarks/gpu_pending.sh part46   (the dot kernel's waves x XPERM per type at the 27B's shapes, M = 16 / 23)
#   bash benchmarks/gpu_pending.sh part47   (the norms' pair-order rows + the new dot waves: GPU tests, 27B steps on / off)
#   bash benchmarks/gpu_pending.sh part48   (which types / step sizes take the pair-order rows: 27B steps per policy)
#   bash benchmarks/gpu_pending.sh part49   (GPU tests of the pair rows as shipped; issue #2's GEMV numbers as shipped)
#   bash benchmarks/gpu_pending.sh part53   (K-split sums in the dot kernel; whole-step pair stores; runs at 4ef35f3 only: both removed)
#   bash benchmarks/gpu_pending.sh part52   (decode norm rows over several programs: GPU bits, probe_norm, 27B steps per COLS)
#   bash benchmarks/gpu_pending.sh part51   (pair rows indexed in 32 bits: GPU bits, profile and 27B steps from 2 / 17 tokens)
#   bash benchmarks/gpu_pending.sh part50   (where a 16-token verify loses 1.7 ms with pair rows: profiles, the LM head)
#   bash benchmarks/gpu_pending.sh part9    (prefill per chunk size: 512 / 1024 / 2048 / 4096, time and peak memory)
#   bash benchmarks/gpu_pending.sh part10   (per-kernel profile of decode / verify16 / a 4K prefill, then part9)
#   bash benchmarks/gpu_pending.sh part11   (bench_qwen35 with the auto prefill chunk in 24 GiB; tune_dequant.py)
#   bash benchmarks/gpu_pending.sh part12   (tune_dequant.py on the natural-order kernel; bench_qwen35 as in part11)
#   bash benchmarks/gpu_pending.sh part13   (the fused elementwise kernels: GPU tests, decode / prefill / spec steps, profile)
#   bash benchmarks/gpu_pending.sh part16   (the small-M dot kernel's W_AS_A (wgmma register operand) orientation, timed)
#   bash benchmarks/gpu_pending.sh part17   (spec steps + profile after the strided / recording recurrent kernel)
#   bash benchmarks/gpu_pending.sh part18   (the int8 tensor-core small-M kernel: GPU tests, sweep, then part19)
#   bash benchmarks/gpu_pending.sh part19   (the 27B steps with DFLASH24_SMALL_M_MATMUL=mmq)
#   bash benchmarks/gpu_pending.sh part20   (the dot kernel's W_AS_A orientation checked on the GPU: tests)
#   bash benchmarks/gpu_pending.sh part76   (the dot kernel's word tiles through TMA; 23 rows as 16-row tiles; runs at
#                                            de0ed37 only: both reverted after it, slower)
#   bash benchmarks/gpu_pending.sh part77   (a bound on the split-K sums' cost: the 27B steps without them, wrong values)
#   bash benchmarks/gpu_pending.sh part78   (split-K partials summed in the norms: GPU tests, engine smoke; part78b:
#                                            27B steps; runs at b3cbece only: reverted after it, 0.06 ms)
#   bash benchmarks/gpu_pending.sh part79   (the exact form of the Q4_K small-M matmul: GPU test, timed at M = 16 /
#                                            23; runs at 7f2ae47 only: reverted after it, no faster)
#   bash benchmarks/gpu_pending.sh part80   (loads only: the dot kernel's tiles row-major against tile-major, and a copy)
#   bash benchmarks/gpu_pending.sh part81   (GEMV and dot kernel with every byte from DRAM against from L2)
#   bash benchmarks/gpu_pending.sh part82   (the Gluon Q4_K small-M matmul: GPU tests, then against the dot kernel)
#   bash benchmarks/gpu_pending.sh part83   (the Gluon kernel in the engine: GPU tests, tile sweep, 27B steps on / off)
#   bash benchmarks/gpu_pending.sh part84   (with its tile table: GPU tests, engine smoke, 27B steps, tree budget sweep)
#   bash benchmarks/gpu_pending.sh part85   (the Gluon kernel: two accumulator chains against one; its stalls in Nsight)
#   bash benchmarks/gpu_pending.sh part86   (the Gluon kernel for Q5_K and Q6_K too: GPU tests, tiles, 27B steps)
#   bash benchmarks/gpu_pending.sh part87   (not run yet: what part86 left unmeasured; see the part)
#   bash benchmarks/gpu_pending.sh part88   (the Gluon kernel's pipeline in shared memory, against 2 stages)
#   bash benchmarks/gpu_pending.sh part89   (the Gluon kernel's stall reasons and memory traffic, Nsight Compute)
#   bash benchmarks/gpu_pending.sh part90   (the Gluon kernel's pipe utilisation, Nsight Compute)
#   bash benchmarks/gpu_pending.sh part91   (the split-K sum inside the Gluon kernel: tests, smoke, kernel times)
#   bash benchmarks/gpu_pending.sh part92   (the 27B steps and the tree budget sweep as shipped)
#   bash benchmarks/gpu_pending.sh part93   (the 27B steps: 812b80a's kernel with and without the scales' I2F / F2F)
#   bash benchmarks/gpu_pending.sh part94   (32-row weight tiles of the Gluon kernel, 5 programs an SM)
#   bash benchmarks/gpu_pending.sh part95   (the 27B steps with part94's best 32-row tiles, A B A B)
#   bash benchmarks/gpu_pending.sh part96   (a verify step's norms over several programs a row; part96b: its steps)
#   bash benchmarks/gpu_pending.sh part97   (the tree budget sweep at 8, 16, 22, 32, 64)
#   bash benchmarks/gpu_pending.sh part98   (33..96 rows on the Gluon kernel in launches of 32; the budget sweep)
#   bash benchmarks/gpu_pending.sh part113  (not run: the state after part112's removals: Gluon GPU tests, engine smoke,
#                                            27B steps; TESTS=0: without the tests)
#   bash benchmarks/gpu_pending.sh part112  (the early PDL trigger, whole-share prefetch and Gluon WG orientation: GPU
#                                            tests, 27B steps; part112b: one at a time; runs at 0c80be5 only: all
#                                            slower, removed, with part109..part111 that were written for them)
#   bash benchmarks/gpu_pending.sh part108  (run trimmed 2026-12-05 09:55: 64-row Gluon tiles, shipped from 40 rows)
#   bash benchmarks/gpu_pending.sh part107  (the DDTree build as one Triton program: tests, build times, 27B steps; on;
#                                            part107c: the build with its path-score check, the budget sweep)
#   bash benchmarks/gpu_pending.sh part106  (the DeltaNet verify kernel's 64 value columns a program, 27B steps: slower)
#   bash benchmarks/gpu_pending.sh part105  (the Gluon kernel's swapped orientation: GPU tests, kernel times; runs at
#                                            d0be0d3..845ff09 only: slower, removed)
#   bash benchmarks/gpu_pending.sh part104  (not run: part103 A B A B; part104b (run): sweep 8..64, attention, profile)
#   bash benchmarks/gpu_pending.sh part103  (split-KV attention from 64 rows a split: the 27B steps with 256 / 64)
#   bash benchmarks/gpu_pending.sh part102  (rows past M by past_mode: GPU tests, the budget sweep with / without)
#   bash benchmarks/gpu_pending.sh part129  (next on an H200: the shipped decode roofline fraction, chain and tree
#                                            steps / AR step; run 2026-12-05 19:48 on an H100; carry .whl only)
#   bash benchmarks/gpu_pending.sh part130  (next on an H200, after part129: issue #2's GEMV / M = 16 / M = 23 table
#                                            as shipped, the verify steps' own path (Gluon) included; carry .whl only)
#   bash benchmarks/gpu_pending.sh part131  (next on an H200: ffn_down GEMVs two steps ahead (kernels._GEMV_AHEAD):
#                                            GPU bits, kernel times, the 27B steps in one process; carry .whl only)
#   bash benchmarks/gpu_pending.sh part133  (the drafter's step per format on today's kernels (the Gluon verify
#                                            kernel takes Q4_K / Q6_K drafters' 16-row matmuls), then the 27B chain /
#                                            tree steps with a Q4_K and a Q8_0 drafter; carry .whl only)
#   bash benchmarks/gpu_pending.sh part132  (on an H200: part126's ffn_down L2 prefetch ahead, slower on an H100, from
#                                            the tree of c5c91ba; first `mkdir -p build/l2a && git archive c5c91ba |
#                                            tar -x -C build/l2a` here, then carry .whl and build/l2a)
#   bash benchmarks/gpu_pending.sh part128  (run 2026-12-05 19:30 on an H100, runs at 704c734 only (the code is gone:
#                                            slower): a decode step's DeltaNet recurrence + gated norm in one launch;
#                                            part128b: bench_qwen35 as shipped)
#   bash benchmarks/gpu_pending.sh part127  (run 2026-12-05 19:00 on an H100: attention v in the q / k launch
#                                            (gemv_two unsplit, shipped): tests, 27B steps A B A B, bench_qwen35)
#   bash benchmarks/gpu_pending.sh part126  (run 2026-12-05 18:50 on an H100 at c5c91ba only (the L2 prefetch code
#                                            is gone since): ffn_down GEMVs with L2 prefetch ahead / split K: tests,
#                                            kernel per config, 27B steps in one process with part125's policies;
#                                            part126b: the decode step's GEMV chain by shape; carry .whl only)
#   bash benchmarks/gpu_pending.sh part125  (run inside part126: the gate in place in verify steps, with / without
#                                            the copy's allocation: not placement)
#   bash benchmarks/gpu_pending.sh part124  (run 2026-12-05 17:05 on an H200: the attention gate in place / copied,
#                                            A B A B in one process, then bench_qwen35; part124b: the budget sweep)
#   bash benchmarks/gpu_pending.sh part123  (run 2026-12-05 16:50 on an H100: the embedding kernel, the in-place
#                                            gate, the tree conv index kernel and the deferred split-K sums (slower,
#                                            removed since), each on / off in ONE process (benchmarks/ab_steps.py))
#   bash benchmarks/gpu_pending.sh part122  (the same against build/old = 703290e, one process a run, GPU tests first)
#   bash benchmarks/gpu_pending.sh part121  (run 2026-12-05 on an H100: roofline fraction, budgets, GEMV whole on / off)
#   bash benchmarks/gpu_pending.sh part120  (the GEMV on whole steps, x in the words' layout: tests, kernel times,
#                                            27B steps new / old, carrying build/old: the tree before; part120c ran
#                                            2026-12-05 on an H100: shipped)
#   bash benchmarks/gpu_pending.sh part120b (part120 reordered: tests, the 27B steps new / old first)
#   bash benchmarks/gpu_pending.sh part119  (run 2026-12-05 on an H100: Q5_K 64-row tiles, the profile of the steps,
#                                            the budget sweep)
#   bash benchmarks/gpu_pending.sh part118  (run 2026-12-05 09:55, runs at f884dba only: the GEMV prefetch (shipped),
#                                            the one-launch DeltaNet decode and the verify norm in the speculative
#                                            kernel (both slower, removed): GPU tests, the 27B steps A B A B)
#   bash benchmarks/gpu_pending.sh part117  (runs at f884dba only: the one-launch DeltaNet decode, removed)
#   bash benchmarks/gpu_pending.sh part116  (ffn_down GEMVs with register prefetch: GPU tests, tiles, the 27B steps
#                                            A B A B; part116b: engine smoke, the GEMV chain with / without;
#                                            part116c: the 27B steps with it on ffn_down / on every GEMV, A B C A B C;
#                                            the steps and the ffn_down tiles ran 2026-12-05 09:55)
#   bash benchmarks/gpu_pending.sh part115  (runs at ebe9029 only: gemv_two and two-warp ffn_down tiles, 27B steps)
#   bash benchmarks/gpu_pending.sh part114  (runs at ccc0491 only: the stream GEMV, removed; part114b: the decode
#                                            step's GEMVs alone vs reading their bytes, by shape)
#   bash benchmarks/gpu_pending.sh part101  (rows past M: again / zeros / wrapped, kernel times and 27B steps)
#   bash benchmarks/gpu_pending.sh part100  (the Gluon kernel's rows past M not loaded: GPU tests, budget sweep; part100b:
#                                            27B steps before / after, A B A B)
#   bash benchmarks/gpu_pending.sh part99   (tree verify profiles at 16 / 17 / 23 nodes; the budget sweep around 16)
#   bash benchmarks/gpu_pending.sh part15   (the real 1.5B, carried as /root/q15.gguf: HF parity on the GPU, bench)
#   bash benchmarks/gpu_pending.sh part7s   (part7 from scratch, then chain / tree acceptance greedy vs temperature 0.7)
#   bash benchmarks/gpu_pending.sh part7b   (that drafter: AR vs chain vs tree on the shipped suites, and as Q8_0)
#   bash benchmarks/gpu_pending.sh bg PART  (PART detached in its own session, output under /root/bg_PART; it
#                                            outlives the call; `bgwait PART` (up to WAIT s) copies what it wrote)
# The 27B file (1 min to write) and the drafters live under /root and are lost when the machine idles out
# (30 s after a call): chain the parts within seconds.
# Never wait for a background job with `pgrep -f NAME` inside the same command: the shell's own command line
# contains NAME and the loop never ends (a 9-minute call was lost that way). Use `wait` on a PID.
set -u
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
M=/root/q35.gguf
S=/root/settings.py   # statements an earlier call on this machine chose (part202), run before the figure scripts
py() {          # the interpreter command of the figure functions: python3, or with_settings.py with $S's statements
  if [ -s "$S" ]; then
    printf '#!/bin/bash\nexec python3 benchmarks/with_settings.py "$(cat %s)" "$@"\n' "$S" > /tmp/py_set
    chmod +x /tmp/py_set; echo /tmp/py_set
  else echo python3; fi
}
steps_27b() {   # the 27B steps (bench_spec.py on a 24 GiB card) under each policy given: benchmarks/with_settings.py
                # statements, `pass` = as shipped, `old` = the carried tree build/old as it was; one process each,
                # the first STEPS_FIRST (1) given time to compile
  local i=0 pol d
  [ -f "$M" ] || python3 -m dflash24.synth --preset qwen35-27b --out "$M" > /dev/null 2>&1
  for pol in "$@"; do
    i=$((i + 1)); d=.
    [ "$pol" = old ] && d=build/old
    (cd $d && timeout $((i <= ${STEPS_FIRST:-1} ? 130 : 75)) python3 benchmarks/with_settings.py \
        "$([ "$pol" = old ] && echo pass || echo "$pol")" benchmarks/bench_spec.py "$M" --gpu-mem 24 --ctx 4096 \
        --iters 10 --modes ar) > "$OUT/spec$i.json" 2>> "$OUT/log.txt"
    echo "$pol rc $?"; head -n 1 "$OUT/spec$i.json" | cut -c 180-700
  done
}
gemv_bits() {   # the GPU tests of the decode GEMV and the int8 rows that feed it, timeout $1 s
  timeout "$1" python3 -m pytest -q -rf tests/test_quant_kernels.py tests/test_norm.py -k "gemv or int8 or quant_x" \
      > "$OUT/gpu_tests.txt" 2>&1
  echo "tests rc $?"; tail -2 "$OUT/gpu_tests.txt"
}
gemv_vs_old() { # tune_gemv.py at shapes $2 (timeout $1 s each) with configs $3 in this tree and $4 in build/old
  local t d cfg
  for t in new old; do
    d=.; cfg=$3; [ $t = old ] && { d=build/old; cfg=$4; }
    (cd $d && timeout "$1" python3 benchmarks/tune_gemv.py --types Q4_K,Q6_K,Q5_K --shapes "$2" --no-small-m \
        --min-ms 5 --configs "$cfg") > "$OUT/gemv_$t.json" 2>> "$OUT/log.txt"; echo "tune $t rc $?"
    python3 -c "import json,sys
for l in open(sys.argv[1]):
    r = json.loads(l)
    print(sys.argv[2], r.get('copy_GBps') or '', r.get('qtype', ''), r.get('N', ''), r.get('K', ''),
          {k[5:]: (v[0] if isinstance(v, list) else v) for k, v in r.items() if k.startswith(('int8_2', 'default'))},
          r.get('error', ''))" "$OUT/gemv_$t.json" $t 2>&1 | cut -c 1-400
  done
}
synth_bg() {    # the 27B file written in the background (its own session), touching $M.done when whole
  [ -f "$M" ] || { setsid bash -c "python3 -m dflash24.synth --preset qwen35-27b --out $M > /dev/null 2>&1 && touch $M.done" \
      < /dev/null > /dev/null 2>&1 & }
}
synth_wait() {  # wait for synth_bg's file, up to ${1:-60} x 3 s
  for _ in $(seq 1 "${1:-60}"); do [ -f "$M.done" ] && break; sleep 3; done
}
qwen35_figures() { # issue #10's figures as shipped (bench_qwen35: copy bandwidth, graphed decode / roofline, pp512,
                  # memory), timeout $1 s
  timeout "$1" $(py) benchmarks/bench_qwen35.py "$M" --gpu-mem 24 --ctx 4096 --decode-tokens 64 --prefill 512 \
      > "$OUT/qwen35.json" 2> "$OUT/qwen35.err"
  echo "qwen35 rc $?"; python3 -c "import json,sys; r=json.load(open(sys.argv[1])); print(r.get('bandwidth'),
      r.get('decode'), r.get('prefill'), r.get('memory'))" "$OUT/qwen35.json" 2>&1 | cut -c 1-1500
}
spec_figures() { # issues #3 / #4's figures as shipped (bench_spec: chain and tree steps against an AR step), timeout $1 s
  timeout "$1" $(py) benchmarks/bench_spec.py "$M" --gpu-mem 24 --ctx 4096 --iters 30 --modes ar \
      > "$OUT/spec.json" 2> "$OUT/spec.err"
  echo "spec rc $?"; tail -c 2500 "$OUT/spec.json"
}
gemv_table() {  # issue #2's table (tune_gemv at the 27B's shapes, no tile sweeps), timeout $1 s
  timeout "$1" $(py) benchmarks/tune_gemv.py --types Q4_K,Q6_K,Q5_0,Q8_0,Q5_K --min-ms 3 --configs '[]' \
      --markdown 2>&1 | tee "$OUT/tune.txt" | grep -v '^{' | cut -c 1-3000
}
attn_table() {   # bench_attention.py's per-case JSON lines in $1 (its stderr), a line each: type, case, context,
                 # us, KV GB/s, then the keys named in $2 (comma-separated: splits_us, sweep_best, ...)
  grep '^{' "$1" | python3 -c "import json,sys
for l in sys.stdin:
    r=json.loads(l); print(r['kv'], r['case'], r['context'], round(r.get('triton_us',0),1), round(r.get('triton_kv_GBps',0)),
          *[r.get(k) for k in sys.argv[1].split(',') if k], r.get('triton_error','')[:100])" "${2:-}"
}
prev_tree() {   # $2 (default /tmp/prev): a copy of the tree with the files under $1 (default .whl/prev, laid out as the
                # repository: the commit before's, where a change needs them; for part178-180 .whl/prev holds
                # `git show 415d584:dflash24/kernels/attention.py` and `...:dflash24/cache/kvquant.py`, for part191 /
                # part193 .whl/old191 holds f69944a's dflash24/kernels/attention.py)
  local src="${1:-.whl/prev}" dst="${2:-/tmp/prev}"
  [ -d "$dst" ] || { mkdir -p "$dst" && cp -r dflash24 benchmarks "$dst/" && cp -r "$src/." "$dst/"; }
}
attn_gpu_tests() {  # the GPU tests of the attention files (test_kvquant / test_attention), timeout $1 s, those
                   # matching -k "$2" (all without it), stopping at the first failure; rc and summary printed
  timeout "$1" python3 -m pytest -m gpu -q -x -p no:cacheprovider tests/test_kvquant.py tests/test_attention.py \
      ${2:+-k "$2"} > "$OUT/gpu_tests.txt" 2>&1
  echo "gpu tests rc $?"; tail -2 "$OUT/gpu_tests.txt"
}
on_h200() {     # whether this machine's GPU is an H200
  nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200
}
first_call() {  # a session's first call: the 27B file written in the background, the card's name; on an H200 part141
                # (issue #2's table and the tiles; the file then serves part141b on the same machine), elsewhere part $1
                # once the file is whole
  synth_bg
  nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv,noheader
  if on_h200; then bash "$0" part141; else synth_wait 90; bash "$0" "$1"; fi
}
gluon_table() { # bench_gluon_matmul.py's JSON lines in $1, a line each: N K M gemv_us [chunks32_us] (tile, us, err)...
  python3 -c "import json,sys
for l in open(sys.argv[1]):
    r = json.loads(l)
    print(r['N'], r['K'], r['M'], r['gemv_us'], *([r['chunks32_us']] if 'chunks32_us' in r else []),
          *[(k[6:], v['us'], v['err']) for k, v in r.items() if k.startswith('gluon_') and isinstance(v, dict)])" "$1"
}
case "${1:-part1}" in      # the 27B file, for the parts that use it (57 s to write)
part1b|part2|part2b|part2x|part262|part3|part5|part5b|part9|part10|part11|part12|part13|part14|part17|part19) [ -f "$M" ] || python3 -m dflash24.synth --preset qwen35-27b --out "$M" > /dev/null ;;
esac
case "${1:-part1}" in
part1)
  timeout 330 python3 -m pytest -m gpu -q tests/test_kvquant.py tests/test_attention.py tests/test_quant_kernels.py \
      tests/test_qwen35_gpu.py > "$OUT/gpu_tests.txt" 2>&1       # 219 of them took 200 s on 2026-12-01
  # AR == chain == tree on the GPU since the decode GEMV rounds activations to int8 (verify does not)?
  timeout 100 python3 benchmarks/gpu_engine_smoke.py > "$OUT/engine_smoke.jsonl" 2> "$OUT/engine_smoke.err"
  ;;
part1b)  # the 27B steps after the changes, and steady decode at 8K / 32K for q4_0 / tq3
  timeout 120 python3 benchmarks/bench_spec.py "$M" --gpu-mem 24 --ctx 4096 --iters 10 --modes ar > "$OUT/spec.json" 2> "$OUT/spec.err"
  for kv in q4_0 tq3; do
    timeout 110 python3 benchmarks/bench_long_context.py "$M" --kv $kv --ctx 32832 --draft-type Q8_0 --spec ar --gen 64 \
        --decode-at 8192 > "$OUT/decode_${kv}_32k.json" 2> "$OUT/decode_${kv}_32k.err"
  done
  ;;
part2)   # mode equality with the decode matmul on the verify path; decode at 128K (AR) with q4_0; the Q4_K drafter
  DFLASH24_DECODE_MATMUL=dot timeout 60 python3 benchmarks/gpu_engine_smoke.py > "$OUT/engine_smoke_dot.jsonl" \
      2> "$OUT/engine_smoke_dot.err"
  timeout 280 python3 benchmarks/bench_long_context.py "$M" --kv q4_0 --ctx 131072 --draft-type Q8_0 --spec ar --gen 64 \
      > "$OUT/long_q4_0_ar.json" 2> "$OUT/long_q4_0_ar.err"
  timeout 200 python3 benchmarks/bench_long_context.py "$M" --kv tq3 --ctx 262144 --draft-type Q4_K --prepare \
      > "$OUT/prepare.json" 2> "$OUT/prepare.err"
  ;;
part2b)  # 262,144 tokens with tq3 KV + the Q4_K drafter + token_embd on the host, tree mode (planned 22.88 GiB)
  timeout 580 python3 benchmarks/bench_long_context.py "$M" --kv tq3 --ctx 262144 --draft-type Q4_K --embed-on-host \
      --gen 8 > "$OUT/long_tq3.json" 2> "$OUT/long_tq3.err"
  ;;
part2x)  # the planner under-counted the runs without a drafter by the allocator's reserved-but-unallocated gap
         # (1.79 GiB at 131K q4_0 AR on 2026-12-01; the engine now empties the cache after loading): the same run
         # with the stage figures and the segment summary, then with expandable segments
  timeout 250 python3 benchmarks/bench_long_context.py "$M" --kv q4_0 --ctx 131072 --draft-layers 0 --spec ar --gen 16 \
      > "$OUT/long_q4_0_ar.json" 2> "$OUT/long_q4_0_ar.err"
  PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True timeout 250 python3 benchmarks/bench_long_context.py "$M" --kv q4_0 \
      --ctx 131072 --draft-layers 0 --spec ar --gen 16 > "$OUT/long_q4_0_ar_exp.json" 2> "$OUT/long_q4_0_ar_exp.err"
  ;;
part262) # part2b's run in its own process session: it outlives the call (prefill of 262K tq3 tokens takes longer
         # than one call may run); keep the machine warm with other parts, then `part262wait` collects the report
  [ -f /root/d-Q4_K.ok ] || { timeout 200 python3 benchmarks/bench_long_context.py "$M" --kv tq3 --ctx 262144 \
      --draft-type Q4_K --prepare > "$OUT/prepare.json" 2> "$OUT/prepare.err" && touch /root/d-Q4_K.ok; }
  rm -f /root/long_tq3.*
  setsid bash -c "timeout 1700 python3 benchmarks/bench_long_context.py $M --kv tq3 --ctx 262144 --draft-type Q4_K \
      --embed-on-host --gen 8 > /root/long_tq3.json 2> /root/long_tq3.err; echo \$? > /root/long_tq3.rc" \
      < /dev/null > /dev/null 2>&1 &
  ;;
bg)      # any part detached (setsid): keep the machine warm with other calls, collect with bgwait
  P=${2:?part}; rm -rf "/root/bg_$P" "/root/bg_$P.rc"; mkdir -p "/root/bg_$P"
  OUT="/root/bg_$P" setsid bash -c "bash $0 $P > /root/bg_$P/log.txt 2>&1; echo \$? > /root/bg_$P.rc" \
      < /dev/null > /dev/null 2>&1 &
  ;;
bgwait)
  P=${2:?part}
  for _ in $(seq 1 $(( ${WAIT:-540} / 5 ))); do [ -f "/root/bg_$P.rc" ] && break; sleep 5; done
  cp -r "/root/bg_$P/." "$OUT/" 2>/dev/null; cp "/root/bg_$P.rc" "$OUT/" 2>/dev/null
  nvidia-smi --query-gpu=memory.used,utilization.gpu --format=csv > "$OUT/smi.txt"
  ;;
part15)  # the real Qwen2.5-Coder-1.5B Q4_K_M (benchmarks/prepare_transfer.sh q15, 20 chunk calls into /root/q15.gguf)
  [ "$(sha256sum /root/q15.gguf | cut -d' ' -f1)" = "$(cat .chunks/q15.sha256)" ] || { echo "q15: sha256 mismatch" >&2; exit 3; }
  DFLASH24_TEST_GGUF=/root/q15.gguf python3 -m pytest -m gpu -s -q tests/test_real_model_gpu.py 2>&1 | tail -15 | tee "$OUT/parity15.txt"
  python3 -m dflash24.cli bench --model /root/q15.gguf --spec ar --suite he,gsm,math --max-tokens 256 2>&1 | tail -30 | tee "$OUT/bench15.txt"
  ;;
part7)   # the 0.5B's drafter trained on the target's own greedy answers (NP ShareGPT prompts answered 64 at a
         # time, cached in /root/gen), then MINUTES of training on the clock schedule (warmup + cosine follow the
         # time); the drafter, the log and the generated data come home as 15 MB pieces of home.tgz.
         # Continuing from an earlier session: copy its data to /root/gen (the answers are reused, NP - cached
         # more are generated) and its drafter to a directory named by INIT (e.g. /root/d05init), the
         # home.tgz contents of the last run (kept as .chunks/gen and .chunks/d05: carry them, in two calls).
  [ "$(sha256sum /root/q05.gguf | cut -d' ' -f1)" = "$(cat ${SHA:-.chunks/q05.sha256})" ] || { echo "q05.gguf incomplete"; exit 3; }
  python3 -m dflash24.cli train-draft --model /root/q05.gguf --out /root/d05 --responses target --gen-batch ${GB:-64} \
      --sharegpt ${SG:-.chunks/sharegpt4k.json} --n-prompts ${NP:-2000} --max-new-tokens ${NEW:-384} --max-len ${LEN:-768} \
      --data-dir /root/gen --feature-cache /root/fc --layers 3 --ffn 2432 --batch-size 8 --micro-batch 4 \
      --lr 6e-4 --anchors 256 --save-every 200 --minutes ${MINUTES:-10} ${INIT:+--init $INIT} > "$OUT/train.log" 2>&1
  echo "train rc $?"
  tail -c 20000 "$OUT/train.log" > /root/train_tail.log
  tar czf - -C /root d05/config.json d05/model.safetensors d05/train_log.jsonl gen train_tail.log \
      | split -b 15M - "$OUT/home.tgz."
  rm "$OUT/train.log"
  ;;
part7b)  # the trained drafter (/root/d05): AR vs chain vs tree on the shipped suites, then the same as Q8_0 GGUF
  for SPEC in chain tree; do
    timeout 170 python3 -m dflash24.cli bench --model /root/q05.gguf --draft /root/d05 --spec $SPEC \
        --suite he,gsm,math --max-tokens 256 --out "/root/bench-$SPEC" > "$OUT/bench-$SPEC.txt" 2>&1
  done
  python3 -m dflash24.cli quantize-draft /root/d05 /root/d05-q8_0.gguf --type q8_0 > /dev/null &&
  timeout 170 python3 -m dflash24.cli bench --model /root/q05.gguf --draft /root/d05-q8_0.gguf --spec chain \
      --suite he,gsm,math --max-tokens 256 --out "/root/bench-chain-q8_0" > "$OUT/bench-chain-q8_0.txt" 2>&1
  ;;
part7s)  # part7 from scratch (GB prompts answered at a time), then the drafter greedy vs sampled: chain at
         # temperature 0 and 0.7 (top_p 0.9), tree at 0.7, on 10 prompts x 128 tokens of each suite (AR beside each)
  bash "$0" part7
  for RUN in "chain 0" "chain 0.7" "tree 0.7"; do
    set -- $RUN
    timeout 150 python3 -m dflash24.cli bench --model /root/q05.gguf --draft /root/d05 --spec $1 --temperature $2 \
        --top-p 0.9 --seed 0 --suite he,gsm,math --max-tokens 128 --out "/root/bench-$1-$2" > "$OUT/bench-$1-$2.txt" 2>&1
  done
  ;;
part9)   # prefill time and added peak memory per prefill chunk size (the default 512 dequantizes every weight once
         # per 512 tokens for cuBLAS; larger chunks amortize it), 27B shape, no memory emulation
  timeout 330 python3 benchmarks/bench_qwen35.py "$M" --ctx 16384 --decode-tokens 32 --prefill 4096,13000 \
      --prefill-chunks 1024,2048,4096 > "$OUT/prefill_chunks.json" 2> "$OUT/prefill_chunks.err"
  ;;
part10)  # where a decode step, a 16-token verify and a 4K prefill go now (eager, per kernel), then part9
  timeout 200 python3 benchmarks/profile_steps.py "$M" --top 40 --ctx 8192 --prefill 4096 > "$OUT/profile.jsonl" \
      2> "$OUT/profile.err"
  bash "$0" part9
  ;;
part11)  # the auto prefill chunk in 24 GiB (decode, prefill 512 / 4K / 13K, peak), then the dequantize sweep
  timeout 200 python3 benchmarks/bench_qwen35.py "$M" --gpu-mem 24 --ctx 16384 --decode-tokens 64 \
      > "$OUT/qwen35_auto.json" 2> "$OUT/qwen35_auto.err"
  timeout 330 python3 benchmarks/tune_dequant.py --types Q4_K,Q6_K,Q8_0 > "$OUT/tune_dequant.jsonl" 2> "$OUT/tune_dequant.err"
  ;;
part12)  # the natural-order dequantize kernel: its sweep, then prefill with the auto chunk in 24 GiB
  timeout 300 python3 benchmarks/tune_dequant.py --types Q4_K,Q6_K,Q8_0 > "$OUT/tune_dequant.jsonl" 2> "$OUT/tune_dequant.err"
  timeout 200 python3 benchmarks/bench_qwen35.py "$M" --gpu-mem 24 --ctx 16384 --decode-tokens 32 \
      > "$OUT/qwen35_auto.json" 2> "$OUT/qwen35_auto.err"
  ;;
part13)  # after the fused gate/beta, add + norm and silu * mul kernels: the new kernels against their references on
         # the GPU, then decode / prefill (auto chunk, 24 GiB), the spec steps, and the per-kernel profile
  timeout 150 python3 -m pytest -q -m "gpu or not gpu" tests/test_norm.py tests/test_deltanet.py tests/test_qwen35_gpu.py \
      > "$OUT/gpu_tests.txt" 2>&1
  timeout 200 python3 benchmarks/bench_qwen35.py "$M" --gpu-mem 24 --ctx 16384 --decode-tokens 64 \
      > "$OUT/qwen35.json" 2> "$OUT/qwen35.err"
  timeout 150 python3 benchmarks/bench_spec.py "$M" --gpu-mem 24 --ctx 4096 --iters 10 > "$OUT/spec.json" 2> "$OUT/spec.err"
  timeout 150 python3 benchmarks/profile_steps.py "$M" --top 30 > "$OUT/profile.jsonl" 2> "$OUT/profile.err"
  ;;
part14)  # part13's spec steps and decode again (its spec report did not come back), silu * up fused at 17408 wide
  timeout 150 python3 benchmarks/bench_spec.py "$M" --gpu-mem 24 --ctx 4096 --iters 10 --modes ar > "$OUT/spec.json" 2> "$OUT/spec.err"
  timeout 100 python3 benchmarks/bench_qwen35.py "$M" --gpu-mem 24 --ctx 8192 --decode-tokens 64 --prefill 4096 \
      > "$OUT/qwen35.json" 2> "$OUT/qwen35.err"
  ;;
part16)  # the dot kernel's W_AS_A orientation (the decoded weight tile as the wgmma's register operand; never timed):
         # M = 16 and 23, 64 / 128 rows, 4 / 8 warps, against the shipped orientation
  for MM in 16 23; do
    timeout 200 python3 benchmarks/tune_dot.py --types Q4_K,Q6_K --m $MM --shapes 17408x5120,5120x17408 \
        --grid '{"BLOCK_N":[64,128],"G":[1,2],"num_warps":[4,8],"num_stages":[2,3],"waves":[4,8],"w_as_a":[true]}' \
        > "$OUT/tune_dot_w_as_a_m$MM.jsonl" 2> "$OUT/tune_dot_w_as_a_m$MM.err"
  done
  ;;
part17)  # the verify step after the recurrent kernel read strided q/k/v and recorded the commit's inputs itself
         # (commits after the session of 21:20): the spec steps and the per-kernel profile (4 files: all come back)
  timeout 150 python3 benchmarks/bench_spec.py "$M" --gpu-mem 24 --ctx 4096 --iters 10 --modes ar > "$OUT/spec.json" 2> "$OUT/spec.err"
  timeout 150 python3 benchmarks/profile_steps.py "$M" --top 30 > "$OUT/profile.jsonl" 2> "$OUT/profile.err"
  ;;
part18)  # the int8 tensor-core small-M kernel (mmq): GPU tests, its config sweep at M = 16 / 23 (the 27B file is
         # written meanwhile, for part19), then the 27B steps with it
  [ -f "$M" ] || python3 -m dflash24.synth --preset qwen35-27b --out "$M" > /dev/null &
  timeout 120 python3 -m pytest -q -m gpu tests/test_quant_kernels.py -k "mmq and (Q4_K or Q6_K or Q8_0)" \
      > "$OUT/gpu_tests.txt" 2>&1
  wait
  for MM in 16 23; do
    timeout 150 python3 benchmarks/tune_dot.py --kernel mmq --types Q4_K,Q6_K --m $MM --shapes 17408x5120,5120x17408 \
        --grid '{"BLOCK_N":[64,128,256],"num_warps":[4,8],"waves":[4,8]}' > "$OUT/tune_mmq_m$MM.jsonl" 2> "$OUT/tune_mmq_m$MM.err"
  done
  bash "$0" part19
  ;;
part19)  # the 27B decode / chain / tree steps with the mmq small-M kernel
  DFLASH24_SMALL_M_MATMUL=mmq timeout 200 python3 benchmarks/bench_spec.py "$M" --gpu-mem 24 --ctx 4096 --iters 10 \
      --modes ar > "$OUT/spec_mmq.json" 2> "$OUT/spec_mmq.err"
  ;;
part20)  # the dot kernel's W_AS_A orientation on real hardware: its outputs against the other orientation and the
         # reference (the tests run on the GPU when one is present), before Q6_K's _DOT_TILE flag turns it on
  timeout 200 python3 -m pytest -q -m "gpu or not gpu" tests/test_quant_kernels.py \
      -k "weights_as_first or kernel_vs_reference_gpu or mmq or split_k" > "$OUT/gpu_tests.txt" 2>&1
  ;;
part21)  # the block scales loaded as int32 words (cp.async-pipelined; kernels._load_scales WORDS) against the 1- / 2-byte
         # loads: GPU tests (both orientations), then each variant timed (GEMV and dot)
  timeout 240 python3 -m pytest -q -m "gpu or not gpu" tests/test_quant_kernels.py \
      -k "weights_as_first or kernel_vs_reference_gpu or split_k or scale_words or tiny" > "$OUT/gpu_tests.txt" 2>&1
  tail -3 "$OUT/gpu_tests.txt"
  python3 benchmarks/tune_scales.py | tee "$OUT/tune_scales.txt"
  ;;
part22)  # Q6_K with scale words and W_AS_A (the new defaults): the GPU tests, the four Q6_K variants timed, then the
         # 27B steps and the per-kernel profile (the 27B file is written meanwhile)
  [ -f "$M" ] || python3 -m dflash24.synth --preset qwen35-27b --out "$M" > /dev/null &
  timeout 150 python3 -m pytest -q -m "gpu or not gpu" tests/test_quant_kernels.py \
      -k "weights_as_first or split_k or scale_words or (kernel_vs_reference_gpu and Q6_K)" > "$OUT/gpu_tests.txt" 2>&1
  tail -2 "$OUT/gpu_tests.txt"
  python3 benchmarks/tune_scales.py --types Q6_K | tee "$OUT/tune_scales.txt"
  wait
  timeout 200 python3 benchmarks/bench_spec.py "$M" --gpu-mem 24 --ctx 4096 --iters 10 --modes ar > "$OUT/spec.json" 2> "$OUT/spec.err"
  tail -c 3000 "$OUT/spec.json"
  timeout 150 python3 benchmarks/profile_steps.py "$M" --top 30 > "$OUT/profile.jsonl" 2> "$OUT/profile.err"
  ;;
part26)  # each row's words of a step loaded as one coalesced run (cfg row_run; Nsight Compute: 78 % excessive global
         # sectors in the dot kernel's word loads): GPU tests, both ways timed at the shipped configs, the 27B steps
  [ -f "$M" ] || python3 -m dflash24.synth --preset qwen35-27b --out "$M" > /dev/null &
  timeout 100 python3 -m pytest -q tests/test_quant_kernels.py -k "row_run or kernel_vs_reference_tiny" \
      > "$OUT/gpu_tests.txt" 2>&1
  tail -2 "$OUT/gpu_tests.txt"
  python3 benchmarks/tune_scales.py --row-run | tee "$OUT/tune_row_run.txt"
  timeout 120 python3 benchmarks/tune_dot.py --types Q4_K --shapes 17408x5120,5120x17408 --grid \
      '{"BLOCK_N":[64,128],"G":[1],"num_warps":[4],"num_stages":[2],"waves":[3,4,6,8],"w_as_a":[false]}' \
      > "$OUT/tune_dot.jsonl" 2> "$OUT/tune_dot.err"; tail -1 "$OUT/tune_dot.jsonl"
  wait
  timeout 130 python3 benchmarks/bench_spec.py "$M" --gpu-mem 24 --ctx 4096 --iters 10 --modes ar > "$OUT/spec.json" 2> "$OUT/spec.err"
  tail -c 700 "$OUT/spec.json"
  ;;
part27)  # the 27B steps three ways in one call: as shipped; with the GEMV's word runs for Q4_K and Q6_K (faster on
         # their 27B shapes in tune_scales --row-run, 2026-12-02); with the Q4_K dot kernel at 6 waves (0.868x in
         # tune_dot with the word runs); and the GPU tests of the word runs first
  [ -f "$M" ] || python3 -m dflash24.synth --preset qwen35-27b --out "$M" > /dev/null &
  timeout 150 python3 -m pytest -q tests/test_quant_kernels.py -k "row_run" > "$OUT/gpu_tests.txt" 2>&1
  tail -2 "$OUT/gpu_tests.txt"
  wait
  timeout 150 python3 benchmarks/bench_spec.py "$M" --gpu-mem 24 --ctx 4096 --iters 10 --modes ar > "$OUT/spec.json" 2> "$OUT/spec.err"
  tail -c 900 "$OUT/spec.json"
  for v in gemv_run q4k_waves6; do
    timeout 150 python3 -c "import runpy, sys; import dflash24.quant.kernels as K; from gguf import GGMLQuantizationType as QT; \
K._GEMV_ROW_RUN.update({QT.Q4_K, QT.Q6_K}) if '$v' == 'gemv_run' else K._DOT_TILE.__setitem__(QT.Q4_K, (128, 6, False)); \
sys.argv = ['bench_spec.py', '$M', '--gpu-mem', '24', '--ctx', '4096', '--iters', '10', '--modes', 'ar']; \
runpy.run_path('benchmarks/bench_spec.py', run_name='__main__')" > "$OUT/spec_$v.json" 2> "$OUT/spec_$v.err"
    tail -c 900 "$OUT/spec_$v.json"
  done
  ;;
part28)  # the dot kernel's tile and waves per type again now that its word loads are coalesced (part26 found Q4_K at
         # 6 waves 0.868x the shipped 4): every K type, both orientations, M = 16 and 23
  for m in 16 23; do
    timeout 280 python3 benchmarks/tune_dot.py --types Q4_K,Q5_K,Q6_K --m $m --shapes 17408x5120,5120x17408,12288x5120 \
        --grid '{"BLOCK_N":[64,128],"G":[1],"num_warps":[4],"num_stages":[2],"waves":[4,6,8],"w_as_a":[false,true]}' \
        > "$OUT/tune_dot_m$m.jsonl" 2> "$OUT/tune_dot_m$m.err"; tail -1 "$OUT/tune_dot_m$m.jsonl"
  done
  ;;
part29)  # programmatic dependent launch (DFLASH24_PDL=1, kernels/pdl.py): the GPU tests with it on (CUDA-graph decode
         # == eager decode on the tiny qwen35, the kernels against their references), then the 27B steps without
         # and with it in the same call
  [ -f "$M" ] || python3 -m dflash24.synth --preset qwen35-27b --out "$M" > /dev/null &
  # (the first run, 2026-12-02 07:13, ran the tests as one pytest: its 200 s ran out at 53 %; two in parallel now)
  DFLASH24_PDL=1 timeout 240 python3 -m pytest -q -rf -m "gpu or not gpu" tests/test_qwen35_gpu.py tests/test_pdl.py \
      -k "gpu or graph or pdl" > "$OUT/gpu_tests_pdl.txt" 2>&1 &
  DFLASH24_PDL=1 timeout 240 python3 -m pytest -q -rf -m "gpu or not gpu" tests/test_quant_kernels.py \
      -k "tiny or real_shapes" > "$OUT/gpu_tests_pdl_quant.txt" 2>&1 &
  wait
  tail -3 "$OUT/gpu_tests_pdl.txt" "$OUT/gpu_tests_pdl_quant.txt"
  timeout 150 python3 benchmarks/bench_spec.py "$M" --gpu-mem 24 --ctx 4096 --iters 10 --modes ar > "$OUT/spec.json" 2> "$OUT/spec.err"
  tail -c 900 "$OUT/spec.json"
  DFLASH24_PDL=1 timeout 150 python3 benchmarks/bench_spec.py "$M" --gpu-mem 24 --ctx 4096 --iters 10 --modes ar \
      > "$OUT/spec_pdl.json" 2> "$OUT/spec_pdl.err"
  tail -c 900 "$OUT/spec_pdl.json"
  ;;
part30)  # the dot kernel decoding two 4-bit weights per 32-bit op (kernels._bf16_pairs, PAIRS; SASS of the Q4_K loop
         # 990 instructions a step against 1,640): its GPU tests, the kernel timed without / with it, then the 27B
         # steps without / with it for Q4_K in one call
  [ -f "$M" ] || python3 -m dflash24.synth --preset qwen35-27b --out "$M" > /dev/null &
  timeout 120 python3 -m pytest -q -rf tests/test_quant_kernels.py -k "pairs or (kernel_vs_reference_tiny and Q4_K)" \
      > "$OUT/gpu_tests.txt" 2>&1
  tail -3 "$OUT/gpu_tests.txt"
  timeout 120 python3 benchmarks/tune_scales.py --pairs --types Q4_K | tee "$OUT/tune_pairs.txt"
  wait
  timeout 150 python3 benchmarks/bench_spec.py "$M" --gpu-mem 24 --ctx 4096 --iters 10 --modes ar > "$OUT/spec.json" 2> "$OUT/spec.err"
  tail -c 900 "$OUT/spec.json"
  timeout 150 python3 -c "import runpy, sys; import dflash24.quant.kernels as K; from gguf import GGMLQuantizationType as QT; \
K._DOT_PAIRS.add(QT.Q4_K); \
sys.argv = ['bench_spec.py', '$M', '--gpu-mem', '24', '--ctx', '4096', '--iters', '10', '--modes', 'ar']; \
runpy.run_path('benchmarks/bench_spec.py', run_name='__main__')" > "$OUT/spec_pairs.json" 2> "$OUT/spec_pairs.err"
  tail -c 900 "$OUT/spec_pairs.json"
  ;;
part31)  # the PAIRS decode for Q6_K and Q5_K (nibble and high bits of fields k, k + 4 as one bf16 pair): the GPU
         # tests, then the kernel without / with it in both orientations at the 27B's Q6_K shapes (the LM head
         # included) and at Q5_K's (a Q5_K_M file's)
  timeout 120 python3 -m pytest -q -rf tests/test_quant_kernels.py -k "pairs" > "$OUT/gpu_tests.txt" 2>&1
  tail -3 "$OUT/gpu_tests.txt"
  timeout 120 python3 benchmarks/tune_scales.py --pairs --types Q6_K --shapes 17408x5120,5120x17408,248320x5120 \
      | tee "$OUT/tune_pairs_q6k.txt"
  timeout 90 python3 benchmarks/tune_scales.py --pairs --types Q5_K --shapes 17408x5120,5120x17408,12288x5120 \
      | tee "$OUT/tune_pairs_q5k.txt"
  ;;
part32)  # the 27B steps without / with the PAIRS decode for Q6_K in one call
  [ -f "$M" ] || python3 -m dflash24.synth --preset qwen35-27b --out "$M" > /dev/null
  for v in discard add; do    # spec_discard.json: Q6_K without PAIRS; spec_add.json: with it
    timeout 150 python3 -c "import runpy, sys; import dflash24.quant.kernels as K; from gguf import GGMLQuantizationType as QT; \
K._DOT_PAIRS.$v(QT.Q6_K); \
sys.argv = ['bench_spec.py', '$M', '--gpu-mem', '24', '--ctx', '4096', '--iters', '10', '--modes', 'ar']; \
runpy.run_path('benchmarks/bench_spec.py', run_name='__main__')" > "$OUT/spec_$v.json" 2> "$OUT/spec_$v.err"
    tail -c 900 "$OUT/spec_$v.json"
  done
  ;;
part33)  # the Q4_K dot kernel's tile again now that PAIRS changed its registers (SASS on sm_90, BLOCK_M 16: BLOCK_N 128
         # x 4 warps 152 registers, 128 x 8 warps 100, 64 x 4 110, 256 x 8 156): every 27B shape at M = 16 and 23
  for m in 16 23; do
    timeout 280 python3 benchmarks/tune_dot.py --types Q4_K --m $m \
        --grid '{"BLOCK_N":[64,128,256],"G":[1],"num_warps":[4,8],"num_stages":[2],"waves":[2,4,8],"w_as_a":[false]}' \
        > "$OUT/tune_dot_pairs_m$m.jsonl" 2> "$OUT/tune_dot_pairs_m$m.err"; tail -1 "$OUT/tune_dot_pairs_m$m.jsonl"
  done
  ;;
part34)  # PAIRS 3 (kernels._PAIRS_LOP3: the pair decode's mask and or as one lop3 in its asm; SASS of the Q4_K loop
         # 863 instructions a step against 990, 166 registers against 152): GPU tests, the kernel without / with it,
         # the 27B steps without / with it in one call
  [ -f "$M" ] || python3 -m dflash24.synth --preset qwen35-27b --out "$M" > /dev/null &
  timeout 100 python3 -m pytest -q -rf tests/test_quant_kernels.py -k "pairs" > "$OUT/gpu_tests.txt" 2>&1
  tail -3 "$OUT/gpu_tests.txt"
  for v in False True; do
    timeout 100 python3 -c "import runpy, sys; import dflash24.quant.kernels as K; K._PAIRS_LOP3 = $v; \
sys.argv = ['tune_scales.py', '--pairs', '--types', 'Q4_K', '--m', '16,23']; \
runpy.run_path('benchmarks/tune_scales.py', run_name='__main__')" | tee "$OUT/tune_pairs_lop3_$v.txt"
  done
  wait
  for v in False True; do
    timeout 150 python3 -c "import runpy, sys; import dflash24.quant.kernels as K; K._PAIRS_LOP3 = $v; \
sys.argv = ['bench_spec.py', '$M', '--gpu-mem', '24', '--ctx', '4096', '--iters', '10', '--modes', 'ar']; \
runpy.run_path('benchmarks/bench_spec.py', run_name='__main__')" > "$OUT/spec_lop3_$v.json" 2> "$OUT/spec_lop3_$v.err"
    tail -c 900 "$OUT/spec_lop3_$v.json"
  done
  ;;
part35)  # the GEMV as a plain loop (stages 1: no cp.async ring, no shared memory, no barrier; SASS of the Q4_K loop
         # at 1 row x 32 blocks: 86 instructions per 4 words a thread, against 220 per 8 with 2 BAR.SYNC at the shipped
         # 4 x 16 x 4 stages), hidden by occupancy: configs swept at the 27B shapes for Q4_K and Q6_K, then the 27B
         # decode step with the shipped tiles and with each type's fastest config (geometric mean over the shapes)
  [ -f "$M" ] || python3 -m dflash24.synth --preset qwen35-27b --out "$M" > /dev/null &
  timeout 240 python3 benchmarks/tune_gemv.py --types Q4_K,Q6_K --no-small-m --min-ms 10 --configs \
      '[[4,16,1,4,1],[4,32,1,3,1],[1,32,1,1,0],[1,32,1,1,1],[1,64,1,1,0],[2,32,1,1,0],[2,16,1,1,0],[1,128,1,1,0],[1,32,1,2,0],[1,64,1,2,0],[2,32,1,2,1]]' \
      > "$OUT/tune_gemv_s1.jsonl" 2> "$OUT/tune_gemv_s1.err"
  cat "$OUT/tune_gemv_s1.jsonl"
  wait
  timeout 150 python3 benchmarks/bench_spec.py "$M" --gpu-mem 24 --ctx 4096 --iters 10 --modes ar > "$OUT/spec_shipped.json" 2> "$OUT/spec_shipped.err"
  tail -c 600 "$OUT/spec_shipped.json"
  timeout 150 python3 - "$OUT/tune_gemv_s1.jsonl" "$M" > "$OUT/spec_best.json" 2> "$OUT/spec_best.err" <<'PY'
import json, math, runpy, sys
import dflash24.quant.kernels as K
from gguf import GGMLQuantizationType as QT
rows = [json.loads(ln) for ln in open(sys.argv[1]) if ln.startswith('{"qtype"')]
for name in ("Q4_K", "Q6_K"):
    times = {}
    for r in rows:
        if r["qtype"] == name:
            for key, v in r.items():
                if key.startswith("int8_") and isinstance(v, list):
                    times.setdefault(key, []).append(v[0])
    full = {k: v for k, v in times.items() if len(v) == max(map(len, times.values()))}
    best = min(full, key=lambda k: sum(map(math.log, full[k])))
    bn, rest = best[5:].split("x"); g, rest = rest.split("w"); w, st = rest.split("s")
    rr = st.endswith("r"); st = st.rstrip("r")
    K._GEMV_TILE[QT[name]] = (int(bn), int(g), int(w), int(st))
    (K._GEMV_ROW_RUN.add if rr else K._GEMV_ROW_RUN.discard)(QT[name])
    print(name, "->", best, K._GEMV_TILE[QT[name]], rr, file=sys.stderr)
sys.argv = ["bench_spec.py", sys.argv[2], "--gpu-mem", "24", "--ctx", "4096", "--iters", "10", "--modes", "ar"]
runpy.run_path("benchmarks/bench_spec.py", run_name="__main__")
PY
  cat "$OUT/spec_best.err" | grep -- "->"; tail -c 600 "$OUT/spec_best.json"
  ;;
part36)  # around part35's GEMV winners (Q4_K 2 x 32 x 1 stage, Q6_K 1 x 64 16-blocks x 1 stage with row runs): more rows
         # a program, row runs, two warps, for every packed type; then the 27B decode step as shipped
  [ -f "$M" ] || python3 -m dflash24.synth --preset qwen35-27b --out "$M" > /dev/null &
  timeout 330 python3 benchmarks/tune_gemv.py --types Q4_K,Q6_K,Q8_0,Q5_K --no-small-m --min-ms 8 --configs \
      '[[2,32,1,1,0],[4,32,1,1,0],[2,64,1,1,0],[4,16,1,1,0],[8,16,1,1,0],[2,32,1,1,1],[4,32,1,1,1],[2,32,2,1,0],[1,32,1,1,1],[2,16,1,1,1],[4,16,1,4,1],[4,32,1,3,1]]' \
      > "$OUT/tune_gemv_s1b.jsonl" 2> "$OUT/tune_gemv_s1b.err"
  cat "$OUT/tune_gemv_s1b.jsonl"
  wait
  timeout 120 python3 benchmarks/bench_spec.py "$M" --gpu-mem 24 --ctx 4096 --iters 10 --modes ar > "$OUT/spec_shipped.json" 2> "$OUT/spec_shipped.err"
  tail -c 700 "$OUT/spec_shipped.json"
  ;;
part37)  # the 27B steps as shipped (the GEMV tiles of part36)
  [ -f "$M" ] || python3 -m dflash24.synth --preset qwen35-27b --out "$M" > /dev/null
  timeout 150 python3 benchmarks/bench_spec.py "$M" --gpu-mem 24 --ctx 4096 --iters 10 --modes ar > "$OUT/spec.json" 2> "$OUT/spec.err"
  tail -c 900 "$OUT/spec.json"
  ;;
part38)  # the GEMV's 2-row tile as two one-row tiles sharing x (kernels ROW_PAIR; SASS of the Q4_K loop 148 instructions a
         # step against 178, no shuffles; Q6_K 252 against 322): GPU tests, the kernel with / without at the 27B
         # shapes for every type, then the 27B decode step shipped / with it for Q4_K and Q6_K
  [ -f "$M" ] || python3 -m dflash24.synth --preset qwen35-27b --out "$M" > /dev/null &
  timeout 120 python3 -m pytest -q -rf tests/test_quant_kernels.py -k "row_pair" > "$OUT/gpu_tests.txt" 2>&1
  tail -3 "$OUT/gpu_tests.txt"
  timeout 240 python3 benchmarks/tune_gemv.py --types Q4_K,Q6_K,Q8_0,Q4_0,Q5_0 --no-small-m --min-ms 8 --configs \
      '[[2,32,1,1,1,0],[2,32,1,1,1,1],[2,32,1,1,0,1],[2,64,1,1,1,1]]' > "$OUT/tune_gemv_pair.jsonl" 2> "$OUT/tune_gemv_pair.err"
  cat "$OUT/tune_gemv_pair.jsonl"
  wait
  for v in discard update; do  # spec_discard: shipped; spec_update: ROW_PAIR for Q4_K, Q6_K
    timeout 120 python3 -c "import runpy, sys; import dflash24.quant.kernels as K; from gguf import GGMLQuantizationType as QT; \
K._GEMV_ROW_PAIR.$v({QT.Q4_K, QT.Q6_K}) if '$v' == 'update' else None; \
sys.argv = ['bench_spec.py', '$M', '--gpu-mem', '24', '--ctx', '4096', '--iters', '10', '--modes', 'ar']; \
runpy.run_path('benchmarks/bench_spec.py', run_name='__main__')" > "$OUT/spec_$v.json" 2> "$OUT/spec_$v.err"
    tail -c 700 "$OUT/spec_$v.json"
  done
  ;;
part39)  # the decode step's norms and silu_mul round their output to the GEMVs' int8 activations (kernels/norm.py
         # INT8: no quantize_x launch per GEMV, 313 of them on the 27B): GPU tests, the 27B steps with it on / off.
         # (Run at 15:20 on 2026-12-02 with 16 blocks a pass: decode 7.86 ms against ~6.5; and with split K summed by
         # each tile's last program: verify16 15.85 -> 20.02 ms, that code since removed.)
  [ -f "$M" ] || python3 -m dflash24.synth --preset qwen35-27b --out "$M" > /dev/null &
  timeout 100 python3 -m pytest -q -rf tests/test_norm.py tests/test_qwen35_gpu.py -k "int8" > "$OUT/gpu_tests.txt" 2>&1
  tail -3 "$OUT/gpu_tests.txt"
  wait
  for v in 1 0; do
    DFLASH24_NORM_INT8=$v timeout 120 python3 benchmarks/bench_spec.py "$M" --gpu-mem 24 --ctx 4096 --iters 10 \
        --modes ar > "$OUT/spec_int8_$v.json" 2> "$OUT/spec_int8_$v.err"
    echo "rc $?"; tail -c 700 "$OUT/spec_int8_$v.json"
  done
  ;;
part41)  # issue #2's kernel numbers as shipped (ROW_PAIR GEMVs): each GEMV type at the 27B shapes as a share of copy
         # bandwidth, and the M = 16 / 23 dot kernel over the GEMV on the same weights; then the dot kernel's tile
         # with 2-4 stages for Q4_K at M = 16 (part33's sweep, never run, with stages)
  timeout 200 python3 benchmarks/tune_gemv.py --types Q4_K,Q6_K,Q5_K,Q8_0 --min-ms 5 --configs '[[2,32,1,1,1,1]]' \
      > "$OUT/tune_gemv_shipped.jsonl" 2> "$OUT/tune_gemv_shipped.err"
  cat "$OUT/tune_gemv_shipped.jsonl"
  timeout 330 python3 benchmarks/tune_dot.py --types Q4_K --m 16 --shapes 17408x5120,5120x17408 \
      --grid '{"BLOCK_N":[64,128],"G":[1],"num_warps":[4,8],"num_stages":[2,3,4],"waves":[4,8],"w_as_a":[false]}' \
      > "$OUT/tune_dot_stages.jsonl" 2> "$OUT/tune_dot_stages.err"; tail -1 "$OUT/tune_dot_stages.jsonl"
  ;;
part42)  # the dot kernel with the GEMV's recipe: small programs (1-2 warps, 16-64 rows), a plain loop or 2 stages,
         # many programs per SM to hide latency; Q4_K then Q6_K (with / without W_AS_A) at M = 16
  timeout 260 python3 benchmarks/tune_dot.py --types Q4_K --m 16 --shapes 17408x5120,5120x17408 --min-ms 2 \
      --grid '{"BLOCK_N":[16,32,64,128],"G":[1],"num_warps":[1,2,4],"num_stages":[1,2],"waves":[4,16],"w_as_a":[false]}' \
      > "$OUT/tune_dot_small_q4k.jsonl" 2> "$OUT/tune_dot_small_q4k.err"; cat "$OUT/tune_dot_small_q4k.jsonl"
  timeout 250 python3 benchmarks/tune_dot.py --types Q6_K --m 16 --shapes 17408x5120,5120x17408 --min-ms 2 \
      --grid '{"BLOCK_N":[16,32,64],"G":[1],"num_warps":[1,2],"num_stages":[1,2],"waves":[4,16],"w_as_a":[false,true]}' \
      > "$OUT/tune_dot_small_q6k.jsonl" 2> "$OUT/tune_dot_small_q6k.err"; cat "$OUT/tune_dot_small_q6k.jsonl"
  ;;
part43)  # XPERM: x in pair order, so neither operand of a pair's dot is permuted in registers
  timeout 120 python3 -m pytest -m gpu -q tests/test_quant_kernels.py -k "pair_order or bf16_pairs" > "$OUT/gpu_tests.txt" 2>&1
  tail -3 "$OUT/gpu_tests.txt"
  timeout 300 python3 benchmarks/probe_xperm.py > "$OUT/probe_xperm.jsonl" 2> "$OUT/probe_xperm.err"
  cat "$OUT/probe_xperm.jsonl"; tail -3 "$OUT/probe_xperm.err"
  ;;
part44)  # Q4_K's dot tile with and without XPERM at every Q4_K shape of the 27B, M = 16 then 23
  for m in 16 23; do
    timeout 250 python3 benchmarks/tune_dot.py --types Q4_K --m $m --min-ms 2 \
        --shapes 17408x5120,5120x17408,12288x5120,10240x5120,6144x5120,5120x6144 \
        --grid '{"BLOCK_N":[32,64,128],"G":[1],"num_warps":[2,4],"num_stages":[2],"waves":[2,4,8],"w_as_a":[false],"xperm":[false,true]}' \
        > "$OUT/tune_dot_xperm_$m.jsonl" 2> "$OUT/tune_dot_xperm_$m.err"; cat "$OUT/tune_dot_xperm_$m.jsonl"
  done
  ;;
part46)  # the dot kernel's waves x XPERM per type at the shapes each type has in the 27B Q4_K_M file, M = 16 then 23
         # (its first form, part45, ran before tune_dot's xperm axis reached the kernel: removed)
  for m in 16 23; do
    timeout 100 python3 benchmarks/tune_dot.py --types Q4_K --m $m --min-ms 2 \
        --shapes 17408x5120,5120x17408,12288x5120,6144x5120,5120x6144,1024x5120 \
        --grid '{"BLOCK_N":[128],"G":[1],"num_warps":[4],"num_stages":[2],"waves":[1,2,3],"w_as_a":[false],"xperm":[false,true]}' \
        > "$OUT/x_q4k_$m.jsonl" 2> "$OUT/x_q4k_$m.err"
    timeout 100 python3 benchmarks/tune_dot.py --types Q6_K --m $m --min-ms 2 --shapes 5120x17408,1024x5120 \
        --grid '{"BLOCK_N":[64],"G":[1],"num_warps":[4],"num_stages":[2],"waves":[1,2,4,8],"w_as_a":[true],"xperm":[false,true]}' \
        > "$OUT/x_q6k_$m.jsonl" 2> "$OUT/x_q6k_$m.err"
    timeout 100 python3 benchmarks/tune_dot.py --types Q5_K --m $m --min-ms 2 --shapes 10240x5120 \
        --grid '{"BLOCK_N":[64],"G":[1],"num_warps":[4],"num_stages":[2],"waves":[1,2,4,8],"w_as_a":[true],"xperm":[false,true]}' \
        > "$OUT/x_q5k_$m.jsonl" 2> "$OUT/x_q5k_$m.err"
  done
  for f in "$OUT"/x_*.err; do tail -n 2 "$f"; done; python3 benchmarks/summarize_tune.py "$OUT"/x_*.jsonl
  ;;
part47)  # the verify step's norms and silu_mul writing x in the dot kernel's pair order (XPERM) and the dot waves of
         # part44-46: GPU tests, then the 27B steps with the pair rows on / off (the waves are in both)
  [ -f "$M" ] || python3 -m dflash24.synth --preset qwen35-27b --out "$M" > /dev/null &
  timeout 150 python3 -m pytest -q -rf tests/test_norm.py tests/test_quant_kernels.py tests/test_qwen35_gpu.py \
      -k "pair or dot or bf16_gpu" > "$OUT/gpu_tests.txt" 2>&1
  tail -3 "$OUT/gpu_tests.txt"
  wait
  for v in 1 0; do
    DFLASH24_NORM_PAIRS=$v timeout 120 python3 benchmarks/bench_spec.py "$M" --gpu-mem 24 --ctx 4096 --iters 10 \
        --modes ar > "$OUT/spec_pairs_$v.json" 2> "$OUT/spec_pairs_$v.err"
    echo "rc $?"; tail -c 900 "$OUT/spec_pairs_$v.json"
  done
  ;;
part48)  # part47: the pair rows cost the 16-token verify 1.7 ms and saved the 23-node tree 0.5 ms. Per policy: only
         # Q5_K / Q6_K read them; only steps of 17+ tokens (BLOCK_M 32) make them; both
  [ -f "$M" ] || python3 -m dflash24.synth --preset qwen35-27b --out "$M" > /dev/null
  i=0
  for pol in 'K.XPERM_TYPES={QT.Q5_K,QT.Q6_K}' 'K.PAIRS_FROM_TOKENS=17' 'K.XPERM_TYPES={QT.Q5_K,QT.Q6_K}; K.PAIRS_FROM_TOKENS=17'; do
    i=$((i + 1))
    timeout 120 python3 benchmarks/with_settings.py "$pol" benchmarks/bench_spec.py "$M" --gpu-mem 24 --ctx 4096 \
        --iters 10 --modes ar > "$OUT/spec_pol$i.json" 2> "$OUT/spec_pol$i.err"
    echo "$pol rc $?"; head -n 1 "$OUT/spec_pol$i.json" | cut -c 180-1000
  done
  ;;
part49)  # the pair rows as shipped (from 17 tokens): GPU bits; then part41's GEMV sweep of the shipped configs
  timeout 110 python3 -m pytest -q -rf tests/test_norm.py tests/test_quant_kernels.py tests/test_qwen35_gpu.py \
      -k "pair" > "$OUT/gpu_tests.txt" 2>&1
  tail -3 "$OUT/gpu_tests.txt"
  timeout 170 python3 benchmarks/tune_gemv.py --types Q4_K,Q6_K,Q5_K,Q8_0 --min-ms 5 --configs '[[2,32,1,1,1,1]]' \
      > "$OUT/tune_gemv_shipped.jsonl" 2> "$OUT/tune_gemv_shipped.err"
  cat "$OUT/tune_gemv_shipped.jsonl" | cut -c 1-700
  ;;
part80)  # does the small-M matmul's access pattern cap its bandwidth? Loads only, no decode, the Q4_K dot kernel's tiles
         # in the shipped row-major words and tile-major (benchmarks/probe_layout.py), against a copy of the same bytes
  timeout 200 python3 benchmarks/probe_layout.py --shapes 17408x5120,5120x17408 --splits 2,7 --stages 1,2,3 \
      > "$OUT/layout.jsonl" 2>> "$OUT/log.txt"
  echo "layout rc $?"; cat "$OUT/layout.jsonl"
  ;;
part82)  # the Gluon Q4_K small-M matmul (quant/gluon_q4k.py): its GPU tests, then per 27B shape, M = 16 / 23 and
         # tile against the shipped dot kernel and the GEMV (benchmarks/bench_gluon_matmul.py)
  timeout 200 python3 -m pytest -q -rf -m gpu tests/test_gluon_matmul.py > "$OUT/gpu_tests.txt" 2>&1
  tail -3 "$OUT/gpu_tests.txt"
  timeout 330 python3 benchmarks/bench_gluon_matmul.py > "$OUT/gluon.jsonl" 2>> "$OUT/log.txt"
  echo "bench rc $?"; cat "$OUT/gluon.jsonl"; tail -5 "$OUT/log.txt"
  ;;
part83)  # the Gluon Q4_K kernel as the engine's Q4_K verify matmul: the GPU tests it touches (the 27B file written
         # meanwhile), the tile sweep on the 27B's Q4_K shapes, then the 27B steps with it off / on (twice each)
  [ -f "$M" ] || python3 -m dflash24.synth --preset qwen35-27b --out "$M" > /dev/null 2>&1 &
  SYN=$!
  timeout 200 python3 -m pytest -q -rf -m "gpu or not gpu" tests/test_gluon_matmul.py tests/test_norm.py \
      tests/test_quant_kernels.py > "$OUT/gpu_tests.txt" 2>&1
  tail -4 "$OUT/gpu_tests.txt"
  timeout 100 python3 benchmarks/gpu_engine_smoke.py > "$OUT/engine_smoke.jsonl" 2> "$OUT/engine_smoke.err"
  echo "smoke rc $?"; cut -c 1-300 "$OUT/engine_smoke.jsonl"
  wait $SYN
  timeout 150 python3 benchmarks/bench_gluon_matmul.py > "$OUT/gluon.jsonl" 2>> "$OUT/log.txt"
  echo "bench rc $?"; cat "$OUT/gluon.jsonl" | cut -c 1-1500
  steps_27b 'K.GLUON=False' pass 'K.GLUON=False' pass
  ;;
part84)  # the Gluon Q4_K kernel with its tile table (gluon_q4k.TILE_BY_SHAPE): the GPU tests of the matmul paths and the
         # qwen35 target (the 27B file written meanwhile), the engine smoke, the 27B steps, the tree budget sweep
  [ -f "$M" ] || python3 -m dflash24.synth --preset qwen35-27b --out "$M" > /dev/null 2>&1 &
  SYN=$!
  timeout 150 python3 -m pytest -q -rf -m gpu tests/test_gluon_matmul.py tests/test_quant_kernels.py \
      tests/test_qwen35_gpu.py -k "gluon or Q4_K or graph or qwen35" > "$OUT/gpu_tests.txt" 2>&1
  tail -4 "$OUT/gpu_tests.txt"
  timeout 60 python3 -m pytest -q -rf tests/test_gluon_matmul.py -k compiles > "$OUT/compile_test.txt" 2>&1
  tail -2 "$OUT/compile_test.txt"
  wait $SYN
  timeout 100 python3 benchmarks/gpu_engine_smoke.py > "$OUT/engine_smoke.jsonl" 2> "$OUT/engine_smoke.err"
  echo "smoke rc $?"; cut -c 1-400 "$OUT/engine_smoke.jsonl"
  steps_27b pass
  timeout 150 python3 benchmarks/bench_tree_budget.py "$M" --budgets 8,16,22,31 --gpu-mem 24 \
      > "$OUT/tree_budget.json" 2>> "$OUT/log.txt"
  echo "budget rc $?"; cut -c 1-2500 "$OUT/tree_budget.json"
  ;;
part85)  # the Gluon Q4_K kernel: two accumulator chains a step (ACC2) against one at the shipped tiles and two others,
         # then where its warps stall (Nsight Compute, the stacked FFN gate + up at M = 16, one launch)
  timeout 200 python3 benchmarks/bench_gluon_matmul.py --tiles T,Ta,64x4,64x4a,128x3,128x3a > "$OUT/gluon.jsonl" \
      2>> "$OUT/log.txt"
  echo "bench rc $?"; cut -c 1-1200 "$OUT/gluon.jsonl"
  timeout 120 ncu --clock-control none -k regex:_q4k_kernel --launch-count 1 --section SpeedOfLight \
      --section Occupancy --section WarpStateStats --section SchedulerStats --section ComputeWorkloadAnalysis \
      python3 benchmarks/bench_gluon_matmul.py --shapes 34816x5120 --m 16 --tiles T --min-ms 0.2 > "$OUT/ncu.txt" 2>&1
  echo "ncu rc $?"; grep -v "^==PROF==\|^ *-\+ *$" "$OUT/ncu.txt" | tail -80 | cut -c 1-150
  ;;
part86)  # the Gluon kernel for Q5_K and Q6_K as well (quant/gluon_matmul.py): the GPU tests of the matmul paths and the
         # qwen35 target (the 27B file written meanwhile), the engine smoke, tiles for the 27B's Q5_K / Q6_K shapes, the
         # 27B steps with Q4_K alone on it, then with all three
  [ -f "$M" ] || python3 -m dflash24.synth --preset qwen35-27b --out "$M" > /dev/null 2>&1 &
  SYN=$!
  timeout 170 python3 -m pytest -q -rf -m gpu tests/test_gluon_matmul.py tests/test_quant_kernels.py \
      tests/test_qwen35_gpu.py -k "gluon or Q4_K or Q5_K or Q6_K or qwen35" > "$OUT/gpu_tests.txt" 2>&1
  tail -4 "$OUT/gpu_tests.txt"
  wait $SYN
  timeout 80 python3 benchmarks/gpu_engine_smoke.py > "$OUT/engine_smoke.jsonl" 2> "$OUT/engine_smoke.err"
  echo "smoke rc $?"; cut -c 1-400 "$OUT/engine_smoke.jsonl"
  for T in Q5_K Q6_K; do
    timeout 60 python3 benchmarks/bench_gluon_matmul.py --type $T --tiles T,Ta,64x2a,64x6a,128x2,128x4 \
        > "$OUT/gluon_$T.jsonl" 2>> "$OUT/log.txt"
    echo "bench $T rc $?"; cut -c 1-900 "$OUT/gluon_$T.jsonl"
  done
  steps_27b 'K.GLUON_TYPES={QT.Q4_K}' pass
  ;;
part88)  # the pipeline in shared memory (STAGES 3 / 4: x and the words STAGES - 1 steps ahead by cp.async, the scales
         # two steps ahead in registers) against the 2-stage kernel, every type, 16 and 32-row tiles; its GPU tests
  timeout 170 python3 -m pytest -q -rf -m gpu tests/test_gluon_matmul.py > "$OUT/gpu_tests.txt" 2>&1
  tail -3 "$OUT/gpu_tests.txt"
  G=benchmarks/bench_gluon_matmul.py
  timeout 100 python3 $G --type Q4_K --m 16 --tiles Ta,64x3as3,64x3as4,64x6as3,64x2as3,32x6as3,32x4as4,64x3as3r80 \
      > "$OUT/q4k_16.jsonl" 2>> "$OUT/log.txt"; echo "q4k16 rc $?"
  timeout 80 python3 $G --type Q4_K --m 23 --tiles T,128x2s3,64x2s3,64x2as3,64x3as3,64x4as3 \
      > "$OUT/q4k_23.jsonl" 2>> "$OUT/log.txt"; echo "q4k23 rc $?"
  for t in Q5_K Q6_K; do
    timeout 90 python3 $G --type $t --m 16,23 --tiles T,Ta,64x3as3,64x3as4,64x6as3,32x6as3,64x2as3 \
        > "$OUT/${t}.jsonl" 2>> "$OUT/log.txt"; echo "$t rc $?"
  done
  for f in q4k_16 q4k_23 Q5_K Q6_K; do python3 - "$OUT/$f.jsonl" <<'PY'
import json, sys
for line in open(sys.argv[1]):
    r = json.loads(line)
    tiles = {k[6:]: (v["us"], v["err"]) if isinstance(v, dict) else v[:60] for k, v in r.items() if k.startswith("gluon_")}
    print(r["N"], r["K"], r["M"], "gemv", r["gemv_us"], "dot", r["dot_us"], tiles)
PY
  done
  ;;
part89)  # why the Gluon kernel's warps wait: Nsight Compute stall reasons, shared-memory and L2 traffic of the FFN
         # gate + up launch (Q4_K 34816x5120, M = 16, the shipped tile)
  R='regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio'
  X='l1tex__data_pipe_lsu_wavefronts_mem_shared.sum,l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum,'
  X+='lts__t_sectors_op_read.sum,dram__bytes_read.sum,l1tex__t_bytes_pipe_lsu_mem_global_op_ld.sum,'
  X+='smsp__inst_executed.sum,sm__inst_executed_pipe_lsu.avg.pct_of_peak_sustained_active,'
  X+='l1tex__data_pipe_lsu_wavefronts_mem_shared.avg.pct_of_peak_sustained_elapsed,'
  X+='lts__t_sectors.avg.pct_of_peak_sustained_elapsed,gpu__time_duration.sum,smsp__warps_active.avg.per_cycle_active,'
  X+='smsp__issue_active.avg.pct_of_peak_sustained_active,dram__throughput.avg.pct_of_peak_sustained_elapsed'
  timeout 150 ncu --clock-control none -k regex:_kq_kernel --launch-count 1 --metrics "$R,$X" \
      python3 benchmarks/bench_gluon_matmul.py --shapes 34816x5120 --m 16 --tiles Ta --min-ms 0.2 > "$OUT/ncu.txt" 2>&1
  echo "ncu rc $?"; grep -v "^==PROF==\|^ *-\+ *$" "$OUT/ncu.txt" | grep -v " 0$\| 0.00$" | tail -60 | cut -c 1-150
  ;;
part90)  # which pipe limits the Gluon kernel (part89: math pipe throttle and dispatch stalls): per-pipe utilisation
  P='sm__inst_executed_pipe_alu.avg.pct_of_peak_sustained_active,sm__inst_executed_pipe_fma.avg.pct_of_peak_sustained_active,'
  P+='sm__inst_executed_pipe_fmaheavy.avg.pct_of_peak_sustained_active,sm__inst_executed_pipe_fp16.avg.pct_of_peak_sustained_active,'
  P+='sm__inst_executed_pipe_tensor_op_hmma.avg.pct_of_peak_sustained_active,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,'
  P+='sm__inst_executed_pipe_xu.avg.pct_of_peak_sustained_active,sm__inst_executed_pipe_lsu.avg.pct_of_peak_sustained_active,'
  P+='sm__pipe_alu_cycles_active.avg.pct_of_peak_sustained_active,sm__pipe_fma_cycles_active.avg.pct_of_peak_sustained_active,'
  P+='sm__pipe_fmaheavy_cycles_active.avg.pct_of_peak_sustained_active,sm__pipe_fp16_cycles_active.avg.pct_of_peak_sustained_active,'
  P+='sm__pipe_shared_cycles_active.avg.pct_of_peak_sustained_active,smsp__issue_active.avg.pct_of_peak_sustained_active,'
  P+='sm__inst_executed_pipe_uniform.avg.pct_of_peak_sustained_active,gpu__time_duration.sum'
  for t in Ta Tar96; do
    timeout 100 ncu --clock-control none -k regex:_kq_kernel --launch-skip 1 --launch-count 1 --metrics "$P" \
        python3 benchmarks/bench_gluon_matmul.py --shapes 34816x5120 --m 16 --tiles $t --min-ms 0.2 > "$OUT/ncu_$t.txt" 2>&1
    echo "ncu $t rc $?"; grep "pct\|usecond\|duration" "$OUT/ncu_$t.txt" | cut -c 1-150
  done
  ;;
part91)  # the split-K sum inside the Gluon kernel (the last program of a tile sums the partials: no _finish launch)
         # and its scales without the conversion unit: GPU tests, the engine smoke, kernel times of every type
  timeout 150 python3 -m pytest -q -rf -m gpu tests/test_gluon_matmul.py tests/test_qwen35_gpu.py \
      > "$OUT/gpu_tests.txt" 2>&1
  tail -3 "$OUT/gpu_tests.txt"
  timeout 120 python3 benchmarks/gpu_engine_smoke.py > "$OUT/engine_smoke.jsonl" 2> "$OUT/engine_smoke.err"
  echo "smoke rc $?"; cut -c 1-300 "$OUT/engine_smoke.jsonl"
  G=benchmarks/bench_gluon_matmul.py
  timeout 100 python3 $G --type Q4_K --tiles T,Ta,64x2a,64x4a > "$OUT/Q4_K.jsonl" 2>> "$OUT/log.txt"; echo "Q4_K rc $?"
  timeout 60 python3 $G --type Q5_K --tiles T,Ta > "$OUT/Q5_K.jsonl" 2>> "$OUT/log.txt"; echo "Q5_K rc $?"
  timeout 70 python3 $G --type Q6_K --tiles T,Ta --shapes 5120x17408,1024x5120 > "$OUT/Q6_K.jsonl" \
      2>> "$OUT/log.txt"; echo "Q6_K rc $?"
  for f in Q4_K Q5_K Q6_K; do python3 - "$OUT/$f.jsonl" <<'PY'
import json, sys
for line in open(sys.argv[1]):
    r = json.loads(line)
    t = {k[6:]: (v["us"], v["err"]) if isinstance(v, dict) else v[:80] for k, v in r.items()
         if k.startswith("gluon_") and isinstance(v, (dict, str))}
    print(r["N"], r["K"], r["M"], "gemv", r["gemv_us"], "dot", r["dot_us"], t)
PY
  done
  ;;
part94)  # (not run yet) 32-row weight tiles on the Gluon kernel's register path: 87 registers a thread for Q4_K
         # (80-91 for the three types, against 124-146 at 64 rows), so 5 programs an SM instead of 4 (part90: no pipe
         # saturated, 25 % occupancy); their GPU tests, then every type against the shipped tiles
  timeout 120 python3 -m pytest -q -rf -m gpu tests/test_gluon_matmul.py > "$OUT/gpu_tests.txt" 2>&1
  tail -3 "$OUT/gpu_tests.txt"
  for t in Q4_K Q5_K Q6_K; do
    timeout 120 python3 benchmarks/bench_gluon_matmul.py --type $t --tiles T,Ta,32x3a,32x4a,32x6a,32x8a,32x4,32x8 \
        > "$OUT/$t.jsonl" 2>> "$OUT/log.txt"; echo "$t rc $?"; cut -c 1-1500 "$OUT/$t.jsonl"
  done
  ;;
part129) # the shipped numbers of issues #10, #3 and #4 on one machine: the decode roofline fraction, then the chain and
         # tree steps against the AR step (bench_spec); carry .whl only
  [ -f "$M" ] || python3 -m dflash24.synth --preset qwen35-27b --out "$M" > /dev/null 2>&1
  echo "synth done"
  timeout 170 python3 benchmarks/bench_qwen35.py "$M" --gpu-mem 24 --ctx 4096 --decode-tokens 64 --prefill 512 \
      > "$OUT/qwen35.json" 2> "$OUT/qwen35.err"
  echo "qwen35 rc $?"; python3 -c "import json,sys; r=json.load(open(sys.argv[1])); print(r.get('bandwidth'),
      r.get('decode'), r.get('memory'))" "$OUT/qwen35.json" 2>&1 | cut -c 1-1200
  timeout 150 python3 benchmarks/bench_spec.py "$M" --gpu-mem 24 --ctx 4096 --iters 30 --modes ar \
      > "$OUT/spec.json" 2> "$OUT/spec.err"
  echo "spec rc $?"; tail -c 2500 "$OUT/spec.json"
  ;;
part131) # the ffn_down GEMVs (K 17408: 19 programs an SM) loading two steps ahead instead of one (cfg prefetch 2,
         # kernels._GEMV_AHEAD; SASS: 1.2 steps of loads in flight on average instead of 0.9 at 96 registers):
         # GPU tests (the same bits), probe_read_pattern (the same bytes read in the GEMV's order and two others),
         # the kernel at caps 80 / 96 (one step ahead) and 96 / 112 (two), then the 27B steps in one process: as
         # shipped, two ahead at 96 registers, one ahead at 96 (the control); carry .whl only
  bash "$0" part131a && bash "$0" part131b
  ;;
part142) # the norms write the dot kernel's pair orders only where a verify matmul may run it (kernels.dot_pairs_needed:
         # not where the Gluon kernel takes every type), Q4_0 / Q5_0 16-row tiles with DENORM: GPU tests, the engine
         # smoke; the 27B steps shipped / with the dot orders as before / Q4_K's ffn gate-up 64 wide at 17-32 rows
         # (policy q4k_ffn32_64 then; shipped since, the policy is now q4k_ffn32_128, the tile before),
         # in one process; carry .whl only. Then part142b on the same machine.
  synth_bg
  timeout 60 python3 -m pytest -q -m "gpu or not gpu" tests/test_norm.py 2>&1 | tail -2      # on the GPU (DEV cuda)
  timeout 120 python3 -m pytest -q -m gpu tests/test_gluon_matmul.py -k "subnormal or vs_reference" 2>&1 | tail -2
  timeout 100 python3 benchmarks/gpu_engine_smoke.py > "$OUT/engine_smoke.jsonl" 2> "$OUT/engine_smoke.err"
  echo "smoke rc $?"; cut -c 1-200 "$OUT/engine_smoke.jsonl" | tail -8
  synth_wait
  timeout 240 python3 benchmarks/ab_steps.py "$M" --gpu-mem 24 --iters 100 \
      --order new,dot_pairs,q4k_ffn32_128,new,dot_pairs,q4k_ffn32_128 2>&1 | tee "$OUT/ab.jsonl" | cut -c 1-300
  ;;
part142b) # after part142 on the same machine: where a draft step goes, BF16 and Q4_K drafters
  [ -f "$M" ] || python3 -m dflash24.synth --preset qwen35-27b --out "$M" > /dev/null 2>&1
  for t in BF16 Q4_K; do
    timeout 120 python3 benchmarks/profile_steps.py "$M" --kinds draft --draft-type $t --top 20 \
        > "$OUT/profile_draft_$t.json" 2> "$OUT/profile_draft_$t.err"
    echo "profile $t rc $?"; cut -c 1-2500 "$OUT/profile_draft_$t.json"
  done
  ;;
part144) # ran at 152c00b (H100, 2026-12-06 08:20): the verify norms / silu_mul writing only the Gluon order their
         # consumers read (layers.feeds(T, *consumers)) against both orders (all_orders) and all four (dot_pairs), in
         # one process: verify 16 10.12-10.14 / 10.25-10.27 / 10.60 ms, tree verify 23 12.86-12.87 / 12.68-12.69 /
         # 13.02-13.03 ms. The tree verify (the default mode) lost 0.19 ms: reverted, both Gluon orders kept.
  timeout 200 python3 benchmarks/ab_steps.py "$M" --gpu-mem 24 --iters 100 --order new,dot_pairs,new,dot_pairs \
      2>&1 | tee "$OUT/ab.jsonl" | cut -c 1-300
  ;;
part147) # ran at 5d51285 (H100, 2026-12-06 09:45) and after it, on the same machine, ab_steps.py alone: the split-K
         # sum kernel's loop unrolled changed nothing, 512 values a program instead of 1024 verify 16 10.26-10.29 ->
         # 10.13-10.16 ms, tree verify 23 12.70 -> 12.47-12.52; the norms' columns a program 1024 for a decode row and
         # 2048 for verify rows (shipped since), the speculative-step kernel's tiles and the Gluon waves (kept). Run
         # again, it times what those runs compared with the policies that remain (the unrolled loop is gone); .whl only
  synth_bg
  timeout 100 python3 -m pytest -q -m "gpu or not gpu" tests/test_quant_kernels.py \
      -k "split_sum or split_k_and or stream_split or bias_and_output" 2>&1 | tail -2
  synth_wait 90
  timeout 300 python3 benchmarks/ab_steps.py "$M" --gpu-mem 24 --iters 100 \
      --order new,sum1024,norm_verify1024,spec32w2,waves1.5,new,sum1024,norm_verify1024 2>&1 | tee "$OUT/ab.jsonl" \
      | cut -c 1-300
  ;;
part169) # the session of 2026-12-06 21:44's calls after the first: on an H200 part160 once (the goals' figures; then
         # this again runs part167 on the same machine), elsewhere part167; .whl only
  if on_h200 && [ ! -f /root/part160.done ]; then bash "$0" part160; touch /root/part160.done; else bash "$0" part167; fi
  ;;
part205) # Hopper's warpgroup MMA for the verify matmul (gluon_matmul `WG`, written 2026-12-08 without a GPU: compiled
         # for sm_90 with Triton 3.6 and 3.9, its layouts checked against Triton's on the CPU, never run). Only on a
         # compute capability 9.x GPU. The GPU tests first (WG against the mma.sync tiles, a CUDA graph; stop if they
         # fail, showing the first failure); then ab_steps new / wg / wg_tall / wg_r128 twice each in one process
         # (the 27B's AR, verify 16, tree verify 23; r128: the 16-row Q4_K / Q6_K tiles capped at 128 registers);
         # writes $S with the winner if it beats shipped by > 1 % and then, time left, #3 / #4's steps with it; about
         # 7-9 min; next on the same machine part203 (the goals' figures with $S), part206; .whl only
  nvidia-smi --query-gpu=name,compute_cap --format=csv,noheader
  rm -f "$S"
  SECONDS=0
  synth_bg
  timeout 200 python3 -m pytest -m gpu -q -x -p no:cacheprovider tests/test_gluon_matmul.py \
      -k "warpgroup and (graph or Q4_K or Q5_K or Q6_K)" > "$OUT/gpu_tests.txt" 2>&1     # the 27B's types
  rc=$?; echo "gpu tests rc $rc"; tail -3 "$OUT/gpu_tests.txt"
  [ $rc -eq 0 ] || { grep -m 1 -B 5 -A 40 "^_____" "$OUT/gpu_tests.txt" | cut -c 1-300; exit 1; }
  synth_wait 100
  timeout 220 python3 benchmarks/ab_steps.py "$M" --gpu-mem 24 --iters 40 \
      --order new,wg,wg_tall,wg_r128,new,wg,wg_tall,wg_r128 2>&1 | tee "$OUT/ab.jsonl" | grep '^{' | cut -c 1-300
  # $S for the figures that follow on this machine (spec_figures here, part203 / part206 next): the WG policy with
  # the least verify 16 + tree verify 23 where it beats shipped's by more than 1 %
  python3 - "$OUT/ab.jsonl" "$S" <<'PY'
import json, statistics, sys
runs = {}
for line in open(sys.argv[1]):
    if line.startswith('{"policy"'):
        r = json.loads(line)
        if r["policy"].startswith("wg") and not r.get("wg_tiles"):
            continue            # WG failed and went off: these are the mma.sync tiles' times
        runs.setdefault(r["policy"], []).append(r["verify16_ms"] + r["tree23_ms"])
med = {k: statistics.median(v) for k, v in runs.items()}
print("verify16 + tree23, median ms:", med)
every = "G.WG_TILES |= {(q, h) for q in G.TYPES for h in (16, 32, 64)}"
statements = {"wg": [every], "wg_tall": ["G.WG_TILES |= {(q, h) for q in G.TYPES for h in (32, 64)}"],
              "wg_r128": [every, "G.WG_NREG.update({(QT.Q4_K, 16): 128, (QT.Q6_K, 16): 128})"]}
best = min((k for k in med if k in statements), key=med.get, default=None)
if "new" in med and best is not None and med[best] < 0.99 * med["new"]:
    open(sys.argv[2], "w").write("import dflash24.quant.gluon_matmul as G; " + "; ".join(statements[best]))
    print("chosen:", best)
PY
  [ -s "$S" ] && { echo "settings: $(cat "$S")"; [ $SECONDS -lt 430 ] && spec_figures $((585 - SECONDS)); }
  ;;
part206) # after part205: bench_gluon_matmul for Q4_K / Q6_K / Q5_K at 16 / 23 / 48 rows, the mma.sync tiles (T)
         # against WG (Tw; Twr128 capped at 128 registers), then the tree budgets
         # 8 .. 64 as shipped and with WG (33+ nodes in one 64-row launch); about 6 min; .whl only
  nvidia-smi --query-gpu=name,compute_cap --format=csv,noheader
  [ -f "$M" ] || python3 -m dflash24.synth --preset qwen35-27b --out "$M" > /dev/null 2>&1
  for T in Q4_K Q6_K Q5_K; do
    timeout 90 python3 benchmarks/bench_gluon_matmul.py --type $T --m 16,23,48 --max-rows 64 \
        --tiles T,Tw,Twr128 > "$OUT/g_$T.jsonl" 2>&1
    echo "$T rc $?"; gluon_table "$OUT/g_$T.jsonl" 2>&1 | cut -c 1-500
  done
  WG="K.gluon_matmul.WG_TILES |= {(q, h) for q in K.gluon_matmul.TYPES for h in (16, 32, 64)}"
  for W in pass "$WG"; do                  # (with WG, 33+ rows go as one 64-row launch: kernels.gluon_launches)
    timeout 120 python3 benchmarks/with_settings.py "$W" benchmarks/bench_tree_budget.py "$M" \
        --budgets 8,16,22,32,48,64 --gpu-mem 24 2>&1 | tee -a "$OUT/budgets.jsonl" | grep '^{' | cut -c 1-300
  done
  ;;
part204) # Q4_K's 64-row tiles (trees of 33-63 nodes) with the subnormal decode, its fields read in place: still the
         # two-fma decode (168 registers, three programs an SM); subnormal: 504 instructions a step instead of 583 at
         # 178 registers (two programs an SM), or 509 capped at 168 (5 local-memory ops: a small spill; sm_90, Triton
         # 3.9, benchmarks/gluon_sass.py --m 48). bench_gluon_matmul at 40 / 48 / 63 rows on the 27B's Q4_K shapes:
         # T (as shipped), Ts, Tsr168; .whl only
  nvidia-smi --query-gpu=name --format=csv,noheader
  timeout 150 python3 benchmarks/bench_gluon_matmul.py --type Q4_K --m 40,48,63 --max-rows 64 --tiles T,Ts,Tsr168 \
      > "$OUT/g_q4k64.jsonl" 2>&1
  echo "q4k64 rc $?"; gluon_table "$OUT/g_q4k64.jsonl" 2>&1 | cut -c 1-500
  ;;
part203) # the session of 2026-12-07 23:18's second call, right after part202 on the same machine: part160 (the goals'
         # figures on an H200) with the Q4_K decode part202 chose ($S); elsewhere part185 (the same figures) where
         # part202 chose it, else part197; .whl only
  [ -s "$S" ] && echo "settings: $(cat "$S")"
  if on_h200; then bash "$0" part160; elif [ -s "$S" ]; then bash "$0" part185; else bash "$0" part197; fi
  ;;
part202) # (ran 2026-12-08 00:37 at 681daac; the fixup policies and gluon_matmul.FIXUP are removed since, the q4k_dn
         # ones folded into the shipped tiles: `two_fma_q4k` is the decode before) the Gluon matmul's changes of
         # 2026-12-07 23:30-00:05, timed: its decode as subnormal bf16 (Q4_K's fields 1 / 3
         # read in place, no shift; Q8_0's bytes as one lop3 + one fma a pair, six ops before) and its split-K sums
         # in the kernel (FIXUP: the last program of a row tile sums the partials, no `_finish` launch). The GPU
         # tests (DENORM bits == the two-fma decode's, FIXUP bits == the sum launch's; Q4_K / Q4_0 / Q8_0), then
         # ab_steps (the 27B steps, shipped against Q4_K DENORM at every height,
         # FIXUP, both), twice each in one process; then bench_gluon_matmul, Q8_0 and Q4_K tiles, DENORM off / on.
         # Writes $S (with_settings statements) for part203: the ab_steps policy with the least verify 16 + tree 23
         # where it beats shipped's by more than 1 %; Q8_0's DENORM where its tiles sum more than 2 % faster at 16
         # and at 23 rows. Then, within about 590 s in all: on an H200 the goals' figures with $S (#3 / #4's steps,
         # #10's decode), the Q8_0 / Q4_K tiles if time is left; elsewhere the tiles first, then #3 / #4's steps;
         # .whl only
  nvidia-smi --query-gpu=name --format=csv,noheader
  rm -f "$S"
  synth_bg
  SECONDS=0
  timeout 110 python3 -m pytest -m gpu -q -x -p no:cacheprovider tests/test_gluon_matmul.py \
      -k "(subnormal or split_sums) and (Q4_K or Q4_0 or Q8_0)" > "$OUT/gpu_tests.txt" 2>&1
  echo "gpu tests rc $?"; tail -2 "$OUT/gpu_tests.txt"
  synth_wait 100
  timeout 240 python3 benchmarks/ab_steps.py "$M" --gpu-mem 24 --iters 40 \
      --order new,q4k_dn,fixup,q4k_dn_fixup,q4k_dn_nocap,new,q4k_dn,fixup,q4k_dn_fixup,q4k_dn_nocap 2>&1 \
      | tee "$OUT/ab.jsonl" | grep '^{' | cut -c 1-300
  choose() {  # writes $S from ab.jsonl and g_q8.jsonl (either may be missing)
  python3 - "$OUT" "$S" <<'PY'
import json, os, statistics, sys
out, settings, chosen = sys.argv[1], sys.argv[2], []
runs = {}
for line in (open(f"{out}/ab.jsonl") if os.path.exists(f"{out}/ab.jsonl") else []):
    if line.startswith('{"policy"'):
        r = json.loads(line)
        runs.setdefault(r["policy"], []).append(r["verify16_ms"] + r["tree23_ms"])
med = {k: statistics.median(v) for k, v in runs.items()}
print("verify16 + tree23, median ms:", med)
dn = "G.DENORM_TILES |= {(QT.Q4_K, h) for h in (16, 32, 64)}; G.NREG[(QT.Q4_K, 16)] = 128"
statements = {"q4k_dn": [dn], "fixup": ["G.FIXUP = True"], "q4k_dn_fixup": [dn, "G.FIXUP = True"],
              "q4k_dn_nocap": ["G.DENORM_TILES |= {(QT.Q4_K, h) for h in (16, 32, 64)}"]}
best = min((k for k in med if k in statements), key=med.get, default=None)
if "new" in med and best is not None and med[best] < 0.99 * med["new"]:
    chosen += statements[best]
sums = {}
for line in (open(f"{out}/g_q8.jsonl") if os.path.exists(f"{out}/g_q8.jsonl") else []):
    if line.startswith("{"):
        r = json.loads(line)
        for t in ("T", "Ts"):
            v = r.get(f"gluon_{t}")
            if isinstance(v, dict):
                sums.setdefault((r["M"], t), []).append(v["us"])
tot = {k: sum(v) for k, v in sums.items()}
print("Q8_0 tiles, us summed over the shapes:", tot)
if tot and all((m, "Ts") in tot and tot[(m, "Ts")] < 0.98 * tot[(m, "T")] for m in (16, 23)):
    chosen.append("G.DENORM_TILES |= {(QT.Q8_0, h) for h in (16, 32, 64)}")
if chosen:
    open(settings, "w").write("import dflash24.quant.gluon_matmul as G; " + "; ".join(chosen))
print("chosen:", chosen)
PY
  }
  if on_h200; then
    choose; [ -s "$S" ] && echo "settings: $(cat "$S")"
    spec_figures 130
    [ $SECONDS -lt 420 ] && qwen35_figures $((570 - SECONDS))
    [ $SECONDS -lt 500 ] && { timeout $((580 - SECONDS)) python3 benchmarks/bench_gluon_matmul.py --type Q8_0 --m 16,23 \
        --tiles T,Ts > "$OUT/g_q8.jsonl" 2>&1; gluon_table "$OUT/g_q8.jsonl" 2>&1 | cut -c 1-400; }
  else
    timeout 70 python3 benchmarks/bench_gluon_matmul.py --type Q8_0 --m 16,23 --tiles T,Ts > "$OUT/g_q8.jsonl" 2>&1
    echo "q8 rc $?"; gluon_table "$OUT/g_q8.jsonl" 2>&1 | cut -c 1-400
    timeout 60 python3 benchmarks/bench_gluon_matmul.py --type Q4_K --m 16 --tiles Ta,Tasr128,Tas > "$OUT/g_q4k16.jsonl" 2>&1
    echo "q4k16 rc $?"; gluon_table "$OUT/g_q4k16.jsonl" 2>&1 | cut -c 1-400
    timeout 60 python3 benchmarks/bench_gluon_matmul.py --type Q4_K --m 23 --tiles T,Ts > "$OUT/g_q4k23.jsonl" 2>&1
    echo "q4k23 rc $?"; gluon_table "$OUT/g_q4k23.jsonl" 2>&1 | cut -c 1-400
    choose; [ -s "$S" ] && echo "settings: $(cat "$S")"
    [ $SECONDS -lt 450 ] && spec_figures $((580 - SECONDS))
  fi
  ;;
part201) # the session of 2026-12-07 20:12's calls with under 630 s of device time left: on an H200 issue #2's table
         # (gemv_table, about 200 s); elsewhere part197; .whl only
  if on_h200; then gemv_table 200; else bash "$0" part197; fi
  ;;
part200) # the session of 2026-12-07 20:12's first call: on an H200 part160 (the goals' figures, about 560 s),
         # elsewhere part197 (tq3's rotations, ~2 min; part199 ran on an H100 at 22:14); .whl only
  if on_h200; then bash "$0" part160; else bash "$0" part197; fi
  ;;
part199) # a drafter's sliding layers in rings of window + 1024 rows (the session of 2026-12-07 20:12): the GPU test of
         # the ring step (each KV type, at 3K and 131K), then the 27B drafter's block step at 4K / 32K / 131K with
         # rings and with full-length rows (RING_MARGIN past any context), BF16 and Q4_K; .whl only
  nvidia-smi --query-gpu=name --format=csv,noheader
  timeout 150 python3 -m pytest -q -m gpu tests/test_attention.py -k ring -p no:cacheprovider 2>&1 | tail -3
  for v in ring full; do
    s=""; [ "$v" = full ] && s="D.RING_MARGIN = 1 << 40"
    timeout 200 python3 benchmarks/with_settings.py "import dflash24.models.drafter as D; $s" benchmarks/bench_draft.py \
        --ctx 4096,32768,131072 --formats bf16,q4_k --iters 30 > "$OUT/draft_$v.txt" 2>&1
    echo "$v rc $?"; grep -v "^ *\[" "$OUT/draft_$v.txt" | head -60
  done
  ;;
part198) # the session of 2026-12-07 17:20's calls with under 700 s of device time left: on an H200 issue #2's table
         # (gemv_table, about 200 s), then on any card part197; .whl only
  if on_h200; then gemv_table 200; fi
  bash "$0" part197
  ;;
part197) # tq3's rotations as one `_rotate_kernel` launch each (they were 2-3 torch ops apiece): the GPU tests of the
         # tq3 / rotation cases, then the tq3 and q8_0 steps at 4K / 32K with the kernels before (.whl/old197:
         # 3854f70's dflash24/kernels/attention.py) and now, one process each, rotations timed alone; .whl only
  nvidia-smi --query-gpu=name --format=csv,noheader
  attn_gpu_tests 150 "tq3 or rotate"
  prev_tree .whl/old197 /tmp/old197
  for v in old new; do
    d=.; [ "$v" = old ] && d=/tmp/old197
    (cd "$d" && timeout 100 python3 benchmarks/probe_kv_sides.py --pairs tq3:tq3,tq3:bf16,bf16:tq3,q8_0:q8_0 \
        --ctx 4096,32768 --steps 1,16 --rotations) > "$OUT/tq3_$v.txt" 2>&1
    echo "$v rc $?"; cat "$OUT/tq3_$v.txt"
  done
  ;;
part196) # the session of 2026-12-07 17:20's first call: on an H200 part160 (the goals' figures, about 560 s),
         # elsewhere part197 (tq3's rotations in one launch each, before / after); .whl only
  if on_h200; then bash "$0" part160; else bash "$0" part197; fi
  ;;
part195) # tq3's steps carry about 24 us more than q8_0's at no rows (its chain step at 4K: 53.1 us against 22.9): K
         # and V sides alone at 4K, and the host rotations around the kernel (q for a tq3 K, the output for a tq3 V)
         # timed alone; .whl only
  nvidia-smi --query-gpu=name --format=csv,noheader
  timeout 100 python3 benchmarks/probe_kv_sides.py --pairs tq3:tq3,tq3:bf16,bf16:tq3,q8_0:q8_0 --ctx 4096 \
      --steps 1,16 --rotations 2>&1 | tee "$OUT/tq3_sides.txt"
  ;;
part194) # the session of 2026-12-07 15:01's last call (under 460 s of device time): on an H200 issue #2's table
         # (gemv_table), elsewhere where the tree steps' 32-row tiles stop winning (part192: 4K yes, 32K no) for
         # bf16 / q4_0 / q8_0 at 8K / 16K; .whl only
  if on_h200; then bash "$0" part183; exit; fi
  nvidia-smi --query-gpu=name --format=csv,noheader
  timeout 150 python3 benchmarks/bench_attention.py --kv bf16,q4_0,q8_0 --steps-at 4096,8192,16384 --no-sdpa \
      --only verify_tree --sweep --sweep-grid "M=32,64;N=32,64;W=4;S=2" > "$OUT/tree_mid.json" \
      2> "$OUT/tree_mid.err"
  echo "tree rc $?"; attn_table "$OUT/tree_mid.err" triton_config,sweep_best
  ;;
part193) # `_dequant_kernel` (a q4_0 prompt chunk's rows decoded into the dense scratch) stored through permuted
         # addresses too (296 bytes a thread spilled on sm_90; none now): the GPU tests of the attention files, then
         # q4_0 / q8_0 prefill chunks with the kernels before (/tmp/old, .whl/old191) and now, one process each; .whl
         # only
  nvidia-smi --query-gpu=name --format=csv,noheader
  attn_gpu_tests 150 "q4_0 or quantized or prefill or segment"
  prev_tree .whl/old191 /tmp/old
  for v in old new; do
    d=.; [ "$v" = old ] && d=/tmp/old
    timeout 90 python3 "$d/benchmarks/bench_prefill_attention.py" --contexts 8192,32768 --kv q4_0,q8_0 --no-sdpa \
        > "$OUT/prefill_$v.json" 2> "$OUT/prefill_$v.err"
    echo "$v rc $?"; cut -c 1-300 "$OUT/prefill_$v.json"
  done
  ;;
part192) # on an H200 part160 (the goals' figures); elsewhere the tree steps' tiles swept by kv type at 4K / 32K (the
         # shipped ones spill 272-536 bytes a thread on sm_90; 8 warps or 32-row tiles spill none), and q4_0's chain
         # step re-swept now that it spills less (part191); .whl only
  if on_h200; then bash "$0" part160; exit; fi
  nvidia-smi --query-gpu=name --format=csv,noheader
  timeout 200 python3 benchmarks/bench_attention.py --kv q4_0,q8_0,bf16,tq3 --steps-at 4096,32768 --no-sdpa \
      --only verify_tree --sweep --sweep-grid "M=32,64;N=32,64;W=4,8;S=2" > "$OUT/tree_sweep.json" \
      2> "$OUT/tree_sweep.err"
  echo "tree rc $?"; attn_table "$OUT/tree_sweep.err" triton_config,sweep_best
  timeout 80 python3 benchmarks/bench_attention.py --kv q4_0 --steps-at 4096,32768 --no-sdpa --only verify_chain \
      --sweep --sweep-grid "M=32,64;N=32,64;W=4,8;S=3" > "$OUT/chain_sweep.json" 2> "$OUT/chain_sweep.err"
  echo "chain rc $?"; attn_table "$OUT/chain_sweep.err" triton_config,sweep_best
  ;;
part191) # q4_0's chain step at 4K (94.1 us against q8_0's 22.9, the session of 2026-12-07 12:05): q loaded through
         # permuted addresses spilled 744 bytes a thread; q / the output now rearranged in registers (128-272). The
         # q4_0 GPU tests, then probe_kv_sides with the kernel before (/tmp/old: .whl/old191's attention.py over a
         # copy of the tree, `prev_tree`) and now, one process each, the old one also with --lmem-resize-to-max; then
         # bench_attention's q4_0 steps by context as now; .whl only
  nvidia-smi --query-gpu=name --format=csv,noheader
  attn_gpu_tests 120 "q4_0 or quantized"
  prev_tree .whl/old191 /tmp/old
  for v in old new; do
    d=.; [ "$v" = old ] && d=/tmp/old
    echo "== $v"
    timeout 100 python3 "$d/benchmarks/probe_kv_sides.py" --pairs q4_0:q4_0,q4_0:bf16,bf16:q4_0,q8_0:q8_0 \
        --ctx 4096,32768 --splits 8,33 2>&1 | tee "$OUT/probe_$v.txt"
  done
  echo "== old, --lmem-resize-to-max"
  timeout 40 python3 /tmp/old/benchmarks/probe_kv_sides.py --pairs q4_0:q4_0 --ctx 4096 --lmem-resize-to-max 2>&1 \
      | tee "$OUT/probe_old_lmem.txt"
  timeout 90 python3 benchmarks/bench_attention.py --kv q4_0 --steps-at 4096,32768,131072 --no-sdpa \
      > "$OUT/steps.json" 2> "$OUT/steps.err"
  echo "steps rc $?"; attn_table "$OUT/steps.err" triton_config
  ;;
part190) # q4_0's chain step at 4K costs ~70 us more than q8_0's (the session of 2026-12-07 12:05): K and V of different
         # types, one side quantized at a time, decode and chain steps at 4K / 32K, then split counts at 4K; .whl only
  nvidia-smi --query-gpu=name --format=csv,noheader
  timeout 150 python3 benchmarks/probe_kv_sides.py 2>&1 | tee "$OUT/sides.txt"
  timeout 70 python3 benchmarks/probe_kv_sides.py --pairs q4_0:q4_0,q8_0:q8_0 --steps 16 --ctx 4096 \
      --splits 1,2,4,8,16,32,64 2>&1 | tee "$OUT/splits.txt"
  # the spilling kernels' local memory: the same steps with the context's pool kept at its largest size
  timeout 90 python3 benchmarks/probe_kv_sides.py --pairs q4_0:q4_0,q8_0:q8_0,tq3:tq3 --steps 1,16 --ctx 4096,32768 \
      --splits 4,33 --lmem-resize-to-max 2>&1 | tee "$OUT/lmem.txt"
  ;;
part189) # part188 for a short budget: LONG_STEP_TILES' own GPU tests first (the 27B's chain step over 40K q8_0 / tq3
         # rows, the quantized trees), then the attention files' other GPU tests, then the chain step's time at 131K;
         # .whl only
  nvidia-smi --query-gpu=name --format=csv,noheader
  timeout 150 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_kvquant.py \
      -k "long_verify_tiles or quantized_tree" 2>&1 | tail -3
  timeout 200 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_kvquant.py tests/test_attention.py \
      -k "not long_verify_tiles and not quantized_tree" 2>&1 | tail -3
  timeout 60 python3 benchmarks/bench_attention.py --kv q8_0,tq3 --steps-at 131072 --no-sdpa --only verify_chain \
      > "$OUT/long_tiles.json" 2> "$OUT/long_tiles.err"
  echo "tiles rc $?"; attn_table "$OUT/long_tiles.err" triton_config
  ;;
part188) # LONG_STEP_TILES (a chain step over >= 32K q8_0 / tq3 rows in one 128-row tile; shipped untested on a GPU at the
         # end of the session of 2026-12-07 09:22): every GPU test of the attention files (test_gpu_long_verify_tiles
         # among them), then the verify steps as shipped at 4K / 32K / 131K; .whl only
  nvidia-smi --query-gpu=name --format=csv,noheader
  timeout 240 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_kvquant.py tests/test_attention.py 2>&1 | tail -3
  timeout 120 python3 benchmarks/bench_attention.py --kv q8_0,tq3,q4_0 --steps-at 4096,32768,131072 --no-sdpa \
      --only verify_chain > "$OUT/long_tiles.json" 2> "$OUT/long_tiles.err"
  echo "tiles rc $?"; attn_table "$OUT/long_tiles.err" triton_config
  ;;
part187) # the quantized verify / tree steps at 131K with 128-row tiles too (a tree's 23 x 6 = 138 query rows take three
         # 64-row tiles, each decoding every K / V row again; 128 rows: two): bench_attention --sweep over BLOCK_M 64 /
         # 128, BLOCK_N 32 / 64, 4 / 8 warps, 1 / 2 stages (no 27B file); .whl only
  nvidia-smi --query-gpu=name --format=csv,noheader
  timeout 420 python3 benchmarks/bench_attention.py --kv q4_0,q8_0,tq3 --steps-at 131072 --no-sdpa \
      --only verify_chain,verify_tree --sweep --sweep-grid "M=64,128;N=32,64;W=4,8;S=1,2" \
      > "$OUT/sweep_m.json" 2> "$OUT/sweep_m.err"
  echo "sweep rc $?"; attn_table "$OUT/sweep_m.err" sweep_best
  ;;
part186) # a probe for the goals' card: on an H200 part160 (the goals' figures, about 560 s), elsewhere only the card's
         # name (the call then gives the machine back); .whl only
  nvidia-smi --query-gpu=name --format=csv,noheader
  if on_h200; then bash "$0" part160; fi
  ;;
part185) # part160's figures on whatever card comes (an H100 here: the goals' procedure, not their card): issue #2's
         # table, #10's decode / roofline and pp512, #3 / #4's chain and tree steps; .whl only
  nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv,noheader
  synth_bg
  synth_wait 120
  gemv_table 160
  qwen35_figures 150
  spec_figures 130
  ;;
part184) # the session of 2026-12-07 06:48's next first call: on an H200 part160 (the goals' figures), elsewhere
         # part180's end-to-end half (part181 ran at 08:01 that session); .whl and .whl/prev
  if on_h200; then bash "$0" part160; else synth_bg; synth_wait 120; KV=q4_0 bash "$0" part179; fi
  ;;
part183) # a call with under 600 s of device time left: on an H200 issue #2's table (gemv_table: no 27B file), elsewhere
         # part181 (STEP_TILES timed, no 27B file); .whl only
  nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv,noheader
  if on_h200; then gemv_table 200; else bash "$0" part181; fi
  ;;
part182) # the session of 2026-12-07 04:07's first call: on an H200 part160 (the goals' figures), elsewhere part180;
         # .whl only
  if on_h200; then bash "$0" part160; else bash "$0" part180; fi
  ;;
part181) # STEP_TILES (attention.pick_config: the quantized steps' tiles from part178's sweeps) timed by bench_attention
         # at 32K / 131K (no 27B file), then the split counts for q4_0's 128-row decode tiles; .whl only
  nvidia-smi --query-gpu=name --format=csv,noheader
  timeout 80 python3 benchmarks/bench_attention.py --kv q8_0,q4_0,tq3 --steps-at 32768,131072 --no-sdpa \
      > "$OUT/steps_tiles.json" 2> "$OUT/steps_tiles.err"
  echo "tiles rc $?"; attn_table "$OUT/steps_tiles.err"
  timeout 60 python3 benchmarks/bench_attention.py --kv q4_0 --steps-at 131072 --no-sdpa --splits 16,32,64 \
      > "$OUT/q4_splits.json" 2> "$OUT/q4_splits.err"
  echo "q4_0 splits rc $?"; attn_table "$OUT/q4_splits.err" splits_us
  ;;
part180) # part181 once the 27B file is written (not sharing the GPU with its writer), then part179 with KV=q4_0 (the
         # tree before this session against now, end to end); .whl only
  synth_bg; synth_wait 120
  bash "$0" part181
  KV=q4_0 bash "$0" part179
  ;;
part178) # the KV rows read as 32-bit words (cache/kvquant.py: a row's scales first, then the payloads, 16-byte aligned
         # at the 27B's head dim; `_load_kv_tile` loads 4-16 values a word, and the compiler pipelines the loads with
         # cp.async; sm_90 SASS of the decode loop, 64-row tiles: q4_0 2,568 -> 1,946 instructions, q8_0 2,881 ->
         # 1,988, tq3 3,755 -> 3,094): the GPU tests, then bench_attention at 32K / 131K with the layout and loader
         # before (a copy of the tree at /tmp/prev with .whl/prev's files over it: 415d584's attention.py and
         # kvquant.py) and as now, one process each; the 27B file written in the background for part179; .whl only
  nvidia-smi --query-gpu=name --format=csv,noheader
  synth_bg
  prev_tree
  attn_gpu_tests 150
  for v in prev new; do
    d=.; [ "$v" = prev ] && d=/tmp/prev
    timeout 80 python3 "$d/benchmarks/bench_attention.py" --kv q8_0,q4_0,tq3 --steps-at 32768,131072 --no-sdpa \
        > "$OUT/steps_$v.json" 2> "$OUT/steps_$v.err"
    echo "$v rc $?"; attn_table "$OUT/steps_$v.err"
  done
  ;;
part179) # part178's layout end to end: the 27B's AR decode after a 131,072-token prompt (KV=q4_0 by default; 23.42 GiB
         # emulated, no drafter), the tree before (/tmp/prev) and now, one process each; .whl only
  synth_bg; synth_wait 120; prev_tree
  for v in new prev; do
    d=.; [ "$v" = prev ] && d=/tmp/prev
    timeout 170 python3 "$d/benchmarks/bench_long_context.py" "$M" --kv "${KV:-q4_0}" --ctx "${CTX:-131072}" \
        --draft-layers 0 --spec ar --gen 16 > "$OUT/long_$v.json" 2> "$OUT/long_$v.err"
    echo "$v rc $?"; grep '"stage"' "$OUT/long_$v.json" | cut -c 1-400; tail -1 "$OUT/long_$v.json" | cut -c 1-300
  done
  ;;
part177) # part171's 262K tq3 prompt alone (AR, no drafter, 23.42 GiB emulated) with the loader without I2F: the decode
         # after it (29.7 tok/s in part171); .whl only
  synth_bg; synth_wait 120
  timeout 300 python3 benchmarks/bench_long_context.py "$M" --kv tq3 --ctx 262144 --draft-layers 0 --spec ar --gen 16 \
      > "$OUT/long262k.json" 2> "$OUT/long262k.err"
  echo "262k rc $?"; grep '"stage"' "$OUT/long262k.json" | cut -c 1-400
  ;;
part176) # integers to floats without I2F in `_load_kv_tile` (a field OR'ed into 2^23's mantissa, one subtraction;
         # tq3's magnitude index from one XOR a word, its level by two selects): part174's GPU tests and steps
         # against the loader before (attention_prev.py = HEAD~1's), then tq3's split counts up to 256; .whl only
  bash "$0" part174
  timeout 90 python3 benchmarks/bench_attention.py --kv tq3 --steps-at 32768,131072 --no-sdpa --max-splits 256 \
      --splits 32,64,128,256 > "$OUT/tq3_splits.json" 2> "$OUT/tq3_splits.err"
  echo "tq3 splits rc $?"; attn_table "$OUT/tq3_splits.err" splits_us
  ;;
part175) # the scale loads of part174 end to end: the 27B's AR decode after a 131,072-token q4_0 prompt (23.42 GiB
         # emulated, no drafter) with the loader before (a copy of the tree at /tmp/prev with attention_prev.py as its
         # attention.py) and as shipped, one process each, then the same at 32K if the call has time (KV=tq3 CTXS=131072:
         # that cache and length only); .whl only
  synth_bg; synth_wait 120
  rm -rf /tmp/prev && mkdir -p /tmp/prev && cp -r dflash24 benchmarks /tmp/prev/ \
      && cp dflash24/kernels/attention_prev.py /tmp/prev/dflash24/kernels/attention.py
  for ctx in ${CTXS:-131072 32832}; do
    for v in new prev; do
      d=.; [ "$v" = prev ] && d=/tmp/prev
      a=(--gen 16); [ "$ctx" = 32832 ] && a=(--gen 48 --decode-at 32784)
      timeout 150 python3 "$d/benchmarks/bench_long_context.py" "$M" --kv "${KV:-q4_0}" --ctx "$ctx" --draft-layers 0 \
          --spec ar \
          "${a[@]}" > "$OUT/long${ctx}_$v.json" 2> "$OUT/long${ctx}_$v.err"
      echo "$ctx $v rc $?"; grep '"stage"' "$OUT/long${ctx}_$v.json" | cut -c 1-400; tail -1 "$OUT/long${ctx}_$v.json" | cut -c 1-300
    done
  done
  ;;
part174) # a block's scale word loaded once in `_load_kv_tile` (not once per value word: q8_0 16x, q4_0 8x, tq3 4x the
         # loads; sm_90 SASS of the decode loop, 64-row tiles: q8_0 3,836 -> 2,790 instructions and no stack spill,
         # q4_0 3,091 -> 2,701, tq3 6,970 -> 6,363): the attention GPU tests, then bench_attention decode / verify /
         # tree at 32K / 131K per quantized type with the commit before's loader (dflash24/kernels/attention_prev.py,
         # untracked: `git show HEAD~1:dflash24/kernels/attention.py`) and this one, one process each; .whl only
  nvidia-smi --query-gpu=name --format=csv,noheader
  attn_gpu_tests 120
  for mod in attention_prev attention; do
    timeout 80 python3 benchmarks/bench_attention.py --module dflash24.kernels.$mod --kv q8_0,q4_0,tq3 \
        --steps-at 32768,131072 --no-sdpa > "$OUT/steps_$mod.json" 2> "$OUT/steps_$mod.err"
    echo "$mod rc $?"; attn_table "$OUT/steps_$mod.err"
  done
  ;;
part173) # the split counts per KV type at 32K / 131K (part172's first half, alone for a call of under 250 s)
  nvidia-smi --query-gpu=name --format=csv,noheader
  timeout 150 python3 benchmarks/bench_attention.py --kv bf16,q8_0,q4_0,tq3 --steps-at 32768,131072 --no-sdpa \
      --max-splits 256 --splits 16,32,64,128,256 > "$OUT/attn_steps.json" 2> "$OUT/attn_steps.err"
  echo "steps rc $?"; attn_table "$OUT/attn_steps.err" splits_us
  ;;
part172) # decode / verify steps over a long quantized cache (the 27B at 131K: decode 65 tok/s against 148 at short
         # context; its attention reads the q4_0 rows at about 280 GB/s): bench_attention.py per KV type at 32K /
         # 131K with split counts up to 256 (MAX_SPLITS raised for the run), then a tile sweep of q4_0 at 131K; .whl only
  bash "$0" part173
  timeout 200 python3 benchmarks/bench_attention.py --kv q4_0,q8_0 --steps-at 131072 --no-sdpa --max-splits 256 \
      --sweep > "$OUT/attn_sweep.json" 2> "$OUT/attn_sweep.err"
  echo "sweep rc $?"; attn_table "$OUT/attn_sweep.err" sweep_best
  ;;
part171) # the engine in every mode on the GPU, then a 262K tq3 prompt (AR, no drafter, 23.42 GiB emulated) with the
         # segmented prefill attention; right after part170 on the same machine (the 27B file there); .whl only
  synth_bg; synth_wait 120
  timeout 100 python3 benchmarks/gpu_engine_smoke.py > "$OUT/engine_smoke.jsonl" 2> "$OUT/engine_smoke.err"
  echo "smoke rc $?"; cut -c 1-250 "$OUT/engine_smoke.jsonl" | tail -8
  timeout 400 python3 benchmarks/bench_long_context.py "$M" --kv tq3 --ctx 262144 --draft-layers 0 --spec ar --gen 16 \
      > "$OUT/long262k.json" 2> "$OUT/long262k.err"
  echo "262k rc $?"; grep '"stage"' "$OUT/long262k.json" | cut -c 1-400
  ;;
part170) # part167's 32K prompt (its call timed out on the first run and took the wrong A/B), then part168; .whl only
  synth_bg; synth_wait 120
  for v in new prev; do
    S=pass; [ "$v" = prev ] && S='import dflash24.kernels.attention as A; A.SEGMENT_ROWS = 0'
    timeout 130 python3 benchmarks/with_settings.py "$S" benchmarks/bench_long_context.py "$M" --kv q4_0 --ctx 32832 \
        --draft-layers 0 --spec ar --gen 48 --decode-at 32784 > "$OUT/long32k_$v.json" 2> "$OUT/long32k_$v.err"
    echo "$v rc $?"; grep '"stage": "long"' "$OUT/long32k_$v.json" | cut -c 1-400
    tail -1 "$OUT/long32k_$v.json" | cut -c 1-300
  done
  bash "$0" part168
  ;;
part167) # a quantized prefill chunk's rows decoded a segment at a time into a dense scratch, the dense kernel going
         # on from the partials of the segment before (kernels/attention.py SEGMENT_ROWS): the GPU tests of the
         # attention; bench_prefill_attention at 8K / 32K / 131K against the quantized tiles (--segments 0) and
         # other segment sizes; the 27B prefilling a 32K q4_0 prompt (AR, 23.42 GiB emulated, then warm) with this
         # and with the quantized tiles (SEGMENT_ROWS = 0); .whl only
  synth_bg
  nvidia-smi --query-gpu=name --format=csv,noheader
  timeout 150 python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_kvquant.py tests/test_attention.py \
      > "$OUT/gpu_tests.txt" 2>&1
  echo "gpu tests rc $?"; tail -4 "$OUT/gpu_tests.txt"
  timeout 100 python3 benchmarks/bench_prefill_attention.py --contexts 8192,32768,131072 --kv bf16,q8_0,q4_0,tq3 \
      --segments 0,8192,32768 --no-sdpa 2>&1 | tee "$OUT/prefill_attention.jsonl" | cut -c 1-600
  synth_wait 120
  for v in new prev; do
    S=pass; [ "$v" = prev ] && S='import dflash24.kernels.attention as A; A.SEGMENT_ROWS = 0'
    timeout 130 python3 benchmarks/with_settings.py "$S" benchmarks/bench_long_context.py "$M" --kv q4_0 --ctx 32832 --draft-layers 0 --spec ar \
        --gen 48 --decode-at 32784 > "$OUT/long32k_$v.json" 2> "$OUT/long32k_$v.err"
    echo "$v rc $?"; grep '"stage": "long"' "$OUT/long32k_$v.json" | cut -c 1-400
    tail -1 "$OUT/long32k_$v.json" | python3 -c "import json,sys; r=json.loads(sys.stdin.read()); print('warm',
        r.get('decode_at_32784'), r.get('memory', {}).get('measured_peak_GiB'))" 2>&1 | cut -c 1-400
  done
  ;;
part168) # right after part167 on the same machine (the 27B file there): a 131K q4_0 prompt (AR, no drafter, 23.42
         # GiB emulated) with the segments and with the quantized tiles (SEGMENT_ROWS = 0); .whl only
  synth_bg; synth_wait 120
  for v in new prev; do
    S=pass; [ "$v" = prev ] && S='import dflash24.kernels.attention as A; A.SEGMENT_ROWS = 0'
    timeout 250 python3 benchmarks/with_settings.py "$S" benchmarks/bench_long_context.py "$M" --kv q4_0 --ctx 131072 --draft-layers 0 --spec ar \
        --gen 16 > "$OUT/long131k_$v.json" 2> "$OUT/long131k_$v.err"
    echo "$v rc $?"; grep '"stage": "long"' "$OUT/long131k_$v.json" | cut -c 1-400
    tail -1 "$OUT/long131k_$v.json" | cut -c 1-300
  done
  ;;
part166) # the session of 2026-12-06 21:44's first call: on an H200 part160 (the goals' figures), elsewhere part165; .whl only
  nvidia-smi --query-gpu=name --format=csv,noheader
  if on_h200; then bash "$0" part160; else bash "$0" part165; fi
  ;;
part165) # attention over a quantized KV cache from 16-bit words and the prefill chunks' 128-row tiles:
         # bench_prefill_attention at 131K as shipped; the 27B prefilling a 32K prompt with q4_0 KV (AR, no
         # drafter, 23.42 GiB emulated; then again, warm) with this attention and with the commit before (the copy in
         # dflash24/kernels/attention_prev.py, untracked, swapped in: first run here
         # `git show 903b247:dflash24/kernels/attention.py > dflash24/kernels/attention_prev.py`); .whl only
  synth_bg
  nvidia-smi --query-gpu=name --format=csv,noheader
  timeout 40 python3 benchmarks/bench_prefill_attention.py --contexts 131072 --kv q8_0,q4_0 --no-sdpa 2>&1 \
      | tee "$OUT/prefill_attention.jsonl" | cut -c 1-300
  synth_wait 120
  for v in new prev; do
    [ "$v" = prev ] && cp dflash24/kernels/attention_prev.py dflash24/kernels/attention.py
    timeout 80 python3 benchmarks/bench_long_context.py "$M" --kv q4_0 --ctx 32832 --draft-layers 0 --spec ar \
        --gen 48 --decode-at 32784 > "$OUT/long32k_$v.json" 2> "$OUT/long32k_$v.err"
    echo "$v rc $?"; grep '"stage": "long"' "$OUT/long32k_$v.json" | cut -c 1-400
    tail -1 "$OUT/long32k_$v.json" | python3 -c "import json,sys; r=json.loads(sys.stdin.read()); print('warm',
        r.get('decode_at_32784'), r.get('memory', {}).get('measured_peak_GiB'))" 2>&1 | cut -c 1-400
  done
  git checkout dflash24/kernels/attention.py 2>/dev/null
  ;;
part164) # the session of 2026-12-06 19:07's first call: on an H200 part160 (the goals' figures); elsewhere every GPU
         # test at this commit (a regression check: the last full run was several sessions ago) and the engine in
         # every mode on the GPU; .whl only
  nvidia-smi --query-gpu=name --format=csv,noheader
  if on_h200; then bash "$0" part160; exit; fi
  timeout 420 python3 -m pytest -m gpu -q -p no:cacheprovider tests/ > "$OUT/gpu_tests.txt" 2>&1
  echo "gpu tests rc $?"; tail -25 "$OUT/gpu_tests.txt"
  timeout 100 python3 benchmarks/gpu_engine_smoke.py > "$OUT/engine_smoke.jsonl" 2> "$OUT/engine_smoke.err"
  echo "smoke rc $?"; cut -c 1-200 "$OUT/engine_smoke.jsonl" | tail -8
  ;;
part163) # the session of 16:49's last call (about 360 s of device time left): on an H200 issue #10's figures (the 27B
         # file, then bench_qwen35), elsewhere part162; .whl only
  if on_h200; then synth_bg; synth_wait 120; qwen35_figures 150; else bash "$0" part162; fi
  ;;
part162) # AR mode's own prefill tiles (engine.AR_TILE: a 16-token chain step, where the plan leaves 1 GiB free): the
         # engine in every mode on the GPU; bench_prefill --spec ar on the 27B at 16-128 tokens, tiles / eager in one
         # process, and the device memory it ends with against a process with DFLASH24_TILE_PREFILL_MAX=0; .whl only
  synth_bg
  nvidia-smi --query-gpu=name --format=csv,noheader
  timeout 100 python3 benchmarks/gpu_engine_smoke.py > "$OUT/engine_smoke.jsonl" 2> "$OUT/engine_smoke.err"
  echo "smoke rc $?"; cut -c 1-250 "$OUT/engine_smoke.jsonl" | tail -8
  synth_wait 120
  timeout 150 python3 benchmarks/bench_prefill.py "$M" --gpu-mem 24 --ctx 4096 --tokens 16,64,128 --reps 5 --spec ar \
      --settings 'R.TILE_PREFILL_MAX = 0' 2>&1 | tee "$OUT/prefill_ar.jsonl" | grep '^{' | cut -c 1-260
  DFLASH24_TILE_PREFILL_MAX=0 timeout 100 python3 benchmarks/bench_prefill.py "$M" --gpu-mem 24 --ctx 4096 \
      --tokens 16,64,128 --reps 5 --spec ar 2>&1 | tee "$OUT/prefill_ar_off.jsonl" | grep '^{' | cut -c 1-260
  ;;
part161) # short prompts prefilled as replays of the verify step (runner.TILE_PREFILL_MAX; a tree of budget + 1 nodes
         # laid out as a chain, or the chain block): the GPU tests of the path and the engine in every mode; then
         # bench_prefill on the 27B with a random 5-layer drafter at 16-512 tokens: tree mode as shipped (tiles up
         # to 128 tokens), in eager chunks, with tiles up to 256 (where the two cross), in one process; chain mode as
         # shipped. (Its first run, at the tiles' first form, a 16 / 32-row graph of their own, is in BENCHMARKS.md.)
         # .whl only
  synth_bg
  nvidia-smi --query-gpu=name --format=csv,noheader
  timeout 150 python3 -m pytest -q -m "gpu or not gpu" tests/test_qwen35_gpu.py tests/test_prefill_tiles.py \
      -k "tile or graph_decode" 2>&1 | tail -3
  timeout 100 python3 benchmarks/gpu_engine_smoke.py > "$OUT/engine_smoke.jsonl" 2> "$OUT/engine_smoke.err"
  echo "smoke rc $?"; cut -c 1-200 "$OUT/engine_smoke.jsonl" | tail -8
  synth_wait 120
  timeout 240 python3 benchmarks/bench_prefill.py "$M" --gpu-mem 24 --ctx 8192 --tokens 16,32,48,64,96,128,192,256,512 \
      --reps 5 --settings 'R.TILE_PREFILL_MAX = 0' --settings 'R.TILE_PREFILL_MAX = 256' 2>&1 \
      | tee "$OUT/prefill.jsonl" | grep '^{' | cut -c 1-260
  timeout 120 python3 benchmarks/bench_prefill.py "$M" --gpu-mem 24 --ctx 8192 --tokens 16,64,128 --reps 5 --spec chain \
      2>&1 | tee "$OUT/prefill_chain.jsonl" | grep '^{' | cut -c 1-260
  ;;
part160) # the goals' figures on an H200, in one call: issue #2's table (tune_gemv, no tile sweeps), #10 (bench_qwen35:
         # decode / roofline, pp512), #3 / #4 (bench_spec); the 27B file written first. Elsewhere part177 (the
         # 262K tq3 decode; part176 ran here in the session of 2026-12-07 00:17); .whl only
  nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv,noheader
  if ! on_h200; then bash "$0" part177; exit; fi
  synth_bg
  synth_wait 120          # written first: the GEMV timings below would share the GPU with it
  gemv_table 160
  qwen35_figures 150
  spec_figures 130
  ;;
part159) # the drafter's norms and silu_mul writing the rows its packed matmuls read (drafter.FEED_PACKED; a Q4_K
         # drafter's step had 36 permuting copies, 101 of 1,296 us, part150): bench_draft.py q4_k at ctx 4096, off /
         # on (a process each; no 27B file); .whl only
  nvidia-smi --query-gpu=name --format=csv,noheader
  for v in off on; do
    S=pass; [ "$v" = off ] && S='import dflash24.models.drafter as dr; dr.FEED_PACKED = False'
    echo "FEED_PACKED $v"
    timeout 100 python3 benchmarks/with_settings.py "$S" benchmarks/bench_draft.py --ctx 4096 --iters 50 \
        --formats q4_k 2>&1 | tee -a "$OUT/draft_$v.jsonl" | grep '^{' | cut -c 1-700
  done
  ;;
part158) # on an H200 part152 (then part152b on the same machine); elsewhere issue #4's budget sweep (part124b) and
         # issue #10's numbers (bench_qwen35: decode / roofline, pp512 with the plan's scratch) as shipped; .whl only
  synth_bg
  nvidia-smi --query-gpu=name --format=csv,noheader
  if on_h200; then bash "$0" part152; touch /root/part152.done; exit; fi
  synth_wait 120
  bash "$0" part124b
  qwen35_figures 170
  ;;
part157) # the large-M matmul's scratch from the memory plan (kernels.scratch_plan: a prompt chunk shorter than the
         # plan's takes the activation memory planned for its missing rows): its tests on the GPU, then
         # bench_prefill as shipped against the fixed 24 MiB pieces, wall / kernel time and peak memory added against
         # the plan's prefill item; on an H200 part152 first (then this again on the same machine); .whl only
  synth_bg
  nvidia-smi --query-gpu=name --format=csv,noheader
  if on_h200 && [ ! -f /root/part152.done ]; then bash "$0" part152; touch /root/part152.done; exit; fi
  timeout 120 python3 -m pytest -q -m "gpu or not gpu" tests/test_quant_kernels.py -k "scratch or tiny" 2>&1 | tail -2
  timeout 60 python3 -m pytest -q -m "gpu or not gpu" tests/test_plan.py -k "scratch" 2>&1 | tail -2
  synth_wait 120
  timeout 300 python3 benchmarks/bench_prefill.py "$M" --gpu-mem 24 --ctx 8192 --tokens 128,256,512,1024,2048,4096 \
      --reps 5 --settings 'K.scratch_bytes = lambda m: K.SCRATCH_BYTES' 2>&1 | tee "$OUT/prefill.jsonl" | cut -c 1-400
  ;;
part156) # short prompts' prefill: bound by the GPU or by the host launching its kernels? (bench_prefill.py: the
         # median wall time against the summed kernel time, 128-4096 tokens), as shipped and with the large-M path's
         # bf16 scratch 4x / 16x larger (a quarter / a sixteenth of its chunks: fewer launches, but past the L2). On
         # an H200 part152 first (issue #2 / #10's table), bench_prefill in the next call on the same machine;
         # .whl only
  synth_bg
  nvidia-smi --query-gpu=name --format=csv,noheader
  if on_h200 && [ ! -f /root/part152.done ]; then bash "$0" part152; touch /root/part152.done; exit; fi
  synth_wait 120
  timeout 400 python3 benchmarks/bench_prefill.py "$M" --gpu-mem 24 --ctx 8192 --tokens 128,256,512,1024,4096 \
      --reps 5 --top 10 --settings 'K.SCRATCH_BYTES = 96 << 20' --settings 'K.SCRATCH_BYTES = 384 << 20' 2>&1 \
      | tee "$OUT/prefill.jsonl" | cut -c 1-700
  ;;
part155) # the session of 2026-12-06 14:35, first call: on an H200 part152 (then part152b on the same machine),
         # elsewhere part154; carry .whl only
  if on_h200; then bash "$0" part152; else bash "$0" part154; fi
  ;;
part154) # ran at 53af6c6 (H100, 2026-12-06 14:40, BENCHMARKS.md): none faster without PDL, all of them 0.56-0.69 ms
         # slower a step. Which other light kernels run faster launched without PDL (pdl.OFF: the speculative-step
         # kernel's light grid, scheduled early with PDL, piled up on the SMs free first: H100, 2026-12-06 11:50,
         # verify 16 10.35 ms with PDL, 9.97 without): the 27B steps per policy in one process (the DeltaNet
         # recurrence, conv, norms + silu_mul, attention + its merge, split-K sums, q/k norm + rope, all of them);
         # the 27B file written meanwhile; .whl only
  synth_bg
  nvidia-smi --query-gpu=name --format=csv,noheader
  synth_wait 120
  P=new,pdl_off_recurrent,pdl_off_conv,pdl_off_norms,pdl_off_attn,pdl_off_sums,pdl_off_rope,pdl_off_light
  timeout 450 python3 benchmarks/ab_steps.py "$M" --gpu-mem 24 --iters 100 --order $P,$P 2>&1 \
      | tee "$OUT/ab.jsonl" | cut -c 1-300
  ;;
part153) # ran at 12e8d2e (H100, 2026-12-06 12:34; pdl.OFF did not exist yet: launched with PDL): kernel alone
         # 16 tokens 10.27 -> 8.62 us (32 x 2: 6.81, 64 x 4: 7.06), but the 27B steps slower with PDL (verify 16 10.04
         # -> 10.35 ms); without PDL, two loops at 64 x 4: 9.97 ms, tree 12.46 -> 12.39 (shipped, BENCHMARKS.md).
         # The DeltaNet speculative-step kernel with its state products and its products among the tokens in two loops
         # (deltanet.SPEC_CHUNK_TWO_LOOPS; in one loop Triton laid the state products out with every warp computing
         # the whole tile: sm_90, 16 tokens, 56 mma a step a warp and 196 registers, two loops 12 and 80): the
         # kernel alone (bench_spec_delta, 16 / 23 tokens) per tile, one loop as before; then the 27B steps in one
         # process (new / spec_one_loop / spec64); the 27B file written meanwhile; .whl only
  synth_bg
  nvidia-smi --query-gpu=name --format=csv,noheader
  timeout 90 python3 -m pytest -q -m "gpu or not gpu" tests/test_deltanet.py -k "spec_chunk" 2>&1 | tail -2
  for v in "--two-loops 0" "--two-loops 1" "--two-loops 1 --tile 32,2" "--two-loops 1 --tile 64,4" \
           "--two-loops 1 --tile 64,8" "--two-loops 0 --tile 64,4"; do
    timeout 60 python3 benchmarks/bench_spec_delta.py --tokens 16,23 $v 2>&1 | tee -a "$OUT/delta.jsonl" \
        | grep '^{' | cut -c 1-230
  done
  synth_wait 120
  timeout 240 python3 benchmarks/ab_steps.py "$M" --gpu-mem 24 --iters 100 \
      --order new,spec_one_loop,spec64,new,spec_one_loop,spec64 2>&1 | tee "$OUT/ab.jsonl" | cut -c 1-300
  ;;
part152) # on an H200 (the session of 2026-12-06 11:50): issue #2's table (tune_gemv, no tile sweeps), the 27B steps
         # with the launch shapes of the 09:34 session (new) against its start (sums_norms_512), the speculative-step
         # kernel as before 11:50 (spec_before: one loop, 32 x 4, PDL), the 16-row tiles
         # 64 wide (tiles64: the H200's best before the H100's 32-wide ones), Q4_K 16-row tiles with DENORM too
         # (q4k_dn16) and none with it (denorm_off), in one process; then bench_qwen35
         # (#10); the 27B file written meanwhile; carry .whl only. Then part152b on the same machine. On an H100: part150.
  synth_bg
  nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv,noheader
  if ! on_h200; then      # an H100: part150 only
    synth_wait 90; bash "$0" part150; exit
  fi
  gemv_table 200
  synth_wait 120
  timeout 200 python3 benchmarks/ab_steps.py "$M" --gpu-mem 24 --iters 100 \
      --order new,sums_norms_512,spec_before,tiles64,q4k_dn16,denorm_off,new,sums_norms_512,spec_before,tiles64,q4k_dn16,denorm_off 2>&1 \
      | tee "$OUT/ab.jsonl" | cut -c 1-300
  qwen35_figures 170
  ;;
part152b) # after part152 on the same machine: bench_spec (#3 / #4), then part150 (profile --grids); .whl only
  [ -f "$M" ] || python3 -m dflash24.synth --preset qwen35-27b --out "$M" > /dev/null 2>&1
  spec_figures 150
  bash "$0" part150
  ;;
part151) # the session of 2026-12-06 11:50, first call (first_call): on an H200 part141, elsewhere part150 (the launches
         # that leave SMs idle, never run then); carry .whl only
  first_call part150
  ;;
part150) # where the launches still leave SMs idle: the per-kernel profile with launch shapes (profile_steps.py --grids:
         # programs a launch against the SMs, threads, occupancy) of the decode, verify 16, tree verify 23 and a Q4_K
         # draft step, as shipped; .whl only
  [ -f "$M" ] || python3 -m dflash24.synth --preset qwen35-27b --out "$M" > /dev/null 2>&1
  timeout 200 python3 benchmarks/profile_steps.py "$M" --kinds decode,verify16,tree,draft --draft-type Q4_K \
      --top 40 --grids > "$OUT/profile_grids.jsonl" 2> "$OUT/profile_grids.err"
  echo "profile rc $?"; python3 -c "import json,sys
for l in open(sys.argv[1]):
    for k, r in json.loads(l).items():
        print(k, r['kernel_us_per_step'], 'us,', r['kernels_per_step'], 'kernels')
        for u in r.get('grids', {}).get('underfilled', [])[:12]:
            print('   ', u['name'][:60], u['launches'], u['us'], u['programs_min'], u['programs_max'], u['threads'])
" "$OUT/profile_grids.jsonl"
  ;;
part149) # ran at c551c16 (H100, 2026-12-06 10:09): the norms' rows a program (norm.ROWS 16 / 4 / 1: the gated norm's
         # 48 heads of a decode step in 3 / 12 / 48 programs) and silu_mul 512 columns a program, the 27B steps in one
         # process: 4 shipped (AR 6.833 -> 6.798 ms, verify 16 10.02 -> 9.91, tree verify 23 12.54 -> 12.45); .whl only
  synth_bg
  synth_wait 90
  timeout 200 python3 benchmarks/ab_steps.py "$M" --gpu-mem 24 --iters 100 \
      --order rows16,new,rows1,silu512,rows16,new,rows1,silu512 2>&1 | tee "$OUT/ab.jsonl" | cut -c 1-300
  ;;
part148) # the session of 2026-12-06 09:34 as shipped (split-K sums 512 values a program, norm columns 1024 / 2048):
         # GPU tests of the norms and the sums, the 27B steps against the state before and silu_mul 256 / 512 columns
         # a program (one process), then part129 (bench_qwen35, bench_spec); .whl only
  synth_bg
  timeout 60 python3 -m pytest -q -m "gpu or not gpu" tests/test_norm.py 2>&1 | tail -1      # on the GPU (DEV cuda)
  timeout 60 python3 -m pytest -q -m "gpu or not gpu" tests/test_quant_kernels.py \
      -k "split_sum or split_k_and or stream_split or bias_and_output" 2>&1 | tail -1
  synth_wait 90
  timeout 200 python3 benchmarks/ab_steps.py "$M" --gpu-mem 24 --iters 200 \
      --order new,sums_norms_512,silu256,silu512,new,sums_norms_512,silu256,silu512 2>&1 | tee "$OUT/ab.jsonl" \
      | cut -c 1-300
  bash "$0" part129
  ;;
part146) # the session of 2026-12-06 09:34, first call (first_call): on an H200 part141, on an H100 (where part141 ran
         # at 07:31) the 27B steps as shipped (part129: bench_qwen35, bench_spec); carry .whl only
  first_call part129
  ;;
part145) # the 27B steps as shipped at the end of the session of 2026-12-06 07:29 (bench_spec); carry .whl only
  [ -f "$M" ] || python3 -m dflash24.synth --preset qwen35-27b --out "$M" > /dev/null 2>&1
  timeout 150 python3 benchmarks/bench_spec.py "$M" --gpu-mem 24 --ctx 4096 --iters 30 --modes ar \
      > "$OUT/spec.json" 2> "$OUT/spec.err"
  echo "spec rc $?"; head -n 1 "$OUT/spec.json" | cut -c 180-1100
  ;;
part143) # ran at 8345915 (H100, 2026-12-06 08:05): the drafter's norms / silu_mul writing its block matmuls' x orders
         # (feeds) and GGUF drafters' gate / up as one stacked matmul: GPU tests, the engine smoke (both tiny models:
         # 200 s), the draft step per format in this tree and in build/old (the commit before; carry .whl and
         # build/old). The graphed draft step did not move (Q8_0 1.925 -> 1.924 ms, Q4_K 1.658 -> 1.656): reverted
  timeout 60 python3 -m pytest -q -m "gpu or not gpu" tests/test_norm.py 2>&1 | tail -2      # on the GPU (DEV cuda)
  timeout 200 python3 benchmarks/gpu_engine_smoke.py > "$OUT/engine_smoke.jsonl" 2> "$OUT/engine_smoke.err"
  echo "smoke rc $?"; cut -c 1-700 "$OUT/engine_smoke.jsonl"
  for t in new old; do
    d=.; [ $t = old ] && d=build/old
    (cd $d && timeout 150 python3 benchmarks/bench_draft.py --formats q8_0,q4_k --ctx 4096 --iters 30) \
        > "$OUT/draft_$t.jsonl" 2> "$OUT/draft_$t.err"
    echo "draft $t rc $?"; cut -c 1-600 "$OUT/draft_$t.jsonl"
  done
  ;;
part141) # next, on an H200 (the session of 2026-12-06 05:14 had H100s only): the Gluon GPU tests that cover this
         # session's kernels, issue #2's table as shipped, and Q4_K / Q4_0 / Q5_0 16-row tiles 32 wide with and
         # without DENORM (SASS, Q4_K 16 x 32 ACC2: 80 registers and 199 instructions a step with it, 87 / 232
         # without); no 27B file; carry .whl only. Then part141b on the same machine.
  timeout 200 python3 -m pytest -q -m gpu tests/test_gluon_matmul.py -k "subnormal or vs_reference" 2>&1 | tail -3
  timeout 200 python3 benchmarks/tune_gemv.py --types Q4_K,Q6_K,Q5_0,Q8_0,Q5_K --min-ms 3 --configs '[]' \
      --markdown 2>&1 | tee "$OUT/tune.txt" | grep -v '^{' | cut -c 1-3000
  timeout 100 python3 benchmarks/bench_gluon_matmul.py --type Q4_K --m 16 --min-ms 2 \
      --tiles Ta,Tas,32x4a,32x6a,32x4as,32x6as 2>&1 | tee "$OUT/q4k.jsonl" | cut -c 1-120
  # 23 rows (a tree verify): occupancy, which moved the 16-row tiles most (Q4_K's 128-wide 32-row tile takes 228
  # registers, two programs an SM): 64-wide with ACC2 (154), capped at 128 (four), with DENORM
  timeout 100 python3 benchmarks/bench_gluon_matmul.py --type Q4_K --m 23 --min-ms 2 \
      --tiles T,64x2a,64x3a,64x2ar128,64x2asr128 2>&1 | tee "$OUT/q4k23.jsonl" | cut -c 1-120
  for t in Q4_0 Q5_0; do
    timeout 80 python3 benchmarks/bench_gluon_matmul.py --type $t --m 16 --min-ms 2 \
        --tiles T,Ts,32x4,32x6,32x4a,32x4as,32x6as 2>&1 | tee "$OUT/$t.jsonl" | cut -c 1-120
  done
  ;;
part141b) # after part141 on the same machine: the 27B steps per Gluon policy in one process (shipped, Q4_K's 16-row
          # tiles with DENORM too, none with DENORM, the 64-wide 16-row tiles), then part129 (issues #10 / #3 / #4)
  [ -f "$M" ] || python3 -m dflash24.synth --preset qwen35-27b --out "$M" > /dev/null 2>&1
  timeout 300 python3 benchmarks/ab_steps.py "$M" --gpu-mem 24 --iters 100 \
      --order new,q4k_dn16,denorm_off,tiles64,new,q4k_dn16,denorm_off,tiles64 2>&1 | tee "$OUT/ab.jsonl" | cut -c 1-300
  bash "$0" part129
  ;;
part140b) # the 27B steps with the 32-wide 16-row tiles (shipped) against the 64-wide ones, in one process
  [ -f "$M" ] || python3 -m dflash24.synth --preset qwen35-27b --out "$M" > /dev/null 2>&1
  timeout 400 python3 benchmarks/ab_steps.py "$M" --gpu-mem 24 --iters 100 --order new,tiles64,new,tiles64 2>&1 \
      | tee "$OUT/ab.jsonl" | cut -c 1-400
  ;;
part140) # 32-row-wide weight tiles (BLOCK_N 32: one row a thread, 80-96 registers, six programs an SM) for the K
         # types at 16 and 23 rows of x, against the table's tiles, at the 27B's stacked shapes; no 27B file
  for t in Q4_K Q5_K Q6_K; do
    timeout 120 python3 benchmarks/bench_gluon_matmul.py --type $t --m 16 --min-ms 2 \
        --tiles Ta,32x2,32x4,32x6,32x8,32x4a,32x6a,32x4s,32x6s 2>&1 | tee -a "$OUT/t16.jsonl" | cut -c 1-120
    timeout 120 python3 benchmarks/bench_gluon_matmul.py --type $t --m 23 --min-ms 2 \
        --tiles T,Ta,32x2,32x4,32x6,32x4a,32x4s 2>&1 | tee -a "$OUT/t23.jsonl" | cut -c 1-120
  done
  ;;
part139) # the Gluon decode's codes as subnormal bf16 (gluon_matmul.DENORM: one bf16x2 fma a weight pair instead of
         # two, the same bits): GPU tests (the bits with / without, scales near fp16's largest), then the kernel
         # with / without at the 27B's stacked shapes, Q4_K also capped at 128 registers; no 27B file; .whl only
         # (ran 2026-12-06 on an H100 at the commit that had DENORM for every type: there "Ta" was with it, "Tao"
         # without; the bench's default is now gluon_matmul.DENORM_TILES' setting)
  timeout 240 python3 -m pytest -q -m gpu tests/test_gluon_matmul.py 2>&1 | tail -4
  for t in Q4_K Q5_K Q6_K; do
    timeout 100 python3 benchmarks/bench_gluon_matmul.py --type $t --m 16 --min-ms 2 --tiles Ta,Tao,Tar128 2>&1 \
        | tee -a "$OUT/gl16.jsonl" | cut -c 1-200
    timeout 100 python3 benchmarks/bench_gluon_matmul.py --type $t --m 23 --min-ms 2 --tiles T,To,Tr128,Ta,Tao 2>&1 \
        | tee -a "$OUT/gl23.jsonl" | cut -c 1-200
  done
  ;;
part139b) # the 27B steps: shipped (DENORM for Q5_K / Q6_K, Q5_K's 16-row tile at 128 registers), none, every type,
          # in one process (needs /root/q35.gguf or makes it)
  [ -f "$M" ] || python3 -m dflash24.synth --preset qwen35-27b --out "$M" > /dev/null 2>&1
  timeout 420 python3 benchmarks/ab_steps.py "$M" --gpu-mem 24 --iters 100 \
      --order new,denorm_off,denorm_all,new,denorm_off,denorm_all 2>&1 | tee "$OUT/ab.jsonl" | cut -c 1-400
  ;;
part138) # Q8_0 on the Gluon verify kernel (gluon_matmul._decode8) and the Q4_0 / Q5_0 GPU tests against the bf16
         # weights the kernel multiplies: GPU tests of the three types, the Q8_0 kernel's tiles at issue #2's shapes
         # (then set gluon_matmul.TILE[Q8_0] and run part138b); no 27B file; carry .whl only
  timeout 240 python3 -m pytest -q -m gpu tests/test_gluon_matmul.py -k "Q8_0 or Q4_0 or Q5_0" 2>&1 | tail -4
  timeout 240 python3 benchmarks/bench_gluon_matmul.py --type Q8_0 --m 16,23 --min-ms 2 \
      --tiles T,Ta,32x2,32x4,32x6,64x2,64x4,64x6 2>&1 | tee "$OUT/gl_Q8_0.jsonl" | cut -c 1-700
  ;;
part138b) # after part138: issue #2's table as shipped (every type on the engine's path), then the drafter's step
          # per format (the Q8_0 drafter's 16-row matmuls now on the Gluon kernel); carry .whl only
  timeout 200 python3 benchmarks/tune_gemv.py --types Q4_K,Q6_K,Q5_0,Q8_0,Q5_K,Q4_0 --min-ms 3 --configs '[]' \
      --markdown 2>&1 | tee "$OUT/tune.txt" | grep -v '^{' | cut -c 1-3000
  timeout 240 python3 benchmarks/bench_draft.py --formats bf16,q8_0,q4_k --ctx 4096 --iters 30 --tmpdir /root \
      2> "$OUT/draft.err" | tee "$OUT/draft.jsonl" | cut -c 1-1500
  ;;
part137) # Q4_0 / Q5_0 on the Gluon verify kernel (the planar words of Q4_K / Q5_K, one fp16 d per 32-block): their
         # GPU tests, the kernel against the tl.dot kernel at issue #2's shapes (tiles: the table's, ACC2 on / off,
         # and a few), then issue #2's table for Q5_0 / Q4_0 on the engine's path; no 27B file; carry .whl only
  timeout 240 python3 -m pytest -q -m gpu tests/test_gluon_matmul.py -k "Q4_0 or Q5_0" 2>&1 | tail -4
  for t in Q5_0 Q4_0; do
    timeout 150 python3 benchmarks/bench_gluon_matmul.py --type $t --m 16,23 --min-ms 2 \
        --tiles Ta,T,64x2a,64x4a,64x6a,128x2,128x3 2>&1 | tee "$OUT/gl_$t.jsonl" | cut -c 1-1400
  done
  timeout 150 python3 benchmarks/tune_gemv.py --types Q5_0,Q4_0 --min-ms 3 --configs '[]' --markdown 2>&1 \
      | tee "$OUT/tune.txt" | cut -c 1-2500
  ;;
part135) # is ffn_down's read bound by the bytes a warp keeps in flight? probe_read_pattern's rows read as the GEMV's
         # one-warp programs do, plain (4 steps unrolled) and through rings of 2 / 4 / 8 steps in shared memory by
         # cp.async and by TMA (values checked: *_ok); no 27B file; carry .whl only. Ran on an H200 on 2026-12-06:
         # the plain read 0.868 of the copy bandwidth, no ring faster
  timeout 150 python3 benchmarks/probe_read_pattern.py --shapes 5120x17408,34816x5120,5120x6144 --slots 2,4,8 \
      2>&1 | tee "$OUT/pattern.jsonl" | cut -c 1-1500
  ;;
part133) # the draft step per drafter format (last timed 2026-12-01, before the Gluon kernel: BF16 2.02, Q8_0 2.76,
         # Q6_K 3.56, Q4_K 2.65 ms), then the 27B steps with quantized drafters (bench_spec --draft-type)
  [ -f "$M" ] || python3 -m dflash24.synth --preset qwen35-27b --out "$M" > /dev/null 2>&1 &
  timeout 200 python3 benchmarks/bench_draft.py --formats bf16,q8_0,q6_k,q4_k --ctx 512,4096 --iters 30 \
      --tmpdir /root 2> "$OUT/draft.err" | tee "$OUT/draft.jsonl" | cut -c 1-1500
  wait
  echo "synth done"
  for t in Q4_K Q8_0; do
    timeout 170 python3 benchmarks/bench_spec.py "$M" --gpu-mem 24 --ctx 4096 --iters 30 --modes ar \
        --draft-type $t > "$OUT/spec_$t.json" 2> "$OUT/spec_$t.err"
    echo "spec $t rc $?"; tail -c 1500 "$OUT/spec_$t.json"
  done
  ;;
part132) # part126's L2 prefetch of the steps past the registers' (cfg l2_ahead) on the H200, whose ffn_down runs at a
         # lower fraction of the copy bandwidth than an H100's (where it lost): the kernel per l2_ahead, then the 27B
         # steps in one process, from build/l2a (the tree of c5c91ba, carried); carry .whl and build/l2a
  [ -d build/l2a ] || { echo "build/l2a missing: git archive c5c91ba | tar -x -C build/l2a, and carry it"; exit 1; }
  [ -f "$M" ] || python3 -m dflash24.synth --preset qwen35-27b --out "$M" > /dev/null 2>&1 &
  # [BLOCK_N, G, warps, stages, row_run, row_pair, unroll, prefetch, maxnreg, whole, l2_ahead, split]
  for tr in Q4_K:80 Q6_K:96; do
    t=${tr%%:*}; r=${tr##*:}
    (cd build/l2a && PYTHONPATH=/tmp/site:$PWD timeout 150 python3 benchmarks/tune_gemv.py --types $t \
        --shapes 5120x17408 --no-small-m --min-ms 5 --configs \
"[[2,32,1,1,1,1,1,1,$r,1,0,0],[2,32,1,1,1,1,1,1,$r,1,1,0],[2,32,1,1,1,1,1,1,$r,1,2,0],[2,32,1,1,1,1,1,1,$r,1,4,0]]") \
        > "$OUT/tune_$t.jsonl" 2>> "$OUT/log.txt"; echo "$t rc $?"; cut -c 1-1500 "$OUT/tune_$t.jsonl"
  done
  wait
  echo "synth done"
  (cd build/l2a && PYTHONPATH=/tmp/site:$PWD timeout 240 python3 benchmarks/ab_steps.py "$M" --gpu-mem 24 \
      --iters 100 --order new,l2a1,l2a2,new,l2a1,l2a2,new) 2> "$OUT/ab.err" | tee "$OUT/ab.jsonl"
  tail -3 "$OUT/ab.err"
  ;;
part131a) # part131's first half (GPU tests, the read-order probe, the kernel per config; the 27B file written)
  [ -f "$M" ] || python3 -m dflash24.synth --preset qwen35-27b --out "$M" > /dev/null 2>&1 &
  timeout 200 python3 -m pytest -q -rf -m "gpu or not gpu" tests/test_quant_kernels.py \
      -k "prefetched_loop or prefetch_is_chosen" > "$OUT/gpu_tests.txt" 2>&1
  tail -3 "$OUT/gpu_tests.txt"
  timeout 100 python3 benchmarks/probe_read_pattern.py --shapes 5120x17408,34816x5120 2>&1 | tee "$OUT/pattern.jsonl"
  timeout 200 python3 benchmarks/tune_gemv.py --types Q4_K,Q6_K,Q5_K --shapes 5120x17408 --no-small-m --min-ms 5 \
      --configs '[[2,32,1,1,1,1,1,1,80,1],[2,32,1,1,1,1,1,1,96,1],[2,32,1,1,1,1,1,2,96,1],[2,32,1,1,1,1,1,2,112,1]]' \
      2> "$OUT/tune.err" | tee "$OUT/tune.jsonl" | cut -c 1-1500
  wait
  echo "synth done"
  ;;
part131b) # part131's second half: the 27B steps in one process, as shipped / two ahead at 96 / one ahead at 96
  [ -f "$M" ] || python3 -m dflash24.synth --preset qwen35-27b --out "$M" > /dev/null 2>&1
  timeout 300 python3 benchmarks/ab_steps.py "$M" --gpu-mem 24 --iters 200 \
      --order new,ahead2,regs96,new,ahead2,regs96,new,ahead2 2> "$OUT/ab.err" | tee "$OUT/ab.jsonl"
  tail -3 "$OUT/ab.err"
  ;;
part130) # issue #2's table as shipped: the GEMV of the four types the issue names (and Q5_K) at its four shapes, as a
         # fraction of the copy bandwidth, and M = 16 / 23 on the engine's path (Gluon for the K types) and on the
         # tl.dot kernel as multiples of it; no 27B file needed; carry .whl only
  timeout 560 python3 benchmarks/tune_gemv.py --types Q4_K,Q6_K,Q5_0,Q8_0,Q5_K --min-ms 5 --configs '[]' --markdown \
      2> "$OUT/gemv.err" | tee "$OUT/gemv.jsonl"
  tail -3 "$OUT/gemv.err"
  ;;
part128) # (runs at 704c734 only) a decode step's DeltaNet recurrence + gated norm (+ int8 x) in one launch (deltanet.recurrent_norm): GPU
         # tests, the 27B steps against the two launches (and 16 warps) in one process, issue #10's roofline fraction
  [ -f "$M" ] || python3 -m dflash24.synth --preset qwen35-27b --out "$M" > /dev/null 2>&1 &
  timeout 200 python3 -m pytest -q -rf -m "gpu or not gpu" tests/test_deltanet.py -k "recurrent_norm or recurrent" \
      > "$OUT/gpu_tests.txt" 2>&1
  tail -3 "$OUT/gpu_tests.txt"
  timeout 200 python3 -m pytest -q -rf -m gpu tests/test_qwen35_gpu.py > "$OUT/gpu_tests_q35.txt" 2>&1
  tail -3 "$OUT/gpu_tests_q35.txt"
  wait
  echo "synth done"
  timeout 230 python3 benchmarks/ab_steps.py "$M" --gpu-mem 24 --iters 200 \
      --order new,dn_norm_apart,dn_norm_w16,new,dn_norm_apart,dn_norm_w16,new,dn_norm_apart 2> "$OUT/ab.err" \
      | tee "$OUT/ab.jsonl"
  tail -3 "$OUT/ab.err"
  ;;
part128b) # issue #10's roofline fraction as shipped
  [ -f "$M" ] || python3 -m dflash24.synth --preset qwen35-27b --out "$M" > /dev/null 2>&1
  timeout 170 python3 benchmarks/bench_qwen35.py "$M" --gpu-mem 24 --ctx 4096 --decode-tokens 64 --prefill 512 \
      > "$OUT/qwen35.json" 2> "$OUT/qwen35.err"
  echo "qwen35 rc $?"; python3 -c "import json,sys; r=json.load(open(sys.argv[1])); print(r.get('bandwidth'),
      r.get('decode'), r.get('memory'))" "$OUT/qwen35.json" 2>&1 | cut -c 1-1200
  ;;
part127) # (runs at 1846b64 and before only: the two_split policy and kernels.TWO_UNSPLIT are gone) a weight pair whose
         # smaller part alone would split K (the attention's Q6_K v, 1,024 rows) as one gemv_two launch: GPU tests,
         # the 27B steps against two_split in one process, issue #10's roofline fraction; ffn_down split 2 / 3 at
         # G 32 (kernel times); carry .whl only
  [ -f "$M" ] || python3 -m dflash24.synth --preset qwen35-27b --out "$M" > /dev/null 2>&1 &
  timeout 150 python3 -m pytest -q -rf -m "gpu or not gpu" tests/test_quant_kernels.py -k "gemv_two or fused" \
      > "$OUT/gpu_tests.txt" 2>&1
  tail -3 "$OUT/gpu_tests.txt"
  wait
  echo "synth done"
  for tr in Q4_K:80 Q6_K:96; do
    t=${tr%%:*}; r=${tr##*:}
    timeout 100 python3 benchmarks/tune_gemv.py --types $t --shapes 5120x17408 --no-small-m --min-ms 5 --configs \
"[[2,32,1,1,1,1,1,1,$r,1,0,0],[2,32,1,1,1,1,1,1,$r,1,0,2],[2,32,1,1,1,1,1,0,0,1,0,2],[2,32,1,1,1,1,1,1,$r,1,0,3]]" \
        > "$OUT/tune_$t.jsonl" 2>> "$OUT/log.txt"; echo "$t rc $?"; tail -1 "$OUT/tune_$t.jsonl" | cut -c 1-1500
  done
  timeout 200 python3 benchmarks/ab_steps.py "$M" --gpu-mem 24 --iters 200 \
      --order new,two_split,new,two_split,new,two_split,new 2> "$OUT/ab.err" | tee "$OUT/ab.jsonl"
  tail -3 "$OUT/ab.err"
  timeout 170 python3 benchmarks/bench_qwen35.py "$M" --gpu-mem 24 --ctx 4096 --decode-tokens 64 --prefill 512 \
      > "$OUT/qwen35.json" 2> "$OUT/qwen35.err"
  echo "qwen35 rc $?"; python3 -c "import json,sys; r=json.load(open(sys.argv[1])); print(r.get('bandwidth'),
      r.get('decode'), r.get('memory'))" "$OUT/qwen35.json" 2>&1 | cut -c 1-1200
  ;;
part126) # ffn_down (K 17408: 2,560 long programs, about 19 an SM) also prefetching into L2 the steps past its registers'
         # (cfg l2_ahead), and split K 2 / 3 (more, shorter programs; the sums' launch counted): GPU tests, the
         # kernel per config (Q4_K, Q6_K), then the 27B steps in one process with part125's gate policies; carry .whl
  [ -f "$M" ] || python3 -m dflash24.synth --preset qwen35-27b --out "$M" > /dev/null 2>&1 &
  timeout 150 python3 -m pytest -q -rf -m gpu tests/test_quant_kernels.py -k "l2_ahead or prefetched" \
      > "$OUT/gpu_tests.txt" 2>&1
  tail -3 "$OUT/gpu_tests.txt"
  wait                         # the file written before anything is timed
  echo "synth done"
  # [BLOCK_N, G, warps, stages, row_run, row_pair, unroll, prefetch, maxnreg, whole, l2_ahead, split]
  for tr in Q4_K:80 Q6_K:96; do
    t=${tr%%:*}; r=${tr##*:}
    timeout 150 python3 benchmarks/tune_gemv.py --types $t --shapes 5120x17408 --no-small-m --min-ms 5 --configs \
"[[2,32,1,1,1,1,1,1,$r,1,0,0],[2,32,1,1,1,1,1,1,$r,1,1,0],[2,32,1,1,1,1,1,1,$r,1,2,0],[2,32,1,1,1,1,1,1,$r,1,4,0],\
[2,16,1,1,1,1,1,1,$r,1,0,2],[2,16,1,1,1,1,1,1,$r,1,2,2],[2,16,1,1,1,1,1,0,0,1,0,2],[2,16,1,1,1,1,1,1,$r,1,0,3],\
[2,16,1,1,1,1,1,0,0,1,0,3],[2,16,1,1,1,1,1,1,$r,1,0,0],[2,16,1,1,1,1,1,1,$r,1,2,0]]" \
        > "$OUT/tune_$t.jsonl" 2>> "$OUT/log.txt"; echo "$t rc $?"; cut -c 1-2500 "$OUT/tune_$t.jsonl"
  done
  timeout 240 python3 benchmarks/ab_steps.py "$M" --gpu-mem 24 --iters 100 \
      --order new,l2a1,l2a2,new,l2a1,l2a2,l2a4,new,gate_in_place,gate_pad,new,gate_pad,gate_in_place \
      2> "$OUT/ab.err" | tee "$OUT/ab.jsonl"
  tail -3 "$OUT/ab.err"
  ;;
part126b) # where the decode step's time goes now, by GEMV shape (the GEMV chain vs a read of its bytes)
  [ -f "$M" ] || python3 -m dflash24.synth --preset qwen35-27b --out "$M" > /dev/null 2>&1
  timeout 200 python3 benchmarks/probe_gemv_chain.py "$M" --quick > "$OUT/chain.jsonl" 2> "$OUT/chain.err"
  echo "chain rc $?"; head -1 "$OUT/chain.jsonl" | cut -c 1-4000
  ;;
part125) # not run yet (the 2026-12-05 16:47 session's device time ran out): why the attention gate read in place made
         # the budget-22 tree verify 0.24 ms slower (part124): in place in verify steps too, the same with a tensor of
         # the copy's size allocated (the copy's buffer placement without the copy), as shipped; carry .whl only
  [ -f "$M" ] || python3 -m dflash24.synth --preset qwen35-27b --out "$M" > /dev/null 2>&1
  echo "synth done"
  timeout 200 python3 benchmarks/ab_steps.py "$M" --gpu-mem 24 --iters 100 \
      --order gate_in_place,gate_pad,new,gate_pad,gate_in_place,new 2> "$OUT/ab.err" | tee "$OUT/ab.jsonl"
  tail -3 "$OUT/ab.err"
  ;;
part124) # after part123 (H100, 2026-12-05): the in-place attention gate alone slowed the budget-22 tree verify (13.62
         # vs 13.42 ms) while it sped the AR step; as shipped vs as shipped with the gate copied, interleaved, more
         # iterations; then issue #10's decode roofline fraction as shipped (bench_qwen35)
  [ -f "$M" ] || python3 -m dflash24.synth --preset qwen35-27b --out "$M" > /dev/null 2>&1
  echo "synth done"
  timeout 200 python3 benchmarks/ab_steps.py "$M" --gpu-mem 24 --iters 200 \
      --order new,gate_copied,new,gate_copied,new,gate_copied,old \
      2> "$OUT/ab.err" | tee "$OUT/ab.jsonl"
  tail -3 "$OUT/ab.err"
  timeout 170 python3 benchmarks/bench_qwen35.py "$M" --gpu-mem 24 --ctx 4096 --decode-tokens 64 --prefill 512 \
      > "$OUT/qwen35.json" 2> "$OUT/qwen35.err"
  echo "qwen35 rc $?"; python3 -c "import json,sys; r=json.load(open(sys.argv[1])); print(r.get('bandwidth'),
      r.get('decode'), r.get('memory'))" "$OUT/qwen35.json" 2>&1 | cut -c 1-1200
  ;;
part124b) # issue #4's budget sweep as shipped (8 / 16 / 22 / 32 / 64: verify step / AR step, peak memory added)
  [ -f "$M" ] || python3 -m dflash24.synth --preset qwen35-27b --out "$M" > /dev/null 2>&1
  timeout 200 python3 benchmarks/bench_tree_budget.py "$M" --budgets 8,16,22,32,64 --gpu-mem 24 \
      > "$OUT/tree_budget.json" 2>> "$OUT/log.txt"
  echo "budget rc $?"; tail -n 1 "$OUT/tree_budget.json" | cut -c 1-2000
  ;;
part123) # part122's A/B in one process (benchmarks/ab_steps.py: the 27B loads once, the policies recapture the graphs):
         # the embedding kernel, the in-place gate and the tree conv index kernel on / off, interleaved; each alone
         # (as run on 2026-12-05 it also had the deferred split-K sums' policies: slower, the code removed)
  [ -f "$M" ] || python3 -m dflash24.synth --preset qwen35-27b --out "$M" > /dev/null 2>&1
  echo "synth done"
  timeout 240 python3 benchmarks/ab_steps.py "$M" --gpu-mem 24 \
      --order new,old,new,old,new,old,embed_only,gate_only,tree_index_only \
      2> "$OUT/ab.err" | tee "$OUT/ab.jsonl"
  tail -3 "$OUT/ab.err"
  ;;
part122) # the embedding rows gathered and decoded in one kernel + the attention output gate read in place (cdeecdf)
         # against the tree before them (build/old from 703290e: `rm -rf build/old && mkdir -p build/old && git archive
         # 703290e dflash24 benchmarks | tar -x -C build/old`; carry ["build/old", ".whl"]): their GPU tests (the
         # reference's bits, device / pinned tables, in a graph), the 27B steps new / old / new / old, then the
         # qwen35 GPU tests (the whole model on the GPU paths)
  synth_bg
  timeout 100 python3 -m pytest -q -rf -m "gpu or not gpu" tests/test_quant_linear.py tests/test_norm.py \
      tests/test_deltanet.py -k "embedding or silu or tree_conv" > "$OUT/gpu_tests.txt" 2>&1
  echo "tests rc $?"; tail -2 "$OUT/gpu_tests.txt"
  synth_wait
  STEPS_FIRST=2 steps_27b pass old pass old
  timeout 150 python3 -m pytest -q -rf -m "gpu or not gpu" tests/test_qwen35_gpu.py > "$OUT/qwen35_tests.txt" 2>&1
  echo "qwen35 tests rc $?"; tail -2 "$OUT/qwen35_tests.txt"
  ;;
part121) # on an H100 (2026-12-05): issue #10's roofline fraction on this card (bench_qwen35: copy bandwidth, AR decode
         # in a graph), the tree budgets with Q5_K's 64-row tiles at 3 waves (22 / 40 / 48), then the ffn_down and
         # K = 5120 kernel times new (whole on / off) and old. Carry ["build/old", ".whl"] (build/old: see part120b).
  [ -f "$M" ] || python3 -m dflash24.synth --preset qwen35-27b --out "$M" > /dev/null 2>&1
  timeout 170 python3 benchmarks/bench_qwen35.py "$M" --gpu-mem 24 --ctx 4096 --decode-tokens 64 --prefill 512 \
      > "$OUT/qwen35.json" 2> "$OUT/qwen35.err"
  echo "qwen35 rc $?"; python3 -c "import json,sys; r=json.load(open(sys.argv[1])); print(r.get('bandwidth'),
      r.get('decode'))" "$OUT/qwen35.json" 2>&1 | cut -c 1-800
  timeout 150 python3 benchmarks/bench_tree_budget.py "$M" --budgets 22,40,48 --gpu-mem 24 \
      > "$OUT/tree_budget.json" 2>> "$OUT/log.txt"
  echo "budget rc $?"; tail -n 1 "$OUT/tree_budget.json" | cut -c 1-1200
  gemv_vs_old 90 5120x17408,34816x5120 \
      '[[2,32,1,1,1,1,1,1,80,1],[2,32,1,1,1,1,1,1,80,0],[2,32,1,1,1,1,1,0,0,1],[2,32,1,1,1,1,1,0,0,0]]' \
      '[[2,32,1,1,1,1,1,1,80],[2,32,1,1,1,1,1,0,0]]'
  ;;
part120) # the row-pair GEMV on whole steps (cfg whole: no masked loads; ffn_down's prefetched loop two steps an
         # iteration) with x in the words' register layout (Q6_K's x words interleaved): GPU tests, ffn_down and
         # K = 5120 kernel times new (whole on / off) and old (build/old: the tree before, carried), then the 27B
         # steps new / old / new / old / new without whole. Carry ["build/old", ".whl"] (build/old: see part120b).
  synth_bg
  gemv_bits 150
  gemv_vs_old 150 5120x17408,34816x5120 \
      '[[2,32,1,1,1,1,1,1,80,0],[2,32,1,1,1,1,1,1,80,1],[2,32,1,1,1,1,1,1,96,0],[2,32,1,1,1,1,1,1,96,1],[2,32,1,1,1,1,1,0,0,0],[2,32,1,1,1,1,1,0,0,1]]' \
      '[[2,32,1,1,1,1,1,1,80],[2,32,1,1,1,1,1,1,96],[2,32,1,1,1,1,1,0,0]]'
  synth_wait
  STEPS_FIRST=2 steps_27b pass old pass old 'K.GEMV_WHOLE = False'
  ;;
part120c) # part120b with the 27B steps first (synth in the foreground), then the GPU tests. Carry as part120b.
  STEPS_FIRST=2 steps_27b pass old pass old
  gemv_bits 100
  ;;
part120b) # part120 in the order that matters when device time is short: GPU tests, the 27B steps new / old / new /
          # old, then ffn_down kernel times new / old. Carry ["build/old", ".whl"], build/old made here first by
          # `mkdir -p build/old && git archive 6a2ef64 dflash24 benchmarks | tar -x -C build/old` (the tree before).
  synth_bg
  gemv_bits 100
  synth_wait
  STEPS_FIRST=2 steps_27b pass old pass old
  gemv_vs_old 100 5120x17408 '[[2,32,1,1,1,1,1,1,80],[2,32,1,1,1,1,1,1,96]]' '[[2,32,1,1,1,1,1,1,80],[2,32,1,1,1,1,1,1,96]]'
  ;;
part119) # what the last session left unmeasured, as shipped (618eed7): the Q5_K 64-row tiles (kernel times while the
         # 27B file is written), the per-kernel profile of decode / verify 16 / tree verify (budget 22; none since
         # 2026-12-02), then the tree budget sweep with the 4-warp 64-row tiles
  synth_bg
  timeout 120 python3 benchmarks/bench_gluon_matmul.py --type Q5_K --shapes 10240x5120 --m 33,48,64 --max-rows 64 \
      --tiles T,64x2,64x3,64x4 > "$OUT/rows64_Q5_K.jsonl" 2>> "$OUT/log.txt"; echo "Q5_K rc $?"
  gluon_table "$OUT/rows64_Q5_K.jsonl"
  synth_wait
  timeout 200 python3 benchmarks/profile_steps.py "$M" --top 40 > "$OUT/profile.json" 2> "$OUT/profile.err"
  echo "profile rc $?"
  timeout 200 python3 benchmarks/bench_tree_budget.py "$M" --budgets 22,32,40,48,63 --gpu-mem 24 \
      > "$OUT/tree_budget.json" 2>> "$OUT/log.txt"
  echo "budget rc $?"; tail -n 1 "$OUT/tree_budget.json" | cut -c 1-1500
  ;;
part118) # (run 2026-12-05 09:55; runs at f884dba only) the three changes of 2026-12-05 06:20 in one call: their GPU tests (same bits
         # for the GEMV prefetch; the one-launch DeltaNet decode against conv_qk + recurrence + norm and the verify's
         # gated norm inside the speculative-step kernel, their programs concurrent), then the 27B steps: shipped /
         # all three / shipped / all three / the GEMV prefetch alone. The AR step moves with the prefetch and the
         # one-launch decode (all three minus prefetch alone: the decode's share), verify 16 and the tree verify with
         # the verify norm only.
  synth_bg
  timeout 120 python3 -m pytest -q -rf tests/test_quant_kernels.py tests/test_deltanet.py \
      -k "prefetch or gemv_two or conv_recurrent or gated_norm or spec_chunk" > "$OUT/gpu_tests.txt" 2>&1
  echo "tests rc $?"; tail -2 "$OUT/gpu_tests.txt"
  synth_wait
  pf='K.GEMV_PREFETCH = True'
  all="$pf; DN.FUSED_CONV_RECURRENT = True; DN.FUSED_SPEC_NORM = True"
  steps_27b pass "$all" pass "$all" "$pf"
  ;;
part117) # (runs at f884dba only: removed, the 27B decode step +0.03 ms) a DeltaNet layer's one-token conv + q/k norms + g/beta + recurrence + gated norm as one launch
         # (deltanet.conv_recurrent, DFLASH24_FUSED_CONV_RECURRENT=1; 96 launches fewer a 27B decode step; the q / k
         # window moved on by the last of its readers, a head's norm run by the last of its value blocks, both counted
         # with atomics): GPU tests (the programs run concurrently there), the engine smoke with it on, the 27B steps
         # A B A B
  synth_bg
  timeout 120 python3 -m pytest -q -rf tests/test_deltanet.py -k "conv_recurrent or conv_qk" > "$OUT/gpu_tests.txt" 2>&1
  echo "tests rc $?"; tail -2 "$OUT/gpu_tests.txt"
  DFLASH24_FUSED_CONV_RECURRENT=1 DFLASH24_FUSED_SPEC_NORM=1 DFLASH24_GEMV_PREFETCH=1 timeout 90 \
      python3 benchmarks/gpu_engine_smoke.py > "$OUT/engine_smoke.jsonl" 2> "$OUT/engine_smoke.err"
  echo "smoke rc $?"; cut -c 1-1200 "$OUT/engine_smoke.jsonl"
  synth_wait
  steps_27b pass 'DN.FUSED_CONV_RECURRENT = True' pass 'DN.FUSED_CONV_RECURRENT = True'
  ;;
part116) # (not run yet) the ffn_down GEMVs (K 17408: 2,560 programs of 17 steps, ~19 an SM in one wave; part114b:
         # Q6_K 30.8 us against a 17.5 us read of its bytes, Q4_K 18.6 against 12.7) with the next step's tiles
         # loaded into registers ahead (kernels.GEMV_PREFETCH, cfg prefetch + a register cap so that ptxas issues
         # them first): GPU tests (same bits), the ffn_down tiles with and without, the 27B steps A B A B.
         # part116b: the engine smoke with gemv_two (and prefetch) on, the decode step's GEMV chain by shape.
  synth_bg
  timeout 90 python3 -m pytest -q -rf tests/test_quant_kernels.py -k "prefetch or gemv_two or row_pair or unrolled" \
      > "$OUT/gpu_tests.txt" 2>&1
  echo "tests rc $?"; tail -2 "$OUT/gpu_tests.txt"
  C='[[2,32,1,1,1,1],[2,32,1,1,1,1,1,1,80],[2,32,1,1,1,1,1,1,96],[2,32,1,1,1,1,1,1,0],[2,16,1,1,1,1,1,1,80],'
  C="$C"'[2,64,1,1,1,1,1,1,96],[2,64,1,1,1,1,1,1,80],[1,32,1,1,1,0],[2,64,2,1,1,1]]'
  timeout 120 python3 benchmarks/tune_gemv.py --types Q4_K,Q6_K,Q5_K --shapes 5120x17408 --no-small-m --min-ms 5 \
      --configs "$C" > "$OUT/tune.jsonl" 2>> "$OUT/log.txt"
  echo "tune rc $?"; cut -c 1-1100 "$OUT/tune.jsonl"
  # the K = 5120 shapes (32 programs an SM at 64 registers; 25 at 80) with it too
  C='[[2,32,1,1,1,1],[2,32,1,1,1,1,1,1,80],[2,32,1,1,1,1,1,1,72],[2,32,1,1,1,1,1,1,96]]'
  timeout 120 python3 benchmarks/tune_gemv.py --types Q4_K,Q5_K,Q6_K --shapes 34816x5120,10240x5120,6144x5120 \
      --no-small-m --min-ms 5 --configs "$C" > "$OUT/tune5120.jsonl" 2>> "$OUT/log.txt"
  echo "tune5120 rc $?"; cut -c 1-700 "$OUT/tune5120.jsonl"
  synth_wait
  steps_27b pass 'K.GEMV_PREFETCH = True' pass 'K.GEMV_PREFETCH = True'
  ;;
part116c) # the 27B steps A B C A B C: shipped, prefetch on ffn_down (K >= 8192), prefetch on every row-pair GEMV
  synth_bg; synth_wait
  all='K.GEMV_PREFETCH = True; K._GEMV_PREFETCH_MIN_K = 0'
  steps_27b pass 'K.GEMV_PREFETCH = True' "$all" pass 'K.GEMV_PREFETCH = True' "$all"
  ;;
part116b) # after part116 on the same machine: the engine smoke with gemv_two and prefetch on, the GEMV chain
  synth_bg
  DFLASH24_GEMV_PREFETCH=1 timeout 90 python3 benchmarks/gpu_engine_smoke.py > "$OUT/engine_smoke.jsonl" \
      2> "$OUT/engine_smoke.err"
  echo "smoke rc $?"; cut -c 1-1200 "$OUT/engine_smoke.jsonl"
  synth_wait
  for pf in 0 1; do
    DFLASH24_GEMV_PREFETCH=$pf timeout 200 python3 benchmarks/probe_gemv_chain.py "$M" --quick > "$OUT/gemv_chain$pf.json" \
        2>> "$OUT/log.txt"
    echo "probe prefetch=$pf rc $?"; python3 -c "import json,sys; r = json.loads(open(sys.argv[1]).readlines()[-1])
g = r.pop('groups'); r.pop('sweep', None); print(json.dumps(r)); [print(x['type'], x['n'], x['k'], x['calls'],
 x['gemv_us_each'], x['read_us_each'], x['ideal_us_each']) for x in g]" "$OUT/gemv_chain$pf.json"
  done
  ;;
part115) # (runs at ebe9029 only; 2026-12-05 05:13: GEMV_TWO faster, on since; the two-warp tile slower, removed)
         # the ffn_down GEMVs (K 17408: 2,560 two-row one-warp programs; part114b: Q6_K 30.8 us against a 17.5 us
         # read of its bytes, Q4_K 18.6 against 12.7) and two weights of one x in one launch (kernels.gemv_two): GPU
         # tests; the 27B steps shipped / both changes / each alone / shipped / both (TUNE=1: ffn_down tiles with more
         # warps / rows first; LONG1=1: one-row ffn_down programs last)
  synth_bg
  timeout 60 python3 -m pytest -q -rf tests/test_quant_kernels.py -k "gemv_two or row_pair or long_k or fused_linear_runs" \
      > "$OUT/gpu_tests.txt" 2>&1
  echo "tests rc $?"; tail -2 "$OUT/gpu_tests.txt"
  if [ -n "${TUNE:-}" ]; then
    C='[[2,32,1,1,1,1],[2,64,2,1,1,1],[2,32,2,1,1,1],[1,32,1,1,1,0],[1,64,2,1,1,0],[4,32,2,1,1,0]]'
    timeout 60 python3 benchmarks/tune_gemv.py --types Q4_K,Q6_K --shapes 5120x17408 --no-small-m --min-ms 5 \
        --configs "$C" > "$OUT/tune.jsonl" 2>> "$OUT/log.txt"
    echo "tune rc $?"; cut -c 1-900 "$OUT/tune.jsonl"
  fi
  synth_wait
  long2='K._GEMV_TILE_LONG = {K.QT.Q4_K: (2, 64, 2, 1), K.QT.Q6_K: (2, 128, 2, 1)}'
  long1='K._GEMV_TILE_LONG = {K.QT.Q4_K: (1, 32, 1, 1), K.QT.Q6_K: (1, 64, 1, 1)}'
  steps_27b pass "K.GEMV_TWO = True; $long2" 'K.GEMV_TWO = True' "$long2" pass "K.GEMV_TWO = True; $long2"
  [ -n "${LONG1:-}" ] && steps_27b "$long1"
  ;;
part114) # (runs at ccc0491 only; 2026-12-05 04:00: slower, removed) the row-pair GEMV with an equal share of work a
         # program (kernels._gemv_stream_kernel, off): its GPU tests,
         # the engine smoke with it on, the 27B steps shipped / with it for Q4_K, Q5_K, Q6_K, A B A B
  synth_bg
  timeout 90 python3 -m pytest -q -rf -m gpu tests/test_quant_kernels.py -k "stream_agrees or row_pair" \
      > "$OUT/gpu_tests.txt" 2>&1
  echo "tests rc $?"; tail -3 "$OUT/gpu_tests.txt"
  st='K._GEMV_STREAM = {K.QT.Q4_K, K.QT.Q5_K, K.QT.Q6_K}'
  timeout 60 python3 benchmarks/with_settings.py "$st" benchmarks/gpu_engine_smoke.py > "$OUT/engine_smoke.jsonl" \
      2> "$OUT/engine_smoke.err"
  echo "smoke rc $?"; cut -c 1-1200 "$OUT/engine_smoke.jsonl"
  synth_wait
  steps_27b pass "$st" pass "$st"
  ;;
part114b) # (the same warm machine as part114) where the decode step's time goes: its GEMVs replayed alone against a
          # plain read of their bytes; the Q4_K GEMV alone by shape, with the stream kernel (probe_gemv_chain.py)
  synth_bg
  synth_wait
  timeout 300 python3 benchmarks/probe_gemv_chain.py "$M" > "$OUT/gemv_chain.json" 2>> "$OUT/log.txt"
  echo "probe rc $?"; python3 -c "import json,sys; r = json.loads(open(sys.argv[1]).readlines()[-1])
g, s = r.pop('groups'), r.pop('sweep', [])
print(json.dumps(r)); [print(x['type'], x['n'], x['k'], x['calls'], x['gemv_us_each'], x['read_us_each'],
 x['ideal_us_each'], x['cfg']) for x in g]; [print({k: v for k, v in x.items() if k != 'cfg'}) for x in s]" \
      "$OUT/gemv_chain.json"
  ;;
part113) # the shipped state after part112's removals (the sources of 8191663) and with the fused tree build on: the
         # Gluon kernel's GPU tests (as many as 90 s allow; TESTS=0: none, for a short device budget), the engine
         # smoke, the 27B steps once
  synth_bg
  if [ "${TESTS:-1}" != 0 ]; then
    timeout 90 python3 -m pytest -q -rf -x -m gpu tests/test_gluon_matmul.py tests/test_pdl.py \
        > "$OUT/gpu_tests.txt" 2>&1
    echo "tests rc $?"; tail -3 "$OUT/gpu_tests.txt"
  fi
  timeout 60 python3 benchmarks/gpu_engine_smoke.py > "$OUT/engine_smoke.jsonl" 2> "$OUT/engine_smoke.err"
  echo "smoke rc $?"; cut -c 1-1500 "$OUT/engine_smoke.jsonl"
  synth_wait
  steps_27b pass
  ;;
part112) # (runs at 0c80be5 only; 2026-12-05 01:52: all slower, removed) the last session's three changes in one
         # call: their GPU tests (the early trigger on), then the 27B steps shipped / early trigger + whole-share
         # prefetch + WG orientation for every verify row count, A B A B
  synth_bg
  DFLASH24_PDL_EARLY=1 timeout 170 python3 -m pytest -q -rf -m gpu tests/test_quant_kernels.py \
      tests/test_gluon_matmul.py -k "prefetch or graph or wg" > "$OUT/gpu_tests.txt" 2>&1
  tail -3 "$OUT/gpu_tests.txt"
  synth_wait
  all='import dflash24.kernels.pdl as P; P.EARLY = True; K._GEMV_PREFETCH_ALL = True; K.gluon_matmul.PREFETCH_ALL = True'
  all="$all; K.gluon_matmul.WG_ROWS = frozenset(range(1, 33))"
  STEPS_FIRST=2 steps_27b pass "$all" pass "$all"
  ;;
part112b) # (runs at 0c80be5 only; each slower) part112's changes one at a time (same warm machine): AR token ids
          # early trigger off / on, the engine
          # smoke with the early trigger, then the 27B steps with each change alone
  synth_bg
  synth_wait
  for e in 0 1; do
    DFLASH24_PDL_EARLY=$e timeout 100 python3 -m dflash24.cli run --model "$M" --raw --json --max-tokens 48 --spec ar --ctx 4096 \
        "The quick brown fox" > "$OUT/run_early$e.json" 2>> "$OUT/log.txt"; echo "run early=$e rc $?"
  done
  python3 -c "import json,sys; a, b = (json.load(open(f)) for f in sys.argv[1:]); print('same ids:', \
a['token_ids'] == b['token_ids'], len(a['token_ids']))" "$OUT/run_early0.json" "$OUT/run_early1.json"
  DFLASH24_PDL_EARLY=1 timeout 100 python3 benchmarks/gpu_engine_smoke.py > "$OUT/engine_smoke.jsonl" \
      2> "$OUT/engine_smoke.err"; echo "smoke (early trigger) rc $?"; cut -c 1-1500 "$OUT/engine_smoke.jsonl"
  steps_27b 'import dflash24.kernels.pdl as P; P.EARLY = True' \
      'K._GEMV_PREFETCH_ALL = True; K.gluon_matmul.PREFETCH_ALL = True' 'K.gluon_matmul.WG_ROWS = frozenset(range(1, 33))'
  ;;
part108) # (run trimmed 2026-12-05 09:55; shipped) 64-row Gluon tiles (gluon_matmul.MAX_ROWS 64; 33 rows: two launches that each
         # read and decode every weight): GPU tests, kernel times at 33 / 48 / 64 rows against the launches of up to
         # 32 (part108b: the tree budget sweep with each). If faster: MAX_ROWS = 64, TILE[...][64] from the kernel times
  synth_bg
  timeout 200 python3 -m pytest -q -rf -m gpu tests/test_gluon_matmul.py -k "64_row or more_rows" \
      > "$OUT/gpu_tests.txt" 2>&1
  tail -3 "$OUT/gpu_tests.txt"
  for ts in Q4_K:34816x5120,5120x17408,13312x5120 Q6_K:5120x17408 Q5_K:10240x5120; do
    timeout 150 python3 benchmarks/bench_gluon_matmul.py --type ${ts%%:*} --shapes ${ts#*:} --m 33,48,64 --max-rows 64 \
        --tiles T,64x2,64x3,64x4,64x6 > "$OUT/rows64_${ts%%:*}.jsonl" 2>> "$OUT/log.txt"; echo "${ts%%:*} rc $?"
    gluon_table "$OUT/rows64_${ts%%:*}.jsonl"
  done
  ;;
part108b) # (budgets 32, 40, 48, 63 run 2026-12-05 09:55) part108's budget sweep, best on the same warm machine (the 27B file from part108's synth_bg)
  synth_bg
  synth_wait
  for pol in pass 'K.gluon_matmul.MAX_ROWS = 64' pass 'K.gluon_matmul.MAX_ROWS = 64'; do
    timeout 200 python3 benchmarks/with_settings.py "$pol" benchmarks/bench_tree_budget.py "$M" --budgets 22,32,48,63 \
        --gpu-mem 24 > "$OUT/tree_budget.json" 2>> "$OUT/log.txt"
    echo "$pol budget rc $?"; tail -n 1 "$OUT/tree_budget.json" | cut -c 1-1500
  done
  ;;
part107c) # (run 2026-12-05 02:14) the fused DDTree build as shipped (on): the build alone with the path-score check
          # (ties in bf16 logits), the
          # tree budget sweep with it
  synth_bg
  timeout 120 python3 benchmarks/bench_tree_build.py --budgets 8,16,22,32,48,64,127 > "$OUT/tree_build.jsonl" \
      2>> "$OUT/log.txt"; echo "tree build rc $?"; cat "$OUT/tree_build.jsonl"
  synth_wait
  timeout 240 python3 benchmarks/bench_tree_budget.py "$M" --budgets 8,16,22,32,48,64 --gpu-mem 24 \
      > "$OUT/tree_budget.json" 2>> "$OUT/log.txt"; echo "budget rc $?"; tail -n 1 "$OUT/tree_budget.json" | cut -c 1-2500
  ;;
part107) # (run 2026-12-05 02:05: faster, on since) the DDTree build as one Triton
         # program (kernels/tree.py, ddtree.FUSED, off until this runs): its tests on the GPU, the build alone (graphed,
         # against the PyTorch reference), then the 27B steps reference / fused, A B A B. If the tests pass and the
         # steps are faster: FUSED = True
  synth_bg
  timeout 200 python3 -m pytest -q -rf tests/test_tree_kernel.py tests/test_spec.py > "$OUT/tree_tests.txt" 2>&1
  tail -3 "$OUT/tree_tests.txt"
  DFLASH24_FUSED_TREE=1 timeout 100 python3 benchmarks/gpu_engine_smoke.py > "$OUT/engine_smoke.jsonl" \
      2> "$OUT/engine_smoke.err"; echo "smoke (fused tree build) rc $?"; cut -c 1-1500 "$OUT/engine_smoke.jsonl"
  timeout 120 python3 benchmarks/bench_tree_build.py --budgets 8,16,22,32,64,127 > "$OUT/tree_build.jsonl" \
      2>> "$OUT/log.txt"; echo "tree build rc $?"; cat "$OUT/tree_build.jsonl"
  synth_wait
  steps_27b 'import dflash24.spec.ddtree as T; T.FUSED = False' 'import dflash24.spec.ddtree as T; T.FUSED = True' \
      'import dflash24.spec.ddtree as T; T.FUSED = False' 'import dflash24.spec.ddtree as T; T.FUSED = True'
  ;;
part106) # (run 2026-12-04 21:18: both slower) the DeltaNet verify kernel's value columns a program
         # (deltanet.SPEC_CHUNK_TILE, shipped (32, 4):
         # 192 programs a layer, each repeating the token-token products and the inverse): 64 columns, 4 and 8 warps
  [ -f "$M" ] || python3 -m dflash24.synth --preset qwen35-27b --out "$M" > /dev/null 2>&1
  steps_27b 'DN.SPEC_CHUNK_TILE = (64, 4)' pass 'DN.SPEC_CHUNK_TILE = (64, 8)' pass
  ;;
part105) # the Gluon kernel's swapped orientation (gluon_matmul.SWAP_ROWS, empty: off): its GPU tests, then kernel
         # times at 8 / 16 / 23 rows against the shipped tiles, per type. (Run at 21:13 on 2026-12-04: swapped lost at
         # 12 of 15 points, won 3 by <= 8 %; the swapped orientation (SWAP_ROWS, the tiles' "s") since removed, in
         # the commit after 845ff09, so this part runs at d0be0d3..845ff09 only. Its part105b, the 27B steps, never
         # ran and went with it.)
  synth_bg
  timeout 200 python3 -m pytest -q -rf -m gpu tests/test_gluon_matmul.py -k "swapped or vs_reference or rows_past" \
      > "$OUT/gpu_tests.txt" 2>&1
  tail -3 "$OUT/gpu_tests.txt"
  for ts in Q4_K:34816x5120,5120x17408,13312x5120 Q6_K:5120x17408 Q5_K:10240x5120; do
    timeout 150 python3 benchmarks/bench_gluon_matmul.py --type ${ts%%:*} --shapes ${ts#*:} --m 8,16,23 \
        --tiles T,64x2s,64x3s,64x4s,128x2s,128x3s > "$OUT/swap_${ts%%:*}.jsonl" 2>> "$OUT/log.txt"; echo "${ts%%:*} rc $?"
    gluon_table "$OUT/swap_${ts%%:*}.jsonl"
  done
  ;;
part104) # (not run yet) what this session left unmeasured: the split-KV change in alternating order (part103 ran one
         # pair), the budget sweep at 8..64 on the shipped state (32 / 64 take the rows-past-M modes in their launches
         # of 16..32 rows), decode at 8K with 64 splits against 32, and a profile of the 23-node tree verify
  [ -f "$M" ] || python3 -m dflash24.synth --preset qwen35-27b --out "$M" > /dev/null 2>&1
  steps_27b 'import dflash24.kernels.attention as A; A.MIN_SPLIT_ROWS = 256' pass \
      'import dflash24.kernels.attention as A; A.MIN_SPLIT_ROWS = 256' pass
  ;;
part104b) # (run 2026-12-04 21:23) part104's second call, on the same warm machine
  [ -f "$M" ] || python3 -m dflash24.synth --preset qwen35-27b --out "$M" > /dev/null 2>&1
  timeout 300 python3 benchmarks/bench_tree_budget.py "$M" --budgets 8,16,22,32,64 --gpu-mem 24 \
      > "$OUT/tree_budget.json" 2>> "$OUT/log.txt"
  echo "budget rc $?"; tail -n 1 "$OUT/tree_budget.json" | cut -c 1-2500
  timeout 60 python3 benchmarks/bench_attention.py --no-sdpa --quick --splits 16,32,64 > "$OUT/attention.json" 2>&1
  timeout 150 python3 benchmarks/profile_steps.py "$M" --kinds tree --top 20 > "$OUT/profile.txt" 2> "$OUT/profile.err"
  ;;
part103) # split-KV attention from 64 rows a split of the bucket (was 256: 4 splits after a 512-token prompt, 16 now):
         # the 27B steps with 256 and as shipped
  [ -f "$M" ] || python3 -m dflash24.synth --preset qwen35-27b --out "$M" > /dev/null 2>&1
  steps_27b 'import dflash24.kernels.attention as A; A.MIN_SPLIT_ROWS = 256' pass
  ;;
part102) # rows past M by `gluon_matmul.past_mode` (zeros in 16-row tiles, wrapped in 32-row ones): GPU tests, then the
         # tree budget sweep as shipped and with X_PAST_M = 0 (the kernel before)
  synth_bg
  timeout 170 python3 -m pytest -q -rf -m gpu tests/test_gluon_matmul.py > "$OUT/gpu_tests.txt" 2>&1
  tail -3 "$OUT/gpu_tests.txt"
  synth_wait
  for pol in pass 'K.gluon_matmul.X_PAST_M = 0'; do
    timeout 200 python3 benchmarks/with_settings.py "$pol" benchmarks/bench_tree_budget.py "$M" --budgets 8,16,22 \
        --gpu-mem 24 > "$OUT/tree_budget.json" 2>> "$OUT/log.txt"
    echo "$pol budget rc $?"; tail -n 1 "$OUT/tree_budget.json" | cut -c 1-2500
  done
  ;;
part101) # the Gluon kernel's rows past M three ways (X_PAST_M 0: row M - 1 again, 1: zeros, 2: row t % M): kernel times
         # at 9..23 rows, then the 27B steps with 2 and 0, A B A B
  synth_bg
  for ts in Q4_K:34816x5120,5120x17408,13312x5120 Q6_K:5120x17408 Q5_K:10240x5120; do
    timeout 100 python3 benchmarks/bench_gluon_matmul.py --type ${ts%%:*} --shapes ${ts#*:} --m 9,17,20,23 --tiles T \
        --past 0,2 > "$OUT/past_${ts%%:*}.jsonl" 2>> "$OUT/log.txt"; echo "${ts%%:*} rc $?"
    gluon_table "$OUT/past_${ts%%:*}.jsonl"
  done
  synth_wait
  steps_27b 'K.gluon_matmul.X_PAST_M = 2' 'K.gluon_matmul.X_PAST_M = 0' 'K.gluon_matmul.X_PAST_M = 2' \
      'K.gluon_matmul.X_PAST_M = 0'
  ;;
part100) # the Gluon kernel's x rows past M not loaded (they were row M - 1 again): its GPU tests, the tree budget sweep
  synth_bg
  timeout 150 python3 -m pytest -q -rf -m gpu tests/test_gluon_matmul.py > "$OUT/gpu_tests.txt" 2>&1
  tail -3 "$OUT/gpu_tests.txt"
  synth_wait
  timeout 300 python3 benchmarks/bench_tree_budget.py "$M" --budgets 8,15,16,22 --gpu-mem 24 \
      > "$OUT/tree_budget.json" 2>> "$OUT/log.txt"
  echo "budget rc $?"; tail -n 1 "$OUT/tree_budget.json" | cut -c 1-2500
  ;;
part100b) # the 27B steps with the kernel before (an untracked copy of b0dcdab's: dflash24/quant/_gluon_before.py) and
          # after
  steps_27b 'import dflash24.quant._gluon_before as B; K.gluon_matmul = B' pass \
      'import dflash24.quant._gluon_before as B; K.gluon_matmul = B' pass
  ;;
part99)  # where a 17-node tree verify loses 0.7 ms to a 23-node one: per-kernel profiles of tree verify at budgets 15,
         # 16 and 22 (16, 17, 23 nodes), then the step sweep around the cliff
  [ -f "$M" ] || python3 -m dflash24.synth --preset qwen35-27b --out "$M" > /dev/null 2>&1
  timeout 200 python3 benchmarks/profile_steps.py "$M" --kinds tree --budget 15,16,22 --top 30 > "$OUT/profile.txt" \
      2> "$OUT/profile.err"; echo "profile rc $?"
  timeout 300 python3 benchmarks/bench_tree_budget.py "$M" --budgets 15,16,17,19,22 --gpu-mem 24 \
      > "$OUT/tree_budget.json" 2>> "$OUT/log.txt"
  echo "budget rc $?"; tail -n 1 "$OUT/tree_budget.json" | cut -c 1-2500
  ;;
part98)  # 33..96 rows on the Gluon kernel in launches of up to 32 (kernels.GLUON_MAX_ROWS): its GPU tests, then the
         # tree budget sweep at 8, 16, 22, 32, 64 (part97: 32 and 64 on the tl.dot kernel / cuBLAS)
  synth_bg
  timeout 150 python3 -m pytest -q -rf -m gpu tests/test_gluon_matmul.py > "$OUT/gpu_tests.txt" 2>&1
  tail -3 "$OUT/gpu_tests.txt"
  synth_wait
  timeout 300 python3 benchmarks/bench_tree_budget.py "$M" --budgets 8,16,22,32,64 --gpu-mem 24 \
      > "$OUT/tree_budget.json" 2>> "$OUT/log.txt"
  echo "budget rc $?"; tail -n 1 "$OUT/tree_budget.json" | cut -c 1-2500
  ;;
part97)  # the tree budget sweep at the issue's budgets (8, 16, 22, 32, 64; 33+ nodes leave the Gluon kernel's 32 rows)
  [ -f "$M" ] || python3 -m dflash24.synth --preset qwen35-27b --out "$M" > /dev/null 2>&1
  timeout 400 python3 benchmarks/bench_tree_budget.py "$M" --budgets 8,16,22,32,64 --gpu-mem 24 \
      > "$OUT/tree_budget.json" 2>> "$OUT/log.txt"
  echo "budget rc $?"; tail -n 1 "$OUT/tree_budget.json" | cut -c 1-2500
  ;;
part96)  # a verify step's norms over several programs a row (norm.COLS_ROWS): GPU tests of the norm and the verify
         # paths, the engine smoke (AR = chain = tree); the 27B synth written in the background meanwhile (part96b)
  synth_bg
  timeout 150 python3 -m pytest -q -rf -m "gpu or not gpu" tests/test_norm.py tests/test_qwen35_gpu.py -k "norm or verify or pair" \
      > "$OUT/gpu_tests.txt" 2>&1; tail -3 "$OUT/gpu_tests.txt"
  timeout 150 python3 benchmarks/gpu_engine_smoke.py > "$OUT/smoke.jsonl" 2> "$OUT/smoke.err"; cut -c 1-220 "$OUT/smoke.jsonl"
  ;;
part96b) # the 27B steps with whole rows a norm program (COLS_ROWS 1, as before) and as shipped, alternating; a profile
  synth_wait
  steps_27b 'N.COLS_ROWS=1' pass 'N.COLS_ROWS=1' pass
  timeout 150 python3 benchmarks/profile_steps.py "$M" --top 12 > "$OUT/profile.txt" 2> "$OUT/profile.err"
  ;;
part95)  # the 27B steps with part94's best 32-row weight tiles at 16 rows of x (chain verify) against the shipped
         # tiles, alternating (A B A B: part93's first policy was slower in both calls)
  T32='K.gluon_matmul.TILE_BY_SHAPE.update({(QT.Q4_K, 5120, 17408, 16): (32, 4, True), (QT.Q5_K, 10240, 5120, 16): (32, 4, False), (QT.Q6_K, 5120, 17408, 16): (32, 4, True), (QT.Q6_K, 1024, 5120, 16): (32, 8, False)})'
  steps_27b pass "$T32" pass "$T32"
  ;;
part93)  # the 27B steps with the Gluon kernel of 812b80a and its scales made without I2F / F2F (the committed file)
         # against 812b80a's (the untracked copy dflash24/quant/_gluon_before.py, as in part92)
  [ -f "$M" ] || python3 -m dflash24.synth --preset qwen35-27b --out "$M" > /dev/null 2>&1
  steps_27b pass 'import dflash24.quant._gluon_before as B; K.gluon_matmul = B'
  ;;
part92)  # the 27B steps and the tree budget sweep on the Gluon kernel as shipped (what part87 was for); the steps
         # also with the kernel of 812b80a (split-K sums in their own launch), carried as an untracked copy
         # dflash24/quant/_gluon_before.py (git show 812b80a:dflash24/quant/gluon_matmul.py)
  [ -f "$M" ] || python3 -m dflash24.synth --preset qwen35-27b --out "$M" > /dev/null 2>&1
  steps_27b pass 'import dflash24.quant._gluon_before as B; K.gluon_matmul = B'
  timeout 170 python3 benchmarks/bench_tree_budget.py "$M" --budgets 8,15,22,31 --gpu-mem 24 \
      > "$OUT/tree_budget.json" 2>> "$OUT/log.txt"
  echo "budget rc $?"; tail -n 1 "$OUT/tree_budget.json" | cut -c 1-1500
  ;;
part87)  # (not run yet) what part86 left unmeasured: the rest of its GPU tests, Q4_K 32-row tiles of 64 rows with ACC2
         # (they won for Q5_K / Q6_K), then the 27B steps and the tree budget sweep on the shipped tile table
  [ -f "$M" ] || python3 -m dflash24.synth --preset qwen35-27b --out "$M" > /dev/null 2>&1 &
  SYN=$!
  timeout 200 python3 -m pytest -q -rf -m gpu tests/test_gluon_matmul.py tests/test_qwen35_gpu.py \
      > "$OUT/gpu_tests.txt" 2>&1
  tail -3 "$OUT/gpu_tests.txt"
  wait $SYN
  timeout 60 python3 benchmarks/bench_gluon_matmul.py --type Q4_K --m 23 --tiles T,64x2a,64x3a,64x4a,64x6a \
      > "$OUT/gluon_q4k_32.jsonl" 2>> "$OUT/log.txt"
  echo "bench rc $?"; cut -c 1-900 "$OUT/gluon_q4k_32.jsonl"
  steps_27b pass
  timeout 150 python3 benchmarks/bench_tree_budget.py "$M" --budgets 8,15,22,31 --gpu-mem 24 \
      > "$OUT/tree_budget.json" 2>> "$OUT/log.txt"
  echo "budget rc $?"; tail -n 1 "$OUT/tree_budget.json" | cut -c 1-1500
  ;;
part81)  # is the small-M matmul waiting on memory or on its arithmetic? GEMV and dot kernel on L2-sized weights, every
         # byte from DRAM against every byte from L2 (benchmarks/probe_l2.py)
  timeout 200 python3 benchmarks/probe_l2.py --types Q4_K,Q6_K --shapes 8704x5120,5120x8704 --m 1,16,23 \
      > "$OUT/l2.jsonl" 2>> "$OUT/log.txt"
  echo "l2 rc $?"; cat "$OUT/l2.jsonl"
  ;;
part79)  # (runs at 7f2ae47 only) the exact form of the Q4_K small-M matmul (x fp16, code x 6-bit scale an exact fp16
         # integer by one fma a pair, d and the mins per step; SASS 875 instructions a step against 968): GPU test, then
         # Q4_K at M = 16 (K split) / 23 (STREAM), shipped against exact, its inputs made outside the timing
  timeout 60 python3 -m pytest -q -rf tests/test_quant_kernels.py -k "exact_form" > "$OUT/gpu_tests.txt" 2>&1
  tail -2 "$OUT/gpu_tests.txt"
  D='"BLOCK_N":[128],"G":[1],"num_warps":[4],"num_stages":[2],"waves":[2],"w_as_a":[false],"xperm":[true]'
  for spec in '16 "stream":[0],"exact":[false,true]' '23 "stream":[2],"exact":[false,true]'; do
    m=${spec%% *}
    timeout 150 python3 benchmarks/tune_dot.py --types Q4_K --m $m --min-ms 1 \
        --shapes 17408x5120,5120x17408,12288x5120,6144x5120 --grid "{$D,${spec#* }}" > "$OUT/dot_exact$m.jsonl" \
        2>> "$OUT/log.txt"
    echo "M=$m rc $?"; python3 -c "
import json
for l in open('$OUT/dot_exact$m.jsonl'):
    r = json.loads(l)
    if 'all_us' in r: print(r['N'], r['K'], 'gemv', r['gemv_us'], [(u, 'exact' if e else 'shipped') for u, *_, e in r['all_us']])
    elif 'fail' in r: print(l[:300])"
  done
  ;;
part78)  # (runs at b3cbece only) the residual-add norms summing the split matmuls' partials (L.FOLD_SPLIT_SUMS;
         # part77's bound: 0.54 ms of a 16-token verify): GPU tests of the norm and the verify paths, the engine
         # smoke (AR = chain = tree); the 27B synth written in the background meanwhile (part78b uses it)
  synth_bg
  timeout 150 python3 -m pytest -q -rf tests/test_norm.py tests/test_qwen35_gpu.py tests/test_quant_kernels.py \
      -k "split or stream or add or verify or pair" > "$OUT/gpu_tests.txt" 2>&1; tail -3 "$OUT/gpu_tests.txt"
  timeout 150 python3 benchmarks/gpu_engine_smoke.py > "$OUT/smoke.jsonl" 2> "$OUT/smoke.err"; cut -c 1-220 "$OUT/smoke.jsonl"
  ;;
part78b) # (runs at b3cbece only) the 27B steps with the partials summed in the norms, with the sum kernels, with them
         # again
  synth_wait
  steps_27b pass 'L.FOLD_SPLIT_SUMS=False' pass
  ;;
part77)  # what the split-K sums cost a step at most (a bound, wrong values): the 27B steps as shipped, with every split
         # matmul's `_finish` returning an unfilled output instead of launching the sum, as shipped again
  [ -f "$M" ] || python3 -m dflash24.synth --preset qwen35-27b --out "$M" > /dev/null 2>&1
  steps_27b pass 'import torch; K._finish = lambda y, split, out_dtype, bias, stream=None: y[0] if split == 1 else \
torch.empty(y.shape[1:], device=y.device, dtype=out_dtype)' pass
  ;;
part76)  # (runs at de0ed37 only; BENCHMARKS "Session of 2026-12-04 07:41 UTC") the dot kernel's word tiles through a
         # tensor descriptor (TMA: a copy ring the loop waits on per stage, where the cp.async ring waits for every
         # copy, `async_wait num = 0`, and 128 registers against 156 in sm_90 SASS), and M = 23 as two 16-row tiles
         # side by side (K._DOT_M16_UP_TO): GPU tests, then Q4_K at M = 16 (K split) / 23 (STREAM) with and without
         # TMA at 2-4 stages, and 23 rows in 16-row tiles.
  synth_bg
  timeout 60 python3 -m pytest -q -rf tests/test_quant_kernels.py -k "tma_word or side_by_side" > "$OUT/gpu_tests.txt" 2>&1
  tail -2 "$OUT/gpu_tests.txt"
  D='"BLOCK_N":[128],"G":[1],"num_warps":[4],"w_as_a":[false],"xperm":[true]'
  i=0
  for spec in '16 "num_stages":[2,3,4],"waves":[2,3],"stream":[0],"tma":[false,true]' \
              '23 "num_stages":[2,3],"waves":[2],"stream":[2],"tma":[false,true]' \
              '23 "num_stages":[2],"waves":[1,2],"stream":[0],"tma":[false,true],"block_m":[16]'; do
    i=$((i + 1)); m=${spec%% *}
    timeout $((i == 1 ? 200 : 120)) python3 benchmarks/tune_dot.py --types Q4_K --m $m --min-ms 1 \
        --shapes 17408x5120,5120x17408,12288x5120 --grid "{$D,${spec#* }}" > "$OUT/dot_tma$i.jsonl" 2>> "$OUT/log.txt"
    echo "sweep $i (M=$m) rc $?"; python3 -c "
import json
for l in open('$OUT/dot_tma$i.jsonl'):
    r = json.loads(l)
    if 'all_us' in r: print(r['N'], r['K'], 'gemv', r['gemv_us'], 'shipped', r['default_us'], sorted(r['all_us'])[:8])
    elif 'fail' in r: print(l[:300])"
  done
  ;;
part75)  # issue #4's verify cost per tree budget as shipped (the last sweep was taken when an AR step was 12.76 ms):
         # budgets 8, 15 (16 nodes: the chain's 16-row tiles), 16, 22, 32, 64, on a 24 GiB card
  [ -f "$M" ] || python3 -m dflash24.synth --preset qwen35-27b --out "$M" > /dev/null 2>&1
  timeout 300 python3 benchmarks/bench_tree_budget.py "$M" --budgets 8,15,16,22,32,64 --gpu-mem 24 \
      > "$OUT/budgets.jsonl" 2>> "$OUT/log.txt"
  echo "budgets rc $?"; cat "$OUT/budgets.jsonl" | cut -c 1-400
  ;;
part73)  # how far the verify's logits move from the decode's with the Q4_K field form and tf32 token products (the
         # greedy flips they add at near-ties): the real 0.5B (carried in .chunks/q05.*, Q4_K dots; no DeltaNet), then
         # the 27B synth (both options), blocks of 16 and 23 tokens; every policy against the same AR logits
  [ "$(sha256sum /root/q05.gguf | cut -d' ' -f1)" = "$(cat .chunks/q05.sha256)" ] || { echo "q05.gguf incomplete"; exit 3; }
  timeout 150 python3 benchmarks/diag_verify_numerics.py /root/q05.gguf --tokens 256 --prompts 8 --block 16,23 \
      --policies 'pass|K.PAIRS_FIELD=True' > "$OUT/diag05.jsonl" 2>> "$OUT/log.txt"
  echo "diag05 rc $?"; cut -c 1-230 "$OUT/diag05.jsonl"
  synth_wait 40     # the synth started in the first chunk's call
  [ -f "$M.done" ] || { python3 -m dflash24.synth --preset qwen35-27b --out "$M" > /dev/null 2>&1 && touch "$M.done"; }
  timeout 240 python3 benchmarks/diag_verify_numerics.py "$M" --tokens 64 --prompts 3 --block 16,23 \
      --policies 'pass|K.PAIRS_FIELD=True|K.PAIRS_FIELD=False; DN.SPEC_CHUNK_PRECISION=("tf32x3", "tf32")|K.PAIRS_FIELD=True' \
      > "$OUT/diag27.jsonl" 2>> "$OUT/log.txt"
  echo "diag27 rc $?"; cut -c 1-230 "$OUT/diag27.jsonl"
  ;;
part74)  # part73 continued on the same machine: the GPU tests with tf32 token products on (env), then the 27B steps
         # with them, as shipped, with them again
  export DFLASH24_SPEC_CHUNK_PRECISION=tf32x3,tf32
  timeout 90 python3 -m pytest -q -rf tests/test_deltanet.py > "$OUT/tests_tiny.txt" 2>&1; tail -3 "$OUT/tests_tiny.txt"
  timeout 80 python3 -m pytest -q -rf -m gpu tests/test_qwen35_gpu.py > "$OUT/tests_gpu.txt" 2>&1
  tail -3 "$OUT/tests_gpu.txt"
  timeout 90 python3 benchmarks/gpu_engine_smoke.py > "$OUT/smoke.jsonl" 2> "$OUT/smoke.err"; cut -c 1-200 "$OUT/smoke.jsonl"
  unset DFLASH24_SPEC_CHUNK_PRECISION
  [ -f "$M" ] || python3 -m dflash24.synth --preset qwen35-27b --out "$M" > /dev/null 2>&1
  ;;
part74b) # part74's 27B steps (the same machine)
  steps_27b 'DN.SPEC_CHUNK_PRECISION=("tf32x3", "tf32")' pass 'DN.SPEC_CHUNK_PRECISION=("tf32x3", "tf32")'
  ;;
part71)  # a tree step's conv + norms + gate in one conv_qk launch (DN.FUSED_TREE_CONV; the PyTorch tree path before),
         # and the PAIRS decode's field form for Q4_K (K.PAIRS_FIELD: one bf16x2 fma a pair, SASS 846 against 968):
         # GPU tests of both, the Q4_K verify matmul without / with the field form at M = 16 / 23, then the 27B steps
         # as shipped, with the PyTorch tree conv, as shipped again (part72 continues on the same machine)
  timeout 100 python3 -m pytest -q -rf tests/test_deltanet.py tests/test_quant_kernels.py \
      -k "conv_qk or tree_conv or field_form" > "$OUT/gpu_tests.txt" 2>&1; tail -2 "$OUT/gpu_tests.txt"
  G16='{"BLOCK_N":[128],"G":[1],"num_warps":[4],"num_stages":[2],"waves":[2],"w_as_a":[false],"xperm":[true]}'
  G23='{"BLOCK_N":[128],"G":[1],"num_warps":[4],"num_stages":[2],"waves":[2],"w_as_a":[false],"xperm":[true],"stream":[2]}'
  for pol in pass 'K.PAIRS_FIELD=True'; do
    for m in 16 23; do
      [ $m = 16 ] && G=$G16 || G=$G23
      timeout 60 python3 benchmarks/with_settings.py "$pol" benchmarks/tune_dot.py --types Q4_K --m $m --min-ms 1 \
          --shapes 17408x5120,5120x17408,12288x5120 --grid "$G" >> "$OUT/dot_field.jsonl" 2>> "$OUT/log.txt"
      echo "$pol M=$m rc $?"
    done
  done
  python3 -c "
import json, sys
for l in open(sys.argv[1]):
    d = json.loads(l)
    if 'N' in d: print(d['N'], d['K'], d['M'], d['gemv_us'], [b['us'] for b in d['best']])" "$OUT/dot_field.jsonl"
  [ -f "$M" ] || python3 -m dflash24.synth --preset qwen35-27b --out "$M" > /dev/null 2>&1
  steps_27b pass 'DN.FUSED_TREE_CONV=False' pass
  ;;
part72)  # part71 continued (the same warm machine): the 27B steps with the field form, as shipped, with tf32 for the
         # speculative-step kernel's products among the tokens, with both; then the per-kernel profile of the three
         # steps as shipped (eager; the tree verify's first profile)
  [ -f "$M" ] || python3 -m dflash24.synth --preset qwen35-27b --out "$M" > /dev/null 2>&1
  steps_27b 'K.PAIRS_FIELD=True' pass 'DN.SPEC_CHUNK_PRECISION=("tf32x3", "tf32")' \
      'K.PAIRS_FIELD=True; DN.SPEC_CHUNK_PRECISION=("tf32x3", "tf32")'
  timeout 100 python3 benchmarks/profile_steps.py "$M" --top 22 > "$OUT/profile.jsonl" 2>> "$OUT/log.txt"
  echo "profile rc $?"; cut -c 1-1500 "$OUT/profile.jsonl"
  ;;
part70)  # next: the speculative-step kernel with tf32 for the products among a step's tokens (part69, per layer: a 23-node
         # tree 19.69 against 32.60 us, a 16-token chain 10.34 against 14.10; error 2e-3 of the outputs' max, against
         # 4e-7): the 27B steps with it, as shipped, with it again
  [ -f "$M" ] || python3 -m dflash24.synth --preset qwen35-27b --out "$M" > /dev/null 2>&1
  steps_27b 'DN.SPEC_CHUNK_PRECISION=("tf32x3", "tf32")' pass 'DN.SPEC_CHUNK_PRECISION=("tf32x3", "tf32")'
  ;;
part69)  # part68 again after the kernel's products went over Dk in slices of 16 (part68: ptxas spilled at 32-token tiles),
         # and the split dot kernel summing its own partials (K.SPLIT_FIXUP of commit 73859a5, reverted after this run:
         # slower): GPU tests of both, per-layer DeltaNet times per tile / precision, then the 27B steps with both, without
         # either, with both again
  timeout 100 python3 -m pytest -q -rf tests/test_deltanet.py tests/test_quant_kernels.py -k "spec_chunk or fixup" \
      > "$OUT/gpu_tests.txt" 2>&1; tail -2 "$OUT/gpu_tests.txt"
  for cfg in "tf32x3,tf32x3 32,4" "tf32x3,tf32 32,4" "tf32x3,tf32x3 16,8"; do
    set -- $cfg
    timeout 50 python3 benchmarks/bench_spec_delta.py --tokens 16,23 --precision $1 --tile $2 >> "$OUT/delta.jsonl" \
        2>> "$OUT/log.txt"
  done
  cut -c 1-200 "$OUT/delta.jsonl"
  [ -f "$M" ] || python3 -m dflash24.synth --preset qwen35-27b --out "$M" > /dev/null 2>&1
  steps_27b pass 'DN.SPEC_CHUNK=False' 'K.SPLIT_FIXUP=False' pass
  ;;
part68)  # the speculative-step DeltaNet kernel (kernels/deltanet.py spec_chunk_triton: a chain or a tree by matrix
         # products, no per-node states): its tests on the GPU, its time per layer against the recurrent kernel's, and
         # the 27B steps with it (shipped) and without (DN.SPEC_CHUNK=False), in one call
  timeout 120 python3 -m pytest -q -rf tests/test_deltanet.py > "$OUT/gpu_tests.txt" 2>&1; tail -3 "$OUT/gpu_tests.txt"
  timeout 100 python3 benchmarks/bench_spec_delta.py > "$OUT/delta.jsonl" 2> "$OUT/log.txt"; cat "$OUT/delta.jsonl"
  [ -f "$M" ] || python3 -m dflash24.synth --preset qwen35-27b --out "$M" > /dev/null 2>&1
  steps_27b pass 'DN.SPEC_CHUNK=False' pass
  ;;
part67)  # GPU tests of the dot kernel as restructured (_dot_rows; the STREAM split on for Q4_K's 32-row tiles: the M = 23
         # cases at the two large shapes take it), AR == chain == tree on the tiny models, and 256-row tiles of 8 warps
         # (with a register cap of 128: two programs an SM) at M = 16
  timeout 170 python3 -m pytest -m gpu -q -rf tests/test_quant_kernels.py -k "Q4_K or Q5_K or Q6_K" \
      > "$OUT/gpu_tests.txt" 2>&1; tail -3 "$OUT/gpu_tests.txt"
  timeout 90 python3 benchmarks/gpu_engine_smoke.py > "$OUT/engine_smoke.jsonl" 2> "$OUT/engine_smoke.err"
  echo "smoke rc $?"; cut -c 1-400 "$OUT/engine_smoke.jsonl"
  G='"BLOCK_N":[128,256],"G":[1],"num_warps":[4,8],"num_stages":[2],"waves":[2],"w_as_a":[false],"xperm":[true]'
  timeout 120 python3 benchmarks/tune_dot.py --types Q4_K --m 16 --min-ms 1 --shapes 17408x5120,5120x17408 \
      --grid "{$G, \"maxnreg\":[0,128], \"stream\":[0,2]}" > "$OUT/q4.jsonl" 2> "$OUT/log.txt"
  cut -c 1-200 "$OUT/q4.jsonl"
  ;;
part66)  # the dot kernel's cp.async ring depth: with 2 stages the loop waits for every copy at its top and issues the
         # next step's copies after its dots (TTGIR: async_wait num 0), so no copy overlaps the same warp's compute
         # (part60: 32 % of the stall samples at that barrier); with 3 the wait leaves the next step's 9 copies in
         # flight. Q4_K / Q6_K at M = 16 / 23, stages 2-4, with and without the STREAM split
  Q4='"BLOCK_N":[128],"G":[1],"num_warps":[4],"num_stages":[2,3,4],"waves":[2],"w_as_a":[false],"xperm":[true]'
  Q6='"BLOCK_N":[64],"G":[1],"num_warps":[4],"num_stages":[2,3,4],"w_as_a":[true],"xperm":[true],"maxnreg":[0]'
  for m in 16 23; do
    timeout 130 python3 benchmarks/tune_dot.py --types Q4_K --m $m --min-ms 1 --shapes 17408x5120,5120x17408,12288x5120,6144x5120 \
        --grid "{$Q4, \"maxnreg\":[0], \"stream\":[0,2]}" >> "$OUT/q4.jsonl" 2>> "$OUT/log.txt"
    timeout 60 python3 benchmarks/tune_dot.py --types Q6_K --m $m --min-ms 1 --shapes 5120x17408 \
        --grid "{$Q6, \"waves\":[$([ $m = 16 ] && echo 8 || echo 2)], \"stream\":[0,2]}" >> "$OUT/q6.jsonl" 2>> "$OUT/log.txt"
  done
  cut -c 1-200 "$OUT/q4.jsonl" "$OUT/q6.jsonl"
  ;;
part65)  # the 27B steps per launch policy, in one call: POLICIES, '|'-separated with_settings statements (part64's
         # candidates for K._DOT_STREAM), each run after 'pass' (as shipped) and 'pass' again last
  [ -f "$M" ] || python3 -m dflash24.synth --preset qwen35-27b --out "$M" > /dev/null 2>&1
  DEF='K._DOT_STREAM={QT.Q4_K: (0, 2)}'      # (a default with braces cannot sit inside ${POLICIES:-...})
  IFS='|' read -r -a POL <<< "pass|${POLICIES:-$DEF}|pass"
  steps_27b "${POL[@]}"
  ;;
part64)  # the dot kernel's STREAM split (kernels.stream_split: every SM the same work, where the K split's grid leaves
         # a third of the SMs idle at the end: part60) and register caps (maxnreg: 4 programs an SM at M = 16, 3 at 23)
         # for Q4_K and Q6_K at M = 16 / 23: GPU tests, then each config timed (its error against the K split printed)
  timeout 150 python3 -m pytest -q -rf tests/test_quant_kernels.py -k "stream_split or (scale_words_agree and Q4_K)" \
      > "$OUT/gpu_tests.txt" 2>&1; tail -1 "$OUT/gpu_tests.txt"
  Q4='"BLOCK_N":[128],"G":[1],"num_warps":[4],"num_stages":[2],"waves":[2],"w_as_a":[false],"xperm":[true]'
  Q6='"BLOCK_N":[64],"G":[1],"num_warps":[4],"num_stages":[2],"w_as_a":[true],"xperm":[true],"maxnreg":[0]'
  S4=17408x5120,5120x17408,12288x5120,6144x5120,5120x6144
  timeout 170 python3 benchmarks/tune_dot.py --types Q4_K --m 16 --min-ms 1 --shapes $S4 \
      --grid "{$Q4, \"maxnreg\":[0,128], \"stream\":[0,2,3,4]}" > "$OUT/q4_m16.jsonl" 2> "$OUT/log.txt"
  cut -c 1-300 "$OUT/q4_m16.jsonl"
  timeout 150 python3 benchmarks/tune_dot.py --types Q4_K --m 23 --min-ms 1 --shapes $S4 \
      --grid "{$Q4, \"maxnreg\":[0,168], \"stream\":[0,2,3]}" > "$OUT/q4_m23.jsonl" 2>> "$OUT/log.txt"
  cut -c 1-300 "$OUT/q4_m23.jsonl"
  for m in 16 23; do
    timeout 60 python3 benchmarks/tune_dot.py --types Q6_K --m $m --min-ms 1 --shapes 5120x17408 \
        --grid "{$Q6, \"waves\":[$([ $m = 16 ] && echo 8 || echo 2)], \"stream\":[0,2,3,4]}" >> "$OUT/q6.jsonl" 2>> "$OUT/log.txt"
  done
  cut -c 1-300 "$OUT/q6.jsonl"
  ;;
part63)  # lean (no 27B file): the Q4_K verify matmul alone at M = 16, the settings before this session (PAIRS 1 at 16
         # rows, d / dmin as f16 loads) against the shipped ones, and the shipped decode with the weights as the first
         # operand on mma.sync (2 warps: no wgmma; SASS 913 instructions a step against 968) or 64-row tiles
  G1='{"BLOCK_N":[128],"G":[1],"num_warps":[4],"num_stages":[2],"waves":[2],"w_as_a":[false],"xperm":[true]}'
  G8='{"BLOCK_N":[64,128],"G":[1],"num_warps":[2,4],"num_stages":[2],"waves":[2],"w_as_a":[false,true],"xperm":[true]}'
  timeout 90 python3 benchmarks/with_settings.py 'K._PAIRS_LOP3_FROM=32; K._SCALE_WORDS[QT.Q4_K]=(2, 0)' \
      benchmarks/tune_dot.py --types Q4_K --m 16 --min-ms 1 --shapes 17408x5120,5120x17408,12288x5120 --grid "$G1" \
      > "$OUT/dot_before.jsonl" 2> "$OUT/log.txt"; cut -c 1-400 "$OUT/dot_before.jsonl"
  timeout 150 python3 benchmarks/tune_dot.py --types Q4_K --m 16 --min-ms 1 --shapes 17408x5120,5120x17408,12288x5120 \
      --grid "$G8" > "$OUT/dot_shipped.jsonl" 2>> "$OUT/log.txt"; cut -c 1-900 "$OUT/dot_shipped.jsonl"
  ;;
part62)  # the shipped state after part59 / part61 (the Q4_K dot kernel's lop3 decode at M = 16 and d / dmin words, the
         # recurrent kernel's prefetch) against the state before this session's changes, in one call (lean: no tests)
  [ -f "$M" ] || python3 -m dflash24.synth --preset qwen35-27b --out "$M" > /dev/null 2>&1
  OLD='K._PAIRS_LOP3_FROM=32; K._SCALE_WORDS[QT.Q4_K]=(2, 0); DN.RECURRENT_PREFETCH=False'
  i=0
  for pol in 'pass' "$OLD" 'pass'; do
    i=$((i + 1))
    timeout $((i == 1 ? 130 : 70)) python3 benchmarks/with_settings.py "$pol" benchmarks/bench_spec.py "$M" \
        --gpu-mem 24 --ctx 4096 --iters 10 --modes ar > "$OUT/spec$i.json" 2>> "$OUT/log.txt"
    echo "$pol rc $?"; head -n 1 "$OUT/spec$i.json" | cut -c 180-700
  done
  ;;
part61)  # part59 found the three verify changes together slower (verify16 15.80 ms against 15.49 / 15.40 with all off)
         # and the Q4_K dot settings faster (15.21 with them on top): each change alone, all with the dot settings.
         # (Run at 11:40 on 2026-12-03: the split sums and the verify-row COLS lost or did nothing and were removed
         # with their switches N.COLS_MAX_ROWS and L.SPLIT_SUM, which this part and part59 still name.)
  [ -f "$M" ] || python3 -m dflash24.synth --preset qwen35-27b --out "$M" > /dev/null 2>&1 &
  timeout 60 python3 -m pytest -q -rf tests/test_norm.py -k "split_partials or several" > "$OUT/gpu_tests.txt" 2>&1
  tail -1 "$OUT/gpu_tests.txt"
  wait
  KNOBS='K._PAIRS_LOP3_FROM=16; K._SCALE_WORDS[QT.Q4_K]=(2, 1)'
  OFF='DN.RECURRENT_PREFETCH=False; N.COLS_MAX_ROWS=1; L.SPLIT_SUM=False'
  i=0
  for pol in "$KNOBS; $OFF" "$KNOBS; N.COLS_MAX_ROWS=1; L.SPLIT_SUM=False" \
             "$KNOBS; DN.RECURRENT_PREFETCH=False; N.COLS_MAX_ROWS=1" \
             "$KNOBS; DN.RECURRENT_PREFETCH=False; L.SPLIT_SUM=False" "$KNOBS; $OFF"; do
    i=$((i + 1))
    timeout $((i == 1 ? 150 : 80)) python3 benchmarks/with_settings.py "$pol" benchmarks/bench_spec.py "$M" \
        --gpu-mem 24 --ctx 4096 --iters 10 --modes ar > "$OUT/spec$i.json" 2>> "$OUT/log.txt"
    echo "$pol rc $?"; head -n 1 "$OUT/spec$i.json" | cut -c 180-700
  done
  ;;
part60)  # where the Q4_K dot kernel's warps stall: Nsight Compute's SASS source page, M = 16, x in pair order
  NCU=$(command -v ncu || ls /usr/local/cuda*/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
  echo "ncu: $NCU"
  timeout 150 "$NCU" --clock-control none -k regex:_dot_kernel --launch-skip 2 --launch-count 1 \
      --section SourceCounters --section WarpStateStats --section SpeedOfLight --section Occupancy \
      -o /tmp/dot_src -f python3 benchmarks/ncu_matmul.py Q4_K --xperm > "$OUT/log.txt" 2>&1
  echo "ncu rc $?"; tail -2 "$OUT/log.txt"
  "$NCU" -i /tmp/dot_src.ncu-rep --page source --csv --print-source sass > /tmp/dot_src.csv 2>> "$OUT/log.txt"
  python3 benchmarks/ncu_source_summary.py /tmp/dot_src.csv --top 60 > "$OUT/ncu_summary.txt" 2>&1
  "$NCU" -i /tmp/dot_src.ncu-rep --page details >> "$OUT/ncu_summary.txt" 2>&1
  gzip -c /tmp/dot_src.csv > "$OUT/dot_src.csv.gz"
  head -c 2500 "$OUT/ncu_summary.txt"
  ;;
part59)  # part58's GPU tests, and this session's three verify-step changes, all off / all on in one call: the recurrent
         # kernel's prefetch (DN.RECURRENT_PREFETCH: token t + 1's inputs loaded during token t's step), the norms'
         # verify rows written COLS columns a program (N.COLS_MAX_ROWS 64; 1 = decode rows only, as before), the
         # residual-stream matmuls' split-K partials summed by the next norm (L.SPLIT_SUM); then with all three the
         # Q4_K dot kernel's mask-and-or as one lop3 at M = 16 too (K._PAIRS_LOP3_FROM 16) and d / dmin read as int32
         # words (Q4_K's dot WORDS 1: cp.async-copied, no synchronous load or shared-memory layout conversion left in
         # the loop; SASS 968 instructions a step against 1,061, 152 registers against 167); all off again
  [ -f "$M" ] || python3 -m dflash24.synth --preset qwen35-27b --out "$M" > /dev/null 2>&1 &
  timeout 150 python3 -m pytest -q -rf tests/test_norm.py tests/test_deltanet.py tests/test_quant_kernels.py \
      -k "not test_quant_kernels or (scale_words_agree and Q4_K)" > "$OUT/gpu_tests.txt" 2>&1
  tail -1 "$OUT/gpu_tests.txt"
  wait
  OFF='DN.RECURRENT_PREFETCH=False; N.COLS_MAX_ROWS=1; L.SPLIT_SUM=False'
  i=0
  for pol in "$OFF" 'pass' 'K._PAIRS_LOP3_FROM=16; K._SCALE_WORDS[QT.Q4_K]=(2, 1)' "$OFF"; do
    i=$((i + 1))
    timeout $((i == 1 ? 150 : 100)) python3 benchmarks/with_settings.py "$pol" benchmarks/bench_spec.py "$M" \
        --gpu-mem 24 --ctx 4096 --iters 10 --modes ar > "$OUT/spec$i.json" 2>> "$OUT/log.txt"
    echo "$pol rc $?"; head -n 1 "$OUT/spec$i.json" | cut -c 180-700
  done
  ;;
part58)  # the verify step without its 96 DeltaNet copies (the gated norm's gate read in place, conv_qk keeping the raw
         # rows): GPU bits of the two, the engine smoke, the 27B steps (compare with part54 / part56: 15.43-15.45 ms)
  [ -f "$M" ] || python3 -m dflash24.synth --preset qwen35-27b --out "$M" > /dev/null 2>&1 &
  timeout 120 python3 -m pytest -q -rf tests/test_norm.py tests/test_deltanet.py > "$OUT/gpu_tests.txt" 2>&1
  tail -1 "$OUT/gpu_tests.txt"
  timeout 120 python3 benchmarks/gpu_engine_smoke.py > "$OUT/engine_smoke.jsonl" 2> "$OUT/engine_smoke.err"
  echo "smoke rc $?"; cut -c 1-300 "$OUT/engine_smoke.jsonl"
  wait
  for i in 1 2; do
    timeout 100 python3 benchmarks/bench_spec.py "$M" --gpu-mem 24 --ctx 4096 --iters 10 --modes ar \
        > "$OUT/spec$i.json" 2> "$OUT/spec$i.err"
    echo "rc $?"; head -n 1 "$OUT/spec$i.json" | cut -c 180-700
  done
  ;;
part57)  # part55 on the embedded default's shape: the synthetic Qwen2.5-Coder-0.5B (qwen2), the fusion off / on / off
  python3 -m dflash24.synth --preset qwen2-0.5b --out /root/q2_05.gguf > /dev/null 2>&1
  i=0
  for pol in 'L.FUSED_QK=False' 'L.FUSED_QK=True' 'L.FUSED_QK=False'; do
    i=$((i + 1))
    timeout 90 python3 benchmarks/with_settings.py "$pol" benchmarks/bench_spec.py /root/q2_05.gguf --ctx 4096 \
        --iters 20 --modes ar > "$OUT/spec05_fuse$i.json" 2> "$OUT/spec05_fuse$i.err"
    echo "$pol rc $?"; head -n 1 "$OUT/spec05_fuse$i.json" | cut -c 180-700
  done
  ;;
part56)  # the GEMV loop unrolled (K._GEMV_UNROLL; SASS: the next step's loads issued before this step's dp4a): GPU bits;
         # the GEMV alone at the 27B's shapes per unroll factor (tune_gemv); the 27B steps with 1 / 2 / 1 for every type
         # (Run at 07:50 on 2026-12-03: decode 5.998 ms with 2, 5.993 with 1; the sweep's file did not come back: the
         # device tool returns 8 files a call.)
  [ -f "$M" ] || python3 -m dflash24.synth --preset qwen35-27b --out "$M" > /dev/null 2>&1 &
  timeout 60 python3 -m pytest -q -rf tests/test_quant_kernels.py -k "unrolled" > "$OUT/gpu_tests.txt" 2>&1
  tail -1 "$OUT/gpu_tests.txt"
  timeout 150 python3 benchmarks/tune_gemv.py --types Q4_K,Q5_K,Q6_K --no-small-m --min-ms 4 \
      --shapes 34816x5120,5120x17408,6144x5120,5120x6144,10240x5120,248320x5120 \
      --configs '[[2,32,1,1,1,1,1],[2,32,1,1,1,1,2],[2,32,1,1,1,1,3],[2,32,1,1,1,1,4]]' > "$OUT/unroll.jsonl" 2> "$OUT/unroll.err"
  python3 -c "
import json, sys
for ln in open(sys.argv[1]):
    d = json.loads(ln)
    if 'qtype' in d:
        print(d['qtype'], d['N'], d['K'], {k: v[0] for k, v in d.items() if k.startswith('int8_')})" "$OUT/unroll.jsonl"
  wait
  i=0
  for pol in 'K._GEMV_UNROLL={}' 'K._GEMV_UNROLL={QT.Q4_K: 2, QT.Q5_K: 2, QT.Q6_K: 2}' 'K._GEMV_UNROLL={}'; do
    i=$((i + 1))
    timeout 100 python3 benchmarks/with_settings.py "$pol" benchmarks/bench_spec.py "$M" --gpu-mem 24 --ctx 4096 \
        --iters 10 --modes ar > "$OUT/spec_unroll$i.json" 2> "$OUT/spec_unroll$i.err"
    echo "$pol rc $?"; head -n 1 "$OUT/spec_unroll$i.json" | cut -c 180-420
  done
  ;;
part54)  # fewer launches a step: an attention layer's q/k norms + rotary + KV write as one kernel (L.FUSED_QK; six
         # launches before), the DeltaNet g / beta inside conv_qk's launch (DN.FUSED_GATE). GPU tests of both; the
         # engine smoke (AR == chain == tree); the 27B steps with both off, on, off; the decode profile with both on.
  [ -f "$M" ] || python3 -m dflash24.synth --preset qwen35-27b --out "$M" > /dev/null 2>&1 &
  timeout 150 python3 -m pytest -q -rf tests/test_rope.py tests/test_deltanet.py tests/test_qwen35_gpu.py \
      > "$OUT/gpu_tests.txt" 2>&1
  tail -3 "$OUT/gpu_tests.txt"
  timeout 90 python3 benchmarks/gpu_engine_smoke.py > "$OUT/engine_smoke.jsonl" 2> "$OUT/engine_smoke.err"
  echo "smoke rc $?"; tail -c 600 "$OUT/engine_smoke.jsonl"
  wait
  i=0
  for pol in 'L.FUSED_QK=False; DN.FUSED_GATE=False' 'L.FUSED_QK=True; DN.FUSED_GATE=True' \
             'L.FUSED_QK=False; DN.FUSED_GATE=False'; do
    i=$((i + 1))
    timeout 100 python3 benchmarks/with_settings.py "$pol" benchmarks/bench_spec.py "$M" --gpu-mem 24 --ctx 4096 \
        --iters 10 --modes ar > "$OUT/spec_fuse$i.json" 2> "$OUT/spec_fuse$i.err"
    echo "$pol rc $?"; head -n 1 "$OUT/spec_fuse$i.json" | cut -c 180-1000
  done
  ;;
part55)  # part54 on a dense target: the synthetic Qwen2.5-Coder-1.5B shape (qwen2: no q/k norms, so rotary + KV write:
         # four launches a layer before); then the whole engine smoke (part54's was cut at 90 s after its tiny qwen2)
  python3 -m dflash24.synth --preset qwen2-1.5b --out /root/q2_15.gguf > /dev/null 2>&1
  i=0
  for pol in 'L.FUSED_QK=False' 'L.FUSED_QK=True' 'L.FUSED_QK=False'; do
    i=$((i + 1))
    timeout 100 python3 benchmarks/with_settings.py "$pol" benchmarks/bench_spec.py /root/q2_15.gguf --ctx 4096 \
        --iters 20 --modes ar > "$OUT/spec15_fuse$i.json" 2> "$OUT/spec15_fuse$i.err"
    echo "$pol rc $?"; head -n 1 "$OUT/spec15_fuse$i.json" | cut -c 180-1000
  done
  timeout 180 python3 benchmarks/gpu_engine_smoke.py > "$OUT/engine_smoke.jsonl" 2> "$OUT/engine_smoke.err"
  echo "smoke rc $?"; cut -c 1-400 "$OUT/engine_smoke.jsonl"
  ;;
part53)  # part51's verify profile: 248 launches of _sum_partials_kernel, 685 us of a 16-token verify's 15,441. Now the
         # tile's last split program sums (K.SUM_SPLITS, _sum_split_tile). And the norms' pair rows stored as whole
         # steps permuted in registers (N.PAIR_STORE=2) against each value at its place (1). GPU bits; 27B steps per
         # setting; profile of the first. (Run at 04:25 on 2026-12-03 at 4ef35f3: both lose, verify16 15.76 ->
         # 17.27 ms with PAIR_STORE=2, the dot kernels 11.9 -> 14.8 ms with SUM_SPLITS; both switches since removed.)
  [ -f "$M" ] || python3 -m dflash24.synth --preset qwen35-27b --out "$M" > /dev/null 2>&1 &
  timeout 150 python3 -m pytest -q -rf tests/test_quant_kernels.py tests/test_norm.py tests/test_qwen35_gpu.py \
      -k "summed_in_the_kernel or cuda_graph_capture_gpu or bias_and_output or pair or (kernel_vs_reference_gpu and Q4_K and (16 or 23))" \
      > "$OUT/gpu_tests.txt" 2>&1
  tail -3 "$OUT/gpu_tests.txt"
  wait
  i=0
  for pol in 'K.SUM_SPLITS=True; N.PAIR_STORE=2' 'K.SUM_SPLITS=False; N.PAIR_STORE=2' 'K.SUM_SPLITS=False; N.PAIR_STORE=1'; do
    i=$((i + 1))
    timeout 120 python3 benchmarks/with_settings.py "$pol" benchmarks/bench_spec.py "$M" --gpu-mem 24 --ctx 4096 \
        --iters 10 --modes ar > "$OUT/spec_pol$i.json" 2> "$OUT/spec_pol$i.err"
    echo "$pol rc $?"; head -n 1 "$OUT/spec_pol$i.json" | cut -c 180-1000
  done
  timeout 150 python3 benchmarks/with_settings.py 'K.SUM_SPLITS=True; N.PAIR_STORE=2' benchmarks/profile_steps.py "$M" \
      --top 12 > "$OUT/profile.txt" 2> "$OUT/profile.err"
  ;;
part52)  # part51's profile: the decode step's 209 norms take 0.80 ms of kernel time (6.61 ms), 3.8 us each, the 129
         # rows of 5120 one program (one SM) each. Now COLS columns a program (kernels/norm.py). GPU bits; the norm
         # alone per COLS (probe_norm.py); the 27B steps with COLS 0 / 256 / 512 (pair rows from 2 tokens: part51)
  [ -f "$M" ] || python3 -m dflash24.synth --preset qwen35-27b --out "$M" > /dev/null 2>&1 &
  timeout 100 python3 -m pytest -q -rf tests/test_norm.py tests/test_qwen35_gpu.py -k "norm or pair" \
      > "$OUT/gpu_tests.txt" 2>&1
  tail -3 "$OUT/gpu_tests.txt"
  timeout 60 python3 benchmarks/probe_norm.py --cols 0,128,256,512,1024 > "$OUT/probe_norm.jsonl" 2> "$OUT/probe_norm.err"
  cat "$OUT/probe_norm.jsonl"
  wait
  i=0
  for pol in 'N.COLS=0' 'N.COLS=256' 'N.COLS=512'; do
    i=$((i + 1))
    timeout 120 python3 benchmarks/with_settings.py "$pol" benchmarks/bench_spec.py "$M" --gpu-mem 24 --ctx 4096 \
        --iters 10 --modes ar > "$OUT/spec_cols$i.json" 2> "$OUT/spec_cols$i.err"
    echo "$pol rc $?"; head -n 1 "$OUT/spec_cols$i.json" | cut -c 180-1000
  done
  ;;
part51)  # part50: with pair rows from 2 tokens the 16-token verify's norms took 1.85 ms instead of 0.53 (silu_mul 0.29
         # against 0.11), more than its dot kernels gained (0.69 ms): the pair stores' 64-bit index divisions. Now
         # 32-bit shifts and masks. GPU bits; profile from 2 tokens; 27B steps from 2 tokens and as shipped (17)
  [ -f "$M" ] || python3 -m dflash24.synth --preset qwen35-27b --out "$M" > /dev/null &
  timeout 100 python3 -m pytest -q -rf tests/test_norm.py tests/test_qwen35_gpu.py -k "pair" > "$OUT/gpu_tests.txt" 2>&1
  tail -3 "$OUT/gpu_tests.txt"
  wait
  timeout 150 python3 benchmarks/with_settings.py 'K.PAIRS_FROM_TOKENS=2' benchmarks/profile_steps.py "$M" --top 12 \
      > "$OUT/profile_pairs2.txt" 2> "$OUT/profile_pairs2.err"
  i=0
  for pol in 'K.PAIRS_FROM_TOKENS=2' 'K.PAIRS_FROM_TOKENS=17'; do
    i=$((i + 1))
    timeout 120 python3 benchmarks/with_settings.py "$pol" benchmarks/bench_spec.py "$M" --gpu-mem 24 --ctx 4096 \
        --iters 10 --modes ar > "$OUT/spec_pol$i.json" 2> "$OUT/spec_pol$i.err"
    echo "$pol rc $?"; head -n 1 "$OUT/spec_pol$i.json" | cut -c 180-1000
  done
  ;;
part50)  # part47/48: making the pair rows from 2 tokens cost the 16-token verify 1.7-2.0 ms although its dot kernels
         # gained on them alone. The per-kernel profile with them from 2 tokens and as shipped (from 17); the Q6_K LM
         # head and FFN down with XPERM at M = 16 (never timed alone); the shipped 27B steps (16-row Q5_K / Q6_K
         # waves back at 8 since part48)
  [ -f "$M" ] || python3 -m dflash24.synth --preset qwen35-27b --out "$M" > /dev/null &
  timeout 100 python3 benchmarks/probe_xperm.py --types Q6_K --m 16 --shapes 248320x5120,5120x17408 \
      > "$OUT/probe_xperm_head.jsonl" 2> "$OUT/probe_xperm_head.err"; cat "$OUT/probe_xperm_head.jsonl"
  wait
  timeout 150 python3 benchmarks/with_settings.py 'K.PAIRS_FROM_TOKENS=2' benchmarks/profile_steps.py "$M" --top 30 \
      > "$OUT/profile_pairs2.txt" 2> "$OUT/profile_pairs2.err"
  timeout 150 python3 benchmarks/profile_steps.py "$M" --top 30 > "$OUT/profile.txt" 2> "$OUT/profile.err"
  timeout 120 python3 benchmarks/bench_spec.py "$M" --gpu-mem 24 --ctx 4096 --iters 10 --modes ar \
      > "$OUT/spec.json" 2> "$OUT/spec.err"; head -n 1 "$OUT/spec.json" | cut -c 180-1000
  ;;
part40)  # the profile of the 27B steps as shipped
  [ -f "$M" ] || python3 -m dflash24.synth --preset qwen35-27b --out "$M" > /dev/null
  timeout 150 python3 benchmarks/profile_steps.py "$M" --top 30 > "$OUT/profile.txt" 2> "$OUT/profile.err"
  head -c 4000 "$OUT/profile.txt"
  ;;
part262wait)  # waits up to WAIT seconds (default 540) for part262's run, then copies what it wrote so far
  for _ in $(seq 1 $(( ${WAIT:-540} / 5 ))); do [ -f /root/long_tq3.rc ] && break; sleep 5; done
  cp /root/long_tq3.* "$OUT/" 2>/dev/null; nvidia-smi --query-gpu=memory.used,utilization.gpu --format=csv > "$OUT/smi.txt"
  ;;
part3)   # kernel sweeps: the small-M dot incl. the W_AS_A (wgmma) orientation and dequant + cuBLAS, then the GEMV
  timeout 330 python3 benchmarks/tune_dot.py --types Q4_K,Q6_K,Q5_K > "$OUT/tune_dot.jsonl" 2> "$OUT/tune_dot.err"
  timeout 120 python3 benchmarks/tune_gemv.py --min-ms 10 --types Q4_K,Q6_K > "$OUT/tune_gemv.jsonl" 2>&1
  timeout 150 python3 benchmarks/bench_tree_budget.py "$M" > "$OUT/tree_budget.json" 2> "$OUT/tree_budget.err"
  ;;
part4)   # train the default 0.5B's drafter on ShareGPT answers (after benchmarks/prepare_transfer.sh and the chunk
         # calls it describes: /root/q05.gguf assembled, .chunks/sharegpt4k.json carried); exports every 100 steps
  [ "$(sha256sum /root/q05.gguf | cut -d' ' -f1)" = "$(cat .chunks/q05.sha256)" ] || { echo "q05.gguf incomplete"; exit 3; }
  timeout 580 python3 -m dflash24.cli train-draft --model /root/q05.gguf --out /root/d05 --responses sharegpt \
      --sharegpt .chunks/sharegpt4k.json --n-prompts 4000 --layers 3 --ffn 2432 --max-len 1024 --steps 1200 \
      --batch-size 8 --lr 6e-4 --anchors 256 --save-every 100 --max-minutes ${MINUTES:-7} ${RESUME:+--resume} \
      ${INIT:+--init $INIT} > "$OUT/train.log" 2>&1
  # the drafter comes home in 15 MB pieces (files back from the device: 16 MiB each, 8 at most):
  #   cat d05/model.safetensors.* > DIR/model.safetensors; cp d05/config.json DIR/   (then --init DIR next time)
  mkdir -p "$OUT/d05" && cp /root/d05/config.json /root/d05/train_log.jsonl "$OUT/d05/" &&
      split -b 15M /root/d05/model.safetensors "$OUT/d05/model.safetensors."
  ;;
part4t)  # the same 0.5B, trained on its own greedy answers (z-lab's recipe): the prompts are answered 64 at a time
         # (batched generation, cached in /root/gen: a re-run continues), then training; MINUTES caps the training
  [ "$(sha256sum /root/q05.gguf | cut -d' ' -f1)" = "$(cat .chunks/q05.sha256)" ] || { echo "q05.gguf incomplete"; exit 3; }
  timeout 580 python3 -m dflash24.cli train-draft --model /root/q05.gguf --out /root/d05 --responses target \
      --gen-batch 64 --sharegpt .chunks/sharegpt4k.json --n-prompts 4000 --max-new-tokens 512 --max-len 1024 \
      --data-dir /root/gen --feature-cache /root/fc --layers 3 --ffn 2432 --steps 3000 --batch-size 8 --lr 6e-4 \
      --anchors 256 --save-every 100 --max-minutes ${MINUTES:-4} ${RESUME:+--resume} ${INIT:+--init $INIT} > "$OUT/train.log" 2>&1
  mkdir -p "$OUT/d05" && cp /root/d05/config.json /root/d05/train_log.jsonl "$OUT/d05/" &&
      split -b 15M /root/d05/model.safetensors "$OUT/d05/model.safetensors."
  ;;
part4b)  # the trained drafter's acceptance and speed on the shipped prompts, AR vs chain vs tree; HF parity on the GPU
  DFLASH24_TEST_GGUF=/root/q05.gguf timeout 200 python3 -m pytest -m gpu -q -s tests/test_real_model_gpu.py \
      > "$OUT/hf_parity_q05.txt" 2>&1
  for SPEC in ar chain tree; do
    timeout 150 python3 -m dflash24.cli bench --model /root/q05.gguf --draft /root/d05 --spec $SPEC --suite he,gsm \
        --n-prompts 10 --max-tokens 128 --out "$OUT/bench-$SPEC" > "$OUT/bench-$SPEC.txt" 2>&1
  done
  ;;
part4q)  # the trained drafter per format (issue: quantized drafters): logit agreement, then chain acceptance
  timeout 150 python3 benchmarks/draft_formats_quality.py /root/q05.gguf /root/d05 --prompts 10 --device cuda \
      > "$OUT/formats.jsonl" 2> "$OUT/formats.err"
  for Q in q8_0 q6_k q4_k; do
    python3 -m dflash24.cli quantize-draft /root/d05 /root/d05-$Q.gguf --type $Q > /dev/null &&
    timeout 100 python3 -m dflash24.cli bench --model /root/q05.gguf --draft /root/d05-$Q.gguf --spec chain \
        --suite he,gsm --n-prompts 10 --max-tokens 128 > "$OUT/bench-chain-$Q.txt" 2>&1
  done
  ;;
part5)   # DFLASH24_BATCH_INVARIANT=1: decode and chain-verify logits should be the same bits (max_logit_diff 0.0),
         # chain == AR in the engine smoke; what the mode costs per step; the default beside it
  DFLASH24_BATCH_INVARIANT=1 timeout 150 python3 benchmarks/diag_verify_numerics.py "$M" --tokens 64 --prompts 2 \
      > "$OUT/diag_inv_27b.jsonl" 2>&1
  timeout 150 python3 benchmarks/diag_verify_numerics.py "$M" --tokens 64 --prompts 2 > "$OUT/diag_27b.jsonl" 2>&1
  DFLASH24_BATCH_INVARIANT=1 timeout 100 python3 benchmarks/gpu_engine_smoke.py > "$OUT/engine_smoke_inv.jsonl" \
      2> "$OUT/engine_smoke_inv.err"
  DFLASH24_BATCH_INVARIANT=1 timeout 150 python3 benchmarks/bench_spec.py "$M" --gpu-mem 24 --ctx 4096 --iters 10 \
      > "$OUT/spec_inv.json" 2> "$OUT/spec_inv.err"
  ;;
part5b)  # the invariant mode's prefix-cache identity on the 27B and its decode / verify bits on the real 0.5B
  DFLASH24_BATCH_INVARIANT=1 timeout 200 python3 benchmarks/bench_prefix.py "$M" --history 4096 --ctx 6144 \
      --gpu-mem 24 > "$OUT/prefix_inv.json" 2> "$OUT/prefix_inv.err"     # identical_answers: true expected
  if [ -f /root/q05.gguf ]; then
    DFLASH24_BATCH_INVARIANT=1 timeout 100 python3 benchmarks/diag_verify_numerics.py /root/q05.gguf --tokens 256 \
        --prompts 6 > "$OUT/diag_inv_05.jsonl" 2>&1
  fi
  ;;
*) echo "usage: $0 part1|part1b|part2|part2b|part2x|part3|part4|part4t|part4b|part4q|part5|part5b|part7|part7b|part7s|part9..part14|part15|part16..part22|part26..part87|part262|part262wait|bg PART|bgwait PART" >&2; exit 2 ;;
esac
