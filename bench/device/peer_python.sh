#!/bin/sh
# d3rlpy 2.8.1's interpreter on the device machine: its python3 with d3rlpy and gymnasium 1.0.0
# from the peer's own directory only (bench/device/remote.sh installs them there).
PYTHONPATH=${PEER_SITE:-/tmp/peer} exec "${PEER_BASE_PYTHON:-python3}" "$@"
