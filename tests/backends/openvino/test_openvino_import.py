"""Importing the openvino adapter sends no usage event and forks nothing (docs: backends/openvino)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytest.importorskip("openvino")

from support.suite import ROOT

# JAX first, as a run of every framework backend has it (flax sorts before openvino): a fork after
# its threads started is what made JAX print "os.fork() was called".
PROBE = """
import jax.numpy as jnp
jnp.zeros(3).block_until_ready()
from backends.openvino.runtime import OpenVINO
OpenVINO().capabilities()
import openvino.tools.ovc.telemetry_utils as telemetry
print(telemetry.tm.__name__)
"""


def test_openvino_is_imported_with_its_telemetry_stub_and_no_fork_warning():
    pytest.importorskip("jax")
    env = {k: v for k, v in os.environ.items() if k != "CI"}  # under CI=true OpenVINO sends nothing anyway
    done = subprocess.run(
        [sys.executable, "-c", PROBE], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "openvino.tools.ovc.telemetry_stub"
    assert "os.fork()" not in done.stderr, done.stderr[-3000:]
