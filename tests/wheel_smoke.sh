#!/usr/bin/env bash
# rlpipe as a project that pip-installed it runs it (make wheel-smoke builds VENV: the wheel
# installed beside a torch that rlpipe did not choose). From a temporary directory outside the
# repository, so nothing is imported from the checkout: collect a small expert Pendulum dataset,
# train BC on it for a few updates, evaluate the run.
#
#   tests/wheel_smoke.sh VENV [TORCH_VERSION]   # TORCH_VERSION: the torch VENV must still hold
set -euo pipefail
venv=$(cd "${1:?usage: tests/wheel_smoke.sh VENV [TORCH_VERSION]}" && pwd)
want_torch=${2:-}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"
export PATH="$venv/bin:$PATH"

python - "$venv" "$want_torch" <<'EOF'
import sys

import torch

import rlpipe

venv, want = sys.argv[1:]
print(f"rlpipe {rlpipe.__version__} from {rlpipe.__file__}; torch {torch.__version__}")
assert rlpipe.__file__.startswith(venv + "/"), "rlpipe was not imported from the virtualenv"
assert not want or torch.__version__.split("+")[0] == want, f"torch {torch.__version__} replaced torch {want}"
EOF

# train --device cpu: the other torch may be a CUDA build; this checks the install, not a GPU.
rlpipe collect --env Pendulum-v1 --expert sac --expert-steps 300 --episodes 2 --num-envs 1 --store datasets --quiet
rlpipe train bc --dataset pendulum-expert --store datasets --updates 50 --set eval_episodes=2 --set heldout_eval_episodes=2 \
    --device cpu --out runs/bc --no-progress
rlpipe eval runs/bc --episodes 2 --json

# The run records the torch it trained with.
python - "$want_torch" <<'EOF'
import json
import sys

recorded = json.load(open("runs/bc/checkpoint.json"))["torch_version"]
print(f"runs/bc trained with torch {recorded}")
assert not sys.argv[1] or recorded.split("+")[0] == sys.argv[1], recorded
EOF
echo "wheel smoke test passed"
