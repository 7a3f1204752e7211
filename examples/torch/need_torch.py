"""Imported by the examples before PyTorch: run as `python3 examples/torch/...` where another
python3 comes first on PATH (pyenv, a venv) without PyTorch, they run again under Debian's
/usr/bin/python3, which has python3-torch (tools/install-deps.sh torch)."""
import os
import sys

try:
    import torch  # noqa: F401
except ImportError:
    DEBIAN = "/usr/bin/python3"
    if os.access(DEBIAN, os.X_OK) and os.path.realpath(sys.executable) != os.path.realpath(DEBIAN):
        os.execv(DEBIAN, [DEBIAN] + sys.argv)
    raise
