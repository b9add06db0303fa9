"""A real, local, single-node Apache Kafka broker (KRaft) for development and integration tests.

Why this exists: the detector's guarantees (transactions, fencing, read_committed) are Kafka's,
so they must be tested against a real broker, not a fake. There is no Docker here, so the broker
runs from the official jars that Maven resolves from `pom.xml` beside this module (shipped in the
wheel, so `splitbrain dev kafka` works from an install too), in a background JVM that this module
starts, watches and stops by PID. Everything a broker owns (config, logs, data, TLS
material, pid and state files) lives in one data directory, so a broker can be killed and
restarted on the same data and ports for fault tests.

`pom.xml` pins the project's broker. `pom-kafka4.xml` pins a Kafka 4.x one for what only 4.x
serves (the consumer group protocol of KIP-848); `LocalKafka(pom=KAFKA4_POM)` runs it the same
way, from its own cache, with the log4j 2 configuration that Kafka 4 reads.
"""

from __future__ import annotations

import base64
import contextlib
import datetime
import fcntl
import hashlib
import ipaddress
import json
import os
import secrets
import shutil
import signal
import subprocess
import time
import uuid
import xml.etree.ElementTree as ET
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import psutil

from detector.devstack import process
from detector.errors import SplitbrainError

POM_PATH = Path(__file__).resolve().with_name("pom.xml")
KAFKA4_POM = POM_PATH.with_name("pom-kafka4.xml")
JARS_ENV = "SPLITBRAIN_KAFKA_JARS"
JARS_MARKER = ".complete"
SCRAM_MECHANISM = "SCRAM-SHA-512"
SCRAM_USERNAME = "alice"

_BROKER_MAIN = "kafka.Kafka"
_STORAGE_TOOL_MAIN = "kafka.tools.StorageTool"
_ACL_TOOL_MAIN = "kafka.admin.AclCommand"  # what kafka-acls.sh runs
_STATE_FILE = "state.json"
_PID_FILE = "kafka.pid"
_SERVER_PROPERTIES = "server.properties"
_CLIENT_PROPERTIES = "client.properties"
_BROKER_OUT = "broker.out"
_JVM_FLAGS = (
    "-XX:+UseG1GC",
    "-XX:MaxGCPauseMillis=20",
    "-XX:+ExplicitGCInvokesConcurrent",
    "-XX:TieredStopAtLevel=1",  # C1 only: a dev broker starts faster and never runs long.
    "-Djava.awt.headless=true",
    "-Djava.net.preferIPv4Stack=true",
)


ClientConfig = dict[str, str | int | float | bool]
"""librdkafka settings, typed as confluent-kafka's Producer/Consumer/AdminClient take them."""


class DevKafkaError(SplitbrainError, RuntimeError):
    """The local broker could not be provisioned, started or reached."""


# --------------------------------------------------------------------------------------- jars


def kafka_version(pom: Path = POM_PATH) -> str:
    """The pinned Kafka version, read from the pom so that the pom is the one place it lives."""
    ns = {"m": "http://maven.apache.org/POM/4.0.0"}
    root = ET.parse(pom).getroot()
    for dep in root.iterfind("m:dependencies/m:dependency", ns):
        if dep.findtext("m:artifactId", namespaces=ns) == "kafka_2.13":
            version = dep.findtext("m:version", namespaces=ns)
            if version:
                return version.strip()
    raise DevKafkaError(f"{pom}: no org.apache.kafka:kafka_2.13 dependency with a version")


def jars_dir(pom: Path = POM_PATH) -> Path:
    """Where the broker's jars are cached: `$SPLITBRAIN_KAFKA_JARS`, else in the user's cache
    (`$XDG_CACHE_HOME`, by default `~/.cache`), shared by every checkout and install, one
    directory a version. The override names the pinned broker's jars only: another pom's on the
    same classpath would mix two Kafkas."""
    override = os.environ.get(JARS_ENV)
    if override and pom == POM_PATH:
        return Path(override).expanduser().resolve()
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "splitbrain" / "kafka-jars" / kafka_version(pom)


def uses_log4j2(pom: Path = POM_PATH) -> bool:
    """Kafka 4 logs through log4j 2 (KIP-653); 3.x through log4j 1's API (reload4j here)."""
    return int(kafka_version(pom).split(".", 1)[0]) >= 4


def ensure_jars(pom: Path = POM_PATH) -> Path:
    """Resolve the broker's jars with Maven unless a complete cache for this pom already exists.

    Idempotent and safe to race: a file lock serialises concurrent callers, and the marker file
    (holding the pom's digest) is written only after Maven succeeded, so a half-filled cache or
    one from an edited pom is refilled rather than trusted.
    """
    dest = jars_dir(pom)
    marker = dest / JARS_MARKER
    digest = hashlib.sha256(pom.read_bytes()).hexdigest()
    if _marker_ok(marker, digest):
        return dest
    mvn = shutil.which("mvn")
    if mvn is None:
        raise DevKafkaError("Maven (`mvn`) is not on PATH; install it (apt-get install maven)")
    dest.mkdir(parents=True, exist_ok=True)
    with _file_lock(dest.parent / f".{dest.name}.lock"):
        if _marker_ok(marker, digest):
            return dest
        marker.unlink(missing_ok=True)
        cmd = [
            mvn,
            "-q",
            "-B",
            "-f",
            str(pom),
            "dependency:copy-dependencies",
            f"-DoutputDirectory={dest}",
        ]
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            tail = (proc.stdout + proc.stderr).strip().splitlines()[-30:]
            raise DevKafkaError(
                f"`{' '.join(cmd)}` failed (exit {proc.returncode}):\n" + "\n".join(tail)
            )
        if not any(dest.glob("kafka_2.13-*.jar")):
            raise DevKafkaError(f"Maven succeeded but left no kafka_2.13 jar in {dest}")
        marker.write_text(digest + "\n")
    return dest


def _marker_ok(marker: Path, digest: str) -> bool:
    try:
        return marker.read_text().strip() == digest
    except OSError:
        return False


@contextlib.contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    with path.open("a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


# ----------------------------------------------------------------------------- TLS material


@dataclass(frozen=True)
class TlsFiles:
    """A throwaway CA and a server certificate for 127.0.0.1/localhost, as Kafka wants them."""

    ca_cert: Path
    keystore: Path


def make_tls_files(directory: Path) -> TlsFiles:
    """Generate a CA (for clients) and the broker's PEM keystore (key + chain) in `directory`.

    Kafka 3.9 reads `ssl.keystore.type=PEM` from a file holding an unencrypted PKCS#8 key and
    the certificate chain, so no keystore password has to be invented, stored or passed around;
    the key file is mode 0600 inside a throwaway data directory.
    """
    # Imported here: only the SASL_SSL mode needs it, and it is a dev dependency.
    from cryptography import x509  # noqa: PLC0415
    from cryptography.hazmat.primitives import hashes, serialization  # noqa: PLC0415
    from cryptography.hazmat.primitives.asymmetric import ec  # noqa: PLC0415
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID  # noqa: PLC0415

    directory.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.UTC)
    not_before = now - datetime.timedelta(minutes=5)
    not_after = now + datetime.timedelta(days=365)

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "splitbrain dev Kafka CA")])
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before)
        .not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .sign(ca_key, hashes.SHA256())
    )

    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before)
        .not_valid_after(not_after)
        .add_extension(
            x509.SubjectAlternativeName(
                [
                    x509.DNSName("localhost"),
                    x509.IPAddress(ipaddress.IPv4Address("127.0.0.1")),
                ]
            ),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )

    pem = serialization.Encoding.PEM
    ca_path = directory / "ca.pem"
    ca_path.write_bytes(ca_cert.public_bytes(pem))
    keystore = directory / "server-keystore.pem"
    keystore.touch(mode=0o600)
    keystore.write_bytes(
        key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
        + cert.public_bytes(pem)
        + ca_cert.public_bytes(pem)
    )
    return TlsFiles(ca_cert=ca_path, keystore=keystore)


# ---------------------------------------------------------------------------------- broker


@dataclass(frozen=True)
class KafkaStatus:
    """What `status()` reports: whether the broker process is alive, and where to reach it."""

    running: bool
    pid: int | None
    bootstrap: str | None
    sasl_ssl: bool
    data_dir: Path


def new_cluster_id() -> str:
    """A Kafka cluster id: a random UUID in URL-safe base64 without padding (22 characters).

    Like Kafka's own `Uuid.randomUuid`, never one that starts with "-": the storage tool's
    argument parser would read it as an option (1 start in 64 failed that way).
    """
    while True:
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
        if not cluster_id.startswith("-"):
            return cluster_id


@dataclass(frozen=True)
class Seat:
    """A node's place in a multi-node cluster (`detector.devstack.kafka_cluster`): its id, its own
    ports, the quorum's voters and the cluster id every node is formatted with, and the
    replication of the internal topics (3: the production settings)."""

    node_id: int
    broker_port: int
    controller_port: int
    voters: str
    cluster_id: str
    replication: int


class LocalKafka:
    """One KRaft broker (broker + controller in one JVM) owning one data directory.

    The data directory is the broker's identity: ports, mode and credentials are chosen once,
    saved in `state.json`, and reused by every later start, so a restart after `kill -9` comes
    back on the same address with the same data. A separate process (the CLI's `stop`) can
    manage a broker started elsewhere, by reading the pid file.
    """

    def __init__(
        self,
        data_dir: Path | str,
        *,
        sasl_ssl: bool | None = None,
        acl_users: Sequence[str] = (),
        heap_mb: int = 512,
        start_timeout: float = 90.0,
        jars: Path | None = None,
        extra_jvm_args: Sequence[str] = (),
        seat: Seat | None = None,
        pom: Path = POM_PATH,
        broker_config: Mapping[str, str] | None = None,
    ) -> None:
        """`sasl_ssl=None` means "whatever this data directory was formatted for, else plain".

        `acl_users` (SASL_SSL only) turns the broker's ACL authorizer on: each name becomes a
        SCRAM user with no permission until ACLs grant one, and the default user stays a super
        user, to create topics and grant ACLs (`kafka_acls_argv`). They are chosen when the data
        directory is first set up, as the mode is.

        `extra_jvm_args` go after the defaults, so they win (e.g. `-XX:TieredStopAtLevel=4`
        to give a benchmark the full JIT instead of the quick-start C1-only default).

        `seat` makes this broker one node of a cluster (PLAINTEXT only); without it the broker
        is its own single-node cluster. Like the mode, it is fixed when the directory is set up.

        `pom` says which Kafka runs: the pinned one, or `KAFKA4_POM`'s 4.x. A data directory
        stays with the version that formatted it.

        `broker_config` goes into server.properties after the defaults, so it wins (a
        benchmark's broker tuned as an operator would tune theirs).
        """
        self.data_dir = Path(data_dir).resolve()
        self.heap_mb = heap_mb
        self.extra_jvm_args = tuple(extra_jvm_args)
        self.broker_config = dict(broker_config or {})
        self.start_timeout = start_timeout
        self._jars = jars
        self._pom = pom
        self._log4j2 = uses_log4j2(pom)
        self._proc: subprocess.Popen[bytes] | None = None
        self._state: dict[str, Any] = self._load_state()
        saved_mode = self._state.get("sasl_ssl")
        if sasl_ssl is not None and saved_mode is not None and bool(saved_mode) != sasl_ssl:
            have, want = ("PLAINTEXT", "SASL_SSL") if sasl_ssl else ("SASL_SSL", "PLAINTEXT")
            raise DevKafkaError(
                f"{self.data_dir} holds a {have} broker; a {want} one needs another data dir"
            )
        self.sasl_ssl: bool = bool(saved_mode) if saved_mode is not None else bool(sasl_ssl)
        if acl_users and not self.sasl_ssl:
            raise DevKafkaError("ACLs need authenticated users: start the broker with sasl_ssl")
        self._acl_users = tuple(acl_users)
        if seat is not None and self.sasl_ssl:
            raise DevKafkaError("a multi-node cluster is PLAINTEXT only")
        self._seat = seat

    # -- paths and addresses ------------------------------------------------------------------

    @property
    def log_path(self) -> Path:
        """The broker's own log (log4j), the first place to look when it misbehaves."""
        return self.data_dir / "logs" / "server.log"

    @property
    def pid_path(self) -> Path:
        return self.data_dir / _PID_FILE

    @property
    def bootstrap(self) -> str:
        """`host:port` of the client listener (PLAINTEXT, or SASL_SSL in the secure mode)."""
        port = self._state.get("broker_port")
        if port is None:
            raise DevKafkaError(f"no broker has been set up in {self.data_dir} yet")
        return f"127.0.0.1:{port}"

    @property
    def ca_path(self) -> Path:
        """The PEM CA that signed the broker's certificate (SASL_SSL mode only)."""
        return Path(self._secured("ca_cert", "TLS"))

    @property
    def sasl_username(self) -> str:
        return SCRAM_USERNAME

    @property
    def sasl_password(self) -> str:
        return self._secured("scram_password", "SASL")

    def _secured(self, key: str, listener: str) -> str:
        """A SASL_SSL setting of the broker, from its state; an error if it has none."""
        value = self._state.get(key)
        if not self.sasl_ssl or value is None:
            raise DevKafkaError(
                f"this broker has no {listener} listener (start it with sasl_ssl=True)"
            )
        return str(value)

    def client_config(self, user: str | None = None) -> ClientConfig:
        """librdkafka settings that reach this broker, with the right credentials if secured:
        the default (super) user's, or those of one of the `acl_users`."""
        conf: ClientConfig = {"bootstrap.servers": self.bootstrap}
        if self.sasl_ssl:
            username, password = self.sasl_username, self.sasl_password
            if user is not None:
                users: dict[str, str] = self._state.get("acl_users", {})
                if user not in users:
                    raise DevKafkaError(f"this broker has no user {user!r}")
                username, password = user, users[user]
            conf.update(
                {
                    "security.protocol": "SASL_SSL",
                    "sasl.mechanism": SCRAM_MECHANISM,
                    "sasl.username": username,
                    "sasl.password": password,
                    "ssl.ca.location": str(self.ca_path),
                }
            )
        return conf

    def java_admin_config(self) -> Path:
        """A Java client's config file with the super user's credentials: what
        `kafka-acls.sh --command-config` takes (Java clients read other keys than librdkafka)."""
        path = self.data_dir / "admin-java.properties"
        path.write_text(
            "security.protocol=SASL_SSL\n"
            f"sasl.mechanism={SCRAM_MECHANISM}\n"
            "sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required "
            f'username="{self.sasl_username}" password="{self.sasl_password}";\n'
            "ssl.truststore.type=PEM\n"
            f"ssl.truststore.location={self.ca_path}\n"
        )
        path.chmod(0o600)
        return path

    def kafka_acls_argv(self) -> list[str]:
        """What `kafka-acls.sh` runs, from the same jars as the broker: append its arguments."""
        log4j = self._write_tool_log4j()
        return [*self._java(ensure_jars(self._pom), heap_mb=256, log4j=log4j), _ACL_TOOL_MAIN]

    # -- lifecycle ----------------------------------------------------------------------------

    def start(self, *, wait: bool = True) -> str:
        """Provision if needed, start the JVM in the background, wait until it serves metadata.

        Returns the bootstrap address. Raises if a broker already runs on this data directory;
        if the broker does not come up, kills it (no orphan JVM) and raises with its log tail.
        `wait=False` only spawns it: a cluster's first node cannot serve before a quorum of
        the others runs too, so the cluster starts them all, then waits.
        """
        if self.pid() is not None:
            raise DevKafkaError(f"a broker already runs on {self.data_dir} (pid {self.pid()})")
        jars = self._jars or ensure_jars(self._pom)
        self.data_dir.mkdir(parents=True, exist_ok=True)
        if not self._state.get("formatted"):
            self._provision(jars)
        self._write_broker_config()
        self._spawn(jars)
        if not wait:
            return self.bootstrap
        try:
            self.wait_ready()
        except BaseException:
            if self.pid() is not None:
                self.kill()
            raise
        return self.bootstrap

    def stop(self, timeout: float = 30.0) -> bool:
        """SIGTERM (a clean shutdown), then SIGKILL after `timeout`. False if nothing ran."""
        pid = self.pid()
        if pid is None:
            self._forget_pid()
            return False
        started = process.Pid.of(pid)
        self._signal(pid, signal.SIGTERM)
        self._signal(pid, signal.SIGCONT)  # a paused JVM cannot act on SIGTERM
        if not self._wait_dead(started, timeout):
            self._signal(pid, signal.SIGKILL)
            if not self._wait_dead(started, 10.0):
                raise DevKafkaError(f"broker pid {pid} survived SIGKILL")
        self._forget_pid()
        return True

    def kill(self) -> None:
        """`kill -9` the broker: no clean shutdown, as a crash or an OOM-killer would do."""
        pid = self.pid()
        if pid is None:
            raise DevKafkaError(f"no broker runs on {self.data_dir}")
        started = process.Pid.of(pid)
        self._signal(pid, signal.SIGKILL)
        if not self._wait_dead(started, 10.0):
            raise DevKafkaError(f"broker pid {pid} survived SIGKILL")
        self._forget_pid()

    def kill_and_restart(self) -> str:
        """Crash the broker and start it again on the same data and ports (for fault tests)."""
        self.kill()
        return self.start()

    def pause(self) -> None:
        """SIGSTOP the JVM: it keeps its sockets but answers nothing (a stalled broker)."""
        self._signal(self._require_pid(), signal.SIGSTOP)

    def resume(self) -> None:
        """SIGCONT a paused broker."""
        self._signal(self._require_pid(), signal.SIGCONT)

    def status(self) -> KafkaStatus:
        """Alive or not, by PID (not by probing the port: a paused broker still counts)."""
        pid = self.pid()
        return KafkaStatus(
            running=pid is not None,
            pid=pid,
            bootstrap=self.bootstrap if "broker_port" in self._state else None,
            sasl_ssl=self.sasl_ssl,
            data_dir=self.data_dir,
        )

    def pid(self) -> int | None:
        """The broker's PID if that process is alive and really is this data dir's broker."""
        if self._proc is not None and self._proc.poll() is None:
            return self._proc.pid
        try:
            pid = int(self.pid_path.read_text().strip())
        except (OSError, ValueError):
            return None
        return pid if self._is_our_broker(pid) else None

    def wait_ready(self, timeout: float | None = None) -> None:
        """Block until a metadata request succeeds; fail fast, with the log tail, if it dies."""
        deadline = time.monotonic() + (self.start_timeout if timeout is None else timeout)
        port = int(self.bootstrap.rsplit(":", 1)[1])
        while not process.port_open(port):
            self._check_alive_or_raise()
            if time.monotonic() > deadline:
                raise self._failure("did not open its client port in time")
            time.sleep(0.1)

        from confluent_kafka.admin import AdminClient  # noqa: PLC0415

        admin = AdminClient({**self.client_config(), "socket.timeout.ms": 5000})
        last_error: Exception | None = None
        while time.monotonic() < deadline:
            self._check_alive_or_raise()
            try:
                metadata = admin.list_topics(
                    timeout=max(1.0, min(5.0, deadline - time.monotonic()))
                )
                if metadata.brokers:
                    return
            except Exception as exc:  # KafkaException; librdkafka retries while the broker boots
                last_error = exc
            time.sleep(0.2)
        raise self._failure(f"did not answer a metadata request in time (last error: {last_error})")

    def log_tail(self, lines: int = 40) -> str:
        """The end of the broker's log and of its stdout/stderr, for error messages."""
        parts = []
        for path in (self.log_path, self.data_dir / _BROKER_OUT):
            try:
                text = path.read_text(errors="replace").splitlines()[-lines:]
            except OSError:
                continue
            parts.append(f"--- {path} (last {len(text)} lines)\n" + "\n".join(text))
        return "\n".join(parts) or "(no broker log yet)"

    # -- internals ----------------------------------------------------------------------------

    def _provision(self, jars: Path) -> None:
        """First start on this data directory: choose ports, write TLS/creds, format storage."""
        ports: set[int] = set()
        while len(ports) < 3:  # the OS may hand the same free port out twice
            ports.add(process.free_port())
        broker_port, controller_port, internal_port = sorted(ports)
        state: dict[str, Any] = {
            "kafka_version": kafka_version(self._pom),
            "sasl_ssl": self.sasl_ssl,
            "broker_port": broker_port,
            "controller_port": controller_port,
            "cluster_id": new_cluster_id(),
        }
        if self._seat is not None:
            state.update(
                broker_port=self._seat.broker_port,
                controller_port=self._seat.controller_port,
                cluster_id=self._seat.cluster_id,
                node_id=self._seat.node_id,
                voters=self._seat.voters,
                replication=self._seat.replication,
            )
        if self.sasl_ssl:
            state["internal_port"] = internal_port
            tls = make_tls_files(self.data_dir / "tls")
            state["ca_cert"] = str(tls.ca_cert)
            state["keystore"] = str(tls.keystore)
            state["scram_password"] = secrets.token_hex(16)
            state["acl_users"] = {name: secrets.token_hex(16) for name in self._acl_users}
        self._state = state
        self._write_broker_config()
        cmd = [
            *self._java(jars, heap_mb=256, log4j=self._write_tool_log4j()),
            _STORAGE_TOOL_MAIN,
            "format",
            "--cluster-id",
            str(state["cluster_id"]),
            "--config",
            str(self.data_dir / _SERVER_PROPERTIES),
            "--ignore-formatted",
        ]
        if self.sasl_ssl:
            cmd += [
                "--add-scram",
                f"{SCRAM_MECHANISM}=[name={SCRAM_USERNAME},password={state['scram_password']}]",
            ]
            for name, password in state["acl_users"].items():
                cmd += ["--add-scram", f"{SCRAM_MECHANISM}=[name={name},password={password}]"]
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            raise DevKafkaError(
                f"formatting {self.data_dir} failed (exit {proc.returncode}):\n"
                + (proc.stdout + proc.stderr).strip()
            )
        state["formatted"] = True
        self._save_state()

    def _write_broker_config(self) -> None:
        s = self._state
        log_dir = self.data_dir / "data"
        node_id = int(s.get("node_id", 1))
        # A cluster runs its internal topics at production settings: replicated to every node,
        # and an acknowledged write on two of them (a lone broker can only have one).
        replication = str(s.get("replication", 1))
        min_isr = str(min(2, int(replication)))
        props: dict[str, str] = {
            "process.roles": "broker,controller",
            "node.id": str(node_id),
            "controller.quorum.voters": s.get("voters", f"1@127.0.0.1:{s['controller_port']}"),
            "controller.listener.names": "CONTROLLER",
            "log.dirs": str(log_dir),
            "num.partitions": "1",
            "default.replication.factor": replication,
            "min.insync.replicas": min_isr,
            "offsets.topic.replication.factor": replication,
            "offsets.topic.num.partitions": "5",
            "transaction.state.log.replication.factor": replication,
            "transaction.state.log.min.isr": min_isr,
            "transaction.state.log.num.partitions": "5",
            "group.initial.rebalance.delay.ms": "0",
            # KIP-848's groups (Kafka 4): the broker, not the client, sets their heartbeat (by
            # default 5 s) and session (45 s, the least it allows): a partition would move 45 s
            # after a member past max.poll.interval.ms stopped. A session of 6 s, as the classic
            # protocol's tests ask for theirs.
            "group.consumer.heartbeat.interval.ms": "500",
            "group.consumer.min.heartbeat.interval.ms": "500",
            "group.consumer.session.timeout.ms": "6000",
            "group.consumer.min.session.timeout.ms": "6000",
            "auto.create.topics.enable": "false",
            "log.retention.check.interval.ms": "60000",
            # After kill -9 the controller refuses the restarted broker until the dead
            # incarnation's session expires (default 9 s, plus registration backoff).
            "broker.heartbeat.interval.ms": "500",
            "broker.session.timeout.ms": "3000",
            "num.network.threads": "2",
            "num.io.threads": "4",
        }
        if self.sasl_ssl:
            props.update(
                {
                    "listeners": (
                        f"SASL_SSL://127.0.0.1:{s['broker_port']},"
                        f"INTERNAL://127.0.0.1:{s['internal_port']},"
                        f"CONTROLLER://127.0.0.1:{s['controller_port']}"
                    ),
                    "advertised.listeners": (
                        f"SASL_SSL://127.0.0.1:{s['broker_port']},"
                        f"INTERNAL://127.0.0.1:{s['internal_port']}"
                    ),
                    "listener.security.protocol.map": (
                        "SASL_SSL:SASL_SSL,INTERNAL:PLAINTEXT,CONTROLLER:PLAINTEXT"
                    ),
                    "inter.broker.listener.name": "INTERNAL",
                    "sasl.enabled.mechanisms": SCRAM_MECHANISM,
                    "listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config": (
                        "org.apache.kafka.common.security.scram.ScramLoginModule required;"
                    ),
                    "ssl.keystore.type": "PEM",
                    "ssl.keystore.location": str(s["keystore"]),
                    "ssl.client.auth": "none",
                }
            )
            if s.get("acl_users"):
                # The controller and the inter-broker listener are loopback PLAINTEXT: their
                # principal is ANONYMOUS, and the cluster's own traffic must stay authorized.
                props["authorizer.class.name"] = (
                    "org.apache.kafka.metadata.authorizer.StandardAuthorizer"
                )
                props["super.users"] = f"User:{SCRAM_USERNAME};User:ANONYMOUS"
        else:
            props.update(
                {
                    "listeners": (
                        f"PLAINTEXT://127.0.0.1:{s['broker_port']},"
                        f"CONTROLLER://127.0.0.1:{s['controller_port']}"
                    ),
                    "advertised.listeners": f"PLAINTEXT://127.0.0.1:{s['broker_port']}",
                    "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
                    "inter.broker.listener.name": "PLAINTEXT",
                }
            )
        props.update(self.broker_config)
        server = self.data_dir / _SERVER_PROPERTIES
        server.write_text(
            "# Written by detector/devstack/kafka.py; rewritten on every start.\n"
            + "".join(f"{k}={_escape(v)}\n" for k, v in props.items())
        )
        client = self.data_dir / _CLIENT_PROPERTIES
        client.write_text("".join(f"{k}={v}\n" for k, v in self.client_config().items()))
        client.chmod(0o600)

    def _write_broker_log4j(self) -> Path:
        logs = self.data_dir / "logs"
        logs.mkdir(exist_ok=True)
        return self._write_log4j(
            "log4j",
            "INFO",
            self.log_path,
            "kafka.request.logger",
            "org.apache.kafka.clients.NetworkClient",
        )

    def _write_tool_log4j(self) -> Path:
        return self._write_log4j("tools-log4j", "WARN", None)

    def _write_log4j(self, name: str, level: str, file: Path | None, *quiet: str) -> Path:
        """A log configuration in the syntax this Kafka reads: to `file` (rolled at 20 MB, two
        kept), else to stderr, at `level`, and the `quiet` loggers at WARN."""
        if self._log4j2:
            path = self.data_dir / f"{name}2.properties"
            text = _log4j2_properties(level, file, quiet)
        else:
            path = self.data_dir / f"{name}.properties"
            text = _log4j1_properties(level, file, quiet)
        path.write_text(text)
        return path

    def _java(self, jars: Path, *, heap_mb: int, log4j: Path) -> list[str]:
        java_home = os.environ.get("JAVA_HOME")
        java = str(Path(java_home) / "bin" / "java") if java_home else shutil.which("java")
        if not java:
            raise DevKafkaError("Java is not on PATH; install a JRE 17 (openjdk-17-jre-headless)")
        return [
            java,
            f"-Xms{min(heap_mb, 256)}m",
            f"-Xmx{heap_mb}m",
            *_JVM_FLAGS,
            *self.extra_jvm_args,
            (
                f"-Dlog4j2.configurationFile={log4j}"
                if self._log4j2
                else f"-Dlog4j.configuration=file:{log4j}"
            ),
            f"-Dkafka.logs.dir={self.data_dir / 'logs'}",
            "-cp",
            f"{jars}/*",
        ]

    def _spawn(self, jars: Path) -> None:
        cmd = [
            *self._java(jars, heap_mb=self.heap_mb, log4j=self._write_broker_log4j()),
            _BROKER_MAIN,
            str(self.data_dir / _SERVER_PROPERTIES),
        ]
        with (self.data_dir / _BROKER_OUT).open("ab") as out:
            out.write(f"\n=== start {datetime.datetime.now(datetime.UTC).isoformat()}\n".encode())
            out.flush()
            self._proc = subprocess.Popen(
                cmd,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=self.data_dir,
                start_new_session=True,  # own process group: no terminal signals, killable alone
            )
        self.pid_path.write_text(f"{self._proc.pid}\n")
        self._state["pid"] = self._proc.pid
        self._state["bootstrap"] = self.bootstrap
        self._save_state()

    def _is_our_broker(self, pid: int) -> bool:
        """Alive, not a zombie, and a `kafka.Kafka` on this data dir (a recycled PID is not)."""
        return process.runs_with(pid, _BROKER_MAIN, str(self.data_dir / _SERVER_PROPERTIES))

    @staticmethod
    def _gone(started: process.Pid) -> bool:
        """Fully exited, so its sockets are closed and its ports free.

        Neither "Z" alone nor an empty cmdline is enough: a dying JVM drops its memory map
        (cmdline goes blank) and its main thread turns zombie while other threads still tear
        down holding the listening sockets; only a zombie with one thread left is done.
        `started` (with its start time) tells a recycled PID apart.
        """
        found = started.process()
        try:
            return found is None or (not process.runs(found) and found.num_threads() <= 1)
        except psutil.Error:
            return True

    def _wait_dead(self, started: process.Pid, timeout: float) -> bool:
        pid = started.pid
        deadline = time.monotonic() + timeout
        while True:
            if self._proc is not None and self._proc.pid == pid:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self._proc.wait(timeout=0.1)
                if self._proc.returncode is not None:
                    return True
            elif self._gone(started):
                return True
            else:
                time.sleep(0.05)
            if time.monotonic() > deadline:
                return False

    def _check_alive_or_raise(self) -> None:
        if self.pid() is None:
            code = self._proc.poll() if self._proc is not None else None
            raise self._failure(f"exited during startup (exit code {code})")

    def _failure(self, what: str) -> DevKafkaError:
        return DevKafkaError(
            f"Kafka broker in {self.data_dir} {what}.\n{self.log_tail()}\n"
            f"(full log: {self.log_path})"
        )

    def _require_pid(self) -> int:
        pid = self.pid()
        if pid is None:
            raise DevKafkaError(f"no broker runs on {self.data_dir}")
        return pid

    @staticmethod
    def _signal(pid: int, sig: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)

    def _forget_pid(self) -> None:
        self.pid_path.unlink(missing_ok=True)
        if self._state.pop("pid", None) is not None:
            self._save_state()

    def _load_state(self) -> dict[str, Any]:
        try:
            loaded = json.loads((self.data_dir / _STATE_FILE).read_text())
        except (OSError, ValueError):
            return {}
        return loaded if isinstance(loaded, dict) else {}

    def _save_state(self) -> None:
        path = self.data_dir / _STATE_FILE
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self._state, indent=2, sort_keys=True) + "\n")
        tmp.chmod(0o600)  # holds the SCRAM password in the secure mode
        tmp.replace(path)


_LAYOUT: Final = "[%d] %p %m (%c)%n"


def _log4j1_properties(level: str, file: Path | None, quiet: Sequence[str]) -> str:
    """log4j 1's properties (Kafka 3.x)."""
    if file is None:
        lines = [
            f"log4j.rootLogger={level}, stderr",
            "log4j.appender.stderr=org.apache.log4j.ConsoleAppender",
            "log4j.appender.stderr.Target=System.err",
            "log4j.appender.stderr.layout=org.apache.log4j.PatternLayout",
            f"log4j.appender.stderr.layout.ConversionPattern={_LAYOUT}",
        ]
    else:
        lines = [
            f"log4j.rootLogger={level}, file",
            "log4j.appender.file=org.apache.log4j.RollingFileAppender",
            f"log4j.appender.file.File={_escape(str(file))}",
            "log4j.appender.file.MaxFileSize=20MB",
            "log4j.appender.file.MaxBackupIndex=2",
            "log4j.appender.file.layout=org.apache.log4j.PatternLayout",
            f"log4j.appender.file.layout.ConversionPattern={_LAYOUT}",
        ]
    lines += [f"log4j.logger.{name}=WARN" for name in quiet]
    return "".join(f"{line}\n" for line in lines)


def _log4j2_properties(level: str, file: Path | None, quiet: Sequence[str]) -> str:
    """log4j 2's properties (Kafka 4.x): the same appenders and levels as log4j 1's."""
    if file is None:
        lines = [
            "appender.out.type=Console",
            "appender.out.target=SYSTEM_ERR",
        ]
    else:
        lines = [
            "appender.out.type=RollingFile",
            f"appender.out.fileName={_escape(str(file))}",
            f"appender.out.filePattern={_escape(str(file))}.%i",
            "appender.out.policies.type=Policies",
            "appender.out.policies.size.type=SizeBasedTriggeringPolicy",
            "appender.out.policies.size.size=20MB",
            "appender.out.strategy.type=DefaultRolloverStrategy",
            "appender.out.strategy.max=2",
        ]
    lines += [
        "appender.out.name=out",
        "appender.out.layout.type=PatternLayout",
        f"appender.out.layout.pattern={_LAYOUT}",
        f"rootLogger.level={level}",
        "rootLogger.appenderRef.out.ref=out",
    ]
    for i, name in enumerate(quiet):
        lines += [f"logger.quiet{i}.name={name}", f"logger.quiet{i}.level=WARN"]
    return "".join(f"{line}\n" for line in lines)


def _escape(value: str) -> str:
    """Escape a value for a Java .properties file (backslashes are escape characters there)."""
    return value.replace("\\", "\\\\")
