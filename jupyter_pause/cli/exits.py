"""The exit codes every ``jupyter pause`` command shares (``validate check`` adds its outcomes:
10 restored, 20 fresh, see :mod:`jupyter_pause.policy.upgradecheck`)."""

EXIT_OK = 0
EXIT_FAIL = 1  # the operation failed
EXIT_USAGE = 2  # argparse's own code for a usage error
EXIT_NO_SERVER = 3  # no Jupyter server found or reachable
