"""train.strategy=federated, one method in one folder: the method (`method`), the driver's rounds
(`server`), each client's local training (`client`), secure aggregation (`secure`), differential
privacy (`privacy`) and the rounds' checkpoints (`checkpoints`). Each client's rows stay in its
own partition; each round the driver broadcasts the global weights, sampled clients train
locally, and only parameter-shaped updates and sample counts come back (optionally clipped,
noised and masked so that the driver sees only their sum)."""
