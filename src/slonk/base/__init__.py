"""The vocabulary every layer speaks: errors a person reads, where things are, replacing files
whole, who this pod is, and anyone's text on one line. Imports nothing of slonk's above it."""
