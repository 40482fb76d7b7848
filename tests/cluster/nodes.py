"""Several Ray nodes on one machine: a head and workers started with ``ray start``.

Each node is its own raylet (with its own CPUs, object store and custom resources) in one
private ``--temp-dir``, on ports chosen here (never 6379, which Redis holds on these machines,
nor Ray's worker port range 10002-19999). Everything is stopped by PID: the processes whose
command line names this cluster's temp dir. Never ``ray stop``, which stops every Ray process
of the machine, other people's too.

Example::

    cluster = LocalCluster(workers=[{"node_b": 1}, {"node_c": 1}])
    cluster.start()
    ray.init(address=cluster.address)
    ...
    cluster.kill_node(1)  # the first worker's raylet, SIGKILL
    cluster.shutdown()
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Collection
from pathlib import Path

import psutil

RAY = str(Path(sys.executable).with_name("ray"))


def free_port() -> int:
    """A free TCP port outside Ray's worker port range (10002-19999)."""
    return free_ports(1)[0]


def free_ports(count: int, exclude: Collection[int] = ()) -> list[int]:
    """``count`` distinct free TCP ports outside Ray's worker port range, none in ``exclude``.

    Every probe stays bound until all are chosen: ports probed one after the other and
    released in between may repeat (a node's start once got 45789 for both its node manager
    and its object manager, and ``ray start`` refused it).
    """
    probes: list[socket.socket] = []
    ports: list[int] = []
    try:
        while len(ports) < count:
            probe = socket.socket()
            probes.append(probe)
            probe.bind(("127.0.0.1", 0))
            port: int = probe.getsockname()[1]
            if not 10002 <= port <= 19999 and port != 6379 and port not in exclude:
                ports.append(port)
    finally:
        for probe in probes:
            probe.close()
    return ports


def node_environment() -> dict[str, str]:
    """What every node (and driver) of the cluster runs with: token auth on (a machine where
    any Ray ran has ``~/.ray/auth_token``, and Ray 2.60 then requires it), workers at
    normal priority, the checkout importable by workers."""
    env = dict(os.environ)
    for name in ("RAY_ADDRESS", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH"):
        env.pop(name, None)
    env["RAY_AUTH_MODE"] = "token"
    env["RAY_worker_niceness"] = "0"
    env["RAY_enable_worker_prestart"] = "0"
    # A lost node is declared dead after 5 failed health checks a second apart (Ray's
    # defaults: 3 s apart, ~15 s): the node-loss tests wait for that. A check fails at once
    # on a killed raylet; a live but slow one fails a check only after its 10 s timeout.
    env["RAY_health_check_period_ms"] = "1000"
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    return env


NODE_START_ATTEMPTS = 3
"""Tries of :meth:`LocalCluster.restart_node` before it gives up."""


class LocalCluster:
    """A head node and ``workers`` worker nodes (each a dict of custom resources)."""

    def __init__(self, workers: list[dict[str, float]], *, cpus_per_node: int = 2,
                 object_store_bytes: int = 100 * 1024 * 1024,
                 head_resources: dict[str, float] | None = None) -> None:
        self.temp_dir = tempfile.mkdtemp(prefix="er-cl-", dir="/tmp")  # short: socket paths
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.cpus_per_node = cpus_per_node
        self.object_store_bytes = object_store_bytes
        self.node_resources = [{"head": 1.0, **(head_resources or {})}, *workers]
        self.node_manager_ports: dict[int, int] = {}
        self.environment = node_environment()
        # A token of its own: `ray start` in token mode refuses to start without one, and a
        # fresh machine has no ~/.ray/auth_token (nor should a test write the user's).
        token = Path(self.temp_dir) / "auth_token"
        token.write_text(secrets.token_hex(32))
        token.chmod(0o600)
        self.environment["RAY_AUTH_TOKEN_PATH"] = str(token)

    def _start_node(self, index: int) -> None:
        (manager_port, object_port, metrics_port, agent_port, agent_grpc_port, runtime_env_port,
         client_port) = free_ports(7, exclude={self.port})
        self.node_manager_ports[index] = manager_port
        common = [
            f"--num-cpus={self.cpus_per_node}",
            f"--object-store-memory={self.object_store_bytes}",
            f"--resources={json.dumps(self.node_resources[index])}",
            f"--node-manager-port={manager_port}",
            f"--object-manager-port={object_port}",
            f"--metrics-export-port={metrics_port}",
            f"--dashboard-agent-listen-port={agent_port}",
            f"--dashboard-agent-grpc-port={agent_grpc_port}",
            f"--runtime-env-agent-port={runtime_env_port}",
            "--node-ip-address=127.0.0.1",
            "--disable-usage-stats",
        ]
        if index == 0:
            command = [RAY, "start", "--head", f"--port={self.port}",
                       f"--temp-dir={self.temp_dir}", "--include-dashboard=false",
                       f"--ray-client-server-port={client_port}", *common]
        else:
            command = [RAY, "start", f"--address={self.address}", *common]
        # Handlers of the tests say where they ran: workers inherit their raylet's environment.
        environment = {**self.environment, "ER_TEST_NODE": str(index)}
        result = subprocess.run(command, env=environment, capture_output=True, text=True,
                                timeout=120, check=False)
        if result.returncode != 0:
            raise RuntimeError(f"ray start of node {index} failed:\n{result.stdout[-3000:]}\n"
                               f"{result.stderr[-3000:]}")

    def start(self) -> None:
        """The head, then each worker node, a worker's start tried again as in
        :meth:`restart_node` (a clean clone's CI saw a first ``ray start`` of node 1 time out,
        'The current node timed out during startup', on a loaded machine: every cluster test
        then errored)."""
        try:
            self._start_node(0)
            for index in range(1, len(self.node_resources)):
                self.restart_node(index)
        except BaseException:
            self.shutdown()
            raise

    def restart_node(self, index: int) -> None:
        """Start node ``index`` again (after :meth:`kill_node`), with its resources. A start
        that fails is tried again, up to :data:`NODE_START_ATTEMPTS` times, after its raylet and
        the agents it started are killed: ``ray start`` gives up when its raylet is not
        registered within 30 s (a constant of Ray's), which a loaded machine missed once while
        the GCS was still busy with the node's death (a clean clone's CI: 'The current node
        timed out during startup', and the module's later tests found no node B)."""
        for attempt in range(1, NODE_START_ATTEMPTS + 1):
            self._kill_raylet(index)
            try:
                self._start_node(index)
                return
            except RuntimeError:
                if attempt == NODE_START_ATTEMPTS:
                    raise

    def _kill_raylet(self, index: int) -> None:
        """SIGKILL node ``index``'s raylet and what it started, if they still run."""
        with _gone():
            raylet = self.raylet(index)
            family = [raylet, *raylet.children(recursive=True)]
            for process in family:
                with _gone():
                    process.kill()
            psutil.wait_procs(family, timeout=10)

    def driver_environment(self, **extra: str) -> dict[str, str]:
        """The environment of a driver process of this cluster (``RAY_ADDRESS`` set)."""
        return {**self.environment, "RAY_ADDRESS": self.address, **extra}

    def processes(self) -> list[psutil.Process]:
        """This cluster's processes: those whose command lines name its temp dir, and their
        descendants (workers rename themselves ``ray::...``)."""
        found: dict[int, psutil.Process] = {}
        for process in psutil.process_iter(["cmdline"]):
            with _gone():
                cmdline = " ".join(process.info["cmdline"] or ())
                if self.temp_dir in cmdline and process.pid != os.getpid():
                    found[process.pid] = process
                    for child in process.children(recursive=True):
                        found.setdefault(child.pid, child)
        return list(found.values())

    def raylet(self, index: int) -> psutil.Process:
        flag = f"--node_manager_port={self.node_manager_ports[index]}"
        for process in self.processes():
            with _gone():
                cmdline = process.cmdline()
            if cmdline and cmdline[0].endswith("raylet") and flag in cmdline:
                return process
        raise LookupError(f"no raylet for node {index}")

    def kill_node(self, index: int) -> int:
        """SIGKILL node ``index``'s raylet (as a machine that vanishes); returns its PID."""
        raylet = self.raylet(index)
        raylet.send_signal(signal.SIGKILL)
        return raylet.pid

    def shutdown(self) -> None:
        """SIGTERM, then SIGKILL, every process of this cluster (by PID); remove its files."""
        processes = self.processes()
        for process in processes:
            with _gone():
                process.terminate()
        _, alive = psutil.wait_procs(processes, timeout=10)
        for process in alive:
            with _gone():
                process.kill()
        psutil.wait_procs(alive, timeout=10)
        time.sleep(0.2)
        shutil.rmtree(self.temp_dir, ignore_errors=True)


class _gone:
    """Ignore a process that exited meanwhile."""

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: object, value: object, traceback: object) -> bool:
        return isinstance(value, psutil.NoSuchProcess | psutil.AccessDenied | LookupError)
