"""ctypes binding of libmqgrad (common/include/mqgrad/mqgrad.h): the structures, the function
prototypes and the loading of the shared library.

The library is looked for, in order:

1. the path in the environment variable ``MQGRAD_LIB`` (when set, only there: an explicit
   choice is not overridden);
2. ``../../build/common/libmqgrad.so`` relative to this package (a source checkout built with
   CMake into ``build/``);
3. ``ctypes.util.find_library('mqgrad')``, then ``libmqgrad.so.1`` through the dynamic
   loader's own search (``LD_LIBRARY_PATH``, the ld.so cache: an installed library).

A failure names every place tried and why each failed.
"""

import ctypes
import ctypes.util
import os

API_VERSION = 1
NAME_MAX = 63  # MQGRAD_NAME_MAX: bytes of a tensor's name, its terminating zero not counted
TENSORS_MAX = 128  # MQGRAD_TENSORS_MAX


class TensorT(ctypes.Structure):
    """mqgrad_tensor_t."""

    _fields_ = [
        ("name", ctypes.c_char_p),
        ("count", ctypes.c_uint64),
    ]


class RunT(ctypes.Structure):
    """mqgrad_run_t. ``l2`` (the run's L2 coefficient on the paper model's big FC weights) is
    the struct's last field."""

    _fields_ = [
        ("rank", ctypes.c_uint32),
        ("workers", ctypes.c_uint32),
        ("servers", ctypes.c_uint32),
        ("batch", ctypes.c_uint32),
        ("seed", ctypes.c_uint64),
        ("model", ctypes.c_char * 16),
        ("dataset", ctypes.c_char * 16),
        ("codec", ctypes.c_char * 128),
        ("optimizer", ctypes.c_char * 64),
        ("threshold", ctypes.c_uint64),
        ("l2", ctypes.c_float),
    ]


class StepT(ctypes.Structure):
    """mqgrad_step_t."""

    _fields_ = [
        ("iter", ctypes.c_uint64),
        ("member", ctypes.c_uint32),
        ("members", ctypes.c_uint32),
        ("cursor", ctypes.c_uint64),
        ("bits", ctypes.c_int),
        ("lr", ctypes.c_float),
        ("evaluate", ctypes.c_int),
        ("eval_limit", ctypes.c_uint32),
    ]


_c = ctypes
# name: (restype, argtypes)
PROTOTYPES = {
    "mqgrad_join": (_c.c_void_p, [_c.c_int, _c.POINTER(_c.c_char_p), _c.POINTER(TensorT),
                                  _c.c_size_t, _c.c_void_p]),
    "mqgrad_run": (_c.POINTER(RunT), [_c.c_void_p]),
    "mqgrad_nparams": (_c.c_size_t, [_c.c_void_p]),
    "mqgrad_params": (_c.c_void_p, [_c.c_void_p]),
    "mqgrad_grads": (_c.c_void_p, [_c.c_void_p]),
    "mqgrad_accumulates": (_c.c_int, [_c.c_void_p, _c.c_size_t]),
    "mqgrad_zero_grads": (_c.c_int, [_c.c_void_p, _c.c_int]),
    "mqgrad_next": (_c.c_int, [_c.c_void_p, _c.POINTER(StepT)]),
    "mqgrad_ready": (_c.c_int, [_c.c_void_p, _c.c_size_t]),
    "mqgrad_push": (_c.c_int, [_c.c_void_p, _c.c_double]),
    "mqgrad_evaluated": (_c.c_int, [_c.c_void_p, _c.c_uint64, _c.c_uint64, _c.c_double]),
    "mqgrad_examples": (_c.c_int, [_c.c_void_p, _c.c_uint64, _c.c_uint64, _c.c_size_t,
                                   _c.c_void_p]),
    "mqgrad_error": (_c.c_char_p, [_c.c_void_p]),
    "mqgrad_join_code": (_c.c_int, []),
    "mqgrad_leave": (_c.c_int, [_c.POINTER(_c.c_void_p)]),
}


def _candidates():
    """(description, name to dlopen) in the order tried; MQGRAD_LIB alone when set."""
    env = os.environ.get("MQGRAD_LIB")
    if env:
        return [("$MQGRAD_LIB", env)]
    here = os.path.dirname(os.path.abspath(__file__))
    out = [("the source checkout's build",
            os.path.normpath(os.path.join(here, "..", "..", "build", "common", "libmqgrad.so")))]
    found = ctypes.util.find_library("mqgrad")
    if found:
        out.append(("find_library('mqgrad')", found))
    else:
        out.append(("find_library('mqgrad')", None))
    out.append(("the dynamic loader's search", "libmqgrad.so.1"))
    return out


def _bind(lib):
    for name, (restype, argtypes) in PROTOTYPES.items():
        fn = getattr(lib, name)  # AttributeError: not a libmqgrad
        fn.restype = restype
        fn.argtypes = argtypes
    return lib


def load_from(path):
    """Loads and binds the library at PATH (tests, or a program that knows where it is)."""
    return _bind(ctypes.CDLL(path))


_LIB = None


def load():
    """The bound library, loaded on first use; OSError naming every place tried."""
    global _LIB
    if _LIB is not None:
        return _LIB
    tried = []
    for what, name in _candidates():
        if name is None:
            tried.append("%s: nothing found" % what)
            continue
        if os.sep in name and not os.path.exists(name):
            tried.append("%s: %s: no such file" % (what, name))
            continue
        try:
            _LIB = load_from(name)
            return _LIB
        except (OSError, AttributeError) as e:
            tried.append("%s: %s: %s" % (what, name, e))
    raise OSError(
        "cannot load libmqgrad (the mqgrad C library): tried " + "; ".join(tried) +
        ". Build it (cmake --build build --target mqgrad_shared, in the source checkout), "
        "install it, or set MQGRAD_LIB to the path of libmqgrad.so")


def error(lib, w):
    """mqgrad_error(w) as str ("" if none); W None: the failed join's reason."""
    msg = lib.mqgrad_error(w)
    return msg.decode("utf-8", "replace") if msg else ""
