"""``orchard_env.client.process``: Orchard's module path of the terminal processes."""

from .. import AsyncContainerProcess, ContainerProcess

__all__ = ["ContainerProcess", "AsyncContainerProcess"]
