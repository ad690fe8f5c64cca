"""CPU tests of pycutlass.compiler.toolchain: where nvcc's toolkit is, version agreement, reset, fingerprint.

Most use a fake ``nvcc`` (a shell script answering --version and --dryrun) and fake header trees, so they need
no CUDA toolkit; the wrapper-script test uses the real nvcc when there is one.
"""
from __future__ import annotations

import os
import shutil
import stat
import warnings
from pathlib import Path

import pytest

from pycutlass.compiler import toolchain
from pycutlass.compiler.backends import NvccBackend, NvrtcBackend
from pycutlass.errors import ToolchainError

_REAL_NVCC = shutil.which("nvcc")  # before any test hides it


def _headers(include: Path, version: int) -> Path:
    include.mkdir(parents=True, exist_ok=True)
    (include / "cuda_runtime.h").write_text("#include \"cuda_runtime_api.h\"\n")
    (include / "cuda_runtime_api.h").write_text(f"#define CUDART_VERSION  {version}\n")
    (include / "cuda.h").write_text(f"#define CUDA_VERSION {version}\n")
    return include


def _fake_toolkit(root: Path, release: str, header_version: int) -> Path:
    """A toolkit at ``root``: bin/nvcc (a script that answers like nvcc) and include/ with versioned headers."""
    _headers(root / "include", header_version)
    (root / "bin").mkdir(parents=True)
    nvcc = root / "bin" / "nvcc"
    nvcc.write_text(
        "#!/bin/sh\n"
        'case "$*" in\n'
        f'  *--version*) echo "Cuda compilation tools, release {release}, V{release}.77"; '
        f'echo "Build cuda_{release}.fake";;\n'
        f'  *--dryrun*) echo "#\\$ TOP={root}/bin/.." >&2; '
        f'echo "#\\$ INCLUDES=\\"-I{root}/bin/../include\\"  " >&2;;\n'
        "esac\n"
    )
    nvcc.chmod(nvcc.stat().st_mode | stat.S_IXUSR)
    return root


def _wrapper(bin_dir: Path, target: Path) -> Path:
    """A wrapper script named nvcc in ``bin_dir`` (like /usr/local/bin/nvcc) that execs ``target``."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    wrapper = bin_dir / "nvcc"
    wrapper.write_text(f'#!/bin/sh\nexec {target} "$@"\n')
    wrapper.chmod(0o755)
    return wrapper


@pytest.fixture
def clean_env(monkeypatch):
    """No CUDA_HOME/CUDA_PATH, a PATH without nvcc; the toolchain facts forgotten before and after."""
    path = [d for d in os.environ.get("PATH", "").split(os.pathsep) if d and not (Path(d) / "nvcc").exists()]
    monkeypatch.setenv("PATH", os.pathsep.join(path))
    monkeypatch.delenv("CUDA_HOME", raising=False)
    monkeypatch.delenv("CUDA_PATH", raising=False)
    toolchain.reset()
    yield monkeypatch
    toolchain.reset()


def _prepend_path(monkeypatch, directory: Path) -> None:
    monkeypatch.setenv("PATH", f"{directory}{os.pathsep}{os.environ['PATH']}")
    toolchain.reset()


# ---- #12: the toolkit comes from nvcc, not from where a wrapper sits ------------------------------------------


def test_wrapper_script_on_path_finds_the_real_toolkit(clean_env, tmp_path):
    toolkit = _fake_toolkit(tmp_path / "cuda-12.8", "12.8", 12080)
    _prepend_path(clean_env, _wrapper(tmp_path / "usr-local" / "bin", toolkit / "bin" / "nvcc").parent)
    assert toolchain.cuda_home() == toolkit.resolve()  # not tmp_path / "usr-local"
    assert toolchain.cuda_include_dirs()[0] == (toolkit / "include").resolve()
    assert toolchain.nvcc_version() == "12.8.77"
    assert toolchain.nvcc_include_dirs()[0] == (toolkit / "include").resolve()


def test_real_nvcc_behind_a_wrapper(clean_env, tmp_path):
    real = _REAL_NVCC
    if real is None:
        pytest.skip("nvcc is not installed")
    _prepend_path(clean_env, _wrapper(tmp_path / "bin", Path(real)).parent)
    home = toolchain.cuda_home()
    assert home != tmp_path and (home / "bin" / "nvcc").is_file()
    assert toolchain.cuda_header_version() == tuple(int(x) for x in toolchain.nvcc_version().split(".")[:2])
    assert "-I" + str(toolchain.nvcc_include_dirs()[0]) in NvccBackend().include_flags()


def test_nvcc_with_headers_of_another_version_is_refused(clean_env, tmp_path):
    toolkit = _fake_toolkit(tmp_path / "cuda-13.0", "13.0", 13000)
    _prepend_path(clean_env, toolkit / "bin")
    other = tmp_path / "cuda-12.8"  # CUDA_HOME points at headers of another version, without an nvcc
    _headers(other / "include", 12080)
    clean_env.setenv("CUDA_HOME", str(other))
    toolchain.reset()
    with pytest.raises(ToolchainError, match=r"version mismatch: nvcc 13\.0\.77 .* CUDA 12\.8 headers"):
        NvccBackend().include_flags()
    with pytest.raises(ToolchainError, match="version mismatch"):
        toolchain.fingerprint("nvcc")


def test_nvcc_with_headers_of_another_installation_warns(clean_env, tmp_path):
    toolkit = _fake_toolkit(tmp_path / "cuda-13.0", "13.0", 13000)
    _prepend_path(clean_env, toolkit / "bin")
    other = tmp_path / "other-13.0"
    _headers(other / "include", 13000)
    clean_env.setenv("CUDA_HOME", str(other))
    toolchain.reset()
    with pytest.warns(toolchain.ToolchainWarning, match="not with nvcc's own headers"):
        toolchain.nvcc_include_dirs()


def test_headers_that_disagree_with_themselves_are_refused(tmp_path):
    include = _headers(tmp_path / "include", 13000)
    (include / "cuda.h").write_text("#define CUDA_VERSION 12080\n")
    with pytest.raises(ToolchainError, match="disagree"):
        toolchain.cuda_header_version((include,))


def test_nvrtc_with_headers_of_another_version_is_refused(clean_env, tmp_path):
    pytest.importorskip("cuda.bindings.nvrtc")
    other = tmp_path / "cuda-12.8"
    _headers(other / "include", 12080)
    clean_env.setenv("CUDA_HOME", str(other))
    toolchain.reset()
    with pytest.raises(ToolchainError, match=r"version mismatch: nvrtc .* CUDA 12\.8 headers from toolkit"):
        NvrtcBackend().include_flags()


def test_nvrtc_with_pip_headers_says_what_was_paired(toolkit_hidden):
    pytest.importorskip("cuda.bindings.nvrtc")
    pytest.importorskip("cuda.pathfinder")
    described = toolchain.describe("nvrtc")
    assert "nvidia-cuda-nvrtc" in described and "headers from pip wheels (nvidia-cuda-runtime" in described
    major, minor = toolchain.cuda_header_version()
    assert toolchain.nvrtc_version().startswith(f"{major}.{minor}")  # the pip wheels agree with each other
    assert toolchain.fingerprint("nvrtc")["cuda_headers"]["source"].startswith("pip wheels (nvidia-cuda-runtime")


# ---- reset, fingerprint -----------------------------------------------------------------------------------------


def test_reset_forgets_every_memoized_fact(clean_env, tmp_path):
    first = _fake_toolkit(tmp_path / "a", "13.0", 13000)
    _prepend_path(clean_env, first / "bin")
    assert toolchain.nvcc_version() == "13.0.77"
    second = _fake_toolkit(tmp_path / "b", "13.1", 13010)
    clean_env.setenv("PATH", f"{second / 'bin'}{os.pathsep}{os.environ['PATH']}")
    assert toolchain.nvcc_version() == "13.0.77"  # memoized
    toolchain.reset()
    assert toolchain.nvcc_version() == "13.1.77"
    assert toolchain.cuda_include_dirs()[0] == (second / "include").resolve()


def _fake_cutlass(root: Path, patch: int = 0) -> Path:
    (root / "include" / "cutlass").mkdir(parents=True)
    (root / "include" / "cutlass" / "cutlass.h").write_text("// cutlass\n")
    (root / "include" / "cutlass" / "version.h").write_text(
        f"#define CUTLASS_MAJOR 4\n#define CUTLASS_MINOR 2\n#define CUTLASS_PATCH {patch}\n")
    return root


def test_fingerprint(clean_env, tmp_path):
    toolkit = _fake_toolkit(tmp_path / "cuda", "13.0", 13000)
    _prepend_path(clean_env, toolkit / "bin")
    clean_env.setenv("CUTLASS_PATH", str(_fake_cutlass(tmp_path / "cutlass")))
    toolchain.reset()
    first = toolchain.fingerprint("nvcc")
    assert first["compiler"] == {"name": "nvcc", "version": "13.0.77", "build": "cuda_13.0.fake"}
    assert first["cuda_headers"]["version"] == "13.0"
    assert first["cutlass"]["version"] == "4.2.0" and len(first["cutlass"]["headers_sha256"]) == 64
    assert str(tmp_path) not in repr(first)  # no absolute paths: a moved install keeps its keys
    assert toolchain.fingerprint("nvcc") == first
    # A changed CUTLASS header tree changes it (after reset: the listing is memoized).
    (tmp_path / "cutlass" / "include" / "cutlass" / "new.h").write_text("// new\n")
    assert toolchain.fingerprint("nvcc") == first
    toolchain.reset()
    changed = toolchain.fingerprint("nvcc")
    assert changed["cutlass"]["headers_sha256"] != first["cutlass"]["headers_sha256"]
    # The same contents with other mtimes (the same wheel installed elsewhere) keep it: a cache filled on one
    # machine serves another.
    for path in (tmp_path / "cutlass").rglob("*.h"):
        os.utime(path, ns=(path.stat().st_atime_ns, path.stat().st_mtime_ns + 10**12))
    toolchain.reset()
    assert toolchain.fingerprint("nvcc") == changed
    # ... and a header edited in place to the same size changes it
    (tmp_path / "cutlass" / "include" / "cutlass" / "new.h").write_text("// NEW\n")
    toolchain.reset()
    assert toolchain.fingerprint("nvcc")["cutlass"]["headers_sha256"] != changed["cutlass"]["headers_sha256"]
    with pytest.raises(ValueError):
        toolchain.fingerprint("clang")


def test_fingerprint_differs_by_backend_and_compiler(clean_env, tmp_path):
    pytest.importorskip("cuda.bindings.nvrtc")
    toolkit = _fake_toolkit(tmp_path / "cuda", "13.0", 13000)
    _prepend_path(clean_env, toolkit / "bin")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        nvcc, nvrtc = toolchain.fingerprint("nvcc"), toolchain.fingerprint("nvrtc")
    assert nvcc["compiler"] != nvrtc["compiler"] and nvcc["cutlass"] == nvrtc["cutlass"]
    assert nvrtc["compiler"]["name"] == "nvrtc"
