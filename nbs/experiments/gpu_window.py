# The engine's step on a GPU in one window (issue 51): `results/device_step_gpu.json`. Not part of the package; 22_gpu
# renders its record. On a CUDA machine, from the project root, with the embedded pair's packages importable (22_gpu says
# how they travel to a machine that reaches nothing, and `dyspec_nb._native` built there):
#     python nbs/experiments/gpu_window.py            # BUDGET_S=400 bounds it; OUT=dir writes the record there instead
# Each section is timed, runs only if the time left allows, and rewrites the record as it ends, so a run cut short keeps
# what it measured. DRY=1 runs it in miniature (12 tokens, one prompt) on the CPU, to check it before a window opens.
import os, sys, time, json, traceback, copy, warnings, tempfile
from pathlib import Path
ROOT = Path(__file__).resolve().parents[2]; sys.path.insert(0, str(ROOT))   # the project root: dyspec_nb
T0 = time.time()
OUT = Path(os.environ.get('OUT') or (tempfile.gettempdir() if os.environ.get('DRY') == '1' else ROOT / 'results')); OUT.mkdir(parents=True, exist_ok=True)
BUDGET, DRY = float(os.environ.get('BUDGET_S', 480)), os.environ.get('DRY') == '1'
import numpy as np, torch
CUDA = torch.cuda.is_available()
DEV = 'cuda' if CUDA else 'cpu'
NEW, NP = (12, 1) if DRY else (128, 2)
rec = dict(command='python nbs/experiments/gpu_window.py', date=time.strftime('%Y-%m-%d'), started=time.strftime('%Y-%m-%d %H:%M:%S'), dry=DRY, new_tokens=NEW, sections={})
S = {}                                                      # shared state between sections

def save(): (OUT / ('gpu_window_dry.json' if DRY else 'device_step_gpu.json')).write_text(json.dumps(rec, indent=1, default=str))
def left(): return BUDGET - (time.time() - T0)
def section(name, need):
    "Run f now, if `need` seconds are left: its result, or its traceback, into the record."
    def deco(f):
        if left() < need:
            rec['sections'][name] = dict(skipped=f'{left():.0f} s left, needs {need}'); save(); print('SKIP', name, flush=True); return f
        t = time.time(); print(f'== {name} ({left():.0f} s left)', flush=True)
        try: rec['sections'][name] = dict(ok=True, result=f())
        except Exception: rec['sections'][name] = dict(ok=False, error=traceback.format_exc()); traceback.print_exc()
        rec['sections'][name]['seconds'] = round(time.time() - t, 1); save(); print(f'   {name}: {time.time() - t:.0f} s', flush=True)
        return f
    return deco

def sync():
    if CUDA: torch.cuda.synchronize()

def synced(f):
    sync(); t = time.perf_counter(); r = f(); sync(); return r, time.perf_counter() - t

def count_syncs(f):
    "`(f(), the synchronising CUDA calls it made)` by torch.cuda.set_sync_debug_mode('warn')."
    if not CUDA: return f(), None
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter('always')
        torch.cuda.set_sync_debug_mode('warn')
        try: r = f()
        finally: torch.cuda.set_sync_debug_mode(0)
    return r, sum('synchroniz' in str(x.message) for x in w)

@section('env', 0)
def _():
    import transformers, platform
    from dyspec_nb.native import native_available
    from dyspec_nb.small_linear import small_linear_available
    return dict(torch=torch.__version__, transformers=transformers.__version__, python=platform.python_version(),
                device=torch.cuda.get_device_name() if CUDA else platform.processor(), native=native_available(), small_linear=small_linear_available())

@section('grouped attention', 10)
def _():
    "SDPA with enable_gqa=True and a mask against grouped_attention (the lean forward's), the target's shapes: ms per call, largest difference."
    from dyspec_nb.forward import grouped_attention, fold_mask
    res = {}
    for dt in (torch.float32, torch.bfloat16):
        for q in (1, 9, 33):
            g = torch.Generator(device=DEV).manual_seed(0)
            Q = torch.randn(1, 9, q, 64, device=DEV, dtype=dt, generator=g)
            K, V = (torch.randn(1, 3, 1024, 64, device=DEV, dtype=dt, generator=g) for _ in range(2))
            mask = torch.where(torch.rand(1, 1, q, 1024, device=DEV, generator=g) < 0.5, 0.0, float('-inf')).to(dt); mask[..., 0] = 0
            fm = fold_mask(mask, 3)
            calls = dict(enable_gqa=lambda: torch.nn.functional.scaled_dot_product_attention(Q, K, V, attn_mask=mask, enable_gqa=True),
                         folded=lambda: grouped_attention(Q, K, V, fm))
            out = {}
            for name, f in calls.items():
                for _ in range(3): f()
                sync(); t = time.perf_counter()
                for _ in range(50 if DRY else 200): r = f()
                sync(); out[name] = (1e3 * (time.perf_counter() - t) / (50 if DRY else 200), r)
            res[f'{str(dt)[6:]} q={q}'] = dict(enable_gqa_ms=out['enable_gqa'][0], folded_ms=out['folded'][0],
                                               max_abs_diff=float((out['enable_gqa'][1].float() - out['folded'][1].float()).abs().max()))
    return res

from dyspec_nb.models import load_default_pair, hf_generate
from dyspec_nb.data import mtbench_prompts
from dyspec_nb.engine import SpecDecoder
from dyspec_nb.step import TreeStep, STEP_METHODS
from dyspec_nb.builders import draw_mode

def load(dt):
    t = time.time()
    target, head, tok = load_default_pair('head', device=DEV, dtype=dt)
    token = load_default_pair('token', device=DEV, dtype=dt)[1]
    S[dt] = dict(target=target, head=head, token=token, prompts=mtbench_prompts(tok, NP))
    return dict(seconds=time.time() - t, prompt_lengths=[int(p.shape[1]) for p in S[dt]['prompts']])

@section('load float32', 60)
def _(): return load('float32')

def device_decode(ds, prompt, n, **kw):
    ds.start(prompt); out = []
    while len(out) < n:
        o = ds.step(**kw).tolist(); out += o[3:3 + o[0]]
    return out[:n]

@section('correct float32', 60)
def _():
    s = S['float32']; target, head = s['target'], s['head']
    refs = [hf_generate(target, p, NEW)[0] for p in s['prompts']]; s['refs'] = refs
    res = {}
    for method, b, draft in (('dyspec', 8, 'head'), ('chain', 4, 'head'), ('eagle2', 16, 'head'), ('dyspec', 8, 'token'), ('sequoia', 8, 'token')):
        dec = SpecDecoder(target, s[draft], method, budget=b)                  # the head, and the token draft (07e)
        name = f'{method} b{b}' + (', token draft' if draft == 'token' else '')
        t = time.time(); outs = [dec.generate(p, max_new_tokens=NEW) for p in s['prompts']]
        res[f'{name}: identical to target.generate'] = [o.tokens.tolist() == r for o, r in zip(outs, refs)]
        res[f'{name}: first calls, s (capture included)'] = time.time() - t
    p = s['prompts'][0]
    for label, dec in (('device dyspec b8', SpecDecoder(target, head, 'dyspec', budget=8)),
                       ('device autoregressive', SpecDecoder(target, None, 'autoregressive'))):
        dec.plan.read_late = False                                              # the read that synchronises, counted as before (a late read waits on an event)
        dec.generate(p, max_new_tokens=NEW)                                     # warm: graphs captured
        (a, na), (b_, nb) = count_syncs(lambda: dec.generate(p, max_new_tokens=NEW)), count_syncs(lambda: dec.generate(p, max_new_tokens=16))
        if na is not None: res[f'{label}: syncs per step'] = dict(long=[na, a.stats.steps], short=[nb, b_.stats.steps], per_step=(na - nb) / max(1, a.stats.steps - b_.stats.steps))
    ds = SpecDecoder(target, head, 'dyspec', budget=8).stepper(int(p.shape[1]) + NEW + 9)
    g = torch.Generator(device=DEV).manual_seed(0)
    ds.start(p[0].tolist()); ds.step(generator=g)                               # captured
    n_sync = []
    for _ in range(10):
        o, c = count_syncs(lambda: ds.step(generator=g)); o.tolist(); n_sync.append(c)
    res['device step: syncs inside step() over 10 steps'] = n_sync
    for method in STEP_METHODS:                                               # every builder's captured step, greedy and at T = 1
        for T in (0.0, 1.0):
            ds = TreeStep(target, head, method, budget=8, capacity=512); ds.start(p[0].tolist()); ds.step(temperature=T, generator=g)
            res[f'{method} b8, T={T}: syncs inside step() over 3 steps'] = [count_syncs(lambda: ds.step(temperature=T, generator=g))[1] for _ in range(3)]
    for T in (0.0, 1.0):                                                        # captured = eager
        outs = [device_decode(TreeStep(target, head, 'dyspec', budget=8, capacity=512, graphs=gr), p[0].tolist(), 48, temperature=T,
                              generator=torch.Generator(device=DEV).manual_seed(3)) for gr in (None, False)]
        res[f'T={T}: graphs output = eager output'] = outs[0] == outs[1]
    return res

DEVICE_SETTINGS = [('dyspec', 8), ('dyspec', 16), ('dyspec', 32), ('chain', 2), ('chain', 4), ('chain', 8), ('eagle2', 16), ('opt_tree', 16), ('dyspec_threshold', 16),
                   ('sequoia', 16), ('specinfer', 16), ('dyspec', 8, dict(depth=4)), ('dyspec', 16, dict(depth=4)),
                   ('opt_tree', 16, dict(max_depth=4))]   # OPT-Tree in 4 draft calls, as DySpec at depth 4

COMPILE_S = 150     # seconds left that a compiled row's warm-up (inductor compiling the step, then the capture) may take

def table(dt, extra=(), keep=None, compiled=False):
    "One interleaved greedy run on the prompts: per setting, ms/token, speedup over target.generate, accepted/step, identical."
    from dyspec_nb.static import StaticCache
    from dyspec_nb.timing import forward_seconds
    s = S[dt]; target, head, token, prompts = s['target'], s['head'], s['token'], s['prompts']
    calls = {'target.generate': lambda ids: (hf_generate(target, ids, NEW)[0], None),
             'assisted (token draft)': lambda ids: (hf_generate(target, ids, NEW, assistant_model=token)[0], None)}
    calls.update(extra)
    def engine(dec): return lambda ids: (lambda o: (o.tokens.tolist(), o.stats))(dec.generate(ids, max_new_tokens=NEW))
    calls['engine autoregressive, device'] = engine(SpecDecoder(target, None, 'autoregressive'))   # PlainStep, read late
    for m, b, *o in DEVICE_SETTINGS:
        o = o[0] if o else {}
        calls[f"{m} b{b}{''.join(f' {k} {v}' for k, v in o.items())}, device"] = engine(SpecDecoder(target, head, m, budget=b, **o))
    calls['dyspec default, device'] = engine(SpecDecoder(target, head, 'dyspec', budget='auto'))   # budget measured on the first call
    at_once = SpecDecoder(target, head, 'dyspec', budget=32); at_once.plan.read_late = False   # the device rows read a step late on CUDA
    calls['dyspec b32, device, read at once'] = engine(at_once)
    eager = SpecDecoder(target, head, 'dyspec', budget=8)                       # the step uncaptured: its launches, one read
    eager._stepper = TreeStep(target, head, 'dyspec', 8, capacity=1024, graphs=False)
    calls['dyspec b8, device uncaptured'] = engine(eager)
    if compiled:                                                                # inductor's fused kernels, captured: compiled on the warm-up call
        # On the CPU (a dry run) only plain decoding: compiling a tree step there takes minutes. The default probes its
        # budgets captured, then compiles the one it keeps
        for m, b in (('autoregressive', 0), ('dyspec', 'auto'), ('chain', 4), ('dyspec', 16)) if CUDA else (('autoregressive', 0),):
            dec = SpecDecoder(target, head if b else None, m, **({"budget": b} if b else {}), plan=dict(compile=True))
            calls[f"{'engine autoregressive' if not b else 'dyspec default' if b == 'auto' else f'{m} b{b}'}, device compiled"] = engine(dec)
    if keep is not None: calls = {k: c for k, c in calls.items() if k in keep or k in dict(extra) or k == 'target.generate'}
    longest = max(prompts, key=lambda p: p.shape[1])
    warm, failed = {}, {}
    for k, c in list(calls.items()):                                            # warm-up on the longest prompt: every graph captured
        if k.endswith('compiled') and left() < COMPILE_S:                       # compiling is the slow part: keep the rest of the record
            failed[k] = f'skipped: {left():.0f} s left, a compiled row needs {COMPILE_S}'; del calls[k]; continue
        try: _, warm[k] = synced(lambda: c(longest))
        except Exception: failed[k] = traceback.format_exc()[-1500:]; del calls[k]; print(failed[k], flush=True)
    res = {k: dict(seconds=0.0, tokens=0, steps=0, accepted=0, step_seconds=0.0, outputs=[]) for k in calls}
    for ids in prompts:
        for k, c in calls.items():
            (toks, st), sec = synced(lambda: c(ids))
            r = res[k]; r['seconds'] += sec; r['tokens'] += len(toks); r['outputs'].append(toks)
            if st is not None:
                r['steps'] += st.steps; r['accepted'] += sum(x.accepted for x in st.records)
                r['step_seconds'] += sum(x.seconds for x in st.records)
    base = res['target.generate']; bt = base['seconds'] / base['tokens']
    tab = {k: dict(ms_per_token=1e3 * r['seconds'] / r['tokens'], speedup=bt / (r['seconds'] / r['tokens']),
                   accepted_per_step=r['accepted'] / r['steps'] if r['steps'] else None,
                   ms_per_step=1e3 * r['seconds'] / r['steps'] if r['steps'] else None,
                   device_ms_per_step=1e3 * r['step_seconds'] / r['steps'] if r['steps'] and r['step_seconds'] else None,
                   identical=r['outputs'] == base['outputs'], first_call_s=warm[k],
                   draws=draw_mode(k.split(' ')[0], 0.0) if ' b' in k else None) for k, r in res.items()}
    static = lambda m: StaticCache(m, 256 + 64)
    sizes = (1, 3, 5, 9, 17, 33)
    if keep is not None: return dict(prompts=len(prompts), table=tab, failed=failed)
    steps = forward_seconds({'t': target}, sizes, 256, 5 if DRY else 20, warmup=3, tree=True, cache_for=static)['t']
    return dict(prompts=len(prompts), table=tab, failed=failed, target_static_verify_ms={n: 1e3 * v for n, v in steps.items()})

def static_gen(target):
    "target.generate with transformers' static cache, compiled by generate itself (as cache_implementation='static' does on CUDA)."
    return lambda ids: (hf_generate(target, ids, NEW, cache_implementation='static')[0], None)

@section('table float32', 90)
def _(): return table('float32', extra={'target.generate, static cache (compiled)': static_gen(S['float32']['target'])}, compiled=True)

@section('chi2 cuda', 40)
def _():
    from dyspec_nb.models import tiny_llama
    from dyspec_nb.head_recipe import tiny_head
    from dyspec_nb.lossless import chi2_test, ALPHA
    target = tiny_llama(seed=1); head, held = tiny_head(target)
    pr = [0, 7, 2]
    with torch.no_grad():
        p1 = torch.softmax(target(torch.tensor([pr])).logits[0, -1].double(), -1)
        p2 = torch.stack([torch.softmax(target(torch.tensor([pr + [a]])).logits[0, -1].double(), -1) for a in range(16)])
    exact = (p1[:, None] * p2).flatten()
    gt = copy.deepcopy(target).to(DEV); gh = copy.deepcopy(head).to(DEV).bind(gt)
    res = {}
    for method in ('dyspec', 'eagle2'):
        ds, gen, counts = TreeStep(gt, gh, method, budget=4, capacity=64), torch.Generator(device=DEV).manual_seed(0), torch.zeros(256)
        for _ in range(300 if DRY else 2000):
            a, b = device_decode(ds, pr, 2, temperature=1.0, draft_temperature=1.0, generator=gen)[:2]
            counts[16 * a + b] += 1
        r = chi2_test(counts, exact)
        res[method] = dict(stat=float(r['stat']), dof=int(r['dof']), pvalue=float(r['pvalue']), impossible=int(r['impossible']), passed=bool(r['impossible'] == 0 and r['pvalue'] > ALPHA))
    return res

@section('load bfloat16', 40)
def _():
    S.pop('float32', None); torch.cuda.empty_cache() if CUDA else None
    return load('bfloat16')

@section('correct bfloat16', 25)
def _():
    s = S['bfloat16']; target, head = s['target'], s['head']
    refs = [hf_generate(target, p, NEW)[0] for p in s['prompts']]
    dec = SpecDecoder(target, head, 'dyspec', budget=8)
    outs = [dec.generate(p, max_new_tokens=NEW).tokens.tolist() for p in s['prompts']]
    first = [next((i for i, (a, b) in enumerate(zip(o, r)) if a != b), None) for o, r in zip(outs, refs)]
    return dict(identical=[o == r for o, r in zip(outs, refs)], first_difference=first)

@section('table bfloat16', 90)
def _(): return table('bfloat16')

@section('torch.compile of the step', 150)
def _():
    S.pop('bfloat16', None); torch.cuda.empty_cache() if CUDA else None
    load('float32')
    s = S['float32']; target, head, p = s['target'], s['head'], s['prompts'][0][0].tolist()
    res = {}
    a = TreeStep(target, head, 'dyspec', budget=8, capacity=512)            # captured: a CUDA graph per setting
    a.start(p); a.step(); sync()
    t = time.perf_counter()
    for _ in range(20): a.step()
    sync(); res['captured graph: ms per step'] = 1e3 * (time.perf_counter() - t) / 20
    for mode in ('reduce-overhead', 'max-autotune'):
        if left() < 100: res[mode] = 'skipped: time'; continue
        try:
            torch._dynamo.reset()
            b = TreeStep(target, head, 'dyspec', budget=8, capacity=512, graphs=False); b.start(p)
            run = torch.compile(b.run, mode=mode, fullgraph=True)
            t = time.time(); run(None, None); sync(); c = time.time() - t
            for _ in range(3): run(None, None)
            sync(); t = time.perf_counter()
            for _ in range(20): run(None, None)
            sync(); res[mode] = dict(compile_s=c, ms_per_step=1e3 * (time.perf_counter() - t) / 20)
        except Exception: res[mode] = traceback.format_exc()[-2000:]
        save()
    return res

rec['total_s'] = round(time.time() - T0, 1); save()
print('done in', rec['total_s'], 's', flush=True)
