__version__ = "0.0.1"

import os as _os
# The Triton kernels (kernels/, nbs/12_tree_attention.ipynb) run under Triton's interpreter when there is no CUDA device.
# Triton reads TRITON_INTERPRET when triton.language is first imported, and transformers imports it, so the choice is
# made here, when the package is imported, before any of its modules imports transformers. An explicit setting wins.
if 'TRITON_INTERPRET' not in _os.environ:
    import torch as _torch
    if not _torch.cuda.is_available(): _os.environ['TRITON_INTERPRET'] = '1'

# What a user needs, importable from the package itself: loaded on first use, so that `import dyspec_nb` (and the
# command line's argument checks) stay cheap.
_EXPORTS = dict(SpecDecoder='engine', load_default_pair='models', load_pair='models', chat_ids='models', BUILDERS='builders',
                TokenTree='tree', build_head='head_recipe', build_shipped_head='head_recipe')

def __getattr__(name):
    if name in _EXPORTS:
        import importlib
        return getattr(importlib.import_module(f'.{_EXPORTS[name]}', __name__), name)
    raise AttributeError(f"module 'dyspec_nb' has no attribute {name!r}")

def __dir__(): return sorted(set(globals()) | set(_EXPORTS))
