"""The job root and private files: the one way poprun-py writes a file only its user may read,
here and on every host (host-side: standard library only, Python 3.7+; inlined into the agent
and into ``hostops`` when they ship, by :mod:`poprun_py.hostside.bundle`).

- :func:`job_root`: this user's tree of job directories on this host, keyed on the uid:
  ``$POPRUN_PY_JOB_ROOT``, else ``/tmp/poprun-py-UID`` (the same path on every host: rendered
  commands name it); :func:`runtime_root` prefers ``$XDG_RUNTIME_DIR/poprun-py`` for files that
  never leave this machine and never outlive the login session.
- :func:`private_dir`: a directory made (mode 0700, with its missing parents) or checked for
  private files: :class:`UnsafePath` when a directory on the way sits in one every user may
  write to (``/tmp``) and belongs to another user (not root), or is writable by other users
  without the sticky bit (by every user; by its group too, in ``/tmp``) -- another user could
  then swap the files poprun-py writes there.
- :func:`write_private`: replace a file atomically, mode 0600: a unique temporary name
  opened with ``O_EXCL|O_NOFOLLOW`` (a planted symlink is never followed), written, fsync'ed
  (``durable``), renamed over the old file: a reader sees the old or the new text, never half,
  and two writers never collide.
- :func:`open_private`: a log opened for appending lines (mode 0600; never through a symlink).
- :func:`write_files`: a job's files, each by :func:`write_private` in a :func:`private_dir`.

Example:

    >>> import tempfile
    >>> root = tempfile.mkdtemp()
    >>> path = os.path.join(private_dir(os.path.join(root, "a", "b")), "x.json")
    >>> write_private(path, '{"a": 1}')
    >>> [oct(os.stat(p).st_mode & 0o777) for p in (path, root + "/a")], open(path).read()
    (['0o600', '0o700'], '{"a": 1}')
    >>> os.symlink(path, path + ".log")  # planted where a log goes: replaced, never followed
    >>> os.close(open_private(path + ".log"))
    >>> os.path.islink(path + ".log"), open(path).read()
    (False, '{"a": 1}')
"""

from __future__ import annotations

import contextlib
import os
import stat

TYPE_CHECKING = False  # not typing's: importing typing costs the agent's start ~6 ms
if TYPE_CHECKING:
    from collections.abc import Mapping

ROOT_VAR = "POPRUN_PY_JOB_ROOT"
_CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_APPEND = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC
_CHECKED: dict[str, tuple[int, int, int]] = {}  # directories found safe: (mode, dev, inode)


class UnsafePath(OSError):
    """A directory another user could tamper with; ``str()`` is one line naming it (and its
    owner)."""

    def __init__(self, path: str, why: str) -> None:
        super().__init__(why)
        self.path, self.strerror, self.filename = path, why, path

    def __str__(self) -> str:
        return str(self.strerror)


def job_root(environ: Mapping[str, str] | None = None) -> str:
    """This user's job root on this host (see the module docstring)."""
    env = os.environ if environ is None else environ
    override = env.get(ROOT_VAR)
    if override and os.path.isabs(override):
        return os.path.normpath(override)
    return f"/tmp/poprun-py-{os.geteuid()}"


def runtime_root(environ: Mapping[str, str] | None = None) -> str:
    """``$XDG_RUNTIME_DIR/poprun-py`` when that is a private directory of this user's (as
    systemd makes it), else :func:`job_root`."""
    env = os.environ if environ is None else environ
    runtime = env.get("XDG_RUNTIME_DIR") or ""
    if env.get(ROOT_VAR) or not os.path.isabs(runtime):
        return job_root(env)
    try:
        st = os.stat(runtime)
    except OSError:
        return job_root(env)
    if stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid() and not st.st_mode & 0o077:
        return os.path.join(os.path.normpath(runtime), "poprun-py")
    return job_root(env)


def private_dir(path: str) -> str:
    """``path`` (absolute), made with its missing parents (mode 0700) or checked: every
    directory on the way is safe (see the module docstring); UnsafePath if not."""
    path = os.path.abspath(path)
    if path in _CHECKED:
        if _same(path):
            return path
        _CHECKED.clear()  # removed since (or replaced): check everything again
    parent_mode = os.stat("/").st_mode
    current = "/"
    for name in path.strip("/").split("/"):
        current = os.path.join(current, name)
        known = _CHECKED.get(current)
        parent_mode = known[0] if known is not None else _checked(current, parent_mode)
    return path


def _same(path: str) -> bool:
    """True while the directory checked as ``path`` is still there."""
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return (st.st_dev, st.st_ino) == _CHECKED[path][1:]


def _checked(path: str, parent_mode: int) -> int:
    """The mode of ``path`` once it is a safe directory (made if missing); symlinks are
    followed once checked (their targets are checked too)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        with contextlib.suppress(FileExistsError):
            os.mkdir(path, 0o700)
        st = os.lstat(path)
    shared = parent_mode & 0o002  # every user may add entries beside it (/tmp)
    if shared and st.st_uid not in (os.geteuid(), 0):
        raise UnsafePath(path, f"{path} is owned by {_who(st.st_uid)}, not by {_me()}")
    if stat.S_ISLNK(st.st_mode):
        return _followed(path)
    if not stat.S_ISDIR(st.st_mode):
        raise UnsafePath(path, f"{path} is not a directory")
    others = st.st_mode & (0o022 if shared else 0o002)  # a group's own directory is its own
    if others and not st.st_mode & stat.S_ISVTX:  # they could swap what is in it
        mode = oct(st.st_mode & 0o7777)
        raise UnsafePath(path, f"{path} is writable by other users (mode {mode})")
    _CHECKED[path] = (st.st_mode, st.st_dev, st.st_ino)
    return st.st_mode


def _followed(link: str) -> int:
    target = private_dir(os.path.realpath(link))
    st = os.lstat(link)
    _CHECKED[link] = (_CHECKED[target][0], st.st_dev, st.st_ino)
    return _CHECKED[link][0]


def _who(uid: int) -> str:
    try:
        import pwd

        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except (ImportError, KeyError):
        return f"uid {uid}"


def _me() -> str:
    return _who(os.geteuid())


def write_private(path: str, text: str | bytes, mode: int = 0o600, durable: bool = True) -> None:
    """Replace ``path`` with ``text`` atomically (see the module docstring); its directory
    must exist (:func:`private_dir`). ``durable=False`` skips the fsync: for files rewritten
    by every launch (shard lists, hostfiles), not records that must survive a crash."""
    data = text.encode("utf-8") if isinstance(text, str) else text
    head, name = os.path.split(path)
    tmp = os.path.join(head, f".{name}.{os.getpid()}.{os.urandom(6).hex()}.tmp")
    fd = os.open(tmp, _CREATE, mode)
    try:
        try:
            os.fchmod(fd, mode)  # the umask does not decide
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            if durable:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def open_private(path: str, append: bool = False) -> int:
    """A file descriptor to write ``path`` (mode 0600, never through a symlink): a new file
    (whatever was there is replaced, never followed), or with ``append`` the file as it is
    (made if missing), which must be a regular file of this user's."""
    if append:
        fd = os.open(path, _APPEND, 0o600)
        st = os.fstat(fd)
        if stat.S_ISREG(st.st_mode) and st.st_uid == os.geteuid():
            os.fchmod(fd, 0o600)
            return fd
        os.close(fd)
        raise UnsafePath(path, f"{path} is not a file of {_me()}")
    for _ in range(3):
        try:
            fd = os.open(path, _CREATE, 0o600)
        except FileExistsError:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
            continue
        os.fchmod(fd, 0o600)
        return fd
    raise UnsafePath(path, f"{path} keeps being made by someone else")


def write_files(items: list[dict[str, str]]) -> str:
    """Write each ``{"path", "text"}`` of a job (the agent's): atomically, mode 0600, in
    directories 0700 none of which another user could tamper with; '' or what went wrong."""
    for item in items:
        path, text = item["path"], item["text"]
        try:
            private_dir(os.path.dirname(os.path.abspath(path)))
            write_private(path, text, durable=False)  # rewritten by every launch
        except OSError as exc:
            return f"cannot write {path}: {exc.strerror or exc}"
    return ""
