#!/usr/bin/env bash
# Here, before a lent GPU machine's call: fill .device-carry/ (ignored through .git/info/exclude)
# with what that machine lacks. Its python3 holds torch with CUDA but not rlpipe's other
# dependencies, and it reaches no package index:
#   site/      wheels of gymnasium, minari and MuJoCo at constraints.txt's versions (Python 3.12)
#   peer/      d3rlpy 2.8.1's wheels with its gymnasium 1.0.0, for bench/offline.py's peer side
#   datasets/  an Arrow-only copy of the D4RL CPU profile's hopper-medium, if it was built here
#              (both formats together are over the call's 64 MiB)
# Then call the device's `run` with carry [".device-carry"] and the command
#   bash bench/device/remote.sh $OUT [PARTS]
set -euo pipefail
cd "$(dirname "$0")/../.."
CARRY=.device-carry
grep -qx "/$CARRY/" .git/info/exclude 2>/dev/null || echo "/$CARRY/" >> .git/info/exclude
rm -rf "$CARRY" && mkdir -p "$CARRY/site" "$CARRY/peer" "$CARRY/datasets"
pin() { grep -m1 "^$1==" constraints.txt; }
WHEELS=(--no-deps --only-binary=:all: --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64
  --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64)
python3 -m pip download -q "${WHEELS[@]}" -d "$CARRY/site" \
  "$(pin gymnasium)" farama-notifications==0.0.4 "$(pin minari)" "$(pin mujoco)" "$(pin glfw)" pyopengl==3.1.10
python3 -m pip download -q "${WHEELS[@]}" -d "$CARRY/peer" \
  d3rlpy==2.8.1 gymnasium==1.0.0 farama-notifications==0.0.4 structlog==26.1.0 dataclasses-json==0.6.7 \
  'marshmallow>=3.18,<4' gym_notices==0.1.0
python3 -m pip wheel -q --no-deps -w "$CARRY/peer" gym==0.26.2  # d3rlpy imports gym; 0.26.2 is a source release
PROFILE=suites/d4rl-cpu
if [ -d "$PROFILE/datasets/hopper-medium" ]; then
  .venv/bin/rlpipe datasets filter hopper-medium --name hopper-medium-arrow --max-length 1000000 --format arrow \
    --store "$PROFILE/datasets" --force > /dev/null
  mv "$PROFILE/datasets/hopper-medium-arrow" "$CARRY/datasets/"
fi
du -sh "$CARRY"
echo "working tree that travels, carried folder included: $(( ($(git ls-files -z | du -cb --files0-from=- | tail -1 | cut -f1) + $(du -sb "$CARRY" | cut -f1)) / 1048576 )) MiB of 64"
