"""The shared test bed from outside pytest fixtures: connect to it, and stop / restart its processes.

Used by the bed and e2e tests and by demo/run_demo.py. The bed itself is started by
tests/testbed/up.sh (`make testbed-up`); this module never starts or stops the whole bed.

Restarting one of the bed's processes (`BED_PROMETHEUS`, `BED_APISERVER`, `BED_ETCD`: `.outage()`,
`.stop()`, `.start()`), the fault tests' injector: stop() remembers the exact command line of the
running process (from /proc/PID/cmdline, i.e. what up.sh started: same flags, ports and data) and sends
SIGTERM (or SIGKILL: a crash); start() starts it again with that command line, detached in its own
session like up.sh's `setsid ... &`, appending to the same log and writing the same PID file
(.testbed/pids/NAME.pid), so down.sh and every other test see the same process afterwards.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

TESTBED_DIR = Path(__file__).resolve().parent
if str(TESTBED_DIR) not in sys.path:  # bedkit lives here too (tests/conftest.py does the same for pytest)
    sys.path.insert(0, str(TESTBED_DIR))

from bedkit import BIN_DIR, STATE_DIR, Kube, Prometheus, wait_until  # noqa: E402

PIDS_DIR = STATE_DIR / "pids"
LOGS_DIR = STATE_DIR / "logs"


class BedUnavailableError(RuntimeError):
    """The test bed is not up (run `make testbed-up`)."""


def binary(name: str) -> str:
    """A bed binary: from the cache (~/.cache/kvscale/testbed/bin) first, then PATH."""
    found = shutil.which(name, path=str(BIN_DIR)) or shutil.which(name)
    if found is None:
        raise BedUnavailableError(f"no {name} in {BIN_DIR} or on PATH (run `make testbed-build`)")
    return found


def connect_kube() -> Kube:
    """A `Kube` for the bed's API server, or BedUnavailableError."""
    kubeconfig = STATE_DIR / "kubeconfig"
    if not kubeconfig.is_file():
        raise BedUnavailableError(f"{kubeconfig} does not exist")
    from kubernetes import client, config

    api_client = config.new_client_from_config(config_file=str(kubeconfig))
    try:
        client.VersionApi(api_client).get_code(_request_timeout=5)
    except Exception as exc:
        api_client.close()
        raise BedUnavailableError(f"kube-apiserver from {kubeconfig} does not answer: {exc!r}") from exc
    return Kube(kubeconfig=kubeconfig, api_client=api_client, kubectl_bin=binary("kubectl"))


def prometheus_url() -> str:
    url_file = STATE_DIR / "prometheus-url"
    if not url_file.is_file():
        raise BedUnavailableError(f"{url_file} does not exist")
    return url_file.read_text().strip()


def prometheus_ready(url: str | None = None, timeout: float = 3) -> bool:
    try:
        with urllib.request.urlopen(f"{url or prometheus_url()}/-/ready", timeout=timeout) as resp:
            resp.read()
            return bool(resp.status == 200)
    except (OSError, urllib.error.URLError, BedUnavailableError):
        return False


def connect_prometheus() -> Prometheus:
    url = prometheus_url()
    targets_dir = STATE_DIR / "prometheus" / "targets"
    if not targets_dir.is_dir():
        raise BedUnavailableError(f"{targets_dir} does not exist")
    if not prometheus_ready(url):
        raise BedUnavailableError(f"Prometheus at {url} is not ready")
    return Prometheus(url=url, targets_dir=targets_dir)


def bed_healthy() -> bool:
    """True when the API server and Prometheus both answer (what up.sh's own health check looks at)."""
    try:
        kube = connect_kube()
    except BedUnavailableError:
        return False
    kube.api_client.close()
    return prometheus_ready()


# --- stopping and restarting one process of the bed (the fault tests) ---------------------------


def _alive(pid: int) -> bool:
    try:
        os.readlink(f"/proc/{pid}/exe")  # fails for a gone or zombie process
    except OSError:
        return False
    return True


def bed_ports() -> dict[str, str]:
    return dict(line.split("=", 1) for line in (STATE_DIR / "ports.env").read_text().split() if "=" in line)


def _prometheus_argv() -> list[str]:
    """Prometheus's command line exactly as tests/testbed/up.sh writes it (when none was saved)."""
    prom = STATE_DIR / "prometheus"
    return [binary("prometheus"), f"--config.file={prom / 'prometheus.yml'}",
            f"--web.listen-address=127.0.0.1:{bed_ports()['PROMETHEUS_PORT']}", "--web.enable-lifecycle",
            f"--storage.tsdb.path={prom / 'data'}", "--storage.tsdb.retention.time=1d"]


def apiserver_ready(timeout: float = 3) -> bool:
    context = ssl.create_default_context(cafile=str(STATE_DIR / "pki" / "ca.crt"))
    try:
        url = f"https://127.0.0.1:{bed_ports()['APISERVER_PORT']}/readyz"
        with urllib.request.urlopen(url, timeout=timeout, context=context) as resp:
            return bool(resp.status == 200 and resp.read().strip() == b"ok")
    except (OSError, urllib.error.URLError):
        return False


def etcd_ready(timeout: float = 3) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{bed_ports()['ETCD_PORT']}/health", timeout=timeout) as resp:
            return bool(json.loads(resp.read()).get("health") == "true")
    except (OSError, urllib.error.URLError, ValueError):
        return False


@dataclass(frozen=True)
class BedProcess:
    """One process of the bed, known by its PID file, stopped and restarted identically."""

    name: str  # the binary's name, which is also the PID file's and the log's
    ready: Callable[[], bool]
    pid_file: Path | None = None  # default .testbed/pids/NAME.pid
    log_file: Path | None = None  # default .testbed/logs/NAME.log
    argv_file: Path | None = None  # its command line, saved by stop(); default .testbed/NAME.argv.json
    default_argv: Callable[[], list[str]] | None = None  # when stop() saved none

    @property
    def pid_path(self) -> Path:
        return self.pid_file or PIDS_DIR / f"{self.name}.pid"

    @property
    def argv_path(self) -> Path:
        return self.argv_file or STATE_DIR / f"{self.name}.argv.json"

    def pid(self) -> int | None:
        """The recorded PID if that process is alive and really is NAME (as lib.sh's pid_of)."""
        try:
            pid = int(self.pid_path.read_text().split()[0])
            exe = os.readlink(f"/proc/{pid}/exe")
        except (OSError, ValueError, IndexError):
            return None
        return pid if Path(exe.removesuffix(" (deleted)")).name == self.name else None

    def stop(self, sig: signal.Signals = signal.SIGTERM, timeout: float = 20) -> None:
        """Signal it (by its PID file, never by name), remembering its command line; wait until it is gone."""
        pid = self.pid()
        if pid is None:
            raise BedUnavailableError(f"no running {self.name} recorded in {self.pid_path}")
        argv = [a for a in Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0") if a]
        self.argv_path.write_text(json.dumps(argv))
        os.kill(pid, sig)
        deadline = time.monotonic() + timeout
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        if _alive(pid):
            os.kill(pid, signal.SIGKILL)
            wait_until(lambda: not _alive(pid), 10, f"{self.name} (pid {pid}) to exit after SIGKILL")

    def start(self, timeout: float = 90) -> int:
        """Start it again with the same command line, log and PID file; wait until it is ready."""
        running = self.pid()
        if running is not None:
            return running
        if self.argv_path.is_file():
            argv = json.loads(self.argv_path.read_text())
        elif self.default_argv is not None:
            argv = self.default_argv()
        else:
            raise BedUnavailableError(f"no saved command line for {self.name} ({self.argv_path})")
        log_file = self.log_file or LOGS_DIR / f"{self.name}.log"
        log_file.parent.mkdir(parents=True, exist_ok=True)
        # Detached like up.sh's `setsid "$@" >log 2>&1 </dev/null &`: the shell exits at once, so the
        # new process is nobody's child here and outlives this one.
        out = subprocess.run(
            ["sh", "-c", 'log=$1; shift; setsid "$@" >>"$log" 2>&1 </dev/null & echo $!', "sh",
             str(log_file), *argv],
            capture_output=True, text=True, check=True, timeout=30,
        )
        pid = int(out.stdout.strip())
        self.pid_path.write_text(f"{pid}\n")
        wait_until(lambda: _alive(pid) and self.ready(), timeout, f"the restarted {self.name} (pid {pid}) to be ready")
        return pid

    @contextmanager
    def outage(self, sig: signal.Signals = signal.SIGTERM) -> Iterator[None]:
        """Down inside the block; always started again (same flags, ports, data, PID file) after it."""
        self.stop(sig)
        try:
            yield
        finally:
            self.start()


BED_PROMETHEUS = BedProcess("prometheus", ready=prometheus_ready, default_argv=_prometheus_argv)
BED_APISERVER = BedProcess("kube-apiserver", ready=apiserver_ready)
BED_ETCD = BedProcess("etcd", ready=etcd_ready)
