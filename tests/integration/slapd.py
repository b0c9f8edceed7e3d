"""A real slapd on loopback for tests and benchmarks: the development directory's own
configuration (slonk.pod.ldapdev), on free ports, optionally with TLS from a CA made here."""

from __future__ import annotations

import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from slonk.base import paths
from slonk.config.spec import ClusterSpec, parse_spec
from slonk.pod.ldapdev import DevDirectory, Tls

SUFFIX = "dc=slonk,dc=test"
PASSWORD = "test-admin"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def make_ca(directory: Path, name: str) -> tuple[Path, Path]:
    """A throwaway CA: (certificate, key)."""
    cert, key = directory / f"{name}.crt", directory / f"{name}.key"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-nodes",
            "-keyout",
            str(key),
            "-out",
            str(cert),
            "-subj",
            f"/CN={name}",
            "-days",
            "1",
        ],
        check=True,
        capture_output=True,
    )
    return cert, key


def make_server_tls(directory: Path) -> Tls:
    ca_cert, ca_key = make_ca(directory, "ca")
    key, csr, cert = directory / "server.key", directory / "server.csr", directory / "server.crt"
    subprocess.run(
        [
            "openssl",
            "req",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-nodes",
            "-keyout",
            str(key),
            "-out",
            str(csr),
            "-subj",
            "/CN=localhost",
        ],
        check=True,
        capture_output=True,
    )
    extensions = directory / "san.cnf"
    extensions.write_text("subjectAltName=DNS:localhost,IP:127.0.0.1\n")
    subprocess.run(
        [
            "openssl",
            "x509",
            "-req",
            "-in",
            str(csr),
            "-CA",
            str(ca_cert),
            "-CAkey",
            str(ca_key),
            "-CAcreateserial",
            "-out",
            str(cert),
            "-days",
            "1",
            "-extfile",
            str(extensions),
        ],
        check=True,
        capture_output=True,
    )
    return Tls(certificate=cert, key=key, ca=ca_cert)


@dataclass
class Slapd:
    directory: DevDirectory
    ldap_uri: str
    ldaps_uri: str | None

    def add(self, ldif: str) -> None:
        subprocess.run(
            ["ldapadd", "-x", "-H", self.ldap_uri, "-D", self.directory.admin_dn, "-w", PASSWORD],
            input=ldif,
            text=True,
            check=True,
            capture_output=True,
        )

    def spec(self) -> ClusterSpec:
        """A cluster spec whose users come from this directory, with the parser's defaults."""
        ldap = {
            "uris": [self.ldap_uri],
            "userBase": f"ou=people,{SUFFIX}",
            "groupBase": f"ou=groups,{SUFFIX}",
        }
        return parse_spec({"clusterName": "slapd", "release": "r", "ldap": ldap})


@dataclass(frozen=True)
class TestDirectory(DevDirectory):
    """The development directory, optionally with searches that stop after `size_limit`
    entries, or pages of at most `page_limit` (slapd's size.pr), as many sites' do."""

    size_limit: int | None = None
    page_limit: int | None = None

    def config(self) -> str:
        text = super().config()
        if self.size_limit is not None:
            text = text.replace("sizelimit unlimited", f"sizelimit {self.size_limit}")
        if self.page_limit is not None:
            limits = f"size.soft=unlimited size.hard=unlimited size.pr={self.page_limit}"
            text = text.replace("sizelimit unlimited", f"sizelimit {limits}")
        return text


@contextmanager
def running_slapd(
    workdir: Path,
    seed: str,
    tls: Tls | None = None,
    size_limit: int | None = None,
    page_limit: int | None = None,
) -> Iterator[Slapd]:
    directory = TestDirectory(
        suffix=SUFFIX,
        admin_password=PASSWORD,
        data_dir=workdir / "data",
        conf_dir=workdir / "conf",
        tls=tls,
        lpk_schema=paths.rootfs_dir() / "usr/share/slonk/ldap/openssh-lpk.schema",
        size_limit=size_limit,
        page_limit=page_limit,
    )
    directory.prepare(seed)
    ldap_port = free_port()
    urls = [f"ldap://127.0.0.1:{ldap_port}/"]
    ldaps_uri = None
    if tls:
        ldaps_uri = f"ldaps://127.0.0.1:{free_port()}"
        urls.append(f"{ldaps_uri}/")
    process = subprocess.Popen(
        ["slapd", "-d", "0", "-f", str(directory.conf_file), "-h", " ".join(urls)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                socket.create_connection(("127.0.0.1", ldap_port), timeout=0.2).close()
                break
            except OSError:
                if process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"slapd did not start (exit {process.poll()})") from None
                time.sleep(0.02)
        yield Slapd(directory, f"ldap://127.0.0.1:{ldap_port}", ldaps_uri)
    finally:
        process.terminate()
        process.wait(timeout=10)
