"""spark-submit entry: `spark-submit jobs/register.py --config conf/adult.yaml [--set key=value ...]`."""

import sys

from sparkml_dist.cli import main

if __name__ == "__main__":
    sys.exit(main(["register", *sys.argv[1:]]))
