"""A real OCI registry on loopback for the suites (Debian's `docker-registry`), and images
made here and pushed with the registry's own HTTP API (monolithic blob uploads), so no test
needs a public registry or a container tool.

The images are built from Debian's static busybox: a root filesystem with no bash, sudo, glibc
or `user` account, which is the hard case for "the image needs nothing of ours".
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import shutil
import socket
import subprocess
import tarfile
import tempfile
import time

import requests

BUSYBOX = "/bin/busybox"
APPLETS = [
    "sh", "ls", "cat", "echo", "id", "mkdir", "chown", "chmod", "tar", "adduser", "addgroup",
    "env", "test", "[", "printf", "sleep", "rm", "mv", "cp", "ln", "pwd", "whoami", "grep",
    "sed", "head", "tail", "wc", "true", "false", "dirname", "basename", "stat", "touch",
    "passwd", "getent", "readlink", "realpath", "find", "xargs", "uname", "hostname", "kill",
    "ps", "sort", "tr", "cut", "date", "mktemp", "su", "install", "gzip", "sync", "du", "df",
]


def available() -> bool:
    return shutil.which("docker-registry") is not None and os.path.exists(BUSYBOX)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Registry:
    """`docker-registry serve` on 127.0.0.1 with its storage in a temp dir."""

    def __init__(self) -> None:
        self.dir = tempfile.mkdtemp(prefix="warren-registry-")
        self.port = _free_port()
        self.host = f"127.0.0.1:{self.port}"
        self.url = f"http://{self.host}"
        cfg = os.path.join(self.dir, "config.yml")
        with open(cfg, "w") as f:
            f.write(
                "version: 0.1\n"
                "log:\n  level: warn\n"
                f"storage:\n  filesystem:\n    rootdirectory: {self.dir}/data\n"
                "  delete:\n    enabled: true\n"
                f"http:\n  addr: {self.host}\n"
            )
        self.log = open(os.path.join(self.dir, "registry.log"), "ab")
        self.proc = subprocess.Popen(["docker-registry", "serve", cfg], stdout=self.log, stderr=self.log)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"docker-registry exited with {self.proc.returncode}; see {self.dir}/registry.log")
            try:
                if requests.get(self.url + "/v2/", timeout=1).status_code == 200:
                    return
            except requests.RequestException:
                pass
            time.sleep(0.1)
        raise RuntimeError("docker-registry did not start")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)

    def _blob(self, repo: str, data: bytes) -> str:
        digest = "sha256:" + hashlib.sha256(data).hexdigest()
        r = requests.post(f"{self.url}/v2/{repo}/blobs/uploads/", timeout=30)
        assert r.status_code == 202, r.text
        loc = r.headers["Location"]
        if loc.startswith("/"):
            loc = self.url + loc
        sep = "&" if "?" in loc else "?"
        r = requests.put(f"{loc}{sep}digest={digest}", data=data,
                         headers={"Content-Type": "application/octet-stream"}, timeout=60)
        assert r.status_code == 201, r.text
        return digest

    def push(self, repo: str, tag: str, layers: list[bytes], config: dict) -> str:
        """Pushes an image of gzip tar `layers` (bottom first); returns the manifest digest."""
        descs = []
        diff_ids = []
        for gz in layers:
            descs.append({
                "mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
                "digest": self._blob(repo, gz),
                "size": len(gz),
            })
            diff_ids.append("sha256:" + hashlib.sha256(gzip.decompress(gz)).hexdigest())
        cfg = json.dumps({
            "architecture": "amd64", "os": "linux", "config": config,
            "rootfs": {"type": "layers", "diff_ids": diff_ids},
        }).encode()
        manifest = json.dumps({
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                       "digest": self._blob(repo, cfg), "size": len(cfg)},
            "layers": descs,
        }).encode()
        r = requests.put(f"{self.url}/v2/{repo}/manifests/{tag}", data=manifest,
                         headers={"Content-Type": "application/vnd.oci.image.manifest.v1+json"}, timeout=30)
        assert r.status_code == 201, r.text
        return "sha256:" + hashlib.sha256(manifest).hexdigest()


class Layer:
    """A gzip tar layer built in memory."""

    def __init__(self) -> None:
        self.buf = io.BytesIO()
        self.tf = tarfile.open(fileobj=self.buf, mode="w", format=tarfile.PAX_FORMAT)

    def dir(self, name: str, mode: int = 0o755, uid: int = 0) -> "Layer":
        ti = tarfile.TarInfo(name)
        ti.type, ti.mode, ti.uid, ti.gid = tarfile.DIRTYPE, mode, uid, uid
        self.tf.addfile(ti)
        return self

    def file(self, name: str, data: bytes, mode: int = 0o644, uid: int = 0) -> "Layer":
        ti = tarfile.TarInfo(name)
        ti.size, ti.mode, ti.uid, ti.gid = len(data), mode, uid, uid
        self.tf.addfile(ti, io.BytesIO(data))
        return self

    def link(self, name: str, target: str) -> "Layer":
        ti = tarfile.TarInfo(name)
        ti.type, ti.linkname, ti.mode = tarfile.SYMTYPE, target, 0o777
        self.tf.addfile(ti)
        return self

    def gz(self) -> bytes:
        self.tf.close()
        return gzip.compress(self.buf.getvalue(), mtime=0)


def busybox_layer() -> bytes:
    """A minimal root filesystem: busybox and its applets, root's accounts, nothing else."""
    with open(BUSYBOX, "rb") as f:
        bb = f.read()
    layer = Layer()
    for d in ["bin", "etc", "root", "tmp", "srv", "usr", "usr/bin", "var"]:
        layer.dir(d, 0o1777 if d == "tmp" else 0o755)
    layer.file("bin/busybox", bb, 0o755)
    for a in APPLETS:
        layer.link(f"bin/{a}", "busybox")
    layer.file("etc/passwd", b"root:x:0:0:root:/root:/bin/sh\n")
    layer.file("etc/group", b"root:x:0:\n")
    layer.file("etc/shadow", b"root:*:19000:0:99999:7:::\n", 0o600)
    layer.file("srv/gone.txt", b"removed by the next layer\n")
    layer.dir("srv/cache")
    layer.file("srv/cache/old", b"hidden by an opaque dir\n")
    return layer.gz()
