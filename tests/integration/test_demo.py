"""`splitbrain demo` and `splitbrain dev up|down|status`, run as an operator runs them: the whole
stack (Kafka, PostgreSQL, Prometheus, Alertmanager, the detectors, the relay, the destination,
the pager bridge and the agents) on loopback, a live split-brain paged, and nothing left running
afterwards, also when the run is interrupted or cannot start."""

from __future__ import annotations

import fcntl
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.parse
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from detector.devstack.postgres import postgres_binaries
from detector.devstack.process import Pid, free_port
from detector.devstack.record import LOCK_FILE, load_record
from detector.histories.audit import audit_lines
from detector.testing.view import fetched
from tests.integration.test_page_bridge import active_alerts
from tests.paths import ROOT
from tests.tools import program

RUN_TIMEOUT_S = 240.0


def require_stack_tools() -> None:
    """The Debian packages the full stack runs (skip, or fail under SPLITBRAIN_REQUIRE_TOOLS)."""
    program("prometheus", package="prometheus")
    program("prometheus-alertmanager", "alertmanager", package="prometheus-alertmanager")
    postgres_binaries()


def command(*args: str) -> list[str]:
    return [sys.executable, "-m", "detector.cli", *args]


class Run:
    """A `splitbrain` command in a session of its own (as a terminal runs a foreground job),
    its output collected line by line as it comes."""

    def __init__(self, args: list[str], env: dict[str, str] | None = None) -> None:
        self.lines: list[str] = []
        self.proc = subprocess.Popen(
            args,
            cwd=ROOT,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    @property
    def output(self) -> str:
        return "\n".join(self.lines)

    def wait_for_line(self, pattern: str, timeout: float = RUN_TIMEOUT_S) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = next((line for line in self.lines if re.search(pattern, line)), None)
            if found is not None:
                return found
            assert self.proc.poll() is None or self._reader.is_alive(), (
                f"exited {self.proc.returncode} before printing {pattern!r}:\n{self.output}"
            )
            time.sleep(0.1)
        raise AssertionError(f"no line {pattern!r} in {timeout:.0f}s:\n{self.output}")

    def interrupt(self) -> None:
        """Ctrl-C in a terminal: SIGINT to the whole foreground process group."""
        os.killpg(self.proc.pid, signal.SIGINT)

    def wait(self, timeout: float = RUN_TIMEOUT_S) -> int:
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise
        self._reader.join(10)
        return code


def left_running(state_dir: Path, output: str) -> list[str]:
    """What the stack of `state_dir` left behind: recorded processes still running (every PID
    the command printed must be recorded), processes naming the state directory, PostgreSQL's
    directory."""
    record = load_record(state_dir)
    assert record is not None, f"no stack.json in {state_dir}"
    recorded: dict[int, Pid] = {}
    left = []
    for comp in record["components"]:
        for doc in comp["pids"]:
            pid = Pid.from_json(doc)
            recorded[pid.pid] = pid
            if pid.alive():
                left.append(f"{comp['name']} pid {pid.pid}")
        root = (comp.get("data") or {}).get("root")
        if root and Path(root).exists():
            left.append(f"{comp['name']} directory {root}")
    printed = {int(p) for p in re.findall(r"\bpid (\d+)", output)}
    assert printed <= set(recorded), f"printed but not recorded: {printed - set(recorded)}"
    needle = str(state_dir.resolve()).encode()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                cmdline = (entry / "cmdline").read_bytes()
            except OSError:
                continue
            if needle in cmdline and Pid.of(int(entry.name)).alive():
                words = cmdline.replace(b"\0", b" ")[:200]
                left.append(f"pid {entry.name}: {words!r}")
    return left


def test_the_demo_pages_a_live_split_brain_and_leaves_nothing_running(tmp_path: Path) -> None:
    require_stack_tools()
    state = tmp_path / "demo"
    started = time.monotonic()
    demo = Run(command("demo", "--non-interactive", "--state-dir", str(state)))
    try:
        demo.wait_for_line(r"the stack is up")
        # A second run on the same state directory, while the first one runs: one line, exit 2.
        second = subprocess.run(
            command("demo", "--non-interactive", "--state-dir", str(state)),
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert second.returncode == 2, second
        assert second.stdout == ""
        assert len(second.stderr.splitlines()) == 1, second.stderr
        assert "is in use by `splitbrain demo`" in second.stderr
        assert "--state-dir" in second.stderr
        # The page's link to the finding, opened while the view runs: the demo itself is held
        # (SIGSTOP to it alone) so that it cannot stop the stack before the page is fetched.
        link = demo.wait_for_line(r"the finding in the view: ").split()[-1]
        finding_id = urllib.parse.unquote(link.rsplit("/", 1)[-1])
        os.kill(demo.proc.pid, signal.SIGSTOP)
        try:
            page = fetched(link)
        finally:
            os.kill(demo.proc.pid, signal.SIGCONT)
        assert f'data-finding-id="{finding_id}"' in page, link
        code = demo.wait()
    finally:
        if demo.proc.poll() is None:
            demo.interrupt()
            demo.wait(60)
    elapsed = time.monotonic() - started
    out = demo.output
    assert code == 0, out
    # The fault happened live: paused inside a tool call, taken over, both committed.
    assert re.search(r"agent-2 \(pid \d+\) is inside its tool call .*: SIGSTOP", out), out
    assert re.search(r"agent-\d claimed job .* \(token 2\)", out), out
    assert "SIGCONT agent-2" in out
    assert "committed the payment a second time, under the stale token 1" in out
    # The finding's revision, as `tail` prints it, and the alert as Alertmanager holds it.
    assert re.search(
        r"finding: CRITICAL .* rev \d+ open confidence=high conditions=.*stale_effect_committed",
        out,
    ), out
    assert re.search(r"events: \d+ processed, [\d.]+/s", out), out
    critical_alert = "SplitbrainCriticalFinding (active): job=splitbrain severity=page"
    assert f"alertmanager holds {critical_alert}" in out, out
    assert re.search(r"alertmanager holds SplitbrainFinding \(active\):.* severity=page", out), out
    assert re.search(r"PAGED: the critical finding reached Alertmanager", out), out
    for url in (
        "Prometheus (alerts)",
        "Alertmanager",
        "findings view",
        "detector-1 metrics",
        "detector-2 metrics",
    ):
        assert re.search(rf"{re.escape(url)}\s+http://127\.0\.0\.1:\d+/", out), url
    assert left_running(state, out) == []
    print(f"demo: exit 0 in {elapsed:.1f}s")


@pytest.mark.parametrize("moment", [r"started kafka", r"SIGSTOP"], ids=["starting", "paused"])
def test_ctrl_c_at_any_moment_stops_everything(moment: str, tmp_path: Path) -> None:
    require_stack_tools()
    state = tmp_path / "demo"
    demo = Run(command("demo", "--non-interactive", "--state-dir", str(state)))
    try:
        demo.wait_for_line(moment)
        demo.interrupt()
        code = demo.wait(90)
    finally:
        if demo.proc.poll() is None:
            demo.proc.kill()
    out = demo.output
    assert code == 130, out
    assert "interrupted: stopping everything" in out
    assert "no process of the demo is left running" in out
    assert left_running(state, out) == []


def one_line_failure(run: subprocess.CompletedProcess[str], *words: str) -> None:
    assert run.returncode == 2, run
    assert run.stdout == "", run.stdout
    assert len(run.stderr.splitlines()) == 1, run.stderr
    assert run.stderr.startswith("splitbrain demo: ")
    for word in words:
        assert word in run.stderr, run.stderr


def demo_now(
    state: Path, *extra: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        command("demo", "--non-interactive", "--state-dir", str(state), *extra),
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.mark.parametrize("java_home", [None, "empty"], ids=["no-java-on-path", "bad-java-home"])
def test_without_java_the_demo_fails_in_one_line(java_home: str | None, tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "JAVA_HOME"}
    env["PATH"] = str(tmp_path / "empty-bin")  # no java (nor anything else) on PATH
    if java_home is not None:
        (tmp_path / java_home).mkdir()
        env["JAVA_HOME"] = str(tmp_path / java_home)
    state = tmp_path / "demo"
    run = demo_now(state, env=env)
    one_line_failure(run, "Java 17+", "JAVA_HOME", "openjdk-17-jre-headless")
    assert load_record(state) is None  # nothing was started


def test_a_busy_port_fails_in_one_line(tmp_path: Path) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as busy:
        busy.bind(("127.0.0.1", free_port()))
        busy.listen()
        port = busy.getsockname()[1]
        state = tmp_path / "demo"
        run = demo_now(state, "--prometheus-port", str(port))
    one_line_failure(run, f"port {port}", "--prometheus-port", "in use")
    assert load_record(state) is None


@contextmanager
def held_lock(state: Path) -> Iterator[None]:
    state.mkdir(parents=True)
    with (state / LOCK_FILE).open("a+") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        handle.write("`splitbrain demo` (pid 1)\n")
        handle.flush()
        yield


def test_a_second_run_on_the_same_state_dir_fails_in_one_line(tmp_path: Path) -> None:
    state = tmp_path / "demo"
    with held_lock(state):
        run = demo_now(state)
    one_line_failure(run, "is in use by `splitbrain demo` (pid 1)", "--state-dir")
    assert load_record(state) is None


def run_source_demo(tmp_path: Path, source: str) -> str:
    """`demo --source SOURCE` to its end: exit 0, the page it names, nothing left running."""
    state = tmp_path / "demo"
    demo = Run(command("demo", "--non-interactive", "--source", source, "--state-dir", str(state)))
    try:
        code = demo.wait()
    finally:
        if demo.proc.poll() is None:
            demo.interrupt()
            demo.wait(60)
    out = demo.output
    assert code == 0, out
    assert re.search(
        rf"PAGED: the critical finding reached Alertmanager .* {source} zombie", out
    ), out
    assert left_running(state, out) == []
    return out


def test_the_celery_demo_pages_a_redelivered_task_and_leaves_nothing_running(
    tmp_path: Path,
) -> None:
    require_stack_tools()
    program("redis-server", package="redis-server")
    pytest.importorskip("celery", reason="the celery extra is not installed (.[celery])")
    out = run_source_demo(tmp_path, "celery")
    # The zombie, live: one worker past the visibility timeout, the other redelivered; both send.
    assert re.search(r"started redis +redis://127\.0\.0\.1:\d+/0 \(pid \d+\)", out), out
    assert re.search(r"celery-\d: epoch 2: sent the email to a@example\.com", out), out
    assert re.search(r"celery-\d: epoch 1: sent the email to a@example\.com", out), out
    assert out.index("epoch 2: sent the email") < out.index("epoch 1: sent the email"), out
    assert re.search(
        r"finding: CRITICAL .* conditions=.*stale_effect_committed.*duplicate_effect", out
    ), out


def test_the_langgraph_demo_pages_a_forked_thread_and_leaves_nothing_running(
    tmp_path: Path,
) -> None:
    require_stack_tools()
    pytest.importorskip("langgraph", reason="the langgraph extra is not installed (.[langgraph])")
    out = run_source_demo(tmp_path, "langgraph")
    # The zombie, live: both pods answered with their own work on one thread.
    assert re.search(r"pod-a answered \['planned', 'work by pod-a', 'replied'\]", out), out
    assert re.search(r"pod-b answered \['planned', 'work by pod-b', 'replied'\]", out), out
    assert re.search(
        r"finding: CRITICAL support-ticket-\w+ .* conditions=.*duplicate_effect", out
    ), out


def test_the_temporal_demo_pages_a_zombie_attempt_and_leaves_nothing_running(
    tmp_path: Path,
) -> None:
    require_stack_tools()
    pytest.importorskip("temporalio", reason="the temporal extra is not installed (.[temporal])")
    out = run_source_demo(tmp_path, "temporal")
    # The zombie, live: attempt 1 stalls past its heartbeat timeout, attempt 2 charges on the
    # other worker, then attempt 1 charges again.
    assert re.search(r"started temporal +the test server, 127\.0\.0\.1:\d+ \(pid \d+\)", out), out
    first = re.search(r"attempt 1 of charge\(o1\) started on (temporal-worker-\d)", out)
    second = re.search(r"attempt 2 of charge\(o1\) started on (temporal-worker-\d)", out)
    assert first and second and first[1] != second[1], out
    assert out.index("attempt 2 charged o1") < out.index("attempt 1 woke up and charged o1"), out
    assert re.search(
        r"finding: CRITICAL .* conditions=.*stale_effect_committed.*duplicate_effect", out
    ), out


def test_the_etcd_demo_pages_a_lock_holder_paused_past_its_lease_and_leaves_nothing_running(
    tmp_path: Path,
) -> None:
    require_stack_tools()
    pytest.importorskip("etcd3gw", reason="the etcd extra is not installed (.[etcd])")
    from detector.devstack.etcd import LocalEtcdError, etcd_binary  # noqa: PLC0415

    try:
        etcd_binary()
    except LocalEtcdError as exc:
        pytest.skip(str(exc))
    out = run_source_demo(tmp_path, "etcd")
    # The zombie, live: A's lease expires while it pauses, B takes the lock, A writes again.
    assert re.search(r"started etcd +http://127\.0\.0\.1:\d+ \(pid \d+\)", out), out
    assert re.search(r"started watch-etcd +splitbrain watch etcd --prefix /locks/payments", out)
    a = re.search(r"holder A took /locks/payments \(create_revision (\d+),", out)
    b = re.search(r"holder B took /locks/payments \(create_revision (\d+)\)", out)
    assert a and b and int(a[1]) < int(b[1]), out
    assert out.index("holder B took") < out.index("holder A woke up and charged"), out
    assert re.search(r"finding: CRITICAL .* conditions=.*stale_effect_committed", out), out


def test_the_redis_lock_demo_pages_a_holder_paused_past_its_timeout_and_leaves_nothing_running(
    tmp_path: Path,
) -> None:
    require_stack_tools()
    program("redis-server", package="redis-server")
    pytest.importorskip("redis", reason="the redis-lock extra is not installed (.[redis-lock])")
    out = run_source_demo(tmp_path, "redis-lock")
    # The zombie, live: A's key expires while it pauses, B takes the lock, A charges again.
    assert re.search(r"started redis +redis://127\.0\.0\.1:\d+/0 \(pid \d+\)", out), out
    assert re.search(r"holder A took the lock payments \(fence 1, timeout 2s\)", out), out
    assert re.search(r"holder B took the lock payments \(fence 2\)", out), out
    assert out.index("holder B charged") < out.index("holder A woke up and charged"), out
    assert re.search(
        r"finding: CRITICAL .* conditions=.*stale_effect_committed.*duplicate_effect", out
    ), out


def test_the_kafka_consumer_demo_pages_a_member_past_max_poll_and_leaves_nothing_running(
    tmp_path: Path,
) -> None:
    require_stack_tools()
    out = run_source_demo(tmp_path, "kafka-consumer")
    # The zombie, live: A stalls past max.poll.interval.ms, B takes the partition, A charges.
    a = re.search(r"member A got orders-\w+/0 at generation (\d+)", out)
    b = re.search(r"member B got orders-\w+/0 at generation (\d+)", out)
    assert a and b and int(a[1]) < int(b[1]), out
    assert out.index("member B charged pay-0") < out.index("member A finished its batch"), out
    assert re.search(
        r"finding: CRITICAL .* conditions=.*stale_effect_committed.*duplicate_effect", out
    ), out


def kube_apiserver_missing() -> str | None:
    """Why this machine has no kube-apiserver (scripts/build-kube-apiserver.sh), or None."""
    from detector.devstack.kube_apiserver import (  # noqa: PLC0415
        LocalKubeApiServerError,
        kube_apiserver_binary,
    )

    try:
        kube_apiserver_binary()
    except LocalKubeApiServerError as exc:
        return str(exc)
    return None


@pytest.mark.slow
def test_the_kubernetes_demo_pages_a_paused_leader_and_leaves_nothing_running(
    tmp_path: Path,
) -> None:
    require_stack_tools()
    pytest.importorskip("kubernetes", reason="the kubernetes extra is not installed")
    missing = kube_apiserver_missing()
    if missing is not None:
        pytest.skip(missing)
    out = run_source_demo(tmp_path, "kubernetes")
    # The zombie, live: the leader paused past its Lease, the other took it, the first resumed.
    assert re.search(r"started kube-apiserver https://127\.0\.0\.1:\d+ \(pid \d+\)", out)
    paused = re.search(r"(pod-[ab]) leads and works; pausing it \(SIGSTOP\)", out)
    assert paused, out
    other = "pod-b" if paused[1] == "pod-a" else "pod-a"
    assert f"{other} took the Lease and works" in out, out
    assert f"{paused[1]} resumes (SIGCONT): it still believes it leads" in out, out
    assert re.search(r"finding: CRITICAL .* conditions=.*stale_effect_committed", out), out


def test_the_kubernetes_demo_without_a_built_api_server_fails_in_one_line(
    tmp_path: Path,
) -> None:
    pytest.importorskip("kubernetes", reason="the kubernetes extra is not installed")
    # An empty cache: the build script's --print-path names a binary that is not there.
    env = {**os.environ, "SPLITBRAIN_CACHE": str(tmp_path / "empty-cache")}
    state = tmp_path / "demo"
    run = demo_now(state, "--source", "kubernetes", env=env)
    one_line_failure(
        run, "--source kubernetes", "kube-apiserver is not built", "build-kube-apiserver.sh"
    )
    assert load_record(state) is None  # nothing was started


def test_a_source_this_machine_cannot_run_fails_in_one_line(tmp_path: Path) -> None:
    pytest.importorskip("celery", reason="the celery extra is not installed (.[celery])")
    env = {**os.environ, "PATH": str(tmp_path / "empty-bin")}  # no redis-server on PATH
    state = tmp_path / "demo"
    run = demo_now(state, "--source", "celery", env=env)
    one_line_failure(run, "--source celery", "redis-server", "apt-get install")
    assert load_record(state) is None  # nothing was started


# In the slow job: in a full CI run of 2026-12-05 (one of four since `dev up` waits until every
# broker knows every topic of topics.yaml) a detector worker still exited at start with "Unknown
# topic or partition" from the three-broker cluster it had just joined. Which topic, and why
# the worker takes it as fatal at start, is not known yet.
@pytest.mark.slow
def test_dev_up_on_three_brokers_pages_a_replayed_finding_and_down_stops_it_all(
    tmp_path: Path,
) -> None:
    """`dev up --brokers 3`: the stack on a KRaft cluster with the topics' default profile
    (the single broker is the demo's, tested above); a history replayed into it is detected and
    paged; `dev down` stops it all by PID, each broker cleanly (none is left to SIGKILL once the
    other two have gone)."""
    require_stack_tools()
    state = tmp_path / "dev"
    history = ROOT / "examples" / "export-ledger.jsonl"
    expected = set(audit_lines(history.read_bytes().splitlines()).findings)  # one critical

    def dev(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            command("dev", *args, "--state-dir", str(state)),
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=240,
            check=False,
        )

    up = dev("up", "--brokers", "3")
    try:
        assert up.returncode == 0, up
        assert "(profile default)" in up.stdout
        bootstrap = re.search(r"export SPLITBRAIN_BOOTSTRAP_SERVERS=(\S+)", up.stdout)
        assert bootstrap and bootstrap[1].count(",") == 2, up.stdout
        assert "export SPLITBRAIN_LEASES_DSN=" in up.stdout
        status = dev("status")
        assert status.returncode == 0, status
        names = [line.split()[0] for line in status.stdout.splitlines()[:-1]]
        assert names == [
            *("postgres", "kafka", "destination", "relay", "detector-1", "detector-2"),
            *("alertmanager", "prometheus", "pager"),
        ], status.stdout
        assert all(" running " in line for line in status.stdout.splitlines()[:-1])
        again = dev("up")
        assert again.returncode == 2, again
        assert "a stack already runs" in again.stderr

        env = {**os.environ, "SPLITBRAIN_BOOTSTRAP_SERVERS": bootstrap[1]}
        replayed = subprocess.run(
            command("replay", str(history)),
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert replayed.returncode == 0, replayed
        record = load_record(state)
        assert record is not None
        am_url = next(c for c in record["components"] if c["name"] == "alertmanager")["urls"]
        deadline = time.monotonic() + RUN_TIMEOUT_S
        while set(active_alerts(am_url["url"])) != expected:
            assert time.monotonic() < deadline, f"not paged:\n{replayed.stdout}"
            time.sleep(1.0)
    finally:
        down = dev("down")
    assert down.returncode == 0, down
    assert "stopped 9 component(s)" in down.stdout
    assert left_running(state, up.stdout) == []
    logs = sorted((state / "kafka").glob("broker-*/logs/server.log"))
    assert len(logs) == 3
    for log in logs:
        assert "] shut down completed" in log.read_text(errors="replace"), log
    after = dev("status")
    assert after.returncode == 1
    assert "0 of 9 component(s) running" in after.stdout
    assert dev("down").stdout.startswith("nothing runs in")
