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
build-bench/bench_memory bench/out/startup/files 2000 bench/out/startup/single_file.yaml \
    bench/out/startup/many_sources.yaml bench/out/startup/one_source.yaml | tee bench/out/memory.log
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
