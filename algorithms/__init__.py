"""Offline MARL algorithms, one file each, behind the protocol in base.py."""
