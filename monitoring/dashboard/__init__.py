"""The dashboard served by the long-running services (monitoring/dashboard/app.py)."""
