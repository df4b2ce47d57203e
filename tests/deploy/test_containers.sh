#!/usr/bin/env bash
# deploy/container: builds both images with buildah from a Debian bookworm base made here with
# debootstrap (nothing can be pulled from a registry), then starts each image's root filesystem
# with its own user, libraries, configuration and volume paths: the agent serves on the socket
# volume, agentctl on the host reaches it, and the worker (uid 901 with the floor group) registers
# with it.
#
# Opt-in (WF_TEST_CONTAINERS=1; about 90 s: debootstrap 30 s, each build about 20 s with a near
# Debian mirror): it needs root, the network to the Debian mirror, and writes to the host's
# container storage. Skips (77) otherwise, or when buildah or debootstrap is missing.
#
# Why not `podman run`: on this machine crun fails with "setrlimit `RLIMIT_NPROC`: Operation not
# permitted: OCI permission denied" (the sandbox lacks CAP_SYS_RESOURCE), and `buildah run`'s
# chroot isolation mounts its /run tmpfs and our volumes in no fixed order (the socket volume is
# hidden in some runs). So the images are started by hand: their rootfs (buildah mount) in a
# private mount namespace with the volumes bound in, and chroot --userspec as the image's USER.
. "${WF_SOURCE_DIR:?}/tests/install/lib.sh"
if [ "${WF_TEST_CONTAINERS:-0}" != 1 ]; then
	echo "SKIP: set WF_TEST_CONTAINERS=1 to build and start the images (about 90 s, network)"
	exit 77
fi
for t in buildah debootstrap unshare chroot tar; do
	command -v $t >/dev/null || { echo "SKIP: $t not installed"; exit 77; }
done
[ "$(id -u)" = 0 ] || { echo "SKIP: needs root"; exit 77; }
AGENTCTL=$WF_BUILD_DIR/control/agentctl/agentctl
tmp=$(mktemp -d /dev/shm/wf-ctr.XXXXXX 2>/dev/null || mktemp -d)
chmod 0755 "$tmp"
tag=wf-test-$$
ctrs=()
pids=()
cleanup() {
	for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
	for p in "${pids[@]}"; do wait "$p" 2>/dev/null; done
	for c in "${ctrs[@]}"; do buildah umount "$c" >/dev/null 2>&1; buildah rm "$c" >/dev/null 2>&1; done
	buildah rmi -f "localhost/$tag-agent" "localhost/$tag-worker" "localhost/$tag-base" >/dev/null 2>&1
	rm -rf "$tmp"
}
trap cleanup EXIT
set -o pipefail

t0=$SECONDS
debootstrap --variant=minbase bookworm "$tmp/rootfs" http://deb.debian.org/debian >"$tmp/deboot.log" 2>&1 ||
	{ tail -20 "$tmp/deboot.log" >&2; echo "FAIL: debootstrap"; exit 1; }
# The base image: the rootfs in a scratch container, committed.
if ! { c=$(buildah from scratch) && ctrs+=("$c") && m=$(buildah mount "$c") &&
	tar -C "$tmp/rootfs" -c . | tar -C "$m" -x && buildah umount "$c" >/dev/null &&
	buildah commit -q "$c" "localhost/$tag-base" >/dev/null; } 2>"$tmp/base.log"; then
	cat "$tmp/base.log" >&2
	echo "FAIL: base image"
	exit 1
fi
rm -rf "$tmp/rootfs"
echo "base image: $((SECONDS - t0)) s"
for img in agent worker; do
	t1=$SECONDS
	if ! buildah bud --isolation=chroot --layers=false --build-arg "BASE=localhost/$tag-base" \
		-f "$WF_SOURCE_DIR/deploy/container/Containerfile.$img" -t "localhost/$tag-$img" \
		"$WF_SOURCE_DIR" >"$tmp/build-$img.log" 2>&1; then
		tail -30 "$tmp/build-$img.log" >&2
		echo "FAIL: building Containerfile.$img"
		exit 1
	fi
	echo "built $img in $((SECONDS - t1)) s"
done

# The image's USER, as the runtime would take it.
user_of() { buildah inspect --format '{{.OCIv1.Config.User}}' "localhost/$tag-$1"; }
check "agent image runs as 900:900" test "$(user_of agent)" = 900:900
check "worker image runs as wf-worker" test "$(user_of worker)" = wf-worker
vols=$(buildah inspect --format '{{range $k, $v := .OCIv1.Config.Volumes}}{{$k}} {{end}}' "localhost/$tag-agent")
check "agent volumes /floor and /run/weightfloor ($vols)" test "$vols" = "/floor /run/weightfloor "

# The volumes, as a node (or a Kubernetes init container) prepares them.
install -d -o 900 -g 900 -m 0750 "$tmp/floor"
install -d -o 900 -g 900 -m 1770 "$tmp/run"
# start IMAGE USERSPEC GROUPS LOG COMMAND...: the image's rootfs with the volumes bound in, in a
# mount namespace of its own, run as USERSPEC with the supplementary GROUPS ("" for none).
start() {
	local img=$1 spec=$2 groups=$3 log=$4
	shift 4
	local c root
	c=$(buildah from "localhost/$tag-$img") && root=$(buildah mount "$c") || return 1
	ctrs+=("$c")
	unshare -m sh -c 'r=$1 u=$2 g=$3; shift 3; mount --make-rprivate / &&
		mount --bind "$T/floor" "$r/floor" && mount --bind "$T/run" "$r/run/weightfloor" &&
		mount -t proc proc "$r/proc" &&
		exec chroot --userspec="$u" ${g:+--groups="$g"} "$r" "$@"' sh "$root" "$spec" "$groups" "$@" \
		>"$log" 2>&1 &
	pids+=($!)
}
export T=$tmp
start agent 900:900 "" "$tmp/agent.log" /usr/bin/wf-agent --config /etc/weightfloor/agent.json
wait_for 20 test -S "$tmp/run/agent.sock" || { cat "$tmp/agent.log" >&2; }
check "the agent image serves on the socket volume" "$AGENTCTL" --socket "ipc://$tmp/run/agent.sock" \
	--events "ipc://$tmp/run/events.sock" status
# USERSPEC wf-worker:wf-worker with the floor group, as podman gives a named USER.
start worker wf-worker:wf-worker weightfloor "$tmp/worker.log" /usr/bin/wf-worker \
	--agent ipc:///run/weightfloor/agent.sock --floor-dir /floor --allow-uid 900 \
	--device host:mem=256Mi --id ctr0
registered() {
	"$AGENTCTL" --socket "ipc://$tmp/run/agent.sock" --events "ipc://$tmp/run/events.sock" workers |
		grep -q ctr0
}
wait_for 20 registered
check "the worker image registers with the agent" registered
if [ "$fails" != 0 ]; then
	echo "--- agent log" >&2; cat "$tmp/agent.log" >&2
	echo "--- worker log" >&2; cat "$tmp/worker.log" >&2
fi
echo "total $((SECONDS - t0)) s"
finish
