# Shared by the node VM's scenarios (sourced): the console protocol the host parses
# (`xtask/src/node_vm.rs`) and the looks at the node that several scenarios take.
M="swiftlet-node-vm:"
failed=0
# check NAME DETAIL COMMAND...: one `check` line, ok when COMMAND succeeds.
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
fact() { echo "$M fact $1 $2"; }
uptime_s() { cut -d' ' -f1 /proc/uptime; }
since() { awk -v a="$1" -v b="$(uptime_s)" 'BEGIN { printf "%.1f", b - a }'; }
prop() { systemctl show -P "$1" swiftlet; }
scenario_started=$(uptime_s)
# Polls `$@` every second for up to $1 seconds.
wait_for() {
    limit=$1
    shift
    i=0
    while [ $i -lt "$limit" ]; do
        "$@" && return 0
        sleep 1
        i=$((i + 1))
    done
    return 1
}
# The pods, their names without the node's suffix that static pods get (`sleeper-<node>`).
pods_json() {
    curl -sf --max-time 5 http://127.0.0.1:10255/pods |
        jq --arg suffix "-$(hostname)" '.items[].metadata.name |= rtrimstr($suffix)'
}
# Every pod Running with all its containers ready; at least $1 pods.
all_ready() {
    pods_json | jq -e --argjson n "$1" '[.items[] | select(.status.phase == "Running"
        and (.status.containerStatuses | length) > 0
        and ([.status.containerStatuses[].ready] | all))] | length >= $n' >/dev/null 2>&1
}
# One line per container: pod/container id restartCount.
snapshot() {
    pods_json | jq -r '.items[] | .metadata.name as $p | (.status.containerStatuses // [])[]
        | "\($p)/\(.name) \(.containerID | sub("^containerd://"; "")) \(.restartCount)"' | sort
}
# tasks_match SNAPSHOT EXTRA: each container of SNAPSHOT has exactly one running task, and
# there are EXTRA running tasks beyond them (the sandboxes' pause processes).
tasks_match() {
    tasks=$(ctr -n k8s.io tasks ls 2>/dev/null | awk '$3 == "RUNNING" { print $1 }')
    for id in $(echo "$1" | cut -d' ' -f2); do
        test "$(echo "$tasks" | grep -c "^$id\$")" = 1 || return 1
    done
    test "$(echo "$tasks" | grep -c .)" = $(($(echo "$1" | grep -c .) + $2))
}
brief() { echo "$1" | awk '{ printf "%s %s %s; ", $1, substr($2, 1, 12), $3 }'; }
# The running tasks, ids cut to 12 characters.
dump_tasks() {
    ctr -n k8s.io tasks ls 2>&1 | awk '$3 == "RUNNING" { n++; s = s " " substr($1, 1, 12) } END { print n " running:" s }'
}
# containerd's configuration, and the node's own kept while a scenario changes it.
CONFIG=/etc/containerd/config.toml
ORIGINAL=/run/swiftlet-node-vm-containerd.toml
# containerd (from $ORIGINAL) with runc's SystemdCgroup $1 and crun's own state folder, restarted and serving CRI.
containerd_for() {
    sed -e "s|SystemdCgroup = .*|SystemdCgroup = $1|" \
        -e 's|^\( *\)BinaryName = "/usr/bin/crun"$|&\n\1Root = "/run/containerd/crun"|' \
        "$ORIGINAL" >"$CONFIG"
    systemctl restart containerd
    i=0
    while [ $i -lt 120 ]; do
        ctr plugins ls 2>/dev/null | grep -q 'io.containerd.grpc.v1 *cri .*ok' && return 0
        sleep 1
        i=$((i + 1))
    done
    return 1
}

# The local images in the runtime (scenario 1 imports them; a scenario run alone imports them
# itself), checked.
ensure_images() {
    if ! ctr -n k8s.io images ls -q | grep -q localhost/swiftlet/busybox; then
        for image in /payload/images/*.tar; do
            ctr -n k8s.io images import "$image" >/dev/null 2>&1 || echo "$M log import of $image failed"
        done
    fi
    check images_present "$(ctr -n k8s.io images ls -q | grep -c localhost/swiftlet/) local images" \
        sh -c 'test "$(ctr -n k8s.io images ls -q | grep -c localhost/swiftlet/)" -ge 2'
}
