"""slurm.conf's MailProg with a relay (values mail): one message per call, handed to the
site's SMTP relay.

slurmctld runs it as SlurmUser, as `mail -s SUBJECT RECIPIENT`, with the job in SLURM_JOB_*
variables, and logs its output when it exits non-zero. The subject carries the job's name and
the recipient is --mail-user, both a user's to choose: the recipient must be one address, and
control characters in the subject become spaces, so that no user writes a header or an SMTP
command of their own."""

from __future__ import annotations

import email.policy
import smtplib
import time
from collections.abc import Mapping
from email.message import EmailMessage
from email.utils import formatdate, make_msgid

from slonk.base.errors import SlonkError
from slonk.config.model import MailSettings
from slonk.config.patterns import CONTROL_CHARACTERS, MAIL_ADDRESS, matches

SMTP_PORT = 25
SMTP_TIMEOUT_SECONDS = 20
# A relay that restarts is back within seconds; slurmctld waits for its MailProg (in a thread
# of its own), so the tries stay well under a minute.
TRIES, RETRY_SECONDS = 3, 5.0
SUBJECT_MAX = 900  # well inside SMTP's 998-character line, whatever the job's name
# Headers on one line up to SMTP's limit: folded at 78, Slurm's subject splits after
# "Subject:" and some readers show it with a leading space.
ONE_LINE_HEADERS = email.policy.SMTP.clone(max_line_length=998)

# The job as slurmctld describes it to MailProg (those it sets for this message), in order.
JOB_FIELDS = (
    ("Job", "SLURM_JOB_ID"),
    ("Name", "SLURM_JOB_NAME"),
    ("User", "SLURM_JOB_USER"),
    ("Account", "SLURM_JOB_ACCOUNT"),
    ("Partition", "SLURM_JOB_PARTITION"),
    ("Nodes", "SLURM_JOB_NODELIST"),
    ("Event", "SLURM_JOB_MAIL_TYPE"),
    ("State", "SLURM_JOB_STATE"),
    ("Queued", "SLURM_JOB_QUEUED_TIME"),
    ("Run time", "SLURM_JOB_RUN_TIME"),
    ("Exit code", "SLURM_JOB_EXIT_CODE_MAX"),
    ("Signal", "SLURM_JOB_TERM_SIGNAL_MAX"),
    ("Directory", "SLURM_JOB_WORK_DIR"),
    ("Output", "SLURM_JOB_STDOUT"),
    ("Errors", "SLURM_JOB_STDERR"),
)


class MailError(SlonkError):
    """A message not sent; the text is what slurmctld logs."""


def _one_line(text: str, limit: int) -> str:
    return CONTROL_CHARACTERS.sub(" ", text)[:limit]


def compose(
    mail: MailSettings, subject: str, recipient: str, env: Mapping[str, str]
) -> EmailMessage:
    """The message: Slurm's subject, the job's fields in the body."""
    if not matches(MAIL_ADDRESS, recipient):
        raise MailError(f"refused recipient {recipient[:200]!r}: not one mail address")
    message = EmailMessage(policy=ONE_LINE_HEADERS)
    message["From"] = mail.address(mail.sender)
    message["To"] = mail.address(recipient)
    message["Subject"] = _one_line(subject, SUBJECT_MAX)
    message["Date"] = formatdate(localtime=False)
    message["Message-ID"] = make_msgid(domain=mail.domain or None)
    # Nobody should answer or auto-reply to a machine's notice.
    message["Auto-Submitted"] = "auto-generated"
    lines = [f"{label}: {_one_line(env[key], 4096)}" for label, key in JOB_FIELDS if env.get(key)]
    message.set_content("\n".join(lines or [message["Subject"]]) + "\n")
    return message


def relay_address(relay: str) -> tuple[str, int]:
    host, _, port = relay.partition(":")
    return host, int(port) if port else SMTP_PORT


def send(mail: MailSettings, message: EmailMessage) -> None:
    """Hand the message to the relay, trying again while it cannot be reached."""
    host, port = relay_address(mail.relay)
    last: Exception | None = None
    for attempt in range(TRIES):
        if attempt:
            time.sleep(RETRY_SECONDS)
        try:
            with smtplib.SMTP(host, port, timeout=SMTP_TIMEOUT_SECONDS) as smtp:
                smtp.send_message(message)
            return
        except smtplib.SMTPResponseException as err:
            if 500 <= err.smtp_code < 600:  # refused for good: trying again changes nothing
                raise MailError(f"relay {mail.relay} refused the message: {err}") from err
            last = err
        except (OSError, smtplib.SMTPException) as err:  # unreachable, timed out, hung up
            last = err
    raise MailError(f"relay {mail.relay} not reached after {TRIES} tries: {last}")
