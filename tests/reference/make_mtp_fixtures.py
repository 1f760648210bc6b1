#!/usr/bin/env python3
"""Build the multi-token-prediction (MTP) reference fixtures used by moerun's
tests: tests/fixtures/deepseek_v3_mtp/ (MLA attention) and
tests/fixtures/glm4_moe_mtp/ (GQA attention).

Python is only a fixture-making tool; nothing in the runtime or build needs it.

Each folder is a tiny random checkpoint in the released DeepSeek-V3 / GLM-4.5
layout: config.json says num_hidden_layers L and num_nextn_predict_layers 1,
and the safetensors hold the L target layers plus layer index L, the MTP
module:
  model.layers.L.embed_tokens.weight        (V, D)  equal to model.embed_tokens
  model.layers.L.enorm.weight               (D)     RMSNorm of the embedding
  model.layers.L.hnorm.weight               (D)     RMSNorm of the hidden state
  model.layers.L.eh_proj.weight             (D, 2D) Linear, no bias
  model.layers.L.shared_head.norm.weight    (D)
  model.layers.L.shared_head.head.weight    (V, D)  its own values, not lm_head
  model.layers.L.{input_layernorm, self_attn.*, post_attention_layernorm, mlp.*}
                                                    a MoE decoder layer, named as
                                                    the target's layers are
transformers does not run MTP layers: the target is transformers'
from_pretrained of the folder (the layer-L keys are unexpected and ignored),
and the MTP reference runs transformers' own modules (the family's decoder
layer, rotary embedding, causal mask and RMSNorm, loaded from the folder)
with the glue of vLLM's deepseek_mtp.py / glm4_moe_mtp.py:
  x_i = eh_proj(cat[enorm(embed_L(t_{i+1})), hnorm(h_i)])   (embedding first)
  o_i = decoder_layer_L(x, rotary position i, causal over the MTP rows)
  logits_i = shared_head.head(shared_head.norm(o_i))
where h_i is the target's last hidden state (after its final norm).  Unlike
vLLM, the embedding at position 0 is not zeroed.

Seeds follow make_fixtures.py's rules (tests/reference/fixture_common.py),
plus: every MTP argmax (teacher-forced rows and drafts) has a top1-top2 logit
gap >= 1e-3, and every routing decision of the MTP layer has the router margin.

Usage: python tests/reference/make_mtp_fixtures.py [--only name,name]
"""
import argparse
import os
import shutil
import sys
import tempfile

import torch
import torch.nn.functional as F
from safetensors import safe_open
from safetensors.torch import save_file

import transformers
from transformers.masking_utils import create_causal_mask

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fixture_common import (MAX_SEED_TRIES, MIN_LOGIT_MARGIN, MIN_ROUTE_MARGIN,  # noqa: E402
                            INIT_STD, RouterRecorder, check_stats, install_fixture, load,
                            make_prompts, route_margin, tensor_index, tensor_sizes, update_json,
                            write_reference, reference_outputs)
from make_fixtures import build_model, detect_layout, fixture_specs  # noqa: E402

GREEDY = 16      # target greedy tokens recorded
DRAFTS = 4       # MTP greedy drafts recorded after each prompt
NORM_JITTER = 0.1  # MTP RMSNorm weights are 1 + NORM_JITTER * randn

# name -> (target fixture of make_fixtures.py whose configuration is reused,
#          base seed, config changes).  L = 2 target layers (layer 0 dense,
# layer 1 MoE) and narrower FFNs (experts and shared expert 8, dense 48) keep
# each folder under 1 MB; the attention, the routing (16 experts in 4 groups,
# 2 groups eligible, top-3) and every other shape are the target fixture's.
SMALL = dict(num_hidden_layers=2, moe_intermediate_size=8, intermediate_size=48)
MTP_FIXTURES = {
    "deepseek_v3_mtp": ("deepseek_v3", 14500, SMALL),
    "glm4_moe_mtp": ("glm4_moe", 8500, SMALL),
}

RULES = [
    "hidden.p = the target's model.model(prompt).last_hidden_state (after the final norm); "
    "logits.p = lm_head(hidden.p).",
    "MTP row i (i = 0..S-2) takes token t_{i+1} and hidden h_i: "
    "x_i = eh_proj(cat[enorm(embed_L(t_{i+1})), hnorm(h_i)]) (embedding first, hidden second); "
    "the embedding at position 0 is not zeroed (vLLM zeroes it).",
    "The MTP rows run through decoder layer L (the family's decoder layer: input_layernorm, "
    "attention, residual, post_attention_layernorm, MoE, residual) at rotary positions 0.., "
    "causal attention over the MTP rows only; its output is o_i = mtp_out.p[i].",
    "mtp_logits.p[i] = shared_head.head(shared_head.norm(o_i)).",
    "mtp_greedy.p: d_1 = argmax mtp_logits.p[S-2]; for j = 1..3 a row at position S-2+j takes "
    "d_j and hidden o of the previous MTP row, attends over all earlier MTP rows, and "
    "d_{j+1} = argmax of its logits.",
    "greedy.p = the target's own greedy continuation (no EOS).",
    "experts.p / router_probs.p as in the other fixtures (target layers); mtp_experts.p = the "
    "MTP layer's top-k experts for the teacher-forced rows in descending choice score.",
]


def mtp_config(spec, changes):
    """The target fixture's config with changes applied and one more layer
    (index L, the MTP layer's decoder block)."""
    cfg = spec["config"]()
    for k, v in changes.items():
        setattr(cfg, k, v)
    cfg.num_hidden_layers = changes["num_hidden_layers"] + 1
    return cfg


def add_mtp_weights(model, L):
    """The MTP-only tensors (from torch's generator after the model's own
    initialisation), named as the released checkpoints name them."""
    D = model.config.hidden_size
    V = model.config.vocab_size
    pre = f"model.layers.{L}."
    return {
        pre + "embed_tokens.weight": model.model.embed_tokens.weight.detach().clone(),
        pre + "enorm.weight": 1.0 + NORM_JITTER * torch.randn(D),
        pre + "hnorm.weight": 1.0 + NORM_JITTER * torch.randn(D),
        pre + "eh_proj.weight": INIT_STD * torch.randn(D, 2 * D),
        pre + "shared_head.norm.weight": 1.0 + NORM_JITTER * torch.randn(D),
        pre + "shared_head.head.weight": INIT_STD * torch.randn(V, D),
    }


def rewrite_checkpoint(path, L, extra):
    """config.json: num_hidden_layers L, num_nextn_predict_layers 1;
    model.safetensors gains the MTP-only tensors."""
    fn = os.path.join(path, "model.safetensors")
    assert sorted(f for f in os.listdir(path) if f.endswith(".safetensors")) == \
        ["model.safetensors"]
    with safe_open(fn, "pt") as h:
        meta = h.metadata()
        t = {k: h.get_tensor(k) for k in h.keys()}
    assert any(k.startswith(f"model.layers.{L}.mlp.experts") for k in t), "layer L is not MoE"
    for k, v in extra.items():
        assert k not in t, k
        t[k] = v.contiguous()
    save_file(dict(sorted(t.items())), fn, metadata=meta)

    def change(cfg):
        cfg["num_hidden_layers"] = L
        cfg["num_nextn_predict_layers"] = 1
    update_json(os.path.join(path, "config.json"), change)


class MtpLayer:
    """The MTP module read from a fixture folder: transformers' (L+1)-layer
    model of the folder supplies decoder layer L, the rotary embedding and the
    causal mask; the MTP-only tensors come from the safetensors file."""

    def __init__(self, path, L):
        cfg = transformers.AutoConfig.from_pretrained(path)
        cfg.num_hidden_layers = L + 1
        self.model = transformers.AutoModelForCausalLM.from_pretrained(
            path, config=cfg, dtype=torch.float32, attn_implementation="eager",
            experts_implementation="eager")
        self.model.eval()
        self.L = L
        pre = f"model.layers.{L}."
        with safe_open(os.path.join(path, "model.safetensors"), "pt") as h:
            w = {k[len(pre):]: h.get_tensor(k) for k in h.keys() if k.startswith(pre)}
        # decoder layer L loaded by transformers equals the file's tensors
        sd = self.model.model.layers[L].state_dict()
        for k in ("input_layernorm.weight", "post_attention_layernorm.weight",
                  "mlp.gate.weight", "mlp.gate.e_score_correction_bias"):
            assert torch.equal(sd[k], w[k]), k
        norm_cls = type(self.model.model.norm)
        eps = cfg.rms_norm_eps

        def rms(name):
            n = norm_cls(cfg.hidden_size, eps=eps)
            with torch.no_grad():
                n.weight.copy_(w[name])
            return n.eval()
        self.embed = w["embed_tokens.weight"]
        self.enorm = rms("enorm.weight")
        self.hnorm = rms("hnorm.weight")
        self.eh_proj = w["eh_proj.weight"]
        self.head_norm = rms("shared_head.norm.weight")
        self.head = w["shared_head.head.weight"]
        self.layer = self.model.model.layers[L]
        self.recorder = RouterRecorder([None] * L + [self.layer.mlp.gate])

    @torch.no_grad()
    def __call__(self, tokens, hidden):
        """tokens (N,) int64, hidden (N, D) -> (o (N, D), logits (N, V)); the
        rows are MTP positions 0..N-1."""
        N = tokens.numel()
        e = F.embedding(tokens, self.embed)
        x = F.linear(torch.cat([self.enorm(e), self.hnorm(hidden)], dim=-1), self.eh_proj)
        x = x.view(1, N, -1)
        pos = torch.arange(N).view(1, N)
        m = self.model.model
        mask = create_causal_mask(config=m.config, inputs_embeds=x, attention_mask=None,
                                  cache=None, position_ids=pos)
        pe = m.rotary_emb(x, pos)
        o = self.layer(x, attention_mask=mask, position_ids=pos, cache=None, use_cache=False,
                       position_embeddings=pe)[0]
        return o, F.linear(self.head_norm(o), self.head)


def top2_margin(logits):
    """Smallest top1-top2 gap over the rows of logits (N, V)."""
    t = torch.topk(logits, 2, dim=-1).values
    return float((t[:, 0] - t[:, 1]).min())


@torch.no_grad()
def mtp_reference(mtp, target, prompts):
    """MTP reference tensors and stats; the target supplies hidden states."""
    out = {}
    min_logit = float("inf")
    min_route = float("inf")
    used = set()
    K = mtp.layer.mlp.gate.top_k
    tf_rel = 0.0
    for pi, p in enumerate(prompts):
        S = p.numel()
        ids = p.view(1, -1)
        hidden = target.model(input_ids=ids, use_cache=False).last_hidden_state[0].float()
        logits = target(input_ids=ids, use_cache=False).logits[0].float()
        # the recorded logits are lm_head of the recorded hidden state
        assert torch.equal(F.linear(hidden, target.lm_head.weight), logits)
        out[f"hidden.{pi}"] = hidden.contiguous()

        mtp.recorder.reset()
        o, lg = mtp(p[1:], hidden[:-1])
        assert len(mtp.recorder.calls[mtp.L]) == 1
        idx, probs, gm = mtp.recorder.calls[mtp.L][0]
        assert torch.equal(torch.topk(probs, K, dim=-1).indices, idx)
        min_route = min(min_route, route_margin(probs, K), gm)
        used.update(idx.flatten().tolist())
        out[f"mtp_out.{pi}"] = o.contiguous()
        out[f"mtp_logits.{pi}"] = lg.contiguous()
        out[f"mtp_experts.{pi}"] = idx.to(torch.int32).contiguous()
        min_logit = min(min_logit, top2_margin(lg))

        # drafts: recompute the whole MTP sequence, teacher-forced rows then
        # the recursion rows (each takes the previous row's draft and output)
        toks, hids = p[1:].clone(), hidden[:-1].clone()
        d = int(lg[-1].argmax())
        drafts = [d]
        last_o = o[-1]
        for _ in range(DRAFTS - 1):
            toks = torch.cat([toks, torch.tensor([d])])
            hids = torch.cat([hids, last_o.view(1, -1)])
            mtp.recorder.reset()
            o2, lg2 = mtp(toks, hids)
            _i, pr, gm = mtp.recorder.calls[mtp.L][0]
            min_route = min(min_route, route_margin(pr, K), gm)
            # the teacher-forced rows do not see the later rows
            scale = max(1.0, float(lg.abs().max()))
            tf_rel = max(tf_rel, float((lg2[:S - 1] - lg).abs().max()) / scale)
            min_logit = min(min_logit, top2_margin(lg2[-1:]))
            d = int(lg2[-1].argmax())
            drafts.append(d)
            last_o = o2[-1]
        out[f"mtp_greedy.{pi}"] = torch.tensor(drafts, dtype=torch.int32)
    return out, dict(min_logit_margin=min_logit, min_route_margin=min_route,
                     experts_used=sorted(used), teacher_forced_rel_diff=tf_rel)


def make_fixture(name, target_name, base, changes, prompts):
    spec = dict(fixture_specs()[target_name])
    spec["config"] = (lambda f: lambda: mtp_config({"config": f}, changes))(spec["config"])
    L = changes["num_hidden_layers"]
    last_err = None
    for seed in range(base, base + MAX_SEED_TRIES):
        model = build_model(spec, seed)  # L + 1 layers, router biases randomized
        assert len(model.model.layers) == L + 1
        extra = add_mtp_weights(model, L)
        tmp = tempfile.mkdtemp(prefix=f"fx_{name}_")
        try:
            model.save_pretrained(tmp)
            rewrite_checkpoint(tmp, L, extra)
            layout = detect_layout(tmp)

            # the target: transformers reads the folder as an L-layer model
            target = load(tmp, torch.float32)
            assert target.config.num_hidden_layers == L and len(target.model.layers) == L
            own = model.state_dict()
            for k, v in target.state_dict().items():
                assert torch.equal(v, own[k]), k
            # ...with the logits of the built model's first L layers
            model.config.num_hidden_layers = L
            model.set_attn_implementation("eager")
            model.set_experts_implementation("eager")
            with torch.no_grad():
                for p in prompts:
                    a = model(input_ids=p.view(1, -1), use_cache=False).logits
                    b = target(input_ids=p.view(1, -1), use_cache=False).logits
                    if not torch.equal(a, b):
                        raise RuntimeError(f"{name}: from_pretrained target logits differ "
                                           f"by {float((a - b).abs().max())}")

            tensors, stats = reference_outputs(target, prompts)
            bad = check_stats(stats)
            if not bad:
                mtp = MtpLayer(tmp, L)
                mt, ms = mtp_reference(mtp, target, prompts)
                mtp.recorder.close()
                if ms["min_logit_margin"] < MIN_LOGIT_MARGIN:
                    bad = f"MTP logit margin {ms['min_logit_margin']:.3g}"
                elif ms["min_route_margin"] < MIN_ROUTE_MARGIN:
                    bad = f"MTP route margin {ms['min_route_margin']:.3g}"
                elif len(ms["experts_used"]) < 6:
                    bad = f"MTP layer uses only experts {ms['experts_used']}"
                elif ms["teacher_forced_rel_diff"] > 1e-5:
                    raise RuntimeError(f"{name}: MTP rows depend on later rows")
            if bad:
                print(f"  {name}: seed {seed} rejected ({bad})", flush=True)
                last_err = bad
                continue
            for pi in range(len(prompts)):
                tensors[f"greedy.{pi}"] = tensors[f"greedy.{pi}"][:GREEDY].contiguous()
            tensors.update(mt)
            cfg = target.config
            ref = {
                "family": cfg.model_type,
                "architecture": type(target).__name__,
                "seed": seed,
                "dtype": "float32",
                "n_prompts": len(prompts),
                "num_hidden_layers": L,
                "num_nextn_predict_layers": 1,
                "mtp_layer": f"model.layers.{L}",
                "greedy_tokens": GREEDY,
                "mtp_drafts": DRAFTS,
                "min_logit_margin": stats["min_logit_margin"],
                "min_route_margin": stats["min_route_margin"],
                "mtp_min_logit_margin": ms["min_logit_margin"],
                "mtp_min_route_margin": ms["min_route_margin"],
                "expert_layout": layout,
                "experts_used_per_layer": stats["experts_used"],
                "mtp_experts_used": ms["experts_used"],
                "kv_cache_max_rel_diff": stats["kv_rel"],
                "max_abs_logit": stats["logit_absmax"],
                "attn_implementation": "eager",
                "experts_implementation": "eager",
                "glue": "vLLM deepseek_mtp.py / glm4_moe_mtp.py (DeepSeekMultiTokenPredictorLayer, "
                        "Glm4MoeMultiTokenPredictorLayer) without the position-0 embedding mask",
                "rules": RULES,
                "transformers_version": transformers.__version__,
                "torch_version": torch.__version__.split("+")[0],
                "tensors": tensor_index(tensors),
            }
            write_reference(tmp, tensors, ref)
            dst = install_fixture(tmp, name)
            print(f"{name}: seed {seed} L {L} logit margin {stats['min_logit_margin']:.4g} "
                  f"MTP logit margin {ms['min_logit_margin']:.4g} route margins "
                  f"{stats['min_route_margin']:.3g}/{ms['min_route_margin']:.3g} "
                  f"size {tensor_sizes(dst)} B", flush=True)
            return ref
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    raise RuntimeError(f"{name}: no acceptable seed ({last_err})")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", default="")
    args = ap.parse_args()
    only = [s for s in args.only.split(",") if s]
    prompts = make_prompts()
    for name, (target_name, base, changes) in MTP_FIXTURES.items():
        if only and name not in only:
            continue
        make_fixture(name, target_name, base, changes, prompts)


if __name__ == "__main__":
    sys.exit(main())
