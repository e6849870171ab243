__version__ = "0.0.1"

import os as _os
# The Triton kernels (kernels/, nbs/12_tree_attention.ipynb) run under Triton's interpreter when there is no CUDA device.
# Triton reads TRITON_INTERPRET when triton.language is first imported, and transformers imports it, so the choice is
# made here, when the package is imported, before any of its modules imports transformers. An explicit setting wins.
if 'TRITON_INTERPRET' not in _os.environ:
    import torch as _torch
    if not _torch.cuda.is_available(): _os.environ['TRITON_INTERPRET'] = '1'
