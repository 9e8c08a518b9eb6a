#!/usr/bin/env bash
# Every curriculum stage through `ray job submit` on a local cluster with the dashboard up.
#   bash scripts/ray_stages.sh [MODEL] [extra key=value overrides for every stage]
# MODEL defaults to tiny (plumbing in minutes); smollm2-135m runs the real micro-scale curriculum.
# Starts a head on 127.0.0.1 (dashboard on :8265), submits stage1..stage4 one after another with
# --working-dir . (each from the previous stage's checkpoint), fails if any job does not SUCCEED,
# prints where the results are, and stops the cluster it started. It owns RUN_DIR: a new run replaces
# the stage results of the last one there (overwrite=true).
# Runs in the project's environment (.venv, made by scripts/setup.sh): ray, and the jobs' python.
set -euo pipefail
source "$(dirname "$0")/common.sh"
cd "$SQLRL_ROOT"
sqlrl_activate
MODEL=${1:-tiny}; shift || true
RUN_DIR=${SQLRL_RUN_DIR:-$PWD/runs/ray-stages}
export RAY_ADDRESS=http://127.0.0.1:8265
# Ray >= 2.59 turns token authentication on for local clusters: keep it on, and give the CLI the token
# (~/.ray/auth_token, made once) by running every ray command in token mode.
export RAY_AUTH_MODE=${RAY_AUTH_MODE:-token}
[ "$RAY_AUTH_MODE" = token ] && ray get-auth-token --generate >/dev/null
started=0
if ! ray status --address 127.0.0.1:6379 >/dev/null 2>&1; then
  ray start --head --node-ip-address=127.0.0.1 --port=6379 --num-cpus=8 --include-dashboard=true \
    --dashboard-host=127.0.0.1 --dashboard-port=8265 --disable-usage-stats >/dev/null
  started=1
fi
trap '[ "$started" = 1 ] && ray stop --force >/dev/null 2>&1 || true' EXIT
TINY=()
if [ "$MODEL" = tiny ]; then  # micro sizes: the plumbing, not the learning
  # rl.sampling_rounds=1: the random tiny model's rewards are all 0, so further draws would only
  # repeat the rollouts; one draw keeps the update (zero advantages) and weight-sync path running.
  TINY=(data.n_per_domain=20 data.train_size=8 data.eval_size=4 sft.epochs=1 rl.steps=1
        rl.tasks_per_step=2 rl.group_size=2 rl.sampling_rounds=1 rollout.max_new_tokens=32)
fi
i=0
for job in stage1_reasoning_sft stage2_tooluse_sft stage3_reasoning_rl stage4_agentic_rl; do
  stage=${job%%_*}
  init=previous; [ $i = 0 ] && init=$MODEL
  echo "== ray job submit: $job (model.init=$init)"
  log=$(mktemp)
  lost=0
  for attempt in $(seq 1 60); do
    if ray job submit --working-dir . -- python -m jobs.$job --config jobs/configs/$stage.yaml \
         cluster.ray=true run_dir="$RUN_DIR" data.synth_dir="$RUN_DIR/data/synth" model.init="$init" overwrite=true \
         "${TINY[@]}" "$@" 2>&1 | tee "$log"; then break; fi
    # A head that has just started may not have its job agent up yet: Ray asks to try again later.
    if grep -q "No available agent to submit job" "$log" && [ "$attempt" -lt 60 ]; then sleep 2; continue; fi
    # Ray can garbage-collect the working-dir package the previous job uploaded while the next job
    # (same content, same package) starts (ray-project/ray#36703, #46625). Submitting again uploads
    # it anew; any other failure stops here.
    if [ $lost = 0 ] && grep -q "Failed to download runtime_env file package" "$log"; then
      echo "== $job: Ray lost the working-dir package (ray#36703); submitting again"; lost=1; continue
    fi
    rm -f "$log"; exit 1
  done
  rm -f "$log"
  i=$((i + 1))
done
echo "== all four stages SUCCEEDED; summaries: $RUN_DIR/stage*/summary.json, metrics: $RUN_DIR/metrics.jsonl"
