"""The worker's scratch directory: made once, reset after every execution whatever the program
left, and checked, so that nothing of one execution reaches the next."""

from __future__ import annotations

import os
import time

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class Unrestorable(Exception):
    """The worker could not put its state back as it was; it must be replaced."""


def empty_directory(top: int) -> int:
    """Remove everything inside the directory open at ``top``, whatever the modes and the depth;
    returns how many entries were removed. Only for a tree no process is using any more.

    Iterative, holding two descriptors at most (a chain of directories can be as deep as the
    tmpfs has files). Each directory is made 0700 before it is opened: a program may have left
    some without read, write or search permission for their owner, which is also the worker."""
    subdirs, removed = _remove_files(top)
    pending = [subdirs]  # per level: subdirectories still to remove
    path = []  # the name of each level below ``top`` in its parent
    cur = top
    try:
        while True:
            if pending[-1]:
                name = pending[-1].pop()
                os.chmod(name, 0o700, dir_fd=cur)  # a directory (d_type), not a link; nothing runs now
                nxt = os.open(name, _DIR_FLAGS, dir_fd=cur)
                if cur != top:
                    os.close(cur)
                cur = nxt
                path.append(name)
                subdirs, n = _remove_files(cur)
                pending.append(subdirs)
                removed += n
                continue
            pending.pop()
            if not path:
                return removed
            up = os.open("..", _DIR_FLAGS, dir_fd=cur)
            os.close(cur)
            if len(path) == 1:
                os.close(up)
                up = top
            cur = up
            os.rmdir(path.pop(), dir_fd=cur)
            removed += 1
    finally:
        if cur != top:
            os.close(cur)


def _remove_files(fd: int):
    """Unlink every entry of the directory at ``fd`` that is not a directory. Returns the names of
    its subdirectories and how many entries were unlinked."""
    with os.scandir(fd) as it:
        entries = [(e.name, e.is_dir(follow_symlinks=False)) for e in it]
    subdirs = []
    for name, is_dir in entries:
        if is_dir:
            subdirs.append(name)
        else:
            os.unlink(name, dir_fd=fd)
    return subdirs, len(entries) - len(subdirs)


class Scratch:
    """The scratch directory ``<root>/home``: every execution's current directory, HOME and TMPDIR.

    With the jail, ``home`` is the only writable place of the worker's own tmpfs: a mount point,
    so it cannot be removed, renamed or replaced, under a read-only root. Without the jail
    (isolation "none") it is a plain directory in the pool's temporary directory.

    ``reset`` runs after every execution and puts it back as the worker made it: empty, mode 0700,
    its own extended attributes (ACLs are extended attributes) and times, and, on its own tmpfs,
    every block and inode free again. What is inside belongs to the execution and is removed
    whatever it is. The directory itself belongs to the worker: a change to it is undone and
    reported (the job scores 0). A state that cannot be put back raises Unrestorable.
    """

    MODE = 0o700

    def __init__(self, root: str, private: bool):
        self.root = root
        self.home = os.path.join(root, "home")
        self.private = private  # the jail's tmpfs: a read-only root, home a mount point
        if not private:
            # A worker that replaces another finds its leftovers in this host directory.
            fd = os.open(root, _DIR_FLAGS)
            try:
                empty_directory(fd)
            finally:
                os.close(fd)
            os.mkdir(self.home, self.MODE)
        self.fd = os.open(self.home, _DIR_FLAGS)
        os.fchmod(self.fd, self.MODE)
        self.time_ns = time.time_ns()
        os.utime(self.fd, ns=(self.time_ns, self.time_ns))
        st = os.fstat(self.fd)
        self.owner = (st.st_uid, st.st_gid)
        self.xattrs = sorted(os.listxattr(self.fd))
        self.root_stat = self._root_signature()
        self.free = self._free()
        if os.listdir(self.fd):
            raise Unrestorable("the scratch directory is not empty at start")

    def _root_signature(self):
        st = os.stat(self.root)
        return st.st_mode, st.st_uid, st.st_gid, st.st_mtime_ns, st.st_ctime_ns

    def _free(self):
        if not self.private:
            return None  # a host file system: its free space is not ours to check
        v = os.fstatvfs(self.fd)
        return v.f_bfree, v.f_ffree

    def reset(self) -> list[str]:
        """After an execution (all its processes reaped): returns what the program changed that
        was the worker's, already undone."""
        notes = []
        st = os.fstat(self.fd)
        if st.st_nlink == 0:
            raise Unrestorable("its scratch directory was removed")
        if (st.st_uid, st.st_gid) != self.owner:
            raise Unrestorable("its scratch directory changed owner")
        mode = st.st_mode & 0o7777
        if mode != self.MODE:
            notes.append(f"set its mode to {mode:04o}")
            os.fchmod(self.fd, self.MODE)
        xattrs = os.listxattr(self.fd)
        if sorted(xattrs) != self.xattrs:
            notes.append("set extended attributes or an ACL on it")
            for name in xattrs:
                if name not in self.xattrs:
                    os.removexattr(self.fd, name)
            if sorted(os.listxattr(self.fd)) != self.xattrs:
                raise Unrestorable("extended attributes of its scratch directory could not be removed")
        removed = empty_directory(self.fd)
        if removed or st.st_mtime_ns != self.time_ns or st.st_atime_ns != self.time_ns:
            # Times a program set (os.utime) would carry a few bytes to the next execution.
            os.utime(self.fd, ns=(self.time_ns, self.time_ns))
        if self._free() != self.free:
            raise Unrestorable(
                f"its scratch space stays in use after cleanup (free blocks and inodes "
                f"{self._free()}, expected {self.free})"
            )
        if self._root_signature() != self.root_stat:
            raise Unrestorable("the directory holding its scratch directory was changed")
        return notes
