"""Local mode's FAKE Kubernetes API server, in parts (slonk.local.fake_apiserver runs it).

No Kubernetes runs on a local machine; this stand-in serves the API's real wire shapes to
the official Python client and to real `kubectl`, so that what talks to Kubernetes is tested
as it will run. It is a fake: one process, objects in memory, no admission, no schema beyond
what is checked here. Each part has one job:
  resources    the kinds it serves and their discovery documents
  store        objects, the global resourceVersion, the watch history
  selectors    label and field selectors
  patches      merge, strategic merge and JSON patches
  rbac         the chart's Roles and bindings as an authorizer
  tables       `kubectl get`'s columns (meta.k8s.io/v1 Table)
  objects      a local cluster's Pods, Nodes, StatefulSets and PDBs as API objects
  controllers  what Kubernetes does on its own: kubelet's status, StatefulSets, evictions
  routes       the URL layout: a resource URL as a Target, discovery documents
  verbs        the verbs answering with one object, with the API server's rules of writing
  deletion     DeleteOptions, honoured or refused
  paging       lists in pages (limit, continue)
  metadata     label and annotation syntax
  events       Events kept once, served by both Event APIs
  http         the HTTP side: authentication, RBAC, lists and watches, Status errors
"""
