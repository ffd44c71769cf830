"""spark-submit entry: `spark-submit jobs/contribute.py --config conf/adult.yaml --delta delta.pt --contributor alice`.

Validates a community parameter delta against the champion (shapes, norm bound, no regression on
held-out rows) and, if it passes, registers base + delta as a new version with its lineage."""

import sys

from sparkml_dist.cli import main

if __name__ == "__main__":
    sys.exit(main(["contribute", *sys.argv[1:]]))
