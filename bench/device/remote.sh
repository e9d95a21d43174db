#!/usr/bin/env bash
# On a lent GPU machine, from the repository root, after bench/device/prepare.sh here:
#   bash bench/device/remote.sh OUTDIR [PARTS]
# PARTS (comma-separated, in order; default check,seeds,online,offline,d4rl): bench/gpu_all.sh's
# parts, then `d4rl`, the D4RL CPU profile's sweeps on CUDA on .device-carry's hopper-medium,
# one sweep at a time so each has the GPU to itself. Each part stops at its limit (seconds:
# LIMIT_CHECK=200, LIMIT_SEEDS=60, LIMIT_ONLINE=240, LIMIT_OFFLINE=240, LIMIT_D4RL=120 per sweep);
# D4RL_ENTRIES names the sweeps (default: bc td3bc iql cql edac rebrac-medium awac calql).
# Writes OUTDIR/gpu_all.txt, OUTDIR/run.log and OUTDIR/d4rl.tgz (each sweep's log and every
# finished run's metrics.json): three files, within the 8 that come back. TINY=1: a dry run on this machine's CPU at tiny sizes.
set -u
OUTDIR=$1
PARTS=${2:-check,seeds,online,offline,d4rl}
ROOT=$PWD CARRY=$PWD/.device-carry
PY=${PYTHON:-python3}
T0=$SECONDS
log() { echo "[$((SECONDS - T0)) s] $*" | tee -a "$OUTDIR/run.log"; }
mkdir -p "$OUTDIR"
if [ -z "${TINY:-}" ]; then  # a dry run takes this machine's own packages
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "$CARRY"/site/*.whl || exit 1
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/peer "$CARRY"/peer/*.whl || exit 1
fi
# rlpipe from the tree; DVCLive as a no-op (no DVC there: runs keep metrics.json, not curves)
export PYTHONPATH=$ROOT/bench/device/stub:/tmp/site:$ROOT${PYTHONPATH:+:$PYTHONPATH}
export PEER_PYTHON=$ROOT/bench/device/peer_python.sh PYTHONUNBUFFERED=1
log "rlpipe side: $($PY -c 'import torch, gymnasium, mujoco; print("torch", torch.__version__, "cuda", torch.cuda.is_available(), "gymnasium", gymnasium.__version__, "mujoco", mujoco.__version__)' 2>&1 | tail -1)"
log "peer side: $($PEER_PYTHON -c 'import d3rlpy, gymnasium; print("d3rlpy", d3rlpy.__version__, "gymnasium", gymnasium.__version__)' 2>&1 | tail -1)"

DEVICE=cuda GPU_ALL=(--device cuda) SETS=()
if [ -n "${TINY:-}" ]; then
  DEVICE=cpu GPU_ALL=(--device cpu --tiny) SETS=(--set updates=40 --set eval_every=20 --set heldout_eval_episodes=3)
fi
d4rl() {  # the profile's sweeps on $DEVICE, one after another
  local store=$CARRY/datasets profile=suites/d4rl-cpu/params.yaml key algo seeds rc start
  [ -d "$store/hopper-medium-arrow" ] || { log "d4rl: no $store/hopper-medium-arrow (bench/device/prepare.sh makes it)"; return 1; }
  mkdir -p "$OUTDIR/d4rl"
  for key in ${D4RL_ENTRIES:-bc td3bc iql cql edac rebrac-medium awac calql}; do
    read -r algo seeds < <($PY -c "import yaml; e = yaml.safe_load(open('$profile'))['train_offline']['$key']; print(e['algo'], e['seeds'])")
    start=$SECONDS
    timeout "${LIMIT_D4RL:-120}" $PY -m rlpipe.cli.main sweep "$algo" --dataset hopper-medium-arrow --seeds "$seeds" --store "$store" \
      --device "$DEVICE" --root "$OUTDIR/d4rl" --name "$key" --workers 3 --set-from "$profile:train_offline.$key.set" "${SETS[@]}" \
      > "$OUTDIR/d4rl/$key.log" 2>&1
    rc=$?
    log "d4rl $key ($algo, seeds $seeds): exit $rc after $((SECONDS - start)) s; $(tail -2 "$OUTDIR/d4rl/$key.log" | head -1)"
  done
  (cd "$OUTDIR" && find d4rl -name metrics.json -o -name summary.json -o -name '*.log' | tar czf d4rl.tgz -T - && rm -rf d4rl)
}
declare -A DEFAULT_LIMIT=([check]=200 [seeds]=60 [online]=240 [offline]=240)
for part in ${PARTS//,/ }; do
  case $part in
    d4rl) d4rl ;;
    check | seeds | online | offline)
      limit_var=LIMIT_${part^^}
      limit=${!limit_var:-${DEFAULT_LIMIT[$part]}}
      timeout "$limit" bench/gpu_all.sh "${GPU_ALL[@]}" --only "$part" --out "$OUTDIR/gpu_all.txt"
      log "$part: exit $? (limit $limit s)" ;;
    *) log "unknown part $part"; exit 2 ;;
  esac
done
