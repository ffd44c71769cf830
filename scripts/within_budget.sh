#!/usr/bin/env bash
# within_budget.sh NAME MINUTES COMMAND...: run COMMAND, print how long it took against its budget,
# and stop it with a clear message when it overruns (CI's own limit is 90 minutes for everything;
# a run it kills says nothing about why). SIGINT first, so that pytest still prints its summary
# and tests/timing.py writes the times so far; SIGKILL a minute later if anything is left.
set -uo pipefail
name=$1 minutes=$2
shift 2
start=$(date +%s)
timeout -s INT -k 60 "$((minutes * 60))" "$@"
rc=$?
took=$(( $(date +%s) - start ))
printf '[budget] %s took %dm%02ds of its %d-minute budget\n' "$name" $((took / 60)) $((took % 60)) "$minutes"
if [[ $rc == 124 || $rc == 137 ]]; then
    echo "[budget] $name overran its $minutes-minute budget and was stopped: see output/test_times.json for where the time went (the Makefile sets the budgets)" >&2
    exit 124
fi
exit $rc
