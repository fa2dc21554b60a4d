#!/usr/bin/env bash
# A single-node SLURM cluster in DIR for the tests: munged, slurmctld and slurmd, all as root,
# all state, logs, sockets and ports in DIR (nothing under /etc or /run is used or changed).
#
#   tests/slurm/start_slurm.sh DIR     # prints SLURM_CONF=DIR/slurm.conf when the node is idle
#   SLURM_CONF=DIR/slurm.conf sbatch ...
#   tests/slurm/stop_slurm.sh DIR
#
# The node is "localhost" (127.0.0.1) with 4 task slots on however many cores this machine has
# (config_overrides), so a 3-task job fits on 2 cores, and 4 fake GPUs: gres files that are
# links to character devices (/dev/null, ...), enough for SLURM to hand each task its own
# CUDA_VISIBLE_DEVICES; nothing can compute on them. Needs Debian's slurm-wlm and munge.
set -euo pipefail
dir=${1:?usage: start_slurm.sh DIR}
mkdir -p "$dir"
dir=$(cd "$dir" && pwd)
for b in munged mungekey slurmctld slurmd sinfo; do
  command -v "$b" >/dev/null || { echo "start_slurm: $b is not installed (apt-get install slurm-wlm munge)" >&2; exit 3; }
done
[ "$(id -u)" = 0 ] || { echo "start_slurm: needs root (the daemons run as root)" >&2; exit 3; }

mkdir -p "$dir/munge" "$dir/state" "$dir/spool"
chmod 700 "$dir"
chmod 711 "$dir/munge"
mungekey --create --force --keyfile="$dir/munge/munge.key" 2>/dev/null \
  || dd if=/dev/urandom of="$dir/munge/munge.key" bs=1024 count=1 status=none
chmod 600 "$dir/munge/munge.key"
munged --force --socket="$dir/munge/munge.socket" --key-file="$dir/munge/munge.key" \
  --pid-file="$dir/munge/munged.pid" --log-file="$dir/munge/munged.log" \
  --seed-file="$dir/munge/munged.seed"

for i in 0 1 2 3; do  # fake GPUs: slurmd wants character devices
  ln -sfn "$(echo /dev/null /dev/zero /dev/full /dev/urandom | cut -d' ' -f$((i + 1)))" "$dir/gpu$i"
done
echo "NodeName=localhost Name=gpu File=$dir/gpu[0-3]" > "$dir/gres.conf"

# two free loopback ports for slurmctld and slurmd
read -r ctld_port slurmd_port < <(python3 - <<'EOF'
import socket
socks = [socket.socket() for _ in range(2)]
for s in socks:
    s.bind(("127.0.0.1", 0))
print(*(s.getsockname()[1] for s in socks))
EOF
)

cat > "$dir/slurm.conf" <<EOF
ClusterName=fednettest
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort=$ctld_port
SlurmdPort=$slurmd_port
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$dir/munge/munge.socket
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool/%n
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/slurmctld.log
SlurmdLogFile=$dir/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SlurmdParameters=config_overrides
GresTypes=gpu
SchedulerType=sched/backfill
MpiDefault=none
ReturnToService=2
KillWait=5
InactiveLimit=0
NodeName=localhost NodeAddr=127.0.0.1 CPUs=4 RealMemory=1000 Gres=gpu:4 State=UNKNOWN
PartitionName=debug Nodes=localhost Default=YES MaxTime=60 State=UP OverSubscribe=FORCE:4
EOF
export SLURM_CONF=$dir/slurm.conf

slurmctld -i -f "$SLURM_CONF"
slurmd -N localhost -f "$SLURM_CONF"

for _ in $(seq 1 150); do  # up to 30 s
  state=$(sinfo -h -n localhost -o %t 2>/dev/null || true)
  case $state in idle*) echo "SLURM_CONF=$SLURM_CONF"; exit 0 ;; esac
  sleep 0.2
done
echo "start_slurm: the node is not idle after 30 s (sinfo: '${state:-}'); logs in $dir:" >&2
tail -n 5 "$dir/slurmctld.log" "$dir/slurmd.log" >&2 || true
exit 1
