"""Code a user of sparkml_dist writes: their own network for `model.kind: custom`."""
