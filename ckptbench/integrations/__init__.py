"""Adapters that put ckptbench's engine under other frameworks' checkpoint APIs.

``ckptbench.integrations.dcp``: a ``torch.distributed.checkpoint`` StorageWriter/StorageReader pair.
Nothing is imported here, so ``import ckptbench.integrations`` costs nothing; torch is imported only
by the submodule that needs it.
"""
