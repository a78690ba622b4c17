from .comm import DistributedCommunicator, init_distributed
from .info import DistributedInfo

__all__ = ["DistributedCommunicator", "DistributedInfo", "init_distributed"]
