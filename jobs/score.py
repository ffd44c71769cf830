"""spark-submit entry: `spark-submit jobs/score.py --config conf/adult.yaml [--set key=value ...]`."""

import sys

from sparkml_dist.cli import main

if __name__ == "__main__":
    sys.exit(main(["score", *sys.argv[1:]]))
