"""The launchd agent that `switchyard service install` writes, read by Python's plistlib (a
parser that is not the one that wrote it): it parses, names the absolute binary and config,
and is deploy/launchd/dev.switchyard.plist filled in. `plutil -lint` is macOS's own check and
runs only there; the systemd unit is checked with `systemd-analyze verify` in
proxy/tests/service.rs."""

from __future__ import annotations

import os
import plistlib
import subprocess
import sys
from pathlib import Path

from conftest import REPO, binary, child_env

CONFIG = """
[server]
drain_timeout_ms = 20000
shutdown_timeout_ms = 30000

[ledger]
path = "ledger/switchyard.db"

[backends.llama]
engine = "llama.cpp"
url = "http://127.0.0.1:8081"

[backends.llama.launch]
command = ["llama-server", "-m", "model.gguf"]
stop_grace_ms = 15000

[models.smollm2]
primary = "llama"
"""


def _dry_run(home: Path, config: Path) -> tuple[str, str]:
    env = {**child_env(), "HOME": str(home)}
    done = subprocess.run(
        [str(binary("SWITCHYARD_BIN", "switchyard")), "service", "install", "--manager", "launchd",
         "--config", str(config), "--dry-run"],
        env=env, capture_output=True, text=True, timeout=30, check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout, done.stderr


def test_the_launch_agent_parses_and_names_absolute_paths(tmp_path: Path) -> None:
    home = tmp_path / "Users" / "ada"
    home.mkdir(parents=True)
    config = tmp_path / "Application Support" / "switchyard & co" / "switchyard.toml"
    config.parent.mkdir(parents=True)
    config.write_text(CONFIG)
    xml, said = _dry_run(home, config)
    assert f"would write {home}/Library/LaunchAgents/dev.switchyard.plist" in said
    assert f"would run: launchctl bootstrap gui/{os.getuid()} {home}/Library/LaunchAgents/dev.switchyard.plist" in said
    agent = plistlib.loads(xml.encode())
    switchyard = os.path.realpath(binary("SWITCHYARD_BIN", "switchyard"))

    assert agent["Label"] == "dev.switchyard"
    assert agent["ProgramArguments"] == [switchyard, "serve", "--config", str(config)]
    assert all(os.path.isabs(p) for p in (agent["ProgramArguments"][0], agent["ProgramArguments"][3]))
    assert agent["WorkingDirectory"] == str(config.parent)
    assert agent["RunAtLoad"] is True
    assert agent["KeepAlive"] == {"SuccessfulExit": False}
    # The configured shutdown_timeout_ms (30 s, the drain included) and 5 s of margin.
    assert agent["ExitTimeOut"] == 35
    assert agent["StandardOutPath"] == agent["StandardErrorPath"] == f"{home}/Library/Logs/switchyard/switchyard.log"
    assert agent["EnvironmentVariables"]["PATH"].startswith("/opt/homebrew/bin:")

    # The same as the template in deploy/, filled in.
    template = (REPO / "deploy" / "launchd" / "dev.switchyard.plist").read_text()
    escape = lambda s: s.replace("&", "&amp;")  # noqa: E731
    for name, value in {
        "SWITCHYARD": switchyard,
        "CONFIG": escape(str(config)),
        "WORKING_DIRECTORY": escape(str(config.parent)),
        "LOG": f"{home}/Library/Logs/switchyard/switchyard.log",
        "EXIT_TIMEOUT": "35",
    }.items():
        template = template.replace(f"@{name}@", value)
    assert "@" not in template.split("-->", 1)[1], "a placeholder is left in the template"
    assert plistlib.loads(template.encode()) == agent

    if sys.platform == "darwin":
        path = tmp_path / "dev.switchyard.plist"
        path.write_text(xml)
        lint = subprocess.run(["plutil", "-lint", str(path)], capture_output=True, text=True, check=False)
        assert lint.returncode == 0, lint.stdout + lint.stderr
