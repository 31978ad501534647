#!/bin/sh
# Run the benchmarks of bench/README.md; results in bench/out/*.json|log and bench/out/peers/.
# Needs: data/ (scripts/build_corpus.py), .venv, cmake, ninja, gcc, libyaml,
# libxxhash, zlib.
set -eu
cd "$(dirname "$0")/.."
cmake -S . -B build-bench -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build-bench --target all bench_memory >/dev/null
mkdir -p bench/out
uptime
.venv/bin/python bench/embedded/throughput.py --json bench/out/throughput.json | tee bench/out/throughput.log | tail -6
.venv/bin/python bench/embedded/startup.py --json bench/out/startup.json | tee bench/out/startup.log | tail -3
MEMORY="build-bench/bench_memory bench/out/startup/files 2000 bench/out/startup/single_file.yaml bench/out/startup/many_sources.yaml bench/out/startup/one_source.yaml"
$MEMORY | tee bench/out/memory.log
# the C benchmark's figure into bench/results/embedded_memory.json
.venv/bin/python bench/results.py embedded_memory "heap per open source" \
    "$(.venv/bin/python -c 'import json; print(next(json.loads(l)["heap_per_source_bytes"] for l in open("bench/out/memory.log") if "separate_sources" in l))')" \
    B --command "$MEMORY" --headline --lower-is-better \
    --note "$(.venv/bin/python -c 'import json; print("%.0f B by pl_source_sizeof" % next(json.loads(l)["sizeof_per_source_bytes"] for l in open("bench/out/memory.log") if "separate_sources" in l))')"
.venv/bin/python bench/make_tables.py     # the tables of bench/README.md and README.md
uptime
# The peer table (bench/peers/README.md): one venv per peer from
# PyPI (bench/peers/.venvs/, torch==2.13.0 as in .venv), then every harness.  PEERS=0 skips.
if [ "${PEERS:-1}" != 0 ]; then
    bench/peers/setup_venvs.sh
    .venv/bin/python bench/peers/run_table.py | tee bench/out/peers_table.log | tail -12
    uptime
    # the image-text table (Megatron-Energon, WebDataset; "Image-text peers")
    .venv/bin/python bench/peers/run_vlm_table.py --rounds 5 | tee bench/out/vlm_peers_table.log | tail -8
    uptime
fi
