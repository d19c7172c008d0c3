"""The `streamberg` command: one package that composes every component's subcommands.

cli/main.py builds the parser from the modules below and maps failures to exit codes
(library errors from common/errors.py: 1, ConfigError: 2). Each module registers the
subcommands of one component; components never import this package.
"""
