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
