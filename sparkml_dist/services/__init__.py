"""Real services for integration runs and users' local setups: an MLflow tracking server and a
Spark standalone cluster, started bound to 127.0.0.1 and stopped by PID."""
