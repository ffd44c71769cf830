"""spark-submit entry: `spark-submit jobs/tune.py --config conf/adult_tune.yaml [--set key=value ...]`."""

import sys

from sparkml_dist.cli import main

if __name__ == "__main__":
    sys.exit(main(["tune", *sys.argv[1:]]))
