"""Whole-job restarts (``--max-restarts``), once for every backend, over the lifecycle interface.

An attempt is render → stage → start → wait with its clocks (:mod:`poprun_py.launch.clocks`).
When it fails -- an instance exited non-zero, a host was lost, it hung or timed out -- every
instance has already been stopped (fail-fast), and the whole job starts again, up to
``max_restarts`` times, after ``restart_delay`` seconds; an interrupt (Ctrl-C, SIGTERM, SIGHUP)
never restarts. Every instance of attempt k sees ``POPRUN_RESTART_COUNT=k`` and
``TORCHELASTIC_RESTART_COUNT=k``.

Spares are preflighted at the same time as the hosts (a session of their own, closed again:
they are held back); one that fails is not used. A restart reuses the session (the same
connections; the ssh and MPI backends start new agents on them, slurm a new step in the same
allocation) unless a host was lost: then the session is closed and a new one opened, with a
spare in the place of each lost host (the same instances and replicas, so the global batch is
unchanged) or, without a spare, the same host if it answers preflight again. With ``--check``
the check (:mod:`poprun_py.launch.check`) runs on the job with the spares in place first: a
spare that fails it is skipped for the next one. When it does not,
the restart fails with one line (``restart_failed``) and the exit code stays the last
attempt's. The result is the last attempt's, with the earlier ones in ``attempts``.

Between attempts no job runs: the Control is disarmed (:meth:`Control.next_attempt`), so a stop
signal during the restart delay, the reconnect, preflight or staging interrupts the launch at
once (the result is the last attempt's, ``interrupted``: exit 130); SIGUSR1 and SIGUSR2 are
ignored then, and do not cut the delay short.

Each restart is told as it happens, on the :data:`ANNOUNCE` logger (INFO; the CLI prints its
records as plain lines on stderr): ``attempt 0 failed: ROOT CAUSE; restarting (1/2) in 5 s``
when an attempt failed, ``attempt 1 running (restart 1/2)`` once the next one runs.

Example:

    >>> from poprun_py.prepare.job import LaunchOptions, prepare
    >>> from poprun_py.testing.fakes import FakeBackend, Script
    >>> prep = prepare(LaunchOptions(hosts="h1,h2", program=("t",), max_restarts=2), environ={})
    >>> fake = FakeBackend(attempts=[{1: Script(exit_code=3)}, {}])
    >>> from poprun_py.launch.launcher import RunSettings, launch
    >>> result = launch(prep, RunSettings(), backend=fake)
    >>> result.ok, [a.exit_code for a in result.attempts], fake.calls.count("start")
    (True, [3], 2)
    >>> [job.instances[0].env["POPRUN_RESTART_COUNT"] for job in fake.started_jobs]
    ['0', '1']
    >>> why_failed(result.attempts[0])
    "instance 1 on h2 exited with code 3 (exit code 3 is the instance's own, not poprun-py's)"
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path

from poprun_py.backends.base import Backend, Checked, Session
from poprun_py.core.exit_codes import exit_phrase
from poprun_py.core.result import InstanceState, LaunchResult, RunOptions, RunSettings
from poprun_py.core.stacks import Hang
from poprun_py.errors import OWN_CODES, PoprunError, PreflightError
from poprun_py.hostside import private
from poprun_py.hostside.supervision import readable
from poprun_py.launch.clocks import Clocks, describe
from poprun_py.prepare.job import LongRun, Prepared, spares_only, with_hosts_replaced
from poprun_py.process.progress import Progress
from poprun_py.process.signals import Control
from poprun_py.render.job import RenderedJob

log = logging.getLogger("poprun_py.launch")
ANNOUNCE = logging.getLogger("poprun_py.launch.attempts")
"""Where each restart is told as it happens (INFO records, one line each)."""

Render = Callable[[Prepared, str, Checked, int], RenderedJob]
"""Renders attempt k's job: (prep, job dir, preflight's answer, restart count)."""


class RestartFailed(PoprunError):
    """A restart could not be made (a lost host without a spare does not answer)."""


@dataclass
class Attempts:
    """The restart loop of one launch. ``sessions`` closes every session it opened."""

    backend: Backend
    settings: RunSettings
    control: Control
    sessions: contextlib.ExitStack
    render: Render
    options: Callable[[Prepared, int, Progress], RunOptions]
    job_dir: Callable[[Prepared], str]
    sync_paths: Callable[[Prepared], list[str]] | None = None  # --sync: what to push
    closed: set[int] = field(default_factory=set)
    check: Callable[[Prepared], Mapping[str, str]] | None = (
        None  # --check: a spare passes it before it replaces a host
    )

    def run(self, prep: Prepared) -> LaunchResult:
        """Open, preflight, then attempt until one succeeds, is interrupted, or none is left."""
        with ThreadPoolExecutor(1, thread_name_prefix="poprun-spares") as spares:
            failing = spares.submit(self._failing_spares, prep)  # beside the hosts' preflight
            session, checked = self._open(prep)
            prep = self._without(checked.prep, failing.result())
        if self.sync_paths is not None:
            session.sync(self.sync_paths(prep), prep.long_run.timeout)  # --timeout bounds it
        checked = replace(checked, prep=prep)
        job_dir = self.job_dir(prep)
        done: list[LaunchResult] = []
        replaced: dict[str, str] = {}
        limit = prep.long_run.max_restarts
        for k in range(limit + 1):
            if k:
                self.control.next_attempt()  # disarmed: a signal raises KeyboardInterrupt
                _announce_restart(done[-1], k, limit, prep.long_run.restart_delay)
                try:
                    from poprun_py.process import phases

                    with phases.countdown(f"restart {k} of {limit}", prep.long_run.restart_delay):
                        paused = self._pause(prep.long_run.restart_delay)
                    if not paused:
                        return _history(replace(done[-1], interrupted=True), done)
                    lost = done[-1].lost_hosts
                    if lost:
                        try:
                            session, checked, replaced = self._reopen(session, prep, lost)
                        except (RestartFailed, PreflightError) as exc:
                            return _history(replace(done[-1], restart_failed=str(exc)), done)
                        prep = checked.prep
                    result = self._attempt(session, checked, job_dir, k, replaced)
                except KeyboardInterrupt:  # before attempt k ran; the sessions close anyway
                    self.control.interrupt()
                    return _history(replace(done[-1], interrupted=True), done)
            else:
                result = self._attempt(session, checked, job_dir, k, replaced)
            done.append(result)
            if result.ok or result.interrupted or self.control.interrupted:
                break
            stalled = no_progress(prep.long_run, done)
            if stalled and k < limit:
                ANNOUNCE.info("%s", stalled)
                return _history(replace(result, restart_failed=stalled), done)
        if done[-1].ok and not (self.settings.output_dir or self.settings.keep_job_dir):
            session.tidy(job_dir)  # the hosts' copies; the launcher removes this machine's
        return _history(done[-1], done)

    def _open(self, prep: Prepared) -> tuple[Session, Checked]:
        session = self.backend.open(prep, self.settings)
        self.sessions.callback(self._close, session)
        return session, session.preflight(prep)

    def _failing_spares(self, prep: Prepared) -> dict[str, str]:
        """Preflight the spares (in a session of their own, closed again: they are held
        back); every spare that fails, and why."""
        spare_prep = spares_only(prep)
        if spare_prep is None:
            return {}
        session = self.backend.open(spare_prep, self.settings)
        try:
            session.preflight(spare_prep)
            return {}
        except PreflightError as exc:
            return {f.host: f"{f.check}: {f.detail}" for f in reversed(exc.faults)}
        finally:
            session.close()

    @staticmethod
    def _without(prep: Prepared, failed: Mapping[str, str]) -> Prepared:
        """``prep`` without the spares that failed preflight (each named in a warning)."""
        for host, why in failed.items():
            log.warning("spare host %s failed preflight (%s): it will not be used", host, why)
        left = tuple(s for s in prep.long_run.spares if s.name not in failed)
        return replace(prep, long_run=replace(prep.long_run, spares=left))

    def _close(self, session: Session) -> None:
        """Close ``session`` once (a restart closes it early, the launch's end again)."""
        if id(session) not in self.closed:
            self.closed.add(id(session))
            session.close()

    def _attempt(
        self,
        session: Session,
        checked: Checked,
        job_dir: str,
        k: int,
        replaced: Mapping[str, str],
    ) -> LaunchResult:
        prep = checked.prep
        job = self.render(prep, job_dir, checked, k)
        self._record_plan(prep, k, replaced)
        session.stage(job)
        hosts = {cmd.index: cmd.host for cmd in job.instances}
        progress = Progress(hosts)
        run_opts = self.options(prep, k, progress)
        written = _mtime(prep.long_run.progress_file)
        self.control.arm()  # from now on a signal stops the instances instead of raising
        long_run = prep.long_run
        clocks = Clocks(
            self.control,
            progress,
            hosts,
            timeout=long_run.timeout,
            hang_timeout=long_run.hang_timeout,
        )
        with self.control.listening(lambda ended: progress.ended(ended.index)), clocks:
            running = session.start(job, run_opts, self.control)
            if k:
                ANNOUNCE.info("attempt %d running (restart %d/%d)", k, k, long_run.max_restarts)
            if self.settings.on_running is not None:
                self.settings.on_running(k)
            result = running.wait()
        pairs = tuple(sorted(replaced.items()))
        if clocks.hang is not None:
            self._record_hang(clocks.hang, k, job_dir)
        return replace(
            result,
            cause=clocks.cause or result.cause,
            replaced=pairs,
            hang=clocks.hang,
            last_step=progress.last_step,
            wrote_progress_file=_mtime(prep.long_run.progress_file) != written,
        )

    def _pause(self, delay: float) -> bool:
        """Wait ``delay`` seconds before a restart, whatever wakes the Control's pipe meanwhile
        (a signal writes to it: SIGUSR1 must not cut the delay short); False when interrupted
        meanwhile (a stop signal raises KeyboardInterrupt, disarmed, unless already taken)."""
        deadline = time.monotonic() + delay
        while not self.control.interrupted:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            readable([self.control.wake_fd], left)  # poll: fds above 1023 too
            self.control.drain()
        return not self.control.interrupted

    def _reopen(
        self, session: Session, prep: Prepared, lost: tuple[str, ...]
    ) -> tuple[Session, Checked, dict[str, str]]:
        """A new session after hosts were lost: a spare in each lost host's place (the same
        host again when no spare is left, if it answers preflight)."""
        self._close(session)
        spares = [s.name for s in prep.long_run.spares]
        replaced = {host: spares.pop(0) for host in lost if spares}
        while True:
            prep = self._spares_checked(prep, replaced, spares)
            for host, spare in replaced.items():
                log.warning("restart: spare host %s takes the place of lost host %s", spare, host)
            try:
                session, checked = self._open(with_hosts_replaced(prep, replaced))
            except PreflightError as exc:
                failing = [f.host for f in exc.faults]
                if spares and all(h in lost and h not in replaced for h in failing):
                    replaced.update({h: spares.pop(0) for h in failing if spares})
                    continue  # a host that does not answer again: a spare in its place
                reused = [h for h in failing if h in lost and h not in replaced]
                if reused:
                    raise RestartFailed(
                        f"cannot restart: host {reused[0]} was lost, does not answer again "
                        f"({exc.faults[0].detail}) and no spare is left"
                    ) from None
                raise
            return session, checked, replaced

    def _spares_checked(
        self, prep: Prepared, replaced: dict[str, str], spares: list[str]
    ) -> Prepared:
        """With ``--check``: the check runs on the job with ``replaced``'s spares in place; a
        spare that fails it is skipped for the next of ``spares`` (none left: the lost host
        again, if it answers preflight). ``prep`` without the spares that failed."""
        failed: dict[str, str] = {}
        while self.check is not None and replaced:
            found = self.check(with_hosts_replaced(prep, replaced))
            bad = [host for host, spare in replaced.items() if spare in found]
            if not bad:
                break
            for host in bad:
                spare = replaced.pop(host)
                failed[spare] = found[spare]
                log.warning(
                    "restart: spare host %s failed the check (%s): not used", spare, failed[spare]
                )
                if spares:
                    replaced[host] = spares.pop(0)
        left = tuple(s for s in prep.long_run.spares if s.name not in failed)
        return replace(prep, long_run=replace(prep.long_run, spares=left))

    def _record_hang(self, hang: Hang, k: int, job_dir: str) -> None:
        """The hang's verdict as JSON (``hang.json``, ``hang-restart-K.json`` for attempt K) in
        ``--output-dir``, else in the job's directory on this machine."""
        where = Path(self.settings.output_dir or job_dir)
        path = where / (f"hang-restart-{k}.json" if k else "hang.json")
        try:
            private.private_dir(str(where))
            private.write_private(str(path), json.dumps(hang.to_json(), indent=1) + "\n")
        except OSError as exc:  # UnsafePath too
            log.warning("cannot write the hang's verdict to %s: %s", path, exc)
            return
        log.warning("hang verdict written to %s", path)

    def _record_plan(self, prep: Prepared, k: int, replaced: Mapping[str, str]) -> None:
        """With ``--output-dir``: each restart's plan, saying which host replaced which."""
        if not self.settings.output_dir or not k:
            return
        from poprun_py.core.views import plan_dict

        record = {"restart": k, "replaced": dict(replaced), "plan": plan_dict(prep.plan)}
        path = Path(self.settings.output_dir) / f"plan-restart-{k}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")


def why_failed(result: LaunchResult) -> str:
    """One line: why an attempt failed (its job-level cause, else its root cause)."""
    if result.cause is not None:
        return result.cause.reason
    root = result.root_cause
    if root is None:
        return "the launch failed"
    if root.state is InstanceState.LOST:
        what = f"lost contact with host {root.host}"
    else:
        what = exit_phrase(root.exit_code, root.signal)  # 143: "..., killed by SIGTERM"
    detail = f" ({root.detail})" if root.detail else ""
    own = ""
    if root.state is not InstanceState.LOST and root.code in OWN_CODES:
        own = f" (exit code {root.code} is the instance's own, not poprun-py's)"
    return f"instance {root.index} on {root.host} {what}{detail}{own}"


def _announce_restart(failed: LaunchResult, k: int, limit: int, delay: float) -> None:
    """Attempt ``k - 1`` failed and attempt ``k`` is next: say so now, not at the job's end."""
    when = f"in {describe(delay)}" if delay > 0 else "now"
    ANNOUNCE.info(
        "attempt %d failed: %s; restarting (%d/%d) %s", k - 1, why_failed(failed), k, limit, when
    )


def _mtime(path: str | None) -> float | None:
    """``path``'s modification time (None: no path, or no such file)."""
    if path is None:
        return None
    try:
        return os.stat(path).st_mtime
    except OSError:
        return None


def no_progress(long_run: LongRun, done: Sequence[LaunchResult]) -> str:
    """Why the last of ``done`` is not restarted (``--min-progress``: it got fewer than N
    steps further than the attempt before, and did not write ``--progress-file``), or ""."""
    need, last = long_run.min_progress, done[-1]
    if need is None or last.wrote_progress_file:
        return ""
    k = len(done) - 1
    before = done[-2].last_step if k else None
    if last.last_step is not None and last.last_step - (before or 0) >= need:
        return ""
    if last.last_step is None:
        got = "no step reported"
    elif before is None:
        got = f"last step {last.last_step}"
    else:
        got = f"last step {last.last_step}; attempt {k - 1} reached {before}"
    written = f", {long_run.progress_file} not written" if long_run.progress_file else ""
    return f"attempt {k} made no progress ({got}{written}; --min-progress {need}): not restarting"


def _history(last: LaunchResult, done: list[LaunchResult]) -> LaunchResult:
    """The last attempt's result (``done[-1]``, or a copy of it with more said), carrying the
    earlier ones."""
    earlier = tuple(done[:-1])
    return replace(last, attempts=earlier) if earlier else last
