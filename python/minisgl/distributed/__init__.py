from .info import DistributedInfo
from .comm import DistributedCommunicator

__all__ = ["DistributedCommunicator", "DistributedInfo"]
