# Written by mqgrad report: per condition and codec setting, each method's time to 75 %
# divided by the best fixed setting's with the same seed: the geometric mean over seeds
# and its 95 % bootstrap interval (report.md's table). Run it in this directory:
# gnuplot headline.gp
if (strstrt(GPVAL_TERMINALS, 'pngcairo') > 0) {
    set terminal pngcairo size 1464,310 noenhanced font ',10'
} else {
    set terminal png truecolor size 1464,310 noenhanced
}
set output 'headline.png'
set linetype 1 lc rgb '#000000' lw 2 dt solid pt 7 ps 1.3
set linetype 2 lc rgb '#1f77b4' lw 2 dt solid pt 5 ps 1.3
set linetype 3 lc rgb '#d62728' lw 2 dt solid pt 9 ps 1.3
set linetype 4 lc rgb '#2ca02c' lw 2 dt solid pt 11 ps 1.3
set linetype 5 lc rgb '#ff7f0e' lw 2 dt solid pt 13 ps 1.3
set linetype 6 lc rgb '#9467bd' lw 2 dt solid pt 15 ps 1.3
set multiplot title 'Square wave 80 Mbit/s - 10 Gbit/s, paper-exact codec: time to 75 %, against the best fixed setting'
unset key
set grid xtics
set logscale x 2
set lmargin 75
set rmargin 4
set xtics (0.25, 0.33, 0.5, 0.67, 0.8, 1, 1.25, 1.5, 2, 3, 4, 6, 8, 16)
set arrow 1 from 1, graph 0 to 1, graph 1 nohead lc rgb '#606060' dt 2
set xlabel 'time to 75 % ÷ the best fixed setting''s, same seed (below 1: faster; 95 % interval over seeds)'

set origin 0, 0.0000
set size 1, 0.8710
unset label
set title 'link 80@0,10000@10/20 — best fixed: fixed:3 (paper-exact codec), 23.5 s to 75 %'
set xrange [0.552072:2.00259]
set yrange [5.5:-0.5]
set ytics ('fixed:2 (paper-exact codec)' 0, 'fixed:3 (paper-exact codec)' 1, 'fixed:4 (paper-exact codec)' 2, 'fixed:6 (paper-exact codec)' 3, 'fixed:8 (paper-exact codec)' 4, 'learned:every=2,qerr=0,trend=0,min=2,max=8,epsilon=0 (paper-exact codec)' 5)
set label 'diverged in 4 of 5 seeds; one seed' at first 0.876923, first 0 left tc rgb '#606060'
plot 1/0 notitle, '-' using 1:2:3:4:5 with xerrorbars lc variable pt 7 ps 1.4 notitle
0.843195 0 0.843195 0.843195 1
1 1 1 1 2
1.03998 2 0.861785 1.21682 3
1.06586 3 0.748427 1.39152 4
1.35989 4 1.16378 1.59148 5
0.806228 5 0.69009 0.921673 6
e
unset multiplot
