"""Test-session fixtures live in tests/fixtures/, one module per real component.

They start real things (a tansu broker, Spark with the Iceberg runtime, PyFlink jobs) once
per test session where they can, because each costs seconds to start on a 2-core machine.
"""

pytest_plugins = [
    "tests.fixtures.broker",
    "tests.fixtures.spark",
    "tests.fixtures.postgres",
    "tests.fixtures.s3",
]
