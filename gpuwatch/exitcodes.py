"""Exit statuses of `gpuwatch`, chosen so a service manager restarts only what a restart fixes.

0   done (or stopped by SIGTERM/SIGINT)
1   a runtime failure, or `gpuwatch check` found a failure
2   misuse: a bad flag, argument, configuration or file it names, an address that cannot be
    bound (not on this host, a privileged port without the capability), or another daemon
    still holding the state directory after a 10 s wait (two daemons configured on one
    directory); restarting cannot help
75  a transient failure (EX_TEMPFAIL): the listen address is busy; a restart may succeed
"""

import errno

OK = 0
FAILURE = 1
USAGE = 2
TEMPFAIL = 75


def for_bind_error(exc: OSError) -> int:
    """Busy ports free up; a wrong address or a missing privilege stays wrong."""
    return TEMPFAIL if exc.errno == errno.EADDRINUSE else USAGE
