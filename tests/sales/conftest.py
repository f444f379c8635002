"""The sale domain's tests run on the same real agent and simulator as the assembly's."""

from tests.assembly.conftest import agent, agent_factory

__all__ = ["agent", "agent_factory"]
