# ruff: noqa  (hostile test program with placeholders, not project code)
# expect: program_timeout
# Ignores the soft CPU-limit signal and spins: the hard CPU limit or the wall clock must stop it.
import signal

signal.signal(signal.SIGXCPU, signal.SIG_IGN)
signal.signal(signal.SIGTERM, signal.SIG_IGN)
while True:
    pass
