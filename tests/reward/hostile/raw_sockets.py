# ruff: noqa  (hostile test program with placeholders, not project code)
# expect: ok
# Opens raw IP and packet sockets (to sniff or forge traffic) and an ICMP ping socket.
import socket

opened = []
for fam, kind, proto in [
    (socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP),
    (socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_TCP),
    (socket.AF_INET6, socket.SOCK_RAW, socket.IPPROTO_ICMPV6),
    (socket.AF_PACKET, socket.SOCK_RAW, 0x0300),
]:
    try:
        socket.socket(fam, kind, proto)
        opened.append(fam)
    except OSError:
        pass
try:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM, socket.IPPROTO_ICMP)
    s.sendto(b"\x08\0\0\0\0\0\0\0", ("8.8.8.8", 0))
    opened.append("ping")
except OSError:
    pass
print("PWNED" if opened else "nothing")
