"""A DNS server for tests: on `listen`:53 (UDP and TCP) it answers A questions for one domain
and every name under it with one address, gives an empty answer for other types of those
names, and refuses every other name, so a client pointed at it can resolve nothing else.

Messages are parsed and built with dnspython."""

from __future__ import annotations

import socket
import socketserver
import threading

import dns.message
import dns.rcode
import dns.rdatatype
import dns.rrset


def _answer(wire: bytes, domain: str, address: str) -> bytes | None:
    try:
        query = dns.message.from_wire(wire)
    except Exception:  # noqa: BLE001 - not DNS: stay silent
        return None
    response = dns.message.make_response(query)
    if not query.question:
        response.set_rcode(dns.rcode.FORMERR)
        return response.to_wire()
    question = query.question[0]
    name = question.name.to_text().rstrip(".").lower()
    if name != domain and not name.endswith("." + domain):
        response.set_rcode(dns.rcode.REFUSED)
    elif question.rdtype == dns.rdatatype.A:
        response.answer.append(dns.rrset.from_text(question.name, 5, "IN", "A", address))
    return response.to_wire()


class StubDns:
    def __init__(self, listen: str, domain: str, address: str):
        self.listen = listen
        domain = domain.lower()
        stub = self

        class Udp(socketserver.BaseRequestHandler):
            def handle(self):
                data, sock = self.request
                reply = _answer(data, domain, address)
                if reply is not None:
                    sock.sendto(reply, self.client_address)

        class Tcp(socketserver.StreamRequestHandler):
            def handle(self):
                size = int.from_bytes(self.rfile.read(2), "big")
                reply = _answer(self.rfile.read(size), domain, address)
                if reply is not None:
                    self.wfile.write(len(reply).to_bytes(2, "big") + reply)

        socketserver.UDPServer.allow_reuse_address = True
        socketserver.TCPServer.allow_reuse_address = True
        self.servers = [
            socketserver.ThreadingUDPServer((listen, 53), Udp),
            socketserver.ThreadingTCPServer((listen, 53), Tcp),
        ]
        for s in self.servers:
            s.daemon_threads = True
            threading.Thread(target=s.serve_forever, daemon=True).start()
        del stub

    def stop(self) -> None:
        for s in self.servers:
            s.shutdown()
            s.server_close()


def resolves(listen: str, name: str) -> str | None:
    """The A answer of the stub for `name` (a check that it runs)."""
    q = dns.message.make_query(name, "A")
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.settimeout(5)
        s.sendto(q.to_wire(), (listen, 53))
        r = dns.message.from_wire(s.recv(4096))
    for rrset in r.answer:
        for rd in rrset:
            return rd.to_text()
    return None
