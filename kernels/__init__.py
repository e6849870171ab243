"Triton kernels of dyspec_nb, installed as `dyspec_nb.kernels` (see `nbs/api/3-forward/12_tree_attention.ipynb`)."
