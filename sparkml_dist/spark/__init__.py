from sparkml_dist.spark.session import build_session, check_java, task_slots

__all__ = ["build_session", "check_java", "task_slots"]
