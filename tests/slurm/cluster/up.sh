#!/usr/bin/env bash
# Bring up a throwaway two-node SLURM cluster (nodes n1 and n2, partition debug) on this machine,
# for tests/slurm. Idempotent: a healthy cluster is left alone, a half-up one is restarted.
# Needs root. See README.md beside this file; the facts behind each setting: shared/SLURM-NOTES.md.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
DIR="${MSD_SLURM_DIR:-/tmp/msd-slurm}"
# Every daemon inherits this, so down.sh can tell our daemons from anyone else's.
export MSD_SLURM_DIR="$DIR"

CLUSTER=msd
NODES=(n1 n2)
PACKAGES=(munge slurm-client slurmctld slurmd slurmdbd mariadb-server)
MUNGE_SOCKET="$DIR/munge/munge.socket.2"
# slurmdbd cannot be told a MariaDB socket; libmariadb takes it from this variable.
export MYSQL_UNIX_PORT="$DIR/run/mysqld.sock"
READY_TIMEOUT_S=60
# Node states (sinfo %t) of a node that answers and takes jobs.
READY_STATES='idle|mix|alloc|comp'
T0=$EPOCHREALTIME

say() { echo "up.sh: $*"; }

elapsed_s() { awk -v a="$T0" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1f", b - a }'; }

# die MESSAGE [LOG...]: print the message and the tail of each log, then exit 1.
die() {
    echo "up.sh: FAILED: $1" >&2
    shift
    local log
    for log in "$@"; do
        [[ -s "$log" ]] || continue
        echo "----- last lines of $log -----" >&2
        tail -n 25 "$log" >&2
    done
    exit 1
}

install_packages() {
    local missing=() pkg
    for pkg in "${PACKAGES[@]}"; do
        dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'install ok installed' ||
            missing+=("$pkg")
    done
    ((${#missing[@]} == 0)) && return 0
    say "installing ${missing[*]}"
    {
        apt-get update -q -o DPkg::Lock::Timeout=300 &&
            DEBIAN_FRONTEND=noninteractive apt-get install --no-install-recommends -y -q \
                -o DPkg::Lock::Timeout=300 "${missing[@]}"
    } >"$DIR/log/apt.log" 2>&1 || die "apt-get install ${missing[*]}" "$DIR/log/apt.log"
    INSTALLED=1
}

# Each emulated node's name must resolve to loopback.
add_hosts() {
    local node
    for node in "${NODES[@]}"; do
        awk -v n="$node" '$1 == "127.0.0.1" { for (i = 2; i <= NF; i++) if ($i == n) f = 1 }
            END { exit !f }' /etc/hosts || echo "127.0.0.1 $node" >>/etc/hosts
    done
}

slurm_conf() {
    cat <<EOF
# Written by tests/slurm/cluster/up.sh; master copy in $DIR/etc.
ClusterName=$CLUSTER
SlurmctldHost=$(hostname -s)(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$MUNGE_SOCKET
SlurmctldPort=6817
SlurmdPort=6818
StateSaveLocation=$DIR/ctld
SlurmdSpoolDir=$DIR/spool/%n
SlurmctldPidFile=$DIR/run/slurmctld.pid
SlurmdPidFile=$DIR/run/slurmd-%n.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdLogFile=$DIR/log/slurmd-%n.log
# More CPUs than the machine has, and no cgroups.
SlurmdParameters=config_overrides
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerParameters=batch_sched_delay=0
# An impossible request is rejected at once instead of pending forever.
EnforcePartLimits=ALL
ReturnToService=2
KillWait=2
MailProg=/bin/true
# submitit reads job states from sacct.
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=localhost
AccountingStoragePort=6819
# For slurmdbd connections this names the munge socket (AuthInfo is not used for them).
AccountingStoragePass=$MUNGE_SOCKET
NodeName=n1 NodeHostname=n1 NodeAddr=127.0.0.1 Port=6831 CPUs=16 RealMemory=16000 State=UNKNOWN
NodeName=n2 NodeHostname=n2 NodeAddr=127.0.0.1 Port=6832 CPUs=16 RealMemory=16000 State=UNKNOWN
PartitionName=debug Nodes=n1,n2 Default=YES MaxTime=INFINITE OverSubscribe=FORCE:4 State=UP
EOF
}

slurmdbd_conf() {
    cat <<EOF
# Written by tests/slurm/cluster/up.sh; master copy in $DIR/etc.
AuthType=auth/munge
AuthInfo=socket=$MUNGE_SOCKET
DbdHost=localhost
DbdPort=6819
SlurmUser=root
PidFile=$DIR/run/slurmdbd.pid
LogFile=$DIR/log/slurmdbd.log
StorageType=accounting_storage/mysql
StorageHost=localhost
StorageUser=root
StorageLoc=slurm_acct_db
EOF
}

# install_conf NAME MODE: write $DIR/etc/NAME and /etc/slurm/NAME from `NAME_conf`; note a change.
install_conf() {
    local name=$1 mode=$2 new="$DIR/etc/$1.new"
    "${name%.conf}_conf" >"$new"
    chmod "$mode" "$new"
    if ! cmp -s "$new" "/etc/slurm/$name" || ! cmp -s "$new" "$DIR/etc/$name"; then
        CONFIG_CHANGED=1
        install -m "$mode" "$new" "/etc/slurm/$name"
        mv "$new" "$DIR/etc/$name"
    else
        rm "$new"
    fi
}

prepare_dirs() {
    mkdir -p "$DIR"/{etc,log,run,ctld,munge} "${NODES[@]/#/$DIR/spool/}" /etc/slurm
    chmod 0755 "$DIR" "$DIR/munge"
    chown munge:munge "$DIR/munge"
}

# alive NAME [COMM]: the process recorded in $DIR/run/NAME.pid runs and is called COMM.
alive() {
    local pid
    pid=$(cat "$DIR/run/$1.pid" 2>/dev/null) || return 1
    [[ "$pid" =~ ^[0-9]+$ && "$(cat "/proc/$pid/comm" 2>/dev/null)" == "${2:-$1}" ]]
}

node_states() { timeout 10 sinfo -h -N -o '%N %t' 2>/dev/null | sort -u; }

nodes_in() { # nodes_in REGEX: every node's state matches REGEX.
    local states
    states=$(node_states) || return 1
    local node
    for node in "${NODES[@]}"; do
        grep -Eq "^$node ($1)\$" <<<"$states" || return 1
    done
}

accounting_answers() { timeout 10 sacctmgr -n list cluster format=cluster >/dev/null 2>&1; }

healthy() {
    ((CONFIG_CHANGED == 0)) || return 1
    alive munged && alive mariadbd && alive slurmdbd && alive slurmctld || return 1
    local node
    for node in "${NODES[@]}"; do alive "slurmd-$node" slurmd || return 1; done
    accounting_answers && nodes_in "$READY_STATES"
}

any_running() {
    local name
    for name in munged mariadbd slurmdbd slurmctld "${NODES[@]/#/slurmd-}"; do
        alive "$name" "${name%%-*}" && return 0
    done
    return 1
}

# running NAME: the process recorded as NAME exists and is no zombie (it may still be exec'ing).
running() {
    local pid state
    pid=$(cat "$DIR/run/$1.pid" 2>/dev/null) || return 1
    state=$(ps -o stat= -p "$pid" 2>/dev/null) || return 1
    [[ "$state" != Z* ]]
}

# start NAME COMMAND...: run COMMAND detached in its own session; record its pid as NAME.
start() {
    local name=$1
    shift
    setsid "$@" </dev/null >>"$DIR/log/$name.out" 2>&1 &
    echo $! >"$DIR/run/$name.pid"
}

# wait_for WHAT NAME LOG COMMAND...: poll COMMAND until it succeeds; fail if daemon NAME dies.
wait_for() {
    local what=$1 name=$2 log=$3 deadline=$((SECONDS + READY_TIMEOUT_S))
    shift 3
    until "$@" >/dev/null 2>&1; do
        running "$name" || die "$name exited while waiting for $what" "$log" "$DIR/log/$name.out"
        ((SECONDS < deadline)) || die "no $what after ${READY_TIMEOUT_S} s" "$log"
        sleep 0.2
    done
}

munge_answers() {
    munge -n -S "$MUNGE_SOCKET" | unmunge -S "$MUNGE_SOCKET"
}

start_munge() {
    local key="$DIR/munge/munge.key"
    [[ -s "$key" ]] || setpriv --reuid=munge --regid=munge --init-groups \
        mungekey --create --keyfile="$key" >>"$DIR/log/munged.out" 2>&1 ||
        die "could not create a munge key" "$DIR/log/munged.out"
    # --force: a stale socket survives a killed munged.
    start munged setpriv --reuid=munge --regid=munge --init-groups munged --foreground --force \
        --key-file="$key" --socket="$MUNGE_SOCKET" --pid-file="$DIR/munge/munged.pid" \
        --log-file="$DIR/munge/munged.log" --seed-file="$DIR/munge/munged.seed"
    wait_for "munge credentials" munged "$DIR/munge/munged.log" munge_answers
}

mariadb_answers() { mariadb-admin --no-defaults --socket="$MYSQL_UNIX_PORT" ping; }

start_mariadb() {
    local data="$DIR/mysql"
    if [[ ! -d "$data/mysql" ]]; then
        rm -rf "$data"
        mariadb-install-db --no-defaults --user=root --datadir="$data" --skip-test-db \
            --auth-root-authentication-method=socket >"$DIR/log/mariadb-install.log" 2>&1 ||
            die "mariadb-install-db" "$DIR/log/mariadb-install.log"
    fi
    start mariadbd mariadbd --no-defaults --user=root --datadir="$data" --skip-networking \
        --socket="$MYSQL_UNIX_PORT" --pid-file="$DIR/run/mariadbd.pid" \
        --log-error="$DIR/log/mariadbd.log"
    wait_for "answer from MariaDB" mariadbd "$DIR/log/mariadbd.log" mariadb_answers
}

start_slurmdbd() {
    start slurmdbd slurmdbd -D
    wait_for "answer from slurmdbd (sacctmgr)" slurmdbd "$DIR/log/slurmdbd.log" accounting_answers
    if ! timeout 10 sacctmgr -n list cluster format=cluster | grep -qw "$CLUSTER"; then
        timeout 10 sacctmgr -i add cluster "$CLUSTER" >>"$DIR/log/sacctmgr.log" 2>&1 ||
            die "sacctmgr add cluster $CLUSTER" "$DIR/log/sacctmgr.log" "$DIR/log/slurmdbd.log"
    fi
}

start_slurmctld() {
    start slurmctld slurmctld -D
    wait_for "answer from slurmctld (scontrol ping)" slurmctld "$DIR/log/slurmctld.log" \
        controller_answers
}

controller_answers() { timeout 10 scontrol ping | grep -q UP; }

# A node drained by an earlier run (say, a task that would not die) comes back here.
resume_drained() {
    local drained
    drained=$(node_states | awk '$2 ~ /^(drain|drng|drained)$/ { print $1 }' | paste -sd,)
    [[ -z "$drained" ]] || scontrol update NodeName="$drained" State=RESUME
}

start_slurmds() {
    local node deadline=$((SECONDS + READY_TIMEOUT_S))
    for node in "${NODES[@]}"; do
        start "slurmd-$node" slurmd -D -N "$node"
    done
    # Not only idle: other sessions' jobs, or jobs recovered after a kill -9, may hold CPUs.
    until nodes_in "$READY_STATES"; do
        for node in "${NODES[@]}"; do
            running "slurmd-$node" || die "slurmd -N $node exited" \
                "$DIR/log/slurmd-$node.log" "$DIR/log/slurmd-$node.out"
        done
        resume_drained
        ((SECONDS < deadline)) || die "nodes not ready after ${READY_TIMEOUT_S} s: \
$(node_states | paste -sd' ')" "$DIR/log/slurmctld.log" "${NODES[@]/#/$DIR/log/slurmd-}"
        sleep 0.2
    done
}

smoke_job() {
    local out
    out=$(timeout 60 srun -N2 -n2 -t 1 --label printenv SLURMD_NODENAME 2>&1 | sort) ||
        die "smoke job (srun -N2 -n2) failed: $out" "$DIR/log/slurmctld.log"
    [[ "$out" == $'0: n1\n1: n2' ]] ||
        die "smoke job ran on the wrong nodes: $(paste -sd' ' <<<"$out")" "$DIR/log/slurmctld.log"
}

main() {
    ((EUID == 0)) || die "run as root (it installs packages and writes /etc/slurm)"
    INSTALLED=0
    CONFIG_CHANGED=0
    mkdir -p "$DIR/log"
    install_packages
    prepare_dirs
    add_hosts
    install_conf slurm.conf 0644
    install_conf slurmdbd.conf 0600
    if healthy; then
        say "cluster $CLUSTER already up ($(node_states | paste -sd' ')): nothing to do" \
            "($(elapsed_s) s)"
        return 0
    fi
    local how=started
    [[ -e "$DIR/ctld/clustername" ]] || how="first start"
    if any_running; then
        how=restarted
        say "cluster half up or its config changed: restarting it"
    fi
    # Also clears what a kill -9 leaves: job steps, stale sockets and pid files.
    "$HERE/down.sh"
    start_munge
    start_mariadb
    start_slurmdbd
    start_slurmctld
    start_slurmds
    smoke_job
    ((INSTALLED == 0)) || how="$how, packages installed"
    say "cluster $CLUSTER up in $(elapsed_s) s ($how): $(node_states | paste -sd' '), smoke job ok;" \
        "logs in $DIR/log"
}

main "$@"
