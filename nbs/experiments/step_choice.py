# The engine's step against `target.generate` on a CPU (issue 51, item 8): `results/step_choice.json`, one entry per CPU.
# Not part of the package; 08_engine renders the record. One interleaved run of the embedded pair (float32) on MT-Bench
# prompts, greedy and at T = 0.6: `target.generate`, the decoder's default setting (DySpec, budget='auto': off CUDA its
# setting chosen step by step) with the feature head and with the token draft, and plain decoding (method='autoregressive').
# From the project root, on the machine to record (a run on another CPU adds its entry):
#     python nbs/experiments/step_choice.py            # PROMPTS=8 NEW=64; OUT=dir writes the record there instead of results/
# BEFORE=dir also runs the host step's defaults of an older checkout in `dir` (one from before 2026-11-30, which still has
# step='host'), in a second process that decodes each request as it comes, inside the same interleaving (rows 'before: ...'):
#     git worktree add /tmp/before df2409d && cp dyspec_nb/*.so /tmp/before/dyspec_nb/ && BEFORE=/tmp/before python nbs/experiments/step_choice.py
import os, sys, json, time, subprocess
from pathlib import Path
ROOT = Path(__file__).resolve().parents[2]
WORKER = sys.argv[1:] == ['--worker']            # serving the older checkout's decoders, its package first on PYTHONPATH
if not WORKER: sys.path.insert(0, str(ROOT))
import torch
from tqdm.auto import tqdm
from dyspec_nb.models import load_default_pair, hf_generate
from dyspec_nb.data import mtbench_prompts
from dyspec_nb.engine import SpecDecoder
if not WORKER: from dyspec_nb.timing import cpu_name, machine_fingerprint    # this checkout's, for the record (a worker runs an older one)

PROMPTS, NEW, BEFORE = int(os.environ.get('PROMPTS', 8)), int(os.environ.get('NEW', 64)), os.environ.get('BEFORE')
target, head, tok = load_default_pair()
token = load_default_pair('token')[1]
if WORKER:                                                                      # one request a line: [decoder, prompt ids, T, seed]
    decs = {'host default': SpecDecoder(target, head, step='host'), 'host default, token draft': SpecDecoder(target, token, step='host'),
            'host autoregressive': SpecDecoder(target, None, 'autoregressive', step='host')}
    for line in sys.stdin:
        k, ids, T, seed = json.loads(line)
        print(json.dumps(decs[k].generate(torch.tensor([ids]), max_new_tokens=NEW, temperature=T, seed=seed).tokens.tolist()), flush=True)
    sys.exit()
if BEFORE:
    worker = subprocess.Popen([sys.executable, __file__, '--worker'], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                              env=dict(os.environ, PYTHONPATH=str(Path(BEFORE).resolve())), cwd=BEFORE)
    def before(k, p, T, seed):
        "The older checkout's decoder `k` on prompt `p`: its tokens."
        worker.stdin.write(json.dumps([k, p[0].tolist(), T, seed]) + '\n'); worker.stdin.flush()
        return json.loads(worker.stdout.readline())
prompts = mtbench_prompts(tok, PROMPTS)
entry = dict(date=time.strftime('%Y-%m-%d'), machine=machine_fingerprint(), prompts=PROMPTS, new_tokens=NEW, temperatures={})
for T in (0.0, 0.6):
    decs = {'default': SpecDecoder(target, head), 'default, token draft': SpecDecoder(target, token),
            'autoregressive': SpecDecoder(target, None, 'autoregressive')}
    runs = {'target.generate': lambda p, i: hf_generate(target, p, NEW, temperature=T, seed=i)[0]}
    for k, d in decs.items(): runs[k] = lambda p, i, d=d: d.generate(p, max_new_tokens=NEW, temperature=T, seed=i).tokens.tolist()
    if BEFORE:
        for k in ('host default', 'host default, token draft', 'host autoregressive'): runs[f'before: {k}'] = lambda p, i, k=k: before(k, p, T, i)
    for f in runs.values(): f(prompts[0], 0)                                    # warm-up: first calls, the default's first steps
    secs, outs = {k: 0.0 for k in runs}, {k: [] for k in runs}
    bar = tqdm(total=len(prompts) * len(runs), desc=f'T = {T:g}: prompt x decoder')
    for i, p in enumerate(prompts):
        for k, f in runs.items():                                                # interleaved: every decoder on a prompt, then the next
            t = time.perf_counter(); o = f(p, i); secs[k] += time.perf_counter() - t; outs[k].append(o); bar.update()
    bar.close()
    rate = {k: sum(map(len, outs[k])) / secs[k] for k in runs}                  # tokens per second
    entry['temperatures'][f'{T:g}'] = dict(
        rows={k: dict(ms_per_token=1e3 / r, speedup=r / rate['target.generate'], identical=outs[k] == outs['target.generate'] if T == 0 else None) for k, r in rate.items()},
        device_settings={f'{b}/{d or "-"}': dict(tokens_per_s=t / s, steps=n) for (greedy, (b, d)), (t, s, n) in decs['default'].setting_runs.items() if greedy == (T == 0)})
out = Path(os.environ.get('OUT') or ROOT / 'results'); out.mkdir(parents=True, exist_ok=True)
path = out / 'step_choice.json'
rec = json.loads(path.read_text()) if path.exists() else {}
if BEFORE: entry['before'] = subprocess.run(['git', '-C', BEFORE, 'log', '-1', '--format=%h %cs'], capture_output=True, text=True).stdout.strip()
env = ''.join(f'{k}={v} ' for k, v in (('PROMPTS', PROMPTS), ('NEW', NEW)) if v != {'PROMPTS': 8, 'NEW': 64}[k])
rec[cpu_name()] = dict(command=env + ('BEFORE=<checkout of ' + entry['before'].split()[0] + '> ' if BEFORE else '') + 'python nbs/experiments/step_choice.py', **entry)
path.write_text(json.dumps(rec, indent=1) + '\n')
for T, t in entry['temperatures'].items():
    print(f'T = {T}: ' + '  '.join(f"{k} {r['ms_per_token']:.1f} ms/token ({r['speedup']:.2f}x)" for k, r in t['rows'].items()))
