#!/usr/bin/env bash
# Stop what tests/slurm/start_slurm.sh DIR started: cancel the jobs, then slurmd, slurmctld and
# munged (by the pids in DIR), waiting up to 10 s for each. DIR itself is left to the caller.
set -uo pipefail
dir=${1:?usage: stop_slurm.sh DIR}
export SLURM_CONF=$dir/slurm.conf
if [ -f "$SLURM_CONF" ]; then
  scancel --full --user=root 2>/dev/null
  for _ in $(seq 1 50); do  # up to 10 s for the jobs' tasks to go
    [ -z "$(squeue -h 2>/dev/null)" ] && break
    sleep 0.2
  done
fi
for pidfile in "$dir/slurmd.pid" "$dir/slurmctld.pid" "$dir/munge/munged.pid"; do
  [ -f "$pidfile" ] || continue
  pid=$(cat "$pidfile")
  kill "$pid" 2>/dev/null || continue
  for _ in $(seq 1 50); do
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.2
  done
  kill -9 "$pid" 2>/dev/null || true
done
exit 0
