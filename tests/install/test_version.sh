#!/usr/bin/env bash
# Every binary answers --version with "NAME VERSION" (the CMake project version) on stdout, exit 0.
. "$(dirname "$0")/lib.sh"
B=$WF_BUILD_DIR
for bin in agent/wf-agent worker/wf-worker tools/wf-gen bench/wf-bench control/agentctl/agentctl; do
	name=${bin##*/}
	out=$("$B/$bin" --version 2>/dev/null)
	rc=$?
	check "$name --version exits 0 (got $rc)" test "$rc" -eq 0
	check "$name --version prints '$name $WF_VERSION' (got '$out')" test "$out" = "$name $WF_VERSION"
done
finish
