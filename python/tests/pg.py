"""A throwaway PostgreSQL server for the tests, as test-support/src/pg.rs starts one for
the Rust tests: ``initdb`` and ``pg_ctl`` from /usr/lib/postgresql/*/bin or PATH (run as
``postgres`` through ``runuser`` when the tests run as root), trust auth on
127.0.0.1, no fsync. A watchdog shell stops the server and removes its directory when
this process ends, however it ends. Without PostgreSQL the tests that use it fail, as
the Rust ones do (``.ci/run`` installs it)."""

import itertools
import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

SUPERUSER = "aplc"


def _find_bin():
    root = Path("/usr/lib/postgresql")
    versions = []
    if root.is_dir():
        for entry in root.iterdir():
            bin_dir = entry / "bin"
            if entry.name.isdigit() and (bin_dir / "initdb").exists() and (bin_dir / "pg_ctl").exists():
                versions.append((int(entry.name), bin_dir))
    if versions:
        return max(versions)[1]
    for directory in os.environ.get("PATH", "").split(os.pathsep):
        if (Path(directory) / "initdb").exists() and (Path(directory) / "pg_ctl").exists():
            return Path(directory)
    raise RuntimeError(
        "no `initdb`/`pg_ctl` in /usr/lib/postgresql/*/bin or on PATH: install the "
        "`postgresql` package (apt-get install -y postgresql)"
    )


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Cluster:
    def __init__(self):
        self.bin = _find_bin()
        self.as_postgres = os.geteuid() == 0
        self.dir = Path(tempfile.mkdtemp(prefix="aplc-pg-py-"))
        self.port = 0
        self._names = itertools.count()
        if self.as_postgres:
            shutil.chown(self.dir, "postgres")
        data = self.dir / "data"
        stop = self._command("pg_ctl", "-D", str(data), "stop", "-m", "immediate")
        script = f"cat >/dev/null; {' '.join(stop)} >/dev/null 2>&1; rm -rf '{self.dir}'"
        self._watchdog = subprocess.Popen(
            ["sh", "-c", script],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        self._tool("initdb", "-D", str(data), "-U", SUPERUSER, "--auth=trust", "--no-locale", "-E", "UTF8", "--no-sync")
        last = ""
        for _ in range(5):
            self.port = _free_port()
            log = self.dir / "server.log"
            options = f"-c listen_addresses=127.0.0.1 -p {self.port} -k {self.dir} -c fsync=off"
            try:
                self._tool("pg_ctl", "-D", str(data), "-l", str(log), "-o", options, "-w", "-t", "60", "start")
            except RuntimeError as e:
                last = f"{e}\nserver log:\n{log.read_text() if log.exists() else ''}"
                continue
            self._wait_ready()
            return
        raise RuntimeError(last)

    def _command(self, name, *args):
        program = [str(self.bin / name), *args]
        return ["runuser", "-u", "postgres", "--", *program] if self.as_postgres else program

    def _tool(self, name, *args):
        done = subprocess.run(self._command(name, *args), cwd=self.dir, capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"`{name}` failed ({done.returncode}): {done.stdout}{done.stderr}")
        return done.stdout

    def _wait_ready(self):
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError(f"the server did not accept connections on 127.0.0.1:{self.port}")

    def database(self, prefix):
        """A new database: its URL."""
        name = f"{prefix}_{next(self._names)}"
        self._tool("createdb", "-h", "127.0.0.1", "-p", str(self.port), "-U", SUPERUSER, name)
        return f"postgres://{SUPERUSER}@127.0.0.1:{self.port}/{name}"

    def stop(self):
        """Closing the pipe makes the watchdog stop the server; waits for it."""
        if self._watchdog.stdin is not None:
            self._watchdog.stdin.close()
        self._watchdog.wait(timeout=60)
