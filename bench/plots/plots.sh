#!/usr/bin/env bash
# Regenerates the PNGs of docs/BENCHMARKS.md from the recorded `wf-bench MODE --json` lines.
#   bench/plots/plots.sh [-d DATADIR] [-o OUTDIR]
# DATADIR (default docs/plots/data) holds NAME.jsonl, the run's output as printed, and NAME.meta,
# what the title needs (key=value lines: command, commit, date, machine). NAME is the mode,
# optionally followed by -VARIANT (cachepolicy-qwen3moe-tiny-q8_0). Each gives OUTDIR/NAME.png
# (default docs/plots): cachepolicy runs as hit rate per policy and cache size, every other mode
# as value / anchor per row with its goal, and value beside anchor. Needs bash, awk and gnuplot
# (scripts/setup.sh installs gnuplot-nox). Exit 0 when every PNG was written, 1 otherwise.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
data="$root/docs/plots/data"
out="$root/docs/plots"
while getopts d:o: opt; do
	case $opt in
	d) data=$OPTARG ;;
	o) out=$OPTARG ;;
	*) echo "usage: $0 [-d DATADIR] [-o OUTDIR]" >&2; exit 2 ;;
	esac
done

command -v gnuplot >/dev/null || { echo "plots: gnuplot not found (scripts/setup.sh installs gnuplot-nox)" >&2; exit 1; }
mkdir -p "$out"
tmp=$(mktemp -d "${TMPDIR:-/tmp}/wf-plots.XXXXXX")
trap 'rm -rf "$tmp"' EXIT

# A gnuplot string literal: double-quoted, with \ and " escaped and newlines as \n.
gpstr() { local s=${1//\\/\\\\}; s=${s//\"/\\\"}; printf '"%s"' "${s//$'\n'/\\n}"; }
meta() { sed -n "s/^$1=//p" "$2" | head -n 1; }

# One PNG from NAME.jsonl; returns non-zero (with a message) when it cannot.
plot_one() {
	local jsonl=$1 name mode m cmd commit date machine ttl rows n skipped width png
	name=$(basename "$jsonl" .jsonl)
	mode=${name%%-*}
	m="$data/$name.meta"
	[ -f "$m" ] || { echo "plots: $name: no $m (command, commit, date, machine)" >&2; return 1; }
	cmd=$(meta command "$m"); commit=$(meta commit "$m"); date=$(meta date "$m"); machine=$(meta machine "$m")
	if [ -z "$cmd" ] || [ -z "$commit" ] || [ -z "$date" ] || [ -z "$machine" ]; then
		echo "plots: $name: $m lacks command, commit, date or machine" >&2
		return 1
	fi
	rows="$tmp/$name.tsv"
	awk -f "$here/rows.awk" "$jsonl" >"$rows" || { echo "plots: $name: cannot read $jsonl" >&2; return 1; }
	png="$out/$name.png"
	rm -f "$png"
	ttl="wf-bench $mode at $commit, $date"$'\n'"$machine"$'\n'"$cmd"
	{
		echo "out = $(gpstr "$png")"
		echo "ttl = $(gpstr "$ttl")"
	} >"$tmp/$name.gp"
	if [ "$mode" = cachepolicy ]; then
		plot_policy "$name" "$rows" >>"$tmp/$name.gp" || return 1
		cat "$here/cachepolicy.gp" >>"$tmp/$name.gp"
	else
		n=$(grep -vc '^#' "$rows" || true)
		width=$(( n * 80 + 300 )); [ "$width" -ge 900 ] || width=900
		# The skipped rows, their reasons once each, wrapped to the image's width.
		skipped=$(awk -F'\t' -v w=$(( width / 7 )) '
			$1 == "#skipped" { k++; m = m (m == "" ? "" : ", ") $2; if (!($3 in seen)) { seen[$3] = 1; r = r (r == "" ? "" : "; ") $3 } }
			END {
				if (!k) exit
				s = "skipped (" k "): " m " - " r
				while (length(s) > w) { i = w; while (i > 1 && substr(s, i, 1) != " ") i--; if (i == 1) i = w
					out = out substr(s, 1, i - 1) "\n"; s = substr(s, i + 1) }
				printf "%s%s", out, s
			}' "$rows")
		{
			echo "rows = $(gpstr "$rows")"
			echo "n = $n"
			echo "width = $width"
			echo "maxlab = $(awk -F'\t' '!/^#/ { l = length($1) + length($2) + 3; if (l > m) m = l } END { print m + 0 }' "$rows")"
			echo "skipped = $(gpstr "$skipped")"
			echo "skipped_lines = $(printf '%s' "$skipped" | grep -c '' || true)"
		} >>"$tmp/$name.gp"
		cat "$here/anchors.gp" >>"$tmp/$name.gp"
	fi
	gnuplot "$tmp/$name.gp" 2>"$tmp/$name.err" || { echo "plots: $name: gnuplot failed:" >&2; cat "$tmp/$name.err" >&2; return 1; }
	[ -s "$png" ] || { echo "plots: $name: gnuplot wrote no $png" >&2; cat "$tmp/$name.err" >&2; return 1; }
	echo "plots: $png"
}

# cachepolicy: the hit_rate_<policy>_c<P> rows as a table (a line per P, a column per policy in
# the order the run printed them, Belady last), and the engine check line for the caption.
plot_policy() {
	local name=$1 rows=$2 table="$tmp/$1.table" check ncol
	awk -F'\t' '
		$1 ~ /^hit_rate_.*_c[0-9]+$/ {
			p = $1; sub(/^hit_rate_/, "", p); c = p; sub(/_c[0-9]+$/, "", p); sub(/.*_c/, "", c)
			if (!(p in seenp)) { seenp[p] = 1; if (p != "belady") pol[++np] = p }
			if (!(c in seenc)) { seenc[c] = 1; cs[++nc] = c }
			v[p, c] = $3
		}
		END {
			if (nc == 0) exit 1
			if ("belady" in seenp) pol[++np] = "belady"
			printf "cache"; for (i = 1; i <= np; i++) printf "\t%s", (pol[i] == "belady" ? "belady (anchor)" : pol[i]); printf "\n"
			for (j = 1; j <= nc; j++) {
				printf "%s%%", cs[j]
				for (i = 1; i <= np; i++) printf "\t%s", ((pol[i], cs[j]) in v ? v[pol[i], cs[j]] : "?")
				printf "\n"
			}
		}' "$rows" >"$table" || { echo "plots: $name: no hit_rate_<policy>_c<P> rows" >&2; return 1; }
	ncol=$(head -n 1 "$table" | awk -F'\t' '{ print NF }')
	check=$(awk -F'\t' '
		$1 == "trace_distinct_experts" { t = sprintf("%s; %d of %d experts used", $9, $3, $4) }
		$1 == "policy_sim_vs_engine_hits" { e = sprintf("; engine check: the simulated policy %d hits, the engine %d (ratio %.3f)", $3, $4, $5) }
		END { print t e }' "$rows")
	echo "table = $(gpstr "$table")"
	echo "ncol = $ncol"
	echo "width = $(( ncol * 150 + 300 ))"
	echo "check = $(gpstr "$check")"
}

shopt -s nullglob
files=("$data"/*.jsonl)
[ "${#files[@]}" -gt 0 ] || { echo "plots: no *.jsonl in $data" >&2; exit 1; }
rc=0
for f in "${files[@]}"; do
	plot_one "$f" || rc=1
done
exit $rc
