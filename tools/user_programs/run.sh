#!/usr/bin/env bash
# run.sh PROGRAM FRACTION...: PROGRAM.py under plain PyTorch (no pyalloc), under pyalloc with no
# policy (its unconstrained peak), then under recompute, swap and hybrid at each FRACTION of
# that peak, each compared bit for bit (losses, final parameters) with plain PyTorch.
#   OMP_NUM_THREADS=1 bash tools/user_programs/run.sh conformer 0.5 0.4
# Set OMP_NUM_THREADS: the thread count changes plain PyTorch's own bits, and the machine's
# load must not change it between the runs compared. PYTHON picks the interpreter; results
# and stderr go to $OUT (default: tools/user_programs/out).
set -u
cd "$(dirname "$0")"
P=$1; shift
PY=${PYTHON:-python}
OUT=${OUT:-out}
mkdir -p "$OUT"
$PY "$P.py" plain none > "$OUT/$P.plain.txt" 2> "$OUT/$P.plain.err" || { echo "$P plain ERROR: $(tail -1 "$OUT/$P.plain.err")"; exit 1; }
$PY "$P.py" none none > "$OUT/$P.none.txt" 2> "$OUT/$P.none.err" || { echo "$P none ERROR: $(tail -1 "$OUT/$P.none.err")"; exit 1; }
want=$(grep -E "^(loss|params)" "$OUT/$P.plain.txt" | md5sum)
[ "$(grep -E "^(loss|params)" "$OUT/$P.none.txt" | md5sum)" == "$want" ] || echo "$P none DIFFERS from plain"
peak=$(grep ^peak "$OUT/$P.none.txt" | awk '{print $2}')
for f in "${@:-0.5}"; do
  for pol in recompute swap hybrid; do
    b=$(python3 -c "print(int($f * $peak))")
    timeout 900 $PY "$P.py" $pol $b > "$OUT/$P.$pol.$f.txt" 2> "$OUT/$P.$pol.$f.err"; rc=$?
    got=$(grep -E "^(loss|params)" "$OUT/$P.$pol.$f.txt" | md5sum)
    if [ $rc != 0 ]; then
      if grep -q "OutOfMemoryError" "$OUT/$P.$pol.$f.err"; then echo "$P $pol $f out of memory (clean)";
      else echo "$P $pol $f ERROR rc=$rc: $(tail -1 "$OUT/$P.$pol.$f.err" | cut -c1-200)"; fi
    elif [ "$got" != "$want" ]; then echo "$P $pol $f DIFFERS from plain PyTorch";
    else echo "$P $pol $f bit-identical: $(grep ^peak "$OUT/$P.$pol.$f.txt")"; fi
  done
done
