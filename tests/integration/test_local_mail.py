"""Mail for `sbatch --mail-type` through the site's relay (values mail): a real SMTP server
(aiosmtpd, tests/integration/mailrelay.py) on the session cluster's network, which names it
in mail.relay. A user's job mails them when it ends; a --mail-user that is not one address
gets no mail, and slurmctld's log says why. (Without a relay, sbatch tells the user:
test_local_lifecycle's cluster has none.)"""

from __future__ import annotations

import shlex
from collections.abc import Iterator
from email.message import Message

import pytest

from ..support.cluster import MAIL_DOMAIN, LocalCluster, wait_for
from . import mailrelay

CONTROLLER = "slonk-controller-0"


@pytest.fixture(scope="module")
def relay(cluster: LocalCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator:
    with mailrelay.running(cluster.state_dir, tmp_path_factory.mktemp("mail") / "box") as box:
        yield box


def _submit(cluster: LocalCluster, *sbatch_args: str) -> str:
    command = f"sbatch --parsable --output=/dev/null {shlex.join(sbatch_args)} --wrap true"
    return cluster.user().check_output(command).strip()


def _mail_of(box, job: str) -> Message | None:
    return next((m for m in mailrelay.messages(box) if f"Job_id={job} " in m["Subject"]), None)


def test_a_users_job_mails_them_when_it_ends(healthy: LocalCluster, relay):
    job = _submit(healthy, "--mail-type=END")
    message = wait_for(f"job {job}'s mail", lambda: _mail_of(relay, job))
    assert message["To"] == f"demo@{MAIL_DOMAIN}"
    assert message["From"] == f"slurm@{MAIL_DOMAIN}"
    assert " Ended, " in message["Subject"] and "COMPLETED" in message["Subject"]
    body = message.get_payload()
    assert f"Job: {job}" in body and "User: demo" in body and "Exit code: 0" in body


def test_a_mail_user_that_is_not_one_address_gets_no_mail_and_the_log_says_why(
    healthy: LocalCluster, relay
):
    offset = healthy.log_offset(CONTROLLER)
    two = f"a@{MAIL_DOMAIN},b@{MAIL_DOMAIN}"
    job = _submit(healthy, "--mail-type=END", f"--mail-user={two}")
    refused = f"refused recipient '{two}': not one mail address"
    wait_for("slurmctld to log the refusal", lambda: refused in healthy.log(CONTROLLER, offset))
    assert "MailProg returned error" in healthy.log(CONTROLLER, offset)
    assert _mail_of(relay, job) is None
