import signal

from helpers import horovodrun  # noqa: F401 - a fixture, exported to every test

# Tests send SIGINT and SIGHUP to the processes they start and expect a user's defaults there. A signal
# ignored here is ignored in every child too (an ignored disposition survives exec): `nohup make test &`
# ignores both, and three signal tests then failed for a reason of the launcher's, not kfast's.
for _signum, _default in ((signal.SIGINT, signal.default_int_handler), (signal.SIGHUP, signal.SIG_DFL)):
    if signal.getsignal(_signum) == signal.SIG_IGN:
        signal.signal(_signum, _default)
