"""Leader election through a coordination.k8s.io/v1 Lease, as client-go's leaderelection does
it: a candidate takes the Lease when nobody holds it or its holder has not renewed it for
`duration` seconds of the candidate's own clock (clocks of two machines are never compared);
the leader renews every `retry` seconds and stops acting once it could not renew for `renew`
seconds, before any other candidate may take over (`renew` < `duration`).

Our own, on the plain CoordinationV1Api: the controller image's Kubernetes client (Debian's
python3-kubernetes 30) has no LeaseLock, and this one is small. Every write carries the
resourceVersion it read, so two candidates racing get one 409 and one Lease."""

from __future__ import annotations

import datetime
import json
import threading
import time
from collections.abc import Callable
from typing import Any

from slonk.kube.api import KubeError


def _now() -> str:
    """MicroTime, as the API stores renewTime and acquireTime."""
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class Elector:
    def __init__(
        self,
        api: Any,  # kubernetes.client.CoordinationV1Api
        name: str,
        namespace: str,
        identity: str,
        duration: float = 15,
        renew: float = 10,
        retry: float = 2,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not retry < renew < duration:
            raise ValueError("a Lease needs retry < renew < duration")
        self.api, self.name, self.namespace, self.identity = api, name, namespace, identity
        self.duration, self.renew, self.retry, self.clock = duration, renew, retry, clock
        # A hung request must not outlast a renewal's slack: lost is noticed before another
        # candidate may take the Lease (renew + timeout + retry < duration by default).
        self.timeout = renew / 4
        self._seen: tuple[str, str] | None = None  # (holder, renewTime) last read
        self._seen_at = 0.0

    def _read(self) -> dict[str, Any] | None:
        from kubernetes.client.exceptions import ApiException

        try:
            response = self.api.read_namespaced_lease(
                self.name, self.namespace, _preload_content=False, _request_timeout=self.timeout
            )
        except ApiException as err:
            if err.status == 404:
                return None
            raise KubeError(f"read Lease {self.name}: {err.status} {err.reason}") from err
        lease: dict[str, Any] = json.loads(response.data)
        return lease

    def try_acquire_or_renew(self) -> bool:
        """One attempt; True while this candidate holds the Lease."""
        from kubernetes.client.exceptions import ApiException

        lease = self._read()
        now = _now()
        mine = {
            "holderIdentity": self.identity,
            "leaseDurationSeconds": int(self.duration),
            "renewTime": now,
        }
        try:
            if lease is None:
                body = {
                    "apiVersion": "coordination.k8s.io/v1",
                    "kind": "Lease",
                    "metadata": {"name": self.name, "namespace": self.namespace},
                    "spec": {**mine, "acquireTime": now, "leaseTransitions": 0},
                }
                self.api.create_namespaced_lease(
                    self.namespace, body, _request_timeout=self.timeout
                )
                return True
            spec = lease.get("spec") or {}
            holder = spec.get("holderIdentity") or ""
            seen = (holder, str(spec.get("renewTime")))
            if seen != self._seen:
                self._seen, self._seen_at = seen, self.clock()
            if holder != self.identity:
                if holder and self.clock() - self._seen_at < self.duration:
                    return False  # held, and renewed within the duration as far as we know
                mine |= {
                    "acquireTime": now,
                    "leaseTransitions": int(spec.get("leaseTransitions") or 0) + 1,
                }
            lease["spec"] = {**spec, **mine}
            self.api.replace_namespaced_lease(
                self.name, self.namespace, lease, _request_timeout=self.timeout
            )
            return True
        except ApiException as err:
            if err.status in (409, 422):  # another candidate wrote first
                return False
            raise KubeError(f"write Lease {self.name}: {err.status} {err.reason}") from err

    def _attempt(self) -> bool:
        try:
            return self.try_acquire_or_renew()
        except Exception:  # the API refused, timed out or was not there: not renewed
            return False

    def run(self, work: Callable[[], None], lost: Callable[[], None]) -> None:
        """Wait for the Lease, run `work` in a thread while renewing it, and call `lost` (which
        should not return: exit) once it could not be renewed for `renew` seconds or `work`
        ended."""
        while not self._attempt():
            time.sleep(self.retry)
        done = threading.Event()

        def working() -> None:
            try:
                work()
            finally:
                done.set()

        threading.Thread(target=working, name="leader", daemon=True).start()
        renewed = self.clock()
        while not done.wait(self.retry):
            if self._attempt():
                renewed = self.clock()
            elif self.clock() - renewed >= self.renew:
                break
        lost()
