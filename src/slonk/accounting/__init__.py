"""Slurm accounting: slurmdbd's configuration, the chart's MariaDB, and the associations
every user slonk writes gets (slonk.accounting.associations)."""
