# Your own model (issues 66 and 65): one interleaved run on a development pair, a GGUF target and the head trained for
# it, against what a user would otherwise run. Not part of the package; 25_own_models renders its record.
#     python nbs/experiments/own_models.py --target MODEL.gguf --draft HEAD_FOLDER [--prompts 4] [--new 128] [--temperature 0.6]
# The head comes from `dyspec train-draft --target MODEL.gguf --out HEAD_FOLDER` (its recipe.json, the training record,
# is copied into the results); `--draft head` is the shipped head (the embedded target's). The pair loads as `dyspec
# generate` loads it: on the CPU in float32 the target runs on its file's packed blocks and the head's products on int8
# (05_models). `target.generate` runs on the dequantised float32 model, what a transformers user runs, and is the
# yardstick of the speedups. Writes results/own_models.json, one entry per target file, and its tables in
# results/own_models.md, both rewritten after each prompt, so that a run cut short keeps what it measured. Every method
# decodes each prompt in turn (one interleaved run), after one warm-up call each; llama.cpp (`pip install ".[peers]"`)
# runs on the same GGUF file and the same prompt tokens. A second, sampled part runs the engine's plain path, the default
# and llama.cpp at `--temperature` (0: none).
import argparse, collections, json, resource, sys, time
from pathlib import Path
ROOT = Path(__file__).resolve().parents[2]; sys.path.insert(0, str(ROOT))
import torch
from tqdm.auto import tqdm
from dyspec_nb.models import load_pair, load_local_target, hf_generate, head_products
from dyspec_nb.data import mtbench_prompts
from dyspec_nb.engine import SpecDecoder
from dyspec_nb.step import PHASES
from dyspec_nb.bench import first_difference, llama_cpp_decoder

p = argparse.ArgumentParser()
p.add_argument('--target', required=True, help='a GGUF file')
p.add_argument('--draft', required=True, help="the head trained for it (dyspec train-draft's --out folder), or 'head' for the embedded target")
p.add_argument('--prompts', type=int, default=4, help='held-out MT-Bench prompts (first turns)')
p.add_argument('--new', type=int, default=128, help='new tokens per prompt')
p.add_argument('--chains', default='2,4', help='chain budgets')
p.add_argument('--temperature', type=float, default=0.6, help='the sampled part (0: none)')
p.add_argument('--out', type=Path, default=ROOT / 'results' / 'own_models.json')
args = p.parse_args()

def peak_mb(): return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024      # this process's peak resident memory so far

t0 = time.time()
target, head, tok = load_pair(args.target, args.draft)                         # packed where the kernels run
weights = 'packed' if head_products(target) == 'int8' else 'dense'
dense = load_local_target(args.target)[0] if weights == 'packed' else target     # the dequantised float32 model
loaded_mb = peak_mb()
prompts = mtbench_prompts(tok, args.prompts)

def hf(**kw): return lambda ids, n: (*hf_generate(dense, ids, n, **kw), None)
def engine(dec, T=0.0):
    def call(ids, n):
        out = dec.generate(ids, max_new_tokens=n, temperature=T, seed=0)
        return out.tokens.tolist(), out.stats.seconds, out.stats
    return call
def peer(decoder, T=0.0): return lambda ids, n: (*decoder(ids, n, T, 0), None)

plain, default = SpecDecoder(target, None, 'autoregressive'), SpecDecoder(target, head)
methods = {'target.generate': hf(), 'prompt lookup (transformers)': hf(prompt_lookup_num_tokens=10),
           'engine autoregressive': engine(plain), 'dyspec default': engine(default)}
for b in map(int, args.chains.split(',')): methods[f'chain b{b}'] = engine(SpecDecoder(target, head, 'chain', b))
on = {k: ('dense' if k in ('target.generate', 'prompt lookup (transformers)') else weights) for k in methods}   # each method's weights
try:
    from llama_cpp import __version__ as llama_cpp_version
    greedy_llama = llama_cpp_decoder(args.target)
    methods['llama.cpp'], methods['llama.cpp prompt lookup'] = peer(greedy_llama), peer(llama_cpp_decoder(args.target, lookup_tokens=10))
    on['llama.cpp'] = on['llama.cpp prompt lookup'] = 'the file'
except (ImportError, ValueError): llama_cpp_version, greedy_llama = None, None
sampled = {}
if args.temperature > 0:
    T = args.temperature
    sampled = {'engine autoregressive': engine(SpecDecoder(target, None, 'autoregressive'), T), 'dyspec default': engine(SpecDecoder(target, head), T)}
    if greedy_llama is not None: sampled['llama.cpp'] = peer(greedy_llama, T)

rec = dict(command='python nbs/experiments/own_models.py ' + ' '.join(sys.argv[1:]), date=time.strftime('%Y-%m-%d'),
           target=Path(args.target).name, architecture=type(target).__name__, parameters=sum(x.numel() for x in dense.parameters()),
           dtype=str(target.dtype)[6:], weights=weights, head_products=head_products(target), threads=torch.get_num_threads(),
           torch=torch.__version__, llama_cpp=llama_cpp_version, prompts=args.prompts, new_tokens=args.new, greedy=True, head_recipe=None,
           methods={}, sampled=dict(temperature=args.temperature, methods={}))
recipe = Path(args.draft) / 'recipe.json'
if recipe.exists():
    r = json.loads(recipe.read_text())
    rec['head_recipe'] = {k: r.get(k) for k in ('minutes', 'steps_done', 'tokens', 'chats_read', 'stopped_by_time', 'history')}

def own_markdown(rec):
    "One target's run: a line on the pair and the machine, the head's training, per method its weights, ms/token, speedups, accepted per step, ms per step, losslessness, first differences; then the sampled part."
    h = rec.get('head_recipe') or {}
    agree = (h.get('history') or {}).get('val_agreement') or []
    head = (f"head: {h['minutes']:.0f} minutes of `dyspec train-draft`, {h['steps_done']} steps over {h['tokens']:,} tokens of {h['chats_read']} "
            f"conversations, validation top-1 agreement at depths 1-{len(agree[-1])} {', '.join(f'{a:.3f}' for a in agree[-1])}" if h and agree
            else 'head: the shipped one' if rec.get('draft') == 'head' else 'head: no training record')
    out = [f"**{rec['target']}** ({rec['architecture']}, {rec['parameters'] / 1e6:.0f}M parameters), {rec['date']}, {rec['threads']} threads, "
           f"{rec['prompts_done']} prompts x {rec['new_tokens']} new tokens, greedy; the engine on {rec.get('weights', 'dense')} weights, the head's products {rec.get('head_products', 'float32')}; "
           f"peak memory {rec['peak_mb']:,.0f} MB ({rec['loaded_mb']:,.0f} MB after loading); {head}.", '',
           '| method | weights | ms/token | over `target.generate` | over the engine\'s plain path | accepted/step | ms/step | lossless | first difference from `target.generate` |',
           '|---|---|---|---|---|---|---|---|---|']
    num = lambda x, f: '' if x is None else f.format(x)
    plain = rec['methods']['engine autoregressive']['ms_per_token']
    for k, r in rec['methods'].items():                                            # (a record from before packed weights: dense, lossless read as identical)
        out.append(f"| {k} | {r.get('weights', 'dense')} | {r['ms_per_token']:.1f} | {r['speedup']:.2f}x | {plain / r['ms_per_token']:.2f}x | {num(r['accepted_per_step'], '{:.2f}')} | "
                   f"{num(r['ms_per_step'], '{:.1f}')} | {num(r.get('lossless', r.get('identical')), '{}')} | {', '.join('-' if f is None else str(f) for f in r['first_difference'])} |")
    s = rec.get('sampled') or {}
    if s.get('methods'):
        out += ['', f"Sampled at T = {s['temperature']}: " + ', '.join(f"{k} {r['ms_per_token']:.1f} ms/token" for k, r in s['methods'].items()) + '.']
    if rec.get('default_split'):
        out += ['', "The default's greedy steps, ms a step by phase: " + ', '.join(f"{k} {v:.2f}" for k, v in rec['default_split'].items()) + '.']
    return '\n'.join(out)

def save():
    "The record, this target's entry replaced, and its Markdown tables beside it (`own_models.md`)."
    whole = json.loads(args.out.read_text()) if args.out.exists() else {}
    whole[rec['target']] = rec
    args.out.write_text(json.dumps(whole, indent=1) + '\n')
    args.out.with_suffix('.md').write_text('\n\n'.join(own_markdown(r) for r in whole.values()) + '\n')

rec['draft'] = args.draft if args.draft == 'head' else Path(args.draft).name
for call in [*methods.values(), *sampled.values()]: call(prompts[0], 8)          # warm-up: loads, first calls, the default's first choices
runs, sruns, split = {m: [] for m in methods}, {m: [] for m in sampled}, collections.Counter()
reference = lambda name: 'target.generate' if on[name] == 'dense' else 'engine autoregressive' if on[name] == weights else None   # what a lossless method equals
for i, ids in enumerate(tqdm(prompts, desc='prompts')):
    for name, call in methods.items():
        toks, sec, stats = call(ids, args.new)
        runs[name].append(dict(tokens=toks, seconds=sec, steps=stats.steps if stats else None, accepted=sum(r.accepted for r in stats.records) if stats else None))
        if name == 'dyspec default':
            for r in stats.records:
                for ph in PHASES: split[ph] += getattr(r, ph)
            split['steps'] += stats.steps
    for name, call in sampled.items():
        toks, sec, _ = call(ids, args.new); sruns[name].append(dict(tokens=toks, seconds=sec))
    for name, rs in runs.items():
        n_tok, n_sec, steps = sum(len(r['tokens']) for r in rs), sum(r['seconds'] for r in rs), sum(r['steps'] or 0 for r in rs)
        ref = reference(name)
        rec['methods'][name] = dict(weights=on[name], ms_per_token=1e3 * n_sec / n_tok, new_tokens=n_tok,
                                    lossless=None if ref is None else all(first_difference(r['tokens'], w['tokens']) is None for r, w in zip(rs, runs[ref])),
                                    first_difference=[first_difference(r['tokens'], w['tokens']) for r, w in zip(rs, runs['target.generate'])],
                                    accepted_per_step=sum(r['accepted'] for r in rs) / steps if steps else None, ms_per_step=1e3 * n_sec / steps if steps else None)
    g, a = rec['methods']['target.generate']['ms_per_token'], rec['methods']['engine autoregressive']['ms_per_token']
    for r in rec['methods'].values(): r['speedup'], r['over_plain'] = g / r['ms_per_token'], a / r['ms_per_token']
    rec['sampled']['methods'] = {k: dict(ms_per_token=1e3 * sum(r['seconds'] for r in rs) / sum(len(r['tokens']) for r in rs), new_tokens=sum(len(r['tokens']) for r in rs))
                                 for k, rs in sruns.items()}
    rec['default_split'] = {ph: 1e3 * split[ph] / max(1, split['steps']) for ph in PHASES}
    rec['prompts_done'] = i + 1
    rec['default_settings'] = {f'{b} depth {d}': dict(tokens=t, seconds=s, steps=n) for (greedy, (b, d)), (t, s, n) in getattr(default, 'setting_runs', {}).items() if greedy}
    rec['peak_mb'], rec['loaded_mb'], rec['seconds'] = peak_mb(), loaded_mb, time.time() - t0
    save()
for name, r in rec['methods'].items():
    print(f"{name:30s} {r['ms_per_token']:8.1f} ms/token  {r['speedup']:5.2f}x target.generate  {r['over_plain']:5.2f}x plain  lossless {r['lossless']}  accepted/step {r['accepted_per_step']}")
for name, r in rec['sampled']['methods'].items(): print(f"T = {args.temperature}: {name:24s} {r['ms_per_token']:8.1f} ms/token")
print(f"peak memory {rec['peak_mb']:.0f} MB; wrote {args.out}")
