"""Offline MARL algorithms, one file each, behind the contract in base.py (`Algorithm`)."""
