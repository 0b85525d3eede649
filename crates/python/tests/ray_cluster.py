"""A local Ray cluster for the Ray engine's test and bench/sweep: a head
and a second node started with `ray start` (one CPU each), in network, PID
and mount namespaces of their own (made with unshare, as root or as a
mapped root). There Ray binds and talks on 127.0.0.1 only, `ray stop
--force` sees and stops this cluster's processes only, and the
namespaces' first process ends after :data:`LIFETIME` seconds whatever
happens to the caller, every process in them with it."""

import os
import signal
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
#: The most a cluster lives, in seconds.
LIFETIME = 240
#: The head's port: the namespace is new, so it is free.
PORT = 6379
ADDRESS = f"127.0.0.1:{PORT}"


def ns_of(pid, kind="pid"):
    try:
        return os.readlink(f"/proc/{pid}/ns/{kind}")
    except OSError:
        return None


def cmdline(pid):
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
    except OSError:
        return ""


def pids():
    return [int(p) for p in os.listdir("/proc") if p.isdigit()]


class Cluster:
    """A head and a second node, one CPU each, in namespaces of their own."""

    def __init__(self, tmp: Path, lifetime: int = LIFETIME, python: str = sys.executable):
        """``python``: the Python with Ray installed (its ``ray`` beside it)."""
        self.tmp, self.python = tmp, python
        self.ray = str(Path(python).parent / "ray")
        self.env = dict(os.environ, RAY_USAGE_STATS_ENABLED="0")
        self.env.pop("RAY_ADDRESS", None)
        mapped = [] if os.geteuid() == 0 else ["--map-root-user"]
        # The namespaces' first process: brings 127.0.0.1 up, then reaps
        # orphans (as an init does) until LIFETIME is over.
        init = (
            "import os, subprocess, sys, time\n"
            "subprocess.run(['ip', 'link', 'set', 'lo', 'up'], check=True)\n"
            "print('up', flush=True)\n"
            f"end = time.time() + {lifetime}\n"
            "while time.time() < end:\n"
            "    try:\n"
            "        while os.waitpid(-1, os.WNOHANG)[0]: pass\n"
            "    except ChildProcessError: pass\n"
            "    time.sleep(0.2)\n"
        )
        self.unshare = subprocess.Popen(
            ["unshare", *mapped, "--net", "--pid", "--fork", "--mount-proc",
             python, "-c", init],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        if self.unshare.stdout.readline().strip() != "up":
            err = self.unshare.communicate(timeout=10)[1]
            raise RuntimeError(f"cannot make the cluster's namespaces: {err.strip()}")
        self.init = int(
            Path(f"/proc/{self.unshare.pid}/task/{self.unshare.pid}/children").read_text().split()[0]
        )
        self.pidns = ns_of(self.init)
        ns = [f"--{opt}=/proc/{self.init}/ns/{k}"
              for opt, k in (("net", "net"), ("pid", "pid"), ("mount", "mnt"))]
        self.enter = ["nsenter", *ns, f"--wd={ROOT}", "--"]

    def run(self, args, **kw):
        return subprocess.run(self.enter + args, env=self.env, capture_output=True, text=True, **kw)

    def popen(self, args, **kw):
        return subprocess.Popen(self.enter + args, env=self.env, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, **kw)

    def start(self):
        common = ["--num-cpus", "1", "--object-store-memory", "100000000",
                  "--disable-usage-stats", "--node-ip-address", "127.0.0.1"]
        head = [self.ray, "start", "--head", "--port", str(PORT),
                "--include-dashboard", "false", "--temp-dir", str(self.tmp / "head"), *common]
        node = [self.ray, "start", "--address", ADDRESS,
                "--temp-dir", str(self.tmp / "node"), *common]
        for cmd in (head, node):
            r = self.run(cmd, timeout=120)
            if r.returncode != 0:
                raise RuntimeError(f"{' '.join(cmd)} failed: {r.stdout}{r.stderr}")
        # Both nodes' CPUs registered.
        probe = ("import ray, time\nray.init(address=%r, logging_level='ERROR')\n"
                 "end = time.time() + 60\n"
                 "while ray.cluster_resources().get('CPU', 0) < 2 and time.time() < end:\n"
                 "    time.sleep(0.2)\n"
                 "print(ray.cluster_resources().get('CPU', 0))\n" % ADDRESS)
        r = self.run([self.python, "-c", probe], timeout=120)
        if r.stdout.strip().splitlines()[-1:] != ["2.0"]:
            raise RuntimeError(f"the cluster's two CPUs did not come up: {r.stdout}{r.stderr}")

    def processes(self):
        """This cluster's processes (host PIDs) but its first one."""
        return [p for p in pids() if p != self.init and ns_of(p) == self.pidns]

    def cpu_ticks(self):
        """Each of the cluster's processes' CPU time (user and system) so
        far, in clock ticks, by (PID, start time)."""
        out = {}
        for pid in self.processes():
            try:
                fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            out[(pid, fields[19])] = int(fields[11]) + int(fields[12])  # utime stime
        return out

    def cpu_meter(self):
        """A meter of the CPU time the cluster's processes take while it
        runs (``with cluster.cpu_meter() as m: ...; m.seconds``): sampled
        every 20 ms, since a job's workers end with it and their parent
        leaves no account of them (the last 20 ms of a process that ends
        are not seen)."""
        return _CpuMeter(self)

    def stop(self):
        """`ray stop --force` in the namespaces, then the namespaces' first
        process is killed, which ends every process left in them."""
        if self.unshare.poll() is None:
            try:
                self.run([self.ray, "stop", "--force"], timeout=60)
            except (subprocess.TimeoutExpired, OSError):
                pass
            try:
                os.kill(self.init, signal.SIGKILL)
            except ProcessLookupError:
                pass
        try:
            self.unshare.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            self.unshare.kill()
            self.unshare.communicate()


def kind(cmd):
    """What a process of the cluster is, from its command line: Ray's
    workers rename themselves ``ray::<task>`` (``ray::IDLE`` between tasks);
    the raylet's own arguments name the worker's script, so the program
    and the script it runs are looked at, not the whole line."""
    if cmd.startswith("ray::"):
        return "workers"
    words = cmd.split()
    program = os.path.basename(words[0]) if words else ""
    script = next((w for w in words[1:] if not w.startswith("-")), "")
    if program == "hugelab":
        return "hugelab CLI"
    for needle, name in (("raylet", "raylets"), ("gcs_server", "GCS")):
        if needle in program:
            return name
    if program.startswith("python"):
        for needle, name in (("default_worker.py", "workers"),
                             ("hugelab._ray_sweep", "engine process"),
                             ("agent", "agents"), ("monitor", "monitors")):
            if needle in script:
                return name
    return "other"


class _CpuMeter:
    def __init__(self, cluster):
        self.cluster, self.seconds = cluster, 0.0
        #: The seconds by what the process is (:func:`kind`), and the
        #: number of processes of each kind that started meanwhile.
        self.by_kind, self.started = {}, {}
        self.kinds = {}

    def _note(self, ticks):
        for key in ticks:
            if key not in self.kinds:
                self.kinds[key] = kind(cmdline(key[0]))
        self.last.update(ticks)

    def __enter__(self):
        import threading

        self.start = self.cluster.cpu_ticks()
        self.last = {}
        self._note(self.start)
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._sample, daemon=True)
        self.thread.start()
        return self

    def _sample(self):
        while not self.done.wait(0.02):
            self._note(self.cluster.cpu_ticks())

    def __exit__(self, *exc):
        self.done.set()
        self.thread.join()
        self._note(self.cluster.cpu_ticks())
        hz = os.sysconf("SC_CLK_TCK")
        for key, t in self.last.items():
            k = self.kinds[key]
            self.by_kind[k] = self.by_kind.get(k, 0.0) + (t - self.start.get(key, 0)) / hz
            if key not in self.start:
                self.started[k] = self.started.get(k, 0) + 1
        self.seconds = sum(self.by_kind.values())
