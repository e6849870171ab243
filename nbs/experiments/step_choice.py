# The engine's step against `target.generate` on a CPU (issue 51, item 8): `results/step_choice.json`, one entry per CPU.
# Not part of the package; 08_engine renders the record. One interleaved run of the embedded pair (float32) on MT-Bench
# prompts, greedy and at T = 0.6: `target.generate`, the decoder's default setting (DySpec, budget='auto': off CUDA its
# setting chosen step by step) with the feature head and with the token draft, and plain decoding (method='autoregressive').
# Every row runs in a process of its own, which decodes each request as it comes and times the call; the rows take turns
# prompt by prompt, in an order reversed on every other prompt. (In the runs of 2026-11-30 where this checkout's rows
# shared one process and the host step had its own, the default took 4 to 7% longer than the host step at T = 0; with
# each in a process of its own, in one run that day, the two were within 1.3% at T = 0 and T = 0.6.)
# From the project root, on the machine to record (a run on another CPU adds its entry):
#     python nbs/experiments/step_choice.py            # PROMPTS=8 NEW=64; OUT=dir writes the record there instead of results/
# BEFORE=dir also runs the host step's defaults of an older checkout in `dir` (one from before 2026-11-30, which still has
# step='host') in the same interleaving (rows 'before: ...'):
#     git worktree add /tmp/before df2409d && cp dyspec_nb/*.so /tmp/before/dyspec_nb/ && BEFORE=/tmp/before python nbs/experiments/step_choice.py
import os, sys, json, time, subprocess
from pathlib import Path
ROOT = Path(__file__).resolve().parents[2]
WORKER = sys.argv[2] if sys.argv[1:2] == ['--worker'] else None   # one row, served by a process of its own
if WORKER is None: sys.path.insert(0, str(ROOT))                  # a worker has its checkout's package first on PYTHONPATH
import torch

PROMPTS, NEW, BEFORE = int(os.environ.get('PROMPTS', 8)), int(os.environ.get('NEW', 64)), os.environ.get('BEFORE')
ROWS = ('target.generate', 'default', 'default, token draft', 'autoregressive')                 # this checkout's
BEFORE_ROWS = ('host default', 'host default, token draft', 'host autoregressive')             # the older checkout's

def serve(row):
    "A worker: one request a line, [prompt ids, T, seed] -> [tokens, seconds of the call]; 'settings' -> the default's setting record."
    from dyspec_nb.models import load_default_pair, hf_generate
    from dyspec_nb.engine import SpecDecoder
    target, head, _ = load_default_pair()
    draft = load_default_pair('token')[1] if 'token draft' in row else None if 'autoregressive' in row or row == 'target.generate' else head
    host = dict(step='host') if row.startswith('host') else {}
    dec = None if row == 'target.generate' else SpecDecoder(target, None, 'autoregressive', **host) if draft is None else SpecDecoder(target, draft, **host)
    for line in sys.stdin:
        req = json.loads(line)
        if req == 'settings':
            print(json.dumps([[g, list(s), list(r)] for (g, s), r in getattr(dec, 'setting_runs', {}).items()]), flush=True); continue
        ids, T, seed = req
        t = time.perf_counter()
        toks = hf_generate(target, torch.tensor([ids]), NEW, temperature=T, seed=seed)[0] if dec is None else \
               dec.generate(torch.tensor([ids]), max_new_tokens=NEW, temperature=T, seed=seed).tokens.tolist()
        print(json.dumps([toks, time.perf_counter() - t]), flush=True)

if WORKER is not None: serve(WORKER); sys.exit()

from tqdm.auto import tqdm
from dyspec_nb.models import load_default_pair
from dyspec_nb.data import mtbench_prompts
from dyspec_nb.timing import machine_fingerprint, cpu_name

def worker(row, checkout):
    return subprocess.Popen([sys.executable, __file__, '--worker', row], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                            env=dict(os.environ, PYTHONPATH=str(Path(checkout).resolve())), cwd=checkout)
workers = {row: worker(row, ROOT) for row in ROWS} | ({f'before: {row}': worker(row, BEFORE) for row in BEFORE_ROWS} if BEFORE else {})
def ask(row, req):
    workers[row].stdin.write(json.dumps(req) + '\n'); workers[row].stdin.flush()
    return json.loads(workers[row].stdout.readline())

tok = load_default_pair()[2]
prompts = [p[0].tolist() for p in mtbench_prompts(tok, PROMPTS)]
entry = dict(date=time.strftime('%Y-%m-%d'), machine=machine_fingerprint(), prompts=PROMPTS, new_tokens=NEW, temperatures={})
for T in (0.0, 0.6):
    for row in workers: ask(row, [prompts[0], T, 0])                           # warm-up: first calls, the default's first steps
    secs, outs = {k: 0.0 for k in workers}, {k: [] for k in workers}
    bar = tqdm(total=len(prompts) * len(workers), desc=f'T = {T:g}: prompt x decoder')
    for i, p in enumerate(prompts):
        for row in list(workers)[::-1 if i % 2 else 1]:                         # interleaved: every row on a prompt, then the next
            o, s = ask(row, [p, T, i]); secs[row] += s; outs[row].append(o); bar.update()
    bar.close()
    rate = {k: sum(map(len, outs[k])) / secs[k] for k in workers}               # tokens per second
    runs = ask('default', 'settings')                                           # [greedy, [budget, depth], [tokens, seconds, steps]]
    entry['temperatures'][f'{T:g}'] = dict(
        rows={k: dict(ms_per_token=1e3 / r, speedup=r / rate['target.generate'], identical=outs[k] == outs['target.generate'] if T == 0 else None) for k, r in rate.items()},
        device_settings={f'{b}/{d or "-"}': dict(tokens_per_s=t / s, steps=n) for greedy, (b, d), (t, s, n) in runs if greedy == (T == 0)})
for w in workers.values(): w.stdin.close(); w.wait()
out = Path(os.environ.get('OUT') or ROOT / 'results'); out.mkdir(parents=True, exist_ok=True)
path = out / 'step_choice.json'
rec = json.loads(path.read_text()) if path.exists() else {}
if BEFORE: entry['before'] = subprocess.run(['git', '-C', BEFORE, 'log', '-1', '--format=%h %cs'], capture_output=True, text=True).stdout.strip()
env = ''.join(f'{k}={v} ' for k, v in (('PROMPTS', PROMPTS), ('NEW', NEW)) if v != {'PROMPTS': 8, 'NEW': 64}[k])
rec[cpu_name()] = dict(command=env + ('BEFORE=<checkout of ' + entry['before'].split()[0] + '> ' if BEFORE else '') + 'python nbs/experiments/step_choice.py', **entry)
path.write_text(json.dumps(rec, indent=1) + '\n')
for T, t in entry['temperatures'].items():
    print(f'T = {T}: ' + '  '.join(f"{k} {r['ms_per_token']:.1f} ms/token ({r['speedup']:.2f}x)" for k, r in t['rows'].items()))
