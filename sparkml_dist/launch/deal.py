"""Deal a DataFrame's rows to N ranks: shares within a few rows of each other, deterministic, and
without the full sort Spark puts before a round-robin `repartition(n)`.

Each row's target is its position within its input partition modulo N (a round robin per input
partition, so shares differ by at most the number of input partitions). Spark's hash partitioner
then needs a key that hashes to each target: found on the driver by hashing small integers the
way Spark does. A re-run of a lost shuffle task computes the same targets (positions are
deterministic for a deterministic input), which is what the sort buys a round-robin repartition.
"""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

_SEED = 42  # Spark's hash(): Murmur3 x86_32 with seed 42, as its hash partitioner uses
_MASK = 0xFFFFFFFF


def deal(frame: DataFrame, num_ranks: int) -> DataFrame:
    """`frame` in exactly `num_ranks` partitions of near-equal size."""
    keys = keys_for_partitions(num_ranks)
    position = F.monotonically_increasing_id() % F.lit(num_ranks)  # ids are consecutive within a partition
    literals = [F.lit(k).cast("long") for k in keys]  # long, the type the keys were hashed as
    key = F.element_at(F.array(*literals), (position + 1).cast("int"))
    return frame.repartition(num_ranks, key)


def keys_for_partitions(num_ranks: int) -> list[int]:
    """keys[r] is the smallest long whose Spark hash lands in partition r of `num_ranks`."""
    keys: dict[int, int] = {}
    candidate = 0
    while len(keys) < num_ranks:  # Murmur3 spreads small integers evenly: about n log n tries
        keys.setdefault(spark_hash_long(candidate) % num_ranks, candidate)  # Python's % is pmod
        candidate += 1
    return [keys[r] for r in range(num_ranks)]


def spark_hash_long(value: int) -> int:
    """Spark's `hash(<bigint>)` (Murmur3_x86_32.hashLong, seed 42) as a signed 32-bit int, so the
    keys are found without a Spark job; tests/test_distributor.py checks it against Spark."""
    h1 = _mix_h1(_SEED, _mix_k1(value & _MASK))
    h1 = _mix_h1(h1, _mix_k1((value >> 32) & _MASK))
    h1 ^= 8
    h1 ^= h1 >> 16
    h1 = (h1 * 0x85EBCA6B) & _MASK
    h1 ^= h1 >> 13
    h1 = (h1 * 0xC2B2AE35) & _MASK
    h1 ^= h1 >> 16
    return h1 - (1 << 32) if h1 & 0x80000000 else h1


def _rotl(x: int, r: int) -> int:
    return ((x << r) | (x >> (32 - r))) & _MASK


def _mix_k1(k1: int) -> int:
    return (_rotl((k1 * 0xCC9E2D51) & _MASK, 15) * 0x1B873593) & _MASK


def _mix_h1(h1: int, k1: int) -> int:
    return (_rotl(h1 ^ k1, 13) * 5 + 0xE6546B64) & _MASK
