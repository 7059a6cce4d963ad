# ruff: noqa  (hostile test program with placeholders, not project code)
# expect: program_error
import socket

try:
    socket.getaddrinfo("example.com", 80)
    print("PWNED")
except OSError:
    pass
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.sendto(b"x", ("127.0.0.1", __PORT__))
s.sendto(b"x", ("8.8.8.8", 53))
