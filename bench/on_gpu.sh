#!/usr/bin/env bash
# On the GPU machine, from the project root with the wheels carried in .whl/:
#   bash bench/on_gpu.sh [prebuild] [tests] [sanitize] [sanitize-model] [bench] [tables] [gemm] [prefill] [timeline] [generate] [search] [profile] [ncu] [product] [mma] [attention] [chain] [ab] [variants] [boundary]
#   (default: tests sanitize bench timeline generate)
# Installs mk, runs the gpu-marked tests, compute-sanitizer on the examples, the benchmark
# table (`tables`: it and the presets' ms/token against this card's baselines), the per-grid timelines (TIMELINE_ARGS, e.g. "--model qwen3-0.6b --layers 4") and
# mk-generate on the model presets (MODELS, BATCHES, GENERATE_ARGS e.g. --option kv_splits=8; the
# check is --accuracy: two bf16 implementations of a 28-layer model drift past --logit-tol), and the superoptimizer's kernels against the
# rules (bench/search_bench.py, SEARCH_ARGS), and an op-mark profile of one model step with its trace drawn as
# SVG (PROFILE_ARGS, default "--model qwen3-0.6b --layers 4"; add "--prefill P" for a prefill of P
# positions); `prefill` times mk's prefill against PyTorch's (PREFILL_MODELS, PREFILL_LEN); `ab` runs the benchmark and the model step's
# per-kind times for other checkouts (AB_TREES) and this one side by side (AB_MODELS: whole models
# too). Set MK_COMMIT to the local checkout's commit: the copy here may
# carry stale git metadata;
# logs go to $OUT (or ./gpu-out).
set -u
ROOT=$PWD
OUT=${OUT:-$ROOT/gpu-out}
mkdir -p "$OUT"
steps=${*:-tests sanitize bench timeline generate}
source .whl/on-device.sh || exit 1
# Without --upgrade, pip --target keeps an existing package: on a machine still warm from the
# last call the install would be stale. (/tmp/site also holds the carried wheels.)
python3 -m pip install -q --upgrade --no-build-isolation --no-deps --target /tmp/site . >"$OUT/install.log" 2>&1 \
  || { tail -30 "$OUT/install.log"; exit 1; }
export PYTHONPATH=/tmp/site MK_CACHE_DIR=/tmp/mk-cache
cd /tmp || exit 1
for step in $steps; do
  case $step in
    prebuild)
      # The modules later steps load, built in parallel first (PREBUILD_SPECS, bench/prebuild.py).
      python3 "$ROOT/bench/prebuild.py" --jobs "${PREBUILD_JOBS:-12}" ${PREBUILD_SPECS:-bench:} 2>&1 \
        | tee "$OUT/prebuild.log" | tail -20 ;;
    tests)
      # TESTS_FILES (paths under test/unit, e.g. "test_cuda_backend.py"): a part of the suite,
      # which in one process no longer fits one 10-minute call whole. With pytest-xdist among
      # the wheels (`../shared/gpu/wheels.sh pytest-xdist execnet`) the tests run in TESTS_JOBS
      # processes (6: their nvcc builds overlap; the GPU takes their launches in turn).
      targets="$ROOT/test/unit"
      [ -n "${TESTS_FILES:-}" ] && targets=$(for f in $TESTS_FILES; do printf '%s ' "$ROOT/test/unit/$f"; done)
      jobs=
      python3 -c "import xdist" 2>/dev/null && jobs="-n ${TESTS_JOBS:-6}"
      # shellcheck disable=SC2086
      # TESTS_K: a pytest -k expression (e.g. "ROWS_FIRST") picks tests within those files.
      python3 -m pytest -q -p no:cacheprovider -m gpu $jobs ${TESTS_K:+-k "$TESTS_K"} $targets 2>&1 \
        | tee "$OUT/tests.log" | tail -15 ;;
    sanitize)
      for ex in rmsnorm_linear gated_mlp attention_decode decode_loop; do
        for tool in memcheck racecheck; do
          # racecheck takes the launch-long raw barriers, as test_cuda_sanitizer.py does: with the
          # per-task ones (the default) the tool reports decode_loop's bulk copies as a race.
          bars=task; [ $tool = racecheck ] && bars=launch
          MK_CUDA_RAW_BARS=$bars compute-sanitizer --tool $tool --error-exitcode 3 \
            python3 -m mk.tools.mk_run "$ROOT/examples/$ex.mlir" --target cuda >"$OUT/san_${ex}_$tool.log" 2>&1
          echo "compute-sanitizer $tool $ex: rc=$? $(grep -m1 -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/san_${ex}_$tool.log")"
        done
      done ;;
    sanitize-model)
      # memcheck and racecheck (its build with the launch-long raw barriers, as the tests race)
      # of one mk-generate decode, mk's kernels only (SANITIZE_ARGS: mk-generate's arguments,
      # default a 2-layer qwen3-0.6b at batch 8, 2 steps). memcheck runs it checked against the
      # PyTorch reference; racecheck with the prompt prefilled by mk and no check, since a cuBLAS
      # kernel under racecheck's kernel filter makes the tool fail ("Internal Sanitizer Error:
      # ... hardware exception", a lone bf16 torch matmul too) and, unfiltered, racecheck reports
      # hazards in cuBLAS's and cuDNN's kernels (bench/RESULTS.md, session 72).
      # SANITIZE_FILTER=none races every kernel, the reference's too.
      args=${SANITIZE_ARGS:---model qwen3-0.6b --layers 2 --vocab 2048 --batch 8 --steps 2 --context 1024 --prompt-len 500}
      filter=(--kernel-name kns=megakernel); [ "${SANITIZE_FILTER:-}" = none ] && filter=()
      for tool in memcheck racecheck; do
        envs=(); run=(--check)
        [ $tool = racecheck ] && envs=(MK_CUDA_RAW_BARS=launch) && run=(--prefill mk)
        [ "${SANITIZE_FILTER:-}" = none ] && run=(--check)
        # shellcheck disable=SC2086
        env "${envs[@]}" timeout "${SANITIZE_TIMEOUT:-400}" compute-sanitizer --tool $tool "${filter[@]}" \
          --error-exitcode 3 python3 -m mk.tools.mk_generate $args --target cuda "${run[@]}" >"$OUT/san_model_$tool.log" 2>&1
        echo "compute-sanitizer $tool ($args ${run[*]}): rc=$? $(grep -m2 -E 'SUMMARY|Internal Sanitizer' "$OUT/san_model_$tool.log" | tr '\n' ' ')"
      done ;;
    bench)
      MK_COMMIT=${MK_COMMIT:-} python3 "$ROOT/bench/bench.py" --runs 100 --out "$OUT" 2>&1 | tee "$OUT/bench.log" | tail -14 ;;
    prefill)
      # mk's prefill program against PyTorch's causal pass, caches checked against the f32 model.
      for m in ${PREFILL_MODELS:-qwen3-0.6b llama-3.2-1b}; do
        python3 "$ROOT/bench/prefill.py" --model "$m" --prompt-len "${PREFILL_LEN:-1000}" 2>&1 \
          | tee -a "$OUT/prefill.log" | tail -2
      done ;;
    gemm)
      # Prefill-shaped linears on tensor cores against PyTorch (GEMM_ARGS, e.g. --shapes 256x2048x2048).
      python3 "$ROOT/bench/gemm.py" --runs 50 ${GEMM_ARGS:-} 2>&1 | tee "$OUT/gemm.log" | tail -6 ;;
    search)
      python3 "$ROOT/bench/search_bench.py" --runs 100 --out "$OUT" ${SEARCH_ARGS:-} 2>&1 | tee "$OUT/search.log" | tail -10 ;;
    profile)
      python3 "$ROOT/bench/timeline.py" --ops --out "$OUT" ${PROFILE_ARGS:---model qwen3-0.6b --layers 4} \
        2>&1 | tee "$OUT/profile.log" | tail -40
      for trace in "$OUT"/*_L*_B*.json; do
        [ -e "$trace" ] && python3 "$ROOT/bench/trace_svg.py" "$trace" "${trace%.json}.svg"
      done ;;
    ncu)
      # Warp stalls of one steady-state model step (the third launch), per SASS instruction too.
      ncu -k regex:megakernel --launch-skip 2 --launch-count 1 --import-source no \
        --section WarpStateStats --section SourceCounters --section LaunchStats -f -o "$OUT/step" \
        python3 "$ROOT/bench/timeline.py" ${PROFILE_ARGS:---model qwen3-0.6b --layers 4} >"$OUT/ncu.out" 2>&1
      ncu --import "$OUT/step.ncu-rep" --page raw --csv >"$OUT/ncu.csv" 2>"$OUT/ncu.err"
      ncu --import "$OUT/step.ncu-rep" --page source --print-source sass --csv >"$OUT/sass.csv" 2>>"$OUT/ncu.err"
      # The module's SASS, and its cubin: the symbol table gives each task body's code range.
      mkdir -p "$OUT/cubin"
      for so in /tmp/mk-cache/cuda/*/*.so; do
        cuobjdump -sass "$so" >"$OUT/$(basename "$so" .so).sass" 2>>"$OUT/ncu.err"
        (cd "$OUT/cubin" && cuobjdump -xelf all "$so" >/dev/null 2>>"$OUT/ncu.err")
      done
      python3 "$ROOT/bench/ncu_stalls.py" "$OUT/ncu.csv" | tee "$OUT/ncu.log"
      for cubin in "$OUT"/cubin/*.cubin; do
        [ -e "$cubin" ] && python3 "$ROOT/bench/ncu_bodies.py" "$OUT/sass.csv" "$cubin" ${NCU_BODY:+--body $NCU_BODY} \
          2>&1 | tee -a "$OUT/ncu.log"
      done
      # At most 8 files come back from the device tool: the cubins (the kernel's is the one whose
      # table above is not all `dispatcher`) beside sass.csv, which holds the SASS text too.
      mv "$OUT"/cubin/*.cubin "$OUT"/ 2>/dev/null
      rm -rf "$OUT/cubin" "$OUT/step.ncu-rep" "$OUT"/*.sass ;;
    product)
      python3 "$ROOT/bench/product.py" ${PRODUCT_ARGS:-} 2>&1 | tee "$OUT/product.log" ;;
    mma)
      # The tensor-core product alone: registers against the cp.async ring (MMA_ARGS).
      python3 "$ROOT/bench/mma_product.py" ${MMA_ARGS:---rows 32 --k 4096 --rings 3,4} 2>&1 | tee "$OUT/mma.log" ;;
    attention)
      # One batch-8 decode attention task per CTA, alone (bench/attention_alone.cu), as the
      # megakernel's body is built and with each of ATTENTION_DEFINES (header macros, e.g.
      # MK_ATTN_ROWS_FIRST=0; the full table for the default build, the attention rows for each).
      for define in "" ${ATTENTION_DEFINES:-MK_ATTN_ROWS_FIRST=0 MK_ATTN_ROWS_FIRST=1}; do
        nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a --expt-relaxed-constexpr \
          ${define:+-D$define} -I"$ROOT/runtime/include" "$ROOT/bench/attention_alone.cu" \
          -o /tmp/attention_alone >"$OUT/attention_build.log" 2>&1 || { tail -5 "$OUT/attention_build.log"; continue; }
        echo "== ${define:-default}" | tee -a "$OUT/attention.log"
        if [ -z "$define" ]; then /tmp/attention_alone; else /tmp/attention_alone | grep "attention mma"; fi \
          | tee -a "$OUT/attention.log"
      done ;;
    chain)
      # A decode layer's chain of phases, weights streamed after each wait or by a loader warp
      # ahead of it (CHAIN_ARGS).
      python3 "$ROOT/bench/chain.py" ${CHAIN_ARGS:-} 2>&1 | tee "$OUT/chain.log" ;;
    timeline)
      python3 "$ROOT/bench/timeline.py" --out "$OUT" ${TIMELINE_ARGS:-} 2>&1 | tee "$OUT/timeline.log" | tail -80 ;;
    boundary)
      # bench/boundary.py: what runs between one decode step's lm_head and the next step's first
      # layer (BOUNDARY_MODELS, PRESET:BATCH, default qwen3-0.6b:1 llama-3.2-1b:1; 8 steps a launch).
      for mb in ${BOUNDARY_MODELS:-qwen3-0.6b:1 llama-3.2-1b:1}; do
        python3 "$ROOT/bench/boundary.py" --model "${mb%%:*}" --batch "${mb##*:}" ${BOUNDARY_ARGS:-} 2>&1 \
          | tee -a "$OUT/boundary.log" | tail -30
      done ;;
    variants)
      # bench/variants.py for each of VARIANT_MODELS (PRESET:BATCH, default qwen3-0.6b:1
      # llama-3.2-1b:1) over VARIANTS (space-separated, "" for the defaults, e.g. '"" MK_CUDA_MERGE_EARLY=0'),
      # every variant's build made first, in parallel (VARIANT_TIMEOUT seconds a model, 240).
      eval "variants=(${VARIANTS:-\"\"})"
      specs=; for mb in ${VARIANT_MODELS:-qwen3-0.6b:1 llama-3.2-1b:1}; do specs="$specs gen:$mb"; done
      for v in "${variants[@]}"; do
        # shellcheck disable=SC2086
        env ${v//,/ } python3 "$ROOT/bench/prebuild.py" --jobs 4 $specs >>"$OUT/prebuild.log" 2>&1 &
      done
      wait
      for mb in ${VARIANT_MODELS:-qwen3-0.6b:1 llama-3.2-1b:1}; do
        timeout "${VARIANT_TIMEOUT:-240}" python3 "$ROOT/bench/variants.py" --model "${mb%:*}" --batch "${mb#*:}" \
          --runs 10 --rounds 3 --instances 2 "${variants[@]}" 2>&1 | tee "$OUT/variants_${mb%:*}_b${mb#*:}.log" | tail -$((2 * ${#variants[@]} + 1))
      done ;;
    ab)
      # The benchmark and the model step's per-kind times for other checkouts beside this one
      # (AB_TREES: paths inside this tree, e.g. `mkdir .ab/main && git archive main | tar -x -C
      # .ab/main`, with .ab carried to the GPU machine beside .whl), each installed and built on
      # its own, in one call: a comparison, or a bisection over several commits.
      [ -n "${AB_TREES:-}" ] || { echo "ab: set AB_TREES to other checkouts inside this tree"; exit 1; }
      # A tree may carry environment settings after a colon: `.:MK_CUDA_MMA_L1=1` is this
      # checkout built with that switch, `.:MK_PASS_OPTIONS=kv_splits=4+tile_n=64` compiled with
      # those pass options (bench.py and timeline.py read them).
      for spec in $AB_TREES .; do
        tree=${spec%%:*}; envs=; [ "$spec" != "$tree" ] && envs=${spec#*:}
        name=this; site=/tmp/site
        if [ "$tree" != . ]; then
          name=$(basename "$tree")
          site=/tmp/site-$name
          rm -rf "$site"
          python3 -m pip install -q --no-build-isolation --no-deps --target "$site" "$ROOT/$tree" \
            >"$OUT/install-$name.log" 2>&1 || { tail -30 "$OUT/install-$name.log"; continue; }
        fi
        [ -n "$envs" ] && name=$name-$(echo "$envs" | tr -c 'A-Za-z0-9_\n' '_')
        # mk-generate takes pass options as arguments, not from MK_PASS_OPTIONS.
        gen_opts=
        for kv in ${envs//,/ }; do
          case $kv in MK_PASS_OPTIONS=*)
            for o in $(echo "${kv#MK_PASS_OPTIONS=}" | tr + ' '); do gen_opts="$gen_opts --option $o"; done ;;
          esac
        done
        echo "== $spec"
        # The wheels stay on the path behind the tree's own install.
        # AB_ONLY picks benchmark rows (bench.py --only); AB_ONLY=none skips the benchmark.
        [ "${AB_ONLY:-}" != none ] && env ${envs//,/ } PYTHONPATH=$site:/tmp/site MK_CACHE_DIR=/tmp/mk-cache-$name \
          python3 "$ROOT/bench/bench.py" --runs 60 --only "${AB_ONLY:-}" --out "$OUT/ab-$name" 2>&1 | grep '^|' | tail -8
        # AB_STEP=none skips the model step's profile.
        [ "${AB_STEP:-}" != none ] && env ${envs//,/ } PYTHONPATH=$site:/tmp/site MK_CACHE_DIR=/tmp/mk-cache-$name \
          python3 "$ROOT/bench/timeline.py" ${PROFILE_ARGS:---model qwen3-0.6b --layers 4} 2>&1 \
          | awk '/tasks, step|waits per task|critical path [0-9]/ {print} /starved/ {n=14} n-- > 0 {print} /per statement/ {m=9} m-- > 0 {print}'
        # AB_MODELS: whole models too (mk-generate --bench at each of AB_BATCHES, default 1, no
        # check), each tree in turn in this one call: a 4-layer step can hide what only 28
        # layers show.
        for model in ${AB_MODELS:-}; do
          for batch in ${AB_BATCHES:-1}; do
            env ${envs//,/ } PYTHONPATH=$site:/tmp/site MK_CACHE_DIR=/tmp/mk-cache-$name \
              timeout "${GENERATE_TIMEOUT:-300}" python3 -m mk.tools.mk_generate --model "$model" \
              --batch "$batch" --steps 8 --context 1024 --prompt-len 1000 --target cuda --bench --runs 20 $gen_opts \
              2>&1 | grep -E '^bench: mk|compile:' | sed "s/^/  $model B$batch: /"
          done
        done
      done ;;
    tables)
      # bench.py's table and the presets' ms/token, each against this card's baseline
      # (bench/baselines/<card>.json, models-<card>.json; bench/baseline.py). The models' builds
      # go first, in parallel (TABLE_MODELS, TABLE_BATCHES); batch 1 of the small models is checked.
      card=h100; case $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1) in *H200*) card=h200 ;; esac
      models=${TABLE_MODELS:-qwen3-0.6b llama-3.2-1b qwen3-8b} batches=${TABLE_BATCHES:-1 8}
      specs=; for m in $models; do for b in $batches; do specs="$specs gen:$m:$b"; done; done
      # shellcheck disable=SC2086
      python3 "$ROOT/bench/prebuild.py" --jobs 12 bench: $specs >"$OUT/prebuild.log" 2>&1
      python3 "$ROOT/bench/bench.py" --runs 60 --out "$OUT" --baseline "$ROOT/bench/baselines/$card.json" 2>&1 \
        | tee "$OUT/bench.log" | tail -24
      for m in $models; do
        for b in $batches; do
          check=; [ "$b" = 1 ] && [ "$m" != qwen3-8b ] && check="--check --accuracy"
          # shellcheck disable=SC2086
          timeout "${GENERATE_TIMEOUT:-300}" python3 -m mk.tools.mk_generate --model "$m" --batch "$b" \
            --steps 8 --context 1024 --prompt-len 1000 --target cuda $check --bench --runs 50 \
            --bench-json "$OUT/models.jsonl" >"$OUT/table_${m}_b$b.log" 2>&1
          echo "mk-generate $m batch $b: rc=$? $(grep -E '^bench: mk |^check:' "$OUT/table_${m}_b$b.log" | tr '\n' ' ')"
        done
      done
      python3 "$ROOT/bench/baseline.py" "$OUT/models.jsonl" "$ROOT/bench/baselines/models-$card.json" \
        | tee "$OUT/models_vs_baseline.log" ;;
    generate)
      for model in ${MODELS:-qwen3-0.6b llama-3.2-1b}; do
        for batch in ${BATCHES:-1}; do
          timeout "${GENERATE_TIMEOUT:-300}" python3 -m mk.tools.mk_generate --model "$model" \
            --batch "$batch" --steps 8 --context 1024 --prompt-len 1000 --target cuda --check \
            --accuracy --bench --runs 20 ${GENERATE_ARGS:-} >"$OUT/generate_${model}_b$batch.log" 2>&1
          echo "mk-generate $model batch $batch: rc=$?"; tail -12 "$OUT/generate_${model}_b$batch.log"
        done
      done ;;
  esac
done
# The device tool brings back only a few files of $OUT: the logs travel as one archive.
logs=$(cd "$OUT" && ls -- *.log 2>/dev/null)
if [ "$(echo "$logs" | grep -c .)" -gt 4 ]; then
  # A later run of this script in the same call archives beside the earlier one, not over it.
  archive=logs.tgz n=1
  while [ -e "$OUT/$archive" ]; do n=$((n + 1)) archive=logs-$n.tgz; done
  # shellcheck disable=SC2086
  (cd "$OUT" && tar czf "$archive" $logs && rm -f $logs)
fi
