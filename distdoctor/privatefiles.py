"""State files under a shared temp dir (`/tmp`), private to their user, no link followed.

Any local user can create names in `/tmp`. A directory `/tmp/NAME-<uid>` made beforehand by
someone else, or a symlink put where one of our files will be written, would make a rank
(often root) write, or a reader trust, a file of the other user's choosing. So, as
`tempfile.mkdtemp` and OpenSSH's StrictModes do:

- the directory is made `0700` with `os.mkdir`; one that already exists is used only if it
  is a real directory (not a link), owned by this effective user, with no group or other
  access. Else it is refused with one line, and the caller turns its feature off.
- every file operation goes through a descriptor of that directory, opened with
  `O_DIRECTORY | O_NOFOLLOW` and checked through that descriptor (`fstat`), so the checked
  directory is the one written to even if the name is swapped after the check.
- a file is written under a fresh temporary name with `O_CREAT | O_EXCL | O_NOFOLLOW` and
  renamed over its name (a rename replaces a link, never follows it); a file is read with
  `O_NOFOLLOW` and only if it is a regular file of ours.

No import of distdoctor: every layer may use it (it runs in the ranks too).
"""

from __future__ import annotations

import errno
import json
import os
import secrets
import stat
import tempfile

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | getattr(os, "O_NOFOLLOW", 0) | os.O_CLOEXEC
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)


class PrivateDirRefused(OSError):
    """The state dir cannot be trusted (or made); `str()` is the one line to print."""


def state_dir_path(name: str, base: str | None = None) -> str:
    """`BASE/NAME-<euid>`; BASE is the shared temp dir (TMPDIR, else /tmp) unless given."""
    return os.path.join(base or tempfile.gettempdir(), f"{name}-{_euid()}")


def _euid() -> int:
    return os.geteuid() if hasattr(os, "geteuid") else 0


class PrivateDir:
    """An open, checked private directory. Use as a context manager (it holds a descriptor).

    `open` raises PrivateDirRefused; the file methods raise OSError. Callers in a rank wrap
    both: a refused dir is a feature off, never an error into the job.
    """

    def __init__(self, path: str, fd: int):
        self.path, self.fd = path, fd

    @classmethod
    def open(cls, path: str, create: bool = True) -> PrivateDir:
        if create:
            _make(path)
        try:
            fd = os.open(path, _DIR_FLAGS)
        except FileNotFoundError:
            raise PrivateDirRefused(f"{path} does not exist") from None
        except OSError as exc:  # ELOOP / ENOTDIR: a link or a file where the dir should be
            raise PrivateDirRefused(f"{path} is not a private directory "
                                    f"({_why_not_dir(path, exc)}): not used; remove it, or "
                                    f"set TMPDIR to a directory of your own") from None
        try:
            _check_dir(path, os.fstat(fd))
        except PrivateDirRefused:
            os.close(fd)
            raise
        return cls(path, fd)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __enter__(self) -> PrivateDir:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def write(self, name: str, data: bytes) -> None:
        """Replace `name` with `data`, atomically (a reader sees the old or the new file)."""
        _plain_name(name)
        write_atomically(name, data, 0o600, dir_fd=self.fd)

    def read(self, name: str, limit: int = 1 << 20) -> bytes:
        """The first `limit` bytes of `name`: a regular file of ours, reached by no link."""
        _plain_name(name)
        fd = os.open(name, os.O_RDONLY | _NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK,
                     dir_fd=self.fd)
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_uid != _euid():
                raise PermissionError(f"{self.path}/{name} is not a regular file of ours")
            return os.read(fd, limit)
        finally:
            os.close(fd)

    def remove(self, name: str) -> None:
        _plain_name(name)
        os.unlink(name, dir_fd=self.fd)


def _make(path: str) -> None:
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass  # checked by the caller through its descriptor
    except OSError as exc:
        raise PrivateDirRefused(f"cannot make {path}: {exc.strerror or exc}") from None


def _check_dir(path: str, st: os.stat_result) -> None:
    if not stat.S_ISDIR(st.st_mode):
        raise PrivateDirRefused(f"{path} is not a directory")
    if st.st_uid != _euid():
        raise PrivateDirRefused(f"{path} is owned by uid {st.st_uid}, not by this user "
                                f"(uid {_euid()}): not used; remove it, or set TMPDIR to a "
                                f"directory of your own")
    if st.st_mode & 0o077:
        raise PrivateDirRefused(f"{path} has mode {stat.S_IMODE(st.st_mode):04o}: others "
                                f"can write or read it, not used (chmod 700 it, or remove it)")


def _why_not_dir(path: str, exc: OSError) -> str:
    try:
        if stat.S_ISLNK(os.lstat(path).st_mode):
            return "a symbolic link"
    except OSError:
        pass
    return exc.strerror or str(exc)


def _plain_name(name: str) -> None:
    """A file name in the dir, never a path out of it."""
    if not name or "/" in name or name in (".", ".."):
        raise ValueError(f"not a plain file name: {name!r}")


def write_atomically(path: str, data: bytes, mode: int = 0o644,
                     dir_fd: int | None = None) -> None:
    """Replace the file at `path` (relative to `dir_fd` when given) with `data`: written
    under a fresh name beside it (O_EXCL | O_NOFOLLOW: never through a link, never over
    another writer's temp file) and renamed over `path` (a rename replaces a link there,
    never follows it), so a reader sees the old file or the new one, never half."""
    head, tail = os.path.split(path)
    tmp = os.path.join(head, f".{tail}.{os.getpid()}.{secrets.token_hex(6)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW | os.O_CLOEXEC,
                 mode, dir_fd=dir_fd)
    try:
        try:
            _write_all(fd, data)
        finally:
            os.close(fd)
        os.replace(tmp, path, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        try:
            os.unlink(tmp, dir_fd=dir_fd)
        except OSError:
            pass
        raise


class NotRegularFile(OSError):
    """What a reader was given is no regular file it may read whole: a FIFO, a device, a
    directory, a link (not followed), or a file over the reader's bound. `strerror` says
    which, in words, as for any OSError."""


def open_regular(path, follow: bool = False) -> tuple[int, os.stat_result]:
    """(descriptor, fstat) of the regular file at `path`, opened read-only and never waited
    on: O_NONBLOCK makes a FIFO put there answer at once (to be refused) where a plain
    open() would wait for a writer for ever; a device or directory is refused by its fstat;
    a link is not followed unless `follow` (a name in a run dir or a state dir is ours, a
    link there is someone else's choice of file). OSError (NotRegularFile) otherwise."""
    flags = os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK | (0 if follow else _NOFOLLOW)
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        if exc.errno == errno.ELOOP and not follow:
            raise NotRegularFile(errno.ELOOP, "a symbolic link, not followed") from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise NotRegularFile(errno.EINVAL, f"{_kind_of(st.st_mode)}, not a regular file")
    except BaseException:
        os.close(fd)
        raise
    return fd, st


def _kind_of(mode: int) -> str:
    for test, name in ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISDIR, "a directory"),
                       (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "not a file"


def read_bounded(path, limit: int, follow: bool = False) -> bytes:
    """The bytes of the regular file at `path` (open_regular), refused before any read
    when its size is over `limit` (a sparse terabyte costs one fstat), and never more
    than `limit` bytes read (a file growing while it is read). OSError otherwise."""
    fd, st = open_regular(path, follow)
    try:
        if st.st_size > limit:
            raise NotRegularFile(errno.EFBIG, f"{st.st_size:,} bytes, over the "
                                              f"{_size_text(limit)} it may be")
        with os.fdopen(os.dup(fd), "rb") as fh:
            data = fh.read(limit + 1)
    finally:
        os.close(fd)
    if len(data) > limit:
        raise NotRegularFile(errno.EFBIG, f"over the {_size_text(limit)} it may be "
                                          f"(it grew while it was read)")
    return data


def _size_text(n: int) -> str:
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift and n % (1 << shift) == 0:
            return f"{n >> shift} {unit}"
    return f"{n:,} bytes"


def read_regular(path, limit: int) -> bytes | None:
    """read_bounded, with None for every refusal: missing, not a regular file, reached
    through a link, unreadable, or over `limit` bytes."""
    try:
        return read_bounded(path, limit)
    except OSError:
        return None


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def read_json(path: str | os.PathLike, limit: int) -> object:
    """The JSON value in the regular file at `path` (read_bounded: no link followed, no
    wait on a FIFO, at most `limit` bytes). OSError when it cannot be read, ValueError
    when it is not JSON (nested too deep for the parser included)."""
    return parse_json(read_bounded(path, limit))


def parse_json(data: bytes | str) -> object:
    """json.loads, with ValueError for what it raises on hostile text: a value nested
    100,000 deep is a RecursionError there."""
    try:
        return json.loads(data)
    except RecursionError:
        raise ValueError("nested too deep") from None


# --- descriptors a job may close and reuse --------------------------------------------------
def identity_of(fd: int) -> tuple[int, int]:
    """(device, inode) of the file open at `fd`: what says later that the number is
    still ours."""
    st = os.fstat(fd)
    return st.st_dev, st.st_ino


def still_ours(fd: int | None, identity: tuple | None) -> bool:
    """Whether `fd` is still the file whose identity_of was `identity`: a job that closes
    every descriptor (a daemonising library) may have its own file under that number."""
    try:
        return fd is not None and identity is not None and identity_of(fd) == identity
    except OSError:
        return False


def close_if_ours(fd: int | None, identity: tuple | None) -> None:
    """Close `fd` if it is still ours (still_ours); never a job's file. Never raises."""
    if still_ours(fd, identity):
        try:
            os.close(fd)
        except OSError:
            pass
