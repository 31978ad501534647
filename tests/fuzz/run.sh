#!/usr/bin/env bash
# Build every libFuzzer target of tests/fuzz (clang, ASan + UBSan + libFuzzer)
# and run each for SECONDS seconds, one after the other, from the committed
# seeds (tests/fuzz/corpus/<target>, read-only) plus a scratch corpus.
#
#   tests/fuzz/run.sh SECONDS [TARGET...]
#
# Env: BUILD_DIR (default build-fuzz), JOBS (default 2), WORK (scratch
# corpora and crash files; default a fresh temporary directory).  Exits 1 if
# any target crashed; crash inputs are left in WORK/<target>/.
set -euo pipefail
secs=${1:?usage: tests/fuzz/run.sh SECONDS [TARGET...]}
shift
root=$(cd "$(dirname "$0")/../.." && pwd)
build=${BUILD_DIR:-$root/build-fuzz}
work=${WORK:-$(mktemp -d "${TMPDIR:-/tmp}/plfuzz-run.XXXXXX")}
cc=${CC:-clang}
cxx=${CXX:-clang++}
# clang++ for the one C++ file fuzzed (src/source/text/parquet_shim.cc, over Arrow's prebuilt libraries).
cmake -S "$root" -B "$build" -DCMAKE_C_COMPILER="$cc" -DCMAKE_CXX_COMPILER="$cxx" \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DPL_BUILD_FUZZ=ON -DPL_BUILD_TESTS=OFF -DPL_BUILD_CLI=OFF -DPL_BUILD_PYTHON=OFF >/dev/null
cmake --build "$build" -j "${JOBS:-2}" >/dev/null
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
  for f in "$root"/tests/fuzz/fuzz_*.c; do targets+=("$(basename "$f" .c)"); done
fi
status=0
printf '%-16s %10s %8s %8s %6s %s\n' target executions exec/s coverage units result
for t in "${targets[@]}"; do
  mkdir -p "$work/$t/corpus"
  log="$work/$t/log"
  set +e
  (cd "$work/$t" && "$build/$t" -max_total_time="$secs" -print_final_stats=1 \
      -timeout=10 -rss_limit_mb=2048 -max_len=65536 \
      "$work/$t/corpus" "$root/tests/fuzz/corpus/$t") >"$log" 2>&1
  rc=$?
  set -e
  execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' || echo '?')
  eps=$(grep -o 'stat::average_exec_per_sec: *[0-9]*' "$log" | grep -o '[0-9]*$' || echo '?')
  cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1 | grep -o '[0-9]*' || echo '?')
  units=$(ls "$work/$t/corpus" | wc -l)
  if [ $rc -eq 0 ]; then res=ok; else res="CRASH (rc $rc, see $log)"; status=1; fi
  printf '%-16s %10s %8s %8s %6s %s\n' "$t" "$execs" "$eps" "$cov" "$units" "$res"
done
echo "work directory: $work"
exit $status
