#
# Licensed to the Apache Software Foundation (ASF) under one or more
# contributor license agreements.  See the NOTICE file distributed with
# this work for additional information regarding copyright ownership.
# The ASF licenses this file to You under the Apache License, Version 2.0
# (the "License"); you may not use this file except in compliance with
# the License.  You may obtain a copy of the License at
#
#    http://www.apache.org/licenses/LICENSE-2.0
#
# Unless required by applicable law or agreed to in writing, software
# distributed under the License is distributed on an "AS IS" BASIS,
# WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
# See the License for the specific language governing permissions and
# limitations under the License.
#

# Ported from Apache Spark's python/pyspark/ml/torch/tests/test_distributor.py (apache/spark
# c9d9a1059ff8, the newest copy of the file this project could read offline) to run against
# sparkml_dist.TorchDistributor. Changed: the imports (TorchDistributor from sparkml_dist;
# SPARK_HOME, which pyspark 4.3's pyspark.testing.utils no longer exports, from the installed
# pyspark). Left out, as tests of pyspark's private torchrun machinery that this distributor does
# not have (it starts ranks in Spark's own Python workers, not through torchrun):
# test_execute_command, test_create_torchrun_command, test_local_training_succeeds,
# test_dist_training_succeeds (they replace _run_training_on_pytorch_file), the
# TorchWrapperUnitTests (torch_run_process_wrapper) and test_get_gpus_owned_local (a private
# helper). Left out because they need the network or a file of Spark's repository:
# test_end_to_end_run_locally / _distributedly (torchvision downloads MNIST) and
# test_local_file_with_pytorch / test_distributed_file_with_pytorch
# (python/test_support/test_pytorch_training_file.py). test_get_num_tasks_distributed is kept
# with pyspark 4.3's semantics for a num_processes that is not a multiple of
# spark.task.resource.gpu.amount (an error, where this older copy expected a rounded count):
# see docs/bring-your-own.md. Run by tests/test_distributor.py in a process of its own (each test
# makes its own SparkContext, as the original does).

import os
import stat
import tempfile
from typing import Dict
import unittest

import pyspark
from pyspark import SparkConf, SparkContext
from pyspark.sql import SparkSession

from sparkml_dist import TorchDistributor

SPARK_HOME = os.path.dirname(pyspark.__file__)


class TorchDistributorBaselineUnitTests(unittest.TestCase):
    def setUp(self) -> None:
        conf = SparkConf()
        self.sc = SparkContext("local[4]", conf=conf)
        self.spark = SparkSession(self.sc)

    def tearDown(self) -> None:
        self.spark.stop()

    def test_validate_correct_inputs(self) -> None:
        inputs = [
            (1, True, False),
            (100, True, False),
            (1, False, False),
            (100, False, False),
        ]
        for num_processes, local_mode, use_gpu in inputs:
            with self.subTest():
                expected_params = {
                    "num_processes": num_processes,
                    "local_mode": local_mode,
                    "use_gpu": use_gpu,
                    "num_tasks": num_processes,
                }
                dist = TorchDistributor(num_processes, local_mode, use_gpu)
                self.assertEqual(expected_params, dist.input_params)

    def test_validate_incorrect_inputs(self) -> None:
        inputs = [
            (0, False, False, ValueError, "positive"),
        ]
        for num_processes, local_mode, use_gpu, error, message in inputs:
            with self.subTest():
                with self.assertRaisesRegex(error, message):
                    TorchDistributor(num_processes, local_mode, use_gpu)

    def test_encryption_passes(self) -> None:
        inputs = [
            ("spark.ssl.enabled", "false", "pytorch.spark.distributor.ignoreSsl", "true"),
            ("spark.ssl.enabled", "false", "pytorch.spark.distributor.ignoreSsl", "false"),
            ("spark.ssl.enabled", "true", "pytorch.spark.distributor.ignoreSsl", "true"),
        ]
        for ssl_conf_key, ssl_conf_value, pytorch_conf_key, pytorch_conf_value in inputs:
            with self.subTest():
                self.spark.sparkContext._conf.set(ssl_conf_key, ssl_conf_value)
                self.spark.sparkContext._conf.set(pytorch_conf_key, pytorch_conf_value)
                distributor = TorchDistributor(1, True, False)
                distributor._check_encryption()

    def test_encryption_fails(self) -> None:
        # this is the only combination that should fail
        inputs = [("spark.ssl.enabled", "true", "pytorch.spark.distributor.ignoreSsl", "false")]
        for ssl_conf_key, ssl_conf_value, pytorch_conf_key, pytorch_conf_value in inputs:
            with self.subTest():
                with self.assertRaisesRegex(Exception, "encryption"):
                    self.spark.sparkContext._conf.set(ssl_conf_key, ssl_conf_value)
                    self.spark.sparkContext._conf.set(pytorch_conf_key, pytorch_conf_value)
                    distributor = TorchDistributor(1, True, False)
                    distributor._check_encryption()

    def test_get_num_tasks_fails(self) -> None:
        inputs = [1, 5, 4]

        # This is when the conf isn't set and we request GPUs
        for num_processes in inputs:
            with self.subTest():
                with self.assertRaisesRegex(RuntimeError, "driver"):
                    TorchDistributor(num_processes, True, True)
                with self.assertRaisesRegex(RuntimeError, "unset"):
                    TorchDistributor(num_processes, False, True)


class TorchDistributorLocalUnitTests(unittest.TestCase):
    def setUp(self) -> None:
        class_name = self.__class__.__name__
        self.gpu_discovery_script_file = tempfile.NamedTemporaryFile(delete=False)
        self.gpu_discovery_script_file.write(
            b'echo {\\"name\\": \\"gpu\\", \\"addresses\\": [\\"0\\",\\"1\\",\\"2\\"]}'
        )
        self.gpu_discovery_script_file.close()
        # create temporary directory for Worker resources coordination
        self.tempdir = tempfile.NamedTemporaryFile(delete=False)
        os.unlink(self.tempdir.name)
        os.chmod(
            self.gpu_discovery_script_file.name,
            stat.S_IRWXU | stat.S_IXGRP | stat.S_IRGRP | stat.S_IROTH | stat.S_IXOTH,
        )
        conf = SparkConf().set("spark.test.home", SPARK_HOME)

        conf = conf.set("spark.driver.resource.gpu.amount", "3")
        conf = conf.set(
            "spark.driver.resource.gpu.discoveryScript", self.gpu_discovery_script_file.name
        )

        self.sc = SparkContext("local-cluster[2,2,1024]", class_name, conf=conf)
        self.spark = SparkSession(self.sc)

    def tearDown(self) -> None:
        os.unlink(self.gpu_discovery_script_file.name)
        self.spark.stop()

    def setup_env_vars(self, input_map: Dict[str, str]) -> None:
        for key, value in input_map.items():
            os.environ[key] = value

    def delete_env_vars(self, input_map: Dict[str, str]) -> None:
        for key in input_map.keys():
            del os.environ[key]

    def test_get_num_tasks_locally(self) -> None:
        succeeds = [1, 2]
        fails = [4, 8]
        for num_processes in succeeds:
            with self.subTest():
                expected_output = num_processes
                distributor = TorchDistributor(num_processes, True, True)
                self.assertEqual(distributor._get_num_tasks(), expected_output)

        for num_processes in fails:
            with self.subTest():
                with self.assertLogs("TorchDistributor", level="WARNING") as log:
                    distributor = TorchDistributor(num_processes, True, True)
                    self.assertEqual(len(log.records), 1)
                    self.assertEqual(distributor.num_processes, 3)


class TorchDistributorDistributedUnitTests(unittest.TestCase):
    def setUp(self) -> None:
        class_name = self.__class__.__name__
        self.gpu_discovery_script_file = tempfile.NamedTemporaryFile(delete=False)
        self.gpu_discovery_script_file.write(
            b'echo {\\"name\\": \\"gpu\\", \\"addresses\\": [\\"0\\",\\"1\\",\\"2\\"]}'
        )
        self.gpu_discovery_script_file.close()
        # create temporary directory for Worker resources coordination
        self.tempdir = tempfile.NamedTemporaryFile(delete=False)
        os.unlink(self.tempdir.name)
        os.chmod(
            self.gpu_discovery_script_file.name,
            stat.S_IRWXU | stat.S_IXGRP | stat.S_IRGRP | stat.S_IROTH | stat.S_IXOTH,
        )
        conf = SparkConf().set("spark.test.home", SPARK_HOME)

        conf = conf.set(
            "spark.worker.resource.gpu.discoveryScript", self.gpu_discovery_script_file.name
        )
        conf = conf.set("spark.worker.resource.gpu.amount", "3")
        conf = conf.set("spark.task.cpus", "2")
        conf = conf.set("spark.task.resource.gpu.amount", "1")
        conf = conf.set("spark.executor.resource.gpu.amount", "1")

        self.sc = SparkContext("local-cluster[2,2,1024]", class_name, conf=conf)
        self.spark = SparkSession(self.sc)

    def tearDown(self) -> None:
        os.unlink(self.gpu_discovery_script_file.name)
        self.spark.stop()

    def test_get_num_tasks_distributed(self) -> None:
        inputs = [(1, 8, 8), (2, 8, 4)]

        for spark_conf_value, num_processes, expected_output in inputs:
            with self.subTest():
                self.spark.sparkContext._conf.set(
                    "spark.task.resource.gpu.amount", str(spark_conf_value)
                )
                distributor = TorchDistributor(num_processes, False, True)
                self.assertEqual(distributor._get_num_tasks(), expected_output)

        self.spark.sparkContext._conf.set("spark.task.resource.gpu.amount", "1")


if __name__ == "__main__":
    unittest.main(verbosity=2)
