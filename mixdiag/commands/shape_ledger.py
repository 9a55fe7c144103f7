"""``mixdiag ledger``: the article's shape ledger (mixed step vs pure-decode step) for any model."""
from __future__ import annotations

from mixdiag.fmt import ms
from mixdiag.ledger import shapes as L
from mixdiag.ledger.device_model import DEVICES, device, predict


def register(sub, common):
    p = sub.add_parser("ledger", parents=[common], help="bytes/rows/graph mode of a mixed step vs a pure-decode step",
                       description="Print the shape ledger of one mixed step (a prefill chunk plus the running "
                                   "decodes) next to the pure-decode step: DP gather, MoE dispatch/combine, "
                                   "sparse-attention KV reads, indexer scores, MTP rows, CUDA-graph mode; plus "
                                   "the spike height a roofline device model predicts.")
    g = p.add_argument_group("model")
    g.add_argument("--preset", choices=sorted(L.PRESETS), default=None, help="model preset (default glm-5.3)")
    g.add_argument("--config", metavar="FILE", help="model config file, JSON or TOML (keys: see --dump-config)")
    g.add_argument("--dump-config", action="store_true", help="print the model config (a --config template) and exit")
    s = p.add_argument_group("batch shape")
    s.add_argument("--prefill-tokens", type=int, default=8192, metavar="P", help="prefill chunk tokens (default 8192)")
    s.add_argument("--decode-reqs", type=int, default=32, metavar="R", help="running decode requests (default 32)")
    s.add_argument("--spec-tokens", type=int, default=0, metavar="K", help="speculative tokens per request (rows = R x (K+1))")
    s.add_argument("--context-len", type=int, default=131072, metavar="C", help="decode context length (default 131072)")
    s.add_argument("--prefix-len", type=int, default=0, metavar="T", help="prefix of the chunk's request already in KV")
    p.add_argument("--device", choices=sorted(DEVICES), default="h200", help="device model for the predicted spike height")
    p.set_defaults(func=run)


def _fmt(v, unit):
    if isinstance(v, str):
        return v
    if unit == "bytes":
        for div, u in ((1e9, "GB"), (1e6, "MB"), (1e3, "KB")):
            if abs(v) >= div:
                return f"{v / div:,.2f} {u}"
        return f"{v:,} B"
    if unit == "elements" and v >= 1e6:
        return f"{v:.3g}"
    return f"{v:,}"


def run(args, console):
    model = L.resolve(args.preset, args.config)
    if args.dump_config:
        import json

        data = L.config_dict(model)
        console.result(json.dumps(data, indent=2), data)
        return 0
    shape = L.BatchShape(prefill_tokens=args.prefill_tokens, decode_reqs=args.decode_reqs,
                         spec_tokens=args.spec_tokens, context_len=args.context_len, prefix_len=args.prefix_len)
    doc = L.ledger(model, shape)
    pred = predict(model, shape, device(args.device))
    doc["predicted"] = {"device": pred["device"], "decode_step_s": pred["decode"]["time_s"],
                        "mixed_step_s": pred["mixed"]["time_s"], "spike_height_x": pred["height_x"],
                        "mixed_bound": pred["mixed"]["bound"]}
    lines = [f"model {model.name}: P={shape.prefill_tokens} prefill + R={shape.decode_reqs} x (K+1={shape.spec_tokens + 1}) "
             f"= {shape.decode_rows} decode rows -> N={shape.mixed_rows} rows, context {shape.context_len}",
             f"{'row':<28} {'pure decode':>16} {'mixed':>16} {'ratio':>8}  scope",
             "-" * 84]
    for key, r in doc.items():
        if not isinstance(r, dict) or "scope" not in r:
            continue
        ratio = f"{r['ratio']:.1f}x" if r.get("ratio") is not None else ""
        lines.append(f"{key:<28} {_fmt(r['decode'], r['unit']):>16} {_fmt(r['mixed'], r['unit']):>16} {ratio:>8}  {r['scope']}")
    lines.append(f"{'rows_total':<28} {doc['rows_total']['decode']:>16,} {doc['rows_total']['mixed']:>16,}")
    lines.append(f"predicted on {pred['device']}: decode step {ms(pred['decode']['time_s'])}, mixed step "
                 f"{ms(pred['mixed']['time_s'])} -> TPOT spike ~{pred['height_x']:.1f}x ({pred['mixed']['bound']}-bound)")
    lines.append("note: the article's '75 layers total' pure-decode MoE figure (28 MB) is one layer's; "
                 "all rows here are consistent (ratio ~44x on every MoE row).")
    console.result("\n".join(lines), doc)
    return 0
