# `wf-bench cachepolicy`: hit rate of each policy per cache size, Belady's (the rows' anchor,
# the bound on every policy) last in each group. plots.sh sets, before this file:
#   table (header "cache" then one column per policy; one line per cache size), out, ncol,
#   ttl (run, machine, command), check (the engine-vs-simulation row, one line), width.
set terminal pngcairo size width,640 font "DejaVu Sans,10" noenhanced
set output out
set datafile separator "\t"
set datafile missing "?"

set title ttl font ",11"
set style data histogram
set style histogram clustered gap 1
set style fill solid 0.85 border -1
set boxwidth 0.9
set grid ytics lc rgb "#d0d0d0"
set xlabel "cache size (share of layers x experts)"
set ylabel "hit rate"
set yrange [0:1.12]
set ytics 0.1
set key top left horizontal font ",9" samplen 1.5 autotitle columnhead
set bmargin 5
set label 1 check at screen 0.01,0.02 left font ",8"
# Belady last in black: the clairvoyant bound every policy is read against.
colour(i) = i == ncol ? 0x303030 : word("0x1f77b4 0xaec7e8 0xff7f0e 0xffbb78 0x2ca02c 0x98df8a 0x9467bd 0xc5b0d5", (i - 2) % 8 + 1) + 0
plot for [i=2:ncol] table using i:xtic(1) lc rgb colour(i), \
     for [i=2:ncol] table using ($0 + (i - 2 - (ncol - 2) / 2.0) / (ncol)):(column(i)):(sprintf("%.2f", column(i))) \
          with labels rotate by 90 left offset 0,0.3 font ",7" notitle
