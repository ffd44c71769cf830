"""spark-submit entry: `spark-submit jobs/finetune.py --config conf/adult.yaml --set finetune.where="age < 30"`.

Fine-tunes models:/<tracking.registered_model>@champion (or finetune.base_model) on the rows
of data.train_path that finetune.where keeps, and registers the result with its parent."""

import sys

from sparkml_dist.cli import main

if __name__ == "__main__":
    sys.exit(main(["finetune", *sys.argv[1:]]))
