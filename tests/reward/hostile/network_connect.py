# ruff: noqa  (hostile test program with placeholders, not project code)
# expect: program_error
# __PORT__ is a listener the test opened on the host's 127.0.0.1.
import socket

for addr in [("127.0.0.1", __PORT__), ("1.1.1.1", 53), ("8.8.8.8", 443)]:
    try:
        s = socket.create_connection(addr, timeout=1)
        s.sendall(b"PWNED")
        print("PWNED")
    except OSError:
        pass
raise SystemExit("no network, as it should be")
