# Written by mqgrad report: loss vs training time, one panel per link speed, one line per
# method: the median over its seeds where all of them have a value (so it never jumps
# where a seed starts or stops); the band: 25..75 % of the seeds, where at least 2 have
# a value; markers on methods with at most 10 points per seed. The numbers are in
# data/. Run it in this directory: gnuplot loss.gp
if (strstrt(GPVAL_TERMINALS, 'pngcairo') > 0) {
    set terminal pngcairo size 1367,500 noenhanced font ',10'
} else {
    set terminal png truecolor size 1367,500 noenhanced
}
set output 'loss.png'
set linetype 1 lc rgb '#000000' lw 2 dt solid pt 7 ps 1.3
set linetype 2 lc rgb '#1f77b4' lw 2 dt solid pt 5 ps 1.3
set linetype 3 lc rgb '#d62728' lw 2 dt solid pt 9 ps 1.3
set linetype 4 lc rgb '#2ca02c' lw 2 dt solid pt 11 ps 1.3
set linetype 5 lc rgb '#ff7f0e' lw 2 dt solid pt 13 ps 1.3
set linetype 6 lc rgb '#9467bd' lw 2 dt solid pt 15 ps 1.3
set style fill transparent solid 0.20 noborder
set multiplot title 'Degrading link 10 Gbit/s, 1 Gbit/s, 80 Mbit/s, paper-exact codec: loss vs training time'
unset key
set grid
set xlabel 'training time (s)'
set ylabel 'smoothed training loss'
set xrange [0:*]

set origin 0.0000, 0.0000
set size 0.4682, 0.9200
set title 'link 10000@0,1000@20,80@40'
plot 'data/loss_fixed-2--paper-exact-codec-.dat' index 0 using 1:2 with lines lt 1 notitle, \
     'data/loss_fixed-3--paper-exact-codec-.dat' index 0 using 1:3:4 with filledcurves lc 2 notitle, \
     'data/loss_fixed-3--paper-exact-codec-.dat' index 0 using 1:2 with lines lt 2 notitle, \
     'data/loss_fixed-4--paper-exact-codec-.dat' index 0 using 1:3:4 with filledcurves lc 3 notitle, \
     'data/loss_fixed-4--paper-exact-codec-.dat' index 0 using 1:2 with lines lt 3 notitle, \
     'data/loss_fixed-6--paper-exact-codec-.dat' index 0 using 1:3:4 with filledcurves lc 4 notitle, \
     'data/loss_fixed-6--paper-exact-codec-.dat' index 0 using 1:2 with lines lt 4 notitle, \
     'data/loss_fixed-8--paper-exact-codec-.dat' index 0 using 1:3:4 with filledcurves lc 5 notitle, \
     'data/loss_fixed-8--paper-exact-codec-.dat' index 0 using 1:2 with lines lt 5 notitle, \
     'data/loss_learned-every-2-qerr-0-trend-0-min-2-max-8-epsilon-0--paper-exact-codec-.dat' index 0 using 1:3:4 with filledcurves lc 6 notitle, \
     'data/loss_learned-every-2-qerr-0-trend-0-min-2-max-8-epsilon-0--paper-exact-codec-.dat' index 0 using 1:2 with lines lt 6 notitle

# The key, beside the panels.
set origin 0.4682, 0
set size 0.5318, 1
set lmargin 0
set tmargin 4
unset title
unset xlabel
unset ylabel
unset grid
unset border
unset tics
unset logscale
set xrange [0:1]
set yrange [0:1]
set key inside left top Left reverse samplen 4 spacing 1.2 width 2
plot 2 with lines lw 2 lc rgb '#606060' title 'line: median over seeds', \
     2 with filledcurves y1=3 fc rgb '#606060' title 'band: 25..75 % of seeds (where 2 or more)', \
     2 with lines lt 1 title 'fixed:2 (paper-exact codec) (5 seeds, 4 diverged, not drawn)', \
     2 with lines lt 2 title 'fixed:3 (paper-exact codec) (5 seeds)', \
     2 with lines lt 3 title 'fixed:4 (paper-exact codec) (5 seeds)', \
     2 with lines lt 4 title 'fixed:6 (paper-exact codec) (5 seeds)', \
     2 with lines lt 5 title 'fixed:8 (paper-exact codec) (5 seeds)', \
     2 with lines lt 6 title 'learned:every=2,qerr=0,trend=0,min=2,max=8,epsilon=0 (paper-exact codec) (5 seeds)'
unset multiplot
