"""What the fixture makers share: make_fixtures.py (the tiny models of every
family) and make_fp8_fixtures.py (the same in the released fp8 layout).

The tiny models' common shapes and seed rules, the prompts, the routing
capture, the reference run (logits, routed experts and router scores,
greedy tokens, the KV-cache cross-check) with its acceptance rules, and
the writing of a fixture folder (reference.safetensors + reference.json,
copied into tests/fixtures/<name>/).  Importing it sets torch to 2 threads
and quiets transformers' logging.

Python is only a fixture-making tool; nothing in the runtime or build needs it.
"""
import json
import os
import shutil

import torch
import torch.nn.functional as F
from safetensors.torch import save_file

import transformers
from transformers import DynamicCache

torch.set_num_threads(2)
transformers.logging.set_verbosity_error()

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FIXTURES = os.path.join(REPO, "tests", "fixtures")

VOCAB = 256
GREEDY_TOKENS = 32
MIN_LOGIT_MARGIN = 1e-3
MIN_ROUTE_MARGIN = 1e-5
INIT_STD = 0.2
MAX_SEED_TRIES = 64
# token-by-token (KV cache) vs full-prefill logits: max abs diff <= KV_TOL * max(1, max|logit|)
KV_TOL = 1e-5

COMMON = dict(
    vocab_size=VOCAB,
    hidden_size=64,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    max_position_embeddings=512,
    initializer_range=INIT_STD,
    bos_token_id=None,
    eos_token_id=None,  # never stop early; all 32 greedy tokens come out
    pad_token_id=None,  # keep embedding row 0 a normal (non-padding) row
)
MOE = dict(num_experts_per_tok=2)
# MLA: no head_dim (it is qk_rope_head_dim), one K/V per query head
MLA_COMMON = {**{k: v for k, v in COMMON.items() if k != "head_dim"}, "num_key_value_heads": 4}


def make_prompts():
    g = torch.Generator().manual_seed(12345)
    prompts = []
    for i, n in enumerate((5, 12, 21)):
        p = torch.randint(0, VOCAB, (n,), generator=g)
        # include the extreme ids 0 and vocab-1 somewhere
        if i == 0:
            p[1] = 0
        if i == 1:
            p[0] = VOCAB - 1
            p[7] = 0
        if i == 2:
            p[3] = 0
            p[20] = VOCAB - 1
        prompts.append(p.to(torch.int64))
    return prompts


# --------------------------------------------------------------------------- routing capture

def moe_layout(model):
    """(list of router modules or None per layer, top_k, n_experts)."""
    routers = []
    k = e = None
    for layer in model.model.layers:
        block = (getattr(layer, "mlp", None) or getattr(layer, "block_sparse_moe", None)
                 or getattr(layer, "feed_forward", None))  # Llama-4
        gate = getattr(block, "gate", None) or getattr(block, "router", None)
        if gate is not None and hasattr(gate, "top_k") and hasattr(gate, "weight"):
            routers.append(gate)
            k, e = gate.top_k, gate.weight.shape[0]
        else:
            routers.append(None)
    if k is None:
        return None, None, None
    return routers, k, e


def router_choice(mod, logits, bias=None):
    """(scores whose top-K are the router's experts, margin of any group choice).

    Softmax routers: softmax(logits) in fp32.  The sigmoid router of GLM-4.5 /
    DeepSeek-V3 (a module with e_score_correction_bias): sigmoid(logits) + bias,
    -inf outside the topk_group groups whose two best scores sum highest.
    MiniMax-M2's router is handed the bias (a buffer of its MoE block): the
    sigmoids plus it, no groups."""
    logits = logits.float()
    if bias is not None:
        return logits.sigmoid() + bias.float(), float("inf")
    if getattr(mod, "topk_method", None) == "group_limited_greedy":
        # DeepSeek-V2: softmax, only the topk_group groups with the best expert
        p = F.softmax(logits, dim=-1)
        G, k = mod.num_group, mod.topk_group
        per = p.shape[-1] // G
        gs = p.view(-1, G, per).max(dim=-1).values
        srt = gs.sort(dim=-1, descending=True).values
        gmargin = float((srt[:, k - 1] - srt[:, k]).min()) if k < G else float("inf")
        keep = torch.zeros_like(gs, dtype=torch.bool).scatter_(1, gs.topk(k, dim=-1)[1], True)
        return p.masked_fill(~keep.repeat_interleave(per, dim=1), float("-inf")), gmargin
    if not hasattr(mod, "e_score_correction_bias"):
        return F.softmax(logits, dim=-1), float("inf")
    c = logits.sigmoid() + mod.e_score_correction_bias.float()
    G, k = mod.num_group, mod.topk_group
    per = c.shape[-1] // G
    gs = c.view(-1, G, per).topk(2, dim=-1)[0].sum(-1)
    srt = gs.sort(dim=-1, descending=True).values
    gmargin = float((srt[:, k - 1] - srt[:, k]).min()) if k < G else float("inf")
    keep = torch.zeros_like(gs, dtype=torch.bool).scatter_(1, gs.topk(k, dim=-1)[1], True)
    return c.masked_fill(~keep.repeat_interleave(per, dim=1), float("-inf")), gmargin


class RouterRecorder:
    """Forward hooks on the router (TopKRouter) modules.

    In transformers 5 each family's router returns (router_logits, router_scores,
    router_indices); indices come from torch.topk over softmax(logits) in fp32,
    or, for the sigmoid router, over its choice scores (router_choice) with
    sorted=False: those are put in descending order of choice score here."""

    def __init__(self, routers):
        self.routers = routers
        self.calls = [[] for _ in routers]
        self.handles = []
        for li, r in enumerate(routers):
            if r is not None:
                self.handles.append(r.register_forward_hook(self._hook(li)))

    def _hook(self, li):
        def fn(mod, inp, out):
            if len(out) == 2:  # Llama-4's router: (scores, logits), the top-K logits chosen
                logits = out[1]
                idx = torch.topk(logits, mod.top_k, dim=-1).indices
            else:
                logits, _scores, idx = out
            bias = inp[1] if len(inp) > 1 else None  # MiniMax-M2: the block's bias
            probs, gmargin = router_choice(mod, logits, bias)
            if hasattr(mod, "e_score_correction_bias") or hasattr(mod, "topk_method") or bias is not None:
                order = torch.argsort(torch.gather(probs, 1, idx), dim=1, descending=True)
                idx = torch.gather(idx, 1, order)
            self.calls[li].append((idx.detach().clone(), probs.detach().clone(), gmargin))
        return fn

    def reset(self):
        self.calls = [[] for _ in self.routers]

    def close(self):
        for h in self.handles:
            h.remove()


def route_margin(probs, k):
    s = torch.sort(probs, dim=-1, descending=True).values
    return float((s[:, k - 1] - s[:, k]).min())

# --------------------------------------------------------------------------- reference run

def load(path, dtype, experts="eager"):
    # eager attention and the eager (per-expert loop) experts implementation from
    # modeling_<family>.py; experts=None keeps transformers' default (grouped_mm)
    kw = dict(dtype=dtype, attn_implementation="eager")
    if experts is not None:
        kw["experts_implementation"] = experts
    m = transformers.AutoModelForCausalLM.from_pretrained(path, **kw)
    m.eval()
    return m


@torch.no_grad()
def reference_outputs(model, prompts):
    """Returns (tensors dict, stats dict) or raises ValueError on a failed check."""
    routers, K, E = moe_layout(model)
    L = len(model.model.layers)
    rec = RouterRecorder(routers) if routers else None
    out = {}
    min_logit = float("inf")
    min_route = float("inf")
    used = [set() for _ in range(L)]
    kv_rel = 0.0
    absmax = 0.0
    for pi, p in enumerate(prompts):
        S = p.numel()
        ids = p.view(1, -1)
        if rec:
            rec.reset()
        logits = model(input_ids=ids, use_cache=False).logits[0].float()
        out[f"prompt.{pi}"] = p.to(torch.int32)
        out[f"logits.{pi}"] = logits.contiguous()
        absmax = max(absmax, float(logits.abs().max()))
        if rec:
            experts = torch.full((L, S, K), -1, dtype=torch.int32)
            rprobs = torch.full((L, S, E), -1.0, dtype=torch.float32)
            for li, r in enumerate(routers):
                if r is None:
                    continue
                assert len(rec.calls[li]) == 1, "router called more than once"
                idx, pr, gm = rec.calls[li][0]
                experts[li] = idx.to(torch.int32)
                rprobs[li] = pr
                used[li].update(idx.flatten().tolist())
                # the router's choice must equal topk over the recorded probs
                assert torch.equal(torch.topk(pr, K, dim=-1).indices, idx)
                min_route = min(min_route, route_margin(pr, K), gm)
            out[f"experts.{pi}"] = experts
            out[f"router_probs.{pi}"] = rprobs.contiguous()

        # harness sanity: token-by-token with the KV cache equals the full prefill
        cache = DynamicCache(config=model.config)
        steps = []
        for t in range(S):
            o = model(input_ids=ids[:, t:t + 1], cache=cache, use_cache=True)
            steps.append(o.logits[0, -1].float())
        inc = torch.stack(steps)
        d = float((inc - logits).abs().max())
        scale = max(1.0, float(logits.abs().max()))
        kv_rel = max(kv_rel, d / scale)
        if d > KV_TOL * scale:
            raise RuntimeError(f"prompt {pi}: incremental vs prefill logits differ by {d}")

        # greedy generation (no eos, no processors that change logits)
        if rec:
            rec.reset()
        g = model.generate(
            ids, attention_mask=torch.ones_like(ids), do_sample=False,
            max_new_tokens=GREEDY_TOKENS, min_new_tokens=GREEDY_TOKENS,
            eos_token_id=None, pad_token_id=0, output_logits=True,
            return_dict_in_generate=True, use_cache=True)
        new = g.sequences[0, S:]
        if new.numel() != GREEDY_TOKENS:
            raise RuntimeError("generate did not produce 32 tokens")
        for step, lg in enumerate(g.logits):
            lg = lg[0].float()
            top2 = torch.topk(lg, 2).values
            min_logit = min(min_logit, float(top2[0] - top2[1]))
            if int(lg.argmax()) != int(new[step]):
                raise RuntimeError("generate token is not the argmax of its logits")
        # also the last prompt position's logit margin (first greedy token)
        if rec:
            for li, r in enumerate(routers):
                if r is not None:
                    for _idx, pr, gm in rec.calls[li]:
                        min_route = min(min_route, route_margin(pr, K), gm)
        # cross-check: a full forward over prompt+generated agrees with greedy
        full = model(input_ids=g.sequences, use_cache=False).logits[0].float()
        am = full[S - 1:S - 1 + GREEDY_TOKENS].argmax(-1)
        if not torch.equal(am, new):
            raise ValueError("full-forward argmax disagrees with cached greedy")
        out[f"greedy.{pi}"] = new.to(torch.int32).contiguous()
    if rec:
        rec.close()
    stats = dict(min_logit_margin=min_logit,
                 min_route_margin=(min_route if routers else None),
                 experts_used=[sorted(u) for u in used] if routers else None,
                 kv_rel=kv_rel, logit_absmax=absmax)
    return out, stats


def check_stats(stats):
    if stats["min_logit_margin"] < MIN_LOGIT_MARGIN:
        return f"logit margin {stats['min_logit_margin']:.3g}"
    if stats["min_route_margin"] is not None:
        if stats["min_route_margin"] < MIN_ROUTE_MARGIN:
            return f"route margin {stats['min_route_margin']:.3g}"
        for li, u in enumerate(stats["experts_used"]):
            if u and len(u) < 6:
                return f"layer {li} uses only experts {u}"
    return None


# --------------------------------------------------------------------------- building and writing

def randomize_router_bias(model, spec):
    """transformers initialises e_score_correction_bias to zeros; with
    spec["router_bias_range"] a, each becomes uniform in [-a, a) (from torch's
    generator), so the choice differs from the weighting."""
    if "router_bias_range" in spec:
        a = spec["router_bias_range"]
        with torch.no_grad():
            for layer in model.model.layers:
                b = getattr(getattr(layer.mlp, "gate", None), "e_score_correction_bias", None)
                if b is None:  # MiniMax-M2: a buffer of the MoE block
                    b = getattr(layer.mlp, "e_score_correction_bias", None)
                if b is not None:
                    b.copy_((torch.rand(b.shape) * 2 - 1) * a)


def check_default_experts(name, path, prompts, tensors, stats):
    """transformers' default experts implementation (grouped_mm) reads the
    model in path to the eager loop's logits (tensors) within KV_TOL; returns
    its name."""
    dm = load(path, torch.float32, experts=None)
    with torch.no_grad():
        for pi, p in enumerate(prompts):
            lg = dm(input_ids=p.view(1, -1), use_cache=False).logits[0]
            d = float((lg - tensors[f"logits.{pi}"]).abs().max())
            if d > KV_TOL * max(1.0, stats["logit_absmax"]):
                raise RuntimeError(f"{name}: experts implementations differ by {d}")
    return dm.config._experts_implementation


def tensor_index(tensors):
    """reference.json's "tensors": name -> dtype and shape."""
    return {k: dict(dtype=str(v.dtype).replace("torch.", ""), shape=list(v.shape))
            for k, v in sorted(tensors.items())}


def write_json(path, obj):
    with open(path, "w") as f:
        json.dump(obj, f, indent=2, sort_keys=False)
        f.write("\n")


def update_json(path, change):
    """Rewrites the JSON file at path after change(obj) edits it in place;
    returns obj."""
    with open(path) as f:
        obj = json.load(f)
    change(obj)
    write_json(path, obj)
    return obj


def write_reference(path, tensors, ref):
    """reference.safetensors (tensors) and reference.json (ref) into path."""
    save_file({k: v.contiguous() for k, v in sorted(tensors.items())},
              os.path.join(path, "reference.safetensors"))
    write_json(os.path.join(path, "reference.json"), ref)


def install_fixture(path, name):
    """Copies the folder path to tests/fixtures/<name>, replacing it; returns
    the new folder."""
    dst = os.path.join(FIXTURES, name)
    if os.path.exists(dst):
        shutil.rmtree(dst)
    shutil.copytree(path, dst)
    return dst


def tensor_sizes(path):
    return sum(os.path.getsize(os.path.join(path, f)) for f in os.listdir(path))
