"""Deliberately broken transformers-family adapters for the meta-tests, run on the real classes.

Loaded into a conformance run with ``-p fakes.hf`` (tests/ on PYTHONPATH). Each builds the real
transformers norm class the hf-* adapter builds and gets one translation wrong.
"""

from __future__ import annotations

import numpy as np

import conformance
from backends.transformers import hf_norms
from conformance.model.case import Case


@conformance.register("fake-hf-gemma-untranslated")
class GemmaUntranslated(hf_norms.HFNorm):
    """GemmaRMSNorm given the case's weight as it is: an offset-free case's w is scaled by 1 + w."""

    name = "fake-hf-gemma-untranslated"
    family_name = "hf-gemma"

    def translate(self, case: Case, weight: np.ndarray) -> tuple[np.ndarray, str]:
        return weight, "as given (untranslated)"


@conformance.register("fake-hf-llama-default-eps")
class LlamaDefaultEps(hf_norms.HFNorm):
    """LlamaRMSNorm built without the case's eps: its own default 1e-6 is used for every case."""

    name = "fake-hf-llama-default-eps"
    family_name = "hf-llama"

    def prepare(self, case: Case, inputs: hf_norms.Inputs, *, grad: bool) -> hf_norms.Prepared:
        return self._prepare(case, inputs, grad=grad, default_eps=True)
