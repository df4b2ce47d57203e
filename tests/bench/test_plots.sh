#!/bin/bash
# bench/plots/plots.sh on the recorded runs (docs/plots/data) into a temp dir: one non-empty PNG
# per NAME.jsonl, each embedded in docs/BENCHMARKS.md; and it refuses what would misreport a run
# (no .meta to title it, a line that is not a wf-bench row, no measured row) with exit 1.
# gnuplot is installed by scripts/setup.sh, so its absence fails the test rather than skipping.
set -u
src=${WF_SOURCE_DIR:?}
plots="$src/bench/plots/plots.sh"
data="$src/docs/plots/data"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

command -v gnuplot >/dev/null || fail "gnuplot is not installed (scripts/setup.sh installs gnuplot-nox)"

# A PNG: the 8-byte signature, then an IHDR whose width and height are not zero.
is_png() {
	[ "$(head -c 8 "$1" | od -An -tx1 | tr -d ' \n')" = 89504e470d0a1a0a ] || return 1
	local wh
	wh=$(od -An -tx1 -j 16 -N 8 "$1" | tr -d ' \n')
	[ "${wh:0:8}" != 00000000 ] && [ "${wh:8:8}" != 00000000 ]
}

bash "$plots" -d "$data" -o "$tmp/out" >"$tmp/log" 2>&1 || fail "plots.sh failed: $(cat "$tmp/log")"
n=0
for f in "$data"/*.jsonl; do
	name=$(basename "$f" .jsonl)
	png="$tmp/out/$name.png"
	[ -s "$png" ] || fail "no PNG for $name"
	is_png "$png" || fail "$png is not a PNG with a size"
	grep -q "](plots/$name.png)" "$src/docs/BENCHMARKS.md" || fail "docs/BENCHMARKS.md does not embed plots/$name.png"
	[ -s "$src/docs/plots/$name.png" ] || fail "docs/plots/$name.png is not committed"
	n=$((n + 1))
done
[ "$n" -ge 4 ] || fail "only $n recorded runs in $data (floor, residency, engine, cachepolicy)"
for mode in floor residency engine cachepolicy; do
	[ -f "$data/$mode.jsonl" ] || fail "no recorded run of wf-bench $mode"
done
[ "$(find "$tmp/out" -name '*.png' | wc -l)" = "$n" ] || fail "PNGs other than one per run: $(ls "$tmp/out")"

# Refusals: each on a copy of the data with one thing wrong; the other PNGs are still written.
bad() {
	rm -rf "$tmp/d" "$tmp/o"
	cp -r "$data" "$tmp/d"
}
expect_refused() {
	local what=$1 name=$2 msg=$3
	bash "$plots" -d "$tmp/d" -o "$tmp/o" >"$tmp/log" 2>&1 && fail "$what: plots.sh exited 0"
	[ -e "$tmp/o/$name.png" ] && fail "$what: $name.png was written anyway"
	grep -q "$msg" "$tmp/log" || fail "$what: no message '$msg': $(cat "$tmp/log")"
	[ -s "$tmp/o/floor.png" ] || [ "$name" = floor ] || fail "$what: the other plots were not written"
}
bad; rm "$tmp/d/engine.meta"
expect_refused "no .meta" engine "engine: no .*engine.meta"
bad; sed -i '/^commit=/d' "$tmp/d/residency.meta"
expect_refused "no commit in .meta" residency "residency: .*lacks command, commit"
bad; echo 'wf-bench: something went wrong' >>"$tmp/d/floor.jsonl"
expect_refused "a stray line" floor "not a wf-bench row"
bad; grep '"skipped"' "$data/engine.jsonl" >"$tmp/d/engine.jsonl"
[ -s "$tmp/d/engine.jsonl" ] || fail "the recorded engine run has no skipped row to build this case from"
expect_refused "only skipped rows" engine "no measured row"
bad; grep -v '"metric":"hit_rate_' "$data/cachepolicy.jsonl" >"$tmp/d/cachepolicy.jsonl"
expect_refused "cachepolicy without hit rates" cachepolicy "no hit_rate_<policy>_c<P> rows"
echo "PASS: $n plots"
