"""The host-side agent of the ssh backend: one per host, started over that host's connection.

The ssh backend starts it with the one bootstrap of :mod:`poprun_py.hostside.bundle`, which reads
the agent from stdin, bundled with the modules it imports -- so nothing has to be installed on the
host (a python3 older than :data:`MIN_PYTHON` is refused with one line, which preflight reports
for that host: exit 3, nothing started); then poprun-py writes requests: commands to run first
(preflight's checks, so a whole launch costs one login session per host), then the host's part
of the job, then control lines; after the job, if its header says ``linger``, requests again
until stdin closes (the job directory's removal). It uses the standard library only and runs on
any Python 3.7+ on Linux.

What it does, with the local backend's rules and code (:mod:`poprun_py.hostside.supervision`,
shipped inside the agent): writes the job's files (mode 0600); starts every instance in its own
session, so its process group can be signalled as a whole, bound to its CPUs and NUMA nodes when
the plan binds it (no numactl needed), with the instance environment (which therefore never
appears in any argv); forwards each output line tagged with the instance index (a line over 1
MiB in pieces); reports each exit at once. When every instance has ended it stops what they left
behind (their process groups and sessions, and anything carrying this run's ``POPRUN_RUN_ID``):
SIGTERM, then SIGKILL after the grace period. On ``term`` it stops everything the same way. When
poprun-py is gone -- stdin closed, a write to the channel failed, or no heartbeat for
``liveness`` seconds (the host was cut off; ``--host-timeout``; not after ``pause``, Ctrl-Z,
until poprun-py speaks again) -- it does so on its own. No pid is signalled that may be another
process's by then (:mod:`poprun_py.hostside.identity`).

The protocol is specified in :mod:`poprun_py.hostside.protocol` (bundled into the agent's
source with the modules it imports: :mod:`poprun_py.hostside.bundle`).

Example (the agent run locally, as its tests do)::

    >>> import json, subprocess, sys
    >>> job = {"instances": [{"index": 3, "argv": ["echo", "hi"], "env": {}, "cwd": None}]}
    >>> out = subprocess.run([sys.executable, "-m", "poprun_py.hostside.agent", "--no-stdin-eof"],
    ...     input=b"job " + json.dumps(job).encode() + b"\\n", capture_output=True).stdout
    >>> [r for r in out.decode().splitlines() if r[0] in "oxd"]
    ['o 3 hi', 'x 3 0', 'd']
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import threading
import time

from poprun_py.hostside.private import write_files  # bundled: the agent ships alone
from poprun_py.hostside.protocol import (  # bundled: the agent ships alone
    DONE,
    DONE_LINGERING,
    DUMP_LINE,
    DUMP_RANKS_LINE,
    EXITED,
    FAILED,
    HEARTBEAT_LINE,
    JOB,
    KILL_LINE,
    KILLED,
    NOT_STARTED,
    PAUSE_LINE,
    RANK_DUMPED,
    RANK_STACK,
    REPLY,
    REQUEST_PUT,
    REQUEST_RUN,
    SIGNAL_LINE,
    SIGNAL_RANKS_LINE,
    STACKS,
    STACKS_FAULTHANDLER,
    STACKS_NONE,
    STACKS_PYSPY,
    STARTED,
    STDERR,
    STDOUT,
    STOP_LINE,
    TERM_LINE,
    dump_indexes,
    record,
)
from poprun_py.hostside.stackdump import (  # bundled: the agent ships alone
    dump_in_background,
    dump_ranks,
    dump_trees,
    signal_ranks,
)
from poprun_py.hostside.supervision import (  # bundled: the agent ships alone
    RUN_ID_VAR,
    Grace,
    Launched,
    LineFeed,
    Pipe,
    Poller,
    Spawner,
    kill_group_left,
    left_behind,
    send_signal,
    signal_left_behind,
)

TYPE_CHECKING = False  # not typing's: importing typing costs the agent's start ~6 ms
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

MIN_PYTHON = (3, 7)  # the oldest python3 the agent runs on (checked by bundle.BOOTSTRAP)
DRAIN = 1.0  # once nothing is left running, how long to wait for the last output
SCAN_EVERY = 0.05  # while stopping leftovers, how often to look for them in /proc
MAX_PENDING = 1 << 22  # stop reading instance output while this much waits for the channel
IDLE = 3600.0  # before the job: silence after which poprun-py is taken to be gone (cut off)


class _Instance:
    """One started instance: its process, and its open output pipes (fd -> pipe), each line of
    which goes to ``emit`` as a record tagged with the instance index."""

    def __init__(self, index: int, proc: Launched, emit: Callable[[bytes], None]) -> None:
        self.index, self.proc = index, proc
        self.reported = False
        self.pipes: dict[int, Pipe] = {}
        for file, kind in ((proc.stdout, STDOUT), (proc.stderr, STDERR)):
            pipe = Pipe(file, LineFeed(self.tagger(kind, emit)))
            self.pipes[pipe.fd] = pipe

    def tagger(self, kind: bytes, emit: Callable[[bytes], None]) -> Callable[[list[bytes]], None]:
        """What sends lines of one stream: each as a ``kind`` record of this instance."""

        def send(lines: list[bytes]) -> None:
            for line in lines:
                emit(b"%s %d %s" % (kind, self.index, line))

        return send

    @property
    def reaped_at(self) -> int | None:
        """The clock tick (/proc's) at which it was reaped, or None."""
        return self.proc.reaped_at

    def poll(self) -> int | None:
        """Its exit code once it has ended (it is reaped then), else None."""
        return self.proc.poll()

    def signal(self, sig: int) -> None:
        """``sig`` to its group while it is our unreaped child: once reaped, its pid (and group
        id) may be anyone's (its leftovers: :meth:`Agent.leftovers`)."""
        if self.poll() is None:
            self.proc.signal(sig)


class Agent:
    """The agent's state and event loop; :meth:`run` returns when the host's job is over."""

    def __init__(self, header: dict[str, Any], control: bytes, in_fd: int = 0, out_fd: int = 1):
        self.header = header
        self.in_fd, self.out_fd = in_fd, out_fd
        self.heartbeat = float(header.get("heartbeat", 0.5))
        self.liveness = float(header.get("liveness", 0.0))
        self.grace = Grace(float(header.get("grace", 5.0)))
        run_id = str(header.get("run_id", os.getpid()))
        self.token = f"{RUN_ID_VAR}={run_id}"
        self.spawner = Spawner({RUN_ID_VAR: run_id}, new_session=True)
        self.sel = Poller()
        self.pending = bytearray()
        self.control = bytearray(control)
        self.instances: list[_Instance] = []
        self.heard = self.sent = time.monotonic()
        self.paused = False  # poprun-py said it stops (Ctrl-Z): no silence limit until it speaks
        self.in_open = True  # False once poprun-py cannot hear us (stdin EOF, broken channel)
        self.stopping = False  # SIGTERM sent (asked, orphaned, or every instance ended)
        self.failed = False  # an instance failed by itself, or poprun-py said stop: no linger
        self.serves_after = False  # said with its last record: it lingers after the job
        self.scanned = 0.0
        self.clean_at: float | None = None  # when no leftover was found any more
        self.wake_r, self.wake_w = os.pipe()
        self.dumper: threading.Thread | None = None  # a stack dump under way (py-spy)
        self.dumps: list[tuple[set[int] | None, dict[int, list[bytes] | None]]] = []

    # ------------------------------------------------------------ setup

    def start(self) -> None:
        """Write the job's files, start the instances, and register every fd."""
        for fd in (self.wake_r, self.wake_w, self.out_fd):
            os.set_blocking(fd, False)
        signal.set_wakeup_fd(self.wake_w, warn_on_full_buffer=False)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
            signal.signal(sig, lambda *_: self.stop())
        self.sel.register(self.wake_r, "wake")
        self.sel.register(self.in_fd, "control")
        failure = self.write_files()
        for spec in self.header.get("instances", []):
            if failure:
                self.emit(record(FAILED, spec["index"], failure.encode()))
            elif not self.stopping:
                self.spawn(spec)
            else:
                self.emit(record(NOT_STARTED, spec["index"], b"not started: stopping"))
        self.handle_control()  # control lines that came with the header

    def write_files(self) -> str:
        """Write every file of the header (atomically, mode 0600); '' or what went wrong."""
        return write_files(self.header.get("files", []))

    def spawn(self, spec: dict[str, Any]) -> None:
        """Start one instance in its own session, with its environment over the agent's, bound
        to its ``cpus`` and its memory to NUMA nodes ``mems`` when given (the agent binds itself
        around the start; the instance inherits the binding)."""
        env, cwd = spec.get("env") or {}, spec.get("cwd") or None
        try:
            cpus, mems = spec.get("cpus") or (), spec.get("mems") or ()
            proc = self.spawner.start(spec["argv"], env, cwd, cpus, mems)
        except OSError as exc:
            what = str(spec["argv"][0] if exc.filename is None else exc.filename)
            why = f"cannot start {what!r}: {exc.strerror or exc}"
            self.emit(record(FAILED, spec["index"], why.encode()))
            return
        inst = _Instance(int(spec["index"]), proc, self.emit)
        self.instances.append(inst)
        self.emit(record(STARTED, inst.index, proc.pid))
        for fd, pipe in inst.pipes.items():
            os.set_blocking(fd, False)
            self.sel.register(fd, (inst, pipe))

    # ------------------------------------------------------------ the loop

    def run(self) -> None:
        """Supervise until the host's job is over and its records are sent (or nobody listens)."""
        while not self.finished(time.monotonic()):
            timeout = max(0.0, min(self.deadlines()) - time.monotonic())
            for data in self.sel.ready(timeout):
                if data == "wake":
                    self.drain_wakeups()
                elif data == "control":
                    self.read_control()
                elif data == "out":
                    self.flush()
                else:
                    self.read_pipe(*data)
            self.tick(time.monotonic())
        for inst in self.instances:
            for pipe in list(inst.pipes.values()):
                self.close_pipe(inst, pipe)
        self.spawner.close()
        self.serves_after = self.lingers()
        self.emit(DONE_LINGERING if self.serves_after else DONE)
        if self.in_open:
            os.set_blocking(self.out_fd, True)
            self.flush()

    def finished(self, now: float) -> bool:
        """Every instance reported, no leftover, output drained (or nobody listens any more)."""
        if not self.all_reported() or self.clean_at is None:
            return False
        if self.dumper is not None and self.dumper.is_alive():
            return False  # its py-spy runs end within their timeout
        pipes_done = not any(inst.pipes for inst in self.instances) or now >= self.clean_at + DRAIN
        return pipes_done and not (self.in_open and self.pending)

    def deadlines(self) -> list[float]:
        """Times at which the loop must wake even without input."""
        now = time.monotonic()
        times = [self.sent + self.heartbeat] + [now + w for w in self.grace.waits(now)]
        if self.listening():
            times.append(self.heard + self.liveness)
        if self.stopping and self.clean_at is None and self.all_reported():
            times.append(self.scanned + SCAN_EVERY)  # before that, SIGCHLD wakes the loop
        if self.clean_at is not None:
            times.append(self.clean_at + DRAIN)
        return times

    def tick(self, now: float) -> None:
        """Time-driven work: reap, dumps, liveness, SIGKILL after grace, leftovers, heartbeat."""
        while self.dumps:
            self.dumped(*self.dumps.pop(0))
        self.reap()
        if self.all_reported():
            self.stop()
        if self.listening() and now - self.heard > self.liveness:
            self.in_open = False  # cut off: nobody hears us, and our output would only pile up
            self.pending.clear()
            self.stop()
        if self.grace.due(now) and self.grace.kill():
            self.signal_all(signal.SIGKILL)
        if self.stopping and self.clean_at is None and now - self.scanned >= SCAN_EVERY:
            self.scanned = now
            if self.all_reported() and not self.leftovers():
                self.clean_at = now
        if now - self.sent >= self.heartbeat:
            self.emit(HEARTBEAT_LINE)
        self.update_interest()

    def lingers(self) -> bool:
        """Serve requests after the job? Only if its header says ``linger``, poprun-py still
        listens, and this host's part succeeded (nothing is asked after a failure)."""
        if not (self.header.get("linger") and self.in_open and self.in_fd == 0):
            return False
        return not self.failed and len(self.instances) == len(self.header.get("instances", []))

    def all_reported(self) -> bool:
        """Every instance's end was reported."""
        return all(inst.reported for inst in self.instances)

    def listening(self) -> bool:
        """True while poprun-py's silence counts: a limit, a channel, and no pause."""
        return self.liveness > 0 and self.in_open and not self.paused

    def reap(self) -> None:
        """Report every instance that has exited."""
        for inst in self.instances:
            code = inst.poll() if not inst.reported else None
            if code is not None:
                inst.reported = True
                self.failed |= code != 0 and not self.stopping  # not one we stopped
                self.emit(
                    record(KILLED, inst.index, -code)
                    if code < 0
                    else record(EXITED, inst.index, code)
                )

    # ------------------------------------------------------------ input

    def drain_wakeups(self) -> None:
        """Empty the signal wakeup pipe (SIGCHLD and friends); tick() does the work."""
        try:
            while os.read(self.wake_r, 512):
                pass
        except BlockingIOError:
            pass

    def read_control(self) -> None:
        """Read control lines from poprun-py; EOF means it is gone."""
        try:
            data = os.read(self.in_fd, 4096)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            self.sel.unregister(self.in_fd)
            self.in_open = False
            self.pending.clear()
            self.stop()
            return
        self.heard = time.monotonic()
        self.paused = False  # poprun-py speaks again: its silence counts again
        self.control += data
        self.handle_control()

    def handle_control(self) -> None:
        """Act on every complete control line received so far."""
        while b"\n" in self.control:
            line, _, rest = bytes(self.control).partition(b"\n")
            self.control = bytearray(rest)
            if line in (TERM_LINE, STOP_LINE):
                self.failed |= line == STOP_LINE
                self.stop()
            elif line == KILL_LINE:
                self.signal_all(signal.SIGKILL)
            elif line == PAUSE_LINE:
                self.paused = True
            elif line.startswith(SIGNAL_LINE + b" ") and line[4:].isdigit():
                self.forward(int(line[4:]))
            elif line.startswith(SIGNAL_RANKS_LINE + b" ") and line[5:].isdigit():
                running = [i.proc.pid for i in self.instances if i.poll() is None]
                signal_ranks(running, int(line[5:]))
            elif line.startswith(DUMP_LINE + b" "):
                self.dump(dump_indexes(line))
            elif line == DUMP_RANKS_LINE:
                self.dump(None)

    def dump(self, faulthandler: set[int] | None) -> None:
        """Every running instance's stacks: ``py-spy dump`` of its Python processes on a
        thread (the loop goes on), else SIGUSR1 to those in ``faulthandler``; None: by rank
        (an MPI daemon's ranks), no SIGUSR1."""
        roots = {i.index: i.proc.pid for i in self.instances if i.poll() is None}

        def done(found: dict[int, list[bytes] | None]) -> None:
            self.dumps.append((faulthandler, found))
            with contextlib.suppress(OSError):
                os.write(self.wake_w, b"\0")  # the loop (tick) sends the dumps

        if self.dumper is not None:
            self.dumper.join()
        by = dump_ranks if faulthandler is None else dump_trees
        self.dumper = dump_in_background(roots, done, by)

    def dumped(self, faulthandler: set[int] | None, found: dict[int, list[bytes] | None]) -> None:
        """Send each dump as its instance's stderr lines, SIGUSR1 where there is none and
        the instance registered faulthandler, and a ``y`` record for each (by rank: ``s``
        lines and a ``w`` record for each rank, then ``y`` for each instance)."""
        running = {i.index: i for i in self.instances if i.poll() is None}
        if faulthandler is None:
            for rank, lines in sorted(found.items()):
                for line in lines or ():
                    self.emit(record(RANK_STACK, rank, line))
                how = STACKS_NONE if lines is None else STACKS_PYSPY
                self.emit(record(RANK_DUMPED, rank, how))
            found, faulthandler = dict.fromkeys(running), set()
        for index, lines in sorted(found.items()):
            how = STACKS_NONE
            if lines is not None:
                for line in lines:
                    self.emit(record(STDERR, index, line))
                how = STACKS_PYSPY
            elif index in running and index in faulthandler:
                running[index].signal(signal.SIGUSR1)
                how = STACKS_FAULTHANDLER
            self.emit(record(STACKS, index, how))

    def forward(self, sig: int) -> None:
        """Send ``sig`` to every instance still running (its process group); nothing else."""
        for inst in self.instances:
            if not inst.reported:
                inst.signal(sig)

    def read_pipe(self, inst: _Instance, pipe: Pipe) -> None:
        """Forward the complete lines of one instance pipe (the last one at its end)."""
        if not pipe.read():
            self.close_pipe(inst, pipe)

    def close_pipe(self, inst: _Instance, pipe: Pipe) -> None:
        """Send a pipe's last partial line and close it."""
        del inst.pipes[pipe.fd]
        if pipe.fd in self.sel.data:
            self.sel.unregister(pipe.fd)
        pipe.close()

    # ------------------------------------------------------------ output

    def emit(self, record: bytes) -> None:
        """Queue one record for poprun-py (dropped once nobody listens)."""
        self.sent = time.monotonic()
        if self.in_open:
            self.pending += record + b"\n"
            self.flush()

    def flush(self) -> None:
        """Write as much pending output as the channel takes without blocking."""
        while self.pending:
            try:
                n = os.write(self.out_fd, self.pending[:65536])
            except BlockingIOError:
                return
            except OSError:
                self.pending.clear()
                self.in_open = False
                self.stop()
                return
            del self.pending[:n]

    def update_interest(self) -> None:
        """Watch the channel while output waits; stop reading pipes while too much waits."""
        registered = self.sel.data
        want_out = bool(self.pending) and self.in_open
        if want_out and self.out_fd not in registered:
            self.sel.register(self.out_fd, "out", write=True)
        elif not want_out and self.out_fd in registered:
            self.sel.unregister(self.out_fd)
        paused = len(self.pending) > MAX_PENDING
        for inst in self.instances:
            for fd, pipe in inst.pipes.items():
                if paused and fd in registered:
                    self.sel.unregister(fd)
                elif not paused and fd not in registered:
                    self.sel.register(fd, (inst, pipe))

    # ------------------------------------------------------------ stopping

    def stop(self) -> None:
        """SIGTERM every instance and leftover now; SIGKILL after the grace period."""
        if not self.stopping:
            self.stopping = True
            self.signal_all(signal.SIGTERM)

    def signal_all(self, sig: int) -> None:
        """Signal every running instance's process group, and every leftover found in /proc,
        each only if its pid still names the process found (:mod:`~poprun_py.hostside.identity`:
        a pid reaped meanwhile may be anyone's)."""
        for inst in self.instances:
            inst.signal(sig)
        signal_left_behind(self.leftovers(), sig)
        if sig == signal.SIGTERM:
            self.grace.begin(time.monotonic())

    def leftovers(self) -> list[tuple[int, int]]:
        """(pid, start time) of every live process in an instance's group or session -- a
        reaped one's only while it still leads it -- or carrying this run's id."""
        return left_behind([i.proc for i in self.instances], self.token)


def serve(fd: int = 0, idle: float = IDLE, data: bytes = b"") -> tuple[dict[str, Any], bytes]:
    """Answer ``run``/``put`` requests until the ``job`` line; return the job and the rest
    (``data``: what was read already).

    Exits when stdin ends or stays silent for ``idle`` seconds (poprun-py is gone).
    """
    poll = select.poll()  # not select(): it cannot take a descriptor above 1023
    poll.register(fd, select.POLLIN)
    while True:
        while b"\n" not in data:
            ready = poll.poll(idle * 1000)
            chunk = os.read(fd, 65536) if ready else b""
            if not chunk:
                sys.exit(0)
            data += chunk
        line, _, data = data.partition(b"\n")
        verb, _, body = line.partition(b" ")
        if verb == JOB:
            job: dict[str, Any] = json.loads(body)
            return job, data
        if verb in (REQUEST_RUN, REQUEST_PUT):
            request = json.loads(body)
            answer = run_request(request) if verb == REQUEST_RUN else put_request(request)
            _write_all(1, REPLY + b" " + json.dumps(answer).encode() + b"\n")


def put_request(request: dict[str, Any]) -> dict[str, Any]:
    """Write the request's ``files``; the reply's ``error`` is '' or what went wrong."""
    return {"id": request.get("id"), "error": write_files(request.get("files") or [])}


def run_request(request: dict[str, Any]) -> dict[str, Any]:
    """Run one command to the end (its own session, killed at its timeout); its outcome."""
    reply: dict[str, Any] = {"id": request.get("id"), "timeout": False}
    try:
        env, cwd = request.get("env") or {}, request.get("cwd") or None
        proc = subprocess.Popen(
            request["argv"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env={**os.environ, **env},
            cwd=cwd,
            start_new_session=True,  # its process group can be signalled as a whole
        )
    except OSError as exc:
        return {**reply, "code": 127, "stdout": "", "stderr": f"{request['argv'][0]}: {exc}"}
    stdin = (request.get("stdin") or "").encode("utf-8", "surrogateescape")
    try:
        out, err = proc.communicate(stdin, timeout=request.get("timeout"))
    except subprocess.TimeoutExpired:
        if proc.returncode is None:  # not reaped: its group is still its own
            send_signal(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        reply["timeout"] = True
    kill_group_left(proc.pid)  # nothing it started outlives it
    code = proc.returncode if proc.returncode >= 0 else 128 - proc.returncode
    text = {"stdout": out.decode("utf-8", "replace"), "stderr": err.decode("utf-8", "replace")}
    return {**reply, "code": code, **text}


def _write_all(fd: int, data: bytes) -> None:
    while data:
        data = data[os.write(fd, data) :]


def main(argv: list[str] | None = None) -> None:
    """Entry point: serve requests, then run the job, exit 0 -- or, when the job's header
    says ``linger`` and this host's part succeeded, serve requests again until poprun-py
    closes stdin (it removes the job's directory through this agent: no second login session).

    ``--no-stdin-eof`` (for local tests and the example): end of stdin after the job line is
    not taken to mean that poprun-py is gone.

    It ends with ``os._exit`` once flushed: the interpreter's teardown cost ~2.5 ms of CPU.
    """
    code = 0
    try:
        _serve_and_run(sys.argv[1:] if argv is None else argv)
    except SystemExit as end:  # serve(): stdin ended, or stayed silent (poprun-py is gone)
        code = end.code if isinstance(end.code, int) else 0
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _serve_and_run(args: list[str]) -> None:
    header, rest = serve()
    in_fd = 0
    if "--no-stdin-eof" in args:
        in_fd, _keep_open = os.pipe()  # a control fd that never yields data or EOF
    agent = Agent(header, rest, in_fd=in_fd)
    agent.start()
    agent.run()
    if agent.serves_after:
        serve(0, IDLE, bytes(agent.control))  # exits at EOF; a second job is not taken


if __name__ == "__main__":
    main()
