"""Profile the trimq broker and client under one workload (cProfile, or pyinstrument HTML).

    .venv/bin/python -m bench.peers.profile W1 --count 20000 [--flush sync] [--pyinstrument]

Starts a NameServer, a broker under the profiler and the workload's client (`mqbench`) under
the profiler, then stops the broker with SIGINT so its profile is written. The profiles (never
committed) land in `--out` (default /tmp/trimq-prof): `broker-W1.prof`, `client-W1.prof`
(open with `python -m pstats` or snakeviz) or `*.html` flame graphs with `--pyinstrument`.
Prints the top functions by own time, with call counts per message. `--sync-master`: the
broker is a SYNC_MASTER with a SLAVE (also profiled: `slave-W1.prof`), measured once the slave
is in sync, as the trimq-sync-master system of `bench.peers`. `--secured acl|tls`: ACL or TLS
on the NameServer and the broker and the client signing or on TLS, as trimq-acl / trimq-tls.
"""

from __future__ import annotations

import argparse
import os
import pstats
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from . import secure
from ._proc import Server, free_port, run_client
from .run import _create_topic, wait_in_sync

BIN = Path(sys.executable).parent
PY = sys.executable
REPO = Path(__file__).resolve().parents[2]


def _profiled(module: str, out: Path, pyinstrument: bool) -> list[str]:
    if pyinstrument:
        return [PY, "-m", "pyinstrument", "-r", "session", "-o",
                str(out.with_suffix(".pyisession")), "-m", module]  # fmt: skip
    return [PY, "-m", "cProfile", "-o", str(out), "-m", module]


def _client_args(workload: str, ns: str, count: int) -> list[str]:
    common = ["-n", ns, "-s", "1024", "-c", str(count), "-d", "300", "--json"]
    if workload == "W1":
        return ["producer", "-t", "Bench", "-w", "64", *common]
    if workload == "W2":
        return ["producer", "-t", "Bench", "-w", "4", "-b", "32", *common]
    if workload == "W5":
        return ["producer", "-t", "Bench", "-w", "1", *common]
    # W3: consume what a W2 run wrote first
    return ["consumer", "-n", ns, "-t", "Bench", "-g", "prof_w3", "--from", "first",
            "--batch", "32", "-c", str(count), "-d", "300", "--json"]  # fmt: skip


def _top(path: Path, n: int, per: int) -> None:
    if not path.exists():
        print(f"(no profile at {path})")
        return
    st = pstats.Stats(str(path))
    rows = []
    for (file, line, func), (_cc, nc, tt, ct, _callers) in st.stats.items():  # type: ignore[attr-defined]
        rows.append((tt, ct, nc, f"{Path(file).name}:{line}({func})"))
    rows.sort(reverse=True)
    total = sum(r[0] for r in rows)
    print(f"== {path.name}: {total:.2f} s own time in all; top {n} by own time")
    print(f"{'own s':>8} {'cum s':>8} {'calls/msg':>10}  function")
    for tt, ct, nc, name in rows[:n]:
        print(f"{tt:8.3f} {ct:8.3f} {nc / per:10.2f}  {name}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("workload", choices=["W1", "W2", "W3", "W5"])
    ap.add_argument("--count", type=int, default=20_000)
    ap.add_argument("--flush", choices=["async", "sync"], default="async")
    ap.add_argument("--pyinstrument", action="store_true")
    ap.add_argument("--sync-master", action="store_true", help="SYNC_MASTER + SLAVE")
    ap.add_argument("--secured", choices=secure.MODES, default=None, help="ACL or TLS on")
    ap.add_argument("--out", type=Path, default=Path("/tmp/trimq-prof"))
    ap.add_argument("--top", type=int, default=35)
    opts = ap.parse_args()
    opts.out.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, PYTHONPATH=str(REPO))
    broker_prof = opts.out / f"broker-{opts.workload}.prof"
    client_prof = opts.out / f"client-{opts.workload}.prof"
    slave_prof = opts.out / f"slave-{opts.workload}.prof"
    with (
        tempfile.TemporaryDirectory(prefix="trimq-prof-") as tmp,
        open(Path(tmp) / "servers.log", "wb") as log,
    ):
        ns_port, br_port, ha_port, sl_port = free_port(), free_port(), free_port(), free_port()
        ns_addr = f"127.0.0.1:{ns_port}"
        ns_conf: list[str] = []
        br_conf: list[str] = []
        client_env, admin_env = env, None
        if opts.secured:
            material = secure.make_material(opts.secured, Path(tmp) / "secure")
            ns_conf = ["--config", str(secure.write_toml(Path(tmp) / "ns.toml", material.namesrv))]
            br_conf = ["--config", str(secure.write_toml(Path(tmp) / "br.toml", material.broker))]
            client_env = {**env, **material.client_env}
            admin_env = {**env, **material.admin_env}
        ns = Server(
            "mqnamesrv", [str(BIN / "mqnamesrv"), "--listen", ns_addr, *ns_conf], log, ns_port
        )
        roles = ["--role", "sync_master", "--ha-port", str(ha_port)] if opts.sync_master else []
        br = Server(
            "mqbroker",
            [*_profiled("broker.cli", broker_prof, opts.pyinstrument), "-n", ns_addr,
             "--listen", f"127.0.0.1:{br_port}", "--store-dir", str(Path(tmp) / "store"),
             "--flush", opts.flush, *roles, *br_conf, "--log-level", "warning"],
            log,
            br_port,
        )  # fmt: skip
        slave = Server(
            "slave",
            [*_profiled("broker.cli", slave_prof, opts.pyinstrument), "-n", ns_addr,
             "--listen", f"127.0.0.1:{sl_port}", "--store-dir", str(Path(tmp) / "slave"),
             "--flush", opts.flush, "--role", "slave", "--id", "1", "--log-level", "warning"],
            log,
            sl_port,
        )  # fmt: skip
        brokers = [br, slave] if opts.sync_master else [br]
        try:
            ns.start()
            br.start(env)
            if opts.sync_master:
                slave.start(dict(env, TRIMQ_HA_MASTER_ADDRESS=f"127.0.0.1:{ha_port}"))
            _create_topic(ns_addr, "Bench", env=admin_env)
            if opts.sync_master:
                wait_in_sync(ns_addr, f"127.0.0.1:{br_port}")
            if opts.workload == "W3":  # a backlog to consume, written without profiling
                run_client(
                    [str(BIN / "mqbench"), *_client_args("W2", ns_addr, opts.count)],
                    600, REPO, client_env, Path(tmp),
                )  # fmt: skip
            cmd = [
                *_profiled("client.cli.mqbench", client_prof, opts.pyinstrument),
                "--log-level", "error", *_client_args(opts.workload, ns_addr, opts.count),
            ]  # fmt: skip
            cr = run_client(cmd, 600, REPO, client_env, Path(tmp))
            print(cr.result or cr.stderr)
            cpus = ", ".join(f"{b.name} CPU {b.cpu():.2f} s" for b in brokers)
            print(f"client CPU {cr.cpu_s:.2f} s, {cpus} (profiled)")
        finally:
            for b in brokers:
                if b.proc is not None and b.proc.poll() is None:
                    os.kill(b.proc.pid, signal.SIGINT)  # SIGINT: a clean exit writes the profile
                    try:
                        b.proc.wait(timeout=60)
                    except subprocess.TimeoutExpired:
                        b.stop()
            ns.stop()
    time.sleep(0.1)
    profiles = [broker_prof, *([slave_prof] if opts.sync_master else []), client_prof]
    if not opts.pyinstrument:
        for prof in profiles:
            _top(prof, opts.top, opts.count)
    else:
        for prof in profiles:
            session = str(prof.with_suffix(".pyisession"))
            for renderer, suffix in (("html", ".html"), ("text", ".txt")):
                subprocess.run(
                    [PY, "-m", "pyinstrument", "--load", session, "-r", renderer,
                     "--no-color", "-o", str(prof.with_suffix(suffix))],
                    check=False,
                )  # fmt: skip
        print(f"flame graphs: {opts.out}/*.html, text trees: {opts.out}/*.txt")


if __name__ == "__main__":
    main()
