"""The init layer's pieces: identity, secrets, s6 services, and applying config changes."""

from __future__ import annotations

import os
import stat

import pytest

from slonk import init
from slonk.base import paths
from slonk.config.spec import ClusterSpec, parse_spec
from slonk.init import InitError, check_identity
from slonk.pod import restapi, services
from slonk.pod.secrets import (
    MissingSecret,
    install_jwt_key,
    install_munge_key,
    install_ssh_host_keys,
)


def test_identity(demo_spec):
    spec = parse_spec(demo_spec)
    with pytest.raises(InitError, match=r"role slurmdbd needs accounting in cluster\.yaml"):
        check_identity(spec, "slurmdbd", "slonk-slurmdbd-0")
    check_identity(spec, "controller", "slonk-controller-0")
    check_identity(spec, "worker", "slonk-gpu-3")
    with pytest.raises(InitError, match=r"pod 'slonk-gpu-4' is not a node of cluster\.yaml"):
        check_identity(spec, "worker", "slonk-gpu-4")
    with pytest.raises(InitError, match=r"cluster\.yaml names slonk-controller-0$"):
        check_identity(spec, "controller", "other-controller-0")
    with pytest.raises(InitError, match=r"cluster\.yaml names slonk-controller-0$"):
        check_identity(spec, "controller", "slonk-controller-1")
    backed = parse_spec({**demo_spec, "backupController": {}})
    check_identity(backed, "controller", "slonk-controller-1")
    with pytest.raises(InitError, match=r"names slonk-controller-0 and slonk-controller-1$"):
        check_identity(backed, "controller", "slonk-controller-2")


def test_each_role_runs_its_own_steps_in_order(demo_spec):
    """init's table of steps, read per role without running them: every role ends by
    writing its s6 services; Slurm's roles register users; only workers prepare jobs'
    cgroups and install job programs; slurmdbd waits for its database."""
    spec = parse_spec(demo_spec)

    def steps(role: str, name: str) -> list[str]:
        return [step.what for step in init.steps_for(init.Pod(spec, role, name))]

    assert steps("slurmdbd", "slonk-slurmdbd-0") == [
        "installed the munge key",
        "prepared state directories",
        "prepared slurmdbd",
        "waited for the database",
        "wrote s6 services",
    ]
    controller = steps("controller", "slonk-controller-0")
    assert controller[:2] == ["checked slurmctld's state", "prepared the Slurm configuration"]
    worker, login = steps("worker", "slonk-gpu-3"), steps("login", "slonk-login-0")
    assert worker == [
        "prepared the Slurm configuration",
        "installed the munge key",
        "prepared sshd",
        "prepared state directories",
        "prepared the cgroup tree for jobs",
        "ordered mount namespace ids for jobs' own /tmp",
        "looked at /proc",
        "registered users",
        "offered the site's modulefiles",
        "looked at /dev/fuse",
        "installed job programs",
        "wrote s6 services",
    ]
    assert "prepared the cgroup tree for jobs" in worker and "installed job programs" in worker
    assert "installed job programs" not in {*controller, *login}
    assert "ran boot health checks" not in worker  # this spec has no health checks
    assert "offered the site's modulefiles" in login and "looked at /proc" in login
    assert "offered the site's modulefiles" not in controller
    assert all("registered users" in found for found in (controller, worker, login))
    for found in (controller, worker, login, steps("ldap", "slonk-ldap-0")):
        assert found[-1] == "wrote s6 services", found


def test_the_rest_api_s_steps_and_the_key_its_verifiers_install(demo_spec, monkeypatch, tmp_path):
    """The REST pod writes its own slurm.conf and holds no key; slurmctld and slurmdbd get
    the JWT key only while the API is on."""
    spec = parse_spec(demo_spec)
    with_api = parse_spec({**demo_spec, "restapi": {"port": 6820}})

    def steps(spec: ClusterSpec, role: str, name: str) -> list[str]:
        return [step.what for step in init.steps_for(init.Pod(spec, role, name))]

    assert steps(with_api, "restapi", "slonk-restapi-0") == [
        "prepared slurmrestd",
        "wrote s6 services",
    ]
    assert "installed the JWT key" in steps(with_api, "controller", "slonk-controller-0")
    assert "installed the JWT key" not in steps(spec, "controller", "slonk-controller-0")
    with pytest.raises(InitError, match="no restapi"):
        check_identity(spec, "restapi", "slonk-restapi-0")
    conf = tmp_path / "slurmrestd" / "slurm.conf"
    monkeypatch.setattr(paths, "SLURMRESTD_CONF", conf)
    monkeypatch.setenv("SLURM_CONF_SERVER", "elsewhere:6817")
    assert restapi.prepare(with_api).endswith("port 6820, openapi/slurmctld")
    assert os.environ["SLURM_CONF"] == str(conf) and "SLURM_CONF_SERVER" not in os.environ
    assert os.environ["SLONK_RESTAPI_LISTEN"] == ":6820"
    assert "AuthAltTypes=auth/jwt" in conf.read_text().splitlines()


def test_jwt_key_is_installed_for_slurm_only(tmp_path):
    source, target = tmp_path / "secret" / "jwt_hs256.key", tmp_path / "etc" / "jwt_hs256.key"
    with pytest.raises(MissingSecret, match="no JWT key; mount the Secret <release>-jwt"):
        install_jwt_key(source, target)
    source.parent.mkdir()
    source.write_bytes(os.urandom(31))
    with pytest.raises(MissingSecret, match="JWT key is 31 bytes, auth/jwt needs at least 32"):
        install_jwt_key(source, target)
    source.write_bytes(os.urandom(32))
    try:
        install_jwt_key(source, target)
    except KeyError:
        pytest.skip("no slurm user here")
    assert stat.S_IMODE(target.stat().st_mode) == 0o400
    assert target.read_bytes() == source.read_bytes()


def test_munge_key_is_installed_for_munge_only(tmp_path):
    source = tmp_path / "secret" / "munge.key"
    with pytest.raises(MissingSecret, match="no munge key; mount the Secret <release>-munge"):
        install_munge_key(source, tmp_path / "etc" / "munge.key")
    source.parent.mkdir()
    source.write_bytes(b"short")
    with pytest.raises(MissingSecret, match="munge key is 5 bytes"):
        install_munge_key(source, tmp_path / "etc" / "munge.key")
    source.write_bytes(os.urandom(1024))
    target = tmp_path / "etc" / "munge.key"
    try:
        install_munge_key(source, target)
    except KeyError:
        pytest.skip("no munge user here: run scripts/setup")
    info = target.stat()
    assert stat.S_IMODE(info.st_mode) == 0o400
    assert target.read_bytes() == source.read_bytes()
    import pwd

    assert info.st_uid == pwd.getpwnam("munge").pw_uid


def test_ssh_host_keys_replace_the_images(tmp_path):
    secret, etc = tmp_path / "secret", tmp_path / "ssh"
    secret.mkdir()
    etc.mkdir()
    (etc / "ssh_host_rsa_key").write_text("image key")
    with pytest.raises(MissingSecret, match="no ssh_host_\\*_key files"):
        install_ssh_host_keys(secret, etc)
    (secret / "ssh_host_ecdsa_key").write_text("from the secret")
    assert install_ssh_host_keys(secret, etc) == ["ssh_host_ecdsa_key"]
    assert sorted(p.name for p in etc.iterdir()) == ["ssh_host_ecdsa_key"]
    assert stat.S_IMODE((etc / "ssh_host_ecdsa_key").stat().st_mode) == 0o600


@pytest.mark.parametrize("role", sorted(services.ROLE_SERVICES))
def test_scan_dir_has_the_roles_services(tmp_path, role):
    share = paths.rootfs_dir() / "usr/share/slonk"
    services.write_scan_dir(role, share=share, scan_dir=tmp_path / "scan")
    names = sorted(p.name for p in (tmp_path / "scan").iterdir())
    assert names == sorted([".s6-svscan", *services.ROLE_SERVICES[role]])
    for service in services.ROLE_SERVICES[role]:
        assert os.access(tmp_path / "scan" / service / "run", os.X_OK)
    assert os.access(tmp_path / "scan" / ".s6-svscan" / "SIGTERM", os.X_OK)


@pytest.mark.parametrize("role", ["controller", "worker", "login"])
def test_only_the_controller_has_slurm_files(tmp_path, monkeypatch, demo_spec, role):
    """Configless: slurmctld alone reads the rendered files; everything else, services and
    ssh sessions included (they inherit s6-svscan's environment), asks slurmctld."""
    from slonk import init
    from slonk.config.render import render

    client_conf = tmp_path / "etc-slurm" / "slurm.conf"
    client_conf.parent.mkdir()
    client_conf.write_text("ClusterName=stale\n")
    monkeypatch.setattr(paths, "CLIENT_SLURM_CONF", client_conf)
    monkeypatch.setattr(paths, "SLURMCTLD_CONF_DIR", tmp_path / "slurmctld")
    monkeypatch.setattr(paths, "ROLLOUT_RECORD", tmp_path / "record.json")
    monkeypatch.setattr(init.Slurmctld, "version", lambda self: "slurm-wlm 22.05.8")
    monkeypatch.delenv("SLURM_CONF_SERVER", raising=False)
    spec = parse_spec(demo_spec)
    said = init.prepare_slurm_config(spec, role)
    assert os.environ["SLURM_CONF_SERVER"] == "slonk-controller.hpc.svc.cluster.local:6817"
    assert not client_conf.exists()
    written = sorted(p.name for p in (tmp_path / "slurmctld").glob("*"))
    if role == "controller":
        assert written == sorted(render(spec))
        assert said.startswith("wrote ")
    else:
        assert written == []
        assert (
            said == "slurmd and clients fetch it from slurmctld at "
            "slonk-controller.hpc.svc.cluster.local:6817"
        )


def test_the_sites_modulefiles_are_offered_once(tmp_path, monkeypatch):
    """On the search path once, whatever the file's comments say of it."""
    from slonk import init

    listed = tmp_path / "modulespath"
    listed.write_text("# slonk init adds /home/modulefiles\n/usr/share/modules/modulefiles\n")
    monkeypatch.setattr(paths, "MODULES_PATH", listed)
    monkeypatch.setattr(init.homes, "shared_dir", lambda name: None)
    assert init.offer_shared_modulefiles() == "/home/modulefiles"
    init.offer_shared_modulefiles()
    assert listed.read_text().splitlines()[1:] == [
        "/usr/share/modules/modulefiles",
        "/home/modulefiles",
    ]
    monkeypatch.setattr(init.homes, "shared_dir", lambda name: "/home/modulefiles is uid 5's")
    assert init.offer_shared_modulefiles() == "none: /home/modulefiles is uid 5's"


@pytest.mark.parametrize(
    ("status", "said"),
    [
        (0, "other users' processes hidden (/proc hidepid=invisible)"),
        (32, "other users' processes stay visible: /proc cannot be remounted (mount: denied)"),
    ],
)
def test_users_processes_are_hidden_where_proc_can_be_remounted(
    tmp_path, monkeypatch, status, said
):
    """A pod without CAP_SYS_ADMIN (login pods on Kubernetes) or whose runtime profile
    refuses the mount goes on, saying so; the remount asks for hidepid=invisible."""
    mount = tmp_path / "mount"
    mount.write_text(
        f'#!/bin/sh\necho "$@" > {tmp_path}/args\necho "mount: denied" >&2\nexit {status}\n'
    )
    mount.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    assert init.hide_other_users_processes() == said
    assert (tmp_path / "args").read_text().split() == ["-o", "remount,hidepid=invisible", "/proc"]


def test_job_programs_are_replaced_by_a_rename(demo_spec, tmp_path, monkeypatch):
    """slurmd may start a Prolog, Epilog or HealthCheckProgram at any moment: a change of
    cluster.yaml puts a new file in place, so a start finds the old program or the new,
    never one half written (nor a write refused while one starts: ETXTBSY)."""
    from slonk.pod import job_programs

    monkeypatch.setattr(paths, "HOOK_BIN", tmp_path)
    spec = parse_spec(demo_spec)
    job_programs.install_job_programs(spec)
    epilog = tmp_path / "epilog"  # the demo's one program (no health checks)
    with epilog.open() as running:  # as a start that began before the change holds it
        before = os.fstat(running.fileno()).st_ino
        job_programs.install_job_programs(spec)
        assert running.read().startswith("#!/bin/sh\n")
    assert epilog.stat().st_ino != before
    assert stat.S_IMODE(epilog.stat().st_mode) == 0o755
    assert [p.name for p in tmp_path.iterdir()] == ["epilog"]  # no temporary file left
