"""spark-submit entry: `spark-submit jobs/stream.py --config conf/adult.yaml --input DIR [--set key=value ...]`."""

import sys

from sparkml_dist.cli import main

if __name__ == "__main__":
    sys.exit(main(["stream", *sys.argv[1:]]))
