"""python -m autograder.loopback PROGRAM ARGS...: bring up the loopback interface, then exec PROGRAM.

Run first inside the grader's new network namespace (autograder.sandbox.network_wrapper), where the only
interface, lo, starts down; lesson 03's gloo processes talk over it. Needs no `ip` binary (some images lack it):
one ioctl, as root of the namespace.
"""
import fcntl
import os
import socket
import struct
import sys

SIOCGIFFLAGS, SIOCSIFFLAGS, IFF_UP = 0x8913, 0x8914, 0x1
IFREQ = "16sh22x"  # struct ifreq: the interface name, then its flags


def loopback_up() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        flags = struct.unpack(IFREQ, fcntl.ioctl(s, SIOCGIFFLAGS, struct.pack(IFREQ, b"lo", 0)))[1]
        fcntl.ioctl(s, SIOCSIFFLAGS, struct.pack(IFREQ, b"lo", flags | IFF_UP))


if __name__ == "__main__":
    loopback_up()
    os.execv(sys.argv[1], sys.argv[1:])
