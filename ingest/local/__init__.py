"""Local-Flink plumbing: what `streamberg ingest` on one machine needs around PyFlink's
MiniCluster, and a cluster run uses none of.

- ``settings``: the MiniCluster's settings (loopback binds, mutual TLS);
- ``gateway``: starting the gateway JVM once per process, with the patches and the token;
- ``gateway_auth``, ``loopback``, ``classfile``, ``jvm_lib``: authenticating and binding the
  JVM's servers to loopback by patching PyFlink's bytecode, in a verified private lib folder;
- ``class_archive``: the JVM's class-data-sharing archive, built at setup and verified at use;
- ``fork_server``, ``fork_launcher``: Python workers forked from a pre-warmed interpreter;
- ``worker_logs``: the workers' log lines relayed into the driver's log.

The ingest's domain (writers, committer, dead letters, decoding) is one floor up, in
``ingest/``; nothing here imports it but the fork server's preload list, by name.
"""
