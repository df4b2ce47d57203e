# Turns `wf-bench MODE --json` lines into tab-separated rows for gnuplot, so that the plots need
# no JSON tool beyond awk (mawk or gawk). It relies on what bench/report.c prints: one plain
# json-c object per line whose keys follow `{` or `,` and whose strings escape `"` and `\`, so a
# key cannot be matched inside a string. Output, per measured row:
#   metric  unit  value  anchor_value  ratio  goal  goal_op  pass  notes-head
# with "?" for a number the row lacks (gnuplot's missing value); pass is 1, 0 or -1 (no goal);
# notes-head is the row's notes up to the first ";".
# Skipped rows print `#skipped  bench/metric  reason`; a line that is not a row is an error (exit 2),
# since a plot silently missing figures would misreport the run.

function str(key,    re, s) {
	re = "[{,]\"" key "\":\"([^\"\\\\]|\\\\.)*\""
	if (!match($0, re))
		return ""
	s = substr($0, RSTART + length(key) + 5, RLENGTH - length(key) - 6)
	gsub(/\\"/, "\"", s)
	gsub(/\\\\/, "\\", s)
	gsub(/[\t\r\n]/, " ", s)
	return s
}

# json-c writes non-finite doubles as NaN or Infinity: neither can be plotted, both become "?".
function num(key,    re, s) {
	re = "[{,]\"" key "\":-?[0-9][0-9.eE+-]*"
	if (!match($0, re))
		return "?"
	s = substr($0, RSTART + length(key) + 4, RLENGTH - length(key) - 4)
	return s
}

/^[ \t]*$/ { next }
{
	metric = str("metric")
	if (metric == "" || str("bench") == "") {
		printf "rows.awk: line %d is not a wf-bench row: %s\n", NR, substr($0, 1, 80) > "/dev/stderr"
		bad = 1
		exit 2
	}
	skip = str("skipped")
	if (skip != "") {
		printf "#skipped\t%s/%s\t%s\n", str("bench"), metric, skip
		next
	}
	op = str("goal_op")
	pass = -1
	if (match($0, /[{,]"pass":true/))
		pass = 1
	else if (match($0, /[{,]"pass":false/))
		pass = 0
	n++
	name[n] = metric
	head[n] = str("notes")
	sub(/;.*/, "", head[n])
	seen[metric]++
	rest[n] = sprintf("%s\t%s\t%s\t%s\t%s\t%s\t%s", str("unit"), num("value"),
			  num("anchor_value"), num("ratio"), (op == "" ? "?" : num("goal")),
			  (op == "" ? "?" : op), pass)
}
# A metric measured more than once in a run (the engine's post-fetch rows, once per host
# bandwidth) is told apart by the head of its notes when that is short (host:bw=16G), else by
# its place.
END {
	if (bad)
		exit 2
	if (n == 0) {
		print "rows.awk: no measured row in the input" > "/dev/stderr"
		exit 3
	}
	for (i = 1; i <= n; i++) {
		label = name[i]
		if (seen[name[i]] > 1)
			label = label " (" (head[i] != "" && length(head[i]) <= 24 ? head[i] : ++k[name[i]]) ")"
		printf "%s\t%s\t%s\n", label, rest[i], head[i]
	}
}
