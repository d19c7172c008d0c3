"""Which TCP sockets a process tree listens on, from /proc (what `ss -ltnp` shows, without iproute2);
and, where strace may run, every address a process tree binds.

/proc/<pid>/net/tcp{,6} list the sockets of the process's network namespace with their inode;
/proc/<pid>/fd links of the form `socket:[inode]` say which process holds which. The tree is
walked through every process's parent pid (/proc/<pid>/stat), so JVMs started by a CLI and
the Python workers a Flink TaskManager starts (grandchildren) are included.
"""

from __future__ import annotations

import ipaddress
import os
import re
import shutil
import struct
import subprocess
from dataclasses import dataclass
from pathlib import Path

TCP_LISTEN = "0A"


@dataclass(frozen=True)
class Listener:
    pid: int
    command: str
    address: str
    port: int

    @property
    def loopback(self) -> bool:
        ip = ipaddress.ip_address(self.address)
        if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
            ip = ip.ipv4_mapped
        return ip.is_loopback

    def __str__(self) -> str:
        return f"pid {self.pid} ({self.command}) listens on {self.address}:{self.port}"


def _parent(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name is in parentheses and may contain spaces: fields follow the last ')'.
    return int(stat.rsplit(")", 1)[1].split()[1])


def process_tree(root: int) -> set[int]:
    """`root` and all its live descendants."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            parent = _parent(int(entry))
            if parent is not None:
                children.setdefault(parent, []).append(int(entry))
    tree, todo = set(), [root]
    while todo:
        pid = todo.pop()
        if pid not in tree:
            tree.add(pid)
            todo.extend(children.get(pid, []))
    return tree


def processes_named(root: int, name: bytes) -> list[int]:
    """The processes of `root`'s tree whose name (/proc/<pid>/comm, what `ps` shows) is `name`."""
    found = []
    for pid in process_tree(root):
        try:
            if Path(f"/proc/{pid}/comm").read_bytes().strip() == name:
                found.append(pid)
        except OSError:
            continue  # exited meanwhile
    return sorted(found)


def _address(hex_address: str) -> tuple[str, int]:
    host, port = hex_address.split(":")
    # The kernel prints the address as 32-bit words, each the hex of the word's value as the
    # CPU holds it: packing them back in host byte order gives the network-order bytes.
    words = [int(host[i:i + 8], 16) for i in range(0, len(host), 8)]
    packed = struct.pack(f"={len(words)}I", *words)
    return str(ipaddress.ip_address(packed)), int(port, 16)


def _listening_inodes(pid: int) -> dict[str, tuple[str, int]]:
    inodes = {}
    for name in ("tcp", "tcp6"):
        try:
            lines = Path(f"/proc/{pid}/net/{name}").read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if fields[3] == TCP_LISTEN:
                inodes[fields[9]] = _address(fields[1])
    return inodes


def _command(pid: int) -> str:
    try:
        args = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return "?"
    text = " ".join(a.decode(errors="replace") for a in args if a)
    return text[:160]


def listeners(root: int) -> set[Listener]:
    """Every listening TCP socket held by `root` or a descendant (processes that exit while
    being read are skipped)."""
    found = set()
    by_inode: dict[str, tuple[str, int]] | None = None
    for pid in process_tree(root):
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        sockets = set()
        for fd in fds:
            try:
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue  # closed meanwhile
            if link.startswith("socket:["):
                sockets.add(link[8:-1])
        if not sockets:
            continue
        if by_inode is None:
            by_inode = _listening_inodes(pid)
        command = _command(pid)
        for inode in sockets & by_inode.keys():
            address, port = by_inode[inode]
            found.add(Listener(pid, command, address, port))
    return found


# -- every bind, not a sample: strace ------------------------------------------------------------

STRACE_BIND = re.compile(
    r'^(?P<pid>\d+) +bind\(\d+, \{sa_family=AF_INET6?, (?:sin_port|sin6_port)=htons\((?P<port>\d+)\), '
    r'(?:sin_addr=inet_addr\("(?P<v4>[^"]+)"\)|sin6_flowinfo=[^,]+, inet_pton\(AF_INET6, "(?P<v6>[^"]+)")')


def strace_usable() -> bool:
    """strace is installed and may trace children here (containers can forbid ptrace)."""
    if shutil.which("strace") is None:
        return False
    try:
        return subprocess.run(["strace", "-f", "-qq", "-e", "trace=bind", "true"], capture_output=True,
                              timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def traced(command: list[str], trace_file: Path) -> list[str]:
    """`command` run under strace, writing every bind() of its process tree to `trace_file`."""
    return ["strace", "-f", "-qq", "-e", "trace=bind", "-o", str(trace_file), *command]


def tcp_binds(trace_file: Path) -> list[Listener]:
    """The IPv4/IPv6 binds in an strace log (UDP and TCP alike: strace does not say which;
    netlink and Unix sockets are left out). Listener.command is the strace line."""
    found = []
    for line in trace_file.read_text().splitlines():
        match = STRACE_BIND.match(line)
        if match:
            found.append(Listener(int(match["pid"]), line[:160], match["v4"] or match["v6"], int(match["port"])))
    return found
