# A 7B-shaped GGUF on this machine: loaded straight from the file onto packed weights, decoded, and beside llama.cpp.
#
# No 7B GGUF is reachable from these machines (no hub), so the script writes one: Llama-2-7B's shapes (hidden 4096,
# 32 layers of 32 heads, MLP 11008) with SmolLM2-135M-Instruct's tokenizer and vocabulary (49152, copied from the
# embedded GGUF's metadata), every product Q4_0 (random nibbles, a fixed scale), the embedding Q4_0, the output layer
# Q8_0, norms 1. Its text is noise; what it measures is memory and speed, which do not depend on the values:
# - how much memory loading it takes: `load_gguf_packed` (05_models) in a fresh process, its peak resident memory;
#   and what the dense route (transformers' dequantisation to float32) says on this machine;
# - the engine's plain path, greedy, ms/token, and llama.cpp (llama-cpp-python, `bench.llama_cpp_decoder`) on the same
#   file and prompt tokens, interleaved, 3 prompts x NEW tokens.
# Writes results/big_gguf.json. Run from the repository root: python nbs/experiments/big_gguf.py (about 10 minutes;
# the file, about 4 GB, goes to $BIG_GGUF_DIR, default /tmp).
import json, os, subprocess, sys, time
from pathlib import Path
import numpy as np

OUT = Path('results/big_gguf.json')
DIR = Path(os.environ.get('BIG_GGUF_DIR', '/tmp'))
NEW = int(os.environ.get('NEW', 32))
H, L, HEADS, I = 4096, 32, 32, 11008

def write_gguf(path):
    "The 7B-shaped Llama GGUF described above, written tensor by tensor."
    import gguf
    from dyspec_nb.models import smollm2_gguf
    src = gguf.GGUFReader(str(smollm2_gguf()))
    V = int(src.fields['llama.vocab_size'].contents())
    w = gguf.GGUFWriter(str(path), 'llama')
    w.add_block_count(L); w.add_context_length(4096); w.add_embedding_length(H); w.add_feed_forward_length(I)
    w.add_head_count(HEADS); w.add_head_count_kv(HEADS); w.add_rope_dimension_count(H // HEADS); w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5); w.add_vocab_size(V); w.add_file_type(2)
    for k, f in src.fields.items():                                        # the tokenizer and its chat template, as the embedded file has them
        if k.startswith('tokenizer.'):
            t = gguf.GGUFValueType(f.types[0])
            w.add_key_value(k, f.contents(), t, gguf.GGUFValueType(f.types[-1]) if t == gguf.GGUFValueType.ARRAY else None)
    g = np.random.default_rng(0)
    def q4_0(n, k, d=0.002):                                                # Q4_0 rows: a float16 scale and 16 bytes of nibbles a block
        b = g.integers(0, 256, (n, k // 32, 18), dtype=np.uint8)
        b[..., :2] = np.frombuffer(np.float16(d).tobytes(), np.uint8)
        return b.reshape(n, k // 32 * 18)
    def q8_0(n, k, d=0.0005):
        b = g.integers(0, 256, (n, k // 32, 34), dtype=np.uint8)
        b[..., :2] = np.frombuffer(np.float16(d).tobytes(), np.uint8)
        return b.reshape(n, k // 32 * 34)
    Q4, Q8 = gguf.GGMLQuantizationType.Q4_0, gguf.GGMLQuantizationType.Q8_0
    w.add_tensor('token_embd.weight', q4_0(V, H, 0.01), raw_dtype=Q4)
    for i in range(L):
        w.add_tensor(f'blk.{i}.attn_norm.weight', np.ones(H, np.float32)); w.add_tensor(f'blk.{i}.ffn_norm.weight', np.ones(H, np.float32))
        for name, (n, k) in dict(attn_q=(H, H), attn_k=(H, H), attn_v=(H, H), attn_output=(H, H), ffn_gate=(I, H), ffn_up=(I, H), ffn_down=(H, I)).items():
            w.add_tensor(f'blk.{i}.{name}.weight', q4_0(n, k), raw_dtype=Q4)
    w.add_tensor('output_norm.weight', np.ones(H, np.float32))
    w.add_tensor('output.weight', q8_0(V, H), raw_dtype=Q8)
    w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()

def child(path):
    "In a fresh process: load, decode, beside llama.cpp; prints the record's part as JSON."
    import torch
    from dyspec_nb.models import load_gguf_packed, peak_memory, load_gguf, available_memory, weight_count
    from dyspec_nb.engine import SpecDecoder
    from dyspec_nb.bench import llama_cpp_decoder
    t0 = time.perf_counter(); model, tok = load_gguf_packed(path); load_s = time.perf_counter() - t0
    peak_load = peak_memory()
    try: load_gguf(path); dense = 'loaded'
    except ValueError as e: dense = str(e)
    prompts = [tok(p, return_tensors='pt').input_ids for p in ('The history of', 'def main():', 'Speculative decoding is')]
    plain, llama = SpecDecoder(model, None, 'autoregressive'), llama_cpp_decoder(path)
    plain.generate(prompts[0], max_new_tokens=4); llama(prompts[0], 4, 0.0, 0)   # warm-up
    rows = []
    for p in prompts:
        o = plain.generate(p, max_new_tokens=NEW, eos_token_id=-1)
        toks, secs = llama(p, NEW, 0.0, 0)
        rows.append(dict(prompt_tokens=p.shape[1], engine_ms_per_token=1e3 * o.stats.seconds / len(o.tokens), engine_tokens=len(o.tokens),
                         llama_cpp_ms_per_token=1e3 * secs / max(1, len(toks)), llama_cpp_tokens=len(toks)))
    packed = sum(m.product()[1].numel() for m in model.modules() if hasattr(m, 'product'))
    print(json.dumps(dict(load_seconds=load_s, peak_memory_after_load_mb=peak_load / 2**20, peak_memory_mb=peak_memory() / 2**20,
                          packed_bytes=packed, float_bytes=sum(p.numel() * 4 for p in model.parameters()), weights=weight_count(path),
                          available_memory_mb=(available_memory() or 0) / 2**20, dense_route=dense, threads=torch.get_num_threads(), rows=rows)))

if __name__ == '__main__':
    if len(sys.argv) > 1: child(sys.argv[1]); sys.exit()
    import torch
    from dyspec_nb.timing import cpu_name
    path = DIR / 'llama-7b-shaped-q4_0.gguf'
    t0, written = time.perf_counter(), not path.exists()
    if written: write_gguf(path)
    write_s = time.perf_counter() - t0 if written else None                 # None: the file was there from an earlier run
    r = subprocess.run([sys.executable, __file__, str(path)], capture_output=True, text=True)
    if r.returncode: sys.exit(r.stderr[-3000:])
    rec = json.loads(r.stdout.strip().splitlines()[-1])
    eng = sum(x['engine_ms_per_token'] for x in rec['rows']) / len(rec['rows']); lc = sum(x['llama_cpp_ms_per_token'] for x in rec['rows']) / len(rec['rows'])
    rec.update(command='python nbs/experiments/big_gguf.py', date=time.strftime('%Y-%m-%d'), cpu=cpu_name(), file_bytes=path.stat().st_size,
               write_seconds=write_s, new_tokens=NEW, engine_ms_per_token=eng, llama_cpp_ms_per_token=lc,
               shape=dict(hidden=H, layers=L, heads=HEADS, intermediate=I, products='Q4_0', output='Q8_0'))
    OUT.write_text(json.dumps(rec, indent=1) + '\n')
    print(json.dumps({k: v for k, v in rec.items() if k != 'rows'}, indent=1))
