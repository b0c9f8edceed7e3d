"""`slonk local`: the chart's pods on one Linux machine, in namespaces. Not a Kubernetes."""
