"""A network partition between machines, on one machine (issue 28; not collected by pytest): workers in their own
Linux network namespaces, joined to the broker in the root namespace by veth pairs on a bridge, and one of them
cut off and reconnected. Used by tests/kafka/test_network_partition.py and ``bench/chaos.py --only network_partition``.

:class:`NetnsLab` makes the bridge (the broker's address) and one namespace per worker; :meth:`NetnsLab.cut`
detaches a namespace's veth from the bridge (its interface stays up: the worker's packets go nowhere and nothing
answers, as across a real partition; no RST, no carrier loss) and :meth:`NetnsLab.heal` attaches it again.
:func:`run_partition` is the scenario: two workers, one held inside a transaction (its output and state sent,
not committed) and cut off for longer than the session timeout while the other takes its partitions over, then
reconnected and fed more input."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
import uuid
from pathlib import Path

from stream_anon.connection import as_connection
from stream_anon.kafka.supervise import secret_env, stop_worker_process, worker_command

from _kafka_helpers import wait_accounted, wait_while_running
from _worker_harness import harness_entry

ROOT = Path(__file__).resolve().parents[1]
SESSION_TIMEOUT_S = float(os.environ.get("STREAM_ANON_SESSION_TIMEOUT_S") or 6.0)   # the workers' (--session-timeout)


def unavailable() -> str | None:
    """Why network namespaces cannot be made here (None: they can)."""
    if os.name != "posix" or not Path("/proc/self/ns/net").exists():
        return "no Linux network namespaces on this system"
    if shutil.which("ip") is None:
        return "the `ip` command (iproute2) is not installed"
    if os.geteuid() != 0:
        return f"creating network namespaces needs root (running as uid {os.geteuid()})"
    name = f"sa-probe-{uuid.uuid4().hex[:6]}"
    done = subprocess.run(["ip", "netns", "add", name], capture_output=True, text=True)
    if done.returncode != 0:
        return f"`ip netns add` failed: {done.stderr.strip() or done.returncode}"
    subprocess.run(["ip", "netns", "del", name], capture_output=True)
    done = subprocess.run(["ip", "link", "add", f"sap{uuid.uuid4().hex[:6]}", "type", "bridge"], capture_output=True,
                          text=True)
    if done.returncode != 0:
        return f"`ip link add ... type bridge` failed: {done.stderr.strip() or done.returncode}"
    subprocess.run(["ip", "link", "del", done.args[3]], capture_output=True)
    return None


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


class NetnsLab:
    """A bridge with the broker's address in the root namespace and one namespace per name in ``names``, each on
    its own veth pair; everything is removed on exit. Names and the /24 are drawn per instance (several labs on
    one machine do not collide)."""

    def __init__(self, names=("a", "b")):
        tag = uuid.uuid4().hex[:5]
        used = subprocess.run(["ip", "-o", "-4", "addr"], capture_output=True, text=True).stdout
        third = next(n for n in range(int(tag, 16) % 200 + 20, 255) if f"10.254.{n}." not in used)
        self.bridge, self.subnet = f"sab{tag}", f"10.254.{third}"
        self.broker_ip = f"{self.subnet}.1"
        self.ns = {n: f"sa{tag}{n}" for n in names}
        self.veth = {n: f"sa{tag}{n}0" for n in names}
        self.ips = {n: f"{self.subnet}.{i + 2}" for i, n in enumerate(names)}

    def __enter__(self) -> "NetnsLab":
        try:
            _ip("link", "add", self.bridge, "type", "bridge")
            _ip("addr", "add", f"{self.broker_ip}/24", "dev", self.bridge)
            _ip("link", "set", self.bridge, "up")
            for n, ns in self.ns.items():
                _ip("netns", "add", ns)
                _ip("link", "add", self.veth[n], "type", "veth", "peer", "name", f"{self.veth[n][:-1]}1")
                _ip("link", "set", f"{self.veth[n][:-1]}1", "netns", ns)
                _ip("link", "set", self.veth[n], "master", self.bridge)
                _ip("link", "set", self.veth[n], "up")
                _ip("-n", ns, "addr", "add", f"{self.ips[n]}/24", "dev", f"{self.veth[n][:-1]}1")
                _ip("-n", ns, "link", "set", f"{self.veth[n][:-1]}1", "up")
                _ip("-n", ns, "link", "set", "lo", "up")
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc) -> None:
        for ns in self.ns.values():
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)    # removes its end of the pair
        for veth in self.veth.values():
            subprocess.run(["ip", "link", "del", veth], capture_output=True)
        subprocess.run(["ip", "link", "del", self.bridge], capture_output=True)

    def cut(self, name: str) -> None:
        _ip("link", "set", self.veth[name], "nomaster")

    def heal(self, name: str) -> None:
        _ip("link", "set", self.veth[name], "master", self.bridge)

    def start_worker(self, name: str, config_path, bootstrap: str, state_dir, app_id: str, log_path,
                     extra=(), hold_before_commit=None) -> subprocess.Popen:
        """A worker process inside namespace ``name`` (``ip netns exec`` execs it: the pid is the worker's)."""
        env = {**os.environ, **secret_env(as_connection(bootstrap))}
        cmd = ["ip", "netns", "exec", self.ns[name],
               *worker_command(config_path, bootstrap, state_dir, app_id, 2.0, list(extra),
                               harness_entry({}, hold_before_commit))]
        with open(log_path, "ab") as out:
            return subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                                    start_new_session=True, cwd=str(ROOT))


def assigned_after(log: Path, offset: int) -> list[list[int]]:
    """The partition lists of the ``partitions assigned`` lines after byte ``offset`` of a worker's log."""
    text = log.read_bytes()[offset:].decode(errors="replace")
    return [[int(p) for p in re.findall(r"\d+", m)] for m in re.findall(r"partitions assigned: \[([\d, ]*)\]", text)]


def run_partition(lab: NetnsLab, bootstrap: str, config_path, stream: str, replay_first, replay_rest,
                  n_events: int, partitions: int, workdir: Path, cut_s: float = 20.0, timeout_s: float = 300.0) -> dict:
    """The scenario on a broker at ``lab.broker_ip`` (``replay_first()`` sends the first part of the stream once
    both workers own partitions, ``replay_rest()`` the rest after the heal; ``n_events`` in all). Worker A
    (namespace a) is held inside a transaction, cut off, released (its commit now waits on a broker it cannot reach) and kept cut for ``cut_s``
    (> the session timeout): worker B (namespace b) must take every partition. Then A is reconnected: its commit
    must be refused (fenced) and A must rejoin the group, recover partitions from the state topic and process
    input again. Returns the figures (timings, log counts); the caller judges the outputs with the audit."""
    workdir = Path(workdir)
    app_id, extra = "chaos-netpart", ["--batch-max", "100", "--batch-within", "0.1"]
    hold = workdir / "hold-a"
    logs = {n: workdir / f"worker-{n}.log" for n in ("a", "b")}
    hold.write_text("")
    # B first, alone with every partition; then A joins (the group splits them) and holds its first transaction:
    # a member that holds never delays a rebalance it is not part of
    b = lab.start_worker("b", config_path, bootstrap, workdir / "state-b", app_id, logs["b"], extra)
    a = None
    out: dict = {"cut_s": cut_s, "session_timeout_s": SESSION_TIMEOUT_S}
    try:
        wait_while_running(lambda: any(len(x) == partitions for x in assigned_after(logs["b"], 0)), timeout_s,
                           "worker B to own every partition", (b,))
        b_mark = logs["b"].stat().st_size
        a = lab.start_worker("a", config_path, bootstrap, workdir / "state-a", app_id, logs["a"], extra, hold)
        wait_while_running(lambda: any(assigned_after(logs["a"], 0)) and any(assigned_after(logs["b"], b_mark)),
                           timeout_s,
                           "the group to split the partitions between A and B", (a, b))
        replay_first()
        wait_while_running(lambda: Path(str(hold) + ".held").exists(), timeout_s, "worker A inside a transaction",
                           (a, b))
        held_partition = int(Path(str(hold) + ".held").read_text().split()[0])
        out["partitions_a_before_cut"] = assigned_after(logs["a"], 0)[-1]
        lab.cut("a")
        t_cut = time.monotonic()
        hold.unlink()                      # A goes on to commit: its requests reach nothing
        b_mark = logs["b"].stat().st_size
        out["takeover_s"] = round(wait_while_running(
            lambda: any(len(x) == partitions for x in assigned_after(logs["b"], b_mark)),
            max(cut_s * 3, 60), "worker B to take every partition", (a, b)), 1)
        time.sleep(max(0.0, cut_s - (time.monotonic() - t_cut)))
        a_mark = logs["a"].stat().st_size
        lab.heal("a")
        t_heal = time.monotonic()
        out["rejoin_s"] = round(wait_while_running(lambda: any(assigned_after(logs["a"], a_mark)), timeout_s,
                                                   "worker A to rejoin with partitions", (a, b)), 1)
        out["partitions_a_after_rejoin"] = next(x for x in assigned_after(logs["a"], a_mark) if x)
        replay_rest()
        out["accounted"] = wait_accounted(bootstrap, stream, n_events, timeout_s, (a, b))
        out["seconds_after_heal"] = round(time.monotonic() - t_heal, 1)
        out["worker_crashes"] = int(a.poll() is not None) + int(b.poll() is not None)
    finally:
        for p in (a, b):
            if p is not None:
                stop_worker_process(p)
        if hold.exists():
            hold.unlink()
    text = {n: path.read_text(errors="replace") for n, path in logs.items()}
    after_heal = text["a"][a_mark:] if "a_mark" in locals() else ""      # bytes as characters: near enough
    out.update({
        "held_partition": held_partition,
        "a_fenced": text["a"].count("producer fenced"),
        "a_transactions_committed": _commits(text["a"]),   # all after the rejoin: it held its first one
        "b_transactions_committed": _commits(text["b"]),
        "halts": text["a"].count("HALTED") + text["b"].count("HALTED"),
        "a_lost_warnings": text["a"].count("broker connection lost"),
        "a_restored_warnings": after_heal.count("broker connection restored"),
        "a_aborted": text["a"].count("transaction aborted"),
    })
    return out


def _commits(log: str) -> int | None:
    """The committed transactions a worker reports when it stops."""
    found = re.findall(r"stopped: (\d+) transactions committed", log)
    return int(found[-1]) if found else None
