"""Domain mode end to end: `warren serve --domain warren.test` serves HTTPS with a certificate
of its local CA, and the unmodified E2B SDK works with only `E2B_DOMAIN` and the CA
(`SSL_CERT_FILE`), as it does against E2B: no `E2B_API_URL`, no `E2B_SANDBOX_URL`. The API is
reached at `https://api.warren.test`, sandboxes at `https://<port>-<id>.warren.test`.

Names under warren.test resolve to loopback only inside the client processes this module
starts: each runs in a mount namespace of its own whose /etc/resolv.conf names a DNS server
the test runs on 127.77.0.53 (`dnsstub.py`), which answers names under warren.test with
127.0.0.1 and refuses every other name. The SDK resolves names itself (hickory, from
/etc/resolv.conf), so this is the one way to reach it without touching the host's resolver.
Nothing is resolved or sent elsewhere. The HTTPS listener is on 127.0.0.1:443, because SDK
URLs carry no port.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import textwrap

import pytest

from dnsstub import StubDns, resolves
from support.warren import API_KEY, Server, require, same_on_every_runtime

DOMAIN = "warren.test"
STUB_DNS = "127.77.0.53"


def _port_443_free() -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", 443))
        except OSError:
            return False
    return True


@pytest.fixture(scope="module")
def domain_server(server):
    """The shared server restarted in domain mode (one server per host), and back after."""
    same_on_every_runtime("the TLS listener and Host routing are the server's, the same for every runtime")
    require("port 443 on 127.0.0.1 free for the HTTPS listener", _port_443_free())
    require("unshare and mount (util-linux)", bool(shutil.which("unshare")) and bool(shutil.which("mount")))
    stub = StubDns(STUB_DNS, DOMAIN, "127.0.0.1")
    assert resolves(STUB_DNS, f"api.{DOMAIN}") == "127.0.0.1"
    conf_dir = tempfile.mkdtemp(prefix="warren-domain-")
    resolv = os.path.join(conf_dir, "resolv.conf")
    with open(resolv, "w") as f:
        f.write(f"nameserver {STUB_DNS}\n")
    server.stop()
    srv = Server(server.data_dir, server.extra_args + ("--domain", DOMAIN, "--tls-listen", "127.0.0.1:443"))
    srv.port, srv.url = server.port, server.url
    try:
        srv.start()
        srv.ca = os.path.join(server.data_dir, "tls", DOMAIN, "ca.crt")
        srv.resolv = resolv
        yield srv
    finally:
        srv.stop()
        stub.stop()
        shutil.rmtree(conf_dir, ignore_errors=True)
        server.start()


def isolated(srv, argv: list[str]) -> list[str]:
    """`argv` in a mount namespace of its own whose /etc/resolv.conf names the stub DNS server."""
    return ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c",
            'mount --bind "$0" /etc/resolv.conf && exec "$@"', srv.resolv, *argv]


def client_env(srv) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("E2B_")}
    env.update(E2B_API_KEY=API_KEY, E2B_DOMAIN=DOMAIN, SSL_CERT_FILE=srv.ca)
    return env


def run_client(srv, script: str, timeout: int = 300) -> dict:
    """Runs `script` in a fresh Python with the SDK's domain-mode environment and returns the
    JSON object it prints last."""
    proc = subprocess.run(
        isolated(srv, [sys.executable, "-c", textwrap.dedent(script)]),
        env=client_env(srv), capture_output=True, text=True, timeout=timeout,
    )
    assert proc.returncode == 0, f"client failed:\n{proc.stdout}\n{proc.stderr}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_the_ca_is_private_where_it_must_be(domain_server):
    tls_dir = os.path.dirname(domain_server.ca)
    assert os.stat(tls_dir).st_mode & 0o777 == 0o700
    assert os.stat(os.path.join(tls_dir, "ca.key")).st_mode & 0o777 == 0o600
    with open(domain_server.ca) as f:
        assert "BEGIN CERTIFICATE" in f.read()


def test_the_sdk_works_with_only_e2b_domain(domain_server):
    out = run_client(
        domain_server,
        """
        import json, httpx
        from e2b import Sandbox
        sbx = Sandbox.create(timeout=120)
        try:
            r = sbx.commands.run("echo hello over tls")
            sbx.files.write("/tmp/tls.txt", "written over https")
            # A service of the user's on port 8000, reached at its public name.
            sbx.commands.run("cd /tmp && python3 -m http.server 8000", background=True)
            sbx.commands.run(
                "for i in $(seq 100); do python3 -c \\"import urllib.request; "
                "urllib.request.urlopen('http://127.0.0.1:8000/tls.txt')\\" 2>/dev/null && exit 0; "
                "sleep 0.1; done; exit 1"
            )
            host = sbx.get_host(8000)
            page = httpx.get(f"https://{host}/tls.txt", timeout=30)
            print(json.dumps({
                "id": sbx.sandbox_id,
                "stdout": r.stdout,
                "read": sbx.files.read("/tmp/tls.txt"),
                "host": host,
                "page": [page.status_code, page.text],
                "api": str(sbx.connection_config.api_url),
            }))
        finally:
            sbx.kill()
        """,
    )
    assert out["stdout"] == "hello over tls\n"
    assert out["read"] == "written over https"
    assert out["host"] == f"8000-{out['id']}.{DOMAIN}"
    assert out["page"] == [200, "written over https"]
    assert out["api"] == f"https://api.{DOMAIN}"


def test_signed_urls_work_at_the_public_names(domain_server):
    out = run_client(
        domain_server,
        """
        import json, httpx
        from e2b import Sandbox
        sbx = Sandbox.create(timeout=120)
        try:
            results = {}
            up = sbx.upload_url("/tmp/signed.txt")
            results["upload_host"] = httpx.URL(up).host
            r = httpx.post(up, files={"file": ("signed.txt", b"uploaded with a signed url")}, timeout=30)
            results["upload"] = r.status_code
            results["read"] = sbx.files.read("/tmp/signed.txt")
            down = sbx.download_url("/tmp/signed.txt", use_signature_expiration=120)
            r = httpx.get(down, timeout=30)
            results["download"] = [r.status_code, r.text]
            # The same URL with another signature: refused by the agent.
            bad = httpx.URL(down).copy_set_param("signature", "v1_" + "A" * 43)
            results["tampered"] = httpx.get(bad, timeout=30).status_code
            # Someone else's path with this signature: refused too.
            other = httpx.URL(down).copy_set_param("path", "/etc/passwd")
            results["other_path"] = httpx.get(other, timeout=30).status_code
            print(json.dumps(results))
        finally:
            sbx.kill()
        """,
    )
    assert out["upload_host"].startswith("49983-") and out["upload_host"].endswith(f".{DOMAIN}")
    assert out["upload"] == 200
    assert out["read"] == "uploaded with a signed url"
    assert out["download"] == [200, "uploaded with a signed url"]
    assert out["tampered"] == 401
    assert out["other_path"] == 401


def test_http2_and_pause_resume_at_the_public_names(domain_server):
    require("curl (scripts/setup.sh installs it)", bool(shutil.which("curl")))
    out = run_client(
        domain_server,
        """
        import json
        from e2b import Sandbox
        sbx = Sandbox.create(timeout=120)
        sbx.commands.run("echo state > /tmp/kept")
        sbx.pause()
        again = Sandbox.connect(sbx.sandbox_id, timeout=120)
        print(json.dumps({"id": sbx.sandbox_id, "kept": again.commands.run("cat /tmp/kept").stdout}))
        """,
    )
    assert out["kept"] == "state\n"
    host = f"49983-{out['id']}.{DOMAIN}"
    # curl speaks HTTP/2 when ALPN offers it; --resolve keeps the name on loopback.
    curl = subprocess.run(
        ["curl", "-sS", "--http2", "--cacert", domain_server.ca, "--resolve", f"{host}:443:127.0.0.1",
         "-o", "/dev/null", "-w", "%{http_version} %{http_code}", f"https://{host}/health"],
        capture_output=True, text=True, timeout=60, env={"PATH": os.environ["PATH"]},
    )
    assert curl.returncode == 0, curl.stderr
    version, code = curl.stdout.split()
    assert version == "2" and code.startswith("2"), curl.stdout
    # A client that does not trust the CA is refused (the system store does not have it).
    untrusted = subprocess.run(
        ["curl", "-sS", "--resolve", f"{host}:443:127.0.0.1", f"https://{host}/health"],
        capture_output=True, text=True, timeout=60, env={"PATH": os.environ["PATH"]},
    )
    assert untrusted.returncode != 0
    subprocess.run(
        isolated(domain_server, [sys.executable, "-c", f"from e2b import Sandbox; Sandbox.kill({out['id']!r})"]),
        env=client_env(domain_server), check=True, timeout=60,
    )


# The JS SDK (e2b 2.51.0, installed with the e2b CLI in tests/e2e/e2b-cli) in domain mode: it
# resolves names with the system resolver (the stub, through the private resolv.conf) and
# trusts the CA through NODE_EXTRA_CA_CERTS.
JS_CLIENT = r"""
const { Sandbox } = await import('e2b')
const sbx = await Sandbox.create({ timeoutMs: 120000 })
try {
  const r = await sbx.commands.run('echo js over tls')
  await sbx.files.write('/tmp/js.txt', 'written by js')
  const down = await sbx.downloadUrl('/tmp/js.txt', { useSignatureExpiration: 120_000 })
  const body = await (await fetch(down)).text()
  const up = await sbx.uploadUrl('/tmp/up.txt')
  const form = new FormData()
  form.append('file', new Blob(['uploaded by js']), 'up.txt')
  const upload = (await fetch(up, { method: 'POST', body: form })).status
  const read = await sbx.files.read('/tmp/up.txt')
  console.log(JSON.stringify({ id: sbx.sandboxId, stdout: r.stdout, down, body, upload, read, host: sbx.getHost(8000) }))
} finally {
  await sbx.kill()
}
"""


def test_the_js_sdk_works_with_only_e2b_domain(domain_server):
    cli_dir = os.path.join(os.path.dirname(os.path.abspath(__file__)), "e2b-cli")
    require("node >= 20.18.1 and the JS SDK (tests/e2e/e2b-cli: npm ci, as scripts/test.sh does)",
            shutil.which("node") is not None and os.path.isdir(os.path.join(cli_dir, "node_modules", "e2b")))
    env = client_env(domain_server)
    env["NODE_EXTRA_CA_CERTS"] = domain_server.ca
    proc = subprocess.run(
        isolated(domain_server, ["node", "--input-type=module", "-e", JS_CLIENT]),
        cwd=cli_dir, env=env, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, f"{proc.stdout}\n{proc.stderr}"
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["stdout"] == "js over tls\n"
    assert out["down"].startswith(f"https://49983-{out['id']}.{DOMAIN}/files?"), out["down"]
    assert out["body"] == "written by js"
    assert out["upload"] == 200 and out["read"] == "uploaded by js"
    assert out["host"] == f"8000-{out['id']}.{DOMAIN}"
