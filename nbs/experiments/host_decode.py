"""The host decoding loop of experiments 23 and 24: the reference builders of 02_builders and the verifier of 03_verify
on real models, through the draft sessions of 06b_forward and 07c_head. Experiments whose builders or verifiers exist
only on the host (a variant to compare, a recorder) decode with it; the engine's one step is the tensor step of
07e_step. Not part of the package."""
import torch
from dyspec_nb.engine import GenerationStats, StepRecord, StepTrace
from dyspec_nb.builders import run_options
from dyspec_nb.forward import DraftSession, additive_mask, forward, keep_positions, new_cache, prefill
from dyspec_nb.head import HeadCache, HeadSession, is_head
from dyspec_nb.tree_attention import tree_mask
from dyspec_nb.verify import sampling_probs, verify_path

@torch.no_grad()
def host_decode(target, draft, build, budget, prompt, new_tokens, temperature=0.0, draft_temperature=0.6, seed=0, trace=False,
                verify=verify_path, **options):
    """Decode `prompt` (LongTensor[1, L]) with a host builder `build` (02_builders' contract): the draft's rows from a
    KV-cached `draft(tree, nodes)` session (`DraftSession`, `HeadSession`), one target forward over each tree with its
    ancestor mask, and `verify(tree, q, p, generator)`'s path kept in both caches; stops after an EOS token.
    `(tokens, GenerationStats)`, with a `StepTrace` in every record if `trace`."""
    seq = torch.as_tensor(prompt).reshape(-1).tolist()
    n0, head = len(seq), is_head(draft)
    e = target.generation_config.eos_token_id
    eos = set() if e is None else {e} if isinstance(e, int) else set(e)
    hidden = draft.config.layers if head else None                              # a feature head reads the target's features
    room = n0 + new_tokens + budget + 1
    tcache = new_cache(target, capacity=room)
    dcache = HeadCache(draft.config.hidden_size * len(draft.config.layers)) if head else new_cache(draft, capacity=room)
    out = prefill(target, torch.tensor(seq[:-1]), tcache, keep=torch.tensor([n0 - 2]), hidden=hidden)   # everything but the root
    if head: dcache.add_features(out[1], 0)
    g, options, stats = torch.Generator().manual_seed(seed), run_options(build, options), GenerationStats()
    while len(seq) - n0 < new_tokens:
        L = len(seq)
        session = (HeadSession if head else DraftSession)(draft, dcache, seq, dict(temperature=draft_temperature), True)
        tree, q = build(seq[-1], session, budget, g, **options)                  # q: [n, V]
        logits = forward(target, tree.tokens, tree.position_ids(L - 1), additive_mask(tree_mask(tree, L - 1), target.dtype), tcache, hidden=hidden)
        if head: logits, feats = logits                                         # feats: [n, 3H]
        p = sampling_probs(logits, temperature=temperature)                     # [n, V]
        nodes, emitted = verify(tree, q, p, g)
        stop = next((i + 1 for i, t in enumerate(emitted) if t in eos), len(emitted))   # through the first EOS token
        emitted = emitted[:min(stop, new_tokens - (L - n0))]
        path = torch.tensor([0] + nodes, dtype=torch.long)
        keep_positions(tcache, torch.cat([torch.arange(L - 1), L - 1 + path]))
        if head: dcache.add_features(feats[path], L - 1)
        session.keep_path(tree.tokens[nodes].tolist())
        stats.records.append(StepRecord(tree_size=tree.n - 1, depth=tree.depth, accepted=min(len(nodes), len(emitted)), emitted=len(emitted),
                                        trace=StepTrace.of(tree, q, p, nodes, emitted) if trace else None))
        seq += emitted
        if emitted[-1] in eos: break
    return seq[n0:], stats
