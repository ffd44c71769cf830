"""Community contributions: the parameter deltas a contributor submits and the checks a delta
must pass before it may touch a model (`deltas`). The stage that merges an accepted one into a
registry version is `sparkml_dist.stages.contribute`."""
