"Triton kernels of dyspec_nb, installed as `dyspec_nb.kernels` (see `nbs/12_tree_attention.ipynb`)."
