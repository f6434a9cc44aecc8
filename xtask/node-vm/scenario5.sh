#!/bin/sh
# Scenario 5 of the node VM (issue 19): the agent restarts under running pods. With the static CPU
# manager policy (CPU 0 reserved on the 2-CPU VM) a Guaranteed pod with one whole CPU gets CPU 1
# for itself; the pod also writes into an emptyDir on disk and one in memory (a tmpfs), and has a
# downwardAPI volume. Then `systemctl restart swiftlet`, and `kill -9` of its main PID (systemd
# restarts it: Restart=always, RestartSec=10). After each: every pod adopted (the same container
# IDs and restart counts, one task per container), the exclusive CPU intact (the container's
# cpuset.cpus.effective and the checkpoint cpu_manager_state unchanged), the volumes intact (the
# data still there and seen by the container, the tmpfs mounted once). The time from the kill to
# the agent ready again is a fact. Starts from a node with swiftlet stopped or running, and
# leaves it as scenario 1 does (stopped, the pods' processes gone, the default configuration).
. "$(dirname "$0")/lib.sh"

config=/etc/swiftlet/config.yaml
state=/var/lib/swiftlet/cpu_manager_state
manifests=$(sed -n 's/^staticPodPath: *//p' "$config")
systemctl stop swiftlet
cp "$config" /run/swiftlet-config.yaml.orig
# Switching the policy needs the old checkpoint gone, as upstream.
rm -f "$state"
# A blank line first: the file may not end with a newline.
printf '\ncpuManagerPolicy: static\nreservedSystemCPUs: "0"\n' >> "$config"
cat > "$manifests"/pinned.yaml <<'EOF'
apiVersion: v1
kind: Pod
metadata:
  name: pinned
  namespace: default
  labels:
    app: pinned
spec:
  restartPolicy: Always
  terminationGracePeriodSeconds: 2
  containers:
    - name: work
      image: localhost/swiftlet/busybox:latest
      imagePullPolicy: Never
      command:
        - sh
        - -c
        - cat /proc/sys/kernel/random/uuid > /data/stamp; cp /data/stamp /mem/stamp; exec sleep 3600
      resources:
        requests: {cpu: "1", memory: 64Mi}
        limits: {cpu: "1", memory: 64Mi}
      volumeMounts:
        - {name: data, mountPath: /data}
        - {name: mem, mountPath: /mem}
        - {name: podinfo, mountPath: /podinfo}
  volumes:
    - name: data
      emptyDir: {}
    - name: mem
      emptyDir: {medium: Memory, sizeLimit: 16Mi}
    - name: podinfo
      downwardAPI:
        items:
          - path: labels
            fieldRef: {fieldPath: metadata.labels}
EOF
pods=$(ls "$manifests"/*.yaml | wc -l)
start=$(timeout 300 systemctl start swiftlet 2>&1)
check agent_started "exit=$? $start $(prop StatusText)" systemctl -q is-active swiftlet
wait_for 240 all_ready "$pods"
check pods_ready "$(pods_json | jq -c '[.items[] | {name: .metadata.name, phase: .status.phase}]' 2>/dev/null)" \
    all_ready "$pods"
uid=$(pods_json | jq -r '.items[] | select(.metadata.name == "pinned") | .metadata.uid')
volumes=/var/lib/swiftlet/pods/$uid/volumes

# What must survive the restarts, read now: the containers, the pinned container's cpuset and
# the checkpoint, the volumes' data as the container sees it and the tmpfs mount.
look() {
    snapshot=$(snapshot)
    id=$(echo "$snapshot" | awk '$1 == "pinned/work" { print $2 }')
    task_pid=$(ctr -n k8s.io tasks ls | awk -v id="$id" '$1 == id { print $2 }')
    scope=$(find /sys/fs/cgroup/kubepods.slice -name "cri-containerd-$id.scope" 2>/dev/null | head -1)
    cpus=$(cat "$scope"/cpuset.cpus.effective 2>/dev/null)
    checkpoint=$(jq -c '{policyName, defaultCpuSet, entries}' "$state" 2>/dev/null)
    data=$(cat /proc/"$task_pid"/root/data/stamp 2>/dev/null)
    mem=$(cat /proc/"$task_pid"/root/mem/stamp 2>/dev/null)
    labels=$(cat /proc/"$task_pid"/root/podinfo/labels 2>/dev/null)
    # The filesystem type follows the " - " of a mountinfo line.
    mem_mounts=$(awk -v p="$volumes/kubernetes.io~empty-dir/mem" '$5 == p {
        for (i = 7; i < NF; i++) if ($i == "-") { print $(i + 1); break } }' /proc/self/mountinfo | tr '\n' ' ')
    container_mounts=$(awk '$5 == "/data" || $5 == "/mem" || $5 == "/podinfo" { print $5 }' /proc/"$task_pid"/mountinfo 2>/dev/null | sort | tr '\n' ' ')
}
look
fact pinned_cpus "$cpus"
fact checkpoint "$checkpoint"
check exclusive_cpu "cpuset.cpus.effective=$cpus in $scope" test "$cpus" = 1
check checkpoint_assigns "$checkpoint" \
    sh -c "echo '$checkpoint' | jq -e --arg uid '$uid' '.policyName == \"static\" and .entries[\$uid].work == \"1\"' >/dev/null"
check volumes_written "data=$data mem=$mem labels=$labels tmpfs=$mem_mounts mounts=$container_mounts" \
    sh -c "test -n '$data' && test '$data' = '$mem' && echo '$labels' | grep -q pinned && test '$mem_mounts' = 'tmpfs ' && test '$container_mounts' = '/data /mem /podinfo '"
check tasks_before "$(dump_tasks)" tasks_match "$snapshot" "$pods"
before_snapshot=$snapshot
before="$cpus|$checkpoint|$data|$mem|$labels|$mem_mounts|$container_mounts"

# After a restart: all adopted and intact (the pods stay ready; the first look waits until the
# agent lists them again, then a few relists pass in case one would act late).
compare() {
    wait_for 120 all_ready "$pods"
    sleep 5
    look
    check "${1}_adopted" "$(brief "$snapshot")" test "$snapshot" = "$before_snapshot"
    check "${1}_tasks" "$(dump_tasks)" tasks_match "$snapshot" "$pods"
    check "${1}_cpu_intact" "cpus=$cpus checkpoint=$checkpoint" \
        test "$cpus|$checkpoint" = "$(echo "$before" | cut -d'|' -f1-2)"
    check "${1}_volumes_intact" "data=$data mem=$mem tmpfs=$mem_mounts mounts=$container_mounts" \
        test "$cpus|$checkpoint|$data|$mem|$labels|$mem_mounts|$container_mounts" = "$before"
}

t=$(uptime_s)
systemctl restart swiftlet
fact restart_to_ready_seconds "$(since "$t")"
compare restart

pid=$(prop MainPID)
restarts=$(prop NRestarts)
killed_at=$(uptime_s)
kill -9 "$pid"
# Ready again: a new main process, and the unit active (Type=notify: only after READY=1).
ready_again() { test "$(prop MainPID)" != "$pid" -a "$(prop MainPID)" != 0 -a "$(prop ActiveState)" = active; }
i=0
while [ $i -lt 600 ] && ! ready_again; do
    sleep 0.2
    i=$((i + 1))
done
fact kill_to_ready_seconds "$(since "$killed_at")"
restarted_once() { test "$(prop NRestarts)" = $((restarts + 1)) && ready_again; }
check restarted_by_systemd "MainPID $pid -> $(prop MainPID), NRestarts $restarts -> $(prop NRestarts), $(prop ActiveState)" \
    restarted_once
compare kill

if [ "$failed" -gt 0 ]; then
    journalctl -u swiftlet --no-pager -o cat | tail -60 | sed "s/^/$M log /"
fi
rm -f "$manifests"/pinned.yaml
systemctl stop swiftlet
systemctl kill --signal=SIGKILL kubepods.slice 2>/dev/null
cp /run/swiftlet-config.yaml.orig "$config"
rm -f "$state"
fact scenario_seconds "$(since "$scenario_started")"
echo "$M done $failed"
