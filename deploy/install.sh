#!/bin/sh
# The image's install steps, in one place: the Dockerfile's build stage runs this script, and
# `make image-steps` (deploy/check_image_steps.sh) runs the same script in a fresh venv here.
#
#   deploy/install.sh VENV [SRC]
#
# Creates the virtualenv VENV and installs into it exactly the locked runtime set
# (SRC/requirements/runtime.lock, `make lock`), then the project at SRC (default: .) without
# dependencies (a wheel built by pip, not an editable install); checks that the dependencies
# are consistent and that the venv is exactly the lock, and removes pip and setuptools so the
# venv holds only what runs.
set -eu
venv=${1:?usage: install.sh VENV [SRC]}
src=${2:-.}

python3 -m venv "$venv"
"$venv/bin/python" -m pip install --quiet --upgrade pip
"$venv/bin/python" -m pip install --quiet --no-deps -r "$src/requirements/runtime.lock"
"$venv/bin/python" -m pip install --quiet --no-deps "$src"
"$venv/bin/python" -m pip check
"$venv/bin/python" "$src/deploy/check_lock.py" "$src/requirements/runtime.lock"
# Runtime only: no installer and no build backend in the image.
"$venv/bin/python" -m pip uninstall --quiet --yes pip setuptools
