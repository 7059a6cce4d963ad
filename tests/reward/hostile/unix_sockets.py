# ruff: noqa  (hostile test program with placeholders, not project code)
# expect: ok
# Connects to the host's unix sockets: an abstract one and one in a world-writable folder that the test listens on, and the usual daemons'.
import socket

hits = 0
for addr in ["__UNIX_ABSTRACT__", "__UNIX_PATH__", "/run/dbus/system_bus_socket", "/var/run/docker.sock"]:
    for kind in (socket.SOCK_STREAM, socket.SOCK_DGRAM):
        try:
            s = socket.socket(socket.AF_UNIX, kind)
            s.connect(addr)
            s.send(b"PWNED")
            hits += 1
        except OSError:
            pass
print("PWNED" if hits else "nothing")
