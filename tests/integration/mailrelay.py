"""A real SMTP relay (aiosmtpd) on a local cluster's network, delivering to a Maildir the test
reads: the site's relay of values mail.relay. It listens on the bridge's address, which the
pods reach as they reach any address outside the cluster.

    python -m tests.integration.mailrelay NETNS ADDRESS:PORT MAILDIR
        (prints `ready` once it listens)
"""

from __future__ import annotations

import mailbox
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from email.message import Message
from pathlib import Path

from aiosmtpd.controller import Controller
from aiosmtpd.handlers import Mailbox

from slonk.local.network import NETNS_DIR, Network, enter_network

from ..support.cluster import MAIL_RELAY


@contextmanager
def running(state_dir: Path, maildir: Path) -> Iterator[mailbox.Maildir]:
    """The relay on the cluster of `state_dir`, until the block ends; the Maildir it fills."""
    netns = Network.for_state_dir(state_dir).switch
    argv = [sys.executable, "-m", __name__, netns, MAIL_RELAY, str(maildir)]
    relay = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, cwd=Path(__file__).parents[2])
    try:
        assert relay.stdout is not None
        if relay.stdout.readline().strip() != "ready":
            raise RuntimeError(f"the mail relay did not start (exit {relay.wait()})")
        yield mailbox.Maildir(maildir, create=False)
    finally:
        relay.terminate()
        relay.wait(timeout=30)


def messages(box: mailbox.Maildir) -> list[Message]:
    return list(box)


def main() -> None:
    netns, relay, maildir = sys.argv[1:]
    host, port = relay.rsplit(":", 1)
    enter_network(NETNS_DIR / netns)
    server = Controller(Mailbox(maildir), hostname=host, port=int(port))
    server.start()
    print("ready", flush=True)
    signal.sigwait({signal.SIGTERM, signal.SIGINT})
    server.stop()


if __name__ == "__main__":
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT})
    main()
