#!/usr/bin/env bash
# Install this repo's packages on the device machine (no package index there).
# Needs .whl/ holding the hatchling and editables wheels (pip download hatchling editables
# -d .whl on a machine with an index), carried to the device with the call.
# PYPTX_INSTALLED=1 (set by tools/device_batch.sh after its install) makes this a no-op.
[ "${PYPTX_INSTALLED:-0}" = 1 ] && exit 0
python3 -m pip install -q --no-index --find-links .whl hatchling editables 2>&1 | tail -2
python3 -m pip install -q --no-index --no-build-isolation --no-deps \
    -e packages/pyptx-core -e packages/pyptx-shim -e packages/pyptx-torch -e packages/pyptx-jax \
    -e packages/pyptx-kernels \
    2>&1 | tail -3
# bytecode, as a wheel install writes it (editable installs do not; a first call would
# otherwise compile ~50 modules under PYTHONDONTWRITEBYTECODE)
python3 -m compileall -q -j 0 packages/*/src > /dev/null 2>&1 || true
