#!/usr/bin/env bash
# GSM8K with stepcredit's process rewards and grpo_process inside verl (GPU only).
# Written against verl 0.9.1 (the plugin supports verl >=0.9,<0.10).
#
#   pip install 'stepcredit[verl,math]' vllm     # verl's GPU stack (vllm, flash-attn) as verl documents
#   bash examples/verl/run_gsm8k.sh [hydra overrides...]
#
# Environment: DATA (default data/gsm8k), MODEL (default Qwen/Qwen2.5-1.5B-Instruct), NGPUS (default 8),
# RAW (a directory holding gsm8k/train.jsonl and gsm8k/test.jsonl in GSM8K's own format, question +
# answer; default $STEPCREDIT_SHARED_DATA or ../shared/data).
set -euo pipefail
cd "$(dirname "$0")/../.."

DATA=${DATA:-data/gsm8k}
MODEL=${MODEL:-Qwen/Qwen2.5-1.5B-Instruct}
NGPUS=${NGPUS:-8}

# verl-style parquet files (data_source openai/gsm8k, reward_model.ground_truth): train + test
if [ ! -f "$DATA/train.parquet" ]; then
  stepcredit data prepare gsm8k --out "$DATA" ${RAW:+--src "$RAW"}
fi

# `import verl` loads the stepcredit plugin in every process; fail early if it did not register.
python - <<'PY'
import verl
from stepcredit.integrations.verl.plugin import REGISTERED
assert REGISTERED.get("trainers") == ["stepcredit_sync"], f"stepcredit plugin incomplete: {REGISTERED}"
print(f"verl {verl.__version__}; stepcredit registered: {REGISTERED}")
PY

python -m verl.trainer.main_ppo \
  --config-path "$PWD/examples/verl" --config-name gsm8k_stepcredit \
  data.train_files="$DATA/train.parquet" \
  data.val_files="$DATA/test.parquet" \
  actor_rollout_ref.model.path="$MODEL" \
  trainer.n_gpus_per_node="$NGPUS" \
  "$@"
