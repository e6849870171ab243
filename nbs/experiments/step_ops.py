# What a step launches, phase by phase (issue 51): `results/step_ops.json`. Not part of the package.
# On a GPU a captured step costs about as much per kernel it launches, so the count of operations a step dispatches is
# where its time goes there, whatever the CPU's own timings say. Counted here with a TorchDispatchMode (views left out)
# over one `step()` of each device builder on the embedded pair, float32, on the CPU; from the project root:
#     python nbs/experiments/step_ops.py            # OUT=dir writes the record there instead of results/
import os, sys, json, time, collections
from pathlib import Path
ROOT = Path(__file__).resolve().parents[2]; sys.path.insert(0, str(ROOT))
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from dyspec_nb.models import load_default_pair
import dyspec_nb.step as dsm
from dyspec_nb.step import TreeStep, PlainStep, STEP_METHODS

VIEWS = ('view', '_unsafe_view', 't', 'transpose', 'expand', 'slice', 'select', 'unsqueeze', 'squeeze', 'detach', 'alias',
         'permute', 'split', 'unbind', 'as_strided', 'lift_fresh', '_reshape_alias', 'reshape', 'chunk')   # no kernel of their own

class Count(TorchDispatchMode):
    "Operations dispatched, per phase (`phase`, set by `phased`), views left out."
    def __init__(self): super().__init__(); self.n, self.phase = collections.Counter(), 'rest'
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.overloadpacket.__name__ not in VIEWS: self.n[self.phase] += 1
        return func(*args, **(kwargs or {}))

C = Count()
def phased(f, phase):
    "`f`, its operations counted under `phase`."
    def g(*a, **k):
        old, C.phase = C.phase, phase
        try: return f(*a, **k)
        finally: C.phase = old
    return g

# The step's parts, by the functions that run them: the target's verification forward, the head's calls and their rows,
# the verifier; the builder's own tensor code, and the masks and indices of each head call (`expand`), are what is left.
dsm.static_forward, dsm.lean_head_layer = phased(dsm.static_forward, 'target forward'), phased(dsm.lean_head_layer, 'head calls')
dsm.greedy_verify, dsm.sample_verify = phased(dsm.greedy_verify, 'verifier'), phased(dsm.sample_verify, 'verifier')
TreeStep._rows = phased(TreeStep._rows, 'head rows')
for name in ('frontier_tree', 'shape_tree'):
    build = getattr(dsm, name)
    setattr(dsm, name, lambda root, expand, *a, _b=build, **k: phased(_b, 'builder')(root, phased(expand, 'head inputs'), *a, **k))

target, head = load_default_pair()[:2]
prompt = list(range(100, 160))                   # any 60 tokens: the counts do not depend on the text
rows = {}
for method, budget in [(m, 8) for m in STEP_METHODS] + [('dyspec', 16), ('dyspec', 32), ('chain', 4)]:
    ds = TreeStep(target, head, method, budget=budget, capacity=512, graphs=False); ds.start(prompt); ds.step()
    for T in (0.0, 1.0):
        C.n.clear()
        with C: ds.step(temperature=T, generator=torch.Generator().manual_seed(0))
        rows[f'{method} b{budget}, T = {T:g}'] = dict(D=ds.D, W=ds.W, K=ds.K, total=sum(C.n.values()), **C.n)
pd = PlainStep(target, capacity=512, graphs=False); pd.start(prompt); pd.step()
C.n.clear()
with C: pd.step()
rows['plain decoding, T = 0'] = dict(D=0, W=0, K=0, total=sum(C.n.values()), **C.n)
rec = dict(command='python nbs/experiments/step_ops.py', date=time.strftime('%Y-%m-%d'), torch=torch.__version__,
           what='operations dispatched by one TreeStep.step() (views left out), embedded pair, float32, CPU', rows=rows)
out = Path(os.environ.get('OUT') or ROOT / 'results'); out.mkdir(parents=True, exist_ok=True)
(out / 'step_ops.json').write_text(json.dumps(rec, indent=1))
for k, r in rows.items(): print(f"{k:28s} " + '  '.join(f'{p} {v}' for p, v in r.items()))
