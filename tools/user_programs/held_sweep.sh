#!/usr/bin/env bash
# held_sweep.sh PROGRAM...: plain, none, recompute, swap, hybrid at BUDGET none with HELD=1;
# outputs in $OUT (default out_held); one line per run on stdout with the seconds taken.
cd "$(dirname "$0")"
PY=${PYTHON:-python}
OUT=${OUT:-out_held}
mkdir -p "$OUT"
for P in "$@"; do
  for pol in ${POLS:-plain none recompute swap hybrid}; do
    t0=$(date +%s)
    HELD=1 timeout ${TMO:-400} $PY "$P.py" $pol none > "$OUT/$P.$pol.txt" 2> "$OUT/$P.$pol.err"; rc=$?
    echo "$P $pol rc=$rc $(( $(date +%s) - t0 ))s"
  done
done
