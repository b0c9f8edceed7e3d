"""slurmctld's MailProg with a relay (slonk.slurm.mail), against a real SMTP server (aiosmtpd)
on loopback: what arrives, and what a user's job name or --mail-user cannot make it do."""

from __future__ import annotations

import email
import email.policy
import socket
from collections.abc import Iterator
from email.message import EmailMessage
from pathlib import Path
from typing import Any

import pytest
import yaml
from aiosmtpd.controller import Controller

from slonk.cli import main
from slonk.config.model import MailSettings
from slonk.config.render import render
from slonk.config.spec import parse_spec
from slonk.slurm import mail

SUBJECT = "Slurm Job_id=42 Name=train Ended, Run time 00:00:05, COMPLETED, ExitCode 0"
JOB = {
    "SLURM_JOB_ID": "42",
    "SLURM_JOB_NAME": "train",
    "SLURM_JOB_USER": "demo",
    "SLURM_JOB_MAIL_TYPE": "Ended",
    "SLURM_JOB_STATE": "COMPLETED",
    "SLURM_JOB_EXIT_CODE_MAX": "0",
}


class Relay:
    """What the server received: (envelope sender, recipients, message), and the answer it
    gives to DATA."""

    def __init__(self) -> None:
        self.received: list[tuple[str, list[str], EmailMessage]] = []
        self.answer = "250 OK"

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
        parsed = email.message_from_bytes(envelope.content, policy=email.policy.default)
        assert isinstance(parsed, EmailMessage)
        if self.answer.startswith("250"):
            self.received.append((envelope.mail_from, list(envelope.rcpt_tos), parsed))
        return self.answer


@pytest.fixture
def relay() -> Iterator[tuple[Relay, MailSettings]]:
    handler = Relay()
    server = _started(handler)
    try:
        yield handler, MailSettings(relay=f"127.0.0.1:{server.port}", domain="lab.example")
    finally:
        server.stop()


def _started(handler: Relay) -> Controller:
    """A server on a free port: another process may take the port between the look and the
    bind (the unit tests run two at once), so a few looks."""
    for _ in range(5):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        server = Controller(handler, hostname="127.0.0.1", port=port)
        try:
            server.start()
            return server
        except (OSError, RuntimeError):
            continue
    raise RuntimeError("no free port for the SMTP server")


def test_a_message_reaches_the_relay_with_the_jobs_fields(relay):
    handler, settings = relay
    mail.send(settings, mail.compose(settings, SUBJECT, "demo", JOB))
    ((sender, recipients, message),) = handler.received
    assert (sender, recipients) == ("slurm@lab.example", ["demo@lab.example"])
    assert message["Subject"] == SUBJECT
    assert message["Auto-Submitted"] == "auto-generated"
    lines = message.get_content().splitlines()
    assert {"Job: 42", "State: COMPLETED", "Exit code: 0"} <= set(lines), lines


def test_an_address_keeps_its_own_domain(relay):
    handler, settings = relay
    mail.send(settings, mail.compose(settings, SUBJECT, "alice@uni.example", JOB))
    assert handler.received[0][1] == ["alice@uni.example"]


def test_a_job_name_cannot_write_a_header_or_a_line_of_the_body(relay):
    handler, settings = relay
    name = "x\r\nBcc: victim@else.example\r\n\r\nforged body"
    subject = f"Slurm Job_id=42 Name={name} Began"
    env = JOB | {"SLURM_JOB_NAME": name}
    mail.send(settings, mail.compose(settings, subject, "demo", env))
    ((_, recipients, message),) = handler.received
    assert recipients == ["demo@lab.example"]
    assert message["Bcc"] is None
    assert "\n" not in message["Subject"] and "Bcc: victim" in message["Subject"]
    assert not any(line.startswith("forged") for line in message.get_content().splitlines())


@pytest.mark.parametrize(
    "recipient",
    [
        "a@x.example,b@y.example",  # two recipients
        "a@x.example>\r\nRCPT TO:<b@y.example",  # an SMTP command
        "a b",
        "",
        "--cluster=/home/mallory/cluster.yaml",
        "a@@x.example",
        "a@x..example",
        ".a@x.example",
        "a..b@x.example",
        "a@x.example>",
        "a" * 65 + "@x.example",  # a local part longer than SMTP's 64
    ],
)
def test_a_recipient_that_is_not_one_address_is_refused_and_nothing_sent(relay, recipient):
    handler, settings = relay
    with pytest.raises(mail.MailError, match="not one mail address"):
        mail.compose(settings, SUBJECT, recipient, JOB)
    assert handler.received == []


def test_a_relay_that_refuses_is_not_asked_again(relay, monkeypatch):
    handler, settings = relay
    handler.answer = "550 no such user"
    asked = []
    monkeypatch.setattr(mail.time, "sleep", asked.append)
    with pytest.raises(mail.MailError, match="refused the message"):
        mail.send(settings, mail.compose(settings, SUBJECT, "demo", JOB))
    assert asked == []


def test_a_relay_that_cannot_be_reached_is_tried_again_then_named(monkeypatch):
    with socket.socket() as closed:  # bound, never listening: connections are refused
        closed.bind(("127.0.0.1", 0))
        settings = MailSettings(relay=f"127.0.0.1:{closed.getsockname()[1]}")
        waits: list[float] = []
        monkeypatch.setattr(mail.time, "sleep", waits.append)
        with pytest.raises(mail.MailError, match=f"relay {settings.relay} not reached after 3"):
            mail.send(settings, mail.compose(settings, SUBJECT, "demo@lab.example", JOB))
    assert waits == [mail.RETRY_SECONDS] * (mail.TRIES - 1)


def test_a_recipient_the_relay_refuses_is_not_asked_again(relay, monkeypatch):
    handler, settings = relay

    async def handle_RCPT(server: Any, session: Any, envelope: Any, address: str, options: Any):
        return "550 no such user"

    handler.handle_RCPT = handle_RCPT  # type: ignore[attr-defined]
    asked: list[float] = []
    monkeypatch.setattr(mail.time, "sleep", asked.append)
    with pytest.raises(mail.MailError, match=r"refused demo@lab\.example"):
        mail.send(settings, mail.compose(settings, SUBJECT, "demo", JOB))
    assert asked == []


def test_an_encoded_word_in_a_job_name_writes_no_header_or_body(relay):
    """A reader decodes =?utf-8?q?...?= in a subject, CR and LF included."""
    handler, settings = relay
    name = (
        " =?utf-8?q?x=0D=0AReply-To:_evil@attacker.example=0D=0AContent-Type:_text/html"
        "=0D=0A=0D=0A<h1>Reset</h1>?="
    )
    subject = f"Slurm Job_id=42 Name={name} Ended"
    mail.send(settings, mail.compose(settings, subject, "demo", JOB | {"SLURM_JOB_NAME": name}))
    ((_, _, message),) = handler.received
    assert message["Reply-To"] is None and message.get_content_type() == "text/plain"
    assert "\n" not in message["Subject"] and "<h1>" in message["Subject"]


@pytest.mark.parametrize("breaking", ["\u2028", "\u2029", "\x85", "\x0b", "\x00"])
def test_a_line_separator_of_any_kind_becomes_a_space(relay, breaking):
    handler, settings = relay
    name = f"x{breaking}Exit code: 0"
    subject = f"Slurm Job_id=42 Name={name} Failed"
    mail.send(settings, mail.compose(settings, subject, "demo", JOB | {"SLURM_JOB_NAME": name}))
    ((_, _, message),) = handler.received
    assert "Name: x Exit code: 0" in message.get_content().splitlines()


def test_bytes_that_are_not_utf8_are_replaced_not_a_crash(relay):
    handler, settings = relay
    latin1 = b"/home/demo/r\xe9sultats".decode("utf-8", "surrogateescape")  # as os.environ has it
    env = JOB | {"SLURM_JOB_WORK_DIR": latin1, "SLURM_JOB_NAME": "caf\xe9" + latin1}
    mail.send(settings, mail.compose(settings, f"Slurm Job_id=42 Name={latin1} Ended", "demo", env))
    ((_, _, message),) = handler.received
    assert "Directory: /home/demo/r\ufffdsultats" in message.get_content().splitlines()


def _spec_file(tmp_path: Path, demo_spec: dict[str, Any], **mail_values: str) -> Path:
    path = tmp_path / "cluster.yaml"
    path.write_text(yaml.safe_dump(demo_spec | ({"mail": mail_values} if mail_values else {})))
    return path


def test_the_command_reads_the_relay_from_cluster_yaml(relay, demo_spec, tmp_path, monkeypatch):
    handler, settings = relay
    cluster = _spec_file(tmp_path, demo_spec, relay=settings.relay, sender="hpc@lab.example")
    for key, value in JOB.items():
        monkeypatch.setenv(key, value)
    argv = ["mail", "--cluster", str(cluster), "--subject", SUBJECT, "--", "demo"]
    assert main(argv) == 0
    assert handler.received[0][:2] == ("hpc@lab.example", ["demo"])


def test_the_command_takes_the_recipient_as_a_recipient_never_as_an_option(
    relay, demo_spec, tmp_path, capsys
):
    handler, settings = relay
    cluster = _spec_file(tmp_path, demo_spec, relay=settings.relay, domain="lab.example")
    other = _spec_file(tmp_path / "..", demo_spec, relay="mallory.example", domain="m.example")
    recipient = f"--cluster={other}"
    assert main(["mail", "--cluster", str(cluster), "--subject", SUBJECT, "--", recipient]) == 1
    assert "not one mail address" in capsys.readouterr().err
    assert handler.received == []


def test_a_sender_without_a_domain_is_refused_with_a_relay(demo_spec):
    demo_spec["mail"] = {"relay": "smtp.lab.example"}  # sender: slurm, no domain
    with pytest.raises(ValueError, match=r"mail\.sender: 'slurm' needs a domain"):
        parse_spec(demo_spec)
    demo_spec["mail"]["sender"] = "hpc@lab.example"
    assert parse_spec(demo_spec).mail == MailSettings("smtp.lab.example", "hpc@lab.example")


def test_without_a_relay_the_command_says_so(demo_spec, tmp_path, capsys):
    cluster = _spec_file(tmp_path, demo_spec)
    assert main(["mail", "--cluster", str(cluster), "--subject", SUBJECT, "--", "demo"]) == 1
    assert "no mail relay (values mail.relay)" in capsys.readouterr().err


def _settings(demo_spec: dict[str, Any]) -> dict[str, str]:
    lines = render(parse_spec(demo_spec))["slurm.conf"].splitlines()
    return dict(line.split("=", 1) for line in lines if "=" in line and line[0].isupper())


def test_with_a_relay_slurmctld_runs_slonks_mailer_and_qualifies_user_names(demo_spec):
    demo_spec["mail"] = {"relay": "smtp.lab.example", "domain": "lab.example"}
    settings = _settings(demo_spec)
    assert settings["MailProg"] == "/usr/share/slonk/bin/mail"
    assert settings["MailDomain"] == "lab.example"
    assert "JobSubmitPlugins" not in settings


def test_without_a_relay_submission_tells_the_user_instead(demo_spec):
    demo_spec["mail"] = {"relay": ""}  # the same as no section
    settings = _settings(demo_spec)
    assert settings["MailProg"] == "/bin/true"
    assert settings["JobSubmitPlugins"] == "lua"
    assert "MailDomain" not in settings
    assert "slurm.log_user(NO_MAIL)" in render(parse_spec(demo_spec))["job_submit.lua"]


def test_a_sites_own_mailer_gets_no_message_of_slonks(demo_spec):
    demo_spec["slurmConf"] = {"MailProg": "/usr/local/bin/site-mailer"}
    settings = _settings(demo_spec)
    assert settings["MailProg"] == "/usr/local/bin/site-mailer"
    assert "JobSubmitPlugins" not in settings


def test_a_sites_job_submit_plugins_replace_slonks(demo_spec):
    demo_spec["slurmConf"] = {"JobSubmitPlugins": "require_timelimit"}
    assert _settings(demo_spec)["JobSubmitPlugins"] == "require_timelimit"


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("relay", "smtp.example:25\nx"),
        ("relay", "-oProxy:25"),
        ("sender", "a b@x"),
        ("domain", "X_Y"),
        # Huge: each would reach slurm.conf (MailDomain) or a header as it is.
        ("domain", "a" * 70_000),
        ("relay", "a" * 70_000),
        ("sender", "a" * 70_000 + "@x.example"),
        ("sender", "a@" + "b" * 64 + ".example"),
    ],
)
def test_bad_mail_values_are_refused_naming_the_key(demo_spec, key, value):
    demo_spec["mail"] = {"relay": "smtp.example", "domain": "example.org", key: value}
    with pytest.raises(ValueError, match=f"mail.{key}"):
        parse_spec(demo_spec)
