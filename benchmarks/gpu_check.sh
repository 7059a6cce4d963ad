#!/usr/bin/env bash
# The GPU check of issue 45: `pytest -m gpu` (tests/gpu/: every rollout mode and value estimator, fp32
# and bf16, LoRA on and off, the critic, an exact resume, eval and probe, on cuda), then the GPU
# benchmarks; at most ~8 minutes on one H100/H200. CI has no GPU: there the group is collected and
# skipped, and its CPU twins run.
#
# Two steps, because the lent GPU machine has torch, transformers, peft and pytest but not math-verify
# (the math reward's core dependency) and reaches no package index:
#
#   bash benchmarks/gpu_check.sh --prepare      # here: copy math-verify's pure-Python packages, with
#                                               # their .dist-info (latex2sympy2 reads the ANTLR version
#                                               # from it), from this venv into .gpu_site/ (gitignored)
#   bash benchmarks/gpu_check.sh                # there, with .gpu_site carried beside the checkout
#
# Output: the test log and each benchmark's JSON (last line) under $OUT (or ./gpu_check_out), and a
# summary at the end. Exit status: non-zero when CUDA is missing or a test failed; a benchmark that
# fails or runs out of its time is reported and skipped.
set -uo pipefail
cd "$(dirname "$0")/.."
SITE=${GPU_SITE:-.gpu_site}
CARRIED=(math_verify latex2sympy2_extended antlr4)

if [ "${1:-}" = "--prepare" ]; then
  PY=${PYTHON:-python3}
  rm -rf "$SITE" && mkdir -p "$SITE"
  for mod in "${CARRIED[@]}"; do
    "$PY" - "$mod" "$SITE" <<'EOF' || exit 1
import importlib.metadata as md, importlib.util, pathlib, shutil, sys
mod, site = sys.argv[1], pathlib.Path(sys.argv[2])
spec = importlib.util.find_spec(mod)
if spec is None or not spec.submodule_search_locations:
    sys.exit(f"gpu_check --prepare: {mod} is not installed in {sys.executable}")
src = pathlib.Path(list(spec.submodule_search_locations)[0])
shutil.copytree(src, site / mod, ignore=shutil.ignore_patterns("__pycache__"))
for d in md.distributions():  # the distribution that installed mod: its .dist-info travels too
    top = (d.read_text("top_level.txt") or "").split()
    files = [str(f) for f in (d.files or [])]
    if mod in top or any(f.startswith(mod + "/") for f in files):
        info = pathlib.Path(str(getattr(d, "_path")))  # the .dist-info folder of a path distribution
        shutil.copytree(info, site / info.name)
        print(f"{mod}: {src} and {info.name}")
        break
else:
    sys.exit(f"gpu_check --prepare: no .dist-info found for {mod}")
EOF
  done
  du -sh "$SITE"
  exit 0
fi

OUT=${OUT:-gpu_check_out}
mkdir -p "$OUT"
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
[ -d "$SITE" ] && export PYTHONPATH="$PYTHONPATH:$PWD/$SITE"
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1 RAY_AUTH_MODE=disabled
PY=${PYTHON:-python3}
start=$(date +%s)
summary=()

"$PY" - <<'EOF' || { echo "gpu_check: no usable CUDA device or a missing package (see above)"; exit 2; }
import torch, transformers
assert torch.cuda.is_available(), "torch sees no CUDA device"
import math_verify, latex2sympy2_extended, antlr4  # noqa: F401  (carried: bash benchmarks/gpu_check.sh --prepare)
print(f"{torch.cuda.get_device_name(0)}; torch {torch.__version__}; transformers {transformers.__version__}")
EOF
git log -1 --format='commit %H (%cd)' 2>/dev/null || true

# 1. the GPU group (at most 4 min): every test marked gpu
timeout 240 "$PY" -m pytest -m gpu -p no:cacheprovider -q -rs tests/gpu 2>&1 | tee "$OUT/pytest_gpu.log"
tests_rc=${PIPESTATUS[0]}
summary+=("pytest -m gpu: exit $tests_rc ($(tail -n 1 "$OUT/pytest_gpu.log"))")

# 2. the GPU benchmarks, each bounded so the whole stays under 8 minutes
bench() {  # name, seconds, command...
  local name=$1 limit=$2
  shift 2
  local left=$((480 - ($(date +%s) - start)))
  if [ "$left" -lt 30 ]; then summary+=("$name: not run (8-minute budget spent)"); return; fi
  [ "$limit" -gt "$left" ] && limit=$left
  echo "== $name (at most ${limit} s): $*"
  timeout "$limit" "$@" > "$OUT/$name.txt" 2>&1
  local rc=$?
  tail -n 30 "$OUT/$name.txt" | grep -v '^{' || true
  summary+=("$name: exit $rc; $(tail -n 1 "$OUT/$name.txt" | cut -c1-400)")
}
BIG=(model.tiny.hidden_size=896 model.tiny.num_layers=24 model.tiny.num_heads=14 model.tiny.intermediate_size=4864)
BIG_RUN=(--json trainer.device=cuda model.dtype=bfloat16 "${BIG[@]}" sft.steps=0 trainer.steps=6
  trainer.val_every=0 trainer.save_every=0 rollout.max_new_tokens=64)
# generation: ours (eager, compiled) against transformers' generate() at batch 128 x 256 tokens
bench generate 180 "$PY" benchmarks/gpu_generate.py --json
# a training step of the 0.39B model with and without LoRA (adapters merged for generation)
bench big_bf16 90 "$PY" benchmarks/gpu_run.py "${BIG_RUN[@]}"
bench big_bf16_lora 90 "$PY" benchmarks/gpu_run.py "${BIG_RUN[@]}" model.lora.rank=8
bench big_bf16_compiled 90 "$PY" benchmarks/gpu_run.py "${BIG_RUN[@]}" rollout.decode_compile=reduce-overhead
bench default_fp32 60 "$PY" benchmarks/gpu_run.py --json trainer.device=cuda trainer.steps=20 trainer.val_every=20 \
  trainer.save_every=0

echo "== summary ($(($(date +%s) - start)) s)"
printf '%s\n' "${summary[@]}"
exit "$tests_rc"
