#!/usr/bin/env bash
# A part of an experiment file on the lent GPU machine (docs/experiments.md, "run in parts"): the runs of
# some seeds with trainer.device=cuda, several sharing the card, each finished run packed as it finishes,
# so a command cut off at its limit still returns every run it finished. Prepare here, in the repo root:
#
#   bash benchmarks/gpu_check.sh --prepare                 # math-verify into .gpu_site/ (gitignored)
#   echo /.gpu_part/ >> .git/info/exclude; mkdir -p .gpu_part/out
#   cp -r OUT/sft OUT/heldout.jsonl .gpu_part/out/          # the same SFT model and held-out prompts
#
# then run there with .gpu_site and .gpu_part carried:
#
#   bash benchmarks/gpu_experiment_part.sh experiments/FILE.yaml SEEDS [ARMS] [SECONDS] [JOBS]
#
# SEEDS and ARMS are comma-separated (ARMS empty: every arm); SECONDS (default 480) bounds the runner,
# JOBS (default 16) runs share the card. Back here: `tar xzf runs_sN.tgz -C OUT` for each seed's file
# (runs without checkpoints; final_greedy.json marks each done, so the whole file resumes past them).
# One packed file per seed and two logs: at most 6 seeds a call (8 files come back).
set -u
FILE=$1 SEEDS=$2 ARMS=${3:-} LIMIT=${4:-480} JOBS=${5:-16}
OUT=${OUT:-gpu_part_out}
PART=${GPU_PART:-.gpu_part/out}  # the part's --out (GPU_PART, GPU_PART_DEVICE=cpu: the CPU test of this script)
DEVICE=${GPU_PART_DEVICE:-cuda}
mkdir -p "$OUT"
export PYTHONPATH="$PWD/src:$PWD/.gpu_site" PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1 \
  RAY_AUTH_MODE=disabled
[ -f "$PART/sft/model/config.json" ] || { echo "gpu_experiment_part: no $PART/sft/model (copy OUT/sft here)"; exit 2; }
PY=${PYTHON:-python3}
[ "$DEVICE" = cpu ] || "$PY" -c "import torch, math_verify; assert torch.cuda.is_available(); print(torch.cuda.get_device_name(0))" ||
  { echo "gpu_experiment_part: no CUDA device or no math-verify (.gpu_site)"; exit 2; }
T0=$(date +%s)
timeout "$LIMIT" "$PY" -c "import sys; from stepcredit.cli.main import main; sys.exit(main(sys.argv[1:]))" \
  experiment "$FILE" --seeds "$SEEDS" ${ARMS:+--arms "$ARMS"} --jobs "$JOBS" --threads 1 --out "$PART" \
  trainer.device="$DEVICE" > "$OUT/experiment.log" 2>&1 &
RUNNER=$!
pack() {  # every finished run of each seed, without checkpoints, into $OUT/runs_s<seed>.tgz
  local s dirs d
  for s in ${SEEDS//,/ }; do
    dirs=()
    for d in "$PART"/*/s"$s"; do
      [ -f "$d/final_greedy.json" ] && "$PY" -c "import json, sys; json.load(open(sys.argv[1]))" "$d/final_greedy.json" \
        2>/dev/null && dirs+=("${d#"$PART"/}")
    done
    [ ${#dirs[@]} -gt 0 ] && tar czf "$OUT/runs_s$s.tgz.tmp" -C "$PART" --exclude=checkpoints --exclude=tb "${dirs[@]}" &&
      mv "$OUT/runs_s$s.tgz.tmp" "$OUT/runs_s$s.tgz"
  done
  tar czf "$OUT/logs.tgz.tmp" -C "$PART" logs 2>/dev/null && mv "$OUT/logs.tgz.tmp" "$OUT/logs.tgz"
}
while kill -0 "$RUNNER" 2>/dev/null; do
  sleep "${GPU_PART_POLL:-20}"
  pack
  echo "[$(($(date +%s) - T0)) s] $(ls "$PART"/*/s*/final_greedy.json 2>/dev/null | wc -l) runs done here;" \
    "$(nvidia-smi --query-gpu=utilization.gpu,memory.used --format=csv,noheader 2>/dev/null)"
done
wait "$RUNNER"
echo "runner exit $? after $(($(date +%s) - T0)) s (124: cut at ${LIMIT} s; unfinished runs rerun later)"
pack
tail -n 3 "$OUT/experiment.log"
