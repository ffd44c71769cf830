"""Training code written as a user of plain PyTorch would write it (no sparkml_dist imports), run by
the tests through sparkml_dist.TorchDistributor and pyspark's TorchDistributor alike."""
