"""spark-submit entry point: the compactor, the merge or maintenance, on a Spark cluster.

    spark-submit --master spark://host:7077 \\
      --jars /path/iceberg-spark-runtime-3.5_2.12-1.10.2.jar,/usr/share/java/postgresql.jar \\
      --py-files streamberg.zip  $(python -c 'import streamberg.cli.spark_submit as m; print(m.__file__)') \\
      merge --config /etc/streamberg/prod.yaml

The first argument names the component (`compact`, `merge`, `maintain`, or `govern`: one
session keeping every table of a config; without one, `compact`, as before); the rest are that command's own arguments. Under spark-submit the
master and jars come from spark-submit; the config's `*.spark_conf` still applies.
deploy/spark/submit.sh finds the jars for a config and calls this.
"""

from __future__ import annotations

import sys

from streamberg.cli.main import main

# The commands whose work runs in a Spark session (common/spark.py session_for).
SPARK_COMMANDS = ("compact", "merge", "maintain", "govern")


def command_line(argv: list[str]) -> list[str]:
    """The `streamberg` arguments for spark-submit's: the component first, `compact` unnamed."""
    if argv and argv[0] in SPARK_COMMANDS:
        return argv
    return ["compact", *argv]


if __name__ == "__main__":
    sys.exit(main(command_line(sys.argv[1:])))
