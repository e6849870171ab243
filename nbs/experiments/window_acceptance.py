# How far the GPU window's prompts go (issue 51): `results/window_acceptance.json`. Not part of the package; 22_gpu
# renders it. Accepted draft tokens per step are a property of the pair and the text, not of the machine: in float32 the
# greedy tokens are `target.generate`'s on any device, and the step builds the same trees from the same rows. So
# the CPU can say what the window's two prompts cannot: how those prompts' acceptance compares with more prompts, and
# whether the window's float32 and bfloat16 rows accept differently because of the dtype or because of the texts.
# For every device setting the window measured (read from `results/device_step_gpu.json`), and DySpec at the chain's four
# draft calls: accepted tokens and steps per MT-Bench prompt, greedy, 128 new tokens (the window's), the embedded pair in
# float32 and in bfloat16, on the engine's step. From the project root:
#     python nbs/experiments/window_acceptance.py      # PROMPTS=8 NEW=128; OUT=dir writes the record there instead of results/
import os, sys, re, json, time
from pathlib import Path
ROOT = Path(__file__).resolve().parents[2]; sys.path.insert(0, str(ROOT))
import torch
from tqdm.auto import tqdm
from dyspec_nb.models import load_default_pair
from dyspec_nb.data import mtbench_prompts
from dyspec_nb.engine import SpecDecoder
from dyspec_nb.step import step_shape
from dyspec_nb.timing import machine_fingerprint

PROMPTS, NEW = int(os.environ.get('PROMPTS', 8)), int(os.environ.get('NEW', 128))
window = json.loads((ROOT / 'results' / 'device_step_gpu.json').read_text())
ROW = re.compile(r'(\w+) b(\d+)((?: \w+ \d+)*), device')                        # 'dyspec b16, device', 'opt_tree b16 max_depth 4, device'
labels = [k for k in window['sections']['table float32']['result']['table'] if ROW.fullmatch(k)]
labels += [l for l in ('dyspec b16 depth 4, device', 'dyspec b32 depth 4, device') if l not in labels]   # as many draft calls as chain b4

def setting(label):
    "`(method, budget, options)` of a device row's label."
    m = ROW.fullmatch(label); o = m[3].split()
    return m[1], int(m[2]), {k: int(v) for k, v in zip(o[::2], o[1::2])}

rec = dict(command='python nbs/experiments/window_acceptance.py', date=time.strftime('%Y-%m-%d'), machine=machine_fingerprint(),
           prompts=PROMPTS, new_tokens=NEW, window_prompts=window['sections']['table float32']['result']['prompts'], dtypes={})
for dt in ('float32', 'bfloat16'):
    target, head, tok = load_default_pair('head', dtype=dt)
    prompts = mtbench_prompts(tok, PROMPTS)
    rows = {}
    for label in tqdm(labels, desc=dt):
        m, b, o = setting(label)
        dec = SpecDecoder(target, head, m, budget=b, **o)
        steps, acc = [], []
        for p in prompts:
            st = dec.generate(p, max_new_tokens=NEW).stats
            steps.append(st.steps); acc.append(sum(r.accepted for r in st.records))
        rows[label] = dict(draft_calls=step_shape(m, b, head.config.vocab_size, **o)[2], steps=steps, accepted=acc)
    rec['dtypes'][dt] = rows
out = Path(os.environ.get('OUT') or ROOT / 'results'); out.mkdir(parents=True, exist_ok=True)
(out / 'window_acceptance.json').write_text(json.dumps(rec, indent=1) + '\n')
n = rec['window_prompts']
pooled = lambda r, m=None: sum(r['accepted'][:m]) / sum(r['steps'][:m])      # accepted over steps, on the first m prompts
for dt, rows in rec['dtypes'].items():
    for k, r in rows.items(): print(f"{dt:9s} {k:36s} D {r['draft_calls']}  accepted/step: first {n} prompts {pooled(r, n):.3f}, all {PROMPTS} {pooled(r):.3f}")
