# Driver of mem-cap-consistent.test: $1 the model, $2 a scratch folder, $3
# the cleavec binary. Per schedule: the smallest cap the partition search
# reports (asked with a cap far too small), then a plan under exactly it.
set -e
model=$1
out=$2
cleavec=$3
for s in 1f1b zb-h1 zb-h2 gpipe 1f1b-2bp; do
  if "$cleavec" "$model" --stages 4 --microbatches 8 --schedule $s \
      --mem-cap 1KiB > /dev/null 2> "$out/$s.err"; then
    echo "$s: a 1 KiB cap was accepted"
    continue
  fi
  cap=$(sed -n 's/.*the smallest cap that fits is .* (\([0-9]*\) bytes).*/\1/p' "$out/$s.err")
  echo "$s $cap"
  "$cleavec" "$model" --stages 4 --microbatches 8 --schedule $s \
    --mem-cap "$cap" 2>&1 | grep -c "^step time" || true
done
