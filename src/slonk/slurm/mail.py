"""slurm.conf's MailProg with a relay (values mail): one message per call, handed to the
site's SMTP relay.

slurmctld runs it as SlurmUser, as `mail -s SUBJECT RECIPIENT`, with the job in SLURM_JOB_*
variables, and logs its output when it exits non-zero. The subject carries the job's name and
the recipient is --mail-user, both a user's to choose: the recipient must be one address (it is
the envelope's only one, given as it is), and every text from Slurm becomes one line of
printable text (no control or line-separating character, no encoded word a reader would
decode into one), so that no user writes a header, a line of the body or an SMTP command."""

from __future__ import annotations

import email.policy
import re
import smtplib
import socket
import time
from collections.abc import Mapping
from email.message import EmailMessage
from email.utils import formatdate, make_msgid

from slonk.base.errors import SlonkError
from slonk.config.model import MailSettings
from slonk.config.patterns import MAIL_ADDRESS, matches

SMTP_PORT = 25
SMTP_TIMEOUT_SECONDS = 10  # each socket operation
# slurmctld kills a MailProg after 120 s (MAIL_PROG_TIMEOUT), saying nothing of why: tries
# start within DEADLINE_SECONDS (a relay that restarts is back within it), and `slonk mail`
# gives up with a message of its own at GIVE_UP_SECONDS.
DEADLINE_SECONDS = 60
GIVE_UP_SECONDS = 100
TRIES, RETRY_SECONDS = 3, 5.0
SUBJECT_MAX = 900  # well inside SMTP's 998-character line, whatever the job's name
# Headers on one line up to SMTP's limit (folded at 78, Slurm's subject splits after
# "Subject:" and some readers show it with a leading space); a body that is not ASCII goes
# quoted-printable, for relays without 8BITMIME.
POLICY = email.policy.SMTP.clone(max_line_length=998, cte_type="7bit")
# C0 and C1 controls, DEL and Unicode's line and paragraph separators: each ends a line for
# some reader of a header or a body.
LINE_BREAKING = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")
# An RFC 2047 encoded word (=?charset?q?...?=) is decoded by mail readers, CR and LF included.
ENCODED_WORD = "=?"

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


def one_line(text: str, limit: int) -> str:
    """`text` as one line of printable text: bytes that were not UTF-8 (the environment keeps
    them as surrogates) replaced, line-breaking characters made spaces, no encoded word."""
    text = text.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
    return LINE_BREAKING.sub(" ", text).replace(ENCODED_WORD, "= ?")[:limit]


def compose(
    mail: MailSettings, subject: str, recipient: str, env: Mapping[str, str]
) -> EmailMessage:
    """The message: Slurm's subject, the job's fields in the body."""
    if not matches(MAIL_ADDRESS, recipient):
        raise MailError(f"refused recipient {recipient[:200]!r}: not one mail address")
    subject = one_line(subject, SUBJECT_MAX)
    message = EmailMessage(policy=POLICY)
    message["From"] = mail.address(mail.sender)
    message["To"] = mail.address(recipient)
    message["Subject"] = subject
    message["Date"] = formatdate(usegmt=True)
    message["Message-ID"] = make_msgid(domain=mail.domain or None)
    # Nobody should answer or auto-reply to a machine's notice.
    message["Auto-Submitted"] = "auto-generated"
    lines = [f"{label}: {one_line(env[key], 4096)}" for label, key in JOB_FIELDS if env.get(key)]
    message.set_content("\n".join(lines or [subject]) + "\n")
    return message


def relay_address(relay: str) -> tuple[str, int]:
    host, _, port = relay.partition(":")
    return host, int(port) if port else SMTP_PORT


def send(mail: MailSettings, message: EmailMessage) -> None:
    """Hand the message to the relay, from the sender to the one recipient, trying again
    while it cannot be reached or answers that it cannot take it now (4xx)."""
    host, port = relay_address(mail.relay)
    sender, recipient = (_one_address(message, header) for header in ("From", "To"))
    deadline = time.monotonic() + DEADLINE_SECONDS
    last: Exception | None = None
    tried = 0
    for attempt in range(TRIES):
        if attempt:
            time.sleep(RETRY_SECONDS)
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            break
        tried += 1
        try:
            _deliver(host, port, min(SMTP_TIMEOUT_SECONDS, remaining), message, sender, recipient)
            return
        except smtplib.SMTPRecipientsRefused as err:
            codes = [code for code, _ in err.recipients.values()]
            if all(code >= 500 for code in codes):
                raise MailError(
                    f"relay {mail.relay} refused {recipient}: {err.recipients}"
                ) from err
            last = err
        except smtplib.SMTPResponseException as err:
            if err.smtp_code >= 500:  # refused for good: trying again changes nothing
                raise MailError(f"relay {mail.relay} refused the message: {err}") from err
            last = err
        except (OSError, smtplib.SMTPException) as err:  # unreachable, timed out, hung up
            last = err
    raise MailError(f"relay {mail.relay} not reached after {tried} tries: {last}")


def _one_address(message: EmailMessage, header: str) -> str:
    """The header's address, as the envelope gives it: compose wrote exactly one."""
    addresses = message[header].addresses
    if len(addresses) != 1 or not addresses[0].addr_spec:
        raise MailError(f"{header}: {message[header]!r} is not one address")
    return str(addresses[0].addr_spec)


def _deliver(
    host: str, port: int, timeout: float, message: EmailMessage, sender: str, recipient: str
) -> None:
    smtp = smtplib.SMTP(host, port, local_hostname=socket.getfqdn(), timeout=timeout)
    try:
        smtp.send_message(message, from_addr=sender, to_addrs=[recipient])
    finally:
        # The relay has the message once DATA is answered: a bad answer to QUIT must not
        # send it again or count as a refusal.
        try:
            smtp.quit()
        except (OSError, smtplib.SMTPException):
            smtp.close()
