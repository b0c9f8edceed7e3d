"""From the chart's rendered objects to what local mode runs: pods, their files and names."""

from __future__ import annotations

import base64
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from slonk.base import paths
from slonk.base.errors import SlonkError
from slonk.config import patterns

COMPONENT = "app.kubernetes.io/component"
POD_NAME_LABEL = "statefulset.kubernetes.io/pod-name"
RULE_KEYS = ("apiGroups", "resources", "verbs", "resourceNames")
# The extended resources local mode's device plugins serve (slonk.local.podinit): GPUs, a
# FAKE; FUSE, the machine's own /dev/fuse, as smarter-device-manager offers it.
FAKE_GPU_RESOURCE = "nvidia.com/gpu"
FUSE_RESOURCE = "smarter-devices/fuse"
# Resources every node has, which need no device plugin.
NODE_RESOURCES = ("cpu", "memory", "ephemeral-storage")
# The sysctls local mode sets for a pod (securityContext.sysctls): Kubernetes' safe ones that
# belong to the pod's network namespace, which the host runtime makes before the pod starts,
# and the unsafe one slurm.capTimeWait needs, as a kubelet told to allow it would.
NETWORK_SYSCTLS = (
    "net.ipv4.ip_local_port_range", "net.ipv4.ip_local_reserved_ports",
    "net.ipv4.ip_unprivileged_port_start", "net.ipv4.ping_group_range",
    "net.ipv4.tcp_syncookies", "net.ipv4.tcp_keepalive_time", "net.ipv4.tcp_fin_timeout",
    "net.ipv4.tcp_keepalive_intvl", "net.ipv4.tcp_keepalive_probes",
    "net.ipv4.tcp_max_tw_buckets",
)  # fmt: skip


class LocalModeError(SlonkError):
    """The rendered chart asks for something local mode cannot provide."""


@dataclass(frozen=True)
class Mount:
    """A volume as the pod sees it: `kind` is configmap, secret, claim or scratch."""

    kind: str
    name: str
    target: str
    read_only: bool = False


@dataclass(frozen=True)
class Sidecar:
    """A pod's further container; local mode runs a stand-in chosen by its image."""

    name: str
    image: str
    env: Mapping[str, str]
    mounts: tuple[Mount, ...]


@dataclass(frozen=True)
class Pod:
    name: str
    role: str
    labels: Mapping[str, str]
    command: tuple[str, ...]
    env: Mapping[str, str]
    mounts: tuple[Mount, ...]
    subdomain: str
    sidecars: tuple[Sidecar, ...] = ()
    service_account: str | None = None  # None: no token mounted (automountServiceAccountToken)
    image: str = ""
    # The container's securityContext: capabilities added and dropped, no_new_privs.
    capabilities: tuple[str, ...] = ()
    drop_capabilities: tuple[str, ...] = ()
    no_new_privileges: bool = False
    privileged: bool = False
    seccomp_profile: str = ""  # seccompProfile.type, the container's or else the pod's
    # What kubelet does as the pod is deleted: the container's lifecycle.preStop.exec command,
    # then SIGTERM; the pod's terminationGracePeriodSeconds bounds both (Kubernetes' default 30).
    pre_stop: tuple[str, ...] = ()
    grace_seconds: int = 30
    sysctls: Mapping[str, str] = field(default_factory=dict)  # NETWORK_SYSCTLS' names
    gpus: int = 0  # FAKE_GPU_RESOURCE in the container's limits: the fake device plugin's
    devices: tuple[str, ...] = ()  # the machine's device nodes handed over (/dev/fuse)


@dataclass
class Plan:
    """Everything `slonk local up` makes, from one rendering of the chart."""

    namespace: str
    pods: list[Pod] = field(default_factory=list)
    configmaps: dict[str, dict[str, bytes]] = field(default_factory=dict)
    secrets: dict[str, dict[str, bytes]] = field(default_factory=dict)
    services: dict[str, dict[str, str]] = field(default_factory=dict)
    roles: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # "Kind/name" -> rules
    # (service account, "Kind/name" of the role, the namespace it holds in; None: everywhere)
    bindings: list[tuple[str, str, str | None]] = field(default_factory=list)
    # The rendered StatefulSets and PodDisruptionBudgets, as the API serves them.
    statefulsets: list[dict[str, Any]] = field(default_factory=list)
    disruption_budgets: list[dict[str, Any]] = field(default_factory=list)
    # The rendered NetworkPolicies, which local mode's firewall enforces (slonk.local.firewall).
    network_policies: list[dict[str, Any]] = field(default_factory=list)

    def permissions(self) -> dict[str, list[dict[str, Any]]]:
        """What each ServiceAccount may do, from the Roles and bindings: its rules (apiGroups,
        resources, verbs, resourceNames as in a Role), each with the namespace it holds in
        (None: every namespace and the cluster-scoped resources, a ClusterRoleBinding's)."""
        granted: dict[str, list[dict[str, Any]]] = {}
        for account, role, namespace in self.bindings:
            for rule in self.roles.get(role, []):
                granted.setdefault(account, []).append({**rule, "namespace": namespace})
        return granted

    def pod(self, name: str) -> Pod:
        for pod in self.pods:
            if pod.name == name:
                return pod
        raise LocalModeError(f"no pod {name!r}: pods are {', '.join(p.name for p in self.pods)}")

    def service_pods(self, name: str) -> list[Pod]:
        selector = self.services[name]
        return [p for p in self.pods if all(p.labels.get(k) == v for k, v in selector.items())]


def _env(container: Mapping[str, Any], pod: str, namespace: str) -> dict[str, str]:
    fields = {"metadata.name": pod, "metadata.namespace": namespace}
    env = {}
    for var in container.get("env", []):
        if "value" in var:
            env[var["name"]] = str(var["value"])
        else:
            path = var["valueFrom"]["fieldRef"]["fieldPath"]
            if path not in fields:
                raise LocalModeError(f"env {var['name']}: local mode knows no field {path}")
            env[var["name"]] = fields[path]
    return env


def _mounts(sts: Mapping[str, Any], pod: str, container: Mapping[str, Any]) -> tuple[Mount, ...]:
    spec = sts["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in spec.get("volumes", [])}
    templates = {t["metadata"]["name"] for t in sts["spec"].get("volumeClaimTemplates", [])}
    mounts = []
    for m in container.get("volumeMounts", []):
        name, target, read_only = m["name"], m["mountPath"], bool(m.get("readOnly"))
        if name in templates:
            # The PVC a StatefulSet makes for this replica: <template>-<pod>.
            mounts.append(Mount("claim", f"{name}-{pod}", target, read_only))
            continue
        volume = volumes[name]
        if "configMap" in volume:
            mounts.append(Mount("configmap", volume["configMap"]["name"], target, True))
        elif "secret" in volume:
            mounts.append(Mount("secret", volume["secret"]["secretName"], target, True))
        elif "persistentVolumeClaim" in volume:
            claim = volume["persistentVolumeClaim"]["claimName"]
            mounts.append(Mount("claim", claim, target, read_only))
        elif "emptyDir" in volume:
            mounts.append(Mount("scratch", name, target, read_only))
        else:
            kind = next(k for k in volume if k != "name")
            raise LocalModeError(
                f"pod {pod}: volume {name!r} is {kind}, which local mode cannot mount; "
                "use a persistentVolumeClaim (local mode keeps it in the state directory)"
            )
    return tuple(mounts)


def _decode(data: Mapping[str, str] | None) -> dict[str, bytes]:
    return {k: base64.b64decode(v) for k, v in (data or {}).items()}


def plan(documents: Iterable[Mapping[str, Any]], namespace: str) -> Plan:
    result = Plan(namespace=namespace)
    for doc in documents:
        kind, meta = doc["kind"], doc["metadata"]
        if kind == "ConfigMap":
            result.configmaps[meta["name"]] = {k: v.encode() for k, v in doc["data"].items()}
        elif kind == "Secret":
            result.secrets[meta["name"]] = _decode(doc.get("data"))
        elif kind == "Service":
            result.services[meta["name"]] = dict(doc["spec"].get("selector", {}))
        elif kind in ("Role", "ClusterRole"):
            result.roles[f"{kind}/{meta['name']}"] = [
                {key: list(rule.get(key) or []) for key in RULE_KEYS}
                for rule in doc.get("rules") or []
            ]
        elif kind in ("RoleBinding", "ClusterRoleBinding"):
            role = f"{doc['roleRef']['kind']}/{doc['roleRef']['name']}"
            # A RoleBinding holds in its own namespace (the chart's Node events one: default).
            scope = meta.get("namespace", namespace) if kind == "RoleBinding" else None
            result.bindings += [
                (s["name"], role, scope)
                for s in doc.get("subjects", [])
                if s["kind"] == "ServiceAccount" and s.get("namespace", namespace) == namespace
            ]
        elif kind == "NetworkPolicy":
            result.network_policies.append(dict(doc))
        elif kind == "PodDisruptionBudget":
            result.disruption_budgets.append(dict(doc))
        elif kind == "StatefulSet":
            result.statefulsets.append(dict(doc))
            template = doc["spec"]["template"]
            pod_spec = template["spec"]
            account = pod_spec.get("serviceAccountName", "default")
            container, *others = template["spec"]["containers"]
            security = container.get("securityContext", {})
            limits = _limits(meta["name"], container)
            for ordinal in range(int(doc["spec"]["replicas"])):
                name = f"{meta['name']}-{ordinal}"
                labels = {**template["metadata"]["labels"], POD_NAME_LABEL: name}
                result.pods.append(
                    Pod(
                        name=name,
                        role=labels[COMPONENT],
                        labels=labels,
                        command=tuple(container["command"]),
                        env=_env(container, name, namespace),
                        mounts=_mounts(doc, name, container),
                        subdomain=doc["spec"]["serviceName"],
                        sidecars=tuple(
                            Sidecar(
                                c["name"],
                                _image(meta["name"], c),
                                _env(c, name, namespace),
                                _mounts(doc, name, c),
                            )
                            for c in others
                        ),
                        service_account=(
                            account if pod_spec.get("automountServiceAccountToken", True) else None
                        ),
                        image=_image(meta["name"], container),
                        capabilities=tuple(security.get("capabilities", {}).get("add", [])),
                        drop_capabilities=tuple(security.get("capabilities", {}).get("drop", [])),
                        no_new_privileges=security.get("allowPrivilegeEscalation") is False,
                        privileged=security.get("privileged") is True,
                        seccomp_profile=_seccomp_profile(pod_spec, security),
                        pre_stop=_pre_stop(meta["name"], container),
                        grace_seconds=int(pod_spec.get("terminationGracePeriodSeconds", 30)),
                        sysctls=_sysctls(meta["name"], pod_spec),
                        gpus=_gpus(limits),
                        devices=_devices(limits),
                    )
                )
    return result


def _seccomp_profile(pod_spec: Mapping[str, Any], security: Mapping[str, Any]) -> str:
    """seccompProfile.type: the container's, else the pod's ("": none, Unconfined)."""
    profile = security.get("seccompProfile") or pod_spec.get("securityContext", {}).get(
        "seccompProfile"
    )
    return str((profile or {}).get("type", ""))


def _pre_stop(statefulset: str, container: Mapping[str, Any]) -> tuple[str, ...]:
    hook = container.get("lifecycle", {}).get("preStop")
    if not hook:
        return ()
    if "exec" not in hook:
        raise LocalModeError(
            f"StatefulSet {statefulset}, container {container.get('name')!a}: local mode runs "
            f"only exec preStop hooks, not {', '.join(hook)}"
        )
    return tuple(str(arg) for arg in hook["exec"]["command"])


def _sysctls(statefulset: str, pod_spec: Mapping[str, Any]) -> dict[str, str]:
    """The pod's sysctls by their dotted names; one local mode does not set stops the plan,
    named (a kubelet refuses a sysctl it does not allow, and the pod never starts)."""
    found = {}
    for sysctl in pod_spec.get("securityContext", {}).get("sysctls") or []:
        name = str(sysctl["name"]).replace("/", ".")
        if name not in NETWORK_SYSCTLS:
            raise LocalModeError(
                f"StatefulSet {statefulset}: local mode sets only the pod network's safe "
                f"sysctls ({', '.join(NETWORK_SYSCTLS)}), not {name!a}"
            )
        found[name] = str(sysctl["value"])
    return found


def _limits(statefulset: str, container: Mapping[str, Any]) -> Mapping[str, Any]:
    """The container's limits; an extended resource no device plugin of local mode serves
    stops the plan, named (a device plugin the machine lacks would leave the pod Pending)."""
    limits = (container.get("resources") or {}).get("limits") or {}
    served = (*NODE_RESOURCES, FAKE_GPU_RESOURCE, FUSE_RESOURCE)
    for name in limits:
        if name not in served and not name.startswith("hugepages-"):
            raise LocalModeError(
                f"StatefulSet {statefulset}: local mode has no device plugin for {name!a}; it "
                f"serves {FAKE_GPU_RESOURCE} (workers.gpuResource, a fake) and "
                f"{FUSE_RESOURCE} (workers.fuseResource) only"
            )
    return limits


def _gpus(limits: Mapping[str, Any]) -> int:
    """The fake GPUs the container asks for."""
    return int(limits.get(FAKE_GPU_RESOURCE, 0))


def _devices(limits: Mapping[str, Any]) -> tuple[str, ...]:
    """The machine's device nodes the container asks for: /dev/fuse for FUSE_RESOURCE (the
    machine's is looked for as the pod starts: slonk.local.podspec)."""
    return (str(paths.FUSE_DEVICE),) if int(limits.get(FUSE_RESOURCE, 0)) > 0 else ()


def _image(statefulset: str, container: Mapping[str, Any]) -> str:
    """The container's image, refused unless a plain reference: podman's command line would
    read one starting with `-` as an option."""
    image = container["image"]
    if not isinstance(image, str) or not patterns.matches(patterns.IMAGE, image):
        raise LocalModeError(
            f"StatefulSet {statefulset}, container {container.get('name')!a}: "
            f"image {image!a} is not an image reference"
        )
    return image


def hosts_file(plan: Plan, addresses: Mapping[str, str], cluster_domain: str) -> str:
    """What cluster DNS would answer: every single-pod Service and every pod's own name."""
    names: dict[str, list[str]] = {pod: [] for pod in addresses}
    suffix = f"{plan.namespace}.svc.{cluster_domain}"
    for pod in plan.pods:
        names[pod.name] += [pod.name, f"{pod.name}.{pod.subdomain}.{suffix}"]
    for service in plan.services:
        matched = plan.service_pods(service)
        if len(matched) == 1 and service != matched[0].name:
            names[matched[0].name] += [service, f"{service}.{suffix}"]
        elif len(matched) == 1:
            names[service].append(f"{service}.{suffix}")
    lines = ["127.0.0.1\tlocalhost", "::1\tlocalhost ip6-localhost ip6-loopback"]
    lines += [f"{addresses[pod]}\t{' '.join(dict.fromkeys(n))}" for pod, n in names.items()]
    return "\n".join(lines) + "\n"
