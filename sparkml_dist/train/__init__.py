"""Training: the rank function, its loop, data-parallel strategies and checkpoints."""
