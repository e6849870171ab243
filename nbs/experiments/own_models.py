# Your own model (issue 66, item 6): one interleaved greedy run on a development pair, a GGUF target and the head trained
# for it, against what a user would otherwise run. Not part of the package; 25_own_models renders its record.
#     python nbs/experiments/own_models.py --target MODEL.gguf --draft HEAD_FOLDER [--prompts 4] [--new 128]
# The head comes from `dyspec train-draft --target MODEL.gguf --out HEAD_FOLDER` (its recipe.json, the training record,
# is copied into the results). Writes results/own_models.json, one entry per target file, and its tables in
# results/own_models.md, both rewritten after each prompt, so that a run cut short keeps what it measured. Every method
# decodes each prompt in turn (one interleaved run), after one warm-up call each; llama.cpp (`pip install
# llama-cpp-python`) runs on the same GGUF file and the same prompt tokens.
import argparse, json, resource, sys, time
from pathlib import Path
ROOT = Path(__file__).resolve().parents[2]; sys.path.insert(0, str(ROOT))
import torch
from tqdm.auto import tqdm
from dyspec_nb.models import load_pair, hf_generate
from dyspec_nb.data import mtbench_prompts
from dyspec_nb.engine import SpecDecoder

p = argparse.ArgumentParser()
p.add_argument('--target', required=True, help='a GGUF file (or model folder)')
p.add_argument('--draft', required=True, help="the head trained for it (dyspec train-draft's --out folder)")
p.add_argument('--prompts', type=int, default=4, help='held-out MT-Bench prompts (first turns)')
p.add_argument('--new', type=int, default=128, help='new tokens per prompt')
p.add_argument('--chains', default='2,4', help='chain budgets; the table keeps the fastest')
p.add_argument('--out', type=Path, default=ROOT / 'results' / 'own_models.json')
args = p.parse_args()

def peak_mb(): return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024      # this process's peak resident memory so far

t0 = time.time()
target, head, tok = load_pair(args.target, args.draft)
loaded_mb = peak_mb()
prompts = mtbench_prompts(tok, args.prompts)
lookup = dict(prompt_lookup_num_tokens=10)

def hf(**kw):
    return lambda ids, n: (*hf_generate(target, ids, n, **kw), None)

def engine(dec):
    def call(ids, n):
        out = dec.generate(ids, max_new_tokens=n)
        return out.tokens.tolist(), out.stats.seconds, out.stats
    return call

methods = {'target.generate': hf(), 'prompt lookup (transformers)': hf(**lookup),
           'engine autoregressive': engine(SpecDecoder(target, None, 'autoregressive')),
           'dyspec default': engine(default := SpecDecoder(target, head))}
for b in map(int, args.chains.split(',')): methods[f'chain b{b}'] = engine(SpecDecoder(target, head, 'chain', b))
try:
    from llama_cpp import Llama, __version__ as llama_cpp_version
    from llama_cpp.llama_speculative import LlamaPromptLookupDecoding
    def llama(**kw):
        llm = Llama(model_path=str(args.target), n_threads=torch.get_num_threads(), n_ctx=4096, verbose=False, **kw)
        def call(ids, n):
            t, out = time.perf_counter(), []
            for x in llm.generate(ids[0].tolist(), top_k=1, top_p=1.0, temp=0.0, repeat_penalty=1.0, reset=True):
                out.append(x)
                if x == llm.token_eos() or len(out) >= n: break
            return out, time.perf_counter() - t, None
        return call
    if str(args.target).endswith('.gguf'):
        methods['llama.cpp'] = llama()
        methods['llama.cpp prompt lookup'] = llama(draft_model=LlamaPromptLookupDecoding(num_pred_tokens=10))
except ImportError: llama_cpp_version = None

rec = dict(command='python nbs/experiments/own_models.py ' + ' '.join(sys.argv[1:]), date=time.strftime('%Y-%m-%d'),
           target=Path(args.target).name, architecture=type(target).__name__, parameters=sum(x.numel() for x in target.parameters()),
           dtype=str(target.dtype)[6:], threads=torch.get_num_threads(), torch=torch.__version__, llama_cpp=llama_cpp_version,
           prompts=args.prompts, new_tokens=args.new, greedy=True, head_recipe=None, methods={})
recipe = Path(args.draft) / 'recipe.json'
if recipe.exists():
    r = json.loads(recipe.read_text())
    rec['head_recipe'] = {k: r.get(k) for k in ('minutes', 'steps_done', 'tokens', 'chats_read', 'stopped_by_time', 'history')}

def own_markdown(rec):
    "One target's run: a line on the pair and the machine, the head's training, then per method ms/token, speedup, accepted per step, ms per step, identity."
    h = rec.get('head_recipe') or {}
    agree = (h.get('history') or {}).get('val_agreement') or []
    head = (f"head: {h['minutes']:.0f} minutes of `dyspec train-draft`, {h['steps_done']} steps over {h['tokens']:,} tokens of {h['chats_read']} "
            f"conversations, validation top-1 agreement at depths 1-{len(agree[-1])} {', '.join(f'{a:.3f}' for a in agree[-1])}" if h and agree else 'head: no training record')
    out = [f"**{rec['target']}** ({rec['architecture']}, {rec['parameters'] / 1e6:.0f}M parameters, {rec['dtype']}), {rec['date']}, "
           f"{rec['threads']} threads, {rec['prompts_done']} prompts x {rec['new_tokens']} new tokens, greedy; "
           f"peak memory {rec['peak_mb']:,.0f} MB ({rec['loaded_mb']:,.0f} MB after loading); {head}.", '',
           '| method | ms/token | speedup over `target.generate` | accepted/step | ms/step | identical to `target.generate` | first difference per prompt |',
           '|---|---|---|---|---|---|---|']
    num = lambda x, f: '' if x is None else f.format(x)
    for k, r in rec['methods'].items():
        out.append(f"| {k} | {r['ms_per_token']:.1f} | {r['speedup']:.2f}x | {num(r['accepted_per_step'], '{:.2f}')} | {num(r['ms_per_step'], '{:.1f}')} | "
                   f"{r['identical']} | {', '.join('-' if f is None else str(f) for f in r['first_difference'])} |")
    return '\n'.join(out)

def save():
    "The record, this target's entry replaced, and its Markdown tables beside it (`own_models.md`)."
    whole = json.loads(args.out.read_text()) if args.out.exists() else {}
    whole[rec['target']] = rec
    args.out.write_text(json.dumps(whole, indent=1) + '\n')
    args.out.with_suffix('.md').write_text('\n\n'.join(own_markdown(r) for r in whole.values()) + '\n')

for name, call in methods.items(): call(prompts[0], 8)                          # warm-up: loads, first calls, the default's first choices
runs = {m: [] for m in methods}
for i, ids in enumerate(tqdm(prompts, desc='prompts')):
    for name, call in methods.items():
        toks, sec, stats = call(ids, args.new)
        runs[name].append(dict(tokens=toks, seconds=sec, steps=stats.steps if stats else None,
                               accepted=sum(r.accepted for r in stats.records) if stats else None))
    ref = runs['target.generate']
    for name, rs in runs.items():
        n_tok, n_sec = sum(len(r['tokens']) for r in rs), sum(r['seconds'] for r in rs)
        firsts = [next((j for j, (a, b) in enumerate(zip(r['tokens'], w['tokens'])) if a != b), None if len(r['tokens']) == len(w['tokens']) else min(len(r['tokens']), len(w['tokens'])))
                  for r, w in zip(rs, ref)]
        steps = sum(r['steps'] or 0 for r in rs)
        rec['methods'][name] = dict(ms_per_token=1e3 * n_sec / n_tok, new_tokens=n_tok, identical=all(f is None for f in firsts), first_difference=firsts,
                                    accepted_per_step=sum(r['accepted'] for r in rs) / steps if steps else None,
                                    ms_per_step=1e3 * n_sec / steps if steps else None)
    g = rec['methods']['target.generate']['ms_per_token']
    for r in rec['methods'].values(): r['speedup'] = g / r['ms_per_token']
    rec['prompts_done'] = i + 1
    rec['default_settings'] = {f'{b} depth {d}': dict(tokens=t, seconds=s, steps=n) for (greedy, (b, d)), (t, s, n) in getattr(default, 'setting_runs', {}).items() if greedy}
    rec['peak_mb'], rec['loaded_mb'], rec['seconds'] = peak_mb(), loaded_mb, time.time() - t0
    save()
for name, r in rec['methods'].items():
    print(f"{name:30s} {r['ms_per_token']:8.1f} ms/token  {r['speedup']:5.2f}x  identical {r['identical']}  accepted/step {r['accepted_per_step']}")
print(f"peak memory {rec['peak_mb']:.0f} MB; wrote {args.out}")
