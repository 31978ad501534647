#!/bin/sh
# Make one venv per peer under bench/peers/.venvs/NAME (git-ignored), each with the
# project's torch pin (torch==2.13.0, the CPU build on local disk) and the peer from PyPI.
# Usage: bench/peers/setup_venvs.sh [NAME...]   (default: all peers; the image-text peers
# energon and webdataset are made by bench/peers/run_vlm_table.py or by naming them)
# A peer whose install fails is recorded in bench/peers/.venvs/NAME.install-error and the
# table reports it as not installed, with that error.
set -u
cd "$(dirname "$0")"
PY=${PYTHON:-python3.11}
TORCH=torch==2.13.0
pkgs() {
    case $1 in
        torchdata) echo "torchdata==0.11.0" ;;
        streaming) echo "mosaicml-streaming==0.13.0" ;;
        grain)     echo "grain==0.2.18 array_record==0.8.6" ;;
        litdata)   echo "litdata==0.2.76" ;;
        raydata)   echo "ray[data,train]==2.60.0 pyarrow" ;;
        energon)   echo "megatron-energon==7.4.1 pillow" ;;
        webdataset) echo "webdataset==1.0.2 pillow" ;;
        *) echo "unknown peer $1" >&2; return 1 ;;
    esac
}
[ $# -gt 0 ] || set -- torchdata streaming grain litdata raydata
mkdir -p .venvs
for name in "$@"; do
    v=.venvs/$name
    if [ -f "$v/.ok" ]; then echo "$name: ready"; continue; fi
    rm -rf "$v" "$v.install-error"
    "$PY" -m venv "$v" || { echo "venv failed" > "$v.install-error"; continue; }
    # shellcheck disable=SC2046
    if "$v/bin/pip" install -q "$TORCH" numpy psutil $(pkgs "$name") > "$v.log" 2>&1 &&
       "$v/bin/python" -c "import torch; assert torch.__version__.startswith('2.13.0'), torch.__version__"; then
        touch "$v/.ok"; echo "$name: installed"
    else
        tail -20 "$v.log" > "$v.install-error"; echo "$name: install FAILED (see $v.install-error)"
    fi
done
