"""The driver's coordinator for the ranks' all-gather and end barrier (launch.coordinator): every
rank gets every value in rank order as soon as the last rank posts, strangers are turned away, and
stopping it releases ranks that would otherwise wait for a rank that died."""

from __future__ import annotations

import socket
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

import psutil
import pytest

from sparkml_dist.launch.coordinator import CoordinatorAddress, CoordinatorGone, LaunchCoordinator, all_gather


@pytest.fixture
def coordinator():
    running = LaunchCoordinator("127.0.0.1", num_ranks=3)
    yield running
    running.stop()


def test_every_rank_gets_every_value_in_rank_order_once_the_last_has_posted(coordinator):
    address = coordinator.address
    with ThreadPoolExecutor(3) as pool:
        early = [pool.submit(all_gather, address, "start", rank, f"value of {rank}") for rank in (2, 0)]
        time.sleep(0.3)
        assert not any(f.done() for f in early), "nobody is answered before every rank has posted"
        last = pool.submit(all_gather, address, "start", 1, "value of 1")
        answers = [f.result(timeout=10) for f in (*early, last)]
    assert answers == [["value of 0", "value of 1", "value of 2"]] * 3


def test_it_listens_on_the_given_address_only(coordinator):
    mine = [
        c
        for c in psutil.Process().net_connections(kind="tcp")
        if c.status == psutil.CONN_LISTEN and c.laddr.port == coordinator.address.port
    ]
    assert [c.laddr.ip for c in mine] == ["127.0.0.1"], mine


def test_a_connection_without_the_launch_token_is_refused_and_counts_for_nothing(coordinator, caplog):
    stranger = replace(coordinator.address, token="0" * 32)
    with pytest.raises(CoordinatorGone, match="ended the launch"):
        all_gather(stranger, "start", 0, "forged")
    assert coordinator.refused == 1 and "without this launch's token" in caplog.text
    with ThreadPoolExecutor(3) as pool:
        answers = [
            f.result(timeout=10)
            for f in [pool.submit(all_gather, coordinator.address, "start", r, str(r)) for r in range(3)]
        ]
    assert answers == [["0", "1", "2"]] * 3, "the forged value for rank 0 was never taken"


def test_stopping_it_releases_ranks_that_wait_for_one_that_died(coordinator):
    with ThreadPoolExecutor(2) as pool:
        waiting = [pool.submit(all_gather, coordinator.address, "end", rank, "") for rank in (0, 1)]
        time.sleep(0.3)
        coordinator.stop()  # what the driver does when Spark reports the stage failed
        for f in waiting:
            with pytest.raises(CoordinatorGone, match="before every rank reached 'end'"):
                f.result(timeout=10)


def test_a_rank_that_posts_the_same_step_again_starts_a_fresh_round(coordinator):
    address = coordinator.address
    with ThreadPoolExecutor(4) as pool:
        first_attempt = pool.submit(all_gather, address, "start", 0, "attempt 1")
        time.sleep(0.3)
        # Spark re-runs every task of a failed barrier stage: rank 0 posts again
        rerun_rank_0 = pool.submit(all_gather, address, "start", 0, "attempt 2 rank 0")
        with pytest.raises(CoordinatorGone):
            first_attempt.result(timeout=10)
        others = [pool.submit(all_gather, address, "start", r, f"attempt 2 rank {r}") for r in (1, 2)]
        answers = [f.result(timeout=10) for f in (rerun_rank_0, *others)]
    assert answers == [["attempt 2 rank 0", "attempt 2 rank 1", "attempt 2 rank 2"]] * 3


def test_an_unreachable_driver_names_its_address_and_what_executors_need():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        port = taken.getsockname()[1]  # bound, never listening: connections are refused
        with pytest.raises(CoordinatorGone, match=f"127.0.0.1:{port}.*spark.driver.host"):
            all_gather(CoordinatorAddress("127.0.0.1", port, "token"), "start", 0, "")


def test_a_rank_that_died_while_waiting_is_withdrawn_and_the_rerun_meets_without_it(coordinator):
    address = coordinator.address
    dead = socket.create_connection((address.host, address.port))  # a task Spark killed mid-wait
    dead.sendall(f"{address.token}\n".encode() + b'{"step": "start", "rank": 1, "value": "stale"}\n')
    time.sleep(0.2)
    dead.close()
    time.sleep(1.0)  # the coordinator notices at its next check
    with ThreadPoolExecutor(3) as pool:
        # ranks 2 and 0 first: had the dead rank 1 stayed, their round would complete with its value
        others = [pool.submit(all_gather, address, "start", r, f"fresh {r}") for r in (2, 0)]
        time.sleep(0.3)
        rank_1 = pool.submit(all_gather, address, "start", 1, "fresh 1")
        try:
            answers = [f.result(timeout=10) for f in (*others, rank_1)]
        finally:
            coordinator.stop()  # a rank left waiting is released, so a failure fails rather than hangs
    assert answers == [["fresh 0", "fresh 1", "fresh 2"]] * 3
