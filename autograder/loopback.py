"""python -m autograder.loopback [--loopback] [--read-only=PATH]... [--writable=PATH]... -- PROGRAM ARGS...

Run first inside the grader's new namespaces (autograder.sandbox.Namespaces), as their root, then exec PROGRAM:
`--loopback` brings up the network namespace's only interface, lo, which starts down (lesson 03's gloo processes talk
over it); `--read-only` makes each PATH read-only in the mount namespace, except the `--writable` folders inside it
(the child's temporary folder, the compilers' caches). Needs no `ip` or `mount` binary (some images lack them): one
ioctl, and mount(2) through ctypes. unshare makes the new mount namespace private, so nothing leaks to the host.
"""
import ctypes
import fcntl
import os
import socket
import struct
import sys

SIOCGIFFLAGS, SIOCSIFFLAGS, IFF_UP = 0x8913, 0x8914, 0x1
IFREQ = "16sh22x"  # struct ifreq: the interface name, then its flags

MS_RDONLY, MS_REMOUNT, MS_BIND, MS_REC = 0x1, 0x20, 0x1000, 0x4000
# A remount inside a user namespace must keep the flags the host's mount has (the kernel locks them): statvfs names
# them, mount(2) spells them differently.
KEPT_FLAGS = {os.ST_NOSUID: 0x2, os.ST_NODEV: 0x4, os.ST_NOEXEC: 0x8, os.ST_NOATIME: 0x400,
              os.ST_NODIRATIME: 0x800, os.ST_RELATIME: 0x200000}


def loopback_up() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        flags = struct.unpack(IFREQ, fcntl.ioctl(s, SIOCGIFFLAGS, struct.pack(IFREQ, b"lo", 0)))[1]
        fcntl.ioctl(s, SIOCSIFFLAGS, struct.pack(IFREQ, b"lo", flags | IFF_UP))


def _mount(source: str | None, target: str, flags: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.mount(source and os.fsencode(source), os.fsencode(target), None, flags, None) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"mount {target}: {os.strerror(err)}")


def read_only_view(read_only: list[str], writable: list[str]) -> None:
    """Bind each path onto itself, the writable folders inside them too, then remount the read-only binds read-only
    (a remount changes that one mount, not the writable binds on top of it)."""
    for path in read_only + writable:
        _mount(path, path, MS_BIND | MS_REC)
    for path in read_only:
        kept = sum(flag for st, flag in KEPT_FLAGS.items() if os.statvfs(path).f_flag & st)
        _mount(None, path, MS_REMOUNT | MS_BIND | MS_RDONLY | kept)


def main(argv: list[str]) -> None:
    split = argv.index("--")
    options, program = argv[:split], argv[split + 1:]
    if "--loopback" in options:
        loopback_up()
    read_only_view([o.split("=", 1)[1] for o in options if o.startswith("--read-only=")],
                   [o.split("=", 1)[1] for o in options if o.startswith("--writable=")])
    os.execv(program[0], program)


if __name__ == "__main__":
    main(sys.argv[1:])
