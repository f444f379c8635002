"""The agent's assembly: the Agent and its lifecycle (systemd, the collector's settling)."""
