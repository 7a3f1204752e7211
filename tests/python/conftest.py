"""pytest setup for the Python package's tests: the package from the source checkout
(python/), and a clean mqgrad.torch state around every test. Run with Debian's interpreter,
which has python3-torch: /usr/bin/python3 -m pytest tests/python."""
import os
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.normpath(os.path.join(HERE, "..", "..", "python")))
sys.path.insert(0, HERE)

import mqgrad._lib  # noqa: E402
import mqgrad.torch  # noqa: E402


@pytest.fixture(autouse=True)
def clean_state(monkeypatch):
    """Each test starts with no worker joined, no flags and the library not yet loaded."""
    mq = mqgrad.torch
    if mq._current is not None and mq._current._w is not None:
        mq._current.shutdown()
    monkeypatch.setattr(mq, "_current", None)
    monkeypatch.setattr(mq, "_argv", [])
    monkeypatch.setattr(mq, "_warned_rule", False)
    monkeypatch.setattr(mqgrad._lib, "_LIB", None)
    yield
    if mq._current is not None and mq._current._w is not None:
        mq._current.shutdown()


@pytest.fixture
def real_lib():
    """libmqgrad as the package finds it; the test is skipped, saying why, when it is not
    built."""
    try:
        return mqgrad._lib.load()
    except OSError as e:
        pytest.skip("libmqgrad is not built (%s)" % e)
