"""Operator tools: the command line, re-drive and its audit, resolve/resend, status, monitoring, plots, maintenance, the demo and cluster helpers."""
