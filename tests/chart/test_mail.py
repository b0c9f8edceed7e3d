"""Mail (values mail): with a relay, cluster.yaml carries it for slurmctld's MailProg; without
one, no mail section, and a value Helm's schema refuses never renders."""

from __future__ import annotations

import pytest
import yaml

from slonk.config.model import MailSettings

from .test_scratch import _spec
from .test_security import _docs
from .test_validity import _template_error


def test_no_relay_no_mail_by_default():
    assert _spec(_docs()).mail is None


def test_a_relay_reaches_cluster_yaml_with_its_sender_and_domain():
    values = {"relay": "smtp.lab.example:587", "sender": "hpc", "domain": "lab.example"}
    assert _spec(_docs({"mail": values})).mail == MailSettings(**values)


def test_a_sender_and_domain_without_a_relay_are_no_mail():
    assert _spec(_docs({"mail": {"sender": "hpc", "domain": "lab.example"}})).mail is None


@pytest.mark.parametrize(
    "mail",
    [
        {"relay": "smtp.example:25 -x"},
        {"relay": "smtp.example", "sender": "a b@x.example", "domain": "x.example"},
        {"relay": "smtp.example", "sender": "a..b@x.example"},
        {"relay": "smtp.example", "domain": "Lab_Example"},
        {"relay": "smtp.example", "domain": "a" * 300},
        {"relay": "smtp.example", "password": "secret"},  # no such key: refused, not ignored
        {"relay": "smtp.example"},  # the sender `slurm` with no domain: relays refuse it
    ],
)
def test_bad_values_are_refused_by_the_schema(tmp_path, mail):
    values = tmp_path / "values.yaml"
    values.write_text(yaml.safe_dump({"mail": mail}))
    assert "mail" in _template_error("-f", str(values))
