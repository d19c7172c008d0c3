"""Just enough of the JVM class-file format for the local run's patches (ingest/local/loopback.py,
ingest/local/gateway_auth.py): read a class's constant pool, append references to it, swap calls
of the same length, and assemble a tiny class of straight-line static code.

Why by hand: the machines streamberg runs on have a Java *runtime*, not a compiler, and
the patches must be made from the very flink-python jar that will run. Every class made
here goes through the JVM's bytecode verifier when it loads
(tests/ingest/test_loopback_patch.py::test_the_gateway_jvm_runs_the_patched_classes).
"""

from __future__ import annotations

import struct

CLASS_TAG, STRING_TAG, NAME_AND_TYPE_TAG, METHODREF_TAG = 7, 8, 12, 10


def _utf8(text: str) -> bytes:
    raw = text.encode()
    return b"\x01" + struct.pack(">H", len(raw)) + raw


class ClassFile:
    """A class file whose constant pool can be searched and appended to."""

    def __init__(self, data: bytes) -> None:
        if data[:4] != b"\xca\xfe\xba\xbe":
            raise ValueError("not a class file")
        self.data = data
        self.count = struct.unpack(">H", data[8:10])[0]
        self.entries: dict[int, tuple] = {}
        i, n = 10, 1
        while n < self.count:
            tag = data[i]
            if tag == 1:
                length = struct.unpack(">H", data[i + 1:i + 3])[0]
                self.entries[n] = (1, data[i + 3:i + 3 + length].decode("utf-8", "replace"))
                i += 3 + length
            elif tag in (7, 8, 16, 19, 20):
                self.entries[n] = (tag, struct.unpack(">H", data[i + 1:i + 3])[0])
                i += 3
            elif tag == 15:
                i += 4
            elif tag in (3, 4):
                i += 5
            elif tag in (5, 6):  # 8-byte constants take two slots
                i += 9
                n += 1
            elif tag in (9, 10, 11, 12, 17, 18):
                self.entries[n] = (tag, *struct.unpack(">HH", data[i + 1:i + 5]))
                i += 5
            else:
                raise ValueError(f"unknown constant pool tag {tag}")
            n += 1
        self.pool_end = i
        self.added = b""

    def utf8(self, index: int) -> str:
        return self.entries[index][1]

    def class_index(self, name: str) -> int | None:
        return next((i for i, e in self.entries.items() if e[0] == CLASS_TAG and self.utf8(e[1]) == name), None)

    def method(self, owner: str, name: str, descriptor: str) -> int | None:
        for index, entry in self.entries.items():
            if entry[0] == METHODREF_TAG:
                _, cls, nat = entry
                _, n, d = self.entries[nat]
                if self.utf8(self.entries[cls][1]) == owner and self.utf8(n) == name and self.utf8(d) == descriptor:
                    return index
        return None

    def add_class(self, name: str) -> int:
        """Append a class reference; its index."""
        first = self.count
        self.added += _utf8(name) + bytes([CLASS_TAG]) + struct.pack(">H", first)
        self.count += 2
        return first + 1

    def add_method(self, class_index: int, name: str, descriptor: str) -> int:
        """Append a method reference on an existing class reference; its index."""
        first = self.count  # the next free index: entries are appended at the end of the pool
        name_i, desc_i, nat_i, method_i = first, first + 1, first + 2, first + 3
        self.added += _utf8(name) + _utf8(descriptor) + bytes([NAME_AND_TYPE_TAG]) + struct.pack(">HH", name_i, desc_i)
        self.added += bytes([METHODREF_TAG]) + struct.pack(">HH", class_index, nat_i)
        self.count += 4
        return method_i

    def bytes(self, *swaps: tuple[bytes, bytes]) -> bytes:
        """The class with each (old, new) code sequence swapped; each must occur exactly once
        and keep its length, so no offset, branch or stack-map frame moves."""
        body = self.data[self.pool_end:]
        for old, new in swaps:
            if len(old) != len(new):
                raise ValueError("a swap must keep the code's length")
            if body.count(old) != 1:
                raise ValueError("the call to patch is not there exactly once")
            body = body.replace(old, new)
        return (self.data[:8] + struct.pack(">H", self.count) + self.data[10:self.pool_end] + self.added + body)


class Pool:
    """The constant pool of a class being assembled: each entry added once, indexes from 1."""

    def __init__(self) -> None:
        self.raw: list[bytes] = []
        self.index: dict[tuple, int] = {}

    def _add(self, key: tuple, raw: bytes) -> int:
        if key not in self.index:
            self.raw.append(raw)
            self.index[key] = len(self.raw)
        return self.index[key]

    def utf8(self, text: str) -> int:
        return self._add(("utf8", text), _utf8(text))

    def cls(self, name: str) -> int:
        return self._add(("class", name), bytes([CLASS_TAG]) + struct.pack(">H", self.utf8(name)))

    def string(self, text: str) -> int:
        return self._add(("string", text), bytes([STRING_TAG]) + struct.pack(">H", self.utf8(text)))

    def methodref(self, owner: str, name: str, descriptor: str) -> int:
        nat = self._add(("nat", name, descriptor), bytes([NAME_AND_TYPE_TAG])
                        + struct.pack(">HH", self.utf8(name), self.utf8(descriptor)))
        return self._add(("method", owner, name, descriptor),
                         bytes([METHODREF_TAG]) + struct.pack(">HH", self.cls(owner), nat))


# The instructions the assembled classes use.
ALOAD_0, ILOAD_1, ARETURN, RETURN = b"\x2a", b"\x1b", b"\xb0", b"\xb1"


def ldc(index: int) -> bytes:
    if index > 0xFF:
        raise ValueError("ldc needs a constant below 256")
    return b"\x12" + bytes([index])


def invoke(opcode: str, index: int) -> bytes:
    return {"virtual": b"\xb6", "special": b"\xb7", "static": b"\xb8"}[opcode] + struct.pack(">H", index)


def assemble(name: str, super_name: str, pool: Pool,
             methods: list[tuple[int, str, str, int, int, bytes]]) -> bytes:
    """A public final class file (Java 8 format) of straight-line methods; each method is
    (access flags, name, descriptor, max stack, max locals, code). Straight-line code needs
    no stack-map frames, which is why nothing here branches."""
    this_i, super_i = pool.cls(name), pool.cls(super_name)
    code_i = pool.utf8("Code")
    method_bytes = b""
    for flags, method_name, descriptor, max_stack, max_locals, code in methods:
        attribute = struct.pack(">HHI", max_stack, max_locals, len(code)) + code + struct.pack(">HH", 0, 0)
        method_bytes += struct.pack(">HHHH", flags, pool.utf8(method_name), pool.utf8(descriptor), 1)
        method_bytes += struct.pack(">HI", code_i, len(attribute)) + attribute
    header = b"\xca\xfe\xba\xbe" + struct.pack(">HH", 0, 52) + struct.pack(">H", len(pool.raw) + 1)
    return (header + b"".join(pool.raw)
            + struct.pack(">HHHHH", 0x0031, this_i, super_i, 0, 0)  # public final super; no interfaces, fields
            + struct.pack(">H", len(methods)) + method_bytes + struct.pack(">H", 0))
