"""Monitoring: the status command (lag, backlog, table health) and Prometheus metrics."""
