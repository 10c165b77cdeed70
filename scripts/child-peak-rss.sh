#!/bin/bash
# Peak memory of the processes a command starts (a bench's workers, a replacement after a kill).
#
#   scripts/child-peak-rss.sh cutline bench ... --workers 1 --kill-worker-after 28s
#
# Prints the bench's figures, then for each child process its peak RSS (VmHWM, read from
# /proc/PID/status every 20 ms) 1 s and 3 s after it was first seen, and at its end. Exits with
# the command's status (its stderr is shown if it failed).
set -u
out=$(mktemp)
err=$(mktemp)
trap 'rm -f "$out" "$err"' EXIT
"$@" >"$out" 2>"$err" &
top=$!
declare -A hwm first at1 at3
while kill -0 "$top" 2>/dev/null; do
    now=$(date +%s%N)
    for p in $(pgrep -P "$top"); do
        v=$(awk '/VmHWM/{print $2}' "/proc/$p/status" 2>/dev/null)
        [ -z "$v" ] && continue
        hwm[$p]=$v
        [ -z "${first[$p]:-}" ] && first[$p]=$now
        el=$(((now - ${first[$p]}) / 1000000))
        [ "$el" -le 1000 ] && at1[$p]=$v
        [ "$el" -le 3000 ] && at3[$p]=$v
    done
    sleep 0.02
done
wait "$top"
status=$?
[ "$status" -ne 0 ] && cat "$err" >&2
tail -1 "$out" | tr ' ' '\n' | grep -E "events_per_s|recovery_ms|verified|state_bytes|restarts" | tr '\n' ' '
echo
for p in "${!hwm[@]}"; do
    echo "child $p first_seen_ns=${first[$p]} hwm_1s_mb=$((${at1[$p]:-0} / 1024)) hwm_3s_mb=$((${at3[$p]:-0} / 1024)) hwm_end_mb=$((${hwm[$p]} / 1024))"
done | sort -t= -k2 -n
exit "$status"
