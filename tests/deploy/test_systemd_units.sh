#!/usr/bin/env bash
# deploy/systemd with systemd's own tools, on the units as `cmake --install` lays them out:
#  - systemd-analyze verify passes with no warning at all (unknown keys, bad values, an ExecStart
#    that is not executable, a mount unit whose name does not match Where=);
#  - systemd-sysusers and systemd-tmpfiles, in a scratch root, make the users, groups and
#    directories the units rely on (wf-agent and wf-worker in the floor group, 0750 directories);
#  - systemd-analyze security (offline) rates both services at most WF_MAX_EXPOSURE (default 2.0;
#    the docs record 1.7 for both), so a lost sandboxing line fails here.
# Skips (77) only when systemd-analyze is absent (Debian package systemd, scripts/setup.sh).
. "${WF_SOURCE_DIR:?}/tests/install/lib.sh"
: "${CMAKE_COMMAND:=cmake}" "${WF_MAX_EXPOSURE:=2.0}"
if ! command -v systemd-analyze >/dev/null; then
	echo "SKIP: systemd-analyze not installed (Debian package systemd)"
	exit 77
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
P=$tmp/prefix
if ! "$CMAKE_COMMAND" --install "$WF_BUILD_DIR" --prefix "$P" >"$tmp/install.log" 2>&1; then
	cat "$tmp/install.log" >&2
	echo "FAIL: cmake --install" >&2
	exit 1
fi
U=$P/lib/systemd/system
for f in wf-agent.service wf-worker@.service dev-shm-weightfloor.mount; do
	check "$f installed" test -s "$U/$f"
done
check "units start the installed binaries" grep -q "^ExecStart=$P/bin/wf-agent --config $P/etc/weightfloor/agent.json\$" "$U/wf-agent.service"
check "installed configuration" test -s "$P/etc/weightfloor/agent.json"
# A worker whose GPU hit a sticky error exits with status 3 (wf-worker(8), DEVICE LOST): only a
# restart recovers it.
check "wf-worker@.service restarts a worker that exits non-zero" \
	grep -qx "Restart=on-failure" "$U/wf-worker@.service"

# A template is verified through an instance; verify reads units by path, the rest from the host.
V=$tmp/verify
mkdir -p "$V"
cp "$U/wf-agent.service" "$U/dev-shm-weightfloor.mount" "$V/"
cp "$U/wf-worker@.service" "$V/wf-worker@0.service"
( cd "$V" && systemd-analyze verify --man=no ./wf-agent.service ./wf-worker@0.service \
	./dev-shm-weightfloor.mount ) >"$tmp/verify.out" 2>&1
rc=$?
check "systemd-analyze verify exits 0 (rc $rc)" test "$rc" = 0
check "systemd-analyze verify prints nothing" test ! -s "$tmp/verify.out"
[ -s "$tmp/verify.out" ] && cat "$tmp/verify.out" >&2

R=$tmp/root
mkdir -p "$R/etc"
if command -v systemd-sysusers >/dev/null; then
	systemd-sysusers --root="$R" "$P/lib/sysusers.d/weightfloor.conf" >"$tmp/sysusers.out" 2>&1 ||
		fail "systemd-sysusers: $(cat "$tmp/sysusers.out")"
	gid=$(awk -F: '$1 == "weightfloor" { print $3 }' "$R/etc/group")
	check "group weightfloor created" test -n "$gid"
	for u in wf-agent wf-worker; do
		check "user $u has the floor group as its primary group" \
			test "$(awk -F: -v u="$u" '$1 == u { print $4 }' "$R/etc/passwd")" = "$gid"
		check "user $u cannot log in" grep -q "^$u:.*:/usr/sbin/nologin\$" "$R/etc/passwd"
	done
	for g in video render; do
		check "wf-worker is in group $g (GPU device nodes)" grep -q "^$g:x:[0-9]*:wf-worker\$" "$R/etc/group"
	done
else
	echo "systemd-sysusers not installed: users not checked"
fi
if command -v systemd-tmpfiles >/dev/null; then
	systemd-tmpfiles --root="$R" --create "$P/lib/tmpfiles.d/weightfloor.conf" >"$tmp/tmpfiles.out" 2>&1 ||
		fail "systemd-tmpfiles: $(cat "$tmp/tmpfiles.out")"
	for d in dev/shm/weightfloor var/lib/weightfloor; do
		check "/$d is a 0750 directory" test "$(stat -c %a "$R/$d" 2>/dev/null)" = 750
	done
fi

for unit in wf-agent.service wf-worker@0.service; do
	out=$( cd "$V" && systemd-analyze security --offline=yes --man=no "./$unit" 2>&1 )
	level=$(printf '%s\n' "$out" | sed -n 's/.*Overall exposure level for [^:]*: \([0-9.]*\).*/\1/p')
	check "systemd-analyze security rates $unit ($level) at most $WF_MAX_EXPOSURE" \
		awk -v l="$level" -v m="$WF_MAX_EXPOSURE" 'BEGIN { exit !(l != "" && l + 0 <= m + 0) }'
done
finish
