"""Node health: the checks, drains and undrains (the pods of drained nodes are recycled by the
controller's recycle loop, slonk.align.recycle), every node's durable history (history), and
what a user leaves on a node, which goes with their last job there (leftovers,
user_processes)."""
