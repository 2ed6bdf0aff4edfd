# The image used as deploy/kubernetes/shedder.yaml uses it, on a veth between two network
# namespaces (198.18.78.0/24): the container joins the server's namespace (the DaemonSet's
# host network), with only the unit's capabilities, a read-only root, /sys/fs/bpf (rslave:
# HostToContainer) and tracefs from the host, and the configuration mounted at
# /etc/shedder/shedder.toml (the ConfigMap). It must be ready (/readyz), refuse a second
# connection over a limit of 1, and keep refusing after `podman kill` (fail-static), with
# its pins left on the host's bpffs. Run by `cargo xtask dist --check` as root, in a
# private mount namespace where /sys/fs/bpf is shared; $1 is the image.
#
# PODMAN: runc with cgroupfs, and rlimits no higher than the caller's, because on the
# machine this was written on crun refuses hybrid cgroups and root cannot raise rlimits.
set -eu
IMAGE="$1"
step() { printf '\n=== %s\n' "$*"; }
S=shd-img-s-$$ C=shd-img-c-$$ NAME=shedder-image-check-$$
PINS=/sys/fs/bpf/shedder-image-check-$$
DIR=$(mktemp -d)
SERVER=
PODMAN=${PODMAN:-podman --runtime runc --cgroup-manager cgroupfs}
cleanup() {
    set +e
    $PODMAN rm -f "$NAME" >/dev/null 2>&1
    [ -n "$SERVER" ] && kill "$SERVER" && wait "$SERVER"
    ip netns del "$S" 2>/dev/null
    ip netns del "$C" 2>/dev/null
    rm -rf "$PINS" "$DIR"
}
trap cleanup EXIT
ip netns add "$S"
ip netns add "$C"
ip -n "$S" link add img-s type veth peer name img-c netns "$C"
ip -n "$S" addr add 198.18.78.1/24 dev img-s
ip -n "$C" addr add 198.18.78.2/24 dev img-c
for n in "$S" "$C"; do ip -n "$n" link set lo up; done
ip -n "$S" link set img-s up
ip -n "$C" link set img-c up
mkdir "$DIR/run"
cat > "$DIR/shedder.toml" <<TOML
[daemon]
interfaces = ["img-s"]
pin_dir = "$PINS"
detach_on_exit = false
heartbeat_timeout_ms = 1000

[[service]]
name = "web"
ports = [8080]
controller = "fixed"
min_limit = 1
fixed_limit = 1
fallback_limit = 1
action = "drop"
TOML
nsenter --net=/var/run/netns/"$S" python3 -c '
import socket
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("198.18.78.1", 8080))
s.listen(16)
held = []
while True:
    c = s.accept()[0]
    c.recv(1)
    held.append(c)
' &
SERVER=$!
step "the image, run as the DaemonSet runs it"
$PODMAN run -d --name "$NAME" --network ns:/var/run/netns/"$S" \
    --cap-drop all --cap-add BPF,PERFMON,NET_ADMIN,SYS_ADMIN,CHOWN \
    --ulimit nofile=4096:4096 --ulimit nproc=4096:4096 \
    --read-only -v "$DIR/run":/run/shedder \
    -v /sys/fs/bpf:/sys/fs/bpf:rslave -v /sys/kernel/tracing:/sys/kernel/tracing \
    -v "$DIR/shedder.toml":/etc/shedder/shedder.toml:ro \
    "$IMAGE"
ready=
for i in $(seq 1 100); do
    if nsenter --net=/var/run/netns/"$S" curl -sf http://127.0.0.1:9464/readyz >/dev/null; then
        ready=1; break
    fi
    sleep 0.2
done
if [ -z "$ready" ]; then $PODMAN logs "$NAME"; echo "not ready"; exit 1; fi
echo "ready (/readyz)"
export PODMAN NAME
nsenter --net=/var/run/netns/"$C" python3 - <<'PY'
import socket, sys, time, os
first = socket.create_connection(("198.18.78.1", 8080), timeout=3)
first.sendall(b"h")
print("first connection: admitted, a request in flight")
time.sleep(1)
def refused(what):
    try:
        socket.create_connection(("198.18.78.1", 8080), timeout=3)
    except (socket.timeout, ConnectionRefusedError) as e:
        print("%s: refused (%s)" % (what, type(e).__name__))
        return
    print("%s: admitted over a limit of 1" % what)
    sys.exit(1)
refused("second connection")
# The container is killed: the programs stay attached (fail-static, fallback limit 1).
if os.system("%s kill %s >/dev/null && %s wait %s >/dev/null"
             % (os.environ["PODMAN"], os.environ["NAME"], os.environ["PODMAN"], os.environ["NAME"])) != 0:
    print("podman kill failed"); sys.exit(1)
print("container killed")
time.sleep(2)
refused("second connection after the kill")
PY
step "after the kill: the pins are left in place"
ls "$PINS"
test -d "$PINS/links"
step "image checks passed"
