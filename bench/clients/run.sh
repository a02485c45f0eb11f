#!/usr/bin/env bash
# The ecosystem's own clients against the app's OpenAI-compatible /v1: lm-evaluation-harness
# (local-chat-completions, the four-question task beside this script) and promptfoo (its openai
# provider). Neither is a dependency of the app: install them where you like and name them here.
#
#   python app.py --models tiny --no-image --port 7860 &      # or any running app
#   LM_EVAL=/path/to/venv/bin/lm_eval PROMPTFOO="npx promptfoo@0.120.27" bash bench/clients/run.sh
#
# BASE (http://127.0.0.1:7860) is the app; SHOWCASE_API_KEY its --api-key, if it has one.
set -euo pipefail
cd "$(dirname "$0")/../.."
BASE="${BASE:-http://127.0.0.1:7860}"
LM_EVAL="${LM_EVAL:-lm_eval}"
PROMPTFOO="${PROMPTFOO:-promptfoo}"
OUT="${OUT:-$(mktemp -d)}"
export SHOWCASE_V1="$BASE/v1" SHOWCASE_API_KEY="${SHOWCASE_API_KEY:-none}"
# Everything stays on this host: the task file is local, no hub lookups, no telemetry or sharing.
export HF_DATASETS_OFFLINE=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 OPENAI_API_KEY="$SHOWCASE_API_KEY"
export PROMPTFOO_DISABLE_TELEMETRY=1 PROMPTFOO_DISABLE_UPDATE=1 PROMPTFOO_DISABLE_SHARING=1
export PROMPTFOO_CONFIG_DIR="$OUT/promptfoo"

echo "== lm-evaluation-harness: showcase_tiny through $SHOWCASE_V1/chat/completions"
$LM_EVAL --model local-chat-completions \
  --model_args "model=chat,base_url=$SHOWCASE_V1/chat/completions,num_concurrent=1,max_retries=2,tokenized_requests=False" \
  --tasks showcase_tiny --include_path bench/clients --apply_chat_template --output_path "$OUT/lm-eval" --log_samples

echo "== promptfoo: bench/clients/promptfooconfig.yaml through $SHOWCASE_V1"
(cd bench/clients && $PROMPTFOO eval -c promptfooconfig.yaml --no-cache -o "$OUT/promptfoo.json")
echo "results under $OUT"
