from .comm import DistributedCommunicator, init_distributed, set_rank_threads
from .info import DistributedInfo

__all__ = ["DistributedCommunicator", "DistributedInfo", "init_distributed", "set_rank_threads"]
