"""load_inline builds made by the pytest process and shared by the hash of their arguments
(issue 32, harness/shared_builds.py): a second candidate with the same sources loads the first
one's build; no candidate can write it; what cannot be built safely is built as before."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest
from helpers import AXPY, PYTEST, run_pytest

from pytest_kscientist.harness.mounts import build_folder, extension_root, sandbox_available
from pytest_kscientist.harness.shared_builds import SharedBuilds, declined_because, working_in
from pytest_kscientist.worker.inline_builds import BUILD_ENVIRONMENT, normalised

# axpy through a C extension on Python's C API (no torch header: g++ builds it in ~1 s).
# SCALE is read at each call, as the CUDA seed reads its knobs: a child that moves it has the
# same load_inline sources.
C_AXPY = r'''
#include <Python.h>
static PyObject* axpy(PyObject* self, PyObject* args) {
    unsigned long long out, x, y; long long n; double a;
    if (!PyArg_ParseTuple(args, "KKKLd", &out, &x, &y, &n, &a)) return NULL;
    float* o = (float*)out; const float* p = (const float*)x; const float* q = (const float*)y;
    for (long long i = 0; i < n; ++i) o[i] = (float)a * p[i] + q[i];
    Py_RETURN_NONE;
}
static PyMethodDef methods[] = {{"axpy", axpy, METH_VARARGS, ""}, {NULL, NULL, 0, NULL}};
static struct PyModuleDef mod = {PyModuleDef_HEAD_INIT, "ks_c_axpy", NULL, -1, methods};
PyMODINIT_FUNC PyInit_ks_c_axpy(void) { return PyModule_Create(&mod); }
'''

CANDIDATE = '''import os

from torch.utils.cpp_extension import load_inline

SCALE = 2.0  # {note}
SRC = r"""{source}"""
ext = load_inline(name="ks_c_axpy", cpp_sources=[SRC], no_implicit_headers=True,
                  extra_cflags=["-O2"]{extra})
TRIED = {{}}
# The folder the module was loaded from: another candidate's writes there must fail.
LIB = ext.__file__
try:
    with open(LIB, "ab") as f:
        f.write(b"planted")
    TRIED["write"] = "written"
except OSError as exc:
    TRIED["write"] = type(exc).__name__


def custom_kernel(data):
    x, y, out = data
    if TRIED["write"] != "OSError" and {must_be_read_only}:
        raise RuntimeError(f"wrote the shared build {{LIB}}")
    ext.axpy(out.data_ptr(), x.data_ptr(), y.data_ptr(), x.numel(), SCALE)
    return out
'''


# The C kernels here read their tensors through raw host pointers: their sessions run on the
# CPU on a GPU machine too.
ON_CPU = ("--ks-device", "cpu", "--ks-profile", "cpu")


def candidate(note: str = "", source: str = C_AXPY, extra: str = "",
              must_be_read_only: bool = True) -> str:
    return CANDIDATE.format(note=note, source=source, extra=extra,
                            must_be_read_only=must_be_read_only)


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A folder with the axpy task and its own torch extension root, where the sandbox works
    with that root read-only."""
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "ext"))
    if shutil.which("c++") is None or shutil.which("ninja") is None:
        pytest.skip("load_inline needs a C++ compiler and ninja")
    if sandbox_available((extension_root(),), ()) is not None:
        pytest.skip("the worker sandbox does not work here (unshare)")
    shutil.copytree(AXPY, tmp_path / "axpy")
    return tmp_path


def own_build(project: Path, name: str, extra: str = "") -> dict:
    """The checks of a candidate whose load_inline call names an include folder (so the
    pytest process declines it and the candidate builds it itself), ``extra`` added to the
    call; their --ks-json, once they passed."""
    headers = project / "headers"
    headers.mkdir(exist_ok=True)
    extra = f", extra_include_paths=[{str(headers)!r}]{extra}"
    (project / f"{name}.py").write_text(candidate(extra=extra, must_be_read_only=False))
    code, output, data = run_pytest([*ON_CPU, "axpy", "-k", "check", "--kernel", f"{name}.py"],
                                    cwd=project)
    assert code == 0, output
    return data


def builds(data: dict, name: str) -> list[dict]:
    return next(c["inline_builds"] for c in data["candidates"] if c["name"] == name)


@pytest.mark.slow
def test_a_knob_child_loads_its_parents_build_and_cannot_write_it(project: Path) -> None:
    (project / "parent.py").write_text(candidate())
    code, output, data = run_pytest([*ON_CPU, "axpy", "--kernel", "parent.py"], cwd=project)
    assert code == 0, output
    [record] = builds(data, "parent")
    assert record["outcome"] == "built" and record["module"] == "ks_c_axpy", record
    [shared] = [p for p in extension_root().iterdir() if p.name.startswith("src-")]
    assert (shared / "ks_c_axpy.so").is_file() and (shared / "ks-built.json").is_file()
    assert "-O2" in (shared / "ks-build.log").read_text()  # the compiler's lines, kept
    assert not list(build_folder(project / "parent.py").iterdir())  # nothing built in its own

    (project / "child.py").write_text(candidate(note="moved").replace("2.0", "2.0 + 0.0"))
    before = (shared / "ks_c_axpy.so").read_bytes()
    code, output, data = run_pytest([*ON_CPU, "axpy", "--kernel", "child.py"], cwd=project)
    assert code == 0, output
    [record] = builds(data, "child")
    assert record["outcome"] == "reused" and record["key"] == shared.name[4:20], record
    assert (shared / "ks_c_axpy.so").read_bytes() == before  # its write was refused


@pytest.mark.slow
def test_two_files_with_the_same_sources_in_one_session_build_once(project: Path) -> None:
    """Their workers load together (starts.start_workers): one builds, the other waits its
    turn and loads that build."""
    (project / "one.py").write_text(candidate())
    (project / "two.py").write_text(candidate(note="a copy"))
    code, output, data = run_pytest([*ON_CPU, "axpy", "-k", "check", "--kernel", "one.py",
                                     "--kernel", "two.py"], cwd=project)
    assert code == 0, output
    outcomes = sorted(b["outcome"] for name in ("one", "two") for b in builds(data, name))
    assert outcomes == ["built", "reused"], outcomes
    assert len([p for p in extension_root().iterdir() if p.name.startswith("src-")]) == 1


@pytest.mark.slow
def test_a_build_that_fails_is_the_candidates_failure_with_the_compilers_error(
        project: Path) -> None:
    broken = C_AXPY.replace("Py_RETURN_NONE;", "Py_RETURN_NONE")
    (project / "broken.py").write_text(candidate(source=broken))
    code, output, data = run_pytest([*ON_CPU, "axpy", "-k", "check", "--kernel", "broken.py"],
                                    cwd=project)
    assert code == 1, output
    assert "load_inline build of 'ks_c_axpy' failed" in output, output
    assert "first error: main.cpp:" in output and "error:" in output, output
    assert builds(data, "broken")[0]["outcome"] == "failed"
    assert not [p for p in extension_root().iterdir() if p.name.startswith(("src-", ".src-"))]


@pytest.mark.slow
def test_an_arch_list_set_before_the_call_is_shared_and_a_compiler_is_not(
        project: Path) -> None:
    """GPU MODE files often set TORCH_CUDA_ARCH_LIST before load_inline: its flags travel
    with the call. A compiler of the candidate's choosing does not: that call builds alone."""
    arch = "import os\nos.environ['TORCH_CUDA_ARCH_LIST'] = '9.0a'\n"
    (project / "arch.py").write_text(arch + candidate())
    cxx = "import os\nos.environ['CXX'] = 'g++'\n"
    (project / "cxx.py").write_text(cxx + candidate(must_be_read_only=False))
    code, output, data = run_pytest([*ON_CPU, "axpy", "-k", "check", "--kernel", "arch.py",
                                     "--kernel", "cxx.py"], cwd=project)
    assert code == 0, output
    assert [b["outcome"] for b in builds(data, "arch")] == ["built"], output
    [declined] = builds(data, "cxx")
    assert declined["outcome"] == "declined" and "environment" in declined["why"], declined


@pytest.mark.slow
def test_an_own_build_that_asks_for_torchs_precompiled_header_builds_without_it(
        project: Path) -> None:
    """torch's folder is read-only in the sandbox (mounts.installed_code): a build of the
    candidate's own that asks for use_pch goes on without the header (torch would write it
    there), as does load_inline's removal of it."""
    data = own_build(project, "pch", ", use_pch=True")
    assert builds(data, "pch")[0]["outcome"] == "declined"


@pytest.mark.slow
def test_a_call_that_names_a_folder_builds_on_its_own_as_before(project: Path) -> None:
    data = own_build(project, "own")
    [record] = builds(data, "own")
    assert record["outcome"] == "declined" and "include paths" in record["why"], record
    own = build_folder(project / "own.py")
    assert (own / "ks_c_axpy" / "ks_c_axpy.so").is_file()  # torch's own build, in its folder
    assert not [p for p in extension_root().iterdir() if p.name.startswith("src-")]


ENVIRONMENT = {n: os.environ.get(n) for n in BUILD_ENVIRONMENT}
CALL = {"name": "m", "cpp_sources": ["#include <Python.h>\n#include \"local.h\" // ok\n"],
        "cuda_sources": [], "extra_cflags": ["-O3"], "extra_cuda_cflags": ["--use_fast_math"]}


@pytest.mark.parametrize(("change", "why"), [
    ({}, None),
    ({"cpp_sources": ['#include "/tmp/planted.h"']}, "may read a file"),
    ({"cpp_sources": ['#include "../ks-0123/planted.h"']}, "may read a file"),
    ({"cpp_sources": ["#include <cuda/../../planted.h>"]}, "may read a file"),
    ({"cpp_sources": ['%:include "/tmp/planted.h"']}, "may read a file"),
    ({"cpp_sources": ['#define P "x.h"\n#include P']}, "may read a file"),
    ({"cpp_sources": ["#include_next <stdio.h>"]}, "may read a file"),
    ({"cpp_sources": ['asm(".incbin \\"/etc/hostname\\"");']}, "can read a file"),
    ({"cpp_sources": ['??=include "/tmp/x"']}, "can read a file"),
    ({"extra_cflags": ["-fplugin=evil.so"]}, "names a file"),
    ({"extra_cuda_cflags": ["-Xcompiler=-fplugin=evil.so"]}, "names a file"),
    ({"extra_cuda_cflags": ["-ccbin=gcc"]}, "names a file"),
    ({"extra_ldflags": ["-L."]}, "names a file"),
    ({"extra_ldflags": ["-Wl,-rpath,/tmp"]}, "not one plain flag"),
    ({"extra_cflags": ["@flags.txt"]}, "not one plain flag"),
    ({"extra_cflags": ["-O3 -include x.h"]}, "not one plain flag"),
    ({"extra_include_paths": ["/tmp"]}, "include paths"),
    ({"name": "not a name"}, "not an identifier"),
    # a worker's request is untrusted: a value of another kind raised TypeError in pytest
    ({"extra_cflags": 5}, "extra_cflags is int, not a list"),
    ({"cuda_sources": "__global__ void k() {}"}, "cuda_sources is str, not a list"),
])
def test_what_the_pytest_process_declines_to_build(change: dict, why: str | None) -> None:
    found = declined_because({**CALL, **change}, [], ENVIRONMENT)
    assert (found is None) if why is None else (found is not None and why in found), found


def test_arch_flags_and_the_environment_must_be_what_torch_and_pytest_use() -> None:
    gencode = ["-gencode=arch=compute_90,code=sm_90", "-gencode=arch=compute_90,code=compute_90"]
    assert declined_because(CALL, gencode, ENVIRONMENT) is None
    assert "arch flags" in declined_because(CALL, ["-ccbin=x"], ENVIRONMENT)
    assert "environment" in declined_because(CALL, [], {**ENVIRONMENT, "CXX": "/tmp/evil-cc"})


def test_load_inline_arguments_become_plain_json() -> None:
    assert normalised({"name": "m", "cpp_sources": "int a;", "cuda_sources": None,
                       "functions": ("f",), "verbose": True, "use_pch": False}) == {
        "name": "m", "cpp_sources": ["int a;"], "cuda_sources": [], "functions": ["f"],
        "use_pch": False}
    assert normalised({"name": "m", "cpp_sources": [b"bytes"]}) is None
    assert normalised({"name": "m", "cpp_sources": [], "functions": {"f": 1}}) is None


def test_a_build_past_its_deadline_is_killed_and_leaves_nothing(tmp_path: Path) -> None:
    if shutil.which("c++") is None or shutil.which("ninja") is None:
        pytest.skip("load_inline needs a C++ compiler and ninja")
    root = tmp_path / "root"
    root.mkdir()
    # torch/extension.h alone takes the host compiler 15-20 s on the 2-core CPU.
    call = {"name": "slow", "cpp_sources": ["int f() { return 1; }"], "cuda_sources": [],
            "no_implicit_headers": False}
    began = time.monotonic()
    reply, record = SharedBuilds(root).answer(
        {"args": call, "arch_flags": [], "environment": ENVIRONMENT}, time.monotonic() + 4)
    assert time.monotonic() - began < 12
    assert reply["ok"] is False and "did not finish" in reply["reason"], reply
    assert record.outcome == "failed"
    assert not list(root.iterdir())  # the partial folder removed
    assert not working_in(root)  # ninja and the compilers killed


LAZY = '''from torch.utils.cpp_extension import load_inline

SRC = r"""{source}"""
EXT = []


def custom_kernel(data):
    if not EXT:  # built at the first call, as some GPU MODE submissions do
        EXT.append(load_inline(name="ks_c_axpy", cpp_sources=[SRC], no_implicit_headers=True))
    x, y, out = data
    EXT[0].axpy(out.data_ptr(), x.data_ptr(), y.data_ptr(), x.numel(), 2.0)
    return out
'''


@pytest.mark.slow
def test_a_kernel_that_builds_at_its_first_call_builds_on_its_own(project: Path) -> None:
    (project / "lazy.py").write_text(LAZY.format(source=C_AXPY))
    code, output, data = run_pytest([*ON_CPU, "axpy", "-k", "check", "--kernel", "lazy.py"],
                                    cwd=project)
    assert code == 0, output
    assert builds(data, "lazy") == []  # nothing asked of the pytest process after the load
    assert (build_folder(project / "lazy.py") / "ks_c_axpy" / "ks_c_axpy.so").is_file()


def test_an_interrupted_builds_folder_is_removed_an_hour_later(tmp_path: Path) -> None:
    old, fresh = tmp_path / ".src-aa-11111111", tmp_path / ".src-bb-22222222"
    for folder in (old, fresh):
        folder.mkdir()
        (folder / "main.o").write_bytes(b"x")
    hours_ago = time.time() - 2 * 3600
    os.utime(old, (hours_ago, hours_ago))
    SharedBuilds(tmp_path)
    assert not old.exists() and fresh.exists()  # one still building may be another session's


# A seed the offline scientist can move: its knobs go to the C function at each call, so its
# children's load_inline arguments equal its own.
C_CHUNKED = r'''
#include <Python.h>
static PyObject* axpy(PyObject* self, PyObject* args) {
    unsigned long long out, x, y; long long n, chunk;
    if (!PyArg_ParseTuple(args, "KKKLL", &out, &x, &y, &n, &chunk)) return NULL;
    float* o = (float*)out; const float* p = (const float*)x; const float* q = (const float*)y;
    for (long long s = 0; s < n; s += chunk)
        for (long long i = s; i < n && i < s + chunk; ++i) o[i] = 2.0f * p[i] + q[i];
    Py_RETURN_NONE;
}
static PyMethodDef methods[] = {{"axpy", axpy, METH_VARARGS, ""}, {NULL, NULL, 0, NULL}};
static struct PyModuleDef mod = {PyModuleDef_HEAD_INIT, "ks_c_chunked", NULL, -1, methods};
PyMODINIT_FUNC PyInit_ks_c_chunked(void) { return PyModule_Create(&mod); }
'''
SEED = '''from torch.utils.cpp_extension import load_inline

TUNABLES = {{"chunk": 256}}
TUNABLE_SPACE = {{"chunk": [64, 128, 256, 512, 1024]}}
SRC = r"""{source}"""
ext = load_inline(name="ks_c_chunked", cpp_sources=[SRC], no_implicit_headers=True)


def custom_kernel(data):
    x, y, out = data
    ext.axpy(out.data_ptr(), x.data_ptr(), y.data_ptr(), x.numel(), TUNABLES["chunk"])
    return out
'''


@pytest.mark.slow
def test_an_evolves_children_load_their_parents_build(project: Path) -> None:
    seeds = project / "axpy" / "seeds"
    shutil.rmtree(seeds)
    seeds.mkdir()
    (seeds / "chunked.py").write_text(SEED.format(source=C_CHUNKED))
    proc = subprocess.run([*PYTEST,
                           "--evolve", "1", "axpy", "--ks-llm", "offline", *ON_CPU],
                          cwd=project, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    found = {}
    for record in sorted((project / "population" / "axpy").glob("c*/results.json")):
        result = json.loads(record.read_text())["result"]
        found[record.parent.name] = [b["outcome"] for b in result["inline_builds"]]
    seed, *children = found.values()
    assert seed == ["built"] and children, found
    assert all(outcomes == ["reused"] for outcomes in children), found
    # The parent re-timed beside its children (--ks-beside, a partner) loaded the shared build
    # too: no file built in its own folder.
    own = [p for p in extension_root().glob("ks-*/**/*") if p.is_file()]
    assert not own, own


MANY = '''from torch.utils.cpp_extension import load_inline

SRC = r"""
#include <Python.h>
static struct PyModuleDef mod = {{PyModuleDef_HEAD_INIT, "NAME", NULL, -1, NULL}};
PyMODINIT_FUNC PyInit_NAME(void) {{ return PyModule_Create(&mod); }}
"""
MODULES = [load_inline(name=f"ks_many_{{i}}", cpp_sources=[SRC.replace("NAME", f"ks_many_{{i}}")],
                       no_implicit_headers=True) for i in range({count})]


def custom_kernel(data):
    x, y, out = data
    assert len(MODULES) == {count}
    out.copy_(2 * x + y)
    return out
'''


@pytest.mark.slow
def test_a_load_with_more_calls_than_are_answered_builds_the_rest_on_its_own(
        project: Path) -> None:
    from pytest_kscientist.harness.spawn import MAX_INTERIM

    (project / "many.py").write_text(MANY.format(count=MAX_INTERIM + 1))
    code, output, data = run_pytest([*ON_CPU, "axpy", "-k", "check", "--kernel", "many.py"],
                                    cwd=project)
    assert code == 0, output
    assert [b["outcome"] for b in builds(data, "many")] == ["built"] * MAX_INTERIM
    assert (build_folder(project / "many.py") / f"ks_many_{MAX_INTERIM}").is_dir()


def test_a_torch_whose_build_steps_differ_is_declined_not_failed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The build here takes torch's private build steps apart; where they differ (another
    torch version), the call is declined and the candidate builds it as before."""
    from torch.utils import cpp_extension

    for name in ("_jit_compile", "_run_ninja_build"):  # as torch has them, not intercepted
        found = getattr(cpp_extension, name)
        monkeypatch.setattr(cpp_extension, name, getattr(found, "ks_original", found))

    def build_step(name, sources, novel, **rest):  # a parameter load_inline does not pass
        raise AssertionError("not to be called")

    monkeypatch.setattr(cpp_extension, "_write_ninja_file_and_build_library", build_step)
    call = {"name": "m", "cpp_sources": ["int f() { return 1; }"], "cuda_sources": [],
            "no_implicit_headers": True}
    request = {"args": call, "arch_flags": [], "environment": ENVIRONMENT}
    reply, record = SharedBuilds(tmp_path).answer(request, time.monotonic() + 60)
    assert reply == {"declined": True} and record.outcome == "declined", record
    assert "needs ['novel']" in record.why, record.why
    assert not list(tmp_path.iterdir())  # its partial folder removed
    monkeypatch.delattr(cpp_extension, "_get_num_workers")
    reply, record = SharedBuilds(tmp_path).answer(request, time.monotonic() + 60)
    assert reply == {"declined": True} and "lacks ['_get_num_workers']" in record.why


def test_a_cuda_build_without_a_toolkit_says_so() -> None:
    """GPU MODE's CUDA files declare no device: on a machine whose torch finds no CUDA, their
    failure read like a compiler error of the candidate's."""
    from pytest_kscientist.harness.shared_builds import NO_CUDA, _failure

    message = _failure("add_cuda", f"OSError: {NO_CUDA}")
    assert message.endswith('KS_REQUIRES = "cuda" in the file skips it elsewhere)'), message
    assert "no CUDA toolkit" not in _failure("add_cuda", "x.cu(3): error: expected a ;")


def test_two_first_builds_at_once_replace_torchs_steps_once() -> None:
    """Both threads passed the check that torch's steps were not yet replaced, and the second
    wrapped the first's wrapper: its signature (*args, **kwargs) declined every later build as
    Unsupported. The fake holds one thread between its check and its patch until the other
    has patched, or half a second has passed."""
    import threading

    from pytest_kscientist.harness import shared_builds as sb

    def _jit_compile(name, sources, extra_cflags, extra_cuda_cflags, extra_ldflags,
                     extra_include_paths, build_directory, verbose, with_cuda, is_python_module,
                     is_standalone, keep_intermediates=True):
        return "original"

    def write_and_build(name, sources, extra_cflags, extra_cuda_cflags, extra_ldflags,
                        extra_include_paths, build_directory, verbose, with_cuda,
                        is_standalone=False):
        return "built"

    a_patched, b_checked = threading.Event(), threading.Event()

    class Extension:
        _run_ninja_build = staticmethod(lambda build_directory, verbose, error_prefix: None)
        _write_ninja_file_and_build_library = staticmethod(write_and_build)

        def __init__(self) -> None:
            self._jit, self.reads = _jit_compile, {}

        @property
        def _jit_compile(self):
            me = threading.current_thread().name
            self.reads[me] = self.reads.get(me, 0) + 1
            if me == "B" and self.reads[me] == 2:  # B is past its check: A patches now
                b_checked.set()
                a_patched.wait(0.5)
            if me == "A" and self.reads[me] == 1:
                b_checked.wait(0.5)  # A checks after B
            return self._jit

        @_jit_compile.setter
        def _jit_compile(self, value) -> None:
            self._jit = value
            if threading.current_thread().name == "A":
                a_patched.set()

    extension = Extension()
    threads = [threading.Thread(target=sb.SharedBuilds._intercept, args=(extension,), name=n)
               for n in "BA"]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(5)
    assert extension._jit.ks_original is _jit_compile  # one wrapper, over torch's own
    sb._BUILDING.partial = Path("partial")  # as a build thread: the wrapper builds
    try:
        assert extension._jit_compile("m", [], [], [], [], [], "d", False, True, True,
                                      False) is None
    finally:
        sb._BUILDING.partial = None


def test_a_request_the_pytest_process_cannot_read_is_declined(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Whatever the worker's build request makes SharedBuilds raise is declined (the worker
    builds it in its own folder), not an error of the pytest process's item."""
    import types

    from pytest_kscientist.harness import baselines

    class Asking:
        shares_builds = True
        load_s = None

        def __init__(self, *args, **kwargs) -> None:
            pass

        def keep_caches_of(self, source) -> None:
            pass

        def request(self, op, timeout=None, interim=None, **fields):
            self.reply = interim({"args": {"name": "m"}}, 0.0)
            return {"ok": True}, b""

    def answer(request, deadline):
        raise TypeError("'int' object is not iterable")

    task = types.SimpleNamespace(describe=lambda: {}, spec=types.SimpleNamespace(
        output_index=None), spec_path=tmp_path)
    noted: list = []
    (tmp_path / "k.py").write_text("def custom_kernel(data):\n    return data\n")
    monkeypatch.setattr(baselines, "Worker", Asking)
    worker = baselines.start_worker(task, tmp_path / "k.py", "custom_kernel", None, "cpu", 1.0,
                                    builds=lambda: types.SimpleNamespace(answer=answer),
                                    answered=noted)
    assert worker.reply == {"declined": True}
    assert noted[0].outcome == "declined" and "TypeError" in noted[0].why, noted
