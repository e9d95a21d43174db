#!/usr/bin/env bash
# Derived datasets on a random CartPole dataset of STEPS steps (default 10M): wall time and
# peak RSS of each operation (GNU time). Usage: [STEPS=N] bash bench/dataset_ops.sh [WORK_DIR]
set -eu
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
export PATH="$ROOT/.venv/bin:$PATH"
mkdir -p "${1:-/tmp/rlpipe-dataset-ops}" && cd "${1:-/tmp/rlpipe-dataset-ops}"
rm -rf ds
STEPS="${STEPS:-10000000}"
/usr/bin/time -f "collect: %e s wall, %M KB peak" rlpipe collect --env CartPole-v1 --steps "$STEPS" --store ds --name big --quiet
du -sh ds/big
/usr/bin/time -f "filter top10: %e s wall, %M KB peak" rlpipe datasets filter big --top-return 10% --name top --store ds
/usr/bin/time -f "split 0.5: %e s wall, %M KB peak" rlpipe datasets split big --val 0.5 --store ds
/usr/bin/time -f "merge halves: %e s wall, %M KB peak" rlpipe datasets merge big-train big-val --name again --store ds
/usr/bin/time -f "sample half the steps: %e s wall, %M KB peak" rlpipe datasets sample big --steps $((STEPS / 2)) --name half --store ds
rlpipe datasets lineage again --store ds
