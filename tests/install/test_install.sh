#!/usr/bin/env bash
# cmake --install of the build tree into a temp prefix: the binaries, man pages, completions and
# the example configuration land where GNUInstallDirs puts them; the installed binaries run; man
# finds the pages through MANPATH; the example configuration passes wf-agent --check-config.
. "$(dirname "$0")/lib.sh"
: "${CMAKE_COMMAND:=cmake}"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
P=$tmp/prefix
if ! "$CMAKE_COMMAND" --install "$WF_BUILD_DIR" --prefix "$P" >"$tmp/install.log" 2>&1; then
	cat "$tmp/install.log" >&2
	echo "FAIL: cmake --install" >&2
	exit 1
fi
for b in wf-agent wf-worker agentctl wf-gen wf-bench; do
	check "bin/$b is executable" test -x "$P/bin/$b"
	check "bin/$b --help exits 0" bash -c "'$P/bin/$b' --help >/dev/null"
done
check "bin/agentctl --help prints the usage" bash -c "'$P/bin/agentctl' --help | grep -q '^usage: agentctl'"
check "bash completion" test -s "$P/share/bash-completion/completions/agentctl"
check "zsh completion" test -s "$P/share/zsh/vendor-completions/_agentctl"
check "example configuration" test -s "$P/share/doc/weightfloor/agent.json.example"
check "configuration in etc/weightfloor" cmp -s "$P/etc/weightfloor/agent.json" "$WF_SOURCE_DIR/docs/agent.json.example"
for u in wf-agent.service wf-worker@.service dev-shm-weightfloor.mount; do
	check "lib/systemd/system/$u" test -s "$P/lib/systemd/system/$u"
done
check "lib/sysusers.d/weightfloor.conf" cmp -s "$P/lib/sysusers.d/weightfloor.conf" "$WF_SOURCE_DIR/deploy/systemd/weightfloor.sysusers"
check "lib/tmpfiles.d/weightfloor.conf" cmp -s "$P/lib/tmpfiles.d/weightfloor.conf" "$WF_SOURCE_DIR/deploy/systemd/weightfloor.tmpfiles"
check "wf-agent.service starts P's wf-agent with P's configuration" \
	grep -qx "ExecStart=$P/bin/wf-agent --config $P/etc/weightfloor/agent.json" "$P/lib/systemd/system/wf-agent.service"
check "wf-worker@.service starts P's wf-worker" grep -q "^ExecStart=$P/bin/wf-worker --device cuda:%i " "$P/lib/systemd/system/wf-worker@.service"
# DESTDIR and the prefix /usr: the Debian layout, configuration in /etc.
D=$tmp/destdir
if DESTDIR=$D "$CMAKE_COMMAND" --install "$WF_BUILD_DIR" --prefix /usr >"$tmp/install-d.log" 2>&1; then
	check "DESTDIR: /usr/bin/wf-agent" test -x "$D/usr/bin/wf-agent"
	check "DESTDIR: /etc/weightfloor/agent.json (the prefix /usr keeps its configuration in /etc)" \
		test -s "$D/etc/weightfloor/agent.json"
	check "DESTDIR: /usr/lib/systemd/system/wf-agent.service names /usr/bin and /etc" \
		grep -qx "ExecStart=/usr/bin/wf-agent --config /etc/weightfloor/agent.json" "$D/usr/lib/systemd/system/wf-agent.service"
	check "DESTDIR: nothing outside usr/ and etc/" test "$(ls "$D" | tr '\n' ' ')" = "etc usr "
else
	cat "$tmp/install-d.log" >&2
	fail "DESTDIR=... cmake --install --prefix /usr"
fi
check "installed bash completion loads" bash -c ". '$P/share/bash-completion/completions/agentctl' &&
	complete -p agentctl | grep -q _agentctl"

if [ "${WF_MAN_PAGES:-ON}" != OFF ]; then
	check "man1/agentctl.1" test -s "$P/share/man/man1/agentctl.1"
	check "man8/wf-agent.8" test -s "$P/share/man/man8/wf-agent.8"
	check "man8/wf-worker.8" test -s "$P/share/man/man8/wf-worker.8"
	if command -v man >/dev/null; then
		for p in agentctl:1 wf-agent:8 wf-worker:8; do
			n=${p%:*} s=${p#*:}
			found=$(MANPATH=$P/share/man man -w "$n" 2>&1)
			check "MANPATH=P/share/man man -w $n finds P's page (got $found)" \
				test "$found" = "$P/share/man/man$s/$n.$s"
			check "man $n renders" bash -c "MANPATH='$P/share/man' MANWIDTH=100 man -P cat '$n' 2>/dev/null |
				grep -q '^NAME'"
			check "man -l renders the installed $n.$s" bash -c "MANWIDTH=100 man -P cat -l '$P/share/man/man$s/$n.$s' 2>/dev/null |
				grep -q '^NAME'"
		done
	else
		echo "man not installed: man -w not checked"
	fi
fi

# The example configuration is valid as shipped, but for its group, which this host may lack.
sed "s/\"group\": \"weightfloor\"/\"group\": \"$(id -gn)\"/" "$P/share/doc/weightfloor/agent.json.example" \
	>"$tmp/agent.json"
check "example configuration passes --check-config" "$P/bin/wf-agent" -c "$tmp/agent.json" --check-config \
	--floor-dir "$tmp/floors" --socket "ipc://$tmp/a.sock" --events "ipc://$tmp/e.sock" --state-file none
check "wf-bench --version from the prefix" test "$("$P/bin/wf-bench" --version)" = "wf-bench $WF_VERSION"
finish
