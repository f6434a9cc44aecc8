#!/bin/sh
# Scenario 1 of the node VM (issue 19): `dpkg -i` the package, static pods in the default
# config's manifest folder, `systemctl enable --now swiftlet`; then assert the unit is ready
# (sd_notify), the pods run, the watchdog is kept, and the agent sits where upstream places the
# kubelet (oom_score_adj -999, its own cgroup under system.slice). Each check prints one line:
#   swiftlet-node-vm: check NAME ok|FAILED DETAIL
# and facts worth reporting print `swiftlet-node-vm: fact NAME VALUE`.
. "$(dirname "$0")/lib.sh"
P=/payload

state=$(timeout 600 systemctl is-system-running --wait)
fact boot_seconds "$(uptime_s)"
fact kernel "$(uname -r)"
fact containerd "$(containerd --version)"
check system_running "state=$state failed_units=$(systemctl --failed --no-legend --plain | cut -d' ' -f1 | tr '\n' ,)" \
    test "$state" = running
check pure_cgroup_v2 "fs=$(stat -fc %T /sys/fs/cgroup) controllers=$(cat /sys/fs/cgroup/cgroup.controllers | tr ' ' ,)" \
    sh -c 'test "$(stat -fc %T /sys/fs/cgroup)" = cgroup2fs && grep -qw memory /sys/fs/cgroup/cgroup.controllers && grep -qw cpu /sys/fs/cgroup/cgroup.controllers'
check containerd_active "$(systemctl is-active containerd)" systemctl -q is-active containerd

for image in "$P"/images/*.tar; do
    ctr -n k8s.io images import "$image" >/dev/null 2>&1 || echo "$M log import of $image failed"
done
check images_imported "$(ctr -n k8s.io images ls -q | grep -c localhost/swiftlet/) local images" \
    sh -c 'test "$(ctr -n k8s.io images ls -q | grep -c localhost/swiftlet/)" -ge 2'

# The package: installs, and holds exactly its three files.
check dpkg_install "$(dpkg -i "$P"/swiftlet.deb 2>&1 | tail -1)" dpkg -s swiftlet
files=$(dpkg -L swiftlet | while read -r f; do test -d "$f" || echo "$f"; done | sort | tr '\n' ' ')
check package_files "$files" \
    test "$files" = "/etc/swiftlet/config.yaml /lib/systemd/system/swiftlet.service /usr/bin/swiftlet "
check conffile "$(dpkg-query -W -f='${Conffiles}' swiftlet | tr -s ' \n' ' ')" \
    sh -c "dpkg-query -W -f='\${Conffiles}' swiftlet | grep -q /etc/swiftlet/config.yaml"

manifests=$(sed -n 's/^staticPodPath: *//p' /etc/swiftlet/config.yaml)
mkdir -p "$manifests"
cp "$P"/examples/*.yaml "$manifests"/
pods=$(ls "$P"/examples/*.yaml | wc -l)

started=$(uptime_s)
# With Type=notify this returns once the agent said READY=1 (or the start timed out).
enable=$(timeout 400 systemctl enable --now swiftlet 2>&1)
ready=$?
fact start_seconds "$(awk -v a="$started" -v b="$(uptime_s)" 'BEGIN { printf "%.1f", b - a }')"
check enable_now "exit=$ready $(echo "$enable" | tail -1)" test "$ready" = 0
check unit_ready "$(systemctl show -p ActiveState,SubState,StatusText,NRestarts,WatchdogUSec swiftlet | tr '\n' ' ')" \
    sh -c 'test "$(systemctl show -P ActiveState swiftlet)" = active &&
           test "$(systemctl show -P SubState swiftlet)" = running &&
           test "$(systemctl show -P StatusText swiftlet)" = running'
check unit_enabled "$(systemctl is-enabled swiftlet)" systemctl -q is-enabled swiftlet

# The example pods, through the agent's own read-only port.
running=0
i=0
while [ $i -lt 240 ]; do
    running=$(curl -sf http://127.0.0.1:10255/pods | jq '[.items[] | select(.status.phase == "Running")] | length' 2>/dev/null)
    [ "${running:-0}" -ge "$pods" ] && break
    sleep 1
    i=$((i + 1))
done
check pods_running "$running of $pods running: $(curl -sf http://127.0.0.1:10255/pods | jq -c '[.items[] | {name: .metadata.name, phase: .status.phase}]' 2>/dev/null)" \
    test "${running:-0}" -ge "$pods"
check healthz "$(curl -s http://127.0.0.1:10248/healthz | tr '\n' ' ')" \
    sh -c 'curl -sf http://127.0.0.1:10248/healthz >/dev/null'

# The watchdog: its timestamp moves on across more than WatchdogSec, with no restart.
usec=$(prop WatchdogUSec)
fact watchdog_usec "$usec"
first=$(prop WatchdogTimestampMonotonic)
secs=$(echo "$usec" | sed -n 's/^\([0-9][0-9]*\)s$/\1/p')
wait_s=$(( ${secs:-30} + 5 ))
sleep "$wait_s"
second=$(prop WatchdogTimestampMonotonic)
check watchdog_kept "WatchdogTimestampMonotonic $first -> $second over ${wait_s}s, NRestarts=$(prop NRestarts), $(prop ActiveState)" \
    sh -c "test '$first' -gt 0 && test '$second' -gt '$first' && test \"\$(systemctl show -P NRestarts swiftlet)\" = 0 && systemctl -q is-active swiftlet"

pid=$(prop MainPID)
check oom_score_adj "$(cat /proc/"$pid"/oom_score_adj)" test "$(cat /proc/"$pid"/oom_score_adj)" = -999
check agent_cgroup "$(cat /proc/"$pid"/cgroup)" test "$(cat /proc/"$pid"/cgroup)" = "0::/system.slice/swiftlet.service"
procs=$(tr '\n' ' ' < /sys/fs/cgroup/system.slice/swiftlet.service/cgroup.procs)
check only_the_agent_in_its_cgroup "$procs" test "$procs" = "$pid "
containers=$(ctr -n k8s.io tasks ls 2>/dev/null | grep -c RUNNING)
fact pod_cgroups "$(find /sys/fs/cgroup -maxdepth 3 -name 'kubepods*' | tr '\n' ,)"
fact shim_cgroup "$(for s in $(pgrep -f containerd-shim); do cat /proc/$s/cgroup; done | sort -u | tr '\n' ,)"

# Stopping only swiftlet leaves the pods running (the kill mode).
systemctl stop swiftlet
after=$(ctr -n k8s.io tasks ls 2>/dev/null | grep -c RUNNING)
check stop_leaves_pods "running tasks $containers before, $after after stopping swiftlet" \
    sh -c "test '$containers' -ge '$pods' && test '$after' = '$containers'"

if [ "$failed" -gt 0 ]; then
    journalctl -u swiftlet --no-pager -o cat | tail -60 | sed "s/^/$M log /"
fi
# The power-off that follows must not wait for the pods' processes (busybox as PID 1 ignores
# SIGTERM: systemd would give them its 90 s stop timeout).
systemctl kill --signal=SIGKILL kubepods.slice 2>/dev/null
echo "$M done $failed"
