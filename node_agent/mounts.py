"""Mounts made by the kernel's own calls on descriptors (fsopen, fsmount, open_tree,
move_mount, mount_setattr, umount2), for the warm sandboxes (`node_agent.warm`): no `mount`
program is started (a fork and an exec of it cost a learner's start milliseconds each), and no
path is resolved again between the agent's walk to a folder and its mount.

`bind(source, target)` is `mount --bind --no-canonicalize /proc/self/fd/SOURCE
/proc/self/fd/TARGET` without the program: the mount (not recursive) of the folder the
descriptor `source` names, cloned as `mount --bind` clones it (a peer of a shared source's
group, as the kernel's bind makes it), attached on the folder the descriptor `target` names.
Linux 5.12 or later (the calls on descriptors came in 5.2, mount_setattr in 5.12); the agent is
root, with CAP_SYS_ADMIN in its mount namespace, as for `mount`.
"""

from __future__ import annotations

import ctypes
import os
from pathlib import Path
from typing import Final

# System call numbers: the same on every architecture for calls added since 5.1 (424 on).
_OPEN_TREE: Final = 428
_MOVE_MOUNT: Final = 429
_FSOPEN: Final = 430
_FSCONFIG: Final = 431
_FSMOUNT: Final = 432
_MOUNT_SETATTR: Final = 442
# From <linux/mount.h> and <fcntl.h>.
_OPEN_TREE_CLONE: Final = 1
_AT_EMPTY_PATH: Final = 0x1000
_MOVE_MOUNT_F_EMPTY_PATH: Final = 0x04
_MOVE_MOUNT_T_EMPTY_PATH: Final = 0x40
_FSOPEN_CLOEXEC: Final = 1
_FSMOUNT_CLOEXEC: Final = 1
_FSCONFIG_SET_STRING: Final = 1
_FSCONFIG_CMD_CREATE: Final = 6
_MOUNT_ATTR_NOSUID: Final = 0x02
_MOUNT_ATTR_NODEV: Final = 0x04
MS_PRIVATE: Final = 1 << 18
MS_SHARED: Final = 1 << 20
_MNT_DETACH: Final = 2
_UMOUNT_NOFOLLOW: Final = 8

_SCRATCH = {b"mode": b"0755", b"size": b"64k", b"nr_inodes": b"4096"}
"""A scratch tmpfs holds folders alone: their inodes, no page of data."""

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long
_libc.umount2.argtypes = (ctypes.c_char_p, ctypes.c_int)
_libc.umount2.restype = ctypes.c_int
_EMPTY = ctypes.c_char_p(b"")


class _MountAttr(ctypes.Structure):
    """`struct mount_attr` (<linux/mount.h>), as mount_setattr takes it."""

    _fields_ = (
        ("attr_set", ctypes.c_uint64),
        ("attr_clr", ctypes.c_uint64),
        ("propagation", ctypes.c_uint64),
        ("userns_fd", ctypes.c_uint64),
    )


def bind(source: int, target: int) -> None:
    """Mount the folder the descriptor `source` names on the folder `target` names (OSError
    when the kernel refuses)."""
    tree = clone(source)
    try:
        attach(tree, target)
    finally:
        os.close(tree)


def scratch(folder: int) -> None:
    """Mount on the folder the descriptor `folder` names a small tmpfs of its own (mode 0755,
    nosuid, nodev), shared, in a peer group of its own: what is mounted below it later
    propagates to its slaves (a sandbox's copies) and nowhere else, and what is made in it goes
    with its unmount, without a folder of the node's disk to remove one by one."""
    tmpfs = ctypes.c_char_p(b"tmpfs")
    context = _checked(_libc.syscall(_FSOPEN, tmpfs, ctypes.c_uint(_FSOPEN_CLOEXEC)))
    try:
        for key, value in _SCRATCH.items():
            _checked(
                _libc.syscall(
                    _FSCONFIG,
                    ctypes.c_int(context),
                    ctypes.c_uint(_FSCONFIG_SET_STRING),
                    ctypes.c_char_p(key),
                    ctypes.c_char_p(value),
                    ctypes.c_int(0),
                )
            )
        _checked(
            _libc.syscall(
                _FSCONFIG,
                ctypes.c_int(context),
                ctypes.c_uint(_FSCONFIG_CMD_CREATE),
                None,
                None,
                ctypes.c_int(0),
            )
        )
        flags = ctypes.c_uint(_MOUNT_ATTR_NOSUID | _MOUNT_ATTR_NODEV)
        tree = _checked(
            _libc.syscall(_FSMOUNT, ctypes.c_int(context), ctypes.c_uint(_FSMOUNT_CLOEXEC), flags)
        )
    finally:
        os.close(context)
    try:
        attach(tree, folder)
        # Private first: attached below a shared mount (the node's root, under systemd), it
        # joined a group with that mount's peers' copies of it.
        propagate(tree, MS_PRIVATE)
        propagate(tree, MS_SHARED)
    finally:
        os.close(tree)


def clone(source: int) -> int:
    """A detached copy of the mount at the folder `source` names, rooted there (not its
    submounts: `mount --bind`, not `--rbind`): a descriptor, close-on-exec, to attach."""
    flags = _OPEN_TREE_CLONE | os.O_CLOEXEC | _AT_EMPTY_PATH
    return _checked(_libc.syscall(_OPEN_TREE, ctypes.c_int(source), _EMPTY, ctypes.c_uint(flags)))


def attach(tree: int, target: int) -> None:
    """Attach the detached mount `tree` (`clone`'s) on the folder `target` names; it propagates
    as any mount does (to the peers and slaves of a shared target's mount)."""
    flags = _MOVE_MOUNT_F_EMPTY_PATH | _MOVE_MOUNT_T_EMPTY_PATH
    _checked(
        _libc.syscall(
            _MOVE_MOUNT,
            ctypes.c_int(tree),
            _EMPTY,
            ctypes.c_int(target),
            _EMPTY,
            ctypes.c_uint(flags),
        )
    )


def propagate(mount: int, propagation: int) -> None:
    """Make the mount at whose root `mount` (a descriptor) is MS_PRIVATE or MS_SHARED, as
    `mount --make-private` and `--make-shared` do (shared: a peer group of its own, for a
    mount in none)."""
    attr = _MountAttr(attr_set=0, attr_clr=0, propagation=propagation, userns_fd=0)
    _checked(
        _libc.syscall(
            _MOUNT_SETATTR,
            ctypes.c_int(mount),
            _EMPTY,
            ctypes.c_uint(_AT_EMPTY_PATH),
            ctypes.byref(attr),
            ctypes.c_size_t(ctypes.sizeof(attr)),
        )
    )


def detach(point: Path) -> None:
    """Unmount what is mounted at `point` (not following a symlink there) with everything
    mounted below it, lazily, as `umount --recursive --lazy --no-canonicalize` does; `point`
    as the kernel resolves it, which the caller makes the real path of a folder of its own."""
    if _libc.umount2(os.fsencode(point), _MNT_DETACH | _UMOUNT_NOFOLLOW) != 0:
        error = ctypes.get_errno()
        raise OSError(error, os.strerror(error), str(point))


def _checked(result: int) -> int:
    if result < 0:
        error = ctypes.get_errno()
        raise OSError(error, os.strerror(error))
    return result
