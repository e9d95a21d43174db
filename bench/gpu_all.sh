#!/usr/bin/env bash
# Every GPU measurement and check in one go, all output appended to one file.
#
#   bench/gpu_all.sh [--device cuda|cpu] [--tiny] [--only LIST] [--out FILE]
#
#   check    bench/cuda_check.py: every algorithm on the device, graphs equal eager (SAC's learning: the online part)
#   offline  bench/offline.py: CQL and BC updates/s, rlpipe against d3rlpy eager and with its
#            compile_graph=True (needs d3rlpy 2.8.1: $PEER_PYTHON or .bench-venvs/d3rlpy; skipped without)
#   seeds    bench/batched_seeds.py: CQL and SAC seed-updates/s, one seed against K = 16 batched
#   online   bench/online_device.py: SAC and TD3 on Pendulum, the device against one CPU core
#
# --only picks parts (comma-separated, default: all four, in that order). --tiny runs every
# part at tiny sizes (a dry run: `bench/gpu_all.sh --device cpu --tiny` checks the script
# runs on a machine without a GPU). $PYTHON is the interpreter (default .venv/bin/python, else
# python3; it needs torch with CUDA and rlpipe's dependencies, rlpipe itself comes from this tree). On a GPU the full run takes about 10-15 minutes: split it with --only if a
# command may run at most 10 minutes (e.g. --only check,seeds then --only offline,online).
set -u
cd "$(dirname "$0")/.."

DEVICE=cuda
TINY=0
ONLY=check,offline,seeds,online
OUT=gpu_all.txt
while [ $# -gt 0 ]; do
  case "$1" in
    --device) DEVICE=$2; shift 2 ;;
    --tiny) TINY=1; shift ;;
    --only) ONLY=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    *) echo "usage: bench/gpu_all.sh [--device cuda|cpu] [--tiny] [--only check,offline,seeds,online] [--out FILE]" >&2; exit 2 ;;
  esac
done
PY=${PYTHON:-.venv/bin/python}
[ -x "$PY" ] || PY=python3
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"  # rlpipe from this tree, even where it is not installed
PEER=${PEER_PYTHON:-.bench-venvs/d3rlpy/bin/python}
FAILED=0

part() {  # part NAME COMMAND...: run one measurement, its output and exit status into $OUT
  local name=$1; shift
  case ",$ONLY," in *",$name,"*) ;; *) return 0 ;; esac
  echo "### $name: $* ($(date -u +%H:%M:%S))" | tee -a "$OUT"
  local start=$SECONDS
  "$@" >> "$OUT" 2>&1
  local rc=$?
  echo "### $name: exit $rc after $((SECONDS - start)) s" | tee -a "$OUT"
  [ $rc -eq 0 ] || FAILED=1
}

{
  echo "# bench/gpu_all.sh --device $DEVICE $([ $TINY = 1 ] && echo --tiny) --only $ONLY; $(date -u)"
  "$PY" -c "import torch; print('torch', torch.__version__, 'cuda', torch.cuda.is_available(), torch.cuda.get_device_name(0) if torch.cuda.is_available() else '')"
  command -v nvidia-smi > /dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
} >> "$OUT" 2>&1

if [ $TINY = 1 ]; then
  part check "$PY" bench/cuda_check.py --device "$DEVICE" --learn
  if [ -x "$PEER" ]; then
    part offline "$PY" bench/offline.py --device "$DEVICE" --quick --peer-python "$PEER" --peer-configs eager,compiled
  else
    echo "### offline: skipped, no d3rlpy interpreter at $PEER (set PEER_PYTHON)" | tee -a "$OUT"
  fi
  part seeds "$PY" bench/batched_seeds.py --device "$DEVICE" --quick
  part online "$PY" bench/online_device.py --devices "cpu,$DEVICE" --steps 300
else
  part check "$PY" bench/cuda_check.py --device "$DEVICE" --learn  # SAC learning on the device: the online part's run
  if [ -x "$PEER" ]; then
    part offline "$PY" bench/offline.py --device "$DEVICE" --peer-python "$PEER" --cql-updates 300 --bc-updates 2000
  else
    echo "### offline: skipped, no d3rlpy interpreter at $PEER (set PEER_PYTHON)" | tee -a "$OUT"
  fi
  part seeds "$PY" bench/batched_seeds.py --device "$DEVICE" --seeds 1,16 --updates 200 --repeats 3
  part online "$PY" bench/online_device.py --devices "cpu,$DEVICE" --steps 10000
fi
echo "-> $OUT"
exit $FAILED
