#!/bin/sh
# Scenario 6 of the node VM (issue 19): graceful node shutdown. swiftlet (installed and stopped by
# the scenarios before) runs with shutdownGracePeriod 30s / shutdownGracePeriodCriticalPods 10s
# and two static pods, a regular one and a system-node-critical one, each with a preStop hook
# that leaves a mark in a hostPath folder. Before the power-off: logind's InhibitDelayMaxSec was
# raised by swiftlet's drop-in and swiftlet holds a delay lock. Then `systemctl poweroff` (not
# --force): logind announces the shutdown and waits for the lock. The checks run during the
# shutdown, from a unit ordered after swiftlet.service (so it stops before swiftlet does): its
# ExecStop reads swiftlet's /pods and /node and the marks, and prints the `check` lines and this
# scenario's `done` line on the console. This script then only waits: the image's runner must
# not reach its forced power-off. qemu runs with -no-reboot, so the power-off ends the VM.
. "$(dirname "$0")/lib.sh"

marks=/var/lib/swiftlet-shutdown-marks
manifests=$(sed -n 's/^staticPodPath: *//p' /etc/swiftlet/config.yaml)
manifests=${manifests:-/etc/kubernetes/manifests}
mkdir -p "$manifests"
# Only this scenario's pods: the examples would join the regular group.
rm -f "$manifests"/*.yaml
rm -rf "$marks"
mkdir -p "$marks"

cat >>/etc/swiftlet/config.yaml <<'EOF'
shutdownGracePeriod: 30s
shutdownGracePeriodCriticalPods: 10s
EOF

# A pod whose preStop hook appends its name to the shared order file and exits on SIGTERM.
pod() {
    name=$1
    extra=$2
    cat >"$manifests/$name.yaml" <<EOF
apiVersion: v1
kind: Pod
metadata:
  name: $name
  namespace: default
spec:
$extra
  terminationGracePeriodSeconds: 5
  restartPolicy: Always
  volumes:
    - name: marks
      hostPath:
        path: $marks
        type: Directory
  containers:
    - name: main
      image: localhost/swiftlet/busybox:latest
      imagePullPolicy: Never
      command: ["sh", "-c", "trap 'exit 0' TERM; while true; do sleep 1; done"]
      volumeMounts:
        - name: marks
          mountPath: /marks
      lifecycle:
        preStop:
          exec:
            command: ["sh", "-c", "echo $name >> /marks/order; touch /marks/$name"]
EOF
}
pod regular ""
pod critical "  priorityClassName: system-node-critical
  priority: 2000001000"

timeout 400 systemctl start swiftlet
check swiftlet_started "$(systemctl show -p ActiveState,SubState,StatusText swiftlet | tr '\n' ' ')" \
    systemctl -q is-active swiftlet

running=0
i=0
while [ $i -lt 240 ]; do
    running=$(curl -sf http://127.0.0.1:10255/pods | jq '[.items[] | select(.status.phase == "Running")] | length' 2>/dev/null)
    [ "${running:-0}" -ge 2 ] && break
    sleep 1
    i=$((i + 1))
done
check pods_running "$running of 2 running: $(curl -sf http://127.0.0.1:10255/pods | jq -c '[.items[] | {name: .metadata.name, phase: .status.phase, priority: .spec.priority}]' 2>/dev/null)" \
    test "${running:-0}" -ge 2

delay=$(busctl get-property org.freedesktop.login1 /org/freedesktop/login1 org.freedesktop.login1.Manager InhibitDelayMaxUSec 2>&1)
check inhibit_delay_raised "InhibitDelayMaxUSec: $delay" test "$delay" = "t 30000000"
dropin=/etc/systemd/logind.conf.d/99-swiftlet.conf
check logind_drop_in "$(stat -c '%a %U %F' "$dropin" 2>&1) $(grep InhibitDelayMaxSec "$dropin" 2>&1)" \
    sh -c "test \"\$(stat -c %a $dropin)\" = 644 && test ! -L $dropin && grep -qx 'InhibitDelayMaxSec=30' $dropin"
locks=$(systemd-inhibit --list --no-pager --no-legend 2>&1 | tr -s ' ' | tr '\n' ';')
check inhibitor_lock_held "$locks" sh -c "systemd-inhibit --list --no-pager --no-legend | grep -w swiftlet | grep -w shutdown | grep -qw delay"
# logind's own record of it, which the shutdown checks read when D-Bus may be going away.
# Regular files only: each lock also has a FIFO there, which a reader would block on.
state_file=$(find /run/systemd/inhibit -maxdepth 1 -type f -exec grep -l '^WHO=swiftlet' {} + 2>/dev/null | head -1)
check inhibitor_state_file "$state_file: $(grep -E '^(WHAT|MODE)=' "${state_file:-/dev/null}" 2>&1 | tr '\n' ' ')" \
    sh -c "test -n '$state_file' && grep -qx 'MODE=delay' '$state_file'"

# The checks that run during the shutdown, while swiftlet still serves.
cat >/run/swiftlet-shutdown-check.sh <<'CHECKS'
M="swiftlet-node-vm:"
marks=/var/lib/swiftlet-shutdown-marks
manifests=$(sed -n 's/^staticPodPath: *//p' /etc/swiftlet/config.yaml)
manifests=${manifests:-/etc/kubernetes/manifests}
failed=0
check() {
    name=$1
    detail=$2
    shift 2
    if "$@"; then
        echo "$M check $name ok $detail"
    else
        echo "$M check $name FAILED $detail"
        failed=$((failed + 1))
    fi
}
echo "$M log shutdown checks: swiftlet is $(systemctl is-active swiftlet)"
pods=$(curl -sf --max-time 10 http://127.0.0.1:10255/pods)
status() {
    echo "$pods" | jq -c --arg n "$1-" '[.items[] | select(.metadata.name | startswith($n)) | {phase: .status.phase, reason: .status.reason, message: .status.message, target: [.status.conditions[]? | select(.type == "DisruptionTarget") | {status, reason, message}]}] | .[0]'
}
message="Pod was terminated in response to imminent node shutdown."
for pod in regular critical; do
    s=$(status $pod)
    check "${pod}_terminated" "$s" sh -c "echo '$s' | jq -e --arg m '$message' '.phase == \"Failed\" and .reason == \"Terminated\" and .message == \$m' >/dev/null"
    check "${pod}_disruption_target" "$s" sh -c "echo '$s' | jq -e --arg m '$message' '.target == [{status: \"True\", reason: \"TerminationByKubelet\", message: \$m}]' >/dev/null"
    check "${pod}_prestop_ran" "$(ls $marks 2>&1 | tr '\n' ' ')" test -e "$marks/$pod"
done
order=$(tr '\n' ' ' <"$marks/order" 2>/dev/null)
check regular_before_critical "preStop order: $order" test "$order" = "regular critical "
# The last group's kill may outlast its seconds (the manager then goes on, as upstream, and the
# pod workers finish it): the containers must be seen stopped while swiftlet still runs.
stopped=""
i=0
while [ $i -lt 90 ]; do
    stopped=$(curl -sf --max-time 10 http://127.0.0.1:10255/pods | jq -c '[.items[] | select(.metadata.name | startswith("late-") | not) | {name: .metadata.name, containers: [.status.containerStatuses[]? | .state | keys[0]]}]')
    echo "$stopped" | jq -e 'all(.[]; all(.containers[]; . == "terminated"))' >/dev/null 2>&1 && break
    sleep 1
    i=$((i + 1))
done
check containers_stopped "after ${i}s: $stopped" sh -c "echo '$stopped' | jq -e 'length == 2 and all(.[]; all(.containers[]; . == \"terminated\"))' >/dev/null"
# The manager's own account of the order: the regular group was done (or out of time) before
# the critical pod was killed.
journal=$(journalctl -u swiftlet --no-pager -o cat | grep -E 'done waiting for all pods|pod killing timed out|killing pod with gracePeriod' | sed -e 's/^[^ ]* *[A-Z]* *swiftlet::nodeshutdown::manager: //')
line() { echo "$journal" | grep -n -E "$1" | head -1 | cut -d: -f1; }
regular=$(line 'killing pod.*pod=regular-')
regular_done=$(line '(done waiting|timed out).*priority=0( |$)')
critical=$(line 'killing pod.*pod=critical-')
check manager_order "lines regular=$regular done=$regular_done critical=$critical: $(echo "$journal" | tr '\n' ';')" \
    test -n "$regular" -a -n "$regular_done" -a -n "$critical" -a "${regular:-0}" -lt "${regular_done:-0}" -a "${regular_done:-0}" -lt "${critical:-0}"
held=$(find /run/systemd/inhibit -maxdepth 1 -type f -exec grep -l '^WHO=swiftlet' {} + 2>/dev/null | tr '\n' ' ')
check lock_released "swiftlet's inhibitors in /run/systemd/inhibit: [$held]" test -z "$held"
ready=$(curl -sf --max-time 10 http://127.0.0.1:10255/node | jq -c '.status.conditions[]? | select(.type == "Ready") | {status, reason, message}')
check node_not_ready "$ready" sh -c "echo '$ready' | jq -e '.status == \"False\" and .reason == \"KubeletNotReady\" and (.message | contains(\"node is shutting down\"))' >/dev/null"
# A pod added now is refused.
sed -e 's/name: regular/name: late/' "$manifests/regular.yaml" >"$manifests/late.yaml"
late=""
i=0
while [ $i -lt 30 ]; do
    late=$(curl -sf --max-time 10 http://127.0.0.1:10255/pods | jq -c '[.items[] | select(.metadata.name | startswith("late-")) | {phase: .status.phase, reason: .status.reason, message: .status.message}] | .[0] // empty')
    [ -n "$late" ] && break
    sleep 1
    i=$((i + 1))
done
check late_pod_refused "$late" sh -c "echo '$late' | jq -e '.phase == \"Failed\" and .reason == \"NodeShutdown\" and .message == \"Pod was rejected as the node is shutting down.\"' >/dev/null"
journalctl -u swiftlet --no-pager -o cat | grep -iE 'shutdown|inhibitor|killing pod' | tail -20 | sed "s/^/$M log /"
if [ "$failed" -gt 0 ]; then
    journalctl -u swiftlet --no-pager -o cat | tail -40 | sed "s/^/$M log /"
fi
echo "$M done $failed"
CHECKS

# Started now, stopped during the shutdown before swiftlet (units stop in reverse start order).
cat >/run/systemd/system/swiftlet-shutdown-check.service <<'EOF'
[Unit]
Description=swiftlet node VM scenario 6: checks while the node shuts down
After=swiftlet.service

[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart=/bin/true
ExecStop=/bin/sh /run/swiftlet-shutdown-check.sh
TimeoutStopSec=180
StandardOutput=tty
StandardError=tty
TTYPath=/dev/ttyS0
EOF
systemctl daemon-reload
systemctl start swiftlet-shutdown-check
check check_unit_started "$(systemctl is-active swiftlet-shutdown-check 2>&1)" systemctl -q is-active swiftlet-shutdown-check

if [ "$failed" -gt 0 ]; then
    journalctl -u swiftlet --no-pager -o cat | tail -60 | sed "s/^/$M log /"
    # Without the lock or the pods there is nothing to shut down gracefully: end here.
    echo "$M done $failed"
    exit 0
fi
echo "$M log powering off (systemctl poweroff, not --force); the checks follow during the shutdown"
systemctl poweroff
# The runner's forced power-off must not come first: the shutdown stops this unit meanwhile.
sleep 900
