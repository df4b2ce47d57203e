# One wf-bench run's rows against their anchors (any mode). plots.sh sets, before this file:
#   rows (the rows.awk output), out (the PNG), n (measured rows), ttl (run, machine, command),
#   skipped (the skipped rows and why, may be empty) in skipped_lines lines, width, maxlab (the
#   longest row label, in characters: the margins that the slanted labels need).
# Top: value / anchor per row, the bar coloured by the row's goal (met, missed, none) and the
# goal drawn across it. Bottom: the value and its anchor side by side on a log scale, since one
# mode mixes GB/s, ms and tokens/s; the unit is in the row's label. The anchor bar is drawn only
# where the row's ratio is value / anchor, i.e. both are in the row's unit (evict_free_mem_ratio's
# anchor, for one, is the bytes free, and its value already the ratio).
max(a, b) = a > b ? a : b
lm = max(11, int(0.6 * maxlab) - 4)
bm = int(0.31 * maxlab) + 2 + skipped_lines
height = 640 + 16 * bm
set terminal pngcairo size width,height font "DejaVu Sans,10" noenhanced
set output out
set datafile separator "\t"
set datafile missing "?"
set datafile commentschars "#"

set multiplot title ttl font ",11"
set lmargin lm
set rmargin 3
# Room right of the last row for its goal's label.
set xrange [-0.6:n + 0.2]
set style fill solid 0.85 border -1
set grid ytics lc rgb "#d0d0d0"

# Top panel: 300 pixels under the title; the bottom one takes the rest.
set origin 0,1 - 360.0 / height
set size 1,300.0 / height
set tmargin 1
set bmargin 0.5
set xtics 1 format "" scale 0
set ylabel "value / anchor"
set yrange [0:*]
set offsets 0,0,graph 0.15,0
set key top right horizontal font ",9" samplen 1.5
set boxwidth 0.6
colour(p) = p == 1 ? 0x2ca02c : (p == 0 ? 0xd62728 : 0x8c8c8c)
plot rows using 0:5:(colour($8)) with boxes lc rgb variable notitle, \
     rows using 0:5:(sprintf("%.3g", $5)) with labels offset 0,0.6 font ",8" notitle, \
     rows using 0:6:(0.38) with xerrorbars pt 0 lw 2.5 lc rgb "black" notitle, \
     rows using ($0 + 0.4):6:(stringcolumn(7)." ".sprintf("%g", $6)) with labels left \
          offset 0.3,0 font ",8" notitle, \
     NaN with boxes lc rgb "#2ca02c" title "goal met", \
     NaN with boxes lc rgb "#d62728" title "goal missed", \
     NaN with boxes lc rgb "#8c8c8c" title "no goal here", \
     NaN with lines lw 2.5 lc rgb "black" title "goal"

# Bottom panel.
set origin 0,0
set size 1,1 - 360.0 / height
set tmargin 0.5
set bmargin bm
set xtics 1 format "% h" rotate by 45 right scale 0 font ",9" noenhanced
set ylabel "value and anchor (row's unit, log scale)"
set logscale y
set yrange [*:*]
set key top right horizontal font ",9" opaque
set offsets 0,0,graph 0.12,0
set boxwidth 0.38
pos(v) = v > 0 ? v : NaN
same_unit(v, a, r) = (a > 0 && abs(v / a - r) <= 1e-6 * (abs(r) > 1 ? abs(r) : 1)) ? a : NaN
if (strlen(skipped) > 0) set label 1 skipped at screen 0.01,0.012 + 0.016 * (skipped_lines - 1) left front font ",8"
plot rows using ($0 - 0.2):(pos($3)):xtic(stringcolumn(1)." [".stringcolumn(2)."]") \
          with boxes lc rgb "#1f77b4" title "value", \
     rows using ($0 + 0.2):(pos(same_unit($3, $4, $5))) with boxes lc rgb "#ff7f0e" title "anchor (same run)"
unset multiplot

