"""Slurm's REST API on a real local cluster (values: restapi): slurmrestd in its own pod,
called with curl from the login pod as a user would, with a token slurmctld issued to them.
From the attacker's side: another user's token, a forged one, a name that is not the
token's, no token, a token asked for someone else, and a job calling the API."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets
import shlex
import time
import uuid
from typing import Any

from ..support.cluster import LocalCluster, wait_for
from ..support.users import bystander

API = "http://slonk-restapi:6820/slurm/v0.0.42"
RESTAPI = "slonk-restapi-0"


def _token(cluster: LocalCluster, user: str) -> str:
    """A token slurmctld issues to `user`, who asks for it on the login pod."""
    said = cluster.user(user).check_output("scontrol token lifespan=600").strip()
    name, _, token = said.partition("=")
    assert name == "SLURM_JWT" and token, said
    return token


def _call(
    cluster: LocalCluster,
    method: str,
    path: str,
    *,
    as_user: str = "demo",
    name: str | None = None,
    token: str | None = None,
    body: dict[str, Any] | None = None,
) -> tuple[int, dict[str, Any]]:
    """(HTTP status, JSON answer or {}) of one request from the login pod, run as `as_user`,
    sending `name` and `token` as Slurm's headers when given: on curl's standard input, as
    the README tells users to (other users see command lines there)."""
    headers = "".join(
        f"{header}: {value}\n"
        for header, value in (("X-SLURM-USER-NAME", name), ("X-SLURM-USER-TOKEN", token))
        if value is not None
    )
    command = ["curl", "-s", "-m", "20", "-X", method, "-w", r"\n%{http_code}", "-H", "@-"]
    if body is not None:
        command += ["-H", "Content-Type: application/json", "--data-binary", json.dumps(body)]
    printed = shlex.join(["printf", "%s", headers])
    out = cluster.user(as_user).check_output(f"{printed} | {shlex.join([*command, API + path])}")
    text, _, status = out.rpartition("\n")
    try:
        answer = json.loads(text) if text.strip() else {}
    except ValueError:
        answer = {}
    return int(status), answer


def _forged(user: str, algorithm: str = "HS256") -> str:
    """A token in Slurm's form for `user`, signed with a key that is not the cluster's (or,
    with algorithm "none", not signed at all)."""

    def part(data: bytes) -> str:
        return base64.urlsafe_b64encode(data).rstrip(b"=").decode()

    now = int(time.time())
    head = part(json.dumps({"alg": algorithm, "typ": "JWT"}).encode())
    claims = part(json.dumps({"exp": now + 600, "iat": now, "sun": user}).encode())
    if algorithm == "none":
        return f"{head}.{claims}."
    signature = hmac.new(secrets.token_bytes(32), f"{head}.{claims}".encode(), hashlib.sha256)
    return f"{head}.{claims}.{part(signature.digest())}"


def _job(cluster: LocalCluster, job_id: int, token: str) -> dict[str, Any]:
    status, answer = _call(cluster, "GET", f"/job/{job_id}", name="demo", token=token)
    assert status == 200, answer
    (job,) = answer["jobs"]
    return dict(job)


def test_a_user_submits_a_job_reads_it_back_and_alone_may_cancel_it(healthy: LocalCluster):
    token = _token(healthy, "demo")
    release = f"rest-{uuid.uuid4().hex[:8]}"
    script = f"#!/bin/sh\nuntil [ -e $HOME/{release} ]; do sleep 0.1; done\n"
    job = {
        "name": "over-rest",
        "script": script,
        "current_working_directory": "/home/demo",
        "environment": ["PATH=/usr/bin:/bin"],
    }
    status, answer = _call(
        healthy, "POST", "/job/submit", name="demo", token=token, body={"job": job}
    )
    assert status == 200 and not answer["errors"], answer
    job_id = int(answer["job_id"])
    read = _job(healthy, job_id, token)
    # The job is demo's (slurmctld took the user from the token). The REST pod knows no
    # users, so it answers the id without a name (user_name "").
    demo_uid = int(healthy.user("demo").check_output("id -u"))
    assert (read["user_id"], read["name"]) == (demo_uid, "over-rest")
    assert str(job_id) in healthy.jobs()  # squeue on the controller sees it too

    # Another user's valid token reads it (squeue shows every job) but cannot cancel it.
    other = bystander(healthy)
    theirs = _token(healthy, other)
    status, answer = _call(
        healthy, "DELETE", f"/job/{job_id}", as_user=other, name=other, token=theirs
    )
    assert "Access/permission denied" in json.dumps(answer), answer
    assert str(job_id) in healthy.jobs()

    status, answer = _call(healthy, "DELETE", f"/job/{job_id}", name="demo", token=token)
    assert status == 200 and not answer["errors"], answer
    wait_for(f"job {job_id} cancelled", lambda: str(job_id) not in healthy.jobs())


def test_no_token_a_forged_one_or_a_name_not_the_token_s_is_refused(healthy: LocalCluster):
    """No token: slurmrestd answers 401 itself. A token it passes on that slurmctld refuses
    (not signed with the cluster's key, or sent under another user's name): 511, and nothing
    is done. /jobs, as /ping answers without asking slurmctld who calls."""
    token, other = _token(healthy, "demo"), bystander(healthy)
    assert _call(healthy, "GET", "/jobs")[0] == 401
    assert _call(healthy, "GET", "/jobs", name="demo")[0] == 401
    for name, forged in (
        ("demo", _forged("demo")),
        ("root", _forged("root")),
        ("demo", _forged("demo", "none")),
    ):
        assert _call(healthy, "GET", "/jobs", name=name, token=forged)[0] == 511, forged
    # demo's own token under root's name or another user's acts as no one.
    for name in ("root", "slurm", other):
        assert _call(healthy, "GET", "/jobs", name=name, token=token)[0] == 511
    before = healthy.jobs()
    job = {"script": "#!/bin/sh\ntrue\n", "current_working_directory": "/tmp", "environment": []}
    forged = _forged(other)
    status, answer = _call(
        healthy, "POST", "/job/submit", name=other, token=forged, body={"job": job}
    )
    assert status == 511 and "job_id" not in answer, answer
    assert healthy.jobs() == before
    assert _call(healthy, "GET", "/jobs", name="demo", token=token)[0] == 200


def test_a_user_gets_a_token_for_themselves_alone_and_not_for_long(healthy: LocalCluster):
    for someone in ("root", "slurm", bystander(healthy)):
        asked = healthy.user("demo").run(f"scontrol token username={someone}")
        assert asked.rc != 0 and "SLURM_JWT=" not in asked.stdout, asked.stdout
    # restapi.maxTokenLifespanSeconds, 3600 by default.
    assert healthy.user("demo").run("scontrol token lifespan=3600").rc == 0
    longer = healthy.user("demo").run("scontrol token lifespan=3601")
    assert longer.rc != 0 and "SLURM_JWT=" not in longer.stdout, longer.stdout


PROBE = """import socket, sys
try:
    socket.create_connection((sys.argv[1], int(sys.argv[2])), 5)
    print("connected")
except OSError as err:
    print(type(err).__name__)
"""


def test_jobs_cannot_reach_the_api_and_its_pod_holds_no_secret(healthy: LocalCluster):
    """A user's job (on a worker, which the API's NetworkPolicy leaves out) is refused at
    once, while the same job reaches slurmctld and a login pod reaches the API."""
    demo = healthy.user("demo")
    demo.check_output(f"printf %s {shlex.quote(PROBE)} > ~/probe.py")
    both = "python3 ~/probe.py slonk-restapi 6820; python3 ~/probe.py slonk-controller 6817"
    assert demo.check_output(f"srun -N1 sh -c {shlex.quote(both)}").split() == [
        "ConnectionRefusedError",
        "connected",
    ]
    assert demo.check_output("python3 ~/probe.py slonk-restapi 6820").strip() == "connected"
    pod = healthy.pod(RESTAPI)
    for secret in ("/var/run/secrets/slonk", "/etc/slurm/jwt_hs256.key", "/etc/munge/munge.key"):
        assert pod.run(f"test -e {secret}").rc != 0, secret
    owners = pod.check_output("ps -o user= -C slurmrestd").split()
    assert owners and set(owners) == {"slurmrestd"}
