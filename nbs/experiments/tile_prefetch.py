# Prefetch hints in the int8 kernels (issue 65, item 3): `results/tile_prefetch.json`, one entry per target file; 06f_packed
# renders it. Not part of the package. In one process, on the machine at hand, the kernels' hints on (`set_tile_ahead(8)`,
# the default) and off (0) take turns call by call:
# - products: one product of each tile layout the packed target holds (its first layer's, and the output layer), at 1, 2,
#   3, 4, 8 and 16 rows; each weight copied until the copies pass 600 MB, read in turn, so that each call reads its
#   weights from memory as a decoding step does (the L3 cache holds 260 MB here), hints on and off on different copies;
#   medians;
# - the forward: the packed target's whole forward (`static_forward` on a static cache after a 128-token prefix) of 1, 2,
#   3, 5, 9 and 17 rows, medians of 60 calls each way.
#     python nbs/experiments/tile_prefetch.py [MODEL.gguf ...]      # default: the embedded target's own GGUF
import sys, json, time, statistics
from pathlib import Path
ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
import torch
from dyspec_nb import _linear
from dyspec_nb.models import load_pair, smollm2_gguf
from dyspec_nb.packed import PackedLinear, tiled_linear
from dyspec_nb.static import StaticCache, static_forward
from dyspec_nb.forward import additive_mask
torch.set_grad_enabled(False)
OUT = ROOT / 'results' / 'tile_prefetch.json'
ROWS, FORWARD_ROWS, ON = (1, 2, 3, 4, 8, 16), (1, 2, 3, 5, 9, 17), 8

def both(run, rounds):
    "Medians (seconds) of `run(on)` with the hints on and off, taking turns `rounds` times each: {'on': ..., 'off': ...}."
    ts = {True: [], False: []}
    for i in range(rounds):
        for on in ((True, False) if i % 2 else (False, True)):
            _linear.set_tile_ahead(ON if on else 0)
            t = time.perf_counter(); run(on, i); ts[on].append(time.perf_counter() - t)
    _linear.set_tile_ahead(ON)
    return {'on': statistics.median(ts[True]), 'off': statistics.median(ts[False])}

def products(model):
    "{name: {format, layout bytes, MB, rows: {n: {'on', 'off'} ms}}} for one product of each tile layout."
    mods, seen = {}, set()
    for name, m in [(n, m) for n, m in model.model.layers[0].named_modules() if isinstance(m, PackedLinear)] + [('lm_head', model.lm_head)]:
        if isinstance(m, PackedLinear) and m.tiles is not None and (m.tiles.shape[-1] not in seen or name == 'lm_head'):
            seen.add(m.tiles.shape[-1]); mods[name] = m
    out = {}
    for name, m in mods.items():
        copies = [m.tiles.clone() for _ in range(max(2, int(600e6 // m.tiles.numel())))]
        rec = dict(format=m.fmt, tile_bytes=m.tiles.shape[-1], mb=m.tiles.numel() / 1e6, shape=[m.out_features, m.in_features], rows={})
        for n in ROWS:
            x = torch.randn(n, m.in_features)
            run = lambda on, i: tiled_linear(x, copies[(i + on * len(copies) // 2) % len(copies)])   # on and off read different copies
            run(True, 0)
            rec['rows'][n] = {k: 1e3 * v for k, v in both(run, 4 * len(copies)).items()}
        out[name] = rec
        print(name, m.fmt, ' '.join(f"{n}: {r['off']:.3f}->{r['on']:.3f}" for n, r in rec['rows'].items()), flush=True)
    return out

def forward(model, prefix=128):
    "{rows: {'on', 'off'} ms}: the packed target's forward of n rows after `prefix` cached tokens."
    cache = StaticCache(model, 1024, buckets=(1,), graphs=False)
    static_forward(model, cache, dict(ids=torch.randint(1000, (prefix,)), pos=torch.arange(prefix), slots=torch.arange(prefix),
                                      mask=additive_mask(torch.ones(prefix, prefix, dtype=torch.bool).tril(), model.dtype)))
    out = {}
    for n in FORWARD_ROWS:
        cols = torch.arange(prefix + n)
        allowed = (cols < prefix)[None].expand(n, len(cols)).clone(); allowed[:, prefix:] = torch.ones(n, n, dtype=torch.bool).tril()
        buf = dict(ids=torch.randint(1000, (n,)), pos=prefix + torch.arange(n), slots=prefix + torch.arange(n), mask=additive_mask(allowed, model.dtype))
        run = lambda on, i: static_forward(model, cache, buf)
        run(True, 0)
        out[n] = {k: 1e3 * v for k, v in both(run, 60).items()}
        print('forward', n, f"{out[n]['off']:.2f}->{out[n]['on']:.2f} ms", flush=True)
    return out

if __name__ == '__main__':
    files = sys.argv[1:] or [str(smollm2_gguf())]
    whole = json.loads(OUT.read_text()) if OUT.exists() else {}
    for f in files:
        target = load_pair(f, need_draft=False, weights='packed')[0]
        rec = dict(command='python nbs/experiments/tile_prefetch.py ' + ' '.join(sys.argv[1:]), date=time.strftime('%Y-%m-%d'), target=Path(f).name,
                   threads=torch.get_num_threads(), torch=torch.__version__, blocks_ahead=ON, products=products(target), forward=forward(target))
        whole[Path(f).name] = rec
        OUT.write_text(json.dumps(whole, indent=1) + '\n')
