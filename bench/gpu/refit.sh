#!/usr/bin/env bash
# Re-fit the shipped profiles (router/cache/profiles/) from the calibration data kept here
# (bench/gpu/data/, measured with gpu_calib.py: bench/gpu/README.md). Run from the repository root.
set -euo pipefail
PY=${PYTHON:-.venv/bin/python}
FIT="$PY bench/gpu/fit_profile.py"
DATA=bench/gpu/data
OUT=router/cache/profiles
$FIT $DATA/h100_llama8b.json --name h100-llama8b --out $OUT/h100-llama8b.json \
    --note "Llama-3-8B shape on one H100 80GB HBM3; the default deployment's GPU"
$FIT $DATA/h200_llama8b.json --name h200-llama8b --out $OUT/h200-llama8b.json \
    --note "Llama-3-8B shape on one H200"
$FIT $DATA/h200_llama70b_tp1.json --name h200-llama70b-tp1 --out $OUT/h200-llama70b-tp1.json \
    --note "Llama-3-70B shape on one H200, no tensor parallelism (a smaller grid)"
for n in 4 8; do
    $FIT $DATA/h200_llama70b_tp1.json --name h200-llama70b-tp$n --tensor-parallel $n \
        --out $OUT/h200-llama70b-tp$n.json \
        --note "Llama-3-70B shape on $n H200s: a stated assumption from the one-GPU run"
done
