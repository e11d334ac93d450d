"""A Spark standalone cluster on loopback for the tests: a master and workers started from the
pyspark package's ``bin/spark-class``, stopped afterwards."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
import urllib.request
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class StandaloneCluster:
    def __init__(self, workdir: Path, workers: int = 2, cores: int = 1, memory: str = "1g"):
        import pyspark

        self.home = Path(pyspark.__file__).resolve().parent
        self.workdir = workdir
        self.port, self.web_port = free_port(), free_port()
        self.url = f"spark://127.0.0.1:{self.port}"
        self.procs: list[subprocess.Popen] = []
        self.env = {**os.environ, "SPARK_HOME": str(self.home), "SPARK_LOCAL_IP": "127.0.0.1",
                    "SPARK_NO_DAEMONIZE": "1"}
        self._start("master", "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                    "--port", str(self.port), "--webui-port", str(self.web_port))
        for i in range(workers):
            self._start(f"worker{i}", "org.apache.spark.deploy.worker.Worker", self.url, "--host", "127.0.0.1",
                        "--cores", str(cores), "--memory", memory, "--webui-port", str(free_port()),
                        "--work-dir", str(workdir / f"worker{i}"))
        self._wait_for_workers(workers)

    def _start(self, name: str, cls: str, *args: str) -> None:
        log = open(self.workdir / f"{name}.log", "wb")
        self.procs.append(subprocess.Popen([str(self.home / "bin" / "spark-class"), cls, *args], env=self.env,
                                           stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL))

    def _wait_for_workers(self, count: int, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if any(p.poll() is not None for p in self.procs):
                break
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.web_port}/json/", timeout=2) as r:
                    if json.load(r).get("aliveworkers", 0) >= count:
                        return
            except OSError:
                pass
            time.sleep(0.5)
        self.stop()
        logs = "\n".join(p.read_text(errors="replace")[-2000:] for p in sorted(self.workdir.glob("*.log")))
        raise RuntimeError(f"the standalone cluster did not come up:\n{logs}")

    def stop(self) -> None:
        for p in reversed(self.procs):
            p.terminate()
        for p in self.procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        self.procs = []
