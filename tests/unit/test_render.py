"""The renderer: golden files for a readable demo cluster, and each knob on its own."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from slonk.cli import main
from slonk.config import placement
from slonk.config.render import CONFIG_FILES, max_job_count, render
from slonk.config.spec import parse_spec

GOLDEN = Path(__file__).parent / "golden"


@pytest.mark.parametrize("name", CONFIG_FILES)
def test_demo_cluster_matches_golden(demo_spec, name):
    text = render(parse_spec(demo_spec))[name]
    golden = GOLDEN / name
    if os.environ.get("SLONK_UPDATE_GOLDEN"):
        golden.write_text(text)
    assert text == golden.read_text()


def _conf(demo_spec, name="slurm.conf") -> list[str]:
    return render(parse_spec(demo_spec))[name].splitlines()


def test_overrides_replace_and_drop_defaults(demo_spec):
    demo_spec["slurmConf"] = {
        "SelectTypeParameters": "CR_Core",
        "MpiDefault": None,
        "DefMemPerCPU": 2048,
    }
    lines = _conf(demo_spec)
    assert "SelectTypeParameters=CR_Core" in lines
    assert "DefMemPerCPU=2048" in lines
    assert not any(line.startswith("MpiDefault=") for line in lines)


def _partition(lines: list[str], name: str) -> str:
    return next(line for line in lines if line.startswith(f"PartitionName={name} "))


def test_memory_is_scheduled_with_a_default_per_cpu_every_node_can_give(demo_spec):
    """A job without --mem gets its partition's DefMemPerCPU: the smallest of its pools'
    memory per CPU, so that a whole node's CPUs fit the memory of any of them."""
    demo_spec["nodepools"]["cpu"].update(cpus=4, memoryMiB=8192)  # 2048 per CPU
    demo_spec["nodepools"]["gpu"].update(cpus=64, memoryMiB=512000)  # 8000 per CPU
    lines = _conf(demo_spec)
    assert "SelectTypeParameters=CR_Core_Memory" in lines
    assert "DefMemPerCPU=2048" in _partition(lines, "main").split()  # cpu and gpu
    assert "DefMemPerCPU=8000" in _partition(lines, "gpu").split()


@pytest.mark.parametrize("option", ["DefMemPerCPU", "defmempernode", "DefMemPerGPU"])
def test_a_partitions_own_memory_default_replaces_slonks(demo_spec, option):
    demo_spec["partitions"]["gpu"]["options"] = {option: 4096}
    line = _partition(_conf(demo_spec), "gpu").split()
    assert f"{option}=4096" in line
    assert not [part for part in line if part.startswith("DefMemPerCPU=8000")]


def test_without_cgroups_the_sampler_kills_what_outgrows_its_memory(demo_spec):
    demo_spec["confinement"] = "none"
    lines = _conf(demo_spec)
    assert "JobAcctGatherType=jobacct_gather/linux" in lines
    assert "JobAcctGatherParams=OverMemoryKill" in lines


def test_mpi_programs_need_no_mpi_option(demo_spec):
    assert "MpiDefault=pmix" in _conf(demo_spec)


def test_fair_share_weights_come_from_the_spec(demo_spec):
    demo_spec["priority"] = {"weights": {"fairshare": 50000, "qos": 7}, "decayHalfLife": "14-0"}
    lines = _conf(demo_spec)
    assert "PriorityType=priority/multifactor" in lines
    assert "PriorityWeightFairshare=50000" in lines
    assert "PriorityWeightQOS=7" in lines
    assert "PriorityWeightAge=1000" in lines  # a weight not given keeps its default
    assert "PriorityDecayHalfLife=14-0" in lines
    demo_spec["slurmConf"] = {"PriorityWeightAge": 5}  # slurmConf still has the last word
    assert "PriorityWeightAge=5" in _conf(demo_spec)


def test_accounting_goes_to_slurmdbd_and_needs_an_association(demo_spec):
    assert not any(line.startswith("Accounting") for line in _conf(demo_spec))
    demo_spec["accounting"] = {
        "host": "slonk-slurmdbd.default.svc.cluster.local",
        "database": {"host": "db.example.org"},
    }
    lines = _conf(demo_spec)
    assert "AccountingStorageType=accounting_storage/slurmdbd" in lines
    assert "AccountingStorageHost=slonk-slurmdbd.default.svc.cluster.local" in lines
    assert "AccountingStoragePort=6819" in lines
    # limits: the QOS's per-user limit on submitted jobs holds (slonk.accounting.associations).
    assert "AccountingStorageEnforce=associations,limits" in lines
    assert "AccountingStorageTRES=gres/gpu" in lines  # the demo has GPU pools


def test_the_job_table_size_is_slurms_default_or_slurmconfs(demo_spec):
    assert max_job_count(parse_spec(demo_spec)) == 10000
    demo_spec["slurmConf"] = {"maxjobcount": 50000}
    assert max_job_count(parse_spec(demo_spec)) == 50000


def test_an_override_in_another_case_replaces_the_default(demo_spec):
    demo_spec["slurmConf"] = {"selecttypeparameters": "CR_Core_Memory"}
    lines = render(parse_spec(demo_spec))["slurm.conf"].lower().splitlines()
    assert [line for line in lines if line.startswith("selecttypeparameters=")] == [
        "selecttypeparameters=cr_core_memory"
    ]


@pytest.mark.parametrize(
    ("override", "rendered"),
    [
        ("idle_on_node_suspend", "idle_on_node_suspend,enable_configless"),
        (None, "enable_configless"),
        ("enable_configless,reboot_from_controller", "enable_configless,reboot_from_controller"),
    ],
)
def test_slurmctld_serves_the_configuration_whatever_slurm_conf_says(demo_spec, override, rendered):
    """slurmd and clients fetch the configuration from slurmctld (configless)."""
    demo_spec["slurmConf"] = {"SlurmctldParameters": override}
    lines = _conf(demo_spec)
    assert [line for line in lines if line.startswith("SlurmctldParameters=")] == [
        f"SlurmctldParameters={rendered}"
    ]


def test_no_confinement_uses_plugins_that_need_no_cgroups(demo_spec):
    demo_spec["confinement"] = "none"
    lines = _conf(demo_spec)
    assert "ProctrackType=proctrack/linuxproc" in lines
    assert "TaskPlugin=task/none" in lines
    # Slurm 24.11's slurmd would refuse to start without a cgroup filesystem otherwise.
    assert _conf(demo_spec, "cgroup.conf")[1:] == ["CgroupPlugin=disabled"]


def test_empty_pool_is_left_out(demo_spec):
    demo_spec["nodepools"]["gpu"]["replicas"] = 0
    lines = _conf(demo_spec)
    assert not any("slonk-gpu" in line for line in lines)
    assert "PartitionName=gpu Default=NO" in " ".join(lines)
    assert _conf(demo_spec, "gres.conf") == ["# gres.conf for cluster demo: rendered by slonk."]


def test_block_topology(demo_spec):
    demo_spec["topology"] = "block"
    assert "TopologyPlugin=topology/block" in _conf(demo_spec)
    assert _conf(demo_spec, "topology.conf")[1:] == [
        "BlockName=b1 Nodes=slonk-cpu-[0-1]",
        "BlockName=b2 Nodes=slonk-gpu-[0-3]",
    ]


def test_unplaced_pools_get_a_leaf_each_under_one_spine(demo_spec):
    for pool in demo_spec["nodepools"].values():
        pool.pop("topology")
    assert _conf(demo_spec, "topology.conf")[1:] == [
        "SwitchName=cpu Nodes=slonk-cpu-[0-1]",
        "SwitchName=gpu Nodes=slonk-gpu-[0-3]",
        "SwitchName=slonk-spine Switches=cpu,gpu",
    ]


def test_pools_sharing_a_switch_share_a_leaf(demo_spec):
    demo_spec["nodepools"]["gpu"]["topology"]["switch"] = "leaf1"
    assert _conf(demo_spec, "topology.conf")[1:] == [
        "SwitchName=leaf1 Nodes=slonk-cpu-[0-1],slonk-gpu-[0-3]",
    ]


def test_placement_from_node_labels_overrides_the_pools_own(demo_spec, tmp_path):
    """Where the syncer found pods (slonk.config.placement) wins; nodes it did not place keep
    their pool's block; a label value that is no Slurm name is dropped, never rendered."""
    demo_spec["topology"] = "block"
    saved = tmp_path / "placement.json"
    placement.save(
        {
            "slonk-gpu-0": {"block": "nvl1"},
            "slonk-gpu-1": {"block": "nvl1", "rack": "r1"},
            "slonk-gpu-2": {"block": "x Nodes=slonk-cpu-0\nBlockName=evil"},
            "slonk-cpu-0": {"switch": "leaf9"},
        },
        saved,
    )
    files = render(parse_spec(demo_spec), placement.load(saved))
    assert files["topology.conf"].splitlines()[1:] == [
        "BlockName=b1 Nodes=slonk-cpu-[0-1]",
        "BlockName=b2 Nodes=slonk-gpu-[2-3]",
        "BlockName=nvl1 Nodes=slonk-gpu-[0-1]",
    ]
    assert placement.load(tmp_path / "none.json") == {}
    saved.write_text("[1, 2]")
    assert placement.load(saved) == {}


def test_no_topology(demo_spec):
    demo_spec["topology"] = "none"
    assert not any(line.startswith("TopologyPlugin") for line in _conf(demo_spec))


def test_untyped_gpus(demo_spec):
    demo_spec["nodepools"]["gpu"]["gpus"] = {"count": 2}
    assert "Gres=gpu:2" in " ".join(_conf(demo_spec))
    gres = "NodeName=slonk-gpu-[0-3] Name=gpu File=/dev/nvidia[0-1]"
    assert _conf(demo_spec, "gres.conf")[1] == gres


def test_render_config_command(tmp_path, demo_spec, capsys):
    import yaml

    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(yaml.safe_dump(demo_spec))
    assert main(["render-config", "--cluster", str(cluster), "--out", str(tmp_path / "etc")]) == 0
    assert sorted(p.name for p in (tmp_path / "etc").iterdir()) == sorted(CONFIG_FILES)
    demo_spec["partitions"]["main"]["pools"] = ["tpu"]
    cluster.write_text(yaml.safe_dump(demo_spec))
    assert main(["render-config", "--cluster", str(cluster), "--out", str(tmp_path / "x")]) == 1
    assert "partitions.main.pools[0]: unknown nodepool 'tpu'" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


def test_cgroup_confinement_is_cgroup_v2_managed_by_slurmd_not_systemd(demo_spec):
    demo_spec["confinement"] = "cgroup"
    cgroup = _conf(demo_spec, "cgroup.conf")
    assert {"CgroupPlugin=cgroup/v2", "IgnoreSystemd=yes", "ConstrainRAMSpace=yes"} <= set(cgroup)
