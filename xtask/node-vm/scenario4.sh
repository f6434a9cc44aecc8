#!/bin/sh
# Scenario 4 of the node VM (issue 19): the container runtime goes away under a running agent.
# `systemctl restart containerd`, then a stop held for OUTAGE seconds during which a container's
# process is killed from the host (its shim survives, as containerd.service kills only its main
# process). Asserted: the pods keep running and nothing is duplicated or restarted (the same
# container IDs and restart counts, one task per container); the agent stays up (same PID,
# NRestarts unchanged, the watchdog petted) and reports the runtime down (the node's Ready
# condition, as upstream: "container runtime is down" after 30 s without an answer; the unit's
# status line) while /healthz stays ok, as the kubelet's; after the runtime returns the node is
# ready again and the container that exited meanwhile shows its exit and is restarted once.
# Starts from the node scenario 1 left (swiftlet stopped, the pods killed) and leaves it so.
. "$(dirname "$0")/lib.sh"
container() { pods_json | jq -c --arg p "$1" --arg c "$2" '.items[] | select(.metadata.name == $p)
    | .status.containerStatuses[] | select(.name == $c)'; }
ready_condition() {
    curl -sf --max-time 5 http://127.0.0.1:10255/node |
        jq -r '.status.conditions[] | select(.type == "Ready") | "\(.status) \(.message)"'
}
node_ready() { ready_condition | grep -q '^True'; }
runtime_down() { ready_condition | grep -q '^False .*container runtime is down'; }

OUTAGE=40
manifests=$(sed -n 's/^staticPodPath: *//p' /etc/swiftlet/config.yaml)
# Two containers: `steady` lives through the outage, `victim` is killed during it.
cat > "$manifests"/outage.yaml <<'EOF'
apiVersion: v1
kind: Pod
metadata:
  name: outage
  namespace: default
spec:
  restartPolicy: Always
  terminationGracePeriodSeconds: 2
  containers:
    - name: steady
      image: localhost/swiftlet/busybox:latest
      imagePullPolicy: Never
      command: ["sh", "-c", "exec sleep 3600"]
    - name: victim
      image: localhost/swiftlet/busybox:latest
      imagePullPolicy: Never
      command: ["sh", "-c", "exec sleep 3600"]
EOF
pods=$(ls "$manifests"/*.yaml | wc -l)
started=$(uptime_s)
start=$(timeout 300 systemctl start swiftlet 2>&1)
check agent_started "exit=$? $start $(prop StatusText)" systemctl -q is-active swiftlet
wait_for 240 all_ready "$pods"
check pods_ready "$(pods_json | jq -c '[.items[] | {name: .metadata.name, phase: .status.phase}]' 2>/dev/null)" \
    all_ready "$pods"
fact pods_ready_seconds "$(since "$started")"
wait_for 30 node_ready
before=$(snapshot)
pid=$(prop MainPID)
restarts=$(prop NRestarts)
check tasks_before "$(echo "$before" | wc -l) containers; tasks: $(dump_tasks)" tasks_match "$before" "$pods"

# A quick restart of the runtime: nothing happens to the pods.
t=$(uptime_s)
systemctl restart containerd
fact containerd_restart_seconds "$(since "$t")"
# The agent's next relist and runtime check come within their periods (1 s, 5 s).
sleep 10
after=$(snapshot)
check restart_keeps_pods "$(brief "$after")" test "$after" = "$before"
check restart_keeps_tasks "$(dump_tasks)" tasks_match "$after" "$pods"
check restart_keeps_agent "MainPID $pid -> $(prop MainPID), NRestarts $restarts -> $(prop NRestarts)" \
    test "$(prop MainPID)" = "$pid" -a "$(prop NRestarts)" = "$restarts"

# The outage: containerd stopped for OUTAGE seconds.
victim=$(echo "$before" | awk '$1 == "outage/victim" { print $2 }')
victim_pid=$(ctr -n k8s.io tasks ls | awk -v id="$victim" '$1 == id { print $2 }')
victim_restarts=$(echo "$before" | awk '$1 == "outage/victim" { print $3 }')
watchdog_before=$(prop WatchdogTimestampMonotonic)
down_at=$(uptime_s)
systemctl stop containerd
check runtime_stopped "containerd $(systemctl is-active containerd); shims: $(pgrep -c containerd-shim)" \
    sh -c '! systemctl -q is-active containerd && test "$(pgrep -c containerd-shim)" -gt 0'
check pods_survive_outage "victim pid $victim_pid" kill -0 "$victim_pid"
kill -9 "$victim_pid"
wait_for $((OUTAGE + 20)) runtime_down
fact runtime_down_reported_after "$(since "$down_at")"
check node_not_ready "$(ready_condition)" runtime_down
# The status line is refreshed on its own period (2 s), so it may trail the node's condition.
status_down() { prop StatusText | grep -q 'container runtime is down'; }
wait_for 10 status_down
check status_tells "$(prop StatusText)" status_down
healthz=$(curl -s --max-time 5 -w ' %{http_code}' http://127.0.0.1:10248/healthz | tr '\n' ' ')
check healthz_stays_ok "$healthz" sh -c "echo '$healthz' | grep -q ' 200\$'"
left=$(awk -v d="$down_at" -v o="$OUTAGE" -v n="$(uptime_s)" 'BEGIN { l = d + o - n; print (l > 0 ? int(l) : 0) }')
sleep "$left"
watchdog_during=$(prop WatchdogTimestampMonotonic)
fact outage_seconds "$(since "$down_at")"
systemctl start containerd
up_at=$(uptime_s)
check agent_kept "MainPID $pid -> $(prop MainPID), NRestarts $restarts -> $(prop NRestarts), watchdog $watchdog_before -> $watchdog_during" \
    sh -c "test '$(prop MainPID)' = '$pid' && test '$(prop NRestarts)' = '$restarts' && test '$watchdog_during' -gt '$watchdog_before'"

# Back: the node ready, the victim's exit seen and the victim restarted once.
wait_for 60 node_ready
fact ready_again_after "$(since "$up_at")"
check node_ready_again "$(ready_condition)" node_ready
restarted() { container outage victim | jq -e --argjson n "$victim_restarts" '.restartCount == $n + 1 and .ready' >/dev/null; }
wait_for 90 restarted
fact victim_restarted_after "$(since "$up_at")"
# A second restart or a duplicate would come within a few relists.
sleep 5
v=$(container outage victim)
check victim_exit_reported "$(echo "$v" | jq -c '.lastState')" \
    sh -c "echo '$v' | jq -e '.lastState.terminated.exitCode == 137' >/dev/null"
check victim_restarted_once "restartCount $victim_restarts -> $(echo "$v" | jq .restartCount), id $victim -> $(echo "$v" | jq -r .containerID)" \
    sh -c "echo '$v' | jq -e --argjson n $victim_restarts --arg old 'containerd://$victim' '.restartCount == \$n + 1 and .containerID != \$old and .ready' >/dev/null"
after=$(snapshot)
others_before=$(echo "$before" | grep -v '^outage/victim ')
others_after=$(echo "$after" | grep -v '^outage/victim ')
check others_untouched "$(brief "$others_after")" test "$others_after" = "$others_before"
check tasks_after "$(dump_tasks)" tasks_match "$after" "$pods"
check status_running_again "$(prop StatusText)" test "$(prop StatusText)" = running
check agent_never_restarted "MainPID $pid -> $(prop MainPID), NRestarts $restarts -> $(prop NRestarts)" \
    test "$(prop MainPID)" = "$pid" -a "$(prop NRestarts)" = "$restarts"

if [ "$failed" -gt 0 ]; then
    journalctl -u swiftlet --no-pager -o cat | tail -60 | sed "s/^/$M log /"
fi
# Leave the node as scenario 1 does: the agent stopped, the pods' processes gone, the examples'
# manifests in place.
rm -f "$manifests"/outage.yaml
systemctl stop swiftlet
systemctl kill --signal=SIGKILL kubepods.slice 2>/dev/null
fact scenario_seconds "$(since "$scenario_started")"
echo "$M done $failed"
