"""Training: the rank function, its loop, data-parallel placements (train/parallelism.py) and checkpoints."""
