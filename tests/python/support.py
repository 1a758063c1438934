"""Shared helpers of the Python tests (tests/python/test_*.py, run by CTest with Debian's python3).

The environment comes from CMake: PYTHONPATH = the build dir (the `moesq` module), MOESQ_BINARY (the
CLI the results are compared with), MOESQ_DEFAULT_MODEL (the embedded tiny Qwen3-MoE)."""
import json
import os
import subprocess
import tempfile

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # BLAS sums in one order, as the CLI's per-expert tasks

try:
    import numpy as np  # Debian python3-numpy (scripts/install-deps.sh)
except ImportError as e:  # pragma: no cover - a broken environment must fail, not skip
    raise SystemExit("tests/python need numpy (apt-get install python3-numpy): %s" % e)

import moesq  # noqa: E402  (the module built in PYTHONPATH)

BINARY = os.environ["MOESQ_BINARY"]
MODEL = os.environ["MOESQ_DEFAULT_MODEL"]


def cli(*args):
    """Runs the moesq CLI; returns stdout; raises with stderr on a non-zero exit."""
    r = subprocess.run([BINARY, *args], capture_output=True, text=True, env={**os.environ, "MOESQ_QUIET": "1"})
    if r.returncode != 0:
        raise AssertionError("moesq %s failed (%d):\n%s" % (" ".join(args), r.returncode, r.stderr))
    return r.stdout


def cli_json(*args):
    return json.loads(cli(*args, "--json"))


def tmpdir():
    return tempfile.TemporaryDirectory(prefix="moesq_test_python_")


def random_tokens(n, vocab, seed):
    return np.random.default_rng(seed).integers(0, vocab, size=n, dtype=np.int32)


def nll_nats(logits, tokens):
    """Mean -log softmax(logits[t])[tokens[t+1]] over t < T-1, in float64 (the eval's definition)."""
    z = logits[:-1].astype(np.float64)
    z = z - z.max(axis=1, keepdims=True)
    lse = np.log(np.exp(z).sum(axis=1))
    return float(np.mean(lse - z[np.arange(len(tokens) - 1), tokens[1:]]))


def bf16_values(shape, seed, scale=1.0):
    """Random float32 values that are exact bf16 (low 16 bits zero), and their bf16 bits as uint16."""
    x = (np.random.default_rng(seed).standard_normal(shape) * scale).astype(np.float32)
    bits = (x.view(np.uint32) >> 16).astype(np.uint16)
    return (bits.astype(np.uint32) << 16).view(np.float32), bits


# ---- hand-made DLPack capsules (ctypes), for producers NumPy cannot be: CUDA memory, bfloat16 ----
import ctypes  # noqa: E402


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int), ("device_id", ctypes.c_int)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", _DLDevice), ("ndim", ctypes.c_int), ("dtype", _DLDataType),
                ("shape", ctypes.POINTER(ctypes.c_int64)), ("strides", ctypes.POINTER(ctypes.c_int64)),
                ("byte_offset", ctypes.c_uint64)]


_DELETER = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


class _DLManagedTensor(ctypes.Structure):
    _fields_ = [("dl_tensor", _DLTensor), ("manager_ctx", ctypes.c_void_p), ("deleter", _DELETER)]


_PyCapsule_New = ctypes.pythonapi.PyCapsule_New
_PyCapsule_New.restype = ctypes.py_object
_PyCapsule_New.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]

KDL_CPU, KDL_CUDA = 1, 2
KDL_INT, KDL_UINT, KDL_FLOAT, KDL_BFLOAT = 0, 1, 2, 4


class Capsule:
    """A 'dltensor' capsule over `array`'s memory claiming `device_type`:`device_id` and dtype (code, bits);
    `deleted` counts deleter calls (the consumer must call it exactly once)."""

    def __init__(self, array, device_type=KDL_CPU, code=None, bits=None, device_id=0):
        self.array = array
        self.deleted = 0
        self._shape = (ctypes.c_int64 * array.ndim)(*array.shape)
        self._mt = _DLManagedTensor()
        t = self._mt.dl_tensor
        t.data = array.ctypes.data
        t.device = _DLDevice(device_type, device_id)
        t.ndim = array.ndim
        t.dtype = _DLDataType(code, bits, 1)
        t.shape = self._shape
        t.strides = None
        t.byte_offset = 0

        def _delete(_ptr):
            self.deleted += 1

        self._deleter = _DELETER(_delete)
        self._mt.deleter = self._deleter
        self.capsule = _PyCapsule_New(ctypes.addressof(self._mt), b"dltensor", None)
