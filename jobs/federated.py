"""spark-submit entry: `spark-submit jobs/federated.py --config conf/adult.yaml --set federated.client_column=occupation`.

Federated training: one client per value of federated.client_column, each client's rows in its
own partition; FedAvg/FedProx rounds with optional clipping, noise and secure aggregation."""

import sys

from sparkml_dist.cli import main

if __name__ == "__main__":
    sys.exit(main(["federated", *sys.argv[1:]]))
