#!/usr/bin/env bash
# Stop the test SLURM cluster that up.sh started: cancel its jobs, then stop its daemons
# (slurmd, slurmctld, slurmdbd, mariadbd, munged) and their job steps. Idempotent.
# Logs and state stay in the state folder for the next up.sh; --purge deletes them too
# (and the config up.sh wrote to /etc/slurm), for a fresh slate: job ids from 1, empty accounting.
set -euo pipefail

DIR="${MSD_SLURM_DIR:-/tmp/msd-slurm}"
STOP_TIMEOUT_S=15
T0=$EPOCHREALTIME

say() { echo "down.sh: $*"; }

elapsed_s() { awk -v a="$T0" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1f", b - a }'; }

# uses_dir PID: the process carries MSD_SLURM_DIR=$DIR in its environment (daemons up.sh
# started) or has a file open under $DIR (job steps: their slurmd log).
uses_dir() {
    tr '\0' '\n' 2>/dev/null <"/proc/$1/environ" | grep -qxF "MSD_SLURM_DIR=$DIR" && return 0
    local fd
    for fd in /proc/"$1"/fd/*; do
        [[ "$(readlink "$fd" 2>/dev/null)" == "$DIR"/* ]] && return 0
    done
    return 1
}

# ours COMM: pids of the processes named COMM that belong to the cluster in $DIR.
ours() {
    local comm=$1 pid file
    for file in "$DIR"/run/*.pid; do
        [[ -r "$file" ]] || continue
        pid=$(cat "$file")
        [[ "$pid" =~ ^[0-9]+$ && "$(cat "/proc/$pid/comm" 2>/dev/null)" == "$comm" ]] &&
            live "$pid" && echo "$pid"
    done
    for pid in $(pgrep -x "$comm"); do
        uses_dir "$pid" && echo "$pid"
    done
    return 0
}

# descendants PID...: every process below the given ones (a job step's tasks).
descendants() {
    local pid child
    for pid in "$@"; do
        for child in $(pgrep -P "$pid"); do
            echo "$child"
            descendants "$child"
        done
    done
}

# stop TIMEOUT_S PID...: SIGTERM, wait, then SIGKILL whatever is left.
stop() {
    local deadline=$((SECONDS + $1))
    shift
    (($# > 0)) || return 0
    kill -TERM "$@" 2>/dev/null || true
    while any_alive "$@" && ((SECONDS < deadline)); do sleep 0.1; done
    kill -KILL "$@" 2>/dev/null || true
}

any_alive() {
    local pid
    for pid in "$@"; do
        live "$pid" && return 0
    done
    return 1
}

# live PID: the process exists and is no zombie (a daemon's parent is gone, so init reaps it,
# on its own time).
live() {
    local state
    state=$(ps -o stat= -p "$1" 2>/dev/null) && [[ "$state" != Z* ]]
}

cancel_jobs() {
    command -v squeue >/dev/null && timeout 10 scontrol ping 2>/dev/null | grep -q UP || return 0
    local jobs deadline=$((SECONDS + STOP_TIMEOUT_S))
    jobs=$(timeout 10 squeue -h -o %A) || return 0
    [[ -n "$jobs" ]] || return 0
    say "cancelling jobs $(paste -sd' ' <<<"$jobs")"
    # shellcheck disable=SC2086
    timeout 10 scancel $jobs || true
    while [[ -n "$(timeout 10 squeue -h -t running,completing -o %A)" ]] &&
        ((SECONDS < deadline)); do
        sleep 0.2
    done
}

main() {
    cancel_jobs
    local stopped=() comm pids timeout_s
    for comm in slurmd slurmstepd slurmctld slurmdbd mariadbd munged; do
        pids=$(ours "$comm" | sort -u)
        [[ -n "$pids" ]] || continue
        timeout_s=$STOP_TIMEOUT_S
        if [[ "$comm" == slurmstepd ]]; then
            # Job steps outlive their slurmd and ignore SIGTERM: take their tasks with them.
            # shellcheck disable=SC2046,SC2086
            pids="$pids $(descendants $pids)"
            timeout_s=2
        fi
        # shellcheck disable=SC2086
        stop "$timeout_s" $pids
        stopped+=("$comm")
    done
    rm -f "$DIR"/run/*.pid "$DIR"/run/*.sock "$DIR"/munge/munge.socket.2*
    if [[ "${1:-}" == --purge ]]; then
        local name
        for name in slurm.conf slurmdbd.conf; do
            cmp -s "$DIR/etc/$name" "/etc/slurm/$name" && rm -f "/etc/slurm/$name"
        done
        rm -rf "$DIR"
        say "state folder $DIR deleted"
    fi
    if ((${#stopped[@]})); then
        say "stopped ${stopped[*]} in $(elapsed_s) s"
    else
        say "nothing was running"
    fi
}

main "$@"
