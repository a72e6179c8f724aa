"""Runs the dashboard's browser check (tests/ui/check.mjs: playwright-core driving chromium) and
returns what it saw, with its screenshots kept as artifacts.

tests/run installs chromium, node and playwright-core, and passes `UI_CHROMIUM` and
`UI_NODE_MODULES`; a test that finds them missing fails and says so.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from conftest import REPO, child_env, target_dir

#: The whole check: a browser start, a login, every view and one live request on a loaded CPU.
CHECK_TIMEOUT_S = 240.0


def artifacts_dir(name: str) -> Path:
    """Where the screenshots of check `name` go: under cargo's target directory, kept after the
    run (and printed, so that CI's log says where they are)."""
    out = target_dir() / "ui-artifacts" / name
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    return out


def run_check(name: str, config: dict) -> dict:
    missing = [v for v in ("UI_CHROMIUM", "UI_NODE_MODULES") if not os.environ.get(v)]
    if missing:
        pytest.fail(f"{', '.join(missing)} not set: run the suite through tests/run, which installs chromium and playwright-core", pytrace=False)
    node = shutil.which("node")
    if node is None:
        pytest.fail("node not found: tests/run installs it (apt-get install nodejs)", pytrace=False)
    out = artifacts_dir(name)
    env = child_env()
    env["UI_CHROMIUM"] = os.environ["UI_CHROMIUM"]
    env["UI_NODE_MODULES"] = os.environ["UI_NODE_MODULES"]
    done = subprocess.run(
        [node, str(REPO / "tests" / "ui" / "check.mjs"), json.dumps({**config, "out": str(out)})],
        capture_output=True, text=True, timeout=CHECK_TIMEOUT_S, env=env, stdin=subprocess.DEVNULL,
    )
    print(f"dashboard screenshots ({name}): {out}")
    lines = done.stdout.strip().splitlines()
    result = json.loads(lines[-1]) if lines else {}
    assert done.returncode == 0, f"check.mjs failed ({done.returncode}): {result.get('failure')}\nstderr: {done.stderr[-4000:]}\nresult: {result}"
    return result


def console_problems(result: dict) -> list:
    """What the browser's console reported as errors or warnings, and uncaught page errors."""
    return result.get("console", []) + result.get("page_errors", [])
