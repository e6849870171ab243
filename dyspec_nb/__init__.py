__version__ = "0.0.1"

import os as _os, sys as _sys
# The Triton kernels (kernels/, nbs/api/3-forward/12_tree_attention.ipynb) run under Triton's interpreter when there is no CUDA device.
# Triton reads TRITON_INTERPRET when triton.language is first imported (transformers imports it too), so the choice has to
# be made before anything imports Triton. It is made then, the first time anything looks for Triton, and not when the
# package is imported: `import dyspec_nb` does not import torch, so that the command line checks its arguments at once.
# An explicit setting wins.
class _TritonInterpreter:
    "A meta path finder that decides TRITON_INTERPRET the first time `triton` is looked for, then leaves."
    def find_spec(self, name, path=None, target=None):
        if name == 'triton' or name.startswith('triton.'):
            if self in _sys.meta_path: _sys.meta_path.remove(self)
            if 'TRITON_INTERPRET' not in _os.environ:
                import torch                                  # torch itself does not import Triton
                if not torch.cuda.is_available(): _os.environ['TRITON_INTERPRET'] = '1'
        return None

if 'TRITON_INTERPRET' not in _os.environ and 'triton' not in _sys.modules: _sys.meta_path.insert(0, _TritonInterpreter())

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

def _test_setup(cells):
    """`nbdev-test`'s `test_setup` hook (pyproject.toml), run once before the notebooks run. When several notebooks are
    tested, nbdev runs them in parallel workers (one per core, at most 8), and each worker gets its share of the cores for
    torch's threads. Without it every worker starts a thread per core, and the workers' spinning threads contend for
    the same cores. It is set before any worker imports torch; an explicit OMP_NUM_THREADS wins, and one notebook tested alone (in nbdev's own process, as the slow cells' measurements are) keeps every core."""
    idx = [c.idx_ for c in cells]                     # the cells of every notebook in turn: each notebook starts again
    if sum(b <= a for a, b in zip(idx, idx[1:])) == 0: return                   # one notebook with cells: nbdev's process
    cores = _os.cpu_count() or 1
    _os.environ.setdefault('OMP_NUM_THREADS', str(max(1, cores // min(cores, 8))))
