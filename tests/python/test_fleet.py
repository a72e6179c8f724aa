"""A fleet on the REAL llama-server: two Switchyards ("studio-a", "studio-b") in front of one
llama-server of the bundled model, each with its own local SQLite ledger and one shared ledger
on a PostgreSQL server of the test's own, driven by the `openai` SDK (the Rust end-to-end test,
tests/tests/e2e/shared_ledger.rs, proves the same on the fake engine).

- Each instance says in the shared ledger that it runs: `GET /admin/instances` on either shows
  both running with the same configuration (their own settings, the admin port among them,
  differ) and no drift.
- Every request either served is one row of the shared ledger under its instance's name:
  `switchyard report --shared` counts them all, per instance and per group.
- PostgreSQL stopped costs records, never requests: the SDK's requests are all answered, each
  instance counts the records it could not write in `/metrics` (written + dropped = requests it
  served), says so in its log, and `/admin/instances` answers 503 `shared_ledger_unavailable`.
  Started again, it is written to again by itself; restarted while the writers idle, nothing
  is lost (the batch that meets a closed connection goes again on a new one). The fleet's
  report then accounts for every request: each instance's rows plus its dropped records.
- The dashboard of one instance, in Chromium, names both running and the one configured
  otherwise, and shows the fleet's figures: requests served by either, in its models view, its
  phases and its live tail, each row naming the instance that served it.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import openai
import pytest

from conftest import Proc, http_client
from test_dashboard import admin_token
from ui_check import console_problems, run_check
from test_real_engines import (
    REQUEST_TIMEOUT_S,
    Proxy,
    free_port,
    identities_settled,
    poll,
    required_path,
    run_switchyard,
    start_switchyard,
)

INSTANCES = ("studio-a", "studio-b")
#: Longest wait for a `pg_ctl` start or stop (its `-t`).
PG_CTL_TIMEOUT_S = 30
#: Longest wait for a ledger writer to have written (or counted as dropped) what it was given,
#: and for each instance's presence to reach the shared ledger.
RECORDED_TIMEOUT_S = 30.0
#: Requests per phase: before the outage, during it, after it (alternating between instances).
BEFORE, DURING, AFTER = 12, 4, 4

PROMPT = [{"role": "user", "content": "Name a colour. One word."}]
MAX_TOKENS = 8

WRITTEN = "switchyard_shared_ledger_records_written_total"
DROPPED = "switchyard_shared_ledger_records_dropped_total"
LOCAL_WRITTEN = "switchyard_ledger_records_written_total"
LOCAL_DROPPED = "switchyard_ledger_records_dropped_total"


def pg_bin_dir() -> Path:
    """PostgreSQL's programs, as observe/src/ledger/postgres/cluster.rs finds them:
    `PG_BIN_DIR`, else the newest of Debian's `/usr/lib/postgresql/*/bin`, else the `PATH`'s."""
    if explicit := os.environ.get("PG_BIN_DIR"):
        found = Path(explicit)
    else:
        debian = [p / "bin" for p in Path("/usr/lib/postgresql").glob("*") if (p / "bin" / "initdb").exists()]
        debian.sort(key=lambda b: int(b.parent.name) if b.parent.name.isdigit() else 0)
        on_path = shutil.which("initdb")
        found = debian[-1] if debian else Path(on_path).parent if on_path else None
    if found is None or not (found / "initdb").exists() or not (found / "pg_ctl").exists():
        pytest.fail(
            f"PostgreSQL's initdb and pg_ctl not found (PG_BIN_DIR={os.environ.get('PG_BIN_DIR')!r}, "
            "/usr/lib/postgresql/*/bin, PATH): set PG_BIN_DIR, or install it (Debian: apt-get install postgresql)",
            pytrace=False,
        )
    return found


class Postgres:
    """A throwaway PostgreSQL server: a new cluster in a temporary folder that trusts every
    connection, listening on loopback at a free port. PostgreSQL refuses to run as root, so as
    root the cluster belongs to, and runs as, the `postgres` user Debian's package creates."""

    def __init__(self) -> None:
        self.bin = pg_bin_dir()
        self.root = os.geteuid() == 0
        # Not pytest's tmp_path: its parent (mode 0700, root's) is closed to the `postgres` user.
        self.dir = Path(tempfile.mkdtemp(prefix="switchyard-pg-"))
        self.data = self.dir / "data"
        self.log = self.dir / "server.log"
        self.port = free_port()

    def create(self) -> None:
        """A new cluster in its folder (`initdb`), whose only role is `switchyard`."""
        if self.root:
            self._run(["chown", "postgres:postgres", str(self.dir)])
        self._run(self._as_owner(
            self.bin / "initdb", "-D", str(self.data), "-U", "switchyard", "--auth=trust",
            "-E", "UTF8", "--no-sync", "--no-instructions"))

    @property
    def url(self) -> str:
        return f"postgres://switchyard@127.0.0.1:{self.port}/postgres"

    def start(self) -> None:
        """Starts the server and waits until it accepts connections. It logs to a file (`-l`):
        a server that inherited our pipes would keep them open after pg_ctl ends."""
        options = f"-h 127.0.0.1 -p {self.port} -k {self.dir} -F -c max_connections=20"
        self._pg_ctl("-l", str(self.log), "-o", options, "start")

    def stop(self, mode: str = "fast") -> None:
        self._pg_ctl("-m", mode, "stop")

    def remove(self) -> None:
        """Stops it at once if it runs (whatever state the test left it in), and removes it."""
        with contextlib.suppress(Exception):
            subprocess.run(
                self._as_owner(self.bin / "pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop"),
                capture_output=True, timeout=PG_CTL_TIMEOUT_S + 5, check=False)
        shutil.rmtree(self.dir, ignore_errors=True)

    def _pg_ctl(self, *args: str) -> None:
        self._run(self._as_owner(self.bin / "pg_ctl", "-D", str(self.data), "-w", "-t", str(PG_CTL_TIMEOUT_S), *args))

    def _as_owner(self, program: Path, *args: str) -> list[str]:
        return (["runuser", "-u", "postgres", "--"] if self.root else []) + [str(program), *args]

    def _run(self, argv: list[str]) -> None:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=PG_CTL_TIMEOUT_S + 5, check=False)
        if done.returncode != 0:
            log = self.log.read_text("utf-8", "replace")[-3000:] if self.log.exists() else ""
            pytest.fail(f"{' '.join(argv)}: exit {done.returncode}\n{done.stdout}{done.stderr}\nserver log:\n{log}",
                        pytrace=False)


@pytest.fixture
def postgres() -> Iterator[Postgres]:
    pg = Postgres()
    try:
        pg.create()
        pg.start()
        yield pg
    finally:
        pg.remove()


@pytest.fixture
def llama(tmp_path: Path) -> Iterator[str]:
    """One llama-server of the bundled model on a free port: its URL."""
    port = free_port()
    proc = Proc("llama-server", [str(required_path("LLAMA_SERVER_BIN")), "-m", str(required_path("SMOLLM2_GGUF")),
                                 "-c", "2048", "--host", "127.0.0.1", "--port", str(port)], tmp_path / "llama-server.log")
    try:
        with http_client(timeout=5.0) as http:
            poll("llama-server", lambda: http.get(f"http://127.0.0.1:{port}/health").status_code == 200, proc)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.stop()


@dataclass
class Instance:
    name: str
    proxy: Proxy
    admin: str
    config: Path
    log: Path
    client: openai.OpenAI
    served: int = 0


def config(name: str, home: Path, llama_url: str, shared: str, admin: str, tokens: Path | None = None,
           extra: str = "") -> str:
    tokens_line = f'tokens = "{tokens}"' if tokens else ""
    return f"""
[server]
listen = "127.0.0.1:0"
probe_interval_ms = 200
first_byte_timeout_ms = 120000

[admin]
listen = "{admin}"
{tokens_line}

[ledger]
path = "{home / 'ledger.db'}"
url = "{shared}"
instance = "{name}"

[backends.llama]
engine = "llama.cpp"
url = "{llama_url}"
artifact = "{required_path('SMOLLM2_GGUF')}"
binary = "{required_path('LLAMA_SERVER_BIN')}"
require_verified_identity = true

[models.smollm2]
primary = "llama"
{extra}
"""


def metric(http: httpx.Client, instance: Instance, name: str) -> int:
    text = http.get(f"{instance.proxy.url}/metrics").text
    match = re.search(rf"^{name} (\S+)$", text, re.MULTILINE)
    assert match, f"{instance.name}: no {name} in /metrics:\n{text[-3000:]}"
    return int(float(match.group(1)))


def ask(instance: Instance, stream: bool) -> None:
    """One short chat completion through the SDK; it must be answered whole."""
    if stream:
        chunks = list(instance.client.chat.completions.create(
            model="smollm2", messages=PROMPT, temperature=0, max_tokens=MAX_TOKENS, stream=True))
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    else:
        r = instance.client.chat.completions.create(model="smollm2", messages=PROMPT, temperature=0, max_tokens=MAX_TOKENS)
        text, finish = r.choices[0].message.content or "", [r.choices[0].finish_reason]
    assert text.strip() and finish in (["stop"], ["length"]), f"{instance.name}: {text!r} finished {finish}"
    instance.served += 1


def traffic(fleet: list[Instance], n: int) -> None:
    """`n` requests, alternating between the instances, every third one streamed."""
    for i in range(n):
        ask(fleet[i % len(fleet)], stream=i % 3 == 0)


def until_recorded(http: httpx.Client, fleet: list[Instance], written_at_least: dict[str, int] | None = None) -> dict:
    """Polls each instance's `/metrics` until its shared ledger has written or dropped every
    request it served (and written at least `written_at_least[name]`): its (written, dropped)."""
    counts = {}
    for i in fleet:
        floor = (written_at_least or {}).get(i.name, 0)

        def done(i: Instance = i, floor: int = floor):  # noqa: ANN202
            written, dropped = metric(http, i, WRITTEN), metric(http, i, DROPPED)
            return (written, dropped) if written + dropped >= i.served and written >= floor else None

        counts[i.name] = poll(f"{i.name}: {i.served} records written or dropped (written >= {floor})",
                              done, i.proxy.proc, timeout=RECORDED_TIMEOUT_S)
        assert sum(counts[i.name]) == i.served, f"{i.name}: {counts[i.name]} (written, dropped) of {i.served} requests"
    return counts


def instances_view(http: httpx.Client, instance: Instance) -> httpx.Response:
    return http.get(f"http://{instance.admin}/admin/instances")


def shared_report(instance: Instance) -> dict:
    return json.loads(run_switchyard("report", "--shared", "--format", "json", "--config", str(instance.config)))


@contextlib.contextmanager
def fleet_of_two(tmp_path: Path, llama_url: str, shared: str) -> Iterator[list[Instance]]:
    with contextlib.ExitStack() as stack:
        fleet = []
        for name in INSTANCES:
            home = tmp_path / name
            home.mkdir()
            admin = f"127.0.0.1:{free_port()}"
            proxy = stack.enter_context(start_switchyard(
                home, config(name, home, llama_url, shared, admin), identities_settled("llama")))
            client = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key="unused", max_retries=0,
                                   timeout=REQUEST_TIMEOUT_S, http_client=openai.DefaultHttpxClient(trust_env=False))
            stack.callback(client.close)
            fleet.append(Instance(name, proxy, admin, home / "switchyard.toml", home / "switchyard.log", client))
        yield fleet


def test_two_switchyards_share_one_ledger_and_a_stopped_server_costs_records_not_requests(
    tmp_path: Path, postgres: Postgres, llama: str
) -> None:
    with fleet_of_two(tmp_path, llama, postgres.url) as fleet, http_client(timeout=10.0) as http:
        a, b = fleet

        # Both say they run, with one configuration (their admin ports and names differ).
        def both_present() -> dict | None:
            r = instances_view(http, a)
            assert r.status_code == 200, r.text
            view = r.json()
            return view if [i["instance"] for i in view["instances"]] == list(INSTANCES) else None

        view = poll("both instances in the shared ledger", both_present, a.proxy.proc, timeout=RECORDED_TIMEOUT_S)
        for i in view["instances"]:
            assert i["running"] is True and i["same_config"] is True, view
            assert i["this"] == (i["instance"] == "studio-a"), view
        assert view["drift"] == [], view
        assert view["this"]["instance"] == "studio-a", view
        from_b = instances_view(http, b).json()
        assert from_b["this"]["instance"] == "studio-b" and from_b["drift"] == [], from_b
        assert from_b["this"]["config_digest"] == view["this"]["config_digest"], (view, from_b)

        # Traffic through both: every request one row of the shared ledger, under its instance.
        traffic(fleet, BEFORE)
        counts = until_recorded(http, fleet)
        assert all(dropped == 0 for _, dropped in counts.values()), counts
        report = shared_report(a)
        records = report["records"]
        assert records["rows"] == BEFORE, records
        per_instance = {i["instance"]: i["rows"] for i in records["instances"]}
        assert per_instance == {i.name: i.served for i in fleet}, records
        by_group = {}
        for g in report["groups"]:
            for name, n in g["instances"].items():
                by_group[name] = by_group.get(name, 0) + n
        assert by_group == per_instance, report["groups"]

        # PostgreSQL down: every request still answered; the records are counted as dropped.
        postgres.stop()
        traffic(fleet, DURING)
        counts = until_recorded(http, fleet)
        assert counts == {i.name: (BEFORE // 2, DURING // 2) for i in fleet}, f"written, dropped: {counts}"
        down = instances_view(http, a)
        assert down.status_code == 503, down.text
        error = down.json()["error"]
        assert error["code"] == "shared_ledger_unavailable", error
        assert postgres.url in error["message"], error
        for i in fleet:
            assert "ledger write failed: the batch is lost" in i.log.read_text("utf-8", "replace"), f"{i.name} never said it lost records"

        # PostgreSQL back: writing resumes by itself.
        written_before = {name: written for name, (written, _) in counts.items()}
        postgres.start()
        traffic(fleet, AFTER)
        counts = until_recorded(http, fleet, {n: w + AFTER // 2 for n, w in written_before.items()})
        assert counts == {i.name: ((BEFORE + AFTER) // 2, DURING // 2) for i in fleet}, f"written, dropped: {counts}"
        assert instances_view(http, b).status_code == 200

        # A restart while the writers idle: the next batch meets its pooled connection closed
        # before its commit and is written again on a new one; nothing is lost.
        written_before = {name: written for name, (written, _) in counts.items()}
        postgres.stop()
        postgres.start()
        traffic(fleet, AFTER)
        counts = until_recorded(http, fleet, {n: w + AFTER // 2 for n, w in written_before.items()})
        assert counts == {i.name: ((BEFORE + 2 * AFTER) // 2, DURING // 2) for i in fleet}, f"written, dropped: {counts}"

        # Each local ledger has every request; the fleet's report accounts for each one.
        for i in fleet:
            # The local writer commits on its own schedule: wait until it has taken every request.
            def taken(i: Instance = i) -> tuple[int, int] | None:
                counts = (metric(http, i, LOCAL_WRITTEN), metric(http, i, LOCAL_DROPPED))
                return counts if sum(counts) >= i.served else None

            local = poll(f"{i.name}: the local ledger's records", taken, i.proxy.proc, timeout=RECORDED_TIMEOUT_S)
            assert local == (i.served, 0), f"{i.name}: (written, dropped) {local}"
        report = shared_report(b)
        accounted = {
            i["instance"]: (i["rows"], i["rows"] + i["dropped_queue_full"] + i["dropped_write_failed"])
            for i in report["records"]["instances"]
        }
        assert accounted == {i.name: (counts[i.name][0], i.served) for i in fleet}, report["records"]
        assert report["records"]["rows"] == BEFORE + 2 * AFTER, report["records"]
    print(f"\nfleet: {BEFORE + DURING + 2 * AFTER} requests, {DURING} while PostgreSQL was down; per instance "
          f"(written, dropped) {counts}")


def test_the_dashboard_shows_the_fleet_and_its_drift(tmp_path: Path, postgres: Postgres, llama: str) -> None:
    """Two Switchyards on one shared ledger, the second serving a model more: the dashboard of
    the first, in a real browser, names both running and the second as configured otherwise,
    as `/admin/instances` does; and its figures, phases and tail are the fleet's: requests
    served by either, each row naming its instance."""
    tokens = tmp_path / "admin-tokens"
    token = admin_token(tokens)
    with contextlib.ExitStack() as stack, http_client(timeout=10.0) as http:
        admins, procs, urls = [], [], []
        for name, extra in (("studio-a", ""), ("studio-b", '[models.other]\nprimary = "llama"\n')):
            home = tmp_path / name
            home.mkdir()
            admin = f"127.0.0.1:{free_port()}"
            proxy = stack.enter_context(start_switchyard(
                home, config(name, home, llama, postgres.url, admin, tokens, extra), identities_settled("llama")))
            admins.append(f"http://{admin}")
            procs.append(proxy.proc)
            urls.append(proxy.url)
        headers = {"authorization": f"Bearer {token}"}

        def drift_seen() -> dict | None:
            view = http.get(f"{admins[0]}/admin/instances", headers=headers).json()
            return view if len(view.get("instances", [])) == 2 else None

        view = poll("both instances in the shared ledger", drift_seen, procs[0], timeout=RECORDED_TIMEOUT_S)
        assert view["drift"] == ["studio-b"], view
        # Requests through each instance: the dashboard's figures and tail are the fleet's.
        for i, proxy_url in enumerate(urls):
            for _ in range(i + 1):
                answer = http.post(f"{proxy_url}/v1/chat/completions", json={
                    "model": "smollm2", "messages": PROMPT, "max_tokens": MAX_TOKENS, "temperature": 0})
                assert answer.status_code == 200, answer.text

        def fleet_figures() -> dict | None:
            overview = http.get(f"{admins[0]}/admin/overview", headers=headers).json()
            stats = next(m["stats"] for m in overview["models"] if m["model"] == "smollm2")
            return overview if stats["requests"] == 3 else None

        overview = poll("the fleet's three requests in the overview", fleet_figures, procs[0], timeout=RECORDED_TIMEOUT_S)
        assert overview["figures_from"] == "fleet", overview
        tail = http.get(f"{admins[0]}/admin/requests", headers=headers).json()["requests"]
        assert sorted(r["instance"] for r in tail) == ["studio-a", "studio-b", "studio-b"], tail
        phases = http.get(f"{admins[0]}/admin/stats/phases", headers=headers).json()["groups"]
        assert sum(g["requests"] for g in phases if g["model"] == "smollm2") == 3, phases
        result = run_check("fleet", {"mode": "fleet", "admin": admins[0], "token": token})
        assert console_problems(result) == [], result
        assert result["login"]["opened"], result["login"]
        fleet = result["fleet"]
        assert (fleet["running"], fleet["drift"]) == (2, 1), fleet
        assert fleet["instances"] == ["studio-a", "studio-b"], fleet
        assert fleet["drifted"] == ["studio-b"], fleet
        assert "studio-a (this one)" in fleet["text"], fleet
        assert "every Switchyard of the fleet" in fleet["figures_from"], fleet
        assert fleet["requests"]["smollm2"] == "3", fleet
        assert fleet["tail_error"] == "" and fleet["tail_instances"] == ["studio-a", "studio-b"], fleet
        assert fleet["releases_error"] == "", fleet
        assert re.fullmatch(r"releases evaluated by studio-[ab]( \(this one\))?, for the whole fleet", fleet["evaluator"]), fleet
