"""spark-submit entry point: the same compactor, on a Spark cluster.

    spark-submit --master spark://host:7077 \\
      --jars /path/iceberg-spark-runtime-3.5_2.12-1.10.2.jar,/usr/share/java/postgresql.jar \\
      --py-files streamberg.zip  $(python -c 'import streamberg.cli.spark_submit as m; print(m.__file__)') \\
      --config /etc/streamberg/prod.yaml

Arguments are those of ``streamberg compact``. Under spark-submit the master and jars come
from spark-submit; ``compactor.spark_conf`` from the config still applies.
"""

from __future__ import annotations

import sys

from streamberg.cli.main import main

if __name__ == "__main__":
    sys.exit(main(["compact", *sys.argv[1:]]))
