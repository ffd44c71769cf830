#!/usr/bin/env bash
# Spark GPU discovery script: prints {"name": "gpu", "addresses": ["0", "1", ...]} from nvidia-smi.
# SPARKML_DIST_FAKE_GPUS="0,1" prints those addresses instead (tests of the assignment logic on CPU).
set -euo pipefail
if [ -n "${SPARKML_DIST_FAKE_GPUS:-}" ]; then
  addrs=$SPARKML_DIST_FAKE_GPUS
else
  addrs=$(nvidia-smi --query-gpu=index --format=csv,noheader | tr -d ' ' | paste -sd, -)
fi
echo "{\"name\": \"gpu\", \"addresses\": [\"${addrs//,/\",\"}\"]}"
