#!/bin/bash
# wf-docgen --check fails (exit 1) when a committed doc differs from what the sources give: an
# edited row of the error table, a field added to the .proto, a changed .proto comment; exit 2
# when the markers are gone. Runs on a copy of the docs and the .proto files.
set -u
gen="$WF_BUILD_DIR/tools/wf-docgen"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
fresh() {
	rm -rf "$tmp/src"
	mkdir -p "$tmp/src/docs" "$tmp/src/proto"
	cp "$WF_SOURCE_DIR/docs/ERRORS.md" "$WF_SOURCE_DIR/docs/PROTOCOL.md" "$tmp/src/docs/"
	cp "$WF_SOURCE_DIR"/proto/*.proto "$tmp/src/proto/"
}
check() { "$gen" --check "$tmp/src" 2>"$tmp/err"; echo $?; }

fresh
[ "$(check)" = 0 ] || fail "the committed docs are not what wf-docgen gives: $(cat "$tmp/err")"

sed -i 's/| `WF_ETIMEOUT` | -4075 | operation timed out |/| `WF_ETIMEOUT` | -4075 | timed out |/' "$tmp/src/docs/ERRORS.md"
[ "$(check)" = 1 ] || fail "an edited error row went unnoticed"
grep -q "ERRORS.md differs" "$tmp/err" || fail "the message does not name ERRORS.md: $(cat "$tmp/err")"

fresh
sed -i 's/^  uint32 deadline_ms = 4;/  uint32 deadline_ms = 4;\n  uint64 trace_id = 5; \/\/ a new field/' "$tmp/src/proto/weightfloor.proto"
grep -q trace_id "$tmp/src/proto/weightfloor.proto" || fail "the test's edit of the .proto did not apply"
[ "$(check)" = 1 ] || fail "a field added to the .proto went unnoticed"
grep -q "PROTOCOL.md differs" "$tmp/err" || fail "the message does not name PROTOCOL.md: $(cat "$tmp/err")"
# Regenerating makes the copy consistent again, with the new field documented.
"$gen" "$tmp/src" >/dev/null || fail "regenerating failed"
[ "$(check)" = 0 ] || fail "still different after regenerating: $(cat "$tmp/err")"
grep -q '| `trace_id` | 5 | `uint64` | a new field |' "$tmp/src/docs/PROTOCOL.md" || fail "the new field is not in the reference"
cmp -s "$WF_SOURCE_DIR/docs/ERRORS.md" "$tmp/src/docs/ERRORS.md" || fail "regenerating changed ERRORS.md"

fresh
sed -i 's|// no such model / worker / tensor|// no such model, worker or tensor|' "$tmp/src/proto/weightfloor.proto"
[ "$(check)" = 1 ] || fail "a changed .proto comment went unnoticed"

fresh
sed -i '/BEGIN GENERATED message reference/d' "$tmp/src/docs/PROTOCOL.md"
[ "$(check)" = 2 ] || fail "a missing marker is not an error"
echo PASS
