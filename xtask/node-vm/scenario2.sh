#!/bin/sh
# Scenario 2 of the node VM (issue 19), with issue 18's runtime handlers: the host suite's
# system tests (`xtask/src/node_suite.rs` picked them and put their executables under
# /payload/suite) against this node's containerd service, on pure cgroup v2 with systemd as
# PID 1, under `cgroupDriver: systemd` and then `cgroupfs`. containerd's runc follows the
# driver (`SystemdCgroup`), and crun gets a state folder of its own (the runtime-handler test
# tells the runtimes' containers apart by it); the node's configuration is put back at the end.
# One check per test and driver: `swiftlet-node-vm: check <driver>:<test> ok|FAILED <detail>`.
. "$(dirname "$0")/lib.sh"
P=/payload
S=$P/suite
# Each test is bounded on its own, well below the run's deadline.
TEST_TIMEOUT=480
# The tests' waits for a state are bounds, not measurements (`swiftlet_tests::event_wait`):
# under TCG a pod's sandbox alone took 17 s (0.3 s on the host), and the eviction test's hog
# (busybox sh filling a 450 MiB variable: 9 s on a busy host) did not reach the threshold
# within 4 times the host bound, so each bound is 8 times its host value.
WAIT_SCALE=8

timeout 600 systemctl is-system-running --wait >/dev/null
# Scenario 1 leaves the agent stopped; alone, this scenario finds it not installed. Either way
# no other agent may manage the runtime's pods while the tests' agents do.
systemctl stop swiftlet 2>/dev/null
check agent_not_running "$(systemctl is-active swiftlet 2>&1)" \
    sh -c '! systemctl -q is-active swiftlet'
# Scenario 1 imports the images; this scenario alone imports them itself.
ensure_images
fact memory_total_kib "$(sed -n 's/^MemTotal: *\([0-9]*\).*/\1/p' /proc/meminfo)"
fact cpus "$(nproc)"

cp "$CONFIG" "$ORIGINAL"

# One test of the selection: its verdict from libtest's own summary (exactly one test ran and
# passed), the failure's message as the detail, the output's end as log lines.
run_test() {
    driver=$1
    file=$2
    test=$3
    out=/tmp/suite-$driver-$test.log
    started=$(uptime_s)
    (cd /tmp && env CI=true RUST_BACKTRACE=1 SWIFTLET_TEST_WAIT_SCALE="$WAIT_SCALE" \
        SWIFTLET_TEST_CGROUP_DRIVER="$driver" \
        SWIFTLET_TEST_RUNTIME_ENDPOINT=unix:///run/containerd/containerd.sock \
        SWIFTLET_TEST_CONTAINERD_STATE=/run/containerd \
        SWIFTLET_BIN="$S/swiftlet" \
        SWIFTLET_TEST_APISERVER_BIN="$S/swiftlet-test-apiserver" \
        timeout "$TEST_TIMEOUT" "$S/deps/$file" --exact "$test" --test-threads 1) </dev/null >"$out" 2>&1
    rc=$?
    seconds=$(since "$started")
    if grep -q '^test result: ok\. 1 passed' "$out"; then
        echo "$M check $driver:$test ok ${seconds}s"
    else
        why=$(sed -n '/panicked at/{n;p;q}' "$out" | cut -c1-300)
        [ "$rc" = 124 ] && why="timed out after ${TEST_TIMEOUT}s; $why"
        echo "$M check $driver:$test FAILED exit=$rc ${seconds}s: ${why:-$(tail -1 "$out")}"
        failed=$((failed + 1))
        # The panic, the agent's warnings and errors, and the end (the whole output would
        # flood the console: the pods' statuses are printed in full).
        {
            grep -A3 'panicked at' "$out" | head -12
            grep -E ' (WARN|ERROR) ' "$out" | grep -v 'ClusterDNS' | tail -40
            tail -25 "$out"
        } | cut -c1-400 | sed "s/^/$M log [$driver:$test] /"
    fi
}

for driver in systemd cgroupfs; do
    if [ "$driver" = systemd ]; then flag=true; else flag=false; fi
    containerd_for "$flag"
    ready=$?
    dump=$(containerd config dump 2>/dev/null)
    if [ "$flag" = true ]; then other=false; else other=true; fi
    with=$(echo "$dump" | grep -c "SystemdCgroup = $flag")
    without=$(echo "$dump" | grep -c "SystemdCgroup = $other")
    # containerd 1.7 dumps TOML strings in double quotes, 2.x in single ones.
    crun_root=$(echo "$dump" | grep -cE "Root = [\"']/run/containerd/crun[\"']")
    check "containerd_$driver" "ready=$ready SystemdCgroup=$flag in $with handlers ($without not), crun's own root $crun_root" \
        test "$ready" = 0 -a "$with" -ge 2 -a "$without" = 0 -a "$crun_root" = 1
    driver_started=$(uptime_s)
    while read -r d file test; do
        [ "$d" = "$driver" ] && run_test "$driver" "$file" "$test"
    done <"$S/selection"
    fact "${driver}_seconds" "$(since "$driver_started")"
    # A test's pods are its agent's to remove; what it left in the pods' cgroups is a finding.
    fact "${driver}_leftover_pod_cgroups" "$(find /sys/fs/cgroup -mindepth 2 -maxdepth 4 -type d \( -name '*pod*' \) 2>/dev/null | grep -c kubepods)"
done

cp "$ORIGINAL" "$CONFIG"
systemctl restart containerd
check containerd_restored "$(systemctl is-active containerd)" \
    sh -c 'systemctl -q is-active containerd && cmp -s "$0" "$1"' "$ORIGINAL" "$CONFIG"
fact suite_seconds "$(since "$scenario_started")"
systemctl kill --signal=SIGKILL kubepods.slice 2>/dev/null
echo "$M done $failed"
