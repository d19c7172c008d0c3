"""Routing rows to output files: Spark's own partition hash, reproduced, and the cut points
that split a sampled key order into files of equal share.

``repartition(n, col)`` puts a row in partition ``murmur3(col) mod n``; ``partition_routing_keys``
finds, for each file index, a long whose hash lands in that partition, so routing a row to
"file i" is a lookup instead of a collision-prone hash of i.
"""

from __future__ import annotations

from collections.abc import Sequence

_M32 = 0xFFFFFFFF


def _rotl32(x: int, r: int) -> int:
    return ((x << r) | (x >> (32 - r))) & _M32


def _mix_k1(k1: int) -> int:
    return (_rotl32((k1 * 0xCC9E2D51) & _M32, 15) * 0x1B873593) & _M32


def _mix_h1(h1: int, k1: int) -> int:
    return (_rotl32(h1 ^ k1, 13) * 5 + 0xE6546B64) & _M32


def spark_hash_long(value: int, seed: int = 42) -> int:
    """Spark's ``hash()`` of a LongType value (Murmur3_x86_32.hashLong), as a signed int."""
    v = value & 0xFFFFFFFFFFFFFFFF
    h1 = _mix_h1(seed & _M32, _mix_k1(v & _M32))
    h1 = _mix_h1(h1, _mix_k1(v >> 32))
    h1 ^= 8
    h1 ^= h1 >> 16
    h1 = (h1 * 0x85EBCA6B) & _M32
    h1 ^= h1 >> 13
    h1 = (h1 * 0xC2B2AE35) & _M32
    h1 ^= h1 >> 16
    return h1 - (1 << 32) if h1 & 0x80000000 else h1


def partition_routing_keys(num_partitions: int) -> list[int]:
    """For each partition p, a long v with ``pmod(hash(v), n) == p``.

    ``repartition(n, col)`` sends a row to ``pmod(hash(col), n)``; a column holding
    ``keys[p]`` therefore puts the row exactly in partition p. This routes rows to the
    partitions chosen from the sampled key quantiles without Spark's range partitioner,
    which would read the whole input once more just to sample it.
    """
    keys: dict[int, int] = {}
    candidate = 0
    while len(keys) < num_partitions:
        keys.setdefault(spark_hash_long(candidate) % num_partitions, candidate)
        candidate += 1
    return [keys[p] for p in range(num_partitions)]


def split_points(sorted_keys: Sequence[int], num_files: int) -> list[int]:
    """Up to num_files - 1 ascending cut points splitting the sampled keys into equal parts."""
    if not sorted_keys or num_files <= 1:
        return []
    cuts = [sorted_keys[(i * len(sorted_keys)) // num_files] for i in range(1, num_files)]
    return sorted(set(cuts))
