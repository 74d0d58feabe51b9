"""Agents on Temporal's framework integrations whose tools are leased (scripted test models, no API key)."""
