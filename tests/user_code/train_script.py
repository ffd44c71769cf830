"""A user's training script, as torchrun would run it: arguments on the command line, the process
group from the environment, rank 0 writes what it learned to --out."""

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/, for user_code

from user_code.breast_cancer import train

parser = argparse.ArgumentParser()
parser.add_argument("--learning-rate", type=float, required=True)
parser.add_argument("--epochs", type=int, default=3)
parser.add_argument("--out", required=True)
args = parser.parse_args()
result = train(args.learning_rate, epochs=args.epochs)
if result["env"]["RANK"] == "0":
    Path(args.out).write_text(
        json.dumps({"accuracy": result["accuracy"], "world": result["world"], "argv": sys.argv[1:]})
    )
