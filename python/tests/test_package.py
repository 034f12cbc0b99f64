"""The installed package: type stubs shipped and in step with the native module."""

import ast
import os

import zenoh_cuda_shm as zcs
from zenoh_cuda_shm import _native


def stub_tree():
    path = os.path.join(os.path.dirname(zcs.__file__), "_native.pyi")
    with open(path) as f:
        return ast.parse(f.read())


def test_stubs_and_marker_are_installed():
    d = os.path.dirname(zcs.__file__)
    assert os.path.isfile(os.path.join(d, "py.typed"))
    assert os.path.isfile(os.path.join(d, "_native.pyi"))
    assert zcs.__version__ == _native.__version__


def test_stubs_match_the_native_module():
    tree = stub_tree()
    stub_funcs = {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
    stub_classes = {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)}
    native_funcs = {n for n in dir(_native) if callable(getattr(_native, n)) and not isinstance(getattr(_native, n), type)}
    assert stub_funcs == native_funcs
    native_classes = {n for n in dir(_native) if isinstance(getattr(_native, n), type)}
    assert set(stub_classes) == native_classes
    for name, node in stub_classes.items():
        cls = getattr(_native, name)
        if issubclass(cls, BaseException):
            continue
        stub_members = {m.name for m in node.body if isinstance(m, ast.FunctionDef)}
        native_members = {m for m in vars(cls) if not m.startswith("__") or m in ("__dlpack__", "__dlpack_device__",
                                                                                   "__len__")}
        native_members -= {"__module__", "__doc__"}
        assert stub_members == native_members, name


def test_dtype_names_cover_numpy_and_torch_spellings():
    names = set(zcs.dtype_names())
    for n in ("bool", "int8", "uint64", "float16", "bfloat16", "float32", "complex64", "complex128",
              "float8_e4m3fn", "float8_e5m2", "float4_e2m1fn_x2"):
        assert n in names
